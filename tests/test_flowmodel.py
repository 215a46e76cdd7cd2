"""The congestion model: max-min fair rates, link loads, predicted XmitWait, eBB, emulator counters, CLI."""

from __future__ import annotations

import json
from collections import Counter as Tally

import numpy as np
import pytest

from fabric.emulator import Counter, EmulatedFabric
from fabric.errors import IbfmError
from fabric.formats.netfile import write_net
from fabric.generate import fattree, ring
from fabric.model import Fabric, Speed
from ibfm.cli import main
from sm.analysis.flowmodel import (
    CongestionReport,
    FlowModelError,
    ModelTraffic,
    effective_bisection_bandwidth,
    max_min_fair,
    predict_congestion,
    trace_flows,
)
from sm.analysis.patterns import Pattern, hosts, parse_pattern, random_bisection, shift
from sm.analysis.verify import link_loads, trace_route
from sm.lidmap import LidMap, sequential_lids
from sm.routing.base import Lft, make_engine

Routed = tuple[Fabric, LidMap, Lft]


def routed(f: Fabric, engine: str) -> Routed:
    lids = sequential_lids(f)
    return f, lids, make_engine(engine).compute(f, lids)


@pytest.fixture(scope="module")
def ft2() -> Routed:
    return routed(fattree(2, 8), "ftree")


@pytest.fixture(scope="module")
def ft3() -> Routed:
    return routed(fattree(3, 8), "ftree")


@pytest.fixture(scope="module")
def mh3() -> Routed:
    return routed(fattree(3, 8), "minhop")


def check_max_min(rep: CongestionReport) -> None:
    """Feasible, and every flow is at its demand or crosses a saturated link on which it is among the largest."""
    cap, load, rate = rep.links.capacity, rep.load, rep.rate
    f, lk = rep.paths.flow, rep.paths.link
    assert np.all(load <= cap * (1 + 1e-9))
    sat = load >= cap * (1 - 1e-9)
    top = np.zeros(cap.size)
    np.maximum.at(top, lk, rate[f])
    good = sat[lk] & (rate[f] >= top[lk] * (1 - 1e-9))
    has = np.zeros(rep.n_flows, np.bool_)
    has[f[good]] = True
    at_demand = rate >= rep.pattern.demand * (1 - 1e-9)
    ok = rep.paths.delivered
    assert np.all((has | at_demand)[ok])
    assert np.all(rate[~ok] == 0)
    # the reported bottleneck is such a link
    b = rep.bottleneck
    k = b >= 0
    assert np.all(sat[b[k]])


def reference_max_min(paths: list[list[int]], cap: dict[int, float], demand: list[float]) -> list[float]:
    """Textbook water-filling, one link at a time, in plain Python."""
    rate = [0.0] * len(paths)
    active = {i for i, p in enumerate(paths) if p}
    remaining = dict(cap)
    while active:
        on: dict[int, list[int]] = {}
        for i in active:
            for link in paths[i]:
                on.setdefault(link, []).append(i)
        inc = min(min(remaining[link] / len(fl) for link, fl in on.items()), min(demand[i] - rate[i] for i in active))
        for i in active:
            rate[i] += inc
        for link, fl in on.items():
            remaining[link] -= inc * len(fl)
        done = {i for i in active if demand[i] - rate[i] <= 1e-9 * max(1.0, demand[i])}
        done |= {i for link, fl in on.items() if remaining[link] <= 1e-9 * cap[link] for i in fl}
        active -= done
    return rate


# -- rates --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["ftree", "minhop"])
@pytest.mark.parametrize("spec", ["random-permutation:1", "random-bisection:4", "all-to-all", "incast:30"])
def test_no_link_above_capacity_and_max_min_optimal(engine: str, spec: str) -> None:
    f, lids, lft = routed(fattree(3, 8), engine) if engine == "minhop" else routed(fattree(3, 8), "ftree")
    rep = predict_congestion(f, lids, lft, parse_pattern(spec, f, lids))
    assert rep.unrouted == 0
    check_max_min(rep)


