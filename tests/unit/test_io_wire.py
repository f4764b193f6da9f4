"""``bridge.io.wire.WireParser``: the protocol stream cut at any point is dispatched exactly as nats-py's own parser
dispatches it, with registered subscriptions handed over raw and in wire order.

The parser is fed bytes directly; what it calls on the client is recorded by a small stand-in that has the four
hooks nats-py's read loop provides (no server is involved: this is the parser alone).
"""

from __future__ import annotations

import socket
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.errors import ProtocolError
from nats.protocol.parser import Parser

from bridge.core.effects import AnswerFlowControl
from bridge.core.frames import (
    Frame,
    encode_acks,
    encode_answer,
    parse_msg_line,
    take_messages,
)
from bridge.io import wire
from bridge.io.wire import (
    WireParser,
    add_after_parse,
    add_handler,
    add_sink,
    coalesce_reads,
    crowded_read_lingers,
    flush_writes,
    install,
    quiet_read_wait,
    reading_behind,
    remove_after_parse,
    remove_handler,
    take,
    unread_bytes,
    write_soon,
)

pytestmark = pytest.mark.anyio


class Recorder:
    """The client side of a parser: records every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._ps: Parser = Parser(self)

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        self.calls.append(("msg", sid, bytes(subject), bytes(reply), headers, data))

    async def _process_ping(self) -> None:
        self.calls.append(("ping",))

    async def _process_pong(self) -> None:
        self.calls.append(("pong",))

    async def _process_err(self, err: str) -> None:
        self.calls.append(("err", err))

    async def _process_info(self, info: dict[str, Any]) -> None:
        self.calls.append(("info", info))

    async def _error_cb(self, exc: Exception) -> None:
        self.calls.append(("error", type(exc).__name__))


def hmsg(subject: str, sid: int, reply: str, header: bytes, payload: bytes) -> bytes:
    reply_part = f" {reply}" if reply else ""
    line = f"HMSG {subject} {sid}{reply_part} {len(header)} {len(header) + len(payload)}\r\n"
    return line.encode() + header + payload + b"\r\n"


def msg(subject: str, sid: int, reply: str, payload: bytes) -> bytes:
    reply_part = f" {reply}" if reply else ""
    return f"MSG {subject} {sid}{reply_part} {len(payload)}\r\n".encode() + payload + b"\r\n"


STREAM = b"".join(
    [
        b'INFO {"server_id":"x","max_payload":1048576}\r\n',
        msg("deliver.a", 1, "$JS.ACK.S.C.1.1.1.1.0", b"payload one"),
        b"PING\r\n",
        hmsg("deliver.a", 1, "$JS.FC.S.C.ab", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),
        msg("_INBOX.other", 2, "", b"not registered"),
        hmsg("deliver.a", 1, "", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 1\r\n\r\n", b""),
        b"+OK\r\n",
        hmsg("acks.7.1", 3, "", b"NATS/1.0\r\nX: y\r\n\r\n", b'{"stream":"AGG","seq":1}'),
        msg("deliver.a", 1, "$JS.ACK.S.C.1.2.2.1.0", b"\r\n inside \r\n the payload " + bytes(range(256)) * 40),
        b"PONG\r\n",
        hmsg("_INBOX.other", 2, "r", b"NATS/1.0 503\r\n\r\n", b""),
        b"-ERR 'Permissions Violation for Publish to \"x\"'\r\n",
        msg("deliver.a", 1, "$JS.ACK.S.C.1.3.3.1.0", b""),
    ]
)


def expected() -> list[tuple[Any, ...]]:
    """What nats-py's own parser makes of STREAM, with sids 1 and 3 as raw handler calls."""
    return [
        ("info", {"server_id": "x", "max_payload": 1048576}),
        ("raw1", b"deliver.a", b"$JS.ACK.S.C.1.1.1.1.0", None, b"payload one"),
        ("ping",),
        ("raw1", b"deliver.a", b"$JS.FC.S.C.ab", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),
        ("msg", 2, b"_INBOX.other", b"", None, b"not registered"),
        ("raw1", b"deliver.a", b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 1\r\n\r\n", b""),
        ("raw3", b"acks.7.1", b"", b"NATS/1.0\r\nX: y\r\n\r\n", b'{"stream":"AGG","seq":1}'),
        (
            "raw1",
            b"deliver.a",
            b"$JS.ACK.S.C.1.2.2.1.0",
            None,
            b"\r\n inside \r\n the payload " + bytes(range(256)) * 40,
        ),
        ("pong",),
        ("msg", 2, b"_INBOX.other", b"r", b"NATS/1.0 503\r\n\r\n", b""),
        ("err", "'permissions violation for publish to \"x\"'"),
        ("raw1", b"deliver.a", b"$JS.ACK.S.C.1.3.3.1.0", None, b""),
    ]


def wired() -> tuple[Recorder, WireParser]:
    client = Recorder()
    parser = install(client)
    assert isinstance(parser, WireParser) and client._ps is parser
    for sid in (1, 3):

        def handler(subject: bytes, reply: bytes, header: bytes | None, payload: bytes, sid: int = sid) -> None:
            client.calls.append((f"raw{sid}", subject, reply, header, payload))

        assert add_handler(client, type("Sub", (), {"_id": sid})(), handler)
    return client, parser


async def feed(parser: Parser, data: bytes, cuts: list[int]) -> None:
    last = 0
    for cut in sorted(set(cuts)):
        await parser.parse(data[last:cut])
        last = cut
    await parser.parse(data[last:])


async def test_one_read_dispatches_like_nats_py() -> None:
    client, parser = wired()
    await parser.parse(STREAM)
    assert client.calls == expected()


async def test_nats_py_parser_sees_the_same_stream() -> None:
    # the reference: nats-py's own parser on the same bytes (registered sids would reach _process_msg there)
    client = Recorder()
    await client._ps.parse(STREAM)
    ours = [c if c[0] not in ("raw1", "raw3") else ("msg", int(c[0][3:]), *c[1:]) for c in expected()]
    assert client.calls == ours


@settings(max_examples=200)
@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=40))
async def test_any_cutting_of_the_stream_gives_the_same_calls(cuts: list[int]) -> None:
    client, parser = wired()
    await feed(parser, STREAM, cuts)
    assert client.calls == expected()


