"""The HTTP API's schemas (pydantic models) and its OpenAPI 3.1 document.

Handlers in :mod:`exporters.http` build plain dicts for speed; these
models say what those dicts hold. The component schemas of the document
are derived from the models, the paths are written out here, and the
tests validate every response against its model, so the document cannot
drift from what the server sends. The parameter and request schemas say
exactly what the server takes (lengths, patterns, bounds), so a request
the document calls valid is never answered 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from sm.sweep.events import event_schema

API_PREFIX = "/api/v1"
API_VERSION = "1.0.0"


# -- what the server takes, as JSON Schema keywords ----------------------------------------------------------
#
# The regexes are written in the subset ECMA-262 and Python's re agree on, and say exactly what the handlers
# of exporters.http accept; tests/test_http_api.py checks both directions.

_WS = r"\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
"""The characters ``str.strip()`` removes (Python's whitespace), spelled out: ``\\s`` differs between dialects."""

NODE_ID_MAX = 256
"""Longest node id (name, GUID or LID) the API takes."""
_NODE_CORE = rf"(?:0[xX](?:_?[0-9a-fA-F])+[{_WS}]*|[^0{_WS}][\s\S]*|0(?:[^xX][\s\S]*)?)"
NODE_ID_PATTERN = rf"^[{_WS}]*{_NODE_CORE}$"
"""A node id: not blank, and a GUID when it starts with 0x (hex digits, single underscores between them)."""
_PORT = r"(?:25[0-4]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]?)"
LINK_PATTERN = rf"^[{_WS}]*{_NODE_CORE}\[{_PORT}\][{_WS}]*$"
"""A cable as ``NODE[PORT]``, port 1..254."""
_N = r"[1-9][0-9]{0,17}"
_N0 = r"(?:0|[1-9][0-9]{0,17})"
_LOAD = r"(?:[0-9]*[1-9][0-9]*(?:\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*)"
PATTERN_SPEC_MAX = 200
PATTERN_SPEC_PATTERN = (
    rf"^(?:shift:{_N}|random-(?:permutation|bisection)(?::{_N0})?|all-to-all|incast:{_N}(?::{_N0})?|ring"
    rf"|ring-per-rail)(?:@{_LOAD})?$"
)
"""A traffic pattern spec (``sm.analysis.patterns``): the names in lower case, integers below 10**18 without sign or
leading zeros, a positive decimal load. Whether the fabric has the hosts it needs is the server's answer (409)."""
NETFILE_FORMAT = "ibnetdiscover"
"""The string format of a posted net file (ibsim or ibnetdiscover): a custom format, which JSON Schema validators
ignore and a fuzzer must be taught (``scripts/fuzz_http.py`` does)."""

NODE_ID_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": NODE_ID_MAX,
                                  "pattern": NODE_ID_PATTERN}
PATTERN_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": PATTERN_SPEC_MAX,
                                  "pattern": PATTERN_SPEC_PATTERN}
NETFILE_SCHEMA: dict[str, Any] = {
    "type": "string",
    "format": NETFILE_FORMAT,
    "pattern": r"[^\t-\r ]",
    "description": "An ibsim or ibnetdiscover net file, UTF-8, not blank.",
    "examples": ['Switch\t2 "sw-0"\n[1]\t"host-0"[1]\n\nHca\t1 "host-0"\n[1]\t"sw-0"[1]\n'],
}
OFFSET_MAX = 1 << 31
"""Largest ``offset`` of a page."""
_DEC16 = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
PKEY_PATTERN = rf"^(?:0[xX][0-9a-fA-F]{{1,4}}|{_DEC16})$"
"""A P_Key in a path: ``0x`` and 1-4 hex digits, or a decimal 0..65535 (at most 4 digits with leading zeros)."""
PKEY_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 6, "pattern": PKEY_PATTERN}


def _keywords(schema: dict[str, Any]) -> dict[str, Any]:
    """A string schema's keywords other than its type, for a pydantic field's ``json_schema_extra``."""
    return {k: v for k, v in schema.items() if k != "type"}


NodeId = Annotated[str, Field(json_schema_extra=_keywords(NODE_ID_SCHEMA))]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


NodeKind = Literal["switch", "ca", "router"]
PortStateName = Literal["nop", "down", "init", "armed", "active"]


class ErrorBody(_M):
    """Every 4xx and 5xx answer."""

    error: str = Field(description="Short machine-readable code, e.g. `bad_parameter`, `not_found`.")
    detail: str = Field(description="What is wrong, for a human.")
    parameter: str | None = Field(description="The query, path or body parameter at fault, if one is.")


class PortEnd(_M):
    node: str = Field(description="Node name (NodeDescription as discovered).")
    guid: str = Field(description="Node GUID, 0x-prefixed hex.")
    port: int


class NodeSummary(_M):
    name: str
    description: str = Field(description="NodeDescription.")
    guid: str = Field(description="Node GUID, 0x-prefixed hex.")
    type: NodeKind
    nports: int = Field(description="Number of physical ports.")
    lid: int | None = Field(description="Switch: port 0's LID; CA: its first port's LID; null if none.")
    system_image_guid: str
    vendor_id: int
    device_id: int


