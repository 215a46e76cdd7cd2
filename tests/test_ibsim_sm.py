"""ibfm's SM against ibsim, checked with tools we did not write (infiniband-diags).

Each test generates a fabric, writes it as an ibsim net file, starts its own
ibsim, and runs ``ibfm sm --transport umad`` as a child process attached at a
host's CA port (``SIM_HOST``), as a real SM sits: without it libumad2sim
attaches the client at the net file's first node, which for a generated torus
is a switch (UmadTransport then runs on the switch's port 0). Then, with ibsim still
running, it reads the subnet back with ``ibnetdiscover``, ``iblinkinfo``,
``smpquery``, ``ibroute``, ``ibtracert`` and ``perfquery`` and compares what
they see with what ibfm says it did (its guid2lid file and ``--dump-lfts``).

The helpers here (running a diag tool against an ibsim, parsing guid2lid,
ibroute and ibtracert output) are shared with tests/test_opensm_compat.py.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fabric.formats.netfile import parse_net, read_net, write_net
from fabric.generate import degrade, fattree, rail_cluster, torus
from fabric.ibsim import IbsimProcess
from fabric.model import Fabric, Speed
from sm.analysis.verify import Hop, trace_route
from sm.lidmap import LidMap
from sm.routing.base import NO_ROUTE, Lft
from tests.conftest import need_ibsim

REPO = Path(__file__).resolve().parent.parent
DIAGS = ("ibnetdiscover", "iblinkinfo", "smpquery", "ibroute", "ibtracert", "perfquery")
LFT_BLOCK = 64
# ibsim 0.10 parses link rates up to QDR in net-file comments (NDR would fall back to SDR with a warning).
SIM_SPEED = Speed.QDR


# -- running things against one ibsim ------------------------------------------------------------------


@dataclass
class Sim:
    """A running ibsim, the net file it runs and a scratch directory for its clients."""

    proc: IbsimProcess
    netfile: Path
    work: Path
    sm_host: str

    def env(self) -> dict[str, str]:
        """Client environment: libumad2sim preloaded, attached at the SM's host CA."""
        env = self.proc.env(sim_host=self.sm_host)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        return env

    def run(
        self, argv: Sequence[str], *, timeout: float = 60.0, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a libibumad client; cwd is the scratch dir (libumad2sim may leave ``sys-PID`` there)."""
        assert self.proc.alive(), f"ibsim died:\n{self.proc.output()[-2000:]}"
        cp = subprocess.run(
            list(argv), env=env or self.env(), cwd=self.work, capture_output=True, text=True, timeout=timeout
        )
        if check and cp.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} exited {cp.returncode}\nstdout:\n{cp.stdout[-3000:]}\nstderr:\n{cp.stderr[-3000:]}"
            )
        return cp


@dataclass
class IbfmRun:
    """What one ``ibfm sm --transport umad`` run reported and left behind."""

    summary: dict[str, Any]
    guid2lid: dict[int, int]
    """Port GUID -> base LID, from ibfm's guid2lid file."""
    lft_dump: str
    """``--dump-lfts``: every switch's LFT as ``ibroute`` prints it."""


@contextmanager
def start_sim(tmp_path: Path, fabric: Fabric, sm_host: str) -> Iterator[Sim]:
    """Write ``fabric`` as a net file and run ibsim on it for the ``with`` block; always stopped."""
    net = tmp_path / "fabric.net"
    write_net(fabric, net)
    work = tmp_path / "work"
    work.mkdir()
    with IbsimProcess(net) as proc:
        yield Sim(proc, net, work, sm_host)


def run_ibfm(sim: Sim, *args: str, timeout: float = 120.0) -> IbfmRun:
    """``ibfm sm --transport umad --json`` with a guid2lid file and an LFT dump in the scratch dir."""
    g2l, lfts = sim.work / "guid2lid", sim.work / "lfts.dump"
    cp = sim.run(
        [sys.executable, "-m", "ibfm.cli", "sm", "--transport", "umad", "--json",
         "--guid2lid", str(g2l), "--dump-lfts", str(lfts), *args],
        timeout=timeout,
        check=False,
    )  # fmt: skip
    assert cp.returncode == 0, f"ibfm sm exited {cp.returncode}\nstdout:\n{cp.stdout[-4000:]}\nstderr:\n{cp.stderr}"
    return IbfmRun(json.loads(cp.stdout), parse_guid2lid(g2l.read_text()), lfts.read_text())


# -- parsers of the tools' outputs --------------------------------------------------------------------

_G2L_RE = re.compile(r"^\s*0x([0-9a-fA-F]+)\s+(0x[0-9a-fA-F]+|\d+)\s+(0x[0-9a-fA-F]+|\d+)\s*$")


def parse_guid2lid(text: str) -> dict[int, int]:
    """OpenSM's guid2lid format (``0x<port guid> <base lid> <top lid>``, blank lines allowed)."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _G2L_RE.match(line)
        assert m, f"bad guid2lid line {line!r}"
        out[int(m.group(1), 16)] = int(m.group(2), 0)
    return out


_LFT_HEAD_RE = re.compile(r"^Unicast lids \[0x([0-9a-f]+)-0x([0-9a-f]+)\] of switch Lid (\d+) guid 0x([0-9a-f]+) ")
_LFT_ROW_RE = re.compile(r"^0x([0-9a-f]{4}) (\d{3})\b")


@dataclass
class IbrouteTable:
    """One switch's unicast LFT as ``ibroute`` prints it."""

    top: int
    lid: int
    guid: int
    lines: list[str]
    """Every line, header to the "N valid lids dumped" trailer."""
    entries: dict[int, int]
    """LID -> output port, for the LIDs listed."""


def parse_ibroute(text: str) -> list[IbrouteTable]:
    """Split ``ibroute`` output (one switch or ibfm's dump of all) into per-switch tables."""
    tables: list[IbrouteTable] = []
    for line in text.splitlines():
        if m := _LFT_HEAD_RE.match(line):
            tables.append(IbrouteTable(int(m.group(2), 16), int(m.group(3)), int(m.group(4), 16), [], {}))
        assert tables, f"ibroute output does not start with a header: {line!r}"
        tables[-1].lines.append(line.rstrip())
        if m := _LFT_ROW_RE.match(line):
            tables[-1].entries[int(m.group(1), 16)] = int(m.group(2))
    return tables


_TRACE_HOP_RE = re.compile(r"^\[(\d+)\] -> (ca|switch|router) port \{0x([0-9a-f]+)\}\[(\d+)\]")
_TRACE_FROM_RE = re.compile(r"^From (ca|switch|router) \{0x([0-9a-f]+)\} portnum (\d+) lid (\d+)")


@dataclass
class Trace:
    """``ibtracert`` output: the source, then per hop (out port, GUID entered, in port)."""

    src_guid: int
    src_port: int
    hops: list[tuple[int, int, int]]


def parse_ibtracert(text: str) -> Trace:
    lines = text.splitlines()
    head = next((m for ln in lines if (m := _TRACE_FROM_RE.match(ln))), None)
    assert head, f"no 'From' line in ibtracert output:\n{text}"
    hops = [(int(m.group(1)), int(m.group(3), 16), int(m.group(4))) for ln in lines if (m := _TRACE_HOP_RE.match(ln))]
    return Trace(int(head.group(2), 16), int(head.group(3)), hops)


# -- ibfm's state rebuilt from its files, on the topology ibsim runs ------------------------------------


def lidmap_from_guid2lid(fabric: Fabric, g2l: dict[int, int]) -> LidMap:
    base = np.zeros(fabric.port_exists.shape, np.uint16)
    for guid, lid in g2l.items():
        node, port = fabric.by_port_guid(guid)
        base[node, port] = lid
    return LidMap.from_base(base)


def lft_from_tables(fabric: Fabric, lids: LidMap, tables: list[IbrouteTable]) -> Lft:
    """An ``Lft`` (rows in ``fabric.switches`` order) from per-switch ibroute tables."""
    sw = fabric.switches
    lft = np.full((sw.size, lids.max_lid + 1), NO_ROUTE, np.uint8)
    for t in tables:
        row = int(np.searchsorted(sw, fabric.by_guid(t.guid)))
        for lid, port in t.entries.items():
            lft[row, lid] = port
    return lft


def trace_as_ibtracert(fabric: Fabric, hops: list[Hop]) -> list[tuple[int, int, int]]:
    """trace_route's hops in ibtracert's terms: (out port, GUID of the node entered, in port).

    ibtracert names a switch by its node GUID and a CA by the port GUID it enters on.
    """
    out = []
    for prev, cur in itertools.pairwise(hops):
        is_sw = fabric.is_switch(cur.node)
        guid = int(fabric.node_guid[cur.node] if is_sw else fabric.port_guid[cur.node, cur.in_port])
        out.append((prev.out_port, guid, cur.in_port))
    return out


# -- the fabrics --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    build: Callable[[], Fabric]
    sm_host: str
    ibfm_args: tuple[str, ...] = ()
    engine: str | None = None
    """Engine ibfm must end up with (None: whatever the chain picks)."""
    ibroute_quirk: bool = False
    """The top LID opens a new 64-LID block, so ibroute cannot print it (see check_ibroute)."""


CASES = {
    # 8 leaves x 4 hosts, 4 spines: 44 LIDs in one LFT block.
    "fattree2-k8": Case(lambda: fattree(2, 8, speed=SIM_SPEED), "host-00000", engine="ftree"),
    # k=6 3-level tree (54 hosts, 45 switches: 99 LIDs over two blocks) with 4 inter-switch links gone.
    "fattree3-k6-degraded": Case(lambda: degrade(fattree(3, 6, speed=SIM_SPEED), links=4, seed=1), "host-00000"),
    # 8 hosts x 4 rails, 8 leaves, 2 spines with 2 parallel links per leaf-spine pair.
    "rail-8x4": Case(lambda: rail_cluster(8, 4, hosts_per_leaf=4, radix=16, speed=SIM_SPEED), "dgx-001-mlx5_0"),
    # 16 switches x 3 hosts = 64 LIDs: not a fat-tree, ftree refuses and updn routes; LID 64 opens block 1.
    "torus-4x4": Case(
        lambda: torus([4, 4], 3, radix=8, speed=SIM_SPEED),
        "host-0000",
        ibfm_args=("--engine", "ftree,updn,minhop"),
        engine="updn",
        ibroute_quirk=True,
    ),
}


@pytest.fixture(params=sorted(CASES))
def case_sim(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Case, Fabric, Sim]]:
    need_ibsim(*DIAGS)
    case = CASES[request.param]
    with start_sim(tmp_path, case.build(), case.sm_host) as sim:
        # The topology ibsim runs, read back from the net file (GUIDs, ports, links as ibsim has them).
        yield case, read_net(sim.netfile), sim


