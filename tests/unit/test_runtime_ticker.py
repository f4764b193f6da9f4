"""The process's one clock (bridge.runtime.ticker) and the runners on it."""

from __future__ import annotations

import anyio
import pytest

from bridge.runtime.ticker import Ticker

pytestmark = pytest.mark.anyio

DEADLINE = 5.0


async def test_every_callback_is_called_each_tick_until_discarded() -> None:
    ticker = Ticker(0.01)
    calls: dict[str, int] = {"a": 0, "b": 0}

    def a() -> None:
        calls["a"] += 1

    def b() -> None:
        calls["b"] += 1

    ticker.add(a)
    ticker.add(b)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        with anyio.fail_after(DEADLINE):
            while calls["a"] < 3:
                await anyio.sleep(0.01)
        ticker.discard(a)
        seen = calls["a"]
        with anyio.fail_after(DEADLINE):
            target = calls["b"] + 3
            while calls["b"] < target:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert calls["a"] in (seen, seen + 1)  # a tick under way when it was discarded may still have called it
    assert len(ticker) == 1


async def test_a_failing_callback_is_dropped_and_the_others_keep_their_clock() -> None:
    ticker = Ticker(0.01)
    good = 0

    def broken() -> None:
        raise RuntimeError("boom")

    def counted() -> None:
        nonlocal good
        good += 1

    ticker.add(broken)
    ticker.add(counted)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        with anyio.fail_after(DEADLINE):
            while good < 3:
                await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    assert len(ticker) == 1


async def test_a_quiet_callback_is_called_once_per_quiet_every_ticks_until_woken() -> None:
    """A thousand quiet sources cost a call each per second, not ten: a callback returning True (quiet) comes back
    after ``quiet_every`` ticks; ``wake`` brings it back to every tick at once."""
    ticker = Ticker(0.005, quiet_every=5)
    calls = {"quiet": 0, "busy": 0}
    quiet = True

    def q() -> bool:
        calls["quiet"] += 1
        return quiet

    def b() -> bool:
        calls["busy"] += 1
        return False

    ticker.add(q)
    ticker.add(b)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        with anyio.fail_after(DEADLINE):
            while calls["busy"] < 41:
                await anyio.sleep(0.005)
        # 41 ticks: the first call of each, then the quiet one every fifth tick only
        assert calls["quiet"] in range(8, 11), calls
        quiet = False
        ticker.wake(q)
        start = calls["quiet"]
        with anyio.fail_after(DEADLINE):
            target = calls["busy"] + 10
            while calls["busy"] < target:
                await anyio.sleep(0.005)
        assert calls["quiet"] - start >= 9, calls  # woken: every tick again
        tg.cancel_scope.cancel()
    assert len(ticker) == 2
