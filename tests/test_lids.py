"""LID assignment and the guid2lid file."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fabric import fileio
from fabric.model import Fabric, FabricBuilder, NodeType
from sm.sweep.lids import LidError, LidManager, assign_lids, read_guid2lid, write_guid2lid

ROOT = Path(__file__).resolve().parent.parent


def small_fabric(extra_host: bool = False) -> Fabric:
    b = FabricBuilder()
    s1 = b.add_node(NodeType.SWITCH, 8, "S1")
    s2 = b.add_node(NodeType.SWITCH, 8, "S2")
    hosts = [b.add_node(NodeType.CA, 2, f"H{i}") for i in range(3 if extra_host else 2)]
    b.connect(s1, 7, s2, 7)
    for i, h in enumerate(hosts):
        b.connect(s1, 1 + i, h, 1)
        b.connect(s2, 1 + i, h, 2)
    return b.build()


def lids_by_guid(f: Fabric, plan) -> dict[int, int]:  # type: ignore[no-untyped-def]
    ep = f.endports()
    return {int(f.port_guid[n, p]): int(plan.lids.base[n, p]) for n, p in ep.tolist()}


def test_every_endport_gets_a_unique_lid() -> None:
    f = small_fabric()
    plan = assign_lids(f)
    got = lids_by_guid(f, plan)
    assert len(got) == 2 + 2 * 2
    assert 0 not in got.values()
    assert len(set(got.values())) == len(got)
    for lid in got.values():
        n, p = int(plan.lids.owner_node[lid]), int(plan.lids.owner_port[lid])
        assert plan.lids.base[n, p] == lid


def test_lmc_ranges_are_aligned_and_disjoint() -> None:
    f = small_fabric()
    plan = assign_lids(f, lmc=2)
    bases = sorted(b for b, _ in plan.guid2lid.values())
    assert all(b % 4 == 0 for b in bases)
    assert all(t - b == 3 for b, t in plan.guid2lid.values())
    assert len(plan.lids.used()) == 4 * len(bases)


def test_restart_keeps_every_lid_and_new_port_moves_nobody(tmp_path: Path) -> None:
    path = tmp_path / "guid2lid"
    f = small_fabric()
    first = LidManager(path).plan(f)
    assert path.exists()
    again = LidManager(path).plan(f)
    assert lids_by_guid(f, again) == lids_by_guid(f, first)
    assert not again.changed
    g = small_fabric(extra_host=True)
    grown = LidManager(path).plan(g)
    old, now = lids_by_guid(f, first), lids_by_guid(g, grown)
    assert all(now[k] == v for k, v in old.items())
    assert len(grown.new) == 2


def test_absent_port_keeps_its_reservation(tmp_path: Path) -> None:
    path = tmp_path / "guid2lid"
    big = small_fabric(extra_host=True)
    before = lids_by_guid(big, LidManager(path).plan(big))
    small = small_fabric()
    LidManager(path).plan(small)
    after = lids_by_guid(big, LidManager(path).plan(big))
    assert after == before


def test_corrupt_and_conflicting_entries_warn_and_only_those_move(tmp_path: Path) -> None:
    f = small_fabric()
    plan = assign_lids(f)
    guids = sorted(plan.guid2lid, key=lambda g: plan.guid2lid[g])
    path = tmp_path / "guid2lid"
    write_guid2lid(path, plan.guid2lid)
    lines = [ln for ln in path.read_text().splitlines() if ln]
    # line 2: garbage; the last GUID claims the first GUID's LID.
    lines[1] = "this is not a guid line"
    first_lid = plan.guid2lid[guids[0]][0]
    lines[-1] = f"0x{guids[-1]:016x} {first_lid} {first_lid}"
    path.write_text("\n".join(lines) + "\n")
    _, warnings = read_guid2lid(path)
    assert any(":2:" in w for w in warnings)
    assert any(f":{len(lines)}:" in w and "overlap" in w for w in warnings)
    mgr = LidManager(path)
    again = mgr.plan(f)
    got = lids_by_guid(f, again)
    for g in guids[2:-1]:
        assert got[g] == plan.guid2lid[g][0]
    assert len(set(got.values())) == len(got)
    assert again.warnings
    # The rewritten file is clean now.
    assert read_guid2lid(path)[1] == []


def test_binary_file_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "guid2lid"
    path.write_bytes(b"\xff\xfe\x00garbage")
    entries, warnings = read_guid2lid(path)
    assert entries == {} and warnings


def test_write_is_atomic_no_temp_left(tmp_path: Path) -> None:
    path = tmp_path / "g2l"
    write_guid2lid(path, {0x10: (1, 1), 0x20: (2, 2)})
    assert [p.name for p in tmp_path.iterdir()] == ["g2l"]
    assert read_guid2lid(path)[0] == {0x10: (1, 1), 0x20: (2, 2)}


def test_lmc_change_reassigns_misaligned(tmp_path: Path) -> None:
    f = small_fabric()
    p0 = assign_lids(f, lmc=0)
    p1 = assign_lids(f, p0.guid2lid, lmc=1)
    assert all(b % 2 == 0 and t == b + 1 for b, t in p1.guid2lid.values())
    assert np.count_nonzero(p1.lids.base) == 6


def test_bad_lmc() -> None:
    with pytest.raises(LidError, match="LMC 8"):
        assign_lids(small_fabric(), lmc=8)


def test_unwritable_guid2lid_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LidError, match="cannot read the guid2lid file: Not a directory"):
        LidManager(blocker / "guid2lid")
    (tmp_path / "d").mkdir()
    ok = LidManager(tmp_path / "d" / "guid2lid")
    (tmp_path / "d").rmdir()
    (tmp_path / "d").write_text("")  # the directory became a file under the manager
    with pytest.raises(LidError, match="cannot write the guid2lid file"):
        ok.plan(small_fabric())


def test_atomic_write_honours_the_umask(tmp_path: Path) -> None:
    fileio.write_text_atomic(tmp_path / "f", "x")
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o666 & ~fileio._UMASK
    assert os.umask(fileio._UMASK) == fileio._UMASK  # unchanged by the write


# -- a damaged guid2lid file costs only its damaged lines, and what a rewrite drops is kept ---------------------


def _g2l_file(tmp_path: Path, f: Fabric) -> tuple[Path, dict[int, int]]:
    path = tmp_path / "guid2lid"
    lids = lids_by_guid(f, LidManager(path).plan(f))
    return path, lids


@pytest.mark.parametrize("comment", ["# é\n".encode(), b"# \xe9 latin-1\n", b"\t# \xff\xfe\x00\n"])
def test_non_ascii_comment_is_harmless(tmp_path: Path, comment: bytes) -> None:
    f = small_fabric()
    path, lids = _g2l_file(tmp_path, f)
    path.write_bytes(path.read_bytes() + comment)
    before = path.read_bytes()
    again = LidManager(path).plan(f)
    assert lids_by_guid(f, again) == lids and not again.changed and again.warnings == []
    assert path.read_bytes() == before  # not rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guid2lid"]


def test_bad_bytes_in_a_trailing_comment_keep_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "guid2lid"
    path.write_bytes(b"0x10 1 1 # caf\xc3\xa9 \xff\n0x20 2 2\n")
    assert read_guid2lid(path) == ({0x10: (1, 1), 0x20: (2, 2)}, [])


def test_non_ascii_byte_in_an_entry_costs_that_entry_only(tmp_path: Path) -> None:
    f = small_fabric()
    path, lids = _g2l_file(tmp_path, f)
    lines = path.read_bytes().split(b"\n")
    victim = int(lines[2].split()[0], 16)
    lines[2] = lines[2][:5] + b"\xe9" + lines[2][5:]  # line 3: the second entry
    path.write_bytes(b"\n".join(lines))
    damaged = path.read_bytes()
    entries, warnings = read_guid2lid(path)
    assert warnings == [f"{path}:3:6: byte 0xe9 is not ASCII; entry ignored"]
    assert set(entries) == set(lids) - {victim}
    plan = LidManager(path).plan(f)
    got = lids_by_guid(f, plan)
    assert {g: v for g, v in got.items() if g != victim} == {g: v for g, v in lids.items() if g != victim}
    assert len(set(got.values())) == len(got)
    bak = tmp_path / "guid2lid.bak"
    assert bak.read_bytes() == damaged  # the file as it was, bad line included
    assert plan.warnings[0] == warnings[0] and str(bak) in plan.warnings[-1]
    assert read_guid2lid(path) == ({g: (v, v) for g, v in got.items()}, [])


def test_bom_and_crlf_are_read(tmp_path: Path) -> None:
    path = tmp_path / "guid2lid"
    path.write_bytes(b"\xef\xbb\xbf0x10 1 1\r\n\r\n0x20 0x2 0x2\r\n")
    assert read_guid2lid(path) == ({0x10: (1, 1), 0x20: (2, 2)}, [])


def test_rewrite_that_only_adds_keeps_no_backup(tmp_path: Path) -> None:
    path, _ = _g2l_file(tmp_path, small_fabric())
    grown = LidManager(path).plan(small_fabric(extra_host=True))
    assert grown.changed and not (tmp_path / "guid2lid.bak").exists()


def test_changed_entries_are_backed_up_with_their_mode(tmp_path: Path) -> None:
    f = small_fabric()
    path, _ = _g2l_file(tmp_path, f)
    path.chmod(0o600)
    before = path.read_bytes()
    plan = LidManager(path, lmc=1).plan(f)  # LMC 0 -> 1: every odd base moves
    bak = tmp_path / "guid2lid.bak"
    assert bak.read_bytes() == before and bak.stat().st_mode & 0o777 == 0o600
    assert any(str(bak) in w for w in plan.warnings)
    assert read_guid2lid(path)[0] == plan.guid2lid


def test_live_file_never_missing_during_backup_and_rewrite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = small_fabric()
    path, _ = _g2l_file(tmp_path, f)
    path.write_bytes(path.read_bytes() + b"junk line\n")
    calls: list[str] = []
    real_replace, real_rename, real_unlink = os.replace, os.rename, os.unlink

    def watch(real: Any) -> Any:
        def spy(src: Any, dst: Any = None, *a: Any, **kw: Any) -> Any:
            assert path.exists(), f"{path} missing before {real.__name__}({src}, {dst})"
            r = real(src, *a, **kw) if dst is None else real(src, dst, *a, **kw)
            assert path.exists(), f"{path} missing after {real.__name__}({src}, {dst})"
            calls.append(f"{real.__name__} {Path(dst).name if dst is not None else Path(src).name}")
            return r

        return spy

    monkeypatch.setattr(os, "replace", watch(real_replace))
    monkeypatch.setattr(os, "rename", watch(real_rename))
    monkeypatch.setattr(os, "unlink", watch(real_unlink))
    LidManager(path).plan(f)
    monkeypatch.undo()
    assert calls == ["replace guid2lid.bak", "replace guid2lid"]
    assert (tmp_path / "guid2lid.bak").read_bytes().endswith(b"junk line\n")


def test_backup_failure_leaves_the_file_alone(tmp_path: Path) -> None:
    f = small_fabric()
    path, _ = _g2l_file(tmp_path, f)
    path.write_bytes(path.read_bytes() + b"junk line\n")
    before = path.read_bytes()
    (tmp_path / "guid2lid.bak").mkdir()  # cannot be replaced by a file
    with pytest.raises(LidError, match=r"guid2lid\.bak: cannot keep the previous guid2lid file"):
        LidManager(path).plan(f)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guid2lid", "guid2lid.bak"]


def test_failed_write_is_retried_at_the_next_plan(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    mgr = LidManager(d / "guid2lid")
    d.rmdir()
    d.write_text("")
    with pytest.raises(LidError, match="cannot write"):
        mgr.plan(small_fabric())
    d.unlink()
    d.mkdir()
    plan = mgr.plan(small_fabric())
    assert read_guid2lid(d / "guid2lid") == (plan.guid2lid, [])


def test_unreadable_guid2lid_still_raises(tmp_path: Path) -> None:
    (tmp_path / "guid2lid").mkdir()
    with pytest.raises(LidError, match="cannot read the guid2lid file"):
        LidManager(tmp_path / "guid2lid")


def test_temp_file_of_a_killed_writer_is_removed_at_start(tmp_path: Path) -> None:
    path = tmp_path / "guid2lid"
    write_guid2lid(path, {0x10: (1, 1)})
    # A writer killed by SIGKILL between writing its temp file and the rename.
    code = (
        "import os, signal, sys\n"
        "from sm.sweep.lids import write_guid2lid\n"
        "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "write_guid2lid(sys.argv[1], {0x10: (1, 1), 0x20: (2, 2)})\n"
    )
    cp = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, check=False)
    assert cp.returncode == -signal.SIGKILL, cp.stderr
    stale = [p.name for p in tmp_path.iterdir() if p.name != "guid2lid"]
    assert len(stale) == 1 and fileio.temp_name_pattern(path).fullmatch(stale[0]), stale
    users = [
        ".guid2lid.backup01",
        ".guid2lid.old.tmp",
        ".guid2lid.abcdefgh.tmp.keep",
        ".other.abcdefgh.tmp",
        "guid2lid.bak",
        ".guid2lid.abcdefg.tmp",
    ]
    for name in users:
        (tmp_path / name).write_text("mine\n")
    (tmp_path / ".guid2lid.aaaaaaaa.tmp").symlink_to(tmp_path / "guid2lid.bak")
    mgr = LidManager(path)
    assert mgr.entries == {0x10: (1, 1)} and mgr.warnings == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["guid2lid", ".guid2lid.aaaaaaaa.tmp", *users])


def test_temp_file_of_a_live_writer_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "guid2lid"
    fd, tmp = tempfile.mkstemp(prefix=".guid2lid.", suffix=fileio.TEMP_SUFFIX, dir=tmp_path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert fileio.remove_stale_temps(path) == [] and Path(tmp).exists()
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert fileio.remove_stale_temps(path) == [Path(tmp)] and not Path(tmp).exists()
    finally:
        os.close(fd)


def test_writer_never_loses_its_temp_to_a_cleaner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cleaner strikes between mkstemp and the writer's lock: the writer takes another temp file.
    path = tmp_path / "guid2lid"
    real_mkstemp = tempfile.mkstemp
    struck: list[list[Path]] = []

    def mkstemp_then_clean(*a: Any, **kw: Any) -> tuple[int, str]:
        fd, name = real_mkstemp(*a, **kw)
        if not struck:
            struck.append(fileio.remove_stale_temps(path))
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp_then_clean)
    write_guid2lid(path, {0x10: (1, 1)})
    assert len(struck[0]) == 1
    assert read_guid2lid(path)[0] == {0x10: (1, 1)}
    assert [p.name for p in tmp_path.iterdir()] == ["guid2lid"]
