"""ibnetdiscover output and ibsim net files: one format family, read and written.

A file is a list of node records::

    vendid=0x2c9                                      (optional key lines)
    devid=0xd2f0
    sysimgguid=0x248a0703005d7bc0
    switchguid=0x248a0703005d7bc0(248a0703005d7bc0)
    Switch  36 "S-248a0703005d7bc0"   # "leaf01" enhanced port 0 lid 1 lmc 0
    [1]     "H-506b4b03007b1e5a"[1](506b4b03007b1e5b)   # "node1 HCA-1" lid 3 4xEDR
    [35]    "S-7cfe900300bdc060"[3]   # "spine01" lid 2 4xEDR

    caguid=0x506b4b03007b1e5a
    Ca      1 "H-506b4b03007b1e5a"    # "node1 HCA-1"
    [1](506b4b03007b1e5b)   "S-248a0703005d7bc0"[1]   # lid 3 lmc 0 "leaf01" lid 1 4xEDR

Headers are ``Switch``, ``Ca``/``Hca`` or ``Rt`` with the port count and a
quoted node id; port lines give ``[local]`` and ``"remote id"[remote]``,
each optionally followed by a ``(port GUID)``, then ibsim's per-port
options ``w=`` (LinkWidthEnabled), ``s=`` (LinkSpeedEnabled), ``e=``
(LinkSpeedExtEnabled) and a comment. The comment carries what
ibnetdiscover saw: NodeDescription, LIDs and the active link rate
(``4xNDR``); ibsim reads the same comments, and so do we.

Reading follows ibsim where ibsim defines the meaning:

- GUIDs not given are allocated as ibsim does: switches from 0x200000 up,
  one GUID each (port 0 shares it); CAs from 0x100000 up, node GUID then one
  per port (port ``p`` is node GUID + ``p``). ``switchguid=`` / ``caguid=``
  / ``rtguid=`` move that counter. A ``(guid)`` on a CA port line sets that
  port's GUID (ibsim ignores it and uses node GUID + port).
- ``vendid=`` and ``sysimgguid=`` apply to the next node only; ``devid=``
  stays until changed.
- Both ends of a link must be listed and agree; a rate in the comment sets
  the width and speed of both ports and overrides ``w=``/``s=``/``e=``.
- ``include FILE`` reads another file (relative to the including one).

Links without a rate get the model's defaults (4x NDR); ibsim itself would
run them at 4x SDR, and it knows no rate above HDR.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TextIO

import numpy as np

from fabric.errors import FormatError, IbfmError
from fabric.fileio import write_text_atomic
from fabric.model import (
    DEFAULT_SPEED,
    DEFAULT_WIDTH,
    MAX_PORTS,
    NO_PEER,
    Fabric,
    FabricBuilder,
    NodeType,
    Speed,
    parse_rate_name,
    rate_name,
)

__all__ = [
    "CA_GUID_BASE",
    "ROUTER_GUID_BASE",
    "SWITCH_GUID_BASE",
    "format_net",
    "parse_net",
    "read_net",
    "write_net",
]

Style = Literal["ibsim", "ibnetdiscover"]

SWITCH_GUID_BASE = 0x200000
"""ibsim's first switch GUID when the file gives none."""
CA_GUID_BASE = 0x100000
"""ibsim's first CA GUID when the file gives none."""
ROUTER_GUID_BASE = 0x300000
"""First router GUID when none is given (ibsim gives routers GUID 0, which no SM accepts)."""

MAX_INCLUDE_DEPTH = 16

_TYPES: dict[str, NodeType] = {
    "Switch": NodeType.SWITCH,
    "Ca": NodeType.CA,
    "Hca": NodeType.CA,
    "Rt": NodeType.ROUTER,
}
_GUID_MAX = (1 << 64) - 1
_KEY_MAX = {
    "vendid": 0xFFFFFF,
    "devid": 0xFFFF,
    "sysimgguid": _GUID_MAX,
    "switchguid": _GUID_MAX,
    "caguid": _GUID_MAX,
    "rtguid": _GUID_MAX,
}
_GUID_KEY = {"switchguid": NodeType.SWITCH, "caguid": NodeType.CA, "rtguid": NodeType.ROUTER}
_ID_PREFIX = {NodeType.SWITCH: "S", NodeType.CA: "H", NodeType.ROUTER: "R"}

