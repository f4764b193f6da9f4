"""What both consumer models share: one source's replication into the aggregate, whatever reads the origin.

``Replication`` is the base of the two engines: ``bridge.core.engine.SourceEngine`` (a push consumer with
``ack_policy: flow_control``, acked by flow-control answers, repaired by ``CONSUMER.RESET``) and
``bridge.core.pull.PullEngine`` (a pull consumer with explicit acks, for origins older than nats-server 2.14,
repaired by a resync). Both take origin messages in origin order and hand them to the same publish pipeline, with
the same provenance headers, duplicate check, recovery, verification of ambiguous failures, target limits, stall
watch and reset scheduling; each decides for itself what to ack and when (``_cover``) and how deliveries are
checked for gaps. Time is always an argument; nothing here performs I/O.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bridge.core import headers as hdr
from bridge.core.backoff import Backoff
from bridge.core.effects import (
    BoundConsumer,
    Effect,
    Notice,
    OriginMessage,
    PullAnchor,
    ReadTargetLimits,
    ResetCause,
    ResetReply,
    VerifyStored,
)
from bridge.core.histogram import LoopHistogram
from bridge.core.inbound import Data, Inbound, Unrecognised
from bridge.core.modes import Mode
from bridge.core.phases import Event, Phase, PhaseMachine
from bridge.core.pipeline import AckOutcome, OutboundMessage, PublishPipeline, TargetLimits
from bridge.core.reach import Origin
from bridge.core.resets import ResetScheduler
from bridge.core.transforms import SubjectTransforms
from bridge.core.watch import StallWatch
from bridge.core.window import Window

__all__ = ["EngineSettings", "EngineStats", "Replication"]


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The engine's knobs; plain values so the core does not depend on the configuration layer."""

    source: str
    stream: str
    consumer: str
    # mirrored from the configuration, whose defaults are the only ones (bridge.config)
    publish_window: int
    ack_timeout: float
    silence_timeout: float
    reset_backoff: Backoff
    publish_retry: Backoff
    stalled_after: float  # no watermark progress for this long, with work waiting: the source is stalled
    # the core's own
    subject_prefix: str | None = None
    # (src, dest) pairs, nats-server's syntax (bridge.core.transforms): where each copy lands, before the prefix
    subject_transforms: tuple[tuple[str, str], ...] = ()
    reconnect_silence: float = 2.0
    reset_min_interval: float = 2.0
    limits_refresh: float = 5.0  # seconds between reads of the target's limits while the source is blocked
    blocked_notice_interval: float = 30.0  # a blocked publish is reported when it blocks, then at most this often
    # pull mode only: messages asked for or unstored at most (the server's max_ack_pending and the publish
    # window bound it), and how long one pull request lives
    pull_capacity: int = 1000
    pull_expires: float = 30.0
    # pull mode: bytes per second the requests may bring on average (sources[].rate_limit; 0: no limit)
    rate_limit: int = 0
    # flow-control mode: the consumer's max_ack_pending as configured, and the bytes its window may hold when grown
    # over a far link (0: never grown; a bound consumer's, which the bridge never changes)
    window: int = 1000
    window_budget: int = 0


@dataclass(slots=True)
class EngineStats:
    """Counters for metrics and the demo; never used for decisions."""

    delivered: int = 0
    duplicates: int = 0
    published: int = 0
    fc_requests: int = 0
    heartbeats: int = 0
    unrecognised: int = 0
    pulls: int = 0  # pull mode: pull requests sent
    fetched: int = 0  # pull mode: messages read from the origin stream by a resync
    last_delivered: int = 0  # origin sequence of the newest delivery seen


