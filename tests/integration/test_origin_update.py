"""A managed consumer's settings updated in place (a grown window, a new rate limit) against a real nats-server,
in both modes: the update keeps the consumer's position, and it never creates a consumer an operator deleted (CI
found a pull-mode resize re-creating one: its deliveries started at 1 again and the engine reset for another
client's act). The deleted consumer is the engine's discontinuity to notice; its resync's bind creates it again.

The origin runs :func:`bridge.testing.servers.origin_server_binary` (flow-control mode needs 2.14+: skipped on an
older origin). Marker ``pullmode``: CI runs it with a 2.10.26 origin too, the oldest with ``action: update``."""

from __future__ import annotations

import pytest

from bridge.config import SourceConfig
from bridge.core.modes import Mode, supports_flow_control
from bridge.errors import OriginUnavailable
from bridge.io.origin import OriginClient
from bridge.testing.jetstream import connect, consumer_exists, consumer_info, create_stream, js_request
from bridge.testing.servers import NatsServer

pytestmark = [pytest.mark.anyio, pytest.mark.pullmode]

STREAM = "ORIGIN"
WINDOW = 100


async def _noop() -> None:
    pass


async def _noop_error(exc: Exception) -> None:
    pass


@pytest.mark.parametrize("start", [None, 3], ids=["all", "start-sequence"])
@pytest.mark.parametrize("mode", [Mode.PULL, Mode.FLOW_CONTROL], ids=["pull", "flow_control"])
async def test_an_update_keeps_the_position_and_never_creates_a_deleted_consumer(
    origin: NatsServer, mode: Mode, start: int | None
) -> None:
    source = SourceConfig(
        name="edge1", servers=[origin.url], stream=STREAM, max_ack_pending=WINDOW, start_sequence=start
    )
    pending = 5 if start is None else 5 - start + 1
    asked: list[str] = []

    async def copies_exist() -> bool:  # asked before a start is applied: by a create, never by an update
        asked.append("copies_exist")
        return False

    async with connect(origin.url) as nc:
        # (pull mode cannot start a WorkQueue consumer past its first message before 2.14)
        await create_stream(nc, STREAM, ["o.>"], retention="workqueue" if start is None else "limits")
        for i in range(5):
            await nc.jetstream().publish(f"o.{i}", b"x")
        client = OriginClient(source, timeout=5.0, mode=mode)
        client.copies_exist = copies_exist
        await client.connect(on_disconnected=_noop, on_reconnected=_noop, on_error=_noop_error)
        try:
            level = (await client.stream()).api_level
            if mode is Mode.FLOW_CONTROL and not supports_flow_control(level):
                pytest.skip("flow-control mode needs an origin of nats-server 2.14+")
            await client.bind()
            name = source.consumer
            before = await consumer_info(nc, STREAM, name)
            assert before["config"]["max_ack_pending"] == WINDOW
            created_asks = len(asked)

            await client.set_window(WINDOW * 4)
            after = await consumer_info(nc, STREAM, name)
            assert after["config"]["max_ack_pending"] == WINDOW * 4
            assert after["created"] == before["created"]  # the same consumer, updated
            assert after["num_pending"] == before["num_pending"] == pending
            assert after["config"]["deliver_policy"] == before["config"]["deliver_policy"]
            assert len(asked) == created_asks

            await js_request(nc, f"CONSUMER.DELETE.{STREAM}.{name}")
            with pytest.raises(OriginUnavailable, match="does not exist: not updated"):
                await client.set_window(WINDOW * 16)
            if mode is Mode.FLOW_CONTROL:  # pull mode's rate limit paces its requests: no update to send
                with pytest.raises(OriginUnavailable, match="does not exist: not updated"):
                    await client.set_rate_limit(1_000_000)
            assert not await consumer_exists(nc, STREAM, name)
            assert len(asked) == created_asks

            # the resync's bind creates it again, with what the updates took in
            await client.bind()
            again = await consumer_info(nc, STREAM, name)
            assert again["config"]["max_ack_pending"] == WINDOW * 16
            assert again["num_pending"] == pending
            if mode is Mode.FLOW_CONTROL:
                assert again["config"]["rate_limit_bps"] == 8 * 1_000_000  # bytes per second, the server counts bits
        finally:
            await client.close()
