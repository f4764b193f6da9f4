"""Deliveries lost between the server and the engine are repaired by a RESET: no loss, no duplicate.

The bridge runs in-process with ``OriginClient.subscribe`` patched (``filtering_subscribe``) so that the source's
receiver swallows the first delivery of a few origin sequences, as a slow-consumer drop or a lost packet would: the
engine never sees them. A drop in the
middle of a burst shows up as a delivery-sequence jump (reset cause ``gap``); a drop of the very last message
shows up only in the next idle heartbeat (``heartbeat_mismatch``).

In pull mode (an origin older than 2.14, marker ``pullmode``) the same discontinuities lead to a resync, which reads
the swallowed messages from the origin stream (they stay pending on the consumer, and their redeliveries after
``ack_wait`` are dropped as duplicates and acked). Lost flow-control requests exist in flow-control mode only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from bridge.core import inbound
from bridge.core.pull import PullEngine
from bridge.io.origin import OriginClient
from bridge.testing.configs import ORIGIN, SourceSpec, write_config
from bridge.testing.fakes import filtering_subscribe
from bridge.testing.inprocess import running_bridge
from bridge.testing.jetstream import (
    FcTap,
    Publisher,
    assert_exact,
    connect,
    create_aggregate,
    create_stream,
    origin_seqs_by_source,
    stream_messages,
    tap_for_mode,
)
from bridge.testing.polling import wait_for_value
from bridge.testing.servers import PULL_TEST_ACK_WAIT, Topology, mode_source_extra

pytestmark = pytest.mark.pullmode

N = 2000
MID_DROPS = {50, 51, 700, 1234}


def origin_seq(message: inbound.Inbound) -> int | None:
    """The stream sequence of a data message (parsed from its ``$JS.ACK`` reply, v1 or v2)."""
    return message.ack.stream_seq if isinstance(message, inbound.Data) else None


@pytest.mark.anyio
async def test_lost_deliveries_are_reset_and_replayed(
    topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin_mode: str
) -> None:
    drops = MID_DROPS | {N}
    dropped: list[int] = []

    def lossy(messages: Sequence[inbound.Inbound]) -> list[inbound.Inbound]:
        kept = []
        for message in messages:
            seq = origin_seq(message)
            if seq in drops and seq not in dropped:
                dropped.append(seq)
                continue
            kept.append(message)
        return kept

    monkeypatch.setattr(OriginClient, "subscribe", filtering_subscribe(OriginClient.subscribe, lossy))

    spec = SourceSpec(
        name="edge1",
        servers=topology.leaf.url,
        subject_prefix="edge.one",
        max_ack_pending=200,
        extra=mode_source_extra(origin_mode),
    )
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        publisher = Publisher(leaf_nc, N)
        await publisher.run()
        tap = tap_for_mode(leaf_nc, hub_nc, {spec.consumer_name: "edge.one.>"}, mode=origin_mode)
        async with tap.running(), running_bridge(config, tmp_path / "bridge.log") as bridge:
            engine = bridge.runners[0].engine
            # pull mode: the swallowed messages are read from the stream by the resync, but they stay pending on the
            # consumer until their redelivery (after ack_wait) is acked: the WorkQueue empties a few seconds later
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=60, what="origin messages", interval=0.1
            )
            await wait_for_value(lambda: engine.watermark, N, timeout=10, what="engine watermark")
            resets = dict(engine.resets)
            fetched = engine.stats.fetched if isinstance(engine, PullEngine) else 0
            mode = bridge.runners[0].mode

        assert sorted(dropped) == sorted(drops), "every chosen delivery was swallowed once"
        assert_exact((await origin_seqs_by_source(hub_nc)).get("edge1", []), range(1, N + 1), "edge1 copies")
        assert tap.violations == []
        assert mode is not None and mode.mode == origin_mode, mode
        if origin_mode == "pull":
            assert tap.acking(spec.consumer_name), "the bridge acked nothing"
            # a jump in the delivery sequence or a heartbeat naming another last delivery: either way a resync, and
            # it read the swallowed messages from the stream instead of waiting out ack_wait for their redelivery
            repairs = resets.get("gap", 0) + resets.get("heartbeat_mismatch", 0)
            assert repairs >= 1, resets
            assert fetched >= 1, f"no message was read from the stream by a resync ({resets})"
            print(f"pull mode: resyncs {resets}, fetched {fetched}, ack_wait {PULL_TEST_ACK_WAIT}s")
        else:
            assert resets.get("gap", 0) >= 1, resets
            # the last message's loss is visible only in the heartbeat after it
            assert resets.get("heartbeat_mismatch", 0) >= 1, resets


@pytest.mark.anyio
async def test_lost_flow_control_requests_are_answered_from_the_stalled_header(
    topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin_mode: str
) -> None:
    """The first few FC requests never reach the engine: the consumer stalls until the heartbeat's
    ``Nats-Consumer-Stalled`` names the outstanding subject, which the bridge must answer (with what is stored)."""
    if origin_mode == "pull":
        pytest.skip("flow-control requests exist only in flow-control mode (an origin on nats-server 2.14 or later)")
    lost: list[str] = []

    def lossy(messages: Sequence[inbound.Inbound]) -> list[inbound.Inbound]:
        kept = []
        for message in messages:
            if isinstance(message, inbound.FlowControlRequest) and len(lost) < 3:
                lost.append(message.reply)
                continue
            kept.append(message)
        return kept

    monkeypatch.setattr(OriginClient, "subscribe", filtering_subscribe(OriginClient.subscribe, lossy))
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one", max_ack_pending=200)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        await Publisher(leaf_nc, 1000).run()
        tap = FcTap(leaf_nc, hub_nc, {spec.consumer_name: "edge.one.>"})
        async with tap.running(), running_bridge(config, tmp_path / "bridge.log") as bridge:
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=30, what="origin messages", interval=0.1
            )
            resets = dict(bridge.runners[0].engine.resets)

        assert len(lost) == 3
        answered = {a.subject for a in tap.answers}
        assert set(lost) <= answered, "a lost FC request was never answered (consumer would stall forever)"
        assert_exact((await origin_seqs_by_source(hub_nc)).get("edge1", []), range(1, 1001), "edge1 copies")
        assert tap.violations == []
        # no RESET at all: the new consumer was at rest at start, and a lost FC request needs none
        assert resets == {}, f"a lost FC request needs no reset: {resets}"
