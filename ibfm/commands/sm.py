"""``ibfm sm`` (run the SM once) and ``ibfm route`` (hops between two endpoints)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fabric.errors import IbfmError
from ibfm.commands._args import DEFAULT_CHAIN, engine_chain, number_in
from sm.analysis.dump import format_lfts
from sm.analysis.query import describe_route, format_route
from sm.partitions.config import load_partitions
from sm.qos.config import QosConfig
from sm.sa.services import serve_port
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot, SweepError
from sm.transport.base import TransportStats, WindowedTransport

M_KEY_ENV = "IBFM_SM__M_KEY"
"""Where ``--m-key`` is read from when the flag is absent (as ``ibfm serve`` reads ``sm.m_key``)."""


def _lmc(text: str) -> int:
    v = int(text)
    if not 0 <= v <= 2:
        raise argparse.ArgumentTypeError("LMC must be 0, 1 or 2")
    return v


def _priority(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"SM priority {text!r} is not an integer") from None
    if not 0 <= v <= 15:
        raise argparse.ArgumentTypeError(f"SM priority {v} outside 0..15")
    return v


def _guid(text: str) -> int:
    try:
        return int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad GUID {text!r}") from None


def _m_key(text: str) -> int:
    try:
        v = int(text.strip(), 0)
    except ValueError:
        raise argparse.ArgumentTypeError("an M_Key is a 64-bit integer (hex: 0x...)") from None
    if not 0 <= v < 1 << 64:
        raise argparse.ArgumentTypeError("an M_Key is a 64-bit integer (0..0xffffffffffffffff)")
    return v


def _int_in(lo: int, hi: int, what: str) -> Any:
    def parse(text: str) -> int:
        try:
            v = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{what} {v} outside {lo}..{hi}")
        return v

    return parse


def _m_key_default() -> int:
    text = os.environ.get(M_KEY_ENV, "").strip()
    if not text:
        return 0
    try:
        return _m_key(text)
    except argparse.ArgumentTypeError as e:
        raise IbfmError(f"{M_KEY_ENV}: {e}") from None


def add_fabric_args(p: argparse.ArgumentParser, *, umad: bool = True) -> None:
    """Where the fabric comes from and how the SM treats it (shared by sm, route, serve)."""
    p.add_argument("--topology", metavar="FILE", help="net file (ibsim/ibnetdiscover) loaded into the emulator")
    if umad:
        p.add_argument(
            "--transport", choices=("emulated", "umad"), default="emulated", help="fabric access (default emulated)"
        )
        p.add_argument("--ca", help="umad: CA name (default: first)")
        p.add_argument("--port", type=int, help="umad: CA port number (default: first active)")
    p.add_argument("--engine", type=engine_chain, default=DEFAULT_CHAIN, help="routing engines in order")
    p.add_argument("--lmc", type=_lmc, default=0, help="LID mask control, 0..2")
    p.add_argument("--guid2lid", type=Path, metavar="FILE", help="guid2lid file kept across runs")
    p.add_argument("--root-guid", type=_guid, action="append", default=[], help="root switch GUID (repeatable)")
    p.add_argument(
        "--partitions",
        type=Path,
        metavar="FILE",
        help="partitions file in OpenSM's partitions.conf syntax (default: every port a full member of 0x7fff)",
    )
    p.add_argument(
        "--part-enforce",
        choices=("both", "in", "out", "off"),
        default="both",
        help="partition enforcement on switch ports facing CAs (default both, as OpenSM)",
    )
    p.add_argument(
        "--m-key",
        type=_m_key,
        metavar="KEY",
        help=f"M_Key for every end port, 64 bits (0x...; default ${M_KEY_ENV}, else 0: none, as OpenSM); a "
        f"command line is visible to every user of the host: prefer ${M_KEY_ENV}",
    )
    p.add_argument(
        "--m-key-per-port",
        action="store_true",
        help="a key per port, derived from --m-key and the port GUID (BLAKE2b)",
    )
    p.add_argument(
        "--m-key-protection-level",
        type=_int_in(0, 3, "M_Key protection level"),
        default=0,
        metavar="0..3",
        help="M_KeyProtectBits: with a wrong key 0 fails Sets, 1 also hides the key from Gets, 2 and 3 fail "
        "Gets (default 0)",
    )
    p.add_argument(
        "--m-key-lease-period",
        type=_int_in(0, 65535, "M_Key lease period"),
        default=0,
        metavar="SECONDS",
        help="M_KeyLeasePeriod: a port's protection lapses this long after a failed check unless the SM comes "
        "(default 0: never; a lost key is then an error)",
    )
    p.add_argument(
        "--guid2mkey",
        type=Path,
        metavar="FILE",
        help="guid2mkey file kept across runs (default: beside --guid2lid, else in memory)",
    )
    p.add_argument("--qos", action="store_true",
                   help="QoS as OpenSM's -Q: SL2VL and VL arbitration tables on every port, SLs by QoS level")
    p.add_argument("--qos-policy-file", type=Path, metavar="FILE",
                   help="QoS policy file (a subset of OpenSM's qos-policy.conf; see docs/qos.md)")
    p.add_argument("--qos-option", action="append", default=[], metavar="NAME=VALUE",
                   help="an OpenSM QoS option, e.g. qos_swe_sl2vl=0,1,2,3,4,5,6,7,0,1,2,3,4,5,6,7 or "
                   "qos_ca_vlarb_high=0:4 (repeatable; names and defaults as OpenSM's, docs/settings.md)")


def register(sub: Any) -> None:
    p = sub.add_parser("sm", help="run the subnet manager once and print a summary")
    add_fabric_args(p)
    p.add_argument("--dump-lfts", type=Path, metavar="FILE", help="write every LFT as ibroute prints it")
    p.add_argument("--json", action="store_true", help="summary as JSON")
    p.add_argument("--daemon", action="store_true", help="keep sweeping until SIGTERM or SIGINT, then exit 0")
    p.add_argument("--quiet", action="store_true",
                   help="no progress line per stage on stderr (shown only when stderr is a terminal)")
    p.add_argument(
        "--sm-priority",
        type=_priority,
        default=0,
        metavar="0..15",
        help="SMInfo priority (default 0, as OpenSM's): a better SM on the subnet makes this one stand by",
    )
    p.add_argument(
        "--sweep-interval",
        type=number_in(0, 86400, lo_open=True),
        default=10.0,
        metavar="SECONDS",
        help="--daemon: seconds between sweeps",
    )
    p.set_defaults(func=cmd_sm)

    r = sub.add_parser("route", help="hops between two endpoints (name, GUID or LID), like ibtracert")
    add_fabric_args(r, umad=False)
    r.add_argument("src")
    r.add_argument("dst")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_route)


def config_from_args(args: argparse.Namespace) -> SmConfig:
    m_key = args.m_key if args.m_key is not None else _m_key_default()
    if args.m_key_per_port and not m_key:
        raise IbfmError(f"--m-key-per-port derives each port's key from --m-key: give one (or set {M_KEY_ENV})")
    return SmConfig(
        engines=tuple(args.engine),
        lmc=args.lmc,
        guid2lid=args.guid2lid,
        root_guids=tuple(args.root_guid),
        sm_priority=getattr(args, "sm_priority", 0),
        partitions=load_partitions(args.partitions) if args.partitions is not None else None,
        part_enforce=args.part_enforce,
        m_key=m_key,
        m_key_per_port=args.m_key_per_port,
        m_key_protect=args.m_key_protection_level,
        m_key_lease=args.m_key_lease_period,
        guid2mkey=args.guid2mkey,
        qos=qos_from_args(args),
    )


def qos_from_args(args: argparse.Namespace) -> QosConfig:
    """``--qos``, ``--qos-policy-file`` and ``--qos-option NAME=VALUE``, checked as the ``[sm]`` settings
    of the same names (IbfmError naming the option)."""
    from pydantic import ValidationError

    from ibfm.settings import SmSettings

    given: dict[str, Any] = {"qos": args.qos, "qos_policy_file": args.qos_policy_file}
    for item in args.qos_option:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.startswith("qos_") or name in ("qos_policy_file",) or \
                name not in SmSettings.model_fields:  # fmt: skip
            raise IbfmError(f"--qos-option {item!r}: expected NAME=VALUE with NAME a qos_* option (docs/settings.md)")
        given[name] = value.strip()
    try:
        return SmSettings(**given).qos_config()
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"] if isinstance(x, str))
        raise IbfmError(f"--qos-option {where}: {err['msg'].removeprefix('Value error, ')}") from None


def open_transport(args: argparse.Namespace) -> WindowedTransport:
    if getattr(args, "transport", "emulated") == "umad":
        from sm.transport.umad import UmadTransport

        # An SM holds issm (IsSM set, traps delivered) and serves SMInfo and the SA.
        return UmadTransport(args.ca, args.port, issm=True, serve_sa=True)
    if not args.topology:
        raise IbfmError("--topology FILE is required with the emulated transport")
    from fabric.emulator import EmulatedFabric
    from fabric.formats.netfile import read_net
    from sm.transport.emulated import EmulatedTransport

    return EmulatedTransport(EmulatedFabric(read_net(args.topology)), issm=True)


async def run_once(args: argparse.Namespace) -> tuple[SubnetSnapshot, TransportStats]:
    """One heavy sweep; the snapshot and what the transport counted (SMPs, retries, resends)."""
    config = config_from_args(args)  # a bad partitions file stops us here, before any MAD
    transport = open_transport(args)
    try:
        transport.start()
        manager = FabricManager(transport, config)
        serve_port(transport, manager)  # peers' SMInfo and hosts' SA queries are answered meanwhile
        with _progress(args, manager):
            return await sweep_through_leases(manager), transport.stats
    finally:
        await transport.close()


def _progress(args: argparse.Namespace, manager: FabricManager) -> contextlib.AbstractContextManager[object]:
    """Each stage of the first heavy sweep on a line of stderr, when it is a terminal and not --quiet."""
    from ibfm.progress import showing, wanted

    return showing(manager.progress, enabled=wanted(getattr(args, "quiet", True)),
                   until=lambda: manager.snapshot is not None)


async def sweep_through_leases(manager: FabricManager) -> SubnetSnapshot:
    """A heavy sweep; while ports whose M_Key we lack wait out their lease (the manager says how long, and
    gives up past (lease + 1) x (hops + 1) seconds), sweep again after the wait."""
    while True:
        try:
            snap: SubnetSnapshot | None = await manager.heavy_sweep()
        except SweepError:
            if manager.m_key_retry_in() is None:
                raise
            snap = None
        wait = manager.m_key_retry_in()
        if wait is None:
            if snap is None:  # (cannot happen: a failed sweep with no wait left raised above)
                raise IbfmError("no sweep completed")
            return snap
        await asyncio.sleep(wait)


def summary(snap: SubnetSnapshot, stats: TransportStats | None = None) -> dict[str, Any]:
    f = snap.fabric
    counts = f.summary()
    out = {
        "time": datetime.fromtimestamp(snap.time, UTC).isoformat(timespec="seconds"),
        "subnet_up": snap.up,
        "nodes": {"switches": counts["switches"], "cas": counts["cas"], "links": counts["links"]},
        "lids": {"assigned": int(snap.lids.used().size), "lmc": snap.lids.lmc, "max_lid": snap.lids.max_lid},
        "sm": {"node": f.names[snap.discovery.sm_node], "port": snap.discovery.sm_port, "lid": snap.sm_lid},
        "engine": snap.engine,
        "refused": [{"engine": e, "reason": r} for e, r in snap.refused],
        "verify": {
            "ok": snap.verify.ok,
            "pairs": snap.verify.pairs,
            "unreachable": snap.verify.unreachable,
            "max_hops": snap.verify.max_hops,
            "mean_hops": round(snap.verify.mean_hops, 3),
            "failures": [str(x) for x in snap.verify.failures],
        },
        "credit_loops": [str(loop) for loop in snap.credit_loops],
        "program": {
            "port_sets": snap.program.port_sets,
            "lft_blocks_sent": snap.program.blocks_sent,
            "lft_blocks_unchanged": snap.program.blocks_skipped,
            "ports_active": snap.program.activated,
            "pkey_blocks_sent": snap.program.pkey_blocks_sent,
            "pkey_blocks_unchanged": snap.program.pkey_blocks_skipped,
            "sl2vl_tables_sent": snap.program.qos.sl2vl_sent if snap.program.qos else 0,
            "sl2vl_tables_unchanged": snap.program.qos.sl2vl_skipped if snap.program.qos else 0,
            "vlarb_blocks_sent": snap.program.qos.vlarb_sent if snap.program.qos else 0,
            "vlarb_blocks_unchanged": snap.program.qos.vlarb_skipped if snap.program.qos else 0,
            "failures": snap.program.failures,
        },
        "partitions": _partitions_summary(snap),
        "m_key": {
            "ports_keyed": snap.program.m_keys_set,
            "locked": [x.where for x in snap.m_key_locked],
        },
        "discovery_errors": snap.discovery.errors,
        "lid_warnings": list(snap.lid_warnings),
        "smps": snap.smps,
        "phases_s": {k: round(v, 4) for k, v in snap.phases.items()},
        "up_s": round(snap.up_s, 4),
        "sweep_s": round(snap.duration_s, 4),
        "started_at": snap.started_at,
        "up_at": snap.programmed_at,
    }
    if stats is not None:
        out["transport"] = {
            "sent": stats.sent,
            "retries": stats.retries,
            "timeouts": stats.timeouts,
            "resent": stats.resent,
            "refused": stats.refused,
        }
    return out


def format_summary(s: dict[str, Any]) -> str:
    n, v, p = s["nodes"], s["verify"], s["program"]
    lines = [
        f"subnet {'UP' if s['subnet_up'] else 'NOT UP'}: {n['switches']} switches, {n['cas']} CAs, {n['links']} links",
        f"LIDs: {s['lids']['assigned']} assigned (LMC {s['lids']['lmc']}), SM {s['sm']['node']} "
        f"port {s['sm']['port']} LID {s['sm']['lid']}",
        f"routing: {s['engine']}" + "".join(f" (refused by {r['engine']}: {r['reason']})" for r in s["refused"]),
        f"verify: {v['pairs']} pairs, {v['unreachable']} unreachable, hops max {v['max_hops']} mean {v['mean_hops']}",
        f"credit loops: {len(s['credit_loops'])}",
        f"programmed: {p['port_sets']} PortInfo, {p['lft_blocks_sent']} LFT blocks sent "
        f"({p['lft_blocks_unchanged']} unchanged), {p['ports_active']} ports ACTIVE",
        f"SMPs: {s['smps']}; up in {s['up_s']:.3f}s, checked in {s['sweep_s']:.3f}s",
        "phases: "
        + ", ".join(f"{k} {v:.3f}s" for k, v in s["phases_s"].items())
        + " (routing and the checks overlap programming)",
    ]
    if s["m_key"]["ports_keyed"]:
        lines.append(f"M_Key: {s['m_key']['ports_keyed']} ports given their key, protection level and lease")
    lines += [f"warning: M_Key unknown (answers no key we have): {w}" for w in s["m_key"]["locked"]]
    for key in ("discovery_errors", "lid_warnings"):
        lines += [f"warning: {e}" for e in s[key]]
    lines += [f"error: {e}" for e in p["failures"]]
    lines += [f"unreachable: {e}" for e in v["failures"]]
    lines += [f"credit loop: {e}" for e in s["credit_loops"]]
    return "\n".join(lines)


async def run_daemon(args: argparse.Namespace) -> int:
    """Sweep until SIGTERM/SIGINT; print the summary (and dump the LFTs) after every heavy sweep."""
    import dataclasses
    import signal

    from sm.sweep.events import SweepDone

    config = dataclasses.replace(config_from_args(args), sweep_interval=args.sweep_interval)
    transport = open_transport(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        transport.start()
        manager = FabricManager(transport, config)
        serve_port(transport, manager)

        def on_event(ev: Any) -> None:
            snap = manager.snapshot
            if isinstance(ev, SweepDone) and ev.kind == "heavy" and snap is not None:
                if args.dump_lfts:
                    from fabric.fileio import write_text_atomic

                    write_text_atomic(args.dump_lfts, format_lfts(snap.fabric, snap.lids, snap.lft))
                s = summary(snap, transport.stats)
                if args.json:
                    print(json.dumps(s), flush=True)
                else:  # a long run's report: every line stamped with the sweep's time
                    stamp = s["time"]
                    text = f"-- sweep {snap.sweep}\n{format_summary(s)}"
                    print("\n".join(f"{stamp} {line}" for line in text.splitlines()), flush=True)

        manager.events.subscribe(on_event)
        with _progress(args, manager):  # the first bring-up's stages
            await manager.run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await transport.close()
    return 0


def _partitions_summary(snap: SubnetSnapshot) -> dict[str, Any]:
    plan = snap.partitions
    if plan is None or plan.config is None:
        return {}
    return {
        "source": plan.config.source,
        "partitions": [
            {"name": p.name, "pkey": f"{p.pkey:#06x}", "members": len(plan.members(p.pkey)), "ipoib": p.ipoib}
            for p in plan.config.partitions
        ],
        "problems": list(plan.problems),
    }


def cmd_sm(args: argparse.Namespace) -> int:
    if args.daemon:
        return asyncio.run(run_daemon(args))
    from sm.sweep.manager import StandingBy

    try:
        snap, stats = asyncio.run(run_once(args))
    except StandingBy as e:  # another SM runs this subnet: we wrote nothing
        print(f"ibfm: another subnet manager is master; nothing written ({e})", file=sys.stderr)
        return 3
    if args.dump_lfts:
        from fabric.fileio import write_text_atomic

        write_text_atomic(args.dump_lfts, format_lfts(snap.fabric, snap.lids, snap.lft))
    s = summary(snap, stats)
    print(json.dumps(s, indent=2) if args.json else format_summary(s))
    return 0 if snap.up else 1


def cmd_route(args: argparse.Namespace) -> int:
    from sm.analysis.query import resolve_endpoint
    from sm.sa.path_record import path_sl

    snap, _ = asyncio.run(run_once(args))
    r = describe_route(snap.fabric, snap.lids, snap.lft, args.src, args.dst)
    f = snap.fabric
    src = resolve_endpoint(f, snap.lids, args.src)
    dst = resolve_endpoint(f, snap.lids, args.dst)
    shared = snap.partitions.shared(src, dst) if snap.partitions is not None else (0xFFFF,)
    sl = path_sl(snap, src, dst, shared[0] if shared else 0xFFFF, r.dst_lid)
    vls = []
    for h in r.hops:
        n = f.by_guid(h.guid)
        t = None
        if snap.qos is not None and h.out_port:
            t = snap.qos.sl2vl_table(n, h.in_port if f.is_switch(n) else 0, h.out_port)
        vls.append(int(t[sl]) if t is not None else None)
    why = "the routing engine's layer" if snap.layers is not None else (
        "the QoS level" if snap.qos is not None and snap.qos.level_sl(src, dst, shared[0] if shared else 0xFFFF)
        is not None else "the default")  # fmt: skip
    if args.json:
        from dataclasses import asdict

        out = asdict(r)
        out["sl"] = sl
        for h, vl in zip(out["hops"], vls, strict=True):
            h["vl"] = vl
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        lines = format_route(r).splitlines()
        for i, vl in enumerate(vls):
            if vl is not None:
                lines[i + 1] += f" VL {vl}"
        print("\n".join(lines))
        print(f"SL {sl} ({why}): hosts that do not ask the SA must send on SL {sl} to {r.dst} from {r.src}")
    return 0
