#!/usr/bin/env python3
"""Congestion-model bench: one pattern on the 11,664-host fat-tree, eBB on 648 hosts.

For the 3-level fat-tree of 36-port switches (11,664 hosts, 1,620 switches),
routed by ftree (and minhop, unless ``--quick``): time (wall, plain run) and
peak memory (tracemalloc peak of a second run) of one pattern, pattern
generation included, routing not: ``shift:1``, ``random-permutation`` and
``random-bisection``. Goal: < 5 s per pattern. Prints the flow-rate figures
and the rounds of water-filling.

Then ``all-to-all`` on the 2-level k=36 tree (648 hosts, 419,256 flows), and
the effective bisection bandwidth over 100 random bisections of those 648
hosts for ftree, updn and minhop (Hoefler et al.'s congestion count and the
max-min variant), and of the 11,664 hosts (ftree and minhop).

    .venv/bin/python bench/creditflow.py [--quick]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import measure

from fabric.generate import fattree
from fabric.model import Fabric
from sm.analysis.flowmodel import effective_bisection_bandwidth, predict_congestion
from sm.analysis.patterns import parse_pattern
from sm.lidmap import LidMap, sequential_lids
from sm.routing.base import Lft, make_engine


def routed(f: Fabric, engine: str) -> tuple[LidMap, Lft, float]:
    lids = sequential_lids(f)
    t0 = time.perf_counter()
    lft = make_engine(engine).compute(f, lids)
    return lids, lft, time.perf_counter() - t0


def patterns(label: str, f: Fabric, engine: str, specs: list[str]) -> None:
    lids, lft, dt = routed(f, engine)
    print(f"{label}, {engine} (routed in {dt:.2f} s)")
    print(f"  {'pattern':<20} {'flows':>8} {'time s':>7} {'peak MB':>8} {'rounds':>6} {'min':>6} {'mean':>6} "
          f"{'max':>6} {'sat links':>9} {'waiting':>8}")
    for spec in specs:
        rep, t, peak = measure(lambda spec=spec: predict_congestion(f, lids, lft, parse_pattern(spec, f, lids)))
        s = rep.flow_stats()
        flag = "" if t < 5.0 else "  (over the 5 s goal)"
        print(
            f"  {spec:<20} {s['flows']:>8} {t:>7.2f} {peak / 2**20:>8.0f} {rep.rounds:>6} {s['min']:>6.3f} "
            f"{s['mean']:>6.3f} {s['max']:>6.3f} {s['saturated_links']:>9} {s['waiting_ports']:>8}{flag}",
            flush=True,
        )


def ebb(label: str, f: Fabric, engines: list[str], samples: int) -> None:
    print(f"{label}: eBB over {samples} random bisections")
    for engine in engines:
        lids, lft, _ = routed(f, engine)
        t0 = time.perf_counter()
        rep = effective_bisection_bandwidth(f, lids, lft, samples=samples)
        dt = time.perf_counter() - t0
        d = rep.as_dict()
        print(
            f"  {engine:<7} eBB {rep.ebb:.4f} (Hoefler et al., range {d['paper']['min']:.4f}..{d['paper']['max']:.4f},"
            f" sd {d['paper']['stdev']:.4f})  max-min {rep.ebb_maxmin:.4f}  {dt:.2f} s",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="k=12 trees instead of k=36, ftree only on the big one")
    args = ap.parse_args()
    k = 12 if args.quick else 36
    big = fattree(3, k)
    small = fattree(2, k)
    hosts_big, hosts_small = int(big.cas.size), int(small.cas.size)
    engines = ["ftree"] if args.quick else ["ftree", "minhop"]
    for engine in engines:
        specs = ["shift:1", "random-permutation", "random-bisection"]
        patterns(f"3-level k={k} ({hosts_big} hosts)", big, engine, specs)
    patterns(f"2-level k={k} ({hosts_small} hosts)", small, "ftree", ["all-to-all", "random-permutation"])
    ebb(f"2-level k={k} ({hosts_small} hosts)", small, ["ftree", "updn", "minhop"], 100)
    ebb(f"3-level k={k} ({hosts_big} hosts)", big, engines, 100)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS {rss:.0f} MB")


if __name__ == "__main__":
    main()
