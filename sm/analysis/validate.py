"""Fabric checks in the manner of ibdiagnet: GUIDs, descriptions, link speed and width, port states, cabling.

Each check reads a discovered :class:`~fabric.model.Fabric` and returns what
it finds, named by node and port; none changes anything. The cabling check
compares the fabric with the topology it was designed as (a net file):
cables missing, cables that are there but not in the design, and pairs of
cables swapped on one node's ports.

Nodes of the design are matched to discovered nodes by node GUID where the
design gives GUIDs that the fabric has, else by NodeDescription, else by
name (net-file id).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from fabric.model import NO_PEER, WIDTH_LANES, WIDTH_NAMES, Fabric, NodeType, PhysState, PortState, Speed

_LANES = np.zeros(256, np.int64)
for _code, _n in WIDTH_LANES.items():
    _LANES[_code] = _n


@dataclass(frozen=True)
class End:
    """One end of a cable: node name, node GUID, port."""

    node: str
    guid: int
    port: int

    def __str__(self) -> str:
        return f"{self.node}[{self.port}]"

    def as_dict(self) -> dict[str, object]:
        return {"node": self.node, "guid": f"{self.guid:#018x}", "port": self.port}


def _end(f: Fabric, n: int, p: int) -> End:
    return End(f.names[n], int(f.node_guid[n]), int(p))


# -- identity -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Duplicate:
    """A value that several nodes (or ports) share."""

    what: str
    """``node_guid``, ``port_guid`` or ``node_description``."""
    value: str
    holders: tuple[str, ...]
    """Node names, or ``node[port]`` for port GUIDs."""

    def __str__(self) -> str:
        return f"duplicate {self.what.replace('_', ' ')} {self.value}: {', '.join(self.holders)}"


def _dups(values: npt.NDArray[np.uint64]) -> list[tuple[int, npt.NDArray[np.intp]]]:
    """(value, indices) for every non-zero value that occurs more than once."""
    if values.size == 0:
        return []
    order = np.argsort(values, kind="stable")
    v = values[order]
    same = np.flatnonzero(v[1:] == v[:-1])
    if same.size == 0:
        return []
    out = []
    for val in np.unique(v[same + 1]).tolist():
        if val:
            out.append((int(val), order[v == val]))
    return out


def duplicate_guids(fabric: Fabric) -> list[Duplicate]:
    """Node GUIDs held by more than one node, port GUIDs by more than one end port."""
    out = [
        Duplicate("node_guid", f"{g:#018x}", tuple(fabric.names[i] for i in idx.tolist()))
        for g, idx in _dups(fabric.node_guid)
    ]
    ep = fabric.endports()
    pg = fabric.port_guid[ep[:, 0], ep[:, 1]]
    for g, idx in _dups(pg):
        holders = tuple(fabric.port_name(int(ep[i, 0]), int(ep[i, 1])) for i in idx.tolist())
        out.append(Duplicate("port_guid", f"{g:#018x}", holders))
    return out


def duplicate_descriptions(fabric: Fabric) -> list[Duplicate]:
    """NodeDescriptions shared by several nodes (a host or switch named twice)."""
    by: dict[str, list[int]] = defaultdict(list)
    for i, d in enumerate(fabric.descs):
        by[d].append(i)
    return [
        Duplicate("node_description", repr(d), tuple(fabric.names[i] for i in nodes))
        for d, nodes in sorted(by.items())
        if len(nodes) > 1
    ]


# -- links and ports ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlowLink:
    """An up link running below the width or speed both its ends support."""

    a: End
    b: End
    width: str
    """Active width (e.g. ``1x``)."""
    supported_width: str
    """Widest width both ends support."""
    speed: str
    supported_speed: str

    def __str__(self) -> str:
        return (
            f"link {self.a} - {self.b} runs {self.width}{self.speed}, "
            f"both ends support {self.supported_width}{self.supported_speed}"
        )


def slow_links(fabric: Fabric) -> list[SlowLink]:
    """Up links whose active width or speed is below the best both ends support."""
    la = fabric.link_array()
    if la.shape[0] == 0:
        return []
    a, pa, b, pb = la.T
    common = fabric.width_cap[a, pa] & fabric.width_cap[b, pb]
    best_lanes = np.zeros(la.shape[0], np.int64)
    best_code = np.zeros(la.shape[0], np.int64)
    for code in (1, 16, 2, 4, 8):  # ascending lanes: 1x, 2x, 4x, 8x, 12x; the widest wins
        has = (common & code) != 0
        best_lanes[has] = WIDTH_LANES[code]
        best_code[has] = code
    act_lanes = _LANES[fabric.width_active[a, pa]]
    top_speed = np.minimum(fabric.speed_cap[a, pa], fabric.speed_cap[b, pb]).astype(np.int64)
    act_speed = fabric.speed_active[a, pa].astype(np.int64)
    bad = np.flatnonzero((act_lanes < best_lanes) | (act_speed < top_speed))
    out = []
    for i in bad.tolist():
        w = int(fabric.width_active[a[i], pa[i]])
        out.append(
            SlowLink(
                _end(fabric, int(a[i]), int(pa[i])),
                _end(fabric, int(b[i]), int(pb[i])),
                WIDTH_NAMES.get(w, "?"),
                WIDTH_NAMES.get(int(best_code[i]), "?"),
                Speed(int(act_speed[i])).name if act_speed[i] else "none",
                Speed(int(top_speed[i])).name if top_speed[i] else "none",
            )
        )
    return out


@dataclass(frozen=True)
class StuckPort:
    """A port that is LinkUp but not ACTIVE after the SM's sweep."""

    end: End
    state: str
    peer: End | None

    def __str__(self) -> str:
        peer = f" (cabled to {self.peer})" if self.peer else ""
        return f"port {self.end} stuck in {self.state}{peer}"


