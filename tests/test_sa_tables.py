"""SwitchInfo, LFT, MFT, SL2VL, P_Key, VLArb and GUIDInfo records answered by the SA on an emulated subnet."""

from __future__ import annotations

import numpy as np

from fabric.generate import fattree
from fabric.mad.sa import (
    GUID_INFO_RECORD,
    LFT_RECORD,
    PKEY_TABLE_RECORD,
    SL2VL_TABLE_RECORD,
    SWITCH_INFO_RECORD,
    VLARB_TABLE_RECORD,
    SaAttr,
    SaMethod,
    SaStatus,
    component_mask,
)
from sm.sa.server import SaContext
from sm.sa.store import SaStore
from sm.sa.switch_records import LftRecordFamily
from tests.sa_rig import SaRig, sa_rig

GET, TABLE = SaMethod.GET, SaMethod.GET_TABLE


def cm(attr: int, *names: str) -> int:
    return component_mask(attr, names)


def sw_lid(r: SaRig, node: int) -> int:
    return int(r.emu.fabric.lid[node, 0])


def n_blocks(r: SaRig) -> int:
    return r.snap.lids.max_lid // 64 + 1


async def test_switch_info_record() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        ans = await r.ask(TABLE, SaAttr.SWITCH_INFO_RECORD)
        assert ans.status == 0 and len(ans.records) == len(f.switches)
        recs = [SWITCH_INFO_RECORD.unpack(x) for x in ans.records]
        assert sorted(rec["LID"] for rec in recs) == sorted(sw_lid(r, int(s)) for s in f.switches)
        assert {rec["LinearFDBTop"] for rec in recs} == {r.snap.lids.max_lid}

        sw = int(f.switches[1])
        q = SWITCH_INFO_RECORD.pack({"LID": sw_lid(r, sw)})
        ans = await r.ask(GET, SaAttr.SWITCH_INFO_RECORD, component_mask=cm(SaAttr.SWITCH_INFO_RECORD, "LID"), data=q)
        assert ans.status == 0 and len(ans.records) == 1
        rec = SWITCH_INFO_RECORD.unpack(ans.records[0])
        held = r.snap.discovery.switch_info[sw]
        assert rec["LID"] == sw_lid(r, sw)
        for k in ("LinearFDBCap", "MulticastFDBCap", "LifeTimeValue", "PartitionEnforcementCap", "DefaultPort"):
            assert rec[k] == held[k], k
        # The emulated switch's own LinearFDBTop is what ibfm programmed.
        assert rec["LinearFDBTop"] == int(r.emu.lft_top[r.emu._sw_row[sw]])

        q = SWITCH_INFO_RECORD.pack({"LID": 0xBFF})
        ans = await r.ask(GET, SaAttr.SWITCH_INFO_RECORD, component_mask=cm(SaAttr.SWITCH_INFO_RECORD, "LID"), data=q)
        assert ans.status == SaStatus.ERR_NO_RECORDS


async def test_lft_record() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        nb = n_blocks(r)
        ans = await r.ask(TABLE, SaAttr.LFT_RECORD)
        assert ans.status == 0 and len(ans.records) == len(f.switches) * nb
        for raw in ans.records:
            rec = LFT_RECORD.unpack(raw)
            sw = int(r.snap.lids.owner_node[rec["LID"]])
            assert f.is_switch(sw) and rec["LID"] == sw_lid(r, sw)
            b = rec["BlockNum"]
            # What ibfm programmed in the emulated switch, 255 beyond the top LID.
            top = r.snap.lids.max_lid
            want = np.full(64, 255, np.uint8)
            lo, hi = b * 64, min((b + 1) * 64, top + 1)
            if hi > lo:
                want[: hi - lo] = r.emu.lft[r.emu._sw_row[sw], lo:hi]
            assert raw[8:72] == want.tobytes()
            assert raw[8] == 255 or b  # LFT[0] unused
            assert raw[8 + rec["LID"] % 64] == 0 or rec["LID"] // 64 != b  # own LID -> port 0

        sw = int(f.switches[2])
        q = LFT_RECORD.pack({"LID": sw_lid(r, sw), "BlockNum": 0})
        ans = await r.ask(GET, SaAttr.LFT_RECORD, component_mask=cm(SaAttr.LFT_RECORD, "LID", "BlockNum"), data=q)
        assert ans.status == 0 and len(ans.records) == 1
        top = r.snap.lids.max_lid
        assert ans.records[0][8 : 8 + top + 1] == r.emu.lft[r.emu._sw_row[sw], : top + 1].tobytes()
        assert set(ans.records[0][8 + top + 1 : 72]) <= {255}

        q = LFT_RECORD.pack({"LID": sw_lid(r, sw), "BlockNum": nb})
        ans = await r.ask(GET, SaAttr.LFT_RECORD, component_mask=cm(SaAttr.LFT_RECORD, "LID", "BlockNum"), data=q)
        assert ans.status == SaStatus.ERR_NO_RECORDS
        # A CA has no LFT.
        q = LFT_RECORD.pack({"LID": int(f.lid[int(f.cas[0]), 1])})
        ans = await r.ask(TABLE, SaAttr.LFT_RECORD, component_mask=cm(SaAttr.LFT_RECORD, "LID"), data=q)
        assert ans.status == 0 and ans.records == []


