"""Shared machinery of the min-hop and up/down engines.

Both engines see the fabric as a graph of switches (rows of the LFT) joined
by up inter-switch links, compute a hop table per destination switch, and
then fill the LFT destination by destination: among the ports a rule allows
(minimal hops, legal up/down turn) a switch takes the one with the fewest
CA LIDs routed through it so far, lowest port number on a tie, as OpenSM's
``osm_switch_recommend_path`` does with port profiling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.model import Fabric, NodeType
from sm.lidmap import LidMap
from sm.routing.base import NO_ROUTE, Lft, RoutingError, empty_lft

UNREACHABLE = 255
"""Hop-table entry for "no path"; hop counts stop at 254."""


@dataclass(frozen=True)
class SwitchGraph:
    """The switches of a fabric as LFT rows and their up inter-switch links.

    ``nbr[row, port]``: LFT row of the switch cabled (and LinkUp) to that
    port, -1 for no switch there (port 0, a CA, a down or absent link).
    """

    nodes: npt.NDArray[np.intp]
    row_of: npt.NDArray[np.int64]
    nbr: npt.NDArray[np.int64]
    guid: npt.NDArray[np.uint64]

    @property
    def n(self) -> int:
        return int(self.nodes.size)


def switch_graph(fabric: Fabric) -> SwitchGraph:
    """Rows, row lookup and neighbour table of the fabric's switches."""
    sw = fabric.switches
    row_of = np.full(fabric.n_nodes, -1, np.int64)
    row_of[sw] = np.arange(sw.size)
    up = fabric.up_mask()[sw]
    peer = fabric.peer_node[sw].astype(np.int64)
    peer_row = row_of[np.where(up, peer, 0)]
    nbr = np.where(up & (peer_row >= 0), peer_row, -1)
    nbr[:, 0] = -1
    return SwitchGraph(sw, row_of, nbr, fabric.node_guid[sw].copy())


def hop_matrix(nbr: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]:
    """``dist[x, d]``: fewest moves from row ``x`` to row ``d`` along edges ``x -> nbr[x, p]``.

    A breadth-first search from every destination at once: the set of
    destinations reached by each row is a packed bit row, and one level is
    an OR over the neighbours' bit rows. 255 means unreachable.
    """
    n = nbr.shape[0]
    dist = np.full((n, n), UNREACHABLE, np.uint8)
    if n == 0:
        return dist
    np.fill_diagonal(dist, 0)
    ports = np.flatnonzero((nbr >= 0).any(axis=0))
    if ports.size == 0:
        return dist
    idx = np.where(nbr[:, ports] >= 0, nbr[:, ports], n)
    reached = np.packbits(np.eye(n, dtype=np.bool_), axis=1)
    frontier = reached.copy()
    zero = np.zeros((1, reached.shape[1]), np.uint8)
    level = 0
    while True:
        level += 1
        padded = np.concatenate([frontier, zero])
        new = np.bitwise_or.reduce(padded[idx], axis=1)
        new &= ~reached
        if not new.any():
            return dist
        if level >= UNREACHABLE:
            raise RoutingError(f"switch graph has paths longer than {UNREACHABLE - 1} hops")
        reached |= new
        dist[np.unpackbits(new, axis=1, count=n).view(np.bool_)] = level
        frontier = new


def padded(row: npt.NDArray[np.uint8]) -> npt.NDArray[np.int16]:
    """A hop-table row as int16 with one extra UNREACHABLE slot, so ``nbr == -1`` indexes it."""
    out = np.empty(row.size + 1, np.int16)
    out[:-1] = row
    out[-1] = UNREACHABLE
    return out


@dataclass(frozen=True)
class Destinations:
    """Every used LID with the LFT row it is delivered from and the port it leaves on there.

    LIDs whose end port hangs on no switch (a CA port that is down or cabled
    to another CA) have row -1 and stay unrouted. ``counted`` marks the LIDs
    that add to the per-port balance counters: CA LIDs only, as OpenSM does
    unless ``port_profile_switch_nodes`` is set.
    """

    lid: npt.NDArray[np.int64]
    row: npt.NDArray[np.int64]
    egress: npt.NDArray[np.int64]
    counted: npt.NDArray[np.bool_]


def destinations(fabric: Fabric, lids: LidMap, g: SwitchGraph) -> Destinations:
    used = lids.used().astype(np.int64)
    on = lids.owner_node[used].astype(np.int64)
    op = lids.owner_port[used].astype(np.int64)
    is_sw = fabric.node_type[on] == NodeType.SWITCH
    up = fabric.up_mask()[on, op]
    peer = fabric.peer_node[on, op].astype(np.int64)
    peer_row = g.row_of[np.where(up, peer, 0)]
    ca_ok = ~is_sw & up & (peer_row >= 0)
    row = np.where(is_sw, g.row_of[on], np.where(ca_ok, peer_row, -1))
    egress = np.where(is_sw, 0, np.where(ca_ok, fabric.peer_port[on, op], 0)).astype(np.int64)
    return Destinations(used, row, egress, ~is_sw)


