"""In-memory stand-ins for the runner's ports (``bridge.ports``), for unit tests of ``SourceRunner``.

They model just enough of a consumer to drive the runner: a stream of messages, a consumer whose delivery sequence
restarts at 1 on every RESET, answers that move the ack floor (and, on a WorkQueue, delete what they cover), and an
aggregate that stores by ``Nats-Msg-Id``. Every call is recorded in ``ops`` in order, so a test can check what the
runner did and when. The behaviour of real servers is tested against real servers (``tests/integration``); these
fakes only answer what the runner asks.

In pull mode (``FakeOrigin.mode``) the consumer delivers only what pull requests asked for, oldest request first,
to the inbox each request named: a request made before the latest ``subscribe`` still takes deliveries, which are
lost (nobody listens to its inbox), as on a real server until it notices (or the request ends): the worst case,
made explicit. ``max_ack_pending`` is not modelled. Explicit acks move the ack floor over what is acked
contiguously (and, on a WorkQueue, delete each acked message). ``anchor()`` and ``fetch()`` answer from that state
unless a test scripts their answers (``anchors``, ``fetches``); ``end_requests()`` and ``heartbeat()`` send what
a waiting request gets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from bridge.core import headers as hdr
from bridge.core.ackreply import parse_ack_subject
from bridge.core.effects import (
    AnswerFlowControl,
    BoundConsumer,
    OriginMessage,
    OriginStream,
    Pull,
    PullAnchor,
    ResetReply,
)
from bridge.core.frames import Frame, take
from bridge.core.inbound import Data, FlowControlRequest, Heartbeat, Inbound, PullStatus, classify_frames
from bridge.core.modes import ConsumerKind, Mode
from bridge.core.pipeline import TargetLimits
from bridge.core.recovery import Copy
from bridge.core.targetwire import AckOutcome
from bridge.errors import BridgeError, ConsumerUnfit, OriginUnavailable
from bridge.ports import Callback, ErrorCallback, Failures, Gate, Receiver, Sends


class Collected:
    """A receiver (``bridge.ports.Receiver``) that keeps what it is handed, in order, in ``messages``: for tests of
    an origin port on its own, without a source's engine behind it."""

    def __init__(self, messages: list[Inbound] | None = None) -> None:
        self.sink: list[Frame] = []
        self.messages: list[Inbound] = messages if messages is not None else []

    def read(self) -> None:
        self.receive(classify_frames(take(self.sink)))

    def receive(self, messages: Sequence[Inbound]) -> None:
        self.messages.extend(messages)


class Filtered(Collected):
    """A receiver in front of another (a real source's ``Inlet``): hands it what ``keep`` returns of each read, for
    tests that lose or watch deliveries on their way to the engine (:func:`filtering_subscribe`)."""

    def __init__(self, inner: Receiver, keep: Callable[[Sequence[Inbound]], Sequence[Inbound]]) -> None:
        super().__init__()
        self.inner = inner
        self.keep = keep

    def receive(self, messages: Sequence[Inbound]) -> None:
        self.inner.receive(self.keep(messages))


def filtering_subscribe(
    subscribe: Callable[[Any, Receiver], Awaitable[bool]], keep: Callable[[Sequence[Inbound]], Sequence[Inbound]]
) -> Callable[[Any, Receiver], Awaitable[bool]]:
    """An origin port's ``subscribe`` (``OriginClient.subscribe``, to monkeypatch in its place) whose receiver gets
    only what ``keep`` returns of each read."""

    async def filtering(port: Any, receiver: Receiver) -> bool:
        return await subscribe(port, Filtered(receiver, keep))

    return filtering


@dataclass
class ApiServer:
    """The JetStream API as several fake origins share it (one hub serving many edges): counts the requests in
    flight, the most at once, and makes each take ``latency`` seconds."""

    latency: float = 0.01
    in_flight: int = 0
    most: int = 0
    served: int = 0

    async def serve(self) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await anyio.sleep(self.latency)
        finally:
            self.in_flight -= 1
            self.served += 1


@dataclass
class WaitingRequest:
    """A pull request the fake consumer holds: ``remaining`` more messages for ``inbox``."""

    inbox: str
    request: Pull
    remaining: int


