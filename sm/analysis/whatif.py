"""What-if: route a copy of the subnet with cables or switches failed, and say how good the routes would be.

:func:`what_if` copies the fabric, takes the given cables out and the
given switches away, keeps every other LID where it is, routes the copy
with the engine chain and reports the routes' quality
(:func:`route_quality`: verification, credit loops, sampled shift
quality, and the congestion model's prediction for a traffic pattern) and
how many 64-LID LFT blocks the SM would have to send. Nothing is
programmed; the snapshot is not touched.

A pattern is built again on the changed fabric (hosts cut off by the
failure drop out of it), from the same spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fabric.errors import IbfmError
from fabric.model import Fabric, NodeType
from sm.analysis.creditflow import find_credit_loops
from sm.analysis.flowmodel import CongestionReport, predict_congestion
from sm.analysis.patterns import PatternError, hosts, parse_pattern
from sm.analysis.verify import ShiftQuality, VerifyReport, shift_quality, verify_routes
from sm.lidmap import LidMap
from sm.routing.base import Lft, RoutingError, RoutingOptions, route


class WhatIfError(IbfmError):
    """A what-if naming a cable or switch the subnet does not have."""


@dataclass(frozen=True)
class RouteQuality:
    """How good one set of routes is."""

    engine: str
    refused: tuple[tuple[str, str], ...]
    verify: VerifyReport
    credit_loops: tuple[str, ...]
    shifts: ShiftQuality
    congestion: CongestionReport | None
    pattern_error: str = ""
    """Why the pattern could not be built on this fabric (e.g. too few hosts left), or ""."""
    pattern_hosts: int = 0
    """Host ports the pattern addresses (CA ports with a LID and an up link)."""


def route_quality(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    engine: str,
    refused: tuple[tuple[str, str], ...] = (),
    *,
    pattern: str | None = None,
    max_shifts: int = 32,
    verify: VerifyReport | None = None,
) -> RouteQuality:
    """Verification, credit loops, sampled shift quality and the congestion of ``pattern`` (a spec) on ``lft``."""
    rep = verify if verify is not None else verify_routes(fabric, lids, lft)
    loops = find_credit_loops(fabric, lids, lft, from_cas=True)
    sq = shift_quality(fabric, lids, lft, max_shifts=max_shifts)
    cong = None
    why = ""
    n_hosts = int(hosts(fabric, lids).shape[0])
    if pattern is not None:
        try:
            cong = predict_congestion(fabric, lids, lft, parse_pattern(pattern, fabric, lids))
        except PatternError as e:
            why = str(e)
    return RouteQuality(engine, refused, rep, tuple(str(x) for x in loops), sq, cong, why, n_hosts)


@dataclass
class WhatIfReport:
    failed_links: list[str]
    """The cables taken out, ``node[port] - node[port]``."""
    failed_switches: list[str]
    routed: bool
    reason: str = ""
    """Why no engine could route the changed fabric (``routed`` false)."""
    quality: RouteQuality | None = None
    lft_blocks_changed: int = 0
    """64-LID LFT blocks that differ from the current ones (what the SM would send)."""
    switches_changed: int = 0
    hosts_cut_off: list[str] = field(default_factory=list)
    """CAs left without an up link to a switch."""


def what_if(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    chain: tuple[str, ...],
    options: RoutingOptions,
    *,
    links: Sequence[tuple[int, int]] = (),
    switches: Sequence[int] = (),
    pattern: str | None = None,
    max_shifts: int = 32,
) -> WhatIfReport:
    """Route a copy of ``fabric`` without the cables at ``links`` ((node, port)) and without ``switches``."""
    f = fabric.copy()
    failed_links = []
    for n, p in links:
        if not (0 <= n < f.n_nodes and 1 <= p <= int(f.nports[n])):
            raise WhatIfError(f"no port {p} on node {n}")
        if f.peer_node[n, p] < 0:
            raise WhatIfError(f"{fabric.port_name(n, p)} has no cable (already failed, or listed twice)")
        peer = fabric.port_name(int(f.peer_node[n, p]), int(f.peer_port[n, p]))
        failed_links.append(f"{fabric.port_name(n, p)} - {peer}")
        f.disconnect(n, p)
    keep = np.ones(f.n_nodes, np.bool_)
    for s in switches:
        if not 0 <= s < f.n_nodes or fabric.node_type[s] != NodeType.SWITCH:
            raise WhatIfError(f"node {s} is not a switch")
        keep[s] = False
    if not keep.all():
        f = f.subset(keep)
    new_lids = LidMap.from_base(lids.base[keep], lids.lmc)
    rep = WhatIfReport(failed_links, [fabric.names[s] for s in switches], routed=False)
    up = f.up_mask()
    to_switch = up & (f.node_type[np.where(up, f.peer_node, 0)] == NodeType.SWITCH)
    cas = f.cas
    rep.hosts_cut_off = [f.names[i] for i in cas[~to_switch[cas].any(axis=1)].tolist()]
    try:
        res = route(f, new_lids, chain, options)
    except RoutingError as e:
        rep.reason = str(e)
        return rep
    rep.routed = True
    rep.quality = route_quality(
        f, new_lids, res.lft, res.engine, tuple(res.refused), pattern=pattern, max_shifts=max_shifts
    )
    # LFT blocks that would change, switch by switch (rows matched by node GUID; LIDs kept their values).
    old_rows = {int(g): i for i, g in enumerate(fabric.node_guid[fabric.switches].tolist())}
    width = min(lft.shape[1], res.lft.shape[1])
    pad = (-width) % 64
    for r, g in enumerate(f.node_guid[f.switches].tolist()):
        o = old_rows.get(int(g))
        if o is None:
            continue
        diff = np.concatenate([lft[o, :width] != res.lft[r, :width], np.zeros(pad, np.bool_)])
        nb = int(diff.reshape(-1, 64).any(axis=1).sum())
        if lft.shape[1] != res.lft.shape[1]:
            nb += abs(-(-lft.shape[1] // 64) - -(-res.lft.shape[1] // 64))
        rep.lft_blocks_changed += nb
        rep.switches_changed += nb > 0
    return rep
