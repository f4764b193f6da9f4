"""The ``jetstream`` sink's pure parts: options, message ids, rows to messages, the ack's stream check; and how a task
ends when its acks stop (the connection and publisher faked)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the audit extra is not installed: pip install -e '.[audit]'")

from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from bridge.core.headers import parse_header_block
from bridge.core.targetwire import AckOutcome
from bridge.io import permissions
from bridge.spark import writer
from bridge.spark.writer import (
    RowConverter,
    SinkError,
    WriteOptions,
    _prepare,
    batch_message_id,
    check_ack,
    default_id_prefix,
    first_row_token,
    stream_message_id,
)

BASE = {"servers": "nats://127.0.0.1:4222", "stream": "OUT"}
FULL = StructType(
    [
        StructField("subject", StringType()),
        StructField("payload", BinaryType()),
        StructField("headers", MapType(StringType(), StringType())),
    ]
)


def test_options_defaults_and_connection_fields() -> None:
    opts = WriteOptions.parse({**BASE, "Domain": "hub", "user": "u", "password": "p", "tls_ca_file": __file__})
    assert opts.servers == ["nats://127.0.0.1:4222"]
    assert opts.window == 1024 and opts.timeout == 10.0 and opts.subject is None and opts.id_prefix is None
    assert opts.api_prefix == "$JS.hub.API"
    assert opts.auth is not None and opts.auth.user == "u"
    assert WriteOptions.parse({**BASE, "checkpointLocation": "/x", "path": "p"}).stream == "OUT"


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ({"window": "0"}, "window: must be between 1 and 1000000"),
        ({"subject": "a.*"}, "subject: must be a literal subject"),
        ({"colour": "red"}, "colour: unknown option"),
        ({"id_prefix": "a b"}, "id_prefix: must be non-empty"),
        ({"timeout": "-1"}, "timeout:"),
    ],
)
def test_bad_options_are_named(extra: dict[str, str], text: str) -> None:
    with pytest.raises(SinkError, match="invalid jetstream sink options") as failure:
        WriteOptions.parse({**BASE, **extra})
    assert text in str(failure.value)


def test_a_missing_stream_option_is_named_and_secrets_are_not_shown() -> None:
    with pytest.raises(SinkError) as failure:
        WriteOptions.parse({"servers": "nats://h:4222", "password": "hunter2", "user": "u", "window": "x"})
    text = str(failure.value)
    assert 'stream: required: give .option("stream", ...)' in text
    assert "hunter2" not in text


def test_message_ids() -> None:
    assert stream_message_id("q-1", 7, 2, 0) == "q-1:7:2:0"
    assert batch_message_id("job", 3, 41) == "job:3:41"
    options = {"servers": "nats://h:4222", "stream": "S"}
    assert default_id_prefix(options, 1) == default_id_prefix({"STREAM": "S", "SERVERS": "nats://h:4222"}, 1)
    assert default_id_prefix(options, 1) != default_id_prefix(options, 2)
    assert default_id_prefix(options, 1) != default_id_prefix({**options, "subject": "x"}, 1)


def converter(schema: StructType = FULL, **extra: str) -> RowConverter:
    return RowConverter.for_schema(schema, WriteOptions.parse({**BASE, **extra}))


def test_row_to_message() -> None:
    msg = converter().convert(("a.b", bytearray(b"\x00\x01"), {"K": "v"}), "q:0:1:2")
    assert msg.subject == "a.b"
    assert msg.payload == b"\x00\x01"
    assert msg.headers == {"K": "v", "Nats-Msg-Id": "q:0:1:2", "Nats-Expected-Stream": "OUT"}
    assert parse_header_block(msg.header_block) == msg.headers
    assert msg.size == len(msg.header_block) + 2


def test_string_payload_null_payload_and_default_subject() -> None:
    schema = StructType([StructField("payload", StringType()), StructField("subject", StringType())])
    conv = converter(schema, subject="dflt.x")
    assert conv.convert(("héllo", None), "i").payload == "héllo".encode()
    assert conv.convert(("x", None), "i").subject == "dflt.x"
    assert conv.convert((None, "own.y"), "i").payload == b""
    assert conv.convert((None, "own.y"), "i").subject == "own.y"


@pytest.mark.parametrize(
    ("row", "text"),
    [
        (("a..b", b"", None), "empty token"),
        (("a.>", b"", None), "wildcard"),
        (("a b", b"", None), "whitespace"),
        ((None, b"", None), "null subject and no subject option"),
        (("a", b"", {"Nats-Msg-Id": "mine"}), "set by the sink"),
        (("a", b"", {"bad:name": "v"}), "header name"),
        (("a", b"", {"K": "line\r\nbreak"}), "line break"),
    ],
)
def test_bad_rows_are_refused_with_their_id(row: tuple[object, ...], text: str) -> None:
    with pytest.raises(SinkError, match="row id-7: ") as failure:
        converter().convert(row, "id-7")
    assert text in str(failure.value)


@pytest.mark.parametrize(
    ("schema", "extra", "text"),
    [
        (StructType([StructField("subject", StringType())]), {}, "a payload column"),
        (StructType([StructField("payload", BinaryType())]), {}, "a subject column is required"),
        (StructType([StructField("payload", IntegerType())]), {"subject": "a"}, "payload must be binary or string"),
        (
            StructType([StructField("payload", BinaryType()), StructField("value", StringType())]),
            {"subject": "a"},
            "unknown column 'value'",
        ),
        (
            StructType([StructField("payload", BinaryType()), StructField("headers", StringType())]),
            {"subject": "a"},
            "headers must be map<string,string>",
        ),
    ],
)
def test_bad_schemas_are_refused(schema: StructType, extra: dict[str, str], text: str) -> None:
    with pytest.raises(SinkError, match="cannot write to stream 'OUT'") as failure:
        converter(schema, **extra)
    assert text in str(failure.value)


def test_overwrite_and_a_streaming_id_prefix_are_refused_before_any_connection() -> None:
    with pytest.raises(SinkError, match="only appends"):
        _prepare(BASE, FULL, True, streaming=False)
    with pytest.raises(SinkError, match="id_prefix applies to batch writes only"):
        _prepare({**BASE, "id_prefix": "p"}, FULL, False, streaming=True)


def test_first_row_token_is_deterministic() -> None:
    conv = converter()
    one = first_row_token(conv.convert(("a", b"x", None), ""))
    assert one == first_row_token(conv.convert(("a", b"x", None), ""))
    assert one.startswith("h") and len(one) == 17
    assert one != first_row_token(conv.convert(("a", b"y", None), ""))
    assert one != first_row_token(conv.convert(("b", b"x", None), ""))


def test_acks_are_checked_against_the_stream() -> None:
    ok = check_ack(AckOutcome(1, 0, True), b'{"stream":"OUT","seq":5}', "OUT")
    assert ok.stored and not ok.error
    dup = check_ack(AckOutcome(1, 0, True, duplicate=True), b'{"stream":"OUT","seq":5,"duplicate":true}', "OUT")
    assert dup.stored and dup.duplicate
    reordered = check_ack(AckOutcome(1, 0, True), b'{"seq":5, "stream": "OUT"}', "OUT")
    assert reordered.stored
    other = check_ack(AckOutcome(1, 0, True), b'{"stream":"OUTER","seq":5}', "OUT")
    assert not other.stored and other.error == "acked by stream 'OUTER', not 'OUT'"
    nobody = check_ack(AckOutcome(1, 0, False, error="no responders: the target stream does not exist here"), b"", "X")
    assert nobody.error == "no stream captures the subject (no responders)"
    refused = check_ack(AckOutcome(1, 0, False, error="maximum messages exceeded (code 503)"), b"", "X")
    assert refused.error == "maximum messages exceeded (code 503)"


class _Silent:
    """Stands in for the connection, the publisher and ``_Acks.wait`` in :func:`publish_all`: every publish is sent,
    the first wait for an ack times out, and at the next one every ack in flight arrives."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.published: list[int] = []
        self.waits = 0
        self.publisher: Any = None
        test = self

        class Publisher:
            acks_subject = "_INBOX.acks.>"

            def __init__(self, nc: object, on_outcomes: Callable[[Sequence[AckOutcome]], None], stream: str) -> None:
                self.on_outcomes = on_outcomes
                test.publisher = self

            async def start(self) -> None: ...

            async def stop(self) -> None: ...

            async def publish(self, batch: Sequence[tuple[Any, ...]]) -> list[tuple[int, int, str]]:
                test.published += [publication[1] for publication in batch]
                return []

        class Connection:
            async def close(self) -> None: ...

        async def open_connection(*args: object, **kwargs: object) -> Connection:
            return Connection()

        async def wait(acks: Any, timeout: float) -> bool:
            self.waits += 1
            if self.waits == 1:
                return False  # a whole timeout without an ack
            self.publisher.on_outcomes([AckOutcome(order, 0, True) for order in list(acks.pending)])
            return True

        monkeypatch.setattr(writer, "open_connection", open_connection)
        monkeypatch.setattr(writer, "_StreamCheckingPublisher", Publisher)
        monkeypatch.setattr(writer._Acks, "wait", wait)
        monkeypatch.setattr(permissions, "record_for", lambda nc: None)


def test_a_task_whose_acks_stop_for_a_timeout_fails_even_if_they_come_later(monkeypatch: pytest.MonkeyPatch) -> None:
    silent = _Silent(monkeypatch)
    opts = WriteOptions.parse({**BASE, "window": "2", "timeout": "3"})
    conv = RowConverter.for_schema(FULL, opts)
    messages = [(f"job:0:{i}", conv.convert(("a.b", b"x", None), f"job:0:{i}")) for i in range(5)]
    # the window filled, then no ack for a whole timeout: the task fails, its other rows unsent (they were once
    # dropped: the acks that came after it settled the two in flight, and the task reported success for 2 of 5 rows)
    with pytest.raises(SinkError, match=r"no publish ack within 3s for 2 of 2 messages \(first: job:0:0 on a\.b\)"):
        asyncio.run(writer.publish_all(opts, messages, 0))
    assert silent.published == [0, 1]
    assert silent.waits == 1, "one timeout, not two: the option is the wait"
