"""Subnet Administration (SA, management class 0x03, class version 2): header, records, component masks.

The SA MAD (IBA 15.2.1) is the common MAD header, the RMPP header (SA is an RMPP
class) and 20 bytes of SA fields, then 200 bytes of data::

    0  BaseVersion   1 MgmtClass (0x03)   2 ClassVersion (2)   3 R|Method
    4  Status        6 reserved           8 TransactionID (8)
    16 AttributeID   18 reserved          20 AttributeModifier (4)
    24 RMPPVersion   25 RMPPType          26 RRespTime (5 bits) | RMPPFlags (3 bits)   27 RMPPStatus
    28 Data1: SegmentNumber               32 Data2: PayloadLength (DATA) / NewWindowLast (ACK)
    36 SM_Key (8)    44 AttributeOffset   46 reserved           48 ComponentMask (8)
    56 SA data (200 bytes): records one after another, AttributeOffset * 8 bytes apart

Records (IBA 15.2.5) are field tables like the SMP attributes, bit offsets from the
first bit of the record. A record that embeds an SMP attribute (NodeInfo,
PortInfo, SwitchInfo, SMInfo, GUIDInfo) has that attribute's fields split into
the record, shifted by its position, because the component mask addresses them one
by one; opaque tables (LFT and MFT blocks, P_Key, SL-to-VL and VL arbitration
tables) stay one field. Sizes are the spec's; on the wire OpenSM spaces records
AttributeOffset = ceil(size / 8) words apart (it pads its C structs to that)::

    record                      id     size  AttributeOffset (stride)
    NodeRecord                  0x11   108   14 (112)
    PortInfoRecord              0x12    68    9 (72)
    SLtoVLMappingTableRecord    0x13    16    2 (16)
    SwitchInfoRecord            0x14    24    3 (24)
    LinearForwardingTableRecord 0x15    72    9 (72)
    MulticastForwardingTable... 0x17    72    9 (72)
    SMInfoRecord                0x18    25    4 (32)
    LinkRecord                  0x20     6    1 (8)
    GUIDInfoRecord              0x30    72    9 (72)
    ServiceRecord               0x31   176   22 (176)
    P_KeyTableRecord            0x33    72    9 (72)
    PathRecord                  0x35    64    8 (64)
    VLArbitrationTableRecord    0x36    72    9 (72)
    MCMemberRecord              0x38    52    7 (56)
    MultiPathRecord             0x3A   200   25 (200)
    InformInfoRecord            0xF3    60    8 (64)
    InformInfo                  0x03    36    5 (40)

Component masks: ``COMPONENTS[attr][i]`` names the field that ComponentMask bit i
selects (None for a reserved component). The tables follow one rule, which
reproduces every IB_*_COMPMASK_* constant of OpenSM's ib_types.h: each field of
the record, embedded attribute fields included, is one component in offset
order, and each reserved gap between fields is one component too. One exception:
PathRecord's ServiceID takes bits 0 and 1 (IB_PR_COMPMASK_SERVICEID_MSB/LSB; OpenSM
answers ERR_REQ_INSUFFICIENT_COMPONENTS when only one of the two is set).
``match_mask`` turns a mask into a record-sized bit mask, so a query is a masked
byte comparison over packed records.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum, IntFlag
from typing import NamedTuple

from fabric.mad.attributes import (
    CLASS_PORT_INFO,
    GUID_INFO,
    NODE_INFO,
    NOTICE,
    PORT_INFO,
    SM_INFO,
    SWITCH_INFO,
)
from fabric.mad.constants import BASE_VERSION, RESPONSE_BIT
from fabric.mad.errors import MadError
from fabric.mad.fields import Field, FieldValue, Layout
from fabric.mad.mad import MAD_HEADER

SA_CLASS = 0x03
"""MgmtClass of Subnet Administration."""

SA_CLASS_VERSION = 2
"""ClassVersion of SA MADs (IBA 1.1 and later)."""

MAD_SIZE = 256
SA_HEADER_SIZE = 56
"""Common header + RMPP header + SA fields."""
RMPP_HEADER_OFFSET = 24
SA_FIELDS_OFFSET = 36
SA_DATA_OFFSET = 56
SA_DATA_SIZE = 200
"""Bytes of record data in one SA MAD (and in each RMPP segment)."""


class SaAttr(IntEnum):
    """SA attribute IDs (IBA 15.2.5, Table 187 of 1.2.1; ib_types.h IB_MAD_ATTR_*)."""

    CLASS_PORT_INFO = 0x01
    NOTICE = 0x02
    INFORM_INFO = 0x03
    NODE_RECORD = 0x11
    PORT_INFO_RECORD = 0x12
    SL2VL_TABLE_RECORD = 0x13
    SWITCH_INFO_RECORD = 0x14
    LFT_RECORD = 0x15
    RFT_RECORD = 0x16
    MFT_RECORD = 0x17
    SM_INFO_RECORD = 0x18
    LINK_RECORD = 0x20
    GUID_INFO_RECORD = 0x30
    SERVICE_RECORD = 0x31
    PKEY_TABLE_RECORD = 0x33
    PATH_RECORD = 0x35
    VLARB_TABLE_RECORD = 0x36
    MCMEMBER_RECORD = 0x38
    TRACE_RECORD = 0x39
    MULTIPATH_RECORD = 0x3A
    SERVICE_ASSOCIATION_RECORD = 0x3B
    INFORM_INFO_RECORD = 0xF3


class SaMethod(IntEnum):
    """SA methods, R bit included in the responses (IBA 15.2.2)."""

    GET = 0x01
    SET = 0x02
    SEND = 0x03
    REPORT = 0x06
    GET_TABLE = 0x12
    GET_TRACE_TABLE = 0x13
    GET_MULTI = 0x14
    DELETE = 0x15
    GET_RESP = 0x81
    REPORT_RESP = 0x86
    GET_TABLE_RESP = 0x92
    GET_MULTI_RESP = 0x94
    DELETE_RESP = 0x95


class SaStatus(IntEnum):
    """MAD Status values an SA answers with: the generic codes (IBA 13.4.7) and the
    SA class-specific codes in bits 8-15 (IBA 15.2.1.1; ib_types.h IB_SA_MAD_STATUS_*)."""

    OK = 0x0000
    BUSY = 0x0001
    REDIRECT = 0x0002
    BAD_VERSION = 0x0004
    METHOD_UNSUPPORTED = 0x0008
    METHOD_ATTR_UNSUPPORTED = 0x000C
    INVALID_FIELD = 0x001C
    ERR_NO_RESOURCES = 0x0100
    ERR_REQ_INVALID = 0x0200
    ERR_NO_RECORDS = 0x0300
    ERR_TOO_MANY_RECORDS = 0x0400
    ERR_REQ_INVALID_GID = 0x0500
    ERR_REQ_INSUFFICIENT_COMPONENTS = 0x0600
    ERR_REQ_DENIED = 0x0700
    ERR_REQ_PRIORITY_SUGGESTED = 0x0800
    """IB_SA_MAD_STATUS_PRIO_SUGGESTED in ib_types.h (QoS, IBA 1.2 errata)."""


class SaCap(IntFlag):
    """SA ClassPortInfo.CapabilityMask (16 bits). Bits 0-2 are the generic ClassPortInfo
    bits (IBA 13.4.8.1); 8 and up are SA-specific, as OpenSM's osm_base.h OSM_CAP_IS_*
    numbers them (IBA 1.2.1 Table 188)."""

    IS_TRAP_SUPPORTED = 1 << 0
    IS_GET_SET_NOTICE_SUPPORTED = 1 << 1
    IS_CAPABILITY_MASK2_SUPPORTED = 1 << 2
    IS_OPTIONAL_RECORDS_SUPPORTED = 1 << 8
    IS_UD_MULTICAST_SUPPORTED = 1 << 9
    IS_MULTIPATH_SUPPORTED = 1 << 10
    IS_REINIT_SUPPORTED = 1 << 11
    IS_PORT_INFO_CAPMASK_MATCH_SUPPORTED = 1 << 13
    """PortInfoRecord CapabilityMask matches only the bits set in the query when bit 31
    of the AttributeModifier is set (IBA 1.2 errata)."""


class SaCap2(IntFlag):
    """SA ClassPortInfo.CapabilityMask2 (27 bits), as OpenSM's osm_base.h OSM_CAP2_IS_*
    numbers them. OpenSM 3.3 advertises FULL_PORT_INFO_RECORDS, EXTENDED_SPEEDS,
    ALIAS_GUIDS, MULTICAST_SERVICE_RECORDS, PORT_INFO_CAPMASK2_MATCH,
    SEND_ONLY_FULL_MEMBER and LINK_WIDTH_2X (+ MULTICAST_FDB_TOP, QOS when enabled)."""

    IS_QOS_SUPPORTED = 1 << 1
    IS_REVERSE_PATH_PKEY_SUPPORTED = 1 << 2
    IS_MULTICAST_FDB_TOP_SUPPORTED = 1 << 3
    IS_HIERARCHY_INFO_SUPPORTED = 1 << 4
    IS_ALIAS_GUIDS_SUPPORTED = 1 << 5
    IS_FULL_PORT_INFO_RECORDS_SUPPORTED = 1 << 6
    IS_EXTENDED_SPEEDS_SUPPORTED = 1 << 7
    IS_MULTICAST_SERVICE_RECORDS_SUPPORTED = 1 << 8
    IS_PORT_INFO_CAPMASK2_MATCH_SUPPORTED = 1 << 10
    IS_SEND_ONLY_FULL_MEMBER_SUPPORTED = 1 << 12
    """The kernel's IB_SA_CAP_MASK2_SENDONLY_FULL_MEM_SUPPORT: IPoIB then joins send-only groups as full member."""
    IS_LINK_WIDTH_2X_SUPPORTED = 1 << 13
    IS_LINK_SPEED_HDR_SUPPORTED = 1 << 15
    IS_LINK_SPEED_NDR_SUPPORTED = 1 << 17
    IS_EXTENDED_SPEEDS2_SUPPORTED = 1 << 19
    IS_LINK_SPEED_XDR_SUPPORTED = 1 << 20


