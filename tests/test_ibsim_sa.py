"""OpenSM's SA on ibsim, asked every query ``saquery`` knows: the reference ibfm's SA server must match.

ibsim runs a 2-level fat tree of 6-port switches (6 leaves, 3 spines, 18 hosts); OpenSM
(``opensm``, not ``--once``) runs at host-00000 with LIDs from a guid2lid file we wrote
(hosts 1..18, switches 19..27, in net-file order), so the same LIDs can be handed to ibfm.
saquery runs at another CA (host-00005) through tests/saquery_ref.py, one command per SA
type, each narrowed to a single record where saquery can (libumad2sim has no RMPP: see
tests/saquery_ref.py). Run with ``-s`` to see every parsed record.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fabric.formats.netfile import read_net
from fabric.generate import fattree
from fabric.model import Fabric
from sm.sweep.lids import write_guid2lid
from tests.conftest import need_ibsim
from tests.saquery_ref import (
    RECORD_BYTES_DELIVERED,
    SA_TYPES,
    VOLATILE_FIELDS,
    SaqueryResult,
    compare_records,
    opensm_sa,
    parse_saquery,
    run_saquery,
    single_record_queries,
    split_dumps,
)
from tests.test_ibsim_sm import SIM_SPEED, start_sim

SM_HOST = "host-00000"
CLIENT = "host-00005"
"""Where saquery runs: a CA that is not the SM's."""
CA = "host-00003"
"""The CA whose records are asked for (another leaf's host is the PathRecord's destination)."""
DST = "host-00008"
LEAF, LEAF_PORT = "leaf-00", 4
"""The switch whose records are asked for, and an up port of it."""


def lid_plan(fabric: Fabric) -> dict[int, tuple[int, int]]:
    """Port GUID -> (LID, LID): CAs first, then switches, in net-file order, from LID 1."""
    ep = fabric.endports().tolist()
    ordered = sorted(ep, key=lambda np_: (fabric.is_switch(np_[0]), np_[0]))
    return {int(fabric.port_guid[n, p]): (i, i) for i, (n, p) in enumerate(ordered, start=1)}


Check = Callable[[SaqueryResult], None]


