"""M_Keys in the SM (sm/sweep/mkeys.py and the sweeps), on the emulated fabric with the emulator's clock moved by
hand: keys, protection and lease on every end port; the key of the addressed port in every SMP; the guid2mkey
and neighbors files; trap 256; a lost key waited out through its lease, or a clear error when it never lapses."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fabric.emulator import EmulatedFabric
from fabric.formats.netfile import write_net
from fabric.generate import fattree
from fabric.mad import PORT_INFO, SmpAttr, smp_dr, smp_lid
from fabric.model import Fabric
from ibfm.cli import main
from ibfm.commands.sm import sweep_through_leases
from ibfm.settings import load_settings
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot
from sm.sweep.mkeys import GUID2MKEY, MKeys, derive_m_key, neighbors_path, read_db
from sm.transport.base import MadTimeout
from sm.transport.emulated import EmulatedTransport
from sm.transport.smp import build_smps, smp_batch_dr, smp_get_raw, smp_set_raw, stamp_m_key

KEY = 0xFEDC_BA98_7654_3210
OTHER = 0x0123_4567_89AB_CDEF


@dataclass
class FakeClock:
    """Monotonic seconds for the emulator's M_Key leases, moved only by the test."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def emulator() -> tuple[EmulatedFabric, FakeClock]:
    emu = EmulatedFabric(fattree(2, 4))  # 6 switches, 8 hosts; the SM on host-00000, 4 hops to the far hosts
    clock = FakeClock()
    emu.clock = clock
    return emu, clock


def config(**kw: object) -> SmConfig:
    return SmConfig(offload=False, **kw)  # type: ignore[arg-type]


async def bring_up(emu: EmulatedFabric, cfg: SmConfig) -> tuple[FabricManager, SubnetSnapshot]:
    m = FabricManager(EmulatedTransport(emu), cfg)
    return m, await m.heavy_sweep()


def end_ports(f: Fabric) -> list[tuple[int, int]]:
    """Every end port as the emulator keys it: a switch's port 0, a CA's ports."""
    return [(n, 0 if f.is_switch(n) else p) for n, p in f.endports().tolist()]


def port_of(emu: EmulatedFabric, name: str) -> tuple[int, int, int]:
    """(node, port 1, LID) of host ``name``."""
    n = emu.fabric.by_name(name)
    return n, 1, int(emu.fabric.lid[n, 1])


# -- the SMP bytes -------------------------------------------------------------------------------------------


def test_every_smp_carries_its_key_in_bytes_24_to_31() -> None:
    reqs = [((1, 3, 2), 1, SmpAttr.PORT_INFO, 3, b""), (7, 2, SmpAttr.PORT_INFO, 0, bytes(64)), ((), 1, 0x11, 0, b"")]
    keys = [KEY, OTHER, 0]
    built = build_smps(reqs, keys)
    assert built[0][0] == smp_dr(1, SmpAttr.PORT_INFO, 3, 0, (1, 3, 2), b"", KEY)
    assert built[1][0] == smp_lid(2, SmpAttr.PORT_INFO, 0, 0, bytes(64), OTHER)
    assert built[2][0] == smp_dr(1, 0x11, 0, 0, (), b"", 0)
    assert build_smps(reqs[:1]) == build_smps(reqs[:1], [0])  # no keys: key 0, the same bytes

    sent: list[bytes] = []

    class Recorder(EmulatedTransport):
        def _post(self, mad: bytes, route: object) -> None:
            sent.append(mad)
            super()._post(mad, route)  # type: ignore[arg-type]

    async def go() -> None:
        emu, _ = emulator()
        t = Recorder(emu)
        paths = [(), (1,)]
        await smp_batch_dr(t, 1, SmpAttr.NODE_INFO, paths, np.array([0, 1, 1]), mkeys=np.array([1, KEY, 2], np.uint64))
        await smp_batch_dr(t, 1, SmpAttr.NODE_INFO, paths, np.array([1]), mkeys=OTHER)
        await t.close()

    asyncio.run(go())
    assert [int.from_bytes(m[24:32], "big") for m in sent] == [1, KEY, 2, OTHER]


