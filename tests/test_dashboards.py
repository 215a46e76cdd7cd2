"""Grafana dashboards: generated JSON in step with the sources, known metric names, and every query run
through a real Prometheus scraping ibfm's /metrics on an emulated fabric."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from dashboards import build
from dashboards.common import DATASOURCE_UID
from exporters import metrics as M
from exporters.prometheus import MetricsInputs, MetricsRenderer, PortPrediction, SweepStats, metrics_handler
from fabric.emulator import ConstantTraffic, Counter, EmulatedFabric
from fabric.generate import fattree
from fabric.model import NO_PEER, PortState, link_bytes_per_s
from sm.perf.perfmgr import PerfManager
from sm.sweep.manager import FabricManager, SubnetSnapshot
from sm.transport.emulated import EmulatedTransport
from tests.conftest import free_port, need_tool, stop_process

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"

# -- the JSON and the queries in it ---------------------------------------------------------------------------


def dashboards_json() -> dict[str, dict[str, Any]]:
    return {name: json.loads(text) for name, text in build.generate().items()}


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def queries(d: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) of every panel target."""
    for p in panels(d):
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def variables(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in d["templating"]["list"] if v["type"] == "query"]


PROMQL_FUNCTIONS = {
    "abs", "avg", "bottomk", "ceil", "count", "count_over_time", "delta", "deriv", "floor", "histogram_quantile",
    "increase", "irate", "label_replace", "max", "max_over_time", "min", "min_over_time", "rate", "round",
    "sort", "sort_desc", "sum", "sum_over_time", "time", "topk", "vector", "clamp_min", "clamp_max", "avg_over_time",
}
PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\{([^}]*)\}")
_MATCHER = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*\"(?:[^\"\\]|\\.)*\"\s*")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_NUMBER = re.compile(r"(?<![a-zA-Z_:0-9])\d+(?:\.\d+)?(?:e[+-]?\d+)?")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def labels_of(sample: str) -> set[str]:
    base = sample
    for suffix in ("_bucket", "_sum", "_count"):
        if sample.endswith(suffix) and sample.removesuffix(suffix) in M.BY_NAME:
            base = sample.removesuffix(suffix)
    m = M.BY_NAME[base]
    return set(m.labels) | ({"le"} if sample.endswith("_bucket") else set())


