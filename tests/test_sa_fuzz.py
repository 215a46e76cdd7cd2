"""Hostile SA and SMInfo MADs: every one gets a proper status or is dropped (and counted), nothing
raises, and the snapshot and the fabric stay as they were.

(a) Emulated (``tests/sa_rig.py``): thousands of random and mutated MADs straight into
``SaServer.take`` and ``Elector.take`` (answers captured per request), and a few hundred
through a host's transport. (b) Over ibsim: ``ibfm serve --transport umad`` and ~3,000 fuzzed
SA and SMInfo MADs from another host (``tests/umad_probe.py`` ``scenario_sa_fuzz``); the daemon
lives, the subnet stays up, ``saquery`` still answers, every port stays ACTIVE.
Counts are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fabric.mad import SM_INFO, Method, SmpAttr, SmState, smp_dr, smp_lid
from fabric.mad.rmpp import RmppType
from fabric.mad.sa import SA_DATA_OFFSET, SaAttr, SaMethod, SaStatus, component_mask, sa_mad
from sm.election.elector import STATUS_INVALID_FIELD, SmInfoControl
from sm.sa.families import all_families
from sm.sa.server import SaServer
from sm.transport.base import MadAddress, TransportStats, is_answer
from tests.sa_rig import SaRig, sa_rig

SA_STATUSES = frozenset(int(s) for s in SaStatus)
"""Every status an SA answer may carry (IBA 13.4.7 MAD status and 15.2.1.1 SA class status)."""
SMP_STATUSES = frozenset({0, 0x0004, STATUS_INVALID_FIELD})
"""What Elector.take answers: OK, bad version, invalid field (an illegal SubnSet(SMInfo))."""
REFUSALS = frozenset({0x0008, 0x000C})
"""What a transport answers for a request no service takes (method, or method/attribute, unsupported)."""
_RESP = {0x01: 0x81, 0x02: 0x81, 0x12: 0x92, 0x14: 0x94, 0x15: 0x95}
_RMPP_CONTROL = (int(RmppType.ACK), int(RmppType.STOP), int(RmppType.ABORT))
QKEY = 0x80010000
SEED = 20261202


# -- what must not change ---------------------------------------------------------------


def fingerprint(rig: SaRig) -> dict[str, str]:
    """A hash of every array the SA or SMInfo must leave alone: the emulated switches' LFTs and
    ports, the published snapshot's fabric, LIDs and LFTs."""
    emu, snap = rig.emu, rig.manager.snapshot
    assert snap is not None
    arrays: dict[str, Any] = {
        "emu.lft": emu.lft,
        "emu.lft_top": emu.lft_top,
        "emu.master_sm_lid": emu.master_sm_lid,
        "emu.m_key": emu.m_key,
        "emu.disabled": emu.disabled,
        "emu.gid_prefix": emu.gid_prefix,
        "emu.subnet_timeout": emu.subnet_timeout,
        "snap.lft": snap.lft,
        "snap.lids.base": snap.lids.base,
        "snap.lids.owner_node": snap.lids.owner_node,
    }
    for who, f in (("emu.fabric", emu.fabric), ("snap.fabric", snap.fabric)):
        for name in ("state", "phys_state", "lid", "lmc", "peer_node", "peer_port", "port_guid", "node_guid",
                     "mtu_active", "op_vls", "width_active", "speed_active"):  # fmt: skip
            arrays[f"{who}.{name}"] = getattr(f, name)
    out = {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in arrays.items()}
    out["snap.names"] = hashlib.sha256("\0".join(snap.fabric.names).encode()).hexdigest()
    return out


# -- capturing transports ---------------------------------------------------------------


class Capture:
    """A transport stand-in whose ``reply`` records the answers (``stats`` shared with the real one)."""

    def __init__(self, stats: TransportStats | None = None, *, kernel_rmpp: bool = False) -> None:
        self.kernel_rmpp = kernel_rmpp
        self.stats = stats if stats is not None else TransportStats()
        self.out: list[bytes] = []

    def reply(self, mad: bytes, to: MadAddress) -> None:
        self.out.append(bytes(mad))

    def take(self) -> list[bytes]:
        out, self.out = self.out, []
        return out


