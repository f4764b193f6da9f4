"""The one rule for inputs in the wrong phase, for both engines: such an input changes nothing and returns no
effects (``bridge.core.phases``), the outcomes of effects only the other consumer model asks for included, so a
runner can feed every outcome to the engine it holds without asking which engine that is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from bridge.core.ackreply import AckInfo
from bridge.core.effects import (
    Effect,
    OriginMessage,
    Publish,
    PullAnchor,
    RequestReset,
    RequestResync,
    ResetCause,
    ResetReply,
)
from bridge.core.engine import Phase, SourceEngine
from bridge.core.inbound import Data, PullStatus
from bridge.core.modes import Mode
from bridge.core.pull import PullEngine
from bridge.core.replication import Replication
from bridge.testing.engines import CONSUMER, SETTINGS, STREAM

PULL_SETTINGS = replace(SETTINGS, pull_capacity=8, pull_expires=30.0)


def engines() -> list[Replication]:
    return [SourceEngine(SETTINGS, 0.0), PullEngine(PULL_SETTINGS, 0.0)]


def state(engine: Replication) -> tuple[object, ...]:
    """What an input could change that the runner or an operator sees."""
    return (engine.phase, engine.watermark, engine.refusal, engine.accepted, engine.epoch, dict(engine.resets))


@pytest.mark.parametrize("engine", engines(), ids=lambda e: e.mode.value)
def test_recovered_in_the_wrong_phase_changes_nothing_not_even_the_refusal(engine: Replication) -> None:
    assert engine.awaits_recovery and not engine.takes_deliveries
    assert engine.recovered(10, (), 0.0, origin_last_seq=20)  # the first reset or resync is asked for
    before = state(engine)
    # a second recovery, one that would be refused: stale, so neither the phase nor the refusal moves
    assert engine.recovered(50, (), 1.0, origin_last_seq=20) == []
    assert state(engine) == before and engine.refusal is None


@pytest.mark.parametrize("engine", engines(), ids=lambda e: e.mode.value)
def test_a_refused_recovery_stays_recovering_and_a_later_good_one_clears_it(engine: Replication) -> None:
    assert engine.recovered(50, (), 0.0, origin_last_seq=20) == []
    assert engine.awaits_recovery and engine.refusal is not None
    assert engine.recovered(10, (), 1.0, origin_last_seq=20) != []
    assert not engine.awaits_recovery and engine.refusal is None


OTHER_MODELS_OUTCOMES: dict[Mode, list[Callable[[Replication], list[Effect]]]] = {
    # what a flow-control engine never asks for
    Mode.FLOW_CONTROL: [
        lambda e: e.resynced(PullAnchor(5, 5), 1.0),
        lambda e: e.fetched([OriginMessage(1, "orders.1", None, b"x", 1)], 1, 1.0),
        lambda e: e.fetch_failed("stream gone", 1.0),
    ],
    # what a pull engine never asks for
    Mode.PULL: [
        lambda e: e.reset_replied(ResetReply(1), 1.0),
        lambda e: e.stranded_probed(3, 1.0),
        lambda e: e.stranded_probe_failed("no answer", 1.0),
    ],
}


@pytest.mark.parametrize("engine", engines(), ids=lambda e: e.mode.value)
def test_outcomes_of_the_other_models_effects_change_nothing(engine: Replication) -> None:
    for outcome in OTHER_MODELS_OUTCOMES[engine.mode]:
        for recovered in (False, True):
            if recovered and engine.awaits_recovery:
                engine.recovered(0, (), 0.5)
            before = state(engine)
            assert outcome(engine) == []
            assert state(engine) == before


def test_each_model_asks_for_its_own_repair() -> None:
    flow, pull = engines()
    (reset,) = [e for e in flow.recovered(0, (), 0.0) if isinstance(e, RequestReset | RequestResync)]
    assert reset == RequestReset(ResetCause.START, 1)
    (resync,) = [e for e in pull.recovered(0, (), 0.0) if isinstance(e, RequestReset | RequestResync)]
    assert isinstance(resync, RequestResync) and resync.cause is ResetCause.START
    assert resync.settle_until is None  # nothing was ever pulled: no request of an old inbox to wait out


def test_the_runner_queries_follow_the_phase() -> None:
    engine = SourceEngine(SETTINGS, 0.0)
    assert (engine.awaits_recovery, engine.takes_deliveries) == (True, False)
    engine.recovered(0, (), 0.0)
    assert engine.phase is Phase.RESETTING
    assert (engine.awaits_recovery, engine.takes_deliveries) == (False, False)
    engine.reset_replied(ResetReply(1), 0.1)
    assert (engine.awaits_recovery, engine.takes_deliveries) == (False, True)
    engine.begin_shutdown(0.2)
    assert (engine.awaits_recovery, engine.takes_deliveries) == (False, False)


def test_an_engine_is_quiet_only_while_replicating_with_nothing_in_flight() -> None:
    flow, pull = engines()
    for engine in (flow, pull):
        assert not engine.quiet  # recovering
        engine.recovered(0, (), 0.0)
        assert not engine.quiet  # a reset or resync is pending
    flow.reset_replied(ResetReply(1), 0.1)
    assert flow.quiet
    effects = flow.receive(Data(AckInfo(STREAM, CONSUMER, 1, 1, 1, 1000, 0), "orders.1", None, b"x"), 0.2)
    assert any(isinstance(e, Publish) for e in effects) and not flow.quiet  # a publish in flight
    pull.resynced(PullAnchor(0, 0), 0.1)
    assert pull.quiet  # a pull request outstanding, nothing in flight
    pull.pull_status(PullStatus(409, "Exceeded MaxWaiting", "_INBOX.x"), 0.2)
    assert not pull.quiet  # refused: the next request goes out on a tick
