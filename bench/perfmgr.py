"""Performance-manager figures on the emulated k=36 3-level fat-tree (11,664 hosts, ~70,000 ports).

Brings the subnet up with a heavy sweep, then runs full counter sweeps: the
first one reads ClassPortInfo of every node too, the next ones only
PortCounters and PortCountersExtended. Prints times, MADs sent, MADs/s and
peak memory; asserts nothing.

Run: ``.venv/bin/python bench/perfmgr.py [radix] [window] [--direct]`` (radix 36, window 64 by
default). ``--direct`` skips the SM: LIDs and ftree LFTs are computed and written straight into the
emulator (quick, for iterating on the perfmgr alone).
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.model import Fabric
from sm.lidmap import LidMap, sequential_lids
from sm.perf.perfmgr import PerfManager
from sm.routing.base import route
from sm.sweep.manager import FabricManager
from sm.transport.emulated import EmulatedTransport


@dataclass(frozen=True)
class _Subnet:
    fabric: Fabric
    lids: LidMap


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def main(radix: int, window: int, direct: bool) -> None:
    t0 = time.perf_counter()
    fab = fattree(3, radix)
    emu = EmulatedFabric(fab)
    transport = EmulatedTransport(emu, window=window, timeout=1.0)
    print(f"fat-tree k={radix}: {fab.summary()}, emulator loaded in {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    snap: _Subnet | object
    if direct:
        lids = sequential_lids(fab)
        lft = route(fab, lids, ("ftree",)).lft
        emu.apply_subnet(lids.base, 0, lft)
        snap = _Subnet(emu.fabric.copy(), lids)
        print(f"direct bring-up (LIDs, ftree, apply_subnet): {time.perf_counter() - t0:.1f} s")
    else:
        full = await FabricManager(transport).heavy_sweep()
        dt = time.perf_counter() - t0
        phases = ", ".join(f"{k} {v:.1f}" for k, v in full.phases.items())
        print(f"heavy sweep (bring-up): {dt:.1f} s, {full.smps:,} SMPs, up={full.up} ({phases})")
        snap = full
    print(f"process peak RSS after bring-up: {_rss_mib():.0f} MiB")

    pm = PerfManager(transport, clock=lambda: emu.time)
    t0 = time.perf_counter()
    pm.bind(snap)
    print(f"bind: {time.perf_counter() - t0:.2f} s, {pm.q_node.size:,} ports to query")
    for i in range(3):
        emu.advance(10.0)
        t0, c0 = time.perf_counter(), time.process_time()
        rep = await pm.sweep()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        what = "first sweep (with ClassPortInfo)" if i == 0 else f"sweep {i + 1}"
        print(
            f"{what}: {dt:.2f} s wall, {dc:.2f} s CPU, {rep.mads_sent:,} MADs sent, {rep.mads_sent / dt:,.0f} MADs/s "
            f"({rep.mads_sent / dc:,.0f}/s CPU), {rep.ports_read:,}/{rep.ports:,} ports read, "
            f"{rep.timeouts} timeouts, {rep.errors} errors"
        )
    rate = pm.rates["xmit_data_bytes"][pm.queried]
    print(f"xmit rate over the last interval: median {np.nanmedian(rate) / 1e9:.2f} GB/s per port")
    print(f"process peak RSS after the sweeps: {_rss_mib():.0f} MiB")

    # memory of the manager itself: a fresh one, bound and swept once under tracemalloc (slower)
    tracemalloc.start()
    pm2 = PerfManager(transport, clock=lambda: emu.time)
    pm2.bind(snap)
    await pm2.sweep()
    cur, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"one PerfManager, bound and swept once: {cur / 2**20:.0f} MiB held, {peak / 2**20:.0f} MiB at peak")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    radix = int(args[0]) if args else 36
    window = int(args[1]) if len(args) > 1 else 64
    asyncio.run(main(radix, window, "--direct" in sys.argv))
