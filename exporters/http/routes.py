"""Routes between endpoints and switches' LFTs (``/routes``, ``/switches/{id}/lft``)."""

from __future__ import annotations

import asyncio

import numpy as np
from aiohttp import web

from exporters.http.common import ApiError, choice_param, json_response, query_params
from exporters.http.openapi import API_PREFIX
from exporters.http.state import current_view
from sm.analysis.dump import format_switch_lft
from sm.routing.base import NO_ROUTE

# -- routing -------------------------------------------------------------------------------------------------

routing = web.RouteTableDef()


@routing.get(f"{API_PREFIX}/routes")
async def get_route(request: web.Request) -> web.Response:
    q = query_params(request, ("src", "dst"))
    for name in ("src", "dst"):
        if name not in q:
            raise ApiError(400, "missing_parameter", f"{name} is required (node name, GUID or LID)", name)
    v = current_view(request)
    return json_response(v.route(q["src"], q["dst"]))


@routing.get(f"{API_PREFIX}/switches/{{id}}/lft")
async def get_lft(request: web.Request) -> web.Response:
    q = query_params(request, ("format",))
    fmt = choice_param(q, "format", ("json", "ibroute")) or "json"
    v = current_view(request)
    n = v.node(request.match_info["id"], "id")
    if not v.is_sw[n]:
        raise ApiError(404, "not_a_switch", f"{v.names[n]} is a {v.kind[n]}, not a switch: it has no LFT", "id")
    row = v.row_of[n]
    if fmt == "ibroute":
        text = await asyncio.to_thread(format_switch_lft, v.fabric, v.lids, v.lft, row)
        return web.Response(text=text, content_type="text/plain")
    table = v.lft[row]
    lids = np.flatnonzero(table != NO_ROUTE)
    ports = table[lids]
    entries = [{"lid": a, "port": b} for a, b in zip(lids.tolist(), ports.tolist(), strict=True)]
    lid = int(v.lids.base[n, 0])
    return json_response({
        "switch": {"name": v.names[n], "guid": v.guid_hex[n], "lid": lid or None},
        "lid_top": int(lids[-1]) if lids.size else 0,
        "count": len(entries),
        "entries": entries,
    })


