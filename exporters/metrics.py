"""Every metric ibfm exports: name, type, help text and label names, in one table.

The Prometheus collector (``exporters/prometheus.py``) and the Grafana
dashboards (``dashboards/*.dashboard.py``) both read this module, so a metric
name is written down once. Names follow the Prometheus conventions: an
``ibfm_`` prefix, base units in the name (bytes, seconds), ``_total`` on
counters, ``_info`` on info-style gauges whose value is always 1.

Five scopes:

- per port (:data:`PORT_LABELS`: only what identifies the port): every
  existing port except a switch's port 0; PortInfo facts from the last
  heavy sweep, PMA counters from the PerfManager, and what the congestion
  model predicts. Names, the far end of the cable and the link's role are
  on one :data:`PORT_INFO` series per port (:data:`PORT_INFO_LABELS`),
  joined in PromQL with ``* on(guid, port) group_left(name, ...)``: the
  info-metric pattern of ``node_uname_info`` and ``kube_pod_info``;
- per device (:data:`DEVICE_LABELS`): every node of the last heavy sweep;
- per subnet: sweeps, LFT programming, routing, counts by state;
- per partition (:data:`PARTITION_LABELS`): members of each partition of the
  last heavy sweep's plan;
- the PerfManager itself.

Every family belongs to one :data:`GROUPS` entry, the unit of selection of
``/metrics?collect[]=...``.

``docs/metrics.md`` lists them all with the infiniband_exporter names they
correspond to; a test keeps both in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from fabric.model import NodeType, PhysState, PortState


class MetricType(StrEnum):
    """Prometheus metric types used here."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


PORT_LABELS: tuple[str, ...] = ("guid", "port")
"""What identifies a port on every per-port series: node GUID (``0x`` + 16 hex digits) and port number."""

PORT_INFO_LABELS: tuple[str, ...] = ("guid", "port", "name", "remote_guid", "remote_name", "remote_port", "role")
"""The labels of :data:`PORT_INFO`: the port (:data:`PORT_LABELS`), its node's name (NodeDescription),
the node GUID, name and port number at the other end of the cable (empty without a cable), and the
link's role (:data:`LINK_ROLES`)."""

LINK_ROLES: tuple[str, ...] = ("up", "down", "host", "peer", "none")
"""``role`` of :data:`PORT_INFO`: ``up`` a switch port whose cable leads to a switch of a higher tier
(rank above the leaves, as the ftree and updn engines rank them), ``down`` to one of a lower tier,
``host`` a link between a switch and a CA or router (on both ends), ``peer`` between switches of the
same tier or unranked ones (tori, rings) and between two CAs, ``none`` no cable."""

DEVICE_LABELS: tuple[str, ...] = ("guid", "name", "type")
"""Node GUID, node name, node type (:data:`NODE_TYPE_NAMES`)."""

PARTITION_LABELS: tuple[str, ...] = ("pkey", "name", "membership")
"""The P_Key in its full-member form (``0x8001``; ``0xffff`` for Default), the partition's name in the
partitions file, and ``full`` or ``limited``."""

NODE_TYPE_NAMES: dict[int, str] = {
    int(NodeType.CA): "ca",
    int(NodeType.SWITCH): "switch",
    int(NodeType.ROUTER): "router",
}
PORT_STATE_NAMES: dict[int, str] = {
    int(PortState.DOWN): "down",
    int(PortState.INIT): "init",
    int(PortState.ARMED): "armed",
    int(PortState.ACTIVE): "active",
}
PHYS_STATE_NAMES: dict[int, str] = {
    int(PhysState.SLEEP): "sleep",
    int(PhysState.POLLING): "polling",
    int(PhysState.DISABLED): "disabled",
    int(PhysState.TRAINING): "training",
    int(PhysState.LINKUP): "linkup",
    int(PhysState.ERROR_RECOVERY): "error_recovery",
    int(PhysState.PHY_TEST): "phy_test",
}

