"""MCMemberRecord (IBA 15.2.5.17): multicast joins, leaves and queries, as OpenSM 3.3.23's osm_sa_mcmember_record.c.

The groups live in the store (:class:`~sm.sa.mcast_groups.McGroups`: members,
MLIDs, traps 66/67, the hooks); this module reads the requests.

Set (join, or create and join):

- The ComponentMask must hold MGID, PortGID and JoinState, else
  ERR_REQ_INSUFFICIENT_COMPONENTS. An MTU or rate code given with its
  selector must be a valid one, else ERR_REQ_INVALID (so for every method).
- The PortGID prefix must be the subnet's (ERR_REQ_INVALID_GID); its GUID a
  port of the subnet or one of its alias GUIDs (ERR_REQ_INVALID), and the
  requester (the source LID) a port of the subnet (OpenSM sends nothing; here
  ERR_REQ_INVALID). A PortGID other than the requester's is a proxy join: here
  only with the SA's SM_Key, and both ports must be in the group's partition
  (OpenSM 3.3.23 lets any requester sharing a P_Key with the port proxy-join).
  A P_Key in the mask with a zero base: ERR_REQ_INVALID.
- No group of that MGID: the JoinState must have FullMember or
  SendOnlyFullMember (ERR_REQ_INVALID), the mask Q_Key, TClass, P_Key,
  FlowLabel and SL too (ERR_REQ_INSUFFICIENT_COMPONENTS). An all-zero MGID
  has the SA assign one (ff1<scope>:a01b:<subnet prefix, counter>, scope
  link-local unless Scope is in the mask); a given MGID must start with 0xFF,
  and unless IPoIB-signed (0x401B, 0x601B) use no reserved flag and not the
  SA signature 0xA01B with link-local scope. An IPoIB MGID other than its
  partition's broadcast MGID needs the broadcast group to exist and the
  request to match it (Q_Key, P_Key, TClass, SL, FlowLabel, HopLimit), as
  OpenSM's ipoib_mcgroup_creation_validation. MTU, rate and PacketLifeTime:
  the creator's link MTU and rate (:attr:`~sm.sa.mcast_groups.McGroups.port_limits`;
  the pool's defaults when unknown) and the subnet timeout, adjusted by the
  request's selectors as PathRecord's (``_select1``); not realizable:
  ERR_REQ_INVALID. The MLID is the requested one (MLID in the mask) if free,
  else the lowest free; none left: ERR_NO_RESOURCES.
- A group exists: the components given (Q_Key, P_Key: same base and not both
  limited, TClass, SL, FlowLabel, HopLimit) must be the group's, MTU and rate
  selectors must accept the group's values, the port's link must carry the
  group's MTU and rate, the JoinState must not be 0 (all ERR_REQ_INVALID); an
  existing member joined by itself is changed only by itself, one joined by a
  proxy by itself or a member of the group's partition with the SA's SM_Key
  (o15-0.2.1).
- The port must be a member of the group's partition
  (:attr:`~sm.sa.mcast_groups.McGroups.pkey_membership`), else ERR_REQ_INVALID.
- The JoinState becomes the OR of the member's joins; the answer is the request
  with the group's MGID, Q_Key, MLID, TClass, P_Key, SL, FlowLabel, HopLimit,
  Scope, MTU, rate and PacketLifeTime (selectors 2) and the member's JoinState.

Delete (leave): the same mask and PortGID checks; the group must exist, the
port be a member, the JoinState share a bit with the member's and name no bit
it lacks, and the requester be the port itself (or, for a proxy-joined member,
a member of the group's partition with the SA's SM_Key): else ERR_REQ_INVALID. The bits
are cleared; the answer is the request with the JoinState left.

Get and GetTable: groups in MGID order, each skipped unless the requester is a
member of its partition and it matches MGID, MLID, Q_Key, P_Key, TClass, SL,
FlowLabel, HopLimit and the MTU and rate selectors. With PortGID in the mask:
that member's record; without, a trusted requester gets one record per member
(Scope and JoinState in the mask select them), others one record per group.
Without the SA's SM_Key PortGID, JoinState and ProxyJoin read 0 (p923).
"""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np

