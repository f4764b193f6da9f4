"""The process's publishes in flight across sources (bridge/core/budget.py): pipelines sharing a ``PublishBudget`` never
have more than its limit out together (a degraded pipeline's probe aside), what does not fit waits unsent and without
an ack deadline, every way a publish stops being in flight gives its room back, and the sources that waited are woken
longest-waiting first."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.budget import FLOOR, START, PublishBudget
from bridge.core.effects import Publish
from bridge.core.engine import SourceEngine
from bridge.core.pipeline import BATCH_COMMIT_EOB, PublishPipeline
from bridge.testing.engines import SETTINGS, examples
from tests.unit.test_core_pipeline import RETRY, fill, msg, seqs


def shared(budget: PublishBudget, key: str, window: int = 8) -> PublishPipeline:
    p = PublishPipeline(window=window, ack_timeout=5.0, retry=RETRY)
    p.share_budget(budget, key)
    return p


def test_pipelines_sharing_a_budget_send_no_more_than_it_together_and_the_waiting_are_woken_in_order() -> None:
    budget = PublishBudget(3)
    a, b, c = shared(budget, "a"), shared(budget, "b"), shared(budget, "c")
    fill(a, 1, 2, 3, 4, 5)
    fill(b, 1, 2)
    fill(c, 1)
    sent_a = a.take_sendable(0.0)
    assert seqs(sent_a) == [1, 2, 3] and budget.room == 0
    assert b.take_sendable(0.0) == [] and c.take_sendable(0.0) == []
    assert budget.waiting == 3  # a still has 4 and 5, then b, then c, in the order they stopped
    assert b.next_deadline() is None  # nothing of b is in flight: no ack deadline runs while it waits
    assert a.stored(sent_a[0].entry.order, 1, 0.0) and a.stored(sent_a[1].entry.order, 1, 0.0)
    assert budget.room == 2
    assert budget.next_waiting() == "a"
    assert seqs(a.take_sendable(0.1)) == [4, 5] and budget.room == 0
    assert budget.next_waiting() == "b"
    assert b.take_sendable(0.1) == [] and budget.waiting == 2  # no room: waits again, behind c
    assert budget.next_waiting() == "c"


def test_while_sources_wait_a_busy_source_does_not_take_the_room_its_own_acks_free() -> None:
    """A busy source's acks free room that its own next publishes would take at once: while another source waits,
    the busy one waits its turn behind it."""
    budget = PublishBudget(2)
    busy, quiet = shared(budget, "busy"), shared(budget, "quiet")
    fill(busy, 1, 2)
    sent = busy.take_sendable(0.0)
    assert seqs(sent) == [1, 2] and budget.waiting == 0
    fill(quiet, 1, 2)
    assert quiet.take_sendable(0.0) == [] and budget.waiting == 1
    fill(busy, *range(3, 11))  # more for the busy one
    busy.stored(sent[0].entry.order, 1, 0.0)  # room for one
    assert busy.take_sendable(0.1) == []  # not its turn: quiet waited first
    assert budget.next_waiting() == "quiet"
    assert seqs(quiet.take_sendable(0.1)) == [1]
    budget.end_turn()
    assert budget.next_waiting() == "busy"  # then the busy one, which queued behind it


def test_every_way_out_of_flight_gives_the_room_back() -> None:
    budget = PublishBudget(10)
    p = shared(budget, "p")
    fill(p, 1, 2, 3, 4)
    sends = p.take_sendable(0.0)
    assert budget.in_flight == 4
    p.stored(sends[0].entry.order, 1, 0.0)  # stored
    p.failed(sends[1].entry.order, 1, "refused", 0.0)  # failed (refused)
    assert budget.in_flight == 2
    assert p.expire(10.0)  # timed out (ambiguous)
    assert budget.in_flight == 0
    q = shared(budget, "q")
    fill(q, 1, 2)
    q.take_sendable(20.0)
    assert budget.in_flight == 2
    q.leave_budget()  # its source stopped
    assert budget.in_flight == 0 and budget.next_waiting() is None


def test_a_source_that_stops_is_not_woken() -> None:
    budget = PublishBudget(1)
    a, b = shared(budget, "a"), shared(budget, "b")
    fill(a, 1)
    fill(b, 1)
    a.take_sendable(0.0)
    assert b.take_sendable(0.0) == [] and budget.waiting == 1
    b.leave_budget()
    assert budget.next_waiting() is None


def test_the_engine_sends_what_waited_once_woken() -> None:
    budget = PublishBudget(2)
    engines = []
    for name in ("e1", "e2"):
        engine = SourceEngine(replace(SETTINGS, source=name), 0.0)
        engine.recovered(0, (), 0.0)
        engine.reset_succeeded(1, 0.0)
        engine.pipeline.share_budget(budget, name)
        engines.append(engine)
    first, second = engines
    for engine in engines:
        for seq in (1, 2):
            engine.pipeline.add(seq, msg(seq))
    sent = [e for e in first.publishes_freed(0.0) if isinstance(e, Publish)]
    assert [p.entry.stream_seq for p in sent] == [1, 2]
    assert [e for e in second.publishes_freed(0.0) if isinstance(e, Publish)] == []
    assert budget.next_waiting() == "e2"
    first.publish_stored_many([(p.entry.order, p.attempt) for p in sent], 0.1)
    later = [e for e in second.publishes_freed(0.1) if isinstance(e, Publish)]
    assert [p.entry.stream_seq for p in later] == [1, 2]


@settings(max_examples=examples(200), deadline=None)
@given(
    limit=st.integers(1, 6),
    target=st.sampled_from([float("inf"), 1.0]),
    batching=st.booleans(),
    steps=st.lists(st.tuples(st.sampled_from("atsfex"), st.integers(0, 2)), min_size=1, max_size=60),
)
def test_the_count_is_what_is_in_flight_and_never_above_the_limit(
    limit: int, target: float, batching: bool, steps: list[tuple[str, int]]
) -> None:
    """Any interleaving of adds, sends, acks, refusals, timeouts and verifications over three pipelines, with a
    fixed limit or one following the acks' times: the budget counts exactly what they have in flight, the limit
    stays between its floor and ceiling, and sends never take the count above the limit they were sent under
    (probes aside: a degraded pipeline sends its one probe regardless, so at most one more per pipeline)."""
    budget = PublishBudget(limit, target, batch_limit=2)
    pipes = [shared(budget, str(i), window=4) for i in range(3)]
    for p in pipes:
        p.batching = batching  # (fast batches: a batch stopped for want of room is committed)
    next_seq = [1, 1, 1]
    now = 0.0
    for op, i in steps:
        p = pipes[i]
        now += 0.5
        if op == "a":
            fill(p, next_seq[i])
            next_seq[i] += 1
        elif op == "t":
            before = budget.in_flight
            p.take_sendable(now)
            assert budget.in_flight <= max(before, budget.limit) + 1
        elif op in "sf" and p._in_flight:
            entry = next(iter(p._in_flight.values()))
            if op == "s":
                p.stored(entry.order, entry.attempt, now)
            else:
                p.failed(entry.order, entry.attempt, "refused", now)
        elif op == "e":
            now += 6.0
            p.expire(now)
        elif op == "x" and p.unverified:
            p.verified(p.unverified, set())
        assert budget.in_flight == sum(len(q._in_flight) for q in pipes)
        assert budget.in_flight <= limit + 3
        assert budget.batches == sum(len(q._batches) for q in pipes) <= budget.batch_limit
        assert budget.floor <= budget.limit <= budget.ceiling == limit


def test_a_fast_batch_stopped_for_want_of_room_is_committed_so_its_members_are_acked() -> None:
    """The server acks a fast batch's last members at its commit: a batch left open while its source waits for room
    would never free the room it waits for."""
    budget = PublishBudget(3)
    p = shared(budget, "p")
    p.batching = True
    fill(p, 1, 2, 3, 4, 5)
    sends = p.take_sendable(0.0)
    assert seqs(sends[:3]) == [1, 2, 3] and budget.waiting == 1
    assert sends[-1].op == BATCH_COMMIT_EOB and sends[-1].batch == sends[0].batch  # the commit goes with them


# -- the limit following the hub's ack times --------------------------------------------------------------------


def test_a_late_ack_halves_the_limit_once_for_what_was_sent_before_the_cut() -> None:
    """Acks queued at the hub longer than the target halve the limit, but only one sent after the previous cut cuts
    again: the ones sent before were queued under the old limit, and a burst of them would otherwise take it to the
    floor at once."""
    budget = PublishBudget(4096, 1.25)
    assert budget.limit == START
    budget.take(400)
    budget.answered(0.0, 0.001)  # the round trip
    budget.answered(0.0, 1.3)  # sent at 0, acked 1.3 s later: queued past the target
    assert budget.limit == START // 2 and budget.cuts == 1
    for _ in range(100):
        budget.answered(0.5, 4.0)  # late too, but sent before the cut (at 1.3)
    assert budget.limit == START // 2 and budget.cuts == 1
    budget.answered(3.5, 6.5)  # sent after the cut, still late
    assert budget.limit == START // 4 and budget.cuts == 2
    budget.answered(3.6, 6.6)  # sent before the last cut (6.5)
    assert budget.limit == START // 4
    now = 7.0
    for _ in range(10):  # the hub stays slow: down to the floor, no lower
        budget.take()
        budget.answered(now, now + 3.0)
        now += 3.0
    assert budget.limit == FLOOR


def test_quick_acks_grow_the_limit_while_it_is_in_use_up_to_the_ceiling() -> None:
    budget = PublishBudget(600, 1.25)
    budget.take(100)
    for _ in range(90):  # quick, but at most 100 of 512 in flight: nothing to grow for
        budget.answered(0.0, 0.001)
    assert budget.limit == START
    budget.take(budget.limit - budget.in_flight)
    budget.answered(0.0, 0.3)  # within a quarter of the target: quick enough
    assert budget.limit == START  # (one step for every two quick acks)
    budget.answered(0.0, 0.3)
    assert budget.limit == START + 1
    for _ in range(4):
        budget.answered(0.0, 0.8)  # between a quarter of the target and the target: holds
    assert budget.limit == START + 1
    for _ in range(400):
        budget.take()
        budget.answered(0.0, 0.001)
    assert budget.limit == 600  # the ceiling (engine.publishes_in_flight)
    budget.answered(0.0, 0.001)
    assert budget.limit == 600


def test_a_far_hubs_round_trip_is_not_a_queue() -> None:
    """Acks that all take 0.9 s (a hub across an ocean) grow the limit like quick ones: what counts is the time
    beyond the quickest ack of the last minute or two; a slower ack than that is a queue."""
    budget = PublishBudget(4096, 1.25)
    budget.take(START)
    now = 0.0
    for _ in range(200):
        budget.answered(now, now + 0.9)
        budget.take()
        now += 0.01
    assert budget.limit == START + 100 and budget.cuts == 0
    budget.answered(now, now + 0.9 + 1.3)
    assert budget.cuts == 1
    # the round trip counts at most the target: a hub 3 s away cuts the limit (the ack timeout is the user's to raise)
    far = PublishBudget(4096, 1.25)
    far.take(10)
    far.answered(0.0, 3.0)
    far.answered(1.0, 4.0)
    assert far.cuts == 1


def test_a_fixed_budget_never_moves() -> None:
    budget = PublishBudget(64)
    budget.take(64)
    budget.answered(0.0, 100.0)
    budget.answered(0.0, 0.0)
    assert budget.limit == 64 and budget.cuts == 0 and budget.in_flight == 62


def test_a_timeout_cuts_the_limit_but_a_lost_connection_or_a_read_of_the_target_does_not() -> None:
    """What the pipeline learns of the hub's pace: an ack, a refusal and the ack timeout answer a publish; a lost
    connection and a verification's read of the target say nothing of how fast the hub stores."""
    budget = PublishBudget(4096, 1.25)
    p = shared(budget, "p", window=64)
    fill(p, *range(1, 41))
    sends = p.take_sendable(0.0)
    assert len(sends) == 40 and budget.in_flight == 40
    assert p.fail_in_flight("connection lost", 1.0) == 40
    assert budget.limit == START and budget.in_flight == 0
    p.verified(p.unverified, {s.entry.stream_seq for s in sends[:10]})
    assert budget.limit == START  # found in the target: no ack time to learn from
    p.retry_now()
    resent = p.take_sendable(2.0)
    while resent:  # the probe, then the rest once it is stored
        for send in resent:
            p.stored(send.entry.order, send.attempt, 2.1)
        resent = p.take_sendable(2.2)
    assert budget.limit == START and budget.in_flight == 0
    fill(p, 41)
    assert len(p.take_sendable(3.0)) == 1
    assert p.expire(3.0 + p.ack_timeout)
    assert budget.limit == START // 2 and budget.in_flight == 0


