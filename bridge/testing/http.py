"""GETs on loopback HTTP listeners: a nats-server's monitoring port and a bridge's own listener.

:func:`get` is the one blocking request (any HTTP status is an answer, not an error); the async helpers read a
running bridge's ``/metrics`` and ``/readyz`` without blocking the event loop.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

import anyio
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from bridge.testing.processes import BridgeProcess

__all__ = ["get", "http_get", "http_port", "metric", "readyz"]

LOOPBACK = "127.0.0.1"


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
