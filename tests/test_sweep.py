"""Sweeps on the emulated fabric: changes found, routed around, only what changed reprogrammed."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.model import Fabric, NodeType, PortState
from sm.sweep.events import Event, LinkDown, LinkUp, NodeAdded, NodeRemoved, PortHeldDown, SweepDone
from sm.sweep.light import FlapDamper
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot
from sm.transport.emulated import EmulatedTransport


def lids_by_guid(snap: SubnetSnapshot) -> dict[int, int]:
    f = snap.fabric
    return {int(f.port_guid[n, p]): int(snap.lids.base[n, p]) for n, p in f.endports().tolist()}


def check(snap: SubnetSnapshot, emu: EmulatedFabric, before: dict[int, int] | None = None) -> None:
    """Every connected pair routed, no loop, no credit loop; the switches hold the LFTs; LIDs kept."""
    assert snap.verify.ok, [str(x) for x in snap.verify.failures[:5]]
    assert snap.program.ok, snap.program.failures[:5]
    if snap.engine in ("ftree", "updn"):
        assert snap.credit_loops == ()
    g = snap.fabric
    for row, n in enumerate(g.switches.tolist()):
        e = emu.fabric.by_guid(int(g.node_guid[n]))
        held = emu.lft[emu.switch_row(e), : snap.lids.max_lid + 1]
        assert np.array_equal(held, snap.lft[row]), g.names[n]
    if before is not None:
        now = lids_by_guid(snap)
        assert all(now[k] == v for k, v in before.items() if k in now)


def inter_switch_links(f: Fabric) -> list[tuple[int, int]]:
    return [(a, b) for a, b, _, _ in f.switch_links().tolist()]


class Rig:
    def __init__(self, fabric: Fabric, **cfg: object) -> None:
        self.emu = EmulatedFabric(fabric)
        self.events: list[Event] = []
        self.mgr = FabricManager(EmulatedTransport(self.emu), SmConfig(**cfg))  # type: ignore[arg-type]
        self.mgr.events.subscribe(self.events.append)

    def of(self, kind: type) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


async def test_link_down_is_routed_around_and_only_changed_blocks_are_sent() -> None:
    f = fattree(2, 16)
    rig = Rig(f)
    first = await rig.mgr.sweep()
    assert first is not None
    check(first, rig.emu)
    total_blocks = first.program.blocks_sent
    assert await rig.mgr.sweep() is None  # nothing changed: a light sweep only
    n, p = inter_switch_links(f)[0]
    rig.emu.link_down(n, p)
    snap = await rig.mgr.sweep()
    assert snap is not None and snap.engine == "ftree"
    check(snap, rig.emu, lids_by_guid(first))
    assert 0 < snap.program.blocks_sent < total_blocks
    downs = rig.of(LinkDown)
    assert len(downs) == 1 and {downs[0].a.name, downs[0].b.name} >= {f.names[n]}
    rig.emu.link_up(n, p)
    snap = await rig.mgr.sweep()
    assert snap is not None
    check(snap, rig.emu, lids_by_guid(first))
    assert len(rig.of(LinkUp)) == 1
    up = snap.fabric.up_mask()
    assert (snap.fabric.state[up] == PortState.ACTIVE).all()


async def test_switch_removed_and_readded() -> None:
    f = fattree(3, 4)
    rig = Rig(f)
    first = await rig.mgr.sweep()
    assert first is not None
    spine = int(f.switches[-1])
    rig.emu.remove_node(spine)
    snap = await rig.mgr.sweep()
    assert snap is not None
    check(snap, rig.emu, lids_by_guid(first))
    assert [e.name for e in rig.of(NodeRemoved)] == [f.names[spine]]
    rig.emu.restore_node(spine)
    snap = await rig.mgr.sweep()
    assert snap is not None
    check(snap, rig.emu, lids_by_guid(first))
    assert [e.name for e in rig.of(NodeAdded)] == [f.names[spine]]
    assert lids_by_guid(snap) == lids_by_guid(first)


async def test_host_added_gets_a_new_lid_and_routes() -> None:
    f = fattree(2, 4)
    host = int(f.cas[-1])
    leaf, leaf_port = int(f.peer_node[host, 1]), int(f.peer_port[host, 1])
    rig = Rig(f)
    rig.emu.link_down(host, 1)  # cabled but dark: not there yet
    first = await rig.mgr.sweep()
    assert first is not None and f.node_guid[host] not in first.fabric.node_guid
    rig.emu.link_up(leaf, leaf_port)
    snap = await rig.mgr.sweep()
    assert snap is not None
    check(snap, rig.emu, lids_by_guid(first))
    assert f.node_guid[host] in snap.fabric.node_guid
    assert [e.name for e in rig.of(NodeAdded)] == [f.names[host]]


async def test_host_link_down_keeps_everyone_else() -> None:
    f = fattree(2, 4)
    rig = Rig(f)
    first = await rig.mgr.sweep()
    assert first is not None
    host = int(f.cas[3])
    rig.emu.link_down(host, 1)
    snap = await rig.mgr.sweep()
    assert snap is not None
    check(snap, rig.emu, lids_by_guid(first))


async def test_flapping_link_is_held_down_and_reported() -> None:
    f = fattree(2, 4)
    rig = Rig(f, flap_max=2, flap_window=60.0, flap_hold=3600.0)
    await rig.mgr.sweep()
    n, p = inter_switch_links(f)[0]
    for _ in range(3):
        rig.emu.link_down(n, p)
        await rig.mgr.sweep()
        rig.emu.link_up(n, p)
        await rig.mgr.sweep()
    held = rig.of(PortHeldDown)
    assert held, "the flapping port was not held down"
    snap = rig.mgr.snapshot
    assert snap is not None
    g = snap.fabric
    a = g.by_guid(int(f.node_guid[n]))
    assert g.peer_node[a, p] < 0  # not in the routed model while held
    check(snap, rig.emu)


def test_flap_damper_window() -> None:
    d = FlapDamper(max_flaps=2, window=10, hold=5)
    k = (1, 1)
    assert not d.record(k, 0) and not d.record(k, 1)
    assert d.record(k, 2)
    assert k in d.held(3)
    assert d.release_expired(8) == [k]
    assert not d.held(8)
    assert not d.record(k, 100) and not d.record(k, 120)


async def test_daemon_loop_reacts_to_a_trap_and_stops_cleanly() -> None:
    f = fattree(2, 4)
    rig = Rig(f, sweep_interval=30.0)
    stop = asyncio.Event()
    task = asyncio.create_task(rig.mgr.run(stop))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if rig.mgr.snapshot is not None:
            break
    first = rig.mgr.snapshot
    assert first is not None
    n, p = inter_switch_links(f)[1]
    rig.emu.link_down(n, p)  # the switch sends trap 128; no timer would fire for 30 s
    for _ in range(300):
        await asyncio.sleep(0.01)
        if rig.mgr.snapshot is not first:
            break
    assert rig.mgr.snapshot is not first
    stop.set()
    await asyncio.wait_for(task, 5)
    assert rig.of(SweepDone)


async def test_a_trap_during_a_multicast_pass_is_not_lost() -> None:
    """A sweep asked for while a multicast-only pass runs (it clears the wake-up) still runs at once, not at
    the next timer: the race a trap arriving right after bring-up (IPoIB's group being programmed) hit."""
    f = fattree(2, 4)
    rig = Rig(f, sweep_interval=30.0)
    first = await rig.mgr.sweep()
    assert first is not None
    n, p = inter_switch_links(f)[1]
    real_pass = rig.mgr.multicast_pass

    async def pass_with_a_trap() -> None:
        rig.emu.link_down(n, p)  # its switches' traps reach the trap watcher, which asks for a sweep ...
        await asyncio.sleep(0.2)
        assert rig.mgr._reasons == {"trap"}
        await real_pass()  # ... before this pass takes the sweeper's lock

    rig.mgr.multicast_pass = pass_with_a_trap  # type: ignore[method-assign]
    done = len(rig.of(SweepDone))
    stop = asyncio.Event()
    task = asyncio.create_task(rig.mgr.run(stop))
    for _ in range(300):
        await asyncio.sleep(0.01)
        if len(rig.of(SweepDone)) > done:  # the loop's start sweep: it now waits for its timer or a wake-up
            break
    rig.mgr._mcast_dirty = True  # a join, as the SA's group change callback marks it
    rig.mgr._wake.set()
    assert len(rig.of(SweepDone)) == done + 1 and not rig.of(LinkDown)
    for _ in range(300):  # 3 s; the timer would take 30
        await asyncio.sleep(0.01)
        if rig.of(LinkDown):
            break
    stop.set()
    await asyncio.wait_for(task, 5)
    assert rig.of(LinkDown), "the sweep asked for during the multicast pass did not run"


@pytest.mark.slow
async def test_storm_of_link_events_on_a_3_level_tree() -> None:
    f = fattree(3, 6)
    rig = Rig(f, flap_max=1000)
    first = await rig.mgr.sweep()
    assert first is not None
    base = lids_by_guid(first)
    rng = random.Random(7)
    links = inter_switch_links(f) + [(int(h), 1) for h in f.cas[:10]]
    down: set[tuple[int, int]] = set()
    for _ in range(100):
        if down and rng.random() < 0.5:
            n, p = rng.choice(sorted(down))
            down.discard((n, p))
            rig.emu.link_up(n, p)
        else:
            n, p = rng.choice(links)
            if (n, p) in down:
                continue
            down.add((n, p))
            rig.emu.link_down(n, p)
        snap = await rig.mgr.sweep()
        assert snap is not None
        check(snap, rig.emu, base)
    for n, p in sorted(down):
        rig.emu.link_up(n, p)
    snap = await rig.mgr.sweep()
    assert snap is not None
    check(snap, rig.emu, base)
    assert snap.fabric.switch_links().shape[0] == f.switch_links().shape[0]
    assert all(snap.fabric.node_type[snap.fabric.by_guid(int(f.node_guid[h]))] == NodeType.CA for h in f.cas[:10])


# -- bounces and holds (review findings) ----------------------------------------------------------------


def model_state(rig: Rig, f: Fabric, n: int, p: int) -> int:
    snap = rig.mgr.snapshot
    assert snap is not None
    g = snap.fabric
    a = g.by_guid(int(f.node_guid[n]))
    return int(g.state[a, p]) if g.peer_node[a, p] >= 0 else -1


async def test_a_bounce_between_sweeps_is_brought_up_again() -> None:
    """Down and up between two sweeps: the port is LinkUp as before but INIT; the light sweep sees
    the bounce and the next heavy sweep arms and activates it."""
    f = fattree(2, 4)
    rig = Rig(f)
    await rig.mgr.sweep()
    n, p = inter_switch_links(f)[0]
    rig.emu.link_down(n, p)
    rig.emu.link_up(n, p)
    assert int(rig.emu.fabric.state[n, p]) == PortState.INIT
    snap = await rig.mgr.sweep()
    assert snap is not None and snap.up
    assert int(rig.emu.fabric.state[n, p]) == PortState.ACTIVE
    check(snap, rig.emu)


async def test_a_held_port_that_bounces_leaves_the_routes() -> None:
    """A bounce that trips the damper must take the link out of the routes (it sits in INIT), not be
    dropped as "a held port coming up" while the model keeps it ACTIVE."""
    f = fattree(2, 4)
    rig = Rig(f, flap_max=2, flap_window=60.0, flap_hold=3600.0)
    await rig.mgr.sweep()
    n, p = inter_switch_links(f)[0]
    for _ in range(4):
        rig.emu.link_down(n, p)
        rig.emu.link_up(n, p)
        await rig.mgr.sweep()
        snap = rig.mgr.snapshot
        assert snap is not None
        live = int(rig.emu.fabric.state[n, p])
        # Never: the model routes over the link while the port cannot carry data.
        assert not (model_state(rig, f, n, p) == PortState.ACTIVE and live != PortState.ACTIVE), live
    assert rig.of(PortHeldDown)
    check(rig.mgr.snapshot, rig.emu)  # type: ignore[arg-type]


async def test_an_expired_hold_does_not_spin_the_sweeper() -> None:
    """next_release ignores holds already past, and a heavy sweep releases them too."""
    d = FlapDamper(max_flaps=1, window=60, hold=1)
    k = (1, 1)
    d.record(k, 0)
    assert d.record(k, 1) and d.next_release(1.5) == 2
    assert d.next_release(3) is None  # expired: no wake-up in the past
    assert d.release_expired(3) == [k]


async def test_a_quiet_held_port_is_released_though_its_switch_changes() -> None:
    """A held port is out of the model and reads "up" at every read of its switch; that is no flap,
    so a neighbouring port's changes do not keep it held."""
    f = fattree(2, 4)
    rig = Rig(f, flap_max=2, flap_window=60.0, flap_hold=3600.0)
    await rig.mgr.sweep()
    (n, p), (n2, p2) = [(a, b) for a, b in inter_switch_links(f) if a == inter_switch_links(f)[0][0]][:2]
    for _ in range(3):
        rig.emu.link_down(n, p)
        await rig.mgr.sweep()
        rig.emu.link_up(n, p)
        await rig.mgr.sweep()
    key = (int(f.node_guid[n]), p)
    assert key in rig.mgr.damper.held()
    until = rig.mgr.damper.held_until[key]
    rig.emu.link_down(n2, p2)  # the same switch reads its ports again
    await rig.mgr.sweep()
    assert rig.mgr.damper.held_until[key] == until
