"""A minimal HTTP/1.1 server for metrics and health probes, run inside the daemon's own event loop.

Running in the same loop is the point: if the loop is blocked, probes time out, which is the liveness signal.
GET and HEAD only, one request per connection, bounded concurrency and bounded time per client.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, TypeAlias

import anyio
import anyio.abc
import prometheus_client
from anyio.streams.stapled import MultiListener

MAX_HEAD_BYTES = 16 * 1024
_LINGER_SECONDS = 1.0
_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")
_REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (/[\x21-\x7e]*) HTTP/1\.[01]")
# Peers vanishing mid-exchange are routine for a probe endpoint, not errors worth a log line.
_TRANSPORT_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


@dataclass(frozen=True)
class Response:
    """What a handler returns: status code, body and its content type."""

    status: int
    body: bytes | Sequence[bytes]  # parts, sent one after the other: a large body need not be joined first
    content_type: str = "text/plain; charset=utf-8"


Handler: TypeAlias = Callable[[], Awaitable[Response]] | Callable[[], Response]


def json_response(status: int, payload: Any) -> Response:
    """A ``Response`` carrying ``payload`` as JSON."""
    return Response(status, json.dumps(payload, sort_keys=True).encode() + b"\n", "application/json")


def metrics_handler(exposition: Callable[[], bytes | Sequence[bytes]]) -> Handler:
    """A handler serving what ``exposition`` writes, in the Prometheus text exposition format."""

    def handler() -> Response:
        return Response(200, exposition(), prometheus_client.CONTENT_TYPE_LATEST)

    return handler


def parse_listen(value: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` or ``[IPV6]:PORT`` into host and port; a host is required (no implicit all-interfaces)."""
    expected = f"invalid listen address {value!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464"
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
    else:
        host, sep, port = value.rpartition(":")
        if ":" in host:  # a bare IPv6 address: where it ends and the port begins is ambiguous
            raise ValueError(expected)
    if not sep or not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(expected)
    return host, int(port)


