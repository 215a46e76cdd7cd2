#!/usr/bin/env python3
"""The daemon under load: a real Prometheus scraping /metrics, memory, and route queries on the emulated fat-tree.

Runs the real :class:`ibfm.service.Service` (emulated 3-level fat-tree of
``--radix``-port switches; k=36: 11,664 hosts, 1,620 switches, ~70,000
ports) in this process, counter sweeps every ``--perf-interval`` s, and
samples the resident memory of this process and of its children (the
forked routing child) every 0.1 s: RSS of each (a child's RSS counts the
pages it shares with the parent) and PSS (shared pages split between them).

1. Bring-up: the first heavy sweep and the congestion prediction; peak memory.
2. Where the memory goes: the numpy arrays reachable from the service, by
   owner (arrays of 1 MB or more named), against the RSS.
3. ``GET /metrics`` as Prometheus asks it (OpenMetrics, gzip): time and size of
   the body, gzipped and as text, for the whole fabric, each of ``--shards``
   shards and each ``collect[]`` group.
4. A real Prometheus (Debian's ``prometheus``; a temporary config and TSDB,
   its own port) for ``--scrape-seconds`` s each, a fresh one per phase:
   every group of the whole fabric in one job every ``--scrape-interval`` s;
   ``dashboards/prometheus-paced.yml`` as shipped (every port's traffic
   counters every 15 s, the rest every minute); ``--shards`` jobs, one per
   shard. Per job ``scrape_duration_seconds`` and ``scrape_samples_scraped``
   of every scrape, and Prometheus's own CPU per sample (goal: < 2 s for a
   scrape of the whole fabric's traffic; gzipped body < 10 MB; peak RSS with
   the routing child < 1 GB).
5. With ``--routes``: ``GET /api/v1/routes`` from a client in a separate process
   (aiohttp), open loop at ``--rate`` requests/s for ``--seconds`` s (latency
   from each request's scheduled send time, so a stall counts), then closed loop
   at ``--concurrency``; goal p99 < 10 ms at 1,000 req/s; and one request each to
   the heavier endpoints (validation, congestion, what-if).

Bounded in count and time; prints figures, asserts nothing. bench/metrics_render.py
(the exporter's own bench) breaks the render time down further.

    .venv/bin/python bench/service.py [--radix 36] [--shards 4] [--routes]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp

GOAL_P99_MS = 10.0
NL = b"\n"
GOAL_SCRAPE_S = 2.0
GOAL_GZIP_MB = 10.0
GOAL_RSS_MIB = 1024.0
OPENMETRICS_ACCEPT = (  # what Prometheus 2.x sends
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


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


# -- memory ------------------------------------------------------------------------------------------------------


def _proc_kib(pid: int, field: str, file: str = "status") -> int:
    try:
        with open(f"/proc/{pid}/{file}") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    """The forked children of ``pid`` (the routing child): same program, not the bench's own helpers."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out += [int(x) for x in fh.read().split()]
    except OSError:
        pass
    me = os.readlink(f"/proc/{pid}/exe")
    kids = []
    for k in out:
        try:
            if os.readlink(f"/proc/{k}/exe") == me and b"--client" not in Path(f"/proc/{k}/cmdline").read_bytes():
                kids.append(k)
        except OSError:
            pass
    return kids