# -- MAD generators ---------------------------------------------------------------------


def _pr(slid: int = 0, dlid: int = 0) -> bytes:
    q = bytearray(64)
    q[40:42] = dlid.to_bytes(2, "big")
    q[42:44] = slid.to_bytes(2, "big")
    return bytes(q)


def _lid_key(lid: int) -> bytes:
    return lid.to_bytes(2, "big")


def sa_templates(rig: SaRig) -> list[bytes]:
    """Valid SA requests of every family on the rig's snapshot: what the mutations start from."""
    snap = rig.snap
    f = snap.fabric
    cas = [int(snap.lids.base[int(n), 1]) for n in f.cas]
    sws = [int(snap.lids.base[int(n), 0]) for n in f.switches]
    return sa_templates_for(cas[0], cas[-1], sws[0])


def sa_templates_for(a: int, b: int, s: int) -> list[bytes]:
    """Valid SA requests of every family about CA LIDs ``a``, ``b`` and switch LID ``s``."""
    nr, pir, pr = int(SaAttr.NODE_RECORD), int(SaAttr.PORT_INFO_RECORD), int(SaAttr.PATH_RECORD)
    g, t = SaMethod.GET, SaMethod.GET_TABLE
    out = [
        sa_mad(g, int(SaAttr.CLASS_PORT_INFO), tid=1),
        sa_mad(g, nr, tid=1, component_mask=component_mask(nr, ["LID"]), data=_lid_key(a)),
        sa_mad(t, nr, tid=1),
        sa_mad(t, pir, tid=1, component_mask=component_mask(pir, ["EndportLID"]), data=_lid_key(s)),
        sa_mad(g, pr, tid=1, component_mask=component_mask(pr, ["SLID", "DLID"]), data=_pr(a, b)),
        sa_mad(t, pr, tid=1, component_mask=component_mask(pr, ["SLID"]), data=_pr(a)),
        sa_mad(t, int(SaAttr.SM_INFO_RECORD), tid=1),
        sa_mad(t, int(SaAttr.LINK_RECORD), tid=1),
        sa_mad(t, int(SaAttr.SWITCH_INFO_RECORD), tid=1),
        sa_mad(t, int(SaAttr.LFT_RECORD), tid=1, data=_lid_key(s)),
        sa_mad(t, int(SaAttr.GUID_INFO_RECORD), tid=1),
        sa_mad(t, int(SaAttr.PKEY_TABLE_RECORD), tid=1),
        sa_mad(t, int(SaAttr.SERVICE_RECORD), tid=1),
        sa_mad(t, int(SaAttr.MCMEMBER_RECORD), tid=1),
        sa_mad(t, int(SaAttr.INFORM_INFO_RECORD), tid=1),
        sa_mad(SaMethod.DELETE, int(SaAttr.SERVICE_RECORD), tid=1),
    ]
    return out


ATTRS = [int(a) for a in SaAttr] + [0x0000, 0x0004, 0x0010, 0x0019, 0x0034, 0x003C, 0x00F0, 0xFF00, 0xFFFF]
METHODS = [int(m) for m in SaMethod] + [0x00, 0x04, 0x05, 0x07, 0x16, 0x7F, 0x80, 0xFF]