class PortDetail(_M):
    node: str
    guid: str = Field(description="Node GUID.")
    port: int
    port_guid: str
    state: PortStateName = Field(description="PortInfo.PortState.")
    phys_state: str = Field(description="PortInfo.PortPhysicalState, lower case (linkup, polling, ...).")
    width: str | None = Field(description="Active link width, e.g. `4x`; null when down.")
    speed: str | None = Field(description="Active lane speed, e.g. `NDR`; null when down.")
    rate_gbps: float = Field(description="Data rate of the link in Gb/s (0 when down).")
    mtu: int | None = Field(description="Active MTU in bytes.")
    lid: int | None = Field(description="Base LID of an end port (switch port 0, CA ports).")
    lmc: int
    peer: PortEnd | None = Field(description="The port at the other end of the cable.")
    counters: dict[str, int] | None = Field(
        description="PMA counter totals since the daemon started (bytes, packets, ticks or events); null "
        "without a performance manager."
    )
    rates: dict[str, float | None] | None = Field(
        description="Per-second rates over the last counter interval; null entries where not measured."
    )


class NodeDetail(NodeSummary):
    ports: list[PortDetail]


class NodePage(_M):
    total: int = Field(description="Items matching the filters (before paging).")
    offset: int
    limit: int
    items: list[NodeSummary]


class PortPage(_M):
    total: int
    offset: int
    limit: int
    items: list[PortDetail]


class LinkInfo(_M):
    a: PortEnd
    b: PortEnd
    state: PortStateName = Field(description="The lower PortState of the two ends.")
    phys_state: str
    width: str | None
    speed: str | None
    rate_gbps: float
    mtu: int | None


class LinkPage(_M):
    total: int
    offset: int
    limit: int
    items: list[LinkInfo]


class RouteEndpoint(_M):
    endpoint: str = Field(description="`node[port]`.")
    node: str
    guid: str = Field(description="Port GUID, 0x-prefixed hex.")
    port: int
    lid: int


class RouteHop(_M):
    node: str
    guid: str
    type: NodeKind
    in_port: int = Field(description="Port the packet enters on (0 at the source).")
    out_port: int = Field(description="Port it leaves on (0 at the destination).")
    width: str | None = Field(description="Width of the link left on; null at the destination.")
    speed: str | None
    rate_gbps: float | None
    mtu: int | None
    vl: int | None = Field(description="The VL the pair's packets leave on: their SL through the "
                           "SLtoVLMappingTable ibfm set on this hop's (input, output) ports; null at the "
                           "destination and where ibfm set none (QoS off: the port's own table decides).")


class PathRecord(_M):
    """The fields an SA PathRecord query would answer for this pair."""

    sgid: str
    dgid: str
    slid: int
    dlid: int
    pkey: str
    sl: int
    mtu: int = Field(description="PathRecord MTU code (1 = 256 .. 5 = 4096).")
    mtu_bytes: int
    rate: int | None = Field(description="PathRecord Rate code (IBA table: 16 = 100 Gb/s, 21 = 400 Gb/s, ...).")
    rate_gbps: float = Field(description="Signalling rate of the slowest link, Gb/s.")
    hop_count: int = Field(description="Links crossed.")


class PartitionRef(_M):
    pkey: str = Field(description="The P_Key as the source's P_KeyTable holds it: `0x8001` full member, "
                      "`0x0001` limited.")
    name: str | None = Field(description="The partition's name in the partitions file.")


class RouteInfo(_M):
    src: RouteEndpoint
    dst: RouteEndpoint
    delivered: bool = Field(description="False when the route breaks; `failure` says where.")
    failure: str | None
    hops: list[RouteHop]
    path_mtu: int = Field(description="Smallest MTU on the path, bytes (0 if broken).")
    rate_gbps: float = Field(description="Smallest data rate on the path, Gb/s (0 if broken).")
    path_record: PathRecord | None = Field(
        description="What the SA would answer: null when the route breaks, for a port to itself, and when the two "
        "ports share no partition."
    )
    partitions: list[PartitionRef] | None = Field(
        description="The partitions the two ports may talk in (a key both hold, a full member on one side at "
        "least), in the source's P_KeyTable order: the first is the P_Key a PathRecord carries. Empty: they "
        "share none and cannot talk. Null: the snapshot has no partition plan."
    )
    partition_note: str | None = Field(description="Why the two ports cannot talk, when they share no partition.")
    sl: int = Field(description="The SL the pair must send on (what the SA's PathRecord says): the routing "
                    "engine's layer of the route, else the QoS level's (policy file, then the partition's sl=), "
                    "else 0. Hosts that never ask the SA must be configured with it (docs/qos.md).")


class LftEntry(_M):
    lid: int
    port: int


class SwitchRef(_M):
    name: str
    guid: str
    lid: int | None


class LftInfo(_M):
    switch: SwitchRef
    lid_top: int = Field(description="Highest LID with an entry (LinearFDBTop as programmed).")
    count: int
    entries: list[LftEntry] = Field(description="Every LID with a route (port 255 entries are left out).")


class VerifySummary(_M):
    ok: bool
    pairs: int = Field(description="(source end port, destination LID) pairs the topology connects.")
    reachable: int
    unreachable: int
    host_pairs: int
    host_unreachable: int
    max_hops: int
    mean_hops: float
    failures: list[str] = Field(description="Examples of failing pairs (at most 50).")


class SweepState(_M):
    number: int
    time: float = Field(description="Unix time of the last heavy sweep.")
    age_s: float
    phases_s: dict[str, float] = Field(
        description="Seconds per stage; routing overlaps programming and the checks its end, so they do not add up."
    )
    up_s: float = Field(description="Seconds from the sweep's start to every port ACTIVE on its routes.")
    duration_s: float = Field(description="Seconds from the sweep's start to routes verified.")
    smps: int
    last_failure: dict[str, Any] | None = Field(description="The last failed sweep since the last heavy one.")