async def test_byte_by_byte() -> None:
    client, parser = wired()
    await feed(parser, STREAM, list(range(len(STREAM))))
    assert client.calls == expected()


async def test_anything_read_answers_nats_py_s_outstanding_pings() -> None:
    """A connection that delivers is alive: a read, even of a piece of a message, clears nats-py's count of PINGs
    unanswered (a late-parsed PONG must not make a live connection stale); no read, no change."""
    client, parser = wired()
    client._pings_outstanding = 2  # type: ignore[attr-defined]
    await parser.parse(b"")
    assert client._pings_outstanding == 2  # type: ignore[attr-defined]
    await parser.parse(b"MSG deliver.a 1 $JS.ACK.S.C.1.3.3.1.0 4\r\nab")
    assert client._pings_outstanding == 0  # type: ignore[attr-defined]
    client._pings_outstanding = 1  # type: ignore[attr-defined]
    await parser.parse(b"cd\r\n")
    assert client._pings_outstanding == 0  # type: ignore[attr-defined]
    assert client.calls[-1] == ("raw1", b"deliver.a", b"$JS.ACK.S.C.1.3.3.1.0", None, b"abcd")


async def test_a_message_larger_than_many_reads_is_joined_once() -> None:
    client, parser = wired()
    big = bytes(range(256)) * 4096  # 1 MiB
    data = msg("deliver.a", 1, "$JS.ACK.S.C.1.1.1.1.0", big) + b"PING\r\n"
    await feed(parser, data, list(range(0, len(data), 32768)))
    assert client.calls == [("raw1", b"deliver.a", b"$JS.ACK.S.C.1.1.1.1.0", None, big), ("ping",)]


def sinked() -> tuple[Recorder, WireParser, dict[int, list[Frame]]]:
    """Sids 1 and 3 as sinks (the origin's and the publisher's way): lists the compiled core appends frames to."""
    client = Recorder()
    parser = install(client)
    assert isinstance(parser, WireParser)
    sinks: dict[int, list[Frame]] = {1: [], 3: []}
    for sid, sink in sinks.items():
        assert add_sink(client, type("Sub", (), {"_id": sid})(), sink)
    return client, parser, sinks


