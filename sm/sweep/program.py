"""Programming the fabric: PortInfo, SwitchInfo, LFT blocks, then port states.

Every SMP of a stage is in flight at once under the transport's window;
stages 1 to 3 run side by side, stage 4 after them:

1. PortInfo Set on every end port (LID, LMC, MasterSMLID, GID prefix, and with
   ``keys`` M_Key, M_KeyProtectBits, M_KeyLeasePeriod) and on every linked port
   (NeighborMTU, OperationalVLs, INIT -> ARMED), only where the port does not
   already hold those values;
2. SwitchInfo Set LinearFDBTop;
3. LFT blocks of 64 LIDs, only those that differ from what the switch holds
   (``held``: what earlier Sets put there; unknown -> send). The LFT may be
   handed in as an awaitable (routing still running elsewhere): stages 1
   and 2 go out meanwhile, as neither needs the routes;
4. ports ARMED -> ACTIVE (the Set of stage 1 armed them), once the LFTs are in.

Beside stages 1 to 3, with a partition plan: P_KeyTable blocks of every end port
and of the switch ports facing CAs that enforce partitions (only the blocks that
differ from what the port holds as far as we know: a port seen for the first time
gets every block its table has room for, so nothing stale stays), and stage 1
sets PartitionEnforcementInbound/Outbound where the plan says.

Every Set is checked against its GetResp. A failure names the switch (or
port) and block; the block is left out of ``held`` so the next sweep sends
it again, and the rest goes on.

Every SMP carries the M_Key of the port it addresses (``keys``). When stage 1
changes keys, it runs alone first, so that the other stages' SMPs carry the
new ones; a key-changing Set whose answer was lost is read back with the new
key. SMPs that timed out are listed per port (``ProgramReport.timed_out``):
the manager tells a lost M_Key from a dead port by them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from fabric.mad import (
    LFT_BLOCK_SIZE,
    PKEY_BLOCK_SIZE,
    PORT_INFO,
    SL2VL_SIZE,
    SWITCH_INFO,
    VLARB_TABLE,
    Method,
    SmpAttr,
    pkey_table_mod,
)
from fabric.model import NodeType, PortState
from sm.lidmap import LidMap
from sm.links import LinkPlan
from sm.multicast.mft import MLIDS_PER_BLOCK, MftTable, block_payload, mft_attr_mod, mft_blocks_changed, mft_positions
from sm.qos.plan import QosPlan, pack_sl2vl
from sm.routing.base import NO_ROUTE, Lft
from sm.sweep.discover import Discovery, Path
from sm.sweep.mkeys import MKeys
from sm.transport.base import MadTimeout, WindowedTransport
from sm.transport.smp import RowCodec, SmpAnswers, SmpRequest, smp_batch, smp_batch_dr

if TYPE_CHECKING:
    from sm.sweep.manager import SweepProgress

HeldLfts = dict[int, npt.NDArray[np.uint8]]
"""Switch node GUID -> the LFT it holds as far as we know (NO_ROUTE where unknown/empty)."""
HeldMfts = dict[int, npt.NDArray[np.uint16]]
"""Switch node GUID -> the MFT it holds as far as we know (``[entries, positions]``, whole blocks)."""
HeldPkeys = dict[tuple[int, int], npt.NDArray[np.uint16]]
"""(node GUID, port number) -> the P_Key table the port holds as far as we know (its whole size)."""
Port = tuple[int, int]


@dataclass
class ProgramReport:
    port_sets: int = 0
    switchinfo_sets: int = 0
    blocks_sent: int = 0
    blocks_skipped: int = 0
    armed: int = 0
    activated: int = 0
    reregistered: int = 0
    """End ports told to re-register (PortInfo.ClientReregister)."""
    enforcement_refused: list[tuple[int, int]] = field(default_factory=list)
    """Switch ports (node GUID, port) that read partition enforcement back other than it was set."""
    enforcement_sets: int = 0
    """PortInfo Sets that changed partition enforcement and nothing else."""
    pkey_blocks_sent: int = 0
    pkey_blocks_skipped: int = 0
    m_keys_set: int = 0
    """End ports given a new M_Key, M_KeyProtectBits or M_KeyLeasePeriod."""
    m_key_refused: list[tuple[int, int]] = field(default_factory=list)
    """End ports (node, port) that took a Set but read its M_Key fields back otherwise: no M_Key support."""
    timed_out: list[tuple[int, int]] = field(default_factory=list)
    """End ports (node, port; a switch's port 0) some Set to which timed out after every retry."""
    high_limit_sets: int = 0
    """PortInfo Sets that carried a new VLHighLimit (QoS)."""
    high_limit_refused: list[tuple[int, int]] = field(default_factory=list)
    """Ports (node GUID, port) that read VLHighLimit back other than it was set (ibsim keeps none)."""
    qos: QosReport | None = None
    """SL2VL and VLArb tables sent and skipped; None when QoS planned nothing."""
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
_ONE_SHOT = frozenset({"ClientReregister"})
"""Fields a Set carries once and the port does not hold afterwards (not compared with the answer)."""
_ADVISORY = frozenset({"PartitionEnforcementInbound", "PartitionEnforcementOutbound"})
"""Fields a device may not keep (ibsim's switches read enforcement back as 0): a port that does not
take them is reported in ``ProgramReport.enforcement_refused``, not as a failure."""
_HIGH_LIMIT = frozenset({"VLHighLimit"})
"""A field ibsim does not keep (reads back 0): a port that does not take it is reported in
``ProgramReport.high_limit_refused``, not as a failure."""
_M_KEY_FIELDS = frozenset({"M_Key", "M_KeyProtectBits", "M_KeyLeasePeriod"})
"""Fields a device without M_Key support does not keep (ibsim's read back as before): such a port is
reported in ``ProgramReport.m_key_refused`` (it is not protected), not as a failure."""
_REREG_CAP = 1 << 25
"""PortInfo.CapabilityMask.IsClientReregistrationSupported."""
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
    reregister: bool = False,
    pkeys: Mapping[Port, tuple[int, ...]] | None = None,
    enforce: Mapping[Port, tuple[int, int]] | None = None,
    held_pkeys: HeldPkeys | None = None,
    keys: MKeys | None = None,
    progress: SweepProgress | None = None,
    qos: QosPlan | Awaitable[QosPlan | None] | None = None,
    held_qos: HeldQos | None = None,
    high_limit: Mapping[Port, int] | None = None,
) -> ProgramReport:
    """Push the plan into the fabric; updates ``held`` with what the switches now hold (``progress`` counts
    the LFT blocks to send and those taken).

    With ``lft`` still being computed, stages 1 and 2 go out meanwhile only
    where they change nothing in use (a fresh fabric, ports being armed);
    a LID, LMC or master-SM change, or a lower LinearFDBTop, waits for the
    routes. An exception of ``lft`` (routing failed) is raised here once the
    Sets in flight are cancelled; no port is activated then.

    ``reregister`` (a new master's first sweep) sets PortInfo.ClientReregister
    on every end port that supports it, so hosts join their multicast groups
    and subscribe again; a port that gets a new LID or master gets it anyway.

    ``pkeys``: (node, port) -> the P_Key table that port must hold (end ports, and switch ports
    facing CAs that enforce); ``enforce``: switch port -> (inbound, outbound) enforcement, every
    other switch port enforcing nothing; ``held_pkeys`` is updated as ``held``. None: P_Keys and
    enforcement are left as they are.

    ``keys``: the M_Keys every SMP carries, and what stage 1 gives the end ports (None: their M_Key
    fields are left as they are).

    ``qos``: the SL2VL and VLArb tables to set (:func:`set_qos_tables`; an awaitable when they wait for
    the routing engine's layers), beside stages 1 to 3 and before any port turns ACTIVE; ``held_qos``
    is updated as ``held``; ``high_limit``: (node, port) -> VLHighLimit, set with stage 1's PortInfo.
    """
    rep = ProgramReport()
    known = held if held is not None else {}
    plan = _plan_port_infos(
        d, lids, links, sm_lid, subnet_prefix, reregister=reregister, enforce=enforce, keys=keys,
        high_limit=high_limit,
    )  # fmt: skip
    lowers_top = any(
        int(si.get("LinearFDBTop", 0)) > lids.max_lid for n, si in d.switch_info.items() if d.fabric.is_switch(n)
    )
    if not isinstance(lft, np.ndarray) and (plan.live or lowers_top):
        # These Sets change what traffic uses now: not before the routes are known to exist (a
        # routing failure then leaves the fabric as it was).
        lft = await lft

    async def routes() -> None:
        table = lft if isinstance(lft, np.ndarray) else await lft
        await _set_blocks(transport, d, table, known, rep, keys, progress)

    stage1 = _set_port_infos(transport, d, lids, links, plan, rep, keys)
    steps = [_set_fdb_tops(transport, d, lids.max_lid, rep, keys), routes()]
    if pkeys is not None:
        steps.append(_set_pkey_tables(transport, d, pkeys, held_pkeys if held_pkeys is not None else {}, rep, keys))
    if qos is not None:

        async def qos_tables() -> None:
            qplan = qos if isinstance(qos, QosPlan) else await qos
            if qplan is None:
                return
            rep.qos = await set_qos_tables(transport, d, qplan, held_qos if held_qos is not None else {}, keys)
            rep.failures += rep.qos.failures

        steps.append(qos_tables())
    if plan.rekeys:
        await stage1  # keys change: the other stages' SMPs carry the new ones
        await _all(*steps)
    else:
        await _all(stage1, *steps)
    if activate:
        await _activate(transport, d, rep, keys)
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


