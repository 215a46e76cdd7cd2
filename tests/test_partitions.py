"""Partitions: OpenSM's partitions file parsed (sm.partitions.config) and resolved onto fabrics (plan).

Expected tables marked "OpenSM 3.3.23 over ibsim" are what ``opensm --once`` (or a running
opensm re-reading its file on SIGHUP) wrote into ibsim's ports for the same file on the same
fattree(2, 4), read back with ``smpquery pkeys``.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import numpy as np
import pytest

from fabric.generate import fattree
from fabric.model import Fabric
from sm.partitions import (
    DEFAULT_PKEY,
    Member,
    PartitionConfig,
    PartitionConfigError,
    PartitionPlan,
    changed_blocks,
    default_partitions,
    load_partitions,
    parse_partitions,
    pkey_blocks,
    plan_partitions,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "fixtures" / "partitions" / "opensm_examples.conf"


def guid_of_host(i: int) -> int:
    """Port GUID of host-0000i's port 1 in a generated fat-tree (GUIDs go up in node order)."""
    return 0x0002_C900_0000_0000 + 2 * i + 1


@pytest.fixture(scope="module")
def ft() -> Fabric:
    """fattree(2, 4): host-00000..7 (nodes 0-7, port 1), leaf-00..03 (8-11), spine-00..01 (12-13)."""
    return fattree(2, 4)


def plan(text: str, f: Fabric, previous: PartitionPlan | None = None, **kw: object) -> PartitionPlan:
    sm = kw.pop("sm_port", (0, 1))
    return plan_partitions(parse_partitions(text, "t.conf"), f, sm_port=sm, previous=previous, **kw)  # type: ignore[arg-type]


def table(p: PartitionPlan, f: Fabric, name: str, port: int) -> list[str]:
    return [f"{k:04x}" for k in p.tables[(f.by_name(name), port)]]


# -- parsing: OpenSM's own examples ------------------------------------------------------------------------


def test_opensm_examples() -> None:
    c = load_partitions(EXAMPLES)
    assert c.source == str(EXAMPLES)
    assert [(p.name, p.pkey) for p in c] == [
        ("Default", 0x7FFF),
        ("Compute", 0x0001),  # no P_Key written: OpenSM's first generated key
        ("Backup", 0x0300),
        ("Storage", 0x0080),
        ("Tenant", 0x0123),
        ("0124", 0x0124),  # a P_Key alone is named after it
    ]
    d = c.default
    assert d.ipoib and d.line == 6 and not d.generated
    assert [(m.kind, m.membership, m.line) for m in d.members] == [
        ("ALL", "limited", 0),  # OpenSM's implicit Default comes first ...
        ("SELF", "full", 0),
        ("ALL", "limited", 6),  # ... then every Default statement of the file, in order
        ("SELF", "full", 6),
        ("ALL", "limited", 7),
        ("ALL_SWITCHES", "full", 7),
        ("SELF", "full", 7),
        ("ALL", "full", 29),
        ("ALL", "full", 32),
    ]
    v4, v6, plain = d.groups
    assert v4.mgid == 0xFF12_401B_FFFF_0000_0000_0000_0000_0A0B  # the full-member P_Key is written in
    assert (v4.sl, v4.rate, v4.mtu, v4.q_key, v4.line) == (1, None, None, None, 26)
    assert v6.mgid == 0xFF12_601B_FFFF_0000_0000_0000_0000_0002
    assert plain.mgid == 0xFF15_0000_0000_0000_0000_0000_0000_4242  # not an IP group: as written
    assert (plain.sl, plain.q_key, plain.rate, plain.mtu) == (1, 0x5EED5EED, 3, 2)
    assert (plain.scope, plain.tclass, plain.flow_label) == ((2, 5), 4, 0x12345)

    compute = c.by_pkey(1)
    assert compute is not None and compute.ipoib and compute.generated
    assert [(m.guid, m.membership) for m in compute.members] == [
        (0x0002C90300A1B2C1, "full"),
        (0x0002C90300A1B2C2, "limited"),  # "limi", OpenSM's own abbreviation
        (0x0002C90300A1B2C3, "limited"),
    ]
    backup = c.by_pkey(0x300)
    assert backup is not None and [(m.kind, m.membership) for m in backup.members] == [
        ("SELF", "full"),
        ("ALL", "limited"),
    ]
    storage = c.by_pkey(0x80)
    assert storage is not None and storage.defmember == "full" and storage.line == 17
    assert [(m.guid & 0xFF if m.guid else 0, m.membership) for m in storage.members] == [
        (0x01, "full"),
        (0x02, "full"),
        (0x03, "limited"),
        (0x04, "limited"),
        (0x05, "full"),
        (0x06, "limited"),
        (0x07, "limited"),
        (0x08, "full"),
        (0x09, "full"),
        (0x0A, "full"),
        (0x0B, "full"),  # a statement may go on over lines after its ':'
        (0x0C, "limited"),
        (0x0D, "full"),
    ]
    assert [m.line for m in storage.members][-3:] == [21, 22, 22]
    tenant = c.by_pkey(0x123)
    assert tenant is not None and tenant.indx0 and tenant.ipoib
    assert (tenant.mtu, tenant.rate, tenant.sl, tenant.scope) == (5, 7, 2, (2,))
    assert (tenant.q_key, tenant.tclass, tenant.flow_label) == (0x1234, 8, 7)
    assert [(m.kind, m.membership, m.indx0) for m in tenant.members] == [
        ("ALL_CAS", "both", True),
        ("ALL_ROUTERS", "limited", True),
    ]
    none = c.by_pkey(0x124)
    assert none is not None and none.members == ()


