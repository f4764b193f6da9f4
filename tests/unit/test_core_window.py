"""The window arithmetic (:mod:`bridge.core.window`): what a window carries over a link, and the window a rate
wants, agree with each other and with the WAN bench's rule (bench/RESULTS.md)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.core.window import (
    MAX_WINDOW,
    NEAR,
    OVERHEAD,
    SHARE,
    STEP,
    WindowBudget,
    WindowSizer,
    window_carries,
    window_for,
)


def test_a_window_over_the_bench_links() -> None:
    # max_ack_pending 1,000 over 20 and 50 ms: 25,000 and 10,000 msg/s at most
    assert window_carries(1000, 0.020) == 25_000
    assert window_carries(1000, 0.050) == 10_000
    assert window_for(25_000, 0.020) == 1000
    assert window_carries(1000, 0.0) == math.inf
    assert window_for(0.0, 0.050) == 1  # a window is never empty


@given(rate=st.floats(1.0, 1e6), rtt=st.floats(1e-4, 2.0))
def test_the_window_a_rate_wants_carries_that_rate(rate: float, rtt: float) -> None:
    window = window_for(rate, rtt)
    assert window_carries(window, rtt) >= rate * (1 - 1e-9)
    assert window == 1 or window_carries(window - 1, rtt) < rate  # and not a message more


# -- the sizer over a simulated link --------------------------------------------------------------------------------

MIB = 1024 * 1024


def drive(
    sizer: WindowSizer,
    *,
    rtt: float,
    store_rate: float,
    size: int = 256,
    cycles: int = 40,
    t0: float = 0.0,
    tail: float = 0.0,
) -> list[int]:
    """A flow-control consumer over a link of ``rtt`` whose receiver stores ``store_rate`` messages a second, the
    last one ``tail`` later (a publish ack across a WAN): each cycle the origin delivers a full window half a round
    trip after the answer reached it, asks (a request by count), and the answer leaves once the window is stored.
    Resizes succeed at once. Returns the windows set."""
    now, resized = t0, []
    for _ in range(cycles):
        window = sizer.size
        now += rtt  # the answer's way there and the first delivery's way back
        for i in range(window):
            sizer.delivered(now + i / store_rate, size)
        now += window / store_rate + tail
        sizer.requested(window)
        wanted = sizer.released(now)
        if wanted:
            assert sizer.configured <= sizer.size < wanted <= sizer.size * STEP
            sizer.resized(wanted)
            resized.append(wanted)
    return resized


def test_a_far_link_grows_the_window_until_the_round_trip_is_a_quarter_of_a_cycle() -> None:
    sizer = WindowSizer("s", 1000, 16 * MIB)
    resized = drive(sizer, rtt=0.050, store_rate=45_000)
    assert resized and resized == sorted(resized)
    assert abs(sizer.rtt - 0.050) < 1e-4  # and the last message's store, 1/45,000 s
    cycle = 0.050 + sizer.size / 45_000
    assert SHARE * cycle * 1.05 >= 0.050 or sizer.size == MAX_WINDOW, (sizer.size, cycle)
    # and no further: the last resize was the one that got there
    assert drive(sizer, rtt=0.050, store_rate=45_000, t0=100.0) == []


def test_a_far_aggregate_grows_the_window_too() -> None:
    """The edge position: the origin beside the bridge, the aggregate 50 ms away: storing a window's last message
    takes the round trip the origin's link does not."""
    sizer = WindowSizer("s", 1000, 16 * MIB)
    assert drive(sizer, rtt=0.0003, store_rate=45_000, tail=0.050)
    assert sizer.size > 1000 and abs(sizer.rtt - 0.0503) < 1e-3


def test_a_near_link_never_grows_the_window() -> None:
    sizer = WindowSizer("s", 1000, 16 * MIB)
    assert drive(sizer, rtt=0.0005, store_rate=45_000) == []
    assert drive(WindowSizer("s", 50, 16 * MIB), rtt=0.003, store_rate=2_000) == []  # a slow receiver on a LAN
    assert sizer.size == 1000


def test_no_budget_no_growth_and_the_budget_bounds_it() -> None:
    assert drive(WindowSizer("s", 1000, 0), rtt=0.050, store_rate=45_000) == []
    small = WindowSizer("s", 1000, 2 * MIB)
    drive(small, rtt=0.050, store_rate=45_000)
    assert small.size > 1000 and small.size * (256 + OVERHEAD) <= 2 * MIB


def test_the_process_budget_is_shared() -> None:
    shared = WindowBudget(4 * MIB)
    sizers = [WindowSizer(f"s{i}", 1000, 16 * MIB, shared) for i in range(3)]
    for sizer in sizers:
        drive(sizer, rtt=0.050, store_rate=45_000)
    extra = sum((s.size - s.configured) * (256 + OVERHEAD) for s in sizers)
    assert extra <= 4 * MIB and sum(shared.held.values()) <= 4 * MIB
    assert sizers[0].size > sizers[2].size  # first come, first served; the last found little left
    shared.release("s0")
    assert "s0" not in shared.held


def test_a_failed_resize_keeps_the_window_and_waits() -> None:
    sizer = WindowSizer("s", 1000, 16 * MIB)
    now = 0.0
    for _ in range(10):
        now += 0.050
        sizer.delivered(now, 256)
        now += 1000 / 45_000
        sizer.requested(1000)
        wanted = sizer.released(now)
        if wanted:
            sizer.resize_failed(now)
            break
    assert wanted and sizer.size == 1000
    now += 0.1
    sizer.delivered(now, 256)
    sizer.requested(1000)
    assert sizer.released(now + 0.02) == 0  # not again before RETRY_AFTER


@settings(max_examples=60, deadline=None)
@given(
    rtt=st.floats(0.0, 0.4),
    store_rate=st.floats(500.0, 200_000.0),
    size=st.integers(0, 64 * 1024),
    configured=st.integers(1, 5000),
    budget=st.integers(0, 64 * MIB),
)
def test_the_window_stays_within_its_bounds(
    rtt: float, store_rate: float, size: int, configured: int, budget: int
) -> None:
    sizer = WindowSizer("s", configured, budget)
    resized = drive(sizer, rtt=rtt, store_rate=store_rate, size=size, cycles=12)
    assert sizer.size >= configured
    if resized:
        assert rtt >= NEAR and budget > 0
        assert sizer.size <= MAX_WINDOW and sizer.size * (size + OVERHEAD) <= budget
