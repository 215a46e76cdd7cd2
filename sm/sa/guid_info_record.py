"""GUIDInfoRecord (IBA 15.2.5.18), Get and GetTable, as OpenSM 3.3.23 answers them.

One record per (end port, block) for blocks 0..ceil(GUIDCap/8)-1, GUIDCap from the port's
PortInfo (a switch: port 0 only; a CA or router: each port with a LID). GUID 0 of block 0 is
the port GUID; the other entries are the alias GUIDs assigned to the port
(``store.alias_guids``: ``{(port_guid, index): alias_guid}``, filled by the alias GUID
service), 0 where none.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fabric.mad.sa import SaAttr
from fabric.model import NodeType
from sm.sa.server import Rows, SaContext
from sm.sa.switch_records import put16
from sm.sa.table import TableFamily, empty

GUIDS_PER_BLOCK = 8


def guid_ports(snapshot: Any) -> list[tuple[int, int, int]]:
    """(node, port, LID) of every end port, node then port order."""
    f = snapshot.fabric
    base = snapshot.lids.base
    out: list[tuple[int, int, int]] = []
    for node in range(f.n_nodes):
        ports = [0] if f.node_type[node] == NodeType.SWITCH else range(1, int(f.nports[node]) + 1)
        for p in ports:
            lid = int(base[node, p])
            if lid:
                out.append((node, p, lid))
    return out


class GuidInfoRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.GUID_INFO_RECORD)

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        f = snap.fabric
        pinfo = snap.discovery.port_info
        aliases: dict[tuple[int, int], int] = getattr(ctx.store, "alias_guids", None) or {}
        by_port: dict[int, list[tuple[int, int]]] = {}
        for (pg, index), alias in aliases.items():
            by_port.setdefault(int(pg), []).append((int(index), int(alias)))
        recs: list[tuple[int, int, list[int]]] = []
        for node, port, lid in guid_ports(snap):
            pi = pinfo.get((node, port))
            cap = int(pi.get("GUIDCap", 1)) if pi else 1
            nblocks = max(1, (cap + GUIDS_PER_BLOCK - 1) // GUIDS_PER_BLOCK)
            guids = [0] * (nblocks * GUIDS_PER_BLOCK)
            pg = int(f.port_guid[node, port])
            for index, alias in by_port.get(pg, ()):
                if 0 < index < len(guids):
                    guids[index] = alias
            guids[0] = pg
            for b in range(nblocks):
                recs.append((lid, b, guids[b * GUIDS_PER_BLOCK : (b + 1) * GUIDS_PER_BLOCK]))
        if not recs:
            return empty(self.size)
        out = np.zeros((len(recs), self.size), np.uint8)
        put16(out, 0, [r[0] for r in recs])
        out[:, 2] = [r[1] for r in recs]
        g = np.asarray([r[2] for r in recs], np.uint64).astype(">u8")
        out[:, 8:72] = g.view(np.uint8).reshape(len(recs), 64)
        return out