def split_expected() -> tuple[list[tuple[Any, ...]], dict[int, list[Frame]]]:
    """:func:`expected` with sids 1 and 3 taken out into their sinks, each in wire order."""
    others = [c for c in expected() if c[0] not in ("raw1", "raw3")]
    frames: dict[int, list[Frame]] = {1: [], 3: []}
    for call in expected():
        if call[0] in ("raw1", "raw3"):
            frames[int(call[0][3:])].append(call[1:])
    return others, frames


@settings(max_examples=200)
@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=40))
async def test_sinks_take_the_same_frames_for_any_cutting_of_the_stream(cuts: list[int]) -> None:
    client, parser, sinks = sinked()
    await feed(parser, STREAM, cuts)
    assert (client.calls, sinks) == split_expected()


async def test_sinks_byte_by_byte_and_a_message_larger_than_many_reads() -> None:
    client, parser, sinks = sinked()
    await feed(parser, STREAM, list(range(len(STREAM))))
    assert (client.calls, sinks) == split_expected()
    client, parser, sinks = sinked()
    big = bytes(range(256)) * 4096  # 1 MiB
    data = msg("deliver.a", 1, "$JS.ACK.S.C.1.1.1.1.0", big) + b"PING\r\n"
    await feed(parser, data, list(range(0, len(data), 32768)))
    assert client.calls == [("ping",)] and sinks[1] == [(b"deliver.a", b"$JS.ACK.S.C.1.1.1.1.0", None, big)]


def test_take_messages_stops_at_what_is_not_a_complete_message_of_a_sink() -> None:
    one = msg("d", 1, "r", b"x")
    sinks: dict[int, list[Frame]] = {1: []}
    filled: list[int] = []
    assert take_messages(one + one, 0, sinks, filled) == 2 * len(one) and sinks[1] == [(b"d", b"r", None, b"x")] * 2
    assert filled == [1]  # once, with its first frame
    for rest in (b"PING\r\n", msg("d", 2, "", b"x"), one[:-1], b"MSG d x 1\r\nx\r\n", b"MSG d 1\r\n", b"M"):
        sinks = {1: []}
        assert take_messages(one + rest, 0, sinks, []) == len(one), rest
        assert sinks[1] == [(b"d", b"r", None, b"x")]


async def test_a_sink_owner_is_called_once_after_a_read_that_filled_it_and_never_otherwise() -> None:
    client = Recorder()
    parser = install(client)
    assert isinstance(parser, WireParser)
    sinks: dict[int, list[Frame]] = {sid: [] for sid in range(1, 1001)}  # a connection of many quiet sources
    called: list[tuple[int, int]] = []
    for sid, sink in sinks.items():

        def owner(sid: int = sid, sink: list[Frame] = sink) -> None:
            called.append((sid, len(take(sink))))

        assert add_sink(client, type("Sub", (), {"_id": sid})(), sink, owner)
    await parser.parse(msg("d", 7, "r", b"x") + msg("d", 7, "r", b"y") + msg("d", 500, "r", b"z"))
    assert called == [(7, 2), (500, 1)]  # in the order the read filled them; the 998 others are not called
    called.clear()
    await parser.parse(b"PING\r\n")
    assert called == []
    remove_handler(client, type("Sub", (), {"_id": 7})())
    await parser.parse(msg("d", 500, "r", b"z"))
    assert called == [(500, 1)]


@pytest.mark.parametrize("line", [b"MSG d 1 x\r\nabc\r\n", b"HMSG d 1 9 3\r\nabc\r\n", b"MSG d 1 r 1 2\r\nabc\r\n"])
async def test_malformed_message_of_a_sink_is_a_protocol_error(line: bytes) -> None:
    _, parser, sinks = sinked()
    with pytest.raises(ProtocolError):
        await parser.parse(line)
    assert sinks == {1: [], 3: []}


