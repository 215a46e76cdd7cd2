"""SA codec and RMPP: golden record bytes built by hand from the IBA 15.2.5 offsets, component
mask bits against OpenSM's ib_types.h (and the kernel's ib_sa.h), SA MAD round trips, the
masked-match semantics, segmentation as the kernel does it, and reassembly through lost and
repeated segments."""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.mad import MadError
from fabric.mad.attributes import NODE_INFO, PORT_INFO
from fabric.mad.rmpp import (
    RMPP_VERSION,
    RmppError,
    RmppFlags,
    RmppReceiver,
    RmppSender,
    RmppStatus,
    RmppType,
    abort_mad,
    ack_mad,
    segments,
)
from fabric.mad.sa import (
    ATTRIBUTE_OFFSETS,
    COMPONENTS,
    NODE_RECORD,
    PATH_RECORD,
    PORT_INFO_RECORD,
    RECORDS,
    RMPP_HEADER,
    SA_CLASS,
    SA_DATA_OFFSET,
    SA_FIELDS,
    SA_HEADER,
    SaAttr,
    SaMethod,
    SaStatus,
    component_bit,
    component_fields,
    component_mask,
    dump_sa,
    match_mask,
    matches,
    parse_sa,
    query_key,
    sa_mad,
    sa_response,
    split_records,
    undefined_components,
)

# --- golden records -----------------------------------------------------------

GUID = 0x0002C903004A1B00


def _node_record(lid: int, node_type: int, guid: int, desc: str, ports: int = 36) -> tuple[bytes, dict[str, object]]:
    """A NodeRecord built with struct from the spec's byte map: LID, reserved 16, NodeInfo, NodeDescription."""
    raw = (
        struct.pack(">HH", lid, 0)
        + struct.pack(">BBBBQQQHHII", 1, 1, node_type, ports, guid, guid, guid + 1, 8, 0xC738, 0xA0,
                      (1 << 24) | 0x0002C9)
        + desc.encode().ljust(64, b"\0")
    )
    values = {
        "LID": lid, "BaseVersion": 1, "ClassVersion": 1, "NodeType": node_type, "NumPorts": ports,
        "SystemImageGUID": guid, "NodeGUID": guid, "PortGUID": guid + 1, "PartitionCap": 8, "DeviceID": 0xC738,
        "Revision": 0xA0, "LocalPortNum": 1, "VendorID": 0x0002C9, "NodeDescription": desc.encode().ljust(64, b"\0"),
    }
    return raw, values


def test_node_record_golden() -> None:
    raw, values = _node_record(0x0012, 2, GUID, "switch-1")
    assert len(raw) == NODE_RECORD.size == 108
    assert NODE_RECORD.pack(values) == raw
    assert NODE_RECORD.unpack(raw) == values
    # The embedded NodeInfo decodes the same as the SMP attribute at bytes 4..43.
    ni = NODE_INFO.unpack(raw[4:44])
    assert {k: values[k] for k in ni} == ni


PIR_VALUES: dict[str, int] = {
    "EndportLID": 0x0007, "PortNum": 3, "Options": 0x00,
    "M_Key": 0x1122334455667788, "GIDPrefix": 0xFE80000000000000, "LID": 0x0007, "MasterSMLID": 0x0001,
    "CapabilityMask": 0x0251084A, "DiagCode": 0x0000, "M_KeyLeasePeriod": 15, "LocalPortNum": 3,
    "LinkWidthEnabled": 3, "LinkWidthSupported": 3, "LinkWidthActive": 2,
    "LinkSpeedSupported": 7, "PortState": 4, "PortPhysicalState": 5, "LinkDownDefaultState": 2,
    "M_KeyProtectBits": 1, "LMC": 2, "LinkSpeedActive": 4, "LinkSpeedEnabled": 7,
    "NeighborMTU": 5, "MasterSMSL": 0, "VLCap": 4, "InitType": 0,
    "VLHighLimit": 0, "VLArbitrationHighCap": 8, "VLArbitrationLowCap": 8,
    "InitTypeReply": 0, "MTUCap": 5, "VLStallCount": 7, "HOQLife": 19,
    "OperationalVLs": 4, "PartitionEnforcementInbound": 1, "PartitionEnforcementOutbound": 1,
    "FilterRawInbound": 0, "FilterRawOutbound": 1,
    "M_KeyViolations": 0x0102, "P_KeyViolations": 0x0304, "Q_KeyViolations": 0x0506, "GUIDCap": 32,
    "ClientReregister": 1, "MulticastPKeyTrapSuppressionEnabled": 2, "SubnetTimeOut": 18, "RespTimeValue": 16,
    "LocalPhyErrors": 8, "OverrunErrors": 6, "MaxCreditHint": 0x00AB, "LinkRoundTripLatency": 0x00ABCDEF,
    "CapabilityMask2": 0x0012, "LinkSpeedExtActive": 1, "LinkSpeedExtSupported": 3, "LinkSpeedExtEnabled": 0x1E,
}


