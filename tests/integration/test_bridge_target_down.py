"""The origin is never acked past what the aggregate holds: aggregate stream missing, hub down.

WorkQueue origin: an ack deletes, so anything acked but not stored would be gone for good. The origin's own state
(message count, the consumer's ack floor) is the judge, together with the audit of every ack on the wire: the
flow-control answers (``FcTap``), or in pull mode (an origin older than 2.14, marker ``pullmode``) the explicit acks
(``AckTap``).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from bridge.core.frames import Frame
from bridge.core.targetwire import AckOutcome
from bridge.io.target import SourcePublisher
from bridge.testing.configs import AGGREGATE, ORIGIN, TEST_ENGINE, SourceSpec, write_config
from bridge.testing.inprocess import running_bridge
from bridge.testing.jetstream import (
    FcTap,
    Publisher,
    ack_floor,
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
    stream_messages,
    tap_for_mode,
)
from bridge.testing.polling import assert_holds, wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import Topology, mode_source_extra, ready_event

pytestmark = pytest.mark.pullmode

MAX_ACK_PENDING = 500
OBSERVE = 4.0  # > 2 idle-heartbeat periods of a stalled consumer: at least two FC requests are issued in it


def source(topology: Topology, mode: str, *, sidecar: bool = False) -> SourceSpec:
    """Connected to the leaf, or (sidecar) to the hub, reaching the leaf's consumer through its domain."""
    return SourceSpec(
        name="edge1",
        servers=topology.hub.url if sidecar else topology.leaf.url,
        domain="leaf" if sidecar else None,
        subject_prefix="edge.one",
        max_ack_pending=MAX_ACK_PENDING,
        extra=mode_source_extra(mode),
    )


@pytest.mark.anyio
@pytest.mark.parametrize("when", ["deleted-while-bound", "missing-at-start"])
async def test_aggregate_missing_acks_nothing(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str, when: str
) -> None:
    n = 1500
    spec = source(topology, origin_mode)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        tap = tap_for_mode(leaf_nc, hub_nc, {spec.consumer_name: "edge.one.>"}, mode=origin_mode)
        async with tap.running():
            if when == "deleted-while-bound":
                await create_aggregate(hub_nc)
                bridge = bridge_procs(config)
                await bridge.wait_event(ready_event(origin_mode), timeout=20)
                await js_request(hub_nc, f"STREAM.DELETE.{AGGREGATE}")
            else:
                bridge = bridge_procs(config)
                await wait_until(
                    lambda: consumer_exists(leaf_nc, ORIGIN, spec.consumer_name), timeout=20, what="the consumer"
                )
                # checked before any source starts: the operator is told the command that creates the aggregate
                (missing,) = bridge.events("target.stream_unavailable")
                assert f"nats-bridge setup -c {shlex.quote(str(config))}" in missing["hint"], missing

            publisher = Publisher(leaf_nc, n)
            await publisher.run()
            assert await stream_messages(leaf_nc, ORIGIN) == n

            if when == "deleted-while-bound":
                # the bridge is subscribed: the consumer fills its window and stalls on max_ack_pending
                info = await wait_until(
                    lambda: _window_full(leaf_nc, spec.consumer_name, origin_mode),
                    timeout=15,
                    what=f"{MAX_ACK_PENDING} deliveries all pending",
                )
                assert ack_floor(info) == 0
            answers_before = len(tap.answers) if isinstance(tap, FcTap) else 0

            async def origin_untouched() -> None:
                info = await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)
                assert ack_floor(info) == 0, f"ack floor moved with no aggregate: {info['ack_floor']}"
                assert await stream_messages(leaf_nc, ORIGIN) == n
                assert tap.violations == []
                assert not tap.acking(), f"an ack went out with no aggregate: {tap.acking()}"

            await assert_holds(origin_untouched, duration=OBSERVE, what="no ack while the aggregate is missing")
            if when == "deleted-while-bound" and isinstance(tap, FcTap):
                # the stalled FC requests were answered (empty: releasing the window, acking nothing). Pull mode
                # has no such requests: what it must not do, ack, is checked above.
                assert len(tap.answers) - answers_before >= 1, "no FC request answered while stalled"
                assert all(a.last_stream in (None, 0) for a in tap.answers)

            created = time.monotonic()
            await create_aggregate(hub_nc)
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=60, what="origin messages", interval=0.1
            )
            catch_up = time.monotonic() - created
            assert await bridge.astop(15) == 0

        assert_exact((await origin_seqs_by_source(hub_nc)).get("edge1", []), range(1, n + 1), "edge1 copies")
        assert await aggregate_count(hub_nc, ">") == n
        assert tap.violations == []
        print(f"caught up {catch_up:.1f}s after the aggregate was created ({when})")


