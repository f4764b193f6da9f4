"""``nats-bridge status`` and ``nats-bridge reset`` against real servers, as an operator runs them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.http import readyz
from bridge.testing.jetstream import (
    Publisher,
    ack_floor,
    aggregate_count,
    assert_exact,
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    origin_seqs_by_source,
)
from bridge.testing.polling import wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory, run_cli
from bridge.testing.servers import Topology, free_ports


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


@pytest.mark.anyio
async def test_status_adds_the_running_daemons_view_and_reset_without_seq_goes_to_the_ack_floor(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    # status finds the daemon through the configured listen address, so it must be a fixed port
    (port,) = free_ports(1)
    config = write_config(
        tmp_path / "bridge.toml",
        target_url=topology.hub.url,
        sources=[spec],
        http_extra={"listen": f"127.0.0.1:{port}"},
    )
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        bridge = bridge_procs(config)
        await bridge.wait_event("bridge.ready", timeout=30)
        first = Publisher(leaf_nc, 200)
        await first.run()
        await wait_for_value(lambda: aggregate_count(hub_nc, "edge.one.>"), 200, timeout=30, what="copies")

        done = await anyio.to_thread.run_sync(lambda: run_cli("status", "-c", str(config), "--json"))
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        assert status["daemon"] == f"http://127.0.0.1:{port}/readyz"
        (source,) = status["sources"]
        assert source["stored_watermark"] == first.seqs[-1] and source["lag"] == 0
        daemon = dict(source["daemon"])
        assert daemon.pop("mode_reason").endswith("which has ack_policy flow_control")  # names the server's version
        assert daemon == {
            "ready": True,
            "reasons": [],
            "phase": "running",
            "last_error": None,
            "stalled": False,
            "mode": "flow_control",
            "lag_seconds": 0.0,  # everything delivered is stored
            "batched": True,  # the aggregate allows fast batches (create_aggregate)
            "waiting_for_origin": False,  # its consumer is heard from
            "window": 1000,  # the consumer's max_ack_pending, not grown (a near origin)
        }

        # the running daemon adopts an operator's reset to the ack floor: nothing skipped, nothing doubled
        reset = await anyio.to_thread.run_sync(lambda: run_cli("reset", "-c", str(config), "edge1", "--yes"))
        assert reset.returncode == 0, reset.stderr
        # the daemon may ack (answer flow control) at any moment: the floor to expect is the one the CLI read
        found = re.search(r"ack floor (\d+), delivered", reset.stdout)
        assert found is not None, reset.stdout
        floor = int(found.group(1))
        assert f"reset to the ack floor: delivery restarts at {floor + 1}; nothing is skipped" in reset.stdout
        assert f"next delivery at {floor + 1}" in reset.stdout
        second = Publisher(leaf_nc, 100)
        await second.run()
        expected = first.seqs + second.seqs
        await wait_for_value(lambda: aggregate_count(hub_nc, "edge.one.>"), len(expected), timeout=30, what="copies")
        assert_exact((await origin_seqs_by_source(hub_nc, AGGREGATE))["edge1"], expected, "aggregate")

        # with the origin down, status still answers: the servers' side fails, the daemon says why it is unready
        await anyio.to_thread.run_sync(topology.leaf.stop)

        async def daemon_knows() -> dict[str, Any] | None:
            ready, body = await readyz(port)
            live = body["sources"]["edge1"]
            return live if ready == 503 and live["last_error"] and not live["origin_connected"] else None

        await wait_until(daemon_knows, timeout=30, what="the daemon's /readyz naming the lost origin")
        down = await anyio.to_thread.run_sync(lambda: run_cli("status", "-c", str(config), "--json"))
        assert down.returncode == 1, down.stdout
        (source,) = json.loads(down.stdout)["sources"]
        assert "error" in source
        assert source["daemon"]["ready"] is False and "origin not connected" in source["daemon"]["reasons"]
        assert source["daemon"]["last_error"].startswith("origin: "), source
        table = await anyio.to_thread.run_sync(lambda: run_cli("status", "-c", str(config)))
        assert table.returncode == 1
        assert "edge1: not ready: origin not connected" in table.stdout
        assert "edge1: last error in the daemon: origin: " in table.stdout
        await anyio.to_thread.run_sync(topology.leaf.start)
        assert await bridge.astop(15) == 0
