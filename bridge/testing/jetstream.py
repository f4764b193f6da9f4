"""JetStream on real servers, as the harness sees it: raw API requests, publishing to an origin, reading a stream.

* :func:`js_request` and the helpers on it (:func:`create_stream`, :func:`stream_info`, :func:`consumer_info`...)
  speak the raw JetStream API: exact fields, any server version, an API error raised as :class:`ApiFailure`.
* :class:`Publisher` publishes numbered messages to an origin with publish acks, paced and pausable.
* :func:`read_stream` / :func:`origin_seqs_by_source` read the aggregate back with batched Direct Get (not the
  bridge's own reader: the code under test does not judge itself); :func:`assert_exact` compares sequences.
* The taps (:class:`OriginTap`) listen on the origin server to what the bridge acks and check every ack against the
  aggregate as it happens: an ack of origin sequence ``s`` while the aggregate holds fewer than ``s`` copies of that
  source can only mean the bridge acked something it had not stored. :class:`FcTap` reads flow-control answers
  (``$JS.FC.>``, ``Nats-Last-Stream: s``), :class:`AckTap` a pull consumer's explicit acks (``$JS.ACK...``, one
  message each); :func:`tap_for_mode` picks the one for the mode expected on the origin.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import time
from abc import ABC, abstractmethod
from asyncio import Future
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import anyio
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import PubAck
from nats.js.client import JetStreamContext

from bridge.core.ackreply import parse_ack_subject
from bridge.core.modes import Mode
from bridge.io import wire
from bridge.testing.configs import AGGREGATE, ORIGIN
from bridge.testing.polling import POLL, wait_for_value, wait_until
from bridge.testing.servers import origin_mode_expected

__all__ = [
    "ACK_BODIES",
    "PUBLISH_ACK_RETRY",
    "PUBLISH_ACK_WAIT",
    "AckSeen",
    "AckTap",
    "ApiFailure",
    "FcAnswer",
    "FcTap",
    "OriginTap",
    "Publisher",
    "StoredMsg",
    "ack_floor",
    "ack_violation",
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
    "replicate_exactly",
    "seqs_by_source",
    "stream_info",
    "stream_messages",
    "tap_for_mode",
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


NO_SUITABLE_PEERS = 10005  # JSClusterNoPeersErrF: a replicated placement the cluster cannot make now
CREATE_DEADLINE = 40.0  # seconds a stream create is asked again for (see create_stream)


async def create_stream(
    nc: Client,
    name: str,
    subjects: Sequence[str],
    *,
    retention: str = "limits",
    domain: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Create a file-backed stream (``extra`` are raw config fields, e.g. ``allow_direct=True``). A replicated one
    on a cluster that has just formed can take seconds while its routes settle (seen past 3 s on a busy machine,
    and once past 10 s in CI): 10 s per attempt, asked again until ``CREATE_DEADLINE`` (the same create again
    answers with the stream when an earlier one went through late). A placement refused for a peer the meta leader
    has not heard from yet (``no suitable peers for placement, peer offline``: its first statistics arrive after
    the routes, seen on 2.14.0 under CI's load a second after the leader saw every peer current) is asked again
    too, a fifth of a second apart."""
    config = {"name": name, "subjects": list(subjects), "retention": retention, "storage": "file", **extra}
    deadline = time.monotonic() + CREATE_DEADLINE
    while True:
        try:
            return await js_request(nc, f"STREAM.CREATE.{name}", config, domain=domain, timeout=10)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if time.monotonic() >= deadline:
                raise
        except ApiFailure as exc:
            if exc.err_code != NO_SUITABLE_PEERS or time.monotonic() >= deadline:
                raise
            await anyio.sleep(0.2)  # (polling a condition the server reports only by refusing)


async def create_aggregate(
    nc: Client, *, name: str = AGGREGATE, duplicate_window: float = 120, allow_batched: bool = True, **extra: Any
) -> None:
    """The aggregate on the hub as ``setup`` creates it: Limits, file, Direct Get and fast batches allowed (the
    bridge publishes windows as batches; ``allow_batched=False`` for its plain publishes), subjects ``edge.>``."""
    if allow_batched:
        extra["allow_batched"] = True
    await create_stream(nc, name, ["edge.>"], allow_direct=True, duplicate_window=int(duplicate_window * 1e9), **extra)


