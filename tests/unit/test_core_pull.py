"""``bridge.core.pull.PullEngine``: pull mode's scenarios driven by hand, one input at a time, effects checked."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TypeVar

from bridge.core.ackreply import AckInfo
from bridge.core.effects import (
    Ack,
    Effect,
    FetchOrigin,
    Notice,
    OriginMessage,
    Publish,
    Pull,
    PullAnchor,
    RequestResync,
    ResetCause,
)
from bridge.core.inbound import Data, FlowControlRequest, Heartbeat, PullStatus
from bridge.core.phases import Phase
from bridge.core.pipeline import BATCH_COMMIT_EOB, TargetLimits
from bridge.core.pull import AckLedger, PullCredits, PullEngine, pull_heartbeat
from bridge.testing.engines import CONSUMER, SETTINGS, STREAM

E = TypeVar("E")
PULL_SETTINGS = replace(SETTINGS, pull_capacity=8, pull_expires=30.0)


def reply(sseq: int, dseq: int, delivered: int = 1) -> str:
    return f"$JS.ACK.{STREAM}.{CONSUMER}.{delivered}.{sseq}.{dseq}.{1000 * sseq}.0"


def data(dseq: int, sseq: int, *, delivered: int = 1) -> Data:
    info = AckInfo(STREAM, CONSUMER, delivered, sseq, dseq, 1000 * sseq, 0)
    return Data(info, f"orders.{sseq}", None, b"x", reply(sseq, dseq, delivered))


def of(effects: Iterable[Effect], kind: type[E]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


def published(effects: Iterable[Effect]) -> list[int]:
    return [p.entry.stream_seq for p in of(effects, Publish)]


def acked(effects: Iterable[Effect]) -> list[int]:
    return [int(r.split(".")[5]) for a in of(effects, Ack) for r in a.replies]


def phase(engine: PullEngine) -> Phase:
    return engine.phase


def store_all(engine: PullEngine, effects: Iterable[Effect], now: float = 1.0) -> list[Effect]:
    """Acknowledge every publish in ``effects`` (and those it leads to), in order."""
    out: list[Effect] = []
    pending = list(of(effects, Publish))
    while pending:
        publish = pending.pop(0)
        more = engine.publish_stored(publish.entry.order, publish.attempt, now)
        out += more
        pending += of(more, Publish)
    return out


def running(watermark: int = 0, anchor: tuple[int, int] = (0, 0)) -> tuple[PullEngine, list[Effect]]:
    """An engine past recovery and its first resync, at ``anchor`` with nothing to fetch."""
    engine = PullEngine(PULL_SETTINGS, 0.0)
    effects = engine.recovered(watermark, [], 0.0)
    assert of(effects, RequestResync)[0].cause is ResetCause.START
    effects = engine.resynced(PullAnchor(*anchor), 0.0)
    assert phase(engine) is Phase.RUNNING
    return engine, effects


def test_first_resync_pulls_the_capacity_with_heartbeats() -> None:
    _, effects = running()
    assert of(effects, Pull) == [Pull(8, 30.0, pull_heartbeat(SETTINGS.silence_timeout))]
    assert [n.event for n in of(effects, Notice)] == ["resync.done"]


def test_acks_name_only_stored_messages_in_order() -> None:
    engine, _ = running()
    effects = engine.data(data(1, 1), 0.1) + engine.data(data(2, 2), 0.1) + engine.data(data(3, 3), 0.1)
    assert published(effects) == [1, 2, 3]
    assert acked(effects) == []
    publishes = of(effects, Publish)
    # the third is stored first: it acks nothing, the first two are not stored
    assert acked(engine.publish_stored(publishes[2].entry.order, 1, 0.2)) == []
    assert acked(engine.publish_stored(publishes[0].entry.order, 1, 0.2)) == [1]
    assert acked(engine.publish_stored(publishes[1].entry.order, 1, 0.2)) == [2, 3]
    assert engine.acked_stream_seq == 3


def test_redelivery_of_a_stored_message_is_acked_again_never_published() -> None:
    engine, _ = running()
    effects = engine.data(data(1, 1), 0.1)
    store_all(engine, effects)
    again = engine.data(data(2, 1, delivered=2), 0.2)
    assert published(again) == [] and acked(again) == [1]
    assert engine.stats.duplicates == 1


def test_redelivery_of_an_unstored_message_is_acked_once_it_is_stored() -> None:
    engine, _ = running()
    effects = engine.data(data(1, 1), 0.1)
    again = engine.data(data(2, 1, delivered=2), 0.2)
    assert published(again) == [] and acked(again) == []
    stored = store_all(engine, effects)
    assert acked(stored) == [1]
    assert of(stored, Ack)[0].replies == (reply(1, 2, 2),)  # the newest ack subject of that message


def test_a_gap_resyncs_and_fetches_what_the_consumer_delivered_to_nobody() -> None:
    engine, _ = running()
    store_all(engine, engine.data(data(1, 1), 0.1))
    effects = engine.data(data(4, 4), 0.2)  # deliveries 2 and 3 were lost in transit
    assert published(effects) == [] and acked(effects) == []
    assert of(effects, Notice)[0].fields["cause"] == "gap"
    assert phase(engine) is not Phase.RUNNING
    reset = engine.tick(2.5)
    assert of(reset, RequestResync)[0].cause is ResetCause.GAP
    effects = engine.resynced(PullAnchor(last_consumer_seq=4, last_stream_seq=4), 2.6)
    assert of(effects, FetchOrigin) == [FetchOrigin(1, 4)]
    assert of(effects, Pull) == []  # nothing new is asked for before the hole is filled
    assert phase(engine) is Phase.FILLING
    fetched = [OriginMessage(s, f"orders.{s}", None, b"x", 1000 * s) for s in (2, 3, 4)]
    effects = engine.fetched(fetched, 4, 2.7)
    assert published(effects) == [2, 3, 4]
    assert of(effects, Pull)
    stored = store_all(engine, effects)
    assert acked(stored) == []  # read from the stream: no ack subject until the consumer redelivers them
    # the redeliveries come after ack_wait: duplicates, acked at once
    redelivered = engine.data(data(5, 2, delivered=2), 40.0) + engine.data(data(6, 3, delivered=2), 40.0)
    assert published(redelivered) == [] and acked(redelivered) == [2, 3]
    assert published(engine.data(data(7, 5), 40.1)) == [5]


def test_a_heartbeat_naming_another_last_delivery_resyncs() -> None:
    engine, _ = running()
    engine.data(data(1, 1), 0.1)
    assert engine.heartbeat(Heartbeat(1, 1, None), 0.5) == []
    effects = engine.heartbeat(Heartbeat(3, 3, None), 1.0)
    assert of(effects, Notice)[0].fields["cause"] == ResetCause.HEARTBEAT_MISMATCH.value


def test_silence_counts_only_while_a_request_is_outstanding() -> None:
    engine, _ = running()
    assert engine.credits.requested == 8
    effects = engine.tick(SETTINGS.silence_timeout + 0.5)
    assert of(effects, Notice)[0].fields["cause"] == ResetCause.SILENCE.value
    idle, _ = running()
    idle.pull_status(PullStatus(408, "Request Timeout", "_INBOX.x", 8, 0), 0.5)
    idle.credits.clear()  # nothing asked for (say the pipeline is full)
    assert not [n for n in of(idle.tick(SETTINGS.silence_timeout + 0.6), Notice) if n.event == "discontinuity"]


def test_a_request_end_gives_back_its_remainder_and_asks_again() -> None:
    engine, _ = running()
    engine.data(data(1, 1), 0.1)
    assert engine.credits.requested == 7
    effects = engine.pull_status(PullStatus(408, "Request Timeout", "_INBOX.x", 7, 0), 30.0)
    # one message unstored: 7 free, at least half the capacity, so a new request for 7
    assert of(effects, Pull) == [Pull(7, 30.0, pull_heartbeat(SETTINGS.silence_timeout))]


def test_nothing_is_pulled_while_the_pipeline_is_full_or_blocked() -> None:
    engine, _ = running()
    effects: list[Effect] = []
    for i in range(1, 9):
        effects += engine.data(data(i, i), 0.1)
    assert of(effects, Pull) == []  # 8 unstored: no room
    publishes = of(effects, Publish)
    store_all(engine, publishes[1:])  # room again behind the first, which fails: the source blocks
    engine.publish_failed(publishes[0].entry.order, 1, "no space", 0.2)
    assert engine.pipeline.degraded
    assert of(engine.tick(0.3), Pull) == []


def test_consumer_deleted_resyncs_and_a_recreated_consumer_is_noticed() -> None:
    engine, _ = running()
    engine.consumer_bound("t1")
    engine.data(data(1, 1), 0.5)
    effects = engine.pull_status(PullStatus(409, "Consumer Deleted", "_INBOX.x"), 1.0)
    assert of(effects, Notice)[0].fields["cause"] == ResetCause.CONSUMER_GONE.value
    engine.tick(3.0)
    effects = engine.resynced(PullAnchor(0, 0, created="t2"), 3.1)
    assert [n.event for n in of(effects, Notice)] == ["consumer.recreated", "resync.done"]


def test_a_restarted_server_reporting_another_creation_time_is_not_a_recreation() -> None:
    """nats-server 2.10 and 2.11 report a slightly different ``created`` after a restart; the delivery sequence
    goes on where it was, which a re-created consumer's cannot."""
    engine, _ = running()
    engine.consumer_bound("t1")
    engine.data(data(1, 1), 0.5)
    engine.source_reconnected(1.0)
    engine.tick(3.0)
    effects = engine.resynced(PullAnchor(1, 1, created="t1+0.2ms"), 3.1)
    assert [n.event for n in of(effects, Notice)] == ["resync.done"]