def test_opensm_rejects_its_own_defmember_example() -> None:
    """OpenSM 3.3.23 answers ``ShareIO = 0x80 : defmember=limited : ...`` with "bad PortGUID"."""
    with pytest.raises(PartitionConfigError) as e:
        parse_partitions("ShareIO = 0x80 : defmember=limited : 0x123456, 0x123457;\n", "x.conf")
    assert str(e.value).startswith("x.conf:1:36: ':' in the member list of partition 'ShareIO'")


# -- parsing: defaults, merging, keys ----------------------------------------------------------------------


def test_no_file_is_opensm_default(tmp_path: Path) -> None:
    d = default_partitions()
    assert len(d) == 1 and d.default.ipoib and d.default.pkey == DEFAULT_PKEY
    assert d.default.members == (Member("ALL", None, "full"), Member("SELF", None, "full"))
    missing = tmp_path / "partitions.conf"
    assert load_partitions(missing, missing_ok=True).partitions == d.partitions
    with pytest.raises(PartitionConfigError, match="no such file"):
        load_partitions(missing)


def test_file_without_default_gets_limited_default() -> None:
    c = parse_partitions("A=0x10 : ALL_CAS=full ;")
    d = c.default
    assert not d.ipoib and d.line == 0  # OpenSM makes the IPoIB group only when there is no file
    assert [(m.kind, m.membership) for m in d.members] == [("ALL", "limited"), ("SELF", "full")]
    assert [p.pkey for p in c] == [0x7FFF, 0x10]


def test_empty_file_and_comments_only() -> None:
    for text in ("", "\n\n", "# nothing\n   # at all\n"):
        c = parse_partitions(text)
        assert [p.pkey for p in c] == [DEFAULT_PKEY]


def test_merge_same_pkey() -> None:
    c = parse_partitions(
        "First=0x5, ipoib, mtu=5 : 0x10=full ;\n"
        "Second=0x8005, sl=3 : 0x11, 0x10 ;\n"  # 0x8005 is 0x0005: only 15 bits are the key
        "First : ALL_SWITCHES=both ;\n"
        "First=0x5 : 0x12 ; Other=0x6 : SELF ;\n"
    )
    p = c.by_pkey(5)
    assert p is not None
    assert p.name == "First" and p.line == 1  # the first name stays
    assert (p.ipoib, p.mtu, p.sl) == (True, 5, 3)
    assert [(m.kind, m.guid, m.membership, m.line) for m in p.members] == [
        ("guid", 0x10, "full", 1),
        ("guid", 0x11, "limited", 2),
        ("guid", 0x10, "limited", 2),  # the later member wins for the port (plan)
        ("ALL_SWITCHES", None, "both", 3),
        ("guid", 0x12, "limited", 4),
    ]
    assert [q.pkey for q in c] == [0x7FFF, 5, 6]


def test_ffff_is_the_default_partition() -> None:
    c = parse_partitions("Mine=0xffff, ipoib : ALL=full ;")
    assert [p.pkey for p in c] == [DEFAULT_PKEY]
    assert c.default.name == "Default" and c.default.ipoib and c.default.line == 1


def test_pkey_alone_and_generated_keys() -> None:
    c = parse_partitions("0x2 : ALL ;\nA : SELF ;\nB : SELF ;\n : ALL ;\nA : ALL_CAS ;\n")
    assert [(p.name, p.pkey, p.generated) for p in c] == [
        ("Default", 0x7FFF, False),
        ("0002", 2, False),
        ("A", 1, True),
        ("B", 3, True),  # 2 is taken: generate_pkey skips it
        ("0004", 4, True),  # no name: a new key each time
    ]
    a = c.by_pkey(1)
    assert a is not None and [m.kind for m in a.members] == ["SELF", "ALL_CAS"]  # found by name
    d = parse_partitions("Default : ALL=full ;")  # a name-only Default is 0x7fff
    assert [p.pkey for p in d] == [0x7FFF] and d.default.members[-1].membership == "full"


