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
   backing off after failures), unless the origin is in doubt and another source's reset scouts it
   (``bridge.core.reach``: then the silence counts again from the origin's answer). FC requests are never left
   unanswered while the target accepts writes.
5. **Adopting resets.** After every RESET (own or, via the discontinuity it causes, someone else's) a new epoch
   starts at delivery sequence 1 (or past it for the very message the reset named: ``_renumbered``) and
   ``reset_seq - 1`` (the ack floor; never the reply's ``delivered``, see docs/protocol.md 4.3) above ``accepted``
   is adopted as an intentional skip. A consumer found at rest
   (``consumer_at_rest``) needs no RESET: the new epoch goes on after its last delivery, its ack floor adopted the
   same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from bridge.core.effects import (
    AnswerFlowControl,
    BoundConsumer,
    Effect,
    Notice,
    ProbeStranded,
    ResetCause,
    ResetReply,
    ResizeWindow,
)
from bridge.core.inbound import Data, FlowControlRequest, Heartbeat, Inbound, PullStatus, Unrecognised
from bridge.core.ledger import FlowControlLedger
from bridge.core.modes import Mode
from bridge.core.phases import Event, Phase
from bridge.core.replication import EngineSettings, EngineStats, Replication
from bridge.core.watch import STRANDED_CHECK, StrandedProbe, stranded_spread
from bridge.core.window import WindowBudget, WindowSizer

__all__ = ["EngineSettings", "EngineStats", "Phase", "SourceEngine"]

FLOW_CONTROL = "flow_control"


class SourceEngine(Replication):
    """Replication of one source through a flow-control consumer. Every input returns the effects to carry out."""

    def __init__(self, settings: EngineSettings, now: float, windows: WindowBudget | None = None) -> None:
        self._sizer = WindowSizer(settings.source, settings.window, settings.window_budget, windows)
        super().__init__(settings, now, self._sizer)
        self.ledger = FlowControlLedger()
        # the stream sequence the last RESET named as its epoch's first (0: the epoch did not begin with one); it
        # matters only while the epoch has no delivery yet (see _renumbered)
        self._reset_seq = 0
        self._stranded = StrandedProbe(stranded_spread(settings.source))
        self._epoch_last_sseq = 0

    # -- views --------------------------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return Mode.FLOW_CONTROL

    @property
    def fc_answers(self) -> int:
        return self.ledger.answers

    @property
    def position(self) -> tuple[int, int]:
        """``(Nats-Last-Consumer, Nats-Last-Stream)`` an answer would carry now (``FlowControlLedger.position``)."""
        return self.ledger.position

    @property
    def acked_stream_seq(self) -> int:
        """The highest ``Nats-Last-Stream`` any answer of this process named."""
        return self.ledger.acked_stream_seq

    def _recovered(self, workqueue: bool, now: float) -> None:
        if workqueue:
            self._stranded.enable(now)

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
            case PullStatus():
                return self.unrecognised(Unrecognised(f"status {message.code} {message.description}".strip()))
            case Unrecognised():
                return self.unrecognised(message)

    def receive_many(self, messages: Iterable[Inbound], now: float) -> list[Effect]:
        """As :meth:`Replication.receive_many`; and when the read itself shows the epoch replaced (a discontinuity
        after a heartbeat whose stalled request was answered), the answers made before that are sent empty: none of
        them has left yet, and no position of an epoch being replaced may be acked."""
        effects = super().receive_many(messages, now)
        if not self._phases.answers_flow_control:
            effects = [
                AnswerFlowControl(e.subject, 0, 0) if isinstance(e, AnswerFlowControl) and e.acks else e
                for e in effects
            ]
        return effects

    def data(self, msg: Data, now: float) -> list[Effect]:
        """A delivered origin message."""
        effects: list[Effect] = []
        if self._accept(msg, now, effects):
            self._cover(effects, now)
            self._pump(now, effects)
        return effects

    def _accept(self, msg: Data, now: float, effects: list[Effect]) -> bool:
        self._last_activity = now
        ack = msg.ack
        self.stats.last_delivered = ack.stream_seq
        self.origin_pending = ack.pending
        if not self._phases.takes_deliveries:
            effects += self._consumer_alive(now)
            return False
        if ack.stream != self.settings.stream or ack.consumer != self.settings.consumer:
            effects += self.unrecognised(Unrecognised(f"delivery from {ack.stream}/{ack.consumer}"))
            return False
        dseq, sseq = ack.consumer_seq, ack.stream_seq
        if dseq != self.last_dseq + 1 or sseq <= self._epoch_last_sseq:
            if not self._renumbered(dseq, sseq):
                effects += self._out_of_sequence(dseq, sseq, now)
                return False
            effects.append(Notice("delivery.renumbered", "info", {"dseq": dseq, "sseq": sseq}))
        self.last_dseq = dseq
        self._epoch_last_sseq = sseq
        self.stats.delivered += 1
        self.ledger.delivered(dseq, sseq)
        self._sizer.delivered(now, len(msg.payload))
        self._take(sseq, msg.subject, msg.headers, msg.payload, ack.timestamp_ns)
        return True

    def _renumbered(self, dseq: int, sseq: int) -> bool:
        """Whether the first delivery after a RESET, numbered ``dseq`` instead of 1, is the very message the reset
        named: then no message can be missing before it, and the server's numbering is taken from it.

        nats-server does this to a consumer with ``rate_limit_bps``: its delivery loop numbers a message, waits out
        the rate limit with the consumer unlocked, and sends it with the old numbers after a RESET in that wait,
        counting it in the new epoch's delivery sequence (the bridge had already set that message aside as the old
        epoch's). Without this, every RESET of a rate-limited consumer with a backlog would find a gap and ask for
        another: a storm that replicates nothing (found by the thin-link test)."""
        return self.last_dseq == 0 and self._reset_seq > 0 and sseq == self._reset_seq and dseq > 1

    def flow_control(self, reply: str, now: float) -> list[Effect]:
        """A flow-control request; it covers every delivery received before it."""
        self._last_activity = now
        self.stats.fc_requests += 1
        if self._phases.answers_flow_control:
            self._sizer.requested(self.last_dseq - self.ledger.answered_dseq)
            self.ledger.hold(reply, self.last_dseq)
            effects: list[Effect] = []
            self._answer_if_covered(effects, now)
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
            if beat.stalled:  # the epoch is about to be replaced: release the window, ack nothing
                effects.append(self.ledger.answer_empty(beat.stalled))
            return effects + self._broken(
                ResetCause.HEARTBEAT_MISMATCH, now, last_dseq=self.last_dseq, server_last_dseq=beat.last_consumer
            )
        if beat.stalled:
            # the server's only outstanding FC subject: answer it with what is stored, held or not
            # (a held request would otherwise wait for the target; a lost one would stall forever)
            effects.append(self.ledger.answer(beat.stalled))
        return effects

    def source_reconnected(self, now: float) -> list[Effect]:
        """The connection to the origin came back: reset if it went quiet (native: > 2 s), retry a failed reset now."""
        self._stranded.rearm(now)  # the origin server may have restarted
        if self._phases.takes_deliveries and now - self._last_activity > self.settings.reconnect_silence:
            return self._discontinuity(ResetCause.RECONNECT, now)
        return self._consumer_alive(now)

    # -- resets ---------------------------------------------------------------------------------------------

    def reset_replied(self, reply: ResetReply, now: float) -> list[Effect]:
        """The consumer answered the RESET; checked, then taken as ``reset_succeeded``."""
        if not self._phases.can(Event.RESET_DONE):
            return []
        if reply.ack_policy not in (None, FLOW_CONTROL):
            stream, consumer = self.settings.stream, self.settings.consumer
            return self.reset_failed(f"consumer {stream}/{consumer} no longer has ack_policy flow_control", now)
        return self._created(reply.created) + self.reset_succeeded(reply.reset_seq, now)

    def consumer_at_rest(self, consumer: BoundConsumer, now: float) -> list[Effect] | None:
        """The consumer as the pending reset's look-up (or start-up) found it, before the RESET is sent.

        When the reset goes to the ack floor and the consumer is ``at_rest``, the RESET would change nothing but
        the delivery sequences' numbering: the new epoch starts where the consumer stands (its next delivery is
        ``delivered[0] + 1``), its ack floor is adopted as after a RESET, and no RESET is sent (a thousand quiet
        sources starting, or reconnecting after an outage, need one JetStream request each instead of two).
        Anything that is not where it should be shows as after any reset: a delivery sequence other than the next
        (deliveries to someone else meanwhile, a RESET by someone else) is a discontinuity, and a heartbeat naming
        another last delivery too.

        Returns None, changing nothing, when the RESET is needed: anything outstanding, a reset to a chosen
        sequence, or no reset in flight (the one rule).
        """
        if not self._phases.can(Event.RESET_DONE) or self._resets.seq is not None or not consumer.at_rest:
            return None
        assert consumer.delivered is not None  # at_rest says so
        self._resets.unneeded()
        effects = self._created(consumer.created)
        detail: dict[str, object] = {"last_dseq": consumer.delivered[0], "ack_floor": consumer.ack_floor}
        effects += self._new_epoch(consumer.ack_floor, consumer.delivered, now, "consumer.resumed", detail)
        return effects

    def reset_succeeded(self, reset_seq: int, now: float) -> list[Effect]:
        """The consumer was reset; its next delivery is ``reset_seq`` or later, with delivery sequence 1."""
        if not self._phases.can(Event.RESET_DONE):
            return []
        self._resets.succeeded()
        effects = self._new_epoch(reset_seq - 1, (0, 0), now, "reset.done", {"reset_seq": reset_seq})
        self._reset_seq = reset_seq
        return effects

    def _created(self, created: str | None) -> list[Effect]:
        """The consumer's creation time as a reset's reply or look-up gives it: a new one means it was re-created."""
        if created is None or created == self._consumer_created:
            return []
        effects: list[Effect] = []
        if self._consumer_created is not None:
            fields = {"consumer": self.settings.consumer, "created": created}
            effects.append(Notice("consumer.recreated", "warning", fields))
        self._consumer_created = created
        return effects

    def _new_epoch(
        self, floor: int, last: tuple[int, int], now: float, event: str, detail: dict[str, object]
    ) -> list[Effect]:
        """A new epoch begins after ``last`` (delivery and stream sequence: (0, 0) after a RESET), ``floor`` the
        consumer's ack floor (adopted as an intentional skip above ``accepted``); logged as ``event`` with
        ``detail``."""
        self._phases.process(Event.RESET_DONE)
        self.epoch += 1
        self.last_dseq, self._epoch_last_sseq = last
        self._reset_seq = 0
        self.ledger.new_epoch()
        self._last_activity = now
        self._stranded.rearm(now)
        effects: list[Effect] = []
        fields: dict[str, object] = {
            "cause": self._resets.cause.value,
            "epoch": self.epoch,
            **detail,
            "watermark": self.watermark,
        }
        self._skip_to(floor, fields)
        effects.append(Notice(event, fields=fields))
        # RESET does not clear an outstanding FC request: answer it now, with new-epoch positions only
        answer = self.ledger.answer_held()
        if answer is not None:
            effects.append(answer)
        self._pump(now, effects)
        return effects

    # -- aggregate side -------------------------------------------------------------------------------------

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
            or not (max(self.skipped_through, self.start_floor) < confirmed <= self.acked_stream_seq)
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
        self._tick(now, effects)
        start = max(self.skipped_through, self.start_floor) + 1  # what was skipped on purpose is not stranded
        if self._phases.takes_deliveries and self._stranded.due(now):
            self._stranded.start(now)
            if self.acked_stream_seq >= start:
                effects.append(ProbeStranded(start))
            else:
                self._stranded.failed()  # nothing acked to look under yet
        self._pump(now, effects)
        self._watch_progress(now, effects)
        return effects

    def tick_deadline(self, now: float) -> float:
        """A quiet flow-control engine's timers: the silence (``silence_timeout`` after the last heartbeat, which
        the server sends every second), the next look for stranded messages and, with work waiting at the origin
        or the pipeline blocked, the stall watch; before the earliest a tick finds nothing to do. At 1 msg/s per
        source, a tick per source per second was a tenth of the process's work per message.

        ``now`` (a tick each second) while stalled (a recovery is noticed on a tick) and while degraded (the
        target's limits are read on ticks). A look that is out has no timer here: its answer, or its failure (the
        runtime's request has a timeout), comes as an input, and the runtime places the source again by the
        deadline after it (the answer may want a confirmation within ``STRANDED_CONFIRM``). Ticking each second
        while a look was out cost more than the looks: after a start or a storm a thousand sources' looks wait for
        API slots for seconds, and every one of them was ticked meanwhile (bench edge: most of the ticks). Every
        other input that brings a deadline forward either makes the engine busy (a delivery, a reset) or sets it at
        least ``STRANDED_CHECK`` (a new epoch's or a reconnect's look) or ``stalled_after`` (a stall clock
        starting) after it: the deadline is at most that far, so the runtime may keep it across a spell of work no
        tick saw (at 1 msg/s, a delivery and its ack within a tenth of a second, every second). An idle source's
        stall clock restarts at its last tick, so it may start up to ``silence_timeout`` earlier than with a tick
        every second (against ``stalled_after``'s minute)."""
        stall, pipeline = self.stall, self.pipeline
        if stall.stalled or pipeline.degraded:
            return now
        quiet = self.quiet
        if quiet:
            deadline = now + min(STRANDED_CHECK, stall.stalled_after)
        elif self._phases.takes_deliveries and not self._verifying and pipeline.awaiting_acks:
            # busy with publishes awaiting their acks only: the first ack deadline (the acks are inputs); at 1 msg/s
            # per source the ticks that caught a publish in flight found nothing to do (a tenth of the main thread's
            # profile samples at 1,000 sources; bench/RESULTS.md could not show the saving)
            deadline = pipeline.next_deadline() or now
        else:
            return now
        deadline = min(deadline, self.silence_deadline())
        if self._stranded.enabled:
            deadline = min(deadline, self._stranded.next_at)
        if not quiet or self.origin_pending or pipeline.blocked is not None:  # not idle: the stall clock runs
            deadline = min(deadline, stall.since + stall.stalled_after)
        return max(now, deadline)

    # -- shutdown -------------------------------------------------------------------------------------------

    def begin_shutdown(self, now: float) -> list[Effect]:
        """Stop taking deliveries and sending new publishes; in-flight acks still advance the watermark."""
        if not self._phases.can(Event.SHUTDOWN):
            return []
        # positions are only good for the epoch the server is in: if a reset was pending, answer empty from now on
        if not self._phases.takes_deliveries:
            self.ledger.epoch_replaced()
        self._phases.process(Event.SHUTDOWN)
        return self._stopped(now)

    def final_answer(self) -> list[Effect]:
        """Answer a held FC request with whatever is stored (the only subject the server will honour)."""
        answer = self.ledger.answer_held()
        return [answer] if answer is not None else []

    # -- internals ------------------------------------------------------------------------------------------

    def _cover(self, effects: list[Effect], now: float) -> None:
        self.ledger.cover(self.watermark)
        self._answer_if_covered(effects, now)
        super()._cover(effects, now)

    def _answer_if_covered(self, effects: list[Effect], now: float) -> None:
        # while a reset is pending the epoch is about to be replaced: the held request is answered after it
        if self._phases.answers_flow_control:
            answer = self.ledger.answer_covered()
            if answer is not None:
                effects.append(answer)
                size = self._sizer.released(now)
                if size:
                    effects.append(ResizeWindow(size))
