"""Port traffic and errors: bandwidth, packets, utilization and PMA error counters of the picked ports."""

from __future__ import annotations

from dashboards.common import (
    PORT_JOIN,
    dashboard,
    increase,
    named,
    picked,
    port_variable,
    rate,
    rows,
    series,
    stat,
    switch_variable,
    table,
    target,
    timeseries,
)
from exporters import metrics as M

PORT = "{{name}} [{{port}}]"
LINK = "{{name}} [{{port}}] -> {{remote_name}} [{{remote_port}}]"

ERRORS = (
    M.PORT_SYMBOL_ERRORS,
    M.PORT_LINK_ERROR_RECOVERY,
    M.PORT_LINK_DOWNED,
    M.PORT_RCV_ERRORS,
    M.PORT_RCV_REMOTE_PHYS_ERRORS,
    M.PORT_RCV_SWITCH_RELAY_ERRORS,
    M.PORT_XMIT_DISCARDS,
    M.PORT_XMIT_CONSTRAINT_ERRORS,
    M.PORT_RCV_CONSTRAINT_ERRORS,
    M.PORT_LOCAL_LINK_INTEGRITY_ERRORS,
    M.PORT_EXCESSIVE_BUFFER_OVERRUN_ERRORS,
    M.PORT_VL15_DROPPED,
    M.PORT_QP1_DROPPED,
)
"""The PortCounters error counters."""


def _short(m: M.MetricDef) -> str:
    return m.name.removeprefix("ibfm_port_").removesuffix("_total").replace("_", " ")


_utilization = f"{rate(M.PORT_XMIT_DATA)} / ({series(M.PORT_RATE_BYTES)} > 0)"
_all_errors = " + ".join(rate(m) for m in ERRORS)

_traffic = [
    (timeseries("Transmit", [target(picked(rate(M.PORT_XMIT_DATA)), LINK)], unit="Bps", legend_table=True), 12),
    (timeseries("Receive", [target(picked(rate(M.PORT_RCV_DATA)), LINK)], unit="Bps", legend_table=True), 12),
    (
        timeseries(
            "Transmit utilization",
            [target(picked(_utilization), LINK)],
            unit="percentunit",
            description="Transmitted bytes per second over the link's data rate (ports whose link is up).",
        ),
        12,
    ),
    (
        timeseries(
            "Packets per second",
            [
                target(picked(rate(M.PORT_XMIT_PKTS)), f"{PORT} xmit"),
                target(picked(rate(M.PORT_RCV_PKTS)), f"{PORT} rcv"),
            ],
            unit="pps",
        ),
        12,
    ),
    (
        timeseries(
            "XmitWait ticks per second",
            [target(picked(rate(M.PORT_XMIT_WAIT)), LINK)],
            description="Ticks in which the port had data to send and no credit: congestion downstream.",
        ),
        12,
    ),
    (
        timeseries(
            "Unicast and multicast packets per second",
            [
                target(picked(rate(M.PORT_UNICAST_XMIT_PKTS)), f"{PORT} unicast xmit"),
                target(picked(rate(M.PORT_UNICAST_RCV_PKTS)), f"{PORT} unicast rcv"),
                target(picked(rate(M.PORT_MULTICAST_XMIT_PKTS)), f"{PORT} multicast xmit"),
                target(picked(rate(M.PORT_MULTICAST_RCV_PKTS)), f"{PORT} multicast rcv"),
            ],
            unit="pps",
        ),
        12,
    ),
]

_errors = [
    (
        timeseries(
            "Error counters per second",
            [target(picked(rate(m)), f"{PORT} {_short(m)}") for m in ERRORS],
            unit="ops",
            legend_table=True,
        ),
        16,
    ),
    (
        stat(
            "Link downed in the time range",
            [target(f"sum({picked(increase(M.PORT_LINK_DOWNED))})")],
            thresholds=[(None, "green"), (1, "red")],
        ),
        4,
    ),
    (
        stat(
            "Symbol errors in the time range",
            [target(f"sum({picked(increase(M.PORT_SYMBOL_ERRORS))})")],
            thresholds=[(None, "green"), (1, "orange")],
        ),
        4,
    ),
    (
        table(
            "Fabric-wide: ports with the most errors",
            [
                target(
                    f"topk(15, {named(f'sum by ({PORT_JOIN}) ({_all_errors})')})",
                    instant=True,
                    table=True,
                )
            ],
            unit="ops",
            description="Every PortCounters error counter summed, per second, over every port of the fabric.",
        ),
        24,
    ),
]

_links = [
    (
        table(
            "Links of the picked ports",
            [
                target(picked(series(M.PORT_STATE)), instant=True, table=True),
                target(picked(series(M.PORT_PHYSICAL_STATE)), instant=True, table=True),
                target(picked(series(M.PORT_WIDTH_LANES)), instant=True, table=True),
                target(picked(series(M.PORT_RATE_BYTES)), instant=True, table=True),
                target(picked(series(M.PORT_MTU_BYTES)), instant=True, table=True),
            ],
            description="PortState (4 Active), PortPhysicalState (5 LinkUp), lanes, data rate (bytes/s), MTU.",
        ),
        24,
    ),
]

dashboard = dashboard(
    "ibfm: port traffic and errors",
    "ibfm-ports",
    "Bandwidth, packets, utilization and PMA error counters of the picked switch ports (PerfManager totals).",
    rows([("Traffic", 8, _traffic), ("Errors", 9, _errors), ("Links", 10, _links)]),
    [switch_variable(M.DEVICE_UP), port_variable()],
)
