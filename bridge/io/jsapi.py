"""The few JetStream API calls the bridge makes, as plain requests on a core connection.

Plain requests (not nats-py's JetStream context) keep the API prefix explicit (``$JS.API`` or
``$JS.<domain>.API``: across a leaf link only the domain form reaches the leaf, docs/protocol.md section 6), keep
``pedantic`` creates possible, and keep every error in the bridge's own types.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from bridge.core.effects import OriginMessage
from bridge.core.headers import parse_header_block
from bridge.core.times import parse_rfc3339_ns
from bridge.errors import ApiError, ApiTimeout, ApiUnavailable, BridgeError, PermissionDenied
from bridge.io import permissions, wire
from bridge.io.connect import describe

__all__ = [
    "ANY_SUBJECT",
    "CONSUMER_DOES_NOT_EXIST",
    "CONSUMER_EXISTS",
    "CONSUMER_NOT_FOUND",
    "NO_MESSAGE_FOUND",
    "STREAM_NAME_IN_USE",
    "STREAM_NOT_FOUND",
    "ApiError",
    "ApiTimeout",
    "ApiUnavailable",
    "JsApi",
    "PermissionDenied",
    "server_level",
    "stored_message",
]

# err_code values the bridge reacts to (nats-server server/errors.json)
STREAM_NOT_FOUND = 10059
CONSUMER_NOT_FOUND = 10014
CONSUMER_DOES_NOT_EXIST = 10149  # an update (``action: update``) of a durable that does not exist
STREAM_NAME_IN_USE = 10058  # a stream create met an existing stream with another configuration
CONSUMER_EXISTS = 10148  # a create-only consumer create met an existing durable with another configuration
NO_MESSAGE_FOUND = 10037  # STREAM.MSG.GET: nothing at (or after) the sequence; a missing stream is also a 404

NO_RESPONDERS = "503"  # the status of the reply the server sends for a request nobody subscribes to
ANY_SUBJECT = ">"  # next_by_subj matching every subject: the next stored message, stepping over deleted ones


@dataclass(frozen=True, slots=True)
class JsApi:
    """JetStream API requests under one prefix."""

    nc: NATS
    prefix: str = "$JS.API"

    async def request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        """Send ``<prefix>.<path>`` with a JSON body (empty payload when None); return the decoded reply."""
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        return await request_json(self.nc, f"{self.prefix}.{path}", payload, timeout)

    async def stream_info(self, stream: str, timeout: float = 5.0) -> dict[str, Any]:
        return await self.request(f"STREAM.INFO.{stream}", None, timeout)

    def stream_info_soon(self, stream: str, timeout: float, answered: Answered, *, state_only: bool = False) -> bool:
        """:meth:`stream_info` without a task (:func:`request_soon`); False when not possible now. ``state_only``:
        the caller reads nothing but ``state.messages`` and ``state.first_seq``, which are then all it gets when
        the reply is in the server's usual form (:func:`quick_stream_state`)."""
        quick = quick_stream_state if state_only else None
        return request_soon(self.nc, f"{self.prefix}.STREAM.INFO.{stream}", timeout, answered, quick=quick)

    async def consumer_info(self, stream: str, consumer: str, timeout: float = 5.0) -> dict[str, Any]:
        return await self.request(f"CONSUMER.INFO.{stream}.{consumer}", None, timeout)

    async def find_consumer(self, stream: str, consumer: str, timeout: float = 5.0) -> dict[str, Any] | None:
        """``CONSUMER.INFO`` of a durable, or None when it does not exist (other errors raise)."""
        try:
            return await self.consumer_info(stream, consumer, timeout)
        except ApiError as exc:
            if exc.err_code == CONSUMER_NOT_FOUND:
                return None
            raise

    async def create_consumer(
        self,
        stream: str,
        config: dict[str, Any],
        *,
        pedantic: bool = True,
        timeout: float = 5.0,
        action: Literal["create", "update"] | None = None,
    ) -> dict[str, Any]:
        """Create or update a durable (``CONSUMER.CREATE.<stream>.<name>``); pedantic: the server forces nothing.
        ``action`` (2.10+): ``update`` refuses a durable that does not exist (:data:`CONSUMER_DOES_NOT_EXIST`),
        never creating it; ``create`` (:meth:`add_consumer`) never updates one."""
        body: dict[str, Any] = {"stream_name": stream, "config": config}
        if pedantic:
            body["pedantic"] = True
        if action is not None:
            body["action"] = action
        return await self.request(f"CONSUMER.CREATE.{stream}.{config['durable_name']}", body, timeout)

    async def add_consumer(self, stream: str, config: dict[str, Any], *, timeout: float = 5.0) -> dict[str, Any]:
        """Create a durable, never update one: ``action: create`` (and pedantic). An existing durable with the same
        configuration is answered as created; with another one the server refuses (:data:`CONSUMER_EXISTS`)."""
        return await self.create_consumer(stream, config, timeout=timeout, action="create")

    async def create_stream(self, config: dict[str, Any], *, timeout: float = 5.0) -> dict[str, Any]:
        """``STREAM.CREATE.<name>``: never updates; an existing stream with another configuration is refused
        (:data:`STREAM_NAME_IN_USE`), one with the same configuration is answered as created."""
        return await self.request(f"STREAM.CREATE.{config['name']}", config, timeout)

    async def reset_consumer(
        self, stream: str, consumer: str, timeout: float, seq: int | None = None
    ) -> dict[str, Any]:
        """``CONSUMER.RESET``: back to the ack floor (empty body), or to ``seq``. The reply holds ``reset_seq``."""
        body = {"seq": seq} if seq is not None else None
        return await self.request(f"CONSUMER.RESET.{stream}.{consumer}", body, timeout)

    async def first_seq_from(self, stream: str, start: int, subject_filter: str, timeout: float = 5.0) -> int:
        """The sequence of the stream's first message at or after ``start`` on ``subject_filter``; 0 when none."""
        message = await self.get_message(stream, start, subject_filter, timeout)
        return message.seq if message is not None else 0

    async def get_message(
        self, stream: str, seq: int, next_by_subj: str | None, timeout: float = 5.0
    ) -> OriginMessage | None:
        """``STREAM.MSG.GET``: the message stored at ``seq`` (``next_by_subj`` None), or the first one at or after
        ``seq`` on the subject filter ``next_by_subj`` (:data:`ANY_SUBJECT` for any); None when there is none.

        Works on every server since 2.10 and on any stream (Direct Get needs ``allow_direct``). A missing stream
        is an :class:`ApiError`, never "no message".
        """
        body: dict[str, Any] = {"seq": seq}
        if next_by_subj is not None:
            body["next_by_subj"] = next_by_subj
        subject = f"STREAM.MSG.GET.{stream}"
        try:
            reply = await self.request(subject, body, timeout)
        except ApiError as exc:
            if exc.err_code == NO_MESSAGE_FOUND:
                return None
            raise
        return stored_message(reply.get("message"), f"{self.prefix}.{subject}")

    async def messages_between(
        self, stream: str, after: int, through: int, filters: Sequence[str], timeout: float = 5.0
    ) -> list[OriginMessage]:
        """The stream's messages with sequences in ``(after, through]`` on any of ``filters`` (none: every
        subject), in sequence order: one ``STREAM.MSG.GET`` per message, plus one per filter to find its end.

        Each filter keeps its own next message; the lowest is taken and its filter read on from there, so
        several filters merge in order without reading any message twice. Deleted sequences (a Limits or
        WorkQueue stream) are stepped over by ``next_by_subj``.
        """
        if through <= after:
            return []
        heads = {
            f: await self.get_message(stream, after + 1, f, timeout) for f in dict.fromkeys(filters or [ANY_SUBJECT])
        }
        out: list[OriginMessage] = []
        while True:
            due = [m for m in heads.values() if m is not None and m.seq <= through]
            if not due:
                return out
            taken = min(due, key=lambda m: m.seq)
            out.append(taken)
            for f, head in heads.items():
                # every filter standing at the message taken moves on: a message two overlapping filters both
                # match (a consumer refuses such filters, a stream read need not) is still read once
                if head is not None and head.seq == taken.seq:
                    heads[f] = (
                        await self.get_message(stream, taken.seq + 1, f, timeout) if taken.seq < through else None
                    )

    def next_request(
        self, stream: str, consumer: str, *, batch: int, expires: float, heartbeat: float
    ) -> tuple[str, bytes]:
        """Subject and body of a pull request (``CONSUMER.MSG.NEXT``) for ``batch`` messages, living ``expires``
        seconds with an idle heartbeat every ``heartbeat`` seconds (the server wants it at most half of
        ``expires``). It is published with the inbox for the deliveries as its reply, never sent as a request:
        its answers are the deliveries themselves."""
        body = {"batch": batch, "expires": seconds_ns(expires), "idle_heartbeat": seconds_ns(heartbeat)}
        return f"{self.prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}", json.dumps(body, separators=(",", ":")).encode()


