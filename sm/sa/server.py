"""The SA server: requests in, checked, answered from the snapshot by the family of their attribute.

A request's life (IBA 15.4, and OpenSM's ``osm_sa.c``/``osm_sa_respond``):

- It arrives on the event loop (the transport's service hook). Anything that
  is not an SA request we can read (short, wrong version) gets a status or
  is dropped and counted; the service never raises.
- Its attribute picks a family (:class:`Family`); the method must be one the
  family takes (else status 0x000C). Before the first snapshot, or while
  we are not the master SM, the answer is BUSY (hosts retry) instead of
  silence.
- The family returns the matching records as packed rows (numpy ``uint8[k,
  size]``); a Get wants exactly one (none: ERR_NO_RECORDS, more:
  ERR_TOO_MANY_RECORDS), a GetTable takes all (none is an empty table). A
  family that refuses raises :class:`SaError` with an SA status.
- The answer copies the request's header (TID, attribute, component mask),
  sets the response method (a Set is answered by GetResp), SM_Key 0,
  AttributeOffset the record size in 8-byte words (0 with no records). A
  GetTableResp is RMPP: the kernel segments it where the transport has
  kernel RMPP (umad); elsewhere :class:`~fabric.mad.rmpp.RmppSender` sends
  the segments and follows the requester's ACKs, with timeouts and resends.

The families are pure functions of (snapshot, store, request): the sweep
never waits for the SA, and the SA never sees a snapshot being built (it
reads the one the manager last published, replaced whole).
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from fabric.mad import MadError
from fabric.mad.constants import BASE_VERSION
from fabric.mad.rmpp import RmppFlags, RmppSender, RmppType, segments
from fabric.mad.sa import (
    SA_CLASS,
    SA_CLASS_VERSION,
    SA_DATA_OFFSET,
    SaMad,
    SaMethod,
    SaStatus,
    parse_sa,
)
from sm.transport.base import MadAddress, WindowedTransport

log = logging.getLogger(__name__)

Rows = npt.NDArray[np.uint8]
"""Packed records, one per row (``uint8[k, record size]``)."""

_RESPONSE: dict[int, int] = {
    SaMethod.GET: SaMethod.GET_RESP,
    SaMethod.SET: SaMethod.GET_RESP,
    SaMethod.GET_TABLE: SaMethod.GET_TABLE_RESP,
    SaMethod.DELETE: SaMethod.DELETE_RESP,
    SaMethod.GET_MULTI: SaMethod.GET_MULTI_RESP,
}
_RMPP_CONTROL = (int(RmppType.ACK), int(RmppType.STOP), int(RmppType.ABORT))
_INLINE_METHODS = (int(SaMethod.GET), int(SaMethod.GET_TABLE))
_GET_HEAD = int.from_bytes(bytes((BASE_VERSION, SA_CLASS, SA_CLASS_VERSION, int(SaMethod.GET))), "big")
"""The first four bytes of a Get of ours to answer: base version, class, class version, method."""
_QUICK_HEAD = struct.Struct(">I12xH6xI")
"""Of a MAD: its first four bytes, its attribute ID and its RMPP header's first word (offset 24)."""
_RMPP_HEAD = 0xFFFFFF00
"""RMPP version, type and flags: zero in a plain request."""
_GET_RESP_STATUS_OK = bytes((int(SaMethod.GET_RESP), 0, 0))
"""A GetResp's method and status words, as a Get's answer starts at byte 3."""
_ANSWER_ZEROS = bytes(20)
"""RMPP header and SM_Key of an answer (bytes 24 to 44)."""
RMPP_TIMEOUT_S = 0.2
"""Time an RMPP sender waits for an ACK before sending again from the last one acknowledged."""
RMPP_RETRIES = 5
MAX_TABLE_RECORDS = 65535
"""Largest GetTable answer (records): beyond, ERR_NO_RESOURCES."""


class SaError(Exception):
    """A request a family refuses, with the SA status that says why."""

    def __init__(self, status: int, why: str = "") -> None:
        super().__init__(why or f"SA status {status:#06x}")
        self.status = status


