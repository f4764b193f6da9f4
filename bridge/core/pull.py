"""Pull mode: the same replication over a durable pull consumer with explicit acks (origins before 2.14).

nats-server before 2.14 has no ``ack_policy: flow_control`` and no ``CONSUMER.RESET``. ``PullEngine`` reads a
pull consumer with ``ack_policy: explicit`` (WorkQueue streams accept no other) by the continuous-consume algorithm
of the simplified client API (ADR-37): it keeps pull requests outstanding for at most ``pull_capacity`` messages
minus what is already unstored (``PullCredits``), refilling once half of it is free, each request with
``expires`` and idle heartbeats. Over a far link that capacity grows as a flow-control window does
(``bridge.core.window``), and the consumer's ``max_ack_pending`` with it. What the pipeline has not stored is never
asked for beyond that, so a target outage stops the pulls: the server sends nothing, redeliveries included, while
nobody asks.

How each of the promises is kept (docs/design.md, "Pull mode"):

1. **Safety.** An explicit ack names exactly one message. ``AckLedger`` holds the ack subject of each message
   taken and releases it only once the watermark (the contiguous prefix of publish acks) covers that message, so
   no ack ever names a message the aggregate does not hold.
2. **No duplicates.** The same ``accepted`` check as flow-control mode: a delivery at or below it is dropped. A
   redelivery (the ack wait expired, the bridge restarted, the server restarted and lost an ack) of a stored
   message is acked again at once; of a message still in flight, once it is stored.
3. **Order.** An *epoch* starts at a resync, anchored at the consumer's last delivery ``(dseq, sseq)``
   (``CONSUMER.INFO``): every message the consumer delivered up to ``sseq`` that the bridge has not taken is read
   from the origin stream itself and taken first, in order (``FetchOrigin``; the FILLING phase). From then on,
   every delivery must carry the next delivery sequence; a first delivery then is the stream's next message for
   this consumer, and nothing the consumer has pending is above ``accepted``, so a redelivery above it means
   someone else moved the consumer: a discontinuity.
4. **Liveness.** A delivery-sequence jump or rewind, a heartbeat naming another last delivery, silence while a
   request is outstanding, ``409 Consumer Deleted``, an origin reconnect: a resync (throttled and backed off by
   the same scheduler as flow-control resets). The messages lost in transit are still pending on the server; the
   resync reads them from the stream instead of waiting out ``ack_wait``, and their redeliveries are dropped and
   acked.
5. **Shutdown.** No new pulls; acks for everything stored before the connection closes.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from bridge.core.effects import (
    Ack,
    Effect,
    FetchOrigin,
    Notice,
    OriginMessage,
    Pull,
    PullAnchor,
    RequestReset,
    RequestResync,
    ResetCause,
    ResizeWindow,
)
from bridge.core.inbound import Data, FlowControlRequest, Heartbeat, Inbound, PullStatus, Unrecognised
from bridge.core.modes import Mode
from bridge.core.phases import Event
from bridge.core.replication import EngineSettings, Replication
from bridge.core.window import PullWindow, WindowBudget

__all__ = ["AckLedger", "PullCredits", "PullEngine", "pull_heartbeat"]

# statuses that end a pull request and say what it had left: the request is simply replaced
_REQUEST_ENDED = frozenset({404, 408})
_EXPIRY_GRACE = 2.0  # seconds past a request's expiry after which its unanswered remainder is written off
# a server with leaf nodes or gateways serves a waiting request whose reply subject lost interest for this long
# after it received it (nats-server defaultGatewayRecentSubExpiration), delivering to nobody (docs/protocol.md 10)
REQUEST_INTEREST_GRACE = 2.0


def pull_heartbeat(silence_timeout: float) -> float:
    """The idle heartbeat asked of every pull request: half the silence that counts as a lost link (ADR-37: at
    least 0.5 s, at most 30 s), so one missed heartbeat is not yet silence."""
    return min(30.0, max(0.5, silence_timeout / 2))


class AckLedger:
    """The ack subjects of messages taken but not yet acked, in origin order; released as the watermark passes.

    A message read from the origin stream by a resync has no ack subject yet: it is acked when the consumer
    redelivers it (as a duplicate, at or below the watermark by then).
    """

    __slots__ = ("_order", "_replies", "acked", "acked_stream_seq")

    def __init__(self) -> None:
        self._order: deque[int] = deque()  # origin sequences taken, ascending
        self._replies: dict[int, str] = {}  # origin sequence -> newest ack subject seen for it
        self.acked = 0
        self.acked_stream_seq = 0  # the highest origin sequence any ack of this process named

    def __len__(self) -> int:
        return len(self._order)

    def taken(self, sseq: int, reply: str | None) -> None:
        """``sseq`` was taken (the newest taken so far); ``reply`` acks it once it is stored."""
        self._order.append(sseq)
        if reply:
            self._replies[sseq] = reply

    def redelivered(self, sseq: int, reply: str) -> None:
        """A redelivery of ``sseq``, taken earlier and not stored yet: ack it with this subject once stored."""
        if reply:
            self._replies[sseq] = reply

    def covered(self, watermark: int) -> tuple[str, ...]:
        """The ack subjects of every message at or below ``watermark`` (each released once)."""
        order, replies = self._order, self._replies
        out: list[str] = []
        while order and order[0] <= watermark:
            reply = replies.pop(order.popleft(), None)
            if reply is not None:
                out.append(reply)
        return self.sent(out, watermark) if out else ()

    def sent(self, replies: list[str], through: int) -> tuple[str, ...]:
        """Count ``replies`` as acks naming messages up to ``through`` (all stored)."""
        self.acked += len(replies)
        if through > self.acked_stream_seq:
            self.acked_stream_seq = through
        return tuple(replies)


class Pacing:
    """``sources[].rate_limit`` in pull mode, where the server has no rate limit: the bytes delivered are paid for
    at ``rate`` bytes per second (``free_at``: when the last of them is), and a request is sent only once they are,
    asking for about a second's worth of messages of the average size seen. The average rate stays at the limit;
    a request's own messages may come faster (one second's worth at most)."""

    __slots__ = ("average", "free_at", "rate")

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.free_at = 0.0
        self.average = 0.0  # bytes per message, moving average (0: none seen yet)

    def delivered(self, size: int, now: float) -> None:
        if not self.rate:
            return
        self.free_at = max(self.free_at, now) + size / self.rate
        self.average = size if not self.average else 0.9 * self.average + 0.1 * size

    def batch(self) -> int:
        """Messages one request may ask for: a second's worth at the average size (one before any was seen)."""
        return max(1, int(self.rate / self.average)) if self.average else 1


