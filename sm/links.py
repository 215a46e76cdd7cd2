"""Per-link MTU and VLs, and a route's path MTU and rate.

Both ends of a link get the same NeighborMTU: the smaller MTUCap of the
two, capped by the configured maximum; OperationalVLs likewise from VLCap.
Width and speed are what the link trained to (read back from PortInfo).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.model import MTU_BYTES, Fabric, link_gbps


@dataclass(frozen=True)
class LinkPlan:
    mtu: npt.NDArray[np.uint8]
    """NeighborMTU code to set per ``[node, port]``; 0 where there is no up link."""
    op_vls: npt.NDArray[np.uint8]
    """OperationalVLs code per ``[node, port]``; 0 where there is no up link."""


def plan_links(fabric: Fabric, *, max_mtu: int = 5, max_vls: int = 4) -> LinkPlan:
    """MTU and VLs for every up link, the same on both ends (codes as in PortInfo)."""
    if not 1 <= max_mtu <= 5:
        raise ValueError(f"max MTU code {max_mtu} outside 1..5 (256..4096 bytes)")
    if not 1 <= max_vls <= 5:
        raise ValueError(f"max VLs code {max_vls} outside 1..5 (VL0..VL0-14)")
    up = fabric.up_mask()
    pn = np.where(up, fabric.peer_node, 0)
    pp = np.where(up, fabric.peer_port, 0)
    mtu = np.minimum(fabric.mtu_cap, fabric.mtu_cap[pn, pp])
    mtu = np.minimum(mtu, max_mtu).astype(np.uint8)
    vls = np.minimum(fabric.vl_cap, fabric.vl_cap[pn, pp])
    vls = np.minimum(vls, max_vls).astype(np.uint8)
    mtu[~up] = 0
    vls[~up] = 0
    return LinkPlan(mtu, vls)


def apply_link_plan(fabric: Fabric, plan: LinkPlan) -> None:
    """Record the plan in the model (what the ports hold after programming)."""
    set_ = plan.mtu > 0
    fabric.mtu_active[set_] = plan.mtu[set_]
    fabric.op_vls[set_] = plan.op_vls[set_]


def path_mtu_rate(fabric: Fabric, hops: Sequence[tuple[int, int]]) -> tuple[int, float]:
    """(MTU bytes, rate Gb/s) along a route given as the egress (node, port) of each hop."""
    if not hops:
        return 0, 0.0
    mtu = min(int(fabric.mtu_active[n, p] or fabric.mtu_cap[n, p]) for n, p in hops)
    rate = min(link_gbps(int(fabric.width_active[n, p]), int(fabric.speed_active[n, p])) for n, p in hops)
    return MTU_BYTES.get(mtu, 0), rate
