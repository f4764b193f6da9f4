"""Pull mode against a model of the origin server and the aggregate (tests/unit/pull_sim.py).

Hypothesis chooses the configuration (WorkQueue, Interest or Limits origin, a subject filter or none,
``max_ack_pending``, the publish window, the pull requests' expiry, the aggregate's duplicate window) and the order
of events, faults included: deliveries lost on their way to the bridge, acks and pull requests lost on their way to
the server, the clock jumping past ``ack_wait`` and ``silence_timeout``, publishes refused, the target down for a
while or its connection lost, reads of the origin or the aggregate failing, resyncs failing, the consumer deleted
(and re-created by an operator or by the bridge's bind), the origin server restarting and forgetting acks, the
connection blipping, bridge crashes and SIGTERM restarts. After every step the simulator checks

* (a) SAFETY: every ack the engine sends, and every ack the server receives, names a message the aggregate holds;
  the consumer's ack floor and the engine's watermark never claim more than the aggregate holds contiguously;
* (b) NO DUPLICATE: no origin sequence is stored twice (by ``Bridge-Seq``), whatever the duplicate window;
* (c) ORDER: copies are stored in increasing origin order, but for a hole left by a refused or lost publish;

then heals every fault and checks (d) every message of the source is stored, intact, and (e) a WorkQueue or
Interest origin holds none of them any more, within ``HEAL_BOUND`` simulated seconds (plus however long the server
itself still holds a redelivery back, ``OriginServer.held_back``). Seeded long runs reach deeper states; scenario
tests pin the faults one by one, and the two engine bugs the simulator found (now fixed).
"""

from __future__ import annotations

import os
import random
from typing import Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.testing.engines import examples
from tests.unit.pull_sim import ACK_WAIT, RESET_BACKOFF, AckUp, PullSim, PullSimConfig, PullUp

Event = tuple[str, int]

# a healed source settles within a few ack waits (a message read from the stream by a resync, or whose ack was lost,
# is acked when the consumer redelivers it), plus the longest reset backoff the faults can have built up
HEAL_BOUND: Final = RESET_BACKOFF.maximum + 4 * ACK_WAIT

FLOW: Final = (
    ["serve"] * 6
    + ["recv"] * 6
    + ["up"] * 4
    + ["target"] * 4
    + ["pack"] * 4
    + ["tick"] * 3
    + ["resync"] * 2
    + ["fetch"] * 2
    + ["verify"] * 2
    + ["pump"] * 3
    + ["recv_many"] * 3
    + ["pack_many"] * 3
)
FAULTS: Final = [
    "drop",
    "lose_ack",
    "lose_pull",
    "long_tick",
    "target_refuse",
    "target_down",
    "target_up",
    "target_reconnect",
    "resync_fail",
    "fetch_fail",
    "verify_fail",
    "delete_consumer",
    "recreate_consumer",
    "server_restart",
    "link_blip",
    "publish_more",
]
RESTARTS: Final = ["crash", "crash", "sigterm"]
TICKS: Final = (0.1, 0.5, 1.0, 2.5)
LONG_TICKS: Final = (ACK_WAIT + 0.5, 12.0, 31.0)


