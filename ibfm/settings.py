"""Settings of the ``ibfm serve`` daemon: a TOML file, ``IBFM_`` environment variables and flags.

Precedence, highest first: command-line flags, environment variables
(``IBFM_`` prefix, ``__`` between a section and its key, e.g.
``IBFM_SM__LMC=1``), the TOML file (``--config FILE`` or ``IBFM_CONFIG``;
one table per section, e.g. ``[sm]`` ``lmc = 1``), the defaults. Every
setting carries its description here; ``docs/settings.md`` is generated
from this model (``python -m ibfm.settings``) and a test fails when it is
stale.

A bad value raises :class:`SettingsError` naming the setting and where it
can be set; the command line prints it and exits 2.
"""

from __future__ import annotations

import os
import tomllib
import types
import typing
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as _PydanticSettingsError

from fabric.errors import FormatError, IbfmError
from sm.qos.config import (
    PORT_TYPES,
    QosConfig,
    build_options,
    load_qos_policy,
    parse_sl2vl,
    parse_vlarb,
)
from sm.routing.base import DEFAULT_CHAIN, parse_chain

ENV_PREFIX = "IBFM_"
ENV_NESTED = "__"
CONFIG_ENV = "IBFM_CONFIG"
"""Environment variable naming the TOML file when ``--config`` is not given."""

DEFAULT_PORT = 9690


class SettingsError(IbfmError):
    """A setting with a bad value, or a config file that cannot be read."""


def check_pattern_spec(spec: str) -> str:
    """A traffic pattern spec, checked on a small fat-tree (the real fabric is not known yet); "" passes."""
    text = spec.strip()
    if not text:
        return ""
    from fabric.generate import fattree
    from sm.analysis.patterns import PatternError, parse_pattern
    from sm.lidmap import sequential_lids

    f = fattree(2, 8)
    try:
        parse_pattern(text, f, sequential_lids(f))
    except PatternError as e:
        msg = str(e)
        if "outside" not in msg and "need" not in msg:  # host counts depend on the real fabric
            raise ValueError(msg) from None
    return text


def _is_scalar(ann: Any) -> bool:
    """Whether a field takes only numbers or booleans (``int``, ``float``, ``bool``, ``Literal[2, 3]``, optional)."""
    if typing.get_origin(ann) is Literal:
        return all(isinstance(a, bool | int | float) for a in typing.get_args(ann))
    if ann in (bool, int, float):
        return True
    members = [a for a in typing.get_args(ann) if a is not type(None)]
    return typing.get_origin(ann) in (typing.Union, types.UnionType) and all(_is_scalar(a) for a in members)


def _scalar_from_text(text: str) -> object:
    """A number or boolean written as text (an environment variable, a flag) -> the value TOML gives it.

    The environment holds only text. pydantic turns ``"3"`` into ``3`` for an ``int`` field but
    compares a ``Literal[2, 3]`` field's input as it is, so ``IBFM_FABRIC__FATTREE_LEVELS=3`` failed
    where the file's ``fattree_levels = 3`` passed. Read as a TOML value, ``IBFM_X=3`` means what
    ``x = 3`` means in the file, for every number and boolean field. Text that is not one TOML
    number or boolean stays text for pydantic: ``yes`` and ``on`` still mean true, and junk
    (``3 # c``, two lines) is an error naming the setting.
    """
    t = text.strip()
    if not t or any(c in t for c in "\n\r#"):
        return text
    try:
        value = tomllib.loads(f"v = {t}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return value if isinstance(value, bool | int | float) else text


def _scalar_text_as_toml(cls: type[BaseModel], value: object, info: ValidationInfo) -> object:
    """Before-validator of every field: text for a number or boolean field is read as TOML reads it."""
    if isinstance(value, str) and info.field_name is not None:
        field = cls.model_fields.get(info.field_name)
        if field is not None and _is_scalar(field.annotation):
            return _scalar_from_text(value)
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)

    _scalars_as_toml = field_validator("*", mode="before")(classmethod(_scalar_text_as_toml))