class Replication(ABC):
    """Replication state of one source shared by both consumer models; subclasses take the deliveries."""

    def __init__(self, settings: EngineSettings, now: float, window: Window) -> None:
        self.settings = settings
        # what the origin may have outstanding (flow control: max_ack_pending; pull: the messages asked for and not
        # stored), grown over a far link within the source's and the process's budgets
        self.window = window
        # what goes before each origin subject in the aggregate (the prefix and its dot, or nothing)
        self._subject_prefix = hdr.aggregate_subject("", settings.subject_prefix)
        # validated with the configuration: a transform the server would refuse never reaches an engine
        self._transforms = SubjectTransforms(settings.subject_transforms) if settings.subject_transforms else None
        self._phases = PhaseMachine()
        self.pipeline = PublishPipeline(
            window=settings.publish_window, ack_timeout=settings.ack_timeout, retry=settings.publish_retry
        )
        self._resets = ResetScheduler(settings.reset_min_interval, settings.reset_backoff)
        self.stall = StallWatch(settings.stalled_after, now)
        self.epoch = 0
        self.last_dseq = 0
        self.accepted = 0
        self.origin_pending = 0  # messages the origin says are left after the newest delivery
        self.stats = EngineStats()
        self.refusal: str | None = None  # why the source cannot start (recovery refused it), for the operator
        self._present: set[int] = set()
        self._last_activity = now
        # the origin as every source of it sees it (shared by the runtime; this one of its own until then)
        self.origin = Origin()
        self._excused_since = -math.inf  # the silence last said to be excused (one notice per silence)
        self.skipped_through = 0  # the end of the newest range a forward reset skipped (never replicated)
        self.start_floor = 0  # below a WorkQueue start position: never replicated, never the bridge's to ack
        self._started = False  # the consumer was just created at the source's start position
        self._skip_note: str | None = None  # "<first>-<last>" of a skipped range, for the next copy's Bridge-Skipped
        self._consumer_created: str | None = None
        self._uncaptured: set[str] = set()  # subjects already warned about (bounded)
        self._verifying = False
        self._verify_due = 0.0
        self._verify_failures = 0
        self._limits_read_at = now
        self._was_blocked = False
        self._blocked_notice_at = -math.inf
        self._blocked_suppressed = 0

    # -- views --------------------------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        """The phase, for display (metrics, status); decisions read the phase sets (``bridge.core.phases``)."""
        return self._phases.phase

    @property
    @abstractmethod
    def mode(self) -> Mode:
        """The consumer model this engine reads the origin with."""

    @property
    def awaits_recovery(self) -> bool:
        """The aggregate's watermark has not been read back yet: the runner reads it and reports ``recovered``."""
        return self._phases.awaits_recovery

    @property
    def takes_deliveries(self) -> bool:
        """Replicating: deliveries are taken (the consumer is bound and the reset or resync is done)."""
        return self._phases.takes_deliveries

    @property
    def quiet(self) -> bool:
        """Nothing of this source is timed finer than a second: replicating, with nothing in flight, waiting or
        being verified. Its timers (silence, stranded-message probes, the stall watch) count in seconds, so the
        runtime may tick a quiet engine once a second rather than ten times: among a thousand idle sources, those
        wake-ups would be most of what the process does."""
        return self._phases.takes_deliveries and self.pipeline.empty and not self._verifying

    def tick_deadline(self, now: float) -> float:
        """The latest time the next tick of a ``quiet`` engine may come without changing what it decides, or when
        (to the second the runtime ticks quiet engines at): ticking it any sooner changes nothing. ``now`` here,
        for a model that cannot say (a quiet engine is then ticked once a second); ``SourceEngine`` says."""
        return now

    def rests_for(self, now: float, at_least: float) -> float:
        """After a tick: 0 while busy (not ``quiet``), else the seconds it has nothing due for (``tick_deadline``),
        at least ``at_least``: what the runtime's tick callback tells the ticker, in one call."""
        if not self.quiet:
            return 0.0
        return max(self.tick_deadline(now) - now, at_least)

    @property
    def fc_answers(self) -> int:
        """Flow-control answers made (a metric; 0 where the model has none)."""
        return 0

    @property
    def watermark(self) -> int:
        """Highest origin sequence known stored in the aggregate (or intentionally skipped), contiguously."""
        return self.pipeline.watermark

    @property
    def resets(self) -> Counter[str]:
        """Resets sent, by cause."""
        return self._resets.counts

    @property
    def drained(self) -> bool:
        """Nothing is in flight to the aggregate."""
        return self.pipeline.in_flight == 0

    def stalled(self, now: float) -> bool:
        """The source waits for progress longer than ``stalled_after`` (see ``StallWatch``)."""
        return self.stall.is_stalled(now)

    # -- start ----------------------------------------------------------------------------------------------

    def rate_limited(self, rate_limit: int) -> None:
        """A new ``rate_limit`` (bytes per second, 0: none) taken in place (``SourceRunner.retune``): pull mode
        paces its requests by it; flow-control mode has the server do it (the consumer's ``rate_limit_bps``)."""
        return

    def consumer_bound(self, created: str | None, start_seq: int = 0, *, started: bool = False) -> None:
        """The consumer was created or looked up at start; ``created`` tells a later re-creation apart,
        ``start_seq`` is a WorkQueue start position's sequence (0: none): what lies below it was skipped on purpose
        when the consumer was created, and stays so for every process after; ``started``: this bind created it at
        the source's start position (its ack floor is where the start put it)."""
        self._consumer_created = created
        self._started = started
        self.consumer_start(start_seq)

    def consumer_start(self, start_seq: int) -> None:
        """A bind found the consumer's WorkQueue start position at ``start_seq`` (0: none; never lowered)."""
        self.start_floor = max(self.start_floor, start_seq - 1)

    def target_limits(self, limits: TargetLimits, now: float) -> list[Effect]:
        """What the target takes (read at start and on ``ReadTargetLimits``)."""
        self.pipeline.limit(limits)
        effects: list[Effect] = []
        self._pump(now, effects)
        return effects

    def recovered(
        self,
        watermark: int,
        present: Iterable[int],
        now: float,
        *,
        workqueue: bool = False,
        origin_last_seq: int | None = None,
    ) -> list[Effect]:
        """The aggregate holds this source contiguously up to ``watermark``, plus the copies in ``present``.

        ``origin_last_seq`` is the origin stream's last sequence: below the watermark, the origin was recreated,
        and replicating would drop every new message up to the old watermark as a "duplicate". The source then
        stays in RECOVERING with ``refusal`` set: an operator has to decide. In any other phase this input is stale
        (the one rule): nothing changes, ``refusal`` included.
        """
        if not self._phases.can(Event.RECOVERED):
            return []
        if origin_last_seq is not None and watermark > origin_last_seq:
            self.refusal = (
                f"origin stream {self.settings.stream!r} ends at sequence {origin_last_seq} but the aggregate "
                f"already holds this source up to {watermark}: the origin stream was recreated or reset. Give the "
                "source a new name (new dedupe ids and provenance) or remove its old copies from the aggregate"
            )
            return []
        self._phases.process(Event.RECOVERED)
        self.refusal = None
        self.pipeline.watermark = watermark
        self.accepted = watermark
        self._present = {seq for seq in present if seq > watermark}
        floor = max(watermark, self.start_floor)
        if self._started and floor > self.skipped_through:
            # the start position put the consumer here, above messages never replicated (the aggregate has no copy
            # of this source): the first copy says so (Bridge-Skipped), so a later recovery and the audit tell that
            # from a hole
            self._skip_note = f"1-{floor}"
            self.skipped_through = self.accepted = self.pipeline.watermark = floor
        self._limits_read_at = now
        self._recovered(workqueue, now)
        # at debug: the runtime's recovery.done says all this and more, and start-up's lines are per source (2,000
        # sources: each line saved is 2,000 at every start)
        effects: list[Effect] = [
            Notice("recovered", "debug", {"watermark": watermark, "present_above": len(self._present)})
        ]
        self._resets.schedule(ResetCause.START, now)
        effects += self._reset_if_due(now)
        return effects

    def _recovered(self, workqueue: bool, now: float) -> None:
        """What a consumer model does once the watermark is known (nothing by default)."""
        return

    # -- consumer side ------------------------------------------------------------------------------------

    def _take(
        self,
        sseq: int,
        subject: str,
        headers: Mapping[str, str] | None,
        payload: bytes,
        timestamp_ns: int,
    ) -> bool:
        """Hand one origin message, the next in origin order, to the pipeline; False when it is a duplicate.

        At or below ``accepted`` it is a duplicate (never published twice, whatever the target's duplicate
        window); a copy found in the aggregate at recovery is recorded as stored; anything else is published with
        its provenance headers, ``Bridge-Prev`` naming the previous message taken.
        """
        if sseq <= self.accepted:
            self.stats.duplicates += 1
            return False
        if sseq in self._present:
            self._present.discard(sseq)
            self.accepted = sseq
            self.pipeline.add_stored(sseq)
            return True
        block = hdr.build_header_block(
            headers,
            source=self.settings.source,
            stream=self.settings.stream,
            stream_seq=sseq,
            prev_seq=self.accepted,
            subject=subject,
            timestamp_ns=timestamp_ns,
            skipped=self._skip_note,
        )
        self._skip_note = None
        cycle = hdr.own_copy(headers, self.settings.source, self.settings.stream)
        copy_subject = subject
        if self._transforms is not None:
            # none matches only on a bound consumer whose filters are wider than the srcs: the subject stays, as
            # in native sourcing (Bridge-Subject keeps the original either way)
            copy_subject = self._transforms.apply(subject) or subject
        self.pipeline.add(
            sseq, OutboundMessage(self._subject_prefix + copy_subject, block, payload, timestamp_ns, cycle)
        )
        self.accepted = sseq
        return True

    @abstractmethod
    def receive(self, message: Inbound, now: float) -> list[Effect]:
        """Dispatch one message from the consumer (each consumer model its own way)."""

    @abstractmethod
    def _accept(self, msg: Data, now: float, effects: list[Effect]) -> bool:
        """Sequence one delivery, appending what it calls for to ``effects``; True when the pipeline (or the acks
        it owes) changed, so the caller covers and pumps."""

    def receive_many(self, messages: Iterable[Inbound], now: float) -> list[Effect]:
        """What one read of the consumer's subject brought, in order: the same as :meth:`receive` for each in
        turn, except that a run of deliveries is covered and pumped once, after its last one (its publishes leave
        together). Anything else in between sees the pipeline as sequential processing would have left it."""
        effects: list[Effect] = []
        pending = False
        for message in messages:
            if type(message) is Data:
                if self._accept(message, now, effects):
                    pending = True
                continue
            if pending:
                pending = False
                self._cover(effects, now)
                self._pump(now, effects)
            effects += self.receive(message, now)
        if pending:
            self._cover(effects, now)
            self._pump(now, effects)
        return effects

    def unrecognised(self, message: Unrecognised) -> list[Effect]:
        """Something else on the deliver subject: counted, never acted upon."""
        self.stats.unrecognised += 1
        if self.stats.unrecognised in (1, 10, 100, 1000) or self.stats.unrecognised % 10000 == 0:
            return [Notice("unrecognised", "warning", {"reason": message.reason, "count": self.stats.unrecognised})]
        return []

    # -- resets ---------------------------------------------------------------------------------------------

    def _skip_to(self, floor: int, fields: dict[str, object]) -> None:
        """The consumer's ack floor after a reset or resync; above ``accepted``, adopted as an intentional skip."""
        if floor <= self.accepted:
            return
        # the ack floor is beyond anything we hold: someone reset forward, or the aggregate no longer has
        # copies the origin saw acked. Either way those messages are not ours to replicate.
        fields["skipped_from"] = self.accepted + 1
        fields["skipped_to"] = floor
        # the next copy's Bridge-Prev names `floor`, which the aggregate never holds: say why, in the copy
        self._skip_note = (
            f"{self.accepted + 1}-{floor}"
            if self._skip_note is None
            else f"{self._skip_note.partition('-')[0]}-{floor}"
        )
        self.skipped_through = floor
        self.accepted = floor
        self._present = {seq for seq in self._present if seq > floor}
        self.pipeline.add_stored(floor)

    def _broken(self, cause: ResetCause, now: float, **fields: object) -> list[Effect]:
        """Log a discontinuity (with what shows it) and schedule the reset, or resync, it calls for."""
        return [Notice("discontinuity", "warning", {"cause": cause.value, **fields}), *self._discontinuity(cause, now)]

    def _out_of_sequence(self, dseq: int, sseq: int, now: float) -> list[Effect]:
        """A delivery that is not the next of the epoch: a jump (deliveries lost), a restart at 1 (a reset or
        re-creation that was not ours) or a rewind."""
        if dseq > self.last_dseq + 1:
            cause = ResetCause.GAP
        elif dseq == 1:
            cause = ResetCause.EXTERNAL
        else:
            cause = ResetCause.REWIND
        return self._broken(cause, now, expected_dseq=self.last_dseq + 1, dseq=dseq, sseq=sseq)

    def _discontinuity(self, cause: ResetCause, now: float) -> list[Effect]:
        if not self._phases.process(Event.DISCONTINUITY):
            return []  # a reset is pending already (or the engine stops): the one rule, nothing changes
        self._resets.schedule(cause, now)
        return self._reset_if_due(now)

    def _reset_if_due(self, now: float) -> list[Effect]:
        if not self._phases.can(Event.RESET_SENT) or not self._resets.is_due(now):
            return []
        self._phases.process(Event.RESET_SENT)
        return [self._resets.send(now)]

    def _consumer_alive(self, now: float) -> list[Effect]:
        # something arrived while a reset backs off: the consumer (or link) is back, retry without waiting
        if self._phases.can(Event.RESET_SENT) and self._resets.consumer_alive():
            return self._reset_if_due(now)
        return []

    # -- outcomes of effects only the other consumer model asks for -----------------------------------------
    # Each engine overrides those of its own model; the rest reach an engine only if stale, and by the one rule
    # (bridge.core.phases) change nothing. The runner feeds every outcome back without asking which engine it has.

    def reset_replied(self, reply: ResetReply, now: float) -> list[Effect]:
        """The consumer answered a ``RequestReset`` (flow-control mode)."""
        return []

    def consumer_at_rest(self, consumer: BoundConsumer, now: float) -> list[Effect] | None:
        """A ``RequestReset``'s look-up found the consumer (flow-control mode); None: send the RESET (here, always:
        nothing changes)."""
        return None

    def stranded_probed(self, first_seq: int, now: float) -> list[Effect]:
        """A ``ProbeStranded`` found the origin's first message at or after its start (flow-control mode)."""
        return []

    def stranded_probe_failed(self, reason: str, now: float) -> list[Effect]:
        """A ``ProbeStranded`` could not read the origin (flow-control mode)."""
        return []

    def resynced(self, anchor: PullAnchor, now: float) -> list[Effect]:
        """A ``RequestResync`` bound the consumer and read its last delivery (pull mode)."""
        return []

    def fetched(self, messages: Iterable[OriginMessage], through: int, now: float) -> list[Effect]:
        """A ``FetchOrigin`` read the origin stream (pull mode)."""
        return []

    def fetch_failed(self, reason: str, now: float) -> list[Effect]:
        """A ``FetchOrigin`` could not read the origin stream (pull mode)."""
        return []

    def reset_failed(self, reason: str, now: float) -> list[Effect]:
        """The RESET got an error or no reply; try again after a backoff."""
        if not self._phases.process(Event.RESET_FAILED):
            return []
        delay = self._resets.failed(now)
        return [
            Notice(
                "reset.failed",
                level="warning",
                fields={"reason": reason, "failures": self._resets.failures, "retry_in": round(delay, 3)},
            )
        ]

    # -- the window ------------------------------------------------------------------------------------------

    def window_resized(self, size: int, now: float) -> list[Effect]:
        """The consumer's ``max_ack_pending`` is ``size`` now (:class:`ResizeWindow` done; in pull mode the
        requests in flight follow it)."""
        before = self.window.size
        self.window.resized(size)
        # the publish window stays as configured: a larger one in flight to a clustered aggregate left more message
        # ids "in process" (err_code 10158) on a leader that stepped down, each blocking its re-send until the
        # duplicate window expired (test_hub_cluster, under load: two minutes stalled)
        fields = {"max_ack_pending": size, "before": before, "rtt_ms": round(self.window.rtt * 1000, 1)}
        return [Notice("source.window_grown", fields=fields)]

    def window_resize_failed(self, reason: str, now: float) -> list[Effect]:
        """The update of the consumer failed: its window stays (tried again later)."""
        self.window.resize_failed(now)
        return [Notice("source.window_failed", "warning", {"max_ack_pending": self.window.size, "error": reason})]

    # -- aggregate side -------------------------------------------------------------------------------------

    def publish_stored(self, order: int, attempt: int, now: float) -> list[Effect]:
        """The aggregate acknowledged (or already had) entry ``order``."""
        return self.publish_stored_many(((order, attempt),), now)

    def publish_stored_many(self, tokens: Iterable[tuple[int, int]], now: float) -> list[Effect]:
        """The aggregate acknowledged (or already had) each ``(order, attempt)`` of ``tokens``: what one read of
        the target connection brought. The same as :meth:`publish_stored` for each in turn, covered and pumped
        once at the end rather than after every one."""
        stored = self.pipeline.stored
        advanced = False
        for order, attempt in tokens:
            if stored(order, attempt, now):
                advanced = True
        effects: list[Effect] = []
        if advanced:
            self._cover(effects, now)
        self._pump(now, effects)
        return effects

    def acks_stored(
        self, outcomes: Sequence[AckOutcome], now: float, now_ns: int, latency: LoopHistogram | None
    ) -> list[Effect] | None:
        """The common read of the target connection: plain publish acks, every one stored. Counted for metrics
        (``PublishPipeline.account_stored``, at ``now_ns`` on the wall clock) and taken as
        :meth:`publish_stored_many`, in one call: None, and nothing done, for a read with a failure or a batch reply
        (then the runtime takes it run by run: ``PublishPipeline.expand``, ``targetwire.outcome_runs``). At 1 msg/s
        per source nearly every read is one ack, and the calls between its pieces were a tenth of its cost."""
        tokens: list[tuple[int, int]] = []
        for outcome in outcomes:
            if not outcome.stored or outcome.batch:
                return None
            tokens.append((outcome.order, outcome.attempt))
        self.pipeline.account_stored(tokens, now_ns, latency)
        return self.publish_stored_many(tokens, now)

    def publish_failed(self, order: int, attempt: int, reason: str, now: float) -> list[Effect]:
        """The aggregate refused entry ``order`` or the publish could not be made."""
        before = self.pipeline.failures
        self.pipeline.failed(order, attempt, reason, now)
        effects: list[Effect] = []
        if self.pipeline.failures != before:
            self._note_blocked(effects, now)
        self._pump(now, effects)
        return effects

    def publishes_freed(self, now: float) -> list[Effect]:
        """The process's publishes in flight (``PublishBudget``) have room again after this source stopped for
        want of it: send what waited. In any phase (one that does not publish sends nothing)."""
        effects: list[Effect] = []
        self._pump(now, effects)
        return effects

    def verified(self, generation: int, present: Iterable[int], now: float) -> list[Effect]:
        """The aggregate was read after an ambiguous failure: ``present`` are the sequences it holds."""
        self._verifying = False
        self._verify_failures = 0
        found = set(present)
        effects: list[Effect] = [Notice("publish.verified", fields={"present": len(found)})]
        if self.pipeline.verified(generation, found):
            self._cover(effects, now)
        self._pump(now, effects)
        return effects

    def verify_failed(self, reason: str, now: float) -> list[Effect]:
        """The aggregate could not be read; try again after a backoff."""
        self._verifying = False
        self._verify_failures += 1
        delay = self.settings.publish_retry.delay(self._verify_failures)
        self._verify_due = now + delay
        return [Notice("publish.verify_failed", "warning", {"reason": reason, "retry_in": round(delay, 3)})]

    def target_reconnected(self, now: float) -> list[Effect]:
        """The connection to the aggregate came back: what was in flight is presumed lost, probe again now."""
        effects: list[Effect] = []
        if self.pipeline.fail_in_flight("target connection lost", now):
            self._note_blocked(effects, now)
        self.pipeline.retry_now()
        self._verify_due = 0.0
        self._pump(now, effects)
        return effects

    def _note_blocked(self, effects: list[Effect], now: float) -> None:
        # reported when the source blocks, then (each failed retry would be one) at most once per interval
        blocked = self.pipeline.blocked
        if blocked is None:
            return
        self._was_blocked = True
        if now - self._blocked_notice_at < self.settings.blocked_notice_interval:
            self._blocked_suppressed += 1
            return
        suppressed, self._blocked_suppressed, self._blocked_notice_at = self._blocked_suppressed, 0, now
        effects.append(
            Notice(
                "publish.blocked",
                level="error",
                fields={
                    "origin_seq": blocked.stream_seq,
                    "reason": blocked.reason,
                    "attempts": blocked.attempts,
                    "blocked_for": round(now - blocked.since, 3),
                    "retry_in": round(max(0.0, (self.pipeline.next_deadline() or now) - now), 3),
                    "similar_suppressed": suppressed,
                },
            )
        )

    # -- time -----------------------------------------------------------------------------------------------

    def reading_behind(self, now: float) -> None:
        """The origin connection holds a backlog the process has not read yet (busy or starved of CPU): this
        consumer's heartbeats may be in it, so its silence is no evidence of trouble. Silence counts from now, so a
        process that falls behind its socket does not reset every source it has not read yet (each reset more work
        for a process already behind). Any phase; nothing else changes."""
        self._last_activity = max(self._last_activity, now)

    @abstractmethod
    def tick(self, now: float) -> list[Effect]:
        """Advance timers (each consumer model its own way, around ``_tick``)."""

    @abstractmethod
    def source_reconnected(self, now: float) -> list[Effect]:
        """The connection to the origin came back."""

    @abstractmethod
    def begin_shutdown(self, now: float) -> list[Effect]:
        """Stop taking deliveries and sending new publishes; in-flight publish acks still count."""

    @abstractmethod
    def final_answer(self) -> list[Effect]:
        """What is owed to the origin once draining is over (flow control: the held request's answer)."""

    def _tick(self, now: float, effects: list[Effect]) -> None:
        """What every tick does: publish ack timeouts, silence, due resets, the target's limits while blocked."""
        if self.pipeline.expire(now):
            self._note_blocked(effects, now)
        if self._phases.takes_deliveries and self._expects_traffic():
            self._watch_silence(now, effects)
        effects += self._reset_if_due(now)
        if (
            self.pipeline.degraded
            and self._phases.publishes
            and now - self._limits_read_at >= self.settings.limits_refresh
        ):
            self._limits_read_at = now
            effects.append(ReadTargetLimits())

    def _watch_silence(self, now: float, effects: list[Effect]) -> None:
        """A consumer silent past ``silence_timeout`` asks for a reset, unless its origin's doubt excuses it
        (``bridge.core.reach``): then it waits, said once per silence (``source.silent``), and looks again when
        the excuse would lapse (``silence_deadline``)."""
        since = self.origin.silent_since(self._last_activity)
        excused = self._silence_excused(since, now)
        if excused is None:
            return
        if excused:
            if self._excused_since != since:
                self._excused_since = since
                fields = {
                    "silent_for": round(now - since, 3),
                    "why": "its origin is in doubt: another source scouts it",
                }
                effects.append(Notice("source.silent", fields=fields))
            return
        self.origin.silence_reset(since, now)
        effects += self._broken(ResetCause.SILENCE, now, silent_for=round(now - since, 3))

    def _silence_excused(self, since: float, now: float) -> bool | None:
        """For a silence counted from ``since``: None when it is not past ``silence_timeout`` at ``now``, else
        whether the origin's doubt excuses it (True) or it asks for a reset (False)."""
        timeout = self.settings.silence_timeout
        if now - since <= timeout:
            return None
        return self.origin.excuses(now, timeout)

    def silence_deadline(self) -> float:
        """When the consumer's silence is next looked at: ``silence_timeout`` after it began, or while its origin
        excuses it, when the excuse would lapse (a tick before finds nothing to do)."""
        origin, timeout = self.origin, self.settings.silence_timeout
        deadline = origin.silent_since(self._last_activity) + timeout
        if origin.doubted:
            deadline = max(deadline, origin.silence_asked_at + timeout)
        return deadline

    def silence_excused(self, now: float) -> bool:
        """Whether the consumer is silent past ``silence_timeout`` and waits for its origin instead of a reset
        (shown in ``/readyz`` and ``status``)."""
        if not self._phases.takes_deliveries:
            return False
        return self._silence_excused(self.origin.silent_since(self._last_activity), now) is True

    def _expects_traffic(self) -> bool:
        """The consumer should be sending something (data or heartbeats) right now, so silence means trouble."""
        return True

    def _watch_progress(self, now: float, effects: list[Effect]) -> None:
        pipeline = self.pipeline
        idle = self.origin_pending == 0 and pipeline.empty and pipeline.blocked is None
        last_progress = self.stall.since
        change = self.stall.observe(now, self.watermark, idle)
        if change is True:
            blocked = pipeline.blocked
            fields: dict[str, object] = {
                "watermark": self.watermark,
                "seconds_without_progress": round(now - self.stall.since, 1),
                "stalled_after": self.settings.stalled_after,
                "origin_pending": self.origin_pending,
                "backlog": pipeline.backlog,
                "blocked": blocked.reason if blocked is not None else None,
                # an ambiguous publish failure waits for a read of the aggregate: asked for (verifying), or not yet
                "verifying": self._verifying,
                "unverified": bool(pipeline.unverified),
            }
            effects.append(Notice("source.stalled", "warning", fields))
        elif change is False:
            fields = {"watermark": self.watermark, "seconds_without_progress": round(now - last_progress, 1)}
            effects.append(Notice("source.recovered", fields={**fields, "idle": idle}))

    # -- internals ------------------------------------------------------------------------------------------

    def _cover(self, effects: list[Effect], now: float) -> None:
        """The watermark may have moved: ack what it covers (each consumer model its own way)."""
        if self._was_blocked and not self.pipeline.degraded:
            self._was_blocked = False
            self._blocked_notice_at = -math.inf  # the next block is news again
            self._blocked_suppressed = 0
            effects.append(Notice("publish.unblocked", fields={"watermark": self.watermark}))

    def _stopped(self, now: float) -> list[Effect]:
        """What entering STOPPING brings, in either consumer model: the notice, and the commit of a batch still open
        (``_pump`` in a phase that sends nothing)."""
        effects: list[Effect] = [
            Notice("stopping", fields={"in_flight": self.pipeline.in_flight, "watermark": self.watermark})
        ]
        self._pump(now, effects)
        return effects

    def _pump(self, now: float, effects: list[Effect]) -> None:
        if not self._phases.publishes:
            effects += self.pipeline.commit_open()  # stopping: what is in a batch is settled by its commit
            return
        generation = self.pipeline.unverified
        if generation and not self._verifying and now >= self._verify_due:
            self._verifying = True
            effects.append(VerifyStored(generation, tuple(self.pipeline.unverified_seqs())))
        failures, barriers = self.pipeline.failures, self.pipeline.barriers
        sends = self.pipeline.take_sendable(now)
        if sends:
            self.stats.published += len(sends)
            effects += sends  # each Send is a Publish effect
        if self.pipeline.barriers != barriers and sends and sends[-1].entry.message is not None:
            subject = sends[-1].entry.message.subject
            if subject not in self._uncaptured and len(self._uncaptured) < 1000:
                self._uncaptured.add(subject)
                effects.append(
                    Notice(
                        "publish.subject_not_captured",
                        "warning",
                        {
                            "subject": subject,
                            "hint": "the aggregate stream's subjects do not seem to capture it; "
                            "sending such messages one at a time to keep origin order",
                        },
                    )
                )
        if self.pipeline.failures != failures:
            self._note_blocked(effects, now)
