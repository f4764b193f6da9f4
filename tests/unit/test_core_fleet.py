"""The fleet core (bridge/core/fleet.py): one lease's transitions, the fence, assignment, and a simulated fleet.

The simulation (tests/unit/fleet_sim.py) runs several cores against a model KV bucket with request delays and
losses, frozen processes, processes cut off from the bucket, kills and restarts, chosen by hypothesis, and checks
after every event that a process whose fence is open is the one the bucket names; then it heals everything and
checks that every source ends owned by exactly one live process, its preferred one.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.effects import Notice
from bridge.core.fleet import (
    VIEW_KEYS_PER_SECOND,
    Acquire,
    Fence,
    Fleet,
    FleetEffect,
    Holder,
    LeaseState,
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
    _renew_spread,
    bounded_assignment,
    preference_order,
    preferred_owner,
    unit_of,
)
from bridge.testing.engines import examples
from tests.unit.fleet_sim import FleetSim

TTL = 3.0
TIMING = LeaseTiming(TTL)


def kinds(effects: list[FleetEffect]) -> list[type]:
    return [type(e) for e in effects if not isinstance(e, Notice)]


def joined(instance: str = "a", sources: tuple[str, ...] = ("s",), now: float = 0.0) -> Fleet:
    """A fleet core that has written its presence (a join wait ago) and may decide."""
    fleet = Fleet(instance, f"{instance}#1", sources, TIMING, now)
    effects = fleet.tick(now)
    assert kinds(effects) == [WritePresence, ReadView]
    fleet.presence_written(now - TIMING.join_wait)
    return fleet


def me(fleet: Fleet) -> dict[str, Member]:
    member = Member(fleet.instance, fleet.incarnation, frozenset(fleet.units), lease_groups=fleet.groups)
    return {fleet.instance: member}


def own(fleet: Fleet, source: str = "s", now: float = 0.0, revision: int = 1) -> None:
    effects = fleet.viewed(View(members=me(fleet)), now, now)
    assert Acquire(source, 0) in effects
    assert StartSource(source) in fleet.acquired(source, revision, now, 0.0, now)


def test_a_free_preferred_source_is_acquired_and_started_under_the_fence() -> None:
    fleet = joined()
    own(fleet, now=0.0)
    assert fleet.holds("s", 0.0)
    assert fleet.holds("s", TTL - TIMING.guard - 0.01)
    assert not fleet.holds("s", TTL - TIMING.guard)


def test_nothing_is_acquired_before_the_presence_is_written() -> None:
    fleet = Fleet("a", "a#1", ["s"], TIMING, 0.0)
    fleet.tick(0.0)
    assert kinds(fleet.viewed(View(), 0.0, 0.0)) == []


def test_a_renew_moves_the_fence_from_its_send_time() -> None:
    fleet = joined()
    own(fleet)
    due = TIMING.renew_every
    assert Renew("s", 1) in fleet.tick(due)
    assert not any(isinstance(e, Renew) for e in fleet.tick(due + 0.01))  # one renew at a time
    fleet.renewed("s", 2, due, due + 0.5)
    assert fleet.holds("s", due + TTL - TIMING.guard - 0.01)
    assert fleet.leases["s"].revision == 2


def test_the_fence_closing_before_a_renew_succeeds_suspends_the_lease_and_stops_nothing() -> None:
    fleet = joined()
    own(fleet)
    fleet.tick(TIMING.renew_every)
    fleet.renew_failed("s", "timeout", False, TIMING.renew_every + 0.2)
    fence = TTL - TIMING.guard
    effects = fleet.tick(fence)
    assert [e.event for e in effects if isinstance(e, Notice)] == ["lease.suspended"]
    assert not any(isinstance(e, StopSource) for e in effects)
    (renew,) = [e for e in effects if isinstance(e, Renew)]  # at once, waiting a TTL for its reply
    assert renew.timeout == pytest.approx(TTL)
    assert fleet.leases["s"].public_state == "suspended"
    assert not fleet.holds("s", fence)
    assert fleet.owned() == ["s"]
    # the renew was refused: the key is someone else's (or expired) now, the source is dropped
    effects = fleet.renew_failed("s", "wrong last sequence", True, fence + 1.0)
    assert StopSource("s", graceful=False) in effects
    assert fleet.leases["s"].state is LeaseState.STANDBY


def test_a_refused_renew_loses_the_lease_at_once() -> None:
    fleet = joined()
    own(fleet)
    fleet.tick(TIMING.renew_every)
    effects = fleet.renew_failed("s", "wrong last sequence", True, TIMING.renew_every)
    assert StopSource("s", graceful=False) in effects
    assert not fleet.holds("s", TIMING.renew_every)


def test_a_refused_renew_of_our_own_stored_write_keeps_the_lease_and_the_old_fence() -> None:
    fleet = joined()
    own(fleet)
    fleet.tick(TIMING.renew_every)
    fence = fleet.leases["s"].valid_until
    assert fleet.renew_adopted("s", 7, TIMING.renew_every + 0.5) == []
    assert fleet.leases["s"].revision == 7 and fleet.leases["s"].valid_until == fence
    assert Renew("s", 7) in fleet.tick(TIMING.renew_every + 0.6)


def test_a_late_reply_for_a_lease_given_up_changes_nothing() -> None:
    fleet = joined()
    own(fleet)
    fleet.tick(TIMING.renew_every)
    fleet.renew_failed("s", "x", True, TIMING.renew_every)
    assert fleet.renewed("s", 9, TIMING.renew_every, TIMING.renew_every + 0.1) == []
    assert not fleet.holds("s", TIMING.renew_every + 0.1)
    assert fleet.acquired("s", 9, 0.0, 0.0, 1.0) == []  # not acquiring


def test_an_acquisition_whose_reply_comes_after_its_fence_is_not_acted_on() -> None:
    fleet = joined()
    fleet.viewed(View(members=me(fleet)), 0.0, 0.0)
    effects = fleet.acquired("s", 1, 0.0, 0.0, TTL)
    assert StartSource("s") not in effects and StopSource("s", graceful=False) in effects


def test_a_held_source_is_left_alone_and_taken_once_freed() -> None:
    fleet = joined()
    other = Holder("b", "b#1", revision=4)
    assert kinds(fleet.viewed(View(members=me(fleet), holders={"s": other}), 0.0, 0.0)) == []
    # released by b: a delete marker at revision 5, which the create must name
    assert Acquire("s", 5) in fleet.viewed(View(members=me(fleet), free={"s": 5}), 1.0, 1.0)


def test_our_own_key_is_taken_back_on_its_revision() -> None:
    fleet = joined()
    mine = Holder("a", "a#1", revision=12)
    assert Acquire("s", 12) in fleet.viewed(View(members=me(fleet), holders={"s": mine}), 0.0, 0.0)


def test_an_orphan_is_taken_by_a_non_preferred_member_after_a_ttl() -> None:
    sources = tuple(f"s{i}" for i in range(20))
    fleet = joined("a", sources)
    members = {**me(fleet), "b": Member("b", "b#1", frozenset(sources))}
    assigned = bounded_assignment(dict.fromkeys(sources, ("a", "b")))
    theirs = [s for s in sources if assigned[s] == "b"]
    assert len(theirs) == 10  # bounded loads: half each
    first = fleet.viewed(View(members=members), 0.0, 0.0)
    assert not any(isinstance(e, Acquire) and e.lease in theirs for e in first)
    later = fleet.viewed(View(members=members), TTL, TTL)
    assert {e.lease for e in later if isinstance(e, Acquire)} == set(theirs)


def test_an_orphan_goes_to_the_next_in_line_first_then_further_down_after_each_ttl() -> None:
    """A member died, its presence not expired yet (it outlives the leases by up to a renew period): its sources
    are free and nobody preferred takes them. After a TTL only each source's second choice may; a third choice only
    after two. So the member preferred once the presence expires takes each, and nothing moves again."""
    sources = tuple(f"s{i}" for i in range(40))
    members = {name: Member(name, f"{name}#1", frozenset(sources)) for name in ("dead", "a", "b")}
    order = {s: preference_order(s, members) for s in sources}
    second = {s for s in sources if order[s][0] == "dead" and order[s][1] == "a"}
    third = {s for s in sources if order[s][0] == "dead" and order[s][2] == "a"}
    assert second and third
    fleet = joined("a", sources)
    assert not {e.lease for e in fleet.viewed(View(members=members), 0.0, 0.0) if isinstance(e, Acquire)} & (
        second | third
    )
    taken = {e.lease for e in fleet.viewed(View(members=members), TTL, TTL) if isinstance(e, Acquire)}
    assert taken & (second | third) == second  # as next in line only
    for source in second:
        fleet.acquire_failed(source, "b took it", TTL)  # (as b would, for its own)
    taken = {e.lease for e in fleet.viewed(View(members=members), 2 * TTL, 2 * TTL) if isinstance(e, Acquire)}
    assert third <= taken  # and now as third in line too


def test_an_owner_at_its_fair_share_keeps_its_source_when_a_preferred_member_joins() -> None:
    fleet = joined("a", ("s",))
    own(fleet)
    other = next(f"b{i}" for i in range(100) if preferred_owner("s", ["a", f"b{i}"]) != "a")
    members = {**me(fleet), other: Member(other, f"{other}#1", frozenset({"s"}))}
    assert kinds(fleet.viewed(View(members=members, holders={"s": Holder("a", "a#1", revision=1)}), 0.5, 0.5)) == []
    assert fleet.holds("s", 0.6)


def test_an_owner_above_its_fair_share_hands_a_source_over_to_its_preferred_member_gracefully() -> None:
    fleet = joined("a", ("s", "t"))
    fleet.viewed(View(members=me(fleet)), 0.0, 0.0)
    fleet.acquired("s", 1, 0.0, 0.0, 0.0)
    fleet.acquired("t", 2, 0.0, 0.0, 0.0)
    other = next(
        f"b{i}"
        for i in range(200)
        if preferred_owner("s", ["a", f"b{i}"]) != "a" == preferred_owner("t", ["a", f"b{i}"])
    )
    members = {**me(fleet), other: Member(other, f"{other}#1", frozenset({"s", "t"}))}
    holders = {"s": Holder("a", "a#1", revision=1), "t": Holder("a", "a#1", revision=2)}
    effects = fleet.viewed(View(members=members, holders=holders), 0.5, 0.5)
    assert StopSource("s", graceful=True) in effects and StopSource("t", graceful=True) not in effects
    assert fleet.holds("s", 0.6)  # draining: still answering what is stored
    assert fleet.source_stopped("s", 0.8) == [Release("s", 1)]
    assert not fleet.holds("s", 0.8)  # the delete may land any moment: the fence closes when it is sent
    fleet.released("s", True, "", 0.9)
    assert fleet.leases["s"].state is LeaseState.STANDBY
    # it does not take it back while the preferred member is live
    assert kinds(fleet.viewed(View(members=members, holders={"t": holders["t"]}, free={"s": 3}), 1.0, 1.0)) == []


def test_a_member_that_does_not_serve_a_source_is_not_its_preferred_owner() -> None:
    fleet = joined("a", ("s",))
    members = {name: Member(name, f"{name}#1", frozenset({"other"})) for name in ("b", "c", "d")}
    assert any(preferred_owner("s", ["a", name]) != "a" for name in members)  # one of them would win on weight
    effects = fleet.viewed(View(members={**members, **me(fleet)}), 0.0, 0.0)
    assert fleet.preferred("s") == "a"
    assert Acquire("s", 0) in effects


def test_shutdown_drains_then_releases_and_takes_nothing_more() -> None:
    fleet = joined("a", ("s", "t"))
    own(fleet, "s")
    effects = fleet.shutdown(0.1)
    assert StopSource("s", graceful=True) in effects
    assert not fleet.done
    assert fleet.source_stopped("s", 0.2) == [Release("s", 1)]
    fleet.released("s", True, "", 0.3)
    assert not fleet.done  # "t" was being acquired when the shutdown came: it lands, and is given back unstarted
    landed = fleet.acquired("t", 3, 0.0, 0.0, 0.35)
    assert StartSource("t") not in landed and StopSource("t", graceful=True) in landed
    fleet.source_stopped("t", 0.36)
    fleet.released("t", True, "", 0.37)
    assert fleet.done
    assert kinds(fleet.viewed(View(members=me(fleet)), 0.4, 0.4)) == []


def test_a_removed_source_is_handed_over_and_forgotten() -> None:
    fleet = joined("a", ("s", "t"))
    own(fleet, "s")
    effects = fleet.set_sources(["t"], 0.1)
    assert StopSource("s", graceful=True) in effects
    fleet.source_stopped("s", 0.2)
    fleet.released("s", True, "", 0.3)
    assert "s" not in fleet.leases and fleet.configured == ["t"]


def test_a_fence_closes_for_good_once_its_source_is_removed_even_when_the_source_is_added_again() -> None:
    fleet = joined("a", ("s", "t"))
    own(fleet, "s")
    now = [0.05]
    fence = Fence(fleet, "s", fleet.lease_of("s"), lambda: now[0])
    assert fence() and fence()  # the second call takes the look-up it cached
    fleet.set_sources(["t"], 0.1)
    fleet.source_stopped("s", 0.2)
    fleet.released("s", True, "", 0.3)
    now[0] = 0.4
    assert not fence()
    fleet.set_sources(["s", "t"], 0.5)
    own(fleet, "s", now=0.6, revision=3)  # a new lease for the same name, in the same term number
    now[0] = 0.7
    successor = fleet.lease_of("s")
    assert fleet.holds("s", 0.7) and successor is not None and successor.term == fence.term
    assert not fence()  # bound to the lease that was given up, never to its successor


def test_rendezvous_spreads_sources_and_moves_only_the_joiners_share() -> None:
    sources = [f"src-{i}" for i in range(600)]
    three = {s: preferred_owner(s, ["p1", "p2", "p3"]) for s in sources}
    counts = Counter(three.values())
    assert all(150 <= n <= 250 for n in counts.values()), counts
    four = {s: preferred_owner(s, ["p1", "p2", "p3", "p4"]) for s in sources}
    moved = [s for s in sources if three[s] != four[s]]
    assert all(four[s] == "p4" for s in moved)  # sticky: only what the newcomer wins moves
    assert 100 <= len(moved) <= 200


# -- the simulated fleet ------------------------------------------------------------------------------------------

ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["run", "run", "run", "freeze", "cut", "kill", "lossy", "calm", "shutdown"]),
        st.integers(0, 2),
        st.floats(0.1, 3.0),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=examples(150))
@given(actions=ACTIONS, seed=st.integers(0, 2**16), groups=st.sampled_from([0, 0, 2, 3]))
def test_the_fence_never_lets_two_processes_act_and_the_fleet_settles(
    actions: list[tuple[str, int, float]], seed: int, groups: int
) -> None:
    """Per source (``groups`` 0) and per group of sources (2 or 3 groups over 5 sources)."""
    instances = ["p0", "p1", "p2"]
    sim = FleetSim([f"s{i}" for i in range(5)], instances, TTL, random.Random(seed), groups)
    sim.run_for(1.0)
    for action, which, amount in actions:
        instance = instances[which]
        proc = sim.procs[instance]
        if action == "freeze" and proc.alive:
            sim.freeze(instance, amount * TTL)  # up to three TTLs: a VM pause
        elif action == "cut" and proc.alive:
            sim.cut(instance, amount * TTL)
        elif action == "kill" and proc.alive:
            sim.kill(instance)
        elif action == "shutdown" and proc.alive:
            sim.shutdown(instance)
        elif action == "lossy":
            sim.lossy = min(0.5, amount / 6)
        elif action == "calm":
            sim.lossy = 0.0
        if not proc.alive or proc.fleet.done:
            sim.run_for(0.3)
            sim.restart(instance)
        sim.run_for(amount)  # check() runs after every event
    # heal: nothing lost on the way, every frozen process awake, every process that left started again
    sim.lossy = 0.0
    sim.run_for(3 * TTL)
    for instance in instances:
        proc = sim.procs[instance]
        if not proc.alive or proc.fleet.stopping:
            sim.restart(instance)
    sim.run_for(5 * TTL)
    owners = sim.owners()
    assert all(len(v) == 1 for v in owners.values()), (owners, sim.trace[-40:])
    # balanced: nobody owns more leases than its fair share, or than the leases that prefer it
    units = {unit_of(s, groups): owners[s][0] for s in sim.sources}
    fair = -(-len(units) // len(instances))
    owned = Counter(units.values())
    for instance in instances:
        preferring = sum(1 for unit in units if preferred_owner(unit, instances) == instance)
        assert owned[instance] <= max(fair, preferring), (owned, sim.trace[-40:])


def test_a_frozen_owner_wakes_fenced_while_its_successor_owns() -> None:
    sim = FleetSim(["s"], ["p0", "p1"], TTL, random.Random(1))
    sim.run_for(2.0)
    (owner,) = sim.owners()["s"]
    other = "p1" if owner == "p0" else "p0"
    sim.freeze(owner, 2 * TTL)
    sim.run_for(2 * TTL - 0.1)
    assert sim.owners()["s"] == [owner, other] or sim.owners()["s"] == [other, owner]  # the frozen one never noticed
    assert sim.procs[other].fleet.holds("s", sim.now)
    assert not sim.procs[owner].fleet.holds("s", sim.now)  # what it would check before acting on waking
    sim.run_for(3 * TTL)
    assert sim.owners()["s"] == [other]  # sticky: the woken process rejoins as a standby


@pytest.mark.parametrize("seed", range(8))
def test_a_bucket_that_stalls_past_the_fences_suspends_the_leases_and_the_first_renew_in_time_resumes_them(
    seed: int,
) -> None:
    """A starved hub: the bucket serves nothing for 1.8 s (a 3 s TTL: the fences of the leases renewed last more
    than 0.6 s before close meanwhile), then everything queued. Nothing is lost or set up again: those leases are
    suspended, the standby takes nothing (the keys never expired), and the renews served after the stall resume
    every source where it paused (the simulator checks nobody else acted on a source in between)."""
    sim = FleetSim([f"s{i}" for i in range(12)], ["p0", "p1"], TTL, random.Random(seed))
    sim.run_for(3.0)
    before = sim.owners()
    assert all(len(owners) == 1 for owners in before.values())
    started = sim.takeovers
    sim.fenced_anyway = 0.0  # every source waits at its fence, as the runtime's do
    sim.stall(1.8)
    sim.run_for(1.8)
    suspended = [
        name
        for name in sim.sources
        if sim.state(before[name][0], name) in {LeaseState.SUSPENDED, LeaseState.SUSPENDED_RENEWING}
    ]
    assert suspended, sim.trace[-20:]
    sim.run_for(TTL)
    assert sim.owners() == before
    assert sim.takeovers == started, sim.trace[-40:]  # no source was started again
    assert sim.resumptions >= len(suspended)
    assert all(sim.procs[before[name][0]].fleet.holds(name, sim.now) for name in sim.sources)


def test_failing_renews_are_logged_on_the_first_and_every_fifth() -> None:
    timing = LeaseTiming(30.0)  # a long fence: seven failures fit before it closes
    fleet = Fleet("a", "a#1", ["s"], timing, 0.0)
    fleet.tick(0.0)
    fleet.presence_written(-timing.join_wait)
    fleet.viewed(View(members=me(fleet)), 0.0, 0.0)
    fleet.acquired("s", 1, 0.0, 0.0, 0.0)
    now, logged = timing.renew_every, []
    for _ in range(7):
        assert any(isinstance(e, Renew) for e in fleet.tick(now)), "a failed renew is retried"
        notices = [e for e in fleet.renew_failed("s", "timeout", False, now) if isinstance(e, Notice)]
        logged += [n.fields["failures"] for n in notices]
        now += 1.01
    assert fleet.holds("s", now) and logged == [1, 6]


def test_a_renew_waits_for_its_reply_until_the_fence() -> None:
    """A late reply still moves the fence (counted from the send time): the renew is not given up before it."""
    fleet = joined()
    own(fleet)
    due = TIMING.renew_every
    (renew,) = [e for e in fleet.tick(due) if isinstance(e, Renew)]
    fence = TTL - TIMING.guard
    assert renew.timeout == pytest.approx(fence - due)
    fleet.renewed("s", 2, due, fence - 0.01)  # the reply, just before the fence
    assert fleet.holds("s", fence + 0.5)  # moved to due + ttl - guard


def renew_retried_near_the_fence(fleet: Fleet) -> tuple[int, float, float]:
    """``s`` owned, its renew failed once and retried: the retry is in flight. Returns the lease's term, the
    retry's send time and the fence (which no reply has moved yet)."""
    own(fleet)
    term = fleet.leases["s"].term
    due = TIMING.renew_every
    fleet.tick(due)
    fleet.renew_failed("s", "outbound buffer limit exceeded", False, due + 0.1)
    retry = due + 0.5
    assert Renew("s", 1) in fleet.tick(retry)
    return term, retry, TTL - TIMING.guard


