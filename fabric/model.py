"""The fabric model: nodes, ports and links as dense, index-based arrays.

Node ``i`` and port ``p`` address everything. Per-node facts live in 1-D
arrays of length ``n_nodes``; per-port facts in 2-D arrays of shape
``(n_nodes, max_port + 1)`` so that port 0 (a switch's management port) and
ports ``1..nports`` index directly. A slot beyond a node's port count is
unused and holds the "absent" value (peer -1, state 0).

Values use the InfiniBand wire encodings (PortInfo's codes for state, width,
MTU, VL cap) so the MAD codec, the emulator and the SM share one vocabulary;
speeds use :class:`Speed`, which maps to PortInfo's LinkSpeed and
LinkSpeedExt fields.

A :class:`Fabric` is built with :class:`FabricBuilder` and then has a fixed
set of nodes; ports and links stay mutable (link down/up, state changes).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError

MAX_PORTS = 64
"""Largest switch radix supported (Quantum-2 class)."""

NO_PEER = -1


class NodeType(IntEnum):
    """NodeInfo.NodeType."""

    CA = 1
    SWITCH = 2
    ROUTER = 3


class PortState(IntEnum):
    """PortInfo.PortState."""

    NOP = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4


class PhysState(IntEnum):
    """PortInfo.PortPhysicalState."""

    NOP = 0
    SLEEP = 1
    POLLING = 2
    DISABLED = 3
    TRAINING = 4
    LINKUP = 5
    ERROR_RECOVERY = 6
    PHY_TEST = 7


class Width(IntFlag):
    """PortInfo.LinkWidth{Supported,Enabled,Active} bits."""

    X1 = 1
    X4 = 2
    X8 = 4
    X12 = 8
    X2 = 16


WIDTH_LANES: dict[int, int] = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}


class Speed(IntEnum):
    """Per-lane signalling speed, in the order of the IBA generations."""

    SDR = 1
    DDR = 2
    QDR = 3
    FDR10 = 4
    FDR = 5
    EDR = 6
    HDR = 7
    NDR = 8
    XDR = 9


# Data rate per lane in Gb/s after encoding overhead (8b/10b up to QDR,
# 64b/66b from FDR10), as ibstat and OpenSM's rate tables count it.
SPEED_GBPS: dict[Speed, float] = {
    Speed.SDR: 2.0,
    Speed.DDR: 4.0,
    Speed.QDR: 8.0,
    Speed.FDR10: 10.0,
    Speed.FDR: 13.64,
    Speed.EDR: 25.0,
    Speed.HDR: 50.0,
    Speed.NDR: 100.0,
    Speed.XDR: 200.0,
}

# Signalling rate per lane in Gb/s, the figure the names stand for
# (4x NDR = 400 Gb/s).
SPEED_SIGNAL_GBPS: dict[Speed, float] = {
    Speed.SDR: 2.5,
    Speed.DDR: 5.0,
    Speed.QDR: 10.0,
    Speed.FDR10: 10.0,
    Speed.FDR: 14.0625,
    Speed.EDR: 25.78125,
    Speed.HDR: 53.125,
    Speed.NDR: 106.25,
    Speed.XDR: 212.5,
}

# Speed -> (LinkSpeedActive, LinkSpeedExtActive); LinkSpeedExt 0 means
# "use LinkSpeed". FDR10 is signalled through a vendor MAD on real
# hardware; here it reads as QDR in PortInfo.
SPEED_TO_PORTINFO: dict[Speed, tuple[int, int]] = {
    Speed.SDR: (1, 0),
    Speed.DDR: (2, 0),
    Speed.QDR: (4, 0),
    Speed.FDR10: (4, 0),
    Speed.FDR: (4, 1),
    Speed.EDR: (4, 2),
    Speed.HDR: (4, 4),
    Speed.NDR: (4, 8),
    Speed.XDR: (4, 16),
}
_LINKSPEED_TO_SPEED = {1: Speed.SDR, 2: Speed.DDR, 4: Speed.QDR}
_LINKSPEEDEXT_TO_SPEED = {
    1: Speed.FDR,
    2: Speed.EDR,
    4: Speed.HDR,
    8: Speed.NDR,
    16: Speed.XDR,
}


def speed_from_portinfo(link_speed: int, link_speed_ext: int) -> Speed:
    """Decode PortInfo LinkSpeedActive / LinkSpeedExtActive into a Speed."""
    if link_speed_ext:
        try:
            return _LINKSPEEDEXT_TO_SPEED[link_speed_ext]
        except KeyError:
            raise ValueError(f"unknown LinkSpeedExtActive {link_speed_ext}") from None
    try:
        return _LINKSPEED_TO_SPEED[link_speed]
    except KeyError:
        raise ValueError(f"unknown LinkSpeedActive {link_speed}") from None


def speed_supported_portinfo(speeds: int) -> tuple[int, int]:
    """Bitmask of Speed members (bit ``s - 1``) -> (LinkSpeedSupported, LinkSpeedExtSupported)."""
    ls = lse = 0
    for s in Speed:
        if speeds & (1 << (s - 1)):
            a, e = SPEED_TO_PORTINFO[s]
            if e:
                lse |= e
            else:
                ls |= a
    return ls, lse


def speed_mask(*speeds: Speed) -> int:
    """Bitmask for a set of speeds (bit ``s - 1``)."""
    m = 0
    for s in speeds:
        m |= 1 << (s - 1)
    return m


def speeds_up_to(top: Speed) -> int:
    """Mask of every speed from SDR up to ``top`` (what a device supports)."""
    return speed_mask(*(s for s in Speed if s <= top and s != Speed.FDR10))


def link_gbps(width: int, speed: int) -> float:
    """Data rate of a link in Gb/s from a PortInfo width code and a Speed."""
    if width not in WIDTH_LANES or speed == 0:
        return 0.0
    return WIDTH_LANES[width] * SPEED_GBPS[Speed(speed)]


_LANES_BY_CODE = np.zeros(256, np.float64)
for _code, _n in WIDTH_LANES.items():
    _LANES_BY_CODE[_code] = _n
_LANE_BYTES_BY_SPEED = np.zeros(256, np.float64)
for _s, _g in SPEED_GBPS.items():
    _LANE_BYTES_BY_SPEED[int(_s)] = _g * 1e9 / 8


def lanes_of(width: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Lanes for an array of PortInfo width codes (0 for unknown codes)."""
    return _LANES_BY_CODE[np.asarray(width, np.int64) & 0xFF].astype(np.int64)


