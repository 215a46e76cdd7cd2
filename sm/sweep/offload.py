"""The CPU-heavy stages of a sweep (routing, verification, credit loops) in a forked child.

Why a process: every MAD's round trip needs the interpreter lock in the
umad receive thread, and a CPU-bound Python thread beside it keeps the lock
for up to the switch interval (5 ms) each time it is asked for it. Routing
in a thread while SMPs are in flight stalls them: measured over ibsim, a
0.3 s bring-up of a 432-host tree took 50 s with one busy thread beside it.
A forked child has its own interpreter: it routes on the other core while
the parent configures ports, and verifies while the parent pushes the LFT
blocks and activates the ports.

``fork`` gives the child the fabric as it is at that instant without
copying or pickling it in; only results travel back, each pickled down a
pipe as soon as it is ready (a numpy LFT goes as one buffer). The child
runs nothing but the given function: no event loop, no transport, no
logging handlers of the parent's; it leaves with ``os._exit``. Where fork
is missing or fails, the same function runs in a thread of this process:
its urgent results come out as they are made (the parent waits for them
before sending anything), and the rest only once the parent waits again
(no overlap then, and no stall either).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import struct
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from fabric.errors import IbfmError

Emit = Callable[[Any], None]
"""Hands one result to the parent, in order."""

CHILD_NICE = 10
"""Once its urgent results are out (``urgent``), the child computes the rest on whatever CPU the
MAD pipeline (the receive thread, and on ibsim the simulator) leaves: SCHED_IDLE, or this
niceness where that policy is missing. :meth:`Offload.hurry` lifts it when the parent waits."""

_LEN = struct.Struct("<Q")
_MAX_FD = 1 << 20
"""Above any descriptor this process may hold (os.closerange uses close_range where Linux has it)."""
_OK, _ERR, _END = 0, 1, 2


class _Abandoned(Exception):
    """An inline run told to stop: the parent closed without asking for the rest."""


class OffloadError(IbfmError):
    """The child died or sent what cannot be read; names what it was computing."""


class Offload:
    """Run ``work(emit)`` beside the event loop; :meth:`get` returns what it emits, in order.

    An exception raised by ``work`` is raised by the :meth:`get` that would
    have returned the next result. Use as an async context manager: leaving
    it kills a child still running and reaps it.
    """

    def __init__(
        self, work: Callable[[Emit], None], *, what: str = "sweep computation", fork: bool = True, urgent: int = 0
    ) -> None:
        """``urgent``: how many of the first results the parent waits on. The child computes those at
        the parent's priority and the rest on spare CPU only (see :data:`CHILD_NICE`); inline, the
        rest waits until the parent does."""
        self._work = work
        self.what = what
        self._want_fork = fork and hasattr(os, "fork")
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._pid: int | None = None
        self._reader: threading.Thread | None = None
        self._thread_task: asyncio.Future[None] | None = None
        self.forked = False
        self.child_status: int | None = None
        self._urgent = urgent
        self._got = 0
        self._closing = False
        self._go = threading.Event()
        """Set when the parent waits on the work (hurry, a get past the urgent results, close)."""
        self._final: BaseException | None = None
        """What every get() raises once the results are over (the work's exception, or too many gets)."""
        self._parent = 0

    async def __aenter__(self) -> Offload:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- starting -------------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._want_fork:
            try:
                self._start_fork(loop)
                return
            except OSError:  # no memory or no processes left for a child: compute here instead
                pass
        self._thread_task = loop.run_in_executor(None, self._run_inline, loop)

    def _start_fork(self, loop: asyncio.AbstractEventLoop) -> None:
        rfd, wfd = os.pipe()
        self._parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            os.close(rfd)
            os.close(wfd)
            raise
        if pid == 0:  # the child: compute, write, leave without running anything of the parent's
            os.close(rfd)
            code = 0
            try:
                self._child(wfd)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(wfd)
        self._pid = pid
        self.forked = True
        reader = threading.Thread(target=self._read_loop, args=(rfd, loop), name="offload-reader", daemon=True)
        try:
            reader.start()
        except RuntimeError as e:  # no thread to read with: end the child, compute here instead
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self._reap(block=True)
            os.close(rfd)
            self.forked = False
            raise OSError(f"no reader thread for the {self.what} child: {e}") from e
        self._reader = reader

    # -- the child ------------------------------------------------------------------------------

    def _child(self, wfd: int) -> None:
        # A stop (SIGTERM to the service's process group, ^C) is the parent's to handle: it lets the
        # sweep finish. The child ends by close()'s SIGKILL or with the parent (PR_SET_PDEATHSIG).
        with contextlib.suppress(ValueError, OSError):
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
        _die_with_parent()
        if os.getppid() != self._parent:  # the parent died before the line above
            raise SystemExit(1)
        # The parent's descriptors (sockets of HTTP and MQTT clients, the umad and issm devices) are
        # not the child's to hold: a connection the parent closes must end now, not when we exit.
        os.closerange(3, wfd)
        os.closerange(wfd + 1, _MAX_FD)

        def send(kind: int, value: Any) -> None:
            try:
                blob = pickle.dumps((kind, value), protocol=5)
                if kind == _ERR:
                    pickle.loads(blob)  # an exception whose class cannot be rebuilt from its args
            except Exception as e:
                if kind == _ERR:  # keep its words: the message names the place
                    value = OffloadError(f"{self.what}: {type(value).__name__}: {value}")
                else:
                    value = OffloadError(f"{self.what}: result cannot be sent back: {e!r}")
                blob = pickle.dumps((_ERR, value))
            _write_all(wfd, _LEN.pack(len(blob)) + blob)

        sent = 0

        def emit(value: Any) -> None:
            nonlocal sent
            send(_OK, value)
            sent += 1
            if sent == self._urgent:
                _background()

        if not self._urgent:
            _background()
        try:
            self._work(emit)
        except BaseException as e:  # the parent re-raises it, with where it came from
            e.add_note(f"in the {self.what} child process:\n{traceback.format_exc().rstrip()}")
            send(_ERR, e)
        send(_END, None)
        os.close(wfd)

    # -- the parent -----------------------------------------------------------------------------

    def _read_loop(self, rfd: int, loop: asyncio.AbstractEventLoop) -> None:
        """Reader thread: blocking reads (the lock is free meanwhile), one message at a time."""

        def put(item: tuple[int, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(self._queue.put_nowait, item)

        try:
            with os.fdopen(rfd, "rb", buffering=1 << 20) as pipe:
                while True:
                    head = pipe.read(_LEN.size)
                    if len(head) < _LEN.size:
                        put((_ERR, self._died()))
                        return
                    (size,) = _LEN.unpack(head)
                    blob = pipe.read(size)
                    if len(blob) < size:
                        put((_ERR, self._died()))
                        return
                    try:
                        item = pickle.loads(blob)
                    except Exception as e:
                        item = (_ERR, OffloadError(f"{self.what}: unreadable result from the child: {e!r}"))
                    put(item)
                    if item[0] != _OK:
                        return
        finally:
            self._reap(block=True)

    def _died(self) -> OffloadError:
        status = self._reap(block=True)
        if status is None:
            how = "ended"
        elif os.WIFSIGNALED(status):
            how = f"was killed by signal {os.WTERMSIG(status)}"
        else:
            how = f"exited with status {os.WEXITSTATUS(status)}"
        return OffloadError(f"{self.what}: the child process {how} before it was done")

    def _reap(self, *, block: bool) -> int | None:
        pid = self._pid
        if pid is None:
            return self.child_status
        try:
            got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            self._pid = None
            return self.child_status
        if got == pid:
            self._pid = None
            self.child_status = status
        return self.child_status

    def _run_inline(self, loop: asyncio.AbstractEventLoop) -> None:
        """The work in a thread of this process: each urgent result is handed out as it comes; then
        the thread waits until the parent waits (hurry, or a get for more), so its Python never runs
        beside MADs in flight (it would hold the interpreter lock their receive thread needs)."""

        def put(item: tuple[int, Any]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(self._queue.put_nowait, item)

        sent = 0

        def wait_for_parent() -> None:
            self._go.wait()
            if self._closing:  # nobody will ask for the rest
                raise _Abandoned

        def emit(value: Any) -> None:
            nonlocal sent
            put((_OK, value))
            sent += 1
            if sent >= self._urgent:
                wait_for_parent()

        try:
            if not self._urgent:
                wait_for_parent()
            self._work(emit)
        except _Abandoned:
            return
        except BaseException as e:  # re-raised by get()
            put((_ERR, e))
        put((_END, None))

    def hurry(self) -> None:
        """The parent now waits on the child: back to the parent's priority, where the system
        lets it (as root it does; otherwise the child goes on at its lowered priority)."""
        self._go.set()
        pid = self._pid
        if pid is None:
            return
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0))

    async def get(self, timeout: float | None = None) -> Any:
        """The next result; raises what the work raised instead of it (and so does every later call).

        After ``timeout`` seconds without it, the child is killed and OffloadError raised.
        """
        if self._final is not None:
            raise self._final
        if self._got >= self._urgent:
            self._go.set()  # the parent waits for more: an inline run may go on
        try:
            kind, value = await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            self._final = OffloadError(f"{self.what}: no result within {timeout:g} s; stopped")
            await self.close()
            raise self._final from None
        self._got += 1
        if kind == _OK:
            return value
        if kind == _END:
            self._final = OffloadError(f"{self.what}: asked for more results than the work gave")
        else:
            self._final = value
        raise self._final

    async def close(self) -> None:
        """Kill the child if it still runs and reap it; an inline run stops at its next result."""
        self._closing = True
        self._go.set()
        pid = self._pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reader = self._reader
        if reader is not None:
            deadline = time.monotonic() + 5.0
            pause = 0.0002  # the child is usually done: its last message is in
            while reader.is_alive() and time.monotonic() < deadline:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.01)
        self._reap(block=False)
        if self._thread_task is not None:
            with contextlib.suppress(Exception):
                await self._thread_task


def _background() -> None:
    """This process from now on: only on CPU that nothing else wants (SCHED_IDLE where Linux has it,
    else nice :data:`CHILD_NICE`)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(CHILD_NICE)


def _die_with_parent() -> None:
    """SIGKILL this child when the parent dies (Linux): it holds the parent's descriptors, the
    umad and issm devices among them, which no one else could take while it runs on."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
