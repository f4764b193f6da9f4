"""``chaos.proxy.FaultProxy`` in front of an in-process TCP echo server: forwarding, cut, refuse, stall, delay."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from chaos.proxy import FaultProxy

TIMEOUT = 10.0  # bound on every test
ABSENCE = 0.3  # how long "nothing arrives" is watched for


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(body(), TIMEOUT)

    asyncio.run(bounded())


async def eventually(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Echo:
    """A TCP server on 127.0.0.1 that writes back whatever it reads, until EOF."""

    def __init__(self) -> None:
        self.accepted = 0
        self.received = bytearray()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.append(writer)
        task = asyncio.get_running_loop().create_task(self._echo(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                self.received += data
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


class Rig:
    """An echo server behind a proxy, and the client connections made to the proxy."""

    def __init__(self, echo: Echo, proxy: FaultProxy) -> None:
        self.echo = echo
        self.proxy = proxy
        self.clients: list[asyncio.StreamWriter] = []

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.proxy.port)
        self.clients.append(writer)
        return reader, writer


@asynccontextmanager
async def rig() -> AsyncIterator[Rig]:
    echo = Echo()
    await echo.start()
    proxy = FaultProxy("127.0.0.1", echo.port, name="test-proxy")
    await proxy.start()
    r = Rig(echo, proxy)
    try:
        yield r
    finally:
        for writer in r.clients:
            writer.transport.abort()
        await proxy.close()
        await echo.close()


async def round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> bytes:
    # write without draining first: the echo comes back while we are still sending, so read concurrently
    writer.write(payload)
    received, _ = await asyncio.gather(reader.readexactly(len(payload)), writer.drain())
    return received


async def assert_closed_by_peer(reader: asyncio.StreamReader) -> None:
    try:
        data = await reader.read(65536)
    except ConnectionError:
        return
    assert data == b"", f"expected EOF, got {data[:40]!r}"


async def assert_nothing_arrives(reader: asyncio.StreamReader) -> None:
    with pytest.raises(TimeoutError):
        data = await asyncio.wait_for(reader.read(65536), ABSENCE)
        pytest.fail(f"expected nothing, got {data[:40]!r}")


def pattern(size: int) -> bytes:
    return os.urandom(size)


def test_bytes_pass_both_ways_unchanged() -> None:
    async def body() -> None:
        async with rig() as r:
            assert r.proxy.url == f"nats://127.0.0.1:{r.proxy.port}"
            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"PING\r\n") == b"PING\r\n"
            big = pattern(1024 * 1024)
            assert await round_trip(reader, writer, big) == big
            assert r.proxy.open_connections == 1
            assert r.proxy.stats.accepted == 1
            assert r.proxy.stats.bytes_up == r.proxy.stats.bytes_down == len(big) + 6

    run(body)


def test_connections_are_independent() -> None:
    async def body() -> None:
        async with rig() as r:
            conns = [await r.connect() for _ in range(3)]
            payloads = [pattern(100_000) for _ in conns]
            trips = (round_trip(reader, writer, p) for (reader, writer), p in zip(conns, payloads, strict=True))
            results = await asyncio.gather(*trips)
            assert results == payloads
            assert r.proxy.open_connections == 3

    run(body)


def test_client_eof_closes_the_upstream_side_and_drops_the_pair() -> None:
    async def body() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"hi") == b"hi"
            writer.write(b"last words")
            writer.write_eof()
            # no half-close: the proxy delivers what was sent before the EOF, then closes both sides
            echoed = await reader.read()
            assert b"last words".startswith(echoed)
            await eventually(lambda: r.echo.received == b"hilast words", "the last words to reach upstream")
            await eventually(lambda: not r.echo._tasks, "upstream to see the connection end")
            await eventually(lambda: r.proxy.open_connections == 0, "the pair to be dropped")

    run(body)


def test_upstream_close_closes_the_client() -> None:
    async def body() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"hi") == b"hi"
            await r.echo.close()
            await assert_closed_by_peer(reader)
            await eventually(lambda: r.proxy.open_connections == 0, "the pair to be dropped")

    run(body)


def test_failed_dial_aborts_the_client() -> None:
    async def body() -> None:
        # bound but not listening: connecting is refused, and the port cannot be picked as an ephemeral one
        with socket.socket() as dead:
            dead.bind(("127.0.0.1", 0))
            proxy = FaultProxy("127.0.0.1", dead.getsockname()[1], name="dead")
            await proxy.start()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
                await assert_closed_by_peer(reader)
                writer.transport.abort()
                await eventually(lambda: proxy.open_connections == 0, "the pair to be dropped")
                assert proxy.stats.accepted == 1
            finally:
                await proxy.close()

    run(body)


def test_cut_resets_open_connections_and_new_ones_work() -> None:
    async def body() -> None:
        async with rig() as r:
            conns = [await r.connect() for _ in range(2)]
            for reader, writer in conns:
                assert await round_trip(reader, writer, b"hello") == b"hello"
            assert r.proxy.cut() == 2
            assert r.proxy.open_connections == 0
            for reader, _ in conns:
                await assert_closed_by_peer(reader)
            # no task of a cut connection outlives it
            await eventually(lambda: not _proxy_tasks(r.proxy), "the cut connections' tasks to end")
            assert r.proxy.stats.cut == 2
            await eventually(lambda: not r.echo._tasks, "the upstream side to be closed")

            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"again") == b"again"
            assert r.proxy.cut() == 1
            assert r.proxy.cut() == 0

    run(body)


def test_refuse_closes_new_connections_until_turned_off() -> None:
    async def body() -> None:
        async with rig() as r:
            kept_reader, kept_writer = await r.connect()
            assert await round_trip(kept_reader, kept_writer, b"kept") == b"kept"
            r.proxy.refuse(True)
            for _ in range(2):
                reader, _ = await r.connect()
                await assert_closed_by_peer(reader)
            await eventually(lambda: r.proxy.stats.refused == 2, "two refusals")
            assert r.echo.accepted == 1  # upstream never dialled for a refused connection
            # refusing new connections leaves the open one alone
            assert await round_trip(kept_reader, kept_writer, b"still") == b"still"

            r.proxy.refuse(False)
            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"back") == b"back"
            assert r.proxy.stats.accepted == 2

    run(body)


def test_stall_holds_bytes_with_backpressure_and_releases_them_in_order() -> None:
    async def body() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"before") == b"before"
            r.proxy.stall(True)
            payload = pattern(16 * 1024 * 1024)
            writer.write(payload)
            await assert_nothing_arrives(reader)
            assert r.proxy.stats.bytes_up == 6
            # the proxy stopped reading, so the kernel buffers filled and the rest is still queued at the client
            assert writer.transport.get_write_buffer_size() > 0
            assert r.proxy.open_connections == 1
            assert 0 < r.proxy.held_bytes <= 2 * 64 * 1024  # at most a chunk each way read before the stall began

            r.proxy.stall(False)
            received, _ = await asyncio.gather(reader.readexactly(len(payload)), writer.drain())
            assert received == payload

    run(body)


def test_stall_holds_chunks_already_waiting_out_a_delay() -> None:
    async def body() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"x") == b"x"
            r.proxy.set_delay(0.1)
            writer.write(b"queued")
            await eventually(lambda: r.proxy.held_bytes > 0, "the chunk to be read into the delay queue")
            r.proxy.stall(True)
            await assert_nothing_arrives(reader)  # longer than the delay: the stall, not the delay, holds it
            r.proxy.heal()
            assert await asyncio.wait_for(reader.readexactly(6), 5) == b"queued"

    run(body)


DELAY = 0.2


def test_delay_adds_latency_each_way() -> None:
    async def body() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"warm") == b"warm"
            r.proxy.set_delay(DELAY)
            start = time.monotonic()
            assert await round_trip(reader, writer, b"ping") == b"ping"
            elapsed = time.monotonic() - start
            # the request and the echo each wait DELAY; the millisecond covers timer granularity, not slowness
            assert elapsed >= 2 * DELAY - 0.001, elapsed

            r.proxy.set_delay(0)
            assert await round_trip(reader, writer, b"fast") == b"fast"

    run(body)


def test_delay_is_latency_not_a_throughput_limit() -> None:
    async def body() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            r.proxy.set_delay(0.1)
            payload = pattern(4 * 1024 * 1024)
            start = time.monotonic()
            assert await round_trip(reader, writer, payload) == payload
            # >= 64 chunks each way: delaying them one after another would take over 12 s, in flight about 0.2 s
            assert time.monotonic() - start < 5

    run(body)


def test_shrinking_the_delay_never_reorders() -> None:
    async def body() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            r.proxy.set_delay(0.3)
            writer.write(b"first,")
            await eventually(lambda: r.proxy.held_bytes > 0, "the first chunk to be queued")
            r.proxy.set_delay(0)
            writer.write(b"second")
            assert await reader.readexactly(12) == b"first,second"

    run(body)


def test_close_leaves_no_tasks_behind() -> None:
    async def body() -> None:
        baseline = asyncio.all_tasks()
        echo = Echo()
        await echo.start()
        proxy = FaultProxy("127.0.0.1", echo.port, name="closing")
        await proxy.start()
        clients = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            clients.append((reader, writer))
            assert await round_trip(reader, writer, b"up") == b"up"
        proxy.set_delay(5)  # one connection with a chunk waiting out a delay
        clients[0][1].write(b"delayed")
        proxy.stall(True)  # and one with bytes held by a stall
        clients[1][1].write(b"stalled")
        await eventually(lambda: proxy.held_bytes > 0, "the delayed chunk to be queued")

        await proxy.close()
        assert not _proxy_tasks(proxy)
        assert proxy.open_connections == 0
        for reader, _ in clients:
            await assert_closed_by_peer(reader)
        await proxy.close()  # idempotent
        for _, writer in clients:
            writer.transport.abort()
        await echo.close()
        assert asyncio.all_tasks() == baseline

    run(body)


def test_negative_delay_is_rejected() -> None:
    with pytest.raises(ValueError):
        FaultProxy("127.0.0.1", 1, name="x").set_delay(-1)


def _proxy_tasks(proxy: FaultProxy) -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(f"{proxy.name}-")]


def test_a_rate_limits_throughput_each_way_and_heal_lifts_it() -> None:
    async def body() -> None:
        async with rig() as r:
            reader, writer = await r.connect()
            assert await round_trip(reader, writer, b"warm") == b"warm"
            r.proxy.set_rate(64 * 1024)
            payload = pattern(48 * 1024)
            start = time.monotonic()
            assert await round_trip(reader, writer, payload) == payload
            # 48 KiB each way at 64 KiB/s: at least 0.75 s one way (the two directions overlap); a lower bound only
            assert time.monotonic() - start >= 0.7
            r.proxy.heal()
            assert await round_trip(reader, writer, payload) == payload
            assert r.proxy.stats.bytes_up >= 2 * len(payload)

    run(body)


def test_negative_rate_is_rejected() -> None:
    with pytest.raises(ValueError, match="rate must be >= 0"):
        FaultProxy("127.0.0.1", 1, name="x").set_rate(-1)
