"""What the engine asks its adapters to do. The engine only returns these; it never performs I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from bridge.core.pipeline import Send


class ResetCause(StrEnum):
    """Why a RESET was requested (also a metrics label)."""

    START = "start"
    GAP = "gap"
    REWIND = "rewind"
    HEARTBEAT_MISMATCH = "heartbeat_mismatch"
    SILENCE = "silence"
    RECONNECT = "reconnect"
    EXTERNAL = "external"  # deliveries restarted at dseq 1 unasked: someone else reset (or re-created) the consumer
    STRANDED = "stranded"  # WorkQueue messages left below the ack floor (a server restart lost its pending list)
    CONSUMER_GONE = "consumer_gone"  # pull mode: 409 Consumer Deleted (or no longer a pull consumer)
    UNAVAILABLE = "unavailable"  # pull mode: 503, nobody serves the pull request (the consumer or its server is gone)


# The pipeline's own send: one object per publish, made once (``Publish(entry, attempt)`` builds one)
Publish = Send


@dataclass(slots=True, init=False)  # one per message at 1 msg/s: a written __init__ compiles (mypyc)
class AnswerFlowControl:
    """Publish a flow-control answer to ``subject``.

    With ``last_consumer > 0`` the answer carries ``Nats-Last-Consumer``/``Nats-Last-Stream`` (a cumulative ack
    of what is stored); with 0 it is an empty message that only releases the consumer's byte window.
    """

    subject: str
    last_consumer: int
    last_stream: int

    def __init__(self, subject: str, last_consumer: int, last_stream: int) -> None:
        self.subject = subject
        self.last_consumer = last_consumer
        self.last_stream = last_stream

    @property
    def acks(self) -> bool:
        return self.last_consumer > 0 and self.last_stream > 0

    @property
    def headers(self) -> dict[str, str] | None:
        """The answer's headers: what it acks, or None for an empty answer."""
        if not self.acks:
            return None
        return {"Nats-Last-Consumer": str(self.last_consumer), "Nats-Last-Stream": str(self.last_stream)}


@dataclass(frozen=True, slots=True)
class RequestReset:
    """Stop taking deliveries, send ``CONSUMER.RESET``, then take them again: with an empty body (back to the ack
    floor) or, when ``seq`` is set, ``{"seq": seq}`` (the next delivery is ``seq``).

    Performing it: stop taking deliveries (unsubscribe), create (managed) or look up (bound) the consumer again
    so that a deleted one answers at once, send the RESET, then subscribe again whatever the outcome. Report
    ``reset_replied(ResetReply)`` or ``reset_failed(reason)``.
    """

    cause: ResetCause
    attempt: int
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class RequestResync:
    """Pull mode's repair (``bridge.core.pull``): stop taking deliveries, bind the consumer again (create a managed
    one, look up a bound one), read its last delivery (``CONSUMER.INFO``), then take deliveries again on a new inbox.

    Performing it: unsubscribe, wait until ``settle_until`` (the engine's clock) when set, so that the requests of
    the old inbox are gone (docs/protocol.md 10: served to nobody for 2 s after they were sent), bind, read the
    anchor, then subscribe again whatever the outcome. Report ``resynced(PullAnchor)`` or ``reset_failed(reason)``.
    """

    cause: ResetCause
    attempt: int
    settle_until: float | None = None


@dataclass(frozen=True, slots=True)
class ResetReply:
    """What the consumer answered a RESET with (the consumer's info plus ``reset_seq``), reported back to the
    engine by ``reset_replied``."""

    reset_seq: int
    ack_policy: str | None = None  # the consumer's ack policy now (None: not in the reply)
    created: str | None = None  # the consumer's creation time: a new one means it was re-created


@dataclass(frozen=True, slots=True)
class VerifyStored:
    """Look up which of ``stream_seqs`` the aggregate holds (its newest copies of this source).

    Asked after an ambiguous publish failure (ack timeout, lost connection), before anything is re-sent. Report
    ``verified(generation, present)`` or ``verify_failed(reason)``.
    """

    generation: int
    stream_seqs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReadTargetLimits:
    """Read the target's limits again (``max_payload``, the stream's ``max_msg_size`` and subjects): asked while
    the source is blocked, so that an operator's fix unblocks it. Report ``target_limits(limits)``."""


@dataclass(frozen=True, slots=True)
class ProbeStranded:
    """Find the origin's first message at or after ``start`` (within the source's filters; 0: none).

    Report ``stranded_probed(first)`` or ``stranded_probe_failed(reason)``.
    """

    start: int


@dataclass(frozen=True, slots=True)
class ResizeWindow:
    """Set the managed consumer's ``max_ack_pending`` to ``size`` (an update: its position and deliveries are
    untouched), because the link's round trip held the source back (:mod:`bridge.core.window`).

    Report ``window_resized(size)`` or ``window_resize_failed(reason)``.
    """

    size: int


