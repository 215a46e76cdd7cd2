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

``--deadlock`` (ibsim, opensm and infiniband-diags needed): the layered engine beside OpenSM's
``dfsssp`` and ``lash`` (``opensm -R ENGINE -Q``) on the same ibsim fabrics (a 2-D torus, a
dragonfly, a random regular graph, a degraded 3-level tree): per engine the routing time (ibfm:
in-process compute; OpenSM: its log from MASTER to "tables configured"), the VLs the routes use,
the worst shift and random-permutation link load, and whether the per-VL channel dependency graph
is free of cycles. OpenSM's LFTs are read back with ``ibroute`` and judged on the generated
fabric, by GUID (:func:`onto`), so every engine meets the same host order in the patterns; its
VLs are what its log says it needs (see :func:`run_opensm`); the layered engine's come from its
own layers. Then the layered engine's compute time on the 11,664-host degraded 3-level k=36 tree
and an 11,664-host dragonfly, and its two steps (routes, layers) timed apart (``--big``).

    .venv/bin/python bench/routing.py [--quick] [--shifts 512]
    .venv/bin/python bench/routing.py --deadlock [--big]
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import measure

from fabric.generate import degrade, dragonfly, fattree, random_regular, torus
from fabric.model import Fabric
from sm.analysis.creditflow import channel_dependency_graph, find_credit_loops
from sm.analysis.verify import shift_quality, verify_routes
from sm.lidmap import LidMap, sequential_lids
from sm.routing.base import (
    Layers,
    Lft,
    RoutingError,
    RoutingOptions,
    RoutingResult,
    engine_names,
    make_engine,
    route,
)
from sm.routing.layered import assign_layers, balanced_lft

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


# -- deadlock-free engines beside OpenSM's ----------------------------------------------------------------

DEADLOCK_FABRICS = {
    "torus 4x4 x3": lambda speed: torus([4, 4], 3, radix=8, speed=speed),
    "dragonfly 5x3 x2": lambda speed: dragonfly(5, 3, 2, 2, speed=speed),
    "random 16x4 x2": lambda speed: random_regular(16, 4, 2, seed=1, speed=speed),
    "3L k=6 -6 links": lambda speed: degrade(fattree(3, 6, speed=speed), links=6, seed=3),
}


def pattern_loads(f: Fabric, lids: LidMap, lft: Lft, perms: int = 16) -> tuple[int, int]:
    """Worst directed inter-switch link load over every shift, and over ``perms`` random permutations."""
    from sm.analysis.patterns import random_permutation
    from sm.analysis.verify import link_loads

    q = shift_quality(f, lids, lft)
    sw = f.switches
    worst = max(int(link_loads(f, lids, lft, random_permutation(f, lids, s).pairs())[sw].max()) for s in range(perms))
    return q.max_load, worst


def onto(f: Fabric, rf: Fabric, rlids: LidMap, rlft: Lft) -> tuple[LidMap, Lft]:
    """Routes read back (fabric ``rf`` as ``ibnetdiscover`` saw it) on the generated fabric ``f``: the
    same LIDs and LFTs, nodes matched by GUID, so every engine is judged with the same host order
    (``ibnetdiscover`` lists nodes in discovery order, which changes which hosts a shift pairs)."""
    base = np.zeros(f.port_exists.shape, np.uint16)
    width = min(base.shape[1], rlids.base.shape[1])
    node = np.array([f.by_guid(int(g)) for g in rf.node_guid.tolist()], np.int64)
    base[node, :width] = rlids.base[:, :width]
    row_of = {int(rf.node_guid[s]): i for i, s in enumerate(rf.switches.tolist())}
    rows = np.array([row_of[int(f.node_guid[s])] for s in f.switches.tolist()], np.int64)
    return LidMap.from_base(base), np.ascontiguousarray(rlft[rows])


