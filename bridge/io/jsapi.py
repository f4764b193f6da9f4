"""The few JetStream API calls the bridge makes, as plain requests on a core connection.

Plain requests (not nats-py's JetStream context) keep the API prefix explicit (``$JS.API`` or
``$JS.<domain>.API``: across a leaf link only the domain form reaches the leaf, docs/protocol.md section 6), keep
``pedantic`` creates possible, and keep every error in the bridge's own types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from bridge.errors import ApiError, ApiTimeout, ApiUnavailable
from bridge.io.connect import describe

__all__ = [
    "CONSUMER_EXISTS",
    "CONSUMER_NOT_FOUND",
    "STREAM_NAME_IN_USE",
    "STREAM_NOT_FOUND",
    "ApiError",
    "ApiTimeout",
    "ApiUnavailable",
    "JsApi",
]

# err_code values the bridge reacts to (nats-server server/errors.json)
STREAM_NOT_FOUND = 10059
CONSUMER_NOT_FOUND = 10014
STREAM_NAME_IN_USE = 10058  # a stream create met an existing stream with another configuration
CONSUMER_EXISTS = 10148  # a create-only consumer create met an existing durable with another configuration


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

    async def consumer_info(self, stream: str, consumer: str, timeout: float = 5.0) -> dict[str, Any]:
        return await self.request(f"CONSUMER.INFO.{stream}.{consumer}", None, timeout)

    async def create_consumer(
        self, stream: str, config: dict[str, Any], *, pedantic: bool = True, timeout: float = 5.0
    ) -> dict[str, Any]:
        """Create or update a durable (``CONSUMER.CREATE.<stream>.<name>``); pedantic: the server forces nothing."""
        body: dict[str, Any] = {"stream_name": stream, "config": config}
        if pedantic:
            body["pedantic"] = True
        return await self.request(f"CONSUMER.CREATE.{stream}.{config['durable_name']}", body, timeout)

    async def add_consumer(self, stream: str, config: dict[str, Any], *, timeout: float = 5.0) -> dict[str, Any]:
        """Create a durable, never update one: ``action: create`` (and pedantic). An existing durable with the same
        configuration is answered as created; with another one the server refuses (:data:`CONSUMER_EXISTS`)."""
        body: dict[str, Any] = {"stream_name": stream, "config": config, "action": "create", "pedantic": True}
        return await self.request(f"CONSUMER.CREATE.{stream}.{config['durable_name']}", body, timeout)

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
        try:
            reply = await self.request(
                f"STREAM.MSG.GET.{stream}", {"seq": start, "next_by_subj": subject_filter}, timeout
            )
        except ApiError as exc:
            if exc.code == 404:
                return 0
            raise
        return int(reply.get("message", {}).get("seq", 0))


async def request_json(
    nc: NATS, subject: str, payload: bytes, timeout: float, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """One request whose reply is a JetStream JSON document (an API reply or a publish ack), errors mapped once:
    no reply is :class:`ApiTimeout`, no responder or a broken connection :class:`ApiUnavailable`, an ``error``
    in the reply :class:`ApiError` with the server's codes."""
    try:
        msg = await nc.request(subject, payload, timeout=timeout, headers=headers)
    except NatsTimeoutError as exc:
        raise ApiTimeout(f"no reply to {subject} within {timeout:g}s") from exc
    except NoRespondersError as exc:
        raise ApiUnavailable(f"no JetStream responder for {subject} (is JetStream enabled, domain right?)") from exc
    except Exception as exc:  # connection closed/reconnecting and friends
        raise ApiUnavailable(f"{subject}: {describe(exc)}") from exc
    try:
        reply: dict[str, Any] = json.loads(msg.data) if msg.data else {}
    except ValueError as exc:
        raise ApiUnavailable(f"{subject}: undecodable reply {msg.data[:100]!r}") from exc
    err = reply.get("error")
    if err:
        raise ApiError(subject, int(err.get("code", 0)), int(err.get("err_code", 0)), str(err.get("description")))
    return reply
