"""Sweep requests and the event log (``POST /sweep``, ``/events``)."""

from __future__ import annotations

import logging

from aiohttp import web

from exporters.http.common import MANAGER, ApiError, int_param, json_body, json_response, query_params, require_write
from exporters.http.openapi import API_PREFIX

log = logging.getLogger(__name__)

# -- control -------------------------------------------------------------------------------------------------

control = web.RouteTableDef()


@control.post(f"{API_PREFIX}/sweep")
async def post_sweep(request: web.Request) -> web.Response:
    query_params(request, ())
    require_write(request)
    body = await json_body(request, optional=True)
    if not isinstance(body, dict):
        raise ApiError(400, "bad_body", "body must be a JSON object such as {\"heavy\": true}", "body")
    unknown = set(body) - {"heavy"}
    if unknown:
        raise ApiError(400, "bad_body", f"unknown field {sorted(unknown)[0]!r} (known: heavy)", sorted(unknown)[0])
    heavy = body.get("heavy", False)
    if not isinstance(heavy, bool):
        raise ApiError(400, "bad_body", "heavy must be true or false", "heavy")
    mgr = request.app[MANAGER]
    mgr.request_sweep("api", heavy=heavy)
    snap = mgr.snapshot
    log.info("sweep requested over the API (heavy=%s)", heavy)
    return json_response({"requested": True, "heavy": heavy, "sweep": None if snap is None else snap.sweep}, status=202)


@control.get(f"{API_PREFIX}/events")
async def list_events(request: web.Request) -> web.Response:
    q = query_params(request, ("type", "limit"))
    limit = int_param(q, "limit", 100, 1, 1000)
    kind = q.get("type")
    history = list(request.app[MANAGER].events.history)
    if kind is not None:
        history = [e for e in history if getattr(e, "type", None) == kind]
    items = [e.model_dump(mode="json") for e in history[-limit:]]
    return json_response({"total": len(history), "items": items})


