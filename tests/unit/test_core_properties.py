"""Simulation tests: the engine against a model of the origin server and the aggregate (tests/unit/sim.py).

Hypothesis chooses the configuration (WorkQueue or Limits origin, v1 or v2 subjects, windows, max_ack_pending,
filtered sequences) and the order of events, faults included: lost, duplicated and rewound deliveries, lost
flow-control requests and answers, foreign RESETs backward and forward (past the end too), RESET errors and
timeouts (applied at the server or not), publish rejections, lost publishes and lost publish acks, reordered
acks, ack timeouts (the clock jumps), failed aggregate reads, a target rejecting everything for a while, target
reconnects, bridge crashes and SIGTERM restarts. After every step the simulator checks docs/design.md's invariants:

* (a) SAFETY: an FC answer never names a ``Nats-Last-Stream`` above the contiguously stored (or purposely skipped)
  prefix, nor a position while a RESET is pending; the engine's watermark never claims more; the WorkQueue never
  deletes an unstored message;
* (b) no origin sequence is published after the engine was told it is stored; one ``Nats-Msg-Id`` per sequence;
* (c) first publishes in increasing origin order (per bridge process), and no copy is stored past an earlier
  message that was never published (no silent hole); RESETs at least ``reset_min_interval`` apart, one at a time;

then heals every fault, runs to quiescence, and checks (d) every message not skipped is stored exactly once and
intact (payload, subject, provenance, renamed headers), (e) the WorkQueue holds nothing but skipped messages (a
Limits consumer's floor reaches the end), (f) liveness: quiescence within 400 simulated seconds, no stuck FC.
A failure shows the falsifying configuration and event list, and the tail of the simulation trace.
"""

from __future__ import annotations

import random
from typing import Final

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bridge.testing.engines import examples
from tests.unit.sim import Sim, SimConfig

Event = tuple[str, int]

# the ordinary flow is listed several times so that runs make progress between faults; "pump" is a macro step
FLOW: Final = (
    ["deliver"] * 6
    + ["recv"] * 6
    + ["target_ok"] * 4
    + ["ack"] * 4
    + ["answer"] * 3
    + ["hb"] * 2
    + ["reset_ok"] * 2
    + ["pump"] * 3
    + ["burst"] * 2
    + ["recv_many"] * 3
    + ["ack_many"] * 3
    + ["verify"] * 2
    + ["probe"]
    + ["settle"]
)
FAULTS: Final = [
    "drop",
    "dup",
    "target_reject",
    "target_lost",
    "target_lost_ack",
    "lose_answer",
    "reset_error",
    "reset_timeout",
    "foreign_reset",
    "rewind",
    "reject_all_on",
    "reject_all_off",
    "target_reconnect",
    "source_reconnect",
    "tick",
    "publish_more",
    "verify_fail",
]
TICKS: Final = (0.1, 0.5, 2.5, 6.0)


