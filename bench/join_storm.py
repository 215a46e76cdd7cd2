#!/usr/bin/env python3
"""Join storm: every host joins the IPoIB broadcast group, then the MFTs must reach them all.

(a) Emulated, in process (default ``fattree(3, 36)``: 11,664 hosts, 1,620 switches): ibfm's SM sweeps
the emulated fabric (heavy sweep, timed); the SA and the multicast groups are wired as ``ibfm serve``
wires them (``sm.sa.services.serve_port``: the SA answers through the SM's emulated port, the sweeper
programs the MFTs of the SA's groups); a first multicast pass makes the IPoIB broadcast group of the
Default partition and writes the empty group's blocks. Then every host joins, as the Linux IPoIB
driver does (MGID, PortGID, P_Key, JoinState full: tests/mcast_client.py ``broadcast_join``), each
join a 256-byte SA MAD from the host's LID handed to ``SaServer.take`` (the server checks, joins,
answers over the emulated fabric); a sample of hosts first joins over their own emulated transports
(``sa_query`` through the emulator, ``--transport-sample`` of them, 16 outstanding) to show the
end-to-end rate. Printed: the join rates, the MFT pass after the storm (one tree of every host:
time, blocks sent, failures), and the check of what the switches then hold (the emulator's MFTs, read
back): the end ports the masks reach are exactly the hosts, and ``tree_faults`` floods from
``--senders`` members (first, middle, last ...) finding every other member reached once and no loop:
OK or FAILED. Nothing is asserted.

(b) Over ibsim (``--sim-levels 3 --sim-radix 12``: 432 hosts, 180 switches; ibsim's limits raised as
bench/vs_opensm.py does), OpenSM 3.3.23 (``opensm``, no partitions file: it makes Default's
broadcast group at start) and ``ibfm serve --transport umad`` in turn, each on a fresh ibsim with the
same guid2lid file, at host-00000. One client process speaks ibsim's own client protocol
(tests/mcast_client.py ``SimPort``): ibsim 0.10 has 10 client slots and a libumad2sim client is one
process attached at one host, so one process per host is 432 processes started one slot at a time.
Instead ``--clients`` ports each attach as a host, send its join (the same MAD a libumad2sim client
at that host would send: the same SLID, QP1), wait for the answer, detach and attach as the next
host: every host joins once, ``--clients`` joins outstanding at a time. Another port reads MLID
0xC000's MulticastForwardingTable block of every switch with LID-routed SMPs (ibsim answers them
itself) in a loop. Printed per SM: the join phase (first join sent to last answer) and its rate, and
the time from the first join sent to the end of the first read of every switch's MFT in which the
masks reach exactly the hosts and a flood from one member reaches every other once (resolution: one
read of every switch, printed); then ``tree_faults`` from every member on that reading. Then the
ratios. ``--rounds`` repeats both SMs (fresh ibsims) and reports medians: the machine is shared and
ibsim is one single-threaded process carrying every MAD of both the SM and the storm.

Measured (shared machine): (a) 11,664 hosts: heavy sweep 28 s; joins over host transports 2,783/s
with the sweeper idle, 165/s with it running (25 MFT passes in 3 s: each join wakes a pass of about
0.12 s on the event loop the SA answers on); 42,000/s straight into ``SaServer.take``; the MFT pass
after the storm 0.3 s, 1,256 blocks; OK. (b) 432 hosts, medians of 3: first join to MFTs complete
OpenSM 0.20 s, ibfm 0.74 s (joins 2,706/s and 600/s); 1,458 hosts (``--sim-radix 18``): 0.78 s and
7.75 s (2,258/s and 190/s).

Prints figures, asserts nothing. ``--levels 3 --radix 12`` (432 hosts) for a quick emulated run.

    .venv/bin/python bench/join_storm.py                          # (a) 11,664 hosts, then (b) 432 hosts
    .venv/bin/python bench/join_storm.py --emulated-only --radix 12
    .venv/bin/python bench/join_storm.py --ibsim-only --sim-radix 16 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench._common import print_vs_table
from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.mad.sa import SaMethod, sa_mad
from fabric.model import Fabric
from sm.multicast.mft import MCAST_LID_FIRST
from sm.multicast.tree import EndPort, flood_trace, mask_ports, tree_faults
from sm.sa.client import sa_query
from sm.sa.mcast_groups import ipoib_mgid
from sm.sa.services import serve_port
from sm.sweep.events import SweepDone
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.base import MadAddress
from sm.transport.emulated import EmulatedTransport
from tests.mcast_client import MCMR, SA_QKEY, McastClientError, SimPort, broadcast_join, port_gid, read_mft_masks

BROADCAST = ipoib_mgid(0xFFFF)
SM_HOST = "host-00000"


def reached(f: Fabric, masks: dict[int, int]) -> set[EndPort]:
    """End ports the masks forward to (a CA port behind a mask's port; a switch's port 0)."""
    out: set[EndPort] = set()
    for sw, mask in masks.items():
        for p in mask_ports(mask):
            if p == 0:
                out.add((sw, 0))
            elif p <= int(f.nports[sw]):
                peer = int(f.peer_node[sw, p])
                if peer >= 0 and not f.is_switch(peer):
                    out.add((peer, int(f.peer_port[sw, p])))
    return out


def spread(items: Sequence[EndPort], n: int) -> list[EndPort]:
    """``n`` members spread over the list (first, last and evenly between)."""
    if n >= len(items):
        return list(items)
    return [items[round(i * (len(items) - 1) / max(n - 1, 1))] for i in range(n)]


def verdict(f: Fabric, masks: dict[int, int], members: list[EndPort], senders: list[EndPort]) -> tuple[str, float]:
    """OK/FAILED (with the first faults) for ``masks`` delivering to ``members``; the seconds it took."""
    t0 = time.perf_counter()
    problems: list[str] = []
    got = reached(f, masks)
    if got != set(members):
        problems.append(f"the masks reach {len(got)} end ports, {len(got - set(members))} of them no member; "
                        f"{len(set(members) - got)} members unreached")  # fmt: skip
    problems += tree_faults(f, masks, members, senders=senders)
    dt = time.perf_counter() - t0
    if not problems:
        return "OK", dt
    more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
    return "FAILED: " + "; ".join(problems[:3]) + more, dt


# -- (a) emulated, in process ------------------------------------------------------------------------------------


class _PassCounter(logging.Handler):
    """Counts the sweeper's "MFTs: N blocks sent" log lines (a multicast pass that sent blocks)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.n = 0

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("MFTs:"):
            self.n += 1