def test_matches_textbook_water_filling_with_finite_demands(mh3: Routed) -> None:
    f, lids, lft = mh3
    rng = np.random.default_rng(5)
    base = parse_pattern("random-permutation:9", f, lids)
    a2a = parse_pattern("all-to-all", f, lids)
    pick = rng.choice(a2a.n_flows, 300, replace=False)
    node = np.r_[base.src_node, a2a.src_node[pick]]
    port = np.r_[base.src_port, a2a.src_port[pick]]
    lid = np.r_[base.dst_lid, a2a.dst_lid[pick]]
    demand = rng.uniform(0.05, 1.2, node.size) * 50e9
    demand[::7] = np.inf
    p = Pattern("mixed", node, port, lid, demand)
    rep = predict_congestion(f, lids, lft, p)
    check_max_min(rep)
    paths: list[list[int]] = [[] for _ in range(p.n_flows)]
    for fl, lk in zip(rep.paths.flow.tolist(), rep.paths.link.tolist(), strict=True):
        paths[fl].append(lk)
    cap = dict(enumerate(rep.links.capacity.tolist()))
    want = reference_max_min(paths, cap, [min(d, 1e30) for d in demand.tolist()])
    assert np.allclose(rep.rate, want, rtol=1e-6)


@pytest.mark.parametrize("seed", range(8))
def test_water_filling_on_random_incidences(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_flows, n_links = 60, 25
    paths = [sorted(rng.choice(n_links, rng.integers(1, 6), replace=False).tolist()) for _ in range(n_flows)]
    cap = rng.choice([1.0, 2.0, 2.5, 4.0], n_links)
    demand = np.where(rng.random(n_flows) < 0.3, rng.uniform(0.01, 1.0, n_flows), np.inf)
    flow = np.repeat(np.arange(n_flows), [len(p) for p in paths])
    link = np.concatenate([np.array(p) for p in paths])
    hop = np.concatenate([np.arange(len(p)) for p in paths]).astype(np.int32)
    mm = max_min_fair(n_flows, flow, link, hop, cap, demand)
    want = reference_max_min(paths, dict(enumerate(cap.tolist())), [min(x, 1e30) for x in demand.tolist()])
    assert np.allclose(mm.rate, want, rtol=1e-9)
    load = np.bincount(link, weights=mm.rate[flow], minlength=n_links)
    k = mm.bottleneck >= 0
    assert np.allclose(load[mm.bottleneck[k]], cap[mm.bottleneck[k]])
    assert np.all(mm.bottleneck[~k] == -1) and np.allclose(mm.rate[~k], demand[~k])


def test_paths_match_link_loads_and_trace_route(mh3: Routed) -> None:
    f, lids, lft = mh3
    p = parse_pattern("all-to-all", f, lids)
    rep = predict_congestion(f, lids, lft, p)
    ll = link_loads(f, lids, lft, p.pairs())
    mine = np.zeros_like(ll)
    mine[rep.links.node, rep.links.port] = rep.flows_on
    assert np.array_equal(ll, mine)
    for k in (0, 77, 5000):
        hops = trace_route(f, lids, lft, int(p.src_node[k]), int(p.src_port[k]), int(p.dst_lid[k]))
        want = [(h.node, h.out_port) for h in hops if h.out_port]
        sel = rep.paths.flow == k
        order = np.argsort(rep.paths.hop[sel])
        got = [(int(rep.links.node[x]), int(rep.links.port[x])) for x in rep.paths.link[sel][order]]
        assert got == want


def test_incast_gives_each_sender_one_nth(ft2: Routed) -> None:
    f, lids, lft = ft2
    for n in (2, 3, 7, 31):
        rep = predict_congestion(f, lids, lft, parse_pattern(f"incast:{n}", f, lids))
        assert np.allclose(rep.rate_fraction, 1.0 / n)
        check_max_min(rep)
        dst = hosts(f, lids)[0]
        eject = rep.links.index[int(f.peer_node[dst[0], dst[1]]), int(f.peer_port[dst[0], dst[1]])]
        assert rep.link_utilization[eject] == pytest.approx(1.0)
        assert rep.bottlenecked[eject] == n
        # The congestion root sends all the time: no XmitWait there; every sender waits 1 - 1/N.
        assert rep.wait[eject] == 0.0
        inj = rep.links.index[rep.pattern.src_node, rep.pattern.src_port]
        assert np.allclose(rep.wait[inj], 1.0 - 1.0 / n)


def test_incast_spreads_xmit_wait_up_the_congestion_tree(ft2: Routed) -> None:
    f, lids, lft = ft2
    rep = predict_congestion(f, lids, lft, parse_pattern("incast:31", f, lids))
    w = rep.wait_fraction
    target = hosts(f, lids)[0]
    leaf0 = int(f.peer_node[target[0], target[1]])
    # Routing is by destination: the 28 remote flows (1/31 each) reach leaf 0 over one spine.
    down = [(s, p) for s in f.switches.tolist() for p, m, _ in f.neighbours(s) if m == leaf0 and rep.utilization[s, p]]
    assert len(down) == 1
    s, p = down[0]
    assert rep.utilization[s, p] == pytest.approx(28 / 31)
    assert w[s, p] == pytest.approx(3 / 31)  # waits whenever it is not sending
    # each remote leaf's uplink to that spine carries its 4 senders and waits the rest of the time
    lk = rep.links
    ups = [(n, q) for n, q, m in zip(lk.node, lk.port, lk.peer, strict=True) if m == s and n != leaf0]
    assert len(ups) == 7
    for n, q in ups:
        assert rep.utilization[n, q] == pytest.approx(4 / 31)
        assert w[n, q] == pytest.approx(27 / 31)
    # nothing else waits
    assert rep.flow_stats()["waiting_ports"] == np.count_nonzero(rep.wait) == 31 + 7 + 1


def test_offered_load_below_capacity_waits_only_what_it_cannot_send(ft2: Routed) -> None:
    f, lids, lft = ft2
    rep = predict_congestion(f, lids, lft, parse_pattern("incast:4@0.5", f, lids))
    inj = rep.links.index[rep.pattern.src_node, rep.pattern.src_port]
    assert np.allclose(rep.rate_fraction, 0.25)
    assert np.allclose(rep.wait[inj], 0.25)  # wants 0.5, sends 0.25
    rep = predict_congestion(f, lids, lft, parse_pattern("incast:4@0.2", f, lids))
    assert np.allclose(rep.rate_fraction, 0.2)
    assert rep.flow_stats()["waiting_ports"] == 0
    assert np.all(rep.bottleneck == -1)


def test_every_shift_runs_at_full_rate_on_ftree(ft2: Routed, ft3: Routed) -> None:
    for f, lids, lft in (ft2, ft3):
        n = hosts(f, lids).shape[0]
        for s in range(1, n):
            st = predict_congestion(f, lids, lft, shift(f, lids, s)).flow_stats()
            assert st["min"] == pytest.approx(1.0), s
            assert st["waiting_ports"] == 0


def test_minhop_worst_shift_is_worse_than_ftree(ft3: Routed, mh3: Routed) -> None:
    def worst(r: Routed) -> float:
        f, lids, lft = r
        return min(predict_congestion(f, lids, lft, shift(f, lids, s)).flow_stats()["min"] for s in range(1, 128))

    assert worst(ft3) == pytest.approx(1.0)
    assert worst(mh3) <= 0.5


def test_slow_link_caps_its_flows_and_backs_up_its_feeders(ft2: Routed) -> None:
    f0, lids, lft = ft2
    f = f0.copy()
    leaf, spine = f.by_name("leaf-00"), f.by_name("spine-00")
    up = next(p for p, m, _ in f.neighbours(leaf) if m == spine)
    q = int(f.peer_port[leaf, up])
    for n, p in ((leaf, up), (spine, q)):
        f.speed_active[n, p] = Speed.HDR  # 200 Gb/s instead of 400
    rep = predict_congestion(f, lids, lft, parse_pattern("shift:4", f, lids))
    check_max_min(rep)
    li = rep.links.index[leaf, up]
    assert rep.links.capacity[li] == 25e9
    crossing = np.flatnonzero(np.isin(np.arange(rep.n_flows), rep.paths.flow[rep.paths.link == li]))
    assert crossing.size == 1
    assert rep.rate_fraction[crossing] == pytest.approx(0.5)
    inj = rep.links.index[rep.pattern.src_node[crossing], rep.pattern.src_port[crossing]]
    assert rep.wait[inj] == pytest.approx(0.5)
    assert rep.wait[li] == 0.0
    # the other direction is slow too: its sender and the leaf port feeding the spine wait as well
    waiting = {h.src for h in rep.most_waiting()}
    assert len(waiting) == 3 and f.port_name(int(rep.pattern.src_node[crossing[0]]), 1) in waiting


def test_unroutable_flows_get_nothing(ft2: Routed) -> None:
    f, lids, lft0 = ft2
    lft = lft0.copy()
    p = shift(f, lids, 4)
    lft[:, int(p.dst_lid[0])] = 255
    rep = predict_congestion(f, lids, lft, p)
    assert rep.unrouted == 1 and rep.rate[0] == 0.0
    assert rep.flow_stats()["unrouted"] == 1
    check_max_min(rep)


def test_bad_flows_are_refused(ft2: Routed) -> None:
    f, lids, lft = ft2
    ep = hosts(f, lids)
    own = int(lids.base[ep[0, 0], ep[0, 1]])
    one = np.array([ep[0, 0]]), np.array([ep[0, 1]])
    with pytest.raises(FlowModelError, match="its own LID"):
        trace_flows(f, lids, lft, Pattern("x", *one, np.array([own]), np.array([np.inf])))
    with pytest.raises(FlowModelError, match=r"outside 1\.\."):
        trace_flows(f, lids, lft, Pattern("x", *one, np.array([lids.max_lid + 5]), np.array([1.0])))
    with pytest.raises(FlowModelError, match="source node"):
        trace_flows(f, lids, lft, Pattern("x", np.array([10**6]), one[1], np.array([own]), np.array([1.0])))
    with pytest.raises(FlowModelError, match=">= 0"):
        max_min_fair(1, np.array([0]), np.array([0]), np.array([0], np.int32), np.array([1.0]), np.array([-1.0]))
    with pytest.raises(IbfmError, match="tick_hz"):
        predict_congestion(f, lids, lft, shift(f, lids, 1), tick_hz=0.0)


# -- effective bisection bandwidth ----------------------------------------------------------------------


def brute_paper_ebb(f: Fabric, lids: LidMap, lft: Lft, seeds: range) -> float:
    """Hoefler et al.'s eBB pair by pair from trace_route."""
    per_sample = []
    for s in seeds:
        p = random_bisection(f, lids, s)
        paths = []
        for n, q, lid in p.pairs().tolist():
            paths.append([(h.node, h.out_port) for h in trace_route(f, lids, lft, n, q, lid) if h.out_port])
        count = Tally(x for path in paths for x in path)
        per_sample.append(np.mean([1.0 / max(count[x] for x in path) for path in paths]))
    return float(np.mean(per_sample))


@pytest.mark.parametrize("engine", ["ftree", "minhop"])
def test_ebb_matches_pair_by_pair_congestion_count(engine: str) -> None:
    f, lids, lft = routed(fattree(3, 4), engine)
    rep = effective_bisection_bandwidth(f, lids, lft, samples=12, seed=3, flows_per_batch=40)
    assert rep.samples == 12 and rep.hosts == 16
    assert rep.ebb == pytest.approx(brute_paper_ebb(f, lids, lft, range(3, 15)))
    # max-min never gives a flow less than the congestion count does
    assert np.all(rep.maxmin >= rep.paper - 1e-12)


def test_ebb_batches_are_independent(mh3: Routed) -> None:
    f, lids, lft = mh3
    one = effective_bisection_bandwidth(f, lids, lft, samples=9, seed=2)
    small = effective_bisection_bandwidth(f, lids, lft, samples=9, seed=2, flows_per_batch=200)
    assert np.allclose(one.paper, small.paper) and np.allclose(one.maxmin, small.maxmin)
    for i in (0, 4, 8):
        st = predict_congestion(f, lids, lft, random_bisection(f, lids, 2 + i)).flow_stats()
        assert one.maxmin[i] == pytest.approx(st["mean"])


def test_ebb_of_a_two_level_fat_tree_is_well_below_one() -> None:
    """648 hosts (k=36), D-mod-k routing: each leaf's 18 flows pick uplinks by destination, like
    balls into bins; E[1 / (1 + Bin(17, 1/18))] = 1 - (17/18)^18 = 0.643, a bit more since some
    flows stay on their leaf. Hoefler et al. report 55-60 % for full-bisection production fabrics
    under static routing (larger, three-stage trees, where flows meet congestion twice)."""
    f, lids, lft = routed(fattree(2, 36), "ftree")
    rep = effective_bisection_bandwidth(f, lids, lft, samples=20)
    assert 0.62 < rep.ebb < 0.70
    assert rep.ebb <= rep.ebb_maxmin < 0.75
    assert rep.unrouted == 0


def test_ebb_is_one_on_a_single_switch() -> None:
    f, lids, lft = routed(ring(1, 6, radix=8), "minhop")
    rep = effective_bisection_bandwidth(f, lids, lft, samples=5)
    assert rep.ebb == 1.0 == rep.ebb_maxmin
    with pytest.raises(FlowModelError):
        effective_bisection_bandwidth(f, lids, lft, samples=0)


# -- the emulator -----------------------------------------------------------------------------------------


def test_emulator_counters_follow_the_model(mh3: Routed) -> None:
    f, lids, lft = mh3
    rep = predict_congestion(f, lids, lft, parse_pattern("random-permutation:2", f, lids))
    assert rep.flow_stats()["waiting_ports"] > 10
    emu = EmulatedFabric(f, traffic=ModelTraffic(rep))
    emu.apply_subnet(lids.base, 0, lft)
    emu.advance(1.0)
    c = emu.counters
    wait = c[..., Counter.XMIT_WAIT].astype(np.float64)
    pred = rep.xmit_wait
    hot = np.unravel_index(np.argmax(pred), pred.shape)
    assert wait[hot] == wait.max() > 0
    assert np.all(np.abs(wait - pred) <= 1.0)
    words = c[..., Counter.XMIT_DATA].astype(np.float64)
    want = rep.utilization * port_cap(rep) * 1.0
    assert np.all(np.abs(words * 4 - want) <= 4.0)
    rcv = c[..., Counter.RCV_DATA]
    n, p = rep.links.node, rep.links.port
    assert np.array_equal(rcv[rep.links.peer, rep.links.peer_port], c[n, p, Counter.XMIT_DATA])
    pk = c[..., Counter.XMIT_PKTS].astype(np.float64)
    assert np.all(np.abs(pk - rep.xmit_bytes / 4096) <= 1.0)
    with pytest.raises(IbfmError, match="prediction for ports"):
        ModelTraffic(rep).rates(EmulatedFabric(fattree(2, 4)))


def port_cap(rep: CongestionReport) -> np.ndarray:
    out = np.zeros(rep.fabric.port_exists.shape)
    out[rep.links.node, rep.links.port] = rep.links.capacity
    return out


def test_report_is_a_prediction_for_the_exporters(ft2: Routed) -> None:
    from exporters.prometheus import PortPrediction

    f, lids, lft = ft2
    rep = predict_congestion(f, lids, lft, parse_pattern("incast:5", f, lids), tick_hz=1e6)
    pred = PortPrediction(rep.fabric, rep.utilization, rep.xmit_wait)
    assert pred.xmit_wait.max() == pytest.approx(0.8e6)
    assert rep.utilization.min() >= 0.0 and rep.utilization.max() <= 1.0 + 1e-9


# -- command line ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def netfile(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cf") / "ft2k8.net"
    write_net(fattree(2, 8), str(path))
    return str(path)


def test_cli_congestion_json(netfile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["congestion", "--topology", netfile, "--pattern", "incast:7", "--json", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "ftree" and out["pattern"] == "incast:7"
    assert out["rates"]["min"] == pytest.approx(1 / 7, abs=1e-6) and out["rates"]["flows"] == 7
    top = out["hottest"][0]
    assert top["dst"] == "host-00000[1]" and top["utilization"] == pytest.approx(1.0) and top["bottlenecked"] == 7
    assert len(out["hottest"]) == 3
    assert out["most_waiting"][0]["xmit_wait"] == pytest.approx(6 / 7, abs=1e-6)


def test_cli_congestion_text(netfile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["congestion", "--topology", netfile, "--engine", "minhop", "--pattern", "random-permutation:3"]) == 0
    out = capsys.readouterr().out
    assert "routed by minhop" in out and "hottest links" in out and "most XmitWait" in out


def test_cli_ebb(netfile: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ebb", "--topology", netfile, "--samples", "10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["engine"] for r in out["results"]] == ["ftree", "layered", "updn", "minhop"]
    assert all(0 < r["ebb"] <= r["ebb_maxmin"] <= 1 and r["samples"] == 10 for r in out["results"])
    assert main(["ebb", "--topology", netfile, "--samples", "5", "--engine", "updn"]) == 0
    assert "updn" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["congestion", "--pattern", "shift:0"], "'shift:0'"),
        (["congestion", "--pattern", "nope"], "unknown pattern 'nope'"),
        (["congestion", "--pattern", "shift:1", "--engine", "ftree"], None),
    ],
)
def test_cli_errors_are_one_line(
    netfile: str, tmp_path: object, capsys: pytest.CaptureFixture[str], argv: list[str], text: str | None
) -> None:
    if text is None:
        # A ring is no fat-tree: ftree alone refuses it.
        path = f"{tmp_path}/ring.net"
        write_net(ring(4, 1), path)
        assert main([*argv, "--topology", path]) == 2
        err = capsys.readouterr().err
        assert "not a fat-tree" in err
    else:
        assert main([*argv, "--topology", netfile]) == 2
        err = capsys.readouterr().err
        assert text in err
    assert err.count("\n") == 1 and err.startswith("ibfm: error: ")


def test_cli_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ebb", "--topology", "/nonexistent/x.net"]) == 2
    assert "/nonexistent/x.net" in capsys.readouterr().err
