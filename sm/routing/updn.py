"""Up/down routing: shortest legal paths from root switches, deadlock-free on any topology.

Switches are ranked by hop distance from the roots; every inter-switch link
then has an "up" end, the one with the lower (rank, node GUID). A legal
path takes zero or more up moves and then zero or more down moves, never
down then up, so the channel dependency graph cannot close a loop.

The LFT has one port per (switch, LID) whatever way a packet arrived, so
the rule must hold for every source at once. For a destination switch
``d``, let ``R`` be the switches from which ``d`` is reachable by down moves
alone. A switch in ``R`` forwards down along a shortest down-only path
(its next hop is in ``R`` again); a switch outside ``R`` forwards up
towards the nearest way into ``R``. Every path so produced is up* down*.
On fat-trees rooted at the top level these paths are the shortest ones.

Roots come from ``RoutingOptions.root_guids`` (node GUIDs of switches) or
are detected, per connected set of switches, by trying in turn:

1. the top level: the switches farthest from the leaves (switches with a
   CA), as in a fat-tree (spines, cores), unless every switch is a leaf;
2. the switches whose mean hop distance to the CA ports is within 10% of
   the smallest;
3. one root: the best of 2, lowest GUID on a tie (rings, tori, irregular
   fabrics).

The first set that leaves every two connected leaves a legal path between
them is used; with one root there always is one.

Two switches that are only joined through lower switches (two spines of a
leaf/spine fabric, two cores of a 3-level tree) have no legal path between
them: each other's switch LIDs stay unrouted (255), as under OpenSM's
updn. CA traffic is not affected; :func:`sm.analysis.verify.verify_routes` counts
such pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.model import Fabric, NodeType
from sm.lidmap import LidMap
from sm.routing._hops import UNREACHABLE, SwitchGraph, hop_matrix, padded, route_balanced, switch_graph
from sm.routing.base import Lft, RoutingError, RoutingOptions, register

ROOT_TOLERANCE = 0.10
"""A switch is a detected root if its mean hop distance to the CAs is within this of the best."""


def _components(g: SwitchGraph, dist: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
    """Component label per row: the lowest row reachable from it."""
    reach = dist < UNREACHABLE
    return reach.argmax(axis=1).astype(np.int64)


def _ca_ports(fabric: Fabric, g: SwitchGraph) -> npt.NDArray[np.int64]:
    """CA ports cabled (LinkUp) to each switch row."""
    up = fabric.up_mask()[g.nodes]
    peer = np.where(up, fabric.peer_node[g.nodes], 0)
    return (up & (fabric.node_type[peer] == NodeType.CA)).sum(axis=1).astype(np.int64)


def _scores(
    fabric: Fabric, g: SwitchGraph, dist: npt.NDArray[np.uint8]
) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]]:
    """Per component: its rows and each row's summed hop distance to the CA ports (or switches)."""
    comp = _components(g, dist)
    cas = _ca_ports(fabric, g).astype(np.float64)
    out = []
    for c in np.unique(comp).tolist():
        rows = np.flatnonzero(comp == c)
        w = cas[rows]
        if w.sum() == 0:
            w = np.ones(rows.size)
        out.append((rows, dist[np.ix_(rows, rows)].astype(np.float64) @ w))
    return out


