"""Generate the Grafana dashboards' JSON from their grafanalib sources.

Each ``dashboards/NAME.dashboard.py`` exports ``dashboard``; its JSON goes to
``dashboards/generated/NAME.json`` (what Grafana's file provisioning reads).

    python -m dashboards.build            write the JSON (and delete JSON no source makes)
    python -m dashboards.build --check    exit 1 if the JSON on disk differs from the sources
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard

from fabric.errors import IbfmError
from fabric.fileio import write_text_atomic

SOURCE_DIR = Path(__file__).resolve().parent
OUTPUT_DIR = SOURCE_DIR / "generated"
SUFFIX = ".dashboard.py"


class DashboardError(IbfmError):
    """A dashboard source that does not load or does not export a Dashboard."""


def sources(src: Path = SOURCE_DIR) -> list[Path]:
    """The ``*.dashboard.py`` files, sorted."""
    return sorted(src.glob(f"*{SUFFIX}"))


def load(path: Path) -> Dashboard:
    """Run one source and return its ``dashboard``."""
    name = "ibfm_dashboard_" + path.name.removesuffix(SUFFIX).replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise DashboardError(f"{path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dash = getattr(module, "dashboard", None)
    if not isinstance(dash, Dashboard):
        raise DashboardError(f"{path}: exports no grafanalib Dashboard named 'dashboard' (got {type(dash).__name__})")
    return dash


def to_json(dash: Dashboard) -> str:
    """The dashboard as Grafana reads it: sorted keys, two-space indent, final newline."""
    return json.dumps(dash.to_json_data(), sort_keys=True, indent=2, cls=DashboardEncoder) + "\n"


def generate(src: Path = SOURCE_DIR) -> dict[str, str]:
    """``NAME.json`` -> JSON text, for every source."""
    return {p.name.removesuffix(SUFFIX) + ".json": to_json(load(p)) for p in sources(src)}


def differences(src: Path = SOURCE_DIR, out: Path = OUTPUT_DIR) -> list[str]:
    """What is stale in ``out``: one line per file that differs, is missing or has no source."""
    want = generate(src)
    have = {p.name for p in out.glob("*.json")} if out.is_dir() else set()
    diff = []
    for name, text in want.items():
        path = out / name
        if name not in have:
            diff.append(f"{path}: missing")
        elif path.read_text() != text:
            diff.append(f"{path}: differs from {src / (name.removesuffix('.json') + SUFFIX)}")
    diff += [f"{out / name}: no source makes it" for name in sorted(have - want.keys())]
    return diff


def write(src: Path = SOURCE_DIR, out: Path = OUTPUT_DIR) -> list[Path]:
    """Write every dashboard's JSON (atomically), delete JSON without a source; returns the files written."""
    want = generate(src)
    written = []
    for name, text in want.items():
        path = out / name
        if not path.exists() or path.read_text() != text:
            write_text_atomic(path, text)
            path.chmod(0o644)  # Grafana reads it as another user
            written.append(path)
    for stale in out.glob("*.json"):
        if stale.name not in want:
            stale.unlink()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the generated JSON is stale")
    ap.add_argument("--src", type=Path, default=SOURCE_DIR, help="directory of the *.dashboard.py sources")
    ap.add_argument("--out", type=Path, default=OUTPUT_DIR, help="directory of the generated JSON")
    args = ap.parse_args(argv)
    try:
        if args.check:
            diff = differences(args.src, args.out)
            for line in diff:
                print(line, file=sys.stderr)
            if diff:
                print("run: python -m dashboards.build", file=sys.stderr)
                return 1
            print(f"{len(sources(args.src))} dashboards up to date in {args.out}")
            return 0
        written = write(args.src, args.out)
    except IbfmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for p in written:
        print(f"wrote {p}")
    print(f"{len(sources(args.src))} dashboards in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
