"""The process's bound on JetStream API requests in flight: many sources starting at once (every edge back after a
regional cut) queue their requests in the process, at most ``api`` at a time, and all come up."""

from __future__ import annotations

import anyio
import pytest

from bridge.config import EngineConfig, HttpConfig, SourceConfig
from bridge.runtime.source import SourceRunner
from bridge.runtime.ticker import Ticker
from bridge.testing.fakes import ApiServer, FakeOrigin, FakeTarget

pytestmark = pytest.mark.anyio

ENGINE = EngineConfig(silence_timeout=3600.0, shutdown_grace=2.0)
SOURCES = 40
DEADLINE = 30.0


def source(i: int) -> SourceConfig:
    return SourceConfig.model_validate(
        {
            "name": f"edge{i:02}",
            "stream": "ORDERS",
            "consumer": "BRIDGE",
            "subject_prefix": f"agg.{i:02}",
            "servers": ["nats://fake"],
        }
    )


async def start_all(api: anyio.CapacityLimiter | None) -> ApiServer:
    """Start SOURCES runners at once against one API server; return it once every source replicates."""
    server = ApiServer(latency=0.005)
    target, ticker = FakeTarget(), Ticker(0.1)
    runners = []
    for i in range(SOURCES):
        origin = FakeOrigin(api=server)
        origin.publish(2)
        runner = SourceRunner(
            source(i), ENGINE, target, stalled_after=HttpConfig().stalled_after, origin=origin, ticker=ticker, api=api
        )
        runners.append((runner, origin))
    stop = anyio.Event()
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker.run)
            for runner, _ in runners:
                tg.start_soon(runner.run, stop)
            while not all(runner.ready.is_set() for runner, _ in runners):
                await anyio.sleep(0.01)
            for _, origin in runners:
                origin.deliver()
            while not all(target.seqs(f"edge{i:02}") == [1, 2] for i in range(SOURCES)):
                await anyio.sleep(0.01)
            stop.set()
            tg.cancel_scope.cancel()
    return server


async def test_a_storm_of_setups_keeps_at_most_the_bound_in_flight_and_every_source_comes_up() -> None:
    server = await start_all(anyio.CapacityLimiter(4))
    assert server.most == 4  # in parallel, up to the bound, never beyond
    # stream and bind each: a new consumer is at rest, no RESET (``auto`` on a 2.15 origin presumes flow control:
    # no CONSUMER.INFO)
    assert server.in_flight == 0 and server.served == SOURCES * 2


async def test_without_the_bound_the_same_storm_reaches_the_server_at_once() -> None:
    server = await start_all(None)
    assert server.most > 4
