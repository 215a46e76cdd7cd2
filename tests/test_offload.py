"""sm.sweep.offload: the sweep's routing and checks in a forked child (or a thread), results in order."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from fabric.emulator import EmulatedFabric
from fabric.errors import FormatError, IbfmError
from fabric.generate import fattree, ring
from fabric.model import Fabric
from sm.routing.base import RoutingError
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot, SweepError
from sm.sweep.offload import Emit, Offload, OffloadError
from sm.transport.emulated import EmulatedTransport
from tests.conftest import missing_precondition

T = TypeVar("T")

GUARD_S = 5.0
"""No single get() in these tests may take this long: a hang fails the test instead of the suite."""

BOTH = pytest.mark.parametrize("fork", [True, False], ids=["fork", "thread"])
LFT_SHAPE = (1620, 13285)
"""The LFT of the scale target: 1,620 switches, LIDs up to 13,284."""


async def guarded(aw: Awaitable[T]) -> T:
    return await asyncio.wait_for(aw, GUARD_S)


def big_lft() -> np.ndarray:
    """What the child computes and the parent computes again to compare."""
    rng = np.random.default_rng(1620)
    lft = rng.integers(0, 37, size=LFT_SHAPE, dtype=np.uint8)
    lft[:, ::97] = 255
    return lft


@dataclass(frozen=True)
class Summary:
    engine: str
    refused: tuple[tuple[str, str], ...]
    max_lid: int


class NeedsCode(IbfmError):
    """Pickles, but cannot be unpickled: ``__init__`` wants a second argument that ``args`` lacks."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


async def settle() -> None:
    """Time for a short work to end and for all it gave (results, error, end) to be queued, as when the
    manager asks for the next result long after the work is done."""
    await asyncio.sleep(0.2)


