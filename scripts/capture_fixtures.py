#!/usr/bin/env python3
"""Capture real ``ibnetdiscover`` output for the small net-file fixtures.

For each ``fixtures/small/<name>.net`` this starts ``ibsim -s`` on it (a
unique IBSIM_SOCKNAME each, stopped by PID), runs ``ibnetdiscover`` with
libumad2sim preloaded, and saves what it prints as
``fixtures/ibnetdiscover/<name>.txt``. The tests parse those files and
compare them with the fabric read from the net file ibsim was given.

    python scripts/capture_fixtures.py [NAME ...]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabric.errors import IbfmError  # noqa: E402
from fabric.fileio import write_text_atomic  # noqa: E402
from fabric.formats.netfile import read_net  # noqa: E402
from fabric.ibsim import IbsimProcess, ibsim_available  # noqa: E402

SMALL = ROOT / "fixtures" / "small"
OUT = ROOT / "fixtures" / "ibnetdiscover"


def capture(netfile: Path, out_dir: Path = OUT) -> Path:
    """Run ibsim on ``netfile`` and save ibnetdiscover's output; returns the written path."""
    fabric = read_net(netfile)  # refuse to capture a file we cannot read ourselves
    with IbsimProcess(netfile) as sim:
        cp = sim.run(["ibnetdiscover"], timeout=60)
    if not cp.stdout.strip():
        raise IbfmError(f"{netfile}: ibnetdiscover printed nothing ({cp.stderr.strip()})")
    dest = out_dir / f"{netfile.stem}.txt"
    write_text_atomic(dest, cp.stdout)
    os.chmod(dest, 0o644)  # a fixture to commit, readable by all
    s = fabric.summary()
    print(f"{dest.relative_to(ROOT)}: {s['switches']} switches, {s['cas']} CAs, {s['links']} links")
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="fixture names (default: every fixtures/small/*.net)")
    args = ap.parse_args(argv)
    if not ibsim_available("ibnetdiscover"):
        print("capture_fixtures: ibsim, libumad2sim.so or ibnetdiscover missing", file=sys.stderr)
        return 1
    files = [SMALL / f"{n.removesuffix('.net')}.net" for n in args.names] or sorted(SMALL.glob("*.net"))
    try:
        for f in files:
            capture(f)
    except IbfmError as e:
        print(f"capture_fixtures: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
