"""The ``ibfm`` command line: one subcommand module each under ibfm/commands.

Every module exposes ``register(subparsers)``, which adds its parser and
sets ``func`` to a callable taking the parsed namespace and returning the
exit status. Errors derived from IbfmError print as one line, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from fabric.errors import IbfmError

COMMAND_MODULES = [
    "ibfm.commands.topo",
    "ibfm.commands.sm",
    "ibfm.commands.demo",
    "ibfm.commands.congestion",
    "ibfm.commands.serve",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ibfm", description="InfiniBand fabric manager and monitor")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except IbfmError as e:
        print(f"ibfm: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file we were told to read or write
        print(f"ibfm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