class MemorySampler(threading.Thread):
    """RSS and PSS of this process and its children every 0.1 s; peaks per stage."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stage = "start"
        self.peaks: dict[str, dict[str, float]] = {}
        self._halt = threading.Event()

    def mark(self, stage: str) -> None:
        self.stage = stage

    def run(self) -> None:
        me = os.getpid()
        while not self._halt.wait(0.1):
            kids = _children(me)
            rss = _proc_kib(me, "VmRSS") / 1024
            krss = sum(_proc_kib(k, "VmRSS") for k in kids) / 1024
            pss = (_proc_kib(me, "Pss", "smaps_rollup") + sum(_proc_kib(k, "Pss", "smaps_rollup") for k in kids)) / 1024
            p = self.peaks.setdefault(self.stage, {"rss": 0.0, "child_rss": 0.0, "sum_rss": 0.0, "sum_pss": 0.0})
            p["rss"] = max(p["rss"], rss)
            p["child_rss"] = max(p["child_rss"], krss)
            p["sum_rss"] = max(p["sum_rss"], rss + krss)
            p["sum_pss"] = max(p["sum_pss"], pss)

    def stop(self) -> None:
        self._halt.set()
        self.join(2)

    def report(self) -> None:
        print("peak memory by stage (MiB): daemon RSS, routing child RSS, their sum, their PSS sum "
              "(shared pages counted once):")
        for stage, p in self.peaks.items():
            print(f"  {stage:<34} {p['rss']:7.0f} {p['child_rss']:7.0f} {p['sum_rss']:7.0f} {p['sum_pss']:7.0f}")
        top = max((p["sum_pss"] for p in self.peaks.values()), default=0.0)
        mark = "ok" if top < GOAL_RSS_MIB else "ABOVE GOAL"
        print(f"  peak with the routing child: {top:.0f} MiB PSS, "
              f"{max((p['sum_rss'] for p in self.peaks.values()), default=0.0):.0f} MiB RSS summed "
              f"[{mark}: < {GOAL_RSS_MIB:.0f} MiB]")


def array_owners(root: object, name: str, seen: set[int], bases: set[int], max_depth: int = 7) -> dict[str, int]:
    """Bytes of the numpy arrays reachable from ``root`` through attributes, dicts, lists and tuples, by the
    first path that reaches each buffer (views counted once, at their base; buffers in ``bases`` already
    counted under an earlier root)."""
    import numpy as np

    out: dict[str, int] = {}
    stack: list[tuple[object, str, int]] = [(root, name, 0)]
    while stack:
        obj, path, depth = stack.pop()
        if id(obj) in seen or depth > max_depth:
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            if id(base) not in bases and base.dtype != object:
                bases.add(id(base))
                out[path] = out.get(path, 0) + base.nbytes
            continue
        if isinstance(obj, (str, bytes, int, float, bool, type(None), type)):
            continue
        if isinstance(obj, dict):
            for k, v in list(obj.items())[:10_000]:
                stack.append((v, f"{path}[{k!r}]" if isinstance(k, (str, int)) else f"{path}[..]", depth + 1))
            continue
        if isinstance(obj, (list, tuple, set, frozenset)):
            items = list(obj)
            if len(items) > 64:  # big homogeneous containers: one entry for all of them
                for v in items[:20_000]:
                    stack.append((v, f"{path}[*]", depth + 1))
            else:
                for k, v in enumerate(items):
                    stack.append((v, f"{path}[{k}]", depth + 1))
            continue
        d = getattr(obj, "__dict__", None)
        attrs = dict(d) if isinstance(d, dict) else {}
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                attrs[slot] = getattr(obj, slot)
        for k, v in attrs.items():
            stack.append((v, f"{path}.{k}", depth + 1))
    return out


def memory_breakdown(svc: Any, sampler: MemorySampler) -> None:
    import gc

    roots = {"emulator": svc.emulator, "manager": svc.manager, "perfmgr": svc.perfmgr,
             "renderer": getattr(svc, "renderer", None), "prediction": svc.prediction, "traffic": svc.traffic,
             "sa": svc.sa, "app": svc.app, "transport": svc.transport}
    found: dict[str, int] = {}
    seen_paths: dict[str, int] = {}
    seen: set[int] = set()
    bases: set[int] = set()
    for name, obj in roots.items():  # a buffer counts once, under the first root that reaches it
        seen_paths.update(array_owners(obj, name, seen, bases))
    for path, n in seen_paths.items():
        top = path.split(".")[0].split("[")[0]
        found[top] = found.get(top, 0) + n
    total = sum(seen_paths.values())
    rss = _proc_kib(os.getpid(), "VmRSS") / 1024
    print(f"where the memory goes: RSS {rss:.0f} MiB; numpy arrays reachable from the service {total / 2**20:.0f} MiB "
          f"(each buffer once, under the first owner: {', '.join(roots)}); {len(gc.get_objects()):,} GC-tracked "
          "Python objects")
    for top, n in sorted(found.items(), key=lambda x: -x[1]):
        print(f"  {top:<12} {n / 2**20:8.1f} MiB")
    import re

    groups: dict[str, list[int]] = {}
    for path, n in seen_paths.items():  # totals['xmit_data_bytes'] and its siblings: one line
        g = groups.setdefault(re.sub(r"\[[^\]]*\]", "[*]", path), [0, 0])
        g[0] += n
        g[1] += 1
    print("  by owner, 2 MiB or more (several arrays of a dict or list summed):")
    for path, (n, k) in sorted(groups.items(), key=lambda x: -x[1][0]):
        if n >= 2 << 20:
            print(f"    {n / 2**20:8.1f} MiB  {path}" + (f" ({k} arrays)" if k > 1 else ""))


# -- a real Prometheus ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PACED = Path(__file__).resolve().parent.parent / "dashboards" / "prometheus-paced.yml"
FAST_JOB = "ibfm"
"""The paced configuration's often-scraped job: every port's traffic counters (the goal is on it)."""


def scrape_config(target: str, kind: str, shards: int, interval: float, timeout: float) -> str:
    """``whole``: every group in one job; ``paced``: dashboards/prometheus-paced.yml as shipped (its
    paces), on ``target``; ``shards``: one job per shard (``params: shard: [i/n]``)."""
    if kind == "paced":
        return PACED.read_text().replace("localhost:9690", target)
    head = f"global:\n  scrape_interval: {interval:g}s\n  scrape_timeout: {timeout:g}s\nscrape_configs:\n"
    if kind == "whole":
        return head + f"  - job_name: ibfm\n    static_configs:\n      - targets: ['{target}']\n"
    jobs = [
        f"  - job_name: ibfm-shard-{i}\n    params:\n      shard: ['{i}/{shards}']\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
        for i in range(shards)
    ]
    return head + "".join(jobs)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def prometheus_phase(binary: str, target: str, kind: str, args: argparse.Namespace) -> None:
    """Run a fresh Prometheus for ``args.scrape_seconds`` and print what its scrapes took, and its CPU."""
    work = Path(tempfile.mkdtemp(prefix="ibfm-bench-prom-"))
    port = _free_port()
    config = scrape_config(target, kind, args.shards, args.scrape_interval, args.scrape_timeout)
    (work / "prometheus.yml").write_text(config)
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )
    what = {"whole": "every group in one job", "paced": f"two paces ({PACED.name})",
            "shards": f"{args.shards} shard jobs"}[kind]
    try:
        t0 = time.perf_counter()
        first: dict[str, float] = {}
        cpu0 = cpu_t0 = None
        async with aiohttp.ClientSession() as s:
            while time.perf_counter() - t0 < args.scrape_seconds:
                await asyncio.sleep(1.0)
                try:
                    async with s.get(f"http://127.0.0.1:{port}/api/v1/targets") as r:
                        targets = (await r.json())["data"]["activeTargets"]
                except (aiohttp.ClientError, KeyError, ValueError):
                    continue
                for t in targets:
                    if t["health"] != "unknown":
                        first.setdefault(t["labels"]["job"], time.perf_counter() - t0)
                if cpu0 is None and targets and len(first) == len(targets):
                    cpu0, cpu_t0 = _cpu_seconds(proc.pid), time.perf_counter()  # every job past its first scrape
            cpu = _cpu_seconds(proc.pid) - cpu0 if cpu0 is not None else float("nan")
            cpu_wall = time.perf_counter() - cpu_t0 if cpu_t0 is not None else float("nan")
        print("  first scrape done (Prometheus creates every series: slow) at "
              + ", ".join(f"{j} {v:.0f} s" for j, v in sorted(first.items())) + " after Prometheus started"
              if first else "  no scrape completed")
        q = urllib.parse.urlencode({"query": f"{{__name__=~'scrape_duration_seconds|scrape_samples_scraped|up'}}"
                                             f"[{int(args.scrape_seconds) + 30}s]"})
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/api/v1/query?{q}") as r:
            res = await r.json()
        by: dict[tuple[str, str], list[float]] = {}
        for series in res["data"]["result"]:
            m = series["metric"]
            by[(m["job"], m["__name__"])] = [float(v) for _, v in series["values"]]
        print(f"Prometheus {what}, {args.scrape_seconds:g} s:")
        samples = 0.0
        for job in sorted({j for j, _ in by}):
            d = by.get((job, "scrape_duration_seconds"), [])
            n = by.get((job, "scrape_samples_scraped"), [])
            up = by.get((job, "up"), [])
            later = d[1:] or d  # the first scrape creates every series in the TSDB
            worst = max(later, default=0.0)
            samples += max(n, default=0.0) * (cpu_wall / _interval(config, job, args.scrape_interval))
            goal = kind == "whole" or (kind == "paced" and job == FAST_JOB)
            mark = f" [{'ok' if worst < GOAL_SCRAPE_S else 'ABOVE GOAL'}: < {GOAL_SCRAPE_S:g} s]" if goal else ""
            print(f"  {job:<14} scrapes {len(d)}, up {sum(up):.0f}/{len(up)}, samples {max(n, default=0):,.0f}; "
                  f"scrape_duration_seconds first {d[0] if d else float('nan'):.2f}, then "
                  + ", ".join(f"{x:.2f}" for x in later[:12]) + f"; slowest after the first {worst:.2f} s{mark}")
        print(f"  Prometheus CPU after every job's first scrape: {cpu:.1f} s in {cpu_wall:.0f} s "
              f"(~{samples:,.0f} samples scraped: {1e6 * cpu / samples if samples else float('nan'):.1f} us a sample); "
              f"its RSS {_proc_kib(proc.pid, 'VmRSS') / 1024:.0f} MiB")
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def _interval(config: str, job: str, default: float) -> float:
    """A job's scrape interval in seconds, from the configuration text (``scrape_interval: Ns`` after its name)."""
    import re

    m = re.search(rf"job_name: {re.escape(job)}\n(?:    .*\n)*?    scrape_interval: (\d+)s", config)
    return float(m.group(1)) if m else default


