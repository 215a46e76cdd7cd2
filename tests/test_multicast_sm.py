"""Multicast in the SM: the IPoIB broadcast group made at start, MFTs programmed on joins and leaves.

Over the emulated fat tree: hosts join through the SA as IPoIB does; the sweeper programs the
switches' MulticastForwardingTables; a flood along the MFTs the switches hold (read back from the
emulator) reaches every member exactly once and never loops.
"""

from __future__ import annotations

from fabric.generate import fattree
from fabric.mad.sa import SaMethod
from sm.multicast.mft import MCAST_LID_FIRST
from sm.multicast.tree import tree_faults
from sm.sa.mcast_groups import ipoib_mgid
from sm.sa.mcmember_record import CREATE_MASK, JOIN_MASK
from sm.sweep.manager import FabricManager
from tests.sa_rig import SaRig, sa_rig
from tests.test_sa_mcmember import ask, gid, guid_of, host_at, mc, mcr

SET, DELETE = SaMethod.SET, SaMethod.DELETE
BROADCAST = ipoib_mgid(0xFFFF)


def held_masks(r: SaRig, mlid: int) -> dict[int, int]:
    """Per switch node, the port mask its MFT holds for ``mlid`` (as ibroute -M would read it)."""
    f = r.emu.fabric
    out: dict[int, int] = {}
    for s in f.switches.tolist():
        row = r.emu.mft(s)[mlid - MCAST_LID_FIRST]
        mask = sum(int(m) << (16 * p) for p, m in enumerate(row.tolist()))
        if mask:
            out[s] = mask
    return out


async def settle(mgr: FabricManager) -> None:
    """Let the sweeper do what the SA asked of it (joins and leaves: an MFT pass)."""
    await mgr.sweep()


async def test_broadcast_group_at_start_and_mfts_follow_joins_and_leaves() -> None:
    f = fattree(2, 4)
    async with sa_rig(f) as r:
        mgr = r.manager
        await mgr.heavy_sweep()  # (the rig wires the SA after its first sweep)
        g = mc(r).get(BROADCAST)
        assert g is not None and g.permanent and g.mlid == MCAST_LID_FIRST
        assert g.pkey == 0xFFFF
        mlid = g.mlid
        assert held_masks(r, mlid) == {}  # no member: no tree
        cas = [int(n) for n in f.cas]
        members = []
        for node in cas[1:6]:
            async with host_at(r, node) as t:
                port = gid(guid_of(r, t))
                ans = await ask(r, t, SET, JOIN_MASK, mcr(BROADCAST, port, 1, Q_Key=0x0B1B))
                assert ans.status == 0, ans
                members.append((node, 1))
        await settle(mgr)
        rep = mgr.mft_report
        assert rep is not None and not rep.failures and rep.blocks_sent > 0
        masks = held_masks(r, mlid)
        assert tree_faults(f, masks, members) == []
        # a flood from any member reaches every other member once: tree_faults checks it for all senders
        sent = rep.blocks_sent
        # nothing changed: nothing sent again
        await mgr.heavy_sweep()
        assert mgr.mft_report is not None and mgr.mft_report.blocks_sent == 0, mgr.mft_report
        # two members leave: the tree shrinks, and only the blocks that change go out
        for node in cas[4:6]:
            async with host_at(r, node) as t:
                port = gid(guid_of(r, t))
                ans = await ask(r, t, DELETE, JOIN_MASK, mcr(BROADCAST, port, 1, Q_Key=0x0B1B))
                assert ans.status == 0, ans
        await settle(mgr)
        rest = members[:3]
        assert tree_faults(f, held_masks(r, mlid), rest) == []
        assert 0 < mgr.mft_report.blocks_sent <= sent
        # the group stays (permanent) though its members may all go
        for node in cas[1:4]:
            async with host_at(r, node) as t:
                await ask(r, t, DELETE, JOIN_MASK, mcr(BROADCAST, gid(guid_of(r, t)), 1, Q_Key=0x0B1B))
        await settle(mgr)
        assert mc(r).get(BROADCAST) is not None and held_masks(r, mlid) == {}


async def test_a_group_a_host_creates_gets_a_tree_and_goes_with_its_last_member() -> None:
    f = fattree(2, 4)
    mgid = bytes.fromhex("ff15" + "00" * 13 + "07")
    async with sa_rig(f) as r:
        mgr = r.manager
        cas = [int(n) for n in f.cas]
        async with host_at(r, cas[2]) as a, host_at(r, cas[6]) as b:
            create = mcr(mgid, gid(guid_of(r, a)), 1, Q_Key=0x99, TClass=0, FlowLabel=0, SL=0)
            ans = await ask(r, a, SET, CREATE_MASK, create)
            assert ans.status == 0, ans
            ans = await ask(r, b, SET, JOIN_MASK, mcr(mgid, gid(guid_of(r, b)), 1, Q_Key=0x99))
            assert ans.status == 0, ans
            await settle(mgr)
            g = mc(r).get(mgid)
            assert g is not None
            assert tree_faults(f, held_masks(r, g.mlid), [(cas[2], 1), (cas[6], 1)]) == []
            mlid = g.mlid
            for t in (a, b):
                ans = await ask(r, t, DELETE, JOIN_MASK, mcr(mgid, gid(guid_of(r, t)), 1, Q_Key=0x99))
                assert ans.status == 0
            await settle(mgr)
            assert mc(r).get(mgid) is None and held_masks(r, mlid) == {}


async def test_a_partition_taken_out_takes_its_broadcast_group_with_it() -> None:
    from sm.partitions.config import parse_partitions

    f = fattree(2, 4)
    with_b = "Default=0x7fff, ipoib : ALL=full ;\nB=0x0002, ipoib : ALL=full ;\n"
    async with sa_rig(f, partitions=parse_partitions(with_b, "p.conf")) as r:
        mgr = r.manager
        await mgr.heavy_sweep()  # (the rig wires the SA after its first sweep)
        b_group = ipoib_mgid(0x8002)
        g = mc(r).get(b_group)
        assert g is not None and g.permanent and mc(r).get(BROADCAST) is not None
        mlid = g.mlid
        in_use = mc(r).pool.in_use
        mgr.set_partitions(parse_partitions("Default=0x7fff, ipoib : ALL=full ;\n", "p.conf"))
        await mgr.sweep()
        assert mc(r).get(b_group) is None and mlid not in mc(r).pool  # no member held it: gone, MLID free
        assert mc(r).pool.in_use == in_use - 1 and mc(r).get(BROADCAST) is not None
        assert held_masks(r, mlid) == {}
