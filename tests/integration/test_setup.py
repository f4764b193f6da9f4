"""``nats-bridge setup`` against a real hub and leaf, as an operator runs it: what it creates, what it only
reports, and that it never changes anything that exists, a running bridge's objects included."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import (
    ApiFailure,
    Publisher,
    aggregate_count,
    assert_exact,
    connect,
    consumer_exists,
    consumer_info,
    create_aggregate,
    create_stream,
    js_request,
    origin_seqs_by_source,
    stream_info,
)
from bridge.testing.polling import wait_for_value
from bridge.testing.processes import BridgeFactory, run_cli
from bridge.testing.servers import Topology

pytestmark = pytest.mark.integration

BUCKET_STREAM = "KV_nats-bridge"
NS = 1_000_000_000


async def setup_cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = await anyio.to_thread.run_sync(lambda: run_cli("setup", "-c", str(config), *args))
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


async def stream_exists(nc: Any, name: str, domain: str | None = None) -> bool:
    try:
        await stream_info(nc, name, domain=domain)
    except ApiFailure as exc:
        if exc.err_code == 10059:
            return False
        raise
    return True


async def snapshot(hub: Any, leaf: Any, consumers: list[tuple[str, str]]) -> dict[str, Any]:
    """What setup must never change: each object's configuration and creation time."""
    out: dict[str, Any] = {}
    for name in (AGGREGATE, BUCKET_STREAM):
        info = await stream_info(hub, name)
        out[name] = (info["config"], info["created"])
    for stream, consumer in consumers:
        info = await consumer_info(leaf, stream, consumer)
        out[f"{stream}/{consumer}"] = (info["config"], info["created"])
    return out


def lines_of(done: subprocess.CompletedProcess[str]) -> list[str]:
    return done.stdout.splitlines()


@pytest.mark.anyio
async def test_setup_creates_what_is_missing_once_and_dry_run_only_says_so(topology: Topology, tmp_path: Path) -> None:
    specs = [
        SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one"),
        # the sidecar position, without a prefix: the copies keep the origin's subjects, read from the origin
        SourceSpec(name="edge2", servers=topology.hub.url, domain="leaf", stream="ORDERS_B"),
    ]
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=specs)
    consumers = [(ORIGIN, specs[0].consumer_name), ("ORDERS_B", specs[1].consumer_name)]
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_stream(leaf_nc, "ORDERS_B", ["b.>"], retention="interest")

        dry = await setup_cli(config, "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert lines_of(dry) == [
            "would create aggregate stream AGG (subjects b.>, edge.one.>, allow_direct, allow_batched, duplicate "
            "window 2m0s, file, 1 replica)",
            "would create coordination bucket nats-bridge (stream KV_nats-bridge, lease ttl 3s, history 1, 1 replica)",
            "would create consumer ORDERS/nats-bridge-edge1 on edge1 (ack_policy flow_control, deliver "
            "nats-bridge.deliver.edge1, max_ack_pending 1000, deliver_policy all)",
            "would create consumer ORDERS_B/nats-bridge-edge2 on edge2 (ack_policy flow_control, deliver "
            "nats-bridge.deliver.edge2, max_ack_pending 1000, deliver_policy all)",
            "dry run: nothing changed",
        ]
        assert not await stream_exists(hub_nc, AGGREGATE)
        assert not await stream_exists(hub_nc, BUCKET_STREAM)
        for stream, consumer in consumers:
            assert not await consumer_exists(leaf_nc, stream, consumer)

        done = await setup_cli(config)
        assert done.returncode == 0, done.stdout + done.stderr
        assert lines_of(done) == [line.replace("would create", "created ") for line in lines_of(dry)[:-1]] + [
            "everything the bridge needs is in place"
        ]
        aggregate = (await stream_info(hub_nc, AGGREGATE))["config"]
        assert aggregate["subjects"] == ["b.>", "edge.one.>"]
        assert aggregate["allow_direct"] is True and aggregate["duplicate_window"] == 120 * NS
        assert (aggregate["retention"], aggregate["discard"], aggregate["storage"]) == ("limits", "old", "file")
        bucket = (await stream_info(hub_nc, BUCKET_STREAM))["config"]
        assert bucket["max_age"] == 3 * NS and bucket["max_msgs_per_subject"] == 1
        for stream, consumer in consumers:
            info = await consumer_info(leaf_nc, stream, consumer)
            assert info["config"]["ack_policy"] == "flow_control" and info["config"]["deliver_policy"] == "all"

        before = await snapshot(hub_nc, leaf_nc, consumers)
        again = await setup_cli(config)
        assert again.returncode == 0, again.stdout + again.stderr
        assert lines_of(again) == [
            "exists   aggregate stream AGG: ok",
            "exists   coordination bucket nats-bridge: ok",
            "exists   consumer ORDERS/nats-bridge-edge1 on edge1: ok",
            "exists   consumer ORDERS_B/nats-bridge-edge2 on edge2: ok",
            "everything the bridge needs is in place",
        ]
        assert await snapshot(hub_nc, leaf_nc, consumers) == before

        checked = await anyio.to_thread.run_sync(lambda: run_cli("check", "-c", str(config)))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "all checks passed" in checked.stdout


