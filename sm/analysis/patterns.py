"""Traffic patterns for the congestion model: flows (source end port, destination LID, demand).

The hosts a pattern addresses are the CA ports that own a LID and whose
link is up, in node then port order (host ``i`` below). Each pattern is a
:class:`Pattern`: flat arrays with one row per flow. A demand is in bytes/s;
``inf`` means greedy (the flow sends as fast as the fabric lets it), the
default of every named pattern, which is what throughput studies and the
effective bisection bandwidth assume.

Specs, as ``ibfm congestion --pattern`` takes them:

- ``shift:S``: host ``i`` sends to host ``(i + S) mod N``.
- ``random-permutation[:SEED]``: a random permutation without fixed points.
- ``random-bisection[:SEED]``: the hosts split at random into two halves,
  paired off; each pair exchanges in both directions (full duplex), so
  every host sends one flow and receives one. With an odd count one host
  stays out.
- ``all-to-all``: every host to every other host.
- ``incast:N[:DST]``: ``N`` senders, spread evenly over the other hosts, to
  host ``DST`` (default 0): the hotspot.
- ``ring``: host ``i`` to host ``i + 1`` (flat ring all-reduce; ``shift:1``).
- ``ring-per-rail``: a ring per rail: HCA ``r`` of host ``h`` sends to HCA
  ``r`` of host ``h + 1``. HCAs of one host share a SystemImageGUID (or, when
  none do, the first word of the NodeDescription, ``"dgx-017 mlx5_3"``);
  the rail is the trailing number of the NodeDescription (``mlx5_3``), else
  the HCA's rank within its host.

A suffix ``@F`` (``shift:1@0.5``) makes each sending port offer ``F`` times
its link rate in total, split evenly over its flows, instead of sending greedily.

:func:`from_counters` builds a pattern from measured per-port rates (the
PerfManager's ``rates``): a gravity model, see its docstring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import Fabric, NodeType, link_bytes_per_s
from sm.lidmap import LidMap

__all__ = [
    "PATTERN_SPECS",
    "Pattern",
    "PatternError",
    "all_to_all",
    "from_counters",
    "hosts",
    "incast",
    "parse_pattern",
    "port_capacity",
    "random_bisection",
    "random_permutation",
    "ring",
    "ring_per_rail",
    "shift",
]

PATTERN_SPECS = (
    "shift:S",
    "random-permutation[:SEED]",
    "random-bisection[:SEED]",
    "all-to-all",
    "incast:N[:DST]",
    "ring",
    "ring-per-rail",
)
"""The spec forms :func:`parse_pattern` accepts (each may end in ``@F``)."""

MAX_FLOWS = 1 << 24
"""Most flows one pattern may hold (all-to-all on 4,096 hosts)."""


class PatternError(IbfmError):
    """A pattern spec or pattern input that describes no traffic; the message names it."""


@dataclass(frozen=True)
class Pattern:
    """One flow per row: from end port (``src_node``, ``src_port``) to ``dst_lid`` at ``demand`` bytes/s.

    A switch sends from port 0. ``demand`` may be ``inf`` (greedy).
    """

    name: str
    src_node: npt.NDArray[np.int64]
    src_port: npt.NDArray[np.int64]
    dst_lid: npt.NDArray[np.int64]
    demand: npt.NDArray[np.float64]

    @property
    def n_flows(self) -> int:
        return int(self.src_node.size)

    def pairs(self) -> npt.NDArray[np.int64]:
        """``(K, 3)``: (source node, source port, destination LID), as :func:`sm.analysis.verify.link_loads` takes."""
        return np.stack([self.src_node, self.src_port, self.dst_lid], axis=1)


# -- hosts and link rates ------------------------------------------------------------------------------


def port_capacity(fabric: Fabric) -> npt.NDArray[np.float64]:
    """``[node, port]``: data rate of the port's link in bytes/s (0 where it is not up)."""
    return np.where(fabric.up_mask(), link_bytes_per_s(fabric.width_active, fabric.speed_active), 0.0)


def hosts(fabric: Fabric, lids: LidMap) -> npt.NDArray[np.int64]:
    """``(N, 2)`` (node, port) of the CA ports that own a LID and whose link is up, in node then port order."""
    ep = np.argwhere(lids.base > 0).astype(np.int64)
    ep = ep[fabric.node_type[ep[:, 0]] == NodeType.CA]
    return ep[fabric.up_mask()[ep[:, 0], ep[:, 1]]]