def _leaf_distance(fabric: Fabric, g: SwitchGraph, dist: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
    """Hops from each row to the nearest leaf; 255 where none is reachable."""
    leaf = np.flatnonzero(_ca_ports(fabric, g) > 0)
    if leaf.size == 0:
        return np.full(g.n, UNREACHABLE, np.int64)
    return dist[:, leaf].min(axis=1).astype(np.int64)


def root_candidates(fabric: Fabric, g: SwitchGraph, dist: npt.NDArray[np.uint8]) -> list[npt.NDArray[np.int64]]:
    """Root row sets to try in order (see the module docstring)."""
    scores = _scores(fabric, g, dist)
    ldist = _leaf_distance(fabric, g, dist)
    top, near, single = [], [], []
    for rows, score in scores:
        ld = ldist[rows]
        finite = ld < UNREACHABLE
        if finite.any() and ld[finite].max() > 0:
            top.append(rows[ld == ld[finite].max()])
        near.append(rows[score <= score.min() * (1 + ROOT_TOLERANCE) + 1e-9])
        best = rows[score <= score.min() + 1e-9]
        single.append(np.asarray([best[np.argmin(g.guid[best])]], np.int64))
    out = []
    if len(top) == len(scores):
        out.append(np.concatenate(top))
    for sets in (near, single):
        cand = np.concatenate(sets) if sets else np.zeros(0, np.int64)
        if not any(np.array_equal(cand, o) for o in out):
            out.append(cand)
    return out


def _given_roots(fabric: Fabric, g: SwitchGraph, guids: tuple[int, ...]) -> npt.NDArray[np.int64]:
    rows = []
    for guid in guids:
        try:
            node = fabric.by_guid(int(guid))
        except KeyError:
            raise RoutingError(f"updn: root GUID {guid:#018x} is not a node of the fabric") from None
        if g.row_of[node] < 0:
            raise RoutingError(f"updn: root GUID {guid:#018x} is {fabric.names[node]!r}, not a switch")
        rows.append(int(g.row_of[node]))
    return np.unique(np.asarray(rows, np.int64))


def ranks(dist: npt.NDArray[np.uint8], roots: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Hop distance of each row from the nearest root; -1 where no root is reachable."""
    r = dist[:, roots].min(axis=1).astype(np.int64) if roots.size else np.full(dist.shape[0], UNREACHABLE)
    return np.where(r < UNREACHABLE, r, -1)


def up_down_neighbours(
    g: SwitchGraph, rank: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Neighbour tables split into up moves (to a lower (rank, GUID)) and down moves."""
    pos = np.empty(g.n, np.int64)
    pos[np.lexsort((g.guid, rank))] = np.arange(g.n)
    has = g.nbr >= 0
    npos = pos[np.where(has, g.nbr, 0)]
    upward = has & (npos < pos[:, None])
    downward = has & (npos > pos[:, None])
    return np.where(upward, g.nbr, -1), np.where(downward, g.nbr, -1)


def legal_hops(
    up_nbr: npt.NDArray[np.int64], down_nbr: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """``(down, legal)`` hop tables ``[x, d]``.

    ``down[x, d]``: fewest down moves from ``x`` to ``d``. ``legal[x, d]``:
    length of the path the LFT produces: ``down`` where finite, else one up
    move plus ``legal`` of the best up neighbour. 255 means no legal path.
    """
    down = hop_matrix(down_nbr)
    n = down.shape[0]
    in_r = down < UNREACHABLE
    ports = np.flatnonzero((up_nbr >= 0).any(axis=0))
    idx = np.where(up_nbr[:, ports] >= 0, up_nbr[:, ports], n)
    legal = down.copy()
    sentinel = np.full((1, n), UNREACHABLE, np.uint8)
    while True:
        lp = np.concatenate([legal, sentinel])
        best = np.full((n, n), UNREACHABLE, np.uint8)
        for j in range(idx.shape[1]):
            np.minimum(best, lp[idx[:, j]], out=best)
        via_up = np.where(best < UNREACHABLE - 1, best + 1, UNREACHABLE).astype(np.uint8)
        new = np.where(in_r, down, via_up)
        if np.array_equal(new, legal):
            return down, legal
        legal = new


@dataclass(frozen=True)
class UpDownPlan:
    """What up/down routing decided for a fabric: roots, ranks and the hop tables.

    ``up_nbr`` / ``down_nbr``: neighbour tables (LFT rows, -1 for none)
    holding only the up or only the down moves.
    """

    roots: npt.NDArray[np.int64]
    rank: npt.NDArray[np.int64]
    up_nbr: npt.NDArray[np.int64]
    down_nbr: npt.NDArray[np.int64]
    down: npt.NDArray[np.uint8]
    legal: npt.NDArray[np.uint8]


@register("updn")
class UpDownEngine:
    """Up/down routing from given or detected roots, balanced per output port."""

    name = "updn"

    def __init__(self, options: RoutingOptions | None = None) -> None:
        self.options = options or RoutingOptions()

    def roots(self, fabric: Fabric) -> list[int]:
        """Node indices of the root switches this engine uses."""
        g = switch_graph(fabric)
        return g.nodes[self.plan(fabric, g).roots].tolist()

    def plan(self, fabric: Fabric, g: SwitchGraph) -> UpDownPlan:
        """Choose the roots and compute ranks, directions and legal hop tables."""
        dist = hop_matrix(g.nbr)
        if g.n == 0:
            return _plan(g, dist, np.zeros(0, np.int64))
        if self.options.root_guids:
            return _plan(g, dist, self._given_rows(fabric, g, dist))
        leaf = np.flatnonzero(_ca_ports(fabric, g) > 0)
        sub = np.ix_(leaf, leaf)
        cands = root_candidates(fabric, g, dist)
        for roots in cands:
            p = _plan(g, dist, roots)
            if not ((p.legal[sub] == UNREACHABLE) & (dist[sub] < UNREACHABLE)).any():
                return p
        raise AssertionError("a single root per component always gives legal paths")

    def _given_rows(self, fabric: Fabric, g: SwitchGraph, dist: npt.NDArray[np.uint8]) -> npt.NDArray[np.int64]:
        given = _given_roots(fabric, g, self.options.root_guids)
        if given.size == 0:
            raise RoutingError("updn: no root switches")
        # Switches no given root reaches are ranked from a root detected in their own component.
        reached: npt.NDArray[np.bool_] = np.any(dist[:, given] < UNREACHABLE, axis=1)
        if reached.all():
            return given
        extra = root_candidates(fabric, g, dist)[-1]
        return np.union1d(given, extra[~reached[extra]])

    def compute(self, fabric: Fabric, lids: LidMap) -> Lft:
        g = switch_graph(fabric)
        p = self.plan(fabric, g)
        up_nbr, down_nbr = p.up_nbr, p.down_nbr
        down_t = np.ascontiguousarray(p.down.T)
        legal_t = np.ascontiguousarray(p.legal.T)

        def candidates(d: int) -> npt.NDArray[np.bool_]:
            dn = padded(down_t[d])
            lg = padded(legal_t[d])
            in_r = dn[:-1] < UNREACHABLE
            go_down = (dn[down_nbr] == dn[:-1, None] - 1) & (down_nbr >= 0) & in_r[:, None]
            go_up = (lg[up_nbr] == lg[:-1, None] - 1) & (up_nbr >= 0) & ~in_r[:, None]
            return go_down | go_up

        return route_balanced(fabric, lids, g, candidates)


def _plan(g: SwitchGraph, dist: npt.NDArray[np.uint8], roots: npt.NDArray[np.int64]) -> UpDownPlan:
    rank = ranks(dist, roots)
    up_nbr, down_nbr = up_down_neighbours(g, rank)
    down, legal = legal_hops(up_nbr, down_nbr)
    return UpDownPlan(roots, rank, up_nbr, down_nbr, down, legal)
