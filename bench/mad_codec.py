"""Micro-benchmark of the MAD codec: pack/unpack rates of NodeInfo and PortInfo, and MAD headers.

Run: .venv/bin/python bench/mad_codec.py [seconds-per-case]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from fabric.mad import (
    NODE_INFO,
    PORT_INFO,
    Method,
    SmpAttr,
    make_response,
    parse_mad,
    smp_dr,
)

NODE_INFO_VALUES = {
    "BaseVersion": 1,
    "ClassVersion": 1,
    "NodeType": 2,
    "NumPorts": 36,
    "SystemImageGUID": 0x0002C90300A1B2C3,
    "NodeGUID": 0x0002C90300A1B2C3,
    "PortGUID": 0x0002C90300A1B2C3,
    "PartitionCap": 8,
    "DeviceID": 0xC738,
    "Revision": 0xA1,
    "LocalPortNum": 0,
    "VendorID": 0x02C9,
}

PORT_INFO_VALUES = {
    "GIDPrefix": 0xFE80000000000000,
    "LID": 0x1234,
    "MasterSMLID": 1,
    "CapabilityMask": 0x2251086A,
    "LocalPortNum": 7,
    "LinkWidthEnabled": 3,
    "LinkWidthSupported": 3,
    "LinkWidthActive": 2,
    "LinkSpeedSupported": 7,
    "PortState": 4,
    "PortPhysicalState": 5,
    "LinkDownDefaultState": 2,
    "LinkSpeedActive": 4,
    "LinkSpeedEnabled": 7,
    "NeighborMTU": 5,
    "VLCap": 4,
    "VLHighLimit": 4,
    "VLArbitrationHighCap": 8,
    "VLArbitrationLowCap": 8,
    "MTUCap": 5,
    "HOQLife": 16,
    "OperationalVLs": 4,
    "GUIDCap": 8,
    "SubnetTimeOut": 18,
    "RespTimeValue": 16,
    "CapabilityMask2": 0x4,
    "LinkSpeedExtActive": 2,
    "LinkSpeedExtSupported": 3,
    "LinkSpeedExtEnabled": 3,
}


def rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of ``fn`` over about ``seconds``."""
    n = 1000
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt
        n = int(n * max(2.0, 1.2 * seconds / max(dt, 1e-6)))


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    ni = NODE_INFO.pack(NODE_INFO_VALUES)
    pi = PORT_INFO.pack(PORT_INFO_VALUES)
    req = smp_dr(Method.GET, SmpAttr.PORT_INFO, 7, 0x1234, [1, 3, 5, 7])
    cases: list[tuple[str, Callable[[], object]]] = [
        ("NodeInfo unpack", lambda: NODE_INFO.unpack(ni)),
        ("NodeInfo pack (all fields)", lambda: NODE_INFO.pack(NODE_INFO_VALUES)),
        ("PortInfo unpack", lambda: PORT_INFO.unpack(pi)),
        ("PortInfo pack (29 fields)", lambda: PORT_INFO.pack(PORT_INFO_VALUES)),
        ("PortInfo pack 2 fields on base", lambda: PORT_INFO.pack({"PortState": 2, "LID": 9}, base=pi)),
        ("PortInfo get LID", lambda: PORT_INFO.get(pi, "LID")),
        ("smp_dr build (4 hops)", lambda: smp_dr(Method.GET, SmpAttr.PORT_INFO, 7, 0x1234, [1, 3, 5, 7])),
        ("parse_mad (DR)", lambda: parse_mad(req)),
        ("make_response (DR)", lambda: make_response(req, pi, return_path=[1, 2, 3, 4])),
    ]
    for name, fn in cases:
        print(f"{name:34s} {rate(fn, seconds):12,.0f} ops/s")


if __name__ == "__main__":
    main()