def _split_list(value: object) -> str:
    """A TOML list or a comma-separated string -> the canonical comma-separated string."""
    if isinstance(value, list | tuple):
        return ",".join(str(v).strip() for v in value)
    if isinstance(value, str):
        return ",".join(t.strip() for t in value.split(",") if t.strip())
    raise ValueError("expected a list or a comma-separated string")


class FabricSettings(_Section):
    """Where the fabric comes from."""

    transport: Literal["emulated", "umad"] = Field(
        "emulated",
        description="Fabric access: `emulated` (an in-process fabric, ibsim-like) or `umad` (a real HCA port "
        "through libibumad, or ibsim through libumad2sim).",
    )
    topology: Path | None = Field(
        None,
        description="Emulated transport: net file (ibsim or ibnetdiscover format) loaded into the emulator. "
        "Unset: a generated fat-tree (`fattree_levels`, `fattree_radix`).",
    )
    fattree_levels: Literal[2, 3] = Field(
        2, description="Generated fat-tree (emulated transport, no `topology`): switch levels, 2 or 3."
    )
    fattree_radix: int = Field(
        8,
        ge=4,
        le=64,
        description="Generated fat-tree: switch port count k (even, 4..64). 2 levels: k leaves of k/2 hosts and "
        "k/2 spines (k=8: 32 hosts, 12 switches).",
    )
    traffic: str = Field(
        "random-permutation:1@0.3",
        description="Emulated transport: the traffic pattern the hosts run (`ibfm congestion` spec: shift:S, "
        "random-permutation[:SEED], random-bisection[:SEED], all-to-all, incast:N[:DST], ring, ring-per-rail, "
        "`@F` = each sender offers F times its link rate). The congestion model's rates on the current routes "
        "drive the PMA counters; empty: idle.",
    )
    ca: str | None = Field(None, description="umad transport: CA name (e.g. `mlx5_0`); unset: the first CA.")
    port: int | None = Field(
        None, ge=1, le=254, description="umad transport: CA port number; unset: the first active port."
    )
    expected_topology: Path | None = Field(
        None,
        description="Net file of the fabric as cabled by design: `GET /api/v1/validation` reports missing, "
        "extra and swapped cables against it.",
    )

    @field_validator("traffic")
    @classmethod
    def _traffic(cls, v: str) -> str:
        return check_pattern_spec(v)

    @field_validator("fattree_radix")
    @classmethod
    def _even(cls, v: int) -> int:
        if v % 2:
            raise ValueError("the fat-tree radix must be even")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> FabricSettings:
        if self.transport == "umad" and self.topology is not None:
            raise ValueError("fabric.topology is for the emulated transport, not umad (unset one of them)")
        if self.transport == "emulated" and self.topology is None and self.fattree_levels == 3 and (
            self.fattree_radix > 36
        ):
            raise ValueError("a generated 3-level fat-tree above radix 36 exceeds the LID space")
        return self