class ProgramState(_M):
    ok: bool
    port_sets: int
    lft_blocks_sent: int
    lft_blocks_unchanged: int
    ports_active: int
    failures: list[str]


class Health(_M):
    state: Literal["up", "degraded", "down", "standby", "discovering", "not_active"] = Field(
        description="up: routes verified, all programmed, no credit loop, no failed sweep since; degraded: "
        "usable with problems; down: some connected pairs have no route; standby, discovering, not_active: "
        "this SM is not the master (`sm` says who is; the other fields, if any, are from its last own sweep)."
    )
    subnet_up: bool | None = Field(description="null on a standby that never swept the subnet itself.")
    sm: dict[str, Any] = Field(
        description="This SM: its port, and its election state (`state`, `priority`, `guid`, `act_count`, "
        "`master_guid`, `master_lid`, `since`, `reason`)."
    )
    sweep: SweepState | None = None
    fabric: dict[str, int] | None = None
    routing: dict[str, Any] | None = None
    verify: VerifySummary | None = None
    credit_loops: list[str] | None = None
    lids: dict[str, Any] | None = None
    program: ProgramState | None = None
    discovery_errors: list[str] | None = None
    perfmgr: dict[str, Any] | None = None


class Check(_M):
    ok: bool
    severity: Literal["error", "warning", "info"]
    count: int = Field(description="Problems found (all of them, even when `items` is truncated).")
    items: list[dict[str, Any]] = Field(description="Problems, each with a `text` naming nodes and ports.")
    truncated: bool
    note: str = Field(description="Why the check was skipped, or what it compared.")


class Validation(_M):
    ok: bool = Field(description="No check of severity error failed.")
    errors: int
    warnings: int
    expected_topology: str | None = Field(description="The design compared against, if any.")
    checks: dict[str, Check]
    shape: dict[str, Any] = Field(description="The detected shape (fat-tree levels, missing links, ...).")


class HotLink(_M):
    src: str = Field(description="Transmitting port, `node[port]`.")
    dst: str = Field(description="Receiving port.")
    capacity_gbps: float
    load_gbps: float
    utilization: float = Field(description="Load over capacity, 0..1.")
    flows: int
    bottlenecked: int = Field(description="Flows whose bottleneck this link is.")
    xmit_wait: float = Field(description="Fraction of time the port waits for credits.")
    xmit_wait_per_s: float = Field(description="Predicted XmitWait ticks per second.")


class FlowStats(_M):
    flows: int
    unrouted: int
    min: float = Field(description="Slowest flow's rate over its link rate.")
    mean: float
    max: float
    full_rate: int = Field(description="Flows at their full link rate.")
    aggregate_gbps: float
    saturated_links: int
    waiting_ports: int = Field(description="Ports predicted to see XmitWait.")
    max_utilization: float
    max_xmit_wait: float


class Congestion(_M):
    pattern: str
    hosts: int = Field(description="Host ports the pattern addresses.")
    flows: int
    unrouted: int = Field(description="Flows whose route breaks.")
    flow_stats: FlowStats
    hottest: list[HotLink] = Field(description="Busiest links: by utilization, then bottlenecked flows, then wait.")
    rounds: int = Field(description="Progressive-filling rounds of the max-min computation.")
    model: str = Field(description="The model the prediction comes from.")


class ShiftQualityInfo(_M):
    hosts: int
    shifts: int
    total_shifts: int
    sampled: bool
    max_load: int
    mean_load: float
    mean_max_load: float
    unrouted: int


class RouteQuality(_M):
    engine: str
    refused: list[dict[str, str]]
    verify: VerifySummary
    credit_loops: list[str]
    shift_quality: ShiftQualityInfo
    congestion: Congestion | None
    pattern_error: str = Field(description="Why the pattern could not be built on these routes' fabric, or ''.")


class LinkSpec(_M):
    node: NodeId = Field(description="Node name, GUID (0x...) or LID.")
    port: int = Field(ge=1, le=254)


LinkText = Annotated[
    str, Field(json_schema_extra={"minLength": 4, "maxLength": NODE_ID_MAX + 3, "pattern": LINK_PATTERN})
]


