"""Pull mode under each fault of docs/design.md section 4 ("Faults: how each is detected and repaired in pull mode").

One scenario per row of that table (the first row, deliveries lost in transit, is test_bridge_gap.py's), plus the
mode choice and two processes on one source. Every scenario forces
``mode = "pull"`` in the source's configuration (pull mode works on any server, so the default run on 2.15.1 covers
it too), except the mode choice, which is about the origin's version and asserts what that version implies. The
``pullmode`` runs repeat the file with an origin older than 2.14 (``NATS_ORIGIN_SERVER_BIN``).

Each scenario judges the aggregate by its origin sequences (0 lost, 0 duplicated, 0 reordered) and audits every
explicit ack on the wire as it happens (``AckTap``: no ack may name a message the aggregate does not hold). The
origins are WorkQueue streams, where an ack deletes: an origin that ends empty was acked completely, and an ack of
something unstored would have lost it for good. The consumers' ``ack_wait`` is ``PULL_TEST_ACK_WAIT`` (5 s), so the
redeliveries that follow a crash or a lost delivery come within the tests' deadlines.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from bridge.core import inbound
from bridge.core.pull import PullEngine
from bridge.io.origin import OriginClient
from bridge.io.shared import CONNECTION_NAME
from bridge.testing.configs import ORIGIN, TEST_COORDINATION, TEST_ENGINE, SourceSpec, write_config
from bridge.testing.fakes import filtering_subscribe
from bridge.testing.http import standby_ready
from bridge.testing.inprocess import running_bridge
from bridge.testing.jetstream import (
    AckTap,
    Publisher,
    ack_floor,
    aggregate_count,
    assert_exact,
    connect,
    consumer_exists,
    consumer_info,
    create_aggregate,
    create_stream,
    js_request,
    origin_seqs_by_source,
    replicate_exactly,
    stream_messages,
)
from bridge.testing.polling import assert_holds, settled, wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory, BridgeProcess, fleet_instance
from bridge.testing.servers import PULL_TEST_ACK_WAIT, Topology, origin_mode_expected, ready_event

pytestmark = [pytest.mark.pullmode, pytest.mark.pullfaults]

PREFIX = "edge.one"
SILENCE = float(TEST_ENGINE["silence_timeout"])
TTL = float(TEST_COORDINATION["lease_ttl"])
STOP_GRACE = 15.0
READY = ready_event("pull")  # resync.done: the source's consumer is anchored and pulls
# the keys of a source forced into pull mode, on any origin
PULL = {"mode": "pull", "ack_wait": PULL_TEST_ACK_WAIT}
# How each fault may be detected (the discontinuity's cause), as the design's table says. The first sign wins: once
# a resync is pending, later signs of the same fault change nothing. A frozen server says nothing at all; a deleted
# consumer is reported by a waiting request (409), by the server when none waits (503, no responders), or by
# silence; a restarted server by the connection's return, or by a 503 to a pull request sent while its JetStream
# is still loading, or by the silence.
FROZEN = {"silence", "heartbeat_mismatch", "reconnect"}
DELETED = {"consumer_gone", "unavailable", "silence"}
RESTARTED = {"reconnect", "unavailable", "silence", "heartbeat_mismatch"}


def pull_source(topology: Topology, max_ack_pending: int) -> SourceSpec:
    """One source on the leaf's ORDERS (connected to the leaf directly), forced into pull mode."""
    return SourceSpec(
        name="edge1", servers=topology.leaf.url, subject_prefix=PREFIX, max_ack_pending=max_ack_pending, extra=PULL
    )


async def prepare(leaf_nc: Client, hub_nc: Client, duplicate_window: float = 120) -> None:
    """A WorkQueue origin (an ack deletes) and the aggregate."""
    await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
    await create_aggregate(hub_nc, duplicate_window=duplicate_window)


def ack_tap(leaf_nc: Client, hub_nc: Client, spec: SourceSpec) -> AckTap:
    return AckTap(leaf_nc, hub_nc, {spec.consumer_name: f"{PREFIX}.>"})


