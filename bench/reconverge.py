"""Reconvergence after one inter-switch link failure: ibfm on the emulator, ibfm and OpenSM on ibsim.

``--mode emulator`` (default): for each tree bring the subnet up on the
emulated fabric, cut one inter-switch link (seeded), and time from the cut
to repaired LFTs in the switches: the trap wakes the sweeper, a light sweep
finds the change, the heavy sweep routes on the last discovery with the
link removed and sends only the blocks that changed. Prints time, SMPs,
LFT blocks sent (and the full table size for scale), and the engine before
and after.

``--mode ibsim``: the same cut on ibsim, for each SM in ``--sms`` on a fresh
simulator: ``ibfm`` (FabricManager over libibumad, as a daemon at a host
CA, bench/_sm_runner.py), ``opensm-ftree`` (``opensm -R ftree``) and
``opensm`` (its default engine), all sweeping every second and woken by
trap 128. After bring-up and a quiet spell the link is cut on ibsim's
console; the time to repaired LFTs is from the cut to ibfm's
``programmed_at`` (LFTs and port states in) or to the first ``SUBNET UP``
OpenSM logs after the cut (its log timestamp); "posted" is OpenSM's
"tables configured on all switches" line, when its last LFT block was
posted but not yet answered (a lower bound for OpenSM). SMPs: the SM's own counter
(ibfm's transport, OpenSM's console ``status`` "QP0 MADs sent") from just
before the cut to just after the repair, so a timer light sweep may fall
in. LFT blocks: ibfm's count of LFT Sets; for OpenSM its DEBUG log
("Writing FT block"), from a second run with ``-D 0x0B`` (DEBUG logging
slows it, so that run gives no time). OpenSM runs without ``-d2`` (a flush
after every log message); its log is buffered, so the script follows it by
sending SIGUSR1, which makes OpenSM reopen its log file (as for logrotate)
and so flush it, from its otherwise idle main thread; the times come from the
log's own timestamps. Every row is checked with
``ibroute`` of both switches at the cut: every LID routed, none through
the cut port. Timings on a shared 2-core machine are noisy.

    python bench/reconverge.py [--mode emulator|ibsim] [--sizes 2:36,3:12,3:24] [--seed 1]
                               [--sms ibfm,opensm-ftree,opensm] [--no-opensm-blocks]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from _sm_runner import SmRunner

from fabric.emulator import EmulatedFabric
from fabric.formats.netfile import read_net, write_net
from fabric.generate import fattree
from fabric.ibsim import IbsimProcess, ibsim_size_args
from fabric.model import Fabric, Speed
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.emulated import EmulatedTransport

Row = dict[str, Any]


async def one(levels: int, radix: int, seed: int) -> dict[str, object]:
    f = fattree(levels, radix)
    emu = EmulatedFabric(f)
    mgr = FabricManager(EmulatedTransport(emu, window=256), SmConfig(sweep_interval=3600))
    t0 = time.perf_counter()
    first = await mgr.heavy_sweep()
    up_s = time.perf_counter() - t0
    total_blocks = first.program.blocks_sent
    links = f.switch_links()
    n, p = (int(x) for x in links[random.Random(seed).randrange(links.shape[0]), :2])
    stop = asyncio.Event()
    loop_task = asyncio.create_task(mgr.run(stop))
    await asyncio.sleep(0.05)  # the loop's first light sweep finds nothing
    while mgr.snapshot is not first or mgr._wake.is_set():
        await asyncio.sleep(0.01)
    sent0 = mgr.transport.stats.sent
    t_cut = time.time()
    emu.link_down(n, p)
    while mgr.snapshot is first:
        await asyncio.sleep(0.001)
    snap = mgr.snapshot
    assert snap is not None
    repaired = snap.programmed_at - t_cut  # LFTs in the switches; verification follows
    stop.set()
    await loop_task
    assert snap is not None
    return {
        "tree": f"{levels}L k={radix}",
        "hosts": int(f.cas.size),
        "bring_up_s": up_s,
        "cut": f"{f.names[n]}[{p}]",
        "repair_s": repaired,
        "smps": mgr.transport.stats.sent - sent0,
        "blocks": snap.program.blocks_sent,
        "blocks_full": total_blocks,
        "engine": f"{first.engine} -> {snap.engine}",
        "routed": snap.verify.ok,
    }


# -- ibsim: ibfm and OpenSM on the same cut ------------------------------------------------------------------

SM_HOST = "host-00000"
SWEEP_S = 1
LOG_POLL_S = 0.025
"""OpenSM's log: pause after asking it to flush, and again between reads (about 20 flushes a second)."""
# ibsim 0.10 parses link rates up to QDR in net-file comments.
SIM_SPEED = Speed.QDR
_ROUTE_RE = re.compile(r"^0x([0-9a-f]{4}) (\d{3})\b", re.M)
_G2L_RE = re.compile(r"^\s*0x([0-9a-fA-F]+)\s+(0x[0-9a-fA-F]+|\d+)", re.M)
_LOG_RE = re.compile(r"^(\w{3}) +(\d+) (\d\d:\d\d:\d\d) (\d{6}) \[[0-9A-Fa-f]+\] 0x[0-9a-f]{2} -> (.*)$", re.M)


