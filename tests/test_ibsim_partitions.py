"""Partitions over ibsim, judged against OpenSM: the same partitions file and guid2lid file on the same
fabric must give the same P_Key tables (``smpquery pkeys``) and the same PathRecord P_Keys (``saquery``).

ibsim runs a 2-level fat tree of 4-port switches (4 leaves, 2 spines, 8 hosts); the SM sits at host-00000.
:data:`PARTITIONS` gives, over OpenSM's implicit rule written out (Default ALL=limited, SELF=full), an admin
host that is a full member of Default, a tenant with two full members and two limited ones (``ipoib``), a
second tenant, and a partition with ``indx0`` (OpenSM 3.3.23 honours it: its key at index 0, the Default key
elsewhere). IPoIB multicast groups are not judged here (``saquery -m``): ibfm does not program them yet.

ibsim keeps the P_Key tables an SM wrote, so the second SM would find the first one's work done. Before
each SM, ``ibfm sm`` with another partitions file (:func:`junk_partitions`) scribbles every table: Default
full at index 0 and 40 keys no SM is asked for, over both blocks of every CA port, at switch ports 0 and at
the switch ports facing CAs. Both SMs start from the same tables (read back and compared) and must rewrite
every one. The Default key is left at index 0 there on purpose: OpenSM keeps a key at the index where the
port holds it (see :func:`test_ibfm_keeps_the_indexes_the_ports_hold_as_opensm`), and this judge is about
the layout from a table holding none of the file's keys elsewhere.

One ibsim serves the first three tests (the ``measured`` fixture): scribble; OpenSM (``opensm -P``, a
daemon until SUBNET UP: its SA must answer) read back with ``smpquery pkeys`` and asked with ``saquery PR``
from two clients (a full and a limited member of Default: OpenSM answers only pairs whose both ends share a
P_Key with the requester); ``ibfm sm`` once after OpenSM (a takeover); scribble again; ``ibfm serve
--partitions`` read back and asked the same; ``ibfm sm`` once more (a restart). The tests judge the tables,
the PathRecords, and the P_KeyTable blocks the takeover and the restart send. A fourth test, on its own
ibsim, starts both SMs from tables that hold a key of the file at another index. Run with ``-s`` to see
every table and answer.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fabric.formats.netfile import read_net
from fabric.generate import fattree
from fabric.model import Fabric
from tests.conftest import need_ibsim
from tests.saquery_ref import opensm_sa, run_saquery
from tests.test_ibsim_election import Ibfm, wait_for
from tests.test_ibsim_sa import ibfm_serve_at, lids_of
from tests.test_ibsim_sm import REPO, SIM_SPEED, Sim, parse_guid2lid, start_sim

SM_HOST = "host-00000"
ADMIN = "host-00007"
"""A full member of Default: shares a P_Key with every port. saquery and smpquery run from here."""
LIMITED = "host-00004"
"""A limited member of Default (a tenant host): saquery from here too, for the SA's requester rule."""
TOOL_TIMEOUT = 30.0
BLOCK = 32
"""P_Keys in one PKeyTable block."""
FULL = 0x8000

PARTITIONS = """\
# The partitions judge over ibsim (tests/test_ibsim_partitions.py); {host} is that host's port GUID.
# OpenSM's implicit Default rule, written out, and an admin host in it as a full member.
Default=0x7fff : ALL=limited, SELF=full, {host-00007}=full ;
# A tenant: two full members, two limited ones (limited is the default membership).
TenantA=0x8001, ipoib : {host-00001}=full, {host-00002}=full, {host-00003}, {host-00004} ;
# A second tenant; host-00004 is in both.
TenantB=0x0002, defmember=full : {host-00004}, {host-00005} ;
# indx0: this key at index 0 of its members' tables, the Default key after the others.
Storage=0x0003, indx0 : {host-00005}=full, {host-00006}=full ;
"""