SWEEP_DURATION_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds (seconds) of the heavy-sweep duration histogram; ``+Inf`` is implied."""


UNITS: tuple[str, ...] = ("bytes_per_second", "seconds", "bytes", "ratio")
"""Units an OpenMetrics ``# UNIT`` line names, when a family's name ends in ``_`` + one of them."""


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One metric family.

    ``name`` is the name in the exposition (counters end in ``_total``);
    ``counter_key`` names the :class:`sm.perf.perfmgr.PerfManager` ``totals`` key a
    per-port counter reads; ``infiniband_exporter`` is the closest metric of
    treydock/infiniband_exporter (documentation only).
    """

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    counter_key: str | None = None
    infiniband_exporter: str = ""

    @property
    def family(self) -> str:
        """The family name (OpenMetrics, prometheus_client): a counter's name without ``_total``."""
        if self.type == MetricType.COUNTER:
            return self.name.removesuffix("_total")
        return self.name

    @property
    def unit(self) -> str:
        """The unit the family's name ends in (:data:`UNITS`), '' for none: OpenMetrics' ``# UNIT``."""
        fam = self.family
        return next((u for u in UNITS if fam.endswith("_" + u)), "")

    @property
    def samples(self) -> tuple[str, ...]:
        """The series names a query can use."""
        if self.type == MetricType.HISTOGRAM:
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


# Each family below is one call to the helper for its scope: the name and the short columns on the
# first line, the help text after it.


def _metric(name: str, type: MetricType, label: str, help: str) -> MetricDef:
    """A subnet-wide family (the PerfManager's too): no labels, or the one ``label`` it is split by ("" for none)."""
    return MetricDef(name, type, help, (label,) if label else ())


def _port_gauge(name: str, help: str, ie: str = "") -> MetricDef:
    return MetricDef(name, MetricType.GAUGE, help, PORT_LABELS, infiniband_exporter=ie)


def _port_counter(name: str, key: str, help: str, ie_suffix: str = "") -> MetricDef:
    """A PMA counter, read from the PerfManager's ``totals[key]``.

    Its infiniband_exporter counterpart is ``infiniband_{switch,hca}_port_`` followed by the
    suffix of ``name`` after ``ibfm_port_``, or by ``ie_suffix`` where theirs differs.
    """
    ie = "infiniband_{switch,hca}_port_" + (ie_suffix or name.removeprefix("ibfm_port_"))
    return MetricDef(name, MetricType.COUNTER, help, PORT_LABELS, counter_key=key, infiniband_exporter=ie)


def _device(name: str, type: MetricType, help: str, ie: str) -> MetricDef:
    return MetricDef(name, type, help, DEVICE_LABELS, infiniband_exporter=ie)


# -- per port: the info series, and PortInfo (from the last heavy sweep) -----------------------------

PORT_INFO = MetricDef("ibfm_port_info", MetricType.GAUGE,
    "One series per port (always 1) with its names, the far end of its cable and the link's role "
    "(up, down, host, peer, none); join it onto a per-port series with "
    "* on(guid, port) group_left(name, remote_name, remote_port, role).", PORT_INFO_LABELS,
    infiniband_exporter="infiniband_{switch,hca}_uplink_info, infiniband_{switch,hca}_info")

PORT_STATE = _port_gauge("ibfm_port_state",
    "PortInfo.PortState: 1 Down, 2 Init, 3 Armed, 4 Active.")
PORT_PHYSICAL_STATE = _port_gauge("ibfm_port_physical_state",
    "PortInfo.PortPhysicalState: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 5 LinkUp, "
    "6 LinkErrorRecovery, 7 PhyTest.")
PORT_WIDTH_LANES = _port_gauge("ibfm_port_width_lanes",
    "Active link width in lanes (PortInfo.LinkWidthActive: 1, 2, 4, 8 or 12; 0 when the link is down).")
PORT_RATE_BYTES = _port_gauge("ibfm_port_rate_bytes_per_second",
    "Data rate of the link in bytes per second: lanes x lane data rate after encoding "
    "(4x NDR = 50e9); 0 when the link is down.", "infiniband_{switch,hca}_rate_bytes_per_second")
PORT_MTU_BYTES = _port_gauge("ibfm_port_mtu_bytes",
    "Active MTU of the port in bytes (PortInfo.NeighborMTU; 0 when not set).")

# -- per port: the congestion model -----------------------------------------------------------------

PORT_PREDICTED_UTILIZATION = _port_gauge("ibfm_port_predicted_utilization_ratio",
    "Transmit utilization of the port (0..1, to 1e-6) that the congestion model predicts for the current routes.")
PORT_PREDICTED_XMIT_WAIT = _port_gauge("ibfm_port_predicted_transmit_wait_per_second",
    "XmitWait ticks per second (to 0.1) that the congestion model predicts; compare with "
    "rate(ibfm_port_transmit_wait_total).")

# -- per port: PMA counters (PerfManager totals, 64-bit, never reset by ibfm) -----------------------
# The second column is the PerfManager ``totals`` key.

