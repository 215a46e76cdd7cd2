"""The Prometheus exporter on an emulated fabric with a real PerfManager: names, labels, values, caching,
OpenMetrics, gzip, and the selection of groups and shards."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import logging
import re
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from exporters import metrics as M
from exporters.metrics import MetricType
from exporters.prometheus import (
    CONTENT_TYPE,
    OPENMETRICS_CONTENT_TYPE,
    FabricCollector,
    MetricsError,
    MetricsInputs,
    MetricsRenderer,
    PortPrediction,
    Segment,
    Selection,
    SelectionError,
    SmFigures,
    SweepStats,
    accepts_gzip,
    accepts_openmetrics,
    crc32_combine,
    metrics_handler,
    render_metrics,
    shard_hash,
)
from fabric.emulator import ConstantTraffic, Counter, EmulatedFabric
from fabric.generate import fattree
from fabric.model import Fabric, FabricBuilder, NodeType, PortState
from sm.perf.perfmgr import KEYS, PerfManager
from sm.sweep.manager import FabricManager, SubnetSnapshot
from sm.transport.emulated import EmulatedTransport
from tests.conftest import need_tool

ROOT = Path(__file__).resolve().parent.parent

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class Rig:
    """An emulated subnet brought up by the FabricManager, with a bound PerfManager."""

    emu: EmulatedFabric
    mgr: FabricManager
    pm: PerfManager
    snap: SubnetSnapshot
    stats: SweepStats = field(default_factory=SweepStats)

    def inputs(self, **kw: object) -> MetricsInputs:
        role = self.mgr.elector.role()
        sm = SmFigures(int(role.state), role.priority, role.guid, role.master_guid, role.master_lid, 7, 9, 1, 2,
                       m_key_traps=4, mcast_groups=2, mcast_members=5, mft_blocks_sent=12)  # fmt: skip
        args: dict[str, object] = {"snapshot": self.snap, "perfmgr": self.pm, "sweeps": self.stats, "sm": sm}
        args.update(kw)
        return MetricsInputs(**args)  # type: ignore[arg-type]

    def counter_sweep(self, seconds: float = 1.0) -> None:
        self.emu.advance(seconds)
        asyncio.run(self.pm.sweep())

    def heavy_sweep(self) -> SubnetSnapshot:
        self.snap = asyncio.run(self.mgr.heavy_sweep())
        self.stats.record(self.snap)
        return self.snap


def make_rig(f: Fabric, *, traffic: ConstantTraffic | None = None) -> Rig:
    emu = EmulatedFabric(f, traffic=traffic or ConstantTraffic(bytes_per_s=1e9, xmit_wait_per_s=1000.0))
    t = EmulatedTransport(emu, timeout=0.02, retries=1)
    mgr = FabricManager(t)
    snap = asyncio.run(mgr.heavy_sweep())
    pm = PerfManager(t, clock=lambda: emu.time)
    pm.bind(snap)
    rig = Rig(emu, mgr, pm, snap)
    rig.stats.record(snap)
    rig.counter_sweep()
    return rig


@pytest.fixture
def rig() -> Rig:
    return make_rig(fattree(2, 4))


def parse(text: bytes | str, openmetrics: bool = False) -> Samples:
    """Samples by (name, labels), through prometheus_client's parser of the format (OpenMetrics' is strict)."""
    s = text.decode() if isinstance(text, bytes) else text
    out: Samples = {}
    for fam in (openmetrics_families if openmetrics else text_string_to_metric_families)(s):
        for smp in fam.samples:
            key = (smp.name, frozenset(smp.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = smp.value
    return out


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def port_key(f: Fabric, node: int, port: int) -> frozenset[tuple[str, str]]:
    """The labels of a per-port series: only what identifies the port."""
    return frozenset({"guid": f"0x{int(f.node_guid[node]):016x}", "port": str(port)}.items())


def info_key(f: Fabric, node: int, port: int, role: str) -> frozenset[tuple[str, str]]:
    """The labels of the port's ibfm_port_info series."""
    m, q = int(f.peer_node[node, port]), int(f.peer_port[node, port])
    return frozenset(
        {
            "guid": f"0x{int(f.node_guid[node]):016x}",
            "port": str(port),
            "name": f.names[node],
            "remote_guid": f"0x{int(f.node_guid[m]):016x}" if m >= 0 else "",
            "remote_name": f.names[m] if m >= 0 else "",
            "remote_port": str(q) if m >= 0 else "",
            "role": role,
        }.items()
    )


