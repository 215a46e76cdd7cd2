"""OpenSM's partitions file (``partitions.conf``), parsed into an immutable, merged model.

The format is OpenSM 3.3.23's (its man page, section PARTITION CONFIGURATION, and
``osm_prtn_config.c``); what a statement means is what ``osm_prtn.c`` makes of it::

    # comment to the end of the line
    Name[=PKey][,flag[=value]]* : member[,member]* ;

    member:  PortGUID[=full|limited|both] | ALL | ALL_CAS | ALL_SWITCHES
             | ALL_ROUTERS | SELF | NONE, each with the same optional =membership;
             or a multicast group, which takes the rest of its line:
             mgid=GID[,rate=N][,mtu=N][,sl=N][,scope=N][,Q_Key=N][,TClass=N][,FlowLabel=N]
    flags:   ipoib, indx0, defmember=full|limited|both, and the group flags
             rate, mtu, sl, scope, Q_Key, TClass, FlowLabel (for the IPoIB broadcast group)

As OpenSM reads it:

- A statement ends at ``;`` and may span lines after its ``:``; the definition and
  its ``:`` are on one line. Members are separated by commas or line ends; empty
  items (``a,,b``, a trailing comma) are skipped. Several statements may share a line.
- Keywords, flags and membership words are matched by prefix, in OpenSM's order
  (``A`` is ALL, ``ALL_`` is ALL_CAS, ``S`` is SELF; ``s`` is scope before sl,
  ``i`` is ipoib; ``limi`` is limited as in OpenSM's own example). ``indx0`` and
  ``mgid`` are matched exactly. Numbers are C literals: decimal or ``0x`` hex.
- A definition whose name starts with a digit and has no ``=`` is a P_Key alone.
  Only the low 15 bits of a P_Key are the key: ``0xffff`` is the Default
  partition, ``0x8005`` is ``0x0005``. A definition without a P_Key joins the
  partition of that name if one exists (``Default`` is 0x7fff), else gets the
  next free key counting from 1, as OpenSM's ``generate_pkey``.
- Membership is limited unless the member or the statement's ``defmember`` says
  otherwise; ``defmember`` and ``indx0`` apply to the members of their own
  statement (each :class:`Member` carries them). Without OpenSM's
  ``--allow_both_pkeys``, ``both`` acts as full (``plan`` decides that).
- Two statements with one P_Key are one partition: members in file order (a later
  member overrides an earlier one for a port), the first name, IPoIB if any
  statement says so.
- OpenSM always creates ``Default=0x7fff`` before it reads the file: with a file,
  as ``ALL=limited, SELF=full`` without an IPoIB group; the file's own 0x7fff
  statements add to it (so their members override per port). With no file at all
  it is ``Default=0x7fff,ipoib : ALL=full, SELF=full`` (:func:`default_partitions`).
- An IPv4/IPv6-over-IB group (``ff1x:401b:...``, ``ff1x:601b:...``) gets the
  partition's P_Key (full-member form) written into its MGID; its P_Key bits
  must be 0 or that key, and its rate and mtu those of its partition's statement.

Where ibfm is stricter than OpenSM, on purpose: OpenSM logs a warning and goes on,
or reads the file differently than it reads, and so silently loses a rule; here
each is a :class:`PartitionConfigError` naming file, line and column:

- an unknown partition flag or group flag (OpenSM: ignored, so a misspelt
  ``ipoib`` loses the broadcast group; a member written after an ``mgid`` on its
  line is read as a flag and lost); a value on ``ipoib`` or ``indx0``;
- an unknown membership word (OpenSM: limited), and an empty one, ``0x1=``
  (OpenSM: full); a value with spaces in it, ``=full x`` (OpenSM: limited);
- a flag without a value, or with one outside its range: mtu a code 1..5, rate
  an IBA rate code 2..24, sl 0..15, scope 1..15, Q_Key 32 bits, TClass 8 bits,
  FlowLabel 20 bits (OpenSM: skipped, truncated, or ``mtu=0`` kept as 0); one flag
  given twice in a statement with two values (scope may repeat: each one makes a
  group, as in OpenSM);
- numbers with trailing junk, a sign or a leading zero (OpenSM's ``strtoul``
  stops at junk and reads ``0123`` as octal), GUIDs of 0 or above 64 bits, P_Keys
  above 16 bits (OpenSM truncates) and P_Keys whose 15-bit key is 0 (OpenSM
  quietly generates one instead);
- one name for two P_Keys (OpenSM allows it and then merges name-only statements
  into whichever came first); a name-only statement naming a partition only by a
  second name; an explicit P_Key equal to one generated earlier for another
  partition (OpenSM merges the two);
- two statements of one P_Key giving a group flag two values, or a later one
  changing the broadcast group an earlier ``ipoib`` statement created with the
  defaults (OpenSM keeps the first group as it is), or an ``ipoib`` statement
  without a group flag an earlier statement gave (OpenSM makes the group from its
  own statement's flags). A later statement that does not give the SL keeps the
  SL given before (OpenSM would reset it to 0); ``scope`` adds up;
- an MGID line repeating the IPoIB broadcast group of its partition;
- an MGID that is not multicast, does not parse, appears twice, or is an IP
  group whose P_Key bits, rate or mtu disagree with its partition (OpenSM: the
  group is skipped);
- a ``:`` in a member list (a missing ``;`` before a new definition, or OpenSM's
  own ``ShareIO = 0x80 : defmember=limited : ...`` example, which OpenSM 3.3.23
  rejects as a bad PortGUID), a ``;`` without a definition, and a statement without
  its ``;`` at the end of the file (OpenSM takes it as ended);
- a line over 4094 characters (OpenSM's ``fgets`` cuts it and reads the rest as a
  new line), a NUL or other control character (a CR is a blank, so CRLF files
  read as they look); ``=full`` with no port before it (OpenSM: skipped).

OpenSM answers any parse error by dropping the whole file and running as if there
were none (``osm_prtn_make_partitions``: "retrying with default config"); ibfm
raises, and the caller decides.

Rules that need the fabric (a GUID not on the subnet, a full PKeyTable) are not
parse errors: :mod:`sm.partitions.plan` reports them.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, cast

from fabric.errors import ConfigFileError
from fabric.fileio import TextFileError, read_utf8

__all__ = [
    "DEFAULT_PKEY",
    "IPOIB_DEFAULT_MTU",
    "IPOIB_DEFAULT_QKEY",
    "IPOIB_DEFAULT_RATE",
    "IPOIB_DEFAULT_SCOPE",
    "McGroupSpec",
    "Member",
    "MemberKind",
    "Membership",
    "Partition",
    "PartitionConfig",
    "PartitionConfigError",
    "default_partitions",
    "load_partitions",
    "parse_partitions",
]

MemberKind = Literal["guid", "ALL", "ALL_CAS", "ALL_SWITCHES", "ALL_ROUTERS", "SELF"]
Membership = Literal["full", "limited", "both"]

DEFAULT_PKEY = 0x7FFF
"""The Default partition's key (IB_DEFAULT_PARTIAL_PKEY)."""
IPOIB_DEFAULT_RATE = 3  # 10 Gb/s (OSM_DEFAULT_MGRP_RATE)
IPOIB_DEFAULT_MTU = 4  # 2048 (OSM_DEFAULT_MGRP_MTU)
IPOIB_DEFAULT_SCOPE = 2  # link-local (OSM_DEFAULT_MGRP_SCOPE)
IPOIB_DEFAULT_QKEY = 0x0B1B  # OSM_IPOIB_BROADCAST_MGRP_QKEY
MAX_LINE = 4094
"""Longest line OpenSM reads whole (``fgets`` into 4096 bytes, minus one)."""

