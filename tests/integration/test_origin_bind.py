"""``OriginClient.bind`` with ``look_up`` (a reset's bind) against a real nats-server: a managed consumer that fits
as it stands is taken from its ``CONSUMER.INFO`` and nothing is written on the origin (a create of an existing
durable rewrites its files, ``store.UpdateConfig``: a thousand resets after a storm paid that on every leaf at
once); one that is gone, or lacks what the bridge set on it, is created as by a plain bind."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import SourceConfig
from bridge.io.origin import OriginClient
from bridge.testing.jetstream import connect, consumer_info, create_stream, js_request
from bridge.testing.servers import NatsServer

pytestmark = pytest.mark.anyio

STREAM = "ORIGIN"


async def _noop() -> None:
    pass


async def _noop_error(exc: Exception) -> None:
    pass


def _written(origin: NatsServer, consumer: str) -> tuple[int, int]:
    """The consumer's meta file as the server last wrote it: a write replaces the file (a new inode)."""
    (meta,) = origin.store_dir.glob(f"jetstream/*/streams/{STREAM}/obs/{consumer}/meta.inf")
    stat = Path(meta).stat()
    return stat.st_ino, stat.st_mtime_ns


async def test_a_resets_bind_takes_a_fitting_consumer_as_it_stands_and_writes_nothing(origin: NatsServer) -> None:
    source = SourceConfig(name="edge1", servers=[origin.url], stream=STREAM)
    client = OriginClient(source, timeout=5.0)
    async with connect(origin.url) as nc:
        await create_stream(nc, STREAM, ["o.>"], retention="workqueue")
        await nc.jetstream().publish("o.1", b"x")
        await client.connect(on_disconnected=_noop, on_reconnected=_noop, on_error=_noop_error)
        try:
            await client.stream()
            created = await client.bind()
            before = _written(origin, source.consumer)

            looked_up = await client.bind(look_up=True)
            assert looked_up == created
            assert _written(origin, source.consumer) == before  # a CONSUMER.INFO: nothing written

            await client.bind()  # what a reset's bind did before: a create of the same durable
            assert _written(origin, source.consumer) != before  # (so the check above can see a write)

            # what the bridge set and the server does not hold (a window grown while an update timed out): set again
            client.source = client.source.model_copy(update={"max_ack_pending": 2 * source.max_ack_pending})
            await client.bind(look_up=True)
            info = await consumer_info(nc, STREAM, source.consumer)
            assert info["config"]["max_ack_pending"] == 2 * source.max_ack_pending

            # gone (an operator deleted it): created again, as a plain bind would
            await js_request(nc, f"CONSUMER.DELETE.{STREAM}.{source.consumer}")
            again = await client.bind(look_up=True)
            assert again.created != created.created
            assert again.num_pending == 1
        finally:
            await client.close()
