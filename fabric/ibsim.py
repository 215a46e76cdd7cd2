"""Run ibsim (the linux-rdma fabric simulator) beside tests and scripts.

``ibsim -s NETFILE`` simulates the fabric a net file describes; a tool run
with ``libumad2sim.so`` preloaded and the same ``IBSIM_SOCKNAME`` talks MADs
to it instead of ``/dev/infiniband/umad*``. :class:`IbsimProcess` starts one
simulator per unique socket name, waits for its ``sim>`` console prompt,
sends console commands (``Link``, ``Unlink``, ``Baselid``, ...) and always
stops it by PID (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from types import TracebackType

from fabric.errors import IbfmError

LIBUMAD2SIM_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so",
    "/usr/lib/aarch64-linux-gnu/umad2sim/libumad2sim.so",
    "/usr/lib64/umad2sim/libumad2sim.so",
    "/usr/lib/umad2sim/libumad2sim.so",
    "/usr/local/lib/umad2sim/libumad2sim.so",
)

PROMPT = b"sim> "


class IbsimError(IbfmError):
    """ibsim did not start, died, or did not answer on its console."""


def find_libumad2sim() -> str | None:
    """Path of the umad2sim preload library, or None if not installed."""
    env = os.environ.get("IBFM_LIBUMAD2SIM")
    if env and os.path.exists(env):
        return env
    for p in LIBUMAD2SIM_CANDIDATES:
        if os.path.exists(p):
            return p
    return None


def missing_ibsim_tools(*tools: str) -> list[str]:
    """What is missing of ibsim, libumad2sim and the named diag tools (default ibnetdiscover)."""
    needed = tools or ("ibnetdiscover",)
    missing = [] if shutil.which("ibsim") else ["ibsim"]
    if find_libumad2sim() is None:
        missing.append("libumad2sim.so")
    missing += [t for t in needed if shutil.which(t) is None]
    return missing


def ibsim_available(*tools: str) -> bool:
    """True when ibsim, libumad2sim and the named diag tools (default ibnetdiscover) are installed."""
    return not missing_ibsim_tools(*tools)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the starting thread dies, so no ibsim outlives a killed run."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class IbsimProcess:
    """One ``ibsim -s NETFILE`` process with its own socket name.

    Use as a context manager; tools run with :meth:`env` (or :meth:`run`)
    attach to this simulator only.
    """

    def __init__(
        self,
        netfile: str | os.PathLike[str],
        *,
        extra_args: Sequence[str] = (),
        sockname: str | None = None,
        start_timeout: float = 20.0,
    ) -> None:
        self.netfile = os.fspath(netfile)
        self.extra_args = tuple(extra_args)
        self.sockname = sockname or f"ibfm{os.getpid()}-{uuid.uuid4().hex[:10]}"
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None
        self._eof = False

    # -- lifetime ------------------------------------------------------------

    def start(self) -> IbsimProcess:
        """Start ibsim and wait for its first console prompt."""
        if self._proc is not None:
            raise IbsimError("ibsim already started")
        exe = shutil.which("ibsim")
        if exe is None:
            raise IbsimError("ibsim not found on PATH")
        if not os.path.exists(self.netfile):
            raise IbsimError(f"{self.netfile}: no such net file")
        env = dict(os.environ, IBSIM_SOCKNAME=self.sockname)
        env.pop("LD_PRELOAD", None)
        self._proc = subprocess.Popen(
            [exe, *self.extra_args, "-s", self.netfile],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._reader = threading.Thread(target=self._read_loop, name="ibsim-reader", daemon=True)
        self._reader.start()
        try:
            self._wait_prompt(0, self.start_timeout)
        except IbsimError:
            self.stop()
            raise
        return self

    def _read_loop(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            with self._cond:
                if not chunk:
                    self._eof = True
                    self._cond.notify_all()
                    return
                self._buf += chunk
                self._cond.notify_all()

    def _wait_prompt(self, start: int, timeout: float) -> int:
        """Wait for a prompt at or after byte ``start``; returns its offset."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                i = self._buf.find(PROMPT, start)
                if i >= 0:
                    return i
                if self._eof:
                    raise IbsimError(f"ibsim on {self.netfile} exited: {self.output()[-2000:].strip()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise IbsimError(f"ibsim on {self.netfile}: no console prompt within {timeout:.0f} s")
                self._cond.wait(left)

    def stop(self, grace: float = 2.0) -> int | None:
        """Stop ibsim by PID: SIGTERM, then SIGKILL after ``grace`` seconds. Returns its exit status."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(grace)
            except ProcessLookupError:
                pass
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if self._reader is not None:
            self._reader.join(grace)
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> IbsimProcess:
        return self.start()

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- console and clients ---------------------------------------------------

    def output(self) -> str:
        """Everything ibsim printed so far (console and warnings)."""
        with self._cond:
            return self._buf.decode("utf-8", "replace")

    def command(self, line: str, *, timeout: float = 10.0) -> str:
        """Send one console command; returns what ibsim printed before its next prompt."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.poll() is not None:
            raise IbsimError("ibsim is not running")
        with self._cond:
            start = len(self._buf)
        try:
            proc.stdin.write(line.rstrip("\n").encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            raise IbsimError(f"ibsim died before command {line!r}") from None
        end = self._wait_prompt(start, timeout)
        with self._cond:
            return self._buf[start:end].decode("utf-8", "replace")

    def drop_mads(self, nodes: Iterable[str], percent: int) -> None:
        """MADs dropped at each of ``nodes`` (node names), ``percent`` of them per hop (0 stops it)."""
        for name in nodes:
            self.command(f'Error "{name}" {percent}')

    def env(self, *, sim_host: str | None = None) -> dict[str, str]:
        """Environment for a child tool: LD_PRELOAD=libumad2sim.so and this IBSIM_SOCKNAME.

        ``sim_host`` attaches the tool at that node id (ibsim's SIM_HOST); the
        default is the first node of the net file.
        """
        lib = find_libumad2sim()
        if lib is None:
            raise IbsimError("libumad2sim.so not found")
        env = dict(os.environ, IBSIM_SOCKNAME=self.sockname, LD_PRELOAD=lib)
        if sim_host is not None:
            env["SIM_HOST"] = sim_host
        else:
            env.pop("SIM_HOST", None)
        return env

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        sim_host: str | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run a libibumad tool (``ibnetdiscover``, ``smpquery`` ...) attached to this ibsim."""
        if not self.alive():
            raise IbsimError("ibsim is not running")
        try:
            cp = subprocess.run(
                list(argv),
                env=self.env(sim_host=sim_host),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise IbsimError(f"{argv[0]} timed out after {timeout:.0f} s against ibsim") from None
        if check and cp.returncode != 0:
            raise IbsimError(f"{' '.join(argv)} exited {cp.returncode}: {cp.stderr.strip()[-2000:]}")
        return cp


def ibsim_size_args(n_nodes: int, n_switches: int, n_ports: int) -> list[str]:
    """``-N -S -P`` arguments raising ibsim's table limits (defaults 2048 nodes,
    256 switches, 13312 ports) enough for a fabric of this size."""
    return [
        "-N",
        str(max(2048, n_nodes + 16)),
        "-S",
        str(max(256, n_switches + 16)),
        "-P",
        str(max(13312, n_ports + 64)),
    ]
