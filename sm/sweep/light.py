"""Light sweeps: find what changed cheaply, and apply it to the last discovery.

A light sweep reads SwitchInfo of every switch (one batch). Switches whose
PortStateChange bit is set, and switches that did not answer, have every
PortInfo read; the bit is cleared once every port of the switch was read
(a switch read only in part keeps it, so the next sweep reads it again).
Port states are compared with the last discovery: links that went down or
came up are the changes, and so is a link that went down and came back
between two sweeps (a bounce): it is LinkUp as before, but its logical
state fell back to INIT, and it must be armed and activated again.

:func:`apply_changes` turns a discovery plus changes into the discovery
the next heavy sweep routes on, without walking the fabric again, when
the change is only links between known nodes. Anything else (a new node,
a switch that vanished) asks for a full discovery.

With M_Keys (``keys``), every SMP carries the key of the port it addresses;
the SwitchInfo read of every switch in each light sweep is the switches'
keep-alive (a passing M_Key check stops a running lease timer).

:class:`FlapDamper` holds down a port that changes state too often.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fabric.mad import NODE_INFO, PORT_INFO, SWITCH_INFO, Method, SmpAttr
from fabric.model import Fabric, NodeType, PhysState, PortState, dr_paths
from sm.sweep.discover import Discovery, Path, apply_port_info, nodeinfo_problem
from sm.sweep.mkeys import MKeys
from sm.transport.base import WindowedTransport
from sm.transport.smp import SmpRequest, smp_batch


@dataclass(frozen=True)
class PortChange:
    node: int
    port: int
    up: bool
    info: dict[str, Any] | None = None
    """PortInfo as read now (None when the switch did not answer)."""
    bounced: bool = False
    """Up now and up before, but its link retrained (PortState fell back): taken down and up again."""


@dataclass
class LightSweep:
    changes: list[PortChange] = field(default_factory=list)
    unreachable: list[int] = field(default_factory=list)
    """Switches that answered neither by their old path nor by a repaired one."""
    peers: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """For ports that came up: (node GUID, port) found behind them."""
    peer_info: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    """For ports that came up: PortInfo of the port behind them."""
    new_nodes: list[tuple[int, int]] = field(default_factory=list)
    """Ports that came up with an unknown GUID behind them."""
    smps: int = 0

    @property
    def needs_full_discovery(self) -> bool:
        return bool(self.unreachable or self.new_nodes)


async def light_sweep(
    transport: WindowedTransport,
    d: Discovery,
    *,
    recheck: Sequence[tuple[int, int]] = (),
    hint: Sequence[int] = (),
    keys: MKeys | None = None,
) -> LightSweep:
    """Find the ports whose link changed since ``d``.

    ``hint``: switches that sent a trap; their ports are read first, and the
    DR paths of everyone else are repaired around the links found down, so
    the SwitchInfo batch does not wait for timeouts on broken paths.
    ``recheck``: (node, port) pairs to read regardless of PortStateChange.
    ``keys``: the M_Keys the SMPs carry.
    """
    f = d.fabric
    out = LightSweep()
    sent0 = transport.stats.sent
    paths: list[Path | None] = list(d.paths)
    read: set[int] = set()
    partial: set[int] = set()
    downs: list[tuple[int, int]] = []

    async def read_switches(nodes: Iterable[int]) -> None:
        todo = sorted(set(nodes) - read)
        ports = await _read_ports(transport, d, todo, paths, keys)
        # A switch that answered nothing is read again once its path is repaired.
        answered = {n for (n, _), info in ports.items() if info is not None}
        read.update(answered)
        partial.update(n for (n, _), info in ports.items() if info is None)
        downs.extend(_diff(f, ports, out))

    def repair_paths() -> None:
        nonlocal paths
        g = f.copy()
        for n, p in downs:
            if g.peer_node[n, p] >= 0:
                g.disconnect(n, p)
        paths = dr_paths(g, d.sm_node, d.sm_port)

    # Nearest issuers first: a far issuer's DR path may cross the link its near neighbour reports down.
    hinted = [n for n in hint if f.node_type[n] == NodeType.SWITCH]
    for depth in sorted({len(d.paths[n]) for n in hinted}):
        await read_switches(n for n in hinted if len(d.paths[n]) == depth)
        if downs:
            repair_paths()
    switches = [n for n in f.switches.tolist() if paths[n] is not None]
    silent = [n for n in f.switches.tolist() if paths[n] is None]
    def mkeys(nodes: Sequence[int], ports: Sequence[int] | int = 0) -> list[int] | None:
        return keys.row_list(f, nodes, ports) if keys is not None else None

    # No resend rounds here: a switch that does not answer is asked again below, by a repaired path.
    answers = await smp_batch(
        transport,
        [(paths[n], Method.GET, SmpAttr.SWITCH_INFO, 0, b"") for n in switches],
        resend=0,
        mkeys=mkeys(switches),
    )
    changed: set[int] = {n for n, _ in recheck if f.node_type[n] == NodeType.SWITCH} | set(hint)
    for n, ans in zip(switches, answers, strict=True):
        if isinstance(ans, Exception):
            silent.append(n)
        elif SWITCH_INFO.unpack(ans)["PortStateChange"]:
            changed.add(n)
    await read_switches(changed - set(silent))  # a silent switch is read once its path is repaired
    if silent:
        # Paths through a link that just failed break; route around it in the model and ask again.
        repair_paths()
        # Every silent switch still reachable in the model is asked once more: by its new path if the
        # failed links changed it, else by the same one (its SwitchInfo may just have been lost).
        retry = [n for n in silent if paths[n] is not None]
        again = await smp_batch(
            transport,
            [(paths[n], Method.GET, SmpAttr.SWITCH_INFO, 0, b"") for n in retry],
            resend=1,
            mkeys=mkeys(retry),
        )
        back = [n for n, a in zip(retry, again, strict=True) if not isinstance(a, Exception)]
        out.unreachable = sorted(set(silent) - set(back))
        await read_switches(back)
    # Ports that came up: who is behind them?
    ups = [c for c in out.changes if c.up and f.node_type[c.node] == NodeType.SWITCH]
    behind: list[Path] = []  # DR path to the far end of each port that came up
    for c in ups:
        base = paths[c.node]
        assert base is not None
        behind.append((*base, c.port))
    probes: list[SmpRequest] = [(route, Method.GET, SmpAttr.NODE_INFO, 0, b"") for route in behind]
    probe_keys = None
    if keys is not None and keys.active:  # the port behind as last seen there, else the configured key
        probe_keys = [keys.key_of_route(keys.behind(int(f.port_guid[c.node, 0]), c.port)) for c in ups]
    known: list[tuple[PortChange, Path, int]] = []
    for c, route, ans in zip(ups, behind, await smp_batch(transport, probes, mkeys=probe_keys), strict=True):
        if isinstance(ans, Exception):
            continue  # came up and went again, or not trained yet: the next sweep sees it
        ni = NODE_INFO.unpack(ans)
        if nodeinfo_problem(ni) is not None:
            continue  # garbage from a device that is not there yet: the next sweep looks again
        guid, local = int(ni["NodeGUID"]), int(ni["LocalPortNum"])
        try:
            m = f.by_guid(guid)
        except KeyError:
            out.new_nodes.append((c.node, c.port))
            continue
        if local > f.nports[m] or (f.node_type[m] != NodeType.SWITCH and not f.port_exists[m, local]):
            out.new_nodes.append((c.node, c.port))  # a CA port never seen before: its GUID is new
            continue
        out.peers[(c.node, c.port)] = (guid, local)
        # A CA answers PortInfo for its ingress port (modifier 0); a switch by port number.
        known.append((c, route, 0 if f.node_type[m] != NodeType.SWITCH else local))
    peer_keys = None
    if keys is not None:
        ends = [f.by_guid(out.peers[(c.node, c.port)][0]) for c, _, _ in known]
        peer_keys = mkeys(ends, [out.peers[(c.node, c.port)][1] for c, _, _ in known])
    infos = await smp_batch(
        transport, [(r, Method.GET, SmpAttr.PORT_INFO, mod, b"") for _, r, mod in known], mkeys=peer_keys
    )
    for (c, _, _), ans in zip(known, infos, strict=True):
        if not isinstance(ans, Exception):
            out.peer_info[(c.node, c.port)] = PORT_INFO.unpack(ans)
    # Clear PortStateChange where it was set (writing 1 clears it), on switches read in full.
    clears: list[SmpRequest] = []
    cleared: list[int] = []
    for n in sorted(changed - set(out.unreachable) - partial):
        path = paths[n]
        if path is None or n not in d.switch_info:
            continue
        values = dict(d.switch_info[n])
        values["PortStateChange"] = 1
        clears.append((path, Method.SET, SmpAttr.SWITCH_INFO, 0, SWITCH_INFO.pack(values)))
        cleared.append(n)
    await smp_batch(transport, clears, mkeys=mkeys(cleared))
    out.smps = transport.stats.sent - sent0
    return out


async def _read_ports(
    transport: WindowedTransport, d: Discovery, switches: list[int], paths: list[Path | None], keys: MKeys | None
) -> dict[tuple[int, int], dict[str, Any] | None]:
    f = d.fabric
    where: list[tuple[int, int]] = []
    reqs: list[SmpRequest] = []
    for n in switches:
        path = paths[n]
        if path is None:
            continue
        for p in range(1, int(f.nports[n]) + 1):
            where.append((n, p))
            reqs.append((path, Method.GET, SmpAttr.PORT_INFO, p, b""))
    mkeys = keys.row_list(f, [n for n, _ in where]) if keys is not None else None
    out: dict[tuple[int, int], dict[str, Any] | None] = {}
    for key, ans in zip(where, await smp_batch(transport, reqs, mkeys=mkeys), strict=True):
        out[key] = None if isinstance(ans, Exception) else PORT_INFO.unpack(ans)
    return out


def _diff(
    f: Fabric, ports_now: dict[tuple[int, int], dict[str, Any] | None], out: LightSweep
) -> list[tuple[int, int]]:
    downs = []
    was_up = f.up_mask()
    for (n, p), info in ports_now.items():
        if info is None:
            continue
        is_up = info["PortPhysicalState"] == PhysState.LINKUP
        if is_up != bool(was_up[n, p]):
            out.changes.append(PortChange(n, p, is_up, info))
            if not is_up:
                downs.append((n, p))
        elif is_up and int(info["PortState"]) == PortState.INIT and int(f.state[n, p]) > PortState.INIT:
            # Down and up again since the last sweep: the link retrained to INIT under a model
            # that has it ARMED or ACTIVE. Routes may stay; the port must be brought up again.
            out.changes.append(PortChange(n, p, True, info, bounced=True))
    return downs


def apply_changes(
    d: Discovery, sweep: LightSweep, *, held: Set[tuple[int, int]] = frozenset()
) -> Discovery | None:
    """The discovery after ``sweep``'s link changes; None when a full discovery is needed.

    Ports in ``held`` (flap-damped, as (node GUID, port)) are left down.
    """
    if sweep.needs_full_discovery:
        return None
    f = d.fabric.copy()
    port_info = d.port_info.copy()
    for c in sweep.changes:
        if c.up and not c.bounced:
            continue
        if c.info is not None:
            port_info[(c.node, c.port)] = c.info
        if f.peer_node[c.node, c.port] >= 0:  # a bounced link is connected again below, as found now
            f.disconnect(c.node, c.port)
    for c in sweep.changes:
        if not c.up:
            continue
        key = (int(f.node_guid[c.node]), c.port)
        peer = sweep.peers.get((c.node, c.port))
        if peer is None or key in held:
            continue
        m = f.by_guid(peer[0])
        q = peer[1]
        if f.peer_node[m, q] >= 0 or (int(f.node_guid[m]), q) in held:
            continue
        if c.info is not None:
            port_info[(c.node, c.port)] = c.info
        f.connect(c.node, c.port, m, q, state=PortState.INIT)
        if c.info is not None:
            apply_port_info(f, c.node, c.port, c.info)
        far = sweep.peer_info.get((c.node, c.port))
        if far is not None:
            port_info[(m, q)] = far
            apply_port_info(f, m, q, far)
    hold_down(f, held)
    paths = dr_paths(f, d.sm_node, d.sm_port)
    if any(p is None for i, p in enumerate(paths) if f.node_type[i] == NodeType.SWITCH):
        return None  # a switch is cut off: let a full discovery decide what is left
    new_paths: list[Path] = [p if p is not None else d.paths[i] for i, p in enumerate(paths)]
    port_paths = dict(d.port_paths)
    up = f.up_mask()
    for n in f.cas.tolist():
        if n == d.sm_node:
            continue
        for p in np.flatnonzero(up[n]).tolist():
            m = int(f.peer_node[n, p])
            if f.node_type[m] == NodeType.SWITCH:
                port_paths[(n, p)] = (*new_paths[m], int(f.peer_port[n, p]))
    return replace(
        d,
        fabric=f,
        paths=new_paths,
        port_paths=port_paths,
        port_info=port_info,
        switch_info=dict(d.switch_info),  # programming updates it; the last snapshot keeps its own
        errors=[],
        smps=0,
        m_key_locked=[],
    )


def hold_down(f: Fabric, held: Set[tuple[int, int]]) -> None:
    """Take flap-damped ports, given as (node GUID, port), out of the model: not routed, not armed."""
    for guid, port in held:
        try:
            n = f.by_guid(guid)
        except KeyError:
            continue
        if f.peer_node[n, port] >= 0:
            f.disconnect(n, port)


class FlapDamper:
    """Hold down a port that changes state more than ``max_flaps`` times in ``window`` seconds,
    until it has been quiet for ``hold`` seconds: every change seen while held restarts the hold,
    so a link storm is kept out of the routes while it lasts, and its links come back soon after."""

    def __init__(self, *, max_flaps: int = 4, window: float = 60.0, hold: float = 10.0) -> None:
        self.max_flaps = max_flaps
        self.window = window
        self.hold = hold
        self._seen: dict[tuple[int, int], deque[float]] = {}
        self.held_until: dict[tuple[int, int], float] = {}

    def record(self, key: tuple[int, int], now: float | None = None) -> bool:
        """Count a state change of ``key`` (node GUID, port); True when it is now held down."""
        now = time.monotonic() if now is None else now
        q = self._seen.setdefault(key, deque())
        q.append(now)
        while q and q[0] < now - self.window:
            q.popleft()
        if key in self.held_until:
            self.held_until[key] = now + self.hold  # still flapping: held until quiet for ``hold``
            return False
        if len(q) > self.max_flaps:
            self.held_until[key] = now + self.hold
            return True
        return False

    def next_release(self, now: float | None = None) -> float | None:
        """When the first hold still running ends (``time.monotonic`` clock), or None when none runs."""
        now = time.monotonic() if now is None else now
        return min((t for t in self.held_until.values() if t > now), default=None)

    def flaps(self, key: tuple[int, int]) -> int:
        return len(self._seen.get(key, ()))

    def held(self, now: float | None = None) -> set[tuple[int, int]]:
        now = time.monotonic() if now is None else now
        return {k for k, t in self.held_until.items() if t > now}

    def release_expired(self, now: float | None = None) -> list[tuple[int, int]]:
        """Ports whose hold ended: they should be looked at again."""
        now = time.monotonic() if now is None else now
        done = [k for k, t in self.held_until.items() if t <= now]
        for k in done:
            del self.held_until[k]
            self._seen.pop(k, None)
        return done
