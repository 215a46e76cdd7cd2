"""The fabric page (``GET /``): the JSON it draws (``/api/v1/view/fabric``), and the page as Debian's chromium
renders it from the daemon running on an emulated fat-tree with a cable pulled."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import zlib
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer

from exporters.http.app import create_app
from exporters.http.common import ApiConfig
from exporters.http.openapi import FabricView, build_openapi
from exporters.http.page import MAX_SWITCHES_DEFAULT, asset
from fabric.emulator import EmulatedFabric
from fabric.formats.netfile import format_net
from fabric.generate import fattree
from fabric.model import Fabric, NodeType
from sm.sweep.events import EventBus
from sm.sweep.manager import FabricManager
from sm.transport.emulated import EmulatedTransport
from tests.conftest import need_tool


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("IBFM_"):
            monkeypatch.delenv(k)


def _uplink(f: Fabric, name: str) -> tuple[int, int, str, int]:
    """(node, port, peer name, peer port) of the first cable from switch ``name`` to another switch."""
    n = f.by_name(name)
    p, m, q = next((p, m, q) for p, m, q in f.neighbours(n) if f.node_type[m] == NodeType.SWITCH)
    return n, p, f.names[m], q


class Rig:
    """A FabricManager on an emulated fabric, swept, and an app around it."""

    def __init__(self, fabric: Fabric, config: ApiConfig | None = None) -> None:
        self.fabric = fabric
        self.emulator = EmulatedFabric(fabric)
        self.transport = EmulatedTransport(self.emulator)
        self.manager = FabricManager(self.transport)
        self.config = config
        self.client: TestClient | None = None

    async def __aenter__(self) -> Rig:
        await self.manager.heavy_sweep()
        self.client = TestClient(TestServer(create_app(self.manager, self.config)))
        await self.client.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.close()
        await self.transport.close()

    async def view(self, **params: str) -> dict[str, Any]:
        assert self.client is not None
        resp = await self.client.get("/api/v1/view/fabric", params=params)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        FabricView.model_validate(body)
        return body


def _pair(body: dict[str, Any], link: dict[str, Any]) -> set[str]:
    return {body["switches"][link["a"]]["name"], body["switches"][link["b"]]["name"]}


# -- the JSON ----------------------------------------------------------------------------------------------------


async def test_view_draws_every_switch_by_tier_and_the_pulled_cable() -> None:
    f = fattree(2, 8)
    async with Rig(f) as rig:
        body = await rig.view()
        assert body["down_total"] == 0 and not [x for x in body["links"] if x["down"]]
        leaf, port, spine, sport = _uplink(f, "leaf-00")
        rig.emulator.link_down(leaf, port)
        await rig.manager.heavy_sweep()
        body = await rig.view()
    names = sorted(f.names[n] for n in f.switches.tolist())
    assert sorted(s["name"] for s in body["switches"]) == names
    assert [(t["name"], t["switches"], t["drawn"], t["hosts"]) for t in body["tiers"]] == [
        ("leaves", 8, 8, 32), ("spines", 4, 4, 0)]
    assert all(s["hosts"] == 4 for s in body["switches"] if s["rank"] == 0)
    assert body["counts"] == {"switches": 12, "hosts": 32, "links_up": 63, "links_down": 1}
    down = [x for x in body["links"] if x["down"]]
    assert len(down) == 1 and _pair(body, down[0]) == {"leaf-00", spine}
    assert down[0]["state"] == "down" and down[0]["utilization"] is None
    assert len(body["links"]) == 32  # every leaf-spine pair, the pulled one included
    (d,) = body["down_links"]
    assert d["source"] == "event" and d["since"] is not None
    assert {d["a"]["node"], d["b"]["node"]} == {"leaf-00", spine}
    assert {d["a"]["port"], d["b"]["port"]} == {port, sport}
    u = body["utilization"]
    assert u["source"] == "predicted" and u["pattern"] == "shift:1" and 0 < u["max"] <= 1
    assert all(x["utilization"] is not None for x in body["links"] if not x["down"])
    by_name = {s["name"]: s for s in body["switches"]}
    assert by_name["leaf-00"]["ports_down"] == 1 and by_name["leaf-01"]["ports_down"] == 0


async def test_a_cable_back_up_is_no_longer_down() -> None:
    f = fattree(2, 4)
    async with Rig(f) as rig:
        leaf, port, _, _ = _uplink(f, "leaf-00")
        rig.emulator.link_down(leaf, port)
        await rig.manager.heavy_sweep()
        assert (await rig.view())["down_total"] == 1
        rig.emulator.link_up(leaf, port)
        await rig.manager.heavy_sweep()
        body = await rig.view()
    assert body["down_total"] == 0 and not body["down_links"]
    assert not [x for x in body["links"] if x["down"]]


async def test_a_host_cable_down_is_counted_on_its_leaf() -> None:
    f = fattree(2, 4)
    async with Rig(f) as rig:
        leaf = f.by_name("leaf-01")
        p, host, _ = next((p, m, q) for p, m, q in f.neighbours(leaf) if f.node_type[m] == NodeType.CA)
        rig.emulator.link_down(leaf, p)
        await rig.manager.heavy_sweep()
        body = await rig.view()
    (d,) = body["down_links"]
    assert f.names[host] in (d["a"]["node"], d["b"]["node"])
    s = next(s for s in body["switches"] if s["name"] == "leaf-01")
    assert s["hosts_down"] == 1 and s["hosts"] == 1  # radix 4: two hosts a leaf, one left
    assert not [x for x in body["links"] if x["down"]]


async def test_a_cable_missing_from_the_start_comes_from_the_expected_topology(tmp_path: Path) -> None:
    design = fattree(2, 4)
    net = tmp_path / "design.net"
    net.write_text(format_net(design))
    f = fattree(2, 4)
    leaf, port, spine, _ = _uplink(f, "leaf-00")
    f.link_down(leaf, port)  # down before the SM ever saw it: no event
    async with Rig(f, ApiConfig(expected_topology=net)) as rig:
        body = await rig.view()
    (d,) = body["down_links"]
    assert d["source"] == "expected" and d["since"] is None
    assert {d["a"]["node"], d["b"]["node"]} == {"leaf-00", spine}
    down = [x for x in body["links"] if x["down"]]
    assert len(down) == 1 and _pair(body, down[0]) == {"leaf-00", spine} and down[0]["cables"] == 1


async def test_the_drawing_is_capped_and_keeps_the_ends_of_down_cables() -> None:
    f = fattree(3, 8)  # 32 leaves, 32 aggregation switches, 16 cores
    async with Rig(f) as rig:
        names = sorted(f.names[n] for n in f.switches.tolist())
        last_leaf = max(n for n in names if n.startswith("leaf"))
        leaf, port, agg, _ = _uplink(f, last_leaf)
        rig.emulator.link_down(leaf, port)
        await rig.manager.heavy_sweep()
        body = await rig.view(max_switches="20")
        full = await rig.view()
    tiers = {t["name"]: t for t in body["tiers"]}
    assert [tiers[k]["switches"] for k in ("leaves", "spines", "cores")] == [32, 32, 16]
    assert sum(t["drawn"] for t in body["tiers"]) == len(body["switches"]) <= 22
    drawn = {s["name"] for s in body["switches"]}
    assert {last_leaf, agg} <= drawn  # the ends of the down cable, though last in name order
    assert [x for x in body["links"] if x["down"] and _pair(body, x) == {last_leaf, agg}]
    assert body["links_not_drawn"] > 0
    assert all(x["a"] < x["b"] for x in body["links"])
    assert len(full["switches"]) == 80 and full["links_not_drawn"] == 0 and MAX_SWITCHES_DEFAULT >= 80


async def test_parameters_and_before_the_first_sweep() -> None:
    f = fattree(2, 4)
    async with Rig(f) as rig:
        c = rig.client
        assert c is not None
        for params in ({"max_switches": "0"}, {"max_switches": "x"}, {"bogus": "1"}, {"pattern": "nope"}):
            resp = await c.get("/api/v1/view/fabric", params=params)
            assert resp.status == 400, params
        # a pattern the fabric cannot serve leaves the links without a colour rather than failing
        body = await rig.view(pattern="shift:8")
        assert body["utilization"]["source"] == "none" and body["utilization"]["max"] is None
    app = create_app(_NoSnapshot())
    c = TestClient(TestServer(app))
    await c.start_server()
    try:
        resp = await c.get("/api/v1/view/fabric")
        assert resp.status == 503 and resp.headers["Retry-After"]
        resp = await c.get("/")
        assert resp.status == 200  # the page itself says it waits
    finally:
        await c.close()


class _NoSnapshot:
    snapshot = None
    events = EventBus()

    @property
    def config(self) -> Any:
        from sm.sweep.manager import SmConfig

        return SmConfig()

    def request_sweep(self, reason: str, *, heavy: bool = False) -> None:
        pass

    def set_partitions(self, partitions: Any) -> None:
        pass


async def test_page_and_script_are_served_from_package_data() -> None:
    async with Rig(fattree(2, 4)) as rig:
        c = rig.client
        assert c is not None
        resp = await c.get("/")
        assert resp.status == 200 and resp.content_type == "text/html"
        assert await resp.read() == asset("index.html")
        csp = resp.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert (await c.get("/", params={"refresh": "2", "max_switches": "100"})).status == 200
        for params in ({"refresh": "0"}, {"nope": "1"}):
            assert (await c.get("/", params=params)).status == 400
        resp = await c.get("/ui/fabric.js")
        assert resp.status == 200 and resp.content_type == "text/javascript"
        assert b"api/v1/view/fabric" in await resp.read()
        resp = await c.get("/api/v1/view/fabric", headers={"Accept-Encoding": "gzip"})
        assert resp.status == 200 and resp.headers.get("Content-Encoding") == "gzip"
    assert b'src="ui/fabric.js"' in asset("index.html")
    doc = build_openapi()
    assert "/api/v1/view/fabric" in doc["paths"]


# -- the page in a browser ---------------------------------------------------------------------------------------


class _Dom(HTMLParser):
    """Elements of the rendered DOM: (tag, attributes) and the text of the elements of interest."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, str] = {}
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a))
        self._in.append(a.get("id", ""))

    def handle_endtag(self, tag: str) -> None:
        if self._in:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        for ident in self._in:
            if ident:
                self.text[ident] = self.text.get(ident, "") + data

    def with_class(self, cls: str) -> list[dict[str, str]]:
        return [a for _, a in self.elements if cls in a.get("class", "").split()]


