"""OpenSM's SA on ibsim, asked every query ``saquery`` knows: the reference ibfm's SA server must match.

ibsim runs a 2-level fat tree of 6-port switches (6 leaves, 3 spines, 18 hosts); OpenSM
(``opensm``, not ``--once``) runs at host-00000 with LIDs from a guid2lid file we wrote
(hosts 1..18, switches 19..27, in net-file order), so the same LIDs can be handed to ibfm.
saquery runs at another CA (host-00005) through tests/saquery_ref.py, one command per SA
type, each narrowed to a single record where saquery can (libumad2sim has no RMPP: see
tests/saquery_ref.py). Run with ``-s`` to see every parsed record.

Then the issue's judge: the same queries against ``ibfm serve --transport umad`` at the same host with a
copy of the same guid2lid file, after OpenSM is stopped; both answers (saquery's parsed records and the
raw SA MADs: status, AttributeOffset, component mask echo, record bytes) compared field by field, the
differences DIFFS_BY_DESIGN names aside; ``sminfo`` from a third host names ibfm master at priority 0.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from fabric.formats.netfile import read_net
from fabric.generate import fattree
from fabric.model import Fabric
from sm.sweep.lids import write_guid2lid
from tests.conftest import free_port, need_ibsim, stop_process
from tests.saquery_ref import (
    RECORD_BYTES_DELIVERED,
    SA_TYPES,
    VOLATILE_FIELDS,
    Query,
    SaqueryResult,
    compare_records,
    opensm_sa,
    parse_saquery,
    run_saquery,
    single_record_queries,
    split_dumps,
)
from tests.test_ibsim_election import Ibfm, wait_for
from tests.test_ibsim_sm import REPO, SIM_SPEED, IbrouteTable, Sim, parse_ibroute, start_sim

SM_HOST = "host-00000"
CLIENT = "host-00005"
"""Where saquery runs: a CA that is not the SM's."""
CA = "host-00003"
"""The CA whose records are asked for (another leaf's host is the PathRecord's destination)."""
DST = "host-00008"
LEAF, LEAF_PORT = "leaf-00", 4
TOOL_HOST = "host-00007"
"""Where sminfo runs: a third host."""
"""The switch whose records are asked for, and an up port of it."""


def lid_plan(fabric: Fabric) -> dict[int, tuple[int, int]]:
    """Port GUID -> (LID, LID): CAs first, then switches, in net-file order, from LID 1."""
    ep = fabric.endports().tolist()
    ordered = sorted(ep, key=lambda np_: (fabric.is_switch(np_[0]), np_[0]))
    return {int(fabric.port_guid[n, p]): (i, i) for i, (n, p) in enumerate(ordered, start=1)}


Check = Callable[[SaqueryResult], None]


def lids_of(sim: Sim, tmp_path: Path) -> tuple[Fabric, dict[int, tuple[int, int]], Path, Callable[[str, int], int]]:
    """The running fabric, our LID plan for it written as a guid2lid file, and a (name, port) -> LID lookup."""
    fabric = read_net(sim.netfile)
    plan = lid_plan(fabric)
    g2l = tmp_path / "guid2lid"
    write_guid2lid(g2l, plan)

    def lid(name: str, port: int) -> int:
        return plan[port_guid(fabric, name, port)][0]

    return fabric, plan, g2l, lid


def port_guid(fabric: Fabric, name: str, port: int) -> int:
    return int(fabric.port_guid[fabric.by_name(name), port])


@pytest.mark.ibsim
def test_opensm_answers_every_saquery_type(tmp_path: Path) -> None:
    need_ibsim("saquery", "opensm")
    with start_sim(tmp_path, fattree(2, 6, speed=SIM_SPEED), SM_HOST) as sim:
        fabric, plan, g2l, lid = lids_of(sim, tmp_path)

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
            "NodeRecord": one(lid=str(ca), port_guid=f"{port_guid(fabric, CA, 1):#018x}", NodeDescription=CA),
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
            "GUIDInfoRecord": one(LID=str(ca), Block="0", **{"GUID 0": f"{port_guid(fabric, CA, 1):#018x}"}),
            "SwitchInfoRecord": one(LID=str(sw), LinearFDBTop=f"0x{top:X}"),
            "SMInfoRecord": one(LID=str(sm), GUID=f"{port_guid(fabric, SM_HOST, 1):#018x}", SMState="3"),
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


