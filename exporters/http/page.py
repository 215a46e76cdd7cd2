"""The fabric page: ``GET /`` draws the subnet by tier and refreshes itself from ``GET /api/v1/view/fabric``.

The page (``static/index.html`` and ``static/fabric.js``, package data) is plain HTML, SVG and one small
script: no build step, nothing loaded from elsewhere. Every few seconds it reads ``/api/v1/health`` (state,
role, master, last sweep, engine, problems) and ``/api/v1/view/fabric``, the compact drawing this module
answers:

- switches by tier: the rank above the leaves that :func:`fabric.shape.switch_ranks` gives (leaves,
  spines, cores; switches no up path joins to a leaf are "unranked"), each with its hosts counted;
- at most ``max_switches`` switches, shared among the tiers by their size; the ends of down cables are
  always among them; the rest are the first of each tier in name order (a fat-tree's first pods);
- the cables between two drawn switches merged per pair of switches, with their count, how many are down
  or not ACTIVE, and the utilization of the busiest direction: measured (PortXmitData rate over the link's
  data rate) when the PerfManager has read this snapshot's counters twice, else the congestion model's
  prediction for ``pattern`` on the current routes;
- down cables. A cable that went down is not in the snapshot (discovery does not see past a dark port), so
  they come from the events (a ``link_down`` with no ``link_up`` since), from the expected topology
  (``fabric.expected_topology``: its cables the fabric lacks), and from the snapshot (a cabled port that is
  not LinkUp).

What depends only on the snapshot (ranks, the choice of switches, the cables between them, the prediction)
is computed once per snapshot in a worker thread and kept while the snapshot is current; each request adds
the counters and the down cables, and the answer is gzipped when the client takes it.
"""

from __future__ import annotations

import asyncio
import math
import re
import weakref
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt
from aiohttp import web

from exporters.http.common import (
    CONFIG,
    MANAGER,
    PERFMGR,
    ApiError,
    CounterSource,
    int_param,
    json_response,
    query_params,
)
from exporters.http.congestion import check_pattern_spec, predicted_report
from exporters.http.health import _expected
from exporters.http.openapi import API_PREFIX
from exporters.http.state import RUNTIME, current_view
from exporters.http.view import SnapshotView, hex_guid
from fabric.model import Fabric, NodeType, PortState
from fabric.shape import detect_shape, switch_ranks
from sm.analysis.patterns import port_capacity
from sm.analysis.validate import compare_cabling
from sm.sweep.events import LinkDown, LinkUp, PortRef
from sm.sweep.manager import SubnetSnapshot

MAX_SWITCHES_DEFAULT = 320
"""Switches drawn unless ``max_switches`` says otherwise."""
MAX_SWITCHES = 5000
MAX_LINKS = 12_000
"""Most switch pairs drawn (the first in tier order; pairs with a down cable always)."""
MAX_DOWN_LISTED = 200
"""Most down cables listed (``down_total`` counts them all)."""
REFRESH_DEFAULT = 5
"""Seconds between the page's reads of the API."""

_PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
}

# -- the files -------------------------------------------------------------------------------------------------


@cache
def asset(name: str) -> bytes:
    """A file of ``exporters/http/static`` (package data), read once."""
    return (resources.files("exporters.http") / "static" / name).read_bytes()


page = web.RouteTableDef()


@page.get("/")
async def get_page(request: web.Request) -> web.Response:
    q = query_params(request, ("max_switches", "refresh"))
    int_param(q, "max_switches", MAX_SWITCHES_DEFAULT, 1, MAX_SWITCHES)  # the page passes them on to the API
    int_param(q, "refresh", REFRESH_DEFAULT, 1, 3600)
    return web.Response(body=asset("index.html"), content_type="text/html", charset="utf-8", headers=_PAGE_HEADERS)


@page.get("/ui/fabric.js")
async def get_script(request: web.Request) -> web.Response:
    query_params(request, ())
    return web.Response(body=asset("fabric.js"), content_type="text/javascript", charset="utf-8",
                        headers=_PAGE_HEADERS)


# -- per snapshot ----------------------------------------------------------------------------------------------

