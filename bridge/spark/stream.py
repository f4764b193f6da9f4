"""``spark.readStream.format("jetstream")``: a JetStream stream as an unbounded table, read in micro-batches.

Usage::

    from bridge.spark import JetStreamDataSource
    spark.dataSource.register(JetStreamDataSource)
    rows = (spark.readStream.format("jetstream")
            .option("servers", "nats://hub:4222").option("stream", "AGG")
            .option("maxMessagesPerTrigger", "100000")
            .load())

The options, schema and reads are the batch reader's (:mod:`bridge.spark.datasource`), plus:

* ``startingSequence`` (start at that sequence), ``startingTime`` (RFC 3339: start at the first message stored
  at or after it, found with ``STREAM.MSG.GET`` ``start_time``; when none is stored yet, after the last one) or
  ``latest`` (``true``: start after the stream's last sequence); at most one of them. By default a query starts
  at the stream's first sequence. They apply to a new query only: a query restarted from its checkpoint goes on
  from the offset there. Spark keeps no offset until a first micro-batch ran: a query stopped before that
  resolves its start again (``latest`` and ``startingTime``) when restarted.
* ``maxMessagesPerTrigger``: at most that many sequences per micro-batch, so at most that many rows (fewer where
  messages were deleted or filtered out by ``filter_subjects``).
* ``failOnDataLoss`` (``true`` by default, the Kafka source's option): when the stream's first sequence has moved
  past the offset already read plus one (limits, a purge), those sequences were deleted before they were read and
  the query fails naming them; with ``false`` the range is logged (a warning, Python logging) and the query goes
  on from the first sequence. A message deleted individually is simply absent (a gap in ``seq``), unless it was
  the stream's first one after the offset: the stream's state cannot tell that from limits, so it counts as lost.

Offsets are ``{"stream": <name>, "seq": <last sequence read>, "created": <the stream's creation time>}``: JSON,
stable across restarts (a checkpoint holding another stream's offsets is refused; one without ``created``, from an
older release, is read as it is). A stream deleted and created again under its name (its creation time differs from
the offset's, or its last sequence is below the offset's) fails the query, or with ``failOnDataLoss`` false is logged
and read from its first message; a micro-batch planned on the old stream and run again by a restart is failed, or
skipped, the same way (its sequences would be the new stream's messages). A micro-batch from ``{"seq": a}`` to
``{"seq": b}`` reads the sequences ``a+1..b`` as the batch reader reads a stream: contiguous ranges split by
``rows_per_partition`` or ``partitions``, each read with batched Direct Get on its own connection, deleted sequences
stepped over.

Admission control (``DataSourceStreamReader.latestOffset(start, limit)``, ``getDefaultReadLimit``,
``SupportsTriggerAvailableNow``, PySpark 4.2 and newer; the package asks for the 4.3 it is tested with):
``maxMessagesPerTrigger`` is a ``ReadMaxRows`` read limit, and ``Trigger.AvailableNow`` reads up to the last
sequence stored when the query started, in micro-batches of at most ``maxMessagesPerTrigger``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from bridge.errors import AuditError
from bridge.spark.options import ReadOptions
from bridge.spark.read import Bounds, SeqRange, bounds_and_seq_at, plan_ranges, read_partition, stream_bounds

log = logging.getLogger(__name__)


def offset(stream: str, seq: int, created: str | None = None) -> dict[str, Any]:
    """The offset after reading ``stream`` up to ``seq``, with the stream's creation time when known (a stream deleted
    and created again under the name starts its sequences again: :func:`recreated`)."""
    return {"stream": stream, "seq": seq} if created is None else {"stream": stream, "seq": seq, "created": created}


def recreated(stream: str, start: Mapping[str, Any], now: Bounds) -> bool:
    """Whether the stream the offset ``start`` was read from is gone and ``now`` is another of the same name: its
    creation time differs, or its sequences have not reached the offset's (an offset without one: only the latter)."""
    created = start.get("created")
    return (created is not None and now.created is not None and created != now.created) or offset_seq(
        stream, start
    ) > now.last


