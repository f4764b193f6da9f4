"""Publishing to the aggregate with pipelined publish acks counted on one wildcard inbox per source.

nats-py's ``js.publish`` awaits one future per message (~6k msg/s) and ``publish_async`` still allocates one
(~25-40k msg/s, docs/protocol.md section 9). Here each publish carries the reply subject ``<inbox>.<order>.<attempt>``
and one subscription on ``<inbox>.>`` hands every ack to the engine by those two numbers: no future, no await
per message.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridge.core.headers import parse_header_block
from bridge.core.pipeline import OutboundMessage
from bridge.errors import TargetUnavailable
from bridge.io import wire
from bridge.io.connect import describe


@dataclass(slots=True)  # not frozen: a frozen dataclass costs ~1 µs more to build, per message
class AckOutcome:
    """What the target answered to one publish attempt."""

    order: int
    attempt: int
    stored: bool
    duplicate: bool = False
    error: str = ""


def parse_pub_ack(subject_tail: bytes, data: bytes, headers: Mapping[str, str] | None) -> AckOutcome | None:
    """Interpret the reply to one publish (``subject_tail`` is ``<order>.<attempt>``)."""
    order_s, dot, attempt_s = subject_tail.partition(b".")
    if not (dot and order_s.isdigit() and attempt_s.isdigit()):
        return None
    order, attempt = int(order_s), int(attempt_s)
    if data.startswith(b'{"stream":') and b'"seq":' in data and b'"error"' not in data and b'"duplicate"' not in data:
        # the common case, a plain success: no JSON decode on the hot path (anything else takes the full path)
        return AckOutcome(order, attempt, True)
    if not data:
        status = headers.get("Status", "") if headers else ""
        if status == "503":
            return AckOutcome(order, attempt, False, error="no responders: the target stream does not exist here")
        return AckOutcome(order, attempt, False, error=f"empty publish ack (status {status or 'none'})")
    try:
        body = json.loads(data)
    except ValueError:
        return AckOutcome(order, attempt, False, error=f"undecodable publish ack {data[:80]!r}")
    err = body.get("error")
    if err:
        text = f"{err.get('description', 'error')} (code {err.get('code')}, err_code {err.get('err_code')})"
        return AckOutcome(order, attempt, False, error=text)
    if body.get("seq") is None:
        return AckOutcome(order, attempt, False, error=f"publish ack without seq: {body!r}"[:200])
    return AckOutcome(order, attempt, True, duplicate=bool(body.get("duplicate")))


class SourcePublisher:
    """Publishes one source's messages and hands their acks to ``on_outcomes``, all those of one read together."""

    def __init__(self, nc: NATS, on_outcomes: Callable[[Sequence[AckOutcome]], None]) -> None:
        self._nc = nc
        self._on_outcomes = on_outcomes
        self._arrived: list[AckOutcome] = []  # acks of the read being parsed, handed over once it is parsed
        self._inbox = nc.new_inbox()
        self._inbox_bytes = self._inbox.encode()
        self._prefix_len = len(self._inbox) + 1
        self._sub: Subscription | None = None
        self._raw = _has_raw_path(nc)

    async def start(self) -> None:
        """Subscribe the ack inbox (before the first publish); raises ``TargetUnavailable`` when it cannot."""
        try:
            self._sub = await self._nc.subscribe(
                f"{self._inbox}.>",
                cb=self._handle,
                pending_msgs_limit=1_000_000,
                pending_bytes_limit=256 * 1024 * 1024,
            )
        except Exception as exc:  # nats-py's own errors (closed, outbound buffer full while reconnecting)
            raise TargetUnavailable(f"cannot subscribe to the publish acks: {describe(exc)}") from exc
        if wire.add_handler(self._nc, self._sub, self._handle_wire):
            wire.add_after_parse(self._nc, self._hand_over)

    async def stop(self) -> None:
        if self._sub is not None:
            wire.remove_handler(self._nc, self._sub)
            wire.remove_after_parse(self._nc, self._hand_over)
            # the connection may be closed already; nothing is left to release then
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _handle(self, msg: Msg) -> None:
        # nats-py's own dispatch, used only where the wire parser could not be installed (see bridge.io.wire)
        outcome = self._outcome(msg.subject.encode(), msg.data, msg.headers)
        if outcome is not None:
            self._on_outcomes((outcome,))

    def _handle_wire(self, subject: bytes, reply: bytes, header: bytes | None, payload: bytes) -> None:
        outcome = self._outcome(subject, payload, parse_header_block(header) if header is not None else None)
        if outcome is not None:
            self._arrived.append(outcome)

    def _outcome(self, subject: bytes, data: bytes, headers: Mapping[str, str] | None) -> AckOutcome | None:
        """What the ack on ``subject`` (``<inbox>.<order>.<attempt>``) says (a subclass may judge more)."""
        return parse_pub_ack(subject[self._prefix_len :], data, headers)

    def _hand_over(self) -> None:
        if self._arrived:
            arrived, self._arrived = self._arrived, []
            self._on_outcomes(arrived)

    async def publish(self, batch: Sequence[tuple[OutboundMessage, int, int]]) -> list[tuple[int, int, str]]:
        """Send ``(message, order, attempt)`` publishes, in order; return ``(order, attempt, why)`` for each one
        that could not be handed to the connection (the rest are on their way; their acks come to ``on_outcomes``).
        """
        done = self.write_now(batch)
        if done is not None:
            return done
        if self._raw:
            return await self._publish_buffered(batch)
        failures: list[tuple[int, int, str]] = []
        for message, order, attempt in batch:
            try:
                await self._nc.publish(
                    message.subject, message.payload, reply=f"{self._inbox}.{order}.{attempt}", headers=message.headers
                )
            except Exception as exc:  # MaxPayload, not connected, closed, bad header: the engine retries all alike
                failures.append((order, attempt, _send_failure(exc, len(message.payload))))
        return failures

    def write_now(self, batch: Sequence[tuple[OutboundMessage, int, int]]) -> list[tuple[int, int, str]] | None:
        """Like :meth:`publish`, without waiting: None when that is not possible now (nats-py has unwritten data,
        or its internals are not the expected ones), and then nothing was sent."""
        if not self._raw:
            return None
        nc: Any = self._nc
        why = "target connection closed" if nc.is_closed else "" if nc.is_connected else "target not connected"
        if why:
            return [(order, attempt, why) for _, order, attempt in batch]
        transport = nc._transport
        if nc._pending or transport is None:
            return None
        # nothing of nats-py's waits to be written, so these cannot overtake anything: straight into the socket's
        # buffer, an event-loop pass sooner than through nats-py's flusher task (latency at low rates)
        data, failures = self._encode(batch, nc.max_payload)
        if data:
            transport.write(data)
        return failures

    async def _publish_buffered(self, batch: Sequence[tuple[OutboundMessage, int, int]]) -> list[tuple[int, int, str]]:
        # behind whatever nats-py still has to write: appended to its buffer, written by its flusher task
        nc: Any = self._nc
        data, failures = self._encode(batch, nc.max_payload)
        if data:
            try:
                await nc._send_command(data)
                if nc._flush_queue is not None and nc._flush_queue.empty():
                    await nc._flush_pending()
            except Exception as exc:  # e.g. the outbound buffer is full while reconnecting: the engine retries
                why = _send_failure(exc, len(data))
                sent = {(order, attempt) for order, attempt, _ in failures}
                failures += [(order, attempt, why) for _, order, attempt in batch if (order, attempt) not in sent]
        return failures

    def _encode(
        self, batch: Sequence[tuple[OutboundMessage, int, int]], limit: int
    ) -> tuple[bytes, list[tuple[int, int, str]]]:
        # nats-py's own publish does what this does plus, per message, subject validation and a regex check,
        # strip and translate of every header: about a sixth of the bridge's CPU per message. Our subjects and
        # headers are valid by construction (they came off the wire or from the validated configuration), and the
        # header block was encoded once, by the engine. A batch becomes one write.
        return encode_publishes(self._inbox_bytes, batch, limit)