def emulator_masks(emu: EmulatedFabric, mlid: int) -> dict[int, int]:
    """Per switch node, the port mask its MFT holds for ``mlid`` (empty ones left out)."""
    f = emu.fabric
    out: dict[int, int] = {}
    i = mlid - MCAST_LID_FIRST
    for s in f.switches.tolist():
        row = emu.mft(s)[i].tolist()
        mask = sum(int(m) << (16 * p) for p, m in enumerate(row))
        if mask:
            out[s] = mask
    return out


async def emulated(args: Any) -> None:
    t0 = time.perf_counter()
    f = fattree(args.levels, args.radix)
    emu = EmulatedFabric(f)
    hosts = [(int(c), 1) for c in f.cas.tolist()]
    print(f"(a) emulated fattree({args.levels}, {args.radix}): {len(hosts):,} hosts, {f.switches.size:,} switches; "
          f"built in {time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
    sm = EmulatedTransport(emu, issm=True)
    mgr = FabricManager(sm, SmConfig(offload=False, check_credit_loops=False, sweep_interval=3600.0))
    t0 = time.perf_counter()
    snap = await mgr.heavy_sweep()
    print(f"heavy sweep: {time.perf_counter() - t0:.1f} s (engine {snap.engine}, up={snap.up})", flush=True)
    services = serve_port(sm, mgr)
    groups = services.store.mcast
    rows: list[tuple[str, str, str]] = []
    try:
        t0 = time.perf_counter()
        await mgr.multicast_pass()
        dt = time.perf_counter() - t0
        group = groups.get(BROADCAST)
        if group is None:
            print("no IPoIB broadcast group after the first multicast pass: nothing to join")
            return
        rep = mgr.mft_report
        rows.append(("first multicast pass (group made, no member)", f"{dt:.2f} s",
                     f"{rep.blocks_sent if rep else 0:,} blocks sent, MLID {group.mlid:#06x}"))  # fmt: skip
        lids = snap.lids
        lid_of = {h: int(lids.base[h[0], h[1]]) for h in hosts}
        guid_of = {h: int(f.port_guid[h[0], h[1]]) for h in hosts}
        sa_lid = snap.sm_lid

        # Two samples over the hosts' own emulated transports, 16 outstanding: with the sweeper stopped (the
        # SA alone), then with it running as in the daemon (each join wakes it: an MFT pass on the loop).
        sm_node = int(snap.discovery.sm_node)
        others = [h for h in hosts if h[0] != sm_node]  # not the SM's own port
        n = max(0, args.transport_sample)
        quiet, live = others[:n], others[n : 2 * n]

        async def over_transports(sample: list[EndPort]) -> tuple[float, list[float], int]:
            ports = [EmulatedTransport(emu, endpoint=emu.attach(nd, p), timeout=5.0, retries=2) for nd, p in sample]
            sem = asyncio.Semaphore(16)
            lat: list[float] = []
            bad = 0

            async def join_over(t: EmulatedTransport, h: EndPort) -> None:
                nonlocal bad
                mask, rec = broadcast_join(BROADCAST, port_gid(guid_of[h]), 0xFFFF)
                async with sem:
                    t1 = time.perf_counter()
                    a = await sa_query(t, sa_lid, SaMethod.SET, MCMR, component_mask=mask, data=rec, timeout=10.0)
                    lat.append(time.perf_counter() - t1)
                bad += a.status != 0

            t1 = time.perf_counter()
            await asyncio.gather(*(join_over(t, h) for t, h in zip(ports, sample, strict=True)))
            dt = time.perf_counter() - t1
            for t in ports:
                await t.close()
            return dt, sorted(lat), bad

        def lat_note(lat: list[float]) -> str:
            return f"latency median {lat[len(lat) // 2] * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms" if lat else ""

        if quiet:
            dt, lat, bad = await over_transports(quiet)
            rows.append((f"joins over emulated host transports, sweeper idle ({len(quiet)})",
                         f"{len(quiet) / dt:,.0f}/s", f"{dt:.2f} s, {bad} not OK, {lat_note(lat)}"))  # fmt: skip
        if live:
            passes = _PassCounter()
            sm_log = logging.getLogger("ibfm.sm")
            level = sm_log.level
            sm_log.setLevel(logging.INFO)
            sm_log.addHandler(passes)
            stop, swept = asyncio.Event(), asyncio.Event()
            unsubscribe = mgr.events.subscribe(lambda ev: swept.set() if isinstance(ev, SweepDone) else None)
            sweeper = asyncio.create_task(mgr.run(stop))
            await swept.wait()  # the sweep run() starts with (a light one)
            unsubscribe()
            p0 = passes.n
            dt, lat, bad = await over_transports(live)
            stop.set()
            await sweeper
            sm_log.removeHandler(passes)
            sm_log.setLevel(level)
            rows.append((f"joins over emulated host transports, sweeper running ({len(live)})",
                         f"{len(live) / dt:,.0f}/s", f"{dt:.2f} s, {bad} not OK, {lat_note(lat)}, "
                         f"{passes.n - p0} MFT passes sent blocks meanwhile"))  # fmt: skip

        # the rest straight into SaServer.take, as MADs from each host's LID
        joined = set(quiet) | set(live)
        rest = [h for h in hosts if h not in joined]
        mads = []
        for i, h in enumerate(rest):
            mask, rec = broadcast_join(BROADCAST, port_gid(guid_of[h]), 0xFFFF)
            mads.append((sa_mad(SaMethod.SET, MCMR, tid=0x10000 + i, component_mask=mask, data=rec),
                         MadAddress(lid=lid_of[h], qpn=1, qkey=SA_QKEY)))  # fmt: skip
        st = services.sa.stats
        before, dropped = dict(st.status), st.dropped
        t0 = time.perf_counter()
        for mad, src in mads:
            services.sa.take(mad, src)
        dt = time.perf_counter() - t0
        await asyncio.sleep(0)
        ok = st.status.get(0, 0) - before.get(0, 0)
        bad = sum(st.status.values()) - sum(before.values()) - ok
        rows.append((f"joins through SaServer.take ({len(rest):,})", f"{len(rest) / dt:,.0f}/s",
                     f"{dt:.2f} s; answers: {ok:,} sent OK, {bad} error statuses, {st.dropped - dropped:,} "
                     "with no client at the host's port to go to"))  # fmt: skip
        members = sorted(groups.ports(group))
        rows.append(("members of the broadcast group", f"{len(members):,}", f"of {len(hosts):,} hosts"))

        t0 = time.perf_counter()
        await mgr.multicast_pass()
        dt = time.perf_counter() - t0
        rep = mgr.mft_report
        assert rep is not None
        rows.append(("MFT pass after the storm (tree + blocks)", f"{dt:.2f} s",
                     f"{rep.blocks_sent:,} blocks sent, {rep.blocks_skipped:,} unchanged, "
                     f"{len(rep.failures)} failures"))  # fmt: skip
        masks = emulator_masks(emu, group.mlid)
        want = [f.by_port_guid(g) for g in members]
        want = [(int(n), int(p)) for n, p in want]
        senders = spread(want, args.senders)
        result, dt = verdict(f, masks, want, senders)
        note = f"{len(masks):,} switches in the tree, {len(senders)} senders, checked in {dt:.1f} s"
        rows.append(("emulator's MFTs: reach and tree_faults", result, note))
    finally:
        services.close()
        await sm.close()
    w = max(len(r[0]) for r in rows)
    print()
    print(f"{'measure':<{w}}  {'figure':>14}  detail")
    for a, b, c in rows:
        print(f"{a:<{w}}  {b:>14}  {c}")


# -- (b) over ibsim: OpenSM and ibfm in turn ---------------------------------------------------------------------


@dataclass
class StormRun:
    sm: str
    up_s: float = 0.0
    joins: int = 0
    bad: list[str] = field(default_factory=list)
    join_s: float = 0.0
    """First join sent to last answer."""
    mft_s: float | None = None
    """First join sent to the end of the first complete reading."""
    read_s: list[float] = field(default_factory=list)
    """Seconds per reading of every switch's block."""
    readings: int = 0
    check: str = "-"
    check_s: float = 0.0


def storm(sim_sock: str, f: Fabric, lid_of: dict[EndPort, int], sm_lid: int, args: Any, run: StormRun) -> None:
    """Every host joins through ``args.clients`` SimPorts; another port reads the MFTs until they are complete."""
    hosts = [(int(c), 1) for c in f.cas.tolist()]
    switches = [(int(s), lid_of[(int(s), 0)], int(f.nports[s])) for s in f.switches.tolist()]
    want = set(hosts)
    sender = hosts[len(hosts) // 2]
    reader = SimPort(sim_sock, timeout=0.5, retries=4)
    reader.attach(f.names[hosts[1][0]])
    # Nothing of the group is programmed yet (a fresh fabric; the SM wrote the empty group).
    deadline = time.monotonic() + 30
    while read_mft_masks(reader, switches, MCAST_LID_FIRST):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{run.sm}: MLID 0xc000 is programmed before any join")
        time.sleep(0.2)
    done = threading.Event()
    t_first = [0.0]
    t_last = [0.0]
    lock = threading.Lock()
    queue = list(reversed(hosts))
    started = threading.Event()

    def worker() -> None:
        port = SimPort(sim_sock, timeout=1.0, retries=3)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    h = queue.pop()
                name = f.names[h[0]]
                port.attach(name)
                mask, rec = broadcast_join(BROADCAST, port_gid(int(f.port_guid[h[0], h[1]])), 0xFFFF)
                with lock:
                    if not t_first[0]:
                        t_first[0] = time.perf_counter()
                        started.set()
                try:
                    ans = port.sa(sm_lid, SaMethod.SET, mask, rec)
                    err = f"{name}: status {ans.status:#06x}" if ans.status else ""
                except McastClientError as e:
                    err = f"{name}: {e}"
                with lock:
                    t_last[0] = time.perf_counter()
                    run.joins += 1
                    if err:
                        run.bad.append(err)
        finally:
            port.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.clients)]
    for t in threads:
        t.start()
    started.wait(30)
    masks: dict[int, int] = {}
    try:
        while not done.is_set():
            r0 = time.perf_counter()
            masks = read_mft_masks(reader, switches, MCAST_LID_FIRST)
            r1 = time.perf_counter()
            run.read_s.append(r1 - r0)
            run.readings += 1
            if reached(f, masks) == want:
                got = flood_trace(f, masks, sender).delivered
                if all(got.get(h, 0) == (0 if h == sender else 1) for h in hosts) and len(got) == len(hosts) - 1:
                    run.mft_s = r1 - t_first[0]
                    break
            if r1 - t_first[0] > args.mft_timeout:
                break
    finally:
        for t in threads:
            t.join()
        reader.close()
    run.join_s = t_last[0] - t_first[0]
    if run.mft_s is not None:
        run.check, run.check_s = verdict(f, masks, hosts, hosts)
    else:
        run.check = f"no complete MFT within {args.mft_timeout:.0f} s: {len(reached(f, masks))} end ports reached"


