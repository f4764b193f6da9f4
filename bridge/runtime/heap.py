"""Long-lived objects kept out of the cyclic collector's way: what survives a full collection is frozen.

Why: a process replicating a thousand sources holds a few hundred thousand long-lived objects (each source's
engine, connection state, subscriptions, metrics), and every full (generation 2) collection walked all of them:
about 0.13 s of CPU at 1,000 sources and twice that at 2,000, every twenty seconds or so while messages flow
(measured with ``gc.callbacks`` in ``bench edge``: 2.06 s of CPU in a 2,000-source run of about 75 s, 0.47 s with
this keeper). After a full collection, whatever survived is moved out of the collector's generations
(``gc.freeze``): the next full collections only walk what was allocated since.

What that costs, and how it is bounded: a frozen object that later becomes garbage *inside a reference cycle* is
not collected (acyclic garbage is freed by reference counting as always). The cycles that matter are a stopped
source's (its runner, engine and connection refer to each other) and whatever a long run replaces now and then, so
the heap is thawed (``gc.unfreeze``: everything goes back to the oldest generation, and the next full collection
looks at all of it) when a source stops, and every ``THAW_EVERY`` seconds in any case. Freezing again waits for
the full collection that follows. Nothing here ever triggers a collection itself.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio

THAW_EVERY = 600.0  # seconds: at most this long between two full collections that look at every object
# Allocations between two young collections while the keeper runs (CPython's default: 700). Each replicated message
# allocates about a hundred container objects (frames, deliveries, effects, entries) that live until its publish is
# acked, a few milliseconds; collected every 700 allocations, those in flight were walked, survived and were promoted
# (walked again in generation 1) several times each: a young collection every few messages, 6-7 % of the event loop's
# time at 1,000 sources x 1 msg/s (py-spy). Every 10,000, most of them are gone by the time one runs. What it costs:
# cyclic garbage waits up to that many allocations longer (acyclic garbage is freed by reference counting as ever).
YOUNG_THRESHOLD = 10_000


class HeapKeeper:
    """Freezes the survivors of every full collection; :meth:`thaw` hands them back to the collector; collects the
    young generation every ``young`` allocations rather than 700 while it runs.

    One per process while :meth:`run` runs (the bridge's task group owns it); the freeze happens on the loop that
    runs it, whatever thread the collection ran on (the fleet's thread allocates too).
    """

    def __init__(self, thaw_every: float = THAW_EVERY, young: int = YOUNG_THRESHOLD) -> None:
        self.thaw_every = thaw_every
        self.young = young  # the young generation's threshold while it runs (never lowered)
        self.freezes = 0  # how many times survivors were frozen (what its tests watch)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = False  # a freeze is on its way to the loop

    async def run(self) -> None:
        """Freeze after full collections until cancelled; then thaw, leaving the process's collector as it was."""
        self._loop = asyncio.get_running_loop()
        thresholds = gc.get_threshold()
        gc.set_threshold(max(self.young, thresholds[0]), *thresholds[1:])
        gc.callbacks.append(self._collected)
        try:
            while True:
                await anyio.sleep(self.thaw_every)
                self.thaw()
        finally:
            gc.callbacks.remove(self._collected)
            gc.set_threshold(*thresholds)
            self._loop = None
            gc.unfreeze()

    def thaw(self) -> None:
        """Let the next full collection look at every object again (something long-lived may have become a garbage
        cycle: a stopped source's objects); it freezes the survivors once more."""
        gc.unfreeze()

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        # called by the interpreter on whichever thread collected, possibly mid-allocation: only hand over
        if phase != "stop" or info.get("generation") != 2 or self._pending:
            return
        loop = self._loop
        if loop is None:
            return
        self._pending = True
        try:
            loop.call_soon_threadsafe(self._freeze)
        except RuntimeError:  # the loop is closing
            self._pending = False

    def _freeze(self) -> None:
        self._pending = False
        if self._loop is not None:
            gc.freeze()
            self.freezes += 1
