"""Complete, ordered, duplicate-free replication from a leaf's origin stream into the hub's aggregate.

The bridge runs as a child process (``python -m bridge run``). Every origin retention policy is covered; one
variant runs in the sidecar position (connected to the hub only, the leaf's consumer reached through
``$JS.leaf.API`` with deliveries and acks crossing the leaf link). Every ack the bridge sends is audited against the
aggregate as it happens: flow-control answers (``FcTap``), or in pull mode (an origin older than 2.14, marker
``pullmode``) explicit acks (``AckTap``).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client

from bridge.io.jsapi import JsApi
from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.inprocess import running_bridge
from bridge.testing.jetstream import (
    Publisher,
    StoredMsg,
    ack_floor,
    aggregate_count,
    assert_exact,
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    default_payload,
    js_request,
    origin_seqs_by_source,
    read_stream,
    seqs_by_source,
    stream_messages,
    tap_for_mode,
)
from bridge.testing.polling import wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import PULL_TEST_ACK_WAIT, Topology, mode_source_extra, ready_event

# every scenario here holds in pull mode too: run them against an old origin (NATS_ORIGIN_SERVER_BIN)
pytestmark = pytest.mark.pullmode

N = 3000
STOP_GRACE = 15.0


def check_provenance(
    copies: list[StoredMsg],
    *,
    source: str,
    stream: str,
    prefix: str,
    origin_subjects: dict[int, str],
    time_window: tuple[int, int],
) -> None:
    """Every copy carries the provenance headers, the origin's payload and user header, under the prefix."""
    lo, hi = time_window
    for copy in copies:
        seq = copy.origin_seq
        assert seq is not None
        h = copy.headers
        where = f"aggregate seq {copy.seq} (origin {seq})"
        assert h.get("Nats-Msg-Id") == f"{source}:{stream}:{seq}", where
        assert h.get("Bridge-Source") == source, where
        assert h.get("Bridge-Stream") == stream, where
        assert h.get("Bridge-Prev") == str(seq - 1), f"{where}: contiguous run, Bridge-Prev {h.get('Bridge-Prev')}"
        origin_subject = origin_subjects[seq]
        assert h.get("Bridge-Subject") == origin_subject, where
        assert copy.subject == f"{prefix}.{origin_subject}", where
        index = int(h["Test-Index"])  # the user header, unchanged
        assert copy.data == default_payload(index), where
        stamp = int(h["Bridge-Time"])
        assert lo <= stamp <= hi, f"{where}: Bridge-Time {stamp} outside the publishing window {time_window}"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("retention", "position"),
    [
        pytest.param("workqueue", "leaf", id="workqueue-direct"),
        pytest.param("workqueue", "hub", id="workqueue-sidecar"),
        pytest.param("interest", "leaf", id="interest-direct"),
        pytest.param("limits", "leaf", id="limits-direct"),
    ],
)
async def test_replicates_completely_in_order(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str, retention: str, position: str
) -> None:
    hub, leaf = topology.hub, topology.leaf
    sidecar = position == "hub"
    spec = SourceSpec(
        name="edge1",
        servers=hub.url if sidecar else leaf.url,
        domain="leaf" if sidecar else None,
        subject_prefix="edge.one",
        max_ack_pending=500,
        extra=mode_source_extra(origin_mode),
    )
    config = write_config(tmp_path / "bridge.toml", target_url=hub.url, sources=[spec])
    async with connect(leaf.url) as leaf_nc, connect(hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention=retention, allow_direct=True)
        await create_aggregate(hub_nc)
        tap = tap_for_mode(leaf_nc, hub_nc, {spec.consumer_name: "edge.one.>"}, mode=origin_mode)
        async with tap.running():
            bridge = bridge_procs(config)
            # Interest retention keeps only what a consumer is interested in: publish once the bridge is bound.
            await bridge.wait_event(ready_event(origin_mode), timeout=20)
            started_ns = time.time_ns()
            publisher = Publisher(leaf_nc, N)
            await publisher.run()
            ended_ns = time.time_ns()
            assert publisher.seqs == list(range(1, N + 1))

            await wait_until(
                lambda: aggregate_count(hub_nc, "edge.one.>"), timeout=60, what="first copies", interval=0.1
            )
            await wait_for_value(
                lambda: aggregate_count(hub_nc, "edge.one.>"), N, timeout=60, what="copies", interval=0.1
            )
            if retention == "limits":
                await wait_for_value(
                    lambda: _floor(leaf_nc, spec.consumer_name), N, timeout=15, what="the consumer's ack floor"
                )
                assert await stream_messages(leaf_nc, ORIGIN) == N, "a Limits origin keeps everything"
            else:
                await wait_for_value(
                    lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=15, what=f"{retention} origin messages"
                )
                assert ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)) == N

            assert await bridge.astop(STOP_GRACE) == 0

        copies = await read_stream(hub_nc, AGGREGATE)
        assert len(copies) == N, "nothing but this source's copies in the aggregate"
        assert_exact(seqs_by_source(copies).get("edge1", []), range(1, N + 1), "edge1 copies")
        check_provenance(
            copies,
            source="edge1",
            stream=ORIGIN,
            prefix="edge.one",
            origin_subjects=publisher.subjects,
            time_window=(started_ns - 1_000_000_000, ended_ns + 1_000_000_000),
        )
        if retention == "limits":
            # the exact origin store time, and everything else, against the origin's own copy (read one message at
            # a time: batched Direct Get needs 2.11, and the origin may be 2.10 here)
            origin = {m.seq: m for m in await JsApi(leaf_nc).messages_between(ORIGIN, 0, N, [])}
            for copy in copies:
                seq = copy.origin_seq
                assert seq is not None
                original = origin[seq]
                assert int(copy.headers["Bridge-Time"]) == original.timestamp_ns
                assert copy.data == original.payload
                assert original.headers is not None and copy.headers["Test-Index"] == original.headers["Test-Index"]

        assert tap.violations == []
        assert tap.checked > 0 and tap.acking(spec.consumer_name), f"the bridge acked nothing ({origin_mode} mode)"
        assert "Traceback" not in bridge.log_text()


