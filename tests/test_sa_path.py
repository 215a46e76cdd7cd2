"""PathRecord answers over the emulated subnet (tests/sa_rig.py), and straight from the SA server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import numpy as np

from fabric.generate import fattree
from fabric.mad.sa import SaAttr, SaMethod, SaStatus, component_mask, parse_sa, sa_mad
from fabric.model import Fabric, Speed
from sm.sa.families import all_families
from sm.sa.path_record import rate_code
from sm.sa.server import SaServer
from sm.transport.base import MadAddress
from tests.sa_rig import sa_rig

A = int(SaAttr.PATH_RECORD)


def pr(**f: int) -> bytes:
    """A PathRecord query: SLID, DLID, SGUID/DGUID (link-local GIDs), NumbPath/Reversible, selectors."""
    q = bytearray(64)
    if "sguid" in f:
        q[24:32] = (0xFE80 << 48).to_bytes(8, "big")
        q[32:40] = f["sguid"].to_bytes(8, "big")
    if "dguid" in f:
        q[8:16] = (0xFE80 << 48).to_bytes(8, "big")
        q[16:24] = f["dguid"].to_bytes(8, "big")
    q[40:42] = f.get("dlid", 0).to_bytes(2, "big")
    q[42:44] = f.get("slid", 0).to_bytes(2, "big")
    q[49] = f.get("numb", 0)
    q[54] = f.get("mtu", 0)
    q[55] = f.get("rate", 0)
    q[56] = f.get("plt", 0)
    return bytes(q)


def mask(*names: str) -> int:
    return component_mask(A, names)


class _Capture:
    """A transport that keeps the SA's answers (one buffer per answer: 'kernel RMPP')."""

    kernel_rmpp = True

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def reply(self, mad: bytes, to: MadAddress) -> None:
        self.out.append(mad)


def ask_direct(snap: Any, method: int, cmask: int, data: bytes) -> tuple[int, list[bytes]]:
    """(status, records) of one request handed to a fresh SaServer (no transport, no RMPP)."""
    cap = _Capture()
    server = SaServer(cap, all_families(), lambda: snap)  # type: ignore[arg-type]
    before = server.stats.records
    asker = MadAddress(lid=snap.sm_lid, qpn=1, qkey=0x80010000)  # the SM's port: in every partition
    server.take(sa_mad(method, A, tid=7, component_mask=cmask, data=data), asker)
    raw = cap.out[-1]
    head = parse_sa(raw[:256])
    body = raw[56:]
    n = server.stats.records - before if head.attr_offset else 0
    return head.status, [body[i * 64 : (i + 1) * 64] for i in range(n)]


def fields(rec: bytes) -> dict[str, int]:
    return {
        "dguid": int.from_bytes(rec[16:24], "big"),
        "sguid": int.from_bytes(rec[32:40], "big"),
        "dlid": int.from_bytes(rec[40:42], "big"),
        "slid": int.from_bytes(rec[42:44], "big"),
        "rev": rec[49],
        "pkey": int.from_bytes(rec[50:52], "big"),
        "sl": rec[53],
        "mtu": rec[54],
        "rate": rec[55],
        "plt": rec[56],
        "pref": rec[57],
    }


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def ca_lids(snap: Any) -> list[int]:
    f = snap.fabric
    return [int(snap.lids.base[int(n), 1]) for n in f.cas]


