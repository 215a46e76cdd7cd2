#!/usr/bin/env python3
"""ibfm against OpenSM on the same ibsim fabrics: time to subnet up, SMPs, and route quality read back.

For each fat-tree (2-level k=36: 648 hosts; 3-level k=12, k=24: 3,456 hosts, k=36:
11,664 hosts), as generated and with 2% of the inter-switch links removed
(``degrade(fraction=0.02, seed=0)``), and for each SM:

- ``ibfm``: ``ibfm sm --transport umad --json`` (engine chain ftree,updn,minhop);
- ``osm-ftree``: ``opensm --once -R ftree``; on a degraded tree OpenSM's ftree refuses
  a tree with a missing link unless given the roots, so it runs twice there:
  without roots (it falls back to minhop) and ``osm-ftree+roots`` with ``-a`` naming
  the top-level switches (spines / cores);
- ``osm-minhop``: ``opensm --once`` with its default engine;

each on a freshly started ibsim (``-N -S -P -L`` raised to fit; a fresh fabric every
run: all ports INIT, no LIDs), attached at the first host's CA port, it prints:

- time to subnet up, the figure the goal is about: from the start of the sweep to every
  port ACTIVE on its routes (ibfm's ``up_s``: discovery start to the last ACTIVE Set
  answered; OpenSM: "Entering DISCOVERING state" to "SUBNET UP" in its log); ibfm's
  ``sweep`` adds what it checks after that (routes verified, credit loops), which OpenSM
  does not do; "start->up" counts from the moment the SM process is started (Python's
  start-up for ibfm, the bytecode compiled beforehand as an installed package has it);
  "wall" runs to the process's exit;
- phases: ibfm's own; OpenSM's from its log timestamps (default log level):
  discover = DISCOVERING -> MASTER, route = MASTER -> "<engine> tables configured on
  all switches" (LIDs and routing), program = -> "SUBNET UP" (LFT blocks in flight,
  links ARMED then ACTIVE);
- SMPs: ibfm counts what it sent; OpenSM does not report a count at its default log
  level, so for both the SM port's PortXmitPkts (PortCountersExtended, read with
  perfquery from ibsim's PMA right after the SM exits) counts the MADs that left
  the SM's port (SMPs to the SM's own CA never leave it);
- P_Key traffic: with its defaults OpenSM reads every port's P_Key table (PKeyTable,
  attribute 0x0016); ibfm, which programs partitions too, reads every end port's table
  once per process and sets the blocks that differ, so both counts include that work.
  A second OpenSM run of each variant, on its own fresh ibsim, logs every SMP it sends
  (``-D 0x21``: ERROR and FRAMES, each MAD dumped with its method and attribute) and
  counts the PKeyTable Gets and Sets that left the port (DR hop count > 0), so the
  timed run is not slowed by the logging; "w/o P_Key" is the timed run's port count
  minus them, and the ratios are given both ways (``--no-pkey-count`` skips that run);
- the engine actually used (OpenSM: the word before "tables configured");
- route quality read back from the fabric: the LIDs from ``ibnetdiscover``, every
  switch's LFT from ``ibroute -n <switch lid>``, then ``sm.analysis.verify.shift_quality``
  (routes per directed inter-switch link over shift permutations of the hosts: max,
  mean of each shift's max, mean; every shift on small trees, a random sample of
  ``--max-shifts`` on big ones, count printed) and ``sm.analysis.verify.verify_routes``
  (unreachable (end port, LID) pairs).

The machine is shared and ibsim is one single-threaded process answering every MAD:
timings are noisy and measure the SM plus ibsim, not the SM alone.

    .venv/bin/python bench/vs_opensm.py --quick
    .venv/bin/python bench/vs_opensm.py --sizes 3:24 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._readback import read_back  # noqa: E402
from bench._readback import run_tool as run  # noqa: E402
from fabric.formats.netfile import write_net  # noqa: E402
from fabric.generate import degrade, fattree  # noqa: E402
from fabric.ibsim import IbsimProcess, ibsim_size_args, missing_ibsim_tools  # noqa: E402
from fabric.model import Fabric, Speed  # noqa: E402
from sm.analysis.verify import shift_quality  # noqa: E402

# ibsim 0.10 knows link rates up to QDR in net-file comments.
SIM_SPEED = Speed.QDR
DEFAULT_LINEAR_CAP = 30720
QUICK = ("2:36", "3:12")
ALL = ("2:36", "3:12", "3:24", "3:36")
SMS = ("ibfm", "osm-ftree", "osm-minhop")


@dataclass
class Result:
    fabric: str
    sm: str
    ok: bool = False
    engine: str = "?"
    wall_s: float = 0.0
    up_s: float | None = None
    """Sweep start to subnet up (every port ACTIVE on its routes)."""
    start_up_s: float | None = None
    """Process start to subnet up."""
    sweep_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    smps: int | None = None
    """What the SM says it sent (ibfm only)."""
    port_xmit_pkts: int | None = None
    """SM port PortXmitPkts from ibsim's PMA."""
    pkey_smps: int | None = None
    """PKeyTable SMPs (Get and Set) that left the SM's port: OpenSM's from its FRAMES-logging run (ibfm's are
    not counted apart: its count includes them)."""
    counted_smps: int | None = None
    """Every SMP that left the SM's port in OpenSM's FRAMES-logging run (a check on port_xmit_pkts)."""
    shifts: int = 0
    total_shifts: int = 0
    max_load: int | None = None
    mean_max_load: float | None = None
    mean_load: float | None = None
    unreachable: int | None = None
    """(end port, LID) pairs over every end port and LID, switches included."""
    host_pairs_unrouted: int | None = None
    """Host -> host pairs of the evaluated shifts whose route breaks."""
    pairs: int | None = None
    readback_s: float = 0.0
    notes: list[str] = field(default_factory=list)


