"""``ibfm serve``: settings (file < env < flags), the generated docs, and the daemon as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from fabric.errors import FormatError
from ibfm.cli import main
from ibfm.settings import DOC_PATH, FLAGS, Settings, SettingsError, load_settings, render_settings_doc

ROOT = Path(__file__).resolve().parent.parent
IBFM = [sys.executable, "-m", "ibfm.cli"]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("IBFM_"):
            monkeypatch.delenv(k)


# -- settings ---------------------------------------------------------------------------------------------


def test_defaults() -> None:
    s = load_settings()
    assert s.listen == "127.0.0.1:9690" and (s.listen_host, s.listen_port) == ("127.0.0.1", 9690)
    assert s.fabric.transport == "emulated" and s.fabric.topology is None
    assert (s.fabric.fattree_levels, s.fabric.fattree_radix) == (2, 8)
    assert s.sm.engine_chain == ("ftree", "layered", "updn", "minhop") and s.sm.lmc == 0
    assert s.api.token is None and s.mqtt.enabled is False and s.log.format == "text"


def test_sm_settings_reach_the_sm(monkeypatch: pytest.MonkeyPatch) -> None:
    from ibfm.service import sm_config

    assert sm_config(load_settings()).offload is True
    monkeypatch.setenv("IBFM_SM__OFFLOAD", "false")
    monkeypatch.setenv("IBFM_SM__CHECK_CREDIT_LOOPS", "false")
    cfg = sm_config(load_settings())
    assert cfg.offload is False and cfg.check_credit_loops is False


def test_precedence_flags_env_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "ibfm.toml"
    cfg.write_text(
        'listen = "0.0.0.0:1000"\n'
        "[sm]\nlmc = 1\nsweep_interval = 7.5\nengines = [\"updn\", \"minhop\"]\nroot_guids = [\"0x10\", \"0X20\"]\n"
        "[mqtt]\nenabled = true\nsubnet = \"from-file\"\n"
        "[api]\ntoken = \"file-token-123\"\n"
    )
    s = load_settings(cfg)
    assert s.listen == "0.0.0.0:1000" and s.sm.lmc == 1 and s.sm.sweep_interval == 7.5
    assert s.sm.engine_chain == ("updn", "minhop")
    assert s.sm.root_guid_list == (0x10, 0x20)
    assert s.api.token is not None and s.api.token.get_secret_value() == "file-token-123"
    monkeypatch.setenv("IBFM_SM__LMC", "2")
    monkeypatch.setenv("IBFM_MQTT__SUBNET", "from-env")
    monkeypatch.setenv("IBFM_LISTEN", "127.0.0.1:2000")
    s = load_settings(cfg)
    assert s.sm.lmc == 2 and s.mqtt.subnet == "from-env" and s.mqtt.enabled is True  # sections merge
    assert s.listen == "127.0.0.1:2000" and s.sm.sweep_interval == 7.5
    s = load_settings(cfg, {"sm.lmc": "0", "listen": "[::1]:3000"})
    assert s.sm.lmc == 0 and (s.listen_host, s.listen_port) == ("::1", 3000) and s.mqtt.subnet == "from-env"
    monkeypatch.setenv("IBFM_CONFIG", str(cfg))
    monkeypatch.delenv("IBFM_LISTEN")
    assert load_settings().listen == "0.0.0.0:1000"
    assert "file-token-123" not in json.dumps(s.public_dict())


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        ({"sm.lmc": "5"}, "sm.lmc"),
        ({"sm.engines": "ftree,bogus"}, "unknown routing engine 'bogus'"),
        ({"listen": "localhost"}, "setting listen"),
        ({"listen": "[::1]9690"}, "setting listen"),
        ({"listen": "host:99999"}, "0..65535"),
        ({"sm.root_guids": "0xnope"}, "sm.root_guids"),
        ({"sm.sweep_interval": "0"}, "sm.sweep_interval"),
        ({"perfmgr.interval": "-1"}, "perfmgr.interval"),
        ({"fabric.transport": "infiniband"}, "fabric.transport"),
        ({"fabric.fattree_radix": "7"}, "must be even"),
        ({"fabric.traffic": "shift:zero"}, "fabric.traffic"),
        ({"congestion.pattern": "nope"}, "congestion.pattern"),
        ({"api.token": "short"}, "api.token"),
        ({"log.level": "LOUD"}, "log.level"),
        ({"fabric.transport": "umad", "fabric.topology": "x.net"}, "fabric.topology is for the emulated"),
    ],
)
def test_bad_values_name_the_setting(flags: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError) as e:
        load_settings(None, flags)
    assert needle in str(e.value)
    assert "short" not in str(e.value) or "api.token" not in flags


def test_bad_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBFM_SM__LMC", "many")
    with pytest.raises(SettingsError, match=r"sm\.lmc.*IBFM_SM__LMC"):
        load_settings()
    monkeypatch.delenv("IBFM_SM__LMC")
    monkeypatch.setenv("IBFM_SM__COLOUR", "blue")
    with pytest.raises(SettingsError, match=r"unknown setting 'sm\.colour'"):
        load_settings()
    monkeypatch.delenv("IBFM_SM__COLOUR")
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[sm]\nlmc = 1\nspeed = 3\n[nonsense]\nx = 1\n")
    with pytest.raises(SettingsError) as e:
        load_settings(cfg)
    assert "sm.speed" in str(e.value) and "nonsense" in str(e.value) and str(cfg) in str(e.value)
    cfg.write_text("[sm]\nlmc = = 1\n")
    with pytest.raises(FormatError, match=r"bad\.toml.*line 2"):
        load_settings(cfg)
    with pytest.raises(FormatError, match="cannot read"):
        load_settings(tmp_path / "missing.toml")


def test_cli_bad_setting_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--lmc", "3", "--print-settings"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ibfm: error:") and "sm.lmc" in err and "--lmc" in err


def test_cli_flags_reach_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["serve", "--print-settings", "--listen", "127.0.0.1:0", "--engine", "updn", "--root-guid", "0x1",
            "--root-guid", "0x2", "--sweep-interval", "3", "--log-format", "json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["listen"] == "127.0.0.1:0" and out["sm"]["engines"] == "updn"
    assert out["sm"]["root_guids"] == "0x0000000000000001,0x0000000000000002"
    assert out["sm"]["sweep_interval"] == 3.0 and out["log"]["format"] == "json"


def test_every_flag_names_a_setting() -> None:
    for dotted in FLAGS:
        section, _, key = dotted.rpartition(".")
        model: Any = Settings.model_fields[section].annotation if section else Settings
        assert key in model.model_fields, dotted


def test_settings_doc_is_current() -> None:
    assert DOC_PATH.read_text() == render_settings_doc(), "docs/settings.md is stale: run python -m ibfm.settings"
    doc = render_settings_doc()
    for name, f in Settings.model_fields.items():
        ann = f.annotation
        section = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        fields = section.model_fields if section else {"": f}
        for key, sub in fields.items():
            dotted = f"{name}.{key}" if section else name
            assert sub.description, f"{dotted} has no description"
            assert f"| `{dotted}` |" in doc, dotted


# -- the daemon -------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    port = _free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("IBFM_")}
    env.update({"IBFM_API__TOKEN": "serve-test-token", "IBFM_PERFMGR__INTERVAL": "0.5", "PYTHONPATH": str(ROOT)})
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*IBFM, "serve", "--listen", f"127.0.0.1:{port}", "--log-format", "json", "--sweep-interval", "1"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _wait_health(base: str, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            status, body = _get(base + "/api/v1/health")
        except OSError:
            time.sleep(0.1)
            continue
        if status == 200:
            return json.loads(body)
        assert status == 503, body
        time.sleep(0.1)
    raise AssertionError("no sweep within 30 s:\n" + log.read_text())


def test_serve_sweeps_serves_and_stops_on_sigterm(daemon: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    proc, base, log = daemon
    health = _wait_health(base, proc, log)
    assert health["state"] == "up" and health["fabric"]["cas"] == 32
    # counters flow: wait for a PerfManager sweep after the first prediction set the traffic
    deadline = time.monotonic() + 20
    while True:
        status, text = _get(base + "/metrics")
        assert status == 200
        lines = [x for x in text.decode().splitlines() if x.startswith("ibfm_port_transmit_data_bytes_total{")]
        if lines and any(float(x.rsplit(" ", 1)[1]) > 0 for x in lines):
            break
        assert time.monotonic() < deadline, text.decode()[:2000]
        time.sleep(0.3)
    assert "ibfm_subnet_up 1" in text.decode()
    assert "ibfm_port_predicted_utilization_ratio{" in text.decode()
    status, body = _get(base + "/api/v1/routes?src=host-00000&dst=host-00031")
    assert status == 200 and json.loads(body)["delivered"]
    req = urllib.request.Request(base + "/api/v1/sweep", method="POST",
                                 headers={"Authorization": "Bearer serve-test-token"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 202
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, log.read_text()
    records = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    messages = [r["message"] for r in records]
    assert any(m.startswith("listening on http://127.0.0.1:") for m in messages)
    assert messages[-1] == "stopped"
    assert any(r.get("event", {}).get("type") == "sweep_done" for r in records)
    assert not [r for r in records if r["level"] in ("ERROR", "CRITICAL")], records


def _records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _wait_record(log: Path, proc: subprocess.Popen[bytes], want: Any, after: int = 0) -> dict[str, Any]:
    """The first JSON log record from index ``after`` on that ``want`` accepts (within 20 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        for r in _records(log)[after:]:
            if want(r):
                return r
        time.sleep(0.1)
    raise AssertionError("no such log line:\n" + log.read_text()[-4000:])


def test_sighup_reloads_the_partitions_file(tmp_path: Path) -> None:
    from fabric.generate import fattree
    from tests.test_partitions_sm import guid, two_tenants

    f = fattree(2, 8)  # the daemon's default fabric
    cas = [int(n) for n in f.cas]
    conf = tmp_path / "partitions.conf"
    conf.write_text(two_tenants(f))
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("IBFM_")}
    env["PYTHONPATH"] = str(ROOT)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*IBFM, "serve", "--listen", f"127.0.0.1:{port}", "--log-format", "json", "--partitions", str(conf),
             "--perfmgr-interval", "100"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        _wait_health(base, proc, log)

        def partition_a() -> dict[str, Any]:
            status, body = _get(base + "/api/v1/partitions/0x8001")
            assert status == 200, body
            return dict(json.loads(body)["partition"])

        assert (partition_a()["full"], partition_a()["limited"]) == (4, 1)
        # a file that does not parse: one warning naming file, line and column; the partitions stay
        seen = len(_records(log))
        conf.write_text("Default=0x7fff : ALL=limited, SELF=full ;\nA=0x8001, ipoib, bogus : ALL=full ;\n")
        proc.send_signal(signal.SIGHUP)
        r = _wait_record(log, proc, lambda r: "partitions_reload" in r, seen)
        assert r["partitions_reload"]["via"] == "SIGHUP" and r["partitions_reload"]["result"] == "refused"
        assert r["level"] == "WARNING" and f"{conf}:2:18: unknown partition flag 'bogus'" in r["message"]
        assert "running configuration stays" in r["message"] and "\n" not in r["message"]
        status, body = _get(base + "/api/v1/partitions")
        listing = json.loads(body)
        assert status == 200 and listing["source"] == str(conf) and listing["pending"] is False
        assert (partition_a()["full"], partition_a()["limited"]) == (4, 1)
        # a good file: applied by a heavy sweep; host 7 joins A
        seen = len(_records(log))
        conf.write_text(two_tenants(f).replace(f"{guid(f, cas[4])} ;", f"{guid(f, cas[4])}, {guid(f, cas[7])}=full ;"))
        proc.send_signal(signal.SIGHUP)
        r = _wait_record(log, proc, lambda r: "partitions_reload" in r, seen)
        assert r["partitions_reload"]["result"] == "applied" and r["level"] == "INFO"
        assert r["message"].startswith(f"partitions reloaded (SIGHUP) from {conf}: 3 partitions")
        deadline = time.monotonic() + 20
        while partition_a()["full"] != 5:
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.1)
        assert partition_a()["limited"] == 1
        _wait_record(log, proc, lambda r: "partitions" in r.get("event", {}).get("reasons", []))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert not [r for r in _records(log) if r["level"] in ("ERROR", "CRITICAL")]


