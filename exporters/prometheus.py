"""The Prometheus exporter: metric families built from the fabric arrays at scrape time.

Inputs (:class:`MetricsInputs`, from a :data:`MetricsSource` callable): the
current :class:`~sm.sweep.manager.SubnetSnapshot` (with its partition plan), the
:class:`~sm.perf.perfmgr.PerfManager` (counter totals ``[node, port]``), the
congestion model's :class:`Prediction` and the heavy-sweep history
(:class:`SweepStats`). Every metric name, type and help text comes from
:mod:`exporters.metrics`.

Two ways out of the same data:

- :class:`FabricCollector`, a prometheus_client collector: ``collect()``
  yields metric families built fresh from the arrays (no ``.labels()``
  children, so a port that vanishes from the snapshot vanishes from the
  output). Fine for small fabrics and for tests.
- :class:`MetricsRenderer`, the fast path the HTTP server uses: per-port
  and per-device families are written as exposition text straight from the
  arrays with numpy. The label sets are escaped and laid out as a byte
  matrix once per topology change (cached by fabric identity, and kept while
  nodes, names and cables stay the same); a family is that matrix with the
  metric name on its left and the values' digits on its right. The text of
  a family is kept until its values change, and the whole output until the
  snapshot, the PerfManager's sweep count, the prediction or the sweep
  history changes: a scrape between two counter sweeps costs nothing.

Node indices of the PerfManager and the prediction are mapped onto the
snapshot's by node GUID when they are bound to another fabric object (a
counter sweep still running on the previous snapshot).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from aiohttp import web
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from exporters import metrics as M
from exporters.metrics import MetricDef
from fabric.errors import IbfmError
from fabric.model import MTU_BYTES, NO_PEER, Fabric, NodeType, lanes_of, link_bytes_per_s
from sm.partitions.plan import PartitionPlan
from sm.sweep.manager import SubnetSnapshot

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content-Type of the Prometheus text exposition format."""


class MetricsError(IbfmError):
    """Bad input to the exporter (a negative duration, arrays of the wrong shape)."""


# -- inputs ---------------------------------------------------------------------------------------------


class PerfCounters(Protocol):
    """What the exporter reads of :class:`sm.perf.perfmgr.PerfManager`."""

    fabric: Fabric | None
    node_guid: npt.NDArray[np.uint64]
    totals: dict[str, npt.NDArray[np.uint64]]
    queried: npt.NDArray[np.bool_]
    read_ok: npt.NDArray[np.bool_]
    device_timeouts: npt.NDArray[np.uint64]
    device_errors: npt.NDArray[np.uint64]
    sweeps: int
    last_sweep_time: float
    last_report: Any


class Prediction(Protocol):
    """Per-port output of the congestion model, indexed ``[node, port]`` of ``fabric``.

    ``utilization``: predicted transmit utilization, 0..1. ``xmit_wait``:
    predicted XmitWait ticks per second. A prediction is replaced whole, never
    changed in place.
    """

    @property
    def fabric(self) -> Fabric: ...

    @property
    def utilization(self) -> npt.NDArray[np.float64]: ...

    @property
    def xmit_wait(self) -> npt.NDArray[np.float64]: ...


@dataclass(frozen=True)
class PortPrediction:
    """A plain :class:`Prediction`."""

    fabric: Fabric
    utilization: npt.NDArray[np.float64]
    xmit_wait: npt.NDArray[np.float64]

    def __post_init__(self) -> None:
        shape = self.fabric.port_exists.shape
        for name in ("utilization", "xmit_wait"):
            a = getattr(self, name)
            if np.shape(a) != shape:
                raise MetricsError(f"prediction {name}: shape {np.shape(a)}, the fabric's ports are {shape}")


@dataclass(frozen=True)
class SweepFigures:
    """A consistent copy of :class:`SweepStats` (what one scrape shows)."""

    buckets: tuple[float, ...]
    bucket_counts: tuple[int, ...]
    """Per bucket, not cumulative; the last one is ``+Inf``."""
    count: int
    sum: float
    failures: int
    lft_blocks_sent: int
    lft_blocks_skipped: int
    smps: int
    version: int


