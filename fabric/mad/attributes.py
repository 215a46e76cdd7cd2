"""Attribute layouts with the IBA spec's bit offsets, and the registry keyed by (class, attribute ID).

Offsets are those of the IBA Volume 1 tables (release 1.3/1.4): NodeInfo,
NodeDescription, SwitchInfo, GUIDInfo, PortInfo, P_KeyTable,
SLtoVLMappingTable, VLArbitrationTable, LinearForwardingTable,
MulticastForwardingTable, SMInfo, Notice (chapter 14), PerfMgt ClassPortInfo
(chapter 13), PortCounters and PortCountersExtended (chapter 16). Field names
are the spec's; ``ibmad`` gives libibmad's label where it differs, so dumps can
be compared with ``smpquery`` and ``perfquery`` output. The four tables have a
row per entry; libibmad keeps each as one array (``SLToVLMap``, ``VLArbTbl``,
``MulticastForwTbl``; P_Keys have no field) and ``smpquery`` prints them as
tables of its own, so their rows carry no ``ibmad`` label.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fabric.mad.constants import MgmtClass, NoticeType, PerfAttr, ProducerType, SmpAttr, Trap
from fabric.mad.errors import FieldValueError, MadError
from fabric.mad.fields import Field, FieldValue, Layout

SMP_DATA_SIZE = 64
"""Bytes of attribute data in an SMP."""

PERF_DATA_SIZE = 192
"""Bytes of attribute data in a PerfMgt (GS) MAD."""

LFT_BLOCK_SIZE = 64
"""LIDs per LinearForwardingTable block."""

PKEY_BLOCK_SIZE = 32
"""P_Keys per P_KeyTable block."""

MFT_BLOCK_SIZE = 32
"""MLIDs per MulticastForwardingTable block."""

MFT_PORTS_PER_POSITION = 16
"""Ports in one PortMask: position ``q`` covers ports ``16*q .. 16*q+15`` (bit ``p - 16*q`` is port ``p``)."""

MLID_BASE = 0xC000
"""First multicast LID: MFT block ``b`` entry ``i`` is MLID ``0xC000 + 32*b + i``."""

MAX_MFT_ENTRIES = 0x4000
"""Multicast LIDs 0xC000..0xFFFF: the most entries a MulticastForwardingTable can have."""

VLARB_BLOCK_SIZE = 32
"""Entries per VLArbitrationTable block."""

SL2VL_SIZE = 8
"""Bytes of an SLtoVLMappingTable: 16 SLs of 4 bits."""

NODE_TYPES = {1: "Channel Adapter", 2: "Switch", 3: "Router"}
PORT_STATES = {0: "NoChange", 1: "Down", 2: "Initialize", 3: "Armed", 4: "Active"}
PHYS_STATES = {
    0: "NoChange",
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "PhyTest",
}
MTUS = {1: "256", 2: "512", 3: "1024", 4: "2048", 5: "4096"}
VL_CAPS = {1: "VL0", 2: "VL0-1", 3: "VL0-3", 4: "VL0-7", 5: "VL0-14"}
LINK_WIDTHS = {1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
LINK_SPEEDS = {1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps"}
LINK_SPEEDS_EXT = {1: "14.0625 Gbps", 2: "25.78125 Gbps", 4: "53.125 Gbps", 8: "106.25 Gbps"}
SM_STATES = {0: "NotActive", 1: "Discovering", 2: "Standby", 3: "Master"}

F = Field

NODE_INFO = Layout(
    "NodeInfo",
    40,
    [
        F("BaseVersion", 0, 8, ibmad="BaseVers"),
        F("ClassVersion", 8, 8, ibmad="ClassVers"),
        F("NodeType", 16, 8, values=NODE_TYPES),
        F("NumPorts", 24, 8),
        F("SystemImageGUID", 32, 64, ibmad="SystemGuid"),
        F("NodeGUID", 96, 64, ibmad="Guid"),
        F("PortGUID", 160, 64, ibmad="PortGuid"),
        F("PartitionCap", 224, 16, ibmad="PartCap"),
        F("DeviceID", 240, 16, fmt="hex", ibmad="DevId"),
        F("Revision", 256, 32, ibmad="Revision"),
        F("LocalPortNum", 288, 8, ibmad="LocalPort"),
        F("VendorID", 296, 24, fmt="hex", ibmad="VendorId"),
    ],
)

NODE_DESC = Layout("NodeDescription", 64, [F("NodeString", 0, 512, fmt="str", ibmad="NodeDesc")])

SWITCH_INFO = Layout(
    "SwitchInfo",
    20,
    [
        F("LinearFDBCap", 0, 16, ibmad="LinearFdbCap"),
        F("RandomFDBCap", 16, 16, ibmad="RandomFdbCap"),
        F("MulticastFDBCap", 32, 16, ibmad="McastFdbCap"),
        F("LinearFDBTop", 48, 16, ibmad="LinearFdbTop"),
        F("DefaultPort", 64, 8, ibmad="DefPort"),
        F("DefaultMulticastPrimaryPort", 72, 8, ibmad="DefMcastPrimPort"),
        F("DefaultMulticastNotPrimaryPort", 80, 8, ibmad="DefMcastNotPrimPort"),
        F("LifeTimeValue", 88, 5, ibmad="LifeTime"),
        F("PortStateChange", 93, 1, ibmad="StateChange"),
        F("OptimizedSLtoVLMappingProgramming", 94, 2, ibmad="OptSLtoVLMapping"),
        F("LIDsPerPort", 96, 16, ibmad="LidsPerPort"),
        F("PartitionEnforcementCap", 112, 16, ibmad="PartEnforceCap"),
        F("InboundEnforcementCap", 128, 1, ibmad="InboundPartEnf"),
        F("OutboundEnforcementCap", 129, 1, ibmad="OutboundPartEnf"),
        F("FilterRawInboundCap", 130, 1, ibmad="FilterRawInbound"),
        F("FilterRawOutboundCap", 131, 1, ibmad="FilterRawOutbound"),
        F("EnhancedPort0", 132, 1),
        F("MulticastFDBTop", 144, 16, fmt="hex"),
    ],
)

GUID_INFO = Layout("GUIDInfo", 64, [F(f"GUID{i}", 64 * i, 64, fmt="hex") for i in range(8)])

PORT_INFO = Layout(
    "PortInfo",
    64,
    [
        F("M_Key", 0, 64, ibmad="Mkey"),
        F("GIDPrefix", 64, 64, ibmad="GidPrefix"),
        F("LID", 128, 16, ibmad="Lid"),
        F("MasterSMLID", 144, 16, ibmad="SMLid"),
        F("CapabilityMask", 160, 32, ibmad="CapMask"),
        F("DiagCode", 192, 16, fmt="hex"),
        F("M_KeyLeasePeriod", 208, 16, ibmad="MkeyLeasePeriod"),
        F("LocalPortNum", 224, 8, ibmad="LocalPort"),
        F("LinkWidthEnabled", 232, 8, fmt="flags", values=LINK_WIDTHS),
        F("LinkWidthSupported", 240, 8, fmt="flags", values=LINK_WIDTHS),
        F("LinkWidthActive", 248, 8, fmt="flags", values=LINK_WIDTHS),
        F("LinkSpeedSupported", 256, 4, fmt="flags", values=LINK_SPEEDS),
        F("PortState", 260, 4, values=PORT_STATES, ibmad="LinkState"),
        F("PortPhysicalState", 264, 4, values=PHYS_STATES, ibmad="PhysLinkState"),
        F("LinkDownDefaultState", 268, 4, values=PHYS_STATES, ibmad="LinkDownDefState"),
        F("M_KeyProtectBits", 272, 2, ibmad="ProtectBits"),
        F("LMC", 277, 3),
        F("LinkSpeedActive", 280, 4, fmt="flags", values=LINK_SPEEDS),
        F("LinkSpeedEnabled", 284, 4, fmt="flags", values=LINK_SPEEDS),
        F("NeighborMTU", 288, 4, values=MTUS),
        F("MasterSMSL", 292, 4, ibmad="SMSL"),
        F("VLCap", 296, 4, values=VL_CAPS),
        F("InitType", 300, 4, fmt="hex"),
        F("VLHighLimit", 304, 8),
        F("VLArbitrationHighCap", 312, 8, ibmad="VLArbHighCap"),
        F("VLArbitrationLowCap", 320, 8, ibmad="VLArbLowCap"),
        F("InitTypeReply", 328, 4, fmt="hex", ibmad="InitReply"),
        F("MTUCap", 332, 4, values=MTUS, ibmad="MtuCap"),
        F("VLStallCount", 336, 3),
        F("HOQLife", 339, 5, ibmad="HoqLife"),
        F("OperationalVLs", 344, 4, values=VL_CAPS, ibmad="OperVLs"),
        F("PartitionEnforcementInbound", 348, 1, ibmad="PartEnforceInb"),
        F("PartitionEnforcementOutbound", 349, 1, ibmad="PartEnforceOutb"),
        F("FilterRawInbound", 350, 1, ibmad="FilterRawInb"),
        F("FilterRawOutbound", 351, 1, ibmad="FilterRawOutb"),
        F("M_KeyViolations", 352, 16, ibmad="MkeyViolations"),
        F("P_KeyViolations", 368, 16, ibmad="PkeyViolations"),
        F("Q_KeyViolations", 384, 16, ibmad="QkeyViolations"),
        F("GUIDCap", 400, 8, ibmad="GuidCap"),
        F("ClientReregister", 408, 1),
        F("MulticastPKeyTrapSuppressionEnabled", 409, 2, ibmad="McastPkeyTrapSuppressionEnabled"),
        F("SubnetTimeOut", 411, 5, ibmad="SubnetTimeout"),
        F("RespTimeValue", 419, 5, ibmad="RespTimeVal"),
        F("LocalPhyErrors", 424, 4, ibmad="LocalPhysErr"),
        F("OverrunErrors", 428, 4, ibmad="OverrunErr"),
        F("MaxCreditHint", 432, 16),
        F("LinkRoundTripLatency", 456, 24, ibmad="RoundTrip"),
        F("CapabilityMask2", 480, 16, fmt="hex"),
        F("LinkSpeedExtActive", 496, 4, values={0: "No Extended Speed", **LINK_SPEEDS_EXT}),
        F("LinkSpeedExtSupported", 500, 4, fmt="flags", values=LINK_SPEEDS_EXT),
        F("LinkSpeedExtEnabled", 507, 5, fmt="flags", values=LINK_SPEEDS_EXT),
    ],
)

LFT = Layout("LinearForwardingTable", 64, [F("PortBlock", 0, 512, fmt="bytes")])

PKEY_TABLE = Layout("P_KeyTable", 64, [F(f"P_Key{i}", 16 * i, 16, fmt="hex") for i in range(PKEY_BLOCK_SIZE)])
"""P_KeyTable (14.2.5.7): one block of 32 P_Keys (MembershipType in each top bit, P_KeyBase below).
AttributeModifier (:func:`pkey_table_mod`): block in bits 0-15, a switch's port in bits 16-23."""