def test_a_source_that_found_its_fence_closed_before_a_late_renew_moved_it_is_started_again() -> None:
    """Seen in a chaos run: the renews failed while the bucket's server was down, the one sent after it came back
    was answered just after the fence had passed; the source had found the fence closed at an action in between
    and stopped itself, and the fleet, its lease kept, never started it again (replication stopped for good)."""
    fleet = joined()
    term, retry, fence = renew_retried_near_the_fence(fleet)
    # the source acts just past the fence: closed, it stops itself; the renew's reply comes a moment later
    assert not fleet.holds("s", fence + 0.001)
    assert fleet.renewed("s", 2, retry, fence + 0.002) == []
    effects = fleet.source_fenced("s", term, fence + 0.003)
    assert kinds(effects) == [StartSource]
    (notice,) = [e for e in effects if isinstance(e, Notice)]
    assert notice.event == "source.restarted" and notice.level == "warning"
    assert fleet.holds("s", fence + 0.003) and fleet.leases["s"].term == term
    # a report from an earlier term changes nothing
    assert fleet.source_fenced("s", term - 1, fence + 0.004) == []


def test_a_source_fenced_before_the_late_renew_is_taken_suspends_the_lease_and_starts_again_on_the_reply() -> None:
    """The other order: the report reaches the fleet before the renew's reply. The fence has passed, so the lease
    is suspended then (the ticker would do the same a moment later), and the reply, stored in time, resumes it:
    the source that stopped itself starts again in the same term."""
    fleet = joined()
    term, retry, fence = renew_retried_near_the_fence(fleet)
    effects = fleet.source_fenced("s", term, fence + 0.001)
    assert [e.event for e in effects if isinstance(e, Notice)] == ["lease.suspended"]
    assert fleet.leases["s"].state is LeaseState.SUSPENDED_RENEWING
    assert fleet.source_fenced("s", term, fence + 0.0015) == []  # a second report of that term: nothing
    effects = fleet.renewed("s", 2, retry, fence + 0.002)
    assert kinds(effects) == [StartSource]
    assert fleet.holds("s", fence + 0.002) and fleet.leases["s"].term == term


