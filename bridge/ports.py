"""What a source runner needs from the world, as protocols: the origin and the aggregate.

This module sits below both ``bridge.io`` (which implements the ports over nats-py) and ``bridge.runtime`` (which
performs the engine's effects through them); the values they carry are the core's (``bridge.core.effects``).
``SourceRunner`` performs the engine's effects only through these, so the same runner runs against nats-py
(``bridge.io.origin.OriginClient`` and ``bridge.io.aggregate.AggregateSide``) and, in its unit tests, against the
in-memory fakes of ``bridge.testing.fakes``. Every method raises only the ``bridge.errors`` family.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

from bridge.core.effects import (
    AnswerFlowControl,
    BoundConsumer,
    OriginMessage,
    OriginStream,
    Pull,
    PullAnchor,
    ResetReply,
)
from bridge.core.frames import Frame
from bridge.core.inbound import Inbound
from bridge.core.modes import ConsumerKind, Mode
from bridge.core.pipeline import TargetLimits
from bridge.core.recovery import Copy
from bridge.core.targetwire import AckOutcome, Publication

# what a connection reports: lost, back (no argument), or an error nats-py met on it
Callback = Callable[[], Awaitable[None]]
ErrorCallback = Callable[[Exception], Awaitable[None]]
# each publish (``targetwire.Publication``: message, order, attempt, batch, batch seq, op); (order, attempt, why)
# for each one that could not be sent
Sends = Sequence[Publication]
Failures = list[tuple[int, int, str]]


class Receiver(Protocol):
    """What takes a source's deliveries (``bridge.core.inlet.Inlet``): the wire parser appends that source's frames
    to ``sink`` and calls ``read`` once after each read that did; messages classified elsewhere (nats-py's own
    dispatch, the test fakes) go to ``receive``, in order."""

    sink: list[Frame]

    def read(self) -> None: ...

    def receive(self, messages: Sequence[Inbound]) -> None: ...


class OriginPort(Protocol):
    """The origin server: its stream, the source's consumer and the deliver subject (flow-control mode) or the
    pull requests' inbox (pull mode).

    ``mode`` is set by the runner once it is chosen (``bridge.core.modes``), before ``bind``: it decides which
    consumer ``bind`` creates or vets and what ``subscribe`` listens to.
    """

    mode: Mode

    @property
    def connected(self) -> bool: ...

    def reading_behind(self) -> bool:
        """Whether the connection holds a backlog not read yet (the process is behind its socket): the engine's
        silence is no evidence then (``Replication.reading_behind``). Cheap: called on every tick of the source."""

    async def connect(
        self,
        *,
        on_disconnected: Callback,
        on_reconnected: Callback,
        on_error: ErrorCallback,
        on_connection_error: Callable[[Exception], None] | None = None,
    ) -> None:
        """Connect (raises ``OriginUnavailable``).

        ``on_error`` gets the connection's errors about this source (its subjects); ``on_connection_error`` those
        about nobody in particular, which the connection, shared with other sources, logs once itself."""

    async def stream(self, slot: Gate = ...) -> OriginStream:
        """The origin stream's info (raises ``OriginUnavailable``); ``slot`` is held for each request it makes (a
        source waiting for another's request holds none)."""

    async def consumer_kind(self) -> ConsumerKind | None:
        """What the source's durable is, or None when it does not exist (raises ``OriginUnavailable``)."""

    async def bind(self) -> BoundConsumer:
        """Create (managed) or look up and vet (bound) the consumer for ``mode``; raises ``ConsumerUnfit``."""

    async def set_rate_limit(self, rate_limit: int) -> None:
        """Take a new ``rate_limit`` (bytes per second, 0: none) in place: in flow-control mode the managed consumer
        is updated (``action: update`` of the same durable: its position and deliveries are untouched; a consumer
        that does not exist is not created: ``OriginUnavailable``); raises the ``bridge.errors`` family. In pull
        mode nothing changes on the server."""

    copies_exist: Callable[[], Awaitable[bool]] | None
    """Whether the aggregate holds copies of this source, set by the runner: asked before a start position is
    applied to a consumer being created (``bridge.io.start``)."""

    fence: Callable[[], bool] | None
    """The source's lease fence, set by the runner: a flow-control answer written without waiting is dropped if it
    closed before the answer leaves the process (``bridge.io.wire.flush_writes``)."""

    async def set_window(self, max_ack_pending: int) -> None:
        """Grow the managed consumer's ``max_ack_pending`` in place (an update of the same durable, as
        :meth:`set_rate_limit`; in pull mode it covers the requests in flight and is never lowered); later binds
        keep it. Raises the ``bridge.errors`` family."""

    async def reset(self, seq: int | None) -> ResetReply: ...

    async def first_seq_from(self, start: int) -> int:
        """The first message at or after ``start`` within the source's filters (0: none)."""

    def first_seq_soon(self, start: int, looked: Callable[[int, str | None], None]) -> bool:
        """Ask for ``first_seq_from(start)`` without waiting: ``looked(first, None)`` once answered, ``looked(0,
        why)`` when the origin could not say; False, and nothing asked, when not possible now (then
        ``first_seq_from``)."""

    async def subscribe(self, receiver: Receiver) -> bool:
        """Hand every message of the deliver subject (pull mode: of a new inbox, which ``pull`` names as the reply
        of every request until the next ``subscribe``) to ``receiver``, in order, all those of one read together
        (raises ``OriginUnavailable`` when not connected: the next reset subscribes again)."""

    async def anchor(self) -> PullAnchor:
        """Pull mode: the consumer's last delivery, from ``CONSUMER.INFO`` (raises the ``bridge.errors`` family)."""

    async def pull(self, request: Pull) -> None:
        """Pull mode: send one ``CONSUMER.MSG.NEXT`` request, replies to the current inbox (raises
        ``OriginUnavailable`` when it cannot be sent)."""

    async def ack(self, replies: Sequence[str]) -> None:
        """Pull mode: one explicit ack (an empty message) to each reply subject, in one write (raises
        ``OriginUnavailable`` when they cannot be sent)."""

    async def fetch(self, after: int, through: int) -> list[OriginMessage]:
        """Pull mode: the origin stream's messages in ``(after, through]`` within the source's filters, in order
        (read with ``STREAM.MSG.GET``; raises the ``bridge.errors`` family)."""

    async def unsubscribe(self) -> None: ...

    def detach(self) -> None:
        """Stop handing over deliveries at once (synchronously): the source was abandoned."""

    async def answer(self, effect: AnswerFlowControl) -> None:
        """Publish a flow-control answer (raises ``OriginUnavailable`` when it cannot be sent)."""

    def answer_now(self, effect: AnswerFlowControl) -> bool:
        """Write a flow-control answer without waiting, or False when that is not possible now (then ``answer``)."""

    async def flush(self) -> None: ...

    async def close(self) -> None: ...