# --- SA header --------------------------------------------------------------

RMPP_HEADER = Layout(
    "RmppHeader",
    12,
    [
        Field("RMPPVersion", 0, 8),
        Field("RMPPType", 8, 8),
        Field("RRespTime", 16, 5),
        Field("RMPPFlags", 21, 3, fmt="hex"),
        Field("RMPPStatus", 24, 8),
        Field("Data1", 32, 32, fmt="uint"),
        Field("Data2", 64, 32, fmt="uint"),
    ],
)
"""The RMPP header (IBA 13.6.2.1) at byte 24: ``RMPP_HEADER.unpack(mad, RMPP_HEADER_OFFSET)``.
Data1 is the SegmentNumber, Data2 the PayloadLength of DATA or the NewWindowLast of an ACK."""

SA_FIELDS = Layout(
    "SaFields",
    20,
    [
        Field("SM_Key", 0, 64),
        Field("AttributeOffset", 64, 16, fmt="uint"),
        Field("ComponentMask", 96, 64),
    ],
)
"""The SA-specific header (IBA 15.2.1) at byte 36: ``SA_FIELDS.unpack(mad, SA_FIELDS_OFFSET)``."""

SA_HEADER = Layout(
    "SaHeader",
    SA_HEADER_SIZE,
    [
        *MAD_HEADER.fields,
        *(dataclasses.replace(f, offset=f.offset + RMPP_HEADER_OFFSET * 8) for f in RMPP_HEADER.fields),
        *(dataclasses.replace(f, offset=f.offset + SA_FIELDS_OFFSET * 8) for f in SA_FIELDS.fields),
    ],
)
"""The 56 bytes before the SA data, offsets from byte 0 of the MAD: the common MAD header, the
RMPP header and the SA fields, each defined once above."""


