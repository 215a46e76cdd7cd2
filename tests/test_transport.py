"""The emulated transport: window, timeout, retries and TID matching over the emulated fabric."""

from __future__ import annotations

import asyncio

import pytest

from fabric.emulator import EmulatedFabric, Endpoint
from fabric.generate import fattree
from fabric.mad import (
    NODE_INFO,
    PORT_COUNTERS,
    MadStatus,
    Method,
    PerfAttr,
    SmpAttr,
    notice_unpack,
    parse_mad,
    perf_mad,
    smp_dr,
    smp_lid,
)
from fabric.model import PortState
from sm.transport.base import MadTimeout, TransportError
from sm.transport.emulated import EmulatedTransport
from tests.test_emulator import HOST2, LEAF1, SPINE0, programmed, small


def node_info_req(path: tuple[int, ...]) -> bytes:
    return smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 0, path)


async def test_send_dr_and_match_tids() -> None:
    emu = EmulatedFabric(small())
    async with EmulatedTransport(emu) as t:
        for n in range(emu.fabric.n_nodes):
            path = emu.dr_path(n)
            reply = parse_mad(await t.send(node_info_req(path), path))
            assert reply.status == MadStatus.OK
            assert NODE_INFO.unpack(reply.data)["NodeGUID"] == int(emu.fabric.node_guid[n])
        # TIDs are assigned per attempt and the answer carries the one sent
        tids = [parse_mad(await t.send(node_info_req((1,)), (1,))).tid & 0xFFFFFFFF for _ in range(3)]
        assert tids == sorted(tids) and len(set(tids)) == 3
        assert t.stats.sent == t.stats.received == emu.fabric.n_nodes + 3
        assert t.local_port.node_guid == int(emu.fabric.node_guid[0])


async def test_dropped_mad_times_out_after_retries() -> None:
    emu = EmulatedFabric(small())
    emu.link_down(LEAF1, 3)
    async with EmulatedTransport(emu, timeout=0.01, retries=2) as t:
        with pytest.raises(MadTimeout, match="DR path"):
            await t.send(node_info_req((1, 3, 2)), (1, 3, 2))
        assert (t.stats.sent, t.stats.retries, t.stats.timeouts) == (3, 2, 1)
        with pytest.raises(MadTimeout):
            await t.send(node_info_req((1, 2, 1)), (1, 2, 1))  # through a CA: dropped


async def test_drop_rate_recovered_by_retries() -> None:
    emu = EmulatedFabric(small(), drop_rate=0.5, seed=11)
    async with EmulatedTransport(emu, timeout=0.005, retries=12) as t:
        paths = [emu.dr_path(n) for n in range(emu.fabric.n_nodes)] * 3
        replies = await asyncio.gather(*(t.send(node_info_req(p), p) for p in paths))
        for p, raw in zip(paths, replies, strict=True):
            m = parse_mad(raw)
            assert m.initial_path == p  # each answer went to the request it answers
        assert t.stats.retries > 0 and t.stats.timeouts == 0
        assert t.stats.received == len(paths)


async def test_window_bounds_outstanding_requests() -> None:
    emu = EmulatedFabric(small())
    t = EmulatedTransport(emu, window=4)
    seen: list[int] = []
    process = emu.process

    def counting(mad: bytes, dlid: int | None = None, *, src: Endpoint | None = None) -> bytes | None:
        seen.append(len(t._pending))
        return process(mad, dlid, src=src)

    emu.process = counting  # type: ignore[method-assign]
    paths = [emu.dr_path(n) for n in range(emu.fabric.n_nodes)] * 4
    await asyncio.gather(*(t.send(node_info_req(p), p) for p in paths))
    assert max(seen) == 4 and len(seen) == len(paths)
    await t.close()
    with pytest.raises(TransportError):
        await t.send(node_info_req(()), ())


async def test_lid_routed_smp_and_perfmgt() -> None:
    emu = programmed()
    lid2 = int(emu.fabric.lid[HOST2, 1])
    async with EmulatedTransport(emu) as t:
        m = parse_mad(await t.send(smp_lid(Method.GET, SmpAttr.NODE_INFO, 0, 0), lid2))
        assert NODE_INFO.unpack(m.data)["NodeGUID"] == int(emu.fabric.node_guid[HOST2])
        req = perf_mad(Method.GET, PerfAttr.PORT_COUNTERS, 0, 0, PORT_COUNTERS.pack({"PortSelect": 1}))
        m = parse_mad(await t.send(req, lid2))
        assert m.status == MadStatus.OK and PORT_COUNTERS.unpack(m.data)["PortSelect"] == 1


async def test_perfmgt_over_a_non_active_path_times_out() -> None:
    emu = programmed(PortState.ARMED)
    async with EmulatedTransport(emu, timeout=0.01, retries=1) as t:
        req = perf_mad(Method.GET, PerfAttr.PORT_COUNTERS, 0, 0, PORT_COUNTERS.pack({"PortSelect": 1}))
        with pytest.raises(MadTimeout, match="LID"):
            await t.send(req, int(emu.fabric.lid[HOST2, 1]))


