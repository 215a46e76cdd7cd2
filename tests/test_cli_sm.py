"""``ibfm sm``, ``ibfm route`` and ``ibfm demo`` from the command line (in process)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from fabric.formats.netfile import read_net, write_net
from fabric.generate import fattree
from ibfm.cli import main
from sm.sweep.lids import read_guid2lid

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "small" / "fattree2_4leaf.net"


def test_sm_summary_dump_and_guid2lid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump, g2l = tmp_path / "lfts", tmp_path / "guid2lid"
    rc = main(["sm", "--topology", str(FIXTURE), "--dump-lfts", str(dump), "--guid2lid", str(g2l), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["subnet_up"] and out["engine"] == "ftree"
    fabric = read_net(FIXTURE)
    assert out["nodes"] == {"switches": 6, "cas": 8, "links": 16}
    entries, warnings = read_guid2lid(g2l)
    assert not warnings and len(entries) == out["lids"]["assigned"] == 14
    text = dump.read_text()
    header = r"^Unicast lids \[0x0-0x([0-9a-f]+)\] of switch Lid (\d+) guid 0x([0-9a-f]{16}) \((.*)\):$"
    headers = re.findall(header, text, re.M)
    assert len(headers) == 6
    assert {h[3] for h in headers} == {fabric.descs[n] for n in fabric.switches.tolist()}
    # Every LID has a route on every switch: 14 entries after each header.
    assert text.count(" valid lids dumped") == 6
    assert all(m == "14" for m in re.findall(r"^(\d+) valid lids dumped", text, re.M))
    # A restart keeps the LIDs.
    assert main(["sm", "--topology", str(FIXTURE), "--guid2lid", str(g2l), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["program"]["lft_blocks_sent"] == 6 and read_guid2lid(g2l)[0] == entries


def test_sm_text_summary_and_engine_choice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sm", "--topology", str(FIXTURE), "--engine", "minhop"]) == 0
    out = capsys.readouterr().out
    assert "subnet UP" in out and "routing: minhop" in out and "phases:" in out


def test_route_by_name_guid_and_lid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    net = tmp_path / "t.net"
    f = fattree(2, 4)
    write_net(f, net)
    assert main(["route", "--topology", str(net), "host-00000", "host-00007", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["hops"][0]["node"] == "host-00000" and r["hops"][-1]["node"] == "host-00007"
    assert r["path_mtu"] == 4096 and r["rate_gbps"] > 0
    guid = f"{int(f.port_guid[int(f.cas[7]), 1]):#x}"
    assert main(["route", "--topology", str(net), "host-00000", guid]) == 0
    text = capsys.readouterr().out
    assert "host-00007" in text and "path MTU 4096" in text
    assert main(["route", "--topology", str(net), "1", str(r["dst_lid"])]) == 0
    assert "host-00007" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["route", "--topology", "{net}", "host-00000", "nosuch"], "no node named 'nosuch'"),
        (["route", "--topology", "{net}", "host-00000", "999"], "LID 999 is not assigned"),
        (["route", "--topology", "{net}", "host-00000", "0xzz"], "bad GUID"),
        (["sm", "--topology", "{bad}"], "bad.net:"),
        (["sm"], "--topology FILE is required"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    net, bad = tmp_path / "t.net", tmp_path / "bad.net"
    write_net(fattree(2, 4), net)
    bad.write_text('Switch 4 "s1"\n[9] "s2"[1]\n')
    rc = main([a.format(net=net, bad=bad) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_bad_engine_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["sm", "--topology", str(FIXTURE), "--engine", "ftree,bogus"])
    assert e.value.code == 2
    assert "unknown routing engine 'bogus'" in capsys.readouterr().err


def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "subnet UP" in out and "path MTU 4096" in out


def test_sm_daemon_sweeps_until_sigterm_then_exits_0(tmp_path: Path) -> None:
    dump = tmp_path / "lfts"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ibfm.cli",
            "sm",
            "--topology",
            str(FIXTURE),
            "--daemon",
            "--sweep-interval",
            "0.2",
            "--json",
            "--dump-lfts",
            str(dump),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["subnet_up"] and dump.exists()
        assert datetime.fromisoformat(first["time"]).tzinfo is not None  # each report says when
        time.sleep(0.6)  # a few light sweeps
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_every_subcommand_maps_to_the_module_that_registers_it(capsys: pytest.CaptureFixture[str]) -> None:
    # main() imports only the module COMMANDS names for argv[0]: a missing or wrong entry
    # would make that subcommand unknown.
    import argparse
    import importlib

    from ibfm.cli import COMMAND_MODULES, COMMANDS

    seen = {}
    for module in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        seen.update(dict.fromkeys(sub.choices, module))
    assert seen == COMMANDS
    # The full parser still answers for an unknown word (usage names every subcommand).
    with pytest.raises(SystemExit):
        main(["no-such-command"])
    assert "sm" in capsys.readouterr().err
