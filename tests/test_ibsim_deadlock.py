"""Deadlock freedom judged from outside: what the switches hold and what the SA hands out, over ibsim.

``ibfm serve --transport umad`` routes a fabric ibsim runs (default engine chain, no flag); then,
with tools we did not write and without ibfm's own credit-loop check:

- ``ibnetdiscover``: the topology and every end port's LID;
- ``ibroute`` of every switch: the LFTs;
- ``saquery PR --slid A --dlid B``: the SL of each pair, one record per query (libumad2sim has
  no RMPP), from one CA on every switch to every LID: LFTs are destination-based, so every CA on
  a switch shares that switch's route;
- ``smpquery sl2vl LID OUT`` of every switch output port a route uses (one row per input port):
  the VL a packet of each SL leaves on.

From these, the channel dependency graph per (directed link, VL) is built here: a packet held in
the input buffer of link ``c1`` on VL ``v1`` waits for credits of the next link ``c2`` on the VL
``v2`` the switch maps its SL to. A cycle is a possible deadlock; there must be none, on a torus,
a dragonfly, a random regular graph and a degraded 3-level fat-tree.

When a case fails with every SL 0 on a fabric that needs more than one VL, the SA does not yet hand
out the layers the routing chose (``pair_sl`` reading the snapshot's layers).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from fabric.formats.netfile import parse_net
from fabric.generate import degrade, dragonfly, fattree, random_regular, torus
from fabric.model import Fabric
from tests.conftest import need_ibsim
from tests.test_ibsim_election import Ibfm, wait_for
from tests.test_ibsim_sa import ibfm_serve_at
from tests.test_ibsim_sm import SIM_SPEED, Sim, parse_ibroute, start_sim

DIAGS = ("ibnetdiscover", "ibroute", "saquery", "smpquery")


@dataclass(frozen=True)
class Case:
    build: Callable[[], Fabric]
    sm_host: str
    tool_host: str


CASES = {
    "torus-4x4": Case(lambda: torus([4, 4], 2, radix=8, speed=SIM_SPEED), "host-0000", "host-0031"),
    "dragonfly-5x3": Case(lambda: dragonfly(5, 3, 2, 2, speed=SIM_SPEED), "host-0000", "host-0029"),
    "random-12x3": Case(lambda: random_regular(12, 3, 2, seed=2, speed=SIM_SPEED), "host-0000", "host-0023"),
    "fattree3-k6-degraded": Case(
        lambda: degrade(fattree(3, 6, speed=SIM_SPEED), links=6, seed=3), "host-00000", "host-00053"
    ),
}


def ibfm_serve(sim: Sim, host: str) -> AbstractContextManager[Ibfm]:
    """``ibfm serve --transport umad`` at ``host`` with no routing flag, for the block: the default
    chain must pick the layered engine by itself where ftree refuses."""
    return ibfm_serve_at(sim, None, host=host, sweep_interval=30)


def tool(sim: Sim, host: str, *argv: str, timeout: float = 60.0) -> str:
    """A diag tool as a client attached at ``host``, in its own working directory; its stdout."""
    cwd = sim.work / f"tool-{host}"
    cwd.mkdir(exist_ok=True)
    cp = subprocess.run(
        list(argv), env=sim.proc.env(sim_host=host), cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert cp.returncode == 0, f"{' '.join(argv)} exited {cp.returncode}: {cp.stderr[-1000:]}"
    return cp.stdout


_PR_SL = re.compile(r"^\s*sl\.+(0x[0-9a-fA-F]+|\d+)\s*$", re.M)
_SL2VL_ROW = re.compile(r"^\s*ports: in\s+(\d+), out\s+(\d+):((?:\s*\d+){16})\s*$", re.M)


def path_sl(sim: Sim, host: str, slid: int, dlid: int) -> int:
    out = tool(sim, host, "saquery", "PR", "--slid", str(slid), "--dlid", str(dlid))
    m = _PR_SL.search(out)
    assert m, f"no sl in saquery PR {slid} -> {dlid}:\n{out}"
    return int(m.group(1), 0)


def parse_sl2vl(text: str) -> dict[tuple[int, int], list[int]]:
    """``smpquery sl2vl`` output: (in port, out port) -> VL of SL 0..15."""
    out = {}
    for m in _SL2VL_ROW.finditer(text.replace("|", " ")):
        out[(int(m.group(1)), int(m.group(2)))] = [int(x) for x in m.group(3).split()]
    return out


class Sl2Vl:
    """Switch SL2VL tables, read with smpquery as routes need them."""

    def __init__(self, sim: Sim, host: str) -> None:
        self.sim, self.host = sim, host
        self.tables: dict[tuple[int, int, int], list[int]] = {}
        self.queries = 0

    def vl(self, lid: int, in_port: int, out_port: int, sl: int) -> int:
        key = (lid, in_port, out_port)
        if key not in self.tables:
            # One query per output port: smpquery prints the rows of every input port.
            self.queries += 1
            text = tool(self.sim, self.host, "smpquery", "sl2vl", str(lid), str(out_port))
            got = parse_sl2vl(text)
            assert (in_port, out_port) in got, f"smpquery sl2vl {lid} {out_port}:\n{text}"
            for (i, o), row in got.items():
                self.tables[(lid, i, o)] = row
        return self.tables[key][sl]


def channel_dependencies(
    f: Fabric, lft: dict[int, dict[int, int]], sw_lid: dict[int, int], sources: list[tuple[int, int]],
    dests: list[int], sl_of: Callable[[int, int], int], sl2vl: Sl2Vl,
) -> nx.DiGraph:  # fmt: skip
    """(node, out port, VL) -> (node, out port, VL) for every route from ``sources`` (CA node, port) to ``dests``."""
    g = nx.DiGraph()
    for (ca, ca_port), dlid in itertools.product(sources, dests):
        if int(f.lid[ca, ca_port]) == dlid:
            continue
        sl = sl_of(int(f.lid[ca, ca_port]), dlid)
        node, in_port = int(f.peer_node[ca, ca_port]), int(f.peer_port[ca, ca_port])
        prev: tuple[int, int, int] | None = None
        for _ in range(f.n_nodes):
            if not f.is_switch(node):
                break
            out = lft[node].get(dlid)
            assert out is not None, f"{f.names[node]} has no route to LID {dlid}"
            if out == 0:
                break
            peer = int(f.peer_node[node, out])
            vl = sl2vl.vl(sw_lid[node], in_port, out, sl)
            cur = (node, out, vl)
            if prev is not None and f.is_switch(peer):
                g.add_edge(prev, cur)
            elif prev is not None:
                g.add_node(cur)
            prev = cur if f.is_switch(peer) else None
            node, in_port = peer, int(f.peer_port[node, out])
        else:
            raise AssertionError(f"route {f.names[ca]} -> LID {dlid} loops")
    return g


def judge(sim: Sim, tool_host: str) -> dict[str, Any]:
    """Read the subnet back and build the per-VL channel dependency graph; its cycles and statistics."""
    f = parse_net(tool(sim, tool_host, "ibnetdiscover"), "ibnetdiscover")
    sw_lid = {int(n): int(f.lid[n, 0]) for n in f.switches.tolist()}
    lft: dict[int, dict[int, int]] = {}
    for n, lid in sw_lid.items():
        (t,) = parse_ibroute(tool(sim, tool_host, "ibroute", str(lid)))
        lft[n] = dict(t.entries)
    # ibroute cannot print a top LID that opens a new 64-LID block; ibtracert's view is the same
    # LFT, so such a LID is left out of the destinations rather than guessed.
    top = max(int(x) for x in f.lid[f.port_exists].tolist())
    dests = sorted(
        {int(f.lid[n, p]) for n, p in f.endports().tolist()} - ({top} if top % 64 == 0 else set())
    )
    sources = []
    for s in f.switches.tolist():
        cas = [(m, q) for _, m, q in f.cas_under(s)]
        if cas:
            sources.append(min(cas))
    sls: dict[tuple[int, int], int] = {}

    def sl_of(slid: int, dlid: int) -> int:
        if (slid, dlid) not in sls:
            sls[(slid, dlid)] = path_sl(sim, tool_host, slid, dlid)
        return sls[(slid, dlid)]

    sl2vl = Sl2Vl(sim, tool_host)
    g = channel_dependencies(f, lft, sw_lid, sources, dests, sl_of, sl2vl)
    cycles = list(itertools.islice(nx.simple_cycles(g), 3))
    named = [[f"{f.names[a]}[{p}] VL{v}" for a, p, v in c] for c in cycles]
    return {
        "fabric": f,
        "pairs": len(sls),
        "sls": sorted(set(sls.values())),
        "vls": sorted({v for _, _, v in g.nodes}),
        "channels": g.number_of_nodes(),
        "dependencies": g.number_of_edges(),
        "sl2vl_queries": sl2vl.queries,
        "cycles": named,
    }


@pytest.mark.ibsim
@pytest.mark.parametrize("name", sorted(CASES))
def test_no_credit_loop_on_any_vl_as_the_tools_see_it(name: str, tmp_path: Path) -> None:
    need_ibsim(*DIAGS)
    case = CASES[name]
    with start_sim(tmp_path, case.build(), case.sm_host) as sim, ibfm_serve(sim, case.sm_host) as sm:
        wait_for("ibfm master with the subnet up", lambda: sm.health().get("subnet_up") is True, 120)
        engine = sm.health()["routing"]["engine"]  # picked by the default chain, no flag
        assert engine == ("ftree" if name.startswith("fattree") else "layered"), engine
        t0 = time.monotonic()
        got = judge(sim, case.tool_host)
        print(
            f"{name}: {got['pairs']} pairs, SLs {got['sls']}, VLs {got['vls']}, {got['channels']} channels, "
            f"{got['dependencies']} dependencies, {got['sl2vl_queries']} sl2vl reads, "
            f"{time.monotonic() - t0:.1f} s"
        )
        assert got["dependencies"] > 0
        assert got["cycles"] == [], f"credit loops (SLs the SA gave: {got['sls']}): {got['cycles']}"


def test_sl2vl_and_path_record_parsers() -> None:
    """The parsers on outputs as infiniband-diags 44 prints them (no ibsim needed)."""
    text = (
        "# SL2VL table: Lid 6\n"
        "#                 SL: | 0| 1| 2| 3| 4| 5| 6| 7| 8| 9|10|11|12|13|14|15|\n"
        "ports: in  0, out  4: | 0| 1| 2| 3| 4| 5| 6| 7| 8| 9|10|11|12|13|14| 7|\n"
        "ports: in  2, out  4: | 0| 1| 1| 3| 4| 5| 6| 7| 8| 9|10|11|12|13|14| 7|\n"
    )
    got = parse_sl2vl(text)
    assert got[(0, 4)] == [*range(15), 7] and got[(2, 4)][2] == 1 and len(got) == 2
    pr = "PathRecord dump:\n\t\tservice_id..............0x0000000000000000\n\t\tsl......................0x1\n"
    assert int(_PR_SL.search(pr).group(1), 0) == 1  # type: ignore[union-attr]