@pytest.mark.anyio
async def test_two_sources_into_one_aggregate(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str
) -> None:
    """Two origin streams on the leaf, two prefixes, one aggregate. Source b's consumer was created by an operator
    (``manage_consumer = false``, a plain non-pedantic create: the server forces flow control and the heartbeat; in
    pull mode a pull consumer with explicit acks, the kind the bridge accepts to bind)."""
    hub, leaf = topology.hub, topology.leaf
    n = 2000
    pull = origin_mode == "pull"
    specs = [
        SourceSpec(
            name="site-a",
            servers=leaf.url,
            stream="ORDERS_A",
            subject_prefix="edge.a",
            max_ack_pending=300,
            extra=mode_source_extra(origin_mode),
        ),
        SourceSpec(
            name="site-b",
            servers=leaf.url,
            stream="ORDERS_B",
            subject_prefix="edge.b",
            extra={"manage_consumer": False},
        ),
    ]
    config = write_config(tmp_path / "bridge.toml", target_url=hub.url, sources=specs)
    async with connect(leaf.url) as leaf_nc, connect(hub.url) as hub_nc:
        await create_stream(leaf_nc, "ORDERS_A", ["a.>"], retention="workqueue")
        await create_stream(leaf_nc, "ORDERS_B", ["b.>"], retention="workqueue")
        consumer_b: dict[str, object] = {
            "durable_name": specs[1].consumer_name,
            "deliver_subject": specs[1].deliver_subject,
            "ack_policy": "flow_control",
            "max_ack_pending": 250,
        }
        if pull:
            # an operator's pull consumer: no deliver subject; its ack wait is the operator's (the bridge's ack_wait
            # is for the consumers it manages), short for the same reason as there
            consumer_b = {
                "durable_name": specs[1].consumer_name,
                "ack_policy": "explicit",
                "ack_wait": PULL_TEST_ACK_WAIT * 1_000_000_000,
                "max_ack_pending": 250,
            }
        await js_request(
            leaf_nc,
            f"CONSUMER.DURABLE.CREATE.ORDERS_B.{specs[1].consumer_name}",
            {"stream_name": "ORDERS_B", "config": consumer_b},
        )
        await create_aggregate(hub_nc)
        tap = tap_for_mode(leaf_nc, hub_nc, {s.consumer_name: f"{s.subject_prefix}.>" for s in specs}, mode=origin_mode)
        async with tap.running():
            bridge = bridge_procs(config)
            await bridge.wait_event(ready_event(origin_mode), timeout=20, after=1)  # both sources bound
            started_ns = time.time_ns()
            pub_a = Publisher(leaf_nc, n, subject=lambda i: f"a.orders.{i % 5}")
            pub_b = Publisher(leaf_nc, n, subject=lambda i: f"b.orders.{i % 3}")
            async with anyio.create_task_group() as tg:
                tg.start_soon(pub_a.run)
                tg.start_soon(pub_b.run)
            ended_ns = time.time_ns()
            for spec, stream in ((specs[0], "ORDERS_A"), (specs[1], "ORDERS_B")):
                stored = functools.partial(aggregate_count, hub_nc, f"{spec.subject_prefix}.>")
                await wait_for_value(stored, n, timeout=60, what=f"copies of {spec.name}", interval=0.1)
                left = functools.partial(stream_messages, leaf_nc, stream)
                await wait_for_value(left, 0, timeout=15, what=f"{stream} messages")
            assert await bridge.astop(STOP_GRACE) == 0

        copies = await read_stream(hub_nc, AGGREGATE)
        assert len(copies) == 2 * n
        by_source = seqs_by_source(copies)
        assert set(by_source) == {"site-a", "site-b"}
        for spec, stream, pub in ((specs[0], "ORDERS_A", pub_a), (specs[1], "ORDERS_B", pub_b)):
            assert_exact(by_source[spec.name], range(1, n + 1), f"{spec.name} copies")
            assert spec.subject_prefix is not None
            check_provenance(
                [c for c in copies if c.source == spec.name],
                source=spec.name,
                stream=stream,
                prefix=spec.subject_prefix,
                origin_subjects=pub.subjects,
                time_window=(started_ns - 1_000_000_000, ended_ns + 1_000_000_000),
            )
        assert tap.violations == []
        assert tap.acking(specs[0].consumer_name) and tap.acking(specs[1].consumer_name)


