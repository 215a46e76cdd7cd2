"""What the administrator's client commands read (``ibfm links``, ``ibfm errors``, ``ibfm hot``).

``GET /linkinfo`` is ``iblinkinfo``: every cable with its width, speed and state, and the best width and speed
both ends support, a link running below them flagged ``degraded``. ``GET /errors`` is ``ibqueryerrors``: the
ports whose PMA error counters moved, with their totals and rates per second. ``GET /hot`` lists the busiest
transmitting ports now: measured (the PerfManager's transmit rate over the link's data rate) beside what the
congestion model predicts for a traffic pattern on the current routes.

Everything here reads the current snapshot and the PerfManager's arrays; nothing waits on a sweep.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from aiohttp import web

from exporters.http.common import (
    MANAGER,
    PERFMGR,
    CounterSource,
    choice_param,
    int_param,
    json_response,
    page_params,
    query_params,
)
from exporters.http.congestion import check_pattern_spec, predicted_report
from exporters.http.openapi import API_PREFIX
from exporters.http.state import current_view
from exporters.http.view import _SPEED_NAME, PHYS_NAMES, STATE_NAMES, SnapshotView
from fabric.model import NO_PEER, SPEED_GBPS, WIDTH_LANES, WIDTH_NAMES, lanes_of, link_gbps
from sm.analysis.flowmodel import CongestionReport
from sm.perf.perfmgr import UNITS

__all__ = ["PREDICTION", "admin"]

admin = web.RouteTableDef()

PREDICTION: web.AppKey[Callable[[], tuple[str, CongestionReport | None]]] = web.AppKey("prediction")
"""Optional: the daemon's configured pattern and its current prediction (``congestion.pattern``), which
``GET /hot`` shows when no ``pattern`` is asked for."""

ERROR_WINDOW_S = 60.0
"""Error counter rates are over the counter sweeps of the last minute seen by the API (at least two)."""
ERROR_KEYS = tuple(k for k, unit in UNITS.items() if unit == "events")
"""The PMA error counters (SymbolErrorCounter ... VL15Dropped, QP1Dropped): what ``ibqueryerrors`` checks."""

_GBPS_PER_LANE = np.zeros(256, np.float64)
for _speed, _gbps in SPEED_GBPS.items():
    _GBPS_PER_LANE[int(_speed)] = _gbps
_WIDTHS_ASCENDING = sorted(WIDTH_LANES, key=WIDTH_LANES.__getitem__)


# -- link info ----------------------------------------------------------------------------------------------


@dataclass
class _LinkTable:
    """Per cable of one snapshot (the order of ``SnapshotView.links()``): the best both ends support."""

    best_width: npt.NDArray[np.int64]
    best_speed: npt.NDArray[np.int64]
    degraded: npt.NDArray[np.bool_]


def link_table(v: SnapshotView) -> _LinkTable:
    """Capability and degradation of every cable, computed once per snapshot as arrays."""
    hit: _LinkTable | None = v.link_table
    if hit is not None:
        return hit
    f = v.fabric
    a, pa, b, pb = v.links().T
    common = f.width_cap[a, pa].astype(np.int64) & f.width_cap[b, pb].astype(np.int64)
    best_width = np.zeros(a.size, np.int64)
    for code in _WIDTHS_ASCENDING:  # the widest both ends support wins
        best_width[(common & code) != 0] = code
    best_speed = np.minimum(f.speed_cap[a, pa], f.speed_cap[b, pb]).astype(np.int64)
    up = v.up[a, pa] & v.up[b, pb]
    act_speed = f.speed_active[a, pa].astype(np.int64)
    slow = (lanes_of(f.width_active[a, pa]) < lanes_of(best_width)) | (act_speed < best_speed)
    table = _LinkTable(best_width, best_speed, up & slow)
    v.link_table = table
    return table


def _why(width: str | None, speed: str | None, best_w: str | None, best_s: str | None) -> str:
    parts = []
    if width != best_w:
        parts.append(f"width {width} of {best_w}")
    if speed != best_s:
        parts.append(f"speed {speed} of {best_s}")
    return ", ".join(parts)


@admin.get(f"{API_PREFIX}/linkinfo")
async def list_linkinfo(request: web.Request) -> web.Response:
    q = query_params(request, ("node", "degraded", "limit", "offset"))
    degraded = choice_param(q, "degraded", ("true", "false"))
    limit, offset = page_params(q)
    v = current_view(request)
    f = v.fabric
    la = v.links()
    t = link_table(v)
    keep = np.ones(la.shape[0], bool)
    if "node" in q:
        n = v.node(q["node"], "node")
        keep &= (la[:, 0] == n) | (la[:, 2] == n)
    if degraded is not None:
        keep &= t.degraded == (degraded == "true")
    rows = np.flatnonzero(keep)
    items = []
    for i in rows[offset : offset + limit].tolist():
        a, pa, b, pb = la[i].tolist()
        lf = v.link_fields(a, pa)
        bw, bs = int(t.best_width[i]), int(t.best_speed[i])
        best_w, best_s = WIDTH_NAMES.get(bw), _SPEED_NAME.get(bs) if bs else None
        bad = bool(t.degraded[i])
        items.append({
            "a": v.end(a, pa),
            "b": v.end(b, pb),
            "state": STATE_NAMES.get(min(int(f.state[a, pa]), int(f.state[b, pb])), "nop"),
            "phys_state": PHYS_NAMES.get(int(f.phys_state[a, pa]), "nop"),
            **lf,
            "supported_width": best_w,
            "supported_speed": best_s,
            "supported_gbps": round(link_gbps(bw, bs), 3),
            "degraded": bad,
            "why": _why(lf["width"], lf["speed"], best_w, best_s) if bad else None,
        })
    return json_response({"total": int(rows.size), "degraded": int(t.degraded.sum()), "offset": offset,
                          "limit": limit, "items": items})


# -- error counters -------------------------------------------------------------------------------------------


@dataclass
class _Sample:
    """The PerfManager's error totals after one of its sweeps, where any is nonzero (flat port indices)."""

    sweep: int
    time: float
    where: npt.NDArray[np.intp]
    values: npt.NDArray[np.uint64]
    """(len(where), len(ERROR_KEYS))."""


