"""MCMemberRecord (IBA 15.2.5.17): multicast groups and their members, as OpenSM's osm_sa_mcmember_record.c.

ibfm creates no multicast groups yet (issue 16 brings them, with the MFT
programming they need): ClassPortInfo advertises no UD multicast, Get and
GetTable answer from the store's groups (``store.mc_groups``, empty today:
an empty table, or ERR_NO_RECORDS for a Get), and a join (Set) or leave
(Delete) is answered ERR_REQ_INVALID.

The shape issue 16 fills: :class:`~sm.sa.store.McGroup` holds a group's
MCMemberRecord parameters (MGID, MLID, Q_Key, MTU, rate, P_Key, SL, ...) as a
packed record and its members by PortGID (:class:`~sm.sa.store.McMember`:
JoinState, ProxyJoin); :func:`member_rows` packs one record per member, which
is what Get and GetTable select from.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np

from fabric.mad.sa import MCMEMBER_RECORD, SaAttr, SaMethod, SaStatus
from sm.sa.server import Rows, SaContext, SaError, SaRequest
from sm.sa.store import SaStore
from sm.sa.table import GET_METHODS, empty, select

log = logging.getLogger(__name__)

_PORT_GID = slice(16, 32)
_JOIN_BYTE = 48
"""Byte of Scope (high nibble) and JoinState (low nibble)."""
_PROXY_BYTE = 49


def member_rows(store: SaStore) -> Rows:
    """One MCMemberRecord per (group, member): the group's record with the member's PortGID, JoinState, ProxyJoin."""
    recs: list[bytes] = []
    for g in store.mc_groups.values():
        for m in g.members.values():
            r = bytearray(g.record[: MCMEMBER_RECORD.size].ljust(MCMEMBER_RECORD.size, b"\0"))
            r[_PORT_GID] = m.port_gid
            r[_JOIN_BYTE] = (r[_JOIN_BYTE] & 0xF0) | (m.join_state & 0x0F)
            r[_PROXY_BYTE] = (r[_PROXY_BYTE] & 0x7F) | (0x80 if m.proxy_join else 0)
            recs.append(bytes(r))
    if not recs:
        return empty(MCMEMBER_RECORD.size)
    return np.frombuffer(b"".join(recs), np.uint8).reshape(len(recs), -1)


class McMemberRecordFamily:
    attr: ClassVar[int] = int(SaAttr.MCMEMBER_RECORD)
    size: ClassVar[int] = MCMEMBER_RECORD.size
    methods: ClassVar[frozenset[int]] = GET_METHODS | {int(SaMethod.SET), int(SaMethod.DELETE)}

    def __init__(self) -> None:
        self.refused = 0
        """Joins and leaves refused (no multicast groups yet)."""

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        if req.mad.method in GET_METHODS:
            return select(self.attr, member_rows(ctx.store), req.mad.data, req.mask)
        self.refused += 1
        n = self.refused
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, ... (any host can repeat it as fast as it likes)
            log.info(
                "MCMemberRecord %s from LID %#x refused: multicast joins arrive with issue 16 (%d so far)",
                "join" if req.mad.method == SaMethod.SET else "leave", req.src.lid, n,
            )
        raise SaError(SaStatus.ERR_REQ_INVALID, "multicast joins arrive with issue 16")
