"""One source's pipeline: the engine driven by a subscription, a publisher, a ticker and one effect executor.

Task ownership (all inside the runner's task group, cancelled together when the runner ends):

* the nats-py subscription callback feeds deliveries to the engine (nats-py runs it in its own per-subscription
  task; it never awaits I/O, it only queues effects);
* the publisher's ack callback feeds publish outcomes;
* ``_ticker`` feeds the clock every ``TICK`` seconds (timeouts, retries, silence, due resets);
* ``_executor`` performs effects, in the order the engine produced them, so publishes reach the target in
  origin order. One shortcut: once the wire parser has handed over everything a read brought, ``_write_ready``
  writes the publishes at the head of the queue itself if the executor is idle (same order, one write per burst,
  no wait for the executor's turn);
* a RESET runs in a task of its own (it can take ``reset_timeout``): publishing goes on meanwhile.

Shutdown (``stop`` set): deliveries stop (unsubscribe), nothing new is published, in-flight acks are awaited up to
``shutdown_grace``, a held flow-control request is answered with what is stored, then the connection closes.

The fence (with leases, ``bridge.core.fleet``): every action on the source, a publish batch, a flow-control answer,
a RESET and a consumer create or look-up, is preceded by ``fence()``, checked at the moment of the I/O from the
monotonic clock. Once it says no, the runner abandons the source at once: it unsubscribes, drops every queued
effect and ends without the drain's final answer. A process frozen past its lease wakes into that check before it
can act on anything it had buffered.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.abc import TaskGroup
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridge.core import inbound
from bridge.core.backoff import Backoff
from bridge.core.effects import AnswerFlowControl, Effect, Notice, Publish, RequestReset, VerifyStored
from bridge.core.engine import EngineSettings, Phase, SourceEngine
from bridge.core.headers import parse_header_block
from bridge.core.pipeline import EntryState, OutboundMessage
from bridge.core.recovery import Copy, recover, recovery_depth
from bridge.core.subjects import SubjectSet
from bridge.errors import BridgeError, ConsumerUnfit, OriginUnavailable
from bridge.io import wire
from bridge.io.aggregate import read_source_tail
from bridge.io.connect import describe, error_fields, open_connection
from bridge.io.consumer import ensure_consumer
from bridge.io.jsapi import ApiError, ApiTimeout, ApiUnavailable, JsApi
from bridge.io.target import AckOutcome, SourcePublisher
from bridge.logs import Throttle, get_logger
from bridge.observe.metrics import SourceObservers, SourceSnapshot

TICK = 0.1
LIMITS_REFRESH = 5.0  # seconds between re-reading the target's limits and subjects while blocked
BLOCKED_LOG_INTERVAL = 30.0  # a blocked publish is logged when it blocks, then at most this often
PUBLISH_BATCH = 256  # publishes written to the target in one command at most
SETUP_BACKOFF = Backoff(1.0, 30.0)
STRANDED_CHECK = 10.0  # seconds between looks for WorkQueue messages stranded below the ack floor
STRANDED_CONFIRM = 2.0  # seconds before a second look confirms what the first one found


@dataclass(frozen=True, slots=True)
class TargetSide:
    """The shared connection to the aggregate, as a source runner sees it."""

    nc: NATS
    api: JsApi
    stream: str
    publish_window: int
    ack_timeout: float


def engine_settings(source: Any, engine: Any, target: TargetSide) -> EngineSettings:
    """Map configuration objects onto the core's plain settings."""
    return EngineSettings(
        source=source.name,
        stream=source.stream,
        consumer=source.consumer,
        subject_prefix=source.subject_prefix,
        publish_window=target.publish_window,
        ack_timeout=target.ack_timeout,
        silence_timeout=engine.silence_timeout,
        reset_backoff=Backoff(engine.reset_backoff_initial, engine.reset_backoff_max),
        publish_retry=Backoff(engine.publish_retry_initial, engine.publish_retry_max),
    )