def _port_info_record_bytes(v: dict[str, int]) -> bytes:
    """PortInfoRecord from the spec's byte map of PortInfo (14.2.5.6), nibble by nibble."""
    pi = struct.pack(
        ">QQHHIHHBBBB", v["M_Key"], v["GIDPrefix"], v["LID"], v["MasterSMLID"], v["CapabilityMask"], v["DiagCode"],
        v["M_KeyLeasePeriod"], v["LocalPortNum"], v["LinkWidthEnabled"], v["LinkWidthSupported"],
        v["LinkWidthActive"],
    ) + bytes([
        v["LinkSpeedSupported"] << 4 | v["PortState"],
        v["PortPhysicalState"] << 4 | v["LinkDownDefaultState"],
        v["M_KeyProtectBits"] << 6 | v["LMC"],
        v["LinkSpeedActive"] << 4 | v["LinkSpeedEnabled"],
        v["NeighborMTU"] << 4 | v["MasterSMSL"],
        v["VLCap"] << 4 | v["InitType"],
        v["VLHighLimit"], v["VLArbitrationHighCap"], v["VLArbitrationLowCap"],
        v["InitTypeReply"] << 4 | v["MTUCap"],
        v["VLStallCount"] << 5 | v["HOQLife"],
        v["OperationalVLs"] << 4 | v["PartitionEnforcementInbound"] << 3 | v["PartitionEnforcementOutbound"] << 2
        | v["FilterRawInbound"] << 1 | v["FilterRawOutbound"],
    ]) + struct.pack(">HHHB", v["M_KeyViolations"], v["P_KeyViolations"], v["Q_KeyViolations"], v["GUIDCap"]) + bytes([
        v["ClientReregister"] << 7 | v["MulticastPKeyTrapSuppressionEnabled"] << 5 | v["SubnetTimeOut"],
        v["RespTimeValue"],
        v["LocalPhyErrors"] << 4 | v["OverrunErrors"],
    ]) + struct.pack(">HIH", v["MaxCreditHint"], v["LinkRoundTripLatency"], v["CapabilityMask2"]) + bytes([
        v["LinkSpeedExtActive"] << 4 | v["LinkSpeedExtSupported"],
        v["LinkSpeedExtEnabled"],
    ])
    assert len(pi) == 64
    return struct.pack(">HBB", v["EndportLID"], v["PortNum"], v["Options"]) + pi


def test_port_info_record_golden() -> None:
    raw = _port_info_record_bytes(PIR_VALUES)
    assert len(raw) == PORT_INFO_RECORD.size == 68
    assert PORT_INFO_RECORD.pack(PIR_VALUES) == raw
    assert PORT_INFO_RECORD.unpack(raw) == PIR_VALUES
    assert PORT_INFO.unpack(raw[4:]) == {k: PIR_VALUES[k] for k in PORT_INFO.names}


PR_VALUES: dict[str, int | bytes] = {
    "ServiceID": 0x1000000000000001, "DGID": bytes.fromhex("fe800000000000000002c903004a1b01"),
    "SGID": bytes.fromhex("fe800000000000000002c903004a1b02"), "DLID": 0x0021, "SLID": 0x0022,
    "RawTraffic": 0, "FlowLabel": 0x12345, "HopLimit": 0xFF, "TClass": 0x20, "Reversible": 1, "NumbPath": 0x7F,
    "P_Key": 0xFFFF, "QoSClass": 0xABC, "SL": 5, "MTUSelector": 2, "MTU": 4, "RateSelector": 2, "Rate": 7,
    "PacketLifeTimeSelector": 2, "PacketLifeTime": 18, "Preference": 1,
}


def _path_record_bytes(v: dict[str, int | bytes]) -> bytes:
    def i(name: str) -> int:
        x = v[name]
        assert isinstance(x, int)
        return x

    def b(name: str) -> bytes:
        x = v[name]
        assert isinstance(x, bytes)
        return x

    raw = (
        struct.pack(">Q", i("ServiceID")) + b("DGID") + b("SGID")
        + struct.pack(">HHIBBHHBBBB", i("DLID"), i("SLID"),
                      i("RawTraffic") << 31 | i("FlowLabel") << 8 | i("HopLimit"),
                      i("TClass"), i("Reversible") << 7 | i("NumbPath"), i("P_Key"), i("QoSClass") << 4 | i("SL"),
                      i("MTUSelector") << 6 | i("MTU"), i("RateSelector") << 6 | i("Rate"),
                      i("PacketLifeTimeSelector") << 6 | i("PacketLifeTime"), i("Preference"))
        + bytes(6)
    )
    assert len(raw) == 64
    return raw


def test_path_record_golden() -> None:
    raw = _path_record_bytes(PR_VALUES)
    assert PATH_RECORD.pack(PR_VALUES) == raw
    assert PATH_RECORD.unpack(raw) == PR_VALUES
    # libibmad fields.c: PathRecDLid BITSOFFS(320,16), PathRecNumPath BITSOFFS(393,7).
    assert PATH_RECORD.field("DLID").offset == 320
    assert PATH_RECORD.field("NumbPath").offset == 393


def test_record_sizes_and_attribute_offsets() -> None:
    # (spec size, AttributeOffset = what OpenSM puts on the wire: sizeof its padded struct / 8)
    expected = {
        SaAttr.NODE_RECORD: (108, 14), SaAttr.PORT_INFO_RECORD: (68, 9), SaAttr.SL2VL_TABLE_RECORD: (16, 2),
        SaAttr.SWITCH_INFO_RECORD: (24, 3), SaAttr.LFT_RECORD: (72, 9), SaAttr.MFT_RECORD: (72, 9),
        SaAttr.SM_INFO_RECORD: (25, 4), SaAttr.LINK_RECORD: (6, 1), SaAttr.GUID_INFO_RECORD: (72, 9),
        SaAttr.SERVICE_RECORD: (176, 22), SaAttr.PKEY_TABLE_RECORD: (72, 9), SaAttr.PATH_RECORD: (64, 8),
        SaAttr.VLARB_TABLE_RECORD: (72, 9), SaAttr.MCMEMBER_RECORD: (52, 7), SaAttr.INFORM_INFO_RECORD: (60, 8),
        SaAttr.INFORM_INFO: (36, 5), SaAttr.MULTIPATH_RECORD: (200, 25), SaAttr.CLASS_PORT_INFO: (72, 9),
        SaAttr.NOTICE: (80, 10),
    }
    for attr, (size, offset) in expected.items():
        assert (RECORDS[attr].size, ATTRIBUTE_OFFSETS[attr]) == (size, offset), SaAttr(attr).name