def seconds_ns(seconds: float) -> int:
    """A duration in seconds as the API's integer nanoseconds."""
    return round(seconds * 1_000_000_000)


def stored_message(raw: Any, subject: str) -> OriginMessage:
    """Decode the ``message`` of a ``STREAM.MSG.GET`` reply (to ``subject``): ``hdrs`` (a base64 header block,
    absent without headers), ``data`` (base64, absent when empty), ``subject``, ``seq`` and ``time`` (RFC 3339,
    to exact nanoseconds). Raises :class:`ApiUnavailable` for a reply that is not such a message."""
    try:
        block = raw.get("hdrs")
        data = raw.get("data")
        return OriginMessage(
            seq=int(raw["seq"]),
            subject=str(raw["subject"]),
            headers=parse_header_block(base64.b64decode(block, validate=True)) if block else None,
            payload=base64.b64decode(data, validate=True) if data else b"",
            timestamp_ns=parse_rfc3339_ns(str(raw["time"])),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
        raise ApiUnavailable(f"{subject}: undecodable message {str(raw)[:200]}") from exc


def server_level(info: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """The JetStream API level and the version of the server that answered a ``STREAM.INFO`` (``_nats.level``,
    ``_nats.ver`` in the config's metadata, which servers since 2.11 add to every reply; ``(None, None)`` from
    an older one)."""
    metadata = (info.get("config") or {}).get("metadata") or {}
    level = str(metadata.get("_nats.level", ""))
    version = metadata.get("_nats.ver")
    return (int(level) if level.isascii() and level.isdigit() else None), (str(version) if version else None)


async def request_json(
    nc: NATS, subject: str, payload: bytes, timeout: float, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """One request whose reply is a JetStream JSON document (an API reply or a publish ack), errors mapped once:
    a publish or reply inbox the server denied is :class:`PermissionDenied` (at once: :mod:`bridge.io.permissions`),
    no reply :class:`ApiTimeout`, no responder or a broken connection :class:`ApiUnavailable`, an ``error`` in the
    reply :class:`ApiError` with the server's codes."""
    with permissions.request_watch(nc, subject):
        try:
            msg = await nc.request(subject, payload, timeout=timeout, headers=headers)
        except NatsTimeoutError as exc:
            raise ApiTimeout(f"no reply to {subject} within {timeout:g}s") from exc
        except NoRespondersError as exc:
            raise _no_responder(subject) from exc
        except Exception as exc:  # connection closed/reconnecting and friends
            raise ApiUnavailable(f"{subject}: {describe(exc)}") from exc
    return reply_document(subject, msg.data)


def _no_responder(subject: str) -> ApiUnavailable:
    return ApiUnavailable(f"no JetStream responder for {subject} (is JetStream enabled, domain right?)")


def reply_document(subject: str, data: bytes) -> dict[str, Any]:
    """The JSON document of a reply to ``subject``; an ``error`` in it raised as :class:`ApiError`, an undecodable
    one as :class:`ApiUnavailable`."""
    try:
        reply: dict[str, Any] = json.loads(data) if data else {}
    except ValueError as exc:
        raise ApiUnavailable(f"{subject}: undecodable reply {data[:100]!r}") from exc
    err = reply.get("error")
    if err:
        raise ApiError(subject, int(err.get("code", 0)), int(err.get("err_code", 0)), str(err.get("description")))
    return reply


# what a request's reply is handed to: the document, or why there is none
Answered = Callable[[dict[str, Any] | None, BridgeError | None], None]


# how nats-server writes the start of a STREAM.INFO reply's state (Go's encoding/json: fields in their struct's order,
# no spaces); a JSON string cannot hold it unescaped, so it is the document's own "state" object
_STATE_START = b'"state":{"messages":'
_STREAM_STATE = re.compile(re.escape(_STATE_START) + rb'(\d+),"bytes":\d+,"first_seq":(\d+)[,}]')


def quick_stream_state(data: bytes) -> dict[str, Any] | None:
    """``{"state": {"messages": m, "first_seq": f}}`` read from a ``STREAM.INFO`` reply's bytes without decoding
    the rest (its configuration and cluster: a look for stranded messages needs two numbers, and a thousand
    sources make a thousand looks after a start or a storm); None for any other form (an error reply, another
    server's field order): decode it whole."""
    at = data.find(_STATE_START)
    if at < 0 or b'"error"' in data:
        return None
    match = _STREAM_STATE.match(data, at)
    if match is None:
        return None
    return {"state": {"messages": int(match.group(1)), "first_seq": int(match.group(2))}}


def request_soon(
    nc: Any,
    subject: str,
    timeout: float,
    answered: Answered,
    payload: bytes = b"",
    header_block: bytes = b"",
    quick: Callable[[bytes], dict[str, Any] | None] | None = None,
) -> bool:
    """Send a request to ``subject`` (``payload``, and ``header_block`` when not empty: a ``NATS/1.0`` block)
    without a task or an await: written at the end of this event-loop pass (``wire.write_soon``), its reply taken by
    nats-py's own request inbox and handed to ``answered`` as :func:`request_json` would return or raise it (no reply
    within ``timeout``: :class:`ApiTimeout`). False, and nothing sent, when the connection is not up or nats-py's
    internals are not the expected ones (then :func:`request_json`). ``quick``, when given, reads the fields its
    caller needs from the reply's bytes (None when it cannot: then the reply is decoded whole, errors included).

    Through nats-py's ``request`` one look for stranded messages (a ``STREAM.INFO``) cost a task, its future's
    timeout and the reply's wake-ups, about 550k instructions; so sent it costs about 210k, and a process that
    starts, or comes back from a storm, makes one per source within seconds. No permission watch: a request the
    server denies shows as no reply, for requests whose failure is only retried later."""
    prefix = getattr(nc, "_resp_sub_prefix", None)  # nats-py's request inbox, subscribed at its first request
    responses = getattr(nc, "_resp_map", None)
    nuid = getattr(nc, "_nuid", None)
    if not prefix or not isinstance(responses, dict) or nuid is None or not wire.has_raw_writes(nc):
        return False
    if not nc.is_connected or nc._transport is None:
        return False
    loop = asyncio.get_running_loop()
    token = bytes(nuid.next()).decode()  # what nats-py's inbox handler looks the reply's future up by
    future: asyncio.Future[Any] = loop.create_future()
    responses[token] = future
    timer = loop.call_later(timeout, future.cancel)

    def replied(done: asyncio.Future[Any]) -> None:
        timer.cancel()
        responses.pop(token, None)
        if done.cancelled():
            answered(None, ApiTimeout(f"no reply to {subject} within {timeout:g}s"))
            return
        msg = done.result()
        if (msg.headers or {}).get("Status") == NO_RESPONDERS:
            answered(None, _no_responder(subject))
            return
        document = quick(msg.data) if quick is not None else None
        if document is None:
            try:
                document = reply_document(subject, msg.data)
            except BridgeError as exc:
                answered(None, exc)
                return
        answered(document, None)

    future.add_done_callback(replied)
    reply = bytes(prefix) + token.encode()
    if header_block:
        command = b"HPUB %s %s %d %d\r\n" % (
            subject.encode(),
            reply,
            len(header_block),
            len(header_block) + len(payload),
        )
        wire.write_soon(nc, command + header_block + payload + b"\r\n")
    else:
        wire.write_soon(nc, b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply, len(payload), payload))
    return True