def run_event(sim: PullSim, event: Event) -> None:
    kind, p = event
    match kind:
        case "serve":
            sim.step_serve()
        case "recv":
            sim.step_receive()
        case "recv_many":
            sim.step_receive_many(2 + p % 30)
        case "pack_many":
            sim.step_publish_acks(2 + p % 30)
        case "up":
            sim.step_server_in()
        case "target":
            sim.step_target()
        case "pack":
            sim.step_publish_ack()
        case "tick":
            sim.advance(TICKS[p % len(TICKS)])
        case "long_tick":
            sim.advance(LONG_TICKS[p % len(LONG_TICKS)])
        case "resync":
            sim.step_resync(True)
        case "fetch":
            sim.step_fetch(True)
        case "verify":
            sim.step_verify(True)
        case "pump":
            pump(sim, 1 + p % 4)
        case "drop":
            sim.step_drop()
        case "lose_ack":
            sim.step_lose_up(AckUp)
        case "lose_pull":
            sim.step_lose_up(PullUp)
        case "target_refuse":
            sim.step_target(refuse=True)
        case "target_down":
            sim.step_target_down(True)
        case "target_up":
            sim.step_target_down(False)
        case "target_reconnect":
            sim.step_target_reconnect(p)
        case "resync_fail":
            sim.step_resync(False)
        case "fetch_fail":
            sim.step_fetch(False)
        case "verify_fail":
            sim.step_verify(False)
        case "delete_consumer":
            sim.step_delete_consumer()
        case "recreate_consumer":
            sim.step_recreate_consumer()
        case "server_restart":
            sim.step_server_restart(p)
        case "link_blip":
            sim.step_link_blip(requests_lost=p % 2 == 1)
        case "publish_more":
            sim.step_publish_more(1 + p % 5)
        case "crash":
            sim.crash(p)
        case "sigterm":
            sim.shutdown()
        case _:
            raise AssertionError(f"unknown event {kind}")


def pump(sim: PullSim, rounds: int) -> None:
    """Ordinary progress: requests and acks reach the server, it delivers, the bridge receives, the target stores
    and acks, outstanding reads succeed; a tenth of a second passes."""
    for _ in range(rounds):
        sim.step_server_in()
        sim.step_serve()
        sim.step_receive()
        sim.step_target()
        sim.step_publish_ack()
        sim.step_resync(True)
        sim.step_fetch(True)
        sim.step_verify(True)
        sim.advance(0.1)
        sim.check()


@st.composite
def configs(draw: st.DrawFn) -> PullSimConfig:
    n = draw(st.integers(0, 20))
    window = draw(st.sampled_from((1, 2, 3, 8)))
    return PullSimConfig(
        n=n,
        published=draw(st.one_of(st.just(n), st.integers(0, n))),
        retention=draw(st.sampled_from(("workqueue", "interest", "limits"))),
        filters=draw(st.sampled_from(((), (), ("orders.1", "orders.2")))),
        max_ack_pending=draw(st.sampled_from((1, 2, 3, 5, 100))),
        publish_window=window,
        pull_expires=draw(st.sampled_from((4.0, 30.0))),
        dedupe_window=draw(st.sampled_from((0.0, 0.0, 2.0, 120.0))),
        recovery_cap=draw(st.sampled_from((0, 0, 1, 2))) * window,
    )


@st.composite
def scenarios(draw: st.DrawFn, faults: list[str]) -> tuple[PullSimConfig, list[Event]]:
    """A configuration and an event list with a few fault kinds only, so that each run gets somewhere."""
    config = draw(configs())
    enabled = draw(st.lists(st.sampled_from(faults), min_size=1, max_size=4, unique=True))
    kinds = FLOW + enabled * draw(st.sampled_from((2, 4, 8)))
    script = draw(st.lists(st.tuples(st.sampled_from(kinds), st.integers(0, 40)), min_size=20, max_size=150))
    return config, script


def simulate(config: PullSimConfig, script: list[Event]) -> PullSim:
    sim = PullSim(config)
    for event in script:
        sim.log(f"--- event {event}")
        run_event(sim, event)
        sim.check()
    sim.heal_and_settle(HEAL_BOUND)
    sim.check_final()
    return sim


# small enough for the file to run in about 10 s; PULL_SIM_EXAMPLES=20000 searches for several minutes
EXAMPLES: Final = int(os.environ.get("PULL_SIM_EXAMPLES", "600"))
SETTINGS = settings(max_examples=examples(EXAMPLES), suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scenario=scenarios(FAULTS))
def test_pull_engine_keeps_invariants_under_faults(scenario: tuple[PullSimConfig, list[Event]]) -> None:
    simulate(*scenario)


