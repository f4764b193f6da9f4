"""What the engine asks its adapters to do. The engine only returns these; it never performs I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from bridge.core.pipeline import Entry


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


@dataclass(slots=True)  # not frozen: a frozen dataclass costs ~1 µs more to build, per message
class Publish:
    """Publish ``entry.message`` to the aggregate; report the outcome with ``(entry.order, attempt)``."""

    entry: Entry
    attempt: int


@dataclass(frozen=True, slots=True)
class AnswerFlowControl:
    """Publish a flow-control answer to ``subject``.

    With ``last_consumer > 0`` the answer carries ``Nats-Last-Consumer``/``Nats-Last-Stream`` (a cumulative ack
    of what is stored); with 0 it is an empty message that only releases the consumer's byte window.
    """

    subject: str
    last_consumer: int
    last_stream: int

    @property
    def acks(self) -> bool:
        return self.last_consumer > 0 and self.last_stream > 0


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
class Notice:
    """A state change worth one log line (never per message)."""

    event: str
    level: str = "info"
    fields: Mapping[str, object] = field(default_factory=dict)


Effect = Publish | AnswerFlowControl | RequestReset | VerifyStored | ReadTargetLimits | ProbeStranded | Notice