def mutate_sa(rng: random.Random, m: bytearray) -> bytearray:
    """One to four of: method, versions, attribute, modifier, offset, mask, SM_Key, status, data, RMPP header."""
    for _ in range(rng.randint(1, 4)):
        k = rng.randrange(12)
        if k == 0:
            m[3] = rng.choice(METHODS) if rng.random() < 0.8 else rng.randrange(256)
        elif k == 1:
            m[2] = rng.choice((1, 2, 3, 0, 0x80, rng.randrange(256)))
        elif k == 2:
            m[0] = rng.choice((0, 2, 0x81, rng.randrange(256)))
        elif k == 3:
            m[16:18] = (rng.choice(ATTRS) if rng.random() < 0.7 else rng.randrange(1 << 16)).to_bytes(2, "big")
        elif k == 4:
            m[20:24] = rng.randbytes(4)
        elif k == 5:
            m[44:46] = rng.choice((0, 1, 0xFFFF, rng.randrange(1 << 16))).to_bytes(2, "big")
        elif k == 6:
            m[48:56] = rng.choice((0, (1 << 64) - 1, rng.getrandbits(64))).to_bytes(8, "big")
        elif k == 7:
            m[36:44] = rng.choice((1, rng.getrandbits(64))).to_bytes(8, "big")
        elif k == 8:
            m[4:6] = rng.randbytes(2)
        elif k == 9:
            m[SA_DATA_OFFSET:] = rng.randbytes(256 - SA_DATA_OFFSET)
        elif k == 10:
            for _ in range(rng.randint(1, 6)):
                m[SA_DATA_OFFSET + rng.randrange(256 - SA_DATA_OFFSET)] = rng.randrange(256)
        else:  # RMPP header: DATA segments that are not first or last, ACK/STOP/ABORT, garbage
            m[24] = rng.choice((1, 1, 0, rng.randrange(256)))
            m[25] = rng.choice((1, 2, 3, 4, 0, rng.randrange(256)))
            m[26] = rng.choice((0x01, 0x03, 0x05, 0x07, rng.randrange(256)))
            m[27] = rng.randrange(256)
            m[28:36] = rng.randbytes(8)
    return m


def fuzz_sa(rng: random.Random, templates: list[bytes], count: int) -> list[bytes]:
    """``count`` SA MADs: random bytes of lengths 0..300 (class 0x03 in most), mutated valid
    requests (some truncated), RMPP ACK/STOP/ABORT and truncated DATA segments for unknown TIDs."""
    out = []
    for i in range(count):
        r = rng.random()
        if r < 0.2:
            raw = bytearray(rng.randbytes(rng.randint(0, 300)))
            if len(raw) > 1 and rng.random() < 0.8:
                raw[1] = 0x03
            if len(raw) > 3 and rng.random() < 0.5:
                raw[3] &= 0x7F
        elif r < 0.85:
            raw = mutate_sa(rng, bytearray(rng.choice(templates)))
            if rng.random() < 0.1:
                raw = raw[: rng.randint(0, 255)]
        else:
            raw = bytearray(rng.choice(templates))
            raw[24] = 1
            raw[25] = rng.choice((*_RMPP_CONTROL, int(RmppType.DATA)))
            raw[26] = rng.choice((0x01, 0x03, 0x05, 0x07, 0x00))
            raw[28:36] = rng.randbytes(8)
            if rng.random() < 0.3:
                raw = raw[: rng.randint(24, 255)]
        if len(raw) >= 16:
            raw[8:16] = (i + 1 | rng.getrandbits(32) << 32).to_bytes(8, "big")
        out.append(bytes(raw))
    return out


def sminfo_payload(rng: random.Random, state: int | None = None) -> bytes:
    return SM_INFO.pack(
        {
            "GUID": rng.getrandbits(64),
            "SM_Key": rng.choice((0, 1, rng.getrandbits(64))),
            "ActCount": rng.getrandbits(32),
            "Priority": rng.randrange(16),
            "SMState": rng.randrange(16) if state is None else state,
        }
    ).ljust(64, b"\0")


