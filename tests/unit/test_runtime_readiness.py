"""``bridge.runtime.readiness``: ``/readyz``, systemd's READY wait and STATUS line, on plain snapshots."""

from __future__ import annotations

from dataclasses import replace

from bridge.observe.metrics import BridgeSnapshot, FleetSnapshot, LeaseSnapshot, SourceSnapshot
from bridge.runtime.readiness import readyz, status_line, waiting_for

GOOD = SourceSnapshot(
    source="edge1",
    phase="running",
    origin_connected=True,
    consumer_bound=True,
    watermark=10,
    last_delivered=10,
    origin_pending=0,
    in_flight=0,
    backlog=0,
    replicated_messages=10,
    replicated_bytes=100,
    deliveries=10,
    duplicates=0,
    fc_requests=1,
    fc_answers=1,
)


def lease(source: str, owned: bool, owner: str = "") -> LeaseSnapshot:
    return LeaseSnapshot(source, owned, "owned" if owned else "standby", owner, "", None, 0, 0, 0, None)


def fleet(*leases: LeaseSnapshot, ready: bool = True) -> FleetSnapshot:
    return FleetSnapshot("a", "nats-bridge", 3.0, ready, ("a", "b"), leases)


def snap(*sources: SourceSnapshot, target: bool = True, fleet: FleetSnapshot | None = None) -> BridgeSnapshot:
    return BridgeSnapshot(target_connected=target, sources=sources, now=0.0, fleet=fleet)


def test_ready_when_the_target_is_connected_and_every_source_replicates() -> None:
    answer = readyz(snap(GOOD), coordinated=False, target_stream="AGG")
    assert answer.ready and answer.body["ready"] is True
    assert answer.body["target"] == {"connected": True, "stream": "AGG"}
    assert answer.body["sources"]["edge1"]["role"] == "owner" and answer.body["sources"]["edge1"]["reasons"] == []
    assert "fleet" not in answer.body


def test_each_source_that_is_not_replicating_says_why() -> None:
    bad = replace(GOOD, source="edge2", origin_connected=False, consumer_bound=False, stalled=True)
    answer = readyz(snap(GOOD, replace(bad, seconds_since_progress=42.4)), coordinated=False, target_stream="AGG")
    assert not answer.ready
    assert answer.body["sources"]["edge2"]["reasons"] == [
        "origin not connected",
        "consumer not bound yet",
        "stalled: no progress for 42s with messages waiting",
    ]
    assert answer.body["sources"]["edge1"]["ready"] is True


def test_no_source_or_no_target_is_not_ready() -> None:
    assert not readyz(snap(), coordinated=False, target_stream="AGG").ready
    assert not readyz(snap(GOOD, target=False), coordinated=False, target_stream="AGG").ready


def test_with_leases_a_healthy_standby_is_ready_and_names_the_owner() -> None:
    answer = readyz(snap(fleet=fleet(lease("edge1", False, "b"))), coordinated=True, target_stream="AGG")
    assert answer.ready
    assert answer.body["sources"]["edge1"] == {
        "ready": True,
        "reasons": [],
        "role": "standby",
        "owner": "b",
        "owner_host": None,
    }
    assert answer.body["fleet"]["owned"] == [] and answer.body["fleet"]["members"] == ["a", "b"]


def test_with_leases_not_ready_before_the_bucket_is_read_or_while_an_owned_source_is_down() -> None:
    stale = readyz(snap(fleet=fleet(ready=False)), coordinated=True, target_stream="AGG")
    assert not stale.ready and stale.body["fleet"]["ready"] is False
    missing = readyz(snap(), coordinated=True, target_stream="AGG")
    assert not missing.ready and missing.body["fleet"]["reason"].startswith("the coordination bucket")
    down = replace(GOOD, origin_connected=False)
    owned = readyz(snap(down, fleet=fleet(lease("edge1", True, "a"))), coordinated=True, target_stream="AGG")
    assert not owned.ready and owned.body["sources"]["edge1"]["role"] == "owner"


def test_ready_1_waits_for_sources_then_the_bucket_then_owners() -> None:
    assert waiting_for(["edge1"], coordinated=False, fleet_ready=False, fleet_settled=False) == ["edge1"]
    assert waiting_for([], coordinated=False, fleet_ready=False, fleet_settled=False) == []
    assert waiting_for([], coordinated=True, fleet_ready=False, fleet_settled=True) == ["the coordination bucket"]
    assert waiting_for([], coordinated=True, fleet_ready=True, fleet_settled=False) == ["sources without an owner yet"]
    assert waiting_for(["e"], coordinated=True, fleet_ready=True, fleet_settled=True) == ["e"]


def test_status_line() -> None:
    assert status_line(1, running=2, configured=2, instance=None) == "replicating 1 of 2 source(s)"
    assert (
        status_line(1, running=1, configured=3, instance="a")
        == "replicating 1 of 3 source(s), standby for the others (instance a)"
    )


def test_with_leases_a_source_whose_lease_is_suspended_is_not_ready_and_says_why() -> None:
    suspended = replace(lease("edge1", True, "a"), state="suspended")
    answer = readyz(snap(GOOD, fleet=fleet(suspended)), coordinated=True, target_stream="AGG")
    assert not answer.ready
    assert answer.body["sources"]["edge1"]["reasons"] == [
        "lease suspended: paused until a renew of its lease succeeds (the hub answers late)"
    ]
    assert answer.body["fleet"]["owned"] == ["edge1"] and answer.body["fleet"]["suspended"] == ["edge1"]
