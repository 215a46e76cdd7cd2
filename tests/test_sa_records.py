"""NodeRecord, PortInfoRecord, LinkRecord and SMInfoRecord answered by the SA on an emulated subnet."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fabric.generate import fattree
from fabric.mad.attributes import PORT_INFO
from fabric.mad.constants import SmState
from fabric.mad.sa import (
    LINK_RECORD,
    NODE_RECORD,
    PORT_INFO_RECORD,
    SM_INFO_RECORD,
    SaAttr,
    SaMethod,
    SaStatus,
    component_mask,
)
from fabric.model import NodeType
from sm.sa.link_record import LinkRecordFamily
from sm.sa.node_record import NodeRecordFamily
from sm.sa.port_info_record import PortInfoRecordFamily
from sm.sa.server import SaContext
from tests.sa_rig import SaRig, sa_rig

GET, TABLE = SaMethod.GET, SaMethod.GET_TABLE


def end_lid(r: SaRig, node: int, port: int) -> int:
    f = r.emu.fabric
    return int(f.lid[node, 0] if f.node_type[node] == NodeType.SWITCH else f.lid[node, port])


def desc(rec: Mapping[str, object]) -> str:
    d = rec["NodeDescription"]
    assert isinstance(d, bytes)
    return d.rstrip(b"\0").decode()


def n_links(r: SaRig) -> int:
    f = r.emu.fabric
    return int((f.peer_node[:, 1:] >= 0).sum())


async def test_node_record() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        ans = await r.ask(TABLE, SaAttr.NODE_RECORD)
        assert ans.status == 0
        n_ca_ports = int(f.port_exists[f.cas, 1:].sum())
        assert len(ans.records) == n_ca_ports + len(f.switches)
        recs = [NODE_RECORD.unpack(x) for x in ans.records]
        assert len({rec["LID"] for rec in recs}) == len(recs)

        ca = int(f.cas[0])
        lid = int(f.lid[ca, 1])
        q = NODE_RECORD.pack({"LID": lid})
        ans = await r.ask(GET, SaAttr.NODE_RECORD, component_mask=component_mask(SaAttr.NODE_RECORD, ["LID"]), data=q)
        assert ans.status == 0 and len(ans.records) == 1
        rec = NODE_RECORD.unpack(ans.records[0])
        assert rec["LID"] == lid
        assert rec["NodeType"] == NodeType.CA
        assert rec["NodeGUID"] == int(f.node_guid[ca])
        assert rec["PortGUID"] == int(f.port_guid[ca, 1])
        assert rec["LocalPortNum"] == 1
        assert rec["NumPorts"] == int(f.nports[ca])
        assert rec["SystemImageGUID"] == int(f.sysimg_guid[ca])
        assert rec["VendorID"] == int(f.vendor_id[ca])
        assert rec["DeviceID"] == int(f.device_id[ca])
        assert desc(rec) == f.descs[ca]

        sw = int(f.switches[0])
        q = NODE_RECORD.pack({"NodeGUID": int(f.node_guid[sw])})
        ans = await r.ask(GET, SaAttr.NODE_RECORD, component_mask=component_mask(SaAttr.NODE_RECORD, ["NodeGUID"]),
                          data=q)
        assert ans.status == 0 and len(ans.records) == 1
        rec = NODE_RECORD.unpack(ans.records[0])
        assert rec["LID"] == int(f.lid[sw, 0])
        assert rec["NodeType"] == NodeType.SWITCH
        assert rec["PortGUID"] == int(f.port_guid[sw, 0])
        assert desc(rec) == f.descs[sw]

        mask = component_mask(SaAttr.NODE_RECORD, ["NodeType"])
        ans = await r.ask(GET, SaAttr.NODE_RECORD, component_mask=mask, data=NODE_RECORD.pack({"NodeType": 2}))
        assert ans.status == SaStatus.ERR_TOO_MANY_RECORDS
        ans = await r.ask(TABLE, SaAttr.NODE_RECORD, component_mask=mask, data=NODE_RECORD.pack({"NodeType": 2}))
        assert ans.status == 0 and len(ans.records) == len(f.switches)
        ans = await r.ask(GET, SaAttr.NODE_RECORD, component_mask=component_mask(SaAttr.NODE_RECORD, ["LID"]),
                          data=NODE_RECORD.pack({"LID": 0xBFFF}))
        assert ans.status == SaStatus.ERR_NO_RECORDS


async def test_port_info_record() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        ans = await r.ask(TABLE, SaAttr.PORT_INFO_RECORD)
        assert ans.status == 0
        n_ports = int(f.port_exists[f.cas].sum()) + int((f.nports[f.switches].astype(int) + 1).sum())
        assert len(ans.records) == n_ports
        recs = [PORT_INFO_RECORD.unpack(x) for x in ans.records]
        assert all(rec["M_Key"] == 0 for rec in recs)  # untrusted: M_Key hidden

        mask = component_mask(SaAttr.PORT_INFO_RECORD, ["EndportLID", "PortNum"])
        ca = int(f.cas[0])
        lid = int(f.lid[ca, 1])
        q = PORT_INFO_RECORD.pack({"EndportLID": lid, "PortNum": 1})
        ans = await r.ask(GET, SaAttr.PORT_INFO_RECORD, component_mask=mask, data=q)
        assert ans.status == 0 and len(ans.records) == 1
        rec = PORT_INFO_RECORD.unpack(ans.records[0])
        assert rec["EndportLID"] == lid and rec["PortNum"] == 1 and rec["Options"] == 0
        assert rec["LID"] == lid
        assert rec["LocalPortNum"] == 1
        assert rec["MasterSMLID"] == r.sa_lid
        assert rec["PortState"] == int(f.state[ca, 1])

        # A switch's external port: EndportLID the switch's, the PortInfo as the SM holds it.
        sw = int(f.switches[0])
        port = int(np.flatnonzero(f.peer_node[sw, 1:] >= 0)[0]) + 1
        swlid = int(f.lid[sw, 0])
        q = PORT_INFO_RECORD.pack({"EndportLID": swlid, "PortNum": port})
        ans = await r.ask(GET, SaAttr.PORT_INFO_RECORD, component_mask=mask, data=q)
        assert ans.status == 0 and len(ans.records) == 1
        rec = PORT_INFO_RECORD.unpack(ans.records[0])
        held = r.snap.discovery.port_info.raw((sw, port))
        assert held is not None and ans.records[0][4:68] == held
        assert rec["EndportLID"] == swlid and rec["PortNum"] == port
        assert rec["LinkWidthActive"] == PORT_INFO.unpack(held)["LinkWidthActive"]

        ans = await r.ask(GET, SaAttr.PORT_INFO_RECORD, component_mask=component_mask(
            SaAttr.PORT_INFO_RECORD, ["EndportLID"]), data=PORT_INFO_RECORD.pack({"EndportLID": swlid}))
        assert ans.status == SaStatus.ERR_TOO_MANY_RECORDS
        ans = await r.ask(TABLE, SaAttr.PORT_INFO_RECORD, component_mask=component_mask(
            SaAttr.PORT_INFO_RECORD, ["EndportLID"]), data=PORT_INFO_RECORD.pack({"EndportLID": swlid}))
        assert len(ans.records) == int(f.nports[sw]) + 1
        q = PORT_INFO_RECORD.pack({"EndportLID": 0xBFFF, "PortNum": 1})
        ans = await r.ask(GET, SaAttr.PORT_INFO_RECORD, component_mask=mask, data=q)
        assert ans.status == SaStatus.ERR_NO_RECORDS

        # CapabilityMask: exact match, or (AttributeModifier bit 31) the query's bits only.
        cap = int(rec["CapabilityMask"])  # a switch port
        low = cap & -cap
        cmask = component_mask(SaAttr.PORT_INFO_RECORD, ["CapabilityMask"])
        q = PORT_INFO_RECORD.pack({"CapabilityMask": low})
        exact = await r.ask(TABLE, SaAttr.PORT_INFO_RECORD, component_mask=cmask, data=q)
        some = await r.ask(TABLE, SaAttr.PORT_INFO_RECORD, component_mask=cmask, data=q, attr_mod=1 << 31)
        want = sum(1 for x in recs if int(x["CapabilityMask"]) & low)
        assert len(some.records) == want
        assert len(exact.records) == sum(1 for x in recs if int(x["CapabilityMask"]) == low)
        assert want > len(exact.records)


async def test_port_info_record_m_key_for_trusted() -> None:
    async with sa_rig(sm_key=7) as r:
        mkeys = {PORT_INFO.unpack(r.snap.discovery.port_info.raw(k) or bytes(64))["M_Key"]
                 for k in r.snap.discovery.port_info}
        ans = await r.ask(TABLE, SaAttr.PORT_INFO_RECORD, sm_key=7)
        assert ans.status == 0
        got = {PORT_INFO_RECORD.unpack(x)["M_Key"] for x in ans.records}
        assert got == mkeys


async def test_link_record() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        ans = await r.ask(TABLE, SaAttr.LINK_RECORD)
        assert ans.status == 0
        assert len(ans.records) == n_links(r)
        for x in ans.records:
            rec = LINK_RECORD.unpack(x)
            assert rec["FromLID"] and rec["ToLID"]

        ca = int(f.cas[0])
        lid = int(f.lid[ca, 1])
        mask = component_mask(SaAttr.LINK_RECORD, ["FromLID", "FromPort"])
        ans = await r.ask(GET, SaAttr.LINK_RECORD, component_mask=mask,
                          data=LINK_RECORD.pack({"FromLID": lid, "FromPort": 1}))
        assert ans.status == 0 and len(ans.records) == 1
        rec = LINK_RECORD.unpack(ans.records[0])
        pn, pp = int(f.peer_node[ca, 1]), int(f.peer_port[ca, 1])
        assert rec == {"FromLID": lid, "FromPort": 1, "ToPort": pp, "ToLID": end_lid(r, pn, pp)}

        # The other direction, from the switch.
        ans = await r.ask(GET, SaAttr.LINK_RECORD, component_mask=mask,
                          data=LINK_RECORD.pack({"FromLID": end_lid(r, pn, pp), "FromPort": pp}))
        assert LINK_RECORD.unpack(ans.records[0]) == {"FromLID": end_lid(r, pn, pp), "FromPort": pp,
                                                      "ToPort": 1, "ToLID": lid}

        sw = int(f.switches[0])
        one = component_mask(SaAttr.LINK_RECORD, ["FromLID"])
        ans = await r.ask(GET, SaAttr.LINK_RECORD, component_mask=one,
                          data=LINK_RECORD.pack({"FromLID": int(f.lid[sw, 0])}))
        assert ans.status == SaStatus.ERR_TOO_MANY_RECORDS
        ans = await r.ask(TABLE, SaAttr.LINK_RECORD, component_mask=one,
                          data=LINK_RECORD.pack({"FromLID": int(f.lid[sw, 0])}))
        assert len(ans.records) == int((f.peer_node[sw, 1:] >= 0).sum())
        ans = await r.ask(GET, SaAttr.LINK_RECORD, component_mask=mask,
                          data=LINK_RECORD.pack({"FromLID": 0xBFFF, "FromPort": 1}))
        assert ans.status == SaStatus.ERR_NO_RECORDS


async def test_sm_info_record() -> None:
    async with sa_rig() as r:
        el = r.manager.elector
        ans = await r.ask(TABLE, SaAttr.SM_INFO_RECORD)
        assert ans.status == 0
        assert len(ans.records) == 1 + len(el.peers)
        mask = component_mask(SaAttr.SM_INFO_RECORD, ["LID"])
        ans = await r.ask(GET, SaAttr.SM_INFO_RECORD, component_mask=mask,
                          data=SM_INFO_RECORD.pack({"LID": r.sa_lid}))
        assert ans.status == 0 and len(ans.records) == 1
        rec = SM_INFO_RECORD.unpack(ans.records[0])
        d = r.snap.discovery
        assert rec["LID"] == r.sa_lid == int(r.emu.fabric.lid[d.sm_node, d.sm_port])
        assert rec["GUID"] == el.guid == int(r.emu.fabric.port_guid[d.sm_node, d.sm_port])
        assert rec["SM_Key"] == 0
        assert rec["Priority"] == el.priority
        assert rec["SMState"] == SmState.MASTER
        assert 0 < int(rec["ActCount"]) <= el.act_count
        ans = await r.ask(GET, SaAttr.SM_INFO_RECORD, component_mask=mask, data=SM_INFO_RECORD.pack({"LID": 0xBFFF}))
        assert ans.status == SaStatus.ERR_NO_RECORDS
        ans = await r.ask(GET, SaAttr.SM_INFO_RECORD, component_mask=component_mask(
            SaAttr.SM_INFO_RECORD, ["SMState"]), data=SM_INFO_RECORD.pack({"SMState": 3}))
        assert ans.status == 0 and len(ans.records) == 1


async def test_big_tables_over_rmpp() -> None:
    async with sa_rig(fattree(2, 16)) as r:
        f = r.emu.fabric
        ans = await r.ask(TABLE, SaAttr.NODE_RECORD)
        assert ans.status == 0
        assert ans.segments > 1
        assert len(ans.records) == len(f.cas) + len(f.switches)
        recs = [NODE_RECORD.unpack(x) for x in ans.records]
        by_lid = {int(rec["LID"]): rec for rec in recs}
        assert len(by_lid) == len(recs)
        for n in f.cas.tolist():
            rec = by_lid[int(f.lid[n, 1])]
            assert rec["PortGUID"] == int(f.port_guid[n, 1]) and desc(rec) == f.descs[n]
        for n in f.switches.tolist():
            assert by_lid[int(f.lid[n, 0])]["NodeGUID"] == int(f.node_guid[n])

        ans = await r.ask(TABLE, SaAttr.LINK_RECORD)
        assert ans.segments > 1 and len(ans.records) == n_links(r)
        ans = await r.ask(TABLE, SaAttr.PORT_INFO_RECORD)
        assert ans.segments > 1
        assert len(ans.records) == len(f.cas) + int((f.nports[f.switches].astype(int) + 1).sum())


def test_tables_of_a_three_level_tree() -> None:
    """Every record of a 3-level fat tree (from its discovery) is packed, one per end port, port and link
    direction (how long it takes is bench/sa.py's business)."""
    import asyncio

    from fabric.emulator import EmulatedFabric
    from sm.sweep.manager import FabricManager, SmConfig
    from sm.transport.emulated import EmulatedTransport

    async def sweep() -> object:
        emu = EmulatedFabric(fattree(3, 8))
        t = EmulatedTransport(emu, issm=True)
        try:
            return await FabricManager(t, SmConfig(offload=False, check_credit_loops=False)).heavy_sweep()
        finally:
            await t.close()

    snap = asyncio.run(sweep())
    ctx = SaContext(snap, None, 0.0, {})
    nr = NodeRecordFamily().build(ctx)
    pr = PortInfoRecordFamily().build(ctx)
    lr = LinkRecordFamily().build(ctx)
    f = snap.fabric  # type: ignore[attr-defined]
    assert nr.shape == (len(f.cas) + len(f.switches), NODE_RECORD.size)
    assert pr.shape[0] == len(f.cas) + int((f.nports[f.switches].astype(int) + 1).sum())
    assert lr.shape == (int((f.peer_node[:, 1:] >= 0).sum()), LINK_RECORD.size)


async def test_a_table_too_long_for_one_rmpp_transfer_gets_no_resources() -> None:
    """Over a transport whose kernel segments answers up to a limit, a longer GetTable is answered
    ERR_NO_RESOURCES (the host hears why) instead of vanishing in a failed send."""
    from fabric.mad.sa import SaStatus, parse_sa, sa_mad
    from sm.transport.base import MadAddress

    async with sa_rig() as r:
        sent: list[bytes] = []

        class Kernel:
            kernel_rmpp = True
            max_answer_bytes = 56 + 3 * 112  # three NodeRecords

            def reply(self, mad: bytes, to: MadAddress) -> None:
                sent.append(mad)

        srv = r.server
        srv.transport, srv.kernel_rmpp = Kernel(), True  # type: ignore[assignment]
        srv.take(sa_mad(SaMethod.GET_TABLE, SaAttr.NODE_RECORD, tid=9), MadAddress(3, 1, 0x80010000))
        assert parse_sa(sent[-1]).status == SaStatus.ERR_NO_RESOURCES and parse_sa(sent[-1]).tid == 9
