"""Programming the fabric: PortInfo, SwitchInfo, LFT blocks, then port states.

Every SMP of a stage is in flight at once under the transport's window;
stages 1 to 3 run side by side, stage 4 after them:

1. PortInfo Set on every end port (LID, LMC, MasterSMLID, GID prefix) and on
   every linked port (NeighborMTU, OperationalVLs, INIT -> ARMED), only where
   the port does not already hold those values;
2. SwitchInfo Set LinearFDBTop;
3. LFT blocks of 64 LIDs, only those that differ from what the switch holds
   (``held``: what earlier Sets put there; unknown -> send). The LFT may be
   handed in as an awaitable (routing still running elsewhere): stages 1
   and 2 go out meanwhile, as neither needs the routes;
4. ports ARMED -> ACTIVE (the Set of stage 1 armed them), once the LFTs are in.

Every Set is checked against its GetResp. A failure names the switch (or
port) and block; the block is left out of ``held`` so the next sweep sends
it again, and the rest goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fabric.mad import LFT_BLOCK_SIZE, PORT_INFO, SWITCH_INFO, Method, SmpAttr
from fabric.model import NodeType, PortState
from sm.discover import Discovery, Path
from sm.lidmap import LidMap
from sm.links import LinkPlan
from sm.routing.base import NO_ROUTE, Lft
from sm.smp import RowCodec, SmpRequest, smp_batch, smp_batch_dr
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


_PORT_INFO = RowCodec(PORT_INFO)
_NO_CHANGE = {"PortState": 0, "PortPhysicalState": 0}
"""PortInfo Set values that ask for no state change (IBA 14.2.5.6)."""


_STATE_MASK = np.full(PORT_INFO.size, 0xFF, np.uint8)
_STATE_MASK[32], _STATE_MASK[33] = 0xF0, 0x0F
"""PortInfo bits a Set is not echoed in: PortState (byte 32 low nibble) and PortPhysicalState
(byte 33 high nibble), which the Set left alone (0) or asked to change."""


async def program_fabric(
    transport: WindowedTransport,
    d: Discovery,
    lids: LidMap,
    links: LinkPlan,
    lft: Lft | Awaitable[Lft],
    *,
    sm_lid: int,
    subnet_prefix: int = 0xFE80000000000000,
    held: HeldLfts | None = None,
    activate: bool = True,
) -> ProgramReport:
    """Push the plan into the fabric; updates ``held`` with what the switches now hold.

    An exception of ``lft`` (routing failed) is raised here once the Sets in
    flight are cancelled; no port is activated then.
    """
    rep = ProgramReport()
    known = held if held is not None else {}

    async def routes() -> None:
        table = lft if isinstance(lft, np.ndarray) else await lft
        await _set_blocks(transport, d, table, known, rep)

    await _all(
        _set_port_infos(transport, d, lids, links, sm_lid, subnet_prefix, rep),
        _set_fdb_tops(transport, d, lids.max_lid, rep),
        routes(),
    )
    if activate:
        await _activate(transport, d, rep)
    return rep


async def _all(*steps: Coroutine[Any, Any, None]) -> None:
    """Run ``steps`` side by side; the first exception cancels the others and is raised as is."""
    tasks = [asyncio.ensure_future(s) for s in steps]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _port_info_sets(
    transport: WindowedTransport,
    d: Discovery,
    targets: list[tuple[int, int, dict[str, int]]],
    what: str,
) -> list[tuple[int, int, dict[str, int], str | None]]:
    """PortInfo Set ``want`` over what the port holds, on every (node, port); (node, port, want, failure).

    The Sets are built as one array (the bytes each port holds, then each
    field written for the rows that set it) and the GetResps checked as one:
    a Set is taken when the answer's PortState is the one asked for and no
    byte of a field it set differs from what was sent. Each answer becomes
    what the port holds, as bytes (``d.port_info`` decodes on demand).
    """
    n = len(targets)
    if not n:
        return []
    f = d.fabric
    is_switch = (f.node_type == NodeType.SWITCH).tolist()
    paths, port_paths = d.paths, d.port_paths
    table = d.port_info
    routes: list[Path] = list(paths)
    extra: dict[Path, int] = {}
    which: list[int] = []
    mods: list[int] = []
    raws: list[bytes] = []
    groups: dict[tuple[str, ...], list[int]] = {}
    blank = bytes(PORT_INFO.size)
    for r, (node, port, want) in enumerate(targets):
        key = (node, port)
        if is_switch[node]:
            which.append(node)
            mods.append(port)
        else:
            path = port_paths.get(key)
            if path is None or path == paths[node]:
                which.append(node)
            else:
                k = extra.get(path)
                if k is None:
                    k = extra[path] = len(routes)
                    routes.append(path)
                which.append(k)
            mods.append(0)
        raws.append(table.raw(key) or blank)
        sig = tuple(want)
        rows = groups.get(sig)
        if rows is None:
            groups[sig] = [r]
        else:
            rows.append(r)
    data = np.frombuffer(b"".join(raws), np.uint8).reshape(n, PORT_INFO.size).copy()
    _PORT_INFO.clear_reserved(data)
    everyone = range(n)
    _PORT_INFO.patch_rows(data, "PortPhysicalState", everyone, [0] * n)
    _PORT_INFO.patch_rows(data, "PortState", everyone, [w.get("PortState", 0) for _, _, w in targets])
    for sig, rows in groups.items():
        for name in sig:
            if name not in _NO_CHANGE:
                _PORT_INFO.patch_rows(data, name, rows, [targets[r][2][name] for r in rows])
    res = await smp_batch_dr(transport, Method.SET, SmpAttr.PORT_INFO, routes, np.array(which), np.array(mods), data)
    # Where an answer differs from what was sent, PortState and PortPhysicalState aside (switch
    # ports 1..N, e.g., show port 0's LID): the fields in those bytes, per pattern of bytes.
    differs = ((res.data ^ data) & _STATE_MASK) != 0
    odd: dict[int, frozenset[str]] = {}
    rows_odd = np.flatnonzero(differs.any(axis=1) & res.ok)
    if rows_odd.size:
        patterns: dict[bytes, frozenset[str]] = {}
        for r, key in zip(rows_odd.tolist(), np.packbits(differs[rows_odd], axis=1), strict=True):
            k = key.tobytes()
            fields = patterns.get(k)
            if fields is None:
                fields = patterns[k] = frozenset(
                    name for j in np.flatnonzero(differs[r]).tolist() for name in _PORT_INFO.fields_at(j)
                )
            odd[r] = fields
    blob = res.data.tobytes()
    states = (res.data[:, 32] & 0x0F).tolist()
    size = PORT_INFO.size
    out: list[tuple[int, int, dict[str, int], str | None]] = []
    name_of = f.port_name
    errors = res.errors
    held: list[tuple[tuple[int, int], bytes]] = []
    for r, (node, port, want) in enumerate(targets):
        err = errors.get(r)
        if err is not None:
            out.append((node, port, want, f"{name_of(node, port)}: PortInfo Set {what} failed: {err}"))
            continue
        ans = blob[r * size : (r + 1) * size]
        held.append(((node, port), ans))
        state = want.get("PortState", 0)
        fields = odd.get(r)
        if (
            (not state or states[r] == state)
            and (fields is None or fields.isdisjoint(want))
            and "PortPhysicalState" not in want  # (its bits are not compared above)
        ):
            out.append((node, port, want, None))
            continue
        got = _PORT_INFO.get_fields(ans, list(want))
        bad = {k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v}
        out.append((node, port, want, f"{name_of(node, port)}: PortInfo Set {what} not taken: {bad}" if bad else None))
    table.update_raw(held)  # later Sets build on what the ports now hold
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
    chosen: list[int] = []
    cn, cp = np.nonzero(cand)
    armable = up[cn, cp] & (cp != 0) & (f.state[cn, cp] == PortState.INIT)
    is_end, lid, mtu, vls = endport[cn, cp], lids.base[cn, cp], links.mtu[cn, cp], links.op_vls[cn, cp]
    lmc, armed = lids.lmc, int(PortState.ARMED)
    port_info = d.port_info
    columns = (cn, cp, is_end, lid, mtu, vls, armable)
    for k, (node, port, e, lid_k, mtu_k, vls_k, arm) in enumerate(zip(*(c.tolist() for c in columns), strict=True)):
        read = port_info.get((node, port))
        if read is None:
            continue
        # Only what differs from what the port holds is sent.
        g = read.get
        if e:
            want = {"LID": lid_k, "LMC": lmc, "MasterSMLID": sm_lid, "GIDPrefix": prefix}
            differs = g("LID") != lid_k or g("LMC") != lmc or g("MasterSMLID") != sm_lid or g("GIDPrefix") != prefix
        else:
            want, differs = {}, False
        if mtu_k:
            want["NeighborMTU"], want["OperationalVLs"] = mtu_k, vls_k
            differs = differs or g("NeighborMTU") != mtu_k or g("OperationalVLs") != vls_k
        # A trained link in INIT is armed by the same Set; ACTIVE follows once the LFTs are in.
        if arm:
            want["PortState"] = armed
            differs = differs or g("PortState") != armed
        if differs:
            targets.append((node, port, want))
            chosen.append(k)
    results = await _port_info_sets(transport, d, targets, "config")
    ok = np.array([failure is None for *_, failure in results], bool)
    rep.failures += [failure for *_, failure in results if failure is not None]
    rep.port_sets += int(ok.sum())
    # What the ports now hold, into the model in one go per field.
    sel = np.array(chosen, np.intp)[ok]
    n, p = cn[sel], cp[sel]
    m = is_end[sel]
    f.lid[n[m], p[m]] = lid[sel][m]
    f.lmc[n[m], p[m]] = lmc
    m = mtu[sel] != 0
    f.mtu_active[n[m], p[m]] = mtu[sel][m]
    f.op_vls[n[m], p[m]] = vls[sel][m]
    m = armable[sel]
    f.state[n[m], p[m]] = armed
    rep.armed += int(m.sum())


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
    per_switch: list[npt.NDArray[np.intp]] = []
    curs: list[npt.NDArray[np.uint8]] = []
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
        per_switch.append(blocks)
        curs.append(cur)
    counts = np.array([b.size for b in per_switch], np.intp)
    rows = np.repeat(np.arange(len(per_switch)), counts)
    blocks = np.concatenate(per_switch) if per_switch else np.zeros(0, np.intp)
    data = padded.reshape(padded.shape[0], nblocks, LFT_BLOCK_SIZE)[rows, blocks]
    nodes = f.switches[rows]
    res = await smp_batch_dr(transport, Method.SET, SmpAttr.LFT, d.paths, nodes, blocks, data)
    # The GetResp holds what was set: the common case, checked for all blocks at once.
    good = res.ok & (res.data == data).all(axis=1)
    rep.blocks_sent += int(good.sum())
    ends = np.cumsum(counts)
    for row, (cur, start, end) in enumerate(zip(curs, ends - counts, ends, strict=True)):
        if start == end:
            continue
        g = good[start:end]
        cur[: padded.shape[1]].reshape(-1, LFT_BLOCK_SIZE)[per_switch[row][g]] = data[start:end][g]
    for j in np.flatnonzero(~good).tolist():
        node, b, cur = int(nodes[j]), int(blocks[j]), curs[rows[j]]
        lo = b * LFT_BLOCK_SIZE
        where = f"{f.names[node]}: LFT block {b} (LIDs {lo}..{lo + LFT_BLOCK_SIZE - 1})"
        err = res.errors.get(j)
        if err is not None:
            rep.failures.append(f"{where} Set failed: {err}")
            cur[lo : lo + LFT_BLOCK_SIZE] = NO_ROUTE ^ 1  # unknown: differs from anything we'd send
        else:
            rep.failures.append(f"{where} reads back different")
            cur[lo : lo + LFT_BLOCK_SIZE] = res.data[j]


async def _activate(transport: WindowedTransport, d: Discovery, rep: ProgramReport) -> None:
    """ARMED -> ACTIVE on every up port, now that the LFTs are in."""
    f = d.fabric
    active = int(PortState.ACTIVE)
    cn, cp = np.nonzero(f.up_mask() & (f.state == PortState.ARMED))
    targets = [(n, p, {"PortState": active}) for n, p in zip(cn.tolist(), cp.tolist(), strict=True)]
    results = await _port_info_sets(transport, d, targets, "ACTIVE")
    ok = np.array([failure is None for *_, failure in results], bool)
    rep.failures += [failure for *_, failure in results if failure is not None]
    f.state[cn[ok], cp[ok]] = active
    rep.activated += int(ok.sum())
