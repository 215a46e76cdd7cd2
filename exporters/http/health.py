"""Subnet health (``GET /health``) and validation against the fabric's own rules and a cabling plan."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from exporters.http.common import CONFIG, MANAGER, MAX_ITEMS, PERFMGR, ApiError, json_response, query_params, read_body
from exporters.http.openapi import API_PREFIX
from exporters.http.state import RUNTIME, Runtime, current_view, run_heavy
from exporters.http.view import SnapshotView, hex_guid
from fabric.errors import IbfmError
from fabric.formats.netfile import parse_net, read_net
from fabric.model import (
    Fabric,
)
from fabric.shape import detect_shape
from sm.analysis.validate import (
    compare_cabling,
    duplicate_descriptions,
    duplicate_guids,
    slow_links,
    stuck_ports,
)
from sm.analysis.verify import VerifyReport
from sm.sweep.events import EventBus, SweepDone, SweepFailed

# -- health --------------------------------------------------------------------------------------------------

health = web.RouteTableDef()


def verify_json(v: VerifyReport) -> dict[str, Any]:
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


def role_json(mgr: Any) -> dict[str, Any]:
    """This SM's election state: what ``sminfo`` would say of it, and who the master is (a source
    without an election, a recorded snapshot say, is its subnet's master)."""
    el = getattr(mgr, "elector", None)
    if el is None:
        return {"state": "master"}
    r = el.role()
    return {
        "state": r.state.name.lower(),
        "priority": r.priority,
        "guid": hex_guid(r.guid),
        "act_count": r.act_count,
        "master_guid": hex_guid(r.master_guid) if r.master_guid else None,
        "master_lid": r.master_lid or None,
        "since": r.since,
        "reason": r.reason,
    }


@health.get(f"{API_PREFIX}/health")
async def get_health(request: web.Request) -> web.Response:
    query_params(request, ())
    mgr = request.app[MANAGER]
    role = role_json(mgr)
    if mgr.snapshot is None and role["state"] in ("standby", "not_active"):
        # A standby has written nothing and may have no snapshot of its own: it says who is master.
        return json_response({"state": role["state"], "subnet_up": None, "sm": role})
    v = current_view(request)
    s = v.snap
    counts = v.summary()
    loops = [str(x) for x in s.credit_loops]
    failure = _last_failure(mgr.events, s.time)
    if role["state"] != "master":
        state = role["state"]  # the snapshot is the last one this SM made: another SM runs the subnet now
    elif not s.verify.ok:
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
        "sm": {"node": s.fabric.names[d.sm_node], "port": d.sm_port, "lid": s.sm_lid, **role},
        "routing": {"engine": s.engine, "chain": list(mgr.config.engines),
                    "refused": [{"engine": e, "reason": r} for e, r in s.refused]},
        "verify": verify_json(s.verify),
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
    return json_response(body)


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
            items.append({"kind": "swapped", "node": sw.node, "guid": hex_guid(sw.guid),
                          "ports": [sw.port_a, sw.port_b],
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
    query_params(request, ())
    v = current_view(request)
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
        return json_response(v.validation)


@validation.post(f"{API_PREFIX}/validation")
async def post_validation(request: web.Request) -> web.Response:
    query_params(request, ())
    v = current_view(request)
    raw = await read_body(request, ("text/plain", "application/octet-stream"))
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

    return json_response(await run_heavy(request, run))


