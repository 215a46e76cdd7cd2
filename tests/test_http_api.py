"""The HTTP API end to end (aiohttp test client on a swept emulated fat-tree), and the checks behind it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import re
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from exporters.http.app import create_app
from exporters.http.common import SERVER_LOG, ApiConfig, ApiError
from exporters.http.congestion import _build_pattern, _link_spec, check_pattern_spec
from exporters.http.openapi import (
    LINK_PATTERN,
    MODEL_FOR,
    NETFILE_SCHEMA,
    NODE_ID_MAX,
    NODE_ID_PATTERN,
    OFFSET_MAX,
    PATTERN_SPEC_PATTERN,
    ErrorBody,
    build_openapi,
)
from exporters.http.view import SnapshotView
from fabric.emulator import EmulatedFabric
from fabric.formats.netfile import format_net
from fabric.generate import fattree, ring
from fabric.model import Fabric, PortState, Speed, Width
from sm.analysis.dump import format_switch_lft
from sm.analysis.query import describe_route
from sm.analysis.validate import compare_cabling, duplicate_descriptions, duplicate_guids, slow_links, stuck_ports
from sm.analysis.whatif import what_if
from sm.lidmap import sequential_lids
from sm.partitions.config import PartitionConfig
from sm.routing.base import NO_ROUTE, RoutingOptions, route
from sm.sweep.events import EventBus, LinkDown, PortRef
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot
from sm.transport.emulated import EmulatedTransport

TOKEN = "s3cret-token-for-tests"


class Recorder:
    """A SubnetSource over a fixed snapshot that records sweep requests."""

    def __init__(self, snap: SubnetSnapshot | None, config: SmConfig | None = None) -> None:
        self.snapshot = snap
        self.config = config or SmConfig()
        self.events = EventBus()
        self.requests: list[tuple[str, bool]] = []

    def request_sweep(self, reason: str, *, heavy: bool = False) -> None:
        self.requests.append((reason, heavy))

    def set_partitions(self, partitions: PartitionConfig | None) -> None:
        self.config = dataclasses.replace(self.config, partitions=partitions)
        self.request_sweep("partitions", heavy=True)


async def _sweep(fabric: Fabric) -> SubnetSnapshot:
    transport = EmulatedTransport(EmulatedFabric(fabric))
    try:
        return await FabricManager(transport).heavy_sweep()
    finally:
        await transport.close()


@pytest.fixture(scope="module")
def snap() -> SubnetSnapshot:
    return asyncio.run(_sweep(fattree(2, 8)))


@pytest.fixture
def source(snap: SubnetSnapshot) -> Recorder:
    return Recorder(snap)


async def _client(app: web.Application) -> TestClient:
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
async def client(source: Recorder) -> AsyncIterator[TestClient]:
    c = await _client(create_app(source, ApiConfig(token=TOKEN)))
    yield c
    await c.close()


def _valid(model_key: tuple[str, str], body: Any) -> None:
    MODEL_FOR[model_key].model_validate(body)


async def _error(resp: Any, status: int, parameter: str | None = "(any)") -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    body = await resp.json()
    ErrorBody.model_validate(body)
    if parameter != "(any)":
        assert body["parameter"] == parameter, body
    return body


# -- OpenAPI --------------------------------------------------------------------------------------------


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


async def test_openapi_documents_every_route(client: TestClient) -> None:
    resp = await client.get("/api/v1/openapi.json")
    assert resp.status == 200
    doc = await resp.json()
    assert doc["openapi"].startswith("3.1")
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    served = set()
    for r in client.server.app.router.routes():
        info = r.resource.get_info() if r.resource else {}
        path = info.get("path") or info.get("formatter")
        if r.method != "HEAD" and path and path.startswith("/api/v1/") and path != "/api/v1/":
            served.add((r.method.lower(), path))
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert served == documented
    for p, ops in doc["paths"].items():
        for m, op in ops.items():
            assert op["responses"], (m, p)
            assert any(c.startswith("2") for c in op["responses"]), (m, p)
            for param in op.get("parameters", []):
                assert param["description"] and param["schema"], (m, p, param)
            if (m, p.removeprefix("/api/v1")) in MODEL_FOR:
                ok = next(c for c in op["responses"] if c.startswith("2"))
                ref = op["responses"][ok]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/" + MODEL_FOR[(m, p.removeprefix("/api/v1"))].__name__)


# -- health, before and after the first sweep --------------------------------------------------------------


async def test_before_first_sweep_every_read_is_503() -> None:
    c = await _client(create_app(Recorder(None)))
    try:
        for path in ("/api/v1/health", "/api/v1/nodes", "/api/v1/routes?src=a&dst=b", "/api/v1/validation"):
            resp = await c.get(path)
            body = await _error(resp, 503, None)
            assert "first sweep" in body["detail"]
            assert resp.headers["Retry-After"]
        resp = await c.get("/api/v1/openapi.json")
        assert resp.status == 200
    finally:
        await c.close()


async def test_health(client: TestClient, snap: SubnetSnapshot) -> None:
    resp = await client.get("/api/v1/health")
    assert resp.status == 200
    body = await resp.json()
    _valid(("get", "/health"), body)
    assert body["state"] == "up" and body["subnet_up"] is True
    assert body["sweep"]["number"] == snap.sweep
    assert body["routing"]["engine"] == "ftree"
    assert body["verify"]["unreachable"] == 0 and body["verify"]["pairs"] == snap.verify.pairs
    assert body["fabric"]["cas"] == 32 and body["fabric"]["switches"] == 12
    assert body["credit_loops"] == [] and body["program"]["failures"] == []
    assert body["perfmgr"] is None


async def test_health_reports_a_failed_sweep_and_credit_loops(snap: SubnetSnapshot) -> None:
    from sm.analysis.creditflow import Channel, CreditLoop
    from sm.sweep.events import SweepFailed

    loop = CreditLoop((Channel("a", 1, "b", 2), Channel("b", 3, "a", 4)), (5, 6))
    src = Recorder(dataclasses.replace(snap, credit_loops=(loop,)))
    src.events.emit(SweepFailed(stage="discover", reason="MAD timeout"))
    c = await _client(create_app(src))
    try:
        body = await (await c.get("/api/v1/health")).json()
        assert body["state"] == "degraded"
        assert body["credit_loops"] == [str(loop)]
        assert body["sweep"]["last_failure"]["stage"] == "discover"
    finally:
        await c.close()


# -- topology ----------------------------------------------------------------------------------------------------


async def test_nodes_filters_and_paging(client: TestClient, snap: SubnetSnapshot) -> None:
    body = await (await client.get("/api/v1/nodes")).json()
    _valid(("get", "/nodes"), body)
    assert body["total"] == snap.fabric.n_nodes == 44
    body = await (await client.get("/api/v1/nodes", params={"type": "switch"})).json()
    assert body["total"] == 12 and all(n["type"] == "switch" for n in body["items"])
    body = await (await client.get("/api/v1/nodes", params={"name": "SPINE"})).json()
    assert sorted(n["name"] for n in body["items"]) == [f"spine-{i:02d}" for i in range(4)]
    p1 = await (await client.get("/api/v1/nodes", params={"limit": "10", "offset": "0"})).json()
    p2 = await (await client.get("/api/v1/nodes", params={"limit": "10", "offset": "10"})).json()
    assert len(p1["items"]) == len(p2["items"]) == 10 and p1["total"] == 44
    assert {n["name"] for n in p1["items"]}.isdisjoint(n["name"] for n in p2["items"])
    last = await (await client.get("/api/v1/nodes", params={"offset": "40"})).json()
    assert len(last["items"]) == 4
    leaf = next(n for n in body["items"] if n["name"] == "spine-00")
    assert leaf["lid"] == int(snap.lids.base[snap.fabric.by_name("spine-00"), 0])


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("offset=-1", "offset"),
        ("type=hub", "type"),
        ("nmae=leaf", "nmae"),
        ("limit=5&limit=6", "limit"),
        ("limit=%C2%B2", "limit"),
        ("limit=--5", "limit"),
        ("offset=1234567890123456", "offset"),
        ("offset=" + "9" * 5000, "offset"),
        ("limit=-" + "9" * 30, "limit"),
    ],
)
async def test_nodes_bad_parameters(client: TestClient, query: str, parameter: str) -> None:
    body = await _error(await client.get(f"/api/v1/nodes?{query}"), 400, parameter)
    assert parameter in body["detail"]


async def test_node_by_name_guid_lid(client: TestClient, snap: SubnetSnapshot) -> None:
    f = snap.fabric
    n = f.by_name("leaf-03")
    guid = f"0x{int(f.node_guid[n]):016x}"
    lid = str(int(snap.lids.base[n, 0]))
    for ident in ("leaf-03", guid, guid.upper().replace("0X", "0x"), lid):
        resp = await client.get(f"/api/v1/nodes/{ident}")
        assert resp.status == 200, ident
        body = await resp.json()
        _valid(("get", "/nodes/{id}"), body)
        assert body["name"] == "leaf-03"
    assert len(body["ports"]) == 9  # port 0 and 8 ports
    p5 = body["ports"][5]
    assert p5["port"] == 5 and p5["state"] == "active" and p5["peer"]["node"].startswith("spine-")
    assert p5["width"] == "4x" and p5["speed"] == "NDR" and p5["rate_gbps"] == 400.0 and p5["counters"] is None
    # a CA's port GUID names its node
    h = f.by_name("host-00007")
    body = await (await client.get(f"/api/v1/nodes/0x{int(f.port_guid[h, 1]):016x}")).json()
    assert body["name"] == "host-00007" and body["type"] == "ca"


@pytest.mark.parametrize(
    ("ident", "status"),
    [("no-such-node", 404), ("0xzz", 400), ("0x1234", 404), ("60000", 404), ("0", 404), ("²", 404), ("%20", 400)],
)
async def test_node_unknown(client: TestClient, ident: str, status: int) -> None:
    body = await _error(await client.get(f"/api/v1/nodes/{ident}"), status, "id")
    assert body["detail"].startswith("id:")


async def test_ports_and_links(client: TestClient, snap: SubnetSnapshot) -> None:
    body = await (await client.get("/api/v1/ports", params={"limit": "1000"})).json()
    _valid(("get", "/ports"), body)
    assert body["total"] == int(snap.fabric.port_exists.sum()) == len(body["items"])
    body = await (await client.get("/api/v1/ports", params={"node": "leaf-00", "state": "ACTIVE"})).json()
    assert body["total"] == 9 and {p["node"] for p in body["items"]} == {"leaf-00"}
    body = await (await client.get("/api/v1/ports", params={"state": "down"})).json()
    assert body["total"] == 0
    await _error(await client.get("/api/v1/ports", params={"state": "up"}), 400, "state")
    await _error(await client.get("/api/v1/ports", params={"node": "nowhere"}), 404, "node")
    body = await (await client.get("/api/v1/links", params={"limit": "1000"})).json()
    _valid(("get", "/links"), body)
    assert body["total"] == 64
    body = await (await client.get("/api/v1/links", params={"node": "spine-01"})).json()
    assert body["total"] == 8
    assert all("spine-01" in (x["a"]["node"], x["b"]["node"]) for x in body["items"])
    assert all(x["state"] == "active" and x["rate_gbps"] == 400.0 for x in body["items"])


async def test_ports_carry_counters_with_a_perfmgr(snap: SubnetSnapshot) -> None:
    class Perf:
        def __init__(self) -> None:
            self.fabric = snap.fabric
            self.totals = {"xmit_data_bytes": np.full(snap.fabric.port_exists.shape, 7, np.uint64)}
            self.rates = {"xmit_data_bytes": np.full(snap.fabric.port_exists.shape, np.nan)}
            self.sweeps = 3
            self.last_sweep_time = 1.0
            self.last_report = None

    c = await _client(create_app(Recorder(snap), perfmgr=Perf()))
    try:
        body = await (await c.get("/api/v1/ports", params={"node": "host-00001"})).json()
        _valid(("get", "/ports"), body)
        assert body["items"][0]["counters"] == {"xmit_data_bytes": 7}
        assert body["items"][0]["rates"] == {"xmit_data_bytes": None}
        health = await (await c.get("/api/v1/health")).json()
        assert health["perfmgr"]["sweeps"] == 3
    finally:
        await c.close()


# -- routes and LFTs ----------------------------------------------------------------------------------------------


async def test_route_matches_sm_query(client: TestClient, snap: SubnetSnapshot) -> None:
    f = snap.fabric
    rng = np.random.default_rng(1)
    names = [f.names[i] for i in f.cas.tolist()] + ["leaf-02", "spine-03"]
    for _ in range(20):
        a, b = rng.choice(names, 2, replace=False)
        resp = await client.get("/api/v1/routes", params={"src": a, "dst": b})
        assert resp.status == 200
        body = await resp.json()
        _valid(("get", "/routes"), body)
        ref = describe_route(f, snap.lids, snap.lft, a, b)
        assert body["delivered"] and body["failure"] is None
        assert [(h["node"], h["in_port"], h["out_port"]) for h in body["hops"]] == [
            (h.node, h.in_port, h.out_port) for h in ref.hops
        ]
        assert body["path_mtu"] == ref.path_mtu and body["rate_gbps"] == ref.rate_gbps
        assert body["src"]["lid"] == ref.src_lid and body["dst"]["lid"] == ref.dst_lid
        pr = body["path_record"]
        assert pr["slid"] == ref.src_lid and pr["dlid"] == ref.dst_lid and pr["mtu"] == 5
        assert pr["rate"] == 21 and pr["hop_count"] == len(ref.hops) - 1 - (f.is_switch(f.by_name(str(b))))
        # OpenSM's default partitions (no file): every end port, switches' port 0 too, a full member of Default
        assert body["partitions"] == [{"pkey": "0xffff", "name": "Default"}] and pr["pkey"] == "0xffff"
        assert body["partition_note"] is None


async def test_route_by_lid_and_guid(client: TestClient, snap: SubnetSnapshot) -> None:
    f = snap.fabric
    a, b = f.by_name("host-00000"), f.by_name("host-00020")
    src = str(int(snap.lids.base[a, 1]))
    dst = f"0x{int(f.port_guid[b, 1]):016x}"
    body = await (await client.get("/api/v1/routes", params={"src": src, "dst": dst})).json()
    assert body["src"]["node"] == "host-00000" and body["dst"]["node"] == "host-00020"
    assert len(body["hops"]) == 5  # host, leaf, spine, leaf, host
    same = await (await client.get("/api/v1/routes", params={"src": "host-00000", "dst": "host-00000"})).json()
    assert same["delivered"] and len(same["hops"]) == 1 and same["path_record"] is None


@pytest.mark.parametrize(
    ("query", "status", "parameter"),
    [
        ("src=host-00000", 400, "dst"),
        ("dst=host-00000", 400, "src"),
        ("src=host-00000&dst=nobody", 404, "dst"),
        ("src=0xnothex&dst=host-00001", 400, "src"),
        ("src=99999&dst=host-00001", 404, "src"),
        ("src=&dst=host-00001", 400, "src"),
        ("src=host-00000&dst=host-00001&via=leaf-00", 400, "via"),
        ("src=%C2%B2&dst=host-00001", 404, "src"),
    ],
)
async def test_route_bad_parameters(client: TestClient, query: str, status: int, parameter: str) -> None:
    await _error(await client.get(f"/api/v1/routes?{query}"), status, parameter)


async def test_route_through_a_broken_lft(snap: SubnetSnapshot) -> None:
    f = snap.fabric
    lft = snap.lft.copy()
    dst = f.by_name("host-00031")
    dlid = int(snap.lids.base[dst, 1])
    row = int(np.searchsorted(f.switches, f.by_name("leaf-00")))
    lft[row, dlid] = NO_ROUTE
    c = await _client(create_app(Recorder(dataclasses.replace(snap, lft=lft))))
    try:
        body = await (await c.get("/api/v1/routes", params={"src": "host-00000", "dst": "host-00031"})).json()
        _valid(("get", "/routes"), body)
        assert body["delivered"] is False and "leaf-00" in body["failure"] and "255" in body["failure"]
        assert [h["node"] for h in body["hops"]] == ["host-00000", "leaf-00"]
        assert body["path_record"] is None and body["path_mtu"] == 0
    finally:
        await c.close()


async def test_lft(client: TestClient, snap: SubnetSnapshot) -> None:
    f = snap.fabric
    n = f.by_name("spine-02")
    row = int(np.searchsorted(f.switches, n))
    body = await (await client.get("/api/v1/switches/spine-02/lft")).json()
    _valid(("get", "/switches/{id}/lft"), body)
    want = np.flatnonzero(snap.lft[row] != NO_ROUTE)
    assert [e["lid"] for e in body["entries"]] == want.tolist()
    assert [e["port"] for e in body["entries"]] == snap.lft[row, want].tolist()
    assert body["switch"]["lid"] == int(snap.lids.base[n, 0]) and body["lid_top"] == int(want[-1])
    resp = await client.get(f"/api/v1/switches/{int(snap.lids.base[n, 0])}/lft", params={"format": "ibroute"})
    assert resp.status == 200 and resp.content_type == "text/plain"
    assert await resp.text() == format_switch_lft(f, snap.lids, snap.lft, row)
    await _error(await client.get("/api/v1/switches/host-00001/lft"), 404, "id")
    await _error(await client.get("/api/v1/switches/spine-02/lft", params={"format": "xml"}), 400, "format")
    await _error(await client.get("/api/v1/switches/nope/lft"), 404, "id")


# -- validation --------------------------------------------------------------------------------------------------


def _swap_cables(f: Fabric, node: str, p: int, q: int) -> Fabric:
    g = f.copy()
    n = g.by_name(node)
    a, b = (int(g.peer_node[n, p]), int(g.peer_port[n, p])), (int(g.peer_node[n, q]), int(g.peer_port[n, q]))
    g.disconnect(n, p)
    g.disconnect(n, q)
    g.connect(n, p, *b, state=PortState.ACTIVE)
    g.connect(n, q, *a, state=PortState.ACTIVE)
    return g


async def test_validation_without_design(client: TestClient) -> None:
    body = await (await client.get("/api/v1/validation")).json()
    _valid(("get", "/validation"), body)
    assert body["ok"] and body["errors"] == 0 and body["expected_topology"] is None
    assert body["checks"]["cabling"]["severity"] == "info" and "expected_topology" in body["checks"]["cabling"]["note"]
    assert body["shape"]["kind"] == "fat-tree" and body["shape"]["levels"] == 2
    for name in ("duplicate_guids", "duplicate_descriptions", "slow_links", "stuck_ports", "routing", "credit_loops"):
        assert body["checks"][name]["ok"], name


async def test_validation_against_configured_design(tmp_path: Path, source: Recorder) -> None:
    design = tmp_path / "design.net"
    design.write_text(format_net(fattree(2, 8)))
    c = await _client(create_app(source, ApiConfig(expected_topology=design)))
    try:
        body = await (await c.get("/api/v1/validation")).json()
        assert body["ok"] and body["checks"]["cabling"]["ok"] and body["expected_topology"] == str(design)
        assert "64 of 64 cables" in body["checks"]["cabling"]["note"]
        # the design changes on disk: the next answer reads it again
        design.write_text(format_net(_swap_cables(fattree(2, 8), "leaf-01", 5, 6)))
        body = await (await c.get("/api/v1/validation")).json()
        cab = body["checks"]["cabling"]
        assert not body["ok"] and cab["count"] == 1 and cab["items"][0]["kind"] == "swapped"
        assert cab["items"][0]["node"] == "leaf-01" and cab["items"][0]["ports"] == [5, 6]
        design.write_text("garbage line\n")
        body = await (await c.get("/api/v1/validation")).json()
        assert body["checks"]["cabling"]["severity"] == "info" and "unusable" in body["checks"]["cabling"]["note"]
    finally:
        await c.close()


async def test_validation_post_design(client: TestClient) -> None:
    design = fattree(2, 8)
    design = _swap_cables(design, "leaf-02", 6, 7)
    design.disconnect(design.by_name("leaf-05"), 8)
    text = format_net(design)
    resp = await client.post("/api/v1/validation", data=text.encode(), headers={"Content-Type": "text/plain"})
    assert resp.status == 200
    body = await resp.json()
    _valid(("post", "/validation"), body)
    items = body["checks"]["cabling"]["items"]
    kinds = sorted(i["kind"] for i in items)
    assert kinds == ["extra", "swapped"], items
    extra = next(i for i in items if i["kind"] == "extra")
    assert {extra["a"]["node"], extra["b"]["node"]} == {"leaf-05", "spine-03"}
    swapped = next(i for i in items if i["kind"] == "swapped")
    assert "leaf-02 ports 6 and 7" in swapped["text"]


@pytest.mark.parametrize(
    ("data", "ctype", "status"),
    [
        (b"Switch 8 \"x\"\n[99] \"y\"[1]\n", "text/plain", 400),
        (b"", "text/plain", 400),
        (b"\xff\xfe\x00", "application/octet-stream", 400),
        (b"{}", "application/json", 415),
    ],
)
async def test_validation_post_bad_bodies(client: TestClient, data: bytes, ctype: str, status: int) -> None:
    body = await _error(await client.post("/api/v1/validation", data=data, headers={"Content-Type": ctype}), status,
                        "body")
    if status == 400 and data.startswith(b"Switch"):
        assert "posted net file" in body["detail"]


async def test_body_too_large(source: Recorder) -> None:
    c = await _client(create_app(source, ApiConfig(max_body_bytes=2048)))
    try:
        resp = await c.post("/api/v1/validation", data=b"#" * 5000, headers={"Content-Type": "text/plain"})
        await _error(resp, 413)
    finally:
        await c.close()


def test_checks_name_nodes_and_ports() -> None:
    f = fattree(2, 4)
    lids = sequential_lids(f)
    assert not duplicate_guids(f) and not duplicate_descriptions(f) and not slow_links(f)
    assert len(stuck_ports(f)) == 2 * f.link_array().shape[0]  # built in INIT: every cabled port
    g = f.copy()
    g.state[g.port_exists] = PortState.ACTIVE
    h = g.by_name("host-00001")
    g.node_guid[h] = g.node_guid[g.by_name("host-00000")]
    g.descs[g.by_name("leaf-01")] = g.descs[g.by_name("leaf-00")]
    leaf = g.by_name("leaf-00")
    g.width_active[leaf, 3] = g.width_active[int(g.peer_node[leaf, 3]), int(g.peer_port[leaf, 3])] = int(Width.X1)
    g.state[g.by_name("spine-01"), 1] = PortState.ARMED
    d = duplicate_guids(g)
    assert len(d) == 1 and set(d[0].holders) == {"host-00000", "host-00001"}
    dd = duplicate_descriptions(g)
    assert len(dd) == 1 and set(dd[0].holders) == {"leaf-00", "leaf-01"}
    sl = slow_links(g)
    assert len(sl) == 1 and sl[0].width == "1x" and sl[0].supported_width == "4x" and "leaf-00[3]" in str(sl[0])
    g.speed_active[leaf, 1] = g.speed_active[g.by_name("host-00000"), 1] = int(Speed.HDR)
    assert any("4xHDR, both ends support 4xNDR" in str(x) for x in slow_links(g))
    st_ = stuck_ports(g)
    assert [str(x.end) for x in st_] == ["spine-01[1]"] and st_[0].state == "ARMED"
    del lids


def test_cabling_missing_extra_swapped_nodes() -> None:
    design = fattree(2, 8)
    live = _swap_cables(design, "leaf-00", 5, 8)
    live.disconnect(live.by_name("leaf-03"), 7)
    live = live.subset([i for i in range(live.n_nodes) if live.names[i] != "host-00009"])
    rep = compare_cabling(live, design)
    assert [(s.node, s.port_a, s.port_b) for s in rep.swapped] == [("leaf-00", 5, 8)]
    assert sorted(f"{a} - {b}" for a, b in rep.missing) == ["host-00009[1] - leaf-02[2]", "leaf-03[7] - spine-02[4]"]
    assert rep.extra == [] and rep.missing_nodes == ["host-00009"] and rep.unexpected_nodes == []
    assert rep.matched_by["guid"] == live.n_nodes
    # nodes matched by name when the design has other GUIDs
    renamed = design.copy()
    renamed.node_guid[:] += np.uint64(1 << 40)
    renamed.reindex()
    rep = compare_cabling(live, renamed)
    assert rep.matched_by["guid"] == 0 and len(rep.swapped) == 1 and not rep.unexpected_nodes


# -- congestion and what-if --------------------------------------------------------------------------------------


async def test_congestion(client: TestClient) -> None:
    body = await (await client.get("/api/v1/congestion")).json()
    _valid(("get", "/congestion"), body)
    assert body["pattern"] == "shift:1" and body["flows"] == 32 and body["unrouted"] == 0
    assert body["flow_stats"]["min"] == pytest.approx(1.0)  # ftree routes a shift without contention
    incast = await (await client.get("/api/v1/congestion", params={"pattern": "incast:8:3", "top": "3"})).json()
    assert incast["flows"] == 8 and len(incast["hottest"]) == 3
    assert incast["hottest"][0]["dst"] == "host-00003[1]" and incast["hottest"][0]["bottlenecked"] == 8
    assert incast["flow_stats"]["min"] == pytest.approx(1 / 8)
    a2a = await (await client.get("/api/v1/congestion", params={"pattern": "all-to-all"})).json()
    assert a2a["flows"] == 32 * 31


@pytest.mark.parametrize(
    ("query", "status", "parameter"),
    [("pattern=shift:0", 400, "pattern"), ("pattern=bogus", 400, "pattern"), ("pattern=", 400, "pattern"),
     ("pattern=%EF%BD%93hift:1", 400, "pattern"), ("pattern=shift:99999999999999999999", 400, "pattern"),
     ("pattern=shift:1@0", 400, "pattern"), ("top=-1", 400, "top"), ("top=x", 400, "top"),
     # of the documented form, but not on 32 hosts
     ("pattern=incast:99", 409, "pattern"), ("pattern=shift:32", 409, "pattern"),
     ("pattern=incast:3:32", 409, "pattern")],
)
async def test_congestion_bad_parameters(client: TestClient, query: str, status: int, parameter: str) -> None:
    body = await _error(await client.get(f"/api/v1/congestion?{query}"), status, parameter)
    assert body["error"] == ("not_applicable" if status == 409 else "bad_parameter")


async def test_whatif_spine_and_links(client: TestClient, snap: SubnetSnapshot) -> None:
    before = {k: v.copy() for k, v in vars(snap.fabric).items() if isinstance(v, np.ndarray)}
    lft_before = snap.lft.copy()
    req = {"switches": ["spine-00"], "links": ["leaf-01[6]", {"node": "leaf-02", "port": 7}], "pattern": "shift:4"}
    resp = await client.post("/api/v1/whatif", json=req)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    _valid(("post", "/whatif"), body)
    assert body["routed"] and body["failed_switches"] == ["spine-00"]
    assert body["failed_links"] == ["leaf-01[6] - spine-01[2]", "leaf-02[7] - spine-02[3]"]
    assert body["before"]["congestion"]["flow_stats"]["min"] == pytest.approx(1.0)
    after = body["after"]
    assert after["verify"]["ok"] and after["credit_loops"] == []
    assert after["congestion"]["flows"] == 32 and after["congestion"]["flow_stats"]["min"] < 1.0
    assert body["lft_blocks_changed"] > 0 and body["switches_changed"] > 0
    # the snapshot is untouched
    assert all(np.array_equal(v, getattr(snap.fabric, k)) for k, v in before.items())
    assert np.array_equal(lft_before, snap.lft)


async def test_whatif_cuts_off_a_host(client: TestClient) -> None:
    body = await (await client.post("/api/v1/whatif", json={"links": ["host-00005[1]"]})).json()
    _valid(("post", "/whatif"), body)
    assert body["hosts_cut_off"] == ["host-00005"] and body["routed"]
    assert body["after"]["congestion"]["flows"] == 31


@pytest.mark.parametrize(
    ("payload", "status", "parameter"),
    [
        ({}, 400, "links"),
        ({"links": []}, 400, "links"),
        ({"links": [], "switches": []}, 400, "links"),
        ({"links": ["leaf-00"]}, 400, "links[0]"),
        ({"links": ["leaf-00[99]"]}, 404, "links[0]"),
        ({"links": ["leaf-00[\u00b2]"]}, 400, "links[0]"),
        ({"links": ["[5]"]}, 400, "links[0]"),
        ({"links": ["0xzz[5]"]}, 400, "links[0]"),
        ({"links": ["nobody[1]"]}, 404, "links[0]"),
        ({"links": [{"node": "leaf-00"}]}, 400, "links[0].port"),
        ({"links": [{"node": "leaf-00", "port": 0}]}, 400, "links[0].port"),
        ({"links": [{"node": " ", "port": 1}]}, 400, "links[0]"),
        ({"links": [7]}, 400, "links[0]"),
        ({"switches": [""]}, 400, "switches[0]"),
        ({"switches": ["0x"]}, 400, "switches[0]"),
        ({"switches": ["host-00001"]}, 404, "switches[0]"),
        ({"switches": ["spine-00"], "pattern": "nope"}, 400, "pattern"),
        ({"switches": ["spine-00"], "pattern": "\uff53hift:1"}, 400, "pattern"),
        ({"switches": ["spine-00"], "pattern": "incast:99"}, 409, "pattern"),
        ({"switches": ["spine-00"], "max_shifts": 0}, 400, "max_shifts"),
        ({"switches": "spine-00"}, 400, "switches"),
        ({"switches": ["spine-00"], "extra": 1}, 400, "extra"),
        ([1, 2], 400, "body"),
    ],
)
async def test_whatif_bad_bodies(client: TestClient, payload: Any, status: int, parameter: str) -> None:
    body = await _error(await client.post("/api/v1/whatif", json=payload), status, parameter)
    assert parameter in body["detail"], body


async def test_whatif_not_json(client: TestClient) -> None:
    await _error(await client.post("/api/v1/whatif", data=b"{nope", headers={"Content-Type": "application/json"}),
                 400, "body")
    await _error(await client.post("/api/v1/whatif", data=b"x", headers={"Content-Type": "text/plain"}), 415, "body")


async def test_whatif_fails_a_cable_or_switch_named_twice_once(client: TestClient, snap: SubnetSnapshot) -> None:
    f = snap.fabric
    spine = f.by_name("spine-00")
    guid, lid = f"0x{int(f.node_guid[spine]):016x}", str(int(snap.lids.base[spine, 0]))
    req = {"links": ["leaf-01[6]", "spine-01[2]", {"node": "leaf-01", "port": 6}],  # one cable, three times
           "switches": ["spine-00", guid, lid, "spine-00"], "max_shifts": 2}
    resp = await client.post("/api/v1/whatif", json=req)
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    _valid(("post", "/whatif"), body)
    assert body["failed_links"] == ["leaf-01[6] - spine-01[2]"] and body["failed_switches"] == ["spine-00"]
    # a documented body: empty links beside named switches
    resp = await client.post("/api/v1/whatif", json={"links": [], "switches": ["spine-00"], "max_shifts": 2})
    assert resp.status == 200, await resp.text()


async def test_whatif_cable_that_is_not_there_is_404(snap: SubnetSnapshot) -> None:
    f = snap.fabric.copy()
    f.disconnect(f.by_name("leaf-00"), 5)
    c = await _client(create_app(Recorder(dataclasses.replace(snap, fabric=f))))
    try:
        body = await _error(await c.post("/api/v1/whatif", json={"links": ["leaf-00[5]"]}), 404, "links[0]")
        assert "leaf-00[5] has no cable" in body["detail"]
    finally:
        await c.close()


def test_whatif_reports_an_unroutable_fabric() -> None:
    f = ring(4, 2)
    lids = sequential_lids(f)
    res = route(f, lids, ("updn",))
    sw = f.switches[0]
    rep = what_if(f, lids, res.lft, ("ftree",), RoutingOptions(), links=((int(sw), 3),), pattern="shift:1")
    assert not rep.routed and "ftree" in rep.reason and rep.quality is None
    assert rep.failed_links and rep.lft_blocks_changed == 0


# -- writes --------------------------------------------------------------------------------------------------------


async def test_sweep_needs_the_token(client: TestClient, source: Recorder) -> None:
    body = await _error(await client.post("/api/v1/sweep"), 401, "Authorization")
    resp = await client.post("/api/v1/sweep", headers={"Authorization": "Basic abc"})
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    await _error(resp, 401)
    await _error(await client.post("/api/v1/sweep", headers={"Authorization": "Bearer wrong-token"}), 403,
                 "Authorization")
    assert source.requests == []
    auth = {"Authorization": f"Bearer {TOKEN}"}
    resp = await client.post("/api/v1/sweep", headers=auth)
    assert resp.status == 202
    body = await resp.json()
    _valid(("post", "/sweep"), body)
    assert body == {"requested": True, "heavy": False, "sweep": 1}
    resp = await client.post("/api/v1/sweep", headers=auth, json={"heavy": True})
    assert resp.status == 202
    assert source.requests == [("api", False), ("api", True)]
    await _error(await client.post("/api/v1/sweep", headers=auth, json={"heavy": "yes"}), 400, "heavy")
    await _error(await client.post("/api/v1/sweep", headers=auth, json={"hevy": True}), 400, "hevy")
    await _error(await client.post("/api/v1/sweep", headers=auth, json=[]), 400, "body")
    # no body is {}; a blank one is not JSON
    resp = await client.post("/api/v1/sweep", headers={**auth, "Content-Type": "application/json"}, data=b"")
    assert resp.status == 202
    await _error(await client.post("/api/v1/sweep", headers={**auth, "Content-Type": "application/json"},
                                   data=b"\n"), 400, "body")


async def _raw(port: int, data: bytes) -> tuple[int, bytes, bytes]:
    """Send bytes as they are to 127.0.0.1:port and read until the server closes: (status, head, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body


def _no_traceback(records: list[logging.LogRecord]) -> None:
    for r in records:
        assert r.exc_info is None and r.exc_text is None, (r.name, r.getMessage())
        assert "Traceback" not in r.getMessage() and "\n" not in r.getMessage(), (r.name, r.getMessage())


def _sweep_request(token: bytes) -> bytes:
    return (b"POST /api/v1/sweep HTTP/1.1\r\nHost: ibfm\r\nAuthorization: Bearer " + token
            + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


async def test_sweep_token_compared_as_bytes(source: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = TestServer(create_app(source, ApiConfig(token="jeton-\u00e9t\u00e9")))
    await server.start_server()
    try:
        status, head, body = await _raw(server.port, _sweep_request(b"\xff\xfe"))  # not UTF-8
        assert status == 401, body
        assert b'error="invalid_token"' in head
        err = ErrorBody.model_validate_json(body)
        assert err.parameter == "Authorization" and "UTF-8" in err.detail
        status, _, body = await _raw(server.port, _sweep_request(b"jeton-\xe9t\xe9"))  # the token in Latin-1
        assert status == 401, body
        status, _, body = await _raw(server.port, _sweep_request("jeton-\u00e9t\u00e9x".encode()))
        assert status == 403, body
        assert source.requests == []
        status, _, body = await _raw(server.port, _sweep_request("jeton-\u00e9t\u00e9".encode()))
        assert status == 202, body
        assert source.requests == [("api", False)]
        _no_traceback(caplog.records)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        await server.close()


async def test_sweep_refused_without_a_configured_token(source: Recorder) -> None:
    c = await _client(create_app(source))
    try:
        body = await _error(await c.post("/api/v1/sweep", headers={"Authorization": "Bearer anything"}), 403)
        assert body["error"] == "writes_disabled" and "api.token" in body["detail"]
        assert "IBFM_API__TOKEN" in body["detail"]
        assert source.requests == []
    finally:
        await c.close()


async def test_sweep_request_reaches_a_running_manager() -> None:
    transport = EmulatedTransport(EmulatedFabric(fattree(2, 4)))
    mgr = FabricManager(transport, SmConfig(sweep_interval=3600))
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.run(stop))
    c = await _client(create_app(mgr, ApiConfig(token=TOKEN)))
    try:
        for _ in range(200):
            if mgr.snapshot is not None:
                break
            await asyncio.sleep(0.01)
        assert mgr.snapshot is not None and mgr.snapshot.sweep == 1
        resp = await c.post("/api/v1/sweep", json={"heavy": True}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status == 202
        for _ in range(300):
            if mgr.snapshot.sweep == 2:
                break
            await asyncio.sleep(0.01)
        assert mgr.snapshot.sweep == 2
        body = await (await c.get("/api/v1/health")).json()
        assert body["sweep"]["number"] == 2
    finally:
        await c.close()
        stop.set()
        await asyncio.wait_for(task, 5)
        await transport.close()


# -- events, unknown paths, metrics -----------------------------------------------------------------------------


async def test_events(client: TestClient, source: Recorder) -> None:
    for i in range(5):
        source.events.emit(LinkDown(a=PortRef(guid="0x1", name="leaf-00", port=i + 1)))
    body = await (await client.get("/api/v1/events", params={"type": "link_down", "limit": "2"})).json()
    _valid(("get", "/events"), body)
    assert body["total"] == 5 and [e["a"]["port"] for e in body["items"]] == [4, 5]
    body = await (await client.get("/api/v1/events", params={"type": "sweep_done"})).json()
    assert body["total"] == 0
    await _error(await client.get("/api/v1/events", params={"limit": "0"}), 400, "limit")


async def test_unknown_path_and_method_are_json(client: TestClient) -> None:
    body = await _error(await client.get("/api/v1/nothing"), 404, None)
    assert "openapi.json" in body["detail"]
    resp = await client.delete("/api/v1/nodes")
    body = await _error(resp, 405, None)
    assert "GET" in resp.headers["Allow"] and "DELETE" in body["detail"]
    await _error(await client.get("/api/v1/sweep"), 405, None)


async def test_metrics_mounted(source: Recorder) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="ibfm_subnet_up 1\n")

    c = await _client(create_app(source, metrics=metrics))
    try:
        resp = await c.get("/metrics")
        assert resp.status == 200 and "ibfm_subnet_up 1" in await resp.text()
        doc = await (await c.get("/api/v1/openapi.json")).json()
        assert "/metrics" in doc["paths"]
    finally:
        await c.close()
    c = await _client(create_app(source))
    try:
        assert (await c.get("/metrics")).status == 404
    finally:
        await c.close()


async def test_unexpected_exception_is_a_json_500(source: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    from exporters.http import view as view_module

    def boom(self: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(view_module.SnapshotView, "nodes", boom)
    c = await _client(create_app(source))
    try:
        body = await _error(await c.get("/api/v1/nodes"), 500, None)
        assert body["error"] == "internal" and "bug" not in body["detail"]
    finally:
        await c.close()


# -- requests aiohttp refuses: a 400, and at most one short log line ---------------------------------------------

_OVERSIZED = {
    "request line": b"GET /api/v1/nodes?name=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: ibfm\r\n\r\n",
    "header": b"GET /api/v1/health HTTP/1.1\r\nHost: ibfm\r\nX-Filler: " + b"a" * 9000 + b"\r\n\r\n",
}
_MALFORMED = {
    "chunk size": b"POST /api/v1/whatif HTTP/1.1\r\nHost: ibfm\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "8-bit path": b"GET /api/v1/nodes/\xff HTTP/1.1\r\nHost: ibfm\r\n\r\n",
}


async def test_oversized_and_malformed_requests_log_one_line(source: Recorder,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    runner = web.AppRunner(create_app(source, ApiConfig(token=TOKEN)), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        for what, data in {**_OVERSIZED, **_MALFORMED}.items():
            caplog.clear()
            status, _, body = await _raw(port, data)
            assert status == 400, (what, body)
            _no_traceback(caplog.records)
            lines = [r for r in caplog.records if r.name == "aiohttp.server"]
            assert len(lines) == 1 and lines[0].levelno == logging.INFO, (what, [r.getMessage() for r in lines])
            assert len(lines[0].getMessage()) < 300, what
            if what in _OVERSIZED:
                assert "8190 bytes" in lines[0].getMessage()
        # a body that does not decode: the API's JSON 400, still no traceback
        caplog.clear()
        status, _, body = await _raw(port, b"POST /api/v1/whatif HTTP/1.1\r\nHost: ibfm\r\nContent-Type: "
                                     b"application/json\r\nContent-Encoding: gzip\r\nContent-Length: 5\r\n"
                                     b"Connection: close\r\n\r\nabcde")
        assert status == 400
        err = ErrorBody.model_validate_json(body)
        assert err.error == "bad_body" and "content-encoding" in err.detail.lower()
        _no_traceback(caplog.records)
        assert len([r for r in caplog.records if r.name == "aiohttp.server"]) <= 1
        # the server still answers
        status, _, body = await _raw(port, b"GET /api/v1/health HTTP/1.1\r\nHost: ibfm\r\nConnection: close\r\n\r\n")
        assert status == 200
    finally:
        await runner.cleanup()


def test_server_log_passes_other_errors_through(caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp.http_exceptions import LineTooLong

    caplog.set_level(logging.DEBUG)
    try:
        raise RuntimeError("a bug in a handler")
    except RuntimeError as e:
        SERVER_LOG.exception("Error handling request from %s", "127.0.0.1", exc_info=e)
    SERVER_LOG.exception("Error handling request from %s", "127.0.0.1", exc_info=LineTooLong("x" * 9000, "8190"))
    bug, refused = caplog.records
    assert bug.levelno == logging.ERROR and bug.exc_info is not None and bug.name == "aiohttp.server"
    assert refused.levelno == logging.INFO and refused.exc_info is None
    assert refused.getMessage().startswith("Error handling request from 127.0.0.1: Got more than 8190 bytes")
    assert len(refused.getMessage()) < 300


# -- the OpenAPI document says exactly what the server takes -------------------------------------------------------

_PARAM_KEYWORDS = {"type", "enum", "minimum", "maximum", "default", "minLength", "maxLength", "pattern"}


def _conforms(schema: dict[str, Any], value: str) -> bool:
    """Whether a query or path value meets its parameter schema (every keyword the document uses for them)."""
    assert set(schema) <= _PARAM_KEYWORDS, set(schema) - _PARAM_KEYWORDS
    if "enum" in schema:
        return value in [str(x) for x in schema["enum"]]
    if schema["type"] == "integer":
        return re.fullmatch(r"-?[0-9]+", value) is not None and (
            schema.get("minimum", -math.inf) <= Decimal(value) <= schema.get("maximum", math.inf))
    return (schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", math.inf)
            and re.search(schema.get("pattern", ""), value) is not None)


@pytest.mark.parametrize(
    ("path", "params", "status"),
    [
        ("/api/v1/nodes", {"offset": "1234567890123456"}, 400),
        ("/api/v1/nodes", {"offset": str(1 << 31)}, 200),
        ("/api/v1/nodes", {"offset": "0" * 30 + "7"}, 200),
        ("/api/v1/nodes", {"limit": "9" * 5000}, 400),
        ("/api/v1/ports", {"node": ""}, 400),
        ("/api/v1/ports", {"node": " \u3000\x1c"}, 400),
        ("/api/v1/ports", {"node": "\ufeff"}, 404),  # not whitespace to Python: a name
        ("/api/v1/links", {"node": "0x"}, 400),
        ("/api/v1/links", {"node": "0x1__2"}, 400),
        ("/api/v1/links", {"node": "0x_2c9"}, 404),
        ("/api/v1/links", {"node": "0 x"}, 404),
        ("/api/v1/links", {"node": "x" * 257}, 400),
        ("/api/v1/routes", {"src": "bad GUID", "dst": "host-00001"}, 404),
        ("/api/v1/routes", {"src": "empty", "dst": "host-00001"}, 404),
        ("/api/v1/routes", {"src": "host-00000", "dst": "\t"}, 400),
        ("/api/v1/nodes/{id}", {"id": "\u00a0"}, 400),
        ("/api/v1/nodes/{id}", {"id": "0Xg"}, 400),
        ("/api/v1/nodes/{id}", {"id": "\u0663"}, 404),
        ("/api/v1/switches/{id}/lft", {"id": "0x0"}, 404),
        ("/api/v1/congestion", {"pattern": "\uff53hift:1"}, 400),
        ("/api/v1/congestion", {"pattern": "shift:2"}, 200),
        ("/api/v1/congestion", {"pattern": "random-bisection:3@.5"}, 200),
        ("/api/v1/congestion", {"pattern": "random-permutation:007"}, 400),
        ("/api/v1/congestion", {"pattern": "incast:99"}, 409),
        ("/api/v1/congestion", {"pattern": "shift:32"}, 409),
        ("/api/v1/congestion", {"pattern": "shift:99999999999999999999"}, 400),
        ("/api/v1/congestion", {"pattern": "x" * 201}, 400),
        ("/api/v1/events", {"limit": "1000"}, 200),
        ("/api/v1/events", {"limit": "1001"}, 400),
    ],
)
async def test_document_and_server_agree(client: TestClient, path: str, params: dict[str, str], status: int) -> None:
    op = build_openapi()["paths"][path]["get"]
    schemas = {p["name"]: p["schema"] for p in op.get("parameters", [])}
    documented = all(_conforms(schemas[k], v) for k, v in params.items())
    assert documented == (status != 400), (params, documented)
    url = path
    query = dict(params)
    if "{id}" in path:
        url = path.replace("{id}", urllib.parse.quote(query.pop("id"), safe=""))
    resp = await client.get(url, params=query)
    assert resp.status == status, await resp.text()
    if status == 400:
        assert (await resp.json())["parameter"] in params


@pytest.mark.parametrize(
    ("query", "detail"),
    [
        ("offset=1234567890123456", "offset: 1234567890123456 is too large (must be <= 2147483648)"),
        ("offset=" + "9" * 5000, "offset: 999999999999...(5000 digits) is too large (must be <= 2147483648)"),
        ("limit=0", "limit: 0 is too small (must be >= 1)"),
        ("limit=-" + "0" * 40 + "5", "limit: -00000000000...(1 digits) is too small (must be >= 1)"),
    ],
)
async def test_integer_out_of_range_says_the_bound(client: TestClient, query: str, detail: str) -> None:
    body = await _error(await client.get(f"/api/v1/nodes?{query}"), 400)
    assert body["detail"] == detail


def test_document_limits() -> None:
    doc = build_openapi()
    params = {(p, q["name"]): q["schema"] for p, ops in doc["paths"].items() for op in ops.values()
              for q in op.get("parameters", [])}
    assert params["/api/v1/nodes", "offset"]["maximum"] == OFFSET_MAX
    for key in (("/api/v1/ports", "node"), ("/api/v1/links", "node"), ("/api/v1/routes", "src"),
                ("/api/v1/routes", "dst"), ("/api/v1/nodes/{id}", "id"), ("/api/v1/switches/{id}/lft", "id")):
        assert params[key]["pattern"] == NODE_ID_PATTERN and params[key]["maxLength"] == NODE_ID_MAX, key
    assert params["/api/v1/congestion", "pattern"]["pattern"] == PATTERN_SPEC_PATTERN
    schemas = doc["components"]["schemas"]
    whatif = schemas["WhatIfRequest"]
    assert {"required": ["links"], "properties": {"links": {"minItems": 1}}} in whatif["anyOf"]
    assert whatif["properties"]["pattern"]["pattern"] == PATTERN_SPEC_PATTERN
    assert whatif["properties"]["switches"]["items"]["pattern"] == NODE_ID_PATTERN
    assert whatif["properties"]["links"]["items"]["anyOf"][0]["pattern"] == LINK_PATTERN
    assert schemas["LinkSpec"]["properties"]["node"]["pattern"] == NODE_ID_PATTERN
    body = doc["paths"]["/api/v1/validation"]["post"]["requestBody"]["content"]
    assert {c["schema"]["$ref"] for c in body.values()} == {"#/components/schemas/NetFile"}


async def test_documented_net_file_example_is_taken(client: TestClient) -> None:
    for ctype in ("text/plain", "application/octet-stream"):
        for text in NETFILE_SCHEMA["examples"]:
            resp = await client.post("/api/v1/validation", data=text.encode(), headers={"Content-Type": ctype})
            assert resp.status == 200, await resp.text()
    # blank to the pattern is blank to the server
    await _error(await client.post("/api/v1/validation", data=b" \t\r\n\x0b\x0c",
                                   headers={"Content-Type": "text/plain"}), 400, "body")
    assert re.search(NETFILE_SCHEMA["pattern"], " \t\r\n\x0b\x0c") is None


@pytest.fixture(scope="module")
def view(snap: SubnetSnapshot) -> SnapshotView:
    return SnapshotView(snap)


def _status(fn: Any, *args: Any) -> int:
    try:
        fn(*args)
    except ApiError as e:
        return e.status
    return 200


_ID_TEXT = st.lists(st.sampled_from([*"0xX_aF9g- [].1", "\t", "\n", "\u3000", "\x1c", "\x85", "\ufeff", "\u00b2",
                                     "\u0663", "\u00e9", "leaf-00", "spine-01", "host-00003"]),
                    max_size=8).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(_ID_TEXT, st.from_regex(NODE_ID_PATTERN, fullmatch=True).filter(lambda t: len(t) <= 256)))
def test_node_id_pattern_is_what_the_server_takes(view: SnapshotView, text: str) -> None:
    documented = re.search(NODE_ID_PATTERN, text) is not None
    event(f"documented: {documented}")
    for lookup in (view.node, view.endpoint):
        status = _status(lookup, text, "id")
        if documented:
            assert status != 400, (lookup.__name__, text)
        elif text.isascii() or not text.strip().lower().startswith("0x"):  # int(, 16) takes any Unicode digit
            assert status == 400, (lookup.__name__, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(
    st.tuples(_ID_TEXT, st.sampled_from(["[1]", "[5]", "[8]", "[9]", "[254]", "[0]", "[07]", "[", "]", ""]))
    .map("".join),
    st.from_regex(LINK_PATTERN, fullmatch=True).filter(lambda t: len(t) <= NODE_ID_MAX + 3),
))
def test_link_pattern_is_taken(view: SnapshotView, text: str) -> None:
    documented = re.search(LINK_PATTERN, text) is not None
    event(f"documented: {documented}")
    status = _status(_link_spec, view, text, "links[0]")
    if documented:
        assert status != 400, text


_SPEC_TEXT = st.lists(st.sampled_from(["shift", "incast", "random-bisection", "all-to-all", "ring", "-per-rail", ":",
                                       "@", "0", "1", "7", "32", ".", "5", " ", "SHIFT", "x", "\uff53"]),
                      max_size=6).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=st.one_of(_SPEC_TEXT, st.from_regex(PATTERN_SPEC_PATTERN, fullmatch=True).filter(lambda t: len(t) <= 200)))
def test_pattern_spec_pattern_is_what_the_server_takes(view: SnapshotView, spec: str) -> None:
    documented = re.search(PATTERN_SPEC_PATTERN, spec) is not None and len(spec) <= 200
    status = _status(lambda: _build_pattern(view.fabric, view.lids, check_pattern_spec(spec, "pattern"), "pattern"))
    event(f"documented: {documented}, {status}")
    if documented:
        assert status in (200, 409), spec
    elif status == 409:  # the server strips blanks first; any other undocumented spec that fails is a 400
        assert re.fullmatch(PATTERN_SPEC_PATTERN, spec.strip()), spec
    else:
        assert status in (200, 400), spec


# -- property-based: every operation of the OpenAPI document, random inputs, never a 5xx -------------------------

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_IDS = ["leaf-00", "spine-03", "host-00007", "0x0002c90000000040", "1", "13", "40", "0x0", "99999", "",
        "\u00b2", "\u0663", "--5", "0x", "0x_1", "leaf-00[5]", " ", "%"]


def _value(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    if "enum" in schema:
        valid = st.sampled_from([str(x) for x in schema["enum"]])
        return st.one_of(valid, valid, valid, _TEXT)
    if schema.get("type") == "integer":
        lo, hi = schema.get("minimum", -10), schema.get("maximum", 2000)
        return st.one_of(st.integers(lo - 3, hi + 3).map(str), _TEXT)
    specs = ["shift:3", "incast:4:1", "random-bisection:2@0.5", "all-to-all"]
    return st.one_of(st.sampled_from([*_IDS, *specs]), _TEXT)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=10,
)
_LINK = st.one_of(st.sampled_from(["leaf-00[5]", "spine-01[3]", "host-00002[1]", "leaf-09[1]"]), _TEXT,
                  st.fixed_dictionaries({"node": st.sampled_from(_IDS), "port": st.integers(-1, 70)}))
_GOOD_WHATIF = st.sampled_from([
    {"switches": ["spine-01"]},
    {"links": ["leaf-00[5]", "host-00003[1]"], "pattern": "incast:4"},
    {"links": [{"node": "spine-02", "port": 8}], "max_shifts": 3},
])
_WHATIF = st.one_of(
    _GOOD_WHATIF,
    _GOOD_WHATIF,
    st.fixed_dictionaries(
        {},
        optional={
            "links": st.lists(_LINK, max_size=3),
            "switches": st.lists(st.sampled_from(_IDS), max_size=3),
            "pattern": st.sampled_from(["shift:1", "incast:3", "bogus", "shift:32"]),
            "max_shifts": st.integers(-2, 2000),
        },
    ),
    _JSON,
)


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    doc = build_openapi()
    return [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


@st.composite
def _request(draw: st.DrawFn) -> tuple[str, str, dict[str, str], dict[str, str], bytes | None]:
    method, path, op = draw(st.sampled_from(_operations()))
    params: dict[str, str] = {}
    for p in op.get("parameters", []):
        if p["in"] == "path":
            value = draw(st.one_of(st.sampled_from([i for i in _IDS if i.strip()]), _TEXT.filter(bool)))
            path = path.replace("{" + p["name"] + "}", urllib.parse.quote(value, safe=""))
        elif p.get("required") or draw(st.booleans()):
            params[p["name"]] = draw(_value(p["schema"]))
    if draw(st.integers(0, 9)) == 0:
        params[draw(_TEXT)] = draw(_TEXT)
    headers: dict[str, str] = {}
    body: bytes | None = None
    if method == "post":
        kind = draw(st.sampled_from(["json", "json", "text", "none"]))
        if path.endswith("/whatif") and kind == "json":
            body = json.dumps(draw(_WHATIF)).encode()
        elif kind == "json":
            body = json.dumps(draw(_JSON)).encode()
        elif kind == "text":
            body = draw(st.one_of(_TEXT.map(str.encode), st.binary(max_size=64),
                                  st.just(format_net(fattree(2, 4)).encode())))
        if body is not None:
            right = "application/json" if kind == "json" else "text/plain"
            headers["Content-Type"] = draw(st.sampled_from([right, right, right, "application/json", "text/plain",
                                                            "application/octet-stream", "image/png"]))
        headers["Authorization"] = draw(st.sampled_from([f"Bearer {TOKEN}", "Bearer x", "", "Basic Zm9v"]))
    return method, path, params, headers, body


@pytest.fixture(scope="module")
def live_client(snap: SubnetSnapshot) -> Iterator[tuple[asyncio.AbstractEventLoop, TestClient]]:
    loop = asyncio.new_event_loop()
    client = TestClient(TestServer(create_app(Recorder(snap), ApiConfig(token=TOKEN))), loop=loop)
    loop.run_until_complete(client.start_server())
    yield loop, client
    loop.run_until_complete(client.close())
    loop.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=_request())
def test_openapi_operations_never_fail_with_5xx(
    live_client: tuple[asyncio.AbstractEventLoop, TestClient], req: tuple[str, str, dict[str, str], dict[str, str],
                                                                       bytes | None]
) -> None:
    loop, client = live_client
    method, path, params, headers, body = req

    async def go() -> tuple[int, str, bytes]:
        resp = await client.request(method.upper(), path, params=params, headers=headers, data=body)
        return resp.status, resp.content_type, await resp.read()

    status, ctype, raw = loop.run_until_complete(go())
    event(f"{method} {'/'.join(path.split('/')[3:5])[:20]}: {status}")
    assert status < 500, (method, path, params, raw[:300])
    if status >= 400:
        assert ctype == "application/json", (status, raw[:200])
        ErrorBody.model_validate_json(raw)
    elif ctype == "application/json":
        key = (method, path.removeprefix("/api/v1"))
        templ = next((k for k in MODEL_FOR if k[0] == method and _match(k[1], key[1])), None)
        if templ is not None:
            MODEL_FOR[templ].model_validate_json(raw)


def _match(template: str, path: str) -> bool:
    a, b = template.split("/"), path.split("/")
    return len(a) == len(b) and all(x == y or x.startswith("{") for x, y in zip(a, b, strict=True))


async def test_prepare_view_builds_the_tables_ahead(source: Recorder, snap: SubnetSnapshot) -> None:
    from exporters.http.state import RUNTIME, prepare_view

    app = create_app(source)
    await prepare_view(app, snap)
    view = app[RUNTIME].views.get(snap)
    assert view.snap is snap and view._nodes is not None and view._summary == snap.fabric.summary()
    other = dataclasses.replace(snap)
    await prepare_view(app, other)  # not the manager's current snapshot: dropped
    assert app[RUNTIME].views.get(snap) is view
