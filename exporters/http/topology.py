"""Nodes, ports and links (``/nodes``, ``/ports``, ``/links``)."""

from __future__ import annotations

import numpy as np
from aiohttp import web

from exporters.http.common import PERFMGR, choice_param, json_response, page_params, query_params
from exporters.http.openapi import API_PREFIX
from exporters.http.state import current_view
from exporters.http.view import PHYS_NAMES, STATE_CODE, STATE_NAMES

# -- topology ------------------------------------------------------------------------------------------------

topology = web.RouteTableDef()


@topology.get(f"{API_PREFIX}/nodes")
async def list_nodes(request: web.Request) -> web.Response:
    q = query_params(request, ("type", "name", "limit", "offset"))
    kind = choice_param(q, "type", ("switch", "ca", "router"))
    limit, offset = page_params(q)
    name = q.get("name")
    v = current_view(request)
    nodes = v.nodes()
    if kind is not None or name:
        needle = (name or "").lower()
        nodes = [
            x for x in nodes
            if (kind is None or x["type"] == kind)
            and (not needle or needle in x["name"].lower() or needle in x["description"].lower())
        ]
    page = nodes[offset : offset + limit]
    return json_response({"total": len(nodes), "offset": offset, "limit": limit, "items": page})


@topology.get(f"{API_PREFIX}/nodes/{{id}}")
async def get_node(request: web.Request) -> web.Response:
    query_params(request, ())
    v = current_view(request)
    n = v.node(request.match_info["id"], "id")
    f = v.fabric
    perf = request.app[PERFMGR]
    ports = [v.port(n, p, perf) for p in np.flatnonzero(f.port_exists[n]).tolist()]
    return json_response({**v.nodes()[n], "ports": ports})


@topology.get(f"{API_PREFIX}/ports")
async def list_ports(request: web.Request) -> web.Response:
    q = query_params(request, ("node", "state", "limit", "offset"))
    state = choice_param(q, "state", tuple(STATE_CODE))
    limit, offset = page_params(q)
    v = current_view(request)
    ports = v.ports()
    if "node" in q:
        n = v.node(q["node"], "node")
        ports = ports[ports[:, 0] == n]
    if state is not None:
        ports = ports[v.fabric.state[ports[:, 0], ports[:, 1]] == STATE_CODE[state]]
    perf = request.app[PERFMGR]
    page = ports[offset : offset + limit].tolist()
    items = [v.port(a, b, perf) for a, b in page]
    return json_response({"total": int(ports.shape[0]), "offset": offset, "limit": limit, "items": items})


@topology.get(f"{API_PREFIX}/links")
async def list_links(request: web.Request) -> web.Response:
    q = query_params(request, ("node", "state", "limit", "offset"))
    state = choice_param(q, "state", tuple(STATE_CODE))
    limit, offset = page_params(q)
    v = current_view(request)
    f = v.fabric
    la = v.links()
    if "node" in q:
        n = v.node(q["node"], "node")
        la = la[(la[:, 0] == n) | (la[:, 2] == n)]
    st = np.minimum(f.state[la[:, 0], la[:, 1]], f.state[la[:, 2], la[:, 3]])
    if state is not None:
        keep = st == STATE_CODE[state]
        la, st = la[keep], st[keep]
    items = []
    for (a, pa, b, pb), s in zip(la[offset : offset + limit].tolist(), st[offset : offset + limit].tolist(),
                                 strict=True):
        items.append({
            "a": v.end(a, pa),
            "b": v.end(b, pb),
            "state": STATE_NAMES.get(int(s), "nop"),
            "phys_state": PHYS_NAMES.get(int(f.phys_state[a, pa]), "nop"),
            **v.link_fields(a, pa),
        })
    return json_response({"total": int(la.shape[0]), "offset": offset, "limit": limit, "items": items})