def _make(
    name: str, fabric: Fabric, lids: LidMap, ep: npt.NDArray[np.int64], src: npt.NDArray[np.int64],
    dst: npt.NDArray[np.int64], load: float | None,
) -> Pattern:
    """Flows host ``src[k]`` -> host ``dst[k]`` (indices into ``ep``); self pairs dropped."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    node, port = ep[src, 0], ep[src, 1]
    lid = lids.base[ep[dst, 0], ep[dst, 1]].astype(np.int64)
    if load is None:
        demand = np.full(src.size, np.inf)
    else:
        per_src = np.bincount(src, minlength=ep.shape[0])
        demand = load * port_capacity(fabric)[node, port] / per_src[src]
    return Pattern(name, node.copy(), port.copy(), lid, demand.astype(np.float64))


def _need(name: str, ep: npt.NDArray[np.int64], n: int = 2) -> int:
    if ep.shape[0] < n:
        raise PatternError(f"pattern {name!r}: needs at least {n} hosts, the fabric has {ep.shape[0]}")
    return int(ep.shape[0])


# -- the patterns ---------------------------------------------------------------------------------------


def shift(fabric: Fabric, lids: LidMap, s: int, *, load: float | None = None, name: str | None = None) -> Pattern:
    """Host ``i`` to host ``(i + s) mod N``; ``s mod N`` must not be 0."""
    ep = hosts(fabric, lids)
    label = name or f"shift:{s}"
    n = _need(label, ep)
    if s % n == 0:
        raise PatternError(f"pattern {label!r}: shift {s} is a multiple of the {n} hosts (every host to itself)")
    src = np.arange(n, dtype=np.int64)
    return _make(label, fabric, lids, ep, src, (src + s) % n, load)


def _derangement(n: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """A random permutation of ``0..n-1`` without fixed points (fixed points rotated among themselves)."""
    perm = rng.permutation(n).astype(np.int64)
    fixed = np.flatnonzero(perm == np.arange(n))
    if fixed.size >= 2:
        perm[fixed] = np.roll(fixed, 1)
    elif fixed.size == 1:
        i = int(fixed[0])
        j = int(rng.integers(n - 1))
        j += j >= i
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def random_permutation(
    fabric: Fabric, lids: LidMap, seed: int = 0, *, load: float | None = None, name: str | None = None
) -> Pattern:
    """Host ``i`` to host ``perm[i]``, ``perm`` a random derangement drawn with ``seed``."""
    ep = hosts(fabric, lids)
    label = name or f"random-permutation:{seed}"
    n = _need(label, ep)
    perm = _derangement(n, np.random.default_rng(seed))
    return _make(label, fabric, lids, ep, np.arange(n, dtype=np.int64), perm, load)


def random_bisection(
    fabric: Fabric, lids: LidMap, seed: int = 0, *, load: float | None = None, name: str | None = None
) -> Pattern:
    """Hosts split at random in halves A and B, ``A[i]`` paired with ``B[i]``; both directions."""
    ep = hosts(fabric, lids)
    label = name or f"random-bisection:{seed}"
    n = _need(label, ep)
    order = np.random.default_rng(seed).permutation(n).astype(np.int64)
    half = n // 2
    a, b = order[:half], order[half : 2 * half]
    return _make(label, fabric, lids, ep, np.concatenate([a, b]), np.concatenate([b, a]), load)


def all_to_all(fabric: Fabric, lids: LidMap, *, load: float | None = None, name: str | None = None) -> Pattern:
    """Every host to every other host: ``N (N - 1)`` flows."""
    ep = hosts(fabric, lids)
    label = name or "all-to-all"
    n = _need(label, ep)
    if n * (n - 1) > MAX_FLOWS:
        raise PatternError(f"pattern {label!r}: {n} hosts make {n * (n - 1)} flows, more than {MAX_FLOWS}")
    src = np.repeat(np.arange(n, dtype=np.int64), n - 1)
    k = np.tile(np.arange(n - 1, dtype=np.int64), n)
    dst = k + (k >= src)  # skip self
    return _make(label, fabric, lids, ep, src, dst, load)


def incast(
    fabric: Fabric, lids: LidMap, senders: int, dst: int = 0, *, load: float | None = None, name: str | None = None
) -> Pattern:
    """``senders`` hosts, spread evenly over the hosts other than ``dst``, all to host ``dst``."""
    ep = hosts(fabric, lids)
    label = name or f"incast:{senders}" + (f":{dst}" if dst else "")
    n = _need(label, ep)
    if not 0 <= dst < n:
        raise PatternError(f"pattern {label!r}: destination host {dst} outside 0..{n - 1}")
    if not 1 <= senders <= n - 1:
        raise PatternError(f"pattern {label!r}: {senders} senders, need 1..{n - 1} (hosts other than the target)")
    others = np.delete(np.arange(n, dtype=np.int64), dst)
    src = others[(np.arange(senders, dtype=np.int64) * others.size) // senders]
    return _make(label, fabric, lids, ep, src, np.full(senders, dst, np.int64), load)


def ring(fabric: Fabric, lids: LidMap, *, load: float | None = None, name: str | None = None) -> Pattern:
    """Flat ring: host ``i`` to host ``i + 1`` (the last to the first), every end port one ring member."""
    return shift(fabric, lids, 1, load=load, name=name or "ring")


_TRAILING_NUMBER = re.compile(r"(\d+)\s*$")


def _host_and_rail(fabric: Fabric, ep: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per end port: a host number (0.. in order of first appearance) and its rail within the host."""
    node = ep[:, 0]
    sysimg = fabric.sysimg_guid[node]
    _, first, host = np.unique(sysimg, return_index=True, return_inverse=True)
    if first.size == node.size:
        # No two HCAs share a system image: try NodeDescription's host word ("dgx-017 mlx5_3").
        words = [fabric.descs[i].split() for i in node.tolist()]
        if all(len(w) >= 2 for w in words):
            keys = np.array([w[0] for w in words])
            _, f2, h2 = np.unique(keys, return_index=True, return_inverse=True)
            if f2.size < node.size:
                first, host = f2, h2
    # Renumber hosts in order of their first end port.
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    host = rank[host.ravel()]
    hint = np.full(node.size, -1, np.int64)
    for k, i in enumerate(node.tolist()):
        m = _TRAILING_NUMBER.search(fabric.descs[i])
        if m:
            hint[k] = int(m.group(1))
    multi = np.bincount(host)[host] > 1
    if multi.any() and (hint[multi] >= 0).all():
        # Rails named by the device number, if distinct within every host.
        pair = host[multi] * (int(hint.max()) + 1) + hint[multi]
        if np.unique(pair).size == pair.size:
            return host, np.where(multi, hint, 0)
    order = np.lexsort((ep[:, 1], node, host))
    rail = np.empty(node.size, np.int64)
    hs = host[order]
    starts = np.r_[0, np.flatnonzero(np.diff(hs)) + 1]
    pos = np.arange(node.size) - np.repeat(starts, np.diff(np.r_[starts, node.size]))
    rail[order] = pos
    return host, rail