def role_of(f: Fabric, node: int, port: int) -> str:
    """The link role as the fat-tree's names tell it (host-*, leaf-*, spine-* or agg-*, core-*)."""
    m = int(f.peer_node[node, port])
    if m < 0:
        return "none"
    tier = {"host": -1, "leaf": 0, "spine": 1, "agg": 1, "core": 2}
    a, b = tier[f.names[node].split("-")[0]], tier[f.names[m].split("-")[0]]
    if a < 0 or b < 0:
        return "host"
    return "up" if b > a else "down" if b < a else "peer"


def exported_ports(f: Fabric) -> set[tuple[int, int]]:
    ex = f.port_exists.copy()
    ex[f.node_type == NodeType.SWITCH, 0] = False
    return {(int(a), int(b)) for a, b in zip(*np.nonzero(ex), strict=True)}



# -- the metric table -----------------------------------------------------------------------------------------


def test_metric_table_follows_the_naming_conventions() -> None:
    names = [m.name for m in M.ALL]
    assert len(names) == len(set(names))
    for m in M.ALL:
        assert re.fullmatch(r"ibfm_[a-z0-9_]+", m.name), m.name
        assert m.help and not m.help.endswith(" "), m.name
        assert m.name.endswith("_total") == (m.type == MetricType.COUNTER), m.name
        assert not m.name.endswith(("_bucket", "_sum", "_count")), m.name
        assert len(set(m.labels)) == len(m.labels)
    assert M.sample_names() >= {m.name for m in M.ALL if m.type != MetricType.HISTOGRAM}
    assert "ibfm_sweep_duration_seconds_bucket" in M.sample_names()


def test_every_perfmgr_counter_has_a_metric_and_back() -> None:
    assert {m.counter_key for m in M.PORT_COUNTERS} == set(KEYS)
    for m in M.PORT_COUNTERS:
        assert m.labels == M.PORT_LABELS
        assert m.infiniband_exporter, m.name


def test_docs_list_every_metric() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    for m in M.ALL:
        assert f"`{m.name}`" in doc, f"docs/metrics.md does not document {m.name}"


# -- the output ------------------------------------------------------------------------------------------------


def test_every_family_is_there_with_its_labels(rig: Rig) -> None:
    f = rig.snap.fabric
    pred = PortPrediction(f, np.full(f.port_exists.shape, 0.25), np.full(f.port_exists.shape, 7.5))
    out = render_metrics(rig.inputs(prediction=pred))
    fams = {fam.name: fam for fam in text_string_to_metric_families(out.decode())}
    assert set(fams) == {m.family for m in M.ALL}
    ports = exported_ports(f)
    keys = {port_key(f, n, p) for n, p in ports}
    for m in M.PORT_INFO_GAUGES + M.PORT_PREDICTED + M.PORT_COUNTERS:
        fam = fams[m.family]
        assert fam.type == m.type.value
        got = {frozenset(s.labels.items()) for s in fam.samples}
        assert got == keys, m.name
    info = fams[M.PORT_INFO.family]
    assert {frozenset(s.labels.items()) for s in info.samples} == {
        info_key(f, n, p, role_of(f, n, p)) for n, p in ports
    }
    assert {s.value for s in info.samples} == {1}
    for m in M.DEVICE_METRICS:
        assert len(fams[m.family].samples) == f.n_nodes
        assert {tuple(sorted(s.labels)) for s in fams[m.family].samples} == {tuple(sorted(M.DEVICE_LABELS))}