EXPECTED_KEYS: dict[str, set[int]] = {
    "host-00000": {0xFFFF},
    "host-00001": {0x7FFF, 0x8001},
    "host-00002": {0x7FFF, 0x8001},
    "host-00003": {0x7FFF, 0x0001},
    "host-00004": {0x7FFF, 0x0001, 0x8002},
    "host-00005": {0x7FFF, 0x8002, 0x8003},
    "host-00006": {0x7FFF, 0x8003},
    "host-00007": {0xFFFF},
}
"""The keys each CA port must hold (a check that OpenSM read the file as we meant it; not the layout)."""

INDX0_HOSTS = ("host-00005", "host-00006")
"""Their table starts with Storage's 0x8003 (indx0)."""

Pair = tuple[str, str, int | None]
"""(source host, destination host, the P_Key asked for or None)."""

PAIRS: list[Pair] = [
    ("host-00001", "host-00002", None),  # full - full in TenantA
    ("host-00001", "host-00003", None),  # full - limited
    ("host-00003", "host-00001", None),  # limited - full: the key as the source holds it
    ("host-00003", "host-00004", None),  # limited - limited everywhere: no path
    ("host-00001", "host-00005", None),  # across tenants: no path
    ("host-00004", "host-00005", None),  # TenantB, host-00004 also a limited member of TenantA
    ("host-00005", "host-00004", None),
    ("host-00005", "host-00006", None),  # indx0 partition
    ("host-00000", "host-00001", None),  # SM to host
    ("host-00001", "host-00000", None),  # host to SM
    ("host-00007", "host-00006", None),  # admin to a host whose Default key is not at index 0
    ("host-00006", "host-00007", None),
    ("host-00001", "host-00003", 0x8001),  # a key asked for, as full
    ("host-00001", "host-00003", 0x0001),  # ... as limited
    ("host-00001", "host-00002", 0x8002),  # a key they do not share
    ("host-00003", "host-00004", 0x8001),  # a key both hold as limited members
    ("host-00001", "host-00007", 0xFFFF),  # the Default key
]

CLIENTS = (ADMIN, LIMITED)

DIFFS_BY_DESIGN = {
    "switch port blocks": "on a switch port facing a CA, OpenSM 3.3.23 (pkey_mgr_update_peer_port) writes only "
    "the blocks the CA's keys fill once packed, and leaves whatever the port held in its other blocks (stale "
    "keys the switch goes on letting through); ibfm writes every block of the PartitionEnforcementCap, the "
    "rest as 0. Compared: the blocks OpenSM writes, index by index; beyond them ibfm's must be 0 and OpenSM's "
    "what the port held before",
}
"""Where ibfm's tables may differ from OpenSM's, and why."""

Port = tuple[str, int]
"""(node name, port number)."""
Tables = dict[Port, tuple[int, ...]]


# -- the files -----------------------------------------------------------------------------------------------


def render(template: str, fabric: Fabric) -> str:
    """``template`` with each ``{host-NNNNN}`` replaced by that host's port 1 GUID."""

    def guid(m: re.Match[str]) -> str:
        return f"{int(fabric.port_guid[fabric.by_name(m.group(1)), 1]):#018x}"

    return re.sub(r"\{(host-\d+)\}", guid, template)


def junk_partitions(tenant_at: int = 0) -> str:
    """A partitions file to scribble with: Default full everywhere (at index 0), 40 keys nobody asks for
    (the first 7 on every port, so switch port 0's 8 entries fill up too; 40 reach block 1 of a CA).

    ``tenant_at`` > 0: TenantA's key 0x8001 (full) on every CA port after ``tenant_at`` - 1 junk keys, at
    index ``tenant_at``. The junk keys are 0xNN00: both SMs place keys in the order of the P_Key's bytes
    swapped (OpenSM's map of network-order keys on x86), where they come before 0x0001."""
    lines = ["Default=0x7fff : ALL=full ;"]
    count = tenant_at - 1 if tenant_at else 40
    for i in range(count):
        lines.append(f"Junk{i}=0x{(i + 1) << 8:04x} : {'ALL' if i < 7 else 'ALL_CAS'} ;")
    if tenant_at:
        lines.append("TenantA=0x8001 : ALL_CAS=full ;")
    return "\n".join(lines) + "\n"


# -- reading the fabric ------------------------------------------------------------------------------------------

