"""The fleet runner's standby waits (``source.waiting for=lease``): logged when a process becomes a source's standby
and again whenever its owner changes, never once per view, however many views repeat it (bridge/runtime/fleet.py,
``FleetRunner._note_standby``, which skips a view that changed nothing it reads)."""

from __future__ import annotations

from collections.abc import MutableMapping
from types import SimpleNamespace
from typing import Any, cast

import structlog

from bridge.core.fleet import FleetEffect, Holder, LeaseState, Member, ResumeSource, StartSource, StopSource, View
from bridge.io.kv import KvBucket
from bridge.runtime.fleet import FleetRunner, SourceControl

TTL = 3.0


async def _stop(source: str) -> None:
    return None


def standby_runner(sources: list[str], lease_groups: int = 0) -> FleetRunner:
    """Process ``b``'s fleet runner, joined (its presence written a join wait ago), nothing owned yet."""
    control = SourceControl(start=lambda source, fence: None, stop=_stop, abandon=lambda s: None, resume=lambda s: None)
    runner = FleetRunner(
        cast(KvBucket, SimpleNamespace(bucket="nats-bridge")),
        instance="b",
        sources=sources,
        ttl=TTL,
        replicas=1,
        control=control,
        lease_groups=lease_groups,
        shutdown_grace=1.0,
        clock=lambda: 0.0,
    )
    fleet = runner.fleet
    fleet.tick(0.0)
    fleet.presence_written(-fleet.timing.join_wait)
    return runner


def members(runner: FleetRunner, *others: str) -> dict[str, Member]:
    fleet = runner.fleet
    everyone = {name: Member(name, f"{name}#1", frozenset(fleet.units), lease_groups=fleet.groups) for name in others}
    everyone[fleet.instance] = Member(
        fleet.instance, fleet.incarnation, frozenset(fleet.units), lease_groups=fleet.groups
    )
    return everyone


def perform(runner: FleetRunner, effects: list[FleetEffect]) -> None:
    """Perform what the core decided about sources (its requests to the bucket are this test's to answer)."""
    runner._perform([e for e in effects if isinstance(e, StartSource | StopSource | ResumeSource)])


def view(runner: FleetRunner, holders: dict[str, Holder], now: float) -> list[MutableMapping[str, Any]]:
    """Feed a view in which ``holders`` hold these keys (sources' or groups'), and return what it logged."""
    owners = {holder.instance for holder in holders.values()}
    grouped = runner.fleet.groups > 0
    everyone = members(runner, *owners)
    seen = View(members=everyone, groups=holders) if grouped else View(members=everyone, holders=holders)
    with structlog.testing.capture_logs() as logs:
        perform(runner, runner.fleet.viewed(seen, now, now))
        runner._note_standby()
    return logs


def waits(logs: list[MutableMapping[str, Any]]) -> list[tuple[str, str]]:
    return [(e["source"], e["owner"]) for e in logs if e["event"] == "source.waiting" and e["for"] == "lease"]


def test_a_standby_logs_its_wait_once_and_again_only_when_the_owner_changes() -> None:
    runner = standby_runner(["s1", "s2"])
    a = Holder("a", "a#1", revision=4)
    assert sorted(waits(view(runner, {"s1": a, "s2": a}, 0.0))) == [("s1", "a"), ("s2", "a")]
    assert runner.fleet.lease_of("s1").state is LeaseState.STANDBY  # type: ignore[union-attr]
    for n in range(1, 5):  # views that change nothing log nothing
        assert waits(view(runner, {"s1": a, "s2": a}, n * 0.1)) == []
    c = Holder("c", "c#1", revision=9)
    assert waits(view(runner, {"s1": c, "s2": a}, 1.0)) == [("s1", "c")]  # one owner changed: that source only
    assert waits(view(runner, {"s1": c, "s2": a}, 1.1)) == []


def test_a_term_of_its_own_between_two_views_begins_the_wait_again() -> None:
    """The lease taken (its start ends the wait), lost, and held again by the same owner as before: the view after
    looks the same as the one before the term, and the wait is logged again all the same."""
    runner = standby_runner(["s1"])
    a = Holder("a", "a#1", revision=4)
    assert waits(view(runner, {"s1": a}, 0.0)) == [("s1", "a")]
    fleet = runner.fleet
    with structlog.testing.capture_logs() as logs:
        perform(runner, fleet.viewed(View(members=members(runner), free={"s1": 5}), 1.0, 1.0))  # a released it
        perform(runner, fleet.acquired("s1", 6, 1.0, 0.0, 1.0))  # ours: started
        renew_at = 1.0 + fleet.timing.renew_every * 1.3
        perform(runner, fleet.tick(renew_at))  # (its renew is sent)
        perform(runner, fleet.renew_failed("s1", "wrong last sequence", True, renew_at))  # refused: lost at once
    assert [e["event"] for e in logs if e["event"].startswith("source.waiting")] == ["source.waiting_over"]
    assert fleet.leases["s1"].state is not LeaseState.OWNED
    assert waits(view(runner, {"s1": a}, renew_at + 0.1)) == [("s1", "a")]


def test_lease_groups_log_every_source_of_a_group_another_process_holds() -> None:
    runner = standby_runner([f"s{n}" for n in range(40)], lease_groups=4)
    fleet = runner.fleet
    held = {unit: Holder("a", "a#1", revision=3) for unit in fleet.units if unit != "0"}
    logged = waits(view(runner, held, 0.0))
    assert sorted(logged) == sorted((name, "a") for unit in held for name in fleet.units[unit])
    assert waits(view(runner, held, 0.1)) == []
