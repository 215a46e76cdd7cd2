"""Fat-tree routing (ftree), in the manner of Zahavi et al. and OpenSM's ftree engine.

Switches are ranked from the leaves (switches with a CA) up by breadth-first
search; the top rank holds the roots (or ``RoutingOptions.root_guids``).
Every inter-switch link must join adjacent ranks, otherwise the fabric is
not a fat-tree (a ring, a torus, two leaves cabled together) and the engine
refuses. A switch above the top rank (say an aggregation switch that lost
every leaf link) is folded back below it when the rank it would add joins
no pair of leaves that the ranks below leave apart.

Routes to CA LIDs are up*/down*: a switch with a downward path to the
destination goes down, any other climbs towards one that has, along the
fewest hops. Up ports follow d-mod-k. CA ports are numbered leaf by leaf
(leaves in node order, then leaf port: :func:`host_order`); at rank ``h``
LID ``d`` takes up slot ``(d // stride_h + slot below) mod W_h``, ``W_h``
the up ports of a complete rank-``h`` switch and ``stride_h`` the product
of ``W`` below. A port's slot is its port number modulo ``W_h`` when that
is one-to-one on the switch (cabling by port number, as real fat-trees and
our generators have it), else its rank among the up ports. On a complete
fat-tree every shift permutation (host ``i`` to host ``i + s``) then
crosses each link at most once. With LMC > 0 the ``2**lmc`` LIDs of a port
start at consecutive slots and so take different paths.

On a degraded tree nothing is black-holed and the load stays even: a LID
whose slot is missing, or leads to a switch with no shortest way on, keeps
its place when it can and otherwise moves to a good slot (displaced LIDs
of one pair to distinct ones); where a parent has lost most of its way on,
its children choose one level ahead. Down ports are unique in a k-ary
n-tree; parallel cables are taken in turn.

A fat-tree has no up*/down* path between switches that share no
descendant (two cores, aggregation switches of two planes, and on a
degraded tree some switch and leaf), so such pairs, which only a switch's
own traffic uses, go up*/down* to one hub leaf and from there up*/down* on.
All their down-to-up turns lie on the way through the hub, where they line
up instead of closing a credit loop; CA traffic never turns. Only when some
leaf has no up*/down* path to another leaf does the engine refuse (the tree
is too degraded: its CA traffic would have to turn), so that the chain
falls back to up/down routing.

All work is per rank on ``[switch, switch]`` matrices and per block of
switches on ``[switch, LID]`` rows; no Python loop runs per LID.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.model import Fabric, NodeType
from fabric.shape import components
from sm.lidmap import LidMap
from sm.routing.base import NO_ROUTE, Lft, RoutingError, RoutingOptions, empty_lft, register

__all__ = ["FtreeRouting", "ftree_levels", "host_order"]

_UPFULL = 254
"""``fx`` cell: every up slot is good, the slot follows the destination's d-mod-k digit."""
_UPMASK = 253
"""``fx`` cell: only the up slots in the pair's ``upmask`` lead on; the LID's digit picks among them."""
_DNMULTI = 252
"""``fx`` cell: several down ports lead to the destination (parallel cables); LIDs take them in turn."""
_INF = 255
"""Hop-table entry for "no path"."""

_CELLS = 1 << 22
"""Work-array size (cells) a block of rows or links is cut to."""

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class _Graph:
    """Switches as LFT rows and the CA ports hanging on them."""

    nodes: IntArray
    row_of: IntArray
    nbr: IntArray
    """``[row, port]``: row of the switch cabled (LinkUp) there, -1 for none."""
    ca_node: IntArray
    ca_port: IntArray
    ca_row: IntArray
    """Row of the switch each CA port is cabled to; CA ports in leaf-major order."""
    ca_exit: IntArray
    """Port of that switch leading to the CA port."""

    @property
    def n(self) -> int:
        return int(self.nodes.size)


def _graph(fabric: Fabric) -> _Graph:
    """Switch rows, their LinkUp switch neighbours and the CA ports on them, from the fabric's arrays."""
    sw = fabric.switches.astype(np.int64)
    row_of = np.full(fabric.n_nodes, -1, np.int64)
    row_of[sw] = np.arange(sw.size)
    up = fabric.up_mask()
    peer = np.where(up, fabric.peer_node, 0).astype(np.int64)
    prow = np.where(up[sw], row_of[peer[sw]], -1)
    prow[:, 0] = -1
    is_ca = fabric.node_type == NodeType.CA
    cn, cp = np.nonzero(up & is_ca[:, None])
    srow = row_of[peer[cn, cp]]
    keep = srow >= 0
    cn, cp, srow = cn[keep], cp[keep], srow[keep]
    exit_port = fabric.peer_port[cn, cp].astype(np.int64)
    order = np.lexsort((exit_port, srow))
    return _Graph(sw, row_of, prow, cn[order], cp[order], srow[order], exit_port[order])