class SourceRunner:
    """Runs one source until ``stop`` is set; never raises for origin or target trouble (it logs and retries)."""

    def __init__(
        self,
        source: Any,
        engine: Any,
        target: TargetSide,
        clock: Callable[[], float] = time.monotonic,
        *,
        observers: SourceObservers | None = None,
        stalled_after: float = 60.0,
        fence: Callable[[], bool] | None = None,
    ):
        self.source = source
        self.engine_cfg = engine
        self.target = target
        self.clock = clock
        self.observers = observers
        self.stalled_after = stalled_after
        self._fence = fence
        self.fenced = False  # the fence closed: nothing more is done for this source
        self.log = get_logger(source=source.name)
        self.engine = SourceEngine(engine_settings(source, engine, target), clock())
        self.ready = anyio.Event()  # connected, consumer bound, first reset done
        self._effects: deque[Effect] = deque()
        self._wake = anyio.Event()
        self._changed = anyio.Event()
        self._nc: NATS | None = None
        self._api: JsApi | None = None
        self._sub: Subscription | None = None
        self._publisher: SourcePublisher | None = None
        self._tg: TaskGroup | None = None
        self._stopping = False
        self._performing = False  # the executor is performing an effect (it may be suspended in it)
        self._workqueue = False  # the origin has WorkQueue retention: checked for stranded messages
        self._checking_stranded = False
        self._stranded_seen = 0  # first stranded sequence the previous check found (0: none)
        self._next_stranded_check = 0.0
        self._error_throttle = Throttle()
        self._blocked_throttle = Throttle(BLOCKED_LOG_INTERVAL)
        # observed state, for metrics, /readyz and status (never for decisions)
        self.origin_connected = False
        self.last_error = ""
        self._last_delivered = 0
        self._origin_pending = 0
        self._replicated_bytes = 0
        self._last_replicated_origin_ns: int | None = None
        self._fc_arrivals: dict[str, float] = {}
        self._progress_mark = -1
        self._progress_at = clock()
        self._stalled = False
        self._consumer_created: str | None = None  # the bound consumer's creation time: a new one is a re-creation

    # -- life cycle -----------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event) -> None:
        """Connect, bind the consumer, recover, replicate; on ``stop`` drain and return."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._watch_stop, stop, tg)
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
            tg.start_soon(self._ticker)
        await self._close()

    def may_act(self) -> bool:
        """The fence, checked right before every action on the source; abandons the source once it is closed."""
        if self.fenced:
            return False
        if self._fence is None or self._fence():
            return True
        self.abandon("lease fence closed")
        return False

    def abandon(self, reason: str) -> None:
        """Stop at once, doing nothing more for the source: no publish, no answer, no reset (the lease is gone)."""
        if self.fenced:
            return
        self.fenced = True
        self._stopping = True
        dropped = sum(1 for effect in self._effects if isinstance(effect, Publish | AnswerFlowControl))
        self._effects.clear()
        self.log.warning("source.fenced", reason=reason, dropped_actions=dropped, watermark=self.engine.watermark)
        if self._sub is not None:
            wire.remove_handler(self._nc, self._sub)  # nothing more is taken from the deliver subject
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _watch_stop(self, stop: anyio.Event, tg: TaskGroup) -> None:
        await stop.wait()
        if self._publisher is None:
            tg.cancel_scope.cancel()  # still setting up: nothing in flight to wait for
            return
        await self._shutdown()
        tg.cancel_scope.cancel()

    async def _setup(self, stop: anyio.Event) -> None:
        attempt = 0
        while not stop.is_set():
            attempt += 1
            try:
                await self._setup_once()
                return
            except (BridgeError, OSError) as exc:
                self.last_error = str(exc)
                delay = SETUP_BACKOFF.delay(attempt)
                level = "error" if isinstance(exc, ConsumerUnfit) or attempt > 3 else "warning"
                getattr(self.log, level)(
                    "source.setup_failed", error=str(exc), error_type=type(exc).__name__, retry_in=delay
                )
                with anyio.move_on_after(delay):
                    await stop.wait()

    async def _setup_once(self) -> None:
        src = self.source
        if self._nc is None:
            self._nc = await open_connection(
                src,
                name=f"nats-bridge source {src.name}",
                error_type=OriginUnavailable,
                on_disconnected=self._on_disconnected,
                on_reconnected=self._on_reconnected,
                on_error=self._on_error,
            )
            self._api = JsApi(self._nc, src.api_prefix)
            wire.add_after_parse(self._nc, self._write_ready)  # deliveries make publishes
            self.origin_connected = True
            self.log.info("origin.connected", servers=list(src.servers), api_prefix=src.api_prefix)
        api = self._api
        assert api is not None
        timeout = self.engine_cfg.reset_timeout
        try:
            origin = await api.stream_info(src.stream, timeout=timeout)
        except ApiError as exc:
            raise OriginUnavailable(f"origin stream {src.stream!r}: {exc.description}") from exc
        except (ApiTimeout, ApiUnavailable) as exc:
            raise OriginUnavailable(f"origin stream {src.stream!r}: {exc}") from exc
        self._workqueue = origin.get("config", {}).get("retention") == "workqueue"
        if not self.may_act():
            return  # abandoned: the task group is cancelled, nothing more starts
        info = await ensure_consumer(api, src, manage=src.manage_consumer, timeout=timeout)
        self._consumer_created = info.get("created")
        self.log.info(
            "consumer.bound",
            consumer=src.consumer,
            managed=src.manage_consumer,
            ack_floor=info.get("ack_floor", {}).get("stream_seq"),
            num_pending=info.get("num_pending"),
        )
        if self.engine.phase is Phase.RECOVERING:
            await self._recover(origin, int(info.get("ack_floor", {}).get("stream_seq", 0)))
        if self._publisher is None:
            self._publisher = SourcePublisher(self.target.nc, self._on_outcome)
            await self._publisher.start()
            wire.add_after_parse(self.target.nc, self._write_ready)  # acks free the window for more
        await self._refresh_target_limits()

    async def _refresh_target_limits(self) -> None:
        """Learn what the target takes: the largest message (stream ``max_msg_size``, server ``max_payload``) and the
        stream's subjects.

        The pipeline does not send a message above the size, and sends one whose subject does not look captured
        alone (see ``PublishPipeline.take_sendable``); refreshed while the source is blocked so that an operator's
        fix unblocks it.
        """
        limits = [int(self.target.nc.max_payload or 0)]
        try:
            info = await self.target.api.stream_info(self.target.stream, timeout=self.engine_cfg.reset_timeout)
            config = info.get("config", {})
            limits.append(int(config.get("max_msg_size", -1)))
            self.engine.pipeline.subjects = SubjectSet(config.get("subjects") or ())
        except BridgeError as exc:
            self.log.debug("target.limits_unknown", error=str(exc))
        positive = [n for n in limits if n > 0]
        self.engine.pipeline.size_limit = min(positive) if positive else 0

    async def _read_tail(self, floor: int) -> tuple[list[Copy], bool]:
        """This source's copies in the aggregate above ``floor`` (see ``read_source_tail``)."""
        src = self.source
        return await read_source_tail(
            self.target.nc,
            self.target.api,
            self.target.stream,
            src.name,
            f"{src.subject_prefix}.>" if src.subject_prefix else ">",
            floor,
            recovery_depth(self.target.publish_window),
            self.engine_cfg.reset_timeout,
        )

    async def _verify(self, request: VerifyStored) -> None:
        wanted = set(request.stream_seqs)
        try:
            copies, _ = await self._read_tail(self.engine.watermark)
        except (BridgeError, OSError) as exc:
            self._emit(self.engine.verify_failed(str(exc), self.clock()))
            return
        present = {copy.stream_seq for copy in copies} & wanted
        self._emit(self.engine.verified(request.generation, present, self.clock()))

    async def _recover(self, origin_info: dict[str, Any], floor: int) -> None:
        src = self.source
        started = self.clock()
        copies, complete = await self._read_tail(floor)
        result = recover(copies, floor, complete)
        last_seq = int(origin_info.get("state", {}).get("last_seq", 0))
        if result.watermark > last_seq:
            # the origin's sequence went backwards: the stream was recreated. Replicating would drop every new
            # message up to the old watermark as a "duplicate"; an operator has to decide.
            raise ConsumerUnfit(
                f"origin stream {src.stream!r} ends at sequence {last_seq} but the aggregate already holds this "
                f"source up to {result.watermark}: the origin stream was recreated or reset. Give the source a new "
                "name (new dedupe ids and provenance) or remove its old copies from the aggregate"
            )
        self.log.info(
            "recovery.done",
            watermark=result.watermark,
            present_above=len(result.present),
            ack_floor=floor,
            copies_read=result.copies_read,
            complete=complete,
            seconds=round(self.clock() - started, 3),
        )
        self._emit(self.engine.recovered(result.watermark, result.present, self.clock()))

    async def _shutdown(self) -> None:
        self._stopping = True
        self._emit(self.engine.begin_shutdown(self.clock()))
        await self._unsubscribe()
        grace = self.engine_cfg.shutdown_grace
        with anyio.move_on_after(grace):
            await self._wait_until(lambda: self.engine.drained)
        if not self.engine.drained:
            self.log.warning("shutdown.unacked", in_flight=self.engine.pipeline.in_flight, grace=grace)
        self._emit(self.engine.final_answer())
        with anyio.move_on_after(2.0):
            await self._wait_until(lambda: not self._effects)
            if self._nc is not None and self._nc.is_connected:
                with contextlib.suppress(Exception):
                    await self._nc.flush(timeout=1)
        self.log.info(
            "source.stopped",
            watermark=self.engine.watermark,
            delivered=self.engine.stats.delivered,
            stored=self.engine.pipeline.stored_messages,
        )

    async def _close(self) -> None:
        self._stopping = True
        with anyio.CancelScope(shield=True):
            wire.remove_after_parse(self.target.nc, self._write_ready)  # the target connection outlives this source
            if self._publisher is not None:
                await self._publisher.stop()
            if self._nc is not None:
                with contextlib.suppress(Exception):
                    await self._nc.close()

    # -- inputs ---------------------------------------------------------------------------------------------

    def _emit(self, effects: list[Effect]) -> None:
        if effects:
            self._effects.extend(effects)
            self._wake.set()

    def _write_ready(self) -> None:
        """Write the publishes at the head of the queue now, if nothing is under way (called by the wire parser
        once it has handed over everything one read brought: deliveries and acks come in bursts, so this is one
        write per burst, an event-loop pass before the executor would make it)."""
        if self._performing or self._publisher is None:
            return
        if not (self._effects and isinstance(self._effects[0], Publish)) or not self.may_act():
            return
        batch = self._take_publishes()
        failures = self._publisher.write_now(_sends(batch))
        if failures is None:  # nats-py has unwritten data: these go behind it, through the executor
            self._effects.extendleft(reversed(batch))
            return
        self._publish_failures(failures)

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
            self._changed = anyio.Event()
            await self._changed.wait()

    async def _on_delivery(self, msg: Msg) -> None:
        # nats-py's own dispatch, used only where the wire parser could not be installed (see bridge.io.wire)
        self._receive(inbound.classify(msg.subject, msg.reply, msg.headers, msg.data))

    def _on_wire_delivery(self, subject: bytes, reply: bytes, header: bytes | None, payload: bytes) -> None:
        headers = parse_header_block(header) if header is not None else None
        self._receive(inbound.classify(subject.decode(), reply.decode(), headers, payload))

    def _receive(self, message: inbound.Inbound) -> None:
        if self.fenced:
            return
        now = self.clock()
        if isinstance(message, inbound.Data):
            self._last_delivered = message.ack.stream_seq
            self._origin_pending = message.ack.pending
        elif isinstance(message, inbound.FlowControlRequest):
            if len(self._fc_arrivals) > 16:  # requests superseded or answered while disconnected
                self._fc_arrivals.clear()
            self._fc_arrivals[message.reply] = now
        self._emit(self.engine.receive(message, now))

    def _on_outcome(self, outcome: AckOutcome) -> None:
        now = self.clock()
        if outcome.stored:
            self._observe_stored(outcome.order)
            self._emit(self.engine.publish_stored(outcome.order, outcome.attempt, now))
        else:
            self._publish_error(outcome.error)
            self._emit(self.engine.publish_failed(outcome.order, outcome.attempt, outcome.error, now))
        self._changed.set()

    def _observe_stored(self, order: int) -> None:
        entry = self.engine.pipeline.entry(order)
        if entry is None or entry.state is EntryState.STORED or entry.message is None:
            return  # a duplicate ack, or a marker
        message = entry.message
        self._replicated_bytes += len(message.payload)
        origin_ns = message.origin_ns
        if origin_ns:
            if self._last_replicated_origin_ns is None or origin_ns > self._last_replicated_origin_ns:
                self._last_replicated_origin_ns = origin_ns
            if self.observers is not None:
                self.observers.latency.observe(max(0.0, (time.time_ns() - origin_ns) / 1e9))

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
        since = now - self._progress_at
        return SourceSnapshot(
            source=self.source.name,
            phase=engine.phase.value,
            origin_connected=self.origin_connected,
            consumer_bound=self.ready.is_set() and engine.phase is not Phase.RECOVERING,
            watermark=engine.watermark,
            last_delivered=self._last_delivered,
            origin_pending=self._origin_pending,
            in_flight=pipeline.in_flight,
            backlog=pipeline.backlog,
            replicated_messages=pipeline.stored_messages,
            replicated_bytes=self._replicated_bytes,
            deliveries=engine.stats.delivered,
            duplicates=engine.stats.duplicates,
            fc_requests=engine.stats.fc_requests,
            fc_answers=engine.stats.fc_answers,
            resets=dict(engine.resets),
            blocked_reason=blocked.reason if blocked is not None else "",
            # the ticker decides (and logs) while the source runs; a source that never got that far, still
            # failing to connect or bind, counts as stalled once it has been so for as long
            stalled=self._stalled or since >= self.stalled_after,
            seconds_since_progress=since,
            last_replicated_origin_time=(
                self._last_replicated_origin_ns / 1e9 if self._last_replicated_origin_ns is not None else None
            ),
            last_error=self.last_error,
        )

    def _track_progress(self, now: float) -> None:
        # "stalled" = something waits to be replicated and the watermark has not moved for stalled_after; an idle
        # source (nothing pending, nothing in the pipeline) is never stalled
        pipeline = self.engine.pipeline
        idle = self._origin_pending == 0 and pipeline.empty and pipeline.blocked is None
        last_progress = self._progress_at
        if idle or self.engine.watermark != self._progress_mark:
            self._progress_mark = self.engine.watermark
            self._progress_at = now
        # decided here only, so the metric, /readyz and the log can never disagree; logged on the transitions
        stalled = now - self._progress_at >= self.stalled_after
        if stalled == self._stalled:
            return
        self._stalled = stalled
        if stalled:
            blocked = pipeline.blocked
            self.log.warning(
                "source.stalled",
                watermark=self.engine.watermark,
                seconds_without_progress=round(now - self._progress_at, 1),
                stalled_after=self.stalled_after,
                origin_pending=self._origin_pending,
                backlog=pipeline.backlog,
                blocked=blocked.reason if blocked is not None else None,
            )
        else:
            self.log.info(
                "source.recovered",
                watermark=self.engine.watermark,
                seconds_without_progress=round(now - last_progress, 1),
                idle=idle,
            )

    def target_reconnected(self) -> None:
        """Called by the bridge when the shared target connection is back."""
        self._emit(self.engine.target_reconnected(self.clock()))

    async def _on_disconnected(self) -> None:
        self.origin_connected = False
        if not self._stopping:
            self.log.warning("origin.disconnected")

    async def _on_reconnected(self) -> None:
        self.origin_connected = True
        self.log.info("origin.reconnected")
        self._emit(self.engine.source_reconnected(self.clock()))

    async def _on_error(self, exc: Exception) -> None:
        self.last_error = f"origin: {describe(exc)}"
        suppressed = self._error_throttle.allow(self.clock())
        if suppressed is not None:
            self.log.warning("origin.error", **error_fields(exc), similar_suppressed=suppressed)

    async def _ticker(self) -> None:
        last_refresh = self.clock()
        self._next_stranded_check = last_refresh + STRANDED_CHECK
        while True:
            await anyio.sleep(TICK)
            now = self.clock()
            if self.engine.pipeline.degraded and now - last_refresh >= LIMITS_REFRESH:
                last_refresh = now
                await self._refresh_target_limits()
            if self._workqueue and now >= self._next_stranded_check and not self._checking_stranded:
                self._next_stranded_check = now + STRANDED_CHECK
                self._checking_stranded = True
                assert self._tg is not None
                self._tg.start_soon(self._check_stranded)
            self._emit(self.engine.tick(now))
            self._track_progress(now)
            self._changed.set()

    # -- effects --------------------------------------------------------------------------------------------

    async def _executor(self) -> None:
        effects = self._effects
        while True:
            while effects:
                self._performing = True
                try:
                    if not self.may_act():
                        return
                    batch = self._take_publishes()
                    if batch:
                        assert self._publisher is not None
                        self._publish_failures(await self._publisher.publish(_sends(batch)))
                    else:
                        await self._perform(effects.popleft())
                finally:
                    self._performing = False
            self._changed.set()
            self._wake = anyio.Event()
            if not effects:
                await self._wake.wait()

    def _publish_failures(self, failures: list[tuple[int, int, str]]) -> None:
        for order, attempt, error in failures:
            self._publish_error(error)
            self._emit(self.engine.publish_failed(order, attempt, error, self.clock()))

    async def _perform(self, effect: Effect) -> None:
        if isinstance(effect, AnswerFlowControl):
            await self._answer(effect)
        elif isinstance(effect, RequestReset):
            if not self._stopping:
                assert self._tg is not None
                self._tg.start_soon(self._reset, effect)
        elif isinstance(effect, VerifyStored):
            assert self._tg is not None
            self._tg.start_soon(self._verify, effect)
        elif isinstance(effect, Notice):
            self._log_notice(effect)

    def _log_notice(self, notice: Notice) -> None:
        if notice.event == "publish.blocked":
            # the engine reports every failed retry; the log gets the state change, then a reminder per interval
            suppressed = self._blocked_throttle.allow(self.clock())
            if suppressed is None:
                return
            fields = {**notice.fields, "similar_suppressed": suppressed}
        else:
            if notice.event == "publish.unblocked":
                self._blocked_throttle = Throttle(BLOCKED_LOG_INTERVAL)  # the next block is news again
            fields = dict(notice.fields)
        getattr(self.log, notice.level)(notice.event, **fields)

    async def _answer(self, effect: AnswerFlowControl) -> None:
        if self._nc is None or not self.may_act():
            return
        headers = (
            {"Nats-Last-Consumer": str(effect.last_consumer), "Nats-Last-Stream": str(effect.last_stream)}
            if effect.acks
            else None
        )
        try:
            await self._nc.publish(effect.subject, b"", headers=headers)
        except Exception as exc:  # the request died with the connection; the Stalled header will ask again
            self.log.debug("fc.answer_failed", error=describe(exc))
            return
        asked = self._fc_arrivals.pop(effect.subject, None)
        if asked is not None and self.observers is not None:
            self.observers.fc_latency.observe(self.clock() - asked)

    async def _reset(self, request: RequestReset) -> None:
        src = self.source
        api = self._api
        assert api is not None
        self.log.info(
            "reset.requested",
            cause=request.cause.value,
            attempt=request.attempt,
            seq=request.seq,
            watermark=self.engine.watermark,
            last_dseq=self.engine.last_dseq,
        )
        await self._unsubscribe()
        effects: list[Effect]
        try:
            if not self.may_act():
                return
            await self._bind_again(api)
            if not self.may_act():
                return
            reply = await api.reset_consumer(
                src.stream, src.consumer, timeout=self.engine_cfg.reset_timeout, seq=request.seq
            )
            if reply.get("config", {}).get("ack_policy") not in (None, "flow_control"):
                raise ConsumerUnfit(f"consumer {src.stream}/{src.consumer} no longer has ack_policy flow_control")
            effects = self.engine.reset_succeeded(int(reply["reset_seq"]), self.clock())
        except ApiTimeout as exc:
            reason = f"{exc} (consumer leaderless, or origin unreachable)"
            self.last_error = f"reset: {reason}"
            effects = self.engine.reset_failed(reason, self.clock())
        except (ApiError, ApiUnavailable, ConsumerUnfit, KeyError, ValueError) as exc:
            effects = self.engine.reset_failed(str(exc), self.clock())
        finally:
            if not self._stopping:
                await self._subscribe()
        if self.fenced:
            return
        self._emit(effects)
        if self.engine.phase is Phase.RUNNING:
            self.ready.set()

    async def _check_stranded(self) -> None:
        """Look for WorkQueue messages our answers acked that the origin still holds (``SourceEngine.stranded``).

        The same first message must be found twice in a row: an answer may still be on its way to the server, and
        on a clustered stream the deletions of an ack land a little after it.
        """
        src, api = self.source, self._api
        try:
            acked = self.engine.acked_stream_seq
            start = self.engine.skipped_through + 1
            if api is None or self.engine.phase is not Phase.RUNNING or acked < start:
                return
            timeout = self.engine_cfg.reset_timeout
            if src.filter_subjects:
                found = [await api.first_seq_from(src.stream, start, f, timeout) for f in src.filter_subjects]
                first = min((seq for seq in found if seq), default=0)
            else:  # the stream's first message (STREAM.INFO, which the bridge may use anyway)
                state = (await api.stream_info(src.stream, timeout=timeout)).get("state", {})
                first = int(state.get("first_seq", 0)) if int(state.get("messages", 0)) else 0
                first = first if first >= start else 0
            if first and first <= acked and first == self._stranded_seen:
                self._emit(self.engine.stranded(first, self.clock()))
                first = 0
            self._stranded_seen = first if first <= acked else 0
            if self._stranded_seen:  # confirm (or not) soon rather than after a whole interval
                self._next_stranded_check = min(self._next_stranded_check, self.clock() + STRANDED_CONFIRM)
        except (BridgeError, OSError) as exc:
            self.log.debug("stranded.check_failed", error=str(exc))
        finally:
            self._checking_stranded = False

    async def _bind_again(self, api: JsApi) -> None:
        """Create (managed) or look up (bound) the consumer again before asking it to reset.

        A RESET is answered by the consumer itself (``consumer.go`` subscribes its ``resetSubj``), so one sent to a
        deleted consumer waits out the whole ``reset_timeout`` unanswered, and an Interest origin meanwhile drops
        every message published while nobody is interested. The stream's API answers a create or a look-up at
        once: it is the call start-up makes, with the same permissions, and a managed consumer comes back within a
        round trip (a bound one that is gone raises ``ConsumerUnfit``, so the source blocks loudly).
        """
        src = self.source
        info = await ensure_consumer(api, src, manage=src.manage_consumer, timeout=self.engine_cfg.reset_timeout)
        created = info.get("created")
        if created != self._consumer_created:
            self.log.warning("consumer.recreated", consumer=src.consumer, created=created)
            self._consumer_created = created

    async def _subscribe(self) -> None:
        if self._nc is None or self._sub is not None:
            return
        # generous pending limits: the server never has more than max_ack_pending deliveries outstanding, and a
        # slow-consumer drop would only cost a reset
        limit = max(4 * self.source.max_ack_pending, 65536)
        try:
            self._sub = await self._nc.subscribe(
                self.source.deliver_subject,
                cb=self._on_delivery,
                pending_msgs_limit=limit,
                pending_bytes_limit=512 * 1024 * 1024,
            )
            wire.add_handler(self._nc, self._sub, self._on_wire_delivery)
        except Exception as exc:  # not connected: the next reset (silence) subscribes again
            self.log.warning("subscribe.failed", error=describe(exc))

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            wire.remove_handler(self._nc, sub)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def _sends(batch: list[Publish]) -> list[tuple[OutboundMessage, int, int]]:
    """What the publisher takes for each Publish effect: the message, its order token and the attempt."""
    sends = []
    for publish in batch:
        message = publish.entry.message
        assert message is not None  # markers (no message) are never published
        sends.append((message, publish.entry.order, publish.attempt))
    return sends