def one_round(args: Any, f: Fabric, work: Path, rnd: int) -> list[StormRun]:
    from bench.vs_opensm import sim_args
    from fabric.formats.netfile import write_net
    from fabric.ibsim import IbsimProcess
    from sm.sweep.lids import write_guid2lid
    from tests.saquery_ref import opensm_sa
    from tests.test_ibsim_election import wait_for
    from tests.test_ibsim_sa import ibfm_serve_at
    from tests.test_ibsim_sm import Sim

    ep = f.endports().tolist()
    ordered = sorted(ep, key=lambda np_: (f.is_switch(np_[0]), np_[0]))
    lid_of = {(int(n), int(p)): i for i, (n, p) in enumerate(ordered, start=1)}
    plan = {int(f.port_guid[n, p]): (i, i) for (n, p), i in lid_of.items()}
    net = work / "fabric.net"
    if not net.exists():
        write_net(f, net)
    g2l = work / "guid2lid"
    write_guid2lid(g2l, plan)
    sm_lid = lid_of[(f.by_name(SM_HOST), 1)]
    runs = []
    for name in ("OpenSM", "ibfm"):
        run = StormRun(name)
        where = work / f"{name}-{rnd}"
        where.mkdir()
        with IbsimProcess(net, extra_args=sim_args(f)) as proc:
            sim = Sim(proc, net, where, SM_HOST)
            t0 = time.monotonic()
            if name == "OpenSM":
                with opensm_sa(proc, where / "opensm", sm_host=SM_HOST, guid2lid=g2l, up_timeout=300) as osm:
                    run.up_s = time.monotonic() - t0
                    storm(proc.sockname, f, lid_of, sm_lid, args, run)
                    if osm.proc.poll() is not None:
                        run.check += " (OpenSM exited)"
            else:
                with ibfm_serve_at(sim, g2l) as ib:

                    def up(ib: Any = ib) -> bool:
                        return ib.health().get("subnet_up") is True

                    try:
                        run.up_s = wait_for("ibfm subnet up", up, 120)
                    except AssertionError:
                        print(ib.log.read_text()[-3000:])
                        raise
                    storm(proc.sockname, f, lid_of, sm_lid, args, run)
                    if ib.proc.poll() is not None:
                        run.check += " (ibfm exited)"
            if not proc.alive():
                run.check += " (ibsim died: " + proc.output()[-300:].strip() + ")"
        mft = f"{run.mft_s:.2f} s" if run.mft_s is not None else "never"
        print(f"round {rnd + 1}, {name}: up in {run.up_s:.1f} s; {run.joins} joins in {run.join_s:.2f} s "
              f"({len(run.bad)} failed); MFTs complete {mft} after the first join "
              f"({run.readings} readings, {statistics.median(run.read_s) * 1e3:.0f} ms each); {run.check} "
              f"({run.check_s:.1f} s)", flush=True)  # fmt: skip
        for b in run.bad[:3]:
            print(f"    {b}")
        runs.append(run)
    return runs


