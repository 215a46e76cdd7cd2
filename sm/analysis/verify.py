"""Route verification: trace (source end port, destination LID) pairs through the LFTs.

Forwarding is by destination LID only, so the path from a source depends
only on the switch it enters: :func:`verify_routes` resolves every
(switch, LID) cell once, block of LIDs by block, following the LFT hop by
hop with numpy, and weighs each cell by the end ports that enter the fabric
at that switch. A pair fails when its packet meets an LFT entry 255 (no
route), a port whose link is down or absent, a CA that does not own the LID,
port 0 on a switch that does not own the LID, or a loop. Only pairs the
topology connects (same set of switches joined by up links) count as
failures when they fail.

Hop counts are links crossed from the source end port to the destination
end port: host -> leaf -> host is 2; a switch's own port 0 starts at 0.

:func:`trace_route` follows one pair and names every hop;
:func:`link_loads` and :func:`shift_quality` count routes per directed link.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import Fabric, NodeType
from fabric.shape import components
from sm.lidmap import LidMap
from sm.routing.base import NO_ROUTE, Lft

MAX_FAILURES = 50
"""Failure examples kept in a :class:`VerifyReport` (the counts are always complete)."""

_CELLS_PER_BLOCK = 1 << 19


class Status(IntEnum):
    """Outcome of following a route."""

    PENDING = 0
    DELIVERED = 1
    NO_ROUTE = 2
    """The LFT entry is 255."""
    DEAD_PORT = 3
    """The LFT names a port whose link is down or absent (or a port the switch lacks)."""
    WRONG_CA = 4
    """The LFT leads to a CA port that does not own the LID."""
    NOT_OWN = 5
    """The LFT says port 0 on a switch that does not own the LID."""
    LOOP = 6
    """The packet comes back to a switch it crossed and never arrives."""


FAILURE_TEXT = {
    Status.NO_ROUTE: "no route (LFT entry 255)",
    Status.DEAD_PORT: "port with a down or absent link",
    Status.WRONG_CA: "port leads to a CA that does not own the LID",
    Status.NOT_OWN: "port 0 for a LID the switch does not own",
    Status.LOOP: "routing loop",
}


class VerifyError(IbfmError):
    """Bad arguments to a verification call (an unknown node, port or LID)."""


class TraceError(IbfmError):
    """A traced route breaks; ``hops`` holds the path up to the break."""

    def __init__(self, message: str, hops: list[Hop], status: Status) -> None:
        super().__init__(message)
        self.hops = hops
        self.status = status


class Hop(NamedTuple):
    """One node on a route: entered on ``in_port``, left on ``out_port``.

    Port 0 stands for the node itself: the source has ``in_port`` 0, the
    destination ``out_port`` 0.
    """

    node: int
    in_port: int
    out_port: int


@dataclass(frozen=True)
class RouteFailure:
    """One failing (source, LID) pair, named for an operator."""

    status: Status
    src: str
    """A source end port whose route fails (others entering at the same switch fail alike)."""
    lid: int
    dst: str
    """The end port owning the LID."""
    switch: str
    """Where the route breaks; for a loop, a switch on the loop."""
    port: int
    """The LFT entry there."""
    detail: str = ""

    def __str__(self) -> str:
        s = f"{self.src} -> LID {self.lid} ({self.dst}): {FAILURE_TEXT[self.status]} at {self.switch}"
        s += f" port {self.port}"
        return s + (f" ({self.detail})" if self.detail else "")


@dataclass
class VerifyReport:
    """Counts over every (source end port, destination LID) pair, self pairs left out."""

    sources: int
    """End ports with a LID that hang on the fabric."""
    lids: int
    """Destination LIDs (every LID in use)."""
    pairs: int = 0
    """Pairs the topology connects."""
    reachable: int = 0
    unreachable: int = 0
    """Connected pairs whose route fails."""
    disconnected: int = 0
    """Pairs the topology does not connect (not failures)."""
    host_pairs: int = 0
    """Connected pairs from a CA port to a CA LID."""
    host_unreachable: int = 0
    switch_pairs_unreachable: int = 0
    """Connected pairs from a switch to a switch LID whose route fails. No data flows there (a
    switch sources only management traffic, on VL15, and answers requests toward their CA), and
    up/down routing cannot serve two roots, so they are reported but do not make ``ok`` false."""
    by_status: dict[Status, int] = field(default_factory=dict)
    max_hops: int = 0
    mean_hops: float = 0.0
    failures: list[RouteFailure] = field(default_factory=list)
    """Up to :data:`MAX_FAILURES` examples."""

    @property
    def ok(self) -> bool:
        """Every connected pair with a CA at either end is routed."""
        return self.unreachable - self.switch_pairs_unreachable == 0

    def summary(self) -> str:
        s = (
            f"{self.pairs} connected pairs ({self.sources} sources x {self.lids} LIDs): "
            f"{self.reachable} reachable, {self.unreachable} unreachable "
            f"({self.host_unreachable} of {self.host_pairs} host pairs, "
            f"{self.switch_pairs_unreachable} switch-to-switch)"
        )
        if self.by_status:
            s += "; " + ", ".join(f"{FAILURE_TEXT[k]}: {v}" for k, v in sorted(self.by_status.items()))
        return s + f"; hops max {self.max_hops}, mean {self.mean_hops:.3f}"


# -- forwarding tables as lookup arrays -------------------------------------------------------------

_TO_CA = -1
_TO_SELF = -2
_NO_ROUTE = -3
_DEAD = -4


@dataclass(frozen=True)
class RouteTables:
    """What the LFT entry ``port`` of switch row ``x`` leads to, for all 256 entry values."""

    sw: npt.NDArray[np.intp]
    row_of: npt.NDArray[np.int64]
    code: npt.NDArray[np.int32]
    """``[row, port]``: next row (>= 0), or _TO_CA, _TO_SELF, _NO_ROUTE, _DEAD."""
    ca_key: npt.NDArray[np.int64]
    """``[row, port]``: key of the CA port cabled there (node * 256 + port), else -1."""
    own_key: npt.NDArray[np.int64]
    """``[lid]``: key of the end port owning the LID, -1 if unused."""
    self_key: npt.NDArray[np.int64]
    """``[row]``: key of the switch's port 0."""
    comp: npt.NDArray[np.int64]
    """``[row]``: connected-set label of each switch."""


