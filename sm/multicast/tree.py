"""One multicast group's spanning tree, as OpenSM 3.3's ``osm_mcast_mgr.c`` builds it, and a flood checker.

Members are end ports: a CA port ``(node, port)``, or a switch's port 0 ``(switch, 0)``. A member
hangs off a switch: a CA port off the switch at the other end of its (LinkUp) cable, port 0 off
its own switch. A member hanging off no switch cannot be reached and is listed as unreachable.

Root (OpenSM's ``mcast_mgr_find_optimal_switch`` with ``mcast_mgr_compute_max_hops``)
    For every switch ``c``: ``hops(c)`` is the largest, over the switches ``s`` the members hang
    off, of the least hop count from ``c`` to ``s``, plus 1 unless ``s`` is itself a member
    (OpenSM keeps one ``is_mc_member`` flag per switch, so port 0 joining drops the +1 for the
    CAs on that switch too). Unreachable counts 255. The root has the smallest ``hops(c)``. On a
    tie the first switch in OpenSM's switch table wins (it keeps a strictly smaller value only):
    ``sw_guid_tbl`` is a ``cl_qmap`` keyed by the node GUID in network byte order and compared as
    a host ``uint64``, so on the little-endian hosts OpenSM runs on, switches come in ascending
    order of the byte-swapped node GUID. A group of fewer than two members gets no tree ("has 1
    members - nothing to do").

Branches
    ``branches="lft"`` (the default): from the root, each member's unicast route, the LFT toward
    its base LID, switch by switch to the egress that reaches it (the CA's port, or port 0 of a
    member switch). Routes toward different LIDs can reach a switch from two parents
    (reconvergence: ftree or updn spread LIDs over the up ports of a switch). So members are
    taken in ascending LID order, each route is walked from the root to its end, and only what
    follows the last switch already on the tree is added, hung below that switch. An LFT is
    destination-based, so the route from that switch on is the same however a packet got there:
    every switch keeps one parent, every edge is a unicast hop toward some member, and the
    result is a tree.

    ``branches="hops"``: OpenSM 3.3's own rule, ``osm_switch_recommend_mcast_path`` with
    ``ignore_existing``: at every switch, toward the switch the member hangs off, the
    lowest-numbered port whose neighbour is one hop nearer (the hop table, not the LFT; no
    balancing, "to prevent more than one multicast path to the same remote switch"). Paths are
    shortest paths picked by a rule of (switch, target) only, so two of them never meet again
    after they split (where they split, both ports were least-hop for both targets, and the
    lowest one is the same for both): the walk above never has to graft.

    A route that ends nowhere (no LFT entry, a port with no switch behind it, a loop, 63
    switches deep, which OpenSM refuses as ``ERR 0A21``) leaves its member unreachable; the
    other members still get their tree.

The tree of a switch is its port mask: the ports to its child switches, to its member CAs, port 0
if it is a member, and the port toward its parent. IBA multicast forwarding sends a packet out of
every port of the mask but the one it came in by, so with the parent port in the mask a member
below reaches the members above. OpenSM adds it the same way ("Adding upstream port").

The checker (:func:`flood`, :func:`verify_tree`) reads per-switch masks only, so it serves masks
read back from switches (``ibroute -M``) as well as a :class:`McastTree`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import Fabric, NodeType
from sm.lidmap import LidMap
from sm.routing._hops import UNREACHABLE, hop_matrix, switch_graph
from sm.routing.base import NO_ROUTE, Lft

IntArray = npt.NDArray[np.int64]

MAX_TREE_SWITCHES = 63
"""Switches on one root-to-member path at most: OpenSM stops at depth 64 (ERR 0A21)."""

Branches = Literal["lft", "hops"]
EndPort = tuple[int, int]


class McastError(IbfmError):
    """A member that is not an end port, or a hop table that belongs to another topology."""


class TreeFault(McastError):
    """Per-switch masks that do not deliver a group's packets exactly once to each member."""


