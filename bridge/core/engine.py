"""The per-source replication engine: a pure state machine between the origin consumer and the aggregate.

It is fed what arrives (deliveries, flow-control requests, heartbeats, publish outcomes, RESET outcomes, clock
ticks) and returns ``Effect`` values for the adapters to carry out. Time is always an argument. The invariants it
keeps (design.md) and how:

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
   protocol.md 4.3) above ``accepted`` is adopted as an intentional skip.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from bridge.core import headers as hdr
from bridge.core.backoff import Backoff
from bridge.core.effects import (
    AnswerFlowControl,
    Effect,
    Notice,
    Publish,
    RequestReset,
    ResetCause,
    VerifyStored,
)
from bridge.core.inbound import Data, FlowControlRequest, Heartbeat, Inbound, Unrecognised
from bridge.core.pipeline import OutboundMessage, PublishPipeline


class Phase(Enum):
    """Where the engine is in its life cycle."""

    RECOVERING = "recovering"  # waiting for the watermark recovered from the aggregate
    RESET_WAIT = "reset_wait"  # a reset is due (throttled or backing off); deliveries are ignored
    RESETTING = "resetting"  # a RESET request is in flight
    RUNNING = "running"  # taking deliveries
    STOPPING = "stopping"  # shutting down: no new deliveries or publishes, in-flight acks still count


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The engine's knobs; plain values so the core does not depend on the configuration layer."""

    source: str
    stream: str
    consumer: str
    subject_prefix: str | None = None
    publish_window: int = 1024
    ack_timeout: float = 5.0
    silence_timeout: float = 5.0
    reconnect_silence: float = 2.0
    reset_min_interval: float = 2.0
    reset_backoff: Backoff = field(default_factory=lambda: Backoff(2.0, 30.0))
    publish_retry: Backoff = field(default_factory=lambda: Backoff(0.5, 15.0))


@dataclass(slots=True)
class EngineStats:
    """Counters for metrics and the demo; never used for decisions."""

    delivered: int = 0
    duplicates: int = 0
    published: int = 0
    fc_requests: int = 0
    fc_answers: int = 0
    heartbeats: int = 0
    unrecognised: int = 0