def test_opensm_prefixes_and_none() -> None:
    c = parse_partitions("X=0x9, i, s=3, sl=4, d=f : A, ALL_, ALL_S=b, ALL_R, S=l, NONE, N, 0x5=fu, 123=limi ;")
    x = c.by_pkey(9)
    assert x is not None
    assert x.ipoib and x.scope == (3,) and x.sl == 4 and x.defmember == "full"
    assert [(m.kind, m.guid, m.membership) for m in x.members] == [
        ("ALL", None, "full"),
        ("ALL_CAS", None, "full"),
        ("ALL_SWITCHES", None, "both"),
        ("ALL_ROUTERS", None, "full"),
        ("SELF", None, "limited"),
        ("guid", 5, "full"),
        ("guid", 123, "limited"),
    ]


def test_layout_freedom() -> None:
    """Statements over lines, several on a line, blanks around delimiters, CRLF, empty items."""
    text = "A = 0x1 , defmember = full :\n  0x10 ,\n\t0x11 = limited , , \n  0x12;B=0x2:SELF;C=0x3:\n  ;\n"
    lf = parse_partitions(text)
    crlf = parse_partitions(text.replace("\n", "\r\n"))
    assert lf.partitions == crlf.partitions
    a = lf.by_pkey(1)
    assert a is not None and [(m.guid, m.membership) for m in a.members] == [
        (0x10, "full"),
        (0x11, "limited"),
        (0x12, "full"),
    ]
    c = lf.by_pkey(3)
    assert c is not None and c.members == ()


def test_sl_kept_and_scopes_add_up() -> None:
    c = parse_partitions("A=0x1, sl=3, scope=5 : ALL ;\nA=0x1, scope=2, scope=8 : SELF ;\n")
    a = c.by_pkey(1)
    assert a is not None and a.sl == 3 and a.scope == (2, 5, 8)


def test_load_bytes(tmp_path: Path) -> None:
    p = tmp_path / "p.conf"
    p.write_bytes(b"A=0x1 : ALL ;\nB=0x2 : \xff ;\n")
    with pytest.raises(PartitionConfigError) as e:
        load_partitions(p)
    assert str(e.value) == f"{p}:2:9: not UTF-8 text (byte 0xff)"
    p.write_text("A=0x1 : SELF ;\n")
    assert load_partitions(p).by_pkey(1) is not None


# -- parsing: errors with their place ----------------------------------------------------------------------