_PKEY_ROW = re.compile(r"^\s*(\d+):((?:\s+0x[0-9a-f]{4})+)\s*$")
_PKEY_CAP = re.compile(r"^(\d+) pkeys capacity for this port$")


def parse_smpquery_pkeys(text: str) -> tuple[int, ...]:
    """``smpquery pkeys`` output (rows of 8 keys after their first index, then "N pkeys capacity for this
    port") as the whole table, capacity entries long."""
    keys: list[int] = []
    cap = None
    for line in text.splitlines():
        if m := _PKEY_ROW.match(line):
            assert int(m.group(1)) == len(keys), f"row {m.group(1)} after {len(keys)} keys:\n{text}"
            keys += [int(k, 16) for k in m.group(2).split()]
        elif m := _PKEY_CAP.match(line.strip()):
            cap = int(m.group(1))
    assert cap is not None and len(keys) == cap, f"not a whole P_Key table:\n{text}"
    return tuple(keys)


def tool(sim: Sim, argv: list[str], host: str = ADMIN) -> str:
    """A diag tool's stdout, run from ``host``; fails on a non-zero exit."""
    assert sim.proc.alive(), f"ibsim died:\n{sim.proc.output()[-2000:]}"
    cp = subprocess.run(argv, env=sim.proc.env(sim_host=host), cwd=sim.work, capture_output=True, text=True,
                        timeout=TOOL_TIMEOUT, check=False)  # fmt: skip
    assert cp.returncode == 0, f"{' '.join(argv)} exited {cp.returncode}:\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}"
    return cp.stdout


def judged_ports(fabric: Fabric) -> list[Port]:
    """Every CA port, every switch's port 0, and every switch port facing a CA."""
    ports: list[Port] = [(fabric.names[n], 1) for n in fabric.cas.tolist()]
    for s in fabric.switches.tolist():
        ports.append((fabric.names[s], 0))
        for p in range(1, int(fabric.nports[s]) + 1):
            if not fabric.is_switch(int(fabric.peer_node[s, p])):
                ports.append((fabric.names[s], p))
    return ports


def read_tables(sim: Sim, fabric: Fabric, lid: Callable[[str, int], int]) -> Tables:
    """``smpquery pkeys <lid> <port>`` of every judged port (a switch port by the switch's LID)."""
    out: Tables = {}
    for name, port in judged_ports(fabric):
        target = lid(name, 0) if fabric.is_switch(fabric.by_name(name)) else lid(name, 1)
        out[(name, port)] = parse_smpquery_pkeys(tool(sim, ["smpquery", "pkeys", str(target), str(port)]))
    return out


Answer = int | str | None
"""A PathRecord's P_Key, None for no record, or what went wrong (saquery's exit status and error)."""


def path_pkeys(sim: Sim, lid: Callable[[str, int], int]) -> dict[tuple[str, Pair], Answer]:
    """``saquery PR --slid A --dlid B [--pkey P]`` of every pair in :data:`PAIRS` from every client."""
    out: dict[tuple[str, Pair], Answer] = {}
    for client in CLIENTS:
        for pair in PAIRS:
            src, dst, pkey = pair
            args = ["PR", "--slid", str(lid(src, 1)), "--dlid", str(lid(dst, 1))]
            if pkey is not None:
                args += ["--pkey", f"{pkey:#06x}"]
            r = run_saquery(sim, args, host=client, cwd=sim.work)
            ans: Answer
            if not r.ok:
                ans = f"{r.summary()} {r.stderr.strip()[-200:]}"
            elif not r.records:
                ans = None
            else:
                assert len(r.records) == 1, r.summary()
                ans = int(r.records[0]["pkey"], 16)
            out[(client, pair)] = ans
    return out


# -- running the SMs -------------------------------------------------------------------------------------------


