"""Partitions resolved onto a fabric: every port's PKeyTable and enforcement, as OpenSM sets them.

:func:`plan_partitions` is pure: a :class:`~sm.partitions.config.PartitionConfig`, a
:class:`~fabric.model.Fabric` and the SM's own port in, a :class:`PartitionPlan` out. It
follows OpenSM 3.3.23's ``osm_prtn.c`` (who is a member) and ``osm_pkey_mgr.c`` with
``osm_pkey.c`` (where each key goes):

- End ports are switch port 0 and every CA or router port whose link is up (what
  OpenSM's port table holds after discovery). ALL is all of them, ALL_SWITCHES the
  switches' port 0, SELF the SM's port; a later member of a partition overrides an
  earlier one for a port. Without ``allow_both_pkeys`` (OpenSM's ``-W``, off by
  default) ``both`` is full; with it a port may hold both forms of a key.
- Partitions are visited in OpenSM's map order: by the P_Key in network byte order read
  as a host integer, i.e. byte-swapped on x86 (0x0100 before 0x0001); each partition's
  limited members, then its full members. A key the port already holds (by its 15-bit
  key) keeps its index; a new key goes to the index it had before if OpenSM remembers
  one (``accum_pkeys``, kept for the life of the SM, here carried in the plan), else
  after the highest index ever used, so removed keys leave holes of 0 that are not
  refilled until the table is full; then the first hole from index 1 is taken. The
  Default key is at index 0 unless a partition with ``indx0`` puts its key there for
  its members; a key that no longer belongs at index 0 moves away. A key that does not
  fit in NodeInfo.PartitionCap is dropped (OpenSM's ERR 0512) and reported.
- The switch port facing a CA or router gets that port's keys packed without holes (a
  limited key is left out when the full one is there) and PortInfo's partition
  enforcement bits per ``part_enforce`` (both, in, out, off; with off OpenSM only
  clears the bits and leaves the table). More keys than SwitchInfo's
  PartitionEnforcementCap turn enforcement off on that port (OpenSM's ERR 0507), as
  does a cap of 0. Ports between switches never enforce.

The capacities come from NodeInfo and SwitchInfo, which the fabric model does not hold:
pass them per node (``partition_caps``, ``enforcement_caps``); the defaults are what
ibsim reports (CA 64, switch port 0 8, enforcement 64). ibfm's emulator reports 128 and
8 and an enforcement cap of 0: pass its values when planning for it.

Tables are tuples of 16-bit keys (0x8000 = full member) in index order, without
trailing zero entries; :func:`pkey_blocks` and :func:`changed_blocks` turn them into the
64-byte PKeyTable blocks to send, and only the blocks that differ.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from fabric.model import Fabric, NodeType
from sm.partitions.config import DEFAULT_PKEY, Member, Partition, PartitionConfig

__all__ = [
    "DEFAULT_CA_PARTITION_CAP",
    "DEFAULT_ENFORCEMENT_CAP",
    "DEFAULT_SWITCH_PARTITION_CAP",
    "PartEnforce",
    "PartitionPlan",
    "PortKeys",
    "changed_blocks",
    "pkey_blocks",
    "plan_partitions",
]

PartEnforce = Literal["both", "in", "out", "off"]

DEFAULT_CA_PARTITION_CAP = 64
"""NodeInfo.PartitionCap of a CA (and router) when not given: ibsim's."""
DEFAULT_SWITCH_PARTITION_CAP = 8
"""NodeInfo.PartitionCap of a switch (its port 0) when not given: ibsim's."""
DEFAULT_ENFORCEMENT_CAP = 64
"""SwitchInfo.PartitionEnforcementCap when not given: ibsim's."""
BLOCK = 32
"""P_Keys in one PKeyTable block."""

_ENFORCE_BITS: dict[str, tuple[int, int]] = {"both": (1, 1), "in": (1, 0), "out": (0, 1), "off": (0, 0)}
_FULL = 0x8000
_LIMITED_BIT, _FULL_BIT = 1, 2

