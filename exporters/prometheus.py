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
  and per-device families are written straight from the arrays with numpy
  and kept compressed, never as text. The label sets are escaped and laid
  out as byte matrices once per topology change (kept while nodes, names and
  cables stay the same); a family's lines are the metric name, a matrix row,
  one blank and the value, deflated into a :class:`Segment` that is kept,
  per shard, until its values change. An :class:`Exposition` (one format and
  :class:`Selection`) is its families' segments with the headers between
  them: gzip without compressing anything again, OpenMetrics and the text
  format from the same segments. :class:`MetricsHandler` negotiates as
  client_python does, selects by ``collect[]`` and ``shard=i/n``, and
  renders the outputs scraped lately as soon as the inputs change.

Per-port series carry ``guid`` and ``port`` only; names, the far end and
the link's role are on one ``ibfm_port_info`` series per port.

Node indices of the PerfManager and the prediction are mapped onto the
snapshot's by node GUID when they are bound to another fabric object (a
counter sweep still running on the previous snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import math
import os
import re
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from aiohttp import web
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from exporters import metrics as M
from exporters.heap import trim_heap
from exporters.metrics import MetricDef
from fabric.errors import IbfmError
from fabric.model import MTU_BYTES, NO_PEER, Fabric, NodeType, lanes_of, link_bytes_per_s
from fabric.shape import switch_ranks
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


def _escape_help(text: str, openmetrics: bool) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if openmetrics else text


_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