Fields = dict[str, tuple[npt.NDArray[np.bool_], npt.NDArray[Any]]]
"""PortInfo field -> (rows that set it, value per row) for a batch of Sets."""


async def _port_info_sets(
    transport: WindowedTransport,
    d: Discovery,
    nodes: npt.NDArray[np.intp],
    ports: npt.NDArray[np.intp],
    fields: Fields,
    what: str,
    refused: list[tuple[int, int]] | None = None,
    keys: MKeys | None = None,
    timed_out: list[tuple[int, int]] | None = None,
    m_key_refused: list[tuple[int, int]] | None = None,
    high_limit_refused: list[tuple[int, int]] | None = None,
) -> tuple[npt.NDArray[np.bool_], list[str]]:
    """PortInfo Set of ``fields`` over what each (node, port) holds; (taken per row, failures).

    The Sets are built as one array (the bytes each port holds, then each
    field written into the rows that set it) and the GetResps checked as one:
    a Set is taken when the answer's PortState is the one asked for and no
    byte of a field it set differs from what was sent (only rows where such a
    byte differs are decoded: a switch port 1..N, e.g., shows port 0's LID).
    Each answer becomes what the port holds, as bytes (``d.port_info``
    decodes on demand), and the M_Keys the answers show are what ``keys``
    holds from then on. A Set that changes the M_Key and timed out is read
    back with the new key: taken when the port holds what was asked.
    ``timed_out`` gets the end ports of the Sets that timed out regardless; ``m_key_refused`` the
    ports that took the Set but not its M_Key fields (no M_Key support: ibsim).
    """
    n = int(nodes.size)
    if not n:
        return np.zeros(0, bool), []
    f = d.fabric
    node_l, port_l = nodes.tolist(), ports.tolist()
    where = list(zip(node_l, port_l, strict=True))
    # Route per row: the switch's path with the port as modifier; a CA by the path that reaches
    # that port, modifier 0 (a CA answers for the port the SMP came in on).
    routes: list[Path] = list(d.paths)
    which = np.array(nodes, np.intp)
    mods = np.array(ports, np.int64)
    ca_rows = np.flatnonzero(f.node_type[nodes] != NodeType.SWITCH)
    if ca_rows.size:
        mods[ca_rows] = 0
        extra: dict[Path, int] = {}
        paths, port_paths = d.paths, d.port_paths
        for r in ca_rows.tolist():
            path = port_paths.get(where[r])
            if path is not None and path != paths[node_l[r]]:
                k = extra.get(path)
                if k is None:
                    k = extra[path] = len(routes)
                    routes.append(path)
                which[r] = k
    raw, blank = d.port_info.raw, bytes(PORT_INFO.size)
    data = np.frombuffer(b"".join([raw(k) or blank for k in where]), np.uint8).reshape(n, PORT_INFO.size).copy()
    _PORT_INFO.clear_reserved(data)
    want_state = np.zeros(n, np.int64)
    if "PortState" in fields:
        rows, values = fields["PortState"]
        want_state[rows] = values[rows]
    _PORT_INFO.patch_rows(data, "PortPhysicalState", range(n), [0] * n)
    _PORT_INFO.patch_rows(data, "PortState", range(n), want_state.tolist())
    for name, (rows, values) in fields.items():
        if name in _NO_CHANGE:
            continue
        at = np.flatnonzero(rows)
        _PORT_INFO.patch_rows(data, name, at.tolist(), values[at].tolist())
    mkeys = keys.rows(f, nodes, ports) if keys is not None else None
    res = await smp_batch_dr(transport, Method.SET, SmpAttr.PORT_INFO, routes, which, mods, data, mkeys=mkeys)
    set_mask = _STATE_MASK & _bits_of(frozenset(fields).difference(_NO_CHANGE, _ONE_SHOT, _ADVISORY, _HIGH_LIMIT))
    if "VLHighLimit" in fields:  # compared apart: a port that does not keep it has still taken the Set
        hl_rows, hl_values = fields["VLHighLimit"]
        hl_got = _PORT_INFO.column(res.data, "VLHighLimit").astype(np.int64)
        for r in np.flatnonzero(res.ok & hl_rows & (hl_got != hl_values)).tolist():
            if high_limit_refused is not None:
                high_limit_refused.append((int(f.node_guid[node_l[r]]), port_l[r]))
    if res.errors:
        await _reread_refused(transport, routes, which, mods, data, want_state, set_mask, res, mkeys)
    if res.errors and mkeys is not None and "M_Key" in fields:
        # A Set that changed the key was taken if the port answers the new key and holds what was asked.
        sets_key, values = fields["M_Key"]
        new = values.astype(np.uint64)
        timeouts = sorted(r for r, e in res.errors.items() if isinstance(e, MadTimeout))
        lost = np.array([r for r in timeouts if sets_key[r] and new[r] != mkeys[r]], np.intp)
        if lost.size:
            await _reread_refused(transport, routes, which, mods, data, want_state, set_mask, res, new, rows=lost)
    if timed_out is not None:
        for r, err in res.errors.items():
            if isinstance(err, MadTimeout):
                timed_out.append((node_l[r], 0 if f.is_switch(node_l[r]) else port_l[r]))
    failures = [
        f"{f.port_name(node_l[r], port_l[r])}: PortInfo Set {what} failed: {err}" for r, err in res.errors.items()
    ]
    got_state = (res.data[:, 32] & 0x0F).astype(np.int64)
    taken = res.ok & ((want_state == 0) | (got_state == want_state))
    differs = ((res.data ^ data) & set_mask) != 0
    blob = res.data.tobytes()
    size = PORT_INFO.size
    for r in np.flatnonzero(res.ok & (differs.any(axis=1) | ~taken)).tolist():
        names = [name for name, (rows, _) in fields.items() if rows[r] and name not in _ONE_SHOT]
        got = _PORT_INFO.get_fields(blob[r * size : (r + 1) * size], names)
        bad = {name: (int(fields[name][1][r]), got[name]) for name in names if got[name] != fields[name][1][r]}
        if refused is not None and bad.keys() & _ADVISORY:
            refused.append((int(f.node_guid[node_l[r]]), port_l[r]))
        if m_key_refused is not None and bad.keys() & _M_KEY_FIELDS:
            m_key_refused.append((node_l[r], port_l[r]))
            bad = {k: v for k, v in bad.items() if k not in _M_KEY_FIELDS}
        bad = {k: v for k, v in bad.items() if k not in _ADVISORY and k not in _HIGH_LIMIT}
        taken[r] = not bad
        if bad:
            failures.append(f"{f.port_name(node_l[r], port_l[r])}: PortInfo Set {what} not taken: {bad}")
    # Later Sets build on what the ports now hold, and carry the keys they now hold.
    answered = np.flatnonzero(res.ok).tolist()
    d.port_info.update_raw((where[r], blob[r * size : (r + 1) * size]) for r in answered)
    if keys is not None:
        keys.learn(f, [where[r] for r in answered], res.data[answered])
    return taken, failures


