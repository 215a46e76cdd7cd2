"""The per-snapshot lookup tables every handler reads (:class:`SnapshotView`), built once per snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import OrderedDict
from typing import Any

import numpy as np
import numpy.typing as npt

from exporters.http.common import ApiError, CounterSource
from fabric.model import (
    MTU_BYTES,
    NO_PEER,
    SPEED_SIGNAL_GBPS,
    WIDTH_LANES,
    WIDTH_NAMES,
    NodeType,
    PhysState,
    PortState,
    Speed,
    link_gbps,
)
from sm.analysis.query import EndpointError, resolve_endpoint
from sm.analysis.verify import TraceError, trace_route
from sm.routing.base import NO_ROUTE
from sm.sweep.manager import SubnetSnapshot

# -- per-snapshot tables --------------------------------------------------------------------------------

_KIND = {int(NodeType.SWITCH): "switch", int(NodeType.CA): "ca", int(NodeType.ROUTER): "router"}
STATE_NAMES = {int(s): s.name.lower() for s in PortState}
PHYS_NAMES = {int(s): s.name.lower() for s in PhysState}
STATE_CODE = {"down": int(PortState.DOWN), "init": int(PortState.INIT), "armed": int(PortState.ARMED),
               "active": int(PortState.ACTIVE)}
_SPEED_NAME = {int(s): s.name for s in Speed}

# PathRecord Rate codes (IBA 15.2.5.16, Table 205) by signalling rate in Gb/s.
_RATE_CODE = {2.5: 2, 10.0: 3, 30.0: 4, 5.0: 5, 20.0: 6, 40.0: 7, 60.0: 8, 80.0: 9, 120.0: 10, 14.0: 11, 56.0: 12,
              112.0: 13, 168.0: 14, 25.0: 15, 100.0: 16, 200.0: 17, 300.0: 18, 28.0: 19, 50.0: 20, 400.0: 21,
              600.0: 22, 800.0: 23, 1200.0: 24}
_NOMINAL_GBPS = {Speed.SDR: 2.5, Speed.DDR: 5.0, Speed.QDR: 10.0, Speed.FDR10: 10.0, Speed.FDR: 14.0,
                 Speed.EDR: 25.0, Speed.HDR: 50.0, Speed.NDR: 100.0, Speed.XDR: 200.0}
assert set(_NOMINAL_GBPS) == set(SPEED_SIGNAL_GBPS)


def hex_guid(g: int) -> str:
    return f"0x{g:016x}"


class SnapshotView:
    """Lookup tables of one snapshot, built on first use and kept while the snapshot is current."""

    def __init__(self, snap: SubnetSnapshot) -> None:
        self.snap = snap
        f = snap.fabric
        self.fabric = f
        self.lids = snap.lids
        self.lft = snap.lft
        self.n = f.n_nodes
        self.names = f.names
        self.guid_hex = [hex_guid(int(g)) for g in f.node_guid.tolist()]
        self.kind = [_KIND.get(int(t), "router") for t in f.node_type.tolist()]
        self.is_sw = [t == "switch" for t in self.kind]
        row_of = np.full(self.n, -1, np.int64)
        row_of[f.switches] = np.arange(f.switches.size)
        self.row_of: list[int] = row_of.tolist()
        self.up = f.up_mask()
        self.up_list: list[list[bool]] = self.up.tolist()
        self.peer_node: list[list[int]] = f.peer_node.tolist()
        self.peer_port: list[list[int]] = f.peer_port.tolist()
        self.nports: list[int] = f.nports.tolist()
        self.max_lid = snap.lids.max_lid
        self.owner_node: list[int] = snap.lids.owner_node.tolist()
        self.owner_port: list[int] = snap.lids.owner_port.tolist()
        self.subnet_prefix = 0xFE80000000000000
        self._endpoints: dict[str, tuple[int, int]] = {}
        self._nodes: list[dict[str, Any]] | None = None
        self._ports: npt.NDArray[np.int64] | None = None
        self._links: npt.NDArray[np.int64] | None = None
        self._summary: dict[str, int] | None = None
        self._lids_assigned: int | None = None
        self.lock = asyncio.Lock()
        self.validation: dict[str, Any] | None = None
        self.validation_key: object = None
        self.congestion: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self.baseline: dict[tuple[str, int], dict[str, Any]] = {}
        self.plan = snap.partitions
        self.partition_items: list[dict[str, Any]] | None = None
        """Every partition as ``GET /partitions`` lists it (:mod:`exporters.http.partitions` fills it)."""
        self.predicted: OrderedDict[str, Any] = OrderedDict()
        """Congestion reports by pattern spec (:func:`exporters.http.congestion.predicted_report` fills it)."""
        self.link_table: Any = None
        """Capability and degradation of every cable (:func:`exporters.http.admin.link_table` fills it)."""

    # -- endpoints and nodes

    def endpoint(self, text: str, parameter: str) -> tuple[int, int]:
        """(node, port) of an end port named by name, GUID or LID; ApiError 400/404."""
        hit = self._endpoints.get(text)
        if hit is not None:
            return hit
        t = text.strip()
        if not t:
            raise ApiError(400, "bad_parameter", f"{parameter}: empty endpoint", parameter)
        if len(t) > 256:
            raise ApiError(400, "bad_parameter", f"{parameter}: endpoint longer than 256 characters", parameter)
        if t.isdigit() and not t.isascii():
            raise ApiError(404, "not_found", f"{parameter}: no node named {t!r}", parameter)
        try:
            hit = resolve_endpoint(self.fabric, self.lids, t)
        except EndpointError as e:
            status = 400 if str(e).startswith("bad GUID") else 404  # not "no node named 'bad GUID'"
            raise ApiError(status, "bad_parameter" if status == 400 else "not_found", f"{parameter}: {e}",
                           parameter) from None
        if len(self._endpoints) < 4 * self.n + 1024:
            self._endpoints[text] = hit
        return hit

    def node(self, text: str, parameter: str) -> int:
        """Node index by name, NodeDescription, node or port GUID, or LID; ApiError 400/404."""
        t = text.strip()
        if not t:
            raise ApiError(400, "bad_parameter", f"{parameter}: empty node id", parameter)
        if len(t) > 256:
            raise ApiError(400, "bad_parameter", f"{parameter}: node id longer than 256 characters", parameter)
        f = self.fabric
        if t.isdigit() and t.isascii():
            lid = int(t)
            if 0 < lid <= self.max_lid and self.owner_node[lid] >= 0:
                return self.owner_node[lid]
            raise ApiError(404, "not_found", f"{parameter}: LID {lid} is not assigned", parameter)
        if t[:2].lower() == "0x":
            try:
                g = int(t, 16)
            except ValueError:
                raise ApiError(400, "bad_parameter", f"{parameter}: bad GUID {t!r}", parameter) from None
            with contextlib.suppress(KeyError):
                return f.by_guid(g)
            with contextlib.suppress(KeyError):
                return f.by_port_guid(g)[0]
            raise ApiError(404, "not_found", f"{parameter}: no node or port with GUID {t}", parameter)
        try:
            return f.by_name(t)
        except KeyError:
            raise ApiError(404, "not_found", f"{parameter}: no node named {t!r}", parameter) from None

    def nodes(self) -> list[dict[str, Any]]:
        if self._nodes is None:
            f = self.fabric
            base = self.lids.base
            lid_of = np.where(
                f.node_type == NodeType.SWITCH,
                base[:, 0],
                np.where(base[:, 1:] > 0, base[:, 1:], np.iinfo(np.uint16).max).min(axis=1)
                if base.shape[1] > 1
                else 0,
            ).astype(np.int64)
            lid_of[lid_of == np.iinfo(np.uint16).max] = 0
            sysimg = f.sysimg_guid.tolist()
            vendor = f.vendor_id.tolist()
            device = f.device_id.tolist()
            lids = lid_of.tolist()
            self._nodes = [
                {
                    "name": self.names[i],
                    "description": f.descs[i],
                    "guid": self.guid_hex[i],
                    "type": self.kind[i],
                    "nports": self.nports[i],
                    "lid": lids[i] or None,
                    "system_image_guid": hex_guid(int(sysimg[i])),
                    "vendor_id": int(vendor[i]),
                    "device_id": int(device[i]),
                }
                for i in range(self.n)
            ]
        return self._nodes

    def summary(self) -> dict[str, int]:
        if self._summary is None:
            self._summary = self.fabric.summary()
        return self._summary

    def lids_assigned(self) -> int:
        if self._lids_assigned is None:
            self._lids_assigned = int(self.lids.used().size)
        return self._lids_assigned

    def ports(self) -> npt.NDArray[np.int64]:
        """Every existing port, (K, 2), node then port order."""
        if self._ports is None:
            self._ports = np.argwhere(self.fabric.port_exists).astype(np.int64)
        return self._ports

    def links(self) -> npt.NDArray[np.int64]:
        if self._links is None:
            self._links = self.fabric.link_array(up_only=False)
        return self._links

    # -- JSON pieces

    def end(self, n: int, p: int) -> dict[str, Any]:
        return {"node": self.names[n], "guid": self.guid_hex[n], "port": p}

    def link_fields(self, n: int, p: int) -> dict[str, Any]:
        f = self.fabric
        w, s = int(f.width_active[n, p]), int(f.speed_active[n, p])
        mtu = int(f.mtu_active[n, p])
        up = w and s
        return {
            "width": WIDTH_NAMES.get(w) if up else None,
            "speed": _SPEED_NAME.get(s) if up else None,
            "rate_gbps": round(link_gbps(w, s), 3) if up else 0.0,
            "mtu": MTU_BYTES.get(mtu) if mtu else None,
        }

    def port(self, n: int, p: int, perf: CounterSource | None) -> dict[str, Any]:
        f = self.fabric
        m = self.peer_node[n][p]
        d = {
            "node": self.names[n],
            "guid": self.guid_hex[n],
            "port": p,
            "port_guid": hex_guid(int(f.port_guid[n, p])),
            "state": STATE_NAMES.get(int(f.state[n, p]), "nop"),
            "phys_state": PHYS_NAMES.get(int(f.phys_state[n, p]), "nop"),
            **self.link_fields(n, p),
            "lid": int(self.lids.base[n, p]) or None,
            "lmc": self.lids.lmc if self.lids.base[n, p] else 0,
            "peer": self.end(m, self.peer_port[n][p]) if m != NO_PEER else None,
            "counters": None,
            "rates": None,
        }
        if perf is not None and perf.fabric is f:
            d["counters"] = {k: int(v[n, p]) for k, v in perf.totals.items()}
            d["rates"] = {k: (None if math.isnan(x := float(v[n, p])) else round(x, 3)) for k, v in perf.rates.items()}
        return d

    # -- routes

    def route(self, src: str, dst: str) -> dict[str, Any]:
        """The route from ``src`` to ``dst`` as the API returns it (see ``RouteInfo``)."""
        sn, sp = self.endpoint(src, "src")
        dn, dp = self.endpoint(dst, "dst")
        f = self.fabric
        base = self.lids.base
        dlid = int(base[dn, dp])
        slid = int(base[sn, sp])
        failure: str | None = None
        try:
            hops: list[tuple[int, int, int]] = list(trace_route(f, self.lids, self.lft, sn, sp, dlid))
        except TraceError as e:  # a broken route: show how far it got and why
            hops, failure = list(e.hops), str(e)
        out_hops = []
        mtus: list[int] = []
        rates: list[float] = []
        signal: list[float] = []
        for n, ip, op in hops:
            h: dict[str, Any] = {"node": self.names[n], "guid": self.guid_hex[n], "type": self.kind[n],
                                 "in_port": ip, "out_port": op}
            if op and op != NO_ROUTE and op <= self.nports[n] and self.up_list[n][op]:
                lf = self.link_fields(n, op)
                h.update(lf)
                mc = int(f.mtu_active[n, op] or f.mtu_cap[n, op])
                mtus.append(mc)
                rates.append(lf["rate_gbps"])
                w, s = int(f.width_active[n, op]), int(f.speed_active[n, op])
                signal.append(WIDTH_LANES.get(w, 0) * _NOMINAL_GBPS.get(Speed(s), 0.0) if s else 0.0)
            else:
                h.update({"width": None, "speed": None, "rate_gbps": None, "mtu": None})
            out_hops.append(h)
        delivered = failure is None
        path_mtu = MTU_BYTES.get(min(mtus), 0) if delivered and mtus else 0
        rate = min(rates) if delivered and rates else 0.0
        shared = self.shared_partitions((sn, sp), (dn, dp))
        note = None
        if shared is not None and not shared:
            note = (f"{self.names[sn]}[{sp}] and {self.names[dn]}[{dp}] share no partition (none that both P_KeyTables "
                    "hold with a full member on one side): the SA gives them no PathRecord and the switches drop "
                    "their packets, so they cannot talk")
        record = None
        if delivered and mtus and (shared is None or shared):
            sig = min(signal)
            record = {
                "sgid": _gid(self.subnet_prefix, int(f.port_guid[sn, sp])),
                "dgid": _gid(self.subnet_prefix, int(f.port_guid[dn, dp])),
                "slid": slid,
                "dlid": dlid,
                "pkey": shared[0]["pkey"] if shared else "0xffff",
                "sl": 0,
                "mtu": min(mtus),
                "mtu_bytes": path_mtu,
                "rate": _RATE_CODE.get(sig),
                "rate_gbps": sig,
                "hop_count": len(mtus),
            }
        return {
            "src": self._endpoint_json(sn, sp),
            "dst": self._endpoint_json(dn, dp),
            "delivered": delivered,
            "failure": failure,
            "hops": out_hops,
            "path_mtu": path_mtu,
            "rate_gbps": rate,
            "path_record": record,
            "partitions": shared,
            "partition_note": note,
        }

    def shared_partitions(self, a: tuple[int, int], b: tuple[int, int]) -> list[dict[str, Any]] | None:
        """The partitions end ports ``a`` and ``b`` may talk in, as ``a`` holds their keys (the first is a
        PathRecord's P_Key); None when the snapshot has no partition plan."""
        plan = self.plan
        if plan is None:
            return None
        cfg = plan.config
        out = []
        for key in plan.shared(a, b):
            part = cfg.by_pkey(key) if cfg is not None else None
            out.append({"pkey": f"0x{key:04x}", "name": part.name if part is not None else None})
        return out

    def _endpoint_json(self, n: int, p: int) -> dict[str, Any]:
        return {
            "endpoint": f"{self.names[n]}[{p}]",
            "node": self.names[n],
            "guid": hex_guid(int(self.fabric.port_guid[n, p])),
            "port": p,
            "lid": int(self.lids.base[n, p]),
        }


def _gid(prefix: int, guid: int) -> str:
    raw = f"{prefix:016x}{guid:016x}"
    return ":".join(raw[i : i + 4] for i in range(0, 32, 4))


class ViewCache:
    """The view of the current snapshot (replaced when the manager publishes a new one)."""

    def __init__(self) -> None:
        self._view: SnapshotView | None = None

    def get(self, snap: SubnetSnapshot) -> SnapshotView:
        v = self._view
        if v is None or v.snap is not snap:
            v = SnapshotView(snap)
            self._view = v
        return v

    def put(self, view: SnapshotView) -> None:
        self._view = view


def built_view(snap: SubnetSnapshot) -> SnapshotView:
    v = SnapshotView(snap)
    v.nodes()
    v.ports()
    v.links()
    v.summary()
    v.lids_assigned()
    return v