async def stream_info(nc: Client, name: str, *, domain: str | None = None, **body: Any) -> dict[str, Any]:
    return await js_request(nc, f"STREAM.INFO.{name}", body or None, domain=domain)


async def stream_leader(nc: Client, name: str, *, domain: str | None = None) -> str:
    """The server name of the stream's leader ("" while it has none), as ``STREAM.INFO`` reports it."""
    info = await stream_info(nc, name, domain=domain)
    return str((info.get("cluster") or {}).get("leader") or "")


async def new_leader(nc: Client, name: str, old: str, *, timeout: float = 20.0) -> str:
    """Wait until the stream has a leader other than ``old`` (after ``old`` was stopped); its name."""

    async def elected() -> str:
        leader = await stream_leader(nc, name)
        return leader if leader and leader != old else ""

    found: str = await wait_until(elected, timeout=timeout, what=f"a new leader of {name}", retry_on=(Exception,))
    return found


async def step_down(nc: Client, name: str, *, timeout: float = 20.0) -> tuple[str, str]:
    """Ask the stream's leader to step down (``STREAM.LEADER.STEPDOWN``: what a rolling upgrade's drain does) and
    wait until another node leads; returns (old, new)."""
    old = await stream_leader(nc, name)
    await js_request(nc, f"STREAM.LEADER.STEPDOWN.{name}")
    return old, await new_leader(nc, name, old, timeout=timeout)


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
async def connect(url: str | Sequence[str]) -> AsyncIterator[Client]:
    """A test client that reconnects fast and forever (servers are restarted under it); give every node's URL of
    a cluster (:attr:`bridge.testing.servers.HubCluster.hub_urls`) to have it move to another node."""
    nc = await nats.connect(
        url if isinstance(url, str) else list(url),
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


PUBLISH_ACK_WAIT = 30.0  # seconds the test publisher waits for one publish ack
PUBLISH_ACK_RETRY = 5.0  # ... and after this long without it, sends the message again (same Nats-Msg-Id)


@dataclass
class Publisher:
    """Publishes ``count`` messages to the origin with publish acks, optionally paced and pausable.

    Message ``i`` (0-based) goes to ``subject(i)`` with ``payload(i)`` and header ``Test-Index: i``. The acked
    origin sequences are kept in ``seqs`` (in order).

    A publish whose ack is not back within ``PUBLISH_ACK_RETRY`` is sent again (a publish written into a connection
    the server had just closed, in a server restart, is lost with no error); with ``msg_ids`` (the default) every
    message carries ``Nats-Msg-Id: <publisher>-<i>`` so the stream's duplicate window stores a resent one once.
    Without them nothing is resent (a test of exact header sets on a stream nobody restarts).
    """

    nc: Client
    count: int
    subject: Callable[[int], str] = default_subject
    payload: Callable[[int], bytes] = default_payload
    headers: Callable[[int], dict[str, str]] | None = None
    rate: float | None = None  # messages per second; None: as fast as acks come back
    batch: int = 100
    msg_ids: bool = True
    seqs: list[int] = field(default_factory=list)
    subjects: dict[int, str] = field(default_factory=dict)  # origin seq -> subject
    resume: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.resume.set()
        self._id = os.urandom(4).hex()  # two publishers of one test never share a message id

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
                if self.msg_ids:
                    hdrs["Nats-Msg-Id"] = f"{self._id}-{k}"
                if self.headers is not None:
                    hdrs.update(self.headers(k))
                futures.append((k, hdrs, await js.publish_async(self.subject(k), self.payload(k), headers=hdrs)))
            for k, hdrs, fut in futures:
                ack = await self._acked(js, k, hdrs, fut)
                self.seqs.append(ack.seq)
                self.subjects[ack.seq] = self.subject(k)
            i += n
            if self.rate:
                ahead = started + i / self.rate - time.monotonic()
                if ahead > 0:
                    await anyio.sleep(ahead)
        self.done.set()

    async def _acked(self, js: JetStreamContext, k: int, hdrs: dict[str, str], fut: Future[PubAck]) -> PubAck:
        """The ack of message ``k``, resending it (same headers, so the same message id) while none comes."""
        if fut.done():  # most of a batch's acks are in once its first is: no deadline to set for them
            return fut.result()
        # nats-py's publish futures have no deadline of their own: an ack lost in a server restart would wait
        # forever (a loaded run hung here for pytest-timeout's 600 s), so resend, and fail clearly in the end
        deadline = time.monotonic() + PUBLISH_ACK_WAIT
        while True:
            left = deadline - time.monotonic()
            with anyio.move_on_after(min(left, PUBLISH_ACK_RETRY) if self.msg_ids else left):
                return await fut
            if time.monotonic() >= deadline:
                raise AssertionError(f"no publish ack for message {k} within {PUBLISH_ACK_WAIT:g}s")
            fut = await js.publish_async(self.subject(k), self.payload(k), headers=hdrs)

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
    """Every message of ``stream`` in stream order, by batched Direct Get (the stream needs allow_direct).

    Any replica answers a Direct Get, and one that lags answers short (``bridge.io.directget``): the read is made
    again until it holds at least as many messages as the leader's ``STREAM.INFO`` counted before it began (a
    stream that shrinks meanwhile, by limits or deletes, gets the last read after ``4 x timeout``). A clustered
    stream between two leaders (its leader just killed) answers ``STREAM.INFO`` only once one is elected: asked
    again until that deadline (CI once saw the 3 s request time out right after a test killed the leader)."""
    deadline = anyio.current_time() + 4 * timeout
    while True:
        try:
            stored = int((await stream_info(nc, stream, domain=domain))["state"]["messages"])
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if anyio.current_time() > deadline:
                raise
            await anyio.sleep(POLL)  # (no responders is answered at once)
            continue
        out = await _read_stream_once(nc, stream, domain=domain, batch=batch, timeout=timeout)
        if len(out) >= stored or anyio.current_time() > deadline:
            return out
        await anyio.sleep(POLL)


async def _read_stream_once(
    nc: Client, stream: str, *, domain: str | None, batch: int, timeout: float
) -> list[StoredMsg]:
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


async def replicate_exactly(
    origin_nc: Client, target_nc: Client, publishers: Mapping[str, Publisher], streams: Sequence[str] = (ORIGIN,)
) -> None:
    """Wait until the origin ``streams`` are empty (WorkQueue: the bridge acked everything), then check that the
    aggregate holds every source's copies all, once each and in order: exactly what its publisher had acked."""
    for stream in streams:
        count = functools.partial(stream_messages, origin_nc, stream)
        await wait_for_value(count, 0, timeout=60, what=f"{stream} emptied")
    by_source = await origin_seqs_by_source(target_nc)
    for source, publisher in publishers.items():
        assert_exact(by_source.get(source, []), publisher.seqs, f"{source} copies")


async def aggregate_count(nc: Client, subject_filter: str, stream: str = AGGREGATE) -> int:
    """How many messages of the aggregate match ``subject_filter`` (0 if the stream does not exist)."""
    try:
        info = await stream_info(nc, stream, subjects_filter=subject_filter)
    except ApiFailure as exc:
        if exc.err_code == 10059:  # stream not found
            return 0
        raise
    return sum(int(n) for n in (info.get("state", {}).get("subjects") or {}).values())


# --- auditing what the bridge acks on the origin, as it happens -----------------------------------------------


@dataclass(frozen=True)
class _Claim:
    """What one ack seen on the wire asserts: the aggregate holds ``consumer``'s source up to origin ``stream_seq``."""

    consumer: str
    stream_seq: int
    what: str  # the ack, described for a violation message


def ack_violation(what: str, stream_seq: int, stored: int) -> str | None:
    """The verdict on one ack: ``what`` acked origin sequence ``stream_seq`` while the aggregate held ``stored``
    copies of its source. Copies enter in origin order with no gap and origin sequences start at 1 with no holes
    (the taps' preconditions), so fewer than ``stream_seq`` copies means that message was not stored: a violation of
    the safety invariant (the message, else ``None``)."""
    if stored < stream_seq:
        return f"{what} while the aggregate held {stored} copies"
    return None


class OriginTap(ABC):
    """Listens on the origin server to what the bridge acks and audits every ack against the aggregate at once.

    ``prefixes`` maps a consumer name to the aggregate subject filter of its source. Each ack that names an origin
    sequence ``s`` is queued, and an auditor counts the aggregate's copies of that source right after (one count for
    every ack queued by then): since the aggregate only grows in these scenarios, fewer than ``s`` then means fewer
    than ``s`` at the time of the ack
    (:func:`ack_violation`). Only valid for scenarios without intended skips (forward resets) and with origin
    sequences starting at 1 with no holes. Subclasses say what to subscribe to and what an ack is: :class:`FcTap`
    (flow-control answers) and :class:`AckTap` (explicit acks of a pull consumer); :func:`tap_for_mode` picks one.
    """

    def __init__(self, nc: Client, hub: Client, prefixes: Mapping[str, str], stream: str = AGGREGATE) -> None:
        self.nc = nc
        self.hub = hub
        self.prefixes = dict(prefixes)
        self.stream = stream
        self.violations: list[str] = []
        self.checked = 0
        self.audit_errors: list[str] = []
        self._send, self._receive = anyio.create_memory_object_stream[_Claim](100_000)
        self._audited = anyio.Event()
        self._subs: list[Any] = []

    # what a subclass provides

    @abstractmethod
    def subjects(self) -> list[str]:
        """The subjects to subscribe to on the origin connection."""

    @abstractmethod
    async def _on_msg(self, msg: Msg) -> None:
        """Record one message seen on :meth:`subjects`; call :meth:`_claim` for each ack it carries."""

    @abstractmethod
    def acking(self, consumer: str | None = None) -> Sequence[object]:
        """What was seen acking something (of ``consumer``, or of any)."""

    # the audit, shared

    def _claim(self, consumer: str, stream_seq: int, what: str) -> None:
        self._send.send_nowait(_Claim(consumer, stream_seq, what))

    async def _stored(self, prefix: str) -> int:
        # The aggregate only grows, so counting late is still sound; while the hub is down, retry.
        while True:
            try:
                return await aggregate_count(self.hub, prefix, self.stream)
            except Exception as exc:  # hub down or restarting: nats-py raises many kinds
                self.audit_errors.append(f"{type(exc).__name__}: {exc}")
                await anyio.sleep(0.2)

    async def _audit(self) -> None:
        try:
            async for first in self._receive:
                # every claim queued by now is answered by one count per source taken after all of them (the
                # aggregate only grows): a pull consumer acks each message, and a count each made the tap ask
                # the hub once per message replicated
                claims = [first]
                with contextlib.suppress(anyio.WouldBlock, anyio.EndOfStream):
                    while True:
                        claims.append(self._receive.receive_nowait())
                counts: dict[str, int] = {}
                for claim in claims:
                    prefix = self.prefixes.get(claim.consumer)
                    if prefix is None:
                        self.violations.append(f"{claim.what}: for unknown consumer {claim.consumer}")
                        continue
                    if prefix not in counts:
                        counts[prefix] = await self._stored(prefix)
                    self.checked += 1
                    violation = ack_violation(claim.what, claim.stream_seq, counts[prefix])
                    if violation is not None:
                        self.violations.append(violation)
        finally:
            self._audited.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Self]:
        for subject in self.subjects():
            self._subs.append(await self.nc.subscribe(subject, cb=self._on_msg, pending_msgs_limit=100_000))
        await wire.flush(self.nc)  # the server has every SUB before the watched traffic starts
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._audit)
            try:
                yield self
            finally:
                for sub in self._subs:
                    await sub.unsubscribe()
                self._send.close()
                # let the auditor finish what it was given (bounded)
                with anyio.move_on_after(10):
                    await self._audited.wait()
                tg.cancel_scope.cancel()