SL2VL_TABLE = Layout("SLtoVLMappingTable", SL2VL_SIZE, [F(f"SL{i}toVL", 4 * i, 4) for i in range(16)])
"""SLtoVLMappingTable (14.2.5.8): the VL of each SL, SL0 in the top nibble of byte 0.
AttributeModifier (:func:`sl2vl_mod`): a switch's input port in bits 8-15, output port in bits 0-7."""

VLARB_TABLE = Layout(
    "VLArbitrationTable",
    64,
    [
        f
        for i in range(VLARB_BLOCK_SIZE)
        for f in (F(f"Entry{i}VL", 16 * i + 4, 4), F(f"Entry{i}Weight", 16 * i + 8, 8))
    ],
)
"""VLArbitrationTable (14.2.5.9): one block of 32 entries of 16 bits: 4 reserved, VL, Weight.
AttributeModifier (:func:`vlarb_mod`): block 1..4 in bits 16-31 (low priority entries 0-31 and
32-63, then high priority 0-31 and 32-63), a switch's port in bits 0-7."""

MFT = Layout("MulticastForwardingTable", 64, [F(f"PortMask{i}", 16 * i, 16, fmt="hex") for i in range(MFT_BLOCK_SIZE)])
"""MulticastForwardingTable (IBA 14.2.5): one block of 32 PortMasks, for MLIDs ``0xC000 + 32*block``
onwards. AttributeModifier (:func:`mft_mod`): block in bits 0-8, position (16 ports a mask) in bits
28-31."""