@dataclass
class _ErrorHistory:
    """Samples of distinct PerfManager sweeps over one fabric, those of the last ``ERROR_WINDOW_S`` (at least two):
    the newest less the oldest is what moved, over the time between them."""

    fabric: object = None
    samples: list[_Sample] = field(default_factory=list)

    def take(self, perf: CounterSource) -> None:
        """Sample the totals if the PerfManager swept since the last sample (a new fabric starts over)."""
        if perf.fabric is None or not perf.sweeps:
            return
        if perf.fabric is not self.fabric:
            self.fabric, self.samples = perf.fabric, []
        if self.samples and self.samples[-1].sweep == perf.sweeps:
            return
        totals = [perf.totals[k].ravel() for k in ERROR_KEYS if k in perf.totals]
        if not totals:
            return
        moved = totals[0] != 0
        for t in totals[1:]:  # (a port mask per counter: no copy of the whole arrays)
            moved |= t != 0
        where = np.flatnonzero(moved)
        values = np.stack([t[where] for t in totals], axis=1)
        now = perf.last_sweep_time
        kept = [x for x in self.samples[:-1] if x.time >= now - ERROR_WINDOW_S] + self.samples[-1:]
        self.samples = [*kept, _Sample(perf.sweeps, now, where, values)]


_HISTORY: weakref.WeakKeyDictionary[Any, _ErrorHistory] = weakref.WeakKeyDictionary()


def _history(request: web.Request, perf: CounterSource) -> _ErrorHistory:
    """The error history of ``perf``; from the first call on it is also sampled at every SM event (a light
    sweep every ``sm.sweep_interval``), so the rates are there the next time they are asked for."""
    h = _HISTORY.get(perf)
    if h is None:
        h = _HISTORY[perf] = _ErrorHistory()
        ref = weakref.ref(perf)

        def on_event(_ev: object) -> None:
            p = ref()
            if p is not None:
                h.take(p)

        request.app[MANAGER].events.subscribe(on_event)
    h.take(perf)
    return h


