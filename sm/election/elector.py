"""The SM's SMInfo and its state machine: answering peers, electing, polling, handing over.

States (IBA 14.4.1): an SM starts DISCOVERING. After a heavy sweep's
discovery, :meth:`Elector.arbitrate` asks every other port that
advertises IsSM for its SMInfo (directed route, as OpenSM does) and
decides:

- DISCOVERING: a MASTER elsewhere, or a better SM discovering or standing
  by, makes us STANDBY (nothing is written); otherwise we are MASTER.
- MASTER: a better SM gets the subnet: we stand by at once, so that it finds
  no master (see :meth:`Elector._hand_over` for why no HANDOVER is sent).
  Trap 144 from a port (an SM's IsSM came up) makes a master ask that SM at
  once (:meth:`Elector.consider`), before its discovery reaches our port.
  Another MASTER that is not better: we stay master but write nothing until
  it hands over or stops answering (C14-60.2.1), and remind it with Trap 144
  (SM priority change) at each poll.
- STANDBY: :meth:`Elector.poll` asks the master's SMInfo every
  ``poll_interval``; a poll that fails is retried at once up to
  ``poll_retries`` times; then the master is gone and we go DISCOVERING
  (the manager sweeps, and we become master if nobody better is left).
  A master that answers but ranks below us hears Trap 144 so it hands over.

Better means higher priority, then the numerically lower port GUID. A
SubnSet(SMInfo) is taken only when legal for our state and the sender's
(IBA table 187, as OpenSM checks it): HANDOVER, DISABLE, STANDBY and
DISCOVER come from a MASTER, ACKNOWLEDGE from a STANDBY; anything else is
answered with status 0x001C and changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from fabric.errors import IbfmError
from fabric.mad import (
    PORT_INFO,
    SM_INFO,
    MadError,
    Method,
    MgmtClass,
    PortCap,
    SmpAttr,
    SmState,
    parse_mad,
    smp_dr,
    smp_lid,
    trap144_pack,
    trap_mad,
)
from fabric.model import NodeType
from sm.sweep.discover import Discovery
from sm.transport.base import MadAddress, Route, WindowedTransport
from sm.transport.smp import stamp_m_key

log = logging.getLogger(__name__)

DR_D_BIT = 0x8000
STATUS_INVALID_FIELD = 0x001C
PROVISIONAL_S = 1.0
"""Longest a master answers STANDBY while it asks a newly announced SM's SMInfo."""
PROVISIONAL_EVERY_S = 5.0
"""Least time between two such windows."""
SM_PRIORITY_CHANGE = 0x0008
"""Trap 144 ChangeFlags bit: the SM priority changed (what a better standby tells a lower master)."""


class SmInfoControl(IntEnum):
    """SubnSet(SMInfo) attribute modifiers (IBA 14.4.2)."""

    HANDOVER = 1
    ACKNOWLEDGE = 2
    DISABLE = 3
    STANDBY = 4
    DISCOVER = 5


_LEGAL_SENDER = {
    SmInfoControl.HANDOVER: SmState.MASTER,
    SmInfoControl.ACKNOWLEDGE: SmState.STANDBY,
    SmInfoControl.DISABLE: SmState.MASTER,
    SmInfoControl.STANDBY: SmState.MASTER,
    SmInfoControl.DISCOVER: SmState.MASTER,
}
_LEGAL_FOR = {
    SmInfoControl.HANDOVER: {SmState.DISCOVERING, SmState.STANDBY, SmState.MASTER},
    SmInfoControl.ACKNOWLEDGE: {SmState.STANDBY},
    SmInfoControl.DISABLE: {SmState.STANDBY},
    SmInfoControl.STANDBY: {SmState.NOT_ACTIVE},
    SmInfoControl.DISCOVER: {SmState.STANDBY},
}
"""Our states in which each control is taken (as OpenSM's legality check)."""


