"""UmadTransport (libibumad via ctypes) against a real ibsim.

libumad2sim must be preloaded when the interpreter starts, so every ibsim test
runs the transport in a subprocess (tests/umad_probe.py) and checks the JSON it
prints. The fabric is ibsim's net.2sw2path4hca2port example; the SM attaches at
its first node, Switch1, port 0. ibsim numbers GUIDs in file order: switches
from 0x200000, CAs from 0x100000 with the port GUIDs following each node GUID.

    Switch1 (0x200000) 1,2 -> Hca1 (0x100000) ports 1,2; 3,5 -> Switch2 ports 3,5
    Switch2 (0x200001) 1,2 -> Hca2 (0x100003) ports 1,2; ports 4,6,7,8 unconnected
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fabric.ibsim import IbsimProcess, ibsim_available
from sm.transport.base import TransportError
from sm.transport.umad import (
    _USER_MAD_HDR,
    PortAttrs,
    UmadTransport,
    _method_mask,
    _set_addr,
    choose_port,
    list_ports,
    load_libibumad,
)
from tests.conftest import need_all
from tests.umad_probe import NET_2SW2PATH4HCA2PORT, probe_env, run_probe

SWITCH1, SWITCH2, HCA1, HCA2 = 0x200000, 0x200001, 0x100000, 0x100003

# DR path -> (NodeType, NodeGUID, PortGUID, LocalPortNum), from the net file above
EXPECTED = {
    (): (2, SWITCH1, SWITCH1, 0),
    (1,): (1, HCA1, HCA1 + 1, 1),
    (2,): (1, HCA1, HCA1 + 2, 2),
    (3,): (2, SWITCH2, SWITCH2, 3),
    (5,): (2, SWITCH2, SWITCH2, 5),
    (3, 1): (1, HCA2, HCA2 + 1, 1),
    (5, 2): (1, HCA2, HCA2 + 2, 2),
}


def _need_ibsim() -> None:
    missing = [
        what
        for what, ok in (
            ("ibsim, libumad2sim and smpquery", ibsim_available("smpquery")),
            (NET_2SW2PATH4HCA2PORT, os.path.exists(NET_2SW2PATH4HCA2PORT)),
        )
        if not ok
    ]
    need_all(missing)


@dataclass
class Sim:
    """A running ibsim and a scratch directory for its clients."""

    proc: IbsimProcess
    cwd: Path

    def probe(self, scenario: str, args: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        return run_probe(self.proc, self.cwd, scenario, args, **kw)

    def command(self, line: str) -> str:
        return self.proc.command(line)

    def wait_output(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.proc.output():
            if time.monotonic() > deadline:
                raise AssertionError(f"ibsim never printed {text!r}:\n{self.proc.output()[-2000:]}")
            time.sleep(0.02)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    _need_ibsim()
    with IbsimProcess(NET_2SW2PATH4HCA2PORT) as proc:
        yield Sim(proc, tmp_path)


# -- against ibsim --------------------------------------------------------------


@pytest.mark.ibsim
def test_nodeinfo_by_dr_path_matches_net_file(sim: Sim) -> None:
    res = sim.probe("query", {"paths": [list(p) for p in EXPECTED]})
    assert res["info"] == {
        "ca_name": "ibsim0",
        "port_num": 0,
        "port_guid": SWITCH1,
        "local_lid": 0,
        "sm_lid": 0,
    }
    got = {tuple(n["path"]): n for n in res["nodes"]}
    for path, (ntype, node_guid, port_guid, local_port) in EXPECTED.items():
        n = got[path]
        assert n["status"] == 0, path
        assert (n["NodeType"], n["NodeGUID"], n["PortGUID"], n["LocalPortNum"]) == (
            ntype,
            node_guid,
            port_guid,
            local_port,
        ), path
        assert n["NumPorts"] == (8 if ntype == 2 else 2)
    # the low 32 bits of the TID are ours; the probe's TIDs count up from 1
    assert [n["tid"] & 0xFFFFFFFF for n in res["nodes"]] == list(range(1, len(EXPECTED) + 1))
    assert res["stats"]["retries"] == 0


@pytest.mark.ibsim
def test_nodeinfo_agrees_with_smpquery(sim: Sim) -> None:
    """infiniband-diags' smpquery, through the same ibsim, is the independent oracle."""
    paths = [(), (3,), (5, 2)]
    res = sim.probe("query", {"paths": [list(p) for p in paths]})
    for path, node in zip(paths, res["nodes"], strict=True):
        dr = ",".join(["0", *map(str, path)])
        out = sim.proc.run(["smpquery", "-D", "nodeinfo", dr], timeout=20).stdout
        fields = dict(re.findall(r"^(\w+):\.+(\S+)$", out, re.M))
        assert int(fields["Guid"], 16) == node["NodeGUID"], path
        assert int(fields["PortGuid"], 16) == node["PortGUID"], path
        assert int(fields["LocalPort"]) == node["LocalPortNum"], path


