"""A thin link between the bridge and its origin: 50 kbit/s (a throttling proxy, ``chaos.proxy.FaultProxy.set_rate``),
the source's ``rate_limit`` below it, steady traffic, and the link cut once in the middle.

What must hold (issue 29): nothing lost, duplicated or reordered; no reconnect loop (one reconnect, for the cut); no
reset storm; no stall alarm while progress is steady. What an idle source costs on such a link (heartbeats and
flow control, both ways) is measured and printed, not asserted: README's *Links* quotes it.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from bridge.testing.configs import ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import Publisher, connect, create_aggregate, create_stream, replicate_exactly
from bridge.testing.polling import wait_until
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import Topology
from chaos.proxy import proxy_to

LINK = 50_000 / 8  # bytes per second: 50 kbit/s
COUNT = 80
SIZE = 300
RATE = 8  # messages per second: 2.4 KB/s of payload, under the link and the source's limit
IDLE = 10.0  # seconds of an idle source whose bytes on the link are counted


@pytest.mark.anyio
async def test_a_50_kbit_link_with_a_cut_replicates_exactly_without_resets_or_stall_alarms(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    async with proxy_to(topology.leaf.url, "thin-link") as proxy:
        proxy.set_rate(LINK)
        spec = SourceSpec(name="edge1", servers=proxy.url, subject_prefix="edge.one")
        spec.extra.update({"rate_limit": "4KiB", "mode": "flow_control"})
        config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
        async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
            await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue", max_msg_size=4096)
            await create_aggregate(hub_nc)
            bridge = bridge_procs(config)
            await bridge.wait_event("bridge.ready", timeout=60)
            publisher = Publisher(leaf_nc, COUNT, payload=lambda i: bytes([97 + i % 26]) * SIZE, rate=RATE)
            async with anyio.create_task_group() as tg:
                tg.start_soon(publisher.run)
                await wait_until(lambda: len(publisher.seqs) >= COUNT // 2, timeout=60, what="half the traffic")
                assert proxy.cut() >= 1
            with anyio.fail_after(120):
                await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
            # an idle source on the link: heartbeats (one a second) and flow control, both ways
            before, began = proxy.stats.bytes_up + proxy.stats.bytes_down, time.monotonic()
            await anyio.sleep(IDLE)  # the measurement's window, not a wait for a condition
            idle = (proxy.stats.bytes_up + proxy.stats.bytes_down - before) / (time.monotonic() - began)
            print(f"idle source on the link: {idle:.0f} B/s, {idle * 86400 / 2**20:.1f} MiB a day (both ways)")
            resets = [e for e in bridge.events("reset.requested") if e.get("cause") != "start"]
            assert len(resets) <= 2, f"a reset storm on a thin link: {resets}"
            assert bridge.count("source.stalled") == 0, "a stall alarm while progress was steady"
            assert bridge.count("origin.reconnected") <= 1, "a reconnect loop"
            assert await bridge.astop(30) == 0
