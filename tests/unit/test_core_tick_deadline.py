"""How long a quiet engine may go without a tick (``Replication.tick_deadline``): the runtime's ticker passes a quiet
source by until then, so a tick before it must find nothing to do, and the first tick after it must do what a tick
every second would have done by then. The simulator checks the first half after every step of its schedules
(``Sim.ticked``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridge.core.ackreply import AckInfo
from bridge.core.effects import Notice, ProbeStranded, RequestReset, ResetCause, VerifyStored
from bridge.core.engine import SourceEngine
from bridge.core.inbound import Data
from bridge.core.pull import PullEngine
from bridge.core.watch import STRANDED_CHECK, STRANDED_CONFIRM, stranded_spread
from bridge.testing.engines import CONSUMER, SETTINGS, STREAM
from tests.unit.test_core_engine import beat, feed, of, start, store
from tests.unit.test_core_pull import PULL_SETTINGS


def test_a_quiet_source_has_nothing_due_until_its_silence_timeout_after_the_last_heartbeat() -> None:
    engine = start()  # silence_timeout 5 s
    assert engine.quiet and engine.tick_deadline(0.0) == 5.0
    engine.heartbeat(beat(0), 3.0)
    assert engine.tick_deadline(3.5) == 8.0
    for now in (4.0, 6.0, 7.9, 8.0):  # before the deadline (and at it: silence is "longer than"), nothing
        assert engine.tick(now) == []
    (reset,) = of(engine.tick(8.1), RequestReset)  # the first tick after it: what a tick each second does
    assert reset.cause is ResetCause.SILENCE
    assert not engine.quiet and engine.tick_deadline(8.1) == 8.1  # busy: every tick


def test_publishes_awaiting_their_acks_have_nothing_due_before_the_first_ack_deadline() -> None:
    """Busy with publishes in flight and nothing else: the first ack deadline (the acks are inputs)."""
    engine = start(silence_timeout=3600.0)  # ack_timeout 5 s
    feed(engine, [(1, 1)], 1.0)
    feed(engine, [(2, 2)], 2.0)
    assert not engine.quiet and engine.pipeline.awaiting_acks
    assert engine.tick_deadline(1.5) == 6.0
    for now in (1.5, 3.0, 5.9):
        assert engine.tick(now) == []
    assert engine.tick(6.0) != []  # the first publish timed out
    assert engine.tick_deadline(6.0) == 6.0  # failed, to verify: every tick


def test_a_busy_engine_with_more_than_acks_to_wait_for_and_an_engine_that_cannot_say_are_ticked_at_every_tick() -> None:
    engine = start(silence_timeout=3600.0, publish_window=1)
    feed(engine, [(1, 1), (2, 2)], 1.0)  # one in flight, one waiting for room in the window
    assert not engine.pipeline.awaiting_acks and engine.tick_deadline(1.0) == 1.0
    assert PullEngine(PULL_SETTINGS, 0.0).tick_deadline(2.0) == 2.0


def test_a_late_ack_that_settles_an_ambiguous_failure_leaves_nothing_due_before_the_deadline() -> None:
    """A publish times out (ambiguous: a read of the target is asked for), the read fails, then the publish's late
    ack arrives: the engine is quiet and nothing is left to verify, so no tick before its deadline does anything
    (found by the simulator: an empty VerifyStored at the next tick)."""
    engine = start(silence_timeout=3600.0, publish_window=1)
    sent = feed(engine, [(1, 1)], 0.0)
    assert of(engine.tick(5.0), VerifyStored) == [VerifyStored(1, (1,))]
    engine.verify_failed("target unavailable", 5.0)  # retried after 0.5 s
    store(engine, sent, now=5.1)
    assert engine.quiet and engine.watermark == 1
    deadline = engine.tick_deadline(5.1)
    assert deadline > 6.0
    assert engine.tick(6.0) == []


def test_the_deadline_is_never_further_than_an_input_without_a_tick_can_bring_one() -> None:
    """A new epoch's or a reconnect's look comes STRANDED_CHECK after it, a starting stall clock stalled_after after
    the last tick: the ticker keeps a deadline across a delivery and its ack, so none is further than those."""
    assert start(silence_timeout=3600.0).tick_deadline(1.0) == 1.0 + STRANDED_CHECK
    assert start(silence_timeout=3600.0, stalled_after=4.0).tick_deadline(1.0) == 5.0


def test_a_workqueue_source_is_ticked_for_its_look_and_not_while_the_look_is_out() -> None:
    engine = SourceEngine(replace(SETTINGS, silence_timeout=3600.0), 0.0)
    engine.recovered(0, (), 0.0, workqueue=True)
    engine.reset_succeeded(1, 0.0)
    store(engine, feed(engine, [(1, 1), (2, 2)], 1.0), 1.0)
    engine.flow_control("$JS.FC.ORDERS.BRIDGE.s0", 1.0)
    first = STRANDED_CHECK * (1 + stranded_spread(SETTINGS.source))  # the first look after the epoch began
    assert engine.tick_deadline(1.0) == min(first, 1.0 + STRANDED_CHECK)  # at most STRANDED_CHECK ahead
    assert engine.tick_deadline(first - 1.0) == first
    assert engine.tick(first - 0.1) == []
    assert of(engine.tick(first), ProbeStranded) == [ProbeStranded(1)]
    # a look is out: its answer (or its failure) is an input, after which the runtime places the source again
    assert engine.tick_deadline(first) == pytest.approx(first + STRANDED_CHECK)
    assert engine.tick(first + 0.05) == []  # nothing due meanwhile, not even another look
    engine.stranded_probed(1, first + 0.1)  # found once: a confirmation is due soon
    assert engine.tick_deadline(first + 0.1) == pytest.approx(first + 0.1 + STRANDED_CONFIRM)


def test_work_waiting_at_the_origin_keeps_the_stall_watch_on_time_and_a_stalled_source_is_ticked_each_second() -> None:
    engine = start(silence_timeout=3600.0, stalled_after=8.0)
    # delivered and stored, with 5 more waiting at the origin (a server holding them back): not idle
    delivery = Data(AckInfo(STREAM, CONSUMER, 1, 1, 1, 1000, 5), "orders.1", None, b"x")
    store(engine, engine.data(delivery, 1.0), 1.0)
    assert engine.quiet and engine.tick(1.5) == []  # the stall clock counts from here
    assert engine.tick_deadline(1.5) == 9.5
    assert engine.tick(9.4) == []
    assert [n.event for n in of(engine.tick(9.5), Notice)] == ["source.stalled"]
    assert engine.tick_deadline(9.6) == 9.6  # stalled: a tick each second notices the recovery