class Cut:
    """One inter-switch link of a tree, picked by seed, cut and checked on every SM alike."""

    def __init__(self, fabric: Fabric, seed: int) -> None:
        links = fabric.switch_links()
        n, p, m, q = (int(x) for x in links[random.Random(seed).randrange(links.shape[0])])
        self.fabric = fabric
        self.ends = ((n, p), (m, q))

    @property
    def name(self) -> str:
        (n, p), (m, q) = self.ends
        f = self.fabric
        return f"{f.names[n]}[{p}]-{f.names[m]}[{q}]"

    def command(self) -> str:
        (n, p), _ = self.ends
        return f'Unlink "{self.fabric.names[n]}"[{p}]'

    def check(self, sim: IbsimProcess, g2l: dict[int, int], cwd: Path) -> str:
        """``ibroute`` of both switches at the cut: every LID listed, none through the cut port."""
        n_lids = len(g2l)
        for node, port in self.ends:
            lid = g2l.get(int(self.fabric.port_guid[node, 0]))
            if lid is None:
                return f"no LID for {self.fabric.names[node]}"
            out = subprocess.run(
                ["ibroute", str(lid)], env=sim.env(sim_host=SM_HOST), cwd=cwd, capture_output=True, text=True,
                timeout=120,
            ).stdout  # fmt: skip
            entries = {int(a, 16): int(b) for a, b in _ROUTE_RE.findall(out)}
            through = sum(1 for x in entries.values() if x == port)
            # ibroute skips the top LID when it opens a new 64-LID block.
            if through or len(entries) < n_lids - 1:
                return f"{self.fabric.names[node]}: {len(entries)} of {n_lids} LIDs, {through} via port {port}"
        return "ok"


def _guid2lid(path: Path) -> dict[int, int]:
    return {int(g, 16): int(lid, 0) for g, lid in _G2L_RE.findall(path.read_text())} if path.exists() else {}


def _sim(net: Path, fabric: Fabric) -> IbsimProcess:
    size = ibsim_size_args(fabric.n_nodes, int(fabric.switches.size), int(fabric.port_exists.sum()))
    return IbsimProcess(net, extra_args=size, start_timeout=300)


