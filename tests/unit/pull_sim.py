"""A pure-Python model of the world around one ``PullEngine`` (pull mode), for property and scenario tests.

* ``OriginServer``: the origin stream (WorkQueue, Interest or Limits retention, an optional subject filter) and its
  durable pull consumer with ``ack_policy: explicit``, modelled on nats-server 2.12's ``consumer.go``:

  - the delivered pointer ``sseq`` (next stream sequence to look at) and ``dseq`` (next delivery sequence),
    incremented on *every* delivery, redeliveries included (``deliverMsg``);
  - ``pending``: stream sequence -> (the *original* delivery sequence, the delivery time); a redelivery refreshes
    the time and keeps the sequence (``trackPending``);
  - ``ack_wait`` expiry moves pending messages into the redelivery queue, in sorted batches, which
    ``getNextMsg`` serves before any new message and regardless of ``max_ack_pending`` (``checkPending``, with
    its shift of the expired entries' times that can hold a redelivery back well past ``ack_wait``: ``held_back``);
  - ``max_ack_pending`` stops *new* messages only;
  - waiting pull requests (batch, expiry, idle heartbeat), served round-robin (``waitQueue.pop``); one whose inbox
    lost interest is dropped silently, one that expires ends with ``408 Request Timeout`` and
    ``Nats-Pending-Messages`` (``processWaiting``); ``max_waiting`` full with a heartbeat asked: dropped silently;
  - idle heartbeats per request carrying ``Nats-Last-Consumer = dseq - 1`` and ``Nats-Last-Stream = sseq - 1``
    (``sendIdleHeartbeat``), the same numbers ``CONSUMER.INFO`` reports as ``delivered``;
  - explicit acks (``processAckMsgLocked``, ``AckExplicit``): an ack at or above the delivered pointer is ignored;
    one matching a pending entry removes it and moves the ack floors exactly as the server does; on WorkQueue and
    Interest streams the stream then deletes the message when no consumer needs it (``stream.ackMsg``,
    ``needAck``);
  - a deleted consumer answers its waiting requests with ``409 Consumer Deleted``; a pull request to a consumer that
    does not exist reaches no subscriber, so the client's connection gets ``503`` (no responders, nats-py connects
    with ``no_responders``); a re-created consumer starts at ``deliver_policy: all`` (``selectStartingSeqNo``); on
    an Interest stream deleting the only consumer drops its messages, and what is published while none exists is
    not stored (both recorded as ``lost``: the operator's doing, not the bridge's);
  - a server restart keeps the consumer's delivered state and pending list but may forget its newest acks (and, on
    a WorkQueue or Interest stream, the deletions they caused); a redelivery of a message no longer in the stream
    is terminated like an ack (``getNextMsg``).

* ``Aggregate``: the target stream as far as this source is concerned: a publish ack per message, in order (one
  connection), delayed for as long as the tests let time pass before handing it over, a duplicate window on
  ``Nats-Msg-Id`` (0: none), outages (every publish refused) and connection losses (what was in flight is stored
  or lost, the acks are lost).

* ``PullSim``: the engine, fed exactly as ``bridge/runtime/source.py`` feeds it: ``RequestResync`` is a resync
  (unsubscribe the inbox, bind, re-creating a deleted consumer, read the anchor, ``resynced``, subscribe a new
  inbox whatever the outcome), ``FetchOrigin`` reads the stream, ``Pull`` and ``Ack`` travel to the server in
  order on the one connection, ``Publish`` to the aggregate, ``VerifyStored`` reads it, ``ReadTargetLimits`` is
  answered at once; the clock advances in steps the tests choose, the server's timers and ``engine.tick`` with it.
  Crashes recover the watermark with ``bridge.core.recovery.recover`` from the aggregate's copies above the
  consumer's ack floor, as the runtime does.

Invariants checked as things happen (``InvariantViolation`` with the tail of the trace):

* (a) SAFETY: an ``Ack`` names a stored message when the engine emits it and when the server receives it; after
  every step, every message of this source at or below the consumer's ack floor is in the aggregate, and the
  engine's watermark claims no more than the aggregate holds contiguously;
* (b) NO DUPLICATE: no origin sequence is stored twice (counted by the ``Bridge-Seq`` provenance header), whatever
  the duplicate window;
* (c) ORDER: copies are stored in increasing origin order, except that a message whose publish was refused or lost
  may be stored after later ones (the pipeline keeps up to a window in flight; docs/design.md, recovery.py: the
  hole is retried first, and recovery never steps over it).

``heal_and_settle`` then stops every fault and checks (d) completeness and (e) an emptied WorkQueue/Interest origin
within a bound of simulated seconds.

What is deliberately left out: reordering on a connection (NATS keeps order per connection); a pull request's
``max_bytes``/``no_wait``; ``max_deliver`` and backoff lists (the bridge sets neither); clustered consumers (leader
changes, replicated deliveries); server restarts that forget *deliveries* (a rewound delivered pointer); a read of
the aggregate overtaking a publish sent before it on the same connection; a crashed process's publishes stored
after its successor has read the aggregate (the connection is closed first: each is stored or lost at the crash).
One limit of the engine is kept out of random runs: on a consumer with a subject filter, an operator's re-creation
is never combined with lost deliveries (``renumbered``). Its delivery sequences start again at 1, so losing
exactly as many deliveries as the old consumer had made makes a later one look like the next of the old consumer;
on a consumer of the whole stream the engine catches it (a delivery that skips stream sequences is checked against
the stream), on a filtered one sequence gaps are normal and it cannot (docs/design.md, pull mode).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, assert_never

from bridge.core import headers as hdr
from bridge.core.backoff import Backoff
from bridge.core.effects import (
    Ack,
    AnswerFlowControl,
    Effect,
    FetchOrigin,
    Notice,
    OriginMessage,
    ProbeStranded,
    Publish,
    Pull,
    PullAnchor,
    ReadTargetLimits,
    RequestReset,
    RequestResync,
    ResizeWindow,
    VerifyStored,
)
from bridge.core.inbound import Inbound, classify
from bridge.core.phases import Phase
from bridge.core.pipeline import TargetLimits
from bridge.core.pull import PullEngine
from bridge.core.recovery import Copy, Recovery, recover, recovery_depth
from bridge.core.replication import EngineSettings
from tests.unit.sim import CONSUMER, SOURCE, STREAM, InvariantViolation, OriginMsg, make_origin_message

__all__ = [
    "ACK_WAIT",
    "RESET_BACKOFF",
    "AckUp",
    "Aggregate",
    "OriginServer",
    "PullConsumer",
    "PullSim",
    "PullSimConfig",
    "PullUp",
    "Retention",
    "pull_settings",
]

Retention = Literal["workqueue", "interest", "limits"]
ACK_WAIT = 5.0
SILENCE_TIMEOUT = 5.0
MAX_WAITING = 512  # the server's default max_waiting
TIME_STEP = 0.5  # the clock never jumps further at once: heartbeats and timers fire in between, as they would
RESET_BACKOFF = Backoff(2.0, 30.0)
PUBLISH_RETRY = Backoff(0.5, 15.0)

# (inbox, subject, reply, headers, payload): what the server sends on the bridge's connection
ServerMsg = tuple[str, str, str, dict[str, str] | None, bytes]


def timestamp_ns(seq: int) -> int:
    return 1_000_000 * seq


def ack_reply(dc: int, sseq: int, dseq: int, pending: int) -> str:
    """The v1 ack subject a 2.12 server puts on a delivery (``ackReplyT``)."""
    return f"$JS.ACK.{STREAM}.{CONSUMER}.{dc}.{sseq}.{dseq}.{timestamp_ns(sseq)}.{pending}"


def parse_ack_reply(reply: str) -> tuple[int, int, int]:
    """``(sseq, dseq, dc)`` from an ack subject, as ``ackReplyInfo`` reads it."""
    tokens = reply.split(".")
    return int(tokens[5]), int(tokens[6]), int(tokens[4])


@dataclass(frozen=True, slots=True)
class PullSimConfig:
    n: int = 10  # messages published over the run: sequences 1..n
    published: int = 10  # of which published before the bridge starts
    retention: Retention = "workqueue"
    filters: tuple[str, ...] = ()  # the consumer's filter subjects (none: every subject)
    max_ack_pending: int = 4
    publish_window: int = 3
    pull_expires: float = 30.0
    dedupe_window: float = 0.0  # the aggregate's duplicate window in seconds (0: no deduplication at all)
    recovery_cap: int = 0  # copies above the ack floor a restart reads at most (0: the runtime's recovery_depth)


def pull_settings(config: PullSimConfig) -> EngineSettings:
    return EngineSettings(
        source=SOURCE,
        stream=STREAM,
        consumer=CONSUMER,
        subject_prefix="agg",
        publish_window=config.publish_window,
        ack_timeout=5.0,
        silence_timeout=SILENCE_TIMEOUT,
        reset_min_interval=2.0,
        reset_backoff=RESET_BACKOFF,
        publish_retry=PUBLISH_RETRY,
        stalled_after=60.0,
        # as bridge.runtime.source.engine_settings: never more asked for or unstored than max_ack_pending or the
        # publish window allow
        pull_capacity=max(1, min(config.max_ack_pending, config.publish_window)),
        pull_expires=config.pull_expires,
    )


# -- the origin -------------------------------------------------------------------------------------------


class OriginStream:
    """The origin stream's messages; with Interest retention, only what some consumer is interested in is kept."""

    def __init__(self, retention: Retention, filters: tuple[str, ...]) -> None:
        self.retention = retention
        self.filters = filters
        self.messages: dict[int, OriginMsg] = {}
        self.last_seq = 0
        self.ours: list[int] = []  # sequences published on a subject the consumer's filter takes
        self.lost: set[int] = set()  # of those, removed or never stored by the operator's doing

    def matches(self, subject: str) -> bool:
        return not self.filters or subject in self.filters

    @property
    def first_seq(self) -> int:
        """``FastState().FirstSeq``: the oldest message, or one past the last when the stream is empty."""
        return min(self.messages) if self.messages else self.last_seq + 1

    def publish(self, consumer_exists: bool) -> int:
        self.last_seq += 1
        seq = self.last_seq
        message = make_origin_message(seq)
        ours = self.matches(message.subject)
        if ours:
            self.ours.append(seq)
        if self.retention == "interest" and not (consumer_exists and ours):
            # processJetStreamMsg: no consumer is interested, the sequence is used and nothing stored
            if ours:
                self.lost.add(seq)
            return seq
        self.messages[seq] = message
        return seq

    def expected(self) -> list[int]:
        """The messages the aggregate must end up holding."""
        return [seq for seq in self.ours if seq not in self.lost]

    def remaining_ours(self) -> list[int]:
        return sorted(seq for seq, m in self.messages.items() if self.matches(m.subject))


