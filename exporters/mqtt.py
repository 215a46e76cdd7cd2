"""MQTT: every event as JSON, the subnet state retained, a last will that marks the daemon gone.

Topics, for subnet ``S``:

- ``ibfm/S/events/<type>``: each event (sm/sweep/events.py) as JSON, QoS 1;
- ``ibfm/S/state``: the subnet state after each sweep, retained, QoS 1;
- ``ibfm/S/status``: ``online`` once connected, retained; the broker
  publishes ``offline`` (the last will, retained) when the daemon vanishes.

The SM never waits on the broker: the event sink only puts on a bounded
queue (the oldest message is dropped when it is full, and counted). One
task owns the connection and reconnects with exponential backoff, as
aiomqtt 2.x intends: an outer loop around ``async with Client(...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
from pydantic import BaseModel

log = logging.getLogger("ibfm.mqtt")


@dataclass
class MqttStats:
    published: int = 0
    dropped: int = 0
    connects: int = 0
    connect_failures: int = 0
    last_error: str = ""


@dataclass
class MqttPublisher:
    host: str = "127.0.0.1"
    port: int = 1883
    subnet: str = "default"
    client_id: str | None = None
    queue_size: int = 10_000
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    keepalive: int = 30
    stats: MqttStats = field(default_factory=MqttStats)

    def __post_init__(self) -> None:
        if not self.subnet or any(c in self.subnet for c in "/#+"):
            raise ValueError(f"MQTT subnet name {self.subnet!r} must be non-empty and contain no '/', '#', '+'")
        self._queue: asyncio.Queue[tuple[str, bytes, bool]] | None = None
        self._state: bytes | None = None
        self.connected = asyncio.Event()

    # -- topics ----------------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return f"ibfm/{self.subnet}"

    def event_topic(self, kind: str) -> str:
        return f"{self.prefix}/events/{kind}"

    # -- feeding (never blocks) -------------------------------------------------------

    def _q(self) -> asyncio.Queue[tuple[str, bytes, bool]]:
        if self._queue is None:
            self._queue = asyncio.Queue(self.queue_size)
        return self._queue

    def _put(self, topic: str, payload: bytes, retain: bool) -> None:
        q = self._q()
        if q.full():
            with contextlib.suppress(asyncio.QueueEmpty):
                q.get_nowait()
            self.stats.dropped += 1
        q.put_nowait((topic, payload, retain))

    def on_event(self, event: BaseModel) -> None:
        """EventBus sink: queue the event as JSON on its type's topic."""
        kind = getattr(event, "type", type(event).__name__.lower())
        self._put(self.event_topic(kind), event.model_dump_json().encode(), False)

    def publish_state(self, state: dict[str, Any]) -> None:
        """Queue the retained subnet state (also re-sent after every reconnect)."""
        payload = json.dumps(state, sort_keys=True, default=str).encode()
        self._state = payload
        self._put(f"{self.prefix}/state", payload, True)

    # -- the connection task ----------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Publish until cancelled or ``stop`` is set; reconnect with backoff when the broker goes away."""
        q = self._q()
        delay = self.backoff_initial
        will = aiomqtt.Will(f"{self.prefix}/status", b"offline", qos=1, retain=True)
        pending: tuple[str, bytes, bool] | None = None
        while stop is None or not stop.is_set():
            try:
                async with aiomqtt.Client(
                    self.host,
                    self.port,
                    identifier=self.client_id or f"ibfm-{self.subnet}",
                    will=will,
                    keepalive=self.keepalive,
                    timeout=5,
                ) as client:
                    self.stats.connects += 1
                    self.connected.set()
                    delay = self.backoff_initial
                    await client.publish(f"{self.prefix}/status", b"online", qos=1, retain=True)
                    if self._state is not None:
                        await client.publish(f"{self.prefix}/state", self._state, qos=1, retain=True)
                    while stop is None or not stop.is_set():
                        if pending is None:
                            pending = await _get(q, stop)
                            if pending is None:
                                break
                        topic, payload, retain = pending
                        await client.publish(topic, payload, qos=1, retain=retain)
                        self.stats.published += 1
                        pending = None
                    if stop is not None and stop.is_set():
                        # A clean stop: say so ourselves (the will is for a vanished daemon).
                        await client.publish(f"{self.prefix}/status", b"offline", qos=1, retain=True)
                        return
            except aiomqtt.MqttError as e:
                self.connected.clear()
                self.stats.connect_failures += 1
                self.stats.last_error = str(e)
                log.warning("MQTT broker %s:%d: %s; retrying in %.1fs", self.host, self.port, e, delay)
                await _sleep(delay, stop)
                delay = min(delay * 2, self.backoff_max)


async def _get(
    q: asyncio.Queue[tuple[str, bytes, bool]], stop: asyncio.Event | None
) -> tuple[str, bytes, bool] | None:
    if stop is None:
        return await q.get()
    getter = asyncio.ensure_future(q.get())
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if getter in done:
        return getter.result()
    getter.cancel()
    return None


async def _sleep(seconds: float, stop: asyncio.Event | None) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def subnet_state(snapshot: Any) -> dict[str, Any]:
    """The retained state document from a SubnetSnapshot (or a placeholder before the first sweep)."""
    if snapshot is None:
        return {"state": "discovering", "time": time.time()}
    counts = snapshot.fabric.summary()
    return {
        "state": "up" if snapshot.up else "degraded",
        "time": snapshot.time,
        "sweep": snapshot.sweep,
        "engine": snapshot.engine,
        "switches": counts["switches"],
        "cas": counts["cas"],
        "links": counts["links"],
        "unreachable_pairs": snapshot.verify.unreachable,
        "credit_loops": len(snapshot.credit_loops),
        "program_failures": len(snapshot.program.failures),
    }

