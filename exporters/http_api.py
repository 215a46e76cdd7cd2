"""The HTTP API (aiohttp): topology, routes, LFTs, health, validation, congestion, what-if, sweeps.

:func:`create_app` builds the application around a source of subnet
snapshots (the :class:`~sm.sweep.manager.FabricManager`). Everything lives under
``/api/v1``; ``/api/v1/openapi.json`` describes every endpoint
(:mod:`exporters.openapi`), and ``/metrics`` is mounted when a Prometheus
renderer is given.

Handlers read the current snapshot and never wait on a sweep: before the
first heavy sweep they answer 503. Per-snapshot lookup tables (endpoint
resolution, node and port lists, switch rows) are built once per snapshot
in a :class:`SnapshotView` and dropped when the next snapshot arrives; the
answers of expensive questions (validation, congestion, a what-if's
baseline) are kept there too. Heavy work runs in a worker thread on the
immutable snapshot.

Reads are open. Writes (``POST /api/v1/sweep``) need ``Authorization:
Bearer <token>``; without a configured token they are refused. Every error
is JSON ``{"error", "detail", "parameter"}``; unexpected exceptions become
a 500 of the same shape (and are logged), but no input is meant to reach it.
A request aiohttp cannot parse (a line over 8,190 bytes, bytes that are not
HTTP) never reaches a handler: aiohttp answers it with its own plain-text
400, and :data:`SERVER_LOG` makes that one log line instead of a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import re
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from aiohttp import web
from aiohttp.http import HttpProcessingError
from pydantic import ValidationError

from exporters.openapi import API_PREFIX, OFFSET_MAX, PATTERN_SPEC_PATTERN, WhatIfRequest, build_openapi
from fabric.errors import IbfmError
from fabric.formats.netfile import parse_net, read_net
from fabric.model import (
    MTU_BYTES,
    NO_PEER,
    SPEED_SIGNAL_GBPS,
    WIDTH_LANES,
    WIDTH_NAMES,
    Fabric,
    NodeType,
    PhysState,
    PortState,
    Speed,
    link_gbps,
)
from fabric.shape import detect_shape
from sm.analysis.dump import format_switch_lft
from sm.analysis.flowmodel import CongestionReport, predict_congestion
from sm.analysis.patterns import Pattern, PatternError, hosts, parse_pattern
from sm.analysis.query import EndpointError, resolve_endpoint
from sm.analysis.validate import (
    compare_cabling,
    duplicate_descriptions,
    duplicate_guids,
    slow_links,
    stuck_ports,
)
from sm.analysis.verify import ShiftQuality, TraceError, VerifyReport, trace_route
from sm.analysis.whatif import RouteQuality, WhatIfError, route_quality, what_if
from sm.routing.base import NO_ROUTE, RoutingOptions
from sm.sweep.events import EventBus, SweepDone, SweepFailed
from sm.sweep.manager import SmConfig, SubnetSnapshot

log = logging.getLogger(__name__)

MAX_ITEMS = 1000
"""Most problems listed per validation check (counts stay complete)."""
CONGESTION_CACHE = 64
"""Congestion predictions kept per snapshot (by pattern)."""
CONGESTION_MODEL = "max-min fair flow rates under credit back-pressure (sm/analysis/flowmodel.py)"
MAX_FLOWS = 1_000_000
"""Most flows a pattern may have over the API (all-to-all grows as hosts squared)."""


# -- what the API reads ----------------------------------------------------------------------------------


class SubnetSource(Protocol):
    """What the API needs of the SM (:class:`~sm.sweep.manager.FabricManager` has it)."""

    snapshot: SubnetSnapshot | None
    config: SmConfig
    events: EventBus

    def request_sweep(self, reason: str, *, heavy: bool = False) -> None: ...


class CounterSource(Protocol):
    """What the API reads of :class:`~sm.perf.perfmgr.PerfManager`."""

    fabric: Fabric | None
    totals: dict[str, npt.NDArray[np.uint64]]
    rates: dict[str, npt.NDArray[np.float64]]
    sweeps: int
    last_sweep_time: float
    last_report: Any


@dataclass
class ApiConfig:
    """Settings of the API itself."""

    token: str | None = None
    """Bearer token for writes; None refuses every write."""
    expected_topology: Path | None = None
    """Net file the cabling check compares against by default."""
    max_body_bytes: int = 64 << 20
    heavy_jobs: int = 1
    """What-ifs and posted validations running at once; more are answered 429."""


class ApiError(IbfmError):
    """An answer other than 2xx, as JSON ``{error, detail, parameter}``."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: str,
        parameter: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.parameter = parameter
        self.headers = dict(headers or {})


def error_response(
    status: int, error: str, detail: str, parameter: str | None = None, headers: Mapping[str, str] | None = None
) -> web.Response:
    body = {"error": error, "detail": detail, "parameter": parameter}
    return web.json_response(body, status=status, headers=headers)


# -- per-snapshot tables --------------------------------------------------------------------------------

_KIND = {int(NodeType.SWITCH): "switch", int(NodeType.CA): "ca", int(NodeType.ROUTER): "router"}
_STATE = {int(s): s.name.lower() for s in PortState}
_PHYS = {int(s): s.name.lower() for s in PhysState}
_STATE_CODE = {"down": int(PortState.DOWN), "init": int(PortState.INIT), "armed": int(PortState.ARMED),
               "active": int(PortState.ACTIVE)}
_SPEED_NAME = {int(s): s.name for s in Speed}

