"""Topology generators, degradation, shape detection and ``ibfm topo gen``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fabric.generate import (
    GenerateError,
    degrade,
    dragonfly,
    fattree,
    rail_cluster,
    random_regular,
    ring,
    torus,
    xgft,
)
from fabric.model import NO_PEER, Fabric, NodeType, PhysState, Speed
from fabric.shape import components, detect_shape, switch_ranks


def check_sane(f: Fabric) -> None:
    """Cables are symmetric, within port ranges, trained; names unique; every CA port cabled once."""
    n, p = np.nonzero(f.peer_node != NO_PEER)
    m, q = f.peer_node[n, p], f.peer_port[n, p]
    assert np.all(p >= 1) and np.all(p <= f.nports[n])
    assert np.all(q >= 1) and np.all(q <= f.nports[m])
    assert np.array_equal(f.peer_node[m, q], n) and np.array_equal(f.peer_port[m, q], p)
    assert not np.any((m == n) & (q == p))
    assert np.all(f.phys_state[n, p] == PhysState.LINKUP)
    assert len(set(f.names)) == f.n_nodes
    assert len(set(f.node_guid.tolist())) == f.n_nodes
    cas = f.cas
    linked = (f.peer_node[cas] != NO_PEER).sum(axis=1)
    assert np.all(linked == f.nports[cas]), "every CA port has its cable"
    # CAs hang only on switches.
    assert np.all(f.node_type[f.peer_node[cas, 1]] == NodeType.SWITCH)


def used_ports(f: Fabric, node: int) -> int:
    return int(np.count_nonzero(f.peer_node[node] != NO_PEER))


@pytest.mark.parametrize(
    ("levels", "k", "hosts", "switches", "sw_links"),
    [
        (2, 4, 8, 6, 8),
        (2, 8, 32, 12, 32),
        (2, 36, 648, 54, 648),
        (3, 4, 16, 20, 32),
        (3, 8, 128, 80, 256),
    ],
)
def test_fattree_counts(levels: int, k: int, hosts: int, switches: int, sw_links: int) -> None:
    f = fattree(levels, k)
    s = f.summary()
    assert (s["cas"], s["switches"], s["switch_links"]) == (hosts, switches, sw_links)
    assert s["links"] == hosts + sw_links
    check_sane(f)
    # A full fat-tree uses every port of every switch; hosts have one port.
    assert all(used_ports(f, i) == k for i in f.switches.tolist())
    assert np.all(f.nports[f.cas] == 1)
    assert f.descs == f.names


def test_fattree_k36_three_levels() -> None:
    f = fattree(3, 36)
    s = f.summary()
    assert (s["cas"], s["switches"], s["switch_links"]) == (11664, 1620, 23328)
    check_sane(f)
    info = detect_shape(f)
    assert (info.kind, info.levels, info.radix) == ("fat-tree", 3, 36)
    assert info.switches_per_level == [648, 648, 324]
    assert (info.missing_links, info.missing_switches, info.expected_switch_links) == (0, 0, 23328)


def test_fattree_port_numbering() -> None:
    k, half = 8, 4
    f = fattree(3, k)
    leaf = f.by_name("leaf-p05-s02")
    for a in range(half):
        assert f.names[f.peer_node[leaf, half + 1 + a]] == f"agg-p05-s{a:02d}"
        assert f.peer_port[leaf, half + 1 + a] == 2 + 1  # agg port l+1 for leaf l=2
    for i in range(half):
        host = int(f.peer_node[leaf, i + 1])
        assert f.names[host] == f"host-{(5 * half + 2) * half + i:05d}"
    agg = f.by_name("agg-p05-s03")
    for j in range(half):
        core = int(f.peer_node[agg, half + 1 + j])
        assert f.names[core] == f"core-{j * half + 3:04d}"
        assert f.peer_port[agg, half + 1 + j] == 5 + 1  # core port p+1 for pod p
    f2 = fattree(2, k)
    leaf = f2.by_name("leaf-06")
    assert [f2.names[f2.peer_node[leaf, half + 1 + s]] for s in range(half)] == [
        f"spine-{s:02d}" for s in range(half)
    ]
    assert np.all(f2.peer_port[leaf, half + 1 :] == 7)


@pytest.mark.parametrize("k", list(range(4, 65, 2)))
def test_fattree_every_even_radix(k: int) -> None:
    f = fattree(2, k)
    assert f.summary()["cas"] == k * k // 2
    assert int(f.nports[f.switches].max()) == k


@pytest.mark.parametrize("bad", [3, 2, 66, 0, 37])
def test_fattree_bad_radix(bad: int) -> None:
    with pytest.raises(GenerateError, match="radix"):
        fattree(2, bad)


def test_fattree_bad_levels_and_ratio() -> None:
    with pytest.raises(GenerateError, match="levels"):
        fattree(4, 8)
    with pytest.raises(GenerateError, match="oversubscribe"):
        fattree(3, 8, oversubscribe=(4, 2))
    with pytest.raises(GenerateError, match="D \\+ U"):
        fattree(2, 36, oversubscribe=(30, 12))


def test_fattree_oversubscribed() -> None:
    f = fattree(2, 36, oversubscribe=(24, 12))
    s = f.summary()
    assert (s["cas"], s["switches"], s["switch_links"]) == (864, 48, 432)
    check_sane(f)
    leaves = f.leaves()
    assert leaves.size == 36
    assert all(used_ports(f, i) == 36 for i in leaves.tolist())
    assert all(len(f.cas_under(i)) == 24 for i in leaves.tolist())
    spines = np.setdiff1d(f.switches, leaves)
    assert all(used_ports(f, i) == 36 for i in spines.tolist())
    info = detect_shape(f)
    assert (info.kind, info.levels, info.switches_per_level, info.missing_links) == (
        "fat-tree",
        2,
        [36, 12],
        0,
    )


def test_fattree_is_xgft() -> None:
    """The k-ary 3-level fat-tree is XGFT(3; k/2, k/2, k; 1, k/2, k/2), cable for cable."""
    a = fattree(3, 8)
    b = xgft(3, [4, 4, 8], [1, 4, 4])
    assert np.array_equal(a.link_array(), b.link_array())
    assert np.array_equal(a.node_type, b.node_type)
    a2 = fattree(2, 6)
    b2 = xgft(2, [3, 6], [1, 3])
    assert np.array_equal(a2.link_array(), b2.link_array())


def test_xgft_counts() -> None:
    # XGFT(3; 2,3,4; 2,2,3): level l holds prod(m_{l+1..}) * prod(w_{..l}) nodes.
    f = xgft(3, [2, 3, 4], [2, 2, 3])
    check_sane(f)
    names = f.names
    per = [sum(1 for x in names if x.startswith(f"sw-L{lv}-")) for lv in (1, 2, 3)]
    assert f.cas.size == 24
    assert per == [3 * 4 * 2, 4 * 2 * 2, 2 * 2 * 3]
    # Multi-port hosts (w1 = 2): each CA has two ports, both cabled.
    assert np.all(f.nports[f.cas] == 2)
    assert f.summary()["links"] == 24 * 2 + 24 * 2 + 16 * 3
    info = detect_shape(f)
    assert (info.kind, info.levels, info.switches_per_level, info.missing_links) == (
        "fat-tree",
        3,
        per,
        0,
    )
    with pytest.raises(GenerateError):
        xgft(2, [4], [1, 4])
    with pytest.raises(GenerateError, match="ports"):
        xgft(2, [40, 40], [1, 40])


def test_rail_cluster() -> None:
    f = rail_cluster(32, 8)
    check_sane(f)
    s = f.summary()
    assert (s["cas"], s["switches"]) == (256, 8 + 4)
    hca = f.by_name("dgx-017-mlx5_3")
    assert f.descs[hca] == "dgx-017 mlx5_3"
    assert f.names[f.peer_node[hca, 1]] == "rail-3-leaf-00"
    assert f.peer_port[hca, 1] == 17  # host 17 is the 17th of its group
    # The HCAs of one host share a SystemImageGUID, distinct from other hosts'.
    same = [f.by_name(f"dgx-017-mlx5_{r}") for r in range(8)]
    assert len(set(f.sysimg_guid[same].tolist())) == 1
    assert f.sysimg_guid[same[0]] != f.sysimg_guid[f.by_name("dgx-018-mlx5_0")]
    # Rail r's leaf carries exactly HCA r of every host.
    for r in range(8):
        leaf = f.by_name(f"rail-{r}-leaf-00")
        assert {f.descs[m].split()[1] for _p, m, _q in f.cas_under(leaf)} == {f"mlx5_{r}"}
        assert used_ports(f, leaf) == 64
    info = detect_shape(f)
    assert (info.kind, info.levels, info.switches_per_level, info.missing_links) == ("fat-tree", 2, [8, 4], 0)


def test_rail_cluster_groups() -> None:
    f = rail_cluster(40, 4, hosts_per_leaf=16, radix=32)
    check_sane(f)
    # 3 groups per rail (16+16+8 hosts): 12 leaves with 16 uplinks each; 12 * L <= 32 ports
    # allows L = 2 links per leaf-spine pair, so 8 spines of 24 used ports.
    assert f.leaves().size == 12
    assert f.switches.size == 12 + 8
    assert f.summary()["switch_links"] == 12 * 16
    spines = np.setdiff1d(f.switches, f.leaves())
    assert all(used_ports(f, s) == 24 for s in spines.tolist())
    leaf = f.by_name("rail-1-leaf-02")
    assert [f.names[f.peer_node[leaf, p]] for p in (17, 18, 19)] == ["spine-00", "spine-00", "spine-01"]
    assert f.names[f.peer_node[f.by_name("dgx-040-mlx5_2"), 1]] == "rail-2-leaf-02"
    with pytest.raises(GenerateError, match="leaves"):
        rail_cluster(200, 8, radix=32)


def test_ring() -> None:
    f = ring(6, hosts_per_switch=2)
    check_sane(f)
    s = f.summary()
    assert (s["switches"], s["cas"], s["switch_links"]) == (6, 12, 6)
    sw = f.by_name("sw-00")
    assert f.names[f.peer_node[sw, 3]] == "sw-01" and f.peer_port[sw, 3] == 4
    assert f.names[f.peer_node[sw, 4]] == "sw-05"
    info = detect_shape(f)
    assert (info.kind, info.dims) == ("ring", [6])
    two = ring(2)
    assert two.summary()["switch_links"] == 1
    with pytest.raises(GenerateError, match="ports"):
        ring(4, hosts_per_switch=7, radix=8)


@pytest.mark.parametrize(
    ("dims", "links"),
    [([4, 4], 32), ([3, 5], 30), ([4, 4, 4], 192), ([4, 2], 12), ([3, 3, 2], 45)],
)
def test_torus(dims: list[int], links: int) -> None:
    f = torus(dims, hosts_per_switch=2)
    check_sane(f)
    n = int(np.prod(dims))
    s = f.summary()
    assert (s["switches"], s["cas"], s["switch_links"]) == (n, 2 * n, links)
    # No parallel cables, even in a dimension of 2.
    la = f.switch_links()
    pairs = {tuple(sorted((a, c))) for a, _b, c, _d in la.tolist()}
    assert len(pairs) == la.shape[0]
    info = detect_shape(f)
    assert info.kind == "torus"
    assert sorted(info.dims) == sorted(dims)


def test_torus_wraparound_ports() -> None:
    f = torus([3, 4], hosts_per_switch=1)
    sw = f.by_name("sw-02-03")
    # dim 0 plus (port 2) wraps to x=0, dim 1 plus (port 4) wraps to y=0.
    assert f.names[f.peer_node[sw, 2]] == "sw-00-03" and f.peer_port[sw, 2] == 3
    assert f.names[f.peer_node[sw, 4]] == "sw-02-00" and f.peer_port[sw, 4] == 5
    with pytest.raises(GenerateError):
        torus([4, 0])


def test_degrade_reproducible_and_counts() -> None:
    f = fattree(3, 8)
    before = f.peer_node.copy()
    a = degrade(f, links=10, switches=2, seed=7)
    b = degrade(f, links=10, switches=2, seed=7)
    c = degrade(f, links=10, switches=2, seed=8)
    assert np.array_equal(f.peer_node, before), "input untouched"
    assert a.names == b.names and np.array_equal(a.peer_node, b.peer_node)
    assert not (a.names == c.names and np.array_equal(a.peer_node, c.peer_node))
    check_sane(a)
    assert a.n_nodes == f.n_nodes - 2
    assert a.cas.size == f.cas.size
    removed = set(f.names) - set(a.names)
    assert all(not n.startswith(("leaf", "host")) for n in removed)
    # 10 links cut after removing two switches of 8 links each (minus a shared one, if any).
    lost_with_switches = sum(used_ports(f, f.by_name(n)) for n in removed)
    shared = sum(
        1 for x in removed for y in removed if x < y and f.by_name(y) in f.peer_node[f.by_name(x)].tolist()
    )
    expected = f.summary()["switch_links"] - (lost_with_switches - shared) - 10
    assert a.summary()["switch_links"] == expected
    # Hosts keep their only link.
    assert np.all(a.peer_node[a.cas, 1] != NO_PEER)


def test_degrade_fraction_and_connectivity() -> None:
    f = fattree(2, 8)
    g = degrade(f, fraction=0.25, seed=3)
    assert g.summary()["switch_links"] == 32 - 8
    sl = g.switch_links()
    lab = components(g.n_nodes, sl[:, 0], sl[:, 2])
    assert np.unique(lab[g.switches]).size == 1
    # Keeping a spanning tree of 12 switches allows at most 32 - 11 removals.
    h = degrade(f, links=21, seed=1)
    sl = h.switch_links()
    assert sl.shape[0] == 11
    assert np.unique(components(h.n_nodes, sl[:, 0], sl[:, 2])[h.switches]).size == 1
    with pytest.raises(GenerateError, match="splitting"):
        degrade(f, links=22, seed=1)
    split = degrade(f, links=32, seed=1, keep_connected=False)
    assert split.summary()["switch_links"] == 0
    with pytest.raises(GenerateError):
        degrade(f, links=1, fraction=0.1)
    with pytest.raises(GenerateError, match="carry no host"):
        degrade(f, switches=5)


def test_shape_degraded() -> None:
    f = fattree(3, 8)
    g = degrade(f, links=5, seed=11)
    info = detect_shape(g)
    assert (info.kind, info.levels, info.expected_switch_links, info.missing_links) == ("fat-tree", 3, 256, 5)
    h = degrade(f, switches=1, seed=2)
    gone = (set(f.names) - set(h.names)).pop()
    info = detect_shape(h)
    assert info.kind == "fat-tree"
    assert (info.missing_switches, info.missing_links) == (1, 8)
    level = 1 if gone.startswith("agg") else 2
    assert info.switches_per_level[level] == [32, 32, 16][level] - 1
    d = info.as_dict()
    assert d["missing_links"] == 8 and d["kind"] == "fat-tree"
    assert "1 switches missing" in info.describe()


def test_shape_irregular_and_ranks() -> None:
    f = fattree(2, 4)
    ranks = switch_ranks(f)
    assert np.all(ranks[f.cas] == -1)
    assert np.all(ranks[f.leaves()] == 0)
    spines = np.setdiff1d(f.switches, f.leaves())
    assert np.all(ranks[spines] == 1)
    # Cable two leaves together on their spare ports: no longer a fat-tree.
    g = fattree(2, 4, oversubscribe=(1, 2))
    a, b = g.leaves()[:2].tolist()
    g.connect(a, 4, b, 4)
    info = detect_shape(g)
    assert info.kind == "irregular"
    assert "ranks 0 and 0" in info.note
    assert detect_shape(torus([4, 4], hosts_per_switch=0)).kind == "torus"
    assert detect_shape(ring(1)).kind == "single-switch"
    empty = Fabric(0, 1)
    assert detect_shape(empty).kind == "empty"


def test_generated_speed() -> None:
    f = fattree(2, 4, speed=Speed.HDR)
    la = f.link_array()
    assert np.all(f.speed_active[la[:, 0], la[:, 1]] == Speed.HDR)


# -- command line ---------------------------------------------------------------------------------------


def run_cli(*argv: str) -> int:
    from ibfm.cli import main

    return main(list(argv))


def test_cli_gen_fattree(tmp_path: Path) -> None:
    from fabric.formats.netfile import read_net

    out = tmp_path / "ft.net"
    assert run_cli("topo", "gen", "fattree", "--levels", "3", "--radix", "4", "-o", str(out)) == 0
    f = read_net(out)
    assert f.summary()["cas"] == 16 and f.summary()["switches"] == 20
    assert detect_shape(f).switches_per_level == [8, 8, 4]

    out2 = tmp_path / "deg.net"
    argv = ["topo", "gen", "fattree", "--levels", "2", "--radix", "8", "--degrade-links", "3"]
    assert run_cli(*argv, "--degrade-switches", "1", "--seed", "4", "-o", str(out2)) == 0
    info = detect_shape(read_net(out2))
    assert info.missing_switches == 1 and info.missing_links == 8 + 3


@pytest.mark.parametrize(
    "argv",
    [
        ["torus", "--dims", "3x4x2"],
        ["ring", "--switches", "5"],
        ["rail", "--hosts", "8", "--rails", "4"],
        ["xgft", "--h", "2", "--m", "4,4", "--w", "1,4"],
        ["fattree", "--levels", "2", "--radix", "36", "--oversubscribe", "24:12"],
    ],
)
def test_cli_gen_kinds(tmp_path: Path, argv: list[str]) -> None:
    from fabric.formats.netfile import read_net

    out = tmp_path / "t.net"
    assert run_cli("topo", "gen", *argv, "-o", str(out)) == 0
    assert read_net(out).n_nodes > 0


@pytest.mark.parametrize(
    "argv",
    [
        ["fattree", "--levels", "4", "--radix", "8"],
        ["fattree", "--levels", "2", "--radix", "x"],
        ["fattree", "--levels", "2", "--radix", "8", "--oversubscribe", "24-12"],
        ["torus", "--dims", "4xq"],
        ["xgft", "--h", "2", "--m", "4,a", "--w", "1,4"],
        ["fattree", "--levels", "2", "--radix", "8", "--degrade-fraction", "1.5"],
    ],
)
def test_cli_gen_argparse_errors(tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        run_cli("topo", "gen", *argv, "-o", str(tmp_path / "x.net"))
    assert e.value.code == 2


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (["fattree", "--levels", "2", "--radix", "7"], "radix 7"),
        (["fattree", "--levels", "3", "--radix", "8", "--oversubscribe", "4:4"], "oversubscribe"),
        (["torus", "--dims", "8"], "2 or 3 dimensions"),
        (["fattree", "--levels", "2", "--radix", "4", "--degrade-links", "99"], "99 links"),
    ],
)
def test_cli_gen_ibfm_errors(
    tmp_path: Path, argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.net"
    assert run_cli("topo", "gen", *argv, "-o", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ibfm: error:") and msg in err and "\n" not in err
    assert not out.exists()


# -- against ibsim ------------------------------------------------------------------------------------------


def cabling(f: Fabric) -> set[frozenset[tuple[int, int]]]:
    """Links as pairs of (node GUID, port): independent of node order and ids."""
    g = f.node_guid.tolist()
    return {frozenset({(g[a], p), (g[b], q)}) for a, p, b, q in f.link_array().tolist()}


@pytest.mark.ibsim
@pytest.mark.parametrize(
    "make",
    [
        lambda: fattree(3, 4, speed=Speed.HDR),
        lambda: rail_cluster(4, 2, radix=8, speed=Speed.HDR),  # parallel leaf-spine links
        lambda: degrade(torus([3, 3], hosts_per_switch=1, speed=Speed.HDR), links=2, seed=5),
    ],
    ids=["fattree-3-4", "rail-4x2", "torus-3x3-degraded"],
)
def test_ibsim_accepts_generated(tmp_path: Path, make: object, ibsim_tools: None) -> None:
    from fabric.formats.netfile import parse_net, write_net
    from fabric.ibsim import IbsimProcess

    f = make()  # type: ignore[operator]
    path = tmp_path / "gen.net"
    write_net(f, path)
    with IbsimProcess(path) as sim:
        out = sim.run(["ibnetdiscover"], timeout=60).stdout
    seen = parse_net(out, "ibnetdiscover")
    assert seen.summary() == f.summary()
    assert cabling(seen) == cabling(f)
    assert sorted(seen.node_guid.tolist()) == sorted(f.node_guid.tolist())
    la = seen.link_array()
    assert np.all(seen.speed_active[la[:, 0], la[:, 1]] == Speed.HDR)
    a, b = detect_shape(seen).as_dict(), detect_shape(f).as_dict()
    assert {**a, "note": ""} == {**b, "note": ""}  # the note names nodes, by GUID ids in ibnetdiscover output


def test_oversubscribed_tree_is_a_design_not_a_failure() -> None:
    s = detect_shape(fattree(2, 48, oversubscribe=(24, 12)))
    assert s.kind == "fat-tree" and s.missing_links == 0 and s.missing_switches == 0
    lost_spine = detect_shape(degrade(fattree(2, 8), switches=1, seed=1))
    assert lost_spine.missing_switches == 1


def test_connect_many_equals_one_at_a_time_and_refuses_bad_rows() -> None:
    from fabric.model import FabricError

    f = degrade(fattree(3, 8), fraction=0.05, seed=3)
    links = f.link_array(up_only=False)
    bare = f.copy()
    for name, value in (("peer_node", NO_PEER), ("peer_port", NO_PEER), ("state", 0), ("phys_state", 0)):
        getattr(bare, name)[:] = value
    one, many = bare.copy(), bare.copy()
    for a, b, c, d in links.tolist():
        one.connect(a, b, c, d)
    many.connect_many(links)
    for name in ("peer_node", "peer_port", "state", "phys_state", "width_active", "speed_active"):
        assert (getattr(one, name) == getattr(many, name)).all(), name
    # A row that reuses a port names it, and nothing of the batch is connected.
    again = bare.copy()
    a, b, c, d = links[0].tolist()
    bad = np.vstack([links[:5], [[a, b, c, d + 0 if d == 1 else 1]]])
    with pytest.raises(FabricError, match=f"port {b} of {again.names[a]!r} already linked"):
        again.connect_many(bad)
    assert (again.peer_node == NO_PEER).all()
    with pytest.raises(FabricError, match="linked to itself"):
        again.connect_many(np.array([[a, b, a, b]]))
    with pytest.raises(FabricError, match="no node"):
        again.connect_many(np.array([[a, b, 10**6, 1]]))
    # The GUID lookups rebuilt without a per-node loop: every end port by its port GUID.
    for n, p in f.endports().tolist():
        assert f.by_port_guid(int(f.port_guid[n, p])) == (n, p)


# -- dragonfly and random regular graphs --------------------------------------------------------------------


def _switch_graph(f: Fabric) -> dict[int, list[int]]:
    """Switch node -> the switches its cables reach, one entry per cable."""
    out: dict[int, list[int]] = {int(s): [] for s in f.switches}
    for a, _, b, _ in f.link_array().tolist():
        if f.is_switch(a) and f.is_switch(b):
            out[a].append(b)
            out[b].append(a)
    return out


@pytest.mark.parametrize(("g", "a", "p", "h"), [(9, 4, 2, 2), (5, 2, 1, 2), (4, 4, 2, 3), (3, 2, 0, 1)])
def test_dragonfly_groups_all_to_all_and_every_pair_of_groups_linked_alike(g: int, a: int, p: int, h: int) -> None:
    f = dragonfly(g, a, p, h)
    assert len(f.switches) == g * a and len(f.cas) == g * a * p
    group = {int(s): int(f.names[s][1:3]) for s in f.switches}
    nbrs = _switch_graph(f)
    per = a * h // (g - 1)
    between: Counter[tuple[int, int]] = Counter()
    for s, others in nbrs.items():
        local = [o for o in others if group[o] == group[s]]
        assert sorted(local) == sorted(o for o in group if group[o] == group[s] and o != s)  # all-to-all, once
        remote = [o for o in others if group[o] != group[s]]
        assert len(remote) <= h
        for o in remote:
            between[(group[s], group[o])] += 1
    assert set(between) == {(i, j) for i in range(g) for j in range(g) if i != j}
    assert set(between.values()) == {per}
    ports = f.nports[f.switches]
    assert (ports == p + a - 1 + h).all()  # radix defaults to what a router needs
    for s in f.switches.tolist():  # hosts first
        for port in range(1, p + 1):
            assert not f.is_switch(int(f.peer_node[s, port]))


def test_dragonfly_refuses_what_it_cannot_build() -> None:
    with pytest.raises(GenerateError, match="global links per group"):
        dragonfly(10, 4, 2, 2)  # 9 other groups, 8 global slots
    with pytest.raises(GenerateError, match="needs 7 ports"):
        dragonfly(5, 4, 2, 2, radix=6)
    with pytest.raises(GenerateError, match="groups >= 2"):
        dragonfly(1, 4, 2, 2)


def test_random_regular_is_regular_connected_and_reproducible() -> None:
    f = random_regular(24, 5, 2, seed=7)
    nbrs = _switch_graph(f)
    assert all(len(v) == 5 for v in nbrs.values()) and all(len(set(v)) == 5 for v in nbrs.values())
    import networkx as nx

    graph = nx.Graph([(a, b) for a, bs in nbrs.items() for b in bs])
    assert nx.is_connected(graph) and len(f.cas) == 48
    again = random_regular(24, 5, 2, seed=7)
    assert f.link_array().tolist() == again.link_array().tolist()
    other = random_regular(24, 5, 2, seed=8)
    assert f.link_array().tolist() != other.link_array().tolist()
    for bad in ((5, 3, 1), (4, 4, 1), (1, 1, 1)):
        with pytest.raises(GenerateError):
            random_regular(*bad)


@pytest.mark.parametrize("make", [lambda: dragonfly(5, 2, 1, 2), lambda: random_regular(12, 3, 1, seed=3)])
async def test_the_sm_routes_them_deadlock_free(make: Any) -> None:
    from fabric.emulator import EmulatedFabric
    from sm.sweep.manager import FabricManager, SmConfig
    from sm.transport.emulated import EmulatedTransport

    f = make()
    snap = await FabricManager(
        EmulatedTransport(EmulatedFabric(f), issm=True), SmConfig(offload=False)
    ).heavy_sweep()
    assert snap.up and snap.verify.unreachable == 0 and not snap.credit_loops