def gone(pid: int) -> bool:
    """True when ``pid`` is no child of ours any more (reaped: no zombie left)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


# -- results ----------------------------------------------------------------------------------------


@BOTH
async def test_results_come_back_in_order_with_a_large_lft_and_a_dataclass(fork: bool) -> None:
    def work(emit: Emit) -> None:
        for i in range(50):
            emit(i)
        emit(big_lft())
        emit(Summary("ftree", (("updn", "no roots"),), 13284))
        emit({"lids": [1, 2, 3]})
        emit(None)

    async with Offload(work, what="test work", fork=fork) as off:
        assert off.forked is fork
        assert [await guarded(off.get()) for _ in range(50)] == list(range(50))
        lft = await guarded(off.get())
        assert isinstance(lft, np.ndarray)
        assert lft.dtype == np.uint8
        assert lft.shape == LFT_SHAPE
        assert np.array_equal(lft, big_lft())
        assert await guarded(off.get()) == Summary("ftree", (("updn", "no roots"),), 13284)
        assert await guarded(off.get()) == {"lids": [1, 2, 3]}
        assert await guarded(off.get()) is None


@BOTH
async def test_work_runs_beside_the_event_loop(fork: bool, tmp_path: Path) -> None:
    """The work waits for something only the parent's event loop does after start(): no deadlock.
    (A file, not an inherited pipe: the child keeps none of the parent's descriptors.)"""
    flag = tmp_path / "go"

    def work(emit: Emit) -> None:
        deadline = time.monotonic() + 4
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        emit(flag.read_bytes())

    async with Offload(work, fork=fork) as off:
        await asyncio.sleep(0)
        flag.write_bytes(b"go")
        assert await guarded(off.get()) == b"go"


async def test_fork_fails_so_the_work_runs_in_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    async with Offload(lambda emit: emit(np.arange(5, dtype=np.uint8)), fork=True) as off:
        assert off.forked is False
        assert np.array_equal(await guarded(off.get()), np.arange(5, dtype=np.uint8))


@BOTH
async def test_the_child_works_on_a_copy_of_the_parents_state(fork: bool) -> None:
    lft = np.zeros((4, 64), dtype=np.uint8)

    def work(emit: Emit) -> None:
        lft[:] = 7
        emit(int(lft.sum()))

    async with Offload(work, fork=fork) as off:
        assert await guarded(off.get()) == 7 * lft.size
    if fork:
        assert not lft.any(), "the child's writes reached the parent"
    else:  # a thread shares the parent's memory: the work must not rely on a copy
        assert (lft == 7).all()


# -- errors raised by the work ------------------------------------------------------------------------


@BOTH
async def test_an_error_of_the_work_is_raised_in_place_of_the_next_result(fork: bool) -> None:
    """The error, not "asked for more results", on every get() after it (inline, the end marker is
    queued behind the error: a get() must not put the error back behind it)."""

    def work(emit: Emit) -> None:
        emit("routed")
        raise RoutingError("ftree: not a fat-tree (leaf-03 has no uplink)")

    async with Offload(work, fork=fork) as off:
        await settle()
        assert await guarded(off.get()) == "routed"
        for _ in range(3):  # this get() and every later one
            with pytest.raises(RoutingError) as e:
                await guarded(off.get())
            assert type(e.value) is RoutingError
            assert str(e.value) == "ftree: not a fat-tree (leaf-03 has no uplink)"


def raise_needs_code(emit: Emit) -> None:
    emit(1)
    raise NeedsCode("leaf-07 port 3: bad cable", 42)


def raise_format_error(emit: Emit) -> None:
    emit(1)
    raise FormatError("fabric.net", 12, "no such port")


@BOTH
@pytest.mark.parametrize(
    ("work", "cls"), [(raise_needs_code, NeedsCode), (raise_format_error, FormatError)], ids=["custom", "FormatError"]
)
async def test_an_error_that_cannot_be_unpickled_is_reported_not_hung(fork: bool, work: Any, cls: type) -> None:
    """Over fork the child sends such an exception as an OffloadError with its class name and words."""
    async with Offload(work, what="sweep 3: routing and checks", fork=fork) as off:
        await settle()
        assert await guarded(off.get()) == 1
        for _ in range(3):
            with pytest.raises(IbfmError) as e:
                await guarded(off.get())
            if fork:  # its __init__ would refuse the pickled args: the child sends its words instead
                assert type(e.value) is OffloadError
                assert str(e.value).startswith(f"sweep 3: routing and checks: {cls.__name__}: ")
                assert ("fabric.net:12: no such port" if cls is FormatError else "leaf-07 port 3") in str(e.value)
            else:  # never pickled: the very exception
                assert type(e.value) is cls


async def test_a_result_that_cannot_be_pickled_is_reported_by_the_child() -> None:
    def work(emit: Emit) -> None:
        emit("ok")
        emit(lambda: None)
        emit("never")

    async with Offload(work, what="sweep 9: routing and checks", fork=True) as off:
        assert await guarded(off.get()) == "ok"
        with pytest.raises(OffloadError, match=r"sweep 9: routing and checks: result cannot be sent back"):
            await guarded(off.get())


@BOTH
async def test_asking_for_more_results_than_emitted_raises(fork: bool) -> None:
    async with Offload(lambda emit: emit("only"), what="sweep 1: checks", fork=fork) as off:
        assert await guarded(off.get()) == "only"
        with pytest.raises(OffloadError, match=r"sweep 1: checks: asked for more results than the work gave"):
            await guarded(off.get())


@BOTH
async def test_every_get_past_the_end_raises(fork: bool) -> None:
    """Every get() past the end raises; none waits for a marker an earlier one took."""
    async with Offload(lambda emit: emit("only"), fork=fork) as off:
        assert await guarded(off.get()) == "only"
        for _ in range(2):
            with pytest.raises(OffloadError, match="asked for more results"):
                await asyncio.wait_for(off.get(), 1.0)  # results are all there: no need to wait long


# -- the child dies or is killed ------------------------------------------------------------------


async def test_a_child_killed_by_a_signal_is_reported_and_reaped() -> None:
    def work(emit: Emit) -> None:
        emit(os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)

    async with Offload(work, what="sweep 5: routing and checks", fork=True) as off:
        assert off.forked
        pid = await guarded(off.get())
        assert pid != os.getpid()
        for _ in range(2):
            with pytest.raises(
                OffloadError, match=rf"sweep 5: routing and checks: .*killed by signal {signal.SIGKILL}"
            ):
                await guarded(off.get())
        status = off.child_status
        assert status is not None
        assert os.WIFSIGNALED(status)
        assert os.WTERMSIG(status) == signal.SIGKILL
        assert gone(pid)


@pytest.mark.parametrize("urgent", [0, 1, 2])
async def test_the_child_computes_its_urgent_results_at_the_parents_priority(urgent: int) -> None:
    from sm.sweep.offload import CHILD_NICE

    def policy() -> tuple[int, int]:
        return os.sched_getscheduler(0), os.nice(0)

    def work_policy(emit: Emit) -> None:
        for _ in range(3):
            emit(policy())

    mine = policy()
    lowered = (os.SCHED_IDLE, mine[1])  # SCHED_IDLE on Linux (nice is left as it was)
    async with Offload(work_policy, fork=True, urgent=urgent) as off:
        got = [await guarded(off.get()) for _ in range(3)]
    assert got == [mine] * urgent + [lowered] * (3 - urgent)
    assert policy() == mine  # the parent's own priority is untouched
    assert CHILD_NICE > 0


def _may_leave_sched_idle() -> bool:
    """Whether a child of this process may go from SCHED_IDLE back to SCHED_OTHER, as Linux rules
    (``can_nice``): with CAP_SYS_NICE (root has it), or where RLIMIT_NICE allows our nice value."""
    status = Path("/proc/self/status").read_text()
    cap_eff = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    cap_sys_nice = 23
    return bool(cap_eff >> cap_sys_nice & 1) or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - os.nice(0)


async def test_hurry_gives_a_lowered_child_the_parents_priority_back() -> None:
    if not _may_leave_sched_idle():
        missing_precondition("raising a lowered priority back needs CAP_SYS_NICE or RLIMIT_NICE", "CI runs as root")

    def work(emit: Emit) -> None:
        emit(os.sched_getscheduler(0))
        time.sleep(0.3)  # the parent hurries the child meanwhile
        emit(os.sched_getscheduler(0))

    async with Offload(work, fork=True, urgent=0) as off:
        assert await guarded(off.get()) == os.SCHED_IDLE
        off.hurry()
        assert await guarded(off.get()) == os.SCHED_OTHER


async def test_a_child_that_exits_early_is_reported_with_its_status() -> None:
    def work(emit: Emit) -> None:
        emit(os.getpid())
        os._exit(3)

    async with Offload(work, what="sweep 6", fork=True) as off:
        pid = await guarded(off.get())
        with pytest.raises(OffloadError, match=r"sweep 6: the child process exited with status 3"):
            await guarded(off.get())
        assert gone(pid)


async def test_close_kills_a_child_still_computing_at_once() -> None:
    def work(emit: Emit) -> None:
        emit(os.getpid())
        time.sleep(30)
        emit("late")

    off = Offload(work, fork=True)
    off.start()
    try:
        pid = await guarded(off.get())
    finally:
        t0 = time.monotonic()
        await off.close()
        took = time.monotonic() - t0
    assert took < 2.0, f"close() took {took:.1f} s"
    status = off.child_status
    assert status is not None
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGKILL
    assert gone(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_leaving_the_context_on_an_error_kills_the_child() -> None:
    """As when programming the switches fails while the child still routes."""

    def work(emit: Emit) -> None:
        emit(os.getpid())
        time.sleep(30)

    t0 = time.monotonic()
    with pytest.raises(SweepError):
        async with Offload(work, fork=True) as off:
            pid = await guarded(off.get())
            raise SweepError("program", "sweep 2: program failed: leaf-01 timed out")
    assert time.monotonic() - t0 < 5.0
    assert off.child_status is not None
    assert gone(pid)


# -- through the subnet manager -------------------------------------------------------------------


async def heavy(f: Fabric, **cfg: Any) -> tuple[EmulatedFabric, SubnetSnapshot]:
    emu = EmulatedFabric(f)
    snap = await FabricManager(EmulatedTransport(emu), SmConfig(**cfg)).heavy_sweep()
    return emu, snap


@pytest.mark.parametrize(
    ("make", "engines", "layered"),
    [(lambda: fattree(3, 8), ("ftree", "updn", "minhop"), False), (lambda: ring(6, 2), ("minhop",), True)],
    ids=["fattree-3-8", "ring-minhop"],
)
async def test_a_heavy_sweep_gives_the_same_subnet_with_and_without_offload(
    make: Any, engines: tuple[str, ...], layered: bool
) -> None:
    snaps = {}
    for offload in (True, False):
        emu, snap = await heavy(make(), offload=offload, engines=engines)
        assert snap.program.ok
        assert snap.verify.ok
        assert 0 < snap.up_s <= snap.duration_s
        for name in ("routing", "verify", "credit_loops", "program"):
            assert name in snap.phases
        g = snap.fabric
        for row, n in enumerate(g.switches.tolist()):  # the switches hold what the sweep computed
            e = emu.fabric.by_guid(int(g.node_guid[n]))
            assert np.array_equal(emu.lft[emu.switch_row(e), : snap.lids.max_lid + 1], snap.lft[row])
        snaps[offload] = snap
    a, b = snaps[True], snaps[False]
    assert a.engine == b.engine == engines[0]
    assert a.refused == b.refused
    assert a.lft.shape == b.lft.shape
    assert np.array_equal(a.lft, b.lft)
    assert (a.verify.pairs, a.verify.reachable, a.verify.unreachable) == (
        b.verify.pairs,
        b.verify.reachable,
        b.verify.unreachable,
    )
    assert a.verify == b.verify
    assert a.credit_loops == b.credit_loops == ()  # minhop's loop on the ring is lifted onto VL 1
    assert (a.layers is not None) is layered
    if a.layers is not None:
        assert b.layers is not None and np.array_equal(a.layers, b.layers)


@pytest.mark.parametrize("offload", [True, False], ids=["fork", "thread"])
async def test_a_routing_failure_in_the_child_fails_the_routing_stage(offload: bool) -> None:
    with pytest.raises(SweepError) as e:
        await heavy(ring(4, 1), offload=offload, engines=("ftree",))
    assert e.value.stage == "routing"
    assert "no engine in ftree could route the fabric" in str(e.value)
    assert isinstance(e.value.__cause__, RoutingError)


async def test_a_stop_signal_to_the_process_group_leaves_the_child_computing() -> None:
    # systemd's stop and ^C signal the whole group; the parent lets its sweep finish, so must the child.
    def work(emit: Emit) -> None:
        time.sleep(0.3)
        emit("routed")

    async with Offload(work, fork=True) as off:
        await asyncio.sleep(0.05)
        pid = off._pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
        assert await guarded(off.get()) == "routed"


async def test_inline_the_rest_waits_until_the_parent_waits() -> None:
    ran: list[str] = []

    def work(emit: Emit) -> None:
        ran.append("route")
        emit("lft")
        ran.append("verify")  # must not run while the parent sends MADs
        emit("report")

    async with Offload(work, fork=False, urgent=1) as off:
        assert await guarded(off.get()) == "lft"
        await asyncio.sleep(0.1)
        assert ran == ["route"]
        off.hurry()
        assert await guarded(off.get()) == "report"
        assert ran == ["route", "verify"]
    # Closed without asking for the rest: the thread stops at its next result, not at the end.
    done: list[str] = []

    def long_work(emit: Emit) -> None:
        emit("lft")
        done.append("went on")

    async with Offload(long_work, fork=False, urgent=1) as off:
        assert await guarded(off.get()) == "lft"
    assert done == []


@BOTH
async def test_an_error_keeps_where_it_came_from(fork: bool) -> None:
    def work(emit: Emit) -> None:
        raise RoutingError("ftree: no roots")

    async with Offload(work, what="sweep 2: routing and checks", fork=fork) as off:
        with pytest.raises(RoutingError) as e:
            await guarded(off.get())
    if fork:
        notes = e.value.__notes__
        assert any(n.startswith("in the sweep 2: routing and checks child process") and ", in work" in n for n in notes)


async def test_a_result_that_does_not_come_in_time_stops_the_child() -> None:
    def work(emit: Emit) -> None:
        time.sleep(30)

    async with Offload(work, what="sweep 4: routing and checks", fork=True) as off:
        pid = off._pid
        with pytest.raises(OffloadError, match=r"sweep 4: routing and checks: no result within 0.2 s"):
            await off.get(timeout=0.2)
        with pytest.raises(OffloadError):  # and every later get
            await off.get()
    assert pid is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


async def test_the_child_does_not_hold_the_parents_connections() -> None:
    import socket

    mine, peer = socket.socketpair()

    def work(emit: Emit) -> None:
        emit("started")
        time.sleep(1.0)
        emit("done")

    async with Offload(work, fork=True, urgent=2) as off:
        assert await guarded(off.get()) == "started"
        mine.close()  # the parent ends its connection while the child computes
        peer.settimeout(0.5)
        assert peer.recv(1) == b""  # EOF at once: no copy of the socket lives on in the child
        assert await guarded(off.get()) == "done"
    peer.close()
