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

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fabric.mad import LFT_BLOCK_SIZE, PORT_INFO, SWITCH_INFO, Method, SmpAttr, lft_block_unpack
from fabric.model import NodeType, PortState
from sm.discover import Discovery, Path
from sm.lidmap import LidMap
from sm.links import LinkPlan
from sm.routing.base import NO_ROUTE, Lft
from sm.smp import SmpRequest, smp_batch
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
    rep = ProgramReport()
    held = held if held is not None else {}
    await _set_port_infos(transport, d, lids, links, sm_lid, subnet_prefix, rep)
    await _set_fdb_tops(transport, d, lids.max_lid, rep)
    await _set_blocks(transport, d, lft, held, rep)
    if activate:
        await _activate(transport, d, rep)
    return rep


async def _port_info_sets(
    transport: WindowedTransport,
    d: Discovery,
    targets: list[tuple[int, int, dict[str, int]]],
    what: str,
) -> list[tuple[int, int, dict[str, int], str | None]]:
    """PortInfo Set ``want`` over what was read, on every (node, port); (node, port, want, failure)."""
    reqs: list[SmpRequest] = []
    for node, port, want in targets:
        path, mod = _port_route(d, node, port)
        values = dict(d.port_info.get((node, port), {}))
        values.update(PortState=0, PortPhysicalState=0)
        values.update(want)
        reqs.append((path, Method.SET, SmpAttr.PORT_INFO, mod, PORT_INFO.pack(values)))
    out: list[tuple[int, int, dict[str, int], str | None]] = []
    name = d.fabric.port_name
    for (node, port, want), ans in zip(targets, await smp_batch(transport, reqs), strict=True):
        if isinstance(ans, Exception):
            out.append((node, port, want, f"{name(node, port)}: PortInfo Set {what} failed: {ans}"))
            continue
        got = PORT_INFO.unpack(ans)
        d.port_info[(node, port)] = got  # later Sets build on what the port now holds
        bad = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
        out.append((node, port, want, f"{name(node, port)}: PortInfo Set {what} not taken: {bad}" if bad else None))
    return out


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
    endport = np.zeros_like(up)
    ep = f.endports()
    endport[ep[:, 0], ep[:, 1]] = True
    # Candidates by array compare; the PortInfo as read decides exactly what to send.
    cand = endport & ((f.lid != lids.base) | (f.lmc != lids.lmc))
    cand |= up & ((f.mtu_active != links.mtu) | (f.op_vls != links.op_vls))
    cand[:, 1:] |= up[:, 1:] & (f.state[:, 1:] == PortState.INIT)
    for n, p in ep.tolist():
        r = d.port_info.get((n, p))
        if r is not None and (r.get("MasterSMLID") != sm_lid or r.get("GIDPrefix") != prefix):
            cand[n, p] = True
    targets: list[tuple[int, int, dict[str, int]]] = []
    for node, port in np.argwhere(cand).tolist():
        read = d.port_info.get((node, port))
        if read is None:
            continue
        want: dict[str, int] = {}
        if endport[node, port]:
            want.update(LID=int(lids.base[node, port]), LMC=lids.lmc, MasterSMLID=sm_lid, GIDPrefix=prefix)
        if links.mtu[node, port]:
            want.update(NeighborMTU=int(links.mtu[node, port]), OperationalVLs=int(links.op_vls[node, port]))
        # A trained link in INIT is armed by the same Set; ACTIVE follows once the LFTs are in.
        if up[node, port] and port != 0 and f.state[node, port] == PortState.INIT:
            want["PortState"] = int(PortState.ARMED)
        # Only what differs from what the port holds is sent.
        if want and any(read.get(k) != v for k, v in want.items()):
            targets.append((node, port, want))
    for node, port, want, failure in await _port_info_sets(transport, d, targets, "config"):
        if failure:
            rep.failures.append(failure)
            continue
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