class SweepStats:
    """Heavy-sweep history over the life of the process: the duration histogram and the totals.

    The manager's owner calls :meth:`record` after each successful heavy sweep
    and :meth:`record_failure` after each failed one. Thread-safe.
    """

    def __init__(self, buckets: Sequence[float] = M.SWEEP_DURATION_BUCKETS) -> None:
        b = tuple(float(x) for x in buckets)
        if not b or any(y <= x for x, y in itertools.pairwise(b)) or math.isinf(b[-1]):
            raise MetricsError(f"sweep duration buckets {b}: need finite, strictly increasing bounds")
        self._buckets = b
        self._counts = [0] * (len(b) + 1)
        self._sum = 0.0
        self._failures = 0
        self._sent = 0
        self._skipped = 0
        self._smps = 0
        self._version = 0
        self._lock = threading.Lock()

    def record(self, snapshot: SubnetSnapshot, seconds: float | None = None) -> None:
        """Count one successful heavy sweep; ``seconds`` defaults to its duration (stages overlap)."""
        s = (snapshot.duration_s or sum(snapshot.phases.values())) if seconds is None else float(seconds)
        if not s >= 0.0 or math.isinf(s):
            raise MetricsError(f"sweep {snapshot.sweep}: duration {seconds!r} s is not a finite, non-negative time")
        i = int(np.searchsorted(self._buckets, s, side="left"))
        with self._lock:
            self._counts[i] += 1
            self._sum += s
            self._sent += snapshot.program.blocks_sent
            self._skipped += snapshot.program.blocks_skipped
            self._smps += snapshot.smps
            self._version += 1

    def record_failure(self) -> None:
        """Count one heavy sweep that ended with a failed stage."""
        with self._lock:
            self._failures += 1
            self._version += 1

    def figures(self) -> SweepFigures:
        with self._lock:
            return SweepFigures(
                self._buckets,
                tuple(self._counts),
                sum(self._counts),
                self._sum,
                self._failures,
                self._sent,
                self._skipped,
                self._smps,
                self._version,
            )


@dataclass(frozen=True)
class MetricsInputs:
    """Everything one scrape reads. Any part may be missing (before the first sweep, no PerfManager)."""

    snapshot: SubnetSnapshot | None
    perfmgr: PerfCounters | None = None
    prediction: Prediction | None = None
    sweeps: SweepStats | None = None
    sm: SmFigures | None = None


@dataclass(frozen=True)
class SmFigures:
    """This SM's role and its SA's counters, as one scrape shows them."""

    state: int
    priority: int
    guid: int
    master_guid: int
    master_lid: int
    sa_requests: int = 0
    sa_records: int = 0
    sa_busy: int = 0
    sa_dropped: int = 0
    m_key_traps: int = 0
    mcast_groups: int = 0
    mcast_members: int = 0
    mft_blocks_sent: int = 0


MetricsSource = Callable[[], MetricsInputs]
"""Returns the current inputs; called once per scrape, on the thread (event loop) that owns them."""


# -- labels, built once per topology ----------------------------------------------------------------------

_PORT_STR = [str(i) for i in range(256)] + [""]
"""Port numbers as label values; index -1 (no peer) gives ''."""


def _clean(value: str) -> str:
    """A name as a label value: NUL bytes (padding of a NodeDescription) dropped."""
    return value.replace("\x00", "") if "\x00" in value else value


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class _Rows:
    """The label sets of a vector family (one per row), in the forms the two outputs need.

    ``matrix``: ``uint8[rows, width]``, row ``i`` the bytes of ``{labels}``
    followed by blanks up to a common width (at least one blank), so a
    family's text is this matrix with the metric name to its left and the
    values, right-aligned, to its right: one line per row, every line of a
    family the same length. The text format allows any run of blanks between
    the label set and the value.
    """

    def __init__(
        self, names: tuple[str, ...], values: Sequence[tuple[str, ...]], blocks: npt.NDArray[np.object_]
    ) -> None:
        self.names = names
        self.values = values
        self.blocks = blocks
        self._matrix: npt.NDArray[np.uint8] | None = None
        self._dicts: list[dict[str, str]] | None = None

    def __len__(self) -> int:
        return len(self.values)

    @property
    def matrix(self) -> npt.NDArray[np.uint8]:
        if self._matrix is None:
            raw = [b.encode() for b in self.blocks.tolist()]
            width = max(map(len, raw), default=0) + 1
            m = np.array(raw, dtype=f"S{width}").view(np.uint8).reshape(len(raw), width).copy()
            m[m == 0] = 32  # NUL padding -> blanks (label values hold no NUL: see _clean)
            self._matrix = m
        return self._matrix

    @property
    def dicts(self) -> list[dict[str, str]]:
        if self._dicts is None:
            n = self.names
            self._dicts = [dict(zip(n, v, strict=True)) for v in self.values]
        return self._dicts

    def subset(self, idx: npt.NDArray[np.intp]) -> _Rows:
        if idx.size == len(self.values):
            return self
        sub = _Rows(self.names, [self.values[i] for i in idx.tolist()], self.blocks[idx])
        if self._matrix is not None:
            sub._matrix = self._matrix[idx]
        return sub


_MTU = np.zeros(256, np.int64)
for _code, _bytes in MTU_BYTES.items():
    _MTU[_code] = _bytes


