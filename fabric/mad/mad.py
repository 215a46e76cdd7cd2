"""MAD headers: builders for SMPs (directed route and LID routed), PerfMgt MADs and traps,
a parser, and the responder side of the directed-route rules (IBA 14.2.2).

Byte map of the 256-byte MADs spoken here::

    0  BaseVersion   1 MgmtClass   2 ClassVersion   3 R|Method
    4  Status (DR: D bit 0x8000 + 15-bit status)    6 ClassSpecific (DR: HopPointer, HopCount)
    8  TransactionID (8)            16 AttributeID   18 reserved   20 AttributeModifier
    24 M_Key (8)  (SMPs)            32 DrSLID  34 DrDLID (DR SMPs)
    64 SMP data (64) | PerfMgt data (192)
    128 InitialPath (64)  192 ReturnPath (64)  (DR SMPs)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from fabric.mad.constants import (
    BASE_VERSION,
    DR_D_BIT,
    MAX_DR_HOPS,
    PERF_CLASS_VERSION,
    PERMISSIVE_LID,
    RESPONSE_BIT,
    SMP_CLASS_VERSION,
    MadStatus,
    Method,
    MgmtClass,
    SmpAttr,
)
from fabric.mad.errors import MadError
from fabric.mad.fields import Field, FieldValue, Layout

MAD_SIZE = 256
MAD_HEADER_SIZE = 24
DATA_OFFSET = 64
"""Attribute data starts at byte 64 in SMPs and in PerfMgt MADs."""
SMP_DATA_SIZE = 64
PERF_DATA_SIZE = 192
INITIAL_PATH_OFFSET = 128
RETURN_PATH_OFFSET = 192

KNOWN_CLASSES = frozenset(int(c) for c in MgmtClass)

MAD_HEADER = Layout(
    "MadHeader",
    MAD_HEADER_SIZE,
    [
        Field("BaseVersion", 0, 8),
        Field("MgmtClass", 8, 8, fmt="hex"),
        Field("ClassVersion", 16, 8),
        Field("R", 24, 1),
        Field("Method", 25, 7, fmt="hex"),
        Field("Status", 32, 16, fmt="hex"),
        Field("ClassSpecific", 48, 16, fmt="hex"),
        Field("TransactionID", 64, 64),
        Field("AttributeID", 128, 16, fmt="hex"),
        Field("AttributeModifier", 160, 32, fmt="hex"),
    ],
)
"""The common MAD header (IBA 13.4.3), for dumps; ``parse_mad`` reads the same bytes with struct."""

SMP_DR_HEADER = Layout(
    "DrSmpHeader",
    DATA_OFFSET,
    [
        Field("BaseVersion", 0, 8),
        Field("MgmtClass", 8, 8, fmt="hex"),
        Field("ClassVersion", 16, 8),
        Field("R", 24, 1),
        Field("Method", 25, 7, fmt="hex"),
        Field("D", 32, 1),
        Field("Status", 33, 15, fmt="hex"),
        Field("HopPointer", 48, 8),
        Field("HopCount", 56, 8),
        Field("TransactionID", 64, 64),
        Field("AttributeID", 128, 16, fmt="hex"),
        Field("AttributeModifier", 160, 32, fmt="hex"),
        Field("M_Key", 192, 64),
        Field("DrSLID", 256, 16),
        Field("DrDLID", 272, 16),
    ],
)
"""The directed-route SMP header up to the data (IBA 14.2.1.2)."""

_HDR = struct.Struct(">BBBBHHQHHI")  # 24-byte common header
_HDR_SMP = struct.Struct(">BBBBHHQHHIQ")  # + M_Key
_HDR_DR = struct.Struct(">BBBBHHQHHIQHH")  # + M_Key, DrSLID, DrDLID
_U16 = struct.Struct(">H")


class Mad:
    """A parsed MAD header with its attribute data; ``raw`` keeps the 256 bytes.

    ``status`` is the 15-bit status for DR SMPs (``d_bit`` holds the direction) and the
    full 16-bit status otherwise. ``initial_path``/``return_path`` hold slots 1..hop_cnt.
    """

    __slots__ = (
        "attr_id",
        "attr_mod",
        "base_version",
        "class_version",
        "d_bit",
        "data",
        "dr_dlid",
        "dr_slid",
        "hop_cnt",
        "hop_ptr",
        "initial_path",
        "is_response",
        "method",
        "mgmt_class",
        "mkey",
        "raw",
        "return_path",
        "status",
        "tid",
    )

    base_version: int
    mgmt_class: int
    class_version: int
    method: int
    is_response: bool
    status: int
    d_bit: bool
    hop_ptr: int
    hop_cnt: int
    tid: int
    attr_id: int
    attr_mod: int
    mkey: int
    dr_slid: int
    dr_dlid: int
    initial_path: tuple[int, ...]
    return_path: tuple[int, ...]
    data: bytes
    raw: bytes

    @property
    def is_dr(self) -> bool:
        """Whether this is a directed-route SMP."""
        return self.mgmt_class == MgmtClass.SUBN_DR

    def attribute(self) -> dict[str, FieldValue]:
        """The attribute data decoded with the registered layout (MadError if none)."""
        from fabric.mad.attributes import layout_for  # here to keep the module graph one-way

        return layout_for(self.mgmt_class, self.attr_id).unpack(self.data)

    def __repr__(self) -> str:
        dr = ""
        if self.mgmt_class == MgmtClass.SUBN_DR:
            dr = (
                f" d={int(self.d_bit)} hop {self.hop_ptr}/{self.hop_cnt}"
                f" path={list(self.initial_path)} ret={list(self.return_path)}"
            )
        return (
            f"Mad(class={self.mgmt_class:#04x} method={self.method:#04x} status={self.status:#06x}"
            f" tid={self.tid:#x} attr={self.attr_id:#06x} mod={self.attr_mod:#x}{dr})"
        )


def parse_mad(buf: bytes | bytearray | memoryview) -> Mad:
    """Parse a 256-byte MAD of class SubnLID (0x01), SubnDR (0x81) or PerfMgt (0x04).

    MadError names what is wrong: size, BaseVersion, management class, hop count > 63
    or a hop pointer beyond hop count + 1. ClassVersion is not checked here, so a
    responder can answer a wrong one with status BAD_VERSION.
    """
    raw = bytes(buf)
    if len(raw) != MAD_SIZE:
        raise MadError(f"MAD is {len(raw)} bytes, expected {MAD_SIZE}")
    if raw[0] != BASE_VERSION:
        raise MadError(f"MAD BaseVersion {raw[0]}, expected {BASE_VERSION}")
    cls = raw[1]
    if cls not in KNOWN_CLASSES:
        raise MadError(f"MAD class {cls:#04x} not supported (SubnLID 0x01, SubnDR 0x81, PerfMgt 0x04)")
    m = Mad()
    m.raw = raw
    m.base_version = raw[0]
    m.mgmt_class = cls
    if cls == MgmtClass.SUBN_DR:
        (_, _, cv, method, status, cs, tid, attr_id, _, attr_mod, mkey, slid, dlid) = _HDR_DR.unpack_from(raw)
        hop_ptr = cs >> 8
        hop_cnt = cs & 0xFF
        if hop_cnt > MAX_DR_HOPS:
            raise MadError(f"DR SMP tid {tid:#x}: hop count {hop_cnt} exceeds {MAX_DR_HOPS}")
        if hop_ptr > hop_cnt + 1:
            raise MadError(f"DR SMP tid {tid:#x}: hop pointer {hop_ptr} beyond hop count {hop_cnt} + 1")
        m.d_bit = bool(status & DR_D_BIT)
        m.status = status & 0x7FFF
        m.hop_ptr = hop_ptr
        m.hop_cnt = hop_cnt
        m.mkey = mkey
        m.dr_slid = slid
        m.dr_dlid = dlid
        m.initial_path = tuple(raw[INITIAL_PATH_OFFSET + 1 : INITIAL_PATH_OFFSET + 1 + hop_cnt])
        m.return_path = tuple(raw[RETURN_PATH_OFFSET + 1 : RETURN_PATH_OFFSET + 1 + hop_cnt])
        m.data = raw[DATA_OFFSET : DATA_OFFSET + SMP_DATA_SIZE]
    else:
        if cls == MgmtClass.SUBN_LID:
            (_, _, cv, method, status, cs, tid, attr_id, _, attr_mod, mkey) = _HDR_SMP.unpack_from(raw)
            m.mkey = mkey
            m.data = raw[DATA_OFFSET : DATA_OFFSET + SMP_DATA_SIZE]
        else:
            (_, _, cv, method, status, cs, tid, attr_id, _, attr_mod) = _HDR.unpack_from(raw)
            m.mkey = 0
            m.data = raw[DATA_OFFSET : DATA_OFFSET + PERF_DATA_SIZE]
        m.d_bit = False
        m.status = status
        m.hop_ptr = 0
        m.hop_cnt = 0
        m.dr_slid = 0
        m.dr_dlid = 0
        m.initial_path = ()
        m.return_path = ()
    m.class_version = cv
    m.method = method
    m.is_response = bool(method & RESPONSE_BIT)
    m.tid = tid
    m.attr_id = attr_id
    m.attr_mod = attr_mod
    return m


def status_ok(mad: Mad) -> bool:
    """Whether the MAD's status is 0 (the D bit of DR SMPs is not part of the status)."""
    return mad.status == MadStatus.OK