async def copies(hub_nc: Client) -> int:
    return await aggregate_count(hub_nc, f"{PREFIX}.>")


async def copies_at_least(hub_nc: Client, count: int, timeout: float = 30) -> None:
    async def probe() -> bool:
        return await copies(hub_nc) >= count

    await wait_until(probe, timeout=timeout, what=f"{count} copies", interval=0.01)


async def origin_emptied(leaf_nc: Client, timeout: float) -> None:
    await wait_for_value(
        lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=timeout, what="the WorkQueue origin emptied", interval=0.1
    )


async def check_exact(hub_nc: Client, expected: list[int], tap: AckTap, consumer: str) -> None:
    """The aggregate holds exactly ``expected`` of edge1, in order, and no ack named anything unstored."""
    assert_exact((await origin_seqs_by_source(hub_nc)).get("edge1", []), expected, "edge1 copies")
    assert tap.violations == [], tap.violations[:5]
    assert tap.acking(consumer), "the bridge acked nothing"


def named(all_events: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in all_events if e.get("event") == event]


def log_events(path: Path) -> list[dict[str, Any]]:
    """The JSON events an in-process bridge wrote to ``path`` so far."""
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
    return out


# --- missing heartbeats ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_leaf_frozen_longer_than_the_silence_timeout(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """The origin server stops answering (SIGSTOP) mid-stream for longer than ``silence_timeout``: no data, no
    heartbeat, no API reply. The bridge counts the silence (its pull requests are outstanding), resyncs (retrying
    while the server is frozen), and once the server is back completes with nothing lost or duplicated."""
    n, freeze = 3000, SILENCE + 2.0
    leaf = topology.leaf
    spec = pull_source(topology, 200)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await prepare(leaf_nc, hub_nc)
        tap = ack_tap(leaf_nc, hub_nc, spec)
        async with tap.running():
            bridge = bridge_procs(config)
            await bridge.wait_event(READY, timeout=20)
            # the publisher's acks wait out the freeze (nats-py's publish futures have no deadline): it simply
            # goes on afterwards, so the stream has messages before, during (queued in the socket) and after
            publisher = Publisher(leaf_nc, n, rate=1000, batch=50)
            async with anyio.create_task_group() as tg:
                tg.start_soon(publisher.run)
                await copies_at_least(hub_nc, n // 3)
                before = len(named(bridge.events(), "discontinuity"))
                await anyio.to_thread.run_sync(leaf.pause)
                try:
                    await anyio.sleep(freeze)  # time is the condition: frozen longer than silence_timeout
                finally:
                    leaf.resume()
            await origin_emptied(leaf_nc, 60)
            assert await bridge.astop(STOP_GRACE) == 0
        await check_exact(hub_nc, publisher.seqs, tap, spec.consumer_name)

    all_events = bridge.events()
    causes = [e["cause"] for e in named(all_events, "discontinuity")[before:]]
    assert FROZEN & set(causes), causes
    requested = named(all_events, "resync.requested")
    assert any(r["cause"] in FROZEN for r in requested), requested
    done = named(all_events, "resync.done")
    assert len(done) >= 2, f"no resync completed after the freeze: {done}"
    print(f"freeze {freeze:g}s: discontinuities {causes}, resyncs {[r['cause'] for r in requested]}")


# --- consumer deleted -----------------------------------------------------------------------------------------


@dataclass
class DeliveryLog:
    """Every delivery the engine is handed, as ``(consumer seq, stream seq, delivery count)``, in arrival order."""

    seen: list[tuple[int, int, int]] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        seen = self.seen

        def recording(messages: Sequence[inbound.Inbound]) -> Sequence[inbound.Inbound]:
            for message in messages:
                if isinstance(message, inbound.Data):
                    seen.append((message.ack.consumer_seq, message.ack.stream_seq, message.ack.delivered))
            return messages

        monkeypatch.setattr(OriginClient, "subscribe", filtering_subscribe(OriginClient.subscribe, recording))


@pytest.mark.anyio
@pytest.mark.parametrize(
    "request_waiting",
    [
        # the bridge has caught up with a paced publisher: its request waits on the server for the next message
        pytest.param(True, id="request-waiting"),
        # the bridge works through a backlog: each request is filled at once, none waits on the server
        pytest.param(False, id="no-request-waiting"),
    ],
)
async def test_consumer_deleted_under_a_running_bridge_is_created_again(
    topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request_waiting: bool
) -> None:
    """An operator deletes the managed pull consumer under a running bridge. A request waiting on the server ends
    with ``409 Consumer Deleted``; with none waiting, nothing answers the next pull request but the server itself
    (``503``, no responders), and the silence is the bridge's last resort. Either way: a resync, whose bind creates
    the consumer again. A WorkQueue origin kept every message not acked yet, and the new consumer (``deliver_policy:
    all``) starts at the first of them: those the bridge holds already are dropped as duplicates (and acked once
    stored), the rest and everything published after are replicated once. The acks of the deleted consumer's
    deliveries that are sent after it is gone delete nothing."""
    backlog, paced = (0, 3000) if request_waiting else (4000, 1000)
    threshold = 1000 if request_waiting else 400
    spec = pull_source(topology, 200)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    log_path = tmp_path / "bridge.log"
    deliveries = DeliveryLog()
    deliveries.install(monkeypatch)
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await prepare(leaf_nc, hub_nc)
        tap = ack_tap(leaf_nc, hub_nc, spec)
        async with tap.running():
            first = Publisher(leaf_nc, backlog)
            await first.run()
            async with running_bridge(config, log_path) as bridge:
                runner = bridge.runners[0]
                engine = runner.engine
                assert isinstance(engine, PullEngine), runner.mode
                second = Publisher(leaf_nc, paced, rate=1000, batch=50)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(second.run)
                    await copies_at_least(hub_nc, threshold)
                    # what the old consumer had acked (hence deleted from the WorkQueue) is at or below this floor...
                    info = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
                    floor_before, waiting = ack_floor(info), int(info.get("num_waiting", 0))
                    mark = len(deliveries.seen)
                    await js_request(leaf_nc, f"CONSUMER.DELETE.{ORIGIN}.{spec.consumer_name}")
                    # ...and nothing above what the aggregate holds now was acked (an ack names a stored message)
                    stored_after = await copies(hub_nc)
                    assert stored_after < backlog + paced, "everything was replicated before the deletion"
                    # the discontinuity is a 409 at once, or silence_timeout: a few seconds with the test timings
                    try:
                        await wait_until(
                            lambda: named(log_events(log_path), "consumer.recreated"),
                            timeout=SILENCE * 5,
                            what="the consumer created again",
                        )
                    except AssertionError as exc:
                        notes = [e for e in log_events(log_path) if not str(e.get("event")).startswith("publish.")]
                        raise AssertionError(
                            f"{exc}\nengine: phase {engine.phase.value}, resets {dict(engine.resets)}, "
                            f"requested {engine.credits.requested}, {engine.stats}\nlast log events: {notes[-4:]}"
                        ) from exc
                await origin_emptied(leaf_nc, 60)
                resets = dict(engine.resets)
                duplicates = engine.stats.duplicates
        expected = first.seqs + second.seqs
        assert expected == list(range(1, backlog + paced + 1))
        await check_exact(hub_nc, expected, tap, spec.consumer_name)

    all_events = log_events(log_path)
    causes = [e["cause"] for e in named(all_events, "discontinuity")]
    assert DELETED & set(causes), causes
    assert sum(resets.get(cause, 0) for cause in DELETED) >= 1, resets
    names = [e.get("event") for e in all_events]
    recreated = names.index("consumer.recreated")
    assert "resync.done" in names[recreated + 1 :], "no resync completed on the consumer created again"
    assert names.count("consumer.recreated") == 1, "created again more than once"

    # the new consumer's first delivery: the first message the WorkQueue still held when it was created
    new_first = next(((dseq, sseq, count) for dseq, sseq, count in deliveries.seen[mark:] if dseq == 1), None)
    assert new_first is not None, f"no delivery of the new consumer seen: {deliveries.seen[mark : mark + 5]}"
    _, first_seq, count = new_first
    assert count == 1, new_first
    assert floor_before < first_seq <= stored_after + 1, (floor_before, first_seq, stored_after)
    print(
        f"deleted at ack floor {floor_before} ({stored_after} stored, {waiting} requests waiting); the new consumer "
        f"started at {first_seq}; discontinuities {causes}, resyncs {resets}, duplicates dropped {duplicates}"
    )


# --- the origin server restarted ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_leaf_restarted_mid_stream(topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory) -> None:
    """The origin server (the leaf; the bridge is connected to it directly) restarts while the bridge works through
    a backlog. The connection's return (or the silence) leads to a resync. The consumer survives in the server's
    store with its pending deliveries (not created again): what the bridge holds of them is redelivered and dropped
    (acked once stored), what was lost in transit is read from the stream."""
    # a backlog large enough that the restart lands inside it: 4,000 were all stored before the leaf went down
    # once the bridge's pull-mode acks became one write (about 60k msg/s drains it in well under a second)
    backlog, after = 40_000, 1000
    leaf = topology.leaf
    spec = pull_source(topology, 100)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await prepare(leaf_nc, hub_nc)
        tap = ack_tap(leaf_nc, hub_nc, spec)
        async with tap.running():
            first = Publisher(leaf_nc, backlog)
            await first.run()
            bridge = bridge_procs(config)
            await copies_at_least(hub_nc, backlog // 40)
            await anyio.to_thread.run_sync(leaf.restart)
            at_restart = await copies(hub_nc)
            assert at_restart < backlog, "not mid-stream: the backlog was replicated before the restart"
            await anyio.to_thread.run_sync(topology.wait_linked)
            second = Publisher(leaf_nc, after)
            await second.run()
            await origin_emptied(leaf_nc, 60)
            assert await bridge.astop(STOP_GRACE) == 0
        expected = first.seqs + second.seqs
        assert expected == list(range(1, backlog + after + 1)), "the origin's sequences went on after the restart"
        await check_exact(hub_nc, expected, tap, spec.consumer_name)

    all_events = bridge.events()
    causes = [e["cause"] for e in named(all_events, "discontinuity")]
    assert RESTARTED & set(causes), causes
    assert named(all_events, "origin.reconnected"), "the bridge never saw the origin connection come back"
    # the consumer survived in the server's store: nothing was created again, and the bridge must not say otherwise
    assert not named(all_events, "consumer.recreated"), named(all_events, "consumer.recreated")
    assert len(named(all_events, "resync.done")) >= 2, "no resync completed after the restart"
    print(f"restarted with {at_restart} of {backlog} copies stored; discontinuities {causes}")


# --- target outage longer than ack_wait -----------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One reading of the origin consumer's info."""

    phase: str
    at: float
    ack_pending: int
    redelivered: int
    waiting: int
    floor: int


