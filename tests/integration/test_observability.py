"""Operability on real servers: /metrics, /healthz, /readyz, systemd notify, SIGHUP reload.

The bridge runs as a child process (``python -m bridge run``) with its HTTP listener on a free port, which it logs
(``http.listening``).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.http import http_get, http_port, metric, readyz
from bridge.testing.jetstream import (
    Publisher,
    assert_exact,
    connect,
    create_aggregate,
    create_stream,
    js_request,
    origin_seqs_by_source,
    stream_info,
)
from bridge.testing.polling import assert_holds, wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import READY_EVENTS, Topology


@pytest.mark.anyio
async def test_metrics_health_and_readiness_follow_the_origin(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        bridge = bridge_procs(config)
        port = await http_port(bridge)
        assert (await http_get(port, "/healthz"))[0] == 200
        await wait_until(lambda: _ready(port), timeout=30, what="/readyz 200")
        publisher = Publisher(leaf_nc, 500)
        await publisher.run()

        async def replicated() -> bool:
            return await metric(port, "nats_bridge_replicated_messages_total", source="edge1") == 500

        await wait_until(replicated, timeout=30, what="500 replicated in the metrics")
        assert_exact((await origin_seqs_by_source(hub_nc, AGGREGATE))["edge1"], publisher.seqs, "aggregate")
        assert await metric(port, "nats_bridge_stored_watermark", source="edge1") == publisher.seqs[-1]
        assert await metric(port, "nats_bridge_last_delivered_sequence", source="edge1") == publisher.seqs[-1]
        assert await metric(port, "nats_bridge_replication_latency_seconds_count", source="edge1") == 500
        assert await metric(port, "nats_bridge_target_connected") == 1
        # RESETs sent, by cause: none at start (a new consumer is at rest, taken as it stands)
        assert await metric(port, "nats_bridge_resets_total", source="edge1", cause="start") is None
        age = await metric(port, "nats_bridge_last_replicated_age_seconds", source="edge1")
        assert age is not None and age >= 0
        # the aggregate allows fast batches (create_aggregate): windows go out as batches, none was refused
        assert await metric(port, "nats_bridge_publish_batched", source="edge1") == 1
        assert await metric(port, "nats_bridge_publish_batches_total", source="edge1") is not None
        assert await metric(port, "nats_bridge_publish_batch_fallbacks_total", source="edge1") == 0
        status, body = await readyz(port)
        assert status == 200 and body["ready"] and body["sources"]["edge1"]["watermark"] == publisher.seqs[-1]
        assert body["sources"]["edge1"]["batched"] is True

        await anyio.to_thread.run_sync(topology.leaf.stop)

        async def not_ready() -> dict[str, Any] | None:
            status, body = await readyz(port)
            return body if status == 503 else None

        body = await wait_until(not_ready, timeout=30, what="/readyz 503 with the origin down")
        assert "origin not connected" in body["sources"]["edge1"]["reasons"]
        assert await metric(port, "nats_bridge_origin_connected", source="edge1") == 0
        assert (await http_get(port, "/healthz"))[0] == 200  # alive, just not ready
        await anyio.to_thread.run_sync(topology.leaf.start)
        await wait_until(lambda: _ready(port), timeout=60, what="/readyz 200 again")
        assert await bridge.astop(15) == 0


async def _ready(port: int) -> bool:
    return (await readyz(port))[0] == 200


@pytest.mark.anyio
async def test_systemd_notify_ready_watchdog_stopping(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    notify_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.setblocking(False)
    received: list[str] = []

    def drain() -> list[str]:
        while True:
            try:
                received.append(sock.recv(4096).decode())
            except BlockingIOError:
                return received

    try:
        async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
            await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
            await create_aggregate(hub_nc)
            env = {"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "400000"}  # a ping every 0.2 s
            bridge = bridge_procs(config, env)
            await wait_until(lambda: any("READY=1" in d for d in drain()), timeout=30, what="READY=1")
            await bridge.wait_event("bridge.ready", timeout=5)
            ready_at = next(i for i, d in enumerate(received) if "READY=1" in d)
            await wait_until(
                lambda: sum("WATCHDOG=1" in d for d in drain()[ready_at:]) >= 3, timeout=10, what="watchdog pings"
            )
            assert bridge.pid is not None
            os.kill(bridge.pid, signal.SIGTERM)
            await wait_until(lambda: any("STOPPING=1" in d for d in drain()), timeout=15, what="STOPPING=1")
            assert await bridge.astop(15) == 0
    finally:
        sock.close()


@pytest.mark.anyio
async def test_sighup_adds_removes_and_rejects_without_touching_unchanged_sources(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    a = SourceSpec(name="a", servers=topology.leaf.url, stream=ORIGIN, subject_prefix="edge.a")
    b = SourceSpec(name="b", servers=topology.leaf.url, stream="ORIGIN2", subject_prefix="edge.b")
    path = tmp_path / "bridge.toml"
    write_config(path, target_url=topology.hub.url, sources=[a])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_stream(leaf_nc, "ORIGIN2", ["more.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        bridge = bridge_procs(path)
        await bridge.wait_event("bridge.ready", timeout=30)
        # traffic on a keeps flowing through every reload
        pub_a = Publisher(leaf_nc, 3000, rate=300)
        pub_b = Publisher(leaf_nc, 300, subject=lambda i: f"more.{i % 4}")
        async with anyio.create_task_group() as tg:
            tg.start_soon(pub_a.run)
            write_config(path, target_url=topology.hub.url, sources=[a, b])
            bridge.signal(signal.SIGHUP)
            await bridge.wait_event("reload.applied", timeout=30)
            # the added source runs once this process has taken its lease (the only process: within a view)
            await bridge.wait_event(READY_EVENTS, timeout=30, source="b")
            await pub_b.run()
            path.write_text(path.read_text() + "\n[[sources]]\nname = 'bad name!'\n")
            bridge.signal(signal.SIGHUP)
            await bridge.wait_event("reload.rejected", timeout=30)
            (rejected,) = [e for e in bridge.events() if e.get("event") == "reload.rejected"]
            # the operator is told which key is wrong and why, not just that the file is bad
            assert any(p.startswith("sources[2].name:") and "'bad name!'" in p for p in rejected["problems"]), rejected
            write_config(path, target_url=topology.hub.url, sources=[a])  # b removed
            bridge.signal(signal.SIGHUP)
            await bridge.wait_event("reload.applied", timeout=30, after=1)

        async def all_copied() -> bool:
            seqs = await origin_seqs_by_source(hub_nc, AGGREGATE)
            return len(seqs.get("a", [])) >= len(pub_a.seqs) and len(seqs.get("b", [])) >= len(pub_b.seqs)

        await wait_until(all_copied, timeout=60, what="both sources replicated")
        seqs = await origin_seqs_by_source(hub_nc, AGGREGATE)
        assert_exact(seqs["a"], pub_a.seqs, "source a")
        assert_exact(seqs["b"], pub_b.seqs, "source b")
        assert bridge.count("consumer.bound", source="a") == 1, "the unchanged source was restarted"
        assert bridge.count("source.stopped", source="b") == 1
        assert bridge.is_running
        assert await bridge.astop(15) == 0


STALLED_AFTER = 2.0
CAPACITY = 100  # copies the aggregate takes before its DiscardNew limit refuses the rest


@pytest.mark.anyio
async def test_a_stalled_source_is_reported_once_and_its_recovery_too(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(
        tmp_path / "bridge.toml",
        target_url=topology.hub.url,
        sources=[spec],
        http_extra={"stalled_after": STALLED_AFTER},
    )
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc, max_msgs=CAPACITY, discard="new")
        bridge = bridge_procs(config)
        port = await http_port(bridge)
        await wait_until(lambda: _ready(port), timeout=30, what="/readyz 200")
        publisher = Publisher(leaf_nc, 3 * CAPACITY)
        await publisher.run()

        async def stalled() -> float | None:
            return await metric(port, "nats_bridge_source_stalled", source="edge1")

        await wait_for_value(stalled, 1.0, timeout=30, what="nats_bridge_source_stalled")
        status, body = await readyz(port)
        assert status == 503 and not body["ready"], body
        source = body["sources"]["edge1"]
        assert source["stalled"] is True and source["watermark"] == publisher.seqs[CAPACITY - 1], source
        assert any(r.startswith("stalled: no progress for") for r in source["reasons"]), source
        assert (await http_get(port, "/healthz"))[0] == 200  # stalled is unready, never unhealthy
        await bridge.wait_event("source.stalled", timeout=5, source="edge1")
        (event,) = [e for e in bridge.events() if e.get("event") == "source.stalled"]
        assert event["watermark"] == publisher.seqs[CAPACITY - 1], event
        assert event["seconds_without_progress"] >= STALLED_AFTER, event
        assert event["blocked"] and event["level"] == "warning", event

        # the refused publish is retried (at most every publish_retry_max = 1 s) all along: none of it is news
        def logged_once() -> None:
            assert bridge.count("source.stalled") == 1
            assert bridge.count("source.recovered") == 0

        assert await assert_holds(logged_once, duration=2.5, what="a single source.stalled") > 1

        aggregate = (await stream_info(hub_nc, AGGREGATE))["config"]
        await js_request(hub_nc, f"STREAM.UPDATE.{AGGREGATE}", {**aggregate, "max_msgs": -1})
        await wait_for_value(stalled, 0.0, timeout=30, what="nats_bridge_source_stalled")
        await wait_until(lambda: _ready(port), timeout=30, what="/readyz 200 after the stall")
        await bridge.wait_event("source.recovered", timeout=5, source="edge1")
        (event,) = [e for e in bridge.events() if e.get("event") == "source.recovered"]
        assert event["seconds_without_progress"] >= STALLED_AFTER, event

        async def all_copied() -> bool:
            seqs = await origin_seqs_by_source(hub_nc, AGGREGATE)
            return len(seqs.get("edge1", [])) >= len(publisher.seqs)

        await wait_until(all_copied, timeout=30, what="every message replicated after the stall")
        assert_exact((await origin_seqs_by_source(hub_nc, AGGREGATE))["edge1"], publisher.seqs, "aggregate")
        assert bridge.count("source.stalled") == 1 and bridge.count("source.recovered") == 1
        assert await bridge.astop(15) == 0
