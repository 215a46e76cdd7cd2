"""What shape is a fabric: fat-tree (with levels and missing links), torus, ring, or irregular.

Switches are ranked from the leaves (switches with a CA on an up link) up
by breadth-first search over up inter-switch links, as OpenSM's ftree and
updn engines rank them. A fabric is a fat-tree when every inter-switch
link joins adjacent ranks; then the expected links between two levels are
inferred from the best-connected switch of each level (the design every
switch of a level shares), so a degraded tree reports what it misses.
Tori and rings are recognised by a regular switch degree and the distance
profile of a torus with matching dimensions. All array work is numpy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fabric.model import Fabric, NodeType

__all__ = ["ShapeInfo", "components", "detect_shape", "switch_ranks"]


@dataclass(frozen=True)
class ShapeInfo:
    """The detected shape of a fabric.

    ``hosts``: CA nodes (a host with several HCAs counts each).
    ``kind``: "fat-tree", "torus", "ring", "single-switch", "irregular" or
    "empty" (no switches). ``levels``: switch levels of a fat-tree (1 for a
    single switch, 0 otherwise). ``switches_per_level``: leaves first.
    ``expected_switch_links`` / ``missing_links`` / ``missing_switches``:
    for a fat-tree, what a complete tree of the same design would have
    minus what is present (0 for other kinds). ``dims``: torus or ring
    dimensions. ``design``: what a fat-tree is measured against (the
    complete k-port fat-tree when its leaves match, else "inferred" from
    the best-connected switch of each level). ``note``: why a fabric is
    not a fat-tree, or "".
    """

    kind: str
    levels: int
    radix: int
    switches: int
    hosts: int
    switch_links: int
    switches_per_level: list[int] = field(default_factory=list)
    expected_switch_links: int = 0
    missing_links: int = 0
    missing_switches: int = 0
    unreachable_switches: int = 0
    components: int = 0
    dims: list[int] = field(default_factory=list)
    design: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for a human, e.g. for ``ibfm topo show``."""
        if self.kind == "fat-tree":
            per = "/".join(str(n) for n in self.switches_per_level)
            s = (
                f"fat-tree, {self.levels} levels of {self.radix}-port switches ({per}, leaves first), "
                f"{self.hosts} CAs, {self.switch_links} of {self.expected_switch_links} inter-switch links"
            )
            extra = []
            if self.missing_links:
                extra.append(f"{self.missing_links} links missing")
            if self.missing_switches:
                extra.append(f"{self.missing_switches} switches missing")
            if self.unreachable_switches:
                extra.append(f"{self.unreachable_switches} switches unreachable from the leaves")
            return s + (f" ({', '.join(extra)})" if extra else "")
        if self.kind in ("torus", "ring"):
            shape = "x".join(str(d) for d in self.dims)
            return (
                f"{self.kind} {shape} of {self.radix}-port switches, {self.switches} switches, "
                f"{self.hosts} CAs, {self.switch_links} inter-switch links"
            )
        s = f"{self.kind}, {self.switches} switches, {self.hosts} CAs"
        s += f", {self.switch_links} inter-switch links"
        if self.components > 1:
            s += f", {self.components} components"
        return s + (f" ({self.note})" if self.note else "")


