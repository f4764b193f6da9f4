"""``/healthz`` of the daemon (``bridge.runtime.app.Bridge``): 503 once its event loop has not beaten for a while.

The listener and the loop beat are the daemon's own, on a real socket; only the intervals are shortened. No NATS
server is needed: health is about the process, not its connections.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from bridge.config import load_config
from bridge.observe.systemd import Notifier
from bridge.runtime import app
from bridge.runtime.app import Bridge
from bridge.testing.http import raw_request

pytestmark = pytest.mark.anyio

STALE = 1.0  # LOOP_STALE for the test: long enough not to trip on a busy machine, short enough to wait out
BEAT = 0.05
TIMEOUT = 15.0


def _bridge(tmp_path: Path) -> Bridge:
    path = tmp_path / "bridge.toml"
    path.write_text(
        """
[http]
listen = "127.0.0.1:0"

[target]
stream = "AGG"

[[sources]]
name = "edge-a"
stream = "ORDERS"
"""
    )
    return Bridge(load_config(path, environ={}), notifier=Notifier(None))


async def _healthz(port: int) -> tuple[int, dict[str, str]]:
    status, _, body = await raw_request(port, "/healthz")
    return status, json.loads(body)


async def _until_healthz(port: int, status: int) -> dict[str, str]:
    while True:
        got, body = await _healthz(port)
        if got == status:
            return body
        await anyio.sleep(BEAT)


async def test_healthz_is_503_while_the_loop_has_not_beaten_and_200_again_once_it_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app, "LOOP_STALE", STALE)
    monkeypatch.setattr(app, "LOOP_BEAT", BEAT)
    bridge = _bridge(tmp_path)
    beat = anyio.CancelScope()

    async def beating() -> None:
        with beat:
            await bridge._beat()

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            await tg.start(bridge._serve_http)
            assert bridge.http_port is not None
            port = bridge.http_port
            tg.start_soon(beating)
            assert await _until_healthz(port, 200) == {"status": "ok"}

            # The loop is blocked (a synchronous call that never yields): it cannot answer a probe meanwhile, but
            # the first code to run after it must not report a healthy loop.
            time.sleep(STALE + 0.2)  # noqa: ASYNC251 -- blocking the loop is the fault under test
            response = bridge._healthz()
            assert response.status == 503
            assert isinstance(response.body, bytes) and json.loads(response.body) == {"status": "event loop stalled"}
            assert not bridge._loop_healthy()  # the systemd watchdog withholds its ping on the same answer

            # once the loop runs again, the beat catches up and the probe recovers
            assert await _until_healthz(port, 200) == {"status": "ok"}

            # the beat stops while the listener keeps answering: the probe itself says 503
            beat.cancel()
            assert await _until_healthz(port, 503) == {"status": "event loop stalled"}
            tg.cancel_scope.cancel()