@pytest.mark.anyio
async def test_what_differs_is_reported_with_its_fix_and_left_as_it_is(topology: Topology, tmp_path: Path) -> None:
    specs = [
        SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one"),
        SourceSpec(name="edge2", servers=topology.leaf.url, subject_prefix="other.two"),
        # bound: the operator's consumer, looked up only
        SourceSpec(
            name="edge3",
            servers=topology.leaf.url,
            subject_prefix="edge.three",
            consumer="ops-edge3",
            extra={"manage_consumer": False},
        ),
    ]
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=specs)
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"])
        # captures edge.>, not other.two.>; no Direct Get; a 5 s duplicate window under a 5 s ack timeout
        await create_stream(hub_nc, AGGREGATE, ["edge.>"], allow_direct=False, duplicate_window=5 * NS)
        # a bucket someone else made: a 30 s TTL, five revisions per key
        await create_stream(
            hub_nc, BUCKET_STREAM, ["$KV.nats-bridge.>"], max_age=30 * NS, max_msgs_per_subject=5, allow_direct=True
        )
        aggregate_before = await stream_info(hub_nc, AGGREGATE)
        bucket_before = await stream_info(hub_nc, BUCKET_STREAM)

        done = await setup_cli(config)
        assert done.returncode == 1, done.stdout + done.stderr
        lines = lines_of(done)
        assert lines[:9] == [
            "differs  aggregate stream AGG: subjects [edge.>] do not capture source edge2's copies (other.two.>); its "
            "publishes would be refused: add other.two.> to the stream's subjects",
            "differs  aggregate stream AGG: allow_direct is false; the bridge reads copies back with Direct Get "
            "(restart recovery, the audit): set allow_direct = true",
            "differs  aggregate stream AGG: allow_batched is false; while the stream's leader moves (a hub node "
            "restarted or upgraded) a copy refused in the move can be stored after copies pipelined behind it, out of "
            "origin order: set allow_batched = true (nats stream edit; the bridge then publishes windows as fast "
            "batches)",
            "differs  aggregate stream AGG: duplicate window 5s is shorter than 2 x target.ack_timeout (10s); a "
            "publish retried after an ack timeout may be stored twice: set duplicate_window = 2m0s",
            "differs  coordination bucket nats-bridge: max_age is 30s, coordination.lease_ttl 3s; the bucket's wins (a "
            "crashed owner's sources move after 30s): set coordination.lease_ttl = 30, or delete the bucket while no "
            "bridge runs",
            "differs  coordination bucket nats-bridge: history (max_msgs_per_subject) is 5, the bridge's is 1; older "
            "lease revisions are kept for nothing: delete the bucket while no bridge runs, or leave it",
            "created  consumer ORDERS/nats-bridge-edge1 on edge1 (ack_policy flow_control, deliver "
            "nats-bridge.deliver.edge1, max_ack_pending 1000, deliver_policy all)",
            "created  consumer ORDERS/nats-bridge-edge2 on edge2 (ack_policy flow_control, deliver "
            "nats-bridge.deliver.edge2, max_ack_pending 1000, deliver_policy all)",
            "missing  consumer ORDERS/ops-edge3 on edge3: manage_consumer = false, so the operator creates it: a "
            "durable push consumer with ack_policy flow_control, flow_control true, idle_heartbeat 1s, "
            "deliver_subject nats-bridge.deliver.edge3, no inactive_threshold (or set manage_consumer = true and run "
            "setup again)",
        ]
        assert lines[9:] == ["some objects differ or could not be set up"]
        # nothing that existed changed, and the bound consumer was not created
        for name, before in ((AGGREGATE, aggregate_before), (BUCKET_STREAM, bucket_before)):
            after = await stream_info(hub_nc, name)
            assert (after["config"], after["created"]) == (before["config"], before["created"])
        assert not await consumer_exists(leaf_nc, ORIGIN, "ops-edge3")

        # the operator creates the bound consumer unfit (explicit acks): named, not touched
        unfit = {
            "durable_name": "ops-edge3",
            "deliver_subject": "nats-bridge.deliver.edge3",
            "ack_policy": "explicit",
            "deliver_policy": "all",
        }
        await js_request(
            leaf_nc, f"CONSUMER.CREATE.{ORIGIN}.ops-edge3", {"stream_name": ORIGIN, "config": unfit}, timeout=5
        )
        again = await setup_cli(config, "--dry-run")
        assert again.returncode == 1
        edge3 = [line for line in lines_of(again) if "on edge3" in line]
        assert len(edge3) == 2, edge3
        assert edge3[0].startswith("differs  consumer ORDERS/ops-edge3 on edge3: ack_policy is 'explicit'; ")
        assert edge3[1] == "differs  consumer ORDERS/ops-edge3 on edge3: flow_control is off"
        assert (await consumer_info(leaf_nc, ORIGIN, "ops-edge3"))["config"]["ack_policy"] == "explicit"