from fabric.mad.sa import MCMEMBER_RECORD, SaAttr, SaMethod, SaStatus, component_bit
from sm.sa.guid_info_record import lid_index, port_index, subnet_prefix
from sm.sa.mcast_groups import FULL_STATES, McGroup, McGroups, McMember, group_record
from sm.sa.path_record import _CODE_OF_RANK, _RANK_OF_CODE, SUBNET_TIMEOUT, _select1
from sm.sa.server import Rows, SaContext, SaError, SaRequest
from sm.sa.store import SaStore
from sm.sa.table import GET_METHODS, empty

log = logging.getLogger(__name__)

_A = int(SaAttr.MCMEMBER_RECORD)
SIZE = MCMEMBER_RECORD.size
_MGID = component_bit(_A, "MGID")
_PORT_GID = component_bit(_A, "PortGID")
_QKEY = component_bit(_A, "Q_Key")
_MLID = component_bit(_A, "MLID")
_MTU_SEL = component_bit(_A, "MTUSelector")
_MTU = component_bit(_A, "MTU")
_TCLASS = component_bit(_A, "TClass")
_PKEY = component_bit(_A, "P_Key")
_RATE_SEL = component_bit(_A, "RateSelector")
_RATE = component_bit(_A, "Rate")
_PLT_SEL = component_bit(_A, "PacketLifeTimeSelector")
_PLT = component_bit(_A, "PacketLifeTime")
_SL = component_bit(_A, "SL")
_FLOW = component_bit(_A, "FlowLabel")
_HOP = component_bit(_A, "HopLimit")
_SCOPE = component_bit(_A, "Scope")
_JOIN = component_bit(_A, "JoinState")
_PROXY = component_bit(_A, "ProxyJoin")

JOIN_MASK = _MGID | _PORT_GID | _JOIN
"""What a join or leave must name (OpenSM's JOIN_MC_COMP_MASK)."""
CREATE_MASK = JOIN_MASK | _QKEY | _TCLASS | _PKEY | _FLOW | _SL
"""What a join that creates its group must name (OpenSM's REQUIRED_MC_CREATE_COMP_MASK)."""
IPOIB_SIGNATURES = (0x401B, 0x601B)
SA_SIGNATURE = 0xA01B


def _refuse(why: str, status: int = SaStatus.ERR_REQ_INVALID) -> SaError:
    return SaError(status, why)


def _sl_flow_hop(rec: bytes) -> tuple[int, int, int]:
    v = int.from_bytes(rec[44:48], "big")
    return v >> 28, (v >> 8) & 0xFFFFF, v & 0xFF


def _check_codes(mask: int, rec: bytes) -> None:
    """OpenSM's mtu_is_valid / rate_is_valid: a code given with its selector must exist."""
    if mask & _MTU_SEL and mask & _MTU and not 1 <= rec[38] & 0x3F <= 5:
        raise _refuse(f"MTU code {rec[38] & 0x3F}")
    if mask & _RATE_SEL and mask & _RATE and not _RANK_OF_CODE[rec[42] & 0x3F]:
        raise _refuse(f"rate code {rec[42] & 0x3F}")


def other_fields_differ(mask: int, rec: bytes, group: bytes) -> str | None:
    """Why ``rec`` does not fit the group record ``group`` on Q_Key, P_Key, TClass, SL, FlowLabel and
    HopLimit (the components ``mask`` gives); None if it does (OpenSM's validate_other_comp_fields)."""
    if mask & _QKEY and rec[32:36] != group[32:36]:
        return "Q_Key"
    if mask & _PKEY:
        a, b = int.from_bytes(rec[40:42], "big"), int.from_bytes(group[40:42], "big")
        if not (a & 0x8000 or b & 0x8000):
            return "both P_Keys limited"
        if a & 0x7FFF != b & 0x7FFF:
            return "P_Key"
    if mask & _TCLASS and rec[39] != group[39]:
        return "TClass"
    q, g = _sl_flow_hop(rec), _sl_flow_hop(group)
    for bit, name, i in ((_SL, "SL", 0), (_FLOW, "FlowLabel", 1), (_HOP, "HopLimit", 2)):
        if mask & bit and q[i] != g[i]:
            return name
    return None


