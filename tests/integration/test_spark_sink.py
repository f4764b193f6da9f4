"""The ``jetstream`` sink publishes DataFrame rows to a real stream with publish acks and deterministic message ids:
a batch write lands every row once with its subject, payload and headers; a rewrite with the same ids, and a
streaming query's restart or replayed micro-batch, add nothing; a refused publish fails the write with the
server's reason.

One SparkSession for the run (the ``spark`` fixture); the streams are on the topology's hub.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType

from bridge.spark import JetStreamDataSource
from bridge.testing.jetstream import StoredMsg, connect, create_stream, read_stream
from bridge.testing.servers import Topology

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

T = TypeVar("T")
N = 300


@pytest.fixture(scope="module")
def sink(spark: Any) -> str:
    """The format name that writes with :mod:`bridge.spark.writer`: ``jetstream``, registered again in case a
    test before replaced it."""
    spark.dataSource.register(JetStreamDataSource)
    return "jetstream"


def run(coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _create(url: str, name: str, subjects: list[str], **extra: Any) -> None:
    async with connect(url) as nc:
        await create_stream(nc, name, subjects, allow_direct=True, **extra)


async def _read(url: str, name: str) -> list[StoredMsg]:
    async with connect(url) as nc:
        return await read_stream(nc, name)


def stored(topology: Topology, name: str) -> list[StoredMsg]:
    return run(_read(topology.hub.url, name))


ROW_SCHEMA = StructType(
    [
        StructField("subject", StringType()),
        StructField("payload", BinaryType()),
        StructField("headers", MapType(StringType(), StringType())),
    ]
)


def rows(count: int) -> list[tuple[str, bytes, dict[str, str] | None]]:
    return [(f"sink.{i % 3}", f"payload-{i}".encode(), {"Row": str(i)} if i % 2 else None) for i in range(count)]


def test_batch_write_lands_each_row_once_and_a_rewrite_with_the_same_ids_adds_nothing(
    spark: Any, sink: str, topology: Topology
) -> None:
    url = topology.hub.url
    run(_create(url, "SINK", ["sink.>"]))
    df = spark.createDataFrame(rows(N), ROW_SCHEMA, verifySchema=True)  # parallelize: 2 slices, fixed order
    options = {"servers": url, "stream": "SINK", "id_prefix": "job-1", "window": "16"}
    df.write.format(sink).mode("append").options(**options).save()

    got = stored(topology, "SINK")
    assert len(got) == N
    by_payload = {m.data: m for m in got}
    assert len(by_payload) == N
    ids = set()
    for i, (subject, payload, headers) in enumerate(rows(N)):
        msg = by_payload[payload]
        assert msg.subject == subject, i
        assert msg.headers.get("Row") == (headers or {}).get("Row"), i
        assert msg.headers["Nats-Expected-Stream"] == "SINK"
        ids.add(msg.headers["Nats-Msg-Id"])
    # <id_prefix>:<partition>:<row index>, rows numbered from 0 in each partition
    assert all(i.startswith("job-1:") for i in ids)
    by_partition: dict[str, list[int]] = {}
    for msg_id in ids:
        _, part, index = msg_id.split(":")
        by_partition.setdefault(part, []).append(int(index))
    assert sum(len(v) for v in by_partition.values()) == N
    assert all(sorted(v) == list(range(len(v))) for v in by_partition.values())

    # the same job again (same id_prefix): every publish is acked as a duplicate, nothing is stored
    df.write.format(sink).mode("append").options(**options).save()
    assert len(stored(topology, "SINK")) == N

    # without id_prefix, each write is a new job with ids of its own
    options.pop("id_prefix")
    df.write.format(sink).mode("append").options(**options).save()
    assert len(stored(topology, "SINK")) == 2 * N


def test_a_default_subject_and_string_payloads(spark: Any, sink: str, topology: Topology) -> None:
    url = topology.hub.url
    run(_create(url, "PLAIN", ["plain.>"]))
    df = spark.range(10).selectExpr("cast(id as string) as payload")
    df.write.format(sink).mode("append").options(servers=url, stream="PLAIN", subject="plain.in").save()
    got = stored(topology, "PLAIN")
    assert sorted(int(m.data) for m in got) == list(range(10))
    assert {m.subject for m in got} == {"plain.in"}


def _stream_once(spark: Any, sink: str, url: str, source: Path, checkpoint: Path) -> str:
    """Run the text files in ``source`` through the sink until all are processed; the query id."""
    query = (
        spark.readStream.format("text")
        .option("maxFilesPerTrigger", 1)
        .load(str(source))
        .selectExpr("value as payload")
        .writeStream.format(sink)
        .options(servers=url, stream="EVENTS", subject="events.in")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(60), "the streaming query did not finish within 60 s"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return str(query.id)


def test_streaming_restart_and_replayed_batch_publish_each_row_once(
    spark: Any, sink: str, topology: Topology, tmp_path: Path
) -> None:
    url = topology.hub.url
    run(_create(url, "EVENTS", ["events.>"]))
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    (source / "a.txt").write_text("".join(f"a-{i}\n" for i in range(40)))
    query_id = _stream_once(spark, sink, url, source, checkpoint)
    assert len(stored(topology, "EVENTS")) == 40

    # a restart from the checkpoint goes on with the next file, as batch 1
    (source / "b.txt").write_text("".join(f"b-{i}\n" for i in range(25)))
    assert _stream_once(spark, sink, url, source, checkpoint) == query_id
    got = stored(topology, "EVENTS")
    expected = {f"a-{i}" for i in range(40)} | {f"b-{i}" for i in range(25)}
    assert sorted(m.data.decode() for m in got) == sorted(expected)
    batches = {m.data.decode()[0]: m.headers["Nats-Msg-Id"].split(":")[1] for m in got}
    assert batches == {"a": "0", "b": "1"}
    assert all(m.headers["Nats-Msg-Id"].startswith(f"{query_id}:") for m in got)

    # batch 1 written but its commit lost: the restart replays it, and the stream drops every publish as a duplicate
    (checkpoint / "commits" / "1").unlink()
    (checkpoint / "commits" / ".1.crc").unlink(missing_ok=True)
    assert _stream_once(spark, sink, url, source, checkpoint) == query_id
    assert (checkpoint / "commits" / "1").exists(), "batch 1 was not replayed"
    assert len(stored(topology, "EVENTS")) == 65


@pytest.mark.parametrize(
    ("stream", "subject", "reason"),
    [
        ("FULL", "full.x", "maximum messages exceeded"),  # max_msgs 5, discard new
        ("FULL", "other.x", "expected stream does not match"),  # captured by OTHER, not the stream named
        ("FULL", "nowhere.x", "no stream captures the subject"),
    ],
)
def test_a_refused_publish_fails_the_write_with_the_servers_reason(
    spark: Any, sink: str, topology: Topology, stream: str, subject: str, reason: str
) -> None:
    url = topology.hub.url
    run(_create(url, "FULL", ["full.>"], max_msgs=5, discard="new"))
    run(_create(url, "OTHER", ["other.>"]))
    df = spark.range(20).selectExpr("cast(id as string) as payload")
    with pytest.raises(Exception) as failure:
        df.write.format(sink).mode("append").options(servers=url, stream=stream, subject=subject).save()
    assert reason in str(failure.value), str(failure.value)[-2000:]
    assert len(stored(topology, "OTHER")) == 0


def test_a_missing_stream_or_bad_column_is_one_error_before_any_task(spark: Any, sink: str, topology: Topology) -> None:
    url = topology.hub.url
    df = spark.range(3).selectExpr("cast(id as string) as payload")
    with pytest.raises(Exception, match="stream 'NOPE' not found"):
        df.write.format(sink).mode("append").options(servers=url, stream="NOPE", subject="a.b").save()
    run(_create(url, "COLS", ["cols.>"]))
    with pytest.raises(Exception, match="unknown column 'id'"):
        spark.range(3).selectExpr("id", "'x' as payload").write.format(sink).mode("append").options(
            servers=url, stream="COLS", subject="cols.a"
        ).save()
    with pytest.raises(Exception, match="only appends"):
        df.write.format(sink).mode("overwrite").options(servers=url, stream="COLS", subject="cols.a").save()
