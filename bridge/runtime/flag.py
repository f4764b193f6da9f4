"""A one-shot event for the many per-source waits (:class:`Flag`), and what a wait for a stop needs (:class:`Waitable`).

Why not ``anyio.Event``: on asyncio it wraps an ``asyncio.Event``, whose empty waiter deque alone takes 760 bytes;
every source held four at all times (its runner's ``ready`` and wake-up, its task's ``stop`` and ``done``), about
3.6 KB of a quiet source's 39 (``tracemalloc``, 200 against 600 sources), and the runner makes a new wake-up on
every wake, a change event whenever something waits for one. A :class:`Flag` is two slots; its waiters' futures are
a list made by the first wait. Same rules as ``anyio.Event``:
set once, never cleared; a wait on a set flag is still a checkpoint; a cancelled wait leaves nothing behind. One
event loop only (no thread-safety, as ``asyncio.Event``)."""

from __future__ import annotations

import asyncio
from typing import Protocol

import anyio.lowlevel

__all__ = ["Flag", "Waitable"]


class Waitable(Protocol):
    """What waiting for a stop needs: a :class:`Flag` or an ``anyio.Event``."""

    def is_set(self) -> bool: ...

    async def wait(self) -> None: ...


class Flag:
    """``anyio.Event``'s ``set``/``is_set``/``wait`` for asyncio, without ``asyncio.Event``'s deque."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Set the flag and wake every waiter (a second call does nothing)."""
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for future in waiters or ():
            if not future.done():  # (a cancelled waiter's future is done)
                future.set_result(None)

    async def wait(self) -> None:
        """Return once the flag is set (at once, after a checkpoint, if it is)."""
        if self._set:
            await anyio.lowlevel.checkpoint()
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(future)
        try:
            await future
        finally:
            if self._waiters is not None and future in self._waiters:
                self._waiters.remove(future)
