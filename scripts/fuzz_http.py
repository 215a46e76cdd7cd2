"""Fuzz the HTTP API against its own OpenAPI document with schemathesis.

    .venv/bin/pip install schemathesis      # a measuring tool, not a test dependency
    .venv/bin/python scripts/fuzz_http.py [--max-examples N] [--seed S] [-- more `st run` options]

Serves :func:`exporters.http.app.create_app` on 127.0.0.1 (an ephemeral
port) over a swept emulated 2-level fat-tree (radix 8: 12 switches, 32
hosts, the fabric ``ibfm serve`` emulates by default, so the document's
examples name real nodes) with a write token, then runs ``st run`` on its
``/api/v1/openapi.json``: every phase, every check, positive and negative
data. Every request the document declares valid must be answered 2xx (404
for a name the fabric lacks, 409 for a request this fabric cannot serve),
every other one refused with 4xx, none with 5xx. The exit status is
schemathesis's; its summary gives the case counts.

Imported by ``st`` as its hooks module (``SCHEMATHESIS_HOOKS``, set by
:func:`main`), this registers the document's one custom string format,
``ibnetdiscover`` (the net file ``POST /api/v1/validation`` takes), as net
files of small generated fabrics, whole or in part: no JSON Schema keyword
can say what a net file is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402

from exporters.http.app import create_app  # noqa: E402
from exporters.http.common import ApiConfig  # noqa: E402
from exporters.http.openapi import NETFILE_FORMAT  # noqa: E402
from fabric.emulator import EmulatedFabric  # noqa: E402
from fabric.generate import fattree, ring  # noqa: E402
from sm.sweep.manager import FabricManager  # noqa: E402
from sm.transport.emulated import EmulatedTransport  # noqa: E402

TOKEN = "fuzz-token"
HOOKS = Path(__file__).stem


def register_formats() -> None:
    """Teach schemathesis the ``ibnetdiscover`` format: net files of small fabrics, whole or in part."""
    import schemathesis
    from hypothesis import strategies as st

    from fabric.formats.netfile import format_net

    fabrics = [fattree(2, 4), fattree(2, 8), ring(4, 2), ring(3, 1)]

    @st.composite
    def net_file(draw: st.DrawFn) -> str:
        f = draw(st.sampled_from(fabrics))
        if draw(st.booleans()):
            return format_net(f)
        keep = draw(st.lists(st.integers(0, f.n_nodes - 1), unique=True, max_size=f.n_nodes))
        return format_net(f.subset(sorted(keep)))

    schemathesis.openapi.format(NETFILE_FORMAT, net_file())


if os.environ.get("SCHEMATHESIS_HOOKS") == HOOKS:
    register_formats()


class Server:
    """The app on 127.0.0.1, served from a thread with its own event loop."""

    def __init__(self) -> None:
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Server:
        self._thread.start()
        if not self._ready.wait(120):
            raise RuntimeError("the app did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    async def _start(self) -> tuple[web.AppRunner, EmulatedTransport]:
        transport = EmulatedTransport(EmulatedFabric(fattree(2, 8)))
        manager = FabricManager(transport)
        await manager.heavy_sweep()
        runner = web.AppRunner(create_app(manager, ApiConfig(token=TOKEN)), handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.port = runner.addresses[0][1]
        return runner, transport

    def _run(self) -> None:
        runner, transport = self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.run_until_complete(transport.close())
        self._loop.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--max-examples", type=int, default=100, help="test cases per operation and phase (100)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("extra", nargs="*", help="more `st run` options, after --")
    args = ap.parse_args(argv)
    st_bin = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if st_bin is None:
        print("schemathesis is not installed: .venv/bin/pip install schemathesis", file=sys.stderr)
        return 2
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, SCHEMATHESIS_HOOKS=HOOKS, PYTHONPATH=path)
    with Server() as server, tempfile.TemporaryDirectory(prefix="ibfm-fuzz-") as scratch:
        cmd = [
            st_bin, "run", f"http://127.0.0.1:{server.port}/api/v1/openapi.json",
            "--checks", "all",
            "--header", f"Authorization: Bearer {TOKEN}",
            "--max-examples", str(args.max_examples),
            "--seed", str(args.seed),
            "--workers", "1",
            "--generation-database", "none",
            *args.extra,
        ]
        # in a scratch directory: st keeps a crash cache in its working directory
        return subprocess.run(cmd, env=env, cwd=scratch, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
