"""Partitions in the SM: P_Key tables and enforcement programmed, the SA answering by partition.

Over the emulated fat tree (which keeps P_Key tables and enforcement bits as a switch does):
what the plan says is what the ports hold; a second sweep writes nothing; a changed file
sends only the blocks that change; PathRecords exist only between ports that may talk.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from fabric.emulator import EmulatedFabric
from fabric.formats.netfile import write_net
from fabric.generate import fattree
from fabric.mad.sa import PKEY_TABLE_RECORD, SaAttr, SaMethod, component_mask
from fabric.model import Fabric
from sm.partitions.config import PartitionConfig, parse_partitions
from sm.sweep.manager import FabricManager, SmConfig
from sm.transport.emulated import EmulatedTransport
from tests.sa_rig import sa_rig

GET, TABLE = SaMethod.GET, SaMethod.GET_TABLE
PR = int(SaAttr.PATH_RECORD)


def guid(f: object, node: int) -> str:
    return f"{int(f.port_guid[node, 1]):#018x}"  # type: ignore[attr-defined]


def two_tenants(f: object) -> str:
    """Hosts 0-3 full members of 0x8001, host 4 limited; hosts 5-7 full members of 0x8002."""
    cas = [int(n) for n in f.cas]  # type: ignore[attr-defined]
    a = ", ".join(f"{guid(f, n)}=full" for n in cas[:4])
    b = ", ".join(f"{guid(f, n)}=full" for n in cas[5:8])
    return f"Default=0x7fff : ALL=limited, SELF=full ;\nA=0x8001, ipoib : {a}, {guid(f, cas[4])} ;\nB=0x0002 : {b} ;\n"


def two_tenant_sm() -> tuple[Fabric, EmulatedFabric, PartitionConfig, FabricManager]:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    cfg = parse_partitions(two_tenants(f), "two.conf")
    mgr = FabricManager(
        EmulatedTransport(emu, issm=True), SmConfig(offload=False, check_credit_loops=False, partitions=cfg)
    )
    return f, emu, cfg, mgr


async def test_tables_and_enforcement_programmed_then_left_alone() -> None:
    f, emu, cfg, mgr = two_tenant_sm()
    snap = await mgr.heavy_sweep()
    assert snap.up, snap.program.failures
    plan = snap.partitions
    assert plan is not None and not plan.problems
    for (n, p), table in plan.tables.items():
        held = emu.pkey_table(n, p)
        assert held[: len(table)].tolist() == list(table), (f.port_name(n, p), table)
        assert not held[len(table) :].any()
    cas = [int(n) for n in f.cas]
    # host 0 (the SM) is a full member of the default; hosts 1-3 limited members of it, full of A
    assert sorted(emu.pkey_table(cas[1], 1)[:3].tolist()) == sorted([0x7FFF, 0x8001, 0])
    assert 0x0001 in emu.pkey_table(cas[4], 1).tolist()  # limited member of A
    # the switch port facing each CA enforces, with that CA's keys; switch-to-switch ports do not
    for n in cas:
        peer, pp = int(f.peer_node[n, 1]), int(f.peer_port[n, 1])
        assert emu.part_enforce_in[peer, pp] == 1 and emu.part_enforce_out[peer, pp] == 1
        keys = {k for k in emu.pkey_table(peer, pp).tolist() if k}
        assert keys == {k for k in emu.pkey_table(n, 1).tolist() if k}
    for s in f.switches.tolist():
        for p in range(1, int(f.nports[s]) + 1):
            if f.is_switch(int(f.peer_node[s, p])):
                assert emu.part_enforce_in[s, p] == 0 == emu.part_enforce_out[s, p]
    # a second sweep, and a second SM process (nothing held in memory): nothing to write
    again = await mgr.heavy_sweep()
    assert again.program.pkey_blocks_sent == 0 and again.program.enforcement_sets == 0
    fresh = await FabricManager(
        EmulatedTransport(emu, issm=True), SmConfig(offload=False, check_credit_loops=False, partitions=cfg)
    ).heavy_sweep()
    assert fresh.program.pkey_blocks_sent == 0 and fresh.program.enforcement_sets == 0
    assert fresh.program.port_sets == fresh.program.reregistered  # (a new master asks hosts to re-register)
    assert fresh.program.pkey_blocks_skipped > 0


async def test_a_changed_file_sends_only_changed_blocks_and_keeps_indexes() -> None:
    f, emu, _, mgr = two_tenant_sm()
    await mgr.heavy_sweep()
    cas = [int(n) for n in f.cas]
    before = {n: emu.pkey_table(n, 1).copy() for n in cas}
    # host 7 joins A as a full member: its table and its switch port's change, nobody else's
    text = two_tenants(f).replace(f"{guid(f, cas[4])} ;", f"{guid(f, cas[4])}, {guid(f, cas[7])}=full ;")
    mgr.set_partitions(parse_partitions(text, "two.conf"))
    snap = await mgr.heavy_sweep()
    assert snap.up
    changed = [n for n in cas if not np.array_equal(emu.pkey_table(n, 1), before[n])]
    assert changed == [cas[7]]
    assert snap.program.pkey_blocks_sent == 2  # host 7's block 0 and its switch port's
    old = [k for k in before[cas[7]].tolist()]
    new = emu.pkey_table(cas[7], 1).tolist()
    assert all(new[i] == k for i, k in enumerate(old) if k)  # the keys it had keep their indexes
    assert 0x8001 in new


async def test_path_records_only_inside_partitions() -> None:
    f = fattree(2, 4)
    cfg = parse_partitions(two_tenants(f), "two.conf")
    cas = [int(n) for n in f.cas]
    async with sa_rig(f, host_node=cas[1], partitions=cfg) as r:
        lid = {n: int(r.emu.fabric.lid[n, 1]) for n in cas}
        mask = component_mask(PR, ["SLID", "DLID"])

        async def pr(a: int, b: int, pkey: int | None = None) -> tuple[int, int | None]:
            names = ["SLID", "DLID"] + (["P_Key"] if pkey is not None else [])
            data = bytearray(64)
            data[40:42] = lid[b].to_bytes(2, "big")
            data[42:44] = lid[a].to_bytes(2, "big")
            if pkey is not None:
                data[50:52] = pkey.to_bytes(2, "big")
            ans = await r.ask(GET, PR, component_mask=component_mask(PR, names), data=bytes(data))
            return ans.status, int.from_bytes(ans.records[0][50:52], "big") if ans.records else None

        assert mask
        assert await pr(cas[1], cas[2]) == (0, 0x8001)  # full and full in A (both limited in the default)
        assert await pr(cas[1], cas[4]) == (0, 0x8001)  # full and limited
        assert (await pr(cas[4], cas[1]))[1] == 0x0001  # as the source holds it: limited
        assert (await pr(cas[1], cas[5]))[0] == 0x0300  # A and B share nothing: no record
        # B's pair shares 0x8002, but the asker (host 1: A, and a limited member of the default) shares
        # nothing with them: OpenSM answers only paths whose both ends the requester may reach
        assert await pr(cas[5], cas[6]) == (0x0300, None)
        assert (await pr(cas[1], cas[2], 0x8002))[0] == 0x0300  # a key they do not share
        assert await pr(cas[0], cas[2]) == (0, 0xFFFF)  # the SM is a full member of the default
        assert await pr(cas[0], cas[5]) == (0x0300, None)  # host 5: limited in the default, as the asker
        # PKeyTableRecord (trusted) of host 1's port: what it holds
        data = PKEY_TABLE_RECORD.pack({"LID": lid[cas[1]], "BlockNum": 0, "PortNum": 1})
        ans = await r.ask(
            GET, SaAttr.PKEY_TABLE_RECORD, component_mask=component_mask(int(SaAttr.PKEY_TABLE_RECORD),
                                                                      ["LID", "BlockNum", "PortNum"]),
            data=data, sm_key=1,
        )  # fmt: skip
        keys = np.frombuffer(ans.records[0][8:72], ">u2")
        assert ans.status == 0 and keys.tolist() == r.emu.pkey_table(cas[1], 1)[:32].tolist()


def test_a_bad_file_stops_ibfm_sm_before_any_mad(tmp_path: Path) -> None:
    net = tmp_path / "f.net"
    write_net(fattree(2, 4), net)
    bad = tmp_path / "bad.conf"
    bad.write_text("Default=0x7fff : ALL=full ;\nstorage=0x10000 : ALL ;\n")
    cp = subprocess.run(
        [sys.executable, "-m", "ibfm.cli", "sm", "--topology", str(net), "--partitions", str(bad)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert cp.returncode == 2 and cp.stdout == ""
    lines = cp.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ibfm: error: {bad}:2:"), cp.stderr
