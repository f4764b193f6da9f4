"""One source's pipeline: the engine driven by a subscription, a publisher, a ticker and one effect executor.

The runner decides nothing: the engine (``bridge.core.engine``) decides, and the runner performs its effects
through the origin and target ports (``bridge.ports``) and feeds every outcome back.

Task ownership (all inside the runner's task group, cancelled together when the runner ends):

* the task that called ``run`` watches for ``stop`` (then drains); ``_start`` sets up (connect, bind, recover) and
  ends once it has started the rest;
* the origin's subscription hands deliveries to the engine (synchronously, from the wire parser; it never awaits
  I/O, it only queues effects);
* the publisher's ack callback feeds publish outcomes;
* ``_ticker`` feeds the clock every ``TICK`` seconds (timeouts, retries, silence, due resets, probes, stalls): the
  process's one ``Ticker`` when the app passes it (one task for every source), else a task of the runner's own;
* ``_executor`` performs effects, in the order the engine produced them, so publishes reach the target in
  origin order. One shortcut: whatever the engine decides, the publishes and flow-control answers at the head of
  the queue are performed at once by ``_perform_ready`` if the executor is idle (same order, written with every
  other source's at the end of the event-loop pass, no wake-up of the executor's task);
* a RESET, a read of the aggregate to verify publishes and a probe for stranded messages each run in a task of
  their own (they can take ``reset_timeout``): publishing goes on meanwhile. A probe is sent without one when the
  origin port can and an API slot is free at once (``_probe_soon``): its answer comes to a callback. Every JetStream
  API request (setup, recovery, a reset's bind and RESET, fetches, probes, verifications) first takes one of the
  process's slots (``api``, shared by every source), so a thousand sources restarting together queue here, not at
  the hub.

Shutdown (``stop`` set): deliveries stop (unsubscribe), nothing new is published, in-flight acks are awaited up to
``shutdown_grace``, a held flow-control request is answered with what is stored, then the connection closes.

The fence (with leases, ``bridge.core.fleet``): every action on the source, a publish batch, a flow-control answer,
a RESET and a consumer create or look-up, is preceded by ``fence()``, checked at the moment of the I/O from the
monotonic clock. Once it says no for good (the lease is lost or given up), the runner abandons the source at once:
it stops taking deliveries, drops every queued effect and ends without the drain's final answer. A process frozen
past its lease wakes into that check before it can act on anything it had buffered. When it says no but the lease
is only suspended (its fence passed before a renew succeeded, ``Fence.waiting``), the action waits there (``_act``)
and the source keeps its state: deliveries and acks still reach the engine, nothing is published or answered,
until the fleet resumes it (``resume``: a renew proved nobody else can have acted) or abandons it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar, assert_never

import anyio
from anyio.abc import TaskGroup

from bridge.config import EngineConfig, SourceConfig
from bridge.core import targetwire
from bridge.core.backoff import Backoff
from bridge.core.budget import PublishBudget
from bridge.core.effects import (
    Ack,
    AnswerFlowControl,
    BoundConsumer,
    Effect,
    FetchOrigin,
    Notice,
    OriginStream,
    ProbeStranded,
    Publish,
    Pull,
    ReadTargetLimits,
    RequestReset,
    RequestResync,
    ResizeWindow,
    VerifyStored,
)
from bridge.core.engine import EngineSettings, SourceEngine
from bridge.core.inlet import Inlet
from bridge.core.modes import Choice, Mode, ModeUnsupported, choose_mode, mode_key, presume_mode
from bridge.core.pipeline import TargetLimits
from bridge.core.pull import PullEngine
from bridge.core.reach import Origin
from bridge.core.recovery import Copy, recover, recovery_depth
from bridge.core.replication import Replication
from bridge.core.targetwire import AckOutcome
from bridge.core.window import WindowBudget
from bridge.errors import (
    ApiError,
    ApiTimeout,
    ApiUnavailable,
    BridgeError,
    ConsumerUnfit,
    OriginUnavailable,
    TargetUnavailable,
)
from bridge.io.connect import describe, error_fields
from bridge.io.jsapi import STREAM_NOT_FOUND
from bridge.io.origin import OriginClient
from bridge.io.shared import OriginConnections
from bridge.logs import Throttle, get_logger
from bridge.observe.metrics import SourceObservers, SourceSnapshot
from bridge.ports import LeaseFence, OriginPort, PublisherPort, TargetPort
from bridge.runtime.flag import Flag, Waitable
from bridge.runtime.retry import RetryPolicy, RetryStep, retry_until_stopped
from bridge.runtime.scouts import ReachGate
from bridge.runtime.ticker import Ticker
from bridge.runtime.waits import WaitLog

_R = TypeVar("_R")

TICK = 0.1
QUIET_TICKS = 10  # a quiet engine (``Replication.quiet``) is ticked on every 10th tick only: once a second
PUBLISH_BATCH = 256  # publishes written to the target in one command at most
SETUP_RETRY = RetryPolicy(Backoff(1.0, 30.0))  # a setup that keeps failing the same way: logged every 30 s at most
PAUSE_POLL = 1.0  # a set-up paused at its fence looks at it again this often (no tick watches it yet)
# seconds a read of the aggregate may take: the target's limits (in the executor's line: a STREAM.INFO shared by every
# source, 5 s at most, waited for behind at most one other) and a verification (its tail read, which waits its turn
# for an API slot and one of the process's four tail reads: after a reconnect storm of 2,000 sources some waited a
# minute behind hundreds of others; a bound that short would send them to the back of the queue again)
LIMITS_READ_BOUND = 15.0
VERIFY_BOUND = 120.0


def engine_settings(
    source: SourceConfig, engine: EngineConfig, target: TargetPort, stalled_after: float
) -> EngineSettings:
    """Map configuration objects onto the core's plain settings."""
    return EngineSettings(
        source=source.name,
        stream=source.stream,
        consumer=source.consumer,
        subject_prefix=source.subject_prefix,
        subject_transforms=source.transform_pairs,
        publish_window=target.publish_window,
        ack_timeout=target.ack_timeout,
        silence_timeout=engine.silence_timeout,
        reset_backoff=Backoff(engine.reset_backoff_initial, engine.reset_backoff_max),
        publish_retry=Backoff(engine.publish_retry_initial, engine.publish_retry_max),
        stalled_after=stalled_after,
        # pull mode: never more asked for or unstored than the server lets be pending, or the window can send
        pull_capacity=max(1, min(source.max_ack_pending, target.publish_window)),
        rate_limit=source.rate_limit,
        window=source.max_ack_pending,
        window_budget=source.window_budget if source.manage_consumer else 0,
    )


