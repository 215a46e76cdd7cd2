"""Topology generators: fat-trees (k-ary and XGFT), rail clusters, rings, tori, degradation.

Every generator returns a :class:`~fabric.model.Fabric` built through
:class:`~fabric.model.FabricBuilder`, with links trained (LinkUp, INIT) at
4x and the requested speed. Node names are readable unique ids (the quoted
ids of a net file) and double as NodeDescription; GUIDs are allocated in
node order from the builder's base, so the same call always yields the same
fabric.

Port numbering is fixed and documented per generator: a switch's down ports
(towards the hosts) come first, then its up ports, so ``ibroute`` dumps and
traces read the same on every generated tree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import DEFAULT_SPEED, MAX_PORTS, NO_PEER, Fabric, FabricBuilder, NodeType, Speed

__all__ = [
    "GenerateError",
    "degrade",
    "fattree",
    "rail_cluster",
    "ring",
    "torus",
    "xgft",
]


MAX_NODES = 1_000_000
"""Largest fabric a generator builds (the unicast LID space ends at 49,151 anyway)."""


class GenerateError(IbfmError):
    """Parameters that describe no valid topology."""


@dataclass
class _Plan:
    """Nodes and cables of a topology as flat lists, turned into a Fabric at once."""

    types: list[NodeType] = field(default_factory=list)
    nports: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    descs: list[str] = field(default_factory=list)
    system: list[int] = field(default_factory=list)
    """Per node: index of the node whose GUID is its SystemImageGUID (itself by default)."""
    links: list[npt.NDArray[np.int64]] = field(default_factory=list)

    def add(
        self, type: NodeType, nports: int, names: Sequence[str], descs: Sequence[str] | None = None
    ) -> int:
        """Add ``len(names)`` nodes of one kind; returns the index of the first."""
        first = len(self.names)
        if not 1 <= nports <= MAX_PORTS:
            raise GenerateError(f"{names[0] if names else 'node'}: {nports} ports, outside 1..{MAX_PORTS}")
        self.types.extend([type] * len(names))
        self.nports.extend([nports] * len(names))
        self.names.extend(names)
        self.descs.extend(names if descs is None else descs)
        self.system.extend(range(first, first + len(names)))
        return first

    def cable(self, n1: npt.ArrayLike, p1: npt.ArrayLike, n2: npt.ArrayLike, p2: npt.ArrayLike) -> None:
        """Add cables (node, port) -- (node, port), element-wise over arrays."""
        a, b, c, d = np.broadcast_arrays(*(np.asarray(x, np.int64) for x in (n1, p1, n2, p2)))
        self.links.append(np.stack([a.ravel(), b.ravel(), c.ravel(), d.ravel()], axis=1))

    def build(self, speed: Speed) -> Fabric:
        fb = FabricBuilder()
        for t, np_, name, desc in zip(self.types, self.nports, self.names, self.descs, strict=True):
            fb.add_node(t, np_, name, desc=desc)
        links = np.concatenate(self.links) if self.links else np.zeros((0, 4), np.int64)
        if speed != DEFAULT_SPEED:
            for n, p in np.concatenate([links[:, :2], links[:, 2:]]).tolist():
                fb.set_port(n, p, speed_cap=speed)
        for n1, p1, n2, p2 in links.tolist():
            fb.connect(n1, p1, n2, p2)
        f = fb.build()
        f.speed_cap[f.port_exists] = speed
        f.sysimg_guid[:] = f.node_guid[np.asarray(self.system, np.int64)]
        return f


def _ids(prefix: str, n: int, width: int) -> list[str]:
    w = max(width, len(str(max(n - 1, 0))))
    return [f"{prefix}{i:0{w}d}" for i in range(n)]


def _check_radix(radix: int) -> None:
    if radix % 2 or not 4 <= radix <= MAX_PORTS:
        raise GenerateError(f"radix {radix}: must be even, 4..{MAX_PORTS}")


# -- fat-trees -------------------------------------------------------------------------------------


def _xgft_edges(m: Sequence[int], w: Sequence[int]) -> tuple[list[int], list[npt.NDArray[np.int64]]]:
    """Node counts per level and, per level pair ``l -> l+1``, the cables as ``(E, 4)`` arrays.

    Level ``l`` nodes are numbered in mixed radix over the label
    ``(x_h .. x_{l+1}, y_l .. y_1)`` with ``x_i < m_i``, ``y_i < w_i`` and
    ``x_h`` most significant. A level-``l`` node with digit ``x_{l+1}``
    links to the level-``l+1`` node that has ``y_{l+1}`` in that place and
    agrees everywhere else. Child side port ``m_l + 1 + y_{l+1}`` (up
    ports follow the ``m_l`` down ports; hosts have ``m_0 = 0``), parent
    side port ``x_{l+1} + 1``. Node indices are local to their level.
    """
    h = len(m)
    counts = [
        math.prod(m[i] for i in range(lv, h)) * math.prod(w[i] for i in range(lv)) for lv in range(h + 1)
    ]
    edges: list[npt.NDArray[np.int64]] = []
    for lv in range(h):
        weight = math.prod(w[i] for i in range(lv))  # place value of digit lv+1 (same on both levels)
        ml, wl = m[lv], w[lv]  # m_{lv+1}, w_{lv+1}
        child = np.repeat(np.arange(counts[lv], dtype=np.int64), wl)
        y = np.tile(np.arange(wl, dtype=np.int64), counts[lv])
        low = child % weight
        x = (child // weight) % ml
        high = child // (weight * ml)
        parent = high * (weight * wl) + y * weight + low
        down_ports = m[lv - 1] if lv > 0 else 0
        edges.append(np.stack([child, down_ports + 1 + y, parent, x + 1], axis=1))
    return counts, edges


def xgft(
    h: int,
    m: Sequence[int],
    w: Sequence[int],
    *,
    speed: Speed = Speed.NDR,
    host_prefix: str = "host-",
) -> Fabric:
    """Öhring et al.'s extended generalized fat-tree XGFT(h; m1..mh; w1..wh).

    Level 0 holds the hosts (CAs with ``w1`` ports), levels 1..h switches.
    A level-``l`` node has ``m_l`` children and ``w_{l+1}`` parents;
    level ``l`` has ``prod(m_{l+1..h}) * prod(w_{1..l})`` nodes. Ports:
    switch ports ``1..m_l`` go down (to child ``x_l``), ports
    ``m_l+1..m_l+w_{l+1}`` go up (to parent ``y_{l+1}``); a host's port
    ``1 + y_1`` goes to its ``y_1``-th leaf. Switch names are
    ``sw-L<level>-<index>``, hosts ``host-<index>``.

    A k-ary n-tree is XGFT(n; k..k; 1, k..k); :func:`fattree` is the
    XGFT with ``m = (k/2, k/2, k)``, ``w = (1, k/2, k/2)`` (3 levels).
    """
    if h < 1 or len(m) != h or len(w) != h:
        raise GenerateError(
            f"xgft: need h >= 1 and h values for m and for w (h={h}, m={list(m)}, w={list(w)})"
        )
    if any(v < 1 for v in (*m, *w)):
        raise GenerateError(f"xgft: m and w must be >= 1 (m={list(m)}, w={list(w)})")
    for lv in range(1, h + 1):
        ports = m[lv - 1] + (w[lv] if lv < h else 0)
        if ports > MAX_PORTS:
            raise GenerateError(f"xgft: level-{lv} switches need {ports} ports (max {MAX_PORTS})")
    if w[0] > MAX_PORTS:
        raise GenerateError(f"xgft: hosts need {w[0]} ports (max {MAX_PORTS})")
    total = sum(math.prod(m[lv:]) * math.prod(w[:lv]) for lv in range(h + 1))
    if total > MAX_NODES:
        raise GenerateError(f"xgft: {total} nodes, more than {MAX_NODES}")
    counts, edges = _xgft_edges(m, w)
    names = [_ids(host_prefix, counts[0], 4)] + [_ids(f"sw-L{lv}-", counts[lv], 3) for lv in range(1, h + 1)]
    return _build_levels(m, w, counts, edges, names, speed)


def _build_levels(
    m: Sequence[int],
    w: Sequence[int],
    counts: list[int],
    edges: list[npt.NDArray[np.int64]],
    names: list[list[str]],
    speed: Speed,
    nports: list[int] | None = None,
) -> Fabric:
    """Hosts first, then switches level by level from the leaves up."""
    h = len(m)
    plan = _Plan()
    base = [plan.add(NodeType.CA, w[0], names[0])]
    for lv in range(1, h + 1):
        np_ = nports[lv] if nports else m[lv - 1] + (w[lv] if lv < h else 0)
        base.append(plan.add(NodeType.SWITCH, np_, names[lv]))
    for lv, e in enumerate(edges):
        plan.cable(e[:, 0] + base[lv], e[:, 1], e[:, 2] + base[lv + 1], e[:, 3])
    return plan.build(speed)


def fattree(
    levels: int,
    radix: int,
    *,
    oversubscribe: tuple[int, int] | None = None,
    speed: Speed = Speed.NDR,
) -> Fabric:
    """A fat-tree of ``radix``-port switches (even radix 4..64); hosts are one-port CAs.

    ``levels=2`` (leaf/spine, XGFT(2; k/2, k; 1, k/2)): ``k`` leaves
    ``leaf-NN`` with ``k/2`` hosts each and ``k/2`` spines ``spine-NN``.
    Leaf ports ``1..k/2`` go to its hosts, port ``k/2+1+s`` to spine ``s``;
    spine port ``l+1`` goes to leaf ``l``.

    ``levels=3`` (the k-ary 3-level fat-tree, XGFT(3; k/2, k/2, k; 1, k/2,
    k/2)): ``k`` pods of ``k/2`` leaves ``leaf-pPP-sSS`` and ``k/2``
    aggregation switches ``agg-pPP-sSS``; ``(k/2)^2`` cores ``core-NNNN``;
    ``2 (k/2)^3`` hosts. Leaf ports ``1..k/2`` to hosts, ``k/2+1+a`` to
    agg ``a`` of its pod; agg ports ``1..k/2`` to leaf ``l+1`` of its pod,
    ``k/2+1+j`` to core ``j*(k/2) + a``; core ``c`` port ``p+1`` goes to
    pod ``p`` (to agg ``c mod k/2``, on its up port ``k/2+1+c div k/2``).

    ``oversubscribe=(D, U)`` (``levels=2`` only): each of ``k`` leaves has
    ``D`` hosts on ports ``1..D`` and one link to each of ``U`` spines on
    ports ``D+1..D+U``; spine port ``l+1`` to leaf ``l``. E.g. k=36,
    (24, 12): 864 hosts, 36 leaves, 12 spines (2:1).

    Hosts are ``host-NNNNN``, numbered leaf by leaf; host ``i`` hangs on
    leaf ``i div (hosts per leaf)``, port ``i mod (hosts per leaf) + 1``.
    """
    _check_radix(radix)
    k, half = radix, radix // 2
    m: tuple[int, ...]  # XGFT(h; m; w): down and up ports per level, bottom first
    w: tuple[int, ...]
    if oversubscribe is not None:
        if levels != 2:
            raise GenerateError(f"oversubscribe: only for a 2-level leaf/spine tree (levels={levels})")
        d, u = oversubscribe
        if d < 1 or u < 1 or d + u > k:
            raise GenerateError(f"oversubscribe {d}:{u}: need D >= 1, U >= 1 and D + U <= radix {k}")
        m, w = (d, k), (1, u)
    elif levels == 2:
        m, w = (half, k), (1, half)
    elif levels == 3:
        m, w = (half, half, k), (1, half, half)
    else:
        raise GenerateError(f"fattree: levels must be 2 or 3 (got {levels})")
    counts, edges = _xgft_edges(m, w)
    names: list[list[str]] = [_ids("host-", counts[0], 5)]
    if levels == 2:
        names += [_ids("leaf-", counts[1], 2), _ids("spine-", counts[2], 2)]
    else:
        pods = [f"p{p:0{max(2, len(str(k - 1)))}d}" for p in range(k)]
        sw = max(2, len(str(half - 1)))
        names += [
            [f"leaf-{pod}-s{s:0{sw}d}" for pod in pods for s in range(half)],
            [f"agg-{pod}-s{s:0{sw}d}" for pod in pods for s in range(half)],
            _ids("core-", counts[3], 4),
        ]
    nports = [1] + [k] * levels
    return _build_levels(m, w, counts, edges, names, speed, nports)


# -- rail-optimised cluster -------------------------------------------------------------------------


def rail_cluster(
    n_hosts: int = 32,
    rails: int = 8,
    hosts_per_leaf: int | None = None,
    radix: int = 64,
    *,
    speed: Speed = Speed.NDR,
) -> Fabric:
    """A DGX SuperPOD-like rail-optimised scalable unit (leaf/spine, non-blocking at the leaves).

    Each of ``n_hosts`` hosts ``dgx-NNN`` (numbered from 1, as sites do)
    has ``rails`` single-port HCAs, each its own CA node named
    ``dgx-NNN-mlx5_R`` with NodeDescription ``"dgx-NNN mlx5_R"``; the HCAs
    of one host share its SystemImageGUID. HCA ``R`` of every host is cabled
    to a leaf of rail ``R``: hosts are split into groups of ``hosts_per_leaf``
    (default ``min(n_hosts, radix // 2)``), one leaf ``rail-R-leaf-G`` per
    rail and group, so there are ``rails * groups`` leaves. A leaf's ports
    ``1..hosts_per_leaf`` go to the group's hosts in order; its
    ``hosts_per_leaf`` uplinks (ports ``hosts_per_leaf+1..2*hosts_per_leaf``)
    are spread evenly over all spines ``spine-NN``: ``L`` parallel links to
    each of ``hosts_per_leaf / L`` spines, ``L`` the largest divisor of
    ``hosts_per_leaf`` with ``leaves * L <= radix``. Leaf uplink port
    ``hosts_per_leaf + 1 + s*L + j`` goes to spine ``s``, port
    ``leaf*L + j + 1``. The default (32 hosts, 8 rails, radix 64) is one
    SuperPOD SU: 256 HCAs, 8 leaves, 4 spines with 8 links per leaf-spine pair.
    """
    if n_hosts < 1 or rails < 1:
        raise GenerateError(f"rail_cluster: need n_hosts >= 1 and rails >= 1 (got {n_hosts}, {rails})")
    if not 2 <= radix <= MAX_PORTS:
        raise GenerateError(f"rail_cluster: radix {radix} outside 2..{MAX_PORTS}")
    hpl = min(n_hosts, radix // 2) if hosts_per_leaf is None else hosts_per_leaf
    if not 1 <= hpl <= radix // 2:
        raise GenerateError(f"rail_cluster: hosts_per_leaf {hpl} outside 1..{radix // 2} (radix {radix})")
    groups = -(-n_hosts // hpl)
    n_leaves = rails * groups
    if n_leaves > radix:
        raise GenerateError(
            f"rail_cluster: {n_leaves} leaves ({rails} rails x {groups} groups) exceed one spine's "
            f"{radix} ports; use fewer hosts or more hosts per leaf"
        )
    per_pair = max(d for d in range(1, hpl + 1) if hpl % d == 0 and n_leaves * d <= radix)
    n_spines = hpl // per_pair
    plan = _Plan()
    hw = max(3, len(str(n_hosts)))
    host_base = plan.add(
        NodeType.CA,
        1,
        [f"dgx-{h + 1:0{hw}d}-mlx5_{r}" for h in range(n_hosts) for r in range(rails)],
        [f"dgx-{h + 1:0{hw}d} mlx5_{r}" for h in range(n_hosts) for r in range(rails)],
    )
    # All HCAs of a host report the GUID of its first HCA as SystemImageGUID.
    for i in range(n_hosts * rails):
        plan.system[host_base + i] = host_base + (i // rails) * rails
    gw = max(2, len(str(groups - 1)))
    leaf_base = plan.add(
        NodeType.SWITCH, radix, [f"rail-{r}-leaf-{g:0{gw}d}" for r in range(rails) for g in range(groups)]
    )
    spine_base = plan.add(NodeType.SWITCH, radix, _ids("spine-", n_spines, 2))
    host = np.arange(n_hosts, dtype=np.int64)
    for r in range(rails):
        leaf = r * groups + host // hpl
        plan.cable(host_base + host * rails + r, 1, leaf_base + leaf, host % hpl + 1)
    leaf = np.repeat(np.arange(n_leaves, dtype=np.int64), hpl)
    up = np.tile(np.arange(hpl, dtype=np.int64), n_leaves)  # uplink index s*L + j
    spine, j = up // per_pair, up % per_pair
    plan.cable(leaf_base + leaf, hpl + 1 + up, spine_base + spine, leaf * per_pair + j + 1)
    return plan.build(speed)


# -- rings and tori ----------------------------------------------------------------------------------


def ring(n_switches: int, hosts_per_switch: int = 1, radix: int = 8, *, speed: Speed = Speed.NDR) -> Fabric:
    """``n_switches`` switches ``sw-NN`` in a ring, ``hosts_per_switch`` hosts on each.

    This is :func:`torus` with one dimension: switch ports ``1..H`` go to
    its hosts, port ``H+1`` to the next switch (its port ``H+2``). Two
    switches share one cable, not two.
    """
    return torus([n_switches], hosts_per_switch, radix, speed=speed)


def torus(
    dims: Sequence[int], hosts_per_switch: int = 1, radix: int = 16, *, speed: Speed = Speed.NDR
) -> Fabric:
    """A 1-, 2- or 3-D torus of switches with wraparound, ``hosts_per_switch`` hosts on each.

    Switch ``sw-X-Y[-Z]`` sits at coordinates (x, y[, z]); index in
    row-major order, the last coordinate fastest. Ports ``1..H`` go to its
    hosts; in dimension ``d`` port ``H+2d+1`` ("plus") is cabled to the
    "minus" port ``H+2d+2`` of the neighbour at coordinate ``+1`` (mod the
    size). A dimension of size 2 gets a single cable between the two
    switches (a wraparound one would only double it); a dimension of size 1
    has none. Their ports stay reserved, so numbering is the same
    everywhere. Hosts ``host-NNNN`` are numbered switch by switch.
    """
    dims = [int(d) for d in dims]
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise GenerateError(f"torus: need 1 to 3 dimensions, each >= 1 (got {dims})")
    if hosts_per_switch < 0:
        raise GenerateError(f"torus: hosts_per_switch {hosts_per_switch} < 0")
    need = hosts_per_switch + 2 * len(dims)
    if need > radix or radix > MAX_PORTS:
        raise GenerateError(
            f"torus: {hosts_per_switch} hosts + {2 * len(dims)} torus ports need {need} ports; "
            f"radix is {radix} (max {MAX_PORTS})"
        )
    n_sw = math.prod(dims)
    coords = np.stack(np.unravel_index(np.arange(n_sw), dims), axis=1)
    plan = _Plan()
    sw_names = ["sw-" + "-".join(f"{c:02d}" for c in row) for row in coords.tolist()]
    sw_base = plan.add(NodeType.SWITCH, radix, sw_names)
    h = hosts_per_switch
    if h:
        host_base = plan.add(NodeType.CA, 1, _ids("host-", n_sw * h, 4))
        hosts = np.arange(n_sw * h, dtype=np.int64)
        plan.cable(host_base + hosts, 1, sw_base + hosts // h, hosts % h + 1)
    for d, size in enumerate(dims):
        if size == 1:
            continue
        src = np.arange(n_sw, dtype=np.int64)
        if size == 2:
            src = src[coords[:, d] == 0]
        nxt = coords[src].copy()
        nxt[:, d] = (nxt[:, d] + 1) % size
        dst = np.ravel_multi_index(tuple(nxt.T), dims).astype(np.int64)
        plan.cable(sw_base + src, h + 2 * d + 1, sw_base + dst, h + 2 * d + 2)
    return plan.build(speed)


def dragonfly(
    groups: int,
    routers: int,
    hosts_per_router: int,
    global_links: int,
    radix: int | None = None,
    *,
    speed: Speed = Speed.NDR,
) -> Fabric:
    """A dragonfly (Kim, Dally, Scott, Abts, ISCA 2008): ``groups`` groups of ``routers`` switches, all-to-all
    inside a group, ``global_links`` links from each router to other groups, ``hosts_per_router`` hosts.

    Every pair of groups gets the same number of global links, ``routers * global_links // (groups - 1)``
    (one in the canonical balanced dragonfly, ``groups = routers * global_links + 1``), so ``groups`` may be
    at most ``routers * global_links + 1``; global slots left over stay free. Group ``i``'s slot ``k``
    (router ``k // global_links``) goes to group ``(i + 1 + k % (groups - 1)) % groups`` (the "consecutive"
    arrangement). Router ``gGG-rRR``: ports ``1..p`` its hosts, then one per other router of its group in
    order, then its global links. ``radix`` defaults to exactly what a router needs.
    """
    g, a, p, h = int(groups), int(routers), int(hosts_per_router), int(global_links)
    if g < 2 or a < 1 or p < 0 or h < 1:
        raise GenerateError(
            f"dragonfly: need groups >= 2, routers >= 1, hosts >= 0, global links >= 1 (got {g}, {a}, {p}, {h})"
        )
    if g - 1 > a * h:
        raise GenerateError(
            f"dragonfly: {g} groups need at least {g - 1} global links per group; {a} routers x {h} give {a * h}"
        )
    need = p + (a - 1) + h
    k = need if radix is None else int(radix)
    if need > k or k > MAX_PORTS:
        raise GenerateError(f"dragonfly: a router needs {need} ports ({p} hosts, {a - 1} local, {h} global); radix {k}")
    plan = _Plan()
    names = [f"g{gi:02d}-r{ri:02d}" for gi in range(g) for ri in range(a)]
    sw_base = plan.add(NodeType.SWITCH, k, names)
    n_sw = g * a
    if p:
        host_base = plan.add(NodeType.CA, 1, _ids("host-", n_sw * p, 4))
        hosts = np.arange(n_sw * p, dtype=np.int64)
        plan.cable(host_base + hosts, 1, sw_base + hosts // p, hosts % p + 1)
    # local: all-to-all; router x's port to router y (y != x) is p + 1 + (y if y < x else y - 1)
    src, sp, dst, dp = [], [], [], []
    for gi in range(g):
        for x in range(a):
            for y in range(x + 1, a):
                src.append(gi * a + x)
                sp.append(p + 1 + (y - 1))
                dst.append(gi * a + y)
                dp.append(p + 1 + x)
    # global: pairs of groups, ``per`` links each
    per = a * h // (g - 1)
    for i in range(g):
        for j in range(i + 1, g):
            for c in range(per):
                ki = c * (g - 1) + (j - i - 1) % g
                kj = c * (g - 1) + (i - j - 1) % g
                src.append(i * a + ki // h)
                sp.append(p + a + ki % h)
                dst.append(j * a + kj // h)
                dp.append(p + a + kj % h)
    if src:
        plan.cable(sw_base + np.array(src), np.array(sp), sw_base + np.array(dst), np.array(dp))
    return plan.build(speed)


def random_regular(
    switches: int,
    degree: int,
    hosts_per_switch: int = 1,
    radix: int | None = None,
    *,
    seed: int = 0,
    speed: Speed = Speed.NDR,
) -> Fabric:
    """A random ``degree``-regular graph of ``switches`` switches (Jellyfish, Singla et al., NSDI 2012), connected,
    ``hosts_per_switch`` hosts on each; the same ``seed`` gives the same fabric.

    Switch ``sw-NNNN``: ports ``1..H`` its hosts, then its neighbours in ascending order. ``switches *
    degree`` must be even and ``degree < switches``. ``radix`` defaults to ``H + degree``.
    """
    import networkx as nx

    n, d, hh = int(switches), int(degree), int(hosts_per_switch)
    if n < 2 or not 1 <= d < n or (n * d) % 2 or hh < 0:
        raise GenerateError(
            f"random: need 2+ switches, 1 <= degree < switches, switches x degree even (got {n} x {d}), hosts >= 0"
        )
    k = hh + d if radix is None else int(radix)
    if hh + d > k or k > MAX_PORTS:
        raise GenerateError(f"random: {hh} hosts + degree {d} need {hh + d} ports; radix {k}")
    for attempt in range(100):
        graph = nx.random_regular_graph(d, n, seed=seed * 1000 + attempt)
        if nx.is_connected(graph):
            break
    else:
        raise GenerateError(f"random: no connected {d}-regular graph of {n} switches in 100 draws (seed {seed})")
    plan = _Plan()
    sw_base = plan.add(NodeType.SWITCH, k, _ids("sw-", n, 4))
    if hh:
        host_base = plan.add(NodeType.CA, 1, _ids("host-", n * hh, 4))
        hosts = np.arange(n * hh, dtype=np.int64)
        plan.cable(host_base + hosts, 1, sw_base + hosts // hh, hosts % hh + 1)
    port_of = {v: {u: hh + 1 + i for i, u in enumerate(sorted(graph[v]))} for v in graph}
    edges = sorted((min(u, v), max(u, v)) for u, v in graph.edges())
    a = np.array([u for u, _ in edges], np.int64)
    b = np.array([v for _, v in edges], np.int64)
    pa = np.array([port_of[u][v] for u, v in edges], np.int64)
    pb = np.array([port_of[v][u] for u, v in edges], np.int64)
    plan.cable(sw_base + a, pa, sw_base + b, pb)
    return plan.build(speed)


# -- degradation -------------------------------------------------------------------------------------


def degrade(
    fabric: Fabric,
    *,
    links: int | None = None,
    fraction: float | None = None,
    switches: int = 0,
    seed: int = 0,
    keep_connected: bool = True,
) -> Fabric:
    """A copy of ``fabric`` with switches and inter-switch links taken out, reproducibly.

    First ``switches`` switches with no CA cabled to them (spines, aggs,
    cores) are removed whole; then ``links`` inter-switch links, or
    ``fraction`` of those left, are disconnected (both ends DOWN/POLLING,
    cable gone). Host links are never touched, so no host loses its only
    link. Choices come from ``numpy.random.default_rng(seed)``: the same
    fabric and arguments give the same result. With ``keep_connected`` the
    switch graph keeps its number of connected components: links are taken
    in random order, skipping any whose loss would split the graph (the
    reverse-delete rule), and a switch whose loss would split it is skipped;
    asking for more than can go raises :class:`GenerateError`.
    """
    if links is not None and fraction is not None:
        raise GenerateError("degrade: give links or fraction, not both")
    if links is not None and links < 0:
        raise GenerateError(f"degrade: links {links} < 0")
    if fraction is not None and not 0.0 <= fraction <= 1.0:
        raise GenerateError(f"degrade: fraction {fraction} outside 0..1")
    if switches < 0:
        raise GenerateError(f"degrade: switches {switches} < 0")
    rng = np.random.default_rng(seed)
    f = _drop_switches(fabric, switches, rng, keep_connected) if switches else fabric.copy()
    sl = f.switch_links()
    n_links = links if links is not None else round((fraction or 0.0) * sl.shape[0])
    if n_links == 0:
        return f
    if n_links > sl.shape[0]:
        raise GenerateError(f"degrade: {n_links} links asked, only {sl.shape[0]} inter-switch links")
    order = rng.permutation(sl.shape[0])
    if keep_connected:
        # Reverse-delete: the spanning forest built from the links removed last is kept;
        # removing the other links in order never raises the component count.
        parent = list(range(f.n_nodes))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        a_col, b_col = sl[:, 0].tolist(), sl[:, 2].tolist()
        keep = np.zeros(sl.shape[0], np.bool_)
        for e in order[::-1].tolist():
            ra, rb = find(a_col[e]), find(b_col[e])
            if ra != rb:
                parent[ra] = rb
                keep[e] = True
        order = order[~keep[order]]
        if n_links > order.size:
            raise GenerateError(
                f"degrade: only {order.size} of {sl.shape[0]} inter-switch links can go "
                f"without splitting the fabric ({n_links} asked)"
            )
    for n, p, _m, _q in sl[order[:n_links]].tolist():
        f.disconnect(n, p)
    return f


def _drop_switches(f: Fabric, count: int, rng: np.random.Generator, keep_connected: bool) -> Fabric:
    from fabric.shape import components

    ca = f.node_type == NodeType.CA
    pn = np.where(f.peer_node >= 0, f.peer_node, 0)
    has_ca = ((f.peer_node != NO_PEER) & ca[pn]).any(axis=1)
    cand = np.flatnonzero((f.node_type == NodeType.SWITCH) & ~has_ca)
    if count > cand.size:
        raise GenerateError(f"degrade: {count} switches asked, only {cand.size} switches carry no host")
    cand = cand[rng.permutation(cand.size)]
    sl = f.switch_links()
    sw = f.node_type == NodeType.SWITCH

    def n_comp(alive: npt.NDArray[np.bool_]) -> int:
        e = sl[alive[sl[:, 0]] & alive[sl[:, 2]]]
        lab = components(f.n_nodes, e[:, 0], e[:, 2])
        return int(np.unique(lab[alive]).size)

    alive = sw.copy()
    if keep_connected:
        base = n_comp(alive)
        trial = alive.copy()
        trial[cand[:count]] = False
        if n_comp(trial) <= base:
            alive = trial
        else:
            taken = 0
            for c in cand.tolist():
                alive[c] = False
                if n_comp(alive) > base:
                    alive[c] = True
                    continue
                taken += 1
                if taken == count:
                    break
            if taken < count:
                raise GenerateError(
                    f"degrade: only {taken} switches can go without splitting the fabric ({count} asked)"
                )
    else:
        alive[cand[:count]] = False
    keep = alive | ~sw
    return f.subset(keep)