class SmSettings(_Section):
    """The subnet manager: routing, LIDs, sweeps."""

    engines: str = Field(
        ",".join(DEFAULT_CHAIN),
        description="Routing engines tried in order, comma-separated (as OpenSM's `-R`): ftree, layered, updn,"
        " minhop. An engine whose routes would loop on more VLs than the links have counts as refusing.",
    )
    lmc: int = Field(0, ge=0, le=2, description="LID mask control: each end port gets 2^lmc LIDs (0..2).")
    guid2lid: Path | None = Field(
        None, description="guid2lid file (OpenSM format) keeping LIDs stable across restarts; unset: in memory."
    )
    root_guids: str = Field(
        "",
        description="Node GUIDs of the root switches for ftree/updn, comma-separated hex (`0x...`); "
        "empty: detected.",
    )
    sweep_interval: float = Field(
        10.0,
        gt=0.0,
        le=86400.0,
        description="Seconds between light sweeps; traps and `POST /api/v1/sweep` sweep at once.",
    )
    flap_max: int = Field(
        4, ge=1, description="Flap damping: state changes of one port within `flap_window` before it is held down."
    )
    flap_window: float = Field(60.0, gt=0.0, description="Flap damping: window in seconds for counting changes.")
    flap_hold: float = Field(
        10.0, ge=0.0, description="Flap damping: seconds a held-down port must be quiet before it is brought up again."
    )
    check_credit_loops: bool = Field(True, description="Check the routes for credit loops after each heavy sweep.")
    priority: int = Field(
        0,
        ge=0,
        le=15,
        description="SMInfo priority 0..15 (OpenSM's default 0): the highest-priority SM, then the lowest "
        "port GUID, is master; the others stand by.",
    )
    sm_key: int = Field(
        1,
        ge=0,
        lt=1 << 64,
        description="SM_Key in SMInfo (OpenSM's default 1; OpenSM ignores SMs whose key differs) and the SA key "
        "that makes an SA request trusted (PKeyTableRecord is answered only to those).",
    )
    poll_interval: float = Field(
        2.0, gt=0.0, le=3600.0, description="Seconds between a standby SM's polls of the master's SMInfo."
    )
    poll_retries: int = Field(
        3,
        ge=0,
        le=100,
        description="A poll the master does not answer is retried at once this many times before the standby "
        "takes over (with `poll_interval` 2 and the MAD timeout, a dead master is replaced within about 6 s).",
    )
    offload: bool = Field(
        True,
        description="Route and check in a forked child process while the switches are programmed; "
        "false: in the daemon's process, before programming.",
    )
    partitions: Path | None = Field(
        None,
        description="Partitions file in OpenSM's partitions.conf syntax (P_Keys, members, IPoIB groups); unset: "
        "OpenSM's default, every port a full member of the default partition 0x7fff. SIGHUP or "
        "POST /api/v1/partitions/reload re-reads it; a file with an error leaves the running one in force.",
    )
    part_enforce: Literal["both", "in", "out", "off"] = Field(
        "both",
        description="Partition enforcement on the switch ports facing CAs (OpenSM's part_enforce): both "
        "directions, inbound or outbound only, or off.",
    )
    m_key: int = Field(
        0,
        ge=0,
        le=(1 << 64) - 1,
        description="M_Key every end port gets (OpenSM's `m_key`; IBA 14.2.4), 64 bits: an integer or a hex "
        'string (`"0x..."`: TOML integers stop at 2^63-1); every SMP carries the key of the port it addresses. '
        "0 (OpenSM's default): no key, the ports are not protected. With `m_key_per_port`, the secret the "
        "ports' keys are derived from. A secret: `--print-settings` shows only whether it is set.",
    )
    m_key_per_port: bool = Field(
        False,
        description="A key per port: a BLAKE2b MAC of the port GUID under `m_key`, 64 bits (reproducible from "
        "the secret and the GUID alone; a key read off one port opens no other). No keys while `m_key` is 0.",
    )
    m_key_protection_level: int = Field(
        0,
        ge=0,
        le=3,
        description="M_KeyProtectBits (OpenSM's `m_key_protection_level`): with a wrong key, 0 fails Sets, 1 "
        "also shows Gets the M_Key as 0, 2 and 3 fail Gets too. A failed check is dropped, counted in "
        "M_KeyViolations and reported by trap 256.",
    )
    m_key_lease_period: int = Field(
        0,
        ge=0,
        le=65535,
        description="M_KeyLeasePeriod in seconds (OpenSM's `m_key_lease_period`): after a failed M_Key check a "
        "port's protection falls to 0 unless an SMP with its key comes within the lease (the sweeps send "
        "one every half lease; keep it above `sweep_interval`). A lost key is recovered by waiting it out "
        "(at most (lease + 1) x (hops + 1) s); 0 (OpenSM's default): never, and a lost key is an error.",
    )
    guid2mkey: Path | None = Field(
        None,
        description="guid2mkey file (OpenSM format, `0x<port guid> 0x<m_key>` per line) keeping the ports' keys "
        "across restarts; beside it, which port is behind which (OpenSM's `neighbors` format; named `neighbors` "
        "beside a file named `guid2mkey`, else `NAME.neighbors`), so a port's key is known before it answers. "
        "Written atomically when they change; a rewrite that drops or changes an entry keeps `NAME.bak`. Unset: "
        "`guid2mkey` beside `guid2lid` when that is set, else in memory (the keys are lost with the process).",
    )
    qos: bool = Field(
        False,
        description="QoS (OpenSM's `qos`, `-Q`): set every port's SLtoVLMappingTable and VLArbitrationTable from "
        "the `qos_*` settings, give paths the SL of their QoS level (the policy file, then the partition's `sl=`). "
        "Off (OpenSM's default): the tables are left as the ports hold them and every path is SL 0, except that "
        "a layered routing engine's SLs are always mapped SL k -> VL k. See docs/qos.md.",
    )
    qos_policy_file: Path | None = Field(
        None,
        description="QoS policy file, a subset of OpenSM's qos-policy.conf: port groups, QoS levels with an SL, "
        "match rules by source and destination group and P_Key (docs/qos.md); read with `qos` on; unset: none.",
    )
    qos_max_vls: int = Field(
        15, ge=1, le=15,
        description="OpenSM's `qos_max_vls`: the most data VLs QoS may use. OpenSM sets no table from it; ibfm "
        "caps with it the VLs (layers) a layered routing engine may use.",
    )  # fmt: skip
    qos_high_limit: int = Field(
        0, ge=0, le=255,
        description="OpenSM's `qos_high_limit`: PortInfo.VLHighLimit, the high-priority bytes (x 4 KB) sent before "
        "a low-priority packet may go (IBA 7.6.9).",
    )  # fmt: skip
    qos_vlarb_high: str = Field(
        "0:4,1:0,2:0,3:0,4:0,5:0,6:0,7:0,8:0,9:0,10:0,11:0,12:0,13:0,14:0",
        description="OpenSM's `qos_vlarb_high`: the high-priority VL arbitration table, `VL:weight` pairs "
        "(VL 0..14, weight 0..255, at most 64; the rest VL 0 weight 0).",
    )
    qos_vlarb_low: str = Field(
        "0:0,1:4,2:4,3:4,4:4,5:4,6:4,7:4,8:4,9:4,10:4,11:4,12:4,13:4,14:4",
        description="OpenSM's `qos_vlarb_low`: the low-priority VL arbitration table, as `qos_vlarb_high`.",
    )
    qos_sl2vl: str = Field(
        "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,7",
        description="OpenSM's `qos_sl2vl`: the VL of each of the 16 SLs, comma-separated (15 drops the SL); each "
        "port keeps the VLs its operational VLs carry (VL AND 2^(OperationalVLs-1)-1, as OpenSM).",
    )
    qos_ca_max_vls: int | None = Field(
        None, ge=1, le=15, description="`qos_max_vls` for CA ports; unset: `qos_max_vls`."
    )
    qos_ca_high_limit: int | None = Field(
        None, ge=0, le=255, description="`qos_high_limit` for CA ports; unset: `qos_high_limit`."
    )
    qos_ca_vlarb_high: str | None = Field(
        None, description="`qos_vlarb_high` for CA ports; unset: `qos_vlarb_high`."
    )
    qos_ca_vlarb_low: str | None = Field(
        None, description="`qos_vlarb_low` for CA ports; unset: `qos_vlarb_low`."
    )
    qos_ca_sl2vl: str | None = Field(
        None, description="`qos_sl2vl` for CA ports; unset: `qos_sl2vl`."
    )
    qos_swe_max_vls: int | None = Field(
        None, ge=1, le=15, description="`qos_max_vls` for switch external ports; unset: `qos_max_vls`."
    )
    qos_swe_high_limit: int | None = Field(
        None, ge=0, le=255, description="`qos_high_limit` for switch external ports; unset: `qos_high_limit`."
    )
    qos_swe_vlarb_high: str | None = Field(
        None, description="`qos_vlarb_high` for switch external ports; unset: `qos_vlarb_high`."
    )
    qos_swe_vlarb_low: str | None = Field(
        None, description="`qos_vlarb_low` for switch external ports; unset: `qos_vlarb_low`."
    )
    qos_swe_sl2vl: str | None = Field(
        None, description="`qos_sl2vl` for switch external ports; unset: `qos_sl2vl`."
    )
    qos_sw0_max_vls: int | None = Field(
        None, ge=1, le=15, description="`qos_max_vls` for switches' enhanced port 0; unset: `qos_max_vls`."
    )
    qos_sw0_high_limit: int | None = Field(
        None, ge=0, le=255, description="`qos_high_limit` for switches' enhanced port 0; unset: `qos_high_limit`."
    )
    qos_sw0_vlarb_high: str | None = Field(
        None, description="`qos_vlarb_high` for switches' enhanced port 0; unset: `qos_vlarb_high`."
    )
    qos_sw0_vlarb_low: str | None = Field(
        None, description="`qos_vlarb_low` for switches' enhanced port 0; unset: `qos_vlarb_low`."
    )
    qos_sw0_sl2vl: str | None = Field(
        None, description="`qos_sl2vl` for switches' enhanced port 0; unset: `qos_sl2vl`."
    )
    qos_rtr_max_vls: int | None = Field(
        None, ge=1, le=15, description="`qos_max_vls` for router ports; unset: `qos_max_vls`."
    )
    qos_rtr_high_limit: int | None = Field(
        None, ge=0, le=255, description="`qos_high_limit` for router ports; unset: `qos_high_limit`."
    )
    qos_rtr_vlarb_high: str | None = Field(
        None, description="`qos_vlarb_high` for router ports; unset: `qos_vlarb_high`."
    )
    qos_rtr_vlarb_low: str | None = Field(
        None, description="`qos_vlarb_low` for router ports; unset: `qos_vlarb_low`."
    )
    qos_rtr_sl2vl: str | None = Field(
        None, description="`qos_sl2vl` for router ports; unset: `qos_sl2vl`."
    )

    @field_validator("m_key", mode="before")
    @classmethod
    def _m_key(cls, v: object) -> object:
        if isinstance(v, str):
            try:
                return int(v.strip(), 0)
            except ValueError:
                raise ValueError("an M_Key is a 64-bit integer (hex: 0x...)") from None
        return v

    def m_key_options(self) -> dict[str, Any]:
        """The M_Key part of the SM's configuration, as ``SmConfig`` keyword arguments."""
        return {
            "m_key": self.m_key,
            "m_key_per_port": self.m_key_per_port,
            "m_key_protect": self.m_key_protection_level,
            "m_key_lease": self.m_key_lease_period,
            "guid2mkey": self.guid2mkey,
        }

    @field_validator(
        "qos_vlarb_high", "qos_vlarb_low", *(f"qos_{t}_vlarb_{p}" for t in PORT_TYPES for p in ("high", "low"))
    )
    @classmethod
    def _vlarb(cls, v: str | None) -> str | None:
        if v is None:
            return None
        parse_vlarb(v)
        return v.strip()

    @field_validator("qos_sl2vl", *(f"qos_{t}_sl2vl" for t in PORT_TYPES))
    @classmethod
    def _sl2vl(cls, v: str | None) -> str | None:
        if v is None:
            return None
        parse_sl2vl(v)
        return v.strip()

    def qos_config(self) -> QosConfig:
        """The QoS part of the SM's configuration (``SmConfig.qos``); reads the policy file when QoS is on
        (QosPolicyError, located, when it does not parse)."""
        keys = ("max_vls", "high_limit", "vlarb_high", "vlarb_low", "sl2vl")
        general = {k: getattr(self, f"qos_{k}") for k in keys}
        per = {t: build_options(general, {k: getattr(self, f"qos_{t}_{k}") for k in keys}) for t in PORT_TYPES}
        policy = load_qos_policy(self.qos_policy_file) if self.qos and self.qos_policy_file is not None else None
        return QosConfig(self.qos, **per, policy=policy)

    @field_validator("engines", mode="before")
    @classmethod
    def _engines(cls, v: object) -> str:
        text = _split_list(v)
        try:
            return ",".join(parse_chain(text))
        except ValueError as e:
            raise ValueError(str(e)) from None

    @field_validator("root_guids", mode="before")
    @classmethod
    def _guids(cls, v: object) -> str:
        text = _split_list(v)
        out = []
        for t in filter(None, text.split(",")):
            try:
                g = int(t, 16)
            except ValueError:
                raise ValueError(f"bad GUID {t!r} (hex, e.g. 0x0002c90000000010)") from None
            if not 0 < g < 1 << 64:
                raise ValueError(f"GUID {t!r} outside 64 bits")
            out.append(f"{g:#018x}")
        return ",".join(out)

    @property
    def engine_chain(self) -> tuple[str, ...]:
        return tuple(self.engines.split(","))

    @property
    def root_guid_list(self) -> tuple[int, ...]:
        return tuple(int(t, 16) for t in self.root_guids.split(",") if t)


