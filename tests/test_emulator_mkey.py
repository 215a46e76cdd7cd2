"""M_Key protection on the emulated fabric (IBA 14.2.4): the check by protection level, the
hidden M_Key, M_KeyViolations, trap 256, the lease, and the unchecked fast path."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from fabric.emulator import EmulatedFabric, EmulatorError
from fabric.mad import (
    NODE_INFO,
    PORT_COUNTERS,
    PORT_INFO,
    MadStatus,
    Method,
    MgmtClass,
    NoticeType,
    PerfAttr,
    ProducerType,
    SmpAttr,
    Trap,
    lft_block_pack,
    notice_unpack,
    parse_mad,
    perf_mad,
    smp_dr,
    smp_lid,
    trap256_pack,
)
from tests.test_emulator import HOST0, HOST2, LEAF0, LEAF1, SPINE0, programmed

KEY = 0x0123_4567_89AB_CDEF
BAD = 0x0BAD_0BAD_0BAD_0BAD
HOST3 = 3  # on leaf 1, port 2
HOST2_PATH = (1, 3, 2, 1)  # host 0 -> leaf 0 (in 1) -> spine 0 (in 1) -> leaf 1 (in 3) -> host 2 (in 1)
LEAF1_PATH = (1, 3, 2)
_tids = itertools.count(1)


@dataclass
class FakeClock:
    """Monotonic seconds that move only when a test moves them."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def rig() -> tuple[EmulatedFabric, FakeClock]:
    emu = programmed()
    clock = FakeClock()
    emu.clock = clock
    return emu, clock


def dr(
    emu: EmulatedFabric,
    method: int,
    attr: int,
    path: tuple[int, ...],
    *,
    mod: int = 0,
    data: bytes = b"",
    mkey: int = 0,
) -> bytes | None:
    return emu.process(smp_dr(method, attr, mod, next(_tids), path, data, mkey))


def ok(reply: bytes | None) -> bytes:
    """The data of an answer with status OK (fails the test when the SMP was dropped)."""
    assert reply is not None, "SMP was dropped"
    m = parse_mad(reply)
    assert m.is_response and m.status == MadStatus.OK, m
    return m.data


def pi_get(emu: EmulatedFabric, path: tuple[int, ...], *, mod: int = 0, mkey: int = KEY) -> dict[str, int] | None:
    """PortInfo by directed route; None when the SMP was dropped."""
    reply = dr(emu, Method.GET, SmpAttr.PORT_INFO, path, mod=mod, mkey=mkey)
    return None if reply is None else PORT_INFO.unpack(ok(reply))  # type: ignore[return-value]


def pi_set(
    emu: EmulatedFabric, path: tuple[int, ...], *, mod: int = 0, mkey: int = KEY, **changes: int
) -> dict[str, int] | None:
    """Set PortInfo: the port's current image with ``changes`` (taken from the emulator, so no SMP
    touches the port before the Set); None when the Set was dropped."""
    assert emu.m_key_protect is not None  # leases that ran out by now apply to the image
    cur: dict[str, int] = PORT_INFO.unpack(emu._port_info_bytes(*node_port(emu, path, mod)))  # type: ignore[assignment]
    cur.update(changes)
    reply = dr(emu, Method.SET, SmpAttr.PORT_INFO, path, mod=mod, data=PORT_INFO.pack(cur), mkey=mkey)
    return None if reply is None else PORT_INFO.unpack(ok(reply))  # type: ignore[return-value]


def node_port(emu: EmulatedFabric, path: tuple[int, ...], mod: int) -> tuple[int, int]:
    node = emu.sm_node
    port = emu.sm_port
    for p in path:
        node, port = int(emu.fabric.peer_node[node, p]), int(emu.fabric.peer_port[node, p])
    return node, (mod if emu.fabric.is_switch(node) else port)


def protect(
    emu: EmulatedFabric, path: tuple[int, ...], level: int, *, lease: int = 0, key: int = KEY, sm_lid: int | None = None
) -> None:
    """Key a port by a PortInfo Set, as an SM does (the port's M_Key is 0 before)."""
    changes = {"M_Key": key, "M_KeyProtectBits": level, "M_KeyLeasePeriod": lease}
    if sm_lid is not None:
        changes["MasterSMLID"] = sm_lid
    got = pi_set(emu, path, mkey=0, **changes)
    assert got is not None and got["M_Key"] == key and got["M_KeyProtectBits"] == level


