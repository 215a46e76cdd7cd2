"""PathRecord (IBA 15.2.5.16): the paths between end ports, from the routes actually programmed.

Semantics as OpenSM's ``osm_sa_path_record.c`` (3.3):

- The source is named by SGID (its low 64 bits are a port GUID; the prefix must be
  link-local or the subnet's) and/or SLID, the destination by DGID and/or DLID. A GID and a
  LID naming different ports: ERR_REQ_INVALID. An unknown GID or LID: no records (0x0300 on a
  Get, an empty table on a GetTable), as OpenSM, which answers with the empty list.
- Source and destination: that port pair. Only one of them: every end port (switch port 0
  included, the port itself too) on the other side, in OpenSM's order (its port GUID map: the
  GUID's bytes as a little-endian number, what a network-order key sorts as on x86). Neither:
  every pair, destinations outer. A Get stops at the first port pair with a path and takes one.
- With LMC > 0 a port pair has paths over each LID pair: first (src_i, dst_i) (Preference 0),
  then the others (Preference 2); SLID/DLID in the mask fix that side's LID. NumbPath (GetTable)
  caps the paths per port pair; a Get takes one.
- MTU is the smallest NeighborMTU, Rate the smallest link rate (width x speed as an IBA rate
  code) over every port the route programmed in the LFTs crosses (both ends of each link);
  PacketLifeTime the subnet timeout (18), 0 for a port to itself. MTU, Rate and
  PacketLifeTime selectors (with their value in the mask) filter and adjust as OpenSM's
  ``pr_rcv_get_path_parms``: 0 greater than (no record unless the path's is greater),
  1 less than (the next smaller value below the requested one), 2 exactly (the requested one
  if the path can), 3 best. A bad MTU or rate code with its selector: ERR_REQ_INVALID; one
  half of ServiceID: ERR_REQ_INSUFFICIENT_COMPONENTS.
- Answers: SGID/DGID the subnet prefix and port GUIDs, ServiceID 0, FlowLabel/HopLimit/TClass
  0, Reversible set when the reverse route exists (NumbPath 0), P_Key and SL from
  :func:`pair_pkey` and :func:`pair_sl` (hooks for partitions and QoS; today 0xFFFF and 0, or
  the requested SL), QoSClass 0, selectors "exactly".

Everything is arrays: per snapshot (``ctx.cache``) the per-port MTU and rate rank, and, filled
as queries come, the path minimum from every switch to one destination LID (a column, what a
Get needs) or from one switch to every LID (a row, what a GetTable from one source needs), each
traced hop by hop through the LFT for all its cells at once. On a subnet small enough every
column is traced with the snapshot's arrays, in one pass; on a bigger one a Get walks its one
path (a few us) until its LID has been asked for often enough to pay for the column (hundreds).

A Get between two named ports (the usual one: no selector, SL or ServiceID) has a scalar path of
its own, made per snapshot by :meth:`PathRecordFamily.quick`, which the SA's receive thread takes
without building the request objects; the partition keys it needs are cached by the ports' P_Key tables. It answers
exactly what ``query`` does, and leaves it everything else.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np
import numpy.typing as npt

from fabric.mad.sa import SaAttr, SaMethod, SaStatus, component_bit
from fabric.model import NodeType
from sm.sa.server import MAX_TABLE_RECORDS, GetOne, Rows, SaContext, SaError, SaRequest

DEFAULT_SUBNET_PREFIX = 0xFE80000000000000
SUBNET_TIMEOUT = 18
"""OpenSM's default subnet_timeout: the PacketLifeTime of its paths."""
DEFAULT_PKEY = 0xFFFF
DEFAULT_SL = 0

_A = int(SaAttr.PATH_RECORD)
_SERVICE_ID = component_bit(_A, "ServiceID")
_DGID = component_bit(_A, "DGID")
_SGID = component_bit(_A, "SGID")
_DLID = component_bit(_A, "DLID")
_SLID = component_bit(_A, "SLID")
_RAW = component_bit(_A, "RawTraffic")
_REVERSIBLE = component_bit(_A, "Reversible")
_NUMBPATH = component_bit(_A, "NumbPath")
_PKEY = component_bit(_A, "P_Key")
_SL = component_bit(_A, "SL")
_MTU_SEL = component_bit(_A, "MTUSelector")
_MTU = component_bit(_A, "MTU")
_RATE_SEL = component_bit(_A, "RateSelector")
_RATE = component_bit(_A, "Rate")
_PLT_SEL = component_bit(_A, "PacketLifeTimeSelector")
_PLT = component_bit(_A, "PacketLifeTime")

# IBA rate codes (PathRecord Rate, ib_types.h IB_PATH_RECORD_RATE_*) by nominal Gb/s.
RATE_CODE_GBPS: dict[int, float] = {
    2: 2.5, 5: 5, 3: 10, 11: 14, 6: 20, 15: 25, 19: 28, 4: 30, 7: 40, 20: 50, 12: 56, 8: 60,
    9: 80, 16: 100, 13: 112, 10: 120, 14: 168, 17: 200, 18: 300, 21: 400, 22: 600, 23: 800,
    24: 1200,
}  # fmt: skip
_CODES = sorted(RATE_CODE_GBPS, key=lambda c: RATE_CODE_GBPS[c])
_RANK_OF_CODE = np.zeros(256, np.uint8)
for _i, _c in enumerate(_CODES):
    _RANK_OF_CODE[_c] = _i + 1
_CODE_OF_RANK = np.zeros(256, np.uint8)
_CODE_OF_RANK[1 : len(_CODES) + 1] = _CODES
_GBPS_OF_RANK = np.array([0.0] + [RATE_CODE_GBPS[c] for c in _CODES])
# Nominal Gb/s per lane by fabric.model.Speed (FDR10 signals as QDR: 4x is 40 Gb/s).
_LANE_GBPS = {1: 2.5, 2: 5.0, 3: 10.0, 4: 10.0, 5: 14.0, 6: 25.0, 7: 50.0, 8: 100.0, 9: 200.0}
_LANES = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}
NO_HOP = 255
"""In the traced tables: no link crossed (the destination is the switch itself)."""
_EAGER_CELLS = 1 << 18
"""Largest switches x end port LIDs traced at once when a snapshot's path arrays are built (beyond,
each destination's column is traced on its first use)."""
_RECORD_DTYPE = np.dtype(
    {
        "names": ["dgid", "sgid", "dlid", "slid", "reversible", "pkey", "sl", "mtu", "rate", "plt", "preference"],
        "formats": [("u1", 16), ("u1", 16), ">u2", ">u2", "u1", ">u2", "u1", "u1", "u1", "u1", "u1"],
        "offsets": [8, 24, 40, 42, 49, 50, 53, 54, 55, 56, 57],
        "itemsize": 64,
    }
)
"""A PathRecord's fields as a GetTable fills them (the rest 0): those :data:`_RECORD` packs for a Get,
and the Preference."""
_COLUMN_AFTER = 32
"""A Get walks its path to a LID (:func:`_walk1`, ~13 us here) until this many have asked for that LID;
then the LID's column is traced (every switch at once, 430-590 us on 180-1,620 switches, as much as ~40
walks) and read from then on: a LID asked for once costs one walk, a hot one a column, and no LID costs
much more than twice the cheaper of the two."""
_WALKS_MAX = 1 << 16
"""Most LIDs :attr:`_Base.walks` counts for at once."""
_ONE_MIN = 2
"""From this many paths on, one source (or one LID) for all is read as a row (a column) at once."""
_TALKERS_MAX = 1024
"""Requesters whose reachable end ports a snapshot keeps (GetTables with partitions)."""
_PAIR_LUT_MAX = 1 << 16
"""Partition classes squared up to which a GetTable finds its class pairs with a table, not a sort."""


