"""Progress of a heavy sweep on a terminal: one line per stage, rewritten in place about 5 times a second.

The sweep only counts (:class:`~sm.sweep.manager.SweepProgress`: the stage, nodes found, LFT blocks sent);
:class:`ProgressDisplay` polls those counters from a thread of its own, so a stage that keeps the event loop
busy does not freeze the line. Each stage gets a line; when it ends the line is written once more with its
final figures and left behind. Anything else written to stderr meanwhile (log records) goes through
:meth:`ProgressDisplay.write`, which takes the progress line away, writes, and draws it again.

Shown only on a terminal (:func:`wanted`), never with ``--quiet``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TextIO

INTERVAL_S = 0.2
"""Seconds between two looks at the counters."""
_CLEAR = "\r\x1b[K"
"""Carriage return, erase to the end of the line."""


class Progress(Protocol):
    """What the display reads (:class:`~sm.sweep.manager.SweepProgress` has it)."""

    sweep: int
    stage: str
    started: float
    since: float
    unit: str
    done: int
    total: int
    finished: list[tuple[int, int, str, float, int, int, str]]

    def answers(self) -> int: ...

    def live(self) -> int: ...


def wanted(quiet: bool, stream: Any = None) -> bool:
    """Whether to show progress: not ``--quiet``, and the stream (stderr) is a terminal."""
    s = sys.stderr if stream is None else stream
    try:
        return not quiet and bool(s.isatty())
    except (AttributeError, ValueError):  # closed, or not a file
        return False


def _count(n: int) -> str:
    return f"{n:,}"


def _seconds(s: float) -> str:
    if s < 10:
        return f"{s:.2f} s"
    if s < 120:
        return f"{s:.0f} s"
    return f"{s // 60:.0f} min {s % 60:02.0f} s"


def running_line(p: Progress, now: float) -> str:
    """The line of the stage running: what is done so far, the rate, and the time left when the total is known."""
    elapsed = max(now - p.started, 1e-9)
    head = f"sweep {p.sweep} {p.stage}:"
    if p.total and p.done >= p.total:  # the counted items are done: what the stage does after them
        answered = p.answers()
        after = f"; then {_count(answered)} SMPs answered (port states)" if answered else ""
        return f"{head} {p.unit} {_count(p.done)}/{_count(p.total)} done{after}, {_seconds(elapsed)}"
    done = p.live()
    if p.total:
        # A batch on the wire is counted by the stage's answers so far: "~", other SMPs share them.
        about = "~" if done > p.done else ""
        if about and done >= p.total:
            return f"{head} {p.unit} ~{_count(done)}/{_count(p.total)} (the last answers), {_seconds(elapsed)}"
        rate = done / max(now - p.since, 1e-9)
        left = f", {_seconds((p.total - done) / rate)} left" if rate > 0 else ""
        return f"{head} {p.unit} {about}{_count(done)}/{_count(p.total)} ({_count(round(rate))}/s{left})"
    if p.unit:
        answered = p.answers()
        smps = f", {_count(answered)} SMPs answered" if answered else ""
        return f"{head} {_count(done)} {p.unit} found ({_count(round(done / elapsed))}/s{smps}), {_seconds(elapsed)}"
    return f"{head} {_seconds(elapsed)}"


def finished_line(entry: tuple[int, int, str, float, int, int, str]) -> str:
    """The line a stage leaves behind."""
    _, sweep, stage, seconds, done, total, unit = entry
    head = f"sweep {sweep} {stage}:"
    rate = f" ({_count(round(done / seconds))}/s)" if seconds > 0 and done else ""
    if total:
        return f"{head} {_count(done)}/{_count(total)} {unit} in {_seconds(seconds)}{rate}"
    if unit:
        return f"{head} {_count(done)} {unit} in {_seconds(seconds)}{rate}"
    return f"{head} {_seconds(seconds)}"


class ProgressDisplay:
    """Draws a :class:`Progress` on ``stream``, one rewritten line per stage; also a stream for other text."""

    def __init__(self, stream: TextIO, *, interval: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.stream = stream
        self.interval = interval
        self.clock = clock
        self._lock = threading.RLock()
        self._shown = ""
        """The progress line on the screen now ("" when none)."""
        self._progress: Progress | None = None
        self._seen = 0
        """The number of the last ended stage written."""
        self._until: Callable[[], bool] = lambda: False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- as a stream (stderr's stand-in while the display runs)

    def write(self, text: str) -> int:
        with self._lock:
            if self._progress is not None and not self._stop.is_set():
                self._write_finished(self._progress)  # the stages ended before this text, above it
            if self._shown:
                self.stream.write(_CLEAR)
            n = self.stream.write(text)
            if self._shown and text.endswith("\n"):
                self.stream.write(self._shown)
            elif self._shown:
                self._shown = ""  # the text took the line: drawn again at the next look
            self.stream.flush()
            return n

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return bool(self.stream.isatty())

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8")

    # -- drawing

    def watch(self, progress: Progress, until: Callable[[], bool] = lambda: False) -> None:
        """Draw ``progress`` from now on (its stages ended before are not shown) until ``until()`` is true."""
        with self._lock:
            self._progress = progress
            self._seen = progress.finished[-1][0] if progress.finished else 0
            self._until = until

    def poll(self) -> bool:
        """One look: write the stages that ended, draw the one running. False once ``until()`` holds."""
        p = self._progress
        if p is None:
            return True
        with self._lock:
            self._write_finished(p)
            over = self._until()
            stage = p.stage
            line = running_line(p, self.clock()) if stage and not over else ""
            if line != self._shown:
                self.stream.write(_CLEAR + line)
                self._shown = line
            self.stream.flush()
            return not over

    def _write_finished(self, p: Progress) -> None:
        for entry in p.finished:  # (a new list each time a stage ends: read whole)
            if entry[0] > self._seen:
                self._put(finished_line(entry) + "\n")
                self._seen = entry[0]

    def _put(self, text: str) -> None:
        if self._shown:
            self.stream.write(_CLEAR)
            self._shown = ""
        self.stream.write(text)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.poll():
                    break
            except (OSError, ValueError):  # the terminal went away: show nothing more
                break
            self._stop.wait(self.interval)
        self._take_line_away()

    def _take_line_away(self) -> None:
        with self._lock, contextlib.suppress(OSError, ValueError):
            if self._shown:
                self.stream.write(_CLEAR)
                self._shown = ""
                self.stream.flush()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ibfm-progress", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop drawing: the stages that ended are written, the running line is taken away."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with contextlib.suppress(OSError, ValueError):
            p = self._progress
            if p is not None:
                with self._lock:
                    self._write_finished(p)
        self._take_line_away()


@contextlib.contextmanager
def showing(
    progress: Progress | None, *, enabled: bool, until: Callable[[], bool] = lambda: False
) -> Iterator[ProgressDisplay | None]:
    """Show ``progress`` on stderr while the block runs, if ``enabled`` (see :func:`wanted`); stderr is the
    display meanwhile, so warnings written to it do not break the line. Nothing at all when not enabled."""
    if not enabled:
        yield None
        return
    real = sys.stderr
    display = ProgressDisplay(real)
    if progress is not None:
        display.watch(progress, until)
    sys.stderr = display  # type: ignore[assignment]
    display.start()
    try:
        yield display
    finally:
        display.stop()
        if sys.stderr is display:
            sys.stderr = real