# -- ibfm's SA against OpenSM's, on the same fabric with the same LIDs -----------------------------------------

DIFFS_BY_DESIGN: dict[str, dict[str, str]] = {
    "ClassPortInfo": {
        "Capability mask": "IsMultiPathSupported (0x400) not advertised: no MultiPathRecord (GetMulti); the other "
        "bits must match (see CAP_NOT_YET)",
        "Capability mask 2": "IsMulticastServiceRecordsSupported (0x100) not advertised: ServiceRecords name ports, "
        "not multicast groups; the other bits must match (see CAP_NOT_YET)",
    },
    "LFTRecord": {
        "LFT[*]": "ftree on both, but OpenSM spreads the destinations over a leaf's up ports from its first up port "
        "and sends switch LIDs up the first one, ibfm rotates its own way: each SM's LFTRecord is checked against "
        "ibroute of the switch instead (the SA serves the LFT its SM set)",
    },
    "SMInfoRecord": {
        "ActCount": "SMInfo ActCount counts the SM's own activity (OpenSM: QP0 MADs sent): volatile by IBA 14.4.1",
    },
}
"""Fields allowed to differ between ibfm's and OpenSM's answers, per record type, with the reason."""

CAP_NOT_YET: dict[str, int] = {"Capability mask": 0x0400, "Capability mask 2": 0x0100}
"""ClassPortInfo bits OpenSM 3.3.23 advertises and ibfm does not yet (DIFFS_BY_DESIGN); every other bit must match."""

OPENSM_ARGS = ("-R", "ftree")
"""OpenSM routes as ibfm does by default (ftree), so the LFTRecords can be compared."""

RAW_HEADER_FIELDS = ("method", "status", "attr_id", "attr_offset", "comp_mask")
"""SA MAD header fields of each answer compared too (AttributeOffset, the component mask echoed)."""


@dataclass
class Answer:
    """One query's answer as kept for the comparison: saquery's parsed records and the raw SA MADs."""

    result: SaqueryResult

    @property
    def records(self) -> list[dict[str, str]]:
        return self.result.records

    def headers(self) -> list[dict[str, int]]:
        return [{k: getattr(m, k) for k in RAW_HEADER_FIELDS} for m in self.result.responses]

    def raw_records(self) -> list[bytes]:
        return [rec for m in self.result.responses for rec in m.records()]


def ask_all(sim: Sim, queries: list[Query]) -> dict[str, Answer]:
    return {q.type: Answer(run_saquery(sim, list(q.args), host=CLIENT, cwd=sim.work)) for q in queries}


def sminfo_from(sim: Sim, host: str) -> str:
    cp = subprocess.run(["sminfo"], env=sim.proc.env(sim_host=host), cwd=sim.work, capture_output=True, text=True,
                        timeout=30, check=False)  # fmt: skip
    return cp.stdout.strip() or cp.stderr.strip()


def ibroute(sim: Sim, lid: int) -> IbrouteTable:
    """``ibroute <lid>`` from CLIENT: the unicast LFT the switch holds."""
    cp = subprocess.run(["ibroute", str(lid)], env=sim.proc.env(sim_host=CLIENT), cwd=sim.work, capture_output=True,
                        text=True, timeout=30, check=False)  # fmt: skip
    (table,) = parse_ibroute(cp.stdout)
    return table


@contextmanager
def ibfm_serve_at(
    sim: Sim,
    guid2lid: Path | None,
    *,
    priority: int = 0,
    extra: tuple[str, ...] = (),
    host: str = SM_HOST,
    sweep_interval: int = 10,
) -> Iterator[Ibfm]:
    """``ibfm serve --transport umad`` at ``host`` (LIDs from ``guid2lid``, if given; ``extra`` flags) for the
    block."""
    work = sim.work / "ibfm"
    work.mkdir(exist_ok=True)
    g2l = work / "guid2lid"
    if guid2lid is not None:
        shutil.copy(guid2lid, g2l)
    env = sim.proc.env(sim_host=host)
    env["PYTHONPATH"] = str(REPO)
    env["IBFM_PERFMGR__ENABLED"] = "false"
    port = free_port()
    log = work / "ibfm.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibfm.cli", "serve", "--transport", "umad", "--listen", f"127.0.0.1:{port}",
         "--sweep-interval", str(sweep_interval), "--sm-priority", str(priority), "--guid2lid", str(g2l), *extra],
        env=env, cwd=work, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield Ibfm(proc, port, log)
    finally:
        stop_process(proc)


