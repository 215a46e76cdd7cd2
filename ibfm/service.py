"""The daemon's composition root: transport, FabricManager, PerfManager and exporters in one asyncio loop.

:class:`Service` builds the pieces from :class:`~ibfm.settings.Settings`
and an aiohttp application whose ``cleanup_ctx`` owns the background
work, started in order and torn down in reverse:

1. the transport (opened first, closed last);
2. the sweep loop (``FabricManager.run``), stopped through its stop event;
3. the counter loop (PerfManager sweeps every ``perfmgr.interval`` s; on the
   emulated fabric the traffic is advanced by the wall-clock time first);
4. the MQTT publisher, when enabled.

After each heavy sweep the congestion model predicts ``congestion.pattern``
on the new routes (exported on ``/metrics``) and, on the emulated fabric,
``fabric.traffic``, whose per-port rates then drive the emulator's PMA
counters, so measured and predicted load agree.

Heavy sweeps re-bind the PerfManager and feed the sweep history of
``/metrics`` through the event bus. :func:`run_service` runs it all until
SIGTERM or SIGINT and returns 0. SIGHUP re-reads the partitions file
(``sm.partitions``) as ``POST /api/v1/partitions/reload`` does: a file that
parses is applied with a heavy sweep, one that does not is logged (file,
line, column) and the running partitions stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from exporters.heap import trim_heap
from exporters.http.admin import PREDICTION
from exporters.http.app import create_app
from exporters.http.common import ApiConfig
from exporters.http.partitions import RELOADER, NoPartitionsFile
from exporters.http.state import prepare_view
from fabric.emulator import EmulatedFabric
from fabric.errors import IbfmError
from fabric.model import Fabric
from fabric.traffic import XMIT_WAIT_TICK_HZ, PredictedTraffic, TrafficClock
from ibfm.settings import Settings
from sm.partitions.config import PartitionConfigError, load_partitions
from sm.sa.services import serve_port
from sm.sweep.events import EventBus, SweepDone, SweepFailed, _Event
from sm.sweep.manager import FabricManager, SmConfig, SubnetSnapshot
from sm.transport.base import WindowedTransport

log = logging.getLogger("ibfm.service")

STOP_TIMEOUT = 10.0
"""Seconds a background task gets to finish after the stop request before it is cancelled."""


# -- logging --------------------------------------------------------------------------------------------------

_STD_ATTRS = set(logging.LogRecord("x", 0, "x", 0, "x", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any ``extra=`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        d: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _STD_ATTRS and not k.startswith("_"):
                d[k] = v
        if record.exc_info:
            d["exception"] = self.formatException(record.exc_info)
        return json.dumps(d, default=str)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Root logging to stderr, as text lines or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(level)


# -- the service ------------------------------------------------------------------------------------------------


def build_fabric(settings: Settings) -> Fabric:
    """The emulated fabric: the topology file, or a generated fat-tree."""
    fs = settings.fabric
    if fs.topology is not None:
        from fabric.formats.netfile import read_net

        return read_net(fs.topology)
    from fabric.generate import fattree

    return fattree(fs.fattree_levels, fs.fattree_radix)


def sm_config(settings: Settings) -> SmConfig:
    s = settings.sm
    return SmConfig(
        engines=s.engine_chain,
        lmc=s.lmc,
        guid2lid=s.guid2lid,
        root_guids=s.root_guid_list,
        sweep_interval=s.sweep_interval,
        flap_max=s.flap_max,
        flap_window=s.flap_window,
        flap_hold=s.flap_hold,
        check_credit_loops=s.check_credit_loops,
        offload=s.offload,
        sm_priority=s.priority,
        sm_key=s.sm_key,
        sm_poll_interval=s.poll_interval,
        sm_poll_retries=s.poll_retries,
        partitions=load_partitions(s.partitions) if s.partitions is not None else None,
        part_enforce=s.part_enforce,
        **s.m_key_options(),
        qos=s.qos_config(),
    )


class Service:
    """Everything ``ibfm serve`` runs, wired together (nothing starts before :meth:`run`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.emulator: EmulatedFabric | None = None
        self.traffic: PredictedTraffic | None = None
        self._emu_clock: TrafficClock | None = None
        self.transport: WindowedTransport = self._open_transport()
        self.events = EventBus()
        self.manager = FabricManager(self.transport, sm_config(settings), self.events)
        # SMInfo for the election, the SA while master, Reports to its subscribers.
        self.services = serve_port(self.transport, self.manager)
        self.sa = self.services.sa
        self.perfmgr: Any = None
        self.sweep_stats: Any = None
        self.metrics: Any = None
        self.prediction: Any = None
        """The congestion model's report for ``congestion.pattern`` on the current routes (``/metrics``)."""
        self.mqtt: Any = None
        self._predict_task: asyncio.Task[None] | None = None
        self._wire_exporters()
        if settings.fabric.expected_topology is not None:
            from fabric.formats.netfile import read_net

            read_net(settings.fabric.expected_topology)  # a bad design file stops the daemon at start
        self.events.subscribe(self._on_event)
        token = settings.api.token.get_secret_value() if settings.api.token is not None else None
        self.app = create_app(
            self.manager,
            ApiConfig(
                token=token,
                expected_topology=settings.fabric.expected_topology,
                max_body_bytes=settings.api.max_body_bytes,
                partitions_file=settings.sm.partitions,
            ),
            perfmgr=self.perfmgr,
            metrics=self.metrics,
        )
        self.app.cleanup_ctx.extend([self._transport_ctx, self._sweep_ctx, self._perf_ctx, self._mqtt_ctx])
        self.app[PREDICTION] = lambda: (self.settings.congestion.pattern, self.prediction)
        self.address: tuple[str, int] | None = None
        self._last_traffic: Any = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def _open_transport(self) -> WindowedTransport:
        fs = self.settings.fabric
        if fs.transport == "umad":
            from sm.transport.umad import UmadTransport

            # An SM holds issm (IsSM set, traps delivered), answers SMInfo and serves the SA.
            return UmadTransport(fs.ca, fs.port, issm=True, serve_sa=True)
        from sm.transport.emulated import EmulatedTransport

        fabric = build_fabric(self.settings)
        self.traffic = PredictedTraffic(fabric)
        self.emulator = EmulatedFabric(fabric, traffic=self.traffic)
        self._emu_clock = TrafficClock(self.emulator)
        return EmulatedTransport(self.emulator, issm=True)

    def _wire_exporters(self) -> None:
        """PerfManager and the Prometheus renderer, where those modules are present."""
        if self.settings.perfmgr.enabled:
            from sm.perf.perfmgr import PerfManager

            emu = self.emulator
            clock = (lambda: emu.time) if emu is not None else time.monotonic
            self.perfmgr = PerfManager(self.transport, clock=clock)
        try:
            prom = importlib.import_module("exporters.prometheus")
        except ImportError:  # pragma: no cover - the exporter ships with ibfm
            log.warning("exporters.prometheus not available: /metrics not served")
            return
        self.sweep_stats = prom.SweepStats()
        self.renderer = prom.MetricsRenderer(self._metrics_inputs)
        self.metrics = prom.metrics_handler(self.renderer)
        self._prom = prom

    def _metrics_inputs(self) -> Any:
        role = self.manager.elector.role()
        st = self.sa.stats
        mgr = self.manager
        groups = mgr.mcast.groups if mgr.mcast is not None else {}
        sm = self._prom.SmFigures(
            int(role.state), role.priority, role.guid, role.master_guid, role.master_lid,
            st.received, st.records, st.busy + self.transport.stats.busy, st.dropped,
            m_key_traps=mgr.m_key_traps, mcast_groups=len(groups),
            mcast_members=sum(len(g.members) for g in groups.values()), mft_blocks_sent=mgr.mft_blocks_sent,
        )
        return self._prom.MetricsInputs(self.manager.snapshot, self.perfmgr, self.prediction, self.sweep_stats, sm)

    # -- events

    def _on_event(self, ev: _Event) -> None:
        kind = getattr(ev, "type", "event")
        if isinstance(ev, SweepDone) and ev.kind == "heavy":
            snap = self.manager.snapshot
            if snap is not None:
                if self.perfmgr is not None:
                    try:
                        self.perfmgr.bind(snap)
                    except IbfmError as e:
                        log.warning("perfmgr: cannot bind sweep %d: %s", snap.sweep, e)
                if self.sweep_stats is not None:
                    self.sweep_stats.record(snap, ev.duration_s)
                if self.mqtt is not None:
                    self.mqtt.publish_state(self._mqtt_mod.subnet_state(snap))
                self._start_prediction(snap)
                self._background(prepare_view(self.app, snap), "api-view")
            self._background(asyncio.to_thread(trim_heap), "malloc-trim")
        elif isinstance(ev, SweepFailed) and ev.stage != "light" and self.sweep_stats is not None:
            self.sweep_stats.record_failure()
        quiet = isinstance(ev, SweepDone) and ev.kind == "light"
        level = logging.DEBUG if quiet else logging.WARNING if kind in _WARN_EVENTS else logging.INFO
        if log.isEnabledFor(level):
            data = ev.model_dump(mode="json")
            log.log(level, "%s: %s", kind, _brief(data), extra={"event": data})

    def reload_partitions(self, via: str = "SIGHUP") -> None:
        """Re-read the partitions file in the background (on SIGHUP): applied with a heavy sweep, or, if it
        does not parse, logged with its file, line and column while the running partitions stay."""
        self._background(self._reload_partitions(via), "partitions-reload")

    async def _reload_partitions(self, via: str) -> None:
        with contextlib.suppress(NoPartitionsFile, PartitionConfigError):  # the reloader logged which
            await self.app[RELOADER].reload(via)

    def _background(self, coro: Any, name: str) -> None:
        """A short task that outlives the event sink; kept referenced until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_prediction(self, snap: SubnetSnapshot) -> None:
        """Predict the configured patterns on the new routes, in a worker thread (the previous run is dropped)."""
        metrics_spec = self.settings.congestion.pattern
        traffic_spec = self.settings.fabric.traffic if self.traffic is not None else ""
        if not metrics_spec and not traffic_spec:
            return
        if self._predict_task is not None:
            self._predict_task.cancel()
        self._predict_task = asyncio.get_running_loop().create_task(
            self._predict(snap, metrics_spec, traffic_spec), name="congestion-prediction"
        )

    async def _predict(self, snap: SubnetSnapshot, metrics_spec: str, traffic_spec: str) -> None:
        from sm.analysis.flowmodel import predict_congestion
        from sm.analysis.patterns import parse_pattern

        def one(spec: str) -> Any:
            pattern = parse_pattern(spec, snap.fabric, snap.lids)
            return predict_congestion(snap.fabric, snap.lids, snap.lft, pattern, tick_hz=XMIT_WAIT_TICK_HZ)

        for spec, use in ((traffic_spec, "traffic"), (metrics_spec, "metrics")):
            if not spec:
                continue
            reused = use == "metrics" and spec == traffic_spec and self._last_traffic is not None
            try:
                if reused:
                    report = self._last_traffic
                else:
                    report = await asyncio.to_thread(one, spec)
            except IbfmError as e:
                log.warning("congestion prediction for %s pattern %r on sweep %d: %s", use, spec, snap.sweep, e)
                continue
            if self.manager.snapshot is not snap:
                return  # a newer sweep will predict again
            if use == "traffic":
                assert self.traffic is not None
                if self.emulator is not None:
                    self._advance_emulator()  # counters up to now at the old rates
                self.traffic.update(report)
                self._last_traffic = report
            else:
                self.prediction = report
            if reused:
                continue  # the traffic's prediction, already reported: one line per prediction
            stats = report.flow_stats()
            uses = "traffic and metrics" if use == "traffic" and metrics_spec == traffic_spec else use
            log.info("predicted %s pattern %s on sweep %d: %d flows, %d unrouted, max utilization %.2f",
                     uses, spec, snap.sweep, stats["flows"], stats["unrouted"], stats["max_utilization"])

    def _advance_emulator(self) -> None:
        """Let the emulated traffic flow up to now."""
        if self._emu_clock is not None:
            self._emu_clock.advance_to(asyncio.get_running_loop().time())

    # -- background work, in cleanup_ctx order

    async def _transport_ctx(self, app: web.Application) -> AsyncIterator[None]:
        self.transport.start()
        try:
            yield
        finally:
            self.services.close()
            await self.transport.close()

    async def _sweep_ctx(self, app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(self.manager.run(stop), name="sweep-loop")
        try:
            yield
        finally:
            stop.set()
            await _finish(task, "sweep loop")
            if self._predict_task is not None:
                self._predict_task.cancel()
                await _finish(self._predict_task, "congestion prediction")
            for t in list(self._tasks):
                t.cancel()
                await _finish(t, t.get_name())

    async def _perf_ctx(self, app: web.Application) -> AsyncIterator[None]:
        if self.perfmgr is None:
            yield
            return
        task = asyncio.create_task(self._perf_loop(), name="perfmgr-loop")
        try:
            yield
        finally:
            task.cancel()
            await _finish(task, "perfmgr loop")

    async def _perf_loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.settings.perfmgr.interval
        self._advance_emulator()
        while True:
            t0 = loop.time()
            self._advance_emulator()
            if self.perfmgr.fabric is not None:
                try:
                    rep = await self.perfmgr.sweep()
                except IbfmError as e:
                    log.warning("perfmgr sweep failed: %s", e)
                else:
                    log.debug("perfmgr sweep %d: %d of %d ports read in %.3f s", rep.sweep, rep.ports_read,
                              rep.ports, rep.duration)
            await asyncio.sleep(max(0.05, interval - (loop.time() - t0)))

    async def _mqtt_ctx(self, app: web.Application) -> AsyncIterator[None]:
        """The MQTT publisher: events as they come, the retained subnet state after each heavy sweep."""
        m = self.settings.mqtt
        if not m.enabled:
            yield
            return
        mod = importlib.import_module("exporters.mqtt")
        pub = mod.MqttPublisher(host=m.host, port=m.port, subnet=m.subnet)
        self._mqtt_mod = mod
        self.mqtt = pub
        unsubscribe = self.events.subscribe(pub.on_event)
        pub.publish_state(mod.subnet_state(self.manager.snapshot))
        stop = asyncio.Event()
        task = asyncio.create_task(pub.run(stop), name="mqtt")
        log.info("publishing to MQTT broker %s:%d as ibfm/%s", m.host, m.port, m.subnet)
        try:
            yield
        finally:
            unsubscribe()
            self.mqtt = None
            stop.set()
            await _finish(task, "mqtt publisher")

    # -- running

    async def run(self, stop: asyncio.Event, *, started: Callable[[tuple[str, int]], None] | None = None) -> None:
        """Serve until ``stop`` is set, then tear everything down."""
        s = self.settings
        runner = web.AppRunner(self.app, access_log=logging.getLogger("aiohttp.access") if s.log.access_log else None,
                               handle_signals=False)
        await runner.setup()
        try:
            site = web.TCPSite(runner, s.listen_host, s.listen_port)
            try:
                await site.start()
            except OSError as e:
                raise IbfmError(f"cannot listen on {s.listen}: {e.strerror or e}") from None
            addr = _bound_address(runner, s)
            self.address = addr
            log.info("listening on http://%s:%d%s (fabric: %s)", _fmt_host(addr[0]), addr[1], "/api/v1",
                     self._fabric_text(), extra={"listen": f"{addr[0]}:{addr[1]}"})
            if started is not None:
                started(addr)
            await stop.wait()
            log.info("stopping")
        finally:
            await runner.cleanup()
        log.info("stopped")

    def _fabric_text(self) -> str:
        fs = self.settings.fabric
        if fs.transport == "umad":
            return f"umad {fs.ca or '(first CA)'}/{fs.port or '(first active port)'}"
        if fs.topology is not None:
            return f"emulated from {fs.topology}"
        return f"emulated {fs.fattree_levels}-level fat-tree, radix {fs.fattree_radix}"


_WARN_EVENTS = {"link_down", "node_removed", "port_held_down", "routing_failed", "credit_loop_found", "sweep_failed"}


def _brief(d: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("type", "time"))


def _fmt_host(h: str) -> str:
    return f"[{h}]" if ":" in h else h


def _bound_address(runner: web.AppRunner, s: Settings) -> tuple[str, int]:
    for a in runner.addresses:
        if isinstance(a, tuple) and len(a) >= 2:
            return str(a[0]), int(a[1])
    return s.listen_host, s.listen_port


async def _finish(task: asyncio.Task[Any], what: str) -> None:
    """Wait for a background task to end; cancel it after STOP_TIMEOUT; log a failure."""
    try:
        await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT)
    except TimeoutError:
        log.warning("%s did not stop within %.0f s; cancelling", what, STOP_TIMEOUT)
        task.cancel()
    except asyncio.CancelledError:
        if not task.done():
            task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        try:
            await task
        except Exception:
            log.exception("%s failed", what)


def run_service(settings: Settings, *, on_service: Callable[[Service], None] | None = None) -> int:
    """Run the daemon until SIGTERM or SIGINT (SIGHUP re-reads the partitions file); 0 on a clean stop.

    ``on_service`` sees the service once it is built, before it runs (the progress display watches its
    manager)."""
    configure_logging(settings.log.level, settings.log.format)
    service = Service(settings)
    if on_service is not None:
        on_service(service)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGHUP, service.reload_partitions)
        try:
            await service.run(stop)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    asyncio.run(main())
    return 0