def test_values_come_from_the_arrays(rig: Rig) -> None:
    rig.emu.add_counter(int(rig.emu.fabric.cas[0]), 1, Counter.SYMBOL_ERROR, 3)
    rig.counter_sweep()
    s = parse(render_metrics(rig.inputs()))
    f, pm = rig.snap.fabric, rig.pm
    assert s[("ibfm_subnet_up", frozenset())] == 1
    assert s[("ibfm_routing_engine_info", frozenset({("engine", rig.snap.engine)}))] == 1
    assert s[("ibfm_nodes", frozenset({("type", "switch")}))] == f.switches.size
    assert s[("ibfm_links", frozenset({("state", "active")}))] == f.link_array().shape[0]
    assert s[("ibfm_perfmgr_sweeps_total", frozenset())] == pm.sweeps
    assert s[("ibfm_lft_blocks_sent_total", frozenset())] == rig.snap.program.blocks_sent
    for n, p in exported_ports(f):
        k = port_key(f, n, p)
        assert s[("ibfm_port_state", k)] == f.state[n, p] == PortState.ACTIVE
        assert s[("ibfm_port_width_lanes", k)] == 4
        assert s[("ibfm_port_rate_bytes_per_second", k)] == 50e9  # 4x NDR: 4 x 100 Gb/s / 8
        assert s[("ibfm_port_mtu_bytes", k)] == 4096
        for m in M.PORT_COUNTERS:
            assert s[(m.name, k)] == pm.totals[m.counter_key or ""][n, p], (m.name, n, p)
    errs = series(s, "ibfm_port_symbol_errors_total")
    host = f.by_guid(int(rig.emu.fabric.node_guid[rig.emu.fabric.cas[0]]))
    assert errs[port_key(f, host, 1)] == 3
    assert sum(errs.values()) == 3
    assert set(series(s, "ibfm_device_up").values()) == {1.0}
    assert s[("ibfm_sm_state", frozenset())] == 3 and s[("ibfm_sa_requests_total", frozenset())] == 7
    assert s[("ibfm_mkey_violation_traps_total", frozenset())] == 4 and s[("ibfm_multicast_groups", frozenset())] == 2
    assert s[("ibfm_multicast_members", frozenset())] == 5 and s[("ibfm_mft_blocks_sent_total", frozenset())] == 12
    guid = f"{rig.mgr.elector.guid:#018x}"
    info = frozenset({("master_guid", guid), ("master_lid", str(rig.snap.sm_lid)), ("self", "1")})
    assert s[("ibfm_sm_master_info", info)] == 1


def test_collector_and_renderer_agree(rig: Rig) -> None:
    f = rig.snap.fabric
    pred = PortPrediction(f, np.random.default_rng(0).random(f.port_exists.shape), np.zeros(f.port_exists.shape))
    inputs = rig.inputs(prediction=pred)
    reg = CollectorRegistry()
    reg.register(FabricCollector(lambda: inputs))
    a = parse(generate_latest(reg))
    b = parse(render_metrics(inputs))
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert v == pytest.approx(b[k], rel=1e-15), k


