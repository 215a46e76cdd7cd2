"""Credit flow: the channel dependency graph (deadlock check).

A channel is a directed inter-switch link, (switch, port) towards its peer.
A packet buffered in the input of one channel waits for credits on the
next; the LFTs thus make channel ``c1`` depend on ``c2`` when some LID's
route enters a switch on ``c1`` and leaves it on ``c2``. Every switch is an
end port (port 0) and may send to every LID, so each LFT entry on a path is
really used, and the graph is exact for one VL. A cycle in it is a credit
loop: with the buffers along it full, no packet on it can move (Dally and
Seitz). Links to and from CAs cannot be on a cycle (a CA does not forward)
and are left out.

Virtual lanes: each VL has its own buffers and credits, so a dependency
only links two channels on the same VL. Given ``layers`` (the SL of every
route by source switch row and LID, see :data:`sm.routing.base.Layers`) and
an SL-to-VL map (identity by default, as the layering engines program it),
the graph's vertices are (channel, VL) pairs and a route adds its turns on
its own VL only. Without ``layers`` every route is on VL 0.

Credit loops are found by peeling away channels with no dependency in or
no dependency out (numpy rounds), then splitting what is left into strongly
connected components (iterative Tarjan) and reporting a shortest cycle per
component, with the VL it is on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import Fabric, NodeType
from sm.analysis.verify import route_tables, switch_channels
from sm.lidmap import LidMap
from sm.routing.base import Layers, Lft

_CELLS_PER_BLOCK = 1 << 21

# -- channel dependency graph ------------------------------------------------------------------------


@dataclass(frozen=True)
class Channel:
    """A directed link: leaves ``node`` on ``port``, arrives at ``peer`` on ``peer_port`` (names)."""

    node: str
    port: int
    peer: str
    peer_port: int

    def __str__(self) -> str:
        return f"{self.node}[{self.port}] -> {self.peer}[{self.peer_port}]"


@dataclass(frozen=True)
class ChannelDependencyGraph:
    """Channels ``0..n-1`` and their dependencies as CSR arrays.

    Channel ``c`` leaves switch node ``node[c]`` on ``port[c]`` and enters
    ``peer[c]`` on ``peer_port[c]``, on VL ``vl[c]``. Its dependencies are
    ``dst[indptr[c]:indptr[c + 1]]``, each with ``lid``: one destination LID
    whose route makes that turn. With one VL, channel ``c`` is the directed
    link ``c``; with ``n_vls`` VLs, vertex ``v * n_links + c`` is link ``c`` on VL ``v``.
    """

    node: npt.NDArray[np.int64]
    port: npt.NDArray[np.int64]
    peer: npt.NDArray[np.int64]
    peer_port: npt.NDArray[np.int64]
    indptr: npt.NDArray[np.int64]
    dst: npt.NDArray[np.int64]
    lid: npt.NDArray[np.int64]
    vl: npt.NDArray[np.int64] | None = None
    """VL of each vertex; None: all on VL 0."""

    def vl_of(self, c: int) -> int:
        return 0 if self.vl is None else int(self.vl[c])

    @property
    def n_channels(self) -> int:
        return int(self.node.size)

    @property
    def n_dependencies(self) -> int:
        return int(self.dst.size)

    @property
    def src(self) -> npt.NDArray[np.int64]:
        """Source channel of each dependency (expanded from ``indptr``)."""
        return np.repeat(np.arange(self.n_channels, dtype=np.int64), np.diff(self.indptr))

    def channel(self, fabric: Fabric, c: int) -> Channel:
        return Channel(
            fabric.names[int(self.node[c])],
            int(self.port[c]),
            fabric.names[int(self.peer[c])],
            int(self.peer_port[c]),
        )


def _sl_to_vl(sl2vl: npt.ArrayLike | None) -> npt.NDArray[np.int64]:
    """An SL -> VL table of 16 entries (identity by default); VL 15 is not a data VL."""
    if sl2vl is None:
        return np.arange(16, dtype=np.int64)
    t = np.asarray(sl2vl, np.int64).ravel()
    if t.size != 16 or (t < 0).any() or (t > 15).any():
        raise IbfmError(f"SL to VL map must have 16 entries in 0..15, got {t.tolist()}")
    return t


def injecting_rows(fabric: Fabric) -> npt.NDArray[np.bool_]:
    """Switch rows with a CA port cabled (LinkUp) to them: where CA traffic enters the fabric."""
    up = fabric.up_mask()
    peer_is_ca = fabric.node_type[np.where(up, fabric.peer_node, 0)] == NodeType.CA
    out: npt.NDArray[np.bool_] = (peer_is_ca & up)[fabric.switches].any(axis=1)
    return out


def channel_dependency_graph(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    *,
    ca_only: bool = False,
    from_cas: bool = False,
    layers: Layers | None = None,
    sl2vl: npt.ArrayLike | None = None,
) -> ChannelDependencyGraph:
    """Build the channel dependency graph of the LFTs (see the module docstring).

    ``ca_only`` keeps only routes to CA LIDs: the data traffic, leaving out
    switch LIDs (port 0), which carry management traffic only and which
    ``ftree`` may route through a valley (down, then up).

    ``from_cas`` keeps only the channels that routes starting at a CA use:
    traffic a switch sources itself is management on VL15, which has no
    credit flow control, so a dependency only switch-sourced routes make
    cannot deadlock. Routes from CAs to switch LIDs still count.

    ``layers`` (``uint8[switch row, LID]``, the SL of the route entering at
    that row) and ``sl2vl`` (16 VLs by SL, identity when None) put each
    route's dependencies on its VL: the graph then has a vertex per
    (channel, VL) for the VLs in use. Routes whose VL is 15 carry no credits
    and are left out.
    """
    sw = fabric.switches
    n = sw.size
    if lft.shape != (n, lids.max_lid + 1):
        raise IbfmError(f"LFT shape {lft.shape} does not match {n} switches x {lids.max_lid + 1} LIDs")
    if layers is not None and layers.shape != lft.shape:
        raise IbfmError(f"layers shape {layers.shape} does not match the LFT's {lft.shape}")
    t = route_tables(fabric, lids, lft)
    chan_id, ch_row, ch_port = switch_channels(t)  # chan_id is indexed by any LFT entry value
    n_ch = int(ch_row.size)
    ch_peer_row = t.code[ch_row, ch_port].astype(np.int64)
    pmax = fabric.max_port + 1
    vl_of_sl = _sl_to_vl(sl2vl)
    vl_table = None if layers is None else vl_of_sl[layers]
    vls = [0] if vl_table is None else sorted(set(np.unique(vl_table).tolist()) - {15})
    # A dependency (c1 -> c2) on VL v is coded (v * n_ch + c1) * pmax + (port c2 leaves on).
    n_vl = max(vls) + 1 if vls else 1
    seen = np.zeros(n_vl * n_ch * pmax, np.bool_)
    example = np.zeros(n_vl * n_ch * pmax, np.int64)
    n_lid = lids.max_lid + 1
    wanted = lids.owner_node >= 0
    if ca_only:
        wanted &= fabric.node_type[np.maximum(lids.owner_node, 0)] == NodeType.CA
    b = max(64, (_CELLS_PER_BLOCK // max(n, 1)) // 64 * 64)
    rows = np.arange(n)
    injects = injecting_rows(fabric) if from_cas else np.ones(n, np.bool_)
    for lid0 in range(0, n_lid, b):
        lid1 = min(lid0 + b, n_lid)
        c1_all = chan_id[rows[:, None], lft[:, lid0:lid1]]
        c1_all[:, ~wanted[lid0:lid1]] = -1
        for v in vls:
            c1 = c1_all.copy()
            start = np.repeat(injects[:, None], lid1 - lid0, axis=1)
            if vl_table is not None:
                start &= vl_table[:, lid0:lid1] == v
            if from_cas or vl_table is not None:
                # Switches the routes on VL v to each LID pass: start where they enter, follow the LFTs.
                used = start.copy()
                frontier = used.copy()
                cols = np.arange(lid1 - lid0)
                for _ in range(n):
                    r, j = np.nonzero(frontier & (c1 >= 0))
                    if r.size == 0:
                        break
                    nxt = ch_peer_row[c1[r, j]]
                    fresh = ~used[nxt, cols[j]]
                    frontier = np.zeros_like(used)
                    frontier[nxt[fresh], cols[j][fresh]] = True
                    used[nxt[fresh], cols[j][fresh]] = True
                # Every route on VL v that passes x turns at the next switch on VL v.
                c1[~used] = -1
            r, j = np.nonzero(c1 >= 0)
            c1v = c1[r, j]
            lid = j + lid0
            x = ch_peer_row[c1v]
            p2 = lft[x, lid].astype(np.int64)
            turn = chan_id[x, p2] >= 0
            code = (v * n_ch + c1v[turn]) * pmax + p2[turn]
            seen[code] = True
            example[code] = lid[turn]
    codes = np.flatnonzero(seen)
    vc1 = codes // pmax
    v_of = vc1 // max(n_ch, 1)
    c1 = vc1 % max(n_ch, 1)
    dst = v_of * n_ch + chan_id[ch_peer_row[c1], codes % pmax]
    n_vert = n_vl * n_ch
    indptr = np.zeros(n_vert + 1, np.int64)
    np.cumsum(np.bincount(vc1, minlength=n_vert), out=indptr[1:])
    peer_port = fabric.peer_port[sw[ch_row], ch_port].astype(np.int64)
    tile = np.tile
    return ChannelDependencyGraph(
        tile(sw[ch_row].astype(np.int64), n_vl),
        tile(ch_port.astype(np.int64), n_vl),
        tile(sw[ch_peer_row].astype(np.int64), n_vl),
        tile(peer_port, n_vl),
        indptr,
        dst,
        example[codes],
        None if vl_table is None else np.repeat(np.arange(n_vl, dtype=np.int64), n_ch),
    )


# -- credit loops ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreditLoop:
    """A cycle of channels; ``lids[i]`` is a LID whose route turns from ``channels[i]`` into the next."""

    channels: tuple[Channel, ...]
    lids: tuple[int, ...]
    vl: int = 0
    """The VL whose buffers the loop holds (0 when routes use one VL)."""

    def __str__(self) -> str:
        hops = [f"{c.node}[{c.port}]" for c in self.channels]
        return " -> ".join([*hops, hops[0]]) + f" on VL {self.vl} (LIDs {', '.join(map(str, self.lids))})"


def kahn_levels(n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Kahn's rounds as numpy: the round in which each vertex has no in-edge left from the rest
    (0 for the sources), -1 for the vertices never freed (on a cycle or after one)."""
    level = np.full(n, -1, np.int64)
    indeg = np.bincount(dst, minlength=n)
    order = np.argsort(src, kind="stable")
    d_sorted = dst[order]
    start = np.searchsorted(src[order], np.arange(n + 1))
    frontier = np.flatnonzero(indeg == 0)
    lv = 0
    while frontier.size:
        level[frontier] = lv
        lv += 1
        cnt = start[frontier + 1] - start[frontier]
        if cnt.sum() == 0:
            break
        pos = np.repeat(start[frontier] - np.cumsum(np.r_[0, cnt[:-1]]), cnt) + np.arange(cnt.sum())
        targets = d_sorted[pos]
        indeg -= np.bincount(targets, minlength=n)
        t = np.unique(targets)
        frontier = t[(indeg[t] == 0) & (level[t] < 0)]
    return level


