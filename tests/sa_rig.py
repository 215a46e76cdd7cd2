"""An emulated subnet with ibfm as master SM answering SA queries, and a host port to ask from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.model import Fabric
from sm.partitions.config import PartitionConfig
from sm.sa.client import SaAnswer, sa_query
from sm.sa.server import SaServer
from sm.sa.services import SmServices, serve_port
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot
from sm.transport.emulated import EmulatedTransport


@dataclass
class SaRig:
    emu: EmulatedFabric
    sm: EmulatedTransport
    host: EmulatedTransport
    manager: FabricManager
    server: SaServer
    snap: SubnetSnapshot
    services: SmServices

    @property
    def sa_lid(self) -> int:
        return self.snap.sm_lid

    async def ask(self, method: int, attr: int, **kw: object) -> SaAnswer:
        return await sa_query(self.host, self.sa_lid, method, attr, **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def sa_rig(
    fabric: Fabric | None = None,
    *,
    host_node: int | None = None,
    sm_key: int = 1,
    partitions: PartitionConfig | None = None,
) -> AsyncIterator[SaRig]:
    """ibfm swept ``fabric`` (default a 2-level k=4 fat tree) from its first CA; the SA answers on its
    port; ``host`` speaks from another CA (``host_node``, default the last)."""
    f = fabric if fabric is not None else fattree(2, 4)
    emu = EmulatedFabric(f)
    sm = EmulatedTransport(emu, issm=True)
    mgr = FabricManager(
        sm, SmConfig(offload=False, check_credit_loops=False, sm_key=sm_key, partitions=partitions)
    )
    snap = await mgr.heavy_sweep()
    services = serve_port(sm, mgr)
    server = services.sa
    node = host_node if host_node is not None else int(f.cas[-1])
    host = EmulatedTransport(emu, endpoint=emu.attach(node, 1), timeout=0.2, retries=2)
    try:
        yield SaRig(emu, sm, host, mgr, server, snap, services)
    finally:
        services.close()
        await host.close()
        await sm.close()
