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

On a degraded tree nothing is black-holed and shift permutations stay
nearly as even. CA traffic that reaches a switch the nominal way (as it
would on the complete tree) keeps its nominal slot when that slot leads
on. All other CA traffic at a switch -- LIDs whose slot is missing or
leads to a switch with no shortest way on, and traffic displaced below --
is placed per switch by colouring. A (switch, LID) cell carries traffic
under the shifts that bring one of the hosts sending it there to the LID,
an interval of shifts; each up slot already carries one nominal route per
shift, so the switch gives cells whose intervals overlap distinct slots
(a greedy by interval start, the fewest overlaps where slots run out),
and a displaced route meets at most one other on an up link. A cell
prefers the slot the destination's side allows, chosen alike by every
sibling switch (those sharing parents), so the routes to one destination
keep to one plane all the way down; traffic displaced below keeps to the
slot its switch is reached by, and so travels with the other routes to
its destination leaf; the other LIDs of a port (LMC) are kept clear of.
Where a parent has lost most of its way on, its children choose one
level ahead. Down ports are unique in a k-ary n-tree; parallel cables
are taken in turn.

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
switches on ``[switch, LID]`` rows; only cells whose nominal slot may
fail are visited one by one, and the colouring advances all switches of
a rank together, one cell each per step. No Python loop runs per LID.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

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
I32Array = npt.NDArray[np.int32]
"""Per-cell shift times and slots of the displaced-traffic colouring, kept in 32 bits."""


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
    from_below: IntArray
    """Per row: the up slot its children reach it by (the lowest, should they differ); 0 for leaves."""


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
    from_below = np.full(n, wmax, np.int64)
    np.minimum.at(from_below, up_t, slot)
    from_below[from_below == wmax] = 0
    return _Tree(lev, top, width, stride, n_up, up_port, up_parent, n_down, dn_port, dn_child, from_below)


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
    """Slots of ``m1`` whose parent has the LID's nominal slot of its level ``sn_up`` (or goes down).

    Parents then take a share of a destination's LIDs in proportion to the ways on they have.
    """
    m2 = np.zeros(u.size, np.uint64)
    for j in range(w):
        pj = tr.up_parent[u, j]
        ok = pj >= 0
        pj = np.where(ok, pj, 0)
        on = pt.desc[pj, v] | _bit(pt.upmask[pj, v].astype(np.uint64), sn_up)
        m2 |= (ok & on & _bit(m1, np.full(u.size, j))).astype(np.uint64) << np.uint64(j)
    return np.where(m2 != 0, m2, m1)


def _bit(mask: npt.NDArray[np.uint64], j: npt.NDArray[np.integer]) -> npt.NDArray[np.bool_]:
    """Whether bit ``j`` of each mask is set."""
    return ((mask >> j.astype(np.uint64)) & np.uint64(1)) == 1


def _host_ranges(g: _Graph, tr: _Tree) -> tuple[IntArray, IntArray]:
    """Per row: the lowest and highest host key below it (``n_ca`` and -1 where there is none)."""
    n, n_ca = g.n, g.ca_node.size
    lo = np.full(n + 1, n_ca, np.int64)
    hi = np.full(n + 1, -1, np.int64)
    keys = np.arange(n_ca, dtype=np.int64)
    np.minimum.at(lo, g.ca_row, keys)
    np.maximum.at(hi, g.ca_row, keys)
    child = np.where(tr.dn_child >= 0, tr.dn_child, n)
    for h in range(1, tr.top + 1):
        rows = np.flatnonzero(tr.lev == h)
        lo[rows] = lo[child[rows]].min(axis=1)
        hi[rows] = hi[child[rows]].max(axis=1)
    return lo[:n], hi[:n]


