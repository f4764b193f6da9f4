"""``SourceRunner`` against the in-memory ports of ``bridge.testing.fakes``: it performs what the engine decides,
in order, through the ports, and feeds every outcome back. What real servers do is tested in tests/integration."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import pytest
import structlog

from bridge.config import EngineConfig, HttpConfig, SourceConfig
from bridge.core.effects import BoundConsumer
from bridge.core.engine import Phase
from bridge.core.modes import ConsumerKind, Mode
from bridge.core.watch import STRANDED_CHECK, STRANDED_CONFIRM
from bridge.errors import ApiTimeout
from bridge.runtime import source as source_module
from bridge.runtime.flag import Flag
from bridge.runtime.scouts import ReachGate
from bridge.runtime.source import QUIET_TICKS, SourceRunner
from bridge.runtime.ticker import Ticker
from bridge.testing.fakes import FakeFence, FakeOrigin, FakeTarget

pytestmark = pytest.mark.anyio

SOURCE = SourceConfig.model_validate(
    {"name": "edge1", "stream": "ORDERS", "consumer": "BRIDGE", "subject_prefix": "agg", "servers": ["nats://fake"]}
)
ENGINE = EngineConfig(silence_timeout=3600.0, shutdown_grace=2.0)
DEADLINE = 10.0  # seconds any one condition may take


class Clock:
    """The runner's monotonic clock, which a test can move forward (the ticker still runs in real time)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


