"""QoS over ibsim, judged against OpenSM 3.3.23: the same qos_* options on the same fabric must leave the same
SLtoVLMappingTables (``smpquery sl2vl``), VLArbitrationTables (``smpquery vlarb``) and VLHighLimits
(``smpquery portinfo``) on every CA port, every switch external port and every switch port 0.

Each SM runs on an ibsim of its own (a 2-level fat tree of 4-port switches, 8 hosts, the SM at host-00000),
both from ibsim's default tables and with one guid2lid file, so the LIDs the tools address are the same:
``opensm -Q`` with the options in its config file, until SUBNET UP; ``ibfm sm --qos --qos-option ...``
once. The options are not OpenSM's defaults (so ibfm really writes the tables), and include an SL mapped to
VL 15 (drop), VLs beyond the ports' VL0-7 (masked as OpenSM masks them), per-type tables for CAs and switch
external ports, and weights and limits beyond the defaults. ibsim's switches have a base port 0: neither SM
sets its tables, and ibsim keeps no VLHighLimit (both read 0). A second ``ibfm sm`` on the same ibsim then
sends no table. Run with ``-s`` to see what differed.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from fabric.generate import fattree
from fabric.model import Fabric
from tests.conftest import need_ibsim
from tests.saquery_ref import opensm_sa
from tests.test_ibsim_partitions import tool
from tests.test_ibsim_sa import lids_of
from tests.test_ibsim_sm import SIM_SPEED, Sim, start_sim

SM_HOST = "host-00000"
OPTIONS = {
    "qos_max_vls": "8",
    "qos_high_limit": "4",
    "qos_vlarb_low": "0:8,1:16,2:32,3:64,4:128,5:255,6:1,7:2,8:9",
    "qos_vlarb_high": "0:1,1:2",
    "qos_sl2vl": "0,1,2,3,4,5,6,7,7,6,5,4,3,2,1,0",
    "qos_ca_sl2vl": "1,0,3,2,5,4,7,6,9,8,11,10,13,12,15,14",
    "qos_swe_sl2vl": "0,1,2,3,0,1,2,3,0,1,2,3,0,1,2,15",
    "qos_swe_vlarb_high": "0:7,2:9,4:11",
    "qos_swe_high_limit": "7",
}
"""The qos_* options both SMs get (OpenSM's names and syntax)."""

Tables = dict[str, str]


def read_qos(sim: Sim, fabric: Fabric, lid: Any) -> Tables:
    """``smpquery sl2vl``, ``smpquery vlarb`` and PortInfo.VLHighLimit of every CA port, switch port 0 and
    switch external port, by (tool, node, port)."""
    out: Tables = {}
    targets: list[tuple[str, int, int]] = []
    for n in range(fabric.n_nodes):
        name = fabric.names[n]
        if fabric.is_switch(n):
            targets += [(name, lid(name, 0), p) for p in range(int(fabric.nports[n]) + 1)]
        else:
            targets.append((name, lid(name, 1), 1))
    for name, target, port in targets:
        for what in ("sl2vl", "vlarb"):
            text = tool(sim, ["smpquery", what, str(target), str(port)], host=SM_HOST)
            out[f"{what} {name}/{port}"] = text.strip()
        pi = tool(sim, ["smpquery", "portinfo", str(target), str(port)], host=SM_HOST)
        hl = [ln for ln in pi.splitlines() if ln.startswith("VLHighLimit")]
        out[f"VLHighLimit {name}/{port}"] = hl[0] if hl else "?"
    return out


def ibfm_sm(sim: Sim, g2l: Path, *extra: str) -> dict[str, Any]:
    work = sim.work / "ibfm"
    work.mkdir(exist_ok=True)
    mine = work / "guid2lid"
    if not mine.exists():
        shutil.copy(g2l, mine)
    opts = [a for k, v in OPTIONS.items() for a in ("--qos-option", f"{k}={v}")]
    cp = sim.run([sys.executable, "-m", "ibfm.cli", "sm", "--transport", "umad", "--json", "--guid2lid", str(mine),
                  "--qos", *opts, *extra], timeout=120, check=False)  # fmt: skip
    assert cp.returncode == 0, f"ibfm sm exited {cp.returncode}\nstdout:\n{cp.stdout[-3000:]}\nstderr:\n{cp.stderr}"
    summary: dict[str, Any] = json.loads(cp.stdout)
    assert summary["subnet_up"] and summary["program"]["failures"] == [], summary["program"]
    return summary


def diff(ours: Tables, theirs: Tables) -> list[str]:
    return [f"{k}:\n  ibfm:   {ours[k]!r}\n  OpenSM: {theirs[k]!r}" for k in sorted(theirs) if ours.get(k) != theirs[k]]


@pytest.mark.ibsim
def test_qos_tables_are_opensms(tmp_path: Path) -> None:
    need_ibsim("smpquery", "opensm")
    fabric_spec = fattree(2, 4, speed=SIM_SPEED)
    for d in ("osm", "ibfm"):
        (tmp_path / d).mkdir()
    with start_sim(tmp_path / "osm", fabric_spec, SM_HOST) as sim:
        fabric, _, g2l, lid = lids_of(sim, tmp_path / "osm")
        conf = tmp_path / "osm" / "qos.conf"
        conf.write_text("qos TRUE\n" + "".join(f"{k} {v}\n" for k, v in OPTIONS.items()))
        with opensm_sa(sim, tmp_path / "osm" / "opensm", sm_host=SM_HOST, guid2lid=g2l,
                       args=("-F", str(conf), "-Q")) as osm:  # fmt: skip
            theirs = read_qos(sim, fabric, lid)
            del osm
    with start_sim(tmp_path / "ibfm", fabric_spec, SM_HOST) as sim:
        shutil.copy(g2l, tmp_path / "ibfm" / "guid2lid")
        first = ibfm_sm(sim, tmp_path / "ibfm" / "guid2lid")
        ours = read_qos(sim, fabric, lid)
        again = ibfm_sm(sim, tmp_path / "ibfm" / "guid2lid")
    p = first["program"]
    print(f"\n{len(theirs)} tables judged; ibfm sent {p['sl2vl_tables_sent']} SL2VL tables and "
          f"{p['vlarb_blocks_sent']} VLArb blocks "
          f"({p['sl2vl_tables_unchanged']} and {p['vlarb_blocks_unchanged']} already right); a second run sent "
          f"{again['program']['sl2vl_tables_sent']} and {again['program']['vlarb_blocks_sent']}")  # fmt: skip
    for k in ("sl2vl host-00003/1", "sl2vl leaf-00/2", "vlarb leaf-00/2", "VLHighLimit host-00003/1"):
        print(f"{k}:\n{theirs[k]}")
    problems = diff(ours, theirs)
    if problems:
        pytest.fail(f"{len(problems)} of {len(theirs)} tables differ from OpenSM's:\n" + "\n".join(problems[:20]),
                    pytrace=False)  # fmt: skip
    assert p["sl2vl_tables_sent"] > 0 and p["vlarb_blocks_sent"] > 0, p  # ibfm wrote them (from ibsim's defaults)
    assert again["program"]["sl2vl_tables_sent"] == 0 == again["program"]["vlarb_blocks_sent"], again["program"]