@dataclass(slots=True)
class Pending:
    dseq: int  # the delivery sequence of the *first* delivery (trackPending keeps it on redelivery)
    at: float


@dataclass(slots=True)
class WaitingRequest:
    inbox: str
    n: int
    expires_at: float
    hb: float
    hbt: float  # next idle heartbeat due


@dataclass(slots=True)
class AckRecord:
    """An ack the server processed, kept so that a restart can forget it."""

    sseq: int
    pending: Pending
    floors: tuple[int, int]  # (adflr, asflr) before it
    deleted: OriginMsg | None  # the message the stream deleted because of it


@dataclass
class PullConsumer:
    created: str
    sseq: int  # o.sseq: the next stream sequence to look at
    dseq: int = 1  # o.dseq: the next delivery sequence
    adflr: int = 0
    asflr: int = 0
    pending: dict[int, Pending] = field(default_factory=dict)
    rdq: list[int] = field(default_factory=list)  # redelivery queue, served first
    rdc: dict[int, int] = field(default_factory=dict)  # redeliveries so far, per stream sequence
    waiting: deque[WaitingRequest] = field(default_factory=deque)
    recent_acks: deque[AckRecord] = field(default_factory=lambda: deque(maxlen=8))

    @property
    def delivered(self) -> tuple[int, int]:
        """``CONSUMER.INFO`` ``delivered``: (consumer_seq, stream_seq) of the last delivery."""
        return self.dseq - 1, self.sseq - 1


