#!/usr/bin/env python3
"""SA PathRecord throughput on an emulated fat tree (default 3-level k=36: 11,664 hosts).

ibfm sweeps the emulated fabric (heavy sweep, timed), then:

- PathRecord Get (SLID+DLID, random CA pairs) straight through ``SaServer.take`` with a
  transport whose ``reply`` only counts: queries/s cold (first asks: on a fabric too large to
  trace every LID's column at once, each path is walked hop by hop until its LID has been asked
  for often enough to trace its column) and warm (the same requests again: each LID asked for a
  few times, still walked), then warm and hot (pairs among 256 hosts, their columns traced)
  through ``SaServer.answer_in_place`` (the umad receive thread's way);
- PathRecord GetTable from one source to every end port: time and records/s, cold and warm;
- GetTable of every NodeRecord (skipped when the family is not there);
- Gets over the emulated transport from a host's endpoint (the SA on the SM's port, as
  tests/sa_rig.py wires it) with 1, 4 and 16 outstanding.

With ``--ibsim`` (or ``--ibsim-only``), OpenSM beside ibfm in the same run on one ibsim fabric
(``--sim-levels 3 --sim-radix 12``: 432 hosts, 180 switches; ibsim's limits raised as
bench/vs_opensm.py does), each as master in turn (OpenSM 3.3.23 ``opensm``, then ``ibfm serve
--transport umad``, both on host-00000 with the same guid2lid file so every LID is the same), asked
by a small ctypes libibumad client at another host (this file run again with ``--umad-client``
under libumad2sim: a class 0x03 version 2 agent, ``umad_send`` to the SM's LID, QP1, Q_Key
0x80010000, ``umad_recv``):

- PathRecord Get (SLID+DLID, random host pairs) per second with 1, 4 and 16 outstanding;
- the time of a GetTable of every NodeRecord and of every PathRecord from one source, to the
  first MAD of the answer: libumad2sim has no RMPP, so either SA's answer is cut to one MAD
  (the time includes building the whole table, not sending it).

OpenSM on ibsim measured 4-12k PathRecords/s with 1 outstanding, 9-20k with 4, 17-30k with 16
(ibsim is one single-threaded process: the figures are the SA plus ibsim, and noisy).

Bounded in time; prints figures, asserts nothing. ``--levels 2 --radix 36`` for a quick run.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import random
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import print_vs_table
from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.mad.sa import SaAttr, SaMethod, component_mask, sa_mad
from sm.sa.client import sa_query
from sm.sa.families import all_families
from sm.sa.server import SaServer
from sm.sa.services import serve_port
from sm.sa.store import SaStore
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.base import MadAddress
from sm.transport.emulated import EmulatedTransport
from tests.conftest import stop_process

PR = int(SaAttr.PATH_RECORD)


class Counting:
    """A transport stand-in: answers are counted, not sent (one buffer per answer, as with kernel RMPP)."""

    kernel_rmpp = True

    def __init__(self) -> None:
        self.n = 0
        self.bytes = 0

    def reply(self, mad: bytes, to: MadAddress) -> None:
        self.n += 1
        self.bytes += len(mad)


def pr_query(slid: int = 0, dlid: int = 0) -> bytes:
    q = bytearray(64)
    q[40:42] = dlid.to_bytes(2, "big")
    q[42:44] = slid.to_bytes(2, "big")
    return bytes(q)


def rate(n: int, dt: float) -> str:
    return f"{n / dt:,.0f}/s" if dt > 0 else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, default=3)
    ap.add_argument("--radix", type=int, default=36)
    ap.add_argument("--gets", type=int, default=20000)
    ap.add_argument("--seconds", type=float, default=3.0, help="per window size over the emulated transport")
    ap.add_argument("--ibsim", action="store_true", help="also OpenSM vs ibfm over ibsim")
    ap.add_argument("--ibsim-only", action="store_true", help="only OpenSM vs ibfm over ibsim")
    ap.add_argument("--sim-levels", type=int, default=3)
    ap.add_argument("--sim-radix", type=int, default=12)
    ap.add_argument("--sim-seconds", type=float, default=3.0, help="per window size over ibsim")
    ap.add_argument("--tables", type=int, default=30, help="GetTable repetitions over ibsim (median)")
    ap.add_argument("--rounds", type=int, default=3, help="turns each SM takes over ibsim (medians reported)")
    ap.add_argument("--umad-client", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.umad_client:
        print(json.dumps(umad_client(json.loads(args.umad_client))), flush=True)
        return
    if not args.ibsim_only:
        asyncio.run(run(args))
    if args.ibsim or args.ibsim_only:
        vs_opensm(args)


async def run(args: Any) -> None:
    t0 = time.perf_counter()
    f = fattree(args.levels, args.radix)
    emu = EmulatedFabric(f)
    print(
        f"fabric: fattree({args.levels}, {args.radix}): {len(f.cas):,} hosts, {len(f.switches):,} switches; "
        f"built in {time.perf_counter() - t0:.1f} s"
    )
    sm = EmulatedTransport(emu, issm=True)
    mgr = FabricManager(sm, SmConfig(offload=False, check_credit_loops=False))
    t0 = time.perf_counter()
    snap = await mgr.heavy_sweep()
    print(f"heavy sweep: {time.perf_counter() - t0:.1f} s (engine {snap.engine}, up={snap.up})")
    lids = snap.lids
    ca_lids = [int(lids.base[int(n), 1]) for n in f.cas]
    rows: list[tuple[str, str, str]] = []

    cnt = Counting()
    server = SaServer(cnt, all_families(), lambda: mgr.snapshot, store=SaStore())  # type: ignore[arg-type]
    src = MadAddress(lid=ca_lids[-1], qpn=1, qkey=0x80010000)
    rng = random.Random(0)
    cm = component_mask(PR, ["SLID", "DLID"])
    mads = [
        sa_mad(SaMethod.GET, PR, tid=i, component_mask=cm, data=pr_query(rng.choice(ca_lids), rng.choice(ca_lids)))
        for i in range(args.gets)
    ]
    for label in ("cold", "warm"):
        t = time.perf_counter()
        for m in mads:
            server.take(m, src)
        dt = time.perf_counter() - t
        rows.append(
            (f"PathRecord Get, SaServer.take ({label})", rate(len(mads), dt), f"{dt / len(mads) * 1e6:.1f} us each")
        )
    server.take_inline(mads[0], src)  # keeps the snapshot's fast path
    # Hot: pairs among 256 hosts, each asked for often enough that its LID's column is traced (a LID
    # asked for a few times is walked path by path; see path_record._COLUMN_AFTER).
    hot = rng.sample(ca_lids, 256)
    hot_mads = [
        sa_mad(SaMethod.GET, PR, tid=i, component_mask=cm, data=pr_query(rng.choice(hot), rng.choice(hot)))
        for i in range(args.gets)
    ]
    for m in hot_mads:
        server.take(m, src)
    for label, batch in (("warm", mads), ("hot", hot_mads)):
        bufs = [memoryview(bytearray(m)) for m in batch]
        t = time.perf_counter()
        for m, b in zip(batch, bufs, strict=True):  # what the umad receive thread does: in place, else inline
            if not server.answer_in_place(b, 0, len(m), src.lid):
                server.take_inline(m, src)
        dt = time.perf_counter() - t
        each = f"{dt / len(batch) * 1e6:.1f} us each"
        rows.append((f"PathRecord Get, SaServer.answer_in_place ({label})", rate(len(batch), dt), each))
    ok = server.stats.status.get(0, 0)
    print(f"Gets answered OK: {ok:,} of {server.stats.answered:,}")

    cmt = component_mask(PR, ["SLID"])
    for i, label in enumerate(("cold", "warm")):
        m = sa_mad(SaMethod.GET_TABLE, PR, tid=10**6 + i, component_mask=cmt, data=pr_query(ca_lids[0]))
        before = server.stats.records
        t = time.perf_counter()
        server.take(m, src)
        dt = time.perf_counter() - t
        n = server.stats.records - before
        rows.append(
            (
                f"PathRecord GetTable one source -> all ({label})",
                f"{n / dt:,.0f} rec/s",
                f"{n:,} records in {dt * 1e3:.1f} ms",
            )
        )

    if int(SaAttr.NODE_RECORD) in server.families:
        for i, label in enumerate(("cold", "warm")):
            m = sa_mad(SaMethod.GET_TABLE, int(SaAttr.NODE_RECORD), tid=2 * 10**6 + i)
            before = server.stats.records
            t = time.perf_counter()
            server.take(m, src)
            dt = time.perf_counter() - t
            n = server.stats.records - before
            rows.append(
                (f"NodeRecord GetTable all ({label})", f"{n / dt:,.0f} rec/s", f"{n:,} records in {dt * 1e3:.1f} ms")
            )
    else:
        rows.append(("NodeRecord GetTable all", "skipped", "no NodeRecord family"))

    # over the emulated transport: a host asks the SA on the SM's port
    sa = serve_port(sm, mgr).sa
    host = EmulatedTransport(emu, endpoint=emu.attach(int(f.cas[-1]), 1), timeout=1.0, retries=2)
    try:
        for window in (1, 4, 16):
            done = 0
            fails = 0
            stop = time.perf_counter() + args.seconds

            async def worker(stop: float = stop) -> None:
                nonlocal done, fails
                while time.perf_counter() < stop:
                    data = pr_query(rng.choice(ca_lids), rng.choice(ca_lids))
                    a = await sa_query(host, snap.sm_lid, SaMethod.GET, PR, component_mask=cm, data=data)
                    if a.status == 0:
                        done += 1
                    else:
                        fails += 1

            t = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(window)))
            dt = time.perf_counter() - t
            rows.append(
                (f"PathRecord Get over emulated transport, {window} outstanding", rate(done, dt), f"{fails} not OK")
            )
    finally:
        sa.close()
        await host.close()
        await sm.close()

    w = max(len(r[0]) for r in rows)
    print()
    print(f"{'measure':<{w}}  {'rate':>14}  detail")
    for name, value, detail in rows:
        print(f"{name:<{w}}  {value:>14}  {detail}")


# -- over ibsim: OpenSM vs ibfm, asked by a libibumad client ------------------------------------------

SA_QKEY = 0x80010000
SM_HOST = "host-00000"
CLIENT_HOST = "host-00005"


def umad_client(cfg: dict[str, Any]) -> dict[str, Any]:
    """Inside libumad2sim: PathRecord Gets with each window for ``seconds``; GetTables timed."""
    from sm.transport.umad import load_libibumad

    lib = load_libibumad()
    if lib.umad_init() < 0:
        raise SystemExit("umad_init failed")
    portid = lib.umad_open_port(None, 0)
    if portid < 0:
        raise SystemExit(f"umad_open_port: {portid}")
    agent = lib.umad_register(portid, 0x03, 2, 0, None)
    if agent < 0:
        raise SystemExit(f"umad_register class 0x03: {agent}")
    hs = int(lib.umad_size())
    sbuf = ctypes.create_string_buffer(hs + 256)
    rbuf = ctypes.create_string_buffer(hs + 4096)
    rlen = ctypes.c_int(0)
    sm_lid = int(cfg["sm_lid"])
    hosts = [int(x) for x in cfg["hosts"]]
    rng = random.Random(1)
    tid = [0x1000]

    def send(mad: bytes) -> int:
        tid[0] += 1
        m = bytearray(mad)
        m[8:16] = tid[0].to_bytes(8, "big")
        ctypes.memset(sbuf, 0, hs + 256)
        ctypes.memmove(ctypes.addressof(sbuf) + hs, bytes(m), 256)
        lib.umad_set_addr(sbuf, sm_lid, 1, 0, SA_QKEY)
        rc = lib.umad_send(portid, agent, sbuf, 256, 2000, 0)
        if rc < 0:
            raise SystemExit(f"umad_send: {rc}")
        return tid[0] & 0xFFFFFFFF

    # The windows' loop is lean (the request written once, then per request only its TID and two
    # random LIDs; the address set once, the calls bare, the answer read in place): at 16 outstanding
    # the three processes share 2 cores, and a client that spends much per request measures itself
    # rather than the SM.
    from sm.transport.umad import _bare

    cm = component_mask(PR, ["SLID", "DLID"])
    c_send, c_recv = _bare(lib, "umad_send"), _bare(lib, "umad_recv")
    sview, rview = memoryview(sbuf).cast("B"), memoryview(rbuf).cast("B")
    ctypes.memset(sbuf, 0, hs + 256)
    sview[hs : hs + 256] = sa_mad(SaMethod.GET, PR, tid=0, component_mask=cm, data=pr_query()).ljust(256, b"\0")
    lib.umad_set_addr(sbuf, sm_lid, 1, 0, SA_QKEY)
    plen = ctypes.byref(rlen)
    tid_at = hs + 12
    lids_at = hs + 56 + 40  # SA data: DLID, then SLID
    put = struct.Struct(">I").pack_into
    put_lids = struct.Struct(">HH").pack_into
    choice = rng.choice

    def lean_send() -> int:
        t = tid[0] = tid[0] + 1
        low = t & 0xFFFFFFFF
        put(sview, tid_at, low)
        put_lids(sview, lids_at, choice(hosts), choice(hosts))
        if c_send(portid, agent, sbuf, 256, 2000, 0) < 0:
            raise SystemExit("umad_send failed")
        return low

    def recv() -> tuple[int, int, int] | None:
        """(TID low 32 bits, MAD status, umad status) of the next MAD, read in place; None on a timeout."""
        rlen.value = 4096
        if c_recv(portid, rbuf, plen, 3000) < 0:
            return None
        return (
            int.from_bytes(rview[tid_at : tid_at + 4], "big"),
            rview[hs + 4] << 8 | rview[hs + 5],
            int.from_bytes(rview[4:8], sys.byteorder),  # struct ib_user_mad.status
        )

    out: dict[str, Any] = {"windows": {}}
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    sent0 = tid[0]
    for window in cfg["windows"]:
        for _ in range(50):  # warm up
            lean_send()
            recv()
        ok = bad = lost = 0
        out_tids: set[int] = set()
        t0 = time.perf_counter()
        stop = t0 + float(cfg["seconds"])
        for _ in range(window):
            out_tids.add(lean_send())
        while out_tids:
            r = recv()
            if r is None:
                lost += len(out_tids)
                break
            t, status, ustatus = r
            if t not in out_tids:
                continue
            out_tids.discard(t)
            if ustatus:
                lost += 1
            elif status == 0:
                ok += 1
            else:
                bad += 1
            if time.perf_counter() < stop:
                out_tids.add(lean_send())
        dt = time.perf_counter() - t0
        out["windows"][str(window)] = {"ok": ok, "bad": bad, "lost": lost, "seconds": dt, "rate": ok / dt}
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["client_us_per_request"] = (
        (ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime) / max(tid[0] - sent0, 1) * 1e6
    )

    def table(mad: bytes) -> dict[str, Any]:
        times, statuses = [], set()
        for _ in range(int(cfg["tables"])):
            t0 = time.perf_counter()
            want = send(mad)
            while True:
                r = recv()
                if r is None or r[0] == want:
                    break
            if r is None:
                continue
            times.append(time.perf_counter() - t0)
            statuses.add(r[1])
        return {"median_ms": statistics.median(times) * 1e3 if times else None, "n": len(times),
                "statuses": sorted(statuses)}  # fmt: skip

    out["node_table"] = table(sa_mad(SaMethod.GET_TABLE, int(SaAttr.NODE_RECORD), tid=0))
    cmt = component_mask(PR, ["SLID"])
    out["path_table"] = table(sa_mad(SaMethod.GET_TABLE, PR, tid=0, component_mask=cmt, data=pr_query(hosts[0])))
    out["sent"] = tid[0] - 0x1000
    lib.umad_unregister(portid, agent)
    lib.umad_close_port(portid)
    return out


def _client_run(sim: Any, work: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    env = sim.env(sim_host=CLIENT_HOST)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    cp = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--umad-client", json.dumps(cfg)],
        env=env, cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
    if cp.returncode or not lines:
        raise RuntimeError(f"umad client exit {cp.returncode}:\n{cp.stdout[-2000:]}\n{cp.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _wait(what: str, cond: Any, timeout: float, p: subprocess.Popen[Any]) -> float:
    t0 = time.monotonic()
    while not cond():
        if p.poll() is not None:
            raise RuntimeError(f"{what}: the SM exited {p.returncode}")
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - t0


def vs_opensm(args: Any) -> None:
    from bench.vs_opensm import SIM_SPEED, sim_args
    from fabric.formats.netfile import write_net
    from fabric.ibsim import IbsimProcess, missing_ibsim_tools
    from sm.sweep.lids import write_guid2lid

    missing = missing_ibsim_tools("saquery")
    if missing or shutil.which("opensm") is None:
        print(f"\nover ibsim: skipped (missing: {', '.join(missing) or 'opensm'})")
        return
    f = fattree(args.sim_levels, args.sim_radix, speed=SIM_SPEED)
    ep = f.endports().tolist()
    ordered = sorted(ep, key=lambda np_: (f.is_switch(np_[0]), np_[0]))
    plan = {int(f.port_guid[n, p]): (i, i) for i, (n, p) in enumerate(ordered, start=1)}
    lid_of = {(n, p): i for i, (n, p) in enumerate(ordered, start=1)}
    hosts = [lid_of[(int(n), 1)] for n in f.cas]
    sm_lid = lid_of[(f.by_name(SM_HOST), 1)]
    print(
        f"\nover ibsim: fattree({args.sim_levels}, {args.sim_radix}): {len(f.cas):,} hosts, "
        f"{len(f.switches):,} switches; SM at {SM_HOST} (LID {sm_lid}), client at {CLIENT_HOST}"
    )
    cfg = {"sm_lid": sm_lid, "hosts": hosts, "windows": [1, 4, 16], "seconds": args.sim_seconds,
           "tables": args.tables}  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"OpenSM": [], "ibfm": []}
    with tempfile.TemporaryDirectory(prefix="ibfm-sa-bench-") as tmp:
        work = Path(tmp)
        net = work / "fabric.net"
        write_net(f, net)
        g2l = work / "guid2lid"
        write_guid2lid(g2l, plan)
        with IbsimProcess(net, extra_args=sim_args(f)) as sim:
            assert sim.pid is not None
            sim_pid = sim.pid
            # The machine is shared and noisy: the SMs take turns, round after round, and the
            # medians are compared.
            for rnd in range(args.rounds):
                for name, start in (("OpenSM", _start_opensm), ("ibfm", _start_ibfm)):
                    p, up = start(sim, work / f"{name}-{rnd}", g2l)
                    try:
                        print(f"round {rnd + 1}: {name} subnet up after {up:.1f} s", flush=True)
                        cpu0, sim0 = _cpu_seconds(p.pid), _cpu_seconds(sim_pid)
                        res = _client_run(sim, work, cfg)
                        sent = max(res["sent"], 1)
                        res["cpu_us_per_request"] = (_cpu_seconds(p.pid) - cpu0) / sent * 1e6
                        res["ibsim_us_per_request"] = (_cpu_seconds(sim_pid) - sim0) / sent * 1e6
                        runs[name].append(res)
                    finally:
                        stop_process(p, 5.0)
    print_vs({name: _median_run(rs) for name, rs in runs.items()}, args.rounds)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread), from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _median_run(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over the rounds."""
    med = statistics.median
    out: dict[str, Any] = {"windows": {}}
    for w in rs[0]["windows"]:
        ws = [r["windows"][w] for r in rs]
        out["windows"][w] = {
            "rate": med(x["rate"] for x in ws), "bad": sum(x["bad"] for x in ws), "lost": sum(x["lost"] for x in ws),
            "rates": [x["rate"] for x in ws],
        }  # fmt: skip
    for key in ("node_table", "path_table"):
        ms = [r[key]["median_ms"] for r in rs if r[key]["median_ms"] is not None]
        out[key] = {"median_ms": med(ms) if ms else None}
    for key in ("cpu_us_per_request", "ibsim_us_per_request", "client_us_per_request"):
        out[key] = med(r[key] for r in rs)
    return out


