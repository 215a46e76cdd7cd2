"""Ask an SM's SA every query ``saquery`` (infiniband-diags 44) knows, on an ibsim fabric, and parse the answers.

The reference our SA server must match is OpenSM's answer to the same ``saquery``
command on the same fabric with the same LIDs. This module runs ``saquery`` as a
client of the simulated fabric (libumad2sim preloaded, ``SIM_HOST`` choosing the
CA it sits on), keeps the raw SA MADs it printed with ``-dd``, parses every
record type saquery prints into ``{field label: value string}`` dicts, and
compares two such lists field by field (:func:`compare_records`).

What libumad2sim does to SA answers (ibsim 0.10, read off umad2sim.c and seen):

* No RMPP. The SA's answer goes to ibsim as at most one 256-byte MAD (the SA
  header, 56 bytes, and the first 200 bytes of records); the rest is lost. A
  GetTable answer longer than one MAD arrives as its first MAD, with umad length
  256, and saquery prints ``200 // record size`` records from it.
* Worse, the client's receive buffer is ``sizeof(struct sim_request)`` = 288
  bytes, of which ``umad_size()`` = 64 is the umad header: only the first 224
  bytes of a received MAD are copied, the last 32 are whatever malloc left there
  (the umad length still says 256). So only 168 bytes of records are real: a
  record ending past byte 224 of the MAD is garbage. :attr:`SaqueryResult.records`
  drops those (see :data:`MAD_BYTES_DELIVERED`); :attr:`SaqueryResult.printed`
  keeps everything saquery printed.
* ``saquery`` resolves a node *name* (``--src-to-dst a:b`` with names,
  ``NR <name>``) with a GetTable of all NodeRecords, which arrives cut to the
  first record: names other than the first node's fail ("Failed to find lid").
  Always pass LIDs.

So every type is asked for one record (by LID, port, block: see
:func:`single_record_queries` and :data:`SA_TYPES`); the types saquery cannot
narrow to one record (ServiceRecord, MCMemberRecord by group, PathRecord without
``--slid``/``--dlid``) are compared on what fits: the leading records.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from fabric.ibsim import IbsimProcess

SAQUERY = "saquery"
SA_TIMEOUT_MS = 1000
"""saquery's ``-t``: how long it waits for the SA's answer (its default too)."""

SA_HEADER_BYTES = 56
"""MAD header (24) + RMPP header (12) + SA header (20): where SA records start."""
MAD_BYTES = 256
MAD_BYTES_DELIVERED = 224
"""Bytes of a received MAD libumad2sim copies to the client (288-byte buffer less the 64-byte umad header)."""
RECORD_BYTES_DELIVERED = MAD_BYTES_DELIVERED - SA_HEADER_BYTES

METHOD_GET_RESP = 0x81
METHOD_GETTABLE_RESP = 0x92

OPENSM_SA_KEY = "1"
"""OpenSM's default SA key (``sa_key 0x1``): ``--smkey 1`` makes a query trusted."""


# -- the 16 query types ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SaType:
    """One SA attribute saquery can ask for."""

    name: str
    """saquery's query name (and the record kind :func:`parse_records` gives)."""
    alias: str
    attr_id: int
    record_size: int
    """AttributeOffset * 8 in a GetTableResp (0: ClassPortInfo, a plain Get)."""
    header: str
    """The line saquery prints before each record."""
    select: str
    """saquery arguments that select a single record; "" when saquery cannot."""


