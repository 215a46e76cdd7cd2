"""Credit-flow congestion model: max-min fair flow rates, link loads and predicted XmitWait.

A fluid model of one VL under static (LFT) routing. Every flow of a
:class:`~sm.analysis.patterns.Pattern` follows the LFTs from its source end port to
its destination LID; the directed links it crosses, CA injection and
ejection links included, form a sparse flows x links incidence (entry
arrays ``flow``, ``link``, ``hop``), built with :mod:`sm.analysis.verify`'s
vectorized route walk. Link capacities come from the active width and speed.

Rates are max-min fair (water-filling): each round gives every link its
fair share ``(capacity - load of frozen flows) / unfrozen flows``; a link
whose share is no larger than any share or demand its flows meet elsewhere
is tight, and its flows freeze at that share; flows whose demand is below
every share on their path freeze at their demand. This is progressive
filling with every locally lowest level taken in the same round. A flow's
bottleneck is the first tight link on its path in the round it froze.

Credit back-pressure gives the predicted XmitWait. A link whose flows want
more than it carries is saturated: its transmitter is always busy and its
queue fills. With credit flow control, the queue pushes back on every port
upstream of it on those flows' paths, and those ports hold packets with no
credits to send them. For a port on link ``l`` with utilization ``u``:

    T_l  = sum over flows f on l whose bottleneck lies downstream of l of (min(demand_f, capacity_l) - rate_f)
    wait = min(1 - u, T_l / capacity_l)

``T_l`` is the traffic the port would send if downstream credits allowed
(greedy flows want the whole link); the port spends that much link time
waiting, but never more than the time it is not transmitting. A saturated
port (``u = 1``) and a port all of whose throttled flows are throttled here
or upstream wait 0. XmitWait ticks per second are ``wait`` times the tick rate
(``tick_hz``; by default one tick per 4-byte word time of the link, so
XmitWait and PortXmitData count in the same unit).

:func:`effective_bisection_bandwidth` is Hoefler, Schneider and Lumsdaine's
metric (Cluster 2008): the mean over random bisections of the per-flow
bandwidth, with their congestion count (1 / most flows sharing a link on
the path) and with max-min rates. :class:`ModelTraffic` drives the
emulator's PMA counters from a prediction. docs/creditflow.md holds the
assumptions and limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import MTU_BYTES, Fabric, NodeType
from sm.analysis.patterns import Pattern, hosts, port_capacity, random_bisection
from sm.analysis.verify import RouteTables, Status, entry_rows, route_tables, walk_routes
from sm.lidmap import LidMap
from sm.routing.base import Lft

if TYPE_CHECKING:
    from fabric.emulator import EmulatedFabric

__all__ = [
    "CongestionReport",
    "DirectedLinks",
    "EbbReport",
    "FlowModelError",
    "FlowPaths",
    "HotLink",
    "MaxMin",
    "ModelTraffic",
    "congestion_count",
    "directed_links",
    "effective_bisection_bandwidth",
    "max_min_fair",
    "predict_congestion",
    "trace_flows",
]

REL_TOL = 1e-9
"""Relative tolerance when comparing fair shares with the fill level."""

_FLOWS_PER_BATCH = 1 << 19


class FlowModelError(IbfmError):
    """Bad input to the congestion model (a flow from a port that does not exist, shapes that disagree)."""


# -- links ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DirectedLinks:
    """Every up link in both directions: link ``l`` leaves ``node[l]`` on ``port[l]``.

    ``capacity`` in bytes/s; ``index[node, port]`` is the link leaving there, -1 if none.
    """

    node: npt.NDArray[np.int64]
    port: npt.NDArray[np.int64]
    peer: npt.NDArray[np.int64]
    peer_port: npt.NDArray[np.int64]
    capacity: npt.NDArray[np.float64]
    index: npt.NDArray[np.int64]

    @property
    def n_links(self) -> int:
        return int(self.node.size)

    def name(self, fabric: Fabric, link: int) -> str:
        return (
            f"{fabric.port_name(int(self.node[link]), int(self.port[link]))} -> "
            f"{fabric.port_name(int(self.peer[link]), int(self.peer_port[link]))}"
        )


def directed_links(fabric: Fabric) -> DirectedLinks:
    """The fabric's up links, both directions, in ``[node, port]`` order."""
    up = fabric.up_mask() & fabric.port_exists
    n, p = np.nonzero(up)
    n, p = n.astype(np.int64), p.astype(np.int64)
    index = np.full(up.shape, -1, np.int64)
    index[n, p] = np.arange(n.size)
    return DirectedLinks(
        n,
        p,
        fabric.peer_node[n, p].astype(np.int64),
        fabric.peer_port[n, p].astype(np.int64),
        port_capacity(fabric)[n, p],
        index,
    )