SM_INFO = Layout(
    "SMInfo",
    21,
    [
        F("GUID", 0, 64, ibmad="SmInfoGuid"),
        F("SM_Key", 64, 64, ibmad="SmInfoKey"),
        F("ActCount", 128, 32, fmt="uint", ibmad="SmActivity"),
        F("Priority", 160, 4, ibmad="SmPriority"),
        F("SMState", 164, 4, values=SM_STATES, ibmad="SmState"),
    ],
)

_NOTICE_HEAD = [
    F("IsGeneric", 0, 1, ibmad="NoticeIsGeneric"),
    F("Type", 1, 7, ibmad="NoticeType"),
    F("ProducerType", 8, 24, fmt="uint", ibmad="NoticeProducerType"),
    F("TrapNumber", 32, 16, ibmad="NoticeTrapNumber"),
    F("IssuerLID", 48, 16, ibmad="NoticeIssuerLID"),
    F("NoticeToggle", 64, 1, ibmad="NoticeToggle"),
    F("NoticeCount", 65, 15, ibmad="NoticeCount"),
    F("DataDetails", 80, 432, ibmad="NoticeDataDetails"),
]

NOTICE = Layout("Notice", 80, [*_NOTICE_HEAD, F("IssuerGID", 512, 128, ibmad="NoticeIssuerGID")])
"""The full 80-byte Notice (as SA carries it, with IssuerGID)."""