def _peel(n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Vertices left after repeatedly removing those with no in-edge from the rest (Kahn)."""
    return kahn_levels(n, src, dst) < 0


def cycle_core(g: ChannelDependencyGraph) -> npt.NDArray[np.bool_]:
    """Channels on a cycle or between two cycles; all False when the graph is acyclic."""
    src, dst = g.src, g.dst
    alive = _peel(g.n_channels, src, dst)
    keep = alive[src] & alive[dst]
    alive &= _peel(g.n_channels, dst[keep], src[keep]) | ~alive
    keep = alive[src] & alive[dst]
    # One more forward pass: removing sinks may have left new sources.
    fwd = _peel(g.n_channels, src[keep], dst[keep]) | ~alive
    return alive & fwd


def _tarjan(nodes: list[int], adj: dict[int, list[int]]) -> list[list[int]]:
    """Strongly connected components, iteratively (no recursion limit)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, i = work[-1]
            succ = adj.get(v, [])
            if i < len(succ):
                work[-1] = (v, i + 1)
                w = succ[i]
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
    return out


def _shortest_cycle(start: int, members: set[int], adj: dict[int, list[int]]) -> list[int]:
    """A shortest cycle through ``start`` inside one strongly connected component (BFS)."""
    parent: dict[int, int] = {start: -1}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in adj.get(v, []):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return path[::-1]
            if w in members and w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError("strongly connected component without a cycle")


def find_credit_loops(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    *,
    max_loops: int = 16,
    ca_only: bool = False,
    from_cas: bool = False,
    graph: ChannelDependencyGraph | None = None,
    layers: Layers | None = None,
    sl2vl: npt.ArrayLike | None = None,
) -> list[CreditLoop]:
    """One shortest credit loop per cyclic strongly connected component, at most ``max_loops``.

    An empty list means the routes are deadlock-free: on one VL, or with
    ``layers`` (the SL of every route, see :data:`sm.routing.base.Layers`)
    and ``sl2vl`` (identity when None) on every VL they use; each loop names
    its VL. ``ca_only`` and ``from_cas`` as for :func:`channel_dependency_graph`;
    pass ``graph`` to reuse a graph already built from the same LFTs (the
    other options are then ignored).
    """
    g = (
        graph
        if graph is not None
        else channel_dependency_graph(
            fabric, lids, lft, ca_only=ca_only, from_cas=from_cas, layers=layers, sl2vl=sl2vl
        )
    )
    core = cycle_core(g)
    if not core.any() or max_loops <= 0:
        return []
    src, dst, lid = g.src, g.dst, g.lid
    keep = core[src] & core[dst]
    adj: dict[int, list[int]] = {}
    turn_lid: dict[tuple[int, int], int] = {}
    for a, b, lv in zip(src[keep].tolist(), dst[keep].tolist(), lid[keep].tolist(), strict=True):
        adj.setdefault(a, []).append(b)
        turn_lid[(a, b)] = lv
    loops: list[CreditLoop] = []
    for comp in _tarjan(sorted(adj), adj):
        members = set(comp)
        if len(comp) == 1 and comp[0] not in adj.get(comp[0], []):
            continue
        cyc = _shortest_cycle(min(comp), members, adj)
        chans = tuple(g.channel(fabric, c) for c in cyc)
        ls = tuple(turn_lid[(cyc[i], cyc[(i + 1) % len(cyc)])] for i in range(len(cyc)))
        loops.append(CreditLoop(chans, ls, g.vl_of(cyc[0])))
        if len(loops) >= max_loops:
            break
    return loops


__all__ = [
    "Channel",
    "ChannelDependencyGraph",
    "CreditLoop",
    "channel_dependency_graph",
    "cycle_core",
    "find_credit_loops",
]