# --- records ----------------------------------------------------------------

F = Field

SELECTORS = {0: "GreaterThan", 1: "LessThan", 2: "Exactly", 3: "Best"}


def _embed(layout: Layout, base: int, rename: Mapping[str, str] | None = None) -> list[Field]:
    """``layout``'s fields moved to start at bit ``base`` of a record (names optionally changed)."""
    names = rename or {}
    return [dataclasses.replace(f, name=names.get(f.name, f.name), offset=base + f.offset) for f in layout.fields]


NODE_RECORD = Layout(
    "NodeRecord",
    108,
    [
        F("LID", 0, 16, fmt="hex"),
        *_embed(NODE_INFO, 32),
        F("NodeDescription", 352, 512, fmt="str"),
    ],
)
"""NodeRecord (15.2.5.2): LID, reserved 16, NodeInfo (40 bytes) split into its fields, NodeDescription."""

PORT_INFO_RECORD = Layout(
    "PortInfoRecord",
    68,
    [
        F("EndportLID", 0, 16, fmt="hex"),
        F("PortNum", 16, 8),
        F("Options", 24, 8, fmt="hex"),
        *_embed(PORT_INFO, 32),
    ],
)
"""PortInfoRecord (15.2.5.3): EndportLID, PortNum, Options, PortInfo (64 bytes) split into its fields."""

SL2VL_TABLE_RECORD = Layout(
    "SLtoVLMappingTableRecord",
    16,
    [
        F("LID", 0, 16, fmt="hex"),
        F("InputPortNum", 16, 8),
        F("OutputPortNum", 24, 8),
        F("SLtoVLMappingTable", 64, 64, fmt="hex"),
    ],
)
"""SLtoVLMappingTableRecord (15.2.5.4): the table is the 8-byte SMP attribute, SL0 in the top nibble."""

SWITCH_INFO_RECORD = Layout(
    "SwitchInfoRecord",
    24,
    [F("LID", 0, 16, fmt="hex"), *_embed(SWITCH_INFO, 32)],
)
"""SwitchInfoRecord (15.2.5.5): LID, reserved 16, SwitchInfo (20 bytes) split into its fields."""

LFT_RECORD = Layout(
    "LinearForwardingTableRecord",
    72,
    [
        F("LID", 0, 16, fmt="hex"),
        F("BlockNum", 16, 16),
        F("LinearForwardingTable", 64, 512, fmt="bytes"),
    ],
)
"""LinearForwardingTableRecord (15.2.5.6): LID, BlockNum, reserved 32, one 64-port LFT block."""

MFT_RECORD = Layout(
    "MulticastForwardingTableRecord",
    72,
    [
        F("LID", 0, 16, fmt="hex"),
        F("Position", 16, 4),
        F("BlockNum", 23, 9),
        F("MulticastForwardingTable", 64, 512, fmt="bytes"),
    ],
)
"""MulticastForwardingTableRecord (15.2.5.8): LID, Position 4, reserved 3, BlockNum 9, reserved 32,
one MFT block (32 PortMask entries of 16 bits)."""

SM_INFO_RECORD = Layout(
    "SMInfoRecord",
    25,
    [F("LID", 0, 16, fmt="hex"), *_embed(SM_INFO, 32)],
)
"""SMInfoRecord (15.2.5.9): LID, reserved 16, SMInfo (21 bytes) split into its fields."""