async def _window_full(nc: Client, consumer: str, mode: str) -> dict[str, Any] | None:
    info = await consumer_info(nc, ORIGIN, consumer)
    delivered = int(info["delivered"]["consumer_seq"])
    pending = int(info["num_ack_pending"])
    if mode == "pull":
        # max_ack_pending deliveries all unacked; the delivery count is no measure here, since the server
        # redelivers on a pull request still open once ack_wait passes (a redelivery stays one pending message)
        return info if pending == MAX_ACK_PENDING else None
    if delivered == MAX_ACK_PENDING and pending == delivered:
        return info
    return None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("how", "position"),
    [
        pytest.param("stop", "leaf", id="stop-direct"),
        pytest.param("kill", "leaf", id="kill-direct"),
        pytest.param("stop", "hub", id="stop-sidecar"),
        pytest.param("kill", "hub", id="kill-sidecar"),
    ],
)
async def test_hub_down_mid_stream(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str, how: str, position: str
) -> None:
    """The hub (aggregate and leaf link; in the sidecar position also the origin connection) goes away
    mid-stream and comes back on the same store."""
    n = 3000
    hub = topology.hub
    spec = source(topology, origin_mode, sidecar=position == "hub")
    config = write_config(tmp_path / "bridge.toml", target_url=hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        tap = tap_for_mode(leaf_nc, hub_nc, {spec.consumer_name: "edge.one.>"}, mode=origin_mode)
        async with tap.running():
            bridge = bridge_procs(config)
            await bridge.wait_event(ready_event(origin_mode), timeout=20)
            publisher = Publisher(leaf_nc, n, rate=1500)
            async with anyio.create_task_group() as tg:
                tg.start_soon(publisher.run)
                await wait_until(
                    lambda: _at_least(aggregate_count(hub_nc, "edge.one.>"), n // 4),
                    timeout=30,
                    what="a quarter of the copies",
                    interval=0.02,
                )
                floor_at_stop = ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))
                if how == "stop":
                    await anyio.to_thread.run_sync(hub.stop)
                else:
                    await anyio.to_thread.run_sync(hub.kill)

                floors: list[int] = []

                async def origin_keeps_unacked() -> None:
                    # WorkQueue: exactly what is acked is gone (floors read around the stream's state)
                    before = ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))
                    state = (await stream_info(leaf_nc, ORIGIN))["state"]
                    after = ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))
                    floors.append(after)
                    last, messages = int(state["last_seq"]), int(state["messages"])
                    if origin_mode == "pull":
                        # Explicit acks delete one message each, so acked messages above the floor are gone too
                        # (a resync's fetched messages are acked only when redelivered, after ack_wait, which
                        # holds the floor below acks above it): only the floor's half holds. That nothing is gone
                        # unstored is the AckTap's audit of each ack.
                        assert messages <= last - before, (before, after, state)
                    else:
                        # nothing unacked is gone (the server deletes what an answer acks a moment after it moves
                        # the floor: on a loaded machine a read can fall in between, so that half is checked once
                        # the state has settled, below)
                        assert last - after <= messages, (before, after, state)

                await assert_holds(origin_keeps_unacked, duration=3.0, what="origin state while the hub is down")

                async def acked_are_gone() -> bool:
                    floor = ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name))
                    state = (await stream_info(leaf_nc, ORIGIN))["state"]
                    return int(state["messages"]) <= int(state["last_seq"]) - floor

                if origin_mode != "pull":
                    await wait_until(acked_are_gone, timeout=10, what="the messages acked while the hub was down gone")

                hub.start()
                await anyio.to_thread.run_sync(hub.wait_ready, 10.0)
                await anyio.to_thread.run_sync(topology.wait_linked, 10.0)
                stored_after_restart = await aggregate_count(hub_nc, "edge.one.>")
                # every position the origin acked while the hub was down was on the hub's disk
                assert max(floors) <= stored_after_restart, (floors[-5:], stored_after_restart)
                assert floor_at_stop <= stored_after_restart
            assert publisher.seqs == list(range(1, n + 1))
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=60, what="origin messages", interval=0.1
            )
            assert await bridge.astop(15) == 0

        assert_exact((await origin_seqs_by_source(hub_nc)).get("edge1", []), range(1, n + 1), "edge1 copies")
        assert tap.violations == []
        assert bridge.count("target.reconnected") >= 1