async def test_traps_reach_the_trap_queue() -> None:
    emu = programmed()
    async with EmulatedTransport(emu) as t:
        emu.link_down(LEAF1, 4)
        trap = await t.next_trap(timeout=1.0)
        assert trap is not None
        notice = notice_unpack(parse_mad(trap).data)
        assert notice["TrapNumber"] == 128
        rest = t.pending_traps()
        assert len(rest) == 1 and not emu.traps
        assert t.stats.unsolicited == 2
        assert await t.next_trap(timeout=0.01) is None
    assert emu.on_trap is None


def test_traps_queued_outside_a_loop_are_drained() -> None:
    emu = programmed()
    t = EmulatedTransport(emu)
    emu.link_down(SPINE0, 2)  # leaf 1's way to the SM is cut: spine 0 alone reports
    assert len(emu.traps) == 1  # no loop to hand it to yet
    assert len(t.pending_traps()) == 1 and not emu.traps


async def test_send_many_mixes_answers_and_timeouts() -> None:
    emu = EmulatedFabric(small(), drop_rate=0.3, seed=5)
    emu.link_down(LEAF1, 3)
    good = [emu.dr_path(n) for n in range(emu.fabric.n_nodes)]
    reqs = [(node_info_req(p), p) for p in good] + [(node_info_req((1, 3, 2)), (1, 3, 2))]
    async with EmulatedTransport(emu, window=8, timeout=0.005, retries=10) as t:
        out = await t.send_many(reqs)
    for p, r in zip(good, out, strict=False):
        assert isinstance(r, bytes) and parse_mad(r).initial_path == p
    assert isinstance(out[-1], MadTimeout)
    assert t.stats.timeouts == 1 and t.stats.retries >= 10


# -- what arrives is not trusted ---------------------------------------------------------------------------


async def test_random_mads_of_every_class_method_and_length_are_refused_or_dropped() -> None:
    """20,000 random MADs into the receive path and the manager's trap handling: nothing raises, every
    one is counted once as an answer nobody waited for, a trap, a refused request or a malformed MAD,
    and only readable Notices request a sweep."""
    import random

    from sm.sweep.manager import FabricManager, SmConfig
    from sm.transport.base import is_trap, refusal

    f = fattree(2, 4)
    t = EmulatedTransport(EmulatedFabric(f))
    mgr = FabricManager(t, SmConfig(sweep_interval=3600))
    rng = random.Random(11)
    traps = 0
    n = 20_000
    for i in range(n):
        m = bytearray(rng.randbytes(rng.choice((256, 256, rng.randint(0, 256)))))
        if len(m) > 3:
            m[1] = i % 256
        if len(m) > 17 and i % 7 == 0:  # some look like traps
            m[1], m[3], m[16], m[17] = rng.choice((0x01, 0x81)), 0x05, 0, 2
        mad = bytes(m)
        traps += is_trap(mad)
        t._deliver(mad)
        answer = refusal(mad)
        if answer is not None:
            assert len(answer) == 256 and answer[3] & 0x80 and answer[4:6] in (b"\x00\x0c", b"\x00\x04")
            assert answer[8:16] == mad[8:16]  # the TID comes back
    s = t.stats
    assert s.unsolicited == traps and s.unmatched + s.unsolicited + s.refused + s.malformed == n
    good = mgr._take_traps(t.pending_traps())
    assert good + mgr.bad_traps == traps and mgr.bad_traps > 0
    await t.close()


async def test_a_flood_of_requests_gets_busy_beyond_the_backlog_and_the_rest_served() -> None:
    """More SA requests at once than the services' backlog holds: the excess is answered BUSY (status
    0x0001), counted, never dropped silently; the rest reach the service and are answered."""
    from fabric.mad.sa import SaAttr, SaMethod, parse_sa, sa_mad
    from sm.transport.base import MAX_BACKLOG, MadAddress

    emu = programmed()
    sm = EmulatedTransport(emu)
    served: list[int] = []

    def service(mad: bytes, src: MadAddress) -> bool:
        served.append(1)
        sm.reply(mad[:3] + bytes((mad[3] | 0x80,)) + mad[4:], src)
        return True

    sm.serve(service)
    host = EmulatedTransport(emu, endpoint=emu.attach(HOST2, 1))
    answers: list[bytes] = []
    host.endpoint.on_reply = answers.append
    sa_lid = emu.sm_lid
    n = MAX_BACKLOG + 500
    for tid in range(n):  # all in one turn of the loop: the service gets none before the flood ends
        host.post(sa_mad(SaMethod.GET, SaAttr.NODE_RECORD, tid=tid), sa_lid)
    await asyncio.sleep(0.05)
    statuses = [parse_sa(a).status for a in answers]
    assert len(answers) == n and sm.stats.busy == 500 and len(served) == MAX_BACKLOG
    assert statuses.count(0x0001) == 500 and statuses.count(0) == MAX_BACKLOG
    await host.close()
    await sm.close()