@pytest.mark.ibsim
def test_ibfm_answers_every_saquery_type_as_opensm(tmp_path: Path) -> None:
    """The issue's judge: saquery from another port, every record type, ibfm's answer == OpenSM's field by
    field (DIFFS_BY_DESIGN aside), both SMs at the same host with the same guid2lid file; sminfo names ibfm."""
    need_ibsim("saquery", "sminfo", "ibroute", "opensm")
    t0 = time.monotonic()
    with start_sim(tmp_path, fattree(2, 6, speed=SIM_SPEED), SM_HOST) as sim:
        fabric, _, g2l, lid = lids_of(sim, tmp_path)

        ca, sw, sm, dst = lid(CA, 1), lid(LEAF, 0), lid(SM_HOST, 1), lid(DST, 1)
        queries = single_record_queries(ca_lid=ca, sw_lid=sw, sm_lid=sm, dst_lid=dst, sw_port=LEAF_PORT)
        node_lids = [
            ("NR", str(lid(n, p))) for n, p in ((SM_HOST, 1), (CLIENT, 1), (DST, 1), (LEAF, 0), ("spine-02", 0))
        ]

        with opensm_sa(sim, tmp_path / "opensm", sm_host=SM_HOST, guid2lid=g2l, args=OPENSM_ARGS) as osm:
            t_osm = time.monotonic()
            theirs = ask_all(sim, queries)
            theirs_nr = [run_saquery(sim, list(a), host=CLIENT, cwd=sim.work).records for a in node_lids]
            lft_theirs = ibroute(sim, sw)
            osm.proc.terminate()
            osm.proc.wait(10)
        t_osm = time.monotonic() - t_osm

        with ibfm_serve_at(sim, g2l) as ib:
            up = wait_for("ibfm subnet up", lambda: ib.health().get("subnet_up") is True, 30)
            t_ib = time.monotonic()
            ours_nr = [run_saquery(sim, list(a), host=CLIENT, cwd=sim.work).records for a in node_lids]
            ours = ask_all(sim, queries)
            lft_ours = ibroute(sim, sw)
            info = sminfo_from(sim, TOOL_HOST)
            t_ib = time.monotonic() - t_ib
            assert ib.proc.poll() is None, ib.log.read_text()[-3000:]

        # The same LIDs under both SMs.
        def node_lids_of(nrs: list[list[dict[str, str]]]) -> list[tuple[tuple[str, str], ...]]:
            return [tuple((r["lid"], r["port_guid"]) for r in recs) for recs in nrs]

        same = node_lids_of(ours_nr) == node_lids_of(theirs_nr)
        assert same and all(len(r) == 1 for r in ours_nr), (ours_nr, theirs_nr)
        nr_diffs = [
            f"NodeRecord {' '.join(a)}: {d}"
            for a, x, y in zip(node_lids, ours_nr, theirs_nr, strict=True)
            for d in compare_records(x, y)
        ]
        # sminfo from a third host: ibfm is master, priority 0, at its port GUID.
        m = re.search(r"sm lid (\d+) sm guid (0x[0-9a-f]+), activity count \d+ priority (\d+) state (\d+) (\w+)", info)
        assert m, info
        assert (int(m.group(1)), int(m.group(2), 16), m.group(3), m.group(5)) == (
            sm, port_guid(fabric, SM_HOST, 1), "0", "SMINFO_MASTER"), info  # fmt: skip

        for side, answers in (("ibfm", ours), ("opensm", theirs)):
            for name, ans in answers.items():
                (tmp_path / f"{side}-{name}.txt").write_text(ans.result.stdout + ans.result.stderr)
        rows: list[tuple[str, str, str]] = []
        problems: list[str] = list(nr_diffs)
        for q in queries:
            a, b = ours[q.type], theirs[q.type]
            allowed = DIFFS_BY_DESIGN.get(q.type, {})
            diffs = compare_records(a.records, b.records, ignore=set(allowed))
            ha, hb = a.headers(), b.headers()
            if ha != hb:
                diffs.append(f"SA headers: ours {ha} != theirs {hb}")
            if a.result.returncode != b.result.returncode:
                diffs.append(f"exit status: ours {a.result.returncode} != theirs {b.result.returncode}")
            if not allowed and a.raw_records() != b.raw_records():
                diffs.append("raw records differ")
            if q.type == "ClassPortInfo":
                for label, not_yet in CAP_NOT_YET.items():
                    x, y = (int(r.records[0][label], 16) if r.records else -1 for r in (a.result, b.result))
                    if x != y & ~not_yet:
                        diffs.append(f"{label}: ours {x:#x} != theirs {y:#x} less {not_yet:#x}")
            if q.type == "LFTRecord":
                for side, ans, table in (("ours", a, lft_ours), ("theirs", b, lft_theirs)):
                    got = {int(k[4:-1]): int(v) for k, v in ans.records[0].items() if k.startswith("LFT[")}
                    want = {k: v for k, v in table.entries.items() if k < len(got)}
                    if {k: v for k, v in got.items() if v != 255} != want:
                        diffs.append(f"{side}: LFTRecord {got} != ibroute {want}")
            verdict = "equal" if not diffs else "DIFF"
            by_design = ", ".join(sorted(allowed)) or "-"
            rows.append((q.type, f"{verdict} ({len(a.records)}/{len(b.records)} rec)", by_design))
            problems += [f"{q.type} {' '.join(q.args)}: {d}" for d in diffs]
        width = max(len(r[0]) for r in rows)
        print(f"\nOpenSM asked in {t_osm:.2f} s; ibfm up in {up:.2f} s, asked in {t_ib:.2f} s; "
              f"total {time.monotonic() - t0:.2f} s; sminfo: {info}")  # fmt: skip
        for name, verdict, design in rows:
            print(f"  {name:<{width}}  {verdict:<17} differs by design: {design}")
        for p in problems:
            print("  !", p)
        if problems:
            pytest.fail("ibfm's SA differs from OpenSM's:\n" + "\n".join(problems), pytrace=False)


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


