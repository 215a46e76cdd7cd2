"""Switch records: SwitchInfoRecord, LinearForwardingTableRecord, MulticastForwardingTableRecord.

As OpenSM 3.3.23 answers them (``osm_sa_sw_info_record.c``, ``osm_sa_lft_record.c``,
``osm_sa_mft_record.c``), from the snapshot:

- SwitchInfoRecord: one per switch, LID = its port 0 LID, SwitchInfo as the switch answered it
  in discovery except LinearFDBTop, which is the top LID programmed (``lids.max_lid``).
- LFTRecord: one per (switch, 64-LID block) for blocks 0..max_lid//64, the blocks of the
  snapshot's LFT (255 = no route; beyond the LFT's width, 255). Built with numpy, whole.
- MFTRecord: one per (switch, position, block) of the multicast tables ibfm programs; it
  programs none yet (issue 16), so :func:`mft_blocks` returns none and the table is empty.

Records are in the order of ``fabric.switches`` (then block, position).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from fabric.mad.attributes import SWITCH_INFO
from fabric.mad.sa import SaAttr
from sm.sa.server import Rows, SaContext
from sm.sa.table import TableFamily, empty

NO_ROUTE = 255
LFT_BLOCK = 64
"""LIDs per LFT block."""


def put16(rows: Rows, col: int, values: npt.ArrayLike) -> None:
    """Write ``values`` (one per row) big-endian into bytes ``col``, ``col + 1`` of every row."""
    v = np.asarray(values, np.int64)
    rows[:, col] = (v >> 8) & 0xFF
    rows[:, col + 1] = v & 0xFF


def switch_lids(snapshot: Any) -> npt.NDArray[np.int64]:
    """Port 0 LID of every switch, in ``fabric.switches`` order."""
    sw = snapshot.fabric.switches
    return np.asarray(snapshot.lids.base[sw, 0], np.int64)


class SwitchInfoRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.SWITCH_INFO_RECORD)

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        sw = snap.fabric.switches
        lids = switch_lids(snap)
        held = snap.discovery.switch_info
        top = snap.lids.max_lid
        out = np.zeros((sw.size, self.size), np.uint8)
        keep = np.zeros(sw.size, bool)
        for i, node in enumerate(sw.tolist()):
            info = held.get(node)
            if info is None or not lids[i]:
                continue
            keep[i] = True
            rec = SWITCH_INFO.pack({**info, "LinearFDBTop": top})
            out[i, 4 : 4 + len(rec)] = np.frombuffer(rec, np.uint8)
        put16(out, 0, lids)
        return out[keep]


def lft_records(snapshot: Any, size: int = 72) -> Rows:
    """Every LFTRecord of the snapshot: ``uint8[n_switches * n_blocks, size]``, switch-major."""
    sw = snapshot.fabric.switches
    lft = np.asarray(snapshot.lft, np.uint8)
    nblocks = snapshot.lids.max_lid // LFT_BLOCK + 1
    width = nblocks * LFT_BLOCK
    n = sw.size
    table = np.full((n, width), NO_ROUTE, np.uint8)
    w = min(width, lft.shape[1]) if lft.ndim == 2 else 0
    if w:
        table[: lft.shape[0], :w] = lft[:n, :w]
    out = np.zeros((n, nblocks, size), np.uint8)
    out[:, :, 8:72] = table.reshape(n, nblocks, LFT_BLOCK)
    lids = switch_lids(snapshot)
    out[:, :, 0] = (lids >> 8)[:, None]
    out[:, :, 1] = (lids & 0xFF)[:, None]
    blocks = np.arange(nblocks)
    out[:, :, 2] = (blocks >> 8)[None, :]
    out[:, :, 3] = (blocks & 0xFF)[None, :]
    return out[lids != 0].reshape(-1, size)


class LftRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.LFT_RECORD)

    def build(self, ctx: SaContext) -> Rows:
        return lft_records(ctx.snapshot, self.size)


MftBlock = tuple[int, int, int, bytes]
"""(switch node, position, block, the block's 64 bytes: 32 PortMasks of 16 bits)."""


def mft_blocks(snapshot: Any) -> list[MftBlock]:
    """The multicast forwarding table blocks programmed in the switches.

    ibfm programs no multicast yet: none. Issue 16 (multicast groups) replaces this
    with the MFTs it programs (OpenSM answers a block per switch, position and block
    that holds a multicast LID in use)."""
    got = getattr(snapshot, "mft", None)
    return list(got) if got else []


class MftRecordFamily(TableFamily):
    attr: ClassVar[int] = int(SaAttr.MFT_RECORD)

    def build(self, ctx: SaContext) -> Rows:
        snap = ctx.snapshot
        blocks = mft_blocks(snap)
        if not blocks:
            return empty(self.size)
        base = snap.lids.base
        out = np.zeros((len(blocks), self.size), np.uint8)
        for i, (node, position, block, data) in enumerate(blocks):
            lid = int(base[node, 0])
            out[i, 0], out[i, 1] = lid >> 8, lid & 0xFF
            # Position: 4 bits, reserved 3, BlockNum 9 (bits 16..31)
            word = (position & 0xF) << 12 | (block & 0x1FF)
            out[i, 2], out[i, 3] = word >> 8, word & 0xFF
            out[i, 8 : 8 + len(data[:64])] = np.frombuffer(data[:64], np.uint8)
        return out
