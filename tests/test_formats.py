"""Net files and ibnetdiscover output: round trips, ibsim's GUID allocation, real captures, bad files, the CLI."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric import generate
from fabric.errors import FormatError, IbfmError
from fabric.formats.netfile import format_net, parse_net, read_net, write_net
from fabric.ibsim import IbsimProcess
from fabric.model import Fabric, FabricBuilder, NodeType, Speed, Width
from ibfm.cli import main as cli_main
from tests.conftest import need_ibsim

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "fixtures" / "small"
CAPTURED = ROOT / "fixtures" / "ibnetdiscover"
SMALL_FILES = sorted(SMALL.glob("*.net"))
CAPTURED_FILES = sorted(CAPTURED.glob("*.txt"))


# -- comparing fabrics by GUID --------------------------------------------------------------------


def facts(f: Fabric, *, rates: bool = True, lids: bool = True) -> dict[str, Any]:
    """What a net file says about a fabric, keyed by GUIDs so that node order and ids do not matter."""
    g = f.node_guid.tolist()
    nodes = {}
    for i in range(f.n_nodes):
        ports = [p for p in range(f.max_port + 1) if f.port_exists[i, p]]
        nodes[g[i]] = (
            int(f.node_type[i]),
            int(f.nports[i]),
            f.descs[i],
            int(f.sysimg_guid[i]),
            int(f.vendor_id[i]),
            int(f.device_id[i]),
            tuple(int(f.port_guid[i, p]) for p in ports),
        )
    links = {}
    for a, p, b, q in f.link_array().tolist():
        key = frozenset({(g[a], p), (g[b], q)})
        assert len(key) == 2
        links[key] = (int(f.width_active[a, p]), int(f.speed_active[a, p])) if rates else None
    out: dict[str, Any] = {"nodes": nodes, "links": links}
    if lids:
        ep = f.endports().tolist()
        out["lids"] = {(g[n], p): (int(f.lid[n, p]), int(f.lmc[n, p])) for n, p in ep}
    return out


def roundtrip(f: Fabric, style: str) -> Fabric:
    return parse_net(format_net(f, style), f"<{style}>")  # type: ignore[arg-type]


# -- round trips -------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["ibsim", "ibnetdiscover"])
@pytest.mark.parametrize("path", SMALL_FILES, ids=lambda p: p.stem)
def test_fixture_round_trip(path: Path, style: str) -> None:
    f = read_net(path)
    g = roundtrip(f, style)
    assert facts(g) == facts(f)
    if style == "ibsim":
        assert g.names == f.names
    else:
        assert g.names == [f"{'S' if f.is_switch(g.by_guid(int(x))) else 'H'}-{int(x):016x}" for x in g.node_guid]


def _special_fabric() -> Fabric:
    """Everything a file can carry: LIDs and LMC, vendor/device ids, odd GUIDs, a down link, quotes in a desc."""
    fb = FabricBuilder()
    s1 = fb.add_node(
        NodeType.SWITCH,
        8,
        "core",
        desc='core "A" switch',
        guid=0x7CFE900300BDC060,
        port_guids=[0x7CFE900300BDC061] * 9,
        vendor_id=0x2C9,
        device_id=0xD2F0,
    )
    s2 = fb.add_node(
        NodeType.SWITCH,
        36,
        "edge",
        guid=0x248A0703005D7BC0,
        sysimg_guid=0x248A0703005D7BC7,
        vendor_id=0x2C9,
        device_id=0xD2F0,
    )
    h1 = fb.add_node(
        NodeType.CA,
        2,
        "node1",
        desc="node1 HCA-1",
        guid=0x506B4B03007B1E5A,
        port_guids=[0, 0x506B4B03007B1E5B, 0x506B4B0300AAAAAA],
        device_id=0x1017,
    )
    h2 = fb.add_node(NodeType.CA, 1, "node2", guid=0x100, device_id=0x1017)
    # An unconnected port's GUID is written nowhere: readers derive node GUID + port, as ibsim does.
    r1 = fb.add_node(NodeType.ROUTER, 2, "gw", guid=0x900, port_guids=[0, 0x9FF, 0x902], vendor_id=0x119F)
    fb.connect(s1, 1, s2, 35)
    fb.connect(s1, 2, s2, 36)
    fb.connect(s2, 1, h1, 1)
    fb.connect(s1, 8, h1, 2)
    fb.connect(s2, 2, h2, 1)
    fb.connect(s1, 3, r1, 1)
    for n, p in ((s1, 1), (s2, 35)):
        fb.set_port(n, p, width_cap=int(Width.X12), speed_cap=Speed.EDR)
    for n, p in ((s2, 1), (h1, 1)):
        fb.set_port(n, p, width_cap=int(Width.X2), speed_cap=Speed.HDR)
    for n, p in ((s1, 8), (h1, 2)):
        fb.set_port(n, p, width_cap=int(Width.X4), speed_cap=Speed.FDR10)
    f = fb.build()
    f.lid[s1, 0], f.lmc[s1, 0] = 1, 0
    f.lid[s2, 0] = 2
    f.lid[h1, 1], f.lmc[h1, 1] = 4, 2
    f.lid[h1, 2], f.lmc[h1, 2] = 8, 2
    f.lid[h2, 1] = 12
    f.link_down(s1, 2)  # cabled, but down: still written, comes back up
    return f


@pytest.mark.parametrize("style", ["ibsim", "ibnetdiscover"])
def test_round_trip_keeps_guids_lids_rates_and_ids(style: str) -> None:
    f = _special_fabric()
    g = roundtrip(f, style)
    want = facts(f)
    # The down link comes back as a cable that trains at the common rate (4x NDR defaults).
    s1, s2 = f.by_name("core"), f.by_name("edge")
    want["links"][frozenset({(int(f.node_guid[s1]), 2), (int(f.node_guid[s2]), 36)})] = (2, int(Speed.NDR))
    assert facts(g) == want
    rates = {k: v for k, v in facts(g)["links"].items() if v != (2, int(Speed.NDR))}
    assert sorted(rates.values()) == [(2, int(Speed.FDR10)), (8, int(Speed.EDR)), (16, int(Speed.HDR))]
    if style == "ibsim":
        assert g.names == f.names
        assert g.descs[s1] == 'core "A" switch'


def test_ibsim_style_only_writes_what_ibsim_would_not_allocate() -> None:
    text = format_net(read_net(SMALL / "ring4.net"), "ibsim")
    assert "guid=" not in text and "vendid" not in text and "devid" not in text
    text = format_net(_special_fabric(), "ibsim")
    assert "switchguid=0x7cfe900300bdc060(7cfe900300bdc061)\n" in text
    assert "switchguid=0x248a0703005d7bc0\n" in text
    assert "(506b4b0300aaaaaa)" in text  # a CA port GUID that is not node GUID + port
    assert "(506b4b03007b1e5b)" not in text  # one that is
    assert text.count("devid=0x1017") == 1  # devid stays in force, as ibsim reads it


def test_generated_fabrics_round_trip() -> None:
    gen = generate
    for f in (gen.fattree(3, 8), gen.fattree(2, 12, speed=Speed.HDR), gen.ring(5, 2)):
        for style in ("ibsim", "ibnetdiscover"):
            g = roundtrip(f, style)
            assert facts(g) == facts(f)
            assert g.summary() == f.summary()


def test_write_net_is_atomic_and_takes_streams(tmp_path: Path) -> None:
    f = read_net(SMALL / "fattree2_4leaf.net")
    dest = tmp_path / "out.net"
    write_net(f, dest)
    first = dest.read_text()
    assert facts(read_net(dest)) == facts(f)
    buf = io.StringIO()
    write_net(f, buf, style="ibnetdiscover")
    assert buf.getvalue() == format_net(f, "ibnetdiscover")
    bad = f.copy()
    bad.names[0] = 'say "hi"'
    with pytest.raises(IbfmError, match="node id"):
        write_net(bad, dest)
    assert dest.read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.net"]


# -- ibsim's meaning of a file --------------------------------------------------------------------------

# What ibsim 0.10 + ibnetdiscover showed for this file (see the module docstring of fabric.formats.netfile).
IBSIM_ALLOCATION = """\
vendid=0x2c9
devid=0x1234
switchguid=0x9000
Switch	4 "SA"
[1]	"HA"[1]
[2]	"HB"[1]
[3]	"SB"[1]