def test_a_source_fenced_while_its_lease_is_handed_over_is_not_started_again() -> None:
    fleet = joined()
    own(fleet)
    term = fleet.leases["s"].term
    fleet.shutdown(0.5)
    assert fleet.leases["s"].state is LeaseState.DRAINING
    assert fleet.source_fenced("s", term, 0.6) == []


@pytest.mark.parametrize(("keys", "next_view"), [(10, TIMING.view_every), (300, 0.6), (5000, TIMING.renew_every)])
def test_views_of_a_big_bucket_are_spaced_out_up_to_a_renew_period(keys: int, next_view: float) -> None:
    """A view reads every key: past VIEW_KEYS_PER_SECOND keys a second the next view waits, at most a renew period."""
    assert VIEW_KEYS_PER_SECOND == 500
    fleet = joined()  # its first ReadView went out at 0
    fleet.viewed(View(members=me(fleet), free={f"x{i}": i + 1 for i in range(keys - 1)}), 0.0, 0.0)
    assert ReadView() not in fleet.tick(next_view - 0.01)
    assert ReadView() in fleet.tick(next_view)


def test_a_renew_is_due_on_time_after_a_quiet_spell_of_ticks() -> None:
    """Ticks skip the leases until the earliest renew or fence: every input that moves one of those is seen."""
    fleet = joined()
    own(fleet)
    for step in range(1, 30):  # ticks with nothing due
        assert not any(isinstance(e, Renew) for e in fleet.tick(step * 0.03))
    due = TIMING.renew_every * (1.0 - _renew_spread("s"))
    assert Renew("s", 1) in fleet.tick(due)
    fleet.renew_failed("s", "timeout", False, due + 0.1)
    retry = due + 0.1 + min(1.0, TIMING.renew_every / 3)
    assert not any(isinstance(e, Renew) for e in fleet.tick(retry - 0.01))
    assert Renew("s", 1) in fleet.tick(retry)