def route_tables(fabric: Fabric, lids: LidMap, lft: Lft) -> RouteTables:
    sw = fabric.switches
    n = sw.size
    if lft.shape != (n, lids.max_lid + 1):
        raise VerifyError(f"LFT shape {lft.shape} does not match {n} switches x {lids.max_lid + 1} LIDs")
    row_of = np.full(fabric.n_nodes, -1, np.int64)
    row_of[sw] = np.arange(n)
    pmax = fabric.max_port + 1
    up = fabric.up_mask()[sw]
    peer = np.where(up, fabric.peer_node[sw], 0).astype(np.int64)
    peer_port = fabric.peer_port[sw].astype(np.int64)
    peer_row = row_of[peer]
    code = np.full((n, 256), _DEAD, np.int32)
    code[:, :pmax] = np.where(up & (peer_row >= 0), peer_row, np.where(up, _TO_CA, _DEAD))
    code[:, 0] = _TO_SELF
    code[:, NO_ROUTE] = _NO_ROUTE
    ca_key = np.full((n, 256), -1, np.int64)
    ca_key[:, :pmax] = np.where(up & (peer_row < 0), peer * 256 + peer_port, -1)
    used = lids.owner_node >= 0
    own_key = np.where(used, lids.owner_node.astype(np.int64) * 256 + lids.owner_port, -1)
    sl = fabric.switch_links()
    comp = components(n, row_of[sl[:, 0]], row_of[sl[:, 2]]) if n else np.zeros(0, np.int64)
    return RouteTables(sw, row_of, code, ca_key, own_key, sw.astype(np.int64) * 256, comp)


def _classify(
    t: RouteTables, rows: npt.NDArray[np.int64], lid: npt.NDArray[np.int64], port: npt.NDArray[np.uint8]
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int8]]:
    """One step: the next row (where the status is PENDING) and the status."""
    code = t.code[rows, port]
    status = np.zeros(code.shape, np.int8)
    status[code == _NO_ROUTE] = Status.NO_ROUTE
    status[code == _DEAD] = Status.DEAD_PORT
    to_ca = code == _TO_CA
    hit = t.ca_key[rows[to_ca], port[to_ca]] == t.own_key[lid[to_ca]]
    status[to_ca] = np.where(hit, Status.DELIVERED, Status.WRONG_CA)
    to_self = code == _TO_SELF
    hit = t.own_key[lid[to_self]] == t.self_key[rows[to_self]]
    status[to_self] = np.where(hit, Status.DELIVERED, Status.NOT_OWN)
    return code, status