def traps256(traps: list[bytes]) -> list[dict]:
    out = []
    for raw in traps:
        m = parse_mad(raw)
        assert (m.mgmt_class, m.method, m.attr_id) == (MgmtClass.SUBN_LID, Method.TRAP, SmpAttr.NOTICE)
        n = notice_unpack(m.data)
        assert n["TrapNumber"] == Trap.BAD_M_KEY
        out.append(n)
    return out


# -- the fast path ----------------------------------------------------------------------------


def test_no_m_key_anywhere_means_no_check_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    emu, _ = rig()
    assert not emu.m_key_checking
    calls: list[int] = []

    def spy(*args: object) -> int:
        calls.append(1)
        raise AssertionError("M_Key check on the unkeyed fast path")

    monkeypatch.setattr(emu, "_m_key_check", spy)
    fab = emu.fabric
    for n in range(fab.n_nodes):  # a sweep's worth of SMPs, any key, Get and Set, DR and LID routed
        path = emu.dr_path(n)
        ok(dr(emu, Method.GET, SmpAttr.NODE_INFO, path, mkey=BAD))
        port = 0 if fab.is_switch(n) else 1
        pi = PORT_INFO.unpack(ok(dr(emu, Method.GET, SmpAttr.PORT_INFO, path, mod=port)))
        ok(dr(emu, Method.SET, SmpAttr.PORT_INFO, path, mod=port, data=PORT_INFO.pack(pi), mkey=BAD))
        ok(emu.process(smp_lid(Method.GET, SmpAttr.NODE_INFO, 0, 1, mkey=BAD), int(fab.lid[n, port])))
    assert calls == []
    # a PortInfo Set with protection bits but M_Key 0 keeps the fast path: nothing to check against
    assert pi_set(emu, HOST2_PATH, mkey=0, M_KeyProtectBits=3, M_KeyLeasePeriod=5) is not None
    assert not emu.m_key_checking and calls == []
    monkeypatch.undo()
    emu.set_m_key(HOST2, 1, KEY, protect=3)
    assert emu.m_key_checking
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    emu.set_m_key(HOST2, 1, 0, protect=3)
    assert not emu.m_key_checking
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is not None


# -- the check by protection level ----------------------------------------------------------


# (level, method) -> with a wrong key: answered?, M_Key shown in a PortInfo answer
WRONG_KEY: dict[tuple[int, int], tuple[bool, int | None]] = {
    (0, Method.GET): (True, KEY),
    (1, Method.GET): (True, 0),
    (2, Method.GET): (False, None),
    (3, Method.GET): (False, None),
    (0, Method.SET): (False, None),
    (1, Method.SET): (False, None),
    (2, Method.SET): (False, None),
    (3, Method.SET): (False, None),
}


@pytest.mark.parametrize(("level", "method"), sorted(WRONG_KEY))
@pytest.mark.parametrize(
    ("target", "path", "mod"), [(HOST2, HOST2_PATH, 0), (LEAF1, LEAF1_PATH, 0), (LEAF1, LEAF1_PATH, 4)]
)
def test_protection_levels(level: int, method: int, target: int, path: tuple[int, ...], mod: int) -> None:
    emu, _ = rig()
    protect(emu, path, level)
    e = 0 if emu.fabric.is_switch(target) else 1
    before = emu.master_sm_sl[target, e]
    answered, shown = WRONG_KEY[(level, method)]
    for mkey in (BAD, 0):  # a wrong key, and none at all
        if method == Method.GET:
            got = pi_get(emu, path, mod=mod, mkey=mkey)
            assert (got is not None) == answered
            if got is not None:
                assert got["M_Key"] == shown
                assert got["M_KeyProtectBits"] == level  # only the key itself is hidden
        else:
            assert (pi_set(emu, path, mod=mod, mkey=mkey, MasterSMSL=7) is not None) == answered
            assert emu.master_sm_sl[target, e] == before  # the dropped Set changed nothing
    # the right key: answered, the key shown, and a Set acts
    got = pi_get(emu, path, mod=mod)
    assert got is not None and got["M_Key"] == KEY
    got = pi_set(emu, path, mod=mod, MasterSMSL=7)
    if mod == 0:  # an external switch port does not hold the SM fields
        assert got is not None and got["MasterSMSL"] == 7 and emu.master_sm_sl[target, e] == 7
    else:
        assert got is not None