async def test_a_failing_handler_is_reported_and_reading_goes_on() -> None:
    client = Recorder()
    parser = install(client)
    assert parser is not None

    def broken(subject: bytes, reply: bytes, header: bytes | None, payload: bytes) -> None:
        raise RuntimeError("bug")

    add_handler(client, type("Sub", (), {"_id": 1})(), broken)
    await parser.parse(msg("deliver.a", 1, "", b"x") + b"PING\r\n")
    assert client.calls == [("error", "RuntimeError"), ("ping",)]


async def test_removed_handler_falls_back_to_nats_py_dispatch() -> None:
    client, parser = wired()
    remove_handler(client, type("Sub", (), {"_id": 1})())
    await parser.parse(msg("deliver.a", 1, "", b"x"))
    assert client.calls == [("msg", 1, b"deliver.a", b"", None, b"x")]


async def test_reset_drops_a_partial_message() -> None:
    client, parser = wired()
    await parser.parse(msg("deliver.a", 1, "", b"x" * 100)[:50])
    parser.reset()  # nats-py reconnected: the rest of that message will never come
    await parser.parse(b"PONG\r\n")
    assert client.calls == [("pong",)]


@pytest.mark.parametrize(
    "line",
    [
        b"BOGUS\r\n",
        b"MSG a\r\n",
        b"HMSG a 1 2 3 4 5 6\r\n",
        b"MSG a x 3\r\nabc\r\n",
        b"INFO\r\n",
        b"INFO {\r\n",
        b"HMSG a 1 9 3\r\nabc\r\n",
    ],
)
async def test_malformed_input_is_a_protocol_error(line: bytes) -> None:
    _, parser = wired()
    with pytest.raises(ProtocolError):
        await parser.parse(line)


async def test_endless_control_line_is_a_protocol_error() -> None:
    _, parser = wired()
    with pytest.raises(ProtocolError):
        await parser.parse(b"MSG " + b"x" * 5000)


def test_install_refuses_a_client_without_nats_py_internals() -> None:
    assert install(object()) is None
    assert add_handler(object(), type("Sub", (), {"_id": 1})(), lambda *a: None) is False


async def test_after_parse_hooks_run_once_per_read_after_every_message_of_it() -> None:
    client, parser = wired()
    seen: list[int] = []
    assert add_after_parse(client, lambda: seen.append(len(client.calls)))
    await parser.parse(STREAM[:100])
    first = len(client.calls)
    assert seen == [first] and 0 < first < len(expected())
    await parser.parse(STREAM[100:])
    assert seen == [first, len(expected())]
    assert client.calls == expected()


async def test_a_failing_hook_is_reported_and_removed_hooks_stop() -> None:
    client, parser = wired()

    def broken() -> None:
        raise RuntimeError("bug")

    add_after_parse(client, broken)
    await parser.parse(b"PING\r\n")
    assert client.calls == [("ping",), ("error", "RuntimeError")]
    remove_after_parse(client, broken)
    await parser.parse(b"PONG\r\n")
    assert client.calls[-1] == ("pong",)
    assert add_after_parse(object(), broken) is False


def test_missing_hooks_names_what_an_untested_nats_py_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    from nats.aio.client import Client

    assert wire.missing_hooks() == []  # the pinned nats-py has every internal the fast path uses
    monkeypatch.delattr(Client, "_process_msg")
    assert wire.missing_hooks() == ["_process_msg"]


def test_pull_acks_are_encoded_exactly_as_nats_py_publishes_them() -> None:
    from nats.protocol.command import pub_cmd

    replies = ["$JS.ACK.S.C.1.1.1.1732590000000000000.0", "$JS.ACK.hub.ABC.S.C.1.2.2.1732590000000000001.5.tok"]
    assert encode_acks(replies) == b"".join(pub_cmd(reply, "", b"") for reply in replies)
    assert encode_acks([]) == b""


@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (b"MSG d 1 5", (b"d", 1, b"", 0, 5)),
        (b"MSG d 1 r 5", (b"d", 1, b"r", 0, 5)),
        (b"HMSG d 2 12 20", (b"d", 2, b"", 12, 20)),
        (b"HMSG d 2 r 12 20", (b"d", 2, b"r", 12, 20)),
        (b"HMSG d 2 r 21 20", None),  # a header block larger than the message
        (b"MSG d x 5", None),
        (b"MSG d 1 r 5 6", None),
        (b"PUB d 1 5", None),
        (b"", None),
    ],
)
def test_a_message_control_line_is_read_as_nats_py_reads_it_or_refused(
    line: bytes, fields: tuple[bytes, int, bytes, int, int] | None
) -> None:
    assert parse_msg_line(line) == fields