@functools.cache
def _bits_of(names: frozenset[str]) -> npt.NDArray[np.uint8]:
    """The PortInfo bits of the fields ``names``, as a byte mask (fields may share a byte)."""
    mask = np.zeros(PORT_INFO.size, np.uint8)
    for name in names:
        fld = PORT_INFO.field(name)
        if fld.width <= 64:
            mask |= np.frombuffer(PORT_INFO.pack({name: (1 << fld.width) - 1}), np.uint8)
    return mask


async def _reread_refused(
    transport: WindowedTransport,
    routes: list[Path],
    which: npt.NDArray[np.intp],
    mods: npt.NDArray[np.int64],
    data: npt.NDArray[np.uint8],
    want_state: npt.NDArray[np.int64],
    set_mask: npt.NDArray[np.uint8],
    res: SmpAnswers,
    mkeys: npt.NDArray[np.uint64] | None = None,
    *,
    rows: npt.NDArray[np.intp] | None = None,
) -> None:
    """Read back the ports whose Set failed; where a port holds what was asked, the Set was taken.

    A Set whose answer was lost is sent again as is, and a port it already
    moved (INIT -> ARMED, ARMED -> ACTIVE) refuses the same change again
    (status 0x1c, invalid attribute value): the state asked for is there
    all the same. ``res`` is updated in place: such rows become answers.
    ``mkeys``: the M_Key of each row's Get; ``rows``: the rows to read (default:
    those answered with a status).
    """
    if rows is None:
        # Only Sets answered with a status: one that timed out every round has a port that does not answer.
        rows = np.array(sorted(r for r, e in res.errors.items() if not isinstance(e, MadTimeout)), np.intp)
    if not rows.size:
        return
    back = await smp_batch_dr(transport, Method.GET, SmpAttr.PORT_INFO, routes, which[rows], mods[rows],
                              mkeys=mkeys[rows] if mkeys is not None else None)  # fmt: skip
    state = (back.data[:, 32] & 0x0F).astype(np.int64)
    same = ((back.data ^ data[rows]) & set_mask == 0).all(axis=1)
    there = back.ok & same & ((want_state[rows] == 0) | (state == want_state[rows]))
    for j in np.flatnonzero(there).tolist():
        r = int(rows[j])
        res.ok[r] = True
        res.data[r] = back.data[j]
        del res.errors[r]


_HELD = (
    "M_Key",
    "M_KeyProtectBits",
    "M_KeyLeasePeriod",
    "LID",
    "LMC",
    "MasterSMLID",
    "MasterSMSL",
    "GIDPrefix",
    "NeighborMTU",
    "OperationalVLs",
    "PortState",
    "CapabilityMask",
    "PartitionEnforcementInbound",
    "PartitionEnforcementOutbound",
    "VLHighLimit",
)
"""PortInfo fields stage 1 compares with the plan."""


@dataclass
class _PortPlan:
    """Stage 1's Sets: one row per port that holds anything else than the plan."""

    nodes: npt.NDArray[np.intp]
    ports: npt.NDArray[np.intp]
    fields: Fields
    live: bool
    """Some Set changes a port in use: a LID or LMC that is not 0, or the master SM of an ACTIVE port."""
    enforcement_only: npt.NDArray[np.bool_] | None = None
    """Rows whose Set only changes partition enforcement (counted apart: ibsim never keeps it)."""
    rekeys: bool = False
    """Some Set changes a port's M_Key: the SMPs of the other stages must wait for the new keys."""
    high_limit_rows: npt.NDArray[np.bool_] | None = None
    """Rows whose Set changes VLHighLimit."""
    m_key_rows: npt.NDArray[np.bool_] | None = None
    """Rows whose Set changes M_Key, M_KeyProtectBits or M_KeyLeasePeriod."""


