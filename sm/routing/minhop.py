"""Min-hop routing, OpenSM's default engine.

Every switch forwards a LID on a port that lies on a shortest path to the
switch the LID hangs on; among those ports it takes the one with the fewest
CA LIDs routed through it so far (lowest port on a tie). Min-hop routes any
connected topology but gives no deadlock guarantee: on rings and tori its
routes form credit loops (see :mod:`sm.analysis.creditflow`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from fabric.model import Fabric
from sm.lidmap import LidMap
from sm.routing._hops import hop_matrix, padded, route_balanced, switch_graph
from sm.routing.base import Lft, RoutingOptions, register


@register("minhop")
class MinHopEngine:
    """Shortest paths, balanced per output port."""

    name = "minhop"

    def __init__(self, options: RoutingOptions | None = None) -> None:
        self.options = options or RoutingOptions()

    def compute(self, fabric: Fabric, lids: LidMap) -> Lft:
        g = switch_graph(fabric)
        dist = hop_matrix(g.nbr)  # symmetric: links carry both directions
        nbr = g.nbr

        def candidates(d: int) -> npt.NDArray[np.bool_]:
            row = padded(dist[d])
            return (row[nbr] == row[:-1, None] - 1) & (nbr >= 0)

        return route_balanced(fabric, lids, g, candidates)
