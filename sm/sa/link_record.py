"""LinkRecord (IBA 15.2.5.13): both directions of every link, as osm_sa_link_record.c answers.

FromLID and ToLID are the LIDs of the end ports the two ports belong to (a
switch port: the switch's port 0 LID); FromPort and ToPort the port numbers.
Records are in (FromLID, FromPort) order.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fabric.mad.sa import SaAttr
from sm.sa.node_record import end_lids
from sm.sa.server import Rows, SaContext
from sm.sa.table import TableFamily, empty


class LinkRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.LINK_RECORD)

    def build(self, ctx: SaContext) -> Rows:
        f = ctx.snapshot.fabric
        peer_node = np.asarray(f.peer_node)
        peer_port = np.asarray(f.peer_port)
        up = peer_node >= 0
        up[:, 0] = False
        nodes, ports = np.nonzero(up)
        if not nodes.shape[0]:
            return empty(self.size)
        pn = peer_node[nodes, ports].astype(np.intp)
        pp = peer_port[nodes, ports].astype(np.intp)
        lid = end_lids(ctx)
        from_lid = lid[nodes, ports].astype(np.uint16)
        to_lid = lid[pn, pp].astype(np.uint16)
        order = np.lexsort((ports, from_lid))
        rows = np.zeros((nodes.shape[0], self.size), np.uint8)
        rows[:, 0:2] = from_lid[order].astype(">u2").view(np.uint8).reshape(-1, 2)
        rows[:, 2] = ports[order].astype(np.uint8)
        rows[:, 3] = pp[order].astype(np.uint8)
        rows[:, 4:6] = to_lid[order].astype(">u2").view(np.uint8).reshape(-1, 2)
        return rows