PORT_XMIT_DATA = _port_counter("ibfm_port_transmit_data_bytes_total", "xmit_data_bytes",
    "Bytes transmitted (PortXmitData x 4).")
PORT_RCV_DATA = _port_counter("ibfm_port_receive_data_bytes_total", "rcv_data_bytes",
    "Bytes received (PortRcvData x 4).")
PORT_XMIT_PKTS = _port_counter("ibfm_port_transmit_packets_total", "xmit_pkts",
    "Packets transmitted (PortXmitPkts).")
PORT_RCV_PKTS = _port_counter("ibfm_port_receive_packets_total", "rcv_pkts",
    "Packets received (PortRcvPkts).")
PORT_UNICAST_XMIT_PKTS = _port_counter("ibfm_port_unicast_transmit_packets_total", "unicast_xmit_pkts",
    "Unicast packets transmitted (PortUnicastXmitPkts; 0 without the full PortCountersExtended).")
PORT_UNICAST_RCV_PKTS = _port_counter("ibfm_port_unicast_receive_packets_total", "unicast_rcv_pkts",
    "Unicast packets received (PortUnicastRcvPkts; 0 without the full PortCountersExtended).")
PORT_MULTICAST_XMIT_PKTS = _port_counter("ibfm_port_multicast_transmit_packets_total", "multicast_xmit_pkts",
    "Multicast packets transmitted (PortMulticastXmitPkts; 0 without the full PortCountersExtended).")
PORT_MULTICAST_RCV_PKTS = _port_counter("ibfm_port_multicast_receive_packets_total", "multicast_rcv_pkts",
    "Multicast packets received (PortMulticastRcvPkts; 0 without the full PortCountersExtended).")
PORT_XMIT_WAIT = _port_counter("ibfm_port_transmit_wait_total", "xmit_wait",
    "XmitWait ticks: clock ticks in which the port had data to send and no flow-control credit.")
PORT_SYMBOL_ERRORS = _port_counter("ibfm_port_symbol_errors_total", "symbol_errors",
    "Minor link errors detected on a physical lane (SymbolErrorCounter).", "symbol_error_total")
PORT_LINK_ERROR_RECOVERY = _port_counter("ibfm_port_link_error_recovery_total", "link_error_recovery",
    "Successful link error recovery processes (LinkErrorRecoveryCounter).")
PORT_LINK_DOWNED = _port_counter("ibfm_port_link_downed_total", "link_downed",
    "Times the link error recovery failed and the link went down (LinkDownedCounter).")
PORT_RCV_ERRORS = _port_counter("ibfm_port_receive_errors_total", "rcv_errors",
    "Received packets containing an error (PortRcvErrors).")
PORT_RCV_REMOTE_PHYS_ERRORS = _port_counter("ibfm_port_receive_remote_physical_errors_total", "rcv_remote_phys_errors",
    "Received packets marked with the EBP delimiter (PortRcvRemotePhysicalErrors).")
PORT_RCV_SWITCH_RELAY_ERRORS = _port_counter("ibfm_port_receive_switch_relay_errors_total", "rcv_switch_relay_errors",
    "Received packets discarded because they could not be forwarded (PortRcvSwitchRelayErrors).")
PORT_XMIT_DISCARDS = _port_counter("ibfm_port_transmit_discards_total", "xmit_discards",
    "Outbound packets discarded: port down or congestion (PortXmitDiscards).")
PORT_XMIT_CONSTRAINT_ERRORS = _port_counter("ibfm_port_transmit_constraint_errors_total", "xmit_constraint_errors",
    "Outbound packets not sent because of partition or rate-limit constraints (PortXmitConstraintErrors).")
PORT_RCV_CONSTRAINT_ERRORS = _port_counter("ibfm_port_receive_constraint_errors_total", "rcv_constraint_errors",
    "Inbound packets discarded because of partition or rate-limit constraints (PortRcvConstraintErrors).")
PORT_LOCAL_LINK_INTEGRITY_ERRORS = _port_counter(
    "ibfm_port_local_link_integrity_errors_total", "local_link_integrity_errors",
    "Times the local physical errors exceeded the threshold (LocalLinkIntegrityErrors).")
PORT_EXCESSIVE_BUFFER_OVERRUN_ERRORS = _port_counter(
    "ibfm_port_excessive_buffer_overrun_errors_total", "excessive_buffer_overrun_errors",
    "Times consecutive flow-control update periods had buffer overruns (ExcessiveBufferOverrunErrors).")
