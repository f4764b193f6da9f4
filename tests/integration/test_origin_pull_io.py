"""``OriginClient`` in pull mode against a real nats-server: the I/O the pull-mode runner is built on.

The origin runs :func:`bridge.testing.servers.origin_server_binary` (``NATS_ORIGIN_SERVER_BIN``: set it to a 2.10,
2.11 or 2.12 binary to check an origin older than 2.14; unset, the default server). One WorkQueue stream of 50
messages; the client creates its durable pull consumer, pulls, sees heartbeats and the end of an idle request,
acks (which deletes on a WorkQueue), reads the consumer's anchor and reads ranges of the stream back exactly as they
were delivered. Deliveries are taken from the wire by ``bridge.io.wire`` and, as a fallback, from nats-py's own
subscription callbacks: both must classify alike.
"""

from __future__ import annotations

import re

import pytest

from bridge.config import SourceConfig
from bridge.core.effects import Pull, PullAnchor
from bridge.core.inbound import Data, Heartbeat, Inbound, PullStatus
from bridge.core.modes import ConsumerKind, Mode, supports_flow_control
from bridge.errors import OriginUnavailable
from bridge.io import wire
from bridge.io.origin import OriginClient
from bridge.testing.fakes import Collected
from bridge.testing.jetstream import connect, create_stream, stream_messages
from bridge.testing.polling import wait_for_value, wait_until
from bridge.testing.servers import NatsServer, server_version

pytestmark = pytest.mark.anyio

STREAM = "ORIGIN"
COUNT = 50
WINDOW = 20  # max_ack_pending: a second request finds the window full and waits, idle


def subject_of(i: int) -> str:
    return f"o.{'abc'[i % 3]}"


def payload_of(i: int) -> bytes:
    return b"" if i == 7 else f"message {i}".encode()  # one empty payload: still data, not a status


def headers_of(i: int) -> dict[str, str] | None:
    if i % 2 == 0:
        return None
    return {"X-Index": str(i), "Nats-Msg-Id": f"app-{i}"} if i % 5 == 0 else {"X-Index": str(i)}


async def _noop() -> None:
    pass


async def _connected(source: SourceConfig, errors: list[Exception]) -> OriginClient:
    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    client = OriginClient(source, timeout=5.0, mode=Mode.PULL)
    await client.connect(on_disconnected=_noop, on_reconnected=_noop, on_error=on_error)
    return client