LINK_RECORD = Layout(
    "LinkRecord",
    6,
    [
        F("FromLID", 0, 16, fmt="hex"),
        F("FromPort", 16, 8),
        F("ToPort", 24, 8),
        F("ToLID", 32, 16, fmt="hex"),
    ],
)
"""LinkRecord (15.2.5.13)."""

GUID_INFO_RECORD = Layout(
    "GUIDInfoRecord",
    72,
    [
        F("LID", 0, 16, fmt="hex"),
        F("BlockNum", 16, 8),
        *_embed(GUID_INFO, 64),
    ],
)
"""GUIDInfoRecord (15.2.5.18): LID, BlockNum, reserved 8, reserved 32, GUIDInfo block GUID0..GUID7."""

SERVICE_RECORD = Layout(
    "ServiceRecord",
    176,
    [
        F("ServiceID", 0, 64, fmt="hex"),
        F("ServiceGID", 64, 128, fmt="bytes"),
        F("ServiceP_Key", 192, 16, fmt="hex"),
        F("ServiceLease", 224, 32, fmt="uint"),
        F("ServiceKey", 256, 128, fmt="bytes"),
        F("ServiceName", 384, 512, fmt="str"),
        *(F(f"ServiceData8_{i}", 896 + 8 * i, 8) for i in range(16)),
        *(F(f"ServiceData16_{i}", 1024 + 16 * i, 16) for i in range(8)),
        *(F(f"ServiceData32_{i}", 1152 + 32 * i, 32, fmt="uint") for i in range(4)),
        *(F(f"ServiceData64_{i}", 1280 + 64 * i, 64, fmt="uint") for i in range(2)),
    ],
)
"""ServiceRecord (15.2.5.14). ServiceLease 0xFFFFFFFF is infinite."""

PKEY_TABLE_RECORD = Layout(
    "P_KeyTableRecord",
    72,
    [
        F("LID", 0, 16, fmt="hex"),
        F("BlockNum", 16, 16),
        F("PortNum", 32, 8),
        F("P_KeyTable", 64, 512, fmt="bytes"),
    ],
)
"""P_KeyTableRecord (15.2.5.11): LID, BlockNum, PortNum, reserved 24, one 32-entry P_Key block."""

PATH_RECORD = Layout(
    "PathRecord",
    64,
    [
        F("ServiceID", 0, 64, fmt="hex"),
        F("DGID", 64, 128, fmt="bytes"),
        F("SGID", 192, 128, fmt="bytes"),
        F("DLID", 320, 16, fmt="hex"),
        F("SLID", 336, 16, fmt="hex"),
        F("RawTraffic", 352, 1),
        F("FlowLabel", 356, 20, fmt="hex"),
        F("HopLimit", 376, 8),
        F("TClass", 384, 8),
        F("Reversible", 392, 1),
        F("NumbPath", 393, 7),
        F("P_Key", 400, 16, fmt="hex"),
        F("QoSClass", 416, 12),
        F("SL", 428, 4),
        F("MTUSelector", 432, 2, values=SELECTORS),
        F("MTU", 434, 6),
        F("RateSelector", 440, 2, values=SELECTORS),
        F("Rate", 442, 6),
        F("PacketLifeTimeSelector", 448, 2, values=SELECTORS),
        F("PacketLifeTime", 450, 6),
        F("Preference", 456, 8),
    ],
)
"""PathRecord (15.2.5.16); bytes 58-63 are reserved."""

VLARB_TABLE_RECORD = Layout(
    "VLArbitrationTableRecord",
    72,
    [
        F("LID", 0, 16, fmt="hex"),
        F("OutputPortNum", 16, 8),
        F("BlockNum", 24, 8),
        F("VLArbitrationTable", 64, 512, fmt="bytes"),
    ],
)
"""VLArbitrationTableRecord (15.2.5.10): LID, OutputPortNum, BlockNum, reserved 32, one 32-entry block."""

MCMEMBER_RECORD = Layout(
    "MCMemberRecord",
    52,
    [
        F("MGID", 0, 128, fmt="bytes"),
        F("PortGID", 128, 128, fmt="bytes"),
        F("Q_Key", 256, 32, fmt="hex"),
        F("MLID", 288, 16, fmt="hex"),
        F("MTUSelector", 304, 2, values=SELECTORS),
        F("MTU", 306, 6),
        F("TClass", 312, 8),
        F("P_Key", 320, 16, fmt="hex"),
        F("RateSelector", 336, 2, values=SELECTORS),
        F("Rate", 338, 6),
        F("PacketLifeTimeSelector", 344, 2, values=SELECTORS),
        F("PacketLifeTime", 346, 6),
        F("SL", 352, 4),
        F("FlowLabel", 356, 20, fmt="hex"),
        F("HopLimit", 376, 8),
        F("Scope", 384, 4),
        F("JoinState", 388, 4, fmt="hex"),
        F("ProxyJoin", 392, 1),
    ],
)
"""MCMemberRecord (15.2.5.17); 23 reserved bits after ProxyJoin. JoinState bits: 1 FullMember,
2 NonMember, 4 SendOnlyNonMember, 8 SendOnlyFullMember."""

