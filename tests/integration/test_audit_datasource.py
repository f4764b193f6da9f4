"""The ``jetstream`` Spark data source reads a real stream exactly: every stored message once, with its sequence,
subject, store time, size, payload hash and headers, across partition boundaries, deleted messages and filters.

One SparkSession for the whole run (the ``spark`` fixture); the streams are on the topology's hub.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import pytest
from nats.aio.client import Client

from bridge.audit.job import read_stream
from bridge.errors import AuditError
from bridge.io import wire
from bridge.spark.options import ReadOptions
from bridge.spark.read import read_range
from bridge.spark.rows import payload_hash
from bridge.testing.jetstream import Publisher, connect, create_stream, js_request
from bridge.testing.servers import Topology

T = TypeVar("T")
N = 1500
DELETED = (1, 2, 500, 501, 502, 1000, 1499)


def subject(i: int) -> str:
    return f"ds.{i % 3}"


def payload(i: int) -> bytes:
    return f"payload-{i}".encode() * (1 + i % 5)


async def fill(nc: Client, stream: str = "DS", count: int = N, **extra: Any) -> Publisher:
    await create_stream(nc, stream, [f"{stream.lower()}.>"], allow_direct=True, **extra)
    # no message ids: the rows' headers are compared whole (nobody restarts this server)
    publisher = Publisher(nc, count, subject=lambda i: f"{stream.lower()}.{i % 3}", payload=payload, msg_ids=False)
    await publisher.run()
    return publisher


async def off_loop(fn: Callable[[], T], timeout: float = 120) -> T:
    """``fn`` (blocking: Spark) in a worker thread; the test fails after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)


async def read(spark: Any, options: dict[str, str]) -> tuple[Any, int]:
    """``read_stream`` off the event loop: it blocks (and runs its own loop to read the stream's bounds)."""
    return await off_loop(lambda: read_stream(spark, options))


async def rows(spark: Any, url: str, stream: str = "DS", **options: str) -> list[Any]:
    df, _ = await read(spark, {"servers": url, "stream": stream, **options})
    collected = await off_loop(df.collect)
    return sorted(collected, key=lambda r: r["seq"])


def expected(deleted: Sequence[int] = DELETED) -> list[int]:
    return [s for s in range(1, N + 1) if s not in deleted]


@pytest.mark.anyio
async def test_every_stored_message_once_with_its_fields(spark: Any, topology: Topology) -> None:
    async with connect(topology.hub.url) as nc:
        before = time.time()
        publisher = await fill(nc)
        after = time.time()
        for seq in DELETED:
            await js_request(nc, "STREAM.MSG.DELETE.DS", {"seq": seq})
    # small batches and 7 partitions: many Direct Get batches, stepping over deleted messages (partition
    # boundaries on deleted messages: test_partition_boundaries_on_deleted_messages)
    got = await rows(spark, topology.hub.url, partitions="7", batch="64")
    assert [r["seq"] for r in got] == expected()
    index = {seq: i for i, seq in enumerate(publisher.seqs)}
    last_time = None
    for r in got:
        i = index[r["seq"]]
        assert r["stream"] == "DS"
        assert r["subject"] == publisher.subjects[r["seq"]]
        assert r["size"] == len(payload(i))
        assert r["payload_hash"] == payload_hash(payload(i))
        assert r["headers"] == {"Test-Index": str(i)}, "the message's own headers, not the Direct Get reply's"
        stamp = r["timestamp"].timestamp()
        assert before - 1 <= stamp <= after + 1
        assert last_time is None or stamp >= last_time, "store times follow sequence order"
        last_time = stamp


@pytest.mark.anyio
async def test_partitions_are_contiguous_ranges_read_in_parallel(spark: Any, topology: Topology) -> None:
    from pyspark.sql import functions as F

    async with connect(topology.hub.url) as nc:
        await fill(nc)
        for seq in DELETED:
            await js_request(nc, "STREAM.MSG.DELETE.DS", {"seq": seq})
    df, last = await read(spark, {"servers": topology.hub.url, "stream": "DS", "rows_per_partition": "400"})
    assert last == N
    per = df.groupBy(F.spark_partition_id().alias("p")).agg(
        F.min("seq").alias("lo"), F.max("seq").alias("hi"), F.count(F.lit(1)).alias("n")
    )
    parts = sorted((r["lo"], r["hi"], r["n"]) for r in await anyio.to_thread.run_sync(per.collect))
    assert len(parts) == max(spark.sparkContext.defaultParallelism, 4)  # ceil(1493 / 400) = 4
    assert sum(n for _, _, n in parts) == len(expected())
    for (_, hi, _), (lo, _, _) in itertools.pairwise(parts):
        assert hi < lo, "ranges do not overlap"


@pytest.mark.anyio
async def test_partition_boundaries_on_deleted_messages(spark: Any, topology: Topology) -> None:
    from pyspark.sql import functions as F

    # 4 partitions of 1..1000 plan 1-250, 251-500, 501-750, 751-1000
    deleted = {250, 251, *range(480, 500), *range(501, 751), 751}
    async with connect(topology.hub.url) as nc:
        await fill(nc, "PB", 1000)
        for seq in sorted(deleted):
            await js_request(nc, "STREAM.MSG.DELETE.PB", {"seq": seq})
    df, last = await read(spark, {"servers": topology.hub.url, "stream": "PB", "partitions": "4", "batch": "64"})
    assert last == 1000
    per = df.groupBy(F.spark_partition_id().alias("p")).agg(F.sort_array(F.collect_list("seq")).alias("seqs"))
    got = {r["p"]: list(r["seqs"]) for r in await off_loop(per.collect)}
    assert got == {
        # the last planned sequence (250) and the next partition's first (251) are deleted: each side reads its own
        0: list(range(1, 250)),
        # ends on 500 after a deleted run: its last Direct Get batch steps over 480-499 and the deleted 501-751
        # into the fourth partition's messages, which it must not keep
        1: [*range(252, 480), 500],
        # 2: every sequence of 501-750 deleted, so no rows (its one batch lies wholly in the next partition)
        3: list(range(752, 1001)),
    }
    everything = [r["seq"] for r in await off_loop(df.collect)]
    assert sorted(everything) == [s for s in range(1, 1001) if s not in deleted], "each message exactly once"


