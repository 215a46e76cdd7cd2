"""MQTT publisher against a real mosquitto broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiomqtt
import pytest

from exporters.mqtt import MqttPublisher, subnet_state
from sm.sweep.events import EVENT_TYPES, EventBus, LinkDown, PortRef, SweepDone, event_adapter
from tests.conftest import free_port, need_tool, stop_process

pytestmark = pytest.mark.mqtt




class Broker:
    def __init__(self, tmp: Path) -> None:
        self.exe = need_tool("mosquitto", "/usr/sbin/mosquitto")
        self.port = free_port()
        self.conf = tmp / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([self.exe, "-c", str(self.conf)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return
            time.sleep(0.05)
        raise RuntimeError("mosquitto did not start")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        self.proc = None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@contextlib.asynccontextmanager
async def subscriber(port: int, topic: str) -> AsyncIterator[asyncio.Queue[aiomqtt.Message]]:
    q: asyncio.Queue[aiomqtt.Message] = asyncio.Queue()
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"sub-{time.monotonic_ns()}") as c:
        await c.subscribe(topic, qos=1)

        async def pump() -> None:
            async for m in c.messages:
                q.put_nowait(m)

        task = asyncio.create_task(pump())
        try:
            yield q
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def until(q: asyncio.Queue[aiomqtt.Message], pred, timeout: float = 10.0) -> aiomqtt.Message:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("no matching MQTT message in time")
        m = await asyncio.wait_for(q.get(), left)
        if pred(m):
            return m


def sample_events() -> list:  # type: ignore[type-arg]
    """One instance of every event type, built from the schema's required fields."""
    ref = PortRef(guid="0x0002c90000000001", name="leaf-00", port=3)
    out = []
    for cls in EVENT_TYPES:
        fields = {
            "a": ref,
            "port": ref,
            "guid": "0x1",
            "name": "n",
            "node_type": "switch",
            "flaps": 5,
            "until": 1.0,
            "sweep": 1,
            "kind": "heavy",
            "duration_s": 0.1,
            "lft_blocks_sent": 2,
            "smps": 3,
            "subnet_up": True,
            "reason": "r",
            "stage": "discover",
            "engine": "ftree",
            "loops": 1,
            "example": ["a[1]"],
            "counter": "xmit_wait",
            "value": 2.0,
            "threshold": 1.0,
            "state": "master",
            "priority": 5,
        }
        names = set(cls.model_fields) - {"type", "time"}
        out.append(cls(**{k: v for k, v in fields.items() if k in names}))
    return out


async def test_every_event_type_and_the_retained_state(broker: Broker) -> None:
    pub = MqttPublisher(port=broker.port, subnet="t1", backoff_initial=0.1)
    bus = EventBus()
    bus.subscribe(pub.on_event)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    try:
        async with subscriber(broker.port, "ibfm/t1/#") as q:
            await asyncio.wait_for(pub.connected.wait(), 10)
            events = sample_events()
            for e in events:
                bus.emit(e)
            pub.publish_state(subnet_state(None))
            seen: dict[str, dict] = {}  # type: ignore[type-arg]
            while len(seen) < len(events):
                m = await until(q, lambda m: str(m.topic).startswith("ibfm/t1/events/"))
                body = json.loads(m.payload)  # type: ignore[arg-type]
                event_adapter.validate_python(body)  # the documented schema holds
                seen[str(m.topic).rsplit("/", 1)[1]] = body
                assert m.qos == 1
            assert set(seen) == {e.type for e in events}
            await until(q, lambda m: str(m.topic) == "ibfm/t1/state")
        # A late subscriber still gets the retained state and status.
        async with subscriber(broker.port, "ibfm/t1/+") as q2:
            got: dict[str, aiomqtt.Message] = {}
            while len(got) < 2:
                m = await until(q2, lambda m: str(m.topic) in ("ibfm/t1/state", "ibfm/t1/status"))
                got[str(m.topic)] = m
            state, status = got["ibfm/t1/state"], got["ibfm/t1/status"]
            assert state.retain and json.loads(state.payload)["state"] == "discovering"  # type: ignore[arg-type]
            assert status.retain and status.payload == b"online"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_survives_a_broker_restart_without_blocking(broker: Broker) -> None:
    pub = MqttPublisher(port=broker.port, subnet="t2", backoff_initial=0.05, backoff_max=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    try:
        await asyncio.wait_for(pub.connected.wait(), 10)
        broker.stop()
        # The SM keeps emitting while the broker is gone: the sink never blocks.
        t0 = time.perf_counter()
        for i in range(100):
            pub.on_event(SweepDone(sweep=i, kind="light", duration_s=0, lft_blocks_sent=0, smps=0, subnet_up=True))
        assert time.perf_counter() - t0 < 1.0
        await asyncio.sleep(0.5)
        broker.start()
        async with subscriber(broker.port, "ibfm/t2/events/#") as q:
            await asyncio.sleep(0.3)
            pub.on_event(LinkDown(a=PortRef(guid="0x2", name="spine-01", port=7)))
            m = await until(q, lambda m: str(m.topic).endswith("/link_down"), timeout=15)
            assert json.loads(m.payload)["a"]["name"] == "spine-01"  # type: ignore[arg-type]
        assert pub.stats.connects >= 2 and pub.stats.connect_failures >= 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


_DAEMON = """
import asyncio, sys
from exporters.mqtt import MqttPublisher
async def main():
    pub = MqttPublisher(port=int(sys.argv[1]), subnet="t3")
    task = asyncio.create_task(pub.run())
    await pub.connected.wait()
    print("connected", flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""


async def test_last_will_marks_a_killed_daemon_gone(broker: Broker, tmp_path: Path) -> None:
    script = tmp_path / "daemon.py"
    script.write_text(_DAEMON)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(broker.port)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
        assert line.strip() == b"connected"
        async with subscriber(broker.port, "ibfm/t3/status") as q:
            await until(q, lambda m: m.payload == b"online")
            proc.send_signal(signal.SIGKILL)
            m = await until(q, lambda m: m.payload == b"offline", timeout=20)
            assert str(m.topic) == "ibfm/t3/status"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_bad_subnet_name() -> None:
    with pytest.raises(ValueError, match="subnet"):
        MqttPublisher(subnet="a/b")