def run_event(sim: Sim, event: Event) -> None:
    kind, p = event
    n = sim.config.n
    match kind:
        case "deliver":
            sim.step_deliver()
        case "recv":
            sim.step_receive()
        case "recv_many":
            sim.step_receive_many(2 + p % 30)
        case "ack_many":
            sim.step_ack_many(2 + p % 30)
        case "drop":
            sim.step_drop()
        case "dup":
            sim.step_duplicate()
        case "hb":
            sim.step_heartbeat()
        case "tick":
            sim.step_tick(TICKS[p % len(TICKS)])
        case "target_ok":
            sim.step_target("ok")
        case "target_reject":
            sim.step_target("reject")
        case "target_lost":
            sim.step_target("lost")
        case "target_lost_ack":
            sim.step_target("lost_ack")
        case "ack":
            sim.step_ack(p)
        case "answer":
            sim.step_answer_arrives()
        case "lose_answer":
            sim.step_answer_lost()
        case "reset_ok":
            sim.step_reset_reply("ok")
        case "reset_error":
            sim.step_reset_reply("error")
        case "reset_timeout":
            sim.step_reset_reply("timeout")
        case "foreign_reset":
            sim.step_foreign_reset(p % (n + 4))  # 0 = to the ack floor; up to 3 past the stream's end
        case "rewind":
            sim.step_rewind(p)
        case "reject_all_on":
            sim.step_reject_all(True)
        case "reject_all_off":
            sim.step_reject_all(False)
        case "target_reconnect":
            sim.step_target_reconnect()
        case "source_reconnect":
            sim.step_source_reconnect()
        case "publish_more":
            sim.step_publish_more(1 + p % 5)
        case "pump":
            pump(sim, 1 + p % 4)
        case "settle":  # a heartbeat's FC request answered: the consumer at rest when all is stored
            settle(sim)
        case "burst":  # several deliveries received at once: publishes pile up in flight
            for _ in range(1 + p % 6):
                sim.step_deliver()
                sim.step_receive()
        case "verify":
            sim.step_verify(True)
        case "verify_fail":
            sim.step_verify(False)
        case "probe":
            sim.step_probe()
        case "crash":
            sim.crash(reset_applied=p % 2 == 1)
        case "sigterm":
            sim.graceful_restart()
        case _:
            raise AssertionError(f"unknown event {kind}")


def pump(sim: Sim, rounds: int) -> None:
    """Ordinary progress: the server delivers, the bridge receives, the target stores and acks in order."""
    for _ in range(rounds):
        sim.step_deliver()
        sim.step_receive()
        sim.step_target("ok")
        sim.step_ack(0)
        sim.step_verify(True)
        sim.step_answer_arrives()
        sim.check_watermark()


def settle(sim: Sim) -> None:
    """A quiet moment: a heartbeat and its FC request are received and the answer reaches the server; when
    everything delivered is stored, the consumer is then at rest (a later reset or restart finds it so)."""
    sim.step_heartbeat()
    sim.step_receive_many(4)
    sim.step_answer_arrives()


