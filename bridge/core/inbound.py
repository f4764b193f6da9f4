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


@dataclass(slots=True, init=False)  # one per message at 1 msg/s: a written __init__ compiles (mypyc)
class FlowControlRequest:
    """The server asks for a flow-control answer on ``reply``; it covers every delivery before it."""

    reply: str

    def __init__(self, reply: str) -> None:
        self.reply = reply


@dataclass(slots=True, init=False)  # one per source per second: a written __init__ compiles (mypyc)
class Heartbeat:
    """Idle heartbeat: the consumer's last delivery sequence and, if any, the unanswered flow-control subject."""

    last_consumer: int | None
    last_stream: int | None
    stalled: str | None

    def __init__(self, last_consumer: int | None, last_stream: int | None, stalled: str | None) -> None:
        self.last_consumer = last_consumer
        self.last_stream = last_stream
        self.stalled = stalled


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


# The control messages of a flow-control consumer exactly as the server writes them (``stream.go``, ``consumer.go``):
# every quiet source sends one heartbeat a second, and at 1 msg/s almost every message brings a request
_FC_REQUEST_BLOCK = b"NATS/1.0 100 FlowControl Request\r\n\r\n"
_HEARTBEAT_LINE = b"NATS/1.0 100 Idle Heartbeat\r\n"
_END = b"\r\n\r\n"
_HEARTBEAT_FIELDS = (LAST_CONSUMER.encode(), LAST_STREAM.encode(), CONSUMER_STALLED.encode())


def _server_control(reply: bytes, header: bytes) -> Inbound | None:
    """A flow-control request or an idle heartbeat in the server's own form (its status line, then only the
    heartbeat's ``Name: value`` lines, ASCII values without surrounding whitespace), classified from the bytes;
    None for anything else (then :func:`classify`). What it returns is what :func:`classify` returns for the same
    frame: it spares the general header parse, half of what classifying one of them cost."""
    if reply:
        if header != _FC_REQUEST_BLOCK or reply.startswith(b"$JS.ACK."):
            return None
        return FlowControlRequest(reply.decode())
    if not header.startswith(_HEARTBEAT_LINE) or not header.endswith(_END) or len(header) <= len(_HEARTBEAT_LINE) + 2:
        return None
    values: list[str | None] = [None, None, None]
    for line in header[len(_HEARTBEAT_LINE) : -len(_END)].split(b"\r\n"):
        name, sep, value = line.partition(b": ")
        if not sep or not value or not value.isascii() or value.strip() != value:
            return None
        if name == _HEARTBEAT_FIELDS[0]:
            values[0] = value.decode()
        elif name == _HEARTBEAT_FIELDS[1]:
            values[1] = value.decode()
        elif name == _HEARTBEAT_FIELDS[2]:
            values[2] = value.decode()
        else:
            return None
    return Heartbeat(_int_or_none(values[0]), _int_or_none(values[1]), values[2])


def classify_frames(frames: Sequence[Frame]) -> list[Inbound]:
    """Classify what one read of the deliver subject brought, as it came off the wire, in order."""
    out: list[Inbound] = []
    for subject, reply, header, payload in frames:
        message = _server_control(reply, header) if header is not None and not payload else None
        if message is None:
            headers = parse_header_block(header) if header else None
            message = classify(subject.decode(), reply.decode(), headers, payload)
        out.append(message)
    return out


def flow_control_replies(messages: Sequence[Inbound]) -> list[str]:
    """The reply subjects of the flow-control requests among ``messages``, in order."""
    return [message.reply for message in messages if isinstance(message, FlowControlRequest)]