def test_a_redelivery_above_accepted_in_a_clean_epoch_means_someone_else_pulled() -> None:
    engine, _ = running()
    effects = engine.data(data(1, 5, delivered=3), 0.1)
    assert published(effects) == []
    assert of(effects, Notice)[0].event == "discontinuity"


def test_an_unfit_anchor_fails_the_resync() -> None:
    engine = PullEngine(PULL_SETTINGS, 0.0)
    engine.recovered(0, [], 0.0)
    effects = engine.resynced(PullAnchor(0, 0, fit=False), 0.0)
    assert [n.event for n in of(effects, Notice)] == ["reset.failed"]
    assert phase(engine) is Phase.RESET_WAIT


def test_flow_control_requests_are_not_pull_traffic() -> None:
    engine, _ = running()
    assert [n.event for n in of(engine.receive(FlowControlRequest("$JS.FC.x"), 0.1), Notice)] == ["unrecognised"]


def test_shutdown_stops_pulling_and_acks_what_gets_stored() -> None:
    engine, _ = running()
    effects = engine.data(data(1, 1), 0.1)
    engine.begin_shutdown(0.2)
    assert engine.credits.requested == 0
    stored = store_all(engine, effects)
    assert acked(stored) == [1] and of(stored, Pull) == []
    assert engine.final_answer() == []


