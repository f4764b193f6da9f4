"""The bridge run inside this process and event loop, for scenarios that patch or inspect its objects."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import anyio

from bridge.testing.polling import wait_until

if TYPE_CHECKING:
    from bridge.runtime.app import Bridge

__all__ = ["running_bridge"]


@contextlib.asynccontextmanager
async def running_bridge(config_path: Path, log_path: Path, *, ready_timeout: float = 20.0) -> AsyncIterator[Bridge]:
    """Run ``Bridge(load_config(config_path))`` in this event loop until the block ends; yield the Bridge.

    Waits until every runner is ready (first reset done). On exit sets ``bridge.stop`` and waits (bounded) for
    ``run`` to return. Logs go to ``log_path`` as JSON lines.
    """
    import structlog

    from bridge import logs
    from bridge.config import load_config
    from bridge.runtime.app import Bridge

    log_file: TextIO = log_path.open("a", encoding="utf-8")
    logs.configure("info", "json", stream=log_file)
    bridge = Bridge(load_config(config_path, environ={}))
    finished = anyio.Event()
    failure: list[BaseException] = []

    async def run() -> None:
        try:
            await bridge.run(handle_signals=False)
        except BaseException as exc:
            failure.append(exc)
            raise
        finally:
            finished.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                await wait_until(
                    lambda: finished.is_set() or (bridge.runners and all(r.ready.is_set() for r in bridge.runners)),
                    timeout=ready_timeout,
                    what="in-process bridge ready",
                )
                assert not finished.is_set(), f"bridge.run returned early: {failure!r}"
                yield bridge
            finally:
                bridge.stop.set()
                with anyio.fail_after(20):
                    await finished.wait()
    finally:
        structlog.reset_defaults()
        log_file.close()
