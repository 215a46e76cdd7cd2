"""The app's mutable state: the view of the current snapshot, built off the event loop, and the gate of heavy jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from exporters.http.common import MANAGER, ApiError
from exporters.http.view import SnapshotView, ViewCache, built_view
from fabric.model import (
    Fabric,
)
from sm.sweep.manager import SubnetSnapshot


@dataclass
class Runtime:
    """Mutable state of one app: views, the heavy-job gate, the parsed expected topology."""

    views: ViewCache = field(default_factory=ViewCache)
    heavy: asyncio.Semaphore | None = None
    expected: tuple[Path, object, Fabric] | None = None
    openapi: bytes = b""


RUNTIME = web.AppKey("runtime", Runtime)


def current_view(request: web.Request) -> SnapshotView:
    snap = request.app[MANAGER].snapshot
    if snap is None:
        raise ApiError(503, "no_snapshot", "the first sweep has not completed yet; retry shortly",
                       headers={"Retry-After": "1"})
    return request.app[RUNTIME].views.get(snap)


async def run_heavy(request: web.Request, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a worker thread, at most ``heavy_jobs`` at once (429 beyond)."""
    rt = request.app[RUNTIME]
    assert rt.heavy is not None
    if rt.heavy.locked():
        raise ApiError(429, "busy", "a what-if or validation is already running; retry shortly",
                       headers={"Retry-After": "2"})
    async with rt.heavy:
        return await asyncio.to_thread(fn)


async def prepare_view(app: web.Application, snap: SubnetSnapshot) -> None:
    """Build the lookup tables of a new snapshot in a worker thread, so no request pays for them."""
    view = await asyncio.to_thread(built_view, snap)
    if app[MANAGER].snapshot is snap:
        app[RUNTIME].views.put(view)


