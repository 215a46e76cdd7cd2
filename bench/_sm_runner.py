"""ibfm's FabricManager as a daemon over libibumad, driven line by line (for ibsim tests and benches).

libumad2sim must be preloaded when the interpreter starts, so the SM runs
in a child process (``python bench/_sm_runner.py 'JSON config'``) started
with :meth:`IbsimProcess.env` at a host CA (``SIM_HOST``), as a real SM
sits. The child opens :class:`UmadTransport` with ``issm=True`` (ibsim sends
traps only to an IsSM client), runs :meth:`FabricManager.run` and writes
one JSON object per line to stdout:

- ``{"event": {...}}`` for every event (``sweep_done`` carries sweep
  number, kind, LFT blocks sent, SMPs, engine, Unix time);
- ``{"request": reason, "time": t}`` for every sweep request (``trap``);
- answers to stdin commands: ``status``, ``dump PATH`` (every LFT as
  ``ibroute`` prints it, written atomically) and ``quit``.

:class:`SmRunner` is the parent side: it starts the child, collects its
lines, sends commands, waits for a line that matches, and always stops the
child by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fabric.ibsim import IbsimProcess

REPO = Path(__file__).resolve().parent.parent
Line = dict[str, Any]


# -- parent side ------------------------------------------------------------------------------------------


class SmRunnerError(RuntimeError):
    """The SM child exited, or did not print what was waited for in time."""


class SmRunner:
    """One ibfm SM child attached to ``sim`` at ``sim_host``'s CA; lines it printed in ``lines``."""

    def __init__(
        self,
        sim: IbsimProcess,
        sim_host: str,
        work: Path,
        *,
        sweep_interval: float = 1.0,
        engines: Sequence[str] = ("ftree", "updn", "minhop"),
        window: int = 16,
        timeout: float = 0.2,
        retries: int = 3,
        trace: bool = False,
    ) -> None:
        self.sim = sim
        self.sim_host = sim_host
        self.work = work
        self.guid2lid = work / "guid2lid"
        self.config: Line = {
            "sweep_interval": sweep_interval,
            "engines": list(engines),
            "guid2lid": str(self.guid2lid),
            "window": window,
            "timeout": timeout,
            "retries": retries,
            "trace": trace,
        }
        self.lines: list[Line] = []
        self._proc: subprocess.Popen[str] | None = None
        self._cond = threading.Condition()
        self._eof = False
        self._reader: threading.Thread | None = None
        self._stderr: IO[str] | None = None

    def start(self) -> SmRunner:
        env = self.sim.env(sim_host=self.sim_host)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.work.mkdir(parents=True, exist_ok=True)
        self._stderr = open(self.work / "sm.stderr", "w")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), json.dumps(self.config)],
            env=env,
            cwd=self.work,  # libumad2sim builds its fake sysfs under ./sys-PID
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read_loop, name="sm-runner-reader", daemon=True)
        self._reader.start()
        return self

    def _read_loop(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            raw = raw.strip()
            if not raw.startswith("{"):
                continue
            with self._cond:
                self.lines.append(json.loads(raw))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def stderr(self) -> str:
        p = self.work / "sm.stderr"
        return p.read_text(errors="replace") if p.exists() else ""

    def wait_for(self, match: Callable[[Line], bool], *, start: int = 0, timeout: float = 30.0) -> tuple[int, Line]:
        """The first line at index >= ``start`` that ``match`` accepts: (index, line)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start
            while True:
                while i < len(self.lines):
                    if match(self.lines[i]):
                        return i, self.lines[i]
                    i += 1
                if self._eof:
                    raise SmRunnerError(f"SM child exited {self.returncode()}: {self.stderr()[-3000:]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SmRunnerError(
                        f"no matching line from the SM within {timeout:.0f} s; stderr:\n{self.stderr()[-3000:]}"
                    )
                self._cond.wait(left)

    def mark(self) -> int:
        """Index of the next line: wait_for(start=mark()) sees only what comes after now."""
        with self._cond:
            return len(self.lines)

    def command(self, line: str, *, timeout: float = 30.0) -> Line:
        """Send one stdin command; returns its answer line."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.poll() is not None:
            raise SmRunnerError(f"SM child not running: {self.stderr()[-2000:]}")
        start = self.mark()
        word = line.split()[0]
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return self.wait_for(lambda d: d.get("answer") == word, start=start, timeout=timeout)[1]

    def wait_sweep(self, *, start: int = 0, kind: str = "heavy", timeout: float = 60.0, up: bool | None = None) -> Line:
        """The next SweepDone event of ``kind`` (optionally with subnet_up == ``up``)."""

        def ok(d: Line) -> bool:
            ev = d.get("event", {})
            return (
                ev.get("type") == "sweep_done" and ev.get("kind") == kind and (up is None or ev.get("subnet_up") == up)
            )

        return self.wait_for(ok, start=start, timeout=timeout)[1]["event"]  # type: ignore[no-any-return]

    def events(self, kind: str, start: int = 0) -> list[Line]:
        with self._cond:
            return [d["event"] for d in self.lines[start:] if d.get("event", {}).get("type") == kind]

    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def stop(self, grace: float = 5.0) -> int | None:
        """``quit`` on stdin, then SIGTERM, then SIGKILL, by PID."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert proc.stdin is not None
                proc.stdin.write("quit\n")
                proc.stdin.flush()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(2.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(2.0)
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        if self._reader is not None:
            self._reader.join(2.0)
        if proc.stdout is not None:
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
        return proc.returncode

    def __enter__(self) -> SmRunner:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


# -- child side (runs with libumad2sim preloaded) ---------------------------------------------------------


def _emit(obj: Line) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _trace_batches() -> None:
    """Log every SMP batch of sweeps and programming to stderr: size, failures, time (diagnostics)."""
    import sm.sweep.discover
    import sm.sweep.light
    import sm.sweep.program
    import sm.transport.smp

    inner = sm.transport.smp.smp_batch

    async def traced(transport: Any, requests: list[Any]) -> list[Any]:
        t0, start = time.perf_counter(), time.time()
        out = await inner(transport, requests)
        bad = [str(a) for a in out if isinstance(a, Exception)]
        where = sys._getframe(1).f_code.co_name
        print(
            json.dumps(
                {
                    "batch": where,
                    "n": len(requests),
                    "failed": len(bad),
                    "first": bad[:3],
                    "s": round(time.perf_counter() - t0, 4),
                    "start": start,
                    "time": time.time(),
                }
            ),
            file=sys.stderr,
            flush=True,
        )
        return out

    for mod in (sm.sweep.discover, sm.sweep.program, sm.sweep.light):
        mod.smp_batch = traced  # type: ignore[attr-defined]


async def _serve(cfg: Line) -> int:
    from fabric.fileio import write_text_atomic
    from sm.analysis.dump import format_lfts
    from sm.sweep.manager import FabricManager, SmConfig
    from sm.transport.umad import UmadTransport

    class _Manager(FabricManager):
        def request_sweep(self, reason: str, *, heavy: bool = False) -> None:
            _emit({"request": reason, "time": time.time()})
            super().request_sweep(reason, heavy=heavy)

    transport = await UmadTransport.open(
        cfg.get("ca"),
        cfg.get("port"),
        window=int(cfg.get("window", 16)),
        timeout=float(cfg.get("timeout", 0.2)),
        retries=int(cfg.get("retries", 3)),
        issm=True,
    )
    config = SmConfig(
        engines=tuple(cfg.get("engines", ("ftree", "updn", "minhop"))),
        guid2lid=Path(cfg["guid2lid"]) if cfg.get("guid2lid") else None,
        sweep_interval=float(cfg.get("sweep_interval", 1.0)),
    )
    if cfg.get("trace"):
        _trace_batches()
    mgr = _Manager(transport, config)

    def sink(ev: Any) -> None:
        line: Line = {"event": ev.model_dump(mode="json")}
        s = mgr.snapshot
        if ev.type == "sweep_done" and ev.kind == "heavy" and s is not None:
            line["programmed_at"] = s.programmed_at  # LFTs and port states in the switches
        _emit(line)

    mgr.events.subscribe(sink)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    _emit({"started": True, "ca": transport.ca_name, "port": transport.port_num, "time": time.time()})

    def status() -> Line:
        s = mgr.snapshot
        st = transport.stats
        out: Line = {
            "answer": "status",
            "time": time.time(),
            "smps_total": st.sent,
            "timeouts": st.timeouts,
            "retries": st.retries,
            "unmatched": st.unmatched,
            "resent": st.resent,
            "refused": st.refused,
            "malformed": st.malformed,
        }
        if s is not None:
            out.update(
                sweep=s.sweep,
                engine=s.engine,
                up=s.up,
                blocks_sent=s.program.blocks_sent,
                smps=s.smps,
                max_lid=s.lids.max_lid,
                sm_lid=s.sm_lid,
                links=s.fabric.summary()["links"],
                programmed_at=s.programmed_at,
                unreachable=s.verify.unreachable,
                verify_failures=[str(x) for x in s.verify.failures[:5]],
                program_failures=s.program.failures[:5],
                discovery_errors=s.discovery.errors[:5],
            )
        return out

    lines: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:  # a daemon thread: a blocked readline never holds up the exit
        with contextlib.suppress(RuntimeError):  # the loop closed under us
            for raw in sys.stdin:
                loop.call_soon_threadsafe(lines.put_nowait, raw)
            loop.call_soon_threadsafe(lines.put_nowait, "")

    threading.Thread(target=read_stdin, name="sm-runner-stdin", daemon=True).start()

    async def console() -> None:
        while not stop.is_set():
            line = await lines.get()
            words = line.split()
            if not line or words[:1] == ["quit"]:
                stop.set()
                _emit({"answer": "quit"})
                return
            if not words:
                continue
            if words[0] == "status":
                _emit(status())
            elif words[0] == "dump" and len(words) == 2:
                s = mgr.snapshot
                if s is None:
                    _emit({"answer": "dump", "error": "no snapshot yet"})
                else:
                    write_text_atomic(Path(words[1]), format_lfts(s.fabric, s.lids, s.lft))
                    _emit({"answer": "dump", "path": words[1], "sweep": s.sweep})
            else:
                _emit({"answer": words[0], "error": f"unknown command {line.strip()!r}"})

    console_task = asyncio.create_task(console())
    try:
        await mgr.run(stop)
    finally:
        console_task.cancel()
        await transport.close()
    return 0


def main() -> int:
    cfg = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    return asyncio.run(_serve(cfg))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
