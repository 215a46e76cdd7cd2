"""Shared test helpers: a test whose precondition is missing skips, but fails under CI."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest

from fabric.ibsim import missing_ibsim_tools

_TRUE = frozenset({"true", "1", "yes"})


def under_ci() -> bool:
    """Whether the suite runs under CI: ``CI`` is ``true``, ``1`` or ``yes`` (any case); ``CI=false`` is not CI."""
    return os.environ.get("CI", "").strip().lower() in _TRUE


def missing_precondition(reason: str, ci_hint: str) -> NoReturn:
    """Skip the test for ``reason``; under CI fail it instead, since CI provides every precondition."""
    if under_ci():
        pytest.fail(f"{reason} (CI is set: {ci_hint})")
    pytest.skip(reason)


def need(what: str, present: bool) -> None:
    """Skip when ``what`` is missing, except under CI, where that is a failure."""
    if not present:
        missing_precondition(f"{what} is not installed", "make test installs it")


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


def need_all(missing: list[str]) -> None:
    """Skip naming what ``missing`` lists (tools, files), unless it is empty; under CI that is a failure."""
    if missing:
        missing_precondition(f"missing: {', '.join(missing)}", "make test installs it")


def need_ibsim(*tools: str) -> None:
    """Skip unless ibsim, libumad2sim and ``tools`` (default ibnetdiscover) are installed.

    Under CI (see :func:`under_ci`) a missing tool fails the test instead.
    """
    need_all(missing_ibsim_tools(*tools))


@pytest.fixture
def ibsim_tools() -> None:
    """Request this fixture in an ``@pytest.mark.ibsim`` test that runs ibsim and ibnetdiscover."""
    need_ibsim()