async def until(condition: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(DEADLINE):
        while not condition():
            await anyio.sleep(0.01)
    assert condition(), what


@asynccontextmanager
async def running(
    origin: FakeOrigin,
    target: FakeTarget,
    *,
    fence: FakeFence | None = None,
    clock: Clock | None = None,
    ticker: Ticker | None = None,
    engine: EngineConfig = ENGINE,
    api: anyio.CapacityLimiter | None = None,
    source: SourceConfig = SOURCE,
    reach: ReachGate | None = None,
) -> AsyncIterator[tuple[SourceRunner, anyio.Event]]:
    runner = SourceRunner(
        source,
        engine,
        target,
        clock or Clock(),
        stalled_after=HttpConfig().stalled_after,
        origin=origin,
        fence=fence,
        ticker=ticker,
        api=api,
        reach=reach,
    )
    stop = anyio.Event()
    with anyio.fail_after(3 * DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run, stop)
            yield runner, stop
            stop.set()


async def test_replicates_in_order_and_answers_flow_control_only_with_what_is_stored() -> None:
    origin, target = FakeOrigin(), FakeTarget(hold_acks=True)
    origin.publish(5)
    async with running(origin, target) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        # one bind: the start reset uses set-up's (a later reset binds again first, see the gap test), which
        # finds a new consumer at rest: no RESET; no CONSUMER.INFO: on a 2.14+ server ``auto`` presumes flow
        # control and the create confirms it
        assert origin.ops[:5] == ["connect", "stream", "bind", "unsubscribe", "subscribe"]
        assert origin.deliver() == 5
        subject = origin.request_flow_control()
        await until(lambda: len(target.held) == 5, "five publishes sent")
        assert target.seqs("edge1") == [1, 2, 3, 4, 5]
        assert origin.answers == []  # nothing acked by the aggregate yet: the request is held
        target.release_acks()
        await until(lambda: bool(origin.answers), "the held request answered")
        assert [(a.subject, a.last_consumer, a.last_stream) for a in origin.answers] == [(subject, 5, 5)]
    assert origin.ops[-2:] == ["flush", "close"] and runner.engine.phase is Phase.STOPPING


async def test_a_consumer_at_rest_is_taken_as_it_stands_and_one_with_deliveries_outstanding_is_reset() -> None:
    """Silence after everything was stored and acked: the reset's look-up finds the consumer at rest, sends no
    RESET, and delivery sequences go on (6, 7); silence again with a delivery not acked: the RESET is sent."""
    origin, target, clock = FakeOrigin(), FakeTarget(), Clock()
    origin.publish(5)
    engine = EngineConfig(silence_timeout=5.0, shutdown_grace=2.0)
    async with running(origin, target, clock=clock, engine=engine) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        origin.deliver()
        subject = origin.request_flow_control()
        await until(lambda: [a.subject for a in origin.answers] == [subject], "everything stored and acked")
        assert (origin.ack_floor, origin.ack_floor_dseq) == (5, 5)
        mark = len(origin.ops)
        clock.offset += 6.0
        await until(lambda: "subscribe" in origin.ops[mark:], "silence: the reset procedure")
        assert origin.ops[mark:] == ["unsubscribe", "bind", "subscribe"] and runner.engine.last_dseq == 5
        origin.publish(2)
        assert origin.deliver() == 2 and origin.dseq == 7
        await until(lambda: target.seqs("edge1") == [1, 2, 3, 4, 5, 6, 7], "6 and 7 stored")
        mark = len(origin.ops)  # 6 and 7 are stored, not acked: the next silence resets
        clock.offset += 6.0
        await until(lambda: "subscribe" in origin.ops[mark:], "silence again: the reset procedure")
        assert origin.ops[mark:] == ["unsubscribe", "bind", "reset None", "subscribe"]
        assert dict(runner.engine.resets) == {"silence": 1}


async def test_a_gap_is_repaired_by_the_reset_procedure_in_order() -> None:
    origin, target = FakeOrigin(), FakeTarget()
    origin.publish(6)
    async with running(origin, target) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        origin.deliver(2)
        origin.skip_delivery()  # delivery 3 is lost on the way: 4 arrives as dseq 4
        mark = len(origin.ops)
        origin.deliver(1)
        await until(lambda: "subscribe" in origin.ops[mark:], "subscribed again after the reset")
        assert origin.ops[mark:] == ["unsubscribe", "bind", "reset None", "subscribe"]
        assert runner.engine.resets["gap"] == 1
        origin.deliver()  # from the ack floor (0) again: 1 and 2 are duplicates, 3.. are new
        await until(lambda: target.seqs("edge1") == [1, 2, 3, 4, 5, 6], "everything stored once, in order")


async def test_a_lease_suspended_during_a_resets_bind_waits_without_an_api_slot() -> None:
    """The fence closes while the reset's bind is in flight: the source pauses, and waits for its fence with the
    process's API slot given back (paused sources holding the slots would hold up every other source's set-up and
    reset); once the lease is renewed it binds again and the reset goes on."""
    origin, target, fence, api = FakeOrigin(), FakeTarget(), FakeFence(), anyio.CapacityLimiter(1)
    origin.publish(6)
    bind = origin.bind

    async def bind_then_suspend() -> BoundConsumer:
        bound = await bind()
        fence.open = False  # no renew succeeded in time, while the look-up was on its way
        return bound

    async with running(origin, target, fence=fence, api=api) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        origin.deliver(2)
        origin.skip_delivery()  # a gap: the reset procedure
        origin.bind = bind_then_suspend  # type: ignore[method-assign]
        mark = len(origin.ops)
        origin.deliver(1)
        await until(lambda: runner.paused, "paused by the fence found closed after the bind")
        await until(lambda: api.borrowed_tokens == 0, "the API slot given back while paused")
        assert origin.ops[mark:] == ["unsubscribe", "bind"]
        origin.bind = bind  # type: ignore[method-assign]
        fence.open = True
        runner.resume()
        await until(lambda: "subscribe" in origin.ops[mark:], "subscribed again after the reset")
        assert origin.ops[mark:] == ["unsubscribe", "bind", "bind", "reset None", "subscribe"]
        origin.deliver()
        await until(lambda: target.seqs("edge1") == [1, 2, 3, 4, 5, 6], "everything stored once, in order")


async def test_a_closed_fence_abandons_the_source_without_another_action() -> None:
    origin, target, fence = FakeOrigin(), FakeTarget(hold_acks=True), FakeFence()
    origin.publish(3)
    async with running(origin, target, fence=fence) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        origin.deliver()
        origin.request_flow_control()
        await until(lambda: len(target.held) == 3, "three publishes sent")
        fence.open = fence.kept = False  # the lease is lost: the stored copies must not be acked by this process
        target.release_acks()
        await until(lambda: runner.fenced, "the runner notices the fence")
    assert origin.answers == [] and "detach" in origin.ops


async def test_a_suspended_lease_pauses_the_source_and_its_resumption_goes_on_without_a_new_setup() -> None:
    """The fence closes while the lease is kept (suspended: no renew succeeded in time): nothing is answered or
    published, but the source keeps its consumer, its state and what it was given; resumed, it answers what is
    stored and publishes the rest in order, without setting up again."""
    origin, target, fence = FakeOrigin(), FakeTarget(hold_acks=True), FakeFence()
    origin.publish(6)
    async with running(origin, target, fence=fence) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        setup_ops = origin.ops.count("bind"), origin.ops.count("stream")
        origin.deliver(3)
        await until(lambda: len(target.held) == 3, "three publishes sent")
        fence.open = False  # suspended
        subject = origin.request_flow_control()
        target.release_acks()  # stored: their acks still count
        origin.deliver(3)  # and deliveries still reach the engine
        await until(lambda: runner.paused, "the runner found its fence closed")
        await until(lambda: runner.engine.pipeline.stored_messages == 3, "the acks taken while paused")
        await until(lambda: runner.engine.stats.delivered == 6, "the deliveries taken while paused")
        assert origin.answers == [] and len(target.held) == 0 and target.seqs("edge1") == [1, 2, 3]
        assert not runner.fenced
        fence.open = True
        runner.resume()
        await until(lambda: bool(origin.answers), "the held request answered")

        def stored_all() -> bool:  # (what was queued is verified, then sent again: one probe first)
            target.release_acks()
            return target.seqs("edge1") == [1, 2, 3, 4, 5, 6]

        await until(stored_all, "the rest published, in order, once")
        assert origin.answers[0].subject == subject
        assert (origin.ops.count("bind"), origin.ops.count("stream")) == setup_ops  # no set-up again


async def test_a_pause_longer_than_the_publish_ack_timeout_still_stores_everything_once_in_order() -> None:
    """Publishes decided while paused wait in the queue while their ack deadlines run: once resumed they are written
    late, the engine has timed them out meanwhile and verifies them like any late ack, and nothing is lost,
    duplicated or reordered."""
    origin, target, fence, clock = FakeOrigin(), FakeTarget(), FakeFence(), Clock()
    origin.publish(6)
    async with running(origin, target, fence=fence, clock=clock) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        origin.deliver(2)
        await until(lambda: target.seqs("edge1") == [1, 2], "two stored")
        fence.open = False
        origin.deliver(4)
        await until(lambda: runner.paused, "the runner found its fence closed")
        clock.offset += 3 * target.ack_timeout  # the pause outlasts the queued publishes' deadlines
        await until(lambda: runner.engine.pipeline.unverified > 0, "the queued publishes timed out")
        fence.open = True
        runner.resume()
        await until(lambda: target.seqs("edge1") == [1, 2, 3, 4, 5, 6], "everything stored once, in order")


async def test_a_source_paused_a_moment_before_a_renew_reopened_its_fence_goes_on_by_itself() -> None:
    """The fence is checked on the bridge's thread and moved on the fleet's: a source can find it closed just
    before a renew's reply moves it, and then the fleet never suspends the lease (so never resumes the source).
    The source's tick finds its fence open again, in the same term, and it goes on (a bench run at 2,000 sources
    left 20 sources paused for good before this)."""
    origin, target, fence = FakeOrigin(), FakeTarget(), FakeFence()
    origin.publish(4)
    async with running(origin, target, fence=fence) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        fence.open = False
        origin.deliver(2)
        await until(lambda: runner.paused, "the runner found its fence closed")
        assert target.seqs("edge1") == []
        fence.open = True  # no resume(): nothing tells the runner
        origin.deliver(2)
        await until(lambda: target.seqs("edge1") == [1, 2, 3, 4], "replicating again, in order, once")


async def test_a_quiet_source_that_finds_its_fence_closed_is_ticked_again_each_second() -> None:
    """A quiet source's slot passes it by until its engine has something due, seconds away; one that pauses at an
    answer (its pipeline empty, so still quiet) is woken, so its tick looks at the fence each second again."""
    origin, target, fence = FakeOrigin(), FakeTarget(), FakeFence()
    ticker = Ticker(0.01, QUIET_TICKS)  # ticked by hand; its rotation is a tenth of a second of its clock
    origin.publish(2)
    async with running(origin, target, fence=fence, ticker=ticker) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        origin.deliver()
        await until(lambda: target.seqs("edge1") == [1, 2], "both stored")
        for _ in range(QUIET_TICKS):
            ticker.tick()  # quiet, nothing due for seconds: passed by from here on
        answered = len(origin.answers)
        fence.open = False
        origin.request_flow_control()
        await until(lambda: runner.paused, "the runner found its fence closed at the answer")
        await until(lambda: runner._resumed is not None, "the answer waits for the fence")
        fence.open = True  # no resume(): the tick finds it open
        for _ in range(QUIET_TICKS):
            ticker.tick()
        await until(lambda: len(origin.answers) > answered, "answered once a tick found the fence open")


async def test_an_origin_behind_the_aggregate_blocks_setup_with_the_reason() -> None:
    origin, target = FakeOrigin(), FakeTarget()
    origin.publish(10)
    async with running(origin, target) as (runner, _):
        await until(runner.ready.is_set, "the first life replicates")
        origin.deliver()
        await until(lambda: len(target.seqs("edge1")) == 10, "ten copies stored")
    recreated = FakeOrigin()
    recreated.publish(3)  # the origin stream was deleted and created again: sequences start over
    async with running(recreated, target) as (runner, _):
        await until(lambda: "recreated" in runner.last_error, "setup refused")
        assert not runner.ready.is_set() and runner.engine.phase is Phase.RECOVERING
        assert "reset None" not in recreated.ops


async def test_a_blocked_source_reads_the_target_limits_again() -> None:
    origin, target, clock = FakeOrigin(), FakeTarget(reject="maximum messages per subject exceeded"), Clock()
    origin.publish(1)
    async with running(origin, target, clock=clock) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        origin.deliver()
        await until(lambda: runner.engine.pipeline.degraded, "the publish was refused")
        reads = target.limits_reads
        clock.offset += 2 * runner.engine.settings.limits_refresh
        await until(lambda: target.limits_reads > reads, "the limits read again")
        assert "maximum messages" in runner.last_error and runner.snapshot().blocked_reason


async def acked(runner: SourceRunner, origin: FakeOrigin) -> None:
    """The start reset done, then what the origin holds delivered, stored and acked by a flow-control answer."""
    await until(runner.ready.is_set, "the start reset is done")
    origin.deliver()
    origin.request_flow_control()
    await until(lambda: bool(origin.answers), "everything stored and acked")


@pytest.mark.parametrize("soon", [False, True], ids=["task", "soon"])
async def test_stranded_workqueue_messages_are_found_twice_then_reset_to(soon: bool) -> None:
    """Each look is asked without a task of its own when the origin can (``first_seq_soon``), within an API slot
    it holds until the answer; else in a task, waiting for a slot."""
    origin, target, clock = FakeOrigin(workqueue=True, looks_soon=soon), FakeTarget(), Clock()
    api = anyio.CapacityLimiter(1)
    origin.publish(4)
    async with running(origin, target, clock=clock, api=api) as (runner, _):
        await acked(runner, origin)
        origin.messages[2] = ("orders.new", b"payload-2")  # a server restart lost it from the pending list
        clock.offset += 2 * STRANDED_CHECK  # past the first look, whatever the source's spread
        look = "probe soon 1" if soon else "probe 1"
        await until(lambda: look in origin.ops, "the first look")
        assert ("probe 1" in origin.ops) is not soon
        await until(lambda: api.borrowed_tokens == 0, "its slot given back")
        clock.offset += STRANDED_CONFIRM
        await until(lambda: "reset 2" in origin.ops, "confirmed: reset to the stranded message")
        await until(lambda: origin.subscribed and runner.engine.phase is Phase.RUNNING, "taking deliveries again")
        origin.deliver()  # redelivered: a duplicate, not published again, acked again (which deletes it)
        origin.request_flow_control()
        await until(lambda: 2 not in origin.messages, "the stranded message is gone")
        assert target.seqs("edge1") == [1, 2, 3, 4] and runner.engine.resets["stranded"] == 1


async def test_a_look_that_finds_every_api_slot_taken_is_put_off_to_its_next_interval() -> None:
    """A look is a safety net: it never queues for a slot behind the set-ups and resets that need one (a thousand
    sources' looks waited seconds each, in a task each, and were ticked every second meanwhile)."""
    origin, target, clock = FakeOrigin(workqueue=True, looks_soon=True), FakeTarget(), Clock()
    api, holder = anyio.CapacityLimiter(1), object()
    origin.publish(2)
    async with running(origin, target, clock=clock, api=api) as (runner, _):
        await acked(runner, origin)
        stranded = runner.engine._stranded  # type: ignore[attr-defined]
        api.acquire_on_behalf_of_nowait(holder)  # the process's requests take every slot
        clock.offset += 2 * STRANDED_CHECK  # past the first look, whatever the source's spread
        await until(lambda: stranded.next_at > clock(), "the look came due and was put off")
        assert not stranded.probing and api.statistics().tasks_waiting == 0
        assert not any(op.startswith("probe") for op in origin.ops)
        api.release_on_behalf_of(holder)
        clock.offset += STRANDED_CHECK  # its next interval
        await until(lambda: "probe soon 1" in origin.ops, "looked at its next interval, a slot free")
        assert "probe 1" not in origin.ops  # (no task)


async def test_shutdown_drains_then_answers_the_held_request_with_what_is_stored() -> None:
    origin, target = FakeOrigin(), FakeTarget(hold_acks=True)
    origin.publish(3)
    async with running(origin, target) as (runner, stop):
        await until(runner.ready.is_set, "the start reset is done")
        origin.deliver()
        subject = origin.request_flow_control()
        await until(lambda: len(target.held) == 3, "three publishes sent")
        stop.set()
        await until(lambda: runner.engine.phase is Phase.STOPPING, "draining")
        assert origin.answers == []
        target.release_acks()  # in flight during the grace period: still counted
        await until(lambda: bool(origin.answers), "the final answer")
    assert [(a.subject, a.last_consumer, a.last_stream) for a in origin.answers] == [(subject, 3, 3)]


async def test_setup_is_retried_until_the_origin_is_reachable() -> None:
    origin, target = FakeOrigin(connect_failures=1), FakeTarget()
    async with running(origin, target) as (runner, _):
        await until(lambda: "connection refused" in runner.last_error, "the failure recorded")
        await until(runner.ready.is_set, "connected on the retry")
        assert origin.ops.count("connect") == 2


# -- pull mode ----------------------------------------------------------------------------------------------


def pull_origin(**kwargs: object) -> FakeOrigin:
    """An origin on nats-server 2.12 (API level 3): ``auto`` chooses pull mode."""
    origin = FakeOrigin(api_level=3, version="2.12.8", **kwargs)  # type: ignore[arg-type]
    origin.mode = Mode.PULL  # what deliver() follows; the runner sets the same once it has chosen
    return origin


async def test_auto_chooses_pull_mode_on_an_old_origin_and_acks_only_what_is_stored() -> None:
    origin, target = pull_origin(workqueue=True), FakeTarget(hold_acks=True)
    origin.publish(5)
    async with running(origin, target) as (runner, _):
        await until(runner.ready.is_set, "the start resync is done")
        assert runner.mode is not None and runner.mode.mode is Mode.PULL
        assert runner.snapshot().mode == "pull"
        assert origin.ops[:6] == ["connect", "stream", "consumer_kind", "bind", "unsubscribe", "anchor"]
        await until(lambda: bool(origin.pulls), "a pull request")
        assert origin.deliver() == 5
        await until(lambda: len(target.held) == 5, "five publishes sent")
        assert origin.acks == []  # nothing stored yet: nothing acked
        target.release_acks()
        await until(lambda: len(origin.acks) == 5, "five acks")
        assert target.seqs("edge1") == [1, 2, 3, 4, 5]
        assert origin.messages == {}  # a WorkQueue origin ends empty


async def test_auto_keeps_a_pull_durable_on_a_new_origin_reading_it_only_when_the_create_is_refused() -> None:
    """A pull durable made before the origin's upgrade to 2.14: the presumed flow-control create is refused (the
    server never changes a consumer's kind), then the durable is read and decides: pull, logged once."""
    origin, target = FakeOrigin(kind=ConsumerKind.PULL), FakeTarget()
    origin.publish(3)
    async with running(origin, target) as (runner, _):
        await until(runner.ready.is_set, "the start resync is done")
        assert origin.ops[:6] == ["connect", "stream", "bind", "consumer_kind", "bind", "unsubscribe"]
        assert runner.mode is not None and runner.mode.mode is Mode.PULL
        assert runner.mode.reason == "the durable consumer exists as a pull consumer"
        await until(lambda: bool(origin.pulls), "a pull request")
        assert origin.deliver() == 3
        await until(lambda: target.seqs("edge1") == [1, 2, 3], "every message once, in order")


async def test_a_refusal_the_durable_confirms_is_not_asked_twice() -> None:
    """A flow-control create refused while the durable is of no other kind (here a push consumer with another ack
    policy, which fits no mode): the refusal stands after one read of the durable, with no second create."""
    origin, target = FakeOrigin(kind=ConsumerKind.OTHER), FakeTarget()
    async with running(origin, target) as (runner, _):
        await until(lambda: "consumer_kind" in origin.ops, "the durable read after the refusal")
        await until(lambda: "ORDERS/BRIDGE" in runner.last_error, "the refusal recorded")
        ops = origin.ops
        retried = [i for i, op in enumerate(ops) if op == "stream"][1:]  # set-up retries after a backoff
        assert ops[: retried[0] if retried else len(ops)] == ["connect", "stream", "bind", "consumer_kind"]
        assert runner.mode is not None and runner.mode.mode is Mode.FLOW_CONTROL


async def test_pull_mode_fills_a_gap_from_the_stream_without_publishing_twice() -> None:
    origin, target = pull_origin(), FakeTarget()
    origin.publish(6)
    async with running(origin, target) as (runner, _):
        await until(lambda: bool(origin.pulls), "a pull request")
        assert origin.deliver(2) == 2
        origin.skip_delivery()  # delivery 3 (message 3) is lost on the way
        assert origin.deliver(1) == 1  # message 4 shows the jump
        await until(lambda: bool(origin.fetched), "the resync reads the stream")
        assert origin.fetched == [(2, 4)]  # what the consumer delivered above what the bridge took
        await until(lambda: len(origin.pulls) >= 2, "pulling again after the resync")
        # the server drops a waiting request whose inbox lost its subscriber (docs/protocol.md 10)
        origin.waiting = [w for w in origin.waiting if w.inbox == origin.inbox]
        origin.deliver()
        await until(lambda: target.seqs("edge1") == [1, 2, 3, 4, 5, 6], "every message once, in order")
        assert runner.engine.resets["gap"] == 1


async def test_flow_control_forced_on_an_old_origin_is_a_configuration_error() -> None:
    origin, target = pull_origin(), FakeTarget()
    problems: list[str] = []
    source = SOURCE.model_copy(update={"mode": "flow_control"})
    runner = SourceRunner(
        source,
        ENGINE,
        target,
        Clock(),
        stalled_after=HttpConfig().stalled_after,
        origin=origin,
        on_config_error=problems.append,
    )
    stop = anyio.Event()
    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner.run, stop)
            await until(lambda: bool(problems), "the configuration error is reported")
            stop.set()
    assert problems[0].startswith('sources[edge1].mode: mode = "flow_control" needs nats-server 2.14.0 or later')
    assert "bind" not in origin.ops  # nothing was created on the origin