BAD: list[tuple[str, int, int, str]] = [
    ("A=0x0: ALL;", 1, 3, "its 15-bit key is 0"),
    ("A=0x8000: ALL;", 1, 3, "its 15-bit key is 0"),
    ("0x0 : ALL;", 1, 1, "its 15-bit key is 0"),
    ("A=0x10000: ALL;", 1, 3, "does not fit 16 bits"),
    ("A=: ALL;", 1, 3, "empty P_Key"),
    ("A=0x1g: ALL;", 1, 3, "bad P_Key '0x1g'"),
    ("A=0x1x: ALL;", 1, 3, "bad P_Key"),
    ("A=010: ALL;", 1, 3, "octal"),
    ("A=0x1,ipiob: ALL;", 1, 7, "unknown partition flag 'ipiob'"),
    ("A=0x1,=4: ALL;", 1, 7, "flag without a name"),
    ("A=0x1,mtu=6: ALL;", 1, 11, "not an MTU code"),
    ("A=0x1,mtu=0: ALL;", 1, 11, "not an MTU code"),
    ("A=0x1,rate=1: ALL;", 1, 12, "not an IBA rate code"),
    ("A=0x1,sl=16: ALL;", 1, 10, "not an SL 0..15"),
    ("A=0x1,scope=0: ALL;", 1, 13, "not a scope 1..15"),
    ("A=0x1,Q_Key=0x100000000: ALL;", 1, 13, "not 32 bits"),
    ("A=0x1,TClass=256: ALL;", 1, 14, "not 8 bits"),
    ("A=0x1,FlowLabel=0x100000: ALL;", 1, 17, "not 20 bits"),
    ("A=0x1,rate=3 4: ALL;", 1, 12, "bad rate '3 4'"),
    ("A=0x1,mtu: ALL;", 1, 7, "flag 'mtu' needs a value"),
    ("A=0x1,defmember: ALL;", 1, 7, "'defmember' needs a value"),
    ("A=0x1,ipoib=1: ALL;", 1, 13, "takes no value"),
    ("A=0x1,indx0=0: ALL;", 1, 13, "takes no value"),
    ("A=0x1,defmember=half: ALL;", 1, 17, "membership 'half'"),
    ("A=0x1,mtu=4,mtu=5: ALL;", 1, 17, "mtu given twice"),
    ("A=0x1,sl=1,sl=2: ALL;", 1, 15, "sl given twice"),
    ("A=0x1: 0x12=fll;", 1, 13, "membership 'fll'"),
    ("A=0x1: 0x12=;", 1, 13, "empty membership"),
    ("A=0x1: 0x12=full x;", 1, 13, "membership 'full x'"),
    ("A=0x1: 0x12=full=x;", 1, 13, "membership 'full=x'"),
    ("A=0x1: =full;", 1, 8, "without a port GUID"),
    ("A=0x1: 0xZZ;", 1, 8, "bad port GUID '0xZZ'"),
    ("A=0x1: ALLX;", 1, 8, "bad port GUID 'ALLX'"),
    ("A=0x1: 0x0;", 1, 8, "not a 64-bit GUID"),
    ("A=0x1: 0x10000000000000000;", 1, 8, "not a 64-bit GUID"),
    ("A=0x1: 0123;", 1, 8, "octal"),
    ("A=0x1: -5;", 1, 8, "bad port GUID '-5'"),
    ("A=0x1: 0x12\nB=0x2: 0x13;", 2, 6, "':' in the member list of partition 'A' (line 1)"),
    ("A=0x1: ALL", 1, 11, "missing ';' at the end of the file (partition 'A' from line 1)"),
    ("A=0x1:\n  0x12,\n  0x13   # last\n\n", 3, 7, "missing ';' at the end of the file"),
    ("A=0x1: ALL # no semicolon\n# trailing comment\n", 1, 11, "missing ';'"),
    ("Z=0x1:", 1, 7, "missing ';'"),
    (";", 1, 1, "';' without a partition definition"),
    ("A=0x1: ALL;;", 1, 12, "';' without a partition definition"),
    ("A=0x1 ALL;", 1, 1, "without ':'"),
    ("A=0x1\n: ALL;", 1, 1, "without ':'"),
    ("A=0x1: ALL;\nA=0x2: ALL;", 2, 1, "'A' already names P_Key 0x0001 (line 1)"),
    ("Default=0x10: ALL;", 1, 1, "'Default' already names P_Key 0x7fff"),
    ("A: ALL;\nB=0x1: ALL;", 2, 1, "P_Key 0x0001 was generated for partition 'A' at line 1"),
    ("A=0x1: ALL;\nC=0x1: SELF;\nC : SELF;", 3, 1, "'C' is a second name of P_Key 0x0001"),
    ("A=0x1,mtu=4: ALL;\nA=0x1,mtu=5: ALL;", 2, 11, "mtu=5 conflicts with mtu=4 for P_Key 0x0001 at line 1"),
    ("A=0x1,ipoib: ALL;\nA=0x1,rate=6: ALL;", 2, 12, "after line 1 made the IPoIB broadcast group"),
    ("A=0x1,mtu=5: ALL;\nA=0x1,ipoib: SELF;", 2, 7, "with the default mtu, not the mtu=5 of line 1"),
    ("A=0x1: mgid;", 1, 8, "mgid needs a GID"),
    ("A=0x1: mgid=fe80::1;", 1, 13, "not a multicast GID"),
    ("A=0x1: mgid=ff12::zz;", 1, 13, "not an IPv6-style GID"),
    ("A=0x1: mgid=ff12::1%eth0;", 1, 13, "not an IPv6-style GID"),
    ("A=0x1: mgid=ff12::1,bogus=1;", 1, 21, "unknown multicast group flag 'bogus'"),
    ("A=0x1: mgid=ff12::1, 0x12=full;", 1, 22, "unknown multicast group flag '0x12'"),
    ("A=0x1: mgid=ff12::1,ipoib;", 1, 21, "unknown multicast group flag 'ipoib'"),
    ("A=0x1: mgid=ff12::1,sl=99;", 1, 24, "not an SL 0..15"),
    ("A=0x1: mgid=ff12:401b:0005::1;", 1, 13, "P_Key bits 0x0005, not 0 nor 0x8001"),
    ("A=0x1: mgid=ff12:401b::1,mtu=5;", 1, 30, "mtu=5 differs from its partition's mtu 4"),
    ("A=0x1,rate=6: mgid=ff12:401b::1;\n", 1, 0, ""),  # inherits the partition's rate: fine
    ("A=0x1: mgid=ff12::1;\nB=0x2: mgid=ff12::1;", 2, 13, "defined again (first at line 1)"),
    ("A=0x1,ipoib: mgid=ff12:401b:8001::ffff:ffff;", 1, 19, "the IPoIB broadcast group"),
    ("A=0x1: ALL;\x00", 1, 12, "NUL character"),
    ("A=0x1: ALL;\x0b", 1, 12, "control character U+000B"),
    ("A=0x1: " + "ALL," * 1100 + ";", 1, 4095, "OpenSM cuts lines at 4094"),
]


