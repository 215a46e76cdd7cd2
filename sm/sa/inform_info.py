"""Event forwarding: InformInfo subscriptions (IBA 13.4.8.3, 15.2.5.12) and the Reports they ask for (13.4.8.2).

As OpenSM's osm_sa_informinfo.c and osm_inform.c:

- SubnAdmSet(InformInfo) subscribes (Subscribe 1) or unsubscribes (0). The
  subscriber is the port the request came from (its LID must be an end port
  of the snapshot, else ERR_REQ_INVALID); for a subscription the QPN is the
  QP the request came from. A subscription with the same subscriber, QPN,
  GID (or LID range when the GID is 0), IsGeneric, Type, TrapNumber,
  RespTimeValue and ProducerType replaces the old one; an unsubscription must
  name one (else ERR_REQ_INVALID). Subscribe > 1, or a nonzero GID that names
  no port: ERR_REQ_INVALID. At most :data:`MAX_SUBSCRIPTIONS_PER_SUBSCRIBER`
  per subscriber port and :data:`MAX_SUBSCRIPTIONS` in all: ERR_NO_RESOURCES.
  The answer is the InformInfo as sent (o13-12.1.1).
- SubnAdmGet/GetTable(InformInfoRecord) lists the subscriptions, selected by
  ComponentMask; Enum tells one subscriber's subscriptions apart.
- :class:`Reporter` turns Notices into SubnAdmReport(Notice) MADs to every
  matching subscriber (OpenSM's matching rules: GID, else LID range against
  the IssuerLID, IsGeneric, Type, TrapNumber/DeviceID and
  ProducerType/VendorID, 0xFFFF and 0xFFFFFF matching anything), sent with
  the transport's timeout and retries, each expecting a ReportResp. It makes
  the Notices the SM issues from the manager's events: trap 64 (GID in
  service) and 65 (GID out of service) for end ports that appear or disappear
  between snapshots, 128 (link state change) from each switch at a link that
  came or went (what the switch's own trap says, which OpenSM forwards).
  Nothing unsubscribes automatically.

Reports go to the subscriber's LID (its current one when the snapshot knows
its port) on the GSI QP: the transports address a LID only, so a
subscription's QPN other than 1 is recorded but not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fabric.mad.attributes import notice_pack
from fabric.mad.constants import NoticeType, ProducerType, Trap
from fabric.mad.sa import INFORM_INFO, INFORM_INFO_RECORD, SaAttr, SaMethod, SaStatus, sa_mad
from fabric.model import NodeType
from sm.sa.guid_info_record import gid_port, lid_index, port_gid, ports_by_guid
from sm.sa.server import Rows, SaContext, SaError, SaRequest
from sm.sa.store import MAX_SUBSCRIPTIONS, MAX_SUBSCRIPTIONS_PER_SUBSCRIBER, SaStore, Subscription
from sm.sa.table import GET_METHODS, empty, select
from sm.sweep.events import LinkDown, LinkUp, SweepDone
from sm.transport.base import WindowedTransport

log = logging.getLogger(__name__)

TRAP_GID_IN_SERVICE = 64
TRAP_GID_OUT_OF_SERVICE = 65
TRAP_LINK_STATE_CHANGE = int(Trap.LINK_STATE_CHANGE)
REPORT_TIMEOUT_S = 0.5
REPORT_RETRIES = 3
MAX_PENDING_DELIVERIES = 64
"""Notices being delivered at once; beyond, a Notice is dropped (counted)."""
NOTICE_SIZE = 80
_ANY16 = 0xFFFF
_ANY24 = 0xFFFFFF


# -- InformInfo and InformInfoRecord ----------------------------------------------------


class InformInfoFamily:
    """SubnAdmSet(InformInfo): subscribe and unsubscribe."""

    attr: ClassVar[int] = int(SaAttr.INFORM_INFO)
    size: ClassVar[int] = INFORM_INFO.size
    methods: ClassVar[frozenset[int]] = frozenset({int(SaMethod.SET)})

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        data = req.mad.data[: self.size].ljust(self.size, b"\0")
        ii = INFORM_INFO.unpack(data)
        subscribe = int(ii["Subscribe"])  # type: ignore[call-overload]
        if subscribe > 1:
            raise SaError(SaStatus.ERR_REQ_INVALID, f"Subscribe {subscribe}")
        guid = lid_index(ctx).get(req.src.lid)
        if guid is None:
            raise SaError(SaStatus.ERR_REQ_INVALID, f"InformInfo from LID {req.src.lid:#x}, no port of the subnet")
        gid = bytes(data[0:16])
        store: SaStore = ctx.store
        sub = Subscription(
            subscriber_gid=port_gid(ctx.snapshot, guid),
            subscriber_guid=guid,
            lid=req.src.lid,
            qpn=req.src.qpn if subscribe else int(ii["QPN"]),  # type: ignore[call-overload]
            enum=0,
            gid=gid,
            lid_begin=int(ii["LIDRangeBegin"]),  # type: ignore[call-overload]
            lid_end=int(ii["LIDRangeEnd"]),  # type: ignore[call-overload]
            is_generic=int(ii["IsGeneric"]),  # type: ignore[call-overload]
            type=int(ii["Type"]),  # type: ignore[call-overload]
            trap_number=int(ii["TrapNumber"]),  # type: ignore[call-overload]
            resp_time=int(ii["RespTimeValue"]),  # type: ignore[call-overload]
            producer_type=int(ii["ProducerType"]),  # type: ignore[call-overload]
        )
        key = sub.key
        if not subscribe:
            if store.subscriptions.pop(key, None) is None:
                raise SaError(SaStatus.ERR_REQ_INVALID, "unsubscribe of no subscription")
            store.touch()
            log.info("port %#018x unsubscribed from trap %#x", guid, sub.trap_number)
            return np.frombuffer(data, np.uint8).reshape(1, -1)
        if any(gid) and gid_port(ctx, gid) is None:
            raise SaError(SaStatus.ERR_REQ_INVALID, "InformInfo GID names no port of the subnet")
        old = store.subscriptions.get(key)
        if old is None:
            mine = [s for s in store.subscriptions.values() if s.subscriber_guid == guid]
            if len(mine) >= MAX_SUBSCRIPTIONS_PER_SUBSCRIBER:
                raise SaError(SaStatus.ERR_NO_RESOURCES, f"{len(mine)} subscriptions of port {guid:#x}")
            if len(store.subscriptions) >= MAX_SUBSCRIPTIONS:
                raise SaError(SaStatus.ERR_NO_RESOURCES, f"{MAX_SUBSCRIPTIONS} subscriptions")
            used = {s.enum for s in mine}
            sub.enum = next(i for i in range(len(used) + 1) if i not in used)
        else:
            sub.enum = old.enum
        store.subscriptions[key] = sub
        store.touch()
        log.info("port %#018x (LID %#x) subscribed to trap %#x", guid, req.src.lid, sub.trap_number)
        return np.frombuffer(data, np.uint8).reshape(1, -1)


def record_of(sub: Subscription) -> bytes:
    """The InformInfoRecord of a subscription."""
    return INFORM_INFO_RECORD.pack(
        {
            "SubscriberGID": sub.subscriber_gid,
            "Enum": sub.enum,
            "GID": sub.gid,
            "LIDRangeBegin": sub.lid_begin,
            "LIDRangeEnd": sub.lid_end,
            "IsGeneric": sub.is_generic,
            "Subscribe": 1,
            "Type": sub.type,
            "TrapNumber": sub.trap_number,
            "QPN": sub.qpn & 0xFFFFFF,
            "RespTimeValue": sub.resp_time,
            "ProducerType": sub.producer_type,
        }
    )


class InformInfoRecordFamily:
    """SubnAdmGet/GetTable(InformInfoRecord): the subscriptions."""

    attr: ClassVar[int] = int(SaAttr.INFORM_INFO_RECORD)
    size: ClassVar[int] = INFORM_INFO_RECORD.size
    methods: ClassVar[frozenset[int]] = GET_METHODS

    def query(self, ctx: SaContext, req: SaRequest) -> Rows:
        subs = list(ctx.store.subscriptions.values())
        if not subs:
            return empty(self.size)
        rows = np.frombuffer(b"".join(record_of(s) for s in subs), np.uint8).reshape(len(subs), -1)
        return select(self.attr, rows, req.mad.data, req.mask)


# -- matching and delivery ---------------------------------------------------------------


def matches(sub: Subscription, notice: bytes) -> bool:
    """Whether ``notice`` (80 bytes) is one ``sub`` asked for (OpenSM's match_notice_to_inf_rec)."""
    if any(sub.gid):
        if sub.gid != bytes(notice[64:80]):
            return False
    elif sub.lid_begin != _ANY16:
        issuer = int.from_bytes(notice[6:8], "big")
        if not sub.lid_begin <= issuer <= (sub.lid_end or sub.lid_begin):
            return False
    generic = notice[0] >> 7
    if bool(sub.is_generic) != bool(generic):
        return False
    if sub.type != _ANY16 and sub.type != notice[0] & 0x7F:
        return False
    if sub.trap_number != _ANY16 and sub.trap_number != int.from_bytes(notice[4:6], "big"):
        return False
    return sub.producer_type == _ANY24 or sub.producer_type == int.from_bytes(notice[1:4], "big")


def matching(store: SaStore, notice: bytes) -> list[Subscription]:
    return [s for s in store.subscriptions.values() if matches(s, notice)]


def report_mad(notice: bytes) -> bytes:
    """SubnAdmReport(Notice) carrying ``notice`` (the transport sets the TID)."""
    return sa_mad(SaMethod.REPORT, SaAttr.NOTICE, tid=0, data=bytes(notice[:NOTICE_SIZE]), attr_offset=0)


@dataclass
class Delivery:
    delivered: int = 0
    failed: int = 0


def _route(sub: Subscription, ports: dict[int, tuple[int, int, int]] | None) -> int | None:
    """The LID to send ``sub``'s Reports to: its port's current LID; None if its port is gone."""
    if ports is None:
        return sub.lid
    at = ports.get(sub.subscriber_guid)
    return None if at is None else at[2]


async def deliver(
    store: SaStore,
    transport: WindowedTransport,
    notice: bytes,
    *,
    ports: dict[int, tuple[int, int, int]] | None = None,
    subscribers: Iterable[Subscription] | None = None,
    timeout: float | None = REPORT_TIMEOUT_S,
    retries: int | None = REPORT_RETRIES,
) -> Delivery:
    """Send ``notice`` as a Report to every matching subscriber (``subscribers``: already matched); count
    the ReportResps (delivered) and the rest (failed: no answer after the retries, an error status, or a
    subscriber whose port is not in ``ports``, the current end ports by GUID)."""
    subs = list(subscribers) if subscribers is not None else matching(store, notice)
    out = Delivery()
    mad = report_mad(notice)
    requests: list[tuple[bytes, int]] = []
    for s in subs:
        lid = _route(s, ports)
        if lid is None:
            out.failed += 1
        else:
            requests.append((mad, lid))
    if not requests:
        return out
    answers = await transport.send_many(requests, timeout=timeout, retries=retries)
    for a in answers:
        if isinstance(a, bytes) and len(a) >= 6 and a[3] == SaMethod.REPORT_RESP and not int.from_bytes(a[4:6], "big"):
            out.delivered += 1
        else:
            out.failed += 1
    return out


# -- the SM's Notices --------------------------------------------------------------------


def in_service(snapshot: Any) -> set[int]:
    """Port GUIDs of the end ports in service: a CA or router port with a LID and its link up, a switch's
    port 0 when the switch has a link up (or is the SM's node)."""
    f = snapshot.fabric
    up = f.up_mask()
    sm_node = int(snapshot.discovery.sm_node)
    out: set[int] = set()
    for g, (node, port, _) in ports_by_guid(snapshot).items():
        if (port and up[node, port]) or (not port and (up[node].any() or node == sm_node)):
            out.add(g)
    return out


def gid_notice(trap: int, snapshot: Any, guid: int) -> bytes:
    """Trap 64/65 about end port ``guid``, issued by the SM (class manager, its LID and GID)."""
    d = snapshot.discovery
    sm_guid = int(snapshot.fabric.port_guid[d.sm_node, d.sm_port])
    details = bytes(6) + port_gid(snapshot, guid)
    head = notice_pack(
        trap, int(snapshot.sm_lid), details,
        notice_type=NoticeType.SUBNET_MANAGEMENT, producer_type=ProducerType.CLASS_MANAGER,
    )
    return head + port_gid(snapshot, sm_guid)


def link_notice(snapshot: Any, node: int) -> bytes | None:
    """Trap 128 from switch ``node`` of ``snapshot`` (as the switch sends it: LIDADDR its LID)."""
    f = snapshot.fabric
    if f.node_type[node] != NodeType.SWITCH:
        return None
    lid = int(snapshot.lids.base[node, 0])
    if not lid:
        return None
    head = notice_pack(TRAP_LINK_STATE_CHANGE, lid, lid.to_bytes(2, "big"))
    return head + port_gid(snapshot, int(f.port_guid[node, 0]))


@dataclass
class ReporterStats:
    notices: int = 0
    """Notices that matched at least one subscription."""
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    """Notices not sent: too many deliveries in flight, or no event loop."""

    def as_dict(self) -> dict[str, int]:
        return {"notices": self.notices, "delivered": self.delivered, "failed": self.failed, "dropped": self.dropped}


class Reporter:
    """Delivers Notices to the subscribers of the SA's store; makes traps 64, 65 and 128 from the manager's events.

    ``on_event`` is an :class:`~sm.sweep.events.EventBus` sink: it only notes
    link changes, and at the end of a heavy sweep (SweepDone) compares the
    end ports with those of the snapshot before and schedules the deliveries
    as tasks; it never waits.
    """

    def __init__(
        self,
        store: SaStore,
        transport: WindowedTransport,
        snapshot: Callable[[], Any],
        *,
        timeout: float = REPORT_TIMEOUT_S,
        retries: int = REPORT_RETRIES,
        max_pending: int = MAX_PENDING_DELIVERIES,
    ) -> None:
        self.store = store
        self.transport = transport
        self._snapshot = snapshot
        self.timeout = timeout
        self.retries = retries
        self.max_pending = max_pending
        self.stats = ReporterStats()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last = snapshot()
        self._last_ports: set[int] | None = None
        self._ports_of: Any = None
        self._ports: dict[int, tuple[int, int, int]] | None = None
        self._links: set[int] = set()
        """Node GUIDs at an end of a link that came or went since the last sweep's end."""

    def _current_ports(self) -> dict[int, tuple[int, int, int]] | None:
        snap = self._snapshot()
        if snap is None:
            return None
        if snap is not self._ports_of:
            self._ports = ports_by_guid(snap)
            self._ports_of = snap
        return self._ports

    def report(self, notice: bytes) -> int:
        """Schedule the delivery of ``notice`` (80 bytes) to its subscribers; how many match."""
        subs = matching(self.store, notice)
        if not subs:
            return 0
        self.stats.notices += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.stats.dropped += 1
            return len(subs)
        if len(self._tasks) >= self.max_pending:
            self.stats.dropped += 1
            log.warning("Report of trap %d dropped: %d deliveries in flight", int.from_bytes(notice[4:6], "big"),
                        len(self._tasks))
            return len(subs)
        task = loop.create_task(self._deliver(notice, subs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return len(subs)

    async def _deliver(self, notice: bytes, subs: list[Subscription]) -> None:
        try:
            got = await deliver(
                self.store, self.transport, notice, ports=self._current_ports(), subscribers=subs,
                timeout=self.timeout, retries=self.retries,
            )
        except Exception as e:  # the transport closed under us: counted, never raised
            self.stats.failed += len(subs)
            log.debug("Report delivery failed: %s", e)
            return
        self.stats.delivered += got.delivered
        self.stats.failed += got.failed
        if got.failed:
            log.info("Report of trap %d: %d delivered, %d failed", int.from_bytes(notice[4:6], "big"),
                     got.delivered, got.failed)

    # -- events --------------------------------------------------------------------------

    def on_event(self, event: Any) -> None:
        if isinstance(event, LinkDown | LinkUp):
            for ref in (event.a, event.b):
                if ref is not None:
                    with contextlib.suppress(ValueError):
                        self._links.add(int(ref.guid, 16))
        elif isinstance(event, SweepDone) and event.kind == "heavy":
            self._after_sweep()

    def _after_sweep(self) -> None:
        snap = self._snapshot()
        prev, self._last = self._last, snap
        links, self._links = self._links, set()
        if snap is None:
            return
        prev_ports, self._last_ports = self._last_ports, None
        if not self.store.subscriptions:
            return  # nobody listens: nothing to compute (the next diff starts from this snapshot)
        if prev is not None and prev is not snap:
            old = prev_ports if prev_ports is not None else in_service(prev)
            new = in_service(snap)
            self._last_ports = new
            for g in sorted(new - old):
                self.report(gid_notice(TRAP_GID_IN_SERVICE, snap, g))
            for g in sorted(old - new):
                self.report(gid_notice(TRAP_GID_OUT_OF_SERVICE, snap, g))
        for guid in sorted(links):
            notice = None
            for s in (snap, prev):
                if s is None:
                    continue
                try:
                    node = s.fabric.by_guid(guid)
                except KeyError:
                    continue
                notice = link_notice(s, node)
                break
            if notice is not None:
                self.report(notice)

    async def drain(self) -> None:
        """Wait for the deliveries in flight."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        self._tasks.clear()


__all__ = [
    "Delivery",
    "InformInfoFamily",
    "InformInfoRecordFamily",
    "Reporter",
    "ReporterStats",
    "deliver",
    "gid_notice",
    "in_service",
    "link_notice",
    "matches",
    "matching",
    "report_mad",
]