async def test_on_the_process_clock_the_runner_is_ticked_while_it_runs_and_dropped_after() -> None:
    """With the app's shared ``Ticker`` the runner starts no ticker of its own; time still reaches the engine (a
    blocked publish is retried on the shared clock), and the runner leaves the ticker when it ends."""
    origin, target, clock, ticker = FakeOrigin(), FakeTarget(reject="no space"), Clock(), Ticker(0.02)
    origin.publish(1)
    async with anyio.create_task_group() as clocks:
        clocks.start_soon(ticker.run)
        async with running(origin, target, clock=clock, ticker=ticker) as (runner, _):
            await until(runner.ready.is_set, "the start reset is done")
            assert len(ticker) == 1
            origin.deliver()
            await until(lambda: runner.engine.pipeline.degraded, "the publish was refused")
            target.reject = ""
            clock.offset += 60.0  # past any retry backoff: only a tick can notice
            await until(lambda: target.seqs("edge1") == [1], "retried on the shared clock, then stored")
        assert len(ticker) == 0
        clocks.cancel_scope.cancel()


async def test_a_quiet_engine_is_ticked_once_a_second_one_awaiting_acks_at_its_deadline_and_a_busy_one_every_tick() -> (
    None
):
    """A publish in flight makes the source busy, but nothing a tick does is due before its ack deadline (the ack
    is an input): the ticks pass it by until then (at 1 msg/s per source a third of the deliveries were caught in
    flight by a tick that found nothing). From its deadline on, work is due: every tick."""
    origin, target, clock = FakeOrigin(), FakeTarget(hold_acks=True), Clock()
    origin.publish(1)
    ticker = Ticker(3600.0, QUIET_TICKS, clock=clock)  # never on its own: the test ticks

    def ticked(runner: SourceRunner, times: int) -> int:
        count = 0
        for _ in range(times):
            changed = runner._changed = Flag()  # as if something waited: every tick fed to the engine sets it
            ticker.tick()
            count += changed.is_set()
        return count

    async with running(origin, target, clock=clock, ticker=ticker) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        assert runner.engine.quiet
        assert ticked(runner, QUIET_TICKS * 3) == 3
        origin.deliver()
        await until(lambda: len(target.held) == 1, "a publish in flight")
        assert not runner.engine.quiet
        assert ticked(runner, QUIET_TICKS) == 0
        clock.offset += target.ack_timeout  # its ack deadline: the publish is timed out, and retried on ticks
        assert ticked(runner, QUIET_TICKS) == QUIET_TICKS
        assert not runner.engine.quiet and runner.engine.pipeline.failures