PORT_VL15_DROPPED = _port_counter("ibfm_port_vl15_dropped_total", "vl15_dropped",
    "Incoming VL15 packets (SMPs) dropped for lack of buffers (VL15Dropped).")
PORT_QP1_DROPPED = _port_counter("ibfm_port_qp1_dropped_total", "qp1_dropped",
    "GMPs to QP1 dropped (QP1Dropped).")

PORT_COUNTERS: tuple[MetricDef, ...] = (
    PORT_XMIT_DATA,
    PORT_RCV_DATA,
    PORT_XMIT_PKTS,
    PORT_RCV_PKTS,
    PORT_UNICAST_XMIT_PKTS,
    PORT_UNICAST_RCV_PKTS,
    PORT_MULTICAST_XMIT_PKTS,
    PORT_MULTICAST_RCV_PKTS,
    PORT_XMIT_WAIT,
    PORT_SYMBOL_ERRORS,
    PORT_LINK_ERROR_RECOVERY,
    PORT_LINK_DOWNED,
    PORT_RCV_ERRORS,
    PORT_RCV_REMOTE_PHYS_ERRORS,
    PORT_RCV_SWITCH_RELAY_ERRORS,
    PORT_XMIT_DISCARDS,
    PORT_XMIT_CONSTRAINT_ERRORS,
    PORT_RCV_CONSTRAINT_ERRORS,
    PORT_LOCAL_LINK_INTEGRITY_ERRORS,
    PORT_EXCESSIVE_BUFFER_OVERRUN_ERRORS,
    PORT_VL15_DROPPED,
    PORT_QP1_DROPPED,
)
"""Per-port counters, in exposition order."""

PORT_INFO_GAUGES: tuple[MetricDef, ...] = (
    PORT_STATE,
    PORT_PHYSICAL_STATE,
    PORT_WIDTH_LANES,
    PORT_RATE_BYTES,
    PORT_MTU_BYTES,
)
PORT_PREDICTED: tuple[MetricDef, ...] = (PORT_PREDICTED_UTILIZATION, PORT_PREDICTED_XMIT_WAIT)

# -- per device -------------------------------------------------------------------------------------

DEVICE_UP = _device("ibfm_device_up", MetricType.GAUGE,
    "1 if the device answered the last heavy sweep and, once the PerfManager has swept, at least one of "
    "its counter queries in the last counter sweep; 0 otherwise.",
    "(none: failures are counted per collector, infiniband_exporter_collect_errors)")
DEVICE_COLLECTION_ERRORS = _device("ibfm_device_collection_errors_total", MetricType.COUNTER,
    "PerfMgt MADs to the device answered with a bad status or an unexpected reply.",
    "infiniband_exporter_collect_errors (per collector)")
DEVICE_COLLECTION_TIMEOUTS = _device("ibfm_device_collection_timeouts_total", MetricType.COUNTER,
    "PerfMgt MADs to the device that stayed unanswered after every retry.",
    "infiniband_exporter_collect_timeouts (per collector)")
DEVICE_METRICS: tuple[MetricDef, ...] = (DEVICE_UP, DEVICE_COLLECTION_ERRORS, DEVICE_COLLECTION_TIMEOUTS)

# -- per subnet -------------------------------------------------------------------------------------

SUBNET_UP = _metric("ibfm_subnet_up", MetricType.GAUGE, "",
    "1 if the last heavy sweep verified every route and programmed every switch; 0 otherwise or before it.")
LAST_SWEEP_TIMESTAMP = _metric("ibfm_last_sweep_timestamp_seconds", MetricType.GAUGE, "",
    "Unix time at which the last heavy sweep published its snapshot.")
SWEEP_NUMBER = _metric("ibfm_sweep_number", MetricType.GAUGE, "",
    "Number of the heavy sweep that produced the current snapshot (1 for the first).")
SWEEP_DURATION = _metric("ibfm_sweep_duration_seconds", MetricType.HISTOGRAM, "",
    "Duration of successful heavy sweeps (discovery to ports Active).")
SWEEP_FAILURES = _metric("ibfm_sweep_failures_total", MetricType.COUNTER, "",
    "Heavy sweeps that ended with a failed stage.")
SWEEP_PHASE_DURATION = _metric("ibfm_sweep_phase_duration_seconds", MetricType.GAUGE, "phase",
    "Duration of each stage of the last heavy sweep.")
SWEEP_SMPS = _metric("ibfm_sweep_smps_total", MetricType.COUNTER, "",
    "SMPs sent by heavy sweeps (retries included).")
