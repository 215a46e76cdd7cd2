"""What every handler shares: the app's keys and settings, errors as JSON, request parsing, the middleware."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from aiohttp import web
from aiohttp.http import HttpProcessingError

from exporters.http.openapi import API_PREFIX, OFFSET_MAX
from fabric.errors import IbfmError
from fabric.model import (
    Fabric,
)
from sm.partitions.config import PartitionConfig
from sm.sweep.events import EventBus
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

    def set_partitions(self, partitions: PartitionConfig | None) -> None: ...


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
    partitions_file: Path | None = None
    """The partitions file (``sm.partitions``) that ``POST /partitions/reload`` re-reads; None: 409."""


class ApiError(IbfmError):
    """An answer other than 2xx, as JSON ``{error, detail, parameter}``, plus the ``extra`` fields of its error
    (an error whose schema documents them, e.g. where a partitions file is wrong)."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: str,
        parameter: str | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.parameter = parameter
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


def error_response(
    status: int,
    error: str,
    detail: str,
    parameter: str | None = None,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> web.Response:
    body: dict[str, Any] = {"error": error, "detail": detail, "parameter": parameter}
    if extra:
        body.update((k, v) for k, v in extra.items() if k not in body)
    return web.json_response(body, status=status, headers=headers)


MANAGER = web.AppKey("manager", SubnetSource)
CONFIG = web.AppKey("api_config", ApiConfig)
PERFMGR: web.AppKey[CounterSource | None] = web.AppKey("perfmgr")
"""The PerfManager, or None."""


# -- request helpers -----------------------------------------------------------------------------------------


def query_params(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
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


def int_param(q: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
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


def choice_param(q: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    text = q.get(name)
    if text is None:
        return None
    t = text.strip().lower()
    if t not in choices:
        raise ApiError(400, "bad_parameter", f"{name}: {text!r} is not one of {', '.join(choices)}", name)
    return t


def page_params(q: Mapping[str, str]) -> tuple[int, int]:
    return int_param(q, "limit", 100, 1, 1000), int_param(q, "offset", 0, 0, OFFSET_MAX)


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, separators=(",", ":")), status=status, content_type="application/json")


async def read_body(request: web.Request, kinds: tuple[str, ...]) -> bytes:
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


async def json_body(request: web.Request, *, optional: bool = False) -> Any:
    if optional and not request.can_read_body:
        return {}
    raw = await read_body(request, ("application/json",))
    if optional and not raw:  # no body; a blank one is not JSON
        return {}
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, "bad_body", f"body is not valid JSON: {e}", "body") from None
    except RecursionError:
        raise ApiError(400, "bad_body", "body nests too deeply", "body") from None


def require_write(request: web.Request) -> None:
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
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e.status, e.error, e.detail, e.parameter, e.headers, e.extra)
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