class _Topology:
    """Rows and label sets of one fabric: ports (all but switch port 0) and devices."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        ex = fabric.port_exists.copy()
        ex[fabric.node_type == NodeType.SWITCH, 0] = False
        pn, pp = np.nonzero(ex)
        self.pn = pn.astype(np.intp)
        self.pp = pp.astype(np.intp)
        guid = [f"0x{g:016x}" for g in fabric.node_guid.tolist()] + [""]
        name = [*(_clean(x) for x in fabric.names), ""]
        ename = [_escape(s) for s in name]
        rn = fabric.peer_node[pn, pp].astype(np.int64)
        rp = np.where(rn != NO_PEER, fabric.peer_port[pn, pp].astype(np.int64), -1)
        ports = _PORT_STR
        rows = list(zip(pn.tolist(), pp.tolist(), rn.tolist(), rp.tolist(), strict=True))
        values = [(guid[a], name[a], ports[b], guid[c], name[c], ports[d]) for a, b, c, d in rows]
        blocks = np.array(
            [
                f'{{guid="{guid[a]}",name="{ename[a]}",port="{ports[b]}",'
                f'remote_guid="{guid[c]}",remote_name="{ename[c]}",remote_port="{ports[d]}"}}'
                for a, b, c, d in rows
            ],
            dtype=object,
        )
        self.ports = _Rows(M.PORT_LABELS, values, blocks)
        types = [M.NODE_TYPE_NAMES.get(t, str(t)) for t in fabric.node_type.tolist()]
        n = fabric.n_nodes
        dvalues = [(guid[i], name[i], types[i]) for i in range(n)]
        dblocks = np.array(
            [f'{{guid="{guid[i]}",name="{ename[i]}",type="{types[i]}"}}' for i in range(n)], dtype=object
        )
        self.devices = _Rows(M.DEVICE_LABELS, dvalues, dblocks)

    def same_as(self, fabric: Fabric) -> bool:
        """True if ``fabric`` has the same nodes, names and cables (labels would be identical)."""
        f = self.fabric
        if f is fabric:
            return True
        return (
            f.port_exists.shape == fabric.port_exists.shape
            and f.names == fabric.names
            and np.array_equal(f.node_guid, fabric.node_guid)
            and np.array_equal(f.node_type, fabric.node_type)
            and np.array_equal(f.port_exists, fabric.port_exists)
            and np.array_equal(f.peer_node, fabric.peer_node)
            and np.array_equal(f.peer_port, fabric.peer_port)
        )


def _node_map(guids: npt.NDArray[np.uint64], other: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    """For each GUID of ``guids``, its index in ``other``, -1 where absent."""
    out = np.full(guids.shape[0], -1, np.intp)
    if other.size == 0 or guids.size == 0:
        return out
    order = np.argsort(other, kind="stable")
    srt = other[order]
    pos = np.minimum(np.searchsorted(srt, guids), srt.size - 1)
    hit = srt[pos] == guids
    out[hit] = order[pos[hit]]
    return out


@dataclass(frozen=True)
class _PerfView:
    """The PerfManager's arrays captured at one instant (a re-bind replaces them whole)."""

    fabric: Fabric | None
    node_guid: npt.NDArray[np.uint64]
    totals: dict[str, npt.NDArray[np.uint64]]
    queried: npt.NDArray[np.bool_]
    read_ok: npt.NDArray[np.bool_]
    device_timeouts: npt.NDArray[np.uint64]
    device_errors: npt.NDArray[np.uint64]
    sweeps: int
    last_sweep_time: float
    last_duration: float | None
    last_ports_read: int | None

    @classmethod
    def capture(cls, pm: PerfCounters) -> _PerfView:
        rep = pm.last_report
        return cls(
            pm.fabric,
            pm.node_guid,
            dict(pm.totals),
            # Copies: the perf manager rewrites these in place during its sweep while we render in a thread.
            pm.queried.copy(),
            pm.read_ok.copy(),
            pm.device_timeouts.copy(),
            pm.device_errors.copy(),
            int(pm.sweeps),
            float(pm.last_sweep_time),
            None if rep is None else float(rep.duration),
            None if rep is None else int(rep.ports_read),
        )


@dataclass(frozen=True)
class _Captured:
    snapshot: SubnetSnapshot | None
    perf: _PerfView | None
    prediction: Prediction | None
    sweeps: SweepFigures | None
    sm: SmFigures | None = None

    def key(self) -> tuple[object, ...]:
        p = self.perf
        s = self.sweeps
        return (
            self.snapshot,
            None if p is None else p.fabric,
            None if p is None else p.sweeps,
            self.prediction,
            None if s is None else s.version,
            self.sm,
        )


def _capture(inputs: MetricsInputs) -> _Captured:
    return _Captured(
        inputs.snapshot,
        None if inputs.perfmgr is None else _PerfView.capture(inputs.perfmgr),
        inputs.prediction,
        None if inputs.sweeps is None else inputs.sweeps.figures(),
        inputs.sm,
    )