# -- paths ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowPaths:
    """The links each flow crosses, as entries (``flow``, ``link``, ``hop``), hop 0 = a CA's own port.

    Only flows that reach their destination have entries; ``status`` holds
    each flow's :class:`~sm.analysis.verify.Status`. ``first_link`` is the link a flow
    enters the fabric on (its injection link; for a switch source the first
    link it leaves on), -1 for an undelivered flow.
    """

    status: npt.NDArray[np.int8]
    flow: npt.NDArray[np.int64]
    link: npt.NDArray[np.int64]
    hop: npt.NDArray[np.int32]
    first_link: npt.NDArray[np.int64]

    @property
    def n_flows(self) -> int:
        return int(self.status.size)

    @property
    def delivered(self) -> npt.NDArray[np.bool_]:
        return self.status == Status.DELIVERED


def _check_flows(
    fabric: Fabric, lids: LidMap, node: npt.NDArray[np.int64], port: npt.NDArray[np.int64], lid: npt.NDArray[np.int64]
) -> None:
    if not node.size == port.size == lid.size:
        raise FlowModelError(f"pattern arrays differ in length ({node.size}, {port.size}, {lid.size})")
    if not node.size:
        return
    if node.min() < 0 or node.max() >= fabric.n_nodes:
        raise FlowModelError(f"flow source node outside 0..{fabric.n_nodes - 1}")
    if port.min() < 0 or port.max() > fabric.max_port:
        raise FlowModelError(f"flow source port outside 0..{fabric.max_port}")
    bad = np.flatnonzero((lid < 1) | (lid > lids.max_lid))
    if bad.size:
        raise FlowModelError(f"flow {int(bad[0])}: destination LID {int(lid[bad[0]])} outside 1..{lids.max_lid}")
    bad = np.flatnonzero(lids.owner_node[lid] < 0)
    if bad.size:
        raise FlowModelError(f"flow {int(bad[0])}: destination LID {int(lid[bad[0]])} is not assigned")
    own = (lids.owner_node[lid].astype(np.int64) == node) & (lids.owner_port[lid].astype(np.int64) == port)
    if own.any():
        k = int(np.flatnonzero(own)[0])
        raise FlowModelError(
            f"flow {k}: {fabric.port_name(int(node[k]), int(port[k]))} sends to its own LID {int(lid[k])}"
        )


def _trace(
    fabric: Fabric,
    t: RouteTables,
    links: DirectedLinks,
    lft: Lft,
    node: npt.NDArray[np.int64],
    port: npt.NDArray[np.int64],
    lid: npt.NDArray[np.int64],
) -> FlowPaths:
    k = node.size
    flows: list[npt.NDArray[np.int64]] = []
    lks: list[npt.NDArray[np.int64]] = []
    hops: list[npt.NDArray[np.int32]] = []
    first = np.full(k, -1, np.int64)
    is_ca = fabric.node_type[node] == NodeType.CA
    inj = links.index[node, port]
    ca_src = is_ca & (inj >= 0)
    f0 = np.flatnonzero(ca_src).astype(np.int64)
    flows.append(f0)
    lks.append(inj[f0])
    hops.append(np.zeros(f0.size, np.int32))
    first[f0] = inj[f0]
    sw_node = t.sw.astype(np.int64)

    def on_hop(idx: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], ports: npt.NDArray[np.uint8]) -> None:
        h = len(hops)
        li = links.index[sw_node[rows], ports.astype(np.int64)]
        flows.append(idx)
        lks.append(li)
        hops.append(np.full(idx.size, h, np.int32))
        if h == 1:
            fresh = first[idx] < 0
            first[idx[fresh]] = li[fresh]

    rows = entry_rows(fabric, t, node, port)
    status = walk_routes(t, lft, rows, lid, on_hop)
    flow = np.concatenate(flows)
    link = np.concatenate(lks)
    hop = np.concatenate(hops)
    ok = status == Status.DELIVERED
    keep = ok[flow]
    first[~ok] = -1
    return FlowPaths(status, flow[keep], link[keep], hop[keep], first)


