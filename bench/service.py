#!/usr/bin/env python3
"""The daemon under load: /metrics and route queries over loopback HTTP on the emulated fat-tree.

Runs the real :class:`ibfm.service.Service` (emulated 3-level fat-tree of
``--radix``-port switches; k=36: 11,664 hosts, 1,620 switches, ~70,000
ports) in this process, waits for the first heavy sweep and the congestion
prediction, runs two counter sweeps, then measures over HTTP on loopback:

- ``GET /metrics``: cold (rendered), cached, and after a counter sweep: time and size;
- ``GET /api/v1/routes``: random host pairs from a client in a separate process
  (aiohttp), open loop at ``--rate`` requests/s for ``--seconds`` s (latency from
  each request's scheduled send time, so a stall counts), then closed loop at
  ``--concurrency`` for the highest rate; goal p99 < 10 ms at 1,000 req/s;
- one request each to the heavier endpoints (validation, congestion, what-if).

Bounded in count and time; prints figures, asserts nothing. bench/metrics_render.py
(the exporter's own bench) breaks the render time down further.

    .venv/bin/python bench/service.py [--radix 36] [--rate 1000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

GOAL_P99_MS = 10.0


# -- the load generator (runs in a child process) --------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


async def _client(url: str, names: list[str], rate: float, seconds: float, concurrency: int) -> dict[str, Any]:
    rng = random.Random(1)
    loop = asyncio.get_running_loop()
    out: dict[str, Any] = {}
    conn = aiohttp.TCPConnector(limit=max(concurrency, 32))
    async with aiohttp.ClientSession(connector=conn) as s:

        async def get(a: str, b: str) -> int:
            async with s.get(url + "/api/v1/routes", params={"src": a, "dst": b}) as r:
                await r.read()
                return r.status

        for _ in range(300):  # warm-up: connections, the snapshot's lookup tables
            await get(rng.choice(names), rng.choice(names))

        # open loop at a fixed rate
        n = int(rate * seconds)
        sched: list[float] = []
        service: list[float] = []
        errors = 0
        sem = asyncio.Semaphore(max(concurrency, 32))  # requests beyond wait here, and their wait counts

        async def one(intended: float, a: str, b: str) -> None:
            nonlocal errors
            async with sem:
                t = loop.time()
                st = await get(a, b)
                done = loop.time()
            if st != 200:
                errors += 1
            sched.append(done - intended)
            service.append(done - t)

        t0 = loop.time() + 0.05
        tasks = []
        for i in range(n):
            at = t0 + i / rate
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(at, rng.choice(names), rng.choice(names))))
        await asyncio.gather(*tasks)
        took = loop.time() - t0
        ms = [x * 1e3 for x in sched]
        sv = [x * 1e3 for x in service]
        out["open"] = {
            "requests": n,
            "errors": errors,
            "achieved_rps": n / took,
            "p50_ms": _pct(ms, 50),
            "p90_ms": _pct(ms, 90),
            "p99_ms": _pct(ms, 99),
            "max_ms": max(ms),
            "service_p99_ms": _pct(sv, 99),
        }

        # closed loop: as fast as `concurrency` workers go
        lat: list[float] = []
        stop_at = loop.time() + min(seconds, 5.0)

        async def worker() -> None:
            while loop.time() < stop_at:
                t = loop.time()
                await get(rng.choice(names), rng.choice(names))
                lat.append((loop.time() - t) * 1e3)

        t1 = loop.time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        took = loop.time() - t1
        out["closed"] = {"requests": len(lat), "rps": len(lat) / took, "p50_ms": _pct(lat, 50),
                         "p99_ms": _pct(lat, 99), "concurrency": concurrency}
    return out


def client_main(args: argparse.Namespace) -> None:
    names = Path(args.names).read_text().split()
    res = asyncio.run(_client(args.url, names, args.rate, args.seconds, args.concurrency))
    print(json.dumps(res))


# -- the server side ----------------------------------------------------------------------------------------------


async def _http(session: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, bytes, float]:
    t = time.perf_counter()
    async with session.request(method, url, timeout=aiohttp.ClientTimeout(total=600), **kw) as r:
        body = await r.read()
        return r.status, body, time.perf_counter() - t


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def server_main(args: argparse.Namespace) -> None:
    from ibfm.service import Service, configure_logging
    from ibfm.settings import load_settings

    configure_logging("WARNING")
    settings = load_settings(None, {
        "listen": "127.0.0.1:0",
        "fabric.fattree_levels": args.levels,
        "fabric.fattree_radix": args.radix,
        "sm.sweep_interval": 3600,
        "perfmgr.interval": 3600,
        "api.token": "bench-token-123",
    })
    t0 = time.perf_counter()
    svc = Service(settings)
    f = svc.emulator.fabric if svc.emulator is not None else None
    assert f is not None
    print(f"fat-tree levels={args.levels} k={args.radix}: {f.summary()}; service built in "
          f"{time.perf_counter() - t0:.1f} s")
    stop = asyncio.Event()
    started = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(svc.run(stop, started=lambda a: started.set_result(a)))
    host, port = await started
    base = f"http://{host}:{port}"
    t0 = time.perf_counter()
    while svc.manager.snapshot is None:
        await asyncio.sleep(0.2)
        if time.perf_counter() - t0 > 900:
            raise SystemExit("no heavy sweep within 15 minutes")
    snap = svc.manager.snapshot
    print(f"first heavy sweep: {time.perf_counter() - t0:.1f} s (engine {snap.engine}, up={snap.up}); phases "
          + ", ".join(f"{k} {v:.1f}s" for k, v in snap.phases.items()))
    t0 = time.perf_counter()
    while svc._predict_task is None or not svc._predict_task.done():
        await asyncio.sleep(0.1)
    print(f"congestion prediction ({settings.fabric.traffic}): {time.perf_counter() - t0:.1f} s after the sweep")
    pm = svc.perfmgr
    for _ in range(2):
        svc._advance_emulator()
        t = time.perf_counter()
        rep = await pm.sweep()
        print(f"counter sweep {rep.sweep}: {time.perf_counter() - t:.2f} s, {rep.ports_read:,} of {rep.ports:,} ports")
        await asyncio.sleep(1.0)

    async with aiohttp.ClientSession() as s:
        for what in ("cold", "cached"):
            st, body, dt = await _http(s, "GET", base + "/metrics")
            print(f"GET /metrics {what:<22} {dt:7.3f} s  {len(body) / 1e6:6.1f} MB  status {st}")
        svc._advance_emulator()
        await pm.sweep()
        st, body, dt = await _http(s, "GET", base + "/metrics")
        print(f"GET /metrics {'after a counter sweep':<22} {dt:7.3f} s  {len(body) / 1e6:6.1f} MB  status {st}")
        r = getattr(svc, "renderer", None)
        if r is not None:
            print(f"  renderer: {r.stats.seconds:.3f} s, {r.stats.families} families, "
                  f"{r.stats.families_rendered} re-rendered")

        import os

        print(f"load average before the route runs: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
              "(other work on the machine shows in the latencies)")
        names = [snap.fabric.names[i] for i in snap.fabric.cas.tolist()]
        names_file = Path("/tmp") / f"ibfm-bench-names-{port}.txt"
        names_file.write_text("\n".join(names))
        cmd = [sys.executable, __file__, "--client", "--url", base, "--names", str(names_file), "--rate",
               str(args.rate), "--seconds", str(args.seconds), "--concurrency", str(args.concurrency)]
        # the child inherits this process's niceness
        pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        started_at: list[float] = [0.0]

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                started_at[0] = time.perf_counter()
            else:
                pauses[info["generation"]].append(time.perf_counter() - started_at[0])

        gc.callbacks.append(on_gc)
        cpu0 = time.process_time()
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=args.seconds * 4 + 120)
        cpu = time.process_time() - cpu0
        gc.callbacks.remove(on_gc)
        names_file.unlink(missing_ok=True)
        res = json.loads(out.decode().strip().splitlines()[-1])
        o, c = res["open"], res["closed"]
        mark = "ok" if o["p99_ms"] < GOAL_P99_MS and o["errors"] == 0 else "ABOVE GOAL"
        print(f"routes, open loop {args.rate:.0f} req/s x {args.seconds:.0f} s: {o['requests']:,} requests, "
              f"{o['errors']} errors, {o['achieved_rps']:.0f} req/s; latency p50 {o['p50_ms']:.2f} ms, "
              f"p90 {o['p90_ms']:.2f}, p99 {o['p99_ms']:.2f}, max {o['max_ms']:.1f} "
              f"(service p99 {o['service_p99_ms']:.2f}) [{mark}: p99 < {GOAL_P99_MS:.0f} ms]")
        total = o["requests"] + c["requests"] + 300
        print(f"server CPU: {cpu:.1f} s for {total:,} route requests = {cpu / total * 1e6:.0f} us each "
              f"(one core serves {total / cpu:.0f} req/s; independent of other load)")
        print("server GC during the route runs: " + ", ".join(
            f"gen{g} {len(p)}x max {max(p, default=0) * 1e3:.1f} ms" for g, p in pauses.items()))
        print(f"routes, closed loop x{c['concurrency']}: {c['rps']:.0f} req/s, p50 {c['p50_ms']:.2f} ms, "
              f"p99 {c['p99_ms']:.2f} ms ({c['requests']:,} requests)")

        core = next(n for n in snap.fabric.names if n.startswith(("core-", "spine-")))
        leaf = next(n for n in snap.fabric.names if n.startswith("leaf-"))
        for method, path, kw in (
            ("GET", "/api/v1/health", {}),
            ("GET", "/api/v1/nodes?type=switch&limit=100", {}),
            ("GET", f"/api/v1/switches/{leaf}/lft", {}),
            ("GET", f"/api/v1/switches/{leaf}/lft?format=ibroute", {}),
            ("GET", "/api/v1/validation", {}),
            ("GET", "/api/v1/validation", {}),
            ("GET", "/api/v1/congestion?pattern=shift:1", {}),
            ("GET", "/api/v1/congestion?pattern=shift:1", {}),
            ("POST", "/api/v1/whatif", {"json": {"switches": [core], "max_shifts": 8}}),
        ):
            st, body, dt = await _http(s, method, base + path, **kw)
            print(f"{method:<4} {path:<55} {dt:8.3f} s  {len(body) / 1e3:9.1f} kB  status {st}")
    stop.set()
    await task
    print(f"process peak RSS: {_rss_mib():.0f} MiB")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, choices=(2, 3), default=3)
    ap.add_argument("--radix", type=int, default=36)
    ap.add_argument("--rate", type=float, default=1000.0, help="open-loop route queries per second")
    ap.add_argument("--seconds", type=float, default=10.0, help="open-loop duration")
    ap.add_argument("--concurrency", type=int, default=16, help="closed-loop workers")
    ap.add_argument("--nice", type=int, default=0,
                    help="niceness increment for server and client (negative, as root: less noise from other work)")
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--names", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.nice:
        import os

        os.nice(a.nice)
    if a.client:
        client_main(a)
    else:
        asyncio.run(server_main(a))
