"""The bench's own NATS client work: streams, the native consumer, preloading, paced publishing, polling, reading.

Everything here talks raw JetStream API JSON (``$JS.API.*``) so the configuration sent to the server is exactly
the one described in ``docs/protocol.md``, and nothing of ``bridge/`` is used: the bench measures the bridge, it does
not share its code. Every wait has a deadline and raises :class:`BenchError` with a reason when it passes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from bench.stats import ack_info, parse_rfc3339_ns

ORIGIN = "ORIGIN"
ORIGIN_SUBJECTS = "orders"  # the origin captures orders.>; messages go to orders.0 .. orders.15
AGGREGATE = "AGG"
AGGREGATE_SUBJECTS = "edge"  # the bridge publishes <prefix>.<origin subject>; native keeps the origin subject
BRIDGE_PREFIX = "edge.leaf1"
NATIVE_CONSUMER = "bench-native"
NATIVE_DELIVER = "bench.native.deliver"
LEAF_API = "$JS.leaf.API"
SENT_HEADER = "Bench-Sent"  # wall-clock ns at which the bench handed the message to its client library
HEARTBEAT_NS = 1_000_000_000
POLL_INTERVAL = 0.05  # the bench shares the CPUs it measures: poll gently


class BenchError(Exception):
    """A measurement could not be made: the message says which step, and why."""


async def connect(url: str, name: str) -> Client:
    """A client for the bench's own work (no reconnect games: a server going away is a failed measurement)."""
    return await nats.connect(url, name=name, connect_timeout=5, max_reconnect_attempts=3, reconnect_time_wait=0.5)


