"""GUIDInfoRecord (IBA 15.2.5.18): Get and GetTable, and Set and Delete of alias GUIDs, as OpenSM answers them.

One record per (end port, block) for blocks 0..ceil(GUIDCap/8)-1, GUIDCap from the port's
PortInfo (a switch: port 0 only; a CA or router: each port with a LID). GUID 0 of block 0 is
the port GUID; the other entries are the alias GUIDs assigned to the port
(``store.alias_guids``: ``{(port_guid, index): alias_guid}``), 0 where none.

Set and Delete (the alias GUID service of OpenSM 3.3.16 and later, osm_sa_guidinfo_record.c):
the ComponentMask must hold LID and BlockNum (else ERR_REQ_INSUFFICIENT_COMPONENTS); the LID
names an end port (else ERR_NO_RECORDS) and BlockNum a block within its GUIDCap (else
ERR_NO_RECORDS); GUIDn components select the entries to set or clear, and GUID0 of block 0 (the
port GUID, read-only) is refused with ERR_REQ_INVALID. A Set of GUID 0 keeps the alias the entry
has, or has the SA assign one (OUI 0x001405 as OpenSM's sm_assigned_guid). An alias already in
use elsewhere (another entry, any port's own GUID) is not taken: its entry reads 0 in the answer,
as OpenSM marks a duplicate. The answer is the block as it now is.

ibfm does not yet program GUIDInfo into the ports (SubnSet(GUIDInfo)): the SA record is what
hosts read, and the kernel's alias GUID service is satisfied by it.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import numpy as np

from fabric.mad.sa import SaAttr, SaMethod, SaStatus, component_bit
from fabric.model import NodeType
from sm.sa.server import Rows, SaContext, SaError, SaRequest
from sm.sa.switch_records import put16
from sm.sa.table import GET_METHODS, TableFamily, empty

log = logging.getLogger(__name__)

GUIDS_PER_BLOCK = 8
DEFAULT_SUBNET_PREFIX = 0xFE80000000000000
SA_ASSIGNED_OUI = 0x001405
"""OUI of SA-assigned alias GUIDs (OpenSM's OSM_VENDOR_ID_OPENIB)."""
SA_ASSIGNED_BYTE = 0
"""Byte 3 of SA-assigned alias GUIDs (OpenSM's sm_assigned_guid option, default 0)."""


def port_index(ctx: SaContext) -> dict[int, tuple[int, int, int]]:
    """``{port GUID: (node, port, base LID)}`` of every end port of the snapshot (cached per snapshot)."""
    got = ctx.cache.get("ports:by_guid")
    if got is None:
        got = ctx.cache["ports:by_guid"] = ports_by_guid(ctx.snapshot)
    return got  # type: ignore[no-any-return]


def ports_by_guid(snapshot: Any) -> dict[int, tuple[int, int, int]]:
    """``{port GUID: (node, port, base LID)}`` of every end port of ``snapshot``."""
    f = snapshot.fabric
    return {int(f.port_guid[n, p]): (n, p, lid) for n, p, lid in guid_ports(snapshot)}


def lid_index(ctx: SaContext) -> dict[int, int]:
    """``{LID: port GUID}`` of every end port (each LID of its LMC range), cached per snapshot."""
    got = ctx.cache.get("ports:by_lid")
    if got is None:
        span = 1 << int(getattr(ctx.snapshot.lids, "lmc", 0))
        got = {lid + k: g for g, (_, _, lid) in port_index(ctx).items() for k in range(span)}
        ctx.cache["ports:by_lid"] = got
    return got  # type: ignore[no-any-return]


def subnet_prefix(snapshot: Any) -> int:
    return int(getattr(snapshot, "subnet_prefix", DEFAULT_SUBNET_PREFIX))


def gid_port(ctx: SaContext, gid: bytes) -> int | None:
    """The port GUID a unicast GID names, if it is an end port of the snapshot (prefix link-local or ours)."""
    if len(gid) < 16 or gid[0] == 0xFF:
        return None
    prefix = int.from_bytes(gid[:8], "big")
    if prefix >> 54 != 0xFE80 >> 6 and prefix != subnet_prefix(ctx.snapshot):
        return None
    guid = int.from_bytes(gid[8:16], "big")
    return guid if guid in port_index(ctx) else None


def port_gid(snapshot: Any, guid: int) -> bytes:
    """The GID of port ``guid``: the subnet prefix and the GUID."""
    return subnet_prefix(snapshot).to_bytes(8, "big") + int(guid).to_bytes(8, "big")


def guid_ports(snapshot: Any) -> list[tuple[int, int, int]]:
    """(node, port, LID) of every end port, node then port order."""
    f = snapshot.fabric
    base = snapshot.lids.base
    out: list[tuple[int, int, int]] = []
    for node in range(f.n_nodes):
        ports = [0] if f.node_type[node] == NodeType.SWITCH else range(1, int(f.nports[node]) + 1)
        for p in ports:
            lid = int(base[node, p])
            if lid:
                out.append((node, p, lid))
    return out


_LID_BLOCK = 0b11  # LID and BlockNum
_GUID_BIT0 = 4


class GuidInfoRecordFamily(TableFamily):
    reads_only: ClassVar[bool] = False  # the alias GUIDs live in the store
    attr: ClassVar[int] = int(SaAttr.GUID_INFO_RECORD)
    methods: ClassVar[frozenset[int]] = GET_METHODS | {int(SaMethod.SET), int(SaMethod.DELETE)}

    def __init__(self) -> None:
        self._assigned = 0

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        if req.mad.method in GET_METHODS:
            built = ctx.cache.get(f"table:{self.attr:#06x}:version")
            version = getattr(ctx.store, "version", 0)
            if built != version:  # alias GUIDs changed since the rows were built
                ctx.cache.pop(f"table:{self.attr:#06x}", None)
                ctx.cache[f"table:{self.attr:#06x}:version"] = version
            return super().query(ctx, req)
        return self._modify(ctx, req, req.mad.method == SaMethod.SET)

    def _modify(self, ctx: SaContext, req: SaRequest, is_set: bool) -> Rows:
        mask = req.mask
        if mask & _LID_BLOCK != _LID_BLOCK:
            raise SaError(SaStatus.ERR_REQ_INSUFFICIENT_COMPONENTS, "alias GUIDs: LID and BlockNum are needed")
        d = req.mad.data
        lid = int.from_bytes(d[0:2], "big")
        block = d[2]
        guid = lid_index(ctx).get(lid)
        if guid is None:
            raise SaError(SaStatus.ERR_NO_RECORDS, f"no end port at LID {lid:#x}")
        node, port, base = port_index(ctx)[guid]
        pi = ctx.snapshot.discovery.port_info.get((node, port))
        cap = int(pi.get("GUIDCap", 1)) if pi else 1
        nblocks = max(1, (cap + GUIDS_PER_BLOCK - 1) // GUIDS_PER_BLOCK)
        if block >= nblocks:
            raise SaError(SaStatus.ERR_NO_RECORDS, f"block {block} beyond GUIDCap {cap}")
        if block == 0 and mask & component_bit(self.attr, "GUID0"):
            raise SaError(SaStatus.ERR_REQ_INVALID, "GUID 0 is the port GUID: read-only")
        aliases: dict[tuple[int, int], int] = ctx.store.alias_guids
        out = [int.from_bytes(d[8 + 8 * i : 16 + 8 * i], "big") for i in range(GUIDS_PER_BLOCK)]
        owner = {int(a): (int(pg), int(i)) for (pg, i), a in aliases.items()}
        changed = False
        for i in range(GUIDS_PER_BLOCK):
            index = block * GUIDS_PER_BLOCK + i
            if not mask >> (_GUID_BIT0 + i) & 1 or index >= cap:
                continue
            key = (guid, index)
            if not is_set:
                if aliases.pop(key, None) is not None:
                    changed = True
                continue
            want = out[i]
            if not want:
                want = aliases.get(key, 0) or self._assign(ctx, owner)
                if not want:
                    raise SaError(SaStatus.ERR_NO_RESOURCES, "no SA-assigned GUID left")
            if owner.get(want, key) != key or want in port_index(ctx):
                out[i] = 0  # a duplicate: refused, as OpenSM marks it
                continue
            old = aliases.get(key)
            if old != want:
                if old is not None:
                    owner.pop(old, None)
                aliases[key] = want
                owner[want] = key
                changed = True
        if changed:
            ctx.store.touch()
            log.info("alias GUIDs of port %#018x block %d %s", guid, block, "set" if is_set else "deleted")
        current = [aliases.get((guid, block * GUIDS_PER_BLOCK + i), 0) for i in range(GUIDS_PER_BLOCK)]
        if block == 0:
            current[0] = guid
        rec = np.zeros((1, self.size), np.uint8)
        rec[0, 0:2] = np.frombuffer(base.to_bytes(2, "big"), np.uint8)
        rec[0, 2] = block
        rec[0, 8:72] = np.asarray(current, np.uint64).astype(">u8").view(np.uint8)
        return rec

    def _assign(self, ctx: SaContext, owner: dict[int, tuple[int, int]]) -> int:
        ports = port_index(ctx)
        for _ in range(1000):
            self._assigned = (self._assigned + 1) & 0xFFFFFFFF
            if not self._assigned:
                return 0
            g = SA_ASSIGNED_OUI << 40 | SA_ASSIGNED_BYTE << 32 | self._assigned
            if g not in owner and g not in ports:
                return g
        return 0

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        f = snap.fabric
        pinfo = snap.discovery.port_info
        aliases: dict[tuple[int, int], int] = getattr(ctx.store, "alias_guids", None) or {}
        by_port: dict[int, list[tuple[int, int]]] = {}
        for (pg, index), alias in aliases.items():
            by_port.setdefault(int(pg), []).append((int(index), int(alias)))
        recs: list[tuple[int, int, list[int]]] = []
        for node, port, lid in guid_ports(snap):
            pi = pinfo.get((node, port))
            cap = int(pi.get("GUIDCap", 1)) if pi else 1
            nblocks = max(1, (cap + GUIDS_PER_BLOCK - 1) // GUIDS_PER_BLOCK)
            guids = [0] * (nblocks * GUIDS_PER_BLOCK)
            pg = int(f.port_guid[node, port])
            for index, alias in by_port.get(pg, ()):
                if 0 < index < len(guids):
                    guids[index] = alias
            guids[0] = pg
            for b in range(nblocks):
                recs.append((lid, b, guids[b * GUIDS_PER_BLOCK : (b + 1) * GUIDS_PER_BLOCK]))
        if not recs:
            return empty(self.size)
        out = np.zeros((len(recs), self.size), np.uint8)
        put16(out, 0, [r[0] for r in recs])
        out[:, 2] = [r[1] for r in recs]
        g = np.asarray([r[2] for r in recs], np.uint64).astype(">u8")
        out[:, 8:72] = g.view(np.uint8).reshape(len(recs), 64)
        return out
