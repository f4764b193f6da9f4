"""Subject transforms through the bridge (``sources[].subject_transforms``): several transforms on one source, two
sources mapped into one subject space (no prefix: restart recovery reads their copies by ``Bridge-Source``), the
owner SIGKILLed mid-stream with its twin taking over. Nothing lost, duplicated or reordered; every copy on the subject
the transform gives its origin subject (``Bridge-Subject``); a subject no ``src`` matches is neither delivered nor
acked (the srcs are the consumer's filters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.core.transforms import SubjectTransforms
from bridge.testing.configs import AGGREGATE, SourceSpec, write_config
from bridge.testing.jetstream import (
    Publisher,
    aggregate_count,
    assert_exact,
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    read_stream,
    seqs_by_source,
    stream_info,
    stream_messages,
)
from bridge.testing.polling import wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory, BridgeProcess, run_cli
from bridge.testing.servers import Topology, mode_source_extra, ready_event, server_release

pytestmark = pytest.mark.anyio

N = 1500  # per source
UNMATCHED = 10  # orders.<n>: two tokens, no src matches them
ORDERS = [
    # region and item swapped; a deeper bulk subject partitioned (the srcs are disjoint: a 2.10 origin refuses a
    # consumer whose filters overlap at all, err_code 10138)
    ("orders.*.*", "edge.sales.{{wildcard(2)}}.{{wildcard(1)}}"),
    ("orders.bulk.*.>", "edge.bulk.{{partition(3)}}.>"),
]
RETURNS = [("returns.*.*", "edge.sales.{{wildcard(2)}}.{{wildcard(1)}}")]  # the same subject space as orders


def order_subject(i: int) -> str:
    return f"orders.bulk.{i % 5}.x" if i % 4 == 0 else f"orders.{('eu', 'us', 'bulk')[i % 3]}.item{i % 11}"


@pytest.mark.pullmode
async def test_transformed_copies_from_two_sources_through_a_crash(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str, origin_server_bin: str
) -> None:
    specs = [
        SourceSpec(
            name=name,
            servers=topology.leaf.url,
            stream=stream,
            max_ack_pending=200,
            extra={**mode_source_extra(origin_mode), "subject_transforms": [{"src": s, "dest": d} for s, d in pairs]},
        )
        for name, stream, pairs in (("orders", "ORDERS", ORDERS), ("returns", "RETURNS", RETURNS))
    ]
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=specs)
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, "ORDERS", ["orders.>"], retention="workqueue")
        await create_stream(leaf_nc, "RETURNS", ["returns.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        unmatched = Publisher(leaf_nc, UNMATCHED, subject=lambda i: f"orders.{i}")
        await unmatched.run()
        orders = Publisher(leaf_nc, N, subject=order_subject, rate=600)
        returns = Publisher(leaf_nc, N, subject=lambda i: f"returns.{('eu', 'us')[i % 2]}.item{i % 7}", rate=600)
        twins = [bridge_procs(config), bridge_procs(config)]
        if server_release(origin_server_bin) < (2, 11, 0):
            # two srcs are two consumer filters, which a server before 2.11 can skip messages of: refused, named
            def refused() -> list[dict[str, Any]]:  # by whichever twin took the source
                return [e for t in twins for e in t.events("source.setup_failed", source="orders")]

            failed = (await wait_until(refused, timeout=30, what="the orders source refused"))[0]
            assert "on an origin before nats-server 2.11" in failed["error"], failed
            assert await stream_messages(leaf_nc, "ORDERS") == UNMATCHED  # nothing delivered, nothing acked
            return
        # the traffic once both are bound, so the crash falls in the middle of it
        await wait_until(lambda: _bound(twins), timeout=30, what="both sources bound", interval=0.05)
        async with anyio.create_task_group() as tg:
            tg.start_soon(orders.run)
            tg.start_soon(returns.run)
            await wait_until(
                lambda: _at_least(aggregate_count(hub_nc, "edge.>"), N // 2),
                timeout=30,
                what="a quarter of the copies",
                interval=0.01,
            )
            owner = next(t for t in twins if t.count("consumer.bound", source="orders"))
            assert await owner.akill() == -9
            survivor = next(t for t in twins if t is not owner)
            await survivor.wait_event(ready_event(origin_mode), timeout=30, source="orders")
        await wait_for_value(lambda: stream_messages(leaf_nc, "RETURNS"), 0, timeout=60, what="RETURNS emptied")
        # the ten unmatched ones stay: never delivered, never acked
        await wait_for_value(
            lambda: stream_messages(leaf_nc, "ORDERS"), UNMATCHED, timeout=60, what="ORDERS down to the unmatched"
        )
        assert await survivor.astop(30) == 0

        copies = await read_stream(hub_nc, AGGREGATE)
        by_source = seqs_by_source(copies)
        assert_exact(by_source.get("orders", []), orders.seqs, "orders copies")
        assert_exact(by_source.get("returns", []), returns.seqs, "returns copies")
        mapped = {"orders": SubjectTransforms(ORDERS), "returns": SubjectTransforms(RETURNS)}
        subjects = {"orders": orders.subjects, "returns": returns.subjects}
        for copy in copies:
            assert copy.source is not None and copy.origin_seq is not None
            origin_subject = subjects[copy.source][copy.origin_seq]
            assert copy.headers["Bridge-Subject"] == origin_subject
            assert copy.subject == mapped[copy.source].apply(origin_subject), copy
        # the srcs are the managed consumer's filters
        info = await consumer_info(leaf_nc, "ORDERS", specs[0].consumer_name)
        assert sorted(info["config"].get("filter_subjects") or []) == sorted(s for s, _ in ORDERS)
        by_subject = {name: {c.subject for c in copies if c.source == name} for name in ("orders", "returns")}
        assert by_subject["orders"] & by_subject["returns"]  # one subject space, two sources' copies on its subjects


def _bound(twins: list[BridgeProcess]) -> bool:
    return all(any(t.count("consumer.bound", source=s) for t in twins) for s in ("orders", "returns"))


async def _at_least(value: object, expected: int) -> bool:
    return bool(await value >= expected)  # type: ignore[misc]


async def test_setup_captures_the_transformed_subjects_and_check_says_where_copies_land(
    topology: Topology, tmp_path: Path
) -> None:
    spec = SourceSpec(
        name="orders",
        servers=topology.leaf.url,
        stream="ORDERS",
        extra={"subject_transforms": [{"src": s, "dest": d} for s, d in ORDERS]},
    )
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, "ORDERS", ["orders.>"], retention="workqueue")
        done = await anyio.to_thread.run_sync(lambda: run_cli("setup", "-c", str(config)))
        assert done.returncode == 0, done.stdout + done.stderr
        info = await stream_info(hub_nc, AGGREGATE)
        assert sorted(info["config"]["subjects"]) == ["edge.bulk.*.>", "edge.sales.*.*"]
        checked = await anyio.to_thread.run_sync(lambda: run_cli("check", "-c", str(config)))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert (
            "source orders: subject transforms orders.*.* -> edge.sales.{{wildcard(2)}}.{{wildcard(1)}}, "
            "orders.bulk.*.> -> edge.bulk.{{partition(3)}}.>; copies on edge.sales.*.*, edge.bulk.*.>"
        ) in checked.stdout, checked.stdout