@dataclass
class ConsumerSamples:
    """The origin consumer's ``num_ack_pending``, ``num_redelivered``, ``num_waiting`` and ack floor, read every
    0.1 s, each tagged with the scenario's phase at the time."""

    phase: str = "before"
    samples: list[Sample] = field(default_factory=list)

    async def run(self, leaf_nc: Client, consumer: str) -> None:
        while True:
            with contextlib.suppress(Exception):  # a read that failed says nothing; the next one will
                info = await consumer_info(leaf_nc, ORIGIN, consumer)
                self.samples.append(
                    Sample(
                        self.phase,
                        time.monotonic(),
                        int(info.get("num_ack_pending", 0)),
                        int(info.get("num_redelivered", 0)),
                        int(info.get("num_waiting", 0)),
                        ack_floor(info),
                    )
                )
            await anyio.sleep(0.1)

    def of(self, *phases: str) -> list[Sample]:
        return [s for s in self.samples if s.phase in phases]


@pytest.mark.anyio
async def test_target_outage_longer_than_ack_wait(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """The hub (the target; the bridge reads the leaf directly) stops mid-stream for longer than ``ack_wait`` and
    comes back on its store. Publishes fail, the pipeline blocks, nothing more is pulled: the pending messages' ack
    wait runs out, but no redelivery is sent while blocked, and what is pending never exceeds ``max_ack_pending``.
    When the hub is back, the pending messages are stored and acked (redelivered on the next pulls, if at all: at
    most ``max_ack_pending`` of them, all duplicates). The aggregate's duplicate window (1 s) is far shorter than the
    outage, so only the bridge's own duplicate check keeps each copy single."""
    n, max_ack_pending, window = 3000, 200, 1.0
    outage = PULL_TEST_ACK_WAIT + 2.0
    hub = topology.hub
    spec = pull_source(topology, max_ack_pending)
    config = write_config(tmp_path / "bridge.toml", target_url=hub.url, sources=[spec])
    sampler = ConsumerSamples()
    async with connect(topology.leaf.url) as leaf_nc, connect(hub.url) as hub_nc:
        await prepare(leaf_nc, hub_nc, duplicate_window=window)
        tap = ack_tap(leaf_nc, hub_nc, spec)
        async with tap.running():
            bridge = bridge_procs(config)
            await bridge.wait_event(READY, timeout=20)
            publisher = Publisher(leaf_nc, n, rate=1500, batch=50)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sampler.run, leaf_nc, spec.consumer_name)
                async with anyio.create_task_group() as publishing:
                    publishing.start_soon(publisher.run)
                    await copies_at_least(hub_nc, n // 4)
                    await anyio.to_thread.run_sync(hub.stop)
                    sampler.phase = "outage"
                    await anyio.sleep(outage)  # time is the condition: the outage must outlast ack_wait
                    sampler.phase = "recovery"
                    hub.start()
                    await anyio.to_thread.run_sync(hub.wait_ready, 10.0)
                    await anyio.to_thread.run_sync(topology.wait_linked, 10.0)
                await origin_emptied(leaf_nc, 60)
                sampler.phase = "after"
                await wait_until(lambda: sampler.of("after"), timeout=5, what="a consumer sample after")
                tg.cancel_scope.cancel()
            assert await bridge.astop(STOP_GRACE) == 0
        await check_exact(hub_nc, publisher.seqs, tap, spec.consumer_name)
        final = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)

    during, recovery = sampler.of("outage"), sampler.of("recovery", "after")
    assert len(during) >= 10, f"the consumer was hardly observed during the outage: {len(during)} samples"
    # the scenario did what it says: a message stayed pending (the ack floor stuck below it) for longer than ack_wait
    outlasting = [
        (a, b)
        for a in during
        for b in during
        if b.at - a.at > PULL_TEST_ACK_WAIT and a.floor == b.floor and a.ack_pending > 0 and b.ack_pending > 0
    ]
    assert outlasting, f"nothing stayed pending for ack_wait during the outage: {during[0]} .. {during[-1]}"
    pending = max(s.ack_pending for s in sampler.samples)
    assert pending <= max_ack_pending, f"num_ack_pending reached {pending} (max_ack_pending {max_ack_pending})"
    # blocked, the bridge asks for nothing: no request waits to take the expired messages' redeliveries
    assert max(s.redelivered for s in during) == 0, f"redelivered while the target was down: {during[-5:]}"
    redelivered = max(s.redelivered for s in recovery)
    assert redelivered <= max_ack_pending, f"{redelivered} redelivered at once (max_ack_pending {max_ack_pending})"
    assert final["num_ack_pending"] == 0 and final["num_redelivered"] == 0, final
    assert bridge.count("target.reconnected") >= 1
    print(
        f"outage {outage:g}s: num_ack_pending max {pending} (during the outage {max(s.ack_pending for s in during)}), "
        f"num_redelivered max {redelivered} after, num_waiting during {sorted({s.waiting for s in during})}"
    )