@pytest.mark.ibsim
def test_sm_on_a_ca_port(sim: Sim) -> None:
    """Attached at Hca1 (SIM_HOST): the CA's port 1 is chosen (INIT, no SM yet), Switch1 is hop 1."""
    res = sim.probe("query", {"paths": [[], [1], [1, 3], [1, 3, 2]]}, sim_host="Hca1")
    assert res["info"]["ca_name"] == "ibsim0"
    assert res["info"]["port_num"] == 1
    assert res["info"]["port_guid"] == HCA1 + 1
    got = [(n["NodeType"], n["NodeGUID"], n["LocalPortNum"]) for n in res["nodes"]]
    assert got == [(1, HCA1, 1), (2, SWITCH1, 1), (2, SWITCH2, 3), (1, HCA2, 2)]


@pytest.mark.ibsim
def test_portinfo_of_some_ports(sim: Sim) -> None:
    ports = [[[], 0], [[], 3], [[], 4], [[1], 1], [[3, 1], 2]]
    res = sim.probe("query", {"ports": ports})
    got = {(tuple(p["path"]), p["port"]): p for p in res["ports"]}
    assert all(p["status"] == 0 for p in res["ports"])
    own = got[((), 0)]
    assert own["PortState"] == 4  # the switch management port is Active
    up = got[((), 3)]  # Switch1 3 <-> Switch2 3, no SM yet: Init / LinkUp
    assert (up["PortState"], up["PortPhysicalState"]) == (2, 5)
    down = got[((), 4)]  # unconnected: Down / Polling
    assert (down["PortState"], down["PortPhysicalState"]) == (1, 2)
    for key in (((1,), 1), ((3, 1), 2)):
        ca = got[key]
        assert (ca["PortState"], ca["PortPhysicalState"]) == (2, 5)
        assert ca["LocalPortNum"] == 1  # the port the SMP came in on, whichever port was asked
        assert ca["LID"] == 0


@pytest.mark.ibsim
def test_200_concurrent_smps_window_16(sim: Sim) -> None:
    paths = [[], [1], [3], [3, 1], [5, 2]]
    res = sim.probe("burst", {"paths": paths, "count": 200, "window": 16})
    assert res["answered"] == 200
    assert res["correct"] == 200
    assert res["in_flight_max"] == 16  # the window was used, and never exceeded
    assert res["stats"]["timeouts"] == 0
    assert res["stats"]["unmatched"] == 0


@pytest.mark.ibsim
def test_dr_path_through_unconnected_port_times_out(sim: Sim) -> None:
    res = sim.probe("timeout", {"path": [4], "timeout": 0.1, "retries": 2})
    assert res["timeout"] is True
    assert "DR path [4]" in res["message"]
    assert "3 attempt(s)" in res["message"]
    assert res["stats"]["sent"] == 3
    assert res["stats"]["received"] == 0
    assert res["elapsed"] >= 0.3  # three full timeouts, not an early error


@pytest.mark.ibsim
def test_dropped_mads_are_survived_by_retries(sim: Sim) -> None:
    # ibsim drops 20% at Switch2 in each direction: ~1/3 of attempts fail.
    sim.command('Error "Switch2" 20')
    res = sim.probe("lossy", {"path": [3], "count": 100, "retries": 12, "timeout": 0.1})
    assert res["answered"] == 100
    assert res["guids"] == [SWITCH2]
    assert res["stats"]["retries"] > 0
    assert res["stats"]["timeouts"] == 0
    # with the error rate back at 0 nothing needs a retry
    sim.command('Error "Switch2" 0')
    res = sim.probe("lossy", {"path": [3], "count": 50, "retries": 0, "timeout": 0.5})
    assert res["answered"] == 50
    assert res["stats"]["retries"] == 0


@pytest.mark.ibsim
def test_lid_routed_smp_and_perfmgt(sim: Sim) -> None:
    res = sim.probe("lid", {"lid": 7, "perf_port": 3})
    assert res["set_lid"] == 7
    assert res["node"]["NodeGUID"] == SWITCH1  # SubnGet by LID 7 reached Switch1
    assert res["perf_class"] == 0x04
    assert res["perf_status"] == 0
    assert res["counters"]["PortSelect"] == 3
    assert res["stats"]["timeouts"] == 0