def stuck_ports(fabric: Fabric) -> list[StuckPort]:
    """LinkUp ports left in INIT or ARMED (switch port 0 excepted)."""
    ex = fabric.port_exists.copy()
    ex[fabric.node_type == NodeType.SWITCH, 0] = False
    stuck = ex & (fabric.phys_state == PhysState.LINKUP) & np.isin(fabric.state, (PortState.INIT, PortState.ARMED))
    out = []
    for n, p in np.argwhere(stuck).tolist():
        m = int(fabric.peer_node[n, p])
        peer = _end(fabric, m, int(fabric.peer_port[n, p])) if m != NO_PEER else None
        out.append(StuckPort(_end(fabric, n, p), PortState(int(fabric.state[n, p])).name, peer))
    return out


# -- cabling against the design ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Swap:
    """Two cables swapped on one node: ``port_a`` reaches what ``port_b`` should, and the reverse."""

    node: str
    guid: int
    port_a: int
    port_b: int
    expected_a: End
    expected_b: End

    def __str__(self) -> str:
        return (
            f"cables swapped on {self.node} ports {self.port_a} and {self.port_b}: port {self.port_a} reaches "
            f"{self.expected_b} and port {self.port_b} reaches {self.expected_a} "
            f"(expected {self.port_a} -> {self.expected_a}, {self.port_b} -> {self.expected_b})"
        )


@dataclass
class CablingReport:
    """The fabric's cables against the design's."""

    expected_cables: int = 0
    matched_cables: int = 0
    missing: list[tuple[End, End]] = field(default_factory=list)
    """Cables of the design not found (named as in the design)."""
    extra: list[tuple[End, End]] = field(default_factory=list)
    """Cables found that the design does not have (named as discovered)."""
    swapped: list[Swap] = field(default_factory=list)
    missing_nodes: list[str] = field(default_factory=list)
    """Nodes of the design not found in the fabric."""
    unexpected_nodes: list[str] = field(default_factory=list)
    """Nodes of the fabric the design does not have."""
    matched_by: dict[str, int] = field(default_factory=dict)
    """How design nodes were matched: ``guid``, ``description``, ``name``."""

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.swapped or self.missing_nodes or self.unexpected_nodes)