_MTU_CODES = range(1, 6)  # 256 .. 4096
_RATE_CODES = range(2, 25)  # 2.5 Gb/s .. 1200 Gb/s (OpenSM 3.3.23 names up to 22, 600 Gb/s)
_GROUP_FLAGS = ("mtu", "rate", "scope", "Q_Key", "TClass", "sl", "FlowLabel")  # parse_group_flag's order
_FLAG_RANGE: dict[str, tuple[int, int, str]] = {
    "mtu": (1, 5, "an MTU code 1..5 (256..4096 bytes)"),
    "rate": (2, 24, "an IBA rate code 2..24"),
    "scope": (1, 15, "a scope 1..15"),
    "Q_Key": (0, 0xFFFF_FFFF, "32 bits"),
    "TClass": (0, 0xFF, "8 bits"),
    "sl": (0, 15, "an SL 0..15"),
    "FlowLabel": (0, 0xF_FFFF, "20 bits"),
}
# partition_add_port's order
_KEYWORDS: tuple[MemberKind, ...] = ("ALL", "ALL_CAS", "ALL_SWITCHES", "ALL_ROUTERS", "SELF")
_SPACE = " \t\r"
_IP_SIGNATURES = (0x401B, 0x601B)
_BROADCAST_FLAGS = ("mtu", "rate", "Q_Key", "TClass", "FlowLabel")  # what the IPoIB group keeps from its statement
_BROADCAST_TEMPLATE = 0xFF12_401B_FFFF_0000_0000_0000_FFFF_FFFF  # osm_ipoib_broadcast_mgid, P_Key bits 0xffff


