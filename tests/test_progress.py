"""Progress of a heavy sweep: the counters the sweep publishes, and their display on a terminal."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from ibfm.cli import main
from ibfm.progress import ProgressDisplay, finished_line, running_line, showing, wanted
from sm.sweep.manager import FabricManager, SweepProgress
from sm.transport.base import TransportStats
from sm.transport.emulated import EmulatedTransport

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "small" / "fattree2_4leaf.net"
CLEAR = "\r\x1b[K"


class FakeTty(io.StringIO):
    """A terminal that keeps what was written."""

    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def screen(text: str) -> list[str]:
    """What a terminal shows: each line as the last carriage return left it."""
    out = []
    for line in text.split("\n"):
        out.append(line.split("\r")[-1].replace("\x1b[K", ""))
    return out


# -- what the sweep publishes ------------------------------------------------------------------------------


async def test_the_sweep_publishes_its_stages_and_counts() -> None:
    f = fattree(2, 4)
    transport = EmulatedTransport(EmulatedFabric(f))
    try:
        mgr = FabricManager(transport)
        snap = await mgr.heavy_sweep()
    finally:
        await transport.close()
    p = mgr.progress
    assert p.stage == "" and p.ended == len(p.finished)
    stages = [e[2] for e in p.finished]
    assert stages[:2] == ["discover", "election"] and "program" in stages
    by = {e[2]: e for e in p.finished}
    _, sweep, _, seconds, done, total, unit = by["discover"]
    assert (sweep, done, total, unit) == (1, f.n_nodes, 0, "nodes") and seconds > 0
    _, _, _, _, done, total, unit = by["program"]
    assert done == total == snap.program.blocks_sent > 0 and unit == "LFT blocks"


def test_progress_counts_a_batch_on_the_wire_by_its_answers() -> None:
    stats = TransportStats()
    p = SweepProgress(stats)
    p.begin(2, "program")
    stats.received = 500  # PortInfo Sets before the blocks
    p.expect(100, "LFT blocks")
    assert (p.done, p.total, p.live()) == (0, 100, 0)
    stats.received += 40
    assert p.live() == 40 and p.done == 0
    stats.received += 400  # other SMPs of the stage share the counter: never beyond the total
    assert p.live() == 100
    p.advance(100)
    assert p.live() == 100 and p.answers() == 0  # what follows counts from here
    stats.received += 7
    assert p.answers() == 7
    p.end()
    assert p.finished[-1][1:3] == (2, "program") and p.finished[-1][4:] == (100, 100, "LFT blocks")


# -- the lines -----------------------------------------------------------------------------------------------


def test_lines_say_count_rate_and_time_left() -> None:
    clock = Clock()
    p = SweepProgress(TransportStats())
    p.begin(1, "discover")
    p.started = 0.0
    p.advance(250, "nodes")
    clock.t = 0.5
    assert running_line(p, clock.t) == "sweep 1 discover: 250 nodes found (500/s), 0.50 s"
    p.begin(1, "program")
    p.started = p.since = 0.0
    p.expect(1000, "LFT blocks")
    p.since = 1.0
    assert p.stats is not None
    p.stats.received += 250
    assert running_line(p, 2.0) == "sweep 1 program: LFT blocks ~250/1,000 (250/s, 3.00 s left)"
    p.advance(1000)
    p.stats.received += 12
    assert running_line(p, 5.0) == "sweep 1 program: LFT blocks 1,000/1,000 done; then 12 SMPs answered (port " \
        "states), 5.00 s"
    assert finished_line((3, 1, "program", 4.0, 1000, 1000, "LFT blocks")) == \
        "sweep 1 program: 1,000/1,000 LFT blocks in 4.00 s (250/s)"
    assert finished_line((1, 1, "discover", 0.5, 250, 0, "nodes")) == "sweep 1 discover: 250 nodes in 0.50 s (500/s)"
    assert finished_line((2, 1, "lids", 0.004, 0, 0, "")) == "sweep 1 lids: 0.00 s"


def test_one_rewritten_line_per_stage_and_log_lines_around_it() -> None:
    tty = FakeTty()
    clock = Clock()
    p = SweepProgress(TransportStats())
    d = ProgressDisplay(tty, clock=clock)
    d.watch(p)
    p.begin(1, "discover")
    p.started = 0.0
    p.advance(10, "nodes")
    clock.t = 1.0
    d.poll()
    p.advance(10)
    d.poll()
    assert tty.getvalue() == CLEAR + "sweep 1 discover: 10 nodes found (10/s), 1.00 s" + \
        CLEAR + "sweep 1 discover: 20 nodes found (20/s), 1.00 s"
    d.write("2026-12-02 INFO a log line\n")  # the progress line goes, the log line, the progress line again
    assert tty.getvalue().endswith(CLEAR + "2026-12-02 INFO a log line\n" + "sweep 1 discover: 20 nodes found "
                                   "(20/s), 1.00 s")
    p.end()
    p.begin(1, "lids")
    p.end()  # a stage that ended between two looks still gets its line
    p.begin(1, "links")
    d.poll()
    lines = screen(tty.getvalue())
    assert lines[0] == "2026-12-02 INFO a log line"
    assert lines[1].startswith("sweep 1 discover: 20 nodes in ")
    assert lines[2].startswith("sweep 1 lids: ")
    assert lines[3].startswith("sweep 1 links: ")  # running: no newline yet
    d.stop()
    assert screen(tty.getvalue())[-1] == ""  # the running line taken away


def test_the_display_stops_when_told() -> None:
    tty = FakeTty()
    p = SweepProgress()
    d = ProgressDisplay(tty)
    done = [False]
    d.watch(p, until=lambda: done[0])
    p.begin(1, "discover")
    assert d.poll()
    done[0] = True
    assert not d.poll()
    assert screen(tty.getvalue())[-1] == ""


def test_shown_only_on_a_terminal_and_not_quiet() -> None:
    assert wanted(False, FakeTty())
    assert not wanted(True, FakeTty())
    assert not wanted(False, io.StringIO())
    with showing(SweepProgress(), enabled=False) as d:
        assert d is None


# -- ibfm sm ---------------------------------------------------------------------------------------------------


def test_ibfm_sm_on_a_terminal_shows_each_stage(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    tty = FakeTty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["sm", "--topology", str(FIXTURE)]) == 0
    assert sys.stderr is tty
    lines = [x for x in screen(tty.getvalue()) if x]
    assert lines[0].startswith("sweep 1 discover: 14 nodes in ")
    assert any(x.startswith("sweep 1 program: 6/6 LFT blocks in ") for x in lines)
    assert [x.split(":")[0] for x in lines][:2] == ["sweep 1 discover", "sweep 1 election"]
    assert "subnet UP" in capsys.readouterr().out  # the summary on stdout, untouched


def test_ibfm_sm_quiet_or_not_a_terminal_shows_nothing(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    tty = FakeTty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["sm", "--topology", str(FIXTURE), "--quiet"]) == 0
    assert tty.getvalue() == ""
    monkeypatch.undo()
    assert main(["sm", "--topology", str(FIXTURE)]) == 0
    assert capsys.readouterr().err == ""


# -- ibfm serve's first bring-up, on a pseudo-terminal --------------------------------------------------------


def _serve_on_a_pty(*flags: str) -> str:
    """Run ``ibfm serve`` with stderr on a pseudo-terminal until its first sweep is done; what the terminal got."""
    import os
    import pty
    import select
    import signal
    import subprocess
    import time

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("IBFM_")}
    env["PYTHONPATH"] = str(root)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ibfm", "serve", "--listen", "127.0.0.1:0", "--topology", str(FIXTURE), *flags],
        cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave,
    )
    os.close(slave)
    got = b""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if b"sweep_done" in got:
                deadline = min(deadline, time.monotonic() + 0.5)  # and what the display writes after it
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    got += os.read(master, 65536)
                except OSError:
                    break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(master)
    text = got.decode()
    assert "sweep_done" in text, text
    return text


def test_ibfm_serve_on_a_terminal_shows_the_first_bring_up() -> None:
    text = _serve_on_a_pty()
    lines = [x for x in screen(text.replace("\r\n", "\n")) if x]
    stages = [x for x in lines if x.startswith("sweep 1 ")]
    assert stages[0].startswith("sweep 1 discover: 14 nodes in ")
    assert any(x.startswith("sweep 1 program: 6/6 LFT blocks in ") for x in stages)
    assert any("listening on http://127.0.0.1:" in x for x in lines)  # log lines keep their own lines
    assert all(x.startswith("sweep 1 ") or " INFO " in x or " WARNING " in x for x in lines), lines


def test_ibfm_serve_quiet_shows_no_progress() -> None:
    text = _serve_on_a_pty("--quiet")
    assert "sweep 1 discover" not in text and "\x1b[K" not in text and "listening on" in text
