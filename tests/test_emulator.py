"""The emulated fabric: attributes, directed and LID routing, port states, links, traps, counters."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from fabric.emulator import (
    LFT_CAP,
    ConstantTraffic,
    Counter,
    EmulatedFabric,
    EmulatorError,
    _pack_rows,
)
from fabric.generate import fattree
from fabric.mad import (
    CLASS_PORT_INFO,
    GUID_INFO,
    NODE_INFO,
    PORT_COUNTERS,
    PORT_COUNTERS_EXT,
    PORT_INFO,
    SM_INFO,
    SWITCH_INFO,
    MadStatus,
    Method,
    MgmtClass,
    PerfAttr,
    PerfCap,
    PortCap,
    SmpAttr,
    SmState,
    lft_block_pack,
    lft_block_unpack,
    node_desc_unpack,
    notice_unpack,
    parse_mad,
    perf_mad,
    smp_dr,
    smp_lid,
    trap_repress,
)
from fabric.model import Fabric, FabricBuilder, NodeType, PhysState, PortState
from sm.lidmap import sequential_lids

# fattree(2, 4): hosts 0..7, leaves 8..11 (ports 1-2 hosts, 3-4 spines), spines 12..13 (port l+1 = leaf l).
HOST0, HOST2, LEAF0, LEAF1, SPINE0, SPINE1 = 0, 2, 8, 9, 12, 13


def small() -> Fabric:
    return fattree(2, 4)


def get_dr(emu: EmulatedFabric, attr: int, path: tuple[int, ...], mod: int = 0, tid: int = 7) -> bytes | None:
    return emu.process(smp_dr(Method.GET, attr, mod, tid, path))


def set_dr(emu: EmulatedFabric, attr: int, path: tuple[int, ...], data: bytes, mod: int = 0) -> bytes | None:
    return emu.process(smp_dr(Method.SET, attr, mod, 9, path, data))


def answer(reply: bytes | None) -> tuple[int, bytes]:
    assert reply is not None, "MAD was dropped"
    m = parse_mad(reply)
    assert m.is_response
    return m.status, m.data


def port_info(emu: EmulatedFabric, path: tuple[int, ...], port: int = 0) -> dict[str, int]:
    status, data = answer(get_dr(emu, SmpAttr.PORT_INFO, path, port))
    assert status == MadStatus.OK
    return PORT_INFO.unpack(data)  # type: ignore[return-value]


def set_port_info(emu: EmulatedFabric, path: tuple[int, ...], port: int, **changes: int) -> tuple[int, dict]:
    cur = port_info(emu, path, port)
    cur.update(changes)
    status, data = answer(set_dr(emu, SmpAttr.PORT_INFO, path, PORT_INFO.pack(cur), port))
    return status, PORT_INFO.unpack(data)


def bfs_lft(fab: Fabric, base: npt.NDArray[np.uint16]) -> npt.NDArray[np.uint8]:
    """Shortest-path LFT over up switch links, rows as ``fab.switches`` (test helper)."""
    sw = [int(s) for s in fab.switches]
    row = {s: i for i, s in enumerate(sw)}
    lft = np.full((len(sw), int(base.max()) + 1), 255, np.uint8)
    up = fab.up_mask()
    for n, p in np.argwhere(base > 0).tolist():
        lid = int(base[n, p])
        if fab.is_switch(n):
            target, lft[row[n], lid] = n, 0
        else:
            if not up[n, p]:
                continue
            target = int(fab.peer_node[n, p])
            lft[row[target], lid] = int(fab.peer_port[n, p])
        seen, frontier = {target}, [target]
        while frontier:
            nxt = []
            for a in frontier:
                for _, b, q in fab.neighbours(a):
                    if fab.is_switch(b) and b not in seen:
                        seen.add(b)
                        lft[row[b], lid] = q
                        nxt.append(b)
            frontier = nxt
    return lft


def programmed(state: PortState = PortState.ACTIVE, fab: Fabric | None = None) -> EmulatedFabric:
    """An emulator configured as after a sweep: sequential LIDs, shortest-path LFTs, ``state``."""
    fab = fab or small()
    emu = EmulatedFabric(fab)
    lids = sequential_lids(fab)
    emu.apply_subnet(lids.base, 0, bfs_lft(fab, lids.base), state=state)
    return emu


# -- NodeInfo, NodeDescription, GUIDInfo -----------------------------------------------------


def test_node_info_decodes_to_fabric_guids() -> None:
    fab = small()
    emu = EmulatedFabric(fab)
    for n in range(fab.n_nodes):
        path = emu.dr_path(n)
        status, data = answer(get_dr(emu, SmpAttr.NODE_INFO, path))
        ni = NODE_INFO.unpack(data)
        assert status == MadStatus.OK
        assert ni["NodeGUID"] == int(fab.node_guid[n])
        assert ni["SystemImageGUID"] == int(fab.sysimg_guid[n])
        assert ni["NodeType"] == int(fab.node_type[n])
        assert ni["NumPorts"] == int(fab.nports[n])
        in_port = ni["LocalPortNum"]
        expect_pg = fab.port_guid[n, 0] if fab.is_switch(n) else fab.port_guid[n, in_port]
        assert ni["PortGUID"] == int(expect_pg)
        status, data = answer(get_dr(emu, SmpAttr.NODE_DESC, path))
        assert node_desc_unpack(data) == fab.descs[n]


def test_local_port_num_is_the_arrival_port() -> None:
    emu = EmulatedFabric(small())
    # leaf 0 reached from host 0 (its port 1) and again down from spine 0 (its port 3)
    assert NODE_INFO.unpack(answer(get_dr(emu, SmpAttr.NODE_INFO, (1,)))[1])["LocalPortNum"] == 1
    assert NODE_INFO.unpack(answer(get_dr(emu, SmpAttr.NODE_INFO, (1, 3, 1)))[1])["LocalPortNum"] == 3
    assert port_info(emu, (1, 4, 1), 2)["LocalPortNum"] == 4
    # the SM's own node, 0 hops: its own port
    ni = NODE_INFO.unpack(answer(get_dr(emu, SmpAttr.NODE_INFO, ()))[1])
    assert ni["LocalPortNum"] == 1 and ni["NodeGUID"] == int(emu.fabric.node_guid[HOST0])


def two_port_ca_fabric() -> Fabric:
    b = FabricBuilder()
    ca = b.add_node(NodeType.CA, 2, "hca")
    sw = b.add_node(NodeType.SWITCH, 8, "sw")
    b.connect(ca, 1, sw, 1)
    b.connect(ca, 2, sw, 2)
    return b.build()


def test_ca_port_info_modifier_zero_is_the_arrival_port() -> None:
    fab = two_port_ca_fabric()
    emu = EmulatedFabric(fab, sm_node=0, sm_port=1)
    # out of the SM's port 1 into the switch, back out of switch port 2 into the CA's port 2
    pi = port_info(emu, (1, 2), 0)
    assert pi["LocalPortNum"] == 2
    ni = NODE_INFO.unpack(answer(get_dr(emu, SmpAttr.NODE_INFO, (1, 2)))[1])
    assert ni["PortGUID"] == int(fab.port_guid[0, 2]) and ni["LocalPortNum"] == 2
    # GUIDInfo block 0 holds the arrival port's GUID
    status, data = answer(get_dr(emu, SmpAttr.GUID_INFO, (1, 2)))
    assert status == MadStatus.OK and GUID_INFO.unpack(data)["GUID0"] == int(fab.port_guid[0, 2])
    assert answer(get_dr(emu, SmpAttr.GUID_INFO, (1, 2), 1))[0] == MadStatus.INVALID_FIELD
    # GUID0 is read-only: a Set answers with what the port has
    status, data = answer(set_dr(emu, SmpAttr.GUID_INFO, (1, 2), GUID_INFO.pack({"GUID0": 0x1234})))
    assert status == MadStatus.OK and GUID_INFO.unpack(data)["GUID0"] == int(fab.port_guid[0, 2])
    # a CA's explicit port number works too; one beyond its ports does not
    assert port_info(emu, (1, 2), 1)["PortState"] == PortState.INIT
    assert answer(get_dr(emu, SmpAttr.PORT_INFO, (1, 2), 3))[0] == MadStatus.INVALID_FIELD


def test_read_only_and_unknown_attributes() -> None:
    emu = EmulatedFabric(small())
    assert answer(set_dr(emu, SmpAttr.NODE_INFO, (1,), bytes(64)))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED
    assert answer(set_dr(emu, SmpAttr.NODE_DESC, (1,), bytes(64)))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED
    assert answer(get_dr(emu, 0x0031, (1,)))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED  # LedInfo: not emulated
    assert answer(get_dr(emu, SmpAttr.SWITCH_INFO, ()))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED  # on a CA
    assert answer(get_dr(emu, SmpAttr.LFT, ()))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED
    send = bytearray(smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 1, (1,)))
    send[3] = 0x03  # Send: not a method an SMA takes
    assert answer(emu.process(bytes(send)))[0] == MadStatus.METHOD_UNSUPPORTED
    bad_version = bytearray(smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 1, (1,)))
    bad_version[2] = 2
    assert answer(emu.process(bytes(bad_version)))[0] == MadStatus.BAD_VERSION


# -- directed route ------------------------------------------------------------------------


def test_dr_response_header() -> None:
    emu = EmulatedFabric(small())
    req = smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 0x1234, (1, 3, 2, 1))
    m = parse_mad(answer_raw := emu.process(req) or b"")
    assert answer_raw and m.method == Method.GET_RESP and m.d_bit and m.hop_ptr == 0
    assert m.tid == 0x1234 and m.attr_id == SmpAttr.NODE_INFO
    assert m.initial_path == (1, 3, 2, 1)
    # ingress ports on the way: leaf0 via 1, spine0 via 1, leaf1 via 3, host2 via 1
    assert m.return_path == (1, 1, 3, 1)
    assert NODE_INFO.unpack(m.data)["NodeGUID"] == int(emu.fabric.node_guid[HOST2])


@pytest.mark.parametrize(
    "path",
    [
        (2,),  # the SM's CA sends only out of its own port 1
        (1, 5),  # leaf has 4 ports
        (1, 0),  # out port 0 goes nowhere
        (1, 2, 1),  # host 1 is a CA: it does not forward
        (1, 3, 2, 1, 1),  # past the end: host 2 does not forward
        (1, 3, 2, 3, 2, 1, 9),  # beyond the leaf's ports
    ],
)
def test_dr_drops(path: tuple[int, ...]) -> None:
    emu = EmulatedFabric(small())
    before = emu.stats.dropped
    assert get_dr(emu, SmpAttr.NODE_INFO, path) is None
    assert emu.stats.dropped == before + 1


def test_dr_through_down_port_drops_and_passes_init_ports() -> None:
    emu = EmulatedFabric(small())
    assert emu.fabric.state[LEAF0, 3] == PortState.INIT  # DR SMPs pass INIT ports
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 3)) is not None
    emu.link_down(LEAF0, 3)
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 3)) is None
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 3, 2)) is None
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 4, 2)) is not None  # the other spine still works
    emu.link_up(LEAF0, 3)
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 3)) is not None


def test_malformed_and_response_mads_are_dropped() -> None:
    emu = EmulatedFabric(small())
    assert emu.process(b"\x01" * 100) is None
    resp = emu.process(smp_dr(Method.GET, SmpAttr.NODE_INFO, 0, 1, (1,)))
    assert resp is not None and emu.process(resp) is None
    with pytest.raises(EmulatorError, match="LID routed"):
        emu.process(smp_lid(Method.GET, SmpAttr.NODE_INFO, 0, 1))


def test_sm_on_a_switch() -> None:
    fab = small()
    emu = EmulatedFabric(fab, sm_node=SPINE0)
    assert emu.sm_port == 0
    assert NODE_INFO.unpack(answer(get_dr(emu, SmpAttr.NODE_INFO, ()))[1])["NodeGUID"] == int(fab.node_guid[SPINE0])
    ni = NODE_INFO.unpack(answer(get_dr(emu, SmpAttr.NODE_INFO, (2, 1)))[1])
    assert ni["NodeGUID"] == int(fab.node_guid[2])
    assert emu.dr_path(2) == (2, 1)


# -- PortInfo and the port state machine ---------------------------------------------------------


def test_port_info_reflects_the_fabric() -> None:
    fab = small()
    emu = EmulatedFabric(fab)
    pi = port_info(emu, (1,), 3)
    assert pi["PortState"] == PortState.INIT and pi["PortPhysicalState"] == PhysState.LINKUP
    assert pi["LinkWidthActive"] == fab.width_active[LEAF0, 3]
    assert pi["MTUCap"] == fab.mtu_cap[LEAF0, 3] and pi["VLCap"] == fab.vl_cap[LEAF0, 3]
    assert pi["LinkSpeedExtActive"] == 8  # NDR
    assert port_info(emu, (1,), 0)["PortState"] == PortState.ACTIVE  # switch port 0
    assert answer(get_dr(emu, SmpAttr.PORT_INFO, (1,), 5))[0] == MadStatus.INVALID_FIELD
    # the SM's port says IsSM
    assert port_info(emu, ())["CapabilityMask"] & PortCap.IS_SM
    assert not port_info(emu, (1,), 0)["CapabilityMask"] & PortCap.IS_SM


def test_port_info_set_lid_sm_lid_mtu_vls() -> None:
    emu = EmulatedFabric(small())
    status, pi = set_port_info(emu, (1,), 0, LID=5, LMC=0, MasterSMLID=17, NeighborMTU=5, OperationalVLs=4)
    assert status == MadStatus.OK
    assert (pi["LID"], pi["MasterSMLID"]) == (5, 17)
    assert emu.fabric.lid[LEAF0, 0] == 5
    # external switch ports show port 0's LID; their own LID field is not settable
    status, pi3 = set_port_info(emu, (1,), 3, LID=99, NeighborMTU=7 & 5, OperationalVLs=5)
    assert status == MadStatus.OK and pi3["LID"] == 5
    assert pi3["OperationalVLs"] == 4  # capped at VLCap (VL0-7)
    emu.fabric.mtu_cap[LEAF0, 2] = 4  # a 2048-byte port
    emu._forget_port_info(LEAF0, 2)
    status, pi2 = set_port_info(emu, (1,), 2, NeighborMTU=5)
    assert status == MadStatus.OK and pi2["NeighborMTU"] == 4  # capped at MTUCap
    status, host = set_port_info(emu, (), 0, LID=3, LMC=2, MasterSMLID=3)
    assert status == MadStatus.OK and (host["LID"], host["LMC"]) == (3, 2)
    assert emu.sm_lid == 3 and emu.local_port.lid == 3
    # a LID range beyond the unicast space is refused
    assert set_port_info(emu, (), 0, LID=0xBFFE, LMC=2)[0] == MadStatus.INVALID_FIELD
    assert port_info(emu, ())["LID"] == 3


def test_port_state_rules() -> None:
    emu = EmulatedFabric(small())
    # INIT -> ACTIVE is refused and nothing of the Set applies
    status, pi = set_port_info(emu, (1,), 3, PortState=PortState.ACTIVE, OperationalVLs=2)
    assert status == MadStatus.INVALID_FIELD
    assert pi["PortState"] == PortState.INIT and pi["OperationalVLs"] == 1
    # writing the current state back changes nothing; codes above ACTIVE are invalid
    assert set_port_info(emu, (1,), 3, PortState=PortState.INIT)[0] == MadStatus.OK
    assert set_port_info(emu, (1,), 3, PortState=6)[0] == MadStatus.INVALID_FIELD
    status, pi = set_port_info(emu, (1,), 3, PortState=PortState.ARMED)
    assert status == MadStatus.OK and pi["PortState"] == PortState.ARMED
    assert emu.fabric.state[SPINE0, 1] == PortState.INIT  # the other end moves on its own Set
    status, pi = set_port_info(emu, (1,), 3, PortState=PortState.ACTIVE)
    assert status == MadStatus.OK and pi["PortState"] == PortState.ACTIVE
    assert set_port_info(emu, (1,), 3, PortState=PortState.ACTIVE)[0] == MadStatus.OK  # no change
    assert set_port_info(emu, (1,), 3, PortState=PortState.ARMED)[0] == MadStatus.INVALID_FIELD
    assert set_port_info(emu, (1,), 3, PortState=PortState.INIT)[0] == MadStatus.INVALID_FIELD
    # NOP leaves the state alone
    assert set_port_info(emu, (1,), 3, PortState=0)[1]["PortState"] == PortState.ACTIVE


def test_set_down_bounces_the_link_back_to_init() -> None:
    emu = EmulatedFabric(small())
    set_port_info(emu, (1,), 3, PortState=PortState.ARMED)
    row = emu.switch_row(LEAF0)
    assert not emu.port_state_change[row]
    status, pi = set_port_info(emu, (1,), 3, PortState=PortState.DOWN)
    assert status == MadStatus.OK
    assert pi["PortState"] == PortState.INIT and pi["PortPhysicalState"] == PhysState.LINKUP
    assert emu.fabric.state[SPINE0, 1] == PortState.INIT
    assert emu.port_state_change[row] and emu.port_state_change[emu.switch_row(SPINE0)]
    assert emu.counters[LEAF0, 3, Counter.LINK_DOWNED] == 1


def test_disable_and_enable_a_port() -> None:
    emu = EmulatedFabric(small())
    status, pi = set_port_info(emu, (1,), 3, PortPhysicalState=PhysState.DISABLED)
    assert status == MadStatus.OK
    assert (pi["PortState"], pi["PortPhysicalState"]) == (PortState.DOWN, PhysState.DISABLED)
    assert emu.fabric.phys_state[SPINE0, 1] == PhysState.POLLING
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 3)) is None
    emu.link_up(LEAF0, 3)  # the cable is fine, the port stays disabled
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 3)) is None
    status, pi = set_port_info(emu, (1,), 3, PortPhysicalState=PhysState.POLLING)
    assert (pi["PortState"], pi["PortPhysicalState"]) == (PortState.INIT, PhysState.LINKUP)
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 3)) is not None
    assert set_port_info(emu, (1,), 3, PortPhysicalState=PhysState.LINKUP)[0] == MadStatus.OK  # current: no-op
    assert set_port_info(emu, (1,), 3, PortPhysicalState=PhysState.SLEEP)[0] == MadStatus.INVALID_FIELD


def test_disabling_the_arrival_link_loses_the_answer() -> None:
    emu = EmulatedFabric(small())
    cur = port_info(emu, (1, 3), 1)
    cur["PortPhysicalState"] = PhysState.DISABLED
    assert set_dr(emu, SmpAttr.PORT_INFO, (1, 3), PORT_INFO.pack(cur), 1) is None
    assert emu.fabric.phys_state[SPINE0, 1] == PhysState.DISABLED


def test_port_info_images_match_the_vector_packer() -> None:
    emu = programmed(PortState.ARMED)
    emu.link_down(LEAF1, 3)
    set_port_info(emu, (1,), 4, PortState=PortState.ACTIVE, NeighborMTU=3)
    emu.set_sm(SPINE1, 0, priority=3)
    rows = emu._port_info_rows()
    fab = emu.fabric
    for n in range(fab.n_nodes):
        for p in np.flatnonzero(fab.port_exists[n]).tolist():
            assert emu._port_info_bytes(n, p) == rows[n * emu._P + p].tobytes(), fab.port_name(n, p)


def test_pack_rows_matches_layout_pack() -> None:
    rng = np.random.default_rng(1)
    vals = {f.name: rng.integers(0, min(f.max_value, 2**62) + 1, 5, dtype=np.uint64) for f in PORT_INFO.fields}
    rows = _pack_rows(PORT_INFO, vals, 5)
    for i in range(5):
        assert rows[i].tobytes() == PORT_INFO.pack({k: int(v[i]) for k, v in vals.items()})


# -- SwitchInfo, LFT, SMInfo ------------------------------------------------------------------


def test_switch_info_get_set() -> None:
    emu = EmulatedFabric(small())
    status, data = answer(get_dr(emu, SmpAttr.SWITCH_INFO, (1,)))
    si = SWITCH_INFO.unpack(data)
    assert status == MadStatus.OK and si["LinearFDBCap"] == LFT_CAP and si["LinearFDBTop"] == 0
    si["LinearFDBTop"] = 100
    status, data = answer(set_dr(emu, SmpAttr.SWITCH_INFO, (1,), SWITCH_INFO.pack(si)))
    assert status == MadStatus.OK and SWITCH_INFO.unpack(data)["LinearFDBTop"] == 100
    si["LinearFDBTop"] = LFT_CAP
    status, data = answer(set_dr(emu, SmpAttr.SWITCH_INFO, (1,), SWITCH_INFO.pack(si)))
    assert status == MadStatus.INVALID_FIELD and SWITCH_INFO.unpack(data)["LinearFDBTop"] == 100


def test_port_state_change_is_cleared_by_writing_one() -> None:
    emu = EmulatedFabric(small())
    emu.link_down(LEAF0, 4)
    si = SWITCH_INFO.unpack(answer(get_dr(emu, SmpAttr.SWITCH_INFO, (1,)))[1])
    assert si["PortStateChange"] == 1
    si["PortStateChange"] = 0  # writing 0 leaves it
    si = SWITCH_INFO.unpack(answer(set_dr(emu, SmpAttr.SWITCH_INFO, (1,), SWITCH_INFO.pack(si)))[1])
    assert si["PortStateChange"] == 1
    si["PortStateChange"] = 1
    si = SWITCH_INFO.unpack(answer(set_dr(emu, SmpAttr.SWITCH_INFO, (1,), SWITCH_INFO.pack(si)))[1])
    assert si["PortStateChange"] == 0
    assert SWITCH_INFO.unpack(answer(get_dr(emu, SmpAttr.SWITCH_INFO, (1, 3)))[1])["PortStateChange"] == 0


def test_lft_blocks() -> None:
    emu = EmulatedFabric(small())
    status, data = answer(get_dr(emu, SmpAttr.LFT, (1,), 2))
    assert status == MadStatus.OK and lft_block_unpack(data) == bytes([255]) * 64
    ports = np.arange(64, dtype=np.uint8) % 5
    status, data = answer(set_dr(emu, SmpAttr.LFT, (1,), lft_block_pack(ports), mod=2))
    assert status == MadStatus.OK and lft_block_unpack(data) == ports.tobytes()
    row = emu.switch_row(LEAF0)
    assert (emu.lft[row, 128:192] == ports).all() and (emu.lft[row, :128] == 255).all()
    assert answer(get_dr(emu, SmpAttr.LFT, (1,), 2))[1][:64] == ports.tobytes()
    last = LFT_CAP // 64
    assert answer(get_dr(emu, SmpAttr.LFT, (1,), last - 1))[0] == MadStatus.OK
    assert answer(get_dr(emu, SmpAttr.LFT, (1,), last))[0] == MadStatus.INVALID_FIELD
    assert answer(set_dr(emu, SmpAttr.LFT, (1,), bytes(64), mod=last))[0] == MadStatus.INVALID_FIELD


def test_lft_width_follows_the_lids_in_use() -> None:
    emu = EmulatedFabric(small())
    assert emu.lft.shape == (6, 64)  # no LIDs yet: one block, not LinearFDBCap's 0xC000 LIDs
    assert answer(get_dr(emu, SmpAttr.LFT, (1,), 700))[1][:64] == bytes([255]) * 64  # beyond: nothing, no growth
    assert emu.lft.shape[1] == 64
    set_port_info(emu, (1,), 0, LID=300)  # a LID given to a port: its block is there to write
    assert emu.lft.shape[1] == 320 and (emu.lft == 255).all()
    ports = np.full(64, 2, np.uint8)
    assert answer(set_dr(emu, SmpAttr.LFT, (1,), lft_block_pack(ports), mod=9))[0] == MadStatus.OK
    row = emu.switch_row(LEAF0)
    assert emu.lft.shape[1] == 640 and (emu.lft[row, 576:640] == 2).all() and (emu.lft[row, :576] == 255).all()
    assert answer(get_dr(emu, SmpAttr.LFT, (1,), 9))[1][:64] == ports.tobytes()
    base = np.where(emu.fabric.port_exists, 1000, 0)
    emu.apply_subnet(base, 0, np.full((6, 2000), 1, np.uint8))
    assert emu.lft.shape[1] == 2048 and (emu.lft[:, :2000] == 1).all() and (emu.lft[:, 2000:] == 255).all()


def test_counters_are_kept_per_existing_port() -> None:
    emu = EmulatedFabric(small(), traffic=ConstantTraffic(bytes_per_s=4e6, packet_bytes=4000))
    ex = emu.fabric.port_exists
    assert emu._ctr.shape[0] == int(ex.sum()) + 1
    emu.add_counter(LEAF0, 2, Counter.SYMBOL_ERROR, 5)
    c = emu.counters
    assert c.shape == (*ex.shape, len(Counter)) and c[LEAF0, 2, Counter.SYMBOL_ERROR] == 5
    assert c.sum() == 5 and not c[~ex].any()


def test_sm_info() -> None:
    fab = small()
    emu = EmulatedFabric(fab)
    status, data = answer(get_dr(emu, SmpAttr.SM_INFO, ()))
    assert status == MadStatus.OK and SM_INFO.unpack(data)["GUID"] == int(fab.port_guid[HOST0, 1])
    assert answer(get_dr(emu, SmpAttr.SM_INFO, (1, 3, 2, 1)))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED
    emu.set_sm(HOST2, 1, priority=14, state=SmState.STANDBY, act_count=5)
    sm = SM_INFO.unpack(answer(get_dr(emu, SmpAttr.SM_INFO, (1, 3, 2, 1)))[1])
    assert (sm["Priority"], sm["SMState"], sm["ActCount"]) == (14, SmState.STANDBY, 5)
    assert port_info(emu, (1, 3, 2, 1))["CapabilityMask"] & PortCap.IS_SM
    assert answer(set_dr(emu, SmpAttr.SM_INFO, (1, 3, 2, 1), bytes(64)))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED


# -- LID routing ---------------------------------------------------------------------------------


def get_lid(emu: EmulatedFabric, attr: int, dlid: int, mod: int = 0) -> bytes | None:
    return emu.process(smp_lid(Method.GET, attr, mod, 3, b""), dlid)


def test_lid_routed_smps_follow_the_lfts() -> None:
    fab = small()
    emu = programmed(PortState.INIT, fab)  # LID-routed SMPs pass INIT ports
    base = emu.fabric.lid
    for n, p in np.argwhere(base > 0).tolist():
        status, data = answer(get_lid(emu, SmpAttr.NODE_INFO, int(base[n, p])))
        assert status == MadStatus.OK and NODE_INFO.unpack(data)["NodeGUID"] == int(fab.node_guid[n])
    assert get_lid(emu, SmpAttr.NODE_INFO, 200) is None  # nobody has LID 200


def test_wrong_lft_drops_and_the_answer_needs_a_way_back() -> None:
    emu = programmed()
    fab = emu.fabric
    lid2 = int(fab.lid[HOST2, 1])
    assert get_lid(emu, SmpAttr.NODE_INFO, lid2) is not None
    # leaf 0 sends host 2's LID to host 1's port: the CA drops it
    r0 = emu.switch_row(LEAF0)
    good = int(emu.lft[r0, lid2])
    emu.lft[r0, lid2] = 2
    assert get_lid(emu, SmpAttr.NODE_INFO, lid2) is None
    emu.lft[r0, lid2] = 255
    assert get_lid(emu, SmpAttr.NODE_INFO, lid2) is None
    emu.lft[r0, lid2] = good
    # LinearFDBTop below the DLID: dropped
    top = int(emu.lft_top[r0])
    emu.lft_top[r0] = lid2 - 1
    assert get_lid(emu, SmpAttr.NODE_INFO, lid2) is None
    emu.lft_top[r0] = top
    # leaf 1 cannot reach the SM's LID: the request arrives, the answer is lost
    r1 = emu.switch_row(LEAF1)
    emu.lft[r1, emu.sm_lid] = 255
    assert get_lid(emu, SmpAttr.NODE_INFO, lid2) is None
    # a spine loop (each sends to the other's leaf) is dropped, not followed forever
    emu.lft[r1, emu.sm_lid] = 3
    for s in (SPINE0, SPINE1):
        emu.lft[emu.switch_row(s), emu.sm_lid] = 2
    emu.lft[emu.switch_row(LEAF1), emu.sm_lid] = 3
    assert get_lid(emu, SmpAttr.NODE_INFO, lid2) is None


def test_lid_routing_programmed_through_mads() -> None:
    fab = small()
    emu = EmulatedFabric(fab)
    lids = sequential_lids(fab)
    lft = bfs_lft(fab, lids.base)
    assert get_lid(emu, SmpAttr.NODE_INFO, int(lids.base[HOST2, 1])) is None  # the SM has no LID yet
    for n in range(fab.n_nodes):
        path = emu.dr_path(n)
        ends = [0] if fab.is_switch(n) else [1]
        for p in ends:
            cur = port_info(emu, path, p)
            cur.update(LID=int(lids.base[n, p]), MasterSMLID=int(lids.base[HOST0, 1]))
            assert answer(set_dr(emu, SmpAttr.PORT_INFO, path, PORT_INFO.pack(cur), p))[0] == 0
        if fab.is_switch(n):
            row = emu.switch_row(n)
            si = SWITCH_INFO.unpack(answer(get_dr(emu, SmpAttr.SWITCH_INFO, path))[1])
            si["LinearFDBTop"] = lft.shape[1] - 1
            answer(set_dr(emu, SmpAttr.SWITCH_INFO, path, SWITCH_INFO.pack(si)))
            for block in range((lft.shape[1] + 63) // 64):
                chunk = np.full(64, 255, np.uint8)
                part = lft[np.flatnonzero(fab.switches == n)[0], block * 64 : block * 64 + 64]
                chunk[: part.size] = part
                answer(set_dr(emu, SmpAttr.LFT, path, lft_block_pack(chunk), mod=block))
            assert (emu.lft[row, : lft.shape[1]] == lft[row]).all()
    status, data = answer(get_lid(emu, SmpAttr.NODE_INFO, int(lids.base[HOST2, 1])))
    assert status == MadStatus.OK and NODE_INFO.unpack(data)["NodeGUID"] == int(fab.node_guid[HOST2])
    status, data = answer(get_lid(emu, SmpAttr.PORT_INFO, int(lids.base[SPINE1, 0]), 2))
    assert status == MadStatus.OK and PORT_INFO.unpack(data)["LID"] == lids.base[SPINE1, 0]


def test_lid_routed_local_and_trap_repress() -> None:
    emu = programmed()
    status, data = answer(get_lid(emu, SmpAttr.NODE_INFO, emu.sm_lid))
    assert status == MadStatus.OK and NODE_INFO.unpack(data)["NodeGUID"] == int(emu.fabric.node_guid[HOST0])
    emu.link_down(LEAF1, 3)
    trap = emu.traps.popleft()
    assert emu.process(trap_repress(trap), int(emu.fabric.lid[LEAF1, 0])) is None
    assert emu.stats.trap_represses == 1


# -- PerfMgt -------------------------------------------------------------------------------------


def perf(
    emu: EmulatedFabric, attr: int, dlid: int, select: int = 1, method: int = Method.GET, data: bytes | None = None
) -> bytes | None:
    body = data if data is not None else bytes([0, select]) + bytes(190)
    return emu.process(perf_mad(method, attr, 0, 11, body), dlid)


def test_perfmgt_needs_active_ports() -> None:
    emu = programmed(PortState.ARMED)
    lid2 = int(emu.fabric.lid[HOST2, 1])
    assert get_lid(emu, SmpAttr.NODE_INFO, lid2) is not None  # SMPs pass ARMED
    assert perf(emu, PerfAttr.PORT_COUNTERS, lid2) is None
    assert perf(emu, PerfAttr.PORT_COUNTERS, emu.sm_lid) is not None  # local: no wire
    emu = programmed(PortState.ACTIVE)
    assert answer(perf(emu, PerfAttr.PORT_COUNTERS, lid2))[0] == MadStatus.OK
    # one ARMED hop on the way (leaf 1 -> host 2 sends from an ARMED port): dropped
    emu.fabric.state[LEAF1, 1] = PortState.ARMED
    emu._sync_port(LEAF1, 1)
    assert perf(emu, PerfAttr.PORT_COUNTERS, lid2) is None
    assert get_lid(emu, SmpAttr.NODE_INFO, lid2) is not None


def test_class_port_info() -> None:
    emu = programmed()
    sw_lid, ca_lid = int(emu.fabric.lid[LEAF1, 0]), int(emu.fabric.lid[HOST2, 1])
    cap = CLASS_PORT_INFO.unpack(answer(perf(emu, PerfAttr.CLASS_PORT_INFO, sw_lid))[1])["CapabilityMask"]
    assert cap & PerfCap.IS_EXTENDED_WIDTH_SUPPORTED and cap & PerfCap.IS_ALL_PORT_SELECT_SUPPORTED
    cap = CLASS_PORT_INFO.unpack(answer(perf(emu, PerfAttr.CLASS_PORT_INFO, ca_lid))[1])["CapabilityMask"]
    assert cap & PerfCap.IS_EXTENDED_WIDTH_SUPPORTED and not cap & PerfCap.IS_ALL_PORT_SELECT_SUPPORTED
    emu.pma_ext_width[HOST2] = False
    cap = CLASS_PORT_INFO.unpack(answer(perf(emu, PerfAttr.CLASS_PORT_INFO, ca_lid))[1])["CapabilityMask"]
    assert not cap & PerfCap.IS_EXTENDED_WIDTH_SUPPORTED
    assert answer(perf(emu, PerfAttr.PORT_COUNTERS_EXT, ca_lid))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED
    assert answer(perf(emu, PerfAttr.PORT_COUNTERS, ca_lid))[0] == MadStatus.OK
    assert answer(perf(emu, 0x0016, ca_lid))[0] == MadStatus.METHOD_ATTR_UNSUPPORTED  # PortSamplesResult
    set_cpi = perf(emu, PerfAttr.CLASS_PORT_INFO, sw_lid, method=Method.SET, data=bytes(192))
    assert answer(set_cpi)[0] == MadStatus.METHOD_ATTR_UNSUPPORTED


def counters(emu: EmulatedFabric, dlid: int, select: int, ext: bool = False) -> dict[str, int]:
    attr = PerfAttr.PORT_COUNTERS_EXT if ext else PerfAttr.PORT_COUNTERS
    status, data = answer(perf(emu, attr, dlid, select))
    assert status == MadStatus.OK
    return (PORT_COUNTERS_EXT if ext else PORT_COUNTERS).unpack(data)  # type: ignore[return-value]


def test_traffic_counts_words_and_mirrors_the_peer() -> None:
    emu = programmed()
    emu.traffic = ConstantTraffic(bytes_per_s=4000.0, packet_bytes=100, xmit_wait_per_s=3.0)
    emu.advance(2.5)
    sw_lid = int(emu.fabric.lid[LEAF0, 0])
    c = counters(emu, sw_lid, 3)
    assert c["PortXmitData"] == 2500 and c["PortRcvData"] == 2500  # 10,000 bytes = 2,500 words
    assert c["PortXmitPkts"] == 100 and c["PortRcvPkts"] == 100
    assert c["PortXmitWait"] == 7  # 7.5 ticks so far; the half carries over
    emu.advance(0.5)
    assert counters(emu, sw_lid, 3)["PortXmitWait"] == 9
    x = counters(emu, sw_lid, 3, ext=True)
    assert x["PortXmitData"] == 3000 and x["PortUnicastXmitPkts"] == 120 and x["PortMulticastXmitPkts"] == 0
    # a down link carries nothing
    emu.link_down(LEAF0, 4)
    emu.advance(1.0)
    assert counters(emu, sw_lid, 4)["PortXmitData"] == 3000
    assert counters(emu, sw_lid, 3)["PortXmitData"] == 4000
    assert counters(emu, sw_lid, 4)["LinkDownedCounter"] == 1


def test_receive_side_is_the_peers_transmit() -> None:
    class OnePort:
        """Only leaf 0 port 3 (towards spine 0) sends."""

        def rates(self, emu: EmulatedFabric) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            b = np.zeros(emu.fabric.port_exists.shape)
            b[LEAF0, 3] = 800.0
            return b, b / 100.0, np.zeros_like(b)

    emu = programmed()
    emu.traffic = OnePort()
    emu.advance(1.0)
    leaf = counters(emu, int(emu.fabric.lid[LEAF0, 0]), 3)
    spine = counters(emu, int(emu.fabric.lid[SPINE0, 0]), 1)
    assert (leaf["PortXmitData"], leaf["PortRcvData"]) == (200, 0)
    assert (spine["PortXmitData"], spine["PortRcvData"]) == (0, 200)
    assert (spine["PortRcvPkts"], leaf["PortXmitPkts"]) == (8, 8)


def test_counter_saturation_and_clear() -> None:
    emu = programmed()
    sw_lid = int(emu.fabric.lid[LEAF0, 0])
    emu.traffic = ConstantTraffic(bytes_per_s=4.0 * 2**31, packet_bytes=2**20)
    emu.advance(3.0)  # 1.5 * 2**32 words
    c = counters(emu, sw_lid, 3)
    assert c["PortXmitData"] == 0xFFFFFFFF and c["PortRcvData"] == 0xFFFFFFFF
    assert counters(emu, sw_lid, 3, ext=True)["PortXmitData"] == 3 * 2**31
    emu.add_counter(LEAF0, 3, Counter.SYMBOL_ERROR, 70000)
    emu.add_counter(LEAF0, 3, Counter.LINK_DOWNED, 3)
    c = counters(emu, sw_lid, 3)
    assert c["SymbolErrorCounter"] == 0xFFFF and c["LinkDownedCounter"] == 3
    # clear PortXmitData (bit 12) and SymbolErrorCounter (bit 0) only
    req = PORT_COUNTERS.pack({"PortSelect": 3, "CounterSelect": (1 << 12) | 1})
    status, data = answer(perf(emu, PerfAttr.PORT_COUNTERS, sw_lid, method=Method.SET, data=req))
    c = PORT_COUNTERS.unpack(data)
    assert status == MadStatus.OK and c["PortXmitData"] == 0 and c["SymbolErrorCounter"] == 0
    assert c["PortRcvData"] == 0xFFFFFFFF and c["LinkDownedCounter"] == 3
    # the 64-bit view keeps its own count
    assert counters(emu, sw_lid, 3, ext=True)["PortXmitData"] == 3 * 2**31
    emu.advance(1.0)
    assert counters(emu, sw_lid, 3)["PortXmitData"] == 2**31
    # PortXmitWait is cleared through CounterSelect2 bit 0
    emu.add_counter(LEAF0, 3, Counter.XMIT_WAIT, 42)
    assert counters(emu, sw_lid, 3)["PortXmitWait"] == 42
    req = PORT_COUNTERS.pack({"PortSelect": 3, "CounterSelect2": 1})
    assert (
        PORT_COUNTERS.unpack(answer(perf(emu, PerfAttr.PORT_COUNTERS, sw_lid, method=Method.SET, data=req))[1])[
            "PortXmitWait"
        ]
        == 0
    )
    # extended clear: PortXmitData (bit 0) of the 64-bit view
    req = PORT_COUNTERS_EXT.pack({"PortSelect": 3, "CounterSelect": 1})
    x = PORT_COUNTERS_EXT.unpack(answer(perf(emu, PerfAttr.PORT_COUNTERS_EXT, sw_lid, method=Method.SET, data=req))[1])
    assert x["PortXmitData"] == 0 and x["PortRcvData"] == 4 * 2**31


def test_port_select_all_and_invalid() -> None:
    emu = programmed()
    emu.traffic = ConstantTraffic(bytes_per_s=400.0, packet_bytes=100)
    emu.advance(1.0)
    sw_lid, ca_lid = int(emu.fabric.lid[LEAF0, 0]), int(emu.fabric.lid[HOST2, 1])
    assert counters(emu, sw_lid, 0xFF)["PortXmitData"] == 4 * 100
    assert counters(emu, sw_lid, 0xFF, ext=True)["PortXmitPkts"] == 4 * 4
    assert answer(perf(emu, PerfAttr.PORT_COUNTERS, ca_lid, 0xFF))[0] == MadStatus.INVALID_FIELD
    assert answer(perf(emu, PerfAttr.PORT_COUNTERS, sw_lid, 5))[0] == MadStatus.INVALID_FIELD
    assert counters(emu, ca_lid, 1)["PortRcvData"] == 100
    req = PORT_COUNTERS.pack({"PortSelect": 0xFF, "CounterSelect": 0xFFFF})
    answer(perf(emu, PerfAttr.PORT_COUNTERS, sw_lid, method=Method.SET, data=req))
    assert counters(emu, sw_lid, 2)["PortXmitData"] == 0


def test_traffic_source_shape_is_checked() -> None:
    class Bad:
        def rates(self, emu: EmulatedFabric) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            z = np.zeros(3)
            return z, z, z

    emu = EmulatedFabric(small(), traffic=Bad())
    with pytest.raises(EmulatorError, match="shape"):
        emu.advance(1.0)
    with pytest.raises(EmulatorError, match="negative"):
        emu.advance(-1.0)


# -- link events and traps ---------------------------------------------------------------------


def test_link_down_up_states_and_port_state_change() -> None:
    emu = programmed()
    fab = emu.fabric
    emu.link_down(LEAF1, 3)
    for n, p in ((LEAF1, 3), (SPINE0, 2)):
        assert (fab.state[n, p], fab.phys_state[n, p]) == (PortState.DOWN, PhysState.POLLING)
    assert emu.port_state_change[emu.switch_row(LEAF1)] and emu.port_state_change[emu.switch_row(SPINE0)]
    assert not emu.port_state_change[emu.switch_row(LEAF0)]
    pi = port_info(emu, (1, 4, 2), 3)
    assert (pi["PortState"], pi["PortPhysicalState"]) == (PortState.DOWN, PhysState.POLLING)
    emu.port_state_change[:] = False
    emu.link_up(SPINE0, 2)
    for n, p in ((LEAF1, 3), (SPINE0, 2)):
        assert (fab.state[n, p], fab.phys_state[n, p]) == (PortState.INIT, PhysState.LINKUP)
    assert emu.port_state_change[emu.switch_row(LEAF1)]
    emu.link_up(SPINE0, 2)  # already up: nothing happens
    with pytest.raises(EmulatorError, match="no cable"):
        EmulatedFabric(two_port_ca_fabric()).link_down(1, 5)
    with pytest.raises(EmulatorError, match="no such port"):
        emu.link_down(LEAF1, 9)


def test_trap_128_once_lids_and_lfts_allow() -> None:
    emu = EmulatedFabric(small())
    emu.link_down(LEAF1, 3)
    assert not emu.traps and emu.stats.traps_dropped == 2  # no LIDs yet: nothing reaches the SM
    emu = programmed()  # every switch routes the SM's LID over spine 0
    emu.link_down(LEAF1, 4)
    assert len(emu.traps) == 2  # leaf 1 and spine 1 both report
    issuers = set()
    for raw in emu.traps:
        m = parse_mad(raw)
        assert (m.mgmt_class, m.method, m.attr_id) == (MgmtClass.SUBN_LID, Method.TRAP, SmpAttr.NOTICE)
        notice = notice_unpack(m.data)
        assert notice["TrapNumber"] == 128 and notice["IsGeneric"] == 1
        assert notice["LIDADDR"] == notice["IssuerLID"]
        issuers.add(notice["IssuerLID"])
    assert issuers == {int(emu.fabric.lid[LEAF1, 0]), int(emu.fabric.lid[SPINE1, 0])}
    # a switch whose LFT has no route to the SM LID cannot report
    emu.traps.clear()
    emu.lft[emu.switch_row(SPINE1), emu.sm_lid] = 255
    emu.link_up(LEAF1, 4)
    assert [notice_unpack(parse_mad(t).data)["IssuerLID"] for t in emu.traps] == [int(emu.fabric.lid[LEAF1, 0])]
    # nor one whose route to the SM ran over the link that just failed (until the SM reroutes)
    emu.traps.clear()
    emu.link_down(LEAF1, 3)
    assert [notice_unpack(parse_mad(t).data)["IssuerLID"] for t in emu.traps] == [int(emu.fabric.lid[SPINE0, 0])]


def test_remove_and_restore_a_switch() -> None:
    emu = programmed()  # the LFTs lead to the SM over spine 0
    fab = emu.fabric
    spine_lid = int(fab.lid[SPINE1, 0])
    assert get_lid(emu, SmpAttr.NODE_INFO, spine_lid) is not None
    emu.remove_node(SPINE1)
    assert not emu.is_present(SPINE1)
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 4)) is None
    assert get_lid(emu, SmpAttr.NODE_INFO, spine_lid) is None
    assert all(fab.state[leaf, 4] == PortState.DOWN for leaf in range(LEAF0, LEAF0 + 4))
    assert all(emu.port_state_change[emu.switch_row(leaf)] for leaf in range(LEAF0, LEAF0 + 4))
    assert len(emu.traps) == 4  # every leaf reports; the vanished spine does not
    emu.restore_node(SPINE1)
    assert emu.is_present(SPINE1)
    assert get_dr(emu, SmpAttr.NODE_INFO, (1, 4)) is not None
    assert fab.state[LEAF0, 4] == PortState.INIT
    # power cycled: no LID, empty LFT, LinearFDBTop 0
    assert port_info(emu, (1, 4), 0)["LID"] == 0
    assert (emu.lft[emu.switch_row(SPINE1)] == 255).all() and emu.lft_top[emu.switch_row(SPINE1)] == 0
    assert get_lid(emu, SmpAttr.NODE_INFO, spine_lid) is None
    # losing spine 0 cuts every leaf but the SM's own off from the SM: one trap arrives
    emu.traps.clear()
    emu.remove_node(SPINE0)
    assert [notice_unpack(parse_mad(t).data)["IssuerLID"] for t in emu.traps] == [int(fab.lid[LEAF0, 0])]
    with pytest.raises(EmulatorError, match="SM"):
        emu.remove_node(HOST0)


def test_drop_rate_is_seeded() -> None:
    def run(seed: int) -> list[bool]:
        emu = EmulatedFabric(small(), drop_rate=0.5, seed=seed)
        return [get_dr(emu, SmpAttr.NODE_INFO, (1,)) is None for _ in range(400)]

    a = run(3)
    assert a == run(3)
    assert 120 < sum(a) < 280


def test_load_checks_the_attachment() -> None:
    fab = small()
    with pytest.raises(EmulatorError, match="no such port"):
        EmulatedFabric(fab, sm_node=HOST0, sm_port=2)
    with pytest.raises(EmulatorError, match="outside"):
        EmulatedFabric(fab, sm_node=99)
    lp = EmulatedFabric(fab, sm_node=HOST2).local_port
    assert (lp.node, lp.port, lp.port_guid, lp.lid) == (HOST2, 1, int(fab.port_guid[HOST2, 1]), 0)
    # the emulator works on its own copy
    emu = EmulatedFabric(fab)
    emu.link_down(LEAF0, 3)
    assert fab.state[LEAF0, 3] == PortState.INIT
