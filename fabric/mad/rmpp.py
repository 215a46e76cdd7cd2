"""RMPP (IBA 13.6): segmenting an SA answer into MADs, the sender's window, reassembly. No I/O.

The RMPP header sits at bytes 24-35 of the MAD (``fabric.mad.sa.RMPP_HEADER``)::

    24 RMPPVersion (1)   25 RMPPType (DATA 1, ACK 2, STOP 3, ABORT 4)
    26 RRespTime << 3 | RMPPFlags (ACTIVE 1, FIRST 2, LAST 4)   27 RMPPStatus
    28 Data1: SegmentNumber (from 1; 0 in STOP and ABORT)
    32 Data2: PayloadLength in DATA, NewWindowLast in ACK

Segments are built as the Linux kernel's MAD layer builds them (drivers/infiniband/core
mad.c ``alloc_send_rmpp_list`` and mad_rmpp.c ``send_next_seg``), which is what OpenSM's
answers look like on the wire, since OpenSM hands GetTableResp to the kernel with the
ACTIVE flag and lets it segment:

* every segment repeats the 56-byte header (common header, RMPP header, SA fields) and
  carries 200 data bytes, the last one zero padded; an empty payload is one segment;
* SegmentNumber counts from 1; ACTIVE on all, FIRST on the first, LAST on the last
  (one segment: FIRST | LAST); RMPPVersion 1, RMPPType DATA, RMPPStatus 0;
* PayloadLength counts the RMPP payload of each segment, i.e. the 20 SA header bytes
  (SM_Key, AttributeOffset, ComponentMask) once per segment plus the data: the first
  segment carries ``n * 220 - pad``, the last ``220 - pad``, the middle ones 0, where
  ``pad`` is the zero padding of the last segment. A lone segment carries ``20 + len``
  (20 for an empty table). The receiving kernel takes the length from the last segment:
  ``56 + n * 200 - (220 - PayloadLength)`` bytes of MAD.

Flow control as the kernel does it: the sender starts with a window of one segment and
sends up to the NewWindowLast of each ACK; on a timeout it resends from the segment after
the last acknowledged one; the receiver ACKs the first segment, the end of each window
and the last segment, each ACK moving the window by its size (the kernel's window is
``max(recv queue / 8, 1)``, 64 segments with the default queue), and re-ACKs duplicates.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from enum import IntEnum, IntFlag

from fabric.mad.constants import RESPONSE_BIT
from fabric.mad.errors import MadError

RMPP_VERSION = 1
MAD_SIZE = 256
HEADER_SIZE = 56
"""Bytes repeated in every segment: common MAD header, RMPP header, SA fields."""
SEGMENT_DATA = 200
"""Data bytes per SA segment."""
RMPP_PAYLOAD = 220
"""RMPP payload per segment: everything after the 36-byte common+RMPP header (SA fields + data)."""
CLASS_HEADER = RMPP_PAYLOAD - SEGMENT_DATA
"""SA class header bytes counted in PayloadLength once per segment (20)."""
NO_RESP_TIME = 0x1F
"""RRespTime value meaning "no time given"."""
DEFAULT_WINDOW = 64
"""The kernel receiver's window: max(IB_MAD_QP_RECV_SIZE 512 >> 3, 1)."""
DEFAULT_RETRIES = 3


class RmppType(IntEnum):
    """RMPPType."""

    DATA = 1
    ACK = 2
    STOP = 3
    ABORT = 4


class RmppFlags(IntFlag):
    """RMPPFlags (the low 3 bits of byte 26)."""

    ACTIVE = 1
    FIRST = 2
    LAST = 4


class RmppStatus(IntEnum):
    """RMPPStatus (IBA 13.6.2.1, ib_types.h IB_RMPP_STATUS_*; the kernel's short names are aliases).
    STOP carries RESOURCES_EXHAUSTED; ABORT carries 118-127."""

    SUCCESS = 0
    RESOURCES_EXHAUSTED = 1
    TOTAL_TIME_TOO_LONG = 118
    INCONSISTENT_LAST_AND_PAYLOAD_LENGTH = 119
    INCONSISTENT_FIRST_AND_SEGMENT_NUMBER = 120
    BAD_RMPP_TYPE = 121
    NEW_WINDOW_LAST_TOO_SMALL = 122
    SEGMENT_NUMBER_TOO_BIG = 123
    ILLEGAL_STATUS = 124
    UNSUPPORTED_VERSION = 125
    TOO_MANY_RETRIES = 126
    UNSPECIFIED = 127
    RESX = 1
    T2L = 118
    BAD_LEN = 119
    BAD_SEG = 120
    BADT = 121
    W2S = 122
    S2B = 123
    BAD_STATUS = 124
    UNV = 125
    TMR = 126
    UNSPEC = 127


