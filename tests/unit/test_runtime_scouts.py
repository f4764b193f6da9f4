"""``ReachGate``: resets waiting for their origin (bridge/runtime/scouts.py) go one scout at a time while it is in
doubt, every one of them once it answers, in the order they came; an origin never doubted makes nobody wait."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from bridge.runtime.scouts import ReachGate

pytestmark = pytest.mark.anyio

DEADLINE = 10.0


async def until(condition: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(DEADLINE):
        while not condition():
            await anyio.sleep(0.01)
    assert condition(), what


async def test_a_doubted_origin_lets_one_scout_go_until_it_answers_then_the_rest() -> None:
    gate = ReachGate(scout_every=3600.0)
    leaf = gate.origin("leaf")
    leaf.doubt()
    entered: list[int] = []
    answered = anyio.Event()

    async def reset(n: int) -> None:
        await gate.turn(leaf)
        entered.append(n)
        if n == 0:
            await answered.wait()
            gate.answered(leaf)

    async with anyio.create_task_group() as tg:
        for n in range(5):
            tg.start_soon(reset, n)
            await anyio.lowlevel.checkpoint()
        await until(lambda: entered == [0] and gate.waiting == 4, "one scout, the others waiting")
        answered.set()
        await until(lambda: len(entered) == 5, "the rest went once it answered")
    assert entered == [0, 1, 2, 3, 4] and gate.reach.doubted == 0


async def test_scouts_go_one_interval_apart_while_nobody_answers_and_an_origin_in_no_doubt_waits_for_nothing() -> None:
    gate = ReachGate(scout_every=0.2)
    await gate.turn(gate.origin("other"))  # never doubted: at once
    assert gate.waiting == 0
    leaf = gate.origin("leaf")
    leaf.doubt()
    went: list[float] = []

    async def scout() -> None:
        await gate.turn(leaf)
        went.append(gate.clock())
        leaf.doubt()  # no answer: still in doubt

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(scout)
        await until(lambda: len(went) == 3, "three scouts, one after another")
    assert all(later - earlier >= 0.2 for earlier, later in itertools.pairwise(went))