def _start_opensm(sim: Any, work: Path, g2l: Path) -> tuple[subprocess.Popen[Any], float]:
    """OpenSM 3.3.23 as master at SM_HOST with ``g2l``'s LIDs; (process, seconds to SUBNET UP)."""
    (work / "cache").mkdir(parents=True)
    shutil.copy(g2l, work / "cache" / "guid2lid")
    (work / "opensm.conf").write_text("")
    log = work / "opensm.log"
    env = dict(sim.env(sim_host=SM_HOST), OSM_CACHE_DIR=str(work / "cache"))
    p = subprocess.Popen(
        ["opensm", "-F", str(work / "opensm.conf"), "-f", str(log), "-d2", "--honor_guid2lid"],
        env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        up = _wait("OpenSM SUBNET UP", lambda: log.exists() and "SUBNET UP" in log.read_text(errors="replace"), 120, p)
    except BaseException:
        stop_process(p, 5.0)
        raise
    return p, up


def _start_ibfm(sim: Any, work: Path, g2l: Path) -> tuple[subprocess.Popen[Any], float]:
    """``ibfm serve --transport umad`` at SM_HOST with ``g2l``'s LIDs; (process, seconds to subnet up)."""
    work.mkdir(parents=True)
    shutil.copy(g2l, work / "guid2lid")
    env = sim.env(sim_host=SM_HOST)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    env["IBFM_PERFMGR__ENABLED"] = "false"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])

    def health() -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2) as r:
                h: dict[str, Any] = json.load(r)
                return h
        except OSError:
            return {}

    with (work / "ibfm.log").open("w") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "ibfm.cli", "serve", "--transport", "umad", "--listen",
             f"127.0.0.1:{port}", "--sweep-interval", "10", "--guid2lid", str(work / "guid2lid")],
            env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        up = _wait("ibfm subnet up", lambda: health().get("subnet_up") is True, 120, p)
    except BaseException:
        stop_process(p, 5.0)
        raise
    return p, up


