"""The wire parser and nats-py's own dispatch. Without the parser (a nats-py whose internals ``bridge.io.wire`` does
not recognise), the bridge replicates through nats-py's ordinary subscription callbacks, with the same result: every
message once, in order, headers renamed by the same policy. With it, the hot subscriptions have no nats-py task."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from bridge.core.frames import Frame
from bridge.io import wire
from bridge.io.origin import OriginClient
from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.inprocess import running_bridge
from bridge.testing.jetstream import (
    Publisher,
    assert_exact,
    connect,
    create_aggregate,
    create_stream,
    read_stream,
    seqs_by_source,
    stream_messages,
)
from bridge.testing.polling import wait_for_value, wait_until
from bridge.testing.servers import Topology

N = 3000


@pytest.mark.anyio
async def test_replicates_through_nats_py_callbacks(
    topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "install", lambda nc: None)
    callbacks = 0
    original = OriginClient._on_msg

    async def counted(self: OriginClient, msg: object) -> None:
        nonlocal callbacks
        callbacks += 1
        await original(self, msg)  # type: ignore[arg-type]

    monkeypatch.setattr(OriginClient, "_on_msg", counted)
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one", max_ack_pending=300)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        await Publisher(leaf_nc, N, headers=lambda i: {"Nats-Msg-Id": f"app-{i}", "X-App": str(i)}).run()
        async with running_bridge(config, tmp_path / "bridge.log"):
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=60, what="origin messages", interval=0.1
            )
        copies = await read_stream(hub_nc, AGGREGATE)
    assert callbacks >= N, "deliveries went through nats-py's callback"
    assert_exact(seqs_by_source(copies)["edge1"], range(1, N + 1), "edge1 copies")
    for copy in copies:
        index = int(copy.headers["Test-Index"])
        assert copy.headers["X-App"] == str(index)
        assert copy.headers["Bridge-Orig-Nats-Msg-Id"] == f"app-{index}"
        assert copy.headers["Nats-Msg-Id"] == f"edge1:{ORIGIN}:{copy.origin_seq}"


@pytest.mark.anyio
async def test_a_sink_subscription_makes_no_task_and_hands_over_first_what_nats_py_queued(topology: Topology) -> None:
    """With the wire parser a hot subscription is made without a nats-py callback: no task per subscription (two
    per source), and what nats-py queued itself before the sink was registered comes first, in order."""
    nc = NATS()
    assert wire.install(nc) is not None
    await nc.connect(topology.hub.url)
    try:
        async with connect(topology.hub.url) as pub:
            early: list[bytes] = []
            sink: list[Frame] = []
            taken: list[bytes] = []

            def on_read() -> None:
                taken.extend(frame[3] for frame in wire.take(sink))

            # what a read between SUB and the sink's registration leaves: messages in nats-py's own queue
            sub = await nc.subscribe("early.test")
            await wire.flush(nc)  # the server has the SUB before the other connection publishes
            for i in range(5):
                await pub.publish("early.test", str(i).encode())
            await pub.flush()
            await wait_for_value(lambda: sub.pending_msgs, 5, timeout=10, what="messages queued by nats-py")
            assert wire.adopt_sink(nc, sub, sink, on_read, lambda msgs: early.extend(m.data for m in msgs))
            assert sub.pending_msgs == 0
            assert getattr(sub, "_pending_queue") is wire.SINKED  # noqa: B009 -- the shared stand-in: no queue per subscription
            for i in range(5, 10):
                await pub.publish("early.test", str(i).encode())
            await pub.flush()
            await wait_until(lambda: len(taken) == 5, timeout=10, what="the sink's messages")
            assert early + taken == [str(i).encode() for i in range(10)]

            async def no_callback(msg: Msg) -> None:
                raise AssertionError("nats-py dispatched a sink's message")

            tasks = len(asyncio.all_tasks())
            second = await wire.subscribe_sink(nc, "sink.test", sink, on_read, no_callback, lambda msgs: None)
            assert len(asyncio.all_tasks()) == tasks, "subscribing made a task"
            await wire.flush(nc)
            await pub.publish("sink.test", b"x")
            await pub.flush()
            await wait_until(lambda: taken[-1:] == [b"x"], timeout=10, what="the second sink's message")
            # detached (a source abandoned): what still arrives goes to nats-py, which drops it in the stand-in
            wire.remove_handler(nc, sub)
            await pub.publish("early.test", b"after detach")
            await pub.publish("sink.test", b"y")
            await pub.flush()
            await wait_until(lambda: taken[-1:] == [b"y"], timeout=10, what="the connection still reads")
            assert b"after detach" not in taken and sub.pending_msgs == 0 and nc.is_connected
            await second.unsubscribe()
            await sub.unsubscribe()  # nats-py's unsubscribe reads the stand-in as an empty queue
    finally:
        await nc.close()
