"""OpenSM's QoS options and a subset of its QoS policy file, parsed and checked.

The options are OpenSM 3.3.23's (``man opensm``, QOS CONFIGURATION; ``osm_qos.c``'s
``qos_build_config``): ``qos_max_vls``, ``qos_high_limit``, ``qos_vlarb_high``, ``qos_vlarb_low``
and ``qos_sl2vl``, each also per port type: ``qos_ca_*`` (CA ports), ``qos_swe_*`` (switch
external ports), ``qos_sw0_*`` (a switch's enhanced port 0) and ``qos_rtr_*`` (router ports). A
per-type option left unset takes the general one, an unset general one OpenSM's default::

    qos_max_vls    15
    qos_high_limit 0
    qos_vlarb_high 0:4,1:0,2:0,3:0,4:0,5:0,6:0,7:0,8:0,9:0,10:0,11:0,12:0,13:0,14:0
    qos_vlarb_low  0:0,1:4,2:4,3:4,4:4,5:4,6:4,7:4,8:4,9:4,10:4,11:4,12:4,13:4,14:4
    qos_sl2vl      0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,7

A VL arbitration table is ``VL:weight`` pairs, comma-separated, at most 64 (two blocks of 32);
entries not given are VL 0 weight 0, as OpenSM fills them. An SL2VL table is the VL of each of
the 16 SLs, comma-separated (VL 15 drops the SL's packets).

Where ibfm is stricter than OpenSM, on purpose (OpenSM's ``strtoul`` parsing takes anything and
quietly reads it as something else), each is a ``ValueError`` naming the entry and its column:

- an SL2VL table of other than 16 VLs (OpenSM maps the SLs not given to VL 0), a VL above 15;
- a VL arbitration entry without ``:``, a VL above 14 (OpenSM takes it modulo 15: 15 is VL 0),
  a weight above 255 (OpenSM keeps its low 8 bits), more than 64 entries (OpenSM ignores the
  rest), numbers with junk, signs or a leading 0 (octal to OpenSM);
- ``qos_max_vls`` outside 1..15, ``qos_high_limit`` outside 0..255.

``qos_max_vls`` does not change any table (OpenSM parses it and never applies it); ibfm caps with
it the number of VLs a layered routing engine may use, besides the ports' operational VLs.

The QoS policy file is a subset of OpenSM's ``qos-policy.conf`` (``osm_qos_parser_y.y``,
``QoS_management_in_OpenSM.txt``)::

    port-groups
        port-group
            name: Storage
            use: SRP targets                      # optional, free text
            port-guid: 0x2c90000000001, 0x2c90000000005-0x2c90000000008
            port-name: storage01 HCA-1/P1          # node description/P<port>
            node-type: CA, SWITCH, ROUTER, ALL, SELF
            partition: TenantA                     # the members of a partition of the partitions file
        end-port-group
    end-port-groups
    qos-levels
        qos-level
            name: Storage
            use: storage traffic
            sl: 3
        end-qos-level
    end-qos-levels
    qos-match-rules
        qos-match-rule
            use: to the storage
            source: Compute, Login                 # port groups; none given: any source
            destination: Storage                   # none given: any destination
            pkey: 0x0001-0x0003, 0x7fff            # the path's P_Key (its 15 bits); none: any
            qos-level-name: Storage
        end-qos-match-rule
    end-qos-match-rules

The first rule that matches a path (in file order) gives its QoS level; a level's SL overrides
the partition's ``sl=`` (as OpenSM's ``pr_rcv_get_path_parms``). Everything outside the subset
(``qos-ulps``, ``qos-setup``, a level's ``mtu-limit``, ``rate-limit``, ``packet-life`` and
``pkey``, a rule's ``qos-class`` and ``service-id``) is an error naming it, not silently
ignored, and so is every syntax error, an unknown port group or level name, and a name defined
twice: :class:`QosPolicyError` as ``FILE:LINE:COL: what``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from fabric.errors import ConfigFileError
from fabric.fileio import TextFileError, read_utf8

__all__ = [
    "DEFAULT_OPTIONS",
    "DEFAULT_SL2VL",
    "DEFAULT_VLARB_HIGH",
    "DEFAULT_VLARB_LOW",
    "PORT_TYPES",
    "MatchRule",
    "PortGroup",
    "PortType",
    "QosConfig",
    "QosLevel",
    "QosOptions",
    "QosPolicy",
    "QosPolicyError",
    "VlArbTable",
    "build_options",
    "load_qos_policy",
    "parse_qos_policy",
    "parse_sl2vl",
    "parse_vlarb",
]

PortType = Literal["ca", "swe", "sw0", "rtr"]
PORT_TYPES: tuple[PortType, ...] = ("ca", "swe", "sw0", "rtr")
"""OpenSM's per-type prefixes: CA ports, switch external ports, switch port 0, router ports."""

