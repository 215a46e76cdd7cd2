"""``ibfm serve``: the daemon (SM sweeps, PerfManager, HTTP API, /metrics) until SIGTERM."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ibfm.settings import FLAGS, Settings, load_settings

_REPEATABLE = {"sm.root_guids"}
_SWITCHES = {"sm.qos"}
"""Boolean settings whose flag takes no value (``--qos`` turns it on)."""


def _help(dotted: str) -> str:
    section, _, key = dotted.rpartition(".")
    model: Any = Settings
    if section:
        model = Settings.model_fields[section].annotation
    text = model.model_fields[key].description or ""
    return text.replace("%", "%%")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the fabric manager daemon: sweeps, counters, HTTP API and /metrics",
        description="Settings come from flags, then IBFM_* environment variables, then the --config TOML file "
        "(see docs/settings.md).",
    )
    p.add_argument("--config", metavar="FILE", help="TOML settings file (default: $IBFM_CONFIG, if set)")
    for dotted, flag in FLAGS.items():
        dest = dotted.replace(".", "__")
        if dotted in _SWITCHES:
            p.add_argument(flag, dest=dest, action="store_const", const="true", default=argparse.SUPPRESS,
                           help=_help(dotted))
        elif dotted in _REPEATABLE:
            p.add_argument(flag, dest=dest, action="append", default=argparse.SUPPRESS, help=_help(dotted) +
                           " Repeatable.")
        else:
            p.add_argument(flag, dest=dest, default=argparse.SUPPRESS, help=_help(dotted))
    p.add_argument("--print-settings", action="store_true",
                   help="print the effective settings as JSON (the token hidden) and exit")
    p.add_argument("--quiet", action="store_true",
                   help="no progress line per stage of the first bring-up on stderr (shown only on a terminal)")
    p.set_defaults(func=cmd_serve)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given on the command line, by dotted setting name."""
    out: dict[str, Any] = {}
    for dotted in FLAGS:
        dest = dotted.replace(".", "__")
        if hasattr(args, dest):
            v = getattr(args, dest)
            out[dotted] = ",".join(v) if isinstance(v, list) else v
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load_settings(args.config, flags_from_args(args))
    if args.print_settings:
        print(json.dumps(settings.public_dict(), indent=2))
        return 0
    from ibfm.progress import wanted

    if not wanted(args.quiet):
        from ibfm.service import run_service

        return run_service(settings)
    return _serve_showing_progress(settings)


def _serve_showing_progress(settings: Settings) -> int:
    """``ibfm.service.run_service``, with each stage of the first bring-up drawn on stderr (log lines are
    written around the progress line)."""
    from ibfm.progress import ProgressDisplay, showing
    from ibfm.service import Service, run_service

    with showing(None, enabled=True) as display:
        assert isinstance(display, ProgressDisplay)

        def watch(service: Service) -> None:
            manager = service.manager
            display.watch(manager.progress, until=lambda: manager.snapshot is not None)

        return run_service(settings, on_service=watch)