def encode_publishes(
    inbox: bytes, batch: Sequence[tuple[OutboundMessage, int, int]], limit: int
) -> tuple[bytes, list[tuple[int, int, str]]]:
    """The ``HPUB`` commands of ``(message, order, attempt)`` publishes, replying to ``<inbox>.<order>.<attempt>``,
    as one write and exactly as nats-py would write each; and ``(order, attempt, why)`` for those larger than
    ``limit`` (the server's ``max_payload``), which are left out."""
    failures: list[tuple[int, int, str]] = []
    commands: list[bytes] = []
    for message, order, attempt in batch:
        payload = message.payload
        if len(payload) > limit:  # nats-py's check (the pipeline has already checked headers + payload)
            failures.append(
                (order, attempt, f"message of {len(payload)} bytes exceeds the target server's max_payload")
            )
            continue
        block = message.header_block
        size = len(block)
        commands.append(
            b"HPUB %s %s.%d.%d %d %d\r\n%s%s\r\n"
            % (message.subject.encode(), inbox, order, attempt, size, size + len(payload), block, payload)
        )
    return (commands[0] if len(commands) == 1 else b"".join(commands)), failures


def _send_failure(exc: Exception, size: int) -> str:
    """Why nats-py could not take a publish of ``size`` bytes, said the way the engine reports publish errors."""
    name = type(exc).__name__
    if name == "MaxPayloadError":
        return f"message of {size} bytes exceeds the target server's max_payload"
    if name == "OutboundBufferLimitError":
        return "target not connected"
    return describe(exc)


def _has_raw_path(nc: Any) -> bool:
    """Whether this nats-py client has the internals :meth:`SourcePublisher.write_now` writes through."""
    return all(
        hasattr(nc, name)
        for name in ("_send_command", "_flush_queue", "_flush_pending", "_pending", "_transport", "max_payload")
    )
