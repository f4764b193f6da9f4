"""``bridge.runtime.retry``: the one retry policy (backoff, jitter, log throttling) on plain values, and its loop."""

from __future__ import annotations

import anyio
import pytest

from bridge.core.backoff import Backoff
from bridge.errors import BridgeError
from bridge.runtime.retry import Retry, RetryPolicy, RetryStep, retry_until_stopped

pytestmark = pytest.mark.anyio

POLICY = RetryPolicy(Backoff(1.0, 8.0), log_every=30.0, jitter=0.25)


def test_delays_double_up_to_the_maximum_without_jitter() -> None:
    retry = Retry(POLICY)
    assert [retry.failed(0.0, "x", 0.0).delay for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]


def test_jitter_only_shortens_by_at_most_its_fraction() -> None:
    retry = Retry(POLICY)
    assert retry.failed(0.0, "x", 0.999).delay == pytest.approx(1.0 * (1 - 0.25 * 0.999))
    assert retry.failed(0.0, "x", 0.5).delay == pytest.approx(2.0 * 0.875)
    for draw in (0.0, 0.3, 0.999):
        delay = Retry(POLICY).failed(0.0, "x", draw).delay
        assert 0.75 <= delay <= 1.0


def test_the_same_failure_is_reported_once_per_interval_with_the_count_held_back() -> None:
    retry = Retry(POLICY)
    steps = [retry.failed(t, "refused", 0.0) for t in (0.0, 1.0, 3.0, 7.0)]
    assert [(s.attempt, s.report, s.suppressed) for s in steps] == [
        (1, True, 0),
        (2, False, 0),
        (3, False, 0),
        (4, False, 0),
    ]
    later = retry.failed(31.0, "refused", 0.0)
    assert (later.report, later.suppressed) == (True, 3)


def test_a_new_kind_of_failure_is_news_at_once() -> None:
    retry = Retry(POLICY)
    assert retry.failed(0.0, "refused", 0.0).report
    assert not retry.failed(1.0, "refused", 0.0).report
    step = retry.failed(2.0, "permission", 0.0)
    assert (step.report, step.suppressed, step.attempt) == (True, 1, 3)


async def test_the_loop_retries_until_it_works_and_reports_each_failure() -> None:
    reports: list[tuple[str, RetryStep]] = []
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise BridgeError(f"no {calls}")
        return "connected"

    fast = RetryPolicy(Backoff(0.001, 0.002))
    result = await retry_until_stopped(
        anyio.Event(), attempt, fast, retry_on=(BridgeError,), kind=str, report=lambda e, s: reports.append((str(e), s))
    )
    assert result == "connected" and calls == 3
    assert [(error, step.attempt) for error, step in reports] == [("no 1", 1), ("no 2", 2)]


async def test_the_loop_ends_with_none_once_stopped_and_lets_other_errors_through() -> None:
    stop = anyio.Event()

    async def failing() -> str:
        stop.set()  # stopped while the attempt ran: the wait after it ends at once
        raise BridgeError("down")

    slow = RetryPolicy(Backoff(60.0, 60.0))
    with anyio.fail_after(5):
        assert (
            await retry_until_stopped(stop, failing, slow, retry_on=(BridgeError,), kind=str, report=lambda e, s: None)
            is None
        )

    async def broken() -> str:
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        await retry_until_stopped(
            anyio.Event(), broken, slow, retry_on=(BridgeError,), kind=str, report=lambda e, s: None
        )
