"""Fabric overview: is the subnet up, what it holds, how the heavy and counter sweeps go."""

from __future__ import annotations

from dashboards.common import dashboard, rate, rows, series, stat, table, target, timeseries, value_map
from exporters import metrics as M

_UP = value_map({0: ("DOWN", "red"), 1: ("UP", "green")})

_subnet = [
    (
        stat(
            "Subnet",
            [target(series(M.SUBNET_UP))],
            description="Routes verified and every switch programmed by the last heavy sweep.",
            mappings=_UP,
            thresholds=[(None, "red"), (1, "green")],
        ),
        4,
    ),
    (
        stat(
            "Routing engine",
            [target(series(M.ROUTING_ENGINE), "{{engine}}")],
            text_mode="name",
            description="The engine that computed the current LFTs (ftree, updn, minhop ...).",
        ),
        4,
    ),
    (
        stat(
            "Credit loops",
            [target(series(M.CREDIT_LOOPS))],
            thresholds=[(None, "green"), (1, "red")],
            description="Cycles in the channel dependency graph of the current routes: 0 means deadlock-free.",
        ),
        4,
    ),
    (
        stat(
            "Unreachable routes",
            [target(series(M.UNREACHABLE_ROUTES))],
            thresholds=[(None, "green"), (1, "red")],
            description="Connected (source port, destination LID) pairs whose route fails.",
        ),
        4,
    ),
    (
        stat(
            "Devices down",
            [target(f"count({series(M.DEVICE_UP)} == 0) or vector(0)")],
            thresholds=[(None, "green"), (1, "red")],
            description="Devices of the last heavy sweep whose counters did not answer the last counter sweep.",
        ),
        4,
    ),
    (
        stat(
            "Since last heavy sweep",
            [target(f"time() - {series(M.LAST_SWEEP_TIMESTAMP)}")],
            unit="s",
        ),
        4,
    ),
]

_inventory = [
    (timeseries("Nodes by type", [target(series(M.NODES), "{{type}}")]), 8),
    (timeseries("Ports by state", [target(series(M.PORTS), "{{state}}")], stacked=True), 8),
    (timeseries("Links by state", [target(series(M.LINKS), "{{state}}")], stacked=True), 8),
]

_sweep_bucket_rate = f"sum by (le) ({rate(M.SWEEP_DURATION, suffix='_bucket')})"
_sweeps = [
    (
        timeseries(
            "Heavy sweep duration",
            [
                target(f"histogram_quantile(0.5, {_sweep_bucket_rate})", "p50"),
                target(f"histogram_quantile(0.9, {_sweep_bucket_rate})", "p90"),
                target(
                    f"{rate(M.SWEEP_DURATION, suffix='_sum')} / {rate(M.SWEEP_DURATION, suffix='_count')}", "mean"
                ),
            ],
            unit="s",
        ),
        8,
    ),
    (
        timeseries(
            "Stages of the last heavy sweep",
            [target(series(M.SWEEP_PHASE_DURATION), "{{phase}}")],
            unit="s",
            stacked=True,
        ),
        8,
    ),
    (
        timeseries(
            "Heavy sweeps per minute",
            [
                target(f"60 * {rate(M.SWEEP_DURATION, suffix='_count')}", "done"),
                target(f"60 * {rate(M.SWEEP_FAILURES)}", "failed"),
            ],
        ),
        8,
    ),
    (
        timeseries(
            "LFT blocks per second",
            [target(rate(M.LFT_BLOCKS_SENT), "sent"), target(rate(M.LFT_BLOCKS_SKIPPED), "already held")],
            unit="ops",
            description="64-LID LinearForwardingTable blocks: only those that changed are sent.",
        ),
        12,
    ),
    (timeseries("SMPs per second (heavy sweeps)", [target(rate(M.SWEEP_SMPS), "SMPs")], unit="ops"), 12),
]

_counters = [
    (
        stat(
            "Since last counter sweep",
            [target(f"time() - {series(M.PERFMGR_LAST_SWEEP_TIMESTAMP)}")],
            unit="s",
        ),
        4,
    ),
    (stat("Ports read", [target(series(M.PERFMGR_PORTS_READ))]), 4),
    (timeseries("Counter sweep duration", [target(series(M.PERFMGR_SWEEP_DURATION), "duration")], unit="s"), 8),
    (
        timeseries(
            "PerfMgt errors and timeouts per second",
            [
                target(f"sum({rate(M.DEVICE_COLLECTION_ERRORS)})", "errors"),
                target(f"sum({rate(M.DEVICE_COLLECTION_TIMEOUTS)})", "timeouts"),
            ],
            unit="ops",
        ),
        8,
    ),
    (
        timeseries(
            "Fabric traffic",
            [
                target(f"sum({rate(M.PORT_XMIT_DATA)})", "transmit"),
                target(f"sum({rate(M.PORT_RCV_DATA)})", "receive"),
            ],
            unit="Bps",
            description="Sum over every port: each byte on a link counts at both ends.",
        ),
        12,
    ),
    (
        table(
            "Devices, least healthy first",
            [target(f"bottomk(20, {series(M.DEVICE_UP)})", instant=True, table=True)],
            description="ibfm_device_up: 0 for a device whose counters did not answer the last counter sweep.",
        ),
        12,
    ),
]

dashboard = dashboard(
    "ibfm: fabric overview",
    "ibfm-overview",
    "Subnet state, inventory, heavy sweeps and counter sweeps of one ibfm-managed InfiniBand subnet.",
    rows(
        [
            ("Subnet", 4, _subnet),
            ("Inventory", 8, _inventory),
            ("Heavy sweeps", 8, _sweeps),
            ("Counter sweeps", 8, _counters),
        ]
    ),
)