_HEADER_RE = re.compile(r'(Switch|Ca|Hca|Rt)\s+(\d+)\s+"([^"]*)"\s*(.*)$')
_PORT_RE = re.compile(
    r'\[(\d+)\]\s*(?:\(\s*(?:0x)?([0-9a-fA-F]+)\s*\))?\s*"([^"]*)"\s*\[(\d+)\]'
    r"\s*(?:\(\s*(?:0x)?([0-9a-fA-F]+)\s*\))?\s*(.*)$"
)
_KEY_RE = re.compile(
    r"(vendid|devid|sysimgguid|switchguid|caguid|rtguid)\s*=\s*(0[xX][0-9a-fA-F]+|\d+)"
    r"(?:\(\s*(?:0x)?([0-9a-fA-F]+)\s*\))?\s*$"
)
_DESC_RE = re.compile(r'#\s*"(.*)"(.*)$')
_SW_LID_RE = re.compile(r"port\s+0\s+lid\s+(\d+)\s+lmc\s+(\d+)")
_CA_LID_RE = re.compile(r"#\s*lid\s+(\d+)\s+lmc\s+(\d+)")
_LID_TAILS = ("#lid", " lid", "\tlid")
_OPT_RE = re.compile(r"([wse])=(0[xX][0-9a-fA-F]+|\d+)$")
_BINARY_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")

# ibsim's per-port option masks -> the model's highest Speed.
_S_BITS = ((4, Speed.QDR), (2, Speed.DDR), (1, Speed.SDR))
_E_BITS = ((16, Speed.XDR), (8, Speed.NDR), (4, Speed.HDR), (2, Speed.EDR), (1, Speed.FDR))


@dataclass(slots=True)
class _Node:
    type: NodeType
    nports: int
    name: str
    desc: str
    guid: int
    sysimg: int
    vendid: int
    devid: int
    port0_guid: int
    lid: int
    lmc: int
    where: tuple[str, int]


@dataclass(slots=True)
class _PortLine:
    node: int
    port: int
    remote: str
    rport: int
    guid: int | None
    rguid: int | None
    width: int | None
    speed: Speed | None
    lid: int | None
    lmc: int
    where: tuple[str, int]


