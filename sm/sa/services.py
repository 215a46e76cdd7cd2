"""The SM's services on its port, wired once: the SA, its Reports, and SMInfo for the election.

``ibfm serve``, ``ibfm sm`` and the tests all serve a manager's port the
same way: SA requests (class 0x03) to a :class:`~sm.sa.server.SaServer`
answering from the manager's snapshot while it is master, the SA's
read-only queries inline where the transport allows it (a PathRecord Get
answered over the request itself), SMInfo to the manager's
:class:`~sm.election.elector.Elector`, and InformInfo subscribers told of
ports and links through the manager's events.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fabric.mad.sa import SA_CLASS
from sm.sa.families import all_families
from sm.sa.inform_info import Reporter
from sm.sa.mcast_groups import Membership, default_pkey_membership
from sm.sa.server import SaContext, SaServer
from sm.sa.store import SaStore
from sm.transport.base import MadAddress, WindowedTransport

if TYPE_CHECKING:
    from sm.sweep.manager import FabricManager


@dataclass
class SmServices:
    sa: SaServer
    reporter: Reporter
    store: SaStore

    def close(self) -> None:
        self.reporter.close()
        self.sa.close()


def partition_membership(ctx: SaContext, port_guid: int, pkey15: int) -> Membership | None:
    """How a port belongs to partition ``pkey15``, from the snapshot's partition plan ("full",
    "limited" or None); without a plan, every port a full member of the default partition."""
    snap = ctx.snapshot
    plan = getattr(snap, "partitions", None)
    if plan is None:
        return default_pkey_membership(ctx, port_guid, pkey15)
    try:
        port = snap.fabric.by_port_guid(port_guid)
    except KeyError:
        return None
    m = plan.membership_of(port, pkey15)
    return "full" if m == "full" else "limited" if m == "limited" else None


def serve_port(transport: WindowedTransport, manager: FabricManager) -> SmServices:
    """Answer what peers and hosts ask our port, from now on: SMInfo, and the SA while we are master."""
    el = manager.elector
    store = SaStore()
    sa = SaServer(
        transport,
        all_families(),
        functools.partial(getattr, manager, "snapshot"),
        store=store,
        sm_key=manager.config.sm_key,
        ready=el.serving,
        sm=el,
    )
    reporter = Reporter(store, transport, lambda: manager.snapshot)
    manager.events.subscribe(reporter.on_event)
    groups = store.mcast
    groups.on_notice.append(reporter.report)  # traps 66 and 67
    groups.pkey_membership = partition_membership
    manager.use_multicast(groups)  # the sweeper programs the MFTs of the groups

    def dispatch(mad: bytes, src: MadAddress) -> bool:
        return sa.take(mad, src) if mad[1] == SA_CLASS else el.take(mad, src)

    transport.serve(dispatch, inline=sa.take_inline, in_place=sa.answer_in_place)
    return SmServices(sa, reporter, store)
