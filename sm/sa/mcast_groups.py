"""Multicast groups as the SA keeps them: groups, members, MLIDs, and what the rest of ibfm hooks in.

As OpenSM's ``osm_multicast.c`` (3.3.23, with send-only full members):

- A group is its MCMemberRecord parameters (a packed record whose PortGID is
  zero, selectors "exactly"), an MLID and its members by PortGID. A member's
  JoinState is the OR of its joins (o15-0.1.11); a leave clears the bits it
  names and a member with no bit left is removed.
- Full members are the members with FullMember or SendOnlyFullMember set
  (:data:`FULL_STATES`). The first one makes the SA send trap 66 (MGID
  created), the last one leaving trap 67 (MGID deleted) and then every
  remaining member is dropped; the group goes and its MLID is free again
  unless the group is ``permanent`` (OpenSM's well-known groups: the IPoIB
  broadcast groups the SM creates from the partitions). OpenSM 3.3.23 counts
  a SendOnlyFullMember as full when it joins but not when it keeps the bit
  after a partial leave, and so leaks the group's MLID on every join 0x9 /
  leave 0x1 (its open pull request #43); here both sides use the same mask.
- MLIDs come from the multicast manager's :class:`~sm.multicast.mft.MlidPool`:
  the one a join asks for when free, else the lowest free one from 0xC000, at
  most the smallest MulticastFDBCap of the switches (:meth:`McGroups.set_mlid_cap`).

Hooks (attributes of :class:`McGroups`, replaced by whoever knows better):

- ``pkey_membership(ctx, port_guid, pkey15)``: "full", "limited" or None (not
  a member). Default: every port a full member of the default partition only.
- ``port_limits(ctx, port_guid)``: (MTU code, rate code) of the port's link in
  the snapshot, (0, 0) if unknown. Default: PathRecord's per-port arrays.
- ``on_change``: callbacks ``(mlid, group or None)`` after every change of a
  group's members or their JoinStates (None: the group is gone), so the
  sweeper can reprogram the MFTs. Called on the event loop: note and return.
- ``on_notice``: callbacks taking an 80-byte Notice (traps 66 and 67), e.g.
  :meth:`~sm.sa.inform_info.Reporter.report`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from fabric.errors import IbfmError
from fabric.mad.attributes import notice_pack
from fabric.mad.constants import NoticeType, ProducerType
from fabric.mad.sa import MCMEMBER_RECORD
from sm.multicast.mft import MlidPool, MlidPoolError
from sm.sa.guid_info_record import ports_by_guid
from sm.sa.path_record import _CODE_OF_RANK, SUBNET_TIMEOUT, PathRecordFamily
from sm.sa.server import SaContext

log = logging.getLogger(__name__)

MLID_FIRST = 0xC000
DEFAULT_MLID_CAP = 1024
"""MLIDs until :meth:`McGroups.set_mlid_cap` says otherwise (ibsim's MulticastFDBCap)."""

JOIN_FULL = 0x1
JOIN_NON = 0x2
JOIN_SEND_ONLY = 0x4
JOIN_SEND_ONLY_FULL = 0x8
FULL_STATES = JOIN_FULL | JOIN_SEND_ONLY_FULL
"""JoinState bits that make a full member: may create the group, keep it alive (IBA 1.3)."""

TRAP_MGID_CREATED = 66
TRAP_MGID_DELETED = 67
IPOIB_QKEY = 0x0B1B
"""Q_Key of the IPoIB broadcast groups OpenSM creates."""
MTU_2048 = 4
RATE_10_GBPS = 3
SCOPE_LINK_LOCAL = 2
DEFAULT_PKEY = 0xFFFF
SA_MGID_SIGNATURE = 0xA01B
"""Signature of the MGIDs the SA assigns (bytes 2-3)."""
MGID_TRIES = 1000

RECORD_SIZE = MCMEMBER_RECORD.size
_PORT_GID = slice(16, 32)
_MLID = slice(36, 38)
_SCOPE_JOIN = 48
_PROXY = 49

Membership = Literal["full", "limited"]
PkeyMembership = Callable[[SaContext, int, int], Membership | None]
PortLimits = Callable[[SaContext, int], tuple[int, int]]


class McastError(IbfmError):
    """A group the SM asked for cannot be made (no MLID left)."""


@dataclass
class McMember:
    """One port's membership of a group."""

    port_gid: bytes
    """The PortGID it joined with (its GUID may be an alias GUID of the port)."""
    port_guid: int
    """The physical end port (what the MFTs must reach)."""
    join_state: int
    proxy_join: bool = False
    """Joined by another port on its behalf (o15-0.1.2): modifiable by members of the group's partition."""


@dataclass
class McGroup:
    """One multicast group: its MCMemberRecord (PortGID 0, selectors 2), MLID and members by PortGID."""

    mgid: bytes
    mlid: int
    record: bytes
    members: dict[bytes, McMember] = field(default_factory=dict)
    permanent: bool = False
    """Created by the SM (IPoIB broadcast groups): survives its last full member."""
    full_members: int = 0
    """Members with a bit of :data:`FULL_STATES`."""

    @property
    def pkey(self) -> int:
        return int.from_bytes(self.record[40:42], "big")

    @property
    def mtu(self) -> int:
        return self.record[38] & 0x3F

    @property
    def rate(self) -> int:
        return self.record[42] & 0x3F

    @property
    def scope(self) -> int:
        return self.record[_SCOPE_JOIN] >> 4

    def member_record(self, m: McMember) -> bytes:
        """The MCMemberRecord of member ``m``: the group's with its PortGID, JoinState and ProxyJoin."""
        r = bytearray(self.record)
        r[_PORT_GID] = m.port_gid
        r[_SCOPE_JOIN] = (r[_SCOPE_JOIN] & 0xF0) | (m.join_state & 0x0F)
        r[_PROXY] = 0x80 if m.proxy_join else 0
        return bytes(r)


def default_pkey_membership(ctx: SaContext, port_guid: int, pkey15: int) -> Membership | None:
    """Today's partitions: every port a full member of the default partition (0x7FFF), of no other."""
    return "full" if pkey15 == DEFAULT_PKEY & 0x7FFF else None


def default_port_limits(ctx: SaContext, port_guid: int) -> tuple[int, int]:
    """(MTU code, rate code) of the port's link in the snapshot, from PathRecord's per-port arrays."""
    b = PathRecordFamily().base(ctx)
    i = b.ep_of_guid.get(port_guid)
    if i is None:
        return 0, 0
    return int(b.ep_link_mtu[i]), int(_CODE_OF_RANK[int(b.ep_link_rank[i])])


def ipoib_mgid(pkey: int, scope: int = SCOPE_LINK_LOCAL) -> bytes:
    """The IPoIB (IPv4) broadcast MGID of partition ``pkey``: ff1<scope>:401b:<pkey|0x8000>::ffff:ffff."""
    return (
        bytes((0xFF, 0x10 | (scope & 0xF), 0x40, 0x1B))
        + ((pkey | 0x8000) & 0xFFFF).to_bytes(2, "big")
        + bytes(6)
        + b"\xff\xff\xff\xff"
    )


def ports_in_service(snapshot: Any) -> set[int]:
    """GUIDs of the end ports in service: a CA or router port with its link up, a switch's port 0 when the
    switch has a link up or is the SM's node (the ports trap 64 announces and 65 withdraws)."""
    up = snapshot.fabric.up_mask()
    sm_node = int(snapshot.discovery.sm_node)
    return {
        g
        for g, (node, port, _) in ports_by_guid(snapshot).items()
        if (port and up[node, port]) or (not port and (up[node].any() or node == sm_node))
    }


def group_record(
    mgid: bytes,
    *,
    mlid: int,
    qkey: int,
    mtu: int,
    tclass: int,
    pkey: int,
    rate: int,
    packet_life: int,
    sl: int,
    flow_label: int,
    hop_limit: int,
    scope: int,
    join_state: int = 0,
) -> bytes:
    """A group's MCMemberRecord: PortGID 0, the MTU, rate and PacketLifeTime selectors 2 ("exactly")."""
    return MCMEMBER_RECORD.pack(
        {
            "MGID": mgid,
            "Q_Key": qkey,
            "MLID": mlid,
            "MTUSelector": 2,
            "MTU": mtu,
            "TClass": tclass,
            "P_Key": pkey,
            "RateSelector": 2,
            "Rate": rate,
            "PacketLifeTimeSelector": 2,
            "PacketLifeTime": packet_life,
            "SL": sl,
            "FlowLabel": flow_label,
            "HopLimit": hop_limit,
            "Scope": scope,
            "JoinState": join_state,
        }
    )


def mgid_notice(trap: int, snapshot: Any, mgid: bytes) -> bytes:
    """Trap 66/67 about group ``mgid``, issued by the SM (class manager, its LID and port GID), as OpenSM's
    mgrp_send_notice: DataDetails are 6 reserved bytes then the MGID."""
    d = snapshot.discovery
    f = snapshot.fabric
    prefix = int(getattr(snapshot, "subnet_prefix", 0xFE80000000000000))
    sm_gid = prefix.to_bytes(8, "big") + int(f.port_guid[d.sm_node, d.sm_port]).to_bytes(8, "big")
    head = notice_pack(
        trap, int(snapshot.sm_lid), bytes(6) + bytes(mgid[:16]),
        notice_type=NoticeType.SUBNET_MANAGEMENT, producer_type=ProducerType.CLASS_MANAGER,
    )  # fmt: skip
    return head + sm_gid


@dataclass
class McStats:
    created: int = 0
    deleted: int = 0
    joins: int = 0
    leaves: int = 0
    no_mlid: int = 0


class McGroups:
    """The SA's multicast groups by MGID, their MLIDs, and the hooks the SM fills (module doc)."""

    def __init__(
        self,
        *,
        mlid_cap: int = DEFAULT_MLID_CAP,
        first_mlid: int = MLID_FIRST,
        default_mtu: int = MTU_2048,
        default_rate: int = RATE_10_GBPS,
    ) -> None:
        self.groups: dict[bytes, McGroup] = {}
        self.first_mlid = first_mlid
        self.pool = MlidPool(mlid_cap, first=first_mlid)
        self._beyond: set[int] = set()
        """MLIDs of groups made before the cap shrank below them (kept until their group goes)."""
        self.default_mtu = default_mtu
        """MTU of a group whose creator's link is unknown (OpenSM's min_ca_mtu)."""
        self.default_rate = default_rate
        self.pkey_membership: PkeyMembership = default_pkey_membership
        self.port_limits: PortLimits = default_port_limits
        self.on_change: list[Callable[[int, McGroup | None], object]] = []
        self.on_notice: list[Callable[[bytes], object]] = []
        self.stats = McStats()
        self._mgid_count = 0

    # -- reading ---------------------------------------------------------------------

    def get(self, mgid: bytes) -> McGroup | None:
        return self.groups.get(bytes(mgid))

    def by_mlid(self, mlid: int) -> McGroup | None:
        for g in self.groups.values():
            if g.mlid == mlid:
                return g
        return None

    def ports(self, group: McGroup, states: int = 0xF) -> set[int]:
        """Physical port GUIDs of the members with a JoinState bit of ``states``."""
        return {m.port_guid for m in group.members.values() if m.join_state & states}

    def check(self) -> list[str]:
        """Broken invariants (empty when consistent): what tests assert after any sequence of requests."""
        bad: list[str] = []
        mlids: dict[int, bytes] = {}
        for mgid, g in self.groups.items():
            name = mgid.hex()
            if g.mgid != mgid or g.record[:16] != mgid:
                bad.append(f"{name}: MGID key, group and record disagree")
            if int.from_bytes(g.record[_MLID], "big") != g.mlid:
                bad.append(f"{name}: record MLID is not {g.mlid:#x}")
            if g.mlid in mlids:
                bad.append(f"{name}: MLID {g.mlid:#x} also {mlids[g.mlid].hex()}'s")
            mlids[g.mlid] = mgid
            if g.mlid not in self.pool and g.mlid not in self._beyond:
                bad.append(f"{name}: MLID {g.mlid:#x} not taken in the pool")
            full = sum(1 for m in g.members.values() if m.join_state & FULL_STATES)
            if full != g.full_members:
                bad.append(f"{name}: {g.full_members} full members counted, {full} there")
            if not full and not g.permanent:
                bad.append(f"{name}: no full member left and not permanent")
            for k, m in g.members.items():
                if k != m.port_gid or not m.join_state or m.join_state & ~0xF:
                    bad.append(f"{name}: member {k.hex()} with JoinState {m.join_state:#x}")
        if self.pool.in_use + len(self._beyond) != len(mlids):
            bad.append(f"{self.pool.in_use + len(self._beyond)} MLIDs taken for {len(mlids)} groups")
        return bad

    # -- groups -----------------------------------------------------------------------

    def new_mgid(self, scope: int, subnet_prefix: int) -> bytes | None:
        """An unused SA-assigned MGID, as OpenSM's build_new_mgid: ff1<scope>:a01b, the subnet prefix from
        byte 4, overwritten from byte 10 by a 32-bit counter (little-endian, as OpenSM on x86)."""
        head = bytes((0xFF, 0x10 | (scope & 0xF))) + SA_MGID_SIGNATURE.to_bytes(2, "big")
        prefix = subnet_prefix.to_bytes(8, "big")
        for _ in range(MGID_TRIES):
            count = self._mgid_count.to_bytes(4, "little")
            self._mgid_count = (self._mgid_count + 1) & 0xFFFFFFFF
            mgid = head + prefix[:6] + count + b"\0\0"
            if mgid not in self.groups:
                return mgid
        return None

    def create(self, record: bytes, *, want_mlid: int = 0, permanent: bool = False) -> McGroup | None:
        """A new group from ``record`` (its MGID must be new; its MLID field is set here); None: no MLID."""
        rec = bytearray(record[:RECORD_SIZE].ljust(RECORD_SIZE, b"\0"))
        mgid = bytes(rec[:16])
        if mgid in self.groups:
            raise ValueError(f"group {mgid.hex()} exists")
        try:
            mlid = self.pool.allocate(want_mlid or None)
        except MlidPoolError:
            self.stats.no_mlid += 1
            log.warning("no MLID left for multicast group %s (%d in use)", mgid.hex(), self.pool.in_use)
            return None
        rec[_MLID] = mlid.to_bytes(2, "big")
        rec[_PORT_GID] = bytes(16)
        rec[_PROXY:] = bytes(RECORD_SIZE - _PROXY)
        g = McGroup(mgid, mlid, bytes(rec), permanent=permanent)
        self.groups[mgid] = g
        self.stats.created += 1
        (log.info if permanent else log.debug)("multicast group %s created, MLID %#x", mgid.hex(), mlid)
        return g

    def create_permanent(
        self,
        mgid: bytes,
        pkey: int,
        *,
        qkey: int = IPOIB_QKEY,
        mtu: int = MTU_2048,
        rate: int = RATE_10_GBPS,
        sl: int = 0,
        scope: int | None = None,
        tclass: int = 0,
        flow_label: int = 0,
        hop_limit: int | None = None,
        packet_life: int = SUBNET_TIMEOUT,
    ) -> McGroup:
        """The SM's own group ``mgid`` (OpenSM's osm_prtn_add_mcgroup): made with no member if it does not
        exist, and permanent either way. P_Key as given (OpenSM sets the full-membership bit); Scope the MGID's
        unless given; HopLimit 0 for link-local scope, else 0xFF. McastError when no MLID is left."""
        mgid = bytes(mgid)
        if len(mgid) != 16 or mgid[0] != 0xFF:
            raise ValueError(f"{mgid.hex()} is no multicast GID")
        if scope is None:
            scope = mgid[1] & 0x0F
        g = self.groups.get(mgid)
        if g is not None:
            g.permanent = True
            return g
        rec = group_record(
            mgid, mlid=0, qkey=qkey, mtu=mtu, tclass=tclass, pkey=pkey, rate=rate, packet_life=packet_life, sl=sl,
            flow_label=flow_label, hop_limit=(0 if scope == SCOPE_LINK_LOCAL else 0xFF) if hop_limit is None
            else hop_limit, scope=scope, join_state=JOIN_FULL,
        )  # fmt: skip
        made = self.create(rec, permanent=True)
        if made is None:
            raise McastError(f"no MLID left for multicast group {mgid.hex()} (P_Key {pkey:#06x})")
        self._changed(made)
        return made

    def create_ipoib_broadcast(self, pkey: int, **params: Any) -> McGroup:
        """The IPoIB broadcast group of partition ``pkey`` (:func:`ipoib_mgid`), permanent, P_Key with its
        full-membership bit set as OpenSM makes it."""
        scope = params.pop("scope", None)
        scope = SCOPE_LINK_LOCAL if scope is None else int(scope)
        return self.create_permanent(ipoib_mgid(pkey, scope), (pkey | 0x8000) & 0xFFFF, scope=scope, **params)

    def set_mlid_cap(self, cap: int) -> None:
        """The smallest MulticastFDBCap of the switches: new groups get MLIDs below 0xC000 + ``cap`` (groups
        above keep theirs until they go)."""
        if cap == self.pool.cap:
            return
        pool = MlidPool(cap, first=self.first_mlid)
        beyond: set[int] = set()
        for mlid in sorted(g.mlid for g in self.groups.values()):
            if pool.first <= mlid <= pool.last:
                pool.allocate(mlid)
            else:
                beyond.add(mlid)
        self.pool, self._beyond = pool, beyond

    # -- members ----------------------------------------------------------------------

    def join(
        self, group: McGroup, port_gid: bytes, port_guid: int, join_state: int, *, proxy: bool, snapshot: Any
    ) -> McMember:
        """Add ``join_state`` to the port's membership (a new member if none); trap 66 for the first full
        member; the hooks told."""
        join_state &= 0xF
        key = bytes(port_gid)
        m = group.members.get(key)
        before = 0 if m is None else m.join_state
        if m is None:
            m = group.members[key] = McMember(key, port_guid, join_state, proxy_join=proxy)
        else:
            m.join_state |= join_state
        self.stats.joins += 1
        if join_state & FULL_STATES and not before & FULL_STATES:
            group.full_members += 1
            if group.full_members == 1:
                self._notice(TRAP_MGID_CREATED, group, snapshot)
        if m.join_state != before:
            self._changed(group)
        return m

    def leave(self, group: McGroup, member: McMember, join_state: int, *, snapshot: Any) -> int:
        """Clear ``join_state`` from ``member``; remove it when no bit is left; when the last full member goes,
        trap 67, every member dropped and (unless permanent) the group deleted with its MLID freed. Returns
        the member's JoinState left (0: removed)."""
        before = member.join_state
        after = before & ~join_state & 0xF
        self.stats.leaves += 1
        if after:
            member.join_state = after
        else:
            group.members.pop(member.port_gid, None)
        if before & FULL_STATES and not after & FULL_STATES:
            group.full_members -= 1
            if group.full_members <= 0:
                group.full_members = 0
                self._notice(TRAP_MGID_DELETED, group, snapshot)
                self._cleanup(group)
                return 0
        if after != before:
            self._changed(group)
        return after

    def drop_port(self, port_guid: int, *, snapshot: Any = None) -> int:
        """The port left the subnet: every membership of it ends (OpenSM's osm_mgrp_delete_port); how many."""
        n = 0
        for g in list(self.groups.values()):
            for m in [m for m in g.members.values() if m.port_guid == port_guid]:
                if g.members.get(m.port_gid) is m:
                    self.leave(g, m, 0xF, snapshot=snapshot)
                    n += 1
        return n

    def prune(self, snapshot: Any, present: Iterable[int] | None = None) -> int:
        """Drop the memberships of ports out of service (``present``: the end port GUIDs in service; default
        those of ``snapshot``, the ports trap 65 is not about). Call after each sweep; how many went."""
        here = ports_in_service(snapshot) if present is None else set(present)
        gone = {m.port_guid for g in self.groups.values() for m in g.members.values()} - here
        return sum(self.drop_port(guid, snapshot=snapshot) for guid in sorted(gone))

    # -- internals ----------------------------------------------------------------------

    def release_permanent(self, mgid: bytes) -> bool:
        """The SM keeps group ``mgid`` no longer (the partition that made it is gone): it goes now when no full
        member holds it, else with its last full member. True when such a permanent group was there."""
        group = self.groups.get(bytes(mgid))
        if group is None or not group.permanent:
            return False
        group.permanent = False
        if not group.full_members:
            self._cleanup(group)
        return True

    def _cleanup(self, group: McGroup) -> None:
        """No full member left: drop the rest; delete the group unless permanent (osm_mgrp_cleanup)."""
        group.members.clear()
        if group.permanent:
            self._changed(group)
            return
        self.groups.pop(group.mgid, None)
        if group.mlid in self.pool:
            self.pool.free(group.mlid)
        self._beyond.discard(group.mlid)
        self.stats.deleted += 1
        log.debug("multicast group %s deleted, MLID %#x free", group.mgid.hex(), group.mlid)
        self._changed(group, gone=True)

    def _changed(self, group: McGroup, *, gone: bool = False) -> None:
        for cb in list(self.on_change):
            try:
                cb(group.mlid, None if gone else group)
            except Exception:  # a sink's bug must not fail the SA's answer
                log.exception("multicast change hook %r failed on MLID %#x", cb, group.mlid)

    def _notice(self, trap: int, group: McGroup, snapshot: Any) -> None:
        if snapshot is None or not self.on_notice:
            return
        try:
            notice = mgid_notice(trap, snapshot, group.mgid)
        except Exception:  # a snapshot without the SM's port (tests): no Notice
            log.debug("no trap %d for %s: the snapshot names no SM port", trap, group.mgid.hex())
            return
        for cb in list(self.on_notice):
            try:
                cb(notice)
            except Exception:
                log.exception("multicast notice sink %r failed on trap %d", cb, trap)


__all__ = [
    "DEFAULT_MLID_CAP",
    "FULL_STATES",
    "IPOIB_QKEY",
    "JOIN_FULL",
    "JOIN_NON",
    "JOIN_SEND_ONLY",
    "JOIN_SEND_ONLY_FULL",
    "MLID_FIRST",
    "TRAP_MGID_CREATED",
    "TRAP_MGID_DELETED",
    "McGroup",
    "McGroups",
    "McMember",
    "McastError",
    "Membership",
    "PkeyMembership",
    "PortLimits",
    "default_pkey_membership",
    "default_port_limits",
    "group_record",
    "ipoib_mgid",
    "mgid_notice",
    "ports_in_service",
]
