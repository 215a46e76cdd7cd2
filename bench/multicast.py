#!/usr/bin/env python3
"""Multicast bench: spanning trees and MFTs on the 3-level fat-tree of 36-port switches.

On ``fattree(3, 36)`` (11,664 hosts, 1,620 switches; sequential LIDs, routed with ftree as
bench/routing.py does), prints the wall time (plain run) and tracemalloc peak (a second run) of:

- ``hop_table``: least hops between every pair of switches, once per topology;
- the IPoIB broadcast group after a join storm: every host a member (``build_tree``, both
  branch rules: along the LFT, and OpenSM 3.3's least-hop rule);
- 100 groups of 64 random hosts (seed 1), each its own tree;
- ``mft_table`` over those 101 groups (MLIDs 0xC000..0xC064), then the (block, position) SMPs a
  fresh fabric needs (``held=None``) and those after one group's membership changed;
- ``verify_tree`` of the broadcast group from 3 senders (the checker is not built for speed).

Aim: the all-hosts group under 2 s. Asserts nothing. ``--levels 3 --radix 12`` runs in seconds.

    .venv/bin/python bench/multicast.py [--levels 3] [--radix 36] [--groups 100] [--size 64]
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from _common import measure

from fabric.generate import fattree
from sm.lidmap import sequential_lids
from sm.multicast.mft import MCAST_LID_FIRST, block_payload, mft_blocks_changed, mft_positions, mft_table
from sm.multicast.tree import Branches, McastTree, build_tree, hop_table, verify_tree
from sm.routing.base import route

GOAL_ALL_HOSTS_S = 2.0
BRANCHES: tuple[Branches, ...] = ("lft", "hops")


def line(what: str, dt: float, peak: int | None, note: str = "") -> None:
    mb = f"{(peak or 0) / 2**20:8.1f}" if peak is not None else f"{'':>8}"
    print(f"{what:<44} {dt:8.3f} {mb}  {note}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", type=int, default=3)
    ap.add_argument("--radix", type=int, default=36)
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--size", type=int, default=64, help="members of each random group")
    args = ap.parse_args()

    f = fattree(args.levels, args.radix)
    lids = sequential_lids(f)
    res, dt_route, _ = measure(lambda: route(f, lids, ["ftree", "updn", "minhop"]), memory=False)
    lft = res.lft
    hosts = [(int(c), 1) for c in f.cas.tolist()]
    print(
        f"{args.levels}-level k={args.radix} fat-tree: {len(hosts)} hosts, {f.switches.size} switches; "
        f"routed by {res.engine} in {dt_route:.2f} s"
    )
    print(f"{'step':<44} {'s':>8} {'peak MB':>8}")

    hops, dt, peak = measure(lambda: hop_table(f))
    line("hop_table", dt, peak)

    trees: dict[int, McastTree] = {}
    for branches in BRANCHES:
        tree, dt, peak = measure(functools.partial(build_tree, f, lids, lft, hosts, hops=hops, branches=branches))
        verdict = "ok" if dt < GOAL_ALL_HOSTS_S else f"over the {GOAL_ALL_HOSTS_S:.0f} s aim"
        note = f"root {f.names[tree.root]}, {len(tree.masks)} switches, {verdict}"
        line(f"all-hosts group, branches={branches}", dt, peak, note)
        if branches == "lft":
            trees[MCAST_LID_FIRST] = tree

    rng = np.random.default_rng(1)
    groups = [[hosts[i] for i in rng.choice(len(hosts), args.size, replace=False).tolist()] for _ in range(args.groups)]

    def many() -> list[McastTree]:
        return [build_tree(f, lids, lft, g, hops=hops) for g in groups]

    built, dt, peak = measure(many)
    sizes = [len(t.masks) for t in built]
    line(
        f"{args.groups} groups of {args.size} hosts",
        dt,
        peak,
        f"{dt / args.groups * 1e3:.1f} ms a group, {min(sizes)}..{max(sizes)} switches a tree",
    )
    for i, t in enumerate(built):
        trees[MCAST_LID_FIRST + 1 + i] = t

    table, dt, peak = measure(lambda: mft_table(f, trees))
    line(f"mft_table, {len(trees)} MLIDs", dt, peak, f"{table.shape} uint16, {table.nbytes / 2**20:.1f} MB")

    pos = mft_positions(f).tolist()

    def fresh() -> int:
        return sum(len(mft_blocks_changed(table[r, :, : pos[r]], None)) for r in range(len(pos)))

    n_fresh, dt, peak = measure(fresh)
    line("blocks for a fresh fabric (held=None)", dt, peak, f"{n_fresh} SMPs")

    changed = dict(trees)
    g0 = [*groups[0][1:], hosts[0] if hosts[0] not in groups[0] else hosts[1]]
    changed[MCAST_LID_FIRST + 1] = build_tree(f, lids, lft, g0, hops=hops)
    table2 = mft_table(f, changed)

    def diff() -> int:
        return sum(len(mft_blocks_changed(table2[r, :, : pos[r]], table[r, :, : pos[r]])) for r in range(len(pos)))

    n_diff, dt, peak = measure(diff)
    line("blocks after one member left, one joined", dt, peak, f"{n_diff} SMPs")

    def payloads() -> Any:
        return [block_payload(table[r, :, : pos[r]], 0, p) for r in range(len(pos)) for p in range(pos[r])]

    out, dt, peak = measure(payloads)
    line("block 0 payloads, every switch", dt, peak, f"{len(out)} x 64 bytes")

    senders = [hosts[0], hosts[len(hosts) // 2], hosts[-1]]
    _, dt, _ = measure(lambda: verify_tree(f, trees[MCAST_LID_FIRST], senders=senders), memory=False)
    line("verify_tree all-hosts group, 3 senders", dt, None, "passed")


if __name__ == "__main__":
    main()
