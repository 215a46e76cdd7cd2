"""The performance manager: PMA PortCounters and PortCountersExtended of every port into counter arrays.

A :class:`PerfManager` is bound to a subnet snapshot (its fabric and LID map)
and then sweeps: ClassPortInfo once per node after each bind (topology change),
then PortCounters of every switch port and CA port, plus PortCountersExtended
where ClassPortInfo.CapabilityMask says IsExtendedWidthSupported (0x200) or
IsExtendedWidthSupportedNoIETF (0x400). Every PerfMgt MAD is LID routed: to a
switch's port-0 LID with PortSelect = the port, to a CA port's own LID. All
MADs of a stage are in flight at once, bounded by the transport's window.

Readings accumulate into 64-bit totals, ``totals[key][node, port]``
(``numpy.uint64``), and rates over the last interval, ``rates[key][node, port]``
(``numpy.float64``, NaN where no interval was measured). Both are kept as one
row per queried port (:class:`PortValues`: about 70,000 rows at 11,664 hosts,
not 13,284 nodes x 37 port numbers) and read like ``[node, port]`` arrays
through a row map built once per bind. Units:

- ``xmit_data_bytes``, ``rcv_data_bytes``: bytes. PortXmitData/PortRcvData
  count 4-byte words on the wire; totals and rates are multiplied by 4.
- ``*_pkts``: packets. ``unicast_*``/``multicast_*`` come only from
  PortCountersExtended with the full (IETF) extension, else they stay 0.
- ``xmit_wait``: XmitWait ticks (one tick is one FC-clock period in which a
  port had data to send and no credit).
- error counters (``symbol_errors``, ``link_downed``, ``rcv_errors``, ...): events
  (and events per second in ``rates``).

Counter semantics. PortCounters saturate at their width (4, 8, 16 or 32
bits); they never wrap. Each reading is compared with the previous one of the
same port and source: the difference is added to the total. A reading lower
than the previous one means someone cleared the counter (another tool, or a
device reset): it counts from 0 and is counted in ``external_clears``. A
counter of at most 32 bits read above ``clear_fraction`` (OpenSM's 75%) of its
maximum is cleared with a PortCounters Set selecting just that counter, so
it never saturates. The data and packet counters are cleared only on nodes
without PortCountersExtended: there the 64-bit counters are read instead and
the 32-bit ones are left alone for other tools. Error counters and XmitWait
exist only in PortCounters and are cleared on every node. A port's first
reading (a new port, a restarted manager) counts from 0, so totals match
what ``perfquery`` shows until the first clear.

The manager is re-bound after every heavy sweep: totals, previous readings and
per-device failure counts are carried over by (node GUID, port number); nodes
that vanished are dropped. Ports that do not answer (link down, node gone)
count in ``port_timeouts`` and ``device_timeouts`` and leave the others unharmed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.mad import (
    CLASS_PORT_INFO,
    MAD_SIZE,
    PORT_COUNTERS,
    PORT_COUNTERS_EXT,
    Layout,
    MadStatus,
    Method,
    MgmtClass,
    PerfAttr,
    PerfCap,
    perf_mad,
)
from fabric.model import Fabric, NodeType
from sm.lidmap import LidMap
from sm.transport.base import MadTimeout, WindowedTransport

log = logging.getLogger(__name__)

CLEAR_FRACTION = 0.75
"""Clear a counter of at most 32 bits once it reads above this fraction of its maximum (as OpenSM)."""

EXT_DATA_CAPS = int(PerfCap.IS_EXTENDED_WIDTH_SUPPORTED | PerfCap.IS_EXTENDED_WIDTH_SUPPORTED_NOIETF)
"""Either bit: PortCountersExtended has 64-bit PortXmitData/RcvData/XmitPkts/RcvPkts."""
EXT_FULL_CAPS = int(PerfCap.IS_EXTENDED_WIDTH_SUPPORTED)
"""IsExtendedWidthSupported: the unicast and multicast packet counters are there too."""

_DATA = MAD_SIZE - 192  # PerfMgt attribute data start (byte 64)
_GET_RESP = int(Method.GET_RESP)
_UNSUPPORTED = frozenset({int(MadStatus.METHOD_UNSUPPORTED), int(MadStatus.METHOD_ATTR_UNSUPPORTED)})


class PerfMgrError(IbfmError):
    """The performance manager was used out of order (no snapshot bound, overlapping sweeps)."""


@dataclass(frozen=True, slots=True)
class CounterDef:
    """One exported counter: where it is read and how it is cleared.

    ``pc``/``pcx``: the PortCounters / PortCountersExtended field (None where
    absent). ``select``: its bit in CounterSelect (0..15), or 16 + bit in
    CounterSelect2 (XmitWait 16, QP1Dropped 17). ``scale``: units per count
    (4 bytes per PortXmitData word). ``full_ext``: only in the IETF extension.
    """

    key: str
    pc: str | None
    pcx: str | None
    select: int
    scale: int = 1
    full_ext: bool = False


COUNTERS: tuple[CounterDef, ...] = (
    CounterDef("symbol_errors", "SymbolErrorCounter", None, 0),
    CounterDef("link_error_recovery", "LinkErrorRecoveryCounter", None, 1),
    CounterDef("link_downed", "LinkDownedCounter", None, 2),
    CounterDef("rcv_errors", "PortRcvErrors", None, 3),
    CounterDef("rcv_remote_phys_errors", "PortRcvRemotePhysicalErrors", None, 4),
    CounterDef("rcv_switch_relay_errors", "PortRcvSwitchRelayErrors", None, 5),
    CounterDef("xmit_discards", "PortXmitDiscards", None, 6),
    CounterDef("xmit_constraint_errors", "PortXmitConstraintErrors", None, 7),
    CounterDef("rcv_constraint_errors", "PortRcvConstraintErrors", None, 8),
    CounterDef("local_link_integrity_errors", "LocalLinkIntegrityErrors", None, 9),
    CounterDef("excessive_buffer_overrun_errors", "ExcessiveBufferOverrunErrors", None, 10),
    CounterDef("vl15_dropped", "VL15Dropped", None, 11),
    CounterDef("xmit_data_bytes", "PortXmitData", "PortXmitData", 12, scale=4),
    CounterDef("rcv_data_bytes", "PortRcvData", "PortRcvData", 13, scale=4),
    CounterDef("xmit_pkts", "PortXmitPkts", "PortXmitPkts", 14),
    CounterDef("rcv_pkts", "PortRcvPkts", "PortRcvPkts", 15),
    CounterDef("xmit_wait", "PortXmitWait", None, 16),
    CounterDef("qp1_dropped", "QP1Dropped", None, 17),
    CounterDef("unicast_xmit_pkts", None, "PortUnicastXmitPkts", -1, full_ext=True),
    CounterDef("unicast_rcv_pkts", None, "PortUnicastRcvPkts", -1, full_ext=True),
    CounterDef("multicast_xmit_pkts", None, "PortMulticastXmitPkts", -1, full_ext=True),
    CounterDef("multicast_rcv_pkts", None, "PortMulticastRcvPkts", -1, full_ext=True),
)
"""Every counter kept, in export order."""

KEYS: tuple[str, ...] = tuple(c.key for c in COUNTERS)
RATE_KEYS: tuple[str, ...] = (
    "xmit_data_bytes",
    "rcv_data_bytes",
    "xmit_pkts",
    "rcv_pkts",
    "unicast_xmit_pkts",
    "unicast_rcv_pkts",
    "multicast_xmit_pkts",
    "multicast_rcv_pkts",
    "xmit_wait",
    *(c.key for c in COUNTERS if c.pcx is None and c.key != "xmit_wait"),
)
"""Counters with a per-interval rate (bytes/s, packets/s, XmitWait ticks/s, error events/s)."""
UNITS: dict[str, str] = {
    k: ("bytes" if k.endswith("_bytes") else "packets" if k.endswith("_pkts") else "ticks" if k == "xmit_wait"
        else "events")
    for k in KEYS
}

_BY_KEY = {c.key: c for c in COUNTERS}
_PC_DEFS = tuple(c for c in COUNTERS if c.pc is not None)
_DATA_DEFS = tuple(c for c in COUNTERS if c.pc is not None and c.pcx is not None)
_PC_ONLY_DEFS = tuple(c for c in COUNTERS if c.pc is not None and c.pcx is None)
_X_DEFS = tuple(c for c in COUNTERS if c.pcx is not None)

_SRC_NONE, _SRC_PC, _SRC_EXT = -1, 0, 1
_KEY_ROW = {k: i for i, k in enumerate(KEYS)}
_RATE_ROW = {k: i for i, k in enumerate(RATE_KEYS)}

_S = TypeVar("_S", bound=np.generic)


class Bindable(Protocol):
    """What :meth:`PerfManager.bind` needs of a snapshot (``SubnetSnapshot`` has it)."""

    @property
    def fabric(self) -> Fabric: ...

    @property
    def lids(self) -> LidMap: ...


@dataclass
class PerfSweepReport:
    """What one counter sweep did."""

    sweep: int
    started: float
    """Wall-clock time (``time.time()``) at the start."""
    duration: float
    """Seconds, ClassPortInfo stage and clears included."""
    mads_sent: int
    """MADs put on the wire by the transport during the sweep, retries included."""
    nodes: int
    class_port_info: int
    """ClassPortInfo Gets sent (nodes whose capabilities were not known yet)."""
    ports: int
    """Ports queried."""
    ports_read: int
    """Ports whose every counter MAD was answered."""
    timeouts: int
    """MADs unanswered after every retry."""
    errors: int
    """Answers with a bad status or that do not match the request."""
    clears: int
    """Ports where we cleared counters close to saturation."""
    external_clears: int
    """Ports whose counters went down without a clear of ours (another tool, a reset)."""
    saturated: int
    """Counters read at their maximum (increments may have been lost)."""
    nodes_timed_out: int
    """Nodes with at least one unanswered MAD."""


# -- vectorised field access -------------------------------------------------------------


def _getter(layout: Layout, name: str) -> tuple[int, int, int, int]:
    """(first byte in the MAD, byte count, right shift, mask) of a field of a PerfMgt attribute."""
    fd = layout.field(name)
    first, last = fd.offset // 8, (fd.end + 7) // 8
    if last - first > 8:
        raise PerfMgrError(f"{layout.name}.{name}: field spans {last - first} bytes")
    return _DATA + first, last - first, last * 8 - fd.end, fd.max_value


def _column(rows: npt.NDArray[np.uint8], spec: tuple[int, int, int, int]) -> npt.NDArray[np.uint64]:
    """One field of every MAD in ``rows`` (``uint8[n, 256]``) as ``uint64[n]``."""
    start, nbytes, shift, mask = spec
    v = rows[:, start].astype(np.uint64)
    for b in range(1, nbytes):
        v = (v << np.uint64(8)) | rows[:, start + b]
    if shift:
        v >>= np.uint64(shift)
    if mask != 0xFFFFFFFFFFFFFFFF:
        v &= np.uint64(mask)
    return v


_PC_GET = {c.key: _getter(PORT_COUNTERS, c.pc) for c in _PC_DEFS if c.pc is not None}
_PC_MAX = {c.key: PORT_COUNTERS.field(c.pc).max_value for c in _PC_DEFS if c.pc is not None}
_X_GET = {c.key: _getter(PORT_COUNTERS_EXT, c.pcx) for c in _X_DEFS if c.pcx is not None}
_CPI_CAP = _getter(CLASS_PORT_INFO, "CapabilityMask")
_PORT_SELECT = _DATA + 1


def _mads(attr: int, method: int, ports: npt.NDArray[np.int64], data: bytes = b"") -> list[bytes]:
    """One PerfMgt MAD per port (PortSelect = port; TIDs are the transport's business)."""
    if ports.size == 0:
        return []
    tmpl = np.frombuffer(perf_mad(method, attr, 0, 0, data), np.uint8)
    rows = np.repeat(tmpl[None, :], ports.size, axis=0)
    rows[:, _PORT_SELECT] = ports.astype(np.uint8)
    blob = rows.tobytes()
    return [blob[i : i + MAD_SIZE] for i in range(0, len(blob), MAD_SIZE)]


def _check(
    replies: Sequence[bytes | None], attr: int, ports: npt.NDArray[np.int64] | None
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.uint8]]:
    """(answered, good, rows): ``rows`` holds the good answers only, in request order.

    Good: a PerfMgt GetResp for the same attribute, status 0, PortSelect as asked.
    """
    answered = np.fromiter((r is not None for r in replies), np.bool_, len(replies))
    got = [r for r in replies if r is not None and len(r) == MAD_SIZE]
    sized = answered.copy()
    if len(got) != int(answered.sum()):
        sized[answered] = np.fromiter(
            (len(r) == MAD_SIZE for r in replies if r is not None), np.bool_, int(answered.sum())
        )
    rows = np.frombuffer(b"".join(got), np.uint8).reshape(-1, MAD_SIZE)
    ok = (
        (rows[:, 1] == MgmtClass.PERF)
        & (rows[:, 3] == _GET_RESP)
        & (rows[:, 4] == 0)
        & (rows[:, 5] == 0)
        & (rows[:, 16] == attr >> 8)
        & (rows[:, 17] == attr & 0xFF)
    )
    if ports is not None:
        ok &= rows[:, _PORT_SELECT] == ports[sized].astype(np.uint8)
    good = np.zeros(len(replies), np.bool_)
    good[np.flatnonzero(sized)[ok]] = True
    return answered, good, rows[ok]