# -- the checks ---------------------------------------------------------------------------------------


def check_summary(case: Case, fabric: Fabric, run: IbfmRun) -> None:
    s = run.summary
    assert s["subnet_up"], s
    # ibfm names discovered nodes by NodeDescription; the SM sits on the CA port ibsim attached it to.
    assert s["sm"]["node"] == fabric.descs[fabric.by_name(case.sm_host)], s["sm"]
    assert s["program"]["failures"] == [] and s["discovery_errors"] == [], s
    assert s["verify"]["unreachable"] == 0, s["verify"]
    if case.engine is not None:
        assert s["engine"] == case.engine, (s["engine"], s["refused"])
    counts = fabric.summary()
    assert (s["nodes"]["switches"], s["nodes"]["cas"], s["nodes"]["links"]) == (
        counts["switches"],
        counts["cas"],
        counts["links"],
    )
    # One LID per end port: switch port 0 and every cabled CA port.
    assert len(run.guid2lid) == fabric.endports().shape[0] == s["lids"]["assigned"]


def check_ibnetdiscover(sim: Sim, fabric: Fabric, run: IbfmRun) -> Fabric:
    """ibnetdiscover sees the same nodes and links, and every port with the LID ibfm assigned."""
    cp = sim.run(["ibnetdiscover"])
    seen = parse_net(cp.stdout, "ibnetdiscover")
    assert sorted(seen.node_guid.tolist()) == sorted(fabric.node_guid.tolist())
    assert seen.summary()["links"] == fabric.summary()["links"]
    got: dict[int, int] = {}
    for node, port in seen.endports().tolist():
        got[int(seen.port_guid[node, port])] = int(seen.lid[node, port])
    diff = {f"{g:#018x}": (got.get(g), run.guid2lid.get(g)) for g in got.keys() | run.guid2lid.keys()}
    assert got == run.guid2lid, {g: v for g, v in diff.items() if v[0] != v[1]}
    return seen


