"""Reading a range of a stream with batched Direct Get (ADR-31).

ADR-31 (Direct Get): https://github.com/nats-io/nats-architecture-and-design/blob/main/adr/ADR-31.md

One request ``{"seq": a, "batch": n, "max_bytes": m, "next_by_subj": filter}`` to ``<api>.DIRECT.GET.<stream>``
makes the server send up to ``n`` stored messages at or after ``a`` (fewer once ``m`` bytes are sent), each with
``Nats-Sequence``, ``Nats-Subject``, ``Nats-Time-Stamp`` (RFC 3339), ``Nats-Num-Pending`` and
``Nats-Last-Sequence`` (the message sent before it in the batch, 0 for the first) appended to its own headers,
then an empty end-of-batch message with status 204 carrying ``Nats-Num-Pending`` (messages still stored after the
batch) and ``Nats-Last-Sequence`` (the batch's last message). Those chain every reply to the one before it: a reply
lost on the way is an error, never a silently missing message. Deleted sequences are stepped over, so a batch may
run past the range asked for. A 404 means nothing at or after ``a``; 408 a request the server could not use; 413
(Too Many Results) a request over what the server answers at once; 503 (no responders) a stream without
``allow_direct``. A server without batch support answers the first message only, without ``Nats-Num-Pending``.

Any replica of the stream answers a Direct Get, not only its leader: a follower subscribes once it is 90 % caught up
and stays subscribed if it falls behind later (a node just restarted, a slow disk), and a mirror with
``mirror_direct`` answers for its origin however far it lags. Such a responder holds a prefix of the leader's
messages (replicas apply the log in order), so its reply can only end early, never skip a message in the middle.
With ``verify=True`` a read that ends short of its range asks the stream's leader (``STREAM.MSG.GET``, answered by
the leader only) whether a message lies in what is left; if one does, the rest is asked again (another responder, or
the same one caught up) and, after ``BEHIND_RETRIES`` such answers, read from the leader one message at a time.

Replies are taken over raw from the read loop (:mod:`bridge.io.wire`) when the client allows it, and parsed with
the bridge's one header codec; the recovery of a source's watermark and the audit's data source both read here.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS

from bridge.core import headers as hdr
from bridge.core.effects import OriginMessage
from bridge.errors import BridgeError, PermissionDenied
from bridge.io import permissions, wire
from bridge.io.connect import describe
from bridge.io.jsapi import ANY_SUBJECT, JsApi
from bridge.logs import get_logger

BATCH = 1024
MAX_BYTES = 4 * 1024 * 1024
# reads answered short by a lagging responder, asked again before the rest is read from the leader (after
# BEHIND_PAUSE, doubled each time: a follower a moment behind has caught up by then)
BEHIND_RETRIES = 3
BEHIND_PAUSE = 0.05

_unverifiable: set[str] = set()  # streams whose leader check was denied, warned about once per process

# what the server appends to every reply; not part of the stored message's own headers
SEQUENCE = "Nats-Sequence"
SUBJECT = "Nats-Subject"
TIME_STAMP = "Nats-Time-Stamp"
STREAM = "Nats-Stream"
NUM_PENDING = "Nats-Num-Pending"
LAST_SEQUENCE = "Nats-Last-Sequence"


@dataclass(slots=True)
class StoredMessage:
    """One message as the stream stores it. ``headers`` are its own (the reply's additions removed)."""

    seq: int
    subject: str
    time: str  # RFC 3339 with nanoseconds, as the server formats it (see :func:`rfc3339_to_micros`)
    headers: dict[str, str]
    payload: bytes


TOO_MANY_RESULTS = (
    "413 Too Many Results: the request asked for more than the server answers at once (its limit on one Direct Get "
    "reply, ADR-31); lower the batch or max_bytes option"
)


class _Batch:
    """Collects the replies to one request; ``done`` is set by the end-of-batch (or an error) reply."""

    __slots__ = (
        "_last_seen",
        "done",
        "end",
        "error",
        "messages",
        "no_batch_support",
        "num_pending",
        "token",
    )

    def __init__(self, token: bytes) -> None:
        self.token = token
        self.messages: list[StoredMessage] = []
        self.done = asyncio.Event()
        self.end: str | None = None  # "204" or "404"
        self.error: str | None = None
        self.no_batch_support = False
        self.num_pending: int | None = None  # from the end of batch: messages still stored after this batch
        self._last_seen = "0"  # the sequence of the last reply taken, as the server writes Nats-Last-Sequence

    def take(self, headers: dict[str, str], payload: bytes) -> None:
        status = headers.get("Status")
        if status is not None:
            if status == "204":
                self.end = status
                self.num_pending = _int_or_none(headers.get(NUM_PENDING))
                self._check_chain(headers.get(LAST_SEQUENCE), "the end of the batch")
            elif status == "404":
                self.end = status
            elif status == "413":
                self.error = TOO_MANY_RESULTS
            elif status == "503":
                self.error = "no responders: the stream does not exist here or lacks allow_direct"
            else:
                self.error = f"status {status} {headers.get('Description', '')}".rstrip()
            self.done.set()
            return
        if not self.messages and NUM_PENDING not in headers:
            self.no_batch_support = True
        raw_seq = headers.pop(SEQUENCE, "0")
        subject = headers.pop(SUBJECT, "")
        stamp = headers.pop(TIME_STAMP, "")
        headers.pop(STREAM, None)
        headers.pop(NUM_PENDING, None)
        self._check_chain(headers.pop(LAST_SEQUENCE, None), f"sequence {raw_seq}")
        self._last_seen = raw_seq
        self.messages.append(StoredMessage(int(raw_seq), subject, stamp, headers, payload))
        if self.no_batch_support:
            self.done.set()

    def _check_chain(self, previous: str | None, what: str) -> None:
        # each reply names the one sent before it: a gap means the client dropped replies (a slow consumer),
        # which must fail the read rather than leave rows silently missing
        if previous is not None and previous != self._last_seen and self.error is None:
            self.error = (
                f"replies lost: the server sent {what} after sequence {previous}, the last received was "
                f"{self._last_seen}; lower the batch or max_bytes option"
            )
            self.done.set()

    def reached(self, last: int) -> bool:
        """The batch holds ``last`` or a message past it: whoever answered holds everything up to ``last``."""
        return bool(self.messages) and self.messages[-1].seq >= last

    def next_seq(self, last: int) -> int | None:
        """Where the request after this batch starts, or None when nothing more of ``..last`` is stored.

        A batch that reached ``last`` (or ran past it over deleted sequences) ends the range; so does an end of
        batch saying no messages are pending after it (the rest of the range was deleted up to the stream's
        end): neither is worth another request that could only be answered 404.
        """
        if self.end != "204" or not self.messages:
            return None
        read_to = self.messages[-1].seq  # Nats-Last-Sequence of the end of batch, checked by take
        if read_to >= last or self.num_pending == 0:
            return None
        return read_to + 1


async def _leader_next(
    nc: NATS,
    api_prefix: str,
    stream: str,
    seq: int,
    subject_filter: str | None,
    timeout: float,
    error_type: type[BridgeError],
) -> OriginMessage | None:
    """The leader's first message at or after ``seq`` on the filter; None when it has none, or when the user may
    not ask (``STREAM.MSG.GET`` denied: the Direct Get reply is trusted, as before this check, with a warning)."""
    api = JsApi(nc, api_prefix)
    try:
        return await api.get_message(stream, seq, subject_filter or ANY_SUBJECT, timeout)
    except PermissionDenied as exc:
        if stream not in _unverifiable:
            _unverifiable.add(stream)
            get_logger().warning(
                "directget.unverified",
                stream=stream,
                reason=str(exc),
                fix=f"allow publishing to {api_prefix}.STREAM.MSG.GET.{stream} (docs/permissions.md): a Direct Get "
                "answered by a lagging replica is then detected",
            )
        return None
    except BridgeError as exc:
        raise error_type(f"message get on stream {stream!r} from its leader: {exc}") from exc


async def _leader_range(
    nc: NATS,
    api_prefix: str,
    stream: str,
    head: OriginMessage,
    last: int,
    subject_filter: str | None,
    timeout: float,
    error_type: type[BridgeError],
) -> AsyncIterator[list[StoredMessage]]:
    """``head`` and the leader's following messages on the filter through ``last``, one request each."""
    message: OriginMessage | None = head
    while message is not None and message.seq <= last:
        yield [_stored(message)]
        if message.seq == last:
            return
        message = await _leader_next(nc, api_prefix, stream, message.seq + 1, subject_filter, timeout, error_type)


def _stored(message: OriginMessage) -> StoredMessage:
    seconds, nanos = divmod(message.timestamp_ns, 1_000_000_000)
    stamp = datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return StoredMessage(
        message.seq, message.subject, f"{stamp}.{nanos:09d}Z", dict(message.headers or {}), message.payload
    )


def _int_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


async def read_batches(
    nc: NATS,
    api_prefix: str,
    stream: str,
    first: int,
    last: int,
    *,
    error_type: type[BridgeError],
    subject_filter: str | None = None,
    batch: int = BATCH,
    max_bytes: int = MAX_BYTES,
    timeout: float = 5.0,
    verify: bool = False,
) -> AsyncIterator[list[StoredMessage]]:
    """The messages stored in ``first..last`` (matching ``subject_filter`` when given), one list per server batch.

    ``verify``: a read ending short of ``last`` is checked with the stream's leader (module docstring), so a
    lagging replica's reply cannot leave a message out. Raises ``error_type`` naming the stream on an error
    status, a timeout, or a server without batch support, and :class:`~bridge.errors.PermissionDenied` when the
    server denied the request or its reply subscription.
    """
    subject = f"{api_prefix}.DIRECT.GET.{stream}"
    prefix = nc.new_inbox()
    current: _Batch | None = None

    def on_wire(msg_subject: bytes, _reply: bytes, header_block: bytes | None, payload: bytes) -> None:
        if current is not None and msg_subject.endswith(current.token):
            current.take(hdr.parse_header_block(header_block) if header_block else {}, payload)

    async def on_msg(msg: Any) -> None:  # only when nats-py lacks the internals wire.py needs
        if current is not None and msg.subject.endswith(current.token.decode()):
            current.take(dict(msg.headers or {}), msg.data)

    try:
        sub = await nc.subscribe(
            f"{prefix}.*", cb=on_msg, pending_msgs_limit=batch * 4, pending_bytes_limit=max_bytes * 4
        )
    except Exception as exc:  # nats-py's own errors (not connected, closed...): mapped here, at the edge
        raise error_type(f"direct get on stream {stream!r}: {describe(exc)}") from exc
    wire.add_handler(nc, sub, on_wire)
    try:
        seq, n, behind = first, 0, 0
        while seq <= last:
            n += 1
            current = _Batch(f".{n}".encode())
            body: dict[str, Any] = {"seq": seq, "batch": min(batch, last - seq + 1), "max_bytes": max_bytes}
            if subject_filter:
                body["next_by_subj"] = subject_filter
            # (not across the yield below: a cancel scope must not span one)
            with permissions.watch(nc, publish=subject, listen=[f"{prefix}.*"]):
                try:
                    await nc.publish(subject, json.dumps(body).encode(), reply=f"{prefix}.{n}")
                except Exception as exc:  # e.g. OutboundBufferLimitError while reconnecting: the caller retries
                    raise error_type(f"direct get on stream {stream!r}: {describe(exc)}") from exc
                try:
                    await asyncio.wait_for(current.done.wait(), timeout)
                except TimeoutError as exc:
                    raise error_type(
                        f"direct get on stream {stream!r}: no end of batch within {timeout:g}s "
                        f"(read up to sequence {seq - 1})"
                    ) from exc
            if current.error is not None:
                raise error_type(f"direct get on stream {stream!r}: {current.error}")
            if current.no_batch_support:
                raise error_type(
                    f"direct get on stream {stream!r}: the server does not support batched Direct Get "
                    "(nats-server 2.11 or newer needed)"
                )
            # deleted sequences are stepped over, so a batch can run past last: those belong to the next range
            messages = [m for m in current.messages if m.seq <= last]
            if messages:
                yield messages
            following = current.next_seq(last)
            if following is None:
                if not verify or current.reached(last):
                    return
                resume = current.messages[-1].seq + 1 if current.messages else seq
                missed = await _leader_next(nc, api_prefix, stream, resume, subject_filter, timeout, error_type)
                if missed is None or missed.seq > last:
                    return
                behind += 1
                if behind > BEHIND_RETRIES:
                    async for one in _leader_range(
                        nc, api_prefix, stream, missed, last, subject_filter, timeout, error_type
                    ):
                        yield one
                    return
                await asyncio.sleep(BEHIND_PAUSE * 2 ** (behind - 1))
                following = resume
            seq = following
    finally:
        current = None
        wire.remove_handler(nc, sub)
        with contextlib.suppress(Exception):  # the connection may be gone; nothing is left to release then
            await sub.unsubscribe()
