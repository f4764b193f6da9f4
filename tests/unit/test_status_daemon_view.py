"""``nats-bridge status`` reads the running daemon's ``/readyz``; any answer that is not its JSON view is reported,
never a crash (a daemon mid-failure answers 500 with a text page)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from bridge.commands.status import _daemon_view


def serving(status: int, body: bytes) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        thread.join(timeout=5)
        server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "ok"),
    [
        (200, b'{"ready": true, "sources": {}}', True),
        (503, b'{"ready": false, "sources": {}}', True),  # not ready is still the daemon's full answer
        (500, b"Internal Server Error", False),
        (200, b"[1, 2]", False),
    ],
)
def test_the_daemon_view_is_its_json_or_a_reason(status: int, body: bytes, ok: bool) -> None:
    for port in serving(status, body):
        view, note = _daemon_view(f"127.0.0.1:{port}")
        assert (view is not None) is ok, note
        assert f":{port}/readyz" in note