def shard_hash(guid: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """MurmurHash3's 64-bit finalizer (fmix64) of node GUIDs: a switch's shard is ``shard_hash(guid) % n``.

    Stable across sweeps and restarts (a function of the GUID alone), and even for the consecutive
    GUIDs vendors give a batch of switches."""
    x = np.asarray(guid, np.uint64).copy()
    x ^= x >> _S33
    x *= _MIX1
    x ^= x >> _S33
    x *= _MIX2
    x ^= x >> _S33
    return x


class _Rows:
    """The label sets of a vector family (one per row), laid out once per topology.

    ``matrix``: ``uint8[rows, width]``, row ``i`` the bytes of ``{labels}``
    followed by NULs up to a common width; ``lens[i]`` its length. A family's
    text is, row by row, the metric name, the row's first ``lens[i]`` bytes, a
    blank and the value (:func:`_body`). ``shard_key[i]``: the hash
    (:func:`shard_hash`) of the node whose shard the row goes to. ``values``
    (label values as strings, for the prometheus_client path) are made on
    demand by ``make_values``.
    """

    def __init__(
        self,
        names: tuple[str, ...],
        blocks: list[str],
        shard_key: npt.NDArray[np.uint64],
        make_values: Callable[[], list[tuple[str, ...]]],
    ) -> None:
        self.names = names
        raw = [b.encode() for b in blocks]
        self.lens = np.fromiter(map(len, raw), np.int64, len(raw))
        width = int(self.lens.max()) if raw else 1
        self.matrix = np.array(raw, dtype=f"S{width}").view(np.uint8).reshape(len(raw), width)
        self.shard_key = shard_key
        self._make_values = make_values
        self._dicts: list[dict[str, str]] | None = None

    def __len__(self) -> int:
        return int(self.lens.shape[0])

    @property
    def values(self) -> list[tuple[str, ...]]:
        return self._make_values()

    @property
    def dicts(self) -> list[dict[str, str]]:
        if self._dicts is None:
            n = self.names
            self._dicts = [dict(zip(n, v, strict=True)) for v in self.values]
        return self._dicts

    def subset(self, idx: npt.NDArray[np.intp]) -> _Rows:
        if idx.size == len(self):
            return self
        sub = _Rows.__new__(_Rows)
        sub.names = self.names
        sub.lens = self.lens[idx]
        sub.matrix = self.matrix[idx]
        sub.shard_key = self.shard_key[idx]
        make = self._make_values
        sel = idx.tolist()

        def values() -> list[tuple[str, ...]]:
            v = make()
            return [v[i] for i in sel]

        sub._make_values = values
        sub._dicts = None
        return sub

    def window(self, start: int, stop: int) -> _Rows:
        """Rows ``start:stop`` as views (for rendering a piece at a time; no label values)."""
        sub = _Rows.__new__(_Rows)
        sub.names = self.names
        sub.lens = self.lens[start:stop]
        sub.matrix = self.matrix[start:stop]
        sub.shard_key = self.shard_key[start:stop]
        sub._make_values = lambda: self.values[start:stop]
        sub._dicts = None
        return sub

    def in_shard(self, shard: tuple[int, int] | None) -> npt.NDArray[np.intp] | None:
        """Rows of shard ``(i, n)``, or None for every row."""
        if shard is None or shard[1] == 1:
            return None
        i, n = shard
        return np.flatnonzero(self.shard_key % np.uint64(n) == np.uint64(i))


_MTU = np.zeros(256, np.int64)
for _code, _bytes in MTU_BYTES.items():
    _MTU[_code] = _bytes


def _roles(fabric: Fabric, pn: npt.NDArray[np.intp], rn: npt.NDArray[np.int64]) -> list[str]:
    """The link role of each port (``exporters.metrics.LINK_ROLES``)."""
    is_sw = fabric.node_type == NodeType.SWITCH
    rank = switch_ranks(fabric)
    cabled = rn != NO_PEER
    peer = np.where(cabled, rn, 0)
    both = cabled & is_sw[pn] & is_sw[peer]
    mine, theirs = rank[pn], rank[peer]
    ranked = both & (mine >= 0) & (theirs >= 0)
    code = np.full(pn.shape[0], 4, np.int64)  # none
    code[cabled] = 3  # peer (two CAs, or switches of one tier)
    code[cabled & (is_sw[pn] != is_sw[peer])] = 2  # host
    code[ranked & (theirs > mine)] = 0  # up
    code[ranked & (theirs < mine)] = 1  # down
    names = M.LINK_ROLES
    return [names[c] for c in code.tolist()]


class _Topology:
    """Rows and label sets of one fabric: ports (all but switch port 0), their info series, and devices.

    Shards: a switch's rows (its ports, its device series) go to the shard of its own GUID; the rows of
    a CA or router port to the shard of the switch its cable leads to (its own GUID's without one); a
    CA's device series to the shard of the switch on its first port cabled to a switch.
    """

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        ex = fabric.port_exists.copy()
        is_sw = fabric.node_type == NodeType.SWITCH
        ex[is_sw, 0] = False
        pn, pp = np.nonzero(ex)
        self.pn = pn.astype(np.intp)
        self.pp = pp.astype(np.intp)
        pn, pp = self.pn, self.pp
        n = fabric.n_nodes
        guid = [f"0x{g:016x}" for g in fabric.node_guid.tolist()] + [""]
        name = [*(_clean(x) for x in fabric.names), ""]
        ename = [_escape(s) for s in name]
        rn = fabric.peer_node[pn, pp].astype(np.int64)
        rp = np.where(rn != NO_PEER, fabric.peer_port[pn, pp].astype(np.int64), -1)
        ports = _PORT_STR
        hashes = shard_hash(fabric.node_guid)
        to_switch = (rn != NO_PEER) & is_sw[np.where(rn != NO_PEER, rn, 0)]
        owner = np.where(~is_sw[pn] & to_switch, rn, pn)
        port_key = hashes[owner]
        a_l, b_l, c_l, d_l = pn.tolist(), pp.tolist(), rn.tolist(), rp.tolist()
        role = _roles(fabric, pn, rn)

        def port_values() -> list[tuple[str, ...]]:
            return [(guid[a], ports[b]) for a, b in zip(a_l, b_l, strict=True)]

        def info_values() -> list[tuple[str, ...]]:
            return [
                (guid[a], ports[b], name[a], guid[c], name[c], ports[d], r)
                for a, b, c, d, r in zip(a_l, b_l, c_l, d_l, role, strict=True)
            ]

        self.ports = _Rows(
            M.PORT_LABELS,
            [f'{{guid="{guid[a]}",port="{ports[b]}"}}' for a, b in zip(a_l, b_l, strict=True)],
            port_key,
            port_values,
        )
        self.port_info = _Rows(
            M.PORT_INFO_LABELS,
            [
                f'{{guid="{guid[a]}",port="{ports[b]}",name="{ename[a]}",remote_guid="{guid[c]}",'
                f'remote_name="{ename[c]}",remote_port="{ports[d]}",role="{r}"}}'
                for a, b, c, d, r in zip(a_l, b_l, c_l, d_l, role, strict=True)
            ],
            port_key,
            info_values,
        )
        dev_owner = np.arange(n, dtype=np.int64)
        ca_rows = np.flatnonzero(~is_sw[pn] & to_switch)
        cas, first = np.unique(pn[ca_rows], return_index=True)  # a CA's first port cabled to a switch
        dev_owner[cas] = rn[ca_rows[first]]
        types = [M.NODE_TYPE_NAMES.get(t, str(t)) for t in fabric.node_type.tolist()]

        def device_values() -> list[tuple[str, ...]]:
            return [(guid[i], name[i], types[i]) for i in range(n)]

        self.devices = _Rows(
            M.DEVICE_LABELS,
            [f'{{guid="{guid[i]}",name="{ename[i]}",type="{types[i]}"}}' for i in range(n)],
            hashes[dev_owner],
            device_values,
        )

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


def _header(m: MetricDef, openmetrics: bool) -> str:
    """``# HELP`` and ``# TYPE`` (and OpenMetrics' ``# UNIT``); OpenMetrics names a counter's family without
    ``_total``, as client_python does."""
    if not openmetrics:
        return f"# HELP {m.name} {_escape_help(m.help, False)}\n# TYPE {m.name} {m.type.value}\n"
    fam = m.family
    unit = f"# UNIT {fam} {m.unit}\n" if m.unit else ""
    return f"# HELP {fam} {_escape_help(m.help, True)}\n# TYPE {fam} {m.type.value}\n{unit}"


def _text_family(f: _Family, openmetrics: bool) -> str:
    out = [_header(f.metric, openmetrics)]
    for name, lnames, lvalues, value in f.samples:
        if lnames:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(lnames, lvalues, strict=True))
            out.append(f"{name}{{{labels}}} {_fmt(value)}\n")
        else:
            out.append(f"{name} {_fmt(value)}\n")
    return "".join(out)


