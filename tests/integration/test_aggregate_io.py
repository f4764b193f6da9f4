"""The aggregate's side of the process on a real server: its limits read once for every source asking at once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from bridge.core import headers as hdr
from bridge.core.pipeline import TargetLimits
from bridge.io.aggregate import LIMITS_FRESH, TargetSide
from bridge.io.jsapi import JsApi
from bridge.testing.jetstream import connect, create_aggregate, js_request
from bridge.testing.servers import ServerFactory

pytestmark = pytest.mark.anyio


async def api_requests(nc: Any) -> int:
    """The account's JetStream API requests so far, as the server counts them (this one included)."""
    return int((await js_request(nc, "INFO"))["api"]["total"])


async def test_a_thousand_sources_asking_at_once_cost_one_stream_info_and_a_change_is_seen_within_a_second(
    servers: ServerFactory,
) -> None:
    server = servers("hub", "")
    async with connect(server.url) as nc:
        await create_aggregate(nc, max_msg_size=4096)
        side = TargetSide(nc, JsApi(nc, "$JS.API"), "AGG", publish_window=64, ack_timeout=5.0)
        before = await api_requests(nc)
        results: list[TargetLimits] = []

        async def ask() -> None:
            results.append(await side.limits())

        async with anyio.create_task_group() as tg:
            for _ in range(1000):
                tg.start_soon(ask)
        assert len(results) == 1000 and {r.max_msg_size for r in results} == {4096}
        assert await api_requests(nc) - before == 2  # one STREAM.INFO, and the count's own request
        # an operator raises the limit: a blocked source's re-read sees it once the shared read is older than
        # LIMITS_FRESH (time is the condition here)
        info = await js_request(nc, "STREAM.INFO.AGG")
        config = {**info["config"], "max_msg_size": 65536}
        await js_request(nc, "STREAM.UPDATE.AGG", config)
        await anyio.sleep(LIMITS_FRESH)
        assert (await side.limits()).max_msg_size == 65536


async def test_restart_recoveries_starting_together_share_the_aggregates_stream_info(servers: ServerFactory) -> None:
    """A thousand sources reading their tails at once (every source of a process after its restart): the
    aggregate's ``STREAM.INFO`` is read once or twice for all of them, not once each, and the limits read that
    follows each recovery is served by the same reads."""
    server = servers("hub", "")
    async with connect(server.url) as nc:
        await create_aggregate(nc)
        side = TargetSide(nc, JsApi(nc, "$JS.API"), "AGG", publish_window=64, ack_timeout=5.0)
        before = await api_requests(nc)
        results: list[tuple[list[Any], bool]] = []

        async def recover(source: str) -> None:
            results.append(await side.read_tail(source, f"agg.{source}.>", 0, 64))
            await side.limits()

        async with anyio.create_task_group() as tg:
            for i in range(1000):
                tg.start_soon(recover, f"s{i:04}")
        assert results == [([], True)] * 1000  # an empty aggregate holds no copies
        assert await api_requests(nc) - before <= 3  # at most two STREAM.INFOs, and the count's own request


async def test_a_tail_read_takes_a_slot_for_its_reads_of_messages_only(servers: ServerFactory) -> None:
    """Recovery's read of the aggregate: its ``STREAM.INFO`` is shared and takes no slot among the process's API
    requests in flight (a thousand sources starting together queued for it behind each other's consumer creates),
    while each read of messages does."""
    server = servers("hub", "")
    async with connect(server.url) as nc:
        await create_aggregate(nc)
        side = TargetSide(nc, JsApi(nc, "$JS.API"), "AGG", publish_window=64, ack_timeout=5.0)
        slots = anyio.CapacityLimiter(1)
        taken: list[str] = []

        @contextlib.asynccontextmanager
        async def slot() -> AsyncIterator[None]:
            async with slots:
                taken.append("slot")
                yield

        async with slots:  # every slot busy: an empty aggregate's state is the whole read, and needs none
            with anyio.fail_after(10):
                assert await side.read_tail("s0", "edge.s0.>", 0, 64, slot) == ([], True)
        assert taken == []
        copy = {hdr.SOURCE: "s0", hdr.STREAM: "ORDERS", hdr.SEQ: "1", hdr.PREV: "0"}
        await nc.request("edge.s0.x", b"m", headers=copy, timeout=5)  # answered by the publish ack: stored
        fresh = TargetSide(nc, JsApi(nc, "$JS.API"), "AGG", publish_window=64, ack_timeout=5.0)
        with anyio.fail_after(10):
            copies, complete = await fresh.read_tail("s0", "edge.s0.>", 0, 64, slot)
        assert [(c.stream_seq, c.prev_seq) for c in copies] == [(1, 0)] and complete
        assert taken == ["slot"]  # one read of messages, in a slot
