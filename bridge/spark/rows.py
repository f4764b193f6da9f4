"""The rows of the ``jetstream`` data source, as Arrow record batches.

One row per stored message: ``stream``, ``seq``, ``subject``, ``timestamp`` (the store time, microseconds, UTC),
``size`` (payload bytes), ``payload_hash`` (BLAKE2b, 8 bytes, as a signed 64-bit integer: equal payloads hash
equal, so a copy can be compared with its original without moving payloads), ``headers`` (the message's own
headers as a map; all of them, or the names asked for), the bridge's provenance as typed columns (``source``,
``origin_stream``, ``origin_seq``, ``origin_time``, ``origin_subject``: from ``Bridge-Source``, ``Bridge-Stream``,
``Bridge-Seq``, ``Bridge-Time`` and ``Bridge-Subject`` (the origin subject, before a ``subject_prefix`` or a subject
transform), parsed by :func:`bridge.core.headers.parse_provenance` from all the message's headers whatever the
``headers`` option keeps; null on a message that is not a bridge copy, ``origin_time`` also null without
``Bridge-Time``) and, when asked for, ``payload``.

Columns are built per batch of messages from Python lists in one call each: Spark takes Arrow batches from a
Python data source without converting row by row.
"""

from __future__ import annotations

import calendar
import hashlib
import time
from collections.abc import Callable, Sequence

import pyarrow as pa

from bridge.core.headers import parse_provenance
from bridge.io.directget import StoredMessage

_BASE_FIELDS = [
    ("stream", "string", pa.string()),
    ("seq", "bigint", pa.int64()),
    ("subject", "string", pa.string()),
    ("timestamp", "timestamp", pa.timestamp("us", tz="UTC")),
    ("size", "int", pa.int32()),
    ("payload_hash", "bigint", pa.int64()),
    ("headers", "map<string,string>", pa.map_(pa.string(), pa.string())),
    # provenance (bridge.core.headers), null on a message the bridge did not write
    ("source", "string", pa.string()),
    ("origin_stream", "string", pa.string()),
    ("origin_seq", "bigint", pa.int64()),
    ("origin_time", "timestamp", pa.timestamp("us", tz="UTC")),
    ("origin_subject", "string", pa.string()),  # Bridge-Subject: the subject before a prefix or transform
]
_PAYLOAD_FIELD = ("payload", "binary", pa.binary())


def _fields(payloads: bool) -> list[tuple[str, str, pa.DataType]]:
    return [*_BASE_FIELDS, _PAYLOAD_FIELD] if payloads else list(_BASE_FIELDS)


def spark_schema(payloads: bool) -> str:
    """The rows' schema as a Spark DDL string."""
    return ", ".join(f"{name} {ddl}" for name, ddl, _ in _fields(payloads))


def arrow_schema(payloads: bool) -> pa.Schema:
    """The rows' schema in Arrow."""
    return pa.schema([(name, arrow) for name, _, arrow in _fields(payloads)])


class _Seconds:
    """Epoch seconds of ``YYYY-MM-DDTHH:MM:SS`` prefixes, memoised: consecutive messages share their second."""

    LIMIT = 4096

    def __init__(self) -> None:
        self._memo: dict[str, int] = {}

    def __call__(self, prefix: str) -> int:
        seconds = self._memo.get(prefix)
        if seconds is None:
            if len(self._memo) >= self.LIMIT:
                self._memo.clear()
            seconds = self._memo[prefix] = calendar.timegm(time.strptime(prefix, "%Y-%m-%dT%H:%M:%S"))
        return seconds


def rfc3339_micros(seconds_of: Callable[[str], int]) -> Callable[[str], int]:
    """A parser of the server's store times (Go's ``RFC3339Nano`` in UTC: ``2026-11-22T14:25:16.123456789Z``,
    trailing zeros of the fraction dropped) to microseconds since the epoch."""

    def parse(stamp: str) -> int:
        micros = seconds_of(stamp[:19]) * 1_000_000
        if len(stamp) > 20 and stamp[19] == ".":
            fraction = stamp[20:].rstrip("Z")
            micros += int(fraction[:6].ljust(6, "0"))
        elif not stamp.endswith("Z"):
            raise ValueError(f"not an RFC 3339 UTC time: {stamp!r}")
        return micros

    return parse


def payload_hash(payload: bytes) -> int:
    """The payload's BLAKE2b-64 digest as a signed 64-bit integer."""
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "big", signed=True)


class BatchBuilder:
    """Turns lists of :class:`StoredMessage` into record batches of one stream's rows."""

    def __init__(self, stream: str, *, headers: Sequence[str] | None, payloads: bool) -> None:
        self.stream = stream
        self.wanted = tuple(headers) if headers is not None else None
        self.payloads = payloads
        self.schema = arrow_schema(payloads)
        self._micros = rfc3339_micros(_Seconds())

    def build(self, messages: Sequence[StoredMessage]) -> pa.RecordBatch:
        """One record batch holding ``messages``, in order."""
        micros = self._micros
        wanted = self.wanted
        if wanted is None:
            headers = [list(m.headers.items()) for m in messages]
        else:
            headers = [[(n, m.headers[n]) for n in wanted if n in m.headers] for m in messages]
        provenance = [parse_provenance(m.headers) for m in messages]
        columns = [
            pa.array([self.stream] * len(messages), pa.string()),
            pa.array([m.seq for m in messages], pa.int64()),
            pa.array([m.subject for m in messages], pa.string()),
            pa.array([micros(m.time) for m in messages], pa.timestamp("us", tz="UTC")),
            pa.array([len(m.payload) for m in messages], pa.int32()),
            pa.array([payload_hash(m.payload) for m in messages], pa.int64()),
            pa.array(headers, pa.map_(pa.string(), pa.string())),
            pa.array([p and p.source for p in provenance], pa.string()),
            pa.array([p and p.stream for p in provenance], pa.string()),
            pa.array([p and p.stream_seq for p in provenance], pa.int64()),
            pa.array(
                [p.timestamp_ns // 1000 if p is not None and p.timestamp_ns else None for p in provenance],
                pa.timestamp("us", tz="UTC"),
            ),
            pa.array([p and p.subject for p in provenance], pa.string()),
        ]
        if self.payloads:
            columns.append(pa.array([m.payload for m in messages], pa.binary()))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)
