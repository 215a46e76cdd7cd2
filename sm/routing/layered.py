"""Layered routing: balanced shortest paths spread over virtual-lane layers, deadlock-free on any topology.

DFSSSP-style (Domke, Hoefler, Nagel, IPDPS 2011), in two steps:

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
   switch's route. All paths start in layer 0. A layer's channel dependency
   graph is built with, on each dependency, the number of its paths that
   make that turn; while it has a cycle, the lightest dependency of a cycle
   is marked (many disjoint cycles per numpy round: each vertex keeps its
   lightest dependency, the cycles of that functional graph are found by
   pointer jumping). Once the unmarked dependencies are acyclic, every path
   through a marked one moves to the next layer, so the layer left behind
   is acyclic; the next layer is treated the same way. Layer ``k`` is SL
   ``k`` and VL ``k``. A fabric that needs more layers than
   ``RoutingOptions.max_layers`` (the links' operational VLs) is refused
   with a :class:`RoutingError` saying how many it has.

Everything is per destination LID in blocks of LIDs, as numpy arrays over
switch rows: no per-path Python objects.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.model import Fabric, NodeType
from sm.lidmap import LidMap
from sm.routing._hops import UNREACHABLE, SwitchGraph, destinations, hop_matrix, switch_graph
from sm.routing.base import NO_ROUTE, Layers, Lft, Routes, RoutingError, RoutingOptions, empty_lft, register

__all__ = ["LayeredEngine", "LayeringError", "assign_layers", "balanced_lft", "injecting_rows"]

_CELLS_PER_BLOCK = 1 << 22
"""(row, LID) cells handled at once while layering (bounds the temporary arrays)."""


RECOUNT_CELLS = 1 << 26
"""Budget of (row, LID) cells read per layer for recounts: a layer gets ``max(2, RECOUNT_CELLS /
cells)`` rounds of disjoint-cycle cuts, each followed by a recount of its paths (DFSSSP recounts after
every cut; a round cuts a set of disjoint cycles at once). Cycles left after them are cut in one go."""

FUNCTIONAL_ROUNDS = 64
"""In that last go: rounds of disjoint-cycle cuts before the rest is cut by an order."""


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
    count: npt.NDArray[np.int64]
    """Candidates of each row."""
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
    # Compact each row's candidate ports to the left, lowest port first.
    r, p = np.nonzero(cand)
    pos = np.cumsum(cand, axis=1)[r, p] - 1
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
        out.append(
            _Level(
                rows, pl, nxt[rows, :k], rows[:, None] * (n_ports + 1) + pl, count[rows], np.arange(rows.size) * k
            )
        )
    return out


def _ca_ports_per_row(fabric: Fabric, lids: LidMap, g: SwitchGraph) -> npt.NDArray[np.float64]:
    """CA end ports with a LID entering the fabric at each row: the traffic a row sources."""
    ep = np.argwhere(lids.base > 0).astype(np.int64)
    ep = ep[fabric.node_type[ep[:, 0]] == NodeType.CA]
    up = fabric.up_mask()[ep[:, 0], ep[:, 1]]
    ep = ep[up]
    row = g.row_of[fabric.peer_node[ep[:, 0], ep[:, 1]].astype(np.int64)]
    row = row[row >= 0]
    return np.bincount(row, minlength=g.n).astype(np.float64)


def injecting_rows(fabric: Fabric, g: SwitchGraph | None = None) -> npt.NDArray[np.bool_]:
    """Switch rows with a CA port cabled (LinkUp) to them: where CA traffic enters the fabric."""
    g = g if g is not None else switch_graph(fabric)
    up = fabric.up_mask()[g.nodes]
    peer = np.where(up, fabric.peer_node[g.nodes], 0)
    out: npt.NDArray[np.bool_] = (up & (fabric.node_type[peer] == NodeType.CA)).any(axis=1)
    return out


def _route_one(
    levels: list[_Level],
    w: npt.NDArray[np.float64],
    src_weight: npt.NDArray[np.float64] | None,
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
    if src_weight is None:
        return
    flow = src_weight.copy()
    for lv, fi in zip(reversed(levels), reversed(picked), strict=True):
        f = flow[lv.rows]
        w[lv.widx.ravel()[fi]] += f
        flow += np.bincount(lv.nbr.ravel()[fi], weights=f, minlength=n)


def balanced_lft(fabric: Fabric, lids: LidMap, g: SwitchGraph | None = None, *, batch: int | None = None) -> Lft:
    """Shortest paths balanced by link weights updated after each CA LID (see the module docstring).

    ``batch`` LIDs of one destination switch are routed at once (default 1, DFSSSP's order; measured:
    batches are faster but balance a fat-tree far worse): within a batch the weights are those before it,
    and the ``j``-th LID takes, at each switch, the ``j``-th cheapest of its shortest-path ports
    (modulo their number), so a batch spreads over equal choices as the sequential update would.
    """
    g = g if g is not None else switch_graph(fabric)
    lft = empty_lft(fabric, lids)
    n = g.n
    if n == 0:
        return lft
    if batch is None:
        batch = 1
    dist = hop_matrix(g.nbr)
    dist_t = np.ascontiguousarray(dist.T)  # [d, x]: hops from x to d
    n_ports = g.nbr.shape[1]
    dst = destinations(fabric, lids, g)
    ok = dst.row >= 0
    lid_all, row_all, egress_all, counted_all = dst.lid[ok], dst.row[ok], dst.egress[ok], dst.counted[ok]
    # CA LIDs in LID order, grouped by the switch they hang on (in order of its first CA LID); a
    # switch's own LIDs, which add no weight, right after its CA LIDs, so each switch's shortest-path
    # DAG is built once.
    first = np.full(n, np.iinfo(np.int64).max, np.int64)
    pos = np.arange(row_all.size)
    np.minimum.at(first, row_all, np.where(counted_all, pos, row_all.size + pos))
    order = np.lexsort((np.arange(row_all.size), ~counted_all, first[row_all]))
    lid_all, row_all, egress_all, counted_all = lid_all[order], row_all[order], egress_all[order], counted_all[order]
    src_weight = _ca_ports_per_row(fabric, lids, g)
    w = np.zeros(n * (n_ports + 1), np.float64)
    w.reshape(n, n_ports + 1)[:, n_ports] = np.inf
    w_none = w.copy()
    lft_t = np.ascontiguousarray(lft.T)
    # Runs of LIDs delivered from the same switch, cut into batches.
    cut = np.r_[True, row_all[1:] != row_all[:-1]]
    run_start = np.maximum.accumulate(np.where(cut, np.arange(row_all.size), 0))
    cut |= (np.arange(row_all.size) - run_start) % batch == 0
    starts = np.flatnonzero(cut)
    ends = np.r_[starts[1:], row_all.size]
    cache: dict[int, list[_Level]] = {}
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        d = int(row_all[a])
        levels = cache.get(d)
        if levels is None:
            levels = _levels(g.nbr, dist_t[d])
            if len(cache) > 256:
                cache.clear()
            cache[d] = levels
        nb_ = b - a
        if nb_ == 1:
            if counted_all[a]:
                _route_one(levels, w, src_weight, lft_t[lid_all[a]], d, n)
            else:  # a switch LID: lowest-port shortest paths, as few distinct turns as possible
                _route_one(levels, w_none, None, lft_t[lid_all[a]], d, n)
            lft_t[lid_all[a], d] = egress_all[a]
            continue
        j = np.arange(nb_, dtype=np.int64)[:, None]
        cost = np.full((nb_, n + 1), np.inf)
        cost[:, d] = 0.0
        col = np.full((nb_, n), NO_ROUTE, np.uint8)
        chosen = []
        for lv in levels:
            c = w[lv.widx][None, :, :] + cost[:, lv.nbr]  # [batch, rows, k]
            if nb_ == 1:
                pick = c.argmin(axis=2)
            else:
                rank = np.argsort(c, axis=2, kind="stable")
                pick = np.take_along_axis(rank, (j % lv.count[None, :])[:, :, None], axis=2)[:, :, 0]
            cb = np.take_along_axis(c, pick[:, :, None], axis=2)[:, :, 0]
            cost[:, lv.rows] = cb
            port = lv.ports[np.arange(lv.rows.size)[None, :], pick]
            col[:, lv.rows] = port
            chosen.append((lv.rows, port, lv.nbr[np.arange(lv.rows.size)[None, :], pick]))
        col[:, d] = egress_all[a:b]
        lft_t[lid_all[a:b]] = col
        weigh = counted_all[a:b]
        if weigh.any():
            flow = np.repeat(src_weight[None, :], nb_, axis=0)
            flow[~weigh] = 0.0
            base = np.arange(nb_, dtype=np.int64)[:, None] * n
            for rows, port, nxt in reversed(chosen):
                f = flow[:, rows]
                np.add.at(w, rows[None, :] * (n_ports + 1) + port, f)
                flow += np.bincount((base + nxt).ravel(), weights=f.ravel(), minlength=nb_ * n).reshape(nb_, n)
    return np.ascontiguousarray(lft_t.T)


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


def _blocks(
    g: SwitchGraph, lft: Lft, lid_ok: npt.NDArray[np.bool_], chan_id: npt.NDArray[np.int64]
) -> Iterator[_Paths]:
    n = g.n
    n_ports = g.nbr.shape[1]
    n_lid = lft.shape[1]
    b = max(64, _CELLS_PER_BLOCK // max(n, 1))
    nbr256 = np.full((n, 256), -1, np.int64)
    nbr256[:, :n_ports] = g.nbr
    rows = np.arange(n, dtype=np.int64)[:, None]
    for lid0 in range(0, n_lid, b):
        lid1 = min(lid0 + b, n_lid)
        bl = lid1 - lid0
        part = lft[:, lid0:lid1]
        nx = nbr256[rows, part]
        nx[:, ~lid_ok[lid0:lid1]] = -1
        cols = np.arange(bl, dtype=np.int64)[None, :]
        flat_next = np.where(nx >= 0, nx * bl + cols, -1).ravel()
        c_in = chan_id[rows, part].ravel()
        has = flat_next >= 0
        out_next = np.full(flat_next.size, 255, np.int64)
        out_next[has] = part.ravel()[flat_next[has]]
        turn = np.full(flat_next.size, -1, np.int64)
        nxt_row = flat_next // bl
        chan_out = np.full(flat_next.size, -1, np.int64)
        chan_out[has] = chan_id[nxt_row[has], out_next[has]]
        t = has & (chan_out >= 0)
        turn[t] = c_in[t] * n_ports + out_next[t]
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
            lid0, lid1, flat_next.astype(np.int32), turn.astype(np.int32), [lv.astype(np.int32) for lv in levels]
        )


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


def _layer_weights(
    blocks: list[_Paths], layer: Layers, source: npt.NDArray[np.bool_], k: int, n_codes: int
) -> npt.NDArray[np.float64]:
    """Paths of layer ``k`` making each turn (indexed by turn code)."""
    weight = np.zeros(n_codes, np.float64)
    for bp in blocks:
        part = layer[:, bp.lid0 : bp.lid1]
        active = ((part == k) & source[:, None]).ravel()
        if not active.any():
            continue
        cnt = active.astype(np.float64)
        size = cnt.size
        for cells in reversed(bp.depth[1:]):
            tgt = bp.nxt[cells]
            cnt += np.bincount(tgt, weights=cnt[cells], minlength=size)
        t = bp.turn >= 0
        weight += np.bincount(bp.turn[t], weights=cnt[t], minlength=n_codes)
    return weight


def _move(
    blocks: list[_Paths], layer: Layers, source: npt.NDArray[np.bool_], k: int, bad_code: npt.NDArray[np.bool_]
) -> int:
    """Move the paths of layer ``k`` that make a turn in ``bad_code`` to layer ``k + 1``; how many moved."""
    moved = 0
    for bp in blocks:
        part = layer[:, bp.lid0 : bp.lid1]
        bad = np.zeros(bp.turn.size, np.bool_)
        t = bp.turn >= 0
        bad[t] = bad_code[bp.turn[t]]
        for cells in bp.depth[1:]:
            bad[cells] |= bad[bp.nxt[cells]]
        sel = bad.reshape(part.shape) & (part == k) & source[:, None]
        moved += int(sel.sum())
        part[sel] = k + 1
    return moved


def _topo_position(n: int, src: npt.NDArray[np.int64], dst: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """A topological position of every vertex of an acyclic graph (Kahn levels, then index)."""
    level = np.zeros(n, np.int64)
    indeg = np.bincount(dst, minlength=n)
    order = np.argsort(src, kind="stable")
    s_sorted, d_sorted = src[order], dst[order]
    start = np.searchsorted(s_sorted, np.arange(n + 1))
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
        frontier = t[indeg[t] == 0]
    rank = np.empty(n, np.int64)
    rank[np.lexsort((np.arange(n), level))] = np.arange(n)
    return rank


def _return(
    blocks: list[_Paths], layer: Layers, source: npt.NDArray[np.bool_], k: int, forward: npt.NDArray[np.bool_]
) -> int:
    """Move paths of layer ``k + 1`` whose every turn is in ``forward`` back to layer ``k``; how many."""
    back = 0
    for bp in blocks:
        part = layer[:, bp.lid0 : bp.lid1]
        bad = np.zeros(bp.turn.size, np.bool_)
        t = bp.turn >= 0
        bad[t] = ~forward[bp.turn[t]]
        for cells in bp.depth[1:]:
            bad[cells] |= bad[bp.nxt[cells]]
        sel = ~bad.reshape(part.shape) & (part == k + 1) & source[:, None]
        back += int(sel.sum())
        part[sel] = k
    return back


def assign_layers(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    max_layers: int = 8,
    *,
    from_cas: bool = True,
    engine: str = "layered",
) -> Layers:
    """Layer (SL) of every (source row, LID) route so each layer's channel dependency graph is acyclic.

    ``from_cas`` counts only the routes that enter the fabric at a switch
    with a CA (what :func:`sm.analysis.creditflow.find_credit_loops` checks
    with ``from_cas=True``); other rows keep layer 0. Without it every
    switch is a source too. Raises :class:`LayeringError` (naming
    ``engine``) when more than ``max_layers`` layers would be needed.
    """
    g = switch_graph(fabric)
    n = g.n
    layer = np.zeros((n, lids.max_lid + 1), np.uint8)
    if n == 0:
        return layer
    chan_id, ch_row, ch_peer = _channels(g)
    n_ports = g.nbr.shape[1]
    n_ch = int(ch_row.size)
    n_codes = max(n_ch * n_ports, 1)
    source = injecting_rows(fabric, g) if from_cas else np.ones(n, np.bool_)
    lid_ok = lids.owner_node >= 0
    codes = np.arange(n_codes, dtype=np.int64)
    c1_all = codes // n_ports
    # First pass, block by block: the turns of all routes, and the LIDs whose routes make a turn
    # of the cyclic core. Only those can ever move: a turn off the core is on no cycle of layer 0,
    # which only loses paths, and every later layer holds moved paths only.
    weight = np.zeros(n_codes, np.float64)
    for bp in _blocks(g, lft, lid_ok, chan_id):
        weight += _layer_weights([bp], layer, source, 0, n_codes)
    used = np.flatnonzero(weight > 0)
    c1 = c1_all[used]
    core = _peel_fixpoint(n_ch, c1, chan_id[ch_peer[c1], used % n_ports])
    if not core.any():
        return layer
    in_core = np.zeros(n_codes, np.bool_)
    in_core[codes[core[c1_all] & core[np.maximum(chan_id[ch_peer[c1_all], codes % n_ports], 0)]]] = True
    rel = np.zeros(lids.max_lid + 1, np.bool_)
    for bp in _blocks(g, lft, lid_ok, chan_id):
        t = bp.turn >= 0
        hit = np.zeros(bp.turn.size, np.bool_)
        hit[t] = in_core[bp.turn[t]]
        rel[bp.lid0 : bp.lid1] |= hit.reshape(n, bp.lid1 - bp.lid0).any(axis=0)
    cols = np.flatnonzero(rel)
    sub = np.zeros((n, cols.size), np.uint8)
    _layer_loop(g, lft[:, cols], sub, source, max_layers, engine, chan_id, ch_peer)
    layer[:, cols] = sub
    return layer


def _layer_loop(
    g: SwitchGraph,
    lft: Lft,
    layer: Layers,
    source: npt.NDArray[np.bool_],
    max_layers: int,
    engine: str,
    chan_id: npt.NDArray[np.int64],
    ch_peer: npt.NDArray[np.int64],
) -> None:
    """Layer the routes of ``lft``'s columns (every one a LID in use) in place; see :func:`assign_layers`."""
    n_ports = g.nbr.shape[1]
    n_ch = int(np.count_nonzero(chan_id >= 0))
    n_codes = max(n_ch * n_ports, 1)
    codes = np.arange(n_codes, dtype=np.int64)
    c1_all = codes // n_ports
    blocks = list(_blocks(g, lft, np.ones(lft.shape[1], np.bool_), chan_id))
    k = 0
    recounts = 0
    budget = max(2, RECOUNT_CELLS // max(lft.size, 1))
    counted: npt.NDArray[np.float64] | None = None
    while True:
        weight = counted if counted is not None else _layer_weights(blocks, layer, source, k, n_codes)
        counted = None
        used = np.flatnonzero(weight > 0)
        if used.size == 0:
            return
        c1 = c1_all[used]
        c2 = chan_id[ch_peer[c1], used % n_ports]
        cut = break_cycles(n_ch, c1, c2, weight[used], rounds=1 if recounts < budget else None)
        recounts += 1
        if not cut.any():
            k += 1
            recounts = 0
            continue
        if k + 1 >= max_layers:
            raise LayeringError(
                f"{engine}: routes need more than {max_layers} VL layer{'s' if max_layers != 1 else ''} "
                f"to be deadlock-free (links allow {max_layers})",
                max_layers,
            )
        bad_code = np.zeros(n_codes, np.bool_)
        bad_code[used[cut]] = True
        _move(blocks, layer, source, k, bad_code)
        weight = _layer_weights(blocks, layer, source, k, n_codes)
        used = np.flatnonzero(weight > 0)
        c1 = c1_all[used]
        c2 = chan_id[ch_peer[c1], used % n_ports]
        if not _peel_fixpoint(n_ch, c1, c2).any():
            # The layer is acyclic: give back the moved paths whose turns all follow its order.
            pos = _topo_position(n_ch, c1, c2)
            forward = pos[c1_all] < pos[chan_id[ch_peer[c1_all], codes % n_ports]]
            _return(blocks, layer, source, k, forward)
            counted = None
        else:
            counted = weight


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
        lft = balanced_lft(fabric, lids, g)
        layers = assign_layers(fabric, lids, lft, self.options.max_layers, from_cas=True, engine=self.name)
        return Routes(lft, layers if layers.any() else None)