Switch	4 "SB"
[1]	"SA"[3]
[2]	"HC"[1]

caguid=0x5000
Hca	2 "HA"
[1]	"SA"[1]

devid=0x77
Hca	1 "HB"
[1]	"SA"[2]

sysimgguid=0x4444
Hca	1 "HC"
[1]	"SB"[2]

Hca	1 "HD"

Switch	4 "SC"
"""


def test_guids_vendid_devid_sysimgguid_as_ibsim_reads_them() -> None:
    f = parse_net(IBSIM_ALLOCATION)
    got = {
        f.names[i]: (int(f.node_guid[i]), int(f.vendor_id[i]), int(f.device_id[i]), int(f.sysimg_guid[i]))
        for i in range(f.n_nodes)
    }
    assert got == {
        "SA": (0x9000, 0x2C9, 0x1234, 0x9000),
        "SB": (0x9001, 0, 0x1234, 0x9001),
        "HA": (0x5000, 0, 0x1234, 0x5000),
        "HB": (0x5003, 0, 0x77, 0x5003),
        "HC": (0x5005, 0, 0x77, 0x4444),
        "HD": (0x5007, 0, 0x77, 0x5007),
        "SC": (0x9002, 0, 0x77, 0x9002),
    }
    ha = f.by_name("HA")
    assert f.port_guid[ha, 1:3].tolist() == [0x5001, 0x5002]
    assert f.port_guid[f.by_name("SB"), 0] == 0x9001


def test_default_guids_follow_ibsim() -> None:
    f = read_net(SMALL / "2sw4hca_double.net")
    assert [hex(int(g)) for g in f.node_guid] == [
        "0x200000",
        "0x200001",
        "0x100000",
        "0x100002",
        "0x100004",
        "0x100006",
    ]
    assert int(f.port_guid[f.by_name("hca2"), 1]) == 0x100003


def test_key_lines_may_have_spaces_around_the_sign() -> None:
    f = parse_net('caguid = 0x5000\nHca\t1 "h"\n')
    assert int(f.node_guid[0]) == 0x5000
    # Numbers read as ibsim's strtoull(.., 0) reads them: a leading 0 is octal.
    assert int(parse_net('devid=010\nHca\t1 "h"\n').device_id[0]) == 8
    with pytest.raises(FormatError, match="bad value"):
        parse_net('devid=09\nHca\t1 "h"\n')


def test_port_options_and_comment_rates() -> None:
    text = """\
