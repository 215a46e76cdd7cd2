"""Traffic for the emulated fabric: the congestion model's predicted rates, on the emulator's clock.

``ibfm serve`` on the emulated fabric (``make demo``) shows counters that
move: :class:`PredictedTraffic` is a :class:`~fabric.emulator.TrafficSource`
fed with the per-port rates the congestion model predicts for a pattern on
the current routes, and :class:`TrafficClock` lets that traffic flow up to
the present each time someone reads the counters. The prediction itself is
made by the SM's analyses (``sm.analysis.flowmodel``) and handed in.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from fabric.emulator import EmulatedFabric
from fabric.model import MTU_BYTES, Fabric

XMIT_WAIT_TICK_HZ = 1e8
"""XmitWait ticks per second of waiting, for predictions and the emulated counters they drive.

PortXmitWait is a 32-bit counter; at one tick per 4-byte word a blocked 4x NDR port would wrap it in
0.35 s, faster than any counter sweep. At 1e8 ticks/s it takes 43 s, so the perf manager's clear at
75% keeps up with a 10 s sweep interval.
"""


class PredictedTraffic:
    """The emulated fabric's traffic: the congestion model's per-port rates for a pattern on the current routes.

    :meth:`update` takes a :class:`~sm.analysis.flowmodel.CongestionReport` made on the
    SM's snapshot and maps its ``[node, port]`` rates onto the emulator's own
    fabric by node GUID (the two number nodes differently). Idle until the
    first prediction.
    """

    def __init__(self, emu_fabric: Fabric) -> None:
        shape = emu_fabric.port_exists.shape
        self._guids = emu_fabric.node_guid
        self._bytes: npt.NDArray[np.float64] = np.zeros(shape)
        self._pkts: npt.NDArray[np.float64] = np.zeros(shape)
        self._wait: npt.NDArray[np.float64] = np.zeros(shape)

    def update(self, report: Any) -> None:
        f = report.fabric
        index = {int(g): i for i, g in enumerate(f.node_guid.tolist())}
        nmap = np.array([index.get(int(g), -1) for g in self._guids.tolist()], np.int64)
        ok = np.flatnonzero(nmap >= 0)
        width = min(self._bytes.shape[1], f.port_exists.shape[1])
        size = np.full(f.port_exists.shape, 4096.0)
        for code, nbytes in MTU_BYTES.items():
            size[f.mtu_active == code] = nbytes
        b, w = np.zeros_like(self._bytes), np.zeros_like(self._wait)
        b[ok, :width] = report.xmit_bytes[nmap[ok], :width]
        w[ok, :width] = report.xmit_wait[nmap[ok], :width]
        pk = np.zeros_like(b)
        pk[ok, :width] = b[ok, :width] / size[nmap[ok], :width]
        self._bytes, self._pkts, self._wait = b, pk, w

    def rates(
        self, emu: EmulatedFabric
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        return self._bytes, self._pkts, self._wait


class TrafficClock:
    """Advances an emulated fabric's traffic to the present of a monotonic clock (the event loop's time)."""

    def __init__(self, emu: EmulatedFabric) -> None:
        self.emu = emu
        self._last: float | None = None

    def advance_to(self, now: float) -> None:
        """Let the traffic flow from the last call up to ``now`` (the first call only starts the clock)."""
        if self._last is not None and now > self._last:
            self.emu.advance(now - self._last)
        self._last = now
