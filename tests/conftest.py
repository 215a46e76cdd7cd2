"""Shared test helpers: ibsim tests skip when the tools are missing, but fail under CI."""

from __future__ import annotations

import os

import pytest

from fabric.ibsim import missing_ibsim_tools


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
