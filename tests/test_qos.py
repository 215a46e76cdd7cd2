"""QoS: OpenSM's qos_* options and policy file, the SL2VL and VLArb tables, their programming, the SA's SLs
and the routes API.

The tables are judged against OpenSM 3.3.23 over ibsim in tests/test_ibsim_qos.py; here the rules are
checked over the emulator: what a plan holds, that a second sweep and a restart send nothing, that a
layered routing result gets SL k -> VL k everywhere and its SLs in PathRecords.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from exporters.http.app import create_app
from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.mad.sa import SaAttr, SaMethod
from fabric.model import Fabric
from ibfm.settings import SettingsError, load_settings
from sm.partitions.config import parse_partitions
from sm.qos.config import (
    DEFAULT_SL2VL,
    QosConfig,
    QosPolicyError,
    build_options,
    load_qos_policy,
    parse_qos_policy,
    parse_sl2vl,
    parse_vlarb,
)
from sm.qos.plan import vl_mask
from sm.routing.base import RoutingResult
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot
from sm.transport.emulated import EmulatedTransport
from tests.test_http_api import Recorder
from tests.test_sa_path import ask_direct, mask, pr

A = int(SaAttr.PATH_RECORD)

# -- options -------------------------------------------------------------------------------------------


def test_defaults_are_opensms() -> None:
    s = load_settings(None, {})
    q = s.sm.qos_config()
    assert not q.enabled and q.policy is None
    for kind in ("ca", "swe", "sw0", "rtr"):
        o = q.options(kind)  # type: ignore[arg-type]
        assert o.max_vls == 15 and o.high_limit == 0
        assert o.sl2vl == (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 7)
        assert o.vlarb_low[:3] == ((0, 0), (1, 4), (2, 4)) and o.vlarb_low[15:] == ((0, 0),) * 49
        assert o.vlarb_high[:2] == ((0, 4), (1, 0))


def test_per_type_options_fall_back_to_the_general_ones() -> None:
    s = load_settings(None, {"sm.qos": "true", "sm.qos_high_limit": "5", "sm.qos_swe_high_limit": "9",
                             "sm.qos_sl2vl": "0,1,0,1,0,1,0,1,0,1,0,1,0,1,0,15", "sm.qos_ca_vlarb_low": "1:7"})
    q = s.sm.qos_config()
    assert q.enabled
    assert q.swe.high_limit == 9 and q.ca.high_limit == 5 and q.sw0.high_limit == 5
    assert q.rtr.sl2vl[-1] == 15 and q.swe.sl2vl[:3] == (0, 1, 0)
    assert q.ca.vlarb_low[0] == (1, 7) and q.ca.vlarb_low[1] == (0, 0)
    assert q.swe.vlarb_low[1] == (1, 4)


@pytest.mark.parametrize(
    ("dotted", "value", "says"),
    [
        ("sm.qos_sl2vl", "0,1,2", "16 SLs"),
        ("sm.qos_sl2vl", "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,16", "column 36: SL 15: VL 16"),
        ("sm.qos_swe_sl2vl", "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,x", "not a number"),
        ("sm.qos_vlarb_low", "0:4,1", "column 5: entry 1 '1' is not VL:weight"),
        ("sm.qos_ca_vlarb_high", "15:4", "VL 15 is not a data VL"),
        ("sm.qos_vlarb_high", "0:256", "weight 256"),
        ("sm.qos_vlarb_high", "0:010", "octal"),
        ("sm.qos_high_limit", "256", "less than or equal to 255"),
        ("sm.qos_max_vls", "0", "greater than or equal to 1"),
    ],
)
def test_bad_options_name_the_setting_and_the_entry(dotted: str, value: str, says: str) -> None:
    with pytest.raises(SettingsError) as e:
        load_settings(None, {dotted: value})
    assert dotted in str(e.value) and says in str(e.value), str(e.value)


def test_tables_parse_as_opensm_reads_them() -> None:
    assert parse_vlarb("0:4, 1:0,2:0x10,")[:4] == ((0, 4), (1, 0), (2, 16), (0, 0))
    assert len(parse_vlarb("0:1")) == 64
    with pytest.raises(ValueError, match="65 entries"):
        parse_vlarb(",".join(["1:1"] * 65))
    assert parse_sl2vl("0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,7") == DEFAULT_SL2VL


# -- the policy file -------------------------------------------------------------------------------------

POLICY = """\
# a QoS policy
port-groups
    port-group
        name: Storage
        use: storage targets
        port-guid: {storage}
    end-port-group
    port-group
        name: Compute
        node-type: CA
    end-port-group