def check_expr(expr: str) -> list[str]:
    """Problems of one PromQL query: unknown metrics, functions, or labels a metric does not have."""
    problems: list[str] = []
    known = M.sample_names()
    used: set[str] = set()
    for name, body in _SELECTOR.findall(expr):
        if not name:
            problems.append(f"selector without a metric name: {{{body}}}")
            continue
        if name not in known:
            continue  # reported below
        used.add(name)
        rest = _MATCHER.sub("", body.replace(",", " ")).strip()
        if rest:
            problems.append(f"cannot parse matchers {body!r}")
        for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body):
            if label not in labels_of(name):
                problems.append(f"{name} has no label {label!r}")
    text = re.sub(r"\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?", " ", _STRING.sub('""', expr))
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    groupings = _GROUPING.findall(text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    for tok in _IDENT.finditer(text):
        word = tok.group()
        after = text[tok.end() :].lstrip()
        if after.startswith("("):
            if word not in PROMQL_FUNCTIONS and word not in PROMQL_KEYWORDS:
                problems.append(f"unknown function {word}()")
        elif word in PROMQL_KEYWORDS:
            continue
        elif word not in known:
            problems.append(f"unknown metric {word}")
        else:
            used.add(word)
    for _, group in groupings:
        for label in (x.strip() for x in group.split(",") if x.strip()):
            if not any(label in labels_of(n) for n in used):
                problems.append(f"grouping label {label!r} is on none of {sorted(used)}")
    if not used:
        problems.append("uses no ibfm metric")
    return problems


_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$")


def test_generated_json_matches_the_sources() -> None:
    diff = build.differences()
    assert not diff, "stale dashboards (run: python -m dashboards.build):\n" + "\n".join(diff)
    assert len(build.sources()) == 3
    for d in dashboards_json().values():
        assert d["uid"].startswith("ibfm-")
        assert {v["name"] for v in d["templating"]["list"]} >= {"datasource"}


def test_check_exits_1_when_the_json_is_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "generated"
    assert build.main(["--out", str(out)]) == 0
    assert build.main(["--check", "--out", str(out)]) == 0
    victim = out / "congestion.json"
    d = json.loads(victim.read_text())
    d["title"] = "edited by hand"
    victim.write_text(json.dumps(d, sort_keys=True, indent=2) + "\n")
    assert build.main(["--check", "--out", str(out)]) == 1
    assert "congestion.json: differs" in capsys.readouterr().err
    victim.unlink()
    (out / "old.json").write_text("{}\n")
    assert build.main(["--check", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "congestion.json: missing" in err and "old.json: no source makes it" in err
    assert build.main(["--out", str(out)]) == 0
    assert not (out / "old.json").exists()
    assert build.main(["--check", "--out", str(out)]) == 0


def test_a_broken_source_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.dashboard.py").write_text("dashboard = 42\n")
    assert build.main(["--src", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "bad.dashboard.py: exports no grafanalib Dashboard" in capsys.readouterr().err


def test_every_query_uses_known_metric_names() -> None:
    seen: set[str] = set()
    for name, d in dashboards_json().items():
        for title, expr in queries(d):
            problems = check_expr(expr)
            assert not problems, f"{name} / {title}: {expr}\n" + "\n".join(problems)
            seen.update(w for w in _IDENT.findall(expr) if w in M.sample_names())
        for v in variables(d):
            m = _LABEL_VALUES.match(v["query"])
            assert m, v["query"]
            assert not check_expr(m.group(1)), v["query"]
            metric = _SELECTOR.match(m.group(1))
            assert metric is not None and m.group(2) in labels_of(metric.group(1))
    # the dashboards show every per-port counter and the subnet figures
    for metric in M.PORT_COUNTERS + M.PORT_PREDICTED + M.PORT_INFO_GAUGES + M.DEVICE_METRICS:
        assert metric.name in seen, f"no panel shows {metric.name}"


def test_the_query_checker_catches_mistakes() -> None:
    assert check_expr("rate(ibfm_port_transmit_data_bytes_total[$__rate_interval])") == []
    assert check_expr("ibfm_port_transmit_data_bytes[5m]")  # no _total
    assert check_expr('ibfm_port_state{switch="x"}')  # no such label
    assert check_expr("sum by (nope) (ibfm_port_state)")
    assert check_expr("frobnicate(ibfm_port_state)")
    assert check_expr("1 + 2")


def test_provisioning_points_at_the_generated_dashboards() -> None:
    ds = (DASHBOARDS / "provisioning" / "datasources" / "ibfm.yaml").read_text()
    assert re.search(rf"^\s+uid: {re.escape(DATASOURCE_UID)}$", ds, re.M)
    assert re.search(r"^\s+type: prometheus$", ds, re.M)
    prov = (DASHBOARDS / "provisioning" / "dashboards" / "ibfm.yaml").read_text()
    path = re.search(r"^\s+path: (\S+)$", prov, re.M)
    assert path is not None and path.group(1).endswith("dashboards/generated")
    for d in dashboards_json().values():
        dsvar = next(v for v in d["templating"]["list"] if v["name"] == "datasource")
        assert dsvar["current"]["value"] == DATASOURCE_UID


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-shards.yml", "prometheus-paced.yml"])
def test_scrape_config_is_valid(name: str) -> None:
    promtool = need_tool("promtool")
    res = subprocess.run(
        [promtool, "check", "config", str(DASHBOARDS / name)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_shard_config_covers_every_shard_once() -> None:
    text = (DASHBOARDS / "prometheus-shards.yml").read_text()
    shards = re.findall(r'shard: \["(\d+)/(\d+)"\]', text)
    n = {int(b) for _, b in shards}
    assert len(n) == 1 and sorted(int(a) for a, _ in shards) == list(range(n.pop()))


def test_paced_config_scrapes_every_group_once() -> None:
    """The two-pace configuration: every family group in exactly one job, the traffic job the often one."""
    text = (DASHBOARDS / "prometheus-paced.yml").read_text()
    jobs = re.findall(r"job_name: (\S+)\n    scrape_interval: (\d+)s\n(?:.*\n)*?      collect\[\]: \[([^\]]*)\]", text)
    groups = {job: ([g.strip() for g in listed.split(",")], int(every)) for job, every, listed in jobs}
    named = [g for gs, _ in groups.values() for g in gs]
    assert sorted(named) == sorted(M.GROUPS) and len(named) == len(set(named)), groups
    often = min(groups.values(), key=lambda v: v[1])[0]
    assert "port_traffic" in often and "port_errors" not in often


def test_per_port_panels_name_ports_through_the_info_series() -> None:
    """Per-port series carry only guid and port: a legend or table naming ports must join ibfm_port_info."""
    port_metrics = {m.name for m in M.PORT_COUNTERS + M.PORT_INFO_GAUGES + M.PORT_PREDICTED}
    for name, d in dashboards_json().items():
        for p in panels(d):
            for t in p.get("targets", []):
                expr, legend = t["expr"], t.get("legendFormat") or ""
                if any(w in port_metrics for w in _IDENT.findall(expr)) and ("{{name}}" in legend or t["instant"]):
                    assert "group_left(" in expr and M.PORT_INFO.name in expr, (name, p["title"], expr)


# -- a real Prometheus ---------------------------------------------------------------------------------------------



TRAFFIC = ConstantTraffic(bytes_per_s=2e9, xmit_wait_per_s=5000.0)


def traffic_prediction(snap: SubnetSnapshot) -> PortPrediction:
    """What a fluid model predicts for constant traffic: every live port sends TRAFFIC's rate.

    The fluid model's answer for this load, computed directly: exact for constant traffic.
    """
    f = snap.fabric
    rate = link_bytes_per_s(f.width_active, f.speed_active)
    live = (f.state == PortState.ACTIVE) & (f.peer_node != NO_PEER) & (rate > 0)
    util = np.where(live, TRAFFIC.bytes_per_s / np.where(rate > 0, rate, 1.0), 0.0)
    wait = np.where(live, TRAFFIC.xmit_wait_per_s, 0.0)
    return PortPrediction(f, util, wait)


class LiveFabric(threading.Thread):
    """An emulated subnet run by the real FabricManager and PerfManager, with /metrics served by aiohttp.

    Counter sweeps every 0.25 s (after 0.25 s of emulated traffic), a heavy sweep
    every 2 s, a symbol error on one host port now and then.
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.port = 0
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # reported by the test
            self.error = e
            self.ready.set()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    async def _main(self) -> None:
        emu = EmulatedFabric(fattree(2, 4), traffic=TRAFFIC)
        transport = EmulatedTransport(emu, timeout=0.05, retries=1)
        mgr = FabricManager(transport)
        stats = SweepStats()
        snap = await mgr.heavy_sweep()
        stats.record(snap)
        pm = PerfManager(transport, clock=lambda: emu.time)
        pm.bind(snap)
        state: dict[str, Any] = {"snap": snap, "pred": traffic_prediction(snap)}
        renderer = MetricsRenderer(lambda: MetricsInputs(state["snap"], pm, state["pred"], stats))
        app = web.Application()
        app.router.add_get("/metrics", metrics_handler(renderer))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        host = int(emu.fabric.cas[1])
        self.ready.set()
        try:
            i = 0
            while not self._halt.is_set():
                emu.advance(0.25)
                if i % 3 == 0:
                    emu.add_counter(host, 1, Counter.SYMBOL_ERROR, 2)
                await pm.sweep()
                if i % 8 == 7:
                    t0 = time.perf_counter()
                    snap = await mgr.heavy_sweep()
                    stats.record(snap, time.perf_counter() - t0)
                    pm.bind(snap)
                    state["snap"], state["pred"] = snap, traffic_prediction(snap)
                i += 1
                await asyncio.sleep(0.25)
        finally:
            await runner.cleanup()


class Prometheus:
    """A prometheus server on a free port with a temporary TSDB, scraping one target every second."""

    def __init__(self, binary: str, workdir: Path, target: str) -> None:
        self.port = free_port()
        cfg = workdir / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            f"scrape_configs:\n  - job_name: ibfm\n    static_configs:\n      - targets: ['{target}']\n"
        )
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.logfile = workdir / "prometheus.log"

    def get(self, path: str, **params: str | list[str]) -> Any:
        q = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}?{q}", timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # a bad query: say which and why
            raise AssertionError(f"{path} {params}: HTTP {e.code}: {e.read().decode(errors='replace')}") from None

    def query(self, expr: str) -> list[dict[str, Any]]:
        res = self.get("/api/v1/query", query=expr)
        assert res["status"] == "success", (expr, res)
        data = res["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.logfile.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout} s: {self.logfile.read_text()[-2000:]}")

    def stop(self) -> None:
        stop_process(self.proc, grace=5)
        self.log.close()


@pytest.fixture
def live_fabric() -> Iterator[LiveFabric]:
    lf = LiveFabric()
    lf.start()
    assert lf.ready.wait(30), "live fabric did not come up"
    if lf.error is not None:
        raise lf.error
    yield lf
    lf.stop()
    if lf.error is not None:
        raise lf.error


def grafana_regex_escape(value: str) -> str:
    """How Grafana puts one picked value into a ``=~"..."`` matcher: regex characters behind ``\\``."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's part: variables and interval macros as a dashboard would send them."""
    out = expr.replace("$__rate_interval", "1m").replace("$__range", "1m").replace("$__interval", "1s")
    for k, v in values.items():
        out = out.replace(f"${{{k}}}", v).replace(f"${k}", v)
    return out


@pytest.mark.prometheus
def test_every_panel_query_returns_data_from_a_real_prometheus(tmp_path: Path, live_fabric: LiveFabric) -> None:
    binary = need_tool("prometheus")
    prom = Prometheus(binary, tmp_path, f"127.0.0.1:{live_fabric.port}")
    try:
        prom.wait_ready()
        # the first scrape waits for target discovery (~5 s); then enough samples for rate() and two heavy sweeps
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if prom.query(
                "count_over_time(ibfm_subnet_up[1m]) >= 5 and increase(ibfm_sweep_duration_seconds_count[1m]) >= 2"
            ):
                break
            time.sleep(0.5)
        else:
            targets = prom.get("/api/v1/targets")
            raise AssertionError(f"no data scraped: {targets} {prom.logfile.read_text()[-2000:]}")
        up = prom.query('up{job="ibfm"}')
        assert [float(r["value"][1]) for r in up] == [1.0]

        checked = 0
        for name, d in dashboards_json().items():
            values: dict[str, str] = {"datasource": DATASOURCE_UID}
            for v in variables(d):  # in order: "port" depends on "switch"
                m = _LABEL_VALUES.match(v["query"])
                assert m is not None
                match = substitute(m.group(1), values)
                res = prom.get(f"/api/v1/label/{m.group(2)}/values", **{"match[]": match})
                assert res["status"] == "success" and res["data"], (name, v["name"], match, res)
                values[v["name"]] = grafana_regex_escape(sorted(res["data"])[0])
            for title, expr in queries(d):
                q = substitute(expr, values)
                result = prom.query(q)
                assert result, f"{name} / {title}: no data for {q}"
                finite = [r for r in result if np.isfinite(float(r["value"][1]))]
                assert finite, f"{name} / {title}: only NaN/Inf for {q}: {result[:3]}"
                checked += 1
        assert checked >= 40
        # the figures are the fabric's: 16 links, 2e9 B/s on every live port, errors on one port
        assert float(prom.query('ibfm_links{state="active"}')[0]["value"][1]) == 16
        # transmit rate from the raw samples of the last 10 s (rate() over 1m would average in the empty start)
        windows = prom.query("ibfm_port_transmit_data_bytes_total[10s]")
        assert len(windows) == 32
        for w in windows:
            (t0, v0), (t1, v1) = w["values"][0], w["values"][-1]
            assert (float(v1) - float(v0)) / (t1 - t0) == pytest.approx(TRAFFIC.bytes_per_s, rel=0.3), w["metric"]
        errs = prom.query("increase(ibfm_port_symbol_errors_total[1m]) > 0")
        assert len(errs) == 1
    finally:
        prom.stop()