def test_get_by_lids_and_by_gids() -> None:
    async def go() -> None:
        async with sa_rig() as r:
            snap = r.snap
            f = snap.fabric
            lids = ca_lids(snap)
            s, d = lids[0], lids[-2]
            ans = await r.ask(SaMethod.GET, A, component_mask=mask("SLID", "DLID"), data=pr(slid=s, dlid=d))
            assert ans.status == 0 and len(ans.records) == 1
            rec = ans.records[0]
            x = fields(rec)
            sn, dn = int(f.cas[0]), int(f.cas[-2])
            assert x["slid"] == s and x["dlid"] == d
            assert x["sguid"] == int(f.port_guid[sn, 1]) and x["dguid"] == int(f.port_guid[dn, 1])
            assert rec[8:16] == rec[24:32] == bytes.fromhex("fe80000000000000")
            assert rec[:8] == bytes(8) and rec[44:49] == bytes(5) and rec[58:] == bytes(6)
            assert x["rev"] == 0x80 and x["pkey"] == 0xFFFF and x["sl"] == 0
            assert x["mtu"] == 0x80 | 5 and x["rate"] == 0x80 | rate_code(2, Speed.NDR) == 0x80 | 21
            assert x["plt"] == 0x80 | 18 and x["pref"] == 0
            by_gid = await r.ask(
                SaMethod.GET,
                A,
                component_mask=mask("SGID", "DGID"),
                data=pr(sguid=x["sguid"], dguid=x["dguid"]),
            )
            assert by_gid.status == 0 and by_gid.records == [rec]
            # a port to itself: PacketLifeTime 0
            me = await r.ask(SaMethod.GET, A, component_mask=mask("SLID", "DLID"), data=pr(slid=s, dlid=s))
            assert me.status == 0 and me.records[0][56] == 0x80
            # SGID and SLID naming different ports
            bad = await r.ask(
                SaMethod.GET,
                A,
                component_mask=mask("SGID", "SLID", "DLID"),
                data=pr(sguid=x["sguid"], slid=lids[1], dlid=d),
            )
            assert bad.status == SaStatus.ERR_REQ_INVALID

    run(go())


def test_get_table_from_one_source_to_all() -> None:
    async def go() -> None:
        async with sa_rig() as r:
            snap = r.snap
            s = ca_lids(snap)[0]
            st, recs = ask_direct(snap, SaMethod.GET_TABLE, mask("SLID"), pr(slid=s))
            assert st == 0
            assert len(recs) == len(snap.lids.used())  # every end port with a LID (LMC 0), itself too
            assert {fields(x)["dlid"] for x in recs} == set(snap.lids.used().tolist())
            assert all(fields(x)["slid"] == s and fields(x)["rev"] == 0x80 for x in recs)
            # to all from one destination, and the same path both ways round
            st2, back = ask_direct(snap, SaMethod.GET_TABLE, mask("DLID"), pr(dlid=s))
            assert st2 == 0 and len(back) == len(recs)
            # NumbPath 0: nothing; a Get with only a source: one path
            st3, none = ask_direct(snap, SaMethod.GET_TABLE, mask("SLID", "NumbPath"), pr(slid=s, numb=0))
            assert st3 == 0 and none == []
            one = await r.ask(SaMethod.GET, A, component_mask=mask("SLID"), data=pr(slid=s))
            assert one.status == 0 and len(one.records) == 1
            # every pair
            st4, world = ask_direct(snap, SaMethod.GET_TABLE, 0, pr())
            n = len(snap.lids.used())
            assert st4 == 0 and len(world) == n * n

    run(go())