class OriginServer:
    """The origin server as the bridge's connection sees it: one stream, at most one durable pull consumer."""

    def __init__(
        self,
        config: PullSimConfig,
        clock: Callable[[], float],
        interest: Callable[[str], bool],
        on_ack: Callable[[int], None],
        log: Callable[[str], None],
    ) -> None:
        self.config = config
        self.clock = clock
        self.interest = interest  # does the bridge's connection subscribe this inbox right now?
        self.on_ack = on_ack  # an ack naming this stream sequence reached the server
        self.log = log
        self.stream = OriginStream(config.retention, config.filters)
        self.consumer: PullConsumer | None = None
        self.outbound: deque[ServerMsg] = deque()  # on its way to the bridge
        self.generation = 0
        # counters for the scenario tests
        self.deliveries = 0
        self.redeliveries = 0
        self.requested = 0  # messages asked for by the pull requests the consumer took

    # -- consumer life ------------------------------------------------------------------------------------

    def create_consumer(self) -> PullConsumer:
        """A new durable with ``deliver_policy: all`` (``selectStartingSeqNo``)."""
        self.generation += 1
        sseq = self.stream.first_seq if self.stream.last_seq else 1
        consumer = PullConsumer(created=f"created-{self.generation}", sseq=sseq, asflr=sseq - 1)
        self.consumer = consumer
        self.log(f"server: consumer {consumer.created} starts at sseq {sseq}")
        return consumer

    def delete_consumer(self) -> None:
        consumer = self.consumer
        if consumer is None:
            return
        for request in consumer.waiting:  # releaseAnyPendingRequests
            self._status(request.inbox, "409", "Consumer Deleted")
        self.consumer = None
        if self.config.retention == "interest":
            # the only consumer is gone: nothing is interested in any message any more
            for seq in list(self.stream.messages):
                self.stream.lost.add(seq)
                del self.stream.messages[seq]
        self.log("server: consumer deleted")

    def restart(self, forget: int, restore_deleted: bool) -> None:
        """The server restarts: waiting requests and the redelivery queue are gone, the consumer's delivered state
        and pending list survive, its ``forget`` newest acks do not (nor, with ``restore_deleted``, the deletions
        they caused)."""
        self.outbound.clear()
        consumer = self.consumer
        if consumer is None:
            return
        consumer.waiting.clear()
        consumer.rdq.clear()
        forgotten = [consumer.recent_acks.pop() for _ in range(min(forget, len(consumer.recent_acks)))]
        for record in forgotten:  # newest first: the floors end as they were before the oldest forgotten ack
            consumer.pending[record.sseq] = record.pending
            consumer.adflr, consumer.asflr = record.floors
            if restore_deleted and record.deleted is not None:
                self.stream.messages[record.sseq] = record.deleted
        consumer.recent_acks.clear()
        self.log(f"server: restarted, forgot acks of {sorted(r.sseq for r in forgotten)}")

    # -- from the bridge ----------------------------------------------------------------------------------

    def pull(self, inbox: str, request: Pull) -> None:
        consumer = self.consumer
        now = self.clock()
        if consumer is None:
            # nobody subscribes CONSUMER.MSG.NEXT of a consumer that does not exist: no responders
            self.outbound.append(
                (inbox, inbox, "", {"Status": "503", "Nats-Subject": "$JS.API.CONSUMER.MSG.NEXT"}, b"")
            )
            self.log(f"server: pull to {inbox} finds no consumer: 503")
            return
        if len(consumer.waiting) >= MAX_WAITING:
            return  # with a heartbeat asked the server does not even answer 409 Exceeded MaxWaiting
        expires_at, next_beat = now + request.expires, now + request.heartbeat
        consumer.waiting.append(WaitingRequest(inbox, request.batch, expires_at, request.heartbeat, next_beat))
        self.requested += request.batch
        self.log(f"server: pull request {request.batch} on {inbox}")

    def ack(self, reply: str) -> None:
        sseq, _, _ = parse_ack_reply(reply)
        self.on_ack(sseq)
        consumer = self.consumer
        if consumer is None:
            return  # nobody subscribes the ack subject
        self._ack(consumer, sseq)

    def _ack(self, consumer: PullConsumer, sseq: int) -> None:
        """``processAckMsgLocked`` for ``AckExplicit``, then ``stream.ackMsg``."""
        if sseq >= consumer.sseq:
            return  # above the delivered pointer: ignored
        pending = consumer.pending.pop(sseq, None)
        record: AckRecord | None = None
        if pending is not None:
            record = AckRecord(sseq, pending, (consumer.adflr, consumer.asflr), None)
            consumer.recent_acks.append(record)
            if not consumer.pending:
                consumer.adflr, consumer.asflr = consumer.delivered
            elif pending.dseq == consumer.adflr + 1:
                consumer.adflr, consumer.asflr = pending.dseq, sseq
                for ss in range(sseq + 1, consumer.sseq):
                    if ss in consumer.pending:
                        consumer.adflr, consumer.asflr = consumer.pending[ss].dseq - 1, ss - 1
                        break
        consumer.rdc.pop(sseq, None)
        if sseq in consumer.rdq:
            consumer.rdq.remove(sseq)
        if self.config.retention != "limits" and sseq in self.stream.messages and not self._needs_ack(consumer, sseq):
            deleted = self.stream.messages.pop(sseq)
            if record is not None:
                record.deleted = deleted
            self.log(f"server: stream deletes {sseq} (acked)")

    def _needs_ack(self, consumer: PullConsumer, sseq: int) -> bool:
        if not self.stream.matches(self.stream.messages[sseq].subject) or sseq <= consumer.asflr:
            return False
        return sseq >= consumer.sseq or sseq in consumer.pending or sseq in consumer.rdc

    # -- the consumer's own work ----------------------------------------------------------------------------

    def timers(self) -> None:
        """What the consumer's timers do by now: ``checkPending`` and ``processWaiting``."""
        consumer = self.consumer
        if consumer is None:
            return
        self._check_pending(consumer)
        self._process_waiting(consumer)

    def _check_pending(self, consumer: PullConsumer) -> None:
        if not consumer.pending:
            return  # the pending timer runs only while something is pending
        now = self.clock()
        first = self.stream.first_seq
        expired: list[int] = []
        for seq, p in list(consumer.pending.items()):
            if seq < first or seq <= consumer.asflr:
                del consumer.pending[seq]
                consumer.rdc.pop(seq, None)
                if seq in consumer.rdq:
                    consumer.rdq.remove(seq)
                consumer.asflr = max(consumer.asflr, seq)
                consumer.adflr = max(consumer.adflr, p.dseq)
                continue
            if now - p.at >= ACK_WAIT and seq not in consumer.rdq:
                expired.append(seq)
        if expired:
            expired.sort()
            consumer.rdq.extend(expired)
            # the server shifts every expired timestamp by the lowest sequence's age "to preserve order" (which can
            # put the others in the future: see ``held_back``)
            offset = now - consumer.pending[expired[0]].at
            for seq in expired:
                consumer.pending[seq].at += offset
            self.log(f"server: ack wait expired for {expired}, redelivery queue {consumer.rdq}")
        if not consumer.pending:
            consumer.rdq.clear()
            consumer.adflr, consumer.asflr = consumer.delivered

    def _process_waiting(self, consumer: PullConsumer) -> None:
        now = self.clock()
        kept: deque[WaitingRequest] = deque()
        for request in consumer.waiting:
            if now > request.expires_at:
                self._status(request.inbox, "408", "Request Timeout", request.n)
                continue
            if not self.interest(request.inbox):
                continue  # the inbox was unsubscribed: the request is dropped without a word
            if now >= request.hbt:
                last_consumer, last_stream = consumer.delivered
                headers = {
                    "Status": "100",
                    "Description": "Idle Heartbeat",
                    "Nats-Last-Consumer": str(last_consumer),
                    "Nats-Last-Stream": str(last_stream),
                }
                self.outbound.append((request.inbox, request.inbox, "", headers, b""))
                request.hbt = now + request.hb
            kept.append(request)
        consumer.waiting = kept

    def held_back(self) -> float:
        """How long the server will still hold back a redelivery on purpose: ``checkPending`` shifts every expired
        entry by the age of the *lowest sequence* among them, so an entry younger than that one gets a delivery
        time in the future (far in the future when the lowest is much older, as an entry a restart put back for a
        forgotten ack can be). A redelivery sets the time to now, so this never grows for a message that is
        redelivered again and again, never acked."""
        consumer = self.consumer
        if consumer is None or not consumer.pending:
            return 0.0
        return max(0.0, max(p.at for p in consumer.pending.values()) - self.clock())

    def _status(self, inbox: str, code: str, description: str, pending: int | None = None) -> None:
        headers = {"Status": code, "Description": description}
        if pending is not None:
            headers["Nats-Pending-Messages"] = str(pending)
            headers["Nats-Pending-Bytes"] = "0"
        self.outbound.append((inbox, inbox, "", headers, b""))

    def deliver(self) -> bool:
        """``loopAndGatherMsgs`` once: the next message to the first waiting request, if there is both."""
        consumer = self.consumer
        if consumer is None:
            return False
        self._process_waiting(consumer)  # expired and abandoned requests never get a message
        if not consumer.waiting:
            return False
        found = self._next_message(consumer)
        if found is None:
            return False
        message, dc = found
        now = self.clock()
        dseq = consumer.dseq
        consumer.dseq += 1
        if message.seq in consumer.pending:
            consumer.pending[message.seq].at = now
        else:
            consumer.pending[message.seq] = Pending(dseq, now)
        request = consumer.waiting.popleft()
        request.n -= 1
        if request.n > 0:
            request.hbt = now + request.hb
            consumer.waiting.append(request)  # round robin: one that wants more goes behind the others
        reply = ack_reply(dc, message.seq, dseq, self._num_pending(consumer))
        headers = dict(message.headers) if message.headers else None
        self.outbound.append((request.inbox, message.subject, reply, headers, message.payload))
        self.deliveries += 1
        if dc > 1:
            self.redeliveries += 1
        self.log(f"server: delivers sseq {message.seq} dseq {dseq} dc {dc} to {request.inbox}")
        return True

    def _next_message(self, consumer: PullConsumer) -> tuple[OriginMsg, int] | None:
        """``getNextMsg``: the redelivery queue first, then (below ``max_ack_pending``) the next new message."""
        while consumer.rdq:
            seq = consumer.rdq.pop(0)
            consumer.rdc[seq] = consumer.rdc.get(seq, 0) + 1
            message = self.stream.messages.get(seq)
            if message is None:
                # scheduled for redelivery but removed from the stream meanwhile: terminated, like an ack
                consumer.rdc[seq] -= 1
                if seq in consumer.pending:
                    self._ack(consumer, seq)
                continue
            return message, consumer.rdc[seq] + 1
        if len(consumer.pending) >= self.config.max_ack_pending:
            return None
        for seq in sorted(s for s in self.stream.messages if s >= consumer.sseq):
            message = self.stream.messages[seq]
            if self.stream.matches(message.subject):
                consumer.sseq = seq + 1
                return message, 1
        # end of stream: LoadNextMsg reports the last sequence, and the pointer moves past everything not ours
        if self.stream.last_seq >= consumer.sseq:
            consumer.sseq = self.stream.last_seq + 1
        return None

    def _num_pending(self, consumer: PullConsumer) -> int:
        return sum(1 for s, m in self.stream.messages.items() if s >= consumer.sseq and self.stream.matches(m.subject))