@dataclass
class FcAnswer:
    at: float
    subject: str
    consumer: str
    last_consumer: int | None
    last_stream: int | None


class FcTap(OriginTap):
    """Flow-control mode: subscribes ``$JS.FC.>`` on the origin server and audits every answer that acks something
    (an answer ``Nats-Last-Stream: s`` acks everything of its consumer up to ``s``)."""

    def __init__(self, nc: Client, hub: Client, prefixes: Mapping[str, str], stream: str = AGGREGATE) -> None:
        super().__init__(nc, hub, prefixes, stream)
        self.answers: list[FcAnswer] = []

    @staticmethod
    def consumer_of(subject: str) -> str:
        tokens = subject.split(".")
        # v1 $JS.FC.<stream>.<consumer>.<rand>; v2 $JS.FC.<domain>.<hash>.<stream>.<consumer>.<rand>
        return tokens[3] if len(tokens) == 5 else tokens[5] if len(tokens) >= 7 else ""

    def subjects(self) -> list[str]:
        return ["$JS.FC.>"]

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
            self._claim(
                answer.consumer,
                answer.last_stream,
                f"FC answer {answer.subject} named Nats-Last-Stream {answer.last_stream} "
                f"(Nats-Last-Consumer {answer.last_consumer})",
            )

    def acking(self, consumer: str | None = None) -> list[FcAnswer]:
        """Answers that carried a position (acked something)."""
        return [a for a in self.answers if a.last_stream and (consumer is None or a.consumer == consumer)]