# --- builders -------------------------------------------------------------


def _check_common(method: int, attr_id: int, attr_mod: int, tid: int) -> None:
    if not 0 <= method <= 0xFF:
        raise MadError(f"MAD method {method} does not fit 8 bits")
    if not 0 <= attr_id <= 0xFFFF:
        raise MadError(f"MAD attribute ID {attr_id} does not fit 16 bits")
    if not 0 <= attr_mod <= 0xFFFFFFFF:
        raise MadError(f"MAD attribute modifier {attr_mod} does not fit 32 bits")
    if not 0 <= tid <= 0xFFFFFFFFFFFFFFFF:
        raise MadError(f"MAD transaction ID {tid} does not fit 64 bits")


def _check_data(data: bytes, limit: int, what: str) -> None:
    if len(data) > limit:
        raise MadError(f"{what} data is {len(data)} bytes, at most {limit}")


def _check_mkey(mkey: int) -> None:
    if not 0 <= mkey <= 0xFFFFFFFFFFFFFFFF:
        raise MadError(f"M_Key {mkey} does not fit 64 bits")


def smp_dr(
    method: int,
    attr_id: int,
    attr_mod: int,
    tid: int,
    path: Sequence[int],
    data: bytes = b"",
    mkey: int = 0,
) -> bytes:
    """A directed-route SMP along ``path`` (InitialPath slots 1..hop count; slot 1 is the
    requester's own egress port), hop pointer 0, D bit 0, DrSLID and DrDLID permissive."""
    _check_common(method, attr_id, attr_mod, tid)
    _check_mkey(mkey)
    _check_data(data, SMP_DATA_SIZE, "SMP")
    hops = len(path)
    if hops > MAX_DR_HOPS:
        raise MadError(f"DR path has {hops} hops, at most {MAX_DR_HOPS}")
    try:
        path_bytes = bytes(path)
    except (ValueError, TypeError):
        raise MadError(f"DR path {list(path)!r}: ports must be integers 0..255") from None
    buf = bytearray(MAD_SIZE)
    _HDR_DR.pack_into(
        buf, 0, BASE_VERSION, MgmtClass.SUBN_DR, SMP_CLASS_VERSION, method, 0, hops, tid, attr_id, 0,
        attr_mod, mkey, PERMISSIVE_LID, PERMISSIVE_LID,
    )
    buf[DATA_OFFSET : DATA_OFFSET + len(data)] = data
    buf[INITIAL_PATH_OFFSET + 1 : INITIAL_PATH_OFFSET + 1 + hops] = path_bytes
    return bytes(buf)


