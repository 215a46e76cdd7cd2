"""The SLtoVLMappingTables, VLArbitrationTables and VLHighLimits of a fabric, as OpenSM computes them.

As ``osm_qos.c`` (``osm_qos_setup``, OpenSM 3.3.23, ``use_optimized_slvl`` off):

- Every switch external port 1..N gets the ``qos_swe_*`` VL arbitration blocks and VLHighLimit.
  If the switch's port 0 has IsSLMappingSupported, every (input port, output port) pair gets
  the ``qos_swe_sl2vl`` table, input ports 0..N, output ports 1..N (0..N with an enhanced port
  0), each reduced to its output port's operational VLs.
- An enhanced switch port 0 also gets the ``qos_sw0_*`` blocks, VLHighLimit and, with
  IsSLMappingSupported, the (0, 0) table; a base port 0 gets nothing.
- A CA port gets the ``qos_ca_*`` ones, a router port the ``qos_rtr_*`` ones (its SL2VL table
  only with IsSLMappingSupported).
- "Reduced to the operational VLs": every VL (but 15 in an SL2VL table) is ANDed with
  ``2^(OperationalVLs-1) - 1`` (VL0-7: 7), as ``sl2vl_update_table`` and
  ``vlarb_update_table_block`` do; with OperationalVLs 0 OpenSM's shift leaves every bit (x86).
- VL arbitration block 1 holds the first min(VLArbitrationLowCap, 32) low-priority entries,
  block 2 the next ``cap % 32`` (sent only when the cap exceeds 32), blocks 3 and 4 the high
  priority ones by VLArbitrationHighCap; entries beyond the length are 0.

A layered routing engine (``RoutingResult.layers``) needs SL k on VL k for its layers 0..L-1 on
every port: those entries are set so after the reduction above, and a port whose operational VLs
cannot carry VL L-1, or whose arbitration tables give a layer's VL no weight, is a problem
(listed; the tables still go out). With QoS off and no layers nothing is planned: OpenSM
without ``-Q`` leaves the tables as the ports hold them. With QoS off and layers, the tables are
planned from OpenSM's default options (as if ``-Q`` with no ``qos_*`` option), so the layers hold.

The QoS level of a path (policy file, then the partition's ``sl``) is :meth:`QosPlan.level_sl`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from fabric.mad import VLARB_BLOCK_SIZE, PortCap
from fabric.model import NO_PEER, Fabric, NodeType
from sm.qos.config import QosConfig, QosPolicy

__all__ = ["QosPlan", "pack_sl2vl", "plan_qos", "vl_mask"]

Port = tuple[int, int]
_SL_MAP = int(PortCap.IS_SL_MAPPING_SUPPORTED)
VLARB_BLOCK = VLARB_BLOCK_SIZE


def vl_mask(op_vls: int) -> int:
    """OpenSM's mask of the VLs a port with OperationalVLs code ``op_vls`` carries: ``2^(op_vls-1) - 1``."""
    return 0xF if op_vls <= 0 else (1 << (op_vls - 1)) - 1


