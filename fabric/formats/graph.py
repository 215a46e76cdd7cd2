"""The fabric as a networkx graph, and as GraphML or node-link JSON for notebooks and graph tools.

One node per device, keyed by its node GUID (``0x...``, stable across discoveries), with its name,
type and port count; one edge per cable (a MultiGraph: two switches may share several), with
both ends' GUID and port (``a_*`` the end with the lower (GUID, port)), the link's width, speed,
rate and whether it is up. ``ibfm topo export`` writes either format.
"""

from __future__ import annotations

import io
import json
from typing import Any, Literal

import networkx as nx

from fabric.model import Fabric, NodeType, link_gbps, rate_name

Format = Literal["graphml", "json"]
_TYPE = {int(NodeType.SWITCH): "switch", int(NodeType.CA): "ca", int(NodeType.ROUTER): "router"}


def to_networkx(fabric: Fabric) -> nx.MultiGraph:
    """Devices and cables of ``fabric`` (cabled links, up or down)."""
    g: nx.MultiGraph = nx.MultiGraph(name="ibfm fabric")
    guid = [f"{int(x):#018x}" for x in fabric.node_guid.tolist()]
    for n in range(fabric.n_nodes):
        g.add_node(
            guid[n], name=fabric.names[n], type=_TYPE.get(int(fabric.node_type[n]), "unknown"),
            ports=int(fabric.nports[n]),
        )  # fmt: skip
    up = {tuple(x) for x in fabric.link_array().tolist()}
    for a, pa, b, pb in fabric.link_array(up_only=False).tolist():
        if (guid[b], pb) < (guid[a], pa):
            a, pa, b, pb = b, pb, a, pa
        w, s = int(fabric.width_active[a, pa]), int(fabric.speed_active[a, pa])
        is_up = (a, pa, b, pb) in up or (b, pb, a, pa) in up
        g.add_edge(
            guid[a], guid[b], a_guid=guid[a], a_port=pa, b_guid=guid[b], b_port=pb, a_name=fabric.names[a],
            b_name=fabric.names[b], width=w, speed=s, rate=rate_name(w, s) or "",
            gbps=float(link_gbps(w, s)) if is_up else 0.0, up=is_up,
        )  # fmt: skip
    return g


def export_graph(fabric: Fabric, fmt: Format) -> str:
    """``fabric`` as GraphML or node-link JSON text."""
    g = to_networkx(fabric)
    if fmt == "json":
        data: dict[str, Any] = nx.node_link_data(g, edges="links")
        return json.dumps(data, indent=1) + "\n"
    buf = io.BytesIO()
    nx.write_graphml(g, buf)
    return buf.getvalue().decode()
