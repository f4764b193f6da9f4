"""The process's publishes in flight across sources (bridge/core/budget.py): pipelines sharing a ``PublishBudget`` never
have more than its limit out together (a degraded pipeline's probe aside), what does not fit waits unsent and without
an ack deadline, every way a publish stops being in flight gives its room back, and the sources that waited are woken
longest-waiting first."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.budget import PublishBudget
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
    assert a.stored(sent_a[0].entry.order, 1) and a.stored(sent_a[1].entry.order, 1)
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
    busy.stored(sent[0].entry.order, 1)  # room for one
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
    p.stored(sends[0].entry.order, 1)  # stored
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
    batching=st.booleans(),
    steps=st.lists(st.tuples(st.sampled_from("atsfex"), st.integers(0, 2)), min_size=1, max_size=60),
)
def test_the_count_is_what_is_in_flight_and_never_above_the_limit(
    limit: int, batching: bool, steps: list[tuple[str, int]]
) -> None:
    """Any interleaving of adds, sends, acks, refusals, timeouts and verifications over three pipelines: the budget
    counts exactly what they have in flight, and sends never take it above its limit (probes aside: a degraded
    pipeline sends its one probe regardless, so at most one more per pipeline)."""
    budget = PublishBudget(limit)
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
            p.take_sendable(now)
        elif op in "sf" and p._in_flight:
            entry = next(iter(p._in_flight.values()))
            if op == "s":
                p.stored(entry.order, entry.attempt)
            else:
                p.failed(entry.order, entry.attempt, "refused", now)
        elif op == "e":
            now += 6.0
            p.expire(now)
        elif op == "x" and p.unverified:
            p.verified(p.unverified, set())
        assert budget.in_flight == sum(len(q._in_flight) for q in pipes)
        assert budget.in_flight <= limit + 3


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
