"""MAD header codes: management classes, methods, attribute IDs, status, capability bits."""

from enum import IntEnum, IntFlag

BASE_VERSION = 1
"""MAD BaseVersion of IBA MADs."""

SMP_CLASS_VERSION = 1
PERF_CLASS_VERSION = 1

DR_D_BIT = 0x8000
"""Direction bit of a directed-route SMP's status word (1 = returning)."""

PERMISSIVE_LID = 0xFFFF
MAX_DR_HOPS = 63
"""Largest hop count of a directed route (C14-6)."""

RESPONSE_BIT = 0x80
"""R bit of the method byte."""

DEFAULT_PKEY = 0xFFFF
"""The default partition's P_Key, full member (IBA 10.9.1.2): index 0 of every P_KeyTable after reset."""


class MgmtClass(IntEnum):
    """MAD MgmtClass."""

    SUBN_LID = 0x01
    PERF = 0x04
    SUBN_DR = 0x81


class Method(IntEnum):
    """MAD Method (the response bit included, so GET_RESP is 0x81)."""

    GET = 0x01
    SET = 0x02
    TRAP = 0x05
    TRAP_REPRESS = 0x07
    GET_RESP = 0x81


class SmpAttr(IntEnum):
    """Subnet management attribute IDs."""

    NOTICE = 0x0002
    NODE_DESC = 0x0010
    NODE_INFO = 0x0011
    SWITCH_INFO = 0x0012
    GUID_INFO = 0x0014
    PORT_INFO = 0x0015
    PKEY_TABLE = 0x0016
    SL2VL_TABLE = 0x0017
    VLARB_TABLE = 0x0018
    LFT = 0x0019
    MFT = 0x001B
    SM_INFO = 0x0020


class PerfAttr(IntEnum):
    """Performance management attribute IDs."""

    CLASS_PORT_INFO = 0x0001
    PORT_COUNTERS = 0x0012
    PORT_COUNTERS_EXT = 0x001D


class MadStatus(IntEnum):
    """MAD Status codes (for DR SMPs the low 15 bits; the D bit is separate)."""

    OK = 0x0000
    BUSY = 0x0001
    REDIRECT = 0x0002
    BAD_VERSION = 0x0004
    METHOD_UNSUPPORTED = 0x0008
    METHOD_ATTR_UNSUPPORTED = 0x000C
    INVALID_FIELD = 0x001C


class SmState(IntEnum):
    """SMInfo.SMState."""

    NOT_ACTIVE = 0
    DISCOVERING = 1
    STANDBY = 2
    MASTER = 3


class PortCap(IntFlag):
    """PortInfo.CapabilityMask bits."""

    IS_SM = 1 << 1
    IS_NOTICE_SUPPORTED = 1 << 2
    IS_TRAP_SUPPORTED = 1 << 3
    IS_OPTIONAL_IPD_SUPPORTED = 1 << 4
    IS_AUTOMATIC_MIGRATION_SUPPORTED = 1 << 5
    IS_SL_MAPPING_SUPPORTED = 1 << 6
    IS_MKEY_NVRAM = 1 << 7
    IS_PKEY_NVRAM = 1 << 8
    IS_LED_INFO_SUPPORTED = 1 << 9
    IS_SM_DISABLED = 1 << 10
    IS_SYSTEM_IMAGE_GUID_SUPPORTED = 1 << 11
    IS_PKEY_SWITCH_EXTERNAL_PORT_TRAP_SUPPORTED = 1 << 12
    IS_EXTENDED_SPEEDS_SUPPORTED = 1 << 14
    IS_CAPABILITY_MASK2_SUPPORTED = 1 << 15
    IS_COMMUNICATION_MANAGEMENT_SUPPORTED = 1 << 16
    IS_SNMP_TUNNELING_SUPPORTED = 1 << 17
    IS_REINIT_SUPPORTED = 1 << 18
    IS_DEVICE_MANAGEMENT_SUPPORTED = 1 << 19
    IS_VENDOR_CLASS_SUPPORTED = 1 << 20
    IS_DR_NOTICE_SUPPORTED = 1 << 21
    IS_CAPABILITY_MASK_NOTICE_SUPPORTED = 1 << 22
    IS_BOOT_MANAGEMENT_SUPPORTED = 1 << 23
    IS_LINK_ROUND_TRIP_LATENCY_SUPPORTED = 1 << 24
    IS_CLIENT_REREGISTRATION_SUPPORTED = 1 << 25
    IS_OTHER_LOCAL_CHANGES_NOTICE_SUPPORTED = 1 << 26
    IS_LINK_SPEED_WIDTH_PAIRS_TABLE_SUPPORTED = 1 << 27


class PerfCap(IntFlag):
    """PerfMgt ClassPortInfo.CapabilityMask bits."""

    IS_ALL_PORT_SELECT_SUPPORTED = 0x0100
    IS_EXTENDED_WIDTH_SUPPORTED = 0x0200
    IS_EXTENDED_WIDTH_SUPPORTED_NOIETF = 0x0400
    IS_SAMPLES_ONLY_SUPPORTED = 0x0800
    IS_PORT_XMIT_WAIT_SUPPORTED = 0x1000


class Trap(IntEnum):
    """Generic trap numbers (Notice.TrapNumber) the SM handles."""

    LINK_STATE_CHANGE = 128
    LOCAL_LINK_INTEGRITY = 129
    EXCESSIVE_BUFFER_OVERRUN = 130
    FLOW_CONTROL_UPDATE_WATCHDOG = 131
    CAPABILITY_MASK_CHANGE = 144
    SYSTEM_IMAGE_GUID_CHANGE = 145
    BAD_M_KEY = 256


class NoticeType(IntEnum):
    """Notice.Type."""

    FATAL = 0
    URGENT = 1
    SECURITY = 2
    SUBNET_MANAGEMENT = 3
    INFO = 4
    EMPTY = 0x7F


class ProducerType(IntEnum):
    """Notice.ProducerType of generic notices (a NodeType, or the subnet manager)."""

    CA = 1
    SWITCH = 2
    ROUTER = 3
    CLASS_MANAGER = 4