Port = tuple[int, int]


@dataclass(frozen=True, slots=True)
class PortKeys:
    """What OpenSM keeps of one end port's P_Keys between sweeps.

    ``table`` as set; ``accum`` its ``accum_pkeys``: every 16-bit key it placed on the port
    with that index, in its map order; ``last`` its ``last_pkey_idx`` (highest index + 1).
    """

    table: tuple[int, ...]
    accum: tuple[tuple[int, int], ...]
    last: int


@dataclass(frozen=True, eq=False)
class PartitionPlan:
    """The P_Keys of every port of a fabric for one partitions configuration.

    ``tables``: (node, port) -> PKeyTable for each end port and each switch port that
    enforces for the CA behind it. ``enforcement``: (node, port) -> PortInfo's
    (PartitionEnforcementInbound, PartitionEnforcementOutbound) for every switch port
    with an up link. ``port_keys``: the state to pass as ``previous`` next time.
    ``problems``: what the fabric made of the file that the file alone does not say
    (GUIDs not on the subnet, keys dropped from full tables, enforcement turned off).
    ``ipoib``: the partitions flagged ipoib that have a port on the subnet.
    """

    tables: Mapping[Port, tuple[int, ...]]
    enforcement: Mapping[Port, tuple[int, int]]
    port_keys: Mapping[Port, PortKeys]
    problems: list[str]
    ipoib: tuple[Partition, ...]
    endports: npt.NDArray[np.int64]
    """``(K, 2)`` (node, port) of the end ports, in the row order of the membership arrays."""
    membership: Mapping[int, npt.NDArray[np.uint8]]
    """15-bit P_Key -> per end port: bit 0 limited member, bit 1 full member."""
    allow_both_pkeys: bool = False
    config: PartitionConfig | None = None
    """The configuration planned (what the partitions' names and flags come from)."""

    def members(self, pkey: int) -> dict[Port, bool]:
        """(node, port) -> full member?, for the ports in partition ``pkey`` (its low 15 bits)."""
        bits = self.membership.get(pkey & 0x7FFF)
        if bits is None:
            return {}
        rows = np.flatnonzero(bits)
        full = (bits[rows] & _FULL_BIT) != 0
        ports = self.endports[rows].tolist()
        return {(n, p): f for (n, p), f in zip(ports, full.tolist(), strict=True)}

    @functools.cached_property
    def _row_of(self) -> dict[Port, int]:
        return {(n, p): i for i, (n, p) in enumerate(self.endports.tolist())}

    def membership_of(self, port: Port, pkey: int) -> str | None:
        """"full", "limited" or None: how end port ``port`` belongs to partition ``pkey`` (low 15 bits)."""
        bits = self.membership.get(pkey & 0x7FFF)
        row = self._row_of.get(port)
        if bits is None or row is None or not bits[row]:
            return None
        return "full" if bits[row] & _FULL_BIT else "limited"

    def talks_with(self, port: Port) -> npt.NDArray[np.bool_] | None:
        """Per end port (rows of ``endports``): whether ``port`` shares a P_Key with it (a full member on
        one side at least), as OpenSM's ``osm_physp_share_pkey``; None when ``port`` is no end port."""
        row = self._row_of.get(port)
        if row is None:
            return None
        out = np.zeros(self.endports.shape[0], bool)
        for bits in self.membership.values():
            mine = bits[row]
            if mine & _FULL_BIT:
                out |= bits != 0
            elif mine:
                out |= (bits & _FULL_BIT) != 0
        return out

    def shared(self, a: Port, b: Port) -> tuple[int, ...]:
        """The P_Keys ``a`` and ``b`` may talk on: a key both tables hold, full on at least one side.

        Two limited members of a partition cannot talk to each other. The keys are given
        as ``a`` holds them (as OpenSM's ``osm_physp_find_common_pkey`` returns them), in
        ``a``'s table order. A port without a table shares nothing.
        """
        best_a = _best_forms(self.tables.get(a, ()))
        best_b = _best_forms(self.tables.get(b, ()))
        return tuple(k for base, k in best_a.items() if base in best_b and (k | best_b[base]) & _FULL)