LFT_BLOCKS_SENT = _metric("ibfm_lft_blocks_sent_total", MetricType.COUNTER, "",
    "64-LID LinearForwardingTable blocks sent to switches (only blocks that changed are sent).")
LFT_BLOCKS_SKIPPED = _metric("ibfm_lft_blocks_skipped_total", MetricType.COUNTER, "",
    "LinearForwardingTable blocks left alone because the switch already held them.")
ROUTING_ENGINE = _metric("ibfm_routing_engine_info", MetricType.GAUGE, "engine",
    "The routing engine that computed the current LFTs (always 1).")
NODES = _metric("ibfm_nodes", MetricType.GAUGE, "type",
    "Nodes of the subnet by type.")
PORTS = _metric("ibfm_ports", MetricType.GAUGE, "state",
    "Ports by PortState (every port but a switch's port 0).")
LINKS = _metric("ibfm_links", MetricType.GAUGE, "state",
    "Cabled links by the lower PortState of their two ends.")
CREDIT_LOOPS = _metric("ibfm_credit_loops", MetricType.GAUGE, "",
    "Credit loops (cycles of the channel dependency graph) the current LFTs create; 0 is deadlock-free.")
UNREACHABLE_ROUTES = _metric("ibfm_unreachable_routes", MetricType.GAUGE, "",
    "Connected (source port, destination LID) pairs whose route fails in the current LFTs.")

# -- the SM itself (election) and its SA -------------------------------------------------------------

SM_STATE = _metric("ibfm_sm_state", MetricType.GAUGE, "",
    "This SM's SMInfo.SMState: 0 not active, 1 discovering, 2 standby, 3 master.")
SM_MASTER_INFO = MetricDef("ibfm_sm_master_info", MetricType.GAUGE,
    "The subnet's master SM as this SM knows it (always 1): its port GUID and LID, and whether it is this SM.",
    ("master_guid", "master_lid", "self"))
SM_PRIORITY = _metric("ibfm_sm_priority", MetricType.GAUGE, "", "This SM's SMInfo.Priority (0..15).")
SA_REQUESTS = _metric("ibfm_sa_requests_total", MetricType.COUNTER, "",
    "Subnet Administration requests received (every one is answered with a record or a status, or counted "
    "in ibfm_sa_dropped_total).")
SA_RECORDS = _metric("ibfm_sa_records_total", MetricType.COUNTER, "", "Records sent in SA answers.")
SA_BUSY = _metric("ibfm_sa_busy_total", MetricType.COUNTER, "",
    "SA and SMInfo requests answered BUSY: this SM is not the master or has no snapshot yet, or more requests "
    "wait for its services than their backlog holds.")
SA_DROPPED = _metric("ibfm_sa_dropped_total", MetricType.COUNTER, "",
    "SA MADs not answered: unreadable, answers nobody asked for, or answers that could not be sent.")
M_KEY_TRAPS = _metric("ibfm_mkey_violation_traps_total", MetricType.COUNTER, "",
    "Traps 256 (bad M_Key) received: another SM or a tool tried a protected port without its key.")
MCAST_GROUPS = _metric("ibfm_multicast_groups", MetricType.GAUGE, "",
    "Multicast groups the SA holds (IPoIB broadcast groups included).")
MCAST_MEMBERS = _metric("ibfm_multicast_members", MetricType.GAUGE, "",
    "Members of all multicast groups (a port in two groups counts twice).")
MFT_BLOCKS = _metric("ibfm_mft_blocks_sent_total", MetricType.COUNTER, "",
    "MulticastForwardingTable blocks (32 MLIDs x 16 ports) sent to switches.")
SM_METRICS: tuple[MetricDef, ...] = (SM_STATE, SM_MASTER_INFO, SM_PRIORITY, SA_REQUESTS, SA_RECORDS, SA_BUSY,
                                     SA_DROPPED, M_KEY_TRAPS, MCAST_GROUPS, MCAST_MEMBERS, MFT_BLOCKS)

# -- partitions (the last heavy sweep's plan) --------------------------------------------------------

PARTITION_MEMBERS = MetricDef("ibfm_partition_members", MetricType.GAUGE,
    "End ports (switch port 0, CA and router ports) in the partition, by membership; both series of every "
    "partition of the file are there, 0 for a partition no port of the subnet is in.", PARTITION_LABELS)
