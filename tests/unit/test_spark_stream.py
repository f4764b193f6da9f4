"""The stream reader's pure parts: offsets, where a query starts, where a micro-batch ends, the data-loss decision,
its options, and the provenance columns every reader gives."""

from __future__ import annotations

import datetime as dt
import inspect
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyarrow", reason="the audit extra is not installed")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from bridge.core.headers import build_header_block, parse_header_block
from bridge.errors import AuditError
from bridge.io.directget import StoredMessage
from bridge.spark import JetStreamDataSource
from bridge.spark.options import ReadOptions
from bridge.spark.read import Bounds
from bridge.spark.rows import BatchBuilder, arrow_schema, spark_schema
from bridge.spark.stream import (
    JetStreamStreamReader,
    check_data_loss,
    end_seq,
    initial_seq,
    lost_range,
    offset,
    offset_seq,
    plan_batch,
)


def opts(**options: str) -> ReadOptions:
    return ReadOptions.parse({"servers": "nats://127.0.0.1:4222", "stream": "S", **options})


def test_offsets_are_json_of_the_stream_and_its_last_sequence_read() -> None:
    assert offset("S", 41) == {"stream": "S", "seq": 41}
    assert offset_seq("S", {"stream": "S", "seq": 41}) == 41
    with pytest.raises(AuditError, match=r"not of stream 'S'.*new checkpointLocation"):
        offset_seq("S", {"stream": "OTHER", "seq": 41})
    for bad in ({"stream": "S"}, {"stream": "S", "seq": -1}, {"stream": "S", "seq": True}):
        with pytest.raises(AuditError, match="not an offset"):
            offset_seq("S", bad)


def test_a_new_query_starts_at_the_first_sequence_or_where_the_options_say() -> None:
    assert initial_seq(opts(), 10, 99) == 9
    assert initial_seq(opts(), 0, 0) == 0, "a stream never written to"
    assert initial_seq(opts(), 101, 100) == 100, "a purged stream"
    assert initial_seq(opts(startingSequence="50"), 10, 99) == 49
    assert initial_seq(opts(latest="true"), 10, 99) == 99
    at = opts(startingTime="2026-11-22T14:25:16+01:00")
    assert at.starting_time_utc == dt.datetime(2026, 11, 22, 13, 25, 16, tzinfo=dt.UTC)
    assert initial_seq(at, 10, 99, at_time=42) == 41
    assert initial_seq(at, 10, 99, at_time=None) == 99, "nothing stored at or after it yet: after the last"


def test_a_micro_batch_ends_at_the_last_sequence_within_the_limit_and_the_available_now_target() -> None:
    assert end_seq(10, 1, 100) == 100
    assert end_seq(10, 1, 100, max_rows=30) == 40
    assert end_seq(90, 1, 100, max_rows=30) == 100
    assert end_seq(10, 1, 100, target=60) == 60
    assert end_seq(10, 1, 100, target=60, max_rows=30) == 40
    assert end_seq(100, 1, 100, max_rows=30) == 100, "nothing new: the start itself"
    assert end_seq(70, 1, 100, target=60) == 70, "never before the start"
    assert end_seq(50, 1, 40) == 50, "a startingSequence ahead of the stream waits for it"
    # the stream's first sequence moved past the start: the limit counts from what is still stored
    assert end_seq(10, 500, 1000, max_rows=30) == 529


@given(
    start=st.integers(min_value=0, max_value=10**6),
    first=st.integers(min_value=0, max_value=2 * 10**6),
    span=st.integers(min_value=0, max_value=10**6),
    max_rows=st.integers(min_value=1, max_value=10**5),
)
def test_batches_chain_without_overlap_and_never_exceed_the_limit(
    start: int, first: int, span: int, max_rows: int
) -> None:
    last = max(first - 1, 0) + span
    end = end_seq(start, first, last, max_rows=max_rows)
    assert start <= end <= max(start, last)
    assert end - max(start, first - 1) <= max_rows or end == start
    ranges = plan_batch(opts(rows_per_partition="1000"), start + 1, end, end - start)
    covered = [seq for r in ranges for seq in (r.first, r.last)]
    if end > start:
        assert covered[0] == start + 1 and covered[-1] == end
    else:
        assert ranges == []
    assert plan_batch(opts(), start + 1, end, 0) == [], "the stream holds nothing: nothing to read"


