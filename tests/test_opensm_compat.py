"""ibfm and OpenSM on the same ibsim: OpenSM accepts the subnet ibfm brought up, and both read
each other's guid2lid file.

OpenSM runs as ``opensm --once`` attached at the same host CA port as ibfm (one SM at a time:
ibfm's ``sm`` command has exited before OpenSM starts), with ``OSM_CACHE_DIR`` a temp dir and
its log in a temp file (``-f``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from fabric.formats.netfile import parse_net, read_net
from fabric.generate import fattree
from fabric.model import Fabric
from sm.sweep.lids import write_guid2lid
from tests.conftest import need_ibsim
from tests.test_ibsim_sm import SIM_SPEED, Sim, check_ibnetdiscover, parse_guid2lid, run_ibfm, start_sim

SM_HOST = "host-00000"


def run_opensm(sim: Sim, cache: Path, *args: str) -> str:
    """``opensm --once`` with ``OSM_CACHE_DIR=cache``; returns its log. OpenSM must exit 0."""
    cache.mkdir(exist_ok=True)
    log = sim.work / "opensm.log"
    env = dict(sim.env(), OSM_CACHE_DIR=str(cache))
    cp = sim.run(
        ["opensm", "--once", "-e", "-f", str(log), "--dump_files_dir", str(sim.work), *args],
        env=env,
        timeout=120,
        check=False,
    )
    text = log.read_text(errors="replace") if log.exists() else ""
    out = f"{cp.stdout[-2000:]}\n{cp.stderr[-2000:]}\n{text[-3000:]}"
    assert cp.returncode == 0, f"opensm exited {cp.returncode}\n{out}"
    return text


def discovered_lids(sim: Sim) -> dict[int, int]:
    """Port GUID -> LID as ibnetdiscover shows them."""
    seen = parse_net(sim.run(["ibnetdiscover"]).stdout, "ibnetdiscover")
    return {int(seen.port_guid[n, p]): int(seen.lid[n, p]) for n, p in seen.endports().tolist()}


def assert_opensm_up(log: str) -> None:
    assert "Entering MASTER state" in log, log[-3000:]
    assert "SUBNET UP" in log, log[-3000:]
    errors = [ln for ln in log.splitlines() if re.search(r"\bERR [0-9A-F]{4}\b", ln)]
    assert not errors, "OpenSM logged errors:\n" + "\n".join(errors[:20])


def all_ports_active(sim: Sim, fabric: Fabric) -> None:
    linkup = [ln for ln in sim.run(["iblinkinfo"]).stdout.splitlines() if "LinkUp" in ln]
    assert len(linkup) == 2 * fabric.summary()["links"]
    assert all("Active/" in ln for ln in linkup)


@pytest.mark.ibsim
def test_opensm_once_after_ibfm_keeps_lids(tmp_path: Path) -> None:
    need_ibsim("opensm", "iblinkinfo")
    with start_sim(tmp_path, fattree(2, 8, speed=SIM_SPEED), SM_HOST) as sim:
        fabric = read_net(sim.netfile)
        run = run_ibfm(sim)
        assert run.summary["subnet_up"]
        cache = tmp_path / "osm-cache"
        cache.mkdir()
        shutil.copy(sim.work / "guid2lid", cache / "guid2lid")
        log = run_opensm(sim, cache)
        assert_opensm_up(log)
        assert discovered_lids(sim) == run.guid2lid, "OpenSM reassigned LIDs ibfm had set"
        # OpenSM writes its LID database back on exit: the same assignment.
        assert parse_guid2lid((cache / "guid2lid").read_text()) == run.guid2lid
        all_ports_active(sim, fabric)


@pytest.mark.ibsim
def test_guid2lid_file_round_trips_between_ibfm_and_opensm(tmp_path: Path) -> None:
    """A LID plan neither SM would choose by itself survives ibfm -> file -> OpenSM -> file -> ibfm,
    each SM on a freshly started ibsim whose ports hold no LID."""
    need_ibsim("opensm")
    fabric = fattree(2, 4, speed=SIM_SPEED)
    endports = fabric.endports()
    guids = [int(fabric.port_guid[n, p]) for n, p in endports.tolist()]
    # Scattered LIDs in a shuffled order: 3, 8, 13, ... assigned to ports at random.
    rng = np.random.default_rng(5)
    lids = (3 + 5 * rng.permutation(len(guids))).tolist()
    plan = dict(zip(guids, lids, strict=True))
    # Written by ibfm's own writer: ibfm leaves a file it agrees with untouched.
    seed = tmp_path / "seed.guid2lid"
    write_guid2lid(seed, {g: (lid, lid) for g, lid in plan.items()})

    # 1. ibfm honours the file and writes it back.
    with start_sim(tmp_path / "a", fabric, SM_HOST) as sim:
        shutil.copy(seed, sim.work / "guid2lid")
        run = run_ibfm(sim)
        assert run.guid2lid == plan
        check_ibnetdiscover(sim, read_net(sim.netfile), run)
        ibfm_file = (sim.work / "guid2lid").read_text()

    # 2. OpenSM, on a fresh fabric, takes ibfm's file from OSM_CACHE_DIR. Going from DISCOVERING to
    #    MASTER counts as "coming out of standby" for OpenSM, which then drops the file's entries
    #    unless told to honour them (-x, --honor_guid2lid).
    cache = tmp_path / "osm-cache"
    cache.mkdir()
    (cache / "guid2lid").write_text(ibfm_file)
    with start_sim(tmp_path / "b", fabric, SM_HOST) as sim:
        assert_opensm_up(run_opensm(sim, cache, "--honor_guid2lid"))
        assert discovered_lids(sim) == plan, "OpenSM did not take the LIDs from ibfm's guid2lid file"
    osm_file = (cache / "guid2lid").read_text()
    assert parse_guid2lid(osm_file) == plan

    # 3. ibfm, on a fresh fabric, takes the file OpenSM wrote (OpenSM's layout, blank lines and all).
    with start_sim(tmp_path / "c", fabric, SM_HOST) as sim:
        (sim.work / "guid2lid").write_text(osm_file)
        run = run_ibfm(sim)
        assert run.summary["lid_warnings"] == []
        assert discovered_lids(sim) == plan
