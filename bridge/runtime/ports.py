"""What a source runner needs from the world, as protocols: the origin and the aggregate.

``SourceRunner`` performs the engine's effects only through these, so the same runner runs against nats-py
(``bridge.io.origin.OriginClient`` and ``bridge.io.aggregate.AggregateSide``) and, in its unit tests, against the
in-memory fakes of ``bridge.testing.fakes``. Every method raises only the ``bridge.errors`` family.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bridge.core.effects import AnswerFlowControl, ResetReply
from bridge.core.inbound import Inbound
from bridge.core.pipeline import OutboundMessage, TargetLimits
from bridge.core.recovery import Copy
from bridge.io.target import AckOutcome

Callback = Callable[[], Awaitable[None]]
ErrorCallback = Callable[[Exception], Awaitable[None]]
# (message, order, attempt) for each publish; (order, attempt, why) for each one that could not be sent
Sends = Sequence[tuple[OutboundMessage, int, int]]
Failures = list[tuple[int, int, str]]


@dataclass(frozen=True, slots=True)
class OriginStream:
    """What start-up reads of the origin stream."""

    workqueue: bool  # WorkQueue retention: acked messages are deleted (and can be stranded)
    last_seq: int


@dataclass(frozen=True, slots=True)
class BoundConsumer:
    """The origin consumer as created or looked up."""

    created: str | None
    ack_floor: int
    num_pending: int | None


class OriginPort(Protocol):
    """The origin server: its stream, the source's consumer and the deliver subject."""

    @property
    def connected(self) -> bool: ...

    async def connect(
        self,
        *,
        on_disconnected: Callback,
        on_reconnected: Callback,
        on_error: ErrorCallback,
        after_parse: Callable[[], None],
    ) -> None:
        """Connect (raises ``OriginUnavailable``); ``after_parse`` runs once each read has been handed over."""

    async def stream(self) -> OriginStream: ...

    async def bind(self) -> BoundConsumer:
        """Create (managed) or look up and vet (bound) the consumer; raises ``ConsumerUnfit``."""

    async def reset(self, seq: int | None) -> ResetReply: ...

    async def first_seq_from(self, start: int) -> int:
        """The first message at or after ``start`` within the source's filters (0: none)."""

    async def subscribe(self, on_message: Callable[[Inbound], None]) -> bool:
        """Hand every message of the deliver subject, classified, to ``on_message`` (raises ``OriginUnavailable``
        when not connected: the next reset subscribes again)."""

    async def unsubscribe(self) -> None: ...

    def detach(self) -> None:
        """Stop handing over deliveries at once (synchronously): the source was abandoned."""

    async def answer(self, effect: AnswerFlowControl) -> None:
        """Publish a flow-control answer (raises ``OriginUnavailable`` when it cannot be sent)."""

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class PublisherPort(Protocol):
    """One source's publishes to the aggregate; outcomes arrive through the callback given at creation."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def publish(self, batch: Sends) -> Failures: ...

    def write_now(self, batch: Sends) -> Failures | None:
        """Write without waiting, or None when the connection has unwritten data (then use ``publish``)."""


class TargetPort(Protocol):
    """The aggregate stream, shared by every source runner of the process."""

    @property
    def stream(self) -> str: ...

    @property
    def publish_window(self) -> int: ...

    @property
    def ack_timeout(self) -> float: ...

    def publisher(self, on_outcome: Callable[[AckOutcome], None]) -> PublisherPort: ...

    async def limits(self) -> TargetLimits: ...

    async def read_tail(self, source: str, subject_filter: str, floor: int, depth: int) -> tuple[list[Copy], bool]:
        """The source's copies above ``floor`` (``bridge.io.aggregate.read_source_tail``)."""

    def add_after_parse(self, hook: Callable[[], None]) -> None: ...

    def remove_after_parse(self, hook: Callable[[], None]) -> None: ...