@admin.get(f"{API_PREFIX}/errors")
async def list_errors(request: web.Request) -> web.Response:
    q = query_params(request, ("node", "limit", "offset"))
    limit, offset = page_params(q)
    v = current_view(request)
    node = v.node(q["node"], "node") if "node" in q else None
    perf = request.app[PERFMGR]
    h = _history(request, perf) if perf is not None and perf.fabric is v.fabric and perf.sweeps else None
    if perf is None or h is None or not h.samples:
        why = ("no performance manager runs in this daemon" if perf is None
               else "the performance manager has not read the error counters of this sweep's fabric yet")
        return json_response({"counting": False, "note": why, "sweeps": 0, "last_sweep_time": None,
                              "interval_s": None, "total": 0, "offset": offset, "limit": limit, "items": []})
    cur = h.samples[-1]
    prev = h.samples[0] if len(h.samples) > 1 else None
    dt = cur.time - prev.time if prev is not None else 0.0
    rates = np.full(cur.values.shape, np.nan)
    if prev is not None and dt > 0:
        before = np.zeros(cur.values.shape, np.float64)
        if prev.where.size:
            pos = np.minimum(np.searchsorted(prev.where, cur.where), prev.where.size - 1)
            hit = prev.where[pos] == cur.where
            before[hit] = prev.values[pos[hit]]
        rates = np.maximum(cur.values.astype(np.float64) - before, 0.0) / dt
    moving = np.asarray((rates > 0).any(axis=1), dtype=bool)
    width = v.fabric.port_exists.shape[1]
    nodes, ports = cur.where // width, cur.where % width
    keep = np.ones(cur.where.size, bool) if node is None else nodes == node
    # moving ports first, then by their fastest rate, then by their largest total
    counted = cur.values.shape[1] > 0
    fastest = np.nan_to_num(rates.max(axis=1), nan=0.0) if counted else np.zeros(cur.where.size)
    biggest = cur.values.max(axis=1).astype(np.float64) if counted else np.zeros(cur.where.size)
    order = np.lexsort((nodes * width + ports, -biggest, -fastest, ~moving))
    order = order[keep[order]]
    keys = [k for k in ERROR_KEYS if k in perf.totals]
    items = []
    for j in order[offset : offset + limit].tolist():
        n, p = int(nodes[j]), int(ports[j])
        peer = v.peer_node[n][p]
        items.append({
            **v.end(n, p),
            "peer": v.end(peer, v.peer_port[n][p]) if peer != NO_PEER else None,
            "moving": bool(moving[j]),
            "counters": {k: int(x) for k, x in zip(keys, cur.values[j].tolist(), strict=True) if x},
            "rates": {k: (None if math.isnan(r) else round(r, 4))
                      for k, r, x in zip(keys, rates[j].tolist(), cur.values[j].tolist(), strict=True) if x},
        })
    return json_response({
        "counting": True,
        "note": None if prev is not None else "rates need two counter sweeps seen by the API; ask again after "
        "the next one",
        "sweeps": int(perf.sweeps),
        "last_sweep_time": float(perf.last_sweep_time) or None,
        "interval_s": round(dt, 3) if prev is not None else None,
        "total": int(keep.sum()),
        "offset": offset,
        "limit": limit,
        "items": items,
    })


# -- the busiest links ----------------------------------------------------------------------------------------


async def _prediction(request: web.Request, v: SnapshotView, spec: str | None) -> tuple[str | None, Any]:
    """The pattern and its prediction on this snapshot: the one asked for, else the daemon's configured one."""
    if spec is None:
        configured = request.app.get(PREDICTION)
        if configured is None:
            return None, None
        name, report = configured()
        if not name:
            return None, None
        return name, report if report is not None and report.fabric is v.fabric else None
    return spec, await predicted_report(v, spec)


def _num(x: float, digits: int) -> float | None:
    return None if math.isnan(x) else round(x, digits)


@admin.get(f"{API_PREFIX}/hot")
async def list_hot(request: web.Request) -> web.Response:
    q = query_params(request, ("top", "by", "pattern"))
    top = int_param(q, "top", 10, 1, 1000)
    by = choice_param(q, "by", ("measured", "predicted")) or "measured"
    spec = check_pattern_spec(q["pattern"], "pattern") if "pattern" in q else None
    v = current_view(request)
    f = v.fabric
    pattern, report = await _prediction(request, v, spec)
    n, p = np.nonzero(v.up)  # transmitting ports with a cable and LinkUp
    gbps = lanes_of(f.width_active[n, p]) * _GBPS_PER_LANE[f.speed_active[n, p]]
    perf = request.app[PERFMGR]
    measured_gbps = np.full(n.size, np.nan)
    wait = np.full(n.size, np.nan)
    if perf is not None and perf.fabric is f and "xmit_data_bytes" in perf.rates:
        measured_gbps = perf.rates["xmit_data_bytes"][n, p] * 8e-9
        if "xmit_wait" in perf.rates:
            wait = perf.rates["xmit_wait"][n, p]
    util = np.full(n.size, np.nan)
    np.divide(measured_gbps, gbps, out=util, where=gbps > 0)
    pred = report.utilization[n, p] if report is not None else np.full(n.size, np.nan)
    pred_wait = report.xmit_wait[n, p] if report is not None else np.full(n.size, np.nan)
    first, second = (util, pred) if by == "measured" else (pred, util)
    order = np.lexsort((np.nan_to_num(-second, nan=1.0), np.nan_to_num(-first, nan=1.0)))[:top]
    items = []
    for i in order.tolist():
        a, pa = int(n[i]), int(p[i])
        items.append({
            "src": v.end(a, pa),
            "dst": v.end(v.peer_node[a][pa], v.peer_port[a][pa]),
            "rate_gbps": round(float(gbps[i]), 3),
            "measured_gbps": _num(float(measured_gbps[i]), 3),
            "measured_utilization": _num(float(util[i]), 6),
            "measured_xmit_wait_per_s": _num(float(wait[i]), 1),
            "predicted_utilization": _num(float(pred[i]), 6),
            "predicted_xmit_wait_per_s": _num(float(pred_wait[i]), 1),
        })
    measured = perf is not None and perf.fabric is f and bool(np.isfinite(util).any())
    measured_at = float(perf.last_sweep_time) if perf is not None and measured else 0.0
    return json_response({
        "by": by,
        "measured": measured,
        "measured_at": measured_at or None,
        "pattern": pattern,
        "predicted": report is not None,
        "items": items,
    })