def test_selectors() -> None:
    async def go() -> None:
        async with sa_rig() as r:
            lids = ca_lids(r.snap)
            s, d = lids[0], lids[-1]
            base = mask("SLID", "DLID")
            sel_mtu = base | mask("MTUSelector", "MTU")

            async def get(cm: int, **kw: int) -> tuple[int, list[bytes]]:
                a = await r.ask(SaMethod.GET, A, component_mask=cm, data=pr(slid=s, dlid=d, **kw))
                return a.status, a.records

            assert (await get(sel_mtu, mtu=(0 << 6) | 5))[0] == SaStatus.ERR_NO_RECORDS  # > 4096
            st, rec = await get(sel_mtu, mtu=(0 << 6) | 4)  # > 2048
            assert st == 0 and rec[0][54] == 0x85
            st, rec = await get(sel_mtu, mtu=(1 << 6) | 4)  # < 2048: 1024
            assert st == 0 and rec[0][54] == 0x83
            st, rec = await get(sel_mtu, mtu=(2 << 6) | 3)  # exactly 1024
            assert st == 0 and rec[0][54] == 0x83
            st, rec = await get(sel_mtu, mtu=(3 << 6) | 1)  # best
            assert st == 0 and rec[0][54] == 0x85
            assert (await get(sel_mtu, mtu=(2 << 6) | 7))[0] == SaStatus.ERR_REQ_INVALID
            sel_rate = base | mask("RateSelector", "Rate")
            assert (await get(sel_rate, rate=(0 << 6) | 21))[0] == SaStatus.ERR_NO_RECORDS  # > 400
            st, rec = await get(sel_rate, rate=(2 << 6) | 16)  # exactly 100
            assert st == 0 and rec[0][55] == 0x80 | 16
            st, rec = await get(sel_rate, rate=(1 << 6) | 21)  # < 400: 300
            assert st == 0 and rec[0][55] == 0x80 | 18
            assert (await get(sel_rate, rate=(2 << 6) | 1))[0] == SaStatus.ERR_REQ_INVALID
            sel_plt = base | mask("PacketLifeTimeSelector", "PacketLifeTime")
            assert (await get(sel_plt, plt=(0 << 6) | 18))[0] == SaStatus.ERR_NO_RECORDS
            st, rec = await get(sel_plt, plt=(1 << 6) | 10)
            assert st == 0 and rec[0][56] == 0x80 | 9

    run(go())


def _degrade(f: Fabric, node: int, port: int, *, mtu: int | None = None, speed: Speed | None = None) -> None:
    pn, pp = int(f.peer_node[node, port]), int(f.peer_port[node, port])
    for n, p in ((node, port), (pn, pp)):
        if mtu is not None:
            f.mtu_cap[n, p] = mtu
        if speed is not None:
            f.speed_cap[n, p] = speed
            f.speed_active[n, p] = speed


def _crosses(snap: Any, src_lid: int, dst_lid: int, links: Iterable[tuple[int, int]]) -> bool:
    from sm.analysis.verify import trace_route

    lm = snap.lids
    n, p = int(lm.owner_node[src_lid]), int(lm.owner_port[src_lid])
    hops = trace_route(snap.fabric, lm, snap.lft, n, p, dst_lid)
    out = {(h.node, h.out_port) for h in hops}
    return any(link in out for link in links)


def test_degraded_link_lowers_only_the_paths_crossing_it() -> None:
    f = fattree(2, 4)
    leaf = int(f.by_name("leaf-00"))
    up_port = 3  # leaf-00 port 3: to spine 0
    _degrade(f, leaf, up_port, mtu=3, speed=Speed.EDR)
    spine, sport = int(f.peer_node[leaf, up_port]), int(f.peer_port[leaf, up_port])

    async def go() -> None:
        async with sa_rig(f) as r:
            snap = r.snap
            assert snap.fabric.mtu_active[leaf, up_port] in (0, 3) or snap.links.mtu[leaf, up_port] == 3
            for s in ca_lids(snap)[:2]:
                st, recs = ask_direct(snap, SaMethod.GET_TABLE, mask("SLID"), pr(slid=s))
                assert st == 0
                hit = miss = 0
                for rec in recs:
                    x = fields(rec)
                    crossing = _crosses(snap, s, x["dlid"], [(leaf, up_port), (spine, sport)])
                    back = _crosses(snap, x["dlid"], s, [(leaf, up_port), (spine, sport)])
                    if crossing:
                        hit += 1
                        assert x["mtu"] == 0x83 and x["rate"] == 0x80 | 16, x
                    else:
                        miss += 1
                        assert x["mtu"] == 0x85 and x["rate"] == 0x80 | 21, (x, back)
                assert hit and miss

    run(go())