@SETTINGS
@given(scenario=scenarios([*FAULTS, *RESTARTS]))
def test_pull_engine_keeps_invariants_across_restarts(scenario: tuple[PullSimConfig, list[Event]]) -> None:
    simulate(*scenario)


LOSSY: Final = ["drop", "drop", "lose_ack", "lose_pull", "long_tick", "server_restart", "link_blip", "publish_more"]


@pytest.mark.parametrize("seed", range(24))
def test_long_random_runs(seed: int) -> None:
    """Seeded soak: longer streams, hundreds to a thousand events, every second seed with losses of every kind.

    Hypothesis explores short scripts and shrinks them; these reach the deep states: dozens of epochs and server
    restarts, pending lists whose redeliveries the server holds back (``OriginServer.held_back``). A failure names
    the seed; the trace tail tells the story.
    """
    rng = random.Random(seed)
    n = rng.randint(5, 60)
    window = rng.choice((1, 2, 3, 8))
    config = PullSimConfig(
        n=n,
        published=rng.randint(0, n),
        retention=rng.choice(("workqueue", "interest", "limits")),
        filters=rng.choice(((), ("orders.1", "orders.2"))),
        max_ack_pending=rng.choice((1, 2, 3, 5, 100)),
        publish_window=window,
        pull_expires=rng.choice((4.0, 30.0)),
        dedupe_window=rng.choice((0.0, 2.0, 120.0)),
        recovery_cap=rng.choice((0, 1, 2)) * window,
    )
    enabled = rng.sample([*FAULTS, *RESTARTS], rng.randint(1, 6)) + (LOSSY if seed % 2 else [])
    kinds = FLOW * rng.choice((1, 2)) + [kind for kind in enabled for _ in range(1 if kind in RESTARTS else 3)]
    simulate(config, [(rng.choice(kinds), rng.randint(0, 40)) for _ in range(rng.randint(200, 1000))])


# -- scenarios --------------------------------------------------------------------------------------------------


def started(config: PullSimConfig) -> PullSim:
    """A bridge past its first resync, its first pull request taken by the consumer."""
    sim = PullSim(config)
    sim.step_resync(True)
    sim.step_server_in()
    return sim


def settle(sim: PullSim) -> float:
    seconds = sim.heal_and_settle(HEAL_BOUND)
    sim.check_final()
    return seconds


def causes(sim: PullSim) -> list[str]:
    return [line.split("'cause': '")[1].split("'")[0] for line in sim.trace if "notice discontinuity" in line]


def test_a_quiet_run_replicates_everything_and_empties_the_workqueue() -> None:
    """Sanity of the model: no fault, one resync (the start), every message delivered once and acked once."""
    sim = PullSim(PullSimConfig(n=20, published=20, max_ack_pending=3, publish_window=4))
    assert settle(sim) == 0.0
    assert [c.seq for c in sim.agg.copies] == list(range(1, 21))
    assert sim.server.deliveries == 20 and sim.server.redeliveries == 0 and sim.acks_sent == 20
    assert sim.resyncs == 1 and sim.server.stream.messages == {}


def test_lost_deliveries_are_read_from_the_stream_and_acked_when_redelivered() -> None:
    sim = started(PullSimConfig(n=6, published=6, max_ack_pending=100, publish_window=8))
    for _ in range(6):
        sim.step_serve()
    sim.step_receive()  # 1
    sim.step_drop()  # 2 and 3 lost on the way: the server counts them delivered
    sim.step_drop()
    sim.step_receive()  # dseq 4 after 1: a gap
    assert causes(sim) == ["gap"]
    seconds = settle(sim)
    assert sim.engine.stats.fetched >= 2  # 2 and 3 were read from the stream, not waited for
    assert sim.server.redeliveries >= 2  # ... and acked when the consumer redelivered them
    assert [c.seq for c in sim.agg.copies] == [1, 2, 3, 4, 5, 6]
    assert seconds <= 2 * ACK_WAIT