def fuzz_smp(rng: random.Random, count: int) -> list[bytes]:
    """SubnGet/SubnSet(SMInfo), LID-routed and DR, with random modifiers, payloads and versions:
    Sets are illegal for a master (any control but HANDOVER from a MASTER), a few are random."""
    out = []
    for i in range(count):
        method = rng.choice((Method.GET, Method.SET, Method.SET, rng.randrange(256)))
        mod = rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 0x100, rng.getrandbits(32)))
        # A master takes only HANDOVER from a MASTER: mostly something else.
        state = rng.choice((0, 1, 2, 4, 5, 15)) if rng.random() < 0.9 else None
        data = sminfo_payload(rng, state) if rng.random() < 0.8 else rng.randbytes(64)
        if rng.random() < 0.5:
            m = bytearray(smp_lid(Method.GET, SmpAttr.SM_INFO, 0, 0))
        else:
            path = tuple(rng.randint(1, 8) for _ in range(rng.randint(0, 4)))
            m = bytearray(smp_dr(Method.GET, SmpAttr.SM_INFO, 0, 0, path))
        m[3] = method
        m[20:24] = (mod & 0xFFFFFFFF).to_bytes(4, "big")
        m[64:128] = data
        if rng.random() < 0.15:
            m[rng.choice((0, 2))] = rng.randrange(256)  # base / class version
        if rng.random() < 0.1:
            m[16:18] = rng.randbytes(2)
        if rng.random() < 0.05:
            m[1] = rng.choice((0x01, 0x81, 0x03, rng.randrange(256)))
        m[8:16] = (i + 1 | rng.getrandbits(32) << 32).to_bytes(8, "big")
        raw = bytes(m) if rng.random() < 0.9 else bytes(m[: rng.randint(0, 255)])
        out.append(raw)
    return out


# -- judging answers ----------------------------------------------------------------------


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    dropped: int = 0
    segments: int = 0
    long: int = 0
    status: Counter[int] = field(default_factory=Counter)
    rmpp: str = ""

    def line(self, what: str) -> str:
        st = ", ".join(f"{k:#06x}: {v}" for k, v in sorted(self.status.items()))
        return (f"{what}: {self.sent} sent, {self.answered} answered, {self.dropped} dropped, "
                f"{self.segments} RMPP segments, {self.long} long GetTableResp; "
                f"status {{{st}}}{self.rmpp}")  # fmt: skip


def judge_sa(req: bytes, answers: list[bytes], dropped: int, t: Tally, kernel_rmpp: bool) -> None:
    """One request's answers: the request's TID, a response method, a legal status, 256 bytes
    (longer only for a kernel-RMPP GetTableResp); or none, and then it was counted dropped."""
    t.sent += 1
    control = len(req) >= 36 and req[1] == 0x03 and req[24] == 1 and req[26] & 1 and req[25] in _RMPP_CONTROL
    if not answers:
        assert dropped == 1 or control, (req.hex(), dropped)
        t.dropped += dropped
        return
    assert dropped == 0, req.hex()
    tid = req[8:16]
    for i, a in enumerate(answers):
        assert a[8:16] == tid, (req.hex(), a.hex())
        assert a[1] == 0x03 and a[3] & 0x80, a[:24].hex()
        status = int.from_bytes(a[4:6], "big")
        assert status in SA_STATUSES, (f"{status:#06x}", req.hex())
        is_segment = a[24] == 1 and a[26] & 1
        if len(a) != 256:
            # An answer with records goes out as long as they are (a host counts them off the length);
            # beyond one MAD only a GetTableResp handed whole to the kernel's RMPP.
            assert status == 0 and len(a) >= SA_DATA_OFFSET and (len(a) - SA_DATA_OFFSET) % 8 == 0, a[:56].hex()
            assert a[3] in (SaMethod.GET_RESP, SaMethod.GET_TABLE_RESP, SaMethod.DELETE_RESP), a[:56].hex()
            if len(a) > 256:
                assert kernel_rmpp and a[3] == SaMethod.GET_TABLE_RESP and a[26] & 1, a[:56].hex()  # RMPP ACTIVE
                t.long += 1
        if i == 0 and not control:
            want = _RESP.get(req[3], 0x81)
            assert a[3] == want, (f"{a[3]:#x} for method {req[3]:#x}", req.hex())
            t.answered += 1
            t.status[status] += 1
        else:
            assert a[3] == SaMethod.GET_TABLE_RESP and is_segment, (req.hex(), a[:56].hex())
            t.segments += 1