class PullCredits:
    """Messages asked for and not yet delivered, counted as ADR-37's continuous consume does (a delivery takes one,
    a request's end gives back what it had left), and what each request has left, oldest first: the server serves
    them in that order, so a delivery that empties the oldest is its last (what the window's sizing watches; a
    request whose end came without a count leaves that view a little off, never the count)."""

    __slots__ = ("_batches", "_begun", "_sent", "expires_at", "requested")

    def __init__(self) -> None:
        self.requested = 0
        self.expires_at = 0.0  # when the newest request expires (every older one expires before it)
        self._batches: deque[int] = deque()  # per request outstanding, oldest first: messages it has left
        self._sent: deque[float] = deque()  # and when it was sent
        self._begun = False  # the oldest has brought a delivery

    def pulled(self, batch: int, now: float, expires: float) -> None:
        self.requested += batch
        self.expires_at = now + expires
        self._batches.append(batch)
        self._sent.append(now)

    def delivered(self) -> tuple[float, bool]:
        """One delivered: when its request was sent if it is that request's first delivery (else -1.0), and
        whether it was the last its request had left."""
        if self.requested:
            self.requested -= 1
        batches = self._batches
        if not batches:
            return -1.0, False
        sent_at = -1.0 if self._begun else self._sent[0]
        left = batches[0] - 1
        if left > 0:
            batches[0] = left
            self._begun = True
            return sent_at, False
        self._end()
        return sent_at, True

    def released(self, count: int) -> None:
        """A request ended (expired, or completed by the server) with ``count`` not delivered: the oldest."""
        self.requested = max(0, self.requested - count)
        if self._batches:
            self._end()

    def _end(self) -> None:
        self._batches.popleft()
        self._sent.popleft()
        self._begun = False

    def expire(self, now: float) -> None:
        """Every request has expired and its end never came (lost with a connection): nothing is asked for."""
        if self.requested and now > self.expires_at + _EXPIRY_GRACE:
            self.clear()

    def clear(self) -> None:
        self.requested = 0
        self._batches.clear()
        self._sent.clear()
        self._begun = False


