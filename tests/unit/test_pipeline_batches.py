"""``PublishPipeline`` with fast batches (an aggregate with ``allow_batched``): what goes out as a batch, what a
batch reply settles, and that nothing after a refused member is ever taken as stored."""

from __future__ import annotations

from bridge.core.backoff import Backoff
from bridge.core.budget import PublishBudget
from bridge.core.headers import encode_header_block
from bridge.core.pipeline import (
    BATCH_APPEND,
    BATCH_COMMIT_EOB,
    BATCH_DISABLED,
    BATCH_START,
    BATCH_TOO_MANY,
    PLAIN_AFTER_TOO_MANY,
    AckOutcome,
    OutboundMessage,
    PublishPipeline,
    Send,
    TargetLimits,
)

RETRY = Backoff(0.5, 15.0)


def batched(window: int = 4) -> PublishPipeline:
    p = PublishPipeline(window=window, ack_timeout=5.0, retry=RETRY)
    p.limit(TargetLimits(1024 * 1024, -1, ("agg.>",), batched=True))
    return p


def fill(p: PublishPipeline, *seqs: int) -> None:
    for seq in seqs:
        p.add(seq, OutboundMessage(f"agg.{seq}", encode_header_block({"Nats-Msg-Id": f"s:S:{seq}"}), b"x"))


def shape(sends: list[Send]) -> list[tuple[int, int, int, int]]:
    return [(s.entry.stream_seq, s.batch, s.bseq, s.op) for s in sends]


def ack(p: PublishPipeline, send: Send, through: int, now: float = 0.0) -> list[tuple[int, bool]]:
    """A cumulative flow ack arriving on ``send``'s reply subject; what it settles, as (seq, stored)."""
    return settle(
        p, AckOutcome(send.entry.order, send.attempt, True, batch=send.batch, bseq=send.bseq, through=through)
    )


def settle(p: PublishPipeline, outcome: AckOutcome, now: float = 0.0) -> list[tuple[int, bool]]:
    out = []
    for o in p.expand([outcome], now):
        entry = p.entry(o.order)
        assert entry is not None
        out.append((entry.stream_seq, o.stored))
        if o.stored:
            p.stored(o.order, o.attempt, 0.0)
        else:
            p.failed(o.order, o.attempt, o.error, now)
    return out


def test_a_window_goes_out_as_one_batch_and_a_lone_message_plainly() -> None:
    p = batched()
    fill(p, 1)
    assert shape(p.take_sendable(0.0)) == [(1, 0, 0, 0)]  # alone, nothing in flight: plain
    fill(p, 2, 3)
    assert p.take_sendable(0.0) == []  # a plain publish is unresolved: no batch may overtake it
    p.stored(1, 1, 0.0)
    sends = p.take_sendable(0.0)
    assert shape(sends) == [(2, 1, 1, BATCH_START), (3, 1, 2, BATCH_APPEND)]
    fill(p, 4)
    assert shape(p.take_sendable(0.0)) == [(4, 1, 3, BATCH_APPEND)]  # the open batch takes more members


def test_cumulative_acks_store_members_and_a_drained_batch_is_committed() -> None:
    p = batched()
    fill(p, 1, 2, 3)
    sends = p.take_sendable(0.0)
    assert settle(p, AckOutcome(0, 0, True, batch=1, bseq=1, through=0)) == []  # the start's flow settings
    assert ack(p, sends[1], 2) == [(1, True), (2, True)]
    assert p.watermark == 2
    assert ack(p, sends[0], 1) == []  # older news
    assert ack(p, sends[2], 3) == [(3, True)]
    commit = p.take_sendable(0.0)
    assert shape(commit) == [(3, 1, 4, BATCH_COMMIT_EOB)]  # stored and nothing waits: the batch is committed
    assert not p.batch_open
    fill(p, 4, 5)
    assert shape(p.take_sendable(0.0)) == [(4, 2, 1, BATCH_START), (5, 2, 2, BATCH_APPEND)]


def test_a_refused_member_fails_itself_and_every_later_member_never_an_earlier_one() -> None:
    p = batched(window=5)
    fill(p, 1, 2, 3, 4, 5)
    sends = p.take_sendable(0.0)
    refusal = AckOutcome(sends[2].entry.order, 1, False, error="no responders", batch=1, bseq=3, ended=True, code=0)
    assert settle(p, refusal) == [(3, False), (4, False), (5, False)]
    assert p.degraded and not p.batch_open
    out = p.take_sendable(0.0)
    assert shape(out) == [(5, 1, 6, BATCH_COMMIT_EOB)]  # the closed batch is committed at the server
    assert p.take_sendable(1.0) == []  # members 1 and 2 are unresolved: the probe waits for them
    assert ack(p, sends[1], 2) == [(1, True), (2, True)]
    probe = p.take_sendable(1.0)
    assert shape(probe) == [(3, 0, 0, 0)]  # the probe goes alone, plainly
    p.stored(probe[0].entry.order, probe[0].attempt, 0.0)
    assert shape(p.take_sendable(1.0)) == [(4, 2, 1, BATCH_START), (5, 2, 2, BATCH_APPEND)]