# PathRecord Rate codes (IBA 15.2.5.16, Table 205) by signalling rate in Gb/s.
_RATE_CODE = {2.5: 2, 10.0: 3, 30.0: 4, 5.0: 5, 20.0: 6, 40.0: 7, 60.0: 8, 80.0: 9, 120.0: 10, 14.0: 11, 56.0: 12,
              112.0: 13, 168.0: 14, 25.0: 15, 100.0: 16, 200.0: 17, 300.0: 18, 28.0: 19, 50.0: 20, 400.0: 21,
              600.0: 22, 800.0: 23, 1200.0: 24}
_NOMINAL_GBPS = {Speed.SDR: 2.5, Speed.DDR: 5.0, Speed.QDR: 10.0, Speed.FDR10: 10.0, Speed.FDR: 14.0,
                 Speed.EDR: 25.0, Speed.HDR: 50.0, Speed.NDR: 100.0, Speed.XDR: 200.0}
assert set(_NOMINAL_GBPS) == set(SPEED_SIGNAL_GBPS)


def _hex(g: int) -> str:
    return f"0x{g:016x}"


class SnapshotView:
    """Lookup tables of one snapshot, built on first use and kept while the snapshot is current."""

    def __init__(self, snap: SubnetSnapshot) -> None:
        self.snap = snap
        f = snap.fabric
        self.fabric = f
        self.lids = snap.lids
        self.lft = snap.lft
        self.n = f.n_nodes
        self.names = f.names
        self.guid_hex = [_hex(int(g)) for g in f.node_guid.tolist()]
        self.kind = [_KIND.get(int(t), "router") for t in f.node_type.tolist()]
        self.is_sw = [t == "switch" for t in self.kind]
        row_of = np.full(self.n, -1, np.int64)
        row_of[f.switches] = np.arange(f.switches.size)
        self.row_of: list[int] = row_of.tolist()
        self.up = f.up_mask()
        self.up_list: list[list[bool]] = self.up.tolist()
        self.peer_node: list[list[int]] = f.peer_node.tolist()
        self.peer_port: list[list[int]] = f.peer_port.tolist()
        self.nports: list[int] = f.nports.tolist()
        self.max_lid = snap.lids.max_lid
        self.owner_node: list[int] = snap.lids.owner_node.tolist()
        self.owner_port: list[int] = snap.lids.owner_port.tolist()
        self.subnet_prefix = 0xFE80000000000000
        self._endpoints: dict[str, tuple[int, int]] = {}
        self._nodes: list[dict[str, Any]] | None = None
        self._ports: npt.NDArray[np.int64] | None = None
        self._links: npt.NDArray[np.int64] | None = None
        self._summary: dict[str, int] | None = None
        self._lids_assigned: int | None = None
        self.lock = asyncio.Lock()
        self.validation: dict[str, Any] | None = None
        self.validation_key: object = None
        self.congestion: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self.baseline: dict[tuple[str, int], dict[str, Any]] = {}

    # -- endpoints and nodes

    def endpoint(self, text: str, parameter: str) -> tuple[int, int]:
        """(node, port) of an end port named by name, GUID or LID; ApiError 400/404."""
        hit = self._endpoints.get(text)
        if hit is not None:
            return hit
        t = text.strip()
        if not t:
            raise ApiError(400, "bad_parameter", f"{parameter}: empty endpoint", parameter)
        if len(t) > 256:
            raise ApiError(400, "bad_parameter", f"{parameter}: endpoint longer than 256 characters", parameter)
        if t.isdigit() and not t.isascii():
            raise ApiError(404, "not_found", f"{parameter}: no node named {t!r}", parameter)
        try:
            hit = resolve_endpoint(self.fabric, self.lids, t)
        except EndpointError as e:
            status = 400 if str(e).startswith("bad GUID") else 404  # not "no node named 'bad GUID'"
            raise ApiError(status, "bad_parameter" if status == 400 else "not_found", f"{parameter}: {e}",
                           parameter) from None
        if len(self._endpoints) < 4 * self.n + 1024:
            self._endpoints[text] = hit
        return hit

    def node(self, text: str, parameter: str) -> int:
        """Node index by name, NodeDescription, node or port GUID, or LID; ApiError 400/404."""
        t = text.strip()
        if not t:
            raise ApiError(400, "bad_parameter", f"{parameter}: empty node id", parameter)
        if len(t) > 256:
            raise ApiError(400, "bad_parameter", f"{parameter}: node id longer than 256 characters", parameter)
        f = self.fabric
        if t.isdigit() and t.isascii():
            lid = int(t)
            if 0 < lid <= self.max_lid and self.owner_node[lid] >= 0:
                return self.owner_node[lid]
            raise ApiError(404, "not_found", f"{parameter}: LID {lid} is not assigned", parameter)
        if t[:2].lower() == "0x":
            try:
                g = int(t, 16)
            except ValueError:
                raise ApiError(400, "bad_parameter", f"{parameter}: bad GUID {t!r}", parameter) from None
            with contextlib.suppress(KeyError):
                return f.by_guid(g)
            with contextlib.suppress(KeyError):
                return f.by_port_guid(g)[0]
            raise ApiError(404, "not_found", f"{parameter}: no node or port with GUID {t}", parameter)
        try:
            return f.by_name(t)
        except KeyError:
            raise ApiError(404, "not_found", f"{parameter}: no node named {t!r}", parameter) from None

    def nodes(self) -> list[dict[str, Any]]:
        if self._nodes is None:
            f = self.fabric
            base = self.lids.base
            lid_of = np.where(
                f.node_type == NodeType.SWITCH,
                base[:, 0],
                np.where(base[:, 1:] > 0, base[:, 1:], np.iinfo(np.uint16).max).min(axis=1)
                if base.shape[1] > 1
                else 0,
            ).astype(np.int64)
            lid_of[lid_of == np.iinfo(np.uint16).max] = 0
            sysimg = f.sysimg_guid.tolist()
            vendor = f.vendor_id.tolist()
            device = f.device_id.tolist()
            lids = lid_of.tolist()
            self._nodes = [
                {
                    "name": self.names[i],
                    "description": f.descs[i],
                    "guid": self.guid_hex[i],
                    "type": self.kind[i],
                    "nports": self.nports[i],
                    "lid": lids[i] or None,
                    "system_image_guid": _hex(int(sysimg[i])),
                    "vendor_id": int(vendor[i]),
                    "device_id": int(device[i]),
                }
                for i in range(self.n)
            ]
        return self._nodes

    def summary(self) -> dict[str, int]:
        if self._summary is None:
            self._summary = self.fabric.summary()
        return self._summary

    def lids_assigned(self) -> int:
        if self._lids_assigned is None:
            self._lids_assigned = int(self.lids.used().size)
        return self._lids_assigned

    def ports(self) -> npt.NDArray[np.int64]:
        """Every existing port, (K, 2), node then port order."""
        if self._ports is None:
            self._ports = np.argwhere(self.fabric.port_exists).astype(np.int64)
        return self._ports

    def links(self) -> npt.NDArray[np.int64]:
        if self._links is None:
            self._links = self.fabric.link_array(up_only=False)
        return self._links

    # -- JSON pieces

    def end(self, n: int, p: int) -> dict[str, Any]:
        return {"node": self.names[n], "guid": self.guid_hex[n], "port": p}

    def link_fields(self, n: int, p: int) -> dict[str, Any]:
        f = self.fabric
        w, s = int(f.width_active[n, p]), int(f.speed_active[n, p])
        mtu = int(f.mtu_active[n, p])
        up = w and s
        return {
            "width": WIDTH_NAMES.get(w) if up else None,
            "speed": _SPEED_NAME.get(s) if up else None,
            "rate_gbps": round(link_gbps(w, s), 3) if up else 0.0,
            "mtu": MTU_BYTES.get(mtu) if mtu else None,
        }

    def port(self, n: int, p: int, perf: CounterSource | None) -> dict[str, Any]:
        f = self.fabric
        m = self.peer_node[n][p]
        d = {
            "node": self.names[n],
            "guid": self.guid_hex[n],
            "port": p,
            "port_guid": _hex(int(f.port_guid[n, p])),
            "state": _STATE.get(int(f.state[n, p]), "nop"),
            "phys_state": _PHYS.get(int(f.phys_state[n, p]), "nop"),
            **self.link_fields(n, p),
            "lid": int(self.lids.base[n, p]) or None,
            "lmc": self.lids.lmc if self.lids.base[n, p] else 0,
            "peer": self.end(m, self.peer_port[n][p]) if m != NO_PEER else None,
            "counters": None,
            "rates": None,
        }
        if perf is not None and perf.fabric is f:
            d["counters"] = {k: int(v[n, p]) for k, v in perf.totals.items()}
            d["rates"] = {k: (None if math.isnan(x := float(v[n, p])) else round(x, 3)) for k, v in perf.rates.items()}
        return d

    # -- routes

    def route(self, src: str, dst: str) -> dict[str, Any]:
        """The route from ``src`` to ``dst`` as the API returns it (see ``RouteInfo``)."""
        sn, sp = self.endpoint(src, "src")
        dn, dp = self.endpoint(dst, "dst")
        f = self.fabric
        base = self.lids.base
        dlid = int(base[dn, dp])
        slid = int(base[sn, sp])
        failure: str | None = None
        try:
            hops: list[tuple[int, int, int]] = list(trace_route(f, self.lids, self.lft, sn, sp, dlid))
        except TraceError as e:  # a broken route: show how far it got and why
            hops, failure = list(e.hops), str(e)
        out_hops = []
        mtus: list[int] = []
        rates: list[float] = []
        signal: list[float] = []
        for n, ip, op in hops:
            h: dict[str, Any] = {"node": self.names[n], "guid": self.guid_hex[n], "type": self.kind[n],
                                 "in_port": ip, "out_port": op}
            if op and op != NO_ROUTE and op <= self.nports[n] and self.up_list[n][op]:
                lf = self.link_fields(n, op)
                h.update(lf)
                mc = int(f.mtu_active[n, op] or f.mtu_cap[n, op])
                mtus.append(mc)
                rates.append(lf["rate_gbps"])
                w, s = int(f.width_active[n, op]), int(f.speed_active[n, op])
                signal.append(WIDTH_LANES.get(w, 0) * _NOMINAL_GBPS.get(Speed(s), 0.0) if s else 0.0)
            else:
                h.update({"width": None, "speed": None, "rate_gbps": None, "mtu": None})
            out_hops.append(h)
        delivered = failure is None
        path_mtu = MTU_BYTES.get(min(mtus), 0) if delivered and mtus else 0
        rate = min(rates) if delivered and rates else 0.0
        record = None
        if delivered and mtus:
            sig = min(signal)
            record = {
                "sgid": _gid(self.subnet_prefix, int(f.port_guid[sn, sp])),
                "dgid": _gid(self.subnet_prefix, int(f.port_guid[dn, dp])),
                "slid": slid,
                "dlid": dlid,
                "pkey": "0xffff",
                "sl": 0,
                "mtu": min(mtus),
                "mtu_bytes": path_mtu,
                "rate": _RATE_CODE.get(sig),
                "rate_gbps": sig,
                "hop_count": len(mtus),
            }
        return {
            "src": self._endpoint_json(sn, sp),
            "dst": self._endpoint_json(dn, dp),
            "delivered": delivered,
            "failure": failure,
            "hops": out_hops,
            "path_mtu": path_mtu,
            "rate_gbps": rate,
            "path_record": record,
        }

    def _endpoint_json(self, n: int, p: int) -> dict[str, Any]:
        return {
            "endpoint": f"{self.names[n]}[{p}]",
            "node": self.names[n],
            "guid": _hex(int(self.fabric.port_guid[n, p])),
            "port": p,
            "lid": int(self.lids.base[n, p]),
        }


