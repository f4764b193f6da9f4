"""One owner per source, on real servers: twins of one configuration share sources through leases in the hub's KV.

Every scenario runs under traffic against a WorkQueue origin (an ack deletes) with the aggregate's duplicate window
at 1 s, so neither a lost message nor a copy stored twice can hide: at the end each source's copies are exactly
its origin sequences, once each, in order, and the origin is empty. Processes get readable instance ids
(``p0``, ``p1``, ...) through ``NATS_BRIDGE_COORDINATION__INSTANCE_ID``; the lease TTL is the tests' 3 s.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from bridge.observe.metrics import LeaseSnapshot
from bridge.runtime.app import Bridge
from bridge.testing.configs import ORIGIN, TEST_COORDINATION, SourceSpec, write_config
from bridge.testing.http import http_port, readyz, standby_ready
from bridge.testing.inprocess import running_bridge
from bridge.testing.jetstream import (
    Publisher,
    connect,
    create_aggregate,
    create_stream,
    replicate_exactly,
)
from bridge.testing.polling import wait_until
from bridge.testing.processes import INSTANCE_ID_ENV, BridgeFactory, BridgeProcess, fleet_instance, run_cli
from bridge.testing.servers import READY_EVENTS, Topology

TTL = float(TEST_COORDINATION["lease_ttl"])
RATE = 2000
DUPLICATE_WINDOW = 1.0


def only_lease(bridge: Bridge) -> LeaseSnapshot:
    """The one lease of an in-process bridge with one source, as its fleet sees it now."""
    assert bridge.fleet is not None
    snapshot = bridge.fleet.snapshot()
    assert snapshot is not None
    (row,) = snapshot.leases
    return row


async def owns(proc: BridgeProcess, source: str) -> bool:
    """What the process's /readyz says: it owns ``source`` (its runner replicates it)."""
    _, body = await readyz(await http_port(proc))
    return source in body.get("fleet", {}).get("owned", [])


async def owner_and_standby(bridge_procs: BridgeFactory, config: Path) -> tuple[BridgeProcess, BridgeProcess]:
    """p0 replicating the one source, then p1 started and ready as its standby."""
    owner = fleet_instance(bridge_procs, config, "p0")
    await owner.wait_event(READY_EVENTS, timeout=20)
    standby = fleet_instance(bridge_procs, config, "p1")
    await wait_until(lambda: standby_ready(standby, "edge1"), timeout=20, what="p1 ready as standby")
    return owner, standby