ABORT_MIN = RmppStatus.TOTAL_TIME_TOO_LONG
ABORT_MAX = RmppStatus.UNSPECIFIED


class RmppError(MadError):
    """A malformed or out-of-protocol RMPP MAD. ``status`` is the RMPPStatus to ABORT the
    transfer with (``abort_mad(mad, err.status)``), None when the MAD is not RMPP at all."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


_RMPP = struct.Struct(">BBBBII")  # at byte 24
_RMPP_OFFSET = 24
_TID = struct.Struct(">Q")


def _rmpp_fields(mad: bytes) -> tuple[int, int, int, int, int, int]:
    """The RMPP header of ``mad``: (version, type, flags, status, Data1, Data2)."""
    ver, typ, rtf, status, d1, d2 = _RMPP.unpack_from(mad, _RMPP_OFFSET)
    return ver, typ, rtf & 0x7, status, d1, d2


def _set_rmpp(buf: bytearray, typ: int, flags: int, status: int, d1: int, d2: int, resp_time: int | None) -> None:
    rt = buf[26] >> 3 if resp_time is None else resp_time
    _RMPP.pack_into(buf, _RMPP_OFFSET, RMPP_VERSION, typ, (rt & 0x1F) << 3 | flags, status, d1, d2)


def _head(head: bytes) -> bytearray:
    if len(head) < HEADER_SIZE:
        raise MadError(f"RMPP: header is {len(head)} bytes, needs {HEADER_SIZE}")
    return bytearray(head[:HEADER_SIZE])


def segment_count(payload_len: int) -> int:
    """Segments the kernel uses for ``payload_len`` data bytes (one for an empty payload)."""
    return max(1, -(-payload_len // SEGMENT_DATA))


def segments(head: bytes, payload: bytes, *, resp_time: int = NO_RESP_TIME) -> list[bytes]:
    """The 256-byte DATA segments carrying ``payload`` after the 56-byte SA ``head``.

    ``head`` gives the common header and SA fields (method, TID, attribute, status,
    AttributeOffset, ...); its RMPP bytes are replaced: version 1, type DATA, status 0,
    RRespTime ``resp_time``, flags, SegmentNumber and PayloadLength as the kernel sets
    them (see the module docstring)."""
    if not 0 <= resp_time <= 0x1F:
        raise MadError(f"RMPP: RRespTime {resp_time} does not fit 5 bits")
    base = _head(head)
    n = segment_count(len(payload))
    pad = n * SEGMENT_DATA - len(payload)
    out: list[bytes] = []
    for i in range(1, n + 1):
        flags = RmppFlags.ACTIVE
        paylen = 0
        if i == 1:
            flags |= RmppFlags.FIRST
            paylen = n * RMPP_PAYLOAD - pad
        if i == n:
            flags |= RmppFlags.LAST
            paylen = RMPP_PAYLOAD - pad
        buf = bytearray(base)
        _set_rmpp(buf, RmppType.DATA, flags, 0, i, paylen, resp_time)
        chunk = payload[(i - 1) * SEGMENT_DATA : i * SEGMENT_DATA]
        buf += chunk
        buf += bytes(MAD_SIZE - len(buf))
        out.append(bytes(buf))
    return out


def _reply_head(mad: bytes, flip: bool) -> bytearray:
    buf = _head(mad)
    if flip:
        buf[3] ^= RESPONSE_BIT
    return buf


def ack_mad(segment_head: bytes, seg_num: int, new_window_last: int) -> bytes:
    """The ACK for a received DATA segment (its first 56 bytes): same header with the R bit
    flipped, type ACK, flags ACTIVE, SegmentNumber ``seg_num``, NewWindowLast
    ``new_window_last``, data zero (the kernel's ``format_ack``)."""
    if not 0 <= seg_num <= 0xFFFFFFFF or not 0 <= new_window_last <= 0xFFFFFFFF:
        raise MadError(f"RMPP ACK: segment {seg_num} / window {new_window_last} do not fit 32 bits")
    buf = _reply_head(segment_head, True)
    _set_rmpp(buf, RmppType.ACK, RmppFlags.ACTIVE, 0, seg_num, new_window_last, None)
    return bytes(buf) + bytes(MAD_SIZE - HEADER_SIZE)


def abort_mad(head: bytes, status: int, *, reply: bool = True, rmpp_type: int = RmppType.ABORT) -> bytes:
    """An ABORT (or STOP with ``rmpp_type=RmppType.STOP``) with RMPPStatus ``status``,
    SegmentNumber and Data2 zero (the kernel's ``nack_recv``).

    ``head`` is the MAD being answered (a DATA segment at the receiver, an ACK at the
    sender), whose R bit is flipped; with ``reply=False`` it is one of our own segments
    and the method is kept."""
    if not 0 <= status <= 0xFF:
        raise MadError(f"RMPP: status {status} does not fit 8 bits")
    buf = _reply_head(head, reply)
    _set_rmpp(buf, rmpp_type, RmppFlags.ACTIVE, status, 0, 0, None)
    return bytes(buf) + bytes(MAD_SIZE - HEADER_SIZE)


def stop_mad(head: bytes, *, reply: bool = True) -> bytes:
    """A STOP (receiver out of resources, RMPPStatus 1) answering ``head``."""
    return abort_mad(head, RmppStatus.RESOURCES_EXHAUSTED, reply=reply, rmpp_type=RmppType.STOP)


def _tid(mad: bytes) -> int:
    return int(_TID.unpack_from(mad, 8)[0])


class RmppSender:
    """One multi-segment answer in flight, as the kernel drives it.

    ``first()`` gives the segments to send at the start (segment 1: the window starts at
    one). ``on_ack`` takes an ACK's SegmentNumber and NewWindowLast and returns the
    segments that became sendable; ``on_timeout`` returns the segments to resend (from the
    one after the last acknowledged, up to the window), or, when the retries are used
    up, an ABORT(TooManyRetries). A protocol violation in an ACK (window below the
    segment, segment beyond the window or the count) returns an ABORT with the kernel's
    status. ``done`` is set by the ACK of the last segment (``error`` None) or by an
    abort/STOP (``error`` the RMPPStatus).
    """

    def __init__(self, segs: Sequence[bytes], *, max_retries: int = DEFAULT_RETRIES) -> None:
        if not segs:
            raise MadError("RMPP sender: no segments")
        self.segs: tuple[bytes, ...] = tuple(bytes(s) for s in segs)
        for i, s in enumerate(self.segs, 1):
            if len(s) != MAD_SIZE:
                raise MadError(f"RMPP sender: segment {i} is {len(s)} bytes, expected {MAD_SIZE}")
        self.tid = _tid(self.segs[0])
        self.max_retries = max_retries
        self.last_ack = 0
        self.window_last = 1
        self.sent = 0
        """Highest segment number sent so far (in this round)."""
        self.retries = 0
        self.timeouts = 0
        self.retransmissions = 0
        self.error: int | None = None
        self._done = False

    @property
    def segment_count(self) -> int:
        """Number of segments in the answer."""
        return len(self.segs)

    @property
    def done(self) -> bool:
        """Whether the transfer is over: last segment acknowledged, or aborted (see ``error``)."""
        return self._done

    def _send_up_to_window(self) -> list[bytes]:
        top = min(self.window_last, len(self.segs))
        start = max(self.sent, self.last_ack)
        out = list(self.segs[start:top])
        self.sent = max(self.sent, top)
        return out

    def _abort(self, status: int) -> list[bytes]:
        self.error = status
        self._done = True
        return [abort_mad(self.segs[0], status, reply=False)]

    def first(self) -> list[bytes]:
        """The segments to send when the answer starts (the first one)."""
        if self.sent or self._done:
            return []
        return self._send_up_to_window()

    def on_ack(self, seg_num: int, new_window_last: int) -> list[bytes]:
        """Process an ACK; returns the segments now allowed (or an ABORT on a bad ACK)."""
        if self._done:
            return []
        if new_window_last < seg_num:
            return self._abort(RmppStatus.NEW_WINDOW_LAST_TOO_SMALL)
        if seg_num > len(self.segs) or seg_num > self.window_last:
            return self._abort(RmppStatus.SEGMENT_NUMBER_TOO_BIG)
        if new_window_last < self.window_last or seg_num < self.last_ack:
            return []  # an old ACK
        if seg_num > self.last_ack:
            self.last_ack = seg_num
            self.retries = 0
        self.window_last = new_window_last
        if self.last_ack == len(self.segs):
            self._done = True
            return []
        return self._send_up_to_window()

    def on_timeout(self) -> list[bytes]:
        """No ACK in time: the segments to resend, or an ABORT once the retries are used up."""
        if self._done:
            return []
        self.timeouts += 1
        self.retries += 1
        if self.retries > self.max_retries:
            return self._abort(RmppStatus.TOO_MANY_RETRIES)
        already = self.sent
        self.sent = self.last_ack
        out = self._send_up_to_window()
        self.retransmissions += sum(1 for i in range(self.last_ack, self.last_ack + len(out)) if i < already)
        return out

    def on_stop_or_abort(self, status: int = RmppStatus.UNSPECIFIED) -> None:
        """The receiver sent STOP or ABORT: the transfer ends with ``error`` = ``status``."""
        self.error = status
        self._done = True

    def on_mad(self, mad: bytes) -> list[bytes]:
        """Process a MAD received for this transfer (ACK, STOP or ABORT); returns what to send.

        RmppError for a MAD of another transaction or one that is not ACK/STOP/ABORT."""
        if len(mad) < HEADER_SIZE:
            raise RmppError(f"RMPP: MAD of {len(mad)} bytes")
        if _tid(mad) != self.tid:
            raise RmppError(f"RMPP: MAD for tid {_tid(mad):#x}, sending tid {self.tid:#x}")
        ver, typ, flags, status, d1, d2 = _rmpp_fields(mad)
        if not flags & RmppFlags.ACTIVE:
            raise RmppError("RMPP: MAD without the ACTIVE flag during a transfer")
        if ver != RMPP_VERSION:
            return self._abort(RmppStatus.UNSUPPORTED_VERSION)
        if typ == RmppType.ACK:
            if status:
                return self._abort(RmppStatus.ILLEGAL_STATUS)
            return self.on_ack(d1, d2)
        if typ == RmppType.STOP:
            self.on_stop_or_abort(status)
            return []
        if typ == RmppType.ABORT:
            self.on_stop_or_abort(status)
            return []
        if typ == RmppType.DATA:
            raise RmppError("RMPP: DATA received by the sender of the transfer")
        return self._abort(RmppStatus.BAD_RMPP_TYPE)


class RmppReceiver:
    """Reassembles one multi-segment answer, ACKing as the kernel does.

    ``feed`` takes each received MAD and returns the MADs to send back: ACK(1) after the
    first segment, ACK at the end of each window and of the last segment (NewWindowLast
    moves ``window`` segments on), a re-ACK for a segment already acknowledged; segments
    out of order or beyond the window are dropped. STOP/ABORT from the sender end the
    transfer (``error``). Anything malformed raises RmppError with the status to ABORT with.
    """

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise MadError(f"RMPP receiver: window {window} must be at least 1")
        self.window = window
        self.tid: int | None = None
        self.seg_num = 0
        """Highest segment received in order."""
        self.last_ack = 0
        self.window_last = 1
        self.error: int | None = None
        self._head: bytes | None = None
        self._first_paylen = 0
        self._last_paylen: int | None = None
        self._chunks: list[bytes] = []
        self._complete = False

    @property
    def complete(self) -> bool:
        """Whether the last segment arrived in order."""
        return self._complete

    @property
    def header(self) -> bytes:
        """The first segment's 56 header bytes (MadError before it arrived)."""
        if self._head is None:
            raise MadError("RMPP receiver: no first segment yet")
        return self._head

    @property
    def payload(self) -> bytes:
        """The reassembled data, trimmed by the last segment's PayloadLength."""
        if not self._complete or self._last_paylen is None:
            raise MadError("RMPP receiver: transfer not complete")
        data = b"".join(self._chunks)
        return data[: len(data) - (RMPP_PAYLOAD - self._last_paylen)]

    def _ack(self, mad: bytes) -> list[bytes]:
        self.last_ack = self.seg_num
        return [ack_mad(mad, self.seg_num, self.window_last)]

    def feed(self, mad: bytes) -> list[bytes]:
        """Process one received MAD; returns the MADs to send back (ACKs)."""
        if len(mad) != MAD_SIZE:
            raise RmppError(f"RMPP: MAD is {len(mad)} bytes, expected {MAD_SIZE}")
        ver, typ, flags, status, seg, paylen = _rmpp_fields(mad)
        if not flags & RmppFlags.ACTIVE:
            raise RmppError("RMPP: MAD without the ACTIVE flag")
        if ver != RMPP_VERSION:
            raise RmppError(f"RMPP: version {ver}, expected {RMPP_VERSION}", RmppStatus.UNSUPPORTED_VERSION)
        tid = _tid(mad)
        if self.tid is not None and tid != self.tid:
            raise RmppError(f"RMPP: MAD for tid {tid:#x}, receiving tid {self.tid:#x}")
        if typ in (RmppType.STOP, RmppType.ABORT):
            self.error = status if status else RmppStatus.UNSPECIFIED
            return []
        if typ != RmppType.DATA:
            raise RmppError(f"RMPP: type {typ} where DATA was expected", RmppStatus.BAD_RMPP_TYPE)
        if status:
            raise RmppError(f"RMPP: DATA with status {status}", RmppStatus.ILLEGAL_STATUS)
        if seg == 0:
            raise RmppError("RMPP: DATA with SegmentNumber 0", RmppStatus.INCONSISTENT_FIRST_AND_SEGMENT_NUMBER)
        first = bool(flags & RmppFlags.FIRST)
        if (seg == 1) != first:
            raise RmppError(
                f"RMPP: segment {seg} with FIRST flag {int(first)}", RmppStatus.INCONSISTENT_FIRST_AND_SEGMENT_NUMBER
            )
        if self.error is not None:
            return []
        if self._head is None:
            if seg != 1:
                return []  # the transfer has not started: drop
            self.tid = tid
            self._head = bytes(mad[:HEADER_SIZE])
            self._first_paylen = paylen
            return self._accept(mad, seg, flags, paylen, start=True)
        if seg <= self.last_ack or self._complete:
            return self._ack(mad)
        if seg > self.window_last or seg != self.seg_num + 1:
            return []  # beyond the window, out of order, or received and not yet ACKed: drop
        return self._accept(mad, seg, flags, paylen, start=False)

    def _accept(self, mad: bytes, seg: int, flags: int, paylen: int, *, start: bool) -> list[bytes]:
        self._chunks.append(bytes(mad[HEADER_SIZE:]))
        self.seg_num = seg
        if flags & RmppFlags.LAST:
            if not CLASS_HEADER <= paylen <= RMPP_PAYLOAD:
                raise RmppError(
                    f"RMPP: last segment {seg} PayloadLength {paylen} outside {CLASS_HEADER}..{RMPP_PAYLOAD}",
                    RmppStatus.INCONSISTENT_LAST_AND_PAYLOAD_LENGTH,
                )
            if self._first_paylen and seg > 1 and self._first_paylen != (seg - 1) * RMPP_PAYLOAD + paylen:
                raise RmppError(
                    f"RMPP: first segment PayloadLength {self._first_paylen} disagrees with {seg} segments and "
                    f"last PayloadLength {paylen} (expected {(seg - 1) * RMPP_PAYLOAD + paylen})",
                    RmppStatus.INCONSISTENT_LAST_AND_PAYLOAD_LENGTH,
                )
            self._last_paylen = paylen
            self._complete = True
            return self._ack(mad)
        if start:
            if self._first_paylen and self._first_paylen <= RMPP_PAYLOAD:
                raise RmppError(
                    f"RMPP: first of several segments has PayloadLength {self._first_paylen}, at most one segment's",
                    RmppStatus.INCONSISTENT_LAST_AND_PAYLOAD_LENGTH,
                )
            self.window_last = 1 + self.window
            return self._ack(mad)
        if seg == self.window_last:
            self.window_last += self.window
            return self._ack(mad)
        return []
