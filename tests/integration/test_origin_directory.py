"""Many sources of one origin read their streams with one listing (``bridge.io.directory``) against a real
nats-server: each gets what its own ``STREAM.INFO`` gives (retention, last sequence, the server's API level), with
one info and a listing or two for all instead of an info each; a stream that is not there fails as its own info does;
a user who may not list gets an info per source and no error."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, MutableMapping
from typing import Any

import anyio
import pytest
import structlog.testing

from bridge.config import SourceConfig
from bridge.core.effects import OriginStream
from bridge.errors import OriginUnavailable
from bridge.io.origin import OriginClient
from bridge.io.shared import OriginConnections
from bridge.testing.jetstream import connect, create_stream
from bridge.testing.servers import NatsServer, ServerFactory
from tests.integration.test_security import ADMIN_PASSWORD, BRIDGE_PASSWORD, Permissions, users_config

pytestmark = pytest.mark.anyio

STREAMS = {
    "ORIGIN_0": ("workqueue", 3),
    "ORIGIN_1": ("limits", 0),
    "ORIGIN_2": ("interest", 5),
    "ORIGIN_3": ("limits", 1),
}


async def _noop() -> None:
    pass


async def _noop_error(exc: Exception) -> None:
    pass


class Slots:
    """The API slot the runtime would pass: counts the requests made under it."""

    def __init__(self) -> None:
        self.taken = 0

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        self.taken += 1
        yield

    def __call__(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._slot()


async def _streams(url: str, names: list[str], slots: Slots, **fields: Any) -> dict[str, OriginStream | str]:
    """Each name's ``stream()``, all at once, by clients on one shared connection (an error's text in its place)."""
    pool = OriginConnections()
    clients = [
        OriginClient(SourceConfig(name=f"s{i}", servers=[url], stream=name, **fields), 2.0, connections=pool)
        for i, name in enumerate(names)
    ]
    out: dict[str, OriginStream | str] = {}

    async def one(client: OriginClient) -> None:
        try:
            out[client.source.stream] = await client.stream(slots)
        except OriginUnavailable as exc:
            out[client.source.stream] = str(exc)

    try:
        for client in clients:
            await client.connect(on_disconnected=_noop, on_reconnected=_noop, on_error=_noop_error)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for client in clients:
                    tg.start_soon(one, client)
    finally:
        for client in clients:
            await client.close()
    return out


@contextlib.contextmanager
def _no_error_logged() -> Iterator[list[MutableMapping[str, Any]]]:
    with structlog.testing.capture_logs() as logs:
        yield logs
    assert [e for e in logs if e.get("log_level") in ("warning", "error")] == []


async def _fill(url: str) -> None:
    async with connect(url) as nc:
        for name, (retention, count) in STREAMS.items():
            await create_stream(nc, name, [f"{name.lower()}.>"], retention=retention)
            for i in range(count):
                await nc.jetstream().publish(f"{name.lower()}.{i}", b"x")


async def test_sources_of_one_origin_read_their_streams_with_one_info_and_a_listing(origin: NatsServer) -> None:
    await _fill(origin.url)
    alone: dict[str, OriginStream | str] = {}
    for name in STREAMS:  # each on a connection of its own: its own info, the reference
        alone.update(await _streams(origin.url, [name], Slots()))
    slots = Slots()
    names = [*STREAMS, "MISSING"] * 3  # three sources per stream, and three of a stream that is not there
    with _no_error_logged():
        together = await _streams(origin.url, names, slots)
    assert {name: together[name] for name in STREAMS} == alone
    assert isinstance(alone["ORIGIN_0"], OriginStream) and alone["ORIGIN_0"].workqueue
    assert alone["ORIGIN_0"].last_seq == 3 and alone["ORIGIN_0"].api_level is not None
    assert "MISSING" in str(together["MISSING"]) and "not found" in str(together["MISSING"]).lower()
    # one info (the server's level), one listing or two for the fifteen sources that asked meanwhile, and the missing
    # stream's own infos: against fifteen infos
    assert slots.taken <= 1 + 2 + 3, slots.taken


async def test_a_user_who_may_not_list_gets_an_info_per_source_and_no_error(servers: ServerFactory) -> None:
    allowed = [f"$JS.API.STREAM.INFO.{name}" for name in STREAMS]
    bridge = Permissions(publish=tuple(allowed), subscribe=("_INBOX.>",))
    server = servers("origin", users_config(bridge))
    admin = server.url.replace("nats://", f"nats://admin:{ADMIN_PASSWORD}@")
    await _fill(admin)
    slots = Slots()
    auth = {"auth": {"user": "bridge", "password": BRIDGE_PASSWORD}}
    with _no_error_logged() as logs:
        got = await _streams(server.url, list(STREAMS) * 2, slots, **auth)
    assert all(isinstance(got[name], OriginStream) for name in STREAMS), got
    refused = [e for e in logs if e["event"] == "origin.streams_listed_no_more"]
    assert len(refused) == 1 and "STREAM.LIST" in refused[0]["reason"], refused
    assert slots.taken <= 8 + 2, slots.taken  # an info per source (and the one refused listing)
