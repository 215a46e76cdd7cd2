"""Partitions (``/partitions``, ``/partitions/{pkey}``) and their reload (``POST /partitions/reload``, SIGHUP).

The reads answer from the current snapshot's :class:`~sm.partitions.plan.PartitionPlan`: the
partitions of the file it planned, how many end ports each has, and what the fabric made of
the file (its ``problems``). :class:`PartitionReloader` re-reads the partitions file
(``sm.partitions``): a file that parses goes to the manager, which applies it with a heavy
sweep; one that does not is logged as one line naming file, line and column, and changes
nothing. ``POST /partitions/reload`` and the daemon's SIGHUP share it, so both say the same.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from exporters.http.common import (
    MANAGER,
    MAX_ITEMS,
    ApiError,
    SubnetSource,
    choice_param,
    json_response,
    page_params,
    query_params,
    require_write,
)
from exporters.http.openapi import API_PREFIX, PKEY_PATTERN
from exporters.http.state import current_view
from exporters.http.view import SnapshotView, hex_guid
from fabric.errors import IbfmError
from sm.partitions.config import Partition, PartitionConfig, PartitionConfigError, load_partitions
from sm.partitions.plan import PartitionPlan

log = logging.getLogger(__name__)

# PartitionPlan.membership: per end port, bit 0 limited member, bit 1 full member.
LIMITED_BIT = 1
FULL_BIT = 2
_MEMBERSHIP = {LIMITED_BIT: "limited", FULL_BIT: "full", LIMITED_BIT | FULL_BIT: "both"}


# -- reload ------------------------------------------------------------------------------------------------


class NoPartitionsFile(IbfmError):
    """A reload was asked for, but no partitions file is configured."""


@dataclass(frozen=True)
class Reloaded:
    """A partitions file read and handed to the manager."""

    config: PartitionConfig
    changed: bool
    """It differs from the configuration the manager had."""


class PartitionReloader:
    """Re-reads the partitions file; a good one goes to ``manager.set_partitions``, a bad one changes nothing.

    Reloads run one at a time (the file is read in a worker thread), so the last one asked for
    is the one in force. Every outcome is one log line, with an ``extra`` field
    ``partitions_reload`` = ``{via, result, file, ...}`` (result: applied, refused, no_file).
    """

    def __init__(self, manager: SubnetSource, path: Path | None) -> None:
        self.manager = manager
        self.path = path
        self._lock = asyncio.Lock()

    async def reload(self, via: str) -> Reloaded:
        """Read the file again; raises :class:`NoPartitionsFile` or :class:`PartitionConfigError`."""
        if self.path is None:
            log.warning("partitions not reloaded (%s): no partitions file is configured (sm.partitions)", via,
                        extra={"partitions_reload": {"via": via, "result": "no_file", "file": None}})
            raise NoPartitionsFile(
                "no partitions file is configured (set sm.partitions: IBFM_SM__PARTITIONS, [sm] partitions in the "
                "config file, or --partitions, and restart): OpenSM's default partition is in force"
            )
        name = os.fspath(self.path)
        async with self._lock:
            try:
                cfg = await asyncio.to_thread(load_partitions, self.path)
            except PartitionConfigError as e:
                log.warning("partitions file not reloaded (%s), the running configuration stays: %s", via,
                            _one_line(str(e)),
                            extra={"partitions_reload": {"via": via, "result": "refused", "file": e.source,
                                                         "line": e.line, "column": e.col, "message": e.what}})
                raise
            changed = cfg != self.manager.config.partitions
            self.manager.set_partitions(cfg)
        log.info("partitions reloaded (%s) from %s: %d partitions%s; a heavy sweep applies them", via, name, len(cfg),
                 "" if changed else " (unchanged)",
                 extra={"partitions_reload": {"via": via, "result": "applied", "file": name,
                                              "partitions": len(cfg), "changed": changed}})
        return Reloaded(cfg, changed)


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


RELOADER = web.AppKey("partitions_reloader", PartitionReloader)


# -- what the reads answer -----------------------------------------------------------------------------------


def pkey_text(key: int) -> str:
    """A 16-bit P_Key as the API writes it: ``0x8001``."""
    return f"0x{key:04x}"


def membership_counts(plan: PartitionPlan, pkey: int) -> tuple[int, int, int]:
    """(members, full, limited) of partition ``pkey`` (its low 15 bits): end ports counted from the plan."""
    bits = plan.membership.get(pkey & 0x7FFF)
    if bits is None:
        return 0, 0, 0
    return (int(np.count_nonzero(bits)), int(np.count_nonzero(bits & FULL_BIT)),
            int(np.count_nonzero(bits & LIMITED_BIT)))


def partition_json(plan: PartitionPlan, part: Partition) -> dict[str, Any]:
    members, full, limited = membership_counts(plan, part.pkey)
    return {
        "name": part.name,
        "pkey": pkey_text(part.pkey | 0x8000),
        "ipoib": part.ipoib,
        "indx0": part.indx0,
        "mtu": part.mtu,
        "rate": part.rate,
        "sl": part.sl,
        "scope": list(part.scope) if part.scope is not None else None,
        "defmember": part.defmember,
        "members": members,
        "full": full,
        "limited": limited,
    }


def _plan(v: SnapshotView) -> tuple[PartitionPlan, PartitionConfig]:
    plan = v.plan
    if plan is None or plan.config is None:
        raise ApiError(503, "no_partition_plan", f"sweep {v.snap.sweep} left no partition plan; retry after the next "
                       "heavy sweep", headers={"Retry-After": "1"})
    return plan, plan.config


def partition_items(v: SnapshotView) -> list[dict[str, Any]]:
    """Every partition of the view's plan, built once per snapshot."""
    if v.partition_items is None:
        plan, cfg = _plan(v)
        v.partition_items = [partition_json(plan, part) for part in cfg.partitions]
    return v.partition_items


