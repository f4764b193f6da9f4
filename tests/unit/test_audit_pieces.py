"""The audit's pure pieces: store-time parsing, payload hashing, Arrow batches, partition planning and options."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyarrow", reason="the audit extra is not installed")

from bridge.audit.report import SourceReport
from bridge.config import AuthConfig, SourceConfig, TargetConfig, TlsConfig
from bridge.errors import AuditError
from bridge.io.directget import StoredMessage
from bridge.spark.options import ReadOptions, side_options
from bridge.spark.read import plan_ranges
from bridge.spark.rows import BatchBuilder, _Seconds, arrow_schema, payload_hash, rfc3339_micros

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def go_rfc3339_nano(ns: int) -> str:
    """How nats-server formats a store time: Go's RFC3339Nano in UTC, trailing zeros of the fraction dropped."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    text = (EPOCH + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")
    digits = f"{fraction:09d}".rstrip("0")
    return f"{text}.{digits}Z" if digits else f"{text}Z"


@given(st.integers(min_value=0, max_value=4_000_000_000 * 1_000_000_000))
def test_store_times_parse_to_microseconds(ns: int) -> None:
    parse = rfc3339_micros(_Seconds())
    assert parse(go_rfc3339_nano(ns)) == ns // 1000


def test_store_time_examples_and_rejects() -> None:
    parse = rfc3339_micros(_Seconds())
    assert parse("2026-11-22T14:25:16Z") == 1_795_357_516_000_000
    assert parse("2026-11-22T14:25:16.5Z") == 1_795_357_516_500_000
    assert parse("2026-11-22T14:25:16.123456789Z") == 1_795_357_516_123_456
    with pytest.raises(ValueError):
        parse("2026-11-22T14:25:16+01:00")


def test_payload_hash_is_a_stable_signed_64_bit_digest() -> None:
    assert payload_hash(b"abc") == payload_hash(b"abc")
    assert payload_hash(b"abc") != payload_hash(b"abd")
    assert -(2**63) <= payload_hash(b"") < 2**63


def test_batches_keep_order_and_the_headers_asked_for() -> None:
    messages = [
        StoredMessage(7, "a.b", "2026-11-22T14:25:16.000001Z", {"X": "1", "Y": "2"}, b"one"),
        StoredMessage(9, "a.c", "2026-11-22T14:25:17Z", {"Y": "3"}, b""),
    ]
    batch = BatchBuilder("S", headers=["Y"], payloads=True).build(messages)
    assert batch.schema == arrow_schema(True)
    rows = batch.to_pylist()
    assert [r["seq"] for r in rows] == [7, 9]
    assert [r["headers"] for r in rows] == [[("Y", "2")], [("Y", "3")]]
    assert [r["size"] for r in rows] == [3, 0]
    assert rows[0]["payload"] == b"one" and rows[0]["payload_hash"] == payload_hash(b"one")
    assert rows[0]["timestamp"].timestamp() == pytest.approx(1_795_357_516.000001)
    every = BatchBuilder("S", headers=None, payloads=False).build(messages).to_pylist()
    assert every[0]["headers"] == [("X", "1"), ("Y", "2")] and "payload" not in every[0]


@given(
    first=st.integers(min_value=1, max_value=10**9),
    span=st.integers(min_value=1, max_value=10**6),
    partitions=st.integers(min_value=1, max_value=64),
)
def test_ranges_cover_the_stream_contiguously(first: int, span: int, partitions: int) -> None:
    last = first + span - 1
    opts = ReadOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S", "partitions": str(partitions)})
    ranges = plan_ranges(first, last, span, opts)
    assert 1 <= len(ranges) <= partitions
    assert ranges[0].first == first and ranges[-1].last == last
    for a, b in itertools.pairwise(ranges):
        assert b.first == a.last + 1
    assert all(r.first <= r.last for r in ranges)


def test_an_empty_stream_plans_one_empty_range() -> None:
    opts = ReadOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S"})
    (only,) = plan_ranges(0, 0, 0, opts)
    assert only.last < only.first


def test_rows_per_partition_sets_the_count() -> None:
    opts = ReadOptions.parse({"servers": "nats://h:4222", "stream": "S", "rows_per_partition": "100"})
    assert len(plan_ranges(1, 1000, 950, opts)) == 10


def test_bad_options_are_named_with_the_fix_and_secrets_stay_out() -> None:
    with pytest.raises(AuditError) as err:
        ReadOptions.parse({"servers": "http://h", "Password": "hunter2", "bogus": "1", "timeout": "-1"})
    text = str(err.value)
    assert "stream: required" in text
    assert "bogus: unknown option" in text
    assert "servers" in text
    assert "password: given without user" in text
    assert "timeout" in text
    assert "hunter2" not in text


def test_a_configured_side_reads_with_its_own_credentials_and_tls(tmp_path: Path) -> None:
    for name in ("ca.pem", "cert.pem", "key.pem", "user.creds"):
        (tmp_path / name).write_text("x")
    target = TargetConfig(
        servers=["tls://hub:4222"],
        stream="AGG",
        domain="hub",
        auth=AuthConfig(creds_file=tmp_path / "user.creds"),
        tls=TlsConfig(ca_file=tmp_path / "ca.pem", cert_file=tmp_path / "cert.pem", key_file=tmp_path / "key.pem"),
    )
    opts = ReadOptions.parse(side_options(target))
    assert (opts.servers, opts.stream, opts.domain) == (["tls://hub:4222"], "AGG", "hub")
    assert opts.api_prefix == "$JS.hub.API"
    assert opts.auth is not None and opts.auth.creds_file == tmp_path / "user.creds"
    assert opts.tls is not None and opts.tls.key_file == tmp_path / "key.pem"
    source = SourceConfig(
        name="e1",
        servers=["nats://leaf:4222"],
        stream="O",
        filter_subjects=["a.>", "b.>"],
        auth=AuthConfig(user="u", password="p"),  # type: ignore[arg-type]
    )
    opts = ReadOptions.parse(side_options(source))
    assert opts.filter_subjects == ["a.>", "b.>"]
    assert opts.auth is not None and opts.auth.password is not None and opts.auth.password.get_secret_value() == "p"


def test_inconsistent_provenance_is_damage_and_has_its_parquet_column() -> None:
    report = SourceReport(
        source="edge1",
        origin_stream="O",
        configured=True,
        copies=3,
        distinct=3,
        first_seq=1,
        last_seq=3,
        chain_start=0,
        duplicates=0,
        reordered=0,
        lost=0,
        skipped=0,
        not_delivered=0,
        latency_ms={"p50": 1.0},
        inconsistent=2,
    )
    assert report.problems == ["2 with inconsistent provenance"] and not report.ok
    columns = [c.split()[0] for c in SourceReport.parquet_schema().split(", ")]
    row = dict(zip(columns, report.parquet_row(), strict=True))
    assert (row["inconsistent_provenance"], row["ok"]) == (2, False)
