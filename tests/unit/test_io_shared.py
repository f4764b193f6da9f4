"""``bridge.io.shared``: which source an error on a shared origin connection is about, and who may share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from bridge.config import SourceConfig
from bridge.io.group import GroupRun
from bridge.io.shared import OriginConnections, names_source


def source(name: str, **extra: object) -> SourceConfig:
    return SourceConfig.model_validate(
        {"name": name, "stream": "ORDERS", "domain": "leaf", "servers": ["nats://hub:4222"], **extra}
    )


def about(text: str, name: str, *, inbox: str = "") -> bool:
    src = source(name)
    return names_source(
        text,
        deliver_subject=src.deliver_subject,
        inbox=inbox,
        api_prefix=src.api_prefix,
        stream=src.stream,
        consumer=src.consumer,
    )


@pytest.mark.parametrize(
    "text",
    [
        'nats: permissions violation for subscription to "{deliver}"',
        'nats: permissions violation for publish to "$JS.leaf.API.CONSUMER.CREATE.ORDERS.nats-bridge-edge1"',
        'nats: permissions violation for publish to "$JS.leaf.API.CONSUMER.INFO.ORDERS.nats-bridge-edge1"',
        'nats: permissions violation for publish to "$JS.FC.ORDERS.nats-bridge-edge1.abc"',
        'nats: permissions violation for publish to "$JS.ACK.leaf.hash.ORDERS.nats-bridge-edge1.1.5.5.0.0"',
        'nats: slow consumer, messages dropped on connection 3 for subscription on "{deliver}"',
    ],
)
def test_an_error_naming_a_sources_subject_is_that_sources(text: str) -> None:
    text = text.format(deliver=source("edge1").deliver_subject)
    for seen in (text, text.lower()):  # the server's -ERR reaches the client lowercased
        assert about(seen, "edge1")
        assert not about(seen, "edge2")  # the same stream on the same leaf, another consumer


def test_a_stream_request_is_every_source_of_that_stream_and_nothing_else_is_anyones() -> None:
    text = 'nats: permissions violation for publish to "$JS.leaf.API.STREAM.INFO.ORDERS"'
    assert about(text, "edge1") and about(text, "edge2")
    assert not about('nats: permissions violation for publish to "$JS.other.API.STREAM.INFO.ORDERS"', "edge1")
    assert not about("nats: unexpected EOF", "edge1")


def test_a_pull_inbox_is_its_sources() -> None:
    text = 'nats: permissions violation for subscription to "_INBOX.abc"'
    assert about(text, "edge1", inbox="_INBOX.abc") and not about(text, "edge2", inbox="_INBOX.def")


def test_sources_share_a_connection_only_with_the_same_servers_and_credentials(tmp_path: Path) -> None:
    pool = OriginConnections()
    a = pool.for_settings(source("a"))
    assert pool.for_settings(source("b", domain="other")) is a  # another domain behind the same hub: shared
    assert pool.for_settings(source("c", servers=["nats://elsewhere:4222"])) is not a
    alice = {"auth": {"user": "u", "password": "one"}}
    assert pool.for_settings(source("d", **alice)) is not a
    assert pool.for_settings(source("e", **alice)) is pool.for_settings(source("f", **alice))
    # a different password is another identity, though both print as "**********"
    assert pool.for_settings(source("g", auth={"user": "u", "password": "two"})) is not pool.for_settings(
        source("h", **alice)
    )
    assert pool.open_connections() == 0  # nothing connects before a source joins


class Flushes:
    """Callers of one ``GroupRun`` and its flush: which asks had been made when each run began; ``gate`` (when set)
    holds every run, ``fail`` makes them fail."""

    def __init__(self) -> None:
        self.group: GroupRun[None] = GroupRun()
        self.asked: list[int | str] = []
        self.done: list[int | str] = []  # the asks whose wait ended, in order
        self.runs: list[int] = []  # asks made when each run began
        self.gate: anyio.Event | None = None
        self.fail = False

    async def ask(self, name: int | str) -> None:
        self.asked.append(name)
        await self.group.run(self._flush)
        self.done.append(name)

    async def _flush(self) -> None:
        self.runs.append(len(self.asked))
        if self.gate is not None:
            await self.gate.wait()
        else:
            await anyio.lowlevel.checkpoint()  # a PONG takes at least one turn of the loop
        if self.fail:
            raise OSError("connection lost")


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():
            await anyio.lowlevel.checkpoint()


@pytest.mark.anyio
async def test_a_thousand_flushes_together_cost_at_most_two_pings_each_begun_after_its_ask() -> None:
    flushes = Flushes()
    async with anyio.create_task_group() as tg:
        for n in range(1000):
            tg.start_soon(flushes.ask, n)
    assert sorted(map(int, flushes.done)) == list(range(1000))
    assert 1 <= len(flushes.runs) <= 2
    assert flushes.runs[-1] == 1000  # the last run began after every ask


@pytest.mark.anyio
async def test_an_ask_during_a_flush_waits_for_the_next_and_a_failure_ends_the_wait() -> None:
    flushes = Flushes()
    flushes.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(flushes.ask, "first")
        await until(lambda: bool(flushes.runs))
        tg.start_soon(flushes.ask, "late")  # after the first run's PING: not covered by it
        await until(lambda: len(flushes.asked) == 2)
        flushes.fail = True
        flushes.gate.set()
    assert flushes.runs == [1, 2] and flushes.done == ["first", "late"]


@pytest.mark.anyio
async def test_a_cancelled_flush_covers_nobody_and_the_next_asker_runs_again() -> None:
    flushes = Flushes()
    flushes.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as runner:
            runner.start_soon(flushes.ask, "runner")
            await until(lambda: bool(flushes.runs))
            tg.start_soon(flushes.ask, "waiting")
            await until(lambda: len(flushes.asked) == 2)
            runner.cancel_scope.cancel()  # mid-flush
        await until(lambda: len(flushes.runs) == 2)  # the waiting ask runs one of its own
        flushes.gate.set()
    assert flushes.done == ["waiting"] and flushes.runs == [1, 2]


@pytest.mark.anyio
async def test_every_caller_gets_the_result_of_a_run_that_began_after_its_ask_and_none_when_it_failed() -> None:
    group: GroupRun[int] = GroupRun()
    runs: list[int] = []
    gate = anyio.Event()
    results: dict[str, int | None] = {}

    async def listing() -> int:
        runs.append(len(runs) + 1)
        number = len(runs)
        if number == 1:
            await gate.wait()
        if number == 3:
            raise OSError("no answer")
        return number * 10

    async def ask(name: str) -> None:
        results[name] = await group.run(listing)

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, "first")
        await until(lambda: runs == [1])
        tg.start_soon(ask, "late-a")  # asked while run 1 was under way: run 2 covers them
        tg.start_soon(ask, "late-b")
        await until(lambda: group._asked == 3)
        gate.set()
    assert results == {"first": 10, "late-a": 20, "late-b": 20} and runs == [1, 2]
    assert await group.run(listing) is None  # run 3 failed: its callers do without
    assert await group.run(listing) == 40
    assert group._result is None  # nobody inside: a listing of every stream is not kept for no one
