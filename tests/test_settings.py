"""Settings from the environment parse as the TOML file's do, for every setting."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from ibfm.cli import main
from ibfm.settings import Settings, SettingsError, env_name, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.upper().startswith("IBFM_"):
            monkeypatch.delenv(k)


def leaf_settings() -> list[str]:
    """Every setting's dotted name (``listen``, ``fabric.fattree_levels``, ...)."""
    out = []
    for name, f in Settings.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += [f"{name}.{key}" for key in ann.model_fields]
        else:
            out.append(name)
    return out


SAMPLES: dict[str, Any] = {
    "listen": "0.0.0.0:1234",
    "fabric.transport": "umad",
    "fabric.topology": "/srv/fabric.net",
    "fabric.fattree_levels": 3,
    "fabric.fattree_radix": 12,
    "fabric.traffic": "shift:1",
    "fabric.ca": "mlx5_1",
    "fabric.port": 2,
    "fabric.expected_topology": "/srv/design.net",
    "sm.engines": ["updn", "minhop"],
    "sm.lmc": 2,
    "sm.guid2lid": "/var/lib/ibfm/guid2lid",
    "sm.root_guids": ["0x10", "0x20"],
    "sm.sweep_interval": 2.5,
    "sm.flap_max": 7,
    "sm.flap_window": 30.5,
    "sm.flap_hold": 12.25,
    "sm.check_credit_loops": False,
    "sm.offload": False,
    "sm.priority": 7,
    "sm.sm_key": 0x1234,
    "sm.poll_interval": 0.5,
    "sm.poll_retries": 5,
    "sm.partitions": "/etc/opensm/partitions.conf",
    "sm.part_enforce": "in",
    "sm.m_key": "0xfedcba9876543210",
    "sm.m_key_per_port": True,
    "sm.m_key_protection_level": 2,
    "sm.m_key_lease_period": 60,
    "sm.guid2mkey": "/var/cache/ibfm/guid2mkey",
    "sm.qos": True,
    "sm.qos_policy_file": "/etc/opensm/qos-policy.conf",
    "sm.qos_max_vls": 8,
    "sm.qos_high_limit": 4,
    "sm.qos_vlarb_high": "0:4,1:8",
    "sm.qos_vlarb_low": "0:1,1:2,2:3",
    "sm.qos_sl2vl": "0,1,2,3,4,5,6,7,0,1,2,3,4,5,6,15",
    "sm.qos_ca_max_vls": 4,
    "sm.qos_ca_high_limit": 9,
    "sm.qos_ca_vlarb_high": "1:1",
    "sm.qos_ca_vlarb_low": "2:2,3:3",
    "sm.qos_ca_sl2vl": "0,0,0,0,1,1,1,1,2,2,2,2,3,3,3,15",
    "sm.qos_swe_max_vls": 4,
    "sm.qos_swe_high_limit": 9,
    "sm.qos_swe_vlarb_high": "1:1",
    "sm.qos_swe_vlarb_low": "2:2,3:3",
    "sm.qos_swe_sl2vl": "0,0,0,0,1,1,1,1,2,2,2,2,3,3,3,15",
    "sm.qos_sw0_max_vls": 4,
    "sm.qos_sw0_high_limit": 9,
    "sm.qos_sw0_vlarb_high": "1:1",
    "sm.qos_sw0_vlarb_low": "2:2,3:3",
    "sm.qos_sw0_sl2vl": "0,0,0,0,1,1,1,1,2,2,2,2,3,3,3,15",
    "sm.qos_rtr_max_vls": 4,
    "sm.qos_rtr_high_limit": 9,
    "sm.qos_rtr_vlarb_high": "1:1",
    "sm.qos_rtr_vlarb_low": "2:2,3:3",
    "sm.qos_rtr_sl2vl": "0,0,0,0,1,1,1,1,2,2,2,2,3,3,3,15",
    "perfmgr.enabled": False,
    "perfmgr.interval": 0.5,
    "congestion.pattern": "all-to-all",
    "api.token": "s3cret-token",
    "api.max_body_bytes": 2048,
    "mqtt.enabled": True,
    "mqtt.host": "broker.example",
    "mqtt.port": 8883,
    "mqtt.subnet": "lab-1",
    "log.level": "DEBUG",
    "log.format": "json",
    "log.access_log": True,
}
"""A valid value other than the default for every setting, as the TOML file gives it."""


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def env_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return ",".join(v)
    return str(v)


def toml_file(tmp_path: Path, dotted: str, text: str) -> Path:
    section, _, key = dotted.rpartition(".")
    cfg = tmp_path / "ibfm.toml"
    cfg.write_text((f"[{section}]\n" if section else "") + f"{key} = {text}\n")
    return cfg


def setting(s: Settings, dotted: str) -> Any:
    v: Any = s
    for part in dotted.split("."):
        v = getattr(v, part)
    return v