# -- families ----------------------------------------------------------------------------------------------

Value = int | float


@dataclass
class _Family:
    """A family with a few samples: (series name, label names, label values, value)."""

    metric: MetricDef
    samples: list[tuple[str, tuple[str, ...], tuple[str, ...], Value]] = field(default_factory=list)

    def add(self, value: Value, labels: tuple[str, ...] = (), *, suffix: str = "", names: tuple[str, ...] = ()) -> None:
        self.samples.append((self.metric.name + suffix, names or self.metric.labels, labels, value))


@dataclass
class _Vector:
    """A family with one sample per row of ``rows``."""

    metric: MetricDef
    rows: _Rows
    values: npt.NDArray[Any]


def _fmt(v: Value) -> str:
    return str(v) if isinstance(v, int) else floatToGoString(v)


def _header(m: MetricDef) -> str:
    return f"# HELP {m.name} {_escape_help(m.help)}\n# TYPE {m.name} {m.type.value}\n"


def _text_family(f: _Family) -> str:
    out = [_header(f.metric)]
    for name, lnames, lvalues, value in f.samples:
        if lnames:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(lnames, lvalues, strict=True))
            out.append(f"{name}{{{labels}}} {_fmt(value)}\n")
        else:
            out.append(f"{name} {_fmt(value)}\n")
    return "".join(out)


_POW10 = [np.uint64(10**k) for k in range(20)]


def _int_field(v: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint8]:
    """Non-negative integers as right-aligned decimal digits, ``uint8[n, digits of the largest]``."""
    n = v.shape[0]
    d = len(str(int(v.max()))) if n else 1
    out = np.empty((n, d), np.uint8)
    x = v.copy()
    ten = np.uint64(10)
    for j in range(d - 1, -1, -1):
        out[:, j] = x % ten
        x //= ten
    out += 48
    digits = np.ones(n, np.int64)
    for k in range(1, d):
        digits += v >= _POW10[k]
    out[np.arange(d)[None, :] < (d - digits)[:, None]] = 32
    return out


def _str_field(texts: list[str]) -> npt.NDArray[np.uint8]:
    """ASCII strings, right-aligned in a blank-padded ``uint8[n, longest]``."""
    n = len(texts)
    lens = np.fromiter(map(len, texts), np.int64, n)
    d = int(lens.max()) if n else 1
    buf = np.frombuffer("".join(texts).encode("ascii"), np.uint8)
    out = np.full(n * d, 32, np.uint8)
    starts = np.cumsum(lens) - lens
    # character k of the joined text, in row r: goes to r * d + (d - len_r) + (k - start_r)
    shift = np.arange(n, dtype=np.int64) * d + d - lens - starts
    out[np.arange(buf.size, dtype=np.int64) + np.repeat(shift, lens)] = buf
    return out.reshape(n, d)