@settings(max_examples=examples(25), deadline=None)
@given(
    first=st.integers(150, 5_000),
    changes=st.lists(st.floats(1 / 3, 3.0), max_size=3),
    rtt=st.sampled_from([0.0005, 0.05, 0.5]),
)
def test_a_hub_storing_at_any_pace_acks_within_the_timeout_and_is_kept_busy(
    first: int, changes: list[float], rtt: float
) -> None:
    """A hub that stores this process's publishes one after another at ``first`` publishes a second, a pace that
    changes every 10 s by a factor of up to three either way, never below 30 (a storm's hub slows down, then
    recovers), its acks ``rtt`` away, and sources with endless backlogs sharing the budget: no publish waits for its
    ack as long as the ack timeout (the first of a burst included: they are sent before any ack is timed), and once
    the limit has found the pace the hub always has work (where the ceiling covers the round trip)."""
    ack_timeout = 5.0
    budget = PublishBudget(4096, ack_timeout / 4)
    tick = 0.01
    at_hub: deque[list[float]] = deque()  # [arrives, sent, count]: publishes sent in one tick, queued in order
    acks: deque[tuple[float, float, int]] = deque()  # (arrives, sent, count) of the acks on their way back
    credit = 0.0
    now = 0.0
    rate = float(first)
    for phase, change in enumerate([1.0, *changes]):
        rate = max(30.0, rate * change)  # (32 publishes, the floor, wait a second at the slowest)
        worst = 0.0
        idle_ticks = 0
        begun = now
        while now < begun + 10.0:
            room = budget.limit - budget.in_flight  # the sources send what the budget admits (endless backlogs)
            if room > 0:
                budget.take(room)
                at_hub.append([now + rtt / 2, now, room])
            now += tick
            credit = min(credit + rate * tick, rate * tick + 1.0)
            if (not at_hub or at_hub[0][0] > now) and now - begun > 3.0:
                idle_ticks += 1  # (the limit has had three seconds to find the pace)
            while at_hub and at_hub[0][0] <= now and credit >= 1.0:
                queued = at_hub[0]
                stored = min(int(credit), int(queued[2]))
                credit -= stored
                acks.append((now + rtt / 2, queued[1], stored))
                queued[2] -= stored
                if not queued[2]:
                    at_hub.popleft()
            while acks and acks[0][0] <= now:
                _, sent, count = acks.popleft()
                worst = max(worst, now - sent)
                for _ in range(count):
                    budget.answered(sent, now)
        assert worst < ack_timeout, (phase, rate, worst, budget.limit)
        if rate * rtt * 2 < budget.ceiling:
            assert idle_ticks == 0, (phase, rate, idle_ticks, budget.limit)
        assert budget.floor <= budget.limit <= budget.ceiling