def test_shutdown_commits_an_open_batch() -> None:
    """As in flow-control mode: a stop sends no more members, so the open batch's commit goes out at once."""
    engine, _ = running()
    engine.pipeline.window = 4
    engine.target_limits(TargetLimits(1024 * 1024, -1, ("agg.>",), batched=True), 0.0)
    first = engine.data(data(1, 1), 0.1)
    for n in range(2, 8):
        engine.data(data(n, n), 0.1)
    publish = of(first, Publish)[0]
    sent = of(engine.publish_stored(publish.entry.order, publish.attempt, 0.2), Publish)
    assert [p.entry.stream_seq for p in sent] == [2, 3, 4, 5] and {p.batch for p in sent} == {1}
    commits = of(engine.begin_shutdown(0.3), Publish)
    assert [(p.entry.stream_seq, p.op) for p in commits] == [(5, BATCH_COMMIT_EOB)]


def test_ack_ledger_and_credits() -> None:
    ledger = AckLedger()
    ledger.taken(1, "a")
    ledger.taken(2, None)
    ledger.taken(3, "c")
    ledger.redelivered(2, "b")
    assert ledger.covered(2) == ("a", "b")
    assert ledger.covered(3) == ("c",) and len(ledger) == 0
    credits = PullCredits()
    credits.pulled(10, 0.0, 5.0)
    credits.delivered()
    credits.released(4)
    assert credits.requested == 5
    credits.expire(6.0)
    assert credits.requested == 5  # within the grace after expiry: its end may still come
    credits.expire(8.0)
    assert credits.requested == 0