def check_port_states(sim: Sim, fabric: Fabric, run: IbfmRun, rng: np.random.Generator) -> None:
    """iblinkinfo: every cabled port Active/LinkUp; smpquery portinfo on samples: LID, SM LID, Active."""
    cp = sim.run(["iblinkinfo"])
    linkup = [ln for ln in cp.stdout.splitlines() if "LinkUp" in ln]
    not_active = [ln for ln in linkup if "Active/" not in ln]
    assert not not_active, "ports LinkUp but not Active:\n" + "\n".join(not_active[:10])
    # iblinkinfo lists every switch port and every CA port: each link shows up from both ends.
    assert len(linkup) == 2 * fabric.summary()["links"], cp.stdout[-3000:]
    sm_lid = run.summary["sm"]["lid"]
    cas = fabric.cas
    for node in rng.choice(cas, size=min(4, cas.size), replace=False).tolist():
        guid = int(fabric.port_guid[node, 1])
        lid = run.guid2lid[guid]
        out = sim.run(["smpquery", "portinfo", str(lid), "1"]).stdout
        assert re.search(rf"^Lid:\.+{lid}$", out, re.M), out
        assert re.search(rf"^SMLid:\.+{sm_lid}$", out, re.M), out
        assert re.search(r"^LinkState:\.+Active$", out, re.M), out
    sw = fabric.switches
    for node in rng.choice(sw, size=min(3, sw.size), replace=False).tolist():
        lid = run.guid2lid[int(fabric.port_guid[node, 0])]
        port = int(np.flatnonzero(fabric.up_mask()[node])[0])
        out = sim.run(["smpquery", "portinfo", str(lid), str(port)]).stdout
        assert re.search(r"^LinkState:\.+Active$", out, re.M), out
        assert re.search(r"^PhysLinkState:\.+LinkUp$", out, re.M), out


