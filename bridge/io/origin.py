"""The origin side of one source over nats-py: its connection, stream, consumer and deliver subject.

``OriginClient`` is the production ``bridge.runtime.ports.OriginPort``. It maps nats-py and JetStream API
failures into ``bridge.errors`` here, once, so the runner never sees a nats-py exception.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridge.config import SourceConfig
from bridge.core import inbound
from bridge.core.effects import AnswerFlowControl, ResetReply
from bridge.core.headers import parse_header_block
from bridge.errors import OriginUnavailable
from bridge.io import wire
from bridge.io.connect import Callback, ErrorCallback, describe, open_connection
from bridge.io.consumer import ensure_consumer
from bridge.io.jsapi import ApiError, ApiTimeout, ApiUnavailable, JsApi
from bridge.runtime.ports import BoundConsumer, OriginStream

PENDING_BYTES = 512 * 1024 * 1024


class OriginClient:
    """One source's connection to its origin server."""

    def __init__(self, source: SourceConfig, timeout: float) -> None:
        self.source = source
        self.timeout = timeout  # for every API request (the engine's reset_timeout)
        self._nc: NATS | None = None
        self._api: JsApi | None = None
        self._sub: Subscription | None = None
        self._on_message: Callable[[inbound.Inbound], None] | None = None

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def connect(
        self,
        *,
        on_disconnected: Callback,
        on_reconnected: Callback,
        on_error: ErrorCallback,
        after_parse: Callable[[], None],
    ) -> None:
        if self._nc is not None:
            return
        src = self.source
        self._nc = await open_connection(
            src,
            name=f"nats-bridge source {src.name}",
            error_type=OriginUnavailable,
            on_disconnected=on_disconnected,
            on_reconnected=on_reconnected,
            on_error=on_error,
        )
        self._api = JsApi(self._nc, src.api_prefix)
        wire.add_after_parse(self._nc, after_parse)  # deliveries make publishes

    def _jsapi(self) -> JsApi:
        if self._api is None:
            raise OriginUnavailable("not connected to the origin")
        return self._api

    async def stream(self) -> OriginStream:
        stream = self.source.stream
        try:
            info = await self._jsapi().stream_info(stream, timeout=self.timeout)
        except ApiError as exc:
            raise OriginUnavailable(f"origin stream {stream!r}: {exc.description}") from exc
        except (ApiTimeout, ApiUnavailable) as exc:
            raise OriginUnavailable(f"origin stream {stream!r}: {exc}") from exc
        retention = info.get("config", {}).get("retention")
        return OriginStream(retention == "workqueue", int(info.get("state", {}).get("last_seq", 0)))

    async def bind(self) -> BoundConsumer:
        src = self.source
        info = await ensure_consumer(self._jsapi(), src, manage=src.manage_consumer, timeout=self.timeout)
        pending = info.get("num_pending")
        return BoundConsumer(
            created=info.get("created"),
            ack_floor=int(info.get("ack_floor", {}).get("stream_seq", 0)),
            num_pending=int(pending) if pending is not None else None,
        )

    async def reset(self, seq: int | None) -> ResetReply:
        src = self.source
        reply = await self._jsapi().reset_consumer(src.stream, src.consumer, timeout=self.timeout, seq=seq)
        try:
            reset_seq = int(reply["reset_seq"])
        except (KeyError, TypeError, ValueError) as exc:
            raise OriginUnavailable(f"CONSUMER.RESET reply without a reset_seq: {str(reply)[:200]}") from exc
        return ResetReply(reset_seq, reply.get("config", {}).get("ack_policy"), reply.get("created"))

    async def first_seq_from(self, start: int) -> int:
        src, api = self.source, self._jsapi()
        if src.filter_subjects:
            found = [await api.first_seq_from(src.stream, start, f, self.timeout) for f in src.filter_subjects]
            return min((seq for seq in found if seq), default=0)
        # the stream's first message (STREAM.INFO, which the bridge may use anyway)
        state = (await api.stream_info(src.stream, timeout=self.timeout)).get("state", {})
        first = int(state.get("first_seq", 0)) if int(state.get("messages", 0)) else 0
        return first if first >= start else 0

    async def subscribe(self, on_message: Callable[[inbound.Inbound], None]) -> bool:
        if self._nc is None or self._sub is not None:
            return self._sub is not None
        self._on_message = on_message
        # generous pending limits: the server never has more than max_ack_pending deliveries outstanding, and a
        # slow-consumer drop would only cost a reset
        limit = max(4 * self.source.max_ack_pending, 65536)
        try:
            self._sub = await self._nc.subscribe(
                self.source.deliver_subject,
                cb=self._on_msg,
                pending_msgs_limit=limit,
                pending_bytes_limit=PENDING_BYTES,
            )
        except Exception as exc:  # not connected: the next reset (silence) subscribes again
            raise OriginUnavailable(f"cannot subscribe to {self.source.deliver_subject}: {describe(exc)}") from exc
        wire.add_handler(self._nc, self._sub, self._on_wire)
        return True

    def _on_wire(self, subject: bytes, reply: bytes, header: bytes | None, payload: bytes) -> None:
        if self._on_message is not None:
            headers = parse_header_block(header) if header is not None else None
            self._on_message(inbound.classify(subject.decode(), reply.decode(), headers, payload))

    async def _on_msg(self, msg: Msg) -> None:
        # nats-py's own dispatch, used only where the wire parser could not be installed (see bridge.io.wire)
        if self._on_message is not None:
            self._on_message(inbound.classify(msg.subject, msg.reply, msg.headers, msg.data))

    async def unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            wire.remove_handler(self._nc, sub)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def detach(self) -> None:
        self._on_message = None
        if self._sub is not None:
            wire.remove_handler(self._nc, self._sub)

    async def answer(self, effect: AnswerFlowControl) -> None:
        if self._nc is None:
            raise OriginUnavailable("not connected to the origin")
        headers = (
            {"Nats-Last-Consumer": str(effect.last_consumer), "Nats-Last-Stream": str(effect.last_stream)}
            if effect.acks
            else None
        )
        try:
            await self._nc.publish(effect.subject, b"", headers=headers)
        except Exception as exc:
            raise OriginUnavailable(f"flow-control answer not sent: {describe(exc)}") from exc

    async def flush(self) -> None:
        if self._nc is not None and self._nc.is_connected:
            with contextlib.suppress(Exception):
                await self._nc.flush(timeout=1)

    async def close(self) -> None:
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()