def _selector_fits(sel: int, have: int, want: int) -> bool:
    return (sel == 0 and have > want) or (sel == 1 and have < want) or (sel == 2 and have == want) or sel == 3


def selectors_accept(mask: int, rec: bytes, group: McGroup) -> bool:
    """Whether the request's MTU and rate selectors accept the group's values (validate_more_comp_fields)."""
    if mask & _MTU_SEL and mask & _MTU and not _selector_fits(rec[38] >> 6, group.mtu, rec[38] & 0x3F):
        return False
    return not (
        mask & _RATE_SEL
        and mask & _RATE
        and not _selector_fits(rec[42] >> 6, int(_RANK_OF_CODE[group.rate]), int(_RANK_OF_CODE[rec[42] & 0x3F]))
    )


def mgid_problem(mgid: bytes) -> str | None:
    """Why a requested MGID may not be created (OpenSM's validate_requested_mgid, o15-0.1.5); None if fine."""
    if mgid[0] != 0xFF:
        return f"MGID prefix {mgid[0]:#04x}, not 0xff"
    sig = int.from_bytes(mgid[2:4], "big")
    if sig in IPOIB_SIGNATURES:
        return None
    if mgid[1] & 0xE0:
        return "MGID uses reserved flags"
    if sig == SA_SIGNATURE and mgid[1] & 0x0F == 2:
        return "MGID with the SA's signature 0xa01b and link-local scope"
    return None


def ipoib_broadcast_of(mgid: bytes) -> bytes:
    """The IPv4 broadcast MGID of an IPoIB MGID's partition and scope."""
    return bytes((0xFF, 0x10 | (mgid[1] & 0x0F), 0x40, 0x1B)) + bytes(mgid[4:6]) + bytes(6) + b"\xff\xff\xff\xff"