@pytest.mark.anyio
async def test_a_range_read_stops_when_the_end_of_batch_says_nothing_follows(topology: Topology) -> None:
    async with connect(topology.hub.url) as nc, connect(topology.hub.url) as watcher:
        await fill(nc, "TAIL", 100)
        for seq in range(91, 101):  # the stream's last sequence stays 100
            await js_request(nc, "STREAM.MSG.DELETE.TAIL", {"seq": seq})
        requests = await watcher.subscribe("$JS.API.DIRECT.GET.TAIL")
        await wire.flush(watcher)
        opts = ReadOptions.parse({"servers": topology.hub.url, "stream": "TAIL", "batch": "64"})
        with anyio.fail_after(30):
            batches = [[m.seq for m in messages] async for messages in read_range(opts, 1, 100)]
            await watcher.flush()  # the server relays the requests to us before the PONG
            asked = [json.loads((await requests.next_msg()).data) for _ in range(requests.pending_msgs)]
        assert batches == [list(range(1, 65)), list(range(65, 91))]
        # the second batch's end said no messages are pending after 90: no third request to be answered 404
        assert [(a["seq"], a["batch"]) for a in asked] == [(1, 64), (65, 36)]


@pytest.mark.anyio
async def test_seq_bounds_in_the_query_narrow_what_is_read(spark: Any, topology: Topology) -> None:
    from pyspark.sql import functions as F

    async with connect(topology.hub.url) as nc:
        await fill(nc)
    df, _ = await read(spark, {"servers": topology.hub.url, "stream": "DS", "partitions": "4"})
    narrowed = df.where("seq >= 1000 and seq < 1100 and subject != 'x'")
    per = narrowed.groupBy(F.spark_partition_id().alias("p")).agg(F.min("seq"), F.max("seq"), F.count(F.lit(1)))
    parts = sorted(tuple(r)[1:] for r in await anyio.to_thread.run_sync(per.collect))
    # pushed down, the 4 partitions split 1000..1099; read whole, all of it would sit in the third of 1..1500
    assert parts == [(1000, 1024, 25), (1025, 1049, 25), (1050, 1074, 25), (1075, 1099, 25)]
    one = await anyio.to_thread.run_sync(df.where("seq = 7").collect)
    assert [r["seq"] for r in one] == [7]


@pytest.mark.anyio
async def test_filters_payloads_and_header_selection(spark: Any, topology: Topology) -> None:
    async with connect(topology.hub.url) as nc:
        publisher = await fill(nc)
    url = topology.hub.url
    one = await rows(spark, url, filter_subjects="ds.1")
    assert [r["seq"] for r in one] == [s for s in publisher.seqs if publisher.subjects[s] == "ds.1"]
    two = await rows(spark, url, filter_subjects="ds.1, ds.2", headers="", payloads="true", partitions="3")
    assert [r["seq"] for r in two] == [s for s in publisher.seqs if publisher.subjects[s] != "ds.0"]
    index = {seq: i for i, seq in enumerate(publisher.seqs)}
    for r in two:
        assert r["headers"] == {}
        assert bytes(r["payload"]) == payload(index[r["seq"]])


@pytest.mark.anyio
async def test_empty_and_emptied_streams_read_as_no_rows(spark: Any, topology: Topology) -> None:
    async with connect(topology.hub.url) as nc:
        await create_stream(nc, "EMPTY", ["empty.>"], allow_direct=True)
        await fill(nc, "GONE", 50)
        await js_request(nc, "STREAM.PURGE.GONE")
    assert await rows(spark, topology.hub.url, stream="EMPTY") == []
    assert await rows(spark, topology.hub.url, stream="GONE") == []


@pytest.mark.anyio
async def test_streams_it_cannot_read_are_named_with_the_fix(spark: Any, topology: Topology) -> None:
    async with connect(topology.hub.url) as nc:
        await create_stream(nc, "NODIRECT", ["nodirect.>"])
    with pytest.raises(AuditError, match=r"'NODIRECT' does not allow direct access.*allow_direct"):
        await read(spark, {"servers": topology.hub.url, "stream": "NODIRECT"})
    with pytest.raises(AuditError, match=r"stream 'MISSING' not found"):
        await read(spark, {"servers": topology.hub.url, "stream": "MISSING"})
    with pytest.raises(AuditError, match=r"batch: must be between 1 and 100000"):
        await read(spark, {"servers": topology.hub.url, "stream": "DS", "batch": "0"})


@pytest.mark.anyio
async def test_a_stream_in_another_domain_is_read_across_the_leaf_link(spark: Any, topology: Topology) -> None:
    async with connect(topology.leaf.url) as leaf_nc:
        publisher = await fill(leaf_nc, "EDGE", 300)
    got = await rows(spark, topology.hub.url, stream="EDGE", domain="leaf")
    assert [r["seq"] for r in got] == publisher.seqs
