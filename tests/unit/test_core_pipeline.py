"""``bridge.core.pipeline.PublishPipeline``: the publish window, the in-order watermark, failure and retry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.backoff import Backoff
from bridge.core.headers import encode_header_block
from bridge.core.pipeline import Blocked, OutboundMessage, PublishPipeline, Send
from bridge.core.subjects import SubjectSet
from bridge.testing.engines import examples

RETRY = Backoff(0.5, 15.0)


def pipeline(window: int = 3, ack_timeout: float = 5.0, watermark: int = 0) -> PublishPipeline:
    return PublishPipeline(window=window, ack_timeout=ack_timeout, retry=RETRY, watermark=watermark)


def msg(seq: int) -> OutboundMessage:
    return OutboundMessage(f"agg.{seq}", encode_header_block({"Nats-Msg-Id": f"s:S:{seq}"}), f"m{seq}".encode())


def fill(p: PublishPipeline, *seqs: int) -> None:
    for seq in seqs:
        p.add(seq, msg(seq))


def seqs(sends: list[Send]) -> list[int]:
    return [s.entry.stream_seq for s in sends]


def by_seq(sends: list[Send]) -> dict[int, Send]:
    return {s.entry.stream_seq: s for s in sends}


def test_window_is_respected() -> None:
    p = pipeline(window=3)
    fill(p, 1, 2, 3, 4, 5)
    first = p.take_sendable(0.0)
    assert seqs(first) == [1, 2, 3]
    assert [s.attempt for s in first] == [1, 1, 1]
    assert p.take_sendable(0.0) == []
    assert p.in_flight == 3
    p.stored(first[0].entry.order, 1, 0.0)
    assert seqs(p.take_sendable(0.0)) == [4]
    assert p.backlog == 4


def test_sends_carry_the_message_and_order_tokens() -> None:
    p = pipeline()
    fill(p, 7, 9)
    sends = p.take_sendable(0.0)
    assert [s.entry.message for s in sends] == [msg(7), msg(9)]
    assert sends[0].entry.order < sends[1].entry.order


def test_watermark_only_over_the_contiguous_acked_prefix() -> None:
    p = pipeline(window=5)
    fill(p, 1, 2, 3)
    s = by_seq(p.take_sendable(0.0))
    assert p.stored(s[2].entry.order, 1, 0.0) is False  # 2 before 1 proves nothing about 1
    assert p.watermark == 0
    assert p.stored(s[3].entry.order, 1, 0.0) is False
    assert p.stored(s[1].entry.order, 1, 0.0) is True
    assert p.watermark == 3
    assert p.empty
    assert p.stored_messages == 3


def test_watermark_follows_origin_sequences_with_gaps() -> None:
    p = pipeline(watermark=10)
    fill(p, 12, 17)
    s = by_seq(p.take_sendable(0.0))
    p.stored(s[12].entry.order, 1, 0.0)
    assert p.watermark == 12
    p.stored(s[17].entry.order, 1, 0.0)
    assert p.watermark == 17


def test_duplicate_or_unknown_acks_are_harmless() -> None:
    p = pipeline()
    fill(p, 1)
    (send,) = p.take_sendable(0.0)
    assert p.stored(send.entry.order, 1, 0.0) is True
    assert p.stored(send.entry.order, 1, 0.0) is False
    assert p.stored(999, 1, 0.0) is False
    assert p.failed(send.entry.order, 1, "late error", 0.0) is False
    assert p.stored_messages == 1


def test_add_stored_marker_waits_for_earlier_entries() -> None:
    p = pipeline()
    fill(p, 1)
    (send,) = p.take_sendable(0.0)
    assert p.add_stored(5) is False  # e.g. a forward skip to 5: it must not vouch for 1
    assert p.watermark == 0
    assert p.take_sendable(0.0) == []  # markers are never sent
    assert p.stored(send.entry.order, 1, 0.0) is True
    assert p.watermark == 5
    assert p.add_stored(8) is True
    assert p.watermark == 8


def test_failure_degrades_stops_new_sends_and_probes_after_backoff() -> None:
    p = pipeline(window=3)
    fill(p, 1, 2, 3, 4, 5)
    s = by_seq(p.take_sendable(0.0))
    assert p.failed(s[1].entry.order, 1, "boom", 1.0) is True
    assert p.degraded
    assert p.failures == 1
    assert p.blocked == Blocked(stream_seq=1, since=1.0, reason="boom", attempts=1)
    p.stored(s[2].entry.order, 1, 0.0)  # window room, but degraded: nothing new goes out
    assert p.take_sendable(1.0) == []
    assert p.next_deadline() == pytest.approx(1.5)  # min(ack deadline 5.0 of 3, retry at 1.0 + 0.5)
    assert p.take_sendable(1.49) == []
    (probe,) = p.take_sendable(1.5)
    assert probe.entry.stream_seq == 1
    assert probe.attempt == 2
    assert probe.entry.order == s[1].entry.order  # same entry, same order token, same message
    assert probe.entry.message == msg(1)
    assert p.take_sendable(100.0) == []  # one probe at a time


def test_failed_probe_backs_off_exponentially() -> None:
    p = pipeline(window=1)
    fill(p, 1)
    (send,) = p.take_sendable(0.0)
    p.failed(send.entry.order, 1, "e1", 0.0)
    (probe,) = p.take_sendable(0.5)
    assert p.failed(probe.entry.order, 2, "e2", 0.5) is False  # already degraded: not *newly* blocked
    assert p.failures == 2
    assert p.take_sendable(1.49) == []
    (probe,) = p.take_sendable(1.5)  # 0.5 + 1.0
    p.failed(probe.entry.order, 3, "e3", 1.5)
    assert p.take_sendable(3.49) == []
    assert p.take_sendable(3.5) != []  # 1.5 + 2.0
    blocked = p.blocked
    assert blocked is not None
    assert (blocked.stream_seq, blocked.reason, blocked.attempts, blocked.since) == (1, "e3", 3, 0.0)


def test_probe_success_resends_the_remaining_failed_in_order_before_new_ones() -> None:
    p = pipeline(window=4)
    fill(p, 1, 2, 3, 4, 5, 6, 7)
    s = by_seq(p.take_sendable(0.0))
    p.failed(s[1].entry.order, 1, "x", 0.0)
    p.failed(s[3].entry.order, 1, "x", 0.0)
    p.stored(s[2].entry.order, 1, 0.0)
    p.failed(s[4].entry.order, 1, "x", 0.0)
    (probe,) = p.take_sendable(0.5)
    assert probe.entry.stream_seq == 1
    p.stored(probe.entry.order, probe.attempt, 0.0)
    assert not p.degraded
    assert p.failures == 0
    assert p.blocked is None
    again = p.take_sendable(0.5)
    assert seqs(again) == [3, 4, 5, 6]
    assert [s.attempt for s in again] == [2, 2, 1, 1]
    assert p.watermark == 2


def test_late_success_of_an_earlier_attempt_counts() -> None:
    p = pipeline(window=2)
    fill(p, 1, 2)
    s = by_seq(p.take_sendable(0.0))
    p.failed(s[1].entry.order, 1, "timeout-ish", 0.0)
    (probe,) = p.take_sendable(0.5)
    assert probe.attempt == 2
    # the first attempt's ack arrives after all: stored, whatever becomes of attempt 2
    assert p.stored(s[1].entry.order, 1, 0.0) is True
    assert p.watermark == 1
    assert not p.degraded
    assert p.failed(s[1].entry.order, 2, "late error of attempt 2", 1.0) is False
    assert p.watermark == 1


def test_late_success_of_a_failed_entry_waiting_for_its_probe() -> None:
    p = pipeline(window=3)
    fill(p, 1, 2, 3)
    s = by_seq(p.take_sendable(0.0))
    p.failed(s[1].entry.order, 1, "x", 0.0)
    p.failed(s[2].entry.order, 1, "x", 0.0)
    p.stored(s[2].entry.order, 1, 0.0)  # 2's first attempt did get through: no longer to retry
    (probe,) = p.take_sendable(0.5)
    assert probe.entry.stream_seq == 1
    p.stored(probe.entry.order, probe.attempt, 0.0)
    assert p.take_sendable(0.5) == []  # 2 is not sent again
    p.stored(s[3].entry.order, 1, 0.0)
    assert p.watermark == 3


def test_all_failed_entries_stored_late_leaves_degraded_mode() -> None:
    p = pipeline(window=2)
    fill(p, 1, 2, 3)
    s = by_seq(p.take_sendable(0.0))
    p.failed(s[1].entry.order, 1, "x", 0.0)
    assert p.degraded
    p.stored(s[1].entry.order, 1, 0.0)  # before any probe was sent
    assert not p.degraded
    assert seqs(p.take_sendable(0.0)) == [3]


def test_failure_of_a_stale_attempt_is_ignored() -> None:
    p = pipeline(window=1)
    fill(p, 1)
    (send,) = p.take_sendable(0.0)
    p.failed(send.entry.order, 1, "x", 0.0)
    assert len(p.take_sendable(0.5)) == 1  # the probe, attempt 2
    assert p.failed(send.entry.order, 1, "stale error of attempt 1", 0.6) is False
    assert p.in_flight == 1  # the probe is still waiting
    assert p.failures == 1
    assert p.failed(999, 1, "unknown", 0.6) is False


def test_expire_fails_overdue_publishes_in_send_order() -> None:
    p = pipeline(window=3, ack_timeout=5.0)
    fill(p, 1, 2)
    p.take_sendable(0.0)
    fill(p, 3)
    p.take_sendable(1.0)
    assert p.next_deadline() == 5.0
    assert p.expire(4.99) == []
    expired = p.expire(5.0)
    assert [e.stream_seq for e in expired] == [1, 2]
    assert p.degraded
    assert p.in_flight == 1
    assert p.blocked is not None
    assert "no publish ack within 5s" in p.blocked.reason
    assert [e.stream_seq for e in p.expire(6.0)] == [3]


def test_an_ambiguous_failure_is_verified_before_anything_is_resent() -> None:
    """A timeout may hide a stored message: re-sending blind would rely on the target's duplicate window."""
    p = pipeline(window=3, ack_timeout=5.0)
    fill(p, 1, 2, 3, 4)
    s = by_seq(p.take_sendable(0.0))
    p.stored(s[2].entry.order, 1, 0.0)
    p.expire(5.0)  # 1 and 3 time out
    generation = p.unverified
    assert generation != 0
    assert p.unverified_seqs() == [1, 3]
    assert p.take_sendable(100.0) == []  # no probe, however long, until the target was read
    assert p.verified(generation, {3}) is False  # 3 was stored after all; 1 was not: nothing contiguous yet
    assert p.unverified == 0
    (probe,) = p.take_sendable(5.1)  # probe at once, no backoff: the target just answered
    assert (probe.entry.stream_seq, probe.attempt) == (1, 2)
    p.stored(probe.entry.order, 2, 0.0)
    assert p.watermark == 3
    assert seqs(p.take_sendable(5.2)) == [4]