class PullEngine(Replication):
    """Replication of one source through a pull consumer. Every input returns the effects to carry out."""

    def __init__(self, settings: EngineSettings, now: float, windows: WindowBudget | None = None) -> None:
        # the requests in flight, grown over a far link as a flow-control window is
        self._sizer = PullWindow(settings.source, settings.pull_capacity, settings.window_budget, windows)
        super().__init__(settings, now, self._sizer)
        self.acks = AckLedger()
        self.credits = PullCredits()
        self.heartbeat_interval = pull_heartbeat(settings.silence_timeout)
        self.anchor_seq = 0  # the stream sequence of the consumer's last delivery when this epoch began
        self._refused_until = 0.0  # a pull request was refused (409 Exceeded ...): none before this time
        self._refusals = 0
        self._filtered = False  # the consumer delivers some subjects only: sequence gaps between deliveries are normal
        self._read_through = 0  # the origin stream was read for this source up to here (a fill)
        self._held: list[Data] = []  # deliveries that arrived while a fill reads the stream: taken after it
        self._gap_fill = False  # the fill under way checks a gap within the epoch (not a resync's)
        self._last_pull_at = -math.inf
        self._paced = Pacing(settings.rate_limit)

    @property
    def mode(self) -> Mode:
        return Mode.PULL

    def rate_limited(self, rate_limit: int) -> None:
        self._paced.rate = rate_limit

    @property
    def quiet(self) -> bool:
        # and a request is outstanding: with none, the next one goes out on a tick (after a refusal's backoff, or
        # once a request whose end never came is written off)
        return super().quiet and self.credits.requested > 0

    @property
    def acked_stream_seq(self) -> int:
        """The highest origin sequence any ack of this process named."""
        return self.acks.acked_stream_seq

    # -- consumer side ------------------------------------------------------------------------------------

    def receive(self, message: Inbound, now: float) -> list[Effect]:
        """Dispatch one message from the pull requests' inbox."""
        match message:
            case Data():
                return self.data(message, now)
            case Heartbeat():
                return self.heartbeat(message, now)
            case PullStatus():
                return self.pull_status(message, now)
            case FlowControlRequest():
                return self.unrecognised(Unrecognised(f"flow-control request {message.reply} in pull mode"))
            case Unrecognised():
                return self.unrecognised(message)

    def data(self, msg: Data, now: float) -> list[Effect]:
        """A delivered origin message (a first delivery or a redelivery)."""
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
        sent_at, request_done = self.credits.delivered()
        self._paced.delivered(len(msg.payload) + len(msg.subject), now)
        sizer = self._sizer
        if sent_at >= 0.0:
            sizer.began(now, sent_at)
        sizer.delivered(now, len(msg.payload))
        if request_done and ack.pending and not self._paced.rate and self._phases.takes_deliveries:
            # the origin has more and stops until the next request's first delivery (a rate limit stops it on
            # purpose: no window grows there)
            size = sizer.starved(now)
            if size:
                effects.append(ResizeWindow(size))
        return self._deliver(msg, now, effects)

    def _deliver(self, msg: Data, now: float, effects: list[Effect]) -> bool:
        """Sequence one delivery; True when the pipeline or the acks changed (the caller covers and pumps)."""
        ack = msg.ack
        if self._phases.holds_deliveries:
            self._held.append(msg)  # after what the fill reads, in delivery order
            return False
        if not self._phases.takes_deliveries:
            # a reply to a request of an epoch being replaced: only a stored message may be acked again
            self._ack_if_stored(ack.stream_seq, msg.reply, effects)
            effects += self._consumer_alive(now)
            return False
        if ack.stream != self.settings.stream or ack.consumer != self.settings.consumer:
            effects += self.unrecognised(Unrecognised(f"delivery from {ack.stream}/{ack.consumer}"))
            return False
        dseq, sseq = ack.consumer_seq, ack.stream_seq
        if dseq != self.last_dseq + 1:
            self._ack_if_stored(sseq, msg.reply, effects)
            effects += self._out_of_sequence(dseq, sseq, now)
            return False
        if ack.delivered == 1 and not self._filtered and sseq > max(self.accepted, self._read_through) + 1:
            # The stream has sequences between the last message taken and this first delivery. On a consumer of
            # the whole stream that is a deleted message, or deliveries lost from a consumer re-created under the
            # bridge whose delivery sequences happen to line up with ours: read what lies between, then take this
            # one (held, it is sequenced when the fill is done).
            self._phases.process(Event.FILL)
            self._gap_fill = True
            self._held.append(msg)
            effects.append(FetchOrigin(max(self.accepted, self._read_through), sseq - 1))
            return False
        self.last_dseq = dseq
        self.stats.delivered += 1
        if sseq <= self.accepted:
            self.stats.duplicates += 1
            if not self._ack_if_stored(sseq, msg.reply, effects):
                self.acks.redelivered(sseq, msg.reply)
        elif ack.delivered > 1:
            # nothing this epoch left pending is above `accepted`: somebody else took deliveries of this consumer
            effects += self._broken(ResetCause.GAP, now, redelivered=sseq, accepted=self.accepted)
            return False
        else:
            self._take(sseq, msg.subject, msg.headers, msg.payload, ack.timestamp_ns)
            self.acks.taken(sseq, msg.reply)
        return True

    def heartbeat(self, beat: Heartbeat, now: float) -> list[Effect]:
        """An idle heartbeat of a waiting request: it names the consumer's last delivery, which must be ours."""
        self._last_activity = now
        self.stats.heartbeats += 1
        if not self._phases.takes_deliveries:
            return self._consumer_alive(now)
        if beat.last_consumer is not None and beat.last_consumer != self.last_dseq:
            return self._broken(
                ResetCause.HEARTBEAT_MISMATCH, now, last_dseq=self.last_dseq, server_last_dseq=beat.last_consumer
            )
        return []

    def pull_status(self, status: PullStatus, now: float) -> list[Effect]:
        """A pull request ended or was refused (ADR-37's status handling)."""
        self._last_activity = now
        code, description = status.code, status.description
        if status.pending_messages is not None:
            self.credits.released(status.pending_messages)
        effects: list[Effect] = []
        if code in _REQUEST_ENDED:
            pass
        elif code == 503 or (code == 409 and description.startswith(("Consumer Deleted", "Consumer is push based"))):
            # 503: no responders, nobody serves CONSUMER.MSG.NEXT (the consumer was deleted while no request waited,
            # or its server is going away); either way a resync binds it again (re-creating a managed one)
            if self._phases.takes_deliveries:
                cause = ResetCause.UNAVAILABLE if code == 503 else ResetCause.CONSUMER_GONE
                effects += self._broken(cause, now, status=description)
            return effects
        elif code == 409 and description.startswith("Exceeded"):
            # the consumer's max_waiting, max_batch, max_expires or max_bytes refuses the request: it never asks
            # for more than the configured capacity, so an operator set one of them lower
            self.credits.clear()
            self._refusals += 1
            self._refused_until = now + self.settings.reset_backoff.delay(self._refusals)
            effects.append(
                Notice(
                    "pull.refused",
                    "error",
                    {
                        "status": f"{code} {description}",
                        "consumer": self.settings.consumer,
                        "hint": "the consumer's max_waiting / max_batch / max_expires / max_bytes is below what the "
                        "bridge asks for: raise it, or lower max_ack_pending",
                        "retry_in": round(self._refused_until - now, 3),
                    },
                )
            )
            return effects
        elif code == 409:
            pass  # Message Size Exceeds MaxBytes, Batch Completed, Leadership Change, Server Shutdown: ask again
        else:
            self.credits.clear()
            return self.unrecognised(Unrecognised(f"pull status {code} {description}".strip()))
        self._pull(now, effects)
        return effects

    def source_reconnected(self, now: float) -> list[Effect]:
        """The origin connection came back: whatever was on its way is lost, and the requests may be too."""
        self.credits.clear()
        if self._phases.takes_deliveries:
            return self._broken(ResetCause.RECONNECT, now)
        return self._consumer_alive(now)

    # -- resync ---------------------------------------------------------------------------------------------

    def resynced(self, anchor: PullAnchor, now: float) -> list[Effect]:
        """The consumer was bound again and its last delivery read; a new epoch starts after it."""
        if not self._phases.can(Event.RESET_DONE):
            return []
        if not anchor.fit:
            stream, consumer = self.settings.stream, self.settings.consumer
            return self.reset_failed(
                f"consumer {stream}/{consumer} is no longer a pull consumer with explicit acks", now
            )
        effects: list[Effect] = []
        if anchor.created is not None and anchor.created != self._consumer_created:
            # nats-server before 2.12 reports a slightly different creation time after a restart: a re-created
            # consumer also starts its delivery sequences again, below where this one had got
            if self._consumer_created is not None and anchor.last_consumer_seq < self.last_dseq:
                effects.append(
                    Notice(
                        "consumer.recreated", "warning", {"consumer": self.settings.consumer, "created": anchor.created}
                    )
                )
            self._consumer_created = anchor.created
        self._resets.succeeded()
        self.epoch += 1
        self.last_dseq = anchor.last_consumer_seq
        self.anchor_seq = anchor.last_stream_seq
        self._filtered = anchor.filtered
        self._held.clear()
        self._gap_fill = False
        self.credits.clear()
        self._last_activity = now
        fields: dict[str, object] = {
            "cause": self._resets.cause.value,
            "epoch": self.epoch,
            "last_dseq": anchor.last_consumer_seq,
            "last_sseq": anchor.last_stream_seq,
            "watermark": self.watermark,
        }
        self._skip_to(min(anchor.ack_floor, anchor.last_stream_seq), fields)
        self._read_through = self.accepted  # what a fill reads next starts above what was taken
        if anchor.last_stream_seq > self.accepted:
            self._phases.process(Event.FILL)
            fields["fetch_from"] = self.accepted + 1
            fields["fetch_to"] = anchor.last_stream_seq
            effects.append(Notice("resync.fetching", fields=fields))
            effects.append(FetchOrigin(self.accepted, anchor.last_stream_seq))
            return effects
        self._phases.process(Event.RESET_DONE)
        effects.append(Notice("resync.done", fields=fields))
        self._pump(now, effects)
        return effects

    def fetched(self, messages: Iterable[OriginMessage], through: int, now: float) -> list[Effect]:
        """The origin stream's messages up to ``through`` that the consumer delivered to nobody, in order."""
        if not self._phases.process(Event.FILLED):
            return []
        count = 0
        for message in messages:
            if self._take(message.seq, message.subject, message.headers, message.payload, message.timestamp_ns):
                self.acks.taken(message.seq, None)
                count += 1
        self.stats.fetched += count
        self._read_through = max(self._read_through, through)
        self._last_activity = now
        effects: list[Effect] = []
        held, self._held = self._held, []
        if self._gap_fill:  # a fill within the epoch: the deliveries that waited for it follow
            self._gap_fill = False
            if count:
                effects.append(Notice("gap.filled", "warning", {"fetched": count, "through": through}))
        else:
            fields = {"cause": self._resets.cause.value, "epoch": self.epoch, "fetched": count, "through": through}
            effects.append(Notice("resync.done", fields=fields))
        for msg in held:
            self._deliver(msg, now, effects)
        self._cover(effects, now)
        self._pump(now, effects)
        return effects

    def fetch_failed(self, reason: str, now: float) -> list[Effect]:
        """The origin stream could not be read: resync again after a backoff."""
        if not self._phases.process(Event.FILL_FAILED):
            return []
        self._held.clear()  # still pending on the server: the resync reads or redelivers them
        self._gap_fill = False
        delay = self._resets.failed(now)
        return [
            Notice(
                "resync.fetch_failed",
                level="warning",
                fields={"reason": reason, "failures": self._resets.failures, "retry_in": round(delay, 3)},
            )
        ]

    # -- time -----------------------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Effect]:
        """Advance timers: publish ack timeouts, retries, silence, due resyncs, request expiry, stall state."""
        self.credits.expire(now)
        effects: list[Effect] = []
        self._tick(now, effects)
        self._pump(now, effects)
        self._watch_progress(now, effects)
        return effects

    def _reset_if_due(self, now: float) -> list[Effect]:
        # the resync reads the consumer only once the old inbox's requests are gone, or their deliveries to nobody
        # would make the new epoch start with a jump (and a second resync)
        settle = self._last_pull_at + REQUEST_INTEREST_GRACE
        return [
            RequestResync(e.cause, e.attempt, settle if settle > now else None) if isinstance(e, RequestReset) else e
            for e in super()._reset_if_due(now)
        ]

    def _expects_traffic(self) -> bool:
        # the server sends heartbeats only while a request waits: with none outstanding, quiet is normal
        return self.credits.requested > 0

    # -- shutdown -------------------------------------------------------------------------------------------

    def begin_shutdown(self, now: float) -> list[Effect]:
        """Stop pulling and sending new publishes; in-flight publish acks still lead to acks."""
        if not self._phases.process(Event.SHUTDOWN):
            return []
        self.credits.clear()
        return self._stopped(now)

    def final_answer(self) -> list[Effect]:
        """Nothing is held back in pull mode: every stored message was acked as the watermark passed it."""
        return []

    # -- internals ------------------------------------------------------------------------------------------

    def _ack_if_stored(self, sseq: int, reply: str, effects: list[Effect]) -> bool:
        if sseq > self.watermark or not reply or self._phases.awaits_recovery:
            return False
        effects.append(Ack(self.acks.sent([reply], sseq)))
        return True

    def _cover(self, effects: list[Effect], now: float) -> None:
        replies = self.acks.covered(self.watermark)
        if replies:
            effects.append(Ack(replies))
        super()._cover(effects, now)

    def _pump(self, now: float, effects: list[Effect]) -> None:
        super()._pump(now, effects)
        self._pull(now, effects)

    def _pull(self, now: float, effects: list[Effect]) -> None:
        """Ask for more once at least half the capacity is free (ADR-37's threshold), never while blocked."""
        if not self._phases.takes_deliveries or now < self._refused_until or self.pipeline.degraded:
            return
        capacity = self._sizer.size
        free = capacity - self.credits.requested - len(self.pipeline)
        if free < max(1, capacity // 2):
            return
        if self._paced.rate:
            # paced: what the link may carry in a second at the limit, and only once what came is paid for
            if self.credits.requested or now < self._paced.free_at:
                return
            free = min(free, self._paced.batch())
        if not self.credits.requested:
            self._last_activity = now  # silence is counted from the first request that should bring something
        self.credits.pulled(free, now, self.settings.pull_expires)
        self._last_pull_at = now
        self.stats.pulls += 1
        effects.append(Pull(free, self.settings.pull_expires, self.heartbeat_interval))
