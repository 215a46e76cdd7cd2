"""Directed-route discovery: a breadth-first walk from the SM's port.

Level by level, with every SMP of a level in flight at once (the
transport's window bounds them): NodeInfo at each new path; for a node not
seen before, NodeDescription, SwitchInfo and PortInfo of every port; then
every LinkUp port of a switch opens the next level. A GUID met again by a
second path (loops, parallel links, a CA with two ports on different
switches) only adds a link. Devices that do not answer are reported and the
rest of the fabric still comes up.

With M_Keys in play (``keys``), every SMP carries the key of the port it
addresses: for a path not walked yet, the key of the port the neighbors
record puts there (``MKeys.behind``), else the configured key; a NodeInfo
that times out is asked once more with each other key we have for that
port, and the key that answered serves the node's other reads. Ports that
answer no key are listed in ``Discovery.m_key_locked``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from fabric.mad import NODE_INFO, PORT_INFO, SMP_DATA_SIZE, SWITCH_INFO, Method, SmpAttr, node_desc_unpack
from fabric.model import (
    MAX_PORTS,
    Fabric,
    FabricBuilder,
    FabricError,
    NodeType,
    PhysState,
    Speed,
    speed_from_portinfo,
)
from sm.sweep.mkeys import LockedPort, MKeys
from sm.transport.base import MadTimeout, WindowedTransport
from sm.transport.smp import RowCodec, SmpAnswers, smp_batch_dr

if TYPE_CHECKING:
    from sm.sweep.manager import SweepProgress

Path = tuple[int, ...]

_NODE_INFO = RowCodec(NODE_INFO)
_PORT_INFO = RowCodec(PORT_INFO)


@dataclass
class _NodeRec:
    guid: int
    type: NodeType
    nports: int
    sysimg_guid: int
    vendor_id: int
    device_id: int
    path: Path
    desc: str = ""
    port_guids: dict[int, int] = field(default_factory=dict)
    port_paths: dict[int, Path] = field(default_factory=dict)
    port_phys: dict[int, int] = field(default_factory=dict)
    """Port -> PortPhysicalState as read."""
    port_raw: dict[int, bytes] = field(default_factory=dict)
    """Port -> PortInfo bytes as read."""
    switch_info: dict[str, Any] | None = None
    node_info: dict[str, Any] | None = None
    """NodeInfo as read (first path; LocalPortNum and PortGUID are those of that path's port)."""


PortKey = tuple[int, int]


class PortInfoTable(MutableMapping[PortKey, dict[str, Any]]):
    """(node, port) -> PortInfo, kept as the attribute's bytes and decoded on first use.

    Programming stores each GetResp as it comes (what the port now holds)
    without decoding it; a dict is made only when someone asks. Treat the
    dicts as read-only: assign a new one to change a port (its bytes are then
    packed from it when needed).
    """

    __slots__ = ("_dec", "_raw")

    def __init__(self) -> None:
        self._raw: dict[PortKey, bytes | None] = {}
        """The bytes; None for a port given only as a dict (packed on demand)."""
        self._dec: dict[PortKey, tuple[bytes | None, dict[str, Any]]] = {}
        """Decodings, each with the bytes it came from: current only while those are ``_raw``'s."""

    def __getitem__(self, key: PortKey) -> dict[str, Any]:
        raw = self._raw[key]
        entry = self._dec.get(key)
        if entry is not None and entry[0] is raw:
            return entry[1]
        assert raw is not None  # (None only beside its dict)
        d = PORT_INFO.unpack(raw)
        self._dec[key] = (raw, d)
        return d

    def get(self, key: PortKey, default: Any = None) -> Any:
        return self[key] if key in self._raw else default

    def __setitem__(self, key: PortKey, value: dict[str, Any]) -> None:
        self._raw[key] = None
        self._dec[key] = (None, value)

    def __delitem__(self, key: PortKey) -> None:
        del self._raw[key]
        self._dec.pop(key, None)

    def __iter__(self) -> Iterator[PortKey]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def raw(self, key: PortKey) -> bytes | None:
        """The PortInfo bytes of ``key`` (packed from its dict if that is all there is), or None."""
        raw = self._raw.get(key)
        if raw is None and key in self._raw:
            value = self._dec[key][1]
            raw = self._raw[key] = PORT_INFO.pack(value)
            self._dec[key] = (raw, value)
        return raw

    def update_raw(self, items: Iterable[tuple[PortKey, bytes]]) -> None:
        """What many ports hold, as (port, PortInfo bytes); decoded later, if ever."""
        self._raw.update(items)

    def copy(self) -> PortInfoTable:
        t = PortInfoTable()
        t._raw = dict(self._raw)
        t._dec = dict(self._dec)
        return t


@dataclass
class Discovery:
    """What a discovery found: the fabric, the DR path to every node, and problems."""

    fabric: Fabric
    paths: list[Path]
    """DR path to node ``i`` (the SM's own node has ``()``)."""
    sm_node: int
    sm_port: int
    port_paths: dict[tuple[int, int], Path]
    """(CA node, port) -> a DR path that arrives at that port (a CA answers for its ingress port)."""
    switch_info: dict[int, dict[str, Any]]
    """Node index -> SwitchInfo as read."""
    port_info: PortInfoTable
    """(node, port) -> PortInfo as read, then as the last Set left it (the base for later Sets)."""
    errors: list[str]
    smps: int
    node_info: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Node index -> NodeInfo as read (what NodeRecords carry)."""
    m_key_locked: list[LockedPort] = field(default_factory=list)
    """Devices behind a LinkUp port that answered no SMP with any M_Key we have for them."""

    def __repr__(self) -> str:
        return f"Discovery(nodes={self.fabric.n_nodes}, errors={len(self.errors)}, smps={self.smps})"


async def _node_infos(
    transport: WindowedTransport, paths: list[Path], expect: list[int | None], keys: MKeys | None
) -> tuple[SmpAnswers, list[int], set[int]]:
    """NodeInfo at every path, each carrying the M_Key of the port expected there (``expect``: its port GUID,
    None when unknown). Rows that time out are asked again with each other key we have for that port.
    Returns the answers, the key each row last carried, and the rows no key got an answer from."""
    n = len(paths)
    if keys is None or not keys.active:
        return await smp_batch_dr(transport, Method.GET, SmpAttr.NODE_INFO, paths, np.arange(n)), [0] * n, set()
    tries = [keys.candidates(g) or [0] for g in expect]
    used = [t[0] for t in tries]
    res = await smp_batch_dr(
        transport, Method.GET, SmpAttr.NODE_INFO, paths, np.arange(n), mkeys=np.array(used, np.uint64)
    )
    attempt = 1
    while again := [j for j, e in res.errors.items() if isinstance(e, MadTimeout) and len(tries[j]) > attempt]:
        alt = [tries[j][attempt] for j in again]
        more = await smp_batch_dr(transport, Method.GET, SmpAttr.NODE_INFO, [paths[j] for j in again],
                                  np.arange(len(again)), mkeys=np.array(alt, np.uint64), resend=0)  # fmt: skip
        for i, j in enumerate(again):
            used[j] = alt[i]
            if more.ok[i]:
                res.ok[j] = True
                res.data[j] = more.data[i]
                del res.errors[j]
            else:
                res.errors[j] = more.errors[i]
        attempt += 1
    return res, used, {j for j, e in res.errors.items() if isinstance(e, MadTimeout)}


async def discover(
    transport: WindowedTransport, *, max_hops: int = 63, keys: MKeys | None = None,
    progress: SweepProgress | None = None,
) -> Discovery:
    """Walk the fabric from the transport's port and return what answers; ``keys``: the M_Keys to send;
    ``progress`` counts the nodes found."""
    sent0 = transport.stats.sent
    nodes: dict[int, _NodeRec] = {}
    links: dict[tuple[int, int], tuple[int, int]] = {}
    errors: list[str] = []
    locked: list[LockedPort] = []
    by_path: dict[Path, int] = {}
    path_key: dict[Path, int] = {}
    """The M_Key that got an answer at each path (the node's other reads carry it)."""

    def name_of(guid: int) -> str:
        rec = nodes[guid]
        return rec.desc or f"{guid:#018x}"

    def expected(parent: int | None, pport: int | None) -> int | None:
        """The port GUID behind (parent, pport) as the neighbors record says."""
        if keys is None or parent is None or pport is None:
            return None
        rec = nodes[parent]
        pg = rec.port_guids.get(0 if rec.type == NodeType.SWITCH else pport)
        return keys.behind(pg, pport) if pg else None

    linkup = int(PhysState.LINKUP)
    own = keys.own_guid if keys is not None else 0
    root, used, _ = await _node_infos(transport, [()], [own or None], keys)
    if not root.ok[0]:
        raise root.errors[0]
    path_key[()] = used[0]
    root_ni: dict[str, Any] = NODE_INFO.unpack(root.data[0].tobytes())  # type: ignore[assignment]
    sm_guid = int(root_ni["NodeGUID"])
    sm_port = int(root_ni["LocalPortNum"])
    # frontier items: (path, parent guid, parent port, NodeInfo if already read)
    frontier: list[tuple[Path, int | None, int | None, dict[str, Any] | None]] = [((), None, None, root_ni)]

    while frontier:
        # 1. NodeInfo at every path of this level, all in flight together.
        ask = [k for k, item in enumerate(frontier) if item[3] is None]
        expect = [expected(frontier[k][1], frontier[k][2]) for k in ask]
        res, used, silent = await _node_infos(transport, [frontier[k][0] for k in ask], expect, keys)
        for j, k in enumerate(ask):
            path_key[frontier[k][0]] = used[j]
        good = np.flatnonzero(res.ok)
        decoded = dict(zip(good.tolist(), _NODE_INFO.unpack_rows(res.data[good]), strict=True))
        infos: list[dict[str, Any] | None] = [item[3] for item in frontier]
        for j, k in enumerate(ask):
            path, parent, pport, _ = frontier[k]
            ni = decoded.get(j)
            if ni is None:
                assert parent is not None
                errors.append(f"no NodeInfo behind {name_of(parent)} port {pport} (DR {list(path)}): {res.errors[j]}")
                if j in silent:
                    locked.append(LockedPort(f"behind {name_of(parent)} port {pport}", path, expect[j]))
                continue
            bad = nodeinfo_problem(ni)
            if bad:
                errors.append(f"NodeInfo at DR {list(path)} ignored: {bad}")
            else:
                infos[k] = ni
        # 2. Links, new nodes, and the details to read for each: one row per SMP.
        dpaths: list[Path] = []
        dwhich: list[int] = []
        dattr: list[int] = []
        dmod: list[int] = []
        sinks: list[tuple[_NodeRec, str, int]] = []
        for (path, parent, pport, _), ni in zip(frontier, infos, strict=True):
            if ni is None:
                continue
            guid = int(ni["NodeGUID"])
            local = int(ni["LocalPortNum"])
            if parent is not None and pport is not None:
                _add_link(links, (parent, pport), (guid, local), errors)
            rec = nodes.get(guid)
            is_new = rec is None
            if rec is None:
                rec = _NodeRec(
                    guid,
                    NodeType(int(ni["NodeType"])),
                    int(ni["NumPorts"]),
                    int(ni["SystemImageGUID"]),
                    int(ni["VendorID"]),
                    int(ni["DeviceID"]),
                    path,
                    node_info=ni,
                )
                nodes[guid] = rec
                by_path[path] = guid
                if progress is not None:
                    progress.advance(1, "nodes")
            at = len(dpaths)
            if is_new:
                dwhich.append(at)
                dattr.append(SmpAttr.NODE_DESC)
                dmod.append(0)
                sinks.append((rec, "desc", 0))
            if rec.type == NodeType.SWITCH:
                rec.port_guids[0] = int(ni["PortGUID"])
                if is_new:
                    dwhich.extend([at] * (rec.nports + 2))
                    dattr.append(SmpAttr.SWITCH_INFO)
                    dattr.extend([SmpAttr.PORT_INFO] * (rec.nports + 1))
                    dmod.append(0)
                    dmod.extend(range(rec.nports + 1))
                    sinks.append((rec, "switch", 0))
                    sinks.extend((rec, "port", p) for p in range(rec.nports + 1))
            elif local not in rec.port_guids:
                # A CA answers PortInfo (modifier 0) for the port the SMP came in on.
                rec.port_guids[local] = int(ni["PortGUID"])
                rec.port_paths[local] = path
                dwhich.append(at)
                dattr.append(SmpAttr.PORT_INFO)
                dmod.append(0)
                sinks.append((rec, "port", local))
            if len(dwhich) > at:
                dpaths.append(path)
        rows = np.array(dwhich, np.intp)
        dkeys = np.array([path_key[p] for p in dpaths], np.uint64)[rows] if keys is not None and keys.active else None
        res = await smp_batch_dr(
            transport, Method.GET, np.array(dattr), dpaths, rows, np.array(dmod), mkeys=dkeys
        )
        # PortInfo stays bytes (decoded as arrays when the model is built); the link state now.
        phys = _PORT_INFO.column(res.data, "PortPhysicalState").tolist()
        blob = res.data.tobytes()
        for r, (rec, what, mod) in enumerate(sinks):
            err = res.errors.get(r)
            if err is not None:
                errors.append(f"{rec.desc or hex(rec.guid)}: {what} read failed: {err}")
                continue
            ans = blob[r * SMP_DATA_SIZE : (r + 1) * SMP_DATA_SIZE]
            if what == "desc":
                rec.desc = node_desc_unpack(ans)
            elif what == "switch":
                rec.switch_info = SWITCH_INFO.unpack(ans)
            else:
                rec.port_phys[mod] = phys[r]
                rec.port_raw[mod] = ans
        nxt: list[tuple[Path, int | None, int | None, dict[str, Any] | None]] = []
        for path, _parent, _pport, _ni in frontier:
            # Expand a node once, from the path that found it first; CAs do not forward.
            found = by_path.get(path)
            if found is None or len(path) >= max_hops:
                continue
            rec = nodes[found]
            if rec.type == NodeType.SWITCH:
                ports = range(1, rec.nports + 1)
            elif path == ():
                ports = range(sm_port, sm_port + 1)
            else:
                continue
            nxt.extend(
                ((*path, p), rec.guid, p, None)
                for p in ports
                if rec.port_phys.get(p) == linkup and (rec.guid, p) not in links
            )
        frontier = nxt

    fabric, paths, sw_info = _build(nodes, links, errors)
    port_paths = {
        (fabric.by_guid(nd.guid), p): path for nd in nodes.values() for p, path in nd.port_paths.items()
    }
    port_info = PortInfoTable()
    for nd in nodes.values():
        n = fabric.by_guid(nd.guid)
        port_info.update_raw(((n, p), raw) for p, raw in nd.port_raw.items())
    sm_node = fabric.by_guid(sm_guid)
    return Discovery(
        fabric,
        paths,
        sm_node,
        sm_port,
        port_paths,
        sw_info,
        port_info,
        errors,
        transport.stats.sent - sent0,
        {fabric.by_guid(nd.guid): nd.node_info for nd in nodes.values() if nd.node_info is not None},
        locked,
    )


def _add_link(
    links: dict[tuple[int, int], tuple[int, int]], a: tuple[int, int], b: tuple[int, int], errors: list[str]
) -> None:
    if links.get(a, b) != b or links.get(b, a) != a:
        errors.append(
            f"inconsistent link: {a[0]:#018x}[{a[1]}] -> {b[0]:#018x}[{b[1]}] "
            f"but already {links.get(a)} / {links.get(b)}; first kept"
        )
        return
    links[a] = b
    links[b] = a


def _speed_cap(supported: int, ext_supported: int) -> Speed:
    """The fastest speed of PortInfo's LinkSpeedSupported and LinkSpeedExtSupported."""
    if ext_supported:
        for bit in (16, 8, 4, 2, 1):
            if ext_supported & bit:
                return speed_from_portinfo(4, bit)
    for bit in (4, 2, 1):
        if supported & bit:
            return speed_from_portinfo(bit, 0)
    return Speed.SDR


def nodeinfo_problem(ni: dict[str, Any]) -> str | None:
    """Why a NodeInfo answer cannot describe a real device, or None."""
    if int(ni["NodeType"]) not in (NodeType.CA, NodeType.SWITCH, NodeType.ROUTER):
        return f"NodeType {ni['NodeType']} unknown"
    if not 1 <= int(ni["NumPorts"]) <= MAX_PORTS:
        return f"NumPorts {ni['NumPorts']} outside 1..{MAX_PORTS}"
    if int(ni["LocalPortNum"]) > int(ni["NumPorts"]):
        return f"LocalPortNum {ni['LocalPortNum']} beyond NumPorts {ni['NumPorts']}"
    if not int(ni["NodeGUID"]):
        return "NodeGUID 0"
    return None


def apply_port_info(f: Fabric, n: int, p: int, pi: dict[str, Any]) -> None:
    """Record what a PortInfo read says about (n, p) in the model: caps, state, trained width and speed."""
    f.width_cap[n, p] = int(pi["LinkWidthSupported"]) or f.width_cap[n, p]
    f.speed_cap[n, p] = _speed_cap(int(pi.get("LinkSpeedSupported", 1)), int(pi.get("LinkSpeedExtSupported", 0)))
    f.mtu_cap[n, p] = int(pi["MTUCap"]) or f.mtu_cap[n, p]
    f.vl_cap[n, p] = int(pi["VLCap"]) or f.vl_cap[n, p]
    f.state[n, p] = int(pi["PortState"])
    f.phys_state[n, p] = int(pi["PortPhysicalState"])
    f.width_active[n, p] = int(pi["LinkWidthActive"])
    try:
        f.speed_active[n, p] = speed_from_portinfo(int(pi["LinkSpeedActive"]), int(pi["LinkSpeedExtActive"]))
    except ValueError:
        f.speed_active[n, p] = 0
    f.mtu_active[n, p] = int(pi["NeighborMTU"])
    f.op_vls[n, p] = int(pi["OperationalVLs"])
    f.lid[n, p] = int(pi["LID"])
    f.lmc[n, p] = int(pi["LMC"])


def apply_port_infos(f: Fabric, where: list[tuple[int, int]], rows: npt.NDArray[np.uint8]) -> None:
    """:func:`apply_port_info` for many ports at once: PortInfo bytes ``rows[k]`` read at ``where[k]``
    (distinct ports), decoded as columns."""
    if not where:
        return
    n, p = np.array(where, np.intp).T

    def col(name: str) -> npt.NDArray[np.int64]:
        return _PORT_INFO.column(rows, name).astype(np.int64)

    def nonzero_or_kept(name: str, arr: npt.NDArray[Any]) -> None:
        v = col(name)
        arr[n, p] = np.where(v != 0, v, arr[n, p])

    nonzero_or_kept("LinkWidthSupported", f.width_cap)
    nonzero_or_kept("MTUCap", f.mtu_cap)
    nonzero_or_kept("VLCap", f.vl_cap)
    # Speeds by the few distinct (basic, extended) pairs there are.
    for names, arr, decode in (
        (("LinkSpeedSupported", "LinkSpeedExtSupported"), f.speed_cap, _speed_cap),
        (("LinkSpeedActive", "LinkSpeedExtActive"), f.speed_active, _speed_active_of),
    ):
        pairs = col(names[0]) << 32 | col(names[1])
        for pair in set(pairs.tolist()):
            at = pairs == pair
            arr[n[at], p[at]] = decode(pair >> 32, pair & 0xFFFFFFFF)
    for name, field_arr in (
        ("PortState", f.state),
        ("PortPhysicalState", f.phys_state),
        ("LinkWidthActive", f.width_active),
        ("NeighborMTU", f.mtu_active),
        ("OperationalVLs", f.op_vls),
        ("LID", f.lid),
        ("LMC", f.lmc),
    ):
        field_arr[n, p] = col(name)


def _speed_active_of(active: int, ext_active: int) -> int:
    try:
        return int(speed_from_portinfo(active, ext_active))
    except ValueError:
        return 0


def _build(
    nodes: dict[int, _NodeRec], links: dict[tuple[int, int], tuple[int, int]], errors: list[str]
) -> tuple[Fabric, list[Path], dict[int, dict[str, Any]]]:
    recs = sorted(nodes.values(), key=lambda r: r.guid)
    dup = {d for d, k in Counter(r.desc for r in recs).items() if k > 1}
    b = FabricBuilder()
    for r in recs:
        prefix = "S" if r.type == NodeType.SWITCH else "H"
        name = r.desc if r.desc and r.desc not in dup else f"{prefix}-{r.guid:016x}"
        if r.type == NodeType.SWITCH:
            pg = [r.port_guids.get(0, r.guid)] * (r.nports + 1)
        else:
            pg = [0] + [r.port_guids.get(p, 0) for p in range(1, r.nports + 1)]
        b.add_node(
            r.type,
            r.nports,
            name,
            desc=r.desc,
            guid=r.guid,
            sysimg_guid=r.sysimg_guid,
            port_guids=pg,
            vendor_id=r.vendor_id,
            device_id=r.device_id,
        )
    index = {r.guid: i for i, r in enumerate(recs)}
    for (ga, pa), (gb, pb) in links.items():
        if (ga, pa) < (gb, pb):
            try:
                b.connect(index[ga], pa, index[gb], pb)
            except FabricError as e:  # a port beyond NumPorts: report, keep the rest
                errors.append(f"link {ga:#018x}[{pa}] - {gb:#018x}[{pb}] dropped: {e}")
    f = b.build()
    sw_info: dict[int, dict[str, Any]] = {}
    where: list[tuple[int, int]] = []
    raws: list[bytes] = []
    for i, r in enumerate(recs):
        if r.switch_info is not None:
            sw_info[i] = r.switch_info
        for p, raw in r.port_raw.items():
            where.append((i, p))
            raws.append(raw)
        if r.type != NodeType.SWITCH:
            # A CA port never reached has no known GUID: it is not an end port (yet).
            for p in range(1, r.nports + 1):
                if p not in r.port_guids:
                    f.port_exists[i, p] = False
    apply_port_infos(f, where, np.frombuffer(b"".join(raws), np.uint8).reshape(len(raws), PORT_INFO.size))
    # Ports whose PortInfo says the link is down keep no cable in the model.
    up = f.phys_state == PhysState.LINKUP
    stale = (f.peer_node >= 0) & ~up
    for n, p in np.argwhere(stale).tolist():
        if f.peer_node[n, p] >= 0:
            f.disconnect(n, p)
    f.reindex()
    return f, [r.path for r in recs], sw_info
