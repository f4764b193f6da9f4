"""The window arithmetic (:mod:`bridge.core.window`): what a window carries over a link, and the window a rate
wants, agree with each other and with the WAN bench's rule (bench/RESULTS.md)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from bridge.core.window import window_carries, window_for


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
