"""Routes between endpoints and switches' LFTs (``/routes``, ``/switches/{id}/lft``)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from aiohttp import web

from exporters.http.common import ApiError, choice_param, json_response, query_params
from exporters.http.openapi import API_PREFIX
from exporters.http.state import current_view
from sm.analysis.dump import format_switch_lft
from sm.routing.base import NO_ROUTE
from sm.sa.path_record import path_sl

# -- routing -------------------------------------------------------------------------------------------------

routing = web.RouteTableDef()


@routing.get(f"{API_PREFIX}/routes")
async def get_route(request: web.Request) -> web.Response:
    q = query_params(request, ("src", "dst"))
    for name in ("src", "dst"):
        if name not in q:
            raise ApiError(400, "missing_parameter", f"{name} is required (node name, GUID or LID)", name)
    v = current_view(request)
    out = v.route(q["src"], q["dst"])
    src, dst = v.endpoint(q["src"], "src"), v.endpoint(q["dst"], "dst")
    add_sl_and_vls(v.snap, out, src, dst)
    return json_response(out)


def add_sl_and_vls(snap: Any, out: dict[str, Any], src: tuple[int, int], dst: tuple[int, int]) -> None:
    """The pair's SL (``sl``; also the ``path_record``'s) and each hop's VL (``vl``) in a route answer.

    The SL is the one the SA gives the pair (:func:`sm.sa.path_record.path_sl`: the routing layer,
    else the QoS level, else 0); a hop's VL is that SL through the SLtoVLMappingTable ibfm set on the
    hop's (input, output) ports, null where ibfm set none (QoS off: the port's own table decides)."""
    record = out.get("path_record")
    pkey = int(record["pkey"], 16) if record else 0xFFFF
    dlid = int(snap.lids.base[dst[0], dst[1]])
    sl = path_sl(snap, src, dst, pkey, dlid)
    out["sl"] = sl
    if record:
        record["sl"] = sl
    qos = getattr(snap, "qos", None)
    f = snap.fabric
    for h in out["hops"]:
        vl = None
        n = f.by_guid(int(h["guid"], 16))
        op, ip = h["out_port"], h["in_port"]
        if qos is not None and op and op != NO_ROUTE:
            t = qos.sl2vl_table(n, ip, op) if f.is_switch(n) else qos.sl2vl_table(n, 0, op)
            vl = int(t[sl]) if t is not None else None
        h["vl"] = vl


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


