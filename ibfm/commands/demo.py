"""``ibfm demo``: bring up a generated fat-tree on the emulated fabric and show what the SM did."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from ibfm.commands.sm import format_summary, summary
from sm.analysis.query import describe_route, format_route
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.emulated import EmulatedTransport


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the SM on a generated, emulated fat-tree and print the result")
    p.add_argument("--levels", type=int, choices=(2, 3), default=2)
    p.add_argument("--radix", type=int, default=8)
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    fabric = fattree(args.levels, args.radix)
    counts = fabric.summary()
    print(
        f"emulated {args.levels}-level fat-tree of {args.radix}-port switches: "
        f"{counts['switches']} switches, {counts['cas']} hosts, {counts['links']} links"
    )

    async def go() -> int:
        transport = EmulatedTransport(EmulatedFabric(fabric))
        try:
            snap = await FabricManager(transport, SmConfig()).heavy_sweep()
        finally:
            await transport.close()
        print(format_summary(summary(snap)))
        cas = snap.fabric.cas
        src, dst = snap.fabric.names[int(cas[0])], snap.fabric.names[int(cas[-1])]
        print()
        print(format_route(describe_route(snap.fabric, snap.lids, snap.lft, src, dst)))
        return 0 if snap.up else 1

    return asyncio.run(go())
