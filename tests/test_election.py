"""SM election over the emulated fabric: two ibfm SMs on one subnet, SMInfo answers and their rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.mad import SM_INFO, Method, SmpAttr, SmState, parse_mad, smp_lid
from sm.election.elector import SmInfoControl
from sm.sweep.events import EventBus, SmStateChanged
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.base import MadAddress
from sm.transport.emulated import EmulatedTransport

FAST = {"offload": False, "check_credit_loops": False, "sweep_interval": 0.5, "sm_poll_interval": 0.2}


@dataclass
class Sm:
    transport: EmulatedTransport
    manager: FabricManager
    events: list[SmStateChanged]
    task: asyncio.Task[None]
    stop: asyncio.Event

    @property
    def state(self) -> SmState:
        return self.manager.elector.state

    async def halt(self) -> None:
        """kill -9: it stops answering at once (its port keeps its link)."""
        self.stop.set()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.transport.close()


@asynccontextmanager
async def running(emu: EmulatedFabric, node: int, priority: int) -> AsyncIterator[Sm]:
    ep = emu.primary if node == emu.sm_node else emu.attach(node, 1)
    t = EmulatedTransport(emu, endpoint=ep, issm=True, timeout=0.02, retries=1)
    bus = EventBus()
    seen: list[SmStateChanged] = []
    bus.subscribe(lambda e: seen.append(e) if isinstance(e, SmStateChanged) else None)
    mgr = FabricManager(t, SmConfig(sm_priority=priority, **FAST), bus)  # type: ignore[arg-type]
    t.serve(mgr.elector.take)
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.run(stop))
    sm = Sm(t, mgr, seen, task, stop)
    try:
        yield sm
    finally:
        if not task.done():
            await sm.halt()


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def test_a_better_sm_takes_over_and_the_other_takes_back_when_it_dies() -> None:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    a_node, b_node = int(f.cas[0]), int(f.cas[1])
    async with running(emu, a_node, 0) as a:
        await until(lambda: a.state == SmState.MASTER and a.manager.snapshot is not None)
        lid_a = a.manager.snapshot.sm_lid  # type: ignore[union-attr]
        async with running(emu, b_node, 5) as b:
            # B finds A master and stands by; its Trap 144 tells A, who steps down; B finds no master.
            await until(lambda: b.state == SmState.MASTER and a.state == SmState.STANDBY)
            await until(lambda: b.manager.snapshot is not None and b.manager.snapshot.up)
            snap = b.manager.snapshot
            assert snap is not None and snap.program.reregistered > 0  # hosts told to re-register
            lid_b = snap.sm_lid
            assert all(int(x) == lid_b for x in emu.master_sm_lid[f.cas, 1])
            assert a.manager.elector.master is not None and a.manager.elector.master.guid == b.manager.elector.guid
            states = [e.state for e in a.events]
            assert states[:2] == ["master", "standby"], states
            await asyncio.sleep(1.0)  # no fight: A stays standby while B answers
            assert a.state == SmState.STANDBY and b.state == SmState.MASTER
            await b.halt()
            await until(lambda: a.state == SmState.MASTER, timeout=5)
            await until(lambda: all(int(x) == lid_a for x in emu.master_sm_lid[f.cas, 1]))


async def test_a_lower_sm_arriving_stands_by_and_never_writes() -> None:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    async with running(emu, int(f.cas[0]), 7) as a:
        await until(lambda: a.state == SmState.MASTER and a.manager.snapshot is not None)
        async with running(emu, int(f.cas[1]), 3) as b:
            await until(lambda: b.state == SmState.STANDBY)
            sets_before = emu.stats.received
            b_sent = b.transport.stats.sent
            await asyncio.sleep(1.0)
            assert b.state == SmState.STANDBY and a.state == SmState.MASTER
            assert b.manager.snapshot is None  # a standby publishes nothing of its own
            # What B sent while standing by were SMInfo polls only (Gets), no Set of any kind.
            assert b.transport.stats.sent > b_sent and emu.stats.received > sets_before


def _sminfo_set(control: int, state: SmState, guid: int = 0x99) -> bytes:
    data = SM_INFO.pack({"GUID": guid, "SM_Key": 1, "ActCount": 1, "Priority": 9, "SMState": int(state)})
    return smp_lid(Method.SET, SmpAttr.SM_INFO, control, 1, data)


async def test_sminfo_sets_follow_the_legality_rules() -> None:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    t = EmulatedTransport(emu, issm=True)
    mgr = FabricManager(t, SmConfig(offload=False, check_credit_loops=False, sm_priority=3))
    await mgr.heavy_sweep()
    el = mgr.elector
    assert el.state == SmState.MASTER
    answers: list[bytes] = []
    t.reply = lambda mad, to: answers.append(mad)  # type: ignore[method-assign]
    src = MadAddress(5, 0, 0)
    # ACKNOWLEDGE to a master, DISCOVER from a standby, garbage modifiers: refused, nothing changes.
    for mad in (
        _sminfo_set(SmInfoControl.ACKNOWLEDGE, SmState.STANDBY),
        _sminfo_set(SmInfoControl.DISCOVER, SmState.STANDBY),
        _sminfo_set(0, SmState.MASTER),
        _sminfo_set(77, SmState.MASTER),
        _sminfo_set(SmInfoControl.DISABLE, SmState.MASTER),  # DISABLE is for standbys
    ):
        assert el.take(mad, src)
        await asyncio.sleep(0)
        m = parse_mad(answers[-1])
        assert m.method == Method.GET_RESP and m.status == 0x001C
        assert el.state == SmState.MASTER
    # A Get answers our SMInfo with our priority and state.
    el.take(smp_lid(Method.GET, SmpAttr.SM_INFO, 0, 2), src)
    info = SM_INFO.unpack(parse_mad(answers[-1]).data)
    assert info["Priority"] == 3 and info["SMState"] == SmState.MASTER and info["SM_Key"] == 1
    assert info["GUID"] == int(emu.fabric.port_guid[emu.sm_node, emu.sm_port])
    # HANDOVER from a master to a master: taken (a full first-time sweep follows), still master.
    assert el.take(_sminfo_set(SmInfoControl.HANDOVER, SmState.MASTER), src)
    await asyncio.sleep(0)
    assert parse_mad(answers[-1]).status == 0 and el.state == SmState.MASTER and el.first_sweep
    # Other attributes are not ours to answer: the transport refuses them.
    assert not el.take(smp_lid(Method.GET, SmpAttr.NODE_INFO, 0, 3), src)
    await t.close()


async def test_a_sweep_beside_a_better_master_writes_nothing() -> None:
    """Discovery finds another master (an SM declared in the emulator, priority 5): the sweep ends
    with StandingBy before any Set leaves, and the LFTs and port states are as they were."""
    import pytest

    from sm.sweep.manager import StandingBy

    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    other = int(f.cas[2])
    emu.set_sm(other, 1, priority=5, state=SmState.MASTER)
    t = EmulatedTransport(emu, issm=True)
    methods: list[int] = []
    process = emu.process

    def recording(mad: bytes, dlid: int | None = None, **kw: object) -> bytes | None:
        methods.append(mad[3])
        return process(mad, dlid, **kw)  # type: ignore[arg-type]

    emu.process = recording  # type: ignore[method-assign]
    lft_before, states_before = emu.lft.copy(), emu.fabric.state.copy()
    mgr = FabricManager(t, SmConfig(offload=False, check_credit_loops=False))
    with pytest.raises(StandingBy, match="master is"):
        await mgr.heavy_sweep()
    assert Method.SET not in methods and methods.count(Method.GET) > 10
    assert (emu.lft == lft_before).all() and (emu.fabric.state == states_before).all()
    el = mgr.elector
    assert el.state == SmState.STANDBY and el.master is not None
    assert el.master.guid == int(f.port_guid[other, 1]) and mgr.snapshot is None
    await t.close()


async def test_a_master_waiting_for_a_handover_stands_by_when_the_other_master_ranks_above_it() -> None:
    """Two masters: we rank above the other, so we wait for its handover writing nothing; its priority
    rises above ours: at the next poll we stand by (instead of waiting for ever)."""
    import pytest

    from sm.sweep.manager import StandingBy

    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    t = EmulatedTransport(emu, issm=True)
    mgr = FabricManager(t, SmConfig(offload=False, check_credit_loops=False, sm_priority=5, sm_poll_retries=0))
    assert (await mgr.heavy_sweep()).up  # master alone
    other = int(f.cas[2])
    rec = emu.set_sm(other, 1, priority=1, state=SmState.MASTER)  # a second master appears, below us
    with pytest.raises(StandingBy):
        await mgr.heavy_sweep()
    el = mgr.elector
    assert el.state == SmState.MASTER and el.waiting_handover and not el.may_write
    assert await el.poll() is False and el.state == SmState.MASTER  # still waiting: it ranks below us
    rec.priority = 9
    emu._forget_port_info(other, 1)
    assert await el.poll() is False
    assert el.state == SmState.STANDBY and not el.waiting_handover and el.master is not None
    assert el.master.guid == int(f.port_guid[other, 1])
    await t.close()
