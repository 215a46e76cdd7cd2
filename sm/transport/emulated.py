"""The in-process transport: MADs go to an :class:`~fabric.emulator.EmulatedFabric`.

The emulator answers synchronously; the answer is delivered on the next turn of
the event loop, as a device's receive completion would be, and a MAD the
emulator drops never answers, so the window, timeout and retry logic of
:class:`~sm.transport.base.WindowedTransport` run exactly as on a real port.
Traps the emulator queues reach the transport's trap queue.

A transport speaks from one :class:`~fabric.emulator.Endpoint` (by default
the SM's own port); more transports on other endpoints are other hosts or
other SMs of the same fabric. Requests addressed to its port that the
devices do not answer (SMInfo, SA queries) reach the transport's service
(:meth:`serve`), whose answers go back through the emulator.
"""

from __future__ import annotations

import asyncio
import contextlib

from fabric.emulator import EmulatedFabric, Endpoint, LocalPort
from sm.transport.base import MAX_BACKLOG, MadAddress, Route, TransportError, WindowedTransport, refusal

_SMP_CLASSES = (0x01, 0x81)
_GSI_QKEY = 0x80010000


class EmulatedTransport(WindowedTransport):
    """A :class:`WindowedTransport` whose wire is an emulated fabric.

    ``route`` is a directed-route path (the DR SMP carries it in its InitialPath)
    or the destination LID of a LID-routed SMP or PerfMgt MAD.
    """

    def __init__(
        self,
        emu: EmulatedFabric,
        *,
        window: int = 64,
        timeout: float = 0.05,
        retries: int = 2,
        endpoint: Endpoint | None = None,
        issm: bool = False,
    ) -> None:
        super().__init__(window=window, timeout=timeout, retries=retries)
        self.emu = emu
        self.endpoint = emu.primary if endpoint is None else endpoint
        """The port this transport speaks from."""
        self._loop: asyncio.AbstractEventLoop | None = None
        ep = self.endpoint
        ep.on_trap = self._trap_ready
        ep.on_reply = self._on_reply
        ep.on_request = self._on_request
        if issm:
            emu.set_issm(ep, True)
        self._issm = issm

    @property
    def local_port(self) -> LocalPort:
        """This transport's node and port: GUIDs, port number, current LID."""
        ep = self.endpoint
        f = self.emu.fabric
        return LocalPort(
            ep.node, ep.port, int(f.node_guid[ep.node]), int(f.port_guid[ep.node, ep.port]), self.emu.endpoint_lid(ep)
        )

    def _post(self, mad: bytes, route: Route) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        if isinstance(route, tuple | list):
            reply = self.emu.process(mad, src=self.endpoint)
        elif isinstance(route, int):
            reply = self.emu.process(mad, route, src=self.endpoint)
        else:
            raise TransportError(f"route {route!r} is neither a DR path nor a LID")
        if reply is not None:
            loop.call_soon(self._deliver, reply)
        self._drain_traps()

    def _loop_now(self) -> asyncio.AbstractEventLoop | None:
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
        loop = self._loop
        return None if loop is None or loop.is_closed() else loop

    def _on_reply(self, mad: bytes) -> None:
        """An answer another client sent us (through the emulator): delivered on the loop's next turn."""
        loop = self._loop_now()
        if loop is not None and not self._closed:
            loop.call_soon(self._deliver, mad)

    def _on_request(self, mad: bytes, sender: Endpoint, sender_lid: int) -> None:
        """A request for our port (SMInfo, an SA query) or an RMPP ACK: to the service on the loop's next turn."""
        loop = self._loop_now()
        if loop is None or self._closed:
            self.stats.refused += 1
            return
        smp = mad[1] in _SMP_CLASSES
        src = MadAddress(sender_lid, 0 if smp else 1, 0 if smp else _GSI_QKEY, via=sender)
        with self._lock:
            full = self._backlog >= MAX_BACKLOG
            if not full:
                self._backlog += 1
        if full:  # the services are behind: BUSY (the sender retries) rather than a silent drop
            self.stats.busy += 1
            answer = refusal(mad, busy=True)
            if answer is not None:
                self.emu.reply(self.endpoint, answer, sender, sender_lid)
            return
        loop.call_soon(self._request, mad, src)

    def _reply(self, mad: bytes, to: MadAddress) -> None:
        sender = to.via
        if not isinstance(sender, Endpoint):
            raise TransportError(f"no emulated client at LID {to.lid:#x} to answer")
        self.emu.reply(self.endpoint, mad, sender, to.lid)

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
        traps = self.endpoint.traps
        while traps:
            self._unsolicited(traps.popleft())

    async def next_trap(self, timeout: float | None = None) -> bytes | None:
        self._drain_traps()
        return await super().next_trap(timeout)

    def pending_traps(self) -> list[bytes]:
        self._drain_traps()
        return super().pending_traps()

    async def _close(self) -> None:
        ep = self.endpoint
        if ep.on_trap == self._trap_ready:
            ep.on_trap = None
        if ep.on_reply == self._on_reply:
            ep.on_reply = None
        if ep.on_request == self._on_request:
            ep.on_request = None
        if self._issm:
            self.emu.set_issm(ep, False)
