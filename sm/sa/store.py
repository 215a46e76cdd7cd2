"""What the SA remembers between requests: the records hosts registered (IBA 15.2.5).

The snapshot holds what the fabric is; the store holds what hosts asked
for: ServiceRecords (with leases), InformInfo subscriptions, alias GUIDs,
multicast groups and their members (:class:`~sm.sa.mcast_groups.McGroups`,
with the MLIDs and the hooks the SM fills). It lives as long as the SA (it survives
sweeps; a new master starts it empty, as hosts re-register when told to).
Only the SA's families (and the :class:`~sm.sa.inform_info.Reporter`, which
reads the subscriptions) use it, on the event loop.

Every table is bounded: a host can fill none of them past its cap (the
families answer ERR_NO_RESOURCES beyond).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sm.sa.mcast_groups import McGroup, McGroups, McMember

MAX_SERVICES = 16384
"""ServiceRecords in the whole subnet."""
MAX_SERVICES_PER_PORT = 64
"""ServiceRecords naming one port (ServiceGID)."""
MAX_SUBSCRIPTIONS = 16384
"""InformInfo subscriptions in the whole subnet."""
MAX_SUBSCRIPTIONS_PER_SUBSCRIBER = 64
"""InformInfo subscriptions of one subscriber port."""
INFINITE_LEASE = 0xFFFFFFFF


@dataclass
class Service:
    """One registered ServiceRecord: its packed record (176 bytes) and when its lease ends."""

    record: bytes
    port_guid: int
    """The port its ServiceGID names (what the per-port cap counts)."""
    expires: float | None
    """``time.monotonic()`` seconds the lease ends; None: infinite."""


@dataclass
class Subscription:
    """One InformInfo subscription (o13-12.1.1): who gets Reports of which Notices."""

    subscriber_gid: bytes
    """16 bytes: the subscriber port's GID (subnet prefix + port GUID)."""
    subscriber_guid: int
    lid: int
    """The subscriber's LID when it subscribed (Reports go to its current LID where the snapshot knows it)."""
    qpn: int
    """The QP its Reports go to (the QP the Set came from, as OpenSM takes it)."""
    enum: int
    """InformInfoRecord.Enum: tells this subscriber's subscriptions apart."""
    gid: bytes
    """InformInfo.GID (16 bytes): nonzero, only Notices whose IssuerGID it is."""
    lid_begin: int
    lid_end: int
    is_generic: int
    type: int
    trap_number: int
    """TrapNumber (generic) or DeviceID (vendor)."""
    resp_time: int
    producer_type: int
    """ProducerType (generic) or VendorID (vendor)."""

    @property
    def key(self) -> tuple[Any, ...]:
        """What tells two subscriptions apart (OpenSM's match_inf_rec: address, GID or LID range, the rest)."""
        gid_or_range: tuple[Any, ...] = (self.gid,) if any(self.gid) else (self.lid_begin, self.lid_end)
        return (
            self.subscriber_guid,
            self.qpn,
            gid_or_range,
            self.is_generic,
            self.type,
            self.trap_number,
            self.resp_time,
            self.producer_type,
        )


@dataclass
class SaStore:
    services: dict[Any, Any] = field(default_factory=dict)
    """ServiceRecords (:class:`Service`) by their key (ServiceID, ServiceGID, ServiceP_Key)."""
    subscriptions: dict[Any, Any] = field(default_factory=dict)
    """InformInfo subscriptions (:class:`Subscription`) by :attr:`Subscription.key`."""
    alias_guids: dict[Any, Any] = field(default_factory=dict)
    """Alias GUIDs by (port GUID, GUID index): ``{(port_guid, index): alias_guid}``."""
    mcast: McGroups = field(default_factory=McGroups)
    """Multicast groups, their members and MLIDs, and the hooks the SM fills (:mod:`sm.sa.mcast_groups`)."""
    version: int = 0
    """Bumped on every change of services, subscriptions or alias GUIDs."""

    @property
    def mc_groups(self) -> dict[bytes, McGroup]:
        """Multicast groups by MGID."""
        return self.mcast.groups

    def touch(self) -> None:
        self.version += 1


__all__ = [
    "INFINITE_LEASE",
    "MAX_SERVICES",
    "MAX_SERVICES_PER_PORT",
    "MAX_SUBSCRIPTIONS",
    "MAX_SUBSCRIPTIONS_PER_SUBSCRIBER",
    "McGroup",
    "McGroups",
    "McMember",
    "SaStore",
    "Service",
    "Subscription",
]