def ibsim_ibfm(net: Path, fabric: Fabric, cut: Cut, work: Path) -> Row:
    n_sw = int(fabric.switches.size)
    with _sim(net, fabric) as sim, SmRunner(sim, SM_HOST, work / "ibfm", sweep_interval=SWEEP_S) as sm:
        t0 = time.time()
        up = sm.wait_sweep(up=True, timeout=1800)
        bring_up = time.time() - t0
        # Quiet: a light sweep that found no PortStateChange left over from bring-up.
        sm.wait_for(lambda d: d.get("event", {}).get("kind") == "light" and d["event"]["smps"] == n_sw, timeout=600)
        before = sm.command("status")
        mark = sm.mark()
        t_cut = time.time()
        sim.command(cut.command())
        _, line = sm.wait_for(
            lambda d: d.get("event", {}).get("kind") == "heavy" and d["event"]["type"] == "sweep_done",
            start=mark,
            timeout=600,
        )
        after = sm.command("status")
        ev = line["event"]
        blocks = sum(e["lft_blocks_sent"] for e in sm.events("sweep_done", mark) if e["kind"] == "heavy")
        check = cut.check(sim, _guid2lid(sm.guid2lid), sm.work)
        return {
            "sm": "ibfm",
            "bring_up_s": bring_up,
            "repair_s": line["programmed_at"] - t_cut,
            "posted_s": None,
            "smps": after["smps_total"] - before["smps_total"],
            "timeouts": after["timeouts"] - before["timeouts"],
            "blocks": blocks,
            "engine": f"{up['engine']} -> {ev['engine']}",
            "check": check if ev["subnet_up"] else f"subnet not up; {check}",
            "note": "",
        }