NOTICE_SMP = Layout("Notice", SMP_DATA_SIZE, _NOTICE_HEAD)
"""Notice as it fits an SMP's 64 data bytes: everything up to the IssuerGID."""

CLASS_PORT_INFO = Layout(
    "ClassPortInfo",
    72,
    [
        F("BaseVersion", 0, 8),
        F("ClassVersion", 8, 8),
        F("CapabilityMask", 16, 16, fmt="hex"),
        F("CapabilityMask2", 32, 27, fmt="hex"),
        F("RespTimeValue", 59, 5),
        F("RedirectGID", 64, 128),
        F("RedirectTC", 192, 8),
        F("RedirectSL", 200, 4),
        F("RedirectFL", 204, 20),
        F("RedirectLID", 224, 16),
        F("RedirectP_Key", 240, 16, fmt="hex"),
        F("RedirectQP", 264, 24),
        F("RedirectQ_Key", 288, 32),
        F("TrapGID", 320, 128),
        F("TrapTC", 448, 8),
        F("TrapSL", 456, 4),
        F("TrapFL", 460, 20),
        F("TrapLID", 480, 16),
        F("TrapP_Key", 496, 16, fmt="hex"),
        F("TrapHL", 512, 8),
        F("TrapQP", 520, 24),
        F("TrapQ_Key", 544, 32),
    ],
)

PORT_COUNTERS = Layout(
    "PortCounters",
    44,
    [
        F("PortSelect", 8, 8),
        F("CounterSelect", 16, 16, fmt="hex"),
        F("SymbolErrorCounter", 32, 16),
        F("LinkErrorRecoveryCounter", 48, 8),
        F("LinkDownedCounter", 56, 8),
        F("PortRcvErrors", 64, 16),
        F("PortRcvRemotePhysicalErrors", 80, 16),
        F("PortRcvSwitchRelayErrors", 96, 16),
        F("PortXmitDiscards", 112, 16),
        F("PortXmitConstraintErrors", 128, 8),
        F("PortRcvConstraintErrors", 136, 8),
        F("CounterSelect2", 144, 8, fmt="hex"),
        F("LocalLinkIntegrityErrors", 152, 4),
        F("ExcessiveBufferOverrunErrors", 156, 4),
        F("QP1Dropped", 160, 16),
        F("VL15Dropped", 176, 16),
        F("PortXmitData", 192, 32, fmt="uint"),
        F("PortRcvData", 224, 32, fmt="uint"),
        F("PortXmitPkts", 256, 32, fmt="uint"),
        F("PortRcvPkts", 288, 32, fmt="uint"),
        F("PortXmitWait", 320, 32, fmt="uint"),
    ],
)

PORT_COUNTERS_EXT = Layout(
    "PortCountersExtended",
    72,
    [
        F("PortSelect", 8, 8),
        F("CounterSelect", 16, 16, fmt="hex"),
        F("PortXmitData", 64, 64, fmt="uint"),
        F("PortRcvData", 128, 64, fmt="uint"),
        F("PortXmitPkts", 192, 64, fmt="uint"),
        F("PortRcvPkts", 256, 64, fmt="uint"),
        F("PortUnicastXmitPkts", 320, 64, fmt="uint"),
        F("PortUnicastRcvPkts", 384, 64, fmt="uint"),
        F("PortMulticastXmitPkts", 448, 64, fmt="uint"),
        F("PortMulticastRcvPkts", 512, 64, fmt="uint"),
    ],
)

del F

# PortCounters saturate instead of wrapping; these are the all-ones values per field.
PORT_COUNTERS_MAX: dict[str, int] = {
    f.name: f.max_value for f in PORT_COUNTERS.fields if f.name not in ("PortSelect", "CounterSelect")
}

ATTRIBUTES: dict[tuple[int, int], Layout] = {}
for _cls in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR):
    for _attr, _layout in (
        (SmpAttr.NOTICE, NOTICE_SMP),
        (SmpAttr.NODE_DESC, NODE_DESC),
        (SmpAttr.NODE_INFO, NODE_INFO),
        (SmpAttr.SWITCH_INFO, SWITCH_INFO),
        (SmpAttr.GUID_INFO, GUID_INFO),
        (SmpAttr.PORT_INFO, PORT_INFO),
        (SmpAttr.PKEY_TABLE, PKEY_TABLE),
        (SmpAttr.SL2VL_TABLE, SL2VL_TABLE),
        (SmpAttr.VLARB_TABLE, VLARB_TABLE),
        (SmpAttr.LFT, LFT),
        (SmpAttr.MFT, MFT),
        (SmpAttr.SM_INFO, SM_INFO),
    ):
        ATTRIBUTES[(int(_cls), int(_attr))] = _layout
