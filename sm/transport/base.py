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
from dataclasses import dataclass

from fabric.errors import IbfmError

Route = tuple[int, ...] | int

_TID = struct.Struct(">Q")
TID_OFFSET = 8
_RESPONSE_BIT = 0x80
_ATTR = struct.Struct(">H")


class _Expired(Exception):
    """A request's timer ran out (internal: turned into a retry or MadTimeout)."""


def _expire(fut: asyncio.Future[bytes]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


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
    """Window, timeout, retries and TID matching over a raw post/deliver pair."""

    def __init__(self, *, window: int = 64, timeout: float = 0.2, retries: int = 3) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = window
        self.timeout = timeout
        self.retries = retries
        self.stats = TransportStats()
        self._slots = asyncio.Semaphore(window)
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._next_tid = 1
        self._traps: asyncio.Queue[bytes] = asyncio.Queue()
        self._closed = False

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
        fut = self._pending.get(tid)
        if fut is None or fut.done():
            self.stats.unmatched += 1
            return
        self.stats.received += 1
        fut.set_result(mad)

    def _unsolicited(self, mad: bytes) -> None:
        self.stats.unsolicited += 1
        self._traps.put_nowait(mad)

    # -- caller side ----------------------------------------------------------

    async def send(
        self, mad: bytes, route: Route, *, timeout: float | None = None, retries: int | None = None
    ) -> bytes:
        """Send a request MAD and return its response; MadTimeout after all retries."""
        if self._closed:
            raise TransportError("transport is closed")
        tmo = self.timeout if timeout is None else timeout
        tries = 1 + (self.retries if retries is None else retries)
        buf = bytearray(mad)
        loop = asyncio.get_running_loop()
        async with self._slots:
            for attempt in range(tries):
                tid = self._alloc_tid()
                _TID.pack_into(buf, TID_OFFSET, tid)
                fut: asyncio.Future[bytes] = loop.create_future()
                self._pending[tid] = fut
                # A timer handle, not asyncio.wait_for: no task per request on the hot path.
                timer = loop.call_later(tmo, _expire, fut)
                try:
                    self.stats.sent += 1
                    if attempt:
                        self.stats.retries += 1
                    self._post(bytes(buf), route)
                    return await fut
                except _Expired:
                    continue
                finally:
                    timer.cancel()
                    self._pending.pop(tid, None)
        self.stats.timeouts += 1
        raise MadTimeout(route, _ATTR.unpack_from(mad, 16)[0], tries)

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
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        await self._close()

    async def __aenter__(self) -> WindowedTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
