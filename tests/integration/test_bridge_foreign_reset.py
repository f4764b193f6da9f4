"""Someone else resets the bridge's consumer, backward and forward, while messages flow.

ADR-60 semantics: a forward reset skips (the operator says "not these"), a backward one must not duplicate. The
bridge learns of a foreign reset only through the discontinuity it causes (delivery sequence back at 1, or a
heartbeat disagreeing) and answers with its own reset to the ack floor.

Limits origin, so every message stays and "absent from the aggregate" can be told from "never published". A small
``max_ack_pending`` keeps the bridge mid-stream (at most 50 deliveries ahead of the ack floor) when the resets hit.
The resets are sent from a hub client through ``$JS.leaf.API`` (the domain path).

``CONSUMER.RESET`` exists from nats-server 2.14 on, with flow control: only the deleted-consumer scenario also holds
in pull mode (an origin older than 2.14), and only it is marked ``pullmode``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client

from bridge.testing.configs import ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import (
    Publisher,
    ack_floor,
    aggregate_count,
    assert_exact,
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    delivered,
    duplicates,
    js_request,
    origin_seqs_by_source,
    stream_info,
    stream_messages,
)
from bridge.testing.polling import wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory, BridgeProcess
from bridge.testing.servers import READY_EVENTS, Topology, mode_source_extra, ready_event

MAX_ACK_PENDING = 50
PREFIX = "edge.one"


@dataclass
class Record:
    """What the foreign resets did, to judge the aggregate by."""

    windows: list[tuple[int, int]] = field(default_factory=list)  # seqs a forward reset may have skipped
    certain: list[tuple[int, int]] = field(default_factory=list)  # published after a forward reset, below it
    backward: list[tuple[int, int]] = field(default_factory=list)  # (floor before, reset seq)


async def foreign_reset(hub_nc: Client, consumer: str, seq: int) -> None:
    reply = await js_request(hub_nc, f"CONSUMER.RESET.{ORIGIN}.{consumer}", {"seq": seq}, domain="leaf")
    assert int(reply["reset_seq"]) == seq, reply


async def paused_last_seq(leaf_nc: Client, publisher: Publisher) -> int:
    """Hold the publisher and return the origin's last sequence: nothing above it exists until unpaused."""
    publisher.pause()
    # the batch in flight when paused completes (its acks are awaited): wait until the count stops moving
    await wait_until(lambda: _settled(leaf_nc, publisher), timeout=5, what="publisher to settle", interval=0.05)
    return int((await stream_info(leaf_nc, ORIGIN))["state"]["last_seq"])


async def _settled(leaf_nc: Client, publisher: Publisher) -> bool:
    last = int((await stream_info(leaf_nc, ORIGIN))["state"]["last_seq"])
    return last == publisher.published