@pytest.mark.parametrize(("text", "line", "col", "what"), BAD, ids=[f"bad{i:02d}" for i in range(len(BAD))])
def test_bad_files(text: str, line: int, col: int, what: str) -> None:
    if not what:
        parse_partitions(text, "bad.conf")  # the control case parses
        return
    with pytest.raises(PartitionConfigError) as e:
        parse_partitions(text, "bad.conf")
    msg = str(e.value)
    assert msg.startswith(f"bad.conf:{line}:{col}: "), msg
    assert what in msg, msg
    assert (e.value.line, e.value.col) == (line, col)


def test_bad_files_count() -> None:
    assert sum(1 for *_, what in BAD if what) >= 30


_POOL = [
    "ALL", "SELF", "ALL_CAS", "NONE", "mgid=ff12::1", "mgid=ff12:401b::5", "0x", "0xffff", "0x8000", "=", "==",
    "ipoib", "indx0", "defmember=both", "full", "limi", "scope=3", "sl=99", "mtu=5", "rate=2", "", ";", ":", ",",
    "#", "\n", "99999999999999999999", "0x0002c90300a1b2c1", "Default", "Q_Key=0x1", "TClass=300", "\r\n", "\t",
]  # fmt: skip
_CHARS = " \t\n\r;:,=#0x123456789abcdefABCDEF_-.%\x00\x0b\x7f\u00e9\u2028"


def _mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(6)
        i = rng.randrange(len(text) + 1)
        if op == 0 and text:
            text = text[: min(i, len(text) - 1)] + text[min(i, len(text) - 1) + 1 :]
        elif op == 1:
            text = text[:i] + rng.choice(_CHARS) + text[i:]
        elif op == 2:
            tokens = re.split(r"([\s;:,=#]+)", text)
            j = rng.randrange(len(tokens))
            tokens[j] = rng.choice(_POOL)
            text = "".join(tokens)
        elif op == 3:
            lines = text.split("\n")
            j = rng.randrange(len(lines))
            lines.insert(rng.randrange(len(lines) + 1), lines[j])
            text = "\n".join(lines)
        elif op == 4:
            lines = text.split("\n")
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        else:
            text = text[:i]
    return text


def test_mutation_fuzz() -> None:
    """2,000 random edits of a good file: each parses or raises a located PartitionConfigError, nothing else."""
    good = EXAMPLES.read_text()
    rng = random.Random(20_231_202)
    parsed = failed = 0
    located = re.compile(r"^fuzz\.conf:(\d+):(\d+): \S")
    for _ in range(2000):
        text = _mutate(good, rng)
        try:
            c = parse_partitions(text, "fuzz.conf")
        except PartitionConfigError as e:
            failed += 1
            m = located.match(str(e))
            assert m, (str(e), text)
            assert 1 <= int(m.group(1)) <= text.count("\n") + 1 and int(m.group(2)) >= 1, str(e)
        else:
            parsed += 1
            assert isinstance(c, PartitionConfig) and c.default.pkey == DEFAULT_PKEY
    assert parsed > 100 and failed > 100, (parsed, failed)


# -- the plan on small fabrics -----------------------------------------------------------------------------


def test_tables_per_port(ft: Fabric) -> None:
    # OpenSM 3.3.23 over ibsim: partitions in byte-swapped P_Key order (0x0100 before 0x0001).
    p = plan("A=0x0100 : ALL_CAS; B=0x0001 : ALL_CAS; C=0x0002: ALL_CAS=full;\n", ft)
    assert table(p, ft, "host-00000", 1) == ["ffff", "0100", "0001", "8002"]  # the SM's port: full Default
    assert table(p, ft, "host-00001", 1) == ["7fff", "0100", "0001", "8002"]
    assert table(p, ft, "leaf-00", 0) == ["7fff"]
    assert table(p, ft, "spine-01", 0) == ["7fff"]
    ends = {(n, q) for (n, q) in p.port_keys}
    assert ends == {(i, 1) for i in range(8)} | {(i, 0) for i in range(8, 14)}