@dataclass(frozen=True, slots=True)
class Pull:
    """Pull mode: ask the consumer for up to ``batch`` more messages (``CONSUMER.MSG.NEXT``), the request living
    ``expires`` seconds, with an idle heartbeat every ``heartbeat`` seconds while it waits. Nothing is reported:
    what the request brings arrives as deliveries and ``PullStatus``."""

    batch: int
    expires: float
    heartbeat: float


@dataclass(frozen=True, slots=True)
class Ack:
    """Pull mode: acknowledge stored messages, one explicit ack (an empty message) to each reply subject, in
    origin order. Each names one message, and only ever one that the aggregate holds. Nothing is reported: a lost
    ack comes back as a redelivery, which is acked again."""

    replies: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FetchOrigin:
    """Pull mode: read the origin stream's messages with sequences in ``(after, through]`` within the source's
    filters, in order (the consumer delivered them to nobody who stored them: deliveries lost in transit, or left
    by a crash). Report ``fetched(messages, through)`` or ``fetch_failed(reason)``."""

    after: int
    through: int


@dataclass(frozen=True, slots=True)
class OriginMessage:
    """One message read from the origin stream itself (``FetchOrigin``)."""

    seq: int
    subject: str
    headers: Mapping[str, str] | None
    payload: bytes
    timestamp_ns: int


@dataclass(frozen=True, slots=True)
class PullAnchor:
    """Pull mode: the consumer's state as read after a resync (``CONSUMER.INFO``): the delivery sequence and the
    stream sequence of its last delivery, its ack floor, and whether it is still the pull consumer with explicit
    acks."""

    last_consumer_seq: int
    last_stream_seq: int
    fit: bool = True  # a pull consumer with ack_policy explicit
    created: str | None = None
    ack_floor: int = 0  # the stream sequence below which everything was acked (by anyone)
    filtered: bool = False  # the consumer delivers only some subjects of the stream


@dataclass(frozen=True, slots=True)
class OriginStream:
    """What start-up reads of the origin stream (``OriginPort.stream``)."""

    workqueue: bool  # WorkQueue retention: acked messages are deleted (and can be stranded)
    last_seq: int
    api_level: int | None = None  # the server's JetStream API level (``_nats.level``; None: older than 2.11)
    version: str | None = None  # the server's version (``_nats.ver``), when it says


@dataclass(frozen=True, slots=True)
class BoundConsumer:
    """The origin consumer as created or looked up (``OriginPort.bind``)."""

    created: str | None
    ack_floor: int  # the ack floor's stream sequence
    num_pending: int | None
    # where the consumer stands (None: not known): its last delivery (delivery and stream sequence, the server's
    # ``delivered``), its ack floor's delivery sequence, and how many deliveries await an ack
    delivered: tuple[int, int] | None = None
    ack_floor_dseq: int | None = None
    ack_pending: int | None = None
    # a WorkQueue start position's sequence (bridge.io.start; 0: none): below it nothing is the bridge's to ack
    start_seq: int = 0
    start_note: str = ""  # what this bind did with the source's start position, for the log ("": nothing)
    started: bool = False  # this bind created the consumer at the start position

    @property
    def at_rest(self) -> bool:
        """Nothing is outstanding: every delivery was acked by an answer naming the last of them, and the ack floor
        is the last delivery's stream sequence. The consumer's next delivery is then where a RESET to its ack floor
        would start it: taking it as it stands changes nothing a RESET would, except that delivery sequences go on
        from ``delivered[0]`` instead of starting again at 1.

        Why the floor must not be above the last delivery either: a flow-controlled consumer takes an ack above
        anything it delivered (docs/protocol.md 3.2), and a RESET keeps its FC subject (5), so an answer the bridge
        made for what it read before someone else reset the consumer backwards lands in the new epoch and sets the
        floor there. The consumer then walks the messages between its last delivery and that floor into pending,
        where no answer can clear them (an ack must name a stream sequence above the floor): with
        ``max_ack_pending`` of them, or nothing above the floor to deliver, it is stuck for good. A RESET to the
        floor starts it after them (found by the simulator; tests/unit/test_core_engine.py,
        ``test_a_stale_answer_after_a_foreign_backward_reset_is_repaired_by_a_reset_not_taken_at_rest``). The server
        itself moves the floor above the last delivery, with nothing pending, only past messages gone from the
        stream (``checkAckFloor``), where the RESET this costs is harmless."""
        return (
            self.delivered is not None
            and self.ack_pending == 0
            and self.ack_floor_dseq == self.delivered[0]
            and self.delivered[1] == self.ack_floor
        )


@dataclass(frozen=True, slots=True)
class Notice:
    """A state change worth one log line (never per message)."""

    event: str
    level: str = "info"
    fields: Mapping[str, object] = field(default_factory=dict)


Effect = (
    Publish
    | AnswerFlowControl
    | RequestReset
    | RequestResync
    | VerifyStored
    | ReadTargetLimits
    | ProbeStranded
    | ResizeWindow
    | Pull
    | Ack
    | FetchOrigin
    | Notice
)