def test_every_setting_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(leaf_settings())


@pytest.mark.parametrize("dotted", leaf_settings())
def test_env_parses_as_the_file_does(dotted: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sample = SAMPLES[dotted]
    from_file = load_settings(toml_file(tmp_path, dotted, toml_value(sample)))
    monkeypatch.setenv(env_name(dotted), env_value(sample))
    from_env = load_settings()
    monkeypatch.delenv(env_name(dotted))
    from_flag = load_settings(None, {dotted: env_value(sample)})  # flags arrive as text too
    default = setting(load_settings(), dotted)
    got = setting(from_file, dotted)
    assert got != default, f"{dotted}: the sample is the default, or the file was not read"
    assert setting(from_env, dotted) == got
    assert setting(from_flag, dotted) == got
    assert from_env.model_dump() == from_file.model_dump()


def test_types_are_the_files(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBFM_FABRIC__FATTREE_LEVELS", "3")
    monkeypatch.setenv("IBFM_FABRIC__PORT", "2")
    monkeypatch.setenv("IBFM_SM__SWEEP_INTERVAL", "4")
    monkeypatch.setenv("IBFM_SM__OFFLOAD", "false")
    s = load_settings()
    for v, t in (
        (s.fabric.fattree_levels, int),
        (s.fabric.port, int),
        (s.sm.sweep_interval, float),
        (s.sm.offload, bool),
    ):
        assert type(v) is t, (v, t)
    assert (s.fabric.fattree_levels, s.fabric.port, s.sm.sweep_interval, s.sm.offload) == (3, 2, 4.0, False)


@pytest.mark.parametrize(
    ("dotted", "text"),
    [
        ("fabric.fattree_levels", " 3 "),
        ("fabric.fattree_levels", "3.0"),
        ("fabric.fattree_radix", "0xc"),
        ("fabric.port", "+2"),
        ("api.max_body_bytes", "1_024_000"),
        ("api.max_body_bytes", "0o4000"),
        ("mqtt.port", "0b1000"),
        ("sm.sweep_interval", "1e1"),
        ("sm.flap_hold", "7"),
        ("sm.lmc", "1.0"),
        ("log.access_log", "true"),
    ],
)
def test_toml_number_forms_in_env(dotted: str, text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from_file = setting(load_settings(toml_file(tmp_path, dotted, text.strip())), dotted)
    monkeypatch.setenv(env_name(dotted), text)
    assert setting(load_settings(), dotted) == from_file


@pytest.mark.parametrize(
    ("text", "want"),
    [("1", True), ("yes", True), ("on", True), ("True", True), ("0", False), ("off", False), ("FALSE", False)],
)
def test_env_booleans_beyond_toml_still_parse(text: str, want: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IBFM_MQTT__ENABLED", text)
    assert load_settings().mqtt.enabled is want


@pytest.mark.parametrize(
    ("dotted", "text"),
    [
        ("fabric.fattree_levels", "4"),
        ("fabric.fattree_levels", "true"),
        ("fabric.fattree_levels", "three"),
        ("fabric.fattree_levels", "3 # levels"),
        ("fabric.fattree_levels", "3\nlmc = 2"),
        ("fabric.fattree_levels", '"3"x'),
        ("sm.lmc", "1.5"),
        ("sm.lmc", ""),
        ("sm.offload", "maybe"),
        ("sm.priority", "16"),
        ("sm.priority", "-1"),
        ("sm.sweep_interval", "nan"),
        ("mqtt.port", "[1]"),
    ],
)
def test_bad_env_values_still_name_the_setting(dotted: str, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env_name(dotted), text)
    with pytest.raises(SettingsError) as e:
        load_settings()
    assert f"setting {dotted}" in str(e.value) and env_name(dotted) in str(e.value)


def test_text_settings_that_look_like_numbers_stay_text(monkeypatch: pytest.MonkeyPatch) -> None:
    for dotted, text in [
        ("mqtt.host", "10"),
        ("mqtt.subnet", "007"),
        ("fabric.ca", "1"),
        ("api.token", "12345678"),
        ("fabric.topology", "1e3"),
        ("log.format", "json"),
    ]:
        monkeypatch.setenv(env_name(dotted), text)
    s = load_settings()
    assert (s.mqtt.host, s.mqtt.subnet, s.fabric.ca) == ("10", "007", "1")
    assert s.api.token is not None and s.api.token.get_secret_value() == "12345678"
    assert s.fabric.topology == Path("1e3")


def test_serve_reads_fattree_levels_from_env(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IBFM_FABRIC__FATTREE_LEVELS", "3")
    monkeypatch.setenv("IBFM_SM__LMC", "1")
    assert main(["serve", "--print-settings"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fabric"]["fattree_levels"] == 3 and out["sm"]["lmc"] == 1
