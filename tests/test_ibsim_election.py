"""SM election and handover with OpenSM as the peer, over ibsim (IBA 14.4, SMInfo).

ibfm (``ibfm serve --transport umad``) and OpenSM 3.3.23 run on two hosts of
one ibsim fabric; ``sminfo`` from a third host, ibfm's ``/health`` and
OpenSM's log tell who is master; ``ibroute`` of every switch judges that the
fabric is fully routed after each takeover. The times are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric.formats.netfile import read_net
from fabric.generate import fattree
from tests.conftest import free_port, need_ibsim, need_tool, stop_process
from tests.test_ibsim_faults import judge_routes
from tests.test_ibsim_sm import REPO, SIM_SPEED, Sim, start_sim

IBFM_HOST = "host-00000"
OSM_HOST = "host-00001"
OSM_LOG_FLAGS = os.environ.get("IBFM_TEST_OSM_LOG", "0x03")
"""OpenSM's -D: errors and info (SUBNET UP). More (0x0f) slows OpenSM enough to hide its races."""
TOOL_HOST = "host-00002"
"""CLIENT of tests.test_ibsim_faults (judge_routes asks from there) is host-00002 too."""


@dataclass
class Ibfm:
    proc: subprocess.Popen[str]
    port: int
    log: Path

    def health(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/health", timeout=2) as r:
                h: dict[str, Any] = json.load(r)
                return h
        except OSError as e:
            return {"error": str(e)}

    def role(self) -> str:
        return str(self.health().get("sm", {}).get("state", "?"))


@contextmanager
def ibfm_serve(sim: Sim, *, priority: int) -> Iterator[Ibfm]:
    work = sim.work / "ibfm"
    work.mkdir(exist_ok=True)
    env = sim.proc.env(sim_host=IBFM_HOST)
    env["PYTHONPATH"] = str(REPO)
    env["IBFM_PERFMGR__ENABLED"] = "false"
    port = free_port()
    log = work / f"ibfm-{priority}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibfm.cli", "serve", "--transport", "umad", "--listen", f"127.0.0.1:{port}",
         "--sweep-interval", "10", "--sm-priority", str(priority), "--guid2lid", str(work / "guid2lid")],
        env=env, cwd=work, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        yield Ibfm(proc, port, log)
    finally:
        stop_process(proc)


