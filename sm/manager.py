"""The FabricManager: the heavy sweep as a fixed list of stages, and the snapshot it publishes.

Stages, each timed, with a barrier after each: discover -> LIDs -> links
(MTU, VLs) -> routing (engine chain) -> verification and credit-loop check
-> programming (PortInfo, LinearFDBTop, LFT blocks, ARMED, ACTIVE). A
failed stage ends the sweep with an error naming the stage; the next sweep
starts over. After each sweep an immutable :class:`SubnetSnapshot`
replaces the previous one whole.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fabric.errors import IbfmError
from fabric.model import Fabric
from sm.creditflow import CreditLoop, find_credit_loops
from sm.discover import Discovery, discover
from sm.lidmap import LidMap
from sm.lids import LidManager
from sm.links import LinkPlan, apply_link_plan, plan_links
from sm.program import HeldLfts, ProgramReport, program_fabric
from sm.routing.base import Lft, RoutingOptions, route
from sm.transport.base import WindowedTransport
from sm.verify import VerifyReport, verify_routes


class SweepError(IbfmError):
    """A heavy-sweep stage failed; names the stage."""


@dataclass(frozen=True)
class SmConfig:
    engines: tuple[str, ...] = ("ftree", "updn", "minhop")
    lmc: int = 0
    guid2lid: Path | None = None
    max_mtu: int = 5
    """PortInfo MTU code: 5 = 4096 bytes."""
    max_vls: int = 4
    """PortInfo VL code: 4 = VL0-7."""
    root_guids: tuple[int, ...] = ()
    subnet_prefix: int = 0xFE80000000000000
    check_credit_loops: bool = True


@dataclass(frozen=True)
class SubnetSnapshot:
    """The subnet as the last heavy sweep left it. Never mutated after publication."""

    sweep: int
    time: float
    fabric: Fabric
    discovery: Discovery
    lids: LidMap
    links: LinkPlan
    engine: str
    refused: tuple[tuple[str, str], ...]
    lft: Lft
    verify: VerifyReport
    credit_loops: tuple[CreditLoop, ...]
    program: ProgramReport
    phases: dict[str, float]
    lid_warnings: tuple[str, ...]
    smps: int

    @property
    def sm_lid(self) -> int:
        d = self.discovery
        return int(self.lids.base[d.sm_node, d.sm_port])

    @property
    def up(self) -> bool:
        """Subnet up: routes verified, everything programmed."""
        return self.verify.ok and self.program.ok


@dataclass
class FabricManager:
    transport: WindowedTransport
    config: SmConfig = field(default_factory=SmConfig)
    snapshot: SubnetSnapshot | None = None
    held: HeldLfts = field(default_factory=dict)
    sweeps: int = 0

    def __post_init__(self) -> None:
        self.lid_manager = LidManager(self.config.guid2lid, lmc=self.config.lmc)

    async def heavy_sweep(self) -> SubnetSnapshot:
        phases: dict[str, float] = {}
        sent0 = self.transport.stats.sent

        @contextmanager
        def stage(name: str) -> Iterator[None]:
            t0 = time.perf_counter()
            try:
                yield
            except IbfmError as e:
                raise SweepError(f"sweep {self.sweeps + 1}: {name} failed: {e}") from e
            finally:
                phases[name] = time.perf_counter() - t0

        cfg = self.config
        with stage("discover"):
            d = await discover(self.transport)
        fabric = d.fabric
        with stage("lids"):
            plan = self.lid_manager.plan(fabric)
        lids = plan.lids
        with stage("links"):
            links = plan_links(fabric, max_mtu=cfg.max_mtu, max_vls=cfg.max_vls)
            apply_link_plan(fabric, links)
        with stage("routing"):
            routed = route(fabric, lids, cfg.engines, RoutingOptions(root_guids=cfg.root_guids))
        with stage("verify"):
            report = verify_routes(fabric, lids, routed.lft)
        loops: list[CreditLoop] = []
        if cfg.check_credit_loops:
            with stage("credit_loops"):
                loops = find_credit_loops(fabric, lids, routed.lft)
        with stage("program"):
            prog = await program_fabric(
                self.transport,
                d,
                lids,
                links,
                routed.lft,
                sm_lid=int(lids.base[d.sm_node, d.sm_port]),
                subnet_prefix=cfg.subnet_prefix,
                held=self.held,
            )
        self.sweeps += 1
        snap = SubnetSnapshot(
            sweep=self.sweeps,
            time=time.time(),
            fabric=fabric,
            discovery=d,
            lids=lids,
            links=links,
            engine=routed.engine,
            refused=tuple(routed.refused),
            lft=routed.lft,
            verify=report,
            credit_loops=tuple(loops),
            program=prog,
            phases=phases,
            lid_warnings=tuple(plan.warnings),
            smps=self.transport.stats.sent - sent0,
        )
        self.snapshot = snap
        return snap
