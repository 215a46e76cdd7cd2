"""Channel dependency graph and credit loops."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from fabric.generate import degrade, fattree, ring, torus
from fabric.model import Fabric
from sm.analysis.creditflow import (
    CreditLoop,
    _tarjan,
    channel_dependency_graph,
    cycle_core,
    find_credit_loops,
)
from sm.analysis.verify import TraceError, trace_route
from sm.lidmap import LidMap, sequential_lids
from sm.routing.base import Lft, make_engine


def brute_dependencies(f: Fabric, lids: LidMap, lft: Lft) -> set[tuple[tuple[int, int], tuple[int, int]]]:
    """((node, port), (node, port)) turns of every switch-to-LID route, from trace_route."""
    sw = set(f.switches.tolist())
    deps = set()
    for s in f.switches.tolist():
        for lid in lids.used().tolist():
            try:
                hops = trace_route(f, lids, lft, s, 0, lid)
            except TraceError as e:
                hops = e.hops
            chans = [
                (h.node, h.out_port)
                for h in hops
                if h.node in sw
                and 0 < h.out_port <= f.nports[h.node]
                and f.is_up(h.node, h.out_port)
                and int(f.peer_node[h.node, h.out_port]) in sw
            ]
            # Consecutive channels of one route join at a switch.
            for a, b in itertools.pairwise(chans):
                if int(f.peer_node[a]) == b[0]:
                    deps.add((a, b))
    return deps


def graph_dependencies(f: Fabric, lids: LidMap, lft: Lft) -> set[tuple[tuple[int, int], tuple[int, int]]]:
    g = channel_dependency_graph(f, lids, lft)
    out = set()
    for a, b in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        out.add(((int(g.node[a]), int(g.port[a])), (int(g.node[b]), int(g.port[b]))))
    return out


@pytest.mark.parametrize(
    ("make", "engine"),
    [
        (lambda: ring(5), "minhop"),
        (lambda: torus([3, 3], 1), "updn"),
        (lambda: fattree(2, 4), "minhop"),
        (lambda: degrade(fattree(3, 4), fraction=0.2, seed=4), "minhop"),
    ],
)
def test_dependencies_match_traced_routes(make, engine: str) -> None:
    f = make()
    lids = sequential_lids(f)
    lft = make_engine(engine).compute(f, lids)
    assert graph_dependencies(f, lids, lft) == brute_dependencies(f, lids, lft)
    g = channel_dependency_graph(f, lids, lft)
    assert g.n_channels == 2 * f.switch_links().shape[0]
    # Each dependency's example LID really makes that turn.
    row = {int(n): i for i, n in enumerate(f.switches.tolist())}
    for a, b, lid in zip(g.src.tolist(), g.dst.tolist(), g.lid.tolist(), strict=True):
        assert lft[row[int(g.node[a])], lid] == g.port[a]
        assert int(g.peer[a]) == int(g.node[b])
        assert lft[row[int(g.node[b])], lid] == g.port[b]


@pytest.mark.parametrize("n", [4, 5, 6, 8])
def test_minhop_on_a_ring_has_credit_loops_named(n: int) -> None:
    f = ring(n)
    lids = sequential_lids(f)
    lft = make_engine("minhop").compute(f, lids)
    loops = find_credit_loops(f, lids, lft)
    assert loops, "min-hop routes both ways round a ring: a credit loop each way"
    row = {f.names[int(s)]: i for i, s in enumerate(f.switches.tolist())}
    for loop in loops:
        assert isinstance(loop, CreditLoop) and len(loop.channels) == len(loop.lids) == n
        assert {c.node for c in loop.channels} == {f"sw-{i:02d}" for i in range(n)}
        for i, c in enumerate(loop.channels):
            nxt = loop.channels[(i + 1) % n]
            assert c.peer == nxt.node
            assert (int(f.peer_node[f.by_name(c.node), c.port]), int(f.peer_port[f.by_name(c.node), c.port])) == (
                f.by_name(c.peer),
                c.peer_port,
            )
            lid = loop.lids[i]
            assert lft[row[c.node], lid] == c.port and lft[row[nxt.node], lid] == nxt.port
        assert "sw-00[" in str(loop)
    assert len(find_credit_loops(f, lids, lft, max_loops=1)) == 1


def test_torus_minhop_loops_updn_none() -> None:
    f = torus([4, 4], 1)
    lids = sequential_lids(f)
    assert find_credit_loops(f, lids, make_engine("minhop").compute(f, lids))
    assert find_credit_loops(f, lids, make_engine("updn").compute(f, lids)) == []


@pytest.mark.parametrize(
    "make", [lambda: fattree(2, 8), lambda: fattree(3, 6), lambda: degrade(fattree(3, 6), links=6)]
)
def test_updn_on_fat_trees_has_no_credit_loops(make) -> None:
    f = make()
    lids = sequential_lids(f)
    lft = make_engine("updn").compute(f, lids)
    g = channel_dependency_graph(f, lids, lft)
    assert g.n_dependencies > 0
    assert not cycle_core(g).any()
    assert find_credit_loops(f, lids, lft, graph=g) == []


@pytest.mark.parametrize(
    "make", [lambda: fattree(2, 8), lambda: fattree(3, 6), lambda: degrade(fattree(3, 6), links=4)]
)
def test_ftree_on_fat_trees_has_no_credit_loops_for_ca_lids(make) -> None:
    # ftree may route switch LIDs (management traffic) through a valley; CA routes are up*/down*.
    f = make()
    lids = sequential_lids(f)
    lft = make_engine("ftree").compute(f, lids)
    assert find_credit_loops(f, lids, lft, ca_only=True) == []


def test_ca_only_leaves_out_switch_lids() -> None:
    f = ring(4)  # min-hop's loops on a 4-ring come from the switch LIDs' tie-breaks
    lids = sequential_lids(f)
    lft = make_engine("minhop").compute(f, lids)
    full = channel_dependency_graph(f, lids, lft)
    ca = channel_dependency_graph(f, lids, lft, ca_only=True)
    assert ca.n_dependencies < full.n_dependencies
    assert all(lids.owner_node[x] in f.cas for x in ca.lid.tolist())
    assert find_credit_loops(f, lids, lft) and not find_credit_loops(f, lids, lft, ca_only=True)


@pytest.mark.parametrize("seed", range(8))
def test_cycle_core_and_tarjan_match_networkx(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 40
    m = int(rng.integers(20, 70))
    src = rng.integers(0, n, m)
    dst = rng.integers(0, n, m)
    if seed % 2:  # a DAG: edges only from lower to higher
        src, dst = np.minimum(src, dst), np.maximum(src, dst)
        keep = src != dst
        src, dst = src[keep], dst[keep]
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    indptr = np.r_[0, np.cumsum(np.bincount(src, minlength=n))]
    from sm.analysis.creditflow import ChannelDependencyGraph

    z = np.zeros(n, np.int64)
    g = ChannelDependencyGraph(z, z, z, z, indptr.astype(np.int64), dst.astype(np.int64), np.zeros(dst.size, np.int64))
    ref = nx.DiGraph()
    ref.add_nodes_from(range(n))
    ref.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    core = cycle_core(g)
    cyclic = {v for c in nx.strongly_connected_components(ref) for v in c if len(c) > 1 or ref.has_edge(v, v)}
    assert cyclic <= set(np.flatnonzero(core).tolist())
    assert core.any() == (not nx.is_directed_acyclic_graph(ref))
    adj: dict[int, list[int]] = {}
    for a, b in zip(src.tolist(), dst.tolist(), strict=True):
        adj.setdefault(a, []).append(b)
    mine = {frozenset(c) for c in _tarjan(list(range(n)), adj)}
    assert mine == {frozenset(c) for c in nx.strongly_connected_components(ref)}


# -- per (link, VL) ------------------------------------------------------------------------------------


def brute_vl_dependencies(
    f: Fabric, lids: LidMap, lft: Lft, layers: np.ndarray, from_cas: bool
) -> set[tuple[tuple[int, int, int], tuple[int, int, int]]]:
    """((node, port, VL), (node, port, VL)) turns of every route, each on the VL its source row's layer gives."""
    sw = f.switches.tolist()
    swset = set(sw)
    deps = set()
    for row, s in enumerate(sw):
        if from_cas and not f.cas_under(s):
            continue
        for lid in lids.used().tolist():
            vl = int(layers[row, lid])
            try:
                hops = trace_route(f, lids, lft, s, 0, lid)
            except TraceError as e:
                hops = e.hops
            chans = [
                (h.node, h.out_port, vl)
                for h in hops
                if h.node in swset
                and 0 < h.out_port <= f.nports[h.node]
                and int(f.peer_node[h.node, h.out_port]) in swset
            ]
            for a, b in itertools.pairwise(chans):
                if int(f.peer_node[a[0], a[1]]) == b[0]:
                    deps.add((a, b))
    return deps


