"""Watching the source registry: every change handed to the bridge within a second or two, none invented.

A task of :meth:`bridge.runtime.app.Bridge.run` (with ``[coordination]``), on the bridge's loop and a connection of
its own to the coordination servers. It looks at the registry's stream state (one STREAM.INFO) every ``POLL``
seconds, and at once after a write to the registry (a plain subscription to the entries' subjects: every KV write is
also a message on its subject); when the state moved it reads the registry and hands the entries to ``on_change``
if they differ from the last ones handed over. A wake-up is only a hint: what is handed over is always what the
bucket holds, read after the write was stored (``QUIET`` after the last wake-up, so a batch of writes is read
once, and the next look catches a write not stored yet).

What it never does: hand over an empty registry because a read failed (a failure keeps the last entries and is
logged, at most every 30 s), or because the bucket was missing once (a bucket seen before must be missing twice,
``POLL`` apart: a stream briefly unknown during a leader election must not stop every registered source).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import anyio
from nats.aio.client import Client as NATS

from bridge.config.registry import RegistryEntry
from bridge.errors import BridgeError
from bridge.io.registry import RegistryBucket, State
from bridge.logs import Throttle, get_logger

POLL = 1.0  # seconds between looks without a wake-up: a change missed by the subscription is seen within this
QUIET = 0.05  # after a wake-up, read once no other write came for this long ...
QUIET_MAX = 0.5  # ... or this long after the first
TIMEOUT = 5.0

_UNREAD: State = (-1, -1, -1)  # before the first look: differs from every state


class RegistryWatcher:
    """Hands every change of the registry in ``bucket`` to ``on_change`` (awaited: the next look waits for it)."""

    def __init__(
        self,
        nc: NATS,
        bucket: RegistryBucket,
        on_change: Callable[[Sequence[RegistryEntry]], Awaitable[None]],
        *,
        poll: float = POLL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nc = nc
        self.bucket = bucket
        self.on_change = on_change
        self.poll = poll
        self.clock = clock
        self.log = get_logger(component="registry", bucket=bucket.bucket)
        self.entries: list[RegistryEntry] | None = None  # the last handed over (None: never read)
        self._state: State = _UNREAD
        self._missing_once = False
        self._woken = anyio.Event()
        self._throttle = Throttle()

    async def run(self) -> None:
        """Look until cancelled."""
        try:
            sub = await self.nc.subscribe(self.bucket.subjects, cb=self._on_write)
        except Exception as exc:  # not connected yet: the looks alone see every change, within POLL
            self.log.warning("registry.watch_unavailable", error=str(exc), hint=f"changes seen within {self.poll:g}s")
            sub = None
        try:
            while True:
                await self.look()
                await self._wait()
        finally:
            if sub is not None:
                with anyio.CancelScope(shield=True), anyio.move_on_after(1.0):
                    try:
                        await sub.unsubscribe()
                    except Exception as exc:  # the connection is gone; so is the subscription
                        self.log.debug("registry.unsubscribe_failed", error=str(exc))

    async def _on_write(self, _msg: object) -> None:
        self._woken.set()

    async def _wait(self) -> None:
        with anyio.move_on_after(self.poll):
            await self._woken.wait()
        if not self._woken.is_set():
            return
        # a batch of writes (sources add of many) is read once it is over, or after QUIET_MAX
        deadline = self.clock() + QUIET_MAX
        while self._woken.is_set() and self.clock() < deadline:
            self._woken = anyio.Event()
            await anyio.sleep(QUIET)
        self._woken = anyio.Event()

    async def look(self) -> bool:
        """Read the registry if it changed and hand it over if its entries did; True when they were handed over."""
        try:
            state = await self.bucket.state(TIMEOUT)
            if state is None and self._state not in (None, _UNREAD) and not self._missing_once:
                self._missing_once = True  # gone? look again before believing it
                return False
            self._missing_once = False
            if state == self._state:
                return False
            entries = await self.bucket.read(TIMEOUT, through=state[1]) if state is not None else []
        except BridgeError as exc:
            suppressed = self._throttle.allow(self.clock(), str(exc))
            if suppressed is not None:
                self.log.warning(
                    "registry.read_failed",
                    error=str(exc),
                    similar_suppressed=suppressed,
                    kept=len(self.entries or []),
                    hint="the sources already read keep running; the registry is read again every second",
                )
            return False
        self._state = state
        if entries == self.entries:
            return False
        first = self.entries is None
        self.entries = entries
        self.log.info("registry.read", sources=len(entries), first=first, missing=state is None)
        await self.on_change(entries)
        return True