def test_self_is_the_sm_port(ft: Fabric) -> None:
    text = "Mgmt=0x20 : SELF=full ;"
    for sm in (3, 5):
        p = plan(text, ft, sm_port=(sm, 1))
        assert p.members(0x20) == {(sm, 1): True}
        assert table(p, ft, f"host-{sm:05d}", 1) == ["ffff", "8020"]  # and the implicit SELF=full of Default
    leaf = ft.by_name("leaf-02")
    p = plan(text, ft, sm_port=(leaf, 0))
    assert p.members(0x20) == {(leaf, 0): True} and table(p, ft, "leaf-02", 0) == ["ffff", "8020"]
    p = plan(text, ft, sm_port=None)
    assert p.members(0x20) == {}
    assert p.problems == [
        "t.conf:1:13: SELF: the SM's port is not known (partition 'Mgmt')",
        "partition 'Mgmt' (0x0020) has no port on the subnet",
    ]


def test_all_switches_is_port_0(ft: Fabric) -> None:
    p = plan("Sw=0x30 : ALL_SWITCHES=full ; Ca=0x31 : ALL_CAS ; Any=0x32 : ALL ; R=0x33 : ALL_ROUTERS ;", ft)
    assert set(p.members(0x30)) == {(n, 0) for n in range(8, 14)}
    assert set(p.members(0x31)) == {(n, 1) for n in range(8)}
    assert set(p.members(0x32)) == set(p.members(0x30)) | set(p.members(0x31))
    assert p.members(0x33) == {}
    assert table(p, ft, "leaf-01", 0) == ["7fff", "8030", "0032"]
    assert table(p, ft, "host-00004", 1) == ["7fff", "0031", "0032"]
    assert (ft.by_name("leaf-01"), 1) in p.tables  # an external port facing a CA: its CA's keys
    assert (ft.by_name("leaf-01"), 3) not in p.tables  # facing a spine: no table


def test_guids_and_problems(ft: Fabric) -> None:
    down = ft.copy()
    down.link_down(6, 1)
    text = f"P=0x40 : {guid_of_host(2):#x}=full, 0xdead, {guid_of_host(6):#x},\n  {ft.node_guid[9]:#x} ;"
    p = plan(text, down)
    assert p.members(0x40) == {(2, 1): True, (9, 0): False}  # a switch is named by its port 0 GUID
    assert p.problems == [
        "t.conf:1:32: port GUID 0x000000000000dead is not on the subnet (partition 'P')",
        "t.conf:1:40: port GUID 0x0002c9000000000d (host-00006[1]) is down (partition 'P')",
    ]
    assert (6, 1) not in p.tables and (ft.by_name("leaf-03"), 1) not in p.enforcement


def test_later_member_wins_and_both(ft: Fabric) -> None:
    text = f"X=0x50 : ALL_CAS=full, {guid_of_host(1):#x}=limited, ALL_SWITCHES=both ;"
    p = plan(text, ft)
    m = p.members(0x50)
    assert m[(0, 1)] is True and m[(1, 1)] is False and m[(8, 0)] is True  # both is full without -W
    assert table(p, ft, "leaf-00", 0) == ["7fff", "8050"]
    # OpenSM 3.3.23 -W (allow_both_pkeys) over ibsim: limited before full, and only 0xffff counts as
    # the Default key that goes to index 0, so a limited Default lands after the others
    pb = plan(text, ft, allow_both_pkeys=True)
    assert table(pb, ft, "leaf-00", 0) == ["0000", "0050", "8050", "7fff"]
    assert table(pb, ft, "host-00001", 1) == ["0000", "0050", "7fff"]
    assert table(pb, ft, "host-00000", 1) == ["ffff", "8050"]
    assert pb.members(0x50)[(8, 0)] is True
    assert pb.shared((8, 0), (1, 1)) == (0x8050,)  # Default: limited on both


def test_shared_full_and_limited(ft: Fabric) -> None:
    text = f"L=0x60 : ALL_CAS ; F=0x61 : {guid_of_host(1):#x}=full, {guid_of_host(2):#x} ; "
    p = plan(text, ft)
    sm, h1, h2, h3 = (0, 1), (1, 1), (2, 1), (3, 1)
    assert p.shared(sm, h1) == (0xFFFF,)  # the SM is a full member of Default; 0x60 is limited on both
    assert p.shared(h1, sm) == (0x7FFF,)  # as the first port holds it
    assert p.shared(h2, h3) == ()  # two limited members talk on nothing
    assert p.shared(h1, h2) == (0x8061,)
    assert p.shared(h2, h1) == (0x0061,)
    assert p.shared(h1, (99, 1)) == ()
    full_default = plan("Default=0x7fff : ALL=full ; L=0x60 : ALL_CAS ;", ft)
    assert full_default.shared(h2, h3) == (0xFFFF,)


