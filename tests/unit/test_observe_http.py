"""``bridge.observe.http``: the probe and metrics server, exercised over real sockets on 127.0.0.1."""

from __future__ import annotations

import errno
import json
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bridge.observe.http import (
    Handler,
    HttpServer,
    ListenError,
    Response,
    format_listen,
    json_response,
    listen_error,
    metrics_handler,
    parse_listen,
)
from bridge.testing.http import exchange, parse_response, raw_request, read_all

pytestmark = pytest.mark.anyio

TIMEOUT = 10.0  # bound on every test


class RecordingLog:
    """Stands in for a structlog logger: keeps every ``error`` event."""

    def __init__(self) -> None:
        self.errors: list[tuple[str, dict[str, Any]]] = []

    def error(self, event: str, **fields: Any) -> None:
        self.errors.append((event, fields))


def ok() -> Response:
    return Response(200, b"fine\n")


@asynccontextmanager
async def running(routes: Mapping[str, Handler], **kwargs: Any) -> AsyncIterator[HttpServer]:
    """A server on 127.0.0.1 port 0, cancelled on exit; the whole block is bounded by ``TIMEOUT``."""
    server = HttpServer("127.0.0.1", 0, routes, **kwargs)
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            port = await tg.start(server.serve)
            assert port == server.port != 0
            yield server
            tg.cancel_scope.cancel()


async def test_get_returns_status_headers_and_body() -> None:
    async with running({"/health": ok}) as server:
        status, headers, body = await raw_request(server.port, "/health")
    assert status == 200
    assert body == b"fine\n"
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["content-length"] == str(len(body))
    assert headers["connection"] == "close"


async def test_head_returns_headers_without_body() -> None:
    async with running({"/health": ok}) as server:
        status, headers, body = await raw_request(server.port, "/health", method="HEAD")
    assert (status, body) == (200, b"")
    assert headers["content-length"] == str(len(b"fine\n"))


async def test_query_string_is_ignored_for_routing() -> None:
    async with running({"/health": ok}) as server:
        status, _, body = await raw_request(server.port, "/health?verbose=1&x")
    assert (status, body) == (200, b"fine\n")


async def test_http_1_0_and_bare_newlines_are_accepted() -> None:
    async with running({"/health": ok}) as server:
        status, _, body = parse_response(await exchange(server.port, b"GET /health HTTP/1.0\n\n"))
    assert (status, body) == (200, b"fine\n")


@pytest.mark.parametrize("path", ["/", "/nope", "/health/", "/healthz"])
async def test_unknown_path_is_404(path: str) -> None:
    async with running({"/health": ok}) as server:
        status, headers, body = await raw_request(server.port, path)
    assert status == 404
    assert headers["content-length"] == str(len(body)) != "0"


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS"])
async def test_other_methods_are_405_with_allow(method: str) -> None:
    async with running({"/health": ok}) as server:
        status, headers, _ = await raw_request(server.port, "/health", method=method)
    assert status == 405
    assert headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(
    "raw",
    [
        b"garbage\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET health HTTP/1.1\r\n\r\n",
        b"GET / HTTP/2.0\r\n\r\n",
        b"\x00\xff\r\n\r\n",
    ],
)
async def test_malformed_request_line_is_400(raw: bytes) -> None:
    async with running({"/": ok}) as server:
        status, _, _ = parse_response(await exchange(server.port, raw))
    assert status == 400


@pytest.mark.parametrize("terminated", [True, False])
async def test_huge_headers_are_431_and_the_server_keeps_serving(terminated: bool) -> None:
    raw = b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 40_000 + (b"\r\n\r\n" if terminated else b"")
    async with running({"/health": ok}) as server:
        status, _, _ = parse_response(await exchange(server.port, raw))
        assert status == 431
        assert (await raw_request(server.port, "/health"))[0] == 200


async def test_raising_handler_is_500_logged_and_the_server_keeps_serving() -> None:
    def broken() -> Response:
        raise RuntimeError("boom")

    log = RecordingLog()
    async with running({"/broken": broken, "/health": ok}, log=log) as server:
        status, headers, body = await raw_request(server.port, "/broken")
        assert status == 500
        assert headers["content-length"] == str(len(body))
        assert b"boom" not in body
        assert (await raw_request(server.port, "/health"))[0] == 200
    assert log.errors == [("http.handler_failed", {"path": "/broken", "error": "RuntimeError: boom"})]


async def test_sync_and_async_handlers() -> None:
    async def ready() -> Response:
        await anyio.lowlevel.checkpoint()
        return json_response(503, {"ready": False, "sources": ["a"]})

    async with running({"/sync": ok, "/ready": ready}) as server:
        assert (await raw_request(server.port, "/sync"))[0] == 200
        status, headers, body = await raw_request(server.port, "/ready")
    assert status == 503
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"ready": False, "sources": ["a"]}


async def test_slow_client_does_not_hold_the_server() -> None:
    async with running({"/health": ok}) as server, await anyio.connect_tcp("127.0.0.1", server.port) as slow:
        await slow.send(b"GET /health HTTP/1.1\r\n")  # never finished
        assert (await raw_request(server.port, "/health"))[0] == 200