# -- the hop table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HopTable:
    """Least hop counts between switches over up switch-to-switch links, built once per topology.

    Row ``i`` is switch node ``nodes[i]`` (= ``fabric.switches``, the LFT's rows); ``row_of[node]``
    the reverse (-1 for a CA). ``nbr[row, port]``: row of the switch cabled (LinkUp) to that port,
    -1 for none. ``dist[a, b]``: hops from row ``a`` to row ``b`` (255: unreachable). ``order``:
    the rows in OpenSM's switch-table order (ascending byte-swapped node GUID), the root tie-break.
    Rebuild it after a link or switch changes.
    """

    nodes: npt.NDArray[np.intp]
    row_of: IntArray
    nbr: IntArray
    dist: npt.NDArray[np.uint8]
    order: IntArray

    @property
    def n(self) -> int:
        return int(self.nodes.size)


def hop_table(fabric: Fabric) -> HopTable:
    """The :class:`HopTable` of ``fabric`` (one BFS from every switch at once)."""
    g = switch_graph(fabric)
    # OpenSM's sw_guid_tbl key: the big-endian GUID read as a little-endian uint64.
    order = np.argsort(g.guid.byteswap(), kind="stable").astype(np.int64)
    return HopTable(g.nodes, g.row_of, g.nbr, hop_matrix(g.nbr), order)


# -- the tree ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class McastTree:
    """One group's spanning tree.

    ``root``: node of the root switch (None when the group has no tree). ``masks[switch node]``:
    bit ``p`` set when port ``p`` is in the switch's port mask; a switch absent has an empty
    mask. ``parent[switch node]``: the switch above it (the root has none). ``members``: the
    group's end ports; ``unreachable``: those the tree does not reach.
    """

    root: int | None
    masks: dict[int, int]
    parent: dict[int, int]
    members: tuple[EndPort, ...]
    unreachable: tuple[EndPort, ...] = ()


def mask_ports(mask: int) -> list[int]:
    """The port numbers of a port mask, ascending."""
    out: list[int] = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _members(fabric: Fabric, members: Sequence[EndPort]) -> IntArray:
    """The distinct members as a ``(k, 2)`` array, checked to be end ports."""
    arr = np.asarray(members, np.int64).reshape(-1, 2)
    if arr.size == 0:
        return arr
    arr = np.unique(arr, axis=0)
    nodes, ports = arr[:, 0], arr[:, 1]
    inside = (nodes >= 0) & (nodes < fabric.n_nodes) & (ports >= 0) & (ports <= fabric.max_port)
    ok = inside.copy()
    n_in, p_in = nodes[inside], ports[inside]
    is_sw = fabric.node_type[n_in] == NodeType.SWITCH
    ok[inside] = np.where(is_sw, p_in == 0, (p_in >= 1) & fabric.port_exists[n_in, p_in])
    if not ok.all():
        n, p = arr[np.flatnonzero(~ok)[0]].tolist()
        where = fabric.port_name(n, p) if 0 <= n < fabric.n_nodes else f"node {n} port {p}"
        raise McastError(f"multicast member {where} is not an end port (a CA port or a switch's port 0)")
    return arr


def _attach(fabric: Fabric, hops: HopTable, members: IntArray) -> tuple[IntArray, IntArray]:
    """Per member: the row of the switch it hangs off and that switch's port to it (-1, -1: none)."""
    if hops.n != fabric.switches.size or hops.row_of.size != fabric.n_nodes:
        raise McastError("the hop table was built for another topology")
    nodes, ports = members[:, 0], members[:, 1]
    is_sw = fabric.node_type[nodes] == NodeType.SWITCH
    up = fabric.up_mask()[nodes, ports]
    peer = fabric.peer_node[nodes, ports].astype(np.int64)
    peer_row = hops.row_of[np.where(up & (peer >= 0), peer, 0)]
    on_sw = ~is_sw & up & (peer >= 0) & (peer_row >= 0)
    row = np.where(is_sw, hops.row_of[nodes], np.where(on_sw, peer_row, -1))
    port = np.where(is_sw, 0, np.where(on_sw, fabric.peer_port[nodes, ports].astype(np.int64), -1))
    return row, port