# -- fabrics ---------------------------------------------------------------------------------------------


def build(spec: str, degraded: bool) -> tuple[str, Fabric, list[int]]:
    """``"3:24"`` -> (label, fabric, top-level switch GUIDs)."""
    levels, k = (int(x) for x in spec.split(":"))
    f = fattree(levels, k, speed=SIM_SPEED)
    top = "spine-" if levels == 2 else "core-"
    roots = [int(f.node_guid[i]) for i, n in enumerate(f.names) if n.startswith(top)]
    label = f"{levels}L k={k}"
    if degraded:
        f = degrade(f, fraction=0.02, seed=0)
        label += " -2%"
    return label, f, roots


def sim_args(f: Fabric) -> list[str]:
    n_ports = int((f.nports.astype(np.int64) + 1).sum())
    args = ibsim_size_args(f.n_nodes, int(f.switches.size), n_ports)
    lids = int(f.switches.size + f.port_exists[f.cas].sum())
    if lids + 64 > DEFAULT_LINEAR_CAP:
        args += ["-L", str(-(-(lids + 64) // 64) * 64)]
    return args


# -- running things ---------------------------------------------------------------------------------------


def port_xmit_pkts(env: dict[str, str], cwd: Path) -> int | None:
    """PortXmitPkts (PortCountersExtended) of the local port: perfquery's own MAD does not leave it."""
    cp = run(["perfquery", "-x"], env, cwd, 60)
    m = re.search(r"^PortXmitPkts:\.+(\d+)$", cp.stdout, re.M)
    return int(m.group(1)) if m else None


_LOG_TS = re.compile(r"^\w{3} +\d+ (\d\d):(\d\d):(\d\d) (\d{6}) ")


def _log_time(line: str) -> float | None:
    m = _LOG_TS.match(line)
    if not m:
        return None
    h, mi, s, us = (int(x) for x in m.groups())
    return h * 3600 + mi * 60 + s + us / 1e6


def _seconds_of_day(t: float) -> float:
    lt = time.localtime(t)
    return lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec + (t % 1.0)


def opensm_log_phases(log: str, res: Result, started: float | None = None) -> None:
    """Engine, phases and errors from an OpenSM log at its default level."""
    marks: dict[str, float] = {}
    for line in log.splitlines():
        t = _log_time(line)
        if t is None:
            continue
        marks.setdefault("start", t)
        if "Entering DISCOVERING state" in line:
            marks.setdefault("discovering", t)
        elif "Entering MASTER state" in line:
            marks.setdefault("master", t)
        elif (m := re.search(r"osm_ucast_mgr_process: (\S+) tables configured on all switches", line)) and (
            "routed" not in marks
        ):
            marks["routed"] = t
            res.engine = m.group(1)
        elif "SUBNET UP" in line:
            marks.setdefault("up", t)
        elif " ERR " in line and len(res.notes) < 3:
            res.notes.append(line.split("-> ", 1)[-1].strip()[:160])
    order = [("init", "start", "discovering"), ("discover", "discovering", "master"), ("route", "master", "routed"),
             ("program", "routed", "up")]  # fmt: skip
    for name, a, b in order:
        if a in marks and b in marks:
            res.phases[name] = round(marks[b] - marks[a], 3)
    if "discovering" in marks and "up" in marks:
        res.sweep_s = res.up_s = round(marks["up"] - marks["discovering"], 3)
    if started is not None and "up" in marks:
        res.start_up_s = round((marks["up"] - _seconds_of_day(started)) % 86400, 3)
    res.ok = "up" in marks


def opensm_argv(sm: str, work: Path, log: Path, roots_file: Path) -> list[str]:
    """``opensm --once`` for an SM variant (osm-ftree, osm-ftree+roots, osm-minhop)."""
    args = ["opensm", "--once", "-e", "-f", str(log), "--dump_files_dir", str(work)]
    if sm.startswith("osm-ftree"):
        args += ["-R", "ftree"]
    if sm == "osm-ftree+roots":
        args += ["-a", str(roots_file)]
    return args


_DUMP_FIELD = re.compile(r"^\t+(mgmt_class|method|hop_count|attr_id)\.+(0x[0-9a-fA-F]+)")
_REQUESTS = {0x01, 0x02, 0x07}  # SubnGet, SubnSet, SubnTrapRepress: what OpenSM sends (it receives the rest)
PKEY_TABLE = 0x0016


def count_sent_smps(log: Path) -> tuple[int, int]:
    """(every SMP, PKeyTable SMPs) OpenSM sent out of its port, from a log at FRAMES level.

    Every MAD OpenSM sends or receives is dumped ("SMP dump:" then one tab-indented line
    per header field); requests are the ones it sent. A directed-route SMP with hop count 0
    goes to the SM's own CA and never leaves the port, so it is not counted, as
    PortXmitPkts does not count it.
    """
    sent = pkey = 0

    def close(rec: dict[str, int] | None) -> None:
        nonlocal sent, pkey
        if rec is None or rec.get("method") not in _REQUESTS:
            return
        if rec.get("mgmt_class") == 0x81 and rec.get("hop_count") == 0:
            return
        sent += 1
        pkey += rec.get("attr_id") == PKEY_TABLE

    rec: dict[str, int] | None = None
    with log.open(errors="replace") as fh:
        for line in fh:
            if line.startswith("\t"):
                if rec is not None and (m := _DUMP_FIELD.match(line)):
                    rec.setdefault(m.group(1), int(m.group(2), 16))
            elif line.strip():
                close(rec)
                rec = {} if line.rstrip().endswith("-> SMP dump:") else None
    close(rec)
    return sent, pkey


def count_opensm_pkey(sm: str, net: Path, fabric: Fabric, work: Path, host: str, roots_file: Path,
                      timeout: float, res: Result) -> None:  # fmt: skip
    """OpenSM's PKeyTable SMPs: the same ``opensm --once`` on a fresh ibsim, logging every SMP (-D 0x21)."""
    work.mkdir()
    cache = work / "osm-cache"
    cache.mkdir()
    log = work / "opensm.log"
    with IbsimProcess(net, extra_args=sim_args(fabric), start_timeout=600) as sim:
        env = dict(sim.env(sim_host=host), OSM_CACHE_DIR=str(cache))
        cp = run([*opensm_argv(sm, work, log, roots_file), "-D", "0x21"], env, work, timeout)
    if cp.returncode != 0 or not log.exists():
        res.notes.append(f"P_Key count: opensm exit {cp.returncode}")
        return
    res.counted_smps, res.pkey_smps = count_sent_smps(log)
    log.unlink()
    if res.port_xmit_pkts is not None and res.counted_smps != res.port_xmit_pkts:
        res.notes.append(f"P_Key counting run sent {res.counted_smps} SMPs (timed run: {res.port_xmit_pkts})")


def run_sm(sm: str, sim: IbsimProcess, work: Path, host: str, roots_file: Path, timeout: float) -> Result:
    res = Result("", sm)
    env = sim.env(sim_host=host)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    started = time.time()
    t0 = time.perf_counter()
    if sm == "ibfm":
        cp = run([sys.executable, "-m", "ibfm.cli", "sm", "--transport", "umad", "--json",
                  "--guid2lid", str(work / "guid2lid")], env, work, timeout)  # fmt: skip
        res.wall_s = time.perf_counter() - t0
        try:
            s = json.loads(cp.stdout)
        except json.JSONDecodeError:
            res.notes.append(f"ibfm exit {cp.returncode}: {cp.stderr.strip()[-300:]}")
            return res
        res.ok = bool(s["subnet_up"])
        res.engine = s["engine"]
        res.phases = {k: round(v, 3) for k, v in s["phases_s"].items()}
        res.up_s, res.sweep_s = s["up_s"], s["sweep_s"]
        res.start_up_s = round(s["up_at"] - started, 3)
        res.smps = s["smps"]
        res.pkey_smps = 0  # ibfm has no PKeyTable attribute
        res.notes += [f"refused by {r['engine']}: {r['reason'][:100]}" for r in s["refused"]]
        res.notes += s["program"]["failures"][:3] + s["discovery_errors"][:3] + s["verify"]["failures"][:3]
        if not res.ok:
            res.notes.append(f"verify: {s['verify']['unreachable']} unreachable, credit loops {len(s['credit_loops'])}")
        return res
    cache = work / "osm-cache"
    cache.mkdir(exist_ok=True)
    log = work / "opensm.log"
    cp = run(opensm_argv(sm, work, log, roots_file), dict(env, OSM_CACHE_DIR=str(cache)), work, timeout)
    res.wall_s = time.perf_counter() - t0
    if cp.returncode != 0:
        res.notes.append(f"opensm exit {cp.returncode}")
    opensm_log_phases(log.read_text(errors="replace") if log.exists() else "", res, started)
    return res


# -- reading the routes back --------------------------------------------------------------------------------

def read_routes(
    sim: IbsimProcess, work: Path, host: str, host_guid: int, workers: int, max_shifts: int, res: Result
) -> None:
    """LIDs from ibnetdiscover, LFTs from ibroute (bench/_readback.py), then shift quality and unreachable pairs."""
    t0 = time.perf_counter()
    try:
        rb = read_back(sim.env(sim_host=host), work, host_guid, workers=workers, timeout=1800)
    except RuntimeError as e:
        res.notes.append(str(e)[:200])
        return
    res.notes += [f"switch {s} unreachable by LID; read by DR" for s in rb.by_dr[:3]]
    res.notes += [f"ibroute failed on {s}" for s in rb.unread[:3]] + rb.notes
    q = shift_quality(rb.fabric, rb.lids, rb.lft, max_shifts=max_shifts, seed=1)
    v = rb.verify()
    res.shifts, res.total_shifts = q.shifts, q.total_shifts
    res.max_load, res.mean_max_load, res.mean_load = q.max_load, round(q.mean_max_load, 2), round(q.mean_load, 3)
    res.unreachable, res.pairs = v.unreachable, v.pairs
    res.host_pairs_unrouted = q.unrouted
    res.notes += [f"unreachable: {x}" for x in v.failures[:2]]
    res.readback_s = round(time.perf_counter() - t0, 1)


def bench_one(spec: str, degraded: bool, sms: Sequence[str], args: argparse.Namespace, out: list[Result]) -> None:
    label, fabric, roots = build(spec, degraded)
    hosts = [fabric.names[i] for i in fabric.cas.tolist()]
    sm_host, tool_host = hosts[0], hosts[-1]
    tool_guid = int(fabric.port_guid[fabric.by_name(tool_host), 1])
    variants = list(sms)
    if degraded and "osm-ftree" in variants:
        variants.insert(variants.index("osm-ftree") + 1, "osm-ftree+roots")
    with tempfile.TemporaryDirectory(prefix="vs_opensm-") as tmp:
        tdir = Path(tmp)
        net = tdir / "fabric.net"
        write_net(fabric, net)
        roots_file = tdir / "roots.guids"
        roots_file.write_text("".join(f"0x{g:016x}\n" for g in roots))
        s = fabric.summary()
        print(f"\n== {label}: {s['cas']} hosts, {s['switches']} switches, {s['links']} links "
              f"({s['switch_links']} inter-switch); ibsim {' '.join(sim_args(fabric))}", flush=True)  # fmt: skip
        for sm in variants:
            work = tdir / sm
            work.mkdir()
            with IbsimProcess(net, extra_args=sim_args(fabric), start_timeout=600) as sim:
                res = run_sm(sm, sim, work, sm_host, roots_file, args.timeout)
                res.fabric = label
                if res.ok or args.readback_always:
                    # First the SM port's counter (attached at the SM's host), then the read-back
                    # from another host so that its MADs leave by another port.
                    res.port_xmit_pkts = port_xmit_pkts(sim.env(sim_host=sm_host), work)
                    read_routes(sim, work, tool_host, tool_guid, args.workers, args.max_shifts, res)
            if sm.startswith("osm") and res.ok and not args.no_pkey_count:
                count_opensm_pkey(sm, net, fabric, tdir / f"{sm}-count", sm_host, roots_file, args.timeout, res)
            out.append(res)
            print_row(res, flush=True)


# -- output ---------------------------------------------------------------------------------------------

HEADER = (
    f"{'fabric':<12} {'SM':<16} {'engine':<7} {'up s':>7} {'start>up':>8} {'sweep s':>8} {'wall s':>7} "
    f"{'SMPs':>8} {'port pkts':>10} {'P_Key':>6} {'w/o P_Key':>9} "
    f"{'max':>4} {'mmax':>6} {'mean':>7} {'shifts':>11} {'unreach':>8} {'h-h':>5}  phases / notes"
)


def print_row(r: Result, *, flush: bool = False) -> None:
    def fmt(v: Any, spec: str) -> str:
        if v is None:
            width = re.match(r"\d*", spec)
            return "-".rjust(int(width.group() or 0) if width else 0)
        return format(v, spec)

    phases = " ".join(f"{k} {v:.2f}" for k, v in r.phases.items())
    shifts = f"{r.shifts}/{r.total_shifts}" if r.total_shifts else "-"
    no_pkey = None if r.port_xmit_pkts is None or r.pkey_smps is None else r.port_xmit_pkts - r.pkey_smps
    print(
        f"{r.fabric:<12} {r.sm:<16} {r.engine:<7} {fmt(r.up_s, '7.3f')} {fmt(r.start_up_s, '8.3f')} "
        f"{fmt(r.sweep_s, '8.3f')} {r.wall_s:>7.2f} {fmt(r.smps, '8d')} "
        f"{fmt(r.port_xmit_pkts, '10d')} {fmt(r.pkey_smps, '6d')} {fmt(no_pkey, '9d')} "
        f"{fmt(r.max_load, '4d')} {fmt(r.mean_max_load, '6.2f')} "
        f"{fmt(r.mean_load, '7.3f')} {shifts:>11} {fmt(r.unreachable, '8d')} "
        f"{fmt(r.host_pairs_unrouted, '5d')}  {phases}"
        + ("" if r.ok else "  NOT UP")
        + "".join(f"\n{'':>14}note: {n}" for n in r.notes),
        flush=flush,
    )


def print_ratios(results: Sequence[Result]) -> None:
    """Per fabric: OpenSM's time over ibfm's (up, start->up), against the fastest OpenSM run that came up."""
    print("\nOpenSM time / ibfm time (the goal: >= 2 for 'up'), against the fastest OpenSM that came up:")
    for fabric in dict.fromkeys(r.fabric for r in results):
        mine = [r for r in results if r.fabric == fabric and r.sm == "ibfm" and r.ok]
        osm = [r for r in results if r.fabric == fabric and r.sm.startswith("osm") and r.ok and r.up_s]
        if not mine or not osm or not mine[0].up_s:
            continue
        best = min(osm, key=lambda r: r.up_s or 0.0)
        up = (best.up_s or 0.0) / (mine[0].up_s or 1.0)
        line = f"  {fabric:<12} up {up:5.2f}x ({best.sm} {best.up_s:.3f} s / ibfm {mine[0].up_s:.3f} s)"
        if best.start_up_s and mine[0].start_up_s:
            line += f"   start->up {best.start_up_s / mine[0].start_up_s:5.2f}x"
        if best.port_xmit_pkts and mine[0].port_xmit_pkts:
            line += f"   SMPs {best.port_xmit_pkts / mine[0].port_xmit_pkts:4.2f}x fewer"
            if best.pkey_smps is not None:
                line += f" (OpenSM's count includes {best.pkey_smps} P_Key SMPs; ibfm's its own P_Key reads)"
        print(line)


def compile_bytecode() -> None:
    """Bytecode for ibfm's packages, as an installed package has it (pip compiles at install time;
    an editable install and PYTHONDONTWRITEBYTECODE leave ibfm compiling its sources at each start)."""
    import compileall

    for pkg in ("fabric", "sm", "exporters", "ibfm"):
        compileall.compile_dir(str(REPO / pkg), quiet=1)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"only the small trees ({', '.join(QUICK)})")
    p.add_argument("--sizes", nargs="+", metavar="L:K", help=f"trees as levels:radix (default {' '.join(ALL)})")
    p.add_argument("--sms", default=",".join(SMS), help=f"SMs to run (default {','.join(SMS)})")
    p.add_argument("--no-degraded", action="store_true", help="skip the trees with 2%% of links removed")
    p.add_argument("--only-degraded", action="store_true")
    p.add_argument("--max-shifts", type=int, default=512, help="shift permutations sampled beyond this many hosts")
    p.add_argument("--workers", type=int, default=4, help="ibroute processes in parallel")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds one SM run may take")
    p.add_argument("--readback-always", action="store_true", help="read routes back even when the SM failed")
    p.add_argument("--no-pkey-count", action="store_true",
                   help="skip the second OpenSM run that counts its PKeyTable SMPs (FRAMES logging)")  # fmt: skip
    p.add_argument("--json", type=Path, help="write every result as JSON")
    args = p.parse_args(argv)
    missing = missing_ibsim_tools("ibnetdiscover", "ibroute", "perfquery", "opensm")
    if missing:
        print(f"missing: {', '.join(missing)}", file=sys.stderr)
        return 2
    compile_bytecode()
    sizes = args.sizes or (QUICK if args.quick else ALL)
    sms = [s.strip() for s in args.sms.split(",") if s.strip()]
    bad = [s for s in sms if s not in SMS]
    if bad:
        p.error(f"unknown SM {bad[0]!r} (known: {', '.join(SMS)})")
    print("Timings are noisy: a shared 2-core machine, and ibsim (one single-threaded process) answers every MAD.")
    print("port pkts: PortXmitPkts of the SM's port (ibsim PMA); SMPs: what ibfm says it sent.")
    print("P_Key: of those, PKeyTable SMPs (OpenSM: counted in a second run with -D 0x21; ibfm: not counted apart); "
          "w/o P_Key: port pkts minus them.")  # fmt: skip
    print(HEADER)
    results: list[Result] = []
    for spec in sizes:
        for degraded in (False, True):
            if (degraded and args.no_degraded) or (not degraded and args.only_degraded):
                continue
            bench_one(spec, degraded, sms, args, results)
    print("\n" + HEADER)
    for r in results:
        print_row(r)
    print_ratios(results)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
