"""The in-process transport: MADs go to an :class:`~fabric.emulator.EmulatedFabric`.

The emulator answers synchronously; the answer is delivered on the next turn of
the event loop, as a device's receive completion would be, and a MAD the
emulator drops never answers, so the window, timeout and retry logic of
:class:`~sm.transport.base.WindowedTransport` run exactly as on a real port.
Traps the emulator queues reach the transport's trap queue.
"""

from __future__ import annotations

import asyncio

from fabric.emulator import EmulatedFabric, LocalPort
from sm.transport.base import Route, TransportError, WindowedTransport


class EmulatedTransport(WindowedTransport):
    """A :class:`WindowedTransport` whose wire is an emulated fabric.

    ``route`` is a directed-route path (the DR SMP carries it in its InitialPath)
    or the destination LID of a LID-routed SMP or PerfMgt MAD.
    """

    def __init__(self, emu: EmulatedFabric, *, window: int = 64, timeout: float = 0.05, retries: int = 2) -> None:
        super().__init__(window=window, timeout=timeout, retries=retries)
        self.emu = emu
        self._loop: asyncio.AbstractEventLoop | None = None
        emu.on_trap = self._trap_ready

    @property
    def local_port(self) -> LocalPort:
        """The SM's own node and port: GUIDs, port number, current LID."""
        return self.emu.local_port

    def _post(self, mad: bytes, route: Route) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        if isinstance(route, tuple | list):
            reply = self.emu.process(mad)
        elif isinstance(route, int):
            reply = self.emu.process(mad, route)
        else:
            raise TransportError(f"route {route!r} is neither a DR path nor a LID")
        if reply is not None:
            loop.call_soon(self._deliver, reply)
        self._drain_traps()

    def _trap_ready(self) -> None:
        """The emulator queued a trap: move it to the trap queue on the loop's next turn."""
        loop: asyncio.AbstractEventLoop | None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop
        if loop is None or loop.is_closed():
            return  # drained on the next post, next_trap or pending_traps
        loop.call_soon(self._drain_traps)

    def _drain_traps(self) -> None:
        traps = self.emu.traps
        while traps:
            self._unsolicited(traps.popleft())

    async def next_trap(self, timeout: float | None = None) -> bytes | None:
        self._drain_traps()
        return await super().next_trap(timeout)

    def pending_traps(self) -> list[bytes]:
        self._drain_traps()
        return super().pending_traps()

    async def _close(self) -> None:
        if self.emu.on_trap == self._trap_ready:
            self.emu.on_trap = None