# --- constants ----------------------------------------------------------------


def test_constants_match_ib_types_h() -> None:
    # IB_SA_MAD_STATUS_* and IB_MAD_STATUS_* (ib_types.h)
    assert SaStatus.ERR_NO_RESOURCES == 0x0100 and SaStatus.ERR_REQ_INVALID == 0x0200
    assert SaStatus.ERR_NO_RECORDS == 0x0300 and SaStatus.ERR_TOO_MANY_RECORDS == 0x0400
    assert SaStatus.ERR_REQ_INVALID_GID == 0x0500 and SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS == 0x0600
    assert SaStatus.ERR_REQ_DENIED == 0x0700 and SaStatus.INVALID_FIELD == 0x001C
    # IB_MAD_METHOD_GETTABLE 0x12 / _RESP 0x92, GETMULTI 0x14 / 0x94, DELETE 0x15, REPORT_RESP 0x86
    assert (SaMethod.GET_TABLE, SaMethod.GET_TABLE_RESP, SaMethod.GET_MULTI_RESP) == (0x12, 0x92, 0x94)
    assert (SaMethod.DELETE, SaMethod.DELETE_RESP, SaMethod.GET_TRACE_TABLE) == (0x15, 0x95, 0x13)
    # IB_MAD_ATTR_*_RECORD
    assert (SaAttr.PKEY_TABLE_RECORD, SaAttr.MULTIPATH_RECORD, SaAttr.INFORM_INFO_RECORD) == (0x33, 0x3A, 0xF3)
    # IB_RMPP_STATUS_*: T2L 118 ... UNSPEC 127; the kernel's IB_MGMT_RMPP_STATUS_* are the same numbers.
    assert (RmppStatus.T2L, RmppStatus.BAD_LEN, RmppStatus.BAD_SEG, RmppStatus.BADT) == (118, 119, 120, 121)
    assert (RmppStatus.W2S, RmppStatus.S2B, RmppStatus.BAD_STATUS, RmppStatus.UNV) == (122, 123, 124, 125)
    assert (RmppStatus.TMR, RmppStatus.UNSPEC, RmppStatus.RESX) == (126, 127, 1)
    assert (RmppType.DATA, RmppType.ACK, RmppType.STOP, RmppType.ABORT) == (1, 2, 3, 4)
    assert (RmppFlags.ACTIVE, RmppFlags.FIRST, RmppFlags.LAST) == (1, 2, 4)


# --- component masks ----------------------------------------------------------


def _bits(attr: int, table: dict[int, str | None]) -> None:
    names = COMPONENTS[attr]
    for bit, name in table.items():
        assert names[bit] == name, f"{SaAttr(attr).name} bit {bit}: {names[bit]} != {name}"


def test_path_record_components() -> None:
    # ib_types.h IB_PR_COMPMASK_*: SERVICEID_MSB 0, SERVICEID_LSB 1, DGID 2, SGID 3, DLID 4, SLID 5,
    # RAWTRAFFIC 6, RESV0 7, FLOWLABEL 8, HOPLIMIT 9, TCLASS 10, REVERSIBLE 11, NUMBPATH 12, PKEY 13,
    # QOS_CLASS 14, SL 15, MTUSELEC 16, MTU 17, RATESELEC 18, RATE 19, PKTLIFETIMESELEC 20,
    # PKTLIFETIME 21; the kernel's ib_sa.h IB_SA_PATH_REC_PREFERENCE 22.
    _bits(SaAttr.PATH_RECORD, {
        0: "ServiceID", 1: "ServiceID", 2: "DGID", 3: "SGID", 4: "DLID", 5: "SLID", 6: "RawTraffic", 7: None,
        8: "FlowLabel", 9: "HopLimit", 10: "TClass", 11: "Reversible", 12: "NumbPath", 13: "P_Key",
        14: "QoSClass", 15: "SL", 16: "MTUSelector", 17: "MTU", 18: "RateSelector", 19: "Rate",
        20: "PacketLifeTimeSelector", 21: "PacketLifeTime", 22: "Preference",
    })
    assert component_bit(SaAttr.PATH_RECORD, "ServiceID") == 0b11
    # IB_PR_DEF_MASK-like query (DGID | SGID | NUMBPATH) selects three fields.
    sel = component_fields(SaAttr.PATH_RECORD, 1 << 2 | 1 << 3 | 1 << 12)
    assert [f.name for f in sel] == ["DGID", "SGID", "NumbPath"]