def test_lost_acks_come_back_as_redeliveries_and_are_acked_again() -> None:
    sim = started(PullSimConfig(n=4, published=4, max_ack_pending=100, publish_window=8))
    for _ in range(4):
        sim.step_serve()
        sim.step_receive()
        sim.step_target()
        sim.step_publish_ack()
    assert sim.acks_sent == 4
    sim.step_lose_up(AckUp)  # the acks of 1 and 2 never reach the server
    sim.step_lose_up(AckUp)
    seconds = settle(sim)
    assert sim.server.redeliveries == 2 and sim.acks_sent == 6
    assert [c.seq for c in sim.agg.copies] == [1, 2, 3, 4]  # redelivered, never published again
    assert sim.server.stream.messages == {}
    assert ACK_WAIT <= seconds <= 2 * ACK_WAIT


def test_a_target_outage_longer_than_ack_wait_redelivers_no_more_than_was_pulled() -> None:
    """While the target is down the pipeline fills and nothing more is asked for: the server sends nothing, its
    redelivery queue included, however many ack waits pass."""
    config = PullSimConfig(n=40, published=40, max_ack_pending=100, publish_window=4)
    capacity = min(config.max_ack_pending, config.publish_window)
    sim = started(config)
    pump(sim, 8)
    sim.step_target_down(True)
    delivered_before, requested_before = sim.server.deliveries, sim.server.requested
    for _ in range(3 * int(ACK_WAIT) * 4):  # three ack waits of ordinary traffic against a target that is down
        pump(sim, 1)
        sim.advance(0.15)
    assert sim.server.deliveries - delivered_before <= capacity
    assert sim.server.requested - requested_before <= capacity
    assert sim.engine.pipeline.degraded
    settle(sim)
    assert sim.server.redeliveries <= capacity
    assert [c.seq for c in sim.agg.copies] == list(range(1, 41))


def test_a_deleted_consumer_is_noticed_and_recreated_by_the_resync() -> None:
    sim = started(PullSimConfig(n=10, published=10, max_ack_pending=100, publish_window=4))
    pump(sim, 3)
    sim.step_delete_consumer()  # its waiting request gets 409 Consumer Deleted
    pump(sim, 3)
    assert causes(sim) == ["consumer_gone"]
    settle(sim)
    assert sim.server.generation == 2  # re-created by the resync's bind
    assert any("notice consumer.recreated" in line for line in sim.trace)


def test_a_server_restart_that_forgets_acks_gets_them_again() -> None:
    sim = started(PullSimConfig(n=6, published=6, max_ack_pending=100, publish_window=8))
    sim.drain()
    assert sim.server.stream.messages == {} and sim.acks_sent == 6
    # the last three acks were not persisted, and neither were the deletions they caused
    sim.step_server_restart((3 << 1) | 1)
    assert sorted(sim.server.stream.messages) == [4, 5, 6]
    assert causes(sim) == ["reconnect"]
    seconds = settle(sim)
    assert sim.server.redeliveries == 3 and sim.acks_sent == 9
    assert [c.seq for c in sim.agg.copies] == [1, 2, 3, 4, 5, 6]
    assert seconds <= 2 * ACK_WAIT


def test_a_crash_with_publishes_in_flight_loses_and_duplicates_nothing() -> None:
    """No duplicate window at all: what the crashed process had in flight is found by recovery, not re-sent."""
    sim = started(PullSimConfig(n=8, published=8, max_ack_pending=100, publish_window=8, dedupe_window=0.0))
    for _ in range(8):
        sim.step_serve()
        sim.step_receive()
    sim.step_target()  # 1 stored, its ack still on its way
    sim.step_target(refuse=True)  # 2 refused
    sim.step_target()  # 3 stored
    # the crash: the acks it had written reach the server; of 4..8 in flight, the first two reach the aggregate
    sim.crash((2 << 1) | 1)
    assert [c.seq for c in sim.agg.copies] == [1, 3, 4, 5]
    assert sim.engine.watermark == 1  # the hole at 2 stops recovery; 3, 4 and 5 are known present
    settle(sim)
    assert [c.seq for c in sim.agg.copies] == [1, 3, 4, 5, 2, 6, 7, 8]  # the hole filled first, then the rest