def test_verification_finding_everything_unblocks() -> None:
    p = pipeline(window=2)
    fill(p, 1, 2, 3)
    p.take_sendable(0.0)
    assert p.fail_in_flight("target connection lost", 1.0) == 2
    generation = p.unverified
    assert p.unverified_seqs() == [1, 2]
    assert p.verified(generation, {1, 2}) is True
    assert (p.watermark, p.degraded, p.failures) == (2, False, 0)
    assert seqs(p.take_sendable(1.0)) == [3]


def test_a_stale_verification_counts_what_it_found_but_a_new_one_is_needed() -> None:
    p = pipeline(window=3)
    fill(p, 1, 2, 3)
    s = by_seq(p.take_sendable(0.0))
    p.expire(5.0)
    first = p.unverified
    p.fail_in_flight("lost", 5.0)  # nothing in flight any more: no new generation
    assert p.unverified == first
    assert p.verified(first + 1, {1}) is True  # an answer for another generation than the one awaited
    assert p.watermark == 1
    assert p.unverified == first  # still waiting for the read it asked for
    assert p.take_sendable(6.0) == []
    assert p.verified(first, set()) is False
    (probe,) = p.take_sendable(6.0)
    assert probe.entry is s[2].entry


def test_a_late_ack_of_the_last_unresolved_publish_leaves_nothing_to_verify() -> None:
    """An ambiguous failure (a timeout) asks for a read of the target; when the publish's late ack settles it first,
    and no other entry is failed or in flight, nothing is left to look up: no read is asked for (found by the
    simulator: a quiet engine asked for an empty read at a tick before its tick deadline)."""
    p = pipeline(window=1)
    fill(p, 1)
    (send,) = p.take_sendable(0.0)
    p.expire(5.0)
    assert p.unverified != 0 and p.unverified_seqs() == [1]
    assert p.stored(send.entry.order, 1, 0.0) is True
    assert (p.unverified, p.unverified_seqs(), p.degraded, p.empty) == (0, [], False, True)
    # with another entry still unresolved, the read is still needed
    q = pipeline(window=2)
    fill(q, 1, 2)
    s = by_seq(q.take_sendable(0.0))
    q.expire(5.0)
    q.stored(s[1].entry.order, 1, 0.0)
    assert q.unverified != 0 and q.unverified_seqs() == [2]