async def one_source(
    topology: Topology, tmp_path: Path, coordination: dict[str, object] | None = None
) -> tuple[Path, Callable[[], Awaitable[None]]]:
    config = write_config(
        tmp_path / "bridge.toml",
        target_url=topology.hub.url,
        sources=[SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")],
        coordination=coordination,
    )

    async def prepare() -> None:
        async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
            await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
            await create_aggregate(hub_nc, duplicate_window=DUPLICATE_WINDOW)

    return config, prepare


@pytest.mark.anyio
async def test_rolling_update_twice_under_traffic(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """The orchestrator's way: the new process starts, becomes ready (as a standby), then the old one gets SIGTERM
    and hands over. Twice. The standby never touches the source while the owner has it."""
    config, prepare = await one_source(topology, tmp_path)
    await prepare()
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        old = fleet_instance(bridge_procs, config, "p0")
        await old.wait_event(READY_EVENTS, timeout=20)
        publisher = Publisher(leaf_nc, 16_000, rate=RATE)
        handovers = []

        def published_past(count: int) -> Callable[[], bool]:
            return lambda: publisher.published > count

        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            for n in (1, 2):
                await wait_until(published_past(2000 * n), timeout=30, what="traffic")
                new = fleet_instance(bridge_procs, config, f"p{n}")
                ready = functools.partial(standby_ready, new, "edge1")
                await wait_until(ready, timeout=20, what=f"p{n} ready as standby")
                assert new.events(READY_EVENTS) == [], "a standby bound the consumer"
                stopped_at = time.monotonic()
                assert await old.astop(20) == 0
                await new.wait_event(READY_EVENTS, timeout=20)
                handovers.append(time.monotonic() - stopped_at)
                assert old.events("lease.released", source="edge1"), "the old owner did not release its lease"
                old = new
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        assert await old.astop(20) == 0
    print(f"handover (SIGTERM to the successor's first reset): {[round(h, 2) for h in handovers]} s")


@pytest.mark.anyio
async def test_owner_killed_the_standby_takes_over_within_the_ttl(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    config, prepare = await one_source(topology, tmp_path)
    await prepare()
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        first, second = await owner_and_standby(bridge_procs, config)
        publisher = Publisher(leaf_nc, 12_000, rate=RATE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await wait_until(lambda: publisher.published > 4000, timeout=30, what="traffic")
            killed_at = time.monotonic()
            assert await first.akill() == -9
            await second.wait_event(READY_EVENTS, timeout=TTL + 10)
            took = time.monotonic() - killed_at
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        # the operator's view, read from the bucket: who owns it now, on which host, since when
        status = await anyio.to_thread.run_sync(run_cli, "status", "-c", str(config), "--json")
        (row,) = json.loads(status.stdout)["sources"]
        assert row["owner"]["instance"] == "p1" and row["owner"]["host"] and row["owner"]["since"], row
        assert await second.astop(20) == 0
    assert took < TTL + 5, f"fail-over took {took:.1f}s with a {TTL:g}s lease"
    print(f"fail-over after SIGKILL: {took:.2f} s (lease ttl {TTL:g} s)")


@pytest.mark.anyio
async def test_owner_paused_past_its_lease_acts_on_nothing_when_it_wakes(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """SIGSTOP for twice the TTL while deliveries and flow-control requests pile up in its socket: the standby takes
    over; the woken process finds its fence closed before publishing or answering anything it had buffered
    (any stale publish would be a duplicate the 1 s window cannot hide), and stays on as a ready standby."""
    config, prepare = await one_source(topology, tmp_path)
    await prepare()
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        first, second = await owner_and_standby(bridge_procs, config)
        port = await http_port(first)
        publisher = Publisher(leaf_nc, 12_000, rate=RATE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await wait_until(lambda: publisher.published > 3000, timeout=30, what="traffic")
            first.pause()
            await second.wait_event(READY_EVENTS, timeout=TTL + 10)
            await anyio.sleep(2 * TTL)  # time is the condition: frozen for twice the lease
            first.resume()
            await first.wait_event("lease.lost", timeout=10, source="edge1")
            await first.wait_event("source.fenced", timeout=10, source="edge1")
            await wait_until(lambda: standby_ready(first, "edge1"), timeout=20, what="p0 back as a ready standby")
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        assert first.is_running
        _, body = await readyz(port)
        assert body["sources"]["edge1"]["owner"] == "p1", body
        for proc in (first, second):
            assert await proc.astop(20) == 0


@pytest.mark.anyio
async def test_the_bucket_server_restarted(topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory) -> None:
    """The hub (the KV bucket's server, and the target) restarts under traffic with an owner and a standby: the
    leases survive on its store or lapse and are taken again; exactly one process replicates, exactly once."""
    config, prepare = await one_source(topology, tmp_path)
    await prepare()
    async with connect(topology.leaf.url) as leaf_nc:
        p0, p1 = await owner_and_standby(bridge_procs, config)
        publisher = Publisher(leaf_nc, 12_000, rate=RATE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await wait_until(lambda: publisher.published > 3000, timeout=30, what="traffic")
            await anyio.to_thread.run_sync(topology.hub.restart)
            await anyio.to_thread.run_sync(topology.wait_linked)

        async def one_owner() -> bool:
            return [await owns(p0, "edge1"), await owns(p1, "edge1")].count(True) == 1

        await wait_until(one_owner, timeout=30, what="one owner after the restart")
        async with connect(topology.hub.url) as hub_nc:
            await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        for proc in (p0, p1):
            assert await proc.astop(20) == 0


@pytest.mark.anyio
async def test_three_processes_share_six_sources_and_only_the_killed_ones_sources_move(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    names = [f"s{i}" for i in range(6)]
    specs = [
        SourceSpec(name=name, servers=topology.leaf.url, stream=f"{ORIGIN}{i}", subject_prefix=f"edge.{name}")
        for i, name in enumerate(names)
    ]
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=specs)
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        for i in range(6):
            await create_stream(leaf_nc, f"{ORIGIN}{i}", [f"o{i}.>"], retention="workqueue")
        await create_aggregate(hub_nc, duplicate_window=DUPLICATE_WINDOW)
        procs: list[BridgeProcess] = []

        async def ownership() -> dict[str, list[str]]:
            out: dict[str, list[str]] = {}
            for i, proc in enumerate(procs):
                if proc.is_running:
                    _, body = await readyz(await http_port(proc))
                    out[f"p{i}"] = sorted(body.get("fleet", {}).get("owned", []))
            return out

        async def settled() -> bool:
            owned = await ownership()
            flat = sorted(s for v in owned.values() for s in v)
            # every process owns some, none more than the fair share of a fleet still growing (bounded loads make
            # it 2/2/2 once all three run; the check allows the hand-overs of each newcomer's arrival)
            return flat == names and all(1 <= len(v) <= 6 - len(procs) + 1 for v in owned.values())

        for i in range(3):  # one after another, as a fleet grows: each newcomer takes its share from the others
            procs.append(fleet_instance(bridge_procs, config, f"p{i}"))
            await wait_until(settled, timeout=30, what=f"six sources shared by {i + 1} process(es)")
        before = await ownership()

        def subjects(stream: int) -> Callable[[int], str]:
            return lambda k: f"o{stream}.{k % 3}"

        publishers = {name: Publisher(leaf_nc, 3000, rate=300, subject=subjects(i)) for i, name in enumerate(names)}
        async with anyio.create_task_group() as tg:
            for publisher in publishers.values():
                tg.start_soon(publisher.run)
            await wait_until(lambda: all(p.published > 1000 for p in publishers.values()), timeout=30, what="traffic")
            victim = max(before, key=lambda k: len(before[k]))
            moves_before = {
                k: len(procs[int(k[1])].events("lease.lost")) + len(procs[int(k[1])].events("lease.handing_over"))
                for k in before
            }
            assert await procs[int(victim[1])].akill() == -9
            survivors = [k for k in before if k != victim]

            async def moved() -> bool:
                owned = await ownership()
                return sorted(s for k in survivors for s in owned.get(k, [])) == names

            await wait_until(moved, timeout=TTL + 15, what=f"{victim}'s sources taken over")
        after = await ownership()
        for survivor in survivors:
            assert set(before[survivor]) <= set(after[survivor]), (before, after)
            proc = procs[int(survivor[1])]
            moves = len(proc.events("lease.lost")) + len(proc.events("lease.handing_over"))
            assert moves == moves_before[survivor], f"{survivor} gave a source up after the kill"
        await replicate_exactly(leaf_nc, hub_nc, publishers, [f"{ORIGIN}{i}" for i in range(6)])
        for survivor in survivors:
            assert await procs[int(survivor[1])].astop(20) == 0
    print(f"owners before {before}, after killing {victim}: {after}")


@pytest.mark.anyio
async def test_without_coordination_the_bridge_replicates_alone_and_makes_no_bucket(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """``coordination.enabled = false``: the operator guarantees one process; nothing is read or written in KV."""
    config, prepare = await one_source(topology, tmp_path, {"enabled": False})
    await prepare()
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        bridge = fleet_instance(bridge_procs, config, "solo")
        await bridge.wait_event(READY_EVENTS, timeout=20)
        publisher = Publisher(leaf_nc, 2000)
        await publisher.run()
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        _, body = await readyz(await http_port(bridge))
        assert "fleet" not in body and body["ready"], body
        assert bridge.events("fleet.joined") == []
        streams = await hub_nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=5)
        assert "KV_nats-bridge" not in streams.data.decode()
        assert await bridge.astop(20) == 0


@pytest.mark.anyio
async def test_a_busy_event_loop_keeps_its_leases(topology: Topology, tmp_path: Path) -> None:
    """The bridge's event loop blocked for twice the lease TTL (what a reconnect storm of a thousand sources can do
    to it): the fleet renews on its own thread and loop, so the source keeps its lease and replicates on. Before the
    fleet had its own thread, every renewal waited behind the loop and the lease was lost at the fence."""
    config, prepare = await one_source(topology, tmp_path)
    await prepare()
    async with (
        connect(topology.leaf.url) as leaf_nc,
        connect(topology.hub.url) as hub_nc,
        running_bridge(config, tmp_path / "bridge.log") as bridge,
    ):
        before = only_lease(bridge)
        assert before.owned, before
        # the fault under test: this thread, the bridge's loop included, does nothing else for that long
        time.sleep(2 * TTL)  # noqa: ASYNC251  (blocking the loop is the point)
        after = only_lease(bridge)
        assert after.owned and after.ownership_changes == before.ownership_changes, (before, after)
        # a renew is due every TTL/3: at least four landed while the loop was blocked
        assert after.renewals >= before.renewals + 4, (before, after)
        publisher = Publisher(leaf_nc, 2000)
        await publisher.run()
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        assert after.renew_failures == 0, after


@pytest.mark.anyio
async def test_a_source_that_stopped_at_its_fence_while_the_lease_was_kept_is_started_again(
    topology: Topology, tmp_path: Path
) -> None:
    """A source finds its fence closed at an action and stops itself, while the lease stays this process's (seen
    under load: a renew answered a moment after the fence had passed moved it again). The bridge tells the fleet,
    which starts the source again under the same lease: before, the source stayed stopped for good while its lease
    was renewed on, and a WorkQueue origin kept everything published after that (a chaos storm run found it)."""
    config, prepare = await one_source(topology, tmp_path)
    await prepare()
    async with (
        connect(topology.leaf.url) as leaf_nc,
        connect(topology.hub.url) as hub_nc,
        running_bridge(config, tmp_path / "bridge.log") as bridge,
    ):
        before = only_lease(bridge)
        assert before.owned, before
        publisher = Publisher(leaf_nc, 4000, rate=2000)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await wait_until(lambda: len(publisher.seqs) >= 1000, timeout=20, what="a first part published")
            (first,) = bridge.runners
            # what the runner does when its fence check says closed (SourceRunner.may_act)
            first.abandon("lease fence closed")
            await wait_until(
                lambda: [r for r in bridge.runners if r is not first],
                timeout=20,
                what="the source started again",
            )
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        after = only_lease(bridge)
        assert after.owned and after.ownership_changes == before.ownership_changes, (before, after)
    events = [json.loads(line).get("event") for line in (tmp_path / "bridge.log").read_text().splitlines()]
    assert events.count("source.fenced") == 1 and events.count("source.restarted") == 1, events


@pytest.mark.anyio
async def test_a_hub_frozen_past_the_fence_suspends_the_lease_and_the_source_resumes_without_setting_up_again(
    topology: Topology, tmp_path: Path
) -> None:
    """The hub (the bucket's server and the aggregate's) frozen under traffic past the lease's fence but not its TTL,
    as a hub starved by a reconnect storm is: the lease is suspended, not lost; the source pauses, and the first
    renew answered in time resumes it where it paused, with no set-up and no recovery read, everything replicated
    once and in order. Before, the lease was lost at the fence and the source set up again from the aggregate:
    with 2,000 sources on a starved hub, minutes without replication (``bench edge``)."""
    ttl = 10.0  # the freeze must pass the fence (0.8 TTL after the last renew) and leave the key alive
    config, prepare = await one_source(topology, tmp_path, {"lease_ttl": ttl})
    await prepare()
    log = tmp_path / "bridge.log"
    async with connect(topology.leaf.url) as leaf_nc, running_bridge(config, log) as bridge:
        before = only_lease(bridge)
        assert before.owned, before
        publisher = Publisher(leaf_nc, 6000, rate=RATE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await wait_until(lambda: len(publisher.seqs) >= 1000, timeout=20, what="a first part published")

            def just_renewed() -> bool:
                since = only_lease(bridge).seconds_since_renew
                return since is not None and since < 0.5

            await wait_until(just_renewed, timeout=ttl, what="a renew sent a moment ago")
            topology.hub.pause()
            try:
                # the fault's length is the condition: past the fence (at most 0.8 TTL after that renew was sent),
                # within the TTL of the write it stored (the key lives on)
                await anyio.sleep(0.8 * ttl + 0.6)
            finally:
                topology.hub.resume()
        async with connect(topology.hub.url) as hub_nc:
            await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        after = only_lease(bridge)
        assert after.owned and after.ownership_changes == before.ownership_changes, (before, after)
    events = [json.loads(line).get("event") for line in log.read_text().splitlines()]
    assert "lease.suspended" in events and "lease.resumed" in events, events
    assert "source.paused" in events and "source.resumed" in events, events
    assert "lease.lost" not in events and "source.fenced" not in events, events
    assert events.count("consumer.bound") == 1 and events.count("recovery.done") == 1, events


@pytest.mark.anyio
async def test_a_rolling_update_from_leases_per_source_to_lease_groups_never_shares_a_source(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """The upgrade from a version before lease groups, as an orchestrator rolls it: the old process (one lease per
    source: ``lease_groups = 0``, what older versions do) owns the source; the new one (the default groups) starts
    beside it, says why it takes nothing (``fleet.mixed_lease_groups``) and stays out; the old one gets SIGTERM and
    the new one takes over. Under traffic, exactly once, in order."""
    config, prepare = await one_source(topology, tmp_path)
    await prepare()
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        old = bridge_procs(config, {INSTANCE_ID_ENV: "old", "NATS_BRIDGE_COORDINATION__LEASE_GROUPS": "0"})
        await old.wait_event(READY_EVENTS, timeout=20)
        publisher = Publisher(leaf_nc, 8000, rate=RATE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(publisher.run)
            await wait_until(lambda: publisher.published > 2000, timeout=30, what="traffic")
            new = fleet_instance(bridge_procs, config, "new")
            await new.wait_event("fleet.mixed_lease_groups", timeout=20)
            (mixed,) = new.events("fleet.mixed_lease_groups")
            assert mixed["members"] == ["old"] and mixed["their_lease_groups"] == [0], mixed
            await wait_until(lambda: publisher.published > 4000, timeout=30, what="traffic beside the new process")
            assert new.events(READY_EVENTS) == [] and await owns(old, "edge1")
            assert await old.astop(20) == 0
            await new.wait_event(READY_EVENTS, timeout=TTL + 10)
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": publisher})
        assert new.events("lease.acquired", source="edge1")[0]["group"], "the new process leases a group"
        assert await new.astop(20) == 0
