"""``spark.readStream.format("jetstream")`` on a real stream and the test session's Spark: every message once and in
order, offsets that survive a restart, ``maxMessagesPerTrigger``, where a query starts, data loss, a stream deleted and
created again under a query, and the provenance columns.

Queries write with ``foreachBatch`` into a list (each micro-batch's sequences, in the order Spark hands them over)
and mostly run with ``Trigger.AvailableNow``; each is bounded in time.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bridge.core.headers import build_header_block, parse_header_block
from bridge.spark.session import WORKER_LATE_RETRIES, worker_was_late
from bridge.testing.jetstream import Publisher, connect, create_stream, js_request
from bridge.testing.servers import Topology

pytestmark = pytest.mark.integration

T = TypeVar("T")
QUERY_TIMEOUT = 60


def run(coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def publish(url: str, stream: str, count: int, *, create: bool = False, **config: Any) -> list[int]:
    """Publish ``count`` messages to ``<stream>.<i % 3>`` (creating the stream first when asked); their sequences."""
    async with connect(url) as nc:
        if create:
            await create_stream(nc, stream, [f"{stream.lower()}.>"], allow_direct=True, **config)
        publisher = Publisher(nc, count, subject=lambda i: f"{stream.lower()}.{i % 3}")
        await publisher.run()
        return publisher.seqs


class Query:
    """One streaming query of the jetstream source into a list of micro-batches (``foreachBatch``)."""

    def __init__(self, spark: Any, url: str, stream: str, checkpoint: Path, **options: str) -> None:
        self.batches: list[list[int]] = []
        self.rows: list[Any] = []

        def collect(df: Any, _batch_id: int) -> None:
            rows = df.collect()
            self.rows.extend(rows)
            self.batches.append([r["seq"] for r in rows])

        reader = spark.readStream.format("jetstream").option("servers", url).option("stream", stream)
        self.writer = (
            reader.options(**options)
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(checkpoint))
        )

    def available_now(self) -> Any:
        """Run with ``Trigger.AvailableNow`` to its end; the stopped query (its ``recentProgress``)."""
        query, failure = self._run_available_now()
        if failure is not None:
            raise failure
        return query

    def failure(self) -> str:
        """Run with ``Trigger.AvailableNow``, expecting it to fail: the error's text."""
        from pyspark.errors import StreamingQueryException

        _, failure = self._run_available_now()
        assert isinstance(failure, StreamingQueryException), "the query did not fail"
        return str(failure)

    def _run_available_now(self) -> tuple[Any, Exception | None]:
        """Run with ``Trigger.AvailableNow`` to its end, started again while Spark gave up on its Python worker (its
        fixed 10 s, missed on a loaded machine: as ingest does); the stopped query and how it failed, if it did."""
        from pyspark.errors import StreamingQueryException

        for attempt in range(WORKER_LATE_RETRIES + 1):
            query = self.writer.trigger(availableNow=True).start()
            failure: Exception | None = None
            try:
                ended = query.awaitTermination(QUERY_TIMEOUT)
            except StreamingQueryException as exc:
                failure, ended = exc, True
            finally:
                query.stop()
            assert ended, "the query did not end in time"
            if not (worker_was_late(failure) and attempt < WORKER_LATE_RETRIES):
                return query, failure
        raise AssertionError("unreachable")

    def seqs(self) -> list[int]:
        return [s for batch in self.batches for s in batch]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_every_message_once_in_order_and_a_restart_reads_only_new_ones(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    url = topology.hub.url
    seqs = run(publish(url, "ONCE", 600, create=True))
    deleted = {1, 2, 200, 201, 333, 599}

    async def delete() -> None:
        async with connect(url) as nc:
            for seq in sorted(deleted):
                await js_request(nc, "STREAM.MSG.DELETE.ONCE", {"seq": seq})

    run(delete())
    checkpoint = tmp_path / "chk"
    first = Query(spark, url, "ONCE", checkpoint, partitions="3", batch="64")
    first.available_now()
    assert first.seqs() == [s for s in seqs if s not in deleted], "every stored message once, in sequence order"

    more = run(publish(url, "ONCE", 150))
    again = Query(spark, url, "ONCE", checkpoint, partitions="3", batch="64")
    again.available_now()
    assert again.seqs() == more, "after a restart: only what was stored since, none twice"

    nothing = Query(spark, url, "ONCE", checkpoint)
    nothing.available_now()
    assert nothing.seqs() == []


def test_max_messages_per_trigger_bounds_each_micro_batch(spark: Any, topology: Topology, tmp_path: Path) -> None:
    url = topology.hub.url
    seqs = run(publish(url, "CAP", 100, create=True))
    query = Query(spark, url, "CAP", tmp_path / "chk", maxMessagesPerTrigger="30")
    stopped = query.available_now()
    assert query.batches == [seqs[0:30], seqs[30:60], seqs[60:90], seqs[90:100]]
    rows = [p["numInputRows"] for p in stopped.recentProgress]
    assert [n for n in rows if n] == [30, 30, 30, 10]
    source = stopped.recentProgress[-1]["sources"][0]
    end, latest = json.loads(source["endOffset"]), json.loads(source["latestOffset"])
    assert end == latest == {"stream": "CAP", "seq": 100, "created": end["created"]}, "reportLatestOffset"
    assert end["created"].startswith("20"), end  # the stream's creation time (a re-created one tells apart)


def test_where_a_query_starts(spark: Any, topology: Topology, tmp_path: Path) -> None:
    url = topology.hub.url
    before = run(publish(url, "START", 20, create=True))
    middle = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    after = run(publish(url, "START", 20))

    by_seq = Query(spark, url, "START", tmp_path / "seq", startingSequence="15")
    by_seq.available_now()
    assert by_seq.seqs() == [*before[14:], *after]

    by_time = Query(spark, url, "START", tmp_path / "time", startingTime=middle.isoformat())
    by_time.available_now()
    assert by_time.seqs() == after, "the first message stored at or after startingTime, and on"

    # with a trigger interval, not AvailableNow: maxMessagesPerTrigger still caps each micro-batch
    latest = Query(spark, url, "START", tmp_path / "latest", latest="true", maxMessagesPerTrigger="4")
    query = latest.writer.trigger(processingTime="200 milliseconds").start()
    late = 0

    def first_trigger() -> bool:
        nonlocal query, late
        if not query.isActive and worker_was_late(query.exception()) and late < WORKER_LATE_RETRIES:
            late += 1  # Spark's fixed 10 s for its Python worker, missed on a loaded machine: start it again
            query = latest.writer.trigger(processingTime="200 milliseconds").start()
        return bool(query.status["message"] == "Waiting for data to arrive")

    try:
        # the first trigger resolves the start (nothing new yet); then what is stored is read
        wait_for(first_trigger, "the first trigger", timeout=30 * (WORKER_LATE_RETRIES + 1))
        new = run(publish(url, "START", 10))
        query.processAllAvailable()
    finally:
        query.stop()
    assert latest.seqs() == new, "latest: only what was stored after the query started"
    assert all(len(b) <= 4 for b in latest.batches), latest.batches

    with pytest.raises(Exception, match=r"startingSequence and latest given"):
        Query(spark, url, "START", tmp_path / "both", startingSequence="3", latest="true").available_now()


def test_deleted_before_read_fails_naming_the_range_unless_fail_on_data_loss_is_false(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    url = topology.hub.url
    seqs = run(publish(url, "LOSS", 30, create=True, max_msgs=50))
    checkpoint = tmp_path / "chk"
    first = Query(spark, url, "LOSS", checkpoint)
    first.available_now()
    assert first.seqs() == seqs

    run(publish(url, "LOSS", 100))  # 131 stored, the limit keeps 81..130: 31..80 were never read
    failed = Query(spark, url, "LOSS", checkpoint)
    text = failed.failure()
    assert "sequences 31..80 of stream 'LOSS' were deleted before they were read" in text
    assert "failOnDataLoss" in text
    assert failed.seqs() == []

    goes_on = Query(spark, url, "LOSS", checkpoint, failOnDataLoss="false")
    goes_on.available_now()
    assert goes_on.seqs() == list(range(81, 131)), "from the first sequence still stored"


def test_provenance_columns_from_bridge_copies_and_null_on_plain_messages(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    from bridge.audit.job import read_stream

    url = topology.hub.url
    origin_ns = 1_795_357_516_123_456_789

    async def fill() -> None:
        async with connect(url) as nc:
            await create_stream(nc, "PROV", ["prov.>"], allow_direct=True)
            js = nc.jetstream(timeout=5)
            for i in range(1, 4):
                block = build_header_block(
                    {"Nats-Msg-Id": "theirs"},
                    source="edge1",
                    stream="ORIGIN",
                    stream_seq=100 + i,
                    prev_seq=99 + i,
                    subject=f"orders.{i}",
                    timestamp_ns=origin_ns + i * 1000,
                )
                await js.publish(f"prov.orders.{i}", b"copy", headers=parse_header_block(block))
            await js.publish("prov.plain", b"plain", headers={"X": "1"})
            # the bridge's headers without Bridge-Time: a copy, its origin time unknown
            old = {"Bridge-Source": "e2", "Bridge-Stream": "O", "Bridge-Seq": "7"}
            await js.publish("prov.old", b"old", headers=old)

    run(fill())
    query = Query(spark, url, "PROV", tmp_path / "chk", headers="X")
    query.available_now()
    batch_df, _ = read_stream(spark, {"servers": url, "stream": "PROV", "headers": "X"})
    columns = ["seq", "source", "origin_stream", "origin_seq"]
    for rows in (query.rows, batch_df.orderBy("seq").collect()):
        got = [tuple(r[c] for c in columns) for r in rows]
        assert got == [
            *((i, "edge1", "ORIGIN", 100 + i) for i in range(1, 4)),
            (4, None, None, None),
            (5, "e2", "O", 7),
        ]
        times = [r["origin_time"] for r in rows]
        assert times[3:] == [None, None]
        for i, stamp in enumerate(times[:3], start=1):
            assert abs(round(stamp.timestamp() * 1_000_000) - (origin_ns + i * 1000) // 1000) <= 1
        # parsed from all the headers, whatever the headers option keeps
        assert [r["headers"] for r in rows] == [{}, {}, {}, {"X": "1"}, {}]


def test_a_recreated_stream_fails_the_query_naming_it_unless_fail_on_data_loss_is_false(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    url = topology.hub.url
    old = run(publish(url, "REDO", 30, create=True))
    checkpoint = tmp_path / "chk"
    first = Query(spark, url, "REDO", checkpoint)
    first.available_now()
    assert first.seqs() == old

    async def recreate() -> list[int]:
        async with connect(url) as nc:
            await js_request(nc, "STREAM.DELETE.REDO")
        # more messages than the query read: only the creation time tells the new stream from the old one
        return await publish(url, "REDO", 45, create=True)

    new = run(recreate())
    assert new == list(range(1, 46))
    failed = Query(spark, url, "REDO", checkpoint)
    text = failed.failure()
    assert "AuditError: stream 'REDO' was deleted and created again" in text, text[-3000:]
    assert "<exception str() failed>" not in text
    assert "new checkpointLocation" in text and "failOnDataLoss" in text
    assert failed.seqs() == []

    # batch 0 as if its commit was lost: the restart runs it again, on a stream that is not the one it was planned on
    (checkpoint / "commits" / "0").unlink()
    (checkpoint / "commits" / ".0.crc").unlink(missing_ok=True)
    goes_on = Query(spark, url, "REDO", checkpoint, failOnDataLoss="false")
    goes_on.available_now()
    assert (checkpoint / "commits" / "0").exists(), "batch 0 was not run again"
    # batch 0 skipped (its messages are gone: the new stream's 1..30 are others), then the new stream from its start
    assert [b for b in goes_on.batches if b] == [new], goes_on.batches
