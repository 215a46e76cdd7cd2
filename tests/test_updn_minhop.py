"""Min-hop and up/down routing engines."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from fabric.generate import degrade, fattree, ring, torus
from fabric.model import Fabric, FabricBuilder, NodeType
from sm.analysis.creditflow import find_credit_loops
from sm.analysis.verify import trace_route, verify_routes
from sm.lidmap import sequential_lids
from sm.routing._hops import hop_matrix, switch_graph
from sm.routing.base import NO_ROUTE, RoutingError, RoutingOptions, make_engine, route
from sm.routing.minhop import MinHopEngine
from sm.routing.updn import UpDownEngine


def random_fabric(n_sw: int, extra: int, seed: int, hosts: int = 1, radix: int = 12) -> Fabric:
    """A random connected switch graph (spanning tree plus ``extra`` links), ``hosts`` CAs per switch."""
    rng = np.random.default_rng(seed)
    fb = FabricBuilder()
    sws = [fb.add_node(NodeType.SWITCH, radix, f"sw{i}") for i in range(n_sw)]
    free = {s: list(range(hosts + 1, radix + 1)) for s in sws}
    edges = [(int(rng.integers(0, i)), i) for i in range(1, n_sw)]
    tries = 0
    while extra and tries < 1000:
        tries += 1
        a, b = (int(x) for x in rng.choice(n_sw, 2, replace=False))
        edges.append((a, b))
        extra -= 1
    for a, b in edges:
        if free[sws[a]] and free[sws[b]]:
            fb.connect(sws[a], free[sws[a]].pop(0), sws[b], free[sws[b]].pop(0))
    for s in sws:
        for h in range(hosts):
            ca = fb.add_node(NodeType.CA, 1, f"h{s}-{h}")
            fb.connect(ca, 1, s, h + 1)
    return fb.build()


def switch_nx(f: Fabric) -> nx.MultiGraph:
    g = nx.MultiGraph()
    g.add_nodes_from(f.switches.tolist())
    for a, _p, b, _q in f.switch_links().tolist():
        g.add_edge(a, b)
    return g


def host_ports(f: Fabric) -> list[tuple[int, int]]:
    return [(int(n), 1) for n in f.cas]


def switch_path(f: Fabric, hops: list) -> list[int]:
    return [h.node for h in hops if f.is_switch(h.node)]


def up_down_legal(f: Fabric, rank: dict[int, tuple[int, int]], path: list[int]) -> bool:
    """No down move followed by an up move, with up = towards the lower (rank, GUID)."""
    gone_down = False
    for a, b in itertools.pairwise(path):
        up = rank[b] < rank[a]
        if up and gone_down:
            return False
        gone_down |= not up
    return True


FABRICS = {
    "fattree2": lambda: fattree(2, 8),
    "fattree3": lambda: fattree(3, 4),
    "ring6": lambda: ring(6),
    "torus3x4": lambda: torus([3, 4]),
    "degraded": lambda: degrade(fattree(3, 6), fraction=0.15, seed=3),
    "random": lambda: random_fabric(14, 10, seed=5),
}


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_minhop_routes_every_pair_on_a_shortest_path(name: str) -> None:
    f = FABRICS[name]()
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    rep = verify_routes(f, lids, lft)
    assert rep.ok and rep.unreachable == 0 and rep.reachable == rep.pairs > 0
    dist = dict(nx.all_pairs_shortest_path_length(switch_nx(f)))
    hosts = host_ports(f)
    for s in hosts[:: max(1, len(hosts) // 12)]:
        for d in hosts:
            lid = int(lids.base[d])
            path = switch_path(f, trace_route(f, lids, lft, s[0], s[1], lid))
            if s == d:
                continue
            assert len(path) - 1 == dist[path[0]][path[-1]]
            assert path[-1] == f.peer_node[d]


def test_minhop_balances_remote_lids_over_up_ports() -> None:
    f = fattree(2, 8)  # 8 leaves x 4 hosts, 4 spines; leaf ports 5..8 go up
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    sw = f.switches
    for row, node in enumerate(sw.tolist()):
        if not f.names[node].startswith("leaf"):
            continue
        under = {int(lids.base[m, q]) for _p, m, q in f.cas_under(node)}
        remote = [int(lids.base[c, 1]) for c in f.cas if int(lids.base[c, 1]) not in under]
        ports = lft[row, remote]
        assert set(ports.tolist()) == {5, 6, 7, 8}
        counts = np.bincount(ports, minlength=9)[5:]
        assert counts.max() - counts.min() <= 1
        # Tie at the start: the lowest remote LID takes the lowest up port.
        assert lft[row, min(remote)] == 5
        for lid in under:
            owner = (int(lids.owner_node[lid]), int(lids.owner_port[lid]))
            assert (int(f.peer_node[owner]), int(f.peer_port[owner])) == (node, int(lft[row, lid]))


def test_own_lids_port0_unused_lids_255_and_lmc() -> None:
    f = fattree(2, 4)
    lids = sequential_lids(f, lmc=1)
    for engine in (MinHopEngine(), UpDownEngine()):
        lft = engine.compute(f, lids)
        assert lft.shape == (f.switches.size, lids.max_lid + 1)
        for row, node in enumerate(f.switches.tolist()):
            for lid in lids.lids_of(node, 0):
                assert lft[row, lid] == 0
        assert (lft[:, 0] == NO_ROUTE).all()
        unused = np.flatnonzero(lids.owner_node < 0)
        assert (lft[:, unused] == NO_ROUTE).all()
        rep = verify_routes(f, lids, lft)
        assert rep.host_unreachable == 0
        # Both LIDs of each CA port are routed.
        h = int(f.cas[0])
        for lid in lids.lids_of(h, 1):
            assert (lft[:, lid] != NO_ROUTE).all()


def test_engines_registered_and_chain() -> None:
    assert isinstance(make_engine("minhop"), MinHopEngine)
    assert isinstance(make_engine("updn"), UpDownEngine)
    assert make_engine("updn").name == "updn" and make_engine("minhop").name == "minhop"
    f = ring(4)
    res = route(f, sequential_lids(f), ["updn", "minhop"])
    assert res.engine == "updn" and not res.refused


def test_disconnected_fabric_routes_within_each_part() -> None:
    fb = FabricBuilder()
    a = [fb.add_node(NodeType.SWITCH, 4, f"a{i}") for i in range(2)]
    b = [fb.add_node(NodeType.SWITCH, 4, f"b{i}") for i in range(2)]
    fb.connect(a[0], 3, a[1], 3)
    fb.connect(b[0], 3, b[1], 3)
    for s in a + b:
        ca = fb.add_node(NodeType.CA, 1, f"h-{s}")
        fb.connect(ca, 1, s, 1)
    f = fb.build()
    lids = sequential_lids(f)
    for engine in (MinHopEngine(), UpDownEngine()):
        lft = engine.compute(f, lids)
        rep = verify_routes(f, lids, lft)
        assert rep.ok and rep.disconnected > 0
        ha = int(lids.base[f.by_name(f"h-{b[0]}"), 1])
        assert lft[list(f.switches).index(a[0]), ha] == NO_ROUTE


# -- up/down ------------------------------------------------------------------------------------------


def test_updn_detects_tree_roots() -> None:
    f = fattree(3, 4)
    assert sorted(f.names[n] for n in UpDownEngine().roots(f)) == [f"core-{i:04d}" for i in range(4)]
    f = fattree(2, 8)
    assert sorted(f.names[n] for n in UpDownEngine().roots(f)) == [f"spine-{i:02d}" for i in range(4)]
    # A few lost links leave the roots where they are.
    f = degrade(fattree(3, 8), links=3, seed=2)
    names = [f.names[n] for n in UpDownEngine().roots(f)]
    assert names and all(n.startswith("core-") for n in names)


def test_updn_single_root_where_many_would_split_leaves() -> None:
    f = random_fabric(16, 12, seed=11)
    eng = UpDownEngine()
    g = switch_graph(f)
    plan = eng.plan(f, g)
    leaf = np.arange(g.n)
    assert (plan.legal[np.ix_(leaf, leaf)] < 255).all()


@pytest.mark.parametrize("name", sorted(FABRICS))
def test_updn_paths_are_legal_and_deadlock_free(name: str) -> None:
    f = FABRICS[name]()
    lids = sequential_lids(f)
    eng = UpDownEngine()
    g = switch_graph(f)
    plan = eng.plan(f, g)
    key = {int(g.nodes[r]): (int(plan.rank[r]), int(g.guid[r])) for r in range(g.n)}
    lft = eng.compute(f, lids)
    rep = verify_routes(f, lids, lft)
    assert rep.host_unreachable == 0 and rep.host_pairs > 0
    hosts = host_ports(f)
    for s in hosts:
        for d in hosts[:: max(1, len(hosts) // 10)]:
            path = switch_path(f, trace_route(f, lids, lft, s[0], s[1], int(lids.base[d])))
            assert up_down_legal(f, key, path), (s, d, path)
    # Switch LIDs: every route that exists is legal too.
    for src in f.switches.tolist():
        for dst in f.switches.tolist()[::3]:
            lid = int(lids.base[dst, 0])
            if lft[list(f.switches).index(src), lid] == NO_ROUTE:
                continue
            path = switch_path(f, trace_route(f, lids, lft, src, 0, lid))
            assert up_down_legal(f, key, path)
    assert find_credit_loops(f, lids, lft) == []


def test_updn_is_minimal_on_full_fat_trees() -> None:
    for f in (fattree(2, 8), fattree(3, 4)):
        lids = sequential_lids(f)
        a = verify_routes(f, lids, UpDownEngine().compute(f, lids))
        b = verify_routes(f, lids, MinHopEngine().compute(f, lids))
        hosts = host_ports(f)
        lft_u = UpDownEngine().compute(f, lids)
        lft_m = MinHopEngine().compute(f, lids)
        for s in hosts:
            for d in hosts:
                lid = int(lids.base[d])
                assert len(trace_route(f, lids, lft_u, *s, lid)) == len(trace_route(f, lids, lft_m, *s, lid))
        assert a.max_hops == b.max_hops
        # Spine-to-spine (core-to-core) switch LIDs are the only pairs without a legal path.
        assert a.host_unreachable == 0 and a.unreachable > 0


def test_updn_unroutable_pairs_are_switch_pairs_only_on_leaf_spine() -> None:
    f = fattree(2, 8)
    lids = sequential_lids(f)
    rep = verify_routes(f, lids, UpDownEngine().compute(f, lids))
    assert rep.unreachable == 4 * 3  # spine -> other spine
    assert all(x.src.startswith("spine") and x.dst.startswith("spine") for x in rep.failures)


def test_updn_given_roots() -> None:
    f = ring(6)
    lids = sequential_lids(f)
    root = f.by_name("sw-03")
    eng = UpDownEngine(RoutingOptions(root_guids=(int(f.node_guid[root]),)))
    assert eng.roots(f) == [root]
    g = switch_graph(f)
    plan = eng.plan(f, g)
    assert plan.rank[g.row_of[root]] == 0 and plan.rank.max() == 3
    lft = eng.compute(f, lids)
    assert verify_routes(f, lids, lft).ok
    assert find_credit_loops(f, lids, lft) == []
    with pytest.raises(RoutingError, match="not a node"):
        UpDownEngine(RoutingOptions(root_guids=(0xDEAD,))).compute(f, lids)
    host = int(f.cas[0])
    with pytest.raises(RoutingError, match="not a switch"):
        UpDownEngine(RoutingOptions(root_guids=(int(f.node_guid[host]),))).compute(f, lids)


@pytest.mark.parametrize("seed", range(6))
def test_random_fabrics_updn_reaches_all_hosts_without_credit_loops(seed: int) -> None:
    f = random_fabric(12 + seed, 4 + 2 * seed, seed=seed, hosts=2)
    lids = sequential_lids(f)
    lft = UpDownEngine().compute(f, lids)
    rep = verify_routes(f, lids, lft)
    assert rep.host_unreachable == 0 and rep.host_pairs == (2 * f.switches.size) * (2 * f.switches.size - 1)
    assert find_credit_loops(f, lids, lft) == []
    # Min-hop paths are never longer.
    m = verify_routes(f, lids, MinHopEngine().compute(f, lids))
    assert m.ok and m.mean_hops <= rep.mean_hops + 1e-9


def test_hop_matrix_matches_networkx() -> None:
    f = random_fabric(20, 15, seed=7)
    g = switch_graph(f)
    dist = hop_matrix(g.nbr)
    ref = dict(nx.all_pairs_shortest_path_length(switch_nx(f)))
    for i, a in enumerate(g.nodes.tolist()):
        for j, b in enumerate(g.nodes.tolist()):
            assert dist[i, j] == ref[a].get(b, 255)