@pytest.mark.ibsim
def test_opensm_answers_every_saquery_type(tmp_path: Path) -> None:
    need_ibsim("saquery", "opensm")
    with start_sim(tmp_path, fattree(2, 6, speed=SIM_SPEED), SM_HOST) as sim:
        fabric = read_net(sim.netfile)
        plan = lid_plan(fabric)
        g2l = tmp_path / "guid2lid"
        write_guid2lid(g2l, plan)

        def guid(name: str, port: int) -> int:
            return int(fabric.port_guid[fabric.by_name(name), port])

        def lid(name: str, port: int) -> int:
            return plan[guid(name, port)][0]

        ca, sw, sm, dst = lid(CA, 1), lid(LEAF, 0), lid(SM_HOST, 1), lid(DST, 1)
        top = max(b for b, _ in plan.values())
        queries = single_record_queries(ca_lid=ca, sw_lid=sw, sm_lid=sm, dst_lid=dst, sw_port=LEAF_PORT)
        assert sorted(q.type for q in queries) == sorted(SA_TYPES)

        def one(**want: str) -> Check:
            def check(r: SaqueryResult) -> None:
                assert r.ok and len(r.records) == 1, r.summary() + "\n" + r.stderr
                got = {k: r.records[0].get(k) for k in want}
                assert got == want, r.summary()

            return check

        def none(r: SaqueryResult) -> None:
            # OpenSM answers a GetTable that matches nothing with an empty GetTableResp: status 0,
            # AttributeOffset 0, saquery prints nothing and exits 0.
            assert r.ok and r.printed == [] and r.status is None, r.summary()
            assert r.responses and r.responses[-1].attr_offset == 0 and len(r.responses[-1].data) == 56

        expect: dict[str, Check] = {
            "ClassPortInfo": one(**{"Base version": "1", "Class version": "2", "Redirect QP": "0x00000001"}),
            "NodeRecord": one(lid=str(ca), port_guid=f"{guid(CA, 1):#018x}", NodeDescription=CA),
            "PortInfoRecord": one(EndPortLid=str(ca), PortNum="1", Lid=str(ca), SMLid=str(sm), LinkState="Active"),
            "SL2VLTableRecord": one(LID=str(sw), InPort="0", OutPort=str(LEAF_PORT)),
            "PKeyTableRecord": one(LID=str(ca), Port="1", Block="0", **{"PKey[0]": "0xffff"}),
            "VLArbitrationTableRecord": one(LID=str(ca), Port="1", Block="1"),
            "InformInfoRecord": none,
            "LinkRecord": one(FromLID=str(ca), FromPort="1", ToLID=str(lid("leaf-01", 0)), ToPort="1"),
            "ServiceRecord": none,
            "PathRecord": one(slid=str(ca), dlid=str(dst), pkey="0xFFFF", num_path_revers="0x80"),
            "MCMemberRecord": one(mlid="0xc000", PortGid="::", MGID="ff12:401b:ffff::ffff:ffff"),
            "LFTRecord": one(LID=str(sw), Block="0", **{f"LFT[{sw}]": "0", "LFT[1]": "1"}),
            "MFTRecord": none,
            "GUIDInfoRecord": one(LID=str(ca), Block="0", **{"GUID 0": f"{guid(CA, 1):#018x}"}),
            "SwitchInfoRecord": one(LID=str(sw), LinearFDBTop=f"0x{top:X}"),
            "SMInfoRecord": one(LID=str(sm), GUID=f"{guid(SM_HOST, 1):#018x}", SMState="3"),
        }

        with opensm_sa(sim, tmp_path / "opensm", sm_host=SM_HOST, guid2lid=g2l):

            def ask(*args: str) -> SaqueryResult:
                return run_saquery(sim, list(args), host=CLIENT, cwd=sim.work)

            for q in queries:
                r = ask(*q.args)
                print(r.summary())
                for rec in r.records:
                    print("   ", rec)
                expect[q.type](r)
                # The records kept are exactly those the raw answer delivered whole.
                data = [m for m in r.responses if m.attr_id == SA_TYPES[q.type].attr_id]
                if data and data[-1].record_size:
                    assert len(data[-1].records()) == len(r.records), r.summary()
                    assert data[-1].record_size == SA_TYPES[q.type].record_size, r.summary()

            # PKeyTableRecords are for trusted requests only: without OpenSM's SA key, SA_ERR_REQ_INVALID.
            r = ask("PKTR", f"{ca}/1/0")
            assert r.returncode == 5 and r.status == 0x0200 and r.printed == [], r.summary()
            # A non-zero SM_Key other than the SA key: OpenSM drops the query, saquery times out.
            r = ask("--smkey", "2", "NR", str(ca))
            assert r.timed_out and r.returncode == 110, r.summary()
            # --src-to-dst (NumbPath 0x7f in the request) gets the same single path as --slid/--dlid.
            a, b = ask("-p", "--src-to-dst", f"{ca}:{dst}"), ask("PR", "--slid", str(ca), "--dlid", str(dst))
            assert a.records and compare_records(a.records, b.records) == []
            # A table longer than one MAD: 25 LinkRecords printed, the 21 that arrived whole kept.
            r = ask("-x")
            assert r.cut and len(r.printed) == 200 // 8 and len(r.records) == RECORD_BYTES_DELIVERED // 8
            assert r.records[0] == {"FromLID": "1", "FromPort": "1", "ToPort": "1", "ToLID": str(lid("leaf-00", 0))}
            # Volatile fields aside, two asks of the same thing agree.
            x, y = ask("SMIR", str(sm)), ask("SMIR", str(sm))
            assert compare_records(x.records, y.records, ignore=set(VOLATILE_FIELDS)) == []
        assert sim.proc.alive()


# -- the parsers on outputs as saquery (infiniband-diags 44) prints them, no ibsim needed ---------------------------