def test_node_record_components() -> None:
    # IB_NR_COMPMASK_*: LID 0, RESERVED1 1, BASEVERSION 2, CLASSVERSION 3, NODETYPE 4, NUMPORTS 5,
    # SYSIMAGEGUID 6, NODEGUID 7, PORTGUID 8, PARTCAP 9, DEVID 10, REV 11, PORTNUM 12, VENDID 13, NODEDESC 14
    _bits(SaAttr.NODE_RECORD, {
        0: "LID", 1: None, 2: "BaseVersion", 3: "ClassVersion", 4: "NodeType", 5: "NumPorts",
        6: "SystemImageGUID", 7: "NodeGUID", 8: "PortGUID", 9: "PartitionCap", 10: "DeviceID", 11: "Revision",
        12: "LocalPortNum", 13: "VendorID", 14: "NodeDescription",
    })
    assert len(COMPONENTS[SaAttr.NODE_RECORD]) == 15
    f = component_fields(SaAttr.NODE_RECORD, 1 << 8)[0]
    assert (f.name, f.offset, f.width) == ("PortGUID", 32 + 160, 64)


def test_mcmember_record_components() -> None:
    # IB_MCR_COMPMASK_*: MGID 0, PORT_GID 1, QKEY 2, MLID 3, MTU_SEL 4, MTU 5, TCLASS 6, PKEY 7, RATE_SEL 8,
    # RATE 9, LIFE_SEL 10, LIFE 11, SL 12, FLOW 13, HOP 14, SCOPE 15, JOIN_STATE 16, PROXY 17
    _bits(SaAttr.MCMEMBER_RECORD, dict(enumerate([
        "MGID", "PortGID", "Q_Key", "MLID", "MTUSelector", "MTU", "TClass", "P_Key", "RateSelector", "Rate",
        "PacketLifeTimeSelector", "PacketLifeTime", "SL", "FlowLabel", "HopLimit", "Scope", "JoinState",
        "ProxyJoin",
    ])))


def test_service_record_components() -> None:
    # IB_SR_COMPMASK_*: SID 0, SGID 1, SPKEY 2, RES1 3, SLEASE 4, SKEY 5, SNAME 6, SDATA8_0..15 7..22,
    # SDATA16_0..7 23..30, SDATA32_0..3 31..34, SDATA64_0..1 35..36
    table: dict[int, str | None] = {
        0: "ServiceID", 1: "ServiceGID", 2: "ServiceP_Key", 3: None, 4: "ServiceLease", 5: "ServiceKey",
        6: "ServiceName",
    }
    table.update({7 + i: f"ServiceData8_{i}" for i in range(16)})
    table.update({23 + i: f"ServiceData16_{i}" for i in range(8)})
    table.update({31 + i: f"ServiceData32_{i}" for i in range(4)})
    table.update({35 + i: f"ServiceData64_{i}" for i in range(2)})
    _bits(SaAttr.SERVICE_RECORD, table)
    assert len(COMPONENTS[SaAttr.SERVICE_RECORD]) == 37


def test_other_components() -> None:
    # IB_PIR_COMPMASK_* (OpenSM master): LID 0, PORTNUM 1, OPTIONS 2, MKEY 3, GIDPRE 4, BASELID 5, SMLID 6,
    # CAPMASK 7, ..., MKEYPROTBITS 18, RESV2 19, LMC 20, ..., MTUCAP 31, ..., GUIDCAP 42, CLIENTREREG 43,
    # RESV3 44, SUBNTO 45, RESV4 46, RESPTIME 47, LOCALPHYERR 48, OVERRUNERR 49, MAXCREDHINT 50, RESV5 51,
    # LINKRTLAT 52, CAPMASK2 53, LINKSPDEXTACT 54, LINKSPDEXTSUPP 55, RESV7 56, LINKSPDEXTENAB 57
    _bits(SaAttr.PORT_INFO_RECORD, {
        0: "EndportLID", 1: "PortNum", 2: "Options", 3: "M_Key", 4: "GIDPrefix", 5: "LID", 6: "MasterSMLID",
        7: "CapabilityMask", 15: "PortState", 18: "M_KeyProtectBits", 19: None, 20: "LMC", 31: "MTUCap",
        42: "GUIDCap", 43: "ClientReregister", 45: "SubnetTimeOut", 46: None, 47: "RespTimeValue",
        48: "LocalPhyErrors", 49: "OverrunErrors", 50: "MaxCreditHint", 51: None, 52: "LinkRoundTripLatency",
        53: "CapabilityMask2", 54: "LinkSpeedExtActive", 55: "LinkSpeedExtSupported", 56: None,
        57: "LinkSpeedExtEnabled",
    })
    # IB_SMIR_COMPMASK_*: LID 0, RESV0 1, GUID 2, SMKEY 3, ACTCOUNT 4, PRIORITY 5, SMSTATE 6
    _bits(SaAttr.SM_INFO_RECORD, dict(enumerate(["LID", None, "GUID", "SM_Key", "ActCount", "Priority", "SMState"])))
    # IB_IIR_COMPMASK_*: SUBSCRIBERGID 0, ENUM 1, RESV0 2, GID 3, LIDRANGEBEGIN 4, LIDRANGEEND 5, RESV1 6,
    # ISGENERIC 7, SUBSCRIBE 8, TYPE 9, TRAPNUMB 10, QPN 11, RESV2 12, RESPTIME 13, RESV3 14, PRODTYPE 15
    _bits(SaAttr.INFORM_INFO_RECORD, dict(enumerate([
        "SubscriberGID", "Enum", None, "GID", "LIDRangeBegin", "LIDRangeEnd", None, "IsGeneric", "Subscribe",
        "Type", "TrapNumber", "QPN", None, "RespTimeValue", None, "ProducerType",
    ])))
    # IB_GIR_COMPMASK_*: LID 0, BLOCKNUM 1, RESV1 2, RESV2 3, GID0..GID7 4..11
    _bits(SaAttr.GUID_INFO_RECORD, {0: "LID", 1: "BlockNum", 2: None, 3: None, 4: "GUID0", 11: "GUID7"})
    # IB_MFTR_COMPMASK_*: LID 0, POSITION 1, RESERVED1 2, BLOCK 3, RESERVED2 4
    _bits(SaAttr.MFT_RECORD, {0: "LID", 1: "Position", 2: None, 3: "BlockNum", 4: None})
    # IB_LR_COMPMASK_*: FROM_LID 0, FROM_PORT 1, TO_PORT 2, TO_LID 3
    _bits(SaAttr.LINK_RECORD, {0: "FromLID", 1: "FromPort", 2: "ToPort", 3: "ToLID"})
    # IB_LFTR_COMPMASK_* LID 0 BLOCK 1; IB_PKEY_COMPMASK_* LID 0 BLOCK 1 PORT 2; IB_VLA_COMPMASK_* LID 0
    # OUT_PORT 1 BLOCK 2; IB_SLVL_COMPMASK_* LID 0 IN_PORT 1 OUT_PORT 2; IB_SWIR_COMPMASK_* LID 0 RESERVED1 1
    _bits(SaAttr.LFT_RECORD, {0: "LID", 1: "BlockNum"})
    _bits(SaAttr.PKEY_TABLE_RECORD, {0: "LID", 1: "BlockNum", 2: "PortNum"})
    _bits(SaAttr.VLARB_TABLE_RECORD, {0: "LID", 1: "OutputPortNum", 2: "BlockNum"})
    _bits(SaAttr.SL2VL_TABLE_RECORD, {0: "LID", 1: "InputPortNum", 2: "OutputPortNum"})
    _bits(SaAttr.SWITCH_INFO_RECORD, {0: "LID", 1: None})
    # IB_MPR_COMPMASK_*: RAWTRAFFIC 0, RESV0 1, FLOWLABEL 2, ..., SERVICEID_MSB 16, INDEPSELEC 17, RESV3 18,
    # SGIDCOUNT 19, DGIDCOUNT 20, SERVICEID_LSB 21
    _bits(SaAttr.MULTIPATH_RECORD, {
        0: "RawTraffic", 1: None, 2: "FlowLabel", 7: "P_Key", 15: "PacketLifeTime", 16: "ServiceID8MSB",
        17: "IndependenceSelector", 18: None, 19: "SGIDCount", 20: "DGIDCount", 21: "ServiceID56LSB",
    })