def recreated_problem(stream: str, start: Mapping[str, Any], now: Bounds, *, planned: bool = False) -> str:
    """What the query met, for the error (``failOnDataLoss``) or the warning: ``start`` is the offset it read up to,
    or with ``planned`` the end of a micro-batch it planned and is running again (a restart)."""
    did = "planned a micro-batch of it up to" if planned else "read it up to"
    return (
        f"stream {stream!r} was deleted and created again (created {now.created or '?'}, last sequence {now.last}) "
        f"since this query {did} sequence {offset_seq(stream, start)} (created {start.get('created', '?')})"
    )


def offset_seq(stream: str, value: Mapping[str, Any]) -> int:
    """The sequence of an offset of ``stream``; :class:`AuditError` for another stream's offset (a checkpoint
    reused for another stream) or one this reader did not write."""
    seq = value.get("seq")
    if value.get("stream") != stream:
        raise AuditError(
            f"the checkpoint's offset {dict(value)} is not of stream {stream!r}, which this query reads: give the "
            "query a new checkpointLocation"
        )
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise AuditError(f"not an offset of the jetstream source: {dict(value)}")
    return seq


def initial_seq(opts: ReadOptions, first: int, last: int, at_time: int | None = None) -> int:
    """The offset (the sequence before the first one to read) a new query starts from: the stream's first
    sequence minus one by default, ``startingSequence`` minus one, the last sequence with ``latest``, and with
    ``startingTime`` the sequence before ``at_time`` (the first message at or after it; None: none is, so after
    the last)."""
    if opts.starting_sequence is not None:
        return opts.starting_sequence - 1
    if opts.latest:
        return last
    if opts.starting_time is not None:
        return last if at_time is None else at_time - 1
    return max(first - 1, 0)


def end_seq(start: int, first: int, last: int, *, target: int | None = None, max_rows: int | None = None) -> int:
    """Where a micro-batch from ``start`` ends: the stream's ``last`` sequence, at most ``target`` (the end of a
    ``Trigger.AvailableNow`` run) and at most ``max_rows`` sequences after ``start`` (or after ``first - 1``, when
    the stream's first sequence moved past ``start``: sequences that are gone do not count). Never before
    ``start``."""
    end = last if target is None else min(last, target)
    if max_rows is not None:
        end = min(end, max(start, first - 1) + max_rows)
    return max(start, end)


def lost_range(start: int, end: int, first: int) -> tuple[int, int] | None:
    """The sequences of the micro-batch ``start+1..end`` deleted before they were read: those below the stream's
    ``first`` sequence now. None when the batch starts at or above it."""
    if first <= start + 1 or end <= start:
        return None
    return start + 1, min(first - 1, end)


def check_data_loss(stream: str, start: int, end: int, first: int, *, fail: bool) -> int:
    """The first sequence of ``start+1..end`` to read. When some of it was deleted before it was read
    (:func:`lost_range`): :class:`AuditError` naming the range, or with ``fail`` false a warning and the first
    sequence still stored."""
    lost = lost_range(start, end, first)
    if lost is None:
        return start + 1
    what = (
        f"sequences {lost[0]}..{lost[1]} of stream {stream!r} were deleted before they were read (the stream's "
        f"first sequence is now {first}: its limits or a purge removed them)"
    )
    if fail:
        raise AuditError(
            f"{what}; set failOnDataLoss to false to go on from the first sequence still stored, or read the "
            "stream sooner (a larger maxMessagesPerTrigger, a shorter trigger interval) or keep it longer"
        )
    log.warning("%s; failOnDataLoss is false: going on from sequence %d", what, lost[1] + 1)
    return lost[1] + 1


def plan_batch(opts: ReadOptions, low: int, end: int, messages: int) -> list[SeqRange]:
    """The partitions of the sequences ``low..end`` (none when empty, or when the stream holds no ``messages``),
    as the batch reader splits a stream."""
    if end < low or messages <= 0:
        return []
    return plan_ranges(low, end, min(messages, end - low + 1), opts)