def link_bytes_per_s(width: npt.ArrayLike, speed: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Data rate in bytes/s for arrays of PortInfo width codes and Speeds (0 for unknown codes).

    Lanes times the per-lane rate after encoding: 4x NDR = 400 Gb/s = 50e9 B/s.
    """
    w = np.asarray(width, np.int64) & 0xFF
    s = np.asarray(speed, np.int64) & 0xFF
    return _LANES_BY_CODE[w] * _LANE_BYTES_BY_SPEED[s]


WIDTH_NAMES: dict[int, str] = {1: "1x", 2: "4x", 4: "8x", 8: "12x", 16: "2x"}
WIDTH_BY_NAME: dict[str, int] = {v: k for k, v in WIDTH_NAMES.items()}
SPEED_BY_NAME: dict[str, Speed] = {s.name: s for s in Speed}

MTU_BYTES: dict[int, int] = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
MTU_CODE: dict[int, int] = {v: k for k, v in MTU_BYTES.items()}


def rate_name(width: int, speed: int) -> str:
    """ibnetdiscover-style link rate, e.g. ``4xNDR``."""
    if width == 0 or speed == 0:
        return ""
    return f"{WIDTH_NAMES.get(width, '?')}{Speed(speed).name}"


def parse_rate_name(text: str) -> tuple[int, Speed]:
    """``4xNDR`` -> (width code 2, Speed.NDR); raises ValueError."""
    t = text.strip()
    i = t.find("x")
    if i <= 0:
        raise ValueError(f"bad link rate {text!r}")
    w = WIDTH_BY_NAME.get(t[: i + 1])
    s = SPEED_BY_NAME.get(t[i + 1 :].upper())
    if w is None or s is None:
        raise ValueError(f"bad link rate {text!r}")
    return w, s


@dataclass(frozen=True, slots=True)
class PortRef:
    """One port of one node, by index."""

    node: int
    port: int


@dataclass(frozen=True, slots=True)
class Link:
    """A cable between two ports, ordered so that ``a < b``."""

    a: PortRef
    b: PortRef


class FabricError(IbfmError):
    """An operation on the fabric model that its shape does not allow."""


# Defaults for a port that a builder or file does not describe further.
DEFAULT_WIDTH = int(Width.X4)
DEFAULT_SPEED = Speed.NDR
DEFAULT_MTU_CAP = 5  # 4096
DEFAULT_VL_CAP = 4  # VL0-7


@dataclass(slots=True)
class _NodeSpec:
    type: NodeType
    nports: int
    name: str
    desc: str
    guid: int
    sysimg_guid: int
    port_guids: list[int]
    vendor_id: int
    device_id: int


@dataclass(slots=True)
class _PortSpec:
    width_cap: int
    speed_cap: Speed
    mtu_cap: int
    vl_cap: int


@dataclass
class FabricBuilder:
    """Collects nodes and links, then builds a :class:`Fabric` in one step.

    Node names (the quoted ids of net files) must be unique; GUIDs are given
    or allocated from ``guid_base`` upward.
    """

    guid_base: int = 0x0002C90000000000
    _nodes: list[_NodeSpec] = field(default_factory=list)
    _links: list[tuple[int, int, int, int]] = field(default_factory=list)
    _link_attrs: dict[tuple[int, int], _PortSpec] = field(default_factory=dict)
    _by_name: dict[str, int] = field(default_factory=dict)
    _next_guid: int = 0

    def add_node(
        self,
        type: NodeType,
        nports: int,
        name: str,
        *,
        desc: str | None = None,
        guid: int | None = None,
        sysimg_guid: int | None = None,
        port_guids: list[int] | None = None,
        vendor_id: int = 0x02C9,
        device_id: int = 0,
    ) -> int:
        """Add a node; returns its index."""
        if not 1 <= nports <= MAX_PORTS:
            raise FabricError(f"node {name!r}: port count {nports} outside 1..{MAX_PORTS}")
        if name in self._by_name:
            raise FabricError(f"duplicate node name {name!r}")
        if guid is None:
            guid = self._alloc_guid()
        if port_guids is None:
            if type == NodeType.SWITCH:
                port_guids = [guid] * (nports + 1)
            else:
                port_guids = [0] + [self._alloc_guid() for _ in range(nports)]
        elif len(port_guids) != nports + 1:
            raise FabricError(f"node {name!r}: {len(port_guids)} port GUIDs for {nports} ports (+ port 0)")
        idx = len(self._nodes)
        self._nodes.append(
            _NodeSpec(
                NodeType(type),
                nports,
                name,
                name if desc is None else desc,
                guid,
                guid if sysimg_guid is None else sysimg_guid,
                port_guids,
                vendor_id,
                device_id,
            )
        )
        self._by_name[name] = idx
        return idx

    def _alloc_guid(self) -> int:
        g = self.guid_base + self._next_guid
        self._next_guid += 1
        return g

    def index(self, name: str) -> int:
        return self._by_name[name]

    def has(self, name: str) -> bool:
        return name in self._by_name

    def nports(self, node: int) -> int:
        return self._nodes[node].nports

    def node_type(self, node: int) -> NodeType:
        return self._nodes[node].type

    def connect(self, n1: int, p1: int, n2: int, p2: int) -> None:
        """Record a cable between (n1, p1) and (n2, p2)."""
        for n, p in ((n1, p1), (n2, p2)):
            spec = self._nodes[n]
            if not 1 <= p <= spec.nports:
                raise FabricError(f"node {spec.name!r} has no port {p} (ports 1..{spec.nports})")
        if (n1, p1) == (n2, p2):
            raise FabricError(f"port {p1} of {self._nodes[n1].name!r} linked to itself")
        self._links.append((n1, p1, n2, p2))

    def set_port(
        self,
        node: int,
        port: int,
        *,
        width_cap: int = DEFAULT_WIDTH,
        speed_cap: Speed = DEFAULT_SPEED,
        mtu_cap: int = DEFAULT_MTU_CAP,
        vl_cap: int = DEFAULT_VL_CAP,
    ) -> None:
        """Override a port's capabilities (default 4x NDR, 4096 MTU, VL0-7)."""
        self._link_attrs[(node, port)] = _PortSpec(width_cap, speed_cap, mtu_cap, vl_cap)

    def build(self, *, link_state: PortState = PortState.INIT) -> Fabric:
        """Freeze into a Fabric. Connected ports start LinkUp in ``link_state``."""
        n = len(self._nodes)
        maxp = max((s.nports for s in self._nodes), default=1)
        f = Fabric(n, maxp)
        for i, s in enumerate(self._nodes):
            f.node_type[i] = s.type
            f.nports[i] = s.nports
            f.node_guid[i] = s.guid
            f.sysimg_guid[i] = s.sysimg_guid
            f.vendor_id[i] = s.vendor_id
            f.device_id[i] = s.device_id
            f.port_guid[i, : s.nports + 1] = s.port_guids
            f.names.append(s.name)
            f.descs.append(s.desc)
        f.port_exists[:] = np.arange(maxp + 1)[None, :] <= f.nports[:, None]
        f.port_exists[:, 0] = f.node_type == NodeType.SWITCH
        ex = f.port_exists
        f.width_cap[ex] = DEFAULT_WIDTH
        f.speed_cap[ex] = DEFAULT_SPEED
        f.mtu_cap[ex] = DEFAULT_MTU_CAP
        f.vl_cap[ex] = DEFAULT_VL_CAP
        f.state[ex] = PortState.DOWN
        f.phys_state[ex] = PhysState.POLLING
        sw = f.node_type == NodeType.SWITCH
        # Switch port 0 is always up: it is the switch's own management port.
        f.state[sw, 0] = PortState.ACTIVE
        f.phys_state[sw, 0] = PhysState.LINKUP
        for (node, port), ps in self._link_attrs.items():
            f.width_cap[node, port] = ps.width_cap
            f.speed_cap[node, port] = ps.speed_cap
            f.mtu_cap[node, port] = ps.mtu_cap
            f.vl_cap[node, port] = ps.vl_cap
        f.connect_many(np.array(self._links, np.int64).reshape(-1, 4), state=link_state)
        f.reindex()
        return f


class Fabric:
    """Nodes, ports and links of one subnet, as dense arrays.

    Per-node: ``node_type``, ``nports``, ``node_guid``, ``sysimg_guid``,
    ``vendor_id``, ``device_id``, ``names`` (file ids), ``descs``
    (NodeDescription).

    Per-port ``[node, port]``: ``port_exists``, ``port_guid``, ``peer_node``,
    ``peer_port``, ``state`` (PortState), ``phys_state`` (PhysState),
    ``width_cap`` (Width mask), ``width_active`` (Width code),
    ``speed_cap`` (highest Speed), ``speed_active`` (Speed), ``mtu_cap`` and
    ``mtu_active`` (MTU codes), ``vl_cap`` and ``op_vls`` (VL codes),
    ``lid`` and ``lmc``.
    """

    def __init__(self, n_nodes: int, max_port: int) -> None:
        if max_port > MAX_PORTS:
            raise FabricError(f"max port {max_port} above {MAX_PORTS}")
        n, p = n_nodes, max_port + 1
        self.max_port = max_port
        self.node_type: npt.NDArray[np.uint8] = np.zeros(n, np.uint8)
        self.nports: npt.NDArray[np.uint8] = np.zeros(n, np.uint8)
        self.node_guid: npt.NDArray[np.uint64] = np.zeros(n, np.uint64)
        self.sysimg_guid: npt.NDArray[np.uint64] = np.zeros(n, np.uint64)
        self.vendor_id: npt.NDArray[np.uint32] = np.zeros(n, np.uint32)
        self.device_id: npt.NDArray[np.uint16] = np.zeros(n, np.uint16)
        self.names: list[str] = []
        self.descs: list[str] = []
        self.port_exists: npt.NDArray[np.bool_] = np.zeros((n, p), np.bool_)
        self.port_guid: npt.NDArray[np.uint64] = np.zeros((n, p), np.uint64)
        self.peer_node: npt.NDArray[np.int32] = np.full((n, p), NO_PEER, np.int32)
        self.peer_port: npt.NDArray[np.int16] = np.full((n, p), NO_PEER, np.int16)
        self.state: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.phys_state: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.width_cap: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.width_active: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.speed_cap: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.speed_active: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.mtu_cap: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.mtu_active: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.vl_cap: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.op_vls: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self.lid: npt.NDArray[np.uint16] = np.zeros((n, p), np.uint16)
        self.lmc: npt.NDArray[np.uint8] = np.zeros((n, p), np.uint8)
        self._by_guid: dict[int, int] = {}
        self._by_port_guid: dict[int, tuple[int, int]] = {}
        self._by_name: dict[str, int] = {}

    # -- sizes and indices -------------------------------------------------

    @property
    def n_nodes(self) -> int:
        return int(self.node_type.shape[0])

    def reindex(self) -> None:
        """Rebuild the GUID and name lookups (after changing GUIDs or names in place)."""
        self._by_guid = {int(g): i for i, g in enumerate(self.node_guid.tolist())}
        self._by_name = {name: i for i, name in enumerate(self.names)}
        # A switch answers for its port 0 GUID; a CA for each port that exists. Later ones win, in
        # node then port order.
        ex = self.port_exists.copy()
        sw = self.node_type == NodeType.SWITCH
        ex[sw] = False
        ex[sw, 0] = True
        n, p = np.nonzero(ex)
        keys = self.port_guid[n, p].tolist()
        self._by_port_guid = dict(zip(keys, zip(n.tolist(), p.tolist(), strict=True), strict=True))

    @property
    def switches(self) -> npt.NDArray[np.intp]:
        """Node indices of the switches, ascending. Row ``i`` of an LFT is ``switches[i]``."""
        return np.flatnonzero(self.node_type == NodeType.SWITCH)

    @property
    def cas(self) -> npt.NDArray[np.intp]:
        """Node indices of channel adapters (hosts' HCAs), ascending."""
        return np.flatnonzero(self.node_type == NodeType.CA)

    def is_switch(self, node: int) -> bool:
        return bool(self.node_type[node] == NodeType.SWITCH)

    # -- lookups -------------------------------------------------------------

    def by_guid(self, guid: int) -> int:
        """Node index by node GUID; KeyError if none."""
        return self._by_guid[guid]

    def by_port_guid(self, guid: int) -> tuple[int, int]:
        """(node, port) by port GUID; KeyError if none."""
        return self._by_port_guid[guid]

    def by_name(self, name: str) -> int:
        """Node index by file id (name), falling back to a unique NodeDescription."""
        try:
            return self._by_name[name]
        except KeyError:
            hits = [i for i, d in enumerate(self.descs) if d == name]
            if len(hits) == 1:
                return hits[0]
            raise

    # -- links -----------------------------------------------------------------

    def connect(self, n1: int, p1: int, n2: int, p2: int, *, state: PortState = PortState.INIT) -> None:
        """Cable two ports; both come up LinkUp with the common width and speed."""
        for n, p in ((n1, p1), (n2, p2)):
            if not (1 <= p <= self.nports[n]):
                raise FabricError(f"node {self.names[n]!r} has no port {p}")
            if self.peer_node[n, p] != NO_PEER:
                q = (int(self.peer_node[n, p]), int(self.peer_port[n, p]))
                raise FabricError(
                    f"port {p} of {self.names[n]!r} already linked to "
                    f"{self.names[q[0]]!r} port {q[1]}"
                )
        self.peer_node[n1, p1], self.peer_port[n1, p1] = n2, p2
        self.peer_node[n2, p2], self.peer_port[n2, p2] = n1, p1
        self.link_up(n1, p1, state=state)

    def connect_many(self, links: npt.NDArray[np.int64], *, state: PortState = PortState.INIT) -> None:
        """:meth:`connect` for every row (n1, p1, n2, p2) of ``links`` at once, or none of them.

        A bad row (port out of range, port already cabled or cabled twice, a port
        linked to itself) raises the FabricError :meth:`connect` raises for it,
        and nothing is connected.
        """
        links = np.asarray(links, np.int64).reshape(-1, 4)
        if not links.shape[0]:
            return
        a, b = links[:, :2], links[:, 2:]
        ends = np.concatenate([a, b])
        nodes_ok = (ends[:, 0] >= 0) & (ends[:, 0] < self.n_nodes)
        ok = bool(nodes_ok.all())
        if ok:
            ok = bool(((ends[:, 1] >= 1) & (ends[:, 1] <= self.nports[ends[:, 0]])).all())
        if ok:
            keys = np.sort(ends[:, 0] * (self.max_port + 1) + ends[:, 1])  # (np.unique imports numpy.ma)
            ok = bool((keys[1:] != keys[:-1]).all()) and bool((self.peer_node[ends[:, 0], ends[:, 1]] == NO_PEER).all())
        if not ok:
            self._raise_first_bad_link(links, state)
        n1, p1, n2, p2 = links.T
        self.peer_node[n1, p1], self.peer_port[n1, p1] = n2, p2
        self.peer_node[n2, p2], self.peer_port[n2, p2] = n1, p1
        common = self.width_cap[n1, p1].astype(np.int64) & self.width_cap[n2, p2].astype(np.int64)
        width = np.zeros_like(common)
        for code in (1, 16, 2, 4, 8):  # the widest wins: 12x, 8x, 4x, 2x, 1x as in _best_width
            width = np.where(common & code, code, width)
        speed = np.minimum(self.speed_cap[n1, p1], self.speed_cap[n2, p2])
        for n, p in ((n1, p1), (n2, p2)):
            self.width_active[n, p] = width
            self.speed_active[n, p] = speed
            self.phys_state[n, p] = PhysState.LINKUP
            self.state[n, p] = state

    def _raise_first_bad_link(self, links: npt.NDArray[np.int64], state: PortState) -> NoReturn:
        """Connect the rows one at a time on a scratch copy, to name the first bad one; then give up."""
        scratch = self.copy()
        for n1, p1, n2, p2 in links.tolist():
            for n in (n1, n2):
                if not 0 <= n < self.n_nodes:
                    raise FabricError(f"no node {n} (the fabric has {self.n_nodes})")
            if (n1, p1) == (n2, p2):
                raise FabricError(f"port {p1} of {self.names[n1]!r} linked to itself")
            scratch.connect(n1, p1, n2, p2, state=state)
        raise FabricError("links could not be connected")  # (not reached: connect raised)

    def link_up(self, n: int, p: int, *, state: PortState = PortState.INIT) -> None:
        """Train a cabled link: LinkUp, active width/speed = best common."""
        m, q = int(self.peer_node[n, p]), int(self.peer_port[n, p])
        if m == NO_PEER:
            raise FabricError(f"port {p} of {self.names[n]!r} has no cable")
        common_w = int(self.width_cap[n, p]) & int(self.width_cap[m, q])
        width = _best_width(common_w)
        speed = min(int(self.speed_cap[n, p]), int(self.speed_cap[m, q]))
        for a, b in ((n, p), (m, q)):
            self.width_active[a, b] = width
            self.speed_active[a, b] = speed
            self.phys_state[a, b] = PhysState.LINKUP
            self.state[a, b] = state

    def link_down(self, n: int, p: int) -> None:
        """Both ends of the link go DOWN/POLLING; the cable stays recorded."""
        m, q = int(self.peer_node[n, p]), int(self.peer_port[n, p])
        ends = [(n, p)] if m == NO_PEER else [(n, p), (m, q)]
        for a, b in ends:
            self.state[a, b] = PortState.DOWN
            self.phys_state[a, b] = PhysState.POLLING
            self.width_active[a, b] = 0
            self.speed_active[a, b] = 0

    def disconnect(self, n: int, p: int) -> None:
        """Remove the cable at (n, p); both ends go DOWN."""
        m, q = int(self.peer_node[n, p]), int(self.peer_port[n, p])
        if m == NO_PEER:
            raise FabricError(f"port {p} of {self.names[n]!r} has no cable")
        self.link_down(n, p)
        self.peer_node[n, p] = self.peer_port[n, p] = NO_PEER
        self.peer_node[m, q] = self.peer_port[m, q] = NO_PEER

    def is_up(self, n: int, p: int) -> bool:
        """Cabled and physically LinkUp."""
        return bool(self.peer_node[n, p] != NO_PEER and self.phys_state[n, p] == PhysState.LINKUP)

    def up_mask(self) -> npt.NDArray[np.bool_]:
        """``[node, port]`` True where a cable is present and LinkUp."""
        return (self.peer_node != NO_PEER) & (self.phys_state == PhysState.LINKUP)

    def link_array(self, *, up_only: bool = True) -> npt.NDArray[np.int64]:
        """All links as an ``(E, 4)`` array of (node a, port a, node b, port b), a < b."""
        mask = self.up_mask() if up_only else self.peer_node != NO_PEER
        n, p = np.nonzero(mask)
        m = self.peer_node[n, p].astype(np.int64)
        q = self.peer_port[n, p].astype(np.int64)
        keep = (n < m) | ((n == m) & (p < q))
        return np.stack([n[keep], p[keep], m[keep], q[keep]], axis=1).astype(np.int64)

    def links(self, *, up_only: bool = True) -> Iterator[Link]:
        for a, b, c, d in self.link_array(up_only=up_only).tolist():
            yield Link(PortRef(a, b), PortRef(c, d))

    def neighbours(self, node: int) -> list[tuple[int, int, int]]:
        """(local port, peer node, peer port) for every up link of ``node``."""
        up = self.up_mask()[node]
        return [
            (p, int(self.peer_node[node, p]), int(self.peer_port[node, p]))
            for p in np.flatnonzero(up).tolist()
        ]

    def switch_links(self) -> npt.NDArray[np.int64]:
        """Up links between two switches, as in :meth:`link_array`."""
        la = self.link_array()
        sw = self.node_type == NodeType.SWITCH
        return la[sw[la[:, 0]] & sw[la[:, 2]]]

    def cas_under(self, switch: int) -> list[tuple[int, int, int]]:
        """(switch port, CA node, CA port) for every CA cabled (and up) to ``switch``."""
        return [(p, m, q) for p, m, q in self.neighbours(switch) if self.node_type[m] == NodeType.CA]

    def leaves(self) -> npt.NDArray[np.intp]:
        """Switches with at least one CA attached by an up link."""
        up = self.up_mask()
        peer = np.where(up, self.peer_node, 0)
        has_ca = (self.node_type[peer] == NodeType.CA) & up
        return np.flatnonzero((self.node_type == NodeType.SWITCH) & has_ca.any(axis=1))

    def endports(self) -> npt.NDArray[np.int64]:
        """The ports that get a LID: switch port 0 and every existing CA port, ``(K, 2)``."""
        ex = self.port_exists.copy()
        sw = self.node_type == NodeType.SWITCH
        ex[sw, 1:] = False
        return np.argwhere(ex).astype(np.int64)

    def port_name(self, node: int, port: int) -> str:
        return f"{self.names[node]}[{port}]"

    def copy(self) -> Fabric:
        """A deep copy (arrays and lists)."""
        f = Fabric.__new__(Fabric)
        for k, v in self.__dict__.items():
            if isinstance(v, (np.ndarray, list, dict)):
                setattr(f, k, v.copy())
            else:
                setattr(f, k, v)
        return f

    def subset(self, keep: npt.NDArray[np.bool_] | list[int]) -> Fabric:
        """A new fabric holding only the kept nodes (links to removed ones vanish)."""
        kept = np.asarray(keep)
        old = np.flatnonzero(kept) if kept.dtype == np.bool_ else np.unique(kept.astype(np.int64))
        remap = np.full(self.n_nodes, NO_PEER, np.int64)
        remap[old] = np.arange(old.size)
        f = Fabric(old.size, self.max_port)
        for k, v in self.__dict__.items():
            if isinstance(v, np.ndarray) and v.shape[0] == self.n_nodes:
                setattr(f, k, v[old].copy())
        f.names = [self.names[i] for i in old.tolist()]
        f.descs = [self.descs[i] for i in old.tolist()]
        pn = f.peer_node.astype(np.int64)
        has = pn != NO_PEER
        newpeer = np.where(has, remap[np.where(has, pn, 0)], NO_PEER)
        gone = has & (newpeer == NO_PEER)
        f.peer_node = newpeer.astype(np.int32)
        f.peer_port[gone] = NO_PEER
        f.state[gone] = PortState.DOWN
        f.phys_state[gone] = PhysState.POLLING
        f.width_active[gone] = 0
        f.speed_active[gone] = 0
        f.reindex()
        return f

    def summary(self) -> dict[str, int]:
        """Counts: switches, CAs, ports, links (up), inter-switch links."""
        return {
            "switches": int(np.count_nonzero(self.node_type == NodeType.SWITCH)),
            "cas": int(np.count_nonzero(self.node_type == NodeType.CA)),
            "ports": int(np.count_nonzero(self.port_exists)),
            "links": int(self.link_array().shape[0]),
            "switch_links": int(self.switch_links().shape[0]),
        }


def dr_paths(
    fabric: Fabric,
    root: int,
    root_port: int,
    *,
    up: npt.NDArray[np.bool_] | None = None,
    max_hops: int = 63,
) -> list[tuple[int, ...] | None]:
    """Shortest directed-route path from ``root`` to every node over up links (None: unreachable).

    A path is the egress ports from ``root`` on; a CA root leaves by ``root_port`` and no other CA
    forwards. ``up`` overrides ``fabric.up_mask()`` (the emulator passes its physical truth);
    ``max_hops`` is the DR limit of 63 hops.
    """
    up = fabric.up_mask() if up is None else up
    is_sw = fabric.node_type == NodeType.SWITCH
    paths: list[tuple[int, ...] | None] = [None] * fabric.n_nodes
    paths[root] = ()
    frontier = [root]
    for _ in range(max_hops):
        nxt: list[int] = []
        for n in frontier:
            if is_sw[n]:
                ports = np.flatnonzero(up[n]).tolist()
            elif n == root and up[n, root_port]:
                ports = [root_port]
            else:
                continue  # a CA does not forward
            base = paths[n]
            assert base is not None
            for p in ports:
                m = int(fabric.peer_node[n, p])
                if m >= 0 and paths[m] is None:
                    paths[m] = (*base, p)
                    nxt.append(m)
        if not nxt:
            break
        frontier = nxt
    return paths


def _best_width(mask: int) -> int:
    """Widest width in a Width mask, as an active-width code; 0 if none."""
    for code in (8, 4, 2, 16, 1):  # 12x, 8x, 4x, 2x, 1x
        if mask & code:
            return code
    return 0