def test_parse_saquery_tables_and_labels() -> None:
    text = (
        "PortInfoRecord dump:\n\tRID\n\t\tEndPortLid..............6\n\t\tPortNum.................1\n"
        "\t\tOptions.................0x0\n\tPortInfo dump:\n\t\tMkey:............................<not displayed>\n"
        "\t\tCapMask:.........................0x50c048\n\t\t\t\tIsTrapSupported\n"
        "\t\tMcastPkeyTrapSuppressionEnabled:.0\n"
        "SL2VLTableRecord dump:\n\t\tLID........................19\n\t\tInPort.....................0\n"
        "\t\tOutPort....................1\n\t\tSL: 0| 1| 2| 3| 4| 5| 6| 7| 8| 9|10|11|12|13|14|15|\n"
        "\t\tVL: 0| 1| 2| 3| 4| 5| 6| 7| 8| 9|10|11|12|13|14| 7|\n"
        "VLArbTableRecord dump:\n\t\tLID........................6\n\t\tPort.......................1\n"
        "\t\tBlock......................1\n"
        + "\t\tVL    : 0| 1| 2| 3| 4| 5| 6| 7| 0| 0| 0| 0| 0| 0| 0| 0|\n"
        + "\t\tWeight: 0| 4| 4| 4| 4| 4| 4| 4| 0| 0| 0| 0| 0| 0| 0| 0|\n"
        + "\t\tVL    : 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0|\n"
        + "\t\tWeight: 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 0| 9|\n"
        "PKeyTableRecord dump:\n\t\tLID........................6\n\t\tPort.......................1\n"
        "\t\tBlock......................0\n\t\tPKey Table:\n"
        + "\t\t0xffff 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000\n"
        + "\t\t0x0000 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000\n" * 2
        + "\t\t0x0000 0x0000 0x0000 0x0000 0x0000 0x0000 0x0000 0x8001\n\n"
        "LFT Record dump:\n\t\tLID........................19\n\t\tBlock......................0\n"
        "\t\tLFT:\n\t\tLID\tPort Number\n\t\t0\t255\n\t\t1\t1\n\n"
        "MFT Record dump:\n\t\tLID........................19\n\t\tPosition...................0\n"
        "\t\tBlock......................0\n\t\tMFT:\n\t\tMLID\tPort Mask\n\t\t0xc000\t0x0012\n\n"
        "ServiceRecord dump:\n\t\tServiceID...............0x0000000000000001\n\t\tServiceData8.1..........0x7\n"
        "\t\tServiceData16.10........0x0\n"
        "IsSM ports\nPortInfoRecord dump:\n\t\tEndPortLid..............1\n\t\tcapability_mask.........0x50C04A\n"
    )
    recs = parse_saquery(text)
    assert [r.kind for r in recs] == [
        "PortInfoRecord",
        "SL2VLTableRecord",
        "VLArbitrationTableRecord",
        "PKeyTableRecord",
        "LFTRecord",
        "MFTRecord",
        "ServiceRecord",
        "PortInfoRecord",
    ]
    pir, sl2vl, vlarb, pkey, lft, mft, sr, issm = recs
    assert pir.fields == {
        "EndPortLid": "6",
        "PortNum": "1",
        "Options": "0x0",
        "Mkey": "<not displayed>",
        "CapMask": "0x50c048",
        "McastPkeyTrapSuppressionEnabled": "0",
    }
    assert sl2vl.fields["SL0"] == "0" and sl2vl.fields["SL14"] == "14" and sl2vl.fields["SL15"] == "7"
    assert vlarb.fields["VL[1]"] == "1" and vlarb.fields["Weight[1]"] == "4" and vlarb.fields["Weight[31]"] == "9"
    assert sum(k.startswith("Weight[") for k in vlarb.fields) == 32
    assert pkey.fields["PKey[0]"] == "0xffff" and pkey.fields["PKey[31]"] == "0x8001" and len(pkey.fields) == 3 + 32
    assert lft.fields == {"LID": "19", "Block": "0", "LFT[0]": "255", "LFT[1]": "1"}
    assert mft.fields["MFT[0xc000]"] == "0x0012"
    assert sr.fields == {"ServiceID": "0x0000000000000001", "ServiceData8.1": "0x7", "ServiceData16.10": "0x0"}
    assert issm.section == "IsSM ports" and issm.fields["capability_mask"] == "0x50C04A"
    # ``saquery -m <mlid>``: one headerless line per member.
    members = parse_saquery("\t\tPortGid.................fe80::1 (a)\n\t\tPortGid.................fe80::2 (b)\n")
    assert [m.fields for m in members] == [{"PortGid": "fe80::1 (a)"}, {"PortGid": "fe80::2 (b)"}]


def test_split_dumps_and_compare_records() -> None:
    out = (
        "SA Request:\n0103 0212 0000 0000 0000 0000 0000 0001\n0020 0000 0000 0000\n"
        "SA Response:\n0103 0292 0000 0000 0000 0000 0000 0001\n0020 0000 0000 0000 0000 0100 0000 0000\n"
        "0000 0000 0000 0000 0000 0000 0001 0000\n0000 0000 0000 0000 0006 0103 0014 0000\n"
        "LinkRecord dump:\n\t\tFromLID....................6\n\t\tFromPort...................1\n"
        "\t\tToPort.....................3\n\t\tToLID......................20\n"
    )
    text, requests, responses = split_dumps(out)
    assert text.startswith("LinkRecord dump:") and len(requests) == 1 and len(responses) == 1
    (resp,) = responses
    assert (resp.method, resp.status, resp.attr_id, resp.record_size, len(resp.data)) == (0x92, 0, 0x20, 8, 64)
    assert resp.printed_count == resp.valid_count == 1 and not resp.cut
    assert resp.records() == [bytes.fromhex("0006010300140000")]
    ours = [{"FromLID": "6", "ToLID": "20", "ActCount": "1"}]
    theirs = [{"FromLID": "6", "ToLID": "21", "ActCount": "2", "ToPort": "3"}]
    assert compare_records(ours, theirs, ignore={"ActCount"}) == [
        "record 0: ToLID: ours '20' != theirs '21'",
        "record 0: ToPort: missing in ours (theirs '3')",
    ]
    assert compare_records(ours, [], ignore=set()) == ["record count: ours 1 != theirs 0"]
    assert compare_records([{"LFT[3]": "1"}], [{"LFT[3]": "2"}], ignore={"LFT[*]"}) == []