def run_opensm(engine: str, f: Fabric, work: Path, host: str, tool_host: str) -> tuple[str, ...]:
    """``opensm --once -R engine -Q`` on ibsim; LFTs read back, VLs from its log; one table row.

    The SLs are not read back: OpenSM as a daemon (needed to answer ``saquery``) stalled after
    entering MASTER on ibsim in this bench, so the VLs are what OpenSM logs ("Virtual Lanes needed",
    LASH's layers) and "deadlock-free" is its own claim, marked ``(claimed)``; on one VL the same
    LFTs are checked (``1 VL:`` loops or none).
    """
    from bench._readback import read_back
    from bench.vs_opensm import Result, opensm_log_phases, sim_args
    from fabric.formats.netfile import write_net
    from fabric.ibsim import IbsimProcess

    work.mkdir(parents=True)
    net = work / "fabric.net"
    write_net(f, net)
    log = work / "opensm.log"
    with IbsimProcess(net, extra_args=sim_args(f)) as sim:
        env = sim.env(sim_host=host)
        cp = subprocess.run(
            ["opensm", "--once", "-e", "-f", str(log), "-R", engine, "-Q", "--dump_files_dir", str(work)],
            env=dict(env, OSM_CACHE_DIR=str(work)), cwd=work, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        text = log.read_text(errors="replace") if log.exists() else ""
        if cp.returncode != 0 or "SUBNET UP" not in text:
            return (f"osm-{engine}", f"exit {cp.returncode}", "", "", "", "")
        res = Result("", engine)
        opensm_log_phases(text, res)
        tool_cwd = work / "tools"
        tool_cwd.mkdir()
        rb = read_back(sim.env(sim_host=tool_host), tool_cwd, int(f.port_guid[f.by_name(tool_host), 1]))
    if res.engine != engine:
        return (f"osm-{engine}", f"fell back to {res.engine}", "", "", "", "")
    m = re.findall(r"Virtual Lanes needed: (\d+)", text)
    layers = {int(x) for x in re.findall(r"Lanes in layer (\d+)", text)}
    vls = m[-1] if m else (str(max(layers) + 1) if layers else "?")
    shift_max, perm_max = pattern_loads(f, *onto(f, rb.fabric, rb.lids, rb.lft))
    one_vl = find_credit_loops(rb.fabric, rb.lids, rb.lft, from_cas=True, max_loops=1)
    free = "yes (claimed)" + ("" if one_vl else ", 1 VL too")
    route_s = res.phases.get("route")
    return (f"osm-{engine}", "-" if route_s is None else f"{route_s:.3f}", vls, str(shift_max), str(perm_max), free)


def verdict(
    label: str, dt: float | None, f: Fabric, lids: LidMap, lft: Lft, layers: Layers | None
) -> tuple[str, ...]:
    shift_max, perm_max = pattern_loads(f, lids, lft)
    loops = find_credit_loops(f, lids, lft, layers=layers, from_cas=True, max_loops=1)
    vls = 1 if layers is None else len(np.unique(layers[:, lids.used()]))
    free = "no" if loops else "yes"
    return (label, "-" if dt is None else f"{dt:.3f}", str(vls), str(shift_max), str(perm_max), free)


def deadlock_table(big: bool) -> None:
    from fabric.ibsim import missing_ibsim_tools
    from fabric.model import Speed

    missing = missing_ibsim_tools("ibnetdiscover", "ibroute", "saquery", "opensm")
    head = f"{'fabric':<18} {'engine':<12} {'route s':>8} {'VLs':>4} {'shift':>6} {'perm':>5} {'deadlock-free':>14}"
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp:
        for name, build in DEADLOCK_FABRICS.items():
            f = build(Speed.QDR)
            lids = sequential_lids(f)
            t0 = time.perf_counter()
            out = make_engine("layered").compute(f, lids)
            dt = time.perf_counter() - t0
            assert not isinstance(out, np.ndarray)
            rows = [verdict("layered", dt, f, lids, out.lft, out.layers)]
            for other in ("updn", "minhop"):
                t0 = time.perf_counter()
                lft = make_engine(other).compute(f, lids)
                rows.append(verdict(other, time.perf_counter() - t0, f, lids, lft, None))
            if missing:
                rows.append(("osm-*", f"skipped: missing {', '.join(missing)}", "", "", "", ""))
            else:
                hosts = [f.names[i] for i in f.cas.tolist()]
                for engine in ("dfsssp", "lash"):
                    work = Path(tmp) / f"{name}-{engine}".replace(" ", "_")
                    rows.append(run_opensm(engine, f, work, hosts[0], hosts[-1]))
            for r in rows:
                print(f"{name:<18} {r[0]:<12} {r[1]:>8} {r[2]:>4} {r[3]:>6} {r[4]:>5} {r[5]:>14}", flush=True)
    print()
    print("shift / perm: most routes on one directed inter-switch link over every shift / 16 random")
    print("permutations. VLs: distinct SLs of the routes (VL = SL); OpenSM's: what its log says it needs.")
    print("deadlock-free: no cycle in the per-(link, VL) channel dependency graph of the routes from CAs;")
    print("OpenSM's is its claim (SLs not read back), '1 VL too': its LFTs have no loop even on one VL.")
    print("OpenSM's route s: its log, MASTER to 'tables configured'; ibfm's: the engine's compute in-process.")
    print("All loads on the generated fabric's host order (OpenSM's LFTs and LIDs mapped onto it by GUID).")
    if big:
        for label, build in (
            ("3L k=36 -1% links (11,664 hosts)", lambda: degrade(fattree(3, 36), fraction=0.01, seed=1)),
            ("dragonfly 81x12 x12 h=7 (11,664 hosts)", lambda: dragonfly(81, 12, 12, 7)),
        ):
            f = build()
            lids = sequential_lids(f)
            try:
                res, dt, _ = measure(lambda f=f, lids=lids: route(f, lids, ["layered"]), memory=False)
                assert isinstance(res, RoutingResult)
                vls = 1 if res.layers is None else int(res.layers.max()) + 1
                # The two steps apart (a second run): balanced routes, then their layers.
                t0 = time.perf_counter()
                lft = balanced_lft(f, lids)
                t1 = time.perf_counter()
                assign_layers(f, lids, lft, RoutingOptions().max_layers)
                t2 = time.perf_counter()
                print(
                    f"{label}: layered routes in {dt:.2f} s on {vls} VLs "
                    f"(again: balanced_lft {t1 - t0:.2f} s + assign_layers {t2 - t1:.2f} s)",
                    flush=True,
                )
            except RoutingError as e:
                print(f"{label}: layered refused: {e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small trees (k=12 2-level, k=8 3-level)")
    ap.add_argument("--shifts", type=int, default=512, help="shifts sampled on trees above 2,000 hosts")
    ap.add_argument("--engines", default="ftree,updn,minhop")
    ap.add_argument("--deadlock", action="store_true", help="layered beside OpenSM's dfsssp and lash on ibsim")
    ap.add_argument("--big", action="store_true", help="with --deadlock: layered on the 11,664-host fabrics")
    args = ap.parse_args()
    if args.deadlock:
        deadlock_table(args.big)
        return
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