def test_counters_are_monotonic_across_scrapes(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    counters = {s for m in M.ALL if m.type == MetricType.COUNTER for s in m.samples}
    prev = parse(r.render())
    for i in range(3):
        rig.emu.add_counter(int(rig.emu.fabric.cas[0]), 1, Counter.LINK_DOWNED, 1)
        rig.counter_sweep(0.5)
        cur = parse(r.render())
        grown = 0
        for (name, labels), v in cur.items():
            if name in counters and (name, labels) in prev:
                assert v >= prev[(name, labels)], (i, name, labels)
                grown += v > prev[(name, labels)]
        assert grown > len(exported_ports(rig.snap.fabric))  # data and packet counters moved
        prev = cur


def test_a_vanished_port_leaves_no_stale_series(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    before = parse(r.render())
    ef = rig.emu.fabric
    gone = int(ef.cas[-1])
    gone_guid = f"0x{int(ef.node_guid[gone]):016x}"
    assert any(("guid", gone_guid) in k for _, k in before)
    rig.emu.remove_node(gone)
    snap2 = rig.heavy_sweep()
    rig.pm.bind(snap2)
    rig.counter_sweep()
    after = parse(r.render())
    f2 = snap2.fabric
    assert ef.names[gone] not in f2.names
    for (name, labels), _ in after.items():
        d = dict(labels)
        assert d.get("guid") != gone_guid and d.get("remote_guid") != gone_guid, (name, d)
        assert ef.names[gone] not in (d.get("name"), d.get("remote_name"))
    want = {port_key(f2, n, p) for n, p in exported_ports(f2)}
    for m in M.PORT_INFO_GAUGES + M.PORT_COUNTERS:
        assert set(series(after, m.name)) == want, m.name
    assert len(series(after, "ibfm_device_up")) == f2.n_nodes == rig.snap.fabric.n_nodes
    # the leaf port that faced the host is still there, without a cable
    leaf_side = [dict(k) for k in series(after, "ibfm_port_info") if ("remote_guid", "") in k]
    assert len(leaf_side) == 1 and leaf_side[0]["role"] == "none"
    key = frozenset({"guid": leaf_side[0]["guid"], "port": leaf_side[0]["port"]}.items())
    assert after[("ibfm_port_state", key)] == PortState.DOWN


def test_counters_map_by_guid_while_the_perfmanager_is_on_the_old_snapshot(rig: Rig) -> None:
    ef = rig.emu.fabric
    old = rig.snap
    rig.emu.remove_node(int(ef.cas[1]))  # shifts node indices of everything after it (cas[0] has the SM)
    new = rig.heavy_sweep()
    assert rig.pm.fabric is old.fabric
    s = parse(render_metrics(rig.inputs(snapshot=new)))
    f = new.fabric
    for n, p in exported_ports(f):
        j = old.fabric.by_guid(int(f.node_guid[n]))
        v = s[("ibfm_port_transmit_data_bytes_total", port_key(f, n, p))]
        assert v == rig.pm.totals["xmit_data_bytes"][j, p] > 0
    assert any(n != old.fabric.by_guid(int(f.node_guid[n])) for n in range(f.n_nodes))


def test_device_down_when_its_counters_stop_answering(rig: Rig) -> None:
    ef = rig.emu.fabric
    gone = int(ef.cas[2])
    rig.emu.remove_node(gone)
    rig.counter_sweep()  # the snapshot still has the node; its PMA does not answer
    s = parse(render_metrics(rig.inputs()))
    f = rig.snap.fabric
    up = series(s, "ibfm_device_up")
    dev = f.by_guid(int(ef.node_guid[gone]))
    key = frozenset({"guid": f"0x{int(f.node_guid[dev]):016x}", "name": f.names[dev], "type": "ca"}.items())
    assert up[key] == 0
    assert sum(v == 0 for v in up.values()) == 1
    assert s[("ibfm_device_collection_timeouts_total", key)] >= 1
    assert sum(series(s, "ibfm_device_collection_timeouts_total").values()) == s[
        ("ibfm_device_collection_timeouts_total", key)
    ]


def test_label_values_are_escaped() -> None:
    b = FabricBuilder()
    sw = b.add_node(NodeType.SWITCH, 4, "sw", desc='switch "A" \\ 100%s')
    h = b.add_node(NodeType.CA, 1, "h", desc="host %d")
    b.connect(sw, 1, h, 1)
    rig = make_rig(b.build())
    for om in (False, True):
        s = parse(render_metrics(rig.inputs(), om), om)
        names = {dict(k)["name"] for k in series(s, "ibfm_port_info")}
        assert names == {'switch "A" \\ 100%s', "host %d"}
        remote = {dict(k)["remote_name"] for k in series(s, "ibfm_port_info")}
        assert remote == {'switch "A" \\ 100%s', "host %d", ""}


def test_promtool_accepts_the_output(rig: Rig) -> None:
    promtool = need_tool("promtool")
    f = rig.snap.fabric
    pred = PortPrediction(f, np.full(f.port_exists.shape, np.nan), np.full(f.port_exists.shape, np.inf))
    out = render_metrics(rig.inputs(prediction=pred))
    res = subprocess.run([promtool, "check", "metrics"], input=out, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    s = parse(out)
    assert all(np.isnan(v) for v in series(s, "ibfm_port_predicted_utilization_ratio").values())


# -- inputs that are missing or wrong ---------------------------------------------------------------------------


def test_before_the_first_sweep() -> None:
    s = parse(render_metrics(MetricsInputs(None)))
    assert s == {("ibfm_subnet_up", frozenset()): 0}
    stats = SweepStats()
    stats.record_failure()
    s = parse(render_metrics(MetricsInputs(None, sweeps=stats)))
    assert s[("ibfm_sweep_failures_total", frozenset())] == 1
    assert s[("ibfm_sweep_duration_seconds_count", frozenset())] == 0


def test_unbound_perfmanager_adds_no_counters(rig: Rig) -> None:
    pm = PerfManager(rig.pm.transport)
    s = parse(render_metrics(rig.inputs(perfmgr=pm)))
    assert not series(s, "ibfm_port_transmit_data_bytes_total")
    assert set(series(s, "ibfm_device_up").values()) == {1.0}


def test_prediction_of_the_wrong_shape_is_left_out(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    f = rig.snap.fabric
    with pytest.raises(MetricsError, match="utilization"):
        PortPrediction(f, np.zeros((2, 2)), np.zeros(f.port_exists.shape))

    @dataclass
    class Loose:
        fabric: Fabric
        utilization: np.ndarray
        xmit_wait: np.ndarray

    bad = Loose(f, np.zeros((2, 2)), np.zeros((2, 2)))
    with caplog.at_level(logging.WARNING, logger="exporters.prometheus"):
        s = parse(render_metrics(rig.inputs(prediction=bad)))
    assert "prediction arrays" in caplog.text
    assert not series(s, "ibfm_port_predicted_utilization_ratio")
    assert series(s, "ibfm_port_state")


def test_sweep_stats_histogram() -> None:
    rig = make_rig(fattree(2, 4))
    stats = SweepStats(buckets=(0.5, 1.0, 2.0))
    for sec in (0.1, 0.5, 0.7, 3.0):
        stats.record(rig.snap, sec)
    stats.record_failure()
    s = parse(render_metrics(MetricsInputs(None, sweeps=stats)))
    b = series(s, "ibfm_sweep_duration_seconds_bucket")
    assert {dict(k)["le"]: v for k, v in b.items()} == {"0.5": 2, "1.0": 3, "2.0": 3, "+Inf": 4}
    assert s[("ibfm_sweep_duration_seconds_sum", frozenset())] == pytest.approx(4.3)
    assert s[("ibfm_sweep_duration_seconds_count", frozenset())] == 4
    assert s[("ibfm_lft_blocks_sent_total", frozenset())] == 4 * rig.snap.program.blocks_sent
    assert s[("ibfm_sweep_smps_total", frozenset())] == 4 * rig.snap.smps
    with pytest.raises(MetricsError, match="duration"):
        stats.record(rig.snap, -1.0)
    with pytest.raises(MetricsError, match="buckets"):
        SweepStats(buckets=(1.0, 0.5))


# -- caching -----------------------------------------------------------------------------------------------------


def test_render_is_cached_per_counter_sweep(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    first = r.exposition()
    vectors = r.stats.families_rendered
    assert vectors >= len(M.PORT_COUNTERS) + len(M.PORT_INFO_GAUGES)
    assert r.exposition() is first and r.stats.cached
    # OpenMetrics of the same inputs: only the headers are new, every family's lines are reused
    om = r.exposition(True)
    assert om is not first and r.stats.families_rendered == 0
    assert {s.data for s in om.segments} >= {s.data for s in first.segments if s.size > 10_000}
    rig.counter_sweep()
    third = r.exposition()
    assert third is not first and not r.stats.cached
    # only the families whose values moved were rendered again (data, packets, XmitWait)
    assert 0 < r.stats.families_rendered < vectors
    assert parse(third.text()) == parse(render_metrics(rig.inputs()))


def test_a_new_snapshot_with_the_same_cables_shows_its_own_states(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    r.render()
    f = rig.snap.fabric.copy()
    n, p = (int(x) for x in np.argwhere(f.peer_node >= 0)[0])
    f.state[n, p] = PortState.ARMED
    f.mtu_active[n, p] = 4
    rig.snap = dataclasses.replace(rig.snap, fabric=f)
    s = parse(r.render())
    assert s[("ibfm_port_state", port_key(f, n, p))] == PortState.ARMED
    assert s[("ibfm_port_mtu_bytes", port_key(f, n, p))] == 2048
    assert s[("ibfm_ports", frozenset({("state", "armed")}))] == 1
    assert r.stats.families_rendered == 2  # the state and MTU families; labels were kept


def test_same_topology_reuses_labels(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    r.render()
    rig.heavy_sweep()
    rig.pm.bind(rig.snap)
    r.render()
    # a new snapshot of the same subnet: same label sets, same values: no vector family is rendered again
    assert r.stats.families_rendered == 0


# -- HTTP ---------------------------------------------------------------------------------------------------------


async def test_metrics_handler_serves_the_text(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(r))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert resp.status == 200
        assert resp.headers["Content-Type"] == CONTENT_TYPE and "Content-Encoding" not in resp.headers
        assert resp.headers["Vary"] == "Accept, Accept-Encoding"
        body = await resp.read()
        assert int(resp.headers["Content-Length"]) == len(body)
        assert parse(body) == parse(r.render())
        head = await client.head("/metrics", headers={"Accept-Encoding": "identity"})
        assert head.status == 200 and await head.read() == b""


async def test_metrics_gzipped_when_asked_and_kept_until_the_output_changes(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(r))
    async with TestClient(TestServer(app)) as client:
        # as Prometheus asks; auto_decompress off to see the bytes on the wire
        resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        assert resp.status == 200 and resp.headers["Content-Encoding"] == "gzip"
        assert resp.headers["Vary"] == "Accept, Accept-Encoding"
        wire = await resp.read()
        assert int(resp.headers["Content-Length"]) == len(wire)
        text = gzip.decompress(wire)
        assert parse(text) == parse(r.render()) and len(wire) < len(text) / 3
        again = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        assert await again.read() == wire
        kept = r.exposition()
        await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert r.exposition() is kept and r.stats.cached  # the same output: compressed once
        for refused in ("gzip;q=0", "br", "identity", ""):
            resp = await client.get("/metrics", headers={"Accept-Encoding": refused}, auto_decompress=False)
            assert "Content-Encoding" not in resp.headers, refused


def test_accepts_gzip() -> None:
    assert accepts_gzip("gzip") and accepts_gzip("deflate, gzip;q=0.5") and accepts_gzip("*")
    assert accepts_gzip("GZIP ; q=1.0") and accepts_gzip("br;q=1, gzip;q=0.001")
    assert not accepts_gzip("") and not accepts_gzip("gzip;q=0") and not accepts_gzip("identity")
    assert not accepts_gzip("gzip;q=zero") and not accepts_gzip("x-gzip")


def _iter_lines(text: bytes) -> Iterator[bytes]:
    yield from (line for line in text.splitlines() if line and not line.startswith(b"#"))


def test_every_series_name_is_in_the_table(rig: Rig) -> None:
    f = rig.snap.fabric
    pred = PortPrediction(f, np.zeros(f.port_exists.shape), np.zeros(f.port_exists.shape))
    known = M.sample_names()
    for line in _iter_lines(render_metrics(rig.inputs(prediction=pred))):
        name = re.match(rb"[a-zA-Z_:][a-zA-Z0-9_:]*", line)
        assert name is not None and name.group().decode() in known, line


def test_value_text_round_trips() -> None:
    from exporters.prometheus import _value_field

    cases = [
        np.array([0, 1, 9, 10, 99, 100, 2**64 - 1, 12345678901234567890], np.uint64),
        np.array([0, 7], np.uint8),
        np.array([-5, 0, 17, -(2**63)], np.int64),
        np.array([True, False]),
        np.array([0.0, -0.5, 1e-300, 1.7976931348623157e308, 1 / 3, np.nan, np.inf, -np.inf, 5e9]),
        np.zeros(0, np.uint64),
    ]
    for vals in cases:
        field, lens = _value_field(vals)
        assert field.shape[0] == vals.size == lens.size
        texts = [" " * (row.size - k) + bytes(row[row.size - k :]).decode() for row, k in zip(field, lens, strict=True)]
        for t, v in zip(texts, vals.tolist(), strict=True):
            assert t == t.rstrip() and t.strip() and " " not in t.strip(), repr(t)
            if isinstance(v, bool | int):
                assert t.strip() == str(int(v))
            else:
                got = float(t)
                assert got == v or (np.isnan(got) and np.isnan(v)), (t, v)
    assert [bytes(r).decode().strip() for r in _value_field(np.array([np.nan, np.inf, -np.inf]))[0]] == [
        "NaN",
        "+Inf",
        "-Inf",
    ]


# -- OpenMetrics -----------------------------------------------------------------------------------------------


def test_openmetrics_output_passes_the_strict_parser(rig: Rig) -> None:
    f = rig.snap.fabric
    pred = PortPrediction(f, np.full(f.port_exists.shape, np.nan), np.full(f.port_exists.shape, np.inf))
    inputs = rig.inputs(prediction=pred)
    om = render_metrics(inputs, openmetrics=True)
    assert om.endswith(b"# EOF\n") and om.count(b"# EOF") == 1
    fams = {fam.name: fam for fam in openmetrics_families(om.decode())}
    assert set(fams) == {m.family for m in M.ALL}
    for m in M.ALL:
        assert fams[m.family].type == m.type.value and fams[m.family].unit == m.unit, m.name
    assert fams["ibfm_port_transmit_data_bytes"].unit == "bytes"
    assert {s.name for s in fams["ibfm_port_transmit_data_bytes"].samples} == {"ibfm_port_transmit_data_bytes_total"}
    assert b"# UNIT ibfm_port_rate_bytes_per_second bytes_per_second\n" in om
    # the same samples as the text format, and no padding: one blank between labels and value
    assert parse(om, True).keys() == parse(render_metrics(inputs)).keys()
    for line in om.splitlines():
        if not line.startswith(b"#"):
            assert b"  " not in line and line.count(b"} ") <= 1, line


def test_promtool_accepts_every_shard_and_group(rig: Rig) -> None:
    promtool = need_tool("promtool")
    r = MetricsRenderer(rig.inputs)
    for sel in (Selection(shard=(1, 3)), Selection(frozenset({"port_info", "port_traffic"}))):
        out = r.exposition(False, sel).text()
        res = subprocess.run([promtool, "check", "metrics"], input=out, capture_output=True, timeout=60)
        assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
        parse(r.exposition(True, sel).text(), True)


def test_accepts_openmetrics() -> None:
    prometheus = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    assert accepts_openmetrics(prometheus) and accepts_openmetrics("application/openmetrics-text; version=1.0.0")
    assert accepts_openmetrics("text/plain, Application/OpenMetrics-Text")
    assert not accepts_openmetrics("") and not accepts_openmetrics("text/plain;version=0.0.4")
    assert not accepts_openmetrics("application/openmetrics-text;q=0")


def test_segments_make_one_gzip_stream() -> None:
    rng = np.random.default_rng(3)
    parts = [rng.integers(48, 58, n).astype(np.uint8).tobytes() for n in (0, 1, 7, 70_000, 3, 1 << 17)]
    segs = [Segment.of(p) for p in parts]
    crc = 0
    for p in parts:
        crc = crc32_combine(crc, zlib.crc32(p), len(p))
    assert crc == zlib.crc32(b"".join(parts))
    from exporters.prometheus import Exposition

    out = Exposition(tuple(segs), CONTENT_TYPE)
    assert gzip.decompress(b"".join(out.gzip_chunks())) == b"".join(parts) == out.text()
    assert out.gzip_size == sum(map(len, out.gzip_chunks()))


async def test_handler_negotiates_openmetrics_and_gzip(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(r))
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    async with TestClient(TestServer(app)) as client:
        for gz in (True, False):
            enc = "gzip" if gz else "identity"
            resp = await client.get(
                "/metrics", headers={"Accept": accept, "Accept-Encoding": enc}, auto_decompress=False
            )
            assert resp.status == 200 and resp.headers["Content-Type"] == OPENMETRICS_CONTENT_TYPE
            wire = await resp.read()
            assert int(resp.headers["Content-Length"]) == len(wire)
            body = gzip.decompress(wire) if gz else wire
            assert body.endswith(b"# EOF\n") and parse(body, True) == parse(r.render())


# -- selection: groups and shards ---------------------------------------------------------------------------------


def test_every_family_is_in_one_group() -> None:
    grouped = [m.name for ms in M.GROUPS.values() for m in ms]
    assert sorted(grouped) == sorted(m.name for m in M.ALL)
    assert set(M.GROUPS) >= M.FABRIC_WIDE_GROUPS


def test_collect_selects_groups(rig: Rig) -> None:
    r = MetricsRenderer(rig.inputs)
    s = parse(r.exposition(True, Selection.parse([("collect[]", "port_info"), ("collect[]", "subnet")])).text(), True)
    names = {n for n, _ in s}
    assert "ibfm_port_info" in names and "ibfm_subnet_up" in names
    allowed = {x for m in M.GROUPS["port_info"] + M.GROUPS["subnet"] for x in m.samples}
    assert names <= allowed


def test_bad_selections_are_refused() -> None:
    for query, param, words in (
        ([("collect[]", "ports")], "collect[]", "unknown metric group 'ports'"),
        ([("shard", "3/3")], "shard", "0 <= i < n"),
        ([("shard", "1")], "shard", "i/n"),
        ([("shard", "0/0")], "shard", "i/n"),
        ([("shard", "0/99999")], "shard", "i/n"),
        ([("shard", "0/2"), ("shard", "1/2")], "shard", "more than once"),
        ([("collect", "subnet")], "collect", "unknown query parameter"),
    ):
        with pytest.raises(SelectionError, match=re.escape(words)) as e:
            Selection.parse(query)
        assert e.value.parameter == param
    assert Selection.parse([("shard", "0/1")]) == Selection()


async def test_handler_answers_400_for_a_bad_selection(rig: Rig) -> None:
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(MetricsRenderer(rig.inputs)))
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/metrics?collect[]=nope")
        assert resp.status == 400
        body = await resp.json()
        assert body["parameter"] == "collect[]" and "port_traffic" in body["detail"]
        resp = await client.get("/metrics?shard=2/2")
        assert resp.status == 400 and (await resp.json())["parameter"] == "shard"
        resp = await client.get("/metrics?shard=1/2&collect[]=port_errors")
        assert resp.status == 200


def test_shards_split_the_rows_and_keep_ca_ports_with_their_switch() -> None:
    rig = make_rig(fattree(3, 4))
    f = rig.snap.fabric
    r = MetricsRenderer(rig.inputs)
    whole = parse(r.render())
    n = 3
    parts = [parse(r.exposition(False, Selection(shard=(i, n))).text()) for i in range(n)]
    union: Samples = {}
    for i, part in enumerate(parts):
        assert not union.keys() & part.keys()
        union.update(part)
        assert (("ibfm_subnet_up", frozenset()) in part) == (i == 0)  # fabric-wide families: shard 0 only
    assert union == whole
    shard = (shard_hash(f.node_guid) % np.uint64(n)).astype(int)
    for i, part in enumerate(parts):
        for labels in series(part, "ibfm_port_state"):
            node = f.by_guid(int(dict(labels)["guid"], 16))
            port = int(dict(labels)["port"])
            owner = node if f.node_type[node] == NodeType.SWITCH else int(f.peer_node[node, port])
            assert shard[owner] == i
    # stable across sweeps: a new snapshot of the same GUIDs puts every series in the same shard
    rig.heavy_sweep()
    rig.pm.bind(rig.snap)
    rig.counter_sweep()
    again = parse(MetricsRenderer(rig.inputs).exposition(False, Selection(shard=(1, n))).text())
    assert {k for k in again if k[0] == "ibfm_port_info"} == {k for k in parts[1] if k[0] == "ibfm_port_info"}


def test_link_roles_on_a_three_level_tree() -> None:
    rig = make_rig(fattree(3, 4))
    f = rig.snap.fabric
    s = parse(render_metrics(rig.inputs()))
    info = series(s, "ibfm_port_info")
    assert set(info) == {info_key(f, n, p, role_of(f, n, p)) for n, p in exported_ports(f)}
    roles = [dict(k)["role"] for k in info]
    assert {x: roles.count(x) for x in set(roles)} == {"host": 2 * 16, "up": 32, "down": 32}


async def test_outputs_scraped_lately_are_rendered_when_the_inputs_change(rig: Rig) -> None:
    from exporters.prometheus import MetricsHandler

    r = MetricsRenderer(rig.inputs)
    handler = MetricsHandler(r, interval=0.05)
    app = web.Application()
    app.router.add_get("/metrics", handler.handle)
    app.cleanup_ctx.append(handler.prewarm)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/metrics?shard=1/2")).status == 200
        before = r.exposition(False, Selection(shard=(1, 2)))
        rig.emu.advance(1.0)
        await rig.pm.sweep()  # new counters: the handler renders shard 1/2 again without being asked
        want = (False, Selection(shard=(1, 2)))
        for _ in range(100):
            await asyncio.sleep(0.05)
            cur = r._current
            if cur is not None and cur[1].get(want) not in (None, before):
                break
        else:
            raise AssertionError("not rendered ahead of the scrape")
        rendered = cur[1][want]
        resp = await client.get("/metrics?shard=1/2")
        assert resp.status == 200 and r._current is cur and cur[1][want] is rendered  # served as made
