"""``ibfm status``, ``links``, ``errors``, ``hot``: the running daemon, asked over its HTTP API.

In the manner of infiniband-diags (``sminfo``, ``iblinkinfo``, ``ibqueryerrors``), but read from what
``ibfm serve`` already knows: no MAD is sent, so they are fast and need no access to the fabric. Tables for
people, ``--json`` for scripts. The daemon is ``--url``, else ``$IBFM_URL``, else http://127.0.0.1:9690.
A daemon that cannot be reached, or answers an error, is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from fabric.errors import IbfmError

URL_ENV = "IBFM_URL"
DEFAULT_URL = "http://127.0.0.1:9690"
"""Where ``ibfm serve`` listens by default (``listen`` in docs/settings.md)."""
PAGE = 1000
"""Items asked per request of a list (the API's largest page)."""


class DaemonError(IbfmError):
    """The daemon could not be reached, or answered an error."""


# -- the API ----------------------------------------------------------------------------------------------


class Api:
    """GETs of one daemon's ``/api/v1``, answers as JSON; every failure a :class:`DaemonError` of one line."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        full = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        req = urllib.request.Request(full, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise DaemonError(self._refusal(e)) from None
        except (urllib.error.URLError, OSError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            if isinstance(reason, socket.timeout | TimeoutError):
                reason = f"no answer within {self.timeout:g} s"
            elif isinstance(reason, OSError) and reason.strerror:
                reason = reason.strerror
            raise DaemonError(f"cannot reach the ibfm daemon at {self.url}: {reason} (is `ibfm serve` running? "
                              f"--url or ${URL_ENV} say where)") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise DaemonError(f"{full}: the answer is not JSON (is {self.url} an ibfm daemon?)") from None

    def _refusal(self, e: urllib.error.HTTPError) -> str:
        try:
            body = json.loads(e.read())
            what, detail = body["error"], body["detail"]
        except (ValueError, KeyError, TypeError, OSError):
            return f"the daemon at {self.url} answered {e.code} {e.reason} (is it an ibfm daemon?)"
        return f"the daemon at {self.url} answered {e.code} {what}: {detail}"

    def every(self, path: str, **params: Any) -> tuple[dict[str, Any], list[Any]]:
        """Every page of a list: (the first answer, all items)."""
        first = self.get(path, limit=PAGE, offset=0, **params)
        items = list(first["items"])
        while len(items) < first["total"]:
            page = self.get(path, limit=PAGE, offset=len(items), **params)
            if not page["items"]:
                break
            items += page["items"]
        return first, items


# -- text -------------------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; the columns ``right`` aligned right."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for r in cells:
        line = "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths,
                                                                                              strict=True)))
        out.append(line.rstrip())
    return "\n".join(out)


def port_name(end: dict[str, Any] | None) -> str:
    return "-" if end is None else f"{end['node']}[{end['port']}]"


def when(t: float | None, now: float | None = None) -> str:
    """``2026-12-02 13:45:01 UTC (12 s ago)``."""
    if not t:
        return "never"
    age = max(0.0, (now or time.time()) - t)
    stamp = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({_age(age)} ago)"


def _age(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _n(k: int, what: str) -> str:
    return f"{k:,} {what}" + ("" if k == 1 else "s")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def _emit(args: argparse.Namespace, data: Any, text: Callable[[], str]) -> None:
    out = json.dumps(data, indent=2) if args.json else text()
    try:
        print(out, flush=True)
    except BrokenPipeError:  # `ibfm links | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (and Python's exit flush goes nowhere)


# -- status -----------------------------------------------------------------------------------------------


def problems(h: dict[str, Any]) -> list[str]:
    """What is wrong, one line each, from ``GET /health``."""
    out: list[str] = []
    sm = h.get("sm") or {}
    if sm.get("state") not in (None, "master"):
        out.append(f"this SM is {sm['state']}: another SM runs the subnet")
    sweep = h.get("sweep") or {}
    fail = sweep.get("last_failure")
    if fail:
        out.append(f"last sweep failed in {fail['stage']}: {fail['reason']}")
    v = h.get("verify") or {}
    if v.get("unreachable"):
        out.append(f"{v['unreachable']} of {v['pairs']} (source, LID) pairs have no route")
        out += [f"  {x}" for x in v.get("failures", [])[:5]]
    loops = h.get("credit_loops") or []
    if loops:
        out.append(f"{len(loops)} credit loop(s), e.g. {loops[0]}")
    for e in (h.get("program") or {}).get("failures", []):
        out.append(f"programming: {e}")
    for e in h.get("discovery_errors") or []:
        out.append(f"discovery: {e}")
    for e in (h.get("lids") or {}).get("warnings", []):
        out.append(f"LIDs: {e}")
    for r in (h.get("routing") or {}).get("refused", []):
        out.append(f"routing: {r['engine']} refused: {r['reason']}")
    return out


def format_status(h: dict[str, Any], now: float | None = None) -> str:
    sm = h.get("sm") or {}
    if h.get("sweep") is None:  # a standby that never swept: it says who is master
        master = sm.get("master_guid") or "unknown"
        return f"SM: {h['state']}; master {master} LID {sm.get('master_lid') or '-'}"
    s, f = h["sweep"], h["fabric"]
    master_guid = sm.get("master_guid") or (sm.get("guid") if sm.get("state", "master") == "master" else None)
    master_lid = sm.get("master_lid") or (sm.get("lid") if sm.get("state", "master") == "master" else None)
    lines = [
        f"subnet: {h['state'].upper()}",
        f"SM: {sm.get('state', 'master')}, {sm.get('node')}[{sm.get('port')}] LID {sm.get('lid')}"
        + (f", priority {sm['priority']}" if "priority" in sm else ""),
        f"master: GUID {master_guid or '-'} LID {master_lid or '-'}",
        f"last sweep: {s['number']}, {when(s['time'], now)}, took {s['duration_s']:.3f} s "
        f"(up in {s['up_s']:.3f} s, {s['smps']} SMPs)",
        f"engine: {h['routing']['engine']} (chain {','.join(h['routing']['chain'])})",
        f"fabric: {f['switches'] + f['cas']} nodes ({f['switches']} switches, {f['cas']} CAs), {f['links']} links "
        f"({f.get('switch_links', 0)} between switches), {h['lids']['assigned']} LIDs",
    ]
    perf = h.get("perfmgr")
    if perf is not None:
        lines.append(f"counters: {perf['sweeps']} sweeps, last {when(perf['last_sweep_time'], now)}")
    found = problems(h)
    lines.append("problems: none" if not found else f"problems: {len(found)}")
    lines += [f"  {x}" for x in found]
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    h = Api(args.url, args.timeout).get("health")
    _emit(args, h, lambda: format_status(h))
    return 0 if h.get("state") == "up" else 1


# -- links ------------------------------------------------------------------------------------------------


def format_links(first: dict[str, Any], items: list[dict[str, Any]]) -> str:
    rows = []
    for x in items:
        sup = f"{x['supported_width']} {x['supported_speed']}" if x["supported_speed"] else "-"
        rows.append([
            "!" if x["degraded"] else "", port_name(x["a"]), port_name(x["b"]), x["width"] or "-", x["speed"] or "-",
            f"{x['rate_gbps']:g}", sup, x["state"], x["phys_state"], x["why"] or "",
        ])
    body = table(["", "A", "B", "WIDTH", "SPEED", "GB/S", "SUPPORTED", "STATE", "PHYS", "BELOW CAPABILITY"], rows,
                 right=(5,))
    foot = f"{_n(len(items), 'link')}; {first['degraded']} of the fabric's below both ends' width or speed"
    if not rows:
        return "no link listed" + (f" (the fabric has {first['degraded']} below capability)" if first["degraded"]
                                   else ": every link runs at the width and speed both ends support")
    return f"{body}\n{foot}"


def cmd_links(args: argparse.Namespace) -> int:
    first, items = Api(args.url, args.timeout).every(
        "linkinfo", degraded="true" if args.degraded else None, node=args.node
    )
    _emit(args, {**first, "offset": 0, "limit": len(items), "items": items}, lambda: format_links(first, items))
    return 0


# -- errors -----------------------------------------------------------------------------------------------


def format_errors(first: dict[str, Any], items: list[dict[str, Any]], now: float | None = None) -> str:
    if not first["counting"]:
        return f"no counters: {first['note']}"
    rows = []
    for x in items:
        for i, (k, total) in enumerate(x["counters"].items()):
            first_row = i == 0  # the port named once, its counters below it
            rows.append(["*" if x["moving"] and first_row else "", port_name(x) if first_row else "",
                         port_name(x.get("peer")) if first_row else "", k, f"{total:,}", _rate(x["rates"].get(k))])
    span = (f"rates over the last {first['interval_s']:g} s of counter sweeps"
            if first["interval_s"] else "rates not measured yet (" + str(first["note"]) + ")")
    head = (f"{_n(first['total'], 'port')} with error counts; {span}; last counter sweep "
            f"{when(first['last_sweep_time'], now)}")
    if not rows:
        return head
    return head + "\n" + table(["", "PORT", "PEER", "COUNTER", "TOTAL", "PER S"], rows, right=(4, 5))


def cmd_errors(args: argparse.Namespace) -> int:
    first, items = Api(args.url, args.timeout).every("errors", node=args.node)
    _emit(args, {**first, "offset": 0, "limit": len(items), "items": items}, lambda: format_errors(first, items))
    return 0


# -- hot --------------------------------------------------------------------------------------------------


def format_hot(h: dict[str, Any], now: float | None = None) -> str:
    rows = [
        [port_name(x["src"]), port_name(x["dst"]), f"{x['rate_gbps']:g}",
         "-" if x["measured_gbps"] is None else f"{x['measured_gbps']:.1f}", _pct(x["measured_utilization"]),
         _rate(x["measured_xmit_wait_per_s"]), _pct(x["predicted_utilization"]),
         _rate(x["predicted_xmit_wait_per_s"])]
        for x in h["items"]
    ]
    measured = (f"measured over the counter interval ending {when(h['measured_at'], now)}" if h["measured"]
                else "not measured (no counter rates yet)")
    predicted = f"predicted for {h['pattern']}" if h["predicted"] else (
        f"no prediction for {h['pattern']} yet" if h["pattern"] else "no prediction (give --pattern)")
    head = f"busiest ports by {h['by']} utilization: {measured}; {predicted}"
    return head + "\n" + table(
        ["SRC", "DST", "GB/S", "SENT GB/S", "MEASURED", "WAIT/S", "PREDICTED", "PRED WAIT/S"], rows,
        right=(2, 3, 4, 5, 6, 7),
    )


def cmd_hot(args: argparse.Namespace) -> int:
    by = "predicted" if args.by_predicted else "measured"
    h = Api(args.url, args.timeout).get("hot", top=args.top, by=by, pattern=args.pattern)
    _emit(args, h, lambda: format_hot(h))
    return 0


# -- the parsers --------------------------------------------------------------------------------------------


def _top(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= v <= 1000:
        raise argparse.ArgumentTypeError(f"must be within 1..1000: {text!r}")
    return v


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get(URL_ENV) or DEFAULT_URL,
                   help=f"the daemon's address (default ${URL_ENV}, else {DEFAULT_URL})")
    p.add_argument("--json", action="store_true", help="the API's answer as JSON, for scripts")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per request (default 10)")


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="the running daemon: role, master, last sweep, engine, counts, problems",
                       description="Exit status 0 when the subnet is up, 1 when it is degraded, down or this SM "
                       "is not master, 2 when the daemon cannot be asked.")
    _common(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("links", help="every link's width, speed and state, like iblinkinfo; '!' below capability")
    _common(p)
    p.add_argument("--degraded", action="store_true", help="only links below both ends' width or speed")
    p.add_argument("--node", help="only links of this node (name, GUID or LID)")
    p.set_defaults(func=cmd_links)

    p = sub.add_parser("errors", help="ports whose error counters moved, with rates, like ibqueryerrors")
    _common(p)
    p.add_argument("--node", help="only this node's ports (name, GUID or LID)")
    p.set_defaults(func=cmd_errors)

    p = sub.add_parser("hot", help="the busiest links now: measured utilization and predicted")
    _common(p)
    p.add_argument("--top", type=_top, default=10, help="ports listed (default 10)")
    p.add_argument("--pattern", help="traffic pattern to predict (default: the daemon's congestion.pattern, if it "
                   "hands it to the API)")
    p.add_argument("--by-predicted", action="store_true", help="order by predicted utilization")
    p.set_defaults(func=cmd_hot)
