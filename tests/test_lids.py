"""LID assignment and the guid2lid file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fabric import fileio
from fabric.model import Fabric, FabricBuilder, NodeType
from sm.lids import LidError, LidManager, assign_lids, read_guid2lid, write_guid2lid


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