def _dest_masks(tr: _Tree, pt: _Pairs, h: int) -> tuple[IntArray, npt.NDArray[np.uint64]]:
    """Siblings at level ``h`` (switches joined through shared parents) and, per sibling set and
    destination row, the up slots some sibling leads on by: what the destination's side allows.
    """
    n = tr.lev.size
    u, j = np.nonzero(tr.up_parent >= 0)
    keep = tr.lev[u] == h
    lab = components(n, u[keep], tr.up_parent[u[keep], j[keep]])
    rows = np.flatnonzero(tr.lev == h)
    sets, grp_rows = np.unique(lab[rows], return_inverse=True)
    grp = np.full(n, -1, np.int64)
    grp[rows] = grp_rows
    order = np.argsort(grp_rows, kind="stable")
    starts = np.searchsorted(grp_rows[order], np.arange(sets.size))
    return grp, np.bitwise_or.reduceat(pt.upmask[rows[order]].astype(np.uint64), starts, axis=0)


@dataclass(frozen=True)
class _Level:
    """One level's view of the LIDs: a row's nominal slot for a LID is ``(kslot + shift[row]) mod w``."""

    h: int
    w: int
    kslot: IntArray
    """Per LID: the nominal slot at a row with no shift (the chain slot at the leaves)."""
    shift: IntArray
    """Per row: 0 at the leaves, above them the slot the row is reached by from below."""
    by_key: IntArray
    """LIDs ordered by (destination row, ``kslot``)."""
    start: IntArray
    """``start[v * w + k]``: first position in ``by_key`` of destination row ``v`` with ``kslot`` ``k``."""
    grp: IntArray
    dmask: npt.NDArray[np.uint64]
    """``[sibling set, destination row]``: up slots the destination's side allows."""
    look: bool
    arc: int
    """Shifts per arc the colouring cuts a switch's circle into: some 8 times the hosts below a switch."""

    def cells(self, v: IntArray, shift: IntArray, slots: npt.NDArray[np.uint64]) -> tuple[IntArray, IntArray]:
        """LIDs of destination rows ``v`` whose nominal slot is in ``slots``: (index into ``v``, LID)."""
        w = self.w
        bits = ((slots[:, None] >> np.arange(w, dtype=np.uint64)) & np.uint64(1)) == 1
        p, j = np.nonzero(bits)
        k = v[p] * w + (j - shift[p]) % w
        lo, cnt = self.start[k], self.start[k + 1] - self.start[k]
        which = np.repeat(p, cnt)
        pos = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt) + np.repeat(lo, cnt)
        return which, self.by_key[pos]


@dataclass
class _Extras:
    """CA traffic of one level that cannot take its nominal slot: (row, LID) cells to colour."""

    row: list[npt.NDArray[np.int32]] = field(default_factory=list)
    lid: list[npt.NDArray[np.int32]] = field(default_factory=list)
    lo: list[npt.NDArray[np.int32]] = field(default_factory=list)
    """Lowest host key of the sources that send the LID through the switch; ``hi`` the highest."""
    hi: list[npt.NDArray[np.int32]] = field(default_factory=list)
    allowed: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    """Up slots that lead on (one bit per slot)."""
    pref: list[npt.NDArray[np.int32]] = field(default_factory=list)
    avoid: list[npt.NDArray[np.uint64]] = field(default_factory=list)
    """Slots the other LIDs of the port (LMC) take at the switch."""


@dataclass(frozen=True)
class _Arrivals:
    """Displaced CA traffic entering a level from below: (row, LID) cells, sorted, with their source hulls."""

    row: IntArray
    lid: IntArray
    lo: IntArray
    hi: IntArray

    @classmethod
    def merged(cls, row: IntArray, lid: IntArray, lo: IntArray, hi: IntArray, n_lid: int) -> _Arrivals:
        code = row * n_lid + lid
        if code.size == 0:
            return cls(code, code, code, code)
        order = np.argsort(code, kind="stable")
        code = code[order]
        first = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
        return cls(
            code[first] // n_lid,
            code[first] % n_lid,
            np.minimum.reduceat(lo[order], first),
            np.maximum.reduceat(hi[order], first),
        )

    def within(self, rows: IntArray) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """Cells of an ascending block of rows: (index into ``rows``, LID, lo, hi)."""
        a, b = np.searchsorted(self.row, [rows[0], rows[-1] + 1])
        r, lid, lo, hi = self.row[a:b], self.lid[a:b], self.lo[a:b], self.hi[a:b]
        ri = np.minimum(np.searchsorted(rows, r), rows.size - 1)
        ok = rows[ri] == r
        return ri[ok], lid[ok], lo[ok], hi[ok]