@pytest.mark.anyio
async def test_twin_setups_at_once_both_succeed_and_create_each_object_once(topology: Topology, tmp_path: Path) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        results: list[subprocess.CompletedProcess[str]] = []

        async def one() -> None:
            results.append(await setup_cli(config))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
        for done in results:
            assert done.returncode == 0, done.stdout + done.stderr
            assert all(line.split()[0] in ("created", "exists") for line in lines_of(done)[:-1]), done.stdout
        assert (await stream_info(hub_nc, AGGREGATE))["config"]["allow_direct"] is True
        assert await consumer_exists(leaf_nc, ORIGIN, spec.consumer_name)


@pytest.mark.anyio
async def test_setup_beside_a_running_bridge_changes_nothing_and_replication_goes_on(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    consumers = [(ORIGIN, spec.consumer_name)]
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        bridge = bridge_procs(config)
        await bridge.wait_event("bridge.ready", timeout=30)
        first = Publisher(leaf_nc, 200)
        await first.run()
        await wait_for_value(lambda: aggregate_count(hub_nc, "edge.one.>"), 200, timeout=30, what="copies")
        before = await snapshot(hub_nc, leaf_nc, consumers)

        # setup while the bridge replicates a paced stream of messages
        second = Publisher(leaf_nc, 300, rate=300)
        async with anyio.create_task_group() as tg:
            tg.start_soon(second.run)
            done = await setup_cli(config)
        assert done.returncode == 0, done.stdout + done.stderr
        assert lines_of(done) == [
            "exists   aggregate stream AGG: ok",
            "exists   coordination bucket nats-bridge: ok",
            "exists   consumer ORDERS/nats-bridge-edge1 on edge1: ok",
            "everything the bridge needs is in place",
        ]
        assert await snapshot(hub_nc, leaf_nc, consumers) == before

        expected = first.seqs + second.seqs
        await wait_for_value(lambda: aggregate_count(hub_nc, "edge.one.>"), len(expected), timeout=30, what="copies")
        assert_exact((await origin_seqs_by_source(hub_nc, AGGREGATE))["edge1"], expected, "aggregate")
        assert bridge.count("lease.lost") == 0 and bridge.count("source.fenced") == 0
        assert await bridge.astop(15) == 0
