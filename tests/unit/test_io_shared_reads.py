"""``SharedReads``: the aggregate's ``STREAM.INFO`` read once for the sources asking together, never older than a
caller's ask allows (a restart recovery must see every copy stored before it began)."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest

from bridge.io.aggregate import SharedReads

pytestmark = pytest.mark.anyio


class Reads:
    """A read whose replies say when each began; ``gate`` (when set) holds every read until it is set."""

    def __init__(self) -> None:
        self.began: list[float] = []
        self.gate: anyio.Event | None = None
        self.fail: Exception | None = None

    async def __call__(self) -> dict[str, Any]:
        began = anyio.current_time()
        self.began.append(began)
        if self.gate is not None:
            await self.gate.wait()
        else:
            await anyio.lowlevel.checkpoint()  # a reply takes at least one turn of the loop
        if self.fail is not None:
            raise self.fail
        return {"began": began, "n": len(self.began)}


async def test_a_thousand_asks_together_cost_at_most_two_reads_none_older_than_its_ask() -> None:
    shared, reads = SharedReads(), Reads()
    answers: list[tuple[float, dict[str, Any]]] = []

    async def ask() -> None:
        asked = anyio.current_time()
        answers.append((asked, await shared.since(reads, asked)))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(1000):
                tg.start_soon(ask)
    assert len(answers) == 1000
    assert all(reply["began"] >= asked for asked, reply in answers)
    # the first asker's read, and one begun after every ask that came while it was under way
    assert len(reads.began) <= 2, len(reads.began)


async def test_an_ask_during_a_read_begun_before_it_waits_for_the_next_read() -> None:
    shared, reads = SharedReads(), Reads()
    reads.gate = anyio.Event()
    got: dict[str, dict[str, Any]] = {}

    async def ask(name: str, since: float) -> None:
        got[name] = await shared.since(reads, since)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, "first", anyio.current_time())
            await anyio.wait_all_tasks_blocked()  # the first read is under way
            assert reads.began
            late = reads.began[0] + 1e-9  # an ask after that read began
            tg.start_soon(ask, "late", late)
            tg.start_soon(ask, "recent", reads.began[0] - 1.0)  # content with any read of the last second
            await anyio.wait_all_tasks_blocked()  # every asker waits on the read
            reads.gate.set()
    assert got["first"]["n"] == 1 and got["recent"]["n"] == 1
    assert got["late"]["n"] == 2 and got["late"]["began"] >= late


async def test_a_failure_goes_to_every_caller_of_its_read_and_is_not_kept() -> None:
    shared, reads = SharedReads(), Reads()
    reads.gate, reads.fail = anyio.Event(), RuntimeError("no reply")
    errors: list[BaseException] = []

    async def ask() -> None:
        try:
            await shared.since(reads, anyio.current_time() - 1.0)
        except RuntimeError as exc:
            errors.append(exc)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()  # one read under way, every asker waiting on it
            assert reads.began
            reads.gate.set()
        assert len(errors) == 3 and len(reads.began) == 1
        reads.fail, reads.gate = None, None
        assert (await shared.since(reads, anyio.current_time() - 1.0))["n"] == 2  # read again, not the failure


async def test_a_cancelled_reader_leaves_its_waiters_to_the_next_read() -> None:
    shared, reads = SharedReads(), Reads()
    reads.gate = anyio.Event()
    scopes: list[anyio.CancelScope] = []
    got: list[dict[str, Any]] = []

    async def reader() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await shared.since(reads, anyio.current_time())

    async def waiter() -> None:
        got.append(await shared.since(reads, anyio.current_time() - 1.0))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.wait_all_tasks_blocked()  # the reader's read is under way
            assert reads.began
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()  # every asker waits on the read
            scopes[0].cancel()
            await anyio.wait_all_tasks_blocked()  # the waiter reads again
            assert len(reads.began) == 2
            reads.gate.set()
    assert [reply["n"] for reply in got] == [2]
