"""A message the aggregate can never store blocks its own source, loudly, and nothing else.

Two sources replicate into one aggregate whose ``max_msg_size`` is smaller than one message of source "big".
That source must stop at the oversize message (the origin keeps it and everything after it, nothing acked past
it, an error logged with the server's reason), while source "small" replicates completely. Raising the limit
unblocks it, and it finishes in order.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
from nats.js.api import RetentionPolicy, StreamConfig

from bridge import logs
from bridge.config import load_config
from bridge.core import headers as hdr
from bridge.io.aggregate import read_range
from bridge.io.jsapi import JsApi
from bridge.runtime.app import Bridge
from bridge.testing.servers import Topology

pytestmark = pytest.mark.anyio

LIMIT = 4096
COUNT = 200
OVERSIZE_AT = 101  # origin sequence of the message too large for the aggregate


def _config(topology: Topology, tmp_path: Path) -> Path:
    path = tmp_path / "bridge.toml"
    path.write_text(
        f"""
[engine]
publish_retry_initial = 0.1
publish_retry_max = 0.5

[http]
listen = "127.0.0.1:0"  # a port of its own: other test runs may be at work beside this one

[target]
servers = ["{topology.hub.url}"]
stream = "AGG"

[[sources]]
name = "big"
servers = ["{topology.leaf.url}"]
stream = "BIG"
subject_prefix = "agg.big"