def test_serve_refuses_a_bad_topology(tmp_path: Path) -> None:
    bad = tmp_path / "bad.net"
    bad.write_text('Switch 4 "s1"\n[9] "h1"[1]\n')
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("IBFM_")}
    r = subprocess.run([*IBFM, "serve", "--topology", str(bad), "--listen", "127.0.0.1:0"], cwd=ROOT, env=env,
                       capture_output=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert b"bad.net" in r.stderr and b"Traceback" not in r.stderr


def test_serve_refuses_a_busy_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("IBFM_")}
        r = subprocess.run([*IBFM, "serve", "--listen", f"127.0.0.1:{port}", "--perfmgr-interval", "100"],
                           cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}".encode() in r.stderr


# -- the service in process, with the MQTT publisher ------------------------------------------------------------


@pytest.mark.mqtt
async def test_service_in_process_publishes_to_mqtt(tmp_path: Path) -> None:
    import aiohttp

    from ibfm.service import Service
    from tests.test_mqtt import Broker, subscriber, until

    broker = Broker(tmp_path)
    broker.start()
    try:
        settings = load_settings(None, {
            "listen": "127.0.0.1:0", "perfmgr.interval": "0.2", "mqtt.enabled": "true",
            "mqtt.port": str(broker.port), "mqtt.host": "127.0.0.1", "mqtt.subnet": "svc-test",
            "fabric.fattree_radix": "4", "fabric.traffic": "shift:1@0.5",
        })
        svc = Service(settings)
        stop = asyncio.Event()
        started: asyncio.Future[tuple[str, int]] = asyncio.get_running_loop().create_future()
        async with subscriber(broker.port, "ibfm/svc-test/#") as q:
            task = asyncio.create_task(svc.run(stop, started=started.set_result))
            host, port = await asyncio.wait_for(started, 10)
            m = await until(q, lambda m: str(m.topic) == "ibfm/svc-test/state" and b'"sweep": 1' in m.payload)
            assert json.loads(m.payload)["state"] == "up"
            await until(q, lambda m: str(m.topic) == "ibfm/svc-test/events/sweep_done")
            # the emulated traffic follows the prediction: a host sends half its link rate
            deadline = time.monotonic() + 10
            async with aiohttp.ClientSession() as s:
                while True:
                    async with s.get(f"http://{host}:{port}/api/v1/ports", params={"node": "host-00000"}) as r:
                        port1 = (await r.json())["items"][0]
                    rate = (port1["rates"] or {}).get("xmit_data_bytes")
                    if rate:
                        break
                    assert time.monotonic() < deadline, port1
                    await asyncio.sleep(0.1)
            assert rate == pytest.approx(0.5 * 50e9, rel=0.05)
            assert svc.prediction is not None and svc.prediction.fabric is svc.manager.snapshot.fabric
            stop.set()
            await asyncio.wait_for(task, 20)
            await until(q, lambda m: str(m.topic) == "ibfm/svc-test/status" and m.payload == b"offline")
    finally:
        broker.stop()