def over_ibsim(args: Any) -> None:
    from fabric.ibsim import missing_ibsim_tools

    missing = missing_ibsim_tools("opensm")
    if missing:
        print(f"\n(b) over ibsim: skipped (missing: {', '.join(missing)})")
        return
    from bench.vs_opensm import SIM_SPEED

    f = fattree(args.sim_levels, args.sim_radix, speed=SIM_SPEED)
    print(f"\n(b) over ibsim: fattree({args.sim_levels}, {args.sim_radix}): {len(f.cas):,} hosts, "
          f"{f.switches.size:,} switches; SM at {SM_HOST}; {args.clients} client slots joining, one reading MFTs",
          flush=True)  # fmt: skip
    runs: dict[str, list[StormRun]] = {"OpenSM": [], "ibfm": []}
    with tempfile.TemporaryDirectory(prefix="ibfm-join-storm-") as tmp:
        for rnd in range(args.rounds):
            for r in one_round(args, f, Path(tmp), rnd):
                runs[r.sm].append(r)
    print_vs(runs, args.rounds)


def _median(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals and len(vals) == len(xs) else None


def print_vs(runs: dict[str, list[StormRun]], rounds: int) -> None:
    o, i = runs["OpenSM"], runs["ibfm"]
    rows: list[tuple[str, str, str, str]] = []

    def row(label: str, a: float | None, b: float | None, fmt: str, faster_if_lower: bool) -> None:
        ratio = "-"
        if a and b:
            ratio = f"{a / b:.2f}x" if faster_if_lower else f"{b / a:.2f}x"
        rows.append((label, format(a, fmt) if a is not None else "-", format(b, fmt) if b is not None else "-", ratio))

    row("subnet up (s)", _median([r.up_s for r in o]), _median([r.up_s for r in i]), ".2f", True)
    row("join phase: first sent -> last answered (s)", _median([r.join_s for r in o]),
        _median([r.join_s for r in i]), ".3f", True)  # fmt: skip
    row("join rate (/s)", _median([r.joins / r.join_s if r.join_s else None for r in o]),
        _median([r.joins / r.join_s if r.join_s else None for r in i]), ",.0f", False)  # fmt: skip
    row("first join -> MFTs complete on every switch (s)", _median([r.mft_s for r in o]),
        _median([r.mft_s for r in i]), ".3f", True)  # fmt: skip
    row("  resolution: one reading of every switch (ms)", _median([statistics.median(r.read_s) * 1e3 for r in o]),
        _median([statistics.median(r.read_s) * 1e3 for r in i]), ".0f", True)  # fmt: skip
    rows[-1] = (*rows[-1][:3], "")
    if rounds > 1:
        for label, get in (("  each round, MFTs complete (s)", lambda r: r.mft_s),):
            rows.append((label, " ".join(f"{get(r):.2f}" if get(r) is not None else "-" for r in o),
                         " ".join(f"{get(r):.2f}" if get(r) is not None else "-" for r in i), ""))  # fmt: skip
    rows.append(("failed joins", str(sum(len(r.bad) for r in o)), str(sum(len(r.bad) for r in i)), ""))
    rows.append(("tree_faults from every member", ", ".join(r.check.split(":")[0] for r in o),
                 ", ".join(r.check.split(":")[0] for r in i), ""))  # fmt: skip
    print_vs_table(
        f"(b) over ibsim, medians of {rounds} round{'s' if rounds > 1 else ''}", rows, "ratio",
        "(ratio > 1: ibfm faster; times are OpenSM/ibfm, the rate ibfm/OpenSM)",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", type=int, default=3)
    ap.add_argument("--radix", type=int, default=36)
    ap.add_argument("--transport-sample", type=int, default=500,
                    help="hosts of (a) joining over their own emulated transports, sweeper idle, then as many "
                    "with the sweeper running")  # fmt: skip
    ap.add_argument("--senders", type=int, default=3, help="flood senders of (a)'s tree_faults check")
    ap.add_argument("--emulated-only", action="store_true")
    ap.add_argument("--ibsim-only", action="store_true")
    ap.add_argument("--sim-levels", type=int, default=3)
    ap.add_argument("--sim-radix", type=int, default=12)
    ap.add_argument("--clients", type=int, default=6, help="ibsim client slots joining at a time (ibsim has 10)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--mft-timeout", type=float, default=120.0)
    args = ap.parse_args()
    if not args.ibsim_only:
        asyncio.run(emulated(args))
    if not args.emulated_only:
        over_ibsim(args)


if __name__ == "__main__":
    main()