async def fuzz_sa_server(rig: SaRig, mads: list[bytes], *, kernel_rmpp: bool, rng: random.Random) -> Tally:
    """Every MAD into a fresh SaServer on the rig's snapshot and store, answers captured; after a
    multi-segment GetTable, now and then a hostile ACK/STOP/ABORT for it."""
    cap = Capture(kernel_rmpp=kernel_rmpp)
    server = SaServer(cap, all_families(), lambda: rig.manager.snapshot, store=rig.server.store,  # type: ignore[arg-type]
                      sm_key=1, sm=rig.manager.elector)  # fmt: skip
    src = MadAddress(lid=int(rig.host.local_port.lid), qpn=1, qkey=QKEY, via=rig.host.endpoint)
    t = Tally()
    try:
        for i, raw in enumerate(mads):
            before = server.stats.dropped
            server.take(raw, src)
            answers = cap.take()
            judge_sa(raw, answers, server.stats.dropped - before, t, kernel_rmpp)
            if server._out and rng.random() < 0.5:
                # An outgoing RMPP answer: ACK it with garbage, stop it, abort it.
                (_lid, _via, tid) = rng.choice(list(server._out))
                ctl = bytearray(256)
                ctl[0:4] = bytes((1, 0x03, 2, rng.choice((0x12, 0x92, 0x01))))
                ctl[8:16] = tid.to_bytes(8, "big")
                ctl[24:28] = bytes((1, rng.choice(_RMPP_CONTROL), 0x01, 0))
                ctl[28:36] = rng.choice((rng.randbytes(8), bytes(7) + b"\x01" + bytes(3) + b"\x40"))
                server.take(bytes(ctl), src)
                for a in cap.take():
                    assert a[8:16] == ctl[8:16] and len(a) == 256 and a[24] == 1, a[:36].hex()
            if i % 256 == 255:
                await asyncio.sleep(0)  # RMPP resend timers may run
    finally:
        server.close()
    st = server.stats
    assert st.received >= len(mads)
    t.rmpp = f"; RMPP sent {st.rmpp_segments} segments, resent {st.rmpp_resent}, {st.rmpp_aborted} aborted"
    if not kernel_rmpp:
        assert st.rmpp_segments > 0 and st.rmpp_aborted > 0, t.rmpp  # the hostile ACK/STOP/ABORT reached some
    return t


async def fuzz_elector(rig: SaRig, mads: list[bytes], rng: random.Random) -> tuple[Tally, int, int]:
    """Every SMP into Elector.take from random sources; (tally, Sets taken, not taken at all)."""
    el = rig.manager.elector
    real = el.transport
    cap = Capture(real.stats)
    el.transport = cap  # type: ignore[assignment]
    t = Tally()
    accepted = not_taken = 0
    try:
        for raw in mads:
            dr = len(raw) > 1 and raw[1] == 0x81
            src = MadAddress(0xFFFF if dr else rng.randint(1, 0xBFFF), 0, 0, via=rig.host.endpoint)
            t.sent += 1
            took = el.take(raw, src)
            answers = cap.take()
            if not took:
                assert not answers
                not_taken += 1
                continue
            assert len(answers) == 1, raw.hex()
            a = answers[0]
            assert len(a) == 256 and a[8:16] == raw[8:16] and a[3] == Method.GET_RESP, a[:24].hex()
            word = int.from_bytes(a[4:6], "big")
            assert bool(word & 0x8000) == (raw[1] == 0x81)
            status = word & 0x7FFF
            assert status in SMP_STATUSES, f"{status:#06x}"
            t.answered += 1
            t.status[status] += 1
            if raw[3] == Method.SET and status == 0:
                # The only legal Set for a master: HANDOVER from an SM that says it is MASTER.
                assert int.from_bytes(raw[20:24], "big") == SmInfoControl.HANDOVER, raw.hex()
                assert SM_INFO.unpack(raw[64:128])["SMState"] == SmState.MASTER, raw.hex()
                accepted += 1
            await asyncio.sleep(0)  # a taken Set applies on the loop's next turn
    finally:
        el.transport = real
    return t, accepted, not_taken