@dataclass(frozen=True)
class AckSeen:
    """One explicit ack on the wire: its subject, the consumer and the origin sequence it acks."""

    at: float
    subject: str
    consumer: str
    stream_seq: int


# An explicit ack's body (ADR-15): "+ACK", or empty. "-NAK", "+WPI", "+NXT", "+TERM" ack nothing.
ACK_BODIES = (b"", b"+ACK")


class AckTap(OriginTap):
    """Pull mode: subscribes to the ``$JS.ACK`` subjects of the given consumers on the origin server and audits
    every ack (body :data:`ACK_BODIES`): an explicit ack names exactly one message, origin sequence ``s`` as its
    subject says, which must be in the aggregate by then. Other bodies are kept in :attr:`others`."""

    def __init__(self, nc: Client, hub: Client, prefixes: Mapping[str, str], stream: str = AGGREGATE) -> None:
        super().__init__(nc, hub, prefixes, stream)
        self.acks: list[AckSeen] = []
        self.others: list[tuple[str, bytes]] = []  # (subject, body) of what was sent there but is no ack

    def subjects(self) -> list[str]:
        # Exact token counts, so no subject matches two of them (seen twice): v1 is 9 tokens, $JS.ACK.<stream>.
        # <consumer> and 5 numbers; v2 is 11 or 12, $JS.ACK.<domain>.<account hash>.<stream>.<consumer> and 5 numbers
        # (and a token). The stream is a wildcard: the tap is told consumers, and each ack names its stream.
        out = []
        for consumer in self.prefixes:
            out += [f"$JS.ACK.*.{consumer}" + ".*" * 5, f"$JS.ACK.*.*.*.{consumer}" + ".*" * 5]
            out.append(f"$JS.ACK.*.*.*.{consumer}" + ".*" * 6)
        return out

    async def _on_msg(self, msg: Msg) -> None:
        # parsing a subject's layout is not judging the bridge: the same parser the engine uses is fine here
        info = parse_ack_subject(msg.subject)
        if info is None or msg.data not in ACK_BODIES:
            self.others.append((msg.subject, msg.data))
            return
        ack = AckSeen(time.monotonic(), msg.subject, info.consumer, info.stream_seq)
        self.acks.append(ack)
        self._claim(ack.consumer, ack.stream_seq, f"ack {ack.subject} of origin seq {ack.stream_seq}")

    def acking(self, consumer: str | None = None) -> list[AckSeen]:
        """The acks seen (of ``consumer``, or of any)."""
        return [a for a in self.acks if consumer is None or a.consumer == consumer]


def tap_for_mode(
    nc: Client, hub: Client, prefixes: Mapping[str, str], *, mode: str | None = None, stream: str = AGGREGATE
) -> FcTap | AckTap:
    """The tap that sees the bridge's acks in ``mode`` (default: the mode expected on the origin's binary,
    :func:`bridge.testing.servers.origin_mode_expected`): :class:`AckTap` in pull mode, else :class:`FcTap`."""
    mode = mode if mode is not None else origin_mode_expected()
    tap_class = AckTap if mode == Mode.PULL else FcTap
    return tap_class(nc, hub, prefixes, stream)