class PerfMgrSettings(_Section):
    """The performance manager (PMA counters)."""

    enabled: bool = Field(True, description="Sweep PortCounters/PortCountersExtended of every port.")
    interval: float = Field(10.0, ge=0.1, le=86400.0, description="Seconds between counter sweeps.")


class CongestionSettings(_Section):
    """The congestion model's prediction exported on /metrics."""

    pattern: str = Field(
        "random-permutation:1@0.3",
        description="Traffic pattern (as `fabric.traffic`) whose predicted utilization and XmitWait per port "
        "`/metrics` exports, recomputed after each heavy sweep; empty: no prediction exported.",
    )

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        return check_pattern_spec(v)


class ApiSettings(_Section):
    """The HTTP API."""

    token: SecretStr | None = Field(
        None,
        description="Bearer token that write requests (`POST /api/v1/sweep`) must carry in `Authorization: "
        "Bearer <token>`; unset: writes are refused (403). At least 8 characters. No flag: a command line is "
        "visible to every user of the host.",
    )
    max_body_bytes: int = Field(
        64 << 20, ge=1024, description="Largest request body accepted (a posted net file), in bytes."
    )

    @field_validator("token")
    @classmethod
    def _token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            return None
        if v is not None and len(v.get_secret_value()) < 8:
            raise ValueError("an API token needs at least 8 characters")
        return v