async def fuzz_host(rig: SaRig, mads: list[bytes]) -> tuple[int, int]:
    """Send ``mads`` from the host's transport to the SA's LID; (answered, timed out)."""
    answers = await rig.host.send_many([(m, rig.sa_lid) for m in mads], timeout=0.05, retries=0)
    ok = 0
    for m, a in zip(mads, answers, strict=True):
        if not is_answer(a):
            continue
        assert isinstance(a, bytes)
        ok += 1
        # a whole MAD, or an SA answer as long as its records
        assert (len(a) == 256 or (a[1] == 0x03 and len(a) >= 56)) and a[3] & 0x80, a[:24].hex()
        if a[1] == 0x03:
            assert int.from_bytes(a[4:6], "big") in SA_STATUSES
        else:
            assert int.from_bytes(a[4:6], "big") & 0x7FFF in SMP_STATUSES
        assert a[16:18] == m[16:18] or a[1] == 0x03
    return ok, len(mads) - ok


async def test_thousands_of_hostile_sa_and_sminfo_mads_leave_the_subnet_untouched() -> None:
    t0 = time.perf_counter()
    rng = random.Random(SEED)
    async with sa_rig() as rig:
        el = rig.manager.elector
        assert el.state == SmState.MASTER and el.is_master
        before = fingerprint(rig)
        snap = rig.manager.snapshot
        templates = sa_templates(rig)
        # Every template is a request the SA serves (PKeyTableRecord wants the SM_Key: ERR_REQ_INVALID).
        cap = Capture()
        srv = SaServer(cap, all_families(), lambda: snap, store=rig.server.store, sm=el)  # type: ignore[arg-type]
        for tm in templates:
            srv.take(tm, MadAddress(1, 1, QKEY))
            got = cap.take()
            if int.from_bytes(tm[16:18], "big") not in srv.families:  # a family not written yet
                assert got and int.from_bytes(got[0][4:6], "big") == SaStatus.METHOD_ATTR_UNSUPPORTED
                continue
            fine = (0, SaStatus.ERR_NO_RECORDS, SaStatus.ERR_REQ_INVALID)
            assert got and int.from_bytes(got[0][4:6], "big") in fine, tm[:24].hex()
        srv.close()

        tallies = []
        for kernel_rmpp in (False, True):
            mads = fuzz_sa(rng, templates, 5000)
            t = await fuzz_sa_server(rig, mads, kernel_rmpp=kernel_rmpp, rng=rng)
            tallies.append(t.line(f"SaServer.take ({'kernel' if kernel_rmpp else 'own'} RMPP)"))
            assert t.answered > 2000 and t.dropped > 100, t
            assert len(t.status) >= 6, t.status  # the fuzz reaches many refusals, not one

        takeovers = el.takeovers
        te, accepted, not_taken = await fuzz_elector(rig, fuzz_smp(rng, 4000), rng)
        await asyncio.sleep(0)
        tallies.append(te.line("Elector.take") + f"; {not_taken} not taken, {accepted} HANDOVER taken")
        assert te.answered > 2000 and te.status[STATUS_INVALID_FIELD] > 500, te
        assert el.takeovers - takeovers == accepted
        # HANDOVER to a master changes nothing but its next sweep being a first; every other Set refused.
        assert el.state == SmState.MASTER and el.is_master, el.role()

        # Through the host's transport: SA and SMInfo over the emulated wire.
        host_mads = fuzz_sa(rng, templates, 300)
        host_mads = [m for m in host_mads if len(m) >= 24 and m[1] == 0x03 and not m[3] & 0x80]
        served, refused, sa_dropped = rig.sm.stats.served, rig.sm.stats.refused, rig.server.stats.dropped
        ok, lost = await fuzz_host(rig, host_mads)
        sm_mads = [smp_lid(Method.GET, SmpAttr.SM_INFO, 0, 0)] * 50
        ok2, lost2 = await fuzz_host(rig, sm_mads)
        assert ok2 == 50 and lost2 == 0
        dropped_here = rig.server.stats.dropped - sa_dropped
        tallies.append(
            f"host transport: {len(host_mads)} SA MADs, {ok} answered, {lost} unanswered "
            f"(SA dropped {dropped_here}, transport refused {rig.sm.stats.refused - refused}); 50 SubnGet(SMInfo) OK"
        )
        assert ok > len(host_mads) // 2
        assert rig.sm.stats.served - served >= ok
        # Every request the SA did not answer it counted as dropped (the emulator loses nothing here).
        assert lost == dropped_here + (rig.sm.stats.refused - refused)

        after = fingerprint(rig)
        assert rig.manager.snapshot is snap
        changed = [k for k in before if before[k] != after[k]]
        assert not changed, changed
        assert el.state == SmState.MASTER
        # A normal query still answers as before.
        assert snap is not None
        f = snap.fabric
        a_lid = int(snap.lids.base[int(f.cas[0]), 1])
        nr = int(SaAttr.NODE_RECORD)
        ans = await rig.ask(SaMethod.GET, nr, component_mask=component_mask(nr, ["LID"]), data=_lid_key(a_lid))
        assert ans.status == 0 and len(ans.records) == 1
    dt = time.perf_counter() - t0
    print("\n" + "\n".join(tallies) + f"\n{dt:.1f} s")