@dataclass
class FakeOrigin:
    """An origin stream of ``messages`` (seq -> subject, payload) and one consumer, flow control or pull (``mode``)."""

    stream_name: str = "ORDERS"
    consumer: str = "BRIDGE"
    messages: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    workqueue: bool = False
    created: str = "2026-01-01T00:00:00Z"
    ack_policy: str = "flow_control"
    connect_failures: int = 0  # the next connects that fail
    ops: list[str] = field(default_factory=list)
    answers: list[AnswerFlowControl] = field(default_factory=list)
    ack_floor: int = 0
    next_seq: int = 1
    dseq: int = 0
    ack_floor_dseq: int = 0  # the delivery sequence of the ack floor (the last answer's Nats-Last-Consumer)
    # the server as stream() reports it: a current one (flow control) unless a test says otherwise
    api_level: int | None = 5
    version: str | None = "2.15.1"
    mode: Mode = Mode.FLOW_CONTROL
    kind: ConsumerKind | None = None  # what the durable is (None: it does not exist); bind() creates it
    pulls: list[Pull] = field(default_factory=list)  # every pull request, in order
    acks: list[str] = field(default_factory=list)  # every ack's reply subject, in order
    fetched: list[tuple[int, int]] = field(default_factory=list)  # every fetch's (after, through)
    waiting: list[WaitingRequest] = field(default_factory=list)  # pull requests not yet filled, oldest first
    # scripted answers, taken first to last before the fake's own (an exception is raised instead)
    anchors: list[PullAnchor | BridgeError] = field(default_factory=list)
    fetches: list[list[OriginMessage] | BridgeError] = field(default_factory=list)
    inbox: str = ""  # pull mode: the inbox of the current subscription
    api: ApiServer | None = None  # when set, every JetStream API request goes through it (and takes its latency)
    lost: list[int] = field(default_factory=list)  # pull mode: stream sequences delivered to a stale inbox
    behind: bool = False  # what reading_behind says: the process has a backlog on this connection
    looks_soon: bool = False  # first_seq_soon answers (on the loop's next pass) rather than refusing
    copies_exist: Callable[[], Awaitable[bool]] | None = None  # set by the runner (OriginPort); unused here
    fence: Callable[[], bool] | None = None  # set by the runner (OriginPort); unused here
    _receiver: Receiver | None = None
    _connected: bool = False
    _fc: int = 0
    _inboxes: int = 0
    _acked: set[int] = field(default_factory=set)

    def publish(self, count: int, subject: str = "orders.new") -> None:
        """Messages arrive in the stream."""
        start = max(self.messages, default=0) + 1
        for seq in range(start, start + count):
            self.messages[seq] = (subject, f"payload-{seq}".encode())

    def timestamp_ns(self, seq: int) -> int:
        """The store time of message ``seq`` (what its deliveries and fetches say)."""
        return seq * 1_000_000

    def reading_behind(self) -> bool:
        return self.behind

    # -- what the test drives -------------------------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        return self._receiver is not None

    @property
    def last_delivered(self) -> int:
        """The stream sequence of the consumer's last delivery (lost or not); 0 before the first."""
        return self.next_seq - 1

    def deliver(self, count: int | None = None) -> int:
        """Deliver up to ``count`` (default: all) of the next messages; returns how many were delivered.

        Flow-control mode pushes them to the subscriber. Pull mode delivers only what waiting requests asked
        for, subscribed or not; what goes to an inbox other than the current one is lost (``lost``)."""
        sent = 0
        while count is None or sent < count:
            if self.mode is Mode.PULL:
                if not self.waiting:
                    break
                waiting: WaitingRequest | None = self.waiting[0]
            elif self._receiver is None:
                break
            else:
                waiting = None
            seq = next((s for s in sorted(self.messages) if s >= self.next_seq), None)
            if seq is None:
                break
            self.dseq += 1
            self.next_seq = seq + 1
            subject, payload = self.messages[seq]
            pending = sum(1 for s in self.messages if s > seq)
            reply = f"$JS.ACK.{self.stream_name}.{self.consumer}.1.{seq}.{self.dseq}.{self.timestamp_ns(seq)}.{pending}"
            ack = parse_ack_subject(reply)
            assert ack is not None
            sent += 1
            if waiting is not None:
                waiting.remaining -= 1
                if waiting.remaining == 0:
                    self.waiting.pop(0)
            if self._receiver is None or (waiting is not None and waiting.inbox != self.inbox):
                self.lost.append(seq)  # pull mode: the request's inbox is nobody's any more
                continue
            self._receiver.receive([Data(ack, subject, None, payload, reply)])
        return sent

    def skip_delivery(self) -> None:
        """The next delivery sequence is lost on the way (the bridge sees a gap)."""
        self.dseq += 1
        self.next_seq += 1

    def request_flow_control(self) -> str:
        """Ask for a flow-control answer; returns its subject."""
        self._fc += 1
        subject = f"$JS.FC.{self.stream_name}.{self.consumer}.fc{self._fc}"
        if self._receiver is not None:
            self._receiver.receive([FlowControlRequest(subject)])
        return subject

    def heartbeat(self) -> None:
        """Pull mode: an idle heartbeat of the oldest waiting request on the current inbox (none: nothing)."""
        if self._receiver is not None and any(w.inbox == self.inbox for w in self.waiting):
            self._receiver.receive([Heartbeat(self.dseq, self.last_delivered, None)])

    def end_requests(self, code: int = 408, description: str = "Request Timeout") -> int:
        """Pull mode: every waiting request ends (expired by default), each answered with a status carrying what it
        had left, when its inbox is the current one; returns how many ended."""
        ended, self.waiting = self.waiting, []
        for waiting in ended:
            if self._receiver is not None and waiting.inbox == self.inbox:
                self._receiver.receive([PullStatus(code, description, waiting.inbox, waiting.remaining, 0)])
        return len(ended)

    # -- OriginPort -------------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected

    async def connect(
        self,
        *,
        on_disconnected: Callback,
        on_reconnected: Callback,
        on_error: ErrorCallback,
        on_connection_error: Callable[[Exception], None] | None = None,
    ) -> None:
        self.ops.append("connect")
        if self.connect_failures:
            self.connect_failures -= 1
            raise OriginUnavailable("cannot connect to nats://fake: connection refused")
        self._connected = True

    async def stream(self, slot: Gate = contextlib.nullcontext) -> OriginStream:
        self.ops.append("stream")
        async with slot():
            await self._api_request()
        return OriginStream(self.workqueue, max(self.messages, default=0), self.api_level, self.version)

    async def consumer_kind(self) -> ConsumerKind | None:
        self.ops.append("consumer_kind")
        await self._api_request()
        return self.kind

    async def set_rate_limit(self, rate_limit: int) -> None:
        self.ops.append(f"set_rate_limit {rate_limit}")
        await self._api_request()

    async def set_window(self, max_ack_pending: int) -> None:
        self.ops.append(f"set_window {max_ack_pending}")
        await self._api_request()

    async def bind(self) -> BoundConsumer:
        self.ops.append("bind")
        await self._api_request()
        wanted = ConsumerKind.PULL if self.mode is Mode.PULL else ConsumerKind.FLOW_CONTROL
        if self.kind is not None and self.kind is not wanted:
            # the server refuses to turn one kind into the other
            raise ConsumerUnfit(f"consumer {self.stream_name}/{self.consumer} is a {self.kind} consumer, not {wanted}")
        self.kind = wanted
        pending = sum(1 for s in self.messages if s > self.ack_floor)
        unacked = sum(1 for s in self.messages if self.ack_floor < s < self.next_seq)
        return BoundConsumer(
            self.created,
            self.ack_floor,
            pending,
            delivered=(self.dseq, self.next_seq - 1),
            ack_floor_dseq=self.ack_floor_dseq,
            ack_pending=unacked if self.mode is not Mode.PULL else None,
        )

    async def reset(self, seq: int | None) -> ResetReply:
        self.ops.append(f"reset {seq}")
        await self._api_request()
        if seq is not None:
            self.ack_floor = seq - 1  # the server moves its ack floor to just below the reset sequence
        self.next_seq = self.ack_floor + 1
        self.dseq = self.ack_floor_dseq = 0
        return ResetReply(self.next_seq, self.ack_policy, self.created)

    async def first_seq_from(self, start: int) -> int:
        self.ops.append(f"probe {start}")
        await self._api_request()
        return self._first_from(start)

    def first_seq_soon(self, start: int, looked: Callable[[int, str | None], None]) -> bool:
        if not self.looks_soon:
            return False
        self.ops.append(f"probe soon {start}")
        first = self._first_from(start)
        asyncio.get_running_loop().call_soon(looked, first, None)  # answered on the loop's next pass
        return True

    def _first_from(self, start: int) -> int:
        return min((s for s in self.messages if s >= start), default=0)

    async def subscribe(self, receiver: Receiver) -> bool:
        self.ops.append("subscribe")
        self._receiver = receiver
        if self.mode is Mode.PULL:
            self._inboxes += 1
            self.inbox = f"_INBOX.fake{self._inboxes}"
        return True

    async def unsubscribe(self) -> None:
        self.ops.append("unsubscribe")
        self._receiver = None
        self.inbox = ""

    async def anchor(self) -> PullAnchor:
        self.ops.append("anchor")
        await self._api_request()
        if self.anchors:
            scripted = self.anchors.pop(0)
            if isinstance(scripted, BridgeError):
                raise scripted
            return scripted
        return PullAnchor(self.dseq, self.last_delivered, self.kind is ConsumerKind.PULL, self.created, self.ack_floor)

    async def pull(self, request: Pull) -> None:
        self.ops.append(f"pull {request.batch}")
        if not self._connected or not self.inbox:
            raise OriginUnavailable("pull request not sent: not subscribed to an inbox")
        self.pulls.append(request)
        self.waiting.append(WaitingRequest(self.inbox, request, request.batch))

    async def ack(self, replies: Sequence[str]) -> None:
        self.ops.append(f"ack {len(replies)}")
        if not self._connected:
            raise OriginUnavailable("acks not sent: not connected to the origin")
        for reply in replies:
            self.acks.append(reply)
            info = parse_ack_subject(reply)
            assert info is not None, reply
            self._acked.add(info.stream_seq)
            if self.workqueue:
                self.messages.pop(info.stream_seq, None)
        while self.ack_floor + 1 in self._acked:
            self.ack_floor += 1

    async def fetch(self, after: int, through: int) -> list[OriginMessage]:
        self.ops.append(f"fetch {after} {through}")
        await self._api_request()
        self.fetched.append((after, through))
        if self.fetches:
            scripted = self.fetches.pop(0)
            if isinstance(scripted, BridgeError):
                raise scripted
            return scripted
        return [
            OriginMessage(seq, subject, None, payload, self.timestamp_ns(seq))
            for seq, (subject, payload) in sorted(self.messages.items())
            if after < seq <= through
        ]

    async def _api_request(self) -> None:
        if self.api is not None:
            await self.api.serve()

    def detach(self) -> None:
        self.ops.append("detach")
        self._receiver = None
        self.inbox = ""

    async def answer(self, effect: AnswerFlowControl) -> None:
        self.answer_now(effect)

    def answer_now(self, effect: AnswerFlowControl) -> bool:
        self.ops.append(f"answer {effect.last_consumer} {effect.last_stream}")
        self.answers.append(effect)
        if effect.acks and effect.last_stream > self.ack_floor and effect.last_consumer > self.ack_floor_dseq:
            self.ack_floor, self.ack_floor_dseq = effect.last_stream, effect.last_consumer
            if self.workqueue:
                for seq in [s for s in self.messages if s <= effect.last_stream]:
                    del self.messages[seq]
        return True

    async def flush(self) -> None:
        self.ops.append("flush")

    async def close(self) -> None:
        self.ops.append("close")
        self._connected = False