class MqttSettings(_Section):
    """The MQTT publisher (events and retained subnet state)."""

    enabled: bool = Field(False, description="Publish events and retained state to an MQTT broker.")
    host: str = Field("localhost", min_length=1, description="Broker host name or address.")
    port: int = Field(1883, ge=1, le=65535, description="Broker TCP port.")
    subnet: str = Field(
        "subnet0",
        min_length=1,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Subnet name: topics are `ibfm/<subnet>/...` (letters, digits, `_.-`).",
    )


class LogSettings(_Section):
    """Logging."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Least severe level logged.")
    format: Literal["text", "json"] = Field(
        "text", description="`text` (one human line per record) or `json` (one JSON object per line)."
    )
    access_log: bool = Field(False, description="Log every HTTP request (at INFO).")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v


# The TOML file's contents for the Settings being built (set by load_settings).
_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("_FILE_DATA", default=None)


class Settings(BaseSettings):
    """Everything ``ibfm serve`` reads."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED,
        extra="forbid",
        validate_default=True,
        case_sensitive=False,
    )

    listen: str = Field(
        f"127.0.0.1:{DEFAULT_PORT}",
        description="HTTP address, `HOST:PORT` (`[::1]:9690` for IPv6; port 0 picks a free port).",
    )
    fabric: FabricSettings = Field(default_factory=FabricSettings)
    sm: SmSettings = Field(default_factory=SmSettings)
    perfmgr: PerfMgrSettings = Field(default_factory=PerfMgrSettings)
    congestion: CongestionSettings = Field(default_factory=CongestionSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings)
    log: LogSettings = Field(default_factory=LogSettings)

    _scalars_as_toml = field_validator("*", mode="before")(classmethod(_scalar_text_as_toml))

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        parse_listen(v)
        return v.strip()

    @property
    def listen_host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return parse_listen(self.listen)[1]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init arguments) > environment > TOML file > defaults."""
        return init_settings, env_settings, InitSettingsSource(settings_cls, _FILE_DATA.get() or {})

    def public_dict(self) -> dict[str, Any]:
        """The effective settings as plain data, the token and the M_Key shown as set or not."""
        d = self.model_dump(mode="json")
        d["api"]["token"] = "(set)" if self.api.token is not None else None
        d["sm"]["m_key"] = "(set)" if self.sm.m_key else 0
        return d


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); ValueError naming what is wrong."""
    t = text.strip()
    if t.startswith("["):
        end = t.find("]")
        if end < 0 or t[end + 1 : end + 2] != ":":
            raise ValueError(f"{text!r}: expected [IPV6]:PORT")
        host, port_s = t[1:end], t[end + 2 :]
    else:
        host, sep, port_s = t.rpartition(":")
        if not sep:
            raise ValueError(f"{text!r}: expected HOST:PORT")
        if ":" in host:
            raise ValueError(f"{text!r}: write an IPv6 address as [ADDR]:PORT")
    if not host:
        raise ValueError(f"{text!r}: empty host (use 0.0.0.0 for every address)")
    if not port_s.isdigit() or not 0 <= int(port_s) <= 65535:
        raise ValueError(f"{text!r}: port {port_s!r} is not a number in 0..65535")
    return host, int(port_s)