async def measure_bodies(base: str, shards: int) -> None:
    """GET /metrics as Prometheus asks (OpenMetrics, gzip): time and size per selection."""
    from exporters import metrics as M

    headers = {"Accept": OPENMETRICS_ACCEPT, "Accept-Encoding": "gzip"}
    sels = [("whole fabric", ""), ("whole fabric, again", "")]
    sels += [(f"shard={i}/{shards}", f"shard={i}/{shards}") for i in range(shards)]
    sels += [(f"collect[]={g}", f"collect[]={g}") for g in getattr(M, "GROUPS", {})]
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        t = time.perf_counter()
        size = lines = 0
        async with s.get(base + "/metrics", headers={"Accept-Encoding": "identity"}) as r:
            async for chunk in r.content.iter_chunked(1 << 20):  # not kept: this process is the daemon too
                size += len(chunk)
                lines += chunk.count(NL)
        print(f"GET /metrics text 0.0.4, no gzip (first request: renders): {time.perf_counter() - t:.3f} s, "
              f"{size / 1e6:.1f} MB, {lines:,} lines")
        for what, query in sels:
            url = base + "/metrics" + (f"?{query}" if query else "")
            st, body, dt = await _http(s, "GET", url, headers=headers)
            mark = ""
            if what == "whole fabric":
                mark = f" [{'ok' if len(body) / 1e6 < GOAL_GZIP_MB else 'ABOVE GOAL'}: < {GOAL_GZIP_MB:g} MB]"
            print(f"GET /metrics {what:<28} {dt:7.3f} s  {len(body) / 1e6:6.2f} MB gzipped  status {st}{mark}")