class Transport:
    """The asyncio transport under nats-py's stream writer: records pause_reading / resume_reading."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False
        self.calls.append(("pause_reading",))

    def resume_reading(self) -> None:
        self.reading = True
        self.calls.append(("resume_reading",))


HEARTBEAT = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 0\r\n\r\n"


async def test_a_read_of_only_heartbeats_pauses_the_transport_before_the_next_read_and_nothing_else_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many quiet sources' heartbeats come in one read rather than one read each (``coalesce_reads``): after a
    read that brought only frames without a reply subject, the socket is not read for ``quiet_wait``; a delivery or
    a flow-control request (a reply subject) or a message for nats-py's own subscriptions never waits."""
    client = Recorder()
    parser = install(client)
    assert isinstance(parser, WireParser)
    writer = type("StreamWriter", (), {"transport": Transport(client.calls)})()
    setattr(client, "_transport", type("NatsTransport", (), {"_io_writer": writer})())  # noqa: B010
    sinks: dict[int, list[Frame]] = {sid: [] for sid in (1, 2)}
    for sid, sink in sinks.items():

        def owner(sid: int = sid, sink: list[Frame] = sink) -> None:
            client.calls.append(("owner", sid, [frame[1] for frame in take(sink)]))

        assert add_sink(client, type("Sub", (), {"_id": sid})(), sink, owner)
    beats = hmsg("d.1", 1, "", HEARTBEAT, b"") + hmsg("d.2", 2, "", HEARTBEAT, b"")
    await parser.parse(beats)
    assert client.calls == [("owner", 1, [b""]), ("owner", 2, [b""])]  # off by default
    client.calls.clear()
    assert coalesce_reads(client, 0.001)
    await parser.parse(beats + b"PING\r\n")
    assert client.calls == [
        *[("ping",), ("owner", 1, [b""]), ("owner", 2, [b""])],  # everything the read brought handed over first
        *[("pause_reading",), ("resume_reading",)],
    ]
    for busy in (
        hmsg("d.1", 1, "", HEARTBEAT, b"") + msg("d.2", 2, "$JS.ACK.S.C.1.1.1.1.0", b"x"),  # a delivery
        hmsg("d.1", 1, "$JS.FC.S.C.1", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),  # flow control
        hmsg("d.1", 1, "", HEARTBEAT, b"") + msg("_INBOX.x", 9, "", b"{}"),  # an API reply (nats-py's dispatch)
    ):
        client.calls.clear()
        await parser.parse(busy)
        assert ("pause_reading",) not in client.calls, busy
        # and for a second after it, quiet reads do not wait either: a busy source keeps the connection's pace
        await parser.parse(beats)
        assert ("pause_reading",) not in client.calls, busy
        monkeypatch.setattr(wire, "QUIET_AFTER", 0.0)
        await parser.parse(beats)
        assert client.calls[-2:] == [("pause_reading",), ("resume_reading",)]
        monkeypatch.setattr(wire, "QUIET_AFTER", 1.0)


@pytest.mark.parametrize("acks", [True, False])
async def test_a_flow_control_answer_is_encoded_exactly_as_nats_py_publishes_it(acks: bool) -> None:
    from nats.aio.client import Client

    written: list[bytes] = []
    client = Client()

    async def capture(command: bytes, priority: bool = False) -> None:
        written.append(bytes(command))

    setattr(client, "_send_command", capture)  # noqa: B010
    client._flush_queue = None
    subject = "$JS.FC.hub.ABC.S.C.1.2.3"
    headers = {"Nats-Last-Consumer": "41", "Nats-Last-Stream": "1041"} if acks else None
    await client._send_publish(subject, "", b"", 0, headers)
    answer = AnswerFlowControl(subject, 41, 1041) if acks else AnswerFlowControl(subject, 0, 0)
    assert answer.headers == headers
    # what the runtime writes: the same bytes from the answer's fields
    assert encode_answer(answer.subject, answer.last_consumer, answer.last_stream) == written[0]


