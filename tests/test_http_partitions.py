"""Partitions over the HTTP API and /metrics, and their reload: on the emulated fat-tree with two tenants.

The two-tenant file of ``tests/test_partitions_sm.py`` on fattree(2, 4): hosts 0-3 full members
of A (0x8001, ipoib), host 4 a limited member, hosts 5-7 full members of B (0x8002); the Default
partition as ALL=limited, SELF=full (host 0 is the SM). The expected figures are written out from
that file, not read back from the plan.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from exporters.http.app import create_app
from exporters.http.common import ApiConfig
from exporters.http.openapi import MODEL_FOR, ErrorBody, PartitionsFileError, build_openapi
from exporters.prometheus import MetricsInputs, MetricsRenderer
from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.model import Fabric
from sm.partitions.config import PartitionConfig, parse_partitions
from sm.partitions.plan import plan_partitions
from sm.sweep.events import EventBus
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot
from sm.transport.emulated import EmulatedTransport
from tests.test_http_api import _conforms
from tests.test_partitions_sm import guid, two_tenants

TOKEN = "partitions-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BAD_FILE = "Default=0x7fff : ALL=limited, SELF=full ;\nA=0x8001, ipoib, bogus : ALL=full ;\n"
"""Line 2, column 18: an unknown flag."""


@dataclasses.dataclass(frozen=True)
class Tenants:
    fabric: Fabric
    config: PartitionConfig
    snap: SubnetSnapshot

    @property
    def cas(self) -> list[int]:
        return [int(n) for n in self.fabric.cas]

    @property
    def endports(self) -> int:
        """Switch port 0 of every switch and the one port of every host."""
        return int(self.fabric.switches.size + self.fabric.cas.size)


async def _sweep(config: PartitionConfig) -> tuple[Fabric, SubnetSnapshot]:
    f = fattree(2, 4)
    transport = EmulatedTransport(EmulatedFabric(f), issm=True)
    try:
        mgr = FabricManager(transport, SmConfig(offload=False, check_credit_loops=False, partitions=config))
        return f, await mgr.heavy_sweep()
    finally:
        await transport.close()


@pytest.fixture(scope="module")
def tenants() -> Tenants:
    cfg = parse_partitions(two_tenants(fattree(2, 4)), "two.conf")
    f, snap = asyncio.run(_sweep(cfg))
    assert snap.partitions is not None and snap.partitions.config is cfg and snap.up
    return Tenants(f, cfg, snap)


class Source:
    """A SubnetSource over a fixed snapshot: sweep requests and partitions handed over are recorded."""

    def __init__(self, snap: SubnetSnapshot | None, partitions: PartitionConfig | None) -> None:
        self.snapshot = snap
        self.config = SmConfig(partitions=partitions)
        self.events = EventBus()
        self.requests: list[tuple[str, bool]] = []
        self.applied: list[PartitionConfig | None] = []

    def request_sweep(self, reason: str, *, heavy: bool = False) -> None:
        self.requests.append((reason, heavy))

    def set_partitions(self, partitions: PartitionConfig | None) -> None:
        self.config = dataclasses.replace(self.config, partitions=partitions)
        self.applied.append(partitions)
        self.request_sweep("partitions", heavy=True)


async def _client(app: web.Application) -> TestClient:
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.fixture
def source(tenants: Tenants) -> Source:
    return Source(tenants.snap, tenants.config)


@pytest.fixture
async def client(source: Source) -> AsyncIterator[TestClient]:
    c = await _client(create_app(source, ApiConfig(token=TOKEN)))
    yield c
    await c.close()


async def _ok(resp: Any, key: tuple[str, str]) -> Any:
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    MODEL_FOR[key].model_validate(body)
    return body


async def _error(resp: Any, status: int, error: str, parameter: str | None = None) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    ErrorBody.model_validate(body)
    assert body["error"] == error and body["parameter"] == parameter, body
    return body


# -- GET /partitions ---------------------------------------------------------------------------------------------


async def test_list(client: TestClient, tenants: Tenants) -> None:
    body = await _ok(await client.get("/api/v1/partitions"), ("get", "/partitions"))
    assert body["source"] == "two.conf" and body["sweep"] == tenants.snap.sweep and body["pending"] is False
    assert body["problems"] == [] and body["problems_total"] == 0
    assert body["total"] == 3
    by_name = {p["name"]: p for p in body["items"]}
    assert [p["name"] for p in body["items"]] == ["Default", "A", "B"]
    k = tenants.endports
    assert by_name["Default"] == {
        "name": "Default", "pkey": "0xffff", "ipoib": False, "indx0": False, "mtu": None, "rate": None, "sl": None,
        "scope": None, "defmember": "limited", "members": k, "full": 1, "limited": k - 1,
    }
    a, b = by_name["A"], by_name["B"]
    assert (a["pkey"], a["ipoib"], a["members"], a["full"], a["limited"]) == ("0x8001", True, 5, 4, 1)
    assert (b["pkey"], b["ipoib"], b["members"], b["full"], b["limited"]) == ("0x8002", False, 3, 3, 0)
    await _error(await client.get("/api/v1/partitions", params={"limit": "5"}), 400, "unknown_parameter", "limit")


async def test_list_reports_the_plans_problems(tenants: Tenants) -> None:
    text = two_tenants(tenants.fabric) + "C=0x0003 : 0x00000000deadbeef=full ;\n"
    cfg = parse_partitions(text, "three.conf")
    d = tenants.snap.discovery
    plan = plan_partitions(cfg, tenants.fabric, sm_port=(d.sm_node, d.sm_port))
    c = await _client(create_app(Source(dataclasses.replace(tenants.snap, partitions=plan), cfg)))
    try:
        body = await _ok(await c.get("/api/v1/partitions"), ("get", "/partitions"))
    finally:
        await c.close()
    assert body["problems_total"] == 2 == len(body["problems"])
    assert any("three.conf:4:" in p and "0x00000000deadbeef is not on the subnet" in p for p in body["problems"])
    assert any("'C'" in p and "no port on the subnet" in p for p in body["problems"])
    c_item = body["items"][-1]
    assert (c_item["name"], c_item["pkey"], c_item["members"], c_item["full"], c_item["limited"]) == (
        "C", "0x8003", 0, 0, 0)


# -- GET /partitions/{pkey} ------------------------------------------------------------------------------------


async def test_one_partition_with_its_members(client: TestClient, tenants: Tenants) -> None:
    f, cas, lids = tenants.fabric, tenants.cas, tenants.snap.lids
    body = await _ok(await client.get("/api/v1/partitions/0x8001"), ("get", "/partitions/{pkey}"))
    assert body["partition"]["name"] == "A" and body["partition"]["members"] == 5
    assert (body["total"], body["offset"], body["limit"]) == (5, 0, 100)
    expected = [
        {"node": f.names[n], "guid": f"0x{int(f.node_guid[n]):016x}", "port": 1, "port_guid": guid(f, n),
         "lid": int(lids.base[n, 1]), "membership": "limited" if i == 4 else "full"}
        for i, n in enumerate(cas[:5])
    ]
    assert sorted(body["items"], key=lambda m: m["port_guid"]) == sorted(expected, key=lambda m: m["port_guid"])
    # the low 15 bits name it: hex of either form, decimal of either form, upper-case X
    for key in ("0x0001", "1", str(0x8001), "0X8001", "0x1"):
        again = await _ok(await client.get(f"/api/v1/partitions/{key}"), ("get", "/partitions/{pkey}"))
        assert again == body, key
    limited = await _ok(await client.get("/api/v1/partitions/0x8001", params={"membership": "limited"}),
                        ("get", "/partitions/{pkey}"))
    assert limited["total"] == 1 and [m["node"] for m in limited["items"]] == [f.names[cas[4]]]
    full = await (await client.get("/api/v1/partitions/0x8001", params={"membership": "FULL"})).json()
    assert full["total"] == 4 and {m["membership"] for m in full["items"]} == {"full"}
    page = await (await client.get("/api/v1/partitions/0x8001", params={"limit": "2", "offset": "1"})).json()
    assert page["total"] == 5 and page["items"] == body["items"][1:3]


async def test_default_partition_lists_switches_as_port_0(client: TestClient, tenants: Tenants) -> None:
    body = await _ok(await client.get("/api/v1/partitions/0xffff", params={"limit": "1000"}),
                     ("get", "/partitions/{pkey}"))
    f = tenants.fabric
    assert body["total"] == tenants.endports == len(body["items"])
    switches = [m for m in body["items"] if f.is_switch(f.by_name(m["node"]))]
    assert len(switches) == f.switches.size and {m["port"] for m in switches} == {0}
    full = [m["node"] for m in body["items"] if m["membership"] == "full"]
    assert full == [f.names[tenants.snap.discovery.sm_node]]  # SELF=full: the SM's port alone


@pytest.mark.parametrize(
    ("key", "status", "error"),
    [
        ("0x8005", 404, "not_found"),
        ("0x0", 404, "not_found"),  # key 0 is no partition's
        ("32768", 404, "not_found"),  # 0x8000: key 0 as well
        ("0x12345", 400, "bad_parameter"),
        ("65536", 400, "bad_parameter"),
        ("00001", 400, "bad_parameter"),
        ("-1", 400, "bad_parameter"),
        ("0x", 400, "bad_parameter"),
        ("A", 400, "bad_parameter"),  # by P_Key, not by name
        ("reload", 400, "bad_parameter"),  # GET on the reload path is a P_Key that is not one
    ],
)
async def test_unknown_or_bad_key(client: TestClient, key: str, status: int, error: str) -> None:
    body = await _error(await client.get(f"/api/v1/partitions/{key}"), status, error, "pkey")
    if status == 404:
        assert "two.conf" in body["detail"]
    schema = next(p["schema"] for p in build_openapi()["paths"]["/api/v1/partitions/{pkey}"]["get"]["parameters"]
                  if p["name"] == "pkey")
    assert _conforms(schema, key) == (status != 400), key  # the document says what the server takes


async def test_before_the_first_sweep_is_503() -> None:
    c = await _client(create_app(Source(None, None)))
    try:
        for path in ("/api/v1/partitions", "/api/v1/partitions/0x8001"):
            resp = await c.get(path)
            await _error(resp, 503, "no_snapshot")
            assert resp.headers["Retry-After"]
    finally:
        await c.close()


# -- the partitions a route's two ends share ---------------------------------------------------------------------


async def _route(client: TestClient, a: str, b: str) -> Any:
    return await _ok(await client.get("/api/v1/routes", params={"src": a, "dst": b}), ("get", "/routes"))


async def test_route_names_the_shared_partitions(client: TestClient, tenants: Tenants) -> None:
    names = [tenants.fabric.names[n] for n in tenants.cas]
    both_full = await _route(client, names[1], names[2])  # full in A, limited (only) in Default
    assert both_full["partitions"] == [{"pkey": "0x8001", "name": "A"}] and both_full["partition_note"] is None
    assert both_full["path_record"]["pkey"] == "0x8001"
    to_limited = await _route(client, names[1], names[4])
    assert to_limited["partitions"] == [{"pkey": "0x8001", "name": "A"}]
    from_limited = await _route(client, names[4], names[1])  # as the source holds the key
    assert from_limited["partitions"] == [{"pkey": "0x0001", "name": "A"}]
    assert from_limited["path_record"]["pkey"] == "0x0001"
    sm = await _route(client, names[0], names[5])  # the SM is a full member of the Default partition
    assert sm["partitions"] == [{"pkey": "0xffff", "name": "Default"}] and sm["path_record"]["pkey"] == "0xffff"


async def test_route_between_tenants_shares_nothing(client: TestClient, tenants: Tenants) -> None:
    names = [tenants.fabric.names[n] for n in tenants.cas]
    for a, b in ((names[1], names[5]), (names[6], names[4]), (names[4], names[7])):
        body = await _route(client, a, b)
        assert body["delivered"] is True  # the LFTs route them; the partitions keep them apart
        assert body["partitions"] == [] and body["path_record"] is None
        assert "share no partition" in body["partition_note"] and "cannot talk" in body["partition_note"]
        assert a in body["partition_note"] and b in body["partition_note"]


# -- POST /partitions/reload -------------------------------------------------------------------------------------


def _app(source: Source, path: Path | None) -> web.Application:
    return create_app(source, ApiConfig(token=TOKEN, partitions_file=path))


async def test_reload_needs_the_token(source: Source, tenants: Tenants, tmp_path: Path) -> None:
    conf = tmp_path / "partitions.conf"
    conf.write_text(two_tenants(tenants.fabric))
    c = await _client(_app(source, conf))
    try:
        await _error(await c.post("/api/v1/partitions/reload"), 401, "unauthorized", "Authorization")
        await _error(await c.post("/api/v1/partitions/reload", headers={"Authorization": "Bearer nope"}), 403,
                     "forbidden", "Authorization")
        assert source.applied == [] and source.requests == []
        assert source.config.partitions is tenants.config
    finally:
        await c.close()
    c = await _client(create_app(source, ApiConfig(partitions_file=conf)))  # no token configured
    try:
        await _error(await c.post("/api/v1/partitions/reload", headers=AUTH), 403, "writes_disabled")
        assert source.applied == []
    finally:
        await c.close()


async def test_reload_without_a_file_is_409(source: Source, caplog: pytest.LogCaptureFixture) -> None:
    c = await _client(_app(source, None))
    try:
        body = await _error(await c.post("/api/v1/partitions/reload", headers=AUTH), 409, "no_partitions_file")
        assert "sm.partitions" in body["detail"]
        assert source.applied == [] and source.requests == []
    finally:
        await c.close()
    assert any("no partitions file is configured" in r.getMessage() for r in caplog.records)


async def test_reload_a_good_file(source: Source, tenants: Tenants, tmp_path: Path,
                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    f, cas = tenants.fabric, tenants.cas
    conf = tmp_path / "partitions.conf"
    conf.write_text(two_tenants(f).replace(f"{guid(f, cas[4])} ;", f"{guid(f, cas[4])}, {guid(f, cas[7])}=full ;"))
    c = await _client(_app(source, conf))
    try:
        body = await _ok(await c.post("/api/v1/partitions/reload", headers=AUTH), ("post", "/partitions/reload"))
        assert body == {"source": str(conf), "partitions": 3, "changed": True, "sweep": tenants.snap.sweep}
        new = source.config.partitions
        assert new is not None and source.applied == [new] and new.source == str(conf)
        a = new.by_pkey(0x8001)
        assert a is not None and (guid(f, cas[7]), "full") in [(f"{m.guid:#018x}", m.membership) for m in a.members]
        assert source.requests == [("partitions", True)]
        # the snapshot still has the old plan until the heavy sweep: said so
        listing = await (await c.get("/api/v1/partitions")).json()
        assert listing["pending"] is True and listing["source"] == "two.conf"
        # the same file again: applied, and reported unchanged
        again = await (await c.post("/api/v1/partitions/reload", headers=AUTH)).json()
        assert again["changed"] is False and len(source.applied) == 2
    finally:
        await c.close()
    lines = [r for r in caplog.records if r.getMessage().startswith("partitions reloaded (api)")]
    assert len(lines) == 2 and str(conf) in lines[0].getMessage() and "3 partitions" in lines[0].getMessage()
    assert lines[0].partitions_reload["result"] == "applied"  # type: ignore[attr-defined]


async def test_reload_a_bad_file_keeps_the_running_partitions(source: Source, tenants: Tenants, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    conf = tmp_path / "partitions.conf"
    conf.write_text(BAD_FILE)
    c = await _client(_app(source, conf))
    try:
        resp = await c.post("/api/v1/partitions/reload", headers=AUTH)
        assert resp.status == 400, await resp.text()
        body = await resp.json()
        PartitionsFileError.model_validate(body)
        assert body["error"] == "bad_partitions_file" and body["parameter"] is None
        assert (body["file"], body["line"], body["column"]) == (str(conf), 2, 18)
        assert body["message"].startswith("unknown partition flag 'bogus'")
        assert body["detail"] == f"{conf}:2:18: {body['message']}"
        assert source.applied == [] and source.requests == []
        assert source.config.partitions is tenants.config
        listing = await (await c.get("/api/v1/partitions")).json()
        assert listing["source"] == "two.conf" and listing["pending"] is False
        # a file that is gone: no line, no column
        conf.unlink()
        body = await (await c.post("/api/v1/partitions/reload", headers=AUTH)).json()
        assert (body["error"], body["file"], body["line"], body["column"]) == (
            "bad_partitions_file", str(conf), None, None)
        assert body["message"] == "no such file"
        assert source.applied == [] and source.config.partitions is tenants.config
    finally:
        await c.close()
    refused = [r for r in caplog.records if "not reloaded (api)" in r.getMessage()]
    assert len(refused) == 2 and all(r.levelno == logging.WARNING for r in refused)
    assert f"{conf}:2:18: unknown partition flag 'bogus'" in refused[0].getMessage()
    assert "running configuration stays" in refused[0].getMessage()
    assert all("\n" not in r.getMessage() for r in refused)


async def test_reload_reaches_a_running_manager(tenants: Tenants, tmp_path: Path) -> None:
    f, cas = tenants.fabric, tenants.cas
    conf = tmp_path / "partitions.conf"
    conf.write_text(two_tenants(f))
    cfg = parse_partitions(conf.read_text(), str(conf))
    emu = EmulatedFabric(fattree(2, 4))
    transport = EmulatedTransport(emu, issm=True)
    mgr = FabricManager(transport, SmConfig(offload=False, check_credit_loops=False, partitions=cfg,
                                            sweep_interval=3600))
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.run(stop))
    c = await _client(create_app(mgr, ApiConfig(token=TOKEN, partitions_file=conf)))

    async def until_sweep(n: int) -> SubnetSnapshot:
        for _ in range(500):
            if mgr.snapshot is not None and mgr.snapshot.sweep >= n:
                return mgr.snapshot
            await asyncio.sleep(0.01)
        raise AssertionError(f"no sweep {n}")

    try:
        await until_sweep(1)
        a = (await (await c.get("/api/v1/partitions/0x8001")).json())["partition"]
        assert (a["full"], a["limited"]) == (4, 1)
        # a bad file: refused, no sweep, the fabric keeps what it holds
        conf.write_text(BAD_FILE)
        assert (await c.post("/api/v1/partitions/reload", headers=AUTH)).status == 400
        await asyncio.sleep(0.2)
        assert mgr.snapshot is not None and mgr.snapshot.sweep == 1 and mgr.config.partitions is cfg
        # host 7 joins A: applied by the heavy sweep the reload asks for, and programmed into its P_KeyTable
        conf.write_text(two_tenants(f).replace(f"{guid(f, cas[4])} ;", f"{guid(f, cas[4])}, {guid(f, cas[7])}=full ;"))
        assert (await c.post("/api/v1/partitions/reload", headers=AUTH)).status == 200
        snap = await until_sweep(2)
        assert snap.partitions is not None and snap.partitions.config is mgr.config.partitions
        a = (await (await c.get("/api/v1/partitions/0x8001")).json())["partition"]
        assert (a["full"], a["limited"]) == (5, 1)
        listing = await (await c.get("/api/v1/partitions")).json()
        assert listing["source"] == str(conf) and listing["pending"] is False
        assert 0x8001 in emu.pkey_table(cas[7], 1).tolist()
        route = await (await c.get("/api/v1/routes", params={"src": f.names[cas[1]], "dst": f.names[cas[7]]})).json()
        assert route["partitions"] == [{"pkey": "0x8001", "name": "A"}]
    finally:
        await c.close()
        stop.set()
        await asyncio.wait_for(task, 10)
        await transport.close()


# -- metrics -----------------------------------------------------------------------------------------------------


def _partition_series(text: bytes) -> tuple[dict[tuple[str, str, str], float], float]:
    members: dict[tuple[str, str, str], float] = {}
    problems = -1.0
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name == "ibfm_partition_members":
                key = (s.labels["pkey"], s.labels["name"], s.labels["membership"])
                assert key not in members
                members[key] = s.value
            elif s.name == "ibfm_partition_problems":
                problems = s.value
    return members, problems


def test_metrics(tenants: Tenants) -> None:
    k = tenants.endports
    renderer = MetricsRenderer(lambda: MetricsInputs(tenants.snap))
    out = renderer.render()
    assert b"# TYPE ibfm_partition_members gauge" in out and b"# TYPE ibfm_partition_problems gauge" in out
    members, problems = _partition_series(out)
    assert members == {
        ("0xffff", "Default", "full"): 1, ("0xffff", "Default", "limited"): k - 1,
        ("0x8001", "A", "full"): 4, ("0x8001", "A", "limited"): 1,
        ("0x8002", "B", "full"): 3, ("0x8002", "B", "limited"): 0,
    }
    assert problems == 0
    # a new snapshot with another plan: the families follow it (nothing kept from the old plan)
    text = two_tenants(tenants.fabric) + "C=0x0003 : 0x00000000deadbeef=full ;\n"
    cfg = parse_partitions(text, "three.conf")
    d = tenants.snap.discovery
    plan = plan_partitions(cfg, tenants.fabric, sm_port=(d.sm_node, d.sm_port))
    other = dataclasses.replace(tenants.snap, partitions=plan)
    renderer.source = lambda: MetricsInputs(other)
    members, problems = _partition_series(renderer.render())
    assert members[("0x8003", "C", "full")] == 0 == members[("0x8003", "C", "limited")]
    assert members[("0x8001", "A", "full")] == 4
    assert problems == 2  # the GUID not on the subnet, and C having no port


def test_metrics_escape_the_partition_name(tenants: Tenants) -> None:
    cfg = parse_partitions('Default=0x7fff : ALL=full ;\nta"nt\\x=0x0005 : ALL=limited ;\n', "odd.conf")
    d = tenants.snap.discovery
    plan = plan_partitions(cfg, tenants.fabric, sm_port=(d.sm_node, d.sm_port))
    out = MetricsRenderer(lambda: MetricsInputs(dataclasses.replace(tenants.snap, partitions=plan))).render()
    line = f'ibfm_partition_members{{pkey="0x8005",name="ta\\"nt\\\\x",membership="limited"}} {tenants.endports}\n'
    assert line.encode() in out
    members, _ = _partition_series(out)
    assert members[("0x8005", 'ta"nt\\x', "limited")] == tenants.endports
