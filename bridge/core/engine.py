"""The per-source replication engine: a pure state machine between the origin consumer and the aggregate.

It is fed what arrives (deliveries, flow-control requests, heartbeats, publish outcomes, RESET replies, reads
of the target and the origin, clock ticks) and returns ``Effect`` values for the runtime to carry out; it decides
everything, the runtime only performs. Time is always an argument. Its parts, each in a module of its own:
the phases and their transition table (``bridge.core.phases``, which also states the one rule for inputs that
arrive in the wrong phase), the reset scheduler (``bridge.core.resets``), the flow-control ledger
(``bridge.core.ledger``), the publish pipeline (``bridge.core.pipeline``) and the stall and stranded-message
watches (``bridge.core.watch``). The invariants it
keeps (docs/design.md) and how:

1. **Safety.** A flow-control answer names the newest delivery *of the current epoch* whose message is covered
   by the pipeline's watermark ``W`` (the contiguous prefix of publish acks, plus skips adopted from forward resets
   and copies found in the aggregate at recovery): ``Nats-Last-Consumer`` is its delivery sequence,
   ``Nats-Last-Stream`` its stream sequence, which is at most ``W``. An FC request is answered only once every
   delivery before it is covered; a stalled FC subject is answered with the same (possibly smaller) position.
   While a reset is pending, answers are empty and held requests wait for the new epoch.
2. **No duplicates.** ``accepted`` is the highest origin sequence handed to the pipeline (which never drops what
   it was given) or skipped; a delivery at or below it is dropped, so nothing is published twice whatever the
   target's duplicate window.
3. **Order.** Deliveries are accepted only in delivery-sequence order within an epoch, with rising stream
   sequences; the pipeline publishes in that order and retries in that order.
4. **Liveness.** A delivery-sequence jump or rewind, a heartbeat disagreeing with the last delivery sequence, or
   silence longer than ``silence_timeout`` leads to a RESET (throttled: at least ``reset_min_interval`` apart,
   backing off after failures). FC requests are never left unanswered while the target accepts writes.
5. **Adopting resets.** After every RESET (own or, via the discontinuity it causes, someone else's) a new epoch
   starts at delivery sequence 1 and ``reset_seq - 1`` (the ack floor; never the reply's ``delivered``, see
   docs/protocol.md 4.3) above ``accepted`` is adopted as an intentional skip.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from bridge.core import headers as hdr
from bridge.core.backoff import Backoff
from bridge.core.effects import (
    Effect,
    Notice,
    ProbeStranded,
    Publish,
    ReadTargetLimits,
    ResetCause,
    ResetReply,
    VerifyStored,
)
from bridge.core.inbound import Data, FlowControlRequest, Heartbeat, Inbound, Unrecognised
from bridge.core.ledger import FlowControlLedger
from bridge.core.phases import Event, Phase, PhaseMachine
from bridge.core.pipeline import OutboundMessage, PublishPipeline, TargetLimits
from bridge.core.resets import ResetScheduler
from bridge.core.watch import StallWatch, StrandedProbe

__all__ = ["EngineSettings", "EngineStats", "Phase", "SourceEngine"]

FLOW_CONTROL = "flow_control"


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
    reconnect_silence: float = 2.0
    reset_min_interval: float = 2.0
    limits_refresh: float = 5.0  # seconds between reads of the target's limits while the source is blocked
    blocked_notice_interval: float = 30.0  # a blocked publish is reported when it blocks, then at most this often


@dataclass(slots=True)
class EngineStats:
    """Counters for metrics and the demo; never used for decisions."""

    delivered: int = 0
    duplicates: int = 0
    published: int = 0
    fc_requests: int = 0
    heartbeats: int = 0
    unrecognised: int = 0
    last_delivered: int = 0  # origin sequence of the newest delivery seen


class SourceEngine:
    """Replication state of one source. Every input method returns the effects to carry out, in order."""

    def __init__(self, settings: EngineSettings, now: float) -> None:
        self.settings = settings
        self._phases = PhaseMachine()
        self.pipeline = PublishPipeline(
            window=settings.publish_window, ack_timeout=settings.ack_timeout, retry=settings.publish_retry
        )
        self.ledger = FlowControlLedger()
        self._resets = ResetScheduler(settings.reset_min_interval, settings.reset_backoff)
        self.stall = StallWatch(settings.stalled_after, now)
        self._stranded = StrandedProbe()
        self.epoch = 0
        self.last_dseq = 0
        self.accepted = 0
        self.origin_pending = 0  # messages the origin says are left after the newest delivery
        self.stats = EngineStats()
        self.refusal: str | None = None  # why the source cannot start (recovery refused it), for the operator
        self._epoch_last_sseq = 0
        self._present: set[int] = set()
        self._last_activity = now
        self.skipped_through = 0  # the end of the newest range a forward reset skipped (never replicated)
        self._skip_note: str | None = None  # "<first>-<last>" of that range, for the next copy's Bridge-Skipped
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
        return self._phases.phase

    @property
    def watermark(self) -> int:
        """Highest origin sequence known stored in the aggregate (or intentionally skipped), contiguously."""
        return self.pipeline.watermark

    @property
    def position(self) -> tuple[int, int]:
        """``(Nats-Last-Consumer, Nats-Last-Stream)`` an answer would carry now (``FlowControlLedger.position``)."""
        return self.ledger.position

    @property
    def acked_stream_seq(self) -> int:
        """The highest ``Nats-Last-Stream`` any answer of this process named."""
        return self.ledger.acked_stream_seq

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

    def consumer_bound(self, created: str | None) -> None:
        """The consumer was created or looked up at start; ``created`` tells a later re-creation apart."""
        self._consumer_created = created

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
        stays in RECOVERING with ``refusal`` set: an operator has to decide.
        """
        if origin_last_seq is not None and watermark > origin_last_seq:
            self.refusal = (
                f"origin stream {self.settings.stream!r} ends at sequence {origin_last_seq} but the aggregate "
                f"already holds this source up to {watermark}: the origin stream was recreated or reset. Give the "
                "source a new name (new dedupe ids and provenance) or remove its old copies from the aggregate"
            )
            return []
        if not self._phases.process(Event.RECOVERED):
            return []
        self.refusal = None
        self.pipeline.watermark = watermark
        self.accepted = watermark
        self._present = {seq for seq in present if seq > watermark}
        if workqueue:
            self._stranded.enable(now)
        self._limits_read_at = now
        effects: list[Effect] = [
            Notice("recovered", fields={"watermark": watermark, "present_above": len(self._present)})
        ]
        self._resets.schedule(ResetCause.START, now)
        effects += self._reset_if_due(now)
        return effects

    # -- consumer side ------------------------------------------------------------------------------------

    def receive(self, message: Inbound, now: float) -> list[Effect]:
        """Dispatch one message from the deliver subject."""
        match message:
            case Data():
                return self.data(message, now)
            case FlowControlRequest():
                return self.flow_control(message.reply, now)
            case Heartbeat():
                return self.heartbeat(message, now)
            case Unrecognised():
                return self.unrecognised(message)

    def data(self, msg: Data, now: float) -> list[Effect]:
        """A delivered origin message."""
        self._last_activity = now
        ack = msg.ack
        self.stats.last_delivered = ack.stream_seq
        self.origin_pending = ack.pending
        if not self._phases.takes_deliveries:
            return self._consumer_alive(now)
        if ack.stream != self.settings.stream or ack.consumer != self.settings.consumer:
            return self.unrecognised(Unrecognised(f"delivery from {ack.stream}/{ack.consumer}"))
        dseq, sseq = ack.consumer_seq, ack.stream_seq
        if dseq != self.last_dseq + 1 or sseq <= self._epoch_last_sseq:
            if dseq > self.last_dseq + 1:
                cause = ResetCause.GAP
            elif dseq == 1:
                cause = ResetCause.EXTERNAL  # only a reset starts an epoch at 1, and this one was not ours
            else:
                cause = ResetCause.REWIND
            notice = Notice(
                "discontinuity",
                level="warning",
                fields={"cause": cause.value, "expected_dseq": self.last_dseq + 1, "dseq": dseq, "sseq": sseq},
            )
            return [notice, *self._discontinuity(cause, now)]
        self.last_dseq = dseq
        self._epoch_last_sseq = sseq
        self.stats.delivered += 1
        self.ledger.delivered(dseq, sseq)
        effects: list[Effect] = []
        if sseq <= self.accepted:
            self.stats.duplicates += 1
        elif sseq in self._present:
            self._present.discard(sseq)
            self.accepted = sseq
            self.pipeline.add_stored(sseq)
        else:
            subject = hdr.aggregate_subject(msg.subject, self.settings.subject_prefix)
            block = hdr.build_header_block(
                msg.headers,
                source=self.settings.source,
                stream=self.settings.stream,
                stream_seq=sseq,
                prev_seq=self.accepted,
                subject=msg.subject,
                timestamp_ns=ack.timestamp_ns,
                skipped=self._skip_note,
            )
            self._skip_note = None
            self.pipeline.add(sseq, OutboundMessage(subject, block, msg.payload, ack.timestamp_ns))
            self.accepted = sseq
        self._cover(effects, now)
        self._pump(now, effects)
        return effects

    def flow_control(self, reply: str, now: float) -> list[Effect]:
        """A flow-control request; it covers every delivery received before it."""
        self._last_activity = now
        self.stats.fc_requests += 1
        if self._phases.answers_flow_control:
            self.ledger.hold(reply, self.last_dseq)
            effects: list[Effect] = []
            self._answer_if_covered(effects)
            return effects
        # the epoch is about to be replaced: release the window, ack nothing
        return [self.ledger.answer_empty(reply), *self._consumer_alive(now)]

    def heartbeat(self, beat: Heartbeat, now: float) -> list[Effect]:
        """An idle heartbeat: check it agrees with what was received, and answer a stalled FC subject."""
        self._last_activity = now
        self.stats.heartbeats += 1
        effects: list[Effect] = []
        if not self._phases.takes_deliveries:
            if beat.stalled and self._phases.answers_flow_control:
                effects.append(self.ledger.answer(beat.stalled))
            elif beat.stalled:
                effects.append(self.ledger.answer_empty(beat.stalled))
            return effects + self._consumer_alive(now)
        if beat.last_consumer is not None and beat.last_consumer != self.last_dseq:
            effects.append(
                Notice(
                    "discontinuity",
                    level="warning",
                    fields={
                        "cause": ResetCause.HEARTBEAT_MISMATCH.value,
                        "last_dseq": self.last_dseq,
                        "server_last_dseq": beat.last_consumer,
                    },
                )
            )
            if beat.stalled:
                effects.append(self.ledger.answer_empty(beat.stalled))
            return effects + self._discontinuity(ResetCause.HEARTBEAT_MISMATCH, now)
        if beat.stalled:
            # the server's only outstanding FC subject: answer it with what is stored, held or not
            # (a held request would otherwise wait for the target; a lost one would stall forever)
            effects.append(self.ledger.answer(beat.stalled))
        return effects

    def unrecognised(self, message: Unrecognised) -> list[Effect]:
        """Something else on the deliver subject: counted, never acted upon."""
        self.stats.unrecognised += 1
        if self.stats.unrecognised in (1, 10, 100, 1000) or self.stats.unrecognised % 10000 == 0:
            return [Notice("unrecognised", "warning", {"reason": message.reason, "count": self.stats.unrecognised})]
        return []

    def source_reconnected(self, now: float) -> list[Effect]:
        """The connection to the origin came back: reset if it went quiet (native: > 2 s), retry a failed reset now."""
        if self._phases.takes_deliveries and now - self._last_activity > self.settings.reconnect_silence:
            return self._discontinuity(ResetCause.RECONNECT, now)
        return self._consumer_alive(now)

    # -- resets ---------------------------------------------------------------------------------------------

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

    def reset_replied(self, reply: ResetReply, now: float) -> list[Effect]:
        """The consumer answered the RESET; checked, then taken as ``reset_succeeded``."""
        if not self._phases.can(Event.RESET_DONE):
            return []
        if reply.ack_policy not in (None, FLOW_CONTROL):
            stream, consumer = self.settings.stream, self.settings.consumer
            return self.reset_failed(f"consumer {stream}/{consumer} no longer has ack_policy flow_control", now)
        effects: list[Effect] = []
        if reply.created is not None and reply.created != self._consumer_created:
            if self._consumer_created is not None:
                effects.append(
                    Notice(
                        "consumer.recreated", "warning", {"consumer": self.settings.consumer, "created": reply.created}
                    )
                )
            self._consumer_created = reply.created
        return effects + self.reset_succeeded(reply.reset_seq, now)

    def reset_succeeded(self, reset_seq: int, now: float) -> list[Effect]:
        """The consumer was reset; its next delivery is ``reset_seq`` or later, with delivery sequence 1."""
        if not self._phases.process(Event.RESET_DONE):
            return []
        floor = reset_seq - 1
        self._resets.succeeded()
        self.epoch += 1
        self.last_dseq = 0
        self._epoch_last_sseq = 0
        self.ledger.new_epoch()
        self._last_activity = now
        effects: list[Effect] = []
        fields: dict[str, object] = {
            "cause": self._resets.cause.value,
            "epoch": self.epoch,
            "reset_seq": reset_seq,
            "watermark": self.watermark,
        }
        if floor > self.accepted:
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
        effects.append(Notice("reset.done", fields=fields))
        # RESET does not clear an outstanding FC request: answer it now, with new-epoch positions only
        answer = self.ledger.answer_held()
        if answer is not None:
            effects.append(answer)
        self._pump(now, effects)
        return effects

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

    # -- aggregate side -------------------------------------------------------------------------------------

    def publish_stored(self, order: int, attempt: int, now: float) -> list[Effect]:
        """The aggregate acknowledged (or already had) entry ``order``."""
        effects: list[Effect] = []
        if self.pipeline.stored(order, attempt):
            self._cover(effects, now)
        self._pump(now, effects)
        return effects

    def publish_failed(self, order: int, attempt: int, reason: str, now: float) -> list[Effect]:
        """The aggregate refused entry ``order`` or the publish could not be made."""
        before = self.pipeline.failures
        self.pipeline.failed(order, attempt, reason, now)
        effects: list[Effect] = []
        if self.pipeline.failures != before:
            self._note_blocked(effects, now)
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

    # -- the origin's leftovers -------------------------------------------------------------------------------

    def stranded_probed(self, first_seq: int, now: float) -> list[Effect]:
        """The origin's first message at or after the probe's start is ``first_seq`` (0: none).

        Acks under ``flow_control`` delete only messages in the consumer's pending list; a server restart can lose
        entries of it, and those messages then stay in a WorkQueue origin for good, never redelivered. Found twice
        in a row (``StrandedProbe``), already acked by an answer of ours and already stored (at or below the
        watermark, and not in a range a forward reset skipped), a RESET to ``first_seq`` redelivers them: they are
        dropped as duplicates and acked again, which deletes them.
        """
        confirmed = self._stranded.found(first_seq, self.acked_stream_seq, now)
        if (
            not confirmed
            or not self._phases.takes_deliveries
            or not (self.skipped_through < confirmed <= self.acked_stream_seq)
            or confirmed > self.watermark
        ):
            return []
        self._resets.seq = confirmed
        notice = Notice(
            "origin.stranded",
            level="warning",
            fields={"first_seq": confirmed, "acked_through": self.acked_stream_seq, "watermark": self.watermark},
        )
        return [notice, *self._discontinuity(ResetCause.STRANDED, now)]

    def stranded_probe_failed(self, reason: str, now: float) -> list[Effect]:
        """The probe could not read the origin; the next one is at the usual interval."""
        self._stranded.failed()
        return []

    # -- time -----------------------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Effect]:
        """Advance timers: publish ack timeouts, retries, silence, due resets, probes, stall state."""
        effects: list[Effect] = []
        if self.pipeline.expire(now):
            self._note_blocked(effects, now)
        if self._phases.takes_deliveries and now - self._last_activity > self.settings.silence_timeout:
            effects.append(
                Notice(
                    "discontinuity",
                    level="warning",
                    fields={"cause": ResetCause.SILENCE.value, "silent_for": round(now - self._last_activity, 3)},
                )
            )
            effects += self._discontinuity(ResetCause.SILENCE, now)
        effects += self._reset_if_due(now)
        if (
            self.pipeline.degraded
            and self.phase is not Phase.STOPPING
            and now - self._limits_read_at >= self.settings.limits_refresh
        ):
            self._limits_read_at = now
            effects.append(ReadTargetLimits())
        start = self.skipped_through + 1
        if self._phases.takes_deliveries and self._stranded.due(now):
            self._stranded.start(now)
            if self.acked_stream_seq >= start:
                effects.append(ProbeStranded(start))
            else:
                self._stranded.failed()  # nothing acked to look under yet
        self._pump(now, effects)
        self._watch_progress(now, effects)
        return effects

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
            }
            effects.append(Notice("source.stalled", "warning", fields))
        elif change is False:
            fields = {"watermark": self.watermark, "seconds_without_progress": round(now - last_progress, 1)}
            effects.append(Notice("source.recovered", fields={**fields, "idle": idle}))

    # -- shutdown -------------------------------------------------------------------------------------------

    def begin_shutdown(self, now: float) -> list[Effect]:
        """Stop taking deliveries and sending new publishes; in-flight acks still advance the watermark."""
        if not self._phases.can(Event.SHUTDOWN):
            return []
        # positions are only good for the epoch the server is in: if a reset was pending, answer empty from now on
        if not self._phases.takes_deliveries:
            self.ledger.epoch_replaced()
        self._phases.process(Event.SHUTDOWN)
        return [Notice("stopping", fields={"in_flight": self.pipeline.in_flight, "watermark": self.watermark})]

    def final_answer(self) -> list[Effect]:
        """Answer a held FC request with whatever is stored (the only subject the server will honour)."""
        answer = self.ledger.answer_held()
        return [answer] if answer is not None else []

    # -- internals ------------------------------------------------------------------------------------------

    def _cover(self, effects: list[Effect], now: float) -> None:
        watermark = self.watermark
        self.ledger.cover(watermark)
        self._answer_if_covered(effects)
        if self._was_blocked and not self.pipeline.degraded:
            self._was_blocked = False
            self._blocked_notice_at = -math.inf  # the next block is news again
            self._blocked_suppressed = 0
            effects.append(Notice("publish.unblocked", fields={"watermark": watermark}))

    def _answer_if_covered(self, effects: list[Effect]) -> None:
        # while a reset is pending the epoch is about to be replaced: the held request is answered after it
        if self._phases.answers_flow_control:
            answer = self.ledger.answer_covered()
            if answer is not None:
                effects.append(answer)

    def _pump(self, now: float, effects: list[Effect]) -> None:
        if self.phase is Phase.STOPPING:
            return
        generation = self.pipeline.unverified
        if generation and not self._verifying and now >= self._verify_due:
            self._verifying = True
            effects.append(VerifyStored(generation, tuple(self.pipeline.unverified_seqs())))
        failures, barriers = self.pipeline.failures, self.pipeline.barriers
        sends = self.pipeline.take_sendable(now)
        for send in sends:
            self.stats.published += 1
            effects.append(Publish(send.entry, send.attempt))
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
