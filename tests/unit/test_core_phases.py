"""The phase table: every listed transition goes where the table says; every other event changes nothing."""

from __future__ import annotations

import pytest

from bridge.core.phases import TRANSITIONS, Event, Phase, PhaseMachine


def machine_in(phase: Phase) -> PhaseMachine:
    return PhaseMachine(phase)


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("event", list(Event))
def test_each_event_in_each_phase_follows_the_table_or_changes_nothing(phase: Phase, event: Event) -> None:
    machine = machine_in(phase)
    expected = TRANSITIONS[phase].get(event)
    assert machine.can(event) is (expected is not None)
    assert machine.process(event) is (expected is not None)
    assert machine.phase is (expected or phase)


def test_every_phase_is_reachable_from_the_start_and_stopping_is_final() -> None:
    seen, frontier = {Phase.RECOVERING}, [Phase.RECOVERING]
    while frontier:
        for target in TRANSITIONS[frontier.pop()].values():
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(Phase)
    assert TRANSITIONS[Phase.STOPPING] == {}
    assert all(Event.SHUTDOWN in TRANSITIONS[phase] for phase in Phase if phase is not Phase.STOPPING)


def test_deliveries_are_taken_only_while_running() -> None:
    assert [p for p in Phase if machine_in(p).takes_deliveries] == [Phase.RUNNING]
    assert {p for p in Phase if machine_in(p).answers_flow_control} == {Phase.RUNNING, Phase.STOPPING}
    assert {p for p in Phase if machine_in(p).reset_pending} == {Phase.RESET_WAIT, Phase.RESETTING}