# -- the daemon against ibsim -------------------------------------------------------------------------------------


@pytest.mark.ibsim
def test_serve_on_ibsim_over_umad(tmp_path: Path) -> None:
    from fabric.formats.netfile import write_net
    from fabric.generate import fattree
    from fabric.ibsim import IbsimProcess
    from fabric.model import Speed
    from tests.conftest import need_ibsim

    need_ibsim()
    net = tmp_path / "fabric.net"
    fabric = fattree(2, 4, speed=Speed.QDR)  # ibsim reads link rates up to QDR
    write_net(fabric, net)
    work = tmp_path / "work"
    work.mkdir()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with IbsimProcess(net) as sim:
        env = sim.env(sim_host="host-00000")
        env = {k: v for k, v in env.items() if not k.upper().startswith("IBFM_")}
        env["PYTHONPATH"] = str(ROOT)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*IBFM, "serve", "--transport", "umad", "--listen", f"127.0.0.1:{port}", "--perfmgr-interval", "0.5",
                 "--guid2lid", str(work / "guid2lid")],
                cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        try:
            health = _wait_health(base, proc, log)
            assert health["state"] == "up", health
            assert health["fabric"] == fabric.summary()
            assert health["sm"]["node"] == "host-00000"
            status, body = _get(base + "/api/v1/routes?src=host-00000&dst=host-00007")
            route = json.loads(body)
            assert status == 200 and route["delivered"] and route["rate_gbps"] == 32.0  # 4x QDR
            deadline = time.monotonic() + 20
            while True:
                status, text = _get(base + "/metrics")
                if "ibfm_perfmgr_sweeps_total" in text.decode():
                    break
                assert time.monotonic() < deadline, text.decode()[:2000]
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    assert (work / "guid2lid").exists()
