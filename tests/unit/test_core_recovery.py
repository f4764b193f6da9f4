"""``bridge.core.recovery``: the watermark a restarted bridge may trust, from the copies in the aggregate."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from bridge.core.ackreply import AckInfo
from bridge.core.effects import Effect, Publish
from bridge.core.engine import SourceEngine
from bridge.core.inbound import Data
from bridge.core.recovery import Copy, Recovery, recover, recovery_depth
from bridge.testing.engines import engine_settings
from tests.unit.sim import Sim, SimConfig


def chain(seqs: list[int], start_prev: int = 0) -> list[Copy]:
    """Copies linked the way the engine links them: each names the one accepted before it."""
    out, prev = [], start_prev
    for seq in seqs:
        out.append(Copy(seq, prev))
        prev = seq
    return out


def test_empty() -> None:
    assert recover([]) == Recovery(0, frozenset(), 0)


def test_contiguous_chain_gives_the_newest() -> None:
    assert recover(chain([1, 2, 3, 4])) == Recovery(4, frozenset(), 4)


def test_chain_over_origin_gaps_is_still_contiguous() -> None:
    # filtered or deleted origin sequences: the copies link 3 -> 7 -> 8 through Bridge-Prev, not through seq+1
    assert recover(chain([1, 3, 7, 8])) == Recovery(8, frozenset(), 4)


def test_a_hole_stops_the_watermark_below_it() -> None:
    copies = [Copy(1, 0), Copy(2, 1), Copy(4, 3), Copy(5, 4)]  # 3 missing: its publish failed, 4 and 5 went through
    assert recover(copies) == Recovery(2, frozenset({4, 5}), 4)


def test_a_range_skipped_on_purpose_is_no_hole() -> None:
    # a start position (or a forward reset) skipped 1-20: the first copy says so, and the run goes on through it
    copies = [Copy(21, 20, skipped_from=1), Copy(22, 21), Copy(23, 22)]
    assert recover(copies) == Recovery(23, frozenset(), 3)
    # a skip that does not begin just above the run is no link: 3 is still missing below it
    copies = [Copy(1, 0), Copy(2, 1), Copy(6, 5, skipped_from=4), Copy(7, 6)]
    assert recover(copies) == Recovery(2, frozenset({6, 7}), 4)


def test_several_holes_everything_above_the_first_is_present() -> None:
    copies = [Copy(1, 0), Copy(3, 2), Copy(4, 3), Copy(6, 5)]
    assert recover(copies) == Recovery(1, frozenset({3, 4, 6}), 4)


def test_forward_skip_link_breaks_the_chain_conservatively() -> None:
    # a forward reset skipped 3..9: copy 10 names 9 (the skip point), never copied
    copies = [Copy(1, 0), Copy(2, 1), Copy(10, 9), Copy(11, 10)]
    assert recover(copies) == Recovery(2, frozenset({10, 11}), 4)


def test_order_and_duplicates_do_not_matter() -> None:
    copies = [Copy(5, 4), Copy(2, 1), Copy(4, 3), Copy(1, 0), Copy(2, 1), Copy(5, 4)]
    assert recover(copies) == Recovery(2, frozenset({4, 5}), 4)


def test_single_copy() -> None:
    # a read cut short (not down to the ack floor): its oldest copy is trusted
    assert recover([Copy(7, 6)], complete=False).watermark == 7
    # a read that reached the floor: the copy must link to it
    assert recover([Copy(7, 6)], floor=6).watermark == 7
    assert recover([Copy(7, 6)], floor=0) == Recovery(0, frozenset({7}), 1)


def test_recovery_depth() -> None:
    # a cap on copies read above the ack floor, far above any window (see recover's docstring)
    assert recovery_depth(1) == 100_000
    assert recovery_depth(1024) == 100_000
    assert recovery_depth(50_000) == 200_000


@given(st.lists(st.integers(1, 60), unique=True, max_size=30), st.data())
def test_present_never_at_or_below_the_watermark(seqs: list[int], data: st.DataObject) -> None:
    seqs.sort()
    copies = chain(seqs)
    dropped = data.draw(st.sets(st.sampled_from(seqs))) if seqs else set()
    kept = [c for c in copies if c.stream_seq not in dropped]
    result = recover(kept)
    assert all(seq > result.watermark for seq in result.present)
    assert result.present | {c.stream_seq for c in kept if c.stream_seq <= result.watermark} == {
        c.stream_seq for c in kept
    }
    # anchored at the floor (0 here), the watermark never passes a dropped copy, however low
    assert not any(s <= result.watermark for s in dropped)


@given(st.lists(st.integers(1, 60), unique=True, max_size=30), st.data())
def test_a_cut_short_read_trusts_only_its_oldest_copy(seqs: list[int], data: st.DataObject) -> None:
    seqs.sort()
    kept = [
        c
        for c in chain(seqs)
        if c.stream_seq not in data.draw(st.sets(st.sampled_from(seqs)) if seqs else st.just(set()))
    ]
    full = recover(kept, complete=False)
    if kept:
        tail = recover(kept[1:], floor=kept[0].stream_seq)  # the same as anchoring at the oldest copy read
        assert (full.watermark, full.present) == (tail.watermark, tail.present)


# -- the floor anchor ----------------------------------------------------------------------------------------


def test_copies_at_or_below_the_floor_are_ignored() -> None:
    copies = [Copy(3, 2), Copy(5, 4), Copy(6, 5)]
    assert recover(copies, floor=5) == Recovery(6, frozenset(), 3)


def test_the_chain_starts_at_the_floor() -> None:
    # the floor is what the bridge's own answers (or a forward reset) acked: accounted for; 11 links to it
    assert recover([Copy(11, 10), Copy(12, 11)], floor=10).watermark == 12
    # a copy whose Bridge-Prev is at or below the watermark so far extends it (what was between was not there)
    assert recover([Copy(11, 7), Copy(12, 11)], floor=10).watermark == 12
    # one that names a sequence above it marks a hole
    assert recover([Copy(12, 11), Copy(13, 12)], floor=10) == Recovery(10, frozenset({12, 13}), 2)


# -- regressions (bugs found by these tests, fixed in d720488) -----------------------------------------------


def test_a_hole_below_the_first_copy_is_not_covered() -> None:
    """Publish of origin seq 1 fails, 2 and 3 are stored, the bridge dies before the retry.

    Triggers: a new source (or an aggregate whose limits aged out older copies) whose first publishes meet a
    refusal nobody foresees (per-subject DiscardNew limit, leader election) while later ones are stored. The old
    ``recover`` made the oldest copy read the base of the chain: watermark 3; on restart delivery 1 was dropped as
    a duplicate and the next FC answer acked 3, deleting seq 1 from a WorkQueue origin unstored. Now the chain
    starts at the consumer's ack floor (0 here): 2 names 1, which is missing.
    """
    result = recover([Copy(2, 1), Copy(3, 2)])
    assert result.watermark == 0
    assert result.present == frozenset({2, 3})


def test_restart_after_a_failed_first_publish_keeps_it() -> None:
    """The story above end to end in the simulator, recovering as the runtime does: 1 is stored in the end."""
    config = SimConfig(n=3, published=3, max_ack_pending=100, publish_window=3)
    sim = Sim(config)
    sim.step_reset_reply("ok")
    for _ in range(2):
        sim.step_deliver()
        sim.step_receive()
    sim.step_target("reject")  # seq 1
    sim.step_target("ok")  # seq 2
    sim.crash(reset_applied=False)
    assert sim.engine.watermark == 0
    sim.heal_and_settle()
    sim.check_final()


def _data(dseq: int, sseq: int) -> Data:
    return Data(AckInfo("ORDERS", "BRIDGE", 1, sseq, dseq, sseq, 0), f"orders.{sseq}", None, b"x")


def _run_target(engine: SourceEngine, sends: list[Effect], aggregate: dict[int, Copy], fail: set[int]) -> None:
    """Answer every publish in send order (and those they release): store it, or fail the seqs in ``fail``."""
    queue = deque(e for e in sends if isinstance(e, Publish))
    while queue:
        send = queue.popleft()
        seq, message = send.entry.stream_seq, send.entry.message
        assert message is not None
        if seq in fail:
            more = engine.publish_failed(send.entry.order, send.attempt, "maximum messages per subject exceeded", 0.0)
        else:
            aggregate[seq] = Copy(seq, int(message.headers["Bridge-Prev"]))
            more = engine.publish_stored(send.entry.order, send.attempt, 0.0)
        queue.extend(e for e in more if isinstance(e, Publish))


def test_a_lost_publish_is_overtaken_by_less_than_a_window() -> None:
    """A publish that gets no ack (lost; its ack timeout has not run out) holds the window: the window is a span
    from the oldest unstored message, so fewer than ``window`` copies can ever be stored above the hole, which is
    what recovery's fallback (a read cut short) relies on. And a read down to the ack floor sees the hole."""
    window = 4
    engine = SourceEngine(engine_settings(window), 0.0)
    engine.recovered(0, (), 0.0)
    engine.reset_succeeded(1, 0.0)
    aggregate: dict[int, Copy] = {}
    for seq in range(1, 1101):
        sends = engine.data(_data(seq, seq), 0.0)
        if seq == 1:
            continue  # seq 1 vanishes: no ack, no error (its ack timeout has not run out)
        _run_target(engine, sends, aggregate, fail=set())
    assert sorted(aggregate) == [2, 3, 4]  # window - 1 copies above the hole, no more
    assert engine.watermark == 0  # the running bridge waits for seq 1
    assert recover(aggregate.values(), floor=0).watermark == 0  # and so does a restart
    assert recover(aggregate.values(), complete=False).watermark == 4  # the fallback trusts the oldest copy read