def trace_flows(
    fabric: Fabric, lids: LidMap, lft: Lft, pattern: Pattern, links: DirectedLinks | None = None
) -> FlowPaths:
    """Walk every flow of ``pattern`` through the LFTs (vectorized, all flows at once)."""
    node = np.asarray(pattern.src_node, np.int64)
    port = np.asarray(pattern.src_port, np.int64)
    lid = np.asarray(pattern.dst_lid, np.int64)
    _check_flows(fabric, lids, node, port, lid)
    t = route_tables(fabric, lids, lft)
    return _trace(fabric, t, links if links is not None else directed_links(fabric), lft, node, port, lid)


# -- rates ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MaxMin:
    """Max-min fair rates and why each flow stops where it does.

    ``bottleneck[f]``: the first tight link on the flow's path in the round it
    froze (-1: limited by its demand, or not delivered); ``bottleneck_hop[f]``
    its hop number (-1 likewise).
    """

    rate: npt.NDArray[np.float64]
    bottleneck: npt.NDArray[np.int64]
    bottleneck_hop: npt.NDArray[np.int32]
    rounds: int


def max_min_fair(
    n_flows: int,
    flow: npt.NDArray[np.int64],
    link: npt.NDArray[np.int64],
    hop: npt.NDArray[np.int32],
    capacity: npt.NDArray[np.float64],
    demand: npt.NDArray[np.float64],
    active: npt.NDArray[np.bool_] | None = None,
) -> MaxMin:
    """Max-min fair rates by water-filling over the incidence entries (see the module docstring).

    ``demand`` may hold ``inf``; flows not ``active`` (undelivered) get rate 0.
    A flow with no entries must have a finite demand.

    Each round computes every link's fair share ``s_l = (capacity - load of
    frozen flows) / unfrozen flows`` and freezes, at once, the flows of every
    link whose share is no larger than the share of any link (or the demand
    of any flow) its flows touch. Shares only grow as other flows freeze
    below them, so such a link is where progressive filling would stop its
    flows; freezing all of them together gives the same allocation in far
    fewer rounds than raising one global level (independent parts of the
    fabric, or independent patterns batched side by side, do not wait for
    each other).
    """
    n_links = int(capacity.size)
    d = np.asarray(demand, np.float64)
    if d.shape != (n_flows,):
        raise FlowModelError(f"demand has shape {d.shape}, expected ({n_flows},)")
    if np.isnan(d).any() or (d < 0).any():
        raise FlowModelError("flow demands must be >= 0 (inf for greedy)")
    rate = np.zeros(n_flows, np.float64)
    bott = np.full(n_flows, -1, np.int64)
    bhop = np.full(n_flows, -1, np.int32)
    frozen = np.zeros(n_flows, np.bool_) if active is None else ~np.asarray(active, np.bool_)
    frozen |= d <= 0
    has_entry = np.zeros(n_flows, np.bool_)
    has_entry[flow] = True
    lone = ~frozen & ~has_entry
    if np.isinf(d[lone]).any():
        raise FlowModelError("a greedy flow crosses no link: its rate is unbounded")
    rate[lone] = d[lone]
    frozen |= lone
    keep = ~frozen[flow]
    ef, el, eh = flow[keep], link[keep], hop[keep]
    # Links are renumbered densely over the entries still active (``orig`` maps back).
    orig = np.arange(n_links, dtype=np.int64)
    cap = np.asarray(capacity, np.float64)
    spare = cap.copy()  # capacity left after the frozen flows
    rounds = 0
    while ef.size:
        rounds += 1
        if ef.size < orig.size // 2:
            used_links, el = np.unique(el, return_inverse=True)
            orig, spare = orig[used_links], spare[used_links]
        nl = orig.size
        n_on = np.bincount(el, minlength=nl)
        share = np.full(nl, np.inf)
        on = n_on > 0
        share[on] = np.maximum(spare[on], 0.0) / n_on[on]
        se = share[el]
        lowest = np.full(n_flows, np.inf)  # per flow: smallest share on its path
        np.minimum.at(lowest, ef, se)
        limit = np.minimum(lowest, d)  # ... or its demand, if lower
        near = np.full(nl, np.inf)  # per link: smallest limit among its flows
        np.minimum.at(near, el, limit[ef])
        tight = on & (share <= near * (1.0 + REL_TOL))
        hit = tight[el]
        hf = ef[hit]
        newly = np.zeros(n_flows, np.bool_)
        newly[hf] = True
        rate[hf] = limit[hf]
        if hf.size:
            # The bottleneck: the first tight link along the path (one link per hop and flow).
            first = np.full(n_flows, np.iinfo(np.int32).max, np.int32)
            np.minimum.at(first, hf, eh[hit])
            sel = hit & (eh == first[ef])
            bott[ef[sel]] = orig[el[sel]]
            bhop[ef[sel]] = eh[sel]
        cand = np.flatnonzero(np.isfinite(lowest) & ~newly)
        by_demand = cand[d[cand] <= lowest[cand] * (1.0 + REL_TOL)]
        newly[by_demand] = True
        rate[by_demand] = d[by_demand]
        sel = newly[ef]
        spare -= np.bincount(el[sel], weights=rate[ef[sel]], minlength=nl)
        frozen |= newly
        ef, el, eh = ef[~sel], el[~sel], eh[~sel]
    return MaxMin(rate, bott, bhop, rounds)