ATTRIBUTES[(int(MgmtClass.PERF), int(PerfAttr.CLASS_PORT_INFO))] = CLASS_PORT_INFO
ATTRIBUTES[(int(MgmtClass.PERF), int(PerfAttr.PORT_COUNTERS))] = PORT_COUNTERS
ATTRIBUTES[(int(MgmtClass.PERF), int(PerfAttr.PORT_COUNTERS_EXT))] = PORT_COUNTERS_EXT


def layout_for(mgmt_class: int, attr_id: int) -> Layout:
    """The layout of attribute ``attr_id`` in class ``mgmt_class``; MadError if unknown."""
    try:
        return ATTRIBUTES[(mgmt_class, attr_id)]
    except KeyError:
        raise MadError(f"no layout for class {mgmt_class:#04x} attribute {attr_id:#06x}") from None


# --- NodeDescription ------------------------------------------------------


def node_desc_pack(text: str) -> bytes:
    """NodeDescription bytes: UTF-8 text, NUL padded to 64 bytes."""
    raw = text.encode("utf-8")
    if len(raw) > 64:
        raise FieldValueError(f"NodeDescription: {len(raw)} bytes, at most 64: {text[:70]!r}")
    return raw.ljust(64, b"\0")


def node_desc_unpack(buf: bytes, offset: int = 0) -> str:
    """NodeDescription text up to the first NUL."""
    raw = NODE_DESC.get(buf, "NodeString", offset)
    assert isinstance(raw, bytes)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


# --- LinearForwardingTable ------------------------------------------------


def lft_block_pack(ports: bytes | bytearray | Sequence[int] | np.ndarray) -> bytes:
    """One LFT block (64 egress ports, LID ``64*block + i`` in byte i) as attribute bytes."""
    if isinstance(ports, bytes | bytearray):
        raw = bytes(ports)
    else:
        arr = np.asarray(ports)
        if arr.dtype != np.uint8:
            if arr.size and (arr.min() < 0 or arr.max() > 255):
                raise FieldValueError("LinearForwardingTable: port numbers must be 0..255")
            arr = arr.astype(np.uint8)
        raw = arr.tobytes()
    if len(raw) != LFT_BLOCK_SIZE:
        raise FieldValueError(f"LinearForwardingTable: block needs {LFT_BLOCK_SIZE} ports, got {len(raw)}")
    return raw


def lft_block_unpack(buf: bytes, offset: int = 0) -> bytes:
    """The 64 egress ports of an LFT block (``np.frombuffer(..., np.uint8)`` for an array)."""
    raw = LFT.get(buf, "PortBlock", offset)
    assert isinstance(raw, bytes)
    return raw


# --- P_KeyTable, SLtoVLMappingTable, VLArbitrationTable, MulticastForwardingTable ---


def pkey_table_mod(block: int, port: int = 0) -> int:
    """P_KeyTable AttributeModifier: ``block`` (0..65535) and, on a switch, ``port`` (0..255)."""
    _check_mod("P_KeyTable block", block, 0xFFFF)
    _check_mod("P_KeyTable port", port, 0xFF)
    return port << 16 | block


def sl2vl_mod(in_port: int = 0, out_port: int = 0) -> int:
    """SLtoVLMappingTable AttributeModifier: a switch's input and output port (0 for a CA)."""
    _check_mod("SLtoVLMappingTable input port", in_port, 0xFF)
    _check_mod("SLtoVLMappingTable output port", out_port, 0xFF)
    return in_port << 8 | out_port


def vlarb_mod(block: int, port: int = 0) -> int:
    """VLArbitrationTable AttributeModifier: ``block`` 1..4 and, on a switch, ``port`` (0..255)."""
    if not 1 <= block <= 4:
        raise FieldValueError(f"VLArbitrationTable block: {block} is not 1..4")
    _check_mod("VLArbitrationTable port", port, 0xFF)
    return block << 16 | port


def mft_mod(block: int, position: int = 0) -> int:
    """MulticastForwardingTable AttributeModifier: ``block`` (0..511, 32 MLIDs each) and ``position`` (0..15)."""
    _check_mod("MulticastForwardingTable block", block, 0x1FF)
    _check_mod("MulticastForwardingTable position", position, 0xF)
    return position << 28 | block


def _check_mod(what: str, value: int, top: int) -> None:
    if not 0 <= value <= top:
        raise FieldValueError(f"{what}: {value} is not 0..{top}")