# -- the manager -----------------------------------------------------------------------------


class PortValues(Generic[_S]):
    """One value per queried port, read like a ``[node, port]`` array of the bound fabric.

    The PerfManager keeps a compact row per port it reads (``rows``, in query
    order, about 70,000 at 11,664 hosts) instead of a cell per (node, port
    number) (13,284 x 37); ``index`` (``int32[node, port]``, -1 where the port
    is not queried, built once per bind and shared by every counter) maps one
    to the other. Indexing (``v[n, p]``, ``v[nodes, ports]``, ``v[mask]``,
    ``v[n, 1:5]``) gathers the rows and answers ``fill`` (0, or NaN for rates)
    where nothing is read; ``np.asarray(v)`` builds the dense array.
    """

    __slots__ = ("fill", "index", "rows")

    def __init__(self, rows: npt.NDArray[_S], index: npt.NDArray[np.int32], fill: float) -> None:
        self.rows = rows
        self.index = index
        self.fill = fill

    @property
    def shape(self) -> tuple[int, ...]:
        return self.index.shape

    @property
    def ndim(self) -> int:
        return self.index.ndim

    @property
    def size(self) -> int:
        return self.index.size

    @property
    def dtype(self) -> np.dtype[_S]:
        return self.rows.dtype

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key: Any) -> Any:
        r = self.index[key]
        if np.ndim(r) == 0:
            i = int(r)
            return self.rows[i] if i >= 0 else self.rows.dtype.type(self.fill)
        out = np.full(np.shape(r), self.fill, self.rows.dtype)
        hit = r >= 0
        out[hit] = self.rows[r[hit]]
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        dense = self[...]
        return dense if dtype is None else dense.astype(dtype)

    def ravel(self) -> PortValues[_S]:
        """Flat, like ``ndarray.ravel`` (no copy of the rows)."""
        return PortValues(self.rows, self.index.ravel(), self.fill)

    def copy(self) -> npt.NDArray[_S]:
        """The dense array (a copy: later sweeps do not change it)."""
        return self[...]  # type: ignore[no-any-return]

    def sum(self, *args: Any, **kwargs: Any) -> Any:
        return np.asarray(self).sum(*args, **kwargs)

    def any(self, *args: Any, **kwargs: Any) -> Any:
        return np.asarray(self).any(*args, **kwargs)

    def max(self, *args: Any, **kwargs: Any) -> Any:
        return np.asarray(self).max(*args, **kwargs)

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> Any:  # type: ignore[override]
        return np.asarray(self) == other

    def __ne__(self, other: object) -> Any:  # type: ignore[override]
        return np.asarray(self) != other

    def __lt__(self, other: Any) -> Any:
        return np.asarray(self) < other

    def __le__(self, other: Any) -> Any:
        return np.asarray(self) <= other

    def __gt__(self, other: Any) -> Any:
        return np.asarray(self) > other

    def __ge__(self, other: Any) -> Any:
        return np.asarray(self) >= other

    def __repr__(self) -> str:
        return f"PortValues({self.rows.size} rows of {self.rows.dtype}, shape {self.shape})"


