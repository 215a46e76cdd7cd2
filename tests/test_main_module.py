"""``python -m ibfm`` is the ``ibfm`` console script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(sys.executable).parent / "ibfm"
"""The console script pip installed beside this interpreter (``make`` installs the package editable)."""


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("IBFM_")}
    env["COLUMNS"] = "100"  # argparse wraps help to the terminal
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_console_script_is_cli_main() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"ibfm": "ibfm.cli:main"}  # what ibfm/__main__.py runs


@pytest.mark.parametrize("args", [["--help"], ["serve", "--help"], ["bogus"]])
def test_python_m_ibfm_is_the_console_script(args: list[str]) -> None:
    if not SCRIPT.exists():
        pytest.skip(f"no console script at {SCRIPT}: the package is not installed in this environment")
    module = run([sys.executable, "-m", "ibfm", *args])
    script = run([str(SCRIPT), *args])
    assert (module.returncode, module.stdout, module.stderr) == (script.returncode, script.stdout, script.stderr)
    if args == ["--help"]:
        assert module.returncode == 0 and module.stdout.startswith("usage: ibfm ")
    if args == ["bogus"]:
        assert module.returncode == 2 and module.stderr.startswith("usage: ibfm ")


def test_python_m_ibfm_runs_a_command() -> None:
    cp = run([sys.executable, "-m", "ibfm", "serve", "--print-settings", "--lmc", "1"])
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["sm"]["lmc"] == 1
    if SCRIPT.exists():
        assert run([str(SCRIPT), "serve", "--print-settings", "--lmc", "1"]).stdout == cp.stdout