async def test_a_backlog_on_the_origin_connection_is_not_silence() -> None:
    """A process behind its socket has not read the heartbeats in it: no silence reset while the connection says
    it holds a backlog; once it does not, silence counts from the last tick that saw it."""
    origin, target, clock = FakeOrigin(), FakeTarget(), Clock()
    ticker = Ticker(3600.0, QUIET_TICKS)  # never on its own: the test ticks

    def tick_all() -> None:
        for _ in range(QUIET_TICKS):  # a quiet source is on one slot of the wheel
            ticker.tick()

    engine = EngineConfig(silence_timeout=5.0, shutdown_grace=2.0)
    async with running(origin, target, clock=clock, ticker=ticker, engine=engine) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        origin.behind = True
        for _ in range(3):
            clock.offset += 30.0
            tick_all()
        assert runner.engine.resets["silence"] == 0
        origin.behind = False
        clock.offset += 4.0
        tick_all()
        assert runner.engine.resets["silence"] == 0  # 4 s since the backlog was last seen
        clock.offset += 2.0
        tick_all()
        await until(lambda: runner.engine.resets["silence"] == 1, "silence once nothing is left unread")


async def test_nothing_is_written_on_a_new_target_connection_before_what_the_old_one_lost_is_retried() -> None:
    """The chaos storm's finding: nats-py writes on a re-made target connection a round trip before it says it
    reconnected. Messages 1-3 go out on a connection that dies (never stored, never acked); the connection is made
    again and, before the bridge hears of it, message 4 arrives. Written at once, 4 would be stored before 1-3's
    retry. The runner notices the new connection before writing: 1-3 are presumed lost, verified absent and re-sent,
    then 4, in origin order."""
    origin, target = FakeOrigin(), FakeTarget()
    origin.publish(3)
    async with running(origin, target) as (runner, _):
        await until(runner.ready.is_set, "the start reset is done")
        target.lose_writes = True
        origin.deliver()
        await until(lambda: target.written == 3, "three publishes written to the dead connection")
        target.reconnect()  # and no target_reconnected from the bridge: it comes a round trip later, if at all
        origin.publish(1)
        origin.deliver()
        await until(lambda: len(target.seqs("edge1")) == 4, "all four stored")
        assert target.seqs("edge1") == [1, 2, 3, 4]
        runner.target_reconnected()  # the bridge's late word changes nothing more
        await until(lambda: runner.engine.watermark == 4, "the watermark over all four")
        assert target.seqs("edge1") == [1, 2, 3, 4]