def test_a_refused_publish_is_stored_after_later_ones_but_never_passed_over() -> None:
    """(c) in its exact form: a refused publish leaves a hole that its retry fills (a window is kept in flight)."""
    sim = started(PullSimConfig(n=3, published=3, max_ack_pending=100, publish_window=3))
    for _ in range(3):
        sim.step_serve()
        sim.step_receive()
    sim.step_target(refuse=True)
    settle(sim)
    assert [c.seq for c in sim.agg.copies] == [2, 3, 1]
    assert sim.refused == {1}


# -- engine bugs the simulator found (fixed): the expected behaviour ------------------------------------------


def test_consumer_deleted_with_no_request_waiting_is_recreated() -> None:
    """The consumer is deleted while the bridge's only pull request is still on its way (or while none is
    outstanding: the target is down, every request expired). No request waits, so no ``409 Consumer Deleted`` is
    sent; the request reaches no subscriber and the client gets ``503``. The engine clears its credits, reports
    ``unrecognised`` and pulls again at the next tick, which gets 503 again: a request every tick, activity every
    tick (so no silence either), the consumer never re-created, nothing replicated, for good. It takes a 503 to
    ``CONSUMER.MSG.NEXT`` as ``409 Consumer Deleted``: a resync, whose bind re-creates the consumer."""
    sim = PullSim(PullSimConfig(n=1, published=1))
    sim.step_resync(True)  # the first pull request is sent
    sim.step_delete_consumer()  # before it arrives
    sim.heal_and_settle(HEAL_BOUND)  # no operator this time: the bridge must re-create it


def test_recreated_consumer_whose_first_delivery_is_lost_is_not_taken_for_the_old_one() -> None:
    """The old consumer delivered sseq 1 (dseq 1), stored and acked (the WorkQueue deletes it). Its request
    expires; the engine's next request is on its way when an operator deletes and re-creates the consumer
    (``deliver_policy: all``: it starts at the stream's first message, 2, with delivery sequence 1). No request
    was waiting, so no ``409``. The new consumer delivers sseq 2 as dseq 1 (lost on the way) and sseq 3 as dseq 2,
    which is the engine's ``last_dseq + 1``: taken as the continuation, published with ``Bridge-Prev: 1``, and the
    watermark moves to 3 over the unstored 2. When 2 is redelivered (dseq 3, delivered 2) it is at or below the
    watermark: acked as stored, and deleted from the WorkQueue. The engine does not take a sequence jump over a
    message that exists as proof of continuity: on a consumer of the whole stream, a first delivery whose ``sseq``
    is above ``accepted + 1`` makes it read what lies in between from the origin (a ``FetchOrigin`` of the gap)
    and take that first."""
    sim = started(PullSimConfig(n=3, published=1, max_ack_pending=4, publish_window=4, pull_expires=4.0))
    sim.step_serve()
    sim.step_receive()  # sseq 1, dseq 1
    sim.step_target()
    sim.step_publish_ack()  # stored, acked ...
    sim.step_server_in()  # ... and deleted from the WorkQueue
    sim.advance(5.0)  # the request expires: a heartbeat, then 408
    sim.step_receive()
    sim.step_receive()  # the 408: the engine asks again
    sim.step_delete_consumer()  # no request waiting: no 409
    sim.step_recreate_consumer()
    sim.step_publish_more(2)
    sim.step_server_in()  # the request reaches the new consumer
    sim.step_serve()  # sseq 2 as dseq 1 ...
    sim.step_serve()  # sseq 3 as dseq 2
    sim.step_drop(even_renumbered=True)  # ... lost on the way
    sim.step_receive()  # dseq 2 = last_dseq + 1: taken after 1
    sim.check()
    sim.heal_and_settle(HEAL_BOUND)
    sim.check_final()