class WhatIfRequest(_M):
    """At least one cable or switch; one listed twice (under any of its names) counts once."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["links"], "properties": {"links": {"minItems": 1}}},
                {"required": ["switches"], "properties": {"switches": {"minItems": 1}}},
            ],
            "examples": [{"links": ["leaf-01[6]", {"node": "leaf-02", "port": 7}], "switches": ["spine-00"],
                          "pattern": "shift:4", "max_shifts": 32}],
        }
    )

    links: list[LinkText | LinkSpec] = Field(
        default_factory=list, max_length=4096, description="Cables to fail: `node[port]` or {node, port}."
    )
    switches: list[NodeId] = Field(
        default_factory=list, max_length=4096, description="Switches to remove: name, GUID or LID."
    )
    pattern: str = Field(
        "shift:1",
        description="Traffic pattern for the congestion prediction.",
        json_schema_extra=_keywords(PATTERN_SCHEMA),
    )
    max_shifts: int = Field(32, ge=1, le=1024, description="Shifts sampled for the shift-quality figures.")


class WhatIf(_M):
    failed_links: list[str]
    failed_switches: list[str]
    routed: bool
    reason: str
    hosts_cut_off: list[str]
    lft_blocks_changed: int
    switches_changed: int
    before: RouteQuality
    after: RouteQuality | None


class SweepRequest(_M):
    heavy: bool = Field(False, description="Force a heavy sweep (full discovery and routing).")


class SweepAccepted(_M):
    requested: bool
    heavy: bool
    sweep: int | None = Field(description="Number of the last completed heavy sweep.")


class EventPage(_M):
    total: int
    items: list[dict[str, Any]] = Field(description="Events, oldest first (see the Event schema).")


Membership = Literal["full", "limited", "both"]


class PartitionInfo(_M):
    """One partition of the current plan: its statement's flags and how many end ports it has."""

    name: str
    pkey: str = Field(description="The P_Key, full-member form (`0x8001`; `0xffff` for Default).")
    ipoib: bool = Field(description="The partition has an IPoIB broadcast group.")
    indx0: bool = Field(description="Its members hold its key at P_KeyTable index 0.")
    mtu: int | None = Field(description="Broadcast group MTU code (1 = 256 .. 5 = 4096); null: not given.")
    rate: int | None = Field(description="Broadcast group rate code; null: not given.")
    sl: int | None = Field(description="Service level; null: not given (0).")
    scope: list[int] | None = Field(description="Broadcast group scopes; null: not given (2, link-local).")
    defmember: Membership = Field(description="Membership of members that do not say theirs.")
    members: int = Field(description="End ports in the partition (switch port 0, CA and router ports).")
    full: int = Field(description="Full members.")
    limited: int = Field(description="Limited members (with allow_both_pkeys a port may count in both).")


class PartitionList(_M):
    source: str = Field(description="The partitions file planned, or `<no partitions file>` (OpenSM's default).")
    sweep: int = Field(description="The heavy sweep whose plan this is.")
    pending: bool = Field(
        description="A reloaded file waits for the heavy sweep that applies it: these are still the old partitions."
    )
    total: int
    items: list[PartitionInfo] = Field(description="Every partition, Default first, then in file order.")
    problems_total: int
    problems: list[str] = Field(
        description="What the fabric made of the file that the file alone does not say: GUIDs not on the subnet, "
        "keys left out of full P_KeyTables, enforcement turned off (at most 1,000)."
    )


class PartitionMember(_M):
    node: str
    guid: str = Field(description="Node GUID, 0x-prefixed hex.")
    port: int = Field(description="0 for a switch.")
    port_guid: str
    lid: int | None
    membership: Membership = Field(description="`both` only with allow_both_pkeys.")


class PartitionDetail(_M):
    partition: PartitionInfo
    total: int = Field(description="Members matching the filter (before paging).")
    offset: int
    limit: int
    items: list[PartitionMember] = Field(description="Members in node (GUID) order.")


class PartitionsReloaded(_M):
    source: str = Field(description="The file read.")
    partitions: int = Field(description="Partitions it holds, Default included.")
    changed: bool = Field(description="It differs from the configuration in force before.")
    sweep: int | None = Field(description="Number of the last completed heavy sweep; the next one applies the file.")


class PartitionsFileError(ErrorBody):
    """A partitions file that does not parse: where, and what."""

    file: str
    line: int | None = Field(description="1-based; null when the file could not be read at all.")
    column: int | None
    message: str = Field(description="What is wrong there.")


class ViewTier(_M):
    """One row of the drawing: the switches of one rank above the leaves."""

    rank: int = Field(description="0 for the leaves (switches with a host), 1 above them, ...; -1: no up path "
                      "joins the switch to a leaf.")
    name: str = Field(description="`leaves`, `spines`, `cores` (the top rank of three or more), `tier N`, "
                      "`unranked`.")
    switches: int = Field(description="Switches of this rank.")
    drawn: int = Field(description="Those in `switches` (the cap `max_switches` shared among tiers by size).")
    hosts: int = Field(description="CAs cabled (link up) to the switches of this rank.")
    hosts_drawn: int = Field(description="Those cabled to drawn switches.")


class ViewSwitch(_M):
    name: str
    guid: str = Field(description="Node GUID, 0x-prefixed hex.")
    rank: int
    tier: int = Field(description="Index in `tiers`.")
    hosts: int = Field(description="CAs cabled to it with the link up.")
    hosts_down: int = Field(description="Its down cables to CAs (or to switches not drawn) listed in `down_links`.")
    ports_down: int = Field(description="Its ports in PortState Down (an empty port counts too).")


class ViewLink(_M):
    """The cables between two drawn switches, merged."""

    a: int = Field(description="Index in `switches` (the lower).")
    b: int = Field(description="Index in `switches`.")
    cables: int
    down: int = Field(description="Cables down (from the events, the expected topology or the snapshot).")
    inactive: int = Field(description="Cables LinkUp whose ports are not both ACTIVE.")
    state: Literal["active", "degraded", "down"] = Field(
        description="`down`: every cable down; `degraded`: some down or not ACTIVE."
    )
    utilization: float | None = Field(
        description="Transmit utilization 0..1 of the busiest direction of its busiest cable; null: unknown."
    )


class ViewUtilization(_M):
    source: Literal["measured", "predicted", "none"] = Field(
        description="`measured`: PortXmitData rate over the link's data rate, from the PerfManager's last two "
        "reads of this snapshot's counters; `predicted`: the congestion model for `pattern` on the current routes; "
        "`none`: neither (no counters, and a pattern this fabric cannot serve)."
    )
    pattern: str | None = Field(description="The traffic pattern predicted; null when measured.")
    perf_sweep: int | None = Field(description="PerfManager sweeps so far; null when predicted.")
    time: float | None = Field(description="Unix time of the PerfManager's last sweep; null when predicted.")
    max: float | None = Field(description="Highest utilization among the links drawn.")