def smp_lid(method: int, attr_id: int, attr_mod: int, tid: int, data: bytes = b"", mkey: int = 0) -> bytes:
    """A LID-routed SMP (class 0x01); the destination LID is the transport's business."""
    _check_common(method, attr_id, attr_mod, tid)
    _check_mkey(mkey)
    _check_data(data, SMP_DATA_SIZE, "SMP")
    buf = bytearray(MAD_SIZE)
    _HDR_SMP.pack_into(
        buf, 0, BASE_VERSION, MgmtClass.SUBN_LID, SMP_CLASS_VERSION, method, 0, 0, tid, attr_id, 0,
        attr_mod, mkey,
    )
    buf[DATA_OFFSET : DATA_OFFSET + len(data)] = data
    return bytes(buf)


def perf_mad(method: int, attr_id: int, attr_mod: int, tid: int, data: bytes = b"") -> bytes:
    """A PerfMgt (class 0x04) MAD with its data at byte 64."""
    _check_common(method, attr_id, attr_mod, tid)
    _check_data(data, PERF_DATA_SIZE, "PerfMgt")
    buf = bytearray(MAD_SIZE)
    _HDR.pack_into(
        buf, 0, BASE_VERSION, MgmtClass.PERF, PERF_CLASS_VERSION, method, 0, 0, tid, attr_id, 0, attr_mod
    )
    buf[DATA_OFFSET : DATA_OFFSET + len(data)] = data
    return bytes(buf)