def congestion_count(
    n_flows: int, flow: npt.NDArray[np.int64], link: npt.NDArray[np.int64], n_links: int
) -> npt.NDArray[np.float64]:
    """Hoefler et al.'s per-flow bandwidth: 1 / (most flows sharing one link of the path); 0 without entries."""
    count = np.bincount(link, minlength=n_links)
    worst = np.zeros(n_flows, np.int64)
    np.maximum.at(worst, flow, count[link])
    out = np.zeros(n_flows, np.float64)
    np.divide(1.0, worst, out=out, where=worst > 0)
    return out


# -- the prediction -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HotLink:
    """One directed link as :meth:`CongestionReport.hottest` lists it."""

    link: int
    src: str
    dst: str
    capacity_gbps: float
    load_gbps: float
    utilization: float
    flows: int
    bottlenecked: int
    """Flows whose bottleneck this link is."""
    xmit_wait: float
    """Fraction of time the port waits for credits."""
    xmit_wait_per_s: float
    """Predicted XmitWait ticks per second."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "capacity_gbps": round(self.capacity_gbps, 3),
            "load_gbps": round(self.load_gbps, 3),
            "utilization": round(self.utilization, 6),
            "flows": self.flows,
            "bottlenecked": self.bottlenecked,
            "xmit_wait": round(self.xmit_wait, 6),
            "xmit_wait_per_s": round(self.xmit_wait_per_s, 1),
        }


@dataclass(frozen=True)
class CongestionReport:
    """The model's answer for one pattern on one set of LFTs.

    Per flow: ``rate`` (bytes/s), ``ref_capacity`` (bytes/s of its first
    link, the "link rate" fractions refer to), ``bottleneck``. Per directed
    link: ``load`` (bytes/s), ``wait`` (fraction of time), ``flows_on``,
    ``tick_rate`` (XmitWait ticks per second of waiting). ``utilization``
    and ``xmit_wait`` are ``[node, port]`` arrays of the transmitting ports
    (the congestion-model prediction the exporters read).
    """

    fabric: Fabric
    pattern: Pattern
    links: DirectedLinks
    paths: FlowPaths
    rate: npt.NDArray[np.float64]
    ref_capacity: npt.NDArray[np.float64]
    bottleneck: npt.NDArray[np.int64]
    load: npt.NDArray[np.float64]
    wait: npt.NDArray[np.float64]
    flows_on: npt.NDArray[np.int64]
    tick_rate: npt.NDArray[np.float64]
    rounds: int = 0

    @property
    def n_flows(self) -> int:
        return self.pattern.n_flows

    @property
    def unrouted(self) -> int:
        return int(np.count_nonzero(~self.paths.delivered))

    @cached_property
    def rate_fraction(self) -> npt.NDArray[np.float64]:
        """Each flow's rate over its first link's capacity (0 when not delivered)."""
        out = np.zeros(self.rate.size)
        np.divide(self.rate, self.ref_capacity, out=out, where=self.ref_capacity > 0)
        return out

    @cached_property
    def link_utilization(self) -> npt.NDArray[np.float64]:
        cap = self.links.capacity
        out = np.zeros(cap.size)
        np.divide(self.load, cap, out=out, where=cap > 0)
        return out

    def _per_port(self, values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        out = np.zeros(self.fabric.port_exists.shape, np.float64)
        out[self.links.node, self.links.port] = values
        return out

    @cached_property
    def utilization(self) -> npt.NDArray[np.float64]:
        """``[node, port]``: transmit utilization 0..1."""
        return self._per_port(self.link_utilization)

    @cached_property
    def xmit_bytes(self) -> npt.NDArray[np.float64]:
        """``[node, port]``: transmitted bytes/s."""
        return self._per_port(self.load)

    @cached_property
    def xmit_wait(self) -> npt.NDArray[np.float64]:
        """``[node, port]``: predicted XmitWait ticks per second."""
        return self._per_port(self.wait * self.tick_rate)

    @cached_property
    def wait_fraction(self) -> npt.NDArray[np.float64]:
        """``[node, port]``: fraction of time the port waits for credits."""
        return self._per_port(self.wait)

    @cached_property
    def bottlenecked(self) -> npt.NDArray[np.int64]:
        """Per link: flows whose bottleneck it is."""
        b = self.bottleneck[self.bottleneck >= 0]
        return np.bincount(b, minlength=self.links.n_links)

    def flow_stats(self) -> dict[str, Any]:
        """Per-flow rates as fractions of the link rate (delivered flows), and counts."""
        ok = self.paths.delivered
        fr = self.rate_fraction[ok]
        util = self.link_utilization
        return {
            "flows": self.n_flows,
            "unrouted": self.unrouted,
            "min": float(fr.min()) if fr.size else 0.0,
            "mean": float(fr.mean()) if fr.size else 0.0,
            "max": float(fr.max()) if fr.size else 0.0,
            "full_rate": int(np.count_nonzero(fr >= 1.0 - 1e-6)),
            "aggregate_gbps": float(self.rate[ok].sum() * 8e-9),
            "saturated_links": int(np.count_nonzero(util >= 1.0 - 1e-6)),
            "waiting_ports": int(np.count_nonzero(self.wait > 1e-9)),
            "max_utilization": float(util.max(initial=0.0)),
            "max_xmit_wait": float(self.wait.max(initial=0.0)),
        }

    def hot_link(self, link: int) -> HotLink:
        """One link's figures, named."""
        f, lk = self.fabric, self.links
        return HotLink(
            link,
            f.port_name(int(lk.node[link]), int(lk.port[link])),
            f.port_name(int(lk.peer[link]), int(lk.peer_port[link])),
            float(lk.capacity[link] * 8e-9),
            float(self.load[link] * 8e-9),
            float(self.link_utilization[link]),
            int(self.flows_on[link]),
            int(self.bottlenecked[link]),
            float(self.wait[link]),
            float(self.wait[link] * self.tick_rate[link]),
        )

    def hottest(self, n: int = 10) -> list[HotLink]:
        """The ``n`` busiest links: by utilization, then flows bottlenecked there, then XmitWait."""
        util = self.link_utilization
        order = np.lexsort((-self.wait, -self.bottlenecked, -np.round(util, 9)))
        busy = order[(util[order] > 0) | (self.wait[order] > 0)][:n]
        return [self.hot_link(li) for li in busy.tolist()]

    def most_waiting(self, n: int = 10) -> list[HotLink]:
        """The ``n`` ports with the most predicted XmitWait ticks per second."""
        w = self.wait * self.tick_rate
        order = np.argsort(-w, kind="stable")
        return [self.hot_link(li) for li in order[w[order] > 0][:n].tolist()]

    def traffic(self, packet_bytes: int | None = None) -> ModelTraffic:
        """A :class:`ModelTraffic` that plays this prediction into the emulator's counters."""
        return ModelTraffic(self, packet_bytes)