async def test_legal_sminfo_sets_move_the_state_machine_as_the_spec_says() -> None:
    """The Sets the fuzz avoids: from a MASTER, DISABLE a standby (NOT_ACTIVE), STANDBY it back,
    DISCOVER it (DISCOVERING), HANDOVER to it (MASTER); from a STANDBY, ACKNOWLEDGE. Illegal ones
    in each state are refused with 0x001C and change nothing."""
    rng = random.Random(SEED + 1)
    async with sa_rig() as rig:
        el = rig.manager.elector
        real = el.transport
        cap = Capture(real.stats)
        el.transport = cap  # type: ignore[assignment]
        src = MadAddress(7, 0, 0, via=rig.host.endpoint)

        async def sets(ctl: int, sender: int, key: int | None = None) -> int:
            data = bytearray(sminfo_payload(rng, sender))
            data[8:16] = (el.sm_key if key is None else key).to_bytes(8, "big")  # a peer of this subnet
            m = smp_lid(Method.SET, SmpAttr.SM_INFO, ctl, 0, bytes(data))
            assert el.take(m, src)
            (a,) = cap.take()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return int.from_bytes(a[4:6], "big")

        try:
            el._set(SmState.STANDBY, "test")
            assert await sets(SmInfoControl.DISABLE, SmState.STANDBY) == STATUS_INVALID_FIELD
            assert await sets(SmInfoControl.STANDBY, SmState.MASTER) == STATUS_INVALID_FIELD  # not NOT_ACTIVE
            assert el.state == SmState.STANDBY
            assert await sets(SmInfoControl.ACKNOWLEDGE, SmState.STANDBY) == 0
            assert el.state == SmState.STANDBY
            # A "master" without our SM_Key is nobody to obey.
            assert await sets(SmInfoControl.DISABLE, SmState.MASTER, key=0xBAD) == STATUS_INVALID_FIELD
            assert el.state == SmState.STANDBY
            assert await sets(SmInfoControl.DISABLE, SmState.MASTER) == 0
            assert el.state == SmState.NOT_ACTIVE
            assert await sets(SmInfoControl.HANDOVER, SmState.STANDBY) == STATUS_INVALID_FIELD
            assert await sets(SmInfoControl.DISCOVER, SmState.MASTER) == STATUS_INVALID_FIELD
            assert el.state == SmState.NOT_ACTIVE
            assert await sets(SmInfoControl.STANDBY, SmState.MASTER) == 0
            assert el.state == SmState.STANDBY
            assert await sets(SmInfoControl.DISCOVER, SmState.MASTER) == 0
            assert el.state == SmState.DISCOVERING
            assert await sets(SmInfoControl.DISABLE, SmState.MASTER) == STATUS_INVALID_FIELD
            assert await sets(SmInfoControl.HANDOVER, SmState.MASTER) == 0
            assert el.state == SmState.MASTER and el.is_master
            for bad in (0, 6, 7, 0xFFFFFFFF):
                assert await sets(bad, SmState.MASTER) == STATUS_INVALID_FIELD
            assert el.state == SmState.MASTER
        finally:
            el.transport = real


