"""Predicted congestion of traffic patterns and what-if failures (``/congestion``, ``/whatif``)."""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from exporters.http.common import (
    CONGESTION_CACHE,
    CONGESTION_MODEL,
    MANAGER,
    MAX_FLOWS,
    ApiError,
    int_param,
    json_body,
    json_response,
    query_params,
)
from exporters.http.health import verify_json
from exporters.http.openapi import API_PREFIX, PATTERN_SPEC_PATTERN, WhatIfRequest
from exporters.http.state import current_view, run_heavy
from exporters.http.view import SnapshotView
from fabric.model import (
    NO_PEER,
    Fabric,
)
from sm.analysis.flowmodel import CongestionReport, predict_congestion
from sm.analysis.patterns import Pattern, PatternError, hosts, parse_pattern
from sm.analysis.verify import ShiftQuality
from sm.analysis.whatif import RouteQuality, WhatIfError, route_quality, what_if
from sm.routing.base import RoutingOptions

# -- analysis ------------------------------------------------------------------------------------------------

analysis = web.RouteTableDef()


def _congestion_json(c: CongestionReport, n_hosts: int, top: int = 10) -> dict[str, Any]:
    return {
        "pattern": c.pattern.name,
        "hosts": n_hosts,
        "flows": c.n_flows,
        "unrouted": c.unrouted,
        "flow_stats": {k: (round(x, 6) if isinstance(x, float) else x) for k, x in c.flow_stats().items()},
        "hottest": [h.as_dict() for h in c.hottest(top)],
        "rounds": c.rounds,
        "model": CONGESTION_MODEL,
    }


def check_pattern_spec(text: str, parameter: str) -> str:
    """A pattern spec's length (its meaning is checked against the fabric)."""
    if not text.strip():
        raise ApiError(400, "bad_parameter", f"{parameter}: empty traffic pattern", parameter)
    if len(text) > 200:
        raise ApiError(400, "bad_parameter", f"{parameter}: pattern longer than 200 characters", parameter)
    return text.strip()


_PATTERN_SPEC = re.compile(PATTERN_SPEC_PATTERN)


def _build_pattern(fabric: Fabric, lids: Any, spec: str, parameter: str) -> tuple[Pattern, int]:
    """The pattern on this fabric and its number of hosts.

    ApiError naming what is wrong: 409 for a spec of the documented form that this fabric cannot serve
    (a shift that is a multiple of the hosts, more incast senders than hosts, too many flows), 400 for any
    other spec that does not parse.
    """
    n = int(hosts(fabric, lids).shape[0])
    status, error = (409, "not_applicable") if _PATTERN_SPEC.fullmatch(spec) else (400, "bad_parameter")
    if spec.split("@")[0].strip().lower() == "all-to-all" and n * (n - 1) > MAX_FLOWS:
        raise ApiError(status, error, f"{parameter}: all-to-all on {n} hosts is {n * (n - 1):,} flows, "
                       f"above the API's limit of {MAX_FLOWS:,}", parameter)
    try:
        return parse_pattern(spec, fabric, lids), n
    except PatternError as e:
        raise ApiError(status, error, f"{parameter}: {e}", parameter) from None
    except OverflowError:  # a shift beyond int64 (the documented form stops at 18 digits)
        raise ApiError(400, "bad_parameter", f"{parameter}: a number in {spec!r} is too large", parameter) from None


PREDICTIONS_KEPT = 4
"""Congestion reports kept per snapshot view by :func:`predicted_report` (the oldest asked goes first)."""


async def predicted_report(v: SnapshotView, spec: str) -> CongestionReport:
    """The congestion model's report for pattern ``spec`` (checked) on this snapshot's routes, computed
    once per view in a worker thread; ApiError as :func:`_build_pattern` raises it."""
    cache: OrderedDict[str, CongestionReport] = v.predicted
    hit = cache.get(spec)
    if hit is None:

        def run() -> CongestionReport:
            pat, _ = _build_pattern(v.fabric, v.lids, spec, "pattern")
            return predict_congestion(v.fabric, v.lids, v.lft, pat)

        hit = await asyncio.to_thread(run)
        cache[spec] = hit
        while len(cache) > PREDICTIONS_KEPT:
            cache.popitem(last=False)
    cache.move_to_end(spec)
    return hit


@analysis.get(f"{API_PREFIX}/congestion")
async def get_congestion(request: web.Request) -> web.Response:
    q = query_params(request, ("pattern", "top"))
    spec = check_pattern_spec(q.get("pattern", "shift:1"), "pattern")
    top = int_param(q, "top", 10, 0, 1000)
    v = current_view(request)
    key = (spec, top)
    hit = v.congestion.get(key)
    if hit is None:

        def run() -> dict[str, Any]:
            pat, n = _build_pattern(v.fabric, v.lids, spec, "pattern")
            return _congestion_json(predict_congestion(v.fabric, v.lids, v.lft, pat), n, top)

        hit = await asyncio.to_thread(run)
        v.congestion[key] = hit
        while len(v.congestion) > CONGESTION_CACHE:
            v.congestion.popitem(last=False)
    else:
        v.congestion.move_to_end(key)
    return json_response(hit)


