"""The transport interface: MAD bytes out along a route, MAD bytes back.

``route`` is either a directed-route path (a tuple of output ports, the
first taken at the SM's own node; the empty tuple addresses the SM's own
node) or a destination LID. The SM cannot tell transports apart.

:class:`WindowedTransport` holds what every transport shares: a window of
outstanding requests, per-request timeout and retries, TID assignment and
matching on the low 32 bits (the kernel owns the high 32), counters.
A subclass only posts bytes (``_post``) and hands what arrives to
``_deliver``: answers complete their requests, traps go to the trap queue,
and any other request goes to the SM's services when one is being served
(:meth:`WindowedTransport.serve`: SMInfo from peer SMs, SA queries from
hosts), which answer through :meth:`WindowedTransport.reply`. A request
nobody takes (a Get of a class nobody here serves, garbage from a hostile
host) goes to ``_refuse``, which answers it with an error status
(:func:`refusal`) where the transport can, and is counted either way.
Nothing that arrives is trusted to be longer than its 24-byte header.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fabric.errors import IbfmError

log = logging.getLogger(__name__)

Route = tuple[int, ...] | int

_TID = struct.Struct(">Q")
TID_OFFSET = 8
_RESPONSE_BIT = 0x80
_ATTR = struct.Struct(">H")

MAD_HEADER_SIZE = 24
MAD_SIZE = 256
_SUBN_CLASSES = (0x01, 0x81)
_METHOD_TRAP = 0x05
_ATTR_NOTICE = b"\x00\x02"
_ANSWER_METHOD = {0x01: 0x81, 0x02: 0x81, 0x06: 0x86, 0x12: 0x92, 0x13: 0x93, 0x14: 0x94, 0x15: 0x95}
"""Request method -> the method of its answer: Get and Set -> GetResp, Send, GetTable, GetTraceTable,
GetMulti, Delete -> their responses (IBA 13.4.5). Other requests (Trap, Report, TrapRepress) get none."""
_DR_D_BIT = 0x8000
STATUS_BUSY = 0x0001
MAX_BACKLOG = 4096
"""Requests waiting for the SM's services (SA, SMInfo) beyond which new ones are answered BUSY."""
STATUS_BAD_VERSION = 0x0004
STATUS_UNSUPPORTED_METHOD_ATTR = 0x000C


def is_trap(mad: bytes) -> bool:
    """A SubnTrap(Notice) SMP, LID-routed or directed: what a switch or CA sends its SM."""
    return (
        len(mad) >= MAD_HEADER_SIZE
        and mad[1] in _SUBN_CLASSES
        and mad[3] == _METHOD_TRAP
        and mad[16:18] == _ATTR_NOTICE
    )


def refusal(mad: bytes, *, class_version: int | None = None, busy: bool = False) -> bytes | None:
    """The answer that refuses request ``mad``, or None when it wants no answer.

    As the kernel's MAD layer (or a device) answers a request no agent takes:
    the request's header with the response method and status "unsupported
    method/attribute", or "bad version" when ``class_version`` is given and
    differs; with ``busy`` the status is BUSY. A directed-route SMP (Get or
    Set, whole) is answered as OpenSM's responder answers one: the whole SMP
    back with GetResp and the D bit, its hop pointer and paths as they came
    (the SMI below takes it back along its return path); a requester on
    ibsim, where a lost MAD never times out, would otherwise wait for ever.
    """
    if len(mad) < MAD_HEADER_SIZE or mad[3] & _RESPONSE_BIT:
        return None
    method = _ANSWER_METHOD.get(mad[3])
    if method is None:
        return None
    bad_version = mad[0] != 1 or (class_version is not None and mad[2] != class_version)
    status = STATUS_BAD_VERSION if bad_version else STATUS_BUSY if busy else STATUS_UNSUPPORTED_METHOD_ATTR
    if mad[1] == 0x81:
        if len(mad) != MAD_SIZE or mad[3] not in (0x01, 0x02):
            return None
        word = _DR_D_BIT | status
        return bytes((mad[0], mad[1], mad[2], method)) + word.to_bytes(2, "big") + mad[6:]
    head = bytes((mad[0], mad[1], mad[2], method)) + status.to_bytes(2, "big") + mad[6:MAD_HEADER_SIZE]
    return head.ljust(MAD_SIZE, b"\0")