_DIGITS = re.compile(r"(\d+)")


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key putting ``leaf-2`` before ``leaf-10``."""
    return tuple(int(x) if x.isdigit() else x for x in _DIGITS.split(name))


def tier_name(rank: int, top: int) -> str:
    if rank < 0:
        return "unranked"
    if rank == 0:
        return "leaves"
    if rank == top and top >= 2:
        return "cores"
    if rank == 1:
        return "spines"
    return f"tier {rank}"


@dataclass
class Layout:
    """The drawing of one snapshot with a given set of switches that must be drawn."""

    nodes: list[int]
    """Drawn switches (node indices), tier by tier (leaves first), in name order."""
    index_of: dict[int, int]
    switches: list[dict[str, Any]]
    tiers: list[dict[str, Any]]
    # cables between drawn switches, and the pair of switches each belongs to
    cable_a: npt.NDArray[np.int64]
    cable_pa: npt.NDArray[np.int64]
    cable_b: npt.NDArray[np.int64]
    cable_pb: npt.NDArray[np.int64]
    cable_pair: npt.NDArray[np.int64]
    pair_a: list[int]
    pair_b: list[int]
    pair_cables: list[int]
    pair_down: list[int]
    pair_inactive: list[int]
    pair_index: dict[tuple[int, int], int]
    links_not_drawn: int
    shape: str


def build_layout(f: Fabric, must: frozenset[int], max_switches: int) -> Layout:
    """Ranks, the switches drawn and the cables between them (runs in a worker thread)."""
    ranks = switch_ranks(f)
    t = f.node_type
    is_sw = t == NodeType.SWITCH
    up = f.up_mask()
    la = f.link_array(up_only=False)
    cable_up = up[la[:, 0], la[:, 1]]
    hosts = np.zeros(f.n_nodes, np.int64)
    for s, o in ((0, 2), (2, 0)):
        m = cable_up & is_sw[la[:, s]] & (t[la[:, o]] == NodeType.CA)
        np.add.at(hosts, la[m, s], 1)
    dark = f.port_exists & (f.state == PortState.DOWN)
    dark[:, 0] = False
    ports_down = dark.sum(axis=1)

    sw = f.switches.tolist()
    top = int(ranks[sw].max()) if sw else 0
    by_rank: dict[int, list[int]] = {}
    for n in sw:
        by_rank.setdefault(int(ranks[n]), []).append(n)
    order = sorted(by_rank, key=lambda r: (r < 0, r))
    total = len(sw)
    nodes: list[int] = []
    tiers: list[dict[str, Any]] = []
    for r in order:
        members = sorted(by_rank[r], key=lambda n: _natural(f.names[n]))
        quota = len(members) if total <= max_switches else max(min(len(members), 4),
                                                                max_switches * len(members) // total)
        forced = [n for n in members if n in must]
        chosen = set(forced[:MAX_SWITCHES])
        for n in members:
            if len(chosen) >= max(quota, len(forced)):
                break
            chosen.add(n)
        drawn = [n for n in members if n in chosen]
        tiers.append({"rank": r, "name": tier_name(r, top), "switches": len(members), "drawn": len(drawn),
                      "hosts": int(hosts[members].sum()), "hosts_drawn": int(hosts[drawn].sum())})
        nodes.extend(drawn)
    index_of = {n: i for i, n in enumerate(nodes)}
    switches = []
    k = 0
    for tier_i, tier in enumerate(tiers):
        for n in nodes[k : k + tier["drawn"]]:
            switches.append({
                "name": f.names[n], "guid": hex_guid(int(f.node_guid[n])), "rank": int(ranks[n]), "tier": tier_i,
                "hosts": int(hosts[n]), "hosts_down": 0, "ports_down": int(ports_down[n]),
            })
        k += tier["drawn"]

    drawn_mask = np.zeros(f.n_nodes, np.bool_)
    drawn_mask[nodes] = True
    inter = is_sw[la[:, 0]] & is_sw[la[:, 2]]
    both = inter & drawn_mask[la[:, 0]] & drawn_mask[la[:, 2]]
    links_not_drawn = int(np.count_nonzero(inter & ~both))
    c = la[both]
    cup = cable_up[both]
    active = (f.state[c[:, 0], c[:, 1]] == PortState.ACTIVE) & (f.state[c[:, 2], c[:, 3]] == PortState.ACTIVE)
    pos = np.full(f.n_nodes, -1, np.int64)
    pos[nodes] = np.arange(len(nodes))
    ia, ib = pos[c[:, 0]], pos[c[:, 2]]
    lo, hi = np.minimum(ia, ib), np.maximum(ia, ib)
    keys, first, inverse = np.unique(lo * max(1, len(nodes)) + hi, return_index=True, return_inverse=True)
    n_pairs = int(keys.size)
    cables = np.bincount(inverse, minlength=n_pairs)
    downs = np.bincount(inverse, weights=~cup, minlength=n_pairs).astype(np.int64)
    inactive = np.bincount(inverse, weights=cup & ~active, minlength=n_pairs).astype(np.int64)
    pa, pb = lo[first].tolist(), hi[first].tolist()
    # Pairs in tier order of their lower end; past MAX_LINKS only those with a cable down or not ACTIVE.
    keep = np.arange(n_pairs) < MAX_LINKS
    keep |= (downs > 0) | (inactive > 0)
    links_not_drawn += int(cables[~keep].sum())
    kept = np.flatnonzero(keep)
    remap = np.full(n_pairs, -1, np.int64)
    remap[kept] = np.arange(kept.size)
    cable_pair = remap[inverse]
    on = cable_pair >= 0
    return Layout(
        nodes=nodes,
        index_of=index_of,
        switches=switches,
        tiers=tiers,
        cable_a=c[on, 0], cable_pa=c[on, 1], cable_b=c[on, 2], cable_pb=c[on, 3], cable_pair=cable_pair[on],
        pair_a=[pa[i] for i in kept.tolist()],
        pair_b=[pb[i] for i in kept.tolist()],
        pair_cables=cables[kept].tolist(),
        pair_down=downs[kept].tolist(),
        pair_inactive=inactive[kept].tolist(),
        pair_index={(pa[i], pb[i]): j for j, i in enumerate(kept.tolist())},
        links_not_drawn=links_not_drawn,
        shape=detect_shape(f).describe(),
    )


@dataclass
class _PerSnapshot:
    layouts: dict[tuple[frozenset[int], int], Layout] = field(default_factory=dict)
    capacity: npt.NDArray[np.float64] | None = None
    missing: tuple[object, list[tuple[dict[str, Any], dict[str, Any]]]] | None = None


_CACHE: dict[int, tuple[weakref.ref[SubnetSnapshot], _PerSnapshot]] = {}
"""What this module keeps per snapshot (by identity: a snapshot does not hash), for the last few snapshots.
Requests may fill an entry twice at once (no lock: a lock would tie the cache to one event loop); both
results are the same."""


def _per(snap: SubnetSnapshot) -> _PerSnapshot:
    hit = _CACHE.get(id(snap))
    if hit is not None and hit[0]() is snap:
        return hit[1]
    for k in [k for k, (r, _) in _CACHE.items() if r() is None]:
        del _CACHE[k]
    while len(_CACHE) >= 4:
        del _CACHE[next(iter(_CACHE))]
    p = _PerSnapshot()
    _CACHE[id(snap)] = (weakref.ref(snap), p)
    return p


# -- down cables -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DownCable:
    a: dict[str, Any]
    b: dict[str, Any] | None
    source: str
    since: float | None


def _guid(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        return -1


def _event_key(a: PortRef, b: PortRef | None) -> tuple[tuple[int, int], ...]:
    ends = [(_guid(a.guid), a.port)] + ([] if b is None else [(_guid(b.guid), b.port)])
    return tuple(sorted(ends))


def _ref_end(ref: PortRef) -> dict[str, Any]:
    return {"node": ref.name, "guid": ref.guid, "port": ref.port}


def _node_of(f: Fabric, end: dict[str, Any]) -> int:
    """The node of an end named ``{node, guid, port}``, by GUID, else by name; -1 when not in the fabric."""
    try:
        return f.by_guid(_guid(str(end["guid"])))
    except KeyError:
        pass
    try:
        return f.by_name(str(end["node"]))
    except KeyError:
        return -1


def _cable_up(f: Fabric, up: npt.NDArray[np.bool_], a: tuple[int, int], b: tuple[int, int] | None) -> bool:
    n, p = a
    if n < 0 or not 0 < p < up.shape[1] or not up[n, p]:
        return False
    if b is None:
        return True
    return bool(f.peer_node[n, p] == b[0] and f.peer_port[n, p] == b[1])


def down_cables(v: SnapshotView, history: list[Any], missing: list[tuple[dict[str, Any], dict[str, Any]]]
                ) -> list[DownCable]:
    """Every cable known to be down now: from the events, the expected topology and the snapshot."""
    f = v.fabric
    up = v.up
    out: list[DownCable] = []
    seen: set[frozenset[tuple[int, int]]] = set()

    def add(a: dict[str, Any], b: dict[str, Any] | None, source: str, since: float | None) -> None:
        na = (_node_of(f, a), int(a["port"]))
        nb = None if b is None else (_node_of(f, b), int(b["port"]))
        if _cable_up(f, up, na, nb) or (nb is not None and _cable_up(f, up, nb, na)):
            return  # up again (in a later snapshot than the event)
        key = frozenset([na] + ([] if nb is None else [nb]))
        if na[0] >= 0 and key in seen:
            return
        seen.add(key)
        out.append(DownCable(a, b, source, since))

    pending: dict[tuple[tuple[int, int], ...], LinkDown] = {}
    for ev in history:
        if isinstance(ev, LinkDown):
            pending[_event_key(ev.a, ev.b)] = ev
        elif isinstance(ev, LinkUp):
            pending.pop(_event_key(ev.a, ev.b), None)
    for ev in pending.values():
        add(_ref_end(ev.a), None if ev.b is None else _ref_end(ev.b), "event", ev.time)
    la = v.links()
    dark = la[~up[la[:, 0], la[:, 1]]]
    for a, pa, b, pb in dark.tolist():
        add(v.end(a, pa), v.end(b, pb), "snapshot", None)
    for a_end, b_end in missing:
        add(a_end, b_end, "expected", None)
    return out


def _missing_cables(rt: Any, path: Any, per: _PerSnapshot, f: Fabric
                    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Cables of the expected topology the fabric lacks (worker thread; kept per snapshot and file stamp)."""
    expected, _, stamp = _expected(rt, path)
    if expected is None:
        return []
    if per.missing is not None and per.missing[0] == stamp:
        return per.missing[1]
    rep = compare_cabling(f, expected)
    missing = [(a.as_dict(), b.as_dict()) for a, b in rep.missing]
    per.missing = (stamp, missing)
    return missing