class McMemberRecordFamily:
    attr: ClassVar[int] = _A
    size: ClassVar[int] = SIZE
    methods: ClassVar[frozenset[int]] = GET_METHODS | {int(SaMethod.SET), int(SaMethod.DELETE)}

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        rec = bytes(req.mad.data[:SIZE].ljust(SIZE, b"\0"))
        mask = req.mask
        method = req.mad.method
        if method in (SaMethod.SET, SaMethod.DELETE) and mask & JOIN_MASK != JOIN_MASK:
            raise _refuse("MGID, PortGID and JoinState are needed", SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS)
        _check_codes(mask, rec)
        store: SaStore = ctx.store
        groups = store.mcast
        if method == SaMethod.SET:
            out = self._join(ctx, req, groups, rec)
        elif method == SaMethod.DELETE:
            out = self._leave(ctx, req, groups, rec)
        else:
            return self._query(ctx, req, groups, rec)
        return np.frombuffer(out, np.uint8).reshape(1, -1)

    # -- common ------------------------------------------------------------------------

    @staticmethod
    def _port(ctx: SaContext, rec: bytes) -> int:
        """The end port a PortGID names (its GUID or one of its alias GUIDs)."""
        if int.from_bytes(rec[16:24], "big") != subnet_prefix(ctx.snapshot):
            raise _refuse("PortGID prefix is not the subnet's", SaStatus.ERR_REQ_INVALID_GID)
        guid = int.from_bytes(rec[24:32], "big")
        if guid in port_index(ctx):
            return guid
        store: SaStore = ctx.store
        for (base, _), alias in store.alias_guids.items():
            if alias == guid:
                return int(base)
        raise _refuse(f"PortGID names no port ({guid:#018x})")

    @staticmethod
    def _requester(ctx: SaContext, req: SaRequest) -> int:
        guid = lid_index(ctx).get(req.src.lid)
        if guid is None:
            raise _refuse(f"requester LID {req.src.lid:#x} is no port of the subnet")
        return guid

    @staticmethod
    def _in_partition(ctx: SaContext, groups: McGroups, guid: int, pkey: int) -> bool:
        return groups.pkey_membership(ctx, guid, pkey & 0x7FFF) is not None

    # -- join -----------------------------------------------------------------------------

    def _join(self, ctx: SaContext, req: SaRequest, groups: McGroups, rec: bytes) -> bytes:
        mask = req.mask
        port = self._port(ctx, rec)
        requester = self._requester(ctx, req)
        proxy = requester != port
        if proxy and not req.trusted:
            raise _refuse(f"join of port {port:#x} by port {requester:#x} without the SA key")
        if mask & _PKEY and not int.from_bytes(rec[40:42], "big") & 0x7FFF:
            raise _refuse("invalid P_Key")
        join_state = rec[48] & 0x0F
        mgid = bytes(rec[:16])
        group = groups.get(mgid)
        mtu, rate = groups.port_limits(ctx, port)
        if group is None:
            if not join_state & FULL_STATES:
                raise _refuse("only a full or send-only full member creates a group")
            if mask & CREATE_MASK != CREATE_MASK:
                raise _refuse(
                    "Q_Key, TClass, P_Key, FlowLabel and SL are needed to create a group",
                    SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS,
                )
            params = self._new_group(ctx, req, groups, rec, mtu, rate)
            self._check_link(port, mtu, rate, params[38] & 0x3F, params[42] & 0x3F)
            self._check_partition(ctx, groups, port, requester, proxy, int.from_bytes(params[40:42], "big"))
            want = int.from_bytes(rec[36:38], "big") if mask & _MLID else 0
            group = groups.create(params, want_mlid=want)
            if group is None:
                raise _refuse("no MLID left", SaStatus.ERR_NO_RESOURCES)
        else:
            why = other_fields_differ(mask, rec, group.record)
            if why is not None:
                raise _refuse(f"{why} differs from the group's")
            if not selectors_accept(mask, rec, group):
                raise _refuse("the group's MTU or rate does not meet the selectors")
            self._check_link(port, mtu, rate, group.mtu, group.rate)
            if not join_state:
                raise _refuse("JoinState 0")
            self._check_partition(ctx, groups, port, requester, proxy, group.pkey)
            member = group.members.get(bytes(rec[16:32]))
            if member is not None:
                self._check_modify(ctx, req, groups, group, member, requester)
        m = groups.join(group, bytes(rec[16:32]), port, join_state, proxy=proxy, snapshot=ctx.snapshot)
        out = bytearray(rec)
        g = group.record
        out[0:16] = g[0:16]
        out[32:48] = g[32:48]  # Q_Key, MLID, MTU, TClass, P_Key, rate, PacketLifeTime, SL/FlowLabel/HopLimit
        out[48] = (g[48] & 0xF0) | m.join_state
        return bytes(out)

    @staticmethod
    def _check_link(port: int, mtu: int, rate: int, group_mtu: int, group_rate: int) -> None:
        """The port's link must carry the group's MTU and rate (OpenSM's validate_port_caps)."""
        if mtu < group_mtu or int(_RANK_OF_CODE[rate & 0x3F]) < int(_RANK_OF_CODE[group_rate & 0x3F]):
            raise _refuse(f"port {port:#x}'s link (MTU {mtu}, rate {rate}) cannot carry the group's")

    def _check_partition(
        self, ctx: SaContext, groups: McGroups, port: int, requester: int, proxy: bool, pkey: int
    ) -> None:
        if not self._in_partition(ctx, groups, port, pkey):
            raise _refuse(f"port {port:#x} is not in partition {pkey:#06x}")
        if proxy and not self._in_partition(ctx, groups, requester, pkey):
            raise _refuse(f"proxy port {requester:#x} is not in partition {pkey:#06x}")

    def _check_modify(
        self, ctx: SaContext, req: SaRequest, groups: McGroups, group: McGroup, m: McMember, requester: int
    ) -> None:
        """o15-0.2.1: a member joined by itself is changed by itself only; one joined by proxy by itself or a
        member of the group's partition (here: a trusted one)."""
        if requester == m.port_guid:
            return
        if not m.proxy_join:
            raise _refuse(f"member {m.port_guid:#x} joined by itself: port {requester:#x} may not change it")
        if not (req.trusted and self._in_partition(ctx, groups, requester, group.pkey)):
            raise _refuse(f"port {requester:#x} may not change proxy-joined member {m.port_guid:#x}")

    def _new_group(
        self, ctx: SaContext, req: SaRequest, groups: McGroups, rec: bytes, port_mtu: int, port_rate: int
    ) -> bytes:
        """The record of the group a join creates (MLID 0 until the pool gives one)."""
        mask = req.mask
        mgid = bytes(rec[:16])
        scope = rec[48] >> 4 if mask & _SCOPE else 2
        if not any(mgid):
            got = groups.new_mgid(scope, subnet_prefix(ctx.snapshot))
            if got is None:
                raise _refuse("no MGID left to assign", SaStatus.ERR_NO_RESOURCES)
            mgid = got
        else:
            why = mgid_problem(mgid)
            if why is not None:
                raise _refuse(why)
            if int.from_bytes(mgid[2:4], "big") in IPOIB_SIGNATURES:
                bcast = ipoib_broadcast_of(mgid)
                if mgid != bcast:
                    b = groups.get(bcast)
                    if b is None:
                        raise _refuse(f"IPoIB group before its broadcast group {bcast.hex()}")
                    why = other_fields_differ(mask, rec, b.record)
                    if why is not None:
                        raise _refuse(f"{why} differs from the IPoIB broadcast group's")
            if not mask & _SCOPE:
                scope = mgid[1] & 0x0F
        mtu = self._pick(mask, _MTU_SEL | _MTU, rec[38], port_mtu or groups.default_mtu)
        rate_rank = self._pick(
            mask, _RATE_SEL | _RATE, (rec[42] & 0xC0) | int(_RANK_OF_CODE[rec[42] & 0x3F]),
            int(_RANK_OF_CODE[(port_rate or groups.default_rate) & 0x3F]),
        )  # fmt: skip
        plt = self._pick(mask, _PLT_SEL | _PLT, rec[43], SUBNET_TIMEOUT)
        if not 1 <= mtu <= 5 or rate_rank < 1 or plt < 0 or plt > 0x3F:
            raise _refuse("the requested MTU, rate or PacketLifeTime cannot be had")
        sl, flow, _ = _sl_flow_hop(rec)
        hop = rec[47] if mask & _HOP else 0
        return group_record(
            mgid,
            mlid=0,
            qkey=int.from_bytes(rec[32:36], "big"),
            mtu=mtu,
            tclass=rec[39],
            pkey=int.from_bytes(rec[40:42], "big"),
            rate=int(_CODE_OF_RANK[rate_rank]),
            packet_life=plt,
            sl=sl,
            flow_label=flow,
            hop_limit=hop,
            scope=scope,
            join_state=rec[48] & 0x0F,
        )

    @staticmethod
    def _pick(mask: int, bits: int, field: int, have: int) -> int:
        """What the group takes: ``have`` (the creator's, or the default), adjusted by the request's selector
        when the mask gives it with its value (PathRecord's rule); -1 when nothing fits."""
        if mask & bits != bits:
            return have
        return _select1(have, field >> 6, field & 0x3F)

    # -- leave ----------------------------------------------------------------------------

    def _leave(self, ctx: SaContext, req: SaRequest, groups: McGroups, rec: bytes) -> bytes:
        if int.from_bytes(rec[16:24], "big") != subnet_prefix(ctx.snapshot):
            raise _refuse("PortGID prefix is not the subnet's", SaStatus.ERR_REQ_INVALID_GID)
        group = groups.get(bytes(rec[:16]))
        if group is None:
            raise _refuse("no such group")
        member = group.members.get(bytes(rec[16:32]))
        if member is None:
            raise _refuse("the port is not a member")
        bits = rec[48] & 0x0F
        if not bits & member.join_state:
            raise _refuse(f"JoinState {bits:#x} shares no bit with the member's {member.join_state:#x}")
        if bits & ~member.join_state:
            raise _refuse(f"JoinState {bits:#x} names bits the member ({member.join_state:#x}) lacks")
        requester = self._requester(ctx, req)
        if requester != member.port_guid and not req.trusted:
            raise _refuse(f"leave of port {member.port_guid:#x} by port {requester:#x} without the SA key")
        self._check_modify(ctx, req, groups, group, member, requester)
        left = groups.leave(group, member, bits, snapshot=ctx.snapshot)
        out = bytearray(rec)
        out[38] = 0x80 | (out[38] & 0x3F)
        out[42] = 0x80 | (out[42] & 0x3F)
        out[43] = 0x80 | (out[43] & 0x3F)
        out[48] = (group.scope << 4) | left  # the group's scope, as OpenSM answers (the request may carry 0)
        return bytes(out)

    # -- queries ----------------------------------------------------------------------------

    def _query(self, ctx: SaContext, req: SaRequest, groups: McGroups, rec: bytes) -> Rows:
        mask = req.mask
        requester = lid_index(ctx).get(req.src.lid)
        if requester is None:  # OpenSM answers nothing
            return empty(SIZE)
        trusted = req.trusted
        smask = (0xF0 if mask & _SCOPE else 0) | (0x0F if mask & _JOIN else 0)
        want = rec[48] & smask
        mgid = bytes(rec[:16])
        mlid = int.from_bytes(rec[36:38], "big")
        proxy = bool(rec[49] & 0x80)
        out: list[bytes] = []
        for key in sorted(groups.groups):
            g = groups.groups[key]
            if (mask & _MGID and key != mgid) or (mask & _MLID and g.mlid != mlid):
                continue
            if not self._in_partition(ctx, groups, requester, g.pkey):
                continue
            if other_fields_differ(mask, rec, g.record) is not None or not selectors_accept(mask, rec, g):
                continue
            if mask & _PORT_GID:
                m = g.members.get(bytes(rec[16:32]))
                if m is None or (mask & _PROXY and m.proxy_join != proxy):
                    continue
                r = g.member_record(m)
                if r[48] & smask == want:
                    out.append(r)
            elif trusted:
                for m in sorted(g.members.values(), key=lambda m: int.from_bytes(m.port_gid[8:], "little")):
                    r = g.member_record(m)
                    if r[48] & smask == want and not (mask & _PROXY and m.proxy_join != proxy):
                        out.append(r)
            elif g.record[48] & smask == want and not (mask & _PROXY and proxy):
                out.append(g.record)
        if not out:
            return empty(SIZE)
        rows = np.frombuffer(b"".join(out), np.uint8).reshape(len(out), SIZE)
        if not trusted:  # p923: PortGID, JoinState and ProxyJoin only for trusted requests
            rows = rows.copy()
            rows[:, 16:32] = 0
            rows[:, 48] &= 0xF0
            rows[:, 49] &= 0x7F
        return rows


__all__ = [
    "CREATE_MASK",
    "JOIN_MASK",
    "McMemberRecordFamily",
    "ipoib_broadcast_of",
    "mgid_problem",
    "other_fields_differ",
    "selectors_accept",
]