async def test_the_key_of_a_route_for_smps_built_elsewhere() -> None:
    emu, _ = emulator()
    m, snap = await bring_up(emu, config(m_key=KEY, m_key_per_port=True, m_key_protect=3))
    f = snap.fabric
    far = f.by_name("host-00006")
    leaf = int(f.peer_node[far, 1])
    want = derive_m_key(KEY, int(f.port_guid[far, 1]))
    assert m.m_key_of_route(snap.discovery.port_paths[(far, 1)]) == want
    assert m.m_key_of_route(int(snap.lids.base[far, 1])) == want
    assert m.m_key_of_route(snap.discovery.paths[leaf]) == derive_m_key(KEY, int(f.port_guid[leaf, 0]))
    assert m.m_key_of_route(()) == derive_m_key(KEY, int(f.port_guid[snap.discovery.sm_node, snap.discovery.sm_port]))
    assert m.m_key_of_route((1, 9)) == KEY  # nowhere: the configured key
    mad = stamp_m_key(smp_lid(1, SmpAttr.SM_INFO, 0, 0), want)
    assert mad == smp_lid(1, SmpAttr.SM_INFO, 0, 0, b"", want)
    n, p, _ = port_of(emu, "host-00006")
    assert int(emu.m_key[n, p]) == want


# -- keys on every port, and the files --------------------------------------------------------------------------


async def test_keys_protection_and_lease_on_every_end_port_and_the_subnet_comes_up(tmp_path: Path) -> None:
    emu, _ = emulator()
    cfg = config(m_key=KEY, m_key_protect=2, m_key_lease=30, guid2lid=tmp_path / "guid2lid")
    m, snap = await bring_up(emu, cfg)
    assert snap.up, snap.program.failures
    f = emu.fabric
    ports = end_ports(f)
    assert snap.program.m_keys_set == len(ports) == 14
    for n, p in ports:
        assert (int(emu.m_key[n, p]), int(emu.m_key_protect[n, p]), int(emu.m_key_lease[n, p])) == (KEY, 2, 30)
    assert emu.stats.m_key_violations == 0  # every SMP carried the right key, before and after the change
    # the file beside guid2lid holds every port, in OpenSM's format
    path = tmp_path / "guid2mkey"
    assert m.m_keys.path == path
    entries, warnings = read_db(path, GUID2MKEY)
    assert not warnings and entries == {int(f.port_guid[n, p]): KEY for n, p in ports}
    assert path.read_text().startswith(f"0x{min(entries):016x} 0x{KEY:016x}\n\n")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert neighbors_path(path).exists()
    # level 2: a Get without the key is dropped now
    n, p, lid = port_of(emu, "host-00005")
    tool = EmulatedTransport(emu, endpoint=emu.attach(*port_of(emu, "host-00007")[:2]))
    with pytest.raises(MadTimeout):
        await smp_get_raw(tool, lid, SmpAttr.PORT_INFO)
    await tool.close()
    tried = emu.stats.m_key_violations
    assert tried == int(emu.m_key_violations[n, p]) > 0  # each of the tool's tries
    # a second sweep sends no key again, and every SMP of it carries the right one
    again = await m.heavy_sweep()
    assert again.up and again.program.m_keys_set == 0 and emu.stats.m_key_violations == tried