_POW10 = [np.uint64(10**k) for k in range(20)]


def _int_field(v: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Non-negative integers as decimal digits, ``uint8[n, digits of the largest]`` (right-aligned behind
    leading zeros), and the number of digits of each: row ``i``'s value is its last ``digits[i]`` bytes."""
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
    return out, digits


def _str_field(texts: list[str]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """ASCII strings, right-aligned in a ``uint8[n, longest]``, and their lengths."""
    n = len(texts)
    lens = np.fromiter(map(len, texts), np.int64, n)
    d = int(lens.max()) if n else 1
    buf = np.frombuffer("".join(texts).encode("ascii"), np.uint8)
    out = np.full(n * d, 32, np.uint8)
    starts = np.cumsum(lens) - lens
    # character k of the joined text, in row r: goes to r * d + (d - len_r) + (k - start_r)
    shift = np.arange(n, dtype=np.int64) * d + d - lens - starts
    out[np.arange(buf.size, dtype=np.int64) + np.repeat(shift, lens)] = buf
    return out.reshape(n, d), lens


def _value_field(values: npt.NDArray[Any]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Sample values as right-aligned text, one row each, and their lengths; floats as repr, NaN and
    infinities as Go writes them."""
    if values.dtype.kind == "u" or (values.dtype.kind in "ib" and (values.size == 0 or values.min() >= 0)):
        return _int_field(values.astype(np.uint64))
    if values.dtype.kind in "ib":
        return _str_field([str(x) for x in values.tolist()])
    vals = values.astype(np.float64)
    texts = list(map(float.__repr__, vals.tolist()))
    for i in np.flatnonzero(~np.isfinite(vals)).tolist():
        texts[i] = floatToGoString(vals[i])
    return _str_field(texts)


def _body(name: str, rows: _Rows, values: npt.NDArray[Any]) -> npt.NDArray[np.uint8]:
    """A vector family's sample lines, ``name{labels} value\\n`` each with one blank (OpenMetrics' rule;
    the text format takes it too): the name, the label matrix and the values side by side in one array,
    then the padding cut out with one boolean mask."""
    n = len(rows)
    if n == 0:
        return np.zeros(0, np.uint8)
    lab, llen = rows.matrix, rows.lens
    val, vlen = _value_field(np.asarray(values))
    name_b = np.frombuffer(name.encode(), np.uint8)
    k, w, d = name_b.size, lab.shape[1], val.shape[1]
    out = np.empty((n, k + w + d + 2), np.uint8)
    out[:, :k] = name_b
    out[:, k : k + w] = lab
    out[:, k + w] = 32
    out[:, k + w + 1 : -1] = val
    out[:, -1] = 10
    keep = np.ones(out.shape, np.bool_)
    keep[:, k : k + w] = np.arange(w)[None, :] < llen[:, None]
    keep[:, k + w + 1 : -1] = np.arange(d)[None, :] >= (d - vlen)[:, None]
    return out[keep]


# -- compressed pieces ------------------------------------------------------------------------------------------

GZIP_LEVEL = 1
"""zlib level of the kept pieces. Level 1: on the 11,664-host fabric the text compresses about tenfold,
several times faster than at 6."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of the exposition, deflated on its own (raw deflate, ending on a sync flush and not final):
    segments concatenate into one deflate stream, so an output is a gzip header, its segments, an empty
    final block and a trailer (CRC-32 combined from the segments', as pigz does): no text kept, no piece
    compressed twice."""

    data: bytes
    crc: int
    size: int
    """Length of the text."""

    @classmethod
    def of(cls, text: bytes | npt.NDArray[np.uint8]) -> Segment:
        return cls.of_pieces([text])

    @classmethod
    def of_pieces(cls, pieces: Iterable[bytes | npt.NDArray[np.uint8]]) -> Segment:
        """One segment of the pieces one after the other (made and dropped one at a time)."""
        z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -15)
        out: list[bytes] = []
        crc = size = 0
        for text in pieces:
            view = text if isinstance(text, bytes) else np.ascontiguousarray(text).data.cast("B")
            out.append(z.compress(view))
            crc = zlib.crc32(view, crc)
            size += len(view)
        out.append(z.flush(zlib.Z_SYNC_FLUSH))
        return cls(b"".join(out), crc, size)

    def text(self) -> bytes:
        return zlib.decompressobj(-15).decompress(self.data)


_CRC_POLY = 0xEDB88320


def _multmodp(a: int, b: int) -> int:
    """a x b modulo the CRC-32 polynomial (reflected), as zlib's crc32_combine does it."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    p = 1 << 30  # x^1
    table = [p]
    for _ in range(31):
        p = _multmodp(p, p)
        table.append(p)
    return table


_X2N = _x2n_table()


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A + B from CRC-32(A), CRC-32(B) and len(B) (zlib's crc32_combine)."""
    p = 1 << 31  # x^0
    k = 3
    n = len2
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
"""gzip member header: deflate, no flags, no mtime, OS unknown."""
_FINAL_BLOCK = b"\x03\x00"
"""An empty final fixed-Huffman block: ends the deflate stream."""


@dataclass(frozen=True)
class Exposition:
    """One output (format and selection) as segments, for one set of inputs."""

    segments: tuple[Segment, ...]
    content_type: str
    size: int = field(init=False)
    crc: int = field(init=False)

    def __post_init__(self) -> None:
        crc = size = 0
        for s in self.segments:
            crc = crc32_combine(crc, s.crc, s.size)
            size += s.size
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "crc", crc)

    def gzip_chunks(self) -> list[bytes]:
        """The output as one gzip member, in pieces (no copy of the segments)."""
        trailer = struct.pack("<II", self.crc, self.size & 0xFFFFFFFF)
        return [_GZIP_HEADER, *(s.data for s in self.segments), _FINAL_BLOCK, trailer]

    @property
    def gzip_size(self) -> int:
        return len(_GZIP_HEADER) + sum(len(s.data) for s in self.segments) + len(_FINAL_BLOCK) + 8

    def text_chunks(self) -> Iterator[bytes]:
        """The text, a segment at a time (inflated on the way: the renderer keeps no text)."""
        for s in self.segments:
            yield s.text()

    def text(self) -> bytes:
        return b"".join(self.text_chunks())


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
        fams.append(_Vector(M.PORT_INFO, topo.port_info, np.ones(len(topo.port_info), np.uint8)))
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
    # a model's figures: 1e-6 of a link and 0.1 tick/s are far below what it can tell apart, and
    # shorter numbers halve the families' compressed size
    return [
        _Vector(M.PORT_PREDICTED_UTILIZATION, rows, np.round(util[qn, qp], 6)),
        _Vector(M.PORT_PREDICTED_XMIT_WAIT, rows, np.round(wait[qn, qp], 1)),
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


class SelectionError(MetricsError):
    """A bad ``collect[]`` or ``shard`` parameter (HTTP 400)."""

    def __init__(self, parameter: str, detail: str) -> None:
        super().__init__(detail)
        self.parameter = parameter
        self.detail = detail


SHARDS_MAX = 1024
"""The largest ``n`` of ``shard=i/n``."""
_SHARD = re.compile(r"([0-9]{1,4})/([0-9]{1,4})")
_PARAMS = ("collect[]", "shard")


@dataclass(frozen=True)
class Selection:
    """What one scrape asks for: family groups (None: all of them) and a shard ``(i, n)`` (None: whole)."""

    groups: frozenset[str] | None = None
    shard: tuple[int, int] | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str] | Iterable[tuple[str, str]]) -> Selection:
        """From query parameters (``collect[]`` any number of times, ``shard`` at most once), as
        node_exporter reads ``collect[]``; raises :class:`SelectionError` naming the parameter."""
        items = list(query.items()) if isinstance(query, Mapping) else list(query)
        groups: set[str] = set()
        shard: tuple[int, int] | None = None
        seen_shard = False
        for k, v in items:
            if k == "collect[]":
                if v not in M.GROUPS:
                    raise SelectionError(
                        k, f"unknown metric group {v!r} in collect[] (known: {', '.join(M.GROUPS)})"
                    )
                groups.add(v)
            elif k == "shard":
                if seen_shard:
                    raise SelectionError(k, "shard given more than once")
                seen_shard = True
                m = _SHARD.fullmatch(v)
                i, n = (int(m.group(1)), int(m.group(2))) if m else (-1, 0)
                if not (1 <= n <= SHARDS_MAX and 0 <= i < n):
                    raise SelectionError(
                        k, f"shard {v!r}: want i/n with 0 <= i < n <= {SHARDS_MAX} (e.g. shard=0/4)"
                    )
                shard = (i, n) if n > 1 else None
            else:
                raise SelectionError(k, f"unknown query parameter {k!r} (known: {', '.join(_PARAMS)})")
        return cls(frozenset(groups) if groups else None, shard)

    def wants(self, metric: MetricDef) -> bool:
        return self.groups is None or M.GROUP_OF[metric.name] in self.groups

    @property
    def fabric_wide(self) -> bool:
        """Whether the fabric-wide families go in: to the whole fabric and to shard 0."""
        return self.shard is None or self.shard[0] == 0


EVERYTHING = Selection()

OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
"""Content-Type of OpenMetrics 1.0 (what client_python answers an ``Accept`` that names it)."""


def accepts_openmetrics(header: str) -> bool:
    """Whether an ``Accept`` value asks for OpenMetrics: client_python's rule (the media type named
    anywhere in the list), except with ``q=0``."""
    return _accepts(header, ("application/openmetrics-text",))


@dataclass
class RenderStats:
    """What the last render of :class:`MetricsRenderer` did."""

    seconds: float = 0.0
    bytes: int = 0
    """Size of the text."""
    gzip_bytes: int = 0
    families: int = 0
    families_rendered: int = 0
    """Vector families whose text was rebuilt and compressed (the others came from the cache)."""
    cached: bool = False
    """The whole output came from the cache."""


_SHARD_SETS_KEPT = 64
"""Shard selections (``(i, n)``) whose compressed families are kept; the least recently used go first."""


class MetricsRenderer:
    """Renders the exposition for a :data:`MetricsSource`, caching per topology, family, shard and sweep.

    ``exposition(openmetrics, selection)`` returns an :class:`Exposition` (the output as deflated
    segments); ``render()`` the text format as bytes; the ``*_async`` forms do the work in a thread
    when the cache is stale. Each vector family is rendered and compressed once per change of its
    values and shard; a new output (another format or selection) of the same inputs only reuses them.
    Safe to call from several threads; one render runs at a time.
    """

    def __init__(self, source: MetricsSource) -> None:
        self.source = source
        self.stats = RenderStats()
        self._builder = _Builder()
        self._lock = threading.Lock()
        self._fams: list[_Family | _Vector] | None = None
        self._current: tuple[tuple[object, ...], dict[tuple[bool, Selection], Exposition]] | None = None
        """(inputs key, the outputs made of them): replaced in one assignment when the inputs change."""
        self._segments: OrderedDict[tuple[int, int] | None, dict[str, tuple[_Rows, bytes, Segment]]]
        self._segments = OrderedDict()
        """Per shard selection, per vector family: (rows, digest of the values, compressed body)."""

    def kept_bytes(self) -> dict[str, int]:
        """What the renderer holds between scrapes, in bytes: label matrices, compressed families, the
        families' values of the current inputs."""
        t = self._builder._topo
        rows = 0 if t is None else sum(r.matrix.nbytes + r.lens.nbytes + r.shard_key.nbytes
                                       for r in (t.ports, t.port_info, t.devices))
        segs = sum(len(e[2].data) for kept in self._segments.values() for e in kept.values())
        fams = self._fams or []
        values = sum(f.values.nbytes for f in fams if isinstance(f, _Vector))
        return {"label matrices": rows, "compressed families": segs, "values": values}

    def render(self) -> bytes:
        """The whole text format (0.0.4), as bytes."""
        return self.exposition().text()

    def exposition(self, openmetrics: bool = False, selection: Selection = EVERYTHING) -> Exposition:
        return self._render(_capture(self.source()), openmetrics, selection)

    async def exposition_async(self, openmetrics: bool = False, selection: Selection = EVERYTHING) -> Exposition:
        """As :meth:`exposition`; inputs are captured on the calling (event-loop) thread, rendering runs in
        a thread unless the output is kept."""
        captured = _capture(self.source())
        cur = self._current
        if cur is not None and _same_key(cur[0], captured.key()):
            out = cur[1].get((openmetrics, selection))
            if out is not None:
                return out
        return await asyncio.to_thread(self._render, captured, openmetrics, selection)

    def _render(self, c: _Captured, openmetrics: bool, sel: Selection) -> Exposition:
        t0 = time.perf_counter()
        key = c.key()
        with self._lock:
            cur = self._current
            if cur is None or not _same_key(cur[0], key):
                self._fams = None
                cur = self._current = (key, {})
            outputs = cur[1]
            out = outputs.get((openmetrics, sel))
            if out is not None:
                s = self.stats
                self.stats = RenderStats(time.perf_counter() - t0, out.size, out.gzip_size, s.families, 0, True)
                return out
            if self._fams is None:
                self._fams = self._builder.build(c)
            kept = self._segments.pop(sel.shard, {})
            self._segments[sel.shard] = kept
            while len(self._segments) > _SHARD_SETS_KEPT:
                self._segments.popitem(last=False)
            fams = [f for f in self._fams if sel.wants(f.metric) and (sel.fabric_wide or isinstance(f, _Vector))]
            vectors = [f for f in fams if isinstance(f, _Vector)]
            stale = [f for f in vectors if not _kept_current(kept, f)]
            # render and compress the stale families side by side (zlib and numpy's copies release the GIL)
            for f, entry in zip(stale, _POOL.map(lambda f: _vector_entry(f, sel.shard), stale), strict=True):
                kept[f.metric.name] = entry
            segments: list[Segment] = []
            text: list[str] = []
            for fam in fams:
                if isinstance(fam, _Family):
                    text.append(_text_family(fam, openmetrics))
                    continue
                text.append(_header(fam.metric, openmetrics))
                segments.append(Segment.of("".join(text).encode()))
                text = []
                segments.append(kept[fam.metric.name][2])
            families, rendered = len(fams), len(stale)
            if openmetrics:
                text.append("# EOF\n")
            if text:
                segments.append(Segment.of("".join(text).encode()))
            out = Exposition(tuple(segments), OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE)
            outputs[(openmetrics, sel)] = out
            self.stats = RenderStats(time.perf_counter() - t0, out.size, out.gzip_size, families, rendered, False)
            if rendered:  # the render's temporaries, resident in each thread's arena otherwise
                trim_heap()
            return out


_POOL = ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1), thread_name_prefix="metrics-render")
"""Renders and compresses stale vector families side by side."""


