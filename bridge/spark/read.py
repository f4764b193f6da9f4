"""How the ``jetstream`` readers read a stream, batch and streaming alike: the stream's bounds from its info, the
split of a sequence range into contiguous partitions, and the read of one partition with batched Direct Get
(ADR-31, https://github.com/nats-io/nats-architecture-and-design/blob/main/adr/ADR-31.md) into Arrow record
batches (:mod:`bridge.spark.rows`), each partition on its own connection.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple, TypeVar

import pyarrow as pa
from nats.aio.client import Client as NATS
from pyspark.sql.datasource import InputPartition

from bridge.core.subjects import SubjectSet
from bridge.errors import ApiError, AuditError, BridgeError
from bridge.io.connect import close_connection, open_connection
from bridge.io.directget import StoredMessage, read_batches
from bridge.io.jsapi import STREAM_NOT_FOUND, JsApi
from bridge.spark.options import ReadOptions, StreamOptions
from bridge.spark.rows import BatchBuilder

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


class Bounds(NamedTuple):
    """What a stream holds now: its first and last sequence, how many messages, and when it was created (the
    server's ``created``: a stream deleted and created again under the same name has another)."""

    first: int
    last: int
    messages: int
    created: str | None = None


async def stream_bounds(opts: ReadOptions) -> Bounds:
    """The stream's :class:`Bounds` now; :class:`AuditError` when it cannot be read directly."""
    nc = await open_connection(opts, name="nats-bridge spark", error_type=AuditError)
    try:
        return await _bounds(nc, opts)
    finally:
        await close_connection(nc)


async def stream_info(nc: NATS, opts: StreamOptions, error: type[BridgeError], fix: str) -> dict[str, Any]:
    """``STREAM.INFO`` of ``opts.stream``, every failure raised as ``error`` (a missing stream naming ``fix``)."""
    try:
        return await JsApi(nc, opts.api_prefix).stream_info(opts.stream, timeout=opts.timeout)
    except ApiError as exc:
        if exc.err_code == STREAM_NOT_FOUND:
            raise error(
                f"stream {opts.stream!r} not found on {', '.join(opts.servers)}"
                + (f" (domain {opts.domain})" if opts.domain else "")
                + f": {fix}"
            ) from None
        raise error(f"stream {opts.stream!r}: {exc}") from None
    except BridgeError as exc:
        raise error(f"stream {opts.stream!r}: {exc}") from None


async def _bounds(nc: NATS, opts: ReadOptions) -> Bounds:
    info = await stream_info(nc, opts, AuditError, "check the stream and domain options")
    if not info.get("config", {}).get("allow_direct"):
        raise AuditError(
            f"stream {opts.stream!r} does not allow direct access, which the audit reads with: set "
            f"allow_direct to true (nats stream edit {opts.stream} --allow-direct); it costs nothing at rest"
        )
    state = info.get("state", {})
    created = info.get("created")
    return Bounds(
        int(state.get("first_seq", 0)),
        int(state.get("last_seq", 0)),
        int(state.get("messages", 0)),
        created if isinstance(created, str) else None,
    )


async def bounds_and_seq_at(opts: ReadOptions, when: dt.datetime) -> tuple[Bounds, int | None]:
    """The stream's bounds (:func:`stream_bounds`) and the sequence of its first message stored at or after
    ``when`` (``STREAM.MSG.GET`` with ``start_time``), None when none is."""
    nc = await open_connection(opts, name="nats-bridge spark", error_type=AuditError)
    try:
        bounds = await _bounds(nc, opts)
        stamp = when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            reply = await JsApi(nc, opts.api_prefix).request(
                f"STREAM.MSG.GET.{opts.stream}", {"start_time": stamp}, opts.timeout
            )
        except ApiError as exc:
            if exc.code == 404:
                return bounds, None
            raise AuditError(f"stream {opts.stream!r}: the first message at or after {stamp}: {exc}") from None
        except BridgeError as exc:
            raise AuditError(f"stream {opts.stream!r}: the first message at or after {stamp}: {exc}") from None
        seq = int(reply.get("message", {}).get("seq", 0))
        if seq <= 0:
            raise AuditError(
                f"stream {opts.stream!r}: the server did not answer a message get by start_time "
                "(nats-server 2.11 or newer needed for startingTime)"
            )
        return bounds, seq
    finally:
        await close_connection(nc)


async def read_range(opts: ReadOptions, first: int, last: int) -> AsyncIterator[list[StoredMessage]]:
    """The stream's messages in ``first..last`` that match ``opts.filter_subjects``, a server batch at a time."""
    if last < first:
        return
    nc = await open_connection(opts, name="nats-bridge spark", error_type=AuditError)
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
            verify=True,  # a lagging replica's short reply would drop rows for good (bridge.io.directget)
        )
        async for messages in batches:
            yield messages if keep is None else [m for m in messages if keep.captures(m.subject)]
    finally:
        await close_connection(nc)


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


def read_partition(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The rows of one planned range (a :class:`SeqRange`), one Arrow record batch per Direct Get batch."""
    if not isinstance(partition, SeqRange):
        raise TypeError(f"not a partition this reader planned: {partition!r}")
    builder = BatchBuilder(opts.stream, headers=opts.headers, payloads=opts.payloads)
    for messages in iterate_blocking(read_range(opts, partition.first, partition.last)):
        if messages:
            yield builder.build(messages)
