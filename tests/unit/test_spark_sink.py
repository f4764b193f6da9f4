"""The ``jetstream`` sink's pure parts: options, message ids, rows to messages, the ack's stream check."""

from __future__ import annotations

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
