"""``bridge.runtime.flag.Flag``: ``anyio.Event``'s rules, without its memory."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from bridge.runtime.flag import Flag


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await anyio.lowlevel.checkpoint()


@pytest.mark.anyio
async def test_set_wakes_every_waiter_once_and_stays_set() -> None:
    flag = Flag()
    woken: list[int] = []

    async def waiter(number: int) -> None:
        await flag.wait()
        woken.append(number)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for number in range(3):
                tg.start_soon(waiter, number)
            await turns()
            assert woken == [] and not flag.is_set()
            flag.set()
            flag.set()  # a second set does nothing
        assert sorted(woken) == [0, 1, 2] and flag.is_set()
        await flag.wait()  # set: returns at once
        assert flag._waiters is None  # nothing held once set


@pytest.mark.anyio
async def test_a_wait_on_a_set_flag_is_still_a_checkpoint() -> None:
    flag = Flag()
    flag.set()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await flag.wait()
    assert scope.cancelled_caught


@pytest.mark.anyio
async def test_a_cancelled_wait_leaves_nothing_behind_and_others_still_wake() -> None:
    flag = Flag()
    woken: list[str] = []

    async def waiter() -> None:
        await flag.wait()
        woken.append("kept")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            with anyio.move_on_after(0.01) as scope:
                await flag.wait()
            assert scope.cancelled_caught
            await turns()
            assert flag._waiters is not None and len(flag._waiters) == 1  # the waiter that stayed
            flag.set()
        assert woken == ["kept"]