def print_vs(results: dict[str, dict[str, Any]], rounds: int) -> None:
    o, i = results.get("OpenSM"), results.get("ibfm")
    if o is None or i is None:
        print("over ibsim: incomplete", results)
        return
    rows: list[tuple[str, str, str, str]] = []
    for w in ("1", "4", "16"):
        a, b = o["windows"][w], i["windows"][w]
        ratio = f"{b['rate'] / a['rate']:.2f}x" if a["rate"] else "-"
        rows.append((f"PathRecord Get, {w} outstanding (/s)", f"{a['rate']:,.0f}", f"{b['rate']:,.0f}", ratio))
        if a["bad"] or a["lost"] or b["bad"] or b["lost"]:
            rows.append((f"  not OK / lost, {w} outstanding", f"{a['bad']}/{a['lost']}", f"{b['bad']}/{b['lost']}", ""))
    if len(o["windows"]["1"]["rates"]) > 1:
        for w in ("1", "4", "16"):
            a, b = o["windows"][w]["rates"], i["windows"][w]["rates"]
            rows.append((f"  each round, {w} outstanding", " ".join(f"{x / 1e3:.1f}k" for x in a),
                         " ".join(f"{x / 1e3:.1f}k" for x in b), ""))  # fmt: skip
    oc, ic = o["cpu_us_per_request"], i["cpu_us_per_request"]
    rows.append(("SM CPU per request, whole run (us)", f"{oc:.1f}", f"{ic:.1f}", f"{oc / ic:.2f}x" if ic else "-"))
    # On 2 cores the 16-outstanding rate is bounded by everyone's CPU per request, not the SM's alone.
    for key, label in (("ibsim_us_per_request", "ibsim"), ("client_us_per_request", "client (Get windows)")):
        a, b = o[key], i[key]
        rows.append((f"  {label} CPU per request (us)", f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}x" if b else "-"))
    for key, label in (("node_table", "NodeRecord GetTable all"), ("path_table", "PathRecord GetTable 1 src -> all")):
        a, b = o[key], i[key]
        am, bm = a["median_ms"], b["median_ms"]
        ratio = f"{am / bm:.2f}x" if am and bm else "-"
        rows.append((f"{label} (ms to 1st MAD)", f"{am:.2f}" if am else "-", f"{bm:.2f}" if bm else "-", ratio))
    print_vs_table(
        f"over ibsim, medians of {rounds} rounds (libumad2sim cuts GetTables to one MAD)", rows, "ibfm/OpenSM",
        "(rates: ibfm/OpenSM > 1 is ibfm faster; times and CPU: OpenSM/ibfm > 1 is ibfm faster)",
    )


if __name__ == "__main__":
    main()