VLARB_ENTRIES = 64
"""Entries of a VL arbitration table (two blocks of 32), as OpenSM parses them."""

VlArbTable = tuple[tuple[int, int], ...]
"""64 ``(VL, weight)`` entries."""

DEFAULT_MAX_VLS = 15
DEFAULT_HIGH_LIMIT = 0
DEFAULT_VLARB_HIGH_TEXT = "0:4,1:0,2:0,3:0,4:0,5:0,6:0,7:0,8:0,9:0,10:0,11:0,12:0,13:0,14:0"
DEFAULT_VLARB_LOW_TEXT = "0:0,1:4,2:4,3:4,4:4,5:4,6:4,7:4,8:4,9:4,10:4,11:4,12:4,13:4,14:4"
DEFAULT_SL2VL_TEXT = "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,7"


def _number(text: str, what: str, col: int) -> int:
    """A decimal or 0x-hex number, whole (no sign, no octal leading 0)."""
    t = text.strip()
    if t[:2].lower() == "0x" and len(t) > 2 and all(c in "0123456789abcdefABCDEF" for c in t[2:]):
        return int(t[2:], 16)
    if t.isascii() and t.isdigit():
        if len(t) > 1 and t[0] == "0":
            raise ValueError(f"column {col}: {what} {t!r}: a leading 0 makes it octal to OpenSM")
        return int(t)
    raise ValueError(f"column {col}: {what} {t!r} is not a number (decimal or 0x-hex)")


def _items(text: str) -> list[tuple[str, int]]:
    """Comma-separated items, each with its 1-based column; one trailing comma allowed (OpenSM's example)."""
    out: list[tuple[str, int]] = []
    col = 1
    for piece in text.split(","):
        out.append((piece, col + len(piece) - len(piece.lstrip())))
        col += len(piece) + 1
    if len(out) > 1 and not out[-1][0].strip():
        out.pop()
    return out


def parse_vlarb(text: str) -> VlArbTable:
    """``"0:4,1:0,..."`` -> 64 ``(VL, weight)`` entries, the ones not given ``(0, 0)``; ValueError naming the entry."""
    entries: list[tuple[int, int]] = []
    if not text.strip():
        raise ValueError("empty VL arbitration table (VL:weight pairs, comma-separated)")
    items = _items(text)
    if len(items) > VLARB_ENTRIES:
        raise ValueError(f"{len(items)} entries: a VL arbitration table holds {VLARB_ENTRIES}")
    for i, (item, col) in enumerate(items):
        vl_s, sep, w_s = item.partition(":")
        if not sep:
            raise ValueError(f"column {col}: entry {i} {item.strip()!r} is not VL:weight")
        vl = _number(vl_s, "VL", col)
        w = _number(w_s, "weight", col + len(vl_s) + 1)
        if vl > 14:
            raise ValueError(f"column {col}: entry {i}: VL {vl} is not a data VL 0..14 (OpenSM reads it as {vl % 15})")
        if w > 255:
            raise ValueError(f"column {col}: entry {i}: weight {w} is not 0..255")
        entries.append((vl, w))
    entries += [(0, 0)] * (VLARB_ENTRIES - len(entries))
    return tuple(entries)


def parse_sl2vl(text: str) -> tuple[int, ...]:
    """``"0,1,...,7"`` -> the VL of each of the 16 SLs; ValueError naming the entry."""
    items = _items(text)
    if len(items) != 16:
        raise ValueError(
            f"{len(items)} VLs: an SL2VL table gives the VL of each of the 16 SLs (OpenSM would map the SLs "
            "not given to VL 0: write all 16)"
        )
    out = []
    for sl, (item, col) in enumerate(items):
        vl = _number(item, f"VL of SL {sl}", col)
        if vl > 15:
            raise ValueError(f"column {col}: SL {sl}: VL {vl} is not 0..15 (15 drops the SL)")
        out.append(vl)
    return tuple(out)


DEFAULT_VLARB_HIGH = parse_vlarb(DEFAULT_VLARB_HIGH_TEXT)
DEFAULT_VLARB_LOW = parse_vlarb(DEFAULT_VLARB_LOW_TEXT)
DEFAULT_SL2VL = parse_sl2vl(DEFAULT_SL2VL_TEXT)


