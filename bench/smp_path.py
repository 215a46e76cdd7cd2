#!/usr/bin/env python3
"""Where a bring-up's time goes on the SMP path: ibfm's heavy sweep over libibumad/ibsim.

For each fat-tree in ``--sizes`` (levels:radix) it writes the net file, starts
ibsim on it and runs one heavy sweep (the same pipeline as ``ibfm sm``) in a
child process started with libumad2sim preloaded, attached at the first host's
CA, with the UmadTransport window ``--window``. It prints the phases, the SMPs,
SMPs per second over discover + program, the transport's counters, and the CPU
seconds the SM process and ibsim each spent during the run (ibsim is one
single-threaded process: its CPU is the floor no SM can go under).

``--profile FILE`` runs the child under cProfile (slower; read it with
``python -m pstats FILE``), ``--wrap CMD`` starts it under a command such as a
sampling profiler; ``--repeat N`` runs each size N times on fresh simulators.

    .venv/bin/python bench/smp_path.py --sizes 3:12 3:24 --window 16
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _proc_cpu(pid: int, task: str = "") -> float:
    """User + system CPU seconds of a live process, or of one of its threads (from /proc)."""
    fields = Path(f"/proc/{pid}{task}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_IBSIM_PID: int | None = None


def _thread_cpu(rx: int | None) -> dict[str, float]:
    """CPU seconds of this process's threads: the loop's (main), the umad receive thread (rx), others;
    and of ibsim."""
    out: dict[str, float] = {"ibsim": _proc_cpu(_IBSIM_PID)} if _IBSIM_PID else {}
    for task in Path("/proc/self/task").iterdir():
        key = "rx" if task.name == str(rx) else "main" if task.name == str(os.getpid()) else "other"
        out[key] = out.get(key, 0.0) + _proc_cpu(os.getpid(), f"/task/{task.name}")
    return out


async def _child(cfg: dict[str, Any]) -> dict[str, Any]:
    global _IBSIM_PID
    import sm.sweep.manager

    _IBSIM_PID = cfg.get("ibsim_pid")
    from sm.sweep.manager import FabricManager, SmConfig
    from sm.transport.umad import UmadTransport

    gc_time: dict[int, list[float]] = {0: [0.0, 0], 1: [0.0, 0], 2: [0.0, 0]}
    gc_t0 = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        """Time spent in the cyclic garbage collector, per generation."""
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            g = gc_time[info["generation"]]
            g[0] += time.perf_counter() - gc_t0[0]
            g[1] += 1

    gc.callbacks.append(on_gc)
    t = UmadTransport(window=int(cfg["window"]), issm=True)
    t.start()
    rx = t._thread.native_id if t._thread is not None else None
    split: dict[str, dict[str, float]] = {}

    def timed(name: str, fn: Any) -> Any:
        """``fn`` (a stage coroutine) with the CPU its threads spent in it recorded."""

        async def run(*a: Any, **kw: Any) -> Any:
            c0 = _thread_cpu(rx)
            try:
                return await fn(*a, **kw)
            finally:
                c1 = _thread_cpu(rx)
                split[name] = {k: round(v - c0.get(k, 0.0), 3) for k, v in c1.items()}

        return run

    sm.sweep.manager.discover = timed("discover", sm.sweep.manager.discover)  # type: ignore[attr-defined]
    sm.sweep.manager.program_fabric = timed("program", sm.sweep.manager.program_fabric)  # type: ignore[attr-defined]
    try:
        c0 = _thread_cpu(rx)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        snap = await FabricManager(t, SmConfig(guid2lid=Path(cfg["guid2lid"]))).heavy_sweep()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        threads = {k: v - c0.get(k, 0.0) for k, v in _thread_cpu(rx).items()}
    finally:
        await t.close()
    return {
        "up": snap.up,
        "engine": snap.engine,
        "smps": snap.smps,
        "phases": snap.phases,
        "failures": snap.program.failures[:5] + snap.discovery.errors[:5],
        "stats": vars(t.stats),
        "cpu_user": r1.ru_utime - r0.ru_utime,
        "cpu_sys": r1.ru_stime - r0.ru_stime,
        "threads": threads,
        "split": split,
        "gc": gc_time,
    }


def child_main(cfg: dict[str, Any]) -> None:
    if cfg.get("profile"):
        import cProfile

        prof = cProfile.Profile()
        out = prof.runcall(asyncio.run, _child(cfg))
        prof.dump_stats(cfg["profile"])
    else:
        out = _child_run(cfg)
    print(json.dumps(out), flush=True)


def _child_run(cfg: dict[str, Any]) -> dict[str, Any]:
    return asyncio.run(_child(cfg))


def run_one(spec: str, window: int, profile: str | None, wrap: list[str] | None = None) -> dict[str, Any]:
    from fabric.formats.netfile import write_net
    from fabric.generate import fattree
    from fabric.ibsim import IbsimProcess, ibsim_size_args
    from fabric.model import Speed

    levels, k = (int(x) for x in spec.split(":"))
    f = fattree(levels, k, speed=Speed.QDR)
    n_ports = int((f.nports.astype("int64") + 1).sum())
    args = ibsim_size_args(f.n_nodes, int(f.switches.size), n_ports)
    lids = int(f.switches.size + f.port_exists[f.cas].sum())
    if lids + 64 > 30720:
        args += ["-L", str(-(-(lids + 64) // 64) * 64)]
    host = f.names[int(f.cas[0])]
    with tempfile.TemporaryDirectory(prefix="smp_path-") as tmp:
        work = Path(tmp)
        net = work / "fabric.net"
        write_net(f, net)
        with IbsimProcess(net, extra_args=args, start_timeout=600) as sim:
            assert sim.pid is not None
            env = sim.env(sim_host=host)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
            cfg = {"window": window, "guid2lid": str(work / "guid2lid"), "profile": profile, "ibsim_pid": sim.pid}
            sim0 = _proc_cpu(sim.pid)
            t0 = time.perf_counter()
            cp = subprocess.run(
                [*(wrap or []), sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(cfg)],
                env=env, cwd=work, capture_output=True, text=True, timeout=3600,
            )  # fmt: skip
            wall = time.perf_counter() - t0
            sim_cpu = _proc_cpu(sim.pid) - sim0
    if cp.returncode != 0:
        raise SystemExit(f"SM child failed ({cp.returncode}):\n{cp.stderr[-3000:]}")
    res: dict[str, Any] = json.loads([ln for ln in cp.stdout.splitlines() if ln.startswith("{")][-1])
    res.update(fabric=spec, window=window, wall=wall, ibsim_cpu=sim_cpu)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["3:12", "3:24"], metavar="L:K")
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--profile", metavar="FILE", help="cProfile the SM child into FILE (last size)")
    p.add_argument("--wrap", help="command prefix for the SM child, e.g. a sampling profiler's 'record --'")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child_main(json.loads(a.child))
        return 0
    print(f"{'fabric':<7} {'win':>4} {'SMPs':>8} {'disc s':>7} {'prog s':>7} {'SMP/s':>7} {'sweep s':>8} "
          f"{'SM cpu':>7} {'main':>5} {'rx':>5} {'ibsim cpu':>9} {'retries':>7}  up")  # fmt: skip
    ok = True
    for spec in a.sizes:
        for _ in range(a.repeat):
            prof = str(Path(a.profile).resolve()) if a.profile else None
            r = run_one(spec, a.window, prof, shlex.split(a.wrap or ""))
            ph = r["phases"]
            smp_s = ph["discover"] + ph["program"]
            print(
                f"{r['fabric']:<7} {r['window']:>4} {r['smps']:>8} {ph['discover']:>7.2f} {ph['program']:>7.2f} "
                f"{r['smps'] / smp_s:>7.0f} {sum(ph.values()):>8.2f} {r['cpu_user'] + r['cpu_sys']:>7.2f} "
                f"{r['threads'].get('main', 0):>5.2f} {r['threads'].get('rx', 0):>5.2f} "
                f"{r['ibsim_cpu']:>9.2f} {r['stats']['retries']:>7}  {r['up']}"
                + "\n    GC: "
                + ", ".join(f"gen{g} {n}x {t:.2f} s" for g, (t, n) in r["gc"].items())
                + "".join(
                    f"\n    {k}: main {v.get('main', 0):.2f} rx {v.get('rx', 0):.2f}"
                    f" ibsim {v.get('ibsim', 0):.2f} s CPU"
                    for k, v in r["split"].items()
                )
                + "".join(f"\n    {x}" for x in r["failures"]),
                flush=True,
            )
            ok &= bool(r["up"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