async def api(nc: Client, subject: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """One JetStream API request; the decoded reply.

    Raises:
        BenchError: no reply in time, or the reply is an API error.
    """
    payload = b"" if body is None else json.dumps(body).encode()
    try:
        msg = await nc.request(subject, payload, timeout=timeout)
    except Exception as exc:  # nats-py raises its own TimeoutError / NoRespondersError
        raise BenchError(f"{subject}: {type(exc).__name__} {exc}") from exc
    try:
        data: dict[str, Any] = json.loads(msg.data)
    except ValueError as exc:
        raise BenchError(f"{subject}: not JSON: {msg.data[:200]!r} (headers {msg.headers})") from exc
    if "error" in data:
        raise BenchError(f"{subject}: {data['error']}")
    return data


# Streams and consumers


async def create_origin(leaf: Client, retention: str) -> None:
    """The origin stream on the leaf: file storage, ``orders.>``, WorkQueue or Limits retention."""
    await api(
        leaf,
        f"$JS.API.STREAM.CREATE.{ORIGIN}",
        {
            "name": ORIGIN,
            "subjects": [f"{ORIGIN_SUBJECTS}.>"],
            "retention": retention,
            "storage": "file",
            "num_replicas": 1,
            "allow_direct": True,
        },
    )


def aggregate_config(native: bool) -> dict[str, Any]:
    """The aggregate stream on the hub, the same for both paths except the native source (and ``allow_batched``,
    which a stream with sources does not need: the server sources itself).

    The native source names a user-managed durable ``flow_control`` consumer (docs/protocol.md 4.1/4.3) on the leaf's
    origin, reached through the leaf's JetStream domain.
    """
    config: dict[str, Any] = {
        "name": AGGREGATE,
        "subjects": [f"{AGGREGATE_SUBJECTS}.>"],
        "retention": "limits",
        "storage": "file",
        "num_replicas": 1,
        "allow_direct": True,
    }
    if not native:
        config["allow_batched"] = True  # as setup creates it: the bridge publishes its windows as fast batches
    if native:
        config["sources"] = [
            {
                "name": ORIGIN,
                "external": {"api": LEAF_API, "deliver": ""},
                "consumer": {"name": NATIVE_CONSUMER, "deliver_subject": NATIVE_DELIVER},
            }
        ]
    return config


async def create_aggregate(hub: Client, native: bool) -> None:
    await api(hub, f"$JS.API.STREAM.CREATE.{AGGREGATE}", aggregate_config(native))


def native_consumer_config(max_ack_pending: int) -> dict[str, Any]:
    """The durable push consumer the aggregate's native source binds to: what the bridge's managed one is."""
    return {
        "durable_name": NATIVE_CONSUMER,
        "deliver_subject": NATIVE_DELIVER,
        "deliver_policy": "all",
        "ack_policy": "flow_control",
        "flow_control": True,
        "idle_heartbeat": HEARTBEAT_NS,
        "max_ack_pending": max_ack_pending,
        "max_deliver": -1,
    }


async def create_native_consumer(leaf: Client, max_ack_pending: int) -> None:
    config = native_consumer_config(max_ack_pending)
    reply = await api(
        leaf,
        f"$JS.API.CONSUMER.DURABLE.CREATE.{ORIGIN}.{NATIVE_CONSUMER}",
        {"stream_name": ORIGIN, "config": config, "pedantic": True},
    )
    if reply.get("config", {}).get("ack_policy") != "flow_control":
        raise BenchError(f"native consumer created with {reply.get('config')}")


@dataclass(frozen=True, slots=True)
class StreamState:
    messages: int
    first_seq: int
    last_seq: int
    first_ts_ns: int
    last_ts_ns: int


async def stream_state(nc: Client, stream: str, timeout: float = 5.0) -> StreamState:
    state = (await api(nc, f"$JS.API.STREAM.INFO.{stream}", timeout=timeout))["state"]
    return StreamState(
        messages=int(state["messages"]),
        first_seq=int(state["first_seq"]),
        last_seq=int(state["last_seq"]),
        first_ts_ns=parse_rfc3339_ns(state["first_ts"]),
        last_ts_ns=parse_rfc3339_ns(state["last_ts"]),
    )


# Publishing


class Publisher:
    """Publishes with publish acks pipelined: each message names its own reply (``<inbox>.<n>``) and one wildcard
    subscription counts the acks, so there is no future per message (docs/protocol.md 9: ~50k msg/s at 256 B).

    At most ``window`` publishes are awaiting their ack at any time.
    """

    def __init__(self, nc: Client, window: int) -> None:
        self.nc = nc
        self.window = max(1, window)
        self.inbox = nc.new_inbox()
        self.sent = 0
        self.acked = 0
        self.errors: list[str] = []
        self.ack_times_ns: dict[int, int] = {}
        self.track_ack_times = False
        self._room = asyncio.Event()
        self._room.set()
        self._all_acked = asyncio.Event()
        self._sub: Any = None

    async def __aenter__(self) -> Publisher:
        self._sub = await self.nc.subscribe(f"{self.inbox}.*", cb=self._on_ack, pending_msgs_limit=-1)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()

    async def _on_ack(self, msg: Msg) -> None:
        data = msg.data
        if not data or b'"error"' in data:
            if len(self.errors) < 10:
                self.errors.append((data[:200] or repr(msg.headers).encode()).decode(errors="replace"))
        elif self.track_ack_times:
            self.ack_times_ns[int(msg.subject.rsplit(".", 1)[1])] = time.time_ns()
        self.acked += 1
        if self.sent - self.acked <= self.window // 2:
            self._room.set()
        if self.acked >= self.sent:
            self._all_acked.set()

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> int:
        """Send one message (waiting for room in the window first); returns its number (0-based)."""
        if self.sent - self.acked >= self.window:
            self._room.clear()
            await self._room.wait()
        n = self.sent
        self.sent += 1
        self._all_acked.clear()
        await self.nc.publish(subject, payload, reply=f"{self.inbox}.{n}", headers=headers)
        return n

    async def drain(self, timeout: float) -> None:
        """Wait until every publish has its ack.

        Raises:
            BenchError: not all acked in time, or the origin refused some.
        """
        await self.nc.flush(timeout=max(1, int(timeout)))
        if self.acked < self.sent:
            try:
                await asyncio.wait_for(self._all_acked.wait(), timeout)
            except TimeoutError:
                raise BenchError(f"only {self.acked} of {self.sent} publishes acked after {timeout:g}s") from None
        if self.errors:
            raise BenchError(f"origin refused publishes: {self.errors[:3]}")


def _payload(size: int) -> bytes:
    return os.urandom(size)


async def preload(leaf: Client, count: int, size: int, deadline: float) -> float:
    """Publish ``count`` messages of ``size`` payload bytes into the origin as fast as acks allow; msgs/s.

    Raises:
        BenchError: the origin does not hold exactly ``count`` messages after ``deadline`` seconds.
    """
    payload = _payload(size)
    window = max(64, min(4096, (8 << 20) // max(size, 1)))
    started = time.monotonic()
    async with Publisher(leaf, window) as pub:
        for n in range(count):
            await pub.publish(f"{ORIGIN_SUBJECTS}.{n % 16}", payload)
            if time.monotonic() - started > deadline:
                raise BenchError(f"preload: {pub.acked} of {count} acked after {deadline:g}s")
        await pub.drain(max(5.0, deadline - (time.monotonic() - started)))
    elapsed = time.monotonic() - started
    held = (await stream_state(leaf, ORIGIN)).messages
    if held != count:
        raise BenchError(f"preload: origin holds {held} messages, expected {count}")
    return count / elapsed


@dataclass(slots=True)
class PacedResult:
    sent: int
    seconds: float
    publish_rtt_ns: list[int] = field(default_factory=list)


async def paced_publish(leaf: Client, rate: float, seconds: float, size: int) -> PacedResult:
    """Publish at ``rate`` msg/s for ``seconds`` (message k is due at start + k/rate; a late one goes at once),
    each stamped with :data:`SENT_HEADER`; returns once every publish is acked.
    """
    payload = _payload(size)
    total = max(1, round(rate * seconds))
    loop = asyncio.get_running_loop()
    sent_ns: list[int] = []
    async with Publisher(leaf, window=4096) as pub:
        pub.track_ack_times = True
        start = loop.time()
        for k in range(total):
            delay = start + k / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.time_ns()
            sent_ns.append(now)
            await pub.publish(f"{ORIGIN_SUBJECTS}.{k % 16}", payload, headers={SENT_HEADER: str(now)})
        elapsed = loop.time() - start
        await pub.drain(30.0)
        rtts = [pub.ack_times_ns[k] - sent_ns[k] for k in range(total) if k in pub.ack_times_ns]
    return PacedResult(sent=total, seconds=elapsed, publish_rtt_ns=rtts)


# Waiting for the aggregate


@dataclass(slots=True)
class Progress:
    """What polling the aggregate's message count saw."""

    target: int
    first_seen_ns: int = 0  # wall clock of the first poll that saw a message
    first_seen_count: int = 0
    done_ns: int = 0  # wall clock of the first poll that saw the target reached
    polls: int = 0


async def wait_for_count(
    hub: Client,
    target: int,
    *,
    deadline: float,
    stall: float,
    on_first: Callable[[], None] | None = None,
    on_poll: Callable[[int], None] | None = None,
    alive: Callable[[], str | None] | None = None,
) -> Progress:
    """Poll the aggregate every 50 ms until it holds ``target`` messages.

    ``on_first`` runs at the first poll that sees a message, ``on_poll`` at every poll (with the count);
    ``alive`` returns a reason when the thing being measured died.

    Raises:
        BenchError: past ``deadline`` seconds, no progress for ``stall`` seconds, or ``alive`` gave a reason.
    """
    progress = Progress(target=target)
    started = time.monotonic()
    last_count, last_change = -1, started
    while True:
        count = (await stream_state(hub, AGGREGATE)).messages
        now_ns, now = time.time_ns(), time.monotonic()
        progress.polls += 1
        if count and not progress.first_seen_ns:
            progress.first_seen_ns, progress.first_seen_count = now_ns, count
            if on_first is not None:
                on_first()
        if on_poll is not None:
            on_poll(count)
        if count >= target:
            progress.done_ns = now_ns
            return progress
        if count != last_count:
            last_count, last_change = count, now
        if alive is not None and (reason := alive()) is not None:
            raise BenchError(f"{reason} (aggregate held {count} of {target})")
        if now - started > deadline:
            raise BenchError(f"aggregate held {count} of {target} after {deadline:g}s")
        if now - last_change > stall:
            raise BenchError(f"aggregate stuck at {count} of {target} for {stall:g}s")
        await asyncio.sleep(POLL_INTERVAL)


# Reading the aggregate back


@dataclass(frozen=True, slots=True)
class Stored:
    """One aggregate message as the latency step needs it."""

    stream_seq: int
    store_ns: int
    headers: dict[str, str]


async def read_stored(hub: Client, first_seq: int, count: int, timeout: float = 30.0) -> list[Stored]:
    """Read ``count`` aggregate messages from ``first_seq`` on (headers and store times only) through an
    ephemeral ``ack_policy: none`` pull consumer.

    Raises:
        BenchError: fewer came back within ``timeout`` seconds.
    """
    created = await api(
        hub,
        f"$JS.API.CONSUMER.CREATE.{AGGREGATE}",
        {
            "stream_name": AGGREGATE,
            "config": {
                "deliver_policy": "by_start_sequence",
                "opt_start_seq": first_seq,
                "ack_policy": "none",
                "headers_only": True,
                "inactive_threshold": 30 * 1_000_000_000,
                "mem_storage": True,
            },
        },
    )
    name = created["name"]
    inbox = hub.new_inbox()
    sub = await hub.subscribe(inbox, pending_msgs_limit=-1)
    out: list[Stored] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count:
            batch = min(1000, count - len(out))
            request = {"batch": batch, "expires": 2_000_000_000}
            await hub.publish(f"$JS.API.CONSUMER.MSG.NEXT.{AGGREGATE}.{name}", json.dumps(request).encode(), inbox)
            got = 0
            while got < batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BenchError(f"read back {len(out)} of {count} aggregate messages in {timeout:g}s")
                try:
                    msg = await sub.next_msg(timeout=min(remaining, 3.0))
                except Exception:  # nats-py's TimeoutError: ask again
                    break
                if not msg.reply.startswith("$JS.ACK."):
                    break  # a status (408 request expired, 404 no messages): this pull request is over
                seq, store_ns = ack_info(msg.reply)
                out.append(Stored(seq, store_ns, {str(k): str(v) for k, v in (msg.headers or {}).items()}))
                got += 1
    finally:
        await sub.unsubscribe()
    return out
