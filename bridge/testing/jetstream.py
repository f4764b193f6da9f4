"""JetStream on real servers, as the harness sees it: raw API requests, publishing to an origin, reading a stream.

* :func:`js_request` and the helpers on it (:func:`create_stream`, :func:`stream_info`, :func:`consumer_info`...)
  speak the raw JetStream API: exact fields, any server version, an API error raised as :class:`ApiFailure`.
* :class:`Publisher` publishes numbered messages to an origin with publish acks, paced and pausable.
* :func:`read_stream` / :func:`origin_seqs_by_source` read the aggregate back with batched Direct Get (not the
  bridge's own reader: the code under test does not judge itself); :func:`assert_exact` compares sequences.
* :class:`FcTap` listens to ``$JS.FC.>`` on the origin server and checks every flow-control answer the bridge
  sends against the aggregate: an answer naming ``Nats-Last-Stream: s`` while the aggregate holds fewer than
  ``s`` copies of that source can only mean the bridge acked something it had not stored.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from bridge.testing.configs import AGGREGATE

__all__ = [
    "ApiFailure",
    "FcAnswer",
    "FcTap",
    "Publisher",
    "StoredMsg",
    "ack_floor",
    "aggregate_count",
    "api_prefix",
    "assert_exact",
    "connect",
    "consumer_exists",
    "consumer_info",
    "create_aggregate",
    "create_stream",
    "default_payload",
    "default_subject",
    "delivered",
    "duplicates",
    "js_request",
    "origin_seqs_by_source",
    "read_stream",
    "seqs_by_source",
    "stream_info",
    "stream_messages",
]


# --- JetStream administration (raw API: exact fields, any server version) ----------------------------------


def api_prefix(domain: str | None) -> str:
    return "$JS.API" if domain is None else f"$JS.{domain}.API"


async def js_request(
    nc: Client, subject: str, body: Mapping[str, Any] | None = None, *, domain: str | None = None, timeout: float = 3
) -> dict[str, Any]:
    """A JetStream API request; raises AssertionError on an API error."""
    payload = b"" if body is None else json.dumps(body).encode()
    msg = await nc.request(f"{api_prefix(domain)}.{subject}", payload, timeout=timeout)
    reply: dict[str, Any] = json.loads(msg.data) if msg.data else {}
    if "error" in reply:
        raise ApiFailure(subject, reply["error"])
    return reply


class ApiFailure(AssertionError):
    def __init__(self, subject: str, error: Mapping[str, Any]) -> None:
        self.error = dict(error)
        self.err_code = int(error.get("err_code", 0))
        super().__init__(f"{subject}: {error}")


async def create_stream(
    nc: Client,
    name: str,
    subjects: Sequence[str],
    *,
    retention: str = "limits",
    domain: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Create a file-backed stream (``extra`` are raw config fields, e.g. ``allow_direct=True``)."""
    config = {"name": name, "subjects": list(subjects), "retention": retention, "storage": "file", **extra}
    return await js_request(nc, f"STREAM.CREATE.{name}", config, domain=domain)


async def create_aggregate(nc: Client, *, name: str = AGGREGATE, duplicate_window: float = 120, **extra: Any) -> None:
    """The aggregate on the hub: Limits, file, Direct Get allowed, every subject under ``edge.>``."""
    await create_stream(nc, name, ["edge.>"], allow_direct=True, duplicate_window=int(duplicate_window * 1e9), **extra)


async def stream_info(nc: Client, name: str, *, domain: str | None = None, **body: Any) -> dict[str, Any]:
    return await js_request(nc, f"STREAM.INFO.{name}", body or None, domain=domain)


async def stream_messages(nc: Client, name: str, *, domain: str | None = None) -> int:
    return int((await stream_info(nc, name, domain=domain))["state"]["messages"])


async def consumer_info(nc: Client, stream: str, consumer: str, *, domain: str | None = None) -> dict[str, Any]:
    return await js_request(nc, f"CONSUMER.INFO.{stream}.{consumer}", domain=domain)


async def consumer_exists(nc: Client, stream: str, consumer: str, *, domain: str | None = None) -> bool:
    try:
        await consumer_info(nc, stream, consumer, domain=domain)
    except ApiFailure as exc:
        if exc.err_code == 10014:  # consumer not found
            return False
        raise
    return True


def ack_floor(info: Mapping[str, Any]) -> int:
    return int(info.get("ack_floor", {}).get("stream_seq", 0))


def delivered(info: Mapping[str, Any]) -> int:
    return int(info.get("delivered", {}).get("stream_seq", 0))


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Client]:
    """A test client that reconnects fast and forever (servers are restarted under it)."""
    nc = await nats.connect(
        url,
        connect_timeout=2,
        reconnect_time_wait=0.1,
        max_reconnect_attempts=-1,
        allow_reconnect=True,
        name="test client",
    )
    try:
        yield nc
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