class SourceEngine:
    """Replication state of one source. Every input method returns the effects to carry out, in order."""

    def __init__(self, settings: EngineSettings, now: float) -> None:
        self.settings = settings
        self.phase = Phase.RECOVERING
        self.pipeline = PublishPipeline(
            window=settings.publish_window, ack_timeout=settings.ack_timeout, retry=settings.publish_retry
        )
        self.epoch = 0
        self.last_dseq = 0
        self.accepted = 0
        self.stats = EngineStats()
        self.resets: Counter[str] = Counter()
        self._epoch_last_sseq = 0
        self._records: deque[tuple[int, int]] = deque()  # (dseq, sseq) of this epoch not yet covered
        self._position = (0, 0)  # (dseq, sseq) of the newest delivery of this epoch covered by the watermark
        self._present: set[int] = set()
        self._held_fc: tuple[str, int] | None = None  # (subject, last dseq before it)
        self._last_activity = now
        self._last_reset_at = -math.inf
        self._reset_failures = 0
        self._reset_due = 0.0
        self._reset_cause = ResetCause.START
        self._reset_attempt = 0
        self._reset_seq: int | None = None  # where the pending reset restarts deliveries (None: the ack floor)
        self.skipped_through = 0  # the end of the newest range a forward reset skipped (never replicated)
        self._skip_note: str | None = None  # "<first>-<last>" of that range, for the next copy's Bridge-Skipped
        self.acked_stream_seq = 0  # the highest Nats-Last-Stream any answer of this process named
        self._was_blocked = False
        self._uncaptured: set[str] = set()  # subjects already warned about (bounded)
        self._epoch_current = True  # False once stopping with a reset pending: the epoch is no longer the server's
        self._verifying = False
        self._verify_due = 0.0
        self._verify_failures = 0

    # -- views --------------------------------------------------------------------------------------------

    @property
    def watermark(self) -> int:
        """Highest origin sequence known stored in the aggregate (or intentionally skipped), contiguously."""
        return self.pipeline.watermark

    @property
    def position(self) -> tuple[int, int]:
        """``(Nats-Last-Consumer, Nats-Last-Stream)`` an answer would carry now; ``(0, 0)`` means empty.

        Both numbers come from one delivery of the current epoch: the newest one the watermark covers. Naming
        the watermark itself would be safe (it is stored) but can stall the consumer: after a reset far below it
        the server sets its ack floor to the watermark, then walks the deliveries below it into pending, where
        no later answer can clear them (an ack at or below the floor is a no-op) until ``max_ack_pending`` fills.
        """
        return self._position if self._epoch_current else (0, 0)

    @property
    def drained(self) -> bool:
        """Nothing is in flight to the aggregate."""
        return self.pipeline.in_flight == 0

    # -- start ----------------------------------------------------------------------------------------------

    def recovered(self, watermark: int, present: Iterable[int], now: float) -> list[Effect]:
        """The aggregate holds this source contiguously up to ``watermark``, plus the copies in ``present``."""
        if self.phase is not Phase.RECOVERING:
            raise RuntimeError("recovered() called twice")
        self.pipeline.watermark = watermark
        self.accepted = watermark
        self._present = {seq for seq in present if seq > watermark}
        effects: list[Effect] = [
            Notice("recovered", fields={"watermark": watermark, "present_above": len(self._present)})
        ]
        effects += self._schedule_reset(ResetCause.START, now)
        return effects

    # -- consumer side ------------------------------------------------------------------------------------

    def receive(self, message: Inbound, now: float) -> list[Effect]:
        """Dispatch one message from the deliver subject."""
        if isinstance(message, Data):
            return self.data(message, now)
        if isinstance(message, FlowControlRequest):
            return self.flow_control(message.reply, now)
        if isinstance(message, Heartbeat):
            return self.heartbeat(message, now)
        return self.unrecognised(message)

    def data(self, msg: Data, now: float) -> list[Effect]:
        """A delivered origin message."""
        self._last_activity = now
        if self.phase is not Phase.RUNNING:
            return self._consumer_alive(now)
        ack = msg.ack
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
            return [notice, *self._schedule_reset(cause, now)]
        self.last_dseq = dseq
        self._epoch_last_sseq = sseq
        self.stats.delivered += 1
        self._records.append((dseq, sseq))
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
        self._cover(effects)
        self._pump(now, effects)
        return effects

    def flow_control(self, reply: str, now: float) -> list[Effect]:
        """A flow-control request; it covers every delivery received before it."""
        self._last_activity = now
        self.stats.fc_requests += 1
        if self.phase in (Phase.RUNNING, Phase.STOPPING):
            self._held_fc = (reply, self.last_dseq)
            effects: list[Effect] = []
            self._answer_if_covered(effects)
            return effects
        # the epoch is about to be replaced: release the window, ack nothing
        return [self._answer(reply, (0, 0)), *self._consumer_alive(now)]

    def heartbeat(self, beat: Heartbeat, now: float) -> list[Effect]:
        """An idle heartbeat: check it agrees with what was received, and answer a stalled FC subject."""
        self._last_activity = now
        self.stats.heartbeats += 1
        effects: list[Effect] = []
        if self.phase is not Phase.RUNNING:
            if beat.stalled and self.phase is not Phase.STOPPING:
                effects.append(self._answer(beat.stalled, (0, 0)))
            elif beat.stalled:
                effects.append(self._answer(beat.stalled, self.position))
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
                effects.append(self._answer(beat.stalled, (0, 0)))
            return effects + self._schedule_reset(ResetCause.HEARTBEAT_MISMATCH, now)
        if beat.stalled:
            # the server's only outstanding FC subject: answer it with what is stored, held or not
            # (a held request would otherwise wait for the target; a lost one would stall forever)
            if self._held_fc is not None and self._held_fc[0] == beat.stalled:
                self._held_fc = None
            effects.append(self._answer(beat.stalled, self.position))
        return effects

    def unrecognised(self, message: Unrecognised) -> list[Effect]:
        """Something else on the deliver subject: counted, never acted upon."""
        self.stats.unrecognised += 1
        if self.stats.unrecognised in (1, 10, 100, 1000) or self.stats.unrecognised % 10000 == 0:
            return [Notice("unrecognised", "warning", {"reason": message.reason, "count": self.stats.unrecognised})]
        return []

    def source_reconnected(self, now: float) -> list[Effect]:
        """The connection to the origin came back: reset if it went quiet (native: > 2 s), retry a failed reset now."""
        if self.phase is Phase.RUNNING and now - self._last_activity > self.settings.reconnect_silence:
            return self._schedule_reset(ResetCause.RECONNECT, now)
        return self._consumer_alive(now)

    # -- resets ---------------------------------------------------------------------------------------------

    def _schedule_reset(self, cause: ResetCause, now: float) -> list[Effect]:
        if self.phase in (Phase.RESET_WAIT, Phase.RESETTING, Phase.STOPPING):
            return []
        self.phase = Phase.RESET_WAIT
        self._reset_cause = cause
        self._reset_due = max(now, self._last_reset_at + self.settings.reset_min_interval)
        return self._reset_if_due(now)

    def _reset_if_due(self, now: float) -> list[Effect]:
        if self.phase is not Phase.RESET_WAIT or now < self._reset_due:
            return []
        self.phase = Phase.RESETTING
        self._reset_attempt += 1
        self._last_reset_at = now
        self.resets[self._reset_cause.value] += 1
        return [RequestReset(self._reset_cause, self._reset_attempt, self._reset_seq)]

    def _consumer_alive(self, now: float) -> list[Effect]:
        # something arrived while a reset backs off: the consumer (or link) is back, retry without waiting
        if self.phase is Phase.RESET_WAIT and self._reset_failures:
            self._reset_due = min(self._reset_due, self._last_reset_at + self.settings.reset_min_interval)
            return self._reset_if_due(now)
        return []

    def reset_succeeded(self, reset_seq: int, now: float) -> list[Effect]:
        """The consumer was reset; its next delivery is ``reset_seq`` or later, with delivery sequence 1."""
        if self.phase is not Phase.RESETTING:
            return []
        floor = reset_seq - 1
        self.phase = Phase.RUNNING
        self._reset_seq = None
        self.epoch += 1
        self.last_dseq = 0
        self._epoch_last_sseq = 0
        self._records.clear()
        self._position = (0, 0)
        self._reset_failures = 0
        self._last_activity = now
        effects: list[Effect] = []
        fields: dict[str, object] = {
            "cause": self._reset_cause.value,
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
        if self._held_fc is not None:
            # RESET does not clear an outstanding FC request: answer it now, with new-epoch positions only
            subject, _ = self._held_fc
            self._held_fc = None
            effects.append(self._answer(subject, self.position))
        self._pump(now, effects)
        return effects

    def reset_failed(self, reason: str, now: float) -> list[Effect]:
        """The RESET got an error or no reply; try again after a backoff."""
        if self.phase is not Phase.RESETTING:
            return []
        self.phase = Phase.RESET_WAIT
        self._reset_failures += 1
        delay = max(self.settings.reset_min_interval, self.settings.reset_backoff.delay(self._reset_failures))
        self._reset_due = now + delay
        return [
            Notice(
                "reset.failed",
                level="warning",
                fields={"reason": reason, "failures": self._reset_failures, "retry_in": round(delay, 3)},
            )
        ]

    # -- aggregate side -------------------------------------------------------------------------------------

    def publish_stored(self, order: int, attempt: int, now: float) -> list[Effect]:
        """The aggregate acknowledged (or already had) entry ``order``."""
        effects: list[Effect] = []
        if self.pipeline.stored(order, attempt):
            self._cover(effects)
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
            self._cover(effects)
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
        blocked = self.pipeline.blocked
        if blocked is None:
            return
        self._was_blocked = True
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
                },
            )
        )

    # -- time -----------------------------------------------------------------------------------------------

    def stranded(self, first_seq: int, now: float) -> list[Effect]:
        """The WorkQueue origin still holds ``first_seq``, which an answer of ours has already acked.

        Acks under ``flow_control`` delete only messages in the consumer's pending list; a server restart can lose
        entries of it, and those messages then stay in the origin for good, never redelivered. When they are
        already stored (at or below the watermark, and not in a range a forward reset skipped), a RESET to
        ``first_seq`` redelivers them: they are dropped as duplicates and acked again, which deletes them.
        """
        if (
            self.phase is not Phase.RUNNING
            or not (self.skipped_through < first_seq <= self.acked_stream_seq)
            or first_seq > self.watermark
        ):
            return []
        self._reset_seq = first_seq
        notice = Notice(
            "origin.stranded",
            level="warning",
            fields={"first_seq": first_seq, "acked_through": self.acked_stream_seq, "watermark": self.watermark},
        )
        return [notice, *self._schedule_reset(ResetCause.STRANDED, now)]

    def tick(self, now: float) -> list[Effect]:
        """Advance timers: publish ack timeouts, retries, silence detection, due resets."""
        effects: list[Effect] = []
        if self.pipeline.expire(now):
            self._note_blocked(effects, now)
        if self.phase is Phase.RUNNING and now - self._last_activity > self.settings.silence_timeout:
            effects.append(
                Notice(
                    "discontinuity",
                    level="warning",
                    fields={"cause": ResetCause.SILENCE.value, "silent_for": round(now - self._last_activity, 3)},
                )
            )
            effects += self._schedule_reset(ResetCause.SILENCE, now)
        effects += self._reset_if_due(now)
        self._pump(now, effects)
        return effects

    # -- shutdown -------------------------------------------------------------------------------------------

    def begin_shutdown(self, now: float) -> list[Effect]:
        """Stop taking deliveries and sending new publishes; in-flight acks still advance the watermark."""
        # positions are only good for the epoch the server is in: if a reset was pending, answer empty from now on
        self._epoch_current = self.phase is Phase.RUNNING
        self.phase = Phase.STOPPING
        return [Notice("stopping", fields={"in_flight": self.pipeline.in_flight, "watermark": self.watermark})]

    def final_answer(self) -> list[Effect]:
        """Answer a held FC request with whatever is stored (the only subject the server will honour)."""
        if self._held_fc is None:
            return []
        subject, _ = self._held_fc
        self._held_fc = None
        return [self._answer(subject, self.position)]

    # -- internals ------------------------------------------------------------------------------------------

    def _cover(self, effects: list[Effect]) -> None:
        watermark = self.watermark
        records = self._records
        while records and records[0][1] <= watermark:
            self._position = records.popleft()
        self._answer_if_covered(effects)
        if self._was_blocked and not self.pipeline.degraded:
            self._was_blocked = False
            effects.append(Notice("publish.unblocked", fields={"watermark": watermark}))

    def _answer_if_covered(self, effects: list[Effect]) -> None:
        if self._held_fc is None or self.phase not in (Phase.RUNNING, Phase.STOPPING):
            # while a reset is pending the epoch is about to be replaced: the held request is answered after it
            return
        subject, covers = self._held_fc
        if self._position[0] >= covers:
            self._held_fc = None
            effects.append(self._answer(subject, self.position))

    def _answer(self, subject: str, position: tuple[int, int]) -> AnswerFlowControl:
        self.stats.fc_answers += 1
        if position[1] > self.acked_stream_seq:
            self.acked_stream_seq = position[1]
        return AnswerFlowControl(subject, position[0], position[1])

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
