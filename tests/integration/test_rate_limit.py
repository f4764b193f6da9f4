"""``sources[].rate_limit`` on a real server: the managed flow-control consumer carries it as ``rate_limit_bps`` (bits
per second), the origin paces its deliveries by it, and replication stays exact; the bridge shows it in its
metrics and ``/readyz``.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import pytest

from bridge.testing.configs import ORIGIN, SourceSpec, write_config
from bridge.testing.inprocess import running_bridge
from bridge.testing.jetstream import (
    Publisher,
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    replicate_exactly,
)
from bridge.testing.polling import wait_until
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import Topology

RATE = 16 * 1024  # bytes per second
SIZE = 4096
COUNT = 24  # 96 KiB: six seconds of the limit


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["flow_control", "pull"])
async def test_deliveries_are_paced_at_the_rate_limit_and_nothing_is_lost(
    topology: Topology, tmp_path: Path, mode: str
) -> None:
    """Flow-control mode: the server paces (the consumer's rate_limit_bps). Pull mode: the bridge does, asking for a
    second's worth once what came is paid for at the limit."""
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    spec.extra["rate_limit"] = "16KiB"
    spec.extra["mode"] = mode
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        # the server lets one burst of the origin stream's max_msg_size through at once (else of max_payload: 1 MiB,
        # more than this whole test sends): README says so
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue", max_msg_size=2 * SIZE)
        await create_aggregate(hub_nc)
        publisher = Publisher(leaf_nc, COUNT, payload=lambda i: bytes([65 + i % 26]) * SIZE)
        await publisher.run()  # the whole backlog is there before the bridge starts: only the limit paces it
        began = time.monotonic()
        async with running_bridge(config, tmp_path / "bridge.log") as bridge:
            info = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
            # the server's unit is bits per second; a pull consumer has no rate limit of its own
            assert info["config"].get("rate_limit_bps", 0) == (RATE * 8 if mode == "flow_control" else 0)
            snapshot = bridge.runners[0].snapshot()
            assert snapshot.rate_limit == RATE and snapshot.to_json(time.time())["rate_limit"] == RATE
            with anyio.fail_after(60):
                await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
            elapsed = time.monotonic() - began
        # a lower bound only (a busy machine is slower, never faster): the bytes after the first burst (the server's:
        # the stream's max_msg_size; the bridge's: one message, then a second's worth per request), at the limit
        paced = COUNT * SIZE - (2 * SIZE if mode == "flow_control" else SIZE + RATE)
        assert elapsed >= paced / RATE, f"{COUNT * SIZE} bytes in {elapsed:.1f}s: not paced at {RATE} B/s"


@pytest.mark.anyio
async def test_a_new_rate_limit_is_taken_by_sighup_without_restarting_the_source(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """The operator lifts a thin link's limit: the consumer is updated in place (no second bind, recovery or reset of
    the source), traffic flows through the change, and replication stays exact."""
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    spec.extra.update({"rate_limit": "16KiB", "mode": "flow_control"})
    path = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue", max_msg_size=2 * SIZE)
        await create_aggregate(hub_nc)
        bridge = bridge_procs(path)
        await bridge.wait_event("bridge.ready", timeout=30)
        publisher = Publisher(leaf_nc, 600, rate=200)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await wait_until(lambda: len(publisher.seqs) > 100, timeout=30, what="traffic before the change")
            spec.extra["rate_limit"] = "1MB"
            write_config(path, target_url=topology.hub.url, sources=[spec])
            bridge.signal(signal.SIGHUP)
            await bridge.wait_event("source.retuned", timeout=30, source="edge1")
        info = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
        assert info["config"]["rate_limit_bps"] == 8_000_000
        (applied,) = bridge.events("reload.applied")
        assert applied["changed"] == ["edge1"] and applied["retuned"] == ["edge1"]
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        assert bridge.count("recovery.done", source="edge1") == 1  # started once: never restarted
        assert bridge.count("source.stopped", source="edge1") == 0
        assert await bridge.astop(30) == 0