def _root_row(hops: HopTable, rows: IntArray, ports: IntArray) -> int:
    """OpenSM's optimal switch for members hanging off ``rows`` (by switch port ``ports``; 0 = itself)."""
    on = rows >= 0
    sw_rows = np.unique(rows[on])
    if sw_rows.size:
        self_member = np.zeros(hops.n, np.bool_)
        self_member[rows[on & (ports == 0)]] = True
        extra = np.where(self_member[sw_rows], 0, 1).astype(np.int32)
        worst = (hops.dist[:, sw_rows].astype(np.int32) + extra[None, :]).max(axis=1)
    else:
        worst = np.zeros(hops.n, np.int32)
    return int(hops.order[int(np.argmin(worst[hops.order]))])


def root_switch(fabric: Fabric, members: Sequence[EndPort], hops: HopTable | None = None) -> int | None:
    """The node OpenSM would take as the root of a group of ``members`` (None for no switches)."""
    hops = hop_table(fabric) if hops is None else hops
    arr = _members(fabric, members)
    if hops.n == 0:
        return None
    rows, ports = _attach(fabric, hops, arr)
    return int(hops.nodes[_root_row(hops, rows, ports)])


def _least_hop_port(hops: HopTable, rows: IntArray, targets: IntArray) -> IntArray:
    """Per (row, target row): the lowest port whose neighbour is one hop nearer; NO_ROUTE if none."""
    nb = hops.nbr[rows]
    here = hops.dist[rows, targets].astype(np.int16)
    there = np.where(nb >= 0, hops.dist[np.where(nb >= 0, nb, 0), targets[:, None]], UNREACHABLE)
    ok = (nb >= 0) & (there.astype(np.int16) == here[:, None] - 1) & (here[:, None] < UNREACHABLE)
    return np.where(ok.any(axis=1), ok.argmax(axis=1), NO_ROUTE).astype(np.int64)


@dataclass(frozen=True)
class _Paths:
    ok: npt.NDArray[np.bool_]
    length: IntArray  # switches on the path, root included
    rows: IntArray  # [member, k]: k-th switch row of the path
    egress: IntArray  # [member, k]: port leaving switch k toward switch k + 1
    ingress: IntArray  # [member, k]: port of switch k the packet came in by (k >= 1)


def _walk(
    fabric: Fabric,
    hops: HopTable,
    root_row: int,
    end_row: IntArray,
    end_port: IntArray,
    step: Branches,
    lft: Lft,
    lid: IntArray,
) -> _Paths:
    """Every member's switch path from the root at once, by the LFT or by the least-hop rule."""
    m = end_row.size
    depth = MAX_TREE_SWITCHES
    rows = np.full((m, depth), -1, np.int64)
    egress = np.full((m, depth), -1, np.int64)
    ingress = np.full((m, depth), -1, np.int64)
    rows[:, 0] = root_row
    ok = np.zeros(m, np.bool_)
    length = np.zeros(m, np.int64)
    cur = np.full(m, root_row, np.int64)
    active = np.flatnonzero(end_row >= 0)
    if step == "lft":
        active = active[(lid[active] > 0) & (lid[active] < lft.shape[1])]
    nodes = hops.nodes.astype(np.int64)
    for k in range(depth):
        if active.size == 0:
            break
        r = cur[active]
        at_end = r == end_row[active]
        if step == "lft":
            port = lft[r, lid[active]].astype(np.int64)
        else:
            port = np.where(at_end, end_port[active], _least_hop_port(hops, r, end_row[active]))
        done = at_end & (port == end_port[active])
        ok[active[done]] = True
        length[active[done]] = k + 1
        go = ~at_end & (port >= 1) & (port <= fabric.max_port)
        nxt = np.full(active.size, -1, np.int64)
        nxt[go] = hops.nbr[r[go], port[go]]
        go &= nxt >= 0
        if k + 1 == depth:
            break
        mv = active[go]
        egress[mv, k] = port[go]
        ingress[mv, k + 1] = fabric.peer_port[nodes[r[go]], port[go]]
        rows[mv, k + 1] = nxt[go]
        cur[mv] = nxt[go]
        active = mv
    return _Paths(ok, length, rows, egress, ingress)


