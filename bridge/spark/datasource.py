"""``spark.read.format("jetstream")``: a JetStream stream as a DataFrame, read with batched Direct Get; the same
class reads it as a stream (``spark.readStream``, :mod:`bridge.spark.stream`) and writes to one (``df.write`` and
``df.writeStream``, :mod:`bridge.spark.writer`).

Usage::

    from bridge.spark import JetStreamDataSource
    spark.dataSource.register(JetStreamDataSource)
    df = (spark.read.format("jetstream")
          .option("servers", "nats://hub:4222").option("stream", "AGG")
          .option("creds_file", "/etc/nats-bridge/hub.creds")
          .load())

Options (see :class:`bridge.spark.options.ReadOptions`): ``servers`` (comma-separated), ``stream``, ``domain``;
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
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from bridge.errors import AuditError
from bridge.spark.options import ReadOptions
from bridge.spark.read import SeqRange, plan_ranges, read_partition, stream_bounds
from bridge.spark.rows import spark_schema

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter

    from bridge.spark.stream import JetStreamStreamReader


class JetStreamReader(DataSourceReader):
    """Plans sequence ranges from the stream's info and reads each with batched Direct Get."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.lowest = 1  # bounds on seq pushed down by the query (pushFilters)
        self.highest: int | None = None

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        """Take comparisons of ``seq`` with an integer (``where seq >= 1000000``): they narrow the range read, so
        only those sequences are fetched. Everything else is left to Spark. Spark calls this only with
        ``spark.sql.python.filterPushdown.enabled``, which :func:`bridge.spark.session.spark_session` sets."""
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
        first, last, messages, _ = asyncio.run(stream_bounds(self.opts))
        first = max(first, self.lowest)
        last = last if self.highest is None else min(last, self.highest)
        return plan_ranges(first, last, min(messages, last - first + 1), self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one range (a :class:`SeqRange`), one Arrow record batch per Direct Get batch."""
        return read_partition(self.opts, partition)


class JetStreamDataSource(DataSource):
    """The ``jetstream`` format (module docstring): the batch and stream readers, and the sink's writers.

    The options are parsed when a reader is asked for, not when Spark builds the source: a write takes options a
    read does not (:mod:`bridge.spark.writer` parses its own)."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``jetstream``."""
        return "jetstream"

    @property
    def opts(self) -> ReadOptions:
        """The options, parsed for a read (:class:`ReadOptions`; a bad one is an :class:`AuditError`)."""
        return ReadOptions.parse(dict(self.options))

    def schema(self) -> str:
        """The rows' schema (:mod:`bridge.spark.rows`)."""
        return spark_schema(self.opts.payloads)

    def reader(self, schema: StructType) -> JetStreamReader:
        """A reader of the stream named by the options (the stream reader's own options refused)."""
        opts = self.opts
        given = opts.stream_only()
        if given:
            raise AuditError(
                f"{', '.join(given)}: option(s) of spark.readStream; spark.read reads the whole stream (narrow it "
                "with a condition on seq, e.g. .where('seq > 1000'))"
            )
        return JetStreamReader(opts)

    def streamReader(self, schema: StructType) -> JetStreamStreamReader:
        """A stream reader of the stream named by the options (:mod:`bridge.spark.stream`)."""
        from bridge.spark.stream import JetStreamStreamReader

        return JetStreamStreamReader(self.opts)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """``df.write.format("jetstream")``: :func:`bridge.spark.writer.batch_writer`."""
        from bridge.spark.writer import batch_writer  # type: ignore[import-not-found, unused-ignore]

        out: DataSourceWriter = batch_writer(dict(self.options), schema, overwrite)
        return out

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``df.writeStream.format("jetstream")``: :func:`bridge.spark.writer.stream_writer`."""
        from bridge.spark.writer import stream_writer  # type: ignore[import-not-found, unused-ignore]

        out: DataSourceStreamWriter = stream_writer(dict(self.options), schema, overwrite)
        return out