def test_every_component_resolves_to_one_field() -> None:
    for attr, names in COMPONENTS.items():
        layout = RECORDS[attr]
        for name in names:
            if name is not None:
                assert layout.field(name).name == name
        assert undefined_components(attr, 1 << 63) == 1 << 63
    assert undefined_components(SaAttr.NODE_RECORD, 0b11) == 0b10
    assert component_mask(SaAttr.NODE_RECORD, ["LID", "NodeType"]) == 0b10001


# --- matching -----------------------------------------------------------------


def _node_records() -> list[bytes]:
    return [
        _node_record(1, 1, GUID + 0x10, "host-a HCA-1")[0],
        _node_record(2, 2, GUID + 0x20, "switch-1")[0],
        _node_record(3, 1, GUID + 0x30, "host-b HCA-1")[0],
        _node_record(4, 2, GUID + 0x40, "switch-2", ports=48)[0],
    ]


def test_match_mask_node_type_and_guid() -> None:
    recs = _node_records()
    query = NODE_RECORD.pack({"NodeType": 2})
    mask = component_bit(SaAttr.NODE_RECORD, "NodeType")
    m, cols = match_mask(SaAttr.NODE_RECORD, mask)
    assert len(m) == 108 and list(cols) == [6] and m[6] == 0xFF
    assert [matches(SaAttr.NODE_RECORD, mask, query, r) for r in recs] == [False, True, False, True]

    # PortGUID + NodeType: one record; numpy over records packed at the wire stride (112 bytes).
    query = NODE_RECORD.pack({"NodeType": 1, "PortGUID": GUID + 0x31})
    mask = component_mask(SaAttr.NODE_RECORD, ["NodeType", "PortGUID"])
    stride = ATTRIBUTE_OFFSETS[SaAttr.NODE_RECORD] * 8
    arr = np.frombuffer(b"".join(r.ljust(stride, b"\0") for r in recs), np.uint8).reshape(-1, stride)
    m, cols = match_mask(SaAttr.NODE_RECORD, mask)
    idx = np.frombuffer(cols, np.uint8)
    mm = np.frombuffer(m, np.uint8)[idx]
    q = np.frombuffer(query, np.uint8)
    hit = ((arr[:, idx] & mm) == (q[idx] & mm)).all(axis=1)
    assert hit.tolist() == [False, False, True, False]
    assert hit.tolist() == [matches(SaAttr.NODE_RECORD, mask, query, r) for r in recs]
    _, key = query_key(SaAttr.NODE_RECORD, mask, query)
    assert [bytes(a & b for a, b in zip(r, m, strict=False)) == key for r in recs] == hit.tolist()