@dataclass(frozen=True)
class MadAddress:
    """Where a MAD came from, enough to answer it: the sender's LID, QP, Q_Key, SL and P_Key index.

    ``lid`` is 0xFFFF for a directed-route SMP (answered back along its return path).
    ``via`` is the transport's own handle on the sender (the emulator's client), if it has one.
    """

    lid: int
    qpn: int
    qkey: int
    sl: int = 0
    pkey_index: int = 0
    via: object = field(default=None, compare=False, repr=False)


Responder = Callable[[bytes, MadAddress], bool]
"""A service for requests that arrive (``serve``): called on the event loop with the MAD and its
sender; returns True when it takes the MAD (it answers through ``reply``), False to have it refused."""

InPlace = Callable[[memoryview, int, int, int], int]
"""A service that answers a request over the request itself (``serve(in_place=)``), on the receive
thread of a transport that has one: given the receive buffer, where the MAD starts in it, its length
and the sender's LID, it writes its answer there and returns the answer's length; 0 leaves the buffer
as it was and the MAD to the other services."""


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
    resent: int = 0
    """Requests sent again in a new round after every retry timed out (``sm.transport.smp.send_resending``)."""
    unmatched: int = 0
    unsolicited: int = 0
    served: int = 0
    """Requests of others handed to the SM's services (SMInfo, SA), which answer them."""
    replies: int = 0
    """Answers those services sent back."""
    reply_errors: int = 0
    """Answers written in place (``serve(in_place=)``) that the port refused to send."""
    refused: int = 0
    """Requests of others (not traps) that arrived: answered with an error status, or dropped."""
    busy: int = 0
    """Requests for our services turned away while too many waited for them: answered BUSY where the
    transport can answer (not directed-route SMPs), counted either way."""
    malformed: int = 0
    """MADs that arrived shorter than a MAD header (or otherwise unreadable) and were dropped."""