@pytest.mark.parametrize(
    ("sinks", "size", "since", "lingers"),
    [
        (wire.CROWDED, 300, 0.001, True),  # a trickle on a crowded connection
        (wire.CROWDED, wire.FULL_READ - 1, 0.001, True),  # many frames, and the socket left empty
        (wire.CROWDED - 1, 300, 0.001, False),  # a connection of a few sources keeps its latency
        (wire.CROWDED, wire.FULL_READ, 0.001, False),  # a read that may have left more: a backlog is read as it comes
        (wire.CROWDED, 300, 2 * wire.CROWDED_LINGER, False),  # the first read after a lull
        (1000, 300, 2 * wire.CROWDED_LINGER - 0.0001, True),
    ],
)
def test_a_busy_read_that_emptied_the_socket_of_a_crowded_connection_lingers(
    sinks: int, size: int, since: float, lingers: bool
) -> None:
    assert crowded_read_lingers(sinks, size, since, wire.CROWDED_LINGER) is lingers
    assert not crowded_read_lingers(sinks, size, since, 0.0)  # 0: never


async def test_small_busy_reads_of_a_crowded_connection_pause_the_transport_and_a_large_one_does_not() -> None:
    client = Recorder()
    parser = install(client)
    assert isinstance(parser, WireParser)
    parser.linger = 0.001
    writer = type("StreamWriter", (), {"transport": Transport(client.calls)})()
    setattr(client, "_transport", type("NatsTransport", (), {"_io_writer": writer})())  # noqa: B010
    for sid in range(1, wire.CROWDED + 1):
        sink: list[Frame] = []

        def owner(sink: list[Frame] = sink) -> None:
            take(sink)

        assert add_sink(client, type("Sub", (), {"_id": sid})(), sink, owner)

    def deliveries(count: int) -> bytes:
        return b"".join(msg(f"d.{i}", 1 + i % wire.CROWDED, "$JS.ACK.S.C.1.1.1.1.0", b"x") for i in range(count))

    await parser.parse(deliveries(1))
    assert client.calls == []  # the first busy read: nothing came just before it
    await parser.parse(deliveries(1))
    assert client.calls == [("pause_reading",), ("resume_reading",)]
    client.calls.clear()
    await parser.parse(deliveries(12))  # what one lingered read brings at 1,000 sources: the next lingers too
    assert client.calls == [("pause_reading",), ("resume_reading",)]
    client.calls.clear()
    many = deliveries(1000)
    assert len(many) >= wire.FULL_READ
    await parser.parse(many)
    assert client.calls == []
    parser.linger = 0.0
    await parser.parse(deliveries(1))
    assert client.calls == []


def test_a_quiet_read_waits_a_twentieth_of_the_quiet_spell_and_at_most_the_configured_wait() -> None:
    """The first delivery after a quiet spell comes at most 5% later than the spell lasted: nothing waits in the
    first second, then a twentieth of the spell, capped (a long spell's reads are ten a second at a 0.1 s cap)."""
    assert quiet_read_wait(0.0, 0.1) == 0.0
    assert quiet_read_wait(0.99, 0.1) == 0.0
    assert quiet_read_wait(1.0, 0.1) == pytest.approx(0.05)
    assert quiet_read_wait(1.6, 0.1) == pytest.approx(0.08)
    assert quiet_read_wait(3600.0, 0.1) == 0.1
    assert quiet_read_wait(3600.0, 0.02) == 0.02


