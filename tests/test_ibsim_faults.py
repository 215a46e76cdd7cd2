"""ibfm run as a live fabric runs it, over ibsim, judged by infiniband-diags.

Each test starts its own ibsim and the SM as a daemon (bench/_sm_runner.py,
libibumad through libumad2sim, attached at a host CA with IsSM), then does
what a production fabric does to an SM every day: hosts query it with
``saquery``, ``sminfo``, ``smpquery`` and ``perfquery`` (and a hostile host
floods it with MADs of every class, method and length), links bounce
between two sweeps and storm, MADs get lost on the way. The judges are the
tools' own reading of the fabric (``iblinkinfo``, ``ibnetdiscover``,
``ibroute`` of every switch, bench/_readback.py), never what ibfm says.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench._readback import port_states, read_back
from bench._sm_runner import SmRunner
from fabric.formats.netfile import read_net
from fabric.generate import fattree
from fabric.model import Fabric
from tests.conftest import free_port, need_ibsim, stop_process
from tests.test_ibsim_sm import REPO, SIM_SPEED, Sim, start_sim
from tests.umad_probe import run_probe

SM_HOST = "host-00000"
CLIENT = "host-00005"
SWEEP_S = 1.0


def client_env(sim: Sim, host: str = CLIENT) -> dict[str, str]:
    """A tool's environment at another host than the SM's."""
    env = sim.proc.env(sim_host=host)
    env["PYTHONPATH"] = str(REPO)
    return env


def sm_port_lid(fabric: Fabric, guid2lid: Path) -> int:
    port_guid = int(fabric.port_guid[fabric.by_name(SM_HOST), 1])
    for line in guid2lid.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and int(parts[0], 16) == port_guid:
            return int(parts[1], 0)
    raise AssertionError(f"SM port {port_guid:#x} not in {guid2lid}")


def leaf_spine_links(fabric: Fabric) -> list[tuple[str, int]]:
    """(leaf name, port) of every leaf-to-spine link."""
    out = []
    for n in fabric.switches.tolist():
        if not fabric.names[n].startswith("leaf"):
            continue
        for p in range(1, int(fabric.nports[n]) + 1):
            m = int(fabric.peer_node[n, p])
            if m >= 0 and fabric.is_switch(m):
                out.append((fabric.names[n], p))
    return out


def wait_until_active(sim: Sim, timeout: float) -> tuple[float, dict[str, int]]:
    """Poll iblinkinfo until no port end is Initialize or Armed; (seconds taken, last counts)."""
    t0 = time.monotonic()
    env = client_env(sim)
    while True:
        counts = port_states(env, sim.work)
        if counts["Initialize"] == 0 and counts["Armed"] == 0:
            return time.monotonic() - t0, counts
        if time.monotonic() - t0 > timeout:
            return time.monotonic() - t0, counts
        time.sleep(0.5)


def judge_routes(sim: Sim, fabric: Fabric) -> None:
    """Every switch answers ibroute by LID, and every (end port, LID) pair is routed on what ibroute reads."""
    host_guid = int(fabric.port_guid[fabric.by_name(CLIENT), 1])
    rb = read_back(client_env(sim), sim.work, host_guid)
    assert rb.unread == [] and rb.by_dr == [], (rb.unread, rb.by_dr)
    assert rb.fabric.summary()["links"] == fabric.summary()["links"]
    v = rb.verify()
    assert v.unreachable == 0, v.failures[:5]


@pytest.mark.ibsim
def test_queries_and_hostile_mads_leave_the_sm_sweeping(tmp_path: Path) -> None:
    """saquery, sminfo, smpquery and perfquery of every kind at the SM's LID, then 3,000 MADs of every
    class, method and length from another host: the daemon lives, keeps sweeping, and refuses with a
    MAD status what it does not serve (saquery fails at once, not after its timeout)."""
    need_ibsim("saquery", "sminfo", "smpquery", "perfquery", "iblinkinfo")
    with start_sim(tmp_path, fattree(2, 8, speed=SIM_SPEED), SM_HOST) as sim:
        fabric = read_net(sim.netfile)
        with SmRunner(sim.proc, SM_HOST, sim.work / "sm", sweep_interval=SWEEP_S) as sm:
            sm.wait_sweep(up=True, timeout=30)
            lid = sm_port_lid(fabric, sm.guid2lid)
            env = client_env(sim)
            queries = [
                ["saquery", "-p", "--src-to-dst", f"{lid}:{lid + 1}"],
                ["saquery", "NR", str(lid)],
                ["saquery", "PIR", str(lid)],
                ["saquery", "SMIR"],
                ["saquery", "-g"],
                ["saquery", "-m"],
                ["saquery", "-c"],
                ["saquery", "PR", "--slid", str(lid), "--dlid", str(lid + 1)],
                ["sminfo"],
                ["sminfo", str(lid)],
                ["smpquery", "nodeinfo", str(lid)],
                ["smpquery", "portinfo", str(lid)],
                ["smpquery", "sl2vl", str(lid)],
                ["smpquery", "pkeys", str(lid)],
                ["perfquery", str(lid)],
                ["perfquery", "-x", str(lid)],
            ]
            slow = []
            for argv in queries:
                t0 = time.monotonic()
                subprocess.run(argv, env=env, cwd=sim.work, capture_output=True, text=True, timeout=60)
                if argv[0] == "saquery" and time.monotonic() - t0 > 0.9:
                    slow.append(argv)
                assert sm.returncode() is None, f"SM died after {argv}:\n{sm.stderr()[-3000:]}"
            assert not slow, f"saquery waited for its timeout instead of a refusal: {slow}"

            res = run_probe(sim.proc, sim.work, "fuzz", {"lid": lid, "count": 3000, "seed": 7}, sim_host=CLIENT)
            assert res["sent"] > 2500, res
            # The SM refused (answered with a status) what wanted an answer: those came back here.
            assert res["stats"]["unmatched"] > 500, res
            assert sm.returncode() is None, sm.stderr()[-3000:]
            status = sm.command("status")
            print("fuzz:", res, "sm:", status)
            assert status["refused"] > 300, status
            mark = sm.mark()
            after = sm.wait_sweep(start=mark, kind="light", timeout=10 * SWEEP_S)
            assert after["subnet_up"], after
            _, counts = wait_until_active(sim, 0)
            assert counts["Initialize"] == counts["Armed"] == 0, counts
        assert sim.proc.alive()


@pytest.mark.ibsim
def test_a_bounced_link_is_active_again(tmp_path: Path) -> None:
    """Unlink and ReLink between two sweeps: the link trains back to INIT, the light sweep sees the
    bounce and the link is ACTIVE again within 10 s."""
    need_ibsim("iblinkinfo", "ibroute", "ibnetdiscover")
    with start_sim(tmp_path, fattree(2, 8, speed=SIM_SPEED), SM_HOST) as sim:
        fabric = read_net(sim.netfile)
        with SmRunner(sim.proc, SM_HOST, sim.work / "sm", sweep_interval=3.0) as sm:
            sm.wait_sweep(up=True, timeout=30)
            mark = sm.mark()
            sim.proc.command('Unlink "leaf-05"[5]')
            sim.proc.command('ReLink "leaf-05"[5]')
            took, counts = wait_until_active(sim, 10)
            print(f"bounce: every port ACTIVE {took:.1f} s after ReLink")
            assert counts["Initialize"] == counts["Armed"] == 0, (took, counts, sm.lines[mark:])
            heavy = sm.wait_sweep(start=mark, timeout=10)
            assert heavy["subnet_up"], heavy
            judge_routes(sim, fabric)


@pytest.mark.ibsim
def test_a_link_storm_settles_fully_routed(tmp_path: Path) -> None:
    """60 Unlink/ReLink events on 10 leaf-spine links: within 30 s of the last, no port INIT or ARMED,
    every switch answers ibroute by LID and every pair is routed."""
    need_ibsim("iblinkinfo", "ibroute", "ibnetdiscover")
    with start_sim(tmp_path, fattree(2, 8, speed=SIM_SPEED), SM_HOST) as sim:
        fabric = read_net(sim.netfile)
        links = random.Random(3).sample(leaf_spine_links(fabric), 10)
        with SmRunner(sim.proc, SM_HOST, sim.work / "sm", sweep_interval=SWEEP_S) as sm:
            sm.wait_sweep(up=True, timeout=30)
            rng = random.Random(5)
            down: set[tuple[str, int]] = set()
            for _ in range(60):
                link = rng.choice(links)
                verb = "ReLink" if link in down else "Unlink"
                sim.proc.command(f'{verb} "{link[0]}"[{link[1]}]')
                down.symmetric_difference_update({link})
                time.sleep(rng.uniform(0, 0.1))
            for link in sorted(down):
                sim.proc.command(f'ReLink "{link[0]}"[{link[1]}]')
            took, counts = wait_until_active(sim, 30)
            print(f"storm: every port ACTIVE {took:.1f} s after the last ReLink")
            assert counts["Initialize"] == counts["Armed"] == 0, (took, counts)
            # The flap damper may hold a port down for a while; then the storm's links are routed around.
            deadline = time.monotonic() + 30
            while True:
                try:
                    judge_routes(sim, fabric)
                    break
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(1)
            assert sm.returncode() is None, sm.stderr()[-3000:]


@pytest.mark.ibsim
def test_one_shot_bring_up_at_one_percent_mad_loss(tmp_path: Path) -> None:
    """ibsim drops 1% of MADs at every node (per hop): `ibfm sm` still brings the subnet up in one
    sweep and exits 0, and the fabric is fully routed as ibroute reads it."""
    need_ibsim("ibroute", "ibnetdiscover")
    with start_sim(tmp_path, fattree(3, 8, speed=SIM_SPEED), SM_HOST) as sim:
        fabric = read_net(sim.netfile)
        sim.proc.drop_mads(fabric.names, 1)
        g2l = sim.work / "guid2lid"
        cp = sim.run(
            [sys.executable, "-m", "ibfm.cli", "sm", "--transport", "umad", "--json", "--guid2lid", str(g2l)],
            timeout=180,
            check=False,
        )
        assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
        s = json.loads(cp.stdout)
        assert s["subnet_up"] and s["program"]["failures"] == [] and s["discovery_errors"] == [], s
        print(f"1% loss: up in {s['up_s']} s, {s['smps']} SMPs, transport {s['transport']}")
        sim.proc.drop_mads(fabric.names, 0)
        judge_routes(sim, fabric)


@pytest.mark.ibsim
def test_serve_repairs_a_cut_link_on_its_trap(tmp_path: Path) -> None:
    """`ibfm serve --transport umad` holds IsSM, so switches' traps reach it: a cut link is routed
    around long before the 60 s sweep timer (within 15 s; about 0.5 s on a quiet machine)."""
    need_ibsim("ibroute", "ibnetdiscover")
    with start_sim(tmp_path, fattree(2, 8, speed=SIM_SPEED), SM_HOST) as sim:
        fabric = read_net(sim.netfile)
        port = free_port()
        work = sim.work / "serve"
        work.mkdir()
        env = sim.env()
        env["IBFM_PERFMGR__ENABLED"] = "false"
        proc = subprocess.Popen(
            [sys.executable, "-m", "ibfm.cli", "serve", "--transport", "umad", "--listen", f"127.0.0.1:{port}",
             "--sweep-interval", "60", "--guid2lid", str(work / "guid2lid")],
            env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            import urllib.request

            def health() -> dict[str, object]:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2) as r:
                    h: dict[str, object] = json.load(r)
                    return h

            deadline = time.monotonic() + 30
            h: dict[str, object] = {}
            while time.monotonic() < deadline:
                try:
                    h = health()
                    if h.get("subnet_up"):
                        break
                except OSError:
                    pass
                time.sleep(0.2)
            assert h.get("subnet_up"), h
            links = int(fabric.summary()["links"])
            leaf = fabric.by_name("leaf-05")
            spine = int(fabric.peer_node[leaf, 5])
            t0 = time.monotonic()
            sim.proc.command('Unlink "leaf-05"[5]')
            seen = None
            while time.monotonic() - t0 < 15:
                h = health()
                fab = h.get("fabric")
                if isinstance(fab, dict) and fab.get("links") == links - 1 and h.get("subnet_up"):
                    seen = time.monotonic() - t0
                    break
                time.sleep(0.1)
            assert seen is not None, (h, proc.stderr)
            print(f"serve: cut link routed around {seen:.2f} s after Unlink (sweep timer 60 s)")
            host_guid = int(fabric.port_guid[fabric.by_name(CLIENT), 1])
            rb = read_back(client_env(sim), sim.work, host_guid)
            v = rb.verify()
            assert v.unreachable == 0, v.failures[:5]
            assert rb.unread == [], rb.unread
            assert fabric.names[spine].startswith("spine")
        finally:
            stop_process(proc)
