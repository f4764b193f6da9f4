"""Which origins a reset's requests may go to (bridge/core/reach.py): an origin never doubted admits everything; a
doubted one admits one scout at a time, the next ``scout_every`` after the last, until it answers; while it is in
doubt, its silent sources wait instead of asking for resets, one more asking every ``silence_timeout``."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.reach import Origin, Reach


def test_an_origin_never_doubted_admits_every_request_and_costs_nothing() -> None:
    reach = Reach(1.0)
    leaf1 = reach.origin("leaf1")
    assert reach.origin("leaf1") is leaf1  # one per name, shared
    assert all(reach.admit(leaf1, 0.0) for _ in range(1000))
    assert reach.doubted == 0 and reach.next_scout(leaf1) == math.inf
    assert not reach.answered(leaf1, 0.0)  # an answer from an origin in no doubt changes nothing
    assert leaf1.answered_at == -math.inf and not leaf1.excuses(0.0, 5.0)


def test_a_doubted_origin_admits_one_scout_per_interval_until_it_answers() -> None:
    reach = Reach(1.0)
    leaf1, leaf2 = reach.origin("leaf1"), reach.origin("leaf2")
    leaf1.doubt()
    assert leaf1.doubted and not leaf2.doubted and reach.doubted == 1
    assert reach.next_scout(leaf1) == -math.inf  # the first scout goes at once
    assert reach.admit(leaf1, 10.0)
    assert not reach.admit(leaf1, 10.0) and not reach.admit(leaf1, 10.9)
    assert reach.admit(leaf2, 10.0)  # another origin is untouched
    leaf1.doubt()  # the scout got no answer: still in doubt, and its time kept
    assert reach.next_scout(leaf1) == 11.0
    assert reach.admit(leaf1, 11.0) and not reach.admit(leaf1, 11.5)
    assert reach.answered(leaf1, 11.5)  # any answer clears the doubt: everything goes again
    assert reach.admit(leaf1, 11.5) and reach.admit(leaf1, 11.5) and reach.doubted == 0
    assert leaf1.answered_at == 11.5


def test_a_silence_reset_doubts_its_origin_and_excuses_the_others_for_one_silence_timeout() -> None:
    origin = Origin()
    origin.silence_reset(since=0.0, now=5.1)  # the first source silent since the cut asks
    assert origin.doubted
    assert origin.excuses(5.2, 5.0) and origin.excuses(10.0, 5.0)  # the others wait while that reset scouts
    assert not origin.excuses(10.1, 5.0)  # then one more asks (a scout stays in line if the first stopped)
    origin.silence_reset(since=0.5, now=10.1)
    assert origin.excuses(15.0, 5.0)
    reach = Reach(1.0)
    assert reach.answered(origin, 17.0)  # the origin answers: nobody is excused, silence counts from the answer
    assert not origin.excuses(17.1, 5.0)
    assert origin.silent_since(0.5) == 17.0 and origin.silent_since(17.5) == 17.5


def test_a_silence_that_began_no_earlier_than_the_origins_answer_doubts_nothing() -> None:
    """The origin answered: a source still silent five seconds after has a consumer of its own to repair, and the
    others silent with it must not wait for it one at a time."""
    origin, reach = Origin(), Reach(1.0)
    origin.doubt()
    reach.answered(origin, 20.0)
    origin.silence_reset(since=origin.silent_since(3.0), now=25.1)
    assert not origin.doubted and not origin.excuses(25.2, 5.0)
    origin.silence_reset(since=21.0, now=26.1)  # heard from after the answer, then silent: the origin may be gone
    assert origin.doubted


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
    for op, name, advance in steps:
        now += advance
        origin = reach.origin(name)
        if op == "doubt":
            origin.doubt()
            if name not in doubted:
                doubted.add(name)
                admitted[name] = []
        elif op == "answered":
            assert reach.answered(origin, now) == (name in doubted)
            doubted.discard(name)
        else:
            times = admitted[name]
            went = reach.admit(origin, now)
            if name not in doubted:
                assert went
            else:  # a scout whenever the interval since the last has passed, and only then
                assert went == (not times or now - times[-1] >= 1.0)
                if went:
                    times.append(now)
        for other in ("a", "b"):
            assert reach.origin(other).doubted == (other in doubted)
            times = admitted[other]
            assert all(later - earlier >= 1.0 for earlier, later in itertools.pairwise(times))
        assert reach.doubted == len(doubted)