def rate_code(width: int, speed: int) -> int:
    """The IBA rate code of a link (PortInfo width code, fabric.model.Speed); 0 if unknown."""
    g = _LANES.get(width, 0) * _LANE_GBPS.get(speed, 0.0)
    if g <= 0:
        return 0
    best = 0
    for c in _CODES:  # the largest rate not above the link's (they are all exact today)
        if RATE_CODE_GBPS[c] <= g + 1e-9:
            best = c
    return best


def pair_pkey(ctx: SaContext, src: tuple[int, int], dst: tuple[int, int], requested: int | None) -> int | None:
    """The P_Key of paths between two end ports, or None when they share none (or not ``requested``).

    As OpenSM's ``pr_rcv_get_path_parms``: with a P_Key asked for, that key as asked when both
    ports hold it (a full member on at least one side), else no path; without, the first key
    they share in the source's table (``osm_physp_find_common_pkey``). A snapshot without a
    partition plan: every port a full member of the default partition.
    """
    plan = getattr(ctx.snapshot, "partitions", None)
    if plan is None:
        if requested is None:
            return DEFAULT_PKEY
        return requested if requested & 0x7FFF == 0x7FFF else None
    return _pick_pkey(plan.shared(src, dst), requested)


def _pick_pkey(shared: tuple[int, ...], requested: int | None) -> int | None:
    """:func:`pair_pkey` from the keys two ports share (``PartitionPlan.shared``)."""
    if requested is None:
        return shared[0] if shared else None
    base = requested & 0x7FFF
    return requested if any(k & 0x7FFF == base for k in shared) else None


def pair_sl(ctx: SaContext, src: tuple[int, int], dst: tuple[int, int], pkey: int, dlid: int | None = None) -> int:
    """The SL of paths between two end ports to ``dlid`` (default: the destination's base LID).

    Precedence, highest first:

    1. the routing engine's layer of the route (``snapshot.layers[row, dlid]``, ``row`` the switch
       the source's packets enter the fabric at: its own row for a switch port 0, else the switch
       its link leads to): the route is deadlock-free only on that SL's VL;
    2. the QoS level's SL (QoS on): the first matching rule of the policy file (source and
       destination port groups, P_Key), else the partition's ``sl=`` for ``pkey``;
    3. SL 0.

    This is OpenSM's order too (``pr_rcv_get_path_parms``: QoS level, partition, then the routing
    engine's ``path_sl`` over them).
    """
    return path_sl(ctx.snapshot, src, dst, pkey, dlid)


def path_sl(snap: Any, src: tuple[int, int], dst: tuple[int, int], pkey: int, dlid: int | None = None) -> int:
    """:func:`pair_sl` over a snapshot (what ``ibfm route`` and the HTTP API tell)."""
    sl = _layer_sl(snap, src, dst, dlid)
    if sl is not None:
        return sl
    return level_sl(snap, src, dst, pkey) or DEFAULT_SL


def level_sl(snap: Any, src: tuple[int, int], dst: tuple[int, int], pkey: int) -> int | None:
    """The QoS level's SL of a path (policy rule, else partition), None when QoS gives none."""
    qos = getattr(snap, "qos", None)
    return qos.level_sl(src, dst, pkey) if qos is not None else None


def entry_row(snap: Any, port: tuple[int, int]) -> int | None:
    """The LFT row of the switch where packets from end port ``port`` enter the fabric (None: no link)."""
    f = snap.fabric
    n, p = port
    if f.node_type[n] != NodeType.SWITCH:
        peer = int(f.peer_node[n, p])
        if peer < 0 or f.node_type[peer] != NodeType.SWITCH:
            return None
        n = peer
    rows = np.flatnonzero(f.switches == n)
    return int(rows[0]) if rows.size else None


def _layer_sl(snap: Any, src: tuple[int, int], dst: tuple[int, int], dlid: int | None) -> int | None:
    layers = getattr(snap, "layers", None)
    if layers is None:
        return None
    row = entry_row(snap, src)
    lid = dlid if dlid is not None else int(snap.lids.base[dst[0], dst[1]])
    if row is None or not 0 < lid < layers.shape[1]:
        return None
    return int(layers[row, lid])


@dataclass
class _Base:
    """Per-snapshot arrays."""

    nports: int
    sw: npt.NDArray[np.intp]
    row_of: npt.NDArray[np.intp]
    lft: npt.NDArray[np.uint8]
    node_of_row: npt.NDArray[np.intp]
    up: npt.NDArray[np.bool_]
    """Flat ``node * nports + port``."""
    peer: npt.NDArray[np.intp]
    """Flat key of the peer port (0 where none: guarded by ``up``)."""
    mtu: npt.NDArray[np.uint8]
    rank: npt.NDArray[np.uint8]
    owner_key: npt.NDArray[np.intp]
    """Flat key of the end port owning each LID, -1 where unused."""
    owner_node: npt.NDArray[np.intp]
    max_hops: int
    # end ports, in OpenSM's order
    ep_node: npt.NDArray[np.intp]
    ep_port: npt.NDArray[np.intp]
    ep_key: npt.NDArray[np.intp]
    ep_base: npt.NDArray[np.int64]
    ep_guid: npt.NDArray[np.uint64]
    ep_gid: npt.NDArray[np.uint8]
    """``uint8[n, 16]``: each end port's GID (subnet prefix + port GUID), big-endian."""
    ep_is_sw: npt.NDArray[np.bool_]
    ep_first: npt.NDArray[np.intp]
    """Switch row a packet from the end port enters first (its own for a switch), -1 if none."""
    ep_link_mtu: npt.NDArray[np.uint8]
    ep_link_rank: npt.NDArray[np.uint8]
    """A CA port's own link (both ends); a switch's port 0 values."""
    ep_peer_key: npt.NDArray[np.intp]
    ep_of_guid: dict[int, int]
    ep_of_lid: npt.NDArray[np.intp]
    p0_mtu: npt.NDArray[np.uint8]
    p0_rank: npt.NDArray[np.uint8]
    """Per node: switch port 0's MTU and rate rank (NO_HOP: no limit, and for CAs)."""
    gid_bytes: list[bytes]
    span: int
    prefix: int
    ep1: list[tuple[int, int, int, bool, int, int, int, int]]
    """Per end port, as Python ints for a Get's scalar work: (first switch row, link MTU, link rate
    rank, is a switch, peer's switch row (-1: a CA) or -2 (no peer), node, port, base LID)."""
    ep_of_lid1: list[int]
    entry1: list[int]
    """Per end port: :func:`entry_row` (-1 for None), the LFT row a route's layer is read at."""
    pk_class: list[int]
    """Per end port: its partition table's class (ports holding the same P_Key table share one); empty
    without a partition plan."""
    pk_port: list[tuple[int, int]]
    """Per class: one end port holding that table (what ``PartitionPlan.shared`` is asked about)."""
    pk_class_a: npt.NDArray[np.intp]
    """``pk_class`` as an array (a GetTable's per-pair work)."""
    plan: Any
    """The snapshot's partition plan (None: none)."""
    layers: npt.NDArray[np.uint8] | None
    """The snapshot's route layers (None: every route on SL 0)."""
    levels: Any
    """The snapshot's QoS plan when QoS is on (its ``level_sl``), else None (QoS gives no SL)."""
    pk_shared: dict[tuple[int, int, int, int | None], int | None] = field(default_factory=dict)
    """:func:`_pkey1` by (asker, source, destination) class and P_Key asked, filled as Gets come."""
    pk_pairs: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    """:func:`_shared2` by (source, destination) class, filled as GetTables come."""
    cols1: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    """:func:`_column` as lists (a Get reads one cell of each)."""
    walks: dict[int, int] = field(default_factory=dict)
    """Per LID without a column yet: the paths to it :func:`path_value1` walked one by one."""
    cols: dict[int, tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]] = field(default_factory=dict)
    rows: dict[int, tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]] = field(default_factory=dict)