# -- every pair --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sources:
    """End ports with a LID, by the switch row they enter the fabric at."""

    n: int
    per_row: npt.NDArray[np.int64]
    """Sources entering at each row (the switch itself and its CA ports)."""
    ca_per_row: npt.NDArray[np.int64]
    by_row: list[list[tuple[str, range]]]
    """Per row: the sources entering there, as (end port name, its LIDs)."""
    self_row: npt.NDArray[np.int64]
    self_lid: npt.NDArray[np.int64]
    self_ca: npt.NDArray[np.bool_]
    """(row, LID) cells of self pairs: a source and a LID it owns; whether the source is a CA."""
    direct: list[tuple[int, int, int, int]]
    """CA ports cabled straight to another CA port: (node, port, peer node, peer port)."""


def _sources(fabric: Fabric, lids: LidMap, t: RouteTables) -> _Sources:
    ep = np.argwhere(lids.base > 0).astype(np.int64)
    node, port = ep[:, 0], ep[:, 1]
    is_sw = fabric.node_type[node] == NodeType.SWITCH
    up = fabric.up_mask()[node, port]
    peer = np.where(up, fabric.peer_node[node, port], 0).astype(np.int64)
    peer_row = t.row_of[peer]
    row = np.where(is_sw, t.row_of[node], np.where(up, peer_row, -1))
    n_sw = t.sw.size
    entering = row >= 0
    per_row = np.bincount(row[entering], minlength=n_sw).astype(np.int64)
    ca_per_row = np.bincount(row[entering & ~is_sw], minlength=n_sw).astype(np.int64)
    by_row: list[list[tuple[str, range]]] = [[] for _ in range(n_sw)]
    for i in np.flatnonzero(entering).tolist():
        a, b = int(node[i]), int(port[i])
        by_row[int(row[i])].append((fabric.port_name(a, b), lids.lids_of(a, b)))
    span = 1 << lids.lmc
    k = np.flatnonzero(entering)
    self_row = np.repeat(row[k], span)
    self_lid = (lids.base[node[k], port[k]].astype(np.int64)[:, None] + np.arange(span)).ravel()
    self_ca = np.repeat(~is_sw[k], span)
    direct_mask = ~is_sw & up & (peer_row < 0)
    direct = [
        (int(a), int(b), int(fabric.peer_node[a, b]), int(fabric.peer_port[a, b]))
        for a, b in zip(node[direct_mask].tolist(), port[direct_mask].tolist(), strict=True)
    ]
    return _Sources(
        int(entering.sum() + direct_mask.sum()), per_row, ca_per_row, by_row, self_row, self_lid, self_ca, direct
    )


def _lid_comp(fabric: Fabric, lids: LidMap, t: RouteTables) -> npt.NDArray[np.int64]:
    """Connected-set label of each LID's end port; -1 (unused, or hangs on no switch)."""
    on = lids.owner_node.astype(np.int64)
    op = lids.owner_port.astype(np.int64)
    used = on >= 0
    onz, opz = np.where(used, on, 0), np.where(used, op, 0)
    is_sw = fabric.node_type[onz] == NodeType.SWITCH
    up = fabric.up_mask()[onz, opz]
    peer_row = t.row_of[np.where(up, fabric.peer_node[onz, opz], 0)]
    row = np.where(is_sw, t.row_of[onz], np.where(up, peer_row, -1))
    if not t.comp.size:  # no switch at all (the SM's own link is down): no LID hangs on one
        return np.full(on.shape, -1, np.int64)
    return np.where(used & (row >= 0), t.comp[np.maximum(row, 0)], -1)