def _best_forms(table: Iterable[int]) -> dict[int, int]:
    """15-bit key -> the form a port holds it in (full if it holds both), in first-index order."""
    out: dict[int, int] = {}
    for k in table:
        base = k & 0x7FFF
        if base and (base not in out or k & _FULL):
            out[base] = out.get(base, 0) | k
    return out


# -- blocks ------------------------------------------------------------------------------------------------


def pkey_blocks(table: Iterable[int], n_blocks: int | None = None) -> list[tuple[int, bytes]]:
    """(block number, 64 bytes big-endian) for every 32-key block of ``table``, padded with 0.

    ``n_blocks`` pads (or cuts) to that many blocks, e.g. ``ceil(PartitionCap / 32)``.
    """
    keys = np.fromiter(table, dtype=np.int64)
    n = -(-keys.size // BLOCK) if n_blocks is None else n_blocks
    arr = np.zeros(n * BLOCK, dtype=">u2")
    m = min(keys.size, arr.size)
    arr[:m] = keys[:m]
    rows = arr.reshape(-1, BLOCK)
    return [(i, rows[i].tobytes()) for i in range(n)]


def changed_blocks(new_table: Iterable[int], old_table: Iterable[int]) -> list[int]:
    """Numbers of the 32-key blocks that differ between two tables (missing entries read as 0)."""
    new = np.fromiter(new_table, dtype=np.int64)
    old = np.fromiter(old_table, dtype=np.int64)
    n = max(-(-new.size // BLOCK), -(-old.size // BLOCK))
    a = np.zeros(n * BLOCK, np.int64)
    b = np.zeros(n * BLOCK, np.int64)
    a[: new.size] = new
    b[: old.size] = old
    return np.flatnonzero((a.reshape(-1, BLOCK) != b.reshape(-1, BLOCK)).any(axis=1)).tolist()


# -- the plan ----------------------------------------------------------------------------------------------


def plan_partitions(
    config: PartitionConfig,
    fabric: Fabric,
    *,
    sm_port: Port | None,
    part_enforce: str = "both",
    previous: PartitionPlan | Mapping[Port, PortKeys] | None = None,
    partition_caps: Mapping[int, int] | None = None,
    enforcement_caps: Mapping[int, int] | None = None,
    allow_both_pkeys: bool = False,
) -> PartitionPlan:
    """Resolve ``config`` onto ``fabric``: every end port's PKeyTable and the switches' enforcement.

    ``sm_port`` is the SM's (node, port), what SELF means (None: SELF is nobody).
    ``part_enforce`` is OpenSM's ``--part_enforce``. ``previous`` is the plan of the last
    sweep: its keys keep their indexes. ``partition_caps``: node -> NodeInfo.PartitionCap;
    ``enforcement_caps``: switch node -> SwitchInfo.PartitionEnforcementCap (defaults:
    the module's ``DEFAULT_*`` constants). Raises ValueError for an unknown ``part_enforce``.
    """
    if part_enforce not in _ENFORCE_BITS:
        raise ValueError(f"part_enforce {part_enforce!r}: both, in, out or off")
    problems: list[str] = []
    eps, ep_of = _endports(fabric)
    ep_type = fabric.node_type[eps[:, 0]].astype(np.int64)
    k = eps.shape[0]
    sm_row = _sm_row(fabric, sm_port, ep_of, problems)
    select = _Selector(config.source, fabric, ep_type, ep_of, sm_row, problems)

    membership: dict[int, npt.NDArray[np.uint8]] = {}
    for part in config.partitions:
        bits = _membership(part, select, k, allow_both_pkeys)
        if bits.any():
            membership[part.pkey] = bits
        elif part.members:
            problems.append(f"partition {part.name!r} (0x{part.pkey:04x}) has no port on the subnet")
    indx0 = _indx0_keys(config, select, k, allow_both_pkeys)

    order = sorted(membership, key=_map_order)
    sw_port0 = ep_type == NodeType.SWITCH
    caps = _caps(eps, sw_port0, partition_caps)
    prev_ids, prev_states = _previous_ids(eps, previous)
    columns = [membership[p].astype(np.int64) for p in order] + [caps, indx0.astype(np.int64), prev_ids]
    groups, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)

    results: list[tuple[tuple[int, ...], PortKeys]] = []
    for g, row in enumerate(groups.tolist()):
        pending: list[int] = []
        for p, b in zip(order, row[: len(order)], strict=True):
            if b & _LIMITED_BIT:
                pending.append(p)
            if b & _FULL_BIT:
                pending.append(p | _FULL)
        cap, idx0, pid = row[len(order)], row[len(order) + 1], row[len(order) + 2]
        state, dropped = _place(pending, cap, idx0, prev_states[pid], allow_both_pkeys)
        results.append((state.table, state))
        if dropped:
            rows = np.flatnonzero(inverse == g)
            example = fabric.port_name(*(int(x) for x in eps[rows[0]]))
            keys = ", ".join(f"0x{key:04x}" for key in dropped)
            problems.append(
                f"PKeyTable full (PartitionCap {cap}): {keys} left out on {rows.size} port(s), e.g. {example}"
            )

    ports = [(n, p) for n, p in eps.tolist()]
    per_port = [results[g] for g in inverse.tolist()]
    tables: dict[Port, tuple[int, ...]] = {port: r[0] for port, r in zip(ports, per_port, strict=True)}
    port_keys: dict[Port, PortKeys] = {port: r[1] for port, r in zip(ports, per_port, strict=True)}
    enforcement = _switch_ports(fabric, tables, part_enforce, enforcement_caps, problems)

    ipoib = tuple(p for p in config.partitions if p.ipoib and p.pkey in membership)
    return PartitionPlan(
        tables, enforcement, port_keys, problems, ipoib, eps, membership, allow_both_pkeys, config=config
    )


def _map_order(pkey: int) -> int:
    """OpenSM's ``prtn_pkey_tbl`` order: the network-order P_Key read as a little-endian integer."""
    return ((pkey & 0xFF) << 8) | (pkey >> 8)


def _endports(fabric: Fabric) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(K, 2) end ports and a ``[node, port] -> row`` array (-1 elsewhere)."""
    sw = fabric.node_type == NodeType.SWITCH
    mask = fabric.port_exists & fabric.up_mask()
    mask[:, 0] = False
    mask[sw] = False
    mask[sw, 0] = True
    eps = np.argwhere(mask).astype(np.int64)
    ep_of = np.full(mask.shape, -1, np.int64)
    ep_of[eps[:, 0], eps[:, 1]] = np.arange(eps.shape[0])
    return eps, ep_of


def _sm_row(fabric: Fabric, sm_port: Port | None, ep_of: npt.NDArray[np.int64], problems: list[str]) -> int:
    if sm_port is None:
        return -1
    n, p = sm_port
    if not (0 <= n < fabric.n_nodes and 0 <= p <= fabric.max_port) or ep_of[n, p] < 0:
        problems.append(f"SM port {sm_port} is not an end port of the subnet: SELF is nobody")
        return -1
    return int(ep_of[n, p])


class _Selector:
    """Which end-port rows a member names; GUIDs that name none become problems, once each."""

    def __init__(
        self,
        source: str,
        fabric: Fabric,
        ep_type: npt.NDArray[np.int64],
        ep_of: npt.NDArray[np.int64],
        sm_row: int,
        problems: list[str],
    ) -> None:
        self.source = source
        self.fabric = fabric
        self.ep_of = ep_of
        self.sm_row = sm_row
        self.problems = problems
        self.k = ep_type.size
        self.by_type = {
            "ALL_CAS": np.flatnonzero(ep_type == NodeType.CA),
            "ALL_SWITCHES": np.flatnonzero(ep_type == NodeType.SWITCH),
            "ALL_ROUTERS": np.flatnonzero(ep_type == NodeType.ROUTER),
        }
        self.reported: set[tuple[int, int]] = set()

    def rows(self, member: Member, part: Partition) -> npt.NDArray[np.int64] | slice | None:
        if member.kind == "ALL":
            return slice(None)
        if member.kind in self.by_type:
            return self.by_type[member.kind]
        if member.kind == "SELF":
            if self.sm_row < 0:
                self._report(member, part, "SELF: the SM's port is not known")
                return None
            return np.array([self.sm_row], np.int64)
        assert member.guid is not None
        try:
            n, p = self.fabric.by_port_guid(member.guid)
        except KeyError:
            self._report(member, part, f"port GUID 0x{member.guid:016x} is not on the subnet")
            return None
        row = int(self.ep_of[n, p])
        if row < 0:
            self._report(member, part, f"port GUID 0x{member.guid:016x} ({self.fabric.port_name(n, p)}) is down")
            return None
        return np.array([row], np.int64)

    def _report(self, member: Member, part: Partition, what: str) -> None:
        if member.line == 0 or (member.line, member.col) in self.reported:
            return  # the implicit Default's SELF is no one's mistake
        self.reported.add((member.line, member.col))
        self.problems.append(f"{self.source}:{member.line}:{member.col}: {what} (partition {part.name!r})")


def _membership(part: Partition, select: _Selector, k: int, allow_both: bool) -> npt.NDArray[np.uint8]:
    """Per end port: bit 0 limited, bit 1 full, after the partition's members in order."""
    bits = np.zeros(k, np.uint8)
    for m in part.members:
        rows = select.rows(m, part)
        if rows is None:
            continue
        if not allow_both:
            bits[rows] = _LIMITED_BIT if m.membership == "limited" else _FULL_BIT
        elif m.membership == "full":
            bits[rows] = (bits[rows] & ~np.uint8(_LIMITED_BIT)) | _FULL_BIT
        elif m.membership == "limited":
            bits[rows] = (bits[rows] & ~np.uint8(_FULL_BIT)) | _LIMITED_BIT
        else:
            bits[rows] |= _LIMITED_BIT | _FULL_BIT
    return bits


def _indx0_keys(config: PartitionConfig, select: _Selector, k: int, allow_both: bool) -> npt.NDArray[np.uint16]:
    """Per end port the key an ``indx0`` statement put at index 0 (0: none), in file order.

    As ``osm_prtn_add_port``: the last indx0 statement naming a port wins; a later statement of
    the same P_Key without indx0 naming the port takes it back.
    """
    keys = np.zeros(k, np.uint16)
    parts = [p for p in config.partitions if any(m.indx0 for m in p.members)]
    events = sorted(((m.line, m.col, i, m) for i, p in enumerate(parts) for m in p.members), key=lambda e: e[:3])
    for _, _, i, m in events:
        part = parts[i]
        rows = select.rows(m, part)
        if rows is None:
            continue
        if m.indx0:
            limited_last = m.membership == "limited" or (m.membership == "both" and allow_both)
            keys[rows] = part.pkey if limited_last else part.pkey | _FULL
        else:
            sel = np.zeros(k, np.bool_)
            sel[rows] = True
            keys[sel & ((keys & 0x7FFF) == part.pkey)] = 0
    return keys


def _caps(
    eps: npt.NDArray[np.int64], sw_port0: npt.NDArray[np.bool_], given: Mapping[int, int] | None
) -> npt.NDArray[np.int64]:
    caps = np.where(sw_port0, DEFAULT_SWITCH_PARTITION_CAP, DEFAULT_CA_PARTITION_CAP).astype(np.int64)
    if given:
        nodes = eps[:, 0].tolist()
        for row, node in enumerate(nodes):
            cap = given.get(node)
            if cap is not None:
                caps[row] = cap
    return caps


def _previous_ids(
    eps: npt.NDArray[np.int64], previous: PartitionPlan | Mapping[Port, PortKeys] | None
) -> tuple[npt.NDArray[np.int64], list[PortKeys | None]]:
    """Per end port a small id of its previous state; ids index the returned list (0: none)."""
    states: list[PortKeys | None] = [None]
    ids = np.zeros(eps.shape[0], np.int64)
    if previous is None:
        return ids, states
    seen: dict[PortKeys, int] = {}
    get = (previous.port_keys if isinstance(previous, PartitionPlan) else previous).get
    for row, (n, p) in enumerate(eps.tolist()):
        st = get((n, p))
        if st is None:
            continue
        sid = seen.get(st)
        if sid is None:
            sid = seen[st] = len(states)
            states.append(st)
        ids[row] = sid
    return ids, states


class _Accum:
    """OpenSM's ``accum_pkeys`` of one port: 16-bit key -> index, and ``last_pkey_idx``."""

    def __init__(self, prev: PortKeys | None) -> None:
        self.map: dict[int, int] = dict(prev.accum) if prev else {}
        self.last = prev.last if prev else 0

    def set(self, key: int, idx: int) -> None:
        if idx >= self.last:
            self.last = idx + 1
        self.map.pop(key, None)
        self.map[key] = idx

    def clear(self, idx: int) -> None:
        """``clear_accum_pkey_index``: forget the first key (in map order) recorded at ``idx``."""
        for key in sorted(self.map, key=_map_order):
            if self.map[key] == idx:
                del self.map[key]
                if self.last == idx + 1:
                    self.last = max(self.map.values(), default=-1) + 1
                return

    def freeze(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted(self.map.items(), key=lambda kv: _map_order(kv[0])))


def _place(
    pending: list[int], cap: int, indx0: int, prev: PortKeys | None, allow_both: bool
) -> tuple[PortKeys, list[int]]:
    """One port's new table from its keys in processing order: ``pkey_mgr_process_physical_port``
    then ``pkey_mgr_update_port``. Returns the port's new state and the keys that did not fit."""

    def ident(key: int) -> int:
        return key if allow_both else key & 0x7FFF

    def is_default(key: int) -> bool:
        return key == (DEFAULT_PKEY | _FULL) if allow_both else key & 0x7FFF == DEFAULT_PKEY

    def is_indx0(key: int) -> bool:
        return indx0 != 0 and ident(key) == ident(indx0)

    accum = _Accum(prev)
    held: dict[int, int] = {}  # osm_pkey_tbl_t.keys: the port's table by key (full form wins)
    old = prev.table if prev else ()
    for i, key in enumerate(old):
        if key & 0x7FFF and i < cap:
            j = held.get(ident(key))
            if j is None or (not allow_both and old[j] < key):
                held[ident(key)] = i

    updated: deque[tuple[int, int]] = deque()
    queue: deque[int] = deque()
    for key in pending:
        pos = held.get(ident(key))
        is_new = pos is None
        if pos is not None:
            if indx0:
                if is_indx0(key) and pos != 0:
                    is_new = True
                    accum.clear(pos)
                if pos == 0 and not is_indx0(key):
                    is_new = True
                    accum.clear(0)
            elif pos == 0:
                if key & 0x7FFF != DEFAULT_PKEY:
                    is_new = True
                    accum.clear(0)
            elif is_default(key):
                is_new = True
                accum.clear(pos)
        if pos is None or is_new:
            queue.append(key)
        else:
            updated.appendleft((key, pos))  # "updated" entries go to the head of OpenSM's list

    table: dict[int, int] = {}
    dropped: list[int] = []
    max_blocks = -(-cap // BLOCK)
    for key, pos in updated:
        table[pos] = key
        accum.set(key, pos)
    while queue:
        key = queue.popleft()
        known = accum.map.get(key)
        if known is not None:
            if is_indx0(key) or (key != indx0 and known == 0):
                accum.clear(known)
                queue.append(key)
                continue
            table[known] = key
            continue
        if (not indx0 and is_default(key)) or is_indx0(key):
            idx = 0
        elif accum.last:
            idx = accum.last
        else:
            idx = 1
        if idx >= cap:
            free = None
            if not is_default(key):
                free = next((i for i in range(1, max_blocks * BLOCK) if table.get(i, 0) & 0x7FFF == 0), None)
            if free is None or free >= cap:
                dropped.append(key)
                continue
            idx = free
            accum.clear(idx)
        table[idx] = key
        accum.set(key, idx)

    size = max(table, default=-1) + 1
    entries = tuple(table.get(i, 0) for i in range(size))
    return PortKeys(entries, accum.freeze(), accum.last), dropped


def _switch_ports(
    fabric: Fabric,
    tables: dict[Port, tuple[int, ...]],
    part_enforce: str,
    enforcement_caps: Mapping[int, int] | None,
    problems: list[str],
) -> dict[Port, tuple[int, int]]:
    """Enforcement on every switch port with an up link; tables added for those facing a CA or router."""
    up = fabric.up_mask()
    sw = fabric.node_type == NodeType.SWITCH
    up[:, 0] = False
    n, p = np.nonzero(up & sw[:, None])
    peer = fabric.peer_node[n, p].astype(np.int64)
    peer_port = fabric.peer_port[n, p].astype(np.int64)
    to_switch = sw[peer]
    enforcement: dict[Port, tuple[int, int]] = dict.fromkeys(
        zip(n[to_switch].tolist(), p[to_switch].tolist(), strict=True), (0, 0)
    )
    bits = _ENFORCE_BITS[part_enforce]
    packed: dict[tuple[tuple[int, ...], int], tuple[tuple[int, ...], int]] = {}
    over: dict[tuple[int, int], list[str]] = {}
    facing = ~to_switch
    for sn, sp, cn, cp in zip(
        n[facing].tolist(), p[facing].tolist(), peer[facing].tolist(), peer_port[facing].tolist(), strict=True
    ):
        cap = DEFAULT_ENFORCEMENT_CAP if enforcement_caps is None else enforcement_caps.get(sn, DEFAULT_ENFORCEMENT_CAP)
        ca_table = tables.get((cn, cp))
        if part_enforce == "off" or cap <= 0 or ca_table is None:
            enforcement[(sn, sp)] = (0, 0)  # OpenSM clears the bits, or leaves a port that cannot enforce
            continue
        got = packed.get((ca_table, cap))
        if got is None:
            keys = _pack(ca_table)
            got = packed[(ca_table, cap)] = (keys[: -(-cap // BLOCK) * BLOCK], len(keys))
        table, count = got
        tables[(sn, sp)] = table
        if count <= cap:
            enforcement[(sn, sp)] = bits
        else:
            enforcement[(sn, sp)] = (0, 0)
            over.setdefault((count, cap), []).append(fabric.port_name(sn, sp))
    for (count, cap), names in over.items():
        problems.append(
            f"{count} P_Keys exceed PartitionEnforcementCap {cap}: enforcement off on {len(names)} switch port(s), "
            f"e.g. {names[0]}"
        )
    return enforcement


def _pack(table: tuple[int, ...]) -> tuple[int, ...]:
    """A CA's keys for its switch port: no holes, a limited key left out when the full one is there."""
    present = set(table)
    return tuple(k for k in table if k & 0x7FFF and (k & _FULL or (k | _FULL) not in present))
