"""``spark.read.format("jetstream")``: a JetStream stream as a DataFrame, read with batched Direct Get.

Usage::

    from bridge.audit.datasource import JetStreamDataSource
    spark.dataSource.register(JetStreamDataSource)
    df = (spark.read.format("jetstream")
          .option("servers", "nats://hub:4222").option("stream", "AGG")
          .option("creds_file", "/etc/nats-bridge/hub.creds")
          .load())

Options (see :class:`bridge.audit.options.ReadOptions`): ``servers`` (comma-separated), ``stream``, ``domain``;
one of ``user``+``password``, ``token``, ``nkey_seed_file``, ``creds_file``; ``tls_ca_file``, ``tls_cert_file``,
``tls_key_file``; ``filter_subjects`` (comma-separated); ``headers`` (``*`` for all, the default, or a
comma-separated list of names to keep); ``payloads`` (``true`` adds a ``payload`` column); ``partitions`` or
``rows_per_partition`` (default 250,000); ``batch`` (messages per Direct Get, default 4096), ``max_bytes`` (per
Direct Get, default 8 MiB), ``timeout`` (seconds per Direct Get, default 10).

Planning reads the stream's info once: the stream must exist and allow direct access. The sequences from its
first to its last *at planning time* are split into contiguous ranges, one partition each; a partition reads its
range with batched Direct Get (ADR-31, https://github.com/nats-io/nats-architecture-and-design/blob/main/adr/ADR-31.md)
over its own connection, so messages stored after planning are not read and every row is read once. A query's
comparisons of ``seq`` with a constant are pushed down: ``where seq > 5000000`` reads only those sequences.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from bridge.audit.options import ReadOptions
from bridge.audit.rows import BatchBuilder, spark_schema
from bridge.core.subjects import SubjectSet
from bridge.errors import ApiError, AuditError, BridgeError
from bridge.io.connect import open_connection
from bridge.io.directget import StoredMessage, read_batches
from bridge.io.jsapi import STREAM_NOT_FOUND, JsApi

T = TypeVar("T")


class SeqRange(InputPartition):
    """One partition: the stream sequences ``first..last`` (empty when ``last < first``)."""

    def __init__(self, first: int, last: int) -> None:  # InputPartition's own __init__ takes one value
        self.first = first
        self.last = last


def plan_ranges(first: int, last: int, messages: int, opts: ReadOptions) -> list[SeqRange]:
    """Split ``first..last`` into contiguous ranges: ``opts.partitions`` of them, or one per
    ``opts.rows_per_partition`` messages. A stream without messages gets one empty range."""
    if messages <= 0 or last < first:
        return [SeqRange(1, 0)]
    count = opts.partitions or math.ceil(messages / opts.rows_per_partition)
    span = last - first + 1
    count = max(1, min(count, span))
    step = math.ceil(span / count)
    return [SeqRange(lo, min(last, lo + step - 1)) for lo in range(first, last + 1, step)]


async def stream_bounds(opts: ReadOptions) -> tuple[int, int, int]:
    """``(first_seq, last_seq, messages)`` of the stream now; :class:`AuditError` when it cannot be read directly."""
    nc = await open_connection(opts, name="nats-bridge-audit", error_type=AuditError)
    try:
        try:
            info = await JsApi(nc, opts.api_prefix).stream_info(opts.stream, timeout=opts.timeout)
        except ApiError as exc:
            if exc.err_code == STREAM_NOT_FOUND:
                raise AuditError(
                    f"stream {opts.stream!r} not found on {', '.join(opts.servers)}"
                    + (f" (domain {opts.domain})" if opts.domain else "")
                    + ": check the stream and domain options"
                ) from None
            raise AuditError(f"stream {opts.stream!r}: {exc}") from None
        except BridgeError as exc:
            raise AuditError(f"stream {opts.stream!r}: {exc}") from None
        if not info.get("config", {}).get("allow_direct"):
            raise AuditError(
                f"stream {opts.stream!r} does not allow direct access, which the audit reads with: set "
                f"allow_direct to true (nats stream edit {opts.stream} --allow-direct); it costs nothing at rest"
            )
        state = info.get("state", {})
        return int(state.get("first_seq", 0)), int(state.get("last_seq", 0)), int(state.get("messages", 0))
    finally:
        await nc.close()


async def read_range(opts: ReadOptions, first: int, last: int) -> AsyncIterator[list[StoredMessage]]:
    """The stream's messages in ``first..last`` that match ``opts.filter_subjects``, a server batch at a time."""
    if last < first:
        return
    nc = await open_connection(opts, name="nats-bridge-audit", error_type=AuditError)
    try:
        filters = opts.filter_subjects
        # the server filters by one subject; several are matched here
        keep = SubjectSet(filters) if len(filters) > 1 else None
        batches = read_batches(
            nc,
            opts.api_prefix,
            opts.stream,
            first,
            last,
            error_type=AuditError,
            subject_filter=filters[0] if len(filters) == 1 else None,
            batch=opts.batch,
            max_bytes=opts.max_bytes,
            timeout=opts.timeout,
        )
        async for messages in batches:
            yield messages if keep is None else [m for m in messages if keep.captures(m.subject)]
    finally:
        await nc.close()