def _value_field(values: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """Sample values as right-aligned text, one row each; floats as repr, NaN and infinities as Go writes them."""
    if values.dtype.kind == "u" or (values.dtype.kind in "ib" and (values.size == 0 or values.min() >= 0)):
        return _int_field(values.astype(np.uint64))
    if values.dtype.kind in "ib":
        return _str_field([str(x) for x in values.tolist()])
    vals = values.astype(np.float64)
    texts = list(map(float.__repr__, vals.tolist()))
    for i in np.flatnonzero(~np.isfinite(vals)).tolist():
        texts[i] = floatToGoString(vals[i])
    return _str_field(texts)


Chunk = bytes | memoryview
"""A piece of the exposition: bytes, or a 1-D byte view of a rendered numpy array (no copy)."""


def _text_vector(v: _Vector) -> list[Chunk]:
    """A family's text: the name, the label matrix and the values side by side, a row per line."""
    head = _header(v.metric).encode()
    n = len(v.rows)
    if n == 0:
        return [head]
    lab = v.rows.matrix
    val = _value_field(np.asarray(v.values))
    name = np.frombuffer(v.metric.name.encode(), np.uint8)
    k, w, d = name.size, lab.shape[1], val.shape[1]
    out = np.empty((n, k + w + d + 1), np.uint8)
    out[:, :k] = name
    out[:, k : k + w] = lab
    out[:, k + w : k + w + d] = val
    out[:, -1] = 10
    return [head, out.reshape(-1).data]


def _metric_object(fam: _Family | _Vector) -> Metric:
    m = fam.metric
    out = Metric(m.family, m.help, m.type.value)
    if isinstance(fam, _Family):
        for name, lnames, lvalues, value in fam.samples:
            out.add_sample(name, dict(zip(lnames, lvalues, strict=True)), value)
    else:
        name = m.name
        for d, value in zip(fam.rows.dicts, fam.values.tolist(), strict=True):
            out.add_sample(name, d, value)
    return out


# -- building the families from the inputs ------------------------------------------------------------------


class _Builder:
    """Turns captured inputs into families; keeps the per-topology caches."""

    def __init__(self) -> None:
        self._topo: _Topology | None = None
        self._perf_map: tuple[Fabric | None, _Topology, npt.NDArray[np.intp], npt.NDArray[np.intp], _Rows] | None
        self._perf_map = None
        self._perf_epoch: tuple[Fabric | None, int] | None = None
        self._partition_fams: tuple[PartitionPlan, list[_Family | _Vector]] | None = None

    def topology(self, fabric: Fabric) -> _Topology:
        """Rows and labels for ``fabric``: reused while nodes, names and cables stay the same."""
        t = self._topo
        if t is None or not t.same_as(fabric):
            t = _Topology(fabric)
            self._topo = t
        else:
            t.fabric = fabric  # same labels; states, widths and MTUs are read from the new one
        return t

    def _perf_rows(self, topo: _Topology, pv: _PerfView) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], _Rows]:
        """(PerfManager node index per snapshot node, rows of the counter families as indices, their labels)."""
        pm = self._perf_map
        if pm is not None and pm[0] is pv.fabric and pm[1] is topo:
            return pm[2], pm[3], pm[4]
        f = topo.fabric
        same = pv.fabric is f
        nmap = np.arange(f.n_nodes, dtype=np.intp) if same else _node_map(f.node_guid, pv.node_guid)
        width = pv.queried.shape[1] if pv.queried.ndim == 2 else 0
        qn = nmap[topo.pn]
        ok = (qn >= 0) & (topo.pp < width)
        ok[ok] = pv.queried[qn[ok], topo.pp[ok]]
        idx = np.flatnonzero(ok)
        rows = topo.ports.subset(idx)
        self._perf_map = (pv.fabric, topo, nmap, idx, rows)
        return nmap, idx, rows

    def build(self, c: _Captured) -> list[_Family | _Vector]:
        snap = c.snapshot
        fams: list[_Family | _Vector] = []
        up = _Family(M.SUBNET_UP)
        up.add(1 if snap is not None and snap.up else 0)
        fams.append(up)
        if snap is not None:
            fams += self._subnet(snap)
            if snap.partitions is not None:
                fams += self._partitions(snap.partitions)
        if c.sm is not None:
            fams += _sm_families(c.sm)
        if c.sweeps is not None:
            fams += _sweep_families(c.sweeps)
        if c.perf is not None:
            fams += _perf_families(c.perf)
        if snap is None:
            return fams
        topo = self.topology(snap.fabric)
        perf = c.perf
        perf_ok = perf is not None and perf.fabric is not None and _perf_consistent(perf)
        if perf is not None and perf.fabric is not None and not perf_ok:
            log.warning("metrics: PerfManager arrays are inconsistent (re-bind in progress?); counters left out")
        fams += self._devices(topo, perf if perf_ok else None)
        fams += _port_gauges(topo)
        if c.prediction is not None:
            fams += _predicted(topo, c.prediction)
        if perf is not None and perf_ok:
            nmap, idx, rows = self._perf_rows(topo, perf)
            qn = nmap[topo.pn[idx]]
            qp = topo.pp[idx]
            for m in M.PORT_COUNTERS:
                arr = perf.totals.get(m.counter_key or "")
                if arr is not None:
                    fams.append(_Vector(m, rows, arr[qn, qp]))
        return fams

    def _subnet(self, snap: SubnetSnapshot) -> list[_Family | _Vector]:
        f = snap.fabric
        out: list[_Family | _Vector] = []

        def one(m: MetricDef, v: Value) -> None:
            fam = _Family(m)
            fam.add(v)
            out.append(fam)

        one(M.LAST_SWEEP_TIMESTAMP, float(snap.time))
        one(M.SWEEP_NUMBER, int(snap.sweep))
        phases = _Family(M.SWEEP_PHASE_DURATION)
        for k, v in snap.phases.items():
            phases.add(float(v), (k,))
        out.append(phases)
        eng = _Family(M.ROUTING_ENGINE)
        eng.add(1, (snap.engine,))
        out.append(eng)
        nodes = _Family(M.NODES)
        counts = np.bincount(f.node_type, minlength=4)
        for code, name in M.NODE_TYPE_NAMES.items():
            nodes.add(int(counts[code]), (name,))
        out.append(nodes)
        ex = f.port_exists.copy()
        ex[f.node_type == NodeType.SWITCH, 0] = False
        ports = _Family(M.PORTS)
        pc = np.bincount(f.state[ex], minlength=8)
        for code, name in M.PORT_STATE_NAMES.items():
            ports.add(int(pc[code]), (name,))
        out.append(ports)
        la = f.link_array(up_only=False)
        ls = np.minimum(f.state[la[:, 0], la[:, 1]], f.state[la[:, 2], la[:, 3]])
        lc = np.bincount(ls, minlength=8)
        links = _Family(M.LINKS)
        for code, name in M.PORT_STATE_NAMES.items():
            links.add(int(lc[code]), (name,))
        out.append(links)
        one(M.CREDIT_LOOPS, len(snap.credit_loops))
        one(M.UNREACHABLE_ROUTES, int(snap.verify.unreachable))
        return out

    def _partitions(self, plan: PartitionPlan) -> list[_Family | _Vector]:
        """Members per partition and membership, and the plan's problem count: built once per plan."""
        cached = self._partition_fams
        if cached is not None and cached[0] is plan:
            return cached[1]
        members = _Family(M.PARTITION_MEMBERS)
        for part in plan.config.partitions if plan.config is not None else ():
            bits = plan.membership.get(part.pkey)
            full = limited = 0
            if bits is not None:  # bit 1 full member, bit 0 limited (PartitionPlan.membership)
                full = int(np.count_nonzero(bits & 2))
                limited = int(np.count_nonzero(bits & 1))
            key = f"0x{part.pkey | 0x8000:04x}"
            members.add(full, (key, _clean(part.name), "full"))
            members.add(limited, (key, _clean(part.name), "limited"))
        problems = _Family(M.PARTITION_PROBLEMS)
        problems.add(len(plan.problems))
        out: list[_Family | _Vector] = [members, problems]
        self._partition_fams = (plan, out)
        return out

    def _devices(self, topo: _Topology, perf: _PerfView | None) -> list[_Family | _Vector]:
        f = topo.fabric
        n = f.n_nodes
        up = np.ones(n, np.int64)
        out: list[_Family | _Vector] = []
        if perf is None:
            return [_Vector(M.DEVICE_UP, topo.devices, up)]
        nmap, _, _ = self._perf_rows(topo, perf)
        known = nmap >= 0
        # read_ok is reset by a re-bind: trust it once a sweep ran on this binding (or it shows answers)
        ep = self._perf_epoch
        if ep is None or ep[0] is not perf.fabric:
            ep = (perf.fabric, perf.sweeps)
            self._perf_epoch = ep
        swept = perf.sweeps > ep[1] or bool(perf.read_ok.any())
        if swept:
            asked = perf.queried.any(axis=1)
            answered = (perf.read_ok & perf.queried).any(axis=1)
            dev_up = np.where(asked, answered, True)
            up[known] = dev_up[nmap[known]]
        out.append(_Vector(M.DEVICE_UP, topo.devices, up))
        idx = np.flatnonzero(known)
        rows = topo.devices.subset(idx)
        out.append(_Vector(M.DEVICE_COLLECTION_ERRORS, rows, perf.device_errors[nmap[idx]]))
        out.append(_Vector(M.DEVICE_COLLECTION_TIMEOUTS, rows, perf.device_timeouts[nmap[idx]]))
        return out