def test_a_connection_is_behind_when_a_backlog_waits_in_its_reader_or_its_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``reading_behind``: what the stream reader buffered plus what the kernel holds (FIONREAD) on a real socket,
    against ``BEHIND_BYTES``; looked at again only after ``BEHIND_CHECK_EVERY``."""
    monkeypatch.setattr(wire, "BEHIND_CHECK_EVERY", 0.0)
    ours, server = socket.socketpair()
    with ours, server:
        client = Recorder()
        assert isinstance(install(client), WireParser)
        reader = type("StreamReader", (), {"_buffer": bytearray()})()
        sock_transport = type("Transport", (), {"get_extra_info": lambda self, name: ours})()
        writer = type("StreamWriter", (), {"transport": sock_transport})()
        setattr(client, "_transport", type("NatsTransport", (), {"_io_reader": reader, "_io_writer": writer})())  # noqa: B010
        assert unread_bytes(client) == 0 and not reading_behind(client)
        server.sendall(b"x" * 1000)  # a local stream socket: in ours's receive queue once sendall returns
        assert unread_bytes(client) == 1000 and not reading_behind(client)  # a few heartbeats: not a backlog
        reader._buffer = bytearray(wire.BEHIND_BYTES - 1000)
        assert reading_behind(client)
        assert ours.recv(1000) == b"x" * 1000
        assert not reading_behind(client)
    assert not reading_behind(object())  # no wire parser: never behind


def test_coalescing_needs_the_wire_parser() -> None:
    assert not coalesce_reads(object(), 0.02)


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


class _Client:
    def __init__(self) -> None:
        self._transport: _Transport | None = _Transport()
        self._pending: list[bytes] = []  # nats-py's unwritten commands, for its flusher
        self._pending_data_size = 0

    def buffer(self, command: bytes) -> None:
        """What nats-py's publish does: append to its buffer for the flusher task."""
        self._pending.append(command)
        self._pending_data_size += len(command)


async def test_writes_of_one_pass_reach_the_socket_in_one_call_in_order() -> None:
    nc = _Client()
    transport = nc._transport
    assert transport is not None
    write_soon(nc, b"a1")
    write_soon(nc, b"b1")
    write_soon(nc, b"a2")
    assert transport.writes == []  # not before the end of this pass
    await anyio.lowlevel.checkpoint()
    assert transport.writes == [b"a1b1a2"]
    write_soon(nc, b"a3")
    flush_writes(nc)  # what must follow it is about to be written another way: now, first
    await anyio.lowlevel.checkpoint()
    assert transport.writes == [b"a1b1a2", b"a3"]


async def test_what_nats_py_has_not_written_yet_goes_first_in_the_same_write() -> None:
    nc = _Client()
    transport = nc._transport
    assert transport is not None
    nc.buffer(b"request1")
    write_soon(nc, b"a1")
    nc.buffer(b"request2")  # after a1: stays after it
    write_soon(nc, b"a2")
    assert nc._pending == [] and nc._pending_data_size == 0  # nats-py's flusher finds nothing left to write
    await anyio.lowlevel.checkpoint()
    assert transport.writes == [b"request1a1request2a2"]


async def test_writes_held_for_a_connection_replaced_since_are_not_written_to_the_new_one() -> None:
    nc = _Client()
    old = nc._transport
    write_soon(nc, b"for the old connection")
    nc._transport = _Transport()  # nats-py reconnected within the pass
    await anyio.lowlevel.checkpoint()
    assert old is not None and old.writes == [] and nc._transport.writes == []
    write_soon(nc, b"new")
    await anyio.lowlevel.checkpoint()
    assert nc._transport.writes == [b"new"]


async def test_a_write_whose_fence_closed_before_the_pass_wrote_is_dropped_and_the_rest_goes() -> None:
    """A process stopped (SIGSTOP, a paused VM) between a source's fence check and the end of the pass would, on
    waking, send what it decided under a lease another process may hold by then: that source's parts are dropped,
    everything else (other sources', nats-py's own commands) goes, in order."""
    nc = _Client()
    transport = nc._transport
    assert transport is not None
    open_a = [True]
    nc.buffer(b"SUB")
    write_soon(nc, b"a1", lambda: open_a[0])
    write_soon(nc, b"b1", lambda: True)
    write_soon(nc, b"a2", lambda: open_a[0])
    write_soon(nc, b"c1")  # no lease
    open_a[0] = False  # (the process slept here)
    await anyio.lowlevel.checkpoint()
    assert transport.writes == [b"SUBb1c1"]
    write_soon(nc, b"a3", lambda: False)
    await anyio.lowlevel.checkpoint()
    assert transport.writes == [b"SUBb1c1"]  # nothing left to write: no empty write either
    write_soon(nc, b"b2", lambda: True)
    await anyio.lowlevel.checkpoint()
    assert transport.writes == [b"SUBb1c1", b"b2"]