def ibfm_sm(sim: Sim, guid2lid: Path, partitions: Path) -> dict[str, Any]:
    """``ibfm sm --transport umad --json`` once at the SM's host; its summary. It must bring the subnet up."""
    work = sim.work / "ibfm"
    work.mkdir(exist_ok=True)
    g2l = work / "guid2lid"
    if not g2l.exists():
        shutil.copy(guid2lid, g2l)
    cp = sim.run(
        [sys.executable, "-m", "ibfm.cli", "sm", "--transport", "umad", "--json", "--guid2lid", str(g2l),
         "--partitions", str(partitions)],
        timeout=120, check=False,
    )  # fmt: skip
    assert cp.returncode == 0, f"ibfm sm exited {cp.returncode}\nstdout:\n{cp.stdout[-3000:]}\nstderr:\n{cp.stderr}"
    summary: dict[str, Any] = json.loads(cp.stdout)
    assert summary["subnet_up"] and summary["program"]["failures"] == [], summary["program"]
    assert summary["partitions"]["problems"] == [], summary["partitions"]["problems"]
    return summary


def ibfm_serve(sim: Sim, guid2lid: Path, partitions: Path) -> AbstractContextManager[Ibfm]:
    """``ibfm serve --transport umad --partitions FILE`` at the SM's host until the block ends."""
    return ibfm_serve_at(sim, guid2lid, extra=("--partitions", str(partitions)))


def scribble(sim: Sim, guid2lid: Path, junk: Path, want: Tables | None, read: Callable[[], Tables]) -> Tables:
    """Overwrite every table: with ``junk``'s layout by ``ibfm sm`` the first time; with ``want`` (the tables
    the first time left) written back block by block afterwards, so every SM starts from the same tables
    (ibfm keeps the indexes of keys a port holds, so a second ``ibfm sm`` would not lay them out afresh).
    The tables read back."""
    if want is None:
        ibfm_sm(sim, guid2lid, junk)
    else:
        write_tables(sim, guid2lid, want)
    got = read()
    if want is not None:
        assert got == want, "the scribbled tables differ from the first time: " + ", ".join(
            f"{n}/{p}" for (n, p), t in got.items() if t != want[(n, p)]
        )
    return got


_WRITER = """
import asyncio, json, sys
from fabric.mad import Method, SmpAttr, pkey_block_pack, pkey_table_mod
from sm.transport.smp import smp_batch
from sm.transport.umad import UmadTransport

async def main() -> None:
    spec = json.load(sys.stdin)
    t = UmadTransport(None, None)
    t.start()
    try:
        reqs = [(lid, Method.SET, SmpAttr.PKEY_TABLE, pkey_table_mod(block, port), pkey_block_pack(keys))
                for lid, port, block, keys in spec]
        bad = [str(a) for a in await smp_batch(t, reqs) if not isinstance(a, bytes)]
        print("\\n".join(bad))
        sys.exit(1 if bad else 0)
    finally:
        await t.close()

asyncio.run(main())
"""
"""P_KeyTable Sets by LID route (a switch port by the switch's LID and the port in the modifier)."""