FLEET_SIM_SOURCES = int(os.environ.get("FLEET_SIM_SOURCES", "1500"))


def settle_started_apart(sim: FleetSim, check: Callable[[], None]) -> float:
    """Start p1 and p2 two and four seconds after ``sim``'s p0 and run, checking safety every quarter second, until
    every source has one owner and no process more than 10 % above its share: when that was (within 60 s)."""
    while sim.now < 60.0:
        sim.run_for(0.25)
        check()
        for instance in ("p1", "p2"):
            if instance not in sim.procs and sim.now >= 2.0 * int(instance[1]):
                sim.start(instance)
        counts = [len(proc.running) for proc in sim.procs.values()]
        one_each = all(len(o) == 1 for o in sim.owners().values())
        if len(counts) == 3 and one_each and max(counts) <= 1.1 * len(sim.sources) / 3:
            return sim.now
    raise AssertionError({name: len(proc.running) for name, proc in sim.procs.items()})


def test_three_processes_started_apart_settle_to_one_owner_each_balanced() -> None:
    """Issue 25's scale: three processes sharing the sources, started two seconds apart (a rolling start), settle to
    one owner per source, each process within 10 % of its share, well within 30 s of the last start. CI runs 1,500
    sources; ``FLEET_SIM_SOURCES=10000`` gives the figure for 10,000 (about 100 s of wall time). The safety check
    runs every quarter second here rather than after every event (it costs every source per check)."""
    sources = [f"s{i:05d}" for i in range(FLEET_SIM_SOURCES)]
    sim = FleetSim(sources, ["p0"], 10.0, random.Random(1))
    check, sim.check = sim.check, lambda: None  # type: ignore[method-assign]
    settled_at = settle_started_apart(sim, check)
    print(f"{len(sources)} sources: settled {settled_at - 4.0:.2f} s after the last start")
    assert settled_at - 4.0 < 30.0


