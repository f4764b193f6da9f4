"""The hub as people run it: three nodes routed into one cluster, the aggregate and the lease bucket replicated
(R3), the leaf linked through one remote that lists every node (``bridge.testing.servers.start_hub_cluster``).

Under traffic against a WorkQueue origin (an ack deletes: a message acked too early is lost for good), the hub's
nodes are killed and restarted the ways an operator's cluster sees them: the aggregate's stream leader killed
twice, a rolling restart of every node with twin bridge processes (the lease bucket's leader goes down on the way),
in both positions (the bridge beside the edge, and beside the hub reaching the origin through the leaf's domain).
Each ends with the aggregate holding every origin message exactly once, in order, and every bridge exiting 0.

What the bridge relies on, and these tests keep true: a publish whose ack was lost with a leader is sent again with
the same ``Nats-Msg-Id`` and the aggregate's duplicate window (the default 2 minutes, rebuilt by a new leader from
the stored messages) stores it once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import (
    Publisher,
    connect,
    create_aggregate,
    create_stream,
    new_leader,
    replicate_exactly,
    stream_leader,
)
from bridge.testing.polling import wait_until
from bridge.testing.processes import BridgeFactory, BridgeProcess, fleet_instance
from bridge.testing.servers import READY_EVENTS, HubCluster, NatsServer, start_hub_cluster

RATE = 1000
BUCKET = "KV_nats-bridge"  # the lease bucket's stream


@pytest.fixture
def cluster(
    nats_server_bin: str, origin_server_bin: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[HubCluster]:
    """Three hub nodes and a leaf (the origin binary), stopped at teardown; their logs' tails on a failure."""
    servers = start_hub_cluster(tmp_path / "servers", binary=nats_server_bin, leaf_binary=origin_server_bin)
    try:
        yield servers
    finally:
        servers.stop()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            for server in servers.servers:
                print(f"\n----- {server.name} log ({server.log_path}) -----\n{server.log_tail(40)}")


def fleet_config(cluster: HubCluster, tmp_path: Path, *, sidecar: bool) -> Path:
    """One source; the target and the lease bucket on the cluster (every node's URL), the bucket R3. In the
    sidecar position the source is reached through the hub too, by the leaf's domain."""
    if sidecar:
        spec = SourceSpec(name="edge1", servers="", domain="leaf", subject_prefix="edge.one")
        spec.extra["servers"] = cluster.hub_urls
    else:
        spec = SourceSpec(name="edge1", servers=cluster.leaf.url, subject_prefix="edge.one")
    return write_config(
        tmp_path / "bridge.toml", target_url=cluster.hub_urls, sources=[spec], coordination={"replicas": 3}
    )


async def restart(cluster: HubCluster, node: NatsServer, *, kill: bool) -> None:
    """Stop ``node`` (SIGKILL, or SIGTERM as a rolling restart does), start it again, and wait until every node is
    current and the leaf linked."""

    def bounce() -> None:
        if kill:
            node.kill()
        else:
            node.stop()
        node.start()
        node.wait_ready(20)
        cluster.wait_current(30)

    await anyio.to_thread.run_sync(bounce)


async def twins(config: Path, bridge_procs: BridgeFactory, leaf_nc: Client, hub_nc: Client) -> list[BridgeProcess]:
    """The WorkQueue origin, the aggregate R3, and two processes of ``config`` (``p0``, ``p1``), one owning edge1."""
    await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
    await create_aggregate(hub_nc, num_replicas=3)
    procs = [fleet_instance(bridge_procs, config, "p0"), fleet_instance(bridge_procs, config, "p1")]
    await owner(procs)
    return procs


async def exactly_replicated(procs: list[BridgeProcess], leaf_nc: Client, hub_nc: Client, publisher: Publisher) -> None:
    """Every origin message copied once, in order, then each process stopped by SIGTERM: exit 0."""
    await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
    for proc in procs:
        assert await proc.astop(30) == 0


def past(publisher: Publisher, count: int) -> Callable[[], bool]:
    return lambda: publisher.published > count


async def owner(procs: list[BridgeProcess]) -> BridgeProcess:
    async def found() -> BridgeProcess | None:
        for proc in procs:
            if proc.count(READY_EVENTS, source="edge1") > 0 and proc.is_running:
                return proc
        return None

    result: BridgeProcess = await wait_until(found, timeout=30, what="edge1's owner bound")
    return result


@pytest.mark.anyio
async def test_the_aggregates_leader_killed_twice_then_the_lease_buckets_with_twins(
    cluster: HubCluster, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """Edge position, two processes of one configuration: the aggregate's stream leader is SIGKILLed, a new one
    elected, the node restarted; twice; then the lease bucket's leader. Publishes in flight with a dead leader are
    retried with their ids and stored once; renewals that fail while the bucket elects a leader cost at most a
    hand-over to the twin."""
    config = fleet_config(cluster, tmp_path, sidecar=False)
    async with connect(cluster.leaf.url) as leaf_nc, connect(cluster.hub_urls) as hub_nc:
        procs = await twins(config, bridge_procs, leaf_nc, hub_nc)
        publisher = Publisher(leaf_nc, 12_000, rate=RATE)
        elections = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            for n, stream in enumerate((AGGREGATE, AGGREGATE, BUCKET), start=1):
                await wait_until(past(publisher, 3000 * n), timeout=60, what="traffic")
                leader = await stream_leader(hub_nc, stream)
                killed_at = time.monotonic()
                node = cluster.node(leader)
                node.kill()
                elected = await new_leader(hub_nc, stream, leader)
                elections.append((stream, leader, elected, round(time.monotonic() - killed_at, 2)))
                await restart(cluster, node, kill=True)
        await exactly_replicated(procs, leaf_nc, hub_nc, publisher)
    print(f"leader changes (stream, killed, elected, seconds): {elections}")


@pytest.mark.anyio
async def test_a_rolling_restart_of_every_node_with_twins_in_the_sidecar_position(
    cluster: HubCluster, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """Sidecar position, two processes of one configuration: every hub node is restarted in turn (SIGTERM, start,
    current again), the aggregate's and the lease bucket's leaders move with them; one process owns the source
    throughout or hands it over, and nothing is lost, duplicated or reordered."""
    config = fleet_config(cluster, tmp_path, sidecar=True)
    async with connect(cluster.leaf.url) as leaf_nc, connect(cluster.hub_urls) as hub_nc:
        procs = await twins(config, bridge_procs, leaf_nc, hub_nc)
        publisher = Publisher(leaf_nc, 8000, rate=RATE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            for n, node in enumerate(cluster.hubs, start=1):
                await wait_until(past(publisher, 1800 * n), timeout=60, what="traffic")
                await restart(cluster, node, kill=False)
        await exactly_replicated(procs, leaf_nc, hub_nc, publisher)