async def server_main(args: argparse.Namespace) -> None:
    from ibfm.service import Service, configure_logging
    from ibfm.settings import load_settings

    sampler = MemorySampler()
    sampler.start()
    configure_logging("WARNING")
    settings = load_settings(None, {
        "listen": "127.0.0.1:0",
        "fabric.fattree_levels": args.levels,
        "fabric.fattree_radix": args.radix,
        "sm.sweep_interval": 3600,
        "perfmgr.interval": args.perf_interval,
        "api.token": "bench-token-123",
    })
    sampler.mark("service built")
    t0 = time.perf_counter()
    svc = Service(settings)
    f = svc.emulator.fabric if svc.emulator is not None else None
    assert f is not None
    print(f"fat-tree levels={args.levels} k={args.radix}: {f.summary()}; service built in "
          f"{time.perf_counter() - t0:.1f} s")
    sampler.mark("first heavy sweep")
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
    sampler.mark("prediction, counter sweeps")
    t0 = time.perf_counter()
    while svc._predict_task is None or not svc._predict_task.done():
        await asyncio.sleep(0.1)
    print(f"congestion prediction ({settings.fabric.traffic}): {time.perf_counter() - t0:.1f} s after the sweep")
    pm = svc.perfmgr
    while pm.sweeps < 2:
        await asyncio.sleep(0.2)
    print(f"counter sweeps every {args.perf_interval:g} s: {pm.last_report.ports_read:,} ports read in "
          f"{pm.last_report.duration:.2f} s")
    memory_breakdown(svc, sampler)
    print(f"RSS before any /metrics request: {_proc_kib(os.getpid(), 'VmRSS') / 1024:.0f} MiB")

    sampler.mark("/metrics requests")
    await measure_bodies(base, args.shards)
    r = getattr(svc, "renderer", None)
    if r is not None:
        print(f"  renderer, last render: {r.stats.seconds:.3f} s, {r.stats.families} families, "
              f"{r.stats.families_rendered} rendered")
        kept = r.kept_bytes() if hasattr(r, "kept_bytes") else {}
        print("  what the renderer keeps: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in kept.items()))
    print(f"RSS after the /metrics requests: {_proc_kib(os.getpid(), 'VmRSS') / 1024:.0f} MiB")

    binary = shutil.which("prometheus") if args.prometheus else None
    if not args.prometheus:
        pass
    elif binary is None:
        print("no prometheus binary (Debian: apt install prometheus): scrapes by a real Prometheus skipped")
    else:
        phases = set(args.phases.split(","))
        if "whole" in phases:
            sampler.mark("Prometheus: every group, one job")
            await prometheus_phase(binary, f"{host}:{port}", "whole", args)
        if "paced" in phases:
            sampler.mark("Prometheus: two paces")
            await prometheus_phase(binary, f"{host}:{port}", "paced", args)
        if args.shards > 1 and "shards" in phases:
            sampler.mark(f"Prometheus: {args.shards} shard jobs")
            await prometheus_phase(binary, f"{host}:{port}", "shards", args)

    if args.routes:
        sampler.mark("route queries")
        await route_bench(svc, snap, base, port, args)
    stop.set()
    await task
    sampler.stop()
    sampler.report()
    print(f"process peak RSS (getrusage): {_rss_mib():.0f} MiB; largest child: "
          f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")


async def route_bench(svc: Any, snap: Any, base: str, port: int, args: argparse.Namespace) -> None:
    """Route queries from a client process, then the heavier endpoints once each."""
    async with aiohttp.ClientSession() as s:
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


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, choices=(2, 3), default=3)
    ap.add_argument("--radix", type=int, default=36)
    ap.add_argument("--shards", type=int, default=4, help="shards measured and scraped by shard jobs")
    ap.add_argument("--perf-interval", type=float, default=10.0, help="seconds between counter sweeps")
    ap.add_argument("--scrape-interval", type=float, default=15.0, help="Prometheus scrape interval")
    ap.add_argument("--scrape-timeout", type=float, default=14.0, help="Prometheus scrape timeout")
    ap.add_argument("--scrape-seconds", type=float, default=240.0, help="how long each Prometheus phase runs")
    ap.add_argument("--no-prometheus", dest="prometheus", action="store_false", help="skip the Prometheus phases")
    ap.add_argument("--phases", default="whole,paced,shards",
                    help="Prometheus phases, comma-separated: whole (every group, one job), paced, shards")
    ap.add_argument("--routes", action="store_true", help="also run the route-query load and heavy endpoints")
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
