"""The SM core end to end on the emulated fabric: discovery, LIDs, programming, bring-up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from fabric.emulator import EmulatedFabric
from fabric.generate import GenerateError, degrade, fattree, ring
from fabric.model import Fabric, FabricBuilder, NodeType, PortState
from sm.sweep.discover import discover
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot, SweepError
from sm.sweep.program import lft_block_diff
from sm.transport.emulated import EmulatedTransport


def links_by_guid(f: Fabric) -> set[frozenset[tuple[int, int]]]:
    out = set()
    for a, b, c, d in f.link_array().tolist():
        out.add(frozenset({(int(f.node_guid[a]), b), (int(f.node_guid[c]), d)}))
    return out


def odd_fabric() -> Fabric:
    """Loops, a double link between two switches, a CA with two ports on different switches, a down port."""
    b = FabricBuilder()
    s = [b.add_node(NodeType.SWITCH, 8, f"sw{i}") for i in range(3)]
    h = [b.add_node(NodeType.CA, 1, f"h{i}") for i in range(3)]
    dual = b.add_node(NodeType.CA, 2, "dual")
    b.connect(s[0], 1, s[1], 1)
    b.connect(s[0], 2, s[1], 2)  # parallel link
    b.connect(s[1], 3, s[2], 3)
    b.connect(s[2], 4, s[0], 4)  # loop of three switches
    for i in range(3):
        b.connect(s[i], 5, h[i], 1)
    b.connect(s[0], 6, dual, 1)
    b.connect(s[2], 6, dual, 2)
    b.connect(s[1], 7, s[2], 7)
    f = b.build()
    f.link_down(s[1], 7)  # cabled, but down
    return f


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def bring_up(f: Fabric, config: SmConfig | None = None) -> tuple[EmulatedFabric, SubnetSnapshot]:
    emu = EmulatedFabric(f)

    async def go() -> SubnetSnapshot:
        t = EmulatedTransport(emu)
        return await FabricManager(t, config or SmConfig()).heavy_sweep()

    return emu, run(go())


def test_discovery_equals_the_emulated_fabric() -> None:
    f = odd_fabric()
    emu = EmulatedFabric(f)
    d = run(discover(EmulatedTransport(emu)))
    g = d.fabric
    assert not d.errors
    assert sorted(g.node_guid.tolist()) == sorted(f.node_guid.tolist())
    assert links_by_guid(g) == links_by_guid(f)
    for i in range(f.n_nodes):
        j = g.by_guid(int(f.node_guid[i]))
        assert g.nports[j] == f.nports[i]
        assert g.node_type[j] == f.node_type[i]
        assert g.descs[j] == f.descs[i]
    dual = g.by_name("dual")
    assert g.port_guid[dual, 1] != g.port_guid[dual, 2] != 0
    assert d.fabric.names[d.sm_node] == f.names[emu.local_port.node]


def test_discovery_of_a_generated_tree_matches() -> None:
    f = degrade(fattree(3, 4), links=3, seed=2)
    d = run(discover(EmulatedTransport(EmulatedFabric(f))))
    assert links_by_guid(d.fabric) == links_by_guid(f)
    assert d.fabric.n_nodes == f.n_nodes


def test_a_switch_that_does_not_answer_is_reported_and_the_rest_comes_up() -> None:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    spine = f.by_name(f.names[int(f.switches[-1])])
    emu.remove_node(spine)
    d = run(discover(EmulatedTransport(emu)))
    assert f.node_guid[spine] not in d.fabric.node_guid
    assert d.fabric.n_nodes == f.n_nodes - 1


def test_bring_up_full_fat_tree_every_port_active_and_routed() -> None:
    f = fattree(2, 8)
    emu, snap = bring_up(f)
    assert snap.up, snap.program.failures or snap.verify.failures
    assert snap.engine == "ftree"
    assert snap.credit_loops == ()
    # The emulator (physical truth) holds what the SM planned.
    up = emu.fabric.up_mask()
    assert (emu.fabric.state[up] == PortState.ACTIVE).all()
    g = snap.fabric
    for n, p in g.endports().tolist():
        m, q = emu.fabric.by_port_guid(int(g.port_guid[n, p]))
        assert emu.fabric.lid[m, q] == snap.lids.base[n, p]


def test_lft_blocks_match_what_the_switches_hold() -> None:
    f = fattree(2, 4)
    emu, snap = bring_up(f)
    g = snap.fabric
    for row, n in enumerate(g.switches.tolist()):
        erow = emu.switch_row(emu.fabric.by_guid(int(g.node_guid[n])))
        held = emu.lft[erow, : snap.lids.max_lid + 1]
        assert np.array_equal(held, snap.lft[row])


def test_second_sweep_sends_nothing_new_and_keeps_lids(tmp_path: Path) -> None:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    g2l = tmp_path / "guid2lid"

    async def go() -> tuple[SubnetSnapshot, SubnetSnapshot, SubnetSnapshot]:
        t = EmulatedTransport(emu)
        m = FabricManager(t, SmConfig(guid2lid=g2l))
        a = await m.heavy_sweep()
        b = await m.heavy_sweep()
        # A restart: a new manager reads the guid2lid file.
        c = await FabricManager(EmulatedTransport(emu), SmConfig(guid2lid=g2l)).heavy_sweep()
        return a, b, c

    a, b, c = run(go())
    assert b.program.blocks_sent == 0
    assert b.program.activated == 0
    for snap in (b, c):
        assert np.array_equal(snap.lids.base, a.lids.base)
    assert g2l.exists()


def test_minhop_on_a_ring_is_lifted_onto_a_second_vl() -> None:
    _, snap = bring_up(ring(6, 1), SmConfig(engines=("minhop",)))
    assert snap.engine == "minhop"
    assert snap.layers is not None and int(snap.layers.max()) == 1  # its credit loop moved to VL 1
    assert not snap.credit_loops  # counted per (link, VL)


def test_minhop_on_a_ring_with_one_vl_is_refused_not_deployed() -> None:
    with pytest.raises(SweepError, match="minhop"):
        bring_up(ring(6, 1), SmConfig(engines=("minhop",), max_vls=1))


def test_ftree_refuses_a_ring_and_the_chain_falls_back() -> None:
    _, snap = bring_up(ring(6, 1), SmConfig(engines=("ftree", "minhop")))
    assert snap.engine == "minhop"
    assert snap.refused and snap.refused[0][0] == "ftree"


@pytest.mark.parametrize("lmc", [1, 2])
def test_lmc_ranges_are_programmed(lmc: int) -> None:
    _, snap = bring_up(fattree(2, 4), SmConfig(lmc=lmc))
    assert snap.up
    bases = snap.lids.base[snap.lids.base > 0]
    assert (bases % (1 << lmc) == 0).all()


def test_block_diff() -> None:
    a = np.full(130, 255, np.uint8)
    b = a.copy()
    b[70] = 3
    assert lft_block_diff(b, a).tolist() == [1]
    assert lft_block_diff(b, None).tolist() == [0, 1, 2]
    assert lft_block_diff(a, a[:64]).tolist() == []


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    levels=st.sampled_from([2, 3]),
    radix=st.sampled_from([4, 6]),
    cut=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_property_degraded_trees_come_up_and_keep_lids(
    tmp_path_factory: pytest.TempPathFactory, levels: int, radix: int, cut: int, seed: int
) -> None:
    """Random degraded fat-trees: every connected pair routed, no credit loop, LIDs kept over a restart."""
    try:
        f = degrade(fattree(levels, radix), links=cut, seed=seed)
    except GenerateError:
        reject()  # more cuts than the tree takes without splitting
    g2l = tmp_path_factory.mktemp("g2l") / "guid2lid"
    emu = EmulatedFabric(f)

    async def go() -> tuple[SubnetSnapshot, SubnetSnapshot]:
        a = await FabricManager(EmulatedTransport(emu), SmConfig(guid2lid=g2l)).heavy_sweep()
        b = await FabricManager(EmulatedTransport(emu), SmConfig(guid2lid=g2l)).heavy_sweep()
        return a, b

    a, b = run(go())
    for snap in (a, b):
        assert snap.verify.ok, [str(x) for x in snap.verify.failures[:3]]
        assert snap.program.ok, snap.program.failures[:3]
        if snap.engine == "ftree":
            assert snap.credit_loops == ()
    ga = {int(a.fabric.port_guid[n, p]): int(a.lids.base[n, p]) for n, p in a.fabric.endports().tolist()}
    gb = {int(b.fabric.port_guid[n, p]): int(b.lids.base[n, p]) for n, p in b.fabric.endports().tolist()}
    assert ga == gb


def test_port_info_table_keeps_bytes_and_dicts_in_step() -> None:
    from fabric.mad import PORT_INFO
    from sm.sweep.discover import PortInfoTable

    a = PORT_INFO.pack({"LID": 7, "PortState": 2, "PortPhysicalState": 5, "LinkWidthSupported": 3})
    b = PORT_INFO.pack({"LID": 9, "PortState": 4, "PortPhysicalState": 5})
    t = PortInfoTable()
    t.update_raw([((1, 2), a)])
    assert (1, 2) in t and len(t) == 1 and list(t) == [(1, 2)]
    assert t[(1, 2)]["LID"] == 7 and t.get((1, 3)) is None and t.get((1, 3), {}) == {}
    first = t[(1, 2)]
    assert t[(1, 2)] is first  # decoded once
    t.update_raw([((1, 2), b)])  # a Set's answer: the old decoding is stale now
    assert t[(1, 2)]["LID"] == 9 and t[(1, 2)]["PortState"] == 4 and t.raw((1, 2)) == b
    copy = t.copy()
    t[(1, 2)] = dict(t[(1, 2)], LID=11)  # a dict given: its bytes are packed when asked for
    assert PORT_INFO.unpack(t.raw((1, 2)))["LID"] == 11 and t[(1, 2)]["LID"] == 11
    assert copy[(1, 2)]["LID"] == 9 and copy.raw((1, 2)) == b  # the copy is its own
    assert t.raw((5, 5)) is None
    del t[(1, 2)]
    assert (1, 2) not in t and len(copy) == 1


async def test_an_active_port_keeps_its_mtu_until_its_link_trains_again() -> None:
    # NeighborMTU and OperationalVLs go out with the Set that arms a link (as OpenSM sets them),
    # not to ports carrying traffic.
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    t = EmulatedTransport(emu)
    assert (await FabricManager(t, SmConfig(max_mtu=5)).heavy_sweep()).up
    mgr = FabricManager(t, SmConfig(max_mtu=4))
    again = await mgr.heavy_sweep()
    # A new master's first sweep only tells the hosts to re-register (as OpenSM does).
    assert again.up and again.program.port_sets == again.program.reregistered == f.cas.size
    up = emu.fabric.up_mask()
    up[:, 0] = False
    assert (emu.fabric.mtu_active[up] == 5).all()
    # One inter-switch link trains again: both its ends get the new MTU, and go ACTIVE.
    n = int(f.switches[0])
    p = next(q for q in np.flatnonzero(up[n]).tolist() if f.is_switch(int(f.peer_node[n, q])))
    m, q = int(emu.fabric.peer_node[n, p]), int(emu.fabric.peer_port[n, p])
    emu.link_down(n, p)
    await mgr.sweep()
    emu.link_up(n, p)
    snap = await mgr.sweep()
    assert snap is not None and snap.up
    assert emu.fabric.mtu_active[n, p] == emu.fabric.mtu_active[m, q] == 4
    assert emu.fabric.state[n, p] == emu.fabric.state[m, q] == PortState.ACTIVE


class _LoseReads(EmulatedTransport):
    """Drops every PortInfo Get along ``path`` while it is set."""

    path: tuple[int, ...] | None = None

    def _post(self, mad: bytes, route: tuple[int, ...] | int) -> None:
        from fabric.mad import Method, SmpAttr, parse_mad

        m = parse_mad(mad)
        if self.path is not None and route == self.path and m.attr_id == SmpAttr.PORT_INFO and m.method == Method.GET:
            return
        super()._post(mad, route)


async def test_a_link_that_came_back_is_armed_though_the_read_of_its_far_end_was_lost() -> None:
    emu = EmulatedFabric(fattree(2, 4))
    t = _LoseReads(emu, timeout=0.01, retries=1)
    mgr = FabricManager(t, SmConfig(engines=("minhop",)))
    snap = await mgr.heavy_sweep()
    f = snap.fabric
    host = next(int(h) for h in f.cas.tolist() if h != snap.discovery.sm_node)
    sw, sp = int(f.peer_node[host, 1]), int(f.peer_port[host, 1])
    eh = emu.fabric.by_guid(int(f.node_guid[host]))
    esw, esp = int(emu.fabric.peer_node[eh, 1]), int(emu.fabric.peer_port[eh, 1])
    emu.link_down(esw, esp)
    await mgr.sweep()
    emu.link_up(esw, esp)
    t.path = (*snap.discovery.paths[sw], sp)  # the light sweep's read of the host's PortInfo is lost
    after = await mgr.sweep()
    t.path = None
    assert after is not None and after.program.ok, after.program.failures if after else None
    assert emu.fabric.state[eh, 1] == emu.fabric.state[esw, esp] == PortState.ACTIVE


async def test_a_routing_failure_leaves_a_live_fabric_as_it_was(tmp_path: Path) -> None:
    from sm.sweep.manager import SweepError

    emu = EmulatedFabric(ring(4, 2))
    f = emu.fabric
    ep = f.endports()
    g2l = tmp_path / "guid2lid"  # another SM's LIDs: 101, 102, ...
    g2l.write_text("".join(f"{int(f.port_guid[n, p]):#018x} {101 + k} {101 + k}\n\n" for k, (n, p) in enumerate(ep)))
    first = await FabricManager(EmulatedTransport(emu), SmConfig(engines=("minhop",), guid2lid=g2l)).heavy_sweep()
    assert first.up
    lids, lfts, tops = f.lid[ep[:, 0], ep[:, 1]].copy(), emu.lft.copy(), emu.lft_top.copy()
    with pytest.raises(SweepError) as e:  # ftree refuses a ring; no other engine given
        await FabricManager(EmulatedTransport(emu), SmConfig(engines=("ftree",))).heavy_sweep()
    assert e.value.stage == "routing"
    # Taking over would move every LID to 1..: not before routes exist for them.
    assert (f.lid[ep[:, 0], ep[:, 1]] == lids).all() and (emu.lft == lfts).all() and (emu.lft_top == tops).all()


@pytest.mark.parametrize("offload", [True, False])
async def test_the_sm_loses_its_own_link_and_finds_the_fabric_again(offload: bool) -> None:
    f = fattree(2, 4)
    emu = EmulatedFabric(f)
    mgr = FabricManager(EmulatedTransport(emu), SmConfig(offload=offload))
    first = await mgr.heavy_sweep()
    d = first.discovery
    own = emu.fabric.by_guid(int(first.fabric.node_guid[d.sm_node]))
    emu.link_down(own, d.sm_port)
    alone = await mgr.sweep()  # only the SM's own node answers: no crash, nothing to route
    assert alone is not None and alone.fabric.n_nodes == 1 and alone.verify.pairs == 0
    emu.link_up(own, d.sm_port)
    back = await mgr.sweep()
    assert back is not None and back.up and back.fabric.n_nodes == first.fabric.n_nodes