class PartitionConfigError(ConfigFileError):
    """A partitions file OpenSM would read differently than it reads: ``FILE:LINE:COL: what``."""



@dataclass(frozen=True, slots=True)
class Member:
    """One member item: a port GUID or a keyword, with its membership resolved.

    ``indx0`` is its statement's ``indx0`` flag. ``line`` and ``col`` locate it
    (0 for the implicit Default members).
    """

    kind: MemberKind
    guid: int | None
    membership: Membership
    indx0: bool = False
    line: int = 0
    col: int = 0


@dataclass(frozen=True, slots=True)
class McGroupSpec:
    """A multicast group line, its flags as written (None where not given).

    An unset flag inherits the value of its partition statement, then OpenSM's
    default (rate 3, mtu 4, sl 0, scope 2, Q_Key 0x0b1b for IP groups else 0,
    TClass 0, FlowLabel 0); TClass is not inherited (as ``mgroup_create``). ``scope``
    holds every scope given, ascending: one group per scope. ``mgid`` is the 128-bit
    MGID, with the P_Key filled in for IP groups.
    """

    mgid: int
    rate: int | None = None
    mtu: int | None = None
    sl: int | None = None
    scope: tuple[int, ...] | None = None
    q_key: int | None = None
    tclass: int | None = None
    flow_label: int | None = None
    line: int = 0


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition, all the statements of its P_Key merged.

    ``pkey`` is the 15-bit key. ``mtu`` .. ``flow_label`` are the IPoIB broadcast
    group's flags as written (None: not given; see :class:`McGroupSpec` for the
    defaults). ``defmember`` is the first statement's (each :class:`Member` has its
    own statement's applied); ``indx0`` is set when any statement has it.
    ``generated``: the key was generated, none was written. ``line``: the first
    statement's line, 0 for an implicit Default. OpenSM applies ``sl`` (to the partition's
    paths and groups) only with QoS on (``--qos``); without it the SL is 0.
    """

    name: str
    pkey: int
    indx0: bool
    ipoib: bool
    mtu: int | None
    rate: int | None
    sl: int | None
    scope: tuple[int, ...] | None
    defmember: Membership
    members: tuple[Member, ...]
    groups: tuple[McGroupSpec, ...]
    line: int
    q_key: int | None = None
    tclass: int | None = None
    flow_label: int | None = None
    generated: bool = False


@dataclass(frozen=True, slots=True)
class PartitionConfig:
    """Every partition of a file (or OpenSM's default), Default first, then in file order."""

    partitions: tuple[Partition, ...]
    source: str

    def by_pkey(self, pkey: int) -> Partition | None:
        """The partition of a P_Key (its low 15 bits), or None."""
        key = pkey & 0x7FFF
        return next((p for p in self.partitions if p.pkey == key), None)

    @property
    def default(self) -> Partition:
        """The Default partition (0x7fff), always present."""
        p = self.by_pkey(DEFAULT_PKEY)
        assert p is not None
        return p

    def __iter__(self) -> Iterator[Partition]:
        return iter(self.partitions)

    def __len__(self) -> int:
        return len(self.partitions)


def default_partitions(source: str = "<no partitions file>") -> PartitionConfig:
    """OpenSM's configuration when there is no file: ``Default=0x7fff,ipoib : ALL=full, SELF=full``."""
    members = (Member("ALL", None, "full"), Member("SELF", None, "full"))
    p = Partition("Default", DEFAULT_PKEY, False, True, None, None, None, None, "limited", members, (), 0)
    return PartitionConfig((p,), source)


def parse_partitions(text: str, source: str = "<string>") -> PartitionConfig:
    """Parse the text of a partitions file; raises :class:`PartitionConfigError`."""
    return _Parser(text, source).run()


def load_partitions(path: str | os.PathLike[str], *, missing_ok: bool = False) -> PartitionConfig:
    """Read and parse a partitions file (UTF-8).

    A file that does not exist is an error, or with ``missing_ok`` OpenSM's default
    configuration (:func:`default_partitions`), as OpenSM runs without its file.
    """
    name = os.fspath(path)
    try:
        text = read_utf8(name)
    except TextFileError as e:
        if e.missing and missing_ok:
            return default_partitions(name)
        raise PartitionConfigError(name, e.line, e.col, e.reason) from None
    return parse_partitions(text, name)


# -- the parser ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Tok:
    """A piece of a line, stripped, with its 1-based column (of where it would start if empty)."""

    text: str
    col: int


def _split(line: str, start: int, end: int, sep: str) -> list[_Tok]:
    """``line[start:end]`` split at ``sep``; each piece stripped of blanks, with its column."""
    out: list[_Tok] = []
    i = start
    while True:
        j = line.find(sep, i, end)
        stop = end if j < 0 else j
        out.append(_strip(line, i, stop))
        if j < 0:
            return out
        i = j + 1


def _strip(line: str, start: int, end: int) -> _Tok:
    while start < end and line[start] in _SPACE:
        start += 1
    while end > start and line[end - 1] in _SPACE:
        end -= 1
    return _Tok(line[start:end], start + 1)


def _pair(tok: _Tok) -> tuple[_Tok, _Tok | None]:
    """``name[=value]`` -> (name, value or None), each stripped and located."""
    i = tok.text.find("=")
    if i < 0:
        return tok, None
    name = _strip(tok.text, 0, i)
    value = _strip(tok.text, i + 1, len(tok.text))
    return _Tok(name.text, tok.col + name.col - 1), _Tok(value.text, tok.col + value.col - 1)


def _prefix_of(word: str, full: str) -> bool:
    """OpenSM's ``!strncmp(word, full, strlen(word))`` for a non-empty word."""
    return bool(word) and full.startswith(word)


@dataclass(slots=True)
class _Flags:
    """The flags of one statement, with where each was given."""

    values: dict[str, int] = field(default_factory=dict)
    where: dict[str, int] = field(default_factory=dict)  # flag -> column
    scopes: list[int] = field(default_factory=list)
    ipoib: bool = False
    ipoib_col: int = 0
    indx0: bool = False
    defmember: Membership = "limited"


@dataclass(slots=True)
class _Build:
    """A partition being assembled from its statements."""

    name: str
    pkey: int
    line: int
    generated: bool = False
    ipoib: bool = False
    ipoib_line: int = 0
    indx0: bool = False
    defmember: Membership | None = None
    values: dict[str, tuple[int, int]] = field(default_factory=dict)  # flag -> (value, line)
    scopes: set[int] = field(default_factory=set)
    members: list[Member] = field(default_factory=list)
    groups: list[McGroupSpec] = field(default_factory=list)

    def freeze(self) -> Partition:
        def v(flag: str) -> int | None:
            got = self.values.get(flag)
            return None if got is None else got[0]

        return Partition(
            name=self.name,
            pkey=self.pkey,
            indx0=self.indx0,
            ipoib=self.ipoib,
            mtu=v("mtu"),
            rate=v("rate"),
            sl=v("sl"),
            scope=tuple(sorted(self.scopes)) or None,
            defmember=self.defmember or "limited",
            members=tuple(self.members),
            groups=tuple(self.groups),
            line=self.line,
            q_key=v("Q_Key"),
            tclass=v("TClass"),
            flow_label=v("FlowLabel"),
            generated=self.generated,
        )


@dataclass(slots=True)
class _Statement:
    part: _Build
    flags: _Flags
    line: int
    last: tuple[int, int]  # (line, column after) of its last non-blank character


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.source = source
        self.parts: dict[int, _Build] = {}
        self.names: dict[str, int] = {}  # every name written -> its P_Key
        self.counter = 0  # generate_pkey's global_pkey_counter
        self.mgids: dict[int, int] = {}  # MGID -> line
        self.stmt: _Statement | None = None
        default = _Build("Default", DEFAULT_PKEY, 0)
        default.members += [Member("ALL", None, "limited"), Member("SELF", None, "full")]
        self.parts[DEFAULT_PKEY] = default
        self.names["Default"] = DEFAULT_PKEY

    def fail(self, line: int, col: int, what: str) -> PartitionConfigError:
        return PartitionConfigError(self.source, line, col, what)

    # -- lines and statements --

    def run(self) -> PartitionConfig:
        for lineno, raw in enumerate(self.text.split("\n"), 1):
            self._check_chars(lineno, raw)
            cut = raw.find("#")
            line = raw if cut < 0 else raw[:cut]
            pos = 0
            while True:
                while pos < len(line) and line[pos] in _SPACE:
                    pos += 1
                if pos >= len(line):
                    break
                semi = line.find(";", pos)
                end = len(line) if semi < 0 else semi
                self._segment(lineno, line, pos, end)
                if semi < 0:
                    break
                self.stmt = None
                pos = semi + 1
        if self.stmt is not None:
            last_line, col = self.stmt.last
            what = f"missing ';' at the end of the file (partition {self.stmt.part.name!r} from line {self.stmt.line})"
            raise self.fail(last_line, col, what)
        return PartitionConfig(tuple(b.freeze() for b in self.parts.values()), self.source)

    def _check_chars(self, lineno: int, raw: str) -> None:
        body = raw[:-1] if raw.endswith("\r") else raw
        if len(body) > MAX_LINE:
            raise self.fail(lineno, MAX_LINE + 1, f"line of {len(body)} characters: OpenSM cuts lines at {MAX_LINE}")
        for i, ch in enumerate(raw):
            o = ord(ch)
            if (o < 0x20 and ch not in "\t\r") or o == 0x7F:
                what = "NUL character" if o == 0 else f"control character U+{o:04X}"
                raise self.fail(lineno, i + 1, what)

    def _segment(self, lineno: int, line: str, start: int, end: int) -> None:
        """``line[start:end]``: text up to a ``;`` or the line end, not blank at ``start``."""
        if self.stmt is None:
            if start == end:  # a ';' right here
                raise self.fail(lineno, start + 1, "';' without a partition definition before it")
            colon = line.find(":", start, end)
            if colon < 0:
                raise self.fail(
                    lineno,
                    start + 1,
                    "partition definition without ':' (a definition and its ':' are on one line)",
                )
            self._header(lineno, line, start, colon)
            start = colon + 1
        assert self.stmt is not None
        tail = _strip(line, start, end)
        if tail.text:
            self.stmt.last = (lineno, tail.col + len(tail.text))
        self._members(lineno, _split(line, start, end, ","))

    # -- the definition --

    def _header(self, lineno: int, line: str, start: int, colon: int) -> None:
        items = _split(line, start, colon, ",")
        name_tok, id_tok = _pair(items[0])
        if id_tok is None and name_tok.text[:1].isascii() and name_tok.text[:1].isdigit():
            name_tok, id_tok = _Tok("", name_tok.col), name_tok
        flags = _Flags()
        for item in items[1:]:
            if item.text:
                self._partition_flag(lineno, item, flags)
        pkey = None if id_tok is None else self._pkey(lineno, id_tok)
        part = self._partition(lineno, name_tok, pkey)
        self._merge_flags(lineno, part, flags)
        tail = _strip(line, colon, colon + 1)
        self.stmt = _Statement(part, flags, lineno, (lineno, tail.col + 1))

    def _pkey(self, lineno: int, tok: _Tok) -> int:
        if not tok.text:
            raise self.fail(lineno, tok.col, "empty P_Key after '='")
        value = self._number(lineno, tok, "P_Key")
        if value > 0xFFFF:
            raise self.fail(lineno, tok.col, f"P_Key {tok.text} does not fit 16 bits (OpenSM would truncate it)")
        if value & 0x7FFF == 0:
            what = f"P_Key {tok.text}: its 15-bit key is 0, which is no partition (OpenSM would generate one)"
            raise self.fail(lineno, tok.col, what)
        return value & 0x7FFF

    def _partition(self, lineno: int, name_tok: _Tok, pkey: int | None) -> _Build:
        """The partition a definition names: an existing one (merge) or a new one."""
        name = name_tok.text
        if pkey is None:
            if name and name in self.names:
                found = self.parts[self.names[name]]
                if found.name != name:
                    raise self.fail(
                        lineno,
                        name_tok.col,
                        f"{name!r} is a second name of P_Key 0x{found.pkey:04x} (partition {found.name!r}, line "
                        f"{found.line}); OpenSM finds partitions by their first name only: "
                        f"write {name}=0x{found.pkey:04x}",
                    )
                return found
            pkey = self._generate(lineno, name_tok.col)
            part = _Build(name or f"{pkey:04x}", pkey, lineno, generated=True)
            self.parts[pkey] = part
            if name:
                self.names[name] = pkey
            return part
        if name:
            known = self.names.get(name)
            if known is not None and known != pkey:
                other = self.parts[known]
                raise self.fail(
                    lineno,
                    name_tok.col,
                    f"partition name {name!r} already names P_Key 0x{known:04x} (line {other.line}); "
                    "one name, one P_Key",
                )
        existing = self.parts.get(pkey)
        if existing is None:
            existing = self.parts[pkey] = _Build(name or f"{pkey:04x}", pkey, lineno)
        elif existing.generated:
            raise self.fail(
                lineno,
                name_tok.col,
                f"P_Key 0x{pkey:04x} was generated for partition {existing.name!r} at line {existing.line}; OpenSM "
                f"would merge the two: give {existing.name!r} a P_Key of its own",
            )
        elif existing.line == 0:
            existing.line = lineno  # the implicit Default, now also written
        if name:
            self.names[name] = pkey
        return existing

    def _generate(self, lineno: int, col: int) -> int:
        """OpenSM's generate_pkey: the next key from 1 up that no partition has yet."""
        while self.counter < DEFAULT_PKEY - 1:
            self.counter += 1
            if self.counter not in self.parts:
                return self.counter
        raise self.fail(lineno, col, "no P_Key left to generate")

    def _partition_flag(self, lineno: int, item: _Tok, flags: _Flags) -> None:
        name, value = _pair(item)
        flag = self._group_flag_name(name.text)
        if flag is not None:
            self._group_flag(lineno, flag, name, value, flags)
            return
        if _prefix_of(name.text, "ipoib") or name.text == "indx0":
            if value is not None:
                raise self.fail(lineno, value.col, f"flag '{name.text}' takes no value")
            if name.text == "indx0":
                flags.indx0 = True
            else:
                flags.ipoib = True
                flags.ipoib_col = name.col
            return
        if _prefix_of(name.text, "defmember"):
            if value is None or not value.text:
                raise self.fail(lineno, name.col, "flag 'defmember' needs a value: full, limited or both")
            flags.defmember = self._membership(lineno, value)
            return
        what = f"unknown partition flag {name.text!r}" if name.text else "flag without a name"
        raise self.fail(lineno, name.col, what + " (flags: ipoib, indx0, defmember, " + ", ".join(_GROUP_FLAGS) + ")")

    @staticmethod
    def _group_flag_name(word: str) -> str | None:
        return next((f for f in _GROUP_FLAGS if _prefix_of(word, f)), None)

    def _group_flag(self, lineno: int, flag: str, name: _Tok, value: _Tok | None, flags: _Flags) -> None:
        if value is None or not value.text:
            raise self.fail(lineno, name.col, f"flag '{flag}' needs a value")
        lo, hi, what = _FLAG_RANGE[flag]
        v = self._number(lineno, value, flag)
        if not lo <= v <= hi:
            raise self.fail(lineno, value.col, f"{flag}={value.text}: not {what}")
        if flag == "scope":
            if v not in flags.scopes:
                flags.scopes.append(v)
            return
        old = flags.values.get(flag)
        if old is not None and old != v:
            raise self.fail(lineno, value.col, f"{flag} given twice in one statement ({old}, then {v})")
        flags.values[flag] = v
        flags.where[flag] = value.col

    def _merge_flags(self, lineno: int, part: _Build, flags: _Flags) -> None:
        """Fold a statement's flags into its partition; refuse what OpenSM would drop."""
        for flag, v in flags.values.items():
            old = part.values.get(flag)
            if old is not None and old[0] != v:
                raise self.fail(
                    lineno,
                    flags.where[flag],
                    f"{flag}={v} conflicts with {flag}={old[0]} for P_Key 0x{part.pkey:04x} at line {old[1]}",
                )
            if old is None and part.ipoib and flag in _BROADCAST_FLAGS:
                raise self.fail(
                    lineno,
                    flags.where[flag],
                    f"{flag}={v} comes after line {part.ipoib_line} made the IPoIB broadcast group of P_Key "
                    f"0x{part.pkey:04x} with the default; OpenSM keeps that group: give {flag} there",
                )
            part.values.setdefault(flag, (v, lineno))
        if flags.ipoib and not part.ipoib:
            for flag in _BROADCAST_FLAGS:
                given = part.values.get(flag)
                if given is not None and flag not in flags.values:
                    raise self.fail(
                        lineno,
                        flags.ipoib_col,
                        f"'ipoib' here makes the broadcast group of P_Key 0x{part.pkey:04x} with the default {flag}, "
                        f"not the {flag}={given[0]} of line {given[1]} (OpenSM takes group flags per statement)",
                    )
        part.scopes.update(flags.scopes)
        if flags.ipoib and not part.ipoib:
            part.ipoib = True
            part.ipoib_line = lineno
        part.indx0 = part.indx0 or flags.indx0
        if part.defmember is None:
            part.defmember = flags.defmember

    # -- the members --

    def _members(self, lineno: int, items: list[_Tok]) -> None:
        assert self.stmt is not None
        for i, item in enumerate(items):
            if not item.text:
                continue
            name, value = _pair(item)
            if name.text == "mgid":
                self._mgroup(lineno, name, value, items[i + 1 :])
                return
            colon = item.text.find(":")
            if colon >= 0:
                raise self.fail(
                    lineno,
                    item.col + colon,
                    f"':' in the member list of partition {self.stmt.part.name!r} (line {self.stmt.line}): "
                    "a missing ';' before a new definition?",
                )
            self._member(lineno, name, value)

    def _member(self, lineno: int, name: _Tok, value: _Tok | None) -> None:
        assert self.stmt is not None
        if not name.text:
            raise self.fail(lineno, name.col, "membership without a port GUID or keyword before '='")
        if _prefix_of(name.text, "NONE"):
            return  # OpenSM skips NONE before it looks at the membership
        if value is not None and not value.text:
            raise self.fail(lineno, value.col, "empty membership after '=' (OpenSM reads it as full): write =full")
        membership = self.stmt.flags.defmember if value is None else self._membership(lineno, value)
        kind = next((k for k in _KEYWORDS if _prefix_of(name.text, k)), None)
        guid: int | None = None
        if kind is None:
            kind = "guid"
            guid = self._number(lineno, name, "port GUID")
            if guid == 0 or guid > 0xFFFF_FFFF_FFFF_FFFF:
                raise self.fail(lineno, name.col, f"port GUID {name.text} is not a 64-bit GUID")
        self.stmt.part.members.append(Member(kind, guid, membership, self.stmt.flags.indx0, lineno, name.col))

    def _membership(self, lineno: int, value: _Tok) -> Membership:
        for word in ("full", "both", "limited"):
            if _prefix_of(value.text, word):
                return cast(Membership, word)
        raise self.fail(lineno, value.col, f"membership {value.text!r}: full, limited or both")

    # -- multicast groups --

    def _mgroup(self, lineno: int, name: _Tok, value: _Tok | None, rest: list[_Tok]) -> None:
        assert self.stmt is not None
        part, stmt_flags = self.stmt.part, self.stmt.flags
        if value is None or not value.text:
            raise self.fail(lineno, name.col, "mgid needs a GID: mgid=ff12:...")
        mgid = self._gid(lineno, value)
        flags = _Flags()
        for item in rest:
            if not item.text:
                continue
            fname, fvalue = _pair(item)
            flag = self._group_flag_name(fname.text)
            if flag is None:
                what = f"unknown multicast group flag {fname.text!r}" if fname.text else "flag without a name"
                raise self.fail(
                    lineno, fname.col, what + " (an mgid takes the rest of its line: " + ", ".join(_GROUP_FLAGS) + ")"
                )
            self._group_flag(lineno, flag, fname, fvalue, flags)
        if (mgid >> 96) & 0xFFFF in _IP_SIGNATURES:
            mgid = self._ip_group(lineno, value, mgid, flags, stmt_flags, part.pkey)
        if part.ipoib and mgid == (_BROADCAST_TEMPLATE & ~(0xFFFF << 80)) | ((part.pkey | 0x8000) << 80):
            raise self.fail(
                lineno, value.col, f"MGID {value.text} is the IPoIB broadcast group 'ipoib' made (OpenSM skips it)"
            )
        seen = self.mgids.get(mgid)
        if seen is not None:
            raise self.fail(lineno, value.col, f"MGID {value.text} defined again (first at line {seen})")
        self.mgids[mgid] = lineno
        v = flags.values.get
        part.groups.append(
            McGroupSpec(
                mgid=mgid,
                rate=v("rate"),
                mtu=v("mtu"),
                sl=v("sl"),
                scope=tuple(sorted(flags.scopes)) or None,
                q_key=v("Q_Key"),
                tclass=v("TClass"),
                flow_label=v("FlowLabel"),
                line=lineno,
            )
        )

    def _gid(self, lineno: int, tok: _Tok) -> int:
        text = tok.text
        if not text.isascii() or "%" in text or any(c in _SPACE for c in text):
            raise self.fail(lineno, tok.col, f"MGID {text!r} is not an IPv6-style GID")
        try:
            mgid = int(ipaddress.IPv6Address(text))
        except ValueError:
            raise self.fail(lineno, tok.col, f"MGID {text!r} is not an IPv6-style GID") from None
        if mgid >> 120 != 0xFF:
            raise self.fail(lineno, tok.col, f"MGID {text} is not a multicast GID (it must start with ff)")
        return mgid

    def _ip_group(self, lineno: int, tok: _Tok, mgid: int, flags: _Flags, stmt: _Flags, pkey: int) -> int:
        """OpenSM's checks of an IP-over-IB group; returns the MGID with the P_Key written in."""
        full_key = pkey | 0x8000
        bits = (mgid >> 80) & 0xFFFF
        if mgid != _BROADCAST_TEMPLATE and bits not in (0, full_key):
            raise self.fail(
                lineno, tok.col, f"IP multicast group {tok.text}: P_Key bits 0x{bits:04x}, not 0 nor 0x{full_key:04x}"
            )
        for flag, default in (("rate", IPOIB_DEFAULT_RATE), ("mtu", IPOIB_DEFAULT_MTU)):
            mine = flags.values.get(flag)
            theirs = stmt.values.get(flag, default)
            if mine is not None and mine != theirs:
                raise self.fail(
                    lineno,
                    flags.where[flag],
                    f"IP multicast group {tok.text}: {flag}={mine} differs from its partition's {flag} {theirs}",
                )
        return (mgid & ~(0xFFFF << 80)) | (full_key << 80)

    # -- numbers --

    def _number(self, lineno: int, tok: _Tok, what: str) -> int:
        """A C integer literal as ``strtoul(s, &end, 0)`` reads it whole, without sign or octal."""
        t = tok.text
        if t[:2].lower() == "0x":
            digits = t[2:]
            if digits and all(c in "0123456789abcdefABCDEF" for c in digits):
                return int(digits, 16)
        elif t.isascii() and t.isdigit():
            if len(t) > 1 and t[0] == "0":
                raise self.fail(
                    lineno, tok.col, f"{what} {t}: a leading 0 makes it octal to OpenSM; write 0x... or plain decimal"
                )
            return int(t)
        raise self.fail(lineno, tok.col, f"bad {what} {t!r} (a decimal or 0x-hex number)")