def _gid(prefix: int, guid: int) -> str:
    raw = f"{prefix:016x}{guid:016x}"
    return ":".join(raw[i : i + 4] for i in range(0, 32, 4))


class ViewCache:
    """The view of the current snapshot (replaced when the manager publishes a new one)."""

    def __init__(self) -> None:
        self._view: SnapshotView | None = None

    def get(self, snap: SubnetSnapshot) -> SnapshotView:
        v = self._view
        if v is None or v.snap is not snap:
            v = SnapshotView(snap)
            self._view = v
        return v

    def put(self, view: SnapshotView) -> None:
        self._view = view


async def prepare_view(app: web.Application, snap: SubnetSnapshot) -> None:
    """Build the lookup tables of a new snapshot in a worker thread, so no request pays for them."""
    view = await asyncio.to_thread(_built_view, snap)
    if app[MANAGER].snapshot is snap:
        app[RUNTIME].views.put(view)


def _built_view(snap: SubnetSnapshot) -> SnapshotView:
    v = SnapshotView(snap)
    v.nodes()
    v.ports()
    v.links()
    v.summary()
    v.lids_assigned()
    return v


@dataclass
class Runtime:
    """Mutable state of one app: views, the heavy-job gate, the parsed expected topology."""

    views: ViewCache = field(default_factory=ViewCache)
    heavy: asyncio.Semaphore | None = None
    expected: tuple[Path, object, Fabric] | None = None
    openapi: bytes = b""