async def _at_least(value: Any, expected: int) -> bool:
    return bool(await value >= expected)


@pytest.mark.anyio
async def test_sigterm_while_aggregate_missing(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str
) -> None:
    """Stopping a bridge whose publishes are all failing: exit 0 within the grace period, nothing acked."""
    n = 800
    spec = source(topology, origin_mode)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    grace = float(TEST_ENGINE["shutdown_grace"])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        tap = tap_for_mode(leaf_nc, hub_nc, {spec.consumer_name: "edge.one.>"}, mode=origin_mode)
        async with tap.running():
            bridge = bridge_procs(config)
            await bridge.wait_event(ready_event(origin_mode), timeout=20)
            await js_request(hub_nc, f"STREAM.DELETE.{AGGREGATE}")
            await Publisher(leaf_nc, n).run()
            await wait_until(
                lambda: _window_full(leaf_nc, spec.consumer_name, origin_mode),
                timeout=15,
                what="deliveries all pending",
            )
            await bridge.wait_event("publish.blocked", timeout=10)
            started = time.monotonic()
            code = await bridge.astop(grace + 5)
            took = time.monotonic() - started
            assert code == 0
            assert took <= grace + 2, f"SIGTERM took {took:.1f}s (shutdown_grace {grace:g}s)"
        assert ack_floor(await consumer_info(leaf_nc, ORIGIN, spec.consumer_name)) == 0
        assert await stream_messages(leaf_nc, ORIGIN) == n
        assert tap.violations == [] and not tap.acking()
        assert "Traceback" not in bridge.log_text()


@pytest.mark.anyio
async def test_hub_outage_longer_than_duplicate_window_does_not_duplicate(
    topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, origin_mode: str
) -> None:
    """The hub stops while publishes are stored but not yet acknowledged (their PubAcks die with the connection;
    here they are withheld for a few milliseconds before the stop, to make that certain), and comes back after
    the aggregate's duplicate window has passed."""
    n = 3000
    window = 1.0
    hub = topology.hub
    # acks are withheld from the 50th reply on, decided where they arrive: a test that waited to see copies stored
    # first could find the whole backlog stored by then on a fast machine, with nothing left in flight to withhold
    # (a fast batch's flow ack covers up to 16 copies: 50 replies are at most 800 of the 3,000)
    state = {"routed": 0, "released": False}
    withheld: list[str] = []
    original = SourcePublisher._outcomes

    def outcomes(self: SourcePublisher, frames: Sequence[Frame]) -> list[AckOutcome]:
        passed = []
        for frame in frames:
            if not state["released"] and state["routed"] >= 50:
                withheld.append(frame[0].decode())  # this ack "died with the connection"
                continue
            state["routed"] += 1
            passed.append(frame)
        return original(self, passed)

    monkeypatch.setattr(SourcePublisher, "_outcomes", outcomes)
    spec = source(topology, origin_mode)
    config = write_config(tmp_path / "bridge.toml", target_url=hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc, duplicate_window=window)
        await Publisher(leaf_nc, n).run()
        async with running_bridge(config, tmp_path / "bridge.log"):
            await wait_until(lambda: len(withheld) >= 20, timeout=10, what="stored publishes awaiting their acks")
            await anyio.to_thread.run_sync(hub.stop)
            stopped = time.monotonic()
            state["released"] = True  # acks after the reconnect are delivered again
            await anyio.sleep(max(0.0, stopped + window + 0.5 - time.monotonic()))  # outlive the dedupe window
            hub.start()
            await anyio.to_thread.run_sync(hub.wait_ready, 10.0)
            await anyio.to_thread.run_sync(topology.wait_linked, 10.0)
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=60, what="origin messages", interval=0.1
            )
        seqs = (await origin_seqs_by_source(hub_nc)).get("edge1", [])
        assert sorted(set(seqs)) == list(range(1, n + 1)), "lost"
        assert_exact(seqs, range(1, n + 1), "edge1 copies")