@pytest.mark.parametrize("from_cas", [False, True])
def test_per_vl_dependencies_match_traced_routes(from_cas: bool) -> None:
    f = torus([3, 4], 1)
    lids = sequential_lids(f)
    lft = make_engine("minhop").compute(f, lids)
    rng = np.random.default_rng(3)
    layers = rng.integers(0, 3, lft.shape).astype(np.uint8)
    g = channel_dependency_graph(f, lids, lft, layers=layers, from_cas=from_cas)
    assert g.vl is not None
    got = {
        ((int(g.node[a]), int(g.port[a]), g.vl_of(a)), (int(g.node[b]), int(g.port[b]), g.vl_of(b)))
        for a, b in zip(g.src.tolist(), g.dst.tolist(), strict=True)
    }
    assert got == brute_vl_dependencies(f, lids, lft, layers, from_cas)
    assert all(a[2] == b[2] for a, b in got), "a dependency stays on its VL"


def test_a_ring_loop_on_one_vl_is_gone_on_two_and_named_by_vl() -> None:
    from sm.routing.layered import assign_layers

    f = ring(6, 1)
    lids = sequential_lids(f)
    lft = make_engine("minhop").compute(f, lids)
    assert find_credit_loops(f, lids, lft)
    assert find_credit_loops(f, lids, lft, layers=None) == find_credit_loops(f, lids, lft)
    layers = assign_layers(f, lids, lft, 8, from_cas=False)
    assert int(layers.max()) == 1
    assert find_credit_loops(f, lids, lft, layers=layers) == []
    # Every route on SL 3: the same loops, now on VL 3.
    loops = find_credit_loops(f, lids, lft, layers=np.full_like(lft, 3))
    assert loops and all(lp.vl == 3 for lp in loops) and "on VL 3" in str(loops[0])
    # An SL2VL map that folds SL 1 onto VL 0 brings the loop back on VL 0.
    fold = list(range(16))
    fold[1] = 0
    back = find_credit_loops(f, lids, lft, layers=layers, sl2vl=fold)
    assert back and {lp.vl for lp in back} == {0}
    # SLs mapped to VL 15 carry no credits: no dependency at all.
    assert channel_dependency_graph(f, lids, lft, layers=layers, sl2vl=[15] * 16).n_dependencies == 0


def test_bad_layers_and_sl2vl_are_refused() -> None:
    from fabric.errors import IbfmError

    f = ring(4, 1)
    lids = sequential_lids(f)
    lft = make_engine("minhop").compute(f, lids)
    with pytest.raises(IbfmError, match="layers shape"):
        channel_dependency_graph(f, lids, lft, layers=np.zeros((1, 1), np.uint8))
    with pytest.raises(IbfmError, match="16 entries"):
        channel_dependency_graph(f, lids, lft, layers=np.zeros_like(lft), sl2vl=[0, 1])
