"""The bridge process dies (SIGKILL) or is stopped (SIGTERM) mid-stream and is started again.

The aggregate's duplicate window is 1 s and the restart waits it out, so the target's own dedupe cannot hide a
re-published copy: no duplicate must come from the bridge's recovery (the watermark read back from the aggregate's
provenance headers). WorkQueue origin: an ack deletes, so nothing acked may be missing from the aggregate. Every
scenario holds in both modes (marker ``pullmode``): against an origin older than 2.14 the bridge reads a pull consumer
and its explicit acks are audited instead of flow-control answers.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from nats.aio.client import Client

from bridge.testing.configs import AGGREGATE, ORIGIN, TEST_ENGINE, SourceSpec, write_config
from bridge.testing.jetstream import (
    Publisher,
    ack_floor,
    aggregate_count,
    assert_exact,
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    js_request,
    origin_seqs_by_source,
    stream_messages,
    tap_for_mode,
)
from bridge.testing.polling import settled, wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import Topology, mode_source_extra, ready_event

pytestmark = pytest.mark.pullmode

N = 5000
TAIL = 500
DUPLICATE_WINDOW = 1.0


@pytest.mark.anyio
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
async def test_restart_mid_stream_no_loss_no_duplicate(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str, signal_name: str
) -> None:
    spec = SourceSpec(
        name="edge1",
        servers=topology.leaf.url,
        subject_prefix="edge.one",
        max_ack_pending=2000,
        extra=mode_source_extra(origin_mode),
    )
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    grace = float(TEST_ENGINE["shutdown_grace"])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc, duplicate_window=DUPLICATE_WINDOW)
        tap = tap_for_mode(leaf_nc, hub_nc, {spec.consumer_name: "edge.one.>"}, mode=origin_mode)
        async with tap.running():
            # a backlog, so the bridge has a full publish window in flight when it is stopped
            backlog = Publisher(leaf_nc, N // 2)
            await backlog.run()
            first = bridge_procs(config)
            # the last TAIL messages are published after the stop: the successor always finds messages the first
            # process never saw (on a loaded machine a slow SIGTERM drain once replicated everything before it ended)
            publisher = Publisher(leaf_nc, N - N // 2 - TAIL, rate=2000)
            async with anyio.create_task_group() as tg:
                tg.start_soon(publisher.run)
                await wait_until(
                    lambda: _at_least(aggregate_count(hub_nc, "edge.one.>"), N // 5),
                    timeout=30,
                    what="a fifth of the copies",
                    interval=0.01,
                )
                stopped_at = time.monotonic()
                if signal_name == "SIGKILL":
                    assert await first.akill() == -9
                else:
                    code = await first.astop(grace + 5)
                    took = time.monotonic() - stopped_at
                    assert code == 0, f"exit code {code} after SIGTERM"
                    assert took <= grace + 2, f"SIGTERM took {took:.1f}s (shutdown_grace {grace:g}s)"
                    assert first.count("source.stopped") == 1
                    assert "Traceback" not in first.log_text()
                copies_at_stop = await aggregate_count(hub_nc, "edge.one.>")
                await publisher.done.wait()
                tail = Publisher(leaf_nc, TAIL)
                await tail.run()

                # the origin holds everything the aggregate does not (WorkQueue: acked = deleted)
                floor = ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))
                assert floor <= copies_at_stop, f"origin acked up to {floor}, aggregate holds {copies_at_stop}"

                # the target's dedupe window must not be what prevents duplicates after the restart
                remaining = stopped_at + DUPLICATE_WINDOW + 0.5 - time.monotonic()
                if remaining > 0:
                    await anyio.sleep(remaining)  # a time condition: the window is measured in time
                second = bridge_procs(config)
                await second.wait_event(ready_event(origin_mode), timeout=20)

            assert backlog.seqs + publisher.seqs + tail.seqs == list(range(1, N + 1))
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=60, what="origin messages", interval=0.1
            )
            assert await second.astop(grace + 5) == 0

        seqs = (await origin_seqs_by_source(hub_nc)).get("edge1", [])
        assert_exact(seqs, range(1, N + 1), "edge1 copies")
        assert tap.violations == []
        recovered = [e for e in second.events() if e.get("event") == "recovery.done"]
        assert recovered and recovered[0]["watermark"] > 0, recovered
        print(f"{signal_name}: {copies_at_stop} copies at stop, ack floor {floor}, recovery {recovered[0]}")


async def _at_least(value: object, expected: int) -> bool:
    return bool(await value >= expected)  # type: ignore[misc]


@pytest.mark.anyio
async def test_crash_with_a_hole_recovers_from_the_provenance_chain(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str
) -> None:
    """One message the aggregate refuses while the ones after it are stored: a hole. (The refusal must be one the
    bridge cannot foresee: a size or an uncaptured subject it checks before sending. Here the aggregate keeps one
    message per subject with per-subject DiscardNew, and the hole repeats an earlier message's subject.)
    SIGKILL, restart after the duplicate window: recovery must see the hole (Bridge-Prev chain), keep the
    origin acked only below it, not re-copy what is above it, and fill it once the aggregate accepts it."""
    n, hole = 600, 250
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
        window_ns = int(DUPLICATE_WINDOW * 1e9)
        await create_stream(
            hub_nc,
            AGGREGATE,
            ["edge.one.>"],
            allow_direct=True,
            duplicate_window=window_ns,
            max_msgs_per_subject=1,
            discard="new",
            discard_new_per_subject=True,
        )
        # every subject is new except the hole's, which message 1 already used
        await Publisher(leaf_nc, n, subject=lambda i: "orders.0" if i + 1 == hole else f"orders.{i}").run()

        first = bridge_procs(config)
        await first.wait_event("publish.blocked", timeout=30, origin_seq=hole)
        # the copies sent before the refusal came back are stored; while it blocks nothing new is sent, so the
        # count settles (how many got above the hole depends on how the deliveries were batched)
        stored = await settled(lambda: aggregate_count(hub_nc, "edge.one.>"), quiet=1.0, timeout=30)
        above = stored - (hole - 1)
        assert above >= 1, f"no copy above the hole ({stored} stored): nothing for recovery to find"
        copies = (await origin_seqs_by_source(hub_nc)).get("edge1", [])
        assert sorted(copies) == [*range(1, hole), *range(hole + 1, hole + 1 + above)]
        assert ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)) < hole
        assert await first.akill() == -9
        killed_at = time.monotonic()
        remaining = killed_at + DUPLICATE_WINDOW + 0.5 - time.monotonic()
        await anyio.sleep(max(0.0, remaining))  # a time condition: the target's dedupe window must have passed

        second = bridge_procs(config)
        await second.wait_event("recovery.done", timeout=20)
        recovered = next(e for e in second.events() if e.get("event") == "recovery.done")
        assert recovered["watermark"] == hole - 1, recovered
        assert recovered["present_above"] == above, recovered
        await second.wait_event("publish.blocked", timeout=10, origin_seq=hole)

        async def floor() -> int:
            return ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))

        await wait_for_value(floor, hole - 1, timeout=10, what="ack floor up to the hole")
        # the server may report the ack floor before it has removed every acked WorkQueue message (CI saw 47 of
        # them still there on 2.14.0): the count once it settles, which acking past the hole would take below this
        kept = await settled(lambda: stream_messages(leaf_nc, ORIGIN), quiet=1.0, timeout=30)
        assert kept == n - hole + 1, "the origin keeps the hole and after"

        await js_request(
            hub_nc,
            f"STREAM.UPDATE.{AGGREGATE}",
            {
                "name": AGGREGATE,
                "subjects": ["edge.one.>"],
                "allow_direct": True,
                "duplicate_window": window_ns,
                "storage": "file",
                "max_msgs_per_subject": -1,
                "discard": "new",
                "discard_new_per_subject": False,
            },
        )
        await wait_for_value(
            lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=30, what="origin messages", interval=0.1
        )
        assert await second.astop(15) == 0

        seqs = (await origin_seqs_by_source(hub_nc)).get("edge1", [])
        assert sorted(seqs) == list(range(1, n + 1)), f"missing or duplicated: {len(seqs)} copies for {n}"
        # origin order but for the hole, stored when the aggregate took it: after the copies that got above it
        # before the crash, and after whatever the second life had in flight when the refusal came back (how much
        # depends on how the deliveries were batched); everything else in origin order on both sides of it
        at = seqs.index(hole)
        before, after = seqs[:at], seqs[at + 1 :]
        assert before[: hole - 1 + above] == [*range(1, hole), *range(hole + 1, hole + 1 + above)], (at, above)
        assert before == sorted(before) and after == sorted(after), (at, above)


@pytest.mark.anyio
async def test_interest_origin_keeps_messages_while_the_bridge_is_away(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str
) -> None:
    """The bridge's durable (no inactive_threshold) keeps interest while no one is subscribed: an Interest origin
    retains what arrives while the bridge is stopped, and the restarted bridge replicates it."""
    n = 1000
    spec = SourceSpec(
        name="edge1",
        servers=topology.leaf.url,
        subject_prefix="edge.one",
        max_ack_pending=300,
        extra=mode_source_extra(origin_mode),
    )
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="interest")
        await create_aggregate(hub_nc)
        first = bridge_procs(config)
        await first.wait_event(ready_event(origin_mode), timeout=20)
        await Publisher(leaf_nc, n).run()
        await wait_for_value(lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=30, what="origin messages")
        assert await first.astop(15) == 0

        # nobody subscribed now: the messages must stay for the durable
        await Publisher(leaf_nc, n).run()
        if origin_mode == "pull":
            info = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
            consumer_config = info["config"]
            assert not consumer_config.get("deliver_subject"), consumer_config
            assert consumer_config["ack_policy"] == "explicit", consumer_config
            # A pull consumer has no push binding; the stopped bridge's counterpart is a pull request of it still
            # waiting. A server with leafnodes keeps serving a request whose client is gone for about 2 s (measured
            # on 2.10.26, 2.12.8 and 2.15.1; the deliveries go nowhere and are redelivered after ack_wait) and
            # then drops it.
            await wait_for_value(
                lambda: _num_waiting(leaf_nc, spec.consumer_name), 0, timeout=10, what="pull requests still waiting"
            )
        else:
            info = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
            assert not info.get("push_bound"), "the stopped bridge still looks subscribed"
        assert await stream_messages(leaf_nc, ORIGIN) == n

        second = bridge_procs(config)
        await wait_for_value(lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=30, what="origin messages")
        assert await second.astop(15) == 0
        assert_exact((await origin_seqs_by_source(hub_nc)).get("edge1", []), range(1, 2 * n + 1), "edge1 copies")


async def _num_waiting(nc: Client, consumer: str) -> int:
    return int((await consumer_info(nc, ORIGIN, consumer)).get("num_waiting", 0))