def png_pixels(path: Path) -> np.ndarray:
    """An 8-bit RGB or RGBA PNG (not interlaced) as a ``(height, width, channels)`` array: stdlib and numpy."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, bytearray(), None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    assert head is not None
    w, h, depth, ctype, _, _, interlace = head
    assert depth == 8 and ctype in (2, 6) and interlace == 0, head
    bpp = 3 if ctype == 2 else 4
    stride = w * bpp
    raw = zlib.decompress(bytes(idat))
    assert len(raw) == h * (stride + 1)
    out = np.zeros((h, stride), np.uint8)
    prev = np.zeros(stride, np.int64)
    for y in range(h):
        kind = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int64)
        if kind == 0:
            cur = line
        elif kind == 1:  # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(w, bpp), axis=0).reshape(-1) & 0xFF
        elif kind == 2:  # Up
            cur = (line + prev) & 0xFF
        else:  # Average, Paeth: each byte needs the one before it
            row = line.tolist()
            up = prev.tolist()
            for i in range(stride):
                left = row[i - bpp] if i >= bpp else 0
                if kind == 3:
                    row[i] = (row[i] + ((left + up[i]) >> 1)) & 0xFF
                else:
                    ul = up[i - bpp] if i >= bpp else 0
                    p = left + up[i] - ul
                    pa, pb, pc = abs(p - left), abs(p - up[i]), abs(p - ul)
                    pred = left if pa <= pb and pa <= pc else up[i] if pb <= pc else ul
                    row[i] = (row[i] + pred) & 0xFF
            cur = np.asarray(row, np.int64)
        out[y] = cur
        prev = cur
    return out.reshape(h, w, bpp)


_CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
    "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--mute-audio",
)


async def run_chromium(chromium: str, url: str, profile: Path, *extra: str, timeout: float = 90.0) -> bytes:
    """Run headless chromium on ``url`` with a fresh profile; its stdout. Its whole process group is killed at
    the end, whatever happens."""
    proc = await asyncio.create_subprocess_exec(
        chromium, *_CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await proc.wait()
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    return out


@contextlib.asynccontextmanager
async def demo_daemon(overrides: dict[str, str]) -> AsyncIterator[tuple[Any, str]]:
    """The daemon (``ibfm serve``'s Service) in this event loop on a free port, until the block ends."""
    from ibfm.service import Service
    from ibfm.settings import load_settings

    settings = load_settings(None, {"listen": "127.0.0.1:0", "perfmgr.interval": "0.5",
                                    "fabric.traffic": "shift:1@0.5", **overrides})
    svc = Service(settings)
    stop = asyncio.Event()
    started: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(svc.run(stop, started=started.set_result))
    try:
        host, port = await asyncio.wait_for(asyncio.shield(started), 60)
        yield svc, f"http://{host}:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def _until(session: ClientSession, url: str, ok: Any, timeout: float = 30.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while loop.time() < deadline:
        async with session.get(url) as r:
            last = (r.status, await r.text())
        if last[0] == 200 and ok(body := json.loads(last[1])):
            return body
        await asyncio.sleep(0.2)
    raise AssertionError(f"{url}: not as wanted within {timeout} s: {last}")


async def test_page_in_headless_chromium(tmp_path: Path) -> None:
    chromium = need_tool("chromium", "/usr/bin/chromium")
    async with demo_daemon({}) as (svc, base), ClientSession() as s:
        await _until(s, base + "/api/v1/health", lambda b: b.get("state") == "up")
        f = svc.emulator.fabric
        leaf, port, spine, _ = _uplink(f, "leaf-00")
        svc.emulator.link_down(leaf, port)  # the leaf traps, the SM sweeps, the cable is gone from the snapshot
        view = await _until(s, base + "/api/v1/view/fabric",
                            lambda b: b["down_total"] == 1 and b["utilization"]["source"] == "measured")
        switches = sorted(f.names[n] for n in f.switches.tolist())
        url = base + "/?refresh=2"
        dom_html = await run_chromium(chromium, url, tmp_path / "profile-dom", "--virtual-time-budget=5000",
                                      "--dump-dom")
        shot = tmp_path / "fabric.png"
        await run_chromium(chromium, url, tmp_path / "profile-shot", "--virtual-time-budget=5000",
                           "--window-size=1280,800", f"--screenshot={shot}")
    (tmp_path / "fabric.html").write_bytes(dom_html)
    dom = _Dom()
    dom.feed(dom_html.decode())
    # one element per switch, named, as many as the fabric has
    drawn = sorted(a["data-name"] for a in dom.with_class("switch"))
    assert drawn == switches == sorted(x["name"] for x in view["switches"])
    # the pulled cable is drawn, and marked down; no other link is
    links = dom.with_class("link")
    assert len(links) == len(view["links"]) == 32
    down = [a for a in links if "down" in a["class"].split()]
    assert [{a["data-a"], a["data-b"]} for a in down] == [{"leaf-00", spine}]
    assert all(a.get("stroke", "").startswith("rgb(") for a in links if a not in down)  # coloured by utilization
    assert len(dom.with_class("hosts")) == 8
    # the health panel filled in, the problem listed
    assert dom.text.get("state") == "up"
    assert "leaf-00[" in dom.text.get("problems", "") and "down since" in dom.text["problems"]
    assert "measured from counters" in dom.text.get("note", "")
    # the screenshot: a PNG of the window's size, with a drawing in it
    px = png_pixels(shot)
    assert px.shape[:2] == (800, 1280)
    rgb = px[..., :3].reshape(-1, 3)
    colours, counts = np.unique(rgb, axis=0, return_counts=True)
    assert len(colours) > 50 and counts.max() < 0.9 * rgb.shape[0], (len(colours), counts.max())
    red = (np.abs(rgb.astype(np.int64) - (215, 25, 28)).sum(axis=1) < 60).sum()  # the dashed down link, the legend
    assert red > 50
