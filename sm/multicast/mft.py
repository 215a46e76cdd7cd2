"""MulticastForwardingTable blocks and MLID allocation.

Layout (IBA 14.2.5.12): an MFT entry is one port mask per MLID, MLID ``0xC000 + i`` at index
``i``. The table goes over the wire in pieces of 32 MLIDs by 16 ports: block ``b`` holds MLIDs
``0xC000 + 32b .. 0xC000 + 32b + 31``, position ``p`` ports ``16p .. 16p + 15`` (bit ``i`` of a
16-bit mask = port ``16p + i``). One (block, position) is one SMP: 32 big-endian ``uint16`` masks,
AttributeModifier = block in bits 0-8, position in bits 28-31. A switch of ``N`` ports has
``ceil((N + 1) / 16)`` positions (port 0 counts), as OpenSM's ``max_position``.

What is sent (:func:`mft_blocks_changed`)
    OpenSM 3.3 (``mcast_mgr_set_mftables``) sends, on every multicast pass (each heavy sweep, with
    ``config_all``, and each batch of joins and leaves), every block from 0 to the highest block it
    ever set on that switch (``max_block_in_use``, which only grows), at every position, changed or
    not, zeros included, and MulticastFDBTop in SwitchInfo where PortInfo.CapabilityMask says the
    switch has it (option ``use_mfttop``). Here only blocks that differ from what the switch
    holds are sent; a switch whose table is unknown (new, or a Set failed: pass ``held=None``)
    gets every block up to the top MLID in use at every position, zeros included, which
    overwrites whatever garbage it holds there. Entries above the top are never in use; the
    sweep sets MulticastFDBTop to the top so switches that support it ignore them, and when the
    top grows the new blocks count as unknown and are sent whole. Blocks the switch held above a
    lowered top are cleared when not already zero.

MLIDs (:class:`MlidPool`)
    OpenSM takes the MLID a join asks for when it is free and in range, else the lowest free one
    (``get_new_mlid``); the range ends at the smallest MulticastFDBCap of all switches.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from fabric.errors import IbfmError
from fabric.model import Fabric
from sm.multicast.tree import McastTree

MCAST_LID_FIRST = 0xC000
"""The first multicast LID (MLID index 0)."""
MCAST_LID_LAST = 0xFFFE
"""The last multicast LID (0xFFFF is the permissive LID)."""
MLIDS_PER_BLOCK = 32
PORTS_PER_POSITION = 16
MAX_BLOCK = 0x1FF
"""Largest block number (9 bits of the AttributeModifier)."""
MAX_POSITION = 0xF
"""Largest position (4 bits of the AttributeModifier)."""
BLOCK_BYTES = MLIDS_PER_BLOCK * 2

MftTable = npt.NDArray[np.uint16]
"""``uint16[n_switches, n_entries, n_positions]`` (one switch: ``[n_entries, n_positions]``)."""


class MlidPoolError(IbfmError):
    """No MLID left, or an MLID freed or asked for that the pool cannot give."""


def n_positions(nports: int) -> int:
    """Positions of a switch with ``nports`` ports (ports 0..nports)."""
    return (nports + PORTS_PER_POSITION) // PORTS_PER_POSITION


def mft_positions(fabric: Fabric) -> npt.NDArray[np.int64]:
    """Positions of each switch, per LFT row (``fabric.switches``)."""
    return (fabric.nports[fabric.switches].astype(np.int64) + PORTS_PER_POSITION) // PORTS_PER_POSITION


def _check_mlid(mlid: int) -> int:
    if not MCAST_LID_FIRST <= mlid <= MCAST_LID_LAST:
        raise ValueError(f"MLID {mlid:#x} outside {MCAST_LID_FIRST:#x}..{MCAST_LID_LAST:#x}")
    return mlid - MCAST_LID_FIRST


def mft_table(fabric: Fabric, trees: Mapping[int, McastTree]) -> MftTable:
    """The MFT of every switch for groups ``trees`` (MLID -> tree).

    ``uint16[n_switches, n_entries, n_positions]``: row ``i`` is switch ``fabric.switches[i]``,
    entry ``mlid - 0xC000``, position ``p`` holds ports ``16p..16p+15``. ``n_entries`` covers
    whole blocks up to the highest MLID of ``trees``; ``n_positions`` is that of the widest
    switch, so a narrower switch's table is ``table[row, :, :mft_positions(fabric)[row]]``.
    """
    sw = fabric.switches
    row_of = np.full(fabric.n_nodes, -1, np.int64)
    row_of[sw] = np.arange(sw.size)
    top = max((_check_mlid(m) for m in trees), default=-1)
    n_entries = (top // MLIDS_PER_BLOCK + 1) * MLIDS_PER_BLOCK if top >= 0 else 0
    n_pos = n_positions(fabric.max_port)
    table = np.zeros((sw.size, n_entries, n_pos), np.uint16)
    rows: list[int] = []
    idx: list[int] = []
    masks: list[int] = []
    for mlid, tree in trees.items():
        i = mlid - MCAST_LID_FIRST
        for node, mask in tree.masks.items():
            rows.append(node)
            idx.append(i)
            masks.append(mask)
    if not masks:
        return table
    r = row_of[np.asarray(rows, np.int64)]
    if (r < 0).any():
        raise ValueError("a tree has a port mask on a node that is not a switch")
    e = np.asarray(idx, np.int64)
    for p in range(n_pos):
        shift = p * PORTS_PER_POSITION
        table[r, e, p] = np.fromiter(((m >> shift) & 0xFFFF for m in masks), np.uint16, len(masks))
    return table


def masks_of(fabric: Fabric, table: MftTable, mlid: int) -> dict[int, int]:
    """Per-switch port masks (switch node -> bitmask) of ``mlid`` in an MFT table, empty ones left out.

    The inverse of :func:`mft_table` for one MLID; what :func:`~sm.multicast.tree.flood` reads.
    """
    i = _check_mlid(mlid)
    if i >= table.shape[1]:
        return {}
    out: dict[int, int] = {}
    sw = fabric.switches.tolist()
    entry = table[:, i, :].astype(np.int64).tolist()
    for row, words in enumerate(entry):
        mask = 0
        for p, w in enumerate(words):
            mask |= w << (p * PORTS_PER_POSITION)
        if mask:
            out[sw[row]] = mask
    return out


def mft_blocks_changed(new: MftTable, held: MftTable | None) -> list[tuple[int, int]]:
    """(block, position) pairs to send to one switch, ascending: those where ``new`` and ``held`` differ.

    ``new`` and ``held`` are one switch's tables (``[n_entries, n_positions]``, whole blocks, the
    switch's own positions). ``held`` is what the switch is known to hold; None means unknown:
    every block of ``new`` at every position is sent. Blocks of ``new`` beyond ``held`` count as
    unknown and are sent; blocks of ``held`` beyond ``new`` are sent (as zeros) when not zero.
    """
    if new.ndim != 2 or new.shape[0] % MLIDS_PER_BLOCK:
        raise ValueError(f"an MFT of one switch is [n_entries (whole blocks), n_positions], not {new.shape}")
    n_pos = new.shape[1]
    nb_new = new.shape[0] // MLIDS_PER_BLOCK
    nb_held = 0
    if held is not None:
        if held.ndim != 2 or held.shape[0] % MLIDS_PER_BLOCK or held.shape[1] != n_pos:
            raise ValueError(f"held MFT {held.shape} does not match {new.shape}")
        nb_held = held.shape[0] // MLIDS_PER_BLOCK
    nb = max(nb_new, nb_held)
    a = np.zeros((nb, MLIDS_PER_BLOCK, n_pos), np.uint16)
    b = np.zeros_like(a)
    a[:nb_new] = new.reshape(nb_new, MLIDS_PER_BLOCK, n_pos)
    if held is not None:
        b[:nb_held] = held.reshape(nb_held, MLIDS_PER_BLOCK, n_pos)
    changed = (a != b).any(axis=1)
    changed[nb_held:nb_new] = True
    blocks, positions = np.nonzero(changed)
    return list(zip(blocks.tolist(), positions.tolist(), strict=True))


def block_payload(table: MftTable, block: int, position: int) -> bytes:
    """The 64-byte SMP data of one (block, position) of a switch's table: 32 big-endian masks.

    Entries beyond the table are zero (a block above the top MLID in use, sent to clear it).
    """
    if not 0 <= block <= MAX_BLOCK:
        raise ValueError(f"MFT block {block} outside 0..{MAX_BLOCK}")
    if table.ndim != 2 or not 0 <= position < table.shape[1]:
        raise ValueError(f"MFT position {position} not in a table of shape {table.shape}")
    words = np.zeros(MLIDS_PER_BLOCK, ">u2")
    part = table[block * MLIDS_PER_BLOCK : (block + 1) * MLIDS_PER_BLOCK, position]
    words[: part.shape[0]] = part
    return words.tobytes()


def mft_attr_mod(block: int, position: int) -> int:
    """The AttributeModifier of a MulticastForwardingTable SMP: block in bits 0-8, position in 28-31."""
    if not 0 <= block <= MAX_BLOCK:
        raise ValueError(f"MFT block {block} outside 0..{MAX_BLOCK}")
    if not 0 <= position <= MAX_POSITION:
        raise ValueError(f"MFT position {position} outside 0..{MAX_POSITION}")
    return (position << 28) | block


def parse_mft_attr_mod(modifier: int) -> tuple[int, int]:
    """(block, position) of a MulticastForwardingTable AttributeModifier."""
    return modifier & MAX_BLOCK, (modifier >> 28) & MAX_POSITION


class MlidPool:
    """Multicast LIDs ``first .. first + cap - 1`` (at most up to 0xFFFE), handed out lowest first.

    ``cap`` is the smallest MulticastFDBCap among the switches (:meth:`from_caps`): an MLID
    beyond any switch's table could not be forwarded there. A freed MLID is the next one handed
    out when it is the lowest free; asking beyond the range raises :class:`MlidPoolError`.
    """

    def __init__(self, cap: int, *, first: int = MCAST_LID_FIRST) -> None:
        _check_mlid(first)
        if cap < 0:
            raise ValueError(f"MulticastFDBCap {cap} < 0")
        self.first = first
        self.last = min(first + cap - 1, MCAST_LID_LAST)
        self._taken: set[int] = set()
        self._free: list[int] = []  # freed MLIDs below _next (a heap; may hold re-taken ones)
        self._next = first  # every MLID from here up is free unless asked for by number

    @classmethod
    def from_caps(cls, caps: Iterable[int], *, first: int = MCAST_LID_FIRST) -> MlidPool:
        """A pool as large as the smallest MulticastFDBCap of ``caps`` (one per switch)."""
        return cls(min(caps, default=0), first=first)

    @property
    def cap(self) -> int:
        return max(self.last - self.first + 1, 0)

    @property
    def in_use(self) -> int:
        """How many MLIDs are allocated."""
        return len(self._taken)

    @property
    def top(self) -> int | None:
        """The highest MLID allocated (MulticastFDBTop), None when none is."""
        return max(self._taken, default=None)

    def __contains__(self, mlid: object) -> bool:
        return mlid in self._taken

    def allocate(self, mlid: int | None = None) -> int:
        """The MLID asked for when free and in range, else the lowest free one."""
        if mlid is not None and self.first <= mlid <= self.last and mlid not in self._taken:
            self._taken.add(mlid)
            return mlid
        while self._free and self._free[0] in self._taken:
            heapq.heappop(self._free)  # taken again by number since it was freed
        while self._next in self._taken:
            self._next += 1
        if self._free and self._free[0] < self._next:
            got = heapq.heappop(self._free)
        elif self._next <= self.last:
            got = self._next
            self._next += 1
        else:
            raise MlidPoolError(
                f"no free MLID: all {self.cap} of {self.first:#x}..{self.last:#x} are in use "
                "(the range ends at the smallest MulticastFDBCap of the switches)"
            )
        self._taken.add(got)
        return got

    def free(self, mlid: int) -> None:
        """Give ``mlid`` back; it must be allocated."""
        if mlid not in self._taken:
            raise MlidPoolError(f"MLID {mlid:#x} is not allocated")
        self._taken.remove(mlid)
        heapq.heappush(self._free, mlid)
