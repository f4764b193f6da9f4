"""The ``jetstream`` sink: ``df.write.format("jetstream")`` and ``df.writeStream.format("jetstream")`` publish rows to
a JetStream stream, each with a publish ack, and a deterministic ``Nats-Msg-Id`` so a retried task or a replayed
micro-batch is deduplicated by the stream.

Usage (:class:`bridge.spark.JetStreamDataSource`'s ``writer``/``streamWriter`` call :func:`batch_writer` and
:func:`stream_writer`; register it with ``spark.dataSource.register(JetStreamDataSource)``)::

    (df.selectExpr("concat('orders.', region) as subject", "to_json(struct(*)) as payload")
       .write.format("jetstream").mode("append")
       .option("servers", "nats://hub:4222").option("stream", "ORDERS")
       .save())

    (events.writeStream.format("jetstream")
       .option("servers", "nats://hub:4222").option("stream", "EVENTS").option("subject", "events.in")
       .option("checkpointLocation", "/chk/events")
       .start())

Rows: ``subject`` (string; optional when the ``subject`` option is set, which is also used for a null subject),
``payload`` (binary or string; null is an empty payload), ``headers`` (``map<string,string>``, optional). Any
other column is refused. Options: the reader's connection options (``servers``, ``domain``, ``user`` +
``password``, ``token``, ``nkey_seed_file``, ``creds_file``, ``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``),
``stream`` (required: each publish carries ``Nats-Expected-Stream`` and each ack is checked to come from it),
``subject``, ``window`` (publishes in flight per task, default 1024), ``timeout`` (seconds without an ack before
the task fails, default 10), and, for batch writes only, ``id_prefix``. Only ``append`` is supported (a stream
cannot be overwritten). The options are parsed here, by :class:`WriteOptions`: the reader's
:class:`~bridge.spark.options.ReadOptions` refuses the sink's options; the connection fields both share could be
factored into one model there. The driver checks, when it plans the write, that the stream exists.

Each task opens its own connection (only once it has a row), publishes pipelined: up to ``window`` publishes in
flight, every ack received on one wildcard inbox (:class:`bridge.io.target.SourcePublisher`), no await per
message. A refused publish (the stream's error text: no stream captures the subject, maximum messages with
discard new, wrong stream...), a lost connection or a missing ack fails the task, after every publish in flight
has been answered or timed out, naming the message id; a task reports success (its commit message) only when
every one of its rows was acked, as stored or as a duplicate.

Message ids (``Nats-Msg-Id``):

* streaming: ``<query id>:<batch id>:<partition id>:<row index>``. The query id is the one kept in the
  checkpoint (stable across restarts), the batch id the micro-batch's; executors read both from the task's
  local properties (``sql.streaming.queryId``, ``streaming.sql.batchId``, set by Spark 4.x's micro-batch
  engine; ``write()`` is given no batch id, only ``commit`` is). Should Spark not set the batch id, it is
  replaced by ``h<hash of the partition's first row>``, so a replay of the same rows still gets the same ids.
* batch: ``<id_prefix>:<partition id>:<row index>``. ``id_prefix`` defaults to a hash of the options and the
  time the driver planned the write: stable across task retries and speculative attempts of that write, new
  for the next write. Give the same ``id_prefix`` to make a re-run of the same job add nothing; never reuse one
  for other rows (they would be dropped as duplicates).

The ids are deterministic only if a retried task or a replayed batch sees the same rows in the same partitions
in the same order: true of Spark's replayable sources and deterministic transformations.

Limit: deduplication is the stream's, within its ``duplicate_window`` (default two minutes). A task retried, or a
micro-batch replayed, after the stream's duplicate window has passed since the first attempt publishes
duplicates; size the window to cover a retry (``duplicate_window`` in the stream's configuration).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from bridge.config.validators import LiteralSubject, int_between
from bridge.core.frames import Frame
from bridge.core.headers import encode_header_block
from bridge.core.pipeline import OutboundMessage
from bridge.core.targetwire import AckOutcome
from bridge.errors import BridgeError, PermissionDenied
from bridge.io import permissions
from bridge.io.connect import describe, open_connection
from bridge.io.target import SourcePublisher
from bridge.spark.options import StreamOptions
from bridge.spark.read import stream_info

__all__ = [
    "BATCH_ID_PROPERTY",
    "QUERY_ID_PROPERTY",
    "RowConverter",
    "SinkCommit",
    "SinkError",
    "WriteOptions",
    "batch_message_id",
    "batch_writer",
    "check_ack",
    "default_id_prefix",
    "first_row_token",
    "stream_message_id",
    "stream_writer",
]

# the task local properties Spark's micro-batch engine sets (StreamExecution.QUERY_ID_KEY,
# MicroBatchExecution.BATCH_ID_KEY); checked on Spark 4.3
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

MSG_ID = "Nats-Msg-Id"
EXPECTED_STREAM = "Nats-Expected-Stream"
_RESERVED = frozenset({MSG_ID.lower(), EXPECTED_STREAM.lower()})  # the sink sets these; a row may not
_CHUNK = 256  # publishes per write to the socket
_COLUMNS = ("subject", "payload", "headers")


class SinkError(BridgeError):
    """The sink cannot write: a bad option or column, a missing stream, or a publish refused or unanswered (the
    message names the stream, the message id and the server's reason)."""


def _id_prefix(value: str) -> str:
    if not value or any(ch.isspace() for ch in value) or not value.isascii():
        raise ValueError("must be non-empty printable ASCII without whitespace")
    return value


class WriteOptions(StreamOptions):
    """What one write to a stream needs. Build it with :meth:`parse` from a data source's options."""

    KIND: ClassVar[str] = "sink"
    KNOWN: ClassVar[str] = (
        "servers, stream, domain, user, password, token, nkey_seed_file, creds_file, tls_ca_file, tls_cert_file, "
        "tls_key_file, subject, window, timeout, id_prefix"
    )
    ERROR: ClassVar[type[BridgeError]] = SinkError
    IGNORED: ClassVar[frozenset[str]] = frozenset({"path", "checkpointlocation"})  # save(path), the checkpoint

    subject: LiteralSubject | None = None
    window: Annotated[int, int_between(1, 1_000_000)] = 1024
    id_prefix: Annotated[str, AfterValidator(_id_prefix)] | None = None


# --- message ids ------------------------------------------------------------------------------------------


def stream_message_id(query_id: str, batch_id: int | str, partition: int, row: int) -> str:
    """The ``Nats-Msg-Id`` of row ``row`` (0-based) of partition ``partition`` of a micro-batch."""
    return f"{query_id}:{batch_id}:{partition}:{row}"


def batch_message_id(prefix: str, partition: int, row: int) -> str:
    """The ``Nats-Msg-Id`` of row ``row`` (0-based) of partition ``partition`` of a batch write."""
    return f"{prefix}:{partition}:{row}"


def default_id_prefix(options: Mapping[str, str], started_ns: int) -> str:
    """A batch write's id prefix when none is given: a hash of its options and the time it was planned."""
    canonical = json.dumps(sorted((k.lower(), v) for k, v in options.items()), separators=(",", ":"))
    return hashlib.sha256(f"{canonical}\n{started_ns}".encode()).hexdigest()[:20]


def first_row_token(message: OutboundMessage) -> str:
    """``h<hash>`` of a partition's first message (subject, headers, payload): a batch id's stand-in."""
    digest = hashlib.sha256()
    for part in (message.subject.encode(), message.header_block, message.payload):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return "h" + digest.hexdigest()[:16]


# --- rows to messages -------------------------------------------------------------------------------------


def _subject_problem(subject: str) -> str | None:
    if not subject:
        return "is empty"
    if any(ch.isspace() for ch in subject):
        return "contains whitespace"
    for token in subject.split("."):
        if not token:
            return "has an empty token (leading, trailing or doubled '.')"
        if token in ("*", ">") or "*" in token or ">" in token:
            return "has a wildcard ('*' or '>'): publishes need a literal subject"
    return None


def _header_problem(name: str, value: str) -> str | None:
    if not name or not name.isascii() or not name.isprintable() or ":" in name or " " in name:
        return f"header name {name!r} must be printable ASCII without ':' or spaces"
    if "\r" in value or "\n" in value:
        return f"header {name!r} has a line break in its value"
    if name.lower() in _RESERVED:
        return f"header {name!r} is set by the sink (its message id and stream check)"
    return None


@dataclass(frozen=True, slots=True)
class RowConverter:
    """Turns rows of a checked schema into messages. Build it with :meth:`for_schema` (on the driver: a bad
    schema is one clear error before any task runs)."""

    stream: str
    subject_index: int | None
    payload_index: int
    headers_index: int | None
    default_subject: str | None

    @classmethod
    def for_schema(cls, schema: StructType, opts: WriteOptions) -> RowConverter:
        """Check the columns (:mod:`module docstring <bridge.spark.writer>`); raises :class:`SinkError`."""
        names = [f.name.lower() for f in schema.fields]
        problems = []
        for f in schema.fields:
            name = f.name.lower()
            if name not in _COLUMNS:
                problems.append(f"unknown column {f.name!r}: the sink writes subject, payload and headers")
            elif names.count(name) > 1:
                problems.append(f"column {f.name!r} appears twice")
            elif name == "subject" and not isinstance(f.dataType, StringType):
                problems.append(f"column subject must be a string, not {f.dataType.simpleString()}")
            elif name == "payload" and not isinstance(f.dataType, BinaryType | StringType):
                problems.append(f"column payload must be binary or string, not {f.dataType.simpleString()}")
            elif name == "headers" and not (
                isinstance(f.dataType, MapType)
                and isinstance(f.dataType.keyType, StringType)
                and isinstance(f.dataType.valueType, StringType)
            ):
                problems.append(f"column headers must be map<string,string>, not {f.dataType.simpleString()}")
        if "payload" not in names:
            problems.append("a payload column (binary or string) is required")
        if "subject" not in names and opts.subject is None:
            problems.append('a subject column is required, or a default subject: .option("subject", ...)')
        if problems:
            raise SinkError(f"cannot write to stream {opts.stream!r}: " + "; ".join(problems))

        def index(name: str) -> int | None:
            return names.index(name) if name in names else None

        payload = index("payload")
        assert payload is not None
        return cls(opts.stream, index("subject"), payload, index("headers"), opts.subject)

    def convert(self, row: Any, msg_id: str) -> OutboundMessage:
        """The message of one row (a Spark ``Row`` or any sequence in the schema's column order)."""
        subject = row[self.subject_index] if self.subject_index is not None else None
        if subject is None:
            subject = self.default_subject
            if subject is None:
                raise SinkError(f"row {msg_id}: null subject and no subject option")
        else:
            problem = _subject_problem(subject)
            if problem:
                raise SinkError(f"row {msg_id}: subject {subject!r} {problem}")
        payload = row[self.payload_index]
        if payload is None:
            data = b""
        elif isinstance(payload, str):
            data = payload.encode()
        else:
            data = bytes(payload)
        headers: dict[str, str] = {}
        extra = row[self.headers_index] if self.headers_index is not None else None
        if extra:
            for name, value in extra.items():
                text = "" if value is None else str(value)
                problem = _header_problem(str(name), text)
                if problem:
                    raise SinkError(f"row {msg_id}: {problem}")
                headers[str(name)] = text
        headers[MSG_ID] = msg_id
        headers[EXPECTED_STREAM] = self.stream
        return OutboundMessage(subject, encode_header_block(headers), data)


# --- publishing -------------------------------------------------------------------------------------------


def check_ack(outcome: AckOutcome, data: bytes, stream: str) -> AckOutcome:
    """``outcome`` (from :func:`~bridge.core.targetwire.parse_pub_ack`), refused when the ack came from another stream
    than ``stream``, and with a no-responders reply said the sink's way."""
    if outcome.stored:
        fast = b'{"stream":' + json.dumps(stream).encode() + b","
        if not data.startswith(fast):  # the server writes the stream first; anything else is decoded
            try:
                other = json.loads(data).get("stream")
            except (ValueError, AttributeError):
                other = None
            if other != stream:
                outcome.stored = False
                outcome.error = f"acked by stream {other!r}, not {stream!r}"
    elif outcome.error.startswith("no responders"):
        outcome.error = "no stream captures the subject (no responders)"
    return outcome


class _StreamCheckingPublisher(SourcePublisher):
    """A :class:`SourcePublisher` whose acks go through :func:`check_ack`."""

    def __init__(self, nc: Any, on_outcomes: Callable[[Sequence[AckOutcome]], None], stream: str) -> None:
        super().__init__(nc, on_outcomes)
        self._stream = stream

    def _outcomes(self, frames: Sequence[Frame]) -> list[AckOutcome]:
        judged: list[AckOutcome] = []
        for frame in frames:  # each ack judged with its own payload
            judged += [check_ack(outcome, frame[3], self._stream) for outcome in super()._outcomes((frame,))]
        return judged


@dataclass
class _Acks:
    """Publishes in flight (order -> message id, subject) and what their acks said."""

    pending: dict[int, tuple[str, str]] = field(default_factory=dict)
    stored: int = 0
    duplicates: int = 0
    failed: list[tuple[tuple[str, str], str]] = field(default_factory=list)  # ((message id, subject), why)
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    disconnects: int = 0  # connections lost while publishing: what explains acks that never came

    async def on_disconnected(self) -> None:
        self.disconnects += 1

    def on_outcomes(self, outcomes: Sequence[AckOutcome]) -> None:
        for outcome in outcomes:
            what = self.pending.pop(outcome.order, None)
            if what is None:
                continue  # a late or repeated ack
            if outcome.stored:
                self.stored += 1
                self.duplicates += outcome.duplicate
            else:
                self.failed.append((what, outcome.error))
        self.progress.set()

    async def wait(self, timeout: float) -> bool:
        """Until an ack arrives; False when none did within ``timeout`` seconds."""
        self.progress.clear()
        try:
            await asyncio.wait_for(self.progress.wait(), timeout)
        except TimeoutError:
            return False
        return True


class SinkCommit(WriterCommitMessage):
    """What one task published: its rows, and how many of them the stream stored new or as duplicates."""

    def __init__(self, partition: int, rows: int, stored: int, duplicates: int) -> None:
        self.partition = partition
        self.rows = rows
        self.stored = stored
        self.duplicates = duplicates

    def __repr__(self) -> str:
        return (
            f"SinkCommit(partition={self.partition}, rows={self.rows}, stored={self.stored}, "
            f"duplicates={self.duplicates})"
        )


async def publish_all(
    opts: WriteOptions, messages: Iterable[tuple[str, OutboundMessage]], partition: int
) -> SinkCommit:
    """Publish ``(message id, message)`` pairs with at most ``opts.window`` in flight; return when every one is
    acked. Raises :class:`SinkError` once nothing is in flight any more (acked, refused or timed out) if any
    publish failed, and as soon as ``opts.timeout`` seconds pass without an ack (the rows not sent yet never are:
    the task fails, and its retry publishes them all again under the same ids). The error says when the connection
    was lost meanwhile."""
    source = iter(messages)
    first = next(source, None)
    if first is None:
        return SinkCommit(partition, 0, 0, 0)  # an empty partition opens no connection
    source = itertools.chain([first], source)
    acks = _Acks()
    nc = await open_connection(
        opts, name="nats-bridge-spark-sink", error_type=SinkError, on_disconnected=acks.on_disconnected
    )
    publisher = _StreamCheckingPublisher(nc, acks.on_outcomes, opts.stream)
    sent = 0
    problem = ""
    denied: PermissionDenied | None = None
    silent = False  # a whole timeout passed without an ack
    lost = 0  # connections lost before the close (which counts as one)
    try:
        await publisher.start()
        while not acks.failed and not problem:
            room = opts.window - len(acks.pending)
            if room <= 0:
                if not await acks.wait(opts.timeout):
                    silent = True
                    break
                continue
            try:
                chunk = list(itertools.islice(source, min(room, _CHUNK)))
            except SinkError as exc:  # a bad row: settle what is in flight, then fail
                problem = str(exc)
                break
            if not chunk:
                break
            batch = []
            for offset, (msg_id, message) in enumerate(chunk):
                acks.pending[sent + offset] = (msg_id, message.subject)
                batch.append((message, sent + offset, 0, 0, 0, 0, 0))  # plain publishes (batch 0)
            sent += len(chunk)
            for order, _, why in await publisher.publish(batch):
                acks.failed.append((acks.pending.pop(order, ("?", "?")), why))
            await asyncio.sleep(0)  # let the read loop hand over the acks that arrived
        # settle every publish in flight; not after a silent timeout, which fails the task now: acks arriving late
        # would empty what is in flight and end the task as if done, its rows not sent yet never published
        while acks.pending and not silent:
            if not await acks.wait(opts.timeout):
                break
        lost = acks.disconnects
        # an ack that never came is explained by a permission the server denied, if it did; asked before closing,
        # which forgets the connection's denials
        record = permissions.record_for(nc)
        if acks.pending and record is not None:
            subjects = [subject for _, subject in acks.pending.values()]
            denied = record.denied(publish=subjects, listen=[publisher.acks_subject])
    finally:
        await publisher.stop()
        with contextlib.suppress(Exception):
            await nc.close()
    where = f"stream {opts.stream!r}, partition {partition}"
    if acks.pending:
        first_id, first_subject = next(iter(acks.pending.values()))
        problem = problem or (
            f"{denied} ({len(acks.pending)} of {sent} messages not stored, first: {first_id} on {first_subject})"
            if denied is not None
            else f"no publish ack within {opts.timeout:g}s for {len(acks.pending)} of {sent} messages "
            f"(first: {first_id} on {first_subject})"
        )
    if acks.failed:
        (msg_id, subject), why = acks.failed[0]
        more = f" (and {len(acks.failed) - 1} more)" if len(acks.failed) > 1 else ""
        problem = f"publish of {msg_id} to {subject} refused: {why}{more}" + (f"; then {problem}" if problem else "")
    if problem and lost:
        times = "" if lost == 1 else f" {lost} times"
        problem += f" (the connection to the server was lost{times} meanwhile)"
    if problem:
        raise SinkError(
            f"cannot write to {where}: {problem}; {acks.stored} of {sent} sent were acked "
            f"({acks.duplicates} as duplicates): the task fails, a retry publishes the same ids"
        )
    return SinkCommit(partition, sent, acks.stored - acks.duplicates, acks.duplicates)


def _run_task(opts: WriteOptions, messages: Iterator[tuple[str, OutboundMessage]], partition: int) -> SinkCommit:
    try:
        return asyncio.run(publish_all(opts, messages, partition))
    except SinkError:
        raise
    except BridgeError as exc:
        raise SinkError(f"cannot write to stream {opts.stream!r}: {exc}") from None
    except OSError as exc:
        raise SinkError(f"cannot write to stream {opts.stream!r}: {describe(exc)}") from None


def _task_context() -> TaskContext:
    ctx = TaskContext.get()
    if ctx is None:
        raise SinkError("write() runs in a Spark task; no task context here")
    return ctx


# --- the writers ------------------------------------------------------------------------------------------


class JetStreamBatchWriter(DataSourceWriter):
    """``df.write.format("jetstream")``: one task publishes its partition, ids ``<id_prefix>:<partition>:<row>``."""

    def __init__(self, opts: WriteOptions, converter: RowConverter, id_prefix: str) -> None:
        self.opts = opts
        self.converter = converter
        self.id_prefix = id_prefix

    def messages(self, rows: Iterable[Any], partition: int) -> Iterator[tuple[str, OutboundMessage]]:
        """``(message id, message)`` of one partition's rows."""
        for index, row in enumerate(rows):
            msg_id = batch_message_id(self.id_prefix, partition, index)
            yield msg_id, self.converter.convert(row, msg_id)

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        """Publish the task's rows; returns only when each one is acked (else raises :class:`SinkError`)."""
        partition = _task_context().partitionId()
        return _run_task(self.opts, self.messages(iterator, partition), partition)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: every row a task reported was acked by the stream already."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: a stream keeps what it stored; a retry with the same ids is deduplicated."""


class JetStreamStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("jetstream")``: ids ``<query id>:<batch id>:<partition>:<row>``."""

    def __init__(self, opts: WriteOptions, converter: RowConverter) -> None:
        self.opts = opts
        self.converter = converter

    def messages(
        self, rows: Iterable[Any], query_id: str, batch_id: str | None, partition: int
    ) -> Iterator[tuple[str, OutboundMessage]]:
        """``(message id, message)`` of one partition of a micro-batch (``batch_id`` None: the first row's hash
        stands in, see the module docstring)."""
        it = iter(rows)
        if batch_id is None:
            first = next(it, None)
            if first is None:
                return
            batch_id = first_row_token(self.converter.convert(first, ""))
            it = itertools.chain([first], it)
        for index, row in enumerate(it):
            msg_id = stream_message_id(query_id, batch_id, partition, index)
            yield msg_id, self.converter.convert(row, msg_id)

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        """Publish the task's rows of this micro-batch; returns only when each one is acked."""
        ctx = _task_context()
        query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            raise SinkError(
                f"no streaming query id in the task ({QUERY_ID_PROPERTY}): the jetstream stream writer runs in "
                "a micro-batch streaming query"
            )
        batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY) or None
        partition = ctx.partitionId()
        return _run_task(self.opts, self.messages(iterator, query_id, batch_id, partition), partition)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: every row a task reported was acked by the stream already."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a replay of the batch publishes the same ids, which the stream deduplicates."""