async def _set_fdb_tops(transport: WindowedTransport, d: Discovery, top: int, rep: ProgramReport) -> None:
    f = d.fabric
    nodes: list[int] = []
    reqs: list[SmpRequest] = []
    for node in f.switches.tolist():
        read = d.switch_info.get(node)
        if read is None:
            rep.failures.append(f"{f.names[node]}: no SwitchInfo read; LinearFDBTop not set")
            continue
        cap = int(read.get("LinearFDBCap", 0))
        if cap and top >= cap:
            rep.failures.append(f"{f.names[node]}: LinearFDBTop {top} beyond LinearFDBCap {cap}")
            continue
        if read.get("LinearFDBTop") == top:
            continue
        values = dict(read)
        values.update(LinearFDBTop=top, PortStateChange=0)
        nodes.append(node)
        reqs.append((d.paths[node], Method.SET, SmpAttr.SWITCH_INFO, 0, SWITCH_INFO.pack(values)))
    for node, ans in zip(nodes, await smp_batch(transport, reqs), strict=True):
        if isinstance(ans, Exception):
            rep.failures.append(f"{f.names[node]}: SwitchInfo Set failed: {ans}")
        elif (got := SWITCH_INFO.unpack(ans)).get("LinearFDBTop") != top:
            rep.failures.append(f"{f.names[node]}: LinearFDBTop reads {got.get('LinearFDBTop')} after Set {top}")
        else:
            d.switch_info[node] = got
            rep.switchinfo_sets += 1


async def _set_blocks(
    transport: WindowedTransport, d: Discovery, lft: Lft, held: HeldLfts, rep: ProgramReport
) -> None:
    f = d.fabric
    nblocks = -(-lft.shape[1] // LFT_BLOCK_SIZE)
    padded = np.full((lft.shape[0], nblocks * LFT_BLOCK_SIZE), NO_ROUTE, np.uint8)
    padded[:, : lft.shape[1]] = lft
    jobs: list[tuple[int, int, npt.NDArray[np.uint8]]] = []
    reqs: list[SmpRequest] = []
    for row, node in enumerate(f.switches.tolist()):
        guid = int(f.node_guid[node])
        cur = held.get(guid)
        blocks = lft_block_diff(lft[row], cur)
        rep.blocks_skipped += nblocks - blocks.size
        if cur is None or cur.shape[0] < padded.shape[1]:
            grown = np.full(padded.shape[1], NO_ROUTE, np.uint8)
            if cur is not None:
                grown[: cur.shape[0]] = cur[: grown.shape[0]]
            cur = held[guid] = grown
        chunks = padded[row].reshape(-1, LFT_BLOCK_SIZE)
        for b in blocks.tolist():
            jobs.append((node, b, cur))
            reqs.append((d.paths[node], Method.SET, SmpAttr.LFT, b, chunks[b].tobytes()))
    for (node, b, cur), (*_, data), ans in zip(jobs, reqs, await smp_batch(transport, reqs), strict=True):
        lo = b * LFT_BLOCK_SIZE
        where = f"{f.names[node]}: LFT block {b} (LIDs {lo}..{lo + LFT_BLOCK_SIZE - 1})"
        if isinstance(ans, Exception):
            rep.failures.append(f"{where} Set failed: {ans}")
            cur[lo : lo + LFT_BLOCK_SIZE] = NO_ROUTE ^ 1  # unknown: differs from anything we'd send
        elif lft_block_unpack(ans) != data:
            rep.failures.append(f"{where} reads back different")
            cur[lo : lo + LFT_BLOCK_SIZE] = np.frombuffer(lft_block_unpack(ans), np.uint8)
        else:
            cur[lo : lo + LFT_BLOCK_SIZE] = np.frombuffer(data, np.uint8)
            rep.blocks_sent += 1


async def _activate(transport: WindowedTransport, d: Discovery, rep: ProgramReport) -> None:
    """ARMED -> ACTIVE on every up port, now that the LFTs are in."""
    f = d.fabric
    targets = [
        (
            n,
            p,
            {"PortState": int(PortState.ACTIVE)},
        )
        for n, p in np.argwhere(f.up_mask() & (f.state == PortState.ARMED)).tolist()
    ]
    for node, port, _, failure in await _port_info_sets(transport, d, targets, "ACTIVE"):
        if failure:
            rep.failures.append(failure)
        else:
            f.state[node, port] = PortState.ACTIVE
            rep.activated += 1