Switch	8 "SW"
[1]	"H1"[1]	w=8 s=4
[2]	"H2"[1]	w=2 e=4
[3]	"H3"[1]	w=8		# "H3" lid 0 4xQDR
[4]	"H4"[1]
Hca	1 "H1"
[1]	"SW"[1]	w=8 s=4
Hca	1 "H2"
[1]	"SW"[2]	w=2 e=4
Hca	1 "H3"
[1]	"SW"[3]	w=8		# lid 0 lmc 0 "SW" lid 0 4xQDR
Hca	1 "H4"
[1]	"SW"[4]
"""
    f = parse_net(text)
    sw = f.by_name("SW")
    got = [(int(f.width_active[sw, p]), Speed(int(f.speed_active[sw, p])).name) for p in range(1, 5)]
    # Same as ibsim: 12xQDR, 4xHDR, the comment over w=, and no rate means the model default.
    assert got == [(8, "QDR"), (2, "HDR"), (2, "QDR"), (2, "NDR")]


def test_include_reads_relative_to_the_including_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "hosts.net").write_text('Hca\t1 "h1"\n[1]\t"sw"[1]\n\nHca\t1 "h2"\n[1]\t"sw"[3]\n')
    (tmp_path / "top.net").write_text('Switch\t4 "sw"\n[1]\t"h1"[1]\n[3]\t"h2"[1]\n\ninclude sub/hosts.net\n')
    f = read_net(tmp_path / "top.net")
    assert f.summary()["links"] == 2
    (tmp_path / "sub" / "hosts.net").write_text('Hca\t1 "h1"\n[1]\t"sw"[1]\n\nHca\t1 "h2"\n[1]\t"sw"[2]\n')
    with pytest.raises(FormatError) as ei:
        read_net(tmp_path / "top.net")
    assert ei.value.path.endswith("top.net") and ei.value.line == 3
    assert f'but "h2"[1] -> "sw"[2] ({tmp_path / "sub" / "hosts.net"}:5)' in str(ei.value)


# -- real ibnetdiscover output ----------------------------------------------------------------------------


def test_every_small_fixture_has_a_capture() -> None:
    assert {p.stem for p in CAPTURED_FILES} == {p.stem for p in SMALL_FILES}
    assert len(SMALL_FILES) >= 4


@pytest.mark.parametrize("captured", CAPTURED_FILES, ids=lambda p: p.stem)
def test_captured_ibnetdiscover_matches_the_net_file(captured: Path) -> None:
    net = read_net(SMALL / f"{captured.stem}.net")
    cap = read_net(captured)
    assert all(n.startswith(("S-", "H-")) for n in cap.names)
    want, got = facts(net, rates=False), facts(cap, rates=False)
    assert got == want  # same GUIDs, types, port counts, descriptions, port GUIDs, links, LIDs
    cap_rates = {frozenset(k): v for k, v in facts(cap)["links"].items()}
    if "lid 0 4x" in (SMALL / f"{captured.stem}.net").read_text():
        assert cap_rates == facts(net)["links"]  # the file's rates, as ibsim trained them
    else:
        assert set(cap_rates.values()) == {(2, int(Speed.SDR))}  # ibsim's default; ours is 4x NDR


def test_captured_real_line_forms_parse() -> None:
    text = (CAPTURED / "2sw4hca_double.txt").read_text()
    assert '[1](100001) \t"S-0000000000200000"[1]\t\t# lid 0 lmc 0 "sw1" lid 0 4xHDR' in text
    f = parse_net(text)
    h = f.by_guid(0x100000)
    assert f.names[h] == "H-0000000000100000" and f.descs[h] == "hca1"
    assert f.by_name("hca1") == h  # a unique NodeDescription finds the node too


# -- against ibsim itself -----------------------------------------------------------------------------------


def _ibsim_fabric() -> Fabric:
    """A fabric inside what ibsim can express: rates up to HDR, CA port GUIDs = node GUID + port."""
    f = read_net(SMALL / "dualport_ca.net")
    f.lid[f.by_name("swA"), 0] = 1
    f.lid[f.by_name("swB"), 0] = 2
    dual = f.by_name("dual")
    f.lid[dual, 1], f.lid[dual, 2], f.lmc[dual, 1:3] = 4, 8, 2
    return f


@pytest.mark.ibsim
@pytest.mark.parametrize("style", ["ibsim", "ibnetdiscover"])
def test_ibsim_runs_written_file_and_ibnetdiscover_sees_it(tmp_path: Path, style: str, ibsim_tools: None) -> None:
    f = _ibsim_fabric()
    path = tmp_path / f"out-{style}.net"
    write_net(f, path, style=style)  # type: ignore[arg-type]
    with IbsimProcess(path) as sim:
        out = sim.run(["ibnetdiscover"], timeout=60).stdout
        assert "parsed" in sim.output()
    seen = parse_net(out, "ibnetdiscover")
    assert facts(seen) == facts(f)


@pytest.mark.ibsim
def test_ibsim_runs_a_generated_fat_tree(tmp_path: Path) -> None:
    gen = generate
    need_ibsim()
    f = gen.fattree(2, 8, speed=Speed.EDR)
    path = tmp_path / "ft.net"
    write_net(f, path)
    with IbsimProcess(path) as sim:
        seen = parse_net(sim.run(["ibnetdiscover"], timeout=60).stdout, "ibnetdiscover")
    assert facts(seen) == facts(f)


# -- malformed files -------------------------------------------------------------------------------------

SW_H = 'Switch\t4 "sw"\n[1]\t"h"[1]\n\nHca\t1 "h"\n[1]\t"sw"[1]\n'

BAD: list[tuple[str, str, int, str]] = [
    ("unknown record", SW_H + "\nChassis 3\n", 7, "unknown record"),
    ("unknown key", "vendid=0x2c9\nfoo=1\n" + SW_H, 2, "unknown record"),
    ("bad key value", "caguid=0xZZ\n" + SW_H, 1, "bad value"),
    ("port beyond count", SW_H + '\nSwitch\t4 "s2"\n[5]\t"sw"[2]\n', 8, "no port 5"),
    (
        "remote port beyond count",
        'Switch\t4 "sw"\n[1]\t"h"[2]\n\nHca\t1 "h"\n[1]\t"sw"[1]\n',
        2,
        '"h" port 2, which has ports 1..1',
    ),
    (
        "ends disagree",
        'Switch\t4 "sw"\n[1]\t"h"[1]\n[2]\t"h2"[1]\n\nHca\t1 "h"\n[1]\t"sw"[2]\n\nHca\t1 "h2"\n[1]\t"sw"[1]\n',
        2,
        'but "h"[1] -> "sw"[2] (line 6)',
    ),
    ("one end missing", 'Switch\t4 "sw"\n[1]\t"h"[1]\n\nHca\t1 "h"\n', 2, "does not list port 1"),
    ("duplicate id", SW_H + '\nHca\t1 "h"\n', 7, 'duplicate node id "h" (first at line 4)'),
    ("duplicate node guid", "switchguid=0x10\n" + SW_H + '\ncaguid=0x10\nHca\t2 "x"\n', 9, "duplicate node GUID 0x10"),
    (
        "duplicate port guid",
        SW_H.replace('[1]\t"sw"[1]', '[1](777)\t"sw"[1]').replace("\n\n", '\n[2]\t"x"[1]\n\n')
        + '\nHca\t1 "x"\n[1](777)\t"sw"[2]\n',
        9,
        "duplicate port GUID 0x777",
    ),
    (
        "port guid disagrees",
        SW_H.replace('"h"[1]\n', '"h"[1](55)\n').replace('[1]\t"sw"', '[1](56)\t"sw"'),
        5,
        "port GUID 0x56 here but 0x55 at line 2",
    ),
    ("zero guid", "caguid=0\n" + SW_H, 1, "not a valid GUID"),
    ("truncated record at end", SW_H + "\nvendid=0x2c9\ndevid=0x1\n", 7, "truncated record"),
    ("truncated header", SW_H + '\nSwitch\t8 "sw2\n', 7, "truncated or malformed Switch header"),
    ("header without id", "Switch\t8\n", 1, "truncated or malformed Switch header"),
    ("truncated port line", 'Switch\t4 "sw"\n[1]\t"h"[\n', 2, "malformed port line"),
    ("port line before any node", '[1]\t"h"[1]\n' + SW_H, 1, "outside a node record"),
    ("port line after key lines", 'Switch\t4 "sw"\nvendid=0x2\n[1]\t"h"[1]\n', 3, "outside a node record"),
    ("link to undefined node", SW_H + '\nSwitch\t4 "s2"\n[2]\t"ghost"[1]\n', 8, 'undefined node "ghost"'),
    (
        "port listed twice",
        'Switch\t4 "sw"\n[1]\t"h"[1]\n[1]\t"h"[1]\n\nHca\t1 "h"\n[1]\t"sw"[1]\n',
        3,
        "listed twice (first at line 2)",
    ),
    ("link to itself", 'Switch\t4 "sw"\n[1]\t"sw"[1]\n', 2, "links to itself"),
    ("too many ports", 'Switch\t65 "big"\n', 1, "outside 1..64"),
    ("zero ports", 'Hca\t0 "none"\n', 1, "outside 1..64"),
    (
        "bad rate",
        'Switch\t4 "sw"\n[1]\t"h"[1]\t\t# "h" lid 0 4xWARP\n\nHca\t1 "h"\n[1]\t"sw"[1]\n',
        2,
        "bad link rate '4xWARP'",
    ),
    (
        "rates disagree",
        'Switch\t4 "sw"\n[1]\t"h"[1]\t\t# "h" lid 0 4xHDR\n\nHca\t1 "h"\n'
        '[1]\t"sw"[1]\t\t# lid 0 lmc 0 "sw" lid 0 4xEDR\n',
        5,
        "rate 4xEDR here but 4xHDR at line 2",
    ),
    ("bad port option", 'Switch\t4 "sw"\n[1]\t"h"[1]\tspeed=fast\n', 2, "bad port option 'speed=fast'"),
    ("bad width option", 'Switch\t4 "sw"\n[1]\t"h"[1]\tw=99\n', 2, "LinkWidthEnabled must be 1..31"),
    ("text after id", 'Switch\t4 "sw" junk\n', 1, "unexpected text after node id"),
    ("console command", SW_H + 'do Unlink "sw"[1]\n', 6, "console command"),
    ("include missing", SW_H + "include /nonexistent/x.net\n", 6, "include /nonexistent/x.net"),
    ("guid above 64 bits", "caguid=0x1ffffffffffffffff\n" + SW_H, 1, "above 0xffffffffffffffff"),
    ("devid above 16 bits", "devid=0x10000\n" + SW_H, 1, "above 0xffff"),
    ("port guid above 64 bits", SW_H.replace('[1]\t"sw"', '[1](1ffffffffffffffff)\t"sw"'), 5, "longer than 64 bits"),
    (
        "lid out of range",
        SW_H.replace('[1]\t"sw"[1]', '[1]\t"sw"[1]\t# lid 70000 lmc 0 "sw" lid 0 4xSDR'),
        5,
        "LID 70000 LMC 0 out of range",
    ),
    ("nul byte", SW_H + "\n\x00\x01\x02\n", 7, "binary data"),
]


@pytest.mark.parametrize(("text", "line", "what"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_file_names_the_line(text: str, line: int, what: str) -> None:
    with pytest.raises(FormatError) as ei:
        parse_net(text, "bad.net")
    e = ei.value
    assert (e.path, e.line) == ("bad.net", line), str(e)
    assert str(e).startswith(f"bad.net:{line}: ")
    assert what in str(e)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mangled_files_fail_only_with_format_error(data: st.DataObject) -> None:
    """Cut, repeat or alter any part of a real capture: the result is a fabric or a FormatError, never a crash."""
    text = (CAPTURED / "dualport_ca.txt").read_text()
    lines = text.splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        op = data.draw(st.sampled_from(["drop", "dup", "cut", "char"]))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
        else:
            j = data.draw(st.integers(0, max(len(lines[i]) - 1, 0)))
            ch = data.draw(st.sampled_from(list('0123456789abcdefx[]()"# \t=\x00\u00e9Z')))
            lines[i] = lines[i][:j] + ch + lines[i][j + 1 :]
        if not lines:
            break
    try:
        f = parse_net("".join(lines), "m.net")
    except FormatError as e:
        assert e.path == "m.net" and (e.line is None or e.line >= 1)
    else:
        assert f.n_nodes <= 5


def test_non_utf8_bytes_name_the_line(tmp_path: Path) -> None:
    p = tmp_path / "garbage.net"
    p.write_bytes(SW_H.encode() + b'\nSwitch\t4 "s\xff\xfe"\n')
    with pytest.raises(FormatError) as ei:
        read_net(p)
    assert ei.value.line == 7 and "not UTF-8" in str(ei.value)
    p.write_bytes(os.urandom(4096))
    with pytest.raises(FormatError):
        read_net(p)


def test_missing_file_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(FormatError, match="No such file"):
        read_net(tmp_path / "nope.net")


# -- ibfm topo show ----------------------------------------------------------------------------------------


def test_topo_show_prints_counts_and_shape(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(SMALL / "fattree2_4leaf.net")
    assert cli_main(["topo", "show", path]) == 0
    out = capsys.readouterr().out
    assert "switches  6" in out
    assert "CAs       8 on 8 hosts" in out
    assert "links     16 (8 switch-switch, 8 to CAs)" in out
    assert "16 x 4xHDR" in out
    assert "shape     " in out
    if _have_shape():
        assert "fat-tree, 2 levels" in out


def test_topo_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CAPTURED / "dualport_ca.txt")
    assert cli_main(["topo", "show", path, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["switches"], d["cas"], d["hosts"], d["links"], d["switch_links"], d["ca_links"]) == (2, 3, 3, 5, 1, 4)
    assert d["rates"] == {"4xEDR": 5}
    if _have_shape():
        assert d["shape"]["switches"] == 2 and "kind" in d["shape"]


def test_topo_show_hosts_count_system_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        'Switch\t4 "sw"\n[1]\t"a"[1]\n[2]\t"b"[1]\n\n'
        'sysimgguid=0x77\nHca\t1 "a"\n[1]\t"sw"[1]\n\nsysimgguid=0x77\nHca\t1 "b"\n[1]\t"sw"[2]\n'
    )
    (tmp_path / "t.net").write_text(text)
    assert cli_main(["topo", "show", str(tmp_path / "t.net"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["cas"], d["hosts"]) == (2, 1)


@pytest.mark.parametrize(
    ("content", "where"),
    [
        ('Switch\t4 "sw"\n[1]\t"h"[1]\n', ":2: "),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff", ":1: "),
        (None, ": No such file"),
    ],
    ids=["one-sided link", "binary", "missing"],
)
def test_topo_show_bad_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes | None, where: str
) -> None:
    p = tmp_path / "bad.net"
    if isinstance(content, str):
        p.write_text(content)
    elif isinstance(content, bytes):
        p.write_bytes(content)
    assert cli_main(["topo", "show", str(p)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    err = cap.err.strip()
    assert err.startswith(f"ibfm: error: {p}{where}"), err
    assert "\n" not in err and "Traceback" not in err


def _have_shape() -> bool:
    try:
        import fabric.shape  # noqa: F401
    except ImportError:
        return False
    return True


# -- GraphML and node-link JSON (ibfm topo export) --------------------------------------------------------


def test_export_graph_round_trips_through_networkx(tmp_path: Path) -> None:
    import networkx as nx

    from fabric.formats.graph import export_graph, to_networkx
    from fabric.generate import fattree, ring

    f = fattree(2, 4)
    a, pa, b, pb = (int(x) for x in f.link_array()[0])
    f.state[a, pa] = f.state[b, pb] = 1  # one cable down (PortState DOWN)
    f.phys_state[a, pa] = f.phys_state[b, pb] = 3
    g = to_networkx(f)
    assert g.number_of_nodes() == f.n_nodes and g.number_of_edges() == f.link_array(up_only=False).shape[0]
    back = nx.read_graphml(io.StringIO(export_graph(f, "graphml")), force_multigraph=True)
    assert back.number_of_nodes() == g.number_of_nodes() and back.number_of_edges() == g.number_of_edges()
    sw = f"{int(f.node_guid[int(f.switches[0])]):#018x}"
    assert back.nodes[sw]["type"] == "switch" and back.nodes[sw]["name"] == f.names[int(f.switches[0])]
    downs = [d for _, _, d in back.edges(data=True) if not d["up"]]
    assert f.link_array().shape[0] == g.number_of_edges() - 1 and len(downs) == 1 and downs[0]["gbps"] == 0
    ups = [d for _, _, d in back.edges(data=True) if d["up"]]
    assert all(d["gbps"] > 0 and d["rate"] for d in ups)
    j = nx.node_link_graph(json.loads(export_graph(f, "json")), edges="links")
    assert sorted(j.nodes) == sorted(g.nodes) and j.number_of_edges() == g.number_of_edges()
    # two switches joined by two cables stay two edges
    r = ring(2, 1, radix=4)
    assert to_networkx(r).number_of_edges() == r.link_array(up_only=False).shape[0]


def test_topo_export_command(tmp_path: Path) -> None:
    import subprocess
    import sys

    from fabric.formats.netfile import write_net
    from fabric.generate import fattree

    net = tmp_path / "f.net"
    write_net(fattree(2, 4), net)
    out = tmp_path / "f.graphml"
    cp = subprocess.run([sys.executable, "-m", "ibfm.cli", "topo", "export", str(net), "-o", str(out)],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cp.returncode == 0, cp.stderr
    assert out.read_text().startswith("<?xml") and "<graphml" in out.read_text()