@dataclass(frozen=True)
class PeerSm:
    """Another SM as its SMInfo said, and how to reach it."""

    guid: int
    priority: int
    state: SmState
    act_count: int
    sm_key: int
    route: Route
    """Directed-route path to its port (or its LID)."""
    lid: int
    node_name: str = ""

    def rank(self) -> tuple[int, int]:
        return _rank(self.priority, self.guid)


def _rank(priority: int, guid: int) -> tuple[int, int]:
    """Sort key: greater is better (higher priority, then lower GUID)."""
    return priority, -guid


@dataclass(frozen=True)
class Role:
    """What the SM is now, for health, metrics and events."""

    state: SmState
    priority: int
    guid: int
    act_count: int
    master_guid: int
    """The master's port GUID (ours when we are master; 0 when none is known)."""
    master_lid: int
    since: float
    """Unix time of the last state change."""
    reason: str


StateListener = Callable[[Role], None]


class Elector:
    """Our SMInfo, the answers to peers, and the election over a transport.

    ``guid`` is our port GUID; ``lid()`` our port's current LID (0 before we
    have one). ``on_change`` hears every state change (the manager turns it
    into an event); ``request_sweep(reason, heavy)`` asks the manager for a sweep.
    """

    def __init__(
        self,
        transport: WindowedTransport,
        *,
        guid: int,
        priority: int = 0,
        sm_key: int = 1,
        poll_interval: float = 2.0,
        poll_retries: int = 3,
        lid: Callable[[], int] = lambda: 0,
        on_change: StateListener | None = None,
        request_sweep: Callable[[str, bool], None] | None = None,
        locate: Callable[[bytes], tuple[int, int] | None] | None = None,
        m_key_of: Callable[[Route], int] | None = None,
    ) -> None:
        if not 0 <= priority <= 15:
            raise ValueError(f"SM priority {priority} outside 0..15")
        self.transport = transport
        self.guid = guid
        self.priority = priority
        self.sm_key = sm_key
        self.poll_interval = poll_interval
        self.poll_retries = poll_retries
        self._lid = lid
        self._on_change = on_change
        self._request_sweep = request_sweep
        self._locate = locate
        self._m_key_of = m_key_of
        """The M_Key an SMInfo SMP along a route must carry (the addressed port's); None: keys are not in play."""
        """Directed-route SMP as it arrived -> (port GUID, LID) of the port that sent it (from the snapshot)."""
        self._asked: dict[int, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.state = SmState.DISCOVERING
        self.master: PeerSm | None = None
        """The master when it is another SM (STANDBY, or a MASTER waiting for a handover)."""
        self.peers: dict[int, PeerSm] = {}
        """Other SMs seen by the last arbitration, by port GUID."""
        self.waiting_handover = False
        """MASTER beside another master that ranks below us: we write nothing until it hands over."""
        self.first_sweep = True
        """The next sweep as master is a new master's first (hosts are told to re-register)."""
        self.since = time.time()
        self.reason = "start"
        self.step_downs = 0
        """Times this master stood by for a better SM."""
        self.takeovers = 0
        self.polls = 0
        self.poll_failures = 0
        self.sets_refused = 0
        self._next_poll = 0.0
        self._trap_tid = 0
        self._seen_lid = 0
        self._provisional_until = 0.0
        """Until then a master waiting for a newly announced SM's SMInfo answers STANDBY (``consider``)."""
        self._provisional_next = 0.0
        """Our port's LID as the last discovery read it (a standby has no snapshot of its own)."""

    # -- state ----------------------------------------------------------------------

    @property
    def act_count(self) -> int:
        """ActCount: our SMPs sent so far (OpenSM counts its QP0 MADs the same way)."""
        return self.transport.stats.sent & 0xFFFFFFFF

    @property
    def is_master(self) -> bool:
        return self.serving()

    def serving(self) -> bool:
        """:attr:`is_master` as one plain call: the SA asks it for every request it answers."""
        if self.state != SmState.MASTER or self.waiting_handover:
            return False
        until = self._provisional_until
        return until == 0.0 or time.monotonic() >= until

    @property
    def may_write(self) -> bool:
        """Whether this SM may program the fabric now."""
        return self.is_master

    def role(self) -> Role:
        if self.state == SmState.MASTER:
            mg, ml = self.guid, self._lid()
        elif self.master is not None:
            mg, ml = self.master.guid, self.master.lid
        else:
            mg, ml = 0, 0
        return Role(self.state, self.priority, self.guid, self.act_count, mg, ml, self.since, self.reason)

    def _set(self, state: SmState, reason: str, *, master: PeerSm | None = None) -> None:
        changed = state != self.state or (master is not None and master != self.master)
        if state == SmState.MASTER and self.state != SmState.MASTER:
            self.first_sweep = True
        self.state = state
        if state == SmState.MASTER:
            self.master = None if master is None else master
        elif master is not None:
            self.master = master
        if state != SmState.MASTER:
            self.waiting_handover = False
        if changed:
            self.since = time.time()
            self.reason = reason
            log.info("SM state %s (%s)", state.name, reason)
            if self._on_change is not None:
                self._on_change(self.role())

    def _sweep(self, reason: str, heavy: bool = True) -> None:
        if self._request_sweep is not None:
            self._request_sweep(reason, heavy)

    def own_guid(self) -> int:
        """Our port GUID: as discovery found it, else as the transport knows its port (before the first sweep)."""
        if not self.guid:
            t = self.transport
            lp = getattr(t, "local_port", None)
            guid = getattr(lp, "port_guid", 0) if lp is not None else 0
            if not guid:
                try:
                    guid = int(getattr(t, "port_guid", 0) or 0)
                except Exception:  # a transport not started yet has no port
                    guid = 0
            self.guid = guid
        return self.guid

    def own_lid(self) -> int:
        """Our port's LID: the snapshot's (a master), else as our last discovery read it."""
        return self._lid() or self._seen_lid

    def sminfo(self, *, key: bool = True) -> bytes:
        """Our SMInfo attribute (64 bytes); SM_Key zero unless ``key``."""
        return SM_INFO.pack(
            {
                "GUID": self.own_guid(),
                "SM_Key": self.sm_key if key else 0,
                "ActCount": self.act_count,
                "Priority": self.priority,
                "SMState": int(SmState.STANDBY if self._provisional else self.state),
            }
        ).ljust(64, b"\0")

    # -- answering peers ------------------------------------------------------------------

    def take(self, mad: bytes, src: MadAddress) -> bool:
        """The transport's service hook for SMPs: SubnGet/SubnSet(SMInfo) to our port; False for others."""
        if len(mad) < 128 or mad[1] not in (MgmtClass.SUBN_LID, MgmtClass.SUBN_DR):
            return False
        if int.from_bytes(mad[16:18], "big") != SmpAttr.SM_INFO or mad[3] not in (Method.GET, Method.SET):
            return False
        status = 0
        if mad[0] != 1 or mad[2] != 1:
            status = 0x0004
        elif mad[3] == Method.SET:
            status = self._control(int.from_bytes(mad[20:24], "big"), mad[64:128], src)
        elif self.state == SmState.MASTER and mad[1] == MgmtClass.SUBN_DR:
            self._newcomer(mad)
        self._answer(mad, src, status)
        return True

    def _newcomer(self, mad: bytes) -> None:
        """A SubnGet(SMInfo) by directed route while we are master: an SM's discovery asking. If it comes
        from a port we know as no SM, a new SM is discovering: we answer STANDBY for a moment and ask it
        (``consider``), so that a better SM finds no master and takes the subnet at once, and a lower
        one stands by behind us as it would anyway (we rank above it)."""
        locate = self._locate
        found = locate(mad) if locate is not None else None
        if found is None:
            return
        guid, lid = found
        if guid == self.own_guid() or guid in self.peers or not lid:
            return
        now = time.monotonic()
        if now < self._asked.get(guid, 0.0):
            return
        if len(self._asked) > 4096:  # a hostile host sending from many ports must not grow it for ever
            self._asked = {g: t for g, t in self._asked.items() if t > now}
        self._asked[guid] = now + 1.0
        self.expect_sm()
        task = asyncio.get_running_loop().create_task(self.consider(lid))
        self._tasks.add(task)  # (the loop keeps only a weak reference to a task)
        task.add_done_callback(self._tasks.discard)

    def _answer(self, req: bytes, src: MadAddress, status: int) -> None:
        buf = bytearray(req[:256].ljust(256, b"\0"))
        buf[3] = Method.GET_RESP
        word = status | (DR_D_BIT if req[1] == MgmtClass.SUBN_DR else 0)
        buf[4:6] = word.to_bytes(2, "big")
        buf[64:128] = self.sminfo()
        try:
            self.transport.reply(bytes(buf), src)
        except IbfmError as e:
            log.debug("SMInfo answer to LID %#x not sent: %s", src.lid, e)

    def _control(self, mod: int, data: bytes, src: MadAddress) -> int:
        """Apply a SubnSet(SMInfo); the answer's status (ours is answered as it was before)."""
        try:
            ctl = SmInfoControl(mod)
            theirs = SM_INFO.unpack(data)
        except (ValueError, MadError):
            self.sets_refused += 1
            return STATUS_INVALID_FIELD
        sender_state = int(theirs["SMState"])
        if self.sm_key and int(theirs["SM_Key"]) != self.sm_key:
            # Only an SM of this subnet (one with our SM_Key, as OpenSM's default 1) may tell us what to be.
            self.sets_refused += 1
            log.info("SMInfo Set %s from %#018x with another SM_Key refused", ctl.name, int(theirs["GUID"]))
            return STATUS_INVALID_FIELD
        if sender_state != _LEGAL_SENDER[ctl] or self.state not in _LEGAL_FOR[ctl]:
            self.sets_refused += 1
            log.info("SMInfo Set %s from %#018x refused in state %s", ctl.name, int(theirs["GUID"]), self.state.name)
            return STATUS_INVALID_FIELD
        guid = int(theirs["GUID"])
        peer = PeerSm(
            guid,
            int(theirs["Priority"]),
            SmState(sender_state),
            int(theirs["ActCount"]),
            int(theirs["SM_Key"]),
            src.lid if src.lid != 0xFFFF else (),
            src.lid if src.lid != 0xFFFF else 0,
        )
        # Applied after the answer is built from the state before (as OpenSM answers).
        loop = asyncio.get_running_loop()
        loop.call_soon(self._apply, ctl, peer)
        return 0

    def _apply(self, ctl: SmInfoControl, peer: PeerSm) -> None:
        if ctl == SmInfoControl.HANDOVER:
            self.takeovers += 1
            if self.state == SmState.MASTER:
                self.waiting_handover = False
                self.first_sweep = True
                self._sweep("handover", True)
            else:
                self._set(SmState.MASTER, f"handover from {peer.guid:#018x}")
                self._sweep("handover", True)
        elif ctl == SmInfoControl.DISABLE:
            self._set(SmState.NOT_ACTIVE, f"disabled by {peer.guid:#018x}")
        elif ctl == SmInfoControl.STANDBY:
            known = self.peers.get(peer.guid, peer)
            self._set(SmState.STANDBY, f"told to stand by by {peer.guid:#018x}", master=known)
            self._next_poll = time.monotonic() + self.poll_interval
        elif ctl == SmInfoControl.DISCOVER:
            self._set(SmState.DISCOVERING, f"told to discover by {peer.guid:#018x}")
            self._sweep("discover", True)
        # ACKNOWLEDGE in STANDBY: nothing to do (we went standby when we handed over).

    # -- asking peers ---------------------------------------------------------------------

    def _peer_routes(self, d: Discovery) -> list[tuple[int, int, Route, int, str]]:
        """(node, port, DR path, LID, name) of every end port but ours that advertises IsSM."""
        f = d.fabric
        out: list[tuple[int, int, Route, int, str]] = []
        cap_field = PORT_INFO.field("CapabilityMask")
        lid_field = PORT_INFO.field("LID")
        for node, port in list(d.port_info):
            if (node, port) == (d.sm_node, d.sm_port):
                continue
            is_switch = f.node_type[node] == NodeType.SWITCH
            if is_switch and port != 0:
                continue
            raw = d.port_info.raw((node, port))
            if raw is None:
                continue
            caps = int.from_bytes(raw[cap_field.offset // 8 : cap_field.offset // 8 + 4], "big")
            if not caps & int(PortCap.IS_SM):
                continue
            path = d.paths[node] if is_switch else d.port_paths.get((node, port), d.paths[node])
            lid = int.from_bytes(raw[lid_field.offset // 8 : lid_field.offset // 8 + 2], "big")
            out.append((node, port, path, lid, f.names[node]))
        return out

    async def _get_sminfo(self, route: Route) -> dict[str, int] | None:
        mad = (
            smp_dr(Method.GET, SmpAttr.SM_INFO, 0, 0, route)
            if isinstance(route, tuple)
            else smp_lid(Method.GET, SmpAttr.SM_INFO, 0, 0)
        )
        if self._m_key_of is not None:
            mad = stamp_m_key(mad, self._m_key_of(route))
        try:
            ans = await self.transport.send(mad, route)
            m = parse_mad(ans)
        except (IbfmError, MadError):
            return None
        if m.status & 0x7FFF:
            return None
        return {k: int(v) for k, v in SM_INFO.unpack(m.data).items() if isinstance(v, int)}

    async def arbitrate(self, d: Discovery) -> bool:
        """After discovery: ask the other SMs, decide our state; whether this sweep may program."""
        if self.state == SmState.NOT_ACTIVE:
            return False
        raw = d.port_info.raw((d.sm_node, d.sm_port))
        if raw is not None:
            at = PORT_INFO.field("LID").offset // 8
            self._seen_lid = int.from_bytes(raw[at : at + 2], "big")
        found = self._peer_routes(d)
        answers = await asyncio.gather(*(self._get_sminfo(route) for _, _, route, _, _ in found))
        peers: dict[int, PeerSm] = {}
        for (_node, _port, route, lid, name), info in zip(found, answers, strict=True):
            if info is None:
                continue
            try:
                state = SmState(info["SMState"])
            except ValueError:
                continue
            if state == SmState.NOT_ACTIVE:
                continue
            guid = info["GUID"]
            peers[guid] = PeerSm(guid, info["Priority"], state, info["ActCount"], info["SM_Key"], route, lid, name)
        self.peers = peers
        mine = _rank(self.priority, self.guid)
        best = max(peers.values(), key=PeerSm.rank, default=None)
        masters = [p for p in peers.values() if p.state == SmState.MASTER]
        if self.state in (SmState.DISCOVERING, SmState.STANDBY):
            ahead = [
                p
                for p in peers.values()
                if p.state == SmState.MASTER or (p.rank() > mine and p.state in (SmState.DISCOVERING, SmState.STANDBY))
            ]
            if ahead:
                master = masters[0] if masters else max(ahead, key=PeerSm.rank)
                why = f"{master.guid:#018x} ({master.node_name}) is master or better"
                self._set(SmState.STANDBY, why, master=master)
                self._next_poll = time.monotonic() + self.poll_interval
                return False
            self._set(SmState.MASTER, "no better SM found")
        # MASTER from here.
        if best is not None and best.rank() > mine and await self._hand_over(best):
            return False
        if masters:
            self.waiting_handover = True
            self.master = max(masters, key=PeerSm.rank)
            self._next_poll = time.monotonic() + self.poll_interval
            log.warning("another master %#018x ranks below us: waiting for its handover", self.master.guid)
            return False
        self.waiting_handover = False
        return True

    async def check_peers(self) -> bool:
        """A master's light sweep: ask the SMs we know. A better one that stands by gets the subnet
        (we are STANDBY then); True when one is now master or newly better (elect again, heavy)."""
        if self.state != SmState.MASTER or not self.peers:
            return False
        peers = list(self.peers.values())
        answers = await asyncio.gather(*(self._get_sminfo(p.route) for p in peers))
        mine = _rank(self.priority, self.guid)
        best: PeerSm | None = None
        for p, info in zip(peers, answers, strict=True):
            if info is None or info.get("GUID") != p.guid:
                continue
            try:
                state = SmState(info.get("SMState", 0))
            except ValueError:
                continue
            now = PeerSm(p.guid, info.get("Priority", 0), state, info.get("ActCount", 0), info.get("SM_Key", 0),
                         p.route, p.lid, p.node_name)
            self.peers[p.guid] = now
            if state == SmState.MASTER:
                return True
            if state != SmState.NOT_ACTIVE and now.rank() > mine and (best is None or now.rank() > best.rank()):
                best = now
        if best is not None:
            await self._hand_over(best)
        return False

    async def _hand_over(self, best: PeerSm) -> bool:
        """Give the subnet to ``best`` (better than us): we stand by at once; whether we stepped down.

        Standing by before anything else means every question the better SM asks us hears
        STANDBY: one still discovering finds no master and takes the subnet by itself (OpenSM's
        start-up path, which works); one that stands by sees its master gone at its next poll.
        We send no SubnSet(SMInfo, HANDOVER): OpenSM 3.3.23 on ibsim, handed the subnet (or told
        to DISCOVER) while it stands by, enters MASTER and its first sweep never ends (measured:
        no SUBNET UP in 90 s; two OpenSMs show the same, the new master waits 60 s for its polls to
        time out). An ibfm peer takes a HANDOVER (``take``) as the spec says.
        """
        self.step_downs += 1
        self._set(SmState.STANDBY, f"stepped down for {best.guid:#018x} ({best.node_name})", master=best)
        self._next_poll = time.monotonic() + self.poll_interval
        return True

    @property
    def _provisional(self) -> bool:
        return self._provisional_until > 0.0 and time.monotonic() < self._provisional_until

    def expect_sm(self) -> None:
        """An SM's IsSM just came up (Trap 144, seen where it arrives, even on the transport's thread):
        a master answers SMInfo as STANDBY for at most PROVISIONAL_S, until ``consider`` knows more.
        A window is never extended, and a new one opens at most every PROVISIONAL_EVERY_S: a host
        sending Trap 144 or SMInfo Gets in a loop cannot keep the master from mastering."""
        now = time.monotonic()
        if self.state == SmState.MASTER and now >= self._provisional_next:
            self._provisional_until = now + PROVISIONAL_S
            self._provisional_next = now + PROVISIONAL_EVERY_S

    async def consider(self, lid: int, *, is_sm: bool = True) -> None:
        """Trap 144 from ``lid``: an SM may have come up there (or changed priority). A master asks it
        at once and stands by if it is better, before that SM's discovery reaches our port and finds a
        master. While the answer is on its way (``is_sm``: the trap's new CapabilityMask has IsSM) we
        already answer SMInfo as STANDBY and write nothing: an SM's discovery reaches our port within
        milliseconds of its IsSM, often before its answer reaches us; a lower SM seeing us in standby
        for that moment stands by anyway (we rank above it), and we are master again at once."""
        if self.state != SmState.MASTER or not 0 < lid < 0xC000 or lid == self.own_lid():
            self._provisional_until = 0.0  # (a window the trap's peek opened)
            return
        if is_sm:
            self.expect_sm()
        try:
            mad = smp_lid(Method.GET, SmpAttr.SM_INFO, 0, 0)
            if self._m_key_of is not None:
                mad = stamp_m_key(mad, self._m_key_of(lid))
            try:
                ans = parse_mad(await self.transport.send(mad, lid, timeout=0.05, retries=1))
                info = SM_INFO.unpack(ans.data)
                state = SmState(int(info["SMState"]))
            except (IbfmError, MadError, ValueError):
                return
            if ans.status or state == SmState.NOT_ACTIVE:
                return
            peer = PeerSm(int(info["GUID"]), int(info["Priority"]), state, int(info["ActCount"]), 0, lid, lid)
            self.peers[peer.guid] = peer  # known from now on: its polls hear the truth
            better = peer.rank() > _rank(self.priority, self.guid)
            if state != SmState.MASTER and better and self.state == SmState.MASTER:
                await self._hand_over(peer)
        finally:
            self._provisional_until = 0.0

    def took_first_sweep(self) -> bool:
        """Whether the sweep about to program is this master's first (and clear it)."""
        first, self.first_sweep = self.first_sweep, False
        return first

    # -- standby ----------------------------------------------------------------------

    def next_poll_in(self) -> float | None:
        """Seconds until the master should be polled (None when we poll nobody)."""
        if self.master is None or not (self.state == SmState.STANDBY or self.waiting_handover):
            return None
        return max(0.0, self._next_poll - time.monotonic())

    async def poll(self) -> bool:
        """Ask the master's SMInfo (retried at once when it fails); True when it is gone or no longer master.

        Then we are DISCOVERING and the manager sweeps (heavy) to take over.
        """
        master = self.master
        if master is None:
            return False
        self._next_poll = time.monotonic() + self.poll_interval
        info = None
        for attempt in range(1 + self.poll_retries):
            self.polls += 1
            info = await self._get_sminfo(master.route)
            if info is not None and info.get("GUID") == master.guid:
                break
            self.poll_failures += 1
            info = None
            log.info("master %#018x did not answer poll %d", master.guid, attempt + 1)
        if info is None:
            self.takeovers += 1
            self._set(SmState.DISCOVERING, f"master {master.guid:#018x} stopped answering")
            self.master = None
            return True
        state = info.get("SMState", 0)
        if state != SmState.MASTER:
            if self.waiting_handover:
                self.waiting_handover = False
                self.master = None
                self.first_sweep = True
                return True
            self._set(SmState.DISCOVERING, f"{master.guid:#018x} is no longer master")
            self.master = None
            return True
        if _rank(self.priority, self.guid) > _rank(info.get("Priority", 0), master.guid):
            self._remind(master)
        elif self.waiting_handover:
            # The other master now ranks above us (its priority rose): it keeps the subnet, we stand by.
            self._set(SmState.STANDBY, f"master {master.guid:#018x} now ranks above us", master=master)
        return False

    def _remind(self, master: PeerSm) -> None:
        """Trap 144 (SM priority change) to a master that ranks below us, so it hands over (as OpenSM)."""
        lid = self.own_lid()
        if not master.lid or not lid:
            return
        self._trap_tid = self._trap_tid + 1 if self._trap_tid < 0xFFFFFFFF else 1
        caps = int(PortCap.IS_SM | PortCap.IS_TRAP_SUPPORTED | PortCap.IS_CLIENT_REREGISTRATION_SUPPORTED)
        notice = trap144_pack(lid, caps, other_local_changes=True, change_flags=SM_PRIORITY_CHANGE)
        try:
            self.transport.post(trap_mad(notice, self._trap_tid), master.lid)
        except (IbfmError, ValueError) as e:
            log.debug("Trap 144 to LID %d not sent: %s", master.lid, e)