@dataclass
class OpenSm:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextmanager
def opensm(
    sim: Sim, *, priority: int, polling_ms: int = 10000, retries: int = 4, host: str = OSM_HOST
) -> Iterator[OpenSm]:
    """OpenSM at ``host`` with its own config (empty but for the SMInfo polling), log flushed (-d2)."""
    work = sim.work / f"opensm-{host}"
    work.mkdir(exist_ok=True)
    conf = work / "opensm.conf"
    conf.write_text(f"sminfo_polling_timeout {polling_ms}\npolling_retry_number {retries}\n")
    log = work / "opensm.log"
    env = dict(sim.proc.env(sim_host=host), OSM_CACHE_DIR=str(work))
    proc = subprocess.Popen(
        ["opensm", "-F", str(conf), "-f", str(log), "-d2", "-D", OSM_LOG_FLAGS, "-p", str(priority)],
        env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield OpenSm(proc, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_for(what: str, cond: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``cond()`` holds; AssertionError naming ``what`` after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - t0


def sminfo(sim: Sim) -> str:
    """``sminfo`` from the tool host: the master as the subnet's ports name it."""
    env = sim.proc.env(sim_host=TOOL_HOST)
    cp = subprocess.run(["sminfo"], env=env, cwd=sim.work, capture_output=True, text=True, timeout=30)
    return cp.stdout.strip() or cp.stderr.strip()


def test_opensm_takes_a_higher_priority_over_and_ibfm_takes_back_when_it_dies(tmp_path: Path) -> None:
    """ibfm master at priority 0; OpenSM at 5 arrives: ibfm hands over and stands by without fighting;
    OpenSM is killed (-9): ibfm is master again within 10 s and every switch routes every LID."""
    need_ibsim("ibroute", "sminfo", "iblinkinfo")
    need_tool("opensm")
    with start_sim(tmp_path, fattree(2, 6, speed=SIM_SPEED), IBFM_HOST) as sim:
        fabric = read_net(sim.netfile)
        with ibfm_serve(sim, priority=0) as ib:
            up = wait_for("ibfm master, subnet up", lambda: ib.health().get("subnet_up") is True, 30)
            with opensm(sim, priority=5, polling_ms=1000, retries=2) as osm:
                t0 = time.monotonic()
                handover = wait_for("ibfm standby", lambda: ib.role() == "standby", 15)
                wait_for("OpenSM master", lambda: "SUBNET UP" in osm.text(), 15)
                master = time.monotonic() - t0
                info = sminfo(sim)
                assert "SMINFO_MASTER" in info and "priority 5" in info, info
                # No fight: ibfm stays standby while OpenSM runs (several of its polls).
                time.sleep(6)
                assert ib.role() == "standby", ib.health()
                assert "Entering MASTER state" not in osm.text().split("SUBNET UP", 1)[1]
                osm.proc.kill()
                osm.proc.wait()
                t1 = time.monotonic()
                takeover = wait_for("ibfm master again", lambda: ib.role() == "master", 10)
                wait_for("subnet up under ibfm", lambda: ib.health().get("subnet_up") is True, 10)
                routed = time.monotonic() - t1
            judge_routes(sim, fabric)
            info = sminfo(sim)
            assert "SMINFO_MASTER" in info and "priority 0" in info, info
            print(
                f"\nibfm up in {up:.2f} s; OpenSM (priority 5) joined: ibfm standby after {handover:.2f} s, "
                f"OpenSM SUBNET UP after {master:.2f} s; OpenSM killed: ibfm master after {takeover:.2f} s, "
                f"subnet up after {routed:.2f} s"
            )


def test_ibfm_stands_by_under_a_master_opensm_then_takes_the_subnet_by_handover(tmp_path: Path) -> None:
    """OpenSM master at priority 5; ibfm at 0 joins and stays standby; then ibfm at 10 joins instead and
    OpenSM hands the subnet over; ibfm killed (-9): OpenSM (polling every 1 s here) takes it back."""
    need_ibsim("ibroute", "sminfo", "iblinkinfo")
    need_tool("opensm")
    with start_sim(tmp_path, fattree(2, 6, speed=SIM_SPEED), IBFM_HOST) as sim:
        fabric = read_net(sim.netfile)
        with opensm(sim, priority=5, polling_ms=1000, retries=2) as osm:
            wait_for("OpenSM master", lambda: "SUBNET UP" in osm.text(), 30)
            with ibfm_serve(sim, priority=0) as low:
                wait_for("ibfm standby", lambda: low.role() == "standby", 15)
                time.sleep(5)
                h = low.health()
                assert h["state"] == "standby" and h["sm"]["state"] == "standby", h
                assert h["sm"]["master_lid"], h
                assert "SMINFO_MASTER" in sminfo(sim) and "priority 5" in sminfo(sim)
            with ibfm_serve(sim, priority=10) as high:
                t0 = time.monotonic()
                took = wait_for("ibfm master by handover", lambda: high.role() == "master", 15)
                wait_for("subnet up under ibfm", lambda: high.health().get("subnet_up") is True, 15)
                up = time.monotonic() - t0
                wait_for("OpenSM standby", lambda: "Entering STANDBY state" in osm.text(), 10)
                info = sminfo(sim)
                assert "SMINFO_MASTER" in info and "priority 10" in info, info
                judge_routes(sim, fabric)
                masters = osm.text().count("Entering MASTER state")
                high.proc.kill()
                high.proc.wait()

                def osm_up_again() -> bool:
                    text = osm.text()
                    return text.count("Entering MASTER state") > masters and "SUBNET UP" in text.rsplit(
                        "Entering MASTER state", 1
                    )[1]

                back = wait_for("OpenSM master again", osm_up_again, 30)
            info = sminfo(sim)
            assert "SMINFO_MASTER" in info and "priority 5" in info, info
            judge_routes(sim, fabric)
            print(
                f"\nibfm (priority 10) joined OpenSM (5): master by handover after {took:.2f} s, subnet up after "
                f"{up:.2f} s; ibfm killed: OpenSM (1 s polling, 2 retries) SUBNET UP after {back:.2f} s"
            )