def test_unknown_ends_and_bad_masks() -> None:
    async def go() -> None:
        async with sa_rig() as r:
            s = ca_lids(r.snap)[0]
            unused = r.snap.lids.max_lid + 5
            a = await r.ask(SaMethod.GET, A, component_mask=mask("SLID", "DLID"), data=pr(slid=s, dlid=unused))
            assert a.status == SaStatus.ERR_NO_RECORDS
            a = await r.ask(SaMethod.GET, A, component_mask=mask("SGID", "DLID"), data=pr(sguid=0xDEAD, dlid=s))
            assert a.status == SaStatus.ERR_NO_RECORDS
            st, recs = ask_direct(r.snap, SaMethod.GET_TABLE, mask("SLID"), pr(slid=unused))
            assert st == 0 and recs == []
            half = component_mask(A, []) | 1  # ServiceID's first bit only
            a = await r.ask(SaMethod.GET, A, component_mask=half | mask("SLID", "DLID"), data=pr(slid=s, dlid=s))
            assert a.status == SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS
            a = await r.ask(SaMethod.SET, A, component_mask=mask("SLID"), data=pr(slid=s))
            assert a.status == SaStatus.METHOD_ATTR_UNSUPPORTED

    run(go())


def test_lmc_paths_over_each_lid_pair() -> None:
    from sm.sa.path_record import _pairs

    si, di, pref = _pairs(2, 2)
    assert list(zip(si.tolist(), di.tolist(), pref.tolist(), strict=True)) == [
        (0, 0, 0),
        (1, 1, 0),
        (0, 1, 2),
        (1, 0, 2),
    ]
    assert np.array_equal(_pairs(1, 4)[1], np.arange(4))


def test_rate_codes_as_opensm() -> None:
    assert rate_code(2, Speed.QDR) == 7  # 4X QDR: 40 Gb/s (OpenSM on ibsim: Rate 0x87)
    assert rate_code(2, Speed.FDR10) == 7
    assert rate_code(2, Speed.FDR) == 12
    assert rate_code(2, Speed.EDR) == 16
    assert rate_code(2, Speed.HDR) == 17
    assert rate_code(2, Speed.NDR) == 21
    assert rate_code(1, Speed.SDR) == 2
    assert rate_code(8, Speed.QDR) == 10


def test_lmc_port_pairs() -> None:
    from fabric.emulator import EmulatedFabric
    from sm.sweep.manager import FabricManager, SmConfig
    from sm.transport.emulated import EmulatedTransport

    async def go() -> None:
        f = fattree(2, 4)
        sm = EmulatedTransport(EmulatedFabric(f), issm=True)
        try:
            mgr = FabricManager(sm, SmConfig(offload=False, check_credit_loops=False, lmc=1))
            snap = await mgr.heavy_sweep()
            a, b = int(f.cas[0]), int(f.cas[-1])
            ga, gb = int(f.port_guid[a, 1]), int(f.port_guid[b, 1])
            la, lb = int(snap.lids.base[a, 1]), int(snap.lids.base[b, 1])
            st, recs = ask_direct(snap, SaMethod.GET_TABLE, mask("SGID", "DGID"), pr(sguid=ga, dguid=gb))
            got = [(fields(x)["slid"], fields(x)["dlid"], fields(x)["pref"]) for x in recs]
            assert st == 0 and got == [(la, lb, 0), (la + 1, lb + 1, 0), (la, lb + 1, 2), (la + 1, lb, 2)]
            st, recs = ask_direct(snap, SaMethod.GET_TABLE, mask("SLID", "DGID"), pr(slid=la + 1, dguid=gb))
            assert [(fields(x)["slid"], fields(x)["dlid"]) for x in recs] == [(la + 1, lb), (la + 1, lb + 1)]
            cm = mask("SGID", "DGID", "NumbPath")
            st, recs = ask_direct(snap, SaMethod.GET_TABLE, cm, pr(sguid=ga, dguid=gb, numb=3))
            assert len(recs) == 3
            st, recs = ask_direct(snap, SaMethod.GET, mask("SGID", "DGID"), pr(sguid=ga, dguid=gb))
            assert st == 0 and len(recs) == 1 and fields(recs[0])["slid"] == la
            st, recs = ask_direct(snap, SaMethod.GET_TABLE, mask("SGID"), pr(sguid=ga))
            assert len(recs) == len(snap.lids.base.nonzero()[0]) * 4
        finally:
            await sm.close()

    run(go())


