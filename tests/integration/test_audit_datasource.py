"""The ``jetstream`` Spark data source reads a real stream exactly: every stored message once, with its sequence,
subject, store time, size, payload hash and headers, across partition boundaries, deleted messages and filters.

One SparkSession for the whole run (the ``spark`` fixture); the streams are on the topology's hub.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from bridge.audit.job import read_stream
from bridge.audit.rows import payload_hash
from bridge.embedded import Topology
from bridge.errors import AuditError

from .helpers import Publisher, connect, create_stream, js_request

N = 1500
DELETED = (1, 2, 500, 501, 502, 1000, 1499)


def subject(i: int) -> str:
    return f"ds.{i % 3}"


def payload(i: int) -> bytes:
    return f"payload-{i}".encode() * (1 + i % 5)


async def fill(nc: Client, stream: str = "DS", count: int = N, **extra: Any) -> Publisher:
    await create_stream(nc, stream, [f"{stream.lower()}.>"], allow_direct=True, **extra)
    publisher = Publisher(nc, count, subject=lambda i: f"{stream.lower()}.{i % 3}", payload=payload)
    await publisher.run()
    return publisher


async def read(spark: Any, options: dict[str, str]) -> tuple[Any, int]:
    """``read_stream`` off the event loop: it blocks (and runs its own loop to read the stream's bounds)."""
    return await anyio.to_thread.run_sync(read_stream, spark, options)


async def rows(spark: Any, url: str, stream: str = "DS", **options: str) -> list[Any]:
    df, _ = await read(spark, {"servers": url, "stream": stream, **options})
    collected = await anyio.to_thread.run_sync(df.collect)
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
    # small batches and 7 partitions: many Direct Get batches, and boundaries falling on deleted messages
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