def check_ibroute(sim: Sim, run: IbfmRun) -> list[IbrouteTable]:
    """``ibroute <switch lid>`` of every switch equals ibfm's dump line by line.

    ibroute's quirk: it reads blocks ``startlid/64 .. ALIGN(top, 64)/64 - 1``, so
    when LinearFDBTop is a multiple of 64 (the top LID opens a new block) that
    block is never read and the top LID is silently left out (rdma-core
    infiniband-diags/ibroute.c, dump_unicast_tables). ``ibroute <lid> <top> <top>``
    reads nothing either. We compare without that line and its count, and
    check the top LID's entries with ibtracert instead (check_top_lid).
    """
    tables = parse_ibroute(run.lft_dump)
    for want in tables:
        got_text = sim.run(["ibroute", str(want.lid)]).stdout
        (got,) = parse_ibroute(got_text)
        expect = list(want.lines)
        if want.top % LFT_BLOCK == 0 and want.top in want.entries:
            expect = [ln for ln in expect if not ln.startswith(f"0x{want.top:04x} ")]
            expect[-1] = f"{len(want.entries) - 1} valid lids dumped"
        assert got.lines == expect, f"switch LID {want.lid}: ibroute differs from ibfm's LFT\n" + "\n".join(
            f"- {a}\n+ {b}" for a, b in zip(expect, got.lines, strict=False) if a != b
        )
    return tables


def check_top_lid(sim: Sim, tables: list[IbrouteTable]) -> int:
    """Where ibroute cannot show the top LID, every switch's entry for it, read by ibtracert."""
    checked = 0
    for t in tables:
        port = t.entries.get(t.top)
        if t.top % LFT_BLOCK or port in (None, 0):
            continue
        trace = parse_ibtracert(sim.run(["ibtracert", str(t.lid), str(t.top)]).stdout)
        assert trace.hops and trace.hops[0][0] == port, (t.lid, t.top, port, trace)
        checked += 1
    return checked


def check_ibtracert(
    sim: Sim, fabric: Fabric, run: IbfmRun, tables: list[IbrouteTable], rng: np.random.Generator, pairs: int = 20
) -> None:
    """``ibtracert <src lid> <dst lid>`` follows, hop by hop, the route ibfm's LFTs give."""
    lids = lidmap_from_guid2lid(fabric, run.guid2lid)
    lft = lft_from_tables(fabric, lids, tables)
    ep = fabric.endports()
    used = lids.used()
    done = 0
    while done < pairs:
        node, port = ep[rng.integers(ep.shape[0])].tolist()
        dst = int(used[rng.integers(used.size)])
        if (int(lids.owner_node[dst]), int(lids.owner_port[dst])) == (node, port):
            continue
        src = int(lids.base[node, port])
        want = trace_as_ibtracert(fabric, trace_route(fabric, lids, lft, node, port, dst))
        assert want, (node, port, dst)
        got = parse_ibtracert(sim.run(["ibtracert", str(src), str(dst)]).stdout)
        assert got.hops == want, f"ibtracert {src} {dst}: {got.hops} but ibfm's LFTs give {want}"
        done += 1


