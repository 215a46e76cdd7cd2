#!/usr/bin/env python3
"""Scale bench: the 3-level fat-tree of 36-port switches (11,664 hosts, 1,620 switches).

Prints, per step, wall time and peak memory: generate (fabric.generate.fattree),
write (ibsim net file), parse (read it back), load (fabric.emulator.EmulatedFabric),
then how many SMPs per second the emulator answers (NodeInfo and PortInfo Gets
by directed route from host-00000, built with fabric.mad).

Time is measured in a plain run; peak memory in a second run of the same step
under tracemalloc (Python and numpy allocations; not the interpreter's baseline),
so tracing never slows the timed run. Goals: each step < 5 s and < 2 GiB,
>= 50,000 SMP/s. Steps whose module is missing print "n/a".

    .venv/bin/python bench/fabric_scale.py [--radix 36] [--levels 3] [--smps 100000]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import measure

from fabric.emulator import EmulatedFabric
from fabric.formats.netfile import read_net, write_net
from fabric.generate import fattree
from fabric.model import Fabric

GOAL_SECONDS = 5.0
GOAL_BYTES = 2 << 30
GOAL_SMP_RATE = 50_000


def smp_rate(emu: Any, fabric: Fabric, n_smps: int) -> tuple[float, int]:
    """(SMPs answered per second, how many answered) by ``emu.process``, from the emulator's SM port."""
    mad = importlib.import_module("fabric.mad")
    paths = {n: p for n, p in enumerate(emu.dr_paths()) if p is not None}
    targets = sorted(paths)
    requests = []
    for i in range(n_smps):
        node = targets[i % len(targets)]
        if i % 2:
            req = mad.smp_dr(mad.Method.GET, mad.SmpAttr.NODE_INFO, 0, i + 1, paths[node])
        else:
            port = 1 if fabric.is_switch(node) else 0
            req = mad.smp_dr(mad.Method.GET, mad.SmpAttr.PORT_INFO, port, i + 1, paths[node])
        requests.append(req)
    process = emu.process
    gc.collect()
    t0 = time.perf_counter()
    ok = sum(1 for req in requests if process(req) is not None)
    dt = time.perf_counter() - t0
    return len(requests) / dt, ok


def fmt_time(s: float | None) -> str:
    return "n/a" if s is None else f"{s:7.2f} s"


def fmt_mem(b: int | None) -> str:
    return "n/a" if b is None else f"{b / 2**20:8.1f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--radix", type=int, default=36)
    ap.add_argument("--levels", type=int, default=3, choices=(2, 3))
    ap.add_argument("--smps", type=int, default=100_000, help="SMPs to time against the emulator")
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    args = ap.parse_args(argv)
    mem = not args.no_memory
    rows: list[tuple[str, float | None, int | None, str]] = []

    fabric, dt, peak = measure(lambda: fattree(args.levels, args.radix), memory=mem)
    s = fabric.summary()
    rows.append(("generate", dt, peak, f"{s['switches']} switches, {s['cas']} CAs, {s['ports']} ports"))

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"fattree-{args.levels}-{args.radix}.net")
        _, dt, peak = measure(lambda: write_net(fabric, path), memory=mem)
        rows.append(("write net file", dt, peak, f"{os.path.getsize(path) / 2**20:.1f} MiB"))
        parsed, dt, peak = measure(lambda: read_net(path), memory=mem)
        same = parsed.summary() == s
        rows.append(("parse net file", dt, peak, "round trip " + ("ok" if same else "DIFFERS")))

    emu = None
    try:
        emu, dt, peak = measure(lambda: EmulatedFabric(fabric), memory=mem)
        rows.append(("load emulator", dt, peak, ""))
    except Exception as e:  # a broken step still lets the table print
        rows.append(("load emulator", None, None, f"failed: {type(e).__name__}: {e}"))

    rate = None
    if emu is not None:
        try:
            rate = smp_rate(emu, fabric, args.smps)
        except Exception as e:
            print(f"SMP/s: failed: {type(e).__name__}: {e}", file=sys.stderr)
    print(f"fat-tree levels={args.levels} radix={args.radix}; memory: tracemalloc peak of a second run")
    print(f"{'step':<16} {'time':>10} {'peak memory':>13}  goal   note")
    for name, t, m, note in rows:
        good = t is not None and t < GOAL_SECONDS and (m is None or m < GOAL_BYTES)
        mark = "ok" if good else ("-" if t is None else "MISS")
        print(f"{name:<16} {fmt_time(t):>10} {fmt_mem(m):>13}  {mark:<5}  {note}")
    if rate is None:
        print(f"{'SMP/s':<16} {'n/a':>10}")
    else:
        per_s, ok = rate
        mark = "ok" if per_s >= GOAL_SMP_RATE else "MISS"
        print(f"{'SMP/s':<16} {per_s:>10,.0f} {'':>13}  {mark:<5}  {ok} of {args.smps} answered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