def components(n: int, a: npt.NDArray[np.integer], b: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """Connected-component labels of ``n`` vertices and edges ``a[i] -- b[i]`` (smallest member id)."""
    lab = np.arange(n, dtype=np.int64)
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    while True:
        new = lab.copy()
        np.minimum.at(new, a, lab[b])
        np.minimum.at(new, b, lab[a])
        while True:  # pointer jumping
            nxt = new[new]
            if np.array_equal(nxt, new):
                break
            new = nxt
        if np.array_equal(new, lab):
            return lab
        lab = new


def _bfs(
    n: int, a: npt.NDArray[np.int64], b: npt.NDArray[np.int64], sources: npt.NDArray[np.intp]
) -> npt.NDArray[np.int64]:
    """Hop distance from the nearest source over undirected edges; -1 where unreachable."""
    dist = np.full(n, -1, np.int64)
    src = np.concatenate([a, b])
    dst = np.concatenate([b, a])
    frontier = np.zeros(n, np.bool_)
    frontier[sources] = True
    dist[sources] = 0
    d = 0
    while frontier.any():
        d += 1
        hit = dst[frontier[src]]
        hit = hit[dist[hit] < 0]
        frontier[:] = False
        frontier[hit] = True
        dist[hit] = d
    return dist


def switch_ranks(fabric: Fabric) -> npt.NDArray[np.int64]:
    """Per node: rank of a switch above the leaves (0 = leaf, a switch with a CA), -1 for CAs and
    switches no up inter-switch link path joins to a leaf."""
    sl = fabric.switch_links()
    dist = _bfs(fabric.n_nodes, sl[:, 0], sl[:, 2], fabric.leaves())
    dist[fabric.node_type != NodeType.SWITCH] = -1
    return dist


def _ring_profile(s: int) -> npt.NDArray[np.int64]:
    """How many nodes of a ring of ``s`` are at distance 0, 1, ... from one node."""
    c = np.zeros(s // 2 + 1, np.int64)
    c[0] = 1
    c[1:] = 2
    if s % 2 == 0:
        c[-1] = 1
    if s == 1:
        c = np.ones(1, np.int64)
    return c


def _factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Non-increasing tuples of ``parts`` factors >= 2 whose product is ``n``."""
    if parts == 1:
        return [(n,)] if n >= 2 else []
    out = []
    for f in range(2, n + 1):
        if n % f == 0:
            out += [(*rest, f) for rest in _factorisations(n // f, parts - 1) if rest[-1] >= f]
    return out


def _torus_dims(n: int, a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> list[int] | None:
    """Dimensions of a torus (1 to 3 dims) whose degree and distance profile the graph shows."""
    if n < 2:
        return None
    deg = np.bincount(np.concatenate([a, b]), minlength=n)
    if deg.min() != deg.max() or components(n, a, b).max() != 0:
        return None
    profiles = []
    for s in sorted({0, n // 2, n - 1}):
        d = _bfs(n, a, b, np.array([s]))
        profiles.append(np.bincount(d))
    for parts in (1, 2, 3):
        for dims in _factorisations(n, parts):
            if sum(2 if s > 2 else 1 for s in dims) != deg[0]:
                continue
            prof = np.ones(1, np.int64)
            for s in dims:
                prof = np.convolve(prof, _ring_profile(s))
            if all(p.shape == prof.shape and np.array_equal(p, prof) for p in profiles):
                return list(dims)
    return None


def detect_shape(fabric: Fabric) -> ShapeInfo:
    """Classify ``fabric`` from its up links and, for a fat-tree, count what a complete tree would add."""
    sw = fabric.switches
    n_sw = int(sw.size)
    hosts = int(fabric.cas.size)
    radix = int(fabric.nports[sw].max()) if n_sw else 0
    sl = fabric.switch_links()
    base: dict[str, Any] = {
        "radix": radix,
        "switches": n_sw,
        "hosts": hosts,
        "switch_links": int(sl.shape[0]),
    }
    if n_sw == 0:
        return ShapeInfo("empty", 0, **base)
    lab = components(fabric.n_nodes, sl[:, 0], sl[:, 2])
    n_comp = int(np.unique(lab[sw]).size)
    base["components"] = n_comp
    if n_sw == 1:
        return ShapeInfo("single-switch", 1, switches_per_level=[1], **base)

    ranks = switch_ranks(fabric)
    ra, rb = ranks[sl[:, 0]], ranks[sl[:, 2]]
    unreachable = int(np.count_nonzero(ranks[sw] < 0))
    reach = (ra >= 0) & (rb >= 0)
    bad = reach & (np.abs(ra - rb) != 1)
    note = ""
    if fabric.leaves().size == 0:
        note = "no switch has a CA"
    elif bad.any():
        i = int(np.flatnonzero(bad)[0])
        note = (
            f"{fabric.names[int(sl[i, 0])]} and {fabric.names[int(sl[i, 2])]} are linked "
            f"at ranks {int(ra[i])} and {int(rb[i])}"
        )
    elif unreachable * 2 > n_sw:
        note = f"{unreachable} of {n_sw} switches unreachable from the leaves"
    else:
        return _fat_tree(fabric, ranks, sl, reach, unreachable, base)

    # Not a fat-tree: a regular switch graph may be a torus or a ring.
    pairs = np.unique(np.sort(sl[:, [0, 2]], axis=1), axis=0)
    local = np.full(fabric.n_nodes, -1, np.int64)
    local[sw] = np.arange(n_sw)
    dims = _torus_dims(n_sw, local[pairs[:, 0]], local[pairs[:, 1]])
    if dims is not None and pairs.shape[0] == sl.shape[0]:
        kind = "ring" if len(dims) == 1 else "torus"
        return ShapeInfo(kind, 0, dims=dims, **base)
    return ShapeInfo("irregular", 0, note=note, **base)


def _kary(levels: int, k: int) -> tuple[list[int], int] | None:
    """Switches per level and inter-switch links of the complete k-port fat-tree of 2 or 3 levels."""
    if k % 2 or k < 4:
        return None
    h = k // 2
    if levels == 2:
        return [k, h], k * h
    if levels == 3:
        return [k * h, k * h, h * h], 2 * k * h * h
    return None


def _fat_tree(
    fabric: Fabric,
    ranks: npt.NDArray[np.int64],
    sl: npt.NDArray[np.int64],
    reach: npt.NDArray[np.bool_],
    unreachable: int,
    base: dict[str, Any],
) -> ShapeInfo:
    levels = int(ranks.max()) + 1
    per_level = np.bincount(ranks[ranks >= 0], minlength=levels)
    e = sl[reach]
    lo = np.where(ranks[e[:, 0]] < ranks[e[:, 2]], e[:, 0], e[:, 2])
    hi = np.where(ranks[e[:, 0]] < ranks[e[:, 2]], e[:, 2], e[:, 0])
    up = np.bincount(lo, minlength=fabric.n_nodes)  # links to the level above
    down = np.bincount(hi, minlength=fabric.n_nodes)  # links to the level below
    # The design, inferred level by level from the best-connected switch of each level.
    expected_links = 0
    expected_per_level = [int(per_level[0])]
    for r in range(levels - 1):
        up_r = int(up[ranks == r].max())
        down_n = int(down[ranks == r + 1].max())
        exp = max(expected_per_level[r] * up_r, int(per_level[r + 1]) * down_n)
        expected_links += exp
        n_next = max(int(per_level[r + 1]), math.ceil(exp / down_n)) if down_n else int(per_level[r + 1])
        expected_per_level.append(n_next)
    design = "inferred"
    # A tree whose leaves match the complete k-ary fat-tree of the same radix is measured
    # against that tree: a lost spine then counts even though every leaf lost one uplink.
    # A top level less than 3/4 populated is taken for a design (oversubscription, e.g.
    # 24 hosts and 12 uplinks per leaf), not for failures.
    kary = _kary(levels, int(base["radix"]))
    if kary is not None:
        k_per_level, k_links = kary
        ca_peers = fabric.peer_node[fabric.cas, 1:].ravel()
        ca_per_switch = np.bincount(ca_peers[ca_peers >= 0], minlength=fabric.n_nodes)
        if (
            per_level[0] == k_per_level[0]
            and all(int(n) <= m for n, m in zip(per_level, k_per_level, strict=True))
            and int(ca_per_switch.max()) <= base["radix"] // 2
            and int(up.max()) <= base["radix"] // 2
            and 4 * int(per_level[-1]) >= 3 * k_per_level[-1]
        ):
            design = f"{base['radix']}-port fat-tree"
            expected_links = max(expected_links, k_links)
            expected_per_level = [max(a, b) for a, b in zip(expected_per_level, k_per_level, strict=True)]
    return ShapeInfo(
        "fat-tree",
        levels,
        switches_per_level=per_level.tolist(),
        expected_switch_links=expected_links,
        missing_links=max(0, expected_links - int(e.shape[0])),
        missing_switches=sum(expected_per_level) - int(per_level.sum()),
        unreachable_switches=unreachable,
        design=design,
        **base,
    )
