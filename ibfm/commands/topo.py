"""``ibfm topo``: generate topologies (``gen``) and look at topology files (``show``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fabric.errors import IbfmError
from fabric.model import SPEED_BY_NAME, Fabric, Speed
from ibfm.commands._args import int_at_least, number_in


def register(subparsers: Any) -> None:
    topo = subparsers.add_parser("topo", help="generate and inspect fabric topologies")
    topo_sub = topo.add_subparsers(dest="topo_command", required=True, metavar="ACTION")
    _register_gen(topo_sub)
    _register_show(topo_sub)
    _register_export(topo_sub)


# -- gen ---------------------------------------------------------------------------------------------


def _int_list(sep: str) -> Any:
    def parse(text: str) -> list[int]:
        try:
            vals = [int(x) for x in text.lower().split(sep)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected integers separated by {sep!r}: {text!r}") from None
        if any(v < 1 for v in vals):
            raise argparse.ArgumentTypeError(f"values must be >= 1: {text!r}")
        return vals

    return parse


def _ratio(text: str) -> tuple[int, int]:
    d, sep, u = text.partition(":")
    if not sep or not d.isdigit() or not u.isdigit() or int(d) < 1 or int(u) < 1:
        raise argparse.ArgumentTypeError(f"expected D:U, hosts and uplinks per leaf (e.g. 24:12): {text!r}")
    return int(d), int(u)


def _speed(text: str) -> Speed:
    try:
        return SPEED_BY_NAME[text.upper()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown speed {text!r} (one of {', '.join(SPEED_BY_NAME)})") from None


def _register_gen(topo_sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-o", "--output", required=True, metavar="FILE", help="net file ('-': stdout)")
    common.add_argument("--speed", type=_speed, default=Speed.NDR, help="link speed (default NDR)")
    common.add_argument("--degrade-links", type=int_at_least(0), metavar="N", help="remove N inter-switch links")
    common.add_argument(
        "--degrade-fraction", type=number_in(0.0, 1.0), metavar="F", help="remove this fraction of inter-switch links"
    )
    common.add_argument(
        "--degrade-switches", type=int_at_least(0), default=0, metavar="M", help="remove M switches that carry no host"
    )
    common.add_argument("--seed", type=int, default=0, help="seed for --degrade-* (default 0)")
    common.add_argument("--allow-split", action="store_true", help="let degradation disconnect the switch graph")

    gen = topo_sub.add_parser("gen", help="generate a topology, write an ibsim net file")
    kinds = gen.add_subparsers(dest="kind", required=True, metavar="KIND")

    p = kinds.add_parser("fattree", parents=[common], help="2- or 3-level fat-tree of K-port switches")
    p.add_argument("--levels", type=int, choices=(2, 3), required=True)
    p.add_argument("--radix", type=int_at_least(1), required=True, metavar="K", help="switch ports (even, 4..64)")
    p.add_argument("--oversubscribe", type=_ratio, metavar="D:U", help="D hosts, U uplinks per leaf")
    p.set_defaults(func=_run_gen)

    p = kinds.add_parser("xgft", parents=[common], help="extended generalized fat-tree XGFT(h; m; w)")
    p.add_argument("--h", type=int_at_least(1), required=True, help="levels of switches")
    p.add_argument("--m", type=_int_list(","), required=True, metavar="M1,..", help="children per level")
    p.add_argument("--w", type=_int_list(","), required=True, metavar="W1,..", help="parents per level")
    p.set_defaults(func=_run_gen)

    p = kinds.add_parser("torus", parents=[common], help="2-D or 3-D torus with wraparound")
    p.add_argument("--dims", type=_int_list("x"), required=True, metavar="AxB[xC]")
    p.add_argument("--hosts-per-switch", type=int_at_least(0), default=1, metavar="H")
    p.add_argument("--radix", type=int_at_least(1), default=16, metavar="K")
    p.set_defaults(func=_run_gen)

    p = kinds.add_parser("dragonfly", parents=[common], help="dragonfly: all-to-all groups joined by global links")
    p.add_argument("--groups", type=int_at_least(2), required=True, metavar="G")
    p.add_argument("--routers", type=int_at_least(1), required=True, metavar="A", help="switches per group")
    p.add_argument("--hosts-per-router", type=int_at_least(0), default=2, metavar="P")
    p.add_argument("--global-links", type=int_at_least(1), required=True, metavar="H", help="per router")
    p.add_argument("--radix", type=int_at_least(1), metavar="K", help="default: what a router needs")
    p.set_defaults(func=_run_gen)

    p = kinds.add_parser("random", parents=[common], help="random regular switch graph (Jellyfish)")
    p.add_argument("--switches", type=int_at_least(2), required=True, metavar="N")
    p.add_argument("--degree", type=int_at_least(1), required=True, metavar="D", help="switch-to-switch links each")
    p.add_argument("--hosts-per-switch", type=int_at_least(0), default=1, metavar="H")
    p.add_argument("--radix", type=int_at_least(1), metavar="K", help="default: H + D")
    p.add_argument("--graph-seed", type=int, default=0, help="seed of the random graph (default 0)")
    p.set_defaults(func=_run_gen)

    p = kinds.add_parser("ring", parents=[common], help="ring of switches")
    p.add_argument("--switches", type=int_at_least(1), required=True, metavar="N")
    p.add_argument("--hosts-per-switch", type=int_at_least(0), default=1, metavar="H")
    p.add_argument("--radix", type=int_at_least(1), default=8, metavar="K")
    p.set_defaults(func=_run_gen)

    p = kinds.add_parser("rail", parents=[common], help="rail-optimised (DGX SuperPOD-like) leaf/spine unit")
    p.add_argument("--hosts", type=int_at_least(1), default=32, metavar="N")
    p.add_argument("--rails", type=int_at_least(1), default=8, metavar="R", help="HCAs per host, one rail each")
    p.add_argument("--hosts-per-leaf", type=int_at_least(1), metavar="H")
    p.add_argument("--radix", type=int_at_least(1), default=64, metavar="K")
    p.set_defaults(func=_run_gen)


def _generate(args: argparse.Namespace) -> Fabric:
    from fabric import generate as g

    if args.kind == "fattree":
        return g.fattree(args.levels, args.radix, oversubscribe=args.oversubscribe, speed=args.speed)
    if args.kind == "xgft":
        return g.xgft(args.h, args.m, args.w, speed=args.speed)
    if args.kind == "torus":
        if len(args.dims) not in (2, 3):
            raise IbfmError(f"torus --dims {'x'.join(map(str, args.dims))}: give 2 or 3 dimensions")
        return g.torus(args.dims, args.hosts_per_switch, args.radix, speed=args.speed)
    if args.kind == "dragonfly":
        return g.dragonfly(
            args.groups, args.routers, args.hosts_per_router, args.global_links, args.radix, speed=args.speed
        )
    if args.kind == "random":
        return g.random_regular(
            args.switches, args.degree, args.hosts_per_switch, args.radix, seed=args.graph_seed, speed=args.speed
        )
    if args.kind == "ring":
        return g.ring(args.switches, args.hosts_per_switch, args.radix, speed=args.speed)
    if args.kind == "rail":
        return g.rail_cluster(args.hosts, args.rails, args.hosts_per_leaf, args.radix, speed=args.speed)
    raise IbfmError(f"unknown topology kind {args.kind!r}")


def _run_gen(args: argparse.Namespace) -> int:
    from fabric.formats.netfile import write_net
    from fabric.generate import degrade
    from fabric.shape import detect_shape

    if args.degrade_links is not None and args.degrade_fraction is not None:
        raise IbfmError("give --degrade-links or --degrade-fraction, not both")
    fabric = _generate(args)
    if args.degrade_links or args.degrade_fraction or args.degrade_switches:
        fabric = degrade(
            fabric,
            links=args.degrade_links,
            fraction=args.degrade_fraction,
            switches=args.degrade_switches,
            seed=args.seed,
            keep_connected=not args.allow_split,
        )
    if args.output == "-":
        write_net(fabric, sys.stdout)
    else:
        write_net(fabric, args.output)
    where = "stdout" if args.output == "-" else args.output
    print(f"{where}: {detect_shape(fabric).describe()}", file=sys.stderr)
    return 0


# -- show --------------------------------------------------------------------------------------------


def _register_show(topo_sub: Any) -> None:
    p = topo_sub.add_parser("show", help="read a net file or ibnetdiscover output; print counts and the detected shape")
    p.add_argument("file", metavar="FILE", help="ibsim net file or saved ibnetdiscover output")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=_run_show)


def _register_export(topo_sub: Any) -> None:
    p = topo_sub.add_parser("export", help="write a topology as GraphML or JSON (networkx node-link) for graph tools")
    p.add_argument("file", metavar="FILE", help="ibsim net file or saved ibnetdiscover output")
    p.add_argument("--format", choices=("graphml", "json"), default="graphml", help="default graphml")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write ('-': stdout)")
    p.set_defaults(func=_run_export)


def _run_export(args: argparse.Namespace) -> int:
    from fabric.fileio import write_text_atomic
    from fabric.formats.graph import export_graph
    from fabric.formats.netfile import read_net

    text = export_graph(read_net(args.file), args.format)
    if args.output == "-":
        print(text, end="")
    else:
        write_text_atomic(args.output, text)
    return 0


def topology_summary(fabric: Fabric) -> dict[str, Any]:
    """Counts for ``topo show``: nodes by type, hosts (distinct system image GUIDs of CAs), links, rates."""
    import numpy as np

    from fabric.model import NodeType, rate_name

    types = fabric.node_type
    cas = types == NodeType.CA
    la = fabric.link_array()
    cabled = fabric.link_array(up_only=False)
    sw = types == NodeType.SWITCH
    to_ca = int(np.count_nonzero(cas[la[:, 0]] | cas[la[:, 2]]))
    pairs = np.stack([fabric.width_active[la[:, 0], la[:, 1]], fabric.speed_active[la[:, 0], la[:, 1]]], axis=1)
    rates: dict[str, int] = {}
    if pairs.size:
        uniq, counts = np.unique(pairs, axis=0, return_counts=True)
        for (w, s), c in sorted(zip(uniq.tolist(), counts.tolist(), strict=True), key=lambda x: -x[1]):
            rates[rate_name(w, s) or "unknown"] = c
    return {
        "switches": int(np.count_nonzero(sw)),
        "cas": int(np.count_nonzero(cas)),
        "routers": int(np.count_nonzero(types == NodeType.ROUTER)),
        "hosts": int(np.unique(fabric.sysimg_guid[cas]).size),
        "ports": int(np.count_nonzero(fabric.port_exists)),
        "links": int(la.shape[0]),
        "links_down": int(cabled.shape[0] - la.shape[0]),
        "switch_links": int(np.count_nonzero(sw[la[:, 0]] & sw[la[:, 2]])),
        "ca_links": to_ca,
        "rates": rates,
    }


def _run_show(args: argparse.Namespace) -> int:
    import json

    from fabric.formats.netfile import read_net

    fabric = read_net(args.file)
    counts = topology_summary(fabric)
    shape = _shape(fabric)
    if args.json:
        out = {"file": args.file, **counts, "shape": None if shape is None else shape.as_dict()}
        print(json.dumps(out, indent=2))
        return 0
    c = counts
    lines = [
        f"{args.file}",
        f"  switches  {c['switches']}",
        f"  CAs       {c['cas']} on {c['hosts']} hosts (system image GUIDs)",
    ]
    if c["routers"]:
        lines.append(f"  routers   {c['routers']}")
    down = f", {c['links_down']} cabled but down" if c["links_down"] else ""
    lines.append(f"  links     {c['links']} ({c['switch_links']} switch-switch, {c['ca_links']} to CAs{down})")
    if c["rates"]:
        lines.append("  rates     " + ", ".join(f"{n} x {r}" for r, n in c["rates"].items()))
    lines.append(f"  ports     {c['ports']}")
    lines.append(f"  shape     {shape.describe() if shape is not None else 'unknown (fabric.shape not available)'}")
    print("\n".join(lines))
    return 0


def _shape(fabric: Fabric) -> Any:
    """The detected shape, or None while fabric.shape is not importable."""
    try:
        from fabric.shape import detect_shape
    except ImportError:
        return None
    return detect_shape(fabric)