@dataclass(frozen=True)
class SaRequest:
    """One request as a family sees it."""

    mad: SaMad
    src: MadAddress
    trusted: bool
    """It carried the SA's SM_Key (what PKeyTableRecord and other privileged answers need)."""

    @property
    def mask(self) -> int:
        return self.mad.component_mask


GetOne = Callable[[memoryview, int, int], bool]
"""A family's fast path for a Get, made for one snapshot by its optional ``quick(tables)``: (a buffer,
where the MAD starts in it, the asker's LID) -> whether it wrote the one record the Get selects over
the MAD's data (offset 56); False (nothing written) leaves the request to ``query``."""


class Family(Protocol):
    """One record family (one attribute): what it answers and how."""

    attr: ClassVar[int]
    size: ClassVar[int]
    """Record size in bytes."""
    methods: ClassVar[frozenset[int]]

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        """The records a Get or GetTable selects (a Set or Delete: the records it made or removed)."""
        ...


@dataclass
class SaContext:
    """What a family reads: the snapshot (may be None before the first), the SA's store, the time."""

    snapshot: Any
    store: Any
    now: float
    cache: dict[str, Any]
    """Per-snapshot arrays the families build once (cleared when the snapshot changes)."""
    sm: Any = None
    """The SM's own state (election) for SMInfoRecord; None outside a daemon."""


@dataclass
class SaStats:
    received: int = 0
    answered: int = 0
    records: int = 0
    """Records sent in answers."""
    status: Counter[int] = field(default_factory=Counter)
    """Answers by MAD status."""
    busy: int = 0
    dropped: int = 0
    """Requests not answered at all (unreadable, responses that belong to nobody, send failures)."""
    rmpp_segments: int = 0
    rmpp_resent: int = 0
    rmpp_aborted: int = 0
    by_attr: Counter[int] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "answered": self.answered,
            "records": self.records,
            "busy": self.busy,
            "dropped": self.dropped,
            "rmpp_segments": self.rmpp_segments,
            "rmpp_resent": self.rmpp_resent,
            "rmpp_aborted": self.rmpp_aborted,
            "status": {f"{k:#06x}": v for k, v in sorted(self.status.items())},
        }


@dataclass
class _Outgoing:
    """One multi-segment answer being sent with RMPP by us."""

    sender: RmppSender
    to: MadAddress
    tries: int = 0
    timer: asyncio.TimerHandle | None = None