@dataclass(frozen=True)
class _Ctx:
    """What every level of :func:`_expand` reads."""

    g: _Graph
    tr: _Tree
    pt: _Pairs
    dest: _Dest
    chain: list[IntArray]
    """Per level: each LID's nominal slot, the level's d-mod-k digit plus the nominal slot below."""
    digit: list[IntArray]
    """Per level ``h`` (0 .. top): ``key // stride_h``."""
    is_ca: npt.NDArray[np.bool_]
    """Per LID: a CA port's LID (the traffic shift permutations are made of)."""
    ca_dest: npt.NDArray[np.bool_]
    """Per destination row (``n`` included, false): CA ports hang on it."""
    span: int
    """LIDs per port, ``2**lmc``."""
    lo: IntArray
    hi: IntArray
    slot_of: npt.NDArray[np.int8]
    """``[row, port]``: the up slot of that port, -1 for any other value (down ports, classes)."""
    partial: npt.NDArray[np.bool_]
    parent: IntArray


def _level(cx: _Ctx, h: int) -> _Level:
    """Per-level LID keys, shifts and the destination side's slots."""
    tr, dest = cx.tr, cx.dest
    n = tr.lev.size
    w = int(tr.width[h])
    kslot = cx.chain[0] if h == 0 else cx.digit[h] % w
    shift = np.zeros(n, np.int64) if h == 0 else tr.from_below % w
    code = dest.row * w + kslot
    by_key = np.argsort(code, kind="stable")
    start = np.searchsorted(code[by_key], np.arange((n + 1) * w + 1))
    grp, dmask = _dest_masks(tr, cx.pt, h)
    look = bool(cx.partial.any()) and h < tr.top - 1
    rows = np.flatnonzero(tr.lev == h)
    period = max(int(cx.g.ca_node.size), 1)
    below = int(np.median(np.maximum(cx.hi[rows] - cx.lo[rows] + 1, 1))) if rows.size else 1
    arc = max(8 * below, -(-period // 64))
    return _Level(h, w, kslot, shift, by_key, start, grp, dmask, look, arc)


def _expand(g: _Graph, tr: _Tree, pt: _Pairs, dest: _Dest, lft: Lft) -> None:
    """Fill the LFT rows level by level from the pair classes and the LIDs' d-mod-k digits."""
    n = g.n
    n_lid = dest.row.size
    dm = _down_multi(tr, pt)
    # Nominal slot per level: the level's d-mod-k digit plus the nominal slot below. Traffic that
    # reaches a switch the nominal way takes it; any other traffic keeps to the slot the switch is
    # reached by from below (staying with the destination's other routes), or is coloured.
    chain: list[IntArray] = []
    digit: list[IntArray] = []
    below = dest.off
    for h in range(tr.top + 1):
        digit.append(dest.key // int(tr.stride[h]))
        if h < tr.top:
            below = (digit[h] + below) % max(int(tr.width[h]), 1)
            chain.append(below)
    # Pairs where fewer than half the up slots lead on (a parent lost many links): rather than let
    # that parent pile its displaced LIDs onto the few slots left, a child looks one level ahead.
    partial = np.zeros((n + 1, n + 1), np.bool_)
    width_row = tr.width[np.clip(tr.lev, 0, tr.top)]
    partial[:n] = (pt.upmask != 0) & (np.bitwise_count(pt.upmask) * 2 < width_row[:, None])
    parent = np.where(tr.up_parent >= 0, tr.up_parent, n)
    lo, hi = _host_ranges(g, tr)
    slot_of = np.full((n, 256), -1, np.int8)
    r_, j_ = np.nonzero(tr.up_port != NO_ROUTE)
    slot_of[r_, tr.up_port[r_, j_]] = j_
    is_ca = (dest.key < g.ca_node.size) & (dest.row < n)
    ca_dest = np.zeros(n + 1, np.bool_)
    ca_dest[g.ca_row] = True
    span = int(dest.off.max(initial=0)) + 1
    cx = _Ctx(g, tr, pt, dest, chain, digit, is_ca, ca_dest, span, lo, hi, slot_of, partial, parent)
    arrivals: _Arrivals | None = None
    for h in range(-1, tr.top + 1):
        rows_h = np.flatnonzero(tr.lev == h)
        w = int(tr.width[h]) if 0 <= h < tr.top else 0
        lv = _level(cx, h) if w and rows_h.size else None
        down_digit = dest.key // int(tr.stride[h - 1]) if h >= 1 else dest.key
        moved: list[tuple[IntArray, IntArray, IntArray, IntArray]] = []
        for rows in _row_blocks(rows_h, lft.shape[1]):
            out = np.take(pt.fx[rows], dest.row, axis=1)
            ext = _Extras()
            if lv is not None:
                arr = arrivals.within(rows) if arrivals is not None and arrivals.row.size else None
                _up_ports(cx, lv, rows, out, arr, ext)
            if dm.code.size:
                # Down, over parallel cables: take them in turn.
                ri, li = np.nonzero(out == _DNMULTI)
                if ri.size:
                    r = rows[ri]
                    p = np.searchsorted(dm.code, r * (n + 1) + dest.row[li])
                    j = dm.order[p, (down_digit[li] + dest.off[li]) % dm.count[p]]
                    out[ri, li] = tr.dn_port[r, j]
            lft[rows] = out
            if lv is not None and ext.row:
                # Switches are coloured apart from each other: a block at a time.
                moved.append(_settle(cx, lv, ext, lft))
        arrivals = None
        if moved:
            parts = [np.concatenate(x) for x in zip(*moved, strict=True)]
            arrivals = _Arrivals.merged(parts[0], parts[1], parts[2], parts[3], n_lid)
    # A destination's own switch: its CA port, or port 0 for the switch's own LIDs.
    used = np.flatnonzero(dest.row < n)
    lft[dest.row[used], used] = dest.exit[used]


def _up_ports(
    cx: _Ctx, lv: _Level, rows: IntArray, out: npt.NDArray[np.uint8],
    arr: tuple[IntArray, IntArray, IntArray, IntArray] | None, ext: _Extras,
) -> None:  # fmt: skip
    """Resolve the up cells of a block of level rows in place; displaced CA traffic goes to ``ext``.

    Only the cells of pairs whose nominal slot may fail are looked at one by one: the LIDs of a
    destination row with a given nominal slot come from ``lv.cells``.
    """
    tr, pt, dest = cx.tr, cx.pt, cx.dest
    h, w = lv.h, lv.w
    full = np.uint64((1 << w) - 1)
    shift = lv.shift[rows]
    rot = (np.arange(w)[None, :] + shift[:, None]) % w
    fxr = pt.fx[rows]
    # Every cell whose pair climbs takes its nominal slot, unless replaced below.
    np.copyto(out, np.take(np.take_along_axis(tr.up_port[rows, :w], rot, axis=1), lv.kslot, axis=1),
              where=(out >= _UPMASK) & (out <= _UPFULL))  # fmt: skip
    one = cx.slot_of[rows[:, None], fxr].astype(np.int64)  # pairs with a single up slot
    fb = tr.from_below[rows]
    er: list[IntArray] = []  # cells to colour: index into rows, LID
    el: list[IntArray] = []

    def arrived(ri: IntArray, li: IntArray) -> npt.NDArray[np.bool_]:
        """CA traffic reaches the cell the nominal way (every LID at a leaf)."""
        ok = cx.is_ca[li]
        return ok if h == 0 else ok & (cx.chain[h - 1][li] == fb[ri])

    # Cells of masked or single-slot pairs whose nominal slot is not good.
    pr, pv = np.nonzero((fxr == _UPMASK) | ((one >= 0) & cx.ca_dest[None, :]))
    if pr.size:
        single = one[pr, pv] >= 0
        m = np.where(single, np.uint64(1) << np.maximum(one[pr, pv], 0).astype(np.uint64),
                     pt.upmask[rows[pr], pv].astype(np.uint64))  # fmt: skip
        p, li = lv.cells(pv, shift[pr], ~m & full)
        ri = pr[p]
        came = arrived(ri, li)
        er.append(ri[came])
        el.append(li[came])
        # No CA traffic comes this way: any good slot, displaced LIDs of one pair to distinct ones.
        quiet = ~came & ~single[p]
        if quiet.any():
            qr, ql, qm = ri[quiet], li[quiet], m[p[quiet]]
            s = _pick(qm, (lv.kslot[ql] + shift[qr]) % w, cx.digit[h + 1][ql] + rows[qr])
            out[qr, ql] = tr.up_port[rows[qr], s]
    ahead = np.zeros((0, 0), np.bool_)
    if lv.look:
        # The nominal parent would have to displace the LID at its own level: choose again here.
        ahead = np.zeros(fxr.shape, np.bool_)
        for j in range(w):
            ahead |= cx.partial[cx.parent[rows, j]]
        ar_, av_ = np.nonzero(ahead & (fxr >= _UPMASK) & (fxr <= _UPFULL))
        if ar_.size:
            m = np.where(fxr[ar_, av_] == _UPFULL, full, pt.upmask[rows[ar_], av_].astype(np.uint64))
            p, li = lv.cells(av_, shift[ar_], m)
            ri = ar_[p]
            came = arrived(ri, li)
            ri, li = ri[came], li[came]
            u, v = rows[ri], dest.row[li]
            w_up = max(int(tr.width[h + 1]), 1)
            par = tr.up_parent[u, (lv.kslot[li] + shift[ri]) % w]
            on = _bit(pt.upmask[par, v].astype(np.uint64), (cx.digit[h + 1][li] + tr.from_below[par]) % w_up)
            stuck = ~pt.desc[par, v] & ~on
            er.append(ri[stuck])
            el.append(li[stuck])
    lo_ = [cx.lo[rows[r_]] for r_ in er]
    hi_ = [cx.hi[rows[r_]] for r_ in er]
    came_up = [np.zeros(r_.size, np.bool_) for r_ in er]
    if arr is not None:
        ar, al, alo, ahi = arr
        av = dest.row[al]
        climbs = ((fxr[ar, av] >= _UPMASK) & (fxr[ar, av] <= _UPFULL)) | (one[ar, av] >= 0)
        er.append(ar[climbs])
        el.append(al[climbs])
        lo_.append(alo[climbs])
        hi_.append(ahi[climbs])
        came_up.append(np.ones(int(climbs.sum()), np.bool_))
    if not er:
        return
    ri, li = np.concatenate(er), np.concatenate(el)
    if ri.size == 0:
        return
    clo, chi, displaced = np.concatenate(lo_), np.concatenate(hi_), np.concatenate(came_up)
    # A cell reached several ways: one cell, the hull of its sources.
    code = ri * out.shape[1] + li
    order = np.argsort(code, kind="stable")
    code = code[order]
    first = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    ri, li = ri[order][first], li[order][first]
    clo, chi = np.minimum.reduceat(clo[order], first), np.maximum.reduceat(chi[order], first)
    displaced = np.logical_and.reduceat(displaced[order], first)
    u, v = rows[ri], dest.row[li]
    # Traffic displaced below keeps to the slot the switch is reached by, and so to the other routes
    # to its destination, unless another LID of its port (LMC) comes here the nominal way: then, as
    # on its nominal path, it adds its own slot below, so the port's LIDs part.
    s0 = (lv.kslot[li] + shift[ri]) % w
    avoid = np.zeros(ri.size, np.uint64)  # slots other LIDs of the port take here the nominal way
    if cx.span > 1 and h == 0:
        for o in range(cx.span):
            avoid |= np.uint64(1) << ((s0 - dest.off[li] + o) % w).astype(np.uint64)
        avoid &= ~(np.uint64(1) << s0.astype(np.uint64))
    elif cx.span > 1 and displaced.any():
        c_below = cx.chain[h - 1][li]
        w_below = max(int(tr.width[h - 1]), 1)
        sib = displaced & ((dest.off[li] + fb[ri] - c_below) % w_below < cx.span)
        avoid = np.where(sib, np.uint64(1) << s0.astype(np.uint64), avoid)
        s0 = np.where(sib, (lv.kslot[li] + c_below) % w, s0)
    cls = fxr[ri, v]
    o1 = one[ri, v]
    allowed = np.where(cls == _UPFULL, full, pt.upmask[u, v].astype(np.uint64))
    allowed = np.where(o1 >= 0, np.uint64(1) << np.maximum(o1, 0).astype(np.uint64), allowed)
    up_digit = cx.digit[h + 1][li]
    # Preferred: the slot the destination's side allows, chosen alike by every sibling switch.
    dsm = lv.dmask[lv.grp[u], v]
    dsm = np.where(dsm != 0, dsm, allowed)
    ds = s0.copy()
    moved = ~_bit(dsm, s0)
    if moved.any():
        ds[moved] = _pick(dsm[moved], s0[moved], up_digit[moved] + tr.from_below[u[moved]])
    if lv.look:
        la = np.flatnonzero(ahead[ri, v] & (o1 < 0))
        if la.size:
            allowed[la] = _lookahead_mask(tr, pt, u[la], v[la], allowed[la], cx.chain[h + 1][li[la]], w)
    # The switch's own side lacks that slot: each switch displaces in its own turn, so that
    # siblings missing the same slot do not all send the LID to one parent.
    pref = ds
    own = ~_bit(allowed, ds)
    if own.any():
        pref[own] = _pick(allowed[own], ds[own], up_digit[own] + u[own])
    for part, x in zip((ext.row, ext.lid, ext.lo, ext.hi, ext.pref),
                       (u, li, clo, chi, pref), strict=True):  # fmt: skip
        part.append(x.astype(np.int32))
    ext.allowed.append(allowed)
    ext.avoid.append(avoid)


def _settle(cx: _Ctx, lv: _Level, ext: _Extras, lft: Lft) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """Colour displaced CA traffic into the LFT; return what moves on off its nominal slot
    (parent row, LID, source hull), the next level's arrivals."""
    tr = cx.tr
    row, lid = np.concatenate(ext.row).astype(np.int64), np.concatenate(ext.lid).astype(np.int64)
    lo, hi = np.concatenate(ext.lo), np.concatenate(ext.hi)
    n_ca = max(int(cx.g.ca_node.size), 1)
    start = ((cx.dest.key[lid] - hi) % n_ca).astype(np.int32)
    allowed, pref, avoid = np.concatenate(ext.allowed), np.concatenate(ext.pref), np.concatenate(ext.avoid)
    for part in (ext.row, ext.lid, ext.lo, ext.hi, ext.allowed, ext.pref, ext.avoid):
        part.clear()
    if cx.span == 1:
        color = _color(row, start, hi - lo + 1, allowed, pref, avoid, lv.w, n_ca, lv.arc)
    else:
        # LIDs of one LMC offset make up one set of shift permutations: offsets are coloured one
        # after the other, each clear of the slots the port's earlier LIDs took at the switch.
        color = np.zeros(row.size, np.int64)
        off = cx.dest.off[lid]
        _, port = np.unique(row * n_ca + cx.dest.key[lid], return_inverse=True)
        taken = np.zeros(int(port.max()) + 1, np.uint64)
        for o in range(cx.span):
            c = np.flatnonzero(off == o)
            color[c] = _color(row[c], start[c], hi[c] - lo[c] + 1, allowed[c], pref[c], avoid[c] | taken[port[c]],
                              lv.w, n_ca, lv.arc)  # fmt: skip
            np.bitwise_or.at(taken, port[c], np.uint64(1) << color[c].astype(np.uint64))
    lft[row, lid] = tr.up_port[row, color]
    moved = color != cx.chain[lv.h][lid]
    return tr.up_parent[row[moved], color[moved]], lid[moved], lo[moved].astype(np.int64), hi[moved].astype(np.int64)


_DEPTH = 4
"""Displaced cells a switch keeps track of per up slot at one time (more count as that many)."""
_EARLY = -(1 << 30)
"""Shift time before every cell (shifts and LIDs stay below 2**16)."""
_LATE = 1 << 30


def _color(
    row: IntArray, start: I32Array, length: I32Array, allowed: npt.NDArray[np.uint64], pref: I32Array,
    avoid: npt.NDArray[np.uint64], w: int, period: int, arc: int,
) -> IntArray:  # fmt: skip
    """Up slots for displaced CA traffic, switch by switch: interval colouring over the shifts.

    The cell of switch ``row`` carries traffic under shifts ``start .. start + length - 1``
    (mod ``period``). Every slot already carries one nominal route per shift, so cells whose
    shifts overlap should take distinct slots. Each switch takes its cells in order of
    ``start`` and gives each its preferred slot if no earlier cell holds it then, else the
    allowed slot held by the fewest earlier cells at that shift, outside ``avoid`` if it can,
    nearest after the preferred one. All switches advance together, a cell each per step; to
    take fewer steps, each switch's circle is cut into arcs of ``arc`` shifts, the cells over a
    cut are coloured first, and then the arcs of all switches advance together.
    """
    color = np.zeros(row.size, np.int64)
    if row.size == 0:
        return color
    sw, r_idx = np.unique(row, return_inverse=True)
    end = start + length
    parts = -(-period // arc)
    if parts <= 2:
        return _color_circle(r_idx, sw.size, start, end, allowed, pref, avoid, w, period)
    first, last = start // arc, (end - 1) // arc
    cross = first != last
    cc, cr = np.flatnonzero(cross), np.flatnonzero(~cross)
    color[cc] = _color_circle(r_idx[cc], sw.size, start[cc], end[cc], allowed[cc], pref[cc], avoid[cc], w, period)
    # Each arc starts with the cells over its first cut held until they end, and keeps clear
    # of those that start in it and run on past its end.
    busy = np.full((sw.size * parts, w, _DEPTH), _EARLY, np.int32)
    reserved = np.full((sw.size * parts, w), _LATE, np.int32)
    np.minimum.at(reserved, (r_idx[cc] * parts + first[cc], color[cc]), start[cc])
    span = last[cc] - first[cc]
    which = np.repeat(cc, span)
    k = first[which] + 1 + np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
    _hold(busy, (r_idx[which] * parts + k % parts) * w + color[which], end[which] - period * (k // parts), w)
    color[cr] = _sweep(r_idx[cr] * parts + first[cr], start[cr], end[cr], allowed[cr], pref[cr], avoid[cr], w,
                       busy, reserved)  # fmt: skip
    return color


def _hold(busy: I32Array, code: IntArray, end: npt.NDArray[np.integer], w: int) -> None:
    """Enter cells (``code`` = switch * ``w`` + slot) held until ``end`` in ``busy``, the latest ones first."""
    order = np.lexsort((-end, code))
    code = code[order]
    k = np.arange(code.size) - np.searchsorted(code, code)
    keep = k < _DEPTH
    busy[code[keep] // w, code[keep] % w, k[keep]] = end[order][keep]


def _color_circle(
    r_idx: IntArray, n_sw: int, start: I32Array, end: I32Array, allowed: npt.NDArray[np.uint64], pref: I32Array,
    avoid: npt.NDArray[np.uint64], w: int, period: int,
) -> IntArray:  # fmt: skip
    """:func:`_color` over whole circles: cells that wrap past ``period`` go first and hold their
    slot at both ends of the circle."""
    color = np.zeros(r_idx.size, np.int64)
    busy = np.full((n_sw, w, _DEPTH), _EARLY, np.int32)
    reserved = np.full((n_sw, w), _LATE, np.int32)
    wrap = end > period
    if wrap.any():
        cw = np.flatnonzero(wrap)
        color[cw] = _sweep(r_idx[cw], start[cw], end[cw], allowed[cw], pref[cw], avoid[cw], w, busy, reserved)
        busy[:] = _EARLY
        _hold(busy, r_idx[cw] * w + color[cw], end[cw] - period, w)
        np.minimum.at(reserved, (r_idx[cw], color[cw]), start[cw])
    cr = np.flatnonzero(~wrap)
    color[cr] = _sweep(r_idx[cr], start[cr], end[cr], allowed[cr], pref[cr], avoid[cr], w, busy, reserved)
    return color


def _steps(group: IntArray, start: I32Array) -> tuple[IntArray, IntArray]:
    """Cells in the order :func:`_sweep` takes them: by rank within their group (in order of
    ``start``), then by group; and where each step's cells begin and end in that order."""
    e = group.size
    order = np.argsort(group.astype(np.int64) * (int(start.max(initial=0)) + 1) + start, kind="stable")
    g_s = group[order]
    new_run = np.r_[True, g_s[1:] != g_s[:-1]]
    run_start = np.flatnonzero(new_run)
    rank = np.arange(e) - np.repeat(run_start, np.diff(np.r_[run_start, e]))
    rank_t = rank.astype(np.uint16) if e and rank.max() < 1 << 16 else rank
    pos = order[np.argsort(rank_t, kind="stable")]
    return pos, np.r_[0, np.cumsum(np.bincount(rank))]


def _sweep(
    r_idx: IntArray, start: I32Array, end: I32Array, allowed: npt.NDArray[np.uint64], pref: I32Array,
    avoid: npt.NDArray[np.uint64], w: int, busy: I32Array, reserved: I32Array,
) -> IntArray:  # fmt: skip
    """The greedy of :func:`_color` over cells that do not wrap; ``busy`` (per switch and slot: when the
    cells holding it end) and ``reserved`` (held from) are updated in place."""
    e = r_idx.size
    color = np.zeros(e, np.int64)
    if e == 0:
        return color
    pos, bounds = _steps(r_idx, start)
    okp = _bit(allowed & ~avoid, pref)
    until = busy.max(axis=2)
    lanes = np.arange(w, dtype=np.uint64)
    turn = (np.arange(w)[None, :] - np.arange(w)[:, None]) % w  # turn[p, c]: how far c comes after p
    top = np.iinfo(np.int64).max
    for i in range(bounds.size - 1):
        cells = pos[int(bounds[i]) : int(bounds[i + 1])]
        r, a, z, p = r_idx[cells], start[cells], end[cells], pref[cells]
        c = p.astype(np.int64)
        miss = np.flatnonzero(~(okp[cells] & (until[r, p] <= a) & (z <= reserved[r, p])))
        held = np.zeros(0, np.int64)
        if miss.size:
            rm, am, zm = r[miss], a[miss], z[miss]
            ok = ((allowed[cells[miss]][:, None] >> lanes) & np.uint64(1)) == 1
            shy = ((avoid[cells[miss]][:, None] >> lanes) & np.uint64(1)).astype(np.int64)
            free = ok & (until[rm] <= am[:, None]) & (zm[:, None] <= reserved[rm])
            c[miss] = np.where(free, shy * w + turn[p[miss]], top).argmin(axis=1)
            full = ~free.any(axis=1)
            if full.any():
                # Every allowed slot is held: the one held by the fewest cells then.
                held = miss[full]
                rh, ah = r[held], a[held]
                n_held = (busy[rh] > ah[:, None, None]).sum(axis=2) + (z[held][:, None] > reserved[rh])
                score = np.where(ok[full], (2 * n_held + shy[full]) * w + turn[p[held]], top)
                c[held] = score.argmin(axis=1)
        # A free slot's earlier cells have all ended: the cell holds it alone.
        if held.size == 0:
            busy[r, c, 0] = z
        else:
            lone = np.ones(r.size, np.bool_)
            lone[held] = False
            busy[r[lone], c[lone], 0] = z[lone]
            rh, ch = r[held], c[held]
            slot = busy[rh, ch]
            k = slot.argmin(axis=1)
            busy[rh, ch, k] = z[held]
        until[r, c] = np.maximum(until[r, c], z)
        color[cells] = c
    return color


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