def build_tree(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    members: Sequence[EndPort],
    *,
    hops: HopTable | None = None,
    branches: Branches = "lft",
) -> McastTree:
    """The spanning tree of one group (see the module text for the root and the branches).

    ``hops`` is the topology's :class:`HopTable` (built here when not given; build it once and
    pass it for many groups). ``lft`` and ``lids`` are the unicast routing the branches follow
    with ``branches="lft"``; ``branches="hops"`` uses only the hop table, as OpenSM 3.3 does.
    """
    if branches not in ("lft", "hops"):
        raise ValueError(f"branches must be 'lft' or 'hops', not {branches!r}")
    arr = _members(fabric, members)
    listed = tuple((int(n), int(p)) for n, p in arr.tolist())
    if arr.shape[0] < 2 or fabric.switches.size == 0:
        return McastTree(None, {}, {}, listed, () if arr.shape[0] < 2 else listed)
    hops = hop_table(fabric) if hops is None else hops
    end_row, end_port = _attach(fabric, hops, arr)
    root_row = _root_row(hops, end_row, end_port)
    lid = lids.base[arr[:, 0], arr[:, 1]].astype(np.int64)
    if branches == "lft" and lft.shape[0] != hops.n:
        raise McastError(f"the LFT has {lft.shape[0]} rows for {hops.n} switches")
    paths = _walk(fabric, hops, root_row, end_row, end_port, branches, lft, lid)
    order = np.lexsort((arr[:, 1], arr[:, 0], lid)).tolist()
    width = int(paths.length.max(initial=1))
    rows_l = paths.rows[:, :width].tolist()
    egress_l = paths.egress[:, :width].tolist()
    ingress_l = paths.ingress[:, :width].tolist()
    length_l = paths.length.tolist()
    ok_l = paths.ok.tolist()
    end_port_l = end_port.tolist()
    mask: dict[int, int] = {}
    parent: dict[int, int] = {root_row: -1}
    unreachable: list[EndPort] = []
    for i in order:
        if not ok_l[i]:
            unreachable.append(listed[i])
            continue
        n = length_l[i]
        path = rows_l[i]
        j = n - 1
        while path[j] not in parent:  # the last switch of the route already on the tree
            j -= 1
        for k in range(j + 1, n):
            a, b = path[k - 1], path[k]
            mask[a] = mask.get(a, 0) | (1 << egress_l[i][k - 1])
            mask[b] = mask.get(b, 0) | (1 << ingress_l[i][k])
            parent[b] = a
        last = path[n - 1]
        mask[last] = mask.get(last, 0) | (1 << end_port_l[i])
    nodes = hops.nodes.tolist()
    return McastTree(
        root=nodes[root_row],
        masks={nodes[r]: v for r, v in mask.items()},
        parent={nodes[r]: nodes[p] for r, p in parent.items() if p >= 0},
        members=listed,
        unreachable=tuple(unreachable),
    )


# -- the checker ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FloodTrace:
    """Where one multicast packet went.

    ``delivered[(node, port)]``: copies each end port received. ``visits[switch]``: copies each
    switch received (more than one: a loop or two paths). ``lost``: (switch, port) mask bits
    that lead to no LinkUp cable (the copy is dropped there).
    """

    delivered: Counter[EndPort]
    visits: Counter[int]
    lost: tuple[EndPort, ...]


def _masks_of(tree: McastTree | Mapping[int, int]) -> Mapping[int, int]:
    return tree.masks if isinstance(tree, McastTree) else tree