def _plan_port_infos(
    d: Discovery,
    lids: LidMap,
    links: LinkPlan,
    sm_lid: int,
    prefix: int,
    *,
    reregister: bool = False,
    enforce: Mapping[Port, tuple[int, int]] | None = None,
    keys: MKeys | None = None,
    high_limit: Mapping[Port, int] | None = None,
) -> _PortPlan:
    """LID, LMC, MasterSMLID (MasterSMSL 0) and GID prefix on end ports; INIT -> ARMED, with
    NeighborMTU and OperationalVLs, on trained links. A port already ACTIVE keeps its MTU and VLs
    until its link trains again (OpenSM likewise sets them while arming). ClientReregister goes to
    end ports that get a new LID or master, and with ``reregister`` to every end port (as OpenSM
    does on a new master's first sweep), where CapabilityMask says the port supports it. With
    ``enforce``, switch ports get PartitionEnforcementInbound/Outbound as it says (0 where it says
    nothing). With ``keys``, end ports get the M_Key they should hold, M_KeyProtectBits and
    M_KeyLeasePeriod as configured (OpenSM's lid_mgr_set_physp_pi), where they hold other values.
    With ``high_limit``, the ports it names get that VLHighLimit where they hold another (QoS, as
    OpenSM's link manager sets it with ``qos`` on)."""
    f = d.fabric
    up = f.up_mask()
    endport = np.zeros_like(up)
    ep = f.endports()
    endport[ep[:, 0], ep[:, 1]] = True
    # What each port holds: its PortInfo as read or as the last Set left it, as columns.
    info = d.port_info
    rn, rp = np.nonzero(up | endport)
    known = [k for k in zip(rn.tolist(), rp.tolist(), strict=True) if k in info]
    held, read = _info_columns(d, known, _HELD, up.shape, np.uint64)
    lmc = lids.lmc
    # A link the model has seen come up (a light sweep's change) is armed even if the PortInfo at
    # hand is older (its read failed): the port can only be in INIT then.
    armable = up & ((held["PortState"] == PortState.INIT) | (f.state == PortState.INIT))
    armable[:, 0] = False
    relid = endport & ((held["LID"] != lids.base) | (held["LMC"] != lmc))
    resm = endport & (
        (held["MasterSMLID"] != sm_lid) | (held["MasterSMSL"] != 0) | (held["GIDPrefix"] != np.uint64(prefix))
    )
    live = bool((relid & (held["LID"] != 0)).any() or (resm & (held["PortState"] == PortState.ACTIVE)).any())
    can_rereg = endport & ((held["CapabilityMask"] & np.uint64(_REREG_CAP)) != 0)
    rereg = can_rereg & (relid | resm | (endport if reregister else False))
    want_in = np.zeros(up.shape, np.uint64)
    want_out = np.zeros(up.shape, np.uint64)
    sw_port = np.zeros_like(up)
    if enforce is not None:
        sw_port[f.switches, 1:] = True
        for (n, p), (i, o) in enforce.items():
            want_in[n, p], want_out[n, p] = i, o
    reenf = sw_port & read & (
        (held["PartitionEnforcementInbound"] != want_in) | (held["PartitionEnforcementOutbound"] != want_out)
    )
    rekey = np.zeros_like(up)
    want_key = np.zeros(up.shape, np.uint64)
    keyed = keys is not None and keys.active  # M_Key off, and no port holds a key: their fields are left alone
    if keys is not None and keyed:
        want_key = keys.want_keys(f)
        rekey = endport & ~keys.ignored_mask(f) & (
            (held["M_Key"] != want_key)
            | (held["M_KeyProtectBits"] != keys.protect)
            | (held["M_KeyLeasePeriod"] != keys.lease)
        )
    want_hl = np.zeros(up.shape, np.uint64)
    rehl = np.zeros_like(up)
    if high_limit:
        hl_mask = np.zeros_like(up)
        for (n, p), v in high_limit.items():
            want_hl[n, p] = v
            hl_mask[n, p] = True
        rehl = hl_mask & read & (held["VLHighLimit"] != want_hl)
    other = relid | resm | armable | rereg | rekey | rehl
    cn, cp = np.nonzero(read & (other | reenf))
    is_end, has_mtu, arm = endport[cn, cp], (armable & (links.mtu != 0))[cn, cp], armable[cn, cp]
    enf = sw_port[cn, cp]
    k = cn.size
    fields: Fields = {
        "LID": (is_end, lids.base[cn, cp].astype(np.int64)),
        "LMC": (is_end, np.full(k, lmc, np.int64)),
        "MasterSMLID": (is_end, np.full(k, sm_lid, np.int64)),
        "MasterSMSL": (is_end, np.zeros(k, np.int64)),
        "GIDPrefix": (is_end, np.full(k, prefix, np.uint64)),
        "ClientReregister": (rereg[cn, cp], np.ones(k, np.int64)),
        "NeighborMTU": (has_mtu, links.mtu[cn, cp].astype(np.int64)),
        "OperationalVLs": (has_mtu, links.op_vls[cn, cp].astype(np.int64)),
        "PortState": (arm, np.full(k, int(PortState.ARMED), np.int64)),
        "PartitionEnforcementInbound": (enf, want_in[cn, cp].astype(np.int64)),
        "PartitionEnforcementOutbound": (enf, want_out[cn, cp].astype(np.int64)),
    }
    if high_limit:
        fields["VLHighLimit"] = (rehl[cn, cp], want_hl[cn, cp].astype(np.int64))
    if keys is not None and keyed:
        fields["M_Key"] = (is_end & rekey[cn, cp], want_key[cn, cp])
        fields["M_KeyProtectBits"] = (is_end & rekey[cn, cp], np.full(k, keys.protect, np.int64))
        fields["M_KeyLeasePeriod"] = (is_end & rekey[cn, cp], np.full(k, keys.lease, np.int64))
    changes_key = (rekey & (held["M_Key"] != want_key))[cn, cp]
    return _PortPlan(
        cn,
        cp,
        fields,
        live,
        enforcement_only=~other[cn, cp],
        rekeys=bool(changes_key.any()),
        m_key_rows=rekey[cn, cp],
        high_limit_rows=rehl[cn, cp],
    )


async def _set_port_infos(
    transport: WindowedTransport,
    d: Discovery,
    lids: LidMap,
    links: LinkPlan,
    plan: _PortPlan,
    rep: ProgramReport,
    keys: MKeys | None = None,
) -> None:
    """Stage 1: the planned PortInfo Sets, and what the ports then hold into the model.

    When keys change, the end ports' Sets go first (a switch's port 0 takes the switch's new key),
    then the other ports', carrying the new keys."""
    f = d.fabric
    cn, cp, fields = plan.nodes, plan.ports, plan.fields
    ok = np.zeros(cn.size, bool)
    first = fields["LID"][0] if plan.rekeys else np.ones(cn.size, bool)  # the end-port rows
    for part in (np.flatnonzero(first), np.flatnonzero(~first)):
        if not part.size:
            continue
        sub = {name: (rows[part], values[part]) for name, (rows, values) in fields.items()}
        ok[part], failures = await _port_info_sets(
            transport, d, cn[part], cp[part], sub, "config", rep.enforcement_refused, keys, rep.timed_out,
            rep.m_key_refused, rep.high_limit_refused,
        )  # fmt: skip
        rep.failures += failures
    if plan.m_key_rows is not None:
        refused = np.zeros(ok.size, bool)
        if rep.m_key_refused:
            no_keys = set(rep.m_key_refused)
            refused = np.array([k in no_keys for k in zip(cn.tolist(), cp.tolist(), strict=True)])
        rep.m_keys_set += int((ok & plan.m_key_rows & ~refused).sum())
    enf = plan.enforcement_only if plan.enforcement_only is not None else np.zeros(ok.size, bool)
    rep.port_sets += int((ok & ~enf).sum())
    rep.enforcement_sets += int((ok & enf).sum())
    rep.reregistered += int(fields["ClientReregister"][0][ok].sum())
    if plan.high_limit_rows is not None:
        rep.high_limit_sets += int((ok & plan.high_limit_rows).sum())
    n, p = cn[ok], cp[ok]
    m = fields["LID"][0][ok]
    f.lid[n[m], p[m]] = lids.base[n[m], p[m]]
    f.lmc[n[m], p[m]] = lids.lmc
    m = fields["NeighborMTU"][0][ok]
    f.mtu_active[n[m], p[m]] = links.mtu[n[m], p[m]]
    f.op_vls[n[m], p[m]] = links.op_vls[n[m], p[m]]
    m = fields["PortState"][0][ok]
    f.state[n[m], p[m]] = int(PortState.ARMED)
    rep.armed += int(m.sum())