def test_match_mask_sub_byte_fields() -> None:
    # PortInfoRecord PortState is a nibble: the mask covers only it, LinkSpeedSupported is ignored.
    mask = component_bit(SaAttr.PORT_INFO_RECORD, "PortState")
    m, cols = match_mask(SaAttr.PORT_INFO_RECORD, mask)
    assert list(cols) == [4 + 32] and m[36] == 0x0F
    active = _port_info_record_bytes(PIR_VALUES)
    down = _port_info_record_bytes({**PIR_VALUES, "PortState": 1, "LinkSpeedSupported": 1})
    query = PORT_INFO_RECORD.pack({"PortState": 4, "LinkSpeedSupported": 15})
    assert matches(SaAttr.PORT_INFO_RECORD, mask, query, active)
    assert not matches(SaAttr.PORT_INFO_RECORD, mask, query, down)
    # An empty mask matches everything.
    assert matches(SaAttr.PORT_INFO_RECORD, 0, query, down)
    # PathRecord: only one of the two ServiceID bits still selects the whole ServiceID.
    m1, _ = match_mask(SaAttr.PATH_RECORD, 0b01)
    assert m1[:8] == b"\xff" * 8 and m1 == match_mask(SaAttr.PATH_RECORD, 0b11)[0]


# --- SA MADs ------------------------------------------------------------------


def test_sa_mad_golden_and_round_trip() -> None:
    data = PATH_RECORD.pack({"DGID": PR_VALUES["DGID"], "SGID": PR_VALUES["SGID"], "NumbPath": 1})
    mask = 1 << 2 | 1 << 3 | 1 << 12
    mad = sa_mad(SaMethod.GET_TABLE, SaAttr.PATH_RECORD, tid=0x1234_5678_9ABC_DEF0, component_mask=mask,
                 sm_key=0x0102030405060708, data=data)
    expected = (
        struct.pack(">BBBBHHQHHI", 1, 0x03, 2, 0x12, 0, 0, 0x123456789ABCDEF0, 0x35, 0, 0)
        + bytes(12)
        + struct.pack(">QHHQ", 0x0102030405060708, 8, 0, mask)
        + data + bytes(200 - 64)
    )
    assert mad == expected
    m = parse_sa(mad)
    assert (m.mgmt_class, m.class_version, m.method, m.tid, m.attr_id) == (3, 2, 0x12, 0x123456789ABCDEF0, 0x35)
    assert (m.sm_key, m.attr_offset, m.component_mask, m.record_size) == (0x0102030405060708, 8, mask, 64)
    assert not m.is_response and not m.rmpp_active
    assert m.data[:64] == data and len(m.data) == 200
    assert PATH_RECORD.unpack(m.data)["NumbPath"] == 1
    hdr = SA_HEADER.unpack(mad)
    assert (hdr["Method"], hdr["AttributeOffset"], hdr["ComponentMask"]) == (0x12, 8, mask)
    assert SA_FIELDS.unpack(mad, 36) == {"SM_Key": 0x0102030405060708, "AttributeOffset": 8, "ComponentMask": mask}
    assert RMPP_HEADER.unpack(mad, 24)["RMPPType"] == 0


def test_sa_response() -> None:
    req = sa_mad(SaMethod.GET_TABLE, SaAttr.NODE_RECORD, tid=77, component_mask=0x10, sm_key=5,
                 data=NODE_RECORD.pack({"NodeType": 2}))
    rec = _node_records()[1]
    resp = parse_sa(sa_response(req, SaMethod.GET_TABLE_RESP, SaStatus.OK, rec))
    assert (resp.method, resp.tid, resp.status, resp.sm_key, resp.attr_offset) == (0x92, 77, 0, 0, 14)
    assert resp.component_mask == 0x10 and resp.is_response
    assert resp.records(count=1) == [rec.ljust(112, b"\0")]
    empty = parse_sa(sa_response(parse_sa(req), None, SaStatus.ERR_NO_RECORDS))
    assert (empty.method, empty.status, empty.attr_offset) == (0x92, 0x0300, 0)
    setreq = sa_mad(SaMethod.SET, SaAttr.INFORM_INFO, tid=1)
    assert parse_sa(sa_response(setreq, None)).method == SaMethod.GET_RESP
    multi = sa_mad(SaMethod.GET_MULTI, SaAttr.MULTIPATH_RECORD, tid=2)
    resp = parse_sa(sa_response(multi, SaMethod.GET_MULTI_RESP, attr_id=SaAttr.PATH_RECORD, data=bytes(64)))
    assert (resp.attr_id, resp.attr_offset) == (SaAttr.PATH_RECORD, 8)
    assert split_records(bytes(range(200)), 8, 2) == [bytes(range(64)), bytes(range(64, 128))]


@pytest.mark.parametrize(
    ("buf", "message"),
    [
        (b"", "needs at least 56"),
        (bytes(55), "needs at least 56"),
        (bytes(257), "at most 256"),
        (b"\x01\x81" + bytes(254), "not Subnet Administration"),
        (b"\x02\x03" + bytes(254), "BaseVersion 2"),
    ],
)
def test_parse_sa_garbage(buf: bytes, message: str) -> None:
    with pytest.raises(MadError, match=message):
        parse_sa(buf)


def test_sa_mad_rejects_bad_values() -> None:
    with pytest.raises(MadError, match="at most 200"):
        sa_mad(SaMethod.GET_RESP, SaAttr.NODE_RECORD, tid=1, data=bytes(201))
    with pytest.raises(MadError, match="transaction ID"):
        sa_mad(SaMethod.GET, SaAttr.NODE_RECORD, tid=-1)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=300))
def test_parse_sa_fuzz(buf: bytes) -> None:
    try:
        m = parse_sa(buf)
    except MadError:
        return
    assert m.mgmt_class == SA_CLASS and m.raw == buf


# --- RMPP ---------------------------------------------------------------------