# -- utilization -----------------------------------------------------------------------------------------------


def measured_utilization(perf: CounterSource | None, f: Fabric, capacity: npt.NDArray[np.float64]
                         ) -> npt.NDArray[np.float64] | None:
    """``[node, port]`` transmit utilization from the PerfManager's PortXmitData rates, or None when it has no
    rate for this snapshot's fabric."""
    if perf is None or perf.fabric is not f:
        return None
    rates = perf.rates.get("xmit_data_bytes")
    if rates is None or rates.shape != capacity.shape:
        return None
    out = np.full(capacity.shape, np.nan)
    np.divide(rates, capacity, out=out, where=capacity > 0)
    if not np.isfinite(out).any():
        return None
    return out


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 4)


# -- the endpoint ----------------------------------------------------------------------------------------------


@page.get(f"{API_PREFIX}/view/fabric")
async def get_fabric_view(request: web.Request) -> web.Response:
    q = query_params(request, ("max_switches", "pattern"))
    max_switches = int_param(q, "max_switches", MAX_SWITCHES_DEFAULT, 1, MAX_SWITCHES)
    spec = check_pattern_spec(q.get("pattern", "shift:1"), "pattern")
    v = current_view(request)
    s = v.snap
    f = v.fabric
    per = _per(s)
    mgr = request.app[MANAGER]
    path = request.app[CONFIG].expected_topology
    missing = await asyncio.to_thread(_missing_cables, request.app[RUNTIME], path, per, f) if path else []
    down = down_cables(v, list(mgr.events.history), missing)

    ends = [(_node_of(f, d.a), -1 if d.b is None else _node_of(f, d.b)) for d in down]
    must = frozenset(n for pair in ends for n in pair if n >= 0 and v.is_sw[n])
    key = (must, max_switches)
    lay = per.layouts.get(key)
    if lay is None:
        lay = await asyncio.to_thread(build_layout, f, must, max_switches)
        if len(per.layouts) >= 8:
            per.layouts.clear()
        per.layouts[key] = lay

    if per.capacity is None:
        per.capacity = port_capacity(f)
    perf = request.app[PERFMGR]
    util = measured_utilization(perf, f, per.capacity)
    if util is not None:
        assert perf is not None
        source: dict[str, Any] = {"source": "measured", "pattern": None, "perf_sweep": int(perf.sweeps),
                                  "time": float(perf.last_sweep_time) or None}
    else:
        try:
            util = (await predicted_report(v, spec)).utilization
        except ApiError as e:
            if e.status != 409:
                raise
            util = np.full(f.port_exists.shape, np.nan)  # a pattern this fabric cannot serve: no colours
        known = bool(np.isfinite(util).any())
        source = {"source": "predicted" if known else "none", "pattern": spec, "perf_sweep": None, "time": None}

    # per pair of drawn switches: the busiest direction of its busiest up cable
    n_pairs = len(lay.pair_a)
    pair_util = np.full(n_pairs, np.nan)
    if lay.cable_pair.size:
        u = np.fmax(util[lay.cable_a, lay.cable_pa], util[lay.cable_b, lay.cable_pb])
        np.fmax.at(pair_util, lay.cable_pair, u)
    pair_down = list(lay.pair_down)
    pair_cables = list(lay.pair_cables)
    pair_a, pair_b = list(lay.pair_a), list(lay.pair_b)
    switches = [dict(x) for x in lay.switches]
    extra_util: list[float] = []
    for (na, nb), d in zip(ends, down, strict=True):
        ia, ib = lay.index_of.get(na), lay.index_of.get(nb)
        if ia is not None and ib is not None and d.source != "snapshot":
            k = (min(ia, ib), max(ia, ib))
            j = lay.pair_index.get(k)
            if j is None:  # the pair has no cable left in the snapshot: a pair of its own
                j = len(pair_a)
                pair_a.append(k[0])
                pair_b.append(k[1])
                pair_cables.append(0)
                pair_down.append(0)
                extra_util.append(math.nan)
            pair_cables[j] += 1
            pair_down[j] += 1
        else:  # a host's cable (or a switch not drawn): counted on the drawn switch
            for n, m in ((na, nb), (nb, na)):
                i = lay.index_of.get(n)
                if i is not None and (m < 0 or not v.is_sw[m]):
                    switches[i]["hosts_down"] += 1
    all_util = np.concatenate([pair_util, np.asarray(extra_util, np.float64)])
    links = []
    for j in range(len(pair_a)):
        inactive = lay.pair_inactive[j] if j < n_pairs else 0
        cables, dn = pair_cables[j], pair_down[j]
        state = "down" if dn and dn >= cables else "degraded" if dn or inactive else "active"
        links.append({"a": pair_a[j], "b": pair_b[j], "cables": cables, "down": dn, "inactive": inactive,
                      "state": state, "utilization": _round(float(all_util[j]))})
    finite = all_util[np.isfinite(all_util)]
    source["max"] = _round(float(finite.max())) if finite.size else None
    counts = v.summary()
    body = {
        "sweep": s.sweep,
        "time": s.time,
        "layout": f"{s.sweep}:{len(lay.nodes)}:{len(pair_a)}:{hash(key) & 0xFFFFFFFF:08x}",
        "shape": lay.shape,
        "counts": {"switches": counts["switches"], "hosts": counts["cas"], "links_up": counts["links"],
                   "links_down": len(down)},
        "utilization": source,
        "tiers": lay.tiers,
        "switches": switches,
        "links": links,
        "links_not_drawn": lay.links_not_drawn,
        "down_total": len(down),
        "down_links": [
            {"a": d.a, "b": d.b, "source": d.source, "since": d.since} for d in down[:MAX_DOWN_LISTED]
        ],
    }
    resp = json_response(body)
    resp.enable_compression()
    return resp