def _perf_consistent(p: _PerfView) -> bool:
    n = p.node_guid.shape[0]
    shape = p.queried.shape
    if p.queried.ndim != 2 or shape[0] != n:
        return False
    if p.fabric is not None and p.fabric.port_exists.shape != shape:
        return False
    arrays = [p.read_ok, *p.totals.values()]
    return all(a.shape == shape for a in arrays) and p.device_errors.shape == p.device_timeouts.shape == (n,)


def _sm_families(sm: SmFigures) -> list[_Family | _Vector]:
    out: list[_Family | _Vector] = []
    for m, v in (
        (M.SM_STATE, sm.state),
        (M.SM_PRIORITY, sm.priority),
        (M.SA_REQUESTS, sm.sa_requests),
        (M.SA_RECORDS, sm.sa_records),
        (M.SA_BUSY, sm.sa_busy),
        (M.SA_DROPPED, sm.sa_dropped),
        (M.M_KEY_TRAPS, sm.m_key_traps),
        (M.MCAST_GROUPS, sm.mcast_groups),
        (M.MCAST_MEMBERS, sm.mcast_members),
        (M.MFT_BLOCKS, sm.mft_blocks_sent),
    ):
        fam = _Family(m)
        fam.add(v)
        out.append(fam)
    if sm.master_guid:
        info = _Family(M.SM_MASTER_INFO)
        me = "1" if sm.master_guid == sm.guid else "0"
        info.add(1, (f"{sm.master_guid:#018x}", str(sm.master_lid), me))
        out.append(info)
    return out