def _u16_block(name: str, values: Sequence[int] | np.ndarray, size: int) -> bytes:
    """Up to ``size`` 16-bit entries, big endian, zero padded to 64 bytes."""
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.size > size:
        raise FieldValueError(f"{name}: a block holds at most {size} entries, got shape {arr.shape}")
    if arr.size and (not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() > 0xFFFF):
        raise FieldValueError(f"{name}: entries must be integers 0..0xFFFF")
    return arr.astype(">u2").tobytes().ljust(64, b"\0")


def pkey_block_pack(pkeys: Sequence[int] | np.ndarray) -> bytes:
    """One P_KeyTable block from up to 32 P_Keys (the rest 0)."""
    return _u16_block("P_KeyTable", pkeys, PKEY_BLOCK_SIZE)


def pkey_block_unpack(buf: bytes, offset: int = 0) -> npt.NDArray[np.uint16]:
    """The 32 P_Keys of a P_KeyTable block, ``uint16``."""
    return _u16_unpack(PKEY_TABLE, buf, offset)


def mft_block_pack(port_masks: Sequence[int] | np.ndarray) -> bytes:
    """One MulticastForwardingTable block from up to 32 PortMasks (the rest 0)."""
    return _u16_block("MulticastForwardingTable", port_masks, MFT_BLOCK_SIZE)


def mft_block_unpack(buf: bytes, offset: int = 0) -> npt.NDArray[np.uint16]:
    """The 32 PortMasks of a MulticastForwardingTable block, ``uint16``."""
    return _u16_unpack(MFT, buf, offset)