@dataclass(frozen=True, slots=True)
class QosOptions:
    """One port type's QoS options, resolved (OpenSM's ``struct qos_config``)."""

    max_vls: int = DEFAULT_MAX_VLS
    high_limit: int = DEFAULT_HIGH_LIMIT
    vlarb_high: VlArbTable = DEFAULT_VLARB_HIGH
    vlarb_low: VlArbTable = DEFAULT_VLARB_LOW
    sl2vl: tuple[int, ...] = DEFAULT_SL2VL


DEFAULT_OPTIONS = QosOptions()


def build_options(general: Mapping[str, object], specific: Mapping[str, object]) -> QosOptions:
    """OpenSM's ``qos_build_config``: each option from ``specific`` if set (not None), else ``general``,
    else OpenSM's default. Values are the settings' (text tables, numbers); ValueError names the option."""

    def pick(name: str) -> object:
        v = specific.get(name)
        return general.get(name) if v is None else v

    out: dict[str, object] = {}
    for name, default in (("max_vls", DEFAULT_MAX_VLS), ("high_limit", DEFAULT_HIGH_LIMIT)):
        v = pick(name)
        out[name] = default if v is None else int(v)  # type: ignore[call-overload]
    for name, parse in (("vlarb_high", parse_vlarb), ("vlarb_low", parse_vlarb), ("sl2vl", parse_sl2vl)):
        v = pick(name)
        if v is not None:
            out[name] = parse(v) if isinstance(v, str) else tuple(v)  # type: ignore[call-overload,arg-type]
    return QosOptions(**out)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class QosConfig:
    """What the SM does about QoS: OpenSM's ``qos`` flag, the options per port type, the policy file.

    ``enabled`` False is OpenSM without ``-Q``: no SL2VL or VLArb table is set, partitions' ``sl``
    and the policy are not used, every path is SL 0 (a layered routing engine's SLs excepted:
    see :mod:`sm.qos.plan`)."""

    enabled: bool = False
    ca: QosOptions = DEFAULT_OPTIONS
    swe: QosOptions = DEFAULT_OPTIONS
    sw0: QosOptions = DEFAULT_OPTIONS
    rtr: QosOptions = DEFAULT_OPTIONS
    policy: QosPolicy | None = None

    def options(self, kind: PortType) -> QosOptions:
        opts: QosOptions = getattr(self, kind)
        return opts

    @property
    def max_vls(self) -> int:
        """The most VLs any port type allows (``qos_*max_vls``)."""
        return max(o.max_vls for o in (self.ca, self.swe, self.sw0, self.rtr))


# -- the policy file -----------------------------------------------------------------------------------


class QosPolicyError(ConfigFileError):
    """A QoS policy file ibfm does not read as written: ``FILE:LINE:COL: what``."""



NodeTypeWord = Literal["CA", "SWITCH", "ROUTER", "ALL", "SELF"]


@dataclass(frozen=True, slots=True)
class PortGroup:
    """A ``port-group``: the union of the ports its lines name."""

    name: str
    guids: tuple[tuple[int, int], ...] = ()
    """Port GUID ranges ``(first, last)``."""
    port_names: tuple[str, ...] = ()
    """``node description/P<port>``."""
    node_types: frozenset[str] = frozenset()
    partitions: tuple[str, ...] = ()
    line: int = 0


@dataclass(frozen=True, slots=True)
class QosLevel:
    name: str
    sl: int | None
    line: int = 0


@dataclass(frozen=True, slots=True)
class MatchRule:
    level: str
    sources: tuple[str, ...] = ()
    destinations: tuple[str, ...] = ()
    pkeys: tuple[tuple[int, int], ...] = ()
    """15-bit P_Key ranges ``(first, last)``; empty: any."""
    line: int = 0


@dataclass(frozen=True, slots=True)
class QosPolicy:
    groups: tuple[PortGroup, ...]
    levels: tuple[QosLevel, ...]
    rules: tuple[MatchRule, ...]
    source: str = "<string>"
    _levels: dict[str, QosLevel] = field(default_factory=dict, compare=False, repr=False)

    def level(self, name: str) -> QosLevel:
        if not self._levels:
            self._levels.update((lv.name, lv) for lv in self.levels)
        return self._levels[name]


_SECTIONS = {
    "port-groups": ("port-group", "end-port-group", "end-port-groups"),
    "qos-levels": ("qos-level", "end-qos-level", "end-qos-levels"),
    "qos-match-rules": ("qos-match-rule", "end-qos-match-rule", "end-qos-match-rules"),
}
_UNSUPPORTED_SECTIONS = ("qos-ulps", "qos-setup")
_KEYS = {
    "port-group": ("name", "use", "port-guid", "port-name", "node-type", "partition"),
    "qos-level": ("name", "use", "sl"),
    "qos-match-rule": ("use", "source", "destination", "pkey", "qos-level-name"),
}
_UNSUPPORTED_KEYS = {
    "port-group": ("pkey",),
    "qos-level": ("mtu-limit", "rate-limit", "packet-life", "pkey"),
    "qos-match-rule": ("qos-class", "service-id"),
}
_NODE_TYPES = ("CA", "SWITCH", "ROUTER", "ALL", "SELF")