_Kept = tuple[_Rows, bytes, Segment]
"""A vector family's compressed sample lines for one shard: (its rows, digest of its values, segment)."""


def _digest(values: npt.NDArray[Any]) -> bytes:
    v = np.ascontiguousarray(values)
    h = hashlib.blake2b(v.data.cast("B"), digest_size=16)
    h.update(v.dtype.str.encode())
    return h.digest()


def _kept_current(kept: dict[str, _Kept], fam: _Vector) -> bool:
    """Whether ``kept`` holds this family's lines with these rows and values."""
    old = kept.get(fam.metric.name)
    return old is not None and old[0] is fam.rows and old[1] == _digest(fam.values)


def _vector_entry(fam: _Vector, shard: tuple[int, int] | None) -> _Kept:
    """The family's sample lines of the shard, rendered and compressed."""
    rows, values = fam.rows, np.asarray(fam.values)
    idx = rows.in_shard(shard)
    if idx is not None:
        rows, values = rows.subset(idx), values[idx]
    step = _ROWS_PER_PIECE
    pieces = (_body(fam.metric.name, rows.window(i, i + step), values[i : i + step]) for i in range(0, len(rows), step))
    return fam.rows, _digest(fam.values), Segment.of_pieces(pieces)


_ROWS_PER_PIECE = 8192
"""Rows rendered at a time: the temporaries of a family stay near a megabyte."""


