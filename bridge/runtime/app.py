"""The whole daemon: one shared target connection, one ``SourceRunner`` per source, signals, health, reload.

Sources are isolated: each runner has its own engine, subscriptions, ack inbox and effect executor, so one blocked
source (target rejects its messages, origin unreachable) never stalls another. They share the target connection
because publishes are small writes on one socket and the target is one server (or cluster), and the sources that
reach the same origin servers with the same credentials share one origin connection (``bridge.io.shared``: in the
sidecar position, every source reaches its leaf through the hub), with errors routed to the source they name.

Tasks, all owned by :meth:`Bridge.run`'s task group: signal handling (SIGTERM/SIGINT stop, SIGHUP reload), the
HTTP listener (``/metrics``, ``/healthz``, ``/readyz``), the systemd watchdog and readiness report, and one task
per source runner, each with its own stop event, so that a reload can stop one source without touching the others;
and the heap keeper (``bridge.runtime.heap``: what survives a full collection is frozen).
"""

from __future__ import annotations

import shlex
import signal
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from anyio.abc import TaskGroup
from nats.aio.client import Client as NATS

from bridge import CORE_BUILD
from bridge.config.loading import read_toml
from bridge.config.registry import FILE, Merged, RegistryEntry, merge
from bridge.core.backoff import Backoff
from bridge.core.budget import PublishBudget
from bridge.core.fleet import Fence
from bridge.core.window import WindowBudget
from bridge.errors import BridgeError, ConfigError, TargetUnavailable
from bridge.io import wire
from bridge.io.aggregate import TargetSide, duplicate_window_short
from bridge.io.connect import (
    ConnectionSettings,
    close_connection,
    drop_unsent_publishes,
    error_fields,
    open_connection,
)
from bridge.io.jsapi import STREAM_NOT_FOUND, ApiError, ApiTimeout, ApiUnavailable, JsApi, PermissionDenied
from bridge.io.kv import KvBucket
from bridge.io.registry import RegistryBucket
from bridge.io.shared import OriginConnections
from bridge.logs import Throttle, get_logger
from bridge.observe.http import HttpServer, ListenError, Response, json_response, metrics_handler, parse_listen
from bridge.observe.metrics import BridgeSnapshot, Metrics
from bridge.observe.systemd import Notifier, watchdog_loop
from bridge.runtime.flag import Flag
from bridge.runtime.fleet import FleetRunner, SourceControl
from bridge.runtime.fleet_thread import FleetThread
from bridge.runtime.heap import HeapKeeper
from bridge.runtime.readiness import readyz, status_line, waiting_for
from bridge.runtime.registry import RegistryWatcher
from bridge.runtime.reload import plan_reload
from bridge.runtime.retry import RetryPolicy, RetryStep, retry_until_stopped
from bridge.runtime.scouts import ReachGate
from bridge.runtime.signals import take_held
from bridge.runtime.source import QUIET_TICKS, TICK, SourceRunner
from bridge.runtime.ticker import Ticker
from bridge.runtime.waits import WaitLog

if TYPE_CHECKING:
    from bridge.config import BridgeConfig, SourceConfig

# a first connect that keeps failing the same way is logged at most every 30 s
CONNECT_RETRY = RetryPolicy(Backoff(0.5, 15.0))


LOOP_BEAT = 1.0  # how often the event loop proves it is responsive (for /healthz and the systemd watchdog)
LOOP_STALE = 10.0  # /healthz fails when the loop has not ticked for this long
# READY=1 goes to systemd once the target and every source are connected and bound, or after this long with the
# ones still waiting named in STATUS: an edge that is down at boot must not turn into a start-timeout restart loop
# (the unit's TimeoutStartSec is 90 s); /readyz keeps saying which source is not replicating.
READY_WAIT = 60.0


class _SourceTask:
    """A running source: its runner, the event that stops it, and the event set once it has finished."""

    def __init__(self, runner: SourceRunner, fence: Fence | None) -> None:
        self.runner = runner
        self.fence = fence  # with leases: the fence of the term it was started in
        self.stop = Flag()
        self.done = Flag()