def trap_mad(notice_data: bytes, tid: int) -> bytes:
    """A Trap(Notice) SMP (class 0x01, method TRAP) carrying ``notice_data`` (at most 64 bytes)."""
    return smp_lid(Method.TRAP, SmpAttr.NOTICE, 0, tid, notice_data)


def trap_repress(trap: bytes) -> bytes:
    """The TrapRepress an SM sends for a received trap: same TID, attribute and data."""
    m = parse_mad(trap)
    if m.method != Method.TRAP:
        raise MadError(f"MAD tid {m.tid:#x} method {m.method:#04x} is not a Trap")
    buf = bytearray(trap)
    buf[3] = Method.TRAP_REPRESS
    return bytes(buf)


# --- responder side -------------------------------------------------------


def make_response(
    req: bytes,
    data: bytes,
    status: int = 0,
    *,
    return_path: Sequence[int] | None = None,
    hop_ptr: int | None = None,
) -> bytes:
    """The GetResp for request ``req``: same TID, class, attribute and modifier, ``data``
    (zero padded) and ``status``.

    For a DR SMP the D bit is set and the header is left as the requester receives it
    at the end of the return trip (IBA 14.2.2, C14-9 and C14-13, as the Linux SMI code
    applies them): the destination records its ingress port in ReturnPath[hop count] and
    the switches on the way ReturnPath[1..hop count-1]; the responder answers with hop
    pointer hop count + 1; each returning hop decrements it; the requester's own port
    takes it from 1 to 0. So by default the hop pointer is 0, which is what ibsim (via
    umad2sim) hands the requester too. ``return_path`` gives the
    ingress ports of nodes 1..hop count (the ReturnPath the switches would have
    written); without it the request's ReturnPath is kept. ``hop_ptr`` overrides the
    hop pointer, e.g. ``hop_cnt + 1`` for the response as the responder emits it.
    """
    if len(req) != MAD_SIZE:
        raise MadError(f"request is {len(req)} bytes, expected {MAD_SIZE}")
    cls = req[1]
    limit = PERF_DATA_SIZE if cls == MgmtClass.PERF else SMP_DATA_SIZE
    _check_data(data, limit, "response")
    buf = bytearray(req)
    buf[3] = Method.GET_RESP
    buf[DATA_OFFSET : DATA_OFFSET + limit] = bytes(data).ljust(limit, b"\0")
    if cls == MgmtClass.SUBN_DR:
        if not 0 <= status <= 0x7FFF:
            raise MadError(f"DR SMP status {status:#x} does not fit 15 bits")
        _U16.pack_into(buf, 4, DR_D_BIT | status)
        hop_cnt = buf[7]
        if hop_cnt > MAX_DR_HOPS:
            raise MadError(f"DR SMP: hop count {hop_cnt} exceeds {MAX_DR_HOPS}")
        if return_path is not None:
            if len(return_path) != hop_cnt:
                raise MadError(f"return path has {len(return_path)} ports, hop count is {hop_cnt}")
            try:
                buf[RETURN_PATH_OFFSET + 1 : RETURN_PATH_OFFSET + 1 + hop_cnt] = bytes(return_path)
            except (ValueError, TypeError):
                raise MadError(f"return path {list(return_path)!r}: ports must be 0..255") from None
        ptr = 0 if hop_ptr is None else hop_ptr
        if not 0 <= ptr <= hop_cnt + 1:
            raise MadError(f"hop pointer {ptr} outside 0..{hop_cnt + 1}")
        buf[6] = ptr
    else:
        if not 0 <= status <= 0xFFFF:
            raise MadError(f"MAD status {status:#x} does not fit 16 bits")
        _U16.pack_into(buf, 4, status)
    return bytes(buf)