_INFORM_INFO_FIELDS = [
    F("GID", 0, 128, fmt="bytes"),
    F("LIDRangeBegin", 128, 16, fmt="hex"),
    F("LIDRangeEnd", 144, 16, fmt="hex"),
    F("IsGeneric", 176, 8),
    F("Subscribe", 184, 8),
    F("Type", 192, 16),
    F("TrapNumber", 208, 16),
    F("QPN", 224, 24, fmt="hex"),
    F("RespTimeValue", 251, 5),
    F("ProducerType", 264, 24, fmt="hex"),
]

INFORM_INFO = Layout("InformInfo", 36, _INFORM_INFO_FIELDS)
"""InformInfo (13.4.8.3), the attribute of SubnAdmSet(InformInfo). With IsGeneric 0 the
TrapNumber field is the DeviceID and ProducerType the VendorID."""

INFORM_INFO_RECORD = Layout(
    "InformInfoRecord",
    60,
    [
        F("SubscriberGID", 0, 128, fmt="bytes"),
        F("Enum", 128, 16),
        *_embed(INFORM_INFO, 192),
    ],
)
"""InformInfoRecord (15.2.5.12): SubscriberGID, Enum, reserved 48, InformInfo (36 bytes) split."""

MULTIPATH_RECORD = Layout(
    "MultiPathRecord",
    200,
    [
        F("RawTraffic", 0, 1),
        F("FlowLabel", 4, 20, fmt="hex"),
        F("HopLimit", 24, 8),
        F("TClass", 32, 8),
        F("Reversible", 40, 1),
        F("NumbPath", 41, 7),
        F("P_Key", 48, 16, fmt="hex"),
        F("QoSClass", 64, 12),
        F("SL", 76, 4),
        F("MTUSelector", 80, 2, values=SELECTORS),
        F("MTU", 82, 6),
        F("RateSelector", 88, 2, values=SELECTORS),
        F("Rate", 90, 6),
        F("PacketLifeTimeSelector", 96, 2, values=SELECTORS),
        F("PacketLifeTime", 98, 6),
        F("ServiceID8MSB", 104, 8, fmt="hex"),
        F("IndependenceSelector", 112, 2),
        F("SGIDCount", 120, 8),
        F("DGIDCount", 128, 8),
        F("ServiceID56LSB", 136, 56, fmt="hex"),
        *(F(f"SDGID{i}", 192 + 128 * i, 128, fmt="bytes") for i in range(11)),
    ],
)
"""MultiPathRecord (15.2.5.20), the request of SubnAdmGetMulti: SGIDCount source GIDs then
DGIDCount destination GIDs in SDGID0..; the answer is PathRecords."""

del F

RECORDS: dict[int, Layout] = {
    SaAttr.CLASS_PORT_INFO: CLASS_PORT_INFO,
    SaAttr.NOTICE: NOTICE,
    SaAttr.INFORM_INFO: INFORM_INFO,
    SaAttr.NODE_RECORD: NODE_RECORD,
    SaAttr.PORT_INFO_RECORD: PORT_INFO_RECORD,
    SaAttr.SL2VL_TABLE_RECORD: SL2VL_TABLE_RECORD,
    SaAttr.SWITCH_INFO_RECORD: SWITCH_INFO_RECORD,
    SaAttr.LFT_RECORD: LFT_RECORD,
    SaAttr.MFT_RECORD: MFT_RECORD,
    SaAttr.SM_INFO_RECORD: SM_INFO_RECORD,
    SaAttr.LINK_RECORD: LINK_RECORD,
    SaAttr.GUID_INFO_RECORD: GUID_INFO_RECORD,
    SaAttr.SERVICE_RECORD: SERVICE_RECORD,
    SaAttr.PKEY_TABLE_RECORD: PKEY_TABLE_RECORD,
    SaAttr.PATH_RECORD: PATH_RECORD,
    SaAttr.VLARB_TABLE_RECORD: VLARB_TABLE_RECORD,
    SaAttr.MCMEMBER_RECORD: MCMEMBER_RECORD,
    SaAttr.MULTIPATH_RECORD: MULTIPATH_RECORD,
    SaAttr.INFORM_INFO_RECORD: INFORM_INFO_RECORD,
}
"""Layout of each SA attribute ID this codec knows (keys are ``SaAttr`` members, plain ints work too)."""

