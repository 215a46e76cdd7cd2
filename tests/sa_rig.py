"""An emulated subnet with ibfm as master SM answering SA queries, and a host port to ask from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fabric.emulator import EmulatedFabric
from fabric.generate import fattree
from fabric.model import Fabric
from sm.sa.client import SaAnswer, sa_query
from sm.sa.families import all_families
from sm.sa.server import SaServer
from sm.sa.store import SaStore
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot
from sm.transport.base import MadAddress
from sm.transport.emulated import EmulatedTransport


@dataclass
class SaRig:
    emu: EmulatedFabric
    sm: EmulatedTransport
    host: EmulatedTransport
    manager: FabricManager
    server: SaServer
    snap: SubnetSnapshot

    @property
    def sa_lid(self) -> int:
        return self.snap.sm_lid

    async def ask(self, method: int, attr: int, **kw: object) -> SaAnswer:
        return await sa_query(self.host, self.sa_lid, method, attr, **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def sa_rig(
    fabric: Fabric | None = None, *, host_node: int | None = None, sm_key: int = 1
) -> AsyncIterator[SaRig]:
    """ibfm swept ``fabric`` (default a 2-level k=4 fat tree) from its first CA; the SA answers on its
    port; ``host`` speaks from another CA (``host_node``, default the last)."""
    f = fabric if fabric is not None else fattree(2, 4)
    emu = EmulatedFabric(f)
    sm = EmulatedTransport(emu, issm=True)
    mgr = FabricManager(sm, SmConfig(offload=False, check_credit_loops=False))
    snap = await mgr.heavy_sweep()
    store = SaStore()
    server = SaServer(sm, all_families(), lambda: mgr.snapshot, store=store, sm_key=sm_key, sm=mgr.elector)

    def dispatch(mad: bytes, src: MadAddress) -> bool:
        if mad[1] == 0x03:
            return server.take(mad, src)
        return mgr.elector.take(mad, src)

    sm.serve(dispatch)
    node = host_node if host_node is not None else int(f.cas[-1])
    host = EmulatedTransport(emu, endpoint=emu.attach(node, 1), timeout=0.2, retries=2)
    try:
        yield SaRig(emu, sm, host, mgr, server, snap)
    finally:
        server.close()
        await host.close()
        await sm.close()