# -- the aggregate ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class AggCopy:
    seq: int
    prev: int
    subject: str
    headers: dict[str, str]
    payload: bytes


@dataclass
class Aggregate:
    """The aggregate stream: stores in arrival order, deduplicates ``Nats-Msg-Id`` within ``dedupe_window``."""

    dedupe_window: float
    down: bool = False  # an outage: every publish is refused, every read fails
    copies: list[AggCopy] = field(default_factory=list)
    count: Counter[int] = field(default_factory=Counter)  # copies per Bridge-Seq of this source
    ids: dict[str, float] = field(default_factory=dict)  # Nats-Msg-Id -> when last stored
    inbox: deque[tuple[int, Publish]] = field(default_factory=deque)  # (life, publish) on its way, in order
    acks: deque[tuple[int, int, int, bool, str]] = field(default_factory=deque)  # (life, order, attempt, ok, err)

    def has(self, seq: int) -> bool:
        return self.count[seq] > 0

    def recovery_copies(self) -> list[Copy]:
        return [Copy(c.seq, c.prev) for c in self.copies]


# -- the simulation ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AckUp:
    reply: str


@dataclass(frozen=True, slots=True)
class PullUp:
    inbox: str
    request: Pull


Up = AckUp | PullUp


class PullSim:
    """One ``PullEngine``, its origin server and the aggregate, stepped explicitly; invariants checked throughout."""

    def __init__(self, config: PullSimConfig) -> None:
        self.config = config
        self.now = 0.0
        self.trace: list[str] = []
        self.inbox: str | None = None  # the inbox the bridge subscribes now
        self.inboxes = 0
        self.server = OriginServer(
            config, lambda: self.now, lambda inbox: inbox == self.inbox, self._ack_arrives, self.log
        )
        self.agg = Aggregate(config.dedupe_window)
        self.to_server: deque[Up] = deque()  # pulls and acks on their way, in the order they were sent
        self.resync_op: RequestResync | None = None
        self.fetch_op: FetchOrigin | None = None
        self.verify_op: VerifyStored | None = None
        self.refused: set[int] = set()  # sequences one of whose publishes was refused or lost
        self.acks_sent = 0
        self.resyncs = 0
        # an operator re-created the consumer and the engine has not resynced since: its delivery sequences start
        # again at 1, so losing exactly the first ones makes a later one look like the next of the old consumer
        # (caught on a consumer of the whole stream; random runs with a filter do not lose deliveries meanwhile)
        self.renumbered = False
        self.life = 0
        # the consumer exists before the first message: setup creates it, and an Interest stream would not keep
        # what is published before
        self.server.create_consumer()
        for _ in range(min(config.published, config.n)):
            self.server.stream.publish(consumer_exists=True)
        self.engine = self._start_life()

    # -- helpers ------------------------------------------------------------------------------------------

    def log(self, line: str) -> None:
        self.trace.append(f"t={self.now:7.2f} {line}")

    def fail(self, message: str) -> None:
        tail = "\n".join(self.trace[-150:])
        raise InvariantViolation(f"{message}\n--- last simulation steps ---\n{tail}")

    def safe_prefix(self) -> int:
        """The highest origin sequence up to which every message of this source is in the aggregate."""
        for seq in self.server.stream.expected():
            if not self.agg.has(seq):
                return seq - 1
        return self.server.stream.last_seq

    def check(self) -> None:
        """(a) after a step: the consumer's ack floor and the engine's watermark claim nothing unstored."""
        safe = self.safe_prefix()
        consumer = self.server.consumer
        if consumer is not None and consumer.asflr > safe:
            self.fail(f"SAFETY: the consumer's ack floor {consumer.asflr} is above the stored prefix {safe}")
        if self.engine.watermark > safe:
            self.fail(f"SAFETY: the engine's watermark {self.engine.watermark} is above the stored prefix {safe}")

    def _ack_arrives(self, sseq: int) -> None:
        if not self.agg.has(sseq):
            self.fail(f"SAFETY: the server receives an ack of sseq {sseq}, which the aggregate does not hold")

    # -- the bridge process ---------------------------------------------------------------------------------

    def _start_life(self) -> PullEngine:
        """What ``SourceRunner._setup_once`` does: bind (creating the consumer if it is gone), recover, start."""
        self.life += 1
        consumer = self.server.consumer or self.server.create_consumer()
        result = self.recover(consumer.asflr)
        engine = PullEngine(pull_settings(self.config), self.now)
        self.engine = engine
        engine.consumer_bound(consumer.created)
        self.log(f"life {self.life}: recovered watermark={result.watermark} present={sorted(result.present)}")
        self.apply(
            engine.recovered(
                result.watermark,
                result.present,
                self.now,
                workqueue=self.config.retention == "workqueue",
                origin_last_seq=self.server.stream.last_seq,
            )
        )
        if engine.refusal is not None:
            self.fail(f"recovery refused: {engine.refusal}")
        self.apply(engine.target_limits(TargetLimits(max_payload=1024 * 1024), self.now))
        return engine

    def recover(self, floor: int) -> Recovery:
        """``SourceRunner._recover``: this source's copies above the ack floor (at most ``recovery_cap``, newest
        first), the chain anchored at the floor; a read cut short trusts its oldest copy."""
        above = sorted((c for c in self.agg.recovery_copies() if c.stream_seq > floor), key=lambda c: c.stream_seq)
        cap = self.config.recovery_cap or recovery_depth(self.config.publish_window)
        complete = len(above) <= cap
        self.log(f"recovery reads {min(len(above), cap)} copies above floor {floor} (complete: {complete})")
        return recover(above[-cap:], floor=floor, complete=complete)

    def crash(self, p: int) -> None:
        """The bridge dies and a new process starts. Bit 0 of ``p``: whether what it had written to the origin
        connection (acks, pulls) reached the server; the rest: how many of its publishes in flight reached the
        aggregate before the connection closed (the others are lost)."""
        self.log(f"CRASH p={p}")
        if p & 1:
            while self.to_server:
                self._server_takes(self.to_server.popleft())
        self.to_server.clear()
        self._close_target(p >> 1)
        self._end_life()

    def shutdown(self) -> None:
        """SIGTERM (``SourceRunner._shutdown``): stop, unsubscribe, let in-flight publishes be acked (their acks
        follow), flush, close; then a new process starts."""
        self.log("SIGTERM")
        self.apply(self.engine.begin_shutdown(self.now))
        self.inbox = None
        while self.agg.inbox:
            self.step_target()
        while self.agg.acks:
            self.step_publish_ack()
        if not self.engine.drained:
            self.fail("shutdown: publishes in flight although every one was answered")
        self.apply(self.engine.final_answer())
        while self.to_server:  # the flush before the connection closes
            self._server_takes(self.to_server.popleft())
        self._end_life()

    def _end_life(self) -> None:
        self.inbox = None  # the connection is gone, and its subscription with it
        self.server.outbound.clear()
        self.agg.acks.clear()
        self.resync_op = self.fetch_op = self.verify_op = None
        self._start_life()

    def _close_target(self, reached: int) -> None:
        """The target connection closes: the first ``reached`` publishes in flight were read by the server and are
        processed, the rest are lost; no ack comes back."""
        keep = reached % (len(self.agg.inbox) + 1)
        for i in range(len(self.agg.inbox)):
            life, publish = self.agg.inbox.popleft()
            if i < keep:
                self._store(life, publish)
            else:
                self.refused.add(publish.entry.stream_seq)
                self.log(f"target: publish of {publish.entry.stream_seq} lost with the connection")
        self.agg.acks.clear()

    # -- effects, as the runtime performs them --------------------------------------------------------------

    def apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case Publish():
                    self._on_publish(effect)
                case Ack():
                    self._on_ack(effect)
                case Pull():
                    if self.inbox is None:
                        self.log(f"pull {effect.batch} not sent: not subscribed")  # OriginUnavailable, dropped
                    else:
                        self.to_server.append(PullUp(self.inbox, effect))
                        self.log(f"bridge pulls {effect.batch} on {self.inbox}")
                case RequestResync():
                    self._on_resync(effect)
                case FetchOrigin():
                    if self.fetch_op is not None:
                        self.fail("a second FetchOrigin while one is outstanding")
                    self.fetch_op = effect
                    self.log(f"bridge fetches ({effect.after}, {effect.through}]")
                case VerifyStored():
                    if self.verify_op is not None:
                        self.fail("a second VerifyStored while one is outstanding")
                    self.verify_op = effect
                    self.log(f"bridge verifies {list(effect.stream_seqs)}")
                case ReadTargetLimits():
                    self.apply(self.engine.target_limits(TargetLimits(max_payload=1024 * 1024), self.now))
                case Notice():
                    self.log(f"notice {effect.event} {dict(effect.fields)}")
                case AnswerFlowControl() | ProbeStranded() | RequestReset() | ResizeWindow():
                    self.fail(f"a flow-control effect in pull mode: {effect}")
                case _:
                    assert_never(effect)

    def _on_publish(self, publish: Publish) -> None:
        entry = publish.entry
        message = entry.message
        if message is None:
            self.fail(f"Publish of a marker entry (seq {entry.stream_seq})")
            return
        if message.headers.get(hdr.MSG_ID) != hdr.msg_id(SOURCE, STREAM, entry.stream_seq):
            self.fail(f"seq {entry.stream_seq} published with Nats-Msg-Id {message.headers.get(hdr.MSG_ID)!r}")
        self.log(f"bridge publishes {entry.stream_seq} (attempt {publish.attempt})")
        self.agg.inbox.append((self.life, publish))

    def _on_ack(self, ack: Ack) -> None:
        for reply in ack.replies:
            sseq, _, _ = parse_ack_reply(reply)
            if not self.agg.has(sseq):
                self.fail(f"SAFETY: the engine acks sseq {sseq}, which the aggregate does not hold")
            self.to_server.append(AckUp(reply))
        self.acks_sent += len(ack.replies)
        self.log(f"bridge acks {[parse_ack_reply(r)[0] for r in ack.replies]}")

    def _on_resync(self, request: RequestResync) -> None:
        # SourceRunner._resync: the inbox is unsubscribed first; what is still on its way to it is dropped
        if self.resync_op is not None:
            self.fail("a second resync while one is in flight")
        self.log(f"bridge resyncs: {request.cause.value} #{request.attempt}")
        self.resync_op = request
        self.resyncs += 1
        self.inbox = None

    def _subscribe(self) -> None:
        self.inboxes += 1
        self.inbox = f"_INBOX.{self.inboxes}"

    # -- steps: the origin side -----------------------------------------------------------------------------

    def step_serve(self) -> bool:
        """The consumer delivers one message to a waiting request (if it has both)."""
        return self.server.deliver()

    def step_receive(self) -> bool:
        """The oldest message on its way from the server reaches the bridge."""
        if not self.server.outbound:
            return False
        inbox, subject, reply, headers, payload = self.server.outbound.popleft()
        if inbox != self.inbox:
            self.log(f"bridge drops a message for {inbox} (not subscribed)")
            return True
        message = classify(subject, reply, headers, payload)
        self.log(f"bridge receives {type(message).__name__} {reply or headers}")
        self.apply(self.engine.receive(message, self.now))
        return True

    def step_receive_many(self, k: int) -> bool:
        """Up to ``k`` messages from the server reach the bridge in one read: handed over together."""
        batch: list[Inbound] = []
        while self.server.outbound and len(batch) < k:
            inbox, subject, reply, headers, payload = self.server.outbound.popleft()
            if inbox != self.inbox:
                self.log(f"bridge drops a message for {inbox} (not subscribed)")
                continue
            batch.append(classify(subject, reply, headers, payload))
        if not batch:
            return False
        self.log(f"bridge receives {len(batch)} in one read: {[type(m).__name__ for m in batch]}")
        self.apply(self.engine.receive_many(batch, self.now))
        return True

    def step_publish_acks(self, k: int) -> bool:
        """The oldest ``k`` publish acks reach the bridge in one read, the stored ones handed over together."""
        stored: list[tuple[int, int]] = []
        for _ in range(min(k, len(self.agg.acks))):
            life, order, attempt, ok, error = self.agg.acks.popleft()
            if life != self.life:
                continue
            if ok:
                stored.append((order, attempt))
                continue
            if stored:
                self.apply(self.engine.publish_stored_many(stored, self.now))
                stored = []
            self.apply(self.engine.publish_failed(order, attempt, error, self.now))
        if stored:
            self.apply(self.engine.publish_stored_many(stored, self.now))
        return bool(stored)

    def step_drop(self, *, even_renumbered: bool = False) -> None:
        """The oldest message on its way to the bridge is lost (slow consumer, link trouble)."""
        if not self.server.outbound:
            return
        if self.renumbered and self.config.filters and not even_renumbered and self.server.outbound[0][2]:
            return  # see ``renumbered``
        self.log(f"LOST on the way to the bridge: {self.server.outbound.popleft()[1:3]}")

    def step_server_in(self) -> bool:
        """The oldest pull request or ack on its way reaches the server."""
        if not self.to_server:
            return False
        self._server_takes(self.to_server.popleft())
        return True

    def _server_takes(self, item: Up) -> None:
        match item:
            case AckUp():
                self.server.ack(item.reply)
            case PullUp():
                self.server.pull(item.inbox, item.request)

    def step_lose_up(self, kind: type[AckUp] | type[PullUp]) -> None:
        """The oldest ack (or pull request) on its way to the server is lost."""
        for i, item in enumerate(self.to_server):
            if isinstance(item, kind):
                del self.to_server[i]
                self.log(f"LOST on the way to the server: {item}")
                return

    def step_resync(self, ok: bool) -> None:
        """The runtime's resync task ends: bind, read the anchor (or fail), subscribe a new inbox."""
        if self.resync_op is None:
            return
        self.resync_op = None
        consumer = self.server.consumer
        if ok:
            consumer = consumer or self.server.create_consumer()  # bind re-creates a managed consumer
            last_dseq, last_sseq = consumer.delivered
            anchor = PullAnchor(
                last_dseq,
                last_sseq,
                created=consumer.created,
                ack_floor=consumer.asflr,
                filtered=bool(self.config.filters),
            )
            self.renumbered = False
            self.log(f"resync: anchor {anchor}")
            effects = self.engine.resynced(anchor, self.now)
        else:
            self.log("resync failed")
            effects = self.engine.reset_failed("consumer info timed out", self.now)
        self._subscribe()  # in `finally`: whatever the outcome
        self.apply(effects)

    def step_fetch(self, ok: bool) -> None:
        """The runtime reads the origin stream for ``FetchOrigin`` (or the read fails)."""
        op = self.fetch_op
        if op is None:
            return
        self.fetch_op = None
        if not ok:
            self.apply(self.engine.fetch_failed("stream unavailable", self.now))
            return
        stream = self.server.stream
        messages = [
            OriginMessage(seq, m.subject, m.headers, m.payload, timestamp_ns(seq))
            for seq, m in sorted(stream.messages.items())
            if op.after < seq <= op.through and stream.matches(m.subject)
        ]
        self.log(f"fetched {[m.seq for m in messages]}")
        self.apply(self.engine.fetched(messages, op.through, self.now))

    def step_delete_consumer(self) -> None:
        self.log("OPERATOR deletes the consumer")
        self.server.delete_consumer()

    def step_recreate_consumer(self) -> None:
        if self.server.consumer is None:
            self.log("OPERATOR re-creates the consumer")
            self.server.create_consumer()
            self.renumbered = True

    def step_server_restart(self, p: int) -> None:
        """The origin server restarts; the bridge's connection drops and comes back (a reconnect)."""
        self.log(f"SERVER RESTART p={p}")
        self.to_server.clear()
        self.server.restart(forget=p >> 1, restore_deleted=bool(p & 1))
        self.apply(self.engine.source_reconnected(self.now))

    def step_link_blip(self, requests_lost: bool) -> None:
        """The origin connection drops and comes back: whatever was on its way either way is lost, and the waiting
        pull requests too if the server noticed the inbox had no subscriber meanwhile (nats-py subscribes again)."""
        self.log(f"LINK BLIP (requests lost: {requests_lost})")
        self.to_server.clear()
        self.server.outbound.clear()
        if requests_lost and self.server.consumer is not None:
            self.server.consumer.waiting.clear()
        self.apply(self.engine.source_reconnected(self.now))

    def step_publish_more(self, k: int) -> None:
        for _ in range(min(k, self.config.n - self.server.stream.last_seq)):
            seq = self.server.stream.publish(consumer_exists=self.server.consumer is not None)
            self.log(f"origin: published {seq}")

    # -- steps: the aggregate side ----------------------------------------------------------------------------

    def step_target(self, refuse: bool = False) -> bool:
        """The aggregate handles the oldest publish: stores it (or finds it a duplicate), or refuses it."""
        if not self.agg.inbox:
            return False
        life, publish = self.agg.inbox.popleft()
        if refuse or self.agg.down:
            self.refused.add(publish.entry.stream_seq)
            self.log(f"target refuses {publish.entry.stream_seq}")
            self.agg.acks.append((life, publish.entry.order, publish.attempt, False, "no responders"))
            return True
        self._store(life, publish)
        self.agg.acks.append((life, publish.entry.order, publish.attempt, True, ""))
        return True

    def _store(self, life: int, publish: Publish) -> None:
        message = publish.entry.message
        assert message is not None
        headers = message.headers
        mid = headers[hdr.MSG_ID]
        stored_at = self.agg.ids.get(mid)
        if stored_at is not None and self.now - stored_at < self.config.dedupe_window:
            self.log(f"target: {mid} is a duplicate within the window")
            return
        prov = hdr.parse_provenance(headers)
        if prov is None or prov.source != SOURCE or prov.stream != STREAM:
            self.fail(f"a copy without this source's provenance: {headers}")
            return
        seq = prov.stream_seq
        if self.agg.count[seq]:
            self.fail(f"NO DUPLICATE: origin sequence {seq} stored a second time (life {life})")
        top = max((c.seq for c in self.agg.copies), default=0)
        if seq < top and seq not in self.refused:
            self.fail(f"ORDER: {seq} stored after {top} although no publish of {seq} was refused or lost")
        self.agg.copies.append(AggCopy(seq, prov.prev_seq, message.subject, headers, message.payload))
        self.agg.count[seq] += 1
        self.agg.ids[mid] = self.now
        self.log(f"target stores {seq} (prev {prov.prev_seq})")

    def step_publish_ack(self) -> bool:
        """The oldest publish ack reaches the bridge."""
        if not self.agg.acks:
            return False
        life, order, attempt, ok, error = self.agg.acks.popleft()
        if life != self.life:
            return True
        if ok:
            self.apply(self.engine.publish_stored(order, attempt, self.now))
        else:
            self.apply(self.engine.publish_failed(order, attempt, error, self.now))
        return True

    def step_verify(self, ok: bool) -> None:
        """The runtime reads the aggregate for ``VerifyStored``: after every publish sent before the read."""
        op = self.verify_op
        if op is None:
            return
        self.verify_op = None
        if not ok or self.agg.down:
            self.apply(self.engine.verify_failed("target unavailable", self.now))
            return
        while self.agg.inbox:  # one connection: the publishes sent before the read are handled first
            self.step_target()
        present = {seq for seq in op.stream_seqs if self.agg.has(seq)}
        self.log(f"verify finds {sorted(present)}")
        self.apply(self.engine.verified(op.generation, present, self.now))

    def step_target_down(self, down: bool) -> None:
        self.agg.down = down
        self.log(f"TARGET {'DOWN' if down else 'UP'}")

    def step_target_reconnect(self, reached: int) -> None:
        """The target connection is lost and back: part of what was in flight got there, no ack comes back."""
        self.log("TARGET CONNECTION lost and back")
        self._close_target(reached)
        self.apply(self.engine.target_reconnected(self.now))

    # -- time -------------------------------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Time passes: the server's timers and the engine's tick, every ``TIME_STEP`` at most."""
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + TIME_STEP)
            self.server.timers()
            self.apply(self.engine.tick(self.now))

    # -- healing ------------------------------------------------------------------------------------------------

    def drain(self) -> None:
        """Everything in flight arrives, the server delivers what it may, every outstanding operation succeeds."""
        for _ in range(100_000):
            moved = False
            if self.resync_op is not None:
                self.step_resync(True)
                moved = True
            if self.fetch_op is not None:
                self.step_fetch(True)
                moved = True
            if self.verify_op is not None:
                self.step_verify(True)
                moved = True
            moved = self.step_server_in() or moved
            moved = self.step_serve() or moved
            moved = self.step_receive() or moved
            moved = self.step_target() or moved
            moved = self.step_publish_ack() or moved
            if not moved:
                return
            self.check()
        self.fail("drain did not settle")

    def settled(self) -> bool:
        stream, consumer = self.server.stream, self.server.consumer
        return (
            self.engine.phase is Phase.RUNNING
            and self.engine.pipeline.empty
            and consumer is not None
            and not consumer.pending
            and all(self.agg.has(seq) for seq in stream.expected())
            and (stream.retention == "limits" or not stream.remaining_ours())
        )

    def heal_and_settle(self, max_seconds: float, *, operator_recreates: bool = False) -> float:
        """Stop every fault, publish what is left, and run healthily until settled; returns the seconds it took.

        ``operator_recreates``: an operator re-creates a consumer that is still deleted, rather than leaving it to
        the bridge's resync. The tests leave it to the bridge: it notices a deleted consumer even when no pull
        request waited (a 503 resyncs, and the resync's bind re-creates it; test_pull_properties.py's
        ``test_consumer_deleted_with_no_request_waiting_is_recreated``).
        """
        self.log("=== HEAL ===")
        self.agg.down = False
        if operator_recreates:
            self.step_recreate_consumer()
        self.step_publish_more(self.config.n)
        start = self.now
        held_back = 0.0
        while True:
            self.drain()
            self.check()
            if self.settled():
                return self.now - start
            held_back = max(held_back, self.server.held_back())
            if self.now - start > max_seconds + held_back:
                break
            self.advance(TIME_STEP)
        stream, consumer = self.server.stream, self.server.consumer
        self.fail(
            f"LIVENESS: not settled {max_seconds:g}s after healing: phase={self.engine.phase.value} "
            f"backlog={self.engine.pipeline.backlog} "
            f"pending={'no consumer' if consumer is None else sorted(consumer.pending)} "
            f"missing={[s for s in stream.expected() if not self.agg.has(s)]} left={stream.remaining_ours()}"
        )
        return self.now - start

    def check_final(self) -> None:
        """(d) every message of this source stored, intact; (e) none left in a WorkQueue or Interest origin."""
        stream = self.server.stream
        for seq in stream.expected():
            copies = [c for c in self.agg.copies if c.seq == seq]
            if len(copies) != 1:
                self.fail(f"FINAL: origin sequence {seq} has {len(copies)} copies")
                return
            origin = make_origin_message(seq)
            copy = copies[0]
            if copy.payload != origin.payload or copy.subject != hdr.aggregate_subject(origin.subject, "agg"):
                self.fail(f"FINAL: the copy of {seq} differs from the origin message")
            for name, value in (origin.headers or {}).items():
                if copy.headers.get(hdr.rename_reserved(name)) != value:
                    self.fail(f"FINAL: origin header {name} of {seq} not carried over")
        if stream.retention != "limits" and stream.remaining_ours():
            self.fail(f"FINAL: the {stream.retention} origin still holds {stream.remaining_ours()}")