@dataclass
class FakeTarget:
    """The aggregate: stores each ``Nats-Msg-Id`` once; acks at once, or holds acks while ``hold_acks``."""

    stream: str = "AGG"
    publish_window: int = 64
    ack_timeout: float = 5.0
    max_payload: int = 1024 * 1024
    reject: str = ""  # when set, every publish is refused with this error
    hold_acks: bool = False
    lose_writes: bool = False  # the connection is dead: publishes vanish, unstored and unacked
    written: int = 0  # publishes handed to the connection (lost ones included)
    epoch: int = 0  # the connection's number (see ``reconnect``)
    stored: dict[str, tuple[str, dict[str, str], bytes]] = field(default_factory=dict)
    limits_reads: int = 0
    held: list[AckOutcome] = field(default_factory=list)
    _on_outcomes: Callable[[Sequence[AckOutcome]], None] | None = None
    _reads_answered: anyio.Event | None = None  # set: reads of the stream wait for it (``hold_reads``)

    def hold_reads(self) -> None:
        """Reads of the stream (its limits, a source's tail) are not answered until :meth:`answer_reads`."""
        if self._reads_answered is None:
            self._reads_answered = anyio.Event()

    def answer_reads(self) -> None:
        held, self._reads_answered = self._reads_answered, None
        if held is not None:
            held.set()

    def seqs(self, source: str) -> list[int]:
        """Origin sequences of ``source`` stored, in store order."""
        found = (hdr.parse_provenance(headers) for _, headers, _ in self.stored.values())
        return [p.stream_seq for p in found if p is not None and p.source == source]

    def reconnect(self) -> None:
        """The connection is made again (what was written to the dead one is gone); the bridge is not told."""
        self.lose_writes = False
        self.epoch += 1

    def release_acks(self) -> None:
        held, self.held = self.held, []
        if held and self._on_outcomes is not None:
            self._on_outcomes(held)  # as one read would bring them

    # -- TargetPort -----------------------------------------------------------------------------------------

    def publisher(
        self, on_outcomes: Callable[[Sequence[AckOutcome]], None], fence: Callable[[], bool] | None = None
    ) -> FakePublisher:
        self._on_outcomes = on_outcomes
        return FakePublisher(self)

    async def limits(self) -> TargetLimits:
        self.limits_reads += 1
        await self._unanswered()
        return TargetLimits(self.max_payload, -1, ("agg.>",))

    async def _unanswered(self) -> None:
        held = self._reads_answered
        if held is not None:
            await held.wait()

    async def read_tail(
        self, source: str, subject_filter: str, floor: int, depth: int, slot: Gate | None = None
    ) -> tuple[list[Copy], bool]:
        async with slot() if slot is not None else contextlib.nullcontext():  # a slot, as the real read takes
            await self._unanswered()
        copies = []
        for _, headers, _ in self.stored.values():
            prov = hdr.parse_provenance(headers)
            if prov is not None and prov.source == source and prov.stream_seq > floor:
                copies.append(Copy(prov.stream_seq, prov.prev_seq))
        return sorted(copies, key=lambda c: c.stream_seq)[-depth:], True

    def _take(self, sends: Sends) -> None:
        self.written += len(sends)
        if self.lose_writes:
            return
        for message, order, attempt, _, _, _, _ in sends:  # a plain target: its limits never allow batches
            if self.reject:
                outcome = AckOutcome(order, attempt, False, error=self.reject)
            else:
                headers = message.headers
                duplicate = headers[hdr.MSG_ID] in self.stored
                self.stored.setdefault(headers[hdr.MSG_ID], (message.subject, headers, message.payload))
                outcome = AckOutcome(order, attempt, True, duplicate=duplicate)
            if self.hold_acks:
                self.held.append(outcome)
            elif self._on_outcomes is not None:
                self._on_outcomes((outcome,))


@dataclass
class FakePublisher:
    target: FakeTarget
    started: bool = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def publish(self, batch: Sends) -> Failures:
        self.target._take(batch)
        return []

    def write_now(self, batch: Sends) -> Failures | None:
        self.target._take(batch)
        return []

    @property
    def epoch(self) -> int:
        return self.target.epoch


class FakeFence:
    """A lease's fence for ``SourceRunner`` (``bridge.ports.LeaseFence``): ``open`` says the source may act; closed
    with ``kept`` (the lease suspended), the runner waits for ``resume``; closed without, it abandons the source."""

    def __init__(self) -> None:
        self.open = True
        self.kept = True

    def __call__(self) -> bool:
        return self.open

    def waiting(self) -> bool:
        return self.kept