async def test_slow_client_is_dropped_after_the_read_timeout() -> None:
    async with running({"/health": ok}, read_timeout=0.2) as server:
        async with await anyio.connect_tcp("127.0.0.1", server.port) as slow:
            await slow.send(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            started = anyio.current_time()
            assert await read_all(slow) == b""  # closed without an answer
            assert anyio.current_time() - started >= 0.1
        assert (await raw_request(server.port, "/health"))[0] == 200


async def test_connections_beyond_the_limit_are_closed_at_once() -> None:
    entered, release = anyio.Event(), anyio.Event()
    results: list[int] = []

    async def blocking() -> Response:
        entered.set()
        await release.wait()
        return ok()

    async def first(port: int) -> None:
        results.append((await raw_request(port, "/block"))[0])

    async with running({"/block": blocking, "/health": ok}, max_connections=1) as server:
        async with anyio.create_task_group() as tg:
            tg.start_soon(first, server.port)
            await entered.wait()
            async with await anyio.connect_tcp("127.0.0.1", server.port) as rejected:
                assert await read_all(rejected) == b""
            release.set()
        assert results == [200]
        # the slot frees once the first connection is fully closed on the server's side too
        while not (reply := await exchange(server.port, b"GET /health HTTP/1.1\r\n\r\n")):
            await anyio.sleep(0.01)
        assert parse_response(reply)[0] == 200


async def test_serving_stops_when_cancelled() -> None:
    async with running({"/health": ok}) as server:
        port = server.port
    with anyio.fail_after(TIMEOUT), pytest.raises(OSError):
        await anyio.connect_tcp("127.0.0.1", port)


async def test_metrics_handler_serves_the_registry() -> None:
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("bridge_test_events", "Events seen by the test.", registry=registry).inc(3)
    async with running({"/metrics": metrics_handler(lambda: prometheus_client.generate_latest(registry))}) as server:
        status, headers, body = await raw_request(server.port, "/metrics")
    assert status == 200
    assert headers["content-type"] == prometheus_client.CONTENT_TYPE_LATEST
    samples = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert samples["bridge_test_events_total"] == 3.0


async def test_a_body_in_parts_is_sent_whole_with_its_length() -> None:
    parts = [b"# HELP a A.\n# TYPE a gauge\na 1.0\n", b"", b"b 2.0\n" * 50_000]
    async with running({"/metrics": metrics_handler(lambda: parts)}) as server:
        status, headers, body = await raw_request(server.port, "/metrics")
        head_status, head_headers, head_body = await raw_request(server.port, "/metrics", method="HEAD")
    assert status == 200 and body == b"".join(parts)
    assert int(headers["content-length"]) == len(body)
    assert head_status == 200 and int(head_headers["content-length"]) == len(body) and head_body == b""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("localhost:0", ("localhost", 0)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
        ("[::1]:9464", ("::1", 9464)),
        ("[::]:80", ("::", 80)),
    ],
)
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize(
    "value",
    [":9464", "9464", "localhost", "localhost:", "host:port", "host:-1", "host:70000", "::1:9464", "[::1]", "[]:80"],
)
def test_parse_listen_rejects(value: str) -> None:
    with pytest.raises(ValueError, match=r"expected HOST:PORT"):
        parse_listen(value)


async def test_listen_binds_before_serving_and_serve_uses_that_socket() -> None:
    server = HttpServer("127.0.0.1", 0, {"/health": ok})
    port = await server.listen()
    assert port == server.port != 0
    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            assert await tg.start(server.serve) == port
            assert (await raw_request(port, "/health"))[0] == 200
            tg.cancel_scope.cancel()


async def test_an_address_in_use_is_a_listen_error_with_the_address_and_the_fix() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as caught:
            await HttpServer("127.0.0.1", port, {"/health": ok}).listen()
    err = caught.value
    assert err.address == f"127.0.0.1:{port}" and err.cause == "address already in use"
    assert f'e.g. "127.0.0.1:{port + 1}"' in err.fix and 'http.listen = ""' in err.fix
    assert "without health and metrics" in err.fix
    assert str(err) == f"cannot listen on 127.0.0.1:{port}: address already in use"


async def test_an_unknown_host_is_a_listen_error() -> None:
    with pytest.raises(ListenError) as caught:
        await HttpServer("no-such-host.invalid", 9464, {"/health": ok}).listen()
    assert caught.value.address == "no-such-host.invalid:9464"
    assert caught.value.cause.startswith("address not usable here")
    assert 'e.g. "127.0.0.1:9464"' in caught.value.fix


def test_a_denied_port_suggests_an_unprivileged_one() -> None:
    err = listen_error("0.0.0.0", 80, PermissionError(errno.EACCES, "Permission denied"))
    assert err.cause == "permission denied" and 'e.g. "0.0.0.0:9465"' in err.fix and "below 1024" in err.fix


@pytest.mark.parametrize(
    ("host", "port", "expected"), [("127.0.0.1", 9464, "127.0.0.1:9464"), ("::1", 9464, "[::1]:9464")]
)
def test_format_listen_is_what_parse_listen_reads(host: str, port: int, expected: str) -> None:
    assert format_listen(host, port) == expected
    assert parse_listen(expected) == (host, port)