def flood_trace(
    fabric: Fabric,
    tree: McastTree | Mapping[int, int],
    from_member: EndPort,
    *,
    up: npt.NDArray[np.bool_] | None = None,
) -> FloodTrace:
    """Inject a packet at end port ``from_member`` and forward it as switches do.

    ``tree`` is a :class:`McastTree` or per-switch masks for one MLID (switch node -> bitmask,
    however they were made). A CA port sends on its cable; a switch's port 0 hands the packet to
    its own switch (ingress port 0). Every switch sends a copy out of every port of its mask but
    the ingress; port 0 delivers to the switch itself, a CA keeps what it gets. A switch that
    receives a copy again on a port it already forwarded from stops it there, so a loop ends.
    ``up`` defaults to ``fabric.up_mask()``.
    """
    masks = _masks_of(tree)
    up = fabric.up_mask() if up is None else up
    n, p = from_member
    if fabric.is_switch(n) and p != 0:
        raise McastError(f"{fabric.port_name(n, p)} is not an end port: a switch sends from port 0")
    delivered: Counter[EndPort] = Counter()
    visits: Counter[int] = Counter()
    lost: list[EndPort] = []
    queue: list[EndPort] = []
    if fabric.is_switch(n):
        queue.append((n, 0))
    elif up[n, p]:
        m, q = int(fabric.peer_node[n, p]), int(fabric.peer_port[n, p])
        if fabric.is_switch(m):
            queue.append((m, q))
        else:
            delivered[(m, q)] += 1
    expanded: set[EndPort] = set()
    nports = fabric.nports
    while queue:
        sw, ingress = queue.pop()
        visits[sw] += 1
        if (sw, ingress) in expanded:
            continue
        expanded.add((sw, ingress))
        for port in mask_ports(masks.get(sw, 0)):
            if port == ingress:
                continue
            if port == 0:
                delivered[(sw, 0)] += 1
            elif port > nports[sw] or not up[sw, port]:
                lost.append((sw, port))
            else:
                m, q = int(fabric.peer_node[sw, port]), int(fabric.peer_port[sw, port])
                if fabric.is_switch(m):
                    queue.append((m, q))
                else:
                    delivered[(m, q)] += 1
    return FloodTrace(delivered, visits, tuple(lost))


def flood(fabric: Fabric, tree: McastTree | Mapping[int, int], from_member: EndPort) -> Counter[EndPort]:
    """Copies each end port receives of a packet ``from_member`` sends (see :func:`flood_trace`)."""
    return flood_trace(fabric, tree, from_member).delivered


def tree_faults(
    fabric: Fabric,
    tree: McastTree | Mapping[int, int],
    members: Sequence[EndPort] | None = None,
    *,
    senders: Sequence[EndPort] | None = None,
) -> list[str]:
    """What is wrong with the group's forwarding, flooding from each sender (default: every member).

    For each sender: every other member must receive exactly one copy, the sender none, no other
    end port any, and no switch more than one. ``members`` defaults to ``tree.members``.
    """
    if members is None:
        if not isinstance(tree, McastTree):
            raise ValueError("members are needed when the tree is given as masks")
        members = tree.members
    group = [(int(n), int(p)) for n, p in members]
    in_group = set(group)
    up = fabric.up_mask()
    faults: list[str] = []
    for s in group if senders is None else senders:
        tr = flood_trace(fabric, tree, s, up=up)
        src = fabric.port_name(*s)
        for m in group:
            got = tr.delivered.get(m, 0)
            if m == s and got:
                faults.append(f"from {src}: the sender got {got} copies back")
            elif m != s and got != 1:
                faults.append(f"from {src}: member {fabric.port_name(*m)} got {got} copies")
        for e, got in sorted(tr.delivered.items()):
            if e not in in_group:
                faults.append(f"from {src}: non-member {fabric.port_name(*e)} got {got} copies")
        for sw, v in sorted(tr.visits.items()):
            if v > 1:
                faults.append(f"from {src}: switch {fabric.names[sw]} got {v} copies")
    return faults


def verify_tree(
    fabric: Fabric,
    tree: McastTree | Mapping[int, int],
    members: Sequence[EndPort] | None = None,
    *,
    senders: Sequence[EndPort] | None = None,
) -> None:
    """Raise :class:`TreeFault` listing what :func:`tree_faults` finds, if anything."""
    faults = tree_faults(fabric, tree, members, senders=senders)
    if faults:
        more = f" (+{len(faults) - 10} more)" if len(faults) > 10 else ""
        raise TreeFault(f"{len(faults)} multicast faults{more}: " + "; ".join(faults[:10]))