MANAGER = web.AppKey("manager", SubnetSource)
CONFIG = web.AppKey("api_config", ApiConfig)
PERFMGR: web.AppKey[CounterSource | None] = web.AppKey("perfmgr")
"""The PerfManager, or None."""
RUNTIME = web.AppKey("runtime", Runtime)


# -- request helpers -----------------------------------------------------------------------------------------


def _view(request: web.Request) -> SnapshotView:
    snap = request.app[MANAGER].snapshot
    if snap is None:
        raise ApiError(503, "no_snapshot", "the first sweep has not completed yet; retry shortly",
                       headers={"Retry-After": "1"})
    return request.app[RUNTIME].views.get(snap)


def _query(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query parameters, each at most once, none unknown."""
    out: dict[str, str] = {}
    for k, v in request.query.items():
        if k not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            raise ApiError(400, "unknown_parameter", f"unknown query parameter {k!r} (known: {known})", k)
        if k in out:
            raise ApiError(400, "bad_parameter", f"query parameter {k!r} given more than once", k)
        out[k] = v
    return out


_INT = re.compile(r"(-?)0*([0-9]+)")


def _int(q: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter of any length (ASCII digits, optional minus) within ``lo..hi``."""
    text = q.get(name)
    if text is None:
        return default
    t = text.strip()
    m = _INT.fullmatch(t)
    if m is None:
        raise ApiError(400, "bad_parameter", f"{name}: {text!r} is not an integer", name)
    sign, digits = m.groups()
    shown = t if len(t) <= 24 else f"{t[:12]}...({len(digits)} digits)"
    # beyond 20 digits the value is out of any range here; int() of thousands of digits would refuse anyway
    v = int(sign + digits) if len(digits) <= 20 else (-1 if sign else 1) * (abs(lo) + abs(hi) + 1)
    if v > hi:
        raise ApiError(400, "bad_parameter", f"{name}: {shown} is too large (must be <= {hi})", name)
    if v < lo:
        raise ApiError(400, "bad_parameter", f"{name}: {shown} is too small (must be >= {lo})", name)
    return v


def _choice(q: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    text = q.get(name)
    if text is None:
        return None
    t = text.strip().lower()
    if t not in choices:
        raise ApiError(400, "bad_parameter", f"{name}: {text!r} is not one of {', '.join(choices)}", name)
    return t


def _page(q: Mapping[str, str]) -> tuple[int, int]:
    return _int(q, "limit", 100, 1, 1000), _int(q, "offset", 0, 0, OFFSET_MAX)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, separators=(",", ":")), status=status, content_type="application/json")


async def _read_body(request: web.Request, kinds: tuple[str, ...]) -> bytes:
    if request.content_type not in kinds:
        raise ApiError(415, "unsupported_media_type",
                       f"body of type {request.content_type!r} not accepted (use {' or '.join(kinds)})",
                       "body")
    limit = request.app[CONFIG].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "body_too_large", f"body of {request.content_length} bytes above {limit}", "body")
    data = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        data += chunk
        if len(data) > limit:
            raise ApiError(413, "body_too_large", f"body above {limit} bytes", "body")
    return bytes(data)


async def _json_body(request: web.Request, *, optional: bool = False) -> Any:
    if optional and not request.can_read_body:
        return {}
    raw = await _read_body(request, ("application/json",))
    if optional and not raw:  # no body; a blank one is not JSON
        return {}
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, "bad_body", f"body is not valid JSON: {e}", "body") from None
    except RecursionError:
        raise ApiError(400, "bad_body", "body nests too deeply", "body") from None


