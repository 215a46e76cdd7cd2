"""Multicast spanning trees (root, branches, flood check) and MFT blocks, MLID allocation."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import networkx as nx
import numpy as np
import pytest

from fabric.generate import degrade, fattree, torus
from fabric.model import Fabric, FabricBuilder, NodeType
from sm.lidmap import LidMap, sequential_lids
from sm.multicast.mft import (
    MCAST_LID_FIRST,
    MlidPool,
    MlidPoolError,
    block_payload,
    masks_of,
    mft_attr_mod,
    mft_blocks_changed,
    mft_positions,
    mft_table,
    n_positions,
    parse_mft_attr_mod,
)
from sm.multicast.tree import (
    Branches,
    EndPort,
    McastError,
    McastTree,
    TreeFault,
    build_tree,
    flood,
    hop_table,
    mask_ports,
    root_switch,
    tree_faults,
    verify_tree,
)
from sm.routing.base import Lft, route

BRANCHES: tuple[Branches, ...] = ("lft", "hops")


@dataclass(frozen=True)
class Routed:
    fabric: Fabric
    lids: LidMap
    lft: Lft
    engine: str


FABRICS = {
    "fattree-2-4": (lambda: fattree(2, 4), "ftree"),
    "fattree-3-4": (lambda: fattree(3, 4), "ftree"),
    "torus-3x4": (lambda: torus([3, 4], 2), "updn"),
    "degraded-3-8": (lambda: degrade(fattree(3, 8), links=4, seed=1), "ftree"),
    "degraded-3-4": (lambda: degrade(fattree(3, 4), fraction=0.2, seed=3), "updn"),
}


@functools.cache
def routed(name: str) -> Routed:
    make, _ = FABRICS[name]
    f = make()
    lids = sequential_lids(f)
    res = route(f, lids, ["ftree", "updn", "minhop"])
    return Routed(f, lids, res.lft, res.engine)


def hosts(f: Fabric) -> list[EndPort]:
    return [(int(c), 1) for c in f.cas.tolist()]


def random_groups(f: Fabric, seed: int) -> list[list[EndPort]]:
    """Groups of 2, 3 and 5 hosts, half the hosts, all of them, and two with switches' port 0 in."""
    rng = np.random.default_rng(seed)
    h = hosts(f)
    sw = f.switches.tolist()

    def pick(k: int) -> list[EndPort]:
        return [h[i] for i in rng.choice(len(h), k, replace=False).tolist()]

    groups = [pick(2), pick(3), pick(5), pick(len(h) // 2), h]
    groups.append(pick(4) + [(s, 0) for s in rng.choice(sw, 2, replace=False).tolist()])
    groups.append([(s, 0) for s in rng.choice(sw, 3, replace=False).tolist()])
    return groups


def check_is_tree(t: McastTree) -> None:
    """Every switch with a mask hangs from the root by a chain of single parents."""
    assert t.root is not None
    assert set(t.masks) == set(t.parent) | {t.root}
    for s in t.masks:
        seen = {s}
        while s != t.root:
            s = t.parent[s]
            assert s not in seen
            seen.add(s)


# -- trees on routed fabrics ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_fabrics_route_with_the_expected_engine(name: str) -> None:
    assert routed(name).engine == FABRICS[name][1]


@pytest.mark.parametrize("branches", BRANCHES)
@pytest.mark.parametrize("name", sorted(FABRICS))
@pytest.mark.parametrize("seed", [1, 2])
def test_flood_from_every_member_reaches_every_other_once(name: str, branches: Branches, seed: int) -> None:
    r = routed(name)
    hops = hop_table(r.fabric)
    for members in random_groups(r.fabric, seed):
        t = build_tree(r.fabric, r.lids, r.lft, members, hops=hops, branches=branches)
        assert t.unreachable == ()
        assert t.root == root_switch(r.fabric, members, hops)
        check_is_tree(t)
        verify_tree(r.fabric, t)


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_lft_branches_are_unicast_hops_toward_members_below(name: str) -> None:
    r = routed(name)
    f = r.fabric
    row_of = {n: i for i, n in enumerate(f.switches.tolist())}
    for members in random_groups(f, 3):
        t = build_tree(f, r.lids, r.lft, members)
        below: dict[int, set[int]] = {s: set() for s in t.masks}  # member LIDs under each switch
        for n, p in members:
            s = n if f.is_switch(n) else int(f.peer_node[n, p])
            while True:
                below[s].add(int(r.lids.base[n, p]))
                if s == t.root:
                    break
                s = t.parent[s]
        for child, par in t.parent.items():
            ports = [p for p in mask_ports(t.masks[par]) if p and f.peer_node[par, p] == child]
            assert len(ports) == 1
            assert any(r.lft[row_of[par], lid] == ports[0] for lid in below[child])


@pytest.mark.parametrize("name", ["torus-3x4", "degraded-3-4", "degraded-3-8"])
def test_hops_branches_take_the_lowest_least_hop_port(name: str) -> None:
    """OpenSM's rule checked against hop counts from networkx, not the module's hop table."""
    r = routed(name)
    f = r.fabric
    g = nx.Graph()
    g.add_nodes_from(f.switches.tolist())
    g.add_edges_from((a, b) for a, _p, b, _q in f.switch_links().tolist())
    dist = dict(nx.all_pairs_shortest_path_length(g))
    for members in random_groups(f, 4):
        t = build_tree(f, r.lids, r.lft, members, branches="hops")
        for n, p in members:
            s = n if f.is_switch(n) else int(f.peer_node[n, p])
            path = [s]
            while path[-1] != t.root:
                path.append(t.parent[path[-1]])
            path.reverse()
            for a, b in itertools.pairwise(path):
                nearer = [
                    q
                    for q in range(1, int(f.nports[a]) + 1)
                    if f.is_up(a, q) and f.is_switch(int(f.peer_node[a, q]))
                    if dist[int(f.peer_node[a, q])][s] == dist[a][s] - 1
                ]
                assert f.peer_node[a, nearer[0]] == b
                assert t.masks[a] >> nearer[0] & 1


# -- hand-made fabrics ---------------------------------------------------------------------------------


def diamond() -> tuple[Fabric, dict[str, int]]:
    """R to X by P1 (R port 1) or P2 (R port 2); R to W by Y. c1, c2 on X (ports 5, 6), c3 on W."""
    fb = FabricBuilder()
    n = {s: fb.add_node(NodeType.SWITCH, 8, s) for s in ("R", "P1", "P2", "X", "Y", "W")}
    for a, pa, b, pb in (("R", 1, "P1", 1), ("R", 2, "P2", 1), ("R", 3, "Y", 1), ("P1", 2, "X", 1), ("P2", 2, "X", 2)):
        fb.connect(n[a], pa, n[b], pb)
    fb.connect(n["Y"], 2, n["W"], 1)
    for ca, sw, port in (("c1", "X", 5), ("c2", "X", 6), ("c3", "W", 5)):
        n[ca] = fb.add_node(NodeType.CA, 1, ca)
        fb.connect(n[ca], 1, n[sw], port)
    return fb.build(), n


def test_reconverging_routes_are_grafted_into_a_tree() -> None:
    f, n = diamond()
    lids = sequential_lids(f)
    lft = route(f, lids, ["minhop"]).lft
    row = {s: i for i, s in enumerate(f.switches.tolist())}
    c1, c2, c3 = ((n[c], 1) for c in ("c1", "c2", "c3"))
    lid1, lid2 = int(lids.base[c1]), int(lids.base[c2])
    assert lid1 < lid2
    # R reaches c1 by P1 and c2 by P2: both routes enter X, from two parents.
    lft[row[n["R"]], lid1] = 1
    lft[row[n["R"]], lid2] = 2
    assert lft[row[n["P1"]], lid1] == 2 and lft[row[n["P2"]], lid2] == 2
    members = [c1, c2, c3]
    # hops(R) = 2 + 1 (X and W two hops away); every other switch is 3 hops from X or W.
    assert root_switch(f, members) == n["R"]
    t = build_tree(f, lids, lft, members)
    assert t.root == n["R"]
    assert t.parent == {n["P1"]: n["R"], n["X"]: n["P1"], n["Y"]: n["R"], n["W"]: n["Y"]}
    want = {"R": [1, 3], "P1": [1, 2], "X": [1, 5, 6], "Y": [1, 2], "W": [1, 5]}
    assert {f.names[s]: mask_ports(m) for s, m in t.masks.items()} == want
    verify_tree(f, t)
    # The plain union of both routes sends c3's packets round R-P1-X-P2-R.
    union = dict(t.masks)
    union[n["R"]] |= 1 << 2
    union[n["P2"]] = 0b110
    union[n["X"]] |= 1 << 2
    faults = tree_faults(f, union, members)
    assert any("switch R got 2 copies" in x for x in faults)
    assert any("member c1[1] got 2 copies" in x for x in faults)
    with pytest.raises(TreeFault):
        verify_tree(f, union, members)
    # OpenSM's own rule takes R's lowest least-hop port to X (1) for both and needs no graft.
    th = build_tree(f, lids, lft, members, branches="hops")
    assert th.masks == t.masks and th.parent == t.parent


def test_root_tie_goes_to_the_lowest_byte_swapped_guid() -> None:
    """Hosts on leaf-00 and leaf-01 of fattree(2, 4): hops = 3 on every leaf, 2 on either spine."""
    f = fattree(2, 4)
    s0, s1 = f.by_name("spine-00"), f.by_name("spine-01")
    members = [(f.by_name("host-00000"), 1), (f.by_name("host-00002"), 1)]
    for first, second in ((s0, s1), (s1, s0)):
        # first: 0x...0100, second: 0x...0001. Numerically second is lower; byte-swapped (OpenSM's
        # sw_guid_tbl order on a little-endian host) first is: 0x0001...08 < 0x0100...08.
        f.node_guid[first] = 0x0008000000000100
        f.node_guid[second] = 0x0008000000000001
        f.reindex()
        assert root_switch(f, members) == first
        lids = sequential_lids(f)
        t = build_tree(f, lids, route(f, lids, ["ftree"]).lft, members)
        assert t.root == first
        verify_tree(f, t)


def line_of_switches() -> tuple[Fabric, dict[str, int]]:
    """A - B - C - D, CA a on A port 3, CA d on D port 3; C has the lowest (byte-swapped) GUID."""
    fb = FabricBuilder()
    guid = {"A": 0x0200000000000004, "B": 0x0200000000000003, "C": 0x0200000000000001, "D": 0x0200000000000002}
    n = {s: fb.add_node(NodeType.SWITCH, 4, s, guid=g) for s, g in guid.items()}
    fb.connect(n["A"], 2, n["B"], 1)
    fb.connect(n["B"], 2, n["C"], 1)
    fb.connect(n["C"], 2, n["D"], 1)
    for ca, sw in (("a", "A"), ("d", "D")):
        n[ca] = fb.add_node(NodeType.CA, 1, ca)
        fb.connect(n[ca], 1, n[sw], 3)
    return fb.build(), n


def test_root_counts_a_member_switch_without_the_extra_hop() -> None:
    f, n = line_of_switches()
    # Members hang off A (CA a: +1) and D (port 0 and CA d; D is_mc_member, so no +1 at all):
    #   A: max(0+1, 3) = 3   B: max(1+1, 2) = 2   C: max(2+1, 1) = 3   D: max(3+1, 0) = 4
    # Counting d's extra hop (as a per-port sum would) gives B = C = 3, and C's GUID comes first.
    members = [(n["a"], 1), (n["D"], 0), (n["d"], 1)]
    assert root_switch(f, members) == n["B"]
    # Without D's port 0, D's CA counts +1: A 4, B 3, C 3, D 4; the tie goes to C.
    assert root_switch(f, [(n["a"], 1), (n["d"], 1)]) == n["C"]
    lids = sequential_lids(f)
    lft = route(f, lids, ["minhop"]).lft
    for branches in BRANCHES:
        t = build_tree(f, lids, lft, members, branches=branches)
        assert t.root == n["B"]
        assert mask_ports(t.masks[n["D"]]) == [0, 1, 3]
        verify_tree(f, t)


def test_small_and_odd_groups() -> None:
    r = routed("fattree-2-4")
    f = r.fabric
    h = hosts(f)
    one = build_tree(f, r.lids, r.lft, [h[0], h[0]])
    assert one.root is None and one.masks == {} and one.members == (h[0],)
    # Both hosts of leaf-00: the leaf has hops 1, every other switch more.
    pair = build_tree(f, r.lids, r.lft, [h[0], h[1]])
    assert pair.root == f.by_name("leaf-00")
    assert mask_ports(pair.masks[pair.root]) == [1, 2]
    assert flood(f, pair, h[0]) == {h[1]: 1}
    leaf = f.by_name("leaf-01")
    with pytest.raises(McastError, match="not an end port"):
        build_tree(f, r.lids, r.lft, [h[0], (leaf, 3)])
    with pytest.raises(McastError, match="not an end port"):
        build_tree(f, r.lids, r.lft, [h[0], (h[1][0], 0)])


def test_a_member_without_a_link_is_unreachable_and_the_rest_still_get_a_tree() -> None:
    f = fattree(2, 4)
    h = hosts(f)
    f.link_down(*h[3])
    lids = sequential_lids(f)
    lft = route(f, lids, ["ftree", "updn", "minhop"]).lft
    for branches in BRANCHES:
        t = build_tree(f, lids, lft, h, branches=branches)
        assert t.unreachable == (h[3],)
        others = [m for m in h if m != h[3]]
        verify_tree(f, t, others)


def test_checker_finds_missing_extra_and_one_way_ports() -> None:
    r = routed("fattree-3-4")
    f = r.fabric
    members = hosts(f)[::3]
    t = build_tree(f, r.lids, r.lft, members)
    verify_tree(f, t)
    leaf0 = int(f.peer_node[members[0]])
    # A member's port left out: nobody reaches it.
    masks = dict(t.masks)
    masks[leaf0] &= ~(1 << int(f.peer_port[members[0]]))
    assert any(f"member {f.port_name(*members[0])} got 0 copies" in x for x in tree_faults(f, masks, members))
    # A non-member's port added.
    other = next(c for c in hosts(f) if c not in members and int(f.peer_node[c]) == leaf0)
    masks = dict(t.masks)
    masks[leaf0] |= 1 << int(f.peer_port[other])
    assert any(f"non-member {f.port_name(*other)} got 1 copies" in x for x in tree_faults(f, masks, members))
    # The parent port left out of a leaf: its members hear the others but cannot reach them.
    masks = dict(t.masks)
    up = next(p for p in mask_ports(masks[leaf0]) if f.peer_node[leaf0, p] == t.parent[leaf0])
    masks[leaf0] &= ~(1 << up)
    faults = tree_faults(f, masks, members)
    assert faults and all(x.startswith(f"from {f.port_name(*members[0])}:") for x in faults)


# -- MFT -------------------------------------------------------------------------------------------------


def one_big_switch() -> tuple[Fabric, int, dict[int, EndPort]]:
    """A 40-port switch with a CA on ports 1, 15, 16, 17, 31, 32, 33 and 40."""
    fb = FabricBuilder()
    sw = fb.add_node(NodeType.SWITCH, 40, "sw")
    cas: dict[int, EndPort] = {}
    for p in (1, 15, 16, 17, 31, 32, 33, 40):
        c = fb.add_node(NodeType.CA, 1, f"h{p}")
        fb.connect(c, 1, sw, p)
        cas[p] = (c, 1)
    return fb.build(), sw, cas


def test_mft_encoding_bit_by_bit_on_a_40_port_switch() -> None:
    f, sw, cas = one_big_switch()
    lids = sequential_lids(f)
    lft = route(f, lids, ["minhop"]).lft
    members = [*cas.values(), (sw, 0)]
    t = build_tree(f, lids, lft, members)
    ports = {0, *cas}
    assert t.root == sw and set(mask_ports(t.masks[sw])) == ports
    verify_tree(f, t)
    mlid = MCAST_LID_FIRST + 37  # block 1, entry 5
    table = mft_table(f, {mlid: t})
    assert n_positions(40) == 3 and mft_positions(f).tolist() == [3]
    assert table.shape == (1, 64, 3) and table.dtype == np.uint16
    # ports 0, 1, 15 | 16, 17, 31 | 32, 33, 40 -> bits 0, 1, 15 | 0, 1, 15 | 0, 1, 8
    assert table[0, 37].tolist() == [0x8003, 0x8003, 0x0103]
    assert np.count_nonzero(table) == 3
    for position in range(3):
        payload = block_payload(table[0], 1, position)
        assert len(payload) == 64
        assert payload[:10] == bytes(10) and payload[12:] == bytes(52)
        word = int.from_bytes(payload[10:12], "big")
        for bit in range(16):
            assert bool(word >> bit & 1) == (16 * position + bit in ports), (position, bit)
        assert block_payload(table[0], 0, position) == bytes(64)
    assert block_payload(table[0], 1, 2)[10:12] == b"\x01\x03"
    assert mft_attr_mod(1, 2) == 0x20000001
    assert parse_mft_attr_mod(0x20000001) == (1, 2)
    assert mft_attr_mod(0x1FF, 15) == 0xF00001FF
    with pytest.raises(ValueError):
        mft_attr_mod(512, 0)
    assert masks_of(f, table, mlid) == t.masks
    assert masks_of(f, table, mlid + 1) == {}


@pytest.mark.parametrize("name", ["torus-3x4", "degraded-3-8"])
def test_tables_read_back_verify_like_the_trees(name: str) -> None:
    r = routed(name)
    f = r.fabric
    hops = hop_table(f)
    trees = {
        MCAST_LID_FIRST + 3 * i: build_tree(f, r.lids, r.lft, g, hops=hops) for i, g in enumerate(random_groups(f, 5))
    }
    table = mft_table(f, trees)
    assert table.shape[1] == 32
    for mlid, t in trees.items():
        masks = masks_of(f, table, mlid)
        assert masks == {s: m for s, m in t.masks.items() if m}
        verify_tree(f, masks, t.members)


def test_blocks_changed() -> None:
    new = np.zeros((96, 3), np.uint16)
    new[5, 0] = 1
    new[70, 2] = 0x100
    every = [(b, p) for b in range(3) for p in range(3)]
    assert mft_blocks_changed(new, None) == every
    assert mft_blocks_changed(new, new.copy()) == []
    held = new.copy()
    held[40, 1] = 7
    held[63, 1] = 1
    assert mft_blocks_changed(new, held) == [(1, 1)]
    held[64, 0] = 2
    assert mft_blocks_changed(new, held) == [(1, 1), (2, 0)]
    # Blocks the switch was never sent are unknown: sent whole.
    assert mft_blocks_changed(new, new[:32].copy()) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    # Above a lowered top: only what is not zero yet gets cleared.
    longer = np.zeros((128, 3), np.uint16)
    longer[:96] = new
    assert mft_blocks_changed(new, longer) == []
    longer[100, 1] = 3
    assert mft_blocks_changed(new, longer) == [(3, 1)]
    assert block_payload(new, 3, 1) == bytes(64)
    with pytest.raises(ValueError):
        mft_blocks_changed(new, np.zeros((96, 2), np.uint16))
    with pytest.raises(ValueError):
        mft_blocks_changed(np.zeros((40, 3), np.uint16), None)


def test_block_diff_after_a_join_touches_only_that_mlid() -> None:
    r = routed("fattree-3-4")
    f = r.fabric
    h = hosts(f)
    trees = {
        MCAST_LID_FIRST: build_tree(f, r.lids, r.lft, h[:6]),
        MCAST_LID_FIRST + 40: build_tree(f, r.lids, r.lft, h[8:]),
    }
    before = mft_table(f, trees)
    trees[MCAST_LID_FIRST + 40] = build_tree(f, r.lids, r.lft, [*h[8:], h[0]])
    after = mft_table(f, trees)
    pos = mft_positions(f).tolist()
    sent = {row: mft_blocks_changed(after[row, :, : pos[row]], before[row, :, : pos[row]]) for row in range(len(pos))}
    touched = {row for row, blocks in sent.items() if blocks}
    differ = {row for row in range(len(pos)) if not np.array_equal(after[row], before[row])}
    assert touched == differ and touched
    assert all(blocks == [(1, 0)] for blocks in sent.values() if blocks)


# -- MLIDs ----------------------------------------------------------------------------------------------


def test_mlid_pool_reuses_freed_mlids_and_never_leaks() -> None:
    cap = 64
    pool = MlidPool.from_caps([1024, cap, 512])
    assert pool.cap == cap
    everything = set(range(MCAST_LID_FIRST, MCAST_LID_FIRST + cap))
    rng = np.random.default_rng(11)
    held: set[int] = set()
    for _ in range(5000):
        x = rng.random()
        if held and (len(held) == cap or x < 0.45):
            m = sorted(held)[int(rng.integers(len(held)))]
            pool.free(m)
            held.remove(m)
        elif x < 0.55:
            ask = MCAST_LID_FIRST + int(rng.integers(cap + 8))
            got = pool.allocate(ask)
            assert got == (ask if ask in everything - held else min(everything - held))
            held.add(got)
        else:
            got = pool.allocate()
            assert got == min(everything - held)
            held.add(got)
        assert pool.in_use == len(held)
        assert pool.top == max(held, default=None)
    for m in sorted(held):
        pool.free(m)
    assert pool.in_use == 0 and pool.top is None
    assert [pool.allocate() for _ in range(cap)] == sorted(everything)
    with pytest.raises(MlidPoolError, match="no free MLID"):
        pool.allocate()
    pool.free(MCAST_LID_FIRST + 9)
    with pytest.raises(MlidPoolError, match="not allocated"):
        pool.free(MCAST_LID_FIRST + 9)
    assert pool.allocate() == MCAST_LID_FIRST + 9
    with pytest.raises(MlidPoolError):
        MlidPool(0).allocate()