def test_ten_thousand_sources_in_lease_groups_settle_balanced_with_a_write_rate_that_does_not_grow() -> None:
    """Issue 25, point 5, with the default lease groups: three processes sharing 10,000 sources started two seconds
    apart settle to one owner per source, each within 10 % of its share, within 30 s of the last start; the bucket
    sees one key per group, so the renewals' writes stay near groups / (ttl / 3) a second (each lease renews up to a
    quarter early: 128 groups at a 10 s TTL are about 44), not the 3,300 of one lease per source. The safety check
    runs every quarter second."""
    sources = [f"site-{i:05d}" for i in range(10_000)]
    sim = FleetSim(sources, ["p0"], 10.0, random.Random(2), groups=128)
    check, sim.check = sim.check, lambda: None  # type: ignore[method-assign]
    settled_at = settle_started_apart(sim, check)
    assert settled_at - 4.0 < 30.0
    lease_keys = [key for key in sim.kv.live(sim.now) if not key.startswith("presence.")]
    assert 120 <= len(lease_keys) <= 128
    before = sim.kv.seq
    sim.run_for(30.0)
    check()
    writes_per_second = (sim.kv.seq - before) / 30.0  # renewals and presence, settled
    earliest_renew = 0.75 * 10.0 / 3
    assert writes_per_second <= (128 + 3) / earliest_renew, writes_per_second


