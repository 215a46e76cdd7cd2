"""ibfm's sweeps against ibsim: a link cut while the SM runs as a daemon is seen, rerouted, and undone.

The SM runs as a child process (bench/_sm_runner.py) over libibumad with
libumad2sim preloaded, attached at a host CA with IsSM raised, sweeping
every second. The test cuts an inter-switch link on ibsim's console; ibsim
sends trap 128 and sets PortStateChange; the SM's light sweep finds the
link gone and the heavy sweep sends only the LFT blocks that changed. Then
``ibroute`` reads every switch's table back and must equal ibfm's new LFT
dump, no entry may use the cut link, and ``ibnetdiscover`` must see every
LID unchanged. ``ReLink`` brings the link back and the tables return to
what they were.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench._sm_runner import SmRunner
from fabric.emulator import EmulatedFabric
from fabric.formats.netfile import parse_net, read_net
from fabric.generate import fattree
from sm.sweep.discover import Discovery
from sm.sweep.light import light_sweep
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.emulated import EmulatedTransport
from tests.conftest import need_ibsim
from tests.test_ibsim_sm import (
    SIM_SPEED,
    IbfmRun,
    IbrouteTable,
    Sim,
    check_ibroute,
    parse_guid2lid,
    start_sim,
)

SM_HOST = "host-00000"
SWEEP_S = 1.0


# -- the light sweep's order on a cut link, on the emulator (no ibsim needed) ------------------------------


async def _cut_behind_spine0() -> tuple[EmulatedFabric, FabricManager, Discovery, int, int, int, int]:
    """A k=8 tree up; leaf-05's link to spine-00 cut. Every leaf's DR path runs over spine-00, so the
    far end (leaf-05) is behind the failed link and the near end (spine-00) is not."""
    f = fattree(2, 8)
    emu = EmulatedFabric(f)
    mgr = FabricManager(EmulatedTransport(emu), SmConfig(sweep_interval=3600))
    snap = await mgr.heavy_sweep()
    d = snap.discovery
    g = d.fabric
    far, near = g.by_name("leaf-05"), g.by_name("spine-00")
    far_port = 5  # leaf port k/2+1+s goes to spine s
    near_port = int(g.peer_port[far, far_port])
    assert int(g.peer_node[far, far_port]) == near and d.paths[far][-1] == near_port
    emu.link_down(f.by_name("leaf-05"), far_port)
    emu.traps.clear()
    return emu, mgr, d, far, far_port, near, near_port


async def test_light_sweep_reads_near_trap_issuer_first() -> None:
    """Both ends sent a trap: the near end is read first, so the far end is read around the cut, no timeout."""
    _, mgr, d, far, far_port, near, near_port = await _cut_behind_spine0()
    light = await light_sweep(mgr.transport, d, hint=[far, near])
    assert {(c.node, c.port, c.up) for c in light.changes} == {(far, far_port, False), (near, near_port, False)}
    assert light.unreachable == [] and mgr.transport.stats.timeouts == 0


async def test_light_sweep_rereads_far_issuer_around_the_cut() -> None:
    """Only the far end's trap came: its old DR path is dead, it is read again once the path is repaired."""
    _, mgr, d, far, far_port, near, near_port = await _cut_behind_spine0()
    light = await light_sweep(mgr.transport, d, hint=[far])
    assert {(c.node, c.port, c.up) for c in light.changes} == {(far, far_port, False), (near, near_port, False)}
    assert light.unreachable == []


# -- the daemon over ibsim ---------------------------------------------------------------------------------


def dump(sm: SmRunner, path: Path, sweep: int) -> str:
    """ibfm's current LFTs as ibroute prints them; the snapshot must be the one from ``sweep``."""
    ans = sm.command(f"dump {path}")
    assert ans.get("sweep") == sweep, ans
    return path.read_text()


def ibroute_matches(sim: Sim, sm: SmRunner, lft_dump: str) -> dict[int, IbrouteTable]:
    """``ibroute <lid>`` of every switch equals ``lft_dump``; the tables by switch node GUID."""
    g2l = parse_guid2lid(sm.guid2lid.read_text())
    tables = check_ibroute(sim, IbfmRun({}, g2l, lft_dump))
    return {t.guid: t for t in tables}


def ports_used(table: IbrouteTable) -> set[int]:
    return set(table.entries.values())


def lids_seen(sim: Sim) -> dict[int, int]:
    """Port GUID -> LID of every end port, as ibnetdiscover reads them from the fabric."""
    seen = parse_net(sim.run(["ibnetdiscover"]).stdout, "ibnetdiscover")
    return {int(seen.port_guid[n, p]): int(seen.lid[n, p]) for n, p in seen.endports().tolist()}


