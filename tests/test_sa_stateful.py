"""The SA's stateful families on an emulated subnet: ServiceRecord, alias GUIDs, InformInfo, Reports.

MCMemberRecord (joins, leaves, groups) has its own: tests/test_sa_mcmember.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest

import sm.sa.server as server_mod
from fabric.mad.sa import (
    GUID_INFO_RECORD,
    INFORM_INFO,
    INFORM_INFO_RECORD,
    NOTICE,
    SERVICE_RECORD,
    SaAttr,
    SaMethod,
    SaStatus,
    component_mask,
    parse_sa,
)
from sm.sa.client import sa_query
from sm.sa.inform_info import Reporter
from sm.sa.store import MAX_SERVICES_PER_PORT
from sm.transport.base import MadAddress
from sm.transport.emulated import EmulatedTransport
from tests.sa_rig import SaRig, sa_rig

GET, SET, TABLE, DELETE = SaMethod.GET, SaMethod.SET, SaMethod.GET_TABLE, SaMethod.DELETE
SR = SaAttr.SERVICE_RECORD
PREFIX = 0xFE80000000000000


def gid(guid: int) -> bytes:
    return PREFIX.to_bytes(8, "big") + guid.to_bytes(8, "big")


def host_guid(r: SaRig) -> int:
    ep = r.host.endpoint
    return int(r.emu.fabric.port_guid[ep.node, ep.port])


def service(sid: int, sgid: bytes, name: str = "svc", lease: int | None = None, key: bytes = b"") -> tuple[int, bytes]:
    values: dict[str, object] = {"ServiceID": sid, "ServiceGID": sgid, "ServiceName": name.encode().ljust(64, b"\0")}
    names = ["ServiceID", "ServiceGID", "ServiceName"]
    if lease is not None:
        values["ServiceLease"] = lease
        names.append("ServiceLease")
    if key:
        values["ServiceKey"] = key.ljust(16, b"\0")
        names.append("ServiceKey")
    return component_mask(SR, names), SERVICE_RECORD.pack(values)


async def test_service_record_round_trip() -> None:
    async with sa_rig() as r:
        g = gid(host_guid(r))
        mask, data = service(0x1234, g, "hello", key=b"secret")
        ans = await r.ask(SET, SR, component_mask=mask, data=data)
        assert ans.status == 0 and len(ans.records) == 1
        rec = SERVICE_RECORD.unpack(ans.records[0][:176])
        assert rec["ServiceID"] == 0x1234 and rec["ServiceP_Key"] == 0xFFFF and rec["ServiceLease"] == 0xFFFFFFFF
        assert rec["ServiceKey"] == bytes(16)  # untrusted answer
        # A second service, then Get by ID and GetTable of all.
        mask2, data2 = service(0x5678, g, "other")
        assert (await r.ask(SET, SR, component_mask=mask2, data=data2)).status == 0
        q_mask = component_mask(SR, ["ServiceID"])
        ans = await r.ask(GET, SR, component_mask=q_mask, data=SERVICE_RECORD.pack({"ServiceID": 0x1234}))
        assert ans.status == 0
        assert bytes(SERVICE_RECORD.unpack(ans.records[0][:176])["ServiceName"]).startswith(b"hello")
        ans = await r.ask(TABLE, SR)
        assert ans.status == 0 and len(ans.records) == 2
        # Trusted requests see the ServiceKey.
        ans = await r.ask(GET, SR, component_mask=q_mask, data=SERVICE_RECORD.pack({"ServiceID": 0x1234}), sm_key=1)
        assert SERVICE_RECORD.unpack(ans.records[0][:176])["ServiceKey"] == b"secret".ljust(16, b"\0")
        # Set of the same key replaces it.
        mask3, data3 = service(0x1234, g, "renamed")
        assert (await r.ask(SET, SR, component_mask=mask3, data=data3)).status == 0
        assert len((await r.ask(TABLE, SR)).records) == 2
        # Delete answers the record it removed; again: no records.
        rid = component_mask(SR, ["ServiceID", "ServiceGID"])
        ans = await r.ask(DELETE, SR, component_mask=mask, data=data)  # the name no longer matches
        assert ans.status == SaStatus.ERR_NO_RECORDS
        ans = await r.ask(DELETE, SR, component_mask=rid, data=data)
        assert ans.status == 0 and ans.method == SaMethod.DELETE_RESP
        assert bytes(SERVICE_RECORD.unpack(ans.records[0][:176])["ServiceName"]).startswith(b"renamed")
        assert (await r.ask(DELETE, SR, component_mask=rid, data=data)).status == SaStatus.ERR_NO_RECORDS
        ans = await r.ask(GET, SR, component_mask=q_mask, data=SERVICE_RECORD.pack({"ServiceID": 0x1234}))
        assert ans.status == SaStatus.ERR_NO_RECORDS
        assert len((await r.ask(TABLE, SR)).records) == 1


async def test_service_record_refusals_and_caps() -> None:
    async with sa_rig() as r:
        g = gid(host_guid(r))
        # Without ServiceGID in the mask: ERR_REQ_INVALID (as OpenSM).
        data = SERVICE_RECORD.pack({"ServiceID": 1, "ServiceGID": g})
        ans = await r.ask(SET, SR, component_mask=component_mask(SR, ["ServiceID"]), data=data)
        assert ans.status == SaStatus.ERR_REQ_INVALID
        # A GID of no port.
        mask, data = service(1, gid(0xDEADBEEF))
        assert (await r.ask(SET, SR, component_mask=mask, data=data)).status == SaStatus.ERR_REQ_INVALID
        # The per-port cap.
        for i in range(MAX_SERVICES_PER_PORT):
            mask, data = service(100 + i, g)
            assert (await r.ask(SET, SR, component_mask=mask, data=data)).status == 0
        mask, data = service(99, g)
        assert (await r.ask(SET, SR, component_mask=mask, data=data)).status == SaStatus.ERR_NO_RESOURCES
        # Replacing an existing key is still allowed at the cap.
        mask, data = service(100, g, "again")
        assert (await r.ask(SET, SR, component_mask=mask, data=data)).status == 0


async def test_service_record_lease_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    offset = [0.0]
    monkeypatch.setattr(server_mod, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + offset[0]))
    async with sa_rig() as r:
        g = gid(host_guid(r))
        mask, data = service(7, g, lease=30)
        assert (await r.ask(SET, SR, component_mask=mask, data=data)).status == 0
        offset[0] = 10.0
        ans = await r.ask(TABLE, SR)
        assert len(ans.records) == 1
        assert 19 <= int(SERVICE_RECORD.unpack(ans.records[0][:176])["ServiceLease"]) <= 20  # type: ignore[call-overload]
        offset[0] = 31.0
        assert (await r.ask(TABLE, SR)).records == []
        assert r.server.store.services == {}


async def test_alias_guids() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        ca = int(f.cas[0])
        pg = int(f.port_guid[ca, 1])
        lid = int(f.lid[ca, 1])
        pi = dict(r.snap.discovery.port_info[(ca, 1)])
        r.snap.discovery.port_info[(ca, 1)] = {**pi, "GUIDCap": 16}
        A = SaAttr.GUID_INFO_RECORD
        # Set GUID1 and GUID3 of block 0.
        mask = component_mask(A, ["LID", "BlockNum", "GUID1", "GUID3"])
        q = GUID_INFO_RECORD.pack({"LID": lid, "BlockNum": 0, "GUID1": 0xA11A5, "GUID3": 0xA11A6})
        ans = await r.ask(SET, A, component_mask=mask, data=q)
        assert ans.status == 0
        rec = GUID_INFO_RECORD.unpack(ans.records[0])
        assert (rec["GUID0"], rec["GUID1"], rec["GUID2"], rec["GUID3"]) == (pg, 0xA11A5, 0, 0xA11A6)
        assert r.server.store.alias_guids == {(pg, 1): 0xA11A5, (pg, 3): 0xA11A6}
        # Get reads them.
        gmask = component_mask(A, ["LID", "BlockNum"])
        ans = await r.ask(GET, A, component_mask=gmask, data=GUID_INFO_RECORD.pack({"LID": lid, "BlockNum": 0}))
        assert GUID_INFO_RECORD.unpack(ans.records[0])["GUID3"] == 0xA11A6
        # GUID 0 is read-only; LID and BlockNum are needed; a block beyond GUIDCap has no record.
        bad = component_mask(A, ["LID", "BlockNum", "GUID0"])
        assert (await r.ask(SET, A, component_mask=bad, data=q)).status == SaStatus.ERR_REQ_INVALID
        nolid = component_mask(A, ["BlockNum", "GUID1"])
        assert (await r.ask(SET, A, component_mask=nolid, data=q)).status == SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS
        q2 = GUID_INFO_RECORD.pack({"LID": lid, "BlockNum": 2, "GUID1": 5})
        assert (await r.ask(SET, A, component_mask=mask, data=q2)).status == SaStatus.ERR_NO_RECORDS
        # A GUID in use elsewhere (another entry; a port's own GUID) is not taken.
        dup = component_mask(A, ["LID", "BlockNum", "GUID2", "GUID4"])
        other = int(f.port_guid[int(f.cas[1]), 1])
        q3 = GUID_INFO_RECORD.pack({"LID": lid, "BlockNum": 1, "GUID2": 0xA11A5, "GUID4": other})
        ans = await r.ask(SET, A, component_mask=dup, data=q3)
        rec = GUID_INFO_RECORD.unpack(ans.records[0])
        assert ans.status == 0 and rec["GUID2"] == 0 and rec["GUID4"] == 0
        assert (pg, 10) not in r.server.store.alias_guids
        # GUID 0 asks the SA to assign one.
        q4 = GUID_INFO_RECORD.pack({"LID": lid, "BlockNum": 1})
        ans = await r.ask(SET, A, component_mask=component_mask(A, ["LID", "BlockNum", "GUID5"]), data=q4)
        assigned = int(GUID_INFO_RECORD.unpack(ans.records[0])["GUID5"])  # type: ignore[call-overload]
        assert assigned >> 40 == 0x001405 and r.server.store.alias_guids[(pg, 13)] == assigned
        # Delete GUID1: gone from the store and from Get.
        dmask = component_mask(A, ["LID", "BlockNum", "GUID1"])
        ans = await r.ask(DELETE, A, component_mask=dmask, data=q)
        assert ans.status == 0 and GUID_INFO_RECORD.unpack(ans.records[0])["GUID1"] == 0
        ans = await r.ask(GET, A, component_mask=gmask, data=GUID_INFO_RECORD.pack({"LID": lid, "BlockNum": 0}))
        rec = GUID_INFO_RECORD.unpack(ans.records[0])
        assert (rec["GUID1"], rec["GUID3"]) == (0, 0xA11A6)


# -- InformInfo and Reports --------------------------------------------------------------


@asynccontextmanager
async def listener(r: SaRig, node: int) -> AsyncIterator[tuple[EmulatedTransport, list[bytes]]]:
    """A second host at ``node`` port 1 that takes Reports and answers ReportResp."""
    t = EmulatedTransport(r.emu, endpoint=r.emu.attach(node, 1), timeout=0.2, retries=2)
    got: list[bytes] = []

    def serve(mad: bytes, src: MadAddress) -> bool:
        if mad[1] != 0x03 or mad[3] != SaMethod.REPORT:
            return False
        got.append(mad)
        resp = bytearray(mad)
        resp[3] = SaMethod.REPORT_RESP
        t.reply(bytes(resp), src)
        return True

    t.serve(serve)
    try:
        yield t, got
    finally:
        await t.close()


def inform(subscribe: int, *, trap: int = 0xFFFF, qpn: int = 0) -> bytes:
    return INFORM_INFO.pack(
        {
            "LIDRangeBegin": 0xFFFF,
            "IsGeneric": 1,
            "Subscribe": subscribe,
            "Type": 0xFFFF,
            "TrapNumber": trap,
            "QPN": qpn,
            "ProducerType": 0xFFFFFF,
        }
    )


def traps(got: list[bytes]) -> list[int]:
    return [int(NOTICE.unpack(parse_sa(m).data[:80])["TrapNumber"]) for m in got]  # type: ignore[call-overload]


async def settle(rep: Reporter) -> None:
    for _ in range(3):
        await asyncio.sleep(0)
        await rep.drain()


async def test_inform_info_reports() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        cas = [int(c) for c in f.cas]
        rep = r.services.reporter  # the rig's, subscribed to the manager's events
        rep.timeout, rep.retries = 0.2, 1
        async with listener(r, cas[-2]) as (t, got):
            ans = await sa_query(t, r.sa_lid, SET, SaAttr.INFORM_INFO, data=inform(1))
            assert ans.status == 0 and ans.method == SaMethod.GET_RESP
            # InformInfoRecord lists the subscription.
            ans = await r.ask(TABLE, SaAttr.INFORM_INFO_RECORD)
            assert ans.status == 0 and len(ans.records) == 1
            rec = INFORM_INFO_RECORD.unpack(ans.records[0][:60])
            sub_guid = int(f.port_guid[cas[-2], 1])
            assert rec["SubscriberGID"] == gid(sub_guid) and rec["QPN"] == 1 and rec["TrapNumber"] == 0xFFFF
            # A CA's link goes down: trap 65 for its port, 128 from its switch.
            gone = cas[1]
            gone_guid = int(f.port_guid[gone, 1])
            sw = int(f.peer_node[gone, 1])
            sw_lid = int(r.snap.lids.base[sw, 0])
            r.emu.link_down(gone, 1)
            await r.manager.sweep()
            await settle(rep)
            assert sorted(traps(got)) == [65, 128]
            by_trap = {int(NOTICE.unpack(parse_sa(m).data[:80])["TrapNumber"]): parse_sa(m) for m in got}  # type: ignore[call-overload]
            n65 = by_trap[65].data[:80]
            assert n65[16:32] == gid(gone_guid)  # DataDetails (byte 10): 6 reserved bytes, then the GID
            assert int.from_bytes(n65[6:8], "big") == r.sa_lid and n65[1:4] == (4).to_bytes(3, "big")
            n128 = by_trap[128].data[:80]
            assert int.from_bytes(n128[6:8], "big") == sw_lid and int.from_bytes(n128[10:12], "big") == sw_lid
            assert rep.stats.delivered == 2 and rep.stats.failed == 0
            # It comes back: 64 and 128.
            got.clear()
            r.emu.link_up(gone, 1)
            await r.manager.sweep()
            await settle(rep)
            assert sorted(traps(got)) == [64, 128]
            # Unsubscribe (QPN as stored): no more Reports.
            ans = await sa_query(t, r.sa_lid, SET, SaAttr.INFORM_INFO, data=inform(0, qpn=1))
            assert ans.status == 0
            assert r.server.store.subscriptions == {}
            ans = await sa_query(t, r.sa_lid, SET, SaAttr.INFORM_INFO, data=inform(0, qpn=1))
            assert ans.status == SaStatus.ERR_REQ_INVALID
            got.clear()
            r.emu.link_down(gone, 1)
            await r.manager.sweep()
            await settle(rep)
            assert got == []


async def test_inform_info_trap_filter_and_unanswered() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        cas = [int(c) for c in f.cas]
        rep = r.services.reporter  # the rig's, subscribed to the manager's events
        rep.timeout, rep.retries = 0.05, 1
        # The rig's host subscribes to trap 64 only, but answers no Report.
        ans = await r.ask(SET, SaAttr.INFORM_INFO, data=inform(1, trap=64))
        assert ans.status == 0
        assert (await r.ask(SET, SaAttr.INFORM_INFO, data=inform(2))).status == SaStatus.ERR_REQ_INVALID
        r.emu.link_down(cas[1], 1)
        await r.manager.sweep()
        await settle(rep)
        assert rep.stats.delivered == 0 and rep.stats.failed == 0  # 65 and 128: not asked for
        r.emu.link_up(cas[1], 1)
        await r.manager.sweep()
        await settle(rep)
        assert rep.stats.notices == 1 and rep.stats.failed == 1  # 64: sent, never answered