class _Parser:
    """One pass over the lines: records collected, nothing built until all is read."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.by_name: dict[str, int] = {}
        self.ports: dict[tuple[int, int], _PortLine] = {}
        self.next_guid = {
            NodeType.SWITCH: SWITCH_GUID_BASE,
            NodeType.CA: CA_GUID_BASE,
            NodeType.ROUTER: ROUTER_GUID_BASE,
        }
        self.vendid: int | None = None
        self.devid = 0
        self.sysimg: int | None = None
        self.sw_port0: int | None = None
        self.pending: tuple[str, int] | None = None  # first key line not yet used by a header
        self.cur = -1
        self.depth = 0

    # -- lines ---------------------------------------------------------------

    def feed(self, text: str, path: str) -> None:
        bad = _BINARY_RE.search(text)
        if bad:
            bad_line = text.count("\n", 0, bad.start()) + 1
            raise FormatError(path, bad_line, f"binary data (byte {ord(bad.group()):#04x}), not a net file")
        header_match = _HEADER_RE.match
        port_line = self._port_line
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line[0] == "#":
                continue
            c = line[0]
            if c == "[":
                port_line(line, path, lineno)
            elif c in "SCHR" and (m := header_match(line)):
                self._header(m, path, lineno)
            else:
                self._other(line, path, lineno)

    def _other(self, line: str, path: str, lineno: int) -> None:
        word, *rest = line.split(None, 1)
        arg = rest[0].strip() if rest else ""
        if "=" in line and word not in ("include", "do"):
            self._key(line, path, lineno)
            return
        if word == "include":
            self._include(arg, path, lineno)
            return
        if word == "do":
            raise FormatError(path, lineno, f"ibsim console command {_clip(line)!r}: not supported in a topology file")
        if word in _TYPES:
            raise FormatError(path, lineno, f'truncated or malformed {word} header (want {word} N "id")')
        raise FormatError(path, lineno, f"unknown record {_clip(line)!r}")

    def _include(self, name: str, path: str, lineno: int) -> None:
        if not name:
            raise FormatError(path, lineno, "include without a file name")
        if self.depth >= MAX_INCLUDE_DEPTH:
            raise FormatError(path, lineno, f"include nested deeper than {MAX_INCLUDE_DEPTH} (a loop?)")
        base = os.path.dirname(path) if not path.startswith("<") else ""
        target = os.path.join(base, name.strip('"'))
        try:
            text = _read_text(target)
        except OSError as e:
            raise FormatError(path, lineno, f"include {name}: {e.strerror or e}") from None
        self.depth += 1
        try:
            self.feed(text, target)
        finally:
            self.depth -= 1

    def _key(self, line: str, path: str, lineno: int) -> None:
        m = _KEY_RE.match(line)
        if m is None:
            key = line.split("=", 1)[0].strip()
            if key in ("vendid", "devid", "sysimgguid", "switchguid", "caguid", "rtguid"):
                raise FormatError(path, lineno, f"bad value in {_clip(line)!r}")
            raise FormatError(path, lineno, f"unknown record {_clip(line)!r}")
        key, text, extra = m.groups()
        try:
            val = _c_int(text)
        except ValueError:
            raise FormatError(path, lineno, f"bad value in {_clip(line)!r}") from None
        top = _KEY_MAX[key]
        if val > top or (extra is not None and int(extra, 16) > top):
            raise FormatError(path, lineno, f"{key} {text} is above {top:#x}")
        if self.pending is None:
            self.pending = (path, lineno)
        if key == "vendid":
            self.vendid = val
        elif key == "devid":
            self.devid = val
        elif key == "sysimgguid":
            self.sysimg = val
        else:
            if val == 0:
                raise FormatError(path, lineno, f"{key} 0 is not a valid GUID")
            self.next_guid[_GUID_KEY[key]] = val
            if key == "switchguid" and extra is not None:
                self.sw_port0 = int(extra, 16)

    def _header(self, m: re.Match[str], path: str, lineno: int) -> None:
        kind, nports_s, name, rest = m.groups()
        ntype = _TYPES[kind]
        nports = int(nports_s)
        if not 1 <= nports <= MAX_PORTS:
            raise FormatError(path, lineno, f'{kind} "{name}": {nports} ports, outside 1..{MAX_PORTS}')
        if not name:
            raise FormatError(path, lineno, f"{kind} with an empty node id")
        if name in self.by_name:
            first = self.nodes[self.by_name[name]].where
            raise FormatError(path, lineno, f'duplicate node id "{name}" (first at {_at(first, (path, lineno))})')
        desc, lid, lmc = name, 0, 0
        if rest:
            if rest[0] != "#":
                raise FormatError(path, lineno, f"unexpected text after node id: {_clip(rest)!r}")
            dm = _DESC_RE.match(rest)
            if dm:
                desc = dm.group(1)
                if ntype == NodeType.SWITCH and (lm := _SW_LID_RE.search(dm.group(2))):
                    lid, lmc = _lid_lmc(lm, path, lineno)
        guid = self.next_guid[ntype]
        self.next_guid[ntype] = guid + (1 if ntype == NodeType.SWITCH else nports + 1)
        port0 = guid
        if ntype == NodeType.SWITCH and self.sw_port0 is not None:
            port0 = self.sw_port0
        node = _Node(
            ntype,
            nports,
            name,
            desc,
            guid,
            guid if self.sysimg is None else self.sysimg,
            0 if self.vendid is None else self.vendid,
            self.devid,
            port0,
            lid,
            lmc,
            (path, lineno),
        )
        self.vendid = self.sysimg = self.sw_port0 = None
        self.pending = None
        self.cur = len(self.nodes)
        self.by_name[name] = self.cur
        self.nodes.append(node)

    def _port_line(self, line: str, path: str, lineno: int) -> None:
        m = _PORT_RE.match(line)
        if m is None:
            raise FormatError(path, lineno, f'malformed port line {_clip(line)!r} (want [p] "id"[q])')
        if self.cur < 0 or self.pending is not None:
            raise FormatError(path, lineno, "port line outside a node record")
        port_s, g, remote, rport_s, rg, rest = m.groups()
        node = self.nodes[self.cur]
        port = int(port_s)
        if not 1 <= port <= node.nports:
            raise FormatError(path, lineno, f'"{node.name}" has no port {port} (ports 1..{node.nports})')
        key = (self.cur, port)
        if key in self.ports:
            first = _at(self.ports[key].where, (path, lineno))
            raise FormatError(path, lineno, f'"{node.name}" port {port} listed twice (first at {first})')
        rate: tuple[int | None, Speed | None] = (None, None)
        lid: int | None = None
        lmc = 0
        if rest:
            if rest[0] == "#":
                comment = rest
            else:
                opts, hash_, comment = rest.partition("#")
                comment = hash_ + comment
                if opts.strip():
                    rate = _port_options(opts.split(), path, lineno)
            if comment:
                # ibnetdiscover ends the comment with "lid N RATE" (the peer's LID, the active rate).
                parts = comment.rsplit(None, 2)
                if len(parts) == 3 and parts[1].isdigit() and parts[0].endswith(_LID_TAILS):
                    rate = _rate(parts[2], path, lineno)
                if node.type != NodeType.SWITCH and (lm := _CA_LID_RE.match(comment)):
                    lid, lmc = _lid_lmc(lm, path, lineno)
        if (g is not None and len(g) > 16) or (rg is not None and len(rg) > 16):
            raise FormatError(path, lineno, "port GUID longer than 64 bits")
        self.ports[key] = _PortLine(
            self.cur,
            port,
            remote,
            int(rport_s),
            None if g is None else int(g, 16),
            None if rg is None else int(rg, 16),
            rate[0],
            rate[1],
            lid,
            lmc,
            (path, lineno),
        )

    # -- the whole file ------------------------------------------------------------

    def finish(self, path: str) -> Fabric:
        if self.pending is not None:
            pending_path, ln = self.pending
            raise FormatError(pending_path, ln, "truncated record: key lines without a node header after them")
        nodes, by_name, ports = self.nodes, self.by_name, self.ports

        # CA and router port GUIDs: node GUID + port unless a line says otherwise.
        port_guids: list[list[int]] = []
        for nd in nodes:
            if nd.type == NodeType.SWITCH:
                port_guids.append([nd.port0_guid] * (nd.nports + 1))
            else:
                port_guids.append([0] + [nd.guid + p for p in range(1, nd.nports + 1)])
        given: dict[tuple[int, int], tuple[int, tuple[str, int]]] = {}

        links: list[tuple[int, int, int, int]] = []
        rates: list[tuple[int, int, int, int, int | None, Speed | None]] = []
        for (n, p), pl in ports.items():
            src = nodes[n]
            m = by_name.get(pl.remote)
            if m is None:
                raise FormatError(*pl.where, f'"{src.name}"[{p}] links to undefined node "{pl.remote}"')
            dst = nodes[m]
            q = pl.rport
            if not 1 <= q <= dst.nports:
                raise FormatError(
                    *pl.where, f'"{src.name}"[{p}] links to "{dst.name}" port {q}, which has ports 1..{dst.nports}'
                )
            if (m, q) == (n, p):
                raise FormatError(*pl.where, f'"{src.name}"[{p}] links to itself')
            back = ports.get((m, q))
            if back is None:
                raise FormatError(
                    *pl.where,
                    f'"{src.name}"[{p}] -> "{dst.name}"[{q}], but "{dst.name}" does not list port {q}'
                    f" ({_at(dst.where, pl.where)})",
                )
            if back.remote != src.name or back.rport != p:
                raise FormatError(
                    *pl.where,
                    f'"{src.name}"[{p}] -> "{dst.name}"[{q}], but "{dst.name}"[{q}] -> '
                    f'"{back.remote}"[{back.rport}] ({_at(back.where, pl.where)})',
                )
            if pl.guid is not None:
                _claim(given, (n, p), pl.guid, pl.where, nodes)
            if pl.rguid is not None:
                _claim(given, (m, q), pl.rguid, pl.where, nodes)
            if (n, p) > (m, q):
                continue
            if pl.width is not None and back.width is not None and (pl.width != back.width or pl.speed != back.speed):
                raise FormatError(
                    *back.where,
                    f'link "{src.name}"[{p}] - "{dst.name}"[{q}]: rate {rate_name(back.width, back.speed or 0)} '
                    f"here but {rate_name(pl.width, pl.speed or 0)} at {_at(pl.where, back.where)}",
                )
            links.append((n, p, m, q))
            width = pl.width if pl.width is not None else back.width
            speed = pl.speed if pl.speed is not None else back.speed
            if width is not None or speed is not None:
                rates.append((n, p, m, q, width, speed))

        for (n, p), (g, _where) in given.items():
            if nodes[n].type != NodeType.SWITCH:
                port_guids[n][p] = g
        _check_guids(nodes, port_guids, given)

        fb = FabricBuilder()
        for nd, pg in zip(nodes, port_guids, strict=True):
            fb.add_node(
                nd.type,
                nd.nports,
                nd.name,
                desc=nd.desc,
                guid=nd.guid,
                sysimg_guid=nd.sysimg,
                port_guids=pg,
                vendor_id=nd.vendid,
                device_id=nd.devid,
            )
        for n, p, m, q, width, speed in rates:
            width_cap = DEFAULT_WIDTH if width is None else width
            speed_cap = DEFAULT_SPEED if speed is None else speed
            fb.set_port(n, p, width_cap=width_cap, speed_cap=speed_cap)
            fb.set_port(m, q, width_cap=width_cap, speed_cap=speed_cap)
        for n, p, m, q in links:
            fb.connect(n, p, m, q)
        fabric = fb.build()
        for i, nd in enumerate(nodes):
            if nd.type == NodeType.SWITCH:
                fabric.lid[i, 0] = nd.lid
                fabric.lmc[i, 0] = nd.lmc
        for (n, p), pl in ports.items():
            if pl.lid is not None:
                fabric.lid[n, p] = pl.lid
                fabric.lmc[n, p] = pl.lmc
        return fabric


def _c_int(text: str) -> int:
    """A number as C's ``strtoull(s, NULL, 0)`` reads it (ibsim does): ``0x`` hex, leading ``0`` octal."""
    if len(text) > 1 and text[0] == "0" and text[1] not in "xX":
        return int(text, 8)
    return int(text, 0)