@pytest.mark.parametrize("fast_path", [True, False], ids=["wire", "nats-py"])
async def test_pull_mode_io(
    origin: NatsServer, origin_server_bin: str, fast_path: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fast_path:  # deliveries through nats-py's own parser and callbacks (bridge.io.wire's fallback)
        monkeypatch.setattr(wire, "install", lambda nc: None)
    release = tuple(int(n) for n in re.findall(r"\d+", server_version(origin_server_bin))[:3])
    source = SourceConfig(name="edge1", servers=[origin.url], stream=STREAM, max_ack_pending=WINDOW, ack_wait=30)
    errors: list[Exception] = []
    received: list[Inbound] = []
    async with connect(origin.url) as nc:
        await create_stream(nc, STREAM, ["o.>"], retention="workqueue")
        for i in range(1, COUNT + 1):
            await nc.jetstream().publish(subject_of(i), payload_of(i), headers=headers_of(i))
        client = await _connected(source, errors)
        assert isinstance(getattr(client._nc, "_ps", None), wire.WireParser) is fast_path
        try:
            # what start-up reads: the stream, and the server's API level (reported from 2.11 on)
            stream = await client.stream()
            assert (stream.workqueue, stream.last_seq) == (True, COUNT)
            if release < (2, 11, 0):
                assert (stream.api_level, stream.version) == (None, None)
            else:
                assert stream.version == server_version(origin_server_bin)
                assert stream.api_level is not None
                assert supports_flow_control(stream.api_level) == (release >= (2, 14, 0))

            # the durable does not exist; bind creates it as a pull consumer
            assert await client.consumer_kind() is None
            bound = await client.bind()
            assert bound.ack_floor == 0 and bound.num_pending == COUNT
            assert await client.consumer_kind() is ConsumerKind.PULL
            with pytest.raises(OriginUnavailable, match="not subscribed"):
                await client.pull(Pull(1, 1.0, 0.5))

            assert await client.subscribe(Collected(received))
            await client.pull(Pull(20, 5.0, 1.0))
            data = await wait_until(
                lambda: [m for m in received if isinstance(m, Data)] if len(received) >= 20 else None,
                timeout=10,
                what="20 deliveries",
            )
            assert [m.ack.consumer_seq for m in data] == list(range(1, 21))
            assert [m.ack.stream_seq for m in data] == list(range(1, 21))
            assert all(m.reply.startswith("$JS.ACK.") for m in data)
            assert [(m.subject, m.payload, m.headers) for m in data] == [
                (subject_of(i), payload_of(i), headers_of(i)) for i in range(1, 21)
            ]

            # the window is full: another request waits idle, with heartbeats, until it expires (408)
            await client.pull(Pull(10, 2.5, 1.0))
            status = await wait_until(
                lambda: next((m for m in received if isinstance(m, PullStatus)), None),
                timeout=10,
                what="the idle request's end",
            )
            beats = [m for m in received if isinstance(m, Heartbeat)]
            assert beats and beats[0] == Heartbeat(last_consumer=20, last_stream=20, stalled=None)
            assert (status.code, status.description) == (408, "Request Timeout")
            assert (status.request, status.pending_messages) == (client.inbox, 10)
            assert len(received) == 20 + len(beats) + 1, received[20:]

            # explicit acks: on a WorkQueue each one deletes its message
            await client.ack([m.reply for m in data[:10]])
            await wait_for_value(lambda: stream_messages(nc, STREAM), COUNT - 10, timeout=10, what="stream messages")
            anchor = await client.anchor()
            assert anchor == PullAnchor(20, 20, fit=True, created=bound.created, ack_floor=10)

            # the stream read back: exactly what was delivered, store times to the nanosecond
            fetched = await client.fetch(10, 20)
            assert [m.seq for m in fetched] == list(range(11, 21))
            for message, delivery in zip(fetched, data[10:], strict=True):
                assert message.subject == delivery.subject
                assert message.payload == delivery.payload
                assert message.headers == delivery.headers
                assert message.timestamp_ns == delivery.ack.timestamp_ns
            # what the acks deleted is stepped over; nothing past the range is read
            assert [m.seq for m in await client.fetch(0, 15)] == list(range(11, 16))
            assert await client.fetch(COUNT, COUNT + 10) == []

            # a new subscription is a new inbox; none after unsubscribe
            first_inbox = client.inbox
            assert await client.subscribe(Collected(received))
            assert client.inbox.startswith("_INBOX.") and client.inbox != first_inbox
            await client.unsubscribe()
            with pytest.raises(OriginUnavailable, match="not subscribed"):
                await client.pull(Pull(1, 1.0, 0.5))
        finally:
            await client.close()

        # several filters: the stream's messages on either, merged in sequence order (no consumer needed)
        filtered = SourceConfig(name="edge2", servers=[origin.url], stream=STREAM, filter_subjects=["o.a", "o.c"])
        reader = await _connected(filtered, errors)
        try:
            messages = await reader.fetch(5, 40)
        finally:
            await reader.close()
        expected = [i for i in range(11, 41) if subject_of(i) in ("o.a", "o.c")]
        assert [m.seq for m in messages] == expected
        assert [(m.subject, m.payload, m.headers) for m in messages] == [
            (subject_of(i), payload_of(i), headers_of(i)) for i in expected
        ]
    assert errors == []