# -- (b) over ibsim ---------------------------------------------------------------------------


@pytest.mark.ibsim
def test_ibsim_sa_fuzz_leaves_the_daemon_up_and_saquery_answering(tmp_path: Path) -> None:
    """``ibfm serve --transport umad`` master; ~3,000 fuzzed SA and SMInfo MADs from another host;
    then the daemon lives, /health says subnet_up, saquery NR of a CA answers it, every port ACTIVE."""
    from bench._readback import port_states
    from fabric.formats.netfile import read_net
    from fabric.generate import fattree
    from tests.conftest import need_ibsim
    from tests.test_ibsim_election import ibfm_serve, wait_for
    from tests.test_ibsim_sm import REPO, SIM_SPEED, start_sim
    from tests.umad_probe import run_probe

    need_ibsim("saquery", "iblinkinfo")
    sm_host, client, ca = "host-00000", "host-00002", "host-00003"
    with start_sim(tmp_path, fattree(2, 6, speed=SIM_SPEED), sm_host) as sim:
        fabric = read_net(sim.netfile)
        with ibfm_serve(sim, priority=0) as ib:
            wait_for("ibfm master, subnet up", lambda: ib.health().get("subnet_up") is True, 30)
            env = sim.proc.env(sim_host=client)
            env["PYTHONPATH"] = str(REPO)

            def lid_of(name: str, port: int = 1) -> int:
                want = f"{int(fabric.port_guid[fabric.by_name(name), port]):#018x}"
                for line in (sim.work / "ibfm" / "guid2lid").read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 3 and f"{int(parts[0], 16):#018x}" == want:
                        return int(parts[1], 0)
                raise AssertionError(f"{name} not in guid2lid")

            wait_for("guid2lid written", lambda: (sim.work / "ibfm" / "guid2lid").exists(), 10)
            sm_lid, ca_lid, sw_lid = lid_of(sm_host), lid_of(ca), lid_of("leaf-00", 0)
            far = lid_of(fabric.names[int(fabric.cas[-1])])

            def saquery_nr() -> subprocess.CompletedProcess[str]:
                return subprocess.run(["saquery", "-t", "1000", "NR", str(ca_lid)], env=env, cwd=sim.work,
                                      capture_output=True, text=True, timeout=30)  # fmt: skip

            first = saquery_nr()
            assert first.returncode == 0 and ca in first.stdout, first.stdout + first.stderr
            t0 = time.monotonic()
            args = {"lid": sm_lid, "count": 3000, "seed": 11, "ca_lids": [ca_lid, far], "sw_lid": sw_lid}
            res = run_probe(sim.proc, sim.work, "sa_fuzz", args, sim_host=client, timeout=120)
            took = time.monotonic() - t0
            print(f"\nsa_fuzz over ibsim ({took:.1f} s):", {k: v for k, v in res.items() if k != "stats"})
            assert ib.proc.poll() is None, ib.log.read_text()[-3000:]
            assert res["sent"] > 2800, res
            assert res["answers"] > 1000, res
            bad = {k: v for k, v in res["sa_status"].items() if int(k, 16) not in SA_STATUSES}
            assert not bad, bad
            bad = {k: v for k, v in res["smp_status"].items() if int(k, 16) & 0x7FFF not in SMP_STATUSES | REFUSALS}
            assert not bad, bad
            assert res["wrong_tid"] == 0 and res["wrong_size"] == 0, res
            h = ib.health()
            assert h.get("subnet_up") is True and h.get("sm", {}).get("state") == "master", h
            again = saquery_nr()
            assert again.returncode == 0, again.stderr
            assert again.stdout == first.stdout, (first.stdout, again.stdout)
            counts = port_states(env, sim.work)
            print("ports after:", counts, "health:", {k: h.get(k) for k in ("state", "subnet_up")})
            assert counts["Initialize"] == 0 and counts["Armed"] == 0 and counts["Active"] > 0, counts
            assert ib.proc.poll() is None
        assert sim.proc.alive()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-s"]))