@pytest.mark.parametrize("level", [0, 1, 2, 3])
def test_port_m_key_zero_checks_nothing(level: int) -> None:
    emu, _ = rig()
    assert pi_set(emu, HOST2_PATH, mkey=0, M_KeyProtectBits=level) is not None
    for mkey in (BAD, KEY, 0):
        got = pi_get(emu, HOST2_PATH, mkey=mkey)
        assert got is not None and got["M_Key"] == 0 and got["M_KeyProtectBits"] == level
        assert pi_set(emu, HOST2_PATH, mkey=mkey, SubnetTimeOut=mkey & 0x1F) is not None
    assert emu.m_key_violations.sum() == 0 and emu.stats.m_key_violations == 0


@pytest.mark.parametrize(
    ("attr", "mod"),
    [
        (SmpAttr.NODE_INFO, 0),
        (SmpAttr.NODE_DESC, 0),
        (SmpAttr.GUID_INFO, 0),
        (SmpAttr.SWITCH_INFO, 0),
        (SmpAttr.PKEY_TABLE, 0),
        (SmpAttr.SL2VL_TABLE, 0x0103),
        (SmpAttr.VLARB_TABLE, 0x10000),
        (SmpAttr.LFT, 0),
        (SmpAttr.MFT, 0),
        (SmpAttr.SM_INFO, 0),
    ],
)
def test_every_attribute_is_checked(attr: int, mod: int) -> None:
    emu, _ = rig()
    protect(emu, LEAF1_PATH, 2)
    assert dr(emu, Method.GET, attr, LEAF1_PATH, mod=mod, mkey=BAD) is None
    reply = dr(emu, Method.GET, attr, LEAF1_PATH, mod=mod, mkey=KEY)
    assert reply is not None  # answered (SMInfo: unsupported, no SM there)
    assert emu.m_key_violations[LEAF1, 0] == 1


def test_sets_of_tables_need_the_key() -> None:
    emu, _ = rig()
    protect(emu, LEAF1_PATH, 1)
    row = emu.switch_row(LEAF1)
    block = lft_block_pack([9] * 64)
    assert dr(emu, Method.SET, SmpAttr.LFT, LEAF1_PATH, mod=2, data=block, mkey=BAD) is None
    assert (emu.lft[row, 128:192] == 255).all()
    ok(dr(emu, Method.GET, SmpAttr.LFT, LEAF1_PATH, mod=2, mkey=BAD))  # level 1: Gets pass
    ok(dr(emu, Method.SET, SmpAttr.LFT, LEAF1_PATH, mod=2, data=block, mkey=KEY))
    assert (emu.lft[row, 128:192] == 9).all()


def test_a_second_sm_without_the_key_cannot_change_a_protected_port() -> None:
    emu, _ = rig()
    protect(emu, HOST2_PATH, 2)
    other = emu.attach(HOST3)  # a second SM or a tool, LID routed
    lid = int(emu.fabric.lid[HOST2, 1])
    cur = PORT_INFO.unpack(emu._port_info_bytes(HOST2, 1))
    cur["LID"] = 999
    for mkey in (BAD, 0):
        assert (
            emu.process(smp_lid(Method.SET, SmpAttr.PORT_INFO, 0, 5, PORT_INFO.pack(cur), mkey), lid, src=other) is None
        )
        assert emu.process(smp_lid(Method.GET, SmpAttr.PORT_INFO, 0, 6, b"", mkey), lid, src=other) is None
    assert emu.fabric.lid[HOST2, 1] == lid
    assert emu.stats.m_key_violations == 4
    reply = emu.process(smp_lid(Method.SET, SmpAttr.PORT_INFO, 0, 7, PORT_INFO.pack(cur), KEY), lid, src=other)
    assert PORT_INFO.unpack(ok(reply))["LID"] == 999 and emu.fabric.lid[HOST2, 1] == 999


def test_perfmgt_is_not_an_m_key_matter() -> None:
    emu, _ = rig()
    protect(emu, HOST2_PATH, 3)
    data = bytearray(PORT_COUNTERS.size)
    data[1] = 1
    reply = emu.process(perf_mad(Method.GET, PerfAttr.PORT_COUNTERS, 0, 1, bytes(data)), int(emu.fabric.lid[HOST2, 1]))
    assert reply is not None and parse_mad(reply).status == MadStatus.OK