def _resolve_block(
    t: RouteTables, lft: Lft, lid0: int, lid1: int
) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Status, hops and breaking row of every (row, LID) cell for LIDs ``lid0 .. lid1 - 1``."""
    n, b = t.sw.size, lid1 - lid0
    rows = np.repeat(np.arange(n, dtype=np.int64), b)
    lid = np.tile(np.arange(lid0, lid1, dtype=np.int64), n)
    port = lft[:, lid0:lid1].ravel()
    code, status = _classify(t, rows, lid, port)
    hops = (status == Status.DELIVERED).astype(np.int32) * (code == _TO_CA)
    at = rows.copy()
    pend = np.flatnonzero(status == Status.PENDING)
    nxt = code[pend].astype(np.int64) * b + (pend % b)
    # Resolve cells from their next cell until nothing changes; what stays pending loops.
    while pend.size:
        s = status[nxt]
        done = s != Status.PENDING
        if not done.any():
            break
        p, q = pend[done], nxt[done]
        status[p] = s[done]
        hops[p] = hops[q] + 1
        at[p] = at[q]
        pend, nxt = pend[~done], nxt[~done]
    status[pend] = Status.LOOP
    return status.reshape(n, b), hops.reshape(n, b), at.reshape(n, b)


def _loop_path(fabric: Fabric, t: RouteTables, lft: Lft, row: int, lid: int) -> tuple[int, str]:
    """Row on the loop reached from ``row`` towards ``lid``, and the loop as switch names."""
    seen: dict[int, int] = {}
    path: list[int] = []
    while row not in seen:
        seen[row] = len(path)
        path.append(row)
        row = int(t.code[row, lft[row, lid]])
    cyc = path[seen[row] :]
    names = [fabric.names[int(t.sw[r])] for r in cyc]
    return cyc[0], " -> ".join([*names, names[0]])


def verify_routes(fabric: Fabric, lids: LidMap, lft: Lft, *, max_failures: int = MAX_FAILURES) -> VerifyReport:
    """Check every (source end port, destination LID) pair; see the module docstring."""
    t = route_tables(fabric, lids, lft)
    src = _sources(fabric, lids, t)
    used = lids.owner_node >= 0
    n_lids = int(used.sum())
    rep = VerifyReport(sources=src.n, lids=n_lids)
    lcomp = _lid_comp(fabric, lids, t)
    lid_is_ca = np.zeros(lids.max_lid + 1, np.bool_)
    lid_is_ca[used] = fabric.node_type[lids.owner_node[used]] == NodeType.CA
    n = t.sw.size
    by_status = np.zeros(len(Status), np.int64)
    hop_sum = 0
    total_pairs = 0
    if n:
        b = max(64, (_CELLS_PER_BLOCK // n) // 64 * 64)
        ws = src.per_row.astype(np.int64)
        wca = src.ca_per_row.astype(np.int64)
        for lid0 in range(0, lids.max_lid + 1, b):
            lid1 = min(lid0 + b, lids.max_lid + 1)
            blk_used = used[lid0:lid1]
            if not blk_used.any():
                continue
            status, hops, at = _resolve_block(t, lft, lid0, lid1)
            w = np.broadcast_to(ws[:, None], status.shape).copy()
            w_ca = np.broadcast_to(wca[:, None], status.shape).copy()
            sel = (src.self_lid >= lid0) & (src.self_lid < lid1)
            np.subtract.at(w, (src.self_row[sel], src.self_lid[sel] - lid0), 1)
            np.subtract.at(w_ca, (src.self_row[sel & src.self_ca], src.self_lid[sel & src.self_ca] - lid0), 1)
            w[:, ~blk_used] = 0
            w_ca[:, ~blk_used] = 0
            total_pairs += int(w.sum())
            bc = lcomp[lid0:lid1]
            conn = (t.comp[:, None] == bc[None, :]) & (bc[None, :] >= 0)
            wc = np.where(conn, w, 0)
            wc_ca = np.where(conn, w_ca, 0)
            by_status += np.bincount(status.ravel(), weights=wc.ravel(), minlength=len(Status)).astype(np.int64)
            ok = status == Status.DELIVERED
            hop_sum += int((hops * wc)[ok].sum() + wc_ca[ok].sum())
            if ok.any():
                mh = max(
                    int(hops[ok & (wc - wc_ca > 0)].max(initial=0)),
                    int(hops[ok & (wc_ca > 0)].max(initial=-1)) + 1,
                )
                rep.max_hops = max(rep.max_hops, mh)
            hl = lid_is_ca[lid0:lid1][None, :]
            rep.host_pairs += int(wc_ca[:, hl[0]].sum())
            rep.host_unreachable += int(np.where(~ok & hl, wc_ca, 0).sum())
            rep.switch_pairs_unreachable += int(np.where(~ok & ~hl, wc - wc_ca, 0).sum())
            if len(rep.failures) < max_failures:
                # Examples that matter first: pairs with a CA at either end.
                bad = np.argwhere(~ok & ((wc_ca > 0) | (hl & (wc > 0))))
                for r, c in bad[: max_failures - len(rep.failures)].tolist():
                    rep.failures.append(_failure(fabric, lids, t, lft, src, status, at, r, c, lid0))
    # CA ports cabled straight to a CA port reach exactly its LIDs, in one hop.
    for a, b_, m, q in src.direct:
        k = len(lids.lids_of(m, q))
        total_pairs += n_lids - len(lids.lids_of(a, b_))
        by_status[Status.DELIVERED] += k
        hop_sum += k
        rep.host_pairs += k
        rep.max_hops = max(rep.max_hops, 1 if k else 0)
    rep.reachable = int(by_status[Status.DELIVERED])
    rep.unreachable = int(by_status[Status.DELIVERED + 1 :].sum())
    rep.pairs = rep.reachable + rep.unreachable
    rep.disconnected = total_pairs - rep.pairs
    rep.by_status = {Status(k): int(v) for k, v in enumerate(by_status.tolist()) if k > 1 and v}
    rep.mean_hops = hop_sum / rep.reachable if rep.reachable else 0.0
    return rep


def _failure(
    fabric: Fabric,
    lids: LidMap,
    t: RouteTables,
    lft: Lft,
    src: _Sources,
    status: npt.NDArray[np.int8],
    at: npt.NDArray[np.int64],
    r: int,
    c: int,
    lid0: int,
) -> RouteFailure:
    lid = lid0 + c
    st = Status(int(status[r, c]))
    dst = fabric.port_name(int(lids.owner_node[lid]), int(lids.owner_port[lid]))
    if st == Status.LOOP:
        row, detail = _loop_path(fabric, t, lft, r, lid)
    else:
        row, detail = int(at[r, c]), ""
    name = next(n for n, own in src.by_row[r] if lid not in own)
    return RouteFailure(st, name, lid, dst, fabric.names[int(t.sw[row])], int(lft[row, lid]), detail)


# -- one pair ----------------------------------------------------------------------------------------


def trace_route(fabric: Fabric, lids: LidMap, lft: Lft, src_node: int, src_port: int, dst_lid: int) -> list[Hop]:
    """Hops of the route from end port (``src_node``, ``src_port``) to ``dst_lid``.

    A switch sends from port 0. Raises :class:`TraceError` (with the hops so
    far) where the route breaks, :class:`VerifyError` for a bad argument.
    """
    sw = fabric.switches
    if lft.shape != (sw.size, lids.max_lid + 1):
        raise VerifyError(f"LFT shape {lft.shape} does not match {sw.size} switches x {lids.max_lid + 1} LIDs")
    if not 0 <= src_node < fabric.n_nodes:
        raise VerifyError(f"trace: no node {src_node}")
    where = f"trace {fabric.port_name(src_node, src_port)} -> LID {dst_lid}"
    if not 0 < dst_lid <= lids.max_lid or lids.owner_node[dst_lid] < 0:
        raise VerifyError(f"{where}: LID {dst_lid} is not assigned")
    owner = (int(lids.owner_node[dst_lid]), int(lids.owner_port[dst_lid]))
    is_sw = fabric.is_switch(src_node)
    if is_sw and src_port != 0:
        raise VerifyError(f"{where}: a switch sends from port 0")
    if not is_sw and not (1 <= src_port <= fabric.nports[src_node]):
        raise VerifyError(f"{where}: {fabric.names[src_node]!r} has no port {src_port}")
    if (src_node, src_port) == owner:
        return [Hop(src_node, 0, 0)]
    hops: list[Hop] = []

    def fail(st: Status, what: str) -> TraceError:
        return TraceError(f"{where}: {what} after {len(hops)} hops", hops, st)

    if is_sw:
        node, in_port = src_node, 0
    else:
        if not fabric.is_up(src_node, src_port):
            raise fail(Status.DEAD_PORT, f"source port {fabric.port_name(src_node, src_port)} is not up")
        hops.append(Hop(src_node, 0, src_port))
        node = int(fabric.peer_node[src_node, src_port])
        in_port = int(fabric.peer_port[src_node, src_port])
    seen: set[int] = set()
    while True:
        if not fabric.is_switch(node):
            if (node, in_port) == owner:
                hops.append(Hop(node, in_port, 0))
                return hops
            raise fail(Status.WRONG_CA, f"arrived at {fabric.port_name(node, in_port)}, which does not own it")
        if node in seen:
            raise fail(Status.LOOP, f"routing loop: back at {fabric.names[node]}")
        seen.add(node)
        out = int(lft[int(np.searchsorted(sw, node)), dst_lid])
        hops.append(Hop(node, in_port, out))
        if out == 0:
            if owner == (node, 0):
                return hops
            raise fail(Status.NOT_OWN, f"{fabric.names[node]} says port 0 but does not own the LID")
        if out == NO_ROUTE:
            raise fail(Status.NO_ROUTE, f"no route at {fabric.names[node]} (LFT entry 255)")
        if out > fabric.nports[node] or not fabric.is_up(node, out):
            raise fail(Status.DEAD_PORT, f"{fabric.port_name(node, out)} has no up link")
        node, in_port = int(fabric.peer_node[node, out]), int(fabric.peer_port[node, out])


# -- routes per link ---------------------------------------------------------------------------------

HopCallback = Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint8]], None]


def walk_routes(
    t: RouteTables, lft: Lft, rows: npt.NDArray[np.int64], lid: npt.NDArray[np.int64], on_hop: HopCallback
) -> npt.NDArray[np.int8]:
    """Follow routes from switch rows; ``on_hop(pair indices, rows, ports)`` for every link left on.

    Returns each pair's final status.
    """
    k = rows.size
    final = np.zeros(k, np.int8)
    act = np.flatnonzero(rows >= 0)
    final[rows < 0] = Status.DEAD_PORT
    cur = rows[act]
    for _ in range(t.sw.size + 1):
        if act.size == 0:
            break
        lk = lid[act]
        port = lft[cur, lk]
        code, status = _classify(t, cur, lk, port)
        crossed = (code >= 0) | (code == _TO_CA)
        if crossed.any():
            on_hop(act[crossed], cur[crossed], port[crossed])
        done = status != Status.PENDING
        final[act[done]] = status[done]
        act, cur = act[~done], code[~done].astype(np.int64)
    final[act] = Status.LOOP
    return final


def switch_channels(t: RouteTables) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Directed inter-switch links (channels), numbered ``0..n-1`` in (row, port) order.

    Returns ``chan_id[row, entry]``, the channel that LFT entry ``entry`` of
    switch row ``row`` leaves on (-1 for every other of the 256 entry values),
    and each channel's row and port; ``t.code[row, port]`` is the row it leads to.
    """
    is_chan = t.code >= 0
    row, port = np.nonzero(is_chan)
    chan_id = np.full(is_chan.shape, -1, np.int64)
    chan_id[row, port] = np.arange(row.size)
    return chan_id, row, port