def test_an_error_ack_is_not_ambiguous() -> None:
    p = pipeline()
    fill(p, 1)
    (send,) = p.take_sendable(0.0)
    p.failed(send.entry.order, 1, "maximum messages exceeded", 0.0)
    assert p.unverified == 0
    assert len(p.take_sendable(0.5)) == 1


def test_fail_in_flight_then_verification_probes_at_once() -> None:
    p = pipeline(window=3)
    fill(p, 1, 2, 3, 4)
    p.take_sendable(0.0)
    assert p.fail_in_flight("target connection lost", 0.0) == 3
    assert (p.in_flight, p.degraded) == (0, True)
    assert p.take_sendable(0.0) == []
    p.verified(p.unverified, set())
    (probe,) = p.take_sendable(0.0)  # the target answered the read: no backoff
    assert (probe.entry.stream_seq, probe.attempt) == (1, 2)
    assert p.fail_in_flight("again", 0.2) == 1


def test_no_probe_overtakes_an_earlier_publish_still_in_flight() -> None:
    """Found by the chaos suite (hub SIGKILL): 1 was sent just before the connection died, 2 then failed with
    "not connected"; probing 2 on the new connection stored it before 1 was found lost, out of order."""
    p = pipeline(window=3)
    fill(p, 1, 2, 3)
    s = by_seq(p.take_sendable(0.0))
    assert p.failed(s[2].entry.order, 1, "target not connected", 0.1) is True
    assert p.take_sendable(10.0) == []  # past the backoff, but 1's fate is unknown
    assert p.fail_in_flight("target connection lost", 10.0) == 2  # 1 and 3
    p.verified(p.unverified, set())
    (probe,) = p.take_sendable(10.0)
    assert (probe.entry.stream_seq, probe.attempt) == (1, 2)
    p.stored(probe.entry.order, probe.attempt, 0.0)
    assert seqs(p.take_sendable(10.0)) == [2, 3]