class PerfManager:
    """PMA counters of a whole subnet, a row per queried port read as ``[node, port]``; swept on demand or on a timer.

    ``totals[key]``: ``uint64`` per port (see the module text for units);
    ``rates[key]`` for :data:`RATE_KEYS`: ``float64`` per second over the last
    interval, NaN where not measured. Both are :class:`PortValues`: a row per
    queried port (``q_node``, ``q_port``, ``q_lid``, in that order), indexed like
    ``[node, port]`` arrays of the bound fabric (0 / NaN for ports not queried);
    ``row_of`` (``int32[node, port]``, -1 for none) is the map, built once per
    bind. Per node: ``device_timeouts`` and ``device_errors`` (MADs unanswered /
    answered wrongly, ``uint64``), ``cap_mask`` (PerfMgt ClassPortInfo.CapabilityMask,
    -1 until read). Per port: ``queried``, ``read_ok`` (answered in the last
    sweep; dense ``bool[node, port]``), ``port_timeouts`` (sweeps in which it did
    not answer), ``clears`` (our clears), ``external_clears`` (drops seen without
    a clear of ours), these three as :class:`PortValues` too. Node and port
    indices are those of the bound snapshot's fabric. ``clock`` measures
    intervals for the rates.
    """

    def __init__(
        self,
        transport: WindowedTransport,
        *,
        clear_fraction: float = CLEAR_FRACTION,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0.0 < clear_fraction < 1.0:
            raise PerfMgrError(f"clear_fraction {clear_fraction} outside (0, 1)")
        self.transport = transport
        self.clear_fraction = clear_fraction
        self.clock = clock
        self.fabric: Fabric | None = None
        self.lids: LidMap | None = None
        self.sweeps = 0
        self.last_sweep_time = 0.0
        """Wall-clock time at which the last completed sweep started (0 before any)."""
        self.last_report: PerfSweepReport | None = None
        self._sweeping = False
        self._pending: Bindable | None = None
        self._alloc(np.zeros((0, 1), np.bool_))

    # -- state ---------------------------------------------------------------------------

    def _alloc(self, mask: npt.NDArray[np.bool_]) -> None:
        """Fresh state for the ports in ``mask`` (``bool[node, port]``): the query plan and a row each."""
        n, pp = mask.shape
        qn, qp = np.nonzero(mask)
        q = qn.size
        self.q_node: npt.NDArray[np.int64] = qn.astype(np.int64)
        self.q_port: npt.NDArray[np.int64] = qp.astype(np.int64)
        self.q_lid: npt.NDArray[np.int64] = np.zeros(q, np.int64)
        self.row_of: npt.NDArray[np.int32] = np.full((n, pp), -1, np.int32)
        """Row of each queried port, -1 elsewhere."""
        self.row_of[qn, qp] = np.arange(q, dtype=np.int32)
        self.queried: npt.NDArray[np.bool_] = mask
        self.node_lid: npt.NDArray[np.int64] = np.zeros(n, np.int64)
        self.node_guid: npt.NDArray[np.uint64] = np.zeros(n, np.uint64)
        self.device_timeouts: npt.NDArray[np.uint64] = np.zeros(n, np.uint64)
        self.device_errors: npt.NDArray[np.uint64] = np.zeros(n, np.uint64)
        self.cap_mask: npt.NDArray[np.int32] = np.full(n, -1, np.int32)
        self.read_ok: npt.NDArray[np.bool_] = np.zeros((n, pp), np.bool_)
        # per row
        self._tot: npt.NDArray[np.uint64] = np.zeros((len(KEYS), q), np.uint64)
        self._rate: npt.NDArray[np.float64] = np.full((len(RATE_KEYS), q), np.nan)
        self._last: dict[str, npt.NDArray[np.unsignedinteger]] = {
            c.key: np.zeros(q, np.uint64 if c.pcx is not None else np.uint32) for c in COUNTERS
        }
        """Previous raw readings (counter units): 32 bits where only PortCounters has the counter."""
        self._have: npt.NDArray[np.bool_] = np.zeros((len(KEYS), q), np.bool_)
        """Whether ``_last`` holds a reading, per counter (row of :data:`KEYS`) and port."""
        self._port_counts: npt.NDArray[np.uint64] = np.zeros((3, q), np.uint64)
        """port_timeouts, clears, external_clears."""
        self._t_pc: npt.NDArray[np.float64] = np.zeros(q, np.float64)
        self._t_x: npt.NDArray[np.float64] = np.zeros(q, np.float64)
        self._data_src: npt.NDArray[np.int8] = np.full(q, _SRC_NONE, np.int8)
        self._clear_unconfirmed: npt.NDArray[np.bool_] = np.zeros(q, np.bool_)
        # the [node, port] views
        ix = self.row_of
        self.totals: dict[str, PortValues[np.uint64]] = {k: PortValues(self._tot[i], ix, 0) for i, k in enumerate(KEYS)}
        self.rates: dict[str, PortValues[np.float64]] = {
            k: PortValues(self._rate[i], ix, np.nan) for i, k in enumerate(RATE_KEYS)
        }
        self.port_timeouts = PortValues(self._port_counts[0], ix, 0)
        self.clears = PortValues(self._port_counts[1], ix, 0)
        self.external_clears = PortValues(self._port_counts[2], ix, 0)

    def _row_state(self) -> list[npt.NDArray[np.generic]]:
        """The per-row arrays carried over a re-bind by (node GUID, port): rows are their last axis."""
        return [self._tot, self._have, self._port_counts, self._t_pc, self._t_x, self._data_src,
                self._clear_unconfirmed, *self._last.values()]

    def bind(self, snapshot: Bindable) -> None:
        """Adopt a new subnet (after a heavy sweep). Totals survive by (node GUID, port).

        During a sweep the new snapshot is taken when the sweep ends.
        """
        shape = snapshot.fabric.port_exists.shape
        if snapshot.lids.base.shape != shape:
            raise PerfMgrError(f"LID map shape {snapshot.lids.base.shape} does not match the fabric's ports {shape}")
        if self._sweeping:
            self._pending = snapshot
            return
        self._bind(snapshot.fabric, snapshot.lids)

    def _bind(self, fabric: Fabric, lids: LidMap) -> None:
        n, pp = fabric.port_exists.shape
        # what to query: every switch port 1..N of a switch with a LID, every CA port with a LID
        sw = fabric.node_type == NodeType.SWITCH
        base = lids.base.astype(np.int64)
        mask = fabric.port_exists.copy()
        mask[:, 0] = False
        mask &= np.where(sw[:, None], (base[:, 0] > 0)[:, None], base > 0)
        old_guid, old_row_of = self.node_guid, self.row_of
        old_dev = (self.device_timeouts, self.device_errors)
        old_rows = self._row_state()
        self._alloc(mask)
        guid = fabric.node_guid.astype(np.uint64)
        self.node_guid = guid.copy()
        # node map new -> old by GUID, then row map new -> old by (node, port)
        if old_guid.size and n:
            order = np.argsort(old_guid, kind="stable")
            sorted_g = old_guid[order]
            pos = np.minimum(np.searchsorted(sorted_g, guid), sorted_g.size - 1)
            hit = sorted_g[pos] == guid
            new_i = np.flatnonzero(hit)
            old_i = order[pos[hit]]
            self.device_timeouts[new_i] = old_dev[0][old_i]
            self.device_errors[new_i] = old_dev[1][old_i]
            old_node = np.full(n, -1, np.int64)
            old_node[new_i] = old_i
            on = old_node[self.q_node]
            keep = (on >= 0) & (self.q_port < old_row_of.shape[1])
            old_r = np.full(self.q_node.size, -1, np.int64)
            old_r[keep] = old_row_of[on[keep], self.q_port[keep]]
            new_r = np.flatnonzero(old_r >= 0)
            old_r = old_r[new_r]
            for mine, arr in zip(self._row_state(), old_rows, strict=True):
                mine[..., new_r] = arr[..., old_r]
            log.debug("perfmgr bind: %d of %d nodes carried over, %d gone", new_i.size, n, old_guid.size - new_i.size)
        self.fabric = fabric
        self.lids = lids
        qn, qp = self.q_node, self.q_port
        self.q_lid = np.where(sw[qn], base[qn, 0], base[qn, qp]).astype(np.int64)
        ca_lid = np.where(base[:, 1:] > 0, base[:, 1:], 0)
        first = np.argmax(ca_lid > 0, axis=1) if pp > 1 else np.zeros(n, np.int64)
        ca_first = ca_lid[np.arange(n), first] if pp > 1 else np.zeros(n, np.int64)
        self.node_lid = np.where(sw, base[:, 0], ca_first).astype(np.int64)
        # ClassPortInfo is read again after every topology change (_alloc set cap_mask to -1)

    # -- sweeping ------------------------------------------------------------------------

    async def _exchange(self, mads: Sequence[bytes], lids: npt.NDArray[np.int64]) -> list[bytes | None]:
        """Send every MAD to its LID, the transport's window full; None where unanswered.

        A request the transport could not post counts as unanswered too (and is logged).
        """
        if not mads:
            return []
        results = await self.transport.send_many(list(zip(mads, lids.tolist(), strict=True)))
        out: list[bytes | None] = [r if isinstance(r, bytes) else None for r in results]
        failed = [r for r in results if isinstance(r, BaseException) and not isinstance(r, MadTimeout)]
        if failed:
            log.warning("perfmgr: %d PerfMgt MAD(s) could not be sent, first: %s", len(failed), failed[0])
        return out

    async def sweep(self) -> PerfSweepReport:
        """Read every port's counters once; accumulate; clear what is close to saturation."""
        if self.fabric is None:
            raise PerfMgrError("perfmgr sweep: no subnet bound (bind a snapshot after a heavy sweep)")
        if self._sweeping:
            raise PerfMgrError("perfmgr sweep: a sweep is already running")
        self._sweeping = True
        try:
            return await self._sweep()
        finally:
            self._sweeping = False
            pending, self._pending = self._pending, None
            if pending is not None:
                self._bind(pending.fabric, pending.lids)

    async def _sweep(self) -> PerfSweepReport:
        started = time.time()
        t0 = time.perf_counter()
        sent0 = self.transport.stats.sent
        n = self.node_guid.size
        timeouts = np.zeros(n, np.int64)
        errors = np.zeros(n, np.int64)

        # 1. ClassPortInfo of the nodes not known since the last bind
        want = np.flatnonzero((self.cap_mask < 0) & (self.node_lid > 0))
        if want.size:
            cpi_replies = await self._exchange(
                _mads(PerfAttr.CLASS_PORT_INFO, Method.GET, np.zeros(want.size, np.int64)), self.node_lid[want]
            )
            answered, good, rows = _check(cpi_replies, PerfAttr.CLASS_PORT_INFO, None)
            self.cap_mask[want[good]] = _column(rows, _CPI_CAP).astype(np.int32)
            timeouts += np.bincount(want[~answered], minlength=n)
            errors += np.bincount(want[answered & ~good], minlength=n)

        # 2. PortCounters of every port of a node with known capabilities; Extended where it has them
        caps = self.cap_mask[self.q_node]
        live = caps >= 0
        qi = np.flatnonzero(live)
        xi = np.flatnonzero(live & ((caps & EXT_DATA_CAPS) != 0))
        mads = _mads(PerfAttr.PORT_COUNTERS, Method.GET, self.q_port[qi])
        mads += _mads(PerfAttr.PORT_COUNTERS_EXT, Method.GET, self.q_port[xi])
        now = self.clock()
        replies = await self._exchange(mads, np.concatenate([self.q_lid[qi], self.q_lid[xi]]))
        pc_ans, pc_good, pc_rows = _check(replies[: qi.size], PerfAttr.PORT_COUNTERS, self.q_port[qi])
        x_ans, x_good, x_rows = _check(replies[qi.size :], PerfAttr.PORT_COUNTERS_EXT, self.q_port[xi])

        # 3. commit: everything below up to the clears runs without yielding; rows are query rows
        self._drop_false_ext(xi, x_ans, x_good, replies[qi.size :])
        silent = np.zeros(self.q_node.size, np.bool_)
        for idx, ans, good in ((qi, pc_ans, pc_good), (xi, x_ans, x_good)):
            timeouts += np.bincount(self.q_node[idx[~ans]], minlength=n)
            errors += np.bincount(self.q_node[idx[ans & ~good]], minlength=n)
            silent[idx[~ans]] = True
        self._port_counts[0, silent] += np.uint64(1)
        ok_q = np.zeros(self.q_node.size, np.bool_)
        ok_q[qi[pc_good]] = True
        x_bad = np.zeros(self.q_node.size, np.bool_)
        x_bad[xi[~x_good]] = True
        ok_q &= ~x_bad
        self._rate.fill(np.nan)
        self.read_ok.fill(False)
        self.read_ok[self.q_node[ok_q], self.q_port[ok_q]] = True

        ext_caps = self.cap_mask.astype(np.int64)
        pr = qi[pc_good]
        pc_ext = (ext_caps[self.q_node[pr]] & EXT_DATA_CAPS) != 0
        xr = xi[x_good]
        x_full = (ext_caps[self.q_node[xr]] & EXT_FULL_CAPS) != 0
        pc_vals = {k: _column(pc_rows, spec) for k, spec in _PC_GET.items()}
        x_vals = {k: _column(x_rows, spec) for k, spec in _X_GET.items()}
        saturated = 0
        down = np.zeros(self.q_node.size, np.bool_)

        # data counters change source when a node gains or loses PortCountersExtended: re-base them
        pc_data = ~pc_ext
        for rows_, src in ((pr[pc_data], _SRC_PC), (xr, _SRC_EXT)):
            moved = rows_[self._data_src[rows_] != src]
            for c in _DATA_DEFS:
                self._have[_KEY_ROW[c.key], moved] = False
            self._data_src[rows_] = src

        for c in _PC_ONLY_DEFS:
            d, s = self._accumulate(c, pr, pc_vals[c.key], now, self._t_pc, _PC_MAX[c.key])
            down[pr[d]] = True
            saturated += s
        sel = pc_data
        for c in _DATA_DEFS:
            d, s = self._accumulate(c, pr[sel], pc_vals[c.key][sel], now, self._t_pc, _PC_MAX[c.key])
            down[pr[sel][d]] = True
            saturated += s
        for c in _X_DEFS:
            sel_x = x_full if c.full_ext else np.ones(xr.size, np.bool_)
            d, _ = self._accumulate(c, xr[sel_x], x_vals[c.key][sel_x], now, self._t_x, None)
            down[xr[sel_x][d]] = True
        self._t_pc[pr] = now
        self._t_x[xr] = now

        ours = down & self._clear_unconfirmed
        external = down & ~ours
        self._port_counts[2, external] += np.uint64(1)
        self._clear_unconfirmed[pr] = False
        n_external = int(external.sum())
        if n_external:
            er = np.flatnonzero(external)[:5]
            fab = self.fabric
            assert fab is not None
            ends = zip(self.q_node[er].tolist(), self.q_port[er].tolist(), strict=True)
            shown = ", ".join(fab.port_name(a, b) for a, b in ends)
            log.info("perfmgr: counters cleared by someone else on %d port(s): %s%s",
                     n_external, shown, " ..." if n_external > 5 else "")
        if saturated:
            log.warning("perfmgr: %d counter(s) read saturated; increments may be lost", saturated)

        self.device_timeouts += timeouts.astype(np.uint64)
        self.device_errors += errors.astype(np.uint64)
        self.sweeps += 1
        self.last_sweep_time = started
        n_timeouts = int(timeouts.sum())
        n_errors = int(errors.sum())

        # 4. clear what is close to saturation (PortCounters Set of just those counters)
        cleared, c_to, c_err = await self._clear(pr, pc_ext, pc_vals, n)
        n_timeouts += c_to
        n_errors += c_err

        report = PerfSweepReport(
            sweep=self.sweeps,
            started=started,
            duration=time.perf_counter() - t0,
            mads_sent=self.transport.stats.sent - sent0,
            nodes=int(np.count_nonzero(self.node_lid > 0)),
            class_port_info=int(want.size),
            ports=int(self.q_node.size),
            ports_read=int(ok_q.sum()),
            timeouts=n_timeouts,
            errors=n_errors,
            clears=cleared,
            external_clears=n_external,
            saturated=saturated,
            nodes_timed_out=int(np.count_nonzero(timeouts)),
        )
        self.last_report = report
        return report

    def _drop_false_ext(
        self,
        xi: npt.NDArray[np.int64],
        answered: npt.NDArray[np.bool_],
        good: npt.NDArray[np.bool_],
        replies: Sequence[bytes | None],
    ) -> None:
        """A PMA that advertised PortCountersExtended but refuses it: read its 32-bit counters from now on."""
        refused = [
            int(self.q_node[xi[j]])
            for j in np.flatnonzero(answered & ~good).tolist()
            if (r := replies[j]) is not None and len(r) >= 6 and (r[4] << 8 | r[5]) in _UNSUPPORTED
        ]
        if not refused:
            return
        nodes = np.unique(np.array(refused, np.int64))
        self.cap_mask[nodes] &= np.int32(~EXT_DATA_CAPS)
        assert self.fabric is not None
        log.warning(
            "perfmgr: %d node(s) refuse PortCountersExtended despite ClassPortInfo (%s%s); using PortCounters",
            nodes.size, ", ".join(self.fabric.names[i] for i in nodes[:5].tolist()), " ..." if nodes.size > 5 else "",
        )

    def _accumulate(
        self,
        c: CounterDef,
        rows: npt.NDArray[np.int64],
        vals: npt.NDArray[np.uint64],
        now: float,
        t_last: npt.NDArray[np.float64],
        top: int | None,
    ) -> tuple[npt.NDArray[np.bool_], int]:
        """Add one counter's readings (of the query rows ``rows``) to its totals; returns (went down, saturated)."""
        k = _KEY_ROW[c.key]
        last = self._last[c.key]
        have = self._have[k, rows]
        prev = last[rows].astype(np.uint64)
        down = have & (vals < prev)
        delta = vals - np.where(have & ~down, prev, np.uint64(0))
        scale = np.uint64(c.scale)
        self._tot[k, rows] += delta * scale
        rk = _RATE_ROW.get(c.key)
        if rk is not None:
            dt = now - t_last[rows]
            good = have & (dt > 0)
            r = np.full(rows.size, np.nan)
            r[good] = delta[good].astype(np.float64) * c.scale / dt[good]
            self._rate[rk, rows] = r
        last[rows] = vals
        self._have[k, rows] = True
        sat = int(np.count_nonzero(vals == np.uint64(top))) if top is not None else 0
        return down, sat

    async def _clear(
        self,
        pr: npt.NDArray[np.int64],
        pc_ext: npt.NDArray[np.bool_],
        pc_vals: dict[str, npt.NDArray[np.uint64]],
        n: int,
    ) -> tuple[int, int, int]:
        """Clear counters read above the threshold (``pr``: the query rows read): (ports cleared, timeouts, errors)."""
        mask = np.zeros(pr.size, np.int64)
        for c in _PC_DEFS:
            hot = pc_vals[c.key] > np.uint64(int(_PC_MAX[c.key] * self.clear_fraction))
            if c.pcx is not None:
                hot &= ~pc_ext  # a 64-bit counter is read there: leave the 32-bit one to other tools
            mask |= hot.astype(np.int64) << c.select
        todo = np.flatnonzero(mask)
        if todo.size == 0:
            return 0, 0, 0
        rows_, masks = pr[todo], mask[todo]
        nodes, ports = self.q_node[rows_], self.q_port[rows_]
        mads = [
            perf_mad(
                Method.SET,
                PerfAttr.PORT_COUNTERS,
                0,
                0,
                PORT_COUNTERS.pack({"PortSelect": p, "CounterSelect": m & 0xFFFF, "CounterSelect2": m >> 16}),
            )
            for p, m in zip(ports.tolist(), masks.tolist(), strict=True)
        ]
        # a Set whose answer is lost may still have cleared: the next drop is then ours
        self._clear_unconfirmed[rows_] = True
        replies = await self._exchange(mads, self.q_lid[rows_])
        answered, good, got = _check(replies, PerfAttr.PORT_COUNTERS, ports)
        gr, gm = rows_[good], masks[good]
        for c in _PC_DEFS:
            sel = (gm >> c.select & 1).astype(np.bool_)
            if sel.any():
                self._last[c.key][gr[sel]] = _column(got[sel], _PC_GET[c.key])
        self._clear_unconfirmed[gr] = False
        self._port_counts[1, gr] += np.uint64(1)
        to = np.bincount(nodes[~answered], minlength=n).astype(np.uint64)
        err = np.bincount(nodes[answered & ~good], minlength=n).astype(np.uint64)
        self.device_timeouts += to
        self.device_errors += err
        self._port_counts[0, rows_[~answered]] += np.uint64(1)
        if gr.size:
            log.debug("perfmgr: cleared counters close to saturation on %d port(s)", gr.size)
        return int(gr.size), int(to.sum()), int(err.sum())

    async def run(self, interval: float, *, on_sweep: Callable[[PerfSweepReport], None] | None = None) -> None:
        """Sweep every ``interval`` seconds until cancelled; a sweep that fails is logged and retried."""
        if interval <= 0:
            raise PerfMgrError(f"perfmgr interval {interval} s is not positive")
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            if self.fabric is not None:
                try:
                    report = await self.sweep()
                except IbfmError as e:
                    log.warning("perfmgr sweep failed: %s", e)
                else:
                    if on_sweep is not None:
                        on_sweep(report)
            await asyncio.sleep(max(0.0, interval - (loop.time() - t0)))

    # -- reading ---------------------------------------------------------------------------

    def port_totals(self, node: int, port: int) -> dict[str, int]:
        """Every total of one port, by key (for APIs and tests)."""
        return {k: int(v[node, port]) for k, v in self.totals.items()}

    def counter_units(self, key: str) -> str:
        """``bytes``, ``packets``, ``ticks`` or ``events``."""
        if key not in _BY_KEY:
            raise PerfMgrError(f"unknown counter {key!r} (known: {', '.join(KEYS)})")
        return UNITS[key]