def format_listen(host: str, port: int) -> str:
    """``HOST:PORT``, with an IPv6 host in brackets: the form ``http.listen`` takes."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def local_url(listen: str, path: str) -> tuple[str | None, str]:
    """The URL at which a process on this host reaches ``path`` of a listener configured as ``listen``, or None and
    why it cannot (disabled, or a random port); an all-interfaces address is reached on loopback."""
    if not listen:
        return None, "http listener disabled in the configuration"
    host, port = parse_listen(listen)
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if port == 0:
        return None, "http listener on a random port"
    return f"http://{format_listen(host, port)}{path}", ""


class ListenError(Exception):
    """The listener could not bind its address: ``address`` (``HOST:PORT``), the ``cause``, and the ``fix``."""

    def __init__(self, address: str, cause: str, fix: str) -> None:
        super().__init__(f"cannot listen on {address}: {cause}")
        self.address = address
        self.cause = cause
        self.fix = fix


def listen_error(host: str, port: int, exc: OSError) -> ListenError:
    """What a failed bind means for the operator: the address, why, and another ``http.listen`` to use."""
    address = format_listen(host, port)
    other = 'or http.listen = "" to run without health and metrics'
    if exc.errno == errno.EADDRINUSE:
        cause = "address already in use"
        example = format_listen(host, port + 1 if 0 < port < 65535 else 9465)
        fix = f'another process listens there (a second bridge?): set another http.listen, e.g. "{example}", {other}'
    elif exc.errno in (errno.EACCES, errno.EPERM):
        cause = "permission denied"
        example = format_listen(host, 9465)
        fix = f'ports below 1024 need privileges: set another http.listen, e.g. "{example}", {other}'
    else:  # an unknown host name, an address no interface here has
        cause = f"address not usable here: {exc.strerror or exc}"
        example = format_listen("127.0.0.1", port or 9465)
        fix = f'set another http.listen, e.g. "{example}", {other}'
    return ListenError(address, cause, fix)


class _HeadTooLarge(Exception):
    pass


def _encode(response: Response, *, with_body: bool = True, extra: str = "") -> tuple[bytes, ...]:
    """The head and the body's parts, sent one after the other (a scrape of thousands of sources is megabytes: not
    copied once more to put its head in front)."""
    parts = (response.body,) if isinstance(response.body, bytes) else tuple(response.body)
    try:
        reason = HTTPStatus(response.status).phrase
    except ValueError:
        reason = ""
    head = (
        f"HTTP/1.1 {response.status} {reason}\r\nContent-Type: {response.content_type}\r\n"
        f"Content-Length: {sum(map(len, parts))}\r\nConnection: close\r\n{extra}\r\n"
    )
    return (head.encode("latin-1"), *parts) if with_body else (head.encode("latin-1"),)


def _plain(status: int) -> Response:
    return Response(status, HTTPStatus(status).phrase.lower().encode() + b"\n")


async def _read_head(stream: anyio.abc.ByteStream) -> bytes | None:
    """The request line and headers, or None if the peer closed first."""
    buffer = bytearray()
    while (end := _END_OF_HEAD.search(buffer)) is None:
        if len(buffer) > MAX_HEAD_BYTES:
            raise _HeadTooLarge
        try:
            buffer += await stream.receive()
        except anyio.EndOfStream:
            return None
    if end.start() > MAX_HEAD_BYTES:
        raise _HeadTooLarge
    return bytes(buffer[: end.start()])


class HttpServer:
    """Serves ``routes`` (exact paths, query string ignored) on ``host:port`` until cancelled."""

    def __init__(
        self,
        host: str,
        port: int,
        routes: Mapping[str, Handler],
        *,
        log: Any | None = None,
        read_timeout: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        self.host = host
        self.port = port
        self._routes = dict(routes)
        self._log = log
        self._read_timeout = read_timeout
        self._max_connections = max_connections
        self._active = 0
        self._listener: MultiListener[anyio.abc.SocketStream] | None = None

    async def listen(self) -> int:
        """Bind now (port 0 picks a free one) and return the bound port; raises :class:`ListenError` (the address,
        the cause and the fix) when the address cannot be bound: in use, not permitted, no such host."""
        if self._listener is None:
            try:
                self._listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
            except OSError as exc:  # socket.gaierror (unknown host) is one too
                raise listen_error(self.host, self.port, exc) from exc
            self.port = self._listener.extra(anyio.abc.SocketAttribute.local_port)
        return self.port

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Bind unless :meth:`listen` already did, report the bound port via ``task_status.started``, serve until
        cancelled (which closes the listener)."""
        await self.listen()
        listener, self._listener = self._listener, None
        assert listener is not None
        async with listener, anyio.create_task_group() as tg:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            for sub in listener.listeners:
                assert isinstance(sub, anyio.abc.SocketListener)  # all create_tcp_listener makes; accept() needs it
                tg.start_soon(self._accept_loop, sub, tg)
            task_status.started(self.port)

    async def _accept_loop(self, listener: anyio.abc.SocketListener, tg: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                # EMFILE and the like: back off and keep serving rather than spin or take the daemon down
                self._error("http.accept_failed", error=str(exc))
                await anyio.sleep(0.1)
                continue
            # counted here, not in the task, so the limit holds however the tasks get scheduled
            if self._active >= self._max_connections:
                await anyio.aclose_forcefully(stream)
                continue
            self._active += 1
            tg.start_soon(self._connection, stream)

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        try:
            async with stream:
                await self._exchange(stream)
        except _TRANSPORT_ERRORS:
            pass
        except Exception as exc:
            self._error("http.connection_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._active -= 1

    async def _exchange(self, stream: anyio.abc.SocketStream) -> None:
        head: bytes | None = None
        try:
            with anyio.move_on_after(self._read_timeout):
                head = await _read_head(stream)
        except _HeadTooLarge:
            reply = _encode(_plain(431))
        else:
            if head is None:  # closed or timed out before a full request: nobody is waiting for an answer
                return
            reply = await self._dispatch(head)
        with anyio.move_on_after(self._read_timeout):
            for part in reply:
                if part:
                    await stream.send(part)
        # Closing with unread input makes the kernel send RST, which can destroy the response before the client
        # has read it: half-close, then drain until the client closes (it was told to) or a short deadline.
        with anyio.move_on_after(_LINGER_SECONDS), suppress(anyio.EndOfStream):
            await stream.send_eof()
            while True:
                await stream.receive()

    async def _dispatch(self, head: bytes) -> tuple[bytes, ...]:
        match = _REQUEST_LINE.fullmatch(head.split(b"\n", 1)[0].rstrip(b"\r"))
        if match is None:
            return _encode(_plain(400))
        method, path = match.group(1).decode(), match.group(2).decode().split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _encode(_plain(405), extra="Allow: GET, HEAD\r\n")
        handler = self._routes.get(path)
        if handler is None:
            return _encode(_plain(404), with_body=method == "GET")
        try:
            result = handler()
            response = result if isinstance(result, Response) else await result
        except Exception as exc:
            self._error("http.handler_failed", path=path, error=f"{type(exc).__name__}: {exc}")
            response = _plain(500)
        return _encode(response, with_body=method == "GET")

    def _error(self, event: str, **fields: Any) -> None:
        if self._log is not None:
            self._log.error(event, **fields)