def _require_write(request: web.Request) -> None:
    token = request.app[CONFIG].token
    if token is None:
        raise ApiError(403, "writes_disabled",
                       "no API token is configured, so writes are refused: set api.token (environment IBFM_API__TOKEN "
                       "or [api] token in the config file) and send Authorization: Bearer <token>")
    auth = request.headers.get("Authorization", "")
    scheme, _, given = auth.partition(" ")
    if not auth or scheme.lower() != "bearer" or not given.strip():
        raise ApiError(401, "unauthorized", "this request changes the subnet: send Authorization: Bearer <token>",
                       "Authorization", headers={"WWW-Authenticate": 'Bearer realm="ibfm"'})
    try:
        # aiohttp decodes header bytes as UTF-8 with surrogateescape: this gives back the bytes as sent
        sent = given.strip().encode("utf-8", "surrogateescape")
        sent.decode("utf-8")
    except UnicodeError:
        raise ApiError(401, "unauthorized", "the bearer token is not UTF-8 text", "Authorization",
                       headers={"WWW-Authenticate": 'Bearer realm="ibfm", error="invalid_token"'}) from None
    if not hmac.compare_digest(sent, token.encode()):
        raise ApiError(403, "forbidden", "the bearer token is not the configured API token", "Authorization")


async def _heavy(request: web.Request, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a worker thread, at most ``heavy_jobs`` at once (429 beyond)."""
    rt = request.app[RUNTIME]
    assert rt.heavy is not None
    if rt.heavy.locked():
        raise ApiError(429, "busy", "a what-if or validation is already running; retry shortly",
                       headers={"Retry-After": "2"})
    async with rt.heavy:
        return await asyncio.to_thread(fn)


# -- requests aiohttp refuses -----------------------------------------------------------------------------


def _protocol_error_text(exc: BaseException) -> str:
    """What aiohttp says of a request it could not parse, on one line of at most 200 characters."""
    cause = exc if isinstance(exc, HttpProcessingError) else exc.__cause__
    text = " ".join((cause.message if isinstance(cause, HttpProcessingError) else str(exc)).split())
    return text if len(text) <= 200 else text[:197] + "..."


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger, except that a request aiohttp cannot parse is one line, not a traceback.

    Any client can send a URL or header over aiohttp's 8,190 bytes, bytes that are not HTTP, or a body whose
    framing or Content-Encoding breaks. aiohttp answers 400 itself (before any handler) and logs the
    exception with its traceback at ERROR: a log anyone can flood. Given to aiohttp's request handler as its
    ``logger`` (``web.Application(handler_args=...)``), this logs such an error as one INFO line (DEBUG ones
    stay DEBUG) and passes every other message through unchanged.
    """

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if exc is True:
            exc = sys.exc_info()[1]
        elif isinstance(exc, tuple):
            exc = exc[1]
        if not isinstance(exc, HttpProcessingError | web.RequestPayloadError):
            self.logger.log(level, msg, *args, **kwargs)
            return
        level = min(level, logging.INFO)
        if self.logger.isEnabledFor(level):
            what = str(msg) % args if args else str(msg)
            self.logger.log(level, "%s: %s", what, _protocol_error_text(exc))


SERVER_LOG = _ServerLog(logging.getLogger("aiohttp.server"))
"""The ``logger`` of aiohttp's request handler for the API's app."""


# -- middleware ----------------------------------------------------------------------------------------------


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e.status, e.error, e.detail, e.parameter, e.headers)
    except web.RequestPayloadError as e:  # bad chunked framing, Content-Encoding that does not decode, ...
        return error_response(400, "bad_body", f"the body could not be read: {_protocol_error_text(e)}", "body")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        slug = (e.reason or "error").lower().replace(" ", "_").replace("-", "_")
        if e.status == 404:
            detail = f"no endpoint {request.path!r}; see {API_PREFIX}/openapi.json"
        elif e.status == 405:
            detail = f"{request.method} is not allowed on {request.path} (allowed: {e.headers.get('Allow', '')})"
        elif e.status == 413:
            detail = f"request body too large (limit {request.app[CONFIG].max_body_bytes} bytes)"
        else:
            detail = e.text or e.reason
        headers = {k: v for k, v in e.headers.items() if k in ("Allow", "WWW-Authenticate", "Retry-After")}
        return error_response(e.status, slug, detail, None, headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path_qs)
        return error_response(500, "internal", "unexpected server error; the server log has the details")


# -- meta ----------------------------------------------------------------------------------------------------

meta = web.RouteTableDef()


@meta.get(f"{API_PREFIX}/openapi.json")
async def get_openapi(request: web.Request) -> web.Response:
    _query(request, ())
    return web.Response(body=request.app[RUNTIME].openapi, content_type="application/json")


@meta.get(API_PREFIX)
@meta.get(f"{API_PREFIX}/")
async def get_index(request: web.Request) -> web.Response:
    doc = json.loads(request.app[RUNTIME].openapi)
    return _json({"api": API_PREFIX, "openapi": f"{API_PREFIX}/openapi.json", "paths": sorted(doc["paths"])})


# -- health --------------------------------------------------------------------------------------------------

health = web.RouteTableDef()


def _verify_json(v: VerifyReport) -> dict[str, Any]:
    return {
        "ok": v.ok,
        "pairs": v.pairs,
        "reachable": v.reachable,
        "unreachable": v.unreachable,
        "host_pairs": v.host_pairs,
        "host_unreachable": v.host_unreachable,
        "max_hops": v.max_hops,
        "mean_hops": round(v.mean_hops, 4),
        "failures": [str(x) for x in v.failures],
    }


