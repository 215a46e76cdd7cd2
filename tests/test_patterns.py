"""Traffic patterns: shift, permutations, bisections, all-to-all, incast, rings, measured matrices."""

from __future__ import annotations

import numpy as np
import pytest

from fabric.errors import IbfmError
from fabric.generate import fattree, rail_cluster
from fabric.model import Fabric
from sm.analysis.patterns import (
    Pattern,
    PatternError,
    _derangement,
    from_counters,
    hosts,
    parse_pattern,
    port_capacity,
)
from sm.lidmap import LidMap, sequential_lids


@pytest.fixture(scope="module")
def tree() -> tuple[Fabric, LidMap]:
    f = fattree(2, 8)  # 32 hosts
    return f, sequential_lids(f)


def host_index(f: Fabric, lids: LidMap, p: Pattern) -> tuple[np.ndarray, np.ndarray]:
    """(source host index, destination host index) of every flow."""
    ep = hosts(f, lids)
    key = {(int(n), int(q)): i for i, (n, q) in enumerate(ep.tolist())}
    src = np.array([key[(int(n), int(q))] for n, q in zip(p.src_node, p.src_port, strict=True)])
    dst = np.array([key[(int(lids.owner_node[x]), int(lids.owner_port[x]))] for x in p.dst_lid])
    return src, dst