def predict_congestion(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    pattern: Pattern,
    *,
    tick_hz: float | None = None,
    links: DirectedLinks | None = None,
) -> CongestionReport:
    """Route ``pattern`` through ``lft``, give every flow its max-min fair rate, predict load and XmitWait.

    ``tick_hz``: XmitWait ticks per second of waiting; None = one tick per
    4-byte word time of each link.
    """
    if tick_hz is not None and not (np.isfinite(tick_hz) and tick_hz > 0):
        raise FlowModelError(f"tick_hz {tick_hz} must be a positive number")
    lk = links if links is not None else directed_links(fabric)
    paths = trace_flows(fabric, lids, lft, pattern, lk)
    demand = np.asarray(pattern.demand, np.float64)
    mm = max_min_fair(pattern.n_flows, paths.flow, paths.link, paths.hop, lk.capacity, demand, paths.delivered)
    # float64 at run time; numpy's stub says intp whatever the weights (fixed upstream: numpy#31911)
    load: npt.NDArray[np.float64] = np.bincount(  # type: ignore[assignment]
        paths.link, weights=mm.rate[paths.flow], minlength=lk.n_links
    )
    flows_on = np.bincount(paths.link, minlength=lk.n_links)
    wait = _credit_wait(paths, mm, lk.capacity, demand, load)
    ref = np.where(paths.first_link >= 0, lk.capacity[np.maximum(paths.first_link, 0)], 0.0)
    ticks = lk.capacity / 4.0 if tick_hz is None else np.full(lk.n_links, float(tick_hz))
    return CongestionReport(
        fabric, pattern, lk, paths, mm.rate, ref, mm.bottleneck, load, wait, flows_on, ticks, mm.rounds
    )