PARTITION_PROBLEMS = _metric("ibfm_partition_problems", MetricType.GAUGE, "",
    "Problems the fabric made of the partitions file: GUIDs not on the subnet, keys left out of full "
    "P_KeyTables, switch ports where enforcement was turned off.")
PARTITION_METRICS: tuple[MetricDef, ...] = (PARTITION_MEMBERS, PARTITION_PROBLEMS)

# -- the PerfManager --------------------------------------------------------------------------------

PERFMGR_SWEEPS = _metric("ibfm_perfmgr_sweeps_total", MetricType.COUNTER, "",
    "Counter sweeps the PerfManager completed.")
PERFMGR_LAST_SWEEP_TIMESTAMP = _metric("ibfm_perfmgr_last_sweep_timestamp_seconds", MetricType.GAUGE, "",
    "Unix time at which the last completed counter sweep started.")
PERFMGR_SWEEP_DURATION = _metric("ibfm_perfmgr_sweep_duration_seconds", MetricType.GAUGE, "",
    "Duration of the last counter sweep.")
PERFMGR_PORTS_READ = _metric("ibfm_perfmgr_ports_read", MetricType.GAUGE, "",
    "Ports whose counters were all read in the last counter sweep.")

SUBNET_METRICS: tuple[MetricDef, ...] = (
    SUBNET_UP,
    LAST_SWEEP_TIMESTAMP,
    SWEEP_NUMBER,
    SWEEP_DURATION,
    SWEEP_FAILURES,
    SWEEP_PHASE_DURATION,
    SWEEP_SMPS,
    LFT_BLOCKS_SENT,
    LFT_BLOCKS_SKIPPED,
    ROUTING_ENGINE,
    NODES,
    PORTS,
    LINKS,
    CREDIT_LOOPS,
    UNREACHABLE_ROUTES,
)
PERFMGR_METRICS: tuple[MetricDef, ...] = (
    PERFMGR_SWEEPS,
    PERFMGR_LAST_SWEEP_TIMESTAMP,
    PERFMGR_SWEEP_DURATION,
    PERFMGR_PORTS_READ,
)

PORT_TRAFFIC: tuple[MetricDef, ...] = (PORT_XMIT_DATA, PORT_RCV_DATA, PORT_XMIT_WAIT)
"""Data and XmitWait counters: what link utilization and congestion are read from, scraped often."""
PORT_PACKETS: tuple[MetricDef, ...] = tuple(m for m in PORT_COUNTERS[:9] if m not in PORT_TRAFFIC)
"""Packet counters (all, unicast, multicast): they move with every sweep but few panels read them."""
PORT_ERRORS: tuple[MetricDef, ...] = PORT_COUNTERS[9:]
"""The PortCounters error counters (they rarely move)."""

ALL: tuple[MetricDef, ...] = (
    SUBNET_METRICS + PARTITION_METRICS + SM_METRICS + PERFMGR_METRICS + DEVICE_METRICS + (PORT_INFO,)
    + PORT_INFO_GAUGES + PORT_PREDICTED + PORT_COUNTERS
)
"""Every metric, in exposition order."""

GROUPS: dict[str, tuple[MetricDef, ...]] = {
    "subnet": SUBNET_METRICS,
    "sm": SM_METRICS,
    "partitions": PARTITION_METRICS,
    "perfmgr": PERFMGR_METRICS,
    "devices": DEVICE_METRICS,
    "port_info": (PORT_INFO,),
    "port_state": PORT_INFO_GAUGES,
    "port_traffic": PORT_TRAFFIC,
    "port_packets": PORT_PACKETS,
    "port_errors": PORT_ERRORS,
    "congestion": PORT_PREDICTED,
}
"""Family groups, the names ``/metrics?collect[]=`` takes (node_exporter's collectors); every family is
in exactly one. ``subnet``, ``sm``, ``partitions`` and ``perfmgr`` are fabric-wide (one shard only);
the others are per device or per port (split by ``shard=``)."""

FABRIC_WIDE_GROUPS: frozenset[str] = frozenset({"subnet", "sm", "partitions", "perfmgr"})
"""Groups without a row per device or port: served whole to shard 0 and to no other shard."""

GROUP_OF: dict[str, str] = {m.name: g for g, ms in GROUPS.items() for m in ms}
"""Metric name -> its group."""

BY_NAME: dict[str, MetricDef] = {m.name: m for m in ALL}


def sample_names() -> frozenset[str]:
    """Every series name the exposition can contain (histograms with their suffixes)."""
    return frozenset(s for m in ALL for s in m.samples)
