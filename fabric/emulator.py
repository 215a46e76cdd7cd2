"""An in-process fabric that answers MADs as bytes, as ibsim does.

:class:`EmulatedFabric` keeps its own copy of a :class:`~fabric.model.Fabric`
as physical truth, plus what the devices hold: per-switch LFTs
(``uint8[n_switches, LinearFDBCap]``) and MFTs (``uint16[n_switches,
MulticastFDBCap, positions]``), SwitchInfo (LinearFDBTop, PortStateChange),
PortInfo per port (LID, LMC, MasterSMLID, NeighborMTU, OperationalVLs, ...),
P_KeyTables, SLtoVLMappingTables and VLArbitrationTables, SMInfo of the ports
that run an SM and PMA counters.

The SM attaches at ``(sm_node, sm_port)``. :meth:`EmulatedFabric.process`
takes one request MAD and returns the response, or None when the MAD is
dropped (a real device drops silently; the transport then times out):

- Directed-route SMPs walk InitialPath from the SM's port over ports that
  are physically LinkUp (INIT, ARMED or ACTIVE); a hop through a down,
  unconnected or non-existent port, out of port 0, or through a CA, drops
  the SMP. The answer is given at the end node; its "port" context is the
  port the SMP arrived on (NodeInfo.LocalPortNum, PortInfo with modifier 0
  on a CA).
- LID-routed SMPs (class 0x01) and PerfMgt MADs (class 0x04) travel hop by
  hop through the switches' LFTs from the SM's port, and the response
  travels back to the SM's LID the same way; SMPs pass ports in INIT or
  better, PerfMgt needs ACTIVE senders and ARMED/ACTIVE receivers. A wrong
  or missing LFT entry, or a DLID above LinearFDBTop, drops the MAD.

One handler per attribute, all with one signature; a Set copies in what
the device accepts and then answers with the current state. The tables an SM
programs are sized from the capabilities the devices advertise and start as
ibsim's do (see :class:`EmulatedFabric`); :meth:`EmulatedFabric.pkey_table`,
:meth:`~EmulatedFabric.sl2vl`, :meth:`~EmulatedFabric.vlarb` and
:meth:`~EmulatedFabric.mft` read them. Link events
(:meth:`link_down`, :meth:`link_up`, :meth:`remove_node`,
:meth:`restore_node`) set PortStateChange on the switches concerned and
queue a trap 128 (a LID-routed Notice toward the switch's MasterSMLID) in
:attr:`traps` when the switch has a LID and its LFTs lead to the SM.

M_Key protection (IBA 14.2.4) is enforced by the SMA an SMP is addressed to
(a CA port, or a switch's port 0 for any port of the switch); switches that
only forward a directed-route SMP do not look at it. An SMP passes the check
when its M_Key (header bytes 24-31) equals the port's M_Key or that is 0.
When it does not: M_KeyProtectBits 0 lets Gets through and fails Sets; 1
lets Gets through with PortInfo's M_Key read as 0 and fails Sets; 2 and 3
fail both. A failed SMP is dropped (the requester times out), counts in
PortInfo.M_KeyViolations, sends trap 256 (bad M_Key) to the port's
MasterSMLID and starts the M_KeyLeasePeriod timer if it is not running; an
SMP that passes stops the timer; when it runs out the port's protect bits
fall to 0, so a Get shows the M_Key again. Time is :attr:`EmulatedFabric.clock`.
While no end port holds a non-zero M_Key (:attr:`EmulatedFabric.m_key_checking`
false) SMPs take no M_Key step at all.

As on hardware: the SM's port needs a LID before any LID-routed MAD leaves
it; a switch delivers a DLID in its own LID range to itself without looking
at its LFT; a PortInfo Set of PortState DOWN makes the link drop and retrain
(both ends come back in INIT); :meth:`advance` lets traffic flow into the
PMA counters from a :class:`TrafficSource`. :meth:`apply_subnet` configures
everything at once, as if an SM had swept (for tests of later stages).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.mad import (
    CLASS_PORT_INFO,
    DEFAULT_PKEY,
    MAX_MFT_ENTRIES,
    MFT_BLOCK_SIZE,
    MFT_PORTS_PER_POSITION,
    NODE_INFO,
    PERMISSIVE_LID,
    PKEY_BLOCK_SIZE,
    PORT_COUNTERS,
    PORT_COUNTERS_EXT,
    PORT_INFO,
    RETURN_PATH_OFFSET,
    SL2VL_SIZE,
    SM_INFO,
    SWITCH_INFO,
    VLARB_BLOCK_SIZE,
    FieldValueError,
    Layout,
    Mad,
    MadError,
    MadStatus,
    Method,
    MgmtClass,
    PerfAttr,
    PerfCap,
    PortCap,
    ProducerType,
    SmpAttr,
    SmState,
    make_response,
    node_desc_pack,
    parse_mad,
    sl2vl_unpack,
    trap128_pack,
    trap256_pack,
    trap_mad,
)
from fabric.model import (
    NO_PEER,
    SPEED_TO_PORTINFO,
    Fabric,
    NodeType,
    PhysState,
    PortState,
    Speed,
    speed_supported_portinfo,
    speeds_up_to,
)
from fabric.model import dr_paths as model_dr_paths

LFT_CAP = 0xC000
"""Default SwitchInfo.LinearFDBCap: the whole unicast LID space (49,152 entries)."""

LFT_BLOCK = 64
MAX_UNICAST_LID = 0xBFFF
LID_HOP_LIMIT = 64
"""A LID-routed packet still travelling after this many switches is in a loop: dropped."""

DEFAULT_GID_PREFIX = 0xFE80000000000000

MFT_CAP = 1024
"""Default SwitchInfo.MulticastFDBCap, ibsim's: MLIDs 0xC000..0xC3FF."""
CA_PARTITION_CAP = 64
"""Default NodeInfo.PartitionCap of a CA: P_Keys in each of its ports' tables (ibsim's)."""
PARTITION_ENFORCEMENT_CAP = 64
"""Default SwitchInfo.PartitionEnforcementCap: P_Keys in a switch external port's table (ibsim's)."""
SWITCH_PARTITION_CAP = 8
"""Default NodeInfo.PartitionCap of a switch: P_Keys in its port 0's table (ibsim's)."""
VLARB_CAP = 8
"""PortInfo.VLArbitrationHighCap and VLArbitrationLowCap of every port (ibsim's)."""

DEFAULT_SL2VL = bytes.fromhex("0123456789abcde7")
"""The SLtoVLMappingTable every port starts with, ibsim's: SL i on VL i for SLs 0..14, SL15 on VL7."""
DEFAULT_VLARB = np.array(
    [[(vl, 0 if vl == 0 else 4) for vl in range(VLARB_CAP)], [(vl, 4 if vl == 0 else 0) for vl in range(VLARB_CAP)]],
    np.uint8,
)
"""``uint8[priority, entry, (VL, Weight)]``: the VLArbitrationTable every port starts with, ibsim's.
Low priority (row 0): VL i at weight 4, VL0 at 0; high priority (row 1): VL0 at weight 4, the rest 0."""

_NO_ROUTE = 255
_NO_ROUTE_BLOCK = bytes([_NO_ROUTE]) * LFT_BLOCK

_S = TypeVar("_S", bound=np.generic)

# Per-port flags (a bytearray indexed node * (max_port + 1) + port).
_F_LINK = 1
"""Physically LinkUp with a cable: SMPs (VL15) pass in INIT, ARMED and ACTIVE."""
_F_ARMED = 2
"""ARMED or ACTIVE: may receive data packets."""
_F_ACTIVE = 4
"""ACTIVE: may send data packets."""

_CA_CAPS = int(
    PortCap.IS_TRAP_SUPPORTED
    | PortCap.IS_SL_MAPPING_SUPPORTED
    | PortCap.IS_SYSTEM_IMAGE_GUID_SUPPORTED
    | PortCap.IS_EXTENDED_SPEEDS_SUPPORTED
    | PortCap.IS_CAPABILITY_MASK2_SUPPORTED
    | PortCap.IS_COMMUNICATION_MANAGEMENT_SUPPORTED
    | PortCap.IS_VENDOR_CLASS_SUPPORTED
    | PortCap.IS_CLIENT_REREGISTRATION_SUPPORTED
)
_SWITCH_CAPS = int(
    PortCap.IS_TRAP_SUPPORTED
    | PortCap.IS_NOTICE_SUPPORTED
    | PortCap.IS_SL_MAPPING_SUPPORTED
    | PortCap.IS_SYSTEM_IMAGE_GUID_SUPPORTED
    | PortCap.IS_EXTENDED_SPEEDS_SUPPORTED
    | PortCap.IS_CAPABILITY_MASK2_SUPPORTED
    | PortCap.IS_VENDOR_CLASS_SUPPORTED
)

# PortInfo speed codes by Speed value (index 0 = none): Supported from the cap, Active.
_LS_SUP = [0] + [speed_supported_portinfo(speeds_up_to(s))[0] for s in Speed]
_LSE_SUP = [0] + [speed_supported_portinfo(speeds_up_to(s))[1] for s in Speed]
_LS_ACT = [0] + [SPEED_TO_PORTINFO[s][0] for s in Speed]
_LSE_ACT = [0] + [SPEED_TO_PORTINFO[s][1] for s in Speed]

_PI_LOCAL_PORT = PORT_INFO.field("LocalPortNum").offset // 8
_NI_PORT_GUID = NODE_INFO.field("PortGUID").offset // 8
_NI_LOCAL_PORT = NODE_INFO.field("LocalPortNum").offset // 8
_PI_M_KEY_END = (PORT_INFO.field("M_Key").offset + 64) // 8
_M_KEY_VIOLATIONS_MAX = PORT_INFO.field("M_KeyViolations").max_value

# M_Key check outcomes (IBA 14.2.4.1, C14-16)
_MKEY_PASS = 0
_MKEY_HIDE = 1
"""A Get that fails the check at protection level 1: answered, PortInfo.M_Key read as 0."""
_MKEY_FAIL = 2
"""Dropped: counted in M_KeyViolations, trap 256, the lease timer started."""

_HANDED_ON = b""
"""``_process_*`` result: the request went to a client, whose answer comes later."""
_SA_CLASS = 0x03
_DEVICE_CLASSES = (int(MgmtClass.SUBN_LID), int(MgmtClass.SUBN_DR), int(MgmtClass.PERF))
"""Classes the devices answer (or refuse) themselves; GMPs of any other go to clients."""
_RMPP_CONTROL = (2, 3, 4)
"""RMPPType ACK, STOP, ABORT: what the receiver of a multi-segment answer sends its sender."""

_GET = int(Method.GET)
_SET = int(Method.SET)
_OK = int(MadStatus.OK)
_INVALID = int(MadStatus.INVALID_FIELD)
_UNSUPPORTED = int(MadStatus.METHOD_ATTR_UNSUPPORTED)


class EmulatorError(IbfmError):
    """A request to the emulator itself that the fabric does not allow (no such port, no cable)."""


class Counter(IntEnum):
    """PMA counters, in PortCounters.CounterSelect bit order for the first 16.

    PortCounters shows 0..17 (saturating at their field width); PortCountersExtended
    shows the data, packet, unicast and multicast counters with 64 bits.
    """

    SYMBOL_ERROR = 0
    LINK_ERROR_RECOVERY = 1
    LINK_DOWNED = 2
    RCV_ERRORS = 3
    RCV_REMOTE_PHYS_ERRORS = 4
    RCV_SWITCH_RELAY_ERRORS = 5
    XMIT_DISCARDS = 6
    XMIT_CONSTRAINT_ERRORS = 7
    RCV_CONSTRAINT_ERRORS = 8
    LOCAL_LINK_INTEGRITY_ERRORS = 9
    EXCESSIVE_BUFFER_OVERRUN_ERRORS = 10
    VL15_DROPPED = 11
    XMIT_DATA = 12
    RCV_DATA = 13
    XMIT_PKTS = 14
    RCV_PKTS = 15
    XMIT_WAIT = 16
    QP1_DROPPED = 17
    UNICAST_XMIT_PKTS = 18
    UNICAST_RCV_PKTS = 19
    MULTICAST_XMIT_PKTS = 20
    MULTICAST_RCV_PKTS = 21


N_COUNTERS = len(Counter)
N_PC32 = 18
"""Counters 0..17 appear in PortCounters."""