def test_a_commit_short_of_the_members_sent_fails_the_rest() -> None:
    p = batched()
    fill(p, 1, 2, 3)
    sends = p.take_sendable(0.0)
    commit = AckOutcome(sends[1].entry.order, 1, True, batch=1, bseq=2, through=1, ended=True)
    assert settle(p, commit) == [(1, True), (2, False), (3, False)]
    assert p.watermark == 1 and p.degraded


def first_refused(p: PublishPipeline, code: int, error: str) -> AckOutcome:
    """Messages 1 and 2 sent as batch 1, and the server's refusal of its first member with ``code``."""
    fill(p, 1, 2)
    sends = p.take_sendable(0.0)
    return AckOutcome(sends[0].entry.order, 1, False, error=error, batch=1, bseq=1, ended=True, code=code)


def test_too_many_batches_on_the_stream_turns_to_plain_publishes_for_a_while() -> None:
    p = batched()
    refused = first_refused(p, BATCH_TOO_MANY, "too many")
    assert p.batched(0.0) and p.batch_fallbacks == 0
    assert settle(p, refused, now=0.0) == [(1, False), (2, False)]
    assert not p.batched(1.0) and p.batch_fallbacks == 1  # what status and the metrics show
    p.take_sendable(0.0)  # the commit
    probe = p.take_sendable(1.0)
    p.stored(probe[0].entry.order, probe[0].attempt, 0.0)
    assert [s.batch for s in p.take_sendable(1.0)] == [0]  # plain, as before batches
    assert p.batched(PLAIN_AFTER_TOO_MANY)


def test_a_stream_that_stops_allowing_batches_turns_publishing_plain_until_its_limits_are_read() -> None:
    p = batched()
    refused = first_refused(p, BATCH_DISABLED, "batch publish disabled")
    settle(p, refused)
    assert not p.batched(100.0) and p.batch_fallbacks == 1
    p.limit(TargetLimits(1024 * 1024, -1, ("agg.>",), batched=True))  # read again: allowed again
    assert p.batched(100.0)


def test_a_batch_is_committed_once_nothing_waits_and_the_next_waits_for_its_ack() -> None:
    p = batched(window=100)
    fill(p, 1, 2, 3)
    sends = p.take_sendable(0.0)
    assert {s.flow for s in sends} == {16}  # the server may ack every 16th member only
    commit = p.take_sendable(0.0)
    assert shape(commit) == [(3, 1, 4, BATCH_COMMIT_EOB)]  # nothing waits: committed with members in flight
    fill(p, 4, 5)
    assert p.take_sendable(0.0) == []  # a new batch would race the old one's unresolved members
    # the commit's publish ack settles every member no flow ack covered
    commit_ack = AckOutcome(commit[0].entry.order, 1, True, batch=1, bseq=4, through=3, ended=True)
    assert settle(p, commit_ack) == [(1, True), (2, True), (3, True)]
    assert shape(p.take_sendable(0.0)) == [(4, 2, 1, BATCH_START), (5, 2, 2, BATCH_APPEND)]


def test_the_flow_stays_well_inside_a_small_window() -> None:
    assert batched(window=4).batch_flow == 1
    assert batched(window=40).batch_flow == 10
    assert batched(window=1000).batch_flow == 16


def test_the_process_opens_at_most_its_batch_limit_and_the_rest_publish_plainly() -> None:
    """nats-server holds at most 1,000 fast batches in flight per stream and refuses more (429): after a storm every
    source with a backlog would open one. The process keeps to its own limit; beyond it a source publishes plain,
    and a batch over (settled, or its source gone) frees its slot."""
    budget = PublishBudget(4096, batch_limit=1)
    a, b = batched(), batched()
    a.share_budget(budget, "a")
    b.share_budget(budget, "b")
    fill(a, 1, 2)
    fill(b, 1, 2)
    sends_a = a.take_sendable(0.0)
    assert shape(sends_a) == [(1, 1, 1, BATCH_START), (2, 1, 2, BATCH_APPEND)] and budget.batches == 1
    assert shape(b.take_sendable(0.0)) == [(1, 0, 0, 0), (2, 0, 0, 0)]  # no slot: plain, nothing refused
    assert ack(a, sends_a[1], 2) == [(1, True), (2, True)]
    assert shape(a.take_sendable(0.0)) == [(2, 1, 3, BATCH_COMMIT_EOB)]  # committed, settled: over
    assert budget.batches == 0
    b.stored(1, 1, 0.1)
    b.stored(2, 1, 0.1)
    fill(b, 3, 4)
    assert shape(b.take_sendable(0.2)) == [(3, 1, 1, BATCH_START), (4, 1, 2, BATCH_APPEND)]
    assert budget.batches == 1
    b.leave_budget()  # its source stopped with the batch open
    assert budget.batches == 0
