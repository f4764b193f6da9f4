"""``SourceRunner.retune``: a rate limit taken in place (the origin asked to update the consumer), and a failure to
do so logged while the source goes on as it was; on the test fakes."""

from __future__ import annotations

import time

import anyio
import pytest
import structlog

from bridge.config import EngineConfig, HttpConfig, SourceConfig
from bridge.errors import OriginUnavailable
from bridge.runtime.source import SourceRunner
from bridge.testing.fakes import FakeOrigin, FakeTarget

pytestmark = pytest.mark.anyio

SOURCE = SourceConfig.model_validate(
    {"name": "edge1", "stream": "ORDERS", "consumer": "BRIDGE", "subject_prefix": "agg", "servers": ["nats://fake"]}
)


class FailingOrigin(FakeOrigin):
    async def set_rate_limit(self, rate_limit: int) -> None:
        raise OriginUnavailable("no reply to $JS.API.CONSUMER.CREATE.ORDERS.BRIDGE within 5s")


@pytest.mark.parametrize("fails", [False, True])
async def test_a_new_rate_limit_is_taken_without_a_restart(fails: bool) -> None:
    origin, target = (FailingOrigin() if fails else FakeOrigin()), FakeTarget()
    origin.publish(3)
    runner = SourceRunner(
        SOURCE,
        EngineConfig(silence_timeout=3600.0, shutdown_grace=2.0),
        target,
        time.monotonic,
        stalled_after=HttpConfig().stalled_after,
        origin=origin,
    )
    stop = anyio.Event()
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run, stop)
            await runner.ready.wait()
            binds = origin.ops.count("bind")
            faster = SOURCE.model_copy(update={"rate_limit": 65536})
            with structlog.testing.capture_logs() as logs:
                await runner.retune(faster)
            events = [e["event"] for e in logs]
            assert runner.source is faster and runner.engine.phase.value == "running"
            assert origin.ops.count("bind") == binds  # no new start: the runner was not restarted
            if fails:
                assert events == ["source.retune_failed"]
            else:
                assert "set_rate_limit 65536" in origin.ops and events[0] == "source.retuned"
            assert origin.deliver() == 3  # still replicating
            while len(target.seqs("edge1")) < 3:
                await anyio.sleep(0.01)
            stop.set()
