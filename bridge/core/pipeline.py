"""The ordered, pipelined publish window of one source and the stored watermark it proves.

Entries are kept in origin order. Up to ``window`` publishes are un-acked at once (never one await per message);
the watermark advances only over the contiguous prefix of entries the target acknowledged, so a fast ack for a
later message never vouches for an earlier one. A failed publish (error ack, ack timeout, connection loss) is
never skipped: the pipeline turns *degraded*, stops sending new entries, and after a backoff re-sends the
earliest failed entry alone as a probe, with the same ``Nats-Msg-Id``. When the probe is stored the remaining
failed entries are re-sent in order, then new ones resume. A message the target can never store therefore
blocks its source (and only its source), retried with backoff, reported by ``blocked``.

Each entry carries a per-attempt token (``order``, ``attempt``). An ack for any attempt proves the message stored
(a late success of an earlier attempt is still a success); a failure counts only for the current attempt.

Order across a stream leader move. Publishes pipelined on one connection are each judged alone: while the
aggregate's leadership moves, one can be refused (no responders, not leader) while those behind it are stored, and
its re-send lands after them. When the aggregate allows fast batch publishing (``allow_batched``, nats-server 2.14+)
a window goes out as one *batch* in gap-fail mode instead: the server stores a batch's members only as a contiguous
prefix, so a member refused or lost ends the batch and nothing after it is stored; the pipeline fails it and every
later member (they are re-sent, in order, in a new batch), and acks are cumulative per batch. A lone message with
nothing in flight is published plainly (a batch of one would cost a commit and a server-side batch); a batch starts
only when nothing is in flight, and is committed (end-of-batch, no message) as soon as nothing waits to be sent: the
server acks members every ``BATCH_FLOW`` at most, and the commit's ack settles the rest.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from bridge.core.backoff import Backoff
from bridge.core.budget import PublishBudget
from bridge.core.headers import parse_header_block
from bridge.core.histogram import LoopHistogram
from bridge.core.subjects import SubjectSet


@dataclass(frozen=True, slots=True)
class TargetLimits:
    """What the target takes, as read from it: the server's ``max_payload``, and the aggregate stream's
    ``max_msg_size``, subjects (``None`` where the stream could not be read) and whether it takes fast batches."""

    max_payload: int
    max_msg_size: int | None = None
    subjects: tuple[str, ...] | None = None
    batched: bool = False  # the stream allows fast batch publishing (``allow_batched``, nats-server 2.14+)

    @property
    def size_limit(self) -> int:
        """The largest message the target accepts (0: unknown)."""
        positive = [n for n in (self.max_payload, self.max_msg_size or 0) if n > 0]
        return min(positive) if positive else 0


@dataclass(slots=True, init=False)  # per message: a written __init__ compiles (mypyc)
class OutboundMessage:
    """One message to publish to the aggregate, its header block already encoded."""

    subject: str
    header_block: bytes
    payload: bytes
    origin_ns: int  # the origin's store time (also in the Bridge-Time header), for latency metrics
    # why this message must never be published ("": it may be); it then blocks its source, as one too large does
    unsendable: str

    def __init__(
        self, subject: str, header_block: bytes, payload: bytes, origin_ns: int = 0, unsendable: str = ""
    ) -> None:
        self.subject = subject
        self.header_block = header_block
        self.payload = payload
        self.origin_ns = origin_ns
        self.unsendable = unsendable

    @property
    def size(self) -> int:
        """What the server counts against ``max_msg_size``/``max_payload``: the header block plus the payload."""
        return len(self.header_block) + len(self.payload)

    @property
    def headers(self) -> dict[str, str]:
        """The headers, decoded (for inspection; the hot path never needs them)."""
        return parse_header_block(self.header_block)


class EntryState(Enum):
    QUEUED = "queued"
    SENT = "sent"
    FAILED = "failed"
    STORED = "stored"


@dataclass(slots=True, eq=False, init=False)  # per message: a written __init__ compiles (mypyc)
class Entry:
    """One origin message (or a marker with no message) travelling through the pipeline."""

    order: int
    stream_seq: int
    message: OutboundMessage | None
    state: EntryState
    attempt: int
    deadline: float
    last_error: str

    def __init__(
        self,
        order: int,
        stream_seq: int,
        message: OutboundMessage | None,
        state: EntryState,
        attempt: int = 0,
        deadline: float = 0.0,
        last_error: str = "",
    ) -> None:
        self.order = order
        self.stream_seq = stream_seq
        self.message = message
        self.state = state
        self.attempt = attempt
        self.deadline = deadline
        self.last_error = last_error

    def __lt__(self, other: Entry) -> bool:
        return self.order < other.order


# fast batch operations (the last token before ``$FI`` of a batch member's reply subject), nats-server 2.14+
BATCH_START = 0
BATCH_APPEND = 1
BATCH_COMMIT_EOB = 3  # commit what the batch holds; carries no message

BATCH_UNKNOWN = 10208  # err_code: the server holds no such batch (ended, cleaned up, or on another leader)
BATCH_TOO_MANY = 10211  # err_code: too many fast batches in flight on the stream (nats-server's limit: 1,000)
BATCH_DISABLED = 10205  # err_code: the stream does not allow batched publishes (any more)
PLAIN_AFTER_TOO_MANY = 10.0  # seconds of plain publishes after the server refused a batch for its in-flight limit
# members per flow ack the pipeline allows the server (it starts lower and ramps up, sharing 500 among a stream's
# open batches): one ack per 16 stored messages instead of one each; kept well inside the window, whose tail only
# the commit acks
BATCH_FLOW = 16


@dataclass(slots=True, init=False)  # per message: a written __init__ compiles (mypyc)
class Send:
    """Publish ``entry.message`` now; its ack comes back with ``(entry.order, attempt)``. It is also the engine's
    ``Publish`` effect (``bridge.core.effects``), handed on as the pipeline made it.

    ``batch`` is 0 for a plain publish; otherwise the message is member ``bseq`` of the pipeline's fast batch
    ``batch``, acked by the server every ``flow`` members at most, with operation ``op`` (``BATCH_START``,
    ``BATCH_APPEND``, or ``BATCH_COMMIT_EOB``: then no message is sent, ``entry`` is only the batch's last member, for
    its subject)."""

    entry: Entry
    attempt: int
    batch: int
    bseq: int
    op: int
    flow: int  # the most members per flow ack the server may use (the reply subject's flow token)

    def __init__(self, entry: Entry, attempt: int, batch: int = 0, bseq: int = 0, op: int = 0, flow: int = 0) -> None:
        self.entry = entry
        self.attempt = attempt
        self.batch = batch
        self.bseq = bseq
        self.op = op
        self.flow = flow


@dataclass(slots=True, init=False)  # per message: a written __init__ compiles (mypyc)
class AckOutcome:
    """What the target answered to one publish attempt (``batch`` 0), or about a fast batch's members.

    A batch reply names the member whose reply subject it came on (``order``, ``attempt``, ``bseq``) and says
    that members ``1..through`` are stored (cumulative), or (``stored`` False) that member ``bseq`` was refused or
    lost, and so, in gap-fail mode, is every member after it. ``ended``: the server ended the batch (committed it),
    nothing after ``through`` will be stored. ``code`` is the server's ``err_code`` (0: none)."""

    order: int
    attempt: int
    stored: bool
    duplicate: bool
    error: str
    batch: int
    bseq: int
    through: int
    ended: bool
    code: int

    def __init__(
        self,
        order: int,
        attempt: int,
        stored: bool,
        duplicate: bool = False,
        error: str = "",
        batch: int = 0,
        bseq: int = 0,
        through: int = 0,
        ended: bool = False,
        code: int = 0,
    ) -> None:
        self.order = order
        self.attempt = attempt
        self.stored = stored
        self.duplicate = duplicate
        self.error = error
        self.batch = batch
        self.bseq = bseq
        self.through = through
        self.ended = ended
        self.code = code