def _sweep(f: Fabric, **cfg: Any) -> Any:
    from fabric.emulator import EmulatedFabric
    from sm.sweep.manager import FabricManager, SmConfig
    from sm.transport.emulated import EmulatedTransport

    async def go() -> Any:
        sm = EmulatedTransport(EmulatedFabric(f), issm=True)
        try:
            return await FabricManager(sm, SmConfig(offload=False, check_credit_loops=False, **cfg)).heavy_sweep()
        finally:
            await sm.close()

    return run(go())


def _fast_path_snapshots() -> list[tuple[str, Any]]:
    """Snapshots that take every branch of the Get fast path: partitions that restrict (a limited member,
    two tenants), QoS levels, route layers, LMC 1, a link down."""
    import dataclasses

    from fabric.generate import degrade
    from sm.partitions.config import parse_partitions
    from sm.qos.config import QosConfig, parse_qos_policy

    f = fattree(2, 4)
    cas = [int(n) for n in f.cas]
    g = [f"{int(f.port_guid[n, 1]):#018x}" for n in cas]
    parts = parse_partitions(
        "Default=0x7fff : ALL=limited, SELF=full ;\n"
        f"A=0x8001, sl=5 : {', '.join(x + '=full' for x in g[:4])}, {g[4]} ;\n"
        f"B=0x0002 : {', '.join(x + '=full' for x in g[5:8])} ;\n",
        "p.conf",
    )
    policy = parse_qos_policy(
        "port-groups\n port-group\n  name: S\n  port-guid: " + g[6] + "\n end-port-group\n"
        " port-group\n  name: C\n  node-type: CA\n end-port-group\nend-port-groups\n"
        "qos-levels\n qos-level\n  name: L\n  sl: 3\n end-qos-level\nend-qos-levels\n"
        "qos-match-rules\n qos-match-rule\n  source: C\n  destination: S\n  qos-level-name: L\n"
        " end-qos-match-rule\nend-qos-match-rules\n",
        "q.conf",
    )
    plain = _sweep(f)
    tenants = _sweep(f, partitions=parts, qos=QosConfig(True, policy=policy))
    rng = np.random.default_rng(3)
    layered = dataclasses.replace(plain, layers=rng.integers(0, 4, plain.lft.shape).astype(np.uint8))
    return [
        ("plain", plain),
        ("partitions and QoS", tenants),
        ("layers", layered),
        ("layers, partitions and QoS", dataclasses.replace(tenants, layers=layered.layers)),
        ("LMC 1", _sweep(f, lmc=1)),
        ("a link down", _sweep(degrade(f, fraction=0.1, seed=1))),
        ("no partition plan", dataclasses.replace(plain, partitions=None, qos=None)),
    ]