@pytest.mark.ibsim
def test_link_cut_rerouted_then_relinked(tmp_path: Path) -> None:
    need_ibsim("ibnetdiscover", "ibroute", "smpquery")
    with start_sim(tmp_path, fattree(2, 8, speed=SIM_SPEED), SM_HOST) as sim:
        fabric = read_net(sim.netfile)
        # leaf-05's link to spine-00: the SM's DR paths to every leaf run over spine-00, so leaf-05's
        # is cut too and the light sweep must read it again around the cut.
        leaf = fabric.by_name("leaf-05")
        port = 4 + 1 + 0  # leaf port k/2+1+s goes to spine s
        spine, spine_port = int(fabric.peer_node[leaf, port]), int(fabric.peer_port[leaf, port])
        assert fabric.names[spine] == "spine-00"
        leaf_guid, spine_guid = int(fabric.node_guid[leaf]), int(fabric.node_guid[spine])
        n_switches = int(fabric.switches.size)

        with SmRunner(sim.proc, SM_HOST, sim.work / "sm", sweep_interval=SWEEP_S) as sm:
            up = sm.wait_sweep(up=True, timeout=30)
            assert up["engine"] == "ftree" and up["lft_blocks_sent"] == n_switches, up
            before = dump(sm, sim.work / "lfts.0", up["sweep"])
            g2l = parse_guid2lid(sm.guid2lid.read_text())
            tables = ibroute_matches(sim, sm, before)
            assert port in ports_used(tables[leaf_guid]) and spine_port in ports_used(tables[spine_guid])

            # Cut one leaf-spine link on ibsim's console while the SM sweeps.
            mark = sm.mark()
            sim.proc.command(f'Unlink "leaf-05"[{port}]')
            cut = sm.wait_sweep(start=mark, timeout=10 * SWEEP_S)
            assert cut["subnet_up"] and cut["engine"] == "ftree" and cut["changes"] == 2, cut
            # Trap 128 from the switches woke the sweeper (the 1 s timer is only the fallback).
            assert any(d.get("request") == "trap" for d in sm.lines[mark:]), sm.lines[mark:]
            (down,) = sm.events("link_down", mark)
            ends = {(down["a"]["name"], down["a"]["port"]), (down["b"]["name"], down["b"]["port"])}
            assert ends == {("leaf-05", port), ("spine-00", spine_port)}, down
            # Only changed blocks go out: one 64-LID block per switch here, and at most all of them.
            assert 0 < cut["lft_blocks_sent"] <= n_switches, cut

            after = dump(sm, sim.work / "lfts.1", cut["sweep"])
            assert after != before
            tables = ibroute_matches(sim, sm, after)
            assert port not in ports_used(tables[leaf_guid]), tables[leaf_guid].lines
            assert spine_port not in ports_used(tables[spine_guid]), tables[spine_guid].lines
            # Every LID routed still: each switch lists every LID of the subnet.
            assert all(len(t.entries) == len(g2l) for t in tables.values())
            # LIDs unchanged: on the wire, and in ibfm's guid2lid file.
            assert lids_seen(sim) == g2l
            assert parse_guid2lid(sm.guid2lid.read_text()) == g2l

            # PortStateChange was cleared: two later light sweeps read only SwitchInfo, one SMP a switch.
            mark = sm.mark()
            sm.wait_sweep(start=mark, kind="light", timeout=5 * SWEEP_S)
            light = sm.wait_sweep(start=sm.mark(), kind="light", timeout=5 * SWEEP_S)
            assert light["smps"] == n_switches, light
            assert all(e["kind"] == "light" for e in sm.events("sweep_done", mark)), "a heavy sweep without a change"
            si = sim.run(["smpquery", "switchinfo", str(tables[leaf_guid].lid)]).stdout
            assert re.search(r"^StateChange:\.+0$", si, re.M), si

            # ReLink: the link is back in the routes, and the tables are the ones from before the cut.
            mark = sm.mark()
            sim.proc.command(f'ReLink "leaf-05"[{port}]')
            back = sm.wait_sweep(start=mark, timeout=10 * SWEEP_S)
            assert back["subnet_up"] and back["engine"] == "ftree", back
            assert len(sm.events("link_up", mark)) == 1
            again = dump(sm, sim.work / "lfts.2", back["sweep"])
            tables = ibroute_matches(sim, sm, again)
            assert port in ports_used(tables[leaf_guid]) and spine_port in ports_used(tables[spine_guid])
            assert again == before
            assert lids_seen(sim) == g2l
            assert sm.returncode() is None, sm.stderr()
        assert sim.proc.alive()