@dataclass(slots=True, eq=False)
class Batch:
    """A fast batch this pipeline published: its members as ``(entry, attempt)`` by batch sequence - 1."""

    number: int
    members: list[tuple[Entry, int]] = field(default_factory=list)
    acked: int = 0  # members 1..acked are known stored
    failed_from: int = 0  # members from this one on are known not stored (0: none)
    closed: bool = False  # no member is added any more (committed, ended by a failure, or the pipeline degraded)

    @property
    def settled(self) -> bool:
        """Every member is known stored or failed: replies about it change nothing more."""
        return self.acked >= (self.failed_from - 1 if self.failed_from else len(self.members))


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why the pipeline is not moving: the earliest failed entry, since when, and what the target said."""

    stream_seq: int
    since: float
    reason: str
    attempts: int


@dataclass
class PublishPipeline:
    """Pipelined publishing with an in-order stored watermark. Pure: time is passed in."""

    window: int
    ack_timeout: float
    retry: Backoff
    watermark: int = 0

    _entries: deque[Entry] = field(default_factory=deque)
    _fresh: deque[Entry] = field(default_factory=deque)
    _retry: list[Entry] = field(default_factory=list)
    _by_order: dict[int, Entry] = field(default_factory=dict)
    _in_flight: OrderedDict[int, Entry] = field(default_factory=OrderedDict)
    _next_order: int = 1
    _degraded: bool = False
    _probe: Entry | None = None
    _retry_at: float = 0.0
    _failures: int = 0
    _blocked_since: float = 0.0
    stored_messages: int = 0
    stored_bytes: int = 0  # payload bytes of the messages stored (``account_stored``)
    last_stored_origin_ns: int = 0  # the latest origin store time (ns) among them (0: none carried one)
    size_limit: int = 0  # largest message the target accepts (0: unknown); larger ones are not sent at all
    subjects: SubjectSet = field(default_factory=lambda: SubjectSet(()))  # what the target stream captures
    barriers: int = 0  # messages sent alone because their subject did not look captured
    _barrier: Entry | None = None
    _unverified: int = 0  # generation of ambiguous failures not yet checked against the target (0: none)
    _generation: int = 0
    batching: bool = False  # windows go out as fast batches (the target stream allows them)
    batches: int = 0  # fast batches opened
    batch_fallbacks: int = 0  # batches the server refused and publishing turned plain for (BATCH_TOO_MANY/DISABLED)
    _batch: Batch | None = None  # the open batch, taking members
    _batches: dict[int, Batch] = field(default_factory=dict)  # batches whose members may still get replies
    _commit: Send | None = None  # an end-of-batch for a batch closed early, to go out with the next sends
    _plain_until: float = 0.0  # the server refused a batch for its in-flight limit: plain publishes until then
    # the process's publishes in flight across every source (``share_budget``; None: this pipeline's window only)
    _budget: PublishBudget | None = None
    _budget_key: str = ""

    def share_budget(self, budget: PublishBudget, key: str) -> None:
        """Count this pipeline's publishes in flight in ``budget`` (as source ``key``) and send none beyond its room:
        what does not fit waits, unsent, until ``budget`` wakes ``key`` (the engine's ``publishes_freed``)."""
        self._budget = budget
        self._budget_key = key
        budget.take(len(self._in_flight))
        budget.batches += len(self._batches)

    def leave_budget(self) -> None:
        """The source is gone: what it had in flight no longer counts, and it is not woken."""
        budget = self._budget
        if budget is not None:
            budget.give(len(self._in_flight))
            budget.batch_ended(len(self._batches))
            budget.forget(self._budget_key)
            self._budget = None

    def limit(self, limits: TargetLimits) -> None:
        """Take the target's limits: larger messages are not sent, uncaptured subjects are sent alone, windows go
        out as fast batches where the stream allows them."""
        self.size_limit = limits.size_limit
        if limits.subjects is not None:
            self.subjects = SubjectSet(limits.subjects)
        self.batching = limits.batched

    # -- feeding --------------------------------------------------------------------------------------------

    def add(self, stream_seq: int, message: OutboundMessage) -> None:
        """Queue an origin message for publishing (after every entry already queued)."""
        entry = Entry(self._next_order, stream_seq, message, EntryState.QUEUED)
        self._next_order += 1
        self._entries.append(entry)
        self._fresh.append(entry)
        self._by_order[entry.order] = entry

    def add_stored(self, stream_seq: int) -> bool:
        """Record ``stream_seq`` as already in the target (found there at recovery, or skipped by a forward reset).

        Returns True when the watermark advanced.
        """
        entry = Entry(self._next_order, stream_seq, None, EntryState.STORED)
        self._next_order += 1
        self._entries.append(entry)
        return self._advance()

    # -- sending ------------------------------------------------------------------------------------------

    def take_sendable(self, now: float) -> list[Send]:
        """Entries to publish now, in order, respecting the window and the degraded-mode probe.

        An entry larger than ``size_limit`` is failed without being sent, and nothing after it is sent: a message
        the target must refuse would otherwise let the ones behind it be stored first.
        """
        out: list[Send] = []
        self._take_commit(out)
        if self._degraded:
            if self._unverified:
                return out  # an ambiguous failure must be checked against the target before anything is re-sent
            if self._probe is None and self._retry and now >= self._retry_at:
                if self._in_flight and min(self._in_flight) < self._retry[0].order:
                    # an earlier publish is still unresolved (e.g. sent just before the connection died): if it
                    # turns out lost, a probe sent now would have overtaken it. Its ack, its timeout or the
                    # reconnect decides first; then the earliest failed entry is the probe.
                    return out
                self._probe = self._retry.pop(0)
                if self._unsendable(self._probe, now):
                    return out
                out.append(self._send(self._probe, now))
            return out
        if not (self._retry or self._fresh):
            if self._batch is not None:
                # nothing waits: commit it (its publish ack settles the members no flow ack covered yet); what comes
                # next waits for it (a new batch never starts while a member of the old one is unresolved)
                self._close_batch()
                self._take_commit(out)
            return out
        # the window is a span from the oldest message not yet stored, not a count of un-acked ones: a publish
        # whose ack is late (or lost) must not be overtaken by more than a window of copies
        window_end = self._entries[0].order + self.window
        captures, retry, fresh = self.subjects.captures, self._retry, self._fresh
        budget = self._budget
        # no batch open and the process holds its most: plain publishes, pipelined, until a batch may open again
        batching = self.batched(now) and (self._batch is not None or budget is None or budget.batch_room)
        while self._barrier is None and (retry or fresh):
            queue = retry if retry else fresh
            entry = queue[0]
            if entry.order >= window_end:
                break
            if budget is not None and not budget.admits(self._budget_key):
                budget.wait(self._budget_key)  # woken once acks free room, in turn (publishes_freed)
                if self._batch is not None:
                    # committed now: the server acks a batch's last members only at its commit, and that room is
                    # what this source (and every other) waits for
                    self._close_batch()
                    self._take_commit(out)
                break
            message = entry.message
            assert message is not None
            barrier = not captures(message.subject)
            if barrier and self._in_flight:
                break  # let everything before it be acked first
            batch = self._batch
            if barrier and batch is not None:
                self._close_batch()  # everything it carried is stored; the barrier goes alone
                self._take_commit(out)
                batch = None
            elif batching and batch is None and not barrier:
                if self._in_flight:
                    break  # a batch started now could be stored before an unresolved plain publish is refused
                if len(retry) + len(fresh) > 1 and entry.order + 1 < window_end:
                    batch = self._open_batch()
            if queue is retry:
                retry.pop(0)
            else:
                fresh.popleft()
            limit = self.size_limit
            if (
                message.unsendable or (limit and len(message.header_block) + len(message.payload) > limit)
            ) and self._unsendable(entry, now):
                return out
            out.append(self._send(entry, now, batch))
            if barrier:
                # it may well be refused (no stream captures it): nothing after it goes out until it is stored,
                # so a refusal cannot let later messages overtake it. If the guess was wrong (an account mapping
                # or transform captures it after all) this cost one round trip.
                self._barrier = entry
                self.barriers += 1
        return out

    def _unsendable(self, entry: Entry, now: float) -> bool:
        """Fail ``entry`` instead of sending it when it must never be published, or the target cannot take it:
        the pipeline blocks on it (probed again with backoff, reported by ``blocked``), nothing after it goes."""
        assert entry.message is not None
        if entry.message.unsendable:
            self._fail(entry, entry.message.unsendable, now)
            return True
        size = entry.message.size
        if not self.size_limit or size <= self.size_limit:
            return False
        self._fail(entry, f"message of {size} bytes exceeds the target's limit of {self.size_limit} bytes", now)
        return True

    def _send(self, entry: Entry, now: float, batch: Batch | None = None) -> Send:
        entry.state = EntryState.SENT
        if entry.attempt:  # a retry: to the end of the in-flight order
            self._landed(entry.order, None)
        entry.attempt += 1
        entry.deadline = now + self.ack_timeout
        self._in_flight[entry.order] = entry
        budget = self._budget
        if budget is not None:
            budget.take()
        if batch is None:
            return Send(entry, entry.attempt)
        batch.members.append((entry, entry.attempt))
        bseq = len(batch.members)
        op = BATCH_START if bseq == 1 else BATCH_APPEND
        return Send(entry, entry.attempt, batch.number, bseq, op, self.batch_flow)

    def _landed(self, order: int, answered: float | None) -> None:
        """Entry ``order`` is no longer in flight (stored, failed, or sent again): the hub ``answered`` it then (an
        ack, a refusal, the ack timeout), or nothing was learnt of it (None: the connection was lost)."""
        entry = self._in_flight.pop(order, None)
        budget = self._budget
        if entry is not None and budget is not None:
            if answered is None:
                budget.give()
            else:
                budget.answered(entry.deadline - self.ack_timeout, answered)

    # -- fast batches -------------------------------------------------------------------------------------

    def _open_batch(self) -> Batch:
        if self._budget is not None:
            self._budget.batch_opened()
        self.batches += 1
        batch = Batch(self.batches)
        self._batch = batch
        self._batches[batch.number] = batch
        return batch

    def _close_batch(self) -> None:
        """Close the open batch: no member is added any more; its end-of-batch commit (no message: the server commits
        what it stored and frees the batch rather than holding it until its idle timeout) goes out with the next
        sends (none when nothing was sent in it)."""
        batch = self._batch
        assert batch is not None
        self._batch = None
        batch.closed = True
        if batch.settled:
            self._drop_batch(batch.number)
        if batch.members:
            last, attempt = batch.members[-1]
            self._commit = Send(last, attempt, batch.number, len(batch.members) + 1, BATCH_COMMIT_EOB, self.batch_flow)

    def commit_open(self) -> list[Send]:
        """For a stop (nothing more will be sent): close the open batch and return its commit with any pending one,
        so that the members no flow ack covered yet are acked by the commit rather than timed out."""
        if self._batch is not None:
            self._close_batch()
        out: list[Send] = []
        self._take_commit(out)
        return out

    def batched(self, now: float) -> bool:
        """Whether a window goes out as a fast batch now (the target allows them and no refusal paused them)."""
        return self.batching and now >= self._plain_until

    def _take_commit(self, out: list[Send]) -> None:
        """Append the pending end-of-batch commit, if any, to ``out``."""
        if self._commit is not None:
            out.append(self._commit)
            self._commit = None

    @property
    def batch_flow(self) -> int:
        """Members per flow ack the server may use: ``BATCH_FLOW``, at most a quarter of the window (the members no
        flow ack covers yet must leave room to send more)."""
        return max(1, min(BATCH_FLOW, self.window // 4))

    def expand(self, outcomes: Sequence[AckOutcome], now: float) -> Sequence[AckOutcome]:
        """The outcomes of one read with each batch reply turned into one outcome per member it settles, in
        order: the stored ones (``through``), then the refused member and every later one (gap-fail: none of them
        is stored). Plain outcomes pass as they are (the common read: the same sequence back). Replies about a
        batch no longer held (every member settled) are dropped. Changes only the batches' bookkeeping."""
        for outcome in outcomes:
            if outcome.batch:
                break
        else:
            return outcomes
        out: list[AckOutcome] = []
        for outcome in outcomes:
            if not outcome.batch:
                out.append(outcome)
                continue
            if outcome.code == BATCH_TOO_MANY:
                self._plain_until = now + PLAIN_AFTER_TOO_MANY
                self.batch_fallbacks += 1
            elif outcome.code == BATCH_DISABLED:
                self.batching = False  # until the limits are read again (while degraded, they are)
                self.batch_fallbacks += 1
            batch = self._batches.get(outcome.batch)
            if batch is None:
                continue
            members = batch.members
            through = min(outcome.through, len(members))
            if through > batch.acked:
                if through == batch.acked + 1 and outcome.stored and outcome.bseq == through:
                    out.append(outcome)  # the common ack: the member it came for, and no other (no new outcome)
                else:
                    # a member failed before (a gap report) and stored after all is a late success, like any other
                    for entry, attempt in members[batch.acked : through]:
                        out.append(AckOutcome(entry.order, attempt, True))
                batch.acked = through
            first = 0  # the first member that will not be stored (0: none said)
            if not outcome.stored:
                first = outcome.bseq
                reason = outcome.error
            elif outcome.ended and through < len(members):
                first = through + 1
                reason = f"the server ended the batch after member {through}"
            if first:
                end = batch.failed_from - 1 if batch.failed_from else len(members)  # past it: failed already
                for bseq in range(max(first, batch.acked + 1), end + 1):
                    entry, attempt = members[bseq - 1]
                    why = reason if bseq == first else f"not stored: member {first} before it was not ({reason})"
                    out.append(AckOutcome(entry.order, attempt, False, error=why))
                batch.failed_from = min(first, batch.failed_from or first)
                if batch is self._batch:
                    # nothing more can be stored in it; committed all the same, as the server may still hold it
                    # (a member lost on its way ends it only when the next one arrives)
                    self._close_batch()
            if batch.closed and batch.settled:
                self._drop_batch(batch.number)
        return out

    @property
    def batch_open(self) -> bool:
        """A fast batch is taking members."""
        return self._batch is not None

    def entry(self, order: int) -> Entry | None:
        """The entry with this order token, while the pipeline still holds it (for metrics; never changes it)."""
        return self._by_order.get(order)

    def account_stored(self, tokens: Sequence[tuple[int, int]], now_ns: int, latency: LoopHistogram | None) -> None:
        """Count what acks with these ``(order, attempt)`` tokens will newly store, before they are taken (for
        metrics; no entry is changed): their payload bytes (``stored_bytes``), the latest origin
        store time (``last_stored_origin_ns``), and into ``latency`` each one's age at ``now_ns`` (wall clock).
        Duplicate acks and markers count nothing."""
        by_order = self._by_order
        stored = EntryState.STORED
        payload_bytes = 0
        last = self.last_stored_origin_ns
        for order, _ in tokens:
            entry = by_order.get(order)
            if entry is None or entry.state is stored:
                continue
            message = entry.message
            if message is None:
                continue
            payload_bytes += len(message.payload)
            origin = message.origin_ns
            if origin:
                if origin > last:
                    last = origin
                if latency is not None:
                    latency.observe_age(origin, now_ns)
        self.stored_bytes += payload_bytes
        self.last_stored_origin_ns = last

    # -- outcomes -----------------------------------------------------------------------------------------

    def stored(self, order: int, attempt: int, now: float | None) -> bool:
        """The target stored (or already had) entry ``order``: its ack was read at ``now`` (None: found otherwise,
        by a read of the target). Returns True when the watermark advanced."""
        entry = self._by_order.get(order)
        if entry is None or entry.state is EntryState.STORED:
            return False
        if entry.state is EntryState.FAILED:
            # a late success of an earlier attempt: stored all the same, no longer to retry
            i = bisect.bisect_left(self._retry, entry)
            if i < len(self._retry) and self._retry[i] is entry:
                del self._retry[i]
        entry.state = EntryState.STORED
        self.stored_messages += 1
        if entry is self._barrier:
            self._barrier = None
        self._landed(order, now)
        was_probe = entry is self._probe
        if was_probe:
            self._probe = None
        if self._degraded and (was_probe or (self._probe is None and not self._retry)):
            # the earliest failed message got through: re-send the others in order, then resume
            self._degraded = False
            self._failures = 0
        if self._unverified and not self._retry and not self._in_flight:
            # a late ack settled the last entry whose fate was unknown: no read of the target is left to do (kept,
            # it would go out empty, from a quiet engine, at a tick its tick deadline had said nothing was due)
            self._unverified = 0
        return self._advance()

    def failed(self, order: int, attempt: int, reason: str, now: float) -> bool:
        """The current attempt of entry ``order`` failed. Returns True when this newly blocks the pipeline."""
        entry = self._by_order.get(order)
        if entry is None or entry.state is not EntryState.SENT or entry.attempt != attempt:
            return False
        return self._fail(entry, reason, now, answered=True)

    def _fail(self, entry: Entry, reason: str, now: float, *, ambiguous: bool = False, answered: bool = False) -> bool:
        if ambiguous:
            # the message may be stored even though no ack said so (timeout, lost connection): re-sending it blind
            # would rely on the target's duplicate window, which a long outage outlasts
            self._generation += 1
            self._unverified = self._generation
        entry.state = EntryState.FAILED
        entry.last_error = reason
        if self._batch is not None:
            # what follows a failure goes in a new batch, after the probe: the server may already have ended this
            # one, and its commit frees it there either way
            self._close_batch()
        if entry is self._barrier:
            self._barrier = None
        self._landed(entry.order, now if answered else None)
        bisect.insort(self._retry, entry)
        newly = not self._degraded
        if entry is self._probe or newly:
            # a failed probe (or the first failure) sets the next probe time; failures of messages sent
            # before the pipeline degraded do not push it further
            self._probe = None
            self._failures += 1
            self._retry_at = now + self.retry.delay(self._failures)
        if newly:
            self._degraded = True
            self._blocked_since = now
        return newly

    def expire(self, now: float) -> list[Entry]:
        """Fail every sent entry whose ack is overdue; returns them."""
        expired: list[Entry] = []
        while self._in_flight:
            entry = next(iter(self._in_flight.values()))
            if entry.deadline > now:
                break
            expired.append(entry)
            self._fail(entry, f"no publish ack within {self.ack_timeout:g}s", now, ambiguous=True, answered=True)
        return expired

    def fail_in_flight(self, reason: str, now: float) -> int:
        """Every sent entry is presumed failed (e.g. the target connection was lost). Returns how many."""
        entries = list(self._in_flight.values())
        for entry in entries:
            self._fail(entry, reason, now, ambiguous=True)
        return len(entries)

    @property
    def unverified(self) -> int:
        """Non-zero (a generation number) while ambiguous failures wait to be checked against the target."""
        return self._unverified

    def unverified_seqs(self) -> list[int]:
        """Origin sequences whose fate must be looked up in the target: every failed or in-flight entry."""
        return [e.stream_seq for e in self._entries if e.state in (EntryState.FAILED, EntryState.SENT)]

    def verified(self, generation: int, present: set[int] | frozenset[int]) -> bool:
        """The target was read after the ambiguous failures of ``generation``: entries in ``present`` are stored.

        Returns True when the watermark advanced. Failed entries not present are re-sent (same ``Nats-Msg-Id``).
        """
        before = self.watermark
        for entry in list(self._retry) + list(self._in_flight.values()):
            if entry.stream_seq in present:
                self.stored(entry.order, entry.attempt, None)
        if generation == self._unverified:
            self._unverified = 0
            self._retry_at = 0.0  # the target answered the read: probe now
        if self._degraded and self._probe is None and not self._retry:
            self._degraded = False
            self._failures = 0
        self._advance()
        return self.watermark > before

    def retry_now(self) -> None:
        """Bring the next probe forward (the target is back); the backoff level is kept."""
        self._retry_at = 0.0

    # -- watermark ----------------------------------------------------------------------------------------

    def _advance(self) -> bool:
        advanced = False
        entries = self._entries
        while entries and entries[0].state is EntryState.STORED:
            entry = entries.popleft()
            self._by_order.pop(entry.order, None)
            if entry.stream_seq > self.watermark:
                self.watermark = entry.stream_seq
                advanced = True
        if advanced and self._batches:
            self._forget_batches()
        return advanced

    def _forget_batches(self) -> None:
        """Drop closed batches whose members are all stored and gone (a member failed without a reply, then stored
        by another attempt, leaves its batch unsettled)."""
        head = self._entries[0].order if self._entries else self._next_order
        for number in list(self._batches):
            batch = self._batches[number]
            if not batch.closed or batch.members[-1][0].order >= head:
                break
            self._drop_batch(number)

    def _drop_batch(self, number: int) -> None:
        """Batch ``number`` is over: nothing more is heard of it, and the process may open another."""
        if self._batches.pop(number, None) is not None and self._budget is not None:
            self._budget.batch_ended()

    # -- views --------------------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def __len__(self) -> int:
        """Entries held (not yet popped off the stored prefix): what pull mode counts against its capacity."""
        return len(self._entries)

    @property
    def oldest_unstored_origin_ns(self) -> int:
        """The origin store time (ns) of the oldest message not yet stored; 0 when every entry is stored (the
        stored prefix is popped, so it is the first entry held)."""
        entries = self._entries
        if not entries:
            return 0
        head = entries[0]
        return head.message.origin_ns if head.message is not None and head.state is not EntryState.STORED else 0

    @property
    def backlog(self) -> int:
        """Entries not yet stored (queued, sent or failed)."""
        return sum(1 for e in self._entries if e.state is not EntryState.STORED)

    @property
    def empty(self) -> bool:
        return not self._entries

    @property
    def failures(self) -> int:
        """Consecutive failed attempts of the message blocking the pipeline (0 while it flows)."""
        return self._failures

    @property
    def degraded(self) -> bool:
        return self._degraded

    @property
    def blocked(self) -> Blocked | None:
        """The reason the pipeline is blocked, or None while it flows."""
        if not self._degraded:
            return None
        head = self._probe if self._probe is not None else (self._retry[0] if self._retry else None)
        if head is None:
            return None
        return Blocked(head.stream_seq, self._blocked_since, head.last_error, self._failures)

    @property
    def awaiting_acks(self) -> bool:
        """Publishes are in flight and nothing else waits: nothing queued, retried, batched, blocked or to verify,
        so nothing is due before the first ack deadline (``next_deadline``) but what the acks bring (inputs)."""
        return bool(self._in_flight) and not (
            self._fresh
            or self._retry
            or self._degraded
            or self._unverified
            or self._batch is not None
            or self._commit is not None
            or self._barrier is not None
        )

    def next_deadline(self) -> float | None:
        """The earliest time ``take_sendable`` or ``expire`` has something to do."""
        times = []
        if self._in_flight:
            times.append(next(iter(self._in_flight.values())).deadline)
        if self._degraded and self._probe is None and self._retry:
            times.append(self._retry_at)
        return min(times) if times else None

    def __iter__(self) -> Iterator[Entry]:
        """The entries not yet popped off the stored prefix, oldest first (for inspection and tests)."""
        return iter(self._entries)