class Scenario:
    def __init__(
        self, topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, n: int, mode: str = "flow_control"
    ) -> None:
        self.topology = topology
        self.n = n
        self.mode = mode
        self.spec = SourceSpec(
            name="edge1",
            servers=topology.leaf.url,
            subject_prefix=PREFIX,
            max_ack_pending=MAX_ACK_PENDING,
            extra=mode_source_extra(mode),
        )
        self.consumer = self.spec.consumer_name
        self.config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[self.spec])
        self.bridge_procs = bridge_procs
        self.record = Record()

    async def start(self, leaf_nc: Client, hub_nc: Client, retention: str) -> BridgeProcess:
        """The origin (``retention``) and the aggregate, then the bridge, once its first reset (pull mode: resync)
        is done."""
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention=retention)
        await create_aggregate(hub_nc)
        bridge = self.bridge_procs(self.config)
        await bridge.wait_event(ready_event(self.mode), timeout=20)
        return bridge

    async def copies_at_least(self, hub_nc: Client, count: int, timeout: float = 20) -> None:
        async def probe() -> bool:
            return await aggregate_count(hub_nc, f"{PREFIX}.>") >= count

        await wait_until(probe, timeout=timeout, what=f"{count} copies", interval=0.02)

    async def published_at_least(self, publisher: Publisher, count: int) -> None:
        await wait_until(lambda: publisher.published >= count, timeout=20, what=f"{count} published")

    async def small_backward(self, leaf_nc: Client, hub_nc: Client, publisher: Publisher, back: int) -> None:
        """Hold the publisher, let the bridge catch up, reset ``back`` below the floor, release the publisher."""
        last = await paused_last_seq(leaf_nc, publisher)
        await wait_for_value(lambda: self.floor(leaf_nc), last, timeout=15, what="ack floor (caught up)")
        await foreign_reset(hub_nc, self.consumer, last + 1 - back)
        self.record.backward.append((last, last + 1 - back))
        publisher.unpause()

    async def floor(self, leaf_nc: Client) -> int:
        return ack_floor(await consumer_info(leaf_nc, ORIGIN, self.consumer))

    def judge(self, seqs: list[int], bridge: BridgeProcess) -> list[int]:
        """Check the aggregate against the record; returns the absent origin sequences."""
        record = self.record
        assert duplicates(seqs) == [], "a redelivery after a backward reset was replicated twice"
        assert seqs == sorted(seqs), "copies out of origin order"
        present = set(seqs)
        absent = sorted(set(range(1, self.n + 1)) - present)
        allowed = set().union(*(range(lo, hi + 1) for lo, hi in record.windows))
        unexplained = [s for s in absent if s not in allowed]
        assert unexplained == [], f"absent outside every forward-reset window {record.windows}: {unexplained[:30]}"
        for lo, hi in record.certain:
            replicated = [s for s in range(lo, hi + 1) if s in present]
            assert replicated == [], f"skipped by the forward reset to {hi + 1} but replicated: {replicated[:20]}"
        # the bridge noticed each foreign reset and adopted it with its own reset (or, finding the consumer at rest
        # right after it, without one)
        resets = bridge.events(READY_EVENTS)
        assert len(resets) >= 1 + len(record.windows) + len(record.backward), resets
        skipped = [(e["skipped_from"], e["skipped_to"]) for e in resets if "skipped_from" in e]
        for lo, hi in skipped:
            assert any(wlo <= lo and hi <= whi for wlo, whi in record.windows), (skipped, record.windows)
        return absent


@pytest.mark.anyio
async def test_forward_resets_skip_backward_reset_does_not_duplicate(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    n = 4000
    sc = Scenario(topology, tmp_path, bridge_procs, n)
    record = sc.record
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        bridge = await sc.start(leaf_nc, hub_nc, "limits")
        publisher = Publisher(leaf_nc, n, rate=500, batch=50)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)

            # 1. backward: what is redelivered is already stored and must not be copied again. Held publisher,
            #    bridge caught up, then 20 back: the redelivery stays within max_ack_pending of what the bridge
            #    holds (the other test resets far below it)
            await sc.published_at_least(publisher, 700)
            await sc.small_backward(leaf_nc, hub_nc, publisher, 20)

            # 2. forward past the stream's end: the rest of what was published, and what is published next up to
            #    the target, is skipped
            await sc.published_at_least(publisher, 1800)
            last = await paused_last_seq(leaf_nc, publisher)
            floor = await sc.floor(leaf_nc)
            target = last + 150
            await foreign_reset(hub_nc, sc.consumer, target)
            publisher.unpause()
            record.windows.append((floor + 1, target - 1))
            record.certain.append((last + 1, target - 1))

            # 3. forward just past what was delivered, with traffic flowing
            await sc.published_at_least(publisher, 2900)
            info = await consumer_info(leaf_nc, ORIGIN, sc.consumer)
            target = delivered(info) + 20
            await foreign_reset(hub_nc, sc.consumer, target)
            record.windows.append((ack_floor(info) + 1, target - 1))

            # 4. backward again, after the forward skips
            await sc.published_at_least(publisher, 3600)
            await sc.small_backward(leaf_nc, hub_nc, publisher, 10)

        assert publisher.seqs == list(range(1, n + 1))
        await wait_for_value(lambda: sc.floor(leaf_nc), n, timeout=30, what="ack floor (everything handled)")
        assert await bridge.astop(15) == 0
        seqs = (await origin_seqs_by_source(hub_nc)).get("edge1", [])
        absent = sc.judge(seqs, bridge)
        assert absent, "the forward resets skipped nothing: the scenario did not exercise them"
        print(f"absent {len(absent)}, windows {record.windows}, backward {record.backward}")