def _last_failure(bus: EventBus, after: float) -> dict[str, Any] | None:
    for ev in reversed(bus.history):
        if isinstance(ev, SweepDone) and ev.kind == "heavy":
            return None
        if isinstance(ev, SweepFailed) and ev.time >= after:
            return {"stage": ev.stage, "reason": ev.reason, "time": ev.time}
    return None


@health.get(f"{API_PREFIX}/health")
async def get_health(request: web.Request) -> web.Response:
    _query(request, ())
    v = _view(request)
    s = v.snap
    mgr = request.app[MANAGER]
    counts = v.summary()
    loops = [str(x) for x in s.credit_loops]
    failure = _last_failure(mgr.events, s.time)
    if not s.verify.ok:
        state = "down"
    elif s.up and not loops and not s.discovery.errors and failure is None:
        state = "up"
    else:
        state = "degraded"
    perf = request.app[PERFMGR]
    perf_json = None
    if perf is not None:
        rep = getattr(perf, "last_report", None)
        perf_json = {
            "sweeps": int(perf.sweeps),
            "last_sweep_time": float(perf.last_sweep_time) or None,
            "last_duration_s": None if rep is None else round(float(rep.duration), 4),
            "ports_read": None if rep is None else int(rep.ports_read),
            "timeouts": None if rep is None else int(rep.timeouts),
        }
    d = s.discovery
    body = {
        "state": state,
        "subnet_up": s.up,
        "sweep": {
            "number": s.sweep,
            "time": s.time,
            "age_s": round(max(0.0, time.time() - s.time), 3),
            "phases_s": {k: round(x, 4) for k, x in s.phases.items()},
            "up_s": round(s.up_s, 4),
            "duration_s": round(s.duration_s, 4),
            "smps": s.smps,
            "last_failure": failure,
        },
        "fabric": counts,
        "sm": {"node": s.fabric.names[d.sm_node], "port": d.sm_port, "lid": s.sm_lid},
        "routing": {"engine": s.engine, "chain": list(mgr.config.engines),
                    "refused": [{"engine": e, "reason": r} for e, r in s.refused]},
        "verify": _verify_json(s.verify),
        "credit_loops": loops,
        "lids": {"assigned": v.lids_assigned(), "lmc": s.lids.lmc, "max_lid": s.lids.max_lid,
                 "warnings": list(s.lid_warnings)},
        "program": {
            "ok": s.program.ok,
            "port_sets": s.program.port_sets,
            "lft_blocks_sent": s.program.blocks_sent,
            "lft_blocks_unchanged": s.program.blocks_skipped,
            "ports_active": s.program.activated,
            "failures": list(s.program.failures),
        },
        "discovery_errors": list(d.errors),
        "perfmgr": perf_json,
    }
    return _json(body)


# -- topology ------------------------------------------------------------------------------------------------

topology = web.RouteTableDef()


@topology.get(f"{API_PREFIX}/nodes")
async def list_nodes(request: web.Request) -> web.Response:
    q = _query(request, ("type", "name", "limit", "offset"))
    kind = _choice(q, "type", ("switch", "ca", "router"))
    limit, offset = _page(q)
    name = q.get("name")
    v = _view(request)
    nodes = v.nodes()
    if kind is not None or name:
        needle = (name or "").lower()
        nodes = [
            x for x in nodes
            if (kind is None or x["type"] == kind)
            and (not needle or needle in x["name"].lower() or needle in x["description"].lower())
        ]
    return _json({"total": len(nodes), "offset": offset, "limit": limit, "items": nodes[offset : offset + limit]})


@topology.get(f"{API_PREFIX}/nodes/{{id}}")
async def get_node(request: web.Request) -> web.Response:
    _query(request, ())
    v = _view(request)
    n = v.node(request.match_info["id"], "id")
    f = v.fabric
    perf = request.app[PERFMGR]
    ports = [v.port(n, p, perf) for p in np.flatnonzero(f.port_exists[n]).tolist()]
    return _json({**v.nodes()[n], "ports": ports})


@topology.get(f"{API_PREFIX}/ports")
async def list_ports(request: web.Request) -> web.Response:
    q = _query(request, ("node", "state", "limit", "offset"))
    state = _choice(q, "state", tuple(_STATE_CODE))
    limit, offset = _page(q)
    v = _view(request)
    ports = v.ports()
    if "node" in q:
        n = v.node(q["node"], "node")
        ports = ports[ports[:, 0] == n]
    if state is not None:
        ports = ports[v.fabric.state[ports[:, 0], ports[:, 1]] == _STATE_CODE[state]]
    perf = request.app[PERFMGR]
    page = ports[offset : offset + limit].tolist()
    items = [v.port(a, b, perf) for a, b in page]
    return _json({"total": int(ports.shape[0]), "offset": offset, "limit": limit, "items": items})


@topology.get(f"{API_PREFIX}/links")
async def list_links(request: web.Request) -> web.Response:
    q = _query(request, ("node", "state", "limit", "offset"))
    state = _choice(q, "state", tuple(_STATE_CODE))
    limit, offset = _page(q)
    v = _view(request)
    f = v.fabric
    la = v.links()
    if "node" in q:
        n = v.node(q["node"], "node")
        la = la[(la[:, 0] == n) | (la[:, 2] == n)]
    st = np.minimum(f.state[la[:, 0], la[:, 1]], f.state[la[:, 2], la[:, 3]])
    if state is not None:
        keep = st == _STATE_CODE[state]
        la, st = la[keep], st[keep]
    items = []
    for (a, pa, b, pb), s in zip(la[offset : offset + limit].tolist(), st[offset : offset + limit].tolist(),
                                 strict=True):
        items.append({
            "a": v.end(a, pa),
            "b": v.end(b, pb),
            "state": _STATE.get(int(s), "nop"),
            "phys_state": _PHYS.get(int(f.phys_state[a, pa]), "nop"),
            **v.link_fields(a, pa),
        })
    return _json({"total": int(la.shape[0]), "offset": offset, "limit": limit, "items": items})