async def test_lft_records_of_a_full_lid_space() -> None:
    """1,620 switches x 768 blocks (49,152 LIDs): every block of every switch, padded with 255 past the LFT."""

    class Snap:
        pass

    n_sw, lids = 1620, 768 * 64
    s = Snap()
    fab = Snap()
    fab.switches = np.arange(n_sw)  # type: ignore[attr-defined]
    s.fabric = fab  # type: ignore[attr-defined]
    lm = Snap()
    lm.max_lid = lids - 1  # type: ignore[attr-defined]
    lm.base = np.zeros((n_sw, 2), np.uint16)  # type: ignore[attr-defined]
    lm.base[:, 0] = np.arange(1, n_sw + 1)  # type: ignore[attr-defined]
    s.lids = lm  # type: ignore[attr-defined]
    rng = np.random.default_rng(1)
    s.lft = rng.integers(0, 37, (n_sw, lids - 40), dtype=np.uint8)  # type: ignore[attr-defined]
    rows = LftRecordFamily().build(SaContext(s, SaStore(), 0.0, {}))
    assert rows.shape == (n_sw * 768, 72)
    k = 5 * 768 + 767
    assert int.from_bytes(rows[k, :2].tobytes(), "big") == 6 and int.from_bytes(rows[k, 2:4].tobytes(), "big") == 767
    assert rows[k, 8:72].tolist() == s.lft[5, 767 * 64 :].tolist() + [255] * 40  # type: ignore[attr-defined]


async def test_mft_record_empty() -> None:
    async with sa_rig() as r:
        ans = await r.ask(TABLE, SaAttr.MFT_RECORD)
        assert ans.status == 0 and ans.records == []
        ans = await r.ask(GET, SaAttr.MFT_RECORD)
        assert ans.status == SaStatus.ERR_NO_RECORDS


async def test_sl2vl_record() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        n_ca_ports = int(f.port_exists[f.cas, 1:].sum())
        n_sw = sum((int(f.nports[s]) + 1) ** 2 for s in f.switches)
        ans = await r.ask(TABLE, SaAttr.SL2VL_TABLE_RECORD)
        assert ans.status == 0 and len(ans.records) == n_ca_ports + n_sw
        ca = int(f.cas[0])
        q = SL2VL_TABLE_RECORD.pack({"LID": int(f.lid[ca, 1])})
        ans = await r.ask(GET, SaAttr.SL2VL_TABLE_RECORD, component_mask=cm(SaAttr.SL2VL_TABLE_RECORD, "LID"), data=q)
        assert ans.status == 0 and len(ans.records) == 1
        rec = SL2VL_TABLE_RECORD.unpack(ans.records[0])
        assert (rec["InputPortNum"], rec["OutputPortNum"], rec["SLtoVLMappingTable"]) == (0, 1, 0)

        sw = int(f.switches[0])
        q = SL2VL_TABLE_RECORD.pack({"LID": sw_lid(r, sw)})
        ans = await r.ask(TABLE, SaAttr.SL2VL_TABLE_RECORD, component_mask=cm(SaAttr.SL2VL_TABLE_RECORD, "LID"), data=q)
        np_ = int(f.nports[sw]) + 1
        pairs = [(SL2VL_TABLE_RECORD.unpack(x)["OutputPortNum"], SL2VL_TABLE_RECORD.unpack(x)["InputPortNum"])
                 for x in ans.records]
        assert pairs == [(o, i) for o in range(np_) for i in range(np_)]
        q = SL2VL_TABLE_RECORD.pack({"LID": sw_lid(r, sw), "InputPortNum": 2, "OutputPortNum": 3})
        mask = cm(SaAttr.SL2VL_TABLE_RECORD, "LID", "InputPortNum", "OutputPortNum")
        ans = await r.ask(GET, SaAttr.SL2VL_TABLE_RECORD, component_mask=mask, data=q)
        assert ans.status == 0 and len(ans.records) == 1


