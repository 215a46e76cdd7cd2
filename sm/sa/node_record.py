"""NodeRecord (IBA 15.2.5.2): one record per end port, as OpenSM's osm_sa_node_record.c answers.

An end port is every CA port with a LID and each switch's port 0. The record
carries the port's base LID, the NodeInfo the device answered during discovery
with PortGUID and LocalPortNum made the end port's (a switch's: 0, whatever
port discovery entered by, as OpenSM's ``ib_node_info_set_local_port_num``),
and the NodeDescription NUL padded to 64 bytes. Records are in LID order.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt

from fabric.mad.attributes import NODE_INFO
from fabric.mad.sa import SaAttr
from fabric.model import NodeType
from sm.sa.server import Rows, SaContext
from sm.sa.table import TableFamily, empty

_NI = 4
"""Offset of NodeInfo in the record."""
_DESC = 44
_PORT_GUID = _NI + 20
_LOCAL_PORT = _NI + 36


def end_lids(ctx: SaContext) -> npt.NDArray[np.uint16]:
    """``[node, port]`` -> the LID of the end port a port belongs to (a switch's ports: its port 0 LID)."""
    key = "end_lids"
    got = ctx.cache.get(key)
    if got is None:
        snap = ctx.snapshot
        f = snap.fabric
        base = np.asarray(snap.lids.base)
        got = base.copy()
        sw = np.asarray(f.node_type) == NodeType.SWITCH
        got[sw, :] = base[sw, 0][:, None]
        ctx.cache[key] = got
    return got  # type: ignore[no-any-return]


def _descs(descs: list[str], nodes: npt.NDArray[np.intp]) -> npt.NDArray[np.uint8]:
    raw = b"".join(descs[i].encode("utf-8", "replace")[:64].ljust(64, b"\0") for i in nodes.tolist())
    return np.frombuffer(raw, np.uint8).reshape(-1, 64)


class NodeRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.NODE_RECORD)

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        f = snap.fabric
        infos: dict[int, dict[str, object]] = snap.discovery.node_info
        base = np.asarray(snap.lids.base)
        known = np.zeros(f.n_nodes, np.bool_)
        if infos:
            known[np.fromiter(infos.keys(), np.intp, len(infos))] = True
        sw = np.asarray(f.node_type) == NodeType.SWITCH
        end = np.asarray(f.port_exists) & (base != 0) & ~sw[:, None]
        end[:, 0] = False
        end[sw, 0] = True
        end &= known[:, None]
        nodes, ports = np.nonzero(end)
        n = nodes.shape[0]
        if not n:
            return empty(self.size)
        lids = base[nodes, ports].astype(np.uint16)
        order = np.lexsort((ports, nodes, lids))
        nodes, ports, lids = nodes[order], ports[order], lids[order]
        # NodeInfo once per node, then the rows pick theirs.
        uniq, inv = np.unique(nodes, return_inverse=True)
        ni = np.frombuffer(b"".join(NODE_INFO.pack(infos[i]) for i in uniq.tolist()), np.uint8).reshape(-1, 40)
        rows = np.zeros((n, self.size), np.uint8)
        rows[:, 0:2] = lids.astype(">u2").view(np.uint8).reshape(-1, 2)
        rows[:, _NI : _NI + 40] = ni[inv]
        guids = np.asarray(f.port_guid)[nodes, ports].astype(">u8").view(np.uint8).reshape(-1, 8)
        rows[:, _PORT_GUID : _PORT_GUID + 8] = guids
        rows[:, _LOCAL_PORT] = ports.astype(np.uint8)
        rows[:, _DESC : _DESC + 64] = _descs(f.descs, uniq)[inv]
        return rows