@dataclass(frozen=True)
class QosPlan:
    """What QoS sets on every port, as arrays, and the QoS level of paths.

    ``sl2vl_out[node, port]``: the VL of each SL (``uint8[16]``) of the tables whose output port is
    ``port``; ``sl2vl_set[node, port]``: such tables are set (on a switch for every input port
    0..N, on a CA its one table, input port 0); ``sl2vl_p0``: an enhanced switch port 0's own (0, 0)
    table (``qos_sw0_sl2vl``). ``vlarb_row[node, port]``: the row of ``vlarb`` / ``vlarb_len`` of a
    port's VL arbitration blocks (-1: none set); ``vlarb[row]``: ``uint8[4, 32, 2]``, blocks 1..4 as
    (VL, weight); ``vlarb_len[row]``: the entries each block carries (0: not set, -1: set with none,
    OpenSM's zero-length block past a 32-entry cap). ``high_limit``: (node, port) -> VLHighLimit.
    """

    enabled: bool
    sl2vl_out: npt.NDArray[np.uint8]
    sl2vl_set: npt.NDArray[np.bool_]
    sl2vl_p0: Mapping[int, npt.NDArray[np.uint8]]
    vlarb_row: npt.NDArray[np.int64]
    vlarb_ports: npt.NDArray[np.int64]
    vlarb: npt.NDArray[np.uint8]
    vlarb_len: npt.NDArray[np.int64]
    high_limit: Mapping[Port, int]
    layers: int = 1
    """SLs (= VLs) the routing engine's layers use: SL k on VL k for k < layers."""
    problems: tuple[str, ...] = ()
    config: QosConfig = field(default_factory=QosConfig)
    groups: Mapping[str, frozenset[Port]] = field(default_factory=dict)
    """The policy's port groups, resolved to end ports."""
    partition_sl: Mapping[int, int] = field(default_factory=dict)
    """15-bit P_Key -> the partition's ``sl`` (QoS on only)."""
    nports: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    is_switch: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))

    @property
    def empty(self) -> bool:
        """Nothing to set (QoS off and one layer)."""
        return not self.sl2vl_set.any() and not self.vlarb_ports.size

    def sl2vl_table(self, node: int, in_port: int, out_port: int) -> npt.NDArray[np.uint8] | None:
        """The VL of each SL set on (node, in, out) (a CA port: in 0), or None when none is set there."""
        if in_port == 0 and out_port == 0 and node in self.sl2vl_p0:
            return self.sl2vl_p0[node]
        if not (0 <= node < self.sl2vl_set.shape[0] and 0 <= out_port < self.sl2vl_set.shape[1]):
            return None
        if not self.sl2vl_set[node, out_port] or (not self.is_switch[node] and in_port != 0):
            return None
        if self.is_switch[node] and not 0 <= in_port <= int(self.nports[node]):
            return None
        t: npt.NDArray[np.uint8] = self.sl2vl_out[node, out_port]
        return t

    def sl2vl_bytes(self, node: int, in_port: int, out_port: int) -> bytes | None:
        """The 8-byte SLtoVLMappingTable set on (node, in, out), or None when none is set there."""
        t = self.sl2vl_table(node, in_port, out_port)
        return None if t is None else pack_sl2vl(t).tobytes()

    def sl2vl_rows(
        self, nodes: npt.NDArray[np.int64], in_ports: npt.NDArray[np.int64], out_ports: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.uint8]:
        """The 8-byte tables of many (node, in, out) at once (``[k, 8]``; zeros where none is set)."""
        out = np.zeros((nodes.size, 8), np.uint8)
        inside = (out_ports >= 0) & (out_ports < self.sl2vl_set.shape[1])
        o = np.where(inside, out_ports, 0)
        ok = inside & self.sl2vl_set[nodes, o] & (self.is_switch[nodes] | (in_ports == 0))
        out[ok] = pack_sl2vl(self.sl2vl_out[nodes[ok], o[ok]])
        for n, t in self.sl2vl_p0.items():
            out[(nodes == n) & (in_ports == 0) & (out_ports == 0)] = pack_sl2vl(t)
        return out

    def vlarb_block(self, node: int, port: int, block: int) -> bytes | None:
        """The 64-byte VLArbitrationTable block 1..4 set on (node, port) (entries past the length 0), or None."""
        if not (0 <= node < self.vlarb_row.shape[0] and 0 <= port < self.vlarb_row.shape[1]):
            return None
        r = int(self.vlarb_row[node, port])
        if r < 0 or not self.vlarb_len[r, block - 1]:
            return None
        return self.vlarb[r, block - 1].tobytes()

    def level_sl(self, src: Port, dst: Port, pkey: int) -> int | None:
        """The SL of the QoS level of a path between end ports ``src`` and ``dst`` with P_Key ``pkey``:
        the first policy rule that matches (source group, destination group, P_Key range) and whose
        level has an SL, else the partition's ``sl``, else None. Always None with QoS off."""
        if not self.enabled:
            return None
        policy = self.config.policy
        key = pkey & 0x7FFF
        if policy is not None:
            for rule in policy.rules:
                if rule.sources and not any(src in self.groups.get(g, ()) for g in rule.sources):
                    continue
                if rule.destinations and not any(dst in self.groups.get(g, ()) for g in rule.destinations):
                    continue
                if rule.pkeys and not any(lo & 0x7FFF <= key <= hi & 0x7FFF for lo, hi in rule.pkeys):
                    continue
                sl = policy.level(rule.level).sl
                if sl is not None:
                    return sl
                break  # OpenSM: the first matching rule decides; its level without an SL leaves the partition's
        return self.partition_sl.get(key)