def _lid_lmc(m: re.Match[str], path: str, lineno: int) -> tuple[int, int]:
    lid, lmc = int(m.group(1)), int(m.group(2))
    if lid > 0xFFFF or lmc > 7:
        raise FormatError(path, lineno, f"LID {lid} LMC {lmc} out of range (LID 0..0xffff, LMC 0..7)")
    return lid, lmc


_RATES: dict[str, tuple[int, Speed]] = {}


def _rate(text: str, path: str, lineno: int) -> tuple[int, Speed]:
    """``4xHDR`` -> (width code, Speed), remembered: a big fabric has only a few rates."""
    r = _RATES.get(text)
    if r is None:
        try:
            r = parse_rate_name(text)
        except ValueError:
            raise FormatError(path, lineno, f"bad link rate {text!r}") from None
        _RATES[text] = r
    return r


def _port_options(tokens: list[str], path: str, lineno: int) -> tuple[int | None, Speed | None]:
    """ibsim's ``w=`` / ``s=`` / ``e=`` options -> (width mask, highest speed)."""
    width: int | None = None
    sbits = ebits = 0
    for tok in tokens:
        om = _OPT_RE.match(tok)
        if om is None:
            raise FormatError(path, lineno, f"bad port option {tok!r} (ibsim takes w=, s=, e=)")
        try:
            k, v = om.group(1), _c_int(om.group(2))
        except ValueError:
            raise FormatError(path, lineno, f"bad port option {tok!r}") from None
        if k == "w":
            if not 1 <= v <= 31:
                raise FormatError(path, lineno, f"w={v}: LinkWidthEnabled must be 1..31")
            width = v
        elif k == "s":
            if not 0 <= v <= 7:
                raise FormatError(path, lineno, f"s={v}: LinkSpeedEnabled must be 0..7")
            sbits = v
        else:
            if not 0 <= v <= 31:
                raise FormatError(path, lineno, f"e={v}: LinkSpeedExtEnabled must be 0..31")
            ebits = v
    speed: Speed | None = None
    for bit, s in _E_BITS:
        if ebits & bit:
            speed = s
            break
    else:
        for bit, s in _S_BITS:
            if sbits & bit:
                speed = s
                break
    return width, speed


