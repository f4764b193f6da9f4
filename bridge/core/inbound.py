"""Telling apart what a consumer sends: data, flow-control requests, heartbeats and pull statuses.

All three arrive on the one deliver subject in one ordered stream (docs/protocol.md section 2). The server's own test
(``stream.go`` ``isControlMsg``): empty payload and a header block starting ``NATS/1.0 100``. A flow-control
request carries a reply subject (``$JS.FC...``); an idle heartbeat does not, and carries ``Nats-Last-Consumer``,
``Nats-Last-Stream`` and, while a flow-control request is unanswered, ``Nats-Consumer-Stalled``.
nats-py presents the status line as the pseudo-headers ``Status`` and ``Description``.

A pull consumer (pull mode, origins older than nats-server 2.14) sends data and idle heartbeats the same way to the
reply subject of each pull request, and ends a request with a status of its own (404, 408, 409: ``PullStatus``),
which carries ``Nats-Pending-Messages``/``Nats-Pending-Bytes`` when the request had some left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bridge.core.ackreply import AckInfo, parse_ack_subject
from bridge.core.frames import Frame
from bridge.core.headers import parse_header_block

STATUS = "Status"
DESCRIPTION = "Description"
LAST_CONSUMER = "Nats-Last-Consumer"
LAST_STREAM = "Nats-Last-Stream"
CONSUMER_STALLED = "Nats-Consumer-Stalled"
PENDING_MESSAGES = "Nats-Pending-Messages"
PENDING_BYTES = "Nats-Pending-Bytes"


@dataclass(slots=True, init=False)  # per message: a written __init__ compiles (mypyc)
class Data:
    """A stored message delivered by the consumer."""

    ack: AckInfo
    subject: str
    headers: Mapping[str, str] | None
    payload: bytes
    reply: str  # the ack subject itself: pull mode acks a stored message by publishing to it

    def __init__(
        self, ack: AckInfo, subject: str, headers: Mapping[str, str] | None, payload: bytes, reply: str = ""
    ) -> None:
        self.ack = ack
        self.subject = subject
        self.headers = headers
        self.payload = payload
        self.reply = reply


@dataclass(frozen=True, slots=True)
class FlowControlRequest:
    """The server asks for a flow-control answer on ``reply``; it covers every delivery before it."""

    reply: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Idle heartbeat: the consumer's last delivery sequence and, if any, the unanswered flow-control subject."""

    last_consumer: int | None
    last_stream: int | None
    stalled: str | None


@dataclass(frozen=True, slots=True)
class PullStatus:
    """A status other than 100 on a pull request's reply subject (pull mode): the request ended or was refused.

    ``pending_messages``/``pending_bytes`` are what the request had left (``Nats-Pending-*``), when the server says.
    """

    code: int
    description: str
    request: str  # the request's reply subject
    pending_messages: int | None = None
    pending_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Unrecognised:
    """Something on the deliver subject that is none of the above (kept to count and log, never to act on)."""

    reason: str


Inbound = Data | FlowControlRequest | Heartbeat | PullStatus | Unrecognised


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def classify(subject: str, reply: str, headers: Mapping[str, str] | None, payload: bytes) -> Inbound:
    """Classify one message received on the deliver subject."""
    if reply.startswith("$JS.ACK."):
        # data first: an origin message may carry an application header that happens to be named "Status"
        ack = parse_ack_subject(reply)
        if ack is not None:
            return Data(ack=ack, subject=subject, headers=headers, payload=payload, reply=reply)
        return Unrecognised(f"malformed ack subject {reply!r}")
    if headers is not None and not payload and headers.get(STATUS) == "100":
        if reply:
            return FlowControlRequest(reply)
        return Heartbeat(
            last_consumer=_int_or_none(headers.get(LAST_CONSUMER)),
            last_stream=_int_or_none(headers.get(LAST_STREAM)),
            stalled=headers.get(CONSUMER_STALLED) or None,
        )
    if headers is not None and STATUS in headers and not payload:
        status = headers.get(STATUS, "")
        if status.isascii() and status.isdigit():
            return PullStatus(
                int(status),
                headers.get(DESCRIPTION, ""),
                subject,
                _int_or_none(headers.get(PENDING_MESSAGES)),
                _int_or_none(headers.get(PENDING_BYTES)),
            )
        return Unrecognised(f"status {status} {headers.get(DESCRIPTION, '')}".strip())
    return Unrecognised(f"no JetStream ack subject (reply {reply!r})")


def classify_frames(frames: Sequence[Frame]) -> list[Inbound]:
    """Classify what one read of the deliver subject brought, as it came off the wire, in order."""
    return [
        classify(subject.decode(), reply.decode(), parse_header_block(header) if header else None, payload)
        for subject, reply, header, payload in frames
    ]


def flow_control_replies(messages: Sequence[Inbound]) -> list[str]:
    """The reply subjects of the flow-control requests among ``messages``, in order."""
    return [message.reply for message in messages if isinstance(message, FlowControlRequest)]
