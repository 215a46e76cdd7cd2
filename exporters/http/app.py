"""The application: :func:`create_app` wires every resource's routes; the index and the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from exporters.http.admin import admin
from exporters.http.common import (
    CONFIG,
    MANAGER,
    PERFMGR,
    SERVER_LOG,
    ApiConfig,
    CounterSource,
    SubnetSource,
    error_middleware,
    json_response,
    query_params,
)
from exporters.http.congestion import analysis
from exporters.http.health import health, validation
from exporters.http.openapi import API_PREFIX, build_openapi
from exporters.http.page import page
from exporters.http.partitions import RELOADER, PartitionReloader, partitions
from exporters.http.routes import routing
from exporters.http.state import RUNTIME, Runtime
from exporters.http.sweep import control
from exporters.http.topology import topology

# -- meta ----------------------------------------------------------------------------------------------------

meta = web.RouteTableDef()


@meta.get(f"{API_PREFIX}/openapi.json")
async def get_openapi(request: web.Request) -> web.Response:
    query_params(request, ())
    return web.Response(body=request.app[RUNTIME].openapi, content_type="application/json")


@meta.get(API_PREFIX)
@meta.get(f"{API_PREFIX}/")
async def get_index(request: web.Request) -> web.Response:
    doc = json.loads(request.app[RUNTIME].openapi)
    return json_response({"api": API_PREFIX, "openapi": f"{API_PREFIX}/openapi.json", "paths": sorted(doc["paths"])})


# -- the app -------------------------------------------------------------------------------------------------

ROUTE_TABLES = (meta, health, topology, routing, partitions, validation, analysis, control, page, admin)


def create_app(
    manager: SubnetSource,
    config: ApiConfig | None = None,
    *,
    perfmgr: CounterSource | None = None,
    metrics: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
) -> web.Application:
    """The aiohttp application: every ``/api/v1`` route, and ``GET /metrics`` when ``metrics`` is a handler."""
    cfg = config or ApiConfig()
    app = web.Application(middlewares=[error_middleware], client_max_size=cfg.max_body_bytes,
                          handler_args={"logger": SERVER_LOG})
    app[MANAGER] = manager
    app[CONFIG] = cfg
    app[PERFMGR] = perfmgr
    rt = Runtime(heavy=asyncio.Semaphore(max(1, cfg.heavy_jobs)))
    rt.openapi = json.dumps(build_openapi(metrics=metrics is not None)).encode()
    app[RUNTIME] = rt
    app[RELOADER] = PartitionReloader(manager, cfg.partitions_file)
    for table in ROUTE_TABLES:
        app.add_routes(table)
    if metrics is not None:
        app.router.add_get("/metrics", metrics)
        # exporters.prometheus.MetricsHandler.handle: its handler renders outputs ahead of the scrapes
        prewarm = getattr(getattr(metrics, "__self__", None), "prewarm", None)
        if prewarm is not None:
            app.cleanup_ctx.append(prewarm)
    return app
