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
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from bridge.core.backoff import Backoff
from bridge.core.headers import parse_header_block
from bridge.core.subjects import SubjectSet


@dataclass(frozen=True, slots=True)
class TargetLimits:
    """What the target takes, as read from it: the server's ``max_payload``, and the aggregate stream's
    ``max_msg_size`` and subjects (``None`` where the stream could not be read)."""

    max_payload: int
    max_msg_size: int | None = None
    subjects: tuple[str, ...] | None = None

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


@dataclass(slots=True, init=False)  # per message: a written __init__ compiles (mypyc)
class Send:
    """Publish ``entry.message`` now; its ack comes back with ``(entry.order, attempt)``. It is also the engine's
    ``Publish`` effect (``bridge.core.effects``), handed on as the pipeline made it."""

    entry: Entry
    attempt: int

    def __init__(self, entry: Entry, attempt: int) -> None:
        self.entry = entry
        self.attempt = attempt


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
    size_limit: int = 0  # largest message the target accepts (0: unknown); larger ones are not sent at all
    subjects: SubjectSet = field(default_factory=lambda: SubjectSet(()))  # what the target stream captures
    barriers: int = 0  # messages sent alone because their subject did not look captured
    _barrier: Entry | None = None
    _unverified: int = 0  # generation of ambiguous failures not yet checked against the target (0: none)
    _generation: int = 0

    def limit(self, limits: TargetLimits) -> None:
        """Take the target's limits: larger messages are not sent, uncaptured subjects are sent alone."""
        self.size_limit = limits.size_limit
        if limits.subjects is not None:
            self.subjects = SubjectSet(limits.subjects)

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
            return out
        # the window is a span from the oldest message not yet stored, not a count of un-acked ones: a publish
        # whose ack is late (or lost) must not be overtaken by more than a window of copies
        window_end = self._entries[0].order + self.window
        captures, retry, fresh = self.subjects.captures, self._retry, self._fresh
        while self._barrier is None and (retry or fresh):
            queue = retry if retry else fresh
            entry = queue[0]
            if entry.order >= window_end:
                break
            message = entry.message
            assert message is not None
            barrier = not captures(message.subject)
            if barrier and self._in_flight:
                break  # let everything before it be acked first
            if queue is retry:
                retry.pop(0)
            else:
                fresh.popleft()
            limit = self.size_limit
            if (
                message.unsendable or (limit and len(message.header_block) + len(message.payload) > limit)
            ) and self._unsendable(entry, now):
                return out
            out.append(self._send(entry, now))
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

    def _send(self, entry: Entry, now: float) -> Send:
        entry.state = EntryState.SENT
        if entry.attempt:  # a retry: to the end of the in-flight order
            self._in_flight.pop(entry.order, None)
        entry.attempt += 1
        entry.deadline = now + self.ack_timeout
        self._in_flight[entry.order] = entry
        return Send(entry, entry.attempt)

    def entry(self, order: int) -> Entry | None:
        """The entry with this order token, while the pipeline still holds it (for metrics; never changes it)."""
        return self._by_order.get(order)

    def storing(self, tokens: Sequence[tuple[int, int]]) -> tuple[int, list[int]]:
        """What acks with these ``(order, attempt)`` tokens would newly store, for metrics (never changes anything):
        the payload bytes, and the origin store times (ns) of the messages that carry one. Duplicate acks and
        markers count nothing."""
        by_order = self._by_order
        stored = EntryState.STORED
        payload_bytes = 0
        origins: list[int] = []
        for order, _ in tokens:
            entry = by_order.get(order)
            if entry is None or entry.state is stored:
                continue
            message = entry.message
            if message is None:
                continue
            payload_bytes += len(message.payload)
            if message.origin_ns:
                origins.append(message.origin_ns)
        return payload_bytes, origins

    # -- outcomes -----------------------------------------------------------------------------------------

    def stored(self, order: int, attempt: int) -> bool:
        """The target stored (or already had) entry ``order``. Returns True when the watermark advanced."""
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
        self._in_flight.pop(order, None)
        was_probe = entry is self._probe
        if was_probe:
            self._probe = None
        if self._degraded and (was_probe or (self._probe is None and not self._retry)):
            # the earliest failed message got through: re-send the others in order, then resume
            self._degraded = False
            self._failures = 0
        return self._advance()

    def failed(self, order: int, attempt: int, reason: str, now: float) -> bool:
        """The current attempt of entry ``order`` failed. Returns True when this newly blocks the pipeline."""
        entry = self._by_order.get(order)
        if entry is None or entry.state is not EntryState.SENT or entry.attempt != attempt:
            return False
        return self._fail(entry, reason, now)

    def _fail(self, entry: Entry, reason: str, now: float, *, ambiguous: bool = False) -> bool:
        if ambiguous:
            # the message may be stored even though no ack said so (timeout, lost connection): re-sending it blind
            # would rely on the target's duplicate window, which a long outage outlasts
            self._generation += 1
            self._unverified = self._generation
        entry.state = EntryState.FAILED
        entry.last_error = reason
        if entry is self._barrier:
            self._barrier = None
        self._in_flight.pop(entry.order, None)
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
            self._fail(entry, f"no publish ack within {self.ack_timeout:g}s", now, ambiguous=True)
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
                self.stored(entry.order, entry.attempt)
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
        return advanced

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