def check_perfquery(sim: Sim, fabric: Fabric, run: IbfmRun, rng: np.random.Generator) -> None:
    """PerfMgt GMPs (LID routed, QP1) reach sampled host ports and switch ports through the LFTs."""
    targets: list[tuple[int, int]] = []
    for node in rng.choice(fabric.cas, size=min(4, fabric.cas.size), replace=False).tolist():
        targets.append((run.guid2lid[int(fabric.port_guid[node, 1])], 1))
    for node in rng.choice(fabric.switches, size=min(4, fabric.switches.size), replace=False).tolist():
        port = int(rng.choice(np.flatnonzero(fabric.up_mask()[node])))
        targets.append((run.guid2lid[int(fabric.port_guid[node, 0])], port))
    for lid, port in targets:
        out = sim.run(["perfquery", str(lid), str(port)]).stdout
        assert re.search(rf"^# Port counters: Lid {lid} port {port}\b", out, re.M), out
        assert re.search(r"^PortXmitPkts:\.+\d+$", out, re.M), out


@pytest.mark.ibsim
def test_ibfm_sm_matches_infiniband_diags(case_sim: tuple[Case, Fabric, Sim]) -> None:
    case, fabric, sim = case_sim
    rng = np.random.default_rng(7)
    run = run_ibfm(sim, *case.ibfm_args)
    check_summary(case, fabric, run)
    check_ibnetdiscover(sim, fabric, run)
    check_port_states(sim, fabric, run, rng)
    tables = check_ibroute(sim, run)
    top = tables[0].top
    assert top == run.summary["lids"]["max_lid"]
    if case.ibroute_quirk:
        assert top % LFT_BLOCK == 0, f"case meant to hit the ibroute quirk, but top LID is {top}"
        assert check_top_lid(sim, tables) == len(tables), "every switch's entry for the top LID is read"
    check_ibtracert(sim, fabric, run, tables, rng)
    check_perfquery(sim, fabric, run, rng)
    assert sim.proc.alive()


@pytest.mark.ibsim
def test_second_ibfm_run_keeps_lids_and_finds_ports_configured(tmp_path: Path) -> None:
    """A restarted ibfm reads its guid2lid, routes the same, and finds every port configured and ACTIVE."""
    need_ibsim("ibroute")
    with start_sim(tmp_path, fattree(2, 4, speed=SIM_SPEED), "host-00000") as sim:
        first = run_ibfm(sim)
        second = run_ibfm(sim)
        assert second.summary["subnet_up"]
        assert second.guid2lid == first.guid2lid
        assert second.lft_dump == first.lft_dump
        p = second.summary["program"]
        # A fresh process knows nothing of what the switches hold and sends every LFT block
        # again, but the ports already hold their LID, MTU and VLs and are ACTIVE: no PortInfo Set.
        assert p["failures"] == [] and p["port_sets"] == 0 and p["ports_active"] == 0, p
        assert p["lft_blocks_sent"] == first.summary["program"]["lft_blocks_sent"]
        for t in parse_ibroute(first.lft_dump):
            (got,) = parse_ibroute(sim.run(["ibroute", str(t.lid)]).stdout)
            assert got.entries == t.entries


def test_ibroute_and_ibtracert_parsers() -> None:
    """The parsers on outputs as infiniband-diags 44 prints them (no ibsim needed)."""
    route = (
        "Unicast lids [0x0-0x40] of switch Lid 1 guid 0x0002c90000000000 (sw-00-00):\n"
        "  Lid  Out   Destination\n"
        "       Port     Info \n"
        "0x0001 000 : (Switch portguid 0x0002c90000000000: 'sw-00-00')\n"
        "0x0040 005 : (Channel Adapter portguid 0x0002c9000000006f: 'host-0047')\n"
        "2 valid lids dumped \n"
    )
    (t,) = parse_ibroute(route)
    assert (t.top, t.lid, t.guid, t.entries) == (0x40, 1, 0x2C90000000000, {1: 0, 0x40: 5})
    assert t.lines[-1] == "2 valid lids dumped"
    trace = parse_ibtracert(
        'From ca {0x0002c90000000000} portnum 1 lid 1-1 "host-00000"\n'
        '[1] -> switch port {0x0002c90000000040}[1] lid 33-33 "leaf-00"\n'
        '[4] -> ca port {0x0002c90000000027}[1] lid 20-20 "host-00019"\n'
        'To ca {0x0002c90000000026} portnum 1 lid 20-20 "host-00019"\n'
    )
    assert trace == Trace(0x2C90000000000, 1, [(1, 0x2C90000000040, 1), (4, 0x2C90000000027, 1)])
    assert parse_guid2lid("0x0002c90000000001 0x0001 0x0001\n\n0x0002c90000000040 0x0021 0x0021\n") == {
        0x2C90000000001: 1,
        0x2C90000000040: 0x21,
    }
