"""ServiceRecord (IBA 15.2.5.14): hosts register services, others find them; as OpenSM's osm_sa_service_record.c.

- Set registers (or replaces) the record with the key (ServiceID, ServiceGID,
  ServiceP_Key), OpenSM's RID. The ComponentMask must hold ServiceID and
  ServiceGID (else ERR_REQ_INVALID, as OpenSM answers: no
  ERR_REQ_INSUFFICIENT_COMPONENTS here). Without ServiceP_Key in the mask the
  record takes the default P_Key 0xFFFF; without ServiceLease the lease is
  infinite (0xFFFFFFFF). The ServiceGID must name an end port of the subnet
  (OpenSM checks it only with ServiceP_Key in the mask and answers
  ERR_REQ_INVALID; ibfm checks always, with the same status). The answer is
  the record as stored.
- Get and GetTable select the live records by ComponentMask (ServiceLease is
  not compared: it reads the seconds left, as OpenSM decrements it).
- Delete needs ServiceID and ServiceGID in the mask as Set does; it removes
  the records those (and any other components in the mask) select and answers
  the first; none: ERR_NO_RECORDS.
- ServiceKey reads 0 in answers to requests without the SA's SM_Key (p923).
- Leases are checked on every access (no timer): a record whose lease ended
  is gone before the request is answered.
- At most :data:`~sm.sa.store.MAX_SERVICES` records, and
  :data:`~sm.sa.store.MAX_SERVICES_PER_PORT` per ServiceGID port; beyond, a Set
  of a new key is answered ERR_NO_RESOURCES.

P_Key membership (OpenSM checks the requester's and the service port's P_Key
tables) is not checked: ibfm manages the default partition only.
"""

from __future__ import annotations

import logging
import math
from typing import ClassVar

import numpy as np

from fabric.mad.sa import SERVICE_RECORD, SaAttr, SaMethod, SaStatus, component_bit
from sm.sa.guid_info_record import gid_port
from sm.sa.server import Rows, SaContext, SaError, SaRequest
from sm.sa.store import INFINITE_LEASE, MAX_SERVICES, MAX_SERVICES_PER_PORT, SaStore, Service
from sm.sa.table import empty, select

log = logging.getLogger(__name__)

DEFAULT_PKEY = 0xFFFF
_ATTR = int(SaAttr.SERVICE_RECORD)
_SID = component_bit(_ATTR, "ServiceID")
_SGID = component_bit(_ATTR, "ServiceGID")
_SPKEY = component_bit(_ATTR, "ServiceP_Key")
_SLEASE = component_bit(_ATTR, "ServiceLease")
_LEASE = slice(28, 32)
_SKEY = slice(32, 48)


def service_key(rec: bytes) -> tuple[int, bytes, int]:
    """(ServiceID, ServiceGID, ServiceP_Key) of a packed record: what a Set replaces."""
    return int.from_bytes(rec[0:8], "big"), bytes(rec[8:24]), int.from_bytes(rec[24:26], "big")


def expire(store: SaStore, now: float) -> int:
    """Drop the records whose lease ended; how many."""
    gone = [k for k, s in store.services.items() if s.expires is not None and s.expires <= now]
    for k in gone:
        del store.services[k]
    if gone:
        store.touch()
        log.debug("%d service record(s) expired", len(gone))
    return len(gone)


def live_rows(store: SaStore, now: float) -> Rows:
    """Every live record, packed, ServiceLease reading the seconds left."""
    services = list(store.services.values())
    if not services:
        return empty(SERVICE_RECORD.size)
    rows = np.frombuffer(b"".join(s.record for s in services), np.uint8).reshape(len(services), -1).copy()
    for i, s in enumerate(services):
        if s.expires is not None:
            left = max(0, math.ceil(s.expires - now))
            rows[i, _LEASE] = np.frombuffer(min(left, INFINITE_LEASE - 1).to_bytes(4, "big"), np.uint8)
    return rows


class ServiceRecordFamily:
    attr: ClassVar[int] = _ATTR
    size: ClassVar[int] = SERVICE_RECORD.size
    methods: ClassVar[frozenset[int]] = frozenset(
        {int(SaMethod.GET), int(SaMethod.GET_TABLE), int(SaMethod.SET), int(SaMethod.DELETE)}
    )

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        store: SaStore = ctx.store
        expire(store, ctx.now)
        method = req.mad.method
        if method == SaMethod.SET:
            rows = self._set(ctx, req)
        elif method == SaMethod.DELETE:
            rows = self._delete(ctx, req)
        else:
            rows = select(self.attr, live_rows(store, ctx.now), req.mad.data, req.mask & ~_SLEASE)
        if not req.trusted and rows.shape[0]:
            rows = rows.copy()
            rows[:, _SKEY] = 0
        return rows

    @staticmethod
    def _rid(req: SaRequest) -> None:
        if req.mask & (_SID | _SGID) != _SID | _SGID:
            raise SaError(SaStatus.ERR_REQ_INVALID, "ServiceRecord Set/Delete: ServiceID and ServiceGID are needed")

    def _set(self, ctx: SaContext, req: SaRequest) -> Rows:
        self._rid(req)
        mask = req.mask
        rec = bytearray(req.mad.data[: self.size].ljust(self.size, b"\0"))
        if not mask & _SPKEY:
            rec[24:26] = DEFAULT_PKEY.to_bytes(2, "big")
        if not mask & _SLEASE:
            rec[_LEASE] = INFINITE_LEASE.to_bytes(4, "big")
        rec[26:28] = b"\0\0"  # reserved
        port = gid_port(ctx, bytes(rec[8:24]))
        if port is None:
            raise SaError(SaStatus.ERR_REQ_INVALID, "ServiceGID names no port of the subnet")
        store: SaStore = ctx.store
        key = service_key(bytes(rec))
        if key not in store.services:
            if len(store.services) >= MAX_SERVICES:
                raise SaError(SaStatus.ERR_NO_RESOURCES, f"{MAX_SERVICES} service records registered")
            if sum(1 for s in store.services.values() if s.port_guid == port) >= MAX_SERVICES_PER_PORT:
                raise SaError(SaStatus.ERR_NO_RESOURCES, f"{MAX_SERVICES_PER_PORT} service records on port {port:#x}")
        lease = int.from_bytes(rec[_LEASE], "big")
        expires = None if lease == INFINITE_LEASE else ctx.now + lease
        store.services[key] = Service(bytes(rec), port, expires)
        store.touch()
        log.debug("service %#018x registered on port %#018x (lease %s)", key[0], port, lease)
        return np.frombuffer(bytes(rec), np.uint8).reshape(1, -1)

    def _delete(self, ctx: SaContext, req: SaRequest) -> Rows:
        self._rid(req)
        store: SaStore = ctx.store
        keys = list(store.services)
        rows = live_rows(store, ctx.now)
        if not keys:
            return rows
        m = req.mask & ~_SLEASE
        picked = select(self.attr, rows, req.mad.data, m)
        if not picked.shape[0]:
            return picked
        wanted = {service_key(r.tobytes()) for r in picked}
        for k in keys:
            if k in wanted:
                del store.services[k]
        store.touch()
        return picked
