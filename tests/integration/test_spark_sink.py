"""The ``jetstream`` sink publishes DataFrame rows to a real stream with publish acks and deterministic message ids:
a batch write lands every row once with its subject, payload and headers; a rewrite with the same ids, and a
streaming query's restart or replayed micro-batch, add nothing; a refused publish fails the write with the
server's reason. Through a TCP proxy (``chaos.proxy``): an ack that never comes (a blackhole) and a connection cut in
the middle of a batch fail the write with the sink's error, readable in PySpark's, and the write run again (a job
rerun with the same ``id_prefix``, a query restarted on its checkpoint) stores each row once.

One SparkSession for the run (the ``spark`` fixture); the streams are on the topology's hub.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType

from bridge.spark import JetStreamDataSource
from bridge.spark.session import WORKER_LATE_RETRIES, worker_was_late
from bridge.testing.jetstream import StoredMsg, connect, create_stream, read_stream, stream_messages
from bridge.testing.polling import POLL
from bridge.testing.servers import Topology
from chaos.proxy import FaultProxy, proxy_to

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


# --- faults on the link: an ack timeout and a lost connection, through a TCP proxy ----------------------------------

RATE = 4096  # bytes per second each way through the proxy: a write takes many seconds, so a fault lands mid-way
FAULTY = {"window": "4", "timeout": "2"}  # few publishes in flight (a fault stops the flow at once), a short wait


class Link:
    """A :class:`~chaos.proxy.FaultProxy` in front of ``url``, served by an event loop in a thread of its own: Spark's
    calls block the test's thread (where its session is active), and the proxy must forward meanwhile."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sink-link", daemon=True)
        self._thread.start()
        self._proxy = proxy_to(url, "sink-link")
        self.proxy = self._call(self._proxy.__aenter__())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def do(self, action: Callable[[FaultProxy], object]) -> None:
        """Run ``action`` on the proxy, on its loop (its control methods are not thread-safe)."""

        async def act() -> None:
            action(self.proxy)

        self._call(act())

    def strike_when_stored(self, stream: str, fault: Callable[[FaultProxy], object]) -> Future[int]:
        """Apply ``fault`` once the first messages are stored in ``stream`` (polled on the proxy's loop, which applies
        it at once); the future holds how many were stored then."""

        async def watch() -> int:
            async with connect(self.url) as nc:
                while (count := await stream_messages(nc, stream)) == 0:
                    await asyncio.sleep(POLL)
            fault(self.proxy)
            return count

        return asyncio.run_coroutine_threadsafe(watch(), self._loop)

    def close(self) -> None:
        """Close the proxy (aborting its connections), stop the loop and join its thread."""
        try:
            self._call(self._proxy.__aexit__(None, None, None))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            assert not self._thread.is_alive(), "the proxy's thread did not stop"
            self._loop.close()


@pytest.fixture
def link(topology: Topology) -> Iterator[Link]:
    """A proxy to the topology's hub, on a thread of its own; closed at teardown."""
    proxied = Link(topology.hub.url)
    try:
        yield proxied
    finally:
        proxied.close()


def fail_mid_write(write: Callable[[], object], link: Link, stream: str, fault: Callable[[FaultProxy], object]) -> str:
    """Run ``write`` (a Spark write, or a query to its end) with ``fault`` armed to strike once its first rows are
    stored; the text of the error it fails with, read while the JVM holds it. Started again when Spark gave up on
    its Python worker before the fault (its fixed 10 s, missed on a loaded machine)."""
    struck = link.strike_when_stored(stream, fault)
    try:
        for _ in range(WORKER_LATE_RETRIES + 1):
            try:
                write()
            except Exception as exc:
                if worker_was_late(exc) and not struck.done():
                    continue
                text = str(exc)
                break
            raise AssertionError(f"the write to {stream} did not fail")
        else:
            raise AssertionError(f"Spark's Python worker was late {WORKER_LATE_RETRIES + 1} times")
    finally:
        struck.cancel()  # nothing, once it struck
    assert not struck.cancelled(), f"the write failed before the fault: {text[-3000:]}"
    struck.result()  # the watcher's own failure, if any
    assert "<exception str() failed>" not in text
    return text


def again_if_late(call: Callable[[], T]) -> T:
    """``call()``, a write whose rows have the same ids when run again, started again while Spark gave up on its Python
    worker (its fixed 10 s, missed on a loaded machine)."""
    for attempt in range(WORKER_LATE_RETRIES + 1):
        try:
            return call()
        except Exception as exc:
            if not (worker_was_late(exc) and attempt < WORKER_LATE_RETRIES):
                raise
    raise AssertionError("unreachable")