class ViewCounts(_M):
    switches: int
    hosts: int = Field(description="CAs.")
    links_up: int = Field(description="Cables LinkUp (all, not only those drawn).")
    links_down: int = Field(description="Cables known to be down (`down_total`).")


class DownLink(_M):
    a: PortEnd
    b: PortEnd | None = Field(description="Null when only one end is known.")
    source: Literal["event", "expected", "snapshot"] = Field(
        description="`event`: a link_down event with no link_up since; `expected`: a cable of "
        "`fabric.expected_topology` the fabric lacks; `snapshot`: a cabled port that is not LinkUp."
    )
    since: float | None = Field(description="Unix time of the link_down event; null for the other sources.")


class FabricView(_M):
    """What the fabric page draws: switches by tier, the cables between them, utilization, down cables."""

    sweep: int = Field(description="The heavy sweep of the snapshot drawn.")
    time: float = Field(description="Unix time of that sweep.")
    layout: str = Field(description="Changes when the switches or pairs drawn change (the page redraws then).")
    shape: str = Field(description="The fabric's shape in one line (fat-tree levels, torus, ...).")
    counts: ViewCounts
    utilization: ViewUtilization
    tiers: list[ViewTier] = Field(description="Leaves first, `unranked` last.")
    switches: list[ViewSwitch] = Field(description="Switches drawn, tier by tier, in name order.")
    links: list[ViewLink] = Field(description="Pairs of drawn switches with a cable between them.")
    links_not_drawn: int = Field(description="Inter-switch cables with an end not drawn, or past the pair cap.")
    down_total: int = Field(description="Cables known to be down.")
    down_links: list[DownLink] = Field(description="At most 200 of them.")


class LinkCapability(LinkInfo):
    supported_width: str | None = Field(description="The widest width both ends support (PortInfo.LinkWidthSupported).")
    supported_speed: str | None = Field(description="The fastest speed both ends support.")
    supported_gbps: float = Field(description="Data rate at the supported width and speed, Gb/s.")
    degraded: bool = Field(description="Up, and below the width or speed both ends support.")
    why: str | None = Field(description="What is below capability, e.g. `width 1x of 4x`; null when not degraded.")


class LinkCapabilityPage(_M):
    total: int = Field(description="Links matching the filters (before paging).")
    degraded: int = Field(description="Degraded links in the whole fabric.")
    offset: int
    limit: int
    items: list[LinkCapability]


class PortErrors(PortEnd):
    peer: PortEnd | None = Field(description="The port at the other end of the cable.")
    moving: bool = Field(description="Some error counter rose over the rates' interval.")
    counters: dict[str, int] = Field(description="Nonzero error counter totals since the PerfManager started.")
    rates: dict[str, float | None] = Field(
        description="Per second over the counter sweeps of about the last minute seen by the API, for the same "
        "counters; null until two were seen."
    )


class ErrorPage(_M):
    counting: bool = Field(description="A performance manager reads the counters of the current fabric.")
    note: str | None
    sweeps: int = Field(description="Counter sweeps done.")
    last_sweep_time: float | None
    interval_s: float | None = Field(description="Seconds between the counter sweeps the rates span.")
    total: int = Field(description="Ports with a nonzero error counter (matching the filter).")
    offset: int
    limit: int
    items: list[PortErrors] = Field(description="Moving ports first, then by fastest rate, then by largest total.")


class HotPort(_M):
    src: PortEnd = Field(description="The transmitting port.")
    dst: PortEnd = Field(description="The port at the other end.")
    rate_gbps: float = Field(description="Data rate of the link, Gb/s.")
    measured_gbps: float | None = Field(description="Transmitted over the last counter interval, Gb/s.")
    measured_utilization: float | None = Field(description="measured_gbps over rate_gbps.")
    measured_xmit_wait_per_s: float | None = Field(description="XmitWait ticks per second measured.")
    predicted_utilization: float | None = Field(description="What the congestion model predicts, 0..1.")
    predicted_xmit_wait_per_s: float | None = Field(description="XmitWait ticks per second predicted.")


class HotPage(_M):
    by: Literal["measured", "predicted"]
    measured: bool = Field(description="Measured rates are there (a PerfManager swept this fabric twice).")
    measured_at: float | None = Field(description="When the last counter sweep started (Unix time).")
    pattern: str | None = Field(description="The predicted traffic pattern (asked for, or the daemon's own).")
    predicted: bool
    items: list[HotPort]


MODELS: tuple[type[BaseModel], ...] = (
    ErrorBody,
    NodePage,
    NodeDetail,
    PortPage,
    LinkPage,
    RouteInfo,
    LftInfo,
    Health,
    Validation,
    Congestion,
    WhatIfRequest,
    WhatIf,
    SweepRequest,
    SweepAccepted,
    EventPage,
    PartitionList,
    PartitionDetail,
    PartitionsReloaded,
    PartitionsFileError,
    FabricView,
    LinkCapabilityPage,
    ErrorPage,
    HotPage,
)


# -- the document ---------------------------------------------------------------------------------------------


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "A bad parameter or body",
        401: "No bearer token",
        403: "Wrong token, or writes disabled",
        404: "Nothing by that name",
        409: "Valid, but not on this fabric (e.g. more incast senders than hosts)",
        413: "Body too large",
        415: "Unsupported body type",
        429: "A heavy computation is already running",
        503: "No sweep has completed yet",
    }
    return {str(c): _json("ErrorBody", text[c]) for c in codes}


