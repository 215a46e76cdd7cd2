"""Building blocks shared by the ``*.dashboard.py`` files: data source, variables, PromQL, panels, layout.

Every query is built from a :class:`exporters.metrics.MetricDef`, never from a
typed-in name, so a renamed metric breaks the dashboards' build and tests
rather than a panel in production.

Per-port series carry only ``guid`` and ``port``; names, the far end and
the link's role come from ``ibfm_port_info`` by a join (:func:`picked`,
:func:`named`): ``expr * on(guid, port) group_left(name, ...) ibfm_port_info``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attr
from grafanalib.core import (
    Dashboard,
    GridPos,
    Panel,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

from exporters import metrics as M
from exporters.metrics import MetricDef, MetricType

DATASOURCE_UID = "ibfm-prometheus"
"""UID of the Prometheus data source in ``dashboards/provisioning/datasources/ibfm.yaml``."""

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
"""Panels and variables query the data source picked in the ``datasource`` variable."""

SCHEMA_VERSION = 37
"""Grafana 9 dashboard schema."""

RATE = "$__rate_interval"
SWITCH_SELECTOR = 'type="switch"'
PICKED_SWITCHES = 'name=~"$switch"'
PORT_SELECTOR = 'name=~"$switch",port=~"$port"'
"""The ports picked in the ``switch`` and ``port`` variables: a selector of ``ibfm_port_info``."""
PORT_JOIN = "guid, port"
"""The labels a per-port series and its ``ibfm_port_info`` share."""
INFO_LABELS = "name, remote_name, remote_port, role"
"""The labels a join copies from ``ibfm_port_info`` (legends and tables use them)."""

_REFRESH_ON_TIME_RANGE = 2
_SORT_ALPHA = 1
_SORT_NUMERIC = 3


def series(m: MetricDef, selector: str = "", suffix: str = "") -> str:
    """A vector selector: ``name{selector}``; ``suffix`` picks ``_bucket``/``_sum``/``_count`` of a histogram."""
    if suffix and m.type != MetricType.HISTOGRAM:
        raise ValueError(f"{m.name} is a {m.type}, not a histogram: no {suffix}")
    name = m.name + suffix
    return f"{name}{{{selector}}}" if selector else name


def rate(m: MetricDef, selector: str = "", suffix: str = "", window: str = RATE) -> str:
    """``rate()`` of a counter (or of a histogram's series)."""
    if m.type == MetricType.GAUGE:
        raise ValueError(f"rate() of gauge {m.name}")
    return f"rate({series(m, selector, suffix)}[{window}])"


def increase(m: MetricDef, selector: str = "", window: str = "$__range") -> str:
    if m.type != MetricType.COUNTER:
        raise ValueError(f"increase() of {m.type} {m.name}")
    return f"increase({series(m, selector)}[{window}])"


def named(expr: str, info_selector: str = "") -> str:
    """A per-port expression with the names of its ports: joined onto ``ibfm_port_info`` (value 1, so the
    values stay), keeping the ports ``info_selector`` picks."""
    return f"({expr}) * on({PORT_JOIN}) group_left({INFO_LABELS}) {series(M.PORT_INFO, info_selector)}"


def picked(expr: str) -> str:
    """A per-port expression on the ports picked in the ``switch`` and ``port`` variables, with their names."""
    return named(expr, PORT_SELECTOR)


def target(expr: str, legend: str = "", *, instant: bool = False, table: bool = False) -> Target:
    """A Prometheus query; refIds are given by :func:`panel_targets`."""
    return Target(
        expr=expr,
        legendFormat=legend,
        instant=instant,
        format="table" if table else "time_series",
        datasource=DATASOURCE,
        intervalFactor=1,
    )


def panel_targets(targets: Sequence[Target]) -> list[Target]:
    return [attr.evolve(t, refId=chr(ord("A") + i)) for i, t in enumerate(targets)]


def timeseries(
    title: str,
    targets: Sequence[Target],
    unit: str = "short",
    *,
    description: str = "",
    stacked: bool = False,
    legend_table: bool = False,
) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=panel_targets(targets),
        unit=unit,
        fillOpacity=20 if stacked else 0,
        stacking={"mode": "normal", "group": "A"} if stacked else {},
        legendDisplayMode="table" if legend_table else "list",
        legendPlacement="right" if legend_table else "bottom",
        legendCalcs=["lastNotNull", "max"] if legend_table else [],
        tooltipMode="multi",
    )


