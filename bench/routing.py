#!/usr/bin/env python3
"""Routing bench: ftree, updn and minhop on fat-trees of 36-port switches, full and degraded.

For each fabric (2-level k=36: 648 hosts; 3-level k=36: 11,664 hosts), as
generated and with 1% and 5% of the inter-switch links removed
(``degrade(fraction=..., seed=1)``), and each engine, prints:

- the engine that routed: the requested one, or the fallback after it
  refused (chain ``ftree,updn,minhop`` from the requested engine on);
- route time (wall, plain run) and peak memory (tracemalloc peak of a second
  run: Python and numpy allocations made while routing);
- shift-permutation quality: the most routes on one directed inter-switch
  link ("max"), each shift's worst link averaged over shifts ("mmax",
  1.00 = every shift contention-free) and routes per directed inter-switch
  link ("mean"); every shift on 648 hosts, a random sample (``--shifts``,
  seed 1) on 11,664 hosts, the count is printed;
- pairs left unreachable by :func:`sm.analysis.verify.verify_routes` over every
  (end port, LID) pair, and among them host-to-host pairs;
- credit loops (one per cyclic strongly connected component of the channel
  dependency graph, capped at 100) over all LIDs and over CA LIDs only;
- the time verify and the credit-loop check take.

Then the 3-level k=48 fat-tree (27,648 hosts) with ftree alone: route time.
``--quick`` runs k=12 and k=8 trees instead, in a few seconds.

    .venv/bin/python bench/routing.py [--quick] [--shifts 512]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import measure

from fabric.generate import degrade, fattree
from fabric.model import Fabric
from sm.analysis.creditflow import channel_dependency_graph, find_credit_loops
from sm.analysis.verify import shift_quality, verify_routes
from sm.lidmap import LidMap, sequential_lids
from sm.routing.base import RoutingError, RoutingResult, engine_names, route

MAX_LOOPS = 100


def chain_from(engine: str) -> list[str]:
    names = engine_names()
    return names[names.index(engine) :]


HEADER = (
    f"{'fabric':<20} {'engine':<7} {'used':<14} {'route s':>8} {'peak MB':>8} {'shifts':>7} {'max':>4} "
    f"{'mmax':>6} {'mean':>6} {'unreach':>9} {'host unr':>8} {'loops':>5} {'CA lp':>5} {'verify s':>8} "
    f"{'cdg s':>6}"
)


def loops_text(n: int) -> str:
    return f"{n}+" if n >= MAX_LOOPS else str(n)


def bench_one(label: str, f: Fabric, lids: LidMap, engine: str, max_shifts: int | None) -> None:
    chain = chain_from(engine)
    try:
        res, dt, peak = measure(lambda: route(f, lids, chain), memory=True)
    except RoutingError as e:
        print(f"{label:<20} {engine:<7} no engine routed: {e}", flush=True)
        return
    assert isinstance(res, RoutingResult)
    used = res.engine if not res.refused else f"{res.engine} (fb)"
    lft = res.lft
    t0 = time.perf_counter()
    rep = verify_routes(f, lids, lft)
    t_verify = time.perf_counter() - t0
    q = shift_quality(f, lids, lft, max_shifts=max_shifts, seed=1)
    t0 = time.perf_counter()
    g = channel_dependency_graph(f, lids, lft)
    loops = find_credit_loops(f, lids, lft, graph=g, max_loops=MAX_LOOPS)
    t_cdg = time.perf_counter() - t0
    ca_loops = find_credit_loops(f, lids, lft, ca_only=True, max_loops=MAX_LOOPS)
    shifts = f"{q.shifts}" + ("*" if q.sampled else "")
    print(
        f"{label:<20} {engine:<7} {used:<14} {dt:>8.2f} {(peak or 0) / 2**20:>8.0f} {shifts:>7} "
        f"{q.max_load:>4} {q.mean_max_load:>6.2f} {q.mean_load:>6.3f} {rep.unreachable:>9} "
        f"{rep.host_unreachable:>8} {loops_text(len(loops)):>5} {loops_text(len(ca_loops)):>5} "
        f"{t_verify:>8.2f} {t_cdg:>6.2f}",
        flush=True,
    )
    for name, reason in res.refused:
        print(f"{'':<20} {'':<7} {name} refused: {reason}", flush=True)
    if q.unrouted:
        print(f"{'':<20} {'':<7} {q.unrouted} host pairs of the shifts unrouted", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small trees (k=12 2-level, k=8 3-level)")
    ap.add_argument("--shifts", type=int, default=512, help="shifts sampled on trees above 2,000 hosts")
    ap.add_argument("--engines", default="ftree,updn,minhop")
    args = ap.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    trees = [(2, 12), (3, 8)] if args.quick else [(2, 36), (3, 36)]
    big = (3, 12) if args.quick else (3, 48)
    print(HEADER)
    print("-" * len(HEADER))
    for levels, k in trees:
        base = fattree(levels, k)
        for frac in (0.0, 0.01, 0.05):
            f = base if frac == 0 else degrade(base, fraction=frac, seed=1)
            lids = sequential_lids(f)
            n_hosts = int(f.cas.size)
            label = f"{levels}L k={k} " + ("full" if frac == 0 else f"-{frac:.0%} links")
            max_shifts = args.shifts if n_hosts > 2000 else None
            for engine in engines:
                bench_one(label, f, lids, engine, max_shifts)
    print()
    print("max: most routes on one directed inter-switch link in any evaluated shift; mmax: each")
    print("shift's worst link averaged over shifts; mean: routes per directed inter-switch link.")
    print("shifts marked * are a random sample (seed 1) of all N-1 shifts. peak MB: tracemalloc peak")
    print("of a second routing run. (fb): the requested engine refused and the chain fell back.")
    print("unreach: connected (end port, LID) pairs with a broken route, switch LIDs included;")
    print("host unr: those between two CA ports. loops / CA lp: credit loops over all LIDs / CA LIDs.")
    levels, k = big
    f = fattree(levels, k)
    lids = sequential_lids(f)
    print()
    _res, dt, peak = measure(lambda: route(f, lids, ["ftree"]), memory=True)
    print(
        f"{levels}-level k={k} fat-tree ({f.cas.size} hosts, {f.switches.size} switches, "
        f"{lids.max_lid} LIDs): ftree routes in {dt:.2f} s, tracemalloc peak {(peak or 0) / 2**20:.0f} MB"
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process maxrss {rss:.0f} MB")


if __name__ == "__main__":
    main()