class JetStreamStreamReader(DataSourceStreamReader):
    """Offsets from the stream's info, micro-batches read with batched Direct Get (module docstring).

    Spark keeps one instance on the driver for the query's run (``initialOffset``, ``latestOffset``,
    ``partitions``, ``commit``) and sends it to the executors for ``read``."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._initial: dict[str, Any] | None = None
        self._target: int | None = None  # Trigger.AvailableNow: the last sequence when the query started
        self._latest: int | None = None  # the stream's last sequence when last looked at
        self._created: str | None = None  # and its creation time

    def _bounds(self) -> Bounds:
        bounds = asyncio.run(stream_bounds(self.opts))
        self._latest, self._created = bounds.last, bounds.created
        return bounds

    def initialOffset(self) -> dict[str, Any]:
        """Where a new query starts (the options ``startingSequence``, ``startingTime``, ``latest``); resolved
        once per run, so a later call (no micro-batch yet) does not move it."""
        if self._initial is None:
            at_time: int | None = None
            when = self.opts.starting_time_utc
            if when is not None:
                bounds, at_time = asyncio.run(bounds_and_seq_at(self.opts, when))
                self._latest = bounds.last
            else:
                bounds = self._bounds()
            seq = initial_seq(self.opts, bounds.first, bounds.last, at_time)
            self._initial = offset(self.opts.stream, seq, bounds.created)
        return self._initial

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> dict[str, Any]:
        """The end of the next micro-batch from ``start``, within ``limit`` (a ``ReadMaxRows`` from
        ``maxMessagesPerTrigger``, or ``ReadAllAvailable``) and the end of a ``Trigger.AvailableNow`` run; without a
        start, the stream's last sequence."""
        now = self._bounds()
        stream = self.opts.stream
        if start is None:
            return offset(stream, now.last, now.created)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        seq = offset_seq(stream, start)
        if recreated(stream, start, now):
            what = recreated_problem(stream, start, now)
            if self.opts.fail_on_data_loss:
                raise AuditError(
                    f"{what}: its sequences start again, and what the old one held after that offset is gone; give "
                    "the query a new checkpointLocation, or set failOnDataLoss to false to read the new stream from "
                    "its first message"
                )
            log.warning("%s; failOnDataLoss is false: reading the new stream from its first message", what)
            seq = 0
            self._target = None if self._target is None else now.last
        end = end_seq(seq, now.first, now.last, target=self._target, max_rows=max_rows)
        return offset(stream, end, now.created)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxMessagesPerTrigger`` as ``ReadMaxRows``; without it, ``ReadAllAvailable``."""
        n = self.opts.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The stream's last sequence as last seen (for the query's progress)."""
        if self._latest is None:
            self._bounds()
        return None if self._latest is None else offset(self.opts.stream, self._latest, self._created)

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: read up to the stream's last sequence now, nothing stored later."""
        self._target = self._bounds().last

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[SeqRange]:
        """The sequences after ``start`` up to ``end`` as contiguous ranges; what the stream deleted before it
        was read fails the query or, with ``failOnDataLoss`` false, is logged and skipped. So is the whole
        micro-batch when the stream it was planned on was deleted and created again since (a restart running a
        batch its checkpoint planned but did not commit): its sequences would be the new stream's messages."""
        stream = self.opts.stream
        low, high = offset_seq(stream, start), offset_seq(stream, end)
        if start.get("created") is not None and end.get("created") not in (None, start.get("created")):
            low = 0  # a re-created stream (latestOffset decided, with failOnDataLoss false): from its beginning
        if high <= low:
            return []
        now = self._bounds()
        if recreated(stream, end, now):
            what = recreated_problem(stream, end, now, planned=True)
            if self.opts.fail_on_data_loss:
                raise AuditError(
                    f"{what}: that batch's messages are gone (the new stream's under the same sequences are others); "
                    "give the query a new checkpointLocation, or set failOnDataLoss to false to skip the batch and "
                    "read the new stream from its first message"
                )
            log.warning(
                "%s; failOnDataLoss is false: the micro-batch is skipped, the new stream is read from its first "
                "message",
                what,
            )
            return []
        read_from = check_data_loss(stream, low, high, now.first, fail=self.opts.fail_on_data_loss)
        return plan_batch(self.opts, read_from, high, now.messages)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one range, one Arrow record batch per Direct Get batch."""
        return read_partition(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the stream keeps its messages by its own limits, whatever was read."""


SupportsTriggerAvailableNow.register(JetStreamStreamReader)  # an ABC: registered, it is one for Spark's isinstance
