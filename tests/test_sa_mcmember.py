"""MCMemberRecord joins, leaves and queries through the SA server over the emulated fabric (OpenSM 3.3.23's rules).

The host speaks from the rig's last CA; other hosts from other CAs. Groups, MLIDs and hooks are the
store's :class:`~sm.sa.mcast_groups.McGroups` (``r.server.store.mcast``).
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from fabric.mad import CLASS_PORT_INFO
from fabric.mad.sa import (
    MCMEMBER_RECORD,
    NOTICE,
    SaAttr,
    SaCap,
    SaCap2,
    SaMethod,
    SaStatus,
    component_mask,
    parse_sa,
    sa_mad,
)
from sm.sa.client import SaAnswer, sa_query
from sm.sa.mcast_groups import McGroup, McGroups, ipoib_mgid
from sm.sa.mcmember_record import CREATE_MASK, JOIN_MASK
from sm.sa.server import SaContext
from sm.sa.store import SaStore
from sm.transport.emulated import EmulatedTransport
from tests.sa_rig import SaRig, sa_rig
from tests.test_sa_stateful import inform, listener, settle, traps

GET, SET, TABLE, DELETE = SaMethod.GET, SaMethod.SET, SaMethod.GET_TABLE, SaMethod.DELETE
A = int(SaAttr.MCMEMBER_RECORD)
PREFIX = 0xFE80000000000000
MGID1 = bytes.fromhex("ff150000000000000000000000000001")
MGID2 = bytes.fromhex("ff150000000000000000000000000002")
QKEY = 0x1234
INVALID, INSUFFICIENT, INVALID_GID = (
    SaStatus.ERR_REQ_INVALID,
    SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS,
    SaStatus.ERR_REQ_INVALID_GID,
)
CREATABLE = [j for j in range(1, 16) if j & 0x9]
"""JoinStates that may create a group (FullMember or SendOnlyFullMember)."""


def gid(guid: int, prefix: int = PREFIX) -> bytes:
    return prefix.to_bytes(8, "big") + guid.to_bytes(8, "big")


def guid_of(r: SaRig, t: EmulatedTransport) -> int:
    ep = t.endpoint
    return int(r.emu.fabric.port_guid[ep.node, ep.port])


def mcr(mgid: bytes, port_gid: bytes, join_state: int, **fields: object) -> bytes:
    values: dict[str, object] = {"MGID": mgid, "PortGID": port_gid, "JoinState": join_state, "Q_Key": QKEY}
    values["P_Key"] = 0xFFFF
    values.update(fields)
    return MCMEMBER_RECORD.pack(values)


def one(ans: SaAnswer) -> dict[str, Any]:
    assert ans.status == 0 and len(ans.records) == 1, ans
    return dict(MCMEMBER_RECORD.unpack(ans.records[0][:52]))


def recs(ans: SaAnswer) -> list[dict[str, Any]]:
    assert ans.status == 0, ans
    return [dict(MCMEMBER_RECORD.unpack(x[:52])) for x in ans.records]


def mc(r: SaRig) -> McGroups:
    store: SaStore = r.server.store
    return store.mcast


async def ask(r: SaRig, t: EmulatedTransport, method: int, mask: int, data: bytes, *, key: int = 0) -> SaAnswer:
    return await sa_query(t, r.sa_lid, method, A, component_mask=mask, data=data, sm_key=key)


@asynccontextmanager
async def host_at(r: SaRig, node: int) -> AsyncIterator[EmulatedTransport]:
    t = EmulatedTransport(r.emu, endpoint=r.emu.attach(node, 1), timeout=0.2, retries=2)
    try:
        yield t
    finally:
        await t.close()


@asynccontextmanager
async def two_hosts() -> AsyncIterator[tuple[SaRig, EmulatedTransport, EmulatedTransport]]:
    """The rig, its host (last CA) and a second host (the CA before it)."""
    async with sa_rig() as r, host_at(r, int(r.emu.fabric.cas[-2])) as other:
        yield r, r.host, other


# -- create, join, query -------------------------------------------------------------------------------


async def test_create_join_and_query() -> None:
    async with two_hosts() as (r, h1, h2):
        g1, g2 = gid(guid_of(r, h1)), gid(guid_of(r, h2))
        groups = mc(r)
        mtu, rate = groups.port_limits(SaContext(r.manager.snapshot, r.server.store, 0.0, {}), guid_of(r, h1))
        assert (mtu, rate) == (5, 21)  # the rig's links: 4096 bytes, NDR 4x (400 Gb/s)
        # Create: the answer is the group's record with the member's JoinState, selectors "exactly".
        ans = await ask(r, h1, SET, CREATE_MASK, mcr(MGID1, g1, 1, SL=3, TClass=7, FlowLabel=0x12345))
        got = one(ans)
        assert ans.method == SaMethod.GET_RESP
        assert got["MGID"] == MGID1 and got["PortGID"] == g1 and got["MLID"] == 0xC000 and got["JoinState"] == 1
        assert (got["MTUSelector"], got["MTU"], got["RateSelector"], got["Rate"]) == (2, 5, 2, 21)
        assert (got["PacketLifeTimeSelector"], got["PacketLifeTime"]) == (2, 18)
        assert (got["Q_Key"], got["SL"], got["TClass"], got["FlowLabel"], got["Scope"]) == (QKEY, 3, 7, 0x12345, 5)
        # A second port joins with the join mask only (non-member); its answer carries the group's values.
        got = one(await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 2, Q_Key=0)))
        assert (got["Q_Key"], got["MLID"], got["SL"], got["JoinState"], got["PortGID"]) == (QKEY, 0xC000, 3, 2, g2)
        # Joining again ORs the JoinState.
        assert one(await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 4)))["JoinState"] == 6
        g = groups.get(MGID1)
        assert g is not None and {m.port_guid: m.join_state for m in g.members.values()} == {
            guid_of(r, h1): 1,
            guid_of(r, h2): 6,
        }
        assert g.full_members == 1 and groups.check() == []
        # A second group gets the next MLID; an all-zero MGID has the SA assign one (OpenSM's pattern).
        assert one(await ask(r, h1, SET, CREATE_MASK, mcr(MGID2, g1, 8)))["MLID"] == 0xC001
        got = one(await ask(r, h1, SET, CREATE_MASK, mcr(bytes(16), g1, 1)))
        mgid3 = bytes(got["MGID"])
        assert mgid3[:4] == bytes.fromhex("ff12a01b") and mgid3[4:10] == PREFIX.to_bytes(8, "big")[:6]
        assert mgid3[10:14] == (0).to_bytes(4, "little") and got["MLID"] == 0xC002
        got = one(await ask(r, h1, SET, CREATE_MASK | component_mask(A, ["Scope"]), mcr(bytes(16), g1, 1, Scope=5)))
        assert bytes(got["MGID"])[:2] == b"\xff\x15" and bytes(got["MGID"])[10:14] == (1).to_bytes(4, "little")
        # Untrusted GetTable: one record per group (MGID order), PortGID, JoinState and ProxyJoin zero (p923).
        table = recs(await ask(r, h2, TABLE, 0, b""))
        assert [t["MGID"] for t in table] == sorted(bytes(x) for x in groups.groups)
        assert all(t["PortGID"] == bytes(16) and t["JoinState"] == 0 and t["ProxyJoin"] == 0 for t in table)
        # Trusted GetTable with only MGID: that group's members.
        mask = component_mask(A, ["MGID"])
        table = recs(await ask(r, h2, TABLE, mask, mcr(MGID1, bytes(16), 0), key=1))
        assert sorted((bytes(t["PortGID"]), t["JoinState"]) for t in table) == sorted([(g1, 1), (g2, 6)])
        # Untrusted, same query: the group once, no member details.
        table = recs(await ask(r, h2, TABLE, mask, mcr(MGID1, bytes(16), 0)))
        assert len(table) == 1 and table[0]["PortGID"] == bytes(16) and table[0]["MLID"] == 0xC000
        # Get by MGID and PortGID (trusted): that member; by MLID; JoinState selects members.
        both = component_mask(A, ["MGID", "PortGID"])
        assert one(await ask(r, h1, GET, both, mcr(MGID1, g2, 0), key=1))["JoinState"] == 6
        assert one(await ask(r, h1, GET, both, mcr(MGID1, g2, 0)))["JoinState"] == 0  # hidden
        assert (await ask(r, h1, GET, both, mcr(MGID2, g2, 0), key=1)).status == SaStatus.ERR_NO_RECORDS
        by_mlid = component_mask(A, ["MLID"])
        assert one(await ask(r, h1, GET, by_mlid, mcr(bytes(16), bytes(16), 0, MLID=0xC001)))["MGID"] == MGID2
        js = component_mask(A, ["MGID", "JoinState"])
        table = recs(await ask(r, h1, TABLE, js, mcr(MGID1, bytes(16), 6), key=1))
        assert [t["PortGID"] for t in table] == [g2]
        # A Get matching more than one record.
        assert (await ask(r, h1, GET, mask, mcr(MGID1, bytes(16), 0), key=1)).status == SaStatus.ERR_TOO_MANY_RECORDS
        # Queries on group parameters: Q_Key, and the MTU selector (greater than 4: MTU 5 groups).
        qk = component_mask(A, ["Q_Key"])
        assert len(recs(await ask(r, h1, TABLE, qk, mcr(bytes(16), bytes(16), 0, Q_Key=QKEY)))) == 4
        assert recs(await ask(r, h1, TABLE, qk, mcr(bytes(16), bytes(16), 0, Q_Key=1))) == []
        mtu_gt = component_mask(A, ["MTUSelector", "MTU"])
        assert len(recs(await ask(r, h1, TABLE, mtu_gt, mcr(bytes(16), bytes(16), 0, MTUSelector=0, MTU=4)))) == 4
        assert recs(await ask(r, h1, TABLE, mtu_gt, mcr(bytes(16), bytes(16), 0, MTUSelector=0, MTU=5))) == []
        assert groups.check() == []


async def test_class_port_info_advertises_multicast() -> None:
    async with sa_rig() as r:
        raw = await r.host.send(sa_mad(GET, int(SaAttr.CLASS_PORT_INFO), tid=0), r.sa_lid)
        ans = parse_sa(raw)
        assert ans.status == 0
        cpi: dict[str, Any] = dict(CLASS_PORT_INFO.unpack(ans.data[: CLASS_PORT_INFO.size]))
        assert int(cpi["CapabilityMask"]) & SaCap.IS_UD_MULTICAST_SUPPORTED
        assert int(cpi["CapabilityMask2"]) & SaCap2.IS_SEND_ONLY_FULL_MEMBER_SUPPORTED
        assert not int(cpi["CapabilityMask"]) & SaCap.IS_MULTIPATH_SUPPORTED


async def test_create_parameters_from_selectors() -> None:
    async with sa_rig() as r:
        g1 = gid(guid_of(r, r.host))
        sel = CREATE_MASK | component_mask(A, ["MTUSelector", "MTU", "RateSelector", "Rate"])
        # Less than 4096: 2048; exactly 10 Gb/s.
        got = one(await r.ask(SET, A, component_mask=sel, data=mcr(MGID1, g1, 1, MTUSelector=1, MTU=5,
                                                                   RateSelector=2, Rate=3)))  # fmt: skip
        assert (got["MTU"], got["Rate"], got["MTUSelector"]) == (4, 3, 2)
        # Greater than the port's 4096 or exactly a rate above its 400 Gb/s: not realizable.
        bad = mcr(MGID2, g1, 1, MTUSelector=0, MTU=5, RateSelector=3, Rate=3)
        assert (await r.ask(SET, A, component_mask=sel, data=bad)).status == INVALID
        bad = mcr(MGID2, g1, 1, MTUSelector=3, MTU=1, RateSelector=2, Rate=22)
        assert (await r.ask(SET, A, component_mask=sel, data=bad)).status == INVALID
        # Less than 256: nothing.
        bad = mcr(MGID2, g1, 1, MTUSelector=1, MTU=1, RateSelector=3, Rate=3)
        assert (await r.ask(SET, A, component_mask=sel, data=bad)).status == INVALID
        # Invalid codes with their selectors: ERR_REQ_INVALID for every method.
        for method in (SET, DELETE, GET, TABLE):
            bad = mcr(MGID2, g1, 1, MTUSelector=2, MTU=7, RateSelector=2, Rate=3)
            assert (await r.ask(method, A, component_mask=sel, data=bad)).status == INVALID
            bad = mcr(MGID2, g1, 1, MTUSelector=2, MTU=4, RateSelector=2, Rate=1)
            assert (await r.ask(method, A, component_mask=sel, data=bad)).status == INVALID
        # A requested MLID in the mask is taken when free.
        mlid = CREATE_MASK | component_mask(A, ["MLID"])
        assert one(await r.ask(SET, A, component_mask=mlid, data=mcr(MGID2, g1, 1, MLID=0xC010)))["MLID"] == 0xC010
        assert mc(r).check() == []


async def test_join_with_mismatching_parameters_is_refused() -> None:
    async with two_hosts() as (r, h1, h2):
        g1, g2 = gid(guid_of(r, h1)), gid(guid_of(r, h2))
        assert (await ask(r, h1, SET, CREATE_MASK, mcr(MGID1, g1, 1, SL=2, FlowLabel=5))).status == 0
        cases: list[tuple[list[str], dict[str, object]]] = [
            (["Q_Key"], {"Q_Key": QKEY + 1}),
            (["P_Key"], {"P_Key": 0xFFFE}),
            (["P_Key"], {"P_Key": 0x7FFE}),
            (["TClass"], {"TClass": 1}),
            (["SL"], {"SL": 1}),
            (["FlowLabel"], {"FlowLabel": 6}),
            (["HopLimit"], {"HopLimit": 1}),
            (["MTUSelector", "MTU"], {"MTUSelector": 2, "MTU": 4}),
            (["MTUSelector", "MTU"], {"MTUSelector": 0, "MTU": 5}),
            (["RateSelector", "Rate"], {"RateSelector": 1, "Rate": 21}),
        ]
        for names, fields in cases:
            mask = JOIN_MASK | component_mask(A, names)
            assert (await ask(r, h2, SET, mask, mcr(MGID1, g2, 1, **fields))).status == INVALID, names
        # The same values as the group's are fine (P_Key: a limited one matches the full group's base).
        ok = JOIN_MASK | component_mask(A, ["Q_Key", "P_Key", "SL", "FlowLabel", "MTUSelector", "MTU"])
        got = one(await ask(r, h2, SET, ok, mcr(MGID1, g2, 1, P_Key=0x7FFF, SL=2, FlowLabel=5, MTUSelector=2, MTU=5)))
        assert got["JoinState"] == 1
        # JoinState 0 to an existing group.
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 0))).status == INVALID
        # A port whose link cannot carry the group's MTU or rate.
        groups = mc(r)
        slow = guid_of(r, h2)
        real = groups.port_limits
        groups.port_limits = lambda ctx, guid: (4, 21) if guid == slow else real(ctx, guid)
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 2))).status == INVALID
        groups.port_limits = lambda ctx, guid: (5, 16) if guid == slow else real(ctx, guid)
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 2))).status == INVALID
        groups.port_limits = real
        # A group in a partition the port is not in; a zero P_Key base.
        assert (await ask(r, h1, SET, CREATE_MASK, mcr(MGID2, g1, 1, P_Key=0x8001))).status == INVALID
        assert (await ask(r, h1, SET, CREATE_MASK, mcr(MGID2, g1, 1, P_Key=0x8000))).status == INVALID
        groups.pkey_membership = lambda ctx, guid, pkey: (
            "full" if pkey == 0x7FFF or (pkey == 1 and guid != slow) else None
        )
        assert one(await ask(r, h1, SET, CREATE_MASK, mcr(MGID2, g1, 1, P_Key=0x8001)))["P_Key"] == 0x8001
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID2, g2, 1))).status == INVALID
        # Nor does a port outside the group's partition see it.
        mgids = [t["MGID"] for t in recs(await ask(r, h2, TABLE, 0, b""))]
        assert mgids == [MGID1]
        assert len(groups.groups) == 2 and groups.check() == []


async def test_create_needs_a_full_join_and_valid_mgid() -> None:
    async with sa_rig() as r:
        g1 = gid(guid_of(r, r.host))
        for js in (0, 2, 4, 6):  # only FullMember or SendOnlyFullMember creates (o15.0.1.9, IBA 1.3)
            assert (await r.ask(SET, A, component_mask=CREATE_MASK, data=mcr(MGID1, g1, js))).status == INVALID
        for bad in ("fe150000000000000000000000000001", "ff350000000000000000000000000001",
                    "ff12a01b000000000000000000000001"):  # fmt: skip
            ans = await r.ask(SET, A, component_mask=CREATE_MASK, data=mcr(bytes.fromhex(bad), g1, 1))
            assert ans.status == INVALID, bad
        # An IPoIB group other than the broadcast one needs its broadcast group, and must match it.
        v6 = bytes.fromhex("ff12601bffff0000000000000000000a")
        assert (await r.ask(SET, A, component_mask=CREATE_MASK, data=mcr(v6, g1, 1, Q_Key=0x0B1B))).status == INVALID
        mc(r).create_ipoib_broadcast(0xFFFF)
        assert (await r.ask(SET, A, component_mask=CREATE_MASK, data=mcr(v6, g1, 1, Q_Key=0x0B1B))).status == 0
        v6b = v6[:15] + b"\x0b"
        assert (await r.ask(SET, A, component_mask=CREATE_MASK, data=mcr(v6b, g1, 1, Q_Key=1))).status == INVALID
        # A send-only full member creates a group.
        assert one(await r.ask(SET, A, component_mask=CREATE_MASK, data=mcr(MGID1, g1, 8)))["JoinState"] == 8


async def test_insufficient_components_and_bad_gids() -> None:
    async with sa_rig() as r:
        g1 = gid(guid_of(r, r.host))
        data = mcr(MGID1, g1, 1)
        for drop in ("MGID", "PortGID", "JoinState"):
            for method in (SET, DELETE):
                mask = JOIN_MASK & ~component_mask(A, [drop])
                assert (await r.ask(method, A, component_mask=mask, data=data)).status == INSUFFICIENT
        for drop in ("Q_Key", "TClass", "P_Key", "FlowLabel", "SL"):  # creating needs these too
            mask = CREATE_MASK & ~component_mask(A, [drop])
            assert (await r.ask(SET, A, component_mask=mask, data=data)).status == INSUFFICIENT, drop
        # A PortGID with another subnet prefix: ERR_REQ_INVALID_GID; a GUID of no port: ERR_REQ_INVALID.
        other = mcr(MGID1, gid(guid_of(r, r.host), 0xFEC0000000000000), 1)
        assert (await r.ask(SET, A, component_mask=CREATE_MASK, data=other)).status == INVALID_GID
        assert (await r.ask(DELETE, A, component_mask=JOIN_MASK, data=other)).status == INVALID_GID
        nobody = mcr(MGID1, gid(0xDEADBEEF), 1)
        assert (await r.ask(SET, A, component_mask=CREATE_MASK, data=nobody)).status == INVALID
        # Leaving a group that does not exist.
        assert (await r.ask(DELETE, A, component_mask=JOIN_MASK, data=data)).status == INVALID
        assert mc(r).groups == {}


# -- proxies ---------------------------------------------------------------------------------------------


async def test_proxy_join_needs_the_sa_key() -> None:
    async with two_hosts() as (r, h1, h2):
        g1, g2 = gid(guid_of(r, h1)), gid(guid_of(r, h2))
        # h1 joins h2: refused without the SA's SM_Key, taken with it (ProxyJoin set).
        assert (await ask(r, h1, SET, CREATE_MASK, mcr(MGID1, g2, 1))).status == INVALID
        assert mc(r).groups == {}
        assert one(await ask(r, h1, SET, CREATE_MASK, mcr(MGID1, g2, 3), key=1))["JoinState"] == 3
        both = component_mask(A, ["MGID", "PortGID"])
        assert one(await ask(r, h1, GET, both, mcr(MGID1, g2, 0), key=1))["ProxyJoin"] == 1
        # h1 joins itself; h2 may not change h1's own membership even with the key (o15-0.2.1).
        assert (await ask(r, h1, SET, JOIN_MASK, mcr(MGID1, g1, 3))).status == 0
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g1, 4), key=1)).status == INVALID
        assert (await ask(r, h2, DELETE, JOIN_MASK, mcr(MGID1, g1, 2), key=1)).status == INVALID
        assert (await ask(r, h2, DELETE, JOIN_MASK, mcr(MGID1, g1, 2))).status == INVALID
        # The proxy-joined member: changed by a trusted member of the partition, or by the port itself.
        assert (await ask(r, h1, DELETE, JOIN_MASK, mcr(MGID1, g2, 2))).status == INVALID
        assert one(await ask(r, h1, DELETE, JOIN_MASK, mcr(MGID1, g2, 2), key=1))["JoinState"] == 1
        assert one(await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 4)))["JoinState"] == 5
        assert one(await ask(r, h2, DELETE, JOIN_MASK, mcr(MGID1, g2, 5)))["JoinState"] == 0
        g = mc(r).get(MGID1)
        assert g is not None and [m.port_guid for m in g.members.values()] == [guid_of(r, h1)]
        # A proxy both of whose ports are not in the group's partition.
        groups = mc(r)
        me = guid_of(r, h1)
        groups.pkey_membership = lambda ctx, guid, pkey: "full" if pkey == 0x7FFF or guid != me else None
        ans = await ask(r, h1, SET, CREATE_MASK, mcr(MGID2, g2, 1, P_Key=0x8002), key=1)
        assert ans.status == INVALID and groups.check() == []


# -- leaves, deletion, MLIDs ---------------------------------------------------------------------------------


async def test_leave_each_join_state_combination() -> None:
    """Every JoinState a creator can have, every partial leave of it, with a second member of every JoinState."""
    async with two_hosts() as (r, h1, h2):
        g1, g2 = gid(guid_of(r, h1)), gid(guid_of(r, h2))
        groups = mc(r)
        for j1, j2 in itertools.product(CREATABLE, range(1, 16)):
            for part in (p for p in range(1, 16) if p & j1 == p):
                assert one(await ask(r, h1, SET, CREATE_MASK, mcr(MGID1, g1, j1)))["MLID"] == 0xC000
                assert one(await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, j2)))["JoinState"] == j2
                # Bits the member lacks, or none of its bits: refused, nothing changes.
                if j1 != 0xF:
                    bad = (~j1 & 0xF) | part
                    assert (await ask(r, h1, DELETE, JOIN_MASK, mcr(MGID1, g1, bad))).status == INVALID
                g = groups.get(MGID1)
                assert g is not None
                left = one(await ask(r, h1, DELETE, JOIN_MASK, mcr(MGID1, g1, part)))["JoinState"]
                rest1 = j1 & ~part
                creator_full = bool(rest1 & 0x9)
                full_left = creator_full or bool(j2 & 0x9)
                if not full_left:  # the last full member left: trap 67, every member gone, the MLID free
                    assert left == 0 and groups.get(MGID1) is None and 0xC000 not in groups.pool
                    assert (await ask(r, h2, DELETE, JOIN_MASK, mcr(MGID1, g2, j2))).status == INVALID
                    continue
                assert left == rest1 and {m.join_state for m in g.members.values()} >= {j2}
                if rest1:
                    assert one(await ask(r, h1, DELETE, JOIN_MASK, mcr(MGID1, g1, rest1)))["JoinState"] == 0
                if groups.get(MGID1) is not None:
                    assert one(await ask(r, h2, DELETE, JOIN_MASK, mcr(MGID1, g2, j2)))["JoinState"] == 0
                assert groups.get(MGID1) is None and groups.pool.in_use == 0, (j1, j2, part)
                assert groups.check() == []
        assert groups.groups == {} and groups.pool.in_use == 0
        assert groups.stats.created == groups.stats.deleted


async def test_deleted_group_frees_its_mlid_for_the_next() -> None:
    async with two_hosts() as (r, h1, h2):
        g1, g2 = gid(guid_of(r, h1)), gid(guid_of(r, h2))
        groups = mc(r)
        mgids = [bytes.fromhex(f"ff1500000000000000000000000000{i:02x}") for i in range(4)]
        mlids = [one(await ask(r, h1, SET, CREATE_MASK, mcr(m, g1, 1)))["MLID"] for m in mgids]
        assert mlids == [0xC000, 0xC001, 0xC002, 0xC003]
        # A non-member of the second group is dropped with it when the last full member leaves.
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(mgids[1], g2, 2))).status == 0
        assert one(await ask(r, h1, DELETE, JOIN_MASK, mcr(mgids[1], g1, 1)))["JoinState"] == 0
        assert groups.get(mgids[1]) is None
        assert (await ask(r, h2, DELETE, JOIN_MASK, mcr(mgids[1], g2, 2))).status == INVALID
        # The lowest free MLID goes to the next group.
        mgid5 = bytes.fromhex("ff150000000000000000000000000010")
        assert one(await ask(r, h1, SET, CREATE_MASK, mcr(mgid5, g1, 1)))["MLID"] == 0xC001
        # The pool ends at the smallest MulticastFDBCap: 5 MLIDs, 5 groups, then ERR_NO_RESOURCES.
        groups.set_mlid_cap(5)
        assert one(await ask(r, h1, SET, CREATE_MASK, mcr(MGID1, g1, 1)))["MLID"] == 0xC004
        ans = await ask(r, h1, SET, CREATE_MASK, mcr(bytes.fromhex("ff15" + "00" * 13 + "77"), g1, 1))
        assert ans.status == SaStatus.ERR_NO_RESOURCES
        # Shrinking below MLIDs in use keeps them; they are not handed out again.
        groups.set_mlid_cap(2)
        assert groups.check() == []
        assert one(await ask(r, h1, DELETE, JOIN_MASK, mcr(MGID1, g1, 1)))["JoinState"] == 0
        assert 0xC004 not in groups.pool and groups.check() == []


async def test_permanent_group_survives_its_members() -> None:
    async with sa_rig() as r:
        g1 = gid(guid_of(r, r.host))
        groups = mc(r)
        changes: list[tuple[int, McGroup | None]] = []
        groups.on_change.append(lambda mlid, g: changes.append((mlid, g)))
        bcast = groups.create_ipoib_broadcast(0x7FFF)
        assert bcast.mgid == bytes.fromhex("ff12401bffff00000000000000000000")[:10] + bytes(2) + b"\xff" * 4
        assert bcast.mgid == ipoib_mgid(0xFFFF) and bcast.mlid == 0xC000 and bcast.permanent
        assert groups.create_ipoib_broadcast(0xFFFF) is bcast  # already there
        # Untrusted GetTable: the group, as OpenSM's on ibsim (MLID 0xc000, Q_Key 0x0b1b, 2048 bytes, 10 Gb/s).
        (t,) = recs(await r.ask(TABLE, A))
        assert (t["MGID"], t["MLID"], t["Q_Key"], t["P_Key"], t["MTU"], t["Rate"], t["Scope"], t["PortGID"]) == (
            bcast.mgid, 0xC000, 0x0B1B, 0xFFFF, 4, 3, 2, bytes(16),
        )  # fmt: skip
        assert (t["PacketLifeTime"], t["HopLimit"], t["SL"]) == (18, 0, 0)
        # IPoIB joins with the kernel's mask (no create components needed: the group exists).
        ipoib = JOIN_MASK | component_mask(A, ["Q_Key", "P_Key", "SL", "TClass", "FlowLabel", "MTUSelector", "MTU"])
        data = mcr(bcast.mgid, g1, 1, Q_Key=0x0B1B, MTUSelector=2, MTU=4)
        assert one(await r.ask(SET, A, component_mask=ipoib, data=data))["MLID"] == 0xC000
        assert one(await r.ask(DELETE, A, component_mask=JOIN_MASK, data=data))["JoinState"] == 0
        assert groups.get(bcast.mgid) is bcast and bcast.members == {} and 0xC000 in groups.pool
        assert [m for m, _ in changes] == [0xC000] * 3 and all(g is bcast for _, g in changes)
        # A non-member joins and stays; a full member comes and goes: the non-member goes with it (OpenSM's
        # osm_mgrp_cleanup), the group stays.
        assert (await r.ask(SET, A, component_mask=JOIN_MASK, data=mcr(bcast.mgid, g1, 2))).status == 0
        assert one(await r.ask(SET, A, component_mask=JOIN_MASK, data=mcr(bcast.mgid, g1, 1)))["JoinState"] == 3
        assert one(await r.ask(DELETE, A, component_mask=JOIN_MASK, data=mcr(bcast.mgid, g1, 1)))["JoinState"] == 0
        assert bcast.members == {} and groups.get(bcast.mgid) is bcast
        # The next host group gets the next MLID.
        assert one(await r.ask(SET, A, component_mask=CREATE_MASK, data=mcr(MGID1, g1, 1)))["MLID"] == 0xC001
        assert groups.check() == []


async def test_prune_drops_the_ports_that_left() -> None:
    async with two_hosts() as (r, h1, h2):
        g1, g2 = gid(guid_of(r, h1)), gid(guid_of(r, h2))
        groups = mc(r)
        assert (await ask(r, h1, SET, CREATE_MASK, mcr(MGID1, g1, 1))).status == 0
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 1))).status == 0
        assert (await ask(r, h2, SET, CREATE_MASK, mcr(MGID2, g2, 1))).status == 0
        ep = h2.endpoint
        r.emu.link_down(ep.node, ep.port)
        await r.manager.sweep()  # the heavy sweep that follows the link's loss prunes the groups itself
        assert groups.prune(r.manager.snapshot) == 0
        g = groups.get(MGID1)
        assert g is not None and list(g.members) == [g1] and groups.get(MGID2) is None
        # MGID1's MLID, and the default partition's IPoIB broadcast group the SM made at its sweep
        assert groups.pool.in_use == 2 and groups.check() == []


# -- the hooks: changes and traps ---------------------------------------------------------------------------


async def test_traps_66_and_67_reach_a_subscriber() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        rep = r.services.reporter
        rep.timeout, rep.retries = 0.2, 1
        groups = mc(r)
        assert rep.report in groups.on_notice  # the SM's wiring (services.serve_port)
        g1 = gid(guid_of(r, r.host))
        async with listener(r, int(f.cas[-2])) as (t, got):
            assert (await sa_query(t, r.sa_lid, SET, SaAttr.INFORM_INFO, data=inform(1, trap=66))).status == 0
            assert (await sa_query(t, r.sa_lid, SET, SaAttr.INFORM_INFO, data=inform(1, trap=67))).status == 0
            assert (await r.ask(SET, A, component_mask=CREATE_MASK, data=mcr(MGID1, g1, 1))).status == 0
            await settle(rep)
            assert traps(got) == [66]
            n = parse_sa(got[0]).data[:80]
            notice = NOTICE.unpack(n)
            assert (notice["IsGeneric"], notice["Type"], notice["ProducerType"]) == (1, 3, 4)
            assert int.from_bytes(n[6:8], "big") == r.sa_lid and n[16:32] == MGID1  # 6 reserved bytes, the MGID
            # More full members, partial leaves: no trap; the last full member: 67.
            assert (await r.ask(SET, A, component_mask=JOIN_MASK, data=mcr(MGID1, g1, 8))).status == 0
            assert (await r.ask(DELETE, A, component_mask=JOIN_MASK, data=mcr(MGID1, g1, 1))).status == 0
            await settle(rep)
            assert traps(got) == [66]
            assert (await r.ask(DELETE, A, component_mask=JOIN_MASK, data=mcr(MGID1, g1, 8))).status == 0
            await settle(rep)
            assert traps(got) == [66, 67] and parse_sa(got[1]).data[16:32] == MGID1
            assert rep.stats.delivered == 2 and rep.stats.failed == 0


async def test_on_change_after_every_membership_change() -> None:
    async with two_hosts() as (r, h1, h2):
        g1, g2 = gid(guid_of(r, h1)), gid(guid_of(r, h2))
        seen: list[tuple[int, frozenset[int] | None]] = []
        groups = mc(r)
        groups.on_change.append(lambda mlid, g: seen.append((mlid, None if g is None else frozenset(groups.ports(g)))))
        p1, p2 = guid_of(r, h1), guid_of(r, h2)
        assert (await ask(r, h1, SET, CREATE_MASK, mcr(MGID1, g1, 1))).status == 0
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 2))).status == 0
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 2))).status == 0  # nothing changes: no call
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 4))).status == 0
        assert (await ask(r, h2, SET, JOIN_MASK, mcr(MGID1, g2, 2), key=1)).status == 0  # same again
        assert (await ask(r, h1, DELETE, JOIN_MASK, mcr(MGID1, g1, 1))).status == 0
        assert seen == [
            (0xC000, frozenset({p1})),
            (0xC000, frozenset({p1, p2})),
            (0xC000, frozenset({p1, p2})),
            (0xC000, None),
        ]


# -- no leak, fuzz ---------------------------------------------------------------------------------------------


def _subsets(bits: int, rng: random.Random) -> Iterator[int]:
    """``bits`` split into random non-empty parts."""
    while bits:
        part = 0
        while not part:
            part = bits & rng.randrange(1, 16)
        bits &= ~part
        yield part


async def test_5000_join_leave_cycles_leak_no_mlid() -> None:
    """Every creatable JoinState x every partial first leave x every JoinState of a second member, cycled to 5,000
    groups made and gone (some with SA-assigned MGIDs); each new group gets 0xC000 again, every MLID is free at
    the end (OpenSM 3.3.23 leaks one per join 0x9 / leave 0x1: pull request #43)."""
    async with two_hosts() as (r, h1, h2):
        g1, g2 = gid(guid_of(r, h1)), gid(guid_of(r, h2))
        groups = mc(r)
        rng = random.Random(16)
        combos = [(j1, p, j2) for j1 in CREATABLE for p in range(1, 16) if p & j1 == p for j2 in range(0, 16)]
        cycles = 0
        for j1, part, j2 in itertools.islice(itertools.cycle(combos), 5000):
            cycles += 1
            zero = cycles % 7 == 0
            got = one(await ask(r, h1, SET, CREATE_MASK, mcr(bytes(16) if zero else MGID1, g1, j1)))
            mgid = bytes(got["MGID"])
            assert got["MLID"] == 0xC000, (cycles, j1, part, j2)
            state = {g1: j1}
            if j2:
                assert one(await ask(r, h2, SET, JOIN_MASK, mcr(mgid, g2, j2)))["JoinState"] == j2
                state[g2] = j2
            rest = [(g1, p) for p in _subsets(j1 & ~part, rng)] + [(g2, p) for p in _subsets(j2, rng)]
            rng.shuffle(rest)
            for who, bits in [(g1, part), *rest]:
                t = h1 if who == g1 else h2
                ans = await ask(r, t, DELETE, JOIN_MASK, mcr(mgid, who, bits))
                if who not in state:  # dropped with the group
                    assert ans.status == INVALID
                    continue
                left = state[who] & ~bits
                full_before = any(s & 0x9 for s in state.values())
                if left:
                    state[who] = left
                else:
                    del state[who]
                if full_before and not any(s & 0x9 for s in state.values()):
                    state.clear()
                assert one(ans)["JoinState"] == state.get(who, 0), (cycles, j1, part, j2, who, bits)
            assert groups.groups == {} and groups.pool.in_use == 0, (cycles, j1, part, j2)
        assert cycles == 5000 and groups.stats.created == groups.stats.deleted == 5000
        assert groups.check() == []


MGIDS = [MGID1, MGID2, bytes(16), ipoib_mgid(0xFFFF), bytes.fromhex("ff12601bffff0000000000000000000a")]


async def test_fuzzed_mcmember_mads_get_a_status_and_keep_the_store_consistent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with two_hosts() as (r, h1, h2):
        groups = mc(r)
        groups.create_ipoib_broadcast(0xFFFF)
        p1, p2 = guid_of(r, h1), guid_of(r, h2)
        rng = random.Random(1617)
        gids = [gid(p1), gid(p2), gid(0x1234), gid(p1, 0xFEC0000000000000), bytes(16)]
        statuses: set[int] = set()
        caplog.set_level(logging.WARNING, logger="sm.sa")
        for i in range(1500):
            t = rng.choice((h1, h2))
            own = gid(guid_of(r, t))
            key = rng.choice((0, 0, 1, rng.getrandbits(64)))
            if rng.random() < 0.5:  # a plausible request: the join masks, mostly the requester's own port
                method = rng.choice((SET, SET, DELETE, GET, TABLE))
                mask = rng.choice((JOIN_MASK, CREATE_MASK)) | (rng.getrandbits(19) if rng.random() < 0.3 else 0)
                port = own if rng.random() < 0.8 else rng.choice(gids)
                data = bytearray(
                    mcr(
                        rng.choice(MGIDS), port, rng.randrange(1, 16), Q_Key=rng.choice((QKEY, 0x0B1B)),
                        MTUSelector=rng.randrange(4), MTU=rng.randrange(1, 6), RateSelector=rng.randrange(4),
                        Rate=rng.choice((3, 16, 21)), Scope=rng.choice((2, 5)), MLID=rng.choice((0, 0xC000, 0xC005)),
                    )
                )  # fmt: skip
            else:  # anything: random masks, fields, bytes
                method = rng.choice((SET, SET, DELETE, DELETE, GET, TABLE))
                mask = rng.choice((JOIN_MASK, CREATE_MASK, rng.getrandbits(19), rng.getrandbits(64), 0))
                if rng.random() < 0.5:
                    mask |= rng.getrandbits(19)
                if rng.random() < 0.7:
                    data = bytearray(
                        mcr(rng.choice(MGIDS), rng.choice(gids), rng.randrange(16), Q_Key=rng.choice((QKEY, 0)))
                    )
                    for _ in range(rng.randrange(4)):
                        data[rng.randrange(52)] = rng.randrange(256)
                else:
                    data = bytearray(rng.randbytes(rng.choice((52, 200, 10))))
            ans = await ask(r, t, method, mask, bytes(data), key=key)
            statuses.add(ans.status)
            assert ans.status in {
                0, SaStatus.ERR_REQ_INVALID, SaStatus.ERR_NO_RECORDS, SaStatus.ERR_TOO_MANY_RECORDS,
                SaStatus.ERR_REQ_INVALID_GID, SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS,
            }, (i, hex(ans.status))  # fmt: skip
            if ans.status == 0 and method == SET:
                got = one(ans)
                g = groups.get(bytes(got["MGID"]))
                m = None if g is None else g.members.get(bytes(got["PortGID"]))
                assert m is not None and m.join_state == got["JoinState"], i
            if i % 50 == 0:
                assert groups.check() == [], i
        assert groups.check() == [] and 0 in statuses and SaStatus.ERR_REQ_INVALID in statuses
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text
        # Every member leaves: only the permanent group is left, every other MLID free.
        for g in list(groups.groups.values()):
            for m in list(g.members.values()):
                if g.members.get(m.port_gid) is m:
                    t = h1 if m.port_guid == p1 else h2
                    ans = await ask(r, t, DELETE, JOIN_MASK, mcr(g.mgid, m.port_gid, m.join_state))
                    assert ans.status == 0
        assert [g.mgid for g in groups.groups.values()] == [ipoib_mgid(0xFFFF)] and groups.pool.in_use == 1
        assert groups.check() == []