# -- routing -------------------------------------------------------------------------------------------------

routing = web.RouteTableDef()


@routing.get(f"{API_PREFIX}/routes")
async def get_route(request: web.Request) -> web.Response:
    q = _query(request, ("src", "dst"))
    for name in ("src", "dst"):
        if name not in q:
            raise ApiError(400, "missing_parameter", f"{name} is required (node name, GUID or LID)", name)
    v = _view(request)
    return _json(v.route(q["src"], q["dst"]))


@routing.get(f"{API_PREFIX}/switches/{{id}}/lft")
async def get_lft(request: web.Request) -> web.Response:
    q = _query(request, ("format",))
    fmt = _choice(q, "format", ("json", "ibroute")) or "json"
    v = _view(request)
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
    return _json({
        "switch": {"name": v.names[n], "guid": v.guid_hex[n], "lid": lid or None},
        "lid_top": int(lids[-1]) if lids.size else 0,
        "count": len(entries),
        "entries": entries,
    })


# -- validation ----------------------------------------------------------------------------------------------

validation = web.RouteTableDef()


def _check(items: list[dict[str, Any]], severity: str, note: str = "") -> dict[str, Any]:
    return {
        "ok": not items,
        "severity": severity,
        "count": len(items),
        "items": items[:MAX_ITEMS],
        "truncated": len(items) > MAX_ITEMS,
        "note": note,
    }


def _validate(v: SnapshotView, expected: Fabric | None, expected_name: str | None, skipped: str) -> dict[str, Any]:
    """Every check on the snapshot (runs in a worker thread)."""
    s = v.snap
    f = s.fabric
    checks: dict[str, Any] = {}
    checks["duplicate_guids"] = _check(
        [{"what": d.what, "value": d.value, "holders": list(d.holders), "text": str(d)} for d in duplicate_guids(f)]
        + [{"what": "discovery", "value": e, "holders": [], "text": e} for e in s.discovery.errors
           if "inconsistent link" in e],
        "error",
        "node GUIDs, port GUIDs; links the discovery found inconsistent (a GUID seen in two places)",
    )
    checks["duplicate_descriptions"] = _check(
        [{"value": d.value, "holders": list(d.holders), "text": str(d)} for d in duplicate_descriptions(f)],
        "warning",
    )
    checks["slow_links"] = _check(
        [
            {"a": x.a.as_dict(), "b": x.b.as_dict(), "width": x.width, "supported_width": x.supported_width,
             "speed": x.speed, "supported_speed": x.supported_speed, "text": str(x)}
            for x in slow_links(f)
        ],
        "warning",
        "links below the width or speed both ends support",
    )
    checks["stuck_ports"] = _check(
        [{"port": x.end.as_dict(), "state": x.state, "peer": x.peer.as_dict() if x.peer else None, "text": str(x)}
         for x in stuck_ports(f)],
        "error",
        "LinkUp ports left in INIT or ARMED after the sweep",
    )
    if expected is not None:
        rep = compare_cabling(f, expected)
        items: list[dict[str, Any]] = []
        for a, b in rep.missing:
            items.append({"kind": "missing", "a": a.as_dict(), "b": b.as_dict(),
                          "text": f"missing cable {a} - {b}"})
        for a, b in rep.extra:
            items.append({"kind": "extra", "a": a.as_dict(), "b": b.as_dict(),
                          "text": f"cable {a} - {b} is not in the expected topology"})
        for sw in rep.swapped:
            items.append({"kind": "swapped", "node": sw.node, "guid": _hex(sw.guid), "ports": [sw.port_a, sw.port_b],
                          "expected": [sw.expected_a.as_dict(), sw.expected_b.as_dict()], "text": str(sw)})
        for name in rep.missing_nodes:
            items.append({"kind": "missing_node", "node": name, "text": f"node {name} of the expected topology "
                          "is not in the fabric"})
        for name in rep.unexpected_nodes:
            items.append({"kind": "unexpected_node", "node": name, "text": f"node {name} is not in the expected "
                          "topology"})
        note = (f"against {expected_name}: {rep.matched_cables} of {rep.expected_cables} cables match; nodes "
                f"matched by " + ", ".join(f"{k} {c}" for k, c in rep.matched_by.items()))
        checks["cabling"] = _check(items, "error", note)
    else:
        checks["cabling"] = {"ok": True, "severity": "info", "count": 0, "items": [], "truncated": False,
                             "note": skipped}
    checks["routing"] = _check(
        [{"text": str(x), "status": x.status.name.lower(), "src": x.src, "lid": x.lid, "dst": x.dst,
          "switch": x.switch, "port": x.port} for x in s.verify.failures],
        "error",
        s.verify.summary(),
    )
    if s.verify.unreachable > len(s.verify.failures):
        checks["routing"]["count"] = s.verify.unreachable
        checks["routing"]["truncated"] = True
    checks["credit_loops"] = _check(
        [{"text": str(x), "channels": [str(c) for c in x.channels], "lids": list(x.lids)} for x in s.credit_loops],
        "error",
        f"channel dependency graph of the {s.engine} routes",
    )
    checks["discovery"] = _check([{"text": e} for e in s.discovery.errors], "warning")
    shape = detect_shape(f).as_dict()
    errors = sum(1 for c in checks.values() if not c["ok"] and c["severity"] == "error")
    warnings = sum(1 for c in checks.values() if not c["ok"] and c["severity"] == "warning")
    return {"ok": errors == 0, "errors": errors, "warnings": warnings, "expected_topology": expected_name,
            "checks": checks, "shape": shape}