async def test_pkey_table_record_trusted_only() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        ans = await r.ask(TABLE, SaAttr.PKEY_TABLE_RECORD)
        assert ans.status == SaStatus.ERR_REQ_INVALID == 0x0200 and ans.records == []
        ans = await r.ask(TABLE, SaAttr.PKEY_TABLE_RECORD, sm_key=1)
        assert ans.status == 0
        # emulator, as ibsim: CA PartitionCap 64 -> 2 blocks; switch port 0 PartitionCap 8 -> 1 block;
        # external switch ports PartitionEnforcementCap 64 -> 2 blocks each.
        n_ca_ports = int(f.port_exists[f.cas, 1:].sum())
        n_ext_ports = sum(int(f.nports[s]) for s in f.switches)
        assert len(ans.records) == 2 * n_ca_ports + len(f.switches) + 2 * n_ext_ports

        ca = int(f.cas[0])
        mask = cm(SaAttr.PKEY_TABLE_RECORD, "LID", "BlockNum", "PortNum")
        q = PKEY_TABLE_RECORD.pack({"LID": int(f.lid[ca, 1]), "BlockNum": 0, "PortNum": 1})
        ans = await r.ask(GET, SaAttr.PKEY_TABLE_RECORD, component_mask=mask, data=q, sm_key=1)
        assert ans.status == 0 and len(ans.records) == 1
        rec = PKEY_TABLE_RECORD.unpack(ans.records[0])
        assert (rec["LID"], rec["BlockNum"], rec["PortNum"]) == (int(f.lid[ca, 1]), 0, 1)
        assert ans.records[0][8:10] == b"\xff\xff" and set(ans.records[0][10:72]) == {0}
        q = PKEY_TABLE_RECORD.pack({"LID": int(f.lid[ca, 1]), "BlockNum": 1, "PortNum": 1})
        ans = await r.ask(GET, SaAttr.PKEY_TABLE_RECORD, component_mask=mask, data=q, sm_key=1)
        assert ans.status == 0 and set(ans.records[0][8:72]) == {0}
        ans = await r.ask(GET, SaAttr.PKEY_TABLE_RECORD, component_mask=mask, data=q, sm_key=0)
        assert ans.status == 0x0200


async def test_vlarb_record() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        n_ca_ports = int(f.port_exists[f.cas, 1:].sum())
        n_sw_ports = sum(int(f.nports[s]) + 1 for s in f.switches)
        ans = await r.ask(TABLE, SaAttr.VLARB_TABLE_RECORD)
        assert ans.status == 0 and len(ans.records) == 4 * (n_ca_ports + n_sw_ports)
        ca = int(f.cas[1])
        q = VLARB_TABLE_RECORD.pack({"LID": int(f.lid[ca, 1])})
        ans = await r.ask(TABLE, SaAttr.VLARB_TABLE_RECORD, component_mask=cm(SaAttr.VLARB_TABLE_RECORD, "LID"), data=q)
        recs = [VLARB_TABLE_RECORD.unpack(x) for x in ans.records]
        assert [(x["OutputPortNum"], x["BlockNum"]) for x in recs] == [(1, b) for b in (1, 2, 3, 4)]
        assert all(set(x[8:72]) == {0} for x in ans.records)
        sw = int(f.switches[0])
        q = VLARB_TABLE_RECORD.pack({"LID": sw_lid(r, sw), "OutputPortNum": 2, "BlockNum": 3})
        mask = cm(SaAttr.VLARB_TABLE_RECORD, "LID", "OutputPortNum", "BlockNum")
        ans = await r.ask(GET, SaAttr.VLARB_TABLE_RECORD, component_mask=mask, data=q)
        assert ans.status == 0 and len(ans.records) == 1