def _head(tid: int = 0xABC) -> bytes:
    return sa_response(sa_mad(SaMethod.GET_TABLE, SaAttr.PATH_RECORD, tid=tid), SaMethod.GET_TABLE_RESP,
                       data=b"x")[:SA_DATA_OFFSET]


def _rmpp(mad: bytes) -> dict[str, int]:
    return {k: int(v) for k, v in RMPP_HEADER.unpack(mad, 24).items()}


@pytest.mark.parametrize(
    ("size", "count", "first_len", "last_len"),
    [
        (0, 1, 20, 20),
        (1, 1, 21, 21),
        (200, 1, 220, 220),
        (201, 2, 2 * 220 - 199, 21),
        (10_000, 50, 50 * 220, 220),
        (10_001, 51, 51 * 220 - 199, 21),
    ],
)
def test_segments_as_the_kernel_builds_them(size: int, count: int, first_len: int, last_len: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    head = _head()
    segs = segments(head, payload)
    assert len(segs) == count and all(len(s) == 256 for s in segs)
    for i, s in enumerate(segs, 1):
        r = _rmpp(s)
        flags = RmppFlags.ACTIVE | (RmppFlags.FIRST if i == 1 else 0) | (RmppFlags.LAST if i == count else 0)
        assert (r["RMPPVersion"], r["RMPPType"], r["RMPPFlags"], r["RRespTime"]) == (1, 1, flags, 0x1F)
        assert r["Data1"] == i and r["RMPPStatus"] == 0
        if i == 1:
            assert r["Data2"] == first_len
        elif i == count:
            assert r["Data2"] == last_len
        else:
            assert r["Data2"] == 0
        assert s[:24] == head[:24] and s[36:56] == head[36:56]
    assert b"".join(s[56:] for s in segs)[:size] == payload
    assert b"".join(s[56:] for s in segs)[size:] == bytes(count * 200 - size)
    # The receiving kernel's length: hdr + n * 200 - (220 - last PayloadLength).
    assert 56 + count * 200 - (220 - last_len) - 56 == size


def _transfer(
    payload: bytes,
    *,
    window: int = 4,
    lose: Iterable[tuple[int, int]] = (),
    lose_acks: Iterable[int] = (),
    duplicate: Iterable[int] = (),
) -> tuple[RmppSender, RmppReceiver, int]:
    """Drive a sender and a receiver over a lossy wire. ``lose`` drops (segment, n-th send);
    ``lose_acks`` drops the n-th ACK; ``duplicate`` delivers those segments twice."""
    lost = set(lose)
    lost_acks = set(lose_acks)
    dup = set(duplicate)
    tx = RmppSender(segments(_head(), payload), max_retries=5)
    rx = RmppReceiver(window)
    sends: Counter[int] = Counter()
    acks_seen = 0
    wire = tx.first()
    for rounds in range(1, 1000):
        acks: list[bytes] = []
        for mad in wire:
            seg = _rmpp(mad)["Data1"]
            sends[seg] += 1
            if (seg, sends[seg]) in lost:
                continue
            acks += rx.feed(mad)
            if seg in dup:
                dup.discard(seg)
                acks += rx.feed(mad)
        wire = []
        for ack in acks:
            acks_seen += 1
            if acks_seen in lost_acks:
                continue
            assert _rmpp(ack)["RMPPType"] == RmppType.ACK and ack[3] == 0x12
            wire += tx.on_mad(ack)
        if tx.done:
            return tx, rx, rounds
        if not wire:
            wire = tx.on_timeout()
    raise AssertionError("transfer did not finish")


@pytest.mark.parametrize("size", [0, 1, 200, 201, 10_000])
def test_transfer_round_trip(size: int) -> None:
    payload = bytes((i * 7) % 256 for i in range(size))
    tx, rx, _ = _transfer(payload)
    assert tx.done and tx.error is None and tx.retransmissions == 0
    assert rx.complete and rx.payload == payload
    assert rx.header[:24] == _head()[:24] and parse_sa(rx.header).attr_offset == 8


def test_transfer_windows_follow_the_acks() -> None:
    tx = RmppSender(segments(_head(), bytes(10_000)))
    rx = RmppReceiver(window=8)
    first = tx.first()
    assert [_rmpp(m)["Data1"] for m in first] == [1]
    (ack,) = rx.feed(first[0])
    assert (_rmpp(ack)["Data1"], _rmpp(ack)["Data2"]) == (1, 9)
    nxt = tx.on_mad(ack)
    assert [_rmpp(m)["Data1"] for m in nxt] == list(range(2, 10))
    out = [a for m in nxt for a in rx.feed(m)]
    assert [(_rmpp(a)["Data1"], _rmpp(a)["Data2"]) for a in out] == [(9, 17)]
    assert [_rmpp(m)["Data1"] for m in tx.on_mad(out[0])] == list(range(10, 18))


def test_transfer_with_lost_segment_ack_and_duplicate() -> None:
    payload = bytes(range(256)) * 40
    tx, rx, _ = _transfer(payload, lose=[(3, 1), (20, 1)], lose_acks=[2], duplicate=[1, 5])
    assert rx.payload == payload and tx.error is None
    assert tx.timeouts >= 2 and tx.retransmissions >= 2


def test_receiver_reacks_duplicates_and_drops_out_of_order() -> None:
    segs = segments(_head(), bytes(1000))
    rx = RmppReceiver(window=2)
    assert len(rx.feed(segs[0])) == 1
    assert rx.feed(segs[2]) == []  # out of order: dropped
    (again,) = rx.feed(segs[0])  # duplicate of an ACKed segment: re-ACK
    assert (_rmpp(again)["Data1"], _rmpp(again)["Data2"]) == (1, 3)
    assert rx.feed(segs[4]) == []  # beyond the window (3)
    assert not rx.complete


def test_sender_aborts_on_bad_acks_and_retries() -> None:
    segs = segments(_head(), bytes(1000))
    tx = RmppSender(segs)
    tx.first()
    (abort,) = tx.on_ack(3, 2)  # NewWindowLast below the segment
    assert _rmpp(abort)["RMPPType"] == RmppType.ABORT and _rmpp(abort)["RMPPStatus"] == RmppStatus.W2S
    assert abort[3] == 0x92 and tx.done and tx.error == RmppStatus.W2S

    tx = RmppSender(segs)
    tx.first()
    assert tx.on_ack(2, 5)[0][27] == RmppStatus.S2B  # segment beyond the window sent

    tx = RmppSender(segs, max_retries=2)
    tx.first()
    assert len(tx.on_timeout()) == 1 and len(tx.on_timeout()) == 1
    (abort,) = tx.on_timeout()
    assert _rmpp(abort)["RMPPStatus"] == RmppStatus.TMR and tx.error == RmppStatus.TMR and tx.retransmissions == 2

    tx = RmppSender(segs)
    tx.first()
    rx_abort = abort_mad(segs[0], RmppStatus.T2L)  # the receiver's ABORT answering a DATA segment
    assert rx_abort[3] == 0x12
    assert tx.on_mad(rx_abort) == [] and tx.done and tx.error == RmppStatus.T2L
    with pytest.raises(RmppError, match="tid"):
        tx.on_mad(ack_mad(segments(_head(tid=5), b"")[0], 1, 1))


def _with_rmpp(seg: bytes, **fields: int) -> bytes:
    buf = bytearray(seg)
    for name, value in fields.items():
        RMPP_HEADER.put(buf, name, value, 24)
    return bytes(buf)


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"RMPPFlags": 0}, None),
        ({"RMPPVersion": 2}, RmppStatus.UNV),
        ({"Data1": 0}, RmppStatus.BAD_SEG),
        ({"Data1": 2}, RmppStatus.BAD_SEG),  # FIRST on segment 2
        ({"RMPPType": 9}, RmppStatus.BADT),
        ({"RMPPStatus": 5}, RmppStatus.BAD_STATUS),
        ({"Data2": 500}, RmppStatus.BAD_LEN),  # a lone segment with PayloadLength > 220
        ({"Data2": 3}, RmppStatus.BAD_LEN),  # ... or below the 20-byte SA header
    ],
)
def test_receiver_garbage(fields: dict[str, int], status: int | None) -> None:
    seg = segments(_head(), b"abc")[0]
    with pytest.raises(RmppError) as err:
        RmppReceiver().feed(_with_rmpp(seg, **fields))
    assert err.value.status == status
    assert isinstance(err.value, MadError)


