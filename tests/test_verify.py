"""Route verification, route tracing and link loads, checked against pair-by-pair tracing."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from fabric.generate import degrade, fattree, ring
from fabric.model import Fabric, NodeType
from sm.analysis.verify import (
    Hop,
    Status,
    TraceError,
    VerifyError,
    link_loads,
    shift_quality,
    trace_route,
    verify_routes,
)
from sm.lidmap import LidMap, sequential_lids
from sm.routing.base import NO_ROUTE, Lft, make_engine
from sm.routing.minhop import MinHopEngine
from sm.routing.updn import UpDownEngine


def row(f: Fabric, name: str) -> int:
    return int(np.flatnonzero(f.switches == f.by_name(name))[0])


def trace_status(f: Fabric, lids: LidMap, lft: Lft, s: tuple[int, int], lid: int) -> tuple[Status, list[Hop]]:
    try:
        return Status.DELIVERED, trace_route(f, lids, lft, s[0], s[1], lid)
    except TraceError as e:
        return e.status, e.hops


def entry_switch(f: Fabric, node: int, port: int) -> int | None:
    if f.is_switch(node):
        return node
    if not f.is_up(node, port):
        return None
    peer = int(f.peer_node[node, port])
    return peer if f.is_switch(peer) else None


def brute_force(f: Fabric, lids: LidMap, lft: Lft) -> dict:
    """Every (source end port, LID) pair through trace_route."""
    g = nx.Graph()
    g.add_nodes_from(f.switches.tolist())
    g.add_edges_from((a, b) for a, _p, b, _q in f.switch_links().tolist())
    comp = {n: i for i, c in enumerate(nx.connected_components(g)) for n in c}
    sources = [(int(n), int(p)) for n, p in np.argwhere(lids.base > 0)]
    used = lids.used().tolist()
    out: dict = {"pairs": 0, "reachable": 0, "by_status": {}, "host_pairs": 0, "host_unreachable": 0}
    hops: list[int] = []
    for s in sources:
        es = entry_switch(f, *s)
        if es is None:
            continue
        for lid in used:
            owner = (int(lids.owner_node[lid]), int(lids.owner_port[lid]))
            if owner == s:
                continue
            ed = entry_switch(f, *owner)
            if ed is None or comp[ed] != comp[es]:
                continue
            host = not f.is_switch(s[0]) and not f.is_switch(owner[0])
            st, path = trace_status(f, lids, lft, s, lid)
            out["pairs"] += 1
            out["host_pairs"] += host
            if st == Status.DELIVERED:
                out["reachable"] += 1
                hops.append(len(path) - 1)
            else:
                out["by_status"][st] = out["by_status"].get(st, 0) + 1
                out["host_unreachable"] += host
    out["max_hops"] = max(hops, default=0)
    out["mean_hops"] = float(np.mean(hops)) if hops else 0.0
    return out


def assert_matches(f: Fabric, lids: LidMap, lft: Lft) -> None:
    rep = verify_routes(f, lids, lft)
    ref = brute_force(f, lids, lft)
    assert rep.pairs == ref["pairs"]
    assert rep.reachable == ref["reachable"]
    assert rep.unreachable == ref["pairs"] - ref["reachable"]
    assert rep.by_status == ref["by_status"]
    assert rep.host_pairs == ref["host_pairs"]
    assert rep.host_unreachable == ref["host_unreachable"]
    assert rep.max_hops == ref["max_hops"]
    assert rep.mean_hops == pytest.approx(ref["mean_hops"])
    for x in rep.failures:  # every example names a really failing pair
        src = f.by_name(x.src.split("[")[0]), int(x.src.split("[")[1].rstrip("]"))
        assert trace_status(f, lids, lft, src, x.lid)[0] == x.status


def corrupt(lft: Lft, f: Fabric, seed: int, fraction: float = 0.08) -> Lft:
    rng = np.random.default_rng(seed)
    bad = lft.copy()
    mask = rng.random(bad.shape) < fraction
    choices = np.array([0, NO_ROUTE, f.max_port + 3, *range(1, f.max_port + 1)], np.uint8)
    bad[mask] = rng.choice(choices, size=int(mask.sum()))
    return bad


def test_clean_routes_all_reachable() -> None:
    f = fattree(2, 4)
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    rep = verify_routes(f, lids, lft)
    n_ep = f.cas.size + f.switches.size
    assert rep.ok and rep.failures == [] and rep.by_status == {}
    assert rep.sources == rep.lids == n_ep
    assert rep.pairs == rep.reachable == n_ep * (n_ep - 1)
    assert rep.host_pairs == f.cas.size * (f.cas.size - 1)
    assert rep.max_hops == 4  # host, leaf, spine, leaf, host
    assert_matches(f, lids, lft)


@pytest.mark.parametrize("seed", range(4))
def test_corrupted_tables_match_pair_by_pair_tracing(seed: int) -> None:
    f = fattree(2, 4) if seed % 2 == 0 else ring(5, 2)
    lids = sequential_lids(f, lmc=seed // 2)
    lft = corrupt(MinHopEngine().compute(f, lids), f, seed)
    # A dead inter-switch link and a dead host link, after routing.
    a, p, _b, _q = f.switch_links()[seed % f.switch_links().shape[0]].tolist()
    f.link_down(a, p)
    f.link_down(int(f.cas[-1]), 1)
    assert_matches(f, lids, lft)
    assert not verify_routes(f, lids, lft).ok


def test_degraded_and_disconnected_fabric_matches() -> None:
    f = degrade(fattree(3, 4), fraction=0.2, seed=2)
    lids = sequential_lids(f)
    lft = UpDownEngine().compute(f, lids)
    assert_matches(f, lids, lft)
    # Split a ring in two: pairs across the cut are disconnected, not failures.
    f = ring(6)
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    for name, port in (("sw-00", 2), ("sw-03", 2)):
        f.disconnect(f.by_name(name), port)
    rep = verify_routes(f, lids, lft)
    assert rep.disconnected == 2 * (6 * 6)  # 6 end ports on each side to the 6 LIDs on the other
    assert_matches(f, lids, lft)


def test_black_hole_named() -> None:
    f = fattree(2, 4)
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    target = int(f.cas[2])  # on leaf-01
    lid = int(lids.base[target, 1])
    lft[row(f, "leaf-00"), lid] = NO_ROUTE
    rep = verify_routes(f, lids, lft)
    assert rep.unreachable == 3  # leaf-00 itself and its two hosts
    assert rep.by_status == {Status.NO_ROUTE: 3}
    (x,) = rep.failures
    assert (x.status, x.lid, x.switch, x.port) == (Status.NO_ROUTE, lid, "leaf-00", NO_ROUTE)
    assert x.dst == f.port_name(target, 1)
    assert "leaf-00" in str(x) and str(lid) in str(x)
    with pytest.raises(TraceError, match="no route at leaf-00") as ei:
        trace_route(f, lids, lft, int(f.cas[0]), 1, lid)
    assert ei.value.hops == [Hop(int(f.cas[0]), 0, 1), Hop(f.by_name("leaf-00"), 1, NO_ROUTE)]


def test_wrong_ca_and_dead_port() -> None:
    f = fattree(2, 4)
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    h0, h1 = int(f.cas[0]), int(f.cas[1])  # both on leaf-00, ports 1 and 2
    lft[row(f, "leaf-00"), int(lids.base[h0, 1])] = 2
    rep = verify_routes(f, lids, lft)
    assert rep.by_status[Status.WRONG_CA] > 0 and rep.failures[0].switch == "leaf-00"
    with pytest.raises(TraceError, match="does not own") as ei:
        trace_route(f, lids, lft, int(f.cas[3]), 1, int(lids.base[h0, 1]))
    assert ei.value.status == Status.WRONG_CA
    lft = MinHopEngine().compute(f, lids)
    leaf = f.by_name("leaf-00")
    spine_lid = int(lids.base[f.by_name("spine-00"), 0])
    port = int(lft[row(f, "leaf-00"), spine_lid])
    f.link_down(leaf, port)
    rep = verify_routes(f, lids, lft)
    assert Status.DEAD_PORT in rep.by_status
    with pytest.raises(TraceError, match=r"leaf-00\[\d\] has no up link"):
        trace_route(f, lids, lft, h1, 1, spine_lid)


def test_loop_named() -> None:
    f = ring(4)
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    host = f.by_name("host-0002")  # on sw-02
    lid = int(lids.base[host, 1])
    # sw-00 port 2 -> sw-01, sw-01 port 3 -> sw-00: bounce between them.
    lft[row(f, "sw-00"), lid] = 2
    lft[row(f, "sw-01"), lid] = 3
    rep = verify_routes(f, lids, lft)
    assert rep.by_status == {Status.LOOP: 4}  # sw-00, sw-01 and their hosts
    x = rep.failures[0]
    assert x.status == Status.LOOP and x.switch in ("sw-00", "sw-01")
    assert "sw-00 -> sw-01" in x.detail or "sw-01 -> sw-00" in x.detail
    with pytest.raises(TraceError, match="routing loop"):
        trace_route(f, lids, lft, f.by_name("host-0000"), 1, lid)
    assert_matches(f, lids, lft)


def test_trace_route_hops() -> None:
    f = fattree(2, 4)  # leaf ports 1-2 hosts, 3-4 spines; spine port l+1 to leaf l
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    src, dst = f.by_name("host-00000"), f.by_name("host-00002")
    hops = trace_route(f, lids, lft, src, 1, int(lids.base[dst, 1]))
    names = [f.names[h.node] for h in hops]
    assert names == ["host-00000", "leaf-00", names[2], "leaf-01", "host-00002"]
    assert names[2] in ("spine-00", "spine-01")  # both spines are shortest paths
    assert hops[0] == Hop(src, 0, 1)
    assert hops[1].node == f.by_name("leaf-00") and hops[1].in_port == 1 and hops[1].out_port in (3, 4)
    spine = hops[2]
    assert f.names[spine.node].startswith("spine") and (spine.in_port, spine.out_port) == (1, 2)
    assert hops[3].node == f.by_name("leaf-01") and hops[3].out_port == 1
    assert hops[4] == Hop(dst, 1, 0)
    for a, b in itertools.pairwise(hops):
        assert (int(f.peer_node[a.node, a.out_port]), int(f.peer_port[a.node, a.out_port])) == (b.node, b.in_port)
    # From a switch (port 0), to itself, and bad arguments.
    leaf = f.by_name("leaf-00")
    assert trace_route(f, lids, lft, leaf, 0, int(lids.base[leaf, 0])) == [Hop(leaf, 0, 0)]
    assert trace_route(f, lids, lft, leaf, 0, int(lids.base[src, 1])) == [Hop(leaf, 0, 1), Hop(src, 1, 0)]
    with pytest.raises(VerifyError, match="not assigned"):
        trace_route(f, lids, lft, src, 1, lids.max_lid + 5)
    with pytest.raises(VerifyError, match="port 0"):
        trace_route(f, lids, lft, leaf, 3, int(lids.base[src, 1]))
    with pytest.raises(VerifyError, match="no port 7"):
        trace_route(f, lids, lft, src, 7, int(lids.base[dst, 1]))


def brute_loads(f: Fabric, lids: LidMap, lft: Lft, pairs: np.ndarray) -> np.ndarray:
    loads = np.zeros((f.n_nodes, f.max_port + 1), np.int64)
    for n, p, lid in pairs.tolist():
        _st, hops = trace_status(f, lids, lft, (n, p), lid)
        for h in hops:
            if 0 < h.out_port <= f.nports[h.node] and f.is_up(h.node, h.out_port):
                loads[h.node, h.out_port] += 1
    return loads


def test_link_loads_match_traces() -> None:
    f = degrade(fattree(3, 4), links=3, seed=5)
    lids = sequential_lids(f)
    lft = UpDownEngine().compute(f, lids)
    rng = np.random.default_rng(0)
    ep = np.argwhere(lids.base > 0)
    src = ep[rng.integers(0, ep.shape[0], 300)]
    pairs = np.column_stack([src, rng.choice(lids.used(), 300)])
    assert np.array_equal(link_loads(f, lids, lft, pairs), brute_loads(f, lids, lft, pairs))
    lft[row(f, "core-0000"), :] = NO_ROUTE  # broken routes count the links crossed before the break
    assert np.array_equal(link_loads(f, lids, lft, pairs), brute_loads(f, lids, lft, pairs))
    with pytest.raises(VerifyError, match="LID"):
        link_loads(f, lids, lft, [[int(f.cas[0]), 1, 0]])


def brute_shift(f: Fabric, lids: LidMap, lft: Lft) -> tuple[int, float, float, int]:
    hosts = [(int(n), int(p)) for n, p in np.argwhere(lids.base > 0) if f.node_type[n] == NodeType.CA]
    n = len(hosts)
    sw = set(f.switches.tolist())
    n_links = 2 * f.switch_links().shape[0]
    mx, means, maxes, bad = 0, [], [], 0
    for s in range(1, n):
        load: dict[tuple[int, int], int] = {}
        for i, h in enumerate(hosts):
            st, hops = trace_status(f, lids, lft, h, int(lids.base[hosts[(i + s) % n]]))
            bad += st != Status.DELIVERED
            for a in hops:
                crossed = 0 < a.out_port <= f.nports[a.node] and f.is_up(a.node, a.out_port)
                if a.node in sw and crossed and int(f.peer_node[a.node, a.out_port]) in sw:
                    load[(a.node, a.out_port)] = load.get((a.node, a.out_port), 0) + 1
        m = max(load.values(), default=0)
        mx = max(mx, m)
        maxes.append(m)
        means.append(sum(load.values()) / n_links)
    return mx, float(np.mean(means)), float(np.mean(maxes)), bad


@pytest.mark.parametrize("which", ["fattree", "ring", "broken"])
def test_shift_quality_matches_traces(which: str) -> None:
    f = fattree(2, 4) if which != "ring" else ring(5, 2)
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    if which == "broken":
        lft[row(f, "spine-00"), int(lids.base[f.cas[0], 1])] = NO_ROUTE
    q = shift_quality(f, lids, lft, pairs_per_batch=17)
    mx, mean, mean_max, bad = brute_shift(f, lids, lft)
    assert (q.max_load, q.unrouted) == (mx, bad)
    assert q.mean_load == pytest.approx(mean) and q.mean_max_load == pytest.approx(mean_max)
    assert q.shifts == q.total_shifts == q.hosts - 1 and not q.sampled
    if which == "fattree":
        assert q.max_load == 1 and q.unrouted == 0  # a 2-level tree routes every shift contention-free


def test_shift_quality_sampling() -> None:
    f = fattree(2, 8)
    lids = sequential_lids(f)
    lft = MinHopEngine().compute(f, lids)
    q = shift_quality(f, lids, lft, max_shifts=5, seed=3)
    assert q.sampled and q.shifts == 5 and q.total_shifts == 31
    assert q == shift_quality(f, lids, lft, max_shifts=5, seed=3)
    assert q.max_load >= 1 and q.unrouted == 0


def test_lft_shape_checked() -> None:
    f = fattree(2, 4)
    lids = sequential_lids(f)
    with pytest.raises(VerifyError, match="LFT shape"):
        verify_routes(f, lids, np.zeros((3, 3), np.uint8))


def test_switch_to_switch_pairs_updn_cannot_serve_do_not_fail_verification() -> None:
    f = fattree(2, 8)
    lids = sequential_lids(f)
    rep = verify_routes(f, lids, make_engine("updn").compute(f, lids))
    # Spines reach each other only down then up, which up/down forbids: 4 spines, 12 ordered pairs.
    assert rep.switch_pairs_unreachable == rep.unreachable == 12
    assert rep.ok and rep.host_unreachable == 0
    assert rep.failures == []