class PublisherPort(Protocol):
    """One source's publishes to the aggregate; outcomes arrive through the callback given at creation."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def publish(self, batch: Sends) -> Failures: ...

    def write_now(self, batch: Sends) -> Failures | None:
        """Write without waiting, or None when the connection has unwritten data (then use ``publish``)."""

    @property
    def epoch(self) -> int:
        """Which connection publishes go out on: it changes each time the connection is made again. Publishes in
        flight on an earlier one are presumed lost."""


Gate = Callable[[], AbstractAsyncContextManager[object]]
"""Entered around each request a read makes that must wait its turn (a slot among the process's API requests)."""


class TargetPort(Protocol):
    """The aggregate stream, shared by every source runner of the process."""

    @property
    def stream(self) -> str: ...

    @property
    def publish_window(self) -> int: ...

    @property
    def ack_timeout(self) -> float: ...

    def publisher(
        self, on_outcomes: Callable[[Sequence[AckOutcome]], None], fence: Callable[[], bool] | None = None
    ) -> PublisherPort:
        """A publisher for one source; the acks of its publishes go to ``on_outcomes``, those of one read together.
        ``fence``: the source's lease fence, looked at again right before its publishes leave the process."""

    async def limits(self) -> TargetLimits: ...

    async def read_tail(
        self, source: str, subject_filter: str, floor: int, depth: int, slot: Gate | None = None
    ) -> tuple[list[Copy], bool]:
        """The source's copies above ``floor`` (``bridge.io.aggregate.read_source_tail``); each read of messages
        inside ``slot``, when given (the aggregate's state it starts from is shared, and takes none)."""


class LeaseFence(Protocol):
    """A source's lease, as the runner checks it right before every action (``bridge.runtime.fleet.Fence``)."""

    def __call__(self) -> bool:
        """This process may act on the source now."""
        ...

    def waiting(self) -> bool:
        """The fence is closed but may open again in the same term (the lease is suspended, not lost): the runner
        waits, keeping its state, until it is resumed or abandoned."""
        ...