def iterate_blocking(agen: AsyncIterator[T]) -> Iterator[T]:
    """Drive an async iterator from synchronous code (a Spark Python worker) on a private event loop."""
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                item = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
            yield item
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            loop.run_until_complete(aclose())
        loop.close()


class JetStreamReader(DataSourceReader):
    """Plans sequence ranges from the stream's info and reads each with batched Direct Get."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.lowest = 1  # bounds on seq pushed down by the query (pushFilters)
        self.highest: int | None = None

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Take comparisons of ``seq`` with an integer (``where seq >= 1000000``): they narrow the range read, so
        only those sequences are fetched. Everything else is left to Spark. Spark calls this only with
        ``spark.sql.python.filterPushdown.enabled``, which :func:`bridge.audit.job.spark_session` sets."""
        for f in filters:
            value = getattr(f, "value", None)
            if getattr(f, "attribute", None) != ("seq",) or not isinstance(value, int) or isinstance(value, bool):
                yield f
                continue
            kind = type(f).__name__
            low = {"GreaterThan": value + 1, "GreaterThanOrEqual": value, "EqualTo": value}.get(kind)
            high = {"LessThan": value - 1, "LessThanOrEqual": value, "EqualTo": value}.get(kind)
            if low is None and high is None:
                yield f
                continue
            if low is not None:
                self.lowest = max(self.lowest, low)
            if high is not None:
                self.highest = high if self.highest is None else min(self.highest, high)

    def partitions(self) -> list[SeqRange]:
        """Contiguous sequence ranges covering the stream as it is now (within any pushed-down ``seq`` bounds)."""
        first, last, messages = asyncio.run(stream_bounds(self.opts))
        first = max(first, self.lowest)
        last = last if self.highest is None else min(last, self.highest)
        return plan_ranges(first, last, min(messages, last - first + 1), self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one range (a :class:`SeqRange`), one Arrow record batch per Direct Get batch."""
        if not isinstance(partition, SeqRange):
            raise TypeError(f"not a partition this reader planned: {partition!r}")
        builder = BatchBuilder(self.opts.stream, headers=self.opts.headers, payloads=self.opts.payloads)
        for messages in iterate_blocking(read_range(self.opts, partition.first, partition.last)):
            if messages:
                yield builder.build(messages)


class JetStreamDataSource(DataSource):
    """The ``jetstream`` format (module docstring)."""

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.opts = ReadOptions.parse(dict(options))

    @classmethod
    def name(cls) -> str:
        """The format name: ``jetstream``."""
        return "jetstream"

    def schema(self) -> str:
        """The rows' schema (:mod:`bridge.audit.rows`)."""
        return spark_schema(self.opts.payloads)

    def reader(self, schema: StructType) -> JetStreamReader:
        """A reader of the stream named by the options."""
        return JetStreamReader(self.opts)