def new_engine(mode: Mode, settings: EngineSettings, now: float, windows: WindowBudget | None = None) -> Replication:
    """The engine of a consumer model (``windows``: the process's budget for grown flow-control windows)."""
    return PullEngine(settings, now, windows) if mode is Mode.PULL else SourceEngine(settings, now, windows)


class SourceRunner:
    """Runs one source until ``stop`` is set; never raises for origin or target trouble (it logs and retries)."""

    # slots: a runner has more attributes than CPython 3.11 shares the keys of (30), and its instance dictionary then
    # made every attribute read on the hot path a hash lookup (about 5% of a message's instructions), and cost
    # memory per source
    __slots__ = (
        "_api",
        "_bound",
        "_changed",
        "_connected",
        "_effects",
        "_error_throttle",
        "_fence",
        "_inlet",
        "_mode_presumed",
        "_on_config_error",
        "_origin",
        "_paused_at",
        "_performing",
        "_publisher",
        "_publishes",
        "_reach",
        "_resumed",
        "_shared_ticker",
        "_stopping",
        "_target_epoch",
        "_tg",
        "_tick_callback",
        "_wake",
        "_wheel",
        "_windows",
        "clock",
        "engine",
        "engine_cfg",
        "fenced",
        "last_error",
        "log",
        "mode",
        "observers",
        "origin",
        "origin_connected",
        "ready",
        "recovered",
        "source",
        "target",
        "waits",
    )

    def __init__(
        self,
        source: SourceConfig,
        engine: EngineConfig,
        target: TargetPort,
        clock: Callable[[], float] = time.monotonic,
        *,
        stalled_after: float,
        observers: SourceObservers | None = None,
        fence: LeaseFence | None = None,
        origin: OriginPort | None = None,
        on_config_error: Callable[[str], None] | None = None,
        ticker: Ticker | None = None,
        api: anyio.CapacityLimiter | None = None,
        connections: OriginConnections | None = None,
        windows: WindowBudget | None = None,
        publishes: PublishBudget | None = None,
        reach: ReachGate | None = None,
    ):
        self.source = source
        self._reach = reach  # the process's origins in doubt: a reset to one goes as a scout or waits (None: never)
        # this source's origin as every source of it sees it (its servers and JetStream domain name it; made once)
        self._origin = (
            reach.origin(" ".join(source.servers) + " " + source.api_prefix) if reach is not None else Origin()
        )
        self._windows = windows  # the process's budget for grown windows (None: this source's own only)
        self.engine_cfg = engine
        self._shared_ticker = ticker  # the process's one clock; None: a ticker task of this runner's own
        self._wheel = ticker.wheel if ticker is not None else None  # (woken and rested by ``_emit``, compiled)
        self._api = api  # the process's JetStream API requests in flight (None: unbounded)
        self.target = target
        self.origin: OriginPort = (
            origin if origin is not None else OriginClient(source, engine.reset_timeout, connections=connections)
        )
        self.origin.copies_exist = self._copies_exist
        self.origin.fence = fence
        self.clock = clock
        self.observers = observers
        self._fence = fence
        self._on_config_error = on_config_error
        self.fenced = False  # the fence closed: nothing more is done for this source
        self._resumed: Flag | None = None  # what waits at a closed fence looks again once it is set
        self._paused_at: float | None = None  # the fence closed while the lease is kept: waiting since then
        self.log = get_logger(source=source.name)
        # the model is chosen once connected (`mode`); until then the configured one, or flow control for auto
        first = Mode.PULL if source.mode == "pull" else Mode.FLOW_CONTROL
        self._publishes = publishes  # the process's publishes in flight, every source's together (None: no bound)
        # what takes the deliveries off the wire and feeds the engine (compiled); kept in step with ``engine``
        # (``_use``), ``fenced`` and ``paused`` here
        self._inlet = Inlet(
            self._use(new_engine(first, engine_settings(source, engine, target, stalled_after), clock(), windows)),
            clock,
            self._emit,
        )
        self.mode: Choice | None = None
        self.ready = Flag()  # connected, consumer bound, first reset done
        self._effects: deque[Effect] = deque()
        self._wake = Flag()
        self._changed: Flag | None = None  # set while something waits in _wait_until (see _notify)
        self._connected = False
        self._publisher: PublisherPort | None = None
        self._tg: TaskGroup | None = None
        self._stopping = False
        self._performing = False  # the executor is performing an effect (it may be suspended in it)
        self._error_throttle = Throttle()
        self.waits = WaitLog(self.log, clock)  # what the source waits for (logged on each change)
        # observed state, for metrics, /readyz and status (never for decisions)
        self.origin_connected = False
        self.recovered = False  # the watermark was read back from the aggregate (for the stop summary)
        self.last_error = ""
        self._tick_callback = self._tick  # one bound method: the shared ticker's key for this runner
        self._target_epoch = 0  # the target connection the engine's publishes in flight went out on
        self._bound: BoundConsumer | None = None  # what set-up's bind found, when no reset has used that since
        self._mode_presumed = False  # ``mode`` awaits its confirmation by the consumer's create (``_bind``)

    # -- life cycle -----------------------------------------------------------------------------------------

    async def run(self, stop: Waitable) -> None:
        """Connect, bind the consumer, recover, replicate; on ``stop`` drain and return."""
        try:
            await self._run(stop)
        finally:
            if self._shared_ticker is not None:  # however it ended: a runner that is gone is not ticked
                self._shared_ticker.discard(self._tick_callback)
            if self._windows is not None:  # nor holds a share of the process's budget for grown windows
                self._windows.release(self.source.name)
            self.engine.pipeline.leave_budget()  # nor counts among the process's publishes in flight

    async def _run(self, stop: Waitable) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._start, stop, tg)
            # this task watches for the stop itself: a task of its own for that would be a third of what a quiet
            # source's tasks cost in memory
            await self._watch_stop(stop, tg)
        await self._close()

    async def _start(self, stop: Waitable, tg: TaskGroup) -> None:
        """Set up, then start the executor (and the ticker); the task ends there."""
        try:
            await self._setup(stop)
        except anyio.get_cancelled_exc_class():
            await self._close()
            raise
        if stop.is_set() or self.fenced:
            tg.cancel_scope.cancel()
            await self._close()
            return
        tg.start_soon(self._executor)
        if self._shared_ticker is None:
            tg.start_soon(self._ticker)
        else:
            self._shared_ticker.add(self._tick_callback)

    def may_act(self) -> bool:
        """The fence, checked right before every action on the source. Closed while the lease is kept (suspended):
        False, and the source is paused (``_act`` waits, nothing is lost); closed for good: the source is
        abandoned."""
        if self.fenced:
            return False
        fence = self._fence
        if fence is None or fence():
            return True
        if fence.waiting():
            if self._paused_at is None:
                self._paused_at = self.clock()
                self._inlet.paused = True
                if self._shared_ticker is not None:  # ticked again (``_tick`` looks at the fence)
                    self._shared_ticker.wake(self._tick_callback)
                self.log.warning(
                    "source.paused",
                    reason="its lease is suspended (no renew succeeded in time): nothing is published or answered "
                    "until a renew does",
                    watermark=self.engine.watermark,
                )
            return False
        self.abandon("lease fence closed")
        return False

    @property
    def paused(self) -> bool:
        """Waiting at a closed fence of a kept lease (suspended), with its state."""
        return self._paused_at is not None

    async def _act(self, *, poll: bool = False) -> bool:
        """``may_act``, waiting while the source is paused until it is resumed or abandoned: True to act now, False
        when abandoned or stopping (a stopping source does not wait for its fence: its stop is bounded). ``poll``:
        look at the fence every ``PAUSE_POLL`` seconds too (set-up, which no tick watches yet)."""
        while not self.may_act():
            if self.fenced or self._stopping:
                return False
            if self._resumed is None or self._resumed.is_set():
                self._resumed = Flag()
            with anyio.move_on_after(PAUSE_POLL if poll else math.inf):
                await self._resumed.wait()
        return True

    def resume(self) -> None:
        """The lease was suspended and a renew reopened the fence in the same term (the fleet's ResumeSource):
        what waited acts now, in the order it was decided. Nothing is presumed lost: the publishes written before
        the pause were acked (or not) meanwhile as always, the queued ones are written now on the same connection
        (a new one drops them, as ever), and one whose ack deadline passed while it waited is verified like any
        late ack. (Presuming them all lost made each resumed source read the aggregate before publishing again:
        52 s on the hub a storm starved, ``bench edge``.)"""
        if self.fenced:
            return
        if self._paused_at is not None:
            self.log.info("source.resumed", paused_for=round(self.clock() - self._paused_at, 3))
            self._paused_at = None
            self._inlet.paused = False
        if self._resumed is not None:
            self._resumed.set()

    def abandon(self, reason: str) -> None:
        """Stop at once, doing nothing more for the source: no publish, no answer, no reset (the lease is gone)."""
        if self.fenced:
            return
        self.fenced = True
        self._inlet.closed = True
        self._stopping = True
        dropped = sum(1 for effect in self._effects if isinstance(effect, Publish | AnswerFlowControl))
        self._effects.clear()
        self.log.warning("source.fenced", reason=reason, dropped_actions=dropped, watermark=self.engine.watermark)
        self.origin.detach()  # nothing more is taken from the deliver subject
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _watch_stop(self, stop: Waitable, tg: TaskGroup) -> None:
        await stop.wait()
        if self._publisher is None:
            tg.cancel_scope.cancel()  # still setting up: nothing in flight to wait for
            return
        await self._shutdown()
        tg.cancel_scope.cancel()

    async def _setup(self, stop: Waitable) -> None:
        began: set[str] = set()  # what the source is waiting for now (source.waiting lines)

        def report(exc: BaseException, step: RetryStep) -> None:
            self.last_error = str(exc)
            reason, fields = self._setup_wait(exc)
            for passed in sorted(began - {reason}):  # e.g. the origin answers now, its consumer is unfit
                self.waits.end(passed)
            self.waits.begin(reason, **fields)
            began.clear()
            began.add(reason)
            if step.report:
                level = "error" if isinstance(exc, ConsumerUnfit) or step.attempt > 3 else "warning"
                getattr(self.log, level)(
                    "source.setup_failed",
                    error=str(exc),
                    error_type=type(exc).__name__,
                    attempts=step.attempt,
                    similar_suppressed=step.suppressed,
                    retry_in=round(step.delay, 3),
                    **self._setup_hint(exc),
                )

        async def attempt() -> bool:
            await self._setup_once()
            return True

        done = await retry_until_stopped(
            stop,
            attempt,
            SETUP_RETRY,
            retry_on=(BridgeError, OSError),
            kind=lambda exc: (self._setup_wait(exc)[0], type(exc).__name__),
            report=report,
            clock=self.clock,
        )
        if done:
            for reason in ("origin", "consumer", *sorted(began)):
                self.waits.end(reason)

    def _setup_hint(self, exc: BaseException) -> dict[str, str]:
        """A ``hint`` for a missing origin stream: the operator might expect ``nats-bridge setup`` to create it."""
        cause = exc.__cause__
        if isinstance(exc, OriginUnavailable) and isinstance(cause, ApiError) and cause.err_code == STREAM_NOT_FOUND:
            return {
                "hint": "the origin stream is your applications' own, which nats-bridge setup does not create: create "
                f"it on the origin, or correct sources[{self.source.name}].stream or .domain"
            }
        return {}

    def _setup_wait(self, exc: BaseException) -> tuple[str, dict[str, Any]]:
        """What a failed setup waits for, and the fields that say why (for ``source.waiting``)."""
        src = self.source
        if self.engine.refusal is not None:  # the origin stream was recreated: refused until an operator acts
            return "origin", {"servers": list(src.servers), "reason": self.engine.refusal}
        if isinstance(exc, ConsumerUnfit):
            return "consumer", {"consumer": src.consumer, "reason": str(exc)}
        if isinstance(exc, TargetUnavailable):
            return "target", {"error": str(exc)}
        # not connected yet, or the origin's JetStream API does not answer (stream info, consumer create)
        return "origin", {"servers": list(src.servers), "error": str(exc)}

    async def _setup_once(self) -> None:
        src, origin = self.source, self.origin
        if not self._connected:
            await origin.connect(
                on_disconnected=self._on_disconnected,
                on_reconnected=self._on_reconnected,
                on_error=self._on_error,
                on_connection_error=self._on_connection_error,
            )
            self._connected = self.origin_connected = True
            self.log.info("origin.connected", servers=list(src.servers), api_prefix=src.api_prefix)
        stream = await origin.stream(self._api_slot)
        if self.mode is None:
            await self._choose_mode(stream)
        if not await self._act(poll=True):
            return  # abandoned (the task group is cancelled, nothing more starts) or stopping
        bound = await self._bind(stream)
        self._bound = bound  # the first reset that follows need not bind again
        self.engine.consumer_bound(bound.created, bound.start_seq, started=bound.started)
        self._log_start(bound)
        self.log.info(
            "consumer.bound",
            consumer=src.consumer,
            managed=src.manage_consumer,
            ack_floor=bound.ack_floor,
            num_pending=bound.num_pending,
        )
        if self.engine.awaits_recovery:
            await self._recover(stream, bound.ack_floor)
        if self._publisher is None:
            self._publisher = self.target.publisher(self._on_outcomes, self._fence)
            await self._publisher.start()
            self._target_epoch = self._publisher.epoch
        self._emit(self.engine.target_limits(await self._target_limits(), self.clock()))

    async def _choose_mode(self, stream: OriginStream, *, read_durable: bool = False) -> Mode:
        """Decide the consumer model once (``bridge.core.modes``); ``flow_control`` forced on an older server is a
        configuration error: reported to the bridge, which stops with exit code 2. ``auto`` on a server with flow
        control presumes it without reading the durable (``presume_mode``) unless ``read_durable``: ``_bind``
        confirms it, or reads the durable when the create is refused."""
        presumed = None if read_durable else presume_mode(self.source.mode, stream.api_level, stream.version)
        # only auto depends on the durable (CONSUMER.INFO): it keeps a pull consumer made before an upgrade to 2.14
        kind = None
        if presumed is None and self.source.mode == "auto":
            async with self._api_slot():
                kind = await self.origin.consumer_kind()
        try:
            choice = presumed or choose_mode(self.source.mode, stream.api_level, stream.version, kind)
        except ModeUnsupported as exc:
            message = f"{mode_key(self.source.name)}: {exc}"
            if self._on_config_error is not None:
                self._on_config_error(message)
            raise ConsumerUnfit(message) from exc
        self.mode = choice
        self._mode_presumed = presumed is not None
        self.origin.mode = choice.mode
        if choice.mode is not self.engine.mode:
            # nothing happened in it yet
            self.engine.pipeline.leave_budget()
            self._inlet.engine = self._use(new_engine(choice.mode, self.engine.settings, self.clock(), self._windows))
        if not self._mode_presumed:
            self._log_mode()
        return choice.mode

    def _use(self, engine: Replication) -> Replication:
        """Make ``engine`` this source's (counting its publishes in flight among the process's); returns it."""
        self.engine = engine
        engine.origin = self._origin
        if self._publishes is not None:
            engine.pipeline.share_budget(self._publishes, self.source.name)
        return engine

    async def retune(self, source: SourceConfig) -> None:
        """Take ``source``, which differs from the running configuration only in what applies in place
        (``bridge.runtime.reload.RETUNABLE``: the rate limit), without a restart: the consumer is updated where it
        carries it. A failure is logged and leaves the source running as it was (the next bind applies it)."""
        self.source = source
        self.engine.rate_limited(source.rate_limit)
        try:
            async with self._api_slot():
                await self.origin.set_rate_limit(source.rate_limit)
        except BridgeError as exc:
            self.log.error(
                "source.retune_failed",
                rate_limit=source.rate_limit,
                error=str(exc),
                hint="the source keeps replicating at its former limit; the next bind (a restart) applies the new one",
            )
            return
        self.log.info("source.retuned", rate_limit=source.rate_limit)

    def _log_start(self, bound: BoundConsumer) -> None:
        """What a bind did with the source's start position (``bridge.io.start``): applied, or ignored for copies."""
        if bound.start_note:
            self.log.info(
                "consumer.start",
                consumer=self.source.consumer,
                start=self.source.start_position,
                decision=bound.start_note,
                start_seq=bound.start_seq or None,
            )

    async def _copies_exist(self) -> bool:
        """Whether the aggregate holds any copy of this source (a start position is then not applied). Asked from
        inside a bind, which holds this source's API slot already: the read takes none of its own."""
        src = self.source
        copies, _ = await self.target.read_tail(src.name, src.copies_filter, 0, 1, None)
        return bool(copies)

    def _log_mode(self) -> None:
        if self.mode is not None:
            self.log.info("source.mode", mode=self.mode.mode.value, reason=self.mode.reason)

    async def _bind(self, stream: OriginStream) -> BoundConsumer:
        """Create or look up the consumer (``origin.bind``); a presumed mode is confirmed by it, or, refused, chosen
        again from the durable (one ``CONSUMER.INFO`` more, only then)."""
        try:
            async with self._api_slot():
                bound = await self.origin.bind()
        except ConsumerUnfit:
            presumed = self.mode
            if not self._mode_presumed or presumed is None:
                raise
            if await self._choose_mode(stream, read_durable=True) is presumed.mode:
                raise  # the durable confirms the mode the create was refused in: that refusal stands
            async with self._api_slot():
                bound = await self.origin.bind()
        if self._mode_presumed:
            self._mode_presumed = False
            self._log_mode()
        return bound

    async def _read_tail(self, floor: int) -> tuple[list[Copy], bool]:
        """This source's copies in the aggregate above ``floor`` (see ``read_source_tail``)."""
        src = self.source
        # the slot is taken for the reads of messages only: the aggregate's STREAM.INFO before them is shared
        return await self.target.read_tail(
            src.name, src.copies_filter, floor, recovery_depth(self.target.publish_window), self._api_slot
        )

    async def _target_limits(self) -> TargetLimits:
        # no API slot: the aggregate's STREAM.INFO behind it is one read for every source asking together (shared,
        # and fresh for a while), so it cannot flood the hub; a slot each made a thousand sources starting together
        # queue once more for what most of them get without a request
        return await self.target.limits()

    @contextlib.asynccontextmanager
    async def _slot_to_act(self) -> AsyncIterator[bool]:
        """An API slot (``_api_slot``) taken with the fence open: True inside it to act, False (no slot) when the
        source is abandoned or stopping. A paused source waits at its fence without a slot, and the fence is looked
        at again once the slot is taken: paused sources holding every slot would hold up every other source's
        set-up and reset, and the lease renewals queued behind them, for as long as their leases stay suspended."""
        while True:
            if not await self._act():
                yield False
                return
            async with self._api_slot():
                if self.may_act():
                    yield True
                    return

    def _api_slot(self) -> AbstractAsyncContextManager[object]:
        """A slot among the process's JetStream API requests in flight (``api``, shared by every source), held for
        one request or one exchange (a reset's bind and RESET): when every edge reconnects at once, the sources'
        requests queue here, in the process, rather than flood the servers (where lease renewals would queue
        behind them)."""
        return self._api if self._api is not None else contextlib.nullcontext()

    async def _recover(self, stream: OriginStream, floor: int) -> None:
        started = self.clock()
        copies, complete = await self._read_tail(floor)
        result = recover(copies, floor, complete)
        effects = self.engine.recovered(
            result.watermark, result.present, self.clock(), workqueue=stream.workqueue, origin_last_seq=stream.last_seq
        )
        if self.engine.refusal is not None:
            raise ConsumerUnfit(self.engine.refusal)
        self.recovered = True
        self.log.info(
            "recovery.done",
            watermark=result.watermark,
            present_above=len(result.present),
            ack_floor=floor,
            copies_read=result.copies_read,
            complete=complete,
            seconds=round(self.clock() - started, 3),
        )
        self._emit(effects)

    async def _shutdown(self) -> None:
        self._stopping = True
        if self._resumed is not None:  # what waits at a closed fence gives up: a stop does not wait for it
            self._resumed.set()
        self._emit(self.engine.begin_shutdown(self.clock()))
        await self.origin.unsubscribe()
        grace = self.engine_cfg.shutdown_grace
        with anyio.move_on_after(grace):
            await self._wait_until(lambda: self.engine.drained)
        if not self.engine.drained:
            self.log.warning("shutdown.unacked", in_flight=self.engine.pipeline.in_flight, grace=grace)
        self._emit(self.engine.final_answer())
        with anyio.move_on_after(2.0):
            await self._wait_until(lambda: not self._effects)
            await self.origin.flush()
        self.log.info(
            "source.stopped",
            watermark=self.engine.watermark,
            delivered=self.engine.stats.delivered,
            stored=self.engine.pipeline.stored_messages,
        )

    async def _close(self) -> None:
        self._stopping = True
        with anyio.CancelScope(shield=True):
            if self._publisher is not None:
                await self._publisher.stop()
            await self.origin.close()

    # -- inputs ---------------------------------------------------------------------------------------------

    def _emit(self, effects: list[Effect]) -> None:
        """Queue ``effects`` and perform what needs no waiting; then tell the process's ticker whether the source is
        busy."""
        if effects:
            self._effects.extend(effects)
            self._perform_ready()
            if self._effects:
                self._wake.set()
        wheel = self._wheel
        if wheel is not None:
            engine = self.engine
            if self._paused_at is not None:  # waits at its fence: its tick looks at it, ten times a second
                wheel.wake(self._tick_callback)
            elif not engine.quiet:
                # work came: ticked ten times a second again, once nothing a tick does can be due sooner (a
                # publish awaiting its ack: its ack deadline, ``tick_deadline``)
                now = self.clock()
                wheel.wake(self._tick_callback, engine.tick_deadline(now) - now)
            else:
                wheel.rest(self._tick_callback)  # done before a tick came (its ack was quick): once a second again

    def _perform_ready(self) -> None:
        """Perform now, in order, the effects at the head of the queue that need no waiting, when the executor is
        idle: publishes (written at the end of this event-loop pass with every other source's, ``write_now``) and
        flow-control answers (``answer_now``); the executor takes over at the first that must wait. A delivery or
        an ack of a quiet source makes one or two of these: each woke the executor's task, a task switch per
        source per message, and each answer woke nats-py's flusher too. Same order, same fence: nothing is done
        here that the executor would not do next."""
        effects = self._effects
        if self._performing or self._publisher is None or not effects or not self.may_act():
            return
        # the fence is looked at once for what this call writes: all of it leaves within microseconds of the look
        done = False
        self._performing = True  # what this emits is queued behind, not performed inside
        try:
            while effects:
                head = effects[0]
                if isinstance(head, Publish):
                    if not self._same_target_connection():
                        continue  # its publishes were dropped: the engine sends them again, in order
                    batch = self._take_publishes()
                    failures = self._publisher.write_now(targetwire.publish_sends(batch))
                    if failures is None:  # nats-py without the internals written through: the executor's way
                        effects.extendleft(reversed(batch))
                        break
                    done = True
                    self._publish_failures(failures)
                elif isinstance(head, AnswerFlowControl):
                    if not self.origin.answer_now(head):
                        break
                    effects.popleft()
                    done = True
                    self._answered(head)
                elif isinstance(head, ProbeStranded) and self._tg is not None:
                    effects.popleft()  # (not done: it wakes nothing that waits)
                    self._look(head)
                else:
                    break
        finally:
            self._performing = False
        if done:
            self._notify()

    def _take_publishes(self) -> list[Publish]:
        """Take the run of Publish effects at the head of the queue (at most PUBLISH_BATCH): they leave as one write."""
        effects = self._effects
        batch: list[Publish] = []
        while effects and len(batch) < PUBLISH_BATCH:
            head = effects[0]
            if not isinstance(head, Publish):
                break
            batch.append(head)
            effects.popleft()
        return batch

    async def _wait_until(self, condition: Callable[[], bool]) -> None:
        # woken on every executor pass, publish outcome and tick, so a condition on engine state is seen promptly
        while not condition():
            if self._changed is None:
                self._changed = Flag()
            await self._changed.wait()

    def _notify(self) -> None:
        """Wake what waits in ``_wait_until`` (an event made only while something waits: this runs several times
        per message, and setting an event nobody waits for still costs its machinery)."""
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    def publishes_freed(self) -> None:
        """The process's publishes in flight have room again after this source stopped for want of it."""
        if not self.fenced:
            self._emit(self.engine.publishes_freed(self.clock()))

    def _on_outcomes(self, outcomes: Sequence[AckOutcome]) -> None:
        """The acks one read of the target connection brought, in order."""
        now = self.clock()
        engine = self.engine
        latency = self.observers.latency if self.observers is not None else None
        effects = engine.acks_stored(outcomes, now, time.time_ns(), latency)
        if effects is not None:  # the common read: every ack a plain one, stored
            self._emit(effects)
            self._notify()
            return
        pipeline = engine.pipeline
        for stored, failed in targetwire.outcome_runs(pipeline.expand(outcomes, now)):
            if stored:  # in order: what was stored before a failure first
                pipeline.account_stored(stored, time.time_ns(), latency)  # (before the engine forgets them)
                self._emit(engine.publish_stored_many(stored, now))
            if failed is not None:
                self._publish_error(failed.error)
                self._emit(engine.publish_failed(failed.order, failed.attempt, failed.error, now))
        self._notify()

    def _publish_error(self, error: str) -> None:
        self.last_error = f"publish: {error}"
        if self.observers is not None:
            self.observers.publish_error(error)

    def snapshot(self) -> SourceSnapshot:
        """What metrics, ``/readyz`` and ``status`` show of this source now."""
        engine = self.engine
        pipeline = engine.pipeline
        blocked = pipeline.blocked
        now = self.clock()
        return SourceSnapshot(
            source=self.source.name,
            phase=engine.phase.value,
            origin_connected=self.origin_connected,
            consumer_bound=self.ready.is_set() and not engine.awaits_recovery,
            watermark=engine.watermark,
            last_delivered=engine.stats.last_delivered,
            origin_pending=engine.origin_pending,
            in_flight=pipeline.in_flight,
            backlog=pipeline.backlog,
            replicated_messages=pipeline.stored_messages,
            replicated_bytes=pipeline.stored_bytes,
            deliveries=engine.stats.delivered,
            duplicates=engine.stats.duplicates,
            fc_requests=engine.stats.fc_requests,
            fc_answers=engine.fc_answers,
            mode=self.mode.mode.value if self.mode is not None else "",
            mode_reason=self.mode.reason if self.mode is not None else "",
            resets=dict(engine.resets),
            blocked_reason=blocked.reason if blocked is not None else "",
            stalled=engine.stalled(now),
            waiting_for_origin=engine.silence_excused(now),
            seconds_since_progress=now - engine.stall.since,
            last_replicated_origin_time=(
                pipeline.last_stored_origin_ns / 1e9 if pipeline.last_stored_origin_ns else None
            ),
            oldest_unstored_origin_time=(pipeline.oldest_unstored_origin_ns / 1e9) or None,
            rate_limit=self.source.rate_limit,
            window=engine.window.size,
            link_rtt=engine.window.rtt or None,
            batched=pipeline.batched(now),
            batches=pipeline.batches,
            batch_fallbacks=pipeline.batch_fallbacks,
            last_error=self.last_error,
        )

    def target_reconnected(self) -> None:
        """Called by the bridge when the shared target connection is back (unless a write noticed it first)."""
        if self._publisher is None:
            self._emit(self.engine.target_reconnected(self.clock()))
        else:
            self._same_target_connection()

    def _same_target_connection(self) -> bool:
        """Whether the target connection is the one this source's publishes in flight went out on. nats-py writes
        on a new connection a round trip before it says it reconnected; a publish made in that window, while an
        earlier one was lost with the old connection, would be stored before the earlier one's retry (out of origin
        order: the chaos storm found it). So before anything is written, a new connection is taken as the engine's
        ``target_reconnected``: what was in flight is presumed lost (and verified), and the publishes queued for it
        are dropped, the engine re-sends them in order."""
        assert self._publisher is not None
        epoch = self._publisher.epoch
        if epoch == self._target_epoch:
            return True
        self._target_epoch = epoch
        kept = [effect for effect in self._effects if not isinstance(effect, Publish)]
        self._effects.clear()  # (in place: the executor holds this deque)
        self._effects.extend(kept)
        self._emit(self.engine.target_reconnected(self.clock()))
        return False

    async def _on_disconnected(self) -> None:
        if not self._connected:
            return  # a first connect that failed (nats-py closes it): reported by setup, never "disconnected"
        self.origin_connected = False
        if not self._stopping:
            self.log.warning("origin.disconnected", servers=list(self.source.servers))
            self.waits.begin("origin", servers=list(self.source.servers), error="connection lost, reconnecting")

    async def _on_reconnected(self) -> None:
        if not self._connected:
            return
        self.origin_connected = True
        self.log.info("origin.reconnected")
        self.waits.end("origin")
        self._emit(self.engine.source_reconnected(self.clock()))

    def _on_connection_error(self, exc: Exception) -> None:
        # the shared connection's error (logged once, by the connection): this source's last error all the same
        self.last_error = f"origin: {describe(exc)}"

    async def _on_error(self, exc: Exception) -> None:
        self.last_error = f"origin: {describe(exc)}"
        suppressed = self._error_throttle.allow(self.clock())
        if suppressed is not None:
            self.log.warning("origin.error", **error_fields(exc), similar_suppressed=suppressed)

    async def _ticker(self) -> None:
        ticks = 0
        while True:
            await anyio.sleep(TICK)
            ticks += 1
            if not ticks % QUIET_TICKS or not self.engine.quiet:
                self._tick()

    def _tick(self) -> float:
        """Feed the engine the time (every ``TICK`` seconds, from this runner's ticker or the process's; once a
        second while the engine is quiet, or less often while it has nothing due). 0 when it is busy after; when
        it is quiet, the seconds it has nothing due for (``tick_deadline``; at least a second while paused: its
        fence is looked at here): the shared ticker then calls again no sooner, unless ``_emit`` wakes it first."""
        if self._paused_at is not None and self._fence is not None and self._fence():
            # open again in the same term without a resumption: a renew's reply moved the fence a moment after this
            # source found it closed, before the fleet saw it pass (so it never suspended the lease)
            self.resume()
        now = self.clock()
        if self.origin.reading_behind():  # heartbeats not read yet are not silence (Replication.reading_behind)
            self.engine.reading_behind(now)
        engine = self.engine
        effects = engine.tick(now)
        if effects:  # (else no _emit: within a tick the ticker places the source by what this returns)
            self._emit(effects)
        self._notify()
        rest = engine.rests_for(now, TICK)
        if rest and self._paused_at is not None:
            return 1.0
        return rest

    # -- effects --------------------------------------------------------------------------------------------

    async def _executor(self) -> None:
        effects = self._effects
        while True:
            while effects:
                self._performing = True
                try:
                    if not await self._act():
                        return
                    if not effects:
                        break  # emptied while it waited (a new target connection drops the queued publishes)
                    if isinstance(effects[0], Publish) and not self._same_target_connection():
                        continue  # its publishes were dropped: the engine sends them again, in order
                    batch = self._take_publishes()
                    if batch:
                        await self._publish(batch)
                    else:
                        await self._perform(effects.popleft())
                finally:
                    self._performing = False
            self._notify()
            self._wake = Flag()
            if not effects:
                await self._wake.wait()

    async def _publish(self, batch: list[Publish]) -> None:
        assert self._publisher is not None
        self._publish_failures(await self._publisher.publish(targetwire.publish_sends(batch)))

    def _publish_failures(self, failures: list[tuple[int, int, str]]) -> None:
        for order, attempt, error in failures:
            self._publish_error(error)
            self._emit(self.engine.publish_failed(order, attempt, error, self.clock()))

    async def _perform(self, effect: Effect) -> None:
        assert self._tg is not None
        match effect:
            case Publish():
                await self._publish([effect])
            case AnswerFlowControl():
                await self._answer(effect)
            case RequestReset():
                if not self._stopping:
                    self._tg.start_soon(self._reset, effect)
            case RequestResync():
                if not self._stopping:
                    self._tg.start_soon(self._resync, effect)
            case VerifyStored():
                self._tg.start_soon(self._verify, effect)
            case ReadTargetLimits():
                # in line (the executor waits): bounded, a read that does not come back must not hold the source
                with anyio.move_on_after(LIMITS_READ_BOUND):
                    self._emit(self.engine.target_limits(await self._target_limits(), self.clock()))
            case ProbeStranded():
                self._look(effect)
            case ResizeWindow():
                if not self._stopping:
                    self._tg.start_soon(self._resize_window, effect)
            case Pull():
                await self._pull(effect)
            case Ack():
                await self._ack(effect)
            case FetchOrigin():
                self._tg.start_soon(self._fetch, effect)
            case Notice():
                getattr(self.log, effect.level)(effect.event, **effect.fields)
            case _:
                assert_never(effect)

    async def _answer(self, effect: AnswerFlowControl) -> None:
        if not await self._act():
            return
        try:
            await self.origin.answer(effect)
        except OriginUnavailable as exc:  # the request died with the connection; the Stalled header will ask again
            self.log.debug("fc.answer_failed", error=str(exc))
            return
        self._answered(effect)

    def _answered(self, effect: AnswerFlowControl) -> None:
        asked = self._inlet.fc_arrivals.pop(effect.subject, None)
        if asked is not None and self.observers is not None:
            self.observers.fc_latency.observe(self.clock() - asked)

    async def _resize_window(self, effect: ResizeWindow) -> None:
        engine = self.engine
        try:
            async with self._slot_to_act() as acting:
                if not acting:
                    return
                await self.origin.set_window(effect.size)
        except (BridgeError, OSError) as exc:
            self._emit(engine.window_resize_failed(str(exc), self.clock()))
            return
        self._emit(engine.window_resized(effect.size, self.clock()))

    async def _reset(self, request: RequestReset) -> None:
        self.log.info(
            "reset.requested",
            cause=request.cause.value,
            attempt=request.attempt,
            seq=request.seq,
            watermark=self.engine.watermark,
            last_dseq=self.engine.last_dseq,
        )

        async def send() -> list[Effect]:
            return self.engine.reset_replied(await self.origin.reset(request.seq), self.clock())

        await self._repair(send)

    async def _resync(self, request: RequestResync) -> None:
        self.log.info(
            "resync.requested",
            cause=request.cause.value,
            attempt=request.attempt,
            seq=None,
            watermark=self.engine.watermark,
            last_dseq=self.engine.last_dseq,
        )

        async def anchor() -> list[Effect]:  # the consumer's last delivery anchors the new epoch
            return self.engine.resynced(await self.origin.anchor(), self.clock())

        await self._repair(anchor, request.settle_until)

    async def _repair(self, exchange: Callable[[], Awaitable[list[Effect]]], settle_until: float | None = None) -> None:
        """What a reset and a resync share: stop taking deliveries, wait until ``settle_until`` (the engine's clock)
        when set, bind the consumer (set-up's bind serves the first), hand what the bind found to the engine, which
        takes a consumer at rest as it stands (``consumer_at_rest``), else ``exchange`` with it, take deliveries
        again whatever the outcome, and report the outcome (a failure as ``reset_failed``)."""
        await self.origin.unsubscribe()
        if settle_until is not None:  # pull mode: the old inbox's requests die first (the engine's wait)
            await anyio.sleep(max(0.0, min(settle_until - self.clock(), 5.0)))
        effects: list[Effect] | None
        try:
            if not await self._act():
                return
            # start-up bound the consumer a moment ago: a second create or look-up would only double the
            # JetStream requests of a thousand sources starting at once
            bound, self._bound = self._bound, None
            effects = None if bound is None else self.engine.consumer_at_rest(bound, self.clock())
            while effects is None:
                # a RESET is answered by the consumer itself, so one sent to a deleted consumer waits out the whole
                # reset_timeout unanswered (and an Interest origin drops what is published meanwhile); the stream's
                # API answers a create or look-up at once, and a managed consumer comes back within a round trip
                if self._reach is not None:  # its origin's turn first, outside the slot: a doubted one's holds none
                    await self._reach.turn(self._origin)
                async with self._slot_to_act() as acting:
                    if not acting:
                        return
                    looked_up = await self._reaching(self.origin.bind()) if bound is None else None
                    if self.may_act():
                        if looked_up is not None:
                            self._log_start(looked_up)
                            self.engine.consumer_start(looked_up.start_seq)
                            effects = self.engine.consumer_at_rest(looked_up, self.clock())
                        if effects is None:
                            effects = await self._reaching(exchange())
                        break
                # the lease was suspended during the bind: the fence is waited for outside the slot, and the
                # consumer bound again once it opens (what this bind found is old by then)
                bound = None
        except ApiTimeout as exc:
            reason = f"{exc} (consumer leaderless, or origin unreachable)"
            self.last_error = f"reset: {reason}"
            effects = self.engine.reset_failed(reason, self.clock())
        except (BridgeError, OSError) as exc:
            effects = self.engine.reset_failed(str(exc), self.clock())
        finally:
            if not self._stopping:
                await self._subscribe()
        if self.fenced:
            return
        self._emit(effects)
        if self.engine.takes_deliveries:
            self.ready.set()

    async def _reaching(self, request: Awaitable[_R]) -> _R:
        """``request`` to the origin, its outcome told to the process's ``reach``: no answer (a timeout, no
        responders, the connection down) puts the origin in doubt; any answer, an error reply too, clears it."""
        reach = self._reach
        if reach is None:
            return await request
        try:
            result = await request
        except (ApiTimeout, ApiUnavailable, OriginUnavailable):
            self._origin.doubt()
            raise
        except BridgeError:
            reach.answered(self._origin)
            raise
        reach.answered(self._origin)
        return result

    async def _pull(self, request: Pull) -> None:
        if not await self._act():
            return
        try:
            await self.origin.pull(request)
        except OriginUnavailable as exc:  # the connection is down: its return resyncs, which pulls again
            self.log.debug("pull.failed", error=str(exc))

    async def _ack(self, request: Ack) -> None:
        if not await self._act():
            return
        try:
            await self.origin.ack(request.replies)
        except OriginUnavailable as exc:  # a lost ack comes back as a redelivery, acked again
            self.log.debug("ack.failed", error=str(exc), acks=len(request.replies))

    async def _fetch(self, request: FetchOrigin) -> None:
        engine = self.engine
        try:
            async with self._api_slot():
                messages = await self.origin.fetch(request.after, request.through)
        except (BridgeError, OSError) as exc:
            self._emit(engine.fetch_failed(str(exc), self.clock()))
            return
        if self.fenced:
            return
        self._emit(engine.fetched(messages, request.through, self.clock()))
        if engine.takes_deliveries:
            self.ready.set()

    async def _verify(self, request: VerifyStored) -> None:
        wanted = set(request.stream_seqs)
        try:
            # bounded: the engine asks for no other read until this one answers, so one that never did would hold
            # its source blocked for good (2,000 sources after a reconnect storm: 9 blocked for over a minute with
            # none answered, most likely queued behind hundreds of others' tail reads; a hang is not excluded)
            with anyio.fail_after(VERIFY_BOUND):
                copies, _ = await self._read_tail(self.engine.watermark)
        except TimeoutError:  # (an OSError too: first)
            self._emit(self.engine.verify_failed(f"no read of the aggregate within {VERIFY_BOUND:g}s", self.clock()))
            return
        except (BridgeError, OSError) as exc:
            self._emit(self.engine.verify_failed(str(exc), self.clock()))
            return
        present = {copy.stream_seq for copy in copies} & wanted
        self._emit(self.engine.verified(request.generation, present, self.clock()))

    async def _probe_stranded(self, probe: ProbeStranded) -> None:
        try:
            async with self._api_slot():
                first = await self.origin.first_seq_from(probe.start)
        except (BridgeError, OSError) as exc:
            self._stranded_looked(0, str(exc))
            return
        self._stranded_looked(first, None)

    def _look(self, probe: ProbeStranded) -> None:
        """Perform a look for stranded messages, without waiting: sent at once (``_probe_soon``), put off when
        every API slot is taken, else (a filtered consumer: a request per filter) in a task of its own."""
        assert self._tg is not None
        if not self._probe_soon(probe):
            self._tg.start_soon(self._probe_stranded, probe)

    def _probe_soon(self, probe: ProbeStranded) -> bool:
        """The look for stranded messages without a task of its own (``first_seq_soon``) when a slot is free, or
        put off to its next interval when none is: True either way; False when the origin cannot ask so now (then
        ``_probe_stranded``). A task and nats-py's request were most of what a look cost (about 550k instructions,
        210k so), and a process that starts, or comes back from a storm, makes a look per source within seconds,
        then more at doubling intervals. A look is a safety net (messages a server restart may have left behind),
        never urgent: queued for a slot, a thousand of them waited behind the set-ups and resets that are (bench
        edge, 1,000 sources: a median of 1.1 s each, some 10 s, a task and a tick a second each while they did)."""
        api, borrower = self._api, object()
        if api is not None and not _slot_now(api, borrower):
            self._stranded_looked(0, "put off: every JetStream API request slot of the process is in use")
            return True

        def looked(first: int, error: str | None) -> None:
            if api is not None:
                api.release_on_behalf_of(borrower)
            if not self.fenced:  # the task of a look is cancelled with its runner; this answer is dropped instead
                self._stranded_looked(first, error)

        if self.origin.first_seq_soon(probe.start, looked):
            return True
        if api is not None:
            api.release_on_behalf_of(borrower)
        return False

    def _stranded_looked(self, first: int, error: str | None) -> None:
        """What a look found: the origin's first message at or after its start (0: none), or why it could not say."""
        if error is not None:
            self.log.debug("stranded.check_failed", error=error)
            self._emit(self.engine.stranded_probe_failed(error, self.clock()))
        else:
            self._emit(self.engine.stranded_probed(first, self.clock()))
        if self._wheel is not None:
            # the answer may bring the engine's deadline forward (a confirmation due in seconds): the next tick
            # places the source by it (``tick_deadline`` keeps no timer for a look that is out)
            self._wheel.wake(self._tick_callback)

    async def _subscribe(self) -> None:
        try:
            await self.origin.subscribe(self._inlet)
        except OriginUnavailable as exc:  # not connected: the next reset (silence) subscribes again
            self.log.warning("subscribe.failed", error=str(exc))


def _slot_now(limiter: anyio.CapacityLimiter, borrower: object) -> bool:
    """Take one of ``limiter``'s tokens for ``borrower`` if one is free now; False when none is (without asking,
    which raises WouldBlock: an exception and a traceback for each of a thousand looks put off)."""
    if limiter.available_tokens < 1:
        return False
    try:
        limiter.acquire_on_behalf_of_nowait(borrower)
    except anyio.WouldBlock:  # a token just released, and others already wait for it
        return False
    return True