def ring_per_rail(fabric: Fabric, lids: LidMap, *, load: float | None = None, name: str | None = None) -> Pattern:
    """A ring per rail: HCA ``r`` of host ``h`` to HCA ``r`` of the next host that has a rail ``r``."""
    ep = hosts(fabric, lids)
    label = name or "ring-per-rail"
    _need(label, ep)
    host, rail = _host_and_rail(fabric, ep)
    order = np.lexsort((host, rail))
    r = rail[order]
    starts = np.r_[0, np.flatnonzero(np.diff(r)) + 1]
    ends = np.r_[starts[1:], r.size]
    nxt = np.arange(1, r.size + 1, dtype=np.int64)
    nxt[ends - 1] = starts  # last member of each rail wraps to the first
    dst = np.empty(r.size, np.int64)
    dst[order] = order[nxt]
    return _make(label, fabric, lids, ep, np.arange(r.size, dtype=np.int64), dst, load)


def from_counters(
    fabric: Fabric,
    lids: LidMap,
    xmit_bytes_per_s: npt.NDArray[np.float64],
    rcv_bytes_per_s: npt.NDArray[np.float64] | None = None,
    *,
    min_rate: float = 0.0,
    name: str = "measured",
) -> Pattern:
    """A demand matrix from measured per-port rates (``[node, port]``, e.g. PerfManager ``rates``).

    Counters see how much each host port sends and receives, not to whom. The
    gravity model spreads each host's measured transmit rate ``x_i`` over the
    other hosts in proportion to what they receive, ``r_j``:
    ``d_ij = x_i r_j / sum_{k != i} r_k``. Row sums equal the measured
    transmit rates exactly; column sums approximate the receive rates. Without
    ``rcv_bytes_per_s`` the spread is even. NaN (not measured) counts as 0;
    hosts at or below ``min_rate`` neither send nor attract.
    """
    ep = hosts(fabric, lids)
    n = _need(name, ep)
    shape = fabric.port_exists.shape
    if np.shape(xmit_bytes_per_s) != shape or (rcv_bytes_per_s is not None and np.shape(rcv_bytes_per_s) != shape):
        raise PatternError(f"pattern {name!r}: rate arrays must have the fabric's port shape {shape}")
    x = np.nan_to_num(np.asarray(xmit_bytes_per_s, np.float64)[ep[:, 0], ep[:, 1]], nan=0.0)
    r = (
        np.ones(n)
        if rcv_bytes_per_s is None
        else np.nan_to_num(np.asarray(rcv_bytes_per_s, np.float64)[ep[:, 0], ep[:, 1]], nan=0.0)
    )
    if (x < 0).any() or (r < 0).any() or not (np.isfinite(x).all() and np.isfinite(r).all()):
        raise PatternError(f"pattern {name!r}: rates must be finite and >= 0")
    senders = np.flatnonzero(x > min_rate)
    sinks = np.flatnonzero(r > min_rate)
    if senders.size * sinks.size > MAX_FLOWS:
        raise PatternError(
            f"pattern {name!r}: {senders.size} senders x {sinks.size} receivers exceed {MAX_FLOWS} flows"
        )
    src = np.repeat(senders, sinks.size)
    dst = np.tile(sinks, senders.size)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    total = r[sinks].sum()
    others = total - np.where(r > min_rate, r, 0.0)[src]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(others > 0, x[src] * r[dst] / others, 0.0)
    pos = d > 0
    src, dst, d = src[pos], dst[pos], d[pos]
    lid = lids.base[ep[dst, 0], ep[dst, 1]].astype(np.int64)
    return Pattern(name, ep[src, 0].copy(), ep[src, 1].copy(), lid, d)