def test_a_probe_waits_for_an_earlier_ack_then_goes() -> None:
    p = pipeline(window=3)
    fill(p, 1, 2)
    s = by_seq(p.take_sendable(0.0))
    p.failed(s[2].entry.order, 1, "refused", 0.1)
    assert p.take_sendable(10.0) == []
    p.stored(s[1].entry.order, 1, 0.0)
    (probe,) = p.take_sendable(10.0)
    assert probe.entry.stream_seq == 2


def test_retry_now_brings_the_probe_forward() -> None:
    p = pipeline(window=1)
    fill(p, 1)
    (send,) = p.take_sendable(0.0)
    p.failed(send.entry.order, 1, "unavailable", 0.0)
    assert p.take_sendable(0.1) == []
    p.retry_now()
    assert seqs(p.take_sendable(0.1)) == [1]


def test_a_subject_the_target_does_not_capture_is_sent_alone() -> None:
    """A likely refusal must not let later messages overtake it: it goes out alone, nothing after it."""
    p = pipeline(window=4)
    p.subjects = SubjectSet(["agg.>"])
    p.add(1, OutboundMessage("agg.a", b"", b""))
    p.add(2, OutboundMessage("other.b", b"", b""))
    p.add(3, OutboundMessage("agg.c", b"", b""))
    first = p.take_sendable(0.0)
    assert seqs(first) == [1]  # the barrier waits for what is in flight before it
    assert p.take_sendable(0.0) == []
    p.stored(first[0].entry.order, 1, 0.0)
    (barrier,) = p.take_sendable(0.0)
    assert barrier.entry.stream_seq == 2
    assert p.barriers == 1
    assert p.take_sendable(0.0) == []  # nothing after it while it is in flight
    p.failed(barrier.entry.order, 1, "no responders", 0.0)  # refused: blocks, retried alone
    (probe,) = p.take_sendable(0.5)
    assert probe.entry.stream_seq == 2
    p.stored(probe.entry.order, 2, 0.0)  # a mapping captured it after all
    assert seqs(p.take_sendable(0.6)) == [3]
    assert p.watermark == 2


def test_no_subjects_known_captures_everything() -> None:
    p = pipeline(window=4)
    p.add(1, OutboundMessage("anything.at.all", b"", b""))
    p.add(2, OutboundMessage("x", b"", b""))
    assert seqs(p.take_sendable(0.0)) == [1, 2]
    assert p.barriers == 0


def test_blocked_is_none_while_flowing() -> None:
    p = pipeline()
    assert p.blocked is None
    fill(p, 1)
    p.take_sendable(0.0)
    assert p.blocked is None
    assert not p.degraded


def test_iteration_and_views() -> None:
    p = pipeline(window=1)
    fill(p, 1, 2)
    p.take_sendable(0.0)
    assert [e.stream_seq for e in p] == [1, 2]
    assert (p.in_flight, p.backlog, p.empty) == (1, 2, False)
    assert p.next_deadline() == 5.0


