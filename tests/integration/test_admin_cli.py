"""``nats-bridge status`` and ``nats-bridge reset`` against real servers, as an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from bridge.embedded import Topology

from .helpers import (
    ORIGIN,
    BridgeFactory,
    Publisher,
    SourceSpec,
    ack_floor,
    aggregate_count,
    bridge_procs_fixture,  # noqa: F401
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    run_cli,
    wait_for_value,
    write_config,
)


@pytest.mark.anyio
async def test_status_reads_servers_with_the_daemon_down_and_reset_asks_first(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="limits")
        await create_aggregate(hub_nc)
        publisher = Publisher(leaf_nc, 300)
        await publisher.run()
        bridge = bridge_procs(config)
        await wait_for_value(lambda: aggregate_count(hub_nc, "edge.one.>"), 300, timeout=30, what="copies")
        assert await bridge.astop(15) == 0

        done = await anyio.to_thread.run_sync(lambda: run_cli("status", "-c", str(config), "--json"))
        assert done.returncode == 0, done.stderr
        (source,) = json.loads(done.stdout)["sources"]
        assert source["stored_watermark"] == publisher.seqs[-1]
        assert source["origin_last_seq"] == publisher.seqs[-1]
        assert source["lag"] == 0
        assert source["ack_floor"] <= publisher.seqs[-1]
        table = await anyio.to_thread.run_sync(lambda: run_cli("status", "-c", str(config)))
        assert table.returncode == 0 and "stored_watermark" in table.stdout and "edge1" in table.stdout

        # without --yes and without a terminal: explained, refused, nothing changed
        floor = ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))
        refused = await anyio.to_thread.run_sync(lambda: run_cli("reset", "-c", str(config), "edge1", "--seq", "200"))
        assert refused.returncode == 1
        assert "will NEVER be replicated" in refused.stdout and "--yes" in refused.stderr
        assert ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)) == floor

        forward = await anyio.to_thread.run_sync(
            lambda: run_cli("reset", "-c", str(config), "edge1", "--seq", "200", "--yes")
        )
        assert forward.returncode == 0, forward.stderr
        assert "next delivery at 200" in forward.stdout
        info = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
        assert ack_floor(info) == 199

        unknown = await anyio.to_thread.run_sync(lambda: run_cli("reset", "-c", str(config), "nope", "--yes"))
        assert unknown.returncode == 1 and "no source named 'nope'" in unknown.stderr