def _param(
    name: str, where: str, schema: dict[str, Any], description: str, required: bool = False, example: Any = None
) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "in": where, "required": required or where == "path",
                         "description": description, "schema": schema}
    if example is not None:
        d["example"] = example
    return d


_LIMIT = _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
                "Items per page.")
_OFFSET = _param("offset", "query", {"type": "integer", "minimum": 0, "maximum": OFFSET_MAX, "default": 0},
                 "Items to skip.")
_NODE_ID = _param("id", "path", NODE_ID_SCHEMA, "Node name, node or port GUID (0x...), or LID.", example="leaf-00")
_STATES = {"type": "string", "enum": ["down", "init", "armed", "active"]}


def build_openapi(*, metrics: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every endpoint, parameter and response."""
    _, defs = models_json_schema([(m, "serialization") for m in MODELS], ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = dict(defs.get("$defs", {}))
    ev = event_schema()
    ev_defs = ev.pop("$defs", {})
    schemas.update(_retarget(ev_defs))
    schemas["Event"] = _retarget(ev)
    schemas["NetFile"] = NETFILE_SCHEMA
    schemas["EventPage"]["properties"]["items"] = {"type": "array", "items": _ref("Event"),
                                                   "description": "Events, oldest first."}
    read = ["topology"]
    paths: dict[str, Any] = {
        f"{API_PREFIX}/openapi.json": {
            "get": {
                "tags": ["meta"],
                "operationId": "getOpenapi",
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1 document",
                                      "content": {"application/json": {"schema": {"type": "object"}}}}},
            }
        },
        f"{API_PREFIX}/health": {
            "get": {
                "tags": ["subnet"],
                "operationId": "getHealth",
                "summary": "Subnet health: state, last sweep, engine, refusals, verification, credit loops",
                "responses": {"200": _json("Health", "Subnet health"), **_errors(503)},
            }
        },
        f"{API_PREFIX}/nodes": {
            "get": {
                "tags": read,
                "operationId": "listNodes",
                "summary": "Nodes of the subnet",
                "parameters": [
                    _param("type", "query", {"type": "string", "enum": ["switch", "ca", "router"]},
                           "Node type (case-insensitive)."),
                    _param("name", "query", {"type": "string"},
                           "Case-insensitive substring of the name or NodeDescription."),
                    _LIMIT,
                    _OFFSET,
                ],
                "responses": {"200": _json("NodePage", "A page of nodes"), **_errors(400, 503)},
            }
        },
        f"{API_PREFIX}/nodes/{{id}}": {
            "get": {
                "tags": read,
                "operationId": "getNode",
                "summary": "One node with its ports",
                "parameters": [_NODE_ID],
                "responses": {"200": _json("NodeDetail", "The node"), **_errors(400, 404, 503)},
            }
        },
        f"{API_PREFIX}/ports": {
            "get": {
                "tags": read,
                "operationId": "listPorts",
                "summary": "Ports (PortInfo and, with a performance manager, counters)",
                "parameters": [
                    _param("node", "query", NODE_ID_SCHEMA, "Only this node's ports (name, GUID or LID).",
                           example="leaf-00"),
                    _param("state", "query", _STATES, "PortState (case-insensitive)."),
                    _LIMIT,
                    _OFFSET,
                ],
                "responses": {"200": _json("PortPage", "A page of ports"), **_errors(400, 404, 503)},
            }
        },
        f"{API_PREFIX}/links": {
            "get": {
                "tags": read,
                "operationId": "listLinks",
                "summary": "Cables between two ports",
                "parameters": [
                    _param("node", "query", NODE_ID_SCHEMA, "Only links of this node (name, GUID or LID).",
                           example="spine-00"),
                    _param("state", "query", _STATES, "The lower PortState of the two ends (case-insensitive)."),
                    _LIMIT,
                    _OFFSET,
                ],
                "responses": {"200": _json("LinkPage", "A page of links"), **_errors(400, 404, 503)},
            }
        },
        f"{API_PREFIX}/linkinfo": {
            "get": {
                "tags": read,
                "operationId": "listLinkInfo",
                "summary": "Cables with width, speed and state, and what both ends support (iblinkinfo)",
                "parameters": [
                    _param("node", "query", NODE_ID_SCHEMA, "Only links of this node (name, GUID or LID).",
                           example="spine-00"),
                    _param("degraded", "query", {"type": "string", "enum": ["true", "false"]},
                           "`true`: only links below both ends' width or speed; `false`: only the others."),
                    _LIMIT,
                    _OFFSET,
                ],
                "responses": {"200": _json("LinkCapabilityPage", "A page of links"), **_errors(400, 404, 503)},
            }
        },
        f"{API_PREFIX}/errors": {
            "get": {
                "tags": ["diagnostics"],
                "operationId": "listErrors",
                "summary": "Ports whose PMA error counters moved, with totals and rates (ibqueryerrors)",
                "parameters": [
                    _param("node", "query", NODE_ID_SCHEMA, "Only this node's ports (name, GUID or LID).",
                           example="leaf-00"),
                    _LIMIT,
                    _OFFSET,
                ],
                "responses": {"200": _json("ErrorPage", "A page of ports"), **_errors(400, 404, 503)},
            }
        },
        f"{API_PREFIX}/hot": {
            "get": {
                "tags": ["analysis"],
                "operationId": "listHot",
                "summary": "Busiest transmitting ports: measured utilization and predicted for a pattern",
                "parameters": [
                    _param("top", "query", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
                           "Ports listed."),
                    _param("by", "query", {"type": "string", "enum": ["measured", "predicted"],
                                           "default": "measured"}, "Order by (case-insensitive)."),
                    _param("pattern", "query", PATTERN_SCHEMA,
                           "Traffic pattern to predict, as for /congestion; default: the daemon's "
                           "`congestion.pattern`, if it tells the API."),
                ],
                "responses": {"200": _json("HotPage", "The busiest ports"), **_errors(400, 409, 503)},
            }
        },
        f"{API_PREFIX}/routes": {
            "get": {
                "tags": ["routing"],
                "operationId": "getRoute",
                "summary": "Hops from one endpoint to another through the LFTs (ibtracert) and the PathRecord",
                "parameters": [
                    _param("src", "query", NODE_ID_SCHEMA, "Source: node name, node or port GUID (0x...), or LID.",
                           True, "host-00000"),
                    _param("dst", "query", NODE_ID_SCHEMA, "Destination, as src.", True, "host-00031"),
                ],
                "responses": {"200": _json("RouteInfo", "The route"), **_errors(400, 404, 503)},
            }
        },
        f"{API_PREFIX}/switches/{{id}}/lft": {
            "get": {
                "tags": ["routing"],
                "operationId": "getLft",
                "summary": "A switch's linear forwarding table",
                "parameters": [
                    _param("id", "path", NODE_ID_SCHEMA, "Switch name, GUID (0x...) or LID.", example="leaf-00"),
                    _param("format", "query", {"type": "string", "enum": ["json", "ibroute"], "default": "json"},
                           "`ibroute`: text as `ibroute <lid>` prints it (case-insensitive)."),
                ],
                "responses": {
                    "200": {
                        "description": "The LFT",
                        "content": {
                            "application/json": {"schema": _ref("LftInfo")},
                            "text/plain": {"schema": {"type": "string"}},
                        },
                    },
                    **_errors(400, 404, 503),
                },
            }
        },
        f"{API_PREFIX}/validation": {
            "get": {
                "tags": ["diagnostics"],
                "operationId": "getValidation",
                "summary": "ibdiagnet-style checks; cabling against the configured expected topology",
                "responses": {"200": _json("Validation", "Check results"), **_errors(503)},
            },
            "post": {
                "tags": ["diagnostics"],
                "operationId": "postValidation",
                "summary": "The same checks, cabling against a posted net file (ibsim or ibnetdiscover format)",
                "requestBody": {
                    "required": True,
                    "content": {"text/plain": {"schema": _ref("NetFile")},
                                "application/octet-stream": {"schema": _ref("NetFile")}},
                },
                "responses": {"200": _json("Validation", "Check results"), **_errors(400, 413, 415, 429, 503)},
            },
        },
        f"{API_PREFIX}/congestion": {
            "get": {
                "tags": ["analysis"],
                "operationId": "getCongestion",
                "summary": "Predicted congestion of a traffic pattern on the current routes",
                "parameters": [
                    _param("pattern", "query", {**PATTERN_SCHEMA, "default": "shift:1"},
                           "shift:S, random-permutation[:SEED], random-bisection[:SEED], all-to-all, "
                           "incast:N[:DST], ring, ring-per-rail; each optionally @LOAD (fraction of the link "
                           "rate offered instead of greedy)."),
                    _param("top", "query", {"type": "integer", "minimum": 0, "maximum": 1000, "default": 10},
                           "Most loaded links listed."),
                ],
                "responses": {"200": _json("Congestion", "The prediction"), **_errors(400, 409, 503)},
            }
        },
        f"{API_PREFIX}/whatif": {
            "post": {
                "tags": ["analysis"],
                "operationId": "postWhatIf",
                "summary": "Route quality and congestion with cables or switches failed, without touching the fabric",
                "requestBody": {"required": True,
                                "content": {"application/json": {"schema": _ref("WhatIfRequest")}}},
                "responses": {"200": _json("WhatIf", "Before and after"),
                              **_errors(400, 404, 409, 413, 415, 429, 503)},
            }
        },
        f"{API_PREFIX}/sweep": {
            "post": {
                "tags": ["control"],
                "operationId": "postSweep",
                "summary": "Ask the SM for a sweep now (needs the bearer token)",
                "security": [{"bearer": []}],
                "requestBody": {"required": False,
                                "content": {"application/json": {"schema": _ref("SweepRequest")}}},
                "responses": {"202": _json("SweepAccepted", "Requested"), **_errors(400, 401, 403, 415)},
            }
        },
        f"{API_PREFIX}/partitions": {
            "get": {
                "tags": ["partitions"],
                "operationId": "listPartitions",
                "summary": "Partitions of the current plan: flags, member counts, problems, the file",
                "responses": {"200": _json("PartitionList", "The partitions"), **_errors(400, 503)},
            }
        },
        f"{API_PREFIX}/partitions/{{pkey}}": {
            "get": {
                "tags": ["partitions"],
                "operationId": "getPartition",
                "summary": "One partition and a page of its members",
                "parameters": [
                    _param("pkey", "path", PKEY_SCHEMA,
                           "P_Key, `0x8001` or decimal; its low 15 bits name the partition (0x0001 is 0x8001).",
                           example="0x7fff"),
                    _param("membership", "query", {"type": "string", "enum": ["full", "limited"]},
                           "Only full or only limited members (case-insensitive)."),
                    _LIMIT,
                    _OFFSET,
                ],
                "responses": {"200": _json("PartitionDetail", "The partition"), **_errors(400, 404, 503)},
            }
        },
        f"{API_PREFIX}/partitions/reload": {
            "post": {
                "tags": ["control"],
                "operationId": "reloadPartitions",
                "summary": "Read the partitions file (sm.partitions) again and apply it with a heavy sweep, as "
                "SIGHUP does (needs the bearer token)",
                "security": [{"bearer": []}],
                "responses": {
                    "200": _json("PartitionsReloaded", "Read; the next heavy sweep applies it"),
                    "400": _json("PartitionsFileError", "The file does not parse; the running configuration stays"),
                    "409": _json("ErrorBody", "No partitions file is configured"),
                    **_errors(401, 403),
                },
            }
        },
        f"{API_PREFIX}/events": {
            "get": {
                "tags": ["subnet"],
                "operationId": "listEvents",
                "summary": "Recent events (link up/down, sweeps, routing failures, ...)",
                "parameters": [
                    _param("type", "query", {"type": "string"}, "Only events of this type (e.g. link_down)."),
                    _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
                           "The most recent events returned."),
                ],
                "responses": {"200": _json("EventPage", "Events"), **_errors(400)},
            }
        },
    }
    paths[f"{API_PREFIX}/view/fabric"] = {
        "get": {
            "tags": ["view"],
            "operationId": "getFabricView",
            "summary": "What the fabric page (GET /) draws: switches by tier, hosts per leaf, links with their "
            "utilization, down cables",
            "parameters": [
                _param("max_switches", "query", {"type": "integer", "minimum": 1, "maximum": 5000, "default": 320},
                       "Most switches drawn, shared among the tiers by size (ends of down cables always are)."),
                _param("pattern", "query", {**PATTERN_SCHEMA, "default": "shift:1"},
                       "Traffic pattern whose predicted load colours the links when no counters are measured "
                       "(as in /congestion)."),
            ],
            "responses": {"200": _json("FabricView", "The drawing"), **_errors(400, 409, 503)},
        }
    }
    if metrics:
        from exporters.metrics import GROUPS

        paths["/metrics"] = {
            "get": {
                "tags": ["meta"],
                "operationId": "getMetrics",
                "summary": "Prometheus exposition",
                "description": "OpenMetrics 1.0 when `Accept` names `application/openmetrics-text` (Prometheus "
                "always does), else the text format 0.0.4; gzipped when `Accept-Encoding` takes gzip. See "
                "docs/metrics.md.",
                "parameters": [
                    _param("collect[]", "query", {"type": "array", "items": {"type": "string", "enum": list(GROUPS)},
                                                  "uniqueItems": True},
                           "Family groups to keep (repeat the parameter; none: every group). subnet, sm, partitions "
                           "and perfmgr are fabric-wide and go to shard 0 only."),
                    _param("shard", "query", {"type": "string", "pattern": r"^[0-9]+/[0-9]+$", "default": "0/1"},
                           "i/n with 0 <= i < n <= 1024: this scrape's share of the per-device and per-port rows "
                           "(a switch by fmix64(node GUID) % n, with its ports and the CAs cabled to it); 0/1 is "
                           "the whole fabric.", example="1/4"),
                ],
                "responses": {
                    "200": {"description": "The exposition",
                            "content": {
                                "application/openmetrics-text; version=1.0.0; charset=utf-8": {
                                    "schema": {"type": "string"}},
                                "text/plain; version=0.0.4; charset=utf-8": {"schema": {"type": "string"}},
                            }},
                    "400": _json("ErrorBody", "An unknown parameter or group, or a malformed shard (`parameter` "
                                 "names it)"),
                },
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ibfm",
            "version": API_VERSION,
            "description": "InfiniBand fabric manager: topology, routes, LFTs, health, validation, "
            "congestion and what-if. Reads are open; writes need `Authorization: Bearer <token>`. "
            "Every error is JSON: {error, detail, parameter}.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _retarget(node: Any) -> Any:
    """Move pydantic's ``#/$defs/X`` references under ``#/components/schemas/X``."""
    if isinstance(node, dict):
        return {
            k: (v.replace("#/$defs/", "#/components/schemas/") if k == "$ref" and isinstance(v, str) else _retarget(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_retarget(v) for v in node]
    return node


MODEL_FOR: dict[tuple[str, str], type[BaseModel]] = {
    ("get", "/health"): Health,
    ("get", "/nodes"): NodePage,
    ("get", "/nodes/{id}"): NodeDetail,
    ("get", "/ports"): PortPage,
    ("get", "/links"): LinkPage,
    ("get", "/routes"): RouteInfo,
    ("get", "/switches/{id}/lft"): LftInfo,
    ("get", "/validation"): Validation,
    ("post", "/validation"): Validation,
    ("get", "/congestion"): Congestion,
    ("post", "/whatif"): WhatIf,
    ("post", "/sweep"): SweepAccepted,
    ("get", "/events"): EventPage,
    ("get", "/partitions"): PartitionList,
    ("get", "/partitions/{pkey}"): PartitionDetail,
    ("post", "/partitions/reload"): PartitionsReloaded,
    ("get", "/view/fabric"): FabricView,
    ("get", "/linkinfo"): LinkCapabilityPage,
    ("get", "/errors"): ErrorPage,
    ("get", "/hot"): HotPage,
}
"""Response model of each operation's success answer (paths without the prefix), for tests and tools."""