end-port-groups

qos-levels
    qos-level
        name: StorageLevel
        sl: 3
    end-qos-level
    qos-level
        name: NoSL
        use: a level without an SL
    end-qos-level
end-qos-levels

qos-match-rules
    qos-match-rule
        source: Compute
        destination: Storage
        qos-level-name: StorageLevel
    end-qos-match-rule
    qos-match-rule
        pkey: 0x0002
        qos-level-name: NoSL
    end-qos-match-rule
end-qos-match-rules
"""


def test_policy_parses() -> None:
    p = parse_qos_policy(POLICY.format(storage="0x10-0x12, 0x20"), "q.conf")
    assert [g.name for g in p.groups] == ["Storage", "Compute"]
    assert p.groups[0].guids == ((0x10, 0x12), (0x20, 0x20))
    assert p.groups[1].node_types == frozenset({"CA"})
    assert [(lv.name, lv.sl) for lv in p.levels] == [("StorageLevel", 3), ("NoSL", None)]
    assert p.rules[0].sources == ("Compute",) and p.rules[1].pkeys == ((2, 2),)


@pytest.mark.parametrize(
    ("edit", "where", "says"),
    [
        (("destination: Storage", "destination: Nothing"), "q.conf:28:22", "no port-group of that name"),
        (("qos-level-name: NoSL", "qos-level-name: Nope"), "q.conf:33:25", "no qos-level"),
        (("        sl: 3", "        sl: 16"), "q.conf:17:13", "SL 16 is not 0..15"),
        (("        sl: 3", "        mtu-limit: 4"), "q.conf:17:9", "not supported by ibfm"),
        (("        name: Compute", "        name: Storage"), "q.conf:9:15", "defined twice"),
        (("node-type: CA", "node-type: HOST"), "q.conf:10:20", "node-type 'HOST'"),
        (("    end-qos-level\nend-qos-levels", "end-qos-levels"), "q.conf:22:1", "expected 'key: value'"),
        (("qos-levels", "qos-ulps"), "q.conf:14:1", "'qos-ulps' is not supported"),
        (("port-guid: 0x10-0x12", "port-guid: 0x12-0x10"), "q.conf:6:20", "ends below its start"),
        (("    port-group\n        name: Compute", "    port-group\n        name: C\n        colour: red"),
         "q.conf:10:9", "unknown port-group key 'colour'"),
    ],
)
def test_policy_errors_are_located(edit: tuple[str, str], where: str, says: str) -> None:
    text = POLICY.format(storage="0x10-0x12").replace(*edit, 1)
    with pytest.raises(QosPolicyError) as e:
        parse_qos_policy(text, "q.conf")
    assert str(e.value).startswith(where + ":") and says in str(e.value), str(e.value)


def test_policy_file_read_errors(tmp_path: Path) -> None:
    with pytest.raises(QosPolicyError, match="no such file"):
        load_qos_policy(tmp_path / "none.conf")
    bad = tmp_path / "bad.conf"
    bad.write_bytes(b"port-groups\n  \xff\n")
    with pytest.raises(QosPolicyError, match=r"bad.conf:2:3: not UTF-8"):
        load_qos_policy(bad)


# -- plans and programming over the emulator ----------------------------------------------------------------


def _manager(emu: EmulatedFabric, qos: QosConfig, **kw: Any) -> FabricManager:
    return FabricManager(
        EmulatedTransport(emu, issm=True), SmConfig(offload=False, check_credit_loops=False, qos=qos, **kw)
    )


def _sweep(f: Fabric, qos: QosConfig, **kw: Any) -> tuple[EmulatedFabric, FabricManager, SubnetSnapshot]:
    emu = EmulatedFabric(f)
    mgr = _manager(emu, qos, **kw)
    snap = asyncio.run(mgr.heavy_sweep())
    return emu, mgr, snap


SL2VL_16 = "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15"


def test_qos_off_sets_nothing() -> None:
    f = fattree(2, 4)
    emu, _, snap = _sweep(f, QosConfig())
    assert snap.up and snap.program.qos is None
    cas = [int(n) for n in f.cas]
    # ibsim's defaults stay: SL i on VL i for 0..14 (VL 8..14 beyond the ports' VL0-7), SL 15 on VL 7
    assert emu.sl2vl(cas[1], 0, 1).tolist() == [*range(15), 7]
    assert snap.qos is not None and snap.qos.empty and snap.qos.level_sl((cas[0], 1), (cas[1], 1), 0x7FFF) is None


def test_tables_as_opensm_computes_them_then_nothing_sent() -> None:
    f = fattree(2, 4)
    q = QosConfig(True, ca=build_options({}, {"sl2vl": SL2VL_16, "high_limit": 3}),
                  swe=build_options({}, {"vlarb_low": "0:1,1:2,2:3,3:4,4:5,5:6,6:7,7:8,8:9,9:10"}))  # fmt: skip
    emu, mgr, snap = _sweep(f, q)
    rep = snap.program.qos
    assert snap.up and rep is not None, snap.program.failures
    n_sw_pairs = sum((int(f.nports[s]) + 1) * int(f.nports[s]) for s in f.switches.tolist())
    assert rep.sl2vl_sent == n_sw_pairs + len(f.cas)  # every (in, out) pair, out 1..N (base port 0), every CA
    assert rep.read == rep.sl2vl_sent + rep.sl2vl_skipped + rep.vlarb_sent + rep.vlarb_skipped
    cas = [int(n) for n in f.cas]
    sw = int(f.switches[0])
    # VL0-7 (OperationalVLs 4): every VL ANDed with 7, VL 15 kept
    assert vl_mask(4) == 7
    assert emu.sl2vl(cas[1], 0, 1).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 15]
    assert emu.sl2vl(sw, 0, 1).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7]
    # the switch's external ports: the swe low table (entries beyond the cap of 8 dropped, VLs masked)
    assert emu.vlarb(sw, 1, 1)[:8].tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 8]]
    assert emu.vlarb(cas[1], 1, 3)[:2].tolist() == [[0, 4], [1, 0]]
    assert int(emu.vl_high_limit[cas[1], 1]) == 3 and snap.program.high_limit_sets == len(cas)
    # what the SA answers is what was set
    assert snap.qos is not None and snap.qos.sl2vl_bytes(cas[1], 0, 1) == bytes.fromhex("012345670123456f")
    again = asyncio.run(mgr.heavy_sweep())
    assert again.program.qos is not None and again.program.qos.sl2vl_sent == 0 == again.program.qos.vlarb_sent
    assert again.program.qos.read == 0 and again.program.high_limit_sets == 0
    restart = asyncio.run(_manager(emu, q).heavy_sweep())  # a new process reads the tables and sends nothing
    assert restart.program.qos is not None and restart.program.qos.sl2vl_sent == 0 == restart.program.qos.vlarb_sent


def test_a_changed_table_is_the_only_one_sent() -> None:
    f = fattree(2, 4)
    emu, mgr, _ = _sweep(f, QosConfig(True))
    cas = [int(n) for n in f.cas]
    assert emu.sl2vl(cas[2], 0, 1)[15] == 7
    mgr.config = dataclasses.replace(mgr.config, qos=QosConfig(True, ca=build_options({}, {"sl2vl": SL2VL_16})))
    snap = asyncio.run(mgr.heavy_sweep())
    rep = snap.program.qos
    assert rep is not None and rep.sl2vl_sent == len(cas) and rep.vlarb_sent == 0 and rep.read == 0
    assert emu.sl2vl(cas[2], 0, 1)[15] == 15


def _layered(monkeypatch: pytest.MonkeyPatch, layers_of: Any) -> None:
    """Make the routing chain's result carry layers (as a layering engine's would)."""
    import sm.sweep.manager as manager

    real = manager.route

    def route(fabric: Fabric, lids: Any, chain: Any, options: Any = None) -> RoutingResult:
        out = real(fabric, lids, chain, options)
        out.layers = layers_of(fabric, lids, out.lft)
        return out

    monkeypatch.setattr(manager, "route", route)


def test_layers_map_sl_k_to_vl_k_and_reach_pathrecords(monkeypatch: pytest.MonkeyPatch) -> None:
    def layers_of(f: Fabric, lids: Any, lft: Any) -> Any:
        lay = np.zeros(lft.shape, np.uint8)
        lay[:, 1::2] = 1  # odd destination LIDs on layer 1
        lay[1, :] = 2  # everything entering at switch row 1 on layer 2
        return lay

    _layered(monkeypatch, layers_of)
    f = fattree(2, 4)
    # QoS off, and a table that would put SL 1 on VL 0: the layers still get SL k -> VL k
    emu, _, snap = _sweep(f, QosConfig())
    assert snap.up and snap.layers is not None
    rep = snap.program.qos
    assert rep is not None and rep.sl2vl_sent > 0
    for n in [int(x) for x in f.cas]:
        assert emu.sl2vl(n, 0, 1)[:3].tolist() == [0, 1, 2]
    emu2, _, _ = _sweep(f, QosConfig(True, swe=build_options({}, {"sl2vl": "0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"})))
    sw = int(f.switches[0])
    assert emu2.sl2vl(sw, 1, 2)[:4].tolist() == [0, 1, 2, 0]
    # PathRecords carry the route's layer: the source's entry switch row and the destination LID
    lids = snap.lids
    for src in [int(x) for x in f.cas][:4]:
        for dst in [int(x) for x in f.cas]:
            if src == dst:
                continue
            s, d = int(lids.base[src, 1]), int(lids.base[dst, 1])
            status, recs = ask_direct(snap, SaMethod.GET, mask("SLID", "DLID"), pr(slid=s, dlid=d))
            assert status == 0
            row = int(np.flatnonzero(f.switches == f.peer_node[src, 1])[0])
            assert recs[0][53] & 0xF == snap.layers[row, d], (src, dst)
            # a GetTable from the source gives every destination its layer too
    status, recs = ask_direct(snap, SaMethod.GET_TABLE, mask("SLID"), pr(slid=int(lids.base[int(f.cas[0]), 1])))
    assert status == 0 and recs
    row0 = int(np.flatnonzero(f.switches == f.peer_node[int(f.cas[0]), 1])[0])
    for rec in recs:
        dlid = int.from_bytes(rec[40:42], "big")
        assert rec[53] & 0xF == snap.layers[row0, dlid]


def test_sa_sls_by_partition_and_policy() -> None:
    f = fattree(2, 4)
    cas = [int(n) for n in f.cas]
    g = [f"{int(f.port_guid[n, 1]):#x}" for n in cas]
    parts = parse_partitions(f"Default=0x7fff : ALL=full ;\nT=0x0002, sl=5 : {g[1]}=full, {g[2]}=full, {g[3]}=full ;\n",
                             "p.conf")  # fmt: skip
    policy = parse_qos_policy(POLICY.format(storage=g[3]), "q.conf")
    on = QosConfig(True, policy=policy)
    _, _, snap = _sweep(f, on, partitions=parts)
    lids = snap.lids

    def sl(a: int, b: int, pkey: int | None = None) -> int:
        data = pr(slid=int(lids.base[cas[a], 1]), dlid=int(lids.base[cas[b], 1]))
        cm = mask("SLID", "DLID")
        if pkey is not None:
            data = data[:50] + pkey.to_bytes(2, "big") + data[52:]
            cm = mask("SLID", "DLID", "P_Key")
        status, recs = ask_direct(snap, SaMethod.GET, cm, data)
        assert status == 0, status
        return recs[0][53] & 0xF

    assert sl(1, 3) == 3  # Compute -> Storage: the policy's level (over the partition's sl)
    assert sl(1, 2, 0x8002) == 5  # in partition T: its sl
    assert sl(1, 2) == 0 == sl(1, 2, 0xFFFF)  # in the default partition (the first shared key): no level, no sl
    assert sl(0, 4) == 0
    # QoS off: the partition's sl and the policy are not used (OpenSM without -Q)
    _, _, off = _sweep(f, dataclasses.replace(on, enabled=False), partitions=parts)
    _, recs = ask_direct(off, SaMethod.GET, mask("SLID", "DLID"),
                              pr(slid=int(off.lids.base[cas[1], 1]), dlid=int(off.lids.base[cas[3], 1])))  # fmt: skip
    assert recs[0][53] & 0xF == 0


def test_sl2vl_and_vlarb_records_answer_what_was_set() -> None:
    from sm.sa.port_tables import sl2vl_tables, vlarb_blocks

    f = fattree(2, 4)
    emu, _, snap = _sweep(f, QosConfig(True, ca=build_options({}, {"sl2vl": SL2VL_16})))
    cas = np.array([int(n) for n in f.cas], np.int64)
    got = sl2vl_tables(snap, cas, np.zeros_like(cas), np.ones_like(cas))
    for i, n in enumerate(cas.tolist()):
        want = emu.sl2vl(n, 0, 1)
        assert got[i].tolist() == (want[0::2] << 4 | want[1::2]).tolist()
    sw = int(f.switches[0])
    blk = vlarb_blocks(snap, np.array([sw]), np.array([2]), np.array([1]))
    assert blk[0].reshape(32, 2)[:8].tolist() == emu.vlarb(sw, 2, 1)[:8].tolist()
    status, _ = ask_direct(snap, SaMethod.GET_TABLE, 0, b"")  # (a PathRecord table: the SA still answers)
    assert status == 0


async def test_routes_api_shows_the_sl_and_each_hops_vl(monkeypatch: pytest.MonkeyPatch) -> None:
    def layers_of(f: Fabric, lids: Any, lft: Any) -> Any:
        return np.ones(lft.shape, np.uint8)  # every route on layer 1

    _layered(monkeypatch, layers_of)
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    snap = await _manager(emu, QosConfig(True)).heavy_sweep()
    client = TestClient(TestServer(create_app(Recorder(snap))))
    await client.start_server()
    try:
        resp = await client.get("/api/v1/routes", params={"src": "host-00001", "dst": "host-00006"})
        body = await resp.json()
    finally:
        await client.close()
    assert resp.status == 200, body
    assert body["sl"] == 1 and body["path_record"]["sl"] == 1
    vls = [h["vl"] for h in body["hops"]]
    assert vls[:-1] == [1] * (len(vls) - 1) and vls[-1] is None  # the destination sends nothing further


async def test_ipoib_group_gets_its_partitions_sl_with_qos_on() -> None:
    from sm.sa.mcast_groups import ipoib_mgid
    from tests.sa_rig import sa_rig

    f = fattree(2, 4)
    parts = parse_partitions("Default=0x7fff, ipoib : ALL=full ;\nB=0x0002, ipoib, sl=5 : ALL=full ;\n", "p.conf")
    for enabled, want in ((True, 5), (False, 0)):
        async with sa_rig(f, partitions=parts) as r:
            mgr = r.manager
            mgr.config = dataclasses.replace(mgr.config, qos=QosConfig(enabled))
            await mgr.heavy_sweep()  # (the rig wires the SA after its first sweep)
            assert mgr.mcast is not None
            g = mgr.mcast.get(ipoib_mgid(0x8002))
            assert g is not None
            assert int.from_bytes(g.record[44:48], "big") >> 28 == want  # MCMemberRecord.SL
            default = mgr.mcast.get(ipoib_mgid(0xFFFF))
            assert default is not None and default.record[44] >> 4 == 0


def test_layers_beyond_a_ports_vls_are_named() -> None:
    from sm.qos.plan import plan_qos

    f = fattree(2, 4)
    shape = f.port_exists.shape
    cols = {"known": f.port_exists.copy(), "CapabilityMask": np.full(shape, 0x40),
            "VLArbitrationLowCap": np.full(shape, 8), "VLArbitrationHighCap": np.full(shape, 8),
            "OperationalVLs": np.zeros(shape, np.int64)}  # fmt: skip
    ops = np.where(f.port_exists, 4, 0).astype(np.uint8)
    host = int(f.cas[2])
    ops[host, 1] = 2  # VL0-1 on one host's link
    plan = plan_qos(QosConfig(), f, cols, np.zeros(f.n_nodes, bool), ops, layers=4)
    t = plan.sl2vl_table(host, 0, 1)
    assert t is not None and t[:4].tolist() == [0, 1, 0, 1]
    assert any(p.startswith(f"{f.port_name(host, 1)}: 4 routing layers need VLs 0..3") for p in plan.problems)
    low = "0:0,1:4,2:0,3:4"  # VL 2 never scheduled (VL 0 is in the high table)
    plan = plan_qos(QosConfig(True, swe=build_options({}, {"vlarb_low": low})), f, cols, np.zeros(f.n_nodes, bool),
                    np.where(f.port_exists, 4, 0).astype(np.uint8), layers=3)  # fmt: skip
    sw = int(f.switches[0])
    says = f"{f.port_name(sw, 1)}: VL arbitration gives a layer's VL no weight"
    assert any(p.startswith(says) for p in plan.problems)
    assert plan.sl2vl_rows(np.array([sw]), np.array([2]), np.array([1])).tolist() == [list(pack(plan, sw, 1))]


def pack(plan: Any, n: int, p: int) -> bytes:
    b = plan.sl2vl_bytes(n, 0, p)
    assert b is not None
    return b


def test_ibfm_sm_qos_option_errors(tmp_path: Path) -> None:
    import subprocess
    import sys

    from fabric.formats.netfile import write_net

    net = tmp_path / "f.net"
    write_net(fattree(2, 4), net)
    for opt, says in (("qos_ca_sl2vl=1,2", "--qos-option qos_ca_sl2vl: 2 VLs"), ("colour=red", "expected NAME=VALUE"),
                      ("qos_swe_vlarb_low=0:300", "weight 300")):  # fmt: skip
        cp = subprocess.run([sys.executable, "-m", "ibfm", "sm", "--topology", str(net), "--qos", "--qos-option", opt],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert cp.returncode != 0 and says in cp.stderr, (opt, cp.stderr)
    bad = tmp_path / "q.conf"
    bad.write_text("port-groups\n  port-group\n    nme: x\n  end-port-group\nend-port-groups\n")
    cp = subprocess.run([sys.executable, "-m", "ibfm", "sm", "--topology", str(net), "--qos", "--qos-policy-file",
                         str(bad)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cp.returncode != 0 and f"{bad}:3:5: unknown port-group key 'nme'" in cp.stderr, cp.stderr
