"""Programming the fabric: PortInfo, SwitchInfo, LFT blocks, then port states.

Stages run in order with a barrier after each, every SMP of a stage in
flight at once under the transport's window:

1. PortInfo Set on every end port (LID, LMC, MasterSMLID, GID prefix) and on
   every linked port (NeighborMTU, OperationalVLs, INIT -> ARMED), only where
   the port does not already hold those values;
2. SwitchInfo Set LinearFDBTop;
3. LFT blocks of 64 LIDs, only those that differ from what the switch holds
   (``held``: what earlier Sets put there; unknown -> send);
4. ports ARMED -> ACTIVE (the Set of stage 1 armed them).

Every Set is checked against its GetResp. A failure names the switch (or
port) and block; the block is left out of ``held`` so the next sweep sends
it again, and the rest goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fabric.mad import LFT_BLOCK_SIZE, PORT_INFO, SWITCH_INFO, SmpAttr, lft_block_pack, lft_block_unpack
from fabric.model import NodeType, PortState
from sm.discover import Discovery, Path
from sm.lidmap import LidMap
from sm.links import LinkPlan
from sm.routing.base import NO_ROUTE, Lft
from sm.smp import smp_set, smp_set_raw
from sm.transport.base import WindowedTransport

HeldLfts = dict[int, npt.NDArray[np.uint8]]
"""Switch node GUID -> the LFT it holds as far as we know (NO_ROUTE where unknown/empty)."""


@dataclass
class ProgramReport:
    port_sets: int = 0
    switchinfo_sets: int = 0
    blocks_sent: int = 0
    blocks_skipped: int = 0
    armed: int = 0
    activated: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def lft_block_diff(new: npt.NDArray[np.uint8], held: npt.NDArray[np.uint8] | None) -> npt.NDArray[np.intp]:
    """Indices of the 64-LID blocks of ``new`` that differ from ``held`` (all when unknown)."""
    nblocks = -(-new.shape[0] // LFT_BLOCK_SIZE)
    padded = np.full(nblocks * LFT_BLOCK_SIZE, NO_ROUTE, np.uint8)
    padded[: new.shape[0]] = new
    if held is None:
        return np.arange(nblocks)
    other = np.full(nblocks * LFT_BLOCK_SIZE, NO_ROUTE, np.uint8)
    k = min(held.shape[0], other.shape[0])
    other[:k] = held[:k]
    diff = (padded.reshape(-1, LFT_BLOCK_SIZE) != other.reshape(-1, LFT_BLOCK_SIZE)).any(axis=1)
    return np.flatnonzero(diff)


def _port_route(d: Discovery, node: int, port: int) -> tuple[Path, int]:
    """(DR path, attribute modifier) that reaches PortInfo of (node, port)."""
    f = d.fabric
    if f.node_type[node] == NodeType.SWITCH:
        return d.paths[node], port
    return d.port_paths.get((node, port), d.paths[node]), 0


async def _gather(jobs: Iterable[Awaitable[None]]) -> None:
    await asyncio.gather(*jobs)


async def program_fabric(
    transport: WindowedTransport,
    d: Discovery,
    lids: LidMap,
    links: LinkPlan,
    lft: Lft,
    *,
    sm_lid: int,
    subnet_prefix: int = 0xFE80000000000000,
    held: HeldLfts | None = None,
    activate: bool = True,
) -> ProgramReport:
    """Push the plan into the fabric; updates ``held`` with what the switches now hold."""
    f = d.fabric
    rep = ProgramReport()
    held = held if held is not None else {}
    await _set_port_infos(transport, d, lids, links, sm_lid, subnet_prefix, rep)
    switches = f.switches
    top = lids.max_lid
    await _gather(_set_fdb_top(transport, d, int(n), top, rep) for n in switches.tolist())
    jobs = []
    for row, n in enumerate(switches.tolist()):
        guid = int(f.node_guid[n])
        cur = held.get(guid)
        new = lft[row]
        blocks = lft_block_diff(new, cur)
        nblocks = -(-new.shape[0] // LFT_BLOCK_SIZE)
        rep.blocks_skipped += nblocks - blocks.size
        if cur is None or cur.shape[0] < nblocks * LFT_BLOCK_SIZE:
            grown = np.full(nblocks * LFT_BLOCK_SIZE, NO_ROUTE, np.uint8)
            if cur is not None:
                grown[: cur.shape[0]] = cur[: grown.shape[0]]
            cur = held[guid] = grown
        jobs.extend(_set_block(transport, d, n, int(b), new, cur, rep) for b in blocks.tolist())
    await _gather(jobs)
    if activate:
        await _activate(transport, d, rep)
    return rep


async def _set_port_infos(
    transport: WindowedTransport,
    d: Discovery,
    lids: LidMap,
    links: LinkPlan,
    sm_lid: int,
    prefix: int,
    rep: ProgramReport,
) -> None:
    f = d.fabric

    up = f.up_mask()

    def wanted(node: int, port: int) -> dict[str, int]:
        want: dict[str, int] = {}
        if f.node_type[node] != NodeType.SWITCH or port == 0:
            want.update(LID=int(lids.base[node, port]), LMC=lids.lmc, MasterSMLID=sm_lid, GIDPrefix=prefix)
        if links.mtu[node, port]:
            want.update(NeighborMTU=int(links.mtu[node, port]), OperationalVLs=int(links.op_vls[node, port]))
        # A trained link in INIT is armed by the same Set; ACTIVE follows once the LFTs are in.
        if up[node, port] and port != 0 and f.state[node, port] == PortState.INIT:
            want["PortState"] = int(PortState.ARMED)
        return want

    async def one(node: int, port: int, read: dict[str, Any], want: dict[str, int]) -> None:
        path, mod = _port_route(d, node, port)
        values = dict(read)
        values.update(PortState=0, PortPhysicalState=0)
        values.update(want)
        try:
            got = await smp_set(transport, path, PORT_INFO, SmpAttr.PORT_INFO, mod, values)
        except Exception as e:
            rep.failures.append(f"{f.port_name(node, port)}: PortInfo Set failed: {e}")
            return
        bad = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
        if bad:
            rep.failures.append(f"{f.port_name(node, port)}: PortInfo Set not taken: {bad}")
            return
        rep.port_sets += 1
        if "LID" in want:
            f.lid[node, port] = want["LID"]
            f.lmc[node, port] = lids.lmc
        if "NeighborMTU" in want:
            f.mtu_active[node, port] = want["NeighborMTU"]
            f.op_vls[node, port] = want["OperationalVLs"]
        if "PortState" in want:
            f.state[node, port] = want["PortState"]
            rep.armed += 1

    jobs = []
    for (node, port), read in d.port_info.items():
        want = wanted(node, port)
        # Only what differs from what the port holds is sent.
        if want and any(read.get(k) != v for k, v in want.items()):
            jobs.append(one(node, port, read, want))
    await _gather(jobs)


async def _set_fdb_top(
    transport: WindowedTransport, d: Discovery, node: int, top: int, rep: ProgramReport
) -> None:
    f = d.fabric
    read = d.switch_info.get(node)
    if read is None:
        rep.failures.append(f"{f.names[node]}: no SwitchInfo read; LinearFDBTop not set")
        return
    cap = int(read.get("LinearFDBCap", 0))
    if cap and top >= cap:
        rep.failures.append(f"{f.names[node]}: LinearFDBTop {top} beyond LinearFDBCap {cap}")
        return
    values = dict(read)
    values.update(LinearFDBTop=top, PortStateChange=0)
    try:
        got = await smp_set(transport, d.paths[node], SWITCH_INFO, SmpAttr.SWITCH_INFO, 0, values)
    except Exception as e:
        rep.failures.append(f"{f.names[node]}: SwitchInfo Set failed: {e}")
        return
    if got.get("LinearFDBTop") != top:
        rep.failures.append(f"{f.names[node]}: LinearFDBTop reads {got.get('LinearFDBTop')} after Set {top}")
        return
    rep.switchinfo_sets += 1


async def _set_block(
    transport: WindowedTransport,
    d: Discovery,
    node: int,
    block: int,
    new: npt.NDArray[np.uint8],
    cur: npt.NDArray[np.uint8],
    rep: ProgramReport,
) -> None:
    lo = block * LFT_BLOCK_SIZE
    chunk = np.full(LFT_BLOCK_SIZE, NO_ROUTE, np.uint8)
    part = new[lo : lo + LFT_BLOCK_SIZE]
    chunk[: part.shape[0]] = part
    data = lft_block_pack(chunk)
    name = d.fabric.names[node]
    try:
        got = await smp_set_raw(transport, d.paths[node], SmpAttr.LFT, block, data)
    except Exception as e:
        rep.failures.append(f"{name}: LFT block {block} (LIDs {lo}..{lo + 63}) Set failed: {e}")
        cur[lo : lo + LFT_BLOCK_SIZE] = NO_ROUTE ^ 1  # unknown: differs from anything we'd send
        return
    if lft_block_unpack(got) != bytes(chunk):
        rep.failures.append(f"{name}: LFT block {block} (LIDs {lo}..{lo + 63}) reads back different")
        cur[lo : lo + LFT_BLOCK_SIZE] = np.frombuffer(lft_block_unpack(got), np.uint8)
        return
    cur[lo : lo + LFT_BLOCK_SIZE] = chunk
    rep.blocks_sent += 1


async def _activate(transport: WindowedTransport, d: Discovery, rep: ProgramReport) -> None:
    """ARMED -> ACTIVE on every up port, now that the LFTs are in."""
    f = d.fabric

    async def one(node: int, port: int) -> None:
        path, mod = _port_route(d, node, port)
        values = dict(d.port_info.get((node, port), {}))
        values.update(
            PortState=int(PortState.ACTIVE),
            PortPhysicalState=0,
            LID=int(f.lid[node, port]),
            LMC=int(f.lmc[node, port]),
            NeighborMTU=int(f.mtu_active[node, port]),
            OperationalVLs=int(f.op_vls[node, port]),
        )
        try:
            got = await smp_set(transport, path, PORT_INFO, SmpAttr.PORT_INFO, mod, values)
        except Exception as e:
            rep.failures.append(f"{f.port_name(node, port)}: PortInfo Set ACTIVE failed: {e}")
            return
        if got.get("PortState") != PortState.ACTIVE:
            rep.failures.append(f"{f.port_name(node, port)}: PortState reads {got.get('PortState')} after Set ACTIVE")
            return
        f.state[node, port] = PortState.ACTIVE
        rep.activated += 1

    targets = np.argwhere(f.up_mask() & (f.state == PortState.ARMED))
    await _gather(one(int(n), int(p)) for n, p in targets.tolist())
