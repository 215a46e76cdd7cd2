"""An SA client: one query to an SA, its answer reassembled from RMPP segments when it has several.

What hosts do (libibumad's kernel RMPP does the reassembly there); here it
runs over any :class:`~sm.transport.base.WindowedTransport`, so tests and
``bench/sa.py`` can ask the SA from another port of an emulated fabric and
see whole tables, and ask over umad where one MAD suffices.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from fabric.errors import IbfmError
from fabric.mad import MadError
from fabric.mad.rmpp import RmppReceiver, RmppType
from fabric.mad.sa import SA_DATA_OFFSET, SaMethod, parse_sa, sa_mad, split_records
from sm.transport.base import WindowedTransport


class SaQueryError(IbfmError):
    """No answer, or an answer that cannot be read."""


@dataclass(frozen=True)
class SaAnswer:
    """What the SA answered: its status, the records (each record-sized), the AttributeOffset."""

    status: int
    records: list[bytes]
    attr_offset: int
    method: int
    segments: int = 1


async def sa_query(
    transport: WindowedTransport,
    sa_lid: int,
    method: int,
    attr_id: int,
    *,
    component_mask: int = 0,
    data: bytes = b"",
    attr_mod: int = 0,
    sm_key: int = 0,
    timeout: float = 2.0,
    record_size: int | None = None,
) -> SaAnswer:
    """Send one SA request to ``sa_lid`` and return its answer (a GetTable's segments followed and ACKed)."""
    req = sa_mad(
        method, attr_id, tid=0, attr_mod=attr_mod, component_mask=component_mask, sm_key=sm_key, data=data
    )
    first = await transport.send(req, sa_lid)
    try:
        head = parse_sa(first)
    except MadError as e:
        raise SaQueryError(f"unreadable SA answer: {e}") from e
    payload = first[SA_DATA_OFFSET:]
    nseg = 1
    if head.rmpp_active and head.rmpp_type == RmppType.DATA:
        rx = RmppReceiver()
        acks = rx.feed(first)
        if not rx.complete:
            loop = asyncio.get_running_loop()
            q: asyncio.Queue[bytes] = asyncio.Queue()
            tid = head.tid & 0xFFFFFFFF
            def take(m: bytes) -> None:
                loop.call_soon_threadsafe(q.put_nowait, m)

            transport.follow(tid, take)
            try:
                for a in acks:
                    transport.post(a, sa_lid)
                while not rx.complete:
                    try:
                        seg = await asyncio.wait_for(q.get(), timeout)
                    except TimeoutError:
                        raise SaQueryError(f"RMPP answer stopped after segment {rx.header and nseg}") from None
                    nseg += 1
                    try:
                        acks = rx.feed(seg)
                    except MadError as e:
                        raise SaQueryError(f"bad RMPP segment: {e}") from e
                    for a in acks:
                        transport.post(a, sa_lid)
            finally:
                transport.follow(tid, None)
        else:
            for a in acks:
                transport.post(a, sa_lid)
        payload = rx.payload
    size = head.attr_offset * 8
    if head.status or not size:
        records: list[bytes] = []
    else:
        records = split_records(payload, head.attr_offset)
        if head.method == SaMethod.GET_RESP:
            records = records[:1]
    if record_size is not None:
        records = [r[:record_size] for r in records]
    return SaAnswer(head.status, records, head.attr_offset, head.method, nseg)