CandidateFn = Callable[[int], npt.NDArray[np.bool_]]
"""Destination row -> ``bool[n_rows, n_ports]``: the ports each switch may use towards it."""

_BIG = np.iinfo(np.int32).max


@dataclass(frozen=True)
class _Choice:
    """The allowed ports towards one destination row, split for the balancing step."""

    single: npt.NDArray[np.int32]
    """Rows with exactly one allowed port ..."""
    p_single: npt.NDArray[np.uint8]
    """... and that port."""
    multi: npt.NDArray[np.int32]
    """Rows with a choice ..."""
    ports: npt.NDArray[np.uint8]
    """... the port columns any of them may use ..."""
    allowed: npt.NDArray[np.bool_]
    """... and which of those columns each may use (``[multi, ports]``)."""

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.single, self.p_single, self.multi, self.ports, self.allowed))


def _choice(candidates: CandidateFn, d: int) -> _Choice:
    cand = candidates(d)
    cand[d] = False
    nc = cand.sum(axis=1)
    single = np.flatnonzero(nc == 1).astype(np.int32)
    multi = np.flatnonzero(nc > 1).astype(np.int32)
    cm = cand[multi]
    ports = np.flatnonzero(cm.any(axis=0)).astype(np.uint8)
    return _Choice(single, cand[single].argmax(axis=1).astype(np.uint8), multi, ports, cm[:, ports])


CACHE_BYTES = 96 << 20
"""Allowed-port tables kept while LIDs alternate between destination switches (about 50 MB for
every switch of a 3-level fat-tree of 36-port switches)."""


def route_balanced(fabric: Fabric, lids: LidMap, g: SwitchGraph, candidates: CandidateFn) -> Lft:
    """Fill an LFT LID by LID in ascending order, balancing over the allowed ports.

    As OpenSM does for each switch, LIDs are taken in ascending order; each
    LID is one vectorized step over all switches: the allowed port with the
    fewest CA LIDs routed through it so far wins, lowest port on a tie.
    Switches with no allowed port get ``NO_ROUTE``. Consecutive LIDs behind
    the same switch share one allowed-port table.
    """
    lft = empty_lft(fabric, lids)
    n = g.n
    if n == 0:
        return lft
    dst = destinations(fabric, lids, g)
    ok = dst.row >= 0
    lid_all, row_all = dst.lid[ok], dst.row[ok]
    egress_all, counted_all = dst.egress[ok], dst.counted[ok]
    if lid_all.size == 0:
        return lft
    # Runs of consecutive LIDs (in LID order) delivered from the same switch.
    starts = np.flatnonzero(np.r_[True, row_all[1:] != row_all[:-1]])
    ends = np.r_[starts[1:], row_all.size]
    n_ports = g.nbr.shape[1]
    sentinel = n * n_ports
    counts = np.zeros(sentinel + 1, np.int64)  # [row * n_ports + port], then a never-chosen slot
    counts[sentinel] = _BIG
    lft_t = np.ascontiguousarray(lft.T)  # [lid, row]: one contiguous row per LID
    cache: dict[int, _Choice] = {}  # least recently used first
    cached = 0
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        d = int(row_all[a])
        hit = cache.pop(d, None)
        ch = hit if hit is not None else _choice(candidates, d)
        cache[d] = ch
        cached += 0 if hit is not None else ch.nbytes
        while cached > CACHE_BYTES and len(cache) > 1:
            cached -= cache.pop(next(iter(cache))).nbytes
        multi, ports = ch.multi, ch.ports
        # Slot of each (row with a choice, allowed port); disallowed ones read the sentinel.
        slot = np.where(ch.allowed, multi[:, None].astype(np.int64) * n_ports + ports, sentinel)
        ar = np.arange(multi.size)
        col = np.full(n, NO_ROUTE, np.uint8)
        col[ch.single] = ch.p_single
        single_slot = ch.single.astype(np.int64) * n_ports + ch.p_single
        for k in range(a, b):
            if multi.size:
                j = counts[slot].argmin(axis=1)
                col[multi] = ports[j]
                if counted_all[k]:
                    counts[slot[ar, j]] += 1
            if counted_all[k]:
                counts[single_slot] += 1
            col[d] = egress_all[k]
            lft_t[lid_all[k]] = col
    return np.ascontiguousarray(lft_t.T)