def test_dr_forwarding_through_protected_switches_is_not_checked() -> None:
    emu, _ = rig()
    for path in ((1,), (1, 3), LEAF1_PATH):  # leaf 0, spine 0, leaf 1: every switch on the way
        protect(emu, path, 3)
    got = NODE_INFO.unpack(ok(dr(emu, Method.GET, SmpAttr.NODE_INFO, HOST2_PATH, mkey=BAD)))
    assert got["NodeGUID"] == int(emu.fabric.node_guid[HOST2])
    assert pi_set(emu, HOST2_PATH, mkey=BAD, SubnetTimeOut=9) is not None
    # LID-routed SMPs pass the protected switches' LFTs too
    ok(emu.process(smp_lid(Method.GET, SmpAttr.NODE_INFO, 0, 1, mkey=BAD), int(emu.fabric.lid[HOST2, 1])))
    assert emu.stats.m_key_violations == 0
    # what is addressed to a switch is its SMA's business
    assert dr(emu, Method.GET, SmpAttr.NODE_INFO, (1, 3), mkey=BAD) is None
    assert emu.m_key_violations[SPINE0, 0] == 1 and emu.m_key_violations[LEAF0, 0] == 0


# -- M_KeyViolations ----------------------------------------------------------------------


def test_violations_count_show_in_port_info_and_clear() -> None:
    emu, _ = rig()
    protect(emu, LEAF1_PATH, 1)
    ok(dr(emu, Method.GET, SmpAttr.NODE_INFO, LEAF1_PATH, mkey=BAD))  # level 1 Get: no violation
    assert emu.m_key_violations[LEAF1, 0] == 0
    for _ in range(3):
        assert pi_set(emu, LEAF1_PATH, mkey=BAD) is None
    assert emu.m_key_violations[LEAF1, 0] == 3
    assert emu.stats.m_key_violations == 3 and emu.stats.dropped == 3
    for mod in (0, 1, 4):  # the switch's count, on each of its ports' PortInfo
        got = pi_get(emu, LEAF1_PATH, mod=mod)
        assert got is not None and got["M_KeyViolations"] == 3
    rows = emu._port_info_rows()  # the vector packer agrees with the per-port one
    k = LEAF1 * emu._P
    assert rows[k + 2].tobytes() == emu._port_info_bytes(LEAF1, 2)
    got = pi_set(emu, LEAF1_PATH, M_KeyViolations=5)  # not 0: left alone
    assert got is not None and got["M_KeyViolations"] == 3
    got = pi_set(emu, LEAF1_PATH, M_KeyViolations=0)  # 0 clears it
    assert got is not None and got["M_KeyViolations"] == 0 and emu.m_key_violations[LEAF1, 0] == 0


def test_violations_saturate() -> None:
    emu, _ = rig()
    protect(emu, HOST2_PATH, 3)
    emu._m_key_violations[HOST2, 1] = 0xFFFE
    for _ in range(3):
        assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    assert emu.m_key_violations[HOST2, 1] == 0xFFFF and emu.stats.m_key_violations == 3


# -- trap 256 ---------------------------------------------------------------------------------


def test_trap_256_for_a_lid_routed_smp() -> None:
    emu, _ = rig()
    protect(emu, HOST2_PATH, 2)
    other = emu.attach(HOST3)
    lid = int(emu.fabric.lid[HOST2, 1])
    emu.traps.clear()
    assert emu.process(smp_lid(Method.SET, SmpAttr.PORT_INFO, 0x1234, 9, bytes(64), BAD), lid, src=other) is None
    (n,) = traps256(list(emu.traps))  # to the port's MasterSMLID: the SM's own port
    assert (n["IsGeneric"], n["Type"], n["ProducerType"]) == (1, NoticeType.SECURITY, ProducerType.CA)
    assert n["IssuerLID"] == lid
    assert n["LIDADDR"] == int(emu.fabric.lid[HOST3, 1])  # the requester
    assert (n["Method"], n["AttributeID"], n["AttributeModifier"]) == (Method.SET, SmpAttr.PORT_INFO, 0x1234)
    assert n["M_Key"] == BAD
    assert (n["DRSLID"], n["DRNotice"], n["DRHopCount"], n["DRReturnPath"]) == (0, 0, 0, [])
    assert emu.stats.traps_sent >= 1