def _sweep_families(s: SweepFigures) -> list[_Family | _Vector]:
    h = _Family(M.SWEEP_DURATION)
    acc = 0
    for le, c in zip((*s.buckets, math.inf), s.bucket_counts, strict=True):
        acc += c
        h.add(acc, (floatToGoString(le),), suffix="_bucket", names=("le",))
    h.add(float(s.sum), suffix="_sum", names=())
    h.add(s.count, suffix="_count", names=())
    out: list[_Family | _Vector] = [h]
    for m, v in (
        (M.SWEEP_FAILURES, s.failures),
        (M.SWEEP_SMPS, s.smps),
        (M.LFT_BLOCKS_SENT, s.lft_blocks_sent),
        (M.LFT_BLOCKS_SKIPPED, s.lft_blocks_skipped),
    ):
        fam = _Family(m)
        fam.add(int(v))
        out.append(fam)
    return out


def _perf_families(p: _PerfView) -> list[_Family | _Vector]:
    out: list[_Family | _Vector] = []
    for m, v in (
        (M.PERFMGR_SWEEPS, p.sweeps),
        (M.PERFMGR_LAST_SWEEP_TIMESTAMP, p.last_sweep_time),
        (M.PERFMGR_SWEEP_DURATION, p.last_duration),
        (M.PERFMGR_PORTS_READ, p.last_ports_read),
    ):
        if v is not None:
            fam = _Family(m)
            fam.add(v)
            out.append(fam)
    return out


def _port_gauges(topo: _Topology) -> list[_Family | _Vector]:
    f, pn, pp, rows = topo.fabric, topo.pn, topo.pp, topo.ports
    width = f.width_active[pn, pp]
    lanes = lanes_of(width)
    rate = np.rint(link_bytes_per_s(width, f.speed_active[pn, pp])).astype(np.int64)
    return [
        _Vector(M.PORT_STATE, rows, f.state[pn, pp]),
        _Vector(M.PORT_PHYSICAL_STATE, rows, f.phys_state[pn, pp]),
        _Vector(M.PORT_WIDTH_LANES, rows, lanes),
        _Vector(M.PORT_RATE_BYTES, rows, rate),
        _Vector(M.PORT_MTU_BYTES, rows, _MTU[f.mtu_active[pn, pp]]),
    ]


def _predicted(topo: _Topology, pred: Prediction) -> list[_Family | _Vector]:
    f = topo.fabric
    pf = getattr(pred, "fabric", None)
    util = np.asarray(pred.utilization, np.float64)
    wait = np.asarray(pred.xmit_wait, np.float64)
    shape = (f.n_nodes, f.port_exists.shape[1]) if pf is None else pf.port_exists.shape
    if util.shape != shape or wait.shape != shape:
        log.warning(
            "metrics: prediction arrays %s/%s do not match the ports %s; predicted families left out",
            util.shape, wait.shape, shape,
        )
        return []
    if pf is None or pf is f:
        qn, qp, idx = topo.pn, topo.pp, None
    else:
        nmap = _node_map(f.node_guid, pf.node_guid)
        m = nmap[topo.pn]
        ok = (m >= 0) & (topo.pp < shape[1])
        idx = np.flatnonzero(ok)
        qn, qp = m[idx], topo.pp[idx]
    rows = topo.ports if idx is None else topo.ports.subset(idx)
    return [
        _Vector(M.PORT_PREDICTED_UTILIZATION, rows, util[qn, qp]),
        _Vector(M.PORT_PREDICTED_XMIT_WAIT, rows, wait[qn, qp]),
    ]


# -- the two outputs ------------------------------------------------------------------------------------------


class FabricCollector:
    """A prometheus_client collector over a :data:`MetricsSource` (register it in a ``CollectorRegistry``).

    Builds ``Metric`` objects, one sample object per series: use
    :class:`MetricsRenderer` for large fabrics.
    """

    def __init__(self, source: MetricsSource) -> None:
        self.source = source
        self._builder = _Builder()
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        return [Metric(m.family, m.help, m.type.value) for m in M.ALL]

    def collect(self) -> Iterator[Metric]:
        captured = _capture(self.source())
        with self._lock:
            fams = self._builder.build(captured)
        for fam in fams:
            yield _metric_object(fam)


@dataclass
class RenderStats:
    """What the last render of :class:`MetricsRenderer` did."""

    seconds: float = 0.0
    bytes: int = 0
    families: int = 0
    families_rendered: int = 0
    """Vector families whose text was rebuilt (the others came from the cache)."""
    cached: bool = False
    """The whole output came from the cache."""


