"""The lease table (bridge/core/leases.py): every listed transition goes where the table says, every other event
changes nothing; and ``Fleet`` moves its leases only along the table, driven through its public methods."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from bridge.core.effects import Notice
from bridge.core.fleet import (
    Acquire,
    Fleet,
    FleetEffect,
    Holder,
    Lease,
    LeaseTiming,
    Member,
    ReadView,
    Release,
    Renew,
    ResumeSource,
    StartSource,
    StopSource,
    View,
    WritePresence,
    preferred_owner,
)
from bridge.core.leases import (
    KEPT,
    OURS,
    PUBLIC_STATE,
    RENEWS,
    SERVING,
    SOURCE_RUNS,
    SUSPENDED,
    TRANSITIONS,
    LeaseEvent,
    LeaseMachine,
    LeaseState,
)

TTL = 3.0
TIMING = LeaseTiming(TTL)
RENEW_AT = TIMING.renew_every  # the first renew of a lease acquired at 0 is due by then
NOW = RENEW_AT + 0.3  # when the input under test arrives: the fence of the write at 0 is still open
FENCE = TTL - TIMING.guard  # ... until here

# -- the table alone ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", list(LeaseState))
@pytest.mark.parametrize("event", list(LeaseEvent))
def test_each_event_in_each_state_follows_the_table_or_changes_nothing(state: LeaseState, event: LeaseEvent) -> None:
    machine = LeaseMachine(state)
    before = attributes(machine)
    expected = TRANSITIONS[state].get(event)
    assert machine.can(event) is (expected is not None)
    assert machine.process(event) is (expected is not None)
    assert machine.state is (expected or state)
    if expected is None:
        assert attributes(machine) == before
    else:
        assert attributes(machine) == attributes(LeaseMachine(expected))


def attributes(machine: LeaseMachine) -> tuple[object, ...]:
    return (
        machine.state,
        machine.public_state,
        machine.standby,
        machine.owned,
        machine.serving,
        machine.source_runs,
        machine.renews,
        machine.kept,
        machine.suspended,
    )


def test_every_state_is_reachable_from_standby_and_leads_back_to_it() -> None:
    def reachable(start: LeaseState) -> set[LeaseState]:
        seen, frontier = {start}, [start]
        while frontier:
            for target in TRANSITIONS[frontier.pop()].values():
                if target not in seen:
                    seen.add(target)
                    frontier.append(target)
        return seen

    assert reachable(LeaseState.STANDBY) == set(LeaseState)
    assert all(LeaseState.STANDBY in reachable(state) for state in LeaseState)
    assert set(TRANSITIONS) == set(LeaseState)


def test_the_state_sets_agree_with_the_table() -> None:
    def listing(event: LeaseEvent) -> set[LeaseState]:
        return {state for state, row in TRANSITIONS.items() if event in row}

    # the ticker watches the fence where a source may act: a kept lease is suspended there, a draining one lost
    assert listing(LeaseEvent.FENCE_PASSED) == SERVING
    assert listing(LeaseEvent.LOST) == SOURCE_RUNS | SUSPENDED
    assert {LeaseState.DRAINING, LeaseState.DRAINING_RENEWING} == SOURCE_RUNS - SERVING
    assert listing(LeaseEvent.RENEW_SENT) == RENEWS
    assert listing(LeaseEvent.HAND_OVER) == SERVING
    assert listing(LeaseEvent.SOURCE_STOPPED) == {LeaseState.DRAINING, LeaseState.DRAINING_RENEWING}
    # a renew reply is taken exactly where a renew is in flight, and every state that awaits one is ours
    renew_awaited = {
        LeaseState.RENEWING,
        LeaseState.DRAINING_RENEWING,
        LeaseState.RELEASING_RENEWING,
        LeaseState.SUSPENDED_RENEWING,
    }
    for event in (LeaseEvent.RENEWED, LeaseEvent.RENEW_FAILED, LeaseEvent.RENEW_ADOPTED, LeaseEvent.RENEW_REFUSED):
        assert listing(event) == renew_awaited
    assert listing(LeaseEvent.RENEWED_LATE) == {LeaseState.SUSPENDED_RENEWING}
    # the only way out of suspension back to running is a renew stored in time
    assert {TRANSITIONS[state][LeaseEvent.RENEWED] for state in SUSPENDED & renew_awaited} == {LeaseState.OWNED}
    assert {target for state in SUSPENDED for target in TRANSITIONS[state].values()} <= SUSPENDED | {
        LeaseState.OWNED,
        LeaseState.STANDBY,
    }
    assert SOURCE_RUNS | renew_awaited | {LeaseState.RELEASING, LeaseState.SUSPENDED} == OURS
    assert set(LeaseState) - {LeaseState.STANDBY, LeaseState.ACQUIRING} == OURS
    assert SERVING | SUSPENDED == KEPT
    for state in LeaseState:
        machine = LeaseMachine(state)
        assert machine.standby is (state is LeaseState.STANDBY)
        assert (machine.owned, machine.serving, machine.source_runs, machine.renews) == (
            state in OURS,
            state in SERVING,
            state in SOURCE_RUNS,
            state in RENEWS,
        )
        assert (machine.kept, machine.suspended) == (state in KEPT, state in SUSPENDED)


def test_users_see_five_names() -> None:
    assert set(PUBLIC_STATE) == set(LeaseState)
    assert {s for s in LeaseState if PUBLIC_STATE[s] == "owned"} == SERVING
    assert {s for s in LeaseState if PUBLIC_STATE[s] == "suspended"} == SUSPENDED
    assert {s for s in LeaseState if PUBLIC_STATE[s] == "releasing"} == OURS - KEPT
    assert PUBLIC_STATE[LeaseState.STANDBY] == "standby" and PUBLIC_STATE[LeaseState.ACQUIRING] == "acquiring"
    assert LeaseMachine().state is LeaseState.STANDBY


# -- Fleet, driven through its public methods ---------------------------------------------------------------------


def me(fleet: Fleet) -> dict[str, Member]:
    return {fleet.instance: Member(fleet.instance, fleet.incarnation, frozenset(fleet.configured))}


def labels(effects: list[FleetEffect]) -> list[object]:
    """The effects about the lease: a notice by its event name, any other effect itself."""
    return [e.event if isinstance(e, Notice) else e for e in effects if not isinstance(e, ReadView | WritePresence)]


SUSPENDED_AT = NOW - 0.5  # a suspended lease's fence passed then (it was acquired at SUSPENDED_AT - FENCE - 0.1)


def drive(state: LeaseState) -> Fleet:
    """A fleet core whose lease ``s`` was brought to ``state`` through public inputs only (acquired at 0, its first
    renew sent at RENEW_AT, any handover after that; suspended: acquired earlier, its first renew unanswered when its
    fence passed at SUSPENDED_AT, failed a moment later for SUSPENDED)."""
    start = SUSPENDED_AT - FENCE - 0.1 if state in SUSPENDED else 0.0
    fleet = Fleet("a", "a#1", ["s"], TIMING, start)
    fleet.tick(start)
    fleet.presence_written(start - TIMING.join_wait)  # joined a join wait ago: it may decide at the start
    if state is LeaseState.STANDBY:
        return at(fleet, state)
    assert labels(fleet.viewed(View(members=me(fleet)), start, start)) == [Acquire("s", 0)]
    if state is LeaseState.ACQUIRING:
        return at(fleet, state)
    assert labels(fleet.acquired("s", 1, start, 0.0, start)) == ["lease.acquired", StartSource("s")]
    if state in SUSPENDED:
        assert labels(fleet.tick(start + TIMING.renew_every)) == [Renew("s", 1)]  # unanswered past the fence:
        assert labels(fleet.tick(SUSPENDED_AT)) == ["lease.suspended"]  # nothing stops
        if state is LeaseState.SUSPENDED:
            assert labels(fleet.renew_failed("s", "timeout", False, SUSPENDED_AT + 0.1)) == ["lease.renew_failed"]
        return at(fleet, state)
    if state in (LeaseState.RENEWING, LeaseState.DRAINING_RENEWING, LeaseState.RELEASING_RENEWING):
        assert labels(fleet.tick(RENEW_AT)) == [Renew("s", 1)]
    if state in (LeaseState.OWNED, LeaseState.RENEWING):
        return at(fleet, state)
    assert labels(fleet.shutdown(RENEW_AT + 0.1)) == ["lease.handing_over", StopSource("s", graceful=True)]
    if state in (LeaseState.DRAINING, LeaseState.DRAINING_RENEWING):
        return at(fleet, state)
    # with a renew in flight the delete waits for its reply (it names the revision the renew may move)
    waits = state is LeaseState.RELEASING_RENEWING
    assert labels(fleet.source_stopped("s", RENEW_AT + 0.2)) == ([] if waits else [Release("s", 1)])
    return at(fleet, state)


def at(fleet: Fleet, state: LeaseState) -> Fleet:
    assert fleet.leases["s"].state is state
    return fleet


def snapshot(fleet: Fleet) -> dict[str, object]:
    """Everything the fleet core keeps about its leases."""
    out: dict[str, object] = {"sources": sorted(fleet.leases)}
    for name, lease in fleet.leases.items():
        for f in dataclasses.fields(Lease):
            if f.name != "machine":
                out[f"{name}.{f.name}"] = getattr(lease, f.name)
        out[f"{name}.state"] = lease.state
    return out


# each reply the runtime reports, as its event of the table, and what it returns when the table takes it
REPLIES: dict[LeaseEvent, tuple[Callable[[Fleet], list[FleetEffect]], list[object]]] = {
    LeaseEvent.ACQUIRED: (
        lambda f: f.acquired("s", 5, NOW, 0.0, NOW),
        ["lease.acquired", StartSource("s")],
    ),
    LeaseEvent.ACQUIRE_FAILED: (lambda f: f.acquire_failed("s", "refused", NOW), ["lease.acquire_failed"]),
    LeaseEvent.RENEWED: (lambda f: f.renewed("s", 5, RENEW_AT, NOW), []),  # suspended: RESUMED below
    LeaseEvent.RENEW_FAILED: (lambda f: f.renew_failed("s", "timeout", False, NOW), ["lease.renew_failed"]),
    LeaseEvent.RENEW_ADOPTED: (lambda f: f.renew_adopted("s", 5, NOW), []),
    LeaseEvent.RENEW_REFUSED: (
        lambda f: f.renew_failed("s", "wrong last sequence", True, NOW),
        ["lease.lost", StopSource("s", graceful=False)],
    ),
    LeaseEvent.SOURCE_STOPPED: (lambda f: f.source_stopped("s", NOW), [Release("s", 1)]),
    LeaseEvent.RELEASED: (lambda f: f.released("s", True, "", NOW), ["lease.released"]),
}


@pytest.mark.parametrize("state", list(LeaseState))
@pytest.mark.parametrize("event", list(REPLIES))
def test_each_reply_in_each_state_moves_the_lease_along_the_table_or_changes_nothing(
    state: LeaseState, event: LeaseEvent
) -> None:
    fleet = drive(state)
    feed, returns = REPLIES[event]
    before = snapshot(fleet)
    effects = feed(fleet)
    expected = TRANSITIONS[state].get(event)
    if expected is None:  # stale: no effects, nothing changed
        assert effects == []
        assert snapshot(fleet) == before
    else:
        if event is LeaseEvent.RENEWED and state in SUSPENDED:
            returns = RESUMED
        elif state is LeaseState.RELEASING_RENEWING and event in DELETE_WITH_REPLY:
            returns = DELETE_WITH_REPLY[event]  # the delete that waited for the renew's reply goes out with it
        elif state is LeaseState.DRAINING_RENEWING and event is LeaseEvent.SOURCE_STOPPED:
            returns = []  # the delete waits for the renew in flight
        assert labels(effects) == returns
        assert fleet.leases["s"].state is expected


RESUMED = ["lease.resumed", ResumeSource("s")]  # a renew stored in time ends a suspension: the source goes on
# a stopped lease's renew reply: the delete on the revision the reply brings (a failed one: the last known)
DELETE_WITH_REPLY: dict[LeaseEvent, list[object]] = {
    LeaseEvent.RENEWED: [Release("s", 5)],
    LeaseEvent.RENEW_FAILED: [Release("s", 1)],
    LeaseEvent.RENEW_ADOPTED: [Release("s", 5)],
}


@pytest.mark.parametrize("state", list(LeaseState))
def test_a_view_acquires_a_standby_lease_only(state: LeaseState) -> None:
    fleet = drive(state)
    # (a suspended lease sees its own key: one seen gone or someone else's is lost, tested below)
    holders = {"s": Holder("a", "a#1", revision=1)} if state in SUSPENDED else {}
    effects = labels(fleet.viewed(View(members=me(fleet), holders=holders), NOW, NOW))
    if state is LeaseState.STANDBY:
        assert effects == [Acquire("s", 0)]
        assert fleet.leases["s"].state is TRANSITIONS[state][LeaseEvent.ACQUIRE_SENT]
    else:
        assert effects == []
        assert fleet.leases["s"].state is state


@pytest.mark.parametrize("state", list(LeaseState))
def test_a_due_renew_goes_out_only_where_the_table_lists_renew_sent(state: LeaseState) -> None:
    fleet = drive(state)
    before = snapshot(fleet)
    effects = labels(fleet.tick(NOW))  # a renew is due, the fence still open
    expected = TRANSITIONS[state].get(LeaseEvent.RENEW_SENT)
    if expected is None:
        assert effects == []
        assert snapshot(fleet) == before
    else:
        assert effects == [Renew("s", 1)]
        assert fleet.leases["s"].state is expected
        assert labels(fleet.tick(NOW + 0.1)) == []  # one renew in flight at a time


@pytest.mark.parametrize("state", [state for state in LeaseState if state not in SUSPENDED])
def test_the_fence_passing_suspends_a_kept_lease_and_loses_a_draining_one(state: LeaseState) -> None:
    fleet = drive(state)
    before = snapshot(fleet)
    effects = labels(fleet.tick(FENCE))
    suspended = TRANSITIONS[state].get(LeaseEvent.FENCE_PASSED)
    if state not in SOURCE_RUNS:
        assert effects == []
        assert snapshot(fleet) == before
    elif suspended is not None:  # nothing stops; a renew goes out at once unless one is in flight
        renew = [Renew("s", 1)] if TRANSITIONS[suspended].get(LeaseEvent.RENEW_SENT) else []
        assert effects == ["lease.suspended", *renew]
        assert fleet.leases["s"].state is LeaseState.SUSPENDED_RENEWING
        assert not fleet.holds("s", FENCE)
    else:
        assert effects == ["lease.lost", StopSource("s", graceful=False)]
        assert fleet.leases["s"].state is TRANSITIONS[state][LeaseEvent.LOST]
        assert not fleet.holds("s", FENCE - 0.1)


@pytest.mark.parametrize("state", list(LeaseState))
def test_a_shutdown_hands_over_only_where_the_table_lists_hand_over(state: LeaseState) -> None:
    fleet = drive(state)
    expected = TRANSITIONS[state].get(LeaseEvent.HAND_OVER)
    effects = labels(fleet.shutdown(NOW))
    if state in SUSPENDED:  # nothing can drain behind a closed fence: its sources are dropped, the key expires
        assert effects == ["lease.lost", StopSource("s", graceful=False)]
        assert fleet.leases["s"].state is LeaseState.STANDBY
    elif expected is None:
        assert effects == []
        assert fleet.leases["s"].state is state
    else:
        assert effects == ["lease.handing_over", StopSource("s", graceful=True)]
        assert fleet.leases["s"].state is expected
        assert fleet.holds("s", NOW)  # draining: the source still answers what is stored


@pytest.mark.parametrize("state", [LeaseState.DRAINING, LeaseState.DRAINING_RENEWING])
def test_a_drain_that_ends_past_the_fence_loses_the_lease_instead_of_releasing_it(state: LeaseState) -> None:
    fleet = drive(state)
    assert labels(fleet.source_stopped("s", FENCE)) == ["lease.lost", StopSource("s", graceful=False)]
    assert fleet.leases["s"].state is TRANSITIONS[state][LeaseEvent.LOST]


def test_an_acquisition_that_lands_past_its_fence_is_acquired_then_lost() -> None:
    fleet = drive(LeaseState.ACQUIRING)
    assert labels(fleet.acquired("s", 1, 0.0, 0.0, FENCE)) == ["lease.lost", StopSource("s", graceful=False)]
    assert fleet.leases["s"].state is LeaseState.STANDBY
    assert fleet.leases["s"].term == 1 and fleet.leases["s"].changes == 2


def test_a_renew_reply_after_the_release_does_not_answer_the_next_terms_renew() -> None:
    fleet = Fleet("a", "a#1", ["s", "t"], TIMING, 0.0)
    fleet.tick(0.0)
    fleet.presence_written(-TIMING.join_wait)  # joined a join wait ago: it may decide at 0
    fleet.viewed(View(members=me(fleet)), 0.0, 0.0)
    fleet.acquired("s", 1, 0.0, 0.0, 0.0)
    fleet.acquired("t", 2, 0.0, 0.0, 0.0)
    assert Renew("s", 1) in fleet.tick(RENEW_AT)
    # a member joins that "s" prefers and "t" does not: "s" is handed over with its renew still unanswered
    other = next(
        name
        for name in (f"b{i}" for i in range(200))
        if preferred_owner("s", ["a", name]) == name and preferred_owner("t", ["a", name]) == "a"
    )
    members = {**me(fleet), other: Member(other, f"{other}#1", frozenset({"s", "t"}))}
    holders = {"s": Holder("a", "a#1", revision=1), "t": Holder("a", "a#1", revision=2)}
    assert StopSource("s", graceful=True) in fleet.viewed(View(members=members, holders=holders), NOW, NOW)
    at(fleet, LeaseState.DRAINING_RENEWING)
    assert fleet.source_stopped("s", NOW) == []  # the delete waits for the renew in flight: it moves the revision
    assert fleet.renewed("s", 2, RENEW_AT, NOW) == [Release("s", 2)]  # on the revision the renew wrote
    fleet.released("s", True, "", NOW)
    assert fleet.renewed("s", 2, RENEW_AT, NOW) == []  # a reply again (a duplicate): for nothing now
    # the other member goes away: "s" comes back to this process in a new term
    later = NOW + 0.5
    view = View(members=me(fleet), holders={"t": holders["t"]}, free={"s": 3})
    assert labels(fleet.viewed(view, later, later)) == [Acquire("s", 3)]
    fleet.acquired("s", 4, later, 0.0, later)
    assert Renew("s", 4) in fleet.tick(later + RENEW_AT)  # due on time: no stale renew holds it back
    assert fleet.renewed("s", 5, later + RENEW_AT, later + RENEW_AT + 0.1) == []
    assert fleet.leases["s"].revision == 5  # and its reply counts


@pytest.mark.parametrize("state", list(LeaseState))
def test_what_status_shows_for_each_state(state: LeaseState) -> None:
    fleet = drive(state)
    lease = fleet.leases["s"]
    assert lease.public_state == PUBLIC_STATE[state]
    assert lease.owned is (state in OURS)
    assert fleet.owned() == (["s"] if state in OURS else [])
    assert lease.holds(NOW) is (state in SOURCE_RUNS)  # RELEASING: the delete is in flight, the fence closed


# -- suspension ---------------------------------------------------------------------------------------------------


def test_a_renew_stored_in_time_resumes_a_suspended_lease_where_it_paused() -> None:
    fleet = drive(LeaseState.SUSPENDED_RENEWING)
    lease = fleet.leases["s"]
    term, changes = lease.term, lease.changes
    assert not fleet.holds("s", NOW)
    assert labels(fleet.renewed("s", 7, SUSPENDED_AT - 0.1, NOW)) == RESUMED
    assert fleet.holds("s", NOW) and lease.revision == 7
    assert (lease.term, lease.changes) == (term, changes)  # the same term: the sources' fences open again


def test_a_renew_stored_but_answered_after_its_own_fence_leaves_the_lease_suspended_and_renews_again() -> None:
    fleet = drive(LeaseState.SUSPENDED_RENEWING)
    late = SUSPENDED_AT + FENCE + 0.1
    assert fleet.renewed("s", 7, SUSPENDED_AT, late) == []
    at(fleet, LeaseState.SUSPENDED)
    assert fleet.leases["s"].revision == 7  # the write is ours: the next renew names it
    assert labels(fleet.tick(late)) == [Renew("s", 7)]
    assert labels(fleet.renewed("s", 8, late, late + 0.2)) == RESUMED


@pytest.mark.parametrize("holder", [None, Holder("b", "b#1", revision=9)])
@pytest.mark.parametrize("state", [state for state in LeaseState if state in SUSPENDED])
def test_a_suspended_lease_whose_key_a_view_shows_gone_or_taken_is_lost(
    state: LeaseState, holder: Holder | None
) -> None:
    fleet = drive(state)
    view = View(members=me(fleet), holders={} if holder is None else {"s": holder})
    effects = labels(fleet.viewed(view, NOW, NOW))
    assert effects[:2] == ["lease.lost", StopSource("s", graceful=False)]
    assert effects[2:] == ([Acquire("s", 0)] if holder is None else [])  # gone: taken again, a new term
    assert fleet.renewed("s", 7, SUSPENDED_AT, NOW) == []  # a reply to the renew sent before: stale


def test_a_source_fenced_while_its_lease_is_suspended_starts_again_on_the_resumption() -> None:
    fleet = drive(LeaseState.SUSPENDED_RENEWING)
    assert fleet.source_fenced("s", fleet.leases["s"].term, NOW) == []
    assert labels(fleet.renewed("s", 7, SUSPENDED_AT, NOW)) == ["lease.resumed", StartSource("s")]