@st.composite
def configs(draw: st.DrawFn) -> SimConfig:
    n = draw(st.integers(0, 24))
    absent = draw(st.frozensets(st.integers(1, max(n, 1)), max_size=n // 3)) if n else frozenset()
    window = draw(st.sampled_from((1, 2, 3, 8)))
    return SimConfig(
        n=n,
        absent=absent,
        published=draw(st.one_of(st.just(n), st.integers(0, n))),
        max_ack_pending=draw(st.sampled_from((1, 2, 3, 5, 100))),
        publish_window=window,
        v2=draw(st.booleans()),
        limits=draw(st.booleans()),
        # a restart's read of the aggregate may be cut short: down to one window, the least the fallback needs
        recovery_cap=draw(st.sampled_from((0, 0, 1, 2, 4))) * window,
        batched=draw(st.booleans()),
    )


@st.composite
def scenarios(draw: st.DrawFn, faults: list[str]) -> tuple[SimConfig, list[Event]]:
    """A configuration and an event list using a few fault kinds only, so that each run gets somewhere."""
    config = draw(configs())
    enabled = draw(st.lists(st.sampled_from(faults), min_size=1, max_size=4, unique=True))
    # faults are one event in six to one in three: enough to hit every state, rare enough for progress
    kinds = FLOW + enabled * draw(st.sampled_from((2, 4, 8)))
    script = draw(st.lists(st.tuples(st.sampled_from(kinds), st.integers(0, 40)), min_size=30, max_size=250))
    return config, script


def simulate(config: SimConfig, script: list[Event], sim: Sim | None = None) -> Sim:
    sim = sim or Sim(config)
    for event in script:
        sim.log(f"--- event {event}")
        run_event(sim, event)
        sim.check_watermark()
    sim.heal_and_settle()
    sim.check_final()
    return sim


SETTINGS = settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scenario=scenarios(FAULTS))
@example(  # a gap: dseq 2 lost, 3 arrives -> reset, everything redelivered, 1 not published twice
    scenario=(
        SimConfig(n=4, published=4, max_ack_pending=100, publish_window=3),
        [("reset_ok", 0), *[("deliver", 0)] * 3, ("recv", 0), ("drop", 0), ("recv", 0), ("tick", 2)],
    )
)
@example(  # Limits origin, everything acked, a foreign reset far back: answers must follow the walk (commit 122cbb2)
    scenario=(
        SimConfig(n=30, published=30, max_ack_pending=3, publish_window=8, limits=True),
        [("reset_ok", 0), *[("pump", 3)] * 15, ("hb", 0), ("pump", 3), ("hb", 0), ("pump", 3), ("foreign_reset", 5)],
    )
)
@example(  # held FC, gap, reset requested, then the held FC's publishes are acked: no old-epoch answer
    scenario=(
        SimConfig(n=2, published=2, max_ack_pending=1, publish_window=1),
        [
            *[("hb", 0), ("reset_ok", 0), ("deliver", 0), ("recv", 0), ("recv", 0), ("hb", 0)],
            *[("foreign_reset", 0), ("drop", 0), ("deliver", 0), ("recv", 0), ("target_ok", 0), ("ack", 0)],
        ],
    )
)
@example(  # a foreign forward reset past the end of the stream
    scenario=(
        SimConfig(n=6, published=3, max_ack_pending=2, publish_window=2),
        [("reset_ok", 0), ("deliver", 0), ("recv", 0), ("foreign_reset", 9), ("deliver", 0), ("hb", 0)],
    )
)
@example(  # a publish times out, the read of the target fails, its late ack settles it: no read is left to do
    # (the pipeline kept the read's generation: a quiet engine asked for an empty one before its tick deadline)
    scenario=(
        SimConfig(n=3, published=3, max_ack_pending=1, publish_window=1),
        [("reset_ok", 0), ("deliver", 0), ("recv", 0), ("tick", 3), ("verify_fail", 0)],
    )
)
def test_engine_keeps_invariants_under_faults(scenario: tuple[SimConfig, list[Event]]) -> None:
    simulate(*scenario)


@SETTINGS
@given(scenario=scenarios([*FAULTS, "crash", "crash", "sigterm"]))
@example(  # publish 1 rejected, 2 stored, crash: restart must not take 2 as the watermark
    scenario=(
        SimConfig(n=3, published=3, max_ack_pending=100, publish_window=3),
        [
            *[("reset_ok", 0), ("deliver", 0), ("deliver", 0), ("recv", 0), ("recv", 0)],
            *[("target_reject", 0), ("target_ok", 0), ("crash", 0)],
        ],
    )
)
@example(  # a Limits origin's new leader resumes before an acked delivery: its ack floor comes back with it
    scenario=(
        SimConfig(n=1, published=1, max_ack_pending=1, publish_window=1, limits=True),
        [("reset_ok", 0), ("pump", 1), ("rewind", 0), ("crash", 0)],
    )
)
@example(  # foreign resets forward to 2 then back to 1: the bridge's answer (1, 2) reaches the new epoch, whose
    # dseq 1 is sseq 1; its own reset then found "nothing pending, floor at the last delivery" and took the consumer
    # at rest, which walked 2 (at the floor) into pending for good (Limits, max_ack_pending 1)
    scenario=(
        SimConfig(n=2, published=2, max_ack_pending=1, publish_window=1, limits=True),
        [("hb", 0), ("hb", 0), ("reset_ok", 0), ("foreign_reset", 2), ("deliver", 0), ("foreign_reset", 1)],
    )
)
def test_engine_keeps_invariants_across_restarts(scenario: tuple[SimConfig, list[Event]]) -> None:
    # restarts recover as the runtime does: copies above the consumer's ack floor, the chain anchored there
    simulate(*scenario)


def test_a_quiet_run_replicates_everything_and_empties_the_workqueue() -> None:
    """Sanity of the model itself: no faults at all, the WorkQueue ends empty and every FC answer acked."""
    sim = simulate(SimConfig(n=20, absent=frozenset({4, 9}), published=20, max_ack_pending=3, publish_window=4), [])
    assert sim.origin.remaining() == set()
    assert sim.target.store_order == [s for s in range(1, 21) if s not in (4, 9)]
    assert sim.origin.asflr == 20
    assert sim.answers_with_ack > 0
    assert sim.resets_requested == 1  # only the start


@pytest.mark.parametrize("restart", ["silence", "crash", "sigterm"])
def test_a_consumer_at_rest_goes_on_without_a_reset(restart: str) -> None:
    """Everything delivered is stored and acked; the reset a silence asks for, or a restart's, finds the consumer
    at rest: no RESET is sent, the epoch goes on after its last delivery (5), and what comes next is replicated."""
    sim = Sim(SimConfig(n=10, published=5, max_ack_pending=100, publish_window=8))
    quiet: list[Event] = [("reset_ok", 0), ("pump", 3), ("pump", 1), ("pump", 0), ("settle", 0)]
    after = {"silence": [("tick", 3)] * 4, "crash": [("crash", 0)], "sigterm": [("sigterm", 0)]}[restart]
    more: list[Event] = [("reset_ok", 0), ("publish_more", 5), ("pump", 3), ("pump", 3)]
    simulate(sim.config, [*quiet, *after, *more], sim)
    assert sim.origin.asflr == 10 and sim.target.store_order == list(range(1, 11))
    assert not any("server applies RESET" in line for line in sim.trace)  # not at start either: a new consumer
    assert any(line.endswith("RESET not needed: the epoch goes on after dseq 5") for line in sim.trace)


@pytest.mark.parametrize("seed", range(12))
def test_long_random_runs(seed: int) -> None:
    """Seeded soak: a longer stream, every fault kind (crashes and SIGTERM restarts too), thousands of events.

    Hypothesis explores short scripts well and shrinks them; this reaches the deep states (many epochs, many
    lives, long backlogs). A failure names the seed; the trace tail tells the story.
    """
    rng = random.Random(seed)
    n = rng.randint(30, 120)
    window = rng.choice((1, 2, 4, 16))
    config = SimConfig(
        n=n,
        absent=frozenset(rng.sample(range(1, n + 1), n // 10)),
        published=rng.randint(0, n),
        max_ack_pending=rng.choice((1, 3, 8, 1000)),
        publish_window=window,
        v2=rng.random() < 0.5,
        limits=seed % 2 == 1,
        recovery_cap=rng.choice((0, 1, 2)) * window,
    )
    kinds = FLOW * (1 + seed % 3) + FAULTS
    script = [(rng.choice(kinds), rng.randint(0, 40)) for _ in range(3000)]
    for _ in range(6):  # a few restarts, not one every hundred events
        script.insert(rng.randrange(len(script)), (rng.choice(["crash", "sigterm"]), rng.randint(0, 40)))
    simulate(config, script)


def test_a_batched_target_keeps_origin_order_where_plain_publishes_lose_it() -> None:
    """A publish refused while the ones pipelined behind it are stored (a stream leader moving): plain publishes
    store the later ones first; as a fast batch, nothing after the refused member is stored, and the re-sends keep
    origin order (the sim's ORDER check, after every store)."""
    script: list[Event] = [("reset_ok", 0), *[("deliver", 0)] * 4, ("recv_many", 2)]
    script += [("target_reject", 0), ("target_ok", 0), ("target_ok", 0), ("target_ok", 0), ("ack_many", 10)]
    plain = simulate(SimConfig(n=4, published=4, max_ack_pending=4, publish_window=4), script)
    assert plain.target.store_order != sorted(plain.target.store_order)  # the hazard is real without batches
    batched = simulate(SimConfig(n=4, published=4, max_ack_pending=4, publish_window=4, batched=True), script)
    assert batched.target.store_order == [1, 2, 3, 4]