@pytest.mark.parametrize(("per_port", "level"), [(False, 3), (True, 3), (True, 1)])
async def test_a_second_ibfm_with_the_files_sweeps_and_writes_no_key(
    tmp_path: Path, per_port: bool, level: int
) -> None:
    emu, _ = emulator()
    cfg = config(m_key=KEY, m_key_per_port=per_port, m_key_protect=level, m_key_lease=60, guid2mkey=tmp_path / "keys")
    _, first = await bring_up(emu, cfg)
    assert first.up and first.program.m_keys_set == 14
    files = [tmp_path / "keys", tmp_path / "keys.neighbors"]
    before = [(p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in files]
    m, snap = await bring_up(emu, cfg)  # a new process: what it knows comes from the files
    assert snap.up, snap.program.failures
    assert snap.program.m_keys_set == 0 and not snap.m_key_locked  # (a new process sends the LFT blocks, as ever)
    assert emu.stats.m_key_violations == 0  # its very first SMPs, to ports it has not seen, carried their keys
    assert [(p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in files] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys", "keys.neighbors"]  # no .bak, no temp file
    assert m.m_key_traps == 0


def test_per_port_keys_differ_per_port_and_are_reproducible() -> None:
    f = fattree(2, 4)
    guids = [int(f.port_guid[n, p]) for n, p in end_ports(f)]
    keys = [derive_m_key(KEY, g) for g in guids]
    assert len(set(keys)) == len(keys) and all(keys) and KEY not in keys
    assert keys == [derive_m_key(KEY, g) for g in guids]  # the secret and the GUID alone
    assert keys == [MKeys(key=KEY, per_port=True).want(g) for g in guids]  # another process, the same keys
    assert not set(keys) & {derive_m_key(OTHER, g) for g in guids}  # another secret, other keys

    async def go() -> None:
        emu, _ = emulator()
        _, snap = await bring_up(emu, config(m_key=KEY, m_key_per_port=True, m_key_protect=1))
        assert snap.up
        for n, p in end_ports(emu.fabric):
            assert int(emu.m_key[n, p]) == derive_m_key(KEY, int(emu.fabric.port_guid[n, p]))

    asyncio.run(go())


# -- another SM or a tool without the key ------------------------------------------------------------------------


async def test_a_tool_without_the_key_cannot_change_a_port_at_level_1_ibfm_can_and_the_trap_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    emu, _ = emulator()
    m, snap = await bring_up(emu, config(m_key=KEY, m_key_protect=1, m_key_lease=60))
    assert snap.up
    n, p, lid = port_of(emu, "host-00005")
    tn, tp, tool_lid = port_of(emu, "host-00007")
    tool = EmulatedTransport(emu, endpoint=emu.attach(tn, tp))  # another SM, or a tool, LID routed
    seen = PORT_INFO.unpack(await smp_get_raw(tool, lid, SmpAttr.PORT_INFO))  # level 1: Gets pass ...
    assert seen["M_Key"] == 0 and seen["M_KeyProtectBits"] == 1  # ... and show no key
    changed = dict(seen, LID=999, M_Key=0, M_KeyProtectBits=0)
    with pytest.raises(MadTimeout):
        await smp_set_raw(tool, lid, SmpAttr.PORT_INFO, 0, PORT_INFO.pack(changed), mkey=0)
    assert int(emu.fabric.lid[n, p]) == lid and int(emu.m_key[n, p]) == KEY
    violations = int(emu.m_key_violations[n, p])
    assert violations >= 1 and emu.stats.m_key_violations == violations  # each retry of the tool's Set
    # ibfm, with the port's key, can
    t = m.transport
    key = int(m.m_keys.port_keys(snap.fabric)[snap.fabric.by_name("host-00005"), 1])
    assert key == KEY
    mine = PORT_INFO.unpack(await smp_get_raw(t, lid, SmpAttr.PORT_INFO, mkey=key))
    assert mine["M_Key"] == KEY
    got = PORT_INFO.unpack(
        await smp_set_raw(t, lid, SmpAttr.PORT_INFO, 0, PORT_INFO.pack(dict(mine, HOQLife=5)), mkey=key)
    )
    assert got["HOQLife"] == 5
    # the traps 256 reach ibfm (the port's MasterSMLID): logged with the port and the requester, counted
    with caplog.at_level(logging.WARNING, logger="ibfm.sm"):
        await m.sweep()
    assert m.m_key_traps == violations
    text = caplog.text
    assert f"trap 256 (bad M_Key): LID {lid} (host-00005[1]) refused a Set(PORT_INFO 0x0015" in text
    assert f"from LID {tool_lid} (host-00007[1]) carrying a wrong key" in text
    assert f"{KEY:x}" not in text.lower()  # no key in the log
    await tool.close()


async def test_a_trap_256_brings_the_port_its_key_before_the_lease_runs_out(caplog: pytest.LogCaptureFixture) -> None:
    emu, clock = emulator()
    m, _ = await bring_up(emu, config(m_key=KEY, m_key_protect=2, m_key_lease=10, sweep_interval=5.0))
    n, p, lid = port_of(emu, "host-00003")
    tool = EmulatedTransport(emu, endpoint=emu.attach(*port_of(emu, "host-00006")[:2]))
    with pytest.raises(MadTimeout):
        await smp_get_raw(tool, lid, SmpAttr.NODE_INFO)
    assert emu.m_key_lease_ends(n, p) == clock.now + 10  # the failure started the lease
    clock.now += 9
    await m.sweep()  # the trap brought this sweep: a keyed SMP to the port stops its lease
    assert emu.m_key_lease_ends(n, p) is None
    clock.now += 100
    assert int(emu.m_key_protect[n, p]) == 2  # still protected
    await tool.close()


def test_a_sweep_interval_longer_than_the_lease_is_said_at_start(caplog: pytest.LogCaptureFixture) -> None:
    emu, _ = emulator()
    with caplog.at_level(logging.INFO, logger="ibfm.sm"):
        FabricManager(EmulatedTransport(emu), config(m_key=KEY, m_key_protect=1, m_key_lease=5, sweep_interval=10.0))
    assert "M_Key: one key for every port, protection level 1, lease 5 s; keys kept in memory only" in caplog.text
    assert "sm.sweep_interval 10 s is longer than sm.m_key_lease_period 5 s" in caplog.text


# -- lost keys ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [1, 3])
async def test_a_lost_key_is_waited_out_through_its_lease(level: int, caplog: pytest.LogCaptureFixture) -> None:
    emu, clock = emulator()
    _, first = await bring_up(emu, config(m_key=OTHER, m_key_protect=level, m_key_lease=20))
    assert first.up
    # A new ibfm with another key and no file: the ports hold a key it does not have.
    m = FabricManager(EmulatedTransport(emu), config(m_key=KEY, m_key_protect=level, m_key_lease=20))
    m.m_key_clock = clock  # the SM's waits on the emulator's clock
    rounds = 0
    with caplog.at_level(logging.WARNING, logger="ibfm.sm"):
        while True:
            try:
                snap = await m.heavy_sweep()
            except Exception:  # level 3: the SM's own port does not answer the first time
                snap = None
            if m.m_key_retry_in() is None:
                break
            assert m.m_key_retry_in() == 21  # the lease, and a second
            rounds += 1
            assert rounds <= 5, "(lease + 1) x (hops + 1) bounds the wait"  # 4 hops at most on this fabric
            clock.now += 20 + 1  # the lease runs out
    assert snap is not None and snap.up, snap.program.failures if snap else None
    assert rounds == (1 if level == 1 else 5)  # level 3: each hop's ports are found locked in turn
    for n, p in end_ports(emu.fabric):
        assert (int(emu.m_key[n, p]), int(emu.m_key_protect[n, p])) == (KEY, level)
    text = caplog.text
    assert "answer no SMP carrying the keys this SM has for them (a lost or wrong key)" in text
    assert "Waiting out their M_Key lease" in text and "Looking again in 21 s (lease 20 s + 1)" in text
    if level == 1:
        assert "host-00007[1] (DR 1,3,4,2)" in text  # Gets pass at level 1: the ports are named
        assert "at most 105 s in all ((lease + 1) x (hops + 1))" in text
    else:
        assert "this SM's own port (DR local)" in text and "behind spine-00 port 2 (DR 1,3,2)" in text
        assert "ports 4 hops away may need the lease of each port before them in turn: at most 105 s" in text
    assert "every port answers its key again" in text


async def test_the_daemon_sweeps_again_when_the_lease_has_run_out() -> None:
    """The sweeper's own wait (real time: a 1 s lease): the lockout shortens its sweep interval."""
    emu = EmulatedFabric(fattree(2, 4))
    _, first = await bring_up(emu, config(m_key=OTHER, m_key_protect=1, m_key_lease=1))
    assert first.up
    m = FabricManager(EmulatedTransport(emu), config(m_key=KEY, m_key_protect=1, m_key_lease=1, sweep_interval=600))
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    try:
        for _ in range(200):
            await asyncio.sleep(0.05)
            if m.snapshot is not None and m.snapshot.up:
                break
        assert m.snapshot is not None and m.snapshot.up and m.snapshot.sweep >= 2
        assert {int(emu.m_key[n, p]) for n, p in end_ports(emu.fabric)} == {KEY}
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_lease_longer_than_ours_is_waited_out_no_longer_than_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    emu, clock = emulator()
    _, first = await bring_up(emu, config(m_key=OTHER, m_key_protect=3, m_key_lease=100))
    assert first.up
    m = FabricManager(EmulatedTransport(emu), config(m_key=KEY, m_key_protect=3, m_key_lease=10))
    m.m_key_clock = clock
    with caplog.at_level(logging.WARNING, logger="ibfm.sm"), pytest.raises(Exception, match="discover failed"):
        await m.heavy_sweep()  # the SM's own port: locked
    assert m.m_key_retry_in() == 11
    clock.now += 11
    with caplog.at_level(logging.WARNING, logger="ibfm.sm"), pytest.raises(Exception, match="discover failed"):
        await m.heavy_sweep()  # still: its lease is 100 s, not our 10
    assert m.m_key_retry_in() is None  # no more waiting: the bound, (10 + 1) x (0 + 1) s, is reached
    assert "still answer no key after 11 s of waiting ((lease 10 s + 1) x (0 hops + 1))" in caplog.text
    assert "Their lease may be longer than 10 s, or 0" in caplog.text


async def test_a_lost_key_with_an_infinite_lease_is_a_clear_error_and_no_hang(
    caplog: pytest.LogCaptureFixture,
) -> None:
    emu, clock = emulator()
    _, first = await bring_up(emu, config(m_key=OTHER, m_key_protect=1, m_key_lease=0))
    assert first.up
    m = FabricManager(EmulatedTransport(emu), config(m_key=KEY, m_key_protect=1, guid2mkey=None))
    with caplog.at_level(logging.ERROR, logger="ibfm.sm"):
        snap = await asyncio.wait_for(sweep_through_leases(m), 30)  # what `ibfm sm` runs: no wait to make
    assert not snap.up and len(snap.m_key_locked) == 14 and m.m_key_retry_in() is None
    assert "Their M_Key lease period is 0 (infinite, sm.m_key_lease_period 0)" in caplog.text
    assert "(0x<port guid> 0x<m_key> per line)" in caplog.text
    clock.now += 1e6
    n, p, _ = port_of(emu, "host-00004")
    assert int(emu.m_key[n, p]) == OTHER and int(emu.m_key_protect[n, p]) == 1  # nothing lapses


async def test_a_key_changed_in_the_settings_is_set_over_the_old_one_the_file_holds(tmp_path: Path) -> None:
    emu, _ = emulator()
    path = tmp_path / "guid2mkey"
    _, first = await bring_up(emu, config(m_key=OTHER, m_key_protect=3, guid2mkey=path))
    assert first.up
    neighbors_path(path).unlink()  # even without knowing which port is where: the file's few keys are tried
    _, snap = await bring_up(emu, config(m_key=KEY, m_key_protect=3, guid2mkey=path))
    assert snap.up and snap.program.m_keys_set == 14
    assert {int(emu.m_key[n, p]) for n, p in end_ports(emu.fabric)} == {KEY}
    assert emu.stats.m_key_violations == 0  # the old key, from the file, went first
    assert set(read_db(path, GUID2MKEY)[0].values()) == {KEY}
    assert (tmp_path / "guid2mkey.bak").exists()  # every key changed: the old file is kept


# -- the guid2mkey file ---------------------------------------------------------------------------------------


async def test_guid2mkey_keeps_what_it_held_and_a_bad_line_costs_that_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    emu, _ = emulator()
    path = tmp_path / "guid2mkey"
    _, first = await bring_up(emu, config(m_key=KEY, m_key_protect=3, guid2mkey=path))
    assert first.up
    good = path.read_text()
    lines = [x for x in good.splitlines() if x]
    absent = 0x0002C9FFFF000001
    # a foreign port (absent now), one line broken (bad hex), one with a stray byte: each costs its own line
    broken = [f"0x{absent:016x} 0x{OTHER:016x}", lines[0].replace("0x", "0xZ", 1), lines[1] + " \xe9", *lines[2:]]
    path.write_bytes("\n\n".join(broken).encode("latin-1") + b"\n")
    with caplog.at_level(logging.WARNING, logger="ibfm.sm"):
        m, snap = await bring_up(emu, config(m_key=KEY, m_key_protect=3, guid2mkey=path))
    assert snap.up and emu.stats.m_key_violations == 0  # the two lost lines: their ports got the configured key
    text = caplog.text
    assert f"M_Key: {path}:3:1: " in text and "entry ignored" in text  # file, line, column
    assert f"M_Key: {path}:5:" in text and "is not ASCII; entry ignored" in text
    assert f"{path}: entries dropped or changed; the previous file is kept as {path}.bak" in text
    assert (tmp_path / "guid2mkey.bak").read_bytes() == "\n\n".join(broken).encode("latin-1") + b"\n"
    entries, warnings = read_db(path, GUID2MKEY)
    ports = {int(emu.fabric.port_guid[n, p]): KEY for n, p in end_ports(emu.fabric)}
    assert not warnings and entries == {absent: OTHER, **ports}  # the absent port's key is kept
    assert m.m_keys.held[absent] == OTHER


async def test_no_key_anywhere_writes_no_file_and_sends_what_it_sent(tmp_path: Path) -> None:
    emu, _ = emulator()
    m, snap = await bring_up(emu, config(guid2lid=tmp_path / "guid2lid"))
    assert snap.up and not m.m_keys.active and snap.program.m_keys_set == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guid2lid"]
    assert not emu.m_key_checking


# -- settings and flags -------------------------------------------------------------------------------------------


def test_settings_take_a_hex_key_and_hide_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("IBFM_"):
            monkeypatch.delenv(k)
    cfg = tmp_path / "ibfm.toml"
    cfg.write_text('[sm]\nm_key = "0xfedcba9876543210"\nm_key_protection_level = 2\nm_key_lease_period = 60\n')
    s = load_settings(cfg)
    assert s.sm.m_key == KEY and s.public_dict()["sm"]["m_key"] == "(set)"
    assert s.sm.m_key_options() == {
        "m_key": KEY,
        "m_key_per_port": False,
        "m_key_protect": 2,
        "m_key_lease": 60,
        "guid2mkey": None,
    }
    assert SmConfig(guid2lid=tmp_path / "g2l", **s.sm.m_key_options()).guid2mkey_path == tmp_path / "guid2mkey"


def test_ibfm_sm_flags_key_the_ports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    net = tmp_path / "fabric.net"
    write_net(fattree(2, 4), net)
    monkeypatch.setenv("IBFM_SM__M_KEY", hex(KEY))  # the flag's default: no key on the command line
    code = main(["sm", "--topology", str(net), "--m-key-protection-level", "2", "--m-key-lease-period", "30",
                 "--m-key-per-port", "--guid2mkey", str(tmp_path / "guid2mkey"), "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["subnet_up"] and out["m_key"] == {"ports_keyed": 14, "locked": []}
    entries, _ = read_db(tmp_path / "guid2mkey", GUID2MKEY)
    assert entries == {g: derive_m_key(KEY, g) for g in entries} and len(entries) == 14
    monkeypatch.delenv("IBFM_SM__M_KEY")
    assert main(["sm", "--topology", str(net), "--m-key-per-port"]) == 2  # per-port keys need a key
    assert "--m-key-per-port derives each port's key from --m-key" in capsys.readouterr().err