def host_order(fabric: Fabric) -> IntArray:
    """CA end ports (node, port) in the order ftree numbers destinations: leaf by leaf, then leaf port.

    Leaves are taken in node order. A shift permutation over this list
    (``i -> i + s``) is contention-free on a complete fat-tree.
    """
    g = _graph(fabric)
    return np.stack([g.ca_node, g.ca_port], axis=1)


# -- ranking ------------------------------------------------------------------------------------------


def _bfs_from(nbr: IntArray, sources: IntArray) -> IntArray:
    """Hop distance of every row from the nearest source row over ``nbr``; -1 where unreachable."""
    dist = np.full(nbr.shape[0], -1, np.int64)
    dist[sources] = 0
    frontier = np.unique(sources)
    d = 0
    while frontier.size:
        d += 1
        nb = nbr[frontier].ravel()
        nb = nb[nb >= 0]
        nb = np.unique(nb[dist[nb] < 0])
        dist[nb] = d
        frontier = nb
    return dist


def _links(nbr: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Every directed inter-switch link as (row, port, peer row), sorted by row then port."""
    u, p = np.nonzero(nbr >= 0)
    return u.astype(np.int64), p.astype(np.int64), nbr[u, p]


def _slot_table(u: IntArray, t: IntArray, n: int) -> IntArray:
    """Links (row ``u`` to row ``t``, sorted by ``u``) as ``[row, j]`` -> ``t``, padded with ``n``."""
    deg = np.bincount(u, minlength=n)
    table = np.full((n, max(int(deg.max()) if n else 0, 1)), n, np.int64)
    table[u, np.arange(u.size) - np.searchsorted(u, u)] = t
    return table


def _row_blocks(rows: IntArray, cells_per_row: int) -> Iterator[IntArray]:
    """``rows`` cut into blocks of about ``_CELLS`` work cells."""
    per = max(1, _CELLS // max(cells_per_row, 1))
    for i in range(0, rows.size, per):
        yield rows[i : i + per]


def _leaf_closure(nbr: IntArray, lev: IntArray, leaves: IntArray) -> npt.NDArray[np.bool_]:
    """``[row, j]``: leaf ``leaves[j]`` lies below (or is) the row, moving down one rank per hop."""
    n = nbr.shape[0]
    below = np.zeros((n + 1, leaves.size), np.bool_)
    below[leaves, np.arange(leaves.size)] = True
    u, _, t = _links(nbr)
    down = (lev[u] >= 0) & (lev[t] == lev[u] - 1)
    child = _slot_table(u[down], t[down], n)
    top = int(lev.max()) if lev.size else 0
    for h in range(1, top + 1):
        for rows in _row_blocks(np.flatnonzero(lev == h), leaves.size * child.shape[1]):
            acc = below[rows]
            for j in range(child.shape[1]):
                acc |= below[child[rows, j]]
            below[rows] = acc
    return below[:n]


def _top_redundant(nbr: IntArray, d: IntArray, h: int, leaves: IntArray) -> bool:
    """True if the switches ranked ``h`` and above join no pair of leaves the lower ranks leave apart."""
    below = _leaf_closure(nbr, d, leaves)
    hi = d >= h
    lo = (d >= 1) & (d < h)
    if not hi.any() or not lo.any():
        return False
    # Quick answer: a top switch over leaves that the lower ranks do not even connect.
    u, _, t = _links(nbr)
    keep = (d[u] >= 0) & (d[u] < h) & (d[t] >= 0) & (d[t] < h)
    lab = components(nbr.shape[0], u[keep], t[keep])[leaves]
    dh = below[hi]
    some = dh.any(axis=1)
    lo_lab = np.where(dh, lab, np.iinfo(np.int64).max).min(axis=1)
    hi_lab = np.where(dh, lab, -1).max(axis=1)
    if (some & (lo_lab != hi_lab)).any():
        return False
    lo_f = below[lo].astype(np.float32)
    hi_f = dh.astype(np.float32)
    covered = (lo_f.T @ lo_f) > 0
    np.fill_diagonal(covered, True)
    joined = (hi_f.T @ hi_f) > 0
    return not bool((joined & ~covered).any())


def _rank(fabric: Fabric, g: _Graph, root_guids: tuple[int, ...]) -> tuple[IntArray, int]:
    """Level of every row (0 = leaves, -1 unranked) and the top level."""
    if g.n == 0:
        raise RoutingError("ftree: the fabric has no switches")
    leaves = np.unique(g.ca_row)
    if leaves.size == 0:
        raise RoutingError("ftree: no CA is cabled to a switch, so there are no leaves: not a fat-tree")
    d = _bfs_from(g.nbr, leaves)
    u, _, t = _links(g.nbr)
    flat = (d[u] >= 0) & (d[u] == d[t])
    if flat.any():
        i = int(np.flatnonzero(flat)[0])
        a, b = int(g.nodes[u[i]]), int(g.nodes[t[i]])
        raise RoutingError(
            f"ftree: not a fat-tree: switches {fabric.names[a]!r} and {fabric.names[b]!r} are linked "
            f"at the same rank {int(d[u[i]])} above the leaves"
        )
    if root_guids:
        rows = []
        for guid in root_guids:
            try:
                node = fabric.by_guid(int(guid))
            except KeyError:
                raise RoutingError(f"ftree: root GUID {int(guid):#018x} is not a node of the fabric") from None
            if g.row_of[node] < 0:
                raise RoutingError(f"ftree: root GUID {int(guid):#018x} is {fabric.names[node]!r}, not a switch")
            rows.append(int(g.row_of[node]))
        rr = np.asarray(rows, np.int64)
        ranks = np.unique(d[rr])
        if ranks.size != 1 or ranks[0] < 0:
            detail = ", ".join(f"{fabric.names[int(g.nodes[r])]}={int(d[r])}" for r in rr.tolist())
            raise RoutingError(f"ftree: root switches are not all at one rank above the leaves ({detail})")
        top = int(ranks[0])
        if top == 0 and int(d.max()) > 0:
            raise RoutingError("ftree: the root switches given are leaves (they have CAs)")
    else:
        top = int(d.max())
        while top >= 3 and _top_redundant(g.nbr, d, top, leaves):
            top -= 1
    lev = d.copy()
    if top > 0:
        # Fold ranks above the top back down (a triangle wave keeps neighbours one rank apart).
        ph = d % (2 * top)
        lev = np.where(d >= 0, np.where(ph <= top, ph, 2 * top - ph), -1)
    return lev, top


def ftree_levels(fabric: Fabric, root_guids: tuple[int, ...] = ()) -> IntArray:
    """Per node: the fat-tree level ftree gives a switch (0 = leaf), -1 for CAs and unranked switches.

    Raises :class:`RoutingError` when the fabric is not a fat-tree.
    """
    g = _graph(fabric)
    lev, _ = _rank(fabric, g, tuple(root_guids))
    out = np.full(fabric.n_nodes, -1, np.int64)
    out[g.nodes] = lev
    return out


# -- per-rank tables ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tree:
    """Levels, and every switch's up slots and down ports."""

    lev: IntArray
    top: int
    width: IntArray
    """``W_h``: up slots of a complete switch of level ``h`` (0 at the top)."""
    stride: IntArray
    """``stride_h``: product of ``W`` below level ``h``."""
    n_up: IntArray
    up_port: npt.NDArray[np.uint8]
    """``[row, slot]``: port of that up slot, 255 where empty."""
    up_parent: IntArray
    """``[row, slot]``: row the up slot leads to, -1 where empty."""
    n_down: IntArray
    dn_port: npt.NDArray[np.uint8]
    """``[row, j]``: ``j``-th down port in port order, 255 past the end."""
    dn_child: IntArray


def _tables(g: _Graph, lev: IntArray, top: int) -> _Tree:
    """Split the links into up and down by level; give up ports their d-mod-k slots."""
    n = g.n
    u, p, t = _links(g.nbr)
    ranked = (lev[u] >= 0) & (lev[t] >= 0)
    is_up = ranked & (lev[t] == lev[u] + 1)
    is_dn = ranked & (lev[t] == lev[u] - 1)
    up_u, up_p, up_t = u[is_up], p[is_up], t[is_up]
    dn_u, dn_p, dn_t = u[is_dn], p[is_dn], t[is_dn]
    n_up = np.bincount(up_u, minlength=n).astype(np.int64)
    n_down = np.bincount(dn_u, minlength=n).astype(np.int64)
    width = np.zeros(top + 1, np.int64)
    for h in range(top):
        on = lev == h
        width[h] = int(n_up[on].max()) if on.any() else 0
    stride = np.ones(top + 1, np.int64)
    for h in range(top):
        stride[h + 1] = stride[h] * max(int(width[h]), 1)
    wmax = max(int(width.max()), 1)
    # Up slots: port number modulo W_h where one-to-one on the switch, else rank among its up ports.
    dense = np.arange(up_u.size) - np.searchsorted(up_u, up_u)
    mod = up_p % np.maximum(width[np.maximum(lev[up_u], 0)], 1)
    clash = np.zeros(n, np.bool_)
    if up_u.size:
        uniq, cnt = np.unique(up_u * 128 + mod, return_counts=True)
        clash[uniq[cnt > 1] // 128] = True
    slot = np.where(clash[up_u], dense, mod)
    up_port = np.full((n, wmax), NO_ROUTE, np.uint8)
    up_parent = np.full((n, wmax), -1, np.int64)
    up_port[up_u, slot] = up_p
    up_parent[up_u, slot] = up_t
    dmax = max(int(n_down.max()) if n else 0, 1)
    dn_j = np.arange(dn_u.size) - np.searchsorted(dn_u, dn_u)
    dn_port = np.full((n, dmax), NO_ROUTE, np.uint8)
    dn_child = np.full((n, dmax), -1, np.int64)
    dn_port[dn_u, dn_j] = dn_p
    dn_child[dn_u, dn_j] = dn_t
    return _Tree(lev, top, width, stride, n_up, up_port, up_parent, n_down, dn_port, dn_child)


# -- switch-to-switch tables --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pairs:
    """Everything per (row, destination row); column ``n`` of ``fx`` is a dummy for unrouted LIDs."""

    desc: npt.NDArray[np.bool_]
    """The destination is the row itself or lies below it (one rank down per hop)."""
    ud: npt.NDArray[np.uint8]
    """Hops of the shortest up*/down* path, 255 for none."""
    fx: npt.NDArray[np.uint8]
    """A port, ``NO_ROUTE``, or a class: ``_UPFULL``, ``_UPMASK``, ``_DNMULTI``."""
    upmask: npt.NDArray[np.unsignedinteger]
    """Bit ``j``: up slot ``j`` lies on a shortest path (``_UPMASK`` pairs)."""


def _pair_tables(g: _Graph, tr: _Tree) -> _Pairs:
    """Down closure bottom-up, then up*/down* hops and port classes top-down, rank by rank."""
    n = g.n
    lev = tr.lev
    desc = np.zeros((n + 1, n), np.bool_)  # row n: padding, nothing below
    desc[np.arange(n), np.arange(n)] = True
    fx = np.full((n, n + 1), NO_ROUTE, np.uint8)
    fx[np.arange(n), np.arange(n)] = 0
    child = np.where(tr.dn_child >= 0, tr.dn_child, n)
    for h in range(1, tr.top + 1):
        rows_h = np.flatnonzero((lev == h) & (tr.n_down > 0))
        k = int(tr.n_down[rows_h].max()) if rows_h.size else 0
        for rows in _row_blocks(rows_h, 2 * n):
            cnt = np.zeros((rows.size, n), np.uint8)
            psum = np.zeros((rows.size, n), np.uint8)  # the port, where cnt == 1
            for j in range(k):
                x = desc[child[rows, j]].view(np.uint8)
                cnt += x
                psum += x * tr.dn_port[rows, j][:, None]
            desc[rows] |= cnt > 0
            fx[rows, :n] = np.where(cnt == 1, psum, np.where(cnt > 1, np.uint8(_DNMULTI), fx[rows, :n]))
    levc = np.where(lev >= 0, lev, 0).astype(np.int16)
    ud = np.full((n + 1, n), _INF, np.uint8)  # row n: padding, unreachable
    ud[:n] = np.where(desc[:n], (levc[:, None] - levc[None, :]).astype(np.uint8), np.uint8(_INF))
    wmax = tr.up_parent.shape[1]
    mtype = np.uint32 if wmax <= 32 else np.uint64
    upmask = np.zeros((n, n + 1), mtype)
    parent = np.where(tr.up_parent >= 0, tr.up_parent, n)
    for h in range(tr.top - 1, -1, -1):
        rows_h = np.flatnonzero((lev == h) & (tr.n_up > 0))
        w = int(tr.width[h])
        full_mask = mtype((1 << w) - 1)
        for rows in _row_blocks(rows_h, n * (wmax + 8)):
            gat = [ud[parent[rows, j]] for j in range(wmax)]
            mn = gat[0].copy()
            for x in gat[1:]:
                np.minimum(mn, x, out=mn)
            cand = np.where(mn < _INF - 1, mn + np.uint8(1), np.uint8(_INF))
            drows = desc[rows]
            new = np.where(drows, ud[rows], cand)
            ud[rows] = new
            target = new - np.uint8(1)
            good = np.zeros((rows.size, n), np.uint8)
            psum = np.zeros((rows.size, n), np.uint8)  # the port, where good == 1
            mask = np.zeros((rows.size, n), mtype)
            for j, x in enumerate(gat):
                eq = x == target
                e8 = eq.view(np.uint8)
                good += e8
                psum += e8 * tr.up_port[rows, j][:, None]
                mask |= eq.astype(mtype) << mtype(j)
            upward = ~drows & (new < _INF)
            cls = np.where(mask == full_mask, np.uint8(_UPFULL), np.where(good == 1, psum, np.uint8(_UPMASK)))
            fx[rows, :n] = np.where(upward, cls, fx[rows, :n])
            upmask[rows, :n] = np.where(upward, mask, 0)
    return _Pairs(desc[:n], ud[:n], fx, upmask)


def _refuse_unreachable_cas(fabric: Fabric, g: _Graph, ud: npt.NDArray[np.uint8], comp: IntArray) -> None:
    """Every leaf must reach every other leaf of its component up*/down*, or CA traffic would turn."""
    leaves = np.unique(g.ca_row)
    bad = (ud[np.ix_(leaves, leaves)] == _INF) & (comp[leaves][:, None] == comp[leaves][None, :])
    if bad.any():
        r, c = np.argwhere(bad)[0].tolist()
        a, b = int(g.nodes[leaves[r]]), int(g.nodes[leaves[c]])
        raise RoutingError(
            f"ftree: fat-tree too degraded: leaf {fabric.names[a]!r} has no up*/down* path to leaf "
            f"{fabric.names[b]!r} and its CAs ({int(bad.sum())} such leaf pairs)"
        )


def _next_hop_to(tr: _Tree, pt: _Pairs, hub: int) -> IntArray:
    """Per row: a port on a shortest up*/down* path to row ``hub``; -1 where there is none."""
    desc, ud = pt.desc, pt.ud
    n = desc.shape[0]
    rows = np.arange(n, dtype=np.int64)
    port = np.full(n, -1, np.int64)
    ch = tr.dn_child
    dn_ok = (ch >= 0) & desc[np.where(ch >= 0, ch, 0), hub] & desc[:, hub][:, None]
    par = tr.up_parent
    target = ud[:, hub].astype(np.int64) - 1
    up_ok = (par >= 0) & (ud[np.where(par >= 0, par, 0), hub].astype(np.int64) == target[:, None])
    up_ok &= ~desc[:, hub][:, None] & (ud[:, hub] < _INF)[:, None]
    for ok, ports in ((dn_ok, tr.dn_port), (up_ok, tr.up_port)):
        cnt = ok.sum(axis=1)
        has = cnt > 0
        order = np.argsort(~ok, axis=1, kind="stable")
        pick = order[rows, np.where(has, rows % np.maximum(cnt, 1), 0)]
        port = np.where(has, ports[rows, pick].astype(np.int64), port)
    port[hub] = -1
    return port


def _switch_routes(g: _Graph, tr: _Tree, pt: _Pairs, comp: IntArray) -> None:
    """Pairs with no up*/down* path: switch LIDs, and a switch's own traffic on a degraded tree.

    They go up*/down* to one hub leaf of their component and from there
    up*/down* to the destination. Every down-to-up turn then lies on the way
    into the hub, where the turns of all pairs line up instead of closing a
    credit loop. Pairs the hub does not serve take any shortest path.
    """
    ud, fx = pt.ud, pt.fx
    need = (ud == _INF) & (comp[:, None] == comp[None, :])
    if not need.any():
        return
    leaves = np.unique(g.ca_row)
    for c in np.unique(comp[np.flatnonzero(need.any(axis=1))]).tolist():
        cand = leaves[comp[leaves] == c]
        if cand.size == 0:
            continue
        inside = comp == c
        score = ((ud[:, cand] < _INF) & inside[:, None]).sum(axis=0)
        score += ((ud[cand] < _INF) & inside[None, :]).sum(axis=1)
        hub = int(cand[int(np.argmax(score))])
        to_hub = _next_hop_to(tr, pt, hub)
        served = need & inside[:, None] & (to_hub >= 0)[:, None] & (ud[hub] < _INF)[None, :]
        r, v = np.nonzero(served)
        fx[r, v] = to_hub[r].astype(np.uint8)
        need &= ~served
    if need.any():
        _minhop_routes(g, fx, need)


def _minhop_routes(g: _Graph, fx: npt.NDArray[np.uint8], pairs: npt.NDArray[np.bool_]) -> None:
    """Remaining (row, destination row) pairs: a shortest path over the switch graph."""
    n = g.n
    targets = np.flatnonzero(pairs.any(axis=0))
    pad = np.where(g.nbr >= 0, g.nbr, n)
    ports = np.flatnonzero((g.nbr >= 0).any(axis=0))
    # Breadth first from all targets at once: bit k of reach[x] says x is within reach of targets[k].
    reach = np.zeros((n + 1, (targets.size + 7) // 8), np.uint8)
    eye = np.zeros((n, targets.size), np.bool_)
    eye[targets, np.arange(targets.size)] = True
    reach[:n] = np.packbits(eye, axis=1)
    dist = np.where(eye, np.uint8(0), np.uint8(_INF))
    step = 0
    while True:
        step += 1
        new = np.zeros_like(reach[:n])
        for p in ports.tolist():
            new |= reach[pad[:, p]]
        new &= ~reach[:n]
        if not new.any():
            break
        dist[np.unpackbits(new, axis=1, count=targets.size).view(np.bool_)] = step
        reach[:n] |= new
    col = np.full(n, -1, np.int64)
    col[targets] = np.arange(targets.size)
    dist = np.concatenate([dist, np.full((1, targets.size), _INF, np.uint8)])
    r, v = np.nonzero(pairs)
    k = col[v]
    here = dist[r, k].astype(np.int64)
    there = dist[pad[r], k[:, None]].astype(np.int64)
    ok = (there == here[:, None] - 1) & (here[:, None] < _INF)
    cnt = ok.sum(axis=1)
    has = cnt > 0
    order = np.argsort(~ok, axis=1, kind="stable")
    pick = order[np.arange(r.size), np.where(has, v % np.maximum(cnt, 1), 0)]
    fx[r[has], v[has]] = pick[has].astype(np.uint8)


# -- the engine ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Dest:
    """Per LID (index = LID): destination row (``n`` = none), d-mod-k key, LMC offset, exit port."""

    row: IntArray
    key: IntArray
    off: IntArray
    exit: npt.NDArray[np.uint8]


def _destinations(g: _Graph, lids: LidMap) -> _Dest:
    """Per LID: where it hangs; CA ports keyed in :func:`host_order`, switches after them."""
    n_lid = lids.max_lid + 1
    span = 1 << lids.lmc
    row = np.full(n_lid, g.n, np.int64)
    key = np.zeros(n_lid, np.int64)
    off = np.zeros(n_lid, np.int64)
    exit_ = np.zeros(n_lid, np.uint8)
    n_ca = g.ca_node.size
    sw_rows = np.arange(g.n, dtype=np.int64)
    for base, r, k, e in (
        (lids.base[g.ca_node, g.ca_port], g.ca_row, np.arange(n_ca, dtype=np.int64), g.ca_exit),
        (lids.base[g.nodes, 0], sw_rows, n_ca + sw_rows, np.zeros(g.n, np.int64)),
    ):
        ok = base > 0
        b = base[ok].astype(np.int64)
        for o in range(span):
            row[b + o] = r[ok]
            key[b + o] = k[ok]
            off[b + o] = o
            exit_[b + o] = e[ok]
    return _Dest(row, key, off, exit_)


def _byte_tables() -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Set bits per byte value, and the position of the ``r``-th set bit of each byte value."""
    bits = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")
    pos = np.zeros((256, 8), np.int64)
    for value in range(256):
        where = np.flatnonzero(bits[value])
        pos[value, : where.size] = where
    return bits.sum(axis=1).astype(np.int64), pos


_BYTE_COUNT, _BYTE_SELECT = _byte_tables()


def _select_bit(mask: npt.NDArray[np.uint64], r: IntArray) -> IntArray:
    """Index of the ``r``-th set bit of each mask (counting from bit 0), a byte at a time."""
    out = np.zeros(mask.size, np.int64)
    left = r.astype(np.int64).copy()
    found = np.zeros(mask.size, np.bool_)
    for k in range(8):
        byte = ((mask >> np.uint64(8 * k)) & np.uint64(255)).astype(np.int64)
        cnt = _BYTE_COUNT[byte]
        here = ~found & (left < cnt)
        out[here] = 8 * k + _BYTE_SELECT[byte[here], left[here]]
        found |= here
        left -= np.where(found, 0, cnt)
        if found.all():
            break
    return out


@dataclass(frozen=True)
class _DownMulti:
    """``_DNMULTI`` pairs: sorted codes ``row * (n + 1) + dest``, good down indices first, counts."""

    code: IntArray
    order: IntArray
    count: IntArray


def _down_multi(tr: _Tree, pt: _Pairs) -> _DownMulti:
    """The good down ports of every ``_DNMULTI`` pair."""
    n = pt.desc.shape[0]
    r, v = np.nonzero(pt.fx[:, :n] == _DNMULTI)
    ch = tr.dn_child[r]
    good = (ch >= 0) & pt.desc[np.where(ch >= 0, ch, 0), v[:, None]]
    order = np.argsort(~good, axis=1, kind="stable")
    return _DownMulti(r * (n + 1) + v, order, good.sum(axis=1))


def _pick(mask: npt.NDArray[np.uint64], sn: IntArray, turn: IntArray) -> IntArray:
    """For LIDs whose nominal slot ``sn`` is not in ``mask``: a good slot.

    Displaced LIDs of one pair, told apart by their slot's rank among the
    bad ones, take distinct good slots; ``turn`` rotates them.
    """
    lower = (np.uint64(1) << sn.astype(np.uint64)) - np.uint64(1)
    nth = np.bitwise_count(~mask & lower).astype(np.int64)
    return _select_bit(mask, (turn + nth) % np.bitwise_count(mask))


def _lookahead_mask(
    tr: _Tree, pt: _Pairs, u: IntArray, v: IntArray, m1: npt.NDArray[np.uint64], sn_up: IntArray, w: int
) -> npt.NDArray[np.uint64]:
    """Slots of ``m1`` whose parent goes on along its own nominal slot ``sn_up`` (or goes down)."""
    m2 = np.zeros(u.size, np.uint64)
    shift = sn_up.astype(np.uint64)
    for j in range(w):
        pj = tr.up_parent[u, j]
        ok = pj >= 0
        pj = np.where(ok, pj, 0)
        on = pt.desc[pj, v] | (((pt.upmask[pj, v].astype(np.uint64) >> shift) & np.uint64(1)) == 1)
        bit = ((m1 >> np.uint64(j)) & np.uint64(1)) == 1
        m2 |= (ok & on & bit).astype(np.uint64) << np.uint64(j)
    return np.where(m2 != 0, m2, m1)


def _expand(g: _Graph, tr: _Tree, pt: _Pairs, dest: _Dest, lft: Lft) -> None:
    """Fill the LFT rows level by level from the pair classes and the LIDs' d-mod-k digits."""
    n = g.n
    dm = _down_multi(tr, pt)
    # Nominal slot per level: the level's d-mod-k digit plus the slot below. A complete tree sees
    # one slot below per switch, a constant shift; a LID displaced below changes its slot here too,
    # so it does not pile onto the LIDs whose slot it took.
    slots: list[IntArray] = []
    below = dest.off
    for h in range(tr.top):
        digit = dest.key // int(tr.stride[h])
        below = (digit + below) % max(int(tr.width[h]), 1)
        slots.append(below)
    # Pairs where fewer than half the up slots lead on (a parent lost many links): rather than let
    # that parent pile its displaced LIDs onto the few slots left, a child looks one level ahead.
    partial = np.zeros((n + 1, n + 1), np.bool_)
    width_row = tr.width[np.clip(tr.lev, 0, tr.top)]
    partial[:n] = (pt.upmask != 0) & (np.bitwise_count(pt.upmask) * 2 < width_row[:, None])
    any_partial = bool(partial.any())
    parent = np.where(tr.up_parent >= 0, tr.up_parent, n)
    for h in range(-1, tr.top + 1):
        rows_h = np.flatnonzero(tr.lev == h)
        if rows_h.size == 0:
            continue
        w = int(tr.width[h]) if 0 <= h < tr.top else 0
        digit = dest.key // (int(tr.stride[h]) if h >= 0 else 1)
        down_digit = dest.key // int(tr.stride[h - 1]) if h >= 1 else dest.key
        look = any_partial and 0 <= h < tr.top - 1
        for rows in _row_blocks(rows_h, lft.shape[1]):
            out = np.take(pt.fx[rows], dest.row, axis=1)
            if w:
                _up_ports(tr, pt, dest, rows, out, slots, h, digit, look, parent, partial)
            if dm.code.size:
                # Down, over parallel cables: take them in turn.
                ri, li = np.nonzero(out == _DNMULTI)
                if ri.size:
                    r = rows[ri]
                    p = np.searchsorted(dm.code, r * (n + 1) + dest.row[li])
                    j = dm.order[p, (down_digit[li] + dest.off[li]) % dm.count[p]]
                    out[ri, li] = tr.dn_port[r, j]
            lft[rows] = out
    # A destination's own switch: its CA port, or port 0 for the switch's own LIDs.
    used = np.flatnonzero(dest.row < n)
    lft[dest.row[used], used] = dest.exit[used]


def _up_ports(
    tr: _Tree, pt: _Pairs, dest: _Dest, rows: IntArray, out: npt.NDArray[np.uint8], slots: list[IntArray],
    h: int, digit: IntArray, look: bool, parent: IntArray, partial: npt.NDArray[np.bool_],
) -> None:  # fmt: skip
    """Resolve the ``_UPFULL`` and ``_UPMASK`` cells of a block of rank-``h`` rows in place."""
    w = int(tr.width[h])
    slot = slots[h]
    full = np.uint64((1 << w) - 1)
    sp = np.take(tr.up_port[rows, :w], slot, axis=1)
    upfull = out == _UPFULL
    masked = out == _UPMASK
    take_sp = upfull.copy()
    fix_r: list[IntArray] = []
    fix_l: list[IntArray] = []
    if masked.any():
        # Some slots missing or leading nowhere: keep the nominal slot when it is good.
        m = np.take(pt.upmask[rows], dest.row, axis=1)
        good = ((m >> slot.astype(m.dtype)) & 1) == 1
        take_sp |= masked & good
        ri, li = np.nonzero(masked & ~good)
        fix_r.append(ri)
        fix_l.append(li)
    if look:
        # The nominal parent would have to displace the LID at its own level: choose again here.
        ahead = np.zeros((rows.size, pt.fx.shape[1]), np.bool_)
        for j in range(w):
            ahead |= partial[parent[rows, j]]
        ri, li = np.nonzero(np.take(ahead, dest.row, axis=1) & take_sp)
        fix_ahead = [ahead[r_, dest.row[l_]] for r_, l_ in zip(fix_r, fix_l, strict=True)]
        if ri.size:
            u, v = rows[ri], dest.row[li]
            par = tr.up_parent[u, slot[li]]
            up_bits = pt.upmask[par, v].astype(np.uint64) >> slots[h + 1][li].astype(np.uint64)
            stuck = ~pt.desc[par, v] & ((up_bits & np.uint64(1)) == 0)
            fix_r.append(ri[stuck])
            fix_l.append(li[stuck])
            fix_ahead.append(np.ones(int(stuck.sum()), np.bool_))
    np.copyto(out, sp, where=take_sp)
    if not fix_r:
        return
    ri, li = np.concatenate(fix_r), np.concatenate(fix_l)
    if ri.size == 0:
        return
    u, v = rows[ri], dest.row[li]
    m1 = np.where(masked[ri, li], pt.upmask[u, v].astype(np.uint64), full)
    if look:
        la = np.flatnonzero(np.concatenate(fix_ahead))
        if la.size:
            m1[la] = _lookahead_mask(tr, pt, u[la], v[la], m1[la], slots[h + 1][li[la]], w)
    sn = slot[li]
    keep = ((m1 >> sn.astype(np.uint64)) & np.uint64(1)) == 1
    s = sn.copy()
    if (~keep).any():
        k = ~keep
        s[k] = _pick(m1[k], sn[k], digit[li[k]] + dest.off[li[k]] + u[k])
    out[ri, li] = tr.up_port[u, s]


def _route(fabric: Fabric, lids: LidMap, root_guids: tuple[int, ...]) -> Lft:
    """Rank, build the per-pair tables, refuse or route the pairs without up*/down*, fill the LFT."""
    g = _graph(fabric)
    lev, top = _rank(fabric, g, root_guids)
    tr = _tables(g, lev, top)
    u, _, t = _links(g.nbr)
    comp = components(g.n, u, t)
    pt = _pair_tables(g, tr)
    _refuse_unreachable_cas(fabric, g, pt.ud, comp)
    _switch_routes(g, tr, pt, comp)
    dest = _destinations(g, lids)
    lft = empty_lft(fabric, lids)
    _expand(g, tr, pt, dest, lft)
    return lft


@register("ftree")
class FtreeRouting:
    """Fat-tree routing: d-mod-k up ports, unique or balanced down ports, degraded trees included."""

    name = "ftree"

    def __init__(self, options: RoutingOptions) -> None:
        self.options = options

    def compute(self, fabric: Fabric, lids: LidMap) -> Lft:
        return _route(fabric, lids, tuple(self.options.root_guids))
