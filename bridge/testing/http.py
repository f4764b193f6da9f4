"""GETs on loopback HTTP listeners: a nats-server's monitoring port and a bridge's own listener.

:func:`get` is the one blocking request (any HTTP status is an answer, not an error); the async helpers read a
running bridge's ``/metrics`` and ``/readyz`` without blocking the event loop. :func:`raw_request` and
:func:`exchange` write requests by hand on a socket and read the response exactly as it came, for tests of an
HTTP server itself (``bridge.observe.http``): its headers, its framing, its answer to malformed requests.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from bridge.testing.processes import BridgeProcess

__all__ = [
    "answering",
    "exchange",
    "get",
    "http_get",
    "http_port",
    "metric",
    "parse_response",
    "raw_request",
    "read_all",
    "readyz",
    "standby_ready",
]

LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def answering(answers: Mapping[str, tuple[int, bytes]]) -> Iterator[int]:
    """A stand-in HTTP listener on loopback for what asks a daemon's listener (``status``, ``health``): each path's
    ``(status, body)``, 404 for any other; yields its port, and stops with the block."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answers.get(self.path, (404, b""))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()


def get(url: str, timeout: float) -> tuple[int, bytes]:
    """GET ``url``: ``(status, body)`` for any HTTP status (a 503 is an answer); raises ``OSError`` otherwise.

    ``urllib.error.URLError`` and socket timeouts are ``OSError``s.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:  # /healthz answers 503 while starting: a status, not a failure
        with exc:
            return int(exc.code), bytes(exc.read())


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    """GET ``path`` from the bridge's listener on 127.0.0.1: (status, body), 5 s at most."""
    return await anyio.to_thread.run_sync(get, f"http://{LOOPBACK}:{port}{path}", 5.0)


async def http_port(bridge: BridgeProcess) -> int:
    """The port the bridge's HTTP listener bound (it logs ``http.listening``), waiting up to 20 s for it."""
    await bridge.wait_event("http.listening", timeout=20)
    (event,) = [e for e in bridge.events() if e.get("event") == "http.listening"][-1:]
    return int(event["port"])


async def metric(port: int, name: str, **labels: str) -> float | None:
    """One sample of ``/metrics`` (None when absent)."""
    _, body = await http_get(port, "/metrics")
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    """``/readyz``: its status and JSON body."""
    status, body = await http_get(port, "/readyz")
    return status, json.loads(body)


async def standby_ready(bridge: BridgeProcess, source: str) -> bool:
    """Whether ``bridge`` is ready (``/readyz`` 200) and holds ``source`` as a standby, to take it over when its
    owner's lease lapses."""
    status, body = await readyz(await http_port(bridge))
    entry = body.get("sources", {}).get(source, {})
    return status == 200 and entry.get("role") == "standby"


# -- requests written by hand ----------------------------------------------------------------------------------


async def read_all(stream: anyio.abc.ByteStream) -> bytes:
    """Everything ``stream`` receives until the other end closes it (``b""``: closed without a word)."""
    chunks = []
    try:
        while True:
            chunks.append(await stream.receive())
    except anyio.EndOfStream:
        return b"".join(chunks)


async def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` to 127.0.0.1:``port`` and return everything the server sends back before closing."""
    async with await anyio.connect_tcp(LOOPBACK, port) as stream:
        await stream.send(raw)
        return await read_all(stream)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """An HTTP/1.1 response as received: ``(status, headers by lower-case name, body)``.

    Raises AssertionError if it is not one (no end of the head, another version).
    """
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise AssertionError(f"no end of the response head: {raw!r}")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, _reason = status_line.split(" ", 2)
    if version != "HTTP/1.1":
        raise AssertionError(f"an {version} response: {status_line!r}")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status), headers, body


async def raw_request(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 ``method path`` request on a connection of its own: ``(status, headers, body)``."""
    return parse_response(
        await exchange(port, f"{method} {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\n\r\n".encode())
    )
