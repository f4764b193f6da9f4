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


async def test_a_long_pass_spaces_the_next_so_the_ticker_takes_at_most_its_share() -> None:
    """Overloaded, the passes must not crowd out the reads: after a pass of 30 ms (on the ticker's clock) the next
    comes 90 ms later at a share of a quarter; a short pass brings the interval back."""
    now = [100.0]
    cost = [0.03]
    ticker = Ticker(0.01, share=0.25, clock=lambda: now[0])
    passes = 0

    def slow() -> None:
        nonlocal passes
        passes += 1
        now[0] += cost[0]

    ticker.add(slow)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker.run)
        with anyio.fail_after(DEADLINE):
            while passes < 1 or ticker.pause == 0.01:
                await anyio.sleep(0.005)
        assert ticker.pause == pytest.approx(0.09)
        cost[0] = 0.001
        with anyio.fail_after(DEADLINE):
            target = passes + 2
            while passes < target:
                await anyio.sleep(0.005)
        tg.cancel_scope.cancel()
    assert ticker.pause == 0.01
    assert ticker.pause_after(0.0) == 0.01
    assert Ticker(0.1, share=0.5).pause_after(0.3) == pytest.approx(0.3)


def test_a_callback_woken_and_quiet_again_before_a_tick_goes_back_to_its_slot_uncalled() -> None:
    """A delivery wakes its source and its ack makes it quiet again milliseconds later: ``rest`` puts it back in its
    own slot of the wheel, so the message costs no tick and the once-a-second cadence is kept."""
    ticker = Ticker(3600.0, quiet_every=5)  # ticked by hand
    calls: list[int] = []

    def q() -> bool:
        calls.append(ticker.wheel.ticks)
        return True

    ticker.add(q)
    ticker.tick()  # tick 1: placed in slot 1, next due at tick 6
    assert calls == [1]
    ticker.wake(q)
    ticker.rest(q)  # quiet again before any tick
    for _ in range(5):
        ticker.tick()
    assert calls == [1, 6]  # not at tick 2: its slot came round at tick 6, as if never woken
    ticker.wake(q)
    ticker.tick()  # tick 7: a tick came between, so it was called, and placed again by what it said
    ticker.rest(q)  # nothing to do
    assert calls == [1, 6, 7]
    for _ in range(5):
        ticker.tick()
    assert calls == [1, 6, 7, 12]
    ticker.rest(q)  # never woken: nothing
    ticker.discard(q)
    ticker.wake(q)
    ticker.rest(q)
    ticker.tick()
    assert calls == [1, 6, 7, 12] and len(ticker) == 0


def test_a_quiet_callback_with_nothing_due_for_a_while_is_passed_by_until_then() -> None:
    """A quiet source's engine has nothing due until its silence timeout (``tick_deadline``): its slot passes it by
    until then, also across a wake and a rest with no tick between (a delivery and its ack); a tick while woken
    asks it again, and what it says then stands."""
    now = [100.0]
    ticker = Ticker(0.1, quiet_every=10, clock=lambda: now[0])  # a rotation is a second
    calls: list[float] = []
    wait = [4.5]

    def q() -> float:
        calls.append(now[0])
        return wait[0]

    def rotation() -> None:
        for _ in range(10):
            now[0] += 0.1
            ticker.tick()

    ticker.add(q)
    ticker.tick()  # called at once (added busy): nothing due for 4.5 s
    assert calls == [100.0]
    for _ in range(4):
        rotation()
    assert calls == [100.0]  # its slot came round four times, each under 4.5 s after the call
    ticker.wake(q)
    ticker.rest(q)  # a delivery and its ack between two ticks: the deadline stands
    rotation()
    assert len(calls) == 2 and calls[1] == pytest.approx(105.0)  # the first visit at or after 104.5
    wait[0] = True  # once a rotation again
    ticker.wake(q)
    now[0] += 0.1
    ticker.tick()  # woken and ticked: asked again
    assert len(calls) == 3
    rotation()
    assert len(calls) == 4
    wait[0] = 30.0
    rotation()
    rotation()
    assert len(calls) == 5
    ticker.discard(q)  # its deadline goes with it
    assert not ticker.wheel.resting()
    ticker.add(q)
    ticker.tick()
    assert len(calls) == 6


def test_a_callback_woken_with_a_wait_is_passed_by_until_then_and_rests_uncalled_if_its_work_is_done() -> None:
    """A delivery makes its source busy with a publish awaiting its ack, nothing due before the ack deadline: the
    ticks pass it by until then (from the last tick's time: up to a tick early, never late); the ack comes first and
    ``rest`` returns it to its slot uncalled. A later wake without a wait (work due now) calls it at the next tick;
    one with a shorter wait shortens it, a longer one does not lengthen it."""
    now = [100.0]
    ticker = Ticker(0.1, quiet_every=10, clock=lambda: now[0])
    calls: list[float] = []

    def q() -> bool:
        calls.append(now[0])
        return True

    def ticks(n: int) -> None:
        for _ in range(n):
            now[0] += 0.1
            ticker.tick()

    ticker.add(q)
    ticker.tick()  # called at once (added busy), then quiet in its slot
    assert calls == [100.0]
    ticker.wake(q, 0.45)  # not before 100.45 (counted from the last tick, 100.0)
    ticks(4)
    assert calls == [100.0]
    ticks(1)
    assert calls == [100.0, pytest.approx(100.5)]
    ticker.wake(q, 5.0)
    ticks(3)
    ticker.rest(q)  # its ack came: back to its slot, never called
    ticks(7)
    assert len(calls) == 3 and calls[2] == pytest.approx(101.5)  # its slot's own visit, a rotation after 100.5
    ticker.wake(q, 5.0)
    ticker.wake(q, 0.25)  # sooner: shortens the wait
    ticker.wake(q, 9.0)  # later: no longer than the shortest
    ticks(2)
    assert len(calls) == 3
    ticks(1)
    assert len(calls) == 4
    ticker.wake(q, 5.0)
    ticker.wake(q)  # due now
    ticks(1)
    assert len(calls) == 5
    ticker.wake(q, 5.0)
    ticker.discard(q)
    ticks(60)
    assert len(calls) == 5 and len(ticker) == 0