def _credit_wait(
    paths: FlowPaths,
    mm: MaxMin,
    capacity: npt.NDArray[np.float64],
    demand: npt.NDArray[np.float64],
    load: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Per link: fraction of time its transmitter holds data but has no credits (module docstring)."""
    f, lk, h = paths.flow, paths.link, paths.hop
    down = mm.bottleneck_hop[f] > h
    f, lk = f[down], lk[down]
    want = np.minimum(demand[f], capacity[lk]) - mm.rate[f]
    blocked = np.bincount(lk, weights=np.maximum(want, 0.0), minlength=capacity.size)
    wait = np.zeros(capacity.size)
    ok = capacity > 0
    idle = 1.0 - load[ok] / capacity[ok]
    wait[ok] = np.clip(np.minimum(idle, blocked[ok] / capacity[ok]), 0.0, 1.0)
    wait[wait < REL_TOL] = 0.0
    return wait


# -- effective bisection bandwidth ----------------------------------------------------------------------


@dataclass(frozen=True)
class EbbReport:
    """Effective bisection bandwidth over ``samples`` random bisections (seeds ``seed .. seed + samples - 1``).

    ``paper[i]``: mean per-flow bandwidth of bisection ``i`` with Hoefler et
    al.'s congestion count; ``maxmin[i]``: mean max-min rate over link rate.
    Undelivered flows count as 0.
    """

    hosts: int
    seed: int
    paper: npt.NDArray[np.float64]
    maxmin: npt.NDArray[np.float64]
    unrouted: int

    @property
    def samples(self) -> int:
        return int(self.paper.size)

    @property
    def ebb(self) -> float:
        """eBB as Hoefler et al. define it, a fraction of full bandwidth."""
        return float(self.paper.mean()) if self.paper.size else 0.0

    @property
    def ebb_maxmin(self) -> float:
        return float(self.maxmin.mean()) if self.maxmin.size else 0.0

    def as_dict(self) -> dict[str, Any]:
        def stats(a: npt.NDArray[np.float64]) -> dict[str, float]:
            if not a.size:
                return {"mean": 0.0, "min": 0.0, "max": 0.0, "stdev": 0.0}
            return {
                "mean": round(float(a.mean()), 6),
                "min": round(float(a.min()), 6),
                "max": round(float(a.max()), 6),
                "stdev": round(float(a.std()), 6),
            }

        return {
            "hosts": self.hosts,
            "samples": self.samples,
            "seed": self.seed,
            "ebb": round(self.ebb, 6),
            "ebb_maxmin": round(self.ebb_maxmin, 6),
            "paper": stats(self.paper),
            "maxmin": stats(self.maxmin),
            "unrouted_flows": self.unrouted,
        }


def effective_bisection_bandwidth(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    *,
    samples: int = 100,
    seed: int = 0,
    flows_per_batch: int = _FLOWS_PER_BATCH,
) -> EbbReport:
    """eBB over random bisections ``random-bisection:seed+i``, ``i < samples``.

    Bisections are batched: the flows of several are walked at once and their
    links kept apart (link ``l`` of bisection ``i`` is ``i * L + l``), so the
    max-min filling of the batch is that of each bisection on its own.
    """
    if samples < 1:
        raise FlowModelError(f"eBB: samples {samples} must be >= 1")
    if seed < 0:
        raise FlowModelError(f"eBB: seed {seed} must be >= 0")
    lk = directed_links(fabric)
    t = route_tables(fabric, lids, lft)
    first = random_bisection(fabric, lids, seed)
    per = max(first.n_flows, 1)
    batch = max(1, flows_per_batch // per)
    n_hosts = int(hosts(fabric, lids).shape[0])
    paper = np.zeros(samples)
    maxmin = np.zeros(samples)
    unrouted = 0
    for s0 in range(0, samples, batch):
        seeds = range(seed + s0, seed + min(samples, s0 + batch))
        pats = [first if s == seed else random_bisection(fabric, lids, s) for s in seeds]
        nb = len(pats)
        node = np.concatenate([p.src_node for p in pats])
        port = np.concatenate([p.src_port for p in pats])
        lid = np.concatenate([p.dst_lid for p in pats])
        sample = np.repeat(np.arange(nb, dtype=np.int64), [p.n_flows for p in pats])
        paths = _trace(fabric, t, lk, lft, node, port, lid)
        unrouted += int(np.count_nonzero(~paths.delivered))
        glink = sample[paths.flow] * lk.n_links + paths.link
        bw = congestion_count(node.size, paths.flow, glink, nb * lk.n_links)
        cap = np.tile(lk.capacity, nb)
        mm = max_min_fair(node.size, paths.flow, glink, paths.hop, cap, np.full(node.size, np.inf), paths.delivered)
        ref = np.where(paths.first_link >= 0, lk.capacity[np.maximum(paths.first_link, 0)], 0.0)
        frac = np.zeros(node.size)
        np.divide(mm.rate, ref, out=frac, where=ref > 0)
        cnt = np.bincount(sample, minlength=nb).astype(np.float64)
        cnt[cnt == 0] = 1.0
        paper[s0 : s0 + nb] = np.bincount(sample, weights=bw, minlength=nb) / cnt
        maxmin[s0 : s0 + nb] = np.bincount(sample, weights=frac, minlength=nb) / cnt
    return EbbReport(n_hosts, seed, paper, maxmin, unrouted)


# -- the emulator's counters ----------------------------------------------------------------------------


@dataclass
class ModelTraffic:
    """A :class:`fabric.emulator.TrafficSource` playing a :class:`CongestionReport` into the PMA counters.

    Every transmitting port sends its predicted load (bytes/s), in packets of
    ``packet_bytes`` (default: the port's active MTU, else 4096), and its
    XmitWait grows by the predicted ticks per second. The rates are fixed: a
    link the emulator takes down stops counting (the emulator masks it), but
    the flows over it are not re-routed; predict again for new LFTs.
    """

    report: CongestionReport
    packet_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.packet_bytes is not None and self.packet_bytes <= 0:
            raise FlowModelError(f"packet size {self.packet_bytes} must be > 0")
        r = self.report
        mtu = r.fabric.mtu_active
        size = np.zeros(mtu.shape, np.float64)
        for code, nbytes in MTU_BYTES.items():
            size[mtu == code] = nbytes
        size[size == 0] = 4096.0
        if self.packet_bytes is not None:
            size[:] = float(self.packet_bytes)
        self._bytes = r.xmit_bytes
        self._pkts = r.xmit_bytes / size
        self._wait = r.xmit_wait

    def rates(
        self, emu: EmulatedFabric
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        shape = emu.fabric.port_exists.shape
        if shape != self._bytes.shape:
            raise FlowModelError(f"prediction for ports {self._bytes.shape}, the emulated fabric has {shape}")
        return self._bytes, self._pkts, self._wait