def pack_sl2vl(vls: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """``uint8[..., 16]`` VLs -> ``uint8[..., 8]`` SLtoVLMappingTable bytes (SL0 in the top nibble)."""
    return ((vls[..., 0::2] << 4) | vls[..., 1::2]).astype(np.uint8)


_MAX_PROBLEMS = 20


def plan_qos(
    config: QosConfig,
    fabric: Fabric,
    ports: Mapping[str, npt.NDArray[Any]],
    enhanced: npt.NDArray[np.bool_],
    op_vls: npt.NDArray[np.uint8],
    *,
    layers: int = 1,
    partitions: Any = None,
    sm_port: Port | None = None,
) -> QosPlan:
    """The tables of every port (see the module's docstring), as arrays.

    ``ports``: PortInfo columns per ``[node, port]`` as the ports hold them: ``known`` (PortInfo
    read), ``CapabilityMask``, ``VLArbitrationLowCap``, ``VLArbitrationHighCap``, ``OperationalVLs``;
    ``enhanced``: per node, SwitchInfo.EnhancedPort0; ``op_vls``: OperationalVLs per ``[node, port]``
    the links will have (0 where the port's own value stands); ``layers``: SLs the routing engine
    uses; ``partitions``: the partition plan (port groups by partition, partitions' ``sl``)."""
    f = fabric
    shape = f.port_exists.shape
    width = shape[1]
    problems: list[str] = []
    more = 0
    program = config.enabled or layers > 1
    opts_of = config if config.enabled else QosConfig(enabled=False)
    known = np.asarray(ports["known"], bool) & f.port_exists
    is_sw = f.node_type == NodeType.SWITCH
    is_rtr = f.node_type == NodeType.ROUTER
    pidx = np.arange(width)[None, :]
    op = np.where(op_vls > 0, op_vls, np.asarray(ports["OperationalVLs"])).astype(np.int64)
    mask = np.where(op <= 0, 0xF, (1 << np.maximum(op - 1, 0)) - 1).astype(np.uint8)
    sl_cap = (np.asarray(ports["CapabilityMask"]).astype(np.int64) & _SL_MAP) != 0
    sw_ok = is_sw & known[:, 0]
    ext = sw_ok[:, None] & known & (pidx >= 1)
    enh0 = np.zeros(shape, bool)
    enh0[:, 0] = sw_ok & np.asarray(enhanced, bool)
    endp = ~is_sw[:, None] & known & (pidx >= 1) & (f.peer_node != NO_PEER)
    if not program:
        ext[:] = False
        enh0[:] = False
        endp[:] = False
    # kinds: 0 ca, 1 swe, 2 sw0, 3 rtr
    kind = np.where(is_sw[:, None], np.where(pidx == 0, 2, 1), np.where(is_rtr[:, None], 3, 0))
    kinds = [opts_of.ca, opts_of.swe, opts_of.sw0, opts_of.rtr]
    base = np.array([k.sl2vl for k in kinds], np.uint8)  # [4, 16]
    sl2vl_set = ((ext | enh0) & sw_ok[:, None] & sl_cap[:, :1]) | (endp & sl_cap)
    # the (in, out) tables of a switch: qos_swe_* whatever the output port (port 0 too), as extports_setup
    tkind = np.where(is_sw[:, None], 1, kind)
    out = np.zeros((*shape, 16), np.uint8)
    t = base[tkind[sl2vl_set]]
    m = mask[sl2vl_set][:, None]
    t = np.where(t == 15, 15, t & m).astype(np.uint8)
    if layers > 1:
        t[:, :layers] = np.arange(layers, dtype=np.uint8)[None, :] & m
    out[sl2vl_set] = t
    p0: dict[int, npt.NDArray[np.uint8]] = {}
    for n in np.flatnonzero(enh0[:, 0] & sl_cap[:, 0]).tolist():
        tb = base[2]
        mm = int(mask[n, 0])
        tt = np.where(tb == 15, 15, tb & mm).astype(np.uint8)
        if layers > 1:
            tt[:layers] = np.arange(layers, dtype=np.uint8) & mm
        p0[n] = tt
    if layers > 1:
        linked = (f.peer_node != NO_PEER) & (pidx >= 1)  # ports that carry the routes
        short = sl2vl_set & linked & (mask < layers - 1)
        for n, p in np.argwhere(short).tolist()[:_MAX_PROBLEMS]:
            problems.append(
                f"{f.port_name(n, p)}: {layers} routing layers need VLs 0..{layers - 1}, the port carries VLs "
                f"0..{int(mask[n, p])}: higher SLs share lower VLs there (not deadlock-free)"
            )
        more += max(int(short.sum()) - _MAX_PROBLEMS, 0)
    # VL arbitration: every external switch port, enhanced port 0, every CA and router port
    arb = ext | enh0 | endp
    rows = np.argwhere(arb)
    rn, rp = rows[:, 0], rows[:, 1]
    k = rows.shape[0]
    lows = np.array([k_.vlarb_low for k_ in kinds], np.uint8)  # [4, 64, 2]
    highs = np.array([k_.vlarb_high for k_ in kinds], np.uint8)
    kk = kind[rn, rp]
    blocks = np.zeros((k, 4, VLARB_BLOCK, 2), np.uint8)
    lens = np.zeros((k, 4), np.int64)
    ent = np.arange(VLARB_BLOCK)[None, :]
    for b0, table, capname in ((0, lows, "VLArbitrationLowCap"), (2, highs, "VLArbitrationHighCap")):
        cap = np.asarray(ports[capname]).astype(np.int64)[rn, rp]
        src = table[kk]  # [k, 64, 2]
        n1 = np.minimum(cap, VLARB_BLOCK)
        blocks[:, b0] = np.where((ent < n1[:, None])[..., None], src[:, :VLARB_BLOCK], 0)
        lens[:, b0] = n1
        n2 = cap % VLARB_BLOCK
        over = cap > VLARB_BLOCK
        blocks[:, b0 + 1] = np.where((over[:, None] & (ent < n2[:, None]))[..., None], src[:, VLARB_BLOCK:], 0)
        lens[:, b0 + 1] = np.where(over, np.where(n2 > 0, n2, -1), 0)
    rmask = mask[rn, rp]
    blocks[..., 0] &= rmask[:, None, None]
    keep = (lens != 0).any(axis=1)
    rows, rn, rp, blocks, lens, rmask = rows[keep], rn[keep], rp[keep], blocks[keep], lens[keep], rmask[keep]
    if layers > 1 and rows.size:
        valid = np.arange(VLARB_BLOCK)[None, None, :] < np.maximum(lens, 0)[:, :, None]
        weighted = valid & (blocks[..., 1] > 0)
        missing = np.zeros(rows.shape[0], bool)
        for v in range(layers):
            has = (weighted & (blocks[..., 0] == v)).any(axis=(1, 2))
            missing |= ~has & (v <= rmask) & (f.peer_node[rn, rp] != NO_PEER) & (rp >= 1)
        for j in np.flatnonzero(missing).tolist()[:_MAX_PROBLEMS]:
            problems.append(f"{f.port_name(int(rn[j]), int(rp[j]))}: VL arbitration gives a layer's VL no weight: "
                            "its packets never leave")  # fmt: skip
        more += max(int(missing.sum()) - _MAX_PROBLEMS, 0)
    vlarb_row = np.full(shape, -1, np.int64)
    vlarb_row[rn, rp] = np.arange(rows.shape[0])
    high: dict[Port, int] = {}
    if config.enabled and rows.size:
        hl = np.array([k_.high_limit for k_ in kinds], np.int64)[kind[rn, rp]]
        high = dict(zip(zip(rn.tolist(), rp.tolist(), strict=True), hl.tolist(), strict=True))
    if more:
        problems.append(f"... and {more} more")
    groups: dict[str, frozenset[Port]] = {}
    part_sl: dict[int, int] = {}
    if config.enabled:
        cfg = getattr(partitions, "config", None)
        for part in cfg if cfg is not None else ():
            if part.sl:
                part_sl[part.pkey] = int(part.sl)
        if config.policy is not None:
            groups = _resolve_groups(config.policy, f, partitions, sm_port, problems)
    return QosPlan(
        enabled=config.enabled,
        sl2vl_out=out,
        sl2vl_set=sl2vl_set,
        sl2vl_p0=p0,
        vlarb_row=vlarb_row,
        vlarb_ports=rows.astype(np.int64).reshape(-1, 2),
        vlarb=blocks,
        vlarb_len=lens,
        high_limit=high,
        layers=layers,
        problems=tuple(problems),
        config=config,
        groups=groups,
        partition_sl=part_sl,
        nports=f.nports.astype(np.int64),
        is_switch=is_sw,
    )


def _resolve_groups(
    policy: QosPolicy, f: Fabric, partitions: Any, sm_port: Port | None, problems: list[str]
) -> dict[str, frozenset[Port]]:
    """Each port group as the end ports it names."""
    eps = [(int(n), int(p)) for n, p in f.endports().tolist()]
    by_guid: dict[int, Port] = {int(f.port_guid[n, p]): (n, p) for n, p in eps}
    by_name: dict[str, Port] = {}
    for n, p in eps:
        by_name[f"{f.names[n]}/P{p}"] = (n, p)
    cfg = getattr(partitions, "config", None)
    out: dict[str, frozenset[Port]] = {}
    for g in policy.groups:
        ports: set[Port] = set()
        for lo, hi in g.guids:
            if hi - lo < 4096:
                ports.update(by_guid[x] for x in range(lo, hi + 1) if x in by_guid)
            else:
                ports.update(v for k, v in by_guid.items() if lo <= k <= hi)
        for name in g.port_names:
            hit = by_name.get(name)
            if hit is None:
                problems.append(f"QoS policy port-group {g.name!r}: no port named {name!r} on the fabric")
            else:
                ports.add(hit)
        for word in g.node_types:
            if word == "ALL":
                ports.update(eps)
            elif word == "SELF":
                if sm_port is not None:
                    ports.add(sm_port)
            else:
                want = {"CA": NodeType.CA, "SWITCH": NodeType.SWITCH, "ROUTER": NodeType.ROUTER}[word]
                ports.update((n, p) for n, p in eps if int(f.node_type[n]) == want)
        for pname in g.partitions:
            part = next((x for x in cfg if x.name == pname), None) if cfg is not None else None
            if part is None:
                problems.append(f"QoS policy port-group {g.name!r}: no partition {pname!r} in the partitions file")
                continue
            ports.update(partitions.members(part.pkey))
        out[g.name] = frozenset(ports)
    return out