def test_trap_256_for_a_directed_route_smp_from_a_switch() -> None:
    emu, _ = rig()
    protect(emu, LEAF1_PATH, 3)
    emu.traps.clear()
    assert dr(emu, Method.GET, SmpAttr.NODE_DESC, LEAF1_PATH, mod=0, mkey=BAD) is None
    (n,) = traps256(list(emu.traps))
    assert n["ProducerType"] == ProducerType.SWITCH and n["IssuerLID"] == int(emu.fabric.lid[LEAF1, 0])
    assert (n["Method"], n["AttributeID"], n["M_Key"]) == (Method.GET, SmpAttr.NODE_DESC, BAD)
    assert n["LIDADDR"] == 0xFFFF and n["DRSLID"] == 0xFFFF  # the permissive source of a DR SMP
    assert (n["DRNotice"], n["DRPathTruncated"], n["DRHopCount"]) == (1, 0, 3)
    f = emu.fabric
    assert n["DRReturnPath"] == [int(f.peer_port[HOST0, 1]), int(f.peer_port[LEAF0, 3]), int(f.peer_port[SPINE0, 2])]
    assert n["DRReturnPath"] == [1, 1, 3]


def test_trap_256_goes_to_the_ports_master_sm() -> None:
    emu, _ = rig()
    other = emu.attach(HOST3)
    other_lid = int(emu.fabric.lid[HOST3, 1])
    protect(emu, HOST2_PATH, 2, sm_lid=other_lid)  # the port's master SM is the other one
    emu.traps.clear()
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    assert not emu.traps
    (n,) = traps256(list(other.traps))
    assert n["IssuerLID"] == int(emu.fabric.lid[HOST2, 1]) and n["Method"] == Method.GET
    # no MasterSMLID: counted and dropped, no trap anywhere
    assert pi_set(emu, HOST2_PATH, MasterSMLID=0) is not None
    dropped = emu.stats.traps_dropped
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    assert emu.stats.traps_dropped == dropped + 1 and len(other.traps) == 1 and not emu.traps
    assert emu.m_key_violations[HOST2, 1] == 2


def test_trap_256_golden() -> None:
    n = trap256_pack(
        0x11,
        lid=0x22,
        method=2,
        attr_id=0x15,
        attr_mod=0x01020304,
        m_key=KEY,
        dr_slid=0xFFFF,
        dr_return_path=list(range(1, 33)),
        producer_type=ProducerType.SWITCH,
    )
    assert len(n) == 64
    assert n[0] == 0x82 and n[1:4] == b"\0\0\x02" and n[4:6] == b"\x01\x00" and n[6:8] == b"\0\x11"
    d = n[10:]
    assert d[2:4] == b"\0\x22" and d[4:6] == b"\xff\xff" and d[6] == 2 and d[8:10] == b"\0\x15"
    assert d[10:14] == bytes.fromhex("01020304") and d[14:22] == KEY.to_bytes(8, "big")
    assert d[23] == 0x80 | 0x40 | 30 and d[24:54] == bytes(range(1, 31))  # 32 hops: truncated to 30
    u = notice_unpack(n)
    assert (u["DRPathTruncated"], u["DRHopCount"], u["DRReturnPath"]) == (1, 30, list(range(1, 31)))


# -- the lease --------------------------------------------------------------------------------


def test_lease_runs_out_and_protection_falls_to_zero() -> None:
    emu, clock = rig()
    protect(emu, HOST2_PATH, 3, lease=10)
    assert emu.m_key_lease_ends(HOST2, 1) is None  # no failure yet: no timer
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    assert emu.m_key_lease_ends(HOST2, 1) == clock.now + 10
    started = clock.now
    clock.now += 9.5
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    assert emu.m_key_lease_ends(HOST2, 1) == started + 10  # a running timer is not restarted
    clock.now = started + 10
    assert emu.m_key_protect[HOST2, 1] == 0  # ran out (read without any SMP)
    assert emu.m_key_lease_ends(HOST2, 1) is None
    got = pi_get(emu, HOST2_PATH, mkey=BAD)  # level 0 now: a Get shows the key again
    assert got is not None and got["M_Key"] == KEY and got["M_KeyProtectBits"] == 0
    # the key stays: a Set with a wrong one still fails (and starts the timer again) ...
    assert pi_set(emu, HOST2_PATH, mkey=BAD, SubnetTimeOut=3) is None
    assert emu.m_key_lease_ends(HOST2, 1) == clock.now + 10
    # ... while the key just read recovers the port
    got = pi_set(emu, HOST2_PATH, mkey=got["M_Key"], M_Key=0x77, M_KeyProtectBits=2, SubnetTimeOut=3)
    assert got is not None and emu.m_key[HOST2, 1] == 0x77 and emu.m_key_protect[HOST2, 1] == 2
    assert emu.m_key_lease_ends(HOST2, 1) is None  # the passing Set stopped the timer


