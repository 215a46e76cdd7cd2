#!/usr/bin/env python3
"""SA PathRecord throughput on an emulated fat tree (default 3-level k=36: 11,664 hosts).

ibfm sweeps the emulated fabric (heavy sweep, timed), then:

- PathRecord Get (SLID+DLID, random CA pairs) straight through ``SaServer.take`` with a
  transport whose ``reply`` only counts: queries/s cold (each destination LID's column
  traced on first use) and warm (the same requests again);
- PathRecord GetTable from one source to every end port: time and records/s, cold and warm;
- GetTable of every NodeRecord (skipped when the family is not there);
- Gets over the emulated transport from a host's endpoint (the SA on the SM's port, as
  tests/sa_rig.py wires it) with 1, 4 and 16 outstanding.

Not here (no time yet): OpenSM vs ibfm over ibsim with a libumad client.
Bounded in time; prints figures, asserts nothing. ``--levels 2 --radix 36`` for a quick run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.mad.sa import SaAttr, SaMethod, component_mask, sa_mad
from sm.sa.client import sa_query
from sm.sa.families import all_families
from sm.sa.server import SaServer
from sm.sa.store import SaStore
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.base import MadAddress
from sm.transport.emulated import EmulatedTransport

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
    args = ap.parse_args()
    asyncio.run(run(args))


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
    sa = SaServer(sm, all_families(), lambda: mgr.snapshot, store=SaStore(), sm=mgr.elector)

    def dispatch(mad: bytes, a: MadAddress) -> bool:
        if mad[1] == 0x03:
            return sa.take(mad, a)
        return mgr.elector.take(mad, a)

    sm.serve(dispatch)
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
    for a, b, c in rows:
        print(f"{a:<{w}}  {b:>14}  {c}")


if __name__ == "__main__":
    main()