# -- where each setting can be set ---------------------------------------------------------------------

FLAGS: dict[str, str] = {
    "listen": "--listen",
    "fabric.transport": "--transport",
    "fabric.topology": "--topology",
    "fabric.ca": "--ca",
    "fabric.port": "--port",
    "fabric.expected_topology": "--expected-topology",
    "sm.engines": "--engine",
    "sm.lmc": "--lmc",
    "sm.guid2lid": "--guid2lid",
    "sm.root_guids": "--root-guid",
    "sm.sweep_interval": "--sweep-interval",
    "sm.priority": "--sm-priority",
    "sm.partitions": "--partitions",
    "sm.qos": "--qos",
    "sm.qos_policy_file": "--qos-policy-file",
    "perfmgr.interval": "--perfmgr-interval",
    "log.level": "--log-level",
    "log.format": "--log-format",
}
"""Settings that have a command-line flag (``ibfm serve``), by dotted name."""


def env_name(dotted: str) -> str:
    return ENV_PREFIX + dotted.upper().replace(".", ENV_NESTED)


def _where(dotted: str) -> str:
    section, _, key = dotted.rpartition(".")
    toml = f"[{section}] {key}" if section else key
    places = [f"--config file: {toml}", f"env {env_name(dotted)}"]
    if dotted in FLAGS:
        places.append(f"flag {FLAGS[dotted]}")
    return ", ".join(places)