def grouped(sources: tuple[str, ...], groups: int, instance: str = "a") -> Fleet:
    fleet = Fleet(instance, f"{instance}#1", sources, TIMING, 0.0, groups)
    fleet.tick(0.0)
    fleet.presence_written(-TIMING.join_wait)
    return fleet


def two_in_one_group(groups: int) -> tuple[str, str, str]:
    """Two source names that share a group and a third in another."""
    names = [f"site-{i}" for i in range(50)]
    first = names[0]
    mate = next(n for n in names[1:] if unit_of(n, groups) == unit_of(first, groups))
    other = next(n for n in names[1:] if unit_of(n, groups) != unit_of(first, groups))
    return first, mate, other


def test_a_group_lease_starts_hands_over_and_releases_its_sources_together() -> None:
    s, t, u = two_in_one_group(4)
    fleet = grouped((s, t, u), 4)
    group = unit_of(s, 4)
    assert set(fleet.units) == {group, unit_of(u, 4)} and fleet.key_prefix == "group."
    assert Acquire(group, 0) in fleet.viewed(View(members=me(fleet)), 0.0, 0.0)
    started = fleet.acquired(group, 1, 0.0, 0.0, 0.0)
    assert [e for e in started if isinstance(e, StartSource)] == [StartSource(s), StartSource(t)]
    assert fleet.holds(s, 0.1) and fleet.holds(t, 0.1) and not fleet.holds(u, 0.1)
    handing = fleet.shutdown(0.2)
    assert {e for e in handing if isinstance(e, StopSource)} == {StopSource(s, True), StopSource(t, True)}
    assert fleet.source_stopped(s, 0.3) == []  # t still drains: the key stays ours
    assert fleet.holds(t, 0.3)
    assert fleet.source_stopped(t, 0.4) == [Release(group, 1)]
    assert not fleet.holds(s, 0.4)