def stat(
    title: str,
    targets: Sequence[Target],
    unit: str = "none",
    *,
    description: str = "",
    text_mode: str = "auto",
    mappings: list[dict[str, object]] | None = None,
    thresholds: list[tuple[float | None, str]] | None = None,
) -> Stat:
    steps = thresholds or [(None, "green")]
    return Stat(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=panel_targets(targets),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
        textMode=text_mode,
        mappings=mappings or [],
        thresholds=[{"color": color, "value": value} for value, color in steps],
    )


def table(title: str, targets: Sequence[Target], unit: str = "short", *, description: str = "") -> Table:
    """An instant table; several targets are merged on their labels."""
    return Table(
        title=title,
        description=description or None,
        dataSource=DATASOURCE,
        targets=panel_targets(targets),
        unit=unit,
        filterable=True,
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ],
    )


def value_map(values: dict[int, tuple[str, str]]) -> list[dict[str, object]]:
    """Grafana value mappings: value -> (text, color)."""
    options = {str(k): {"text": t, "color": c, "index": i} for i, (k, (t, c)) in enumerate(values.items())}
    return [{"type": "value", "options": options}]


def datasource_variable() -> Template:
    return Template(
        name="datasource", label="Data source", query="prometheus", type="datasource", default=DATASOURCE_UID
    )


def _all_by_default(t: Template) -> Template:
    t._current = {"selected": True, "text": "All", "value": "$__all"}
    return t


def switch_variable(switches_from: MetricDef) -> Template:
    """Switches by name, from a per-device metric's ``type`` label."""
    return _all_by_default(Template(
        name="switch",
        label="Switch",
        query=f"label_values({series(switches_from, SWITCH_SELECTOR)}, name)",
        dataSource=DATASOURCE,
        includeAll=True,
        multi=True,
        allValue=".*",
        refresh=_REFRESH_ON_TIME_RANGE,
        sort=_SORT_ALPHA,
    ))


def port_variable(ports_from: MetricDef = M.PORT_INFO) -> Template:
    """Port numbers of the picked switches, from ``ibfm_port_info`` (the per-port series that has names)."""
    return _all_by_default(Template(
        name="port",
        label="Port",
        query=f"label_values({series(ports_from, PICKED_SWITCHES)}, port)",
        dataSource=DATASOURCE,
        includeAll=True,
        multi=True,
        allValue=".*",
        refresh=_REFRESH_ON_TIME_RANGE,
        sort=_SORT_NUMERIC,
    ))


def rows(layout: Sequence[tuple[str | None, int, Sequence[tuple[Panel, int]]]]) -> list[Panel]:
    """Lay panels out on the 24-column grid: ``(row title or None, height, [(panel, width), ...])``."""
    out: list[Panel] = []
    y = 0
    for title, height, panels in layout:
        if title is not None:
            out.append(RowPanel(title=title, gridPos=GridPos(h=1, w=24, x=0, y=y)))
            y += 1
        x = 0
        for panel, width in panels:
            if x + width > 24:
                x, y = 0, y + height
            out.append(attr.evolve(panel, gridPos=GridPos(h=height, w=width, x=x, y=y)))
            x += width
        y += height
    return out


def dashboard(
    title: str, uid: str, description: str, panels: list[Panel], variables: Sequence[Template] = ()
) -> Dashboard:
    return Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=["ibfm", "infiniband"],
        panels=panels,
        templating=Templating(list=[datasource_variable(), *variables]),
        time=Time("now-1h", "now"),
        refresh="30s",
        schemaVersion=SCHEMA_VERSION,
        timezone="browser",
        graphTooltip=1,
    ).auto_panel_ids()