async def check_stream(opts: WriteOptions) -> dict[str, Any]:
    """The stream's configuration; :class:`SinkError` when it cannot be read (missing, unreachable)."""
    nc = await open_connection(opts, name="nats-bridge-spark-sink", error_type=SinkError)
    try:
        info = await stream_info(nc, opts, SinkError, "create it, or check the stream and domain options")
    finally:
        await nc.close()
    config: dict[str, Any] = info.get("config", {})
    return config


def _prepare(
    options: Mapping[str, str], schema: StructType, overwrite: bool, *, streaming: bool
) -> tuple[WriteOptions, RowConverter]:
    opts = WriteOptions.parse(options)
    if streaming and opts.id_prefix is not None:
        raise SinkError(
            "id_prefix applies to batch writes only: a streaming query's ids start with its query id, which its "
            "checkpoint keeps (a fixed prefix would drop a new query's rows as duplicates of an old one's)"
        )
    if overwrite:
        raise SinkError(
            f"stream {opts.stream!r}: the jetstream sink only appends (a stream cannot be overwritten): use "
            'mode("append"), or outputMode("append"/"update") for a streaming query'
        )
    converter = RowConverter.for_schema(schema, opts)
    asyncio.run(check_stream(opts))  # on the driver: a missing stream is one error, not one per task
    return opts, converter


def batch_writer(options: dict[str, str], schema: StructType, overwrite: bool) -> DataSourceWriter:
    """The writer of ``df.write.format("jetstream")`` (called on the driver, once per write)."""
    opts, converter = _prepare(options, schema, overwrite, streaming=False)
    prefix = opts.id_prefix or default_id_prefix(options, time.time_ns())
    return JetStreamBatchWriter(opts, converter, prefix)


def stream_writer(options: dict[str, str], schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
    """The writer of ``df.writeStream.format("jetstream")`` (called on the driver)."""
    opts, converter = _prepare(options, schema, overwrite, streaming=True)
    return JetStreamStreamWriter(opts, converter)