def _quality_json(q: RouteQuality) -> dict[str, Any]:
    sq: ShiftQuality = q.shifts
    return {
        "engine": q.engine,
        "refused": [{"engine": e, "reason": r} for e, r in q.refused],
        "verify": verify_json(q.verify),
        "credit_loops": list(q.credit_loops),
        "shift_quality": {
            "hosts": sq.hosts,
            "shifts": sq.shifts,
            "total_shifts": sq.total_shifts,
            "sampled": sq.sampled,
            "max_load": sq.max_load,
            "mean_load": round(sq.mean_load, 4),
            "mean_max_load": round(sq.mean_max_load, 4),
            "unrouted": sq.unrouted,
        },
        "congestion": None if q.congestion is None else _congestion_json(q.congestion, q.pattern_hosts),
        "pattern_error": q.pattern_error,
    }


def _loc(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a body path: ``links[1].port``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in ("str", "LinkSpec"):
            out += f".{part}" if out else str(part)
    return out or "body"


def _link_spec(v: SnapshotView, item: Any, where: str) -> tuple[int, int]:
    if isinstance(item, str):
        t = item.strip()
        if not (t.endswith("]") and "[" in t):
            raise ApiError(400, "bad_body", f"{where}: {item!r} is not NODE[PORT]", where)
        node_text, _, port_text = t[:-1].rpartition("[")
        if not (port_text.isdigit() and port_text.isascii() and len(port_text) <= 6):
            raise ApiError(400, "bad_body", f"{where}: port {port_text!r} is not a number", where)
        node_id, port = node_text, int(port_text)
    else:
        node_id, port = item.node, item.port
    n = v.node(node_id, where)
    if not 1 <= port <= v.nports[n]:
        raise ApiError(404, "not_found", f"{where}: {v.names[n]} has no port {port} (1..{v.nports[n]})", where)
    return n, port


@analysis.post(f"{API_PREFIX}/whatif")
async def post_whatif(request: web.Request) -> web.Response:
    query_params(request, ())
    v = current_view(request)
    body = await json_body(request)
    try:
        req = WhatIfRequest.model_validate(body)
    except ValidationError as e:
        errs = e.errors()
        # a union (NODE[PORT] or {node, port}) fails once per member: report the object form when given one
        err = next((x for x in errs if "LinkSpec" in x["loc"]), errs[0])
        loc = _loc(err["loc"])
        raise ApiError(400, "bad_body", f"{loc}: {err['msg']}", loc) from None
    if not req.links and not req.switches:
        raise ApiError(400, "bad_body", "name at least one cable (links) or switch (switches) to fail", "links")
    pat = check_pattern_spec(req.pattern, "pattern")
    _build_pattern(v.fabric, v.lids, pat, "pattern")  # a bad spec is the caller's error, not a result
    # a cable or switch named twice (by either end, by name, GUID or LID) is failed once
    links: list[tuple[int, int]] = []
    ends: set[tuple[int, int]] = set()
    for i, item in enumerate(req.links):
        n, p = _link_spec(v, item, f"links[{i}]")
        if v.peer_node[n][p] == NO_PEER:
            raise ApiError(404, "not_found", f"links[{i}]: {v.fabric.port_name(n, p)} has no cable", f"links[{i}]")
        if (n, p) not in ends:
            links.append((n, p))
            ends.update(((n, p), (v.peer_node[n][p], v.peer_port[n][p])))
    switches: list[int] = []
    for i, text in enumerate(req.switches):
        n = v.node(text, f"switches[{i}]")
        if not v.is_sw[n]:
            raise ApiError(404, "not_a_switch", f"switches[{i}]: {v.names[n]} is a {v.kind[n]}, not a switch",
                           f"switches[{i}]")
        if n not in switches:
            switches.append(n)
    cfg = request.app[MANAGER].config
    chain = tuple(cfg.engines)
    options = RoutingOptions(root_guids=tuple(cfg.root_guids))
    s = v.snap

    def run() -> dict[str, Any]:
        bkey = (pat, req.max_shifts)
        before = v.baseline.get(bkey)
        if before is None:
            q = route_quality(s.fabric, s.lids, s.lft, s.engine, s.refused, pattern=pat, max_shifts=req.max_shifts,
                              verify=s.verify)
            before = _quality_json(q)
            v.baseline[bkey] = before
        try:
            rep = what_if(s.fabric, s.lids, s.lft, chain, options, links=links, switches=switches, pattern=pat,
                          max_shifts=req.max_shifts)
        except WhatIfError as e:
            raise ApiError(400, "bad_body", str(e), "links") from None
        return {
            "failed_links": rep.failed_links,
            "failed_switches": rep.failed_switches,
            "routed": rep.routed,
            "reason": rep.reason,
            "hosts_cut_off": rep.hosts_cut_off,
            "lft_blocks_changed": rep.lft_blocks_changed,
            "switches_changed": rep.switches_changed,
            "before": before,
            "after": None if rep.quality is None else _quality_json(rep.quality),
        }

    return json_response(await run_heavy(request, run))