def pkey_room(d: Discovery, node: int, port: int) -> int:
    """Entries of the P_Key table of (node, port): NodeInfo.PartitionCap for a CA port or switch port 0,
    SwitchInfo.PartitionEnforcementCap for a switch's external port (0: it holds none)."""
    f = d.fabric
    if f.is_switch(node) and port:
        return int(d.switch_info.get(node, {}).get("PartitionEnforcementCap", 0))
    return int(d.node_info.get(node, {}).get("PartitionCap", 0))


def _pkey_route(d: Discovery, routes: list[Path], extra: dict[Path, int], node: int, port: int) -> tuple[int, int]:
    """(index into ``routes``, port for the modifier) of a P_KeyTable SMP to (node, port): a switch by
    its path with the port in the modifier; a CA by a path that arrives at that port (it answers for
    the port the SMP came in on)."""
    if d.fabric.is_switch(node):
        return node, port
    path = d.port_paths.get((node, port), d.paths[node])
    if path == d.paths[node]:
        return node, 0
    k = extra.get(path)
    if k is None:
        k = extra[path] = len(routes)
        routes.append(path)
    return k, 0


async def read_pkey_tables(
    transport: WindowedTransport, d: Discovery, ports: Iterable[Port], held: HeldPkeys, keys: MKeys | None = None
) -> int:
    """Read the whole P_Key table of each of ``ports`` (every block its cap has room for) into ``held``;
    a port whose table does not read whole is left out (unknown). The number of ports read."""
    f = d.fabric
    routes: list[Path] = list(d.paths)
    extra: dict[Path, int] = {}
    which: list[int] = []
    mods: list[int] = []
    where: list[tuple[tuple[int, int], int]] = []
    at: list[Port] = []
    tables: dict[tuple[int, int], npt.NDArray[np.uint16]] = {}
    for node, port in ports:
        nblocks = -(-pkey_room(d, node, port) // PKEY_BLOCK_SIZE)
        if not nblocks:
            continue
        key = (int(f.node_guid[node]), port)
        tables[key] = np.zeros(nblocks * PKEY_BLOCK_SIZE, np.uint16)
        route, mod_port = _pkey_route(d, routes, extra, node, port)
        for b in range(nblocks):
            which.append(route)
            mods.append(pkey_table_mod(b, mod_port))
            where.append((key, b))
            at.append((node, port))
    if not which:
        return 0
    mkeys = keys.rows(f, [n for n, _ in at], [p for _, p in at]) if keys is not None else None
    got = await smp_batch_dr(transport, Method.GET, SmpAttr.PKEY_TABLE, routes, np.array(which, np.intp),
                             np.array(mods, np.int64), mkeys=mkeys)  # fmt: skip
    blocks = got.data[:, : 2 * PKEY_BLOCK_SIZE].copy().view(">u2").astype(np.uint16)
    bad: set[tuple[int, int]] = set()
    for j, (key, b) in enumerate(where):
        if got.ok[j]:
            tables[key][b * PKEY_BLOCK_SIZE : (b + 1) * PKEY_BLOCK_SIZE] = blocks[j]
        else:
            bad.add(key)
    for key, table in tables.items():
        if key not in bad:
            held[key] = table
    return len(tables) - len(bad)


async def _set_pkey_tables(
    transport: WindowedTransport, d: Discovery, tables: Mapping[Port, tuple[int, ...]], held: HeldPkeys,
    rep: ProgramReport, keys: MKeys | None = None,
) -> None:  # fmt: skip
    """P_KeyTable Sets of the blocks of each port's table that differ from what it holds.

    A port we hold nothing for (a new one, or a new ibfm process) is read first, every block its
    table has room for, as OpenSM does: a second run over a configured fabric writes nothing, and
    keys another SM left beyond our table are cleared. A block that does not read is sent."""
    f = d.fabric
    routes: list[Path] = list(d.paths)
    extra: dict[Path, int] = {}
    unknown = []
    for (node, port), _ in tables.items():
        cur = held.get((int(f.node_guid[node]), port))
        if cur is None or cur.size != -(-pkey_room(d, node, port) // PKEY_BLOCK_SIZE) * PKEY_BLOCK_SIZE:
            unknown.append((node, port))
    if unknown:
        await read_pkey_tables(transport, d, unknown, held, keys)
    which_l: list[int] = []
    mods_l: list[int] = []
    datas: list[npt.NDArray[np.uint16]] = []
    targets: list[tuple[int, int, int, npt.NDArray[np.uint16]]] = []  # (node, port, block, held table)
    for (node, port), table in tables.items():
        room = pkey_room(d, node, port)
        nblocks = -(-room // PKEY_BLOCK_SIZE)
        if not nblocks:
            if any(table):
                rep.failures.append(f"{f.port_name(node, port)}: holds no P_Key table; {len(table)} keys not set")
            continue
        want = np.zeros(nblocks * PKEY_BLOCK_SIZE, np.uint16)
        pk = np.asarray(table[: want.size], np.uint16)
        want[: pk.size] = pk
        if len(table) > want.size and any(table[want.size :]):
            rep.failures.append(f"{f.port_name(node, port)}: P_Key table of {len(table)} beyond its {room} entries")
        hkey = (int(f.node_guid[node]), port)
        cur = held.get(hkey)
        if cur is None or cur.size != want.size:
            cur = held[hkey] = want ^ np.uint16(1)  # did not read: differs from every block we send
        changed = np.flatnonzero((want != cur).reshape(nblocks, PKEY_BLOCK_SIZE).any(axis=1))
        rep.pkey_blocks_skipped += nblocks - changed.size
        route, mod_port = _pkey_route(d, routes, extra, node, port)
        for b in changed.tolist():
            which_l.append(route)
            mods_l.append(pkey_table_mod(b, mod_port))
            datas.append(want[b * PKEY_BLOCK_SIZE : (b + 1) * PKEY_BLOCK_SIZE])
            targets.append((node, port, b, cur))
    if not datas:
        return
    data = np.stack(datas).astype(">u2").view(np.uint8).reshape(len(datas), 2 * PKEY_BLOCK_SIZE)
    mkeys = keys.rows(f, [t[0] for t in targets], [t[1] for t in targets]) if keys is not None else None
    res = await smp_batch_dr(transport, Method.SET, SmpAttr.PKEY_TABLE, routes, np.array(which_l, np.intp),
                             np.array(mods_l, np.int64), data, mkeys=mkeys)  # fmt: skip
    good = res.ok & (res.data[:, : data.shape[1]] == data).all(axis=1)
    rep.pkey_blocks_sent += int(good.sum())
    for j, (node, port, b, cur) in enumerate(targets):
        lo = b * PKEY_BLOCK_SIZE
        if good[j]:
            cur[lo : lo + PKEY_BLOCK_SIZE] = datas[j]
            continue
        err = res.errors.get(j)
        if err is not None:
            rep.failures.append(f"{f.port_name(node, port)}: P_KeyTable block {b} Set failed: {err}")
            cur[lo] = datas[j][0] ^ 1  # unknown: sent again next sweep
            if isinstance(err, MadTimeout):
                rep.timed_out.append((node, 0 if f.is_switch(node) else port))
        else:
            rep.failures.append(f"{f.port_name(node, port)}: P_KeyTable block {b} reads back different")
            cur[lo : lo + PKEY_BLOCK_SIZE] = res.data[j, : data.shape[1]].copy().view(">u2")


@dataclass
class MftReport:
    blocks_sent: int = 0
    blocks_skipped: int = 0
    failures: list[str] = field(default_factory=list)


async def program_mfts(
    transport: WindowedTransport, d: Discovery, table: MftTable, held: HeldMfts, keys: MKeys | None = None
) -> MftReport:
    """MulticastForwardingTable Sets of the (block, position) pairs of each switch's ``table`` row that
    differ from what it holds (unknown: every block up to the top MLID, zeros too, so nothing stale
    stays there); ``held`` updated with what the switches took."""
    f = d.fabric
    rep = MftReport()
    positions = mft_positions(f)
    which: list[int] = []
    mods: list[int] = []
    datas: list[bytes] = []
    targets: list[tuple[int, int, int, npt.NDArray[np.uint16]]] = []  # (switch node, block, position, held)
    for row, node in enumerate(f.switches.tolist()):
        new = table[row, :, : positions[row]]
        guid = int(f.node_guid[node])
        cur = held.get(guid)
        if cur is not None and cur.shape[1] != new.shape[1]:
            cur = None
        changed = mft_blocks_changed(new, cur)
        nb = max(new.shape[0], cur.shape[0] if cur is not None else 0)
        total = nb // MLIDS_PER_BLOCK * int(positions[row])
        rep.blocks_skipped += total - len(changed)
        if cur is None or cur.shape[0] < nb:
            grown = np.zeros((nb, new.shape[1]), np.uint16)
            if cur is not None:
                grown[: cur.shape[0]] = cur
            if cur is None:
                grown ^= 1  # unknown until the Sets are answered
            cur = held[guid] = grown
        padded = np.zeros_like(cur)
        padded[: new.shape[0]] = new
        for b, p in changed:
            which.append(node)
            mods.append(mft_attr_mod(b, p))
            datas.append(block_payload(padded, b, p))
            targets.append((node, b, p, cur))
    if not datas:
        return rep
    data = np.frombuffer(b"".join(datas), np.uint8).reshape(len(datas), -1)
    mkeys = keys.rows(f, which) if keys is not None else None
    res = await smp_batch_dr(transport, Method.SET, SmpAttr.MFT, d.paths, np.array(which, np.intp),
                             np.array(mods, np.int64), data, mkeys=mkeys)  # fmt: skip
    good = res.ok & (res.data[:, : data.shape[1]] == data).all(axis=1)
    rep.blocks_sent = int(good.sum())
    for j, (node, b, p, cur) in enumerate(targets):
        rows = slice(b * MLIDS_PER_BLOCK, (b + 1) * MLIDS_PER_BLOCK)
        if good[j]:
            cur[rows, p] = np.frombuffer(datas[j], ">u2")
            continue
        err = res.errors.get(j)
        what = f"{f.names[node]}: MFT block {b} position {p}"
        rep.failures.append(f"{what} Set failed: {err}" if err is not None else f"{what} reads back different")
        cur[rows, p] = np.frombuffer(datas[j], ">u2") ^ 1  # unknown: sent again
    return rep


async def _set_fdb_tops(
    transport: WindowedTransport, d: Discovery, top: int, rep: ProgramReport, keys: MKeys | None = None
) -> None:
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
    mkeys = keys.row_list(f, nodes) if keys is not None else None
    for node, ans in zip(nodes, await smp_batch(transport, reqs, mkeys=mkeys), strict=True):
        if isinstance(ans, Exception):
            rep.failures.append(f"{f.names[node]}: SwitchInfo Set failed: {ans}")
            if isinstance(ans, MadTimeout):
                rep.timed_out.append((node, 0))
        elif (got := SWITCH_INFO.unpack(ans)).get("LinearFDBTop") != top:
            rep.failures.append(f"{f.names[node]}: LinearFDBTop reads {got.get('LinearFDBTop')!r} after Set {top}")
        else:
            d.switch_info[node] = got
            rep.switchinfo_sets += 1


async def _set_blocks(
    transport: WindowedTransport, d: Discovery, lft: Lft, held: HeldLfts, rep: ProgramReport, keys: MKeys | None = None,
    progress: SweepProgress | None = None,
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
    mkeys = keys.rows(f, nodes) if keys is not None else None
    if progress is not None:
        progress.expect(int(blocks.size), "LFT blocks")
    res = await smp_batch_dr(transport, Method.SET, SmpAttr.LFT, d.paths, nodes, blocks, data, mkeys=mkeys)
    # The GetResp holds what was set: the common case, checked for all blocks at once.
    good = res.ok & (res.data == data).all(axis=1)
    rep.blocks_sent += int(good.sum())
    if progress is not None:
        progress.advance(int(good.sum()))
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
            if isinstance(err, MadTimeout):
                rep.timed_out.append((node, 0))
        else:
            rep.failures.append(f"{where} reads back different")
            cur[lo : lo + LFT_BLOCK_SIZE] = res.data[j]


async def _activate(transport: WindowedTransport, d: Discovery, rep: ProgramReport, keys: MKeys | None = None) -> None:
    """ARMED -> ACTIVE on every up port, now that the LFTs are in."""
    f = d.fabric
    active = int(PortState.ACTIVE)
    cn, cp = np.nonzero(f.up_mask() & (f.state == PortState.ARMED))
    fields: Fields = {"PortState": (np.ones(cn.size, bool), np.full(cn.size, active, np.int64))}
    ok, failures = await _port_info_sets(transport, d, cn, cp, fields, "ACTIVE", None, keys, rep.timed_out)
    rep.failures += failures
    f.state[cn[ok], cp[ok]] = active
    rep.activated += int(ok.sum())
    # An up link port that is neither ACTIVE nor was it set (no PortInfo to build on, say): named,
    # so the sweep is not taken for a success and the next one looks again.
    stuck = f.up_mask() & (f.state != PortState.ACTIVE)
    stuck[:, 0] = False
    stuck[cn, cp] = False
    for n, p in zip(*np.nonzero(stuck), strict=True):
        rep.failures.append(
            f"{f.port_name(int(n), int(p))}: left {PortState(int(f.state[n, p])).name} after programming"
        )


# -- QoS: SLtoVLMappingTables and VLArbitrationTables -------------------------------------------------------


@dataclass
class NodeQos:
    """The QoS tables one node holds as far as we know: ``sl2vl[in, out]`` (a CA: in 0 only) 8 bytes,
    ``vlarb[port, block - 1]`` 64 bytes; ``*_known`` where we know."""

    sl2vl: npt.NDArray[np.uint8]
    sl2vl_known: npt.NDArray[np.bool_]
    vlarb: npt.NDArray[np.uint8]
    vlarb_known: npt.NDArray[np.bool_]

    @classmethod
    def empty(cls, nports: int, switch: bool) -> NodeQos:
        n_in = nports + 1 if switch else 1
        return cls(
            np.zeros((n_in, nports + 1, SL2VL_SIZE), np.uint8),
            np.zeros((n_in, nports + 1), bool),
            np.zeros((nports + 1, 4, VLARB_TABLE.size), np.uint8),
            np.zeros((nports + 1, 4), bool),
        )


HeldQos = dict[int, NodeQos]
"""Node GUID -> the SL2VL and VLArb tables it holds as far as we know."""

QOS_CHUNK = 32768
"""QoS table SMPs built and sent per batch (a large fabric has millions of SL2VL tables)."""


@dataclass
class QosReport:
    sl2vl_sent: int = 0
    sl2vl_skipped: int = 0
    vlarb_sent: int = 0
    vlarb_skipped: int = 0
    read: int = 0
    """Tables read first because what the port held was not known (a new port, a new process)."""
    failures: list[str] = field(default_factory=list)


@dataclass
class _QosRows:
    """Every table a plan sets, one row each, grouped by node (``spans``)."""

    node: npt.NDArray[np.int64]
    attr: npt.NDArray[np.int64]
    a: npt.NDArray[np.int64]
    """SL2VL: input port; VLArb: port."""
    b: npt.NDArray[np.int64]
    """SL2VL: output port; VLArb: block 1..4."""
    want: npt.NDArray[np.uint8]
    """``[rows, 64]``: the bytes to set (an SL2VL table in the first 8)."""
    count: npt.NDArray[np.int64]
    """Leading bytes that count when compared (a VLArb block's entries past its length do not)."""
    spans: list[tuple[int, int, int]]
    """(node, first row, end row)."""


def _qos_rows(d: Discovery, plan: QosPlan) -> _QosRows:
    f = d.fabric
    packed = pack_sl2vl(plan.sl2vl_out)
    sl_attr, arb_attr = int(SmpAttr.SL2VL_TABLE), int(SmpAttr.VLARB_TABLE)
    nodes_l: list[npt.NDArray[np.int64]] = []
    attr_l: list[npt.NDArray[np.int64]] = []
    a_l: list[npt.NDArray[np.int64]] = []
    b_l: list[npt.NDArray[np.int64]] = []
    want_l: list[npt.NDArray[np.uint8]] = []
    count_l: list[npt.NDArray[np.int64]] = []
    spans: list[tuple[int, int, int]] = []
    arb_rows_of: dict[int, npt.NDArray[np.intp]] = {}
    if plan.vlarb_ports.size:
        order = np.argsort(plan.vlarb_ports[:, 0], kind="stable")
        nodes_sorted = plan.vlarb_ports[order, 0]
        cuts = np.flatnonzero(np.diff(nodes_sorted)) + 1
        for grp in np.split(order, cuts):
            arb_rows_of[int(plan.vlarb_ports[grp[0], 0])] = grp
    sl_nodes = set(np.flatnonzero(plan.sl2vl_set.any(axis=1)).tolist()) | set(plan.sl2vl_p0)
    at = 0
    for n in sorted(sl_nodes | set(arb_rows_of)):
        start = at
        if n in sl_nodes:
            outs = np.flatnonzero(plan.sl2vl_set[n])
            ins = np.arange(int(f.nports[n]) + 1) if f.is_switch(n) else np.zeros(1, np.int64)
            ii = np.repeat(ins, outs.size)
            oo = np.tile(outs, ins.size)
            w = np.zeros((ii.size, 64), np.uint8)
            w[:, :SL2VL_SIZE] = packed[n, oo]
            if n in plan.sl2vl_p0:
                hit = (ii == 0) & (oo == 0)
                w[hit, :SL2VL_SIZE] = pack_sl2vl(plan.sl2vl_p0[n])
            nodes_l.append(np.full(ii.size, n, np.int64))
            attr_l.append(np.full(ii.size, sl_attr, np.int64))
            a_l.append(ii.astype(np.int64))
            b_l.append(oo.astype(np.int64))
            want_l.append(w)
            count_l.append(np.full(ii.size, SL2VL_SIZE, np.int64))
            at += ii.size
        arb = arb_rows_of.get(n)
        if arb is not None:
            lens = plan.vlarb_len[arb]  # [g, 4]
            r, blk = np.nonzero(lens != 0)
            rows = arb[r]
            nodes_l.append(np.full(r.size, n, np.int64))
            attr_l.append(np.full(r.size, arb_attr, np.int64))
            a_l.append(plan.vlarb_ports[rows, 1].astype(np.int64))
            b_l.append((blk + 1).astype(np.int64))
            want_l.append(plan.vlarb[rows, blk].reshape(r.size, 64))
            count_l.append(2 * np.maximum(lens[r, blk], 0).astype(np.int64))
            at += r.size
        spans.append((n, start, at))

    def cat(parts: list[Any], dtype: Any, shape: tuple[int, ...] = ()) -> Any:
        return np.concatenate(parts) if parts else np.zeros((0, *shape), dtype)

    return _QosRows(cat(nodes_l, np.int64), cat(attr_l, np.int64), cat(a_l, np.int64), cat(b_l, np.int64),
                    cat(want_l, np.uint8, (64,)), cat(count_l, np.int64), spans)  # fmt: skip


def _held_rows(d: Discovery, t: _QosRows, held: HeldQos) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """What the ports hold of each row (``[rows, 64]``) and whether we know it."""
    f = d.fabric
    cur = np.zeros((t.node.size, 64), np.uint8)
    known = np.zeros(t.node.size, bool)
    sl_attr = int(SmpAttr.SL2VL_TABLE)
    for n, lo, hi in t.spans:
        h = held.get(int(f.node_guid[n]))
        if h is None:
            h = held[int(f.node_guid[n])] = NodeQos.empty(int(f.nports[n]), f.is_switch(n))
        sl = t.attr[lo:hi] == sl_attr
        a, b = t.a[lo:hi], t.b[lo:hi]
        j = np.flatnonzero(sl)
        cur[lo + j, :SL2VL_SIZE] = h.sl2vl[a[j], b[j]]
        known[lo + j] = h.sl2vl_known[a[j], b[j]]
        j = np.flatnonzero(~sl)
        cur[lo + j] = h.vlarb[a[j], b[j] - 1]
        known[lo + j] = h.vlarb_known[a[j], b[j] - 1]
    return cur, known


def _learn(d: Discovery, t: _QosRows, held: HeldQos, rows: npt.NDArray[np.intp], data: npt.NDArray[np.uint8],
           ok: npt.NDArray[np.bool_]) -> None:  # fmt: skip
    """Rows ``rows`` now hold ``data`` where ``ok``, and are unknown where not."""
    f = d.fabric
    sl_attr = int(SmpAttr.SL2VL_TABLE)
    span_of = np.searchsorted(np.array([lo for _, lo, _ in t.spans]), rows, side="right") - 1
    for s in np.unique(span_of).tolist():
        n = t.spans[s][0]
        h = held[int(f.node_guid[n])]
        sel = span_of == s
        r, dd, good = rows[sel], data[sel], ok[sel]
        a, b = t.a[r], t.b[r]
        sl = t.attr[r] == sl_attr
        j = np.flatnonzero(sl)
        h.sl2vl[a[j], b[j]] = dd[j, :SL2VL_SIZE]
        h.sl2vl_known[a[j], b[j]] = good[j]
        j = np.flatnonzero(~sl)
        h.vlarb[a[j], b[j] - 1] = dd[j]
        h.vlarb_known[a[j], b[j] - 1] = good[j]


async def set_qos_tables(
    transport: WindowedTransport, d: Discovery, plan: QosPlan, held: HeldQos, keys: MKeys | None = None
) -> QosReport:
    """The SLtoVLMappingTable and VLArbitrationTable Sets of the tables that differ from what the ports hold.

    A table we hold nothing for is read first (all of them in batches), as P_Key tables are: a second
    run over a configured fabric writes nothing. A table that does not read is sent. Each answer
    becomes what the port holds; a Set whose answer differs from what was sent is a failure (and is
    sent again next time). Everything as arrays, in batches of :data:`QOS_CHUNK` SMPs."""
    rep = QosReport()
    f = d.fabric
    t = _qos_rows(d, plan)
    if not t.node.size:
        return rep
    cur, known = _held_rows(d, t, held)
    routes: list[Path] = list(d.paths)
    extra: dict[Path, int] = {}
    which = t.node.copy()
    sl = t.attr == int(SmpAttr.SL2VL_TABLE)
    sw = f.node_type[t.node] == NodeType.SWITCH
    mods = np.where(sl, np.where(sw, t.a << 8 | t.b, 0), t.b << 16 | np.where(sw, t.a, 0)).astype(np.int64)
    for j in np.flatnonzero(~sw).tolist():  # a CA: by a path that arrives at that port
        port = int(t.b[j] if sl[j] else t.a[j])
        which[j] = _pkey_route(d, routes, extra, int(t.node[j]), port)[0]
    mkeys = None
    if keys is not None:
        ports = np.where(sl, t.b, t.a)
        mkeys = keys.rows(f, t.node.tolist(), ports.tolist())
    unknown = np.flatnonzero(~known)
    if unknown.size:
        got, ok, _ = await _qos_batch(transport, Method.GET, t, routes, which, mods, unknown, None, mkeys)
        _learn(d, t, held, unknown, got, ok)
        cur[unknown] = got
        known[unknown] = ok
        rep.read += int(ok.sum())
    byte = np.arange(64)[None, :] < t.count[:, None]
    differ = ~known | ((cur != t.want) & byte).any(axis=1)
    todo = np.flatnonzero(differ)
    n_sl = int(sl.sum())
    rep.sl2vl_skipped = n_sl - int(sl[todo].sum())
    rep.vlarb_skipped = (t.node.size - n_sl) - int((~sl[todo]).sum())
    if not todo.size:
        return rep
    got, ok, errors = await _qos_batch(transport, Method.SET, t, routes, which, mods, todo, t.want, mkeys)
    same = ((got == t.want[todo]) | ~byte[todo]).all(axis=1)
    _learn(d, t, held, todo, got, ok & same)
    good = ok & same
    rep.sl2vl_sent = int((good & sl[todo]).sum())
    rep.vlarb_sent = int((good & ~sl[todo]).sum())
    for k in np.flatnonzero(~good).tolist():
        j = int(todo[k])
        n, a, b = int(t.node[j]), int(t.a[j]), int(t.b[j])
        what = (f"{f.port_name(n, b)}: SLtoVLMappingTable from port {a}" if sl[j]
                else f"{f.port_name(n, a)}: VLArbitrationTable block {b}")  # fmt: skip
        if not ok[k]:
            rep.failures.append(f"{what} Set failed: {errors.get(k, 'no answer')}")
        else:
            c = int(t.count[j])
            rep.failures.append(f"{what} reads back {got[k, :c].tobytes().hex()}, not {t.want[j, :c].tobytes().hex()}")
    return rep


async def _qos_batch(
    transport: WindowedTransport,
    method: int,
    t: _QosRows,
    routes: list[Path],
    which: npt.NDArray[np.int64],
    mods: npt.NDArray[np.int64],
    rows: npt.NDArray[np.intp],
    want: npt.NDArray[np.uint8] | None,
    mkeys: npt.NDArray[np.uint64] | None,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_], dict[int, Any]]:
    """QoS table SMPs for ``rows`` (both attributes), in chunks: the answers' 64 bytes, answered, errors by
    position in ``rows``."""
    got = np.zeros((rows.size, 64), np.uint8)
    ok = np.zeros(rows.size, bool)
    errors: dict[int, Any] = {}
    for lo in range(0, rows.size, QOS_CHUNK):
        r = rows[lo : lo + QOS_CHUNK]
        res = await smp_batch_dr(transport, method, t.attr[r], routes, which[r], mods[r],
                                 want[r] if want is not None else None,
                                 mkeys=mkeys[r] if mkeys is not None else None)  # fmt: skip
        got[lo : lo + r.size] = res.data[:, :64]
        ok[lo : lo + r.size] = res.ok
        errors.update((lo + k, e) for k, e in res.errors.items())
    sl = t.attr[rows] == int(SmpAttr.SL2VL_TABLE)
    got[sl, SL2VL_SIZE:] = 0
    return got, ok, errors


_QOS_COLUMNS = ("CapabilityMask", "VLArbitrationLowCap", "VLArbitrationHighCap", "OperationalVLs")


def qos_port_columns(d: Discovery) -> dict[str, npt.NDArray[Any]]:
    """The PortInfo columns QoS planning reads (``sm.qos.plan.plan_qos``), per ``[node, port]``, from the
    bytes each port holds; ``known``: its PortInfo was read."""
    info = d.port_info
    keys = [k for k in info if info.raw(k) is not None]
    out, known = _info_columns(d, keys, _QOS_COLUMNS, d.fabric.port_exists.shape, np.int64)
    out["known"] = known
    return out


def _info_columns(
    d: Discovery, keys: list[tuple[int, int]], names: Iterable[str], shape: tuple[int, ...], dtype: Any
) -> tuple[dict[str, npt.NDArray[Any]], npt.NDArray[np.bool_]]:
    """PortInfo fields ``names`` of the ports ``keys`` (each read, or as the last Set left it) as
    ``[node, port]`` columns of ``dtype`` (0 elsewhere), and where they were read."""
    info = d.port_info
    out: dict[str, npt.NDArray[Any]] = {name: np.zeros(shape, dtype) for name in names}
    read = np.zeros(shape, bool)
    if keys:
        kn, kp = np.array(keys, np.intp).reshape(-1, 2).T
        read[kn, kp] = True
        rows = np.frombuffer(b"".join([info.raw(k) or b"" for k in keys]), np.uint8).reshape(len(keys), -1)
        for name in out:
            out[name][kn, kp] = _PORT_INFO.column(rows, name)
    return out, read