def test_receiver_inconsistent_payload_length() -> None:
    segs = segments(_head(), bytes(500))
    rx = RmppReceiver()
    rx.feed(_with_rmpp(segs[0], Data2=3 * 220 - 100 + 1))
    rx.feed(segs[1])
    with pytest.raises(RmppError, match="disagrees") as err:
        rx.feed(segs[2])
    assert err.value.status == RmppStatus.BAD_LEN
    with pytest.raises(MadError, match="256"):
        RmppReceiver().feed(segs[0][:100])
    with pytest.raises(MadError, match="not complete"):
        _ = RmppReceiver().payload


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=256, max_size=256))
def test_receiver_fuzz(buf: bytes) -> None:
    rx = RmppReceiver()
    try:
        out = rx.feed(buf)
    except MadError:
        return
    assert all(len(m) == 256 for m in out)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 600), st.integers(24, 35), st.integers(0, 255), st.integers(0, 3))
def test_receiver_fuzz_mutated_stream(size: int, pos: int, value: int, which: int) -> None:
    segs = segments(_head(), bytes(size))
    victim = min(which, len(segs) - 1)
    segs[victim] = segs[victim][:pos] + bytes([value]) + segs[victim][pos + 1 :]
    rx = RmppReceiver(window=2)
    try:
        for seg in segs:
            for ack in rx.feed(seg):
                assert len(ack) == 256
    except MadError:
        return
    if rx.complete:
        assert len(rx.payload) <= len(segs) * 200


def test_dump_sa() -> None:
    text = dump_sa(sa_response(sa_mad(SaMethod.GET, SaAttr.NODE_RECORD, tid=1), None, data=_node_records()[1]))
    assert "AttributeOffset:" in text and "# NodeRecord" in text and "NodeDescription:" in text


def test_ack_and_abort_mads() -> None:
    seg = segments(_head(), bytes(300))[0]
    ack = ack_mad(seg, 1, 65)
    r = _rmpp(ack)
    assert (ack[3], r["RMPPVersion"], r["RMPPType"], r["RMPPFlags"], r["Data1"], r["Data2"]) == (
        0x12, RMPP_VERSION, 2, 1, 1, 65
    )
    assert r["RRespTime"] == 0x1F and ack[:3] == seg[:3] and ack[4:24] == seg[4:24] and ack[56:] == bytes(200)
    stop = abort_mad(seg, RmppStatus.RESX, rmpp_type=RmppType.STOP)
    assert (_rmpp(stop)["RMPPType"], _rmpp(stop)["RMPPStatus"], _rmpp(stop)["Data1"]) == (3, 1, 0)
