"""The heap keeper (bridge.runtime.heap): survivors of a full collection are frozen, a thaw hands them back."""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import pytest

from bridge.runtime.heap import HeapKeeper

pytestmark = pytest.mark.anyio

DEADLINE = 5.0


class Node:
    """Something that can be part of a reference cycle, and be watched through a weak reference."""

    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(DEADLINE):
        while not condition():
            await anyio.sleep(0.001)


@contextlib.asynccontextmanager
async def running(keeper: HeapKeeper) -> AsyncIterator[None]:
    """``keeper`` runs (its callback installed) inside the block, and is stopped after it."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(keeper.run)
        await until(lambda: keeper._collected in gc.callbacks)
        yield
        tg.cancel_scope.cancel()


async def collected(keeper: HeapKeeper, freezes: int) -> None:
    """A full collection, and the freeze it hands to the keeper's loop (its ``freezes``-th)."""
    gc.collect()
    await until(lambda: keeper.freezes == freezes)


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


async def test_survivors_of_a_full_collection_are_frozen_and_a_thaw_lets_their_cycles_be_collected() -> None:
    keeper = HeapKeeper()
    async with running(keeper):
        holder = [Node()]
        holder[0].other = Node()
        holder[0].other.other = holder[0]  # a cycle, alive while the holder refers to it
        watched = weakref.ref(holder[0])
        gc.collect(0)  # a young collection freezes nothing
        for _ in range(3):  # a freeze handed over would have run by now (one loop pass each)
            await anyio.lowlevel.checkpoint()
        assert keeper.freezes == 0 and gc.get_freeze_count() == 0
        await collected(keeper, 1)
        assert gc.get_freeze_count() > 0
        holder.clear()  # now garbage, but frozen: a full collection does not look at it
        await collected(keeper, 2)
        assert watched() is not None
        keeper.thaw()
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert watched() is None


async def test_garbage_made_after_the_freeze_is_collected_as_always() -> None:
    keeper = HeapKeeper()
    async with running(keeper):
        await collected(keeper, 1)
        watched = cycle()  # made and dropped after the freeze
        gc.collect()
        assert watched() is None


async def test_a_collection_on_another_thread_freezes_on_the_keepers_loop() -> None:
    keeper = HeapKeeper()
    async with running(keeper):
        thread = threading.Thread(target=gc.collect)
        thread.start()
        thread.join(DEADLINE)
        assert not thread.is_alive()
        await until(lambda: keeper.freezes == 1)
        assert gc.get_freeze_count() > 0


async def test_it_thaws_on_its_own_every_so_often() -> None:
    keeper = HeapKeeper(thaw_every=0.05)
    async with running(keeper):
        await collected(keeper, 1)
        await until(lambda: gc.get_freeze_count() == 0)


async def test_when_it_stops_the_process_is_left_as_it_was() -> None:
    keeper = HeapKeeper()
    thresholds = gc.get_threshold()
    async with running(keeper):
        # while it runs the young generation waits for more allocations (never fewer than before)
        assert gc.get_threshold() == (max(keeper.young, thresholds[0]), *thresholds[1:])
        await collected(keeper, 1)
    assert gc.get_threshold() == thresholds
    assert keeper._collected not in gc.callbacks
    assert gc.get_freeze_count() == 0
    gc.collect()  # nothing is on its way to a loop that no longer runs
    assert gc.get_freeze_count() == 0