async def test_guid_info_record() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        n_ca_ports = int(f.port_exists[f.cas, 1:].sum())
        ans = await r.ask(TABLE, SaAttr.GUID_INFO_RECORD)
        # emulator GUIDCap 1: one block per end port
        assert ans.status == 0 and len(ans.records) == n_ca_ports + len(f.switches)
        ca = int(f.cas[0])
        mask = cm(SaAttr.GUID_INFO_RECORD, "LID", "BlockNum")
        q = GUID_INFO_RECORD.pack({"LID": int(f.lid[ca, 1]), "BlockNum": 0})
        ans = await r.ask(GET, SaAttr.GUID_INFO_RECORD, component_mask=mask, data=q)
        assert ans.status == 0 and len(ans.records) == 1
        rec = GUID_INFO_RECORD.unpack(ans.records[0])
        assert rec["GUID0"] == int(f.port_guid[ca, 1])
        assert all(rec[f"GUID{i}"] == 0 for i in range(1, 8))
        sw = int(f.switches[0])
        q = GUID_INFO_RECORD.pack({"LID": sw_lid(r, sw), "BlockNum": 0})
        ans = await r.ask(GET, SaAttr.GUID_INFO_RECORD, component_mask=mask, data=q)
        assert GUID_INFO_RECORD.unpack(ans.records[0])["GUID0"] == int(f.port_guid[sw, 0])
        # A Set with no alias (all GUIDs 0) changes nothing and answers the block as it is.
        ans = await r.ask(SaMethod.SET, SaAttr.GUID_INFO_RECORD, component_mask=mask, data=q)
        assert ans.status == 0 and GUID_INFO_RECORD.unpack(ans.records[0])["GUID0"] == int(f.port_guid[sw, 0])


async def test_guid_info_record_aliases_and_blocks() -> None:
    async with sa_rig() as r:
        f = r.emu.fabric
        ca = int(f.cas[0])
        pg = int(f.port_guid[ca, 1])
        pi = dict(r.snap.discovery.port_info[(ca, 1)])
        r.snap.discovery.port_info[(ca, 1)] = {**pi, "GUIDCap": 32}
        r.server.store.alias_guids = {(pg, 1): 0x1111, (pg, 9): 0x2222, (pg, 31): 0x3333}
        mask = cm(SaAttr.GUID_INFO_RECORD, "LID")
        q = GUID_INFO_RECORD.pack({"LID": int(f.lid[ca, 1])})
        ans = await r.ask(TABLE, SaAttr.GUID_INFO_RECORD, component_mask=mask, data=q)
        recs = [GUID_INFO_RECORD.unpack(x) for x in ans.records]
        assert [x["BlockNum"] for x in recs] == [0, 1, 2, 3]
        assert (recs[0]["GUID0"], recs[0]["GUID1"], recs[1]["GUID1"], recs[3]["GUID7"]) == (pg, 0x1111, 0x2222, 0x3333)


async def test_multi_segment_answer() -> None:
    """A larger fabric: the LFT and SL2VL tables take many RMPP segments, every record arrives."""
    async with sa_rig(fattree(2, 8)) as r:
        f = r.emu.fabric
        ans = await r.ask(TABLE, SaAttr.SL2VL_TABLE_RECORD)
        n_ca_ports = int(f.port_exists[f.cas, 1:].sum())
        want = n_ca_ports + sum((int(f.nports[s]) + 1) ** 2 for s in f.switches)
        assert ans.status == 0 and ans.segments > 1 and len(ans.records) == want
        ans = await r.ask(TABLE, SaAttr.LFT_RECORD)
        assert ans.status == 0 and ans.segments > 1
        assert len(ans.records) == len(f.switches) * n_blocks(r)
        assert [LFT_RECORD.unpack(x)["BlockNum"] for x in ans.records[: n_blocks(r)]] == list(range(n_blocks(r)))