def _explain(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = [str(x) for x in err["loc"] if not isinstance(x, int)]
        # pydantic puts a union member or a validator kind after the field name; keep the field path
        fields = []
        model: Any = Settings
        for part in loc:
            fm = getattr(model, "model_fields", {})
            if part in fm:
                fields.append(part)
                ann = fm[part].annotation
                model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
            elif not fields or model is not None:
                fields.append(part)
                break
        dotted = ".".join(fields) or "(settings)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown setting {dotted!r}")
            continue
        given = err.get("input")
        shown = "" if isinstance(given, dict | BaseModel) or given is None else f" = {given!r}"
        if "token" in dotted or dotted == "sm.m_key":
            shown = ""
        if model is not None and fields and fields[-1] == loc[-1] and model is not Settings:
            lines.append(f"settings [{dotted}]: {msg}")  # a check across one section's settings
        else:
            lines.append(f"setting {dotted}{shown}: {msg} (set by {_where(dotted)})")
    return "bad settings: " + "; ".join(lines)


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML file as a dict; FormatError naming file and line when it cannot be read."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise FormatError(p, None, f"cannot read config file: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", None)
        msg = getattr(e, "msg", str(e))
        raise FormatError(p, line, f"bad TOML: {msg}") from None
    return data


def load_settings(config: str | os.PathLike[str] | None = None, flags: Mapping[str, Any] | None = None) -> Settings:
    """Build the settings: ``flags`` (dotted name -> value) over the environment over ``config`` over defaults.

    ``config`` defaults to the file named by ``$IBFM_CONFIG``.
    """
    if config is None and os.environ.get(CONFIG_ENV):
        config = os.environ[CONFIG_ENV]
    data = read_config_file(config) if config is not None else {}
    nested: dict[str, Any] = {}
    for dotted, value in (flags or {}).items():
        cur = nested
        *parents, last = dotted.split(".")
        for part in parents:
            cur = cur.setdefault(part, {})
        cur[last] = value
    token = _FILE_DATA.set(data)
    try:
        return Settings(**nested)
    except ValidationError as e:
        where = f" (config file {config})" if config is not None else ""
        raise SettingsError(_explain(e) + where) from None
    except _PydanticSettingsError as e:
        raise SettingsError(f"bad settings: {e}") from None
    finally:
        _FILE_DATA.reset(token)