async def test_a_verification_whose_read_never_comes_back_is_given_up_and_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine asks for no other read of the aggregate while one verification is out, so one that never came back
    held its source blocked for good: a verification (and the target's limits, read in the executor's line) is
    bounded, given up as a failed read (``publish.verify_failed``) and asked again; once the aggregate answers,
    nothing is lost, duplicated or reordered."""
    monkeypatch.setattr(source_module, "VERIFY_BOUND", 0.2)
    monkeypatch.setattr(source_module, "LIMITS_READ_BOUND", 0.2)
    origin, target, clock = FakeOrigin(), FakeTarget(), Clock()
    origin.publish(4)
    with structlog.testing.capture_logs() as logs:
        async with running(origin, target, clock=clock) as (runner, _):
            await until(runner.ready.is_set, "the start reset is done")
            target.lose_writes = True  # the aggregate answers nothing
            target.hold_reads()
            origin.deliver(2)
            await until(lambda: target.written >= 2, "two publishes written")
            clock.offset += 2 * target.ack_timeout
            await until(lambda: runner.engine.pipeline.unverified > 0, "the publishes timed out")

            def gave_up() -> int:
                return sum(1 for e in logs if e["event"] == "publish.verify_failed")

            await until(lambda: gave_up() >= 2, "the read given up, asked again and given up again")
            assert target.seqs("edge1") == []
            clock.offset += HttpConfig().stalled_after  # stalled: it says whether a verification is out
            await until(lambda: any(e["event"] == "source.stalled" for e in logs), "the stall reported")
            target.reconnect()  # the aggregate answers again
            target.answer_reads()
            origin.deliver(2)
            await until(lambda: target.seqs("edge1") == [1, 2, 3, 4], "everything stored once, in order")
    failed = [e for e in logs if e["event"] == "publish.verify_failed"]
    assert "no read of the aggregate within 0.2s" in failed[0]["reason"], failed[0]
    (stalled,) = [e for e in logs if e["event"] == "source.stalled"]
    assert stalled["unverified"] is True and isinstance(stalled["verifying"], bool), stalled


SECOND = SOURCE.model_copy(update={"name": "edge2"})  # the same servers and domain as SOURCE: the same origin
SILENT_ENGINE = EngineConfig(silence_timeout=5.0, shutdown_grace=2.0)


class _Silent:
    """A source of the shared origin, started, whose consumer the test makes silent (``silence``)."""

    def __init__(self, runner: SourceRunner, origin: FakeOrigin, clock: Clock) -> None:
        self.runner, self.origin, self.clock = runner, origin, clock

    async def silence(self) -> int:
        """Silent past ``silence_timeout``: the mark in ``origin.ops`` before its reset, once the reset began."""
        mark = len(self.origin.ops)
        self.clock.offset += 6.0
        name = self.runner.source.name
        await until(lambda: "unsubscribe" in self.origin.ops[mark:], f"{name}: silence, the reset procedure")
        return mark


@asynccontextmanager
async def two_sources_of_one_origin(
    gate: ReachGate, api: anyio.CapacityLimiter
) -> AsyncIterator[tuple[_Silent, _Silent]]:
    """Two sources with the same servers and domain (one origin to ``gate``), both started."""
    sources = []
    async with contextlib.AsyncExitStack() as stack:
        for config in (SOURCE, SECOND):
            origin, clock = FakeOrigin(), Clock()
            runner, _ = await stack.enter_async_context(
                running(origin, FakeTarget(), clock=clock, engine=SILENT_ENGINE, api=api, reach=gate, source=config)
            )
            sources.append(_Silent(runner, origin, clock))
        await until(lambda: all(s.runner.ready.is_set() for s in sources), "both started")
        yield sources[0], sources[1]


def hold_next_bind(origin: FakeOrigin, release: anyio.Event, failure: Exception | None = None) -> None:
    """``origin``'s next bind is recorded, then held until ``release`` is set: answered then (the bind itself, recorded
    again), or failing with ``failure``."""
    bind = origin.bind

    async def held() -> BoundConsumer:
        origin.bind = bind  # type: ignore[method-assign]
        origin.ops.append("bind")
        await release.wait()
        if failure is not None:
            raise failure
        return await bind()

    origin.bind = held  # type: ignore[method-assign]


async def test_a_silent_origin_is_scouted_by_one_reset_while_its_other_sources_wait_without_asking() -> None:
    """Every source of a leaf goes silent when it restarts: the first asks for a reset, whose bind goes as a scout;
    the other source of that origin asks for nothing (excused: its consumer may go on where it stood once the leaf
    is back), says so once and in ``/readyz``; the scout's answer clears the doubt, the other's silence counts from
    it, and its consumer, delivering again, replicates with no reset at all."""
    gate, api = ReachGate(scout_every=3600.0), anyio.CapacityLimiter(4)
    answer = anyio.Event()
    with structlog.testing.capture_logs() as logs:
        async with two_sources_of_one_origin(gate, api) as (first, second):
            hold_next_bind(first.origin, answer)  # the origin answers when the test says so
            mark1 = await first.silence()
            await until(lambda: "bind" in first.origin.ops[mark1:], "the first reset's bind: the scout")
            mark2 = len(second.origin.ops)
            second.clock.offset += 6.0
            await until(lambda: any(e["event"] == "source.silent" for e in logs), "the second waits for its origin")
            assert second.runner.snapshot().waiting_for_origin and second.origin.ops[mark2:] == []
            assert api.borrowed_tokens == 1 and gate.waiting == 0  # the scout's slot only, and nobody in line
            answer.set()
            await until(lambda: "subscribe" in first.origin.ops[mark1:], "the scout's reset, answered")
            assert gate.reach.doubted == 0 and not second.runner.snapshot().waiting_for_origin
            second.origin.publish(2)  # the leaf is back: the second's consumer goes on where it stood
            second.origin.deliver(2)
            await until(lambda: second.runner.engine.watermark == 2, "the second replicates again")
            assert second.origin.ops[mark2:] == [] and second.runner.engine.resets == {}
            assert first.origin.ops[mark1:] == ["unsubscribe", "bind", "bind", "subscribe"]  # (held, then answered)
    (excused,) = [e for e in logs if e["event"] == "source.silent"]  # once per silence
    assert excused["source"] == "edge2" and excused["silent_for"] > 5.0, excused


async def test_a_scout_that_gets_no_answer_keeps_the_origin_in_doubt_and_the_next_goes_an_interval_later() -> None:
    """The scout's bind times out (a link not usable yet): its reset fails and backs off, and the origin stays in
    doubt; the other source, excused meanwhile, asks for its own reset once the excuse lapses (a silence timeout
    after the scout's), goes as the next scout, and its answer clears the doubt."""
    gate, api = ReachGate(scout_every=0.2), anyio.CapacityLimiter(4)
    refuse = anyio.Event()
    async with two_sources_of_one_origin(gate, api) as (first, second):
        hold_next_bind(first.origin, refuse, ApiTimeout("no reply to $JS.API.CONSUMER.CREATE within 5s"))
        mark1 = await first.silence()
        await until(lambda: "bind" in first.origin.ops[mark1:], "the scout's bind")
        refuse.set()
        await until(lambda: "subscribe" in first.origin.ops[mark1:], "the scout's reset failed (deliveries again)")
        assert first.runner.last_error.startswith("reset: no reply") and gate.reach.doubted == 1
        doubted_at_bind: list[bool] = []
        second_bind = second.origin.bind

        async def watched_bind() -> BoundConsumer:
            doubted_at_bind.append(gate.reach.doubted == 1)
            return await second_bind()

        second.origin.bind = watched_bind  # type: ignore[method-assign]
        second.clock.offset += 6.0  # the scout asked over a silence timeout before this one's silence is seen
        mark2 = await second.silence()
        await until(lambda: "subscribe" in second.origin.ops[mark2:], "the next scout's reset")
        assert second.origin.ops[mark2:] == ["unsubscribe", "bind", "subscribe"] and doubted_at_bind == [True]
        assert gate.reach.doubted == 0  # its answer cleared the doubt