# -- what the judge needed fixed, on the emulated fabric (no ibsim) ----------------------------------------------


async def test_port_info_record_capability_mask2_bitwise_match() -> None:
    """AttributeModifier bit 31 matches CapabilityMask2 on the query's bits (IsPortInfoCapMask2MatchSupported,
    advertised as OpenSM does), and a switch's NodeRecord has LocalPortNum 0 (its port 0), as OpenSM's."""
    from fabric.mad.sa import NODE_RECORD, PORT_INFO_RECORD, SaAttr, SaMethod, component_mask
    from tests.sa_rig import sa_rig

    table = SaMethod.GET_TABLE
    async with sa_rig() as r:
        # Three ports given CapabilityMask2 0x30, 0x10, 0x20 before the SA's first look at the snapshot.
        pis = r.snap.discovery.port_info
        keys = [k for k in pis if k[1] == 1][:3]
        for k, cap2 in zip(keys, (0x30, 0x10, 0x20), strict=True):
            pis[k] = {**pis[k], "CapabilityMask2": cap2}
        cmask = component_mask(SaAttr.PORT_INFO_RECORD, ["CapabilityMask2"])
        q = PORT_INFO_RECORD.pack({"CapabilityMask2": 0x10})
        exact = await r.ask(table, SaAttr.PORT_INFO_RECORD, component_mask=cmask, data=q)
        some = await r.ask(table, SaAttr.PORT_INFO_RECORD, component_mask=cmask, data=q, attr_mod=1 << 31)
        assert [int(PORT_INFO_RECORD.unpack(x)["CapabilityMask2"]) for x in exact.records] == [0x10]
        assert sorted(int(PORT_INFO_RECORD.unpack(x)["CapabilityMask2"]) for x in some.records) == [0x10, 0x30]

        ans = await r.ask(table, SaAttr.NODE_RECORD)
        nodes = [NODE_RECORD.unpack(x) for x in ans.records]
        assert {int(n["LocalPortNum"]) for n in nodes if int(n["NodeType"]) == 2} == {0}
        assert {int(n["LocalPortNum"]) for n in nodes if int(n["NodeType"]) == 1} == {1}
