"""``ibfm status``, ``links``, ``errors``, ``hot``: the client commands against a daemon on the emulated fabric.

The daemon is ``ibfm serve``'s :class:`~ibfm.service.Service` in this process (radix-4 fat-tree, PerfManager
every 0.2 s, hosts sending half their link rate); the commands run in a worker thread, as from a shell.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fabric.emulator import Counter, EmulatedFabric
from fabric.model import Width
from ibfm.cli import main
from ibfm.commands.client import format_status, problems, table
from ibfm.service import Service
from ibfm.settings import load_settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("IBFM_"):
            monkeypatch.delenv(k)


class Daemon:
    def __init__(self, svc: Service, url: str) -> None:
        self.svc = svc
        self.url = url

    async def run(self, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
        """``ibfm ARGV --url URL``: exit status, stdout, stderr."""
        capsys.readouterr()
        rc = await asyncio.to_thread(main, [*argv, "--url", self.url])
        out, err = capsys.readouterr()
        return rc, out, err

    async def counter_sweeps(self, n: int) -> None:
        """Wait for ``n`` more PerfManager sweeps."""
        pm = self.svc.perfmgr
        target = pm.sweeps + n
        await until(lambda: pm.sweeps >= target, 10)


async def until(ok: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.fixture
async def daemon() -> AsyncIterator[Daemon]:
    settings = load_settings(None, {
        "listen": "127.0.0.1:0", "perfmgr.interval": "0.2", "fabric.fattree_radix": "4",
        "fabric.traffic": "shift:1@0.5", "congestion.pattern": "shift:1", "sm.sweep_interval": "0.5",
    })
    svc = Service(settings)
    # leaf-00's host link on port 1 trained at 1x, below the 4x both ends support
    assert svc.emulator is not None
    f = svc.emulator.fabric
    leaf = f.by_name("leaf-00")
    host, hp = int(f.peer_node[leaf, 1]), int(f.peer_port[leaf, 1])
    f.width_active[leaf, 1] = f.width_active[host, hp] = int(Width.X1)
    for n, p in ((leaf, 1), (host, hp)):  # the emulator answers PortInfo from a cache (it has no call for this)
        svc.emulator._forget_port_info(n, p)
    stop = asyncio.Event()
    started: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(svc.run(stop, started=started.set_result))
    try:
        addr, port = await asyncio.wait_for(started, 10)
        d = Daemon(svc, f"http://{addr}:{port}")
        await until(lambda: svc.manager.snapshot is not None and svc.perfmgr.fabric is svc.manager.snapshot.fabric,
                    20)
        await d.counter_sweeps(2)  # rates measured
        yield d
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


# -- status -----------------------------------------------------------------------------------------------


async def test_status_table_and_json(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = await daemon.run(capsys, "status")
    assert rc == 0 and not err
    lines = out.splitlines()
    assert lines[0] == "subnet: UP"
    assert lines[1].startswith("SM: master, host-00000[1] LID 1")
    assert lines[2].startswith("master: GUID 0x") and lines[2].endswith("LID 1")
    assert lines[3].startswith("last sweep: ") and " UTC (" in lines[3] and " took " in lines[3]
    assert lines[4] == "engine: ftree (chain ftree,layered,updn,minhop)"
    assert lines[5].startswith("fabric: 14 nodes (6 switches, 8 CAs), 16 links (8 between switches), 14 LIDs")
    assert any(x.startswith("counters: ") for x in lines) and lines[-1] == "problems: none"
    rc, out, _ = await daemon.run(capsys, "status", "--json")
    h = json.loads(out)
    assert rc == 0 and h["state"] == "up" and h["fabric"]["switches"] == 6 and h["routing"]["engine"] == "ftree"


def test_status_lists_problems() -> None:
    h = {
        "state": "degraded", "subnet_up": False,
        "sm": {"node": "host-00000", "port": 1, "lid": 1, "state": "master", "guid": "0x1", "master_guid": "0x1",
               "master_lid": 1, "priority": 0},
        "sweep": {"number": 3, "time": 1000.0, "duration_s": 0.5, "up_s": 0.4, "smps": 10,
                  "last_failure": {"stage": "program", "reason": "sweep 2: program failed: boom", "time": 999.0}},
        "fabric": {"switches": 2, "cas": 4, "links": 5, "switch_links": 1},
        "routing": {"engine": "updn", "chain": ["ftree", "updn"],
                    "refused": [{"engine": "ftree", "reason": "topology is not a fat-tree"}]},
        "verify": {"pairs": 30, "unreachable": 2, "failures": ["a -> b: LFT entry 255 at sw"]},
        "credit_loops": [], "lids": {"assigned": 6, "warnings": []},
        "program": {"failures": ["sw: LFT block 0 Set failed: timeout"]}, "discovery_errors": [], "perfmgr": None,
    }
    found = problems(h)
    assert found[0] == "last sweep failed in program: sweep 2: program failed: boom"
    assert "2 of 30 (source, LID) pairs have no route" in found
    assert "routing: ftree refused: topology is not a fat-tree" in found
    text = format_status(h, now=1012.0)
    assert "subnet: DEGRADED" in text and "(12 s ago)" in text and f"problems: {len(found)}" in text


# -- links ------------------------------------------------------------------------------------------------


async def test_links_flags_the_link_below_capability(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = await daemon.run(capsys, "links")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["A", "B", "WIDTH", "SPEED", "GB/S", "SUPPORTED", "STATE", "PHYS", "BELOW",
                                "CAPABILITY"]
    assert len(lines) == 1 + 16 + 1 and lines[-1].startswith("16 links; 1 of the fabric's below")
    slow = [x for x in lines if "leaf-00[1]" in x]
    assert len(slow) == 1 and " 1x " in slow[0] and "4x NDR" in slow[0] and "width 1x of 4x" in slow[0]
    rc, out, _ = await daemon.run(capsys, "links", "--degraded")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 3 and "leaf-00[1]" in lines[1] and lines[2].startswith("1 link;")
    rc, out, _ = await daemon.run(capsys, "links", "--degraded", "--json")
    body = json.loads(out)
    assert body["total"] == 1 and body["degraded"] == 1
    (link,) = body["items"]
    assert link["degraded"] and link["width"] == "1x" and link["supported_width"] == "4x"
    assert link["rate_gbps"] == 100.0 and link["supported_gbps"] == 400.0 and link["why"] == "width 1x of 4x"
    rc, out, _ = await daemon.run(capsys, "links", "--node", "spine-00", "--json")
    assert len(json.loads(out)["items"]) == 4


# -- errors -----------------------------------------------------------------------------------------------


async def test_errors_lists_the_ports_whose_counters_moved(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = await daemon.run(capsys, "errors", "--json")
    assert rc == 0 and json.loads(out)["counting"] and json.loads(out)["total"] == 0
    emu = daemon.svc.emulator
    assert emu is not None
    leaf = emu.fabric.by_name("leaf-01")
    emu.add_counter(leaf, 3, Counter.SYMBOL_ERROR, 40)
    emu.add_counter(leaf, 3, Counter.LINK_DOWNED, 1)
    emu.add_counter(leaf, 4, Counter.RCV_ERRORS, 5)
    await daemon.counter_sweeps(2)
    emu.add_counter(leaf, 3, Counter.SYMBOL_ERROR, 60)
    await daemon.counter_sweeps(2)
    rc, out, _ = await daemon.run(capsys, "errors", "--json")
    body = json.loads(out)
    assert rc == 0 and body["total"] == 2 and body["interval_s"] > 0
    first, second = body["items"]  # the fastest first
    assert (first["node"], first["port"], first["moving"]) == ("leaf-01", 3, True)
    assert first["counters"] == {"symbol_errors": 100, "link_downed": 1}
    assert first["rates"]["symbol_errors"] == pytest.approx(100 / body["interval_s"], rel=0.01)
    assert first["rates"]["link_downed"] > 0 and first["peer"]["node"].startswith("spine-")
    assert (second["port"], second["moving"], second["counters"]) == (4, True, {"rcv_errors": 5})
    rc, out, _ = await daemon.run(capsys, "errors")
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith("2 ports with error counts; rates over ")
    assert lines[1].split() == ["PORT", "PEER", "COUNTER", "TOTAL", "PER", "S"]
    assert lines[2].startswith("*") and "leaf-01[3]" in lines[2] and "symbol_errors" in lines[2]
    assert "link_downed" in lines[3] and "leaf-01[3]" not in lines[3]  # the port named once
    assert "leaf-01[4]" in lines[4] and "rcv_errors" in lines[4]
    rc, out, _ = await daemon.run(capsys, "errors", "--node", "leaf-00", "--json")
    assert json.loads(out)["total"] == 0


# -- hot --------------------------------------------------------------------------------------------------


async def test_hot_measured_and_predicted(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = await daemon.run(capsys, "hot", "--json", "--top", "3", "--pattern", "shift:1")
    body = json.loads(out)
    assert rc == 0 and body["measured"] and body["predicted"] and body["pattern"] == "shift:1"
    assert len(body["items"]) == 3
    utils = [x["measured_utilization"] for x in body["items"]]
    assert utils == sorted(utils, reverse=True) and utils[0] > 0.3
    assert all(x["predicted_utilization"] is not None for x in body["items"])
    rc, out, _ = await daemon.run(capsys, "hot", "--top", "2", "--pattern", "shift:1", "--by-predicted")
    lines = out.splitlines()
    assert rc == 0 and lines[0].startswith("busiest ports by predicted utilization: measured over ")
    assert "predicted for shift:1" in lines[0] and len(lines) == 4
    assert lines[1].split()[:4] == ["SRC", "DST", "GB/S", "SENT"] and lines[2].rstrip().endswith("0")
    rc, out, _ = await daemon.run(capsys, "hot", "--json")
    assert json.loads(out)["pattern"] is None or json.loads(out)["predicted"]  # the daemon's own, if it tells


# -- failures ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("command", ["status", "links", "errors", "hot"])
def test_unreachable_daemon_is_one_line_and_exit_2(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    assert main([command, "--url", url]) == 2
    out, err = capsys.readouterr()
    assert not out
    assert err == f"ibfm: error: cannot reach the ibfm daemon at {url}: Connection refused (is `ibfm serve` " \
        "running? --url or $IBFM_URL say where)\n"


def test_url_from_the_environment(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("IBFM_URL", url)
    assert main(["status"]) == 2
    assert f"at {url}:" in capsys.readouterr().err


async def test_an_error_answer_is_one_line_and_exit_2(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = await daemon.run(capsys, "links", "--node", "no-such-node")
    assert rc == 2 and not out
    assert err == f"ibfm: error: the daemon at {daemon.url} answered 404 not_found: node: no node named " \
        "'no-such-node'\n"


async def test_not_an_ibfm_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<html>hi</html>")

    app = web.Application()
    app.router.add_get("/api/v1/health", page)
    async with TestServer(app) as server:
        url = str(server.make_url("/")).rstrip("/")
        rc = await asyncio.to_thread(main, ["status", "--url", url])
        rc2 = await asyncio.to_thread(main, ["links", "--url", url])
    err = capsys.readouterr().err.splitlines()
    assert rc == rc2 == 2
    assert err[0] == f"ibfm: error: {url}/api/v1/health: the answer is not JSON (is {url} an ibfm daemon?)"
    assert err[1] == f"ibfm: error: the daemon at {url} answered 404 Not Found (is it an ibfm daemon?)"


# -- the command line ---------------------------------------------------------------------------------------


def test_client_commands_import_only_their_module() -> None:
    code = ("import sys; from ibfm.cli import build_parser; build_parser('status'); "
            "print(sorted(m for m in sys.modules if m.startswith(('ibfm.commands.', 'aiohttp', 'sm.', 'pydantic'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == ["ibfm.commands.client"]


def test_table_pads_and_aligns() -> None:
    text = table(["A", "NUM"], [["x", 1], ["long", 22]], right=(1,))
    assert text.splitlines() == ["A     NUM", "x       1", "long   22"]


# -- the error rates over time (a PerfManager played by hand) ------------------------------------------------


class Counters:
    """A CounterSource whose totals and sweeps the test sets."""

    def __init__(self, fabric: Any) -> None:
        from exporters.http.admin import ERROR_KEYS

        self.fabric = fabric
        self.totals = {k: np.zeros(fabric.port_exists.shape, np.uint64) for k in ERROR_KEYS}
        self.rates: dict[str, Any] = {}
        self.sweeps = 0
        self.last_sweep_time = 0.0
        self.last_report = None

    def sweep(self, at: float) -> None:
        self.sweeps += 1
        self.last_sweep_time = at


async def test_error_rates_span_the_last_minute() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from exporters.http.app import create_app
    from fabric.generate import fattree
    from sm.sweep.manager import FabricManager
    from sm.transport.emulated import EmulatedTransport
    from tests.test_http_api import Recorder

    transport = EmulatedTransport(EmulatedFabric(fattree(2, 4)))
    try:
        snap = await FabricManager(transport).heavy_sweep()
    finally:
        await transport.close()
    perf = Counters(snap.fabric)
    client = TestClient(TestServer(create_app(Recorder(snap), perfmgr=perf)))
    await client.start_server()
    try:

        async def errors() -> dict[str, Any]:
            resp = await client.get("/api/v1/errors")
            assert resp.status == 200
            body: dict[str, Any] = await resp.json()
            return body

        assert (await errors())["counting"] is False  # no counter sweep yet
        perf.sweep(100.0)
        body = await errors()
        assert body["counting"] and body["total"] == 0 and body["interval_s"] is None
        n = snap.fabric.by_name("leaf-02")
        perf.totals["symbol_errors"][n, 2] = 10
        perf.sweep(110.0)
        body = await errors()
        (port,) = body["items"]
        assert body["interval_s"] == 10.0 and (port["node"], port["port"], port["moving"]) == ("leaf-02", 2, True)
        assert port["counters"] == {"symbol_errors": 10} and port["rates"] == {"symbol_errors": 1.0}
        perf.sweep(200.0)  # nothing more: after a quiet minute the port no longer moves
        body = await errors()
        (port,) = body["items"]
        assert body["interval_s"] == 90.0 and port["moving"] is False and port["rates"] == {"symbol_errors": 0.0}
    finally:
        await client.close()