def owned_group() -> tuple[Fleet, str, str, str]:
    """A fleet core that acquired, at 0, the one group of its two sources: (fleet, source, source, group)."""
    s, t, _ = two_in_one_group(4)
    fleet = grouped((s, t), 4)
    group = unit_of(s, 4)
    fleet.viewed(View(members=me(fleet)), 0.0, 0.0)
    fleet.acquired(group, 1, 0.0, 0.0, 0.0)
    return fleet, s, t, group


def test_a_lost_group_lease_drops_every_source_at_once() -> None:
    fleet, s, t, group = owned_group()
    fleet.tick(TIMING.renew_every)
    effects = fleet.renew_failed(group, "wrong last sequence", True, TIMING.renew_every + 0.1)
    assert {e for e in effects if isinstance(e, StopSource)} == {StopSource(s, False), StopSource(t, False)}
    assert [e.fields["group"] for e in effects if isinstance(e, Notice) and e.event == "lease.lost"] == [group]


def test_a_suspended_group_lease_pauses_every_source_and_resumes_them_together() -> None:
    fleet, s, t, group = owned_group()
    due = TIMING.renew_every
    assert Renew(group, 1) in fleet.tick(due)  # unanswered when the fence passes
    fence = TTL - TIMING.guard
    assert not any(isinstance(e, StopSource) for e in fleet.tick(fence))  # suspended: nothing stops
    assert not fleet.holds(s, fence) and not fleet.holds(t, fence)
    effects = fleet.renewed(group, 2, due, fence + 0.5)  # stored, answered late but within its own fence
    assert {e for e in effects if isinstance(e, ResumeSource)} == {ResumeSource(s), ResumeSource(t)}
    assert fleet.holds(s, fence + 0.5) and fleet.holds(t, fence + 0.5)


def test_a_reload_starts_a_source_added_to_a_group_of_ours_and_drains_one_removed_without_releasing() -> None:
    s, t, _ = two_in_one_group(4)
    fleet = grouped((s,), 4)
    group = unit_of(s, 4)
    fleet.viewed(View(members=me(fleet)), 0.0, 0.0)
    fleet.acquired(group, 1, 0.0, 0.0, 0.0)
    assert fleet.set_sources([s, t], 0.5) == [StartSource(t)]
    assert fleet.set_sources([t], 0.6) == [StopSource(s, graceful=True)]
    assert fleet.holds(s, 0.65)  # draining: it still answers what is stored
    assert fleet.source_stopped(s, 0.7) == []  # the group stays ours: t runs on
    assert fleet.holds(t, 0.7) and fleet.leases[group].state is LeaseState.OWNED


def test_a_member_leasing_with_other_groups_stops_every_acquisition_and_says_why() -> None:
    fleet = grouped(("s", "t"), 8)
    old = Member("old", "old#1", frozenset({"s", "t"}))  # a version before lease groups: per source, no field
    effects = fleet.viewed(View(members={**me(fleet), "old": old}), 0.0, 0.0)
    assert kinds(effects) == []
    (notice,) = [e for e in effects if isinstance(e, Notice)]
    assert notice.event == "fleet.mixed_lease_groups" and notice.fields["members"] == ["old"]
    assert "coordination.lease_groups" in str(notice.fields["hint"])
    assert fleet.viewed(View(members={**me(fleet), "old": old}), 1.0, 1.0) == []  # said once, not every view
    assert any(isinstance(e, Acquire) for e in fleet.viewed(View(members=me(fleet)), 2.0, 2.0))  # gone: go on


def test_a_group_waits_while_one_of_its_sources_has_a_live_per_source_lease() -> None:
    s, t, _ = two_in_one_group(4)
    fleet = grouped((s, t), 4)
    holders = {t: Holder("old", "old#1", revision=3)}  # its presence expired before its lease key
    assert kinds(fleet.viewed(View(members=me(fleet), holders=holders), 0.0, 0.0)) == []
    assert Acquire(unit_of(s, 4), 0) in fleet.viewed(View(members=me(fleet)), 1.0, 1.0)


