"""Text dumps in the formats the field's tools print.

``format_lfts`` writes every switch's LFT as ``ibroute <switch lid>``
prints it (valid entries, destinations resolved), so a dump can be
compared line by line with what ibroute reads back from the fabric.
"""

from __future__ import annotations

import numpy as np

from fabric.model import Fabric, NodeType
from sm.lidmap import LidMap
from sm.routing.base import NO_ROUTE, Lft

_KIND = {NodeType.SWITCH: "Switch", NodeType.CA: "Channel Adapter", NodeType.ROUTER: "Router"}


def format_switch_lft(fabric: Fabric, lids: LidMap, lft: Lft, row: int) -> str:
    node = int(fabric.switches[row])
    table = lft[row]
    top = lids.max_lid
    lines = [
        f"Unicast lids [0x0-0x{top:x}] of switch Lid {int(lids.base[node, 0])} "
        f"guid 0x{int(fabric.node_guid[node]):016x} ({fabric.descs[node]}):",
        "  Lid  Out   Destination",
        "       Port     Info ",
    ]
    valid = np.flatnonzero(table[: top + 1] != NO_ROUTE)
    for lid in valid.tolist():
        owner = int(lids.owner_node[lid]) if lid < lids.owner_node.shape[0] else -1
        port = int(lids.owner_port[lid]) if owner >= 0 else 0
        if owner >= 0:
            kind = _KIND.get(NodeType(int(fabric.node_type[owner])), "?")
            guid = int(fabric.port_guid[owner, port])
            info = f" : ({kind} portguid 0x{guid:016x}: '{fabric.descs[owner]}')"
        else:
            info = " : (no destination)"
        lines.append(f"0x{lid:04x} {int(table[lid]):03d}{info}")
    lines.append(f"{valid.size} valid lids dumped ")
    return "\n".join(lines) + "\n"


def format_lfts(fabric: Fabric, lids: LidMap, lft: Lft) -> str:
    return "".join(format_switch_lft(fabric, lids, lft, row) for row in range(lft.shape[0]))