def assert_each_row_once(got: list[StoredMsg], expected: list[bytes], id_pattern: str) -> dict[str, list[int]]:
    """Every payload of ``expected`` stored once, each with a ``Nats-Msg-Id`` matching ``id_pattern`` (a regex whose
    last group is the row index); the row indexes by id prefix (all but the index), each counting from 0 without a
    gap."""
    assert sorted(m.data for m in got) == sorted(expected), "each row stored once"
    rows_of: dict[str, list[int]] = {}
    for m in got:
        msg_id = m.headers["Nats-Msg-Id"]
        assert re.fullmatch(id_pattern, msg_id), msg_id
        prefix, index = msg_id.rsplit(":", 1)
        rows_of.setdefault(prefix, []).append(int(index))
    assert all(sorted(v) == list(range(len(v))) for v in rows_of.values()), rows_of
    return rows_of


def test_an_ack_timeout_fails_the_write_readably_and_the_rerun_stores_each_row_once(
    spark: Any, sink: str, topology: Topology, link: Link
) -> None:
    url = topology.hub.url
    run(_create(url, "SLOW", ["sink.>"]))
    df = spark.createDataFrame(rows(N), ROW_SCHEMA, verifySchema=True)  # 2 slices, fixed order: the same ids again
    options = {"servers": link.proxy.url, "stream": "SLOW", "id_prefix": "job-2"}

    def write(**extra: str) -> None:
        df.write.format(sink).mode("append").options(**options, **extra).save()

    link.do(lambda proxy: proxy.set_rate(RATE))
    # a blackhole: the connections stay open, and nothing more reaches the server or comes back
    text = fail_mid_write(lambda: write(**FAULTY), link, "SLOW", lambda proxy: proxy.stall(True))
    assert "SinkError: cannot write to stream 'SLOW', partition " in text, text[-3000:]
    assert "no publish ack within 2s for " in text, text[-3000:]
    assert "a retry publishes the same ids" in text
    assert 0 < len(stored(topology, "SLOW")) < N, "the write failed mid-way"

    # the publishes the blackhole held arrive late; the job runs again and the stream stores only what is missing
    link.do(FaultProxy.heal)
    again_if_late(write)
    got = stored(topology, "SLOW")
    assert len(got) == N
    assert_each_row_once(got, [payload for _, payload, _ in rows(N)], r"job-2:\d+:\d+")


def test_a_connection_cut_mid_batch_fails_the_query_readably_and_its_replay_stores_each_row_once(
    spark: Any, sink: str, topology: Topology, link: Link, tmp_path: Path
) -> None:
    url = topology.hub.url
    payloads = [f"copy-{i}:".encode() + b"x" * 200 for i in range(60)]  # 16 KB: seconds through the proxy

    async def fill() -> None:
        async with connect(url) as nc:
            await create_stream(nc, "FROM", ["from.>"], allow_direct=True)
            await create_stream(nc, "COPY", ["copy.>"], allow_direct=True)
            js = nc.jetstream(timeout=10)
            for i, payload in enumerate(payloads):
                await js.publish(f"from.{i % 3}", payload)

    run(fill())
    # a copy from one stream to another: the jetstream reader, 30 messages a micro-batch, into the sink
    copy = (
        spark.readStream.format("jetstream")
        .options(servers=url, stream="FROM", payloads="true", maxMessagesPerTrigger="30")
        .load()
        .selectExpr("concat('copy.', subject) as subject", "payload")
        .writeStream.format(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
    )

    def run_copy(**extra: str) -> str:
        query = copy.options(servers=link.proxy.url, stream="COPY", **extra).start()
        try:
            assert query.awaitTermination(90), "the copy did not finish within 90 s"
        finally:
            query.stop()
        return str(query.id)

    link.do(lambda proxy: proxy.set_rate(RATE))
    text = fail_mid_write(lambda: run_copy(**FAULTY), link, "COPY", FaultProxy.cut)
    assert "SinkError: cannot write to stream 'COPY', partition " in text, text[-3000:]
    assert "the connection to the server was lost meanwhile" in text, text[-3000:]
    assert 0 < len(stored(topology, "COPY")) < len(payloads), "the batch failed mid-way"

    # the restart replays the batch that failed (its commit was never written), then reads on
    link.do(FaultProxy.heal)
    query_id = again_if_late(run_copy)
    got = stored(topology, "COPY")
    assert len(got) == len(payloads)
    rows_of = assert_each_row_once(got, payloads, re.escape(query_id) + r":\d+:\d+:\d+")
    assert {prefix.split(":")[1] for prefix in rows_of} == {"0", "1"}, "two micro-batches of 30"
    assert {m.subject for m in got} == {f"copy.from.{i}" for i in range(3)}