class Bridge:
    """Runs every configured source until ``stop`` is set (or SIGTERM/SIGINT with ``handle_signals``).

    ``config_path`` is where SIGHUP re-reads the configuration from (no reload, and no registry sources, without
    it), ``file_data`` its contents as ``config`` was built from them (read from ``config_path`` at the start when
    not given); ``environ`` what its ``NATS_BRIDGE_*`` variables are read from (``os.environ`` by default);
    ``notifier`` reports to systemd (from the environment by default: a no-op outside systemd).
    """

    def __init__(
        self,
        config: BridgeConfig,
        *,
        config_path: Path | None = None,
        file_data: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.environ = environ
        # the file as loaded (and at each reload): registry changes are validated against it, not against the disk
        self._file_data: dict[str, Any] | None = dict(file_data) if file_data is not None else None
        self._registry: list[RegistryEntry] = []  # the source registry as last read
        self.provenance = {s.name: FILE for s in config.sources}  # source name -> "file" or "registry"
        self.refused: dict[str, list[str]] = {}  # registry sources this process cannot run, and why
        self._applying = anyio.Lock()  # one reload or registry change applied at a time
        self._configured = {s.name: s for s in config.sources}  # by name: a thousand starts look one up each
        self.config_path = config_path
        self.notifier = notifier if notifier is not None else Notifier.from_env()
        self.stop = anyio.Event()
        self.metrics = Metrics()
        self.metrics.read_from(self.snapshot)
        self.http_port: int | None = None  # bound port of the HTTP listener, once it listens
        self.log = get_logger(component="bridge")
        self._ticker = Ticker(TICK, QUIET_TICKS)  # every source's clock, one task (a quiet one once a second)
        self._heap = HeapKeeper()  # long-lived objects out of the full collections' way (bridge.runtime.heap)
        self._api: anyio.CapacityLimiter | None = None  # made in run(): the sources' API requests in flight
        self._windows: WindowBudget | None = None  # made in run(): the bytes every source's grown window may hold
        self._publishes: PublishBudget | None = None  # made in run(): every source's publishes in flight together
        self._reach = ReachGate()  # the origins in doubt after their sources went silent: resets scout them first
        self._origins = OriginConnections()  # one connection per distinct origin settings, shared by its sources
        self._target_nc: NATS | None = None
        self._side: TargetSide | None = None
        self._tasks: dict[str, _SourceTask] = {}
        self._sources_tg: TaskGroup | None = None
        self._error_throttle = Throttle()
        self._coordination_throttle = Throttle()
        self._loop_beat = time.monotonic()
        self.fleet: FleetThread | None = None  # with coordination enabled: who owns which source
        self._kv_nc: NATS | None = None  # the fleet's connection (it lives on the fleet's thread and loop)
        # for the stop summary (bridge.stopped): when it started, why it stops, and what the runners that ended did
        self.started_at = time.monotonic()
        self.stop_reason = ""
        self.config_error: str | None = None  # a setting the servers turned out not to support (exit code 2)
        self._stopped_logged = False
        self._closing = False  # the connections are being closed on purpose: no "disconnected" lines
        self._ended: dict[str, dict[str, Any]] = {}
        # per source, what it waits for before it has a runner (the target not connected yet)
        self._unstarted_waits: dict[str, WaitLog] = {}

    @property
    def runners(self) -> list[SourceRunner]:
        """The running sources' runners, in configuration order."""
        return [task.runner for task in self._tasks.values()]

    async def run(
        self, *, handle_signals: bool = True, on_started: Callable[[Bridge], Coroutine[Any, Any, None]] | None = None
    ) -> None:
        """Replicate until stopped; returns after every source drained."""
        # the listener binds before anything is connected: an address that cannot be used stops the start (exit 2
        # in `run`), rather than a daemon running without its health and metrics endpoints
        server = await self._bind_http() if self.config.http.listen else None
        self._api = anyio.CapacityLimiter(self.config.engine.api_requests_in_flight)
        self._windows = WindowBudget(self.config.engine.windows_budget)  # every source's grown window together
        # the hub's queue of this process's publishes kept near a quarter of the ack timeout (bridge/core/budget.py)
        self._publishes = PublishBudget(self.config.engine.publishes_in_flight, self.config.target.ack_timeout / 4)
        if self._file_data is None and self.config_path is not None:
            try:
                self._file_data = read_toml(self.config_path)
            except ConfigError as err:  # gone since it was loaded: reloads and the registry wait for it
                self.log.warning("config.unreadable", problems=list(err.problems), hint="reload once it is back")
        if not self.config.sources:
            self.log.warning(
                "bridge.no_sources",
                hint="the file has no [[sources]]: the registry's are taken up once read (nats-bridge sources add)",
            )
        missing = wire.missing_hooks()
        if missing:
            self.log.warning(
                "wire.fast_path_unavailable",
                missing=missing,
                nats_py=version("nats-py"),
                hint="this nats-py lacks internals the fast wire path uses; replicating through nats-py's public "
                "API instead (correct, slower): install the nats-py version pyproject.toml allows",
            )
        async with anyio.create_task_group() as tg:
            if handle_signals:
                tg.start_soon(self._signals)
            tg.start_soon(self._beat)
            tg.start_soon(watchdog_loop, self.notifier, self._loop_healthy)
            tg.start_soon(self._report_ready)
            tg.start_soon(self._announce_stopping)
            tg.start_soon(self._ticker.run)
            tg.start_soon(self._heap.run)
            if server is not None:
                tg.start_soon(self._serve_http, server)
            nc = await self._connect_target()
            if nc is None:  # stopped before the target was reachable
                tg.cancel_scope.cancel()
                self.log_stopped()
                return
            target = self.config.target
            self._side = side = TargetSide(
                nc=nc,
                api=JsApi(nc, target.api_prefix),
                stream=target.stream,
                publish_window=target.publish_window,
                ack_timeout=target.ack_timeout,
                timeout=self.config.engine.reset_timeout,
            )
            await self._check_target_stream(side)
            async with anyio.create_task_group() as sources:
                self._sources_tg = sources
                if self.config.coordination.enabled:
                    sources.start_soon(self._run_fleet, side)
                else:
                    for source in self.config.sources:
                        self._start_source(source)
                    sources.start_soon(self._stop_sources_on_stop)
                if on_started is not None:
                    sources.start_soon(on_started, self)
            self._sources_tg = None
            tg.cancel_scope.cancel()
        self._closing = True
        if self._target_nc is not None:
            with anyio.CancelScope(shield=True):
                failed = await close_connection(self._target_nc)
                if failed is not None:  # closing a dead connection; nothing left to lose
                    self.log.debug("target.close_failed", error=failed)
        self.log_stopped()

    # -- the stop summary ---------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per configured source, what this process did with it: the stored watermark (None if it was never read
        back from the aggregate), the messages it replicated (over every runner it had, reloads and lease
        changes included), and what it still waited for; sources it never ran are listed apart."""
        sources: dict[str, dict[str, Any]] = {name: dict(totals) for name, totals in self._ended.items()}
        for task in self._tasks.values():
            if not task.done.is_set():  # still running (a stop cut short): its numbers so far
                self._add_run(sources, task.runner)
        configured = self._names()
        known = set(configured)  # a set: at a thousand sources a list looked up per name cost seconds at shutdown
        names = configured + [n for n in sources if n not in known]
        summary: dict[str, Any] = {
            "sources": {name: sources[name] for name in names if name in sources},
            "not_started": [name for name in configured if name not in sources],
        }
        if self._target_nc is None:
            summary["target"] = "never connected"
        return summary

    def _names(self) -> list[str]:
        return [s.name for s in self.config.sources]

    @staticmethod
    def _add_run(into: dict[str, dict[str, Any]], runner: SourceRunner) -> None:
        snap = runner.snapshot()
        earlier = into.get(snap.source, {})
        watermark = snap.watermark if runner.recovered else earlier.get("watermark")
        entry: dict[str, Any] = {
            "watermark": watermark,
            "replicated": int(earlier.get("replicated", 0)) + snap.replicated_messages,
        }
        if runner.waits.reasons:
            entry["waiting_for"] = runner.waits.reasons
        into[snap.source] = entry

    def log_stopped(self, exit_code: int = 0, reason: str | None = None) -> None:
        """Log ``bridge.stopped`` once: why, after how long, each source's watermark and count, the exit code."""
        if self._stopped_logged:
            return
        self._stopped_logged = True
        reason = reason or self.stop_reason or "stopped"
        level = "info" if exit_code == 0 else "error"
        getattr(self.log, level)(
            "bridge.stopped",
            reason=reason,
            exit_code=exit_code,
            uptime_seconds=round(time.monotonic() - self.started_at, 3),
            **self.summary(),
        )

    async def _signals(self) -> None:
        try:
            await self._receive_signals()
        finally:
            if self.stop.is_set():
                # the receiver is gone (it leaves the default action, which kills): from here to the exit, a repeated
                # SIGTERM or SIGINT must not turn the drain's exit code into a death by signal
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def _receive_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as received:
            for signum in take_held():  # a stop asked for before the receiver was there (bridge.runtime.signals)
                self._stop_signal(signum)
            async for signum in received:
                if signum == signal.SIGHUP:
                    self.log.info("bridge.reloading", signal="SIGHUP", config=str(self.config_path))
                    await self.reload()
                    continue
                # the handler stays installed while draining: the default action would kill us mid-drain
                self._stop_signal(signum)

    def _stop_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.stop.is_set():
            self.log.info("bridge.already_stopping", signal=name)
            return
        self.log.info("bridge.stopping", signal=name)
        self.stop_reason = f"signal {name}"
        self.stop.set()

    # -- sources ------------------------------------------------------------------------------------------

    def _start_source(self, source: SourceConfig, fence: Fence | None = None) -> None:
        assert self._sources_tg is not None and self._side is not None
        runner = SourceRunner(
            source,
            self.config.engine,
            self._side,
            observers=self.metrics.observers(source.name),
            stalled_after=self.config.http.stalled_after,
            fence=fence,
            on_config_error=self._config_error,
            ticker=self._ticker,
            api=self._api,
            connections=self._origins,
            windows=self._windows,
            publishes=self._publishes,
            reach=self._reach,
        )
        task = _SourceTask(runner, fence)
        self._tasks[source.name] = task
        self._sources_tg.start_soon(self._run_source, task)

    def _publishes_freed(self) -> None:
        """Wake the sources that stopped for want of room among the publishes in flight (``PublishBudget``), longest
        waiting first, while there is room; each in its turn takes what fits, and one that still has more waits
        again, behind the others."""
        budget = self._publishes
        if budget is None:
            return
        for _ in range(budget.waiting):  # (a source woken that waits again is not woken twice in one call)
            if budget.room <= 0:
                return
            name = budget.next_waiting()
            task = self._tasks.get(name) if name is not None else None
            if task is not None:
                task.runner.publishes_freed()
            budget.end_turn()

    def _config_error(self, message: str) -> None:
        """A source found its configuration unusable against its server (``mode = "flow_control"`` on an origin
        older than 2.14): stop everything, as a bad configuration file would have, with exit code 2."""
        if self.config_error is None:
            self.config_error = message
            self.log.error("config.invalid", problem=message, exit_code=2)
        self.stop_reason = self.stop_reason or "configuration error"
        self.stop.set()

    async def _run_source(self, task: _SourceTask) -> None:
        try:
            await task.runner.run(task.stop)
        finally:
            self._add_run(self._ended, task.runner)
            task.done.set()
            self._heap.thaw()  # its objects refer to each other: only a full collection that sees them frees them
            name = task.runner.source.name
            if task.runner.fenced and self._tasks.get(name) is task:
                # it stopped itself at a closed fence (the fleet's own stops take the task out first): the fleet
                # learns of it, or a renew that moved the fence a moment later would leave the source stopped
                # while its lease is kept
                del self._tasks[name]
                if self.fleet is not None and task.fence is not None:
                    self.fleet.source_fenced(task.fence)

    # -- ownership (coordination enabled) ---------------------------------------------------------------------

    async def _run_fleet(self, side: TargetSide) -> None:
        coordination = self.config.coordination
        # the fleet has a connection of its own, on a thread of its own (bridge.runtime.fleet_thread): to the
        # coordination servers, or else to the target's with the target's credentials
        if coordination.servers is None:
            settings: ConnectionSettings = self.config.target
            api_prefix = side.api.prefix
        else:
            settings = coordination  # type: ignore[assignment]  # servers set
            api_prefix = coordination.api_prefix

        async def connect(stop: anyio.Event) -> NATS | None:
            nc = await self._connect(
                settings,
                "coordination",
                stop=stop,
                on_disconnected=self._coordination_disconnected,
                on_reconnected=self._coordination_reconnected,
                on_error=self._coordination_error,
            )
            self._kv_nc = nc
            if nc is not None:
                self.log.info("coordination.connected", servers=list(settings.servers))
            return nc

        def make(nc: NATS, sources: list[str], control: SourceControl) -> FleetRunner:
            return FleetRunner(
                KvBucket(nc, JsApi(nc, api_prefix), coordination.bucket),
                instance=coordination.instance,
                sources=sources,
                ttl=coordination.lease_ttl,
                lease_groups=coordination.lease_groups,
                replicas=coordination.replicas,
                control=control,
                shutdown_grace=self.config.engine.shutdown_grace,
            )

        control = SourceControl(self._start_named, self._stop_source, self._abandon_source, self._resume_source)
        self.fleet = FleetThread(connect, make, [s.name for s in self.config.sources], control)
        assert self._sources_tg is not None
        self._sources_tg.start_soon(self._watch_registry, settings, api_prefix)
        try:
            await self.fleet.run(self.stop)
        finally:
            for task in list(self._tasks.values()):  # only if leaving was cut short: drain what still runs
                task.stop.set()

    async def _watch_registry(self, settings: ConnectionSettings, api_prefix: str) -> None:
        """Apply the source registry's changes until stopped (``bridge.runtime.registry``), on a connection of its
        own to the coordination servers: the file's sources run meanwhile, whether or not it can be read."""
        async with anyio.create_task_group() as tg:

            async def cancel_on_stop() -> None:
                await self.stop.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(cancel_on_stop)
            nc = await self._connect(settings, "registry", on_error=self._coordination_error)
            if nc is None:
                return
            try:
                bucket = RegistryBucket(nc, JsApi(nc, api_prefix), self.config.coordination.bucket)
                await RegistryWatcher(nc, bucket, self.apply_registry).run()
            finally:
                with anyio.CancelScope(shield=True):
                    await close_connection(nc)

    async def apply_registry(self, entries: Sequence[RegistryEntry]) -> None:
        """The registry as read now: start what was added, drain what was removed, restart what changed (as a
        reload does, with the file as last loaded)."""
        self._registry = list(entries)
        if self._file_data is None:
            self.log.error(
                "registry.not_applied",
                sources=len(self._registry),
                reason="this process has no configuration file to validate registry sources against",
            )
            return
        try:
            merged = merge(self._file_data, str(self.config_path), self._registry, self.environ)
        except ConfigError as err:  # the file itself (its environment changed?): keep what runs
            self.log.error("registry.not_applied", problems=list(err.problems), kept="the running sources")
            return
        await self._apply(merged, "registry")

    def _start_named(self, name: str, fence: Fence | None = None) -> None:
        """Start the configured source ``name`` (under ``fence`` with leases); nothing if it is not configured."""
        source = self._configured.get(name)
        if source is None or self._sources_tg is None:
            return
        self._start_source(source, fence)

    async def _stop_source(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.stop.set()
            await task.done.wait()

    def _abandon_source(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.runner.abandon("lease lost")

    def _resume_source(self, name: str) -> None:
        task = self._tasks.get(name)
        if task is not None:
            task.runner.resume()

    async def _stop_sources_on_stop(self) -> None:
        await self.stop.wait()
        for task in list(self._tasks.values()):
            task.stop.set()

    async def _announce_stopping(self) -> None:
        await self.stop.wait()
        self.notifier.stopping("draining: answering flow control with what is stored")

    def _waiting_sources(self) -> list[str]:
        fleet = self.fleet
        return waiting_for(
            (name for name, task in self._tasks.items() if not task.runner.ready.is_set()),
            coordinated=self.config.coordination.enabled,
            fleet_ready=fleet is not None and fleet.ready(),
            fleet_settled=fleet is not None and fleet.settled(),
        )

    async def _report_ready(self) -> None:
        deadline = anyio.current_time() + READY_WAIT
        while anyio.current_time() < deadline:
            if self._sources_tg is not None and not self._waiting_sources():
                break  # both sides connected: the target, and every source's consumer bound
            await anyio.sleep(0.25)  # (each look visits every source: with thousands, not ten times a second)
        waiting = self._waiting_sources() if self._sources_tg is not None else ["the target"]
        status = self._status_line()
        if waiting:
            status += f"; waiting for {', '.join(waiting)} (see /readyz)"
        self.notifier.ready(status)
        self.log.info("bridge.ready", sources=list(self._tasks), waiting=waiting, core=CORE_BUILD)

    # -- reload -------------------------------------------------------------------------------------------

    async def reload(self) -> bool:
        """Re-read the configuration file and apply its sources (``bridge.runtime.reload`` says what changes), with
        the registry's as last read; False (old configuration kept) if invalid."""
        if self.config_path is None or self._sources_tg is None or self.stop.is_set():
            self.log.warning("reload.ignored", reason="not started from a configuration file, or stopping")
            return False
        self.notifier.reloading("re-reading the configuration")
        try:
            data = read_toml(self.config_path)
            merged = merge(data, str(self.config_path), self._registry, self.environ)
        except ConfigError as err:
            self.log.error("reload.rejected", problems=list(err.problems), kept="the running configuration")
            self.notifier.ready("configuration reload rejected; running the previous one")
            return False
        self._file_data = data
        await self._apply(merged, "reload")
        return True

    async def _apply(self, merged: Merged, cause: str) -> None:
        """Replace the running configuration's sources by ``merged``'s: a reload's or a registry change's."""
        async with self._applying:
            if self._sources_tg is None or self.stop.is_set():
                return
            self._report_refused(merged.refused)
            new = merged.config
            fleet = self.fleet
            # with leases, nothing starts without one, even before the fleet has joined (it reads the new list then)
            plan = plan_reload(self.config, new, self._tasks.keys(), coordinated=self.config.coordination.enabled)
            if plan.restart_required and cause == "reload":
                self.log.warning(
                    "reload.restart_required",
                    sections=plan.restart_required,
                    hint="these sections apply on restart only",
                )
            # a source whose configuration did not change keeps the object it runs with: the start-up's merge of the
            # registry would otherwise hold a second copy of every source's (1.5 KB each)
            old = self._configured
            sources = [o if (o := old.get(s.name)) is not None and o == s else s for s in new.sources]
            self.config = self.config.model_copy(update={"sources": sources, "source_defaults": new.source_defaults})
            self._configured = {s.name: s for s in sources}
            self.provenance = merged.origins
            for name in plan.stop:
                await self._stop_source(name)
            for name in plan.removed:
                self.metrics.forget(name)
            for name in plan.retune:
                await self._tasks[name].runner.retune(self._configured[name])
            for name in plan.start:
                self._start_named(name)
            if fleet is not None:
                for name in plan.restart_if_held:
                    if fleet.holds(name):
                        self._start_named(name, fleet.fence(name))
                fleet.set_sources(plan.sources)  # hands over what was removed, takes up what was added
            if cause == "reload" or plan.added or plan.removed or plan.changed:
                self.log.info(
                    f"{cause}.applied",
                    added=plan.added,
                    removed=plan.removed,
                    changed=plan.changed,
                    retuned=plan.retune,
                    unchanged=len(plan.unchanged) if cause == "registry" else plan.unchanged,
                )
            self.notifier.ready(self._status_line())

    def _report_refused(self, refused: dict[str, list[str]]) -> None:
        """Log each registry source refused, once per reason (a refusal is never silent: /readyz lists it too)."""
        for name, problems in refused.items():
            if self.refused.get(name) != problems:
                self.log.error(
                    "registry.source_refused",
                    source=name,
                    problems=problems,
                    hint="fix it with nats-bridge sources add (or remove it); the other sources are not affected",
                )
        self.refused = dict(refused)

    def _status_line(self) -> str:
        coordination = self.config.coordination
        return status_line(
            sum(1 for task in self._tasks.values() if task.runner.ready.is_set()),
            running=len(self._tasks),
            configured=len(self.config.sources),
            instance=coordination.instance if coordination.enabled else None,
        )

    # -- health -------------------------------------------------------------------------------------------

    def snapshot(self) -> BridgeSnapshot:
        """The daemon's state now (metrics, ``/readyz``)."""
        nc, api = self._target_nc, self._api
        return BridgeSnapshot(
            target_connected=nc is not None and bool(nc.is_connected),
            api_in_flight=int(api.borrowed_tokens) if api is not None else 0,
            api_waiting=api.statistics().tasks_waiting if api is not None else 0,
            publishes_in_flight=self._publishes.in_flight if self._publishes is not None else 0,
            publishes_waiting=self._publishes.waiting if self._publishes is not None else 0,
            publishes_limit=self._publishes.limit if self._publishes is not None else 0,
            publishes_limit_cuts=self._publishes.cuts if self._publishes is not None else 0,
            origins_doubted=self._reach.reach.doubted,
            resets_waiting=self._reach.waiting,
            sources=tuple(task.runner.snapshot() for task in self._tasks.values()),
            now=time.time(),
            fleet=self.fleet.snapshot() if self.fleet is not None else None,
        )

    async def _beat(self) -> None:
        while True:
            self._loop_beat = time.monotonic()
            # room freed other than by an ack (a publish timed out, a source stopped) wakes the waiting here too
            self._publishes_freed()
            await anyio.sleep(LOOP_BEAT)

    def _loop_healthy(self) -> bool:
        return time.monotonic() - self._loop_beat < LOOP_STALE

    def _healthz(self) -> Response:
        # answered by the event loop itself: a blocked loop answers nothing, and the probe's timeout says so
        if not self._loop_healthy():
            return json_response(503, {"status": "event loop stalled"})
        return json_response(200, {"status": "ok"})

    def _readyz(self) -> Response:
        answer = readyz(
            self.snapshot(),
            coordinated=self.config.coordination.enabled,
            target_stream=self.config.target.stream,
            provenance=self.provenance,
            refused=self.refused,
        )
        return json_response(200 if answer.ready else 503, answer.body)

    async def _serve_http(
        self, server: HttpServer | None = None, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve ``/metrics``, ``/healthz`` and ``/readyz`` until cancelled; binds first unless ``server`` is bound."""
        if server is None:
            server = await self._bind_http()
        task_status.started()
        await server.serve()

    async def _bind_http(self) -> HttpServer:
        """The HTTP listener, bound (not serving yet); raises ``ListenError`` after logging ``http.listen_failed``
        with the address and the fix."""
        host, port = parse_listen(self.config.http.listen)
        routes = {
            "/metrics": metrics_handler(self.metrics.exposition),
            "/healthz": self._healthz,
            "/readyz": self._readyz,
        }
        server = HttpServer(host, port, routes, log=self.log)
        try:
            self.http_port = await server.listen()
        except ListenError as exc:
            self.log.error(
                "http.listen_failed", listen=self.config.http.listen, error=exc.cause, fix=exc.fix, exit_code=2
            )
            self.stop_reason = f"http.listen {exc.address}: {exc.cause}"
            raise
        self.log.info("http.listening", host=host, port=self.http_port, paths=sorted(routes))
        return server

    async def _connect_target(self) -> NATS | None:
        target = self.config.target
        servers = list(target.servers)

        def waiting(error: str) -> None:
            # no source starts before the target is connected: each says that it waits for it (once)
            for source in self.config.sources:
                wait = self._unstarted_waits.setdefault(source.name, WaitLog(get_logger(source=source.name)))
                wait.begin("target", servers=servers, error=error, stream=target.stream)

        self._target_nc = await self._connect(
            target,
            "target",
            on_failed=waiting,
            on_disconnected=self._target_disconnected,
            on_reconnected=self._target_reconnected,
            on_error=self._target_error,
        )
        if self._target_nc is not None:
            # acks free room among the publishes in flight: after each read of them, the sources that waited send
            wire.add_after_parse(self._target_nc, self._publishes_freed)
            self.log.info("target.connected", servers=servers, stream=target.stream)
            for wait in self._unstarted_waits.values():
                wait.end("target")
            self._unstarted_waits.clear()
        return self._target_nc

    async def _connect(
        self,
        side: ConnectionSettings,
        role: str,
        *,
        on_failed: Callable[[str], None] | None = None,
        stop: anyio.Event | None = None,
        **callbacks: Any,
    ) -> NATS | None:
        """Connect to ``side``'s servers, retrying with backoff until connected or stopped (then None).

        A side that never connected is not "disconnected": its failed attempts are logged as ``<role>.connect_failed``
        (the servers and the cause), the first one at once, then at most every 30 seconds (``CONNECT_RETRY``) while
        the cause stays the same, with the attempts made and how many lines were held back. The callbacks are for
        the live connection only (the callers ignore what nats-py reports while a first connect fails).
        """

        def report(exc: BaseException, step: RetryStep) -> None:
            error = str(exc)
            if step.report:
                self.log.warning(
                    f"{role}.connect_failed",
                    servers=list(side.servers),
                    error=error,
                    attempts=step.attempt,
                    similar_suppressed=step.suppressed,
                    retry_in=round(step.delay, 3),
                )
            if on_failed is not None:
                on_failed(error)

        async def attempt() -> NATS:
            return await open_connection(side, name=f"nats-bridge {role}", error_type=TargetUnavailable, **callbacks)

        until = stop if stop is not None else self.stop
        return await retry_until_stopped(
            until, attempt, CONNECT_RETRY, retry_on=(BridgeError,), kind=str, report=report
        )

    async def _check_target_stream(self, side: TargetSide) -> None:
        try:
            info = await side.api.stream_info(side.stream, timeout=self.config.engine.reset_timeout)
        except (ApiError, ApiTimeout, ApiUnavailable, PermissionDenied) as exc:
            # not fatal: sources block (loudly) until the stream exists, publishes are retried
            fields: dict[str, str] = {}
            if isinstance(exc, ApiError) and exc.err_code == STREAM_NOT_FOUND:
                path = shlex.quote(str(self.config_path)) if self.config_path is not None else "FILE"
                fields["hint"] = (
                    f"the aggregate does not exist; create it with: nats-bridge setup -c {path} "
                    "(until then the sources block and ack nothing)"
                )
            self.log.error("target.stream_unavailable", stream=side.stream, error=str(exc), **fields)
            return
        cfg = info.get("config", {})
        window_ns = int(cfg.get("duplicate_window", 0))
        if window_ns and duplicate_window_short(window_ns / 1e9, side.ack_timeout):
            self.log.warning(
                "target.duplicate_window_short",
                duplicate_window=window_ns / 1e9,
                ack_timeout=side.ack_timeout,
                hint="a publish retried after an ack timeout may be stored twice; keep duplicate_window >= 2x",
            )
        self.log.info(
            "target.stream",
            stream=side.stream,
            retention=cfg.get("retention"),
            discard=cfg.get("discard"),
            allow_direct=cfg.get("allow_direct"),
            # fast batches keep origin order while the stream's leader moves (README, Order)
            allow_batched=bool(cfg.get("allow_batched")),
        )

    async def _target_disconnected(self) -> None:
        if self._target_nc is None:
            return  # a first connect that failed (nats-py closes it): never connected, so not "disconnected"
        # nats-py calls this after the old socket closed and before it reconnects: the only point at which
        # publishes it would replay out of order can still be taken back
        dropped = drop_unsent_publishes(self._target_nc)
        if not self.stop.is_set() and not self._closing:
            servers = list(self.config.target.servers)
            self.log.warning("target.disconnected", servers=servers, unsent_publishes_dropped=dropped)
            for runner in self.runners:  # none of them can publish until it is back
                runner.waits.begin("target", servers=servers, error="connection lost, reconnecting")

    async def _target_reconnected(self) -> None:
        if self._target_nc is None:
            return
        self.log.info("target.reconnected")
        for runner in self.runners:
            runner.waits.end("target")
            runner.target_reconnected()

    async def _coordination_disconnected(self) -> None:
        if self._kv_nc is None or self.stop.is_set() or self._closing:
            return  # never connected yet (a failed first connect), or closing on purpose
        self.log.warning(
            "coordination.disconnected",
            servers=list(self.config.coordination.servers or self.config.target.servers),
            hint="leases are not renewed while it is down: owned sources are fenced after 4/5 of the TTL",
        )

    async def _coordination_reconnected(self) -> None:
        if self._kv_nc is not None:
            self.log.info("coordination.reconnected")

    async def _coordination_error(self, exc: Exception) -> None:
        # (on the fleet's thread: a throttle of its own)
        suppressed = self._coordination_throttle.allow(time.monotonic())
        if suppressed is not None:
            self.log.warning("coordination.error", **error_fields(exc), similar_suppressed=suppressed)

    async def _target_error(self, exc: Exception) -> None:
        suppressed = self._error_throttle.allow(time.monotonic())
        if suppressed is not None:
            self.log.warning("target.error", **error_fields(exc), similar_suppressed=suppressed)