class MetricsRenderer:
    """Renders the exposition text for a :data:`MetricsSource`, caching per topology, family and sweep.

    ``render()`` returns bytes; ``render_chunks()`` the same as a list of
    bytes-like pieces (a family's header and body; a server writes them one
    after the other instead of joining hundreds of MB); ``render_async()``
    does the work in a thread when the cache is stale. Safe to call from
    several threads; one render runs at a time.
    """

    def __init__(self, source: MetricsSource) -> None:
        self.source = source
        self.stats = RenderStats()
        self._builder = _Builder()
        self._lock = threading.Lock()
        self._cached: tuple[tuple[object, ...], list[Chunk]] | None = None
        """(inputs key, output), replaced in one assignment."""
        self._family_text: dict[str, tuple[_Rows, npt.NDArray[Any], list[Chunk]]] = {}
        self._gzipped: tuple[list[Chunk], bytes] | None = None
        """(output, that output gzipped), replaced in one assignment."""

    def render(self) -> bytes:
        return b"".join(self.render_chunks())

    def render_chunks(self) -> list[Chunk]:
        return self._render(_capture(self.source()))

    async def render_async(self) -> list[Chunk]:
        """As :meth:`render_chunks`; inputs are captured on the calling (event-loop) thread."""
        captured = _capture(self.source())
        cached = self._cached
        if cached is not None and _same_key(cached[0], captured.key()):
            return cached[1]
        return await asyncio.to_thread(self._render, captured)

    async def render_gzip_async(self) -> bytes:
        """The output gzipped (what a scraper asking ``Accept-Encoding: gzip`` gets, as Prometheus always
        asks), compressed in a thread once per output and kept until the output changes. Level 1: on the
        11,664-host fabric the text compresses about tenfold at this level, several times faster than at 6."""
        chunks = await self.render_async()
        gz = self._gzipped
        if gz is not None and gz[0] is chunks:
            return gz[1]
        body = await asyncio.to_thread(gzip_chunks, chunks)
        self._gzipped = (chunks, body)
        return body

    def _render(self, c: _Captured) -> list[Chunk]:
        t0 = time.perf_counter()
        key = c.key()
        with self._lock:
            cached = self._cached
            if cached is not None and _same_key(cached[0], key):
                self.stats = RenderStats(time.perf_counter() - t0, self.stats.bytes, self.stats.families, 0, True)
                return cached[1]
            fams = self._builder.build(c)
            chunks: list[Chunk] = []
            rendered = 0
            seen: dict[str, tuple[_Rows, npt.NDArray[Any], list[Chunk]]] = {}
            for fam in fams:
                if isinstance(fam, _Family):
                    chunks.append(_text_family(fam).encode())
                    continue
                name = fam.metric.name
                old = self._family_text.get(name)
                if old is not None and old[0] is fam.rows and np.array_equal(old[1], fam.values):
                    text = old[2]
                else:
                    text = _text_vector(fam)
                    rendered += 1
                seen[name] = (fam.rows, np.array(fam.values, copy=True), text)
                chunks += text
            self._family_text = seen
            self._cached = (key, chunks)
            self.stats = RenderStats(time.perf_counter() - t0, sum(map(len, chunks)), len(fams), rendered, False)
            return chunks


def _same_key(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Objects by identity (a snapshot or a prediction is replaced whole, never changed), counts and the
    SM's figures (a small frozen record made fresh per scrape) by value."""
    if len(a) != len(b):
        return False
    return all(
        x is y or (type(x) is type(y) and type(x) in (int, SmFigures) and x == y) for x, y in zip(a, b, strict=True)
    )


def render_metrics(inputs: MetricsInputs) -> bytes:
    """One-shot exposition text for ``inputs`` (no cache kept; a server keeps a :class:`MetricsRenderer`)."""
    return MetricsRenderer(lambda: inputs).render()


def gzip_chunks(chunks: Sequence[Chunk]) -> bytes:
    """The exposition gzipped (level 1, one gzip member), from its chunks without joining them."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: a gzip member
    out = [z.compress(c) for c in chunks]
    out.append(z.flush())
    return b"".join(out)


def accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` value takes gzip (``gzip`` or ``*`` with a q-value above 0; RFC 9110)."""
    for part in header.split(","):
        name, _, params = part.partition(";")
        if name.strip().lower() not in ("gzip", "*"):
            continue
        q = 1.0
        for p in params.split(";"):
            k, _, v = p.strip().partition("=")
            if k.strip().lower() == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        if q > 0:
            return True
    return False


def metrics_handler(renderer: MetricsRenderer) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler for ``GET /metrics``: cached text, rendered off the event loop when stale; gzipped
    (and that kept) when the scraper asks for it, as client_python and node_exporter do."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if accepts_gzip(request.headers.get("Accept-Encoding", "")):
            body = await renderer.render_gzip_async()
            resp = web.StreamResponse(
                headers={"Content-Type": CONTENT_TYPE, "Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
            )
            resp.content_length = len(body)
            await resp.prepare(request)
            if request.method != "HEAD":
                await resp.write(body)
            await resp.write_eof()
            return resp
        chunks = await renderer.render_async()
        resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"})
        resp.content_length = sum(map(len, chunks))
        await resp.prepare(request)
        if request.method != "HEAD":
            for chunk in chunks:
                await resp.write(chunk)
        await resp.write_eof()
        return resp

    return handle