SA_TYPES: dict[str, SaType] = {
    t.name: t
    for t in (
        SaType("ClassPortInfo", "CPI", 0x0001, 0, "SA ClassPortInfo:", "-c (a Get: one attribute)"),
        SaType("NodeRecord", "NR", 0x0011, 112, "NodeRecord dump:", "NR <lid>"),
        SaType("PortInfoRecord", "PIR", 0x0012, 72, "PortInfoRecord dump:", "PIR <lid>/<port>"),
        SaType("SL2VLTableRecord", "SL2VL", 0x0013, 16, "SL2VLTableRecord dump:", "SL2VL <lid>/<in>/<out>"),
        SaType("PKeyTableRecord", "PKTR", 0x0033, 72, "PKeyTableRecord dump:", "--smkey 1 PKTR <lid>/<port>/<block>"),
        SaType("VLArbitrationTableRecord", "VLAR", 0x0036, 72, "VLArbTableRecord dump:", "VLAR <lid>/<port>/<block>"),
        SaType("InformInfoRecord", "IIR", 0x00F3, 64, "InformInfoRecord dump:", "IIR <subscriber gid>"),
        SaType("LinkRecord", "LR", 0x0020, 8, "LinkRecord dump:", "LR <from lid>/<from port>"),
        SaType("ServiceRecord", "SR", 0x0031, 176, "ServiceRecord dump:", ""),
        SaType("PathRecord", "PR", 0x0035, 64, "PathRecord dump:", "PR --slid <lid> --dlid <lid>"),
        SaType("MCMemberRecord", "MCMR", 0x0038, 56, "MCMember Record dump:", "MCMR --mlid <mlid> (untrusted)"),
        SaType("LFTRecord", "LFTR", 0x0015, 72, "LFT Record dump:", "LFTR <switch lid>/<block>"),
        SaType("MFTRecord", "MFTR", 0x0017, 72, "MFT Record dump:", "MFTR <switch lid>/<position>/<block>"),
        SaType("GUIDInfoRecord", "GIR", 0x0030, 72, "GUIDInfo Record dump:", "GIR <lid>/<block>"),
        SaType("SwitchInfoRecord", "SWIR", 0x0014, 24, "SwitchInfoRecord dump:", "SWIR <switch lid>"),
        SaType("SMInfoRecord", "SMIR", 0x0018, 32, "SMInfoRecord dump:", "SMIR <sm lid>"),
    )
}
"""The 16 types of ``saquery --help``; record sizes as OpenSM's GetTableResp AttributeOffset gives them
(InformInfoRecord: OpenSM's struct, 64; OpenSM never had one to show; ServiceRecord, 176, never fits whole)."""

_BY_HEADER = {t.header: t.name for t in SA_TYPES.values()}
_BY_HEADER.update(
    {"MCMemberRecord group dump:": "MCMemberRecord group", "MCMemberRecord member dump:": "MCMemberRecord member"}
)
_KIND_ATTR = {"MCMemberRecord group": 0x0038, "MCMemberRecord member": 0x0038}

VOLATILE_FIELDS = frozenset({"ActCount"})
"""Fields that change while the SM runs (SMInfo ActCount: OpenSM gives its count of QP0 MADs sent)."""


@dataclass(frozen=True)
class Query:
    """One saquery command of the reference set."""

    type: str
    """:data:`SA_TYPES` key."""
    args: tuple[str, ...]
    note: str = ""


def single_record_queries(
    *, ca_lid: int, sw_lid: int, sm_lid: int, dst_lid: int, sw_port: int = 1, mlid: int = 0xC000
) -> list[Query]:
    """The 16 types, each narrowed to one record where saquery can narrow it.

    ``ca_lid``: a CA's port 1 (not necessarily the asking one); ``sw_lid``: a switch
    (port ``sw_port`` cabled); ``sm_lid``: the master SM's port; ``dst_lid``: another CA
    for the PathRecord; ``mlid``: a multicast group (OpenSM's IPoIB broadcast group 0xc000).
    """
    return [
        Query("ClassPortInfo", ("-c",)),
        Query("NodeRecord", ("NR", str(ca_lid))),
        Query("PortInfoRecord", ("PIR", f"{ca_lid}/1")),
        Query("SL2VLTableRecord", ("SL2VL", f"{sw_lid}/0/{sw_port}")),
        Query("PKeyTableRecord", ("--smkey", OPENSM_SA_KEY, "PKTR", f"{ca_lid}/1/0"), "trusted only"),
        Query("VLArbitrationTableRecord", ("VLAR", f"{ca_lid}/1/1")),
        Query("InformInfoRecord", ("IIR",), "all subscriptions: none unless someone subscribed"),
        Query("LinkRecord", ("LR", f"{ca_lid}/1")),
        Query("ServiceRecord", ("SR",), "all: saquery has no selector"),
        Query("PathRecord", ("PR", "--slid", str(ca_lid), "--dlid", str(dst_lid))),
        Query("MCMemberRecord", ("MCMR", "--mlid", f"{mlid:#x}")),
        Query("LFTRecord", ("LFTR", f"{sw_lid}/0")),
        Query("MFTRecord", ("MFTR", str(sw_lid)), "blocks in use only: none without joined members"),
        Query("GUIDInfoRecord", ("GIR", f"{ca_lid}/0")),
        Query("SwitchInfoRecord", ("SWIR", str(sw_lid))),
        Query("SMInfoRecord", ("SMIR", str(sm_lid))),
    ]