# PortCounters field name per counter 0..17 and its saturation value.
_PC32_FIELDS = (
    "SymbolErrorCounter",
    "LinkErrorRecoveryCounter",
    "LinkDownedCounter",
    "PortRcvErrors",
    "PortRcvRemotePhysicalErrors",
    "PortRcvSwitchRelayErrors",
    "PortXmitDiscards",
    "PortXmitConstraintErrors",
    "PortRcvConstraintErrors",
    "LocalLinkIntegrityErrors",
    "ExcessiveBufferOverrunErrors",
    "VL15Dropped",
    "PortXmitData",
    "PortRcvData",
    "PortXmitPkts",
    "PortRcvPkts",
    "PortXmitWait",
    "QP1Dropped",
)
_PC32_MAX = np.array([PORT_COUNTERS.field(n).max_value for n in _PC32_FIELDS], np.uint64)
_PC32_MAX_LIST = _PC32_MAX.tolist()

# PortCountersExtended: field per CounterSelect bit, and the counter behind it.
_PCX_FIELDS = (
    "PortXmitData",
    "PortRcvData",
    "PortXmitPkts",
    "PortRcvPkts",
    "PortUnicastXmitPkts",
    "PortUnicastRcvPkts",
    "PortMulticastXmitPkts",
    "PortMulticastRcvPkts",
)
_PCX_COUNTERS = np.array(
    [
        Counter.XMIT_DATA,
        Counter.RCV_DATA,
        Counter.XMIT_PKTS,
        Counter.RCV_PKTS,
        Counter.UNICAST_XMIT_PKTS,
        Counter.UNICAST_RCV_PKTS,
        Counter.MULTICAST_XMIT_PKTS,
        Counter.MULTICAST_RCV_PKTS,
    ],
    np.intp,
)

Handler = Callable[[int, int, int, bytes, bool], tuple[bytes, int]]
"""``(node, in_port, attr_mod, request data, is_set) -> (attribute data, MAD status)``."""