async def _floor(nc: Client, consumer: str) -> int:
    return ack_floor(await consumer_info(nc, ORIGIN, consumer))


@pytest.mark.anyio
async def test_one_failed_publish_keeps_origin_order(topology: Topology, tmp_path: Path, origin_mode: str) -> None:
    n, failing = 300, 100
    spec = SourceSpec(
        name="edge1",
        servers=topology.leaf.url,
        subject_prefix="edge.one",
        max_ack_pending=1000,
        extra=mode_source_extra(origin_mode),
    )
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        # captures orders.<one token> only: message `failing` has two tokens and gets no responders, until fixed
        await create_stream(hub_nc, AGGREGATE, ["edge.one.orders.*"], allow_direct=True)
        await Publisher(leaf_nc, n, subject=lambda i: "orders.late.x" if i + 1 == failing else f"orders.{i}").run()
        async with running_bridge(config, tmp_path / "bridge.log") as bridge:
            engine = bridge.runners[0].engine
            await wait_until(lambda: engine.pipeline.blocked, timeout=10, what="the publish to fail")
            await js_request(
                hub_nc, f"STREAM.UPDATE.{AGGREGATE}", {"name": AGGREGATE, "subjects": ["edge.>"], "allow_direct": True}
            )
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=30, what="origin messages", interval=0.1
            )
        seqs = (await origin_seqs_by_source(hub_nc)).get("edge1", [])
        assert sorted(seqs) == list(range(1, n + 1)), "lost or duplicated"
        assert_exact(seqs, range(1, n + 1), "edge1 copies in aggregate order")


@pytest.mark.anyio
async def test_sources_with_backlogs_share_a_small_bound_on_publishes_in_flight(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str
) -> None:
    """``engine.publishes_in_flight`` bounds the publishes of every source together (after a reconnect storm every
    source has a backlog at once): with room for 8, three sources' backlogs of 1,000 wait their turn in the process
    and go out as acks free room, each source woken when it does (not only by the once-a-second beat, which at 8 a
    second would take minutes): everything replicated once, in order."""
    n, names = 1000, ("s1", "s2", "s3")
    specs = [
        SourceSpec(
            name=name,
            servers=topology.leaf.url,
            stream=f"O_{name}",
            subject_prefix=f"edge.{name}",
            extra=mode_source_extra(origin_mode),
        )
        for name in names
    ]
    config = write_config(
        tmp_path / "bridge.toml", target_url=topology.hub.url, sources=specs, engine={"publishes_in_flight": 8}
    )
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        for name in names:
            await create_stream(leaf_nc, f"O_{name}", [f"{name}.>"], retention="workqueue")
            await Publisher(leaf_nc, n, subject=functools.partial(orders_of, name)).run()
        await create_aggregate(hub_nc)
        bridge = bridge_procs(config)
        for spec in specs:
            stored = functools.partial(aggregate_count, hub_nc, f"{spec.subject_prefix}.>")
            await wait_for_value(stored, n, timeout=60, what=f"copies of {spec.name}", interval=0.1)
        assert await bridge.astop(STOP_GRACE) == 0
        by_source = seqs_by_source(await read_stream(hub_nc, AGGREGATE))
    for name in names:
        assert_exact(by_source[name], range(1, n + 1), f"{name} copies")


def orders_of(name: str, _index: int) -> str:
    return f"{name}.orders"
