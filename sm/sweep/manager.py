"""The FabricManager: the heavy sweep as a fixed list of stages, and the snapshot it publishes.

A light sweep (``sm/sweep/light.py``) runs every ``sweep_interval`` seconds and
at once on a trap or an API request; those triggers merge into one flag
and sweeps never overlap. When it finds a change, a heavy sweep follows,
on the last discovery with the change applied when only links between
known nodes changed, else from a new discovery.

Heavy-sweep stages, each timed, with a barrier after each: discover -> LIDs -> links
(MTU, VLs) -> routing (engine chain) -> programming (PortInfo, LinearFDBTop, LFT blocks, ARMED, ACTIVE) ->
verification and credit-loop check (after the push, so a repair reaches
the switches first; the result is part of the snapshot and its events). A
failed stage ends the sweep with an error naming the stage; the next sweep
starts over. After each sweep an immutable :class:`SubnetSnapshot`
replaces the previous one whole.

M_Keys (``sm/sweep/mkeys.py``): every SMP carries the key of the port it
addresses; the heavy sweep gives every end port its key, protection level
and lease; the guid2mkey file keeps the keys. Ports that answer no key we
have (a lost or wrong key) are named, and the sweeps wait out their lease
(bounded: (lease + 1) x (hops + 1) in all) before they look again; with lease 0 that
is an error, and no wait. A trap 256 (bad M_Key) is logged with the port and
the requester, counted in ``FabricManager.m_key_traps``, and the port gets a
keyed SMP at the next sweep (which the trap brings), stopping its lease timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.ma  # np.unique imports it on first use (9 ms): at start, not mid-sweep

from fabric.errors import IbfmError
from fabric.mad import (
    PORT_INFO,
    Method,
    MgmtClass,
    PortCap,
    SmpAttr,
    SmState,
    Trap,
    notice_unpack,
    parse_mad,
    trap_repress,
)
from fabric.model import Fabric, NodeType
from sm.analysis.creditflow import CreditLoop, find_credit_loops
from sm.analysis.verify import VerifyReport, verify_routes
from sm.election.elector import Elector, Role
from sm.lidmap import LidMap
from sm.links import LinkPlan, apply_link_plan, plan_links
from sm.multicast.mft import mft_table
from sm.multicast.tree import HopTable, McastTree, build_tree, hop_table
from sm.partitions.config import PartitionConfig, default_partitions
from sm.partitions.plan import PartitionPlan, PortKeys, plan_partitions
from sm.qos.config import QosConfig
from sm.qos.plan import QosPlan, plan_qos
from sm.routing.base import DEFAULT_CHAIN, Layers, Lft, RoutingOptions, RoutingResult, make_engine, route
from sm.sweep.discover import Discovery, discover
from sm.sweep.events import (
    CreditLoopFound,
    EventBus,
    LinkDown,
    LinkUp,
    NodeAdded,
    NodeRemoved,
    PortHeldDown,
    PortRef,
    RoutingFailed,
    SmStateChanged,
    SweepDone,
    SweepFailed,
)
from sm.sweep.lids import LidManager
from sm.sweep.light import FlapDamper, apply_changes, hold_down, light_sweep
from sm.sweep.mkeys import LockedPort, MKeys, touch_ports
from sm.sweep.offload import Emit, Offload
from sm.sweep.program import (
    HeldLfts,
    HeldMfts,
    HeldPkeys,
    HeldQos,
    MftReport,
    ProgramReport,
    program_fabric,
    program_mfts,
    qos_port_columns,
    read_pkey_tables,
)
from sm.transport.base import MadTimeout, Route, TransportStats, WindowedTransport
from sm.transport.smp import RowCodec, stamp_m_key

if TYPE_CHECKING:
    from sm.sa.mcast_groups import McGroups

log = logging.getLogger("ibfm.sm")


OFFLOAD_TIMEOUT_S = 600.0
"""How long a sweep waits for each result of its routing and checks (sm.sweep.offload) before giving up."""

MCAST_SETTLE_S = 0.02
"""After a join or leave wakes the sweeper, how long it waits for the rest of a burst before one MFT pass."""
TRAP_SETTLE_S = 0.01
"""After a trap, how long to wait for the rest of its burst before sweeping."""

_PORT_INFO = RowCodec(PORT_INFO)


class SweepError(IbfmError):
    """A sweep stage failed; names the stage."""

    def __init__(self, stage: str, message: str | None = None) -> None:
        super().__init__(message or stage)
        self.stage = stage


class StandingBy(SweepError):
    """This SM is not the master (another SM is, or is about to be): the sweep wrote nothing."""

    def __init__(self, message: str) -> None:
        super().__init__("election", message)


TRAP_CAPABILITY_CHANGE = 144
_TRAP_144 = TRAP_CAPABILITY_CHANGE.to_bytes(2, "big")
"""Trap 144: a port's CapabilityMask changed (an SM came or went) or an SM's priority: a heavy sweep."""


@dataclass(frozen=True)
class SmConfig:
    engines: tuple[str, ...] = DEFAULT_CHAIN
    lmc: int = 0
    guid2lid: Path | None = None
    max_mtu: int = 5
    """PortInfo MTU code: 5 = 4096 bytes."""
    max_vls: int = 4
    """PortInfo VL code: 4 = VL0-7."""
    root_guids: tuple[int, ...] = ()
    subnet_prefix: int = 0xFE80000000000000
    check_credit_loops: bool = True
    offload: bool = True
    """Route and check in a forked child while the MADs go out (sm.sweep.offload); False: in this process."""
    sweep_interval: float = 10.0
    """Seconds between light sweeps (traps and API requests sweep at once)."""
    flap_max: int = 4
    """State changes of one port within ``flap_window`` beyond which it is held down."""
    flap_window: float = 60.0
    flap_hold: float = 10.0
    """Seconds a held-down port must stay quiet before it is brought up again."""
    sm_priority: int = 0
    """SMInfo.Priority, 0..15 (OpenSM's default 0); the higher, the likelier master."""
    sm_key: int = 1
    """SMInfo.SM_Key (OpenSM's default 1: it ignores SMs whose key differs)."""
    sm_poll_interval: float = 2.0
    """Seconds between a standby's polls of the master."""
    sm_poll_retries: int = 3
    """Polls retried at once before a silent master is taken to be gone."""
    partitions: PartitionConfig | None = None
    """The partitions file, parsed; None: OpenSM's default (every port a full member of 0x7fff)."""
    part_enforce: str = "both"
    """Partition enforcement on switch ports facing CAs: both, in, out or off (OpenSM's part_enforce)."""
    m_key: int = dataclasses.field(default=0, repr=False)
    """M_Key every end port gets (OpenSM's m_key; 0: none, the ports are not protected); with
    ``m_key_per_port``, the secret each port's key is derived from. Left out of the repr: a secret."""
    m_key_per_port: bool = False
    """A key per port: a BLAKE2b MAC of its port GUID under ``m_key`` (sm.sweep.mkeys.derive_m_key)."""
    m_key_protect: int = 0
    """M_KeyProtectBits, 0..3 (OpenSM's m_key_protection_level): 0 a wrong key fails Sets, 1 and Gets read
    the M_Key as 0, 2 and 3 Gets fail too."""
    m_key_lease: int = 0
    """M_KeyLeasePeriod, seconds (OpenSM's m_key_lease_period; 0: the protection never lapses)."""
    guid2mkey: Path | None = None
    """guid2mkey file (OpenSM's format); None: beside ``guid2lid`` when that is set, else in memory."""
    qos: QosConfig = dataclasses.field(default_factory=QosConfig)
    """QoS (OpenSM's ``-Q`` and ``qos_*`` options, the policy file); off by default, as OpenSM."""

    @property
    def guid2mkey_path(self) -> Path | None:
        """Where the guid2mkey file is: ``guid2mkey``, else beside ``guid2lid``, else nowhere (in memory)."""
        if self.guid2mkey is not None:
            return self.guid2mkey
        return self.guid2lid.with_name("guid2mkey") if self.guid2lid is not None else None


@contextlib.contextmanager
def _closing_unstarted(*maybe: object) -> Iterator[None]:
    """Close the coroutines among ``maybe`` that never started when the block ends (a stage failed
    before it awaited them), so none is left "never awaited"."""
    try:
        yield
    finally:
        for c in maybe:
            if inspect.iscoroutine(c) and inspect.getcoroutinestate(c) == inspect.CORO_CREATED:
                c.close()


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
    programmed_at: float
    """Unix time the LFTs and port states of this sweep were in the switches."""
    started_at: float = 0.0
    """Unix time this sweep's pipeline began (its discovery; after a light sweep, the use of the
    changes it found); 0 when unknown."""
    up_s: float = 0.0
    """Seconds (monotonic) from the start of the pipeline to every port ACTIVE on its routes: what
    OpenSM calls SUBNET UP."""
    duration_s: float = 0.0
    """Seconds (monotonic) from the start of the pipeline to its end (routes verified, credit loops
    checked)."""
    partitions: PartitionPlan | None = None
    """Every port's P_Key table and partition memberships (what PathRecords and PKeyTableRecords
    answer from); None only in snapshots built outside a sweep."""
    m_key_locked: tuple[LockedPort, ...] = ()
    """Ports that answered no SMP carrying any M_Key this SM has for them (waited out: see the log)."""
    layers: Layers | None = None
    """The SL of every route (``RoutingResult.layers``: switch row of the route's entry, destination
    LID); None: every route on SL 0."""
    qos: QosPlan | None = None
    """The SL2VL and VLArb tables and VLHighLimits programmed, and the QoS levels of paths (SA's SL);
    None only in snapshots built outside a sweep."""

    def __repr__(self) -> str:
        # Short: the generated repr walks every PortInfo dict of the discovery (seconds on a large
        # fabric, and asyncio formats it when a task that returned a snapshot is shown).
        return (
            f"SubnetSnapshot(sweep={self.sweep}, engine={self.engine!r}, up={self.up}, "
            f"nodes={self.fabric.n_nodes}, max_lid={self.lids.max_lid}, smps={self.smps})"
        )

    @property
    def sm_lid(self) -> int:
        d = self.discovery
        return int(self.lids.base[d.sm_node, d.sm_port])

    @property
    def up(self) -> bool:
        """Subnet up: the whole fabric discovered, routes verified, everything programmed.

        A device that did not answer discovery (behind a port whose link is up)
        is a part of the subnet left unrouted: not up, and the next sweep is heavy.
        """
        return self.verify.ok and self.program.ok and not self.discovery.errors



def _rare(n: int) -> bool:
    """True for the 1st, 2nd, 4th, 8th ... occurrence: what is logged of something any host can repeat."""
    return n & (n - 1) == 0


class SweepProgress:
    """What the heavy sweep is doing now, for a display to poll (``ibfm/progress.py``): counters only.

    The stage helper of the sweep sets the stage; discovery counts the nodes it finds, programming the LFT
    blocks it will send and those the switches took. While a batch is on the wire its answers so far are
    read from the transport's counters (``live``): an estimate, since other SMPs of the stage share them.
    Written on the event loop, read from any thread: plain numbers, replaced, never half-written.
    """

    def __init__(self, stats: TransportStats | None = None) -> None:
        self.stats = stats
        self.sweep = 0
        self.stage = ""
        """The stage running, "" between stages."""
        self.started = 0.0
        """time.monotonic() when it began."""
        self.since = 0.0
        """time.monotonic() of the last :meth:`expect` (the rate of the expected items counts from there)."""
        self.unit = ""
        self.done = 0
        self.total = 0
        """Items the stage expects (0: not known, as in a discovery)."""
        self.finished: list[tuple[int, int, str, float, int, int, str]] = []
        """(number, sweep, stage, seconds, done, total, unit) of the last 64 stages ended, oldest first;
        stages are numbered from 1 as they end."""
        self.ended = 0
        self._answers = 0

    def begin(self, sweep: int, stage: str) -> None:
        self.sweep, self.unit, self.done, self.total = sweep, "", 0, 0
        self._answers = self.stats.received if self.stats is not None else 0
        self.started = self.since = time.monotonic()
        self.stage = stage

    def end(self) -> None:
        if self.stage:
            self.ended += 1
            entry = (self.ended, self.sweep, self.stage, time.monotonic() - self.started, self.done, self.total,
                     self.unit)
            self.finished = [*self.finished[-63:], entry]
        self.stage = ""

    def expect(self, total: int, unit: str) -> None:
        """``total`` more items of ``unit`` are on their way (their answers count from now)."""
        self.unit = unit
        self.total += total
        self._answers = self.stats.received if self.stats is not None else 0
        self.since = time.monotonic()

    def advance(self, n: int, unit: str | None = None) -> None:
        if unit is not None:
            self.unit = unit
        self.done += n
        if self.total and self.done >= self.total and self.stats is not None:
            self._answers = self.stats.received  # what the stage sends after them counts from here

    def answers(self) -> int:
        """SMPs answered since the stage began, the last :meth:`expect`, or the expected items were done."""
        return self.stats.received - self._answers if self.stats is not None else 0

    def live(self) -> int:
        """Items done, with a batch on the wire counted by its answers so far (at most ``total``)."""
        if self.total and self.done < self.total:
            return max(self.done, min(self.total, self.answers()))
        return self.done

class FabricManager:
    """Owns the sweeps: one at a time, triggers merged, snapshots and events out."""

    def __init__(
        self,
        transport: WindowedTransport,
        config: SmConfig | None = None,
        events: EventBus | None = None,
        *,
        port_guid: int = 0,
    ) -> None:
        self.transport = transport
        self.config = config or SmConfig()
        self.events = events or EventBus()
        self.snapshot: SubnetSnapshot | None = None
        self.progress = SweepProgress(transport.stats)
        """What the heavy sweep running is doing (a progress display polls it)."""
        cfg = self.config
        self.elector = Elector(
            transport,
            guid=port_guid,
            priority=cfg.sm_priority,
            sm_key=cfg.sm_key,
            poll_interval=cfg.sm_poll_interval,
            poll_retries=cfg.sm_poll_retries,
            lid=self._own_lid,
            on_change=self._role_changed,
            request_sweep=lambda reason, heavy: self.request_sweep(reason, heavy=heavy),
            locate=self._dr_sender,
            m_key_of=self.m_key_of_route,
        )
        """SMInfo and the election: whether this SM may write to the fabric."""
        transport.trap_peek = self._peek_trap
        self.held: HeldLfts = {}
        self.held_pkeys: HeldPkeys = {}
        self.held_qos: HeldQos = {}
        """SL2VL and VLArb tables the ports hold as far as we know (by node GUID)."""
        self.no_high_limit: set[tuple[int, int]] = set()
        """Ports (node GUID, port) that do not keep VLHighLimit (ibsim): not asked again."""
        self.no_enforcement: set[tuple[int, int]] = set()
        """Switch ports (node GUID, port) that do not keep partition enforcement: not asked again."""
        self.mcast: McGroups | None = None
        """The SA's multicast groups (:meth:`use_multicast`), whose MFTs the sweeps program."""
        self.held_mfts: HeldMfts = {}
        self.mft_report: MftReport | None = None
        """What the last MFT programming did."""
        self.mft_blocks_sent = 0
        """MFT blocks sent since start (a metric)."""
        self._hops: tuple[Fabric, HopTable] | None = None
        self._mcast_dirty = False
        """A group changed since the MFTs were last programmed."""
        self._mcast_changed: set[int] = set()
        """MLIDs of the groups that changed since the last pass."""
        self._mcast_trees: dict[int, McastTree] = {}
        """MLID -> the tree the MFTs were last programmed with."""
        self._sm_groups: set[bytes] = set()
        """MGIDs of the groups this SM made for its partitions (IPoIB broadcast groups)."""
        self.sweeps = 0
        self.lid_manager = LidManager(self.config.guid2lid, lmc=self.config.lmc)
        for name in self.config.engines:  # loaded here once, not in every sweep's forked child
            make_engine(name)
        self.damper = FlapDamper(
            max_flaps=self.config.flap_max, window=self.config.flap_window, hold=self.config.flap_hold
        )
        self._force_heavy = True
        self._wake = asyncio.Event()
        self._reasons: set[str] = set()
        self._lock = asyncio.Lock()
        self._trap_lids: set[int] = set()
        self.bad_traps = 0
        """Unsolicited MADs that looked like traps but were no readable Notice."""
        self.repress_failures = 0
        """TrapRepresses that could not be posted."""
        cfg = self.config
        self.m_keys = MKeys(
            key=cfg.m_key,
            per_port=cfg.m_key_per_port,
            protect=cfg.m_key_protect,
            lease=cfg.m_key_lease,
            path=cfg.guid2mkey_path,
        )
        """The M_Keys: what each port holds and should hold, the guid2mkey file."""
        for w in self.m_keys.warnings:
            log.warning("M_Key: %s", w)
        self.m_key_traps = 0
        """Traps 256 (bad M_Key: an SMP with a wrong key reached a port) received. A counter here; the
        metric belongs in exporters/metrics.py."""
        self.m_key_locked: list[LockedPort] = []
        """Ports that answered no SMP carrying any key we have for them, at the last heavy sweep."""
        self._m_key_retry_at: float | None = None
        """When (monotonic) the next sweep looks at locked ports again, their lease run out."""
        self._m_key_deadline: float | None = None
        """Until when (monotonic) the sweeps wait out leases for the ports locked now ((lease + 1) x (hops + 1))."""
        self._m_key_since = 0.0
        self._m_key_said: frozenset[str] = frozenset()
        self._m_key_gave_up = False
        self._m_key_touch: set[tuple[int, int]] = set()
        """End ports (node, port) a trap 256 came from: sent a keyed SMP at the next sweep."""
        self._m_key_touched_at = 0.0
        """When (monotonic) every protected end port last got an SMP with its key."""
        self._trap_pairs: dict[tuple[int, int], int] = {}
        self.m_key_clock: Callable[[], float] = time.monotonic
        """Monotonic seconds for the M_Key waits (tests put the emulator's clock here)."""
        self._log_m_key_config()

    def _log_m_key_config(self) -> None:
        cfg, keys = self.config, self.m_keys
        if not cfg.m_key:
            if cfg.m_key_per_port or cfg.m_key_protect or cfg.m_key_lease:
                log.warning("M_Key: sm.m_key is 0: no port gets a key; its protection level and lease check nothing")
            return
        where = keys.path if keys.path is not None else "memory only (no guid2mkey file: keys are lost with ibfm)"
        log.info(
            "M_Key: %s, protection level %d, lease %s; keys kept in %s",
            "a key per port" if cfg.m_key_per_port else "one key for every port",
            cfg.m_key_protect,
            f"{cfg.m_key_lease} s" if cfg.m_key_lease else "infinite (0)",
            where,
        )
        if cfg.m_key_protect and cfg.m_key_lease and cfg.sweep_interval > cfg.m_key_lease:
            log.warning(
                "M_Key: sm.sweep_interval %g s is longer than sm.m_key_lease_period %d s: after a failed M_Key "
                "check (another SM or a tool trying a port) the lease may run out, and the port fall back to "
                "protection level 0, before the next sweep sends it its key; a trap 256 brings a sweep at once, "
                "a lost one does not",
                cfg.sweep_interval,
                cfg.m_key_lease,
            )

    def _own_lid(self) -> int:
        s = self.snapshot
        return s.sm_lid if s is not None else 0

    def _role_changed(self, role: Role) -> None:
        self.events.emit(
            SmStateChanged(
                state=role.state.name.lower(),  # type: ignore[arg-type]
                priority=role.priority,
                guid=f"{role.guid:#018x}",
                master_guid=f"{role.master_guid:#018x}" if role.master_guid else None,
                master_lid=role.master_lid,
                reason=role.reason,
            )
        )

    # -- triggers ---------------------------------------------------------------

    def use_multicast(self, groups: McGroups) -> None:
        """Program the MFTs of ``groups`` (the SA's): after every heavy sweep, and soon after each join or
        leave (the SA only notes the change; the sweeper sends the SMPs)."""
        self.mcast = groups

        def changed(mlid: int, group: object) -> None:
            self._mcast_dirty = True
            self._mcast_changed.add(mlid)
            self._wake.set()

        groups.on_change.append(changed)

    async def multicast_pass(self) -> None:
        """Joins and leaves since the last pass: the MFTs, and nothing else (what :meth:`run` does when
        only the groups changed)."""
        async with self._lock:
            self._wake.clear()
            if self.snapshot is not None:
                await self._program_multicast(self.snapshot, full=False)

    async def _program_multicast(self, snap: SubnetSnapshot, *, full: bool = True) -> None:
        """The SM's own groups (each ipoib partition's broadcast group), then one tree per group over
        ``snap``'s topology and the MFT blocks that differ from what the switches hold.

        ``full`` (after a heavy sweep): groups pruned of ports that left, every tree built again. Else (joins
        and leaves since the last pass): only the trees of the groups that changed."""
        groups = self.mcast
        if groups is None or not self.elector.may_write:
            return
        self._mcast_dirty = False
        changed, self._mcast_changed = self._mcast_changed, set()
        f, d = snap.fabric, snap.discovery
        if self._hops is None or self._hops[0] is not f:
            self._hops = (f, hop_table(f))
            full = True
        if full:
            caps = [int(d.switch_info.get(n, {}).get("MulticastFDBCap", 0)) for n in f.switches.tolist()]
            if caps and min(caps) > 0:
                groups.set_mlid_cap(min(caps))
            plan = snap.partitions
            made: set[bytes] = set()
            for part in plan.ipoib if plan is not None else ():
                for scope in part.scope or (None,):
                    params: dict[str, Any] = {"scope": scope}
                    if part.sl and self.config.qos.enabled:  # as OpenSM, the partition's sl only with QoS on
                        params["sl"] = part.sl
                    if part.mtu:
                        params["mtu"] = part.mtu
                    if part.rate:
                        params["rate"] = part.rate
                    if part.q_key is not None:
                        params["qkey"] = part.q_key
                    if part.tclass is not None:
                        params["tclass"] = part.tclass
                    if part.flow_label is not None:
                        params["flow_label"] = part.flow_label
                    try:
                        made.add(groups.create_ipoib_broadcast(part.pkey, **params).mgid)
                    except IbfmError as e:
                        log.warning("partition %s: no IPoIB broadcast group: %s", part.name, e)
            for mgid in self._sm_groups - made:  # their partition (or its ipoib flag) was taken out
                if groups.release_permanent(mgid):
                    log.info("multicast group %s: its partition is gone; kept only while members hold it", mgid.hex())
            self._sm_groups = made
            groups.prune(snap)
            self._mcast_trees = {}
            changed = {g.mlid for g in groups.groups.values()}
        hops = self._hops[1]
        trees = self._mcast_trees
        for mlid in changed:
            g = groups.by_mlid(mlid)
            if g is None:
                trees.pop(mlid, None)
                continue
            members: list[tuple[int, int]] = []
            for guid in sorted(groups.ports(g)):
                with contextlib.suppress(KeyError):
                    members.append(f.by_port_guid(guid))
            trees[mlid] = build_tree(f, snap.lids, snap.lft, members, hops=hops, branches="hops")
        if not trees and not self.held_mfts:
            return
        try:
            rep = await program_mfts(self.transport, d, mft_table(f, trees), self.held_mfts, self.m_keys)
        except IbfmError as e:
            log.warning("multicast forwarding tables not programmed: %s", e)
            return
        self.mft_report = rep
        self.mft_blocks_sent += rep.blocks_sent
        if rep.failures:
            log.warning("MFT programming: %d failures, e.g. %s", len(rep.failures), rep.failures[0])
        elif rep.blocks_sent:
            log.info("MFTs: %d blocks sent for %d groups", rep.blocks_sent, len(trees))

    def set_partitions(self, partitions: PartitionConfig | None) -> None:
        """Use ``partitions`` from the next sweep on (a heavy one, asked for here): the P_Key table blocks
        that change, and only those, are sent; every port keeps the indexes of the keys it keeps."""
        self.config = dataclasses.replace(self.config, partitions=partitions)
        self.request_sweep("partitions", heavy=True)

    def request_sweep(self, reason: str, *, heavy: bool = False) -> None:
        """Ask for a sweep soon (traps, the API, a timer); requests merge into one."""
        self._reasons.add(reason)
        if heavy:
            self._force_heavy = True
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep until ``stop`` is set: at start, every ``sweep_interval``, and on every request."""
        self._reasons.add("start")
        trap_task = asyncio.create_task(self._watch_traps(stop))
        try:
            while not stop.is_set():
                try:
                    if self._mcast_dirty and not self._reasons and not self._force_heavy:
                        # woken by joins or leaves only: a moment for the rest of a burst, then one pass
                        await asyncio.sleep(MCAST_SETTLE_S)
                        await self.multicast_pass()
                    else:
                        await self.sweep()
                except SweepError:
                    pass  # reported as an event (standing by: as a state change); the next sweep starts over
                except Exception as e:  # a bug or a device answering nonsense must not stop the SM
                    log.exception("sweep failed")
                    self._force_heavy = True
                    self.events.emit(SweepFailed(stage="unexpected", reason=f"{type(e).__name__}: {e}"))
                if self._reasons:  # asked for during a multicast pass (which clears the wake-up): sweep now
                    continue
                waiter = asyncio.create_task(self._wake.wait())
                stopper = asyncio.create_task(stop.wait())
                wait = self.config.sweep_interval
                release = self.damper.next_release()
                if release is not None:  # a held port is looked at again as soon as its hold ends
                    wait = min(wait, max(0.0, release - time.monotonic()) + 0.01)
                poll = self.elector.next_poll_in()
                if poll is not None:  # a standby polls its master on its own clock
                    wait = min(wait, poll + 0.001)
                retry = self.m_key_retry_in()
                if retry is not None:  # locked ports: looked at again once their lease ran out
                    wait = min(wait, retry + 0.01)
                await asyncio.wait({waiter, stopper}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
        finally:
            trap_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trap_task

    async def _watch_traps(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            trap = await self.transport.next_trap(timeout=1.0)
            if trap is None:
                continue
            await self._sm_trap(trap)
            # Both ends of a link report it: gather the burst, so the sweep reads the near end first.
            burst, until = [trap], loop.time() + TRAP_SETTLE_S
            while (left := until - loop.time()) > 0 and (more := await self.transport.next_trap(left)) is not None:
                burst.append(more)
            if self._take_traps(burst):  # garbage from a hostile or broken host sweeps nothing
                self.request_sweep("trap")

    def _dr_sender(self, mad: bytes) -> tuple[int, int] | None:
        """(port GUID, LID) of the port that sent directed-route SMP ``mad`` to us, followed back along its
        ReturnPath over the snapshot's cables; None when the model does not lead there."""
        snap = self.snapshot
        if snap is None or len(mad) < 256:
            return None
        f, d = snap.fabric, snap.discovery
        hops = mad[7]
        if not 0 < hops <= 63:
            return None
        node, port = d.sm_node, 0
        for k in range(hops, 0, -1):  # ReturnPath[k]: where the SMP entered node k (we are node hops)
            out = mad[192 + k]
            if not 0 < out <= int(f.nports[node]) or f.peer_node[node, out] < 0:
                return None
            node, port = int(f.peer_node[node, out]), int(f.peer_port[node, out])
        return int(f.port_guid[node, port]), int(snap.lids.base[node, port])

    def _peek_trap(self, trap: bytes) -> None:
        """Where a trap arrives (any thread): Trap 144 with IsSM from another port makes a master answer
        STANDBY at once, before that SM's discovery asks us (milliseconds later)."""
        if len(trap) >= 84 and trap[1] == MgmtClass.SUBN_LID and trap[68:70] == _TRAP_144:
            caps = int.from_bytes(trap[80:84], "big")
            issuer = int.from_bytes(trap[70:72], "big")
            if caps & PortCap.IS_SM and 0 < issuer < 0xC000 and issuer != self.elector.own_lid():
                self.elector.expect_sm()

    async def _sm_trap(self, trap: bytes) -> None:
        """Trap 144 from a port other than ours: an SM may have come up there; the election asks it now."""
        if len(trap) >= 84 and trap[1] == MgmtClass.SUBN_LID and trap[68:70] == _TRAP_144:
            issuer = int.from_bytes(trap[70:72], "big")
            caps = int.from_bytes(trap[80:84], "big")  # Trap 144's NewCapabilityMask (DataDetails 6..9)
            await self.elector.consider(issuer, is_sm=bool(caps & PortCap.IS_SM))

    def _take_traps(self, traps: list[bytes]) -> int:
        """Answer each trap with a TrapRepress to its issuer and remember who sent it; how many call for a
        sweep (every readable trap but a trap 256 that our own SMP caused: a lockout sweeping itself).

        A MAD that is no readable Notice is counted in ``bad_traps`` and logged
        once in a while (any host can send them, as fast as it likes).
        """
        good = 0
        for trap in traps:
            try:
                m = parse_mad(trap)
                if m.method != Method.TRAP or m.attr_id != SmpAttr.NOTICE:
                    raise ValueError(f"method {m.method:#04x} attribute {m.attr_id:#06x} is no trap")
                notice = notice_unpack(m.data)
                issuer = int(notice["IssuerLID"])
            except (IbfmError, ValueError, KeyError, IndexError) as e:
                self.bad_traps += 1
                if _rare(self.bad_traps):
                    log.warning("unreadable trap ignored (%d so far): %s", self.bad_traps, e)
                continue
            if m.data[4:6] == _TRAP_144:  # an SM came, went or changed priority: look at every port
                self._force_heavy = True
            bad_m_key = bool(notice["IsGeneric"] and notice["TrapNumber"] == Trap.BAD_M_KEY)
            good += not (bad_m_key and self._bad_m_key(notice))
            if 0 < issuer < 0xC000:  # a unicast LID
                if not bad_m_key:  # (no link changed: the light sweep's hint is for link traps)
                    self._trap_lids.add(issuer)
                if m.mgmt_class != MgmtClass.SUBN_LID:
                    continue  # a directed-route trap: its repress would need the return path; the sweep covers it
                try:
                    self.transport.post(self._keyed(trap_repress(trap), issuer), issuer)
                except (IbfmError, ValueError) as e:
                    self.repress_failures += 1
                    if _rare(self.repress_failures):
                        n = self.repress_failures
                        log.warning("cannot repress trap from LID %d (%d so far): %s", issuer, n, e)
        return good

    # -- M_Keys ------------------------------------------------------------------

    def _lid_port(self, lid: int) -> tuple[int, int] | None:
        """The end port (node, port; a switch's port 0) owning ``lid`` in the snapshot, if any."""
        snap = self.snapshot
        if snap is None or not 0 < lid <= snap.lids.max_lid or snap.lids.owner_node[lid] < 0:
            return None
        return int(snap.lids.owner_node[lid]), int(snap.lids.owner_port[lid])

    def _keyed(self, mad: bytes, lid: int) -> bytes:
        """``mad`` (a TrapRepress) with the M_Key of the port owning ``lid``, as OpenSM answers traps."""
        return stamp_m_key(mad, self.m_key_of_route(lid))

    def m_key_of_route(self, route: Route) -> int:
        """The M_Key an SMP along ``route`` (a DR path or a LID) carries: the key of the port it addresses,
        followed over the snapshot's cables; 0 when no key is in play, the configured key when the snapshot
        does not lead there. For SMPs built outside the sweeps (the election's SMInfo: stamp_m_key)."""
        keys, snap = self.m_keys, self.snapshot
        if not keys.active:
            return 0
        if snap is None:
            return keys.key
        f = snap.fabric
        if isinstance(route, int):
            port = self._lid_port(route)
        else:
            node, port_in = snap.discovery.sm_node, snap.discovery.sm_port
            for out in route:
                if not 0 < out <= int(f.nports[node]) or f.peer_node[node, out] < 0:
                    return keys.key
                node, port_in = int(f.peer_node[node, out]), int(f.peer_port[node, out])
            port = (node, 0 if f.is_switch(node) else port_in)
        return keys.key if port is None else int(keys.port_keys(f)[port])

    def _bad_m_key(self, notice: dict[str, Any]) -> bool:
        """Trap 256: an SMP with a wrong M_Key reached the issuer. Logged with the port and the requester
        (each pair a few times, then rarely), counted, and the port gets a keyed SMP at the next sweep:
        a passing check stops the lease timer the failure started. Whether our own SMP caused it."""
        self.m_key_traps += 1
        issuer, requester = int(notice["IssuerLID"]), int(notice["LIDADDR"])
        port = self._lid_port(issuer)
        snap = self.snapshot
        f = snap.fabric if snap is not None else None
        where = f"LID {issuer}" + (f" ({f.port_name(*port)})" if f is not None and port is not None else "")
        if notice["DRNotice"]:
            who = (
                f"a directed-route SMP (DrSLID {notice['DRSLID']:#06x}, {notice['DRHopCount']} hops, return path "
                f"{notice['DRReturnPath']})"
            )
        else:
            owner = self._lid_port(requester)
            who = f"LID {requester}" + (f" ({f.port_name(*owner)})" if f is not None and owner is not None else "")
        keys, carried = self.m_keys, int(notice["M_Key"])
        if port is not None and f is not None:
            ours = carried in (int(keys.port_keys(f)[port]), keys.want(int(f.port_guid[port])))
            if keys.protecting:
                self._m_key_touch.add(port)
        else:  # no snapshot yet, or a LID it does not know: the keys we send ports we do not know
            ours = bool(carried) and carried in (keys.key, *keys.candidates(None))
        pair = (issuer, requester)
        n = self._trap_pairs[pair] = self._trap_pairs.get(pair, 0) + 1
        if len(self._trap_pairs) > 4096:  # a host spraying LIDs: forget the oldest pairs
            for k in list(self._trap_pairs)[:2048]:
                del self._trap_pairs[k]
        if _rare(n):
            try:
                attr = SmpAttr(int(notice["AttributeID"])).name
            except ValueError:
                attr = "attribute"
            names = {int(Method.GET): "Get", int(Method.SET): "Set"}
            method = names.get(int(notice["Method"]), f"method {notice['Method']:#x}")
            log.warning(
                "trap 256 (bad M_Key): %s refused a %s(%s %#06x, modifier %#x) from %s carrying %s (%d from there "
                "so far, %d in all)",
                where,
                method,
                attr,
                int(notice["AttributeID"]),
                int(notice["AttributeModifier"]),
                who,
                "a key of this SM's (its own SMP: a port whose key it does not hold, or one that took a new key "
                "meanwhile)"
                if ours
                else "a wrong key",
                n,
                self.m_key_traps,
            )
        return ours

    def _learn_m_keys(self, d: Discovery) -> None:
        """What a full discovery read: which port is behind which, and the M_Keys the end ports show."""
        keys, f = self.m_keys, d.fabric
        if keys.active:
            keys.learn_links(f)
        info = d.port_info
        where = [(n, p) for n, p in f.endports().tolist() if (n, p) in info]
        if where:
            rows = np.frombuffer(b"".join([info.raw(k) or bytes(64) for k in where]), np.uint8).reshape(len(where), -1)
            keys.learn(f, where, rows)
        self._m_key_touched_at = self.m_key_clock()

    def _m_key_suspects(self, d: Discovery, prog: ProgramReport) -> list[LockedPort]:
        """Ports locked out: the ones discovery could not read with any key, and the end ports whose Sets
        timed out while their PortInfo shows protection and not the key we sent (at level 1 a wrong key
        reads the M_Key as 0: Gets pass, Sets fail)."""
        out = list(d.m_key_locked)
        if not prog.timed_out or not self.m_keys.active:
            return out
        f = d.fabric
        sent = self.m_keys.port_keys(f)
        for n, e in sorted(set(prog.timed_out)):
            raw = d.port_info.raw((n, e))
            if raw is None:
                continue
            pi = _PORT_INFO.get_fields(raw, ("M_Key", "M_KeyProtectBits", "M_KeyLeasePeriod"))
            if pi["M_KeyProtectBits"] and pi["M_Key"] != int(sent[n, e]):
                route = d.paths[n] if f.is_switch(n) else d.port_paths.get((n, e), d.paths[n])
                out.append(LockedPort(f.port_name(n, e), route, int(f.port_guid[n, e]), int(pi["M_KeyLeasePeriod"])))
        return out

    def _m_key_refused(self, f: Fabric, prog: ProgramReport) -> None:
        """Ports that took a PortInfo Set but not its M_Key fields: not keyed again (said once)."""
        keys = self.m_keys
        new = sorted({(n, p) for n, p in prog.m_key_refused if int(f.port_guid[n, p]) not in keys.ignored})
        if not new:
            return
        keys.ignored.update(int(f.port_guid[n, p]) for n, p in new)
        log.warning(
            "M_Key: %d ports took PortInfo Sets but not their M_Key, M_KeyProtectBits or M_KeyLeasePeriod (no "
            "M_Key support, as ibsim's devices): they are not protected, and not asked again (e.g. %s)",
            len(new),
            ", ".join(f.port_name(n, p) for n, p in new[:4]),
        )

    def m_key_retry_in(self, now: float | None = None) -> float | None:
        """Seconds until the sweeps look at M_Key-locked ports again (their lease run out); None: no wait."""
        if self._m_key_retry_at is None:
            return None
        now = self.m_key_clock() if now is None else now
        return max(0.0, self._m_key_retry_at - now)

    def _m_key_lockout(self, locked: list[LockedPort]) -> None:
        """Say which ports answer no key we have, and wait out their lease (bounded), or say that none
        runs out (lease 0). Called after each heavy sweep with the ports locked then."""
        now = self.m_key_clock()
        if not locked:
            if self.m_key_locked:
                log.warning(
                    "M_Key: every port answers its key again (%d were locked; %.0f s since the first wait)",
                    len(self.m_key_locked),
                    now - self._m_key_since,
                )
            self.m_key_locked = []
            self._m_key_retry_at = self._m_key_deadline = None
            self._m_key_said = frozenset()
            self._m_key_gave_up = False
            return
        keys = self.m_keys
        if not self.m_key_locked:
            self._m_key_since = now
        self.m_key_locked = locked
        lease, hops = keys.lease_wait(locked)
        names = [f"{x.where} (DR {','.join(map(str, x.route)) or 'local'})" for x in locked]
        shown = "; ".join(names[:8]) + (f"; and {len(names) - 8} more" if len(names) > 8 else "")
        said = frozenset(names)
        fresh = said != self._m_key_said
        self._m_key_said = said
        file_hint = f"put their keys in {keys.path} (0x<port guid> 0x<m_key> per line)" if keys.path else (
            "set sm.guid2mkey to a file holding their keys (0x<port guid> 0x<m_key> per line)"
        )
        if not lease:
            self._m_key_retry_at = None
            if fresh:
                log.error(
                    "M_Key: %d ports answer no SMP carrying the keys this SM has for them (their key is lost, or "
                    "not ours): %s. Their M_Key lease period is 0 (infinite, sm.m_key_lease_period 0): their "
                    "protection never lapses, so this SM cannot manage them without their keys. To recover, "
                    "%s and restart, or reset those ports (a power cycle clears the key).",
                    len(locked),
                    shown,
                    file_hint,
                )
            return
        # A port h hops away has h protected ports before it (our own at hop 0 included), found locked only once
        # the ones before answer: h + 1 leases in turn, each looked at one second after it ran out.
        budget = (lease + 1) * (hops + 1)
        self._m_key_deadline = max(self._m_key_deadline or 0.0, self._m_key_since + budget)
        if now >= self._m_key_deadline:
            self._m_key_retry_at = None
            if fresh or not self._m_key_gave_up:
                self._m_key_gave_up = True
                log.error(
                    "M_Key: %d ports still answer no key after %.0f s of waiting ((lease %d s + 1) x (%d hops + 1)): "
                    "%s. Their lease may be longer than %d s, or 0. The sweeps go on every sm.sweep_interval; to "
                    "recover, %s, or reset those ports.",
                    len(locked),
                    now - self._m_key_since,
                    lease,
                    hops,
                    shown,
                    lease,
                    file_hint,
                )
            return
        if not fresh and self._m_key_retry_at is not None and now < self._m_key_retry_at:
            return  # a sweep meanwhile (the timer): the wait said runs on (the lease is not restarted by it)
        wait = min(lease + 1.0, self._m_key_deadline - now)
        self._m_key_retry_at = now + wait
        log.warning(
            "M_Key: %d ports answer no SMP carrying the keys this SM has for them (a lost or wrong key): %s. "
            "Waiting out their M_Key lease: the failed SMPs started it, and when it runs out their protection "
            "falls to 0 and a Get reads their key. Looking again in %.0f s (lease %d s + 1); ports %d hops away "
            "may need the lease of each port before them in turn: at most %.0f s in all ((lease + 1) x (hops + 1)), "
            "until %s.",
            len(locked),
            shown,
            wait,
            lease,
            hops,
            self._m_key_deadline - self._m_key_since,
            time.strftime("%H:%M:%S", time.localtime(time.time() + self._m_key_deadline - now)),
        )

    async def _m_key_keepalive(self, snap: SubnetSnapshot) -> None:
        """A keyed SMP to the ports a trap 256 came from, and, every half lease, to every protected CA port
        (the light sweep's SwitchInfo reads cover the switches): a lease timer started by someone's wrong
        key stops before it runs out (IBA 14.2.4.2)."""
        keys, cfg = self.m_keys, self.config
        if not keys.protecting:
            self._m_key_touch.clear()
            return
        now = self.m_key_clock()
        ports = set(self._m_key_touch)
        self._m_key_touch.clear()
        f = snap.fabric
        due = cfg.m_key_protect and cfg.m_key_lease and now - self._m_key_touched_at + cfg.sweep_interval >= (
            cfg.m_key_lease / 2
        )
        if due:
            ep = f.endports()
            ports.update((n, p) for n, p in ep.tolist() if not f.is_switch(n))
            self._m_key_touched_at = now
        if not ports:
            return
        d = snap.discovery
        silent = await touch_ports(self.transport, f, d.paths, d.port_paths, keys, sorted(ports))
        if silent:
            log.warning(
                "M_Key: %d ports did not answer an SMP carrying their key (e.g. %s): the next heavy sweep looks again",
                len(silent),
                f.port_name(*silent[0]),
            )
            self._force_heavy = True
        self._save_m_keys()

    def _save_m_keys(self) -> None:
        for note in self.m_keys.save():
            log.warning("M_Key: %s", note)

    # -- sweeps -------------------------------------------------------------------

    async def sweep(self) -> SubnetSnapshot | None:
        """One sweep: light, and heavy when something changed. Returns the new snapshot, if any."""
        async with self._lock:
            self._wake.clear()
            reasons = sorted(self._reasons) or ["timer"]
            self._reasons.clear()
            self._take_traps(self.transport.pending_traps())  # every queued trap is covered by this sweep
            trap_lids, self._trap_lids = self._trap_lids, set()
            el = self.elector
            if el.state == SmState.NOT_ACTIVE:
                return None
            if el.state == SmState.STANDBY or el.waiting_handover:
                # A standby writes nothing: it watches its master, and sweeps only to take over.
                if el.next_poll_in() or not await el.poll():
                    return None
                self._force_heavy = True
            prev = self.snapshot
            # Holds that ended are released whatever the sweep: a heavy one reads every port anyway.
            released = self.damper.release_expired()
            # No switch seen last time (the SM's own link was down, say): nothing for a light sweep to
            # ask; a full discovery costs a few SMPs then and finds the fabric once the link is back.
            if prev is None or self._force_heavy or not prev.fabric.switches.size:
                return await self._heavy(None, kind_changes=0, reasons=reasons)
            t0 = time.perf_counter()
            sent0 = self.transport.stats.sent
            recheck = []
            for guid, port in released:
                with contextlib.suppress(KeyError):
                    recheck.append((prev.fabric.by_guid(guid), port))
            try:
                lids = prev.lids
                hint = [
                    int(lids.owner_node[x]) for x in trap_lids if x <= lids.max_lid and lids.owner_node[x] >= 0
                ]
                light = await light_sweep(self.transport, prev.discovery, recheck=recheck, hint=hint, keys=self.m_keys)
            except IbfmError as e:
                self.events.emit(SweepFailed(stage="light", reason=str(e)))
                self._force_heavy = True
                raise SweepError("light", f"light sweep failed: {e}") from e
            f = prev.fabric
            held_before = self.damper.held()
            for c in light.changes:
                key = (int(f.node_guid[c.node]), c.port)
                if c.up and not c.bounced and key in held_before:
                    continue  # a held port is out of the model: it reads "up" until released, no new flap
                if self.damper.record(key):
                    self.events.emit(
                        PortHeldDown(
                            port=_ref(f, c.node, c.port),
                            flaps=self.damper.flaps(key),
                            until=time.time() + self.config.flap_hold,
                        )
                    )
            held = self.damper.held()
            # A held port coming up stays out; a held port that bounced must come out of the routes.
            relevant = [
                c
                for c in light.changes
                if not (c.up and not c.bounced and (int(f.node_guid[c.node]), c.port) in held)
            ]
            try:
                await self._m_key_keepalive(prev)
            except IbfmError as e:
                log.warning("M_Key: keyed SMPs to refresh the leases failed: %s", e)
            if not relevant and not light.needs_full_discovery and not released:
                if await el.check_peers():  # a master beside us, or a better SM: elect again
                    return await self._heavy(None, kind_changes=0, reasons=[*reasons, "sm"])
                self.events.emit(
                    SweepDone(
                        sweep=prev.sweep,
                        kind="light",
                        duration_s=time.perf_counter() - t0,
                        lft_blocks_sent=0,
                        smps=self.transport.stats.sent - sent0,
                        engine=prev.engine,
                        subnet_up=prev.up,
                        reasons=reasons,
                    )
                )
                if self._mcast_dirty:  # joins and leaves since the last pass
                    await self._program_multicast(prev, full=False)
                return None
            try:
                d = apply_changes(prev.discovery, light, held=held)
            except IbfmError as e:  # the changes do not fit the model: look at everything again
                log.warning("light sweep changes not applicable (%s); full discovery", e)
                d = None
            return await self._heavy(d, kind_changes=len(light.changes), extra_smps=light.smps, reasons=reasons)

    async def heavy_sweep(self) -> SubnetSnapshot:
        """A full heavy sweep (discovery from scratch)."""
        async with self._lock:
            return await self._heavy(None, kind_changes=0, reasons=["request"])

    async def _heavy(
        self, d: Discovery | None, *, kind_changes: int, extra_smps: int = 0, reasons: list[str] | None = None
    ) -> SubnetSnapshot:
        t0 = time.perf_counter()
        prev = self.snapshot
        try:
            snap = await self._pipeline(d, extra_smps)
        except StandingBy:
            self._force_heavy = True  # (the state change was the event)
            raise
        except SweepError as e:
            self._force_heavy = True
            self.events.emit(SweepFailed(stage=e.stage, reason=str(e)))
            raise
        # A sweep that could not program everything is repeated in full next time.
        self._force_heavy = not snap.program.ok or bool(snap.discovery.errors)
        self._emit_diff(prev, snap)
        if snap.credit_loops:
            first = snap.credit_loops[0]
            self.events.emit(
                CreditLoopFound(engine=snap.engine, loops=len(snap.credit_loops), example=_loop_names(first))
            )
        self.events.emit(
            SweepDone(
                sweep=snap.sweep,
                kind="heavy",
                duration_s=time.perf_counter() - t0,
                lft_blocks_sent=snap.program.blocks_sent,
                smps=snap.smps,
                engine=snap.engine,
                subnet_up=snap.up,
                changes=kind_changes,
                reasons=reasons or [],
            )
        )
        await self._program_multicast(snap)
        return snap

    def _emit_diff(self, prev: SubnetSnapshot | None, snap: SubnetSnapshot) -> None:
        if prev is None:
            return
        old, new = prev.fabric, snap.fabric
        og, ng = set(old.node_guid.tolist()), set(new.node_guid.tolist())
        for g in sorted(ng - og):
            n = new.by_guid(g)
            self.events.emit(NodeAdded(guid=f"{g:#018x}", name=new.names[n], node_type=_kind(new, n)))
        for g in sorted(og - ng):
            n = old.by_guid(g)
            self.events.emit(NodeRemoved(guid=f"{g:#018x}", name=old.names[n], node_type=_kind(old, n)))
        ol, nl = _link_keys(old), _link_keys(new)
        for a, b in sorted(ol - nl):
            self.events.emit(LinkDown(a=_ref_guid(old, *a), b=_ref_guid(old, *b)))
        for a, b in sorted(nl - ol):
            self.events.emit(LinkUp(a=_ref_guid(new, *a), b=_ref_guid(new, *b)))

    async def _pipeline(self, d: Discovery | None, extra_smps: int) -> SubnetSnapshot:
        phases: dict[str, float] = {}
        sent0 = self.transport.stats.sent
        started_at, t_start = time.time(), time.perf_counter()
        sweep_no = self.sweeps + 1

        @contextmanager
        def stage(name: str) -> Iterator[None]:
            t0 = time.perf_counter()
            self.progress.begin(sweep_no, name)
            try:
                yield
            except SweepError:
                raise
            except IbfmError as e:
                raise SweepError(name, f"sweep {sweep_no}: {name} failed: {e}") from e
            finally:
                phases[name] = time.perf_counter() - t0
                self.progress.end()

        cfg = self.config
        el = self.elector
        if self._m_key_retry_at is not None and self.m_key_clock() >= self._m_key_retry_at:
            self._m_key_retry_at = None  # this sweep is the look after the lease (a new wait is set if need be)
        if d is None:
            self.m_keys.own_guid = el.own_guid()
            with stage("discover"):
                try:
                    d = await discover(self.transport, keys=self.m_keys, progress=self.progress)
                except MadTimeout as e:
                    if self.m_keys.active and e.route == ():  # our own port does not take our key
                        self._m_key_lockout([LockedPort("this SM's own port", (), self.m_keys.own_guid or None)])
                    raise
            self._learn_m_keys(d)
            hold_down(d.fabric, self.damper.held())
        if not el.guid:
            el.guid = int(d.fabric.port_guid[d.sm_node, d.sm_port])
        with stage("election"):  # the other SMs are asked before anything is written
            if not await el.arbitrate(d):
                master = el.master
                who = f"{master.guid:#018x} ({master.node_name or master.lid})" if master else "nobody"
                raise StandingBy(f"sweep {sweep_no}: {el.state.name.lower()}; master is {who}")
        reregister = el.took_first_sweep()
        fabric = d.fabric
        with stage("lids"):
            plan = self.lid_manager.plan(fabric)
        lids = plan.lids
        with stage("links"):
            links = plan_links(fabric, max_mtu=cfg.max_mtu, max_vls=cfg.max_vls)
            apply_link_plan(fabric, links)
        # A switch we have not seen before, or one that reset (LinearFDBTop 0), holds no LFT we know.
        known = set(self.snapshot.fabric.node_guid.tolist()) if self.snapshot is not None else set()
        for n in fabric.switches.tolist():
            guid = int(fabric.node_guid[n])
            if guid not in known or not d.switch_info.get(n, {}).get("LinearFDBTop"):
                self.held.pop(guid, None)
                self.held_mfts.pop(guid, None)
        with stage("partitions"):
            parts = await self._plan_partitions(d)
        if known:
            gone = {int(g) for g in fabric.node_guid[fabric.switches].tolist() if g not in known}
            gone |= {int(fabric.node_guid[n]) for n in fabric.switches.tolist()
                     if not d.switch_info.get(n, {}).get("LinearFDBTop")}  # fmt: skip
            if gone:  # a new or reset switch holds tables we do not know
                self.held_qos = {k: v for k, v in self.held_qos.items() if k not in gone}
        with stage("qos"):
            qos_base = self._plan_qos(d, links, parts)
        options = RoutingOptions(root_guids=cfg.root_guids, max_layers=self._max_layers(links))
        check_loops = cfg.check_credit_loops

        def compute(emit: Emit) -> None:
            # In a forked child (sm.sweep.offload): routing while the ports are configured, then the
            # checks while the LFT blocks go out and the ports turn ACTIVE.
            t = time.perf_counter()
            routed = route(fabric, lids, cfg.engines, options)
            emit((routed, time.perf_counter() - t))
            t = time.perf_counter()
            emit((verify_routes(fabric, lids, routed.lft), time.perf_counter() - t))
            if check_loops:
                t = time.perf_counter()
                # per (link, VL): every port maps the layers' SL k to VL k (sm.qos.plan), so identity;
                # routes route() already found free of loops on one VL are not built into a graph again
                loops = [] if routed.acyclic else find_credit_loops(
                    fabric, lids, routed.lft, from_cas=True, layers=routed.layers
                )
                emit((loops, time.perf_counter() - t))

        async def result(name: str) -> Any:
            try:
                value, phases[name] = await off.get(timeout=OFFLOAD_TIMEOUT_S)
            except IbfmError as e:
                if name == "routing":
                    self.events.emit(RoutingFailed(reason=str(e)))
                raise SweepError(name, f"sweep {sweep_no}: {name} failed: {e}") from e
            return value

        routed: RoutingResult | None = None
        have_routes = asyncio.Event()
        qos_plan = qos_base

        async def routed_lft() -> Lft:
            nonlocal routed
            routed = await result("routing")
            have_routes.set()
            return routed.lft

        async def qos_tables() -> QosPlan | None:
            # The tables wait for the routes only for their layers (SL k -> VL k on every port).
            nonlocal qos_plan
            await have_routes.wait()
            assert routed is not None
            layers = routed.layers
            n_layers = int(layers.max()) + 1 if layers is not None and layers.size else 1
            if n_layers > 1:
                qos_plan = self._plan_qos(d, links, parts, layers=n_layers)
            for problem in qos_plan.problems[:5]:
                log.warning("qos: %s", problem)
            if len(qos_plan.problems) > 5:
                log.warning("qos: %d more problems", len(qos_plan.problems) - 5)
            return None if qos_plan.empty else qos_plan

        what = f"sweep {sweep_no}: routing and checks"
        def still_master() -> None:
            # A better SM may have appeared while this sweep ran (we stood down for it): stop writing.
            if not el.may_write:
                raise StandingBy(f"sweep {sweep_no}: stood down during the sweep; nothing more written")

        async with Offload(compute, what=what, fork=cfg.offload, urgent=1) as off:  # the LFT is urgent
            # In a thread of this process (no fork), routing beside SMPs in flight would stall them.
            lft: Lft | Awaitable[Lft] = routed_lft() if off.forked else await routed_lft()
            still_master()
            qos_co = qos_tables()
            with stage("program"), _closing_unstarted(lft, qos_co):
                prog = await program_fabric(
                    self.transport,
                    d,
                    lids,
                    links,
                    lft,
                    sm_lid=int(lids.base[d.sm_node, d.sm_port]),
                    subnet_prefix=cfg.subnet_prefix,
                    held=self.held,
                    reregister=reregister,
                    pkeys=parts.tables,
                    enforce=self._enforcement(fabric, parts),
                    held_pkeys=self.held_pkeys,
                    keys=self.m_keys,
                    progress=self.progress,
                    qos=qos_co,
                    held_qos=self.held_qos,
                    high_limit=self._high_limits(fabric, qos_base),
                )
            self._m_key_refused(fabric, prog)
            if prog.high_limit_refused:
                self.no_high_limit.update(prog.high_limit_refused)
                log.info("%d ports read VLHighLimit back as not set: left alone there", len(prog.high_limit_refused))
            with stage("m_keys"):
                self._save_m_keys()  # the keys the ports took, before anything else can fail
            locked = self._m_key_suspects(d, prog)
            self._m_key_lockout(locked)
            if prog.enforcement_refused:
                self.no_enforcement.update(prog.enforcement_refused)
                log.warning(
                    "%d switch ports read partition enforcement back as not set (e.g. %s): left off there",
                    len(prog.enforcement_refused), fabric.port_name(fabric.by_guid(prog.enforcement_refused[0][0]),
                                                                    prog.enforcement_refused[0][1]),
                )  # fmt: skip
            programmed_at, up_s = time.time(), time.perf_counter() - t_start
            off.hurry()  # nothing left to slow down: the checks get the CPU
            # Checked while the blocks went out, so a repair reaches the switches first.
            report: VerifyReport = await result("verify")
            loops: list[CreditLoop] = await result("credit_loops") if check_loops else []
        assert routed is not None
        still_master()
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
            smps=self.transport.stats.sent - sent0 + extra_smps,
            programmed_at=programmed_at,
            started_at=started_at,
            up_s=up_s,
            duration_s=time.perf_counter() - t_start,
            partitions=parts,
            m_key_locked=tuple(locked),
            layers=routed.layers,
            qos=qos_plan,
        )
        self.snapshot = snap
        return snap

    def _plan_qos(self, d: Discovery, links: LinkPlan, parts: PartitionPlan, *, layers: int = 1) -> QosPlan:
        """SL2VL and VLArb tables and VLHighLimits of every port (sm.qos.plan), the QoS levels of paths."""
        f = d.fabric
        enhanced = np.zeros(f.n_nodes, bool)
        for n, si in d.switch_info.items():
            enhanced[n] = bool(si.get("EnhancedPort0", 0))
        return plan_qos(
            self.config.qos,
            f,
            qos_port_columns(d),
            enhanced,
            links.op_vls,
            layers=layers,
            partitions=parts,
            sm_port=(d.sm_node, d.sm_port),
        )

    def _high_limits(self, f: Fabric, plan: QosPlan) -> dict[tuple[int, int], int] | None:
        """The plan's VLHighLimits, but not on the ports known not to keep them."""
        if not plan.high_limit:
            return None
        guid = f.node_guid
        return {(n, p): v for (n, p), v in plan.high_limit.items() if (int(guid[n]), p) not in self.no_high_limit}

    def _max_layers(self, links: LinkPlan) -> int:
        """The VLs (layers) a layered routing engine may use: the fewest data VLs of any up link (VL0-7:
        8), and with QoS on at most ``qos_max_vls``."""
        codes = links.op_vls[links.op_vls > 0]
        vls = min(_DATA_VLS.get(int(c), 1) for c in np.unique(codes).tolist()) if codes.size else 1
        if self.config.qos.enabled:
            vls = min(vls, self.config.qos.max_vls)
        return max(vls, 1)

    def _enforcement(self, f: Fabric, plan: PartitionPlan) -> dict[tuple[int, int], tuple[int, int]]:
        """The plan's enforcement, but off on the ports known not to keep it."""
        if not self.no_enforcement:
            return dict(plan.enforcement)
        guid = f.node_guid
        return {
            (n, p): (0, 0) if (int(guid[n]), p) in self.no_enforcement else v for (n, p), v in plan.enforcement.items()
        }

    async def _plan_partitions(self, d: Discovery) -> PartitionPlan:
        """Each port's P_Key table and the switch ports' enforcement, from the partitions file.

        A key a port holds keeps its index, as OpenSM keeps it: what the last plan put there (by
        port GUID: node indexes change as nodes come and go), or, for a port this process has not
        planned yet (a new port, a restart), what its table reads now. Tables clipped by a cap, and
        members the fabric lacks, are logged (a few, then a count)."""
        cfg = self.config
        f = d.fabric
        prev_keys: dict[tuple[int, int], PortKeys] = {}
        if self.snapshot is not None and self.snapshot.partitions is not None:
            old = self.snapshot.fabric
            for (n, p), pk in self.snapshot.partitions.port_keys.items():
                with contextlib.suppress(KeyError):
                    prev_keys[(f.by_guid(int(old.node_guid[n])), p)] = pk
        eps = [(int(n), int(p)) for n, p in f.endports().tolist()]
        guid = f.node_guid
        unread = [k for k in eps if k not in prev_keys and (int(guid[k[0]]), k[1]) not in self.held_pkeys]
        if unread:
            await read_pkey_tables(self.transport, d, unread, self.held_pkeys, self.m_keys)
        for n, p in eps:
            if (n, p) not in prev_keys and (t := self.held_pkeys.get((int(guid[n]), p))) is not None:
                keys = t.tolist()
                while keys and not keys[-1]:
                    keys.pop()
                prev_keys[(n, p)] = PortKeys(table=tuple(keys), accum=(), last=0)
        plan = plan_partitions(
            cfg.partitions if cfg.partitions is not None else default_partitions(),
            f,
            sm_port=(d.sm_node, d.sm_port),
            part_enforce=cfg.part_enforce,
            previous=prev_keys,
            partition_caps={n: int(ni.get("PartitionCap", 0)) for n, ni in d.node_info.items()},
            enforcement_caps={n: int(si.get("PartitionEnforcementCap", 0)) for n, si in d.switch_info.items()},
        )
        for problem in plan.problems[:5]:
            log.warning("partitions: %s", problem)
        if len(plan.problems) > 5:
            log.warning("partitions: %d more problems", len(plan.problems) - 5)
        return plan


_NodeKind = Literal["switch", "ca", "router"]
_DATA_VLS = {1: 1, 2: 2, 3: 4, 4: 8, 5: 15}
"""Data VLs of each PortInfo OperationalVLs code."""
_KIND_OF: dict[NodeType, _NodeKind] = {NodeType.SWITCH: "switch", NodeType.CA: "ca"}


def _kind(f: Fabric, n: int) -> _NodeKind:
    return _KIND_OF.get(NodeType(int(f.node_type[n])), "router")


def _ref(f: Fabric, n: int, p: int) -> PortRef:
    return PortRef(guid=f"{int(f.node_guid[n]):#018x}", name=f.names[n], port=p)


def _ref_guid(f: Fabric, guid: int, port: int) -> PortRef:
    return _ref(f, f.by_guid(guid), port)


def _link_keys(f: Fabric) -> set[tuple[tuple[int, int], tuple[int, int]]]:
    g = f.node_guid
    out = set()
    for a, b, c, d in f.link_array().tolist():
        x, y = (int(g[a]), b), (int(g[c]), d)
        out.add((x, y) if x < y else (y, x))
    return out


def _loop_names(loop: CreditLoop) -> list[str]:
    return [str(ch) for ch in getattr(loop, "channels", ())]