class OpenSm:
    """``opensm`` (not --once) under libumad2sim at the SM host, its log, and its local console.

    No ``-d2``: that flushes the log after every message, in the thread that logs,
    and would slow the SM being timed. The log stays buffered, and :meth:`text` asks
    for a flush with SIGUSR1 (OpenSM's main thread, idle in its console loop, then
    reopens the log file, which flushes it). Without ``-e`` the reopened file is
    appended to, not truncated; each run has its own fresh directory.
    """

    def __init__(self, sim: IbsimProcess, work: Path, engine: str | None, debug: bool) -> None:
        self.work = work
        self.log = work / "opensm.log"
        (work / "cache").mkdir(parents=True)
        (work / "dump").mkdir()
        conf = work / "opensm.conf"
        conf.write_text("")  # not /etc/opensm/opensm.conf
        env = sim.env(sim_host=SM_HOST)
        env["OSM_CACHE_DIR"] = str(work / "cache")
        argv = ["opensm", "-F", str(conf), "-f", str(self.log), "-s", str(SWEEP_S), "-q", "local",
                "--dump_files_dir", str(work / "dump"), "-D", "0x0B" if debug else "0x03"]  # fmt: skip
        if engine:
            argv += ["-R", engine]
        self._out = bytearray()
        self._cond = threading.Condition()
        self._proc = subprocess.Popen(
            argv, env=env, cwd=work, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()
        self.guid2lid = work / "cache" / "guid2lid"

    def _read(self, pipe: IO[bytes]) -> None:
        while chunk := pipe.read1(65536):  # type: ignore[attr-defined]
            with self._cond:
                self._out += chunk
                self._cond.notify_all()

    def text(self) -> str:
        """The log so far, flushed first: SIGUSR1, then a pause for OpenSM's main thread to reopen the file.

        The log file exists once OpenSM has blocked its signals (a SIGUSR1 before that would kill it);
        one sent while they are blocked waits until its handlers are set up.
        """
        if not self.log.exists():
            return ""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGUSR1)
            time.sleep(LOG_POLL_S)
        return self.log.read_text(errors="replace")

    def wait_log(self, what: str, start: int = 0, timeout: float = 600.0) -> int:
        """Offset just past the first line containing ``what`` at or after ``start``."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            i = text.find(what, start)
            if i >= 0:
                return text.find("\n", i) + 1 or len(text)
            if self._proc.poll() is not None:
                raise RuntimeError(f"opensm exited {self._proc.returncode}: {text[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what!r} in the OpenSM log within {timeout:.0f} s")
            time.sleep(LOG_POLL_S)

    def quiet(self, start: int, spell: float = 3.0, timeout: float = 600.0) -> int:
        """Wait until the log shows no new SUBNET UP for ``spell`` seconds; the offset then."""
        deadline = time.monotonic() + timeout
        last, since = self.text().count("SUBNET UP", start), time.monotonic()
        while time.monotonic() - since < spell and time.monotonic() < deadline:
            time.sleep(0.2)
            now = self.text().count("SUBNET UP", start)
            if now != last:
                last, since = now, time.monotonic()
        return len(self.text())

    def mads_sent(self, timeout: float = 30.0) -> int:
        """QP0 MADs sent, from the console's ``status``."""
        with self._cond:
            start = len(self._out)
        assert self._proc.stdin is not None
        self._proc.stdin.write(b"status\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                m = re.search(rb"QP0 MADs sent\s*:\s*(\d+)", self._out[start:])
                if m:
                    return int(m.group(1))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("no answer from the OpenSM console")
                self._cond.wait(left)

    def stop(self) -> None:
        proc = self._proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()


def _log_time(line: re.Match[str]) -> float:
    mon, day, hms, usec = line.group(1), line.group(2), line.group(3), line.group(4)
    year = time.localtime().tm_year
    return time.mktime(time.strptime(f"{year} {mon} {day} {hms}", "%Y %b %d %H:%M:%S")) + int(usec) / 1e6


def _engine(text: str) -> str:
    found = re.findall(r"osm_ucast_mgr_process: (\S+) tables configured on all switches", text)
    return found[-1] if found else "?"


def ibsim_opensm(net: Path, fabric: Fabric, cut: Cut, work: Path, engine: str | None, count_blocks: bool) -> Row:
    name = f"opensm -R {engine}" if engine else "opensm"
    with _sim(net, fabric) as sim:
        osm = OpenSm(sim, work / "timed", engine, debug=False)
        try:
            t0 = time.time()
            pos = osm.wait_log("SUBNET UP", timeout=1800)
            bring_up = time.time() - t0
            pos = osm.quiet(pos)
            first = _engine(osm.text()[:pos])
            sent0 = osm.mads_sent()
            t_cut = time.time()
            sim.command(cut.command())
            end = osm.wait_log("SUBNET UP", start=pos)
            sent1 = osm.mads_sent()
            text = osm.text()
            lines = list(_LOG_RE.finditer(text, pos, end))
            repair = next(_log_time(m) for m in lines if m.group(5).startswith("SUBNET UP")) - t_cut
            # "tables configured": every LFT block posted (not yet acknowledged), a lower bound.
            posted = next((_log_time(m) - t_cut for m in lines if "tables configured on all" in m.group(5)), None)
            after = _engine(text[pos:end])
            refused = "not a fat-tree" in text[pos:end]
            check = cut.check(sim, _guid2lid(osm.guid2lid), osm.work)
        finally:
            osm.stop()
    blocks: int | str = "n/a"
    if count_blocks:
        blocks = _opensm_blocks(net, fabric, cut, work / "debug", engine)
    return {
        "sm": name,
        "bring_up_s": bring_up,
        "repair_s": repair,
        "posted_s": posted,
        "smps": sent1 - sent0,
        "timeouts": "",
        "blocks": blocks,
        "engine": f"{first} -> {after}",
        "check": check,
        "note": "ftree refused the degraded tree" if refused else "",
    }


def _opensm_blocks(net: Path, fabric: Fabric, cut: Cut, work: Path, engine: str | None) -> int:
    """LFT blocks OpenSM sends to repair the cut: its DEBUG log's "Writing FT block" lines."""
    with _sim(net, fabric) as sim:
        osm = OpenSm(sim, work, engine, debug=True)
        try:
            pos = osm.quiet(osm.wait_log("SUBNET UP", timeout=3600))
            sim.command(cut.command())
            end = osm.wait_log("SUBNET UP", start=pos, timeout=1800)
            return osm.text()[pos:end].count("set_lft_block: Writing FT block")
        finally:
            osm.stop()


def ibsim_rows(levels: int, radix: int, seed: int, sms: list[str], count_blocks: bool) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ibfm-reconverge-") as tmp:
        work = Path(tmp)
        net = work / "fabric.net"
        write_net(fattree(levels, radix, speed=SIM_SPEED), net)
        fabric = read_net(net)  # GUIDs and ports as ibsim has them
        cut = Cut(fabric, seed)
        for sm in sms:
            if sm == "ibfm":
                row = ibsim_ibfm(net, fabric, cut, work / sm)
            elif sm.startswith("opensm"):
                engine = sm.removeprefix("opensm").lstrip("-") or None
                row = ibsim_opensm(net, fabric, cut, work / sm, engine, count_blocks)
            else:
                raise SystemExit(f"unknown SM {sm!r} (ibfm, opensm, opensm-ENGINE)")
            row.update(tree=f"{levels}L k={radix}", hosts=int(fabric.cas.size), cut=cut.name)
            rows.append(row)
            print_ibsim([row], header=len(rows) == 1, flush=True)
    return rows


def print_ibsim(rows: list[Row], *, header: bool = True, flush: bool = False) -> None:
    if header:
        print(
            f"{'tree':<9} {'hosts':>5} {'SM':<15} {'up s':>6} {'repair s':>9} {'posted s':>8} {'SMPs':>6} "
            f"{'timeouts':>8} "
            f"{'blocks':>6}  {'engine before -> after':<22} {'cut':<26} ibroute check"
        )
    for r in rows:
        print(
            f"{r['tree']:<9} {r['hosts']:>5} {r['sm']:<15} {r['bring_up_s']:>6.1f} {r['repair_s']:>9.3f} "
            f"{'' if r['posted_s'] is None else format(r['posted_s'], '.3f'):>8} {r['smps']:>6} {r['timeouts']!s:>8} "
            f"{r['blocks']!s:>6}  {r['engine']:<22} {r['cut']:<26} {r['check']}"
            + (f"  ({r['note']})" if r["note"] else ""),
            flush=flush,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("emulator", "ibsim"), default="emulator")
    ap.add_argument("--sizes", default="2:36,3:12,3:24", help="levels:radix list")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sms", default="ibfm,opensm-ftree,opensm", help="ibsim mode: SMs to run, in order")
    ap.add_argument("--no-opensm-blocks", action="store_true", help="ibsim mode: skip OpenSM's DEBUG-log run")
    args = ap.parse_args()
    if args.mode == "ibsim":
        missing = [t for t in ("ibsim", "opensm", "ibroute") if shutil.which(t) is None]
        if missing:
            raise SystemExit(f"missing: {', '.join(missing)}")
        print(f"ibsim, one inter-switch link cut (seed {args.seed}), SM at {SM_HOST}, sweep interval {SWEEP_S} s")
        for spec in args.sizes.split(","):
            lv, k = (int(x) for x in spec.split(":"))
            ibsim_rows(lv, k, args.seed, args.sms.split(","), not args.no_opensm_blocks)
        return
    rows = []
    for spec in args.sizes.split(","):
        lv, k = (int(x) for x in spec.split(":"))
        rows.append(asyncio.run(one(lv, k, args.seed)))
    head = (
        f"{'tree':<10} {'hosts':>6} {'up s':>7} {'cut':<22} {'repair s':>9} "
        f"{'SMPs':>7} {'blocks':>7} {'of':>7} engine"
    )
    print("emulated fabric, one inter-switch link cut, trap-driven sweep")
    print(head)
    for r in rows:
        print(
            f"{r['tree']:<10} {r['hosts']:>6} {r['bring_up_s']:>7.2f} {r['cut']!s:<22} {r['repair_s']:>9.3f} "
            f"{r['smps']:>7} {r['blocks']:>7} {r['blocks_full']:>7} {r['engine']}"
            + ("" if r["routed"] else "  NOT ROUTED")
        )


if __name__ == "__main__":
    main()