def test_get_fast_path_answers_as_the_general_path() -> None:
    """SaServer.answer_in_place (PathRecordFamily.quick's function), else take_inline, and SaServer.take give the same
    bytes and the same counts for every kind of PathRecord Get, from askers in and out of partitions."""
    comps = ["SGID", "DGID", "SLID", "DLID", "P_Key", "Reversible", "NumbPath", "TClass", "SL", "MTUSelector",
             "MTU", "ServiceID", "RawTraffic"]  # fmt: skip
    for label, snap in _fast_path_snapshots():
        f = snap.fabric
        lids = snap.lids
        ends = [(int(n), int(p)) for n, p in np.argwhere(lids.base > 0).tolist()]
        tenant = [(int(n), 1) for n in f.cas[:5]]  # partition A of the tenants' snapshot
        rng = np.random.default_rng(7)
        general, fast = _Capture(), _Capture()
        s_gen = SaServer(general, all_families(), lambda snap=snap: snap)  # type: ignore[arg-type]
        s_fast = SaServer(fast, all_families(), lambda snap=snap: snap)  # type: ignore[arg-type]
        family = s_fast.families[A]
        warmup = sa_mad(SaMethod.GET, A, tid=1, component_mask=mask("SLID", "DLID"), data=pr(slid=1, dlid=1))
        for s in (s_gen, s_fast):
            s.take(warmup, MadAddress(lid=1, qpn=1, qkey=0x80010000))
        hits = placed = 0
        for i in range(1500):
            among = tenant if rng.random() < 0.5 else ends
            (sn, sp), (dn, dp), (an, ap) = (among[int(k)] for k in rng.integers(0, len(among), 3))
            slid = int(lids.base[sn, sp]) + int(rng.integers(0, 2))  # past the LMC range now and then
            dlid = int(lids.base[dn, dp]) + int(rng.integers(0, 2))
            if rng.random() < 0.05:
                dlid = int(rng.integers(0, 0xFFFF))
            sguid = int(f.port_guid[sn, sp]) if rng.random() < 0.95 else int(f.port_guid[dn, dp])
            dguid = int(f.port_guid[dn, dp])
            pick = [c for c in comps if rng.random() < (0.45 if c in ("SGID", "DGID", "SLID", "DLID") else 0.08)]
            data = bytearray(pr(slid=slid, dlid=dlid, sguid=sguid, dguid=dguid, numb=int(rng.integers(0, 256)),
                                mtu=int(rng.integers(0, 256))))  # fmt: skip
            data[50:52] = int(rng.choice([0xFFFF, 0x7FFF, 0x8001, 0x0001, 0x0002, 0x8002])).to_bytes(2, "big")
            data[53] = int(rng.integers(0, 16))
            if rng.random() < 0.1:
                data[8:16] = (0xFF02 << 48).to_bytes(8, "big")  # a multicast DGID
            elif rng.random() < 0.1:
                data[24:32] = (0x1234 << 48).to_bytes(8, "big")  # a foreign subnet
            raw = sa_mad(SaMethod.GET, A, tid=i, component_mask=mask(*pick), data=bytes(data))
            asker = MadAddress(lid=int(lids.base[an, ap]) if rng.random() < 0.95 else 0x3FF0, qpn=1, qkey=0x80010000)
            mine = bytearray(raw)
            rec = bytes(mine[56:120]) if family.quick(s_fast._cached[1])(memoryview(mine), 0, asker.lid) else None  # type: ignore[attr-defined]
            assert rec is not None or mine == raw  # nothing written when it does not answer
            s_gen.take(raw, asker)
            here = bytearray(raw)  # as the receive thread: in place, else take_inline (and reply)
            k = s_fast.answer_in_place(memoryview(here), 0, len(raw), asker.lid)
            if not k:
                assert here == raw
                assert s_fast.take_inline(raw, asker)
            placed += k > 0
            assert (bytes(here[:k]) if k else fast.out[-1]) == general.out[-1], (label, i, pick)
            if rec is not None:
                hits += 1
                assert general.out[-1][4:6] == b"\0\0" and general.out[-1][56:] == rec, (label, i, pick)
        assert hits > 100 and placed >= hits - 1, (label, hits, placed)  # (the first may keep the function)
        assert s_fast.stats.as_dict() == s_gen.stats.as_dict()
        assert s_fast.stats.by_attr == s_gen.stats.by_attr


def test_entry_rows_of_the_fast_path_are_entry_row() -> None:
    from sm.sa.path_record import _base, entry_row

    for _, snap in _fast_path_snapshots():
        b = _base(snap)
        want = [entry_row(snap, (n, p)) for n, p in zip(b.ep_node.tolist(), b.ep_port.tolist(), strict=True)]
        assert b.entry1 == [-1 if w is None else w for w in want]