# --- the bridge killed ----------------------------------------------------------------------------------------


async def kill_holding_unstored(proc: BridgeProcess, leaf_nc: Client, hub_nc: Client, consumer: str) -> tuple[int, int]:
    """SIGKILL ``proc`` at a moment the consumer has delivered it messages the aggregate does not hold; returns
    ``(copies, delivered stream seq)`` at the kill.

    A bare SIGKILL can land between a burst of publish acks and the next pull request, with everything delivered
    stored and nothing for the successor to read. So the process is frozen first (SIGSTOP: it sends nothing more),
    what it had already written is let land (the copies stop changing), and only if the consumer's delivered pointer
    is above the copies is it killed; otherwise it is thawed and the next moment is tried.
    """
    for _ in range(100):
        proc.pause()
        stored = await settled(lambda: copies(hub_nc), quiet=0.2, timeout=10)
        delivered = int((await consumer_info(leaf_nc, ORIGIN, consumer))["delivered"]["stream_seq"])
        if delivered > stored:
            assert await proc.akill() == -9
            return stored, delivered
        proc.resume()
        await anyio.sleep(0.05)
    raise AssertionError("the bridge never held a delivery it had not stored")


@pytest.mark.anyio
async def test_bridge_killed_mid_stream_the_next_process_reads_the_rest_from_the_stream(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """SIGKILL mid-stream, with publishes in flight (stored or not, their acks never read) and deliveries taken but
    not stored: the consumer delivered messages to the dead process that the aggregate does not hold, and they stay
    pending until ``ack_wait``. The next process recovers its watermark from the aggregate, and its resync reads
    what the consumer delivered above it from the origin stream at once (``resync.fetching``) instead of waiting
    for the redeliveries; those come after ``ack_wait`` and are acked. A delivery the server could not hand to the
    dead process (its pull request's interest gone) is rolled back instead: the server lowers its delivery count and
    queues it again at once (``didNotDeliver`` in nats-server's consumer.go), so it reaches the second process as a
    first delivery, which is acked the same way."""
    # the live stream (2,000 msg/s) must outlast the first process's start-up on a busy machine: the kill needs
    # the consumer to deliver while the process is frozen, and a fast bridge keeps nothing unstored otherwise
    n, live, window = 12_500, 10_000, 1.0
    spec = pull_source(topology, 500)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await prepare(leaf_nc, hub_nc, duplicate_window=window)
        tap = ack_tap(leaf_nc, hub_nc, spec)
        async with tap.running():
            backlog = Publisher(leaf_nc, n - live)
            await backlog.run()  # a backlog: the first process has a full window in flight when it dies
            first = bridge_procs(config)
            publisher = Publisher(leaf_nc, live, rate=2000)
            async with anyio.create_task_group() as tg:
                tg.start_soon(publisher.run)
                await copies_at_least(hub_nc, (n - live) // 2)
                at_kill, delivered_at_kill = await kill_holding_unstored(first, leaf_nc, hub_nc, spec.consumer_name)
                killed_at = time.monotonic()
                assert at_kill < n, "not mid-stream: everything was already replicated"
                # the aggregate's dedupe must not be what keeps a copy single after the restart
                await anyio.sleep(max(0.0, killed_at + window + 0.5 - time.monotonic()))  # a time condition
                second = bridge_procs(config)
                await second.wait_event(READY, timeout=20)
            # the fetched messages stay pending until their redeliveries (one ack_wait after the kill) are acked
            await origin_emptied(leaf_nc, 4 * PULL_TEST_ACK_WAIT)
            emptied_after = time.monotonic() - killed_at
            fetching = named(second.events(), "resync.fetching")
            assert fetching, "the second process read nothing from the stream: nothing delivered above its watermark?"
            fetched = sorted({s for e in fetching for s in range(int(e["fetch_from"]), int(e["fetch_to"]) + 1)})

            # a fetched message has no ack subject in the second process: it is acked when the consumer delivers it
            # again, a redelivery after ack_wait or, for a delivery rolled back at the kill, a first delivery (seen
            # on 2.12: the top 308 of 1,608 fetched). Only the second process can ack one: it was above every stored
            # copy when it recovered, and the first acked only stored ones. The origin emptied once those acks
            # reached the server; the tap (a subscription of this test process) reads them after it, and on a busy
            # machine it was seen to lag by hundreds when the tap stopped at once: it is given until its deadline.
            def unacked() -> list[int]:
                acked = {ack.stream_seq for ack in tap.acking(spec.consumer_name)}
                return [s for s in fetched if s not in acked]

            await wait_for_value(unacked, [], timeout=30, what="every fetched message acked by the second process")
            assert await second.astop(STOP_GRACE) == 0
        expected = backlog.seqs + publisher.seqs
        assert expected == list(range(1, n + 1))
        await check_exact(hub_nc, expected, tap, spec.consumer_name)

    second_events = second.events()
    recovered = named(second_events, "recovery.done")
    assert recovered and recovered[0]["watermark"] > 0, recovered
    print(
        f"killed with {at_kill} copies stored, {delivered_at_kill} delivered; recovery {recovered[0]['watermark']}; "
        f"fetched {len(fetched)} "
        f"({fetching[0]['fetch_from']}..{fetching[0]['fetch_to']}); origin empty {emptied_after:.1f}s after the kill"
    )


# --- the mode chosen on this origin -----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("configured", ["auto", "flow_control", "pull"])
async def test_the_mode_follows_the_configuration_and_the_origin(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, configured: str
) -> None:
    """``auto`` takes flow control on 2.14+ and pull before; ``pull`` is pull anywhere; ``flow_control`` on an origin
    older than 2.14 is a configuration error: ``run`` exits 2 with ``config.invalid`` naming the key, and creates
    no consumer. Which of these applies depends on the origin's version (``origin_mode_expected``)."""
    n = 200
    expected = origin_mode_expected()
    spec = SourceSpec(
        name="edge1",
        servers=topology.leaf.url,
        subject_prefix=PREFIX,
        extra={"mode": configured, "ack_wait": PULL_TEST_ACK_WAIT},
    )
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await prepare(leaf_nc, hub_nc)
        bridge = bridge_procs(config)
        if configured == "flow_control" and expected == "pull":
            await wait_until(lambda: not bridge.is_running, timeout=30, what="run to exit")
            assert await bridge.astop(STOP_GRACE) == 2, bridge.tail()
            (invalid,) = [e for e in bridge.events() if e.get("event") == "config.invalid"]
            assert "sources[edge1].mode" in invalid["problem"], invalid
            assert invalid["exit_code"] == 2, invalid
            assert not await consumer_exists(leaf_nc, ORIGIN, spec.consumer_name), "a consumer was created"
            return
        mode = "pull" if configured == "pull" else expected
        await bridge.wait_event(ready_event(mode), timeout=20)
        (chosen,) = [e for e in bridge.events() if e.get("event") == "source.mode"]
        assert chosen["mode"] == mode, chosen
        if configured != "auto":
            assert chosen["reason"] == "configured", chosen
        publisher = Publisher(leaf_nc, n)
        await publisher.run()
        await origin_emptied(leaf_nc, 30)
        assert await bridge.astop(STOP_GRACE) == 0
        assert_exact((await origin_seqs_by_source(hub_nc)).get("edge1", []), publisher.seqs, "edge1 copies")
        consumer = (await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))["config"]
        assert consumer["ack_policy"] == ("explicit" if mode == "pull" else "flow_control"), consumer


@pytest.mark.anyio
async def test_auto_keeps_a_pull_durable_whatever_the_origin(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """A pull durable made before the origin's upgrade (the bridge's own pull configuration): ``auto`` keeps it on
    any server. On 2.14+ the bridge first presumes flow control (no ``CONSUMER.INFO`` per source at start-up), the
    server refuses to turn the pull consumer into a push one, and the durable then decides: pull mode, logged once,
    the consumer unchanged, every message replicated once."""
    n = 200
    spec = SourceSpec(
        name="edge1", servers=topology.leaf.url, subject_prefix=PREFIX, extra={"ack_wait": PULL_TEST_ACK_WAIT}
    )
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await prepare(leaf_nc, hub_nc)
        pull = {
            "durable_name": spec.consumer_name,
            "ack_policy": "explicit",
            "deliver_policy": "all",
            "max_deliver": -1,
        }
        await js_request(
            leaf_nc,
            f"CONSUMER.CREATE.{ORIGIN}.{spec.consumer_name}",
            {"stream_name": ORIGIN, "config": pull},
            timeout=5,
        )
        created = (await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))["created"]
        bridge = bridge_procs(config)
        await bridge.wait_event(READY, timeout=20)
        (chosen,) = [e for e in bridge.events() if e.get("event") == "source.mode"]
        assert (chosen["mode"], chosen["reason"]) == ("pull", "the durable consumer exists as a pull consumer"), chosen
        publisher = Publisher(leaf_nc, n)
        await publisher.run()
        await origin_emptied(leaf_nc, 30)
        assert await bridge.astop(STOP_GRACE) == 0
        assert_exact((await origin_seqs_by_source(hub_nc)).get("edge1", []), publisher.seqs, "edge1 copies")
        after = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
        assert (after["created"], after["config"]["ack_policy"]) == (created, "explicit"), after
        assert not after["config"].get("deliver_subject"), after


# --- two processes on one source ----------------------------------------------------------------------------------


async def source_connections(topology: Topology, source: str) -> int:
    """How many origin connections the leaf has from bridges (``source`` is their only one: a process connects to
    an origin only while it runs a source there)."""
    connz = await anyio.to_thread.run_sync(topology.leaf.monitor, "connz?limit=1024")
    return sum(1 for c in connz.get("connections") or [] if c.get("name") == CONNECTION_NAME)


@pytest.mark.anyio
async def test_twins_only_the_lease_owner_pulls_and_the_standby_takes_over(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """Two processes with one configuration (coordination enabled, as in every test configuration) on one pull-mode
    source: only the lease owner connects to the origin, pulls and acks; the standby does nothing with the source.
    SIGKILL the owner under traffic: the standby takes the lease over once it lapses, and its resync reads what the
    dead owner had been delivered from the stream. Duplicate window 1 s: no copy twice, none lost."""
    n, window = 8000, 1.0
    spec = pull_source(topology, 500)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await prepare(leaf_nc, hub_nc, duplicate_window=window)
        tap = ack_tap(leaf_nc, hub_nc, spec)
        async with tap.running():
            owner = fleet_instance(bridge_procs, config, "p0")
            await owner.wait_event(READY, timeout=20)
            standby = fleet_instance(bridge_procs, config, "p1")
            await wait_until(lambda: standby_ready(standby, "edge1"), timeout=20, what="p1 ready as standby")
            publisher = Publisher(leaf_nc, n, rate=2000)
            async with anyio.create_task_group() as tg:
                tg.start_soon(publisher.run)
                await wait_until(lambda: publisher.published > n // 4, timeout=30, what="traffic")

                async def only_the_owner() -> None:
                    assert await source_connections(topology, "edge1") == 1, "not exactly one origin connection"
                    for event in ("source.mode", "consumer.bound", "resync.requested"):
                        assert standby.events(event) == [], f"the standby logged {event}"

                await assert_holds(only_the_owner, duration=1.0, what="only the owner on the source")
                killed_at = time.monotonic()
                assert await owner.akill() == -9
                await standby.wait_event(READY, timeout=TTL + 10)
                took = time.monotonic() - killed_at
            await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
            await wait_for_value(
                lambda: source_connections(topology, "edge1"), 1, timeout=10, what="origin connections of edge1"
            )
            assert await standby.astop(STOP_GRACE) == 0
        await check_exact(hub_nc, publisher.seqs, tap, spec.consumer_name)
    assert took < TTL + 5, f"take-over took {took:.1f}s with a {TTL:g}s lease"
    assert standby.events("source.mode", mode="pull"), "the standby did not replicate in pull mode"
    fetched = [(e["fetch_from"], e["fetch_to"]) for e in standby.events("resync.fetching")]
    print(f"take-over after SIGKILL: {took:.2f}s; fetched by the successor: {fetched}")