def test_lease_runs_out_on_a_switch_when_an_smp_arrives() -> None:
    emu, clock = rig()
    protect(emu, LEAF1_PATH, 2, lease=4)
    assert dr(emu, Method.GET, SmpAttr.NODE_INFO, LEAF1_PATH, mkey=BAD) is None
    clock.now += 4
    got = pi_get(emu, LEAF1_PATH, mod=3, mkey=BAD)  # an external port's PortInfo shows port 0's fields
    assert got is not None and got["M_KeyProtectBits"] == 0 and got["M_Key"] == KEY


def test_right_key_stops_the_lease() -> None:
    emu, clock = rig()
    protect(emu, HOST2_PATH, 2, lease=10)
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    clock.now += 8
    assert pi_get(emu, HOST2_PATH, mkey=KEY) is not None  # the SM is still there
    assert emu.m_key_lease_ends(HOST2, 1) is None
    clock.now += 100
    assert emu.m_key_protect[HOST2, 1] == 2
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None  # still protected; the timer starts afresh
    assert emu.m_key_lease_ends(HOST2, 1) == clock.now + 10


def test_lease_period_zero_never_runs_out() -> None:
    emu, clock = rig()
    protect(emu, HOST2_PATH, 3, lease=0)
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    assert emu.m_key_lease_ends(HOST2, 1) is None
    clock.now += 1e9
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None and emu.m_key_protect[HOST2, 1] == 3


def test_default_clock_is_monotonic() -> None:
    emu = programmed()
    a = emu.clock()
    assert emu.clock() >= a
    emu.set_m_key(HOST2, 1, KEY, protect=3, lease=60)
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    ends = emu.m_key_lease_ends(HOST2, 1)
    assert ends is not None and a + 60 <= ends <= emu.clock() + 60


# -- set-up helpers and resets --------------------------------------------------------------


def test_set_m_key_checks_and_arrays_are_read_only() -> None:
    emu, _ = rig()
    emu.set_m_key(LEAF1, 3, KEY, protect=1, lease=7)  # a switch: its port 0
    assert (emu.m_key[LEAF1, 0], emu.m_key_protect[LEAF1, 0], emu.m_key_lease[LEAF1, 0]) == (KEY, 1, 7)
    got = pi_get(emu, LEAF1_PATH, mkey=BAD)
    assert got is not None and got["M_Key"] == 0 and got["M_KeyLeasePeriod"] == 7
    with pytest.raises(EmulatorError, match="no such port"):
        emu.set_m_key(HOST2, 2, KEY)
    with pytest.raises(EmulatorError, match=r"outside 0\.\.3"):
        emu.set_m_key(HOST2, 1, KEY, protect=4)
    with pytest.raises(EmulatorError, match="64 bits"):
        emu.set_m_key(HOST2, 1, 1 << 64)
    with pytest.raises(EmulatorError, match=r"outside 0\.\.65535"):
        emu.set_m_key(HOST2, 1, KEY, lease=1 << 16)
    with pytest.raises(EmulatorError, match="outside"):
        emu.set_m_key(999, 1, KEY)
    for arr in (emu.m_key, emu.m_key_protect, emu.m_key_lease, emu.m_key_violations):
        with pytest.raises(ValueError, match="read-only"):
            arr[HOST2, 1] = 1


def test_power_cycle_forgets_the_key() -> None:
    emu, _ = rig()
    protect(emu, HOST2_PATH, 3, lease=5)
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is None
    emu.remove_node(HOST2)
    emu.restore_node(HOST2)
    assert not emu.m_key_checking and emu.m_key_lease_ends(HOST2, 1) is None
    assert int(emu.m_key_violations[HOST2, 1]) == 0 and int(emu.m_key[HOST2, 1]) == 0
    assert pi_get(emu, HOST2_PATH, mkey=BAD) is not None


def test_many_keyed_ports_each_with_its_own_key() -> None:
    emu, _ = rig()
    fab = emu.fabric
    keys = {}
    for n in range(fab.n_nodes):
        keys[n] = 0x1000 + n
        emu.set_m_key(n, 0 if fab.is_switch(n) else 1, keys[n], protect=3)
    for n in range(fab.n_nodes):
        path = emu.dr_path(n)
        assert dr(emu, Method.GET, SmpAttr.NODE_INFO, path, mkey=keys[(n + 1) % fab.n_nodes]) is None
        ok(dr(emu, Method.GET, SmpAttr.NODE_INFO, path, mkey=keys[n]))
    assert int(np.count_nonzero(emu.m_key_violations)) == fab.n_nodes
