"""SMInfoRecord (IBA 15.2.5.9): this SM and the other SMs it knows, as osm_sa_sminfo_record.c answers.

Our own record (the SM port's LID, our GUID, ActCount, Priority, SMState) and
one per SM the last arbitration saw (their LID and the SMInfo they answered).
SM_Key is always 0 (OpenSM never fills it in). Built on every query: ActCount
and the states move between snapshots.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fabric.mad.constants import SmState
from fabric.mad.sa import SaAttr
from sm.sa.server import Rows, SaContext
from sm.sa.table import TableFamily, empty


def _record(lid: int, guid: int, act_count: int, priority: int, state: int) -> bytes:
    return (
        (lid & 0xFFFF).to_bytes(2, "big")
        + bytes(2)
        + (guid & (1 << 64) - 1).to_bytes(8, "big")
        + bytes(8)
        + (act_count & 0xFFFFFFFF).to_bytes(4, "big")
        + bytes([(priority & 0xF) << 4 | (int(state) & 0xF)])
    )


class SmInfoRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.SM_INFO_RECORD)

    def rows(self, ctx: SaContext) -> Rows:
        return self.build(ctx)

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        sm: Any = ctx.sm
        recs: list[bytes] = []
        if sm is not None:
            recs.append(_record(snap.sm_lid, sm.guid, sm.act_count, sm.priority, sm.state))
            for peer in sm.peers.values():
                if peer.guid == sm.guid:
                    continue
                recs.append(_record(peer.lid, peer.guid, peer.act_count, peer.priority, peer.state))
        else:  # outside a daemon: the SM port, as the master it answers for
            d = snap.discovery
            guid = int(snap.fabric.port_guid[d.sm_node, d.sm_port])
            recs.append(_record(snap.sm_lid, guid, 0, 0, SmState.MASTER))
        if not recs:
            return empty(self.size)
        return np.frombuffer(b"".join(recs), np.uint8).reshape(-1, self.size).copy()