class SaServer:
    """Answers SA requests that reach the SM's port, from the current snapshot.

    ``snapshot()`` returns the snapshot to answer from (None before the
    first); ``ready()`` says whether we may answer at all (we are the master
    SM). ``families`` are the record families, by attribute.
    """

    def __init__(
        self,
        transport: WindowedTransport,
        families: Iterable[Family],
        snapshot: Callable[[], Any],
        *,
        store: Any = None,
        sm_key: int = 0,
        ready: Callable[[], bool] = lambda: True,
        sm: Any = None,
    ) -> None:
        self.transport = transport
        self.families: dict[int, Family] = {}
        for f in families:
            if f.attr in self.families:
                raise ValueError(f"two SA families for attribute {f.attr:#06x}")
            self.families[f.attr] = f
        self._snapshot = snapshot
        self._ready = ready
        self.store = store
        self.sm_key = sm_key
        self.sm = sm
        self._stats = SaStats()
        self._placed = 0
        """Answers :meth:`answer_in_place` wrote (only the receive thread adds): folded into the stats when
        they are read, as one increment per answer costs more than the rest of its bookkeeping."""
        self._folded = 0
        self._placed_attr = 0
        self._fold_lock = threading.Lock()
        self._cached: tuple[Any, dict[str, Any]] = (None, {})
        """(snapshot, the tables the families built for it)."""
        self._out: dict[tuple[int, int, int], _Outgoing] = {}
        self.kernel_rmpp = bool(getattr(transport, "kernel_rmpp", False))
        self._inline: dict[int, tuple[Callable[[dict[str, Any]], bool], Any, bytes, int]] = {}
        """Attribute -> (warm, quick, AttributeOffset bytes, a one-record answer's length) of the families
        answered off the event loop."""
        for attr, f in self.families.items():
            warm = getattr(f, "warm", None)
            if getattr(f, "reads_only", False) and warm is not None:
                words = ((f.size + 7) // 8).to_bytes(2, "big")
                self._inline[attr] = (warm, getattr(f, "quick", None), words, SA_DATA_OFFSET + f.size)
        self._quick: tuple[Any, GetOne, int, bytes, int] | None = None
        """(snapshot, its Get fast path, attribute, an answer's bytes 24 to 46: RMPP header and SM_Key
        zeroed, AttributeOffset; the answer's length) of the family with one (PathRecord), once its
        tables for the current snapshot are built."""

    @property
    def stats(self) -> SaStats:
        """The counters, with the answers written in place so far."""
        if self._placed != self._folded:
            self._fold()
        return self._stats

    def _fold(self) -> None:
        with self._fold_lock:
            d = self._placed - self._folded
            if d:
                self._folded += d
                st = self._stats
                st.received += d
                st.answered += d
                st.records += d
                st.status[0] += d
                st.by_attr[self._placed_attr] += d

    # -- entry ----------------------------------------------------------------------

    def answer_in_place(self, buf: memoryview, at: int, n: int, lid: int) -> int:
        """The transport's fastest path (``serve(in_place=)``, its receive thread): a Get its family
        answers with its ``quick`` function (a PathRecord between two named ports), the ``n``-byte
        MAD at ``at`` in ``buf`` from LID ``lid`` turned into its answer where it lies: the request's
        header with the response's fields, and the record. Returns the answer's length; 0 (``buf``
        untouched) for anything else, which goes to :meth:`take_inline`. Counted as :meth:`_answer`
        and :meth:`_send` count an answer, once the stats are read.
        """
        q = self._quick
        if q is None:
            return 0
        snap, get1, attr, tail, length = q
        if n < length:
            return 0
        head, attr_id, rmpp = _QUICK_HEAD.unpack_from(buf, at)
        if head != _GET_HEAD or attr_id != attr or rmpp & _RMPP_HEAD or snap is not self._snapshot():
            return 0
        if not self._ready() or not get1(buf, at, lid):
            return 0
        buf[at + 3 : at + 6] = _GET_RESP_STATUS_OK
        buf[at + 24 : at + 46] = tail
        self._placed += 1
        return length

    def take_inline(self, raw: bytes, src: MadAddress) -> bool:
        """The transport's fast path (its receive thread): a Get or GetTable of a family that reads only
        the snapshot, answered right there with no hop to the event loop; False for anything else
        (Sets, Deletes, the stateful families, RMPP we run ourselves), which goes the usual way.

        Once the tables of the current snapshot are built, a family's ``quick`` function (a Get
        between two named ports) is kept for :meth:`answer_in_place`.
        """
        if (
            not self.kernel_rmpp
            or len(raw) < SA_DATA_OFFSET
            or raw[1] != SA_CLASS
            or raw[3] not in _INLINE_METHODS
            or raw[24:27] != b"\0\0\0"  # no RMPP header: a plain request
        ):
            return False
        attr = int.from_bytes(raw[16:18], "big")
        inline = self._inline.get(attr)
        if inline is None:
            return False
        warm, quick, offset, length = inline
        # A table not built yet for this snapshot is built on the event loop (a second of numpy on a
        # large fabric must not hold up the answers to the sweep's SMPs on this thread).
        snap, cache = self._cached
        if snap is None or snap is not self._snapshot() or not warm(cache):
            return False
        q = self._quick
        if quick is not None and (q is None or q[0] is not snap):
            get1 = quick(cache)
            if get1 is not None:  # from the next request on, answer_in_place answers its Gets
                if attr != self._placed_attr:  # (one family has a quick path: PathRecord)
                    self._fold()
                    self._placed_attr = attr
                self._quick = (snap, get1, attr, _ANSWER_ZEROS + offset, length)
        return self.take(raw, src, snap=snap)

    def take(self, raw: bytes, src: MadAddress, *, snap: Any = None) -> bool:
        """The transport's service hook for class 0x03: always takes the MAD (answers or counts it).

        ``snap``: the snapshot to answer from (the inline path's, checked warm); default the current one.
        """
        st = self.stats
        st.received += 1
        if len(raw) < SA_DATA_OFFSET or raw[1] != SA_CLASS:
            st.dropped += 1
            return True
        if raw[24] == 1 and raw[26] & 1 and raw[25] in _RMPP_CONTROL:
            # The requester's RMPP ACK / STOP / ABORT of an answer of ours (its method is the request's:
            # the receiver flips the response bit of the segment it acknowledges).
            self._rmpp_control(raw, src)
            return True
        if raw[3] & 0x80:  # an answer to nothing we asked
            st.dropped += 1
            return True
        try:
            mad = parse_sa(raw)
        except MadError:
            st.dropped += 1
            return True
        if mad.class_version != SA_CLASS_VERSION:  # (parse_sa refused another base version)
            self._error(mad, src, SaStatus.BAD_VERSION)
            return True
        st.by_attr[mad.attr_id] += 1
        family = self.families.get(mad.attr_id)
        if mad.method not in _RESPONSE:
            self._error(mad, src, SaStatus.METHOD_UNSUPPORTED)
            return True
        if family is None or mad.method not in family.methods:
            self._error(mad, src, SaStatus.METHOD_ATTR_UNSUPPORTED)
            return True
        if snap is None:
            snap = self._snapshot()
        if snap is None or not self._ready():
            st.busy += 1
            self._error(mad, src, SaStatus.BUSY)
            return True
        # The snapshot and its tables as one pair, swapped in one assignment: the receive thread and
        # the event loop may both be here, and neither may fill one snapshot's tables into another's.
        cached = self._cached
        if cached[0] is not snap:
            cached = self._cached = (snap, {})
        ctx = SaContext(snap, self.store, time.monotonic(), cached[1], self.sm)
        req = SaRequest(mad, src, trusted=self.sm_key != 0 and mad.sm_key == self.sm_key)
        try:
            rows = family.query(ctx, req)
        except SaError as e:
            log.debug("SA %s %#06x from LID %#x: %s", mad.method, mad.attr_id, src.lid, e)
            self._error(mad, src, e.status)
            return True
        except Exception:  # a family's bug: a status for the host, the traceback for us
            log.exception("SA family %#06x failed on a request from LID %#x", mad.attr_id, src.lid)
            self._error(mad, src, SaStatus.ERR_NO_RESOURCES)
            return True
        self._answer(mad, src, family, rows)
        return True

    # -- answers --------------------------------------------------------------------

    def _answer(self, mad: SaMad, src: MadAddress, family: Family, rows: Rows) -> None:
        n = int(rows.shape[0])
        if mad.method in (SaMethod.GET, SaMethod.SET, SaMethod.DELETE):
            if n == 0:
                self._error(mad, src, SaStatus.ERR_NO_RECORDS)
                return
            if n > 1 and mad.method == SaMethod.GET:
                self._error(mad, src, SaStatus.ERR_TOO_MANY_RECORDS)
                return
            rows = rows[:1]
            n = 1
        elif n > MAX_TABLE_RECORDS:
            self._error(mad, src, SaStatus.ERR_NO_RESOURCES)
            return
        method = _RESPONSE[mad.method]  # IntEnum keys: an int finds them
        offset = (family.size + 7) // 8 if n else 0
        stride = offset * 8
        if stride != family.size and n:
            body = np.zeros((n, stride), np.uint8)
            body[:, : family.size] = rows
            payload = body.tobytes()
        else:
            payload = rows.tobytes()
        head = bytearray(mad.raw[:SA_DATA_OFFSET])
        head[3] = method
        head[4:6] = b"\0\0"
        head[36:44] = bytes(8)  # SM_Key: always 0 in answers (C15-0.1.5)
        whole = getattr(family, "is_attribute", False)
        if whole:
            offset = 0  # an attribute, not a record table (ClassPortInfo, as OpenSM answers it)
        head[44:46] = offset.to_bytes(2, "big")
        st = self.stats
        st.records += n
        if method != SaMethod.GET_TABLE_RESP:
            head[24:36] = bytes(12)
            # One MAD, as long as its record (OpenSM hands the MAD layer header + records; a
            # ClassPortInfo goes whole). A GetResp to a Get has no RMPP.
            one = bytes(head) + payload[: 256 - SA_DATA_OFFSET]
            self._send(one.ljust(256, b"\0") if whole else one, src, 0)
            return
        limit = getattr(self.transport, "max_answer_bytes", None)
        if limit is not None and SA_DATA_OFFSET + len(payload) > limit:
            st.records -= n
            self._error(mad, src, SaStatus.ERR_NO_RESOURCES)  # too big for one RMPP transfer
            return
        if self.kernel_rmpp:
            # Header + every record in one buffer, RMPP flags ACTIVE (version and type 0, as OpenSM
            # hands saquery's zeros back): the kernel's RMPP cuts it; libumad2sim sends its first MAD.
            head[24:36] = bytes(12)  # what a host's request had there is no business of the answer's
            head[26] = int(RmppFlags.ACTIVE)
            self._send(bytes(head) + payload, src, 0)
            return
        segs = segments(bytes(head), payload)
        if len(segs) == 1:
            self._send(segs[0], src, 0)
            return
        key = (src.lid, id(src.via), mad.tid)
        old = self._out.pop(key, None)
        if old is not None and old.timer is not None:
            old.timer.cancel()
        out = _Outgoing(RmppSender(segs), src)
        self._out[key] = out
        for s in out.sender.first():
            self._send(s, src, 0, segment=True)
        self._arm(key, out)

    def _error(self, mad: SaMad, src: MadAddress, status: int) -> None:
        method = _RESPONSE.get(mad.method, 0x81)
        head = bytearray(mad.raw[:SA_DATA_OFFSET])
        head[3] = method
        head[4:6] = int(status).to_bytes(2, "big")
        head[24:36] = bytes(12)
        head[36:44] = bytes(8)
        head[44:46] = b"\0\0"
        self._send(bytes(head).ljust(256, b"\0"), src, status)  # a status answer is a whole MAD

    def _send(self, mad: bytes, to: MadAddress, status: int, *, segment: bool = False) -> None:
        st = self.stats
        try:
            self.transport.reply(mad, to)
        except Exception as e:  # the host is gone, the transport closed: counted, never raised
            st.dropped += 1
            log.debug("SA answer to LID %#x not sent: %s", to.lid, e)
            return
        if segment:
            st.rmpp_segments += 1
            return
        st.answered += 1
        st.status[status] += 1

    # -- RMPP (where the transport does not segment) ------------------------------------

    def _arm(self, key: tuple[int, int, int], out: _Outgoing) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if out.timer is not None:
            out.timer.cancel()
        out.timer = loop.call_later(RMPP_TIMEOUT_S, self._rmpp_timeout, key)

    def _rmpp_timeout(self, key: tuple[int, int, int]) -> None:
        out = self._out.get(key)
        if out is None:
            return
        out.tries += 1
        if out.tries > RMPP_RETRIES:
            del self._out[key]
            self.stats.rmpp_aborted += 1
            return
        segs = out.sender.on_timeout()
        self.stats.rmpp_resent += len(segs)
        for s in segs:
            self._send(s, out.to, 0, segment=True)
        self._arm(key, out)

    def _rmpp_control(self, raw: bytes, src: MadAddress) -> None:
        tid = int.from_bytes(raw[8:16], "big")
        key = (src.lid, id(src.via), tid)
        out = self._out.get(key)
        if out is None:
            self.stats.dropped += 1
            return
        kind = raw[25]
        if kind == RmppType.ACK:
            seg = int.from_bytes(raw[28:32], "big")
            nwl = int.from_bytes(raw[32:36], "big")
            out.tries = 0
            for s in out.sender.on_ack(seg, nwl):
                self._send(s, out.to, 0, segment=True)
            if out.sender.done:
                if out.timer is not None:
                    out.timer.cancel()
                del self._out[key]
                if getattr(out.sender, "error", None) is not None:
                    self.stats.rmpp_aborted += 1  # a bad ACK made our sender abort
                else:
                    self.stats.answered += 1
                    self.stats.status[0] += 1
            else:
                self._arm(key, out)
        else:  # STOP or ABORT: the requester gave up
            if out.timer is not None:
                out.timer.cancel()
            del self._out[key]
            self.stats.rmpp_aborted += 1

    def close(self) -> None:
        for out in self._out.values():
            if out.timer is not None:
                out.timer.cancel()
        self._out.clear()


__all__ = [
    "Family",
    "Rows",
    "SaContext",
    "SaError",
    "SaRequest",
    "SaServer",
    "SaStats",
]
