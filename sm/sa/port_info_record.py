"""PortInfoRecord (IBA 15.2.5.3): one record per port whose PortInfo the SM holds (osm_sa_portinfo_record.c).

Every CA port and every port 0..N of each switch that discovery read: the
PortInfo is the bytes the SM holds for it (as read, then as its last Set
left it; a switch's external ports carry LID, MasterSMLID, GIDPrefix and
M_KeyLeasePeriod 0 exactly as stored). EndportLID is the LID of the port's
end port (a switch's ports: its port 0 LID), Options 0.

M_Key is zeroed in answers to requesters without the SA's SM_Key, before
matching too, so a query on M_Key tells them nothing. AttributeModifier bit
31 (advertised in ClassPortInfo as IS_PORT_INFO_CAPMASK_MATCH_SUPPORTED and
IS_PORT_INFO_CAPMASK2_MATCH_SUPPORTED): CapabilityMask and CapabilityMask2
match the records that have every bit set in the query's, as OpenSM does.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from fabric.mad.sa import SaAttr, SaStatus, component_bit
from sm.sa.node_record import end_lids
from sm.sa.server import Rows, SaContext, SaError, SaRequest
from sm.sa.table import TableFamily, empty, select

_PI = 4
"""Offset of PortInfo in the record."""
_M_KEY = slice(_PI, _PI + 8)
_CAP = slice(_PI + 20, _PI + 24)
_CAP2 = slice(_PI + 60, _PI + 62)
CAPMASK_MATCH = 1 << 31
"""AttributeModifier bit: CapabilityMask matches on the query's bits only."""


class PortInfoRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.PORT_INFO_RECORD)
    _cap_bit: ClassVar[int] = component_bit(SaAttr.PORT_INFO_RECORD, "CapabilityMask")
    _cap2_bit: ClassVar[int] = component_bit(SaAttr.PORT_INFO_RECORD, "CapabilityMask2")

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        table = snap.discovery.port_info
        keys = [k for k in table if table.raw(k) is not None]
        if not keys:
            return empty(self.size)
        nodes = np.fromiter((k[0] for k in keys), np.intp, len(keys))
        ports = np.fromiter((k[1] for k in keys), np.intp, len(keys))
        raw = b"".join(table.raw(k) or b"" for k in keys)
        pi = np.frombuffer(raw, np.uint8).reshape(-1, 64)
        lids = end_lids(ctx)[nodes, ports].astype(np.uint16)
        order = np.lexsort((ports, lids))
        rows = np.zeros((len(keys), self.size), np.uint8)
        rows[:, 0:2] = lids[order].astype(">u2").view(np.uint8).reshape(-1, 2)
        rows[:, 2] = ports[order].astype(np.uint8)
        rows[:, _PI : _PI + 64] = pi[order]
        return rows

    def public_rows(self, ctx: SaContext) -> Rows:
        """The records with M_Key zeroed (what requesters without the SM_Key see)."""
        key = f"table:{self.attr:#06x}:public"
        got = ctx.cache.get(key)
        if got is None:
            got = self.rows(ctx).copy()
            got[:, _M_KEY] = 0
            ctx.cache[key] = got
        return got  # type: ignore[no-any-return]

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        if self.trusted_only and not req.trusted:
            raise SaError(SaStatus.ERR_REQ_INVALID, "privileged record: the SA key is needed")
        rows = self.rows(ctx) if req.trusted else self.public_rows(ctx)
        mask = req.mask
        data = req.mad.data
        bitwise = [(bit, cols, dt) for bit, cols, dt in ((self._cap_bit, _CAP, ">u4"), (self._cap2_bit, _CAP2, ">u2"))
                   if mask & bit]  # fmt: skip
        if not (req.mad.attr_mod & CAPMASK_MATCH and bitwise):
            return select(self.attr, rows, data, mask)
        for bit, _, _ in bitwise:
            mask &= ~bit
        rows = select(self.attr, rows, data, mask)
        for _, cols, dt in bitwise:
            want = int.from_bytes(data[cols].ljust(cols.stop - cols.start, b"\0"), "big")
            caps = rows[:, cols].copy().view(dt).reshape(-1).astype(np.uint32)
            rows = rows[(caps & want) == want]
        return rows