# -- raw MADs (saquery -dd) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SaMad:
    """One SA MAD as saquery's ``-dd`` dumped it (``len`` bytes: the umad length)."""

    data: bytes

    def _u(self, start: int, size: int) -> int:
        return int.from_bytes(self.data[start : start + size], "big") if len(self.data) >= start + size else 0

    @property
    def method(self) -> int:
        return self._u(3, 1)

    @property
    def status(self) -> int:
        return self._u(4, 2)

    @property
    def tid(self) -> int:
        return self._u(8, 8)

    @property
    def attr_id(self) -> int:
        return self._u(16, 2)

    @property
    def attr_mod(self) -> int:
        return self._u(20, 4)

    @property
    def sm_key(self) -> int:
        return self._u(36, 8)

    @property
    def attr_offset(self) -> int:
        """In 8-byte words; OpenSM sets 0 in a GetTableResp with no records."""
        return self._u(44, 2)

    @property
    def comp_mask(self) -> int:
        return self._u(48, 8)

    @property
    def record_size(self) -> int:
        return self.attr_offset * 8

    @property
    def printed_count(self) -> int:
        """Records saquery prints from this answer: ``(len - 56) / (AttributeOffset * 8)``."""
        if self.method != METHOD_GETTABLE_RESP or self.status or not self.record_size:
            return 0
        return max(0, len(self.data) - SA_HEADER_BYTES) // self.record_size

    @property
    def valid_count(self) -> int:
        """Of those, the records libumad2sim delivered whole (ending by byte 224 of the MAD)."""
        if not self.record_size:
            return 0
        return min(self.printed_count, RECORD_BYTES_DELIVERED // self.record_size)

    @property
    def cut(self) -> bool:
        """The SA's answer was (likely) longer than one MAD: ibsim kept its first 256 bytes.

        An answer of exactly 200 bytes of records (e.g. 25 LinkRecords) looks the same.
        """
        return self.printed_count > 0 and len(self.data) >= MAD_BYTES

    def records(self) -> list[bytes]:
        """The raw records delivered whole."""
        size = self.record_size
        return [
            self.data[SA_HEADER_BYTES + i * size : SA_HEADER_BYTES + (i + 1) * size] for i in range(self.valid_count)
        ]


_HEX_LINE = re.compile(r"^[0-9a-f]{2,4}(?: [0-9a-f]{2,4})* ?$")


def split_dumps(stdout: str) -> tuple[str, list[SaMad], list[SaMad]]:
    """Separate ``-dd``'s "SA Request:"/"SA Response:" hex dumps from saquery's records.

    Returns (the text without the dumps, requests, responses), in order.
    """
    text: list[str] = []
    requests: list[SaMad] = []
    responses: list[SaMad] = []
    cur: bytearray | None = None
    into: list[SaMad] | None = None

    def close() -> None:
        nonlocal cur, into
        if cur is not None and into is not None:
            into.append(SaMad(bytes(cur)))
        cur, into = None, None

    for line in stdout.splitlines():
        if line in ("SA Request:", "SA Response:"):
            close()
            cur, into = bytearray(), requests if line == "SA Request:" else responses
            continue
        if cur is not None and _HEX_LINE.match(line):
            cur += bytes.fromhex(line.replace(" ", ""))
            continue
        close()
        text.append(line)
    close()
    return "\n".join(text) + ("\n" if text else ""), requests, responses


# -- parsing saquery's text ------------------------------------------------------------------------------------


@dataclass
class SaRecord:
    """One record as saquery printed it."""

    kind: str
    """:data:`SA_TYPES` name; "MCMemberRecord group" / "MCMemberRecord member" for ``-g`` / ``-m``."""
    fields: dict[str, str] = field(default_factory=dict)
    section: str = ""
    """The heading it was printed under ("IsSM ports", "IsSMdisabled ports" for ``-s``)."""


# "label.....value" (saquery) and "Label:.....value" (libibmad's PortInfo dump). The label runs to the
# first ".." or ":.": labels hold single dots ("ServiceData8.1") but never two in a row.
_FIELD = re.compile(r"^(.*?)(?::\.+|\.{2,})(.*)$")
_PKEY_ROW = re.compile(r"^0x[0-9a-f]{4}(?: 0x[0-9a-f]{4}){7}$")
_LFT_ROW = re.compile(r"^(\d+)\t(\d+)$")
_MFT_ROW = re.compile(r"^(0x[0-9a-f]{4})\t(0x[0-9a-f]{4})$")
_BAR_ROW = re.compile(r"^(SL|VL|Weight)\s*:((?:\s*\d+\|)+)$")


def _bars(s: str) -> list[str]:
    return [v.strip() for v in s.split("|") if v.strip()]


def parse_saquery(text: str) -> list[SaRecord]:
    """Every record saquery printed (its ``-dd`` dumps removed first, see :func:`split_dumps`).

    Field keys are saquery's labels (PortInfo's without the colon). Tables become indexed keys:
    SL2VL ``SL0``..``SL15`` (value: the VL), VLArb ``VL[i]``/``Weight[i]`` (i 0..31), PKey
    ``PKey[i]`` (0..31), LFT ``LFT[<lid>]`` (port), MFT ``MFT[<mlid hex>]`` (port mask).
    PortInfo's decoded capability names (lines without a value) are left out: the mask is kept.
    """
    out: list[SaRecord] = []
    cur: SaRecord | None = None
    section = ""
    sl_row: list[str] = []
    vlarb_vl: list[str] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        if not raw[0].isspace():
            head = raw.rstrip()
            if head in _BY_HEADER:
                cur = SaRecord(_BY_HEADER[head], section=section)
                out.append(cur)
                sl_row, vlarb_vl = [], []
            else:
                section, cur = head, None
            continue
        line = raw.strip()
        if cur is None:
            # ``saquery -m <mlid>`` prints one headerless "PortGid....gid (name)" line per member;
            # other headerless lines (``-D``'s CA list) are no records.
            m = _FIELD.match(line)
            if not m or m.group(1).strip() != "PortGid":
                continue
            cur = SaRecord("MCMemberRecord member", section=section)
            out.append(cur)
        if m := _BAR_ROW.match(line):
            label, values = m.group(1), _bars(m.group(2))
            if label == "SL":
                sl_row = values
            elif cur.kind == "SL2VLTableRecord":
                cur.fields.update({f"SL{sl}": vl for sl, vl in zip(sl_row, values, strict=False)})
            elif label == "VL":
                vlarb_vl = values
            else:
                base = sum(1 for k in cur.fields if k.startswith("Weight["))
                for i, (vl, w) in enumerate(zip(vlarb_vl, values, strict=False)):
                    cur.fields[f"VL[{base + i}]"] = vl
                    cur.fields[f"Weight[{base + i}]"] = w
            continue
        if cur.kind == "PKeyTableRecord" and _PKEY_ROW.match(line):
            base = sum(1 for k in cur.fields if k.startswith("PKey["))
            cur.fields.update({f"PKey[{base + i}]": v for i, v in enumerate(line.split())})
            continue
        if cur.kind == "LFTRecord" and (m := _LFT_ROW.match(line)):
            cur.fields[f"LFT[{m.group(1)}]"] = m.group(2)
            continue
        if cur.kind == "MFTRecord" and (m := _MFT_ROW.match(line)):
            cur.fields[f"MFT[{m.group(1)}]"] = m.group(2)
            continue
        if m := _FIELD.match(line):
            label, value = m.group(1).strip(), m.group(2)
            if cur.kind == "MCMemberRecord member" and label in cur.fields and not cur.fields.get("MGID"):
                cur = SaRecord("MCMemberRecord member", section=section)
                out.append(cur)
            cur.fields[label] = value
        # else: "RID", "PortInfo dump:", "PKey Table:", "LFT:", capability names ... (no value)
    return out


def parse_records(text: str, kind: str | None = None) -> list[dict[str, str]]:
    """The records of :func:`parse_saquery` as plain dicts, only those of ``kind`` when given."""
    return [dict(r.fields) for r in parse_saquery(text) if kind is None or r.kind == kind]


# -- running saquery ---------------------------------------------------------------------------------------------

_UMAD_DEBUG = re.compile(r"^ibwarn: \[\d+\] (?:umad_\w+|resolve_ca_\w+|dev_to_umad_id): ")
_STATUS = re.compile(r"ERROR: Query result returned (0x[0-9a-fA-F]+)")


@dataclass
class SaqueryResult:
    """One saquery run: exit status, output, the SA MADs it dumped and the records it printed."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    text: str
    """stdout without the ``-dd`` hex dumps: what saquery printed of the records."""
    requests: list[SaMad]
    responses: list[SaMad]
    printed: list[SaRecord]
    """Every record saquery printed (from a cut answer, the tail is garbage)."""
    records: list[dict[str, str]]
    """The records that arrived whole (see the module doc), as ``{label: value}``."""
    cut: bool
    """Some answer was longer than one MAD: more records existed than saquery could see."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def status(self) -> int | None:
        """The MAD status of the failed answer saquery reported (``0x0200``: SA_ERR_REQ_INVALID), else None."""
        m = _STATUS.search(self.stderr)
        return int(m.group(1), 16) if m else None

    @property
    def timed_out(self) -> bool:
        """No answer within ``-t`` (OpenSM drops a query whose non-zero SM_Key is not its SA key)."""
        return "Connection timed out" in self.stderr

    def kinds(self) -> list[str]:
        return [r.kind for r in self.printed]

    def summary(self) -> str:
        """One line: the command, exit status, records whole/printed and any error."""
        err = f" status={self.status:#06x}" if self.status is not None else ""
        err += " TIMEOUT" if self.timed_out else ""
        cut = " (answer cut to one MAD)" if self.cut else ""
        return f"{' '.join(self.argv)}: rc={self.returncode}{err} records={len(self.records)}/{len(self.printed)}{cut}"


def _valid_records(printed: list[SaRecord], responses: list[SaMad]) -> tuple[list[dict[str, str]], bool]:
    """Drop, per SA answer, the records past the 224 bytes libumad2sim delivers."""
    keep: list[dict[str, str]] = []
    cut = any(r.cut for r in responses)
    kinds: list[str] = []
    for r in printed:
        if r.kind not in kinds:
            kinds.append(r.kind)
    for kind in kinds:
        recs = [r for r in printed if r.kind == kind]
        attr = _KIND_ATTR.get(kind) or (SA_TYPES[kind].attr_id if kind in SA_TYPES else None)
        size = SA_TYPES[kind].record_size if kind in SA_TYPES else 0
        answers = [m for m in responses if m.attr_id == attr and m.method == METHOD_GETTABLE_RESP]
        # The printed records come from the last answers of that attribute (earlier ones may be
        # saquery's own look-ups, e.g. a NodeRecord table to resolve a name).
        chunks: list[SaMad] = []
        total = 0
        for m in reversed(answers):
            if total >= len(recs):
                break
            chunks.insert(0, m)
            total += m.printed_count
        if answers and total == len(recs) and kind != "MCMemberRecord member":
            i = 0
            for m in chunks:
                part = recs[i : i + m.printed_count]
                keep += [dict(x.fields) for x in part[: m.valid_count]]
                if m.valid_count == 0 and part and kind == "ServiceRecord":
                    # A ServiceRecord (176 bytes) never fits in 168: all but its last 8 bytes arrive.
                    first = dict(part[0].fields)
                    first.pop("ServiceData64.2", None)
                    keep.append(first)
                i += m.printed_count
        elif size:
            # No dump to go by: one answer, whose records past byte 224 cannot be real.
            keep += [dict(x.fields) for x in recs[: max(1, RECORD_BYTES_DELIVERED // size)]]
        else:
            keep += [dict(x.fields) for x in recs]
    return keep, cut


class _HasIbsim(Protocol):
    proc: IbsimProcess


def run_saquery(
    sim: IbsimProcess | _HasIbsim,
    args: Sequence[str],
    *,
    host: str | None = None,
    cwd: Path,
    timeout_ms: int = SA_TIMEOUT_MS,
    raw: bool = True,
    timeout: float = 30.0,
) -> SaqueryResult:
    """``saquery -t <timeout_ms> [-dd] <args>`` as a client of ``sim`` attached at node ``host``.

    ``host`` is an ibsim node id (the net file's name, e.g. ``host-00005``), ideally a CA that is
    not the SM's; None attaches where libumad2sim does by default (the net file's first node).
    ``raw`` adds ``-dd`` so the SA MADs are kept (needed to tell whole records from the garbage tail
    of a cut answer exactly); the dumps are taken out of :attr:`SaqueryResult.text`. Runs in
    ``cwd`` (libumad2sim writes its ``sys-PID`` tree there); never raises on saquery's exit status.
    """
    proc = sim if isinstance(sim, IbsimProcess) else sim.proc
    assert proc.alive(), f"ibsim died:\n{proc.output()[-2000:]}"
    argv = [SAQUERY, "-t", str(timeout_ms), *(["-dd"] if raw else []), *args]
    cp = subprocess.run(
        argv, env=proc.env(sim_host=host), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    text, requests, responses = split_dumps(cp.stdout) if raw else (cp.stdout, [], [])
    # -dd makes libibumad narrate its calls on stderr ("ibwarn: [pid] umad_open_port: ..."): keep the rest.
    stderr = "\n".join(ln for ln in cp.stderr.splitlines() if not _UMAD_DEBUG.match(ln))
    printed = parse_saquery(text)
    records, cut = _valid_records(printed, responses)
    return SaqueryResult(argv, cp.returncode, cp.stdout, stderr, text, requests, responses, printed, records, cut)


# -- comparing ------------------------------------------------------------------------------------------------


def _ignored(label: str, ignore: Iterable[str]) -> bool:
    """``label`` is in ``ignore``, or matches a pattern there whose ``*`` stands for any text (``LFT[*]``)."""
    return any(label == pat or re.fullmatch(re.escape(pat).replace(r"\*", ".*"), label) for pat in ignore)


def compare_records(
    ours: Sequence[Mapping[str, str]],
    theirs: Sequence[Mapping[str, str]],
    *,
    ignore: set[str] | frozenset[str] = frozenset(),
) -> list[str]:
    """Differences between two record lists, record by record (in order) and field by field.

    ``ignore``: field labels (or patterns, ``*`` matching any text: ``"LFT[*]"``) left out. Empty when equal.
    """
    diffs: list[str] = []
    if len(ours) != len(theirs):
        diffs.append(f"record count: ours {len(ours)} != theirs {len(theirs)}")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        for label in list(dict.fromkeys([*b.keys(), *a.keys()])):
            if _ignored(label, ignore):
                continue
            if label not in a:
                diffs.append(f"record {i}: {label}: missing in ours (theirs {b[label]!r})")
            elif label not in b:
                diffs.append(f"record {i}: {label}: not in theirs (ours {a[label]!r})")
            elif a[label] != b[label]:
                diffs.append(f"record {i}: {label}: ours {a[label]!r} != theirs {b[label]!r}")
    return diffs


# -- OpenSM as the reference SA ---------------------------------------------------------------------------------


@dataclass
class OpenSmSa:
    """A running ``opensm`` (SA up) and its files."""

    proc: subprocess.Popen[bytes]
    log: Path
    cache: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def opensm_sa(
    sim: IbsimProcess | _HasIbsim,
    work: Path,
    *,
    sm_host: str,
    guid2lid: Path | None = None,
    args: Sequence[str] = (),
    up_timeout: float = 30.0,
) -> Iterator[OpenSmSa]:
    """``opensm`` (not ``--once``: its SA must keep answering) at ``sm_host``, until the block ends.

    An empty config (``-F``: not /etc/opensm/opensm.conf), its log flushed after every message
    (``-d2``) in ``work/opensm.log``, ``OSM_CACHE_DIR=work/cache``. OpenSM has no option naming the
    guid2lid file: it reads ``$OSM_CACHE_DIR/guid2lid``, so ``guid2lid`` is copied there and
    ``--honor_guid2lid`` (-x) makes OpenSM keep those LIDs (see tests/test_opensm_compat.py).
    Waits for "SUBNET UP" in the log; always stopped by PID (SIGTERM, then SIGKILL).
    """
    proc_sim = sim if isinstance(sim, IbsimProcess) else sim.proc
    cache = work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    extra = list(args)
    if guid2lid is not None:
        shutil.copy(guid2lid, cache / "guid2lid")
        extra.append("--honor_guid2lid")
    conf = work / "opensm.conf"
    conf.write_text("")
    log = work / "opensm.log"
    env = dict(proc_sim.env(sim_host=sm_host), OSM_CACHE_DIR=str(cache))
    argv = ["opensm", "-F", str(conf), "-f", str(log), "-d2", "--dump_files_dir", str(work), *extra]
    p = subprocess.Popen(
        argv, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    osm = OpenSmSa(p, log, cache)
    try:
        deadline = time.monotonic() + up_timeout
        while "SUBNET UP" not in osm.log_text():
            if p.poll() is not None:
                raise RuntimeError(f"opensm exited {p.returncode}:\n{osm.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no SUBNET UP from opensm within {up_timeout:.0f} s:\n{osm.log_text()[-3000:]}")
            time.sleep(0.1)
        yield osm
    finally:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