# -- specs ----------------------------------------------------------------------------------------------


def _int(spec: str, text: str, what: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise PatternError(f"pattern {spec!r}: {what} {text!r} is not an integer") from None


def parse_pattern(spec: str, fabric: Fabric, lids: LidMap) -> Pattern:
    """Build the pattern a spec names (see the module docstring); PatternError naming the spec if bad."""
    text = spec.strip()
    load: float | None = None
    if "@" in text:
        text, _, f = text.rpartition("@")
        try:
            load = float(f)
        except ValueError:
            raise PatternError(f"pattern {spec!r}: load {f!r} is not a number") from None
        if not (np.isfinite(load) and load > 0):
            raise PatternError(f"pattern {spec!r}: load {f!r} must be a positive fraction of the link rate")
    kind, *args = text.split(":")
    kind = kind.strip().lower()
    nargs = {
        "shift": (1, 1),
        "random-permutation": (0, 1),
        "random-bisection": (0, 1),
        "all-to-all": (0, 0),
        "incast": (1, 2),
        "ring": (0, 0),
        "ring-per-rail": (0, 0),
    }
    if kind not in nargs:
        raise PatternError(f"unknown pattern {spec!r} (known: {', '.join(PATTERN_SPECS)}, each optionally @LOAD)")
    lo, hi = nargs[kind]
    if not lo <= len(args) <= hi:
        want = next(s for s in PATTERN_SPECS if s.split(":")[0].split("[")[0] == kind)
        raise PatternError(f"pattern {spec!r}: expected {want}")
    nums = [_int(spec, a, "argument") for a in args]
    if kind.startswith("random-") and nums and nums[0] < 0:
        raise PatternError(f"pattern {spec!r}: seed must be >= 0")
    if kind == "shift":
        if nums[0] <= 0:
            raise PatternError(f"pattern {spec!r}: shift must be >= 1")
        return shift(fabric, lids, nums[0], load=load, name=spec)
    if kind == "random-permutation":
        return random_permutation(fabric, lids, nums[0] if nums else 0, load=load, name=spec)
    if kind == "random-bisection":
        return random_bisection(fabric, lids, nums[0] if nums else 0, load=load, name=spec)
    if kind == "all-to-all":
        return all_to_all(fabric, lids, load=load, name=spec)
    if kind == "incast":
        return incast(fabric, lids, nums[0], nums[1] if len(nums) > 1 else 0, load=load, name=spec)
    if kind == "ring":
        return ring(fabric, lids, load=load, name=spec)
    return ring_per_rail(fabric, lids, load=load, name=spec)