def parse_qos_policy(text: str, source: str = "<string>") -> QosPolicy:
    """Parse a QoS policy file's text; raises :class:`QosPolicyError`."""
    return _PolicyParser(text, source).run()


def load_qos_policy(path: str | os.PathLike[str]) -> QosPolicy:
    """Read and parse a QoS policy file (UTF-8); a file that cannot be read is a :class:`QosPolicyError`."""
    name = os.fspath(path)
    try:
        text = read_utf8(name)
    except TextFileError as e:
        raise QosPolicyError(name, e.line, e.col, e.reason) from None
    return parse_qos_policy(text, name)


class _PolicyParser:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.groups: list[PortGroup] = []
        self.levels: list[QosLevel] = []
        self.rules: list[MatchRule] = []
        self.where: dict[tuple[str, str], int] = {}
        """(kind, name) -> the line defining it."""
        self.refs: dict[tuple[int, str, str], tuple[int, int]] = {}
        """(rule index, key, name) -> where the rule names it (line, column)."""

    def fail(self, line: int, col: int, what: str) -> QosPolicyError:
        return QosPolicyError(self.source, line, col, what)

    def _lines(self) -> list[tuple[int, int, str]]:
        """(line number, column of the first character, text) of every line that is not blank or a comment."""
        out = []
        for no, raw in enumerate(self.text.splitlines(), 1):
            body = raw.split("#", 1)[0].rstrip()
            for i, c in enumerate(body):
                if ord(c) < 32 and c != "\t":
                    raise self.fail(no, i + 1, f"control character 0x{ord(c):02x}")
            stripped = body.lstrip()
            if stripped:
                out.append((no, len(body) - len(stripped) + 1, stripped))
        return out

    def run(self) -> QosPolicy:
        lines = self._lines()
        i = 0
        seen: set[str] = set()
        while i < len(lines):
            no, col, text = lines[i]
            word = text.lower()
            if word in _UNSUPPORTED_SECTIONS:
                raise self.fail(no, col, f"section {text!r} is not supported by ibfm (port-groups, qos-levels and "
                                         "qos-match-rules are)")  # fmt: skip
            if word not in _SECTIONS:
                raise self.fail(no, col, f"expected a section (port-groups, qos-levels, qos-match-rules), got {text!r}")
            if word in seen:
                raise self.fail(no, col, f"section {word!r} given twice")
            seen.add(word)
            i = self._section(lines, i + 1, word)
        self._check()
        return QosPolicy(tuple(self.groups), tuple(self.levels), tuple(self.rules), self.source)

    def _section(self, lines: list[tuple[int, int, str]], i: int, section: str) -> int:
        item, end_item, end_section = _SECTIONS[section]
        start = lines[i - 1][0]
        while i < len(lines):
            no, col, text = lines[i]
            word = text.lower()
            if word == end_section:
                return i + 1
            if word != item:
                raise self.fail(no, col, f"expected {item!r} or {end_section!r} in {section}, got {text!r}")
            i = self._item(lines, i + 1, item, end_item, no)
        raise self.fail(start, 1, f"section {section!r} has no {end_section!r}")

    def _item(self, lines: list[tuple[int, int, str]], i: int, item: str, end_item: str, start: int) -> int:
        values: dict[str, tuple[str, int, int]] = {}
        while i < len(lines):
            no, col, text = lines[i]
            if text.lower() == end_item:
                self._make(item, values, start)
                return i + 1
            key, sep, value = text.partition(":")
            key = key.strip().lower()
            vcol = col + len(text) - len(value.lstrip()) if value.strip() else col + len(text)
            if not sep:
                raise self.fail(no, col, f"expected 'key: value' or {end_item!r} in {item}, got {text!r}")
            if key in _UNSUPPORTED_KEYS[item]:
                raise self.fail(no, col, f"{item} {key!r} is not supported by ibfm (it takes: "
                                         f"{', '.join(_KEYS[item])})")  # fmt: skip
            if key not in _KEYS[item]:
                raise self.fail(no, col, f"unknown {item} key {key!r} (it takes: {', '.join(_KEYS[item])})")
            if not value.strip():
                raise self.fail(no, vcol, f"{item} {key!r} without a value")
            if key in values and key in ("name", "sl", "qos-level-name", "use"):
                raise self.fail(no, col, f"{item} {key!r} given twice (first at line {values[key][1]})")
            if key in values:  # a list continued on another line: one list (positions of the first line)
                values[key] = (values[key][0] + "," + value.strip(), values[key][1], values[key][2])
            else:
                values[key] = (value.strip(), no, vcol)
            i += 1
        raise self.fail(start, 1, f"{item} has no {end_item!r}")

    def _list(self, value: tuple[str, int, int]) -> list[tuple[str, int, int]]:
        text, no, col = value
        return [(piece.strip(), no, col + at - 1) for piece, at in _items(text) if piece.strip()]

    def _names(self, values: dict[str, tuple[str, int, int]], key: str) -> tuple[str, ...]:
        v = values.get(key)
        return tuple(t for t, _, _ in self._list(v)) if v is not None else ()

    def _num(self, text: str, no: int, col: int, what: str) -> int:
        try:
            return _number(text, what, col)
        except ValueError as e:
            raise self.fail(no, col, str(e).split(": ", 1)[1]) from None

    def _ranges(self, value: tuple[str, int, int], what: str, limit: int) -> tuple[tuple[int, int], ...]:
        out = []
        for text, no, col in self._list(value):
            lo_s, dash, hi_s = text.partition("-")
            lo = self._num(lo_s, no, col, what)
            hi = self._num(hi_s, no, col + len(lo_s) + 1, what) if dash else lo
            if hi > limit or lo > limit:
                raise self.fail(no, col, f"{what} {text!r} beyond {limit:#x}")
            if hi < lo:
                raise self.fail(no, col, f"{what} range {text!r} ends below its start")
            out.append((lo, hi))
        return tuple(out)

    def _make(self, item: str, values: dict[str, tuple[str, int, int]], start: int) -> None:
        name_v = values.get("name")
        if item == "port-group":
            if name_v is None:
                raise self.fail(start, 1, "port-group without a name")
            types: set[str] = set()
            for text, no, col in self._list(values["node-type"]) if "node-type" in values else ():
                if text.upper() not in _NODE_TYPES:
                    raise self.fail(no, col, f"node-type {text!r}: CA, SWITCH, ROUTER, ALL or SELF")
                types.add(text.upper())
            self._define("port-group", name_v)
            guids = values.get("port-guid")
            self.groups.append(
                PortGroup(
                    name=name_v[0],
                    guids=self._ranges(guids, "port GUID", (1 << 64) - 1) if guids is not None else (),
                    port_names=self._names(values, "port-name"),
                    node_types=frozenset(types),
                    partitions=self._names(values, "partition"),
                    line=start,
                )
            )
        elif item == "qos-level":
            if name_v is None:
                raise self.fail(start, 1, "qos-level without a name")
            sl = None
            if "sl" in values:
                text, no, col = values["sl"]
                sl = self._num(text, no, col, "SL")
                if sl > 15:
                    raise self.fail(no, col, f"SL {sl} is not 0..15")
            self._define("qos-level", name_v)
            self.levels.append(QosLevel(name_v[0], sl, start))
        else:
            lv = values.get("qos-level-name")
            if lv is None:
                raise self.fail(start, 1, "qos-match-rule without a qos-level-name")
            self.rules.append(
                MatchRule(
                    level=lv[0],
                    sources=self._names(values, "source"),
                    destinations=self._names(values, "destination"),
                    pkeys=self._ranges(values["pkey"], "P_Key", 0xFFFF) if "pkey" in values else (),
                    line=start,
                )
            )
            for key in ("qos-level-name", "source", "destination"):
                if key in values:
                    for text, no, col in self._list(values[key]):
                        self.refs[(len(self.rules) - 1, key, text)] = (no, col)

    def _define(self, what: str, name_v: tuple[str, int, int]) -> None:
        name, no, col = name_v
        key = (what, name)
        if key in self.where:
            raise self.fail(no, col, f"{what} {name!r} defined twice (first at line {self.where[key]})")
        self.where[key] = no

    def _check(self) -> None:
        """Names a rule uses must be defined (anywhere in the file, as OpenSM resolves them after parsing)."""
        for k, rule in enumerate(self.rules):
            for key, names, what in (
                ("qos-level-name", (rule.level,), "qos-level"),
                ("source", rule.sources, "port-group"),
                ("destination", rule.destinations, "port-group"),
            ):
                for name in names:
                    if (what, name) not in self.where:
                        no, col = self.refs.get((k, key, name), (rule.line, 1))
                        raise self.fail(no, col, f"{key} {name!r}: no {what} of that name")