def entry_rows(
    fabric: Fabric, t: RouteTables, node: npt.NDArray[np.int64], port: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Row each source end port's packets start from; -1 if it hangs on no switch."""
    is_sw = fabric.node_type[node] == NodeType.SWITCH
    up = fabric.up_mask()[node, port]
    peer_row = t.row_of[np.where(up, fabric.peer_node[node, port], 0)]
    return np.where(is_sw, t.row_of[node], np.where(up, peer_row, -1))


def link_loads(fabric: Fabric, lids: LidMap, lft: Lft, pairs: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Routes per directed link: ``loads[node, port]`` counts the routes leaving ``node`` on ``port``.

    ``pairs`` is an ``(K, 3)`` array of (source node, source port, destination
    LID); a switch sends from port 0. A CA source's own port counts too; a
    pair whose source owns the LID crosses no link. A route that breaks
    counts the links it crossed before the break; one caught in a loop is
    given up after ``n_switches + 1`` hops.
    """
    t = route_tables(fabric, lids, lft)
    pr = np.asarray(pairs, np.int64).reshape(-1, 3)
    node, port, lid = pr[:, 0], pr[:, 1], pr[:, 2]
    if pr.size and (node.min() < 0 or node.max() >= fabric.n_nodes):
        raise VerifyError("link_loads: source node out of range")
    if pr.size and (port.min() < 0 or port.max() > fabric.max_port):
        raise VerifyError("link_loads: source port out of range")
    if pr.size and (lid.min() < 1 or lid.max() > lids.max_lid):
        raise VerifyError(f"link_loads: destination LID outside 1..{lids.max_lid}")
    # A packet to the sender's own LID never leaves the port.
    other = t.own_key[lid] != node * 256 + port
    node, port, lid = node[other], port[other], lid[other]
    loads = np.zeros((fabric.n_nodes, fabric.max_port + 1), np.int64)
    ca_src = (fabric.node_type[node] == NodeType.CA) & fabric.up_mask()[node, port]
    np.add.at(loads, (node[ca_src], port[ca_src]), 1)
    acc = np.zeros(t.sw.size * 256, np.int64)

    def on_hop(_idx: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], ports: npt.NDArray[np.uint8]) -> None:
        acc[:] += np.bincount(rows * 256 + ports, minlength=acc.size)

    walk_routes(t, lft, entry_rows(fabric, t, node, port), lid, on_hop)
    per_sw = acc.reshape(-1, 256)[:, : fabric.max_port + 1]
    loads[t.sw] += per_sw
    return loads


@dataclass(frozen=True)
class ShiftQuality:
    """Routes per directed inter-switch link under shift permutations of the hosts.

    Host ``i`` sends to host ``(i + s) mod N`` (CA ports with a LID, in node
    then port order). Host links carry one route each and are left out.
    """

    hosts: int
    shifts: int
    """Shifts evaluated."""
    total_shifts: int
    """``N - 1``; ``shifts < total_shifts`` means a random sample of shifts."""
    max_load: int
    """Most routes on one directed inter-switch link in any evaluated shift."""
    mean_load: float
    """Routes per directed inter-switch link, averaged over all links and shifts."""
    mean_max_load: float
    """Each shift's most loaded link, averaged over shifts (1.0 = every shift contention-free)."""
    unrouted: int
    """Host pairs whose route breaks."""

    @property
    def sampled(self) -> bool:
        return self.shifts < self.total_shifts


def shift_quality(
    fabric: Fabric,
    lids: LidMap,
    lft: Lft,
    *,
    max_shifts: int | None = None,
    seed: int = 0,
    pairs_per_batch: int = 1 << 20,
) -> ShiftQuality:
    """Evaluate all shifts ``1 .. N-1``, or ``max_shifts`` of them drawn with ``seed``."""
    t = route_tables(fabric, lids, lft)
    ep = np.argwhere(lids.base > 0).astype(np.int64)
    ep = ep[fabric.node_type[ep[:, 0]] == NodeType.CA]
    n_hosts = ep.shape[0]
    total = max(n_hosts - 1, 0)
    shifts = np.arange(1, n_hosts, dtype=np.int64)
    if max_shifts is not None and max_shifts < total:
        rng = np.random.default_rng(seed)
        shifts = np.sort(rng.choice(shifts, size=max_shifts, replace=False))
    dst_lid = lids.base[ep[:, 0], ep[:, 1]].astype(np.int64)
    entry = entry_rows(fabric, t, ep[:, 0], ep[:, 1])
    link_id, link_row, _ = switch_channels(t)
    n_links = int(link_row.size)
    max_load, load_sum, max_sum, unrouted = 0, 0.0, 0.0, 0
    per_batch = max(1, pairs_per_batch // max(n_hosts, 1))
    hosts = np.arange(n_hosts, dtype=np.int64)
    for s0 in range(0, shifts.size, per_batch):
        batch = shifts[s0 : s0 + per_batch]
        nb = batch.size
        src = np.tile(hosts, nb)
        which = np.repeat(np.arange(nb, dtype=np.int64), n_hosts)
        dst = (src + batch[which]) % n_hosts
        acc = np.zeros(nb * max(n_links, 1), np.int64)

        def on_hop(
            idx: npt.NDArray[np.int64],
            rows: npt.NDArray[np.int64],
            ports: npt.NDArray[np.uint8],
            acc: npt.NDArray[np.int64] = acc,
            which: npt.NDArray[np.int64] = which,
        ) -> None:
            li = link_id[rows, ports]
            keep = li >= 0
            acc[:] += np.bincount(which[idx[keep]] * n_links + li[keep], minlength=acc.size)

        final = walk_routes(t, lft, entry[src], dst_lid[dst], on_hop)
        unrouted += int((final != Status.DELIVERED).sum())
        if n_links:
            per_shift = acc.reshape(nb, n_links)
            mx = per_shift.max(axis=1)
            max_load = max(max_load, int(mx.max()))
            max_sum += float(mx.sum())
            load_sum += float(per_shift.sum()) / n_links
    ns = max(int(shifts.size), 1)
    return ShiftQuality(n_hosts, int(shifts.size), total, max_load, load_sum / ns, max_sum / ns, unrouted)
