"""Shared test helpers: ibsim tests skip when the tools are missing, but fail under CI."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fabric.ibsim import missing_ibsim_tools


def need(what: str, present: bool) -> None:
    """Skip when ``what`` is missing, except under CI (``CI`` set), where that is a failure."""
    if present:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} is not installed (CI is set: make test installs it)")
    pytest.skip(f"{what} is not installed")


def need_tool(name: str, *also: str) -> str:
    """The path of command ``name`` (or of the first of ``also`` that exists), as :func:`need` rules."""
    path = shutil.which(name) or next((p for p in also if Path(p).exists()), None)
    need(name, path is not None)
    assert path is not None
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[Any], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; reaps the process."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def need_ibsim(*tools: str) -> None:
    """Skip unless ibsim, libumad2sim and ``tools`` (default ibnetdiscover) are installed.

    Under CI (the ``CI`` environment variable set) a missing tool fails the test instead.
    """
    missing = missing_ibsim_tools(*tools)
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"ibsim test under CI but missing: {', '.join(missing)}")
        pytest.skip(f"missing: {', '.join(missing)}")


@pytest.fixture
def ibsim_tools() -> None:
    """Request this fixture in an ``@pytest.mark.ibsim`` test that runs ibsim and ibnetdiscover."""
    need_ibsim()