def _claim(
    given: dict[tuple[int, int], tuple[int, tuple[str, int]]],
    key: tuple[int, int],
    guid: int,
    where: tuple[str, int],
    nodes: list[_Node],
) -> None:
    old = given.get(key)
    if old is None:
        given[key] = (guid, where)
    elif old[0] != guid:
        nd = nodes[key[0]]
        raise FormatError(
            *where, f'"{nd.name}"[{key[1]}]: port GUID {guid:#x} here but {old[0]:#x} at {_at(old[1], where)}'
        )


def _check_guids(
    nodes: list[_Node],
    port_guids: list[list[int]],
    given: dict[tuple[int, int], tuple[int, tuple[str, int]]],
) -> None:
    seen: dict[int, int] = {}
    for i, nd in enumerate(nodes):
        j = seen.setdefault(nd.guid, i)
        if j != i:
            raise FormatError(
                *nd.where,
                f'duplicate node GUID {nd.guid:#x}: "{nd.name}" and "{nodes[j].name}"'
                f" ({_at(nodes[j].where, nd.where)})",
            )
    ports: dict[int, tuple[int, int]] = {}
    for i, nd in enumerate(nodes):
        if nd.type == NodeType.SWITCH:
            pairs: Iterable[tuple[int, int]] = ((0, port_guids[i][0]),)
        else:
            pairs = ((p, port_guids[i][p]) for p in range(1, nd.nports + 1))
        for p, g in pairs:
            if g == 0:
                raise FormatError(*nd.where, f'"{nd.name}" port {p}: GUID 0 is not valid')
            prev = ports.setdefault(g, (i, p))
            if prev != (i, p):
                where = given[(i, p)][1] if (i, p) in given else nd.where
                other = nodes[prev[0]]
                raise FormatError(
                    *where,
                    f'duplicate port GUID {g:#x}: "{nd.name}"[{p}] and "{other.name}"[{prev[1]}]',
                )


