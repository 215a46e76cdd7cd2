"""The transport interface: MAD bytes out along a route, MAD bytes back.

``route`` is either a directed-route path (a tuple of output ports, the
first taken at the SM's own node; the empty tuple addresses the SM's own
node) or a destination LID. The SM cannot tell transports apart.

:class:`WindowedTransport` holds what every transport shares: a window of
outstanding requests, per-request timeout and retries, TID assignment and
matching on the low 32 bits (the kernel owns the high 32), counters.
A subclass only posts bytes (``_post``) and hands replies to ``_deliver``
and unsolicited MADs (traps) to ``_unsolicited``.
"""

from __future__ import annotations

import asyncio
import struct
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fabric.errors import IbfmError

Route = tuple[int, ...] | int

_TID = struct.Struct(">Q")
TID_OFFSET = 8
_RESPONSE_BIT = 0x80
_ATTR = struct.Struct(">H")


class TransportError(IbfmError):
    """The transport itself failed (no device, port busy, closed)."""


class MadTimeout(IbfmError):
    """No answer after every retry; names the route and attribute."""

    def __init__(self, route: Route, attr_id: int, attempts: int) -> None:
        where = f"LID {route}" if isinstance(route, int) else f"DR path {list(route)}"
        super().__init__(f"MAD timeout: attribute {attr_id:#06x} to {where}, {attempts} attempt(s)")
        self.route = route
        self.attr_id = attr_id


def describe_route(route: Route) -> str:
    return f"LID {route}" if isinstance(route, int) else f"DR path {','.join(map(str, route)) or '(local)'}"


@dataclass
class TransportStats:
    sent: int = 0
    received: int = 0
    timeouts: int = 0
    retries: int = 0
    unmatched: int = 0
    unsolicited: int = 0


