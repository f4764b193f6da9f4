"""An operation run once for every caller waiting when it begins (:class:`GroupRun`)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

__all__ = ["GroupRun"]

_T = TypeVar("_T")


class GroupRun(Generic[_T]):
    """An operation whose result covers everything asked before it began (nats-py's flush: the PONG of a PING written
    after what came before; a listing of an origin's streams: their state when it began), run once for every caller
    waiting when it begins.

    A caller's ask is covered by the first run that begins after it: asks that arrive while a run is under way wait
    for the next one, which one of them starts once it ends. Every caller a run covers gets its result; a run that
    fails ends their wait with None (the callers do without: a flush that fails says nothing anyone acts on, a
    listing that fails is asked of each stream instead); a cancelled run covers nobody, and the next asker runs
    again."""

    def __init__(self) -> None:
        self._asked = 0  # asks so far, numbered
        self._covered = 0  # the highest ask a finished run covers
        self._result: _T | None = None  # the last finished run's, while a caller it may cover is inside
        self._inside = 0  # callers in ``run``
        self._running = False
        self._ended = anyio.Event()  # set when a run ends (then replaced)

    async def run(self, operation: Callable[[], Awaitable[_T]]) -> _T | None:
        self._inside += 1
        try:
            return await self._run(operation)
        finally:
            self._inside -= 1
            if not self._inside:
                # a later ask is never covered by a finished run: nobody reads it again (a listing of every stream
                # of an origin, kept per origin for as long as the process ran: 2.4 KB of every source's memory)
                self._result = None

    async def _run(self, operation: Callable[[], Awaitable[_T]]) -> _T | None:
        self._asked += 1
        ask = self._asked
        gathered = False
        while self._covered < ask:
            if self._running:
                await self._ended.wait()
                continue
            if not gathered:  # one turn of the loop first: the callers woken with this one ask before the run begins
                gathered = True
                await anyio.lowlevel.checkpoint()
                continue
            self._running = True
            upto = self._asked  # every ask so far came before this run begins
            try:
                result: _T | None = None
                with contextlib.suppress(Exception):
                    result = await operation()
                self._covered, self._result = max(self._covered, upto), result
            finally:
                self._running = False
                ended, self._ended = self._ended, anyio.Event()
                ended.set()
        # (runs end in the order they began, and a later one covers every earlier ask: the last result is ours or newer)
        return self._result