_PKEY = re.compile(PKEY_PATTERN)


def pkey_param(text: str, parameter: str) -> int:
    """A P_Key from a path: ``0x`` and 1-4 hex digits, or decimal 0..65535 (what PKEY_PATTERN says)."""
    if _PKEY.fullmatch(text) is None:
        shown = text if len(text) <= 24 else text[:21] + "..."
        raise ApiError(400, "bad_parameter", f"{parameter}: {shown!r} is not a P_Key (0x8001, or decimal 0..65535)",
                       parameter)
    return int(text, 16) if text[:2] in ("0x", "0X") else int(text)


# -- routes --------------------------------------------------------------------------------------------------

partitions = web.RouteTableDef()


@partitions.get(f"{API_PREFIX}/partitions")
async def list_partitions(request: web.Request) -> web.Response:
    query_params(request, ())
    v = current_view(request)
    plan, cfg = _plan(v)
    items = partition_items(v)
    running = request.app[MANAGER].config.partitions
    return json_response({
        "source": cfg.source,
        "sweep": v.snap.sweep,
        "pending": running is not None and running is not cfg,
        "total": len(items),
        "items": items,
        "problems_total": len(plan.problems),
        "problems": plan.problems[:MAX_ITEMS],
    })


@partitions.get(f"{API_PREFIX}/partitions/{{pkey}}")
async def get_partition(request: web.Request) -> web.Response:
    q = query_params(request, ("membership", "limit", "offset"))
    key = pkey_param(request.match_info["pkey"], "pkey")
    which = choice_param(q, "membership", ("full", "limited"))
    limit, offset = page_params(q)
    v = current_view(request)
    plan, cfg = _plan(v)
    part = cfg.by_pkey(key)
    if part is None:
        raise ApiError(404, "not_found", f"pkey: no partition with P_Key {pkey_text(key | 0x8000)} in {cfg.source}",
                       "pkey")
    bits = plan.membership.get(part.pkey)
    if bits is None:  # no port of the subnet is in it
        bits = np.zeros(plan.endports.shape[0], np.uint8)
    sel = bits if which is None else bits & (FULL_BIT if which == "full" else LIMITED_BIT)
    rows = np.flatnonzero(sel)
    page = rows[offset : offset + limit]
    f = v.fabric
    base = v.lids.base
    items = [
        {
            "node": v.names[n],
            "guid": v.guid_hex[n],
            "port": p,
            "port_guid": hex_guid(int(f.port_guid[n, p])),
            "lid": int(base[n, p]) or None,
            "membership": _MEMBERSHIP[b],
        }
        for (n, p), b in zip(plan.endports[page].tolist(), bits[page].tolist(), strict=True)
    ]
    return json_response({"partition": partition_json(plan, part), "total": int(rows.size), "offset": offset,
                          "limit": limit, "items": items})


@partitions.post(f"{API_PREFIX}/partitions/reload")
async def post_reload(request: web.Request) -> web.Response:
    query_params(request, ())
    require_write(request)
    try:
        done = await request.app[RELOADER].reload("api")
    except NoPartitionsFile as e:
        raise ApiError(409, "no_partitions_file", str(e)) from None
    except PartitionConfigError as e:
        raise ApiError(400, "bad_partitions_file", _one_line(str(e)), extra={
            "file": e.source, "line": e.line or None, "column": e.col or None, "message": e.what}) from None
    snap = request.app[MANAGER].snapshot
    return json_response({"source": done.config.source, "partitions": len(done.config), "changed": done.changed,
                          "sweep": None if snap is None else snap.sweep})