# --- publishing to the origin ---------------------------------------------------------------------------


def default_subject(i: int) -> str:
    return f"orders.{i % 7}"


def default_payload(i: int) -> bytes:
    return f"payload-{i:06d}-".encode() + b"x" * 100


@dataclass
class Publisher:
    """Publishes ``count`` messages to the origin with publish acks, optionally paced and pausable.

    Message ``i`` (0-based) goes to ``subject(i)`` with ``payload(i)`` and header ``Test-Index: i``. The acked
    origin sequences are kept in ``seqs`` (in order).
    """

    nc: Client
    count: int
    subject: Callable[[int], str] = default_subject
    payload: Callable[[int], bytes] = default_payload
    headers: Callable[[int], dict[str, str]] | None = None
    rate: float | None = None  # messages per second; None: as fast as acks come back
    batch: int = 100
    seqs: list[int] = field(default_factory=list)
    subjects: dict[int, str] = field(default_factory=dict)  # origin seq -> subject
    resume: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.resume.set()

    def pause(self) -> None:
        self.resume = anyio.Event()

    def unpause(self) -> None:
        self.resume.set()

    async def run(self) -> None:
        js = self.nc.jetstream(timeout=5)
        started = time.monotonic()
        i = 0
        while i < self.count:
            await self.resume.wait()
            n = min(self.batch, self.count - i)
            futures = []
            for k in range(i, i + n):
                hdrs = {"Test-Index": str(k)}
                if self.headers is not None:
                    hdrs.update(self.headers(k))
                futures.append((k, await js.publish_async(self.subject(k), self.payload(k), headers=hdrs)))
            for k, fut in futures:
                ack = await fut
                self.seqs.append(ack.seq)
                self.subjects[ack.seq] = self.subject(k)
            i += n
            if self.rate:
                ahead = started + i / self.rate - time.monotonic()
                if ahead > 0:
                    await anyio.sleep(ahead)
        self.done.set()

    @property
    def published(self) -> int:
        return len(self.seqs)


# --- reading the aggregate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredMsg:
    """One message of a stream, as Direct Get returns it."""

    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes

    @property
    def origin_seq(self) -> int | None:
        value = self.headers.get("Bridge-Seq")
        return int(value) if value is not None else None

    @property
    def source(self) -> str | None:
        return self.headers.get("Bridge-Source")


async def read_stream(
    nc: Client, stream: str, *, domain: str | None = None, batch: int = 500, timeout: float = 5.0
) -> list[StoredMsg]:
    """Every message of ``stream`` in stream order, by batched Direct Get (the stream needs allow_direct)."""
    out: list[StoredMsg] = []
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, pending_msgs_limit=batch * 4, pending_bytes_limit=64 * 1024 * 1024)
    try:
        seq = 1
        while True:
            request = json.dumps({"seq": seq, "batch": batch}).encode()
            await nc.publish(f"{api_prefix(domain)}.DIRECT.GET.{stream}", request, reply=inbox)
            more = False
            with anyio.fail_after(timeout):
                while True:
                    msg: Msg = await sub.next_msg(timeout=timeout)
                    headers = dict(msg.headers or {})
                    status = headers.get("Status")
                    if status == "204":  # end of this batch
                        more = int(headers.get("Nats-Num-Pending", "0") or 0) > 0
                        break
                    if status == "404":  # nothing at or after seq
                        break
                    if status:
                        raise AssertionError(f"direct get on {stream}: {headers}")
                    mseq = int(headers["Nats-Sequence"])
                    out.append(StoredMsg(mseq, headers.get("Nats-Subject", ""), headers, msg.data))
                    seq = mseq + 1
            if not more:
                return out
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def seqs_by_source(messages: Sequence[StoredMsg]) -> dict[str, list[int]]:
    """Origin sequences (``Bridge-Seq``) per ``Bridge-Source``, in aggregate order; other messages ignored."""
    out: dict[str, list[int]] = {}
    for m in messages:
        if m.source is not None and m.origin_seq is not None:
            out.setdefault(m.source, []).append(m.origin_seq)
    return out


async def origin_seqs_by_source(nc: Client, stream: str = AGGREGATE) -> dict[str, list[int]]:
    """The aggregate reader: ``{source: [origin seq, ...]}`` in aggregate order."""
    return seqs_by_source(await read_stream(nc, stream))


def duplicates(seqs: Sequence[int]) -> list[int]:
    seen: set[int] = set()
    dups = []
    for s in seqs:
        if s in seen:
            dups.append(s)
        seen.add(s)
    return dups