class _Batch:
    """One ``send_many`` call: its requests, results so far, and where the next request starts."""

    __slots__ = ("dead", "future", "left", "loop", "n", "next", "requests", "results", "tmo", "tries")

    def __init__(
        self,
        requests: Sequence[tuple[bytes, Route]],
        tmo: float,
        tries: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.requests = requests
        self.n = len(requests)
        self.results: list[Any] = [None] * self.n
        self.left = self.n
        self.next = 0
        self.tmo = tmo
        self.tries = tries
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.dead = False
        """Done, cancelled or closed: nothing more is posted for it."""


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class WindowedTransport(ABC):
    """Window, timeout, retries and TID matching over a raw post/deliver pair.

    The window counts every outstanding request, whether sent alone
    (:meth:`send`) or in a batch (:meth:`send_many`); concurrent batches
    take freed slots in turn. The bookkeeping is plain data under one lock:
    ``_pending`` maps TID -> (batch, index, attempt, deadline) for the at most
    ``window`` requests on the wire, and an answer handed to :meth:`_deliver`
    posts the next request at once. A subclass whose replies arrive on a
    thread of its own (``_THREADED``) calls :meth:`_deliver` and
    :meth:`_expire_due` there, so a batch runs without waking the event loop
    per MAD; otherwise one loop timer at the earliest deadline does the expiry.
    """

    _THREADED: ClassVar[bool] = False
    """Replies are delivered on another thread than the event loop's."""
    max_answer_bytes: ClassVar[int | None] = None
    """Longest answer ``reply`` can send (None: no limit of the transport's own)."""
    _PEEKS_ON_ARRIVAL: ClassVar[bool] = False
    """The subclass shows traps to ``trap_peek`` itself where they arrive (its receive thread)."""
    kernel_rmpp: ClassVar[bool] = False
    """An answer longer than a MAD handed to ``reply`` whole is cut into RMPP segments below us (the
    kernel's MAD layer); otherwise the SA runs the RMPP sender itself."""

    def __init__(self, *, window: int = 64, timeout: float = 0.2, retries: int = 3) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.window = window
        self.timeout = timeout
        self.retries = retries
        self.stats = TransportStats()
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[_Batch, int, int, float]] = {}
        """TID -> (batch, request index, attempt, deadline) of every request on the wire."""
        self._ready: deque[_Batch] = deque()
        """Batches with requests not yet posted, served in turn."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._flush_loop: asyncio.AbstractEventLoop | None = None
        """The loop a flush is due on (a loop closed before it ran leaves it stale: another loop flushes anew)."""
        self._next_tid = 1
        self._traps: asyncio.Queue[bytes] = asyncio.Queue()
        self._closed = False
        self._batches: set[_Batch] = set()
        self._responder: Responder | None = None
        self._inline: Responder | None = None
        self._in_place: InPlace | None = None
        self.trap_peek: Callable[[bytes], None] | None = None
        """Sees every trap where it arrives (the receive thread for umad) before it is queued: what must
        react within milliseconds (an SM announcing itself) cannot wait for the event loop."""
        self._backlog = 0
        """Requests handed to the event loop for the services and not yet taken (umad's receive thread)."""
        self._streams: dict[int, Callable[[bytes], None]] = {}
        """TID -> taker of further answers to a request already answered (RMPP segments)."""

    # -- subclass side --------------------------------------------------------

    @abstractmethod
    def _post(self, mad: bytes, route: Route) -> None:
        """Put one MAD on the wire (non-blocking); replies come via ``_deliver``.

        Called with the engine lock held: it must not deliver synchronously.
        """

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:  # noqa: B027 - optional hook
        """Attach to the event loop (``loop``, default the running one) before the first MAD.

        Nothing to do here; a transport with a device or a thread of its own opens it.
        """

    def _post_request(self, mad: bytes, route: Route, tid: int) -> None:
        """Put request ``mad`` on the wire with ``tid`` in its TID field (low 32 bits).

        By default a copy with the TID goes to :meth:`_post`; a transport that
        copies each MAD into a buffer of its own writes the TID there instead.
        """
        self._post(mad[:8] + _TID.pack(tid) + mad[16:], route)

    async def _close(self) -> None:  # noqa: B027 - optional hook
        """Release the device; called once by :meth:`close`."""

    def _deliver(self, mad: bytes) -> None:
        """A MAD arrived: complete the request it answers (and post the next), or queue it as unsolicited.

        Unsolicited MADs go to the trap queue, which belongs to the event loop:
        a threaded subclass hands those to the loop itself.
        """
        if len(mad) < MAD_HEADER_SIZE:
            self.stats.malformed += 1
            return
        if not mad[3] & _RESPONSE_BIT:
            if is_trap(mad):
                self._unsolicited(mad)
            else:
                self._refuse(mad)
            return
        tid = int.from_bytes(mad[12:16], "big")
        with self._lock:
            entry = self._pending.pop(tid, None)
            if entry is None:
                stream = self._streams.get(tid)
                if stream is not None:
                    stream(mad)
                else:
                    self.stats.unmatched += 1
                return
            self.stats.received += 1
            b, i, _, _ = entry
            if self._ready:
                self._fill()
            b.results[i] = mad
            b.left -= 1
            if not b.left:
                self._complete(b)

    def _refuse(self, mad: bytes) -> None:
        """A request that is not a trap and that nobody here serves: counted (a transport that can
        reach its sender answers it with :func:`refusal`)."""
        self.stats.refused += 1

    def _request(self, mad: bytes, src: MadAddress) -> None:
        """A request of another port arrived (on the event loop): to the service, or refused."""
        with self._lock:
            self._backlog -= 1
        responder = self._responder
        taken = False
        if responder is not None and not self._closed:
            try:
                taken = responder(mad, src)
            except Exception:  # a service's bug must not take the transport down: refuse and say so
                log.exception("service failed on a request from LID %#x", src.lid)
                taken = False
        if taken:
            self.stats.served += 1
        else:
            self._refuse_request(mad, src)

    def _refuse_request(self, mad: bytes, src: MadAddress) -> None:
        """Refuse a request whose sender is known (a transport that can answer does)."""
        self._refuse(mad)

    # -- serving --------------------------------------------------------------

    def serve(
        self, responder: Responder | None, *, inline: Responder | None = None, in_place: InPlace | None = None
    ) -> None:
        """Hand requests that arrive (those that are not traps) to ``responder``; None stops it.

        Without a responder every such request is refused, as before. Where requests arrive on a
        thread of the transport's own (umad), ``in_place`` and then ``inline`` are tried first: what
        they take is answered there, without waking the event loop (an answer ``in_place`` wrote goes
        back from the receive buffer, along the request's own path); they must be thread-safe and quick.
        """
        self._responder = responder
        self._inline = inline if responder is not None else None
        self._in_place = in_place if responder is not None else None

    def reply(self, mad: bytes, to: MadAddress) -> None:
        """Send an answer (or an RMPP segment, or a Report's ACK) to ``to`` as is: no TID, window or retry."""
        if self._closed:
            raise TransportError("transport is closed")
        with self._lock:
            self.stats.replies += 1
            self._reply(mad, to)

    def _reply(self, mad: bytes, to: MadAddress) -> None:
        """Put an answer on the wire toward ``to`` (with the engine lock held)."""
        raise TransportError(f"{type(self).__name__} cannot answer requests")

    def _unsolicited(self, mad: bytes) -> None:
        self.stats.unsolicited += 1
        if not self._PEEKS_ON_ARRIVAL:
            self._peek(mad)
        self._traps.put_nowait(mad)

    def _peek(self, mad: bytes) -> None:
        peek = self.trap_peek
        if peek is not None:
            try:
                peek(mad)
            except Exception:  # a bug there must not lose the trap
                log.exception("trap peek failed")

    def _expire_due(self, now: float) -> float | None:
        """Retry or fail every attempt whose deadline is past; returns the next deadline (None: nothing out).

        A threaded subclass calls this from its receive thread; here the loop timer does.
        """
        with self._lock:
            pending = self._pending
            for tid in [t for t, e in pending.items() if e[3] <= now]:
                b, i, k, _ = pending.pop(tid)
                if k + 1 < b.tries:
                    self.stats.retries += 1
                    self._launch(b, i, k + 1)
                else:
                    self.stats.timeouts += 1
                    mad, route = b.requests[i]
                    self._finish(b, i, MadTimeout(route, _ATTR.unpack_from(mad, 16)[0], b.tries))
            if self._ready:
                self._fill()
            return min((e[3] for e in pending.values()), default=None)

    # -- the engine (called with the lock held) ------------------------------------

    def _fill(self) -> None:
        """Post requests of the waiting batches, in turn, while the window has room."""
        pending, ready, window = self._pending, self._ready, self.window
        while ready and len(pending) < window:
            b = ready[0]
            i = b.next
            b.next = i + 1
            if b.next >= b.n:
                ready.popleft()
            elif len(ready) > 1:
                ready.rotate(-1)
            self._launch(b, i, 0)

    def _launch(self, b: _Batch, i: int, attempt: int) -> None:
        """Post attempt ``attempt`` of request ``i`` of ``b`` under a fresh TID."""
        mad, route = b.requests[i]
        tid = self._next_tid
        self._next_tid = tid + 1 if tid < 0xFFFFFFFF else 1
        deadline = time.monotonic() + b.tmo
        self._pending[tid] = (b, i, attempt, deadline)
        if not self._THREADED:
            timer = self._timer
            # (A timer of another loop, one that has closed, say, would never fire for this batch.)
            if timer is None or deadline < timer.when() or self._timer_loop is not b.loop:
                if timer is not None:
                    timer.cancel()
                self._timer = b.loop.call_at(deadline, self._on_timer)
                self._timer_loop = b.loop
        self.stats.sent += 1
        try:
            if len(mad) >= 24:
                self._post_request(mad, route, tid)
            else:
                self._post(mad, route)
        except Exception as e:  # reported in the request's result, named
            self._pending.pop(tid, None)
            err = e if isinstance(e, IbfmError) else TransportError(f"{describe_route(route)}: cannot send: {e}")
            self._finish(b, i, err)

    def _finish(self, b: _Batch, i: int, value: Any) -> None:
        b.results[i] = value
        b.left -= 1
        if not b.left:
            self._complete(b)

    def _complete(self, b: _Batch) -> None:
        if b.dead:
            return
        b.dead = True
        if self._THREADED:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                b.loop.call_soon_threadsafe(_resolve, b.future)
        else:
            _resolve(b.future)

    def _drop(self, b: _Batch) -> None:
        """Forget a cancelled batch: its waiting requests and those on the wire (their slots free)."""
        b.dead = True
        with contextlib.suppress(ValueError):
            self._ready.remove(b)
        for tid in [t for t, e in self._pending.items() if e[0] is b]:
            del self._pending[tid]
        if self._ready:
            self._fill()

    def _flush(self) -> None:
        with self._lock:
            self._flush_loop = None
            if self._ready:
                self._fill()

    def _on_timer(self) -> None:
        self._timer = None
        when = self._expire_due(time.monotonic())
        if when is not None and self._timer is None and not self._closed:
            loop = self._timer_loop = asyncio.get_running_loop()
            self._timer = loop.call_at(when, self._on_timer)

    # -- caller side ----------------------------------------------------------

    def post(self, mad: bytes, route: Route) -> None:
        """Send a MAD that gets no answer (a TrapRepress), as is: no TID, window or retry."""
        if self._closed:
            raise TransportError("transport is closed")
        with self._lock:
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
        if not requests:
            return []
        tmo = self.timeout if timeout is None else timeout
        tries = 1 + (self.retries if retries is None else retries)
        b = _Batch(requests, tmo, tries, asyncio.get_running_loop())
        self._batches.add(b)
        try:
            with self._lock:
                self._ready.append(b)
                if not self._THREADED:
                    self._fill()
                elif self._flush_loop is not b.loop:
                    # Batches handed in during this turn of the loop (a gather of sends) are
                    # posted together at its end: the window fills before answers free slots.
                    self._flush_loop = b.loop
                    b.loop.call_soon(self._flush)
            await b.future
        except asyncio.CancelledError:
            with self._lock:
                self._drop(b)
            raise
        finally:
            self._batches.discard(b)
        results = b.results
        if raise_first:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    async def next_trap(self, timeout: float | None = None) -> bytes | None:
        """The next unsolicited MAD (a trap), or None after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self._traps.get(), timeout)
        except TimeoutError:
            return None

    def follow(self, tid: int, taker: Callable[[bytes], None] | None) -> None:
        """Hand further answers with (low 32 bits) ``tid`` to ``taker`` (None: stop): the segments of an
        RMPP answer after the first, which completed the request. ``taker`` runs where answers are
        delivered (with the engine lock held): it must only queue what it gets."""
        with self._lock:
            if taker is None:
                self._streams.pop(tid & 0xFFFFFFFF, None)
            else:
                self._streams[tid & 0xFFFFFFFF] = taker

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
        with self._lock:
            for b in self._batches:
                b.dead = True
            self._pending.clear()
            self._ready.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for b in list(self._batches):
            if not b.future.done() and not b.loop.is_closed():
                b.future.set_exception(TransportError("transport closed while requests were outstanding"))
        await self._close()

    async def __aenter__(self) -> WindowedTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def is_answer(result: bytes | BaseException) -> bool:
    """Whether an entry of :meth:`WindowedTransport.send_many` is a MAD (not an error)."""
    return isinstance(result, bytes)