ATTRIBUTE_OFFSETS: dict[int, int] = {attr: (layout.size + 7) // 8 for attr, layout in RECORDS.items()}
"""AttributeOffset (record stride in 8-byte words) per attribute: ceil(size / 8), as OpenSM sends it."""


def record_layout(attr_id: int) -> Layout:
    """The layout of SA attribute ``attr_id``; MadError if the codec does not know it."""
    try:
        return RECORDS[attr_id]
    except KeyError:
        raise MadError(f"SA attribute {attr_id:#06x} has no layout") from None


def attribute_offset(attr_id: int) -> int:
    """AttributeOffset for records of ``attr_id`` (size in 8-byte words, rounded up)."""
    return (record_layout(attr_id).size + 7) // 8


# --- component masks --------------------------------------------------------


def _components(
    layout: Layout, repeat: Mapping[str, int] | None = None, reserved: Iterable[int] = ()
) -> tuple[str | None, ...]:
    """Component mask table of ``layout`` by the spec's rule: every field in offset order,
    every reserved field between them one component (None). A gap is one reserved field
    unless ``reserved`` gives bit offsets where another reserved field starts inside it;
    ``repeat`` gives fields that take more than one bit."""
    reps = repeat or {}
    starts = set(reserved)
    out: list[str | None] = []
    pos = 0

    def gap(end: int) -> None:
        if end > pos:
            out.append(None)
            out.extend(None for s in sorted(starts) if pos < s < end)

    for f in sorted(layout.fields, key=lambda f: f.offset):
        gap(f.offset)
        out.extend([f.name] * reps.get(f.name, 1))
        pos = f.end
    gap(layout.size * 8)
    return tuple(out)


COMPONENTS: dict[int, tuple[str | None, ...]] = {
    SaAttr.NODE_RECORD: _components(NODE_RECORD),
    SaAttr.PORT_INFO_RECORD: _components(PORT_INFO_RECORD),
    SaAttr.SL2VL_TABLE_RECORD: _components(SL2VL_TABLE_RECORD),
    SaAttr.SWITCH_INFO_RECORD: _components(SWITCH_INFO_RECORD),
    SaAttr.LFT_RECORD: _components(LFT_RECORD),
    SaAttr.MFT_RECORD: _components(MFT_RECORD),
    SaAttr.SM_INFO_RECORD: _components(SM_INFO_RECORD),
    SaAttr.LINK_RECORD: _components(LINK_RECORD),
    SaAttr.GUID_INFO_RECORD: _components(GUID_INFO_RECORD, reserved=[32]),
    SaAttr.SERVICE_RECORD: _components(SERVICE_RECORD),
    SaAttr.PKEY_TABLE_RECORD: _components(PKEY_TABLE_RECORD),
    SaAttr.PATH_RECORD: _components(PATH_RECORD, {"ServiceID": 2}),
    SaAttr.VLARB_TABLE_RECORD: _components(VLARB_TABLE_RECORD),
    SaAttr.MCMEMBER_RECORD: _components(MCMEMBER_RECORD),
    SaAttr.MULTIPATH_RECORD: _components(MULTIPATH_RECORD),
    SaAttr.INFORM_INFO_RECORD: _components(INFORM_INFO_RECORD),
}
"""``COMPONENTS[attr][i]``: the field ComponentMask bit i selects (None: reserved component).

Bits OpenSM's ib_types.h does not define but the rule gives (SwitchInfoRecord beyond LID,
LFT/P_Key/SL2VL/VLArb table components, MCMemberRecord bit 18, PathRecord bit 23) select
the field or gap in that position; OpenSM itself ignores them. PortInfoRecord bit 44
(OpenSM's IB_PIR_COMPMASK_RESV3) selects MulticastPKeyTrapSuppressionEnabled (IBA 1.3)."""


def _components_of(attr: int) -> tuple[str | None, ...]:
    try:
        return COMPONENTS[attr]
    except KeyError:
        raise MadError(f"SA attribute {attr:#06x} has no component mask table") from None


def component_fields(attr: int, mask: int) -> list[Field]:
    """The fields ComponentMask ``mask`` selects in records of ``attr``, in bit order, each once.

    Reserved components and bits beyond the table select nothing (``undefined_components``
    returns them, for a server that wants to refuse such queries)."""
    names = _components_of(attr)
    layout = RECORDS[attr]
    seen: set[str] = set()
    out: list[Field] = []
    for bit, name in enumerate(names):
        if mask >> bit & 1 and name is not None and name not in seen:
            seen.add(name)
            out.append(layout.field(name))
    return out


def undefined_components(attr: int, mask: int) -> int:
    """The bits of ``mask`` that select no field of ``attr`` (reserved or beyond the table)."""
    names = _components_of(attr)
    defined = sum(1 << bit for bit, name in enumerate(names) if name is not None)
    return mask & ~defined


def component_bit(attr: int, name: str) -> int:
    """The ComponentMask bit value (``1 << i``) of component ``name``; all its bits for a
    multi-bit component (PathRecord ServiceID -> 0b11)."""
    bits = sum(1 << i for i, n in enumerate(_components_of(attr)) if n == name)
    if not bits:
        raise MadError(f"SA attribute {attr:#06x}: no component {name!r}")
    return bits


def component_mask(attr: int, names: Iterable[str]) -> int:
    """The ComponentMask selecting the fields ``names`` of ``attr``."""
    mask = 0
    for name in names:
        mask |= component_bit(attr, name)
    return mask


@functools.lru_cache(maxsize=1024)
def match_mask(attr: int, mask: int) -> tuple[bytes, bytes]:
    """Byte masks for matching records of ``attr`` against a query with ComponentMask ``mask``.

    Returns ``(m, cols)``: ``m`` has the record's size and the bits of every selected field
    set; ``cols`` lists (one byte each) the positions where ``m`` is not zero. A record
    ``r`` matches a query ``q`` iff ``r[i] & m[i] == q[i] & m[i]`` for every i in ``cols``
    (for all i, equivalently). Over packed records with numpy::

        idx = np.frombuffer(cols, np.uint8)
        mm = np.frombuffer(m, np.uint8)[idx]
        hit = ((recs[:, idx] & mm) == (q[idx] & mm)).all(axis=1)
    """
    layout = record_layout(attr)
    bits = layout.size * 8
    value = 0
    for f in component_fields(attr, mask):
        value |= f.max_value << (bits - f.end)
    m = value.to_bytes(layout.size, "big")
    cols = bytes(i for i, b in enumerate(m) if b)
    return m, cols


def query_key(attr: int, mask: int, query: bytes) -> tuple[bytes, bytes]:
    """``(m, q & m)`` for a query record ``query``: a record ``r`` matches iff ``r & m == q & m``."""
    m, _ = match_mask(attr, mask)
    if len(query) < len(m):
        raise MadError(f"{RECORDS[attr].name} query is {len(query)} bytes, needs {len(m)}")
    return m, bytes(a & b for a, b in zip(query, m, strict=False))


def matches(attr: int, mask: int, query: bytes, record: bytes) -> bool:
    """Whether ``record`` matches ``query`` on the components of ``mask`` (the reference matcher)."""
    m, cols = match_mask(attr, mask)
    if len(record) < len(m) or len(query) < len(m):
        raise MadError(f"{RECORDS[attr].name}: records must be at least {len(m)} bytes")
    return all(record[i] & m[i] == query[i] & m[i] for i in cols)


# --- MADs -------------------------------------------------------------------

_SA_HDR = struct.Struct(">BBBBHHQHHIBBBBIIQHHQ")
assert _SA_HDR.size == SA_HEADER_SIZE


class SaMad(NamedTuple):
    """A parsed SA MAD: header fields and the 200 data bytes (fewer if the buffer was short).

    ``method`` includes the R bit (GET_RESP is 0x81). ``rmpp_data1`` is the SegmentNumber,
    ``rmpp_data2`` the PayloadLength (DATA) or NewWindowLast (ACK). ``raw`` keeps the bytes.
    A named tuple: immutable, and built in a fraction of a frozen dataclass's time (every SA
    request is parsed into one, on the receive thread).
    """

    base_version: int
    mgmt_class: int
    class_version: int
    method: int
    status: int
    tid: int
    attr_id: int
    attr_mod: int
    rmpp_version: int
    rmpp_type: int
    rmpp_resp_time: int
    rmpp_flags: int
    rmpp_status: int
    rmpp_data1: int
    rmpp_data2: int
    sm_key: int
    attr_offset: int
    component_mask: int
    data: bytes
    raw: bytes

    @property
    def is_response(self) -> bool:
        """Whether the R bit is set."""
        return bool(self.method & RESPONSE_BIT)

    @property
    def rmpp_active(self) -> bool:
        """Whether the RMPP ACTIVE flag is set."""
        return bool(self.rmpp_flags & 1)

    @property
    def header(self) -> bytes:
        """The 56 header bytes (common MAD header, RMPP header, SA fields)."""
        return self.raw[:SA_HEADER_SIZE]

    @property
    def record_size(self) -> int:
        """Record stride in bytes (AttributeOffset * 8)."""
        return self.attr_offset * 8

    def records(self, payload: bytes | None = None, count: int | None = None) -> list[bytes]:
        """``payload`` (default: this MAD's data) cut into records of ``record_size`` bytes;
        ``count`` limits the number (a single MAD's data is zero padded)."""
        return split_records(self.data if payload is None else payload, self.attr_offset, count)


def split_records(payload: bytes, attr_offset: int, count: int | None = None) -> list[bytes]:
    """``payload`` cut into whole records ``attr_offset * 8`` bytes apart (at most ``count``)."""
    stride = attr_offset * 8
    if stride <= 0:
        return []
    n = len(payload) // stride
    if count is not None:
        n = min(n, count)
    return [bytes(payload[i * stride : (i + 1) * stride]) for i in range(n)]


def parse_sa(buf: bytes | bytearray | memoryview) -> SaMad:
    """Parse an SA MAD of 56 to 256 bytes. MadError names what is wrong: size, BaseVersion
    or a class that is not SA. ClassVersion is not checked, so a server can answer a wrong
    one with BAD_VERSION."""
    raw = bytes(buf)
    if len(raw) < SA_HEADER_SIZE:
        raise MadError(f"SA MAD is {len(raw)} bytes, needs at least {SA_HEADER_SIZE}")
    if len(raw) > MAD_SIZE:
        raise MadError(f"SA MAD is {len(raw)} bytes, at most {MAD_SIZE}")
    (bv, cls, cv, method, status, _, tid, attr_id, _, attr_mod, rv, rt, rtf, rs, d1, d2, smkey, aoff, _, cmask) = (
        _SA_HDR.unpack_from(raw)
    )
    if bv != BASE_VERSION:
        raise MadError(f"SA MAD BaseVersion {bv}, expected {BASE_VERSION}")
    if cls != SA_CLASS:
        raise MadError(f"MAD class {cls:#04x} is not Subnet Administration ({SA_CLASS:#04x})")
    return SaMad(
        bv, cls, cv, method, status, tid, attr_id, attr_mod, rv, rt, rtf >> 3, rtf & 0x7, rs, d1, d2, smkey, aoff,
        cmask, raw[SA_DATA_OFFSET:], raw,
    )  # fmt: skip


def _check(name: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise MadError(f"SA MAD {name} {value} does not fit {bits} bits")


def _default_offset(attr_id: int, data: bytes) -> int:
    layout = RECORDS.get(attr_id)
    return (layout.size + 7) // 8 if layout is not None and data else 0


def sa_mad(
    method: int,
    attr_id: int,
    *,
    tid: int,
    attr_mod: int = 0,
    component_mask: int = 0,
    sm_key: int = 0,
    data: bytes = b"",
    status: int = 0,
    attr_offset: int | None = None,
) -> bytes:
    """A 256-byte SA MAD (class 0x03, version 2), RMPP header zero, ``data`` zero padded to 200.

    ``attr_offset`` defaults to the record size in 8-byte words when the attribute is known
    (0 for unknown attributes)."""
    for name, value, bits in (
        ("method", method, 8),
        ("attribute ID", attr_id, 16),
        ("attribute modifier", attr_mod, 32),
        ("transaction ID", tid, 64),
        ("component mask", component_mask, 64),
        ("SM_Key", sm_key, 64),
        ("status", status, 16),
    ):
        _check(name, value, bits)
    if attr_offset is None:
        layout = RECORDS.get(attr_id)
        attr_offset = (layout.size + 7) // 8 if layout is not None else 0
    _check("AttributeOffset", attr_offset, 16)
    if len(data) > SA_DATA_SIZE:
        raise MadError(f"SA data is {len(data)} bytes, at most {SA_DATA_SIZE} (larger answers go by RMPP)")
    buf = bytearray(MAD_SIZE)
    _SA_HDR.pack_into(
        buf,
        0,
        BASE_VERSION,
        SA_CLASS,
        SA_CLASS_VERSION,
        method,
        status,
        0,
        tid,
        attr_id,
        0,
        attr_mod,
        0,
        0,
        0,
        0,
        0,
        0,
        sm_key,
        attr_offset,
        0,
        component_mask,
    )
    buf[SA_DATA_OFFSET : SA_DATA_OFFSET + len(data)] = data
    return bytes(buf)


def response_method(method: int) -> int:
    """The response method of a request method: SET -> GET_RESP, otherwise R bit set."""
    return SaMethod.GET_RESP if method == SaMethod.SET else method | RESPONSE_BIT


def sa_response(
    request: SaMad | bytes,
    method: int | None,
    status: int = 0,
    data: bytes = b"",
    attr_offset: int | None = None,
    *,
    attr_id: int | None = None,
) -> bytes:
    """The response to ``request``: its common header and ComponentMask, ``method`` (None: the
    request's with the R bit, Set answered by GetResp), ``status``, SM_Key 0 (C15-0.1.5),
    RMPP header zero, ``data`` zero padded to 200 bytes.

    ``attr_offset`` defaults as OpenSM's: the record size in words when ``data`` is not
    empty, 0 otherwise. ``attr_id`` replaces the attribute (a GetMulti(MultiPathRecord)
    is answered with PathRecords, o15-0.2.7). Multi-MAD answers: build one header with
    this function and cut the payload with ``fabric.mad.rmpp.segments``."""
    req = request if isinstance(request, SaMad) else parse_sa(request)
    aid = req.attr_id if attr_id is None else attr_id
    meth = response_method(req.method) if method is None else method
    if attr_offset is None:
        attr_offset = _default_offset(aid, data)
    buf = bytearray(
        sa_mad(
            meth,
            aid,
            tid=req.tid,
            attr_mod=req.attr_mod,
            component_mask=req.component_mask,
            data=data,
            status=status,
            attr_offset=attr_offset,
        )
    )
    buf[2] = req.class_version
    return bytes(buf)


def dump_sa(buf: bytes) -> str:
    """libibmad-style text of an SA MAD: header, then the first record if the attribute is known."""
    m = parse_sa(buf)
    lines = [SA_HEADER.dump(SA_HEADER.unpack(m.raw))]
    layout = RECORDS.get(m.attr_id)
    if layout is not None and len(m.data) >= layout.size:
        lines.append(f"# {layout.name}")
        lines.append(layout.dump(layout.unpack(m.data)))
    return "\n".join(lines)


def record_values(attr: int, records: Sequence[bytes]) -> list[dict[str, FieldValue]]:
    """Each record of ``records`` decoded with the layout of ``attr``."""
    layout = record_layout(attr)
    return [layout.unpack(r) for r in records]