def _base(snap: Any) -> _Base:
    f = snap.fabric
    lids = snap.lids
    P = int(f.port_exists.shape[1])
    sw = np.asarray(f.switches, np.intp)
    row_of = np.full(f.n_nodes, -1, np.intp)
    row_of[sw] = np.arange(sw.size)
    up2 = f.up_mask()
    up = up2.ravel()
    peer = np.where(up2, f.peer_node.astype(np.intp) * P + f.peer_port.astype(np.intp), 0).ravel()
    link_mtu = np.asarray(snap.links.mtu, np.uint8)
    mtu2 = np.where(link_mtu > 0, link_mtu, f.mtu_active).astype(np.uint8)
    w = f.width_active.astype(np.int64)
    s = f.speed_active.astype(np.int64)
    codes = np.zeros(w.shape, np.uint8)
    for wc in np.unique(w).tolist():
        for sc in np.unique(s[w == wc]).tolist():
            codes[(w == wc) & (s == sc)] = rate_code(int(wc), int(sc))
    rank2 = _RANK_OF_CODE[codes]
    mtu2 = np.where(up2, mtu2, 0).astype(np.uint8)
    rank2 = np.where(up2, rank2, 0).astype(np.uint8)
    # switch port 0: values of no link; as OpenSM's port 0 PortInfo where the model has it
    mtu = mtu2.ravel().copy()
    rank = rank2.ravel().copy()
    own_lids = lids.owner_node >= 0
    owner_key = np.where(own_lids, lids.owner_node.astype(np.intp) * P + lids.owner_port.astype(np.intp), -1)

    ep = np.argwhere(lids.base > 0).astype(np.intp)
    ep_node, ep_port = ep[:, 0], ep[:, 1]
    guid = f.port_guid[ep_node, ep_port].astype(np.uint64)
    order = np.argsort(guid.byteswap(), kind="stable")  # OpenSM's cl_qmap over network-order keys (x86)
    ep_node, ep_port, guid = ep_node[order], ep_port[order], guid[order]
    ep_key = ep_node * P + ep_port
    ep_base = lids.base[ep_node, ep_port].astype(np.int64)
    is_sw = f.node_type[ep_node] == NodeType.SWITCH
    prefix = int(getattr(snap, "subnet_prefix", DEFAULT_SUBNET_PREFIX))
    gid = np.zeros((ep_node.size, 16), np.uint8)
    gid[:, :8] = np.frombuffer(prefix.to_bytes(8, "big"), np.uint8)
    gid[:, 8:] = guid.astype(">u8").view(np.uint8).reshape(-1, 8)
    ep_peer = peer[ep_key]
    ep_up = up[ep_key]
    first = np.where(is_sw, row_of[ep_node], np.where(ep_up, row_of[ep_peer // P], -1))
    link_mtu_ep = np.where(ep_up, np.minimum(mtu[ep_key], mtu[ep_peer]), 0).astype(np.uint8)
    link_rank_ep = np.where(ep_up, np.minimum(rank[ep_key], rank[ep_peer]), 0).astype(np.uint8)
    # switch port 0 (OpenSM counts its PortInfo at a path's switch end): its MTUCap and the rate of
    # its width and speed where the model has them, else no limit of its own
    p0_mtu = np.full(f.n_nodes, NO_HOP, np.uint8)
    p0_rank = np.full(f.n_nodes, NO_HOP, np.uint8)
    for n in sw.tolist():
        m0 = int(f.mtu_cap[n, 0])
        r0 = int(_RANK_OF_CODE[rate_code(int(f.width_active[n, 0]), int(f.speed_active[n, 0]))])
        p0_mtu[n] = m0 if 0 < m0 <= 5 else NO_HOP
        p0_rank[n] = r0 or NO_HOP
    for i in np.flatnonzero(is_sw).tolist():  # a switch to itself: port 0, else its best link
        n = int(ep_node[i])
        ports = slice(n * P + 1, n * P + P)
        link_mtu_ep[i] = p0_mtu[n] if p0_mtu[n] != NO_HOP else int(mtu[ports].max(initial=0)) or 4
        link_rank_ep[i] = p0_rank[n] if p0_rank[n] != NO_HOP else int(rank[ports].max(initial=0)) or 1
    ep_of_lid = np.full(lids.max_lid + 1, -1, np.intp)
    for k in range(1 << lids.lmc):
        ep_of_lid[ep_base + k] = np.arange(ep_node.size)
    peer_row = np.where(ep_up, row_of[ep_peer // P], -2)
    # entry_row of every end port at once: a switch's own row, else the row of the switch its cable
    # leads to (up or not, as entry_row reads the model), -1 when that is no switch
    pn = f.peer_node[ep_node, ep_port].astype(np.intp)
    to_sw = (pn >= 0) & (f.node_type[np.maximum(pn, 0)] == NodeType.SWITCH)
    entry = np.where(is_sw, row_of[ep_node], np.where(to_sw, row_of[np.maximum(pn, 0)], -1))
    pk_class: list[int] = []
    pk_port: list[tuple[int, int]] = []
    plan = getattr(snap, "partitions", None)
    if plan is not None:
        seen: dict[tuple[int, ...], int] = {}
        for port in zip(ep_node.tolist(), ep_port.tolist(), strict=True):
            table = tuple(plan.tables.get(port, ()))
            c = seen.get(table)
            if c is None:
                c = seen[table] = len(pk_port)
                pk_port.append(port)
            pk_class.append(c)
    ep1 = list(
        zip(
            first.tolist(), link_mtu_ep.tolist(), link_rank_ep.tolist(), is_sw.tolist(), peer_row.tolist(),
            ep_node.tolist(), ep_port.tolist(), ep_base.tolist(), strict=True,
        )
    )  # fmt: skip
    return _Base(
        nports=P,
        sw=sw,
        row_of=row_of,
        lft=np.asarray(snap.lft),
        node_of_row=sw,
        up=up,
        peer=peer,
        mtu=mtu,
        rank=rank,
        owner_key=owner_key,
        owner_node=lids.owner_node.astype(np.intp),
        max_hops=int(sw.size) + 1,
        ep_node=ep_node,
        ep_port=ep_port,
        ep_key=ep_key,
        ep_base=ep_base,
        ep_guid=guid,
        ep_gid=gid,
        ep_is_sw=is_sw,
        ep_first=first,
        ep_link_mtu=link_mtu_ep,
        ep_link_rank=link_rank_ep,
        ep_peer_key=ep_peer,
        ep_of_guid={int(g): i for i, g in enumerate(guid.tolist())},
        ep_of_lid=ep_of_lid,
        p0_mtu=p0_mtu,
        p0_rank=p0_rank,
        gid_bytes=[bytes(g) for g in gid],
        span=1 << lids.lmc,
        prefix=prefix,
        ep1=ep1,
        ep_of_lid1=ep_of_lid.tolist(),
        entry1=entry.tolist(),
        pk_class=pk_class,
        pk_port=pk_port,
        pk_class_a=np.asarray(pk_class, np.intp),
        plan=plan,
        layers=getattr(snap, "layers", None),
        levels=qos if (qos := getattr(snap, "qos", None)) is not None and qos.enabled else None,
    )


def trace(
    b: _Base, rows: npt.NDArray[np.intp], lids: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """Smallest MTU and rate rank from switch ``rows[i]`` to ``lids[i]`` along the LFTs, elementwise.

    0: no route (a hole, a down port, a loop, the wrong end port); NO_HOP: the switch owns the LID.
    """
    n = rows.size
    out_m = np.zeros(n, np.uint8)
    out_r = np.zeros(n, np.uint8)
    idx = np.arange(n)
    cur = rows.astype(np.intp)
    lid = lids.astype(np.intp)
    m = np.full(n, NO_HOP, np.uint8)
    r = np.full(n, NO_HOP, np.uint8)
    P = b.nports
    for _ in range(b.max_hops):
        if not idx.size:
            break
        port = b.lft[cur, lid].astype(np.intp)
        node = b.sw[cur]
        here = (port == 0) & (b.owner_key[lid] == node * P)
        out_m[idx[here]] = np.minimum(m[here], b.p0_mtu[node[here]])
        out_r[idx[here]] = np.minimum(r[here], b.p0_rank[node[here]])
        key = node * P + port
        go = (port != 0) & (port < P) & b.up[np.where(port < P, key, 0)]
        idx, lid, key, m, r = idx[go], lid[go], key[go], m[go], r[go]
        pk = b.peer[key]
        m = np.minimum(m, np.minimum(b.mtu[key], b.mtu[pk]))
        r = np.minimum(r, np.minimum(b.rank[key], b.rank[pk]))
        nrow = b.row_of[pk // P]
        ca = nrow < 0
        got = ca & (b.owner_key[lid] == pk)
        out_m[idx[got]] = m[got]
        out_r[idx[got]] = r[got]
        on = ~ca
        idx, lid, cur, m, r = idx[on], lid[on], nrow[on], m[on], r[on]
    return out_m, out_r


def _table(
    b: _Base, rows: npt.NDArray[np.intp], lids: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """``trace`` through the per-snapshot caches: a column when one LID, a row when one switch."""
    if not rows.size:
        return np.zeros(0, np.uint8), np.zeros(0, np.uint8)
    if (lids == lids[0]).all():
        d = int(lids[0])
        col = _column(b, d)
        return col[0][rows], col[1][rows]
    if (rows == rows[0]).all():
        row = _row(b, int(rows[0]))
        return row[0][lids], row[1][lids]
    return trace(b, rows, lids)


def _row(b: _Base, row: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """(MTU code, rate rank) from switch ``row`` to every LID, traced once per snapshot."""
    got = b.rows.get(row)
    if got is None:
        alll = np.arange(b.owner_key.size, dtype=np.intp)
        got = b.rows[row] = trace(b, np.full(alll.size, row, np.intp), alll)
    return got


def _no_path(
    mtu: npt.NDArray[np.uint8], rank: npt.NDArray[np.uint8]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """Both values 0 where either is: no path (in place)."""
    ok = (mtu != 0) & (rank != 0)
    mtu *= ok
    rank *= ok
    return mtu, rank


def path_values(
    b: _Base, src: npt.NDArray[np.intp], dlid: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """(MTU code, rate rank) of the path from end port ``src[i]`` (index) to ``dlid[i]``; 0: none.

    One source to many LIDs (a GetTable's forward paths) and many sources to one LID (its reverse
    paths) read a cached row or column with a handful of array operations (:func:`_from_one`,
    :func:`_to_one`); the general case works per pair."""
    if src.size >= _ONE_MIN:
        if src[0] == src[-1] and (src == src[0]).all():
            return _from_one(b, int(src[0]), dlid)
        if dlid[0] == dlid[-1] and (dlid == dlid[0]).all():
            return _to_one(b, src, int(dlid[0]))
    return _path_values_pairs(b, src, dlid)


def _path_values_pairs(
    b: _Base, src: npt.NDArray[np.intp], dlid: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """:func:`path_values` pair by pair."""
    dst = b.ep_of_lid[dlid]
    first = b.ep_first[src]
    loop = dst == src
    via = (first >= 0) & ~loop
    # a CA cabled straight to the destination CA
    direct = via & ~b.ep_is_sw[src] & (b.row_of[b.ep_peer_key[src] // b.nports] < 0)
    direct_ok = direct & (b.owner_key[dlid] == b.ep_peer_key[src])
    sw_path = via & ~direct
    tm = np.zeros(src.size, np.uint8)
    tr = np.zeros(src.size, np.uint8)
    k = np.flatnonzero(sw_path)
    if k.size:
        tm[k], tr[k] = _table(b, first[k], dlid[k])
    lm, lr = b.ep_link_mtu[src], b.ep_link_rank[src]
    cm = np.minimum(lm, tm)  # a switch source: its port 0 (as OpenSM), NO_HOP above every value
    cr = np.minimum(lr, tr)
    mtu = np.where(loop | direct_ok, lm, np.where(sw_path, cm, 0)).astype(np.uint8)
    rank = np.where(loop | direct_ok, lr, np.where(sw_path, cr, 0)).astype(np.uint8)
    return _no_path(mtu, rank)


def _from_one(
    b: _Base, src: int, dlid: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """:func:`path_values` from the one end port ``src`` to each of ``dlid``: its first switch's row."""
    lm, lr = b.ep_link_mtu[src], b.ep_link_rank[src]
    loop = b.ep_of_lid[dlid] == src
    first = int(b.ep_first[src])
    if first < 0:  # no switch beyond its link (ep_first): only itself
        mtu = np.where(loop, lm, 0).astype(np.uint8)
        rank = np.where(loop, lr, 0).astype(np.uint8)
    else:
        m, r = _row(b, first)
        mtu = np.minimum(m[dlid], lm)  # a switch source: its port 0 (as OpenSM), NO_HOP above every value
        rank = np.minimum(r[dlid], lr)
        mtu[loop] = lm
        rank[loop] = lr
    return _no_path(mtu, rank)


def _to_one(b: _Base, src: npt.NDArray[np.intp], dlid: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """:func:`path_values` from each of end ports ``src`` to the one LID ``dlid``: its column."""
    loop = src == b.ep_of_lid[dlid]
    first = b.ep_first[src]
    sw_path = (first >= 0) & ~loop  # (ep_first is -1 for a port with no switch beyond its link)
    lm, lr = b.ep_link_mtu[src], b.ep_link_rank[src]
    m, r = _column(b, dlid)
    at = np.maximum(first, 0)
    mtu = np.minimum(m[at], lm)
    rank = np.minimum(r[at], lr)
    mtu *= sw_path
    rank *= sw_path
    np.copyto(mtu, lm, where=loop)
    np.copyto(rank, lr, where=loop)
    return _no_path(mtu, rank)


def _select(
    val: npt.NDArray[np.int64], ok: npt.NDArray[np.bool_], sel: int, req: int, lowest: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """OpenSM's selector rule on ordinal values: (adjusted values, still acceptable)."""
    if sel == 0:
        return val, ok & (val > req)
    if sel == 1:
        if req > lowest:
            return np.where(val >= req, req - 1, val), ok
        return val, ok & (val < req)
    if sel == 2:
        return np.where(val >= req, req, val), ok & (val >= req)
    return val, ok


def _select1(val: int, sel: int, req: int) -> int:
    """:func:`_select` for one value: the adjusted value, or -1 when it is not acceptable."""
    if sel == 0:
        return val if val > req else -1
    if sel == 1:
        if val < req:
            return val
        return req - 1 if req > 1 else -1
    if sel == 2:
        return req if val >= req else -1
    return val


def _column(b: _Base, lid: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    col = b.cols.get(lid)
    if col is None:
        allr = np.arange(b.sw.size, dtype=np.intp)
        col = b.cols[lid] = trace(b, allr, np.full(allr.size, lid, np.intp))
    return col


def _trace_all(b: _Base) -> None:
    """Every end port LID's column (:func:`_column`) at once, when the subnet is small enough: a Get then
    never traces (a column traced on a Get's first use of its LID costs as much as a thousand Gets)."""
    n_sw = int(b.sw.size)
    lids = np.flatnonzero(b.ep_of_lid >= 0).astype(np.intp)
    if not n_sw or n_sw * lids.size > _EAGER_CELLS:
        return
    m, r = trace(b, np.tile(np.arange(n_sw, dtype=np.intp), lids.size), np.repeat(lids, n_sw))
    m2, r2 = m.reshape(lids.size, n_sw), r.reshape(lids.size, n_sw)
    for lid, mc, rc, ml, rl in zip(lids.tolist(), m2, r2, m2.tolist(), r2.tolist(), strict=True):
        b.cols[lid] = (mc, rc)
        b.cols1[lid] = (ml, rl)


def _walk1(b: _Base, row: int, lid: int) -> tuple[int, int]:
    """:func:`trace` of the one switch ``row`` and ``lid``, hop by hop with scalars: a few us, where a
    column (every switch to ``lid``) costs hundreds on a big subnet."""
    P = b.nports
    lft, sw, owner, up, peer, mtu, rank = b.lft, b.sw, b.owner_key, b.up, b.peer, b.mtu, b.rank
    own = owner.item(lid)
    m = r = NO_HOP
    cur = row
    for _ in range(b.max_hops):
        port = lft.item(cur, lid)
        node = sw.item(cur)
        if port == 0 and own == node * P:
            return min(m, b.p0_mtu.item(node)), min(r, b.p0_rank.item(node))
        key = node * P + port
        if port == 0 or port >= P or not up.item(key):
            return 0, 0
        pk = peer.item(key)
        m = min(m, mtu.item(key), mtu.item(pk))
        r = min(r, rank.item(key), rank.item(pk))
        cur = b.row_of.item(pk // P)
        if cur < 0:  # a CA: the end, if it owns the LID
            return (m, r) if own == pk else (0, 0)
    return 0, 0


def path_value1(b: _Base, src: int, dlid: int) -> tuple[int, int]:
    """:func:`path_values` for one end port and LID, with Python scalars (a Get's cost)."""
    first, lm, lr, is_sw, peer_row, _, _, _ = b.ep1[src]
    if b.ep_of_lid1[dlid] == src:
        return lm, lr
    if first < 0:
        return 0, 0
    if not is_sw and peer_row < 0:  # a CA cabled to a CA
        return (lm, lr) if int(b.owner_key[dlid]) == int(b.ep_peer_key[src]) else (0, 0)
    col = b.cols1.get(dlid)
    if col is not None:
        m = col[0][first]
        r = col[1][first]
    else:  # a LID not asked for often yet: its one path walked, its column traced from the Nth time on
        seen = b.walks.get(dlid, 0) + 1
        if seen < _COLUMN_AFTER:
            if len(b.walks) >= _WALKS_MAX:
                b.walks.clear()
            b.walks[dlid] = seen
            m, r = _walk1(b, first, dlid)
        else:
            b.walks.pop(dlid, None)
            m_col, r_col = _column(b, dlid)
            col = b.cols1[dlid] = (m_col.tolist(), r_col.tolist())
            m = col[0][first]
            r = col[1][first]
    if lm < m:  # (no min(): a builtin that parses keywords on every call)
        m = lm
    if lr < r:
        r = lr
    return (m, r) if m and r else (0, 0)


_UNKNOWN = -1
"""A requester that is no end port of the snapshot."""

_GET1_LEAVES = _SERVICE_ID | _RAW | _SL | _MTU_SEL | _MTU | _RATE_SEL | _RATE | _PLT_SEL | _PLT
"""Components the fast path (:func:`_get1_of`) leaves to :meth:`~PathRecordFamily.query`; the others it
takes either name an end (GIDs, LIDs), are P_Key or Reversible, or are ones ``query`` ignores too."""
_ENDS = struct.Struct(">Q8xQQQQHH")
"""A request's component mask, then its DGID (prefix, GUID), SGID, DLID and SLID (MAD offset 48)."""
_RECORD = struct.Struct(">8x16s16sHH5xBHxBBBB7x")
"""One PathRecord as :meth:`PathRecordFamily._one` packs it: DGID, SGID, DLID, SLID, Reversible,
P_Key, SL, MTU, Rate and PacketLifeTime (each with selector 2), ServiceID and the rest 0."""
_CODE_OF_RANK1: list[int] = _CODE_OF_RANK.tolist()
_PK_SHARED_MAX = 1 << 16
"""Most entries :attr:`_Base.pk_shared` and :attr:`_Base.pk_pairs` keep."""


class _Req(NamedTuple):
    mask: int
    get: bool
    iterations: int
    slid: int | None
    dlid: int | None
    want_reversible: bool
    pkey: int | None
    sl: int | None
    mtu: tuple[int, int] | None
    rate: tuple[int, int] | None
    """(selector, rank)."""
    plt: tuple[int, int] | None
    raw: bool
    requester: int | None = None
    """The asking end port (index) where partitions restrict what it may see (``_UNKNOWN``: a LID that
    is no end port); None: no restriction."""


@functools.lru_cache(maxsize=64)
def _pairs(ns: int, nd: int) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.uint8]]:
    """LID offsets (source, destination) and Preference of a port pair's paths, in OpenSM's order
    (read-only arrays, made once per LID spans)."""
    first = min(ns, nd)
    si = list(range(first))
    di = list(range(first))
    pref = [0] * first
    for i in range(ns):
        for j in range(nd):
            if i != j:
                si.append(i)
                di.append(j)
                pref.append(2)
    out = np.array(si, np.intp), np.array(di, np.intp), np.array(pref, np.uint8)
    for a in out:
        a.flags.writeable = False
    return out


def _get1_of(b: _Base) -> GetOne:
    """For snapshot arrays ``b``: write the record a Get selects over its data, for the common requests.

    The Get is the MAD at ``at`` in ``buf`` (at least 120 bytes), from LID ``lid``. Both ends named (by
    GID, LID or both, one LID each), no selector, SL, ServiceID or RawTraffic, and a path found: the
    record :meth:`PathRecordFamily.query` answers (its ``_one``), computed with scalars and packed at
    ``at + 56``; True. Anything else (another request, no record, an error status) writes nothing and
    is False: ``query`` answers it. The snapshot's arrays are bound here once: this runs per request on
    the umad receive thread, where every call and attribute lookup counts (tests/test_sa_path.py pins
    that it answers as ``query`` does, byte for byte).
    """
    ep1, ep_of_lid1, gid_bytes, cols1 = b.ep1, b.ep_of_lid1, b.gid_bytes, b.cols1
    nlid, lids_only = len(b.ep_of_lid1), b.span != 1
    plan, pk_class, layers, levels, entry1 = b.plan, b.pk_class, b.layers, b.levels, b.entry1
    unpack, pack_into, code_of_rank = _ENDS.unpack_from, _RECORD.pack_into, _CODE_OF_RANK1
    # Per end port, the switch row whose column cell is its path value (path_value1's common case: a
    # port whose packets enter a switch); -1 where path_value1 has to decide.
    via = [first if first >= 0 and (is_sw or peer_row >= 0) else -1 for first, _, _, is_sw, peer_row, *_ in ep1]
    both_lids = _SLID | _DLID

    def get1(buf: memoryview, at: int, lid: int) -> bool:
        mask, dpre, dguid, spre, sguid, dlid, slid = unpack(buf, at + 48)
        if mask & _GET1_LEAVES:
            return False
        # _end1, its LID-only case inline (the calls count here)
        if mask & _SGID:
            src = _end1(b, 1, mask & _SLID, spre, sguid, slid)
        else:
            src = ep_of_lid1[slid] if mask & _SLID and 0 < slid < nlid else -1
        if mask & _DGID:
            dst = _end1(b, 1, mask & _DLID, dpre, dguid, dlid)
        else:
            dst = ep_of_lid1[dlid] if mask & _DLID and 0 < dlid < nlid else -1
        if src < 0 or dst < 0 or (lids_only and mask & both_lids != both_lids):
            return False
        s1 = ep1[src]
        d1 = ep1[dst]
        if not mask & _SLID:
            slid = s1[7]
        if not mask & _DLID:
            dlid = d1[7]
        # path_value1 both ways, its column case inline: a cell of each column, capped by the end's link
        row = via[src]
        col = cols1.get(dlid) if row >= 0 and src != dst else None
        if col is None:
            mtu, rank = path_value1(b, src, dlid)
        else:
            mtu = col[0][row]
            rank = col[1][row]
            if s1[1] < mtu:
                mtu = s1[1]
            if s1[2] < rank:
                rank = s1[2]
            if not rank:
                mtu = 0
        if not mtu:
            return False
        want = buf[at + 106] << 8 | buf[at + 107] if mask & _PKEY else None
        if plan is None:
            pkey = DEFAULT_PKEY if want is None else want if want & 0x7FFF == 0x7FFF else None
        else:  # as _one: the asker reaches both ends, then pair_pkey over the cached shared keys
            asker = ep_of_lid1[lid] if 0 < lid < nlid else -1
            if asker < 0:
                return False
            pkey = _pkey1(b, plan, pk_class[asker], pk_class[src], pk_class[dst], want)
        if pkey is None:
            return False
        row = via[dst]
        col = cols1.get(slid) if row >= 0 and src != dst else None
        rev = (
            path_value1(b, dst, slid)[0] > 0 if col is None else bool(col[0][row] and col[1][row] and d1[1] and d1[2])
        )
        if not rev and mask & _REVERSIBLE and buf[at + 105] & 0x80:
            return False
        sl = None  # path_sl: the route's layer, else the QoS level's SL, else DEFAULT_SL
        if layers is not None:
            row = entry1[src]
            if row >= 0 and 0 < dlid < layers.shape[1]:
                sl = int(layers[row, dlid])
        if sl is None:
            sl = (levels.level_sl((s1[5], s1[6]), (d1[5], d1[6]), pkey) if levels is not None else None) or DEFAULT_SL
        pack_into(
            buf, at + 56, gid_bytes[dst], gid_bytes[src], dlid, slid, 0x80 if rev else 0, pkey, sl & 0xF,
            0x80 | mtu, 0x80 | code_of_rank[rank], 0x80 | (0 if src == dst else SUBNET_TIMEOUT),
        )  # fmt: skip
        return True

    return get1


class PathRecordFamily:
    reads_only: ClassVar[bool] = True
    attr: ClassVar[int] = _A
    size: ClassVar[int] = 64
    methods: ClassVar[frozenset[int]] = frozenset({int(SaMethod.GET), int(SaMethod.GET_TABLE)})

    def base(self, ctx: SaContext) -> _Base:
        b = ctx.cache.get("pr:base")
        if b is None:
            b = _base(ctx.snapshot)
            _trace_all(b)
            ctx.cache["pr:base"] = b
        return b  # type: ignore[no-any-return]

    def warm(self, cache: dict[str, object]) -> bool:
        """Whether this snapshot's path arrays are built (a Get then traces at most one destination)."""
        return "pr:base" in cache

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        mask = req.mask
        d = req.mad.data[:64].ljust(64, b"\0")
        if mask & _SERVICE_ID and mask & _SERVICE_ID != _SERVICE_ID:
            raise SaError(SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS, "one half of ServiceID")
        mtu_b, rate_b, plt_b = d[54], d[55], d[56]
        rq_mtu = rq_rate = rq_plt = None
        if mask & _MTU_SEL and mask & _MTU:
            if not 1 <= mtu_b & 0x3F <= 5:
                raise SaError(SaStatus.ERR_REQ_INVALID, f"MTU code {mtu_b & 0x3F}")
            rq_mtu = (mtu_b >> 6, mtu_b & 0x3F)
        if mask & _RATE_SEL and mask & _RATE:
            rk = int(_RANK_OF_CODE[rate_b & 0x3F])
            if not rk:
                raise SaError(SaStatus.ERR_REQ_INVALID, f"rate code {rate_b & 0x3F}")
            rq_rate = (rate_b >> 6, rk)
        if mask & _PLT_SEL and mask & _PLT:
            rq_plt = (plt_b >> 6, plt_b & 0x3F)
        b = self.base(ctx)
        src = self._end(b, mask, d, _SGID, _SLID, 24, 42)
        dst = self._end(b, mask, d, _DGID, _DLID, 8, 40)
        if src == -1 or dst == -1:
            return np.zeros((0, 64), np.uint8)
        get = req.mad.method == SaMethod.GET
        r = _Req(
            mask=mask,
            get=get,
            iterations=1 if get else (d[49] & 0x7F if mask & _NUMBPATH else 1 << 30),
            slid=int.from_bytes(d[42:44], "big") if mask & _SLID else None,
            dlid=int.from_bytes(d[40:42], "big") if mask & _DLID else None,
            want_reversible=bool(mask & _REVERSIBLE and d[49] & 0x80),
            pkey=int.from_bytes(d[50:52], "big") if mask & _PKEY else None,
            sl=int.from_bytes(d[52:54], "big") & 0xF if mask & _SL else None,
            mtu=rq_mtu,
            rate=rq_rate,
            plt=rq_plt,
            raw=bool(mask & _RAW and d[44] & 0x80),
            requester=self._requester(ctx, b, req.src.lid),
        )
        if r.requester == _UNKNOWN:  # partitions, and an asker that is no port of ours: it sees nothing
            return np.zeros((0, 64), np.uint8)
        if r.iterations == 0:
            return np.zeros((0, 64), np.uint8)
        n = b.ep_node.size
        if src is not None and dst is not None:
            if b.span == 1 or (r.slid is not None and r.dlid is not None):
                return self._one(ctx, b, r, src, dst)
            return self._build(ctx, b, r, np.array([src], np.intp), np.array([dst], np.intp))
        everyone = np.arange(n, dtype=np.intp)
        if src is not None:
            return self._build(ctx, b, r, np.full(n, src, np.intp), everyone)
        if dst is not None:
            return self._build(ctx, b, r, everyone, np.full(n, dst, np.intp))
        out: list[Rows] = []
        total = 0
        for j in range(n):  # every pair: destinations outer, as OpenSM
            rows = self._build(ctx, b, r, everyone, np.full(n, j, np.intp))
            if rows.shape[0]:
                if get:
                    return rows[:1]
                out.append(rows)
                total += rows.shape[0]
                if total > MAX_TABLE_RECORDS:
                    raise SaError(SaStatus.ERR_NO_RESOURCES, "every path of the subnet: too many records")
        return np.concatenate(out) if out else np.zeros((0, 64), np.uint8)

    def quick(self, cache: dict[str, Any]) -> GetOne | None:
        """The SA's fast path (:meth:`SaServer.take_inline`) for this snapshot: :func:`_get1_of` its
        arrays, made once; None while they are not built."""
        got = cache.get("pr:get1")
        if got is None:
            b: _Base | None = cache.get("pr:base")
            if b is None:
                return None
            got = cache["pr:get1"] = _get1_of(b)
        return got  # type: ignore[no-any-return]

    @staticmethod
    def _requester(ctx: SaContext, b: _Base, lid: int) -> int | None:
        """The end port that asked (by its LID), when a partition plan restricts answers; None without a
        plan; ``_UNKNOWN`` when the LID is no end port of the snapshot."""
        if getattr(ctx.snapshot, "partitions", None) is None:
            return None
        return b.ep_of_lid1[lid] if 0 < lid < len(b.ep_of_lid1) else _UNKNOWN

    @staticmethod
    def _talkers(ctx: SaContext, b: _Base, requester: int) -> npt.NDArray[np.bool_]:
        """Per end port (``_Base`` order): whether end port ``requester`` shares a P_Key with it (read-only,
        kept per requester for the snapshot)."""
        seen: dict[int, npt.NDArray[np.bool_]] = ctx.cache.setdefault("pr:talkers", {})
        got = seen.get(requester)
        if got is not None:
            return got
        plan = ctx.snapshot.partitions
        rows = ctx.cache.get("pr:planrow")
        if rows is None:
            at = {(n, p): i for i, (n, p) in enumerate(plan.endports.tolist())}
            rows = ctx.cache["pr:planrow"] = np.array(
                [at.get((n, p), -1) for n, p in zip(b.ep_node.tolist(), b.ep_port.tolist(), strict=True)], np.intp
            )
        e = b.ep1[requester]
        talks = plan.talks_with((e[5], e[6]))
        out = np.zeros(rows.size, bool)
        if talks is not None:
            known = rows >= 0
            out[known] = talks[rows[known]]
        out.flags.writeable = False
        if len(seen) >= _TALKERS_MAX:
            seen.clear()
        seen[requester] = out
        return out

    @staticmethod
    def _end(b: _Base, mask: int, d: bytes, gid_bit: int, lid_bit: int, gid_at: int, lid_at: int) -> int | None:
        """The end port (index) a side names; None if unnamed; -1 if it names nothing we know."""
        by_gid = by_lid = None
        if mask & gid_bit:
            prefix = int.from_bytes(d[gid_at : gid_at + 8], "big")
            if d[gid_at] == 0xFF:  # multicast: no groups yet
                return -1
            if prefix >> 54 != 0xFE80 >> 6 and prefix != b.prefix:
                return -1
            by_gid = b.ep_of_guid.get(int.from_bytes(d[gid_at + 8 : gid_at + 16], "big"), -1)
            if by_gid < 0:
                return -1
        if mask & lid_bit:
            lid = int.from_bytes(d[lid_at : lid_at + 2], "big")
            by_lid = int(b.ep_of_lid[lid]) if 0 < lid < b.ep_of_lid.size else -1
            if by_lid < 0:
                return -1
        if by_gid is not None and by_lid is not None and by_gid != by_lid:
            raise SaError(SaStatus.ERR_REQ_INVALID, "GID and LID name different ports")
        return by_gid if by_gid is not None else by_lid

    def _one(self, ctx: SaContext, b: _Base, r: _Req, src: int, dst: int) -> Rows:
        """The one path of a port pair with one LID each (what most Gets ask), with scalars."""
        s1, d1 = b.ep1[src], b.ep1[dst]
        slid = r.slid if r.slid is not None else s1[7]
        dlid = r.dlid if r.dlid is not None else d1[7]
        none = np.zeros((0, 64), np.uint8)
        mtu, rank = path_value1(b, src, dlid)
        if not mtu:
            return none
        plt = 0 if src == dst else SUBNET_TIMEOUT
        if r.mtu is not None and (mtu := _select1(mtu, *r.mtu)) < 0:
            return none
        if r.rate is not None and (rank := _select1(rank, *r.rate)) < 0:
            return none
        if r.plt is not None and (plt := _select1(plt, *r.plt)) < 0:
            return none
        sp = (s1[5], s1[6])
        dp = (d1[5], d1[6])
        if r.requester is not None and pair_pkey is _DEFAULT_HOOKS[0]:  # as the fast path: cached by tables
            pc = b.pk_class
            pkey = _pkey1(b, b.plan, pc[r.requester], pc[src], pc[dst], r.pkey)
        else:
            if r.requester is not None:  # OpenSM answers only what the asker may reach: both ends
                talks = self._talkers(ctx, b, r.requester)
                if not (talks[src] and talks[dst]):
                    return none
            pkey = pair_pkey(ctx, sp, dp, r.pkey)
        if pkey is None:
            return none
        rev = path_value1(b, dst, slid)[0] > 0
        if r.want_reversible and not rev:
            return none
        if r.raw:
            pkey = 0
        sl = pair_sl(ctx, sp, dp, pkey, dlid)
        if r.sl is not None:
            if r.sl != sl and _required(ctx.snapshot, sp, dp, pkey, dlid):
                return none  # the route is deadlock-free, or the QoS level set, on its SL only
            sl = r.sl
        rec = (
            bytes(8)
            + b.gid_bytes[dst]
            + b.gid_bytes[src]
            + bytes((dlid >> 8, dlid & 0xFF, slid >> 8, slid & 0xFF, 0, 0, 0, 0, 0, 0x80 if rev else 0))
            + bytes((pkey >> 8, pkey & 0xFF, 0, sl & 0xF, 0x80 | mtu, 0x80 | int(_CODE_OF_RANK[rank]), 0x80 | plt))
            + bytes(7)
        )
        return np.frombuffer(rec, np.uint8).reshape(1, 64)

    def _build(self, ctx: SaContext, b: _Base, r: _Req, src: npt.NDArray[np.intp], dst: npt.NDArray[np.intp]) -> Rows:
        """The records of the port pairs (src[k], dst[k]), in order (a Get: the first one)."""
        ns = 1 if r.slid is not None else b.span
        nd = 1 if r.dlid is not None else b.span
        si, di, pref = _pairs(ns, nd)
        K, Q = src.size, si.size
        if Q == 1:  # one path per port pair (LMC 0, or both LIDs given): offsets 0, Preference 0
            s_e, d_e = src, dst
            slid = np.full(K, r.slid, np.int64) if r.slid is not None else b.ep_base[s_e]
            dlid = np.full(K, r.dlid, np.int64) if r.dlid is not None else b.ep_base[d_e]
            prefs = np.zeros(K, np.uint8)
        else:
            s_e = np.repeat(src, Q)
            d_e = np.repeat(dst, Q)
            slid = np.full(K * Q, r.slid, np.int64) if r.slid is not None else b.ep_base[s_e] + np.tile(si, K)
            dlid = np.full(K * Q, r.dlid, np.int64) if r.dlid is not None else b.ep_base[d_e] + np.tile(di, K)
            prefs = np.tile(pref, K)
        mtu, rank = path_values(b, s_e, dlid.astype(np.intp))
        ok = mtu > 0
        if r.requester is not None:  # OpenSM answers only what the asker may reach: both ends
            talks = self._talkers(ctx, b, r.requester)
            ok &= talks[s_e] & talks[d_e]
        # pkey / SL hooks, per port pair
        pkeys = np.full(K * Q, DEFAULT_PKEY, np.int64)
        sls = np.zeros(K * Q, np.int64)
        plan = getattr(ctx.snapshot, "partitions", None)
        hooks = pair_pkey is _DEFAULT_HOOKS[0] and pair_sl is _DEFAULT_HOOKS[1] and not _qos_in_play(ctx.snapshot)
        uniform = hooks and plan is None
        by_class = hooks and plan is not None
        if by_class:  # partitions only: a pair's P_Key is its two tables' (by class), its SL 0 or the one asked
            cls = b.pk_class_a
            npk = len(b.pk_port)
            pair = cls[src] * npk + cls[dst]
            if npk * npk <= _PAIR_LUT_MAX:  # the class pairs present, without a sort
                seen_pair = np.zeros(npk * npk, bool)
                seen_pair[pair] = True
                have = np.flatnonzero(seen_pair)
                lut = np.empty(npk * npk, np.intp)
                lut[have] = np.arange(have.size)
                at_k = lut[pair]
            else:
                have, at_k = np.unique(pair, return_inverse=True)
            pk_of = np.array(
                [-1 if (x := _pick_pkey(_shared2(b, plan, c // len(b.pk_port), c % len(b.pk_port)), r.pkey)) is None
                 else x for c in have.tolist()], np.int64,
            )  # fmt: skip
            pk_e = np.repeat(pk_of[at_k], Q)
            ok &= pk_e >= 0
            pkeys = np.where(pk_e >= 0, pk_e, DEFAULT_PKEY)
            if r.sl is not None:
                sls[:] = r.sl
        for k in range(0 if by_class else 1 if uniform else K):  # the default hooks answer the same for every pair
            sp = (int(b.ep_node[src[k]]), int(b.ep_port[src[k]]))
            dp = (int(b.ep_node[dst[k]]), int(b.ep_port[dst[k]]))
            at = slice(None) if uniform else slice(k * Q, (k + 1) * Q)
            pk = pair_pkey(ctx, sp, dp, r.pkey)
            if pk is None:
                ok[at] = False
                continue
            pkeys[at] = pk
            sls[at] = pair_sl(ctx, sp, dp, pk)
            lvl = level_sl(ctx.snapshot, sp, dp, pk)
            if r.sl is not None and lvl is not None and r.sl != lvl and not _has_layers(ctx.snapshot):
                ok[at] = False  # OpenSM: an SL asked for that is not the QoS level's gets no path
            elif r.sl is not None and not _has_layers(ctx.snapshot):
                sls[at] = r.sl
        layers = getattr(ctx.snapshot, "layers", None)
        if layers is not None:  # the route's layer per path (its DLID): SL k on VL k
            row_e = np.repeat(np.asarray(b.entry1, np.int64)[src], Q)  # entry_row of each source
            inside = (row_e >= 0) & (dlid > 0) & (dlid < layers.shape[1])
            sls = np.where(inside, layers[np.maximum(row_e, 0), np.where(inside, dlid, 0)], sls).astype(np.int64)
            if r.sl is not None:
                ok &= ~inside | (sls == r.sl)  # a route is deadlock-free on its layer's SL only
        if r.raw:
            pkeys[:] = 0
        mtu_v = mtu.astype(np.int64)
        rank_v = rank.astype(np.int64)
        loop = s_e == d_e
        plt_v = np.where(loop, 0, SUBNET_TIMEOUT).astype(np.int64)
        if r.mtu is not None:
            mtu_v, ok = _select(mtu_v, ok, r.mtu[0], r.mtu[1], 1)
        if r.rate is not None:
            rank_v, ok = _select(rank_v, ok, r.rate[0], r.rate[1], 1)
        if r.plt is not None:
            plt_v, ok = _select(plt_v, ok, r.plt[0], r.plt[1], 1)
        # reversible: the route back from the destination port to the source LID
        rm, _ = path_values(b, b.ep_of_lid[dlid], slid.astype(np.intp))
        rev = rm > 0
        if r.want_reversible:
            ok &= rev
        # the first `iterations` acceptable paths of each port pair
        okm = ok.reshape(K, Q)
        if r.iterations < Q:
            okm &= np.cumsum(okm, axis=1) <= r.iterations
        keep = np.flatnonzero(okm.ravel())
        if r.get:
            keep = keep[:1]
        k = keep.size
        rec = np.zeros(k, _RECORD_DTYPE)
        if not k:
            return rec.view(np.uint8).reshape(0, 64)
        rec["dgid"] = b.ep_gid[d_e[keep]]
        rec["sgid"] = b.ep_gid[s_e[keep]]
        rec["dlid"] = dlid[keep]
        rec["slid"] = slid[keep]
        rec["reversible"] = rev[keep] * 0x80
        rec["pkey"] = pkeys[keep]
        rec["sl"] = sls[keep] & 0xF
        rec["mtu"] = mtu_v[keep] | 0x80
        rec["rate"] = _CODE_OF_RANK[rank_v[keep]] | 0x80
        rec["plt"] = plt_v[keep] | 0x80
        rec["preference"] = prefs[keep]
        return rec.view(np.uint8).reshape(k, 64)


def _end1(b: _Base, by_gid: int, by_lid: int, prefix: int, guid: int, lid: int) -> int:
    """:meth:`PathRecordFamily._end` for the fast path (:func:`_get1_of`): the end port a side names
    (``by_gid``, ``by_lid``: whether its GID, its LID are in the mask), -1 for anything else (unnamed,
    unknown, a GID and a LID of two ports)."""
    ep = -1
    if by_gid:
        if prefix >> 56 == 0xFF or (prefix >> 54 != 0xFE80 >> 6 and prefix != b.prefix):
            return -1
        ep = b.ep_of_guid.get(guid, -1)
        if ep < 0:
            return -1
    if by_lid:
        at = b.ep_of_lid1[lid] if 0 < lid < len(b.ep_of_lid1) else -1
        return at if by_gid == 0 or at == ep else -1
    return ep


def _pkey1(b: _Base, plan: Any, asker: int, src: int, dst: int, want: int | None) -> int | None:
    """What :meth:`PathRecordFamily._one` makes of ``plan.shared`` for a path, for end ports of partition
    table classes ``asker``, ``src`` and ``dst`` and the P_Key asked for (``want``): :func:`pair_pkey`
    when the asker reaches both ends, else None; cached by classes (``shared`` reads only the two
    tables)."""
    key = (asker, src, dst, want)
    got = b.pk_shared.get(key, -1)
    if got == -1:
        reach = _shared2(b, plan, asker, src) and _shared2(b, plan, asker, dst)
        got = _pick_pkey(_shared2(b, plan, src, dst), want) if reach else None
        if len(b.pk_shared) < _PK_SHARED_MAX:
            b.pk_shared[key] = got
    return got


def _shared2(b: _Base, plan: Any, src: int, dst: int) -> tuple[int, ...]:
    """``plan.shared`` between end ports of partition table classes ``src`` and ``dst``, cached."""
    got = b.pk_pairs.get((src, dst))
    if got is None:
        got = tuple(plan.shared(b.pk_port[src], b.pk_port[dst]))
        if len(b.pk_pairs) < _PK_SHARED_MAX:
            b.pk_pairs[(src, dst)] = got
    return got


def _has_layers(snap: Any) -> bool:
    return getattr(snap, "layers", None) is not None


def _qos_in_play(snap: Any) -> bool:
    qos = getattr(snap, "qos", None)
    return _has_layers(snap) or (qos is not None and qos.enabled)


def _required(snap: Any, src: tuple[int, int], dst: tuple[int, int], pkey: int, dlid: int) -> bool:
    """Whether a path's SL is fixed (a route layer or a QoS level's SL), so that another SL asked gets no path."""
    qos = getattr(snap, "qos", None)
    if _layer_sl(snap, src, dst, dlid) is not None:
        return True
    return qos is not None and qos.level_sl(src, dst, pkey) is not None


_DEFAULT_HOOKS = (pair_pkey, pair_sl)


__all__ = ["PathRecordFamily", "entry_row", "level_sl", "pair_pkey", "pair_sl", "path_sl", "path_values", "rate_code",
           "trace"]
