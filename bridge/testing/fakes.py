"""In-memory stand-ins for the runner's ports (``bridge.runtime.ports``), for unit tests of ``SourceRunner``.

They model just enough of a flow-control consumer to drive the runner: a stream of messages, a consumer whose
delivery sequence restarts at 1 on every RESET, answers that move the ack floor (and, on a WorkQueue, delete what
they cover), and an aggregate that stores by ``Nats-Msg-Id``. Every call is recorded in ``ops`` in order, so a test
can check what the runner did and when. The behaviour of real servers is tested against real servers
(``tests/integration``); these fakes only answer what the runner asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.core import headers as hdr
from bridge.core.ackreply import AckInfo
from bridge.core.effects import AnswerFlowControl, ResetReply
from bridge.core.inbound import Data, FlowControlRequest, Inbound
from bridge.core.pipeline import TargetLimits
from bridge.core.recovery import Copy
from bridge.errors import OriginUnavailable
from bridge.io.connect import Callback, ErrorCallback
from bridge.io.target import AckOutcome
from bridge.runtime.ports import BoundConsumer, Failures, OriginStream, Sends


@dataclass
class FakeOrigin:
    """An origin stream of ``messages`` (seq -> subject, payload) and one flow-control consumer."""

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
    _on_message: Callable[[Inbound], None] | None = None
    _connected: bool = False
    _fc: int = 0

    def publish(self, count: int, subject: str = "orders.new") -> None:
        """Messages arrive in the stream."""
        start = max(self.messages, default=0) + 1
        for seq in range(start, start + count):
            self.messages[seq] = (subject, f"payload-{seq}".encode())

    # -- what the test drives -------------------------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        return self._on_message is not None

    def deliver(self, count: int | None = None) -> int:
        """Push up to ``count`` (default: all) of the next messages to the subscriber; returns how many."""
        sent = 0
        while self._on_message is not None and (count is None or sent < count):
            seq = next((s for s in sorted(self.messages) if s >= self.next_seq), None)
            if seq is None:
                break
            self.dseq += 1
            self.next_seq = seq + 1
            subject, payload = self.messages[seq]
            pending = sum(1 for s in self.messages if s > seq)
            ack = AckInfo(self.stream_name, self.consumer, 1, seq, self.dseq, seq * 1_000_000, pending)
            self._on_message(Data(ack, subject, None, payload))
            sent += 1
        return sent

    def skip_delivery(self) -> None:
        """The next delivery sequence is lost on the way (the bridge sees a gap)."""
        self.dseq += 1
        self.next_seq += 1

    def request_flow_control(self) -> str:
        """Ask for a flow-control answer; returns its subject."""
        self._fc += 1
        subject = f"$JS.FC.{self.stream_name}.{self.consumer}.fc{self._fc}"
        if self._on_message is not None:
            self._on_message(FlowControlRequest(subject))
        return subject

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
        after_parse: Callable[[], None],
    ) -> None:
        self.ops.append("connect")
        if self.connect_failures:
            self.connect_failures -= 1
            raise OriginUnavailable("cannot connect to nats://fake: connection refused")
        self._connected = True

    async def stream(self) -> OriginStream:
        self.ops.append("stream")
        return OriginStream(self.workqueue, max(self.messages, default=0))

    async def bind(self) -> BoundConsumer:
        self.ops.append("bind")
        pending = sum(1 for s in self.messages if s > self.ack_floor)
        return BoundConsumer(self.created, self.ack_floor, pending)

    async def reset(self, seq: int | None) -> ResetReply:
        self.ops.append(f"reset {seq}")
        if seq is not None:
            self.ack_floor = seq - 1  # the server moves its ack floor to just below the reset sequence
        self.next_seq = self.ack_floor + 1
        self.dseq = 0
        return ResetReply(self.next_seq, self.ack_policy, self.created)

    async def first_seq_from(self, start: int) -> int:
        self.ops.append(f"probe {start}")
        return min((s for s in self.messages if s >= start), default=0)

    async def subscribe(self, on_message: Callable[[Inbound], None]) -> bool:
        self.ops.append("subscribe")
        self._on_message = on_message
        return True

    async def unsubscribe(self) -> None:
        self.ops.append("unsubscribe")
        self._on_message = None

    def detach(self) -> None:
        self.ops.append("detach")
        self._on_message = None

    async def answer(self, effect: AnswerFlowControl) -> None:
        self.ops.append(f"answer {effect.last_consumer} {effect.last_stream}")
        self.answers.append(effect)
        if effect.acks and effect.last_stream > self.ack_floor:
            self.ack_floor = effect.last_stream
            if self.workqueue:
                for seq in [s for s in self.messages if s <= effect.last_stream]:
                    del self.messages[seq]

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
    stored: dict[str, tuple[str, dict[str, str], bytes]] = field(default_factory=dict)
    limits_reads: int = 0
    held: list[AckOutcome] = field(default_factory=list)
    hooks: list[Callable[[], None]] = field(default_factory=list)
    _on_outcome: Callable[[AckOutcome], None] | None = None

    def seqs(self, source: str) -> list[int]:
        """Origin sequences of ``source`` stored, in store order."""
        found = (hdr.parse_provenance(headers) for _, headers, _ in self.stored.values())
        return [p.stream_seq for p in found if p is not None and p.source == source]

    def release_acks(self) -> None:
        held, self.held = self.held, []
        for outcome in held:
            if self._on_outcome is not None:
                self._on_outcome(outcome)

    # -- TargetPort -----------------------------------------------------------------------------------------

    def publisher(self, on_outcome: Callable[[AckOutcome], None]) -> FakePublisher:
        self._on_outcome = on_outcome
        return FakePublisher(self)

    async def limits(self) -> TargetLimits:
        self.limits_reads += 1
        return TargetLimits(self.max_payload, -1, ("agg.>",))

    async def read_tail(self, source: str, subject_filter: str, floor: int, depth: int) -> tuple[list[Copy], bool]:
        copies = []
        for _, headers, _ in self.stored.values():
            prov = hdr.parse_provenance(headers)
            if prov is not None and prov.source == source and prov.stream_seq > floor:
                copies.append(Copy(prov.stream_seq, prov.prev_seq))
        return sorted(copies, key=lambda c: c.stream_seq)[-depth:], True

    def add_after_parse(self, hook: Callable[[], None]) -> None:
        self.hooks.append(hook)

    def remove_after_parse(self, hook: Callable[[], None]) -> None:
        if hook in self.hooks:
            self.hooks.remove(hook)

    def _take(self, sends: Sends) -> None:
        for message, order, attempt in sends:
            if self.reject:
                outcome = AckOutcome(order, attempt, False, error=self.reject)
            else:
                headers = message.headers
                duplicate = headers[hdr.MSG_ID] in self.stored
                self.stored.setdefault(headers[hdr.MSG_ID], (message.subject, headers, message.payload))
                outcome = AckOutcome(order, attempt, True, duplicate=duplicate)
            if self.hold_acks:
                self.held.append(outcome)
            elif self._on_outcome is not None:
                self._on_outcome(outcome)


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