@pytest.mark.ibsim
def test_trap_128_reaches_the_sm(sim: Sim) -> None:
    probe = Path(__file__).with_name("umad_probe.py")
    proc = subprocess.Popen(
        [sys.executable, str(probe), "trap", json.dumps({"lid": 1})],
        env=probe_env(sim.proc), cwd=sim.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "{}")
        assert ready.get("ready"), proc.stderr.read() if proc.stderr else ""
        assert ready["capmask"] & 0x2  # IsSM: the issm device is held open
        assert ready["psc"] == 0
        sim.command('Unlink "Switch1"[1]')
        out, err = proc.communicate("go\n", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    trap = res["trap"]
    assert trap is not None, res
    assert (trap["class"], trap["method"], trap["attr"]) == (0x01, 0x05, 0x0002)  # SubnTrap(Notice)
    assert (trap["IsGeneric"], trap["TrapNumber"], trap["IssuerLID"], trap["LIDADDR"]) == (1, 128, 1, 1)
    assert res["source"]["lid"] == 1
    assert res["stats"]["unsolicited"] == 1
    # the probe answered with TrapRepress (LID-routed, no reply expected); ibsim saw it
    sim.wait_output("got trap repress", 5.0)


@pytest.mark.ibsim
def test_clean_shutdown_leaves_no_thread(sim: Sim) -> None:
    res = sim.probe("shutdown")
    assert len(res["rounds"]) == 2  # the port was released: a second open works
    for r in res["rounds"]:
        assert r["rx_threads"] == ["umad-rx-ibsim0/0"]
        assert r["status"] == 0
        assert r["threads_after"] == []
        assert r["closed_error"] == "TransportError: transport is closed"


@pytest.mark.ibsim
def test_unknown_ca_or_port_is_a_clear_error(sim: Sim) -> None:
    res = sim.probe("errors")
    assert res["bad_ca"] == "CA 'mlx5_9' not found; CAs present: ibsim0"
    assert res["bad_port"] == "port 7 not found on CA ibsim0"
    assert res["threads"] == []


# -- without a fabric ------------------------------------------------------------


def _port(ca: str, num: int, state: int) -> PortAttrs:
    return PortAttrs(ca, num, state, 5 if state >= 2 else 2, 0, 0, 0, 0, 0, 0, 0x1000 + num, "InfiniBand")


def test_choose_port_prefers_active_then_link_up() -> None:
    ports = [_port("mlx5_0", 1, 1), _port("mlx5_0", 2, 2), _port("mlx5_1", 1, 4)]
    assert (choose_port(ports, None, None).ca_name, choose_port(ports, None, None).port_num) == ("mlx5_1", 1)
    assert choose_port(ports[:2], None, None).port_num == 2  # INIT: fabric without an SM yet
    assert choose_port(ports, "mlx5_0", 1).state == 1  # named explicitly: taken as is
    with pytest.raises(TransportError, match="no port with its link up: mlx5_0/1 DOWN"):
        choose_port(ports[:1], None, None)
    with pytest.raises(TransportError, match="no InfiniBand device"):
        choose_port([], None, None)
    with pytest.raises(TransportError, match=r"CA 'mlx4_0' not found; CAs present: mlx5_0, mlx5_1"):
        choose_port(ports, "mlx4_0", None)
    with pytest.raises(TransportError, match="port 3 not found on CA mlx5_1"):
        choose_port(ports, "mlx5_1", 3)


def test_missing_libibumad_is_a_transport_error() -> None:
    with pytest.raises(TransportError, match="libibumad not found"):
        load_libibumad(["libibumad-not-here.so.99"])


def test_method_mask_bits() -> None:
    mask = _method_mask(0x05, 0x07)
    assert mask[0] == (1 << 5) | (1 << 7)
    assert all(v == 0 for v in list(mask)[1:])
    high = _method_mask(0x7F)
    assert list(high)[-1] != 0


def test_address_written_as_umad_set_addr_writes_it() -> None:
    """The send buffers' address is packed in Python: the same bytes as libibumad's umad_set_addr."""
    import ctypes

    try:
        lib = load_libibumad()
    except TransportError:
        pytest.skip("no libibumad")
    for lid, qp, qkey in ((1, 1, 0x80010000), (0xBFFF, 0, 0), (0xFFFF, 0xFFFFFF, 0xFFFFFFFF), (0x1234, 1, 0x5678)):
        theirs = ctypes.create_string_buffer(b"\xa5" * (_USER_MAD_HDR + 256))
        ours = ctypes.create_string_buffer(b"\xa5" * (_USER_MAD_HDR + 256))
        lib.umad_set_addr(theirs, lid, qp, 0, qkey)
        _set_addr(memoryview(ours).cast("B"), (lid, qp, qkey))
        assert ours.raw == theirs.raw, (lid, qp, qkey)


def test_start_needs_an_event_loop() -> None:
    with pytest.raises(TransportError, match="running event loop"):
        UmadTransport().start()


def test_no_device_without_ibsim() -> None:
    if os.environ.get("LD_PRELOAD") or list_ports():
        pytest.skip("this host has IB devices")
    load_libibumad()

    async def go() -> Any:
        return await UmadTransport.open()

    with pytest.raises(TransportError, match="no InfiniBand device found"):
        asyncio.run(go())