def _u16_unpack(layout: Layout, buf: bytes, offset: int) -> npt.NDArray[np.uint16]:
    if len(buf) < offset + layout.size:
        raise MadError(f"{layout.name}: need {layout.size} bytes at offset {offset}, buffer has {len(buf)} bytes")
    return np.frombuffer(buf, ">u2", layout.size // 2, offset).astype(np.uint16)


def sl2vl_pack(vls: Sequence[int] | np.ndarray) -> bytes:
    """An SLtoVLMappingTable from the VL of each of the 16 SLs (0..15; 15 drops the SL's packets)."""
    arr = np.asarray(vls)
    if arr.shape != (16,) or not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() > 15:
        raise FieldValueError(f"SLtoVLMappingTable: needs 16 VLs 0..15, got {arr.tolist()!r}")
    pairs = arr.astype(np.uint8).reshape(8, 2)
    return (pairs[:, 0] << 4 | pairs[:, 1]).astype(np.uint8).tobytes()


def sl2vl_unpack(buf: bytes, offset: int = 0) -> npt.NDArray[np.uint8]:
    """The VL of each of the 16 SLs, ``uint8[16]``."""
    if len(buf) < offset + SL2VL_SIZE:
        raise MadError(f"SLtoVLMappingTable: need {SL2VL_SIZE} bytes at offset {offset}, buffer has {len(buf)} bytes")
    raw = np.frombuffer(buf, np.uint8, SL2VL_SIZE, offset)
    return np.stack([raw >> 4, raw & 0xF], axis=1).ravel()


def vlarb_block_pack(entries: Sequence[tuple[int, int]] | np.ndarray) -> bytes:
    """One VLArbitrationTable block from up to 32 ``(VL, Weight)`` pairs (the rest 0)."""
    arr = np.asarray(entries)
    if arr.size == 0:
        return bytes(64)
    if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] > VLARB_BLOCK_SIZE:
        raise FieldValueError(f"VLArbitrationTable: needs up to 32 (VL, Weight) pairs, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr[:, 0].max() > 15 or arr[:, 1].max() > 255:
        raise FieldValueError("VLArbitrationTable: VLs must be 0..15 and weights 0..255")
    return arr.astype(np.uint8).tobytes().ljust(64, b"\0")


def vlarb_block_unpack(buf: bytes, offset: int = 0) -> npt.NDArray[np.uint8]:
    """The 32 ``(VL, Weight)`` entries of a VLArbitrationTable block, ``uint8[32, 2]`` (reserved bits dropped)."""
    if len(buf) < offset + VLARB_TABLE.size:
        raise MadError(f"VLArbitrationTable: need 64 bytes at offset {offset}, buffer has {len(buf)} bytes")
    out = np.frombuffer(buf, np.uint8, VLARB_TABLE.size, offset).reshape(VLARB_BLOCK_SIZE, 2).copy()
    out[:, 0] &= 0xF
    return out


# --- Notice / traps -------------------------------------------------------


def notice_pack(
    trap_number: int,
    issuer_lid: int,
    details: bytes = b"",
    *,
    notice_type: int = NoticeType.URGENT,
    producer_type: int = ProducerType.SWITCH,
    toggle: int = 0,
    count: int = 0,
) -> bytes:
    """A generic Notice for an SMP (64 bytes); ``details`` fill DataDetails (up to 54 bytes)."""
    if len(details) > 54:
        raise FieldValueError(f"Notice.DataDetails: {len(details)} bytes, at most 54")
    return NOTICE_SMP.pack(
        {
            "IsGeneric": 1,
            "Type": notice_type,
            "ProducerType": producer_type,
            "TrapNumber": trap_number,
            "IssuerLID": issuer_lid,
            "NoticeToggle": toggle,
            "NoticeCount": count,
            "DataDetails": bytes(details).ljust(54, b"\0"),
        }
    )


def trap128_pack(issuer_lid: int, *, lid: int | None = None, toggle: int = 0, count: int = 0) -> bytes:
    """Trap 128 (link state change) from a switch: DataDetails bytes 0-1 carry LIDADDR."""
    lidaddr = issuer_lid if lid is None else lid
    _check_u16("Trap128.LIDADDR", lidaddr)
    return notice_pack(Trap.LINK_STATE_CHANGE, issuer_lid, lidaddr.to_bytes(2, "big"), toggle=toggle, count=count)


def trap_port_pack(
    trap_number: int,
    issuer_lid: int,
    port: int,
    *,
    producer_type: int = ProducerType.SWITCH,
    toggle: int = 0,
    count: int = 0,
) -> bytes:
    """Traps 129-131 (link integrity, buffer overrun, flow control watchdog): LIDADDR, PORTNO."""
    _check_u16("Trap.LIDADDR", issuer_lid)
    if not 0 <= port <= 255:
        raise FieldValueError(f"Trap{trap_number}.PORTNO: {port} is not 0..255")
    details = b"\0\0" + issuer_lid.to_bytes(2, "big") + bytes([port])
    return notice_pack(trap_number, issuer_lid, details, producer_type=producer_type, toggle=toggle, count=count)


def trap144_pack(
    issuer_lid: int,
    capability_mask: int,
    *,
    other_local_changes: bool = False,
    change_flags: int = 0,
    capability_mask2: int = 0,
    producer_type: int = ProducerType.CA,
    toggle: int = 0,
    count: int = 0,
) -> bytes:
    """Trap 144 (CapabilityMask / local change): LIDADDR, OtherLocalChanges, CapabilityMask,
    change flags (NodeDescription 0x1, LinkWidthEnabled 0x2, LinkSpeedEnabled 0x4) and CapabilityMask2."""
    _check_u16("Trap144.LIDADDR", issuer_lid)
    if not 0 <= capability_mask <= 0xFFFFFFFF:
        raise FieldValueError(f"Trap144.CapabilityMask: {capability_mask:#x} does not fit 32 bits")
    _check_u16("Trap144.ChangeFlags", change_flags)
    _check_u16("Trap144.CapabilityMask2", capability_mask2)
    details = (
        b"\0\0"
        + issuer_lid.to_bytes(2, "big")
        + bytes([0, 1 if other_local_changes else 0])
        + capability_mask.to_bytes(4, "big")
        + change_flags.to_bytes(2, "big")
        + capability_mask2.to_bytes(2, "big")
    )
    return notice_pack(
        Trap.CAPABILITY_MASK_CHANGE, issuer_lid, details, producer_type=producer_type, toggle=toggle, count=count
    )


TRAP256_PATH_MAX = 30
"""Ports of a directed route's ReturnPath that fit Trap 256's DRReturnPath."""


def trap256_pack(
    issuer_lid: int,
    *,
    lid: int,
    method: int,
    attr_id: int,
    attr_mod: int,
    m_key: int,
    dr_slid: int | None = None,
    dr_return_path: Sequence[int] = (),
    producer_type: int = ProducerType.CA,
    toggle: int = 0,
    count: int = 0,
) -> bytes:
    """Trap 256 (bad M_Key), a security Notice: the requester's LIDADDR, its DRSLID, Method,
    AttributeID, AttributeModifier and M_Key, and for a directed-route SMP (``dr_slid`` given)
    DRNotice, DRPathTruncated, DRHopCount and DRReturnPath (its ReturnPath ports 1..hop count;
    beyond 30 hops the first 30, DRPathTruncated set and DRHopCount 30, as the Linux SMAs
    send it). DataDetails bytes: 2 LIDADDR, 4 DRSLID, 6 Method, 8 AttributeID,
    10 AttributeModifier, 14 M_Key, 23 DRNotice|DRPathTruncated|DRHopCount, 24 DRReturnPath."""
    _check_u16("Trap256.LIDADDR", lid)
    _check_u16("Trap256.DRSLID", dr_slid or 0)
    _check_u16("Trap256.AttributeID", attr_id)
    if not 0 <= method <= 0xFF:
        raise FieldValueError(f"Trap256.Method: {method} is not 0..255")
    if not 0 <= attr_mod <= 0xFFFFFFFF:
        raise FieldValueError(f"Trap256.AttributeModifier: {attr_mod:#x} does not fit 32 bits")
    if not 0 <= m_key < 1 << 64:
        raise FieldValueError(f"Trap256.M_Key: {m_key:#x} does not fit 64 bits")
    hops = len(dr_return_path)
    if hops > 63 or any(not 0 <= p <= 255 for p in dr_return_path):
        raise FieldValueError(f"Trap256.DRReturnPath: {list(dr_return_path)!r} is no directed route")
    dr = 0
    if dr_slid is not None:
        dr = 0x80 | (0x40 if hops > TRAP256_PATH_MAX else 0) | min(hops, TRAP256_PATH_MAX)
    details = (
        b"\0\0"
        + lid.to_bytes(2, "big")
        + (dr_slid or 0).to_bytes(2, "big")
        + bytes([method, 0])
        + attr_id.to_bytes(2, "big")
        + attr_mod.to_bytes(4, "big")
        + m_key.to_bytes(8, "big")
        + bytes([0, dr])
        + bytes(dr_return_path[:TRAP256_PATH_MAX] if dr_slid is not None else ())
    )
    return notice_pack(
        Trap.BAD_M_KEY,
        issuer_lid,
        details,
        notice_type=NoticeType.SECURITY,
        producer_type=producer_type,
        toggle=toggle,
        count=count,
    )


def notice_unpack(buf: bytes, offset: int = 0) -> dict[str, Any]:
    """A Notice from SMP data, with the trap-specific DataDetails decoded for traps 128-131, 144 and 256.

    Extra keys: ``LIDADDR`` (128-131, 144, 256), ``PORTNO`` (129-131), ``OtherLocalChanges``,
    ``NewCapabilityMask``, ``ChangeFlags``, ``NewCapabilityMask2`` (144), ``DRSLID``, ``Method``,
    ``AttributeID``, ``AttributeModifier``, ``M_Key``, ``DRNotice``, ``DRPathTruncated``,
    ``DRHopCount``, ``DRReturnPath`` (256).
    """
    n: dict[str, Any] = dict(NOTICE_SMP.unpack(buf, offset))
    d: bytes = n["DataDetails"]
    if n["IsGeneric"]:
        trap = n["TrapNumber"]
        if trap == Trap.LINK_STATE_CHANGE:
            n["LIDADDR"] = int.from_bytes(d[0:2], "big")
        elif trap in (Trap.LOCAL_LINK_INTEGRITY, Trap.EXCESSIVE_BUFFER_OVERRUN, Trap.FLOW_CONTROL_UPDATE_WATCHDOG):
            n["LIDADDR"] = int.from_bytes(d[2:4], "big")
            n["PORTNO"] = d[4]
        elif trap == Trap.CAPABILITY_MASK_CHANGE:
            n["LIDADDR"] = int.from_bytes(d[2:4], "big")
            n["OtherLocalChanges"] = d[5] & 1
            n["NewCapabilityMask"] = int.from_bytes(d[6:10], "big")
            n["ChangeFlags"] = int.from_bytes(d[10:12], "big")
            n["NewCapabilityMask2"] = int.from_bytes(d[12:14], "big")
        elif trap == Trap.BAD_M_KEY:
            n["LIDADDR"] = int.from_bytes(d[2:4], "big")
            n["DRSLID"] = int.from_bytes(d[4:6], "big")
            n["Method"] = d[6]
            n["AttributeID"] = int.from_bytes(d[8:10], "big")
            n["AttributeModifier"] = int.from_bytes(d[10:14], "big")
            n["M_Key"] = int.from_bytes(d[14:22], "big")
            n["DRNotice"] = d[23] >> 7
            n["DRPathTruncated"] = d[23] >> 6 & 1
            n["DRHopCount"] = d[23] & 0x3F
            n["DRReturnPath"] = list(d[24 : 24 + min(d[23] & 0x3F, TRAP256_PATH_MAX)])
    return n


def _check_u16(what: str, value: int) -> None:
    if not 0 <= value <= 0xFFFF:
        raise FieldValueError(f"{what}: {value} does not fit 16 bits")


def unpack_attribute(mgmt_class: int, attr_id: int, data: bytes) -> dict[str, FieldValue]:
    """Decode attribute data with the registered layout (MadError if the attribute is unknown)."""
    return layout_for(mgmt_class, attr_id).unpack(data)