def test_get_table_by_partition_class_answers_as_per_pair(monkeypatch: Any) -> None:
    """GetTables over a partition plan without QoS take each pair's P_Key by partition table class; the
    per-pair hooks (forced by wrapping them) give the same records."""
    import dataclasses

    import sm.sa.path_record as prm

    snaps = dict(_fast_path_snapshots())
    tenants = dataclasses.replace(snaps["partitions and QoS"], qos=None)
    cases = [snaps["plain"], tenants, dataclasses.replace(tenants, layers=snaps["layers"].layers), snaps["LMC 1"]]
    rng = np.random.default_rng(11)
    orig = prm.pair_pkey
    for snap in cases:
        f = snap.fabric
        lids = ca_lids(snap)
        queries = []
        for _ in range(12):
            s, d = (int(x) for x in rng.choice(lids, 2))
            sn = int(f.cas[lids.index(s)])
            asker = int(rng.choice(lids))
            for names, data in (
                (("SLID",), pr(slid=s)),
                (("DLID",), pr(dlid=d)),
                (("SGID", "P_Key"), bytearray(pr(sguid=int(f.port_guid[sn, 1])))),
                (("SLID", "SL", "NumbPath"), bytearray(pr(slid=s, numb=2))),
            ):
                data = bytearray(data)
                data[50:52] = int(rng.choice([0xFFFF, 0x8001, 0x0002])).to_bytes(2, "big")
                data[53] = int(rng.integers(0, 2))
                queries.append((mask(*names), bytes(data), asker))

        def answers(snap: Any = snap, queries: list[tuple[int, bytes, int]] = queries) -> list[bytes]:
            cap = _Capture()
            server = SaServer(cap, all_families(), lambda: snap)  # type: ignore[arg-type]
            for i, (cm, data, asker) in enumerate(queries):
                server.take(sa_mad(SaMethod.GET_TABLE, A, tid=i, component_mask=cm, data=data),
                            MadAddress(lid=asker, qpn=1, qkey=0x80010000))  # fmt: skip
            return cap.out

        fast = answers()
        monkeypatch.setattr(prm, "pair_pkey", lambda *a, **k: orig(*a, **k))
        assert answers() == fast
        monkeypatch.setattr(prm, "pair_pkey", orig)
        assert sum(len(x) > 56 for x in fast) > len(fast) // 3


def test_columns_traced_at_once_are_those_traced_one_by_one() -> None:
    from sm.sa.path_record import _base, _column, _trace_all

    for label, snap in _fast_path_snapshots():
        eager = _base(snap)
        _trace_all(eager)
        lazy = _base(snap)
        assert eager.cols and set(eager.cols) == set(np.flatnonzero(eager.ep_of_lid >= 0).tolist()), label
        for lid, (m, r) in eager.cols.items():
            m1, r1 = _column(lazy, lid)
            assert m.tolist() == m1.tolist() == eager.cols1[lid][0], (label, lid)
            assert r.tolist() == r1.tolist() == eager.cols1[lid][1], (label, lid)


def test_one_source_and_one_lid_read_as_pair_by_pair() -> None:
    """path_values from one end port to every LID (a row) and from every end port to one LID (a column)
    equal the pair-by-pair values, for every end port and every LID, in every kind of snapshot, and
    with LFT holes (no switch forwards to the first two hosts: a port still reaches itself)."""
    import dataclasses

    from sm.sa.path_record import _ONE_MIN, _base, _from_one, _path_values_pairs, _to_one, path_values

    snaps = _fast_path_snapshots()
    plain = snaps[0][1]
    holes = np.array(plain.lft, copy=True)
    holes[:, ca_lids(plain)[:2]] = 255
    for label, snap in [*snaps, ("LFT holes", dataclasses.replace(plain, lft=holes))]:
        b = _base(snap)
        n = b.ep_node.size
        every_lid = np.arange(b.ep_of_lid.size, dtype=np.intp)  # LID 0 and unused LIDs too
        every_port = np.arange(n, dtype=np.intp)
        assert n >= _ONE_MIN, label  # path_values reads rows and columns below
        for s in range(n):
            src = np.full(every_lid.size, s, np.intp)
            slow = _path_values_pairs(b, src, every_lid)
            for fast in (_from_one(b, s, every_lid), path_values(b, src, every_lid)):
                assert fast[0].tolist() == slow[0].tolist() and fast[1].tolist() == slow[1].tolist(), (label, s)
                assert fast[0].dtype == fast[1].dtype == np.uint8
        for lid in every_lid.tolist():
            dl = np.full(n, lid, np.intp)
            slow = _path_values_pairs(b, every_port, dl)
            for fast in (_to_one(b, every_port, lid), path_values(b, every_port, dl)):
                assert fast[0].tolist() == slow[0].tolist() and fast[1].tolist() == slow[1].tolist(), (label, lid)
                assert fast[0].dtype == fast[1].dtype == np.uint8


