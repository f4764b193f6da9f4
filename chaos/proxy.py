"""A TCP proxy between a bridge and a NATS server that cuts, refuses, stalls, delays and throttles the connection on
command.

The chaos runner owns one per link and drives it from its own event loop; every control method is synchronous
and takes effect at once, so the nemesis can record exactly when a fault began.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

_CHUNK = 64 * 1024
_SLICE = 1024  # under a rate limit, bytes are written this many at a time, each when the link would have sent it
_DIAL_TIMEOUT = 5.0

_Queue = asyncio.Queue[tuple[float, bytes]]  # (due loop time, chunk); b"" is the peer's EOF


@dataclass(slots=True)
class ProxyStats:
    """Counters since the proxy was made. Bytes count what was written on to the other side."""

    accepted: int = 0  # client connections forwarded (refused ones are not counted here)
    cut: int = 0
    refused: int = 0
    bytes_up: int = 0  # client -> server
    bytes_down: int = 0  # server -> client


@dataclass(eq=False, slots=True)
class _Pair:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None  # None while dialling
    held: int = 0  # bytes read from either side and not yet written to the other

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class FaultProxy:
    """Forwards TCP connections from 127.0.0.1:<port> to an upstream (host, port), with faults on command."""

    def __init__(self, upstream_host: str, upstream_port: int, *, name: str, listen_port: int = 0) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.name = name
        self.port = listen_port  # the bound port once started
        self.stats = ProxyStats()
        self._server: asyncio.Server | None = None
        self._closed = False
        self._refusing = False
        self._delay = 0.0
        self._rate = 0.0  # bytes per second each way, the link's (every connection shares it); 0: unlimited
        self._free_at = {True: 0.0, False: 0.0}  # per direction (up?): when the link has sent what it was given
        self._flowing = asyncio.Event()  # cleared while stalled
        self._flowing.set()
        self._pairs: dict[_Pair, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)

    @property
    def url(self) -> str:
        """The NATS URL a client should connect to instead of the upstream's."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def open_connections(self) -> int:
        """Client connections currently forwarded (or being dialled upstream)."""
        return len(self._pairs)

    @property
    def held_bytes(self) -> int:
        """Bytes of open connections read from one side and not yet written to the other (delayed or stalled)."""
        return sum(pair.held for pair in self._pairs)

    async def start(self) -> None:
        """Listen on 127.0.0.1:``listen_port`` (0 picks a free port) and set :attr:`port`."""
        if self._server is not None or self._closed:
            raise RuntimeError(f"proxy {self.name} already started")
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening, abort every connection and wait for every task of this proxy to end. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        for pair in self._pairs:
            pair.abort()
        self._pairs.clear()
        # a cancelled pair task may still be awaiting its pumps: loop until every task has really ended
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def cut(self) -> int:
        """Abort (RST) both sides of every open connection now; returns how many connections were cut."""
        pairs = list(self._pairs.items())
        self._pairs.clear()
        for pair, task in pairs:
            pair.abort()
            task.cancel()
        self.stats.cut += len(pairs)
        return len(pairs)

    def refuse(self, on: bool) -> None:
        """While on, every new client connection is accepted and aborted at once, without dialling upstream."""
        self._refusing = on

    def stall(self, on: bool) -> None:
        """While on, nothing is forwarded either way and nothing more is read, so the peers' kernel buffers fill
        and push back on them; the sockets stay open. Turning it off resumes the flow in order, nothing lost."""
        if on:
            self._flowing.clear()
        else:
            self._flowing.set()

    def set_delay(self, seconds: float) -> None:
        """Deliver each chunk ``seconds`` after it was read (latency, not a throughput limit); 0 for none.

        Applies to chunks read from now on; chunks never overtake one another, even when the delay shrinks."""
        if seconds < 0:
            raise ValueError(f"delay must be >= 0, not {seconds}")
        self._delay = seconds

    def set_rate(self, bytes_per_second: float) -> None:
        """Let at most ``bytes_per_second`` through each way, shared by every connection, as a thin link does (a
        satellite or cellular one); 0 for no limit. Bytes wait their turn in order, and the peers feel it as
        backpressure."""
        if bytes_per_second < 0:
            raise ValueError(f"rate must be >= 0, not {bytes_per_second}")
        self._rate = float(bytes_per_second)

    def heal(self) -> None:
        """End every fault: stop refusing, stalling, delaying and throttling."""
        self.refuse(False)
        self.stall(False)
        self.set_delay(0)
        self.set_rate(0)

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}-{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # a plain callback: asyncio does not keep the tasks it makes for coroutine callbacks, and close() must end them
        if self._closed or self._refusing:
            self.stats.refused += 1
            writer.transport.abort()
            return
        self.stats.accepted += 1
        pair = _Pair(writer)
        self._pairs[pair] = self._spawn(self._run(pair, reader), f"conn-{next(self._ids)}")

    async def _run(self, pair: _Pair, client_reader: asyncio.StreamReader) -> None:
        pumps: list[asyncio.Task[None]] = []
        graceful = False
        try:
            try:
                async with asyncio.timeout(_DIAL_TIMEOUT):
                    upstream_reader, upstream = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            except (OSError, TimeoutError):
                return
            pair.upstream = upstream
            up_queue: _Queue = asyncio.Queue()
            down_queue: _Queue = asyncio.Queue()
            up_gate, down_gate = asyncio.Event(), asyncio.Event()
            up_gate.set()
            down_gate.set()
            writers = {
                self._spawn(self._write(pair, upstream, up_queue, up_gate, up=True), "up-writer"),
                self._spawn(self._write(pair, pair.client, down_queue, down_gate, up=False), "down-writer"),
            }
            pumps = [
                *writers,
                self._spawn(self._read(pair, client_reader, up_queue, up_gate), "up-reader"),
                self._spawn(self._read(pair, upstream_reader, down_queue, down_gate), "down-reader"),
            ]
            pending: set[asyncio.Task[None]] = set(pumps)
            # a reader ends at its peer's EOF, but the pair ends only once a writer has delivered that EOF
            while True:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(task in writers or task.cancelled() or task.exception() is not None for task in done):
                    break
            graceful = any(task in writers and not task.cancelled() and task.exception() is None for task in done)
        finally:
            try:
                for task in pumps:
                    task.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                if graceful and pair.upstream is not None:
                    # one side said goodbye: let what was already written reach the other before closing both
                    ends = (pair.client, pair.upstream)
                    for writer in ends:
                        writer.close()
                    for writer in ends:
                        with contextlib.suppress(OSError):
                            await writer.wait_closed()
            finally:  # even when cut or closed while flushing
                pair.abort()
                self._pairs.pop(pair, None)

    async def _paced(self, dest: asyncio.StreamWriter, data: bytes, *, up: bool) -> None:
        """Write ``data`` a slice at a time, each once the link (this direction, all connections) is free for it."""
        loop = asyncio.get_running_loop()
        for start in range(0, len(data), _SLICE):
            piece = data[start : start + _SLICE]
            now = loop.time()
            begin = max(now, self._free_at[up])
            self._free_at[up] = begin + len(piece) / (self._rate or float("inf"))
            if begin > now:
                await asyncio.sleep(begin - now)
            dest.write(piece)

    async def _read(self, pair: _Pair, source: asyncio.StreamReader, queue: _Queue, gate: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # not reading while stalled or while the other side is slow is what pushes back on the sender
            await self._flowing.wait()
            await gate.wait()
            try:
                data = await source.read(_CHUNK)
            except OSError:
                data = b""  # a reset ends this direction like an EOF does
            pair.held += len(data)
            queue.put_nowait((loop.time() + self._delay, data))
            if not data:
                return

    async def _write(
        self, pair: _Pair, dest: asyncio.StreamWriter, queue: _Queue, gate: asyncio.Event, *, up: bool
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            await self._flowing.wait()
            if not data:
                return
            if self._rate:
                await self._paced(dest, data, up=up)
            else:
                dest.write(data)
            pair.held -= len(data)
            if up:
                self.stats.bytes_up += len(data)
            else:
                self.stats.bytes_down += len(data)
            gate.clear()
            try:
                await dest.drain()
            finally:
                gate.set()


@contextlib.asynccontextmanager
async def proxy_to(url: str, name: str) -> AsyncIterator[FaultProxy]:
    """A started :class:`FaultProxy` in front of the NATS server at ``url`` (``nats://host:port``), closed on exit."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    proxy = FaultProxy(host, int(port), name=name)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