def write_tables(sim: Sim, guid2lid: Path, tables: Tables) -> None:
    """Write ``tables`` into the ports, every block, from the SM's host (no SM runs meanwhile)."""
    fabric = read_net(sim.netfile)
    lids = parse_guid2lid(guid2lid.read_text())
    spec = []
    for (name, port), table in tables.items():
        node = fabric.by_name(name)
        lid = lids[int(fabric.port_guid[node, 0 if fabric.is_switch(node) else port])]
        for b in range(0, len(table), 32):
            spec.append((lid, port, b // 32, list(table[b : b + 32])))
    work = sim.work / "writer"
    work.mkdir(exist_ok=True)
    env = sim.proc.env(sim_host=SM_HOST)
    env["PYTHONPATH"] = str(REPO)
    cp = subprocess.run([sys.executable, "-c", _WRITER], input=json.dumps(spec), env=env, cwd=work,
                        capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert cp.returncode == 0, f"P_KeyTable writes failed:\n{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}"


# -- comparing ---------------------------------------------------------------------------------------------------


def fmt(table: tuple[int, ...]) -> str:
    """A table as ``idx:key`` for its non-zero entries."""
    return " ".join(f"{i}:{k:#06x}" for i, k in enumerate(table) if k) or "(empty)"


def written_blocks(ca_table: tuple[int, ...]) -> int:
    """Blocks OpenSM writes on the switch port facing a CA: what the CA's keys fill once packed (at least 1)."""
    present = set(ca_table)
    packed = [k for k in ca_table if k & 0x7FFF and (k & FULL or (k | FULL) not in present)]
    return max(1, -(-len(packed) // BLOCK))


@dataclass
class TableCheck:
    """One port's tables under both SMs and what differs."""

    port: Port
    ours: tuple[int, ...]
    theirs: tuple[int, ...]
    problems: list[str]
    by_design: str = ""


def compare_tables(fabric: Fabric, ours: Tables, theirs: Tables, before: Tables) -> list[TableCheck]:
    """Index by index; on switch ports facing a CA, beyond OpenSM's written blocks, see DIFFS_BY_DESIGN."""
    checks = []
    for (name, port), mine in ours.items():
        node = fabric.by_name(name)
        other = theirs[(name, port)]
        problems: list[str] = []
        by_design = ""
        upto = len(mine)
        if fabric.is_switch(node) and port:
            peer = fabric.names[int(fabric.peer_node[node, port])]
            upto = written_blocks(theirs[(peer, int(fabric.peer_port[node, port]))]) * BLOCK
            rest_ours, rest_theirs = mine[upto:], other[upto:]
            if any(rest_ours):
                problems.append(f"ibfm left keys beyond block {upto // BLOCK - 1}: {fmt(rest_ours)}")
            if rest_theirs != before[(name, port)][upto:]:
                problems.append("OpenSM wrote beyond the blocks its keys fill (DIFFS_BY_DESIGN is out of date)")
            if rest_ours != rest_theirs:
                by_design = "switch port blocks"
        if len(mine) != len(other):
            problems.append(f"capacity: ibfm {len(mine)} != OpenSM {len(other)}")
        for i, (a, b) in enumerate(zip(mine[:upto], other[:upto], strict=False)):
            if a != b:
                problems.append(f"index {i}: ibfm {a:#06x} != OpenSM {b:#06x}")
        checks.append(TableCheck((name, port), mine, other, problems, by_design))
    return checks


def stale_blocks(fabric: Fabric, theirs: Tables) -> int:
    """Blocks OpenSM left holding keys beyond those it writes (a takeover by ibfm clears them)."""
    n = 0
    for (name, port), table in theirs.items():
        node = fabric.by_name(name)
        if fabric.is_switch(node) and port:
            peer = fabric.names[int(fabric.peer_node[node, port])]
            start = written_blocks(theirs[(peer, int(fabric.peer_port[node, port]))])
            n += sum(any(table[b * BLOCK : (b + 1) * BLOCK]) for b in range(start, len(table) // BLOCK))
    return n


def show(answer: Answer) -> str:
    return "no record" if answer is None else f"{answer:#06x}" if isinstance(answer, int) else answer


def check_opensm_read_the_file(theirs: Tables) -> None:
    """OpenSM's tables hold the keys :data:`PARTITIONS` means, indx0 first: else the judge judges nothing."""
    for host, keys in EXPECTED_KEYS.items():
        table = theirs[(host, 1)]
        assert {k for k in table if k} == keys, f"OpenSM's {host}: {fmt(table)}, want {sorted(map(hex, keys))}"
    for host in INDX0_HOSTS:
        assert theirs[(host, 1)][0] == 0x8003, f"OpenSM's {host}: {fmt(theirs[(host, 1)])}: indx0 not honoured"


def report_tables(fabric: Fabric, ours: Tables, theirs: Tables, before: Tables) -> list[str]:
    """Print both SMs' tables side by side; the differences not by design."""
    problems: list[str] = []
    print("\nP_Key tables (index:key, non-zero entries), ibfm then OpenSM where they differ:")
    for c in compare_tables(fabric, ours, theirs, before):
        name, port = c.port
        verdict = "equal" if c.ours == c.theirs else "DIFF" if c.problems else "equal*"
        print(f"  {name + '/' + str(port):<11} {verdict:<7} ibfm:   {fmt(c.ours)}")
        if c.ours != c.theirs:
            print(f"  {'':<19} OpenSM: {fmt(c.theirs)}" + (f"  [{c.by_design}]" if c.by_design else ""))
        problems += [f"{name}/{port}: {p}" for p in c.problems]
    print("  * by design: " + "; ".join(f"{k}: {v}" for k, v in DIFFS_BY_DESIGN.items()))
    return problems


# -- the judge ---------------------------------------------------------------------------------------------------


@dataclass
class Measured:
    """What both SMs left on one ibsim, read by smpquery and asked of their SAs by saquery."""

    fabric: Fabric
    before: Tables
    """The scribbled tables both SMs started from."""
    theirs: Tables
    theirs_pr: dict[tuple[str, Pair], Answer]
    takeover: dict[str, Any]
    """``ibfm sm --json``'s ``program`` over the tables OpenSM set."""
    ours: Tables
    ours_pr: dict[tuple[str, Pair], Answer]
    again: dict[str, Any]
    """``ibfm sm --json``'s ``program`` over the tables ``ibfm serve`` set."""
    after: Tables
    """The tables after that."""


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Measured:
    """One ibsim: scribble, OpenSM, ibfm sm (a takeover), scribble, ibfm serve, ibfm sm (a restart)."""
    need_ibsim("smpquery", "saquery", "opensm")
    tmp = tmp_path_factory.mktemp("partitions")
    t0 = time.monotonic()
    with start_sim(tmp, fattree(2, 4, speed=SIM_SPEED), SM_HOST) as sim:
        fabric, _, g2l, lid = lids_of(sim, tmp)
        conf = tmp / "partitions.conf"
        conf.write_text(render(PARTITIONS, fabric))
        junk = tmp / "junk.conf"
        junk.write_text(junk_partitions())

        def read() -> Tables:
            return read_tables(sim, fabric, lid)

        before = scribble(sim, g2l, junk, None, read)
        # Every judged table holds keys over both its blocks (a switch's port 0 has room for 8, all used).
        assert all(t[0] == 0xFFFF and all(t[1 : min(len(t), 41)]) for t in before.values()), before

        with opensm_sa(sim, tmp / "opensm", sm_host=SM_HOST, guid2lid=g2l, args=("-P", str(conf))) as osm:
            t_osm = time.monotonic()
            theirs = read()
            theirs_pr = path_pkeys(sim, lid)
            t_osm = time.monotonic() - t_osm
            osm.proc.terminate()
            osm.proc.wait(10)
        check_opensm_read_the_file(theirs)
        untouched = [f"{n}/{p}" for (n, p), t in theirs.items() if t == before[(n, p)]]
        assert not untouched, f"OpenSM left these tables as scribbled: {untouched}"

        takeover = ibfm_sm(sim, g2l, conf)["program"]

        scribble(sim, g2l, junk, before, read)
        with ibfm_serve(sim, g2l, conf) as ib:
            up = wait_for("ibfm subnet up", lambda: ib.health().get("subnet_up") is True, 30)
            t_ib = time.monotonic()
            ours = read()
            ours_pr = path_pkeys(sim, lid)
            t_ib = time.monotonic() - t_ib
            assert ib.proc.poll() is None, ib.log.read_text()[-3000:]
        again = ibfm_sm(sim, g2l, conf)["program"]
        after = read()
        assert sim.proc.alive()
    print(f"\nOpenSM read and asked in {t_osm:.2f} s; ibfm serve up in {up:.2f} s, read and asked in {t_ib:.2f} s; "
          f"total {time.monotonic() - t0:.2f} s")  # fmt: skip
    return Measured(fabric, before, theirs, theirs_pr, takeover, ours, ours_pr, again, after)


@pytest.mark.ibsim
def test_pkey_tables_match_opensm(measured: Measured) -> None:
    """``smpquery pkeys`` of every CA port, every switch port 0 and every switch port facing a CA: ibfm's table
    == OpenSM's, index by index (indx0 included), DIFFS_BY_DESIGN aside."""
    m = measured
    problems = report_tables(m.fabric, m.ours, m.theirs, m.before)
    if problems:
        pytest.fail("ibfm's P_Key tables differ from OpenSM's:\n" + "\n".join(problems), pytrace=False)


@pytest.mark.ibsim
def test_path_record_pkeys_match_opensm(measured: Measured) -> None:
    """``saquery PR --slid --dlid [--pkey]`` between members, limited members, tenants and the SM, from a full
    and from a limited member of Default: the same P_Key, or no record, as OpenSM's SA."""
    m = measured
    problems: list[str] = []
    print("\nPathRecord P_Key (saquery PR --slid A --dlid B [--pkey P]) asked from a client: ibfm | OpenSM")
    for (client, (src, dst, pkey)), theirs in m.theirs_pr.items():
        ours = m.ours_pr[(client, (src, dst, pkey))]
        asked = f" --pkey {pkey:#06x}" if pkey is not None else ""
        line = f"from {client}: {src} -> {dst}{asked}"
        print(f"  {line:<52} {show(ours):>9} | {show(theirs)}{'' if ours == theirs else '  DIFF'}")
        if ours != theirs:
            problems.append(f"{line}: ibfm {show(ours)}, OpenSM {show(theirs)}")
    if problems:
        pytest.fail("ibfm's PathRecords differ from OpenSM's:\n" + "\n".join(problems), pytrace=False)


@pytest.mark.ibsim
def test_ibfm_sends_no_pkey_block_the_ports_hold(measured: Measured) -> None:
    """A restarted ibfm over its own tables sends no P_KeyTable block and changes nothing; a fresh ibfm over
    OpenSM's sends only the stale blocks OpenSM left on switch ports (DIFFS_BY_DESIGN)."""
    m = measured
    stale = stale_blocks(m.fabric, m.theirs)
    print(f"\nibfm sm after OpenSM: {m.takeover['pkey_blocks_sent']} P_KeyTable blocks sent ({stale} stale blocks "
          f"OpenSM left); ibfm sm after ibfm serve: {m.again['pkey_blocks_sent']} sent, "
          f"{m.again['pkey_blocks_unchanged']} unchanged")  # fmt: skip
    assert m.again["pkey_blocks_sent"] == 0 and m.again["pkey_blocks_unchanged"] > 0, m.again
    assert m.after == m.ours, "the tables changed when ibfm restarted"
    assert m.takeover["pkey_blocks_sent"] == stale, m.takeover


@pytest.mark.ibsim
def test_ibfm_keeps_the_indexes_the_ports_hold_as_opensm(tmp_path: Path) -> None:
    """A port that already holds a key keeps it at that index: OpenSM looks every key up in the table it read
    from the port (osm_pkey_mgr.c, pkey_mgr_process_physical_port) and moves only the Default and indx0 keys.
    Here every CA holds TenantA's key at index 6 (scribbled); the same file as above, OpenSM then a fresh
    ibfm, each from those tables."""
    need_ibsim("smpquery", "opensm")
    with start_sim(tmp_path, fattree(2, 4, speed=SIM_SPEED), SM_HOST) as sim:
        fabric, _, g2l, lid = lids_of(sim, tmp_path)
        conf = tmp_path / "partitions.conf"
        conf.write_text(render(PARTITIONS, fabric))
        held = tmp_path / "held.conf"
        held.write_text(junk_partitions(tenant_at=6))

        def read() -> Tables:
            return read_tables(sim, fabric, lid)

        before = scribble(sim, g2l, held, None, read)
        assert all(before[(f"host-0000{i}", 1)][6] == 0x8001 for i in range(8)), before
        with opensm_sa(sim, tmp_path / "opensm", sm_host=SM_HOST, guid2lid=g2l, args=("-P", str(conf))) as osm:
            theirs = read()
            osm.proc.terminate()
            osm.proc.wait(10)
        check_opensm_read_the_file(theirs)
        scribble(sim, g2l, held, before, read)
        ibfm_sm(sim, g2l, conf)
        ours = read()
    problems = report_tables(fabric, ours, theirs, before)
    if problems:
        pytest.fail("ibfm moved P_Keys the ports held where OpenSM keeps them:\n" + "\n".join(problems),
                    pytrace=False)  # fmt: skip
