"""Questions about a routed subnet: resolve an endpoint, describe a route.

Shared by ``ibfm route`` and the HTTP API. Endpoints are given as a node
name or NodeDescription, a node or port GUID (``0x...``), or a LID.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabric.errors import IbfmError
from fabric.model import MTU_BYTES, Fabric, NodeType, link_gbps, rate_name
from sm.analysis.verify import trace_route
from sm.lidmap import LidMap
from sm.links import path_mtu_rate
from sm.routing.base import Lft


class EndpointError(IbfmError):
    """An endpoint that names nothing in the subnet."""


def resolve_endpoint(fabric: Fabric, lids: LidMap, text: str) -> tuple[int, int]:
    """(node, port) of the end port ``text`` names: a LID, a GUID (0x...), a name."""
    t = text.strip()
    if not t:
        raise EndpointError("empty endpoint")
    if t.isdigit():
        lid = int(t)
        if not 0 < lid <= lids.max_lid or lids.owner_node[lid] < 0:
            raise EndpointError(f"LID {lid} is not assigned")
        return int(lids.owner_node[lid]), int(lids.owner_port[lid])
    if t.lower().startswith("0x"):
        try:
            guid = int(t, 16)
        except ValueError:
            raise EndpointError(f"bad GUID {t!r}") from None
        try:
            return fabric.by_port_guid(guid)
        except KeyError:
            pass
        try:
            node = fabric.by_guid(guid)
        except KeyError:
            raise EndpointError(f"no node or port with GUID {t}") from None
        return node, _first_endport(fabric, lids, node)
    try:
        node = fabric.by_name(t)
    except KeyError:
        raise EndpointError(f"no node named {t!r}") from None
    return node, _first_endport(fabric, lids, node)


def _first_endport(fabric: Fabric, lids: LidMap, node: int) -> int:
    if fabric.node_type[node] == NodeType.SWITCH:
        return 0
    for p in range(1, int(fabric.nports[node]) + 1):
        if lids.base[node, p]:
            return p
    raise EndpointError(f"{fabric.names[node]} has no port with a LID")


@dataclass(frozen=True)
class RouteHop:
    node: str
    guid: int
    in_port: int
    out_port: int
    width: str
    speed: str
    mtu: int
    rate_gbps: float


@dataclass(frozen=True)
class RouteInfo:
    src: str
    dst: str
    src_lid: int
    dst_lid: int
    hops: tuple[RouteHop, ...]
    path_mtu: int
    rate_gbps: float


def describe_route(fabric: Fabric, lids: LidMap, lft: Lft, src: str, dst: str) -> RouteInfo:
    """The hops from ``src`` to ``dst`` with per-link width, speed and MTU, and the path minimum."""
    sn, sp = resolve_endpoint(fabric, lids, src)
    dn, dp = resolve_endpoint(fabric, lids, dst)
    dst_lid = int(lids.base[dn, dp])
    hops = trace_route(fabric, lids, lft, sn, sp, dst_lid)
    out: list[RouteHop] = []
    egress: list[tuple[int, int]] = []
    for h in hops:
        n, op = int(h.node), int(h.out_port)
        w, s = int(fabric.width_active[n, op]), int(fabric.speed_active[n, op])
        name = rate_name(w, s)
        mtu = int(fabric.mtu_active[n, op] or fabric.mtu_cap[n, op])
        out.append(
            RouteHop(
                fabric.names[n],
                int(fabric.node_guid[n]),
                int(h.in_port),
                op,
                name[: name.find("x") + 1] if name else "",
                name[name.find("x") + 1 :] if name else "",
                MTU_BYTES.get(mtu, 0) if op else 0,
                link_gbps(w, s) if op else 0.0,
            )
        )
        if op:
            egress.append((n, op))
    mtu, rate = path_mtu_rate(fabric, egress)
    return RouteInfo(
        fabric.port_name(sn, sp), fabric.port_name(dn, dp), int(lids.base[sn, sp]), dst_lid, tuple(out), mtu, rate
    )


def format_route(r: RouteInfo) -> str:
    """ibtracert-like text: one line per hop, then the path MTU and rate."""
    lines = [f"From {r.src} (LID {r.src_lid}) to {r.dst} (LID {r.dst_lid})"]
    for h in r.hops:
        link = f"{h.width}{h.speed} MTU {h.mtu}" if h.width else ""
        lines.append(f"  {h.node} (0x{h.guid:016x}) in [{h.in_port}] out [{h.out_port}] {link}".rstrip())
    lines.append(f"path MTU {r.path_mtu}, rate {r.rate_gbps:g} Gb/s, {max(len(r.hops) - 1, 0)} hops")
    return "\n".join(lines)