class TrafficSource(Protocol):
    """Where port traffic comes from: per-port transmit rates for :meth:`EmulatedFabric.advance`."""

    def rates(
        self, emu: EmulatedFabric
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """``(xmit bytes/s, xmit packets/s, XmitWait ticks/s)``, each ``float64[node, port]``."""
        ...


@dataclass
class ConstantTraffic:
    """The same load on every port that can send data (ACTIVE, peer ARMED or ACTIVE)."""

    bytes_per_s: float = 1e9
    packet_bytes: int = 4096
    xmit_wait_per_s: float = 0.0

    def rates(
        self, emu: EmulatedFabric
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        live = emu.data_mask()
        b = np.where(live, float(self.bytes_per_s), 0.0)
        w = np.where(live, float(self.xmit_wait_per_s), 0.0)
        return b, b / float(self.packet_bytes), w


@dataclass
class SmRecord:
    """SMInfo of a port that runs an SM."""

    guid: int
    sm_key: int = 0
    act_count: int = 0
    priority: int = 0
    state: SmState = SmState.NOT_ACTIVE


RequestHandler = Callable[[bytes, "Endpoint", int], None]
"""A client's taker of requests: (the MAD as it arrives, the sender's endpoint, the sender's LID or
0xFFFF for a directed-route SMP)."""


@dataclass(eq=False)
class Endpoint:
    """A client attached to an end port, as a process is attached to ibsim as that node.

    MADs it sends leave from its port (:meth:`EmulatedFabric.process` with
    ``src=``); requests the devices do not answer themselves (SMInfo, and
    GMPs of classes other than PerfMgt: SA queries, Reports) reach it through
    ``on_request`` when they are addressed to its port; answers to it come
    through ``on_reply`` (:meth:`EmulatedFabric.reply`), and traps toward its
    LID land in ``traps``.
    """

    node: int
    port: int
    traps: deque[bytes] = field(default_factory=deque)
    on_trap: Callable[[], None] | None = None
    on_request: RequestHandler | None = None
    on_reply: Callable[[bytes], None] | None = None


@dataclass
class LocalPort:
    """Where the SM sits: its node and port, their GUIDs and the port's current LID."""

    node: int
    port: int
    node_guid: int
    port_guid: int
    lid: int


@dataclass
class EmulatorStats:
    received: int = 0
    answered: int = 0
    dropped: int = 0
    traps_sent: int = 0
    traps_dropped: int = 0
    trap_represses: int = 0
    m_key_violations: int = 0
    """SMPs dropped by an M_Key check, all ports together."""


class EmulatedFabric:
    """A whole subnet's devices in one process, answering MADs as bytes."""

    def __init__(
        self,
        fabric: Fabric,
        *,
        sm_node: int | None = None,
        sm_port: int = 1,
        traffic: TrafficSource | None = None,
        lft_cap: int = LFT_CAP,
        mft_cap: int = MFT_CAP,
        partition_cap: int = CA_PARTITION_CAP,
        switch_partition_cap: int = SWITCH_PARTITION_CAP,
        partition_enforcement_cap: int = PARTITION_ENFORCEMENT_CAP,
        drop_rate: float = 0.0,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``clock`` gives seconds for M_Key leases (default :func:`time.monotonic`).
        ``lft_cap``, ``mft_cap`` and ``partition_enforcement_cap`` are every switch's
        SwitchInfo LinearFDBCap, MulticastFDBCap and PartitionEnforcementCap (0: the switches
        do not enforce partitions, so their external ports have no P_KeyTable);
        ``partition_cap`` and ``switch_partition_cap`` are NodeInfo.PartitionCap of CAs and
        of switches (the size of a CA port's P_KeyTable, and of a switch port 0's).
        """
        f = fabric.copy()
        self.fabric = f
        """Physical truth: cables, port states, widths, LIDs (the emulator's own copy)."""
        n, pp = f.port_exists.shape
        self._n = n
        self._P = pp
        if sm_node is None:
            cas = f.cas
            if cas.size == 0:
                raise EmulatorError("fabric has no channel adapter to attach the SM to")
            sm_node = int(cas[0])
        if not 0 <= sm_node < n:
            raise EmulatorError(f"SM node {sm_node} outside 0..{n - 1}")
        if f.is_switch(sm_node):
            sm_port = 0  # an SM on a switch sits behind its management port 0
        elif not 1 <= sm_port <= int(f.nports[sm_node]):
            raise EmulatorError(f"SM port {f.port_name(sm_node, sm_port)}: no such port")
        self.sm_node = sm_node
        self.sm_port = sm_port
        self.traffic: TrafficSource = traffic if traffic is not None else ConstantTraffic()
        if not 1 <= lft_cap <= LFT_CAP:
            raise EmulatorError(f"LinearFDBCap {lft_cap} outside 1..{LFT_CAP}")
        self.lft_cap = lft_cap
        if not 0 <= mft_cap <= MAX_MFT_ENTRIES:
            raise EmulatorError(f"MulticastFDBCap {mft_cap} outside 0..{MAX_MFT_ENTRIES}")
        for what, cap, low in (
            ("PartitionCap", partition_cap, 1),
            ("switch PartitionCap", switch_partition_cap, 1),
            ("PartitionEnforcementCap", partition_enforcement_cap, 0),
        ):
            if not low <= cap <= 0xFFFF:
                raise EmulatorError(f"{what} {cap} outside {low}..65535")
        self.mft_cap = mft_cap
        self.partition_cap = partition_cap
        self.switch_partition_cap = switch_partition_cap
        self.partition_enforcement_cap = partition_enforcement_cap
        self.drop_rate = drop_rate
        """Fraction of request MADs silently dropped (ibsim's ``Error`` command)."""
        self._rng = random.Random(seed)
        self.stats = EmulatorStats()
        self.primary = Endpoint(sm_node, sm_port)
        """The SM's own attachment: MADs without ``src=`` leave from here."""
        self._endpoints: dict[int, Endpoint] = {sm_node * pp + sm_port: self.primary}
        """Attached clients by ``node * stride + port`` (port 0 on a switch)."""
        self._issm: set[tuple[int, int]] = set()
        """Ports whose client raised IsSM (as opening issm does)."""
        self.time = 0.0
        """Seconds of traffic accumulated by :meth:`advance`."""
        self.clock: Callable[[], float] = clock if clock is not None else time.monotonic
        """Monotonic seconds for M_Key leases; tests put a fake clock here and move it."""

        # -- static per-node facts, as Python lists for the hot path
        self._is_sw = (f.node_type == NodeType.SWITCH).tolist()
        self._nports = f.nports.astype(np.int64).tolist()
        self._pn = f.peer_node.astype(np.int64).ravel().tolist()
        self._pp = f.peer_port.astype(np.int64).ravel().tolist()
        sw = f.switches
        self.switch_nodes = sw
        """Node index of each LFT row (``fabric.switches``)."""
        row = np.full(n, -1, np.int64)
        row[sw] = np.arange(sw.size)
        self._sw_row = row.tolist()
        self._present = bytearray(b"\x01" * n)

        # -- switch state
        self._lft = np.full((sw.size, min(LFT_BLOCK, lft_cap)), _NO_ROUTE, np.uint8)
        """The LFTs as far as LIDs are in use (see :attr:`lft`); beyond its width every entry is 255."""
        self._lid_top = 0
        """Highest LID given to a port since the LFTs last grew (a high-water mark)."""
        self.lft_top = np.zeros(sw.size, np.int64)
        """SwitchInfo.LinearFDBTop per switch row."""
        self.port_state_change = np.zeros(sw.size, np.bool_)
        """SwitchInfo.PortStateChange per switch row."""
        self.life_time = np.full(sw.size, 18, np.uint8)
        npos = int(f.nports[sw].max()) // MFT_PORTS_PER_POSITION + 1 if sw.size else 1
        rows = -(-mft_cap // MFT_BLOCK_SIZE) * MFT_BLOCK_SIZE
        self._mft = np.zeros((sw.size, rows, npos), np.uint16)
        """``uint16[switch row, MLID - 0xC000, position]``: PortMasks (untouched pages cost no memory)."""

        # -- per-port tables, flat over the ports that exist (switch port 0 included), node by node
        self._init_port_tables()

        # -- per-port PortInfo state beyond what the Fabric arrays hold
        shape = (n, pp)
        ex = f.port_exists
        self.master_sm_lid = np.zeros(shape, np.uint16)
        self.master_sm_sl = np.zeros(shape, np.uint8)
        self._m_key = np.zeros(shape, np.uint64)
        self._m_key_lease = np.zeros(shape, np.uint16)
        self._m_key_protect = np.zeros(shape, np.uint8)
        self._m_key_violations = np.zeros(shape, np.uint16)
        self.m_key = _read_only(self._m_key)
        """PortInfo.M_Key of each end port (read only: set it by SMP or :meth:`set_m_key`)."""
        self.m_key_lease = _read_only(self._m_key_lease)
        """PortInfo.M_KeyLeasePeriod of each end port, seconds (0: the lease never runs out)."""
        self.m_key_violations = _read_only(self._m_key_violations)
        """PortInfo.M_KeyViolations of each end port (saturating at 65535; a PortInfo Set of 0 clears it)."""
        self._m_key_protect_ro = _read_only(self._m_key_protect)
        self._keyed: dict[int, int] = {}
        """Non-zero M_Keys by ``node * stride + end port``: empty means no SMP is checked."""
        self._lease_ends: dict[int, float] = {}
        """Running M_Key lease timers: when each runs out, by ``node * stride + end port``."""
        self.gid_prefix = np.full(shape, DEFAULT_GID_PREFIX, np.uint64)
        self.subnet_timeout = np.zeros(shape, np.uint8)
        self.hoq_life = np.full(shape, 16, np.uint8)
        self.vl_stall = np.full(shape, 7, np.uint8)
        self.part_enforce_in = np.zeros(shape, np.uint8)
        self.part_enforce_out = np.zeros(shape, np.uint8)
        """PortInfo.PartitionEnforcementInbound/Outbound: kept on switch ports that hold a P_Key table
        (unlike ibsim, which reads them back as 0, as real switches keep them)."""
        self.vl_high_limit = np.zeros(shape, np.uint8)
        self.width_enabled = np.where(ex, f.width_cap, 0).astype(np.uint8)
        self.speed_enabled = np.zeros(shape, np.uint8)
        self.speed_ext_enabled = np.zeros(shape, np.uint8)
        caps = np.where(f.node_type == NodeType.SWITCH, _SWITCH_CAPS, _CA_CAPS).astype(np.uint32)
        self.capability_mask = np.where(ex, caps[:, None], 0).astype(np.uint32)
        self.disabled = f.phys_state == PhysState.DISABLED
        """PortPhysicalState set to Disabled by an SM."""
        self.cable_up = f.peer_node != NO_PEER
        """The cable carries signal (cleared by :meth:`link_down`, set by :meth:`link_up`)."""
        self.cable_up &= f.phys_state == PhysState.LINKUP
        # Reset values where the given fabric leaves them open: VL0 only, MTU as the cap.
        f.op_vls[ex & (f.op_vls == 0)] = 1
        keep_mtu = f.mtu_active != 0
        f.mtu_active[ex & ~keep_mtu] = f.mtu_cap[ex & ~keep_mtu]
        for cap in np.unique(f.speed_cap[ex]).tolist():
            if cap:
                ls, lse = speed_supported_portinfo(speeds_up_to(Speed(cap)))
                m = ex & (f.speed_cap == cap)
                self.speed_enabled[m] = ls
                self.speed_ext_enabled[m] = lse

        # -- SMs on the fabric (SMInfo), ours included
        self.sm_info: dict[tuple[int, int], SmRecord] = {}

        # -- PMA
        # one row per existing port (``_port_ix``), plus a spare zero row for a PortSelect naming
        # a port the fabric lacks (``_pma_ix``): about 15% of the [node, port] cells at 11,664 hosts
        n_rows = int(np.count_nonzero(f.port_exists)) + 1
        self._pma_ix = np.where(self._port_ix >= 0, self._port_ix, n_rows - 1)
        self._ctr = np.zeros((n_rows, N_COUNTERS), np.uint64)
        """Running totals per ``[port row, Counter]`` (never cleared; views keep bases): see :attr:`counters`."""
        self._base32 = np.zeros((n_rows, N_PC32), np.uint64)
        self._base64 = np.zeros((n_rows, len(_PCX_FIELDS)), np.uint64)
        self._residue = np.zeros((3, n_rows), np.float64)
        self.pma_ext_width = np.ones(n, np.bool_)
        """ClassPortInfo advertises IsExtendedWidthSupported (PortCountersExtended answered)."""

        # -- LID owners, flags, caches
        self._lid_owner = np.full(MAX_UNICAST_LID + 1, -1, np.int64)
        self._flags = bytearray(n * pp)
        self._pi_cache: dict[int, bytes] = {}
        """PortInfo images (LocalPortNum 0) by ``node * stride + port``."""
        self._pi_rows = np.zeros((n * pp, PORT_INFO.size), np.uint8)
        """PortInfo images of every port, packed at once by :meth:`_rebuild`."""
        self._pi_stale: set[int] = set()
        """Ports whose state changed since ``_pi_rows`` was packed."""
        self._ni_cache: dict[int, bytes] = {}
        self._ni_base: list[bytes] = [self._node_info_base(i) for i in range(n)]
        self._nd: list[bytes] = [node_desc_pack(_fit_desc(d)) for d in f.descs]
        self._trap_tid = 0
        self._rebuild()
        self.set_sm(self.sm_node, self.sm_port)

        self._smp_handlers: dict[int, Handler] = {
            int(SmpAttr.NODE_INFO): self._h_node_info,
            int(SmpAttr.NODE_DESC): self._h_node_desc,
            int(SmpAttr.PORT_INFO): self._h_port_info,
            int(SmpAttr.SWITCH_INFO): self._h_switch_info,
            int(SmpAttr.PKEY_TABLE): self._h_pkey_table,
            int(SmpAttr.SL2VL_TABLE): self._h_sl2vl,
            int(SmpAttr.VLARB_TABLE): self._h_vlarb,
            int(SmpAttr.LFT): self._h_lft,
            int(SmpAttr.MFT): self._h_mft,
            int(SmpAttr.GUID_INFO): self._h_guid_info,
            int(SmpAttr.SM_INFO): self._h_sm_info,
        }
        self._perf_handlers: dict[int, Handler] = {
            int(PerfAttr.CLASS_PORT_INFO): self._h_class_port_info,
            int(PerfAttr.PORT_COUNTERS): self._h_port_counters,
            int(PerfAttr.PORT_COUNTERS_EXT): self._h_port_counters_ext,
        }

    def _init_port_tables(self) -> None:
        """Allocate the P_Key, SL-to-VL and VL arbitration tables and fill them with their defaults.

        A port's tables are found through its dense index ``_port_ix[node, port]`` (ports
        that exist, in node then port order); P_KeyTables of different sizes lie end to end
        in ``_pkeys`` (port ``i`` owns ``_pkey_off[i]:_pkey_off[i + 1]``); SLtoVLMappingTables
        are 8-byte rows of ``_sl2vl``, from ``_sl2vl_base[node]``: a switch's ``(in, out)`` pair
        at ``in * (NumPorts + 1) + out``, a CA port ``p`` at ``p - 1``.
        """
        f = self.fabric
        ex = f.port_exists
        n_ports = int(np.count_nonzero(ex))
        ix = np.full(ex.shape, -1, np.int64)
        ix[ex] = np.arange(n_ports)
        self._port_ix = ix
        is_sw = f.node_type == NodeType.SWITCH
        size = np.where(np.broadcast_to(is_sw[:, None], ex.shape), self.partition_enforcement_cap, self.partition_cap)
        size[is_sw, 0] = self.switch_partition_cap
        off = np.zeros(n_ports + 1, np.int64)
        np.cumsum(size[ex], out=off[1:])
        self._pkey_off = off
        self._pkeys = np.zeros(int(off[-1]), np.uint16)
        nports = f.nports.astype(np.int64)
        count = np.where(is_sw, (nports + 1) ** 2, nports)
        self._sl2vl_base: list[int] = (np.cumsum(count) - count).tolist()
        self._sl2vl = np.empty((int(count.sum()), SL2VL_SIZE), np.uint8)
        self._vlarb = np.empty((n_ports, 2, VLARB_CAP, 2), np.uint8)
        """``uint8[port index, priority (0 low, 1 high), entry, (VL, Weight)]``."""
        self._reset_port_tables(0, n_ports, 0, self._sl2vl.shape[0])

    def _reset_port_tables(self, first: int, end: int, sl2vl_first: int, sl2vl_end: int) -> None:
        """Defaults for ports ``first..end-1`` (dense indices) and SL-to-VL rows ``sl2vl_first..sl2vl_end-1``."""
        off = self._pkey_off
        self._pkeys[off[first] : off[end]] = 0
        starts = off[first:end]
        self._pkeys[starts[starts < off[first + 1 : end + 1]]] = DEFAULT_PKEY
        self._sl2vl[sl2vl_first:sl2vl_end] = np.frombuffer(DEFAULT_SL2VL, np.uint8)
        self._vlarb[first:end] = DEFAULT_VLARB

    # -- LFTs and counters -----------------------------------------------------------

    @property
    def counters(self) -> npt.NDArray[np.uint64]:
        """Running totals per ``[node, port, Counter]``, never cleared (views keep bases).

        A dense copy built at each access (for tests and tools): the emulator keeps a row
        per existing port; raise a counter with :meth:`add_counter`.
        """
        out = np.zeros((self._n, self._P, N_COUNTERS), np.uint64)
        out[self.fabric.port_exists] = self._ctr[:-1]
        return out

    @property
    def lft(self) -> npt.NDArray[np.uint8]:
        """``uint8[switch row, LID]``: each switch's LinearForwardingTable (255 = no route).

        Its width covers the LIDs in use and the blocks programmed, in whole 64-LID
        blocks, not the whole LinearFDBCap (0xC000 LIDs would be 76 MiB at 1,620
        switches); every LID beyond it routes nowhere. It grows, as a new array, when
        a higher LID is given to a port or an LFT block beyond it is programmed.
        """
        if self._lid_top >= self._lft.shape[1]:
            self._lft_cover(self._lid_top)
        return self._lft

    def _lft_cover(self, lid: int) -> None:
        """Widen the LFTs (255-filled) to the 64-LID block holding ``lid`` or the highest LID in use."""
        width = self._lft.shape[1]
        if lid < width:
            return
        lid = max(lid, self._lid_top)  # once for every LID in use, not a block at a time
        new = min(self.lft_cap, (lid // LFT_BLOCK + 1) * LFT_BLOCK)
        grown = np.full((self._lft.shape[0], new), _NO_ROUTE, np.uint8)
        grown[:, :width] = self._lft
        self._lft = grown

    # -- derived state ------------------------------------------------------------

    def _rebuild(self) -> None:
        """Recompute port flags and LID owners from the arrays; drop cached PortInfo."""
        f = self.fabric
        self._flags[:] = self._flag_array().ravel().tobytes()
        self._lid_owner[:] = -1
        pp = self._P
        base = f.lid.astype(np.int64)
        ends = np.argwhere((base > 0) & self._endport_mask())
        for node, port in ends.tolist():
            b = int(base[node, port])
            span = 1 << int(f.lmc[node, port])
            self._lid_owner[b : min(b + span, MAX_UNICAST_LID + 1)] = node * pp + port
            self._lid_top = max(self._lid_top, min(b + span - 1, self.lft_cap - 1))
        self._pi_cache.clear()
        self._pi_stale.clear()
        self._pi_rows[:] = self._port_info_rows()

    def _flag_array(self) -> npt.NDArray[np.uint8]:
        f = self.fabric
        up = (f.peer_node != NO_PEER) & (f.phys_state == PhysState.LINKUP)
        st = f.state
        fl = np.where(up & (st >= PortState.INIT), _F_LINK, 0)
        fl |= np.where(up & (st >= PortState.ARMED), _F_ARMED, 0)
        fl |= np.where(up & (st == PortState.ACTIVE), _F_ACTIVE, 0)
        return fl.astype(np.uint8)

    def _sync_port(self, node: int, port: int) -> None:
        """After a state change of one port: its flags and cached PortInfo."""
        f = self.fabric
        fl = 0
        if f.peer_node[node, port] != NO_PEER and f.phys_state[node, port] == PhysState.LINKUP:
            st = int(f.state[node, port])
            fl = (
                (_F_LINK if st >= PortState.INIT else 0)
                | (_F_ARMED if st >= PortState.ARMED else 0)
                | (_F_ACTIVE if st == PortState.ACTIVE else 0)
            )
        self._flags[node * self._P + port] = fl
        self._forget_port_info(node, port)

    def _forget_port_info(self, node: int, port: int) -> None:
        pp = self._P
        # external switch ports show port 0's LID, LMC and SM fields
        ports = range(self._nports[node] + 1) if port == 0 and self._is_sw[node] else (port,)
        for p in ports:
            self._pi_cache.pop(node * pp + p, None)
            self._pi_stale.add(node * pp + p)

    def _endport_mask(self) -> npt.NDArray[np.bool_]:
        """``[node, port]``: ports that own LIDs (switch port 0, CA ports)."""
        f = self.fabric
        m = f.port_exists.copy()
        m[f.node_type == NodeType.SWITCH, 1:] = False
        return m

    def _is_endport(self, node: int, port: int) -> bool:
        return port == 0 or not self._is_sw[node]

    @property
    def sm_lid(self) -> int:
        """The SM port's current base LID (0 until someone sets it)."""
        return int(self.fabric.lid[self.sm_node, self.sm_port])

    @property
    def traps(self) -> deque[bytes]:
        """Trap MADs (LID-routed Notices) that reached the SM's own port, oldest first."""
        return self.primary.traps

    @property
    def on_trap(self) -> Callable[[], None] | None:
        """Called after a trap is appended to :attr:`traps` (a transport drains them)."""
        return self.primary.on_trap

    @on_trap.setter
    def on_trap(self, fn: Callable[[], None] | None) -> None:
        self.primary.on_trap = fn

    # -- clients ----------------------------------------------------------------------

    def attach(self, node: int, port: int = 1) -> Endpoint:
        """Attach a client at ``(node, port)`` (port 0 on a switch): another host or a second SM.

        The SM's own port is :attr:`primary`; attaching there returns it.
        """
        f = self.fabric
        if not 0 <= node < self._n:
            raise EmulatorError(f"node {node} outside 0..{self._n - 1}")
        if self._is_sw[node]:
            port = 0
        elif not f.port_exists[node, port] or port == 0:
            raise EmulatorError(f"{f.port_name(node, port)}: no such port")
        key = node * self._P + port
        ep = self._endpoints.get(key)
        if ep is None:
            ep = self._endpoints[key] = Endpoint(node, port)
        return ep

    def detach(self, ep: Endpoint) -> None:
        """The client goes away: requests to its port are dropped again, its IsSM falls."""
        if ep is self.primary:
            raise EmulatorError("the SM's own port stays attached")
        self._endpoints.pop(ep.node * self._P + ep.port, None)
        self.set_issm(ep, False)

    def set_issm(self, ep: Endpoint, on: bool = True) -> None:
        """Raise or lower IsSM in the CapabilityMask of the client's port (as holding issm does)."""
        key = (ep.node, ep.port)
        if on == (key in self._issm):
            return
        if on:
            self._issm.add(key)
        else:
            self._issm.discard(key)
        self._forget_port_info(ep.node, ep.port)

    def endpoint_lid(self, ep: Endpoint) -> int:
        """The client port's current base LID (0 before an SM gives it one)."""
        return int(self.fabric.lid[ep.node, ep.port])

    def _client_at(self, node: int, in_port: int) -> Endpoint | None:
        """The client that takes requests at the end port a MAD arrived on, if any."""
        e = 0 if self._is_sw[node] else in_port
        ep = self._endpoints.get(node * self._P + e)
        return ep if ep is not None and ep.on_request is not None else None

    def reply(self, src: Endpoint, mad: bytes, to: Endpoint, to_lid: int) -> bool:
        """A client's answer to a request of client ``to`` (whose LID was ``to_lid``, 0xFFFF for a
        directed-route SMP, which goes back the way it came). LID-routed answers follow the LFTs and
        are lost where a request would be. RMPP ACK, STOP and ABORT (response-method MADs of the
        sender of a multi-segment answer) go to ``to``'s request taker. Returns whether it arrived.
        """
        st = self.stats
        st.received += 1
        if len(mad) < 24 or to.node * self._P + to.port not in self._endpoints:
            st.dropped += 1
            return False
        if self.drop_rate > 0.0 and self._rng.random() < self.drop_rate:
            st.dropped += 1
            return False
        if to_lid != PERMISSIVE_LID:
            src_lid = self.endpoint_lid(src)
            data_vl = mad[1] not in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR)
            if not src_lid:
                st.dropped += 1
                return False
            end = self._walk_lid(src.node, src.port, to_lid, data_vl)
            e = None if end is None else (0 if self._is_sw[end[0]] else end[1])
            if end is None or end[0] != to.node or e != to.port:
                st.dropped += 1
                return False
        else:
            src_lid = PERMISSIVE_LID
        st.answered += 1
        if mad[3] & 0x80 and mad[1] == _SA_CLASS and len(mad) > 25 and mad[25] in _RMPP_CONTROL:
            if to.on_request is not None:
                to.on_request(mad, src, src_lid)
                return True
            st.dropped += 1
            return False
        if to.on_reply is not None:
            to.on_reply(mad)
        return True

    @property
    def local_port(self) -> LocalPort:
        """The SM's attachment: node and port, their GUIDs, its current LID."""
        f = self.fabric
        return LocalPort(
            self.sm_node,
            self.sm_port,
            int(f.node_guid[self.sm_node]),
            int(f.port_guid[self.sm_node, self.sm_port]),
            self.sm_lid,
        )

    def switch_row(self, node: int) -> int:
        """LFT row of a switch node; EmulatorError for a CA."""
        r = self._sw_row[node]
        if r < 0:
            raise EmulatorError(f"node {self.fabric.names[node]!r} is not a switch")
        return r

    # -- the tables the devices hold, for tests and tools -------------------------------

    def _table_port(self, node: int, port: int) -> int:
        """Dense index of ``(node, port)``; EmulatorError if the port does not exist."""
        if not 0 <= node < self._n:
            raise EmulatorError(f"node {node} outside 0..{self._n - 1}")
        ix = int(self._port_ix[node, port]) if 0 <= port < self._P else -1
        if ix < 0:
            raise EmulatorError(f"{self.fabric.port_name(node, port)}: no such port")
        return ix

    def pkey_table(self, node: int, port: int) -> npt.NDArray[np.uint16]:
        """The P_KeyTable of ``(node, port)`` (switch port 0 too), a read-only view of its whole size:
        NodeInfo.PartitionCap entries for a CA port or switch port 0, PartitionEnforcementCap for a
        switch's external port."""
        ix = self._table_port(node, port)
        return _read_only(self._pkeys[self._pkey_off[ix] : self._pkey_off[ix + 1]])

    def sl2vl(self, node: int, in_port: int, out_port: int) -> npt.NDArray[np.uint8]:
        """The VL of each SL (``uint8[16]``, a copy) in the SLtoVLMappingTable of a switch's
        ``(in_port, out_port)`` pair, or of a CA's port ``out_port`` (``in_port`` 0, as the
        SLtoVLMappingTableRecord names it)."""
        self._table_port(node, out_port)
        np_ = self._nports[node]
        if self._is_sw[node]:
            self._table_port(node, in_port)
            k = self._sl2vl_base[node] + in_port * (np_ + 1) + out_port
        elif in_port != 0 or out_port == 0:
            raise EmulatorError(f"{self.fabric.names[node]!r} is a CA: its tables are (in port 0, out port 1..{np_})")
        else:
            k = self._sl2vl_base[node] + out_port - 1
        return sl2vl_unpack(self._sl2vl[k].tobytes())

    def vlarb(self, node: int, port: int, block: int) -> npt.NDArray[np.uint8]:
        """VLArbitrationTable ``block`` of ``(node, port)`` as a Get answers it: ``uint8[32, 2]`` of
        ``(VL, Weight)`` (a copy; entries beyond the VLArbitration cap are 0). Blocks 1 and 2 hold
        low priority entries 0-31 and 32-63, blocks 3 and 4 high priority ones."""
        ix = self._table_port(node, port)
        lo = (block - 1) % 2 * VLARB_BLOCK_SIZE
        if not 1 <= block <= 4 or lo >= VLARB_CAP:
            raise EmulatorError(f"VLArbitrationTable block {block}: the ports hold blocks 1 and 3 (cap {VLARB_CAP})")
        out = np.zeros((VLARB_BLOCK_SIZE, 2), np.uint8)
        held = self._vlarb[ix, (block - 1) // 2, lo : lo + VLARB_BLOCK_SIZE]
        out[: held.shape[0]] = held
        return out

    def mft(self, node: int) -> npt.NDArray[np.uint16]:
        """A switch's MulticastForwardingTable, a read-only view ``uint16[MulticastFDBCap, positions]``:
        entry ``[i, q]`` is the PortMask of MLID ``0xC000 + i`` for ports ``16*q .. 16*q+15``
        (bit ``p - 16*q`` set: forward out of port ``p``); EmulatorError for a CA."""
        if not 0 <= node < self._n:
            raise EmulatorError(f"node {node} outside 0..{self._n - 1}")
        row = self.switch_row(node)
        return _read_only(self._mft[row, : self.mft_cap, : self._nports[node] // MFT_PORTS_PER_POSITION + 1])

    def data_mask(self) -> npt.NDArray[np.bool_]:
        """``[node, port]``: ports that send data now (ACTIVE, peer ARMED/ACTIVE)."""
        fl = np.frombuffer(self._flags, np.uint8).reshape(self._n, self._P)
        f = self.fabric
        peer = np.where(f.peer_node != NO_PEER, f.peer_node, 0).astype(np.int64)
        pport = np.where(f.peer_port != NO_PEER, f.peer_port, 0).astype(np.int64)
        return ((fl & _F_ACTIVE) != 0) & ((fl[peer, pport] & _F_ARMED) != 0)

    # -- MAD entry point --------------------------------------------------------------

    def process(self, mad: bytes, dlid: int | None = None, *, src: Endpoint | None = None) -> bytes | None:
        """Answer one request MAD; None when it is dropped on the way (or is not answered).

        ``dlid`` is the destination LID of LID-routed SMPs and GMPs (the LRH is
        not part of the MAD); directed-route SMPs carry their path and ignore it.
        ``src`` is the client sending it (default: the SM's own port). A request
        that reaches a client's port and is the client's to answer (SMInfo, a
        GMP of a class other than PerfMgt) goes to that client's ``on_request``
        and None is returned here: its answer comes through :meth:`reply`.
        """
        if src is None:
            src = self.primary
        st = self.stats
        st.received += 1
        if self.drop_rate > 0.0 and self._rng.random() < self.drop_rate:
            st.dropped += 1
            return None
        if len(mad) >= 24 and mad[1] not in _DEVICE_CLASSES and dlid is not None:
            # A GMP no device answers (SA, or a client's own class): to the client at its DLID, if any.
            if self._to_client(mad, dlid, src):
                return None
            st.dropped += 1
            return None
        try:
            m = parse_mad(mad)
        except MadError:
            st.dropped += 1
            return None
        if m.is_response:
            st.dropped += 1
            return None
        if m.mgmt_class == MgmtClass.SUBN_LID and m.method == Method.TRAP_REPRESS:
            st.trap_represses += 1
            return None  # the switch stops repeating; a TrapRepress has no response
        if m.mgmt_class == MgmtClass.SUBN_LID and m.method == Method.TRAP and dlid is not None:
            self._trap_to_client(m, dlid, src)  # a client's own trap (an SM's Trap 144 to its master)
            return None
        if m.mgmt_class == MgmtClass.SUBN_DR:
            reply = self._process_dr(m, src)
        else:
            if dlid is None:
                raise EmulatorError(
                    f"MAD class {m.mgmt_class:#04x} attribute {m.attr_id:#06x} is LID routed: give its DLID"
                )
            reply = self._process_lid(m, dlid, src)
        if reply is _HANDED_ON:
            return None
        if reply is None:
            st.dropped += 1
        else:
            st.answered += 1
        return reply

    def _trap_to_client(self, m: Mad, dlid: int, src: Endpoint) -> None:
        """A Trap a client sends (as an SM's SMA would) to the client at ``dlid``: into its trap queue."""
        end = self._walk_lid(src.node, src.port, dlid, False) if self.fabric.lid[src.node, src.port] else None
        ep = self._endpoints.get(end[0] * self._P + (0 if self._is_sw[end[0]] else end[1])) if end else None
        if ep is None or ep is src:
            self.stats.traps_dropped += 1
            return
        ep.traps.append(m.raw)
        self.stats.traps_sent += 1
        if ep.on_trap is not None:
            ep.on_trap()

    def _to_client(self, mad: bytes, dlid: int, src: Endpoint) -> bool:
        """Carry a GMP (requests, and RMPP ACKs, which travel as responses) to the client owning
        ``dlid``; False when it is lost on the way or nobody listens there."""
        src_lid = int(self.fabric.lid[src.node, src.port])
        if not src_lid:
            return False
        end = self._walk_lid(src.node, src.port, dlid, True)
        if end is None:
            return False
        client = self._client_at(*end)
        if client is None or client is src:
            return False
        if mad[3] & 0x80 and not (mad[1] == _SA_CLASS and len(mad) > 25 and mad[25] in _RMPP_CONTROL):
            return False  # an answer goes through reply(), to the client that asked (RMPP ACKs are requests)
        client.on_request(mad, src, src_lid)  # type: ignore[misc]
        self.stats.answered += 1
        return True

    def _process_dr(self, m: Mad, src: Endpoint) -> bytes | None:
        # DrSLID/DrDLID are not looked at: every DR SMP is taken as directed all the way.
        if m.d_bit or m.hop_ptr != 0:
            return None
        walk = self._walk_dr(m.initial_path, src)
        if walk is None:
            return None
        node, in_port, ret, links = walk
        hide = False
        if self._keyed:  # some port holds an M_Key: its SMA checks what is addressed to it
            verdict = self._m_key_check(m, node, in_port, PERMISSIVE_LID, ret)
            if verdict == _MKEY_FAIL:
                return None
            hide = verdict == _MKEY_HIDE
        if m.attr_id == SmpAttr.SM_INFO:
            client = self._client_at(node, in_port)
            if client is not None and client is not src:
                # As the destination sees it: the return path recorded, the hop pointer at the end.
                buf = bytearray(m.raw)
                buf[RETURN_PATH_OFFSET + 1 : RETURN_PATH_OFFSET + 1 + len(ret)] = bytes(ret)
                buf[6] = len(ret)
                client.on_request(bytes(buf), src, PERMISSIVE_LID)  # type: ignore[misc]
                return _HANDED_ON
        data, status = self._answer(m, self._smp_handlers, node, in_port)
        if hide and m.attr_id == SmpAttr.PORT_INFO:
            data = bytes(_PI_M_KEY_END) + data[_PI_M_KEY_END:]
        flags = self._flags
        for k in links:  # the Set may have taken a link of the way back down
            if not flags[k] & _F_LINK:
                return None
        return make_response(m.raw, data, status, return_path=ret)

    def _walk_dr(self, path: tuple[int, ...], src: Endpoint) -> tuple[int, int, list[int], list[int]] | None:
        """End node, its ingress port, ReturnPath[1..] and the ports passed; None = dropped."""
        node = src.node
        if not path:
            return node, src.port, [], []
        is_sw = self._is_sw
        if not is_sw[node] and path[0] != src.port:
            return None  # a CA sends only out of the port the SM is bound to (C14-9:1)
        nports, flags, pn, pp, stride = self._nports, self._flags, self._pn, self._pp, self._P
        ret: list[int] = []
        links: list[int] = []
        q = 0
        for i, p in enumerate(path):
            if i and not is_sw[node]:
                return None  # a CA does not forward
            if p == 0 or p > nports[node]:
                return None
            k = node * stride + p
            if not flags[k] & _F_LINK:
                return None
            links.append(k)
            node = pn[k]
            q = pp[k]
            ret.append(q)
        if not self._present[node]:
            return None
        return node, q, ret, links

    def _process_lid(self, m: Mad, dlid: int, src: Endpoint) -> bytes | None:
        data_vl = m.mgmt_class != MgmtClass.SUBN_LID
        src_lid = int(self.fabric.lid[src.node, src.port])
        if not src_lid:
            return None  # a port without a LID cannot source LID-routed packets
        src_key = src.node * self._P + src.port
        end = self._walk_lid(src.node, src.port, dlid, data_vl)
        if end is None:
            return None
        node, in_port = end
        hide = False
        if self._keyed and m.mgmt_class == MgmtClass.SUBN_LID:
            verdict = self._m_key_check(m, node, in_port, src_lid, ())
            if verdict == _MKEY_FAIL:
                return None
            hide = verdict == _MKEY_HIDE
        device = m.mgmt_class == MgmtClass.PERF or (m.mgmt_class == MgmtClass.SUBN_LID and m.attr_id != SmpAttr.SM_INFO)
        if not device:
            client = self._client_at(node, in_port)
            if client is not None and client is not src:
                client.on_request(m.raw, src, src_lid)  # type: ignore[misc]
                return _HANDED_ON
            if m.mgmt_class != MgmtClass.SUBN_LID:
                return None  # a GMP for a port where nobody listens
        handlers = self._perf_handlers if m.mgmt_class == MgmtClass.PERF else self._smp_handlers
        data, status = self._answer(m, handlers, node, in_port)
        if hide and m.attr_id == SmpAttr.PORT_INFO:
            data = bytes(_PI_M_KEY_END) + data[_PI_M_KEY_END:]
        own = 0 if self._is_sw[node] else in_port
        back = self._walk_lid(node, own, src_lid, data_vl)
        if back is None or int(self._lid_owner[src_lid]) != src_key:
            return None
        return make_response(m.raw, data, status)

    def _walk_lid(self, node: int, port: int, dlid: int, data_vl: bool) -> tuple[int, int] | None:
        """Follow the LFTs from ``(node, port)`` (port 0 on a switch) to the owner of ``dlid``.

        Returns the destination node and the port the packet arrived on; None = dropped.
        """
        if not 0 < dlid <= MAX_UNICAST_LID:
            return None
        owner = int(self._lid_owner[dlid])
        if owner < 0:
            return None  # nobody owns it: the last switch or CA on the way drops it
        stride, flags, pn, pp = self._P, self._flags, self._pn, self._pp
        out_need = _F_ACTIVE if data_vl else _F_LINK
        in_need = _F_ARMED if data_vl else _F_LINK
        is_sw, present = self._is_sw, self._present
        ingress = port
        if not is_sw[node]:
            if owner == node * stride + port:
                return node, port
            k = node * stride + port
            if not flags[k] & out_need:
                return None
            node, ingress = pn[k], pp[k]
            if not flags[node * stride + ingress] & in_need:
                return None
        lft, top, nports, rows = self.lft, self.lft_top, self._nports, self._sw_row
        for _ in range(LID_HOP_LIMIT):
            if not present[node]:
                return None
            if not is_sw[node]:
                return (node, ingress) if owner == node * stride + ingress else None
            if owner == node * stride:
                return node, ingress
            row = rows[node]
            if dlid > top[row] or dlid >= lft.shape[1]:
                return None
            out = int(lft[row, dlid])
            if out == 0 or out > nports[node]:
                return None
            k = node * stride + out
            if not flags[k] & out_need:
                return None
            node, ingress = pn[k], pp[k]
            if not flags[node * stride + ingress] & in_need:
                return None
        return None

    def _answer(self, m: Mad, handlers: dict[int, Handler], node: int, in_port: int) -> tuple[bytes, int]:
        if m.class_version != 1:
            return m.data, int(MadStatus.BAD_VERSION)
        method = m.method
        if method != _GET and method != _SET:
            return m.data, int(MadStatus.METHOD_UNSUPPORTED)
        h = handlers.get(m.attr_id)
        if h is None:
            return m.data, _UNSUPPORTED
        return h(node, in_port, m.attr_mod, m.data, method == _SET)

    # -- SMP attribute handlers ----------------------------------------------------------

    def _node_info_base(self, node: int) -> bytes:
        f = self.fabric
        sw = self._is_sw[node]
        return NODE_INFO.pack(
            {
                "BaseVersion": 1,
                "ClassVersion": 1,
                "NodeType": int(f.node_type[node]),
                "NumPorts": int(f.nports[node]),
                "SystemImageGUID": int(f.sysimg_guid[node]),
                "NodeGUID": int(f.node_guid[node]),
                "PortGUID": int(f.port_guid[node, 0]) if sw else 0,
                "PartitionCap": self.switch_partition_cap if sw else self.partition_cap,
                "DeviceID": int(f.device_id[node]),
                "Revision": 0,
                "LocalPortNum": 0,
                "VendorID": int(f.vendor_id[node]) & 0xFFFFFF,
            }
        ).ljust(64, b"\0")

    def _h_node_info(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        if is_set:
            return data, _UNSUPPORTED
        key = node * self._P + in_port
        b = self._ni_cache.get(key)
        if b is None:
            b = self._ni_base[node]
            if not self._is_sw[node]:
                pg = int(self.fabric.port_guid[node, in_port])
                b = b[:_NI_PORT_GUID] + pg.to_bytes(8, "big") + b[_NI_PORT_GUID + 8 :]
            b = b[:_NI_LOCAL_PORT] + bytes((in_port,)) + b[_NI_LOCAL_PORT + 1 :]
            self._ni_cache[key] = b
        return b, _OK

    def _h_node_desc(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        if is_set:
            return data, _UNSUPPORTED
        return self._nd[node], _OK

    def _h_guid_info(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        # GUIDCap is 1: block 0 only, holding the port GUID, which a Set cannot change.
        if attr_mod != 0:
            return data, _INVALID
        port = 0 if self._is_sw[node] else in_port
        return int(self.fabric.port_guid[node, port]).to_bytes(8, "big"), _OK

    def _h_sm_info(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        port = 0 if self._is_sw[node] else in_port
        rec = self.sm_info.get((node, port))
        if rec is None or is_set:
            return data, _UNSUPPORTED  # no SM behind this port / handover is the SMs' business
        out = SM_INFO.pack(
            {
                "GUID": rec.guid,
                "SM_Key": rec.sm_key,
                "ActCount": rec.act_count & 0xFFFFFFFF,
                "Priority": rec.priority,
                "SMState": int(rec.state),
            }
        )
        return out, _OK

    def _h_switch_info(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        row = self._sw_row[node]
        if row < 0:
            return data, _UNSUPPORTED
        status = _OK
        if is_set:
            v = SWITCH_INFO.unpack(data)
            top = int(v["LinearFDBTop"])
            if top >= self.lft_cap:
                status = _INVALID
            else:
                self.lft_top[row] = top
                self.life_time[row] = int(v["LifeTimeValue"])
                if v["PortStateChange"]:
                    self.port_state_change[row] = False  # writing 1 clears it
        return self._switch_info_bytes(row), status

    def _switch_info_bytes(self, row: int) -> bytes:
        return SWITCH_INFO.pack(
            {
                "LinearFDBCap": self.lft_cap,
                "RandomFDBCap": 0,
                "MulticastFDBCap": self.mft_cap,
                "LinearFDBTop": int(self.lft_top[row]),
                "DefaultPort": 0,
                "DefaultMulticastPrimaryPort": 0xFF,
                "DefaultMulticastNotPrimaryPort": 0xFF,
                "LifeTimeValue": int(self.life_time[row]),
                "PortStateChange": int(self.port_state_change[row]),
                "LIDsPerPort": 0,
                "PartitionEnforcementCap": self.partition_enforcement_cap,
                "EnhancedPort0": 0,
            }
        )

    def _h_lft(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        row = self._sw_row[node]
        if row < 0:
            return data, _UNSUPPORTED
        if attr_mod >= self.lft_cap // LFT_BLOCK:
            return data, _INVALID
        lo = attr_mod * LFT_BLOCK
        if is_set:
            self._lft_cover(lo + LFT_BLOCK - 1)
            self._lft[row, lo : lo + LFT_BLOCK] = np.frombuffer(data, np.uint8, LFT_BLOCK)
        elif lo >= self.lft.shape[1]:
            return _NO_ROUTE_BLOCK, _OK  # beyond every LID in use: nothing programmed there
        return self._lft[row, lo : lo + LFT_BLOCK].tobytes(), _OK

    def _h_mft(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        # Modifier: block (32 MLIDs) in bits 0-8, position (16 ports a PortMask) in bits 28-31.
        row = self._sw_row[node]
        if row < 0:
            return data, _UNSUPPORTED  # a CA has no MFT
        lo = (attr_mod & 0x1FF) * MFT_BLOCK_SIZE
        n = min(MFT_BLOCK_SIZE, self.mft_cap - lo)
        if n <= 0 or attr_mod >> 28 > self._nports[node] // MFT_PORTS_PER_POSITION:
            return data, _INVALID
        masks = self._mft[row, lo : lo + n, attr_mod >> 28]
        if is_set:
            masks[:] = np.frombuffer(data, ">u2", n)
        return masks.astype(">u2").tobytes(), _OK

    def _h_pkey_table(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        # Modifier: block (32 P_Keys) in bits 0-15; a switch's port in bits 16-23. A CA answers
        # for the port the SMP arrived on whatever the port bits say (as ibsim).
        if self._is_sw[node]:
            port = attr_mod >> 16 & 0xFF
            if port > self._nports[node]:
                return data, _INVALID
        else:
            port = in_port
        ix = int(self._port_ix[node, port])
        lo = int(self._pkey_off[ix]) + (attr_mod & 0xFFFF) * PKEY_BLOCK_SIZE
        n = min(PKEY_BLOCK_SIZE, int(self._pkey_off[ix + 1]) - lo)
        if n <= 0:
            return data, _INVALID  # beyond PartitionCap / PartitionEnforcementCap
        keys = self._pkeys[lo : lo + n]
        if is_set:
            keys[:] = np.frombuffer(data, ">u2", n)
        return keys.astype(">u2").tobytes(), _OK

    def _h_sl2vl(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        # Modifier: a switch's input port in bits 8-15, output port in bits 0-7; the bits above
        # (optimized programming, IBA 1.3) are refused, as SwitchInfo does not offer it. A CA
        # answers for the port the SMP arrived on (the modifier is 0; ibsim ignores it, so do we).
        np_ = self._nports[node]
        if self._is_sw[node]:
            i, o = attr_mod >> 8 & 0xFF, attr_mod & 0xFF
            if attr_mod >> 16 or i > np_ or o > np_:
                return data, _INVALID
            k = self._sl2vl_base[node] + i * (np_ + 1) + o
        else:
            k = self._sl2vl_base[node] + in_port - 1
        table = self._sl2vl[k]
        if is_set:
            table[:] = np.frombuffer(data, np.uint8, SL2VL_SIZE)
        return table.tobytes(), _OK

    def _h_vlarb(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        # Modifier: block in bits 16-31 (1, 2: low priority entries 0-31, 32-63; 3, 4: high
        # priority 0-31, 32-63); a switch's port in bits 0-7 (a CA: the arrival port). Entries
        # beyond the port's VLArbitration cap are not kept: 0 in a Get, dropped from a Set;
        # a block wholly beyond it is refused (as ibsim).
        if self._is_sw[node]:
            port = attr_mod & 0xFF
            if port > self._nports[node]:
                return data, _INVALID
        else:
            port = in_port
        block = attr_mod >> 16
        lo = (block - 1) % 2 * VLARB_BLOCK_SIZE
        n = min(VLARB_BLOCK_SIZE, VLARB_CAP - lo)
        if not 1 <= block <= 4 or n <= 0:
            return data, _INVALID
        entries = self._vlarb[int(self._port_ix[node, port]), (block - 1) // 2, lo : lo + n]
        if is_set:
            raw = np.frombuffer(data, np.uint8, 2 * n).reshape(n, 2)
            entries[:, 0] = raw[:, 0] & 0xF  # the 4 bits above the VL are reserved
            entries[:, 1] = raw[:, 1]
        return entries.tobytes(), _OK

    def _h_port_info(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        if attr_mod == 0 and not self._is_sw[node]:
            port = in_port
        elif attr_mod > self._nports[node]:
            return data, _INVALID
        else:
            port = attr_mod
        status = self._set_port_info(node, port, data) if is_set else _OK
        key = node * self._P + port
        b = self._pi_cache.get(key)
        if b is None:
            if key in self._pi_stale:
                b = self._port_info_bytes(node, port)
                self._pi_stale.discard(key)
                self._pi_rows[key] = np.frombuffer(b, np.uint8)
            else:
                b = self._pi_rows[key].tobytes()
            self._pi_cache[key] = b
        return b[:_PI_LOCAL_PORT] + bytes((in_port,)) + b[_PI_LOCAL_PORT + 1 :], status

    def _port_info_bytes(self, node: int, port: int) -> bytes:
        f = self.fabric
        e = 0 if self._is_sw[node] else port  # where LID, LMC and the SM fields live
        speed = int(f.speed_active[node, port])
        cap = int(f.speed_cap[node, port])
        caps = int(self.capability_mask[node, port])
        if (node, e) in self.sm_info or (node, e) in self._issm:
            caps |= int(PortCap.IS_SM)
        return PORT_INFO.pack(
            {
                "M_Key": int(self._m_key[node, e]),
                "GIDPrefix": int(self.gid_prefix[node, e]),
                "LID": int(f.lid[node, e]),
                "MasterSMLID": int(self.master_sm_lid[node, e]),
                "CapabilityMask": caps,
                "M_KeyLeasePeriod": int(self._m_key_lease[node, e]),
                "LocalPortNum": 0,
                "LinkWidthEnabled": int(self.width_enabled[node, port]),
                "LinkWidthSupported": int(f.width_cap[node, port]),
                "LinkWidthActive": int(f.width_active[node, port]),
                "LinkSpeedSupported": _LS_SUP[cap],
                "PortState": int(f.state[node, port]),
                "PortPhysicalState": int(f.phys_state[node, port]),
                "LinkDownDefaultState": int(PhysState.POLLING),
                "M_KeyProtectBits": int(self._m_key_protect[node, e]),
                "LMC": int(f.lmc[node, e]),
                "LinkSpeedActive": _LS_ACT[speed],
                "LinkSpeedEnabled": int(self.speed_enabled[node, port]),
                "NeighborMTU": int(f.mtu_active[node, port]),
                "MasterSMSL": int(self.master_sm_sl[node, e]),
                "VLCap": int(f.vl_cap[node, port]),
                "VLHighLimit": int(self.vl_high_limit[node, port]),
                "VLArbitrationHighCap": VLARB_CAP,
                "VLArbitrationLowCap": VLARB_CAP,
                "MTUCap": int(f.mtu_cap[node, port]),
                "VLStallCount": int(self.vl_stall[node, port]),
                "HOQLife": int(self.hoq_life[node, port]),
                "OperationalVLs": int(f.op_vls[node, port]),
                "M_KeyViolations": int(self._m_key_violations[node, e]),
                "GUIDCap": 1,
                "SubnetTimeOut": int(self.subnet_timeout[node, e]),
                "RespTimeValue": 16,
                "LinkSpeedExtActive": _LSE_ACT[speed],
                "LinkSpeedExtSupported": _LSE_SUP[cap],
                "LinkSpeedExtEnabled": int(self.speed_ext_enabled[node, port]),
                "PartitionEnforcementInbound": int(self.part_enforce_in[node, port]),
                "PartitionEnforcementOutbound": int(self.part_enforce_out[node, port]),
            }
        )

    def _port_info_rows(self) -> npt.NDArray[np.uint8]:
        """Every port's PortInfo image at once (the same bytes as :meth:`_port_info_bytes`)."""
        f = self.fabric
        n, pp = self._n, self._P
        node = np.repeat(np.arange(n), pp)
        port = np.tile(np.arange(pp), n)
        e = np.where(f.node_type[node] == NodeType.SWITCH, 0, port)
        caps = self.capability_mask[node, port].astype(np.uint64)
        for nd, pt in {*self.sm_info, *self._issm}:
            caps[(node == nd) & (e == pt)] |= np.uint64(PortCap.IS_SM)
        speed = f.speed_active[node, port].astype(np.intp)
        cap = f.speed_cap[node, port].astype(np.intp)
        values: dict[str, npt.ArrayLike] = {
            "M_Key": self._m_key[node, e],
            "GIDPrefix": self.gid_prefix[node, e],
            "LID": f.lid[node, e],
            "MasterSMLID": self.master_sm_lid[node, e],
            "CapabilityMask": caps,
            "M_KeyLeasePeriod": self._m_key_lease[node, e],
            "LinkWidthEnabled": self.width_enabled[node, port],
            "LinkWidthSupported": f.width_cap[node, port],
            "LinkWidthActive": f.width_active[node, port],
            "LinkSpeedSupported": np.array(_LS_SUP)[cap],
            "PortState": f.state[node, port],
            "PortPhysicalState": f.phys_state[node, port],
            "LinkDownDefaultState": int(PhysState.POLLING),
            "M_KeyProtectBits": self._m_key_protect[node, e],
            "LMC": f.lmc[node, e],
            "LinkSpeedActive": np.array(_LS_ACT)[speed],
            "LinkSpeedEnabled": self.speed_enabled[node, port],
            "NeighborMTU": f.mtu_active[node, port],
            "MasterSMSL": self.master_sm_sl[node, e],
            "VLCap": f.vl_cap[node, port],
            "VLHighLimit": self.vl_high_limit[node, port],
            "VLArbitrationHighCap": VLARB_CAP,
            "VLArbitrationLowCap": VLARB_CAP,
            "MTUCap": f.mtu_cap[node, port],
            "VLStallCount": self.vl_stall[node, port],
            "HOQLife": self.hoq_life[node, port],
            "OperationalVLs": f.op_vls[node, port],
            "M_KeyViolations": self._m_key_violations[node, e],
            "GUIDCap": 1,
            "SubnetTimeOut": self.subnet_timeout[node, e],
            "RespTimeValue": 16,
            "LinkSpeedExtActive": np.array(_LSE_ACT)[speed],
            "LinkSpeedExtSupported": np.array(_LSE_SUP)[cap],
            "LinkSpeedExtEnabled": self.speed_ext_enabled[node, port],
            "PartitionEnforcementInbound": self.part_enforce_in[node, port],
            "PartitionEnforcementOutbound": self.part_enforce_out[node, port],
        }
        return _pack_rows(PORT_INFO, values, n * pp)

    def _set_port_info(self, node: int, port: int, data: bytes) -> int:
        """Check a PortInfo Set as a whole, then copy in what the port accepts; MAD status.

        PortState: 0 or the current state: no change; DOWN from any state (the link
        drops and retrains, both ends come back in INIT); ARMED from INIT; ACTIVE from
        ARMED; anything else is refused with INVALID_FIELD and nothing changes.
        PortPhysicalState: 0 or the current one: no change; POLLING enables a disabled
        port; DISABLED takes the link down and keeps it down.
        LID, LMC, MasterSMLID, MasterSMSL, M_Key, M_KeyProtectBits, M_KeyLeasePeriod,
        GIDPrefix, SubnetTimeOut apply to end ports only (switch port 0, CA ports);
        M_KeyViolations 0 clears the port's count (other values leave it, as the Linux SMAs
        do). NeighborMTU and OperationalVLs (0 = no change) are capped at MTUCap and VLCap.
        State fields of switch port 0 are ignored.
        """
        f = self.fabric
        v = PORT_INFO.unpack(data)
        mgmt = self._is_sw[node] and port == 0
        end = self._is_endport(node, port)
        cur = int(f.state[node, port])
        want = int(v["PortState"])
        new_state: int | None = None
        if mgmt or want == 0 or (want == cur and want != PortState.DOWN):
            pass  # a read-modify-write sends the current state back: no change
        elif want == PortState.DOWN:
            new_state = PortState.DOWN
        elif (want, cur) in ((PortState.ARMED, PortState.INIT), (PortState.ACTIVE, PortState.ARMED)):
            new_state = want
        else:
            return _INVALID
        phys = 0 if mgmt else int(v["PortPhysicalState"])
        if phys == f.phys_state[node, port] and phys != PhysState.POLLING:
            phys = 0
        if phys not in (0, PhysState.POLLING, PhysState.DISABLED):
            return _INVALID
        lid, lmc = int(v["LID"]), int(v["LMC"])
        if end and lid and lid + (1 << lmc) - 1 > MAX_UNICAST_LID:
            return _INVALID
        mtu, vls = int(v["NeighborMTU"]), int(v["OperationalVLs"])
        if mtu > 5 or vls > 5:
            return _INVALID
        # -- accepted: copy in
        if end:
            self._set_lid(node, port, lid, lmc)
            self.master_sm_lid[node, port] = v["MasterSMLID"]
            self.master_sm_sl[node, port] = v["MasterSMSL"]
            self._store_m_key(node, port, int(v["M_Key"]), int(v["M_KeyProtectBits"]), int(v["M_KeyLeasePeriod"]))
            if not v["M_KeyViolations"]:
                self._m_key_violations[node, port] = 0
            self.gid_prefix[node, port] = v["GIDPrefix"]
            self.subnet_timeout[node, port] = v["SubnetTimeOut"]
        if mtu:
            f.mtu_active[node, port] = min(mtu, int(f.mtu_cap[node, port]))
        if vls:
            f.op_vls[node, port] = min(vls, int(f.vl_cap[node, port]))
        w = int(v["LinkWidthEnabled"])
        if w:
            self.width_enabled[node, port] = f.width_cap[node, port] if w == 0xFF else w & 0x1F
        s = int(v["LinkSpeedEnabled"])
        if s:
            cap = int(f.speed_cap[node, port])
            sup = speed_supported_portinfo(speeds_up_to(Speed(cap)))[0] if cap else 0
            self.speed_enabled[node, port] = sup if s == 0xF else s
        self.vl_high_limit[node, port] = v["VLHighLimit"]
        self.hoq_life[node, port] = v["HOQLife"]
        self.vl_stall[node, port] = v["VLStallCount"]
        if self._is_sw[node] and port and self.pkey_table(node, port).size:
            self.part_enforce_in[node, port] = v["PartitionEnforcementInbound"]
            self.part_enforce_out[node, port] = v["PartitionEnforcementOutbound"]
        self._forget_port_info(node, port)
        changed: set[int] = set()
        if phys == PhysState.DISABLED and not self.disabled[node, port]:
            self.disabled[node, port] = True
            changed |= self._retrain(node, port)
        elif phys == PhysState.POLLING and self.disabled[node, port]:
            self.disabled[node, port] = False
            f.phys_state[node, port] = PhysState.POLLING
            changed |= self._retrain(node, port)
        if new_state == PortState.DOWN:
            if f.phys_state[node, port] == PhysState.LINKUP:
                changed |= self._take_down(node, port)
                changed |= self._retrain(node, port)
        elif new_state is not None:
            f.state[node, port] = new_state
            self._sync_port(node, port)
        self._raise_traps(changed)
        return _OK

    def _set_lid(self, node: int, port: int, lid: int, lmc: int) -> None:
        f = self.fabric
        key = node * self._P + port
        old, old_lmc = int(f.lid[node, port]), int(f.lmc[node, port])
        if old == lid and old_lmc == lmc:
            return
        if old:
            seg = self._lid_owner[old : old + (1 << old_lmc)]
            seg[seg == key] = -1
        f.lid[node, port] = lid
        f.lmc[node, port] = lmc
        if lid:
            self._lid_owner[lid : lid + (1 << lmc)] = key
            self._lid_top = max(self._lid_top, min(lid + (1 << lmc) - 1, self.lft_cap - 1))
        self._forget_port_info(node, port)

    # -- PerfMgt handlers ---------------------------------------------------------------

    def _h_class_port_info(
        self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool
    ) -> tuple[bytes, int]:
        if is_set:
            return data, _UNSUPPORTED
        cap = int(PerfCap.IS_PORT_XMIT_WAIT_SUPPORTED)
        if self.pma_ext_width[node]:
            cap |= int(PerfCap.IS_EXTENDED_WIDTH_SUPPORTED)
        if self._is_sw[node]:
            cap |= int(PerfCap.IS_ALL_PORT_SELECT_SUPPORTED)
        out = CLASS_PORT_INFO.pack({"BaseVersion": 1, "ClassVersion": 1, "CapabilityMask": cap, "RespTimeValue": 18})
        return out, _OK

    def _pma_ports(self, node: int, select: int) -> list[int] | None:
        """Ports a PortSelect names: one port, or every port of a switch for 0xFF."""
        if select == 0xFF and self._is_sw[node]:
            return list(range(1, self._nports[node] + 1))
        if select > self._nports[node] or (select == 0 and not self._is_sw[node]):
            return None
        return [select]

    def _h_port_counters(self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool) -> tuple[bytes, int]:
        select = data[1]
        ports = self._pma_ports(node, select)
        if ports is None:
            return data, _INVALID
        if is_set:
            v = PORT_COUNTERS.unpack(data)
            sel2 = int(v["CounterSelect2"])
            mask = int(v["CounterSelect"]) | (sel2 & 1) << Counter.XMIT_WAIT | (sel2 >> 1 & 1) << Counter.QP1_DROPPED
            sel = [i for i in range(N_PC32) if mask >> i & 1]
            if sel:
                want = np.array([int(v[_PC32_FIELDS[i]]) for i in sel], np.uint64)
                for p in ports:
                    r = int(self._pma_ix[node, p])
                    self._base32[r, sel] = self._ctr[r, sel] - want
        if len(ports) == 1:
            r = int(self._pma_ix[node, select])
            diff = (self._ctr[r, :N_PC32] - self._base32[r]).tolist()
            vals = [d if d < top else top for d, top in zip(diff, _PC32_MAX_LIST, strict=True)]
        else:
            rows = self._pma_ix[node, ports]
            per_port = self._ctr[rows, :N_PC32] - self._base32[rows]
            total = np.minimum(per_port, _PC32_MAX).sum(axis=0, dtype=np.uint64)
            vals = np.minimum(total, _PC32_MAX).tolist()
        out: dict[str, int] = dict(zip(_PC32_FIELDS, vals, strict=True))
        out["PortSelect"] = select
        return PORT_COUNTERS.pack(out), _OK

    def _h_port_counters_ext(
        self, node: int, in_port: int, attr_mod: int, data: bytes, is_set: bool
    ) -> tuple[bytes, int]:
        if not self.pma_ext_width[node]:
            return data, _UNSUPPORTED
        select = data[1]
        ports = self._pma_ports(node, select)
        if ports is None:
            return data, _INVALID
        if is_set:
            v = PORT_COUNTERS_EXT.unpack(data)
            mask = int(v["CounterSelect"])
            sel = [i for i in range(len(_PCX_FIELDS)) if mask >> i & 1]
            if sel:
                want = np.array([int(v[_PCX_FIELDS[i]]) for i in sel], np.uint64)
                cidx = _PCX_COUNTERS[sel]
                for p in ports:
                    r = int(self._pma_ix[node, p])
                    self._base64[r, sel] = self._ctr[r, cidx] - want
        rows = self._pma_ix[node, ports]
        diff = self._ctr[rows][:, _PCX_COUNTERS] - self._base64[rows]
        out: dict[str, int] = dict(zip(_PCX_FIELDS, diff.sum(axis=0, dtype=np.uint64).tolist(), strict=True))
        out["PortSelect"] = select
        return PORT_COUNTERS_EXT.pack(out), _OK

    # -- physical events ------------------------------------------------------------------

    def _check_port(self, node: int, port: int) -> None:
        if not 0 <= node < self._n:
            raise EmulatorError(f"node {node} outside 0..{self._n - 1}")
        if not 1 <= port <= self._nports[node]:
            raise EmulatorError(f"{self.fabric.port_name(node, port)}: no such port (1..{self._nports[node]})")

    def _cabled(self, node: int, port: int) -> tuple[int, int]:
        self._check_port(node, port)
        k = node * self._P + port
        m = self._pn[k]
        if m == NO_PEER:
            raise EmulatorError(f"{self.fabric.port_name(node, port)}: no cable")
        return m, self._pp[k]

    def _should_be_up(self, node: int, port: int) -> bool:
        k = node * self._P + port
        m, q = self._pn[k], self._pp[k]
        return bool(
            m != NO_PEER
            and self._present[node]
            and self._present[m]
            and self.cable_up[node, port]
            and not self.disabled[node, port]
            and not self.disabled[m, q]
        )

    def _ends(self, node: int, port: int) -> list[tuple[int, int]]:
        k = node * self._P + port
        m = self._pn[k]
        return [(node, port)] if m == NO_PEER else [(node, port), (m, self._pp[k])]

    def _take_down(self, node: int, port: int) -> set[int]:
        """The link at (node, port) drops: both ends DOWN; LinkDowned counts; PortStateChange."""
        f = self.fabric
        if f.phys_state[node, port] != PhysState.LINKUP:
            return set()
        ends = self._ends(node, port)
        f.link_down(node, port)
        for a, b in ends:
            if self.disabled[a, b]:
                f.phys_state[a, b] = PhysState.DISABLED
            self._ctr[self._pma_ix[a, b], Counter.LINK_DOWNED] += np.uint64(1)
            self._sync_port(a, b)
        return self._mark_state_change(ends)

    def _retrain(self, node: int, port: int) -> set[int]:
        """Bring the link at (node, port) to what cable, presence and Disable allow."""
        f = self.fabric
        up = f.phys_state[node, port] == PhysState.LINKUP
        want = self._should_be_up(node, port)
        if up and not want:
            return self._take_down(node, port)
        if want and not up:
            ends = self._ends(node, port)
            f.link_up(node, port, state=PortState.INIT)
            for a, b in ends:
                self._sync_port(a, b)
            return self._mark_state_change(ends)
        if not up and self.disabled[node, port] and f.phys_state[node, port] != PhysState.DISABLED:
            f.phys_state[node, port] = PhysState.DISABLED
            self._sync_port(node, port)
        return set()

    def _mark_state_change(self, ends: list[tuple[int, int]]) -> set[int]:
        out: set[int] = set()
        for a, _ in ends:
            r = self._sw_row[a]
            if r >= 0 and self._present[a]:
                self.port_state_change[r] = True
                out.add(a)
        return out

    def link_down(self, node: int, port: int) -> None:
        """The link at (node, port) fails (cable pulled): both ends DOWN/POLLING."""
        m, q = self._cabled(node, port)
        self.cable_up[node, port] = self.cable_up[m, q] = False
        self._raise_traps(self._retrain(node, port))

    def link_up(self, node: int, port: int) -> None:
        """The cable at (node, port) carries signal again: both ends train to INIT (LinkUp).

        A link whose end is disabled or whose node is removed stays down.
        """
        m, q = self._cabled(node, port)
        self.cable_up[node, port] = self.cable_up[m, q] = True
        self._raise_traps(self._retrain(node, port))

    def remove_node(self, node: int) -> None:
        """The node vanishes (power loss): its links go down and it answers nothing."""
        if not 0 <= node < self._n:
            raise EmulatorError(f"node {node} outside 0..{self._n - 1}")
        if node == self.sm_node:
            raise EmulatorError(f"node {self.fabric.names[node]!r} carries the SM; it cannot be removed")
        if not self._present[node]:
            return
        self._present[node] = 0
        changed: set[int] = set()
        for p in range(1, self._nports[node] + 1):
            changed |= self._retrain(node, p)
        changed.discard(node)
        self._raise_traps(changed)

    def restore_node(self, node: int, *, reset: bool = True) -> None:
        """The node comes back (power on): its cabled links train to INIT.

        With ``reset`` (a power cycle) its LIDs, LFT, MFT, SwitchInfo, PortInfo settings,
        P_Key, SL-to-VL and VL arbitration tables and counters start from scratch.
        """
        if not 0 <= node < self._n:
            raise EmulatorError(f"node {node} outside 0..{self._n - 1}")
        if self._present[node]:
            return
        self._present[node] = 1
        if reset:
            self._reset_node(node)
        changed: set[int] = set()
        for p in range(1, self._nports[node] + 1):
            changed |= self._retrain(node, p)
        self._raise_traps(changed)

    def is_present(self, node: int) -> bool:
        return bool(self._present[node])

    def _reset_node(self, node: int) -> None:
        f = self.fabric
        ex = f.port_exists[node]
        for p in np.flatnonzero(ex).tolist():
            if self._is_endport(node, p):
                self._set_lid(node, p, 0, 0)
        for arr in (
            self.master_sm_lid,
            self.master_sm_sl,
            self._m_key,
            self._m_key_lease,
            self._m_key_protect,
            self._m_key_violations,
            self.subnet_timeout,
            self.vl_high_limit,
            self.part_enforce_in,
            self.part_enforce_out,
        ):
            arr[node] = 0
        for k in [k for k in self._keyed if k // self._P == node]:
            del self._keyed[k]
            self._lease_ends.pop(k, None)
        self.gid_prefix[node] = DEFAULT_GID_PREFIX
        self.disabled[node] = False
        self.width_enabled[node] = np.where(ex, f.width_cap[node], 0)
        f.mtu_active[node] = np.where(ex, f.mtu_cap[node], 0)
        f.op_vls[node] = np.where(ex, 1, 0)
        mine = self._port_ix[node][ex]
        self._ctr[mine] = 0
        self._base32[mine] = 0
        self._base64[mine] = 0
        self._residue[:, mine] = 0.0
        r = self._sw_row[node]
        if r >= 0:
            self._lft[r] = _NO_ROUTE
            self.lft_top[r] = 0
            self.port_state_change[r] = False
            self.life_time[r] = 18
            self._mft[r] = 0
        ports = self._port_ix[node][ex]
        s0 = self._sl2vl_base[node]
        s1 = self._sl2vl_base[node + 1] if node + 1 < self._n else self._sl2vl.shape[0]
        self._reset_port_tables(int(ports[0]), int(ports[-1]) + 1, s0, s1)
        for p in range(self._nports[node] + 1):
            self._forget_port_info(node, p)

    # -- traps ----------------------------------------------------------------------------

    def _raise_traps(self, switches: set[int]) -> None:
        for sw in sorted(switches):
            if self._present[sw]:
                self._trap128(sw)

    def _trap128(self, sw: int) -> None:
        """Trap 128 from ``sw`` to its MasterSMLID, if it has a LID and its LFTs lead there."""
        self._send_trap(sw, 0, lambda lid: trap128_pack(lid))

    def _send_trap(self, node: int, port: int, notice: Callable[[int], bytes]) -> None:
        """A Trap(Notice) from end port ``(node, port)`` to its MasterSMLID, if the port has a LID and
        the LFTs lead there; ``notice`` makes the Notice from the port's LID (the IssuerLID)."""
        f = self.fabric
        lid = int(f.lid[node, port])
        sm_lid = int(self.master_sm_lid[node, port])
        end = self._walk_lid(node, port, sm_lid, False) if lid and sm_lid else None
        owner = int(self._lid_owner[sm_lid]) if end is not None else -1
        ep = self._endpoints.get(owner) if owner >= 0 else None
        if ep is None or end is None or end[0] != ep.node:
            self.stats.traps_dropped += 1
            return
        self._trap_tid = self._trap_tid + 1 if self._trap_tid < 0xFFFFFFFF else 1
        ep.traps.append(trap_mad(notice(lid), self._trap_tid))
        self.stats.traps_sent += 1
        if ep.on_trap is not None:
            ep.on_trap()

    # -- M_Key protection (IBA 14.2.4) ----------------------------------------------------

    def _m_key_check(self, m: Mad, node: int, in_port: int, requester_lid: int, ret: Sequence[int]) -> int:
        """The M_Key check of the SMA ``m`` is addressed to (C14-16): pass, pass with PortInfo's M_Key
        hidden, or fail (counted, trapped, the lease timer started). ``requester_lid`` is the SMP's
        source LID (0xFFFF for a directed-route SMP), ``ret`` its ReturnPath at the destination."""
        e = 0 if self._is_sw[node] else in_port
        k = node * self._P + e
        key = self._keyed.get(k)
        if key is None:
            return _MKEY_PASS  # the port's M_Key is 0: nothing is checked (C14-5)
        method = m.method
        if method != _GET and method != _SET:
            return _MKEY_PASS  # refused as unsupported by the handler, whatever its key
        now = self.clock()
        ends = self._lease_ends.get(k)
        if ends is not None and now >= ends:
            self._lease_expired(k)
            ends = None
        if m.mkey == key:
            if ends is not None:
                del self._lease_ends[k]  # the right key stops the lease timer
            return _MKEY_PASS
        level = int(self._m_key_protect[node, e])
        if method == _GET and level < 2:
            return _MKEY_HIDE if level == 1 else _MKEY_PASS
        # -- a violation: dropped, counted, trapped; the lease starts
        if self._m_key_violations[node, e] < _M_KEY_VIOLATIONS_MAX:
            self._m_key_violations[node, e] += 1
        self.stats.m_key_violations += 1
        lease = int(self._m_key_lease[node, e])
        if lease and ends is None:
            self._lease_ends[k] = now + lease
        self._forget_port_info(node, e)
        dr = m.mgmt_class == MgmtClass.SUBN_DR
        producer = ProducerType.SWITCH if self._is_sw[node] else ProducerType.CA
        self._send_trap(
            node,
            e,
            lambda lid: trap256_pack(
                lid,
                lid=requester_lid,
                method=method,
                attr_id=m.attr_id,
                attr_mod=m.attr_mod,
                m_key=m.mkey,
                dr_slid=m.dr_slid if dr else None,
                dr_return_path=ret,
                producer_type=producer,
            ),
        )
        return _MKEY_FAIL

    def _lease_expired(self, k: int) -> None:
        """The M_Key lease of end port ``k`` ran out: its protect bits fall to 0 (the key stays)."""
        del self._lease_ends[k]
        node, e = divmod(k, self._P)
        self._m_key_protect[node, e] = 0
        self._forget_port_info(node, e)

    def _expire_leases(self) -> None:
        if self._lease_ends:
            now = self.clock()
            for k in [k for k, t in self._lease_ends.items() if now >= t]:
                self._lease_expired(k)

    def _store_m_key(self, node: int, port: int, key: int, protect: int, lease: int) -> None:
        """Write an end port's M_Key, M_KeyProtectBits and M_KeyLeasePeriod and keep the check's index."""
        k = node * self._P + port
        self._m_key[node, port] = key
        self._m_key_protect[node, port] = protect
        self._m_key_lease[node, port] = lease
        if key:
            self._keyed[k] = key
        else:
            self._keyed.pop(k, None)
            self._lease_ends.pop(k, None)
        self._forget_port_info(node, port)

    @property
    def m_key_checking(self) -> bool:
        """Whether some end port holds a non-zero M_Key; while none does, SMPs skip the M_Key check."""
        return bool(self._keyed)

    @property
    def m_key_protect(self) -> npt.NDArray[np.uint8]:
        """PortInfo.M_KeyProtectBits of each end port (read only), leases that ran out by now applied."""
        self._expire_leases()
        return self._m_key_protect_ro

    def m_key_lease_ends(self, node: int, port: int) -> float | None:
        """When the running M_Key lease of ``(node, port)`` (port 0 on a switch) runs out, on
        :attr:`clock`; None when no lease timer runs there."""
        e = self._end_port(node, port)
        self._expire_leases()
        return self._lease_ends.get(node * self._P + e)

    def set_m_key(self, node: int, port: int, key: int, *, protect: int = 0, lease: int = 0) -> None:
        """Give end port ``(node, port)`` (a switch: its port 0, whatever ``port`` says) an M_Key,
        M_KeyProtectBits and M_KeyLeasePeriod, as an SM's PortInfo Set would (a running lease timer
        stops, as the Set's passing check would stop it); key 0 turns the check off there."""
        e = self._end_port(node, port)
        if not 0 <= key < 1 << 64:
            raise EmulatorError(f"M_Key {key:#x} does not fit 64 bits")
        if not 0 <= protect <= 3:
            raise EmulatorError(f"M_KeyProtectBits {protect} outside 0..3")
        if not 0 <= lease <= 0xFFFF:
            raise EmulatorError(f"M_KeyLeasePeriod {lease} outside 0..65535")
        self._lease_ends.pop(node * self._P + e, None)
        self._store_m_key(node, e, key, protect, lease)

    def _end_port(self, node: int, port: int) -> int:
        """The end port holding ``(node, port)``'s M_Key: 0 on a switch; EmulatorError for no such port."""
        if not 0 <= node < self._n:
            raise EmulatorError(f"node {node} outside 0..{self._n - 1}")
        if self._is_sw[node]:
            return 0
        if not 1 <= port <= self._nports[node] or not self.fabric.port_exists[node, port]:
            raise EmulatorError(f"{self.fabric.port_name(node, port)}: no such port")
        return port

    # -- counters -------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of traffic flow: every sending port's counters grow by its rates.

        PortXmitData/PortRcvData count 4-byte words; the receive side of a link mirrors
        its peer's transmit side. Fractions carry over to the next call.
        """
        if seconds < 0:
            raise EmulatorError(f"advance: negative time {seconds}")
        shape = (self._n, self._P)
        rates = self.traffic.rates(self)
        for name, r in zip(("bytes", "packets", "XmitWait"), rates, strict=True):
            if np.shape(r) != shape:
                raise EmulatorError(f"traffic {name} rates have shape {np.shape(r)}, expected {shape}")
        f = self.fabric
        ex = f.port_exists
        live = self.data_mask()[ex]
        xb, xp, xw = (np.clip(np.asarray(r, np.float64)[ex], 0.0, None) for r in rates)
        words = self._accumulate(0, xb / 4.0, seconds, live)
        pkts = self._accumulate(1, xp, seconds, live)
        wait = self._accumulate(2, xw, seconds, live)
        c = self._ctr[:-1]  # rows in port_exists order
        c[:, Counter.XMIT_DATA] += words
        c[:, Counter.XMIT_PKTS] += pkts
        c[:, Counter.UNICAST_XMIT_PKTS] += pkts
        c[:, Counter.XMIT_WAIT] += wait
        src = np.nonzero(ex & (f.peer_node != NO_PEER))
        s_row = self._port_ix[src]
        d_row = self._port_ix[f.peer_node[src].astype(np.intp), f.peer_port[src].astype(np.intp)]
        ok = d_row >= 0
        s_row, d_row = s_row[ok], d_row[ok]
        for in_c, val in (
            (Counter.RCV_DATA, words),
            (Counter.RCV_PKTS, pkts),
            (Counter.UNICAST_RCV_PKTS, pkts),
        ):
            c[d_row, in_c] += val[s_row]  # a port receives what its peer sent
        self.time += seconds

    def _accumulate(
        self, i: int, rate: npt.NDArray[np.float64], seconds: float, live: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.uint64]:
        res = self._residue[i, :-1]
        tot = np.where(live, rate * seconds, 0.0) + res
        whole = np.floor(tot)
        res[:] = tot - whole
        return whole.astype(np.uint64)

    def add_counter(self, node: int, port: int, counter: Counter, amount: int = 1) -> None:
        """Raise one counter of one port (error injection)."""
        if not self.fabric.port_exists[node, port]:
            raise EmulatorError(f"{self.fabric.port_name(node, port)}: no such port")
        if amount < 0:
            raise EmulatorError(f"counter increments are not negative ({amount})")
        self._ctr[self._port_ix[node, port], counter] += np.uint64(amount)

    # -- set-up helpers for tests and tools -------------------------------------------------

    def set_sm(
        self,
        node: int,
        port: int,
        *,
        priority: int = 0,
        state: SmState = SmState.NOT_ACTIVE,
        guid: int | None = None,
        sm_key: int = 0,
        act_count: int = 0,
    ) -> SmRecord:
        """Declare an SM behind (node, port) (port 0 on a switch): it answers SMInfo, IsSM is set."""
        f = self.fabric
        if self._is_sw[node]:
            port = 0
        elif not f.port_exists[node, port]:
            raise EmulatorError(f"{f.port_name(node, port)}: no such port")
        rec = SmRecord(
            int(f.port_guid[node, port]) if guid is None else guid, sm_key, act_count, priority, SmState(state)
        )
        self.sm_info[(node, port)] = rec
        self._forget_port_info(node, port)
        return rec

    def apply_subnet(
        self,
        base: npt.NDArray[np.integer],
        lmc: int = 0,
        lft: npt.NDArray[np.uint8] | None = None,
        *,
        state: PortState | None = PortState.ACTIVE,
    ) -> None:
        """Configure the fabric as an SM would have: LIDs (``base[node, port]``, e.g.
        ``LidMap.base``), MasterSMLID = the SM port's LID, LFTs (rows as
        ``fabric.switches``, LinearFDBTop = last column) and every LinkUp port in ``state``.
        PortStateChange is cleared everywhere.
        """
        f = self.fabric
        if base.shape != f.lid.shape:
            raise EmulatorError(f"LID array shape {base.shape}, fabric ports are {f.lid.shape}")
        if not 0 <= lmc <= 7:
            raise EmulatorError(f"LMC {lmc} outside 0..7")
        if lft is not None and (lft.ndim != 2 or lft.shape[0] != self.lft.shape[0] or lft.shape[1] > self.lft_cap):
            raise EmulatorError(
                f"LFT shape {lft.shape}: need {self.lft.shape[0]} switch rows and at most {self.lft_cap} LIDs"
            )
        if state is not None and state < PortState.INIT:
            raise EmulatorError(f"apply_subnet: port state {state!r} is not INIT, ARMED or ACTIVE")
        ends = self._endport_mask()
        b = np.where(ends, base, 0).astype(np.int64)
        if b.max(initial=0) + (1 << lmc) - 1 > MAX_UNICAST_LID:
            raise EmulatorError(f"LIDs beyond the unicast range with LMC {lmc}")
        f.lid[:] = b.astype(np.uint16)
        f.lmc[:] = np.where(ends, lmc, 0)
        self.master_sm_lid[:] = np.where(ends, f.lid[self.sm_node, self.sm_port], 0)
        if lft is not None:
            self._lft_cover(lft.shape[1] - 1)
            self._lft[:] = _NO_ROUTE
            self._lft[:, : lft.shape[1]] = lft
            self.lft_top[:] = lft.shape[1] - 1
        if state is not None:
            up = (f.peer_node != NO_PEER) & (f.phys_state == PhysState.LINKUP)
            f.state[up] = state
        self.port_state_change[:] = False
        self._rebuild()

    def dr_path(self, node: int) -> tuple[int, ...]:
        """A shortest directed route from the SM to ``node`` over LinkUp ports (for tests, tools)."""
        path = self.dr_paths()[node]
        if path is None:
            raise EmulatorError(f"no directed route to {self.fabric.names[node]!r}")
        return path

    def dr_paths(self) -> list[tuple[int, ...] | None]:
        """Shortest directed routes from the SM to every node (None: unreachable), over live links."""
        live = np.frombuffer(bytes(self._flags), np.uint8).reshape(self._n, self._P) & _F_LINK
        return model_dr_paths(self.fabric, self.sm_node, self.sm_port, up=live.astype(np.bool_))


def _pack_rows(layout: Layout, values: dict[str, npt.ArrayLike], count: int) -> npt.NDArray[np.uint8]:
    """Pack ``count`` attributes at once from per-field arrays (or scalars): ``uint8[count, size]``.

    The vector twin of ``Layout.pack`` for fields up to 64 bits: each field is cut into
    the bytes it spans, with the spec's big-endian bit numbering.
    """
    out = np.zeros((count, layout.size), np.uint8)
    for name, val in values.items():
        fd = layout.field(name)
        v = np.broadcast_to(np.asarray(val).astype(np.uint64), (count,))
        if fd.is_bytes or (v.size and int(v.max()) > fd.max_value):
            raise FieldValueError(f"{layout.name}.{name}: values do not fit {fd.width} bits")
        o, e = fd.offset, fd.end
        for b in range(o // 8, (e - 1) // 8 + 1):
            lo, hi = max(o, 8 * b), min(e, 8 * b + 8)
            part = (v >> np.uint64(e - hi)) & np.uint64((1 << (hi - lo)) - 1)
            out[:, b] |= (part << np.uint64(8 * b + 8 - hi)).astype(np.uint8)
    return out


def _read_only(a: npt.NDArray[_S]) -> npt.NDArray[_S]:
    """A view of ``a`` that cannot be written through (the device's state changes only by SMPs)."""
    v = a.view()
    v.flags.writeable = False
    return v


def _fit_desc(text: str) -> str:
    """NodeDescription holds 64 bytes of UTF-8: cut longer text on a character boundary."""
    raw = text.encode("utf-8")[:64]
    return raw.decode("utf-8", "ignore")
