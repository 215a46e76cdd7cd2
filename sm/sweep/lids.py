"""LID assignment, stable across restarts through OpenSM's guid2lid file.

The file holds one line per end port: ``0x<port guid> <base lid> <top lid>``.
It is read at start and rewritten atomically whenever the plan changes, so
a restart keeps every LID; a new port gets the lowest free aligned range
without moving anyone; entries of ports that are absent now stay reserved,
so a host that comes back gets its LID back (as OpenSM does). A malformed
line (bytes that are not ASCII included; a comment may hold any bytes) or a
conflicting entry yields a warning naming file and line, and only that entry
is reassigned. A rewrite that would drop or change a line the file held first
keeps the file as it was in ``<name>.bak``. Temp files of a writer killed
mid-write are removed when the file is opened.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fabric.errors import IbfmError
from fabric.fileio import db_lines, keep_before_loss, remove_stale_temps, write_text_atomic
from fabric.model import Fabric
from sm.lidmap import MAX_UNICAST_LID, LidMap


class LidError(IbfmError):
    """The LID plan cannot be made or kept: LID space exhausted, guid2lid file unreadable or unwritable."""


Guid2Lid = dict[int, tuple[int, int]]
"""port GUID -> (base LID, top LID)."""


@dataclass
class LidPlan:
    lids: LidMap
    guid2lid: Guid2Lid
    """Every entry: present ports' plus reserved ones of absent ports."""
    new: list[int] = field(default_factory=list)
    """Port GUIDs that got a LID they did not have before."""
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.new)


def read_guid2lid(path: str | os.PathLike[str]) -> tuple[Guid2Lid, list[str]]:
    """Parse a guid2lid file; returns (entries, warnings), one warning per line not kept. A missing file is empty."""
    p = Path(path)
    entries: Guid2Lid = {}
    lines, warnings = db_lines(p, "guid2lid", LidError)
    seen_lid: dict[int, tuple[int, int]] = {}
    for n, text in lines:
        s = text.strip()
        if not s:
            continue
        parts = s.split()
        try:
            if len(parts) != 3:
                raise ValueError("expected '0x<guid> <base lid> <top lid>'")
            guid = int(parts[0], 16)
            base, top = int(parts[1], 0), int(parts[2], 0)
            if not (0 < guid < 1 << 64):
                raise ValueError(f"GUID {parts[0]} out of range")
            if not (1 <= base <= top <= MAX_UNICAST_LID):
                raise ValueError(f"LID range {base}..{top} not within 1..{MAX_UNICAST_LID}")
        except ValueError as e:
            warnings.append(f"{p}:{n}: {e}; entry ignored")
            continue
        if guid in entries:
            warnings.append(f"{p}:{n}: GUID {guid:#018x} listed twice; first entry kept")
            continue
        clash = next((seen_lid[x] for x in range(base, top + 1) if x in seen_lid), None)
        if clash is not None:
            warnings.append(
                f"{p}:{n}: LIDs {base}..{top} of {guid:#018x} overlap line {clash[1]} "
                f"({clash[0]:#018x}); entry will be reassigned"
            )
            continue
        entries[guid] = (base, top)
        for x in range(base, top + 1):
            seen_lid[x] = (guid, n)
    return entries, warnings


def write_guid2lid(path: str | os.PathLike[str], entries: Guid2Lid) -> None:
    """Write the file atomically (temp file in the same directory, fsync, rename).

    Each entry ends with a blank line, as OpenSM writes it: OpenSM's reader
    (osm_db_restore) appends every non-blank line to the previous key's value.
    """
    body = "".join(
        f"0x{g:016x} 0x{b:04x} 0x{t:04x}\n\n" for g, (b, t) in sorted(entries.items(), key=lambda e: e[1])
    )
    try:
        write_text_atomic(path, body)
    except OSError as e:
        raise LidError(f"{path}: cannot write the guid2lid file: {e.strerror or e}") from e


def assign_lids(fabric: Fabric, previous: Guid2Lid | None = None, *, lmc: int = 0) -> LidPlan:
    """LIDs for every end port: keep what ``previous`` holds, fill the rest.

    A kept range must be aligned to ``2**lmc`` and wholly free; otherwise
    (LMC changed, or two ports claim one LID) the port is reassigned, with
    a warning.
    """
    if not 0 <= lmc <= 7:
        raise LidError(f"LMC {lmc} outside 0..7")
    span = 1 << lmc
    previous = dict(previous or {})
    warnings: list[str] = []
    ep = fabric.endports()
    guids = fabric.port_guid[ep[:, 0], ep[:, 1]].tolist()
    used = np.zeros(MAX_UNICAST_LID + 1, np.bool_)
    used[0] = True
    result: Guid2Lid = {}
    present = set(guids)
    # Absent ports keep their reservation, unless it collides with another.
    for g, (b, t) in previous.items():
        if g not in present and not used[b : t + 1].any():
            used[b : t + 1] = True
            result[g] = (b, t)
    base = np.zeros(fabric.port_exists.shape, np.uint16)
    need: list[int] = []
    for k, g in enumerate(guids):
        old = previous.get(g)
        if old is not None:
            b = old[0]
            t = b + span - 1
            if b % span == 0 and t <= MAX_UNICAST_LID and not used[b : t + 1].any():
                used[b : t + 1] = True
                base[ep[k, 0], ep[k, 1]] = b
                result[g] = (b, t)
                continue
            warnings.append(
                f"port {g:#018x} ({fabric.port_name(int(ep[k, 0]), int(ep[k, 1]))}): "
                f"previous LIDs {old[0]}..{old[1]} unusable with LMC {lmc} or taken; reassigned"
            )
        need.append(k)
    new: list[int] = []
    if need:
        free = np.flatnonzero(~used.reshape(-1, span).any(axis=1)) * span
        free = free[free >= 1]
        if free.size < len(need):
            raise LidError(f"LID space exhausted: {len(need)} ports need LIDs, {free.size} ranges free")
        for k, b in zip(need, free[: len(need)].tolist(), strict=True):
            g = guids[k]
            base[ep[k, 0], ep[k, 1]] = b
            result[g] = (b, b + span - 1)
            new.append(g)
    return LidPlan(LidMap.from_base(base, lmc), result, new, warnings)


class LidManager:
    """Owns the guid2lid file: load once, plan each sweep, write when changed."""

    def __init__(self, path: str | os.PathLike[str] | None, *, lmc: int = 0) -> None:
        self.path = Path(path) if path is not None else None
        self.lmc = lmc
        self.warnings: list[str] = []
        self.entries: Guid2Lid = {}
        """What the file holds (its kept lines)."""
        if self.path is not None:
            remove_stale_temps(self.path)
            self.entries, self.warnings = read_guid2lid(self.path)
        self._lines_ignored = bool(self.warnings)
        """The file holds lines that are not in ``entries``: a rewrite drops them."""

    def plan(self, fabric: Fabric) -> LidPlan:
        plan = assign_lids(fabric, self.entries, lmc=self.lmc)
        plan.warnings[:0] = self.warnings
        self.warnings = []
        if self.path is None:
            self.entries = plan.guid2lid
        elif self._lines_ignored or plan.guid2lid != self.entries:
            if self._lines_ignored or any(plan.guid2lid.get(g) != e for g, e in self.entries.items()):
                note = keep_before_loss(self.path, "guid2lid", LidError)
                if note:
                    plan.warnings.append(note)
            write_guid2lid(self.path, plan.guid2lid)
            self.entries = plan.guid2lid
            self._lines_ignored = False
        return plan