def _at(other: tuple[str, int], here: tuple[str, int]) -> str:
    """Another place in the input: ``line N`` in the same file, ``file:N`` in an included one."""
    return f"line {other[1]}" if other[0] == here[0] else f"{other[0]}:{other[1]}"


def _clip(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _read_text(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    return _decode(data, path)


def _decode(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise FormatError(path, line, f"not UTF-8 text (byte {data[e.start]:#04x}), not a net file") from None


# -- reading -------------------------------------------------------------------------------------------


def parse_net(text: str, path: str = "<string>") -> Fabric:
    """Parse ibnetdiscover output or an ibsim net file; raises FormatError naming path:line."""
    p = _Parser()
    p.feed(text, path)
    try:
        return p.finish(path)
    except FormatError:
        raise
    except IbfmError as e:  # the builder's own checks: the file described an impossible fabric
        raise FormatError(path, None, str(e)) from None


def read_net(path: str | os.PathLike[str]) -> Fabric:
    """Read a net file from disk (see :func:`parse_net`)."""
    p = os.fspath(path)
    try:
        text = _read_text(p)
    except OSError as e:
        raise FormatError(p, None, e.strerror or str(e)) from None
    return parse_net(text, p)


# -- writing -------------------------------------------------------------------------------------------


def _check_text(what: str, s: str, *, quoted_id: bool) -> None:
    if "\n" in s or "\r" in s:
        raise IbfmError(f"{what} {s!r}: a newline cannot be written to a net file")
    if quoted_id and ('"' in s or "#" in s or "@" in s or not s):
        raise IbfmError(f"node id {s!r}: ids must be non-empty, without '\"', '#' or '@' (ibsim reserves them)")


def format_net(fabric: Fabric, style: Style = "ibsim") -> str:
    """The fabric as a net file.

    ``style="ibsim"``: node ids are the fabric's names, key lines appear only
    where ibsim's defaults would differ (GUIDs not in its allocation order,
    vendor, device, system image). ``style="ibnetdiscover"``: ids are
    ``S-``/``H-``/``R-`` and the GUID, every node carries all its key lines,
    as ``ibnetdiscover`` prints. Both carry NodeDescription, LIDs and each
    link's rate in ibnetdiscover's comments, which ibsim reads too.
    Cabled ports are written whether the link is up or not.
    """
    if style not in ("ibsim", "ibnetdiscover"):
        raise ValueError(f"unknown net file style {style!r}")
    disc = style == "ibnetdiscover"
    n = fabric.n_nodes
    types = fabric.node_type.tolist()
    nports = fabric.nports.tolist()
    guids = fabric.node_guid.tolist()
    sysimg = fabric.sysimg_guid.tolist()
    vend = fabric.vendor_id.tolist()
    dev = fabric.device_id.tolist()
    pguid = fabric.port_guid.tolist()
    peer_n = fabric.peer_node.tolist()
    peer_p = fabric.peer_port.tolist()
    lid = fabric.lid.tolist()
    lmc = fabric.lmc.tolist()
    descs = fabric.descs
    for d in descs:
        _check_text("NodeDescription", d, quoted_id=False)
    if disc:
        ids = [f"{_ID_PREFIX[NodeType(t)]}-{g:016x}" for t, g in zip(types, guids, strict=True)]
    else:
        ids = list(fabric.names)
        for s in ids:
            _check_text("node id", s, quoted_id=True)

    # Each link's rate: the active one when up, else the best both ends could train to.
    up = fabric.up_mask()
    w_act = np.where(up, fabric.width_active, 0)
    s_act = np.where(up, fabric.speed_active, 0)
    cabled = fabric.peer_node != NO_PEER
    pn = np.where(cabled, fabric.peer_node, 0)
    pp = np.where(cabled, fabric.peer_port, 0)
    w_common = fabric.width_cap & fabric.width_cap[pn, pp]
    s_common = np.minimum(fabric.speed_cap, fabric.speed_cap[pn, pp])
    best_w = np.zeros_like(w_common)
    for code in (1, 16, 2, 4, 8):  # ascending, so the widest set bit wins
        best_w = np.where(w_common & code, code, best_w)
    width = np.where(up & (w_act > 0), w_act, best_w).tolist()
    speed = np.where(up & (s_act > 0), s_act, s_common).tolist()
    rate_cache: dict[tuple[int, int], str] = {}

    def rate(i: int, p: int) -> str:
        key = (width[i][p], speed[i][p])
        r = rate_cache.get(key)
        if r is None:
            r = rate_name(*key) if key[0] in (1, 2, 4, 8, 16) and key[1] else ""
            rate_cache[key] = r
        return r

    order = list(range(n))
    if disc:
        rank = {NodeType.SWITCH: 0, NodeType.CA: 1, NodeType.ROUTER: 2}
        order.sort(key=lambda i: rank[NodeType(types[i])])

    out: list[str] = []
    if disc:
        out.append("#\n# Topology file: generated by ibfm\n#\n")
    else:
        counts = fabric.summary()
        out.append(
            f"# ibsim net file written by ibfm: {counts['switches']} switches, {counts['cas']} CAs, "
            f"{counts['links']} links\n"
        )
    next_guid = {
        NodeType.SWITCH: SWITCH_GUID_BASE,
        NodeType.CA: CA_GUID_BASE,
        NodeType.ROUTER: ROUTER_GUID_BASE,
    }
    cur_devid = 0
    sw = int(NodeType.SWITCH)
    for i in order:
        t = NodeType(types[i])
        k = nports[i]
        g = guids[i]
        is_sw = t == sw
        out.append("\n")
        key = "switchguid" if is_sw else ("caguid" if t == NodeType.CA else "rtguid")
        if disc:
            out.append(f"vendid={vend[i]:#x}\ndevid={dev[i]:#x}\nsysimgguid={sysimg[i]:#x}\n")
            out.append(f"{key}={g:#x}({pguid[i][0]:x})\n" if is_sw else f"{key}={g:#x}\n")
        else:
            if vend[i]:
                out.append(f"vendid={vend[i]:#x}\n")
            if dev[i] != cur_devid:
                out.append(f"devid={dev[i]:#x}\n")
                cur_devid = dev[i]
            if sysimg[i] != g:
                out.append(f"sysimgguid={sysimg[i]:#x}\n")
            if is_sw and pguid[i][0] != g:
                out.append(f"{key}={g:#x}({pguid[i][0]:x})\n")
            elif g != next_guid[t]:
                out.append(f"{key}={g:#x}\n")
        next_guid[t] = g + (1 if is_sw else k + 1)
        head = "Switch" if is_sw else ("Rt" if t == NodeType.ROUTER else ("Ca" if disc else "Hca"))
        if is_sw and (disc or descs[i] != ids[i] or lid[i][0] or lmc[i][0]):
            out.append(f'{head}\t{k} "{ids[i]}"\t\t# "{descs[i]}" base port 0 lid {lid[i][0]} lmc {lmc[i][0]}\n')
        elif not is_sw and (disc or descs[i] != ids[i]):
            out.append(f'{head}\t{k} "{ids[i]}"\t\t# "{descs[i]}"\n')
        else:
            out.append(f'{head}\t{k} "{ids[i]}"\n')
        pn_i, pp_i = peer_n[i], peer_p[i]
        for p in range(1, k + 1):
            m = pn_i[p]
            if m == NO_PEER:
                continue
            q = pp_i[p]
            m_sw = types[m] == sw
            rlid = lid[m][0] if m_sw else lid[m][q]
            # A CA port's GUID goes in the line when ibsim would not derive it (node GUID + port).
            rg = "" if m_sw or (not disc and pguid[m][q] == guids[m] + q) else f"({pguid[m][q]:x}) "
            remote = f'"{ids[m]}"[{q}]{rg}'
            tail = f"lid {rlid} {rate(i, p)}".rstrip()
            if is_sw:
                out.append(f'[{p}]\t{remote}\t\t# "{descs[m]}" {tail}\n')
            else:
                lg = "" if not disc and pguid[i][p] == g + p else f"({pguid[i][p]:x}) "
                out.append(f'[{p}]{lg}\t{remote}\t\t# lid {lid[i][p]} lmc {lmc[i][p]} "{descs[m]}" {tail}\n')
    return "".join(out)


def write_net(
    fabric: Fabric,
    dest: str | os.PathLike[str] | TextIO,
    *,
    style: Style = "ibsim",
) -> None:
    """Write the fabric as a net file (see :func:`format_net`); a path is replaced atomically."""
    text = format_net(fabric, style)
    if isinstance(dest, (str, os.PathLike)):
        write_text_atomic(dest, text)
    else:
        dest.write(text)
        dest.flush()
