"""The origin side of one source over nats-py: its connection, stream, consumer, and the deliver subject
(flow-control mode) or the pull requests' inbox (pull mode).

``OriginClient`` is the production ``bridge.ports.OriginPort``. It maps nats-py and JetStream API
failures into ``bridge.errors`` here, once, so the runner never sees a nats-py exception: what cannot be sent or
read for want of a connection is ``OriginUnavailable``; an API request answered with an error, or not answered,
is ``ApiError``/``ApiTimeout``/``ApiUnavailable`` where the caller tells those apart (``reset``, ``anchor``,
``fetch``, ``first_seq_from``), ``OriginUnavailable`` where it does not (``stream``, ``consumer_kind``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import anyio
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from bridge.config import SourceConfig
from bridge.core import frames, inbound
from bridge.core.effects import (
    AnswerFlowControl,
    BoundConsumer,
    OriginMessage,
    OriginStream,
    Pull,
    PullAnchor,
    ResetReply,
)
from bridge.core.modes import ConsumerKind, Mode
from bridge.errors import BridgeError, ConsumerUnfit, OriginUnavailable
from bridge.io import wire
from bridge.io.connect import describe
from bridge.io.consumer import (
    bound_consumer,
    consumer_filters,
    consumer_kind,
    ensure_consumer,
    several_filters_problem,
)
from bridge.io.jsapi import ApiError, ApiTimeout, ApiUnavailable, JsApi, server_level
from bridge.io.shared import Member, OriginConnections, names_source
from bridge.io.start import APPLIED, CopiesExist, creation_fields, deliver_fields, start_seq_of
from bridge.ports import Callback, ErrorCallback, Gate, Receiver

PENDING_BYTES = 512 * 1024 * 1024


class OriginClient:
    """One source's side of its origin connection: its subscriptions, requests, answers and acks.

    The connection itself is shared with the process's other sources that reach the same servers with the same
    credentials (``connections``, ``bridge.io.shared``); without ``connections`` it is one of the source's own.
    """

    def __init__(
        self,
        source: SourceConfig,
        timeout: float,
        mode: Mode = Mode.FLOW_CONTROL,
        connections: OriginConnections | None = None,
    ) -> None:
        self.source = source
        self.timeout = timeout  # for every API request (the engine's reset_timeout)
        self.mode = mode  # set by the runner once chosen, before bind (bridge.core.modes)
        # whether the aggregate holds copies of this source (the runner's), asked before a start position is applied
        self.copies_exist: CopiesExist | None = None
        self.fence: Callable[[], bool] | None = None  # the source's lease fence (the runner's): see answer_now
        self._stream: OriginStream | None = None  # what stream() last read of the origin stream
        pool = connections if connections is not None else OriginConnections()
        self._shared = pool.for_settings(source)
        self._member: Member | None = None
        self._nc: NATS | None = None
        self._raw = False  # nats-py has the internals flow-control answers are written through (wire.has_raw_writes)
        self._api: JsApi | None = None
        self._sub: Subscription | None = None
        self._filters: list[str] = source.consumer_filters  # the consumer's, once bound
        self._inbox = ""  # pull mode: the subscribed inbox, the reply subject of every pull request
        # what takes the deliveries: the wire parser appends those of a read to its sink (wire.add_sink) and calls its
        # read() once the read is parsed
        self._receiver: Receiver | None = None

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    def reading_behind(self) -> bool:
        """Whether this source's connection holds a backlog not read yet (``bridge.io.wire.reading_behind``)."""
        return self._nc is not None and wire.reading_behind(self._nc)

    @property
    def inbox(self) -> str:
        """Pull mode: the inbox of the current subscription, which every pull request names ("" when none)."""
        return self._inbox

    async def connect(
        self,
        *,
        on_disconnected: Callback,
        on_reconnected: Callback,
        on_error: ErrorCallback,
        on_connection_error: Callable[[Exception], None] | None = None,
    ) -> None:
        if self._nc is not None:
            return
        src = self.source
        member = Member(src.name, on_disconnected, on_reconnected, on_error, self._claims, on_connection_error)
        self._nc = await self._shared.join(member)
        self._member = member
        self._api = JsApi(self._nc, src.api_prefix)
        self._raw = wire.has_raw_writes(self._nc)

    def _claims(self, text: str) -> bool:
        """Whether a connection error's text is about this source (``bridge.io.shared.names_source``)."""
        src = self.source
        return names_source(
            text,
            deliver_subject=src.deliver_subject if self.mode is Mode.FLOW_CONTROL else "",
            inbox=self._inbox,
            api_prefix=src.api_prefix,
            stream=src.stream,
            consumer=src.consumer,
        )

    def _jsapi(self) -> JsApi:
        if self._api is None:
            raise OriginUnavailable("not connected to the origin")
        return self._api

    async def stream(self, slot: Gate = contextlib.nullcontext) -> OriginStream:
        stream = self.source.stream
        try:
            directory = self._shared.directory(self.source.api_prefix)
            info = await directory.info(self._jsapi(), stream, self.timeout, slot)
        except (ApiError, ApiTimeout, ApiUnavailable) as exc:
            raise _unavailable(f"origin stream {stream!r}", exc) from exc
        retention = info.get("config", {}).get("retention")
        level, version = server_level(info)
        self._stream = OriginStream(
            retention == "workqueue", int(info.get("state", {}).get("last_seq", 0)), api_level=level, version=version
        )
        return self._stream

    async def consumer_kind(self) -> ConsumerKind | None:
        src = self.source
        try:
            info = await self._jsapi().find_consumer(src.stream, src.consumer, timeout=self.timeout)
        except (ApiError, ApiTimeout, ApiUnavailable) as exc:
            raise _unavailable(f"consumer {src.stream}/{src.consumer}", exc) from exc
        return consumer_kind(info) if info is not None else None

    async def bind(self) -> BoundConsumer:
        src, api = self.source, self._jsapi()
        problem = several_filters_problem(src, self._stream.api_level) if self._stream is not None else None
        if problem is not None:
            raise ConsumerUnfit(problem)
        deliver, note = None, ""
        if src.manage_consumer and src.start_position != "all":
            deliver, note = await creation_fields(api, src, self.mode, self.timeout, self.copies_exist)
        info = await ensure_consumer(
            api, src, manage=src.manage_consumer, timeout=self.timeout, mode=self.mode, deliver=deliver
        )
        self._filters = consumer_filters(info)
        start_seq = start_seq_of(info)
        bound = bound_consumer(info)
        if (
            start_seq > 1
            and self.mode is Mode.FLOW_CONTROL
            and info.get("config", {}).get("deliver_policy") == "all"
            and bound.delivered is not None
            and bound.delivered[1] == 0
            and bound.ack_floor < start_seq - 1
        ):
            # a WorkQueue start (deliver all): the consumer never delivered (just created, or a crash came before
            # this reset)
            info = await api.reset_consumer(src.stream, src.consumer, self.timeout, seq=start_seq)
            bound = bound_consumer(info)
        return replace(bound, start_seq=start_seq, start_note=note, started=note.startswith(APPLIED))

    async def set_rate_limit(self, rate_limit: int) -> None:
        # pull mode paces its requests instead: its consumer has no rate limit
        await self._update_consumer(self.mode is Mode.FLOW_CONTROL, rate_limit=rate_limit)

    async def set_window(self, max_ack_pending: int) -> None:
        # pull mode's window is the requests in flight, at most the consumer's max_ack_pending (never lowered)
        await self._update_consumer(True, max_ack_pending=max(max_ack_pending, self.source.max_ack_pending))

    async def _update_consumer(self, consumer: bool, **settings: int) -> None:
        """Take ``settings`` into the source's configuration (later binds keep them) and, when they are the
        ``consumer``'s and it is managed, into the consumer now (an update, never a create: a consumer an operator
        deleted is not brought back behind the engine's back, whose discontinuity rules would then meet deliveries
        numbered from 1 again and reset for another client's act)."""
        self.source = src = self.source.model_copy(update=settings)
        if not (consumer and src.manage_consumer):
            return
        api, deliver = self._jsapi(), None
        if src.start_position != "all":
            # the consumer's own deliver fields (an update cannot change them); without a consumer the update is
            # refused: no start to work out
            found = await api.find_consumer(src.stream, src.consumer, timeout=self.timeout)
            deliver = deliver_fields(found) if found is not None else None
        await ensure_consumer(
            api, src, manage=True, timeout=self.timeout, mode=self.mode, deliver=deliver, update_only=True
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
        if self._filters:
            found = [await api.first_seq_from(src.stream, start, f, self.timeout) for f in self._filters]
            return min((seq for seq in found if seq), default=0)
        # the stream's first message (STREAM.INFO, which the bridge may use anyway)
        return _first_in(await api.stream_info(src.stream, timeout=self.timeout), start)

    def first_seq_soon(self, start: int, looked: Callable[[int, str | None], None]) -> bool:
        """:meth:`first_seq_from` without a task (``JsApi.stream_info_soon``): ``looked(first, None)``, or
        ``looked(0, why)`` when the origin could not say. False, and nothing sent, when not possible now, or with
        filters (a request per filter): then :meth:`first_seq_from`."""
        api = self._api
        if self._filters or api is None:
            return False

        def answered(info: dict[str, Any] | None, error: BridgeError | None) -> None:
            if info is None:
                looked(0, str(error))
            else:
                looked(_first_in(info, start), None)

        return api.stream_info_soon(self.source.stream, self.timeout, answered, state_only=True)

    async def subscribe(self, receiver: Receiver) -> bool:
        if self._nc is None:
            return False
        if self.mode is Mode.PULL:
            # a fresh inbox each time: what the requests of an earlier subscription still bring (the server drops
            # a waiting request once it sees nobody listens to its inbox, but not before) goes to a subject nobody
            # listens to, never into this epoch
            await self.unsubscribe()
            subject = self._nc.new_inbox()
        elif self._sub is not None:
            return True
        else:
            subject = self.source.deliver_subject
        self._receiver = receiver
        receiver.sink.clear()  # anything of an earlier subscription not handed over yet is not this one's
        # generous pending limits: the server never has more than max_ack_pending deliveries outstanding, and a
        # slow-consumer drop would only cost a reset
        limit = max(4 * self.source.max_ack_pending, 65536)
        try:
            self._sub = await wire.subscribe_sink(
                self._nc,
                subject,
                receiver.sink,
                receiver.read,
                self._on_msg,
                self._on_early,
                pending_msgs_limit=limit,
                pending_bytes_limit=PENDING_BYTES,
            )
        except Exception as exc:  # not connected: the next reset (silence) subscribes again
            raise OriginUnavailable(f"cannot subscribe to {subject}: {describe(exc)}") from exc
        if self.mode is Mode.PULL:
            self._inbox = subject
        return True

    async def _on_msg(self, msg: Msg) -> None:
        # nats-py's own dispatch, used only where the wire parser could not be installed (see bridge.io.wire)
        self._on_early([msg])

    def _on_early(self, msgs: list[Msg]) -> None:
        """Messages nats-py parsed itself (no wire parser, or before the sink was registered), in order."""
        if self._receiver is not None:
            self._receiver.receive([inbound.classify(m.subject, m.reply, m.headers, m.data) for m in msgs])

    async def unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        self._inbox = ""  # no more pull requests until the next subscribe
        if self._receiver is not None:
            self._receiver.sink.clear()
        if sub is not None:
            wire.remove_handler(self._nc, sub)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def detach(self) -> None:
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            receiver.sink.clear()
        if self._sub is not None:
            wire.remove_handler(self._nc, self._sub)

    async def answer(self, effect: AnswerFlowControl) -> None:
        if self._nc is None:
            raise OriginUnavailable("not connected to the origin")
        try:
            await self._nc.publish(effect.subject, b"", headers=effect.headers)
        except Exception as exc:
            raise OriginUnavailable(f"flow-control answer not sent: {describe(exc)}") from exc

    def answer_now(self, effect: AnswerFlowControl) -> bool:
        """Write a flow-control answer without waiting, into the socket at the end of this event-loop pass with
        whatever else is written then (``wire.write_soon``); False when that is not possible now (not connected, or
        nats-py's internals are not the expected ones): then :meth:`answer`. At 1 msg/s per source almost every
        delivery brings one (the server asks after each heartbeat while anything is pending): through nats-py it
        cost a task switch and its flusher's wake-up."""
        nc: Any = self._nc
        if nc is None or not self._raw or not nc.is_connected or nc._transport is None:
            return False
        wire.write_soon(nc, frames.encode_answer(effect.subject, effect.last_consumer, effect.last_stream), self.fence)
        return True

    def _connection(self, what: str) -> NATS:
        """The connection, when it is up: a pull request or an ack nats-py would buffer while it reconnects is
        pointless (the reconnect resyncs, and a lost ack comes back as a redelivery) and misleading."""
        if self._nc is None or not self._nc.is_connected:
            raise OriginUnavailable(f"{what}: not connected to the origin")
        return self._nc

    async def pull(self, request: Pull) -> None:
        nc = self._connection("pull request not sent")
        if not self._inbox:
            raise OriginUnavailable("pull request not sent: not subscribed to an inbox")
        src = self.source
        subject, body = self._jsapi().next_request(
            src.stream, src.consumer, batch=request.batch, expires=request.expires, heartbeat=request.heartbeat
        )
        try:
            # no flush: nats-py's flusher writes it at once, and whatever else is pending with it
            await nc.publish(subject, body, reply=self._inbox)
        except Exception as exc:
            raise OriginUnavailable(f"pull request not sent: {describe(exc)}") from exc

    async def ack(self, replies: Sequence[str]) -> None:
        nc = self._connection("acks not sent")
        try:
            # an explicit ack is an empty message to the delivery's $JS.ACK subject
            if nc.is_connected and wire.has_raw_writes(nc):
                # those of one cover as one command in nats-py's buffer, written by its flusher (the subjects came
                # off the wire: nothing of nats-py's per-publish validation applies)
                raw: Any = nc
                await raw._send_command(frames.encode_acks(replies))
                if raw._flush_queue is not None and raw._flush_queue.empty():
                    await raw._flush_pending()
            else:  # reconnecting: nats-py's publish buffers (or refuses) them
                for reply in replies:
                    await nc.publish(reply, b"")
        except Exception as exc:
            raise OriginUnavailable(f"acks not sent: {describe(exc)}") from exc

    async def anchor(self) -> PullAnchor:
        src = self.source
        info = await self._jsapi().consumer_info(src.stream, src.consumer, timeout=self.timeout)
        delivered = info.get("delivered") or {}
        fit = consumer_kind(info) is ConsumerKind.PULL and info.get("config", {}).get("ack_policy") == "explicit"
        return PullAnchor(
            last_consumer_seq=int(delivered.get("consumer_seq", 0)),
            last_stream_seq=int(delivered.get("stream_seq", 0)),
            fit=fit,
            created=info.get("created"),
            ack_floor=int((info.get("ack_floor") or {}).get("stream_seq", 0)),
            filtered=bool(consumer_filters(info)),
        )

    async def fetch(self, after: int, through: int) -> list[OriginMessage]:
        src = self.source
        # the consumer's own filters: a bound consumer's are the operator's, not in the configuration
        return await self._jsapi().messages_between(src.stream, after, through, self._filters, self.timeout)

    async def flush(self) -> None:
        if self._nc is not None:
            await self._shared.flush()  # one PING for every source on the connection asking meanwhile

    async def close(self) -> None:
        """Leave the connection (the last source on it closes it)."""
        nc, member = self._nc, self._member
        self._nc = self._member = None
        self._api = None
        if nc is None or member is None:
            return
        with anyio.CancelScope(shield=True):
            sub, self._sub = self._sub, None
            if sub is not None:
                wire.remove_handler(nc, sub)
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            await self._shared.leave(member)


def _first_in(info: dict[str, Any], start: int) -> int:
    """The stream's first message at or after ``start`` as its ``STREAM.INFO`` says (0: none)."""
    state = info.get("state", {})
    first = int(state.get("first_seq", 0)) if int(state.get("messages", 0)) else 0
    return first if first >= start else 0


def _unavailable(what: str, exc: BridgeError) -> OriginUnavailable:
    """An API failure where the caller only needs to know the origin could not answer (``stream``,
    ``consumer_kind``): the server's description of an error reply, else the failure itself."""
    return OriginUnavailable(f"{what}: {exc.description if isinstance(exc, ApiError) else exc}")
