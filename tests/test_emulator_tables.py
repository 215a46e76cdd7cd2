"""The tables an SM programs, on the emulated fabric: P_KeyTable, SLtoVLMappingTable,
VLArbitrationTable and MulticastForwardingTable, Get and Set through the SMP path."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pytest

from fabric.emulator import (
    CA_PARTITION_CAP,
    DEFAULT_SL2VL,
    MFT_CAP,
    PARTITION_ENFORCEMENT_CAP,
    SWITCH_PARTITION_CAP,
    VLARB_CAP,
    EmulatedFabric,
    EmulatorError,
)
from fabric.generate import fattree
from fabric.mad import (
    NODE_INFO,
    PORT_INFO,
    SWITCH_INFO,
    MadStatus,
    Method,
    PortCap,
    SmpAttr,
    mft_block_pack,
    mft_block_unpack,
    mft_mod,
    pkey_block_pack,
    pkey_block_unpack,
    pkey_table_mod,
    sl2vl_mod,
    sl2vl_pack,
    sl2vl_unpack,
    smp_dr,
    smp_lid,
    vlarb_block_pack,
    vlarb_block_unpack,
    vlarb_mod,
)
from fabric.model import Fabric, FabricBuilder, NodeType
from tests.test_emulator import (
    HOST0,
    LEAF0,
    LEAF1,
    SPINE0,
    answer,
    get_dr,
    programmed,
    set_dr,
    small,
    two_port_ca_fabric,
)
from tests.test_mad import IBSIM_SL2VL, IBSIM_VLARB_HIGH, IBSIM_VLARB_LOW

# fattree(2, 4), SM on host 0 port 1: (1,) reaches leaf 0 on its port 1, (1, 2) host 1 on its
# port 1, (1, 3) spine 0 on its port 1. Leaves have ports 1-4.
HOST1 = 1
TO_LEAF0, TO_HOST1, TO_SPINE0 = (1,), (1, 2), (1, 3)

OK = MadStatus.OK
INVALID = MadStatus.INVALID_FIELD
UNSUPPORTED = MadStatus.METHOD_ATTR_UNSUPPORTED


def get(emu: EmulatedFabric, attr: int, path: tuple[int, ...], mod: int) -> tuple[int, bytes]:
    return answer(get_dr(emu, attr, path, mod))


def put(emu: EmulatedFabric, attr: int, path: tuple[int, ...], mod: int, data: bytes) -> tuple[int, bytes]:
    return answer(set_dr(emu, attr, path, data, mod))


def big_switch() -> Fabric:
    """A 36-port switch with a CA on port 1 (the SM) and one on port 36: MFT positions 0-2."""
    b = FabricBuilder()
    sm = b.add_node(NodeType.CA, 1, "sm")
    sw = b.add_node(NodeType.SWITCH, 36, "sw")
    far = b.add_node(NodeType.CA, 1, "far")
    b.connect(sm, 1, sw, 1)
    b.connect(far, 1, sw, 36)
    return b.build()


# -- P_KeyTable ----------------------------------------------------------------------------------


def test_pkey_defaults_and_sizes_from_partition_caps() -> None:
    emu = EmulatedFabric(small())
    # A CA port: NodeInfo.PartitionCap (64) P_Keys, 0xFFFF at index 0, as ibsim
    assert NODE_INFO.unpack(get(emu, SmpAttr.NODE_INFO, TO_HOST1, 0)[1])["PartitionCap"] == CA_PARTITION_CAP == 64
    status, data = get(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(0))
    assert status == OK and pkey_block_unpack(data).tolist() == [0xFFFF] + [0] * 31
    status, data = get(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(1))
    assert status == OK and data == bytes(64)
    assert get(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(2))[0] == INVALID
    assert get(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(0xFFFF))[0] == INVALID
    table = emu.pkey_table(HOST1, 1)
    assert table.dtype == np.uint16 and table.shape == (64,) and table[0] == 0xFFFF and not table[1:].any()
    # Switch port 0: the switch's NodeInfo.PartitionCap (8); the rest of the block reads 0
    assert NODE_INFO.unpack(get(emu, SmpAttr.NODE_INFO, TO_LEAF0, 0)[1])["PartitionCap"] == SWITCH_PARTITION_CAP == 8
    status, data = get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(0, 0))
    assert status == OK and pkey_block_unpack(data).tolist() == [0xFFFF] + [0] * 31
    assert get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(1, 0))[0] == INVALID
    assert emu.pkey_table(LEAF0, 0).tolist() == [0xFFFF] + [0] * 7
    # External ports: SwitchInfo.PartitionEnforcementCap (64, ibsim's) each
    si = SWITCH_INFO.unpack(get(emu, SmpAttr.SWITCH_INFO, TO_LEAF0, 0)[1])
    assert si["PartitionEnforcementCap"] == PARTITION_ENFORCEMENT_CAP == 64
    for port in (1, 4):
        status, data = get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(1, port))
        assert status == OK and data == bytes(64)
        assert get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(2, port))[0] == INVALID
        assert emu.pkey_table(LEAF0, port).shape == (64,)
    assert get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(0, 5))[0] == INVALID  # no port 5
    # With no enforcement cap, the external ports hold no table at all
    emu = EmulatedFabric(small(), partition_enforcement_cap=0)
    assert get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(0, 1))[0] == INVALID
    assert emu.pkey_table(LEAF0, 1).shape == (0,)


def test_pkey_sizes_follow_other_caps_and_partial_blocks() -> None:
    emu = EmulatedFabric(small(), partition_cap=40, switch_partition_cap=1, partition_enforcement_cap=64)
    assert NODE_INFO.unpack(get(emu, SmpAttr.NODE_INFO, TO_HOST1, 0)[1])["PartitionCap"] == 40
    assert NODE_INFO.unpack(get(emu, SmpAttr.NODE_INFO, TO_LEAF0, 0)[1])["PartitionCap"] == 1
    assert SWITCH_INFO.unpack(get(emu, SmpAttr.SWITCH_INFO, TO_LEAF0, 0)[1])["PartitionEnforcementCap"] == 64
    # An external switch port holds 64: blocks 0 and 1
    status, data = get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(0, 3))
    assert status == OK and pkey_block_unpack(data).tolist() == [0xFFFF] + [0] * 31
    assert get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(1, 3))[0] == OK
    assert get(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(2, 3))[0] == INVALID
    assert emu.pkey_table(LEAF0, 3).shape == (64,)
    # Port 0 holds one P_Key: a Set keeps the first and answers the rest as 0
    keys = list(range(0x8001, 0x8001 + 32))
    status, data = put(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(0, 0), pkey_block_pack(keys))
    assert status == OK and pkey_block_unpack(data).tolist() == [0x8001] + [0] * 31
    assert emu.pkey_table(LEAF0, 0).tolist() == [0x8001]
    # A CA port holds 40: block 1 keeps 8 of the 32 P_Keys sent
    status, data = put(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(1), pkey_block_pack(keys))
    assert status == OK and pkey_block_unpack(data).tolist() == keys[:8] + [0] * 24
    assert emu.pkey_table(HOST1, 1).tolist() == [0xFFFF] + [0] * 31 + keys[:8]
    assert get(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(2))[0] == INVALID
    # ...and a Set beyond the table changes nothing
    status, _ = put(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(2), pkey_block_pack(keys))
    assert status == INVALID and emu.pkey_table(HOST1, 1).tolist() == [0xFFFF] + [0] * 31 + keys[:8]


def test_pkey_set_round_trip_over_directed_route_and_lid() -> None:
    emu = programmed()
    keys = [0xFFFF, 0x8001, 0x0002, *range(0x8100, 0x8100 + 29)]
    status, data = put(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(1), pkey_block_pack(keys))
    assert status == OK and pkey_block_unpack(data).tolist() == keys  # the table as it now holds
    assert emu.pkey_table(HOST1, 1)[32:64].tolist() == keys
    assert emu.pkey_table(HOST1, 1)[:32].tolist() == [0xFFFF] + [0] * 31  # block 0 untouched
    # LID routed: the same handler, the same table
    lid = int(emu.fabric.lid[HOST1, 1])
    reply = answer(emu.process(smp_lid(Method.GET, SmpAttr.PKEY_TABLE, pkey_table_mod(1), 5), lid))
    assert reply == (OK, pkey_block_pack(keys))
    new = [0x8005] * 32
    reply = answer(
        emu.process(smp_lid(Method.SET, SmpAttr.PKEY_TABLE, pkey_table_mod(0), 6, pkey_block_pack(new)), lid)
    )
    assert reply == (OK, pkey_block_pack(new)) and emu.pkey_table(HOST1, 1)[:32].tolist() == new


def test_a_ca_answers_for_the_port_the_smp_arrived_on() -> None:
    fab = two_port_ca_fabric()
    emu = EmulatedFabric(fab, sm_node=0, sm_port=1)
    to_port2 = (1, 2)  # out of the CA's port 1, back in through its port 2
    # P_KeyTable: the port bits (here 1) are ignored, as by ibsim
    status, _ = put(emu, SmpAttr.PKEY_TABLE, to_port2, pkey_table_mod(0, 1), pkey_block_pack([0x8002]))
    assert status == OK
    assert emu.pkey_table(0, 2).tolist()[:2] == [0x8002, 0] and emu.pkey_table(0, 1)[0] == 0xFFFF
    assert pkey_block_unpack(get(emu, SmpAttr.PKEY_TABLE, (), 0)[1])[0] == 0xFFFF  # 0 hops: port 1
    # SLtoVLMappingTable: one table a port, whatever the modifier says
    vls = [1] * 16
    assert put(emu, SmpAttr.SL2VL_TABLE, to_port2, sl2vl_mod(1, 1), sl2vl_pack(vls)) == (
        OK,
        sl2vl_pack(vls).ljust(64, b"\0"),
    )
    assert emu.sl2vl(0, 0, 2).tolist() == vls and emu.sl2vl(0, 0, 1).tobytes() == sl2vl_unpack(DEFAULT_SL2VL).tobytes()
    # VLArbitrationTable likewise
    status, _ = put(emu, SmpAttr.VLARB_TABLE, to_port2, vlarb_mod(1, 1), vlarb_block_pack([(3, 9)]))
    assert status == OK and emu.vlarb(0, 2, 1)[0].tolist() == [3, 9] and emu.vlarb(0, 1, 1)[0].tolist() == [0, 0]
    # ... and a CA has no MulticastForwardingTable
    assert get(emu, SmpAttr.MFT, to_port2, mft_mod(0))[0] == UNSUPPORTED


# -- SLtoVLMappingTable ------------------------------------------------------------------------------


def test_sl2vl_defaults_are_ibsims() -> None:
    emu = EmulatedFabric(small())
    assert DEFAULT_SL2VL == IBSIM_SL2VL
    status, data = get(emu, SmpAttr.SL2VL_TABLE, TO_HOST1, sl2vl_mod())
    assert status == OK and data[:8] == IBSIM_SL2VL and not any(data[8:])
    assert emu.sl2vl(HOST1, 0, 1).tolist() == [*range(15), 7]
    for i in range(5):  # every (in, out) pair of a 4-port leaf, port 0 included
        for o in range(5):
            assert get(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, sl2vl_mod(i, o)) == (OK, IBSIM_SL2VL.ljust(64, b"\0"))
            assert emu.sl2vl(LEAF0, i, o).tolist() == [*range(15), 7]
    assert get(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, sl2vl_mod(5, 0))[0] == INVALID
    assert get(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, sl2vl_mod(0, 5))[0] == INVALID
    # optimized programming (all input / all output ports, bits 16-17) is not offered in SwitchInfo
    assert SWITCH_INFO.unpack(get(emu, SmpAttr.SWITCH_INFO, TO_LEAF0, 0)[1])["OptimizedSLtoVLMappingProgramming"] == 0
    assert get(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, 0x30000)[0] == INVALID
    caps = int(PORT_INFO.unpack(get(emu, SmpAttr.PORT_INFO, TO_LEAF0, 1)[1])["CapabilityMask"])
    assert caps & PortCap.IS_SL_MAPPING_SUPPORTED


def test_sl2vl_set_is_per_port_pair() -> None:
    emu = EmulatedFabric(small())
    vls = [15 - sl for sl in range(16)]
    status, data = put(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, sl2vl_mod(2, 3), sl2vl_pack(vls))
    assert status == OK and sl2vl_unpack(data).tolist() == vls
    assert emu.sl2vl(LEAF0, 2, 3).tolist() == vls
    for i, o in ((3, 2), (2, 4), (1, 3), (0, 0)):
        assert emu.sl2vl(LEAF0, i, o).tolist() == [*range(15), 7]
        assert get(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, sl2vl_mod(i, o))[1][:8] == IBSIM_SL2VL
    assert get(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, sl2vl_mod(2, 3))[1][:8] == sl2vl_pack(vls)
    assert emu.sl2vl(SPINE0, 2, 3).tolist() == [*range(15), 7]  # another switch's tables are its own
    status, data = put(emu, SmpAttr.SL2VL_TABLE, TO_HOST1, 0, bytes(8))
    assert status == OK and data == bytes(64) and not emu.sl2vl(HOST1, 0, 1).any()
    # a Set refused for its modifier changes nothing
    assert put(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, sl2vl_mod(2, 9), bytes(8))[0] == INVALID
    assert emu.sl2vl(LEAF0, 2, 3).tolist() == vls


# -- VLArbitrationTable --------------------------------------------------------------------------------


def test_vlarb_defaults_are_ibsims_and_blocks_follow_the_caps() -> None:
    emu = EmulatedFabric(small())
    pi = PORT_INFO.unpack(get(emu, SmpAttr.PORT_INFO, TO_LEAF0, 3)[1])
    assert pi["VLArbitrationLowCap"] == pi["VLArbitrationHighCap"] == VLARB_CAP == 8
    for path, port in ((TO_HOST1, 0), (TO_LEAF0, 0), (TO_LEAF0, 3), (TO_SPINE0, 2)):
        assert get(emu, SmpAttr.VLARB_TABLE, path, vlarb_mod(1, port)) == (OK, IBSIM_VLARB_LOW)
        assert get(emu, SmpAttr.VLARB_TABLE, path, vlarb_mod(3, port)) == (OK, IBSIM_VLARB_HIGH)
        # blocks 2 and 4 (entries 32-63) lie beyond a cap of 8, blocks 0 and 5 do not exist
        for block in (0, 2, 4, 5, 0xFFFF):
            assert get(emu, SmpAttr.VLARB_TABLE, path, block << 16 | port)[0] == INVALID
    assert get(emu, SmpAttr.VLARB_TABLE, TO_LEAF0, vlarb_mod(1, 5))[0] == INVALID  # no port 5
    assert np.array_equal(emu.vlarb(HOST1, 1, 1), vlarb_block_unpack(IBSIM_VLARB_LOW))
    assert np.array_equal(emu.vlarb(LEAF0, 4, 3), vlarb_block_unpack(IBSIM_VLARB_HIGH))


def test_vlarb_set_keeps_the_caps_entries_and_drops_reserved_bits() -> None:
    emu = EmulatedFabric(small())
    entries = [(i % 15, 10 + i) for i in range(32)]
    raw = bytearray(vlarb_block_pack(entries))
    raw[0::2] = bytes(b | 0xF0 for b in raw[0::2])  # reserved bits above each VL set
    status, data = put(emu, SmpAttr.VLARB_TABLE, TO_LEAF0, vlarb_mod(3, 2), bytes(raw))
    kept = vlarb_block_pack(entries[:VLARB_CAP])
    assert status == OK and data == kept  # 8 entries, reserved bits clear, the rest 0
    assert emu.vlarb(LEAF0, 2, 3).tolist() == [list(e) for e in entries[:8]] + [[0, 0]] * 24
    assert get(emu, SmpAttr.VLARB_TABLE, TO_LEAF0, vlarb_mod(3, 2)) == (OK, kept)
    assert get(emu, SmpAttr.VLARB_TABLE, TO_LEAF0, vlarb_mod(1, 2)) == (OK, IBSIM_VLARB_LOW)  # low untouched
    assert get(emu, SmpAttr.VLARB_TABLE, TO_LEAF0, vlarb_mod(3, 1)) == (OK, IBSIM_VLARB_HIGH)  # other port
    # LID routed too
    emu = programmed()
    lid = int(emu.fabric.lid[LEAF1, 0])
    mad = smp_lid(Method.SET, SmpAttr.VLARB_TABLE, vlarb_mod(1, 4), 8, vlarb_block_pack([(1, 1)] * 8))
    assert answer(emu.process(mad, lid)) == (OK, vlarb_block_pack([(1, 1)] * 8))
    assert emu.vlarb(LEAF1, 4, 1)[:8].tolist() == [[1, 1]] * 8


# -- MulticastForwardingTable ----------------------------------------------------------------------


def test_mft_defaults_sizes_and_positions() -> None:
    fab = big_switch()
    emu = EmulatedFabric(fab, sm_node=0)
    si = SWITCH_INFO.unpack(get(emu, SmpAttr.SWITCH_INFO, (1,), 0)[1])
    assert si["MulticastFDBCap"] == MFT_CAP == 1024
    mft = emu.mft(1)
    assert mft.dtype == np.uint16 and mft.shape == (1024, 3) and not mft.any()  # ports 0-36: 3 positions
    for mod in (mft_mod(0), mft_mod(31, 2), mft_mod(17, 1)):
        assert get(emu, SmpAttr.MFT, (1,), mod) == (OK, bytes(64))
    assert get(emu, SmpAttr.MFT, (1,), mft_mod(32))[0] == INVALID  # 1024 MLIDs: blocks 0..31
    assert get(emu, SmpAttr.MFT, (1,), mft_mod(0, 3))[0] == INVALID  # no ports 48-63
    assert get(emu, SmpAttr.MFT, (1,), mft_mod(511, 15))[0] == INVALID
    assert emu.mft(1).shape == (1024, 3)
    # a CA has none: the attribute is not supported there, and the accessor says so
    assert get(emu, SmpAttr.MFT, (), mft_mod(0))[0] == UNSUPPORTED
    assert put(emu, SmpAttr.MFT, (), mft_mod(0), bytes(64))[0] == UNSUPPORTED
    with pytest.raises(EmulatorError, match="not a switch"):
        emu.mft(0)
    # a 4-port switch has one position
    small_emu = EmulatedFabric(small())
    assert small_emu.mft(LEAF0).shape == (1024, 1)
    assert get(small_emu, SmpAttr.MFT, TO_LEAF0, mft_mod(0, 1))[0] == INVALID


def test_mft_set_round_trip() -> None:
    emu = EmulatedFabric(big_switch(), sm_node=0)
    masks = [(1 << (i % 16)) | 0x0001 for i in range(32)]
    status, data = put(emu, SmpAttr.MFT, (1,), mft_mod(5, 2), mft_block_pack(masks))
    assert status == OK and mft_block_unpack(data).tolist() == masks
    mft = emu.mft(1)
    assert mft[160:192, 2].tolist() == masks  # MLIDs 0xC0A0..0xC0BF, ports 32-47
    assert not mft[:, :2].any() and not mft[:160].any() and not mft[192:].any()
    assert get(emu, SmpAttr.MFT, (1,), mft_mod(5, 2)) == (OK, mft_block_pack(masks))
    assert get(emu, SmpAttr.MFT, (1,), mft_mod(5, 1)) == (OK, bytes(64))
    # LID routed, on the switches of a programmed fabric
    emu = programmed()
    lid = int(emu.fabric.lid[SPINE0, 0])
    mad = smp_lid(Method.SET, SmpAttr.MFT, mft_mod(31), 4, mft_block_pack([0x1E] * 32))
    assert answer(emu.process(mad, lid)) == (OK, mft_block_pack([0x1E] * 32))
    assert emu.mft(SPINE0)[992:, 0].tolist() == [0x1E] * 32 and not emu.mft(LEAF0).any()


def test_mft_size_from_multicast_fdb_cap() -> None:
    emu = EmulatedFabric(small(), mft_cap=100)
    assert SWITCH_INFO.unpack(get(emu, SmpAttr.SWITCH_INFO, TO_LEAF0, 0)[1])["MulticastFDBCap"] == 100
    assert emu.mft(LEAF0).shape == (100, 1)
    # block 3 holds MLIDs 96..99 only: a Set keeps 4 PortMasks
    status, data = put(emu, SmpAttr.MFT, TO_LEAF0, mft_mod(3), mft_block_pack([7] * 32))
    assert status == OK and mft_block_unpack(data).tolist() == [7] * 4 + [0] * 28
    assert emu.mft(LEAF0)[96:].tolist() == [[7]] * 4
    assert get(emu, SmpAttr.MFT, TO_LEAF0, mft_mod(4))[0] == INVALID
    none = EmulatedFabric(small(), mft_cap=0)
    assert get(none, SmpAttr.MFT, TO_LEAF0, mft_mod(0))[0] == INVALID and none.mft(LEAF0).shape == (0, 1)


# -- any modifier, any data: an answer, never an exception -------------------------------------------


@pytest.mark.parametrize(
    "attr", [SmpAttr.PKEY_TABLE, SmpAttr.SL2VL_TABLE, SmpAttr.VLARB_TABLE, SmpAttr.MFT], ids=lambda a: a.name
)
def test_any_modifier_gets_a_status(attr: SmpAttr) -> None:
    emu = EmulatedFabric(small(), partition_enforcement_cap=32, mft_cap=64)
    rng = random.Random(int(attr))
    edges = [0, 1, 2, 3, 4, 5, 0xFF, 0x100, 0x1FF, 0x200, 0xFFFF, 0x10000, 0x30000, 0x40000, 0x50000]
    edges += [0x0FFFFFFF, 0x10000000, 0x20000000, 0xF0000000, 0xFFFFFFFF]
    mods = edges + [rng.getrandbits(32) for _ in range(200)] + [rng.getrandbits(20) for _ in range(100)]
    seen: set[int] = set()
    for path in ((), TO_LEAF0, TO_SPINE0, TO_HOST1):
        for mod in mods:
            for method in (Method.GET, Method.SET):
                data = rng.randbytes(64)
                status, got = answer(emu.process(smp_dr(method, attr, mod, 1, path, data)))
                assert status in (OK, INVALID, UNSUPPORTED), (path, hex(mod), status)
                seen.add(status)
                if status == OK:  # a Set answers with what the device now holds
                    assert get(emu, attr, path, mod) == (OK, got), (path, hex(mod))
                else:  # a refused MAD comes back with its data, and changes nothing a Get can see
                    assert got == data
    assert OK in seen and INVALID in seen


# -- reset, accessors, caps ---------------------------------------------------------------------------


def test_power_cycle_resets_the_tables() -> None:
    emu = EmulatedFabric(small(), partition_enforcement_cap=32)
    put(emu, SmpAttr.PKEY_TABLE, TO_LEAF0, pkey_table_mod(0, 3), pkey_block_pack([0x8001] * 32))
    put(emu, SmpAttr.SL2VL_TABLE, TO_LEAF0, sl2vl_mod(1, 2), bytes(8))
    put(emu, SmpAttr.VLARB_TABLE, TO_LEAF0, vlarb_mod(1, 2), bytes(64))
    put(emu, SmpAttr.MFT, TO_LEAF0, mft_mod(0), mft_block_pack([3] * 32))
    put(emu, SmpAttr.MFT, TO_SPINE0, mft_mod(0), mft_block_pack([5] * 32))
    put(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(0), pkey_block_pack([0x8009]))

    emu.remove_node(LEAF0)
    emu.restore_node(LEAF0, reset=False)  # a link flap: the tables stay
    assert emu.pkey_table(LEAF0, 3).tolist() == [0x8001] * 32 and emu.mft(LEAF0)[0, 0] == 3
    emu.remove_node(LEAF0)
    emu.restore_node(LEAF0)  # a power cycle: back to the defaults
    assert emu.pkey_table(LEAF0, 3).tolist() == [0xFFFF] + [0] * 31
    assert emu.pkey_table(LEAF0, 0).tolist() == [0xFFFF] + [0] * 7
    assert emu.sl2vl(LEAF0, 1, 2).tolist() == [*range(15), 7]
    assert np.array_equal(emu.vlarb(LEAF0, 2, 1), vlarb_block_unpack(IBSIM_VLARB_LOW))
    assert not emu.mft(LEAF0).any()
    # other nodes keep theirs
    assert emu.mft(SPINE0)[:32, 0].tolist() == [5] * 32 and emu.pkey_table(HOST1, 1)[0] == 0x8009
    assert emu.pkey_table(LEAF1, 3)[0] == 0xFFFF and emu.pkey_table(SPINE0, 1).shape == (32,)


def test_accessors_are_live_read_only_views_or_copies() -> None:
    emu = EmulatedFabric(small())
    pkeys, mft = emu.pkey_table(HOST1, 1), emu.mft(LEAF0)
    for view in (pkeys, mft):
        with pytest.raises(ValueError, match="read-only"):
            view[0] = 1
    put(emu, SmpAttr.PKEY_TABLE, TO_HOST1, pkey_table_mod(0), pkey_block_pack([0x8003]))
    put(emu, SmpAttr.MFT, TO_LEAF0, mft_mod(0), mft_block_pack([9]))
    assert pkeys[0] == 0x8003 and mft[0, 0] == 9  # the views follow the devices
    vls, arb = emu.sl2vl(LEAF0, 1, 1), emu.vlarb(LEAF0, 1, 1)
    vls[:] = 0
    arb[:] = 0
    assert emu.sl2vl(LEAF0, 1, 1).tolist() == [*range(15), 7]  # copies: the device is unchanged
    assert np.array_equal(emu.vlarb(LEAF0, 1, 1), vlarb_block_unpack(IBSIM_VLARB_LOW))
    for bad in (
        lambda: emu.pkey_table(HOST0, 0),  # a CA has no port 0
        lambda: emu.pkey_table(LEAF0, 5),
        lambda: emu.pkey_table(99, 1),
        lambda: emu.sl2vl(HOST1, 1, 1),  # a CA's table is (in 0, out its port)
        lambda: emu.sl2vl(HOST1, 0, 0),
        lambda: emu.sl2vl(LEAF0, 5, 0),
        lambda: emu.vlarb(LEAF0, 1, 2),  # beyond the cap
        lambda: emu.vlarb(LEAF0, 1, 0),
        lambda: emu.mft(99),
    ):
        with pytest.raises(EmulatorError):
            bad()


@pytest.mark.parametrize(
    "build",
    [
        lambda f: EmulatedFabric(f, mft_cap=-1),
        lambda f: EmulatedFabric(f, mft_cap=0x4001),
        lambda f: EmulatedFabric(f, partition_cap=0),
        lambda f: EmulatedFabric(f, switch_partition_cap=0x10000),
        lambda f: EmulatedFabric(f, partition_enforcement_cap=-1),
    ],
)
def test_caps_are_checked(build: Callable[[Fabric], EmulatedFabric]) -> None:
    with pytest.raises(EmulatorError, match="outside"):
        build(small())


@pytest.mark.slow
def test_tables_stay_small_on_the_k36_fat_tree() -> None:
    """1,620 36-port switches and 11,664 hosts: the four tables take tens of MB, not GB."""
    emu = EmulatedFabric(fattree(3, 36))
    f = emu.fabric
    sw, host = int(f.switches[0]), int(f.cas[0])
    assert emu.mft(sw).shape == (MFT_CAP, 3) and emu.pkey_table(host, 1).shape == (CA_PARTITION_CAP,)
    assert emu.pkey_table(sw, 0).shape == (SWITCH_PARTITION_CAP,)
    assert emu.pkey_table(sw, 36).shape == (PARTITION_ENFORCEMENT_CAP,)
    held = sum(a.nbytes for a in (emu._pkeys, emu._sl2vl, emu._vlarb, emu._mft, emu._port_ix, emu._pkey_off))
    assert held < 48e6, held
    # every switch answers for its last port pair and MLID block
    for node in (sw, int(f.switches[-1])):
        assert emu.sl2vl(node, 36, 36).tolist() == [*range(15), 7]
        assert not emu.mft(node)[-32:].any()
