"""LidMap: which LIDs each end port owns, as arrays both ways.

Switches own LIDs on port 0, channel adapters on each port. With LMC ``l``
an end port owns ``2**l`` consecutive LIDs starting at an aligned base.
Routing engines, verification and the exporters read this; ``sm/sweep/lids.py``
decides the assignment and keeps it stable across restarts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import Fabric

MAX_UNICAST_LID = 0xBFFF


@dataclass(frozen=True)
class LidMap:
    """``base[node, port]``: base LID of an end port (0 = none).

    ``owner_node[lid]`` / ``owner_port[lid]``: the end port owning ``lid``
    (every LID of its LMC range), -1 where unused.
    """

    lmc: int
    base: npt.NDArray[np.uint16]
    owner_node: npt.NDArray[np.int32]
    owner_port: npt.NDArray[np.int16]

    @property
    def max_lid(self) -> int:
        return int(self.owner_node.shape[0] - 1)

    def lids_of(self, node: int, port: int) -> range:
        b = int(self.base[node, port])
        return range(b, b + (1 << self.lmc)) if b else range(0)

    def used(self) -> npt.NDArray[np.intp]:
        """Every LID in use, ascending."""
        return np.flatnonzero(self.owner_node >= 0)

    @classmethod
    def from_base(cls, base: npt.NDArray[np.uint16], lmc: int = 0) -> LidMap:
        """Build the reverse maps from a ``[node, port]`` base-LID array."""
        nodes, ports = np.nonzero(base)
        lids = base[nodes, ports].astype(np.int64)
        span = 1 << lmc
        top = int(lids.max()) + span - 1 if lids.size else 0
        if top > MAX_UNICAST_LID:
            raise IbfmError(f"LID {top} beyond the unicast range (max {MAX_UNICAST_LID:#x})")
        owner_node = np.full(top + 1, -1, np.int32)
        owner_port = np.full(top + 1, -1, np.int16)
        for k in range(span):
            owner_node[lids + k] = nodes
            owner_port[lids + k] = ports
        return cls(lmc, base.astype(np.uint16), owner_node, owner_port)


def sequential_lids(fabric: Fabric, lmc: int = 0, first: int = 1) -> LidMap:
    """Switches first, then CA ports, in node order: a deterministic plan for tests and tools."""
    span = 1 << lmc
    ep = fabric.endports()
    order = np.lexsort((ep[:, 1], ep[:, 0], fabric.node_type[ep[:, 0]] != 2))
    ep = ep[order]
    start = (first + span - 1) // span * span
    base = np.zeros(fabric.port_exists.shape, np.uint16)
    base[ep[:, 0], ep[:, 1]] = start + span * np.arange(ep.shape[0])
    return LidMap.from_base(base, lmc)
