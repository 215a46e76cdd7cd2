"""``ibfm congestion`` (model one traffic pattern) and ``ibfm ebb`` (effective bisection bandwidth).

Both read a topology file and route it offline: sequential LIDs
(:func:`sm.lidmap.sequential_lids`) and the routing engines, no SM run.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from fabric.errors import IbfmError
from fabric.model import Fabric
from ibfm.commands._args import DEFAULT_CHAIN, engine_chain, int_at_least, number_in
from sm.lidmap import LidMap
from sm.routing.base import Lft, RoutingError


def register(sub: Any) -> None:
    from sm.analysis.patterns import PATTERN_SPECS

    p = sub.add_parser(
        "congestion",
        help="model a traffic pattern on a routed topology: flow rates, hottest links, predicted XmitWait",
    )
    p.add_argument("--topology", required=True, metavar="FILE", help="net file (ibsim/ibnetdiscover)")
    p.add_argument("--engine", type=engine_chain, default=DEFAULT_CHAIN, help="routing engines in order (a chain)")
    p.add_argument(
        "--pattern",
        required=True,
        metavar="P",
        help=f"traffic pattern: {', '.join(PATTERN_SPECS)}; append @F to offer F x link rate instead of greedy",
    )
    p.add_argument("--top", type=int_at_least(1), default=10, metavar="N", help="hottest links to list (default 10)")
    p.add_argument(
        "--tick-hz",
        type=number_in(0, math.inf, lo_open=True),
        metavar="HZ",
        help="XmitWait ticks per second of waiting (default: 1 per word time)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_congestion)

    e = sub.add_parser(
        "ebb", help="effective bisection bandwidth (Hoefler et al.) over random bisections, per routing engine"
    )
    e.add_argument("--topology", required=True, metavar="FILE", help="net file (ibsim/ibnetdiscover)")
    e.add_argument(
        "--engine",
        type=engine_chain,
        default=DEFAULT_CHAIN,
        help="engines to compare, each routing the fabric on its own (default ftree,updn,minhop)",
    )
    e.add_argument("--samples", type=int_at_least(1), default=100, metavar="N", help="random bisections (default 100)")
    e.add_argument("--seed", type=int_at_least(0), default=0, help="first bisection's seed (default 0)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(func=cmd_ebb)


def _load(path: str) -> tuple[Fabric, LidMap]:
    from fabric.formats.netfile import read_net
    from sm.lidmap import sequential_lids

    fabric = read_net(path)
    if fabric.n_nodes == 0:
        raise IbfmError(f"{path}: no nodes")
    try:
        lids = sequential_lids(fabric)
    except ValueError as e:
        raise IbfmError(f"{path}: {e}") from None
    return fabric, lids


def _route(fabric: Fabric, lids: LidMap, chain: tuple[str, ...]) -> tuple[str, Lft, list[tuple[str, str]]]:
    from sm.routing.base import route

    res = route(fabric, lids, chain)
    return res.engine, res.lft, res.refused


def cmd_congestion(args: argparse.Namespace) -> int:
    from sm.analysis.flowmodel import predict_congestion
    from sm.analysis.patterns import parse_pattern

    fabric, lids = _load(args.topology)
    pattern = parse_pattern(args.pattern, fabric, lids)
    engine, lft, refused = _route(fabric, lids, args.engine)
    t0 = time.perf_counter()
    rep = predict_congestion(fabric, lids, lft, pattern, tick_hz=args.tick_hz)
    dt = time.perf_counter() - t0
    stats = rep.flow_stats()
    hot = rep.hottest(args.top)
    waiting = rep.most_waiting(args.top)
    if args.json:
        out = {
            "topology": args.topology,
            "engine": engine,
            "refused": [{"engine": n, "reason": r} for n, r in refused],
            "pattern": pattern.name,
            "rates": {k: (round(v, 6) if isinstance(v, float) else v) for k, v in stats.items()},
            "hottest": [h.as_dict() for h in hot],
            "most_waiting": [h.as_dict() for h in waiting],
            "model_seconds": round(dt, 4),
        }
        print(json.dumps(out, indent=2))
        return 0
    lines = [
        f"{args.topology}: routed by {engine}" + (f" ({len(refused)} engines refused)" if refused else ""),
        f"pattern {pattern.name}: {stats['flows']} flows, {stats['unrouted']} unrouted",
        f"  rate (fraction of link rate)  min {stats['min']:.4f}  mean {stats['mean']:.4f}  max {stats['max']:.4f}"
        f"  ({stats['full_rate']} flows at full rate)",
        f"  aggregate {stats['aggregate_gbps']:.1f} Gb/s; {stats['saturated_links']} saturated links, "
        f"{stats['waiting_ports']} ports waiting for credits",
        "",
        _table("hottest links", hot),
    ]
    if waiting:
        lines += ["", _table("most XmitWait", waiting)]
    print("\n".join(lines))
    return 0


def _table(title: str, rows: list[Any]) -> str:
    if not rows:
        return f"{title}: none (no traffic)"
    w = max(len(f"{h.src} -> {h.dst}") for h in rows)
    out = [
        f"{title:<{w}}  {'load Gb/s':>10}  {'util':>6}  {'flows':>6}  {'limited':>7}  {'wait':>6}  {'XmitWait/s':>11}"
    ]
    for h in rows:
        out.append(
            f"{h.src + ' -> ' + h.dst:<{w}}  {h.load_gbps:>10.1f}  {h.utilization:>6.3f}  {h.flows:>6}  "
            f"{h.bottlenecked:>7}  {h.xmit_wait:>6.3f}  {h.xmit_wait_per_s:>11.4g}"
        )
    return "\n".join(out)


def cmd_ebb(args: argparse.Namespace) -> int:
    from sm.analysis.flowmodel import effective_bisection_bandwidth
    from sm.routing.base import Routes, make_engine

    fabric, lids = _load(args.topology)
    results: list[dict[str, Any]] = []
    for name in args.engine:
        try:
            out = make_engine(name).compute(fabric, lids)
            engine, lft = name, out.lft if isinstance(out, Routes) else out
        except RoutingError as e:
            results.append({"engine": name, "refused": str(e)})
            continue
        t0 = time.perf_counter()
        rep = effective_bisection_bandwidth(fabric, lids, lft, samples=args.samples, seed=args.seed)
        results.append({"engine": engine, **rep.as_dict(), "seconds": round(time.perf_counter() - t0, 3)})
    if all("refused" in r for r in results):
        raise IbfmError(
            f"{args.topology}: no engine could route the fabric ("
            + "; ".join(f"{r['engine']}: {r['refused']}" for r in results)
            + ")"
        )
    if args.json:
        print(json.dumps({"topology": args.topology, "results": results}, indent=2))
        return 0
    lines = [f"{args.topology}: effective bisection bandwidth, fraction of full bandwidth"]
    for r in results:
        if "refused" in r:
            lines.append(f"  {r['engine']:<8} refused: {r['refused']}")
            continue
        lines.append(
            f"  {r['engine']:<8} eBB {r['ebb']:.4f} (Hoefler et al.)  max-min {r['ebb_maxmin']:.4f}  "
            f"[{r['paper']['min']:.4f} .. {r['paper']['max']:.4f}]  {r['samples']} bisections of "
            f"{r['hosts']} hosts" + (f", {r['unrouted_flows']} unrouted flows" if r["unrouted_flows"] else "")
        )
    print("\n".join(lines))
    return 0