def test_index_stability_across_changes(ft: Fabric) -> None:
    """A running OpenSM 3.3.23 over ibsim, re-reading its file on SIGHUP between these steps."""
    steps = [
        ("A=0x1: ALL_CAS; B=0x2: ALL_CAS; C=0x3: ALL_CAS;", ["7fff", "0001", "0002", "0003"]),
        ("A=0x1: ALL_CAS; C=0x3: ALL_CAS; D=0x4: ALL_CAS;", ["7fff", "0001", "0000", "0003", "0004"]),
        ("A=0x1: ALL_CAS; B=0x2: ALL_CAS; C=0x3: ALL_CAS; D=0x4: ALL_CAS;", ["7fff", "0001", "0002", "0003", "0004"]),
        (
            "A=0x1,indx0: ALL_CAS; B=0x2: ALL_CAS; C=0x3: ALL_CAS; D=0x4: ALL_CAS;",
            ["0001", "0000", "0002", "0003", "0004", "7fff"],
        ),
        (
            "A=0x1: ALL_CAS; B=0x2: ALL_CAS; C=0x3: ALL_CAS; D=0x4: ALL_CAS;",
            ["7fff", "0000", "0002", "0003", "0004", "0001"],
        ),
        ("E=0x5: ALL_CAS;", ["7fff", "0000", "0000", "0000", "0000", "0000", "0005"]),
        ("A=0x1: ALL_CAS; E=0x5: ALL_CAS=full;", ["7fff", "0000", "0000", "0000", "0000", "0001", "8005"]),
    ]
    prev: PartitionPlan | None = None
    leaf = ft.by_name("leaf-00")
    for text, want in steps:
        p = plan(text, ft, prev)
        assert table(p, ft, "host-00001", 1) == want, text
        assert table(p, ft, "host-00000", 1) == [k if k != "7fff" else "ffff" for k in want], text
        assert table(p, ft, "leaf-00", 2) == [k for k in want if k != "0000"]  # packed for the switch port
        assert p.enforcement[(leaf, 2)] == (1, 1)
        prev = p
    assert prev is not None
    again = plan(steps[-1][0], ft, prev)
    assert again.tables == prev.tables and again.port_keys == prev.port_keys  # a fixed point


def test_indx0_per_statement(ft: Fabric) -> None:
    # OpenSM 3.3.23 over ibsim with the examples fixture: Tenant (indx0) at index 0 on the CAs.
    p = plan_partitions(load_partitions(EXAMPLES), ft, sm_port=(0, 1))
    assert table(p, ft, "host-00003", 1) == ["8123", "0300", "ffff"]  # the file makes ALL full in Default
    assert table(p, ft, "host-00000", 1) == ["8123", "0300", "ffff"]
    assert table(p, ft, "spine-00", 0) == ["ffff", "0300"]
    assert [q.name for q in p.ipoib] == ["Default", "Tenant"]  # Compute has no port here
    # a later statement of the same P_Key without indx0 takes index 0 back for its members
    q = plan(f"T=0x9,indx0 : ALL_CAS ; T=0x9 : {guid_of_host(4):#x} ;", ft)
    assert table(q, ft, "host-00003", 1) == ["0009", "7fff"]
    assert table(q, ft, "host-00004", 1) == ["7fff", "0009"]


def test_partition_cap_clips(ft: Fabric) -> None:
    # OpenSM 3.3.23 over ibsim (switch PartitionCap 8): ERR 0512 for the keys that do not fit.
    text = "".join(f"P{i}=0x{i:x} : ALL_SWITCHES{'=full' if i % 2 else ''};\n" for i in range(1, 10))
    p = plan(text + "Z=0x100: ALL_SWITCHES;\n", ft)
    want = ["7fff", "0100", "8001", "0002", "8003", "0004", "8005", "0006"]
    assert all(table(p, ft, f"leaf-{i:02d}", 0) == want for i in range(4))
    assert p.problems == [
        "PKeyTable full (PartitionCap 8): 0x8007, 0x0008, 0x8009 left out on 6 port(s), e.g. leaf-00[0]"
    ]
    big = plan(text, ft, partition_caps={n: 16 for n in range(8, 14)})
    assert len(big.tables[(8, 0)]) == 10 and big.problems == []
    # a full table takes the first hole from index 1
    prev = plan("A=0x1: ALL_CAS; B=0x2: ALL_CAS; C=0x3: ALL_CAS;", ft, partition_caps={1: 4})
    p = plan("A=0x1: ALL_CAS; C=0x3: ALL_CAS; D=0x4: ALL_CAS;", ft, prev, partition_caps={1: 4})
    assert table(p, ft, "host-00001", 1) == ["7fff", "0001", "0004", "0003"]
    assert table(p, ft, "host-00002", 1) == ["7fff", "0001", "0000", "0003", "0004"]