def _same_key(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Objects by identity (a snapshot or a prediction is replaced whole, never changed), counts and the
    SM's figures (a small frozen record made fresh per scrape) by value."""
    if len(a) != len(b):
        return False
    return all(
        x is y or (type(x) is type(y) and type(x) in (int, SmFigures) and x == y) for x, y in zip(a, b, strict=True)
    )


def render_metrics(inputs: MetricsInputs, openmetrics: bool = False, selection: Selection = EVERYTHING) -> bytes:
    """One-shot exposition text for ``inputs`` (no cache kept; a server keeps a :class:`MetricsRenderer`)."""
    return MetricsRenderer(lambda: inputs).exposition(openmetrics, selection).text()


def _accepts(header: str, names: tuple[str, ...]) -> bool:
    """Whether a comma-separated header value lists one of ``names`` (lower case) with a q-value above 0."""
    for part in header.split(","):
        name, _, params = part.partition(";")
        if name.strip().lower() not in names:
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


def accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` value takes gzip (``gzip`` or ``*`` with a q-value above 0; RFC 9110)."""
    return _accepts(header, ("gzip", "*"))


class MetricsHandler:
    """The aiohttp handler for ``GET /metrics``, negotiating as client_python does: OpenMetrics 1.0 when
    ``Accept`` names it, the text format 0.0.4 otherwise; gzip when ``Accept-Encoding`` takes it (the
    kept segments as they are), the text inflated on the way otherwise. ``collect[]`` and ``shard``
    select (:class:`Selection`); a bad one is a 400 ``{error, detail, parameter}``.

    :meth:`prewarm` (an aiohttp ``cleanup_ctx`` entry; ``create_app`` adds it for a handler whose
    ``__self__`` has one) renders, as soon as the
    inputs change (a counter sweep, a heavy sweep), every output scraped in the last ``keep`` seconds:
    a scrape then finds its output made and costs only the transfer.
    """

    def __init__(self, renderer: MetricsRenderer, *, interval: float = 0.5, keep: float = 600.0) -> None:
        self.renderer = renderer
        self.interval = interval
        self.keep = keep
        self._scraped: dict[tuple[bool, Selection], float] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            sel = Selection.parse(request.query.items())
        except SelectionError as e:
            return web.json_response(
                {"error": "bad_parameter", "detail": e.detail, "parameter": e.parameter}, status=400
            )
        om = accepts_openmetrics(request.headers.get("Accept", ""))
        self._scraped[(om, sel)] = time.monotonic()
        out = await self.renderer.exposition_async(om, sel)
        headers = {"Content-Type": out.content_type, "Vary": "Accept, Accept-Encoding"}
        gz = accepts_gzip(request.headers.get("Accept-Encoding", ""))
        if gz:
            headers["Content-Encoding"] = "gzip"
        resp = web.StreamResponse(headers=headers)
        resp.content_length = out.gzip_size if gz else out.size
        try:
            await resp.prepare(request)
            if request.method != "HEAD":
                if gz:
                    for chunk in out.gzip_chunks():
                        await resp.write(chunk)
                else:
                    for seg in out.segments:  # inflated off the loop when large
                        text = seg.text() if seg.size < 1 << 20 else await asyncio.to_thread(seg.text)
                        await resp.write(text)
            await resp.write_eof()
        except ConnectionResetError:  # the scraper gave up (its timeout) or went away: nothing to answer
            log.debug("metrics: %s closed the connection before the answer was sent", request.remote)
        return resp

    async def prewarm(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: the pre-rendering task for the app's lifetime."""
        task = asyncio.create_task(self._prewarm_loop(), name="metrics-prewarm")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _prewarm_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            for want, at in list(self._scraped.items()):
                if now - at > self.keep:
                    self._scraped.pop(want, None)
                    continue
                try:
                    await self.renderer.exposition_async(*want)
                except Exception:  # a scrape would report it; keep the loop
                    log.exception("metrics: pre-rendering %s failed", want)
                    await asyncio.sleep(10 * self.interval)


def metrics_handler(renderer: MetricsRenderer) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The ``GET /metrics`` handler over ``renderer``: :meth:`MetricsHandler.handle` of a new handler (its
    ``__self__``, whose :meth:`~MetricsHandler.prewarm` ``create_app`` runs)."""
    return MetricsHandler(renderer).handle