@pytest.mark.parametrize("first_groups", [0, 16])
def test_processes_with_different_lease_groups_never_both_act(first_groups: int) -> None:
    """A process of the other scheme joins a running one: it takes nothing while the first lives, and everything
    once it is gone; the simulator checks after every event that no source has two processes able to act."""
    sources = [f"s{i}" for i in range(12)]
    sim = FleetSim(sources, ["p0"], TTL, random.Random(3), groups=first_groups)
    sim.run_for(2.0)
    assert all(owners == ["p0"] for owners in sim.owners().values())
    sim.groups = 16 - first_groups
    sim.start("p1")
    sim.run_for(3 * TTL)
    assert all(owners == ["p0"] for owners in sim.owners().values())
    assert not sim.procs["p1"].running
    sim.kill("p0")
    sim.run_for(3 * TTL)
    assert all(owners == ["p1"] for owners in sim.owners().values())


def test_processes_started_together_each_take_only_their_share() -> None:
    """Three processes write their presence within one join wait of each other and every lease is free. A view
    read before the others' presence is there decides nothing (without the wait the first process took all 30 and
    handed two thirds over a moment later); the first view that may decide sees all three, so each acquires exactly
    the leases it is preferred for."""
    sources = tuple(f"s{i}" for i in range(30))
    fleets = [Fleet(name, f"{name}#1", sources, TIMING, 0.0) for name in "abc"]
    for i, fleet in enumerate(fleets):
        fleet.tick(0.0)
        fleet.presence_written(0.05 * i)
    early = fleets[0].viewed(View(members=me(fleets[0])), 0.01, 0.01)
    assert not [e for e in early if isinstance(e, Acquire)]
    members = {name: member for fleet in fleets for name, member in me(fleet).items()}
    later = 0.1 + TIMING.join_wait
    taken = {
        fleet.instance: {e.lease for e in fleet.viewed(View(members=members), later, later) if isinstance(e, Acquire)}
        for fleet in fleets
    }
    assert sorted(s for leases in taken.values() for s in leases) == sorted(sources)  # each once
    assigned = bounded_assignment(dict.fromkeys(sources, "abc"))
    for instance, leases in taken.items():
        assert leases == {s for s in sources if assigned[s] == instance}
        assert len(leases) == 10  # an even share, which rendezvous hashing alone does not give


def test_bounded_assignment_evens_the_shares_and_moves_little_when_a_member_joins() -> None:
    """128 groups over three members: rendezvous hashing alone prefers them 46 / 41 / 41 for these names (48 / 48 /
    32 for the bench's); bounded loads give 43 / 43 / 42. A fourth member joining takes its share (32), and few
    others move (2 here)."""
    groups = [str(i) for i in range(128)]
    plain = Counter(preferred_owner(g, ["p0", "p1", "p2"]) for g in groups)
    three = bounded_assignment(dict.fromkeys(groups, ("p0", "p1", "p2")))
    assert sorted(Counter(three.values()).values()) == [42, 43, 43]
    assert max(plain.values()) - min(plain.values()) > 1  # what rendezvous alone gives here
    four = bounded_assignment(dict.fromkeys(groups, ("p0", "p1", "p2", "p3")))
    assert sorted(Counter(four.values()).values()) == [32, 32, 32, 32]
    moved = sum(1 for g in groups if four[g] != three[g] and four[g] != "p3")
    assert moved <= 16, moved  # the newcomer's 32 plus a few knock-on moves, not a reshuffle


def test_next_tick_is_never_later_than_a_tick_with_something_to_do() -> None:
    """The runtime sleeps until ``next_tick`` (bridge.runtime.fleet): a tick before it must have nothing to do, or
    a renew would leave late. Walked in steps of 10 ms over a minute of two sources' renewals, views and presence,
    every request answered at once."""
    fleet = joined(sources=("s", "t"))
    assert {Acquire("s", 0), Acquire("t", 0)} <= set(fleet.viewed(View(members=me(fleet)), 0.0, 0.0))
    fleet.acquired("s", 1, 0.0, 0.0, 0.0)
    fleet.acquired("t", 2, 0.4, 0.0, 0.4)  # answered later: the two renew at different times
    revision, now, done = 10, 0.4, 0
    while now < 60.0:
        due = fleet.next_tick()
        effects = [e for e in fleet.tick(now) if not isinstance(e, Notice)]
        if now < due:
            assert effects == [], (now, due, effects)
            now = round(now + 0.01, 2)
            continue
        for effect in effects:
            done += 1
            if isinstance(effect, Renew):
                revision += 1
                fleet.renewed(effect.lease, revision, now, now)
            elif isinstance(effect, WritePresence):
                fleet.presence_written(now)
            elif isinstance(effect, ReadView):
                fleet.viewed(View(members=me(fleet)), now, now)
        now = round(now + 0.01, 2)
    assert done > 60  # renews of both every second, the presence and the views: the walk saw them all
    assert fleet.holds("s", now) and fleet.holds("t", now)
