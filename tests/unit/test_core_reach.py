"""Which origins a reset's requests may go to (bridge/core/reach.py): an origin never doubted admits everything; a
doubted one admits one scout at a time, the next ``scout_every`` after the last, until it answers."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.effects import ResetCause
from bridge.core.reach import Reach


def test_an_origin_never_doubted_admits_every_request_and_costs_nothing() -> None:
    reach = Reach(1.0)
    assert all(reach.admit("leaf1", 0.0) for _ in range(1000))
    assert reach.doubted == 0 and reach.next_scout("leaf1") == math.inf
    assert not reach.answered("leaf1")  # an answer from an origin in no doubt changes nothing


def test_a_doubted_origin_admits_one_scout_per_interval_until_it_answers() -> None:
    reach = Reach(1.0)
    reach.doubt("leaf1")
    assert reach.is_doubted("leaf1") and not reach.is_doubted("leaf2")
    assert reach.next_scout("leaf1") == -math.inf  # the first scout goes at once
    assert reach.admit("leaf1", 10.0)
    assert not reach.admit("leaf1", 10.0) and not reach.admit("leaf1", 10.9)
    assert reach.admit("leaf2", 10.0)  # another origin is untouched
    reach.doubt("leaf1")  # the scout got no answer: still in doubt, and its time kept
    assert reach.next_scout("leaf1") == 11.0
    assert reach.admit("leaf1", 11.0) and not reach.admit("leaf1", 11.5)
    assert reach.answered("leaf1")  # any answer clears the doubt: everything goes again
    assert reach.admit("leaf1", 11.5) and reach.admit("leaf1", 11.5) and reach.doubted == 0


def test_a_reset_for_silence_doubts_its_origin_and_one_for_any_other_cause_does_not() -> None:
    reach = Reach(1.0)
    for cause in ResetCause:
        reach.reset_requested(cause.value, cause)
    assert [cause for cause in ResetCause if reach.is_doubted(cause.value)] == [ResetCause.SILENCE]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["doubt", "admit", "answered"]), st.sampled_from(["a", "b"]), st.floats(0, 0.6)),
        max_size=60,
    )
)
def test_scouts_never_come_closer_than_the_interval_and_an_answer_always_opens(
    steps: list[tuple[str, str, float]],
) -> None:
    """After every step: a doubted origin admits a scout whenever ``scout_every`` has passed since the last and
    never sooner; one not doubted admits at once; the doubt lasts from a ``doubt`` to the next ``answered``, whatever
    came between."""
    reach, now, doubted = Reach(1.0), 0.0, set()
    admitted: dict[str, list[float]] = {"a": [], "b": []}  # admissions while doubted, since the doubt began
    for op, origin, advance in steps:
        now += advance
        if op == "doubt":
            reach.doubt(origin)
            if origin not in doubted:
                doubted.add(origin)
                admitted[origin] = []
        elif op == "answered":
            assert reach.answered(origin) == (origin in doubted)
            doubted.discard(origin)
        else:
            times = admitted[origin]
            went = reach.admit(origin, now)
            if origin not in doubted:
                assert went
            else:  # a scout whenever the interval since the last has passed, and only then
                assert went == (not times or now - times[-1] >= 1.0)
                if went:
                    times.append(now)
        for name in ("a", "b"):
            assert reach.is_doubted(name) == (name in doubted)
            times = admitted[name]
            assert all(later - earlier >= 1.0 for earlier, later in itertools.pairwise(times))