# -- docs/settings.md -----------------------------------------------------------------------------------


def _type_name(ann: Any) -> str:
    args = typing.get_args(ann)
    origin = typing.get_origin(ann)
    if origin is Literal:
        return " or ".join(f"`{a}`" for a in args)
    if args and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return ", ".join(_type_name(a) for a in inner) + " (optional)"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path", SecretStr: "secret string"}
    return names.get(ann, getattr(ann, "__name__", str(ann)))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        return ""
    v = field.default
    if v is None:
        return "unset"
    if isinstance(v, str):
        return f"`{v}`" if v else '`""`'
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    return f"`{v}`"


def render_settings_doc() -> str:
    """``docs/settings.md``: every setting with its type, default, environment variable, flag and description."""
    out = [
        "# ibfm serve settings",
        "",
        "<!-- Generated from ibfm/settings.py by `python -m ibfm.settings`; do not edit by hand. -->",
        "",
        "Sources, highest precedence first: command-line flags, environment variables (`IBFM_` prefix, "
        "`__` between section and key), the TOML file (`--config FILE`, or the file named by `IBFM_CONFIG`), "
        "the defaults below. A bad value stops the daemon with a message naming the setting (exit status 2).",
        "",
        "```toml",
        "# example config file",
        'listen = "0.0.0.0:9690"',
        "[fabric]",
        'topology = "/etc/ibfm/fabric.net"',
        "[sm]",
        'engines = ["ftree", "updn"]',
        "sweep_interval = 5.0",
        "[api]",
        'token = "change-me-please"',
        "```",
        "",
    ]

    def table(model: type[BaseModel], prefix: str) -> list[str]:
        rows = [
            "| Setting | Type | Default | Environment | Flag | Description |",
            "|---|---|---|---|---|---|",
        ]
        for name, f in model.model_fields.items():
            ann = f.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                continue
            dotted = f"{prefix}{name}"
            flag = f"`{FLAGS[dotted]}`" if dotted in FLAGS else ""
            desc = (f.description or "").replace("|", "\\|").replace("\n", " ")
            rows.append(
                f"| `{dotted}` | {_type_name(ann)} | {_default(f)} | `{env_name(dotted)}` | {flag} | {desc} |"
            )
        return rows

    out += ["## General", "", *table(Settings, ""), ""]
    for name, f in Settings.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            doc = (ann.__doc__ or "").strip().splitlines()[0]
            out += [f"## [{name}]", "", doc, "", *table(ann, f"{name}."), ""]
    return "\n".join(out).rstrip() + "\n"


DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "settings.md"


if __name__ == "__main__":
    from fabric.fileio import write_text_atomic

    write_text_atomic(DOC_PATH, render_settings_doc())
    print(f"wrote {DOC_PATH}")