def test_what_was_deleted_before_it_was_read() -> None:
    assert lost_range(30, 130, 31) is None
    assert lost_range(30, 130, 10) is None
    assert lost_range(30, 130, 81) == (31, 80)
    assert lost_range(30, 40, 81) == (31, 40), "only this batch's part: the next batch reports the rest"
    assert lost_range(30, 30, 81) is None, "an empty batch loses nothing"
    assert lost_range(0, 0, 0) is None


def test_data_loss_fails_naming_the_range_or_warns_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    assert check_data_loss("S", 30, 130, 31, fail=True) == 31
    with pytest.raises(AuditError) as err:
        check_data_loss("S", 30, 130, 81, fail=True)
    assert "sequences 31..80 of stream 'S' were deleted before they were read" in str(err.value)
    assert "failOnDataLoss" in str(err.value)
    with caplog.at_level(logging.WARNING, logger="bridge.spark.stream"):
        assert check_data_loss("S", 30, 130, 81, fail=False) == 81
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "sequences 31..80 of stream 'S' were deleted" in record.getMessage()
    assert check_data_loss("S", 30, 40, 81, fail=False) == 41, "the whole batch gone: nothing to read"


def test_stream_options_by_their_spark_names() -> None:
    o = opts(startingSequence="7", maxMessagesPerTrigger="1000", failOnDataLoss="false")
    assert (o.starting_sequence, o.max_messages_per_trigger, o.fail_on_data_loss) == (7, 1000, False)
    assert o.stream_only() == ["startingSequence", "maxMessagesPerTrigger", "failOnDataLoss"]
    assert opts().stream_only() == [] and opts().fail_on_data_loss
    # Spark lowercases option keys
    assert (
        ReadOptions.parse({"servers": "nats://h:4222", "stream": "S", "startingsequence": "3"}).starting_sequence == 3
    )
    with pytest.raises(AuditError, match=r"startingSequence and latest given"):
        opts(startingSequence="3", latest="true")
    with pytest.raises(AuditError, match=r"startingTime: "):
        opts(startingTime="2026-11-22T14:25:16")  # no time zone
    with pytest.raises(AuditError, match=r"maxMessagesPerTrigger: must be between 1"):
        opts(maxMessagesPerTrigger="0")


def test_one_source_class_reads_batch_and_stream_and_leaves_write_options_to_the_writer() -> None:
    stream_options = {"servers": "nats://h:4222", "stream": "S", "maxmessagespertrigger": "10"}
    with pytest.raises(AuditError, match=r"maxMessagesPerTrigger: option\(s\) of spark.readStream"):
        JetStreamDataSource(stream_options).reader(None)  # type: ignore[arg-type]
    reader = JetStreamDataSource(stream_options).streamReader(None)  # type: ignore[arg-type]
    assert isinstance(reader, JetStreamStreamReader)
    # the writer's options are no read options: building the source must not refuse them
    source = JetStreamDataSource({"servers": "nats://h:4222", "stream": "S", "subject": "a.b", "window": "8"})
    with pytest.raises(AuditError, match="subject: unknown option"):
        source.schema()
    for name in ("writer", "streamWriter"):
        assert name in vars(JetStreamDataSource)


def test_admission_control_and_available_now_are_offered_to_spark() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

    capped = JetStreamStreamReader(opts(maxMessagesPerTrigger="500"))
    assert capped.getDefaultReadLimit() == ReadMaxRows(500)
    assert JetStreamStreamReader(opts()).getDefaultReadLimit() == ReadAllAvailable()
    # what Spark's runner checks: latestOffset takes (start, limit), and the AvailableNow mixin
    assert len(inspect.signature(capped.latestOffset).parameters) == 2
    assert isinstance(capped, SupportsTriggerAvailableNow)