def test_enforcement(ft: Fabric) -> None:
    text = "A=0x1 : ALL_CAS=full ;"
    leaf = ft.by_name("leaf-00")
    p = plan(text, ft)
    switch_ports = {(n, q) for n in range(8, 14) for q in range(1, 5)}
    assert set(p.enforcement) == switch_ports
    facing_cas = {(n, q) for n in range(8, 12) for q in (1, 2)}
    assert {k for k, v in p.enforcement.items() if v != (0, 0)} == facing_cas
    assert all(p.tables[k] == p.tables[(ft.peer_node[k], ft.peer_port[k])] for k in facing_cas)
    assert not any(k in p.tables for k in switch_ports - facing_cas)
    for mode, bits in (("in", (1, 0)), ("out", (0, 1)), ("off", (0, 0))):
        q = plan(text, ft, part_enforce=mode)
        assert q.enforcement[(leaf, 1)] == bits
    assert (leaf, 1) not in plan(text, ft, part_enforce="off").tables  # off: OpenSM leaves the table
    small = plan(text, ft, enforcement_caps={leaf: 1})
    assert small.enforcement[(leaf, 1)] == (0, 0) and small.enforcement[(leaf + 1, 1)] == (1, 1)
    assert small.problems == [
        "2 P_Keys exceed PartitionEnforcementCap 1: enforcement off on 2 switch port(s), e.g. leaf-00[1]"
    ]
    none = plan(text, ft, enforcement_caps={leaf: 0})
    assert none.enforcement[(leaf, 1)] == (0, 0) and (leaf, 1) not in none.tables and none.problems == []
    with pytest.raises(ValueError, match="part_enforce"):
        plan(text, ft, part_enforce="sideways")


def test_members_and_ipoib(ft: Fabric) -> None:
    p = plan("Default=0x7fff,ipoib : ALL=full ; X=0x7,ipoib : 0x99 ; Y=0x8 : SELF ;", ft)
    assert [q.pkey for q in p.ipoib] == [0x7FFF]  # X has no port on the subnet
    assert all(p.members(0xFFFF).values()) and len(p.members(0x7FFF)) == 14
    assert p.members(0x8) == {(0, 1): False} == p.members(0x8008)
    assert p.members(0x7) == {}


def test_blocks() -> None:
    t = (0xFFFF, 0x0001, 0, 0x8002)
    blocks = pkey_blocks(t)
    assert blocks == [(0, bytes.fromhex("ffff 0001 0000 8002") + bytes(56))]
    assert [b for b, _ in pkey_blocks(t, 4)] == [0, 1, 2, 3] and pkey_blocks(t, 4)[3][1] == bytes(64)
    long = tuple(range(1, 41))
    assert pkey_blocks(long)[1][1][:4] == bytes.fromhex("0021 0022")
    assert changed_blocks(t, t) == []
    assert changed_blocks(t, t[:3]) == [0]
    assert changed_blocks(long, t) == [0, 1]
    assert changed_blocks(t, long) == [0, 1]  # a block that empties is sent too
    assert changed_blocks((*long[:32], 7), long) == [1]
    assert pkey_blocks(()) == [] and changed_blocks((), ()) == []


@pytest.mark.slow
def test_fat_tree_k36_fast() -> None:
    f = fattree(3, 36)
    cfg = parse_partitions(
        "Default=0x7fff,ipoib : ALL=full ; Storage=0x10 : ALL_CAS ; Mgmt=0x20 : ALL_SWITCHES, SELF=full ;"
    )
    t0 = time.perf_counter()
    p = plan_partitions(cfg, f, sm_port=(0, 1))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = plan_partitions(cfg, f, sm_port=(0, 1), previous=p)
    second = time.perf_counter() - t0
    assert first < 1.0 and second < 1.0, (first, second)
    assert len(p.port_keys) == 11_664 + 1_620
    cas = f.cas
    assert {p.tables[(int(n), 1)] for n in cas[1:]} == {(0xFFFF, 0x0010)}
    assert p.tables[(0, 1)] == (0xFFFF, 0x0010, 0x8020)
    assert {p.tables[(int(n), 0)] for n in f.switches} == {(0xFFFF, 0x0020)}
    assert sum(v == (1, 1) for v in p.enforcement.values()) == 11_664
    assert again.tables == p.tables and again.problems == p.problems == []
    assert np.array_equal(again.endports, p.endports)
