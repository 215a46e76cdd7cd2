"""Emulator figures on the k=36 3-level fat-tree: load time and memory, SMPs answered per second.

Run: ``.venv/bin/python bench/bench_emulator.py [radix]``. Prints figures; asserts nothing.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
import tracemalloc

import numpy as np

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.mad import Method, PerfAttr, SmpAttr, perf_mad, smp_dr
from sm.lidmap import sequential_lids
from sm.transport.emulated import EmulatedTransport


def _rss_mib() -> float:
    """Peak resident set size of the process."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _rss_now_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def main() -> None:
    radix = int(sys.argv[1]) if len(sys.argv) > 1 else 36
    t0 = time.perf_counter()
    fab = fattree(3, radix)
    t1 = time.perf_counter()
    print(f"fat-tree k={radix}: {fab.summary()} generated in {t1 - t0:.2f} s, peak RSS {_rss_mib():.0f} MiB")

    rss0 = _rss_now_mib()
    t0 = time.perf_counter()
    emu = EmulatedFabric(fab)
    t1 = time.perf_counter()
    print(
        f"EmulatedFabric load: {t1 - t0:.2f} s, RSS +{_rss_now_mib() - rss0:.0f} MiB, "
        f"process peak RSS {_rss_mib():.0f} MiB"
    )
    tracemalloc.start()
    EmulatedFabric(fab)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"EmulatedFabric load under tracemalloc: {peak / 2**20:.0f} MiB allocated at peak")

    # A discovery's worth of DR Gets: NodeInfo of every node, PortInfo of every port.
    t0 = time.perf_counter()
    paths = emu.dr_paths()
    print(f"DR paths to all {len(paths)} nodes (one BFS): {time.perf_counter() - t0:.2f} s")
    hops = np.array([len(p) for p in paths if p is not None])
    ni = [smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, n + 1, p) for n, p in enumerate(paths) if p is not None]
    pi = [
        smp_dr(Method.GET, SmpAttr.PORT_INFO, q, n + 1, p)
        for n, p in enumerate(paths)
        if p is not None
        for q in (range(1, int(fab.nports[n]) + 1) if fab.is_switch(n) else (0,))
    ]
    print(f"paths: {hops.min()}-{hops.max()} hops, mean {hops.mean():.1f}")
    for label, mads in (("NodeInfo", ni), ("PortInfo", pi)):
        for rnd in ("cold", "warm"):
            t0, c0 = time.perf_counter(), time.process_time()
            for m in mads:
                emu.process(m)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            print(
                f"DR {label} Get, {len(mads)} SMPs ({rnd}): {len(mads) / dt:,.0f} SMPs/s wall, "
                f"{len(mads) / dc:,.0f} SMPs/s CPU"
            )

    # The same NodeInfo Gets through the transport (asyncio, window 64), as the SM sends them.
    reqs = list(zip(ni, [p for p in paths if p is not None], strict=True))

    async def through_transport() -> None:
        async with EmulatedTransport(emu, window=64) as t:
            t0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(t.send(m, p) for m, p in reqs))
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            print(f"EmulatedTransport.send x{len(reqs)}: {len(reqs) / dt:,.0f}/s wall, {len(reqs) / dc:,.0f}/s CPU")
            t0, c0 = time.perf_counter(), time.process_time()
            out = await t.send_many(reqs)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            print(f"EmulatedTransport.send_many x{len(out)}: {len(out) / dt:,.0f}/s wall, {len(out) / dc:,.0f}/s CPU")

    asyncio.run(through_transport())

    # PerfMgt over the programmed subnet: PortCounters of every CA port (LID routed).
    lids = sequential_lids(fab)
    lft = _minhop_lft(emu, lids.base)
    t0 = time.perf_counter()
    emu.apply_subnet(lids.base, 0, lft)
    print(f"apply_subnet (LIDs, LFTs, ACTIVE): {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    emu.advance(1.0)
    print(f"advance(1 s) on every ACTIVE port: {time.perf_counter() - t0:.3f} s")
    ca_lids = lids.base[fab.cas, 1].astype(int).tolist()
    data = bytes([0, 1]) + bytes(190)
    mads = [perf_mad(Method.GET, PerfAttr.PORT_COUNTERS, 0, i + 1, data) for i in range(len(ca_lids))]
    t0, c0 = time.perf_counter(), time.process_time()
    ok = sum(emu.process(m, lid) is not None for m, lid in zip(mads, ca_lids, strict=True))
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"PerfMgt PortCounters Gets, LID routed (up to 5 switches there and back): "
        f"{len(mads) / dt:,.0f} MADs/s wall, {len(mads) / dc:,.0f} MADs/s CPU, {ok}/{len(mads)} answered"
    )
    print(f"process peak RSS {_rss_mib():.0f} MiB")


def _minhop_lft(emu: EmulatedFabric, base: np.ndarray) -> np.ndarray:
    """Shortest-path LFT by BFS from every LID owner over switch links (bench only)."""
    fab = emu.fabric
    sw = fab.switches
    row = {int(n): i for i, n in enumerate(sw)}
    max_lid = int(base.max())
    lft = np.full((sw.size, max_lid + 1), 255, np.uint8)
    # group by the switch each LID sits on (switch itself, or a CA's leaf)
    by_switch: dict[int, list[tuple[int, int]]] = {}
    for n, p in np.argwhere(base > 0).tolist():
        lid = int(base[n, p])
        if fab.is_switch(n):
            lft[row[n], lid] = 0
            by_switch.setdefault(n, []).append((lid, -1))
        else:
            leaf, lp = int(fab.peer_node[n, p]), int(fab.peer_port[n, p])
            lft[row[leaf], lid] = lp
            by_switch.setdefault(leaf, []).append((lid, -1))
    nbr = {int(s): [(p, m, q) for p, m, q in fab.neighbours(int(s)) if fab.is_switch(m)] for s in sw}
    for s, entries in by_switch.items():
        lids_here = np.array([lid for lid, _ in entries])
        seen = {s}
        frontier = [s]
        while frontier:
            nxt = []
            for a in frontier:
                for _, b, q in nbr[a]:
                    if b not in seen:
                        seen.add(b)
                        lft[row[b], lids_here] = q
                        nxt.append(b)
            frontier = nxt
    return lft


if __name__ == "__main__":
    main()