def match_nodes(fabric: Fabric, expected: Fabric) -> tuple[npt.NDArray[np.int64], dict[str, int]]:
    """For each node of ``expected``, the fabric node it is (-1: none), and counts by matching rule."""
    e2l = np.full(expected.n_nodes, -1, np.int64)
    taken = np.zeros(fabric.n_nodes, np.bool_)
    counts = {"guid": 0, "description": 0, "name": 0}
    live_guid = {int(g): i for i, g in enumerate(fabric.node_guid.tolist())}
    by_desc: dict[str, list[int]] = defaultdict(list)
    for i, d in enumerate(fabric.descs):
        by_desc[d].append(i)
    by_name = {n: i for i, n in enumerate(fabric.names)}
    et = expected.node_type
    lt = fabric.node_type

    def claim(i: int, j: int | None, how: str) -> bool:
        if j is None or taken[j] or lt[j] != et[i]:
            return False
        e2l[i] = j
        taken[j] = True
        counts[how] += 1
        return True

    for i, g in enumerate(expected.node_guid.tolist()):
        claim(i, live_guid.get(int(g)), "guid")
    for i in np.flatnonzero(e2l < 0).tolist():
        cands = by_desc.get(expected.descs[i], [])
        if not (len(cands) == 1 and claim(i, cands[0], "description")):
            claim(i, by_name.get(expected.names[i]), "name")
    return e2l, counts


def compare_cabling(fabric: Fabric, expected: Fabric) -> CablingReport:
    """Missing, extra and swapped cables of ``fabric`` against the design ``expected``."""
    e2l, counts = match_nodes(fabric, expected)
    l2e = np.full(fabric.n_nodes, -1, np.int64)
    l2e[e2l[e2l >= 0]] = np.flatnonzero(e2l >= 0)
    rep = CablingReport(matched_by=counts)
    rep.missing_nodes = [expected.names[i] for i in np.flatnonzero(e2l < 0).tolist()]
    rep.unexpected_nodes = [fabric.names[j] for j in np.flatnonzero(l2e < 0).tolist()]

    # Cables as pairs of ends; an end is ("e", design node, port) or ("l", fabric node, port) when unmatched.
    Key = tuple[str, int, int]

    def key_e(n: int, p: int) -> Key:
        return ("e", n, p)

    def key_l(n: int, p: int) -> Key:
        m = int(l2e[n])
        return ("e", m, p) if m >= 0 else ("l", n, p)

    def cable(x: Key, y: Key) -> tuple[Key, Key]:
        return (x, y) if x <= y else (y, x)

    exp = {cable(key_e(a, pa), key_e(b, pb)) for a, pa, b, pb in expected.link_array(up_only=False).tolist()}
    live = {cable(key_l(a, pa), key_l(b, pb)) for a, pa, b, pb in fabric.link_array().tolist()}
    rep.expected_cables = len(exp)
    rep.matched_cables = len(exp & live)
    missing, extra = exp - live, live - exp
    miss_at: dict[Key, Key] = {}
    for e1, e2 in missing:
        miss_at[e1], miss_at[e2] = e2, e1
    extra_at: dict[Key, Key] = {}
    for e1, e2 in extra:
        extra_at[e1], extra_at[e2] = e2, e1

    def end_of(k: Key) -> End:
        kind, n, p = k
        return _end(expected, n, p) if kind == "e" else _end(fabric, n, p)

    # A swap on node A: design A[p]-X and A[q]-Y, found A[p]-Y and A[q]-X.
    done: set[tuple[Key, Key]] = set()
    for x in sorted(miss_at):
        if x[0] != "e" or cable(x, miss_at[x]) in done:
            continue
        want_x = miss_at[x]  # design: x - want_x
        got_x = extra_at.get(x)  # found: x - got_x
        if got_x is None:
            continue
        y = miss_at.get(got_x)  # design: got_x - y
        if y is None or y[0] != "e" or y[1] != x[1] or y == x:
            continue
        if extra_at.get(y) != want_x:
            continue
        n, p, q = x[1], x[2], y[2]
        if p > q:
            continue  # report each swap once, from its lower port
        for c in (cable(x, want_x), cable(y, got_x)):
            missing.discard(c)
            done.add(c)
        extra.discard(cable(x, got_x))
        extra.discard(cable(y, want_x))
        rep.swapped.append(Swap(expected.names[n], int(expected.node_guid[n]), p, q, end_of(want_x), end_of(got_x)))

    def named(c: tuple[Key, Key], design: bool) -> tuple[End, End]:
        x, y = c
        if not design:
            # name discovered cables as discovered
            def live_end(k: Key) -> End:
                kind, n, p = k
                return _end(fabric, int(e2l[n]), p) if kind == "e" else _end(fabric, n, p)

            return live_end(x), live_end(y)
        return end_of(x), end_of(y)

    rep.missing = sorted((named(c, True) for c in missing), key=lambda t: (t[0].node, t[0].port))
    rep.extra = sorted((named(c, False) for c in extra), key=lambda t: (t[0].node, t[0].port))
    return rep