def test_a_permanently_failing_message_and_repeated_restarts_keep_it() -> None:
    """A message the target refuses every time and an operator restarting the bridge (it looks stuck).

    Concrete trigger: an aggregate with ``max_msgs_per_subject`` and per-subject DiscardNew refuses message N
    ("maximum messages per subject exceeded") while N+1.. on other subjects are stored; neither the size
    pre-check nor the subject barrier can foresee that. With the window counted in un-acked publishes, each
    restarted bridge published the hole *and up to window-1 new messages past the present copies* before the
    hole's error came back; after three restarts the newest ``recovery_depth`` copies were all above the hole and
    the fourth bridge took it as stored. Now the window is a span from the oldest unstored entry (the present
    copies count in it), so nothing new is sent past the hole, and recovery reads down to the ack floor anyway.
    """
    window = 1024
    depth = recovery_depth(window)
    aggregate: dict[int, Copy] = {}
    bad = 101  # 1..100 go through first
    floor = 0  # the origin's ack floor: each life's watermark (what its FC answers acked)
    for _life in range(3):
        result = recover(sorted(aggregate.values(), key=lambda c: c.stream_seq)[-depth:])
        assert result.watermark < bad
        engine = SourceEngine(engine_settings(window), 0.0)
        engine.recovered(result.watermark, result.present, 0.0)
        engine.reset_succeeded(floor + 1, 0.0)
        sends: list[Effect] = []
        for dseq, seq in enumerate(range(floor + 1, floor + 1 + 4 * window), start=1):
            sends += engine.data(_data(dseq, seq), 0.0)
        _run_target(engine, sends, aggregate, fail={bad})
        assert engine.watermark == bad - 1
        floor = engine.watermark
    result = recover(sorted(aggregate.values(), key=lambda c: c.stream_seq)[-depth:])
    assert result.watermark < bad
