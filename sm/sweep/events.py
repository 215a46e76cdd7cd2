"""The closed set of events the FabricManager emits, and the bus that hands them to sinks.

Events are pydantic models so sinks (MQTT, logs, HTTP) can serialize them
as JSON with a published schema. The core never imports a sink: sinks
subscribe callables to the :class:`EventBus`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

log = logging.getLogger("ibfm.events")


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True)
    time: float = Field(default_factory=time.time, description="Unix time the event was raised")


class PortRef(BaseModel):
    model_config = ConfigDict(frozen=True)
    guid: str = Field(description="node GUID, 0x-prefixed hex")
    name: str
    port: int


class LinkDown(_Event):
    type: Literal["link_down"] = "link_down"
    a: PortRef
    b: PortRef | None = None


class LinkUp(_Event):
    type: Literal["link_up"] = "link_up"
    a: PortRef
    b: PortRef | None = None


class NodeAdded(_Event):
    type: Literal["node_added"] = "node_added"
    guid: str
    name: str
    node_type: Literal["switch", "ca", "router"]


class NodeRemoved(_Event):
    type: Literal["node_removed"] = "node_removed"
    guid: str
    name: str
    node_type: Literal["switch", "ca", "router"]


class PortHeldDown(_Event):
    type: Literal["port_held_down"] = "port_held_down"
    port: PortRef
    flaps: int = Field(description="state changes counted within the flap window")
    until: float = Field(description="Unix time the hold ends")


class SweepDone(_Event):
    type: Literal["sweep_done"] = "sweep_done"
    sweep: int
    kind: Literal["heavy", "light"]
    duration_s: float
    lft_blocks_sent: int
    smps: int
    engine: str | None = None
    subnet_up: bool
    changes: int = Field(default=0, description="port state changes the sweep acted on")
    reasons: list[str] = Field(default_factory=list, description="what asked for it: timer, trap, api, start")


class RoutingFailed(_Event):
    type: Literal["routing_failed"] = "routing_failed"
    reason: str


class CreditLoopFound(_Event):
    type: Literal["credit_loop_found"] = "credit_loop_found"
    engine: str
    loops: int
    example: list[str] = Field(description="channels of the first loop, 'node[port]'")


class SweepFailed(_Event):
    type: Literal["sweep_failed"] = "sweep_failed"
    stage: str
    reason: str
    unreachable: list[str] = Field(default_factory=list, description="devices that did not answer")


class SmStateChanged(_Event):
    type: Literal["sm_state_changed"] = "sm_state_changed"
    state: Literal["not_active", "discovering", "standby", "master"]
    priority: int
    guid: str = Field(description="our SM port GUID, 0x-prefixed hex")
    master_guid: str | None = Field(default=None, description="the master's port GUID (ours when master)")
    master_lid: int = 0
    reason: str


class CounterThreshold(_Event):
    type: Literal["counter_threshold"] = "counter_threshold"
    port: PortRef
    counter: str
    value: float
    threshold: float


Event = Annotated[
    LinkDown
    | LinkUp
    | NodeAdded
    | NodeRemoved
    | PortHeldDown
    | SweepDone
    | SweepFailed
    | RoutingFailed
    | CreditLoopFound
    | SmStateChanged
    | CounterThreshold,
    Field(discriminator="type"),
]
"""Any event, told apart by its ``type`` field."""
EVENT_TYPES: tuple[type[_Event], ...] = get_args(get_args(Event)[0])
"""The members of :data:`Event`, in order."""
event_adapter: TypeAdapter[Event] = TypeAdapter(Event)


def event_schema() -> dict[str, object]:
    """JSON schema of every event (the union, discriminated by ``type``)."""
    return event_adapter.json_schema()


Sink = Callable[[Event], None]


class EventBus:
    """Fan-out to subscribed sinks; a failing sink is logged and never stops the SM."""

    def __init__(self) -> None:
        self._sinks: list[Sink] = []
        self.history: list[Event] = []
        self.max_history = 1000

    def subscribe(self, sink: Sink) -> Callable[[], None]:
        self._sinks.append(sink)
        return lambda: self._sinks.remove(sink)

    def emit(self, event: Event) -> None:
        self.history.append(event)
        if len(self.history) > self.max_history:
            del self.history[: len(self.history) - self.max_history]
        for sink in list(self._sinks):
            try:
                sink(event)
            except Exception:
                log.exception("event sink %r failed on %s", sink, event.type)