def test_credits_know_each_requests_first_and_last_delivery() -> None:
    """What the window's sizing in pull mode reads: requests are served oldest first."""
    credits = PullCredits()
    credits.pulled(2, 1.0, 5.0)
    credits.pulled(3, 1.5, 5.0)
    assert credits.delivered() == (1.0, False)  # the first request's first delivery: it was sent at 1.0
    assert credits.delivered() == (-1.0, True)  # and its last
    assert credits.delivered() == (1.5, False)
    credits.released(2)  # the second ended (expired) with two left
    assert credits.requested == 0
    assert credits.delivered() == (-1.0, False)  # a delivery no request of ours accounts for
    credits.pulled(1, 2.0, 5.0)
    assert credits.delivered() == (2.0, True)  # one request, one delivery: first and last
    credits.pulled(4, 3.0, 5.0)
    credits.clear()
    assert credits.delivered() == (-1.0, False)


def test_an_ack_floor_above_what_was_taken_is_adopted_as_a_skip() -> None:
    """Acked by someone else (or the aggregate lost the copies): not ours to replicate, as in flow-control mode."""
    engine = PullEngine(PULL_SETTINGS, 0.0)
    engine.recovered(3, [], 0.0)
    effects = engine.resynced(PullAnchor(last_consumer_seq=9, last_stream_seq=12, ack_floor=10), 0.0)
    assert of(effects, FetchOrigin) == [FetchOrigin(10, 12)]  # only what was delivered above the floor
    assert of(effects, Notice)[0].fields["skipped_from"] == 4
    fetched = [OriginMessage(s, f"orders.{s}", None, b"x", 1000 * s) for s in (11, 12)]
    publishes = of(engine.fetched(fetched, 12, 0.1), Publish)
    assert [p.entry.stream_seq for p in publishes] == [11, 12]
    message = publishes[0].entry.message
    assert message is not None and message.headers["Bridge-Skipped"] == "4-10"


def paced(rate: int) -> tuple[PullEngine, list[Effect]]:
    engine = PullEngine(replace(PULL_SETTINGS, rate_limit=rate, pull_capacity=100), 0.0)
    engine.recovered(0, [], 0.0)
    return engine, engine.resynced(PullAnchor(0, 0), 0.0)


def big(dseq: int, size: int = 92) -> Data:
    """A delivery of ``size`` + its subject's 8 bytes (what pacing counts)."""
    info = AckInfo(STREAM, CONSUMER, 1, dseq, dseq, 1000 * dseq, 0)
    return Data(info, f"orders.{dseq % 10}", None, b"x" * size, reply(dseq, dseq))


def test_a_rate_limit_in_pull_mode_paces_the_requests_by_the_bytes_delivered() -> None:
    """rate_limit 1,000 B/s, 100-byte messages: one message first (no size seen yet), then no request until what
    came is paid for at the limit, each asking for a second's worth (10 messages)."""
    engine, effects = paced(1000)
    assert [p.batch for p in of(effects, Pull)] == [1]
    effects = engine.data(big(1), 0.0)
    store_all(engine, effects, 0.05)
    assert of(engine.tick(0.05), Pull) == []  # 100 bytes take 0.1 s at the limit
    assert [p.batch for p in of(engine.tick(0.1), Pull)] == [10]
    effects = []
    for dseq in range(2, 12):
        effects += engine.data(big(dseq), 0.2)
    store_all(engine, effects, 0.3)
    assert of(engine.tick(1.0), Pull) == []  # 1,000 bytes from 0.2 s: paid for at 1.2 s
    assert [p.batch for p in of(engine.tick(1.2), Pull)] == [10]


def test_a_rate_limit_taken_in_place_changes_the_pace() -> None:
    engine, _ = paced(1000)
    engine.rate_limited(0)
    # no limit: the ordinary threshold (half the capacity free) decides, at once: 99 free beside the one unstored
    assert [p.batch for p in of(engine.data(big(1), 0.0), Pull)] == [99]