def _expected(rt: Runtime, path: Path | None) -> tuple[Fabric | None, str, object]:
    """The configured expected topology, re-read when the file changes: (fabric or None, why not, file stamp)."""
    if path is None:
        why = ("no expected topology: set fabric.expected_topology, or POST a net file to "
               f"{API_PREFIX}/validation")
        return None, why, None
    try:
        st = os.stat(path)
    except OSError as e:
        why = f"expected topology {path}: {e.strerror or e}"
        return None, why, why
    stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    if rt.expected is not None and rt.expected[0] == path and rt.expected[1] == stamp:
        return rt.expected[2], "", stamp
    try:
        fab = read_net(path)
    except IbfmError as e:
        return None, f"expected topology unusable: {e}", stamp
    rt.expected = (path, stamp, fab)
    return fab, "", stamp


@validation.get(f"{API_PREFIX}/validation")
async def get_validation(request: web.Request) -> web.Response:
    _query(request, ())
    v = _view(request)
    rt = request.app[RUNTIME]
    path = request.app[CONFIG].expected_topology
    async with v.lock:
        expected, why, stamp = await asyncio.to_thread(_expected, rt, path)
        key = (path, stamp)
        if v.validation is None or v.validation_key != key:
            v.validation = await asyncio.to_thread(
                _validate, v, expected, str(path) if expected is not None else None, why
            )
            v.validation_key = key
        return _json(v.validation)


@validation.post(f"{API_PREFIX}/validation")
async def post_validation(request: web.Request) -> web.Response:
    _query(request, ())
    v = _view(request)
    raw = await _read_body(request, ("text/plain", "application/octet-stream"))
    if not raw.strip():
        raise ApiError(400, "bad_body", "the body is empty: post the expected topology as a net file", "body")

    def run() -> dict[str, Any]:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ApiError(400, "bad_body", f"the net file is not UTF-8 text (byte {e.start})", "body") from None
        try:
            expected = parse_net(text, "posted net file")
        except IbfmError as e:
            raise ApiError(400, "bad_body", str(e), "body") from None
        return _validate(v, expected, "posted net file", "")

    return _json(await _heavy(request, run))


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


def _check_spec(text: str, parameter: str) -> str:
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


@analysis.get(f"{API_PREFIX}/congestion")
async def get_congestion(request: web.Request) -> web.Response:
    q = _query(request, ("pattern", "top"))
    spec = _check_spec(q.get("pattern", "shift:1"), "pattern")
    top = _int(q, "top", 10, 0, 1000)
    v = _view(request)
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
    return _json(hit)


def _quality_json(q: RouteQuality) -> dict[str, Any]:
    sq: ShiftQuality = q.shifts
    return {
        "engine": q.engine,
        "refused": [{"engine": e, "reason": r} for e, r in q.refused],
        "verify": _verify_json(q.verify),
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
    _query(request, ())
    v = _view(request)
    body = await _json_body(request)
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
    pat = _check_spec(req.pattern, "pattern")
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

    return _json(await _heavy(request, run))


# -- control -------------------------------------------------------------------------------------------------

control = web.RouteTableDef()


@control.post(f"{API_PREFIX}/sweep")
async def post_sweep(request: web.Request) -> web.Response:
    _query(request, ())
    _require_write(request)
    body = await _json_body(request, optional=True)
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
    return _json({"requested": True, "heavy": heavy, "sweep": None if snap is None else snap.sweep}, status=202)


@control.get(f"{API_PREFIX}/events")
async def list_events(request: web.Request) -> web.Response:
    q = _query(request, ("type", "limit"))
    limit = _int(q, "limit", 100, 1, 1000)
    kind = q.get("type")
    history = list(request.app[MANAGER].events.history)
    if kind is not None:
        history = [e for e in history if getattr(e, "type", None) == kind]
    items = [e.model_dump(mode="json") for e in history[-limit:]]
    return _json({"total": len(history), "items": items})


# -- the app -------------------------------------------------------------------------------------------------

ROUTE_TABLES = (meta, health, topology, routing, validation, analysis, control)


def create_app(
    manager: SubnetSource,
    config: ApiConfig | None = None,
    *,
    perfmgr: CounterSource | None = None,
    metrics: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None,
) -> web.Application:
    """The aiohttp application: every ``/api/v1`` route, and ``GET /metrics`` when ``metrics`` is a handler."""
    cfg = config or ApiConfig()
    app = web.Application(middlewares=[_errors], client_max_size=cfg.max_body_bytes,
                          handler_args={"logger": SERVER_LOG})
    app[MANAGER] = manager
    app[CONFIG] = cfg
    app[PERFMGR] = perfmgr
    rt = Runtime(heavy=asyncio.Semaphore(max(1, cfg.heavy_jobs)))
    rt.openapi = json.dumps(build_openapi(metrics=metrics is not None)).encode()
    app[RUNTIME] = rt
    for table in ROUTE_TABLES:
        app.add_routes(table)
    if metrics is not None:
        app.router.add_get("/metrics", metrics)
    return app