class WindowedTransport(ABC):
    """Window, timeout, retries and TID matching over a raw post/deliver pair.

    The window counts every outstanding request, whether sent alone
    (:meth:`send`) or in a batch (:meth:`send_many`); a freed slot goes to
    the oldest waiter. Requests are tracked by callbacks and timer handles,
    not tasks, so a batch of 100,000 SMPs costs no coroutine per SMP.
    """

    def __init__(self, *, window: int = 64, timeout: float = 0.2, retries: int = 3) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = window
        self.timeout = timeout
        self.retries = retries
        self.stats = TransportStats()
        self._inflight = 0
        self._waiters: deque[Callable[[], bool]] = deque()
        self._pending: dict[int, Callable[[bytes], None]] = {}
        self._next_tid = 1
        self._traps: asyncio.Queue[bytes] = asyncio.Queue()
        self._closed = False
        self._batches: set[asyncio.Future[None]] = set()

    # -- subclass side --------------------------------------------------------

    @abstractmethod
    def _post(self, mad: bytes, route: Route) -> None:
        """Put one MAD on the wire (non-blocking); replies come via ``_deliver``."""

    async def _close(self) -> None:  # noqa: B027 - optional hook
        """Release the device; called once by :meth:`close`."""

    def _deliver(self, mad: bytes) -> None:
        """A MAD arrived: complete the request it answers, or queue it as unsolicited."""
        if len(mad) < 24:
            self.stats.unmatched += 1
            return
        if not mad[3] & _RESPONSE_BIT:
            self._unsolicited(mad)
            return
        tid = _TID.unpack_from(mad, TID_OFFSET)[0] & 0xFFFFFFFF
        done = self._pending.pop(tid, None)
        if done is None:
            self.stats.unmatched += 1
            return
        self.stats.received += 1
        done(mad)

    def _unsolicited(self, mad: bytes) -> None:
        self.stats.unsolicited += 1
        self._traps.put_nowait(mad)

    # -- the window -------------------------------------------------------------

    def _try_take(self) -> bool:
        if self._inflight < self.window and not self._waiters:
            self._inflight += 1
            return True
        return False

    def _release(self) -> None:
        """Hand the slot to the oldest waiter that still wants it, else free it."""
        while self._waiters:
            if self._waiters.popleft()():
                return
        self._inflight -= 1

    def _launch(
        self,
        mad: bytes,
        route: Route,
        on_reply: Callable[[bytes], None],
        on_expire: Callable[[], None],
        tmo: float,
    ) -> Callable[[], None]:
        """Post one attempt under a fresh TID; returns a canceller for its timer and TID."""
        loop = asyncio.get_running_loop()
        tid = self._alloc_tid()
        buf = bytearray(mad)
        _TID.pack_into(buf, TID_OFFSET, tid)

        def expired() -> None:
            if self._pending.pop(tid, None) is not None:
                on_expire()

        timer = loop.call_later(tmo, expired)

        def reply(m: bytes) -> None:
            timer.cancel()
            on_reply(m)

        self._pending[tid] = reply
        self.stats.sent += 1
        try:
            self._post(bytes(buf), route)
        except BaseException:
            timer.cancel()
            self._pending.pop(tid, None)
            raise

        def cancel() -> None:
            timer.cancel()
            self._pending.pop(tid, None)

        return cancel

    # -- caller side ----------------------------------------------------------

    def post(self, mad: bytes, route: Route) -> None:
        """Send a MAD that gets no answer (a TrapRepress), as is: no TID, window or retry."""
        if self._closed:
            raise TransportError("transport is closed")
        self.stats.sent += 1
        self._post(mad, route)

    async def send(
        self, mad: bytes, route: Route, *, timeout: float | None = None, retries: int | None = None
    ) -> bytes:
        """Send a request MAD and return its response; MadTimeout after all retries."""
        (answer,) = await self.send_many([(mad, route)], timeout=timeout, retries=retries, raise_first=True)
        assert isinstance(answer, bytes)
        return answer

    async def send_many(
        self,
        requests: Sequence[tuple[bytes, Route]],
        *,
        timeout: float | None = None,
        retries: int | None = None,
        raise_first: bool = False,
    ) -> list[bytes | IbfmError]:
        """Send every request under the window; answers in request order.

        An entry that timed out after all retries (or could not be posted)
        holds the exception instead of bytes, unless ``raise_first``, which
        raises the first such exception once the batch is done. Use
        :func:`is_answer` to tell them apart.
        """
        if self._closed:
            raise TransportError("transport is closed")
        n = len(requests)
        results: list[Any] = [None] * n
        if n == 0:
            return results
        tmo = self.timeout if timeout is None else timeout
        tries = 1 + (self.retries if retries is None else retries)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        state = {"next": 0, "left": n}
        cancels: dict[int, Callable[[], None]] = {}

        def finish(i: int, value: Any) -> None:
            cancels.pop(i, None)
            results[i] = value
            self._release()
            state["left"] -= 1
            if state["left"] == 0 and not done.done():
                done.set_result(None)

        def attempt(i: int, k: int) -> None:
            mad, route = requests[i]
            if done.done():
                return

            def on_reply(m: bytes) -> None:
                finish(i, m)

            def on_expire() -> None:
                cancels.pop(i, None)
                if k + 1 < tries:
                    self.stats.retries += 1
                    attempt(i, k + 1)
                else:
                    self.stats.timeouts += 1
                    finish(i, MadTimeout(route, _ATTR.unpack_from(mad, 16)[0], tries))

            try:
                cancels[i] = self._launch(mad, route, on_reply, on_expire, tmo)
            except IbfmError as e:
                finish(i, e)
            except (ValueError, OSError) as e:
                finish(i, TransportError(f"{describe_route(route)}: cannot send: {e}"))

        def start_next() -> bool:
            """Launch the next request on a slot we hold; False if none is left."""
            i = state["next"]
            if i >= n or done.done():
                return False
            state["next"] = i + 1
            attempt(i, 0)
            return True

        def waiter() -> bool:
            # Called by _release with a slot handed over; keeps one place in the queue.
            if not start_next():
                return False
            if state["next"] < n:
                self._waiters.append(waiter)
            return True

        def want_slots() -> None:
            while state["next"] < n and self._try_take():
                start_next()
            if state["next"] < n:
                self._waiters.append(waiter)

        def forget(_: asyncio.Future[None]) -> None:
            self._batches.discard(done)

        self._batches.add(done)
        done.add_done_callback(forget)
        want_slots()
        try:
            await done
        except asyncio.CancelledError:
            for c in list(cancels.values()):
                c()
            for _ in range(len(cancels)):
                self._release()
            raise
        if raise_first:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def _alloc_tid(self) -> int:
        tid = self._next_tid
        self._next_tid = tid + 1 if tid < 0xFFFFFFFF else 1
        return tid

    async def next_trap(self, timeout: float | None = None) -> bytes | None:
        """The next unsolicited MAD (a trap), or None after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self._traps.get(), timeout)
        except TimeoutError:
            return None

    def pending_traps(self) -> list[bytes]:
        """Drain every queued unsolicited MAD without waiting."""
        out: list[bytes] = []
        while not self._traps.empty():
            out.append(self._traps.get_nowait())
        return out

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pending.clear()
        for fut in list(self._batches):
            if not fut.done():
                fut.set_exception(TransportError("transport closed while requests were outstanding"))
        await self._close()

    async def __aenter__(self) -> WindowedTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def is_answer(result: bytes | BaseException) -> bool:
    """Whether an entry of :meth:`WindowedTransport.send_many` is a MAD (not an error)."""
    return isinstance(result, bytes)
