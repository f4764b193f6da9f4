"""Performs what :class:`bridge.core.reach.Reach` decides: a reset waits here, holding no API slot, while its origin
is in doubt and another request scouts it. Each origin's resets wait in line, first come first served; the first in
line waits for the next scout's time, the others for their turn to be first (a hundred waiters each woken for every
scout would be most of what the process does while the links come back)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import anyio

from bridge.core.reach import SCOUT_EVERY, Origin, Reach


class _Place:
    """A reset's place in its origin's line: set when it should look again."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()


class ReachGate:
    """The process's origins in doubt (shared by every source), and the resets waiting for them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, scout_every: float = SCOUT_EVERY) -> None:
        self.reach = Reach(scout_every)
        self.clock = clock
        self._lines: dict[Origin, deque[_Place]] = {}  # per origin with resets waiting, in arrival order
        self.waiting = 0  # resets waiting now

    def origin(self, name: str) -> Origin:
        """See :meth:`Reach.origin`."""
        return self.reach.origin(name)

    def answered(self, origin: Origin) -> None:
        """``origin`` answered a request: the first of its waiting resets goes (and lets the next go, and so on)."""
        if self.reach.answered(origin, self.clock()):
            line = self._lines.get(origin)
            if line:
                line[0].event.set()

    async def turn(self, origin: Origin) -> None:
        """Return once a reset may go to ``origin``: at once when it is not in doubt (and nobody waits for it); else
        when it answers, or as its next scout (its outcome told with :meth:`answered` or ``origin.doubt()``)."""
        line = self._lines.get(origin)
        if not line and not origin.doubted:
            return
        if line is None:
            line = self._lines[origin] = deque()
        place = _Place()
        line.append(place)
        self.waiting += 1
        try:
            while True:
                now = self.clock()
                if line[0] is place:
                    if self.reach.admit(origin, now):
                        return
                    wait = self.reach.next_scout(origin) - now  # the first in line waits for the next scout's time
                else:
                    wait = float("inf")  # the others, to be first
                place.event = anyio.Event()
                with anyio.move_on_after(max(0.0, wait)):
                    await place.event.wait()
        finally:
            self.waiting -= 1
            first = line[0] is place
            line.remove(place)
            if not line:
                del self._lines[origin]
            elif first:
                line[0].event.set()  # the next in line looks at once (it may go too, or take up the scout's wait)