def test_provenance_columns_from_a_bridge_copy_and_null_otherwise() -> None:
    copy = parse_header_block(
        build_header_block(
            None,
            source="edge1",
            stream="O",
            stream_seq=12,
            prev_seq=11,
            subject="a.b",
            timestamp_ns=1_795_357_516_123_456_789,
        )
    )
    messages = [
        StoredMessage(1, "a.b", "2026-11-22T14:25:17Z", copy, b"x"),
        StoredMessage(2, "a.c", "2026-11-22T14:25:17Z", {"X": "1"}, b"y"),
        StoredMessage(3, "a.c", "2026-11-22T14:25:17Z", {**copy, "Bridge-Seq": "twelve"}, b"z"),
    ]
    rows: list[dict[str, Any]] = BatchBuilder("S", headers=[], payloads=False).build(messages).to_pylist()
    first = rows[0]
    assert (first["source"], first["origin_stream"], first["origin_seq"]) == ("edge1", "O", 12)
    assert first["origin_time"] == dt.datetime(2026, 11, 22, 14, 25, 16, 123456, tzinfo=dt.UTC)
    assert first["origin_subject"] == "a.b"  # Bridge-Subject: before a prefix or a transform
    for row in rows[1:]:
        provenance = (row["source"], row["origin_stream"], row["origin_seq"], row["origin_time"], row["origin_subject"])
        assert provenance == (None,) * 5
    assert [r["headers"] for r in rows] == [[], [], []]
    names = [f.name for f in arrow_schema(True)]
    assert names == [c.split()[0] for c in spark_schema(True).split(", ")]
    assert names[-6:] == ["source", "origin_stream", "origin_seq", "origin_time", "origin_subject", "payload"]


class Frozen(JetStreamStreamReader):
    """The reader with the stream's state given, not read (``_bounds`` is its one read of the server here)."""

    def __init__(self, options: ReadOptions, now: Bounds) -> None:
        super().__init__(options)
        self.now = now

    def _bounds(self) -> Bounds:
        self._latest = self.now.last
        return self.now


def test_a_recreated_stream_fails_the_query_or_is_read_again_from_its_start(caplog: pytest.LogCaptureFixture) -> None:
    old = {"stream": "S", "seq": 500, "created": "2026-11-30T01:00:00Z"}
    new = Bounds(1, 40, 40, "2026-11-30T02:00:00Z")
    with pytest.raises(AuditError, match=r"deleted and created again .* new checkpointLocation, or set failOnDataLoss"):
        Frozen(opts(), new).latestOffset(old, ReadAllAvailable())
    lenient = Frozen(opts(failOnDataLoss="false"), new)
    with caplog.at_level(logging.WARNING):
        end = lenient.latestOffset(old, ReadMaxRows(25))
    assert end == {"stream": "S", "seq": 25, "created": new.created}  # from the new stream's first message
    assert "reading the new stream from its first message" in caplog.text
    assert [(r.first, r.last) for r in lenient.partitions(old, end)] == [(1, 25)]
    # an offset written before creation times were kept: a last sequence below it tells the same
    older = {"stream": "S", "seq": 500}
    with pytest.raises(AuditError, match="deleted and created again"):
        Frozen(opts(), new).latestOffset(older, ReadAllAvailable())
    # the same stream: nothing changes
    same = Bounds(1, 600, 600, "2026-11-30T01:00:00Z")
    assert Frozen(opts(), same).latestOffset(old, ReadAllAvailable()) == {**old, "seq": 600}


def test_a_batch_planned_on_a_stream_since_recreated_fails_or_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    # a restart runs again the batch its checkpoint planned but did not commit: 30..60 of the old stream
    start = {"stream": "S", "seq": 30, "created": "2026-11-30T01:00:00Z"}
    end = {**start, "seq": 60}
    new = Bounds(1, 100, 100, "2026-11-30T02:00:00Z")  # 31..60 exist again, but they are the new stream's
    with pytest.raises(AuditError, match=r"planned a micro-batch of it up to sequence 60 .* new checkpointLocation"):
        Frozen(opts(), new).partitions(start, end)
    with caplog.at_level(logging.WARNING):
        assert Frozen(opts(failOnDataLoss="false"), new).partitions(start, end) == []
    assert "the micro-batch is skipped" in caplog.text
    # an offset without a creation time: a batch ending past the stream's last sequence tells the same
    old_end = {"stream": "S", "seq": 160}
    with pytest.raises(AuditError, match="deleted and created again"):
        Frozen(opts(), new).partitions({"stream": "S", "seq": 130}, old_end)
    # the same stream: the batch is read
    same = Bounds(1, 100, 100, "2026-11-30T01:00:00Z")
    assert [(r.first, r.last) for r in Frozen(opts(), same).partitions(start, end)] == [(31, 60)]