@pytest.mark.anyio
async def test_backward_reset_far_below_watermark_keeps_flowing(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    n = 2000
    sc = Scenario(topology, tmp_path, bridge_procs, n)
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        bridge = await sc.start(leaf_nc, hub_nc, "limits")
        publisher = Publisher(leaf_nc, n, rate=800, batch=50)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await sc.published_at_least(publisher, 800)
            # Held publisher, bridge caught up: no flow-control request is outstanding when the reset lands. (With
            # one outstanding, the bridge may answer it with its old-epoch position before its own reset, which
            # puts the floor back up and hides the bug: that made this test pass about one run in ten.)
            last = await paused_last_seq(leaf_nc, publisher)
            await wait_for_value(lambda: sc.floor(leaf_nc), last, timeout=15, what="ack floor (caught up)")
            target = last - 400  # far more than 2 x max_ack_pending below what the bridge holds
            await foreign_reset(hub_nc, sc.consumer, target)
            sc.record.backward.append((last, target))
            publisher.unpause()

        # a bridge that keeps its invariants catches up within a few seconds (one reset, then redelivery)
        await wait_for_value(lambda: sc.floor(leaf_nc), n, timeout=15, what="ack floor (everything handled)")
        assert await bridge.astop(15) == 0
        seqs = (await origin_seqs_by_source(hub_nc)).get("edge1", [])
        assert sc.judge(seqs, bridge) == []


@pytest.mark.anyio
@pytest.mark.pullmode
async def test_a_deleted_consumer_is_created_again_before_the_reset(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str
) -> None:
    """An operator deletes the managed consumer mid-stream. The bridge notices the silence and, before its RESET
    (which nobody would answer: a RESET is the consumer's own subscription), creates the consumer again, so the
    reset succeeds at the first attempt; a WorkQueue origin keeps every message meanwhile, and all arrive once.
    In pull mode the bridge notices the deletion (``409 Consumer Deleted``, or silence) and resyncs, which binds
    again: the consumer is created again and the resync completes on it."""
    n = 3000
    sc = Scenario(topology, tmp_path, bridge_procs, n, origin_mode)
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        bridge = await sc.start(leaf_nc, hub_nc, "workqueue")
        publisher = Publisher(leaf_nc, n, rate=500, batch=50)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await sc.published_at_least(publisher, 800)
            await js_request(hub_nc, f"CONSUMER.DELETE.{ORIGIN}.{sc.consumer}", domain="leaf")
            await bridge.wait_event("consumer.recreated", timeout=30)
        await sc.copies_at_least(hub_nc, n, timeout=30)
        await wait_for_value(
            lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=15, what="the WorkQueue origin emptied by the answers"
        )
        assert await bridge.astop(15) == 0
        seqs = (await origin_seqs_by_source(hub_nc)).get("edge1", [])
    assert_exact(seqs, publisher.seqs, "copies of a WorkQueue origin whose consumer was deleted")
    events = bridge.events()
    names = [e.get("event") for e in events]
    if origin_mode == "pull":
        # no RESET in pull mode: the resync that re-created the consumer went on to completion on it
        recreated = names.index("consumer.recreated")
        assert "resync.done" in names[recreated + 1 :], "no resync completed after the consumer was re-created"
    else:
        assert [e for e in events if e.get("event") == "reset.failed"] == [], "a RESET went to the deleted consumer"
    assert len([e for e in events if e.get("event") == "consumer.recreated"]) == 1