[[sources]]
name = "small"
servers = ["{topology.leaf.url}"]
stream = "SMALL"
subject_prefix = "agg.small"
"""
    )
    return path


async def _copies(nc: Any, source: str) -> list[int]:
    info = await nc.jetstream().stream_info("AGG")
    if info.state.messages == 0:
        return []
    found = await read_range(nc, JsApi(nc), "AGG", info.state.first_seq, info.state.last_seq, f"agg.{source}.>")
    return [p.stream_seq for p in map(hdr.parse_provenance, found) if p is not None]


async def _until(condition: Any, timeout: float, what: str) -> None:
    with anyio.fail_after(timeout):
        while not await condition():
            await anyio.sleep(0.05)


async def test_oversize_message_blocks_only_its_source(topology: Topology, tmp_path: Path) -> None:
    log = io.StringIO()
    logs.configure("info", "json", stream=log)
    leaf = await nats.connect(topology.leaf.url)
    hub = await nats.connect(topology.hub.url)
    ljs, hjs = leaf.jetstream(), hub.jetstream()
    try:
        for name in ("BIG", "SMALL"):
            await ljs.add_stream(
                StreamConfig(name=name, subjects=[f"{name.lower()}.>"], retention=RetentionPolicy.WORK_QUEUE)
            )
        await hjs.add_stream(StreamConfig(name="AGG", subjects=["agg.>"], allow_direct=True, max_msg_size=LIMIT))
        for seq in range(1, COUNT + 1):
            size = LIMIT * 2 if seq == OVERSIZE_AT else 100
            await ljs.publish("big.x", b"b" * size)
            await ljs.publish("small.x", b"s" * 100)

        started = time.time()
        bridge = Bridge(load_config(_config(topology, tmp_path), environ={}))

        async def scenario(b: Bridge) -> None:
            try:
                # the small source completes while the big one is stuck
                await _until(lambda: _has(hub, "small", COUNT), 30, "small source complete")
                await _until(lambda: _has(hub, "big", OVERSIZE_AT - 1), 30, "big source up to the oversize message")

                async def blocked_logged() -> bool:
                    return any(
                        json.loads(line).get("event") == "publish.blocked"
                        and json.loads(line).get("origin_seq") == OVERSIZE_AT
                        for line in log.getvalue().splitlines()
                        if line.startswith("{")
                    )

                await _until(blocked_logged, 10, "publish.blocked logged")
                # nothing from the oversize message on was acked at the origin, so the WorkQueue still holds it all
                consumer = await ljs.consumer_info("BIG", "nats-bridge-big")
                assert consumer.ack_floor.stream_seq < OVERSIZE_AT
                origin = await ljs.stream_info("BIG")
                assert origin.state.first_seq <= OVERSIZE_AT
                assert origin.state.messages >= COUNT - OVERSIZE_AT + 1
                assert sorted(await _copies(hub, "big")) == list(range(1, OVERSIZE_AT))
                assert b.runners[0].engine.pipeline.blocked is not None
                # nats_bridge_lag_seconds: the blocked source is as far behind as its oldest waiting message is old
                # (the oversize one, published before the bridge started), the finished one not at all
                big, small = (runner.snapshot() for runner in b.runners)
                now = time.time()
                assert big.oldest_unstored_origin_time is not None and big.oldest_unstored_origin_time < started
                assert (big.lag(now) or 0) >= now - started
                assert small.lag(now) == 0

                # the operator raises the limit: the source unblocks and finishes, in order, once each
                await hjs.update_stream(
                    StreamConfig(name="AGG", subjects=["agg.>"], allow_direct=True, max_msg_size=LIMIT * 4)
                )
                await _until(lambda: _has(hub, "big", COUNT), 30, "big source complete")
                assert await _copies(hub, "big") == list(range(1, COUNT + 1))
                assert await _copies(hub, "small") == list(range(1, COUNT + 1))

                async def origin_empty() -> bool:
                    return bool((await ljs.stream_info("BIG")).state.messages == 0)

                await _until(origin_empty, 10, "big origin drained")
            finally:
                b.stop.set()

        await bridge.run(handle_signals=False, on_started=scenario)
    finally:
        await leaf.close()
        await hub.close()
        logs.configure("info", "console")


async def _has(nc: Any, source: str, count: int) -> bool:
    return len(set(await _copies(nc, source))) >= count


async def test_a_replication_cycle_blocks_its_source_at_the_first_copy_come_back(
    topology: Topology, tmp_path: Path, bridge_procs: Any
) -> None:
    """A misconfiguration: the source's copies are published at the hub on subjects its own origin stream on the
    leaf captures (the leafnode carries them back). Each copy would come back as a new origin message and be copied
    again, its headers growing, round after round. The bridge stops at the first copy that comes back: it blocks
    the source with the reason and the fix, publishes it nowhere, acks nothing from it on; the originals are in the
    aggregate exactly once."""
    from bridge.testing.configs import SourceSpec, write_config
    from bridge.testing.servers import READY_EVENTS

    count = 5
    config = write_config(
        tmp_path / "bridge.toml",
        target_url=topology.hub.url,
        sources=[SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="orders.back")],
    )
    leaf = await nats.connect(topology.leaf.url)
    hub = await nats.connect(topology.hub.url)
    ljs, hjs = leaf.jetstream(), hub.jetstream()
    try:
        await ljs.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"], retention=RetentionPolicy.WORK_QUEUE))
        await hjs.add_stream(StreamConfig(name="AGG", subjects=["orders.back.>"], allow_direct=True))
        for i in range(count):  # before the bridge starts: the originals are 1..count, the first copy back count+1
            await ljs.publish(f"orders.{i}", b"x")
        bridge = bridge_procs(config)
        await bridge.wait_event(READY_EVENTS, timeout=20)

        def blocked() -> list[dict[str, Any]]:
            return [e for e in bridge.events("publish.blocked") if "replication cycle" in str(e.get("reason", ""))]

        async def cycle_blocked() -> bool:
            return bool(blocked())

        await _until(cycle_blocked, 30, "the cycle blocked")
        (event,) = blocked()[:1]
        assert event["origin_seq"] == count + 1, event  # the first copy that came back
        assert "subject_prefix outside the origin stream's subjects" in event["reason"]

        async def copies() -> list[int]:
            info = await hjs.stream_info("AGG")
            found = await read_range(hub, JsApi(hub), "AGG", info.state.first_seq, info.state.last_seq, ">")
            return [p.stream_seq for p in map(hdr.parse_provenance, found) if p is not None]

        assert await copies() == list(range(1, count + 1))  # the originals, once each; no copy of a copy

        async def acked_through_originals() -> bool:  # the next flow-control answer names what is stored
            return bool((await ljs.stream_info("ORDERS")).state.first_seq == count + 1)

        await _until(acked_through_originals, 15, "the originals acked")
        origin = await ljs.stream_info("ORDERS")
        assert origin.state.messages == count  # every copy that came back is kept: nothing acked past the first
        assert bridge.is_running
        assert await bridge.astop(20) == 0
    finally:
        await leaf.close()
        await hub.close()