def set_return_path_hop(buf: bytearray, hop: int, port: int) -> None:
    """Write ReturnPath[hop] = ``port`` in a DR SMP (what a node does with its ingress port)."""
    if not 1 <= hop <= MAX_DR_HOPS:
        raise MadError(f"return path slot {hop} outside 1..{MAX_DR_HOPS}")
    if not 0 <= port <= 255:
        raise MadError(f"port {port} outside 0..255")
    buf[RETURN_PATH_OFFSET + hop] = port


def dr_outbound_hop(buf: bytearray, in_port: int) -> int | None:
    """Apply the outgoing DR rules (C14-9) at a node that received ``buf`` (D=0) on ``in_port``.

    Records ReturnPath[hop pointer] = ``in_port`` and advances the hop pointer. Returns the
    egress port InitialPath[hop pointer] when the SMP goes on, or None when this node is the
    destination (hop pointer now hop count + 1, to be handed to the SMA). A requester's own
    first send is ``dr_first_send``. MadError for a hop pointer the rules discard.
    """
    hop_ptr, hop_cnt = buf[6], buf[7]
    if buf[4] & 0x80:
        raise MadError("DR SMP with D bit set on the outgoing path")
    if hop_cnt > MAX_DR_HOPS:
        raise MadError(f"DR SMP: hop count {hop_cnt} exceeds {MAX_DR_HOPS}")
    if hop_cnt and hop_ptr == 0:
        raise MadError("DR SMP received with hop pointer 0: the sender did not advance it")
    if hop_ptr > hop_cnt:
        raise MadError(f"DR SMP received with hop pointer {hop_ptr} beyond hop count {hop_cnt}")
    if hop_cnt:
        buf[RETURN_PATH_OFFSET + hop_ptr] = in_port
    buf[6] = hop_ptr + 1
    if hop_ptr < hop_cnt:
        return buf[INITIAL_PATH_OFFSET + hop_ptr + 1]
    return None


def dr_first_send(buf: bytearray) -> int | None:
    """The requester's send step (C14-9:1): hop pointer 0 -> 1, egress InitialPath[1].

    Returns None for a 0-hop SMP (it goes to the local SMA, hop pointer becomes 1)."""
    hop_ptr, hop_cnt = buf[6], buf[7]
    if hop_ptr != 0:
        raise MadError(f"DR SMP to send has hop pointer {hop_ptr}, expected 0")
    buf[6] = 1
    return buf[INITIAL_PATH_OFFSET + 1] if hop_cnt else None


def dr_return_hop(buf: bytearray) -> int | None:
    """Apply the returning DR rules (C14-13) when a node sends ``buf`` (D=1) back.

    Decrements the hop pointer and returns the egress port ReturnPath[hop pointer], or None
    when the hop pointer reaches 0 (the SMP is at the requester)."""
    hop_ptr, hop_cnt = buf[6], buf[7]
    if not buf[4] & 0x80:
        raise MadError("DR SMP without D bit on the return path")
    if hop_ptr == 0 or hop_ptr > hop_cnt + 1:
        raise MadError(f"returning DR SMP with hop pointer {hop_ptr} (hop count {hop_cnt})")
    buf[6] = hop_ptr - 1
    if hop_ptr == 1:
        return None
    return buf[RETURN_PATH_OFFSET + hop_ptr - 1]


def dump_mad(buf: bytes) -> str:
    """libibmad-style text of a MAD: its header, the DR paths, and the attribute when known."""
    from fabric.mad.attributes import ATTRIBUTES  # here to keep the module graph one-way

    m = parse_mad(buf)
    header = SMP_DR_HEADER if m.is_dr else MAD_HEADER
    lines = [header.dump(header.unpack(m.raw))]
    if m.is_dr:
        lines.append("InitialPath:".ljust(33, ".") + ",".join(map(str, m.initial_path)))
        lines.append("ReturnPath:".ljust(33, ".") + ",".join(map(str, m.return_path)))
    layout = ATTRIBUTES.get((m.mgmt_class, m.attr_id))
    if layout is not None:
        lines.append(f"# {layout.name}")
        lines.append(layout.dump(layout.unpack(m.data)))
    return "\n".join(lines)
