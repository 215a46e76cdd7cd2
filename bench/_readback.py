"""What a fabric holds, read back with infiniband-diags: the judge of any SM (ibfm's or OpenSM).

``ibnetdiscover`` gives the topology and every end port's LID, ``ibroute``
of every switch (by LID, or by directed route where the LID is not routed
from the reading host) gives the LFTs, and ``iblinkinfo`` gives each port's
logical state. Benchmarks and tests then judge the routes with
:func:`sm.analysis.verify.verify_routes` on what the tools saw, never on what the SM
says it did.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fabric.formats.netfile import parse_net
from fabric.model import Fabric
from sm.analysis.verify import VerifyReport, verify_routes
from sm.lidmap import LidMap
from sm.routing.base import NO_ROUTE, Lft

_ROW = re.compile(r"^0x([0-9a-f]{4}) (\d{3})\b", re.M)
_LINK_STATE = re.compile(r"\b(Down|Initialize|Armed|Active)/\s*(\w+)")


def run_tool(argv: Sequence[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a diag tool (libumad2sim preloaded by ``env``) in ``cwd``; never raises on its exit status."""
    return subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@dataclass
class ReadBack:
    """The fabric as the tools saw it."""

    fabric: Fabric
    lids: LidMap
    lft: Lft
    """Rows in ``fabric.switches`` order; NO_ROUTE where ibroute listed nothing (or could not read)."""
    unread: list[str] = field(default_factory=list)
    """Switches whose LFT could not be read at all."""
    by_dr: list[str] = field(default_factory=list)
    """Switches whose LID is not routed from the reading host: their LFT was read by directed route."""
    notes: list[str] = field(default_factory=list)

    def verify(self) -> VerifyReport:
        """Every (end port, LID) pair traced on what the switches hold."""
        return verify_routes(self.fabric, self.lids, self.lft)


def dr_paths_from(f: Fabric, src: int) -> dict[int, str]:
    """Directed-route path (ibdiags ``0,p1,p2,...``) from CA ``src`` to every switch, breadth first."""
    paths: dict[int, list[int]] = {}
    up = f.up_mask()
    frontier = []
    for p in np.flatnonzero(up[src]).tolist()[:1]:
        nxt = int(f.peer_node[src, p])
        paths[nxt] = [0, p]
        frontier.append(nxt)
    while frontier:
        new = []
        for n in frontier:
            for p in np.flatnonzero(up[n]).tolist():
                m = int(f.peer_node[n, p])
                if f.is_switch(m) and m not in paths:
                    paths[m] = [*paths[n], p]
                    new.append(m)
        frontier = new
    return {n: ",".join(map(str, p)) for n, p in paths.items()}


def read_back(env: dict[str, str], cwd: Path, host_guid: int, *, workers: int = 4, timeout: float = 600) -> ReadBack:
    """ibnetdiscover, then ibroute of every switch, from the host CA whose port GUID is ``host_guid``."""
    cp = run_tool(["ibnetdiscover"], env, cwd, timeout)
    if cp.returncode != 0:
        raise RuntimeError(f"ibnetdiscover exit {cp.returncode}: {cp.stderr.strip()[-300:]}")
    f = parse_net(cp.stdout, "ibnetdiscover")
    base = np.zeros(f.port_exists.shape, np.uint16)
    ep = f.endports()
    base[ep[:, 0], ep[:, 1]] = f.lid[ep[:, 0], ep[:, 1]]
    lids = LidMap.from_base(base)
    sw = f.switches
    sw_lids = [int(base[n, 0]) for n in sw.tolist()]
    lft = np.full((sw.size, lids.max_lid + 1), NO_ROUTE, np.uint8)
    out = ReadBack(f, lids, lft)
    dr: dict[int, str] | None = None

    def one(row: int) -> tuple[int, str, str]:
        nonlocal dr
        name = f"{f.descs[sw[row]]} (LID {sw_lids[row]})"
        by_lid = run_tool(["ibroute", "-n", str(sw_lids[row])], env, cwd, timeout)
        if by_lid.returncode == 0:
            return row, by_lid.stdout, ""
        if dr is None:
            dr = dr_paths_from(f, f.by_port_guid(host_guid)[0])
        path = dr.get(int(sw[row]))
        by_dr = run_tool(["ibroute", "-n", "-D", path], env, cwd, timeout) if path else None
        if by_dr is not None and by_dr.returncode == 0:
            return row, by_dr.stdout, "dr:" + name
        return row, "", "unread:" + name

    with ThreadPoolExecutor(workers) as pool:
        for row, text, how in pool.map(one, range(sw.size)):
            if how.startswith("dr:"):
                out.by_dr.append(how[3:])
            elif how.startswith("unread:"):
                out.unread.append(how[7:])
                continue
            rows = np.array(_ROW.findall(text), dtype=object)
            if rows.size:
                lid = np.array([int(x, 16) for x in rows[:, 0]], np.int64)
                port = np.array([int(x) for x in rows[:, 1]], np.int64)
                keep = lid <= lids.max_lid
                lft[row, lid[keep]] = port[keep]
    if lids.max_lid % 64 == 0:
        # ibroute reads blocks up to ALIGN(top, 64)/64 - 1: a top LID opening a new block is never read.
        out.notes.append(f"top LID {lids.max_lid} opens a new block: ibroute cannot read it, counted unrouted")
    return out


def port_states(env: dict[str, str], cwd: Path, *, timeout: float = 120) -> dict[str, int]:
    """How many port ends ``iblinkinfo`` shows in each logical state (Down, Initialize, Armed, Active)."""
    cp = run_tool(["iblinkinfo", "--line"], env, cwd, timeout)
    if cp.returncode != 0:
        raise RuntimeError(f"iblinkinfo exit {cp.returncode}: {cp.stderr.strip()[-300:]}")
    counts = {"Down": 0, "Initialize": 0, "Armed": 0, "Active": 0}
    for m in _LINK_STATE.finditer(cp.stdout):
        counts[m.group(1)] += 1
    return counts