def assert_exact(seqs: Sequence[int], expected: Sequence[int], what: str) -> None:
    """``seqs`` is exactly ``expected``: same order, nothing missing, nothing repeated (a short diff if not)."""
    if list(seqs) == list(expected):
        return
    missing = sorted(set(expected) - set(seqs))
    extra = sorted(set(seqs) - set(expected))
    out_of_order = [(a, b) for a, b in itertools.pairwise(seqs) if b <= a]
    raise AssertionError(
        f"{what}: {len(seqs)} copies, expected {len(expected)}; missing {len(missing)} {missing[:20]}, "
        f"unexpected {extra[:20]}, duplicated {duplicates(seqs)[:20]}, out of order {out_of_order[:10]}"
    )


async def aggregate_count(nc: Client, subject_filter: str, stream: str = AGGREGATE) -> int:
    """How many messages of the aggregate match ``subject_filter`` (0 if the stream does not exist)."""
    try:
        info = await stream_info(nc, stream, subjects_filter=subject_filter)
    except ApiFailure as exc:
        if exc.err_code == 10059:  # stream not found
            return 0
        raise
    return sum(int(n) for n in (info.get("state", {}).get("subjects") or {}).values())


# --- watching flow-control answers ------------------------------------------------------------------------


@dataclass
class FcAnswer:
    at: float
    subject: str
    consumer: str
    last_consumer: int | None
    last_stream: int | None


class FcTap:
    """Subscribes ``$JS.FC.>`` on the origin server and audits every answer that acks something.

    ``prefixes`` maps a consumer name to the aggregate subject filter of its source. For an answer
    ``Nats-Last-Stream: s`` the aggregate is counted right after it is seen; since the aggregate only grows in
    these tests and copies enter in origin order with no gap (checked separately), fewer than ``s`` copies then
    means fewer than ``s`` at the time of the answer: a violation of the safety invariant. Only valid for
    scenarios without intended skips (forward resets) and with origin sequences starting at 1 with no holes.
    """

    def __init__(self, nc: Client, hub: Client, prefixes: Mapping[str, str], stream: str = AGGREGATE) -> None:
        self.nc = nc
        self.hub = hub
        self.prefixes = dict(prefixes)
        self.stream = stream
        self.answers: list[FcAnswer] = []
        self.violations: list[str] = []
        self.checked = 0
        self.audit_errors: list[str] = []
        self._send, self._receive = anyio.create_memory_object_stream[FcAnswer](100_000)
        self._audited = anyio.Event()
        self._sub: Any = None

    @staticmethod
    def consumer_of(subject: str) -> str:
        tokens = subject.split(".")
        # v1 $JS.FC.<stream>.<consumer>.<rand>; v2 $JS.FC.<domain>.<hash>.<stream>.<consumer>.<rand>
        return tokens[3] if len(tokens) == 5 else tokens[5] if len(tokens) >= 7 else ""

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers or {}

        def num(key: str) -> int | None:
            value = headers.get(key)
            return int(value) if value is not None and value.isdigit() else None

        answer = FcAnswer(
            time.monotonic(),
            msg.subject,
            self.consumer_of(msg.subject),
            num("Nats-Last-Consumer"),
            num("Nats-Last-Stream"),
        )
        self.answers.append(answer)
        if answer.last_stream:
            self._send.send_nowait(answer)

    async def _audit(self) -> None:
        try:
            await self._audit_all()
        finally:
            self._audited.set()

    async def _audit_all(self) -> None:
        async for answer in self._receive:
            prefix = self.prefixes.get(answer.consumer)
            if prefix is None:
                self.violations.append(f"answer for unknown consumer {answer.consumer}: {answer}")
                continue
            # The aggregate only grows, so counting late is still sound; while the hub is down, retry.
            while True:
                try:
                    stored = await aggregate_count(self.hub, prefix, self.stream)
                    break
                except Exception as exc:  # hub down or restarting: nats-py raises many kinds
                    self.audit_errors.append(f"{type(exc).__name__}: {exc}")
                    await anyio.sleep(0.2)
            self.checked += 1
            assert answer.last_stream is not None
            if stored < answer.last_stream:
                self.violations.append(
                    f"FC answer {answer.subject} named Nats-Last-Stream {answer.last_stream} "
                    f"(Nats-Last-Consumer {answer.last_consumer}) while the aggregate held {stored} copies"
                )

    def acking(self, consumer: str | None = None) -> list[FcAnswer]:
        """Answers that carried a position (acked something)."""
        return [a for a in self.answers if a.last_stream and (consumer is None or a.consumer == consumer)]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FcTap]:
        self._sub = await self.nc.subscribe("$JS.FC.>", cb=self._on_msg, pending_msgs_limit=100_000)
        await self.nc.flush()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._audit)
            try:
                yield self
            finally:
                await self._sub.unsubscribe()
                self._send.close()
                # let the auditor finish what it was given (bounded)
                with anyio.move_on_after(10):
                    await self._audited.wait()
                tg.cancel_scope.cancel()