def test_hosts_are_up_ca_ports_with_a_lid(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    ep = hosts(f, lids)
    assert ep.shape == (32, 2)
    assert set(ep[:, 0].tolist()) == set(f.cas.tolist())
    g = f.copy()
    g.link_down(int(f.cas[3]), 1)
    assert hosts(g, lids).shape[0] == 31


def test_port_capacity_is_lanes_times_lane_rate(tree: tuple[Fabric, LidMap]) -> None:
    f, _ = tree
    cap = port_capacity(f)
    up = f.up_mask()
    assert np.all(cap[up] == 50e9)  # 4x NDR = 400 Gb/s
    assert np.all(cap[~up] == 0)


def test_shift(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    p = parse_pattern("shift:5", f, lids)
    src, dst = host_index(f, lids, p)
    assert p.n_flows == 32
    assert np.array_equal(dst, (src + 5) % 32)
    assert np.isinf(p.demand).all()
    assert p.pairs().shape == (32, 3)
    assert np.array_equal(host_index(f, lids, parse_pattern("ring", f, lids))[1], (np.arange(32) + 1) % 32)


def test_random_permutation_is_a_seeded_derangement(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    p = parse_pattern("random-permutation:7", f, lids)
    src, dst = host_index(f, lids, p)
    assert sorted(src.tolist()) == list(range(32)) == sorted(dst.tolist())
    assert not np.any(src == dst)
    q = parse_pattern("random-permutation:7", f, lids)
    assert np.array_equal(p.dst_lid, q.dst_lid)
    assert not np.array_equal(p.dst_lid, parse_pattern("random-permutation:8", f, lids).dst_lid)
    assert np.array_equal(parse_pattern("random-permutation", f, lids).dst_lid,
                          parse_pattern("random-permutation:0", f, lids).dst_lid)


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_derangement_never_keeps_a_fixed_point(n: int) -> None:
    for seed in range(200):
        d = _derangement(n, np.random.default_rng(seed))
        assert sorted(d.tolist()) == list(range(n))
        assert not np.any(d == np.arange(n))


def test_random_bisection_pairs_the_halves_both_ways(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    p = parse_pattern("random-bisection:3", f, lids)
    src, dst = host_index(f, lids, p)
    assert p.n_flows == 32
    assert sorted(src.tolist()) == list(range(32)) == sorted(dst.tolist())
    partner = dict(zip(src.tolist(), dst.tolist(), strict=True))
    assert all(partner[partner[i]] == i and partner[i] != i for i in range(32))
    # the first flows run from half A to half B: the halves are disjoint
    a, b = set(src[:16].tolist()), set(dst[:16].tolist())
    assert not a & b and len(a | b) == 32


def test_random_bisection_with_an_odd_host_count_leaves_one_out(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    g = f.copy()
    g.link_down(int(f.cas[0]), 1)
    p = parse_pattern("random-bisection:1", g, lids)
    assert p.n_flows == 30


def test_all_to_all_and_load_suffix(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    p = parse_pattern("all-to-all", f, lids)
    src, dst = host_index(f, lids, p)
    assert p.n_flows == 32 * 31
    assert not np.any(src == dst)
    assert len(set(zip(src.tolist(), dst.tolist(), strict=True))) == 32 * 31
    q = parse_pattern("all-to-all@0.5", f, lids)
    per_src = np.bincount(host_index(f, lids, q)[0], weights=q.demand)
    assert np.allclose(per_src, 0.5 * 50e9)
    s = parse_pattern("shift:1@0.25", f, lids)
    assert np.allclose(s.demand, 0.25 * 50e9)


def test_incast(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    p = parse_pattern("incast:7", f, lids)
    src, dst = host_index(f, lids, p)
    assert p.n_flows == 7 and len(set(src.tolist())) == 7
    assert set(dst.tolist()) == {0} and 0 not in src
    p = parse_pattern("incast:31:5", f, lids)
    src, dst = host_index(f, lids, p)
    assert set(dst.tolist()) == {5} and sorted(src.tolist()) == [i for i in range(32) if i != 5]


def test_ring_per_rail_stays_on_its_rail() -> None:
    f = rail_cluster(6, 4, hosts_per_leaf=3, radix=16)
    lids = sequential_lids(f)
    p = parse_pattern("ring-per-rail", f, lids)
    assert p.n_flows == 24
    for n, lid in zip(p.src_node.tolist(), p.dst_lid.tolist(), strict=True):
        a, b = f.descs[n].split(), f.descs[int(lids.owner_node[lid])].split()
        assert a[1] == b[1]  # same mlx5_R
        assert int(b[0].split("-")[1]) == int(a[0].split("-")[1]) % 6 + 1  # host h -> h + 1
    # Without shared system images the host comes from NodeDescription's first word.
    g = f.copy()
    g.sysimg_guid[:] = g.node_guid
    q = parse_pattern("ring-per-rail", g, lids)
    assert np.array_equal(np.sort(q.dst_lid), np.sort(p.dst_lid))
    assert np.array_equal(q.dst_lid[np.argsort(q.src_node)], p.dst_lid[np.argsort(p.src_node)])
    # The flat ring goes HCA by HCA: mlx5_0 -> mlx5_1 of the same host.
    r = parse_pattern("ring", f, lids)
    assert f.descs[int(lids.owner_node[r.dst_lid[0]])] == "dgx-001 mlx5_1"


def test_ring_per_rail_on_single_hca_hosts_is_the_ring(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    a, b = parse_pattern("ring-per-rail", f, lids), parse_pattern("ring", f, lids)
    assert np.array_equal(a.src_node, b.src_node) and np.array_equal(a.dst_lid, b.dst_lid)


def test_from_counters_is_a_gravity_model(tree: tuple[Fabric, LidMap]) -> None:
    f, lids = tree
    ep = hosts(f, lids)
    shape = f.port_exists.shape
    x = np.full(shape, np.nan)
    r = np.zeros(shape)
    rng = np.random.default_rng(0)
    x[ep[:, 0], ep[:, 1]] = rng.uniform(0, 1e9, ep.shape[0])
    x[ep[3, 0], ep[3, 1]] = np.nan  # not measured: sends nothing
    r[ep[:, 0], ep[:, 1]] = rng.uniform(0, 1e9, ep.shape[0])
    r[ep[5, 0], ep[5, 1]] = 0.0  # receives nothing
    p = from_counters(f, lids, x, r)
    src, dst = host_index(f, lids, p)
    assert not np.any(src == dst) and 3 not in src and 5 not in dst
    sent = np.bincount(src, weights=p.demand, minlength=32)
    want = np.nan_to_num(x[ep[:, 0], ep[:, 1]])
    assert np.allclose(sent, want)
    # Each source spreads in proportion to what the others receive.
    k = src == 0
    rr = r[ep[dst[k], 0], ep[dst[k], 1]]
    assert np.allclose(p.demand[k] / p.demand[k].sum(), rr / rr.sum())
    even = from_counters(f, lids, x)
    k = host_index(f, lids, even)[0] == 0
    assert np.allclose(even.demand[k], want[0] / 31)
    with pytest.raises(PatternError, match="port shape"):
        from_counters(f, lids, np.zeros((2, 2)))
    bad = np.zeros(shape)
    bad[ep[0, 0], ep[0, 1]] = -1.0
    with pytest.raises(PatternError, match=">= 0"):
        from_counters(f, lids, bad)


@pytest.mark.parametrize(
    "spec",
    [
        "bogus",
        "shift",
        "shift:0",
        "shift:32",
        "shift:x",
        "shift:1:2",
        "random-permutation:abc",
        "random-permutation:-1",
        "random-bisection:1:2",
        "all-to-all:3",
        "incast",
        "incast:0",
        "incast:32",
        "incast:3:99",
        "ring:2",
        "shift:1@",
        "shift:1@0",
        "shift:1@nan",
        "shift:1@x",
    ],
)
def test_bad_specs_name_themselves(tree: tuple[Fabric, LidMap], spec: str) -> None:
    f, lids = tree
    with pytest.raises(IbfmError) as e:
        parse_pattern(spec, f, lids)
    assert repr(spec) in str(e.value)
    assert isinstance(e.value, PatternError)


def test_too_few_hosts() -> None:
    f = fattree(2, 4)
    lids = sequential_lids(f)
    g = f.copy()
    for n in f.cas[1:].tolist():
        g.link_down(n, 1)
    with pytest.raises(PatternError, match="at least 2 hosts"):
        parse_pattern("shift:1", g, lids)
