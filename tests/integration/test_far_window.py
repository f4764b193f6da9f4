"""The window sizes itself over a far link (``bridge.core.window``): a managed consumer whose ``max_ack_pending`` (in
pull mode: the requests in flight, and the consumer's ``max_ack_pending`` with them) holds the source back across a
50 ms round trip is grown by its owner, within the source's byte budget, with a twin process beside it that never
touches the consumer; replication stays exact."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from bridge.testing.configs import ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import (
    Publisher,
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    replicate_exactly,
)
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import Topology
from chaos.proxy import proxy_to

pytestmark = pytest.mark.anyio

DELAY = 0.025  # each way: a 50 ms round trip
WINDOW = 100  # the configured max_ack_pending: 2,000 msg/s at most over this link
COUNT = 20_000


@pytest.mark.parametrize("mode", ["flow_control", "pull"])
async def test_the_owner_grows_the_window_over_a_far_link_and_the_twin_does_not(
    mode: str, topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    async with proxy_to(topology.leaf.url, "far-link") as proxy:
        proxy.set_delay(DELAY)
        spec = SourceSpec(name="edge1", servers=proxy.url, subject_prefix="edge.one", max_ack_pending=WINDOW)
        spec.extra.update({"mode": mode, "window_budget": "4MiB"})
        config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
        async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
            await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
            await create_aggregate(hub_nc)
            publisher = Publisher(leaf_nc, COUNT, payload=lambda i: bytes([97 + i % 26]) * 200)
            await publisher.run()  # a backlog, as after an outage: the window is all that paces it
            began = time.monotonic()
            twins = [bridge_procs(config), bridge_procs(config)]
            with anyio.fail_after(120):
                await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
            drained = time.monotonic() - began
            grown = [twin.events("source.window_grown") for twin in twins]
            owners = [i for i, events in enumerate(grown) if events]
            assert len(owners) == 1, grown  # the owner alone changes the consumer
            sizes = [int(e["max_ack_pending"]) for e in grown[owners[0]]]
            assert sizes == sorted(sizes) and sizes[0] > WINDOW, sizes
            rtts = [e["rtt_ms"] for e in grown[owners[0]]]
            print(f"{mode}: windows {[WINDOW, *sizes]} (round trips {rtts} ms); {COUNT} messages in {drained:.1f} s")
            assert all(float(e["rtt_ms"]) >= 2 * DELAY * 1000 for e in grown[owners[0]]), grown
            # the server's consumer carries the last size, within the budget (200 B + 512 of overhead a message)
            info = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
            assert info["config"]["max_ack_pending"] == sizes[-1] <= 4 * 1024 * 1024 // 712
            for twin in twins:
                assert twin.count("source.window_failed") == 0
                assert await twin.astop(30) == 0
