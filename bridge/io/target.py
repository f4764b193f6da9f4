"""Publishing to the aggregate with pipelined publish acks counted on one wildcard inbox per source.

nats-py's ``js.publish`` awaits one future per message (~6k msg/s) and ``publish_async`` still allocates one
(~25-40k msg/s, docs/protocol.md section 9). Here each publish carries the reply subject ``<inbox>.<order>.<attempt>``
and one subscription on ``<inbox>.>`` hands every ack to the engine by those two numbers: no future, no await
per message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridge.core.frames import Frame
from bridge.core.headers import encode_header_block
from bridge.core.pipeline import BATCH_COMMIT_EOB
from bridge.core.targetwire import AckOutcome, Publication, encode_publishes, parse_pub_acks, reply_subject
from bridge.errors import TargetUnavailable
from bridge.io import wire
from bridge.io.connect import describe


class SourcePublisher:
    """Publishes one source's messages and hands their acks to ``on_outcomes``, all those of one read together."""

    def __init__(
        self,
        nc: NATS,
        on_outcomes: Callable[[Sequence[AckOutcome]], None],
        fence: Callable[[], bool] | None = None,
    ) -> None:
        self._nc = nc
        self._on_outcomes = on_outcomes
        self._fence = fence  # the source's lease fence: its writes are dropped if it closed before they leave
        self._arrived: list[Frame] = []  # the acks of the read being parsed (wire.add_sink)
        self._inbox = nc.new_inbox()
        self._inbox_bytes = self._inbox.encode()
        # fast batch ids are <this>-<number>: the inbox's own unique token (nuid) keeps them unique on the stream
        self._batch_base = self._inbox.rpartition(".")[2]
        self._batch_base_bytes = self._batch_base.encode()
        self._prefix_len = len(self._inbox) + 1
        self._sub: Subscription | None = None
        self._raw = wire.has_raw_writes(nc)

    @property
    def epoch(self) -> int:
        """nats-py's count of reconnections: it rises before nats-py writes anything on the new connection, and
        before it tells the bridge (after a round trip), so a publish made meanwhile can still check it."""
        return int(self._nc.stats.get("reconnects", 0))

    @property
    def acks_subject(self) -> str:
        """The subscription the publish acks come to (``<inbox>.>``)."""
        return f"{self._inbox}.>"

    async def start(self) -> None:
        """Subscribe the ack inbox (before the first publish); raises ``TargetUnavailable`` when it cannot."""
        try:
            self._sub = await wire.subscribe_sink(
                self._nc,
                self.acks_subject,
                self._arrived,
                self._hand_over,  # after each read that brought acks
                self._handle,
                self._on_early,
                pending_msgs_limit=1_000_000,
                pending_bytes_limit=256 * 1024 * 1024,
            )
        except Exception as exc:  # nats-py's own errors (closed, outbound buffer full while reconnecting)
            raise TargetUnavailable(f"cannot subscribe to the publish acks: {describe(exc)}") from exc

    async def stop(self) -> None:
        if self._sub is not None:
            wire.remove_handler(self._nc, self._sub)
            # the connection may be closed already; nothing is left to release then
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _handle(self, msg: Msg) -> None:
        # nats-py's own dispatch, used only where the wire parser could not be installed (see bridge.io.wire)
        self._on_early([msg])

    def _on_early(self, msgs: list[Msg]) -> None:
        """Acks nats-py parsed itself (no wire parser, or before the sink was registered), in order."""
        frames: list[Frame] = [
            (
                m.subject.encode("utf-8", "surrogateescape"),
                b"",
                encode_header_block(m.headers) if m.headers else None,
                m.data,
            )
            for m in msgs
        ]
        outcomes = self._outcomes(frames)
        if outcomes:
            self._on_outcomes(outcomes)

    def _outcomes(self, frames: Sequence[Frame]) -> list[AckOutcome]:
        """What the acks of one read say, in order (a subclass may judge more)."""
        return parse_pub_acks(frames, self._prefix_len)

    def _hand_over(self) -> None:
        frames = wire.take(self._arrived)
        if frames:
            outcomes = self._outcomes(frames)
            if outcomes:
                self._on_outcomes(outcomes)

    async def publish(self, batch: Sequence[Publication]) -> list[tuple[int, int, str]]:
        """Send ``(message, order, attempt)`` publishes, in order; return ``(order, attempt, why)`` for each one
        that could not be handed to the connection (the rest are on their way; their acks come to ``on_outcomes``).
        """
        done = self.write_now(batch)
        if done is not None:
            return done
        if self._raw:
            return await self._publish_buffered(batch)
        failures: list[tuple[int, int, str]] = []
        for publication in batch:
            message, order, attempt, number, _, op, _ = publication
            reply = reply_subject(self._inbox, self._batch_base, publication)
            try:
                if number and op == BATCH_COMMIT_EOB:
                    await self._nc.publish(message.subject, b"", reply=reply)
                else:
                    await self._nc.publish(message.subject, message.payload, reply=reply, headers=message.headers)
            except Exception as exc:  # MaxPayload, not connected, closed, bad header: the engine retries all alike
                failures.append((order, attempt, _send_failure(exc, len(message.payload))))
        return failures

    def write_now(self, batch: Sequence[Publication]) -> list[tuple[int, int, str]] | None:
        """Like :meth:`publish`, without waiting: None when that is not possible now (nats-py's internals are not
        the expected ones), and then nothing was sent."""
        if not self._raw:
            return None
        nc: Any = self._nc
        why = "target connection closed" if nc.is_closed else "" if nc.is_connected else "target not connected"
        if why:
            return [(order, attempt, why) for _, order, attempt, _, _, _, _ in batch]
        if nc._transport is None:
            return None
        # into the socket at the end of this event-loop pass, behind whatever nats-py has not written yet, sooner
        # than through nats-py's flusher task (latency at low rates)
        data, failures = self._encode(batch, nc.max_payload)
        if data:
            wire.write_soon(nc, data, self._fence)  # with every other source's of this read: one write
        return failures

    async def _publish_buffered(self, batch: Sequence[Publication]) -> list[tuple[int, int, str]]:
        # behind whatever nats-py still has to write: appended to its buffer, written by its flusher task
        nc: Any = self._nc
        data, failures = self._encode(batch, nc.max_payload)
        if data:
            wire.flush_writes(nc)  # what this pass wrote straight to the socket goes first
            try:
                await nc._send_command(data)
                if nc._flush_queue is not None and nc._flush_queue.empty():
                    await nc._flush_pending()
            except Exception as exc:  # e.g. the outbound buffer is full while reconnecting: the engine retries
                why = _send_failure(exc, len(data))
                sent = {(order, attempt) for order, attempt, _ in failures}
                failures += [
                    (order, attempt, why) for _, order, attempt, _, _, _, _ in batch if (order, attempt) not in sent
                ]
        return failures

    def _encode(self, batch: Sequence[Publication], limit: int) -> tuple[bytes, list[tuple[int, int, str]]]:
        # nats-py's own publish does what this does plus, per message, subject validation and a regex check,
        # strip and translate of every header: about a sixth of the bridge's CPU per message. Our subjects and
        # headers are valid by construction (they came off the wire or from the validated configuration), and the
        # header block was encoded once, by the engine. A batch becomes one write.
        return encode_publishes(self._inbox_bytes, batch, limit, self._batch_base_bytes)


def _send_failure(exc: Exception, size: int) -> str:
    """Why nats-py could not take a publish of ``size`` bytes, said the way the engine reports publish errors."""
    name = type(exc).__name__
    if name == "MaxPayloadError":
        return f"message of {size} bytes exceeds the target server's max_payload"
    if name == "OutboundBufferLimitError":
        return "target not connected"
    return describe(exc)