@settings(max_examples=examples(150))
@given(
    window=st.integers(1, 4),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["ok", "fail", "lost_ack", "time", "send", "reconnect", "verify"]), st.integers(0, 20)
        )
    ),
)
def test_watermark_never_passes_an_unstored_message(window: int, ops: list[tuple[str, int]]) -> None:
    """Random outcomes: the watermark never passes a message the target lacks, and everything heals."""
    p = pipeline(window=window, ack_timeout=5.0)
    n = 12
    fill(p, *range(1, n + 1))
    now = 0.0
    target: set[int] = set()  # what the target really holds (an ack may be lost)
    sent: list[Send] = list(p.take_sendable(now))
    for op, k in ops:
        if op == "time":
            now += (0.3, 1.0, 6.0)[k % 3]
            p.expire(now)
        elif op == "reconnect":
            p.fail_in_flight("lost", now)
            p.retry_now()
        elif op == "verify" and p.unverified:
            p.verified(p.unverified, target & set(p.unverified_seqs()))
        elif op in ("ok", "fail", "lost_ack") and sent:
            send = sent[k % len(sent)]
            if op == "fail":
                p.failed(send.entry.order, send.attempt, "x", now)
            else:
                target.add(send.entry.stream_seq)
                if op == "ok":
                    p.stored(send.entry.order, send.attempt, 0.0)
        sent += p.take_sendable(now)
        assert all(seq in target for seq in range(1, p.watermark + 1))
        assert p.in_flight <= window
    for _ in range(500):  # heal: the target stores whatever comes and is readable
        if p.empty:
            break
        now += 1.0
        if p.unverified:
            p.verified(p.unverified, target & set(p.unverified_seqs()))
        for send in p.take_sendable(now):
            target.add(send.entry.stream_seq)
            p.stored(send.entry.order, send.attempt, 0.0)
        p.expire(now)
    assert p.watermark == n
    assert not p.degraded


def test_no_entry_is_sent_more_than_a_window_past_an_unacked_one() -> None:
    """Regression (fixed in d720488): what ``bridge.core.recovery`` relies on, fewer than ``window`` copies above a
    hole. The window used to count un-acked publishes: with entry 1 lost (no ack, no error until its ack
    timeout) the other slots kept cycling and entries far beyond 1 + window were stored before 1 was even known
    to have failed; a crash then recovered above the hole. Now it is a span from the oldest unstored entry."""
    p = pipeline(window=2)
    fill(p, *range(1, 11))
    first = by_seq(p.take_sendable(0.0))
    highest = 2
    p.stored(first[2].entry.order, 1, 0.0)  # 1 stays un-acked
    for _ in range(8):
        for send in p.take_sendable(0.1):
            highest = max(highest, send.entry.stream_seq)
            p.stored(send.entry.order, send.attempt, 0.0)
    assert highest < 1 + 2


def test_markers_count_in_the_span() -> None:
    """Copies found present at recovery (or a skip) hold their place in the span: after a restart above a hole,
    nothing new goes out past them until the hole is stored, so copies above a hole never pile up restart after
    restart."""
    p = pipeline(window=3)
    fill(p, 1)  # the hole, published again
    p.add_stored(2)  # present copies above it
    p.add_stored(3)
    fill(p, 4, 5)
    assert seqs(p.take_sendable(0.0)) == [1]
    assert p.take_sendable(0.0) == []
    p.stored(1, 1, 0.0)
    assert p.watermark == 3
    assert seqs(p.take_sendable(0.0)) == [4, 5]


def test_the_oldest_unstored_message_s_origin_time_is_the_first_held() -> None:
    """What ``nats_bridge_lag_seconds`` reads: the origin time of the oldest message not yet stored (a later one
    stored first does not move it), 0 once everything is stored."""
    p = pipeline(window=5)
    for seq in (1, 2, 3):
        p.add(seq, OutboundMessage(f"agg.{seq}", b"", b"", origin_ns=seq * 1_000_000_000))
    assert p.oldest_unstored_origin_ns == 1_000_000_000
    s = by_seq(p.take_sendable(0.0))
    p.stored(s[2].entry.order, 1, 0.0)
    assert p.oldest_unstored_origin_ns == 1_000_000_000
    p.stored(s[1].entry.order, 1, 0.0)
    assert p.oldest_unstored_origin_ns == 3_000_000_000
    p.stored(s[3].entry.order, 1, 0.0)
    assert p.oldest_unstored_origin_ns == 0 and p.empty
