"""Publishing to the aggregate with pipelined publish acks counted on one wildcard inbox per source.

nats-py's ``js.publish`` awaits one future per message (~6k msg/s) and ``publish_async`` still allocates one
(~25-40k msg/s, protocol.md section 9). Here each publish carries the reply subject ``<inbox>.<order>.<attempt>``
and one subscription on ``<inbox>.>`` hands every ack to the engine by those two numbers: no future, no await
per message.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridge.io.connect import describe


@dataclass(frozen=True, slots=True)
class AckOutcome:
    """What the target answered to one publish attempt."""

    order: int
    attempt: int
    stored: bool
    duplicate: bool = False
    error: str = ""


def parse_pub_ack(subject_tail: str, msg: Msg) -> AckOutcome | None:
    """Interpret the reply to one publish (``subject_tail`` is ``<order>.<attempt>``)."""
    try:
        order_s, attempt_s = subject_tail.split(".", 1)
        order, attempt = int(order_s), int(attempt_s)
    except ValueError:
        return None
    data = msg.data
    if data.startswith(b'{"stream":') and b'"seq":' in data and b'"error"' not in data and b'"duplicate"' not in data:
        # the common case, a plain success: no JSON decode on the hot path (anything else takes the full path)
        return AckOutcome(order, attempt, True)
    headers = msg.headers
    if not msg.data:
        status = headers.get("Status", "") if headers else ""
        if status == "503":
            return AckOutcome(order, attempt, False, error="no responders: the target stream does not exist here")
        return AckOutcome(order, attempt, False, error=f"empty publish ack (status {status or 'none'})")
    try:
        body = json.loads(msg.data)
    except ValueError:
        return AckOutcome(order, attempt, False, error=f"undecodable publish ack {msg.data[:80]!r}")
    err = body.get("error")
    if err:
        text = f"{err.get('description', 'error')} (code {err.get('code')}, err_code {err.get('err_code')})"
        return AckOutcome(order, attempt, False, error=text)
    if body.get("seq") is None:
        return AckOutcome(order, attempt, False, error=f"publish ack without seq: {body!r}"[:200])
    return AckOutcome(order, attempt, True, duplicate=bool(body.get("duplicate")))


class SourcePublisher:
    """Publishes one source's messages and routes their acks to ``on_outcome``."""

    def __init__(self, nc: NATS, on_outcome: Callable[[AckOutcome], None]) -> None:
        self._nc = nc
        self._on_outcome = on_outcome
        self._inbox = nc.new_inbox()
        self._prefix_len = len(self._inbox) + 1
        self._sub: Subscription | None = None
        self._raw = _has_raw_path(nc)

    async def start(self) -> None:
        """Subscribe the ack inbox (before the first publish)."""
        self._sub = await self._nc.subscribe(
            f"{self._inbox}.>", cb=self._handle, pending_msgs_limit=1_000_000, pending_bytes_limit=256 * 1024 * 1024
        )

    async def stop(self) -> None:
        if self._sub is not None:
            # the connection may be closed already; nothing is left to release then
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _handle(self, msg: Msg) -> None:
        outcome = parse_pub_ack(msg.subject[self._prefix_len :], msg)
        if outcome is not None:
            self._on_outcome(outcome)

    async def publish(
        self, subject: str, headers: dict[str, str], payload: bytes, order: int, attempt: int
    ) -> str | None:
        """Send one publish; return None when it was handed to the connection, else why it could not be."""
        reply = f"{self._inbox}.{order}.{attempt}"
        if self._raw:
            return await self._publish_raw(subject, reply, headers, payload)
        try:
            await self._nc.publish(subject, payload, reply=reply, headers=headers)
        except Exception as exc:  # MaxPayload, not connected, closed, bad header: the engine retries all alike
            name = type(exc).__name__
            if name == "MaxPayloadError":
                return f"message of {len(payload)} bytes exceeds the target server's max_payload"
            if name == "OutboundBufferLimitError":
                return "target not connected"
            return describe(exc)
        return None

    async def _publish_raw(self, subject: str, reply: str, headers: dict[str, str], payload: bytes) -> str | None:
        # nats-py's own publish does exactly this plus, per message, subject validation and a regex check,
        # strip and translate of every header: about a sixth of the bridge's CPU per message. Our subjects and
        # headers are valid by construction (they came off the wire or from the validated configuration).
        nc: Any = self._nc
        if nc.is_closed:
            return "target connection closed"
        if not nc.is_connected:
            return "target not connected"
        if len(payload) > nc.max_payload:  # nats-py's check (the pipeline has already checked headers + payload)
            return f"message of {len(payload)} bytes exceeds the target server's max_payload"
        await nc._send_command(hpub_command(subject, reply, headers, payload))
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()
        return None


def hpub_command(subject: str, reply: str, headers: dict[str, str], payload: bytes) -> bytes:
    """The ``HPUB`` protocol line, header block and payload of one publish, as nats-py would write them."""
    block = ("NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
        subject.encode(),
        reply.encode(),
        len(block),
        len(block) + len(payload),
        block,
        payload,
    )


def _has_raw_path(nc: Any) -> bool:
    """Whether this nats-py client has the internals :meth:`SourcePublisher._publish_raw` writes through."""
    return all(hasattr(nc, name) for name in ("_send_command", "_flush_queue", "_flush_pending", "max_payload"))