def test_get_table_records_are_the_gets_records() -> None:
    """A GetTable from one source (and to one destination) holds, record for record, what a Get of each
    of its port pairs answers, in every kind of snapshot with one LID per port."""
    for label, snap in _fast_path_snapshots():
        if snap.lids.lmc:
            continue
        lids = ca_lids(snap)
        for s in (lids[0], lids[5], int(snap.lids.base[int(snap.fabric.switches[0]), 0])):
            for side in ("SLID", "DLID"):
                st, table = ask_direct(snap, SaMethod.GET_TABLE, mask(side), pr(**{side.lower(): s}))
                assert st == 0 and table, (label, s, side)
                for rec in table:
                    f = fields(rec)
                    st1, one = ask_direct(
                        snap, SaMethod.GET, mask("SLID", "DLID"), pr(slid=f["slid"], dlid=f["dlid"])
                    )
                    assert st1 == 0 and one == [rec], (label, s, side, f)


def test_a_path_walked_alone_is_its_traced_cell() -> None:
    """_walk1 (a cold Get's one path, hop by hop) gives trace's values for every switch and LID, holes and
    down links included; path_value1 walks a LID's paths until _COLUMN_AFTER asked for it, then reads
    its column, with the same values throughout."""
    import dataclasses

    from sm.sa.path_record import _COLUMN_AFTER, _base, _trace_all, _walk1, path_value1, trace

    snaps = _fast_path_snapshots()
    plain = snaps[0][1]
    holes = np.array(plain.lft, copy=True)
    holes[:, ca_lids(plain)[:2]] = 255
    holes[0, ca_lids(plain)[2]] = 0  # port 0 of a switch that does not own the LID
    f = plain.fabric
    h = int(f.cas[4])
    leaf = int(f.peer_node[h, 1])
    wrong = next(p for p in range(1, f.port_exists.shape[1]) if int(f.peer_node[leaf, p]) in set(f.cas.tolist()) - {h})
    holes[_base(plain).row_of[leaf], ca_lids(plain)[4]] = wrong  # to another host
    for label, snap in [*snaps, ("LFT holes", dataclasses.replace(plain, lft=holes))]:
        b = _base(snap)
        n_sw, n_lid = int(b.sw.size), int(b.ep_of_lid.size)
        rows = np.repeat(np.arange(n_sw, dtype=np.intp), n_lid)
        lids = np.tile(np.arange(n_lid, dtype=np.intp), n_sw)
        m, r = trace(b, rows, lids)
        walked = [_walk1(b, row, lid) for row, lid in zip(rows.tolist(), lids.tolist(), strict=True)]
        assert walked == list(zip(m.tolist(), r.tolist(), strict=True)), label
        assert any(x != (0, 0) for x in walked) and any(x == (0, 0) for x in walked[n_lid:]), label
        # a lazy base (no column traced) answers as an eager one, walking first, then from the column
        eager, lazy = _base(snap), _base(snap)
        _trace_all(eager)
        host = b.ep_of_lid1[ca_lids(snap)[3]]
        far = ca_lids(snap)[-1]
        for k in range(1, _COLUMN_AFTER + 1):
            assert path_value1(lazy, host, far) == path_value1(eager, host, far) != (0, 0), label
            assert (far in lazy.cols1, lazy.walks.get(far)) == ((True, None) if k == _COLUMN_AFTER else (False, k))
        for dlid in range(1, n_lid):
            for src in range(b.ep_node.size):
                for _ in range(2):
                    assert path_value1(lazy, src, dlid) == path_value1(eager, src, dlid), (label, src, dlid)
