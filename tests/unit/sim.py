"""A pure-Python model of the world around one ``SourceEngine``, for property and scenario tests.

* ``OriginServer``: a WorkQueue (or Limits) origin stream and its ``ack_policy: flow_control`` push consumer, following
  docs/protocol.md sections 2, 3 and 5 (v2.14.0 semantics): dseq +1 per delivery and back to 1 after a RESET; RESET goes
  to ``seq`` (or the ack floor + 1) and does not clear the outstanding FC subject; deliveries pause at
  ``max_ack_pending`` with an FC request; an idle heartbeat carries ``Nats-Last-Consumer``/``Nats-Last-Stream``
  (and ``Nats-Consumer-Stalled`` while an FC is outstanding) and is followed by an FC request when anything is
  pending; an FC answer is ignored unless it names the current FC subject, is a no-op unless both numbers are above
  the floors, else sets the floors verbatim and the WorkQueue deletes every sequence <= ``Nats-Last-Stream``
  (future ones via pre-ack); a Limits stream keeps them, and a RESET makes the consumer walk them again.
* ``Target``: the aggregate: stores by ``Nats-Msg-Id`` (duplicates are acked as stored), can reject or lose a
  publish or its ack, hands acks back in any order, and answers the engine's ``VerifyStored`` reads. With
  ``SimConfig.batched`` it takes fast batches as nats-server 2.14+ does in gap-fail mode (server/stream.go,
  ``processJetStreamFastBatchMsg``): a member is stored only right after the previous one; a gap ends the batch with
  a gap report and the commit's ack; an unknown batch is refused (10208); acks are cumulative, one every ``flow``
  members (the members after the last one wait for the commit's ack). The copies of one
  life are then checked to be stored in origin order, none passed over (ORDER).
* ``Sim``: wires both to an engine through the seam ``bridge.runtime.source`` uses (the engine's input methods fed
  with what the runtime reads: classified deliveries, ``ResetReply``, probe results, target limits; every effect
  performed as the runner performs it: unsubscribe -> RESET -> subscribe), checks docs/design.md's invariants on
  every effect, and can heal every fault and run to quiescence.

Everything is deterministic: the tests choose which step happens next (hypothesis or a script), so a failure
prints the exact event sequence, and ``Sim.trace`` tells what the engine did.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, assert_never

from bridge.core import headers as hdr
from bridge.core.effects import (
    Ack,
    AnswerFlowControl,
    BoundConsumer,
    Effect,
    FetchOrigin,
    Notice,
    ProbeStranded,
    Publish,
    Pull,
    ReadTargetLimits,
    RequestReset,
    RequestResync,
    ResetReply,
    ResizeWindow,
    VerifyStored,
)
from bridge.core.engine import Phase, SourceEngine
from bridge.core.inbound import Inbound, classify
from bridge.core.pipeline import BATCH_COMMIT_EOB, BATCH_UNKNOWN, AckOutcome, OutboundMessage, TargetLimits
from bridge.core.recovery import Copy, Recovery, recover, recovery_depth
from bridge.core.targetwire import outcome_runs
from bridge.testing.engines import engine_settings

STREAM = "ORDERS"
CONSUMER = "BRIDGE"
SOURCE = "edge1"
ACCOUNT_HASH = "AbCd1234"

# (subject, reply, headers, payload), as the plain nats-py subscription would hand it over
Wire = tuple[str, str, dict[str, str] | None, bytes]


class InvariantViolation(AssertionError):
    """An invariant of docs/design.md does not hold; the message carries the tail of the simulation trace."""


def fc_subject(n: int, v2: bool) -> str:
    token = f"fc{n:02d}"
    if v2:
        return f"$JS.FC._.{ACCOUNT_HASH}.{STREAM}.{CONSUMER}.{token}"
    return f"$JS.FC.{STREAM}.{CONSUMER}.{token}"


def ack_subject(sseq: int, dseq: int, pending: int, v2: bool, delivered: int = 1) -> str:
    tail = f"{STREAM}.{CONSUMER}.{delivered}.{sseq}.{dseq}.{1_000_000 * sseq}.{pending}"
    if v2:
        return f"$JS.ACK._.{ACCOUNT_HASH}.{tail}.rnd{sseq}"  # 12 tokens: ADR-15's trailing random token
    return f"$JS.ACK.{tail}"


@dataclass(frozen=True, slots=True)
class OriginMsg:
    seq: int
    subject: str
    headers: dict[str, str] | None
    payload: bytes


def make_origin_message(seq: int) -> OriginMsg:
    """Deterministic content; some messages carry reserved headers the bridge must rename, some are empty."""
    headers: dict[str, str] | None
    if seq % 3 == 0:
        headers = {"Nats-Msg-Id": f"app-{seq}", "Nats-Expected-Last-Sequence": "1", "X-App": str(seq)}
    elif seq % 3 == 1:
        headers = None
    else:
        headers = {"x-lower": "v"}
    payload = b"" if seq % 5 == 0 else f"payload-{seq}".encode()
    return OriginMsg(seq, f"orders.{seq % 4}", headers, payload)


@dataclass
class OriginServer:
    """A WorkQueue stream ``1..n`` (minus ``absent``: filtered out / deleted before delivery) and one consumer."""

    n: int
    absent: frozenset[int]
    max_ack_pending: int
    published_upto: int
    v2: bool = False
    limits: bool = False  # Limits retention: acks delete nothing, acked messages stay and can be walked again
    on_delete: Callable[[int, str], None] = lambda seq, why: None

    messages: dict[int, OriginMsg] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)
    preack: int = 0
    skipped: set[int] = field(default_factory=set)  # given up on purposely by a foreign forward RESET
    # consumer state
    next_sseq: int = 1
    dseq: int = 0  # last delivery sequence handed out
    adflr: int = 0
    asflr: int = 0
    pending: dict[int, int] = field(default_factory=dict)  # sseq -> dseq, delivered and not acked
    history: list[tuple[int, int]] = field(default_factory=list)  # (dseq, sseq) of this consumer epoch
    fcid: str | None = None
    fc_count: int = 0
    interest: bool = False
    channel: deque[Wire] = field(default_factory=deque)
    acks_processed: int = 0
    lose_next: bool = False  # the next data message sent is lost on the way (slow consumer, link loss)
    duplicate_next: bool = False
    may_lose: Callable[[], bool] = lambda: True
    log: Callable[[str], None] = lambda line: None

    def __post_init__(self) -> None:
        self.messages = {s: make_origin_message(s) for s in range(1, self.n + 1) if s not in self.absent}
        self.published_upto = min(self.published_upto, self.n)

    # -- stream -------------------------------------------------------------------------------------------

    def is_message(self, seq: int) -> bool:
        """``seq`` is (or will be, once published) a real message of the stream."""
        return seq in self.messages

    def exists(self, seq: int) -> bool:
        return seq in self.messages and seq <= self.published_upto and seq not in self.deleted

    def remaining(self) -> set[int]:
        return {s for s in self.messages if self.exists(s)}

    def publish_more(self, k: int) -> None:
        old = self.published_upto
        self.published_upto = min(self.n, old + k)
        for seq in range(old + 1, self.published_upto + 1):
            if not self.limits and seq in self.messages and seq <= self.preack:
                self._delete(seq, "pre-ack")  # a WorkQueue deletes on arrival what an ack already covered

    def _delete(self, seq: int, why: str) -> None:
        self.on_delete(seq, why)
        self.deleted.add(seq)

    # -- consumer -----------------------------------------------------------------------------------------

    def _issue_fc(self) -> None:
        self.fc_count += 1
        self.fcid = fc_subject(self.fc_count, self.v2)
        self.channel.append(("deliver", self.fcid, {"Status": "100", "Description": "FlowControl Request"}, b""))

    def deliver_one(self) -> bool:
        """Push the next message to the deliver subject, if the consumer may (interest, ``max_ack_pending``)."""
        if not self.interest or len(self.pending) >= self.max_ack_pending:
            return False
        s = self.next_sseq
        while s <= self.published_upto and not self.exists(s):
            s += 1
        if s > self.published_upto:
            self.next_sseq = max(self.next_sseq, s)
            return False
        msg = self.messages[s]
        self.dseq += 1
        self.pending[s] = self.dseq
        self.history.append((self.dseq, s))
        self.next_sseq = s + 1
        num_pending = sum(1 for t in range(s + 1, self.published_upto + 1) if self.exists(t))
        reply = ack_subject(s, self.dseq, num_pending, self.v2)
        wire = (msg.subject, reply, dict(msg.headers) if msg.headers else None, msg.payload)
        if self.lose_next and self.may_lose():
            self.lose_next = False
            self.log(f"LOST on the wire: {reply}")
        else:
            self.channel.append(wire)
        if self.duplicate_next:
            self.duplicate_next = False
            self.channel.append(wire)
            self.log(f"DUPLICATED on the wire: {reply}")
        if len(self.pending) >= self.max_ack_pending and self.fcid is None:
            self._issue_fc()
        return True

    def heartbeat(self) -> bool:
        """An idle heartbeat, then (flow_control only) an FC request if anything is unacknowledged."""
        if not self.interest:
            return False
        headers = {
            "Status": "100",
            "Description": "Idle Heartbeat",
            "Nats-Last-Consumer": str(self.dseq),
            "Nats-Last-Stream": str(self.next_sseq - 1),
        }
        if self.fcid is not None:
            headers["Nats-Consumer-Stalled"] = self.fcid
        self.channel.append(("deliver", "", headers, b""))
        if self.pending and self.fcid is None:
            self._issue_fc()
        return True

    def answer(self, subject: str, headers: Mapping[str, str] | None) -> str:
        """Process a flow-control answer (docs/protocol.md 3.2); returns what happened, for the trace."""
        if subject != self.fcid:
            return "ignored (not the current FC subject)"
        self.fcid = None
        if not headers:
            return "window released, nothing acked"
        ldseq = int(headers.get("Nats-Last-Consumer", "-1"))
        lsseq = int(headers.get("Nats-Last-Stream", "-1"))
        if lsseq <= 0:
            return "no ack (no Nats-Last-Stream)"
        ldseq = max(ldseq, 0)
        if ldseq <= self.adflr or lsseq <= self.asflr:
            return f"no-op ack ({ldseq},{lsseq}) at floor ({self.adflr},{self.asflr})"
        self.adflr, self.asflr = ldseq, lsseq
        self.acks_processed += 1
        for s in [s for s in self.pending if s <= lsseq]:
            del self.pending[s]
        if not self.limits:
            for s in range(1, min(lsseq, self.published_upto) + 1):
                if self.exists(s):
                    self._delete(s, f"acked by FC answer ({ldseq},{lsseq})")
            self.preack = max(self.preack, lsseq)
        return f"acked ({ldseq},{lsseq})"

    def reset(self, seq: int = 0) -> int:
        """``CONSUMER.RESET``: to ``seq``, or to the ack floor when 0; returns ``reset_seq``. ``fcid`` survives."""
        start = seq if seq > 0 else self.asflr + 1
        self.pending.clear()
        self.history.clear()
        self.next_sseq = start
        self.dseq = 0
        self.adflr, self.asflr = 0, start - 1
        return start

    def state(self) -> BoundConsumer:
        """What a consumer create or info reply says of it now."""
        return BoundConsumer(
            created=None,
            ack_floor=self.asflr,
            num_pending=None,
            delivered=(self.dseq, self.next_sseq - 1),
            ack_floor_dseq=self.adflr,
            ack_pending=len(self.pending),
        )

    def foreign_reset(self, seq: int) -> int:
        """Someone else resets the consumer; a forward move gives up on what it jumps over (recorded)."""
        old_floor = self.asflr
        start = self.reset(seq)
        self.skipped.update(range(old_floor + 1, start))
        return start

    def rewind(self, k: int) -> None:
        """A new consumer leader resumes from an older delivered state (before the ``k``-th delivery)."""
        if not self.history:
            return
        k %= len(self.history)
        d, s = self.history[k]
        self.dseq = d - 1
        self.next_sseq = s
        # a replica applies an ack only to a delivery it holds as pending (the store's UpdateAcks refuses others), so
        # the ack floor it resumes from is never above its delivered state
        self.adflr = min(self.adflr, self.dseq)
        self.asflr = min(self.asflr, s - 1)
        del self.history[k:]
        # the new leader's pending list is as old as its delivered state (deliveries are not replicated first)
        self.pending = {seq: dseq for seq, dseq in self.pending.items() if dseq <= self.dseq}


@dataclass(slots=True)
class StoredCopy:
    seq: int
    prev: int
    subject: str
    headers: dict[str, str]
    payload: bytes
    life: int


@dataclass
class Target:
    """The aggregate stream as far as one source is concerned."""

    reject_all: bool = False
    copies: dict[str, StoredCopy] = field(default_factory=dict)  # Nats-Msg-Id -> first stored copy
    store_order: list[int] = field(default_factory=list)
    inbox: deque[tuple[int, Publish]] = field(default_factory=deque)  # (life, publish) not yet processed
    acks: list[AckOutcome] = field(default_factory=list)  # replies on their way to the bridge
    next_fault: str = ""  # the fate of the next publish, armed by a fault step while nothing was waiting
    batches: dict[tuple[int, int], int] = field(default_factory=dict)  # (life, batch) -> last member stored

    def has(self, seq: int) -> bool:
        return hdr.msg_id(SOURCE, STREAM, seq) in self.copies

    def recovery_copies(self) -> list[Copy]:
        return [Copy(c.seq, c.prev) for c in self.copies.values()]


@dataclass(frozen=True, slots=True)
class SimConfig:
    n: int = 10
    absent: frozenset[int] = frozenset()
    published: int = 10
    max_ack_pending: int = 4
    publish_window: int = 3
    v2: bool = False
    limits: bool = False  # origin retention: WorkQueue (acked messages deleted) or Limits (kept)
    recovery_cap: int = 0  # copies above the ack floor a restart reads at most (0: the runtime's recovery_depth)
    batched: bool = False  # the aggregate allows fast batches (allow_batched)


class Sim:
    """One engine, its origin and its target, stepped explicitly; invariants checked on every effect."""

    def __init__(
        self,
        config: SimConfig,
        answer_while_resetting: Literal["fail", "empty", "send"] = "fail",
    ) -> None:
        self.config = config
        # an answer naming a position while a RESET is pending may reach the server after the RESET (which keeps
        # the FC subject) and set its floor from the old epoch: a stall. "fail" reports it (the engine promises
        # never to); "send" lets it through to watch the consequence; "empty" blanks it to look past it
        self.answer_while_resetting = answer_while_resetting
        self.now = 0.0
        self.trace: list[str] = []
        self.origin = OriginServer(
            n=config.n,
            absent=config.absent,
            max_ack_pending=config.max_ack_pending,
            published_upto=config.published,
            v2=config.v2,
            limits=config.limits,
            on_delete=self._check_delete,
            may_lose=lambda: not self.renumbered,
            log=self.log,
        )
        self.target = Target()
        # the source connection: FC answers and RESET requests reach the server in the order they were sent
        self.to_origin: deque[AnswerFlowControl | RequestReset] = deque()
        self.reset_op: RequestReset | None = None  # this life's RESET awaiting its reply
        self.reset_applied: int | None = None  # its reset_seq once the server has applied it (0: not needed)
        self.reset_lookup: BoundConsumer | None = None  # the look-up that found the consumer at rest
        self.verify_op: VerifyStored | None = None  # a read of the aggregate the engine asked for
        self.probe_op: ProbeStranded | None = None  # a look for stranded messages the engine asked for
        self.life = 0
        self.acked_to_engine: set[int] = set()  # origin seqs some engine was told are stored
        self.ids_seen: dict[int, str] = {}
        self.last_reset_request = -1e9
        self.resets_requested = 0
        self.answers_with_ack = 0
        # foreign resets and rewinds re-number deliveries: losing exactly the re-numbered ones is undetectable
        # by dseq (see the limitation test); the fault generator avoids combining them
        self.renumbered = False
        self._start_life(watermark=0, present=())

    # -- helpers ------------------------------------------------------------------------------------------

    def log(self, line: str) -> None:
        self.trace.append(f"t={self.now:7.2f} {line}")

    def fail(self, message: str) -> None:
        tail = "\n".join(self.trace[-120:])
        raise InvariantViolation(f"{message}\n--- last simulation steps ---\n{tail}")

    def safe_prefix(self) -> int:
        """Highest ``s`` with every real origin message <= s stored in the target or purposely skipped."""
        limit = max([self.origin.n, *self.origin.skipped]) + 1
        for t in range(1, limit + 1):
            real = self.origin.is_message(t)
            if t in self.origin.skipped:
                continue
            if t > self.origin.n or (real and not self.target.has(t)):
                return t - 1
        return limit

    def _check_delete(self, seq: int, why: str) -> None:
        # the one way to lose data: the origin deletes a message the target does not hold
        if not self.target.has(seq) and seq not in self.origin.skipped:
            self.fail(f"SAFETY: origin deleted seq {seq} ({why}) which is neither stored nor skipped")

    # -- the bridge process -------------------------------------------------------------------------------

    def _start_life(self, watermark: int, present: Iterable[int]) -> None:
        self.life += 1
        self.engine = SourceEngine(engine_settings(self.config.publish_window), self.now)
        self.first_publish: dict[int, int] = {}  # seq -> index in this life's first-publish order
        self.publish_count = 0
        self.last_first_seq = 0
        self.last_reset_request = -1e9
        self.log(f"life {self.life}: recovered watermark={watermark} present={sorted(present)}")
        self.apply(self.engine.recovered(watermark, present, self.now, workqueue=not self.config.limits))
        if self.config.batched:  # the runtime reads the target's limits once it has recovered (SourceRunner)
            limits = TargetLimits(max_payload=1024 * 1024, batched=True)
            self.apply(self.engine.target_limits(limits, self.now))

    def crash(self, reset_applied: bool) -> None:
        """The bridge dies and restarts: volatile state, subscription and publish acks are gone."""
        self.log(f"CRASH (a RESET still on the wire reaches the server: {reset_applied})")
        # a RESET still on the wire either reaches the server (and is applied, no one hears the reply) or is lost
        op = self.reset_op
        taken = op is not None and self.reset_applied is None and self._take_from_wire(op)
        if taken and reset_applied and not self.origin.state().at_rest:  # at rest: the look-up sent no RESET
            self.origin.reset(0)
        self.reset_op = None
        self.reset_applied = None
        self.reset_lookup = None
        self.origin.interest = False
        self.origin.channel.clear()
        self.target.acks.clear()  # the old ack inbox is gone; publishes on the wire may still be stored
        self.verify_op = None
        self.probe_op = None
        result = self.recover()
        self._start_life(result.watermark, result.present)

    def recover(self) -> Recovery:
        """What the runtime does at start: read this source's copies above the consumer's ack floor, newest first,
        at most ``recovery_cap`` of them, and anchor the chain at that floor (``bridge.runtime.source._recover``,
        ``bridge.io.aggregate.read_source_tail``). A read cut short trusts its oldest copy."""
        floor = self.origin.asflr
        above = sorted((c for c in self.target.recovery_copies() if c.stream_seq > floor), key=lambda c: c.stream_seq)
        cap = self.config.recovery_cap or recovery_depth(self.config.publish_window)
        complete = len(above) <= cap
        result = recover(above[-cap:], floor=floor, complete=complete)
        self.log(f"recovery read {min(len(above), cap)} copies above floor {floor} (complete: {complete})")
        return result

    def graceful_restart(self) -> None:
        """SIGTERM: stop taking deliveries, wait for in-flight publish acks, answer a held FC, then restart."""
        self.log("SIGTERM")
        self.apply(self.engine.begin_shutdown(self.now))
        self.origin.interest = False  # the runtime unsubscribes first
        self.origin.channel.clear()
        while self.target.inbox:  # the grace period: what is on its way is answered
            self.step_target("ok")
        while self.target.acks:
            self.step_ack(0)
        # a publish lost without a reply is given up on by its ack timeout (the runtime's ticker keeps running)
        self.step_tick(self.engine.settings.ack_timeout)
        if not self.engine.drained:
            self.fail("shutdown: publishes still in flight after the grace period")
        self.apply(self.engine.final_answer())
        self.crash(reset_applied=True)

    def apply(self, effects: list[Effect]) -> None:
        """Carry out effects in order, as the runtime's executor does, checking invariants on each."""
        for effect in effects:
            match effect:
                case Publish():
                    self._on_publish(effect)
                case AnswerFlowControl():
                    self._on_answer(effect)
                case RequestReset():
                    self._on_reset_request(effect)
                case VerifyStored():
                    self.log(f"verify requested gen={effect.generation} seqs={list(effect.stream_seqs)}")
                    if self.verify_op is not None:
                        self.fail("a second VerifyStored while one is outstanding")
                    self.verify_op = effect
                case ReadTargetLimits():
                    self.log("target limits read")
                    limits = TargetLimits(max_payload=1024 * 1024, batched=self.config.batched)
                    self.apply(self.engine.target_limits(limits, self.now))
                case ProbeStranded():
                    self.log(f"stranded probe from {effect.start}")
                    if self.probe_op is not None:
                        self.fail("a second ProbeStranded while one is outstanding")
                    self.probe_op = effect
                case ResizeWindow():
                    self.log(f"window resized to {effect.size}")  # the consumer update succeeds at once
                    self.apply(self.engine.window_resized(effect.size, self.now))
                case Notice():
                    self.log(f"notice {effect.event} {dict(effect.fields)}")
                case RequestResync() | Pull() | Ack() | FetchOrigin():
                    self.fail(f"a pull-mode effect in flow-control mode: {effect}")
                case _:
                    assert_never(effect)

    def _on_publish(self, effect: Publish) -> None:
        entry = effect.entry
        seq = entry.stream_seq
        if effect.batch and not self.config.batched:
            self.fail(f"a batch publish to a target that does not allow batches: {effect}")
        if effect.op == BATCH_COMMIT_EOB:
            self.log(f"commit batch {effect.batch} at member {effect.bseq}")
            self.target.inbox.append((self.life, effect))
            return
        message = entry.message
        if message is None:
            self.fail(f"Publish of a marker entry without a message (seq {seq})")
            return
        self.log(f"publish seq={seq} order={entry.order} attempt={effect.attempt}")
        if seq in self.acked_to_engine:
            self.fail(f"NO-DUP: seq {seq} published again after the engine was told it is stored")
        mid = message.headers.get(hdr.MSG_ID)
        if mid != hdr.msg_id(SOURCE, STREAM, seq) or self.ids_seen.setdefault(seq, mid) != mid:
            self.fail(f"NO-DUP: seq {seq} published with Nats-Msg-Id {mid!r}")
        if message.headers.get(hdr.SEQ) != str(seq):
            self.fail(f"provenance: seq {seq} carries Bridge-Seq {message.headers.get(hdr.SEQ)!r}")
        origin = self.origin.messages.get(seq)
        if origin is None or origin.payload != message.payload:
            self.fail(f"integrity: seq {seq} published with a payload that is not the origin's")
        if seq not in self.first_publish:
            if seq <= self.last_first_seq:
                self.fail(f"ORDER: first publish of seq {seq} after seq {self.last_first_seq} (life {self.life})")
            self.last_first_seq = seq
            self.first_publish[seq] = self.publish_count
            self.publish_count += 1
        self.target.inbox.append((self.life, effect))

    def _on_answer(self, effect: AnswerFlowControl) -> None:
        self.log(f"answer {effect.subject} ({effect.last_consumer},{effect.last_stream})")
        if effect.acks and self.engine.phase in (Phase.RESET_WAIT, Phase.RESETTING):
            if self.answer_while_resetting == "fail":
                self.fail(f"EPOCH: FC answer {effect} with a position while a RESET is pending")
            elif self.answer_while_resetting == "empty":
                self.log("  (sent empty instead)")
                effect = AnswerFlowControl(effect.subject, 0, 0)
        if effect.acks:
            self.answers_with_ack += 1
            safe = self.safe_prefix()
            if effect.last_stream > safe:
                self.fail(
                    f"SAFETY: FC answer names Nats-Last-Stream {effect.last_stream} but only {safe} is stored "
                    "contiguously (or skipped)"
                )
            if effect.last_consumer > self.engine.last_dseq:
                self.fail(f"FC answer names dseq {effect.last_consumer} above the last accepted one")
        elif effect.last_consumer or effect.last_stream:
            self.fail(f"half-empty FC answer {effect}")
        self.to_origin.append(effect)

    def _on_reset_request(self, effect: RequestReset) -> None:
        self.log(f"RESET requested cause={effect.cause.value} attempt={effect.attempt}")
        if self.reset_op is not None:
            self.fail("a second RESET was requested while one is in flight")
        if self.now - self.last_reset_request < self.engine.settings.reset_min_interval - 1e-9:
            self.fail(f"RESET throttle: {self.now - self.last_reset_request:.2f}s since the previous one")
        self.last_reset_request = self.now
        self.resets_requested += 1
        # the runtime unsubscribes before the RESET: whatever was on its way is gone
        self.origin.interest = False
        self.origin.channel.clear()
        self.reset_op = effect
        self.reset_applied = None
        self.reset_lookup = None
        self.to_origin.append(effect)

    def _take_from_wire(self, item: AnswerFlowControl | RequestReset) -> bool:
        for i, queued in enumerate(self.to_origin):
            if queued is item:
                del self.to_origin[i]
                return True
        return False

    # -- steps --------------------------------------------------------------------------------------------

    def step_deliver(self) -> None:
        if self.origin.deliver_one():
            self.log(f"server delivers dseq {self.origin.dseq} (sseq {self.origin.history[-1][1]})")

    def step_receive(self) -> None:
        if not self.origin.channel:
            return
        subject, reply, headers, payload = self.origin.channel.popleft()
        inbound = classify(subject, reply, headers, payload)
        self.log(f"bridge receives {type(inbound).__name__} {reply or headers}")
        self.apply(self.engine.receive(inbound, self.now))

    def step_receive_many(self, k: int) -> None:
        """Up to ``k`` messages reach the bridge in one read: handed over together (``receive_many``)."""
        batch: list[Inbound] = []
        while self.origin.channel and len(batch) < k:
            batch.append(classify(*self.origin.channel.popleft()))
        if batch:
            self.log(f"bridge receives {len(batch)} in one read: {[type(m).__name__ for m in batch]}")
            self.apply(self.engine.receive_many(batch, self.now))

    def step_drop(self) -> None:
        """Lose the oldest message on its way to the bridge (or, when none is, the next one sent)."""
        if not self.origin.channel:
            self.origin.lose_next = True
            return
        if self.renumbered and self.origin.channel[0][1].startswith("$JS.ACK"):
            return  # see ``renumbered``: a documented limitation, tested on its own
        self.log(f"LOST on the wire: {self.origin.channel.popleft()[1] or 'heartbeat'}")

    def check_watermark(self) -> None:
        """The engine's watermark never claims more than the target holds contiguously (or was skipped)."""
        safe = self.safe_prefix()
        if self.engine.watermark > safe:
            self.fail(f"SAFETY: engine watermark {self.engine.watermark} above the stored prefix {safe}")

    def step_duplicate(self) -> None:
        """Deliver the oldest data message on its way twice (or, when none is, the next one)."""
        if not self.origin.channel:
            self.origin.duplicate_next = True
        elif self.origin.channel[0][1].startswith("$JS.ACK"):
            self.origin.channel.appendleft(self.origin.channel[0])
            self.log("DUPLICATED on the wire")

    def step_heartbeat(self) -> None:
        deadline = self.engine.tick_deadline(self.now)
        self.now += 1.0
        if self.origin.heartbeat():
            self.log("server heartbeat")
        self.apply(self.ticked(deadline))

    def step_tick(self, dt: float) -> None:
        deadline = self.engine.tick_deadline(self.now)
        self.now += dt
        self.apply(self.ticked(deadline))

    def ticked(self, deadline: float) -> list[Effect]:
        """A tick now; ``deadline`` is what the engine said before the clock moved (``tick_deadline``): a tick
        before it must find nothing to do, or the runtime, which passes a quiet source by until then, would miss it."""
        effects = self.engine.tick(self.now)
        if self.now < deadline and effects:
            self.fail(f"a tick at {self.now} before the deadline {deadline} did {effects}")
        return effects

    def step_target(self, fate: str) -> None:
        """The target handles the oldest publish: ``ok``, ``reject``, ``lost`` (no ack) or ``lost_ack``.

        A fault with nothing waiting befalls the next publish instead, so that faults meet publishes in flight.
        """
        if not self.target.inbox:
            if fate != "ok":
                self.target.next_fault = fate
            return
        if fate == "ok" and self.target.next_fault:
            fate, self.target.next_fault = self.target.next_fault, ""
        life, publish = self.target.inbox.popleft()
        if publish.batch:
            self._batch_member(life, publish, fate)
            return
        entry = publish.entry
        message = entry.message
        assert message is not None
        if self.target.reject_all and fate in ("ok", "lost_ack"):
            fate = "reject"
        if fate in ("ok", "lost_ack"):
            self._store(entry.stream_seq, message, life)
        self.log(f"target {fate} seq={entry.stream_seq} attempt={publish.attempt} (life {life})")
        if life != self.life or fate in ("lost", "lost_ack"):
            return
        error = "" if fate == "ok" else "rejected"
        self.target.acks.append(AckOutcome(entry.order, publish.attempt, fate == "ok", error=error))

    def _store(self, seq: int, message: OutboundMessage, life: int) -> None:
        mid = message.headers[hdr.MSG_ID]
        if mid not in self.target.copies:
            self._check_store_order(seq, life)
            self.target.copies[mid] = StoredCopy(
                seq, int(message.headers[hdr.PREV]), message.subject, dict(message.headers), message.payload, life
            )
            self.target.store_order.append(seq)

    def _batch_member(self, life: int, publish: Publish, fate: str) -> None:
        """A fast batch member (or commit) reaches the server: gap-fail mode, as nats-server 2.14+ handles it."""
        entry, key, bseq = publish.entry, (life, publish.batch), publish.bseq
        replies: list[AckOutcome] = []

        def reply(stored: bool, error: str = "", through: int = 0, ended: bool = False, code: int = 0) -> None:
            replies.append(
                AckOutcome(
                    entry.order,
                    publish.attempt,
                    stored,
                    error=error,
                    batch=publish.batch,
                    bseq=bseq,
                    through=through,
                    ended=ended,
                    code=code,
                )
            )

        if self.target.reject_all and fate in ("ok", "lost_ack"):
            fate = "reject"
        last = self.target.batches.get(key)
        if fate == "lost":
            pass  # never reached the stream: the next member finds the gap
        elif fate == "reject":
            reply(False, error="rejected", ended=True)  # e.g. not the leader: the batch's state is not touched
        elif publish.op == BATCH_COMMIT_EOB:
            if last is None:
                reply(False, error="batch publish ID unknown", ended=True, code=BATCH_UNKNOWN)
            else:
                del self.target.batches[key]
                reply(True, through=last, ended=True)
        elif last is None and bseq != 1:
            reply(False, error="batch publish ID unknown", ended=True, code=BATCH_UNKNOWN)
        elif last is not None and bseq != last + 1:
            del self.target.batches[key]  # gap-fail: the batch is committed with what it stored
            replies.append(
                AckOutcome(entry.order, publish.attempt, False, error="gap", batch=publish.batch, bseq=last + 1)
            )
            reply(True, through=last, ended=True)
        else:
            assert entry.message is not None
            self._store(entry.stream_seq, entry.message, life)
            self.target.batches[key] = bseq
            if bseq % max(1, publish.flow) == 0:  # a flow ack every `flow` members: the tail waits for the commit
                reply(True, through=bseq)
        self.log(
            f"target {fate} batch {publish.batch} member {bseq} op {publish.op} seq={entry.stream_seq} (life {life})"
        )
        if life != self.life or fate in ("lost", "lost_ack"):
            return
        self.target.acks.extend(replies)

    def _check_store_order(self, seq: int, life: int) -> None:
        # nothing below a stored copy was silently passed over: every missing earlier message was published by
        # this life (it is being retried); and (the span the recovery fallback relies on) the copy was first
        # published less than a window after it
        if life != self.life:
            return
        if self.config.batched:
            for earlier in range(1, seq):
                if (
                    self.origin.is_message(earlier)
                    and not self.target.has(earlier)
                    and earlier not in self.origin.skipped
                    and earlier > self.engine.watermark
                ):
                    self.fail(f"ORDER: seq {seq} stored while seq {earlier} is not (batched target, life {life})")
            return
        window = self.config.publish_window
        for earlier in range(1, seq):
            if (
                not self.origin.is_message(earlier)
                or self.target.has(earlier)
                or earlier in self.origin.skipped
                or earlier <= self.engine.watermark
            ):
                continue
            if earlier not in self.first_publish:
                self.fail(f"HOLE: seq {seq} stored while seq {earlier} was never published (life {self.life})")
            elif self.first_publish[seq] - self.first_publish[earlier] >= window:
                self.fail(f"SPAN: seq {seq} stored while seq {earlier} is missing, a window or more before it")

    def step_ack(self, index: int) -> None:
        if not self.target.acks:
            return
        self._hand_over([self.target.acks.pop(index % len(self.target.acks))])

    def step_ack_many(self, k: int) -> None:
        """The oldest ``k`` publish acks reach the bridge in one read, handed over as the runner does: the stored
        ones together (``publish_stored_many``), a failure after what was stored before it."""
        replies = self.target.acks[:k]
        del self.target.acks[:k]
        self._hand_over(replies)

    def _hand_over(self, replies: list[AckOutcome]) -> None:
        """Replies of one read, as ``SourceRunner._on_outcomes`` hands them to the engine (batch replies expanded)."""
        for reply in replies:
            self.log(
                f"publish ack order={reply.order} attempt={reply.attempt} stored={reply.stored} (batch {reply.batch})"
            )
        pipeline = self.engine.pipeline
        if all(reply.stored and not reply.batch for reply in replies):  # the common read: in one call
            for reply in replies:
                entry = pipeline.entry(reply.order)
                if entry is not None:
                    self.acked_to_engine.add(entry.stream_seq)
            effects = self.engine.acks_stored(replies, self.now, 0, None)
            assert effects is not None, "a read of stored plain acks refused by acks_stored"
            self.apply(effects)
            return
        assert self.engine.acks_stored(replies, self.now, 0, None) is None  # (and changed nothing)
        for stored, failed in outcome_runs(pipeline.expand(replies, self.now)):
            for order, _ in stored:
                entry = pipeline.entry(order)
                if entry is not None:
                    self.acked_to_engine.add(entry.stream_seq)
            if stored:
                self.apply(self.engine.publish_stored_many(stored, self.now))
            if failed is not None:
                self.apply(self.engine.publish_failed(failed.order, failed.attempt, failed.error, self.now))

    def step_answer_arrives(self) -> None:
        """The server processes the oldest FC answer or RESET request sent on the source connection."""
        if not self.to_origin:
            return
        item = self.to_origin.popleft()
        if isinstance(item, RequestReset):
            # the runtime looks the consumer up first; found at rest (and the reset is to the ack floor), the
            # engine takes it as it stands and no RESET is sent
            lookup = self.origin.state()
            if item.seq is None and lookup.at_rest:
                self.log(f"look-up for RESET {item.cause.value}#{item.attempt}: at rest {lookup}, no RESET sent")
                if item is self.reset_op:
                    self.reset_lookup = lookup
                    self.reset_applied = 0
                return
            reset_seq = self.origin.reset(0)
            self.log(f"server applies RESET {item.cause.value}#{item.attempt}: reset_seq={reset_seq}")
            if item is self.reset_op:
                self.reset_applied = reset_seq
            return
        headers = (
            {"Nats-Last-Consumer": str(item.last_consumer), "Nats-Last-Stream": str(item.last_stream)}
            if item.acks
            else None
        )
        self.log(f"server gets answer on {item.subject}: {self.origin.answer(item.subject, headers)}")

    def step_answer_lost(self) -> None:
        if self.to_origin:
            self.log(f"LOST on the way to the server: {self.to_origin.popleft()}")

    def step_reset_reply(self, outcome: str) -> None:
        """Resolve the bridge's RESET: ``ok``, ``error`` (refused) or ``timeout`` (request or reply lost)."""
        op = self.reset_op
        if op is None:
            return
        if outcome == "ok" and self.reset_applied is None:
            # the reply comes after the server has processed everything sent before the request
            while self.reset_applied is None and op in self.to_origin:
                self.step_answer_arrives()
            if self.reset_applied is None:
                outcome = "timeout"  # the request itself was lost on the way
        self.reset_op = None
        if outcome == "ok":
            assert self.reset_applied is not None
            self.now += 0.01
            self.renumbered = False
            lookup, self.reset_lookup = self.reset_lookup, None
            resumed = None if lookup is None else self.engine.consumer_at_rest(lookup, self.now)
            if lookup is not None and resumed is None:
                self.fail(f"the engine sent no RESET for a consumer at rest but did not take it either: {lookup}")
            if resumed is not None:
                self.log(f"RESET not needed: the epoch goes on after dseq {self.origin.dseq}")
                effects = resumed
            else:
                self.log(f"RESET ok reset_seq={self.reset_applied}")
                effects = self.engine.reset_replied(ResetReply(self.reset_applied, "flow_control"), self.now)
        else:
            if self.reset_applied is None:
                self._take_from_wire(op)  # refused, or lost before reaching the server
            self.now += 5.0 if outcome == "timeout" else 0.01
            self.log(f"RESET failed: {outcome} (applied at the server: {self.reset_applied is not None})")
            effects = self.engine.reset_failed(outcome, self.now)
        self.reset_applied = None
        self.reset_lookup = None
        self.origin.interest = True  # the runtime subscribes again whatever the outcome
        self.apply(effects)

    def step_verify(self, ok: bool) -> None:
        """The runtime reads the aggregate for the engine (``ok``) or the read fails."""
        op = self.verify_op
        if op is None:
            return
        self.verify_op = None
        if not ok:
            self.log("verify failed")
            self.apply(self.engine.verify_failed("target unavailable", self.now))
            return
        present = {seq for seq in op.stream_seqs if self.target.has(seq)}
        self.log(f"verify: present {sorted(present)}")
        self.acked_to_engine |= present
        self.apply(self.engine.verified(op.generation, present, self.now))

    def step_probe(self) -> None:
        """The runtime's look for the origin's first message at or after the probe's start."""
        op = self.probe_op
        if op is None:
            return
        self.probe_op = None
        first = min((seq for seq in self.origin.remaining() if seq >= op.start), default=0)
        self.log(f"stranded probe finds {first}")
        self.apply(self.engine.stranded_probed(first, self.now))

    def step_foreign_reset(self, seq: int) -> None:
        start = self.origin.foreign_reset(seq)
        self.renumbered = True
        self.log(f"FOREIGN RESET seq={seq} -> next {start}, skipped now {sorted(self.origin.skipped)}")

    def step_rewind(self, k: int) -> None:
        if self.origin.history:
            self.origin.rewind(k)
            self.renumbered = True
            self.log(f"LEADER CHANGE: consumer rewound to dseq {self.origin.dseq} next sseq {self.origin.next_sseq}")

    def step_reject_all(self, on: bool) -> None:
        self.target.reject_all = on
        self.log(f"target rejects everything: {on}")

    def step_target_reconnect(self) -> None:
        self.log("target connection lost and back")
        self.target.inbox.clear()
        self.target.acks.clear()
        self.apply(self.engine.target_reconnected(self.now))

    def step_source_reconnect(self) -> None:
        self.log("origin connection back")
        self.apply(self.engine.source_reconnected(self.now))

    def step_publish_more(self, k: int) -> None:
        self.origin.publish_more(k)

    # -- healing ------------------------------------------------------------------------------------------

    def drain(self) -> None:
        """Let every message in flight arrive with no fault, until nothing moves."""
        for _ in range(10_000):
            moved = False
            if self.reset_op is not None:
                self.step_reset_reply("ok")
                moved = True
            while self.target.inbox:
                self.step_target("ok")
                moved = True
            while self.target.acks:
                self.step_ack(0)
                moved = True
            if self.verify_op is not None:
                self.step_verify(True)
                moved = True
            if self.probe_op is not None:
                self.step_probe()
                moved = True
            while self.to_origin:
                self.step_answer_arrives()
                moved = True
            while self.origin.channel:
                self.step_receive()
                moved = True
            if self.origin.deliver_one():
                moved = True
            if not moved:
                return
        self.fail("drain did not settle")

    def quiescent(self) -> bool:
        o = self.origin
        return (
            self.engine.phase is Phase.RUNNING
            and self.engine.pipeline.empty
            and not o.pending
            and o.fcid is None
            and all(self.target.has(s) or s in o.skipped for s in o.messages)
            and (o.limits or o.remaining() <= o.skipped)
            and self.verify_op is None
        )

    def heal_and_settle(self, max_seconds: int = 400) -> None:
        """Stop every fault, publish everything, and run (one idle heartbeat per second) until quiescent."""
        self.log("=== HEAL ===")
        self.target.reject_all = False
        self.target.next_fault = ""
        self.origin.lose_next = self.origin.duplicate_next = False
        self.origin.publish_more(self.origin.n)
        for _ in range(max_seconds):
            self.drain()
            if self.quiescent():
                return
            self.step_heartbeat()
        self.fail(
            f"LIVENESS: not quiescent after {max_seconds}s of healthy operation: phase={self.engine.phase} "
            f"backlog={self.engine.pipeline.backlog} pending={sorted(self.origin.pending)} fcid={self.origin.fcid} "
            f"floors=({self.origin.adflr},{self.origin.asflr}) remaining={sorted(self.origin.remaining())} "
            f"missing={[s for s in self.origin.messages if not self.target.has(s)]}"
        )

    def check_final(self) -> None:
        """(d) everything not skipped stored once, intact; (e) the WorkQueue holds only skipped messages."""
        o = self.origin
        for seq, msg in o.messages.items():
            if seq in o.skipped:
                continue
            copy = self.target.copies.get(hdr.msg_id(SOURCE, STREAM, seq))
            if copy is None:
                self.fail(f"FINAL: origin seq {seq} never reached the target")
                return
            if copy.payload != msg.payload or copy.subject != hdr.aggregate_subject(msg.subject, "agg"):
                self.fail(f"FINAL: copy of seq {seq} differs from the origin message")
            prov = hdr.parse_provenance(copy.headers)
            if prov is None or prov.stream_seq != seq or prov.subject != msg.subject:
                self.fail(f"FINAL: copy of seq {seq} has bad provenance {prov}")
            for name, value in (msg.headers or {}).items():
                if copy.headers.get(hdr.rename_reserved(name)) != value:
                    self.fail(f"FINAL: origin header {name} of seq {seq} not carried over")
        if len(self.target.store_order) != len(set(self.target.store_order)):
            self.fail("FINAL: a sequence was stored twice")
        if not o.limits and not o.remaining() <= o.skipped:
            self.fail(f"FINAL: WorkQueue still holds {sorted(o.remaining() - o.skipped)}")
        # on Limits everything stays, so a backward reset makes the consumer walk again: its floor must get back
        # to the end (on a WorkQueue a reset behind deleted messages legitimately leaves the floor low)
        last = max((seq for seq in o.messages if seq not in o.skipped), default=0)
        if o.limits and o.asflr < last:
            self.fail(f"FINAL: the consumer's ack floor {o.asflr} is below the last message {last}")
