"""Per-port table records: SLtoVLMappingTableRecord, P_KeyTableRecord, VLArbitrationTableRecord.

ibfm answers from what it programmed (the snapshot's partition and QoS plans), through
:func:`sl2vl_tables`, :func:`pkey_blocks` and :func:`vlarb_blocks`; a table it did not set
(QoS off) is answered as OpenSM 3.3.23 answers then: zeros.

Which records exist (``osm_sa_slvl_record.c``, ``osm_sa_pkey_record.c``,
``osm_sa_vlarb_record.c``):

- A CA (or router) port with a LID: one SL2VL record, InputPortNum 0, OutputPortNum its port
  number; its P_Key blocks 0..ceil(PartitionCap/32)-1; VLArb blocks 1..4.
- A switch (LID of port 0), every port 0..NumPorts: SL2VL for every (out, in) pair, out port
  major; P_Key blocks 0..ceil(cap/32)-1 where cap is PartitionEnforcementCap for external
  ports (PartitionCap when the switch enforces nothing, and for port 0); VLArb blocks 1..4.

P_KeyTableRecords are answered to trusted requests only (ERR_REQ_INVALID otherwise).
OpenSM also leaves out ports that share no P_Key with the requester; with the default
partition every port shares 0xFFFF, so nothing is left out.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from fabric.mad.sa import SaAttr
from fabric.model import NodeType
from sm.sa.server import Rows, SaContext
from sm.sa.switch_records import put16
from sm.sa.table import TableFamily

DEFAULT_PKEY = 0xFFFF
PKEYS_PER_BLOCK = 32
VLARB_BLOCKS = (1, 2, 3, 4)
"""VLArbitration blocks: 1 low priority entries 0-31, 2 low 32-63, 3 high 0-31, 4 high 32-63."""

Ints = npt.NDArray[np.int64]


def end_ports(snapshot: Any) -> tuple[Ints, Ints, Ints, Ints]:
    """The ports records are reported for: ``(node, port, lid, is_switch)`` arrays, node then port order.

    Switches: every port 0..NumPorts, with the LID of port 0; other nodes: each port that has a LID."""
    f = snapshot.fabric
    base = snapshot.lids.base
    nodes: list[int] = []
    ports: list[int] = []
    lids: list[int] = []
    sws: list[bool] = []
    for node in range(f.n_nodes):
        if f.node_type[node] == NodeType.SWITCH:
            lid = int(base[node, 0])
            if not lid:
                continue
            for p in range(int(f.nports[node]) + 1):
                nodes.append(node)
                ports.append(p)
                lids.append(lid)
                sws.append(True)
        else:
            for p in range(1, int(f.nports[node]) + 1):
                lid = int(base[node, p])
                if lid:
                    nodes.append(node)
                    ports.append(p)
                    lids.append(lid)
                    sws.append(False)
    return (
        np.asarray(nodes, np.int64),
        np.asarray(ports, np.int64),
        np.asarray(lids, np.int64),
        np.asarray(sws, bool).astype(np.int64),
    )


# -- the tables as ibfm holds them (issues 16 and 17 replace these) -------------------------------


def sl2vl_tables(snapshot: Any, nodes: Ints, in_ports: Ints, out_ports: Ints) -> Rows:
    """The SLtoVLMappingTable (8 bytes) of each (node, in port, out port), as ibfm programmed it (the
    snapshot's QoS plan; a CA port is (node, 0, port)); a table ibfm did not set (QoS off, OpenSM's
    answer then): every SL on VL 0."""
    qos = getattr(snapshot, "qos", None)
    if qos is None or qos.empty:
        return np.zeros((nodes.size, 8), np.uint8)
    rows: Rows = qos.sl2vl_rows(nodes, in_ports, out_ports)
    return rows


def vlarb_blocks(snapshot: Any, nodes: Ints, ports: Ints, blocks: Ints) -> Rows:
    """The VLArbitrationTable block (64 bytes: 32 VL/weight pairs) of each (node, port, block), as ibfm
    programmed it (entries past the port's cap 0); a block ibfm did not set (QoS off): zero."""
    out = np.zeros((nodes.size, 64), np.uint8)
    qos = getattr(snapshot, "qos", None)
    if qos is None or qos.empty:
        return out
    for i, (n, p, b) in enumerate(zip(nodes.tolist(), ports.tolist(), blocks.tolist(), strict=True)):
        t = qos.vlarb_block(n, p, b)
        if t is not None:
            out[i] = np.frombuffer(t, np.uint8)
    return out


def pkey_blocks(snapshot: Any, nodes: Ints, ports: Ints, blocks: Ints) -> Rows:
    """The P_KeyTable block (64 bytes: 32 P_Keys) of each (node, port, block): the table the
    snapshot's partition plan gave the port; a port it gave none (a switch port between
    switches) or a snapshot without a plan: full member P_Key 0xFFFF at index 0, the rest 0."""
    out = np.zeros((nodes.size, 64), np.uint8)
    plan = getattr(snapshot, "partitions", None)
    tables = plan.tables if plan is not None else {}
    default = np.zeros(PKEYS_PER_BLOCK, ">u2")
    default[0] = DEFAULT_PKEY
    for i, (n, p, b) in enumerate(zip(nodes.tolist(), ports.tolist(), blocks.tolist(), strict=True)):
        table = tables.get((n, p))
        if table is None:
            if b == 0:
                out[i] = default.view(np.uint8)
            continue
        keys = np.asarray(table[b * PKEYS_PER_BLOCK : (b + 1) * PKEYS_PER_BLOCK], ">u2")
        out[i, : 2 * keys.size] = keys.view(np.uint8)
    return out


def pkey_table_blocks(snapshot: Any, node: int, port: int) -> int:
    """How many 32-entry P_Key blocks a port's table has (OpenSM's ``pkey_mgr_get_physp_max_blocks``)."""
    d = snapshot.discovery
    cap = int(d.node_info.get(node, {}).get("PartitionCap", 0))
    if port and node in d.switch_info:
        enforce = int(d.switch_info[node].get("PartitionEnforcementCap", 0))
        if enforce:
            cap = enforce
    return (cap + PKEYS_PER_BLOCK - 1) // PKEYS_PER_BLOCK


# -- families ----------------------------------------------------------------------------------------


class Sl2VlTableRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.SL2VL_TABLE_RECORD)

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        node, port, lid, sw = end_ports(snap)
        # A CA port: one record (in 0, out the port). A switch: every (out, in) pair of its ports.
        f = snap.fabric
        counts = np.where(sw == 1, f.nports[node].astype(np.int64) + 1, 1)
        idx = np.repeat(np.arange(node.size), counts)
        # in port: 0..nports for the switch's copies of each out port, 0 for a CA
        starts = np.cumsum(counts) - counts
        in_port = np.arange(idx.size) - np.repeat(starts, counts)
        rn, rl, out_port = node[idx], lid[idx], port[idx]
        out = np.zeros((idx.size, self.size), np.uint8)
        put16(out, 0, rl)
        out[:, 2] = in_port
        out[:, 3] = out_port
        out[:, 8:16] = sl2vl_tables(snap, rn, in_port, out_port)
        return out


class PKeyTableRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.PKEY_TABLE_RECORD)
    trusted_only: ClassVar[bool] = True

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        node, port, lid, _ = end_ports(snap)
        counts = np.asarray(
            [pkey_table_blocks(snap, n, p) for n, p in zip(node.tolist(), port.tolist(), strict=True)], np.int64
        )
        idx = np.repeat(np.arange(node.size), counts)
        starts = np.cumsum(counts) - counts
        block = np.arange(idx.size) - np.repeat(starts, counts)
        out = np.zeros((idx.size, self.size), np.uint8)
        put16(out, 0, lid[idx])
        put16(out, 2, block)
        out[:, 4] = port[idx]
        out[:, 8:72] = pkey_blocks(snap, node[idx], port[idx], block)
        return out


class VlArbTableRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.VLARB_TABLE_RECORD)

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        node, port, lid, _ = end_ports(snap)
        nb = len(VLARB_BLOCKS)
        idx = np.repeat(np.arange(node.size), nb)
        block = np.tile(np.asarray(VLARB_BLOCKS, np.int64), node.size)
        out = np.zeros((idx.size, self.size), np.uint8)
        put16(out, 0, lid[idx])
        out[:, 2] = port[idx]
        out[:, 3] = block
        out[:, 8:72] = vlarb_blocks(snap, node[idx], port[idx], block)
        return out
