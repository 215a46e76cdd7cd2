"""Layered routing: balanced shortest paths spread over virtual-lane layers, deadlock-free on any topology.

DFSSSP-style (Domke, Hoefler, Nagel, IPDPS 2011), with LASH's routes and layering on small fabrics:

1. **Routes.** Destination LID by destination LID (in LID order), every
   switch takes, among its ports on a shortest path, the one whose path
   to the destination has the least total link weight (a dynamic program
   over the shortest-path DAG, level by level from the destination). After
   each CA LID, every link the new tree uses gains the number of CA ports
   whose traffic it now carries, so later destinations avoid it: the
   "update the weights after each destination" of DFSSSP, restricted to
   shortest paths. Switch LIDs (management traffic) take the lowest-port
   shortest paths and add no weight, as OpenSM counts only CA LIDs: fewer
   distinct turns, fewer cycles to layer (measured: 2 layers instead of 4
   on the degraded k=36 tree).
2. **Layers** (:func:`assign_layers`, reused after any engine by
   :func:`sm.routing.base.route`). A path is a (source switch row, LID)
   pair: LFTs are destination-based, so every CA on a switch shares that
   switch's route. All paths start in layer 0. Only the paths making a
   turn (channel dependency) of the cyclic core of layer 0's channel
   dependency graph can matter; they are listed once, each as its
   sequence of core turns, and all later work is numpy over that list.
   A layer keeps the paths whose turns all run forward in one order of
   the channels (so it is acyclic) and the others move to the next layer;
   moved paths whose turns follow a topological order of what stayed come
   back. The order is the best (fewest paths moved) of: the links ranked by
   their (higher, lower) switch row, either way round (on a dragonfly
   numbered group by group, "towards higher groups" then "towards lower
   groups": two layers for the paths crossing one global link), and, when tried, a feedback arc order
   of the layer's core (Eades, Lin and Smyth) weighted by paths. Two
   ways are run (the best link order every layer; the best of all three
   every layer). When those need more than 2 layers and the listed paths,
   once identical ones are merged, are few (:data:`FIRST_FIT_PATHS`),
   LASH's way is tried (:func:`_first_fit`: longest paths first, each to
   the lowest layer it keeps acyclic, tested on each layer's transitive
   closure; measured 2 layers where the orders take 3 on a 4x4 torus and a
   16-switch random graph); otherwise DFSSSP's own way within a work budget
   (:func:`_by_cuts`: repeatedly cut the lightest dependency of cycles of
   the layer and move the paths through it; measured never fewer layers
   than the first fit). The fewest layers win. Layer ``k`` is SL ``k`` and VL ``k``. The work is
   bounded: at most ``RoutingOptions.max_layers`` layers (the links'
   operational VLs) are tried, each a few passes over the listed paths and
   one feedback arc order, and the first fit and the cuts stop at
   :data:`FIRST_FIT_WORK` and :data:`CUT_WORK`; a fabric
   that needs more layers is refused with a :class:`LayeringError` (a
   :class:`RoutingError`) saying how many it has, and the chain falls back.
3. **Choice** (fabrics of at most :data:`CANDIDATE_HOSTS` hosts). The
   balanced routes spread all-to-all traffic but not always shifts: on a
   torus dimension order does better (measured worst shift load on a 6x6
   torus: 9 balanced, 6 in dimension order) and its turns layer on fewer
   VLs (2 on a 2-D torus, as LASH). So :func:`lowest_port_lft` (LASH's
   routes: one shortest-path tree per destination switch, lowest port on a
   tie, dimension order on a torus) is layered too, and the engine keeps,
   of the two, the lower worst link load over shift and random
   permutations (:func:`pattern_balance`), then the fewer layers, the
   lower mean load, the fewer channel dependencies. Balance is never traded
   for VLs. Larger fabrics take the balanced routes (the patterns cost
   ``O(hosts^2)``), or the lowest-port ones when only those can be
   layered (measured: an 8x8 torus with 16 hosts a switch needs more than
   8 layers balanced, 2 in dimension order).

Routing is per destination LID in blocks of LIDs, as numpy arrays over
switch rows; layering is numpy over the listed paths: no per-path Python objects (the first fit
loops in Python over at most :data:`FIRST_FIT_PATHS` merged paths).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from fabric.model import Fabric, NodeType
from sm.analysis.creditflow import channel_dependency_graph, injecting_rows, kahn_levels
from sm.analysis.patterns import hosts, random_permutation
from sm.analysis.verify import link_loads, shift_quality
from sm.lidmap import LidMap
from sm.routing._hops import UNREACHABLE, SwitchGraph, destinations, hop_matrix, switch_graph
from sm.routing.base import NO_ROUTE, Layers, Lft, Routes, RoutingError, RoutingOptions, empty_lft, register

__all__ = [
    "LayeredEngine",
    "LayeringError",
    "assign_layers",
    "balanced_lft",
    "injecting_rows",
    "lowest_port_lft",
    "pattern_balance",
]

_Ints = npt.NDArray[np.signedinteger[Any]]

_CELLS_PER_BLOCK = 1 << 22
"""(row, LID) cells handled at once while layering (bounds the temporary arrays)."""


RECOUNT_CELLS = 1 << 26
"""Budget of (row, LID) cells read per layer for recounts: a layer gets ``max(2, RECOUNT_CELLS /
cells)`` rounds of disjoint-cycle cuts, each followed by a recount of its paths (DFSSSP recounts after
every cut; a round cuts a set of disjoint cycles at once). Cycles left after them are cut in one go."""

FUNCTIONAL_ROUNDS = 64
"""In that last go: rounds of disjoint-cycle cuts before the rest is cut by an order."""

CUT_WORK = 1 << 26
"""Budget of layering by cuts, in turn entries of the listed paths read (once per recount or move)
plus channels and dependencies of each round's graph: past it the cuts are given up and the layers by
channel orders kept. Deterministic: the same fabric and routes always stop at the same round."""

CUT_MIN_PASSES = 32
"""Layering by cuts is not tried when fewer than this many passes over the listed paths fit in
:data:`CUT_WORK` (it would run out of budget: the orders' layers are kept)."""

RETURN_ROUNDS = 2
"""Layering by orders: rounds giving moved paths back to the layer they left."""


class LayeringError(RoutingError):
    """The routes need more VL layers than the links allow."""

    def __init__(self, message: str, needed_more_than: int) -> None:
        super().__init__(message)
        self.needed_more_than = needed_more_than


# -- routes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Level:
    """Rows at one hop distance from the destination switch and their shortest-path ports."""

    rows: npt.NDArray[np.int64]
    ports: npt.NDArray[np.int64]
    """``[rows, k]``: candidate ports, lowest first, padded with the sentinel column ``P``."""
    nbr: npt.NDArray[np.int64]
    """``[rows, k]``: the row each candidate leads to, padded with the sentinel row ``n``."""
    widx: npt.NDArray[np.int64]
    """``[rows, k]``: flat index ``row * (P + 1) + port`` into the link weights."""
    flat: npt.NDArray[np.int64]
    """``row position * k``: where each row's candidates start in the raveled ``[rows, k]`` arrays."""


def _levels(nbr: npt.NDArray[np.int64], dist_to_d: npt.NDArray[np.uint8]) -> list[_Level]:
    """The shortest-path DAG towards one switch, level by level from it (rows without a path left out)."""
    n, n_ports = nbr.shape
    dd = np.append(dist_to_d.astype(np.int16), UNREACHABLE)
    nb = np.where(nbr >= 0, nbr, n)
    cand = (dd[nb] == dd[:n, None] - 1) & (nbr >= 0)
    count = cand.sum(axis=1)
    kmax = int(count.max()) if n else 0
    # Compact each row's candidate ports to the left, lowest port first (nonzero lists them row-major).
    r, p = np.nonzero(cand)
    pos = np.arange(r.size) - (np.cumsum(count) - count)[r]
    ports = np.full((n, max(kmax, 1)), n_ports, np.int64)
    ports[r, pos] = p
    nxt = np.full((n, max(kmax, 1)), n, np.int64)
    nxt[r, pos] = nb[r, p]
    out: list[_Level] = []
    reach = dd[:n]
    top = int(reach[reach < UNREACHABLE].max()) if n else 0
    for lv in range(1, top + 1):
        rows = np.flatnonzero(reach == lv)
        if rows.size == 0:
            break
        k = int(count[rows].max())
        pl = ports[rows, :k]
        out.append(_Level(rows, pl, nxt[rows, :k], rows[:, None] * (n_ports + 1) + pl, np.arange(rows.size) * k))
    return out


def _ca_ports_per_row(fabric: Fabric, lids: LidMap, g: SwitchGraph) -> npt.NDArray[np.float64]:
    """CA end ports with a LID entering the fabric at each row: the traffic a row sources."""
    ep = hosts(fabric, lids)
    row = g.row_of[fabric.peer_node[ep[:, 0], ep[:, 1]].astype(np.int64)]
    row = row[row >= 0]
    return np.bincount(row, minlength=g.n).astype(np.float64)


def _ca_lids(fabric: Fabric, lids: LidMap) -> int:
    """CA end ports with a LID."""
    ep = np.argwhere(lids.base > 0)
    return int(np.count_nonzero(fabric.node_type[ep[:, 0]] == NodeType.CA))


def _route_one(
    levels: list[_Level],
    w: npt.NDArray[np.float64],
    src_weight: npt.NDArray[np.float64],
    col: npt.NDArray[np.uint8],
    d: int,
    n: int,
) -> None:
    """One LID: the cheapest shortest path from every row into ``col``; its flows added to ``w``."""
    cost = np.full(n + 1, np.inf)
    cost[d] = 0.0
    picked = []
    for lv in levels:
        c = w[lv.widx] + cost[lv.nbr]
        fi = lv.flat + c.argmin(axis=1)
        cost[lv.rows] = c.ravel()[fi]
        col[lv.rows] = lv.ports.ravel()[fi]
        picked.append(fi)
    flow = src_weight.copy()
    for lv, fi in zip(reversed(levels), reversed(picked), strict=True):
        f = flow[lv.rows]
        w[lv.widx.ravel()[fi]] += f
        flow += np.bincount(lv.nbr.ravel()[fi], weights=f, minlength=n)


def balanced_lft(fabric: Fabric, lids: LidMap, g: SwitchGraph | None = None) -> Lft:
    """Shortest paths balanced by link weights updated after each CA LID (see the module docstring)."""
    g = g if g is not None else switch_graph(fabric)
    lft = empty_lft(fabric, lids)
    n = g.n
    if n == 0:
        return lft
    dist = hop_matrix(g.nbr)
    dist_t = np.ascontiguousarray(dist.T)  # [d, x]: hops from x to d
    n_ports = g.nbr.shape[1]
    dst = destinations(fabric, lids, g)
    ok = dst.row >= 0
    # Switch LIDs add no weight: all of them at once, on the lowest-port shortest paths.
    sw_lid = ok & ~dst.counted
    if sw_lid.any():
        _fill_lowest(lft, _lowest_ports(g, dist), dst.lid[sw_lid], dst.row[sw_lid], dst.egress[sw_lid])
    ok &= dst.counted
    lid_all, row_all, egress_all = dst.lid[ok], dst.row[ok], dst.egress[ok]
    # CA LIDs in LID order, grouped by the switch they hang on (in order of its first CA LID), so
    # each switch's shortest-path DAG is built once.
    first = np.full(n, np.iinfo(np.int64).max, np.int64)
    pos = np.arange(row_all.size)
    np.minimum.at(first, row_all, pos)
    order = np.lexsort((np.arange(row_all.size), first[row_all]))
    lid_all, row_all, egress_all = lid_all[order], row_all[order], egress_all[order]
    src_weight = _ca_ports_per_row(fabric, lids, g)
    w = np.zeros(n * (n_ports + 1), np.float64)
    w.reshape(n, n_ports + 1)[:, n_ports] = np.inf
    lft_t = np.ascontiguousarray(lft.T)
    cache: dict[int, list[_Level]] = {}
    for lid, d, egress in zip(lid_all.tolist(), row_all.tolist(), egress_all.tolist(), strict=True):
        levels = cache.get(d)
        if levels is None:
            levels = _levels(g.nbr, dist_t[d])
            if len(cache) > 256:
                cache.clear()
            cache[d] = levels
        _route_one(levels, w, src_weight, lft_t[lid], d, n)
        lft_t[lid, d] = egress
    return np.ascontiguousarray(lft_t.T)


def _lowest_ports(g: SwitchGraph, dist: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """``[row, destination row]``: the lowest port on a shortest path (NO_ROUTE where none or at the row itself)."""
    n = g.n
    d16 = dist.astype(np.int16)
    port_to = np.full((n, n), NO_ROUTE, np.uint8)
    for p in reversed(range(g.nbr.shape[1])):  # the lowest port written last
        has = np.flatnonzero(g.nbr[:, p] >= 0)
        if has.size == 0:
            continue
        step = d16[g.nbr[has, p]] == d16[has] - 1
        sub = port_to[has]
        sub[step] = p
        port_to[has] = sub
    return port_to


def _fill_lowest(
    lft: Lft, port_to: npt.NDArray[np.uint8], lid: _Ints, row: _Ints, egress: _Ints
) -> None:
    """LIDs ``lid`` (delivered at ``row`` on port ``egress``) on the lowest-port shortest paths."""
    lft[:, lid] = port_to[:, row]
    lft[row, lid] = egress


def lowest_port_lft(fabric: Fabric, lids: LidMap, g: SwitchGraph | None = None) -> Lft:
    """Shortest paths taking the lowest port on every tie, one tree per destination switch (no balancing).

    LASH's routes: on a torus cabled dimension by dimension (``fabric.generate.torus``) this is
    dimension-order routing, which spreads every shift evenly and whose turns layer on 2 VLs in 2-D.
    """
    g = g if g is not None else switch_graph(fabric)
    lft = empty_lft(fabric, lids)
    if g.n == 0:
        return lft
    dst = destinations(fabric, lids, g)
    ok = dst.row >= 0
    _fill_lowest(lft, _lowest_ports(g, hop_matrix(g.nbr)), dst.lid[ok], dst.row[ok], dst.egress[ok])
    return lft


# -- layers -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Paths:
    """The LFT as a forest per LID: next row, turn code and hop depth of every (row, LID) cell of a block."""

    lid0: int
    lid1: int
    nxt: npt.NDArray[np.int32]
    """``[row, j]`` flat index (``row * b + j``) of the next cell on the path, -1 where the path leaves the switches."""
    turn: npt.NDArray[np.int32]
    """Code ``c_in * P + out_port`` of the turn the path makes at the next switch, -1 for none."""
    depth: list[npt.NDArray[np.int32]]
    """Flat cell indices by hops left to the last switch: ``depth[h]``; loops are left out."""


def _block_turns(
    g: SwitchGraph,
    lft: Lft,
    lid_ok: npt.NDArray[np.bool_],
    chan_id: npt.NDArray[np.int64],
    lid0: int,
    lid1: int,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """For the cells of LIDs ``lid0:lid1`` (flat ``row * b + j``): the next cell and the turn code."""
    n = g.n
    n_ports = g.nbr.shape[1]
    bl = lid1 - lid0
    nbr256 = np.full((n, 256), -1, np.int32)
    nbr256[:, :n_ports] = g.nbr
    chan = chan_id.astype(np.int32).ravel()
    part = lft[:, lid0:lid1]
    key = (np.arange(n, dtype=np.int32) * 256)[:, None] + part  # (row, LFT entry), int32 throughout
    nx = nbr256.ravel()[key]
    nx[:, ~lid_ok[lid0:lid1]] = -1
    has = nx >= 0
    flat_next = np.where(has, nx * np.int32(bl) + np.arange(bl, dtype=np.int32)[None, :], np.int32(-1)).ravel()
    at = np.flatnonzero(has.ravel())
    nxt = flat_next[at]
    out_next = part.ravel()[nxt]
    chan_out = chan[(nxt // bl) * 256 + out_next]
    t = chan_out >= 0
    at = at[t]
    turn = np.full(flat_next.size, -1, np.int32)
    turn[at] = chan[key.ravel()[at]] * np.int32(n_ports) + out_next[t]
    return flat_next, turn


def _block_size(g: SwitchGraph) -> int:
    return max(64, _CELLS_PER_BLOCK // max(g.n, 1))


def _blocks(
    g: SwitchGraph,
    lft: Lft,
    lid_ok: npt.NDArray[np.bool_],
    chan_id: npt.NDArray[np.int64],
    known: Iterator[tuple[_Ints, _Ints]] | None = None,
) -> Iterator[_Paths]:
    """The LFT's cells block by block (``known``: their :func:`_block_turns` already computed)."""
    n = g.n
    n_lid = lft.shape[1]
    b = _block_size(g)
    for lid0 in range(0, n_lid, b):
        lid1 = min(lid0 + b, n_lid)
        if known is not None:
            flat_next, turn = next(known)
        else:
            flat_next, turn = _block_turns(g, lft, lid_ok, chan_id, lid0, lid1)
        has = flat_next >= 0
        # Depth: 0 where the path leaves the switch graph here, else depth of the next cell + 1.
        depth = np.where(has, -1, 0).astype(np.int64)
        levels = [np.flatnonzero(depth == 0)]
        pending = np.flatnonzero(has)
        for h in range(1, n + 1):
            if pending.size == 0:
                break
            done = depth[flat_next[pending]] == h - 1
            if not done.any():
                break  # what is left loops: not a path
            depth[pending[done]] = h
            levels.append(pending[done])
            pending = pending[~done]
        yield _Paths(
            lid0,
            lid1,
            flat_next.astype(np.int32, copy=False),
            turn.astype(np.int32, copy=False),
            [lv.astype(np.int32) for lv in levels],
        )


def _drain(turns: list[tuple[_Ints, _Ints, npt.NDArray[np.bool_]]]) -> Iterator[tuple[_Ints, _Ints]]:
    """``turns``' next cells and turns, each dropped from the list as it is handed out."""
    while turns:
        flat_next, turn, _ = turns.pop(0)
        yield flat_next, turn


def _channels(g: SwitchGraph) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``chan_id[row, entry]`` over all 256 entry values (-1: not an inter-switch link), channel rows and peers."""
    n = g.n
    row, port = np.nonzero(g.nbr >= 0)
    chan_id = np.full((n, 256), -1, np.int64)
    chan_id[row, port] = np.arange(row.size)
    return chan_id, row.astype(np.int64), g.nbr[row, port].astype(np.int64)


def _gather(
    start: npt.NDArray[np.int64], vals: npt.NDArray[np.int64], v: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """``vals[start[v]:start[v + 1]]`` for every ``v``, concatenated (CSR rows)."""
    cnt = start[v + 1] - start[v]
    total = int(cnt.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    pos = np.repeat(start[v] - np.cumsum(np.r_[0, cnt[:-1]]), cnt) + np.arange(total)
    return vals[pos]


def _peel_fixpoint(n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Vertices on a cycle or between cycles: repeatedly drop those with no in- or no out-edge left."""
    alive = np.ones(n, np.bool_)
    indeg = np.bincount(dst, minlength=n)
    outdeg = np.bincount(src, minlength=n)
    o = np.argsort(src, kind="stable")
    out_start = np.searchsorted(src[o], np.arange(n + 1))
    out_to = dst[o]
    i = np.argsort(dst, kind="stable")
    in_start = np.searchsorted(dst[i], np.arange(n + 1))
    in_from = src[i]
    frontier = np.flatnonzero((indeg == 0) | (outdeg == 0))
    while frontier.size:
        alive[frontier] = False
        t = _gather(out_start, out_to, frontier)
        f = _gather(in_start, in_from, frontier)
        indeg -= np.bincount(t, minlength=n)
        outdeg -= np.bincount(f, minlength=n)
        cand = np.unique(np.concatenate([t, f]))
        frontier = cand[alive[cand] & ((indeg[cand] <= 0) | (outdeg[cand] <= 0))]
    return alive


def break_cycles(
    n: int,
    src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64],
    weight: npt.NDArray[np.float64],
    rounds: int | None = None,
) -> npt.NDArray[np.bool_]:
    """Edges to remove, the lightest edge of each cycle found (see the module docstring).

    Each round cuts a set of vertex-disjoint cycles; with ``rounds=None`` rounds go on until
    what is left is acyclic.
    """
    removed = np.zeros(src.size, np.bool_)
    steps = max(1, int(np.ceil(np.log2(max(n, 2)))) + 1)
    r = 0
    while rounds is None or r < rounds:
        r += 1
        live = ~removed
        core = _peel_fixpoint(n, src[live], dst[live])
        if not core.any():
            return removed
        if rounds is None and r > FUNCTIONAL_ROUNDS:
            # Many cycles left: cut every edge that runs backwards in an order by weight balance
            # (Eades, Lin and Smyth's heuristic in one step: vertices with more weight out than in first).
            inside = live & core[src] & core[dst]
            delta = np.bincount(src[inside], weights=weight[inside], minlength=n) - np.bincount(
                dst[inside], weights=weight[inside], minlength=n
            )
            pos = np.empty(n, np.int64)
            pos[np.argsort(-delta, kind="stable")] = np.arange(n)
            removed |= inside & (pos[src] >= pos[dst])
            continue
        e = np.flatnonzero(live & core[src] & core[dst])
        # Each core vertex keeps its lightest out-edge: a functional graph, one cycle per component.
        order = e[np.lexsort((weight[e], src[e]))]
        first = order[np.r_[True, src[order][1:] != src[order][:-1]]]
        f = np.arange(n + 1, dtype=np.int64)
        f[n] = n
        f[src[first]] = dst[first]
        fe = np.full(n + 1, -1, np.int64)
        fe[src[first]] = first
        verts = src[first]
        jump = f.copy()
        for _ in range(steps):
            jump = jump[jump]
        on_cycle = np.unique(jump[verts])
        # Label every cycle vertex with the smallest vertex of its cycle.
        label = np.arange(n + 1, dtype=np.int64)
        hop = f.copy()
        for _ in range(steps):
            label[on_cycle] = np.minimum(label[on_cycle], label[hop[on_cycle]])
            hop[on_cycle] = hop[hop[on_cycle]]
        ce = fe[on_cycle]
        lab = label[on_cycle]
        pick = np.lexsort((weight[ce], lab))
        lab_sorted = lab[pick]
        lightest = ce[pick][np.r_[True, lab_sorted[1:] != lab_sorted[:-1]]]
        removed[lightest] = True
    return removed


def _topo_position(n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """A topological position of every vertex of an acyclic graph (Kahn levels, then index)."""
    level = np.maximum(kahn_levels(n, src, dst), 0)
    rank = np.empty(n, np.int64)
    rank[np.lexsort((np.arange(n), level))] = np.arange(n)
    return rank


def feedback_order(
    n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64], weight: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """A position of every vertex such that little edge weight runs backwards (``pos[src] > pos[dst]``).

    Eades, Lin and Smyth's greedy heuristic (1993): sinks go to the end, sources to the front, else the
    vertex with the most weight out minus in to the front; ties to the lowest vertex. ``O(E log E)``:
    one heap push per edge. Edges with ``src == dst`` are ignored.
    """
    o = np.argsort(src, kind="stable")
    out_start = np.searchsorted(src[o], np.arange(n + 1))
    i = np.argsort(dst, kind="stable")
    in_start = np.searchsorted(dst[i], np.arange(n + 1))
    out_to, out_w = dst[o].tolist(), weight[o].tolist()
    in_from, in_w = src[i].tolist(), weight[i].tolist()
    os_, is_ = out_start.tolist(), in_start.tolist()
    outdeg, indeg = np.diff(out_start).tolist(), np.diff(in_start).tolist()
    ow = np.bincount(src, weights=weight, minlength=n).tolist()
    iw = np.bincount(dst, weights=weight, minlength=n).tolist()
    alive = [True] * n
    left: list[int] = []
    right: list[int] = []
    sinks = [v for v in range(n) if outdeg[v] == 0]
    sources = [v for v in range(n) if indeg[v] == 0 and outdeg[v] > 0]
    heap = [(iw[v] - ow[v], v) for v in range(n)]
    heapq.heapify(heap)
    while len(left) + len(right) < n:
        if sinks:
            v = sinks.pop()
            if not alive[v]:
                continue
            right.append(v)
        elif sources:
            v = sources.pop()
            if not alive[v]:
                continue
            left.append(v)
        else:
            while True:
                d, v = heapq.heappop(heap)
                if alive[v] and d == iw[v] - ow[v]:
                    break
            left.append(v)
        alive[v] = False
        for e in range(os_[v], os_[v + 1]):
            u = out_to[e]
            if alive[u]:
                indeg[u] -= 1
                iw[u] -= out_w[e]
                if indeg[u] == 0:
                    sources.append(u)
                heapq.heappush(heap, (iw[u] - ow[u], u))
        for e in range(is_[v], is_[v + 1]):
            x = in_from[e]
            if alive[x]:
                outdeg[x] -= 1
                ow[x] -= in_w[e]
                if outdeg[x] == 0:
                    sinks.append(x)
                heapq.heappush(heap, (iw[x] - ow[x], x))
    pos = np.empty(n, np.int64)
    pos[np.array(left + right[::-1], np.int64)] = np.arange(n)
    return pos


@dataclass
class _Routes:
    """The routes that can ever change layer, as columns of turn codes, and a work meter."""

    steps: list[npt.NDArray[np.int32]]
    """``steps[s][path]``: the ``s``-th turn of the cyclic core (code ``c_in * P + out_port``) the path
    makes, ``len(c1)`` past its last one."""
    row: npt.NDArray[np.int32]
    col: npt.NDArray[np.int32]
    """Source row and column (of the LFT) of each path."""
    c1: npt.NDArray[np.int64]
    c2: npt.NDArray[np.int64]
    """Channel into and out of the switch of every turn code (``c2`` -1 where the code is no turn)."""
    n_ch: int
    link_key: npt.NDArray[np.int64]
    """Per channel, its link's key ``higher row * n + lower row``: both directions of a link tie."""
    work: int = 0
    """Turn entries read so far: the deterministic measure the budgets count."""

    @property
    def size(self) -> int:
        return int(self.row.size)

    def weights(self, idx: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.float64]:
        """Paths among ``idx`` (default: all) making each turn."""
        n_codes = self.c1.size
        w = np.zeros(n_codes + 1, np.int64)
        for st in self.steps:
            w += np.bincount(st if idx is None else st[idx], minlength=n_codes + 1)
        self.work += (self.size if idx is None else idx.size) * len(self.steps)
        return w[:n_codes].astype(np.float64)

    def hits(self, bad_code: npt.NDArray[np.bool_], idx: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.bool_]:
        """Which paths among ``idx`` (default: all) make a turn in ``bad_code``."""
        bad = np.append(bad_code, False)
        out = np.zeros(self.size if idx is None else idx.size, np.bool_)
        for st in self.steps:
            out |= bad[st if idx is None else st[idx]]
        self.work += out.size * len(self.steps)
        return out

    def subset(self, idx: npt.NDArray[np.int64]) -> _Routes:
        """The paths ``idx`` alone (``row`` and ``col`` as they are); the work meter goes on counting."""
        return _Routes([st[idx] for st in self.steps], self.row[idx], self.col[idx], self.c1, self.c2, self.n_ch,
                       self.link_key, self.work + idx.size * len(self.steps))

    def cyclic(self, weight: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Turn codes in use and the channels on or between cycles of their dependency graph."""
        used = np.flatnonzero(weight > 0)
        return used, _peel_fixpoint(self.n_ch, self.c1[used], self.c2[used])


def _routes(
    blocks: Iterable[_Paths],
    source: npt.NDArray[np.bool_],
    keep_code: npt.NDArray[np.bool_],
    c1: npt.NDArray[np.int64],
    c2: npt.NDArray[np.int64],
    n_ch: int,
    link_key: npt.NDArray[np.int64],
) -> _Routes:
    """The paths from ``source`` rows that make a turn in ``keep_code``, with those turns only: no
    other turn is on a cycle of any layer."""
    none = c1.size
    parts: list[list[npt.NDArray[np.int32]]] = []
    rows: list[npt.NDArray[np.int32]] = []
    cols: list[npt.NDArray[np.int32]] = []
    code = np.append(np.where(keep_code, np.arange(none), none), none).astype(np.int32)
    for bp in blocks:
        bl = bp.lid1 - bp.lid0
        start = (np.flatnonzero(source)[:, None] * bl + np.arange(bl)[None, :]).ravel()
        # Walk every path at once; index -1 (past the end) reads the appended sentinels.
        tcode = np.append(code[bp.turn], none)
        nxt = np.append(bp.nxt, -1)
        cur = start.astype(np.int32)
        steps: list[npt.NDArray[np.int32]] = []
        for _ in range(len(bp.depth)):
            t = tcode[cur]
            if (t < none).any():
                steps.append(t)
            cur = nxt[cur]
            if cur.max(initial=-1) < 0:
                break
        if not steps:
            continue
        hit = np.zeros(start.size, np.bool_)
        for t in steps:
            hit |= t < none
        st = np.stack([t[hit] for t in steps])
        width = int((st < none).sum(axis=0).max())
        if width < len(steps):  # each path's core turns moved to the front, in path order
            order = np.argsort(st == none, axis=0, kind="stable")
            st = np.take_along_axis(st, order, axis=0)
        parts.append(list(st[:width].copy()))
        rows.append((start[hit] // bl).astype(np.int32))
        cols.append((start[hit] % bl + bp.lid0).astype(np.int32))
        del st, steps, hit, start
    width = max((len(p) for p in parts), default=0)
    sizes = [p[0].size for p in parts]
    steps_all = []
    for s_ in range(width):
        steps_all.append(
            np.concatenate(
                [p[s_] if s_ < len(p) else np.full(m, none, np.int32) for p, m in zip(parts, sizes, strict=True)]
            )
        )
        for p in parts:  # free as they are copied
            if s_ < len(p):
                p[s_] = p[s_][:0]
    parts.clear()
    row = np.concatenate(rows) if rows else np.zeros(0, np.int32)
    col = np.concatenate(cols) if cols else np.zeros(0, np.int32)
    return _Routes(steps_all, row, col, c1, c2, n_ch, link_key)


def _too_many(engine: str, max_layers: int) -> LayeringError:
    return LayeringError(
        f"{engine}: routes need more than {max_layers} VL layer{'s' if max_layers != 1 else ''} "
        f"to be deadlock-free (links allow {max_layers})",
        max_layers,
    )


@dataclass
class _OrderState:
    """Layering by orders part way: layers below ``k`` done, ``cur`` (paths ``act`` of ``r``) in layer ``k``."""

    pl: npt.NDArray[np.uint8]
    act: npt.NDArray[np.int64]
    cur: _Routes
    k: int


def _by_order(r: _Routes, max_layers: int) -> npt.NDArray[np.uint8] | None:
    """Layers by channel orders: layer ``k`` keeps the paths whose turns all run forward in an order.

    Per layer, in ``O(turns of its paths)`` plus at most one :func:`feedback_order`: the candidate
    orders are the links by switch rows, both ways, and the feedback order of the cyclic part of the
    layer's dependency graph weighted by paths; the paths with a backward cyclic turn in the chosen one
    move to the next layer; then moved paths whose cyclic turns all follow a topological order of what
    stayed come back (:data:`RETURN_ROUNDS` times). Every layer is acyclic: its cyclic turns all run
    forward in one order. Two ways are run: the best link order every layer, and the best of all three
    every layer (the same as the first up to the first layer where the feedback order moves fewer
    paths, so it starts there); the fewer layers win, ``None`` if both need more than ``max_layers``.
    """
    start = _OrderState(np.zeros(r.size, np.uint8), np.arange(r.size, dtype=np.int64), r, 0)
    links, fork = _order_run(r, start, max_layers, links_only=True)
    best = links
    if fork is not None:
        alt, _ = _order_run(r, fork, max_layers, links_only=False)
        if alt is not None and (best is None or int(alt.max(initial=0)) < int(best.max(initial=0))):
            best = alt
    return best


def _order_run(
    r: _Routes, st: _OrderState, max_layers: int, *, links_only: bool
) -> tuple[npt.NDArray[np.uint8] | None, _OrderState | None]:
    """Layer from ``st`` on (see :func:`_by_order`); with ``links_only``, also the state at the first
    layer where the feedback order would have moved fewer paths than the link orders (else ``None``)."""
    n_ch, c1, c2 = r.n_ch, r.c1, np.maximum(r.c2, 0)
    pl, act, cur, k = st.pl.copy(), st.act, st.cur, st.k
    fork: _OrderState | None = None
    while act.size:
        used, core = cur.cyclic(w := cur.weights())
        if not core.any():
            break
        if k + 1 >= max_layers:
            return None, fork
        cyc = core[c1] & core[c2]
        best: npt.NDArray[np.bool_] | None = None
        for i, key in enumerate((r.link_key, -r.link_key, None)):
            if key is None:
                # The feedback order of the core's channels (renumbered densely, the others after them);
                # for the link orders alone, only until it first does better.
                if (links_only and fork is not None) or (best is not None and not best.any()):
                    break
                e = used[cyc[used]]
                ids = np.flatnonzero(core)
                dense = np.full(n_ch, -1, np.int64)
                dense[ids] = np.arange(ids.size)
                key = np.full(n_ch, ids.size, np.int64)
                key[ids] = feedback_order(ids.size, dense[c1[e]], dense[c2[e]], w[e])
            hit = cur.hits(cyc & (key[c1] >= key[c2]))
            if best is None or np.count_nonzero(hit) < np.count_nonzero(best):
                if links_only and i == 2:
                    fork = _OrderState(pl.copy(), act, cur, k)
                    break
                best = hit
        assert best is not None
        moved = best
        for _ in range(RETURN_ROUNDS):
            if not moved.any():
                break
            kept = np.flatnonzero(~moved)
            uk = np.flatnonzero(cur.weights(kept) > 0)
            uk = uk[cyc[uk]]
            topo = _topo_position(n_ch, c1[uk], c2[uk])
            idx = np.flatnonzero(moved)
            back = ~cur.hits(cyc & (topo[c1] >= topo[c2]), idx)
            if not back.any():
                break
            moved[idx[back]] = False
        idx = np.flatnonzero(moved)
        act = act[idx]
        pl[act] = k + 1
        cur = cur.subset(idx)
        k += 1
    return pl, fork


def _by_cuts(r: _Routes, max_layers: int, budget_rounds: int, work: int) -> npt.NDArray[np.uint8] | None:
    """Layers by cutting cycles (DFSSSP's way, see the module docstring); ``None`` past ``work`` or
    ``max_layers``.

    Per layer: ``budget_rounds`` rounds of cuts of disjoint cycles, each followed by a recount, then
    whatever cycles are left are cut at once (:func:`break_cycles`); the paths through a cut turn move
    to the next layer; once the layer is acyclic, moved paths whose turns all follow its topological
    order come back.
    """
    n_ch, c1, c2 = r.n_ch, r.c1, r.c2
    c2s = np.maximum(c2, 0)
    pl = np.zeros(r.size, np.uint8)
    act = np.arange(r.size, dtype=np.int64)
    k = 0
    recounts = 0
    while act.size:
        if r.work > work:
            return None
        weight = r.weights(act)
        used = np.flatnonzero(weight > 0)
        r.work += n_ch + used.size  # a round's graph work, so rounds over few paths count too
        cut = break_cycles(n_ch, c1[used], c2[used], weight[used], rounds=1 if recounts < budget_rounds else None)
        recounts += 1
        if not cut.any():
            k += 1
            recounts = 0
            act = np.flatnonzero(pl == k)
            continue
        if k + 1 >= max_layers:
            return None
        bad_code = np.zeros(c1.size, np.bool_)
        bad_code[used[cut]] = True
        moved = act[r.hits(bad_code, act)]
        pl[moved] = k + 1
        act = act[pl[act] == k]
        weight = r.weights(act)
        used = np.flatnonzero(weight > 0)
        if not _peel_fixpoint(n_ch, c1[used], c2[used]).any():
            # The layer is acyclic: give back the moved paths whose turns all follow its order.
            pos = _topo_position(n_ch, c1[used], c2[used])
            forward = (c2 >= 0) & (pos[c1] < pos[c2s])
            nxt = np.flatnonzero(pl == k + 1)
            back = nxt[~r.hits(~forward, nxt)]
            pl[back] = k
            act = np.flatnonzero(pl == k)
    return pl


FIRST_FIT_PATHS = 1 << 14
"""Layering by first fit (:func:`_first_fit`) is tried when the listed paths, once identical turn
sequences are merged, are at most this many (each costs a few numpy calls in a Python loop, about
0.1 ms: 16,384 paths take 1 to 2 s) and the listed paths before merging at most 16 times as many."""

FIRST_FIT_WORK = 1 << 27
"""Budget of layering by first fit, in bytes of reachability rows OR-ed in plus a fixed charge per path
tried in a layer: past it the first fit is given up. Deterministic, like :data:`CUT_WORK`."""

_FIRST_FIT_PATH_COST = 4096
"""What one try of a path in a layer counts against :data:`FIRST_FIT_WORK`."""


def _closes_cycle(sub: npt.NDArray[np.bool_]) -> bool:
    """Whether the small graph of adjacency ``sub`` has a cycle (its transitive closure has a loop)."""
    c = sub.astype(np.int32)
    for _ in range(max(1, int(sub.shape[0]).bit_length())):
        c = np.minimum(c + c @ c, 1)
    return bool(np.diagonal(c).any())


def _first_fit(r: _Routes, max_layers: int, work: int) -> npt.NDArray[np.uint8] | None:
    """Layers by first fit, LASH's way: each path, longest first, goes to the lowest layer it keeps acyclic.

    Paths with the same core turns are one path here. Each layer keeps the transitive closure of its
    core channels' dependency graph as packed bit rows, so a path's test is a look at the closure among
    the channels of its turns (a cycle through new turns runs between them on old paths), and adding it
    ORs the rows of the channels reaching each new turn's entry. ``None`` past ``max_layers`` layers or
    ``work`` (see :data:`FIRST_FIT_WORK`).
    """
    none = r.c1.size
    if r.size == 0:
        return np.zeros(0, np.uint8)
    if r.size > 16 * FIRST_FIT_PATHS:
        return None
    st = np.stack(r.steps, axis=1) if r.steps else np.full((r.size, 1), none, np.int32)
    uniq, inv = np.unique(st, axis=0, return_inverse=True)
    if uniq.shape[0] > FIRST_FIT_PATHS:
        return None
    inv = inv.reshape(-1)
    length = (uniq < none).sum(axis=1)
    # Longest first, then by source row and LID (as listed in one block: independent of the blocks).
    key = r.row.astype(np.int64) * (int(r.col.max(initial=0)) + 1) + r.col
    first = np.full(uniq.shape[0], np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, inv, key)
    order = np.lexsort((first, -length))
    used = np.unique(uniq[uniq < none])
    chans = np.unique(np.concatenate([r.c1[used], r.c2[used]]))
    dense = np.full(r.n_ch, -1, np.int64)
    dense[chans] = np.arange(chans.size)
    m = int(chans.size)
    row_bytes = (m + 7) // 8
    c1d = dense[r.c1[used]]
    c2d = dense[np.maximum(r.c2[used], 0)]
    code_pos = np.full(none, -1, np.int64)
    code_pos[used] = np.arange(used.size)
    bit = (np.uint8(1) << (7 - (np.arange(m) & 7)).astype(np.uint8)).astype(np.uint8)
    byte = np.arange(m) >> 3
    reach: list[npt.NDArray[np.uint8]] = []
    have: list[npt.NDArray[np.bool_]] = []
    out = np.zeros(uniq.shape[0], np.uint8)
    spent = 0
    for u in order.tolist():
        row = uniq[u]
        pos = code_pos[row[row < none]]
        a, b = c1d[pos], c2d[pos]
        nodes = np.unique(np.concatenate([a, b]))
        ia, ib = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
        k = 0
        while True:
            if k == len(reach):
                if k >= max_layers:
                    return None
                reach.append(np.zeros((m, row_bytes), np.uint8))
                have.append(np.zeros(used.size, np.bool_))
            spent += _FIRST_FIT_PATH_COST
            if have[k][pos].all():
                break
            rk = reach[k]
            sub = (rk[nodes[:, None], byte[nodes][None, :]] & bit[nodes][None, :]) > 0
            sub[ia, ib] = True
            if not _closes_cycle(sub):
                for x, y in zip(a.tolist(), b.tolist(), strict=True):
                    src = np.flatnonzero(rk[:, byte[x]] & bit[x])
                    src = np.append(src, x)
                    add = rk[y].copy()
                    add[byte[y]] |= bit[y]
                    rk[src] |= add
                    spent += src.size * row_bytes
                have[k][pos] = True
                break
            k += 1
        if spent > work:
            return None
        out[u] = k
    return out[inv]


def assign_layers(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    max_layers: int = 8,
    *,
    from_cas: bool = True,
    engine: str = "layered",
    g: SwitchGraph | None = None,
) -> Layers:
    """Layer (SL) of every (source row, LID) route so each layer's channel dependency graph is acyclic.

    ``from_cas`` counts only the routes that enter the fabric at a switch
    with a CA (what :func:`sm.analysis.creditflow.find_credit_loops` checks
    with ``from_cas=True``); other rows keep layer 0. Without it every
    switch is a source too. Raises :class:`LayeringError` (naming
    ``engine``) when more than ``max_layers`` layers would be needed.

    Work is bounded and deterministic: the routes making a turn of the
    cyclic core of the dependency graph are listed once, as their sequences
    of core turns; layering by channel orders (:func:`_by_order`) costs a
    few passes over them and at most one :func:`feedback_order` per layer
    and way, for at most ``max_layers`` layers. When that needs more than 2
    layers and a few dozen passes fit in :data:`CUT_WORK`, layering by cuts
    (:func:`_by_cuts`) is tried too, given up past :data:`CUT_WORK`; the
    fewer layers win (the cuts on a tie). ``g``: the fabric's :func:`switch_graph`, if already built.
    """
    g = g if g is not None else switch_graph(fabric)
    n = g.n
    layer = np.zeros((n, lids.max_lid + 1), np.uint8)
    if n == 0:
        return layer
    chan_id, ch_row, ch_peer = _channels(g)
    n_ports = g.nbr.shape[1]
    n_ch = int(ch_row.size)
    if n_ch == 0:
        return layer
    n_codes = n_ch * n_ports
    source = injecting_rows(fabric) if from_cas else np.ones(n, np.bool_)
    lid_ok = lids.owner_node >= 0
    codes = np.arange(n_codes, dtype=np.int64)
    c1_all = codes // n_ports
    c2_all = chan_id[ch_peer[c1_all], codes % n_ports]
    # The turns of the routes from ``source`` (marking the cells they pass, each once): only the routes
    # making a turn of their graph's cyclic core can ever move (a turn off it is on no cycle of any
    # layer, each layer's graph being part of it), and only LIDs with such a turn are walked.
    n_lid = lft.shape[1]
    b = _block_size(g)
    used_code = np.zeros(n_codes + 1, np.bool_)
    turns: list[tuple[_Ints, _Ints, npt.NDArray[np.bool_]]] = []
    for lid0 in range(0, n_lid, b):
        lid1 = min(lid0 + b, n_lid)
        flat_next, turn = _block_turns(g, lft, lid_ok, chan_id, lid0, lid1)
        seen = np.zeros(turn.size, np.bool_)
        front = (np.flatnonzero(source)[:, None] * (lid1 - lid0) + np.arange(lid1 - lid0)[None, :]).ravel()
        while front.size:
            seen[front] = True
            nxt = np.zeros(turn.size + 1, np.bool_)  # index -1: past the end
            nxt[flat_next[front]] = True
            front = np.flatnonzero(nxt[:-1] & ~seen)
        used_code[turn[seen]] = True
        turns.append((flat_next, turn, seen))
    used = np.flatnonzero(used_code[:n_codes])
    core = _peel_fixpoint(n_ch, c1_all[used], c2_all[used])
    if not core.any():
        return layer
    in_core = (c2_all >= 0) & core[c1_all] & core[np.maximum(c2_all, 0)]
    rel = np.zeros(n_lid, np.bool_)
    in_core_x = np.append(in_core, False)
    for lid0, (_, turn, seen) in zip(range(0, n_lid, b), turns, strict=True):
        rel[lid0 : lid0 + b] = (in_core_x[turn] & seen).reshape(n, -1).any(axis=0)
    cols = np.flatnonzero(rel)
    # Block by block (each dropped once walked): every LID's turns are known already. When most LIDs
    # matter, all are walked (the others list no path) rather than their turns computed again.
    if 2 * cols.size >= n_lid:
        cols = np.arange(n_lid)
        blocks = _blocks(g, lft, lid_ok, chan_id, _drain(turns))
    else:
        turns.clear()
        blocks = _blocks(g, np.ascontiguousarray(lft[:, cols]), lid_ok[cols], chan_id)
    hi, lo = np.maximum(ch_row, ch_peer), np.minimum(ch_row, ch_peer)
    r = _routes(blocks, source, in_core, c1_all, c2_all, n_ch, hi * n + lo)
    pl = _by_order(r, max_layers)
    # First fit, when the paths are few: often fewer layers than the orders (2 on a 4x4 torus routed in
    # dimension order, where the orders take 3). Measured never worse than the cuts, so the cuts run
    # only when the first fit does not (too many paths, past its budget or past max_layers).
    fit: npt.NDArray[np.uint8] | None = None
    if pl is None or int(pl.max(initial=0)) > 1:
        fit = _first_fit(r, max_layers, FIRST_FIT_WORK)
        if fit is not None and (pl is None or int(fit.max(initial=0)) < int(pl.max(initial=0))):
            pl = fit
    # Cuts recount the layer's paths after every round: tried only if a few dozen recounts fit.
    if (
        fit is None
        and (pl is None or int(pl.max(initial=0)) > 1)
        and r.size * len(r.steps) * CUT_MIN_PASSES <= CUT_WORK
    ):
        cells = n * np.unique(r.col).size
        r.work = 0
        cut = _by_cuts(r, max_layers, max(2, RECOUNT_CELLS // max(cells, 1)), CUT_WORK)
        if cut is not None and (pl is None or int(cut.max(initial=0)) <= int(pl.max(initial=0))):
            pl = cut
    if pl is None:
        raise _too_many(engine, max_layers)
    layer[r.row, cols[r.col]] = pl
    return layer


CANDIDATE_HOSTS = 4096
"""Up to this many CA ports with a LID, the engine also tries :func:`lowest_port_lft` beside
:func:`balanced_lft` and keeps the better of the two by :func:`pattern_balance` (fewer layers on a
tie); above it, the balanced routes alone (the patterns cost ``O(hosts^2)``), the lowest-port ones
only when the balanced cannot be layered on ``max_layers``."""

BALANCE_SHIFTS = 256
"""Shift permutations :func:`pattern_balance` evaluates (all of them up to this many + 1 hosts, else a
sample drawn with a fixed seed)."""

BALANCE_PERMUTATIONS = 32
"""Random permutations :func:`pattern_balance` evaluates (fixed seeds)."""


def pattern_balance(fabric: Fabric, lids: LidMap, lft: Lft) -> tuple[int, float]:
    """Worst and mean worst link load of the routes over shift and random permutations of the hosts.

    Each pattern's most loaded directed link (leaving a switch) is taken; the result is the worst of
    those and their mean over :data:`BALANCE_SHIFTS` shifts and :data:`BALANCE_PERMUTATIONS` random
    permutations (seeds from 1,000 on).
    """
    n = int(hosts(fabric, lids).shape[0])
    if n < 2:
        return 0, 0.0
    q = shift_quality(fabric, lids, lft, max_shifts=BALANCE_SHIFTS if n - 1 > BALANCE_SHIFTS else None, seed=1)
    sw = fabric.switches
    perms = [
        int(link_loads(fabric, lids, lft, random_permutation(fabric, lids, 1000 + s).pairs())[sw].max())
        for s in range(BALANCE_PERMUTATIONS)
    ]
    worst = max(q.max_load, *perms)
    mean = (q.mean_max_load * q.shifts + sum(perms)) / (q.shifts + len(perms))
    return worst, float(mean)


def layers_used(layers: Layers | None) -> int:
    """Number of layers (VLs) a layer table uses: its highest layer + 1."""
    return 1 if layers is None or layers.size == 0 else int(layers.max()) + 1


@register("layered")
class LayeredEngine:
    """Balanced shortest paths over as few VL layers as keep every layer free of credit loops."""

    name = "layered"
    layers_checked = True
    """Its layers are credit-loop free by construction: :func:`sm.routing.base.route` need not check."""

    def __init__(self, options: RoutingOptions | None = None) -> None:
        self.options = options or RoutingOptions()

    def compute(self, fabric: Fabric, lids: LidMap) -> Routes:
        g = switch_graph(fabric)
        max_layers = self.options.max_layers
        lft = balanced_lft(fabric, lids, g)
        if _ca_lids(fabric, lids) > CANDIDATE_HOSTS:
            # Large: the balanced routes; the lowest-port ones only if those cannot be layered.
            try:
                layers = assign_layers(fabric, lids, lft, max_layers, from_cas=True, engine=self.name, g=g)
            except LayeringError as e:
                low = lowest_port_lft(fabric, lids, g)
                if np.array_equal(low, lft):
                    raise
                try:
                    layers = assign_layers(fabric, lids, low, max_layers, from_cas=True, engine=self.name, g=g)
                except LayeringError:
                    raise e from None
                lft = low
            return Routes(lft, layers if layers.any() else None)
        cands = [lft]
        low = lowest_port_lft(fabric, lids, g)
        if not np.array_equal(low, lft):
            cands.append(low)
        best: tuple[tuple[int, int, float, int], Lft, Layers] | None = None
        error: LayeringError | None = None
        for cand in cands:
            try:
                layers = assign_layers(fabric, lids, cand, max_layers, from_cas=True, engine=self.name, g=g)
            except LayeringError as e:
                error = error or e
                continue
            if len(cands) == 1:
                return Routes(cand, layers if layers.any() else None)
            worst, mean = pattern_balance(fabric, lids, cand)
            deps = channel_dependency_graph(fabric, lids, cand, from_cas=True).n_dependencies
            key = (worst, layers_used(layers), mean, deps)
            if best is None or key < best[0]:
                best = (key, cand, layers)
        if best is None:
            assert error is not None
            raise error
        _, lft, layers = best
        return Routes(lft, layers if layers.any() else None)
