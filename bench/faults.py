"""ibfm beside OpenSM on a fabric that loses MADs: ibsim's ``Error`` drop rate on every node.

For each drop rate (per hop, on every node of the fabric), a fresh ibsim runs
each SM, attached at the same host:

- ``ibfm once``: ``ibfm sm --transport umad`` (one heavy sweep); exit status,
  subnet up or not, time to up, SMPs sent, the transport's retries and the
  requests sent again after every retry timed out;
- ``ibfm daemon``: the SM sweeping (bench/_sm_runner.py, 1 s timer) until a
  sweep reports the subnet up: how many sweeps and how long;
- ``opensm once``: ``opensm --once``; exit status, SUBNET UP in its log,
  time to it.

Then the drop rate goes back to 0 and the fabric is read back with
``ibnetdiscover`` and ``ibroute`` of every switch (bench/_readback.py):
"routed" says whether every (end port, LID) pair has a route on what the
switches hold, and how many do not.

    .venv/bin/python bench/faults.py                 # 3-level radix-8 tree, 1, 5 and 20 %
    .venv/bin/python bench/faults.py --tree 3:12 --rates 1 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._readback import read_back, run_tool  # noqa: E402
from bench._sm_runner import SmRunner, SmRunnerError  # noqa: E402
from bench.vs_opensm import Result, opensm_log_phases, sim_args  # noqa: E402
from fabric.formats.netfile import write_net  # noqa: E402
from fabric.generate import fattree  # noqa: E402
from fabric.ibsim import IbsimProcess, missing_ibsim_tools  # noqa: E402
from fabric.model import Fabric, Speed  # noqa: E402

SM_HOST = "host-00000"
TOOL_HOST = "host-00001"


@dataclass
class Row:
    rate: int
    sm: str
    exit: int | None = None
    up: bool = False
    up_s: float | None = None
    sweeps: int | None = None
    smps: int | None = None
    retries: int | None = None
    resent: int | None = None
    unreachable: int | None = None
    pairs: int | None = None
    notes: list[str] = field(default_factory=list)


def judge(sim: IbsimProcess, f: Fabric, work: Path, row: Row) -> None:
    sim.drop_mads(f.names, 0)
    host_guid = int(f.port_guid[f.by_name(TOOL_HOST), 1])
    try:
        rb = read_back(sim.env(sim_host=TOOL_HOST), work, host_guid)
    except RuntimeError as e:
        row.notes.append(str(e)[:160])
        return
    v = rb.verify()
    row.unreachable, row.pairs = v.unreachable, v.pairs
    if rb.fabric.n_nodes != f.n_nodes:
        row.notes.append(f"ibnetdiscover sees {rb.fabric.n_nodes} of {f.n_nodes} nodes")


def ibfm_once(sim: IbsimProcess, work: Path, rate: int, timeout: float) -> Row:
    row = Row(rate, "ibfm once")
    env = sim.env(sim_host=SM_HOST)
    env["PYTHONPATH"] = str(REPO)
    try:
        cp = run_tool([sys.executable, "-m", "ibfm.cli", "sm", "--transport", "umad", "--json",
                       "--guid2lid", str(work / "guid2lid")], env, work, timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        row.notes.append(f"killed after {timeout:g} s")
        return row
    row.exit = cp.returncode
    try:
        s = json.loads(cp.stdout)
    except json.JSONDecodeError:
        row.notes.append(cp.stderr.strip()[-160:])
        return row
    row.up, row.up_s, row.smps = bool(s["subnet_up"]), s["up_s"], s["smps"]
    t = s.get("transport", {})
    row.retries, row.resent = t.get("retries"), t.get("resent")
    row.notes += (s["program"]["failures"] + s["discovery_errors"])[:2]
    return row


def ibfm_daemon(sim: IbsimProcess, work: Path, rate: int, timeout: float) -> Row:
    row = Row(rate, "ibfm daemon")
    t0 = time.monotonic()
    with SmRunner(sim, SM_HOST, work, sweep_interval=1.0) as sm:
        try:
            up = sm.wait_sweep(up=True, timeout=timeout)
        except SmRunnerError as e:
            row.notes.append(str(e)[:160])
            up = None
        heavy = sm.events("sweep_done")
        row.sweeps = len([e for e in heavy if e.get("kind") == "heavy"])
        status = sm.command("status")
        row.retries, row.resent, row.smps = status["retries"], status["resent"], status["smps_total"]
        if up is not None:
            row.up = True
            row.up_s = round(time.monotonic() - t0, 3)
            done = sm.events("sweep_done")
            row.sweeps = len([e for e in done if e.get("kind") == "heavy" and e["sweep"] <= up["sweep"]])
        row.exit = sm.stop()
    return row


def opensm_once(sim: IbsimProcess, work: Path, rate: int, timeout: float) -> Row:
    row = Row(rate, "opensm once")
    env = dict(sim.env(sim_host=SM_HOST), OSM_CACHE_DIR=str(work / "osm-cache"))
    (work / "osm-cache").mkdir(exist_ok=True)
    log = work / "opensm.log"
    started = time.time()
    try:
        cp = run_tool(["opensm", "--once", "-f", str(log), "--dump_files_dir", str(work)], env, work, timeout)
        row.exit = cp.returncode
    except subprocess.TimeoutExpired:
        row.notes.append(f"killed after {timeout:g} s")
    res = Result("", "opensm")
    opensm_log_phases(log.read_text(errors="replace") if log.exists() else "", res, started)
    row.up, row.up_s = res.ok, res.up_s
    row.notes += res.notes[:2]
    return row


def bench(tree: str, rates: Sequence[int], sms: Sequence[str], timeout: float) -> list[Row]:
    levels, k = (int(x) for x in tree.split(":"))
    f = fattree(levels, k, speed=Speed.QDR)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ibfm-faults-") as tmp:
        net = Path(tmp) / "fabric.net"
        write_net(f, net)
        for rate in rates:
            for sm in sms:
                work = Path(tmp) / f"{sm.replace(' ', '-')}-{rate}"
                work.mkdir()
                with IbsimProcess(net, extra_args=sim_args(f), start_timeout=300) as sim:
                    sim.drop_mads(f.names, rate)
                    run = {"ibfm once": ibfm_once, "ibfm daemon": ibfm_daemon, "opensm once": opensm_once}[sm]
                    row = run(sim, work, rate, timeout)
                    judge(sim, f, work, row)
                rows.append(row)
                print_row(row)
    return rows


HEAD = f"{'drop %':>6}  {'SM':<12} {'exit':>4} {'up':>3} {'up s':>7} {'sweeps':>6} {'SMPs':>7} {'retries':>7} " \
       f"{'resent':>6} {'routed':>8}  notes"  # fmt: skip


def print_row(r: Row) -> None:
    def v(x: object, w: int) -> str:
        return ("-" if x is None else str(x)).rjust(w)

    routed = "-" if r.unreachable is None else ("all" if r.unreachable == 0 else f"-{r.unreachable}")
    notes = "; ".join(r.notes)[:140]
    print(f"{r.rate:>6}  {r.sm:<12} {v(r.exit, 4)} {'yes' if r.up else 'no':>3} {v(r.up_s, 7)} {v(r.sweeps, 6)} "
          f"{v(r.smps, 7)} {v(r.retries, 7)} {v(r.resent, 6)} {routed:>8}  {notes}", flush=True)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default="3:8", help="LEVELS:RADIX of the fat-tree (default 3:8: 80 switches, 128 hosts)")
    ap.add_argument("--rates", type=int, nargs="+", default=[1, 5, 20], help="drop rates in %% per hop")
    ap.add_argument("--sms", nargs="+", default=["ibfm once", "ibfm daemon", "opensm once"])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds each SM gets to bring the subnet up")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    missing = missing_ibsim_tools("ibnetdiscover", "ibroute", "opensm")
    if missing:
        print(f"missing: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(f"fat-tree {args.tree}, MADs dropped at every node; judged by ibnetdiscover + ibroute afterwards")
    print(HEAD)
    rows = bench(args.tree, args.rates, args.sms, args.timeout)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
