"""Congestion: measured XmitWait and utilization beside what the congestion model predicts, and the hot links."""

from __future__ import annotations

from dashboards.common import (
    dashboard,
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

LINK = "{{name}} [{{port}}] -> {{remote_name}} [{{remote_port}}]"


def utilization() -> str:
    """Measured transmit utilization: bytes per second over the link's data rate (links that are up)."""
    return f"{rate(M.PORT_XMIT_DATA)} / ({series(M.PORT_RATE_BYTES)} > 0)"


_picked = [
    (
        timeseries(
            "XmitWait: measured and predicted",
            [
                target(picked(rate(M.PORT_XMIT_WAIT)), f"{LINK} measured"),
                target(picked(series(M.PORT_PREDICTED_XMIT_WAIT)), f"{LINK} predicted"),
            ],
            description="XmitWait ticks per second: the PMA counter's rate beside the congestion model's figure.",
            legend_table=True,
        ),
        12,
    ),
    (
        timeseries(
            "Utilization: measured and predicted",
            [
                target(picked(utilization()), f"{LINK} measured"),
                target(picked(series(M.PORT_PREDICTED_UTILIZATION)), f"{LINK} predicted"),
            ],
            unit="percentunit",
            legend_table=True,
        ),
        12,
    ),
    (
        timeseries(
            "Utilization: measured minus predicted",
            [target(picked(f"{utilization()} - {series(M.PORT_PREDICTED_UTILIZATION)}"), LINK)],
            unit="percentunit",
            description="Positive: the link carries more than the model expects from the routes.",
        ),
        24,
    ),
]

_fabric = [
    (
        stat(
            "Fabric XmitWait",
            [target(f"sum({rate(M.PORT_XMIT_WAIT)})")],
            description="XmitWait ticks per second, summed over every port.",
        ),
        6,
    ),
    (
        stat(
            "Fabric XmitWait, predicted",
            [target(f"sum({series(M.PORT_PREDICTED_XMIT_WAIT)})")],
        ),
        6,
    ),
    (
        stat(
            "Busiest link, measured",
            [target(f"max({utilization()})")],
            unit="percentunit",
            thresholds=[(None, "green"), (0.7, "orange"), (0.9, "red")],
        ),
        6,
    ),
    (
        stat(
            "Busiest link, predicted",
            [target(f"max({series(M.PORT_PREDICTED_UTILIZATION)})")],
            unit="percentunit",
            thresholds=[(None, "green"), (0.7, "orange"), (0.9, "red")],
        ),
        6,
    ),
]

_hot = [
    (
        table(
            "Hot links by measured utilization",
            [target(f"topk(10, {named(utilization())})", instant=True, table=True)],
            unit="percentunit",
        ),
        8,
    ),
    (
        table(
            "Hot links by predicted utilization",
            [target(f"topk(10, {named(series(M.PORT_PREDICTED_UTILIZATION))})", instant=True, table=True)],
            unit="percentunit",
        ),
        8,
    ),
    (
        table(
            "Hot links by measured XmitWait",
            [target(f"topk(10, {named(rate(M.PORT_XMIT_WAIT))})", instant=True, table=True)],
            description="XmitWait ticks per second.",
        ),
        8,
    ),
    (
        timeseries(
            "Hot links over time (measured utilization)",
            [target(f"topk(5, {named(utilization())})", LINK)],
            unit="percentunit",
            legend_table=True,
        ),
        24,
    ),
]

dashboard = dashboard(
    "ibfm: congestion",
    "ibfm-congestion",
    "Measured XmitWait and utilization next to the congestion model's prediction for the current routes.",
    rows([("Fabric", 4, _fabric), ("Hot links", 9, _hot), ("Picked ports", 9, _picked)]),
    [switch_variable(M.DEVICE_UP), port_variable()],
)
