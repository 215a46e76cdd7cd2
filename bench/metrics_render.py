#!/usr/bin/env python3
"""/metrics render time and size on the emulated k=36 3-level fat-tree (11,664 hosts, ~70,000 ports).

Brings the subnet up with a heavy sweep (FabricManager over EmulatedTransport),
binds a PerfManager and runs counter sweeps with random per-port traffic, then
renders the Prometheus exposition with :class:`exporters.prometheus.MetricsRenderer`:

- cold: first render (label matrices built, every family rendered and compressed);
- cached: the same inputs again (nothing changed: the kept segments);
- OpenMetrics of the same inputs (only headers differ: the families' segments are reused);
- after a counter sweep: only the families whose values changed are rendered;
- after a new heavy sweep with the same topology: labels reused;
- each shard of ``--shards`` and each ``collect[]`` group alone: time and gzipped size.

The prediction is a per-port array built from the emulated traffic (utilization =
transmit rate / link rate), standing in for the congestion model. Goal: < 1 s per
render. Prints figures; asserts nothing.

    .venv/bin/python bench/metrics_render.py [--radix 36] [--collector]

``--collector`` also times the prometheus_client path (FabricCollector +
generate_latest), which builds one sample object per series.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporters import metrics as M
from exporters.prometheus import (
    EVERYTHING,
    FabricCollector,
    MetricsInputs,
    MetricsRenderer,
    PortPrediction,
    Selection,
    SweepStats,
)
from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.model import link_bytes_per_s
from sm.perf.perfmgr import PerfManager
from sm.sweep.manager import FabricManager, SubnetSnapshot
from sm.transport.emulated import EmulatedTransport

GOAL_SECONDS = 1.0


@dataclass
class RandomTraffic:
    """Every live port sends at a random fraction of 4x NDR, with XmitWait on a few of them."""

    seed: int = 1

    def rates(
        self, emu: EmulatedFabric
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        rng = np.random.default_rng(self.seed)
        self.seed += 1
        live = emu.data_mask()
        b = np.where(live, rng.uniform(0.0, 50e9, live.shape), 0.0)
        w = np.where(live & (rng.random(live.shape) < 0.05), rng.uniform(0, 1e6, live.shape), 0.0)
        return b, b / 4096.0, w


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _prediction(snap: SubnetSnapshot, pm: PerfManager) -> PortPrediction:
    f = snap.fabric
    rate = link_bytes_per_s(f.width_active, f.speed_active)
    xmit = np.nan_to_num(pm.rates["xmit_data_bytes"])
    util = np.divide(xmit, rate, out=np.zeros_like(rate), where=rate > 0)
    return PortPrediction(f, util, np.nan_to_num(pm.rates["xmit_wait"]))


def _line(what: str, r: MetricsRenderer, dt: float) -> None:
    s = r.stats
    mark = "ok" if dt < GOAL_SECONDS else "ABOVE GOAL"
    print(
        f"{what:<40} {dt:7.3f} s  {s.bytes / 1e6:7.1f} MB text, {s.gzip_bytes / 1e6:6.2f} MB gzipped  "
        f"{s.families} families, {s.families_rendered} rendered{' (cached)' if s.cached else ''}  [{mark}]"
    )


async def main(radix: int, collector: bool, shards: int) -> None:
    t0 = time.perf_counter()
    fab = fattree(3, radix)
    emu = EmulatedFabric(fab, traffic=RandomTraffic())
    transport = EmulatedTransport(emu, window=64, timeout=1.0)
    print(f"fat-tree k={radix}: {fab.summary()}, emulator loaded in {time.perf_counter() - t0:.1f} s")
    mgr = FabricManager(transport)
    t0 = time.perf_counter()
    snap = await mgr.heavy_sweep()
    print(f"heavy sweep (bring-up): {time.perf_counter() - t0:.1f} s, up={snap.up}, engine {snap.engine}")
    stats = SweepStats()
    stats.record(snap)
    pm = PerfManager(transport, clock=lambda: emu.time)
    pm.bind(snap)
    for _ in range(2):
        emu.advance(10.0)
        await pm.sweep()
    print(f"PerfManager: {pm.sweeps} sweeps, {int(pm.read_ok.sum()):,} ports read")

    state = {"inputs": MetricsInputs(snap, pm, _prediction(snap, pm), stats)}
    r = MetricsRenderer(lambda: state["inputs"])

    def timed(what: str, openmetrics: bool = False, sel: Selection = EVERYTHING) -> None:
        t = time.perf_counter()
        r.exposition(openmetrics, sel)
        _line(what, r, time.perf_counter() - t)

    timed("cold render")
    t = time.perf_counter()
    out = r.exposition().text()
    dt = time.perf_counter() - t
    series = sum(1 for line in out.splitlines() if line and not line.startswith(b"#"))
    print(f"  {series:,} series, {len(out) / max(series, 1):.0f} bytes per line; inflating the kept segments "
          f"(a scraper without gzip): {dt:.3f} s")
    del out
    timed("again, nothing changed")
    timed("OpenMetrics, same inputs", True)
    emu.advance(10.0)
    await pm.sweep()
    timed("after a counter sweep")
    state["inputs"] = MetricsInputs(snap, pm, _prediction(snap, pm), stats)
    timed("after a new prediction")
    emu.advance(10.0)
    t0 = time.perf_counter()
    snap2 = await mgr.heavy_sweep()
    print(f"heavy sweep 2: {time.perf_counter() - t0:.1f} s (same topology)")
    stats.record(snap2)
    pm.bind(snap2)
    await pm.sweep()
    state["inputs"] = MetricsInputs(snap2, pm, _prediction(snap2, pm), stats)
    timed("after heavy sweep + counter sweep")
    t = time.perf_counter()
    out = await r.exposition_async()
    print(f"{'exposition_async, cached':<40} {time.perf_counter() - t:7.3f} s  {len(out.segments)} segments")
    for i in range(shards):
        timed(f"OpenMetrics shard={i}/{shards}", True, Selection(shard=(i, shards)))
    for g in M.GROUPS:
        timed(f"OpenMetrics collect[]={g}", True, Selection(frozenset({g})))
    print(f"process peak RSS: {_rss_mib():.0f} MiB")

    if collector:
        from prometheus_client import CollectorRegistry, generate_latest

        reg = CollectorRegistry()
        reg.register(FabricCollector(lambda: state["inputs"]))
        t = time.perf_counter()
        text = generate_latest(reg)
        print(f"{'prometheus_client generate_latest':<40} {time.perf_counter() - t:7.3f} s  {len(text) / 1e6:8.1f} MB")
        print(f"process peak RSS: {_rss_mib():.0f} MiB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--radix", type=int, default=36)
    ap.add_argument("--collector", action="store_true", help="also time the prometheus_client collector path")
    ap.add_argument("--shards", type=int, default=4, help="render each of this many shards")
    a = ap.parse_args()
    asyncio.run(main(a.radix, a.collector, a.shards))
