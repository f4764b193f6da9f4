"""One clock for every source of a process.

Each source's engine is fed the time every ``TICK`` seconds (timeouts, retries, silence, due resets, probes, stalls).
A task of its own per source costs a timer and a task wake-up per tick, about 25 us each: at 1,600 sources 45% of a
core with nothing to replicate. :class:`Ticker` is one task that calls the registered sources in turn.

Most sources of a large process are quiet (nothing in flight: their timers count in seconds), so the ticker calls
a callback that says it is quiet only every ``quiet_every`` ticks (once a second), from a wheel of that many slots,
and walks only the busy ones and one slot per tick: a thousand quiet sources cost a thousand calls a second, not
ten thousand. :meth:`Ticker.wake` brings a quiet callback back to every tick at once (its source got work), and
:meth:`Ticker.rest` returns it to its slot if its work is done before a tick came. A quiet callback may say for how
long it has nothing due (its engine's ``tick_deadline``): its slot then passes it by until then, a look at a number
instead of a call (a quiet source's deadline is its silence timeout, five heartbeats away).

Under overload the ticker takes at most ``share`` of the event loop's time: after a pass that took ``spent``
seconds, the next starts no sooner than ``spent * (1 / share - 1)`` later. A starved process (a busy machine, the
servers beside it taking the CPUs) has its publish acks come late, so its sources stay busy, so every pass walks
more of them and takes longer: unbounded, the passes would crowd out the reads that make the sources quiet again
(heartbeats unread look like silence, the server drops a connection it cannot write to, every source resets: a
collapse). Bounded, timers get coarser while the process is behind (a timeout noticed a few tenths of a second
late) and the reads keep up.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from bridge.logs import get_logger

__all__ = ["TickCallback", "Ticker"]

# called with nothing; returns something true when its source is quiet after the tick (a tick a second is enough until
# woken): True, or the seconds it has nothing due for (it is called again no sooner, unless woken)
TickCallback = Callable[[], float | bool | None]
_CALLING = -2  # the slot of a callback taken for this tick and not placed again yet


class Ticker:
    """Calls each registered callback every ``interval`` seconds, or every ``quiet_every`` intervals while it says
    it is quiet, from one task (:meth:`run`, owned by the app)."""

    def __init__(
        self,
        interval: float,
        quiet_every: int = 10,
        *,
        share: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.quiet_every = max(1, quiet_every)
        self.share = min(1.0, max(0.01, share))
        self.pause = interval  # before the next pass: the interval, or longer after a long pass
        self._clock = clock
        self._busy: dict[TickCallback, None] = {}  # called on the next tick (insertion-ordered set)
        self._wheel: list[dict[TickCallback, None]] = [{} for _ in range(self.quiet_every)]
        self._slot: dict[TickCallback, int] = {}  # every registered callback: -1 busy, its wheel slot, or _CALLING
        # the wheel slot of each callback woken since the last tick (rest puts it back there)
        self._home: dict[TickCallback, int] = {}
        # the clock's time before which a quiet callback's slot passes it by (it said it has nothing due); kept across
        # a wake and a rest with no tick between (the work of that spell brings nothing due sooner: the callback's
        # promise, see SourceEngine.tick_deadline)
        self._later: dict[TickCallback, float] = {}
        self._rotation = interval * self.quiet_every  # how often a quiet callback's slot comes round
        self._ticks = 0
        self._log = get_logger(component="ticker")

    def add(self, callback: TickCallback) -> None:
        """Call ``callback`` from the next tick on (it must not block: it runs in the ticker's task)."""
        self._remove(callback)
        self._busy[callback] = None
        self._slot[callback] = -1

    def discard(self, callback: TickCallback) -> None:
        """Stop calling ``callback`` (nothing if it was not registered)."""
        self._remove(callback)

    def wake(self, callback: TickCallback) -> None:
        """``callback``'s source has work: call it on every tick again (nothing if busy already or not registered)."""
        slot = self._slot.get(callback, -1)
        if slot >= 0:
            del self._wheel[slot][callback]
            self._busy[callback] = None
            self._slot[callback] = -1
            self._home[callback] = slot

    def rest(self, callback: TickCallback) -> None:
        """``callback``'s source is quiet again and no tick has called it since :meth:`wake`: back to its slot of the
        wheel, as if never woken (nothing if it was not woken, or a tick came between). At 1 msg/s per source every
        delivery wakes its source and its ack makes it quiet again a few milliseconds later: without this, each
        message cost a tick that found nothing to do."""
        home = self._home.pop(callback, None)
        if home is None or self._slot.get(callback) != -1:
            return
        del self._busy[callback]
        self._wheel[home][callback] = None
        self._slot[callback] = home

    def __len__(self) -> int:
        return len(self._slot)

    def _remove(self, callback: TickCallback) -> None:
        self._home.pop(callback, None)
        self._later.pop(callback, None)
        slot = self._slot.pop(callback, None)
        if slot is None:
            return
        if slot == -1:
            self._busy.pop(callback, None)
        elif slot >= 0:
            self._wheel[slot].pop(callback, None)

    async def run(self) -> None:
        """Tick until cancelled. A callback that raises is reported and dropped; the others keep their clock."""
        while True:
            await anyio.sleep(self.pause)
            started = self._clock()
            self.tick()
            self.pause = self.pause_after(self._clock() - started)

    def pause_after(self, spent: float) -> float:
        """The pause after a pass that took ``spent`` seconds: the interval, or long enough that passes take at
        most ``share`` of the loop's time."""
        return max(self.interval, spent * (1.0 / self.share - 1.0))

    def tick(self) -> None:
        """One tick: every busy callback and the quiet ones whose slot has come round (:meth:`run` calls it)."""
        self._ticks += 1
        index = self._ticks % self.quiet_every
        slot = self._wheel[index]
        later = self._later
        now = self._clock()
        due = [*self._busy]
        if later:
            resting: dict[TickCallback, None] = {}
            for callback in slot:
                if later.get(callback, now) > now:
                    resting[callback] = None  # nothing due yet: stays in its slot, not called
                else:
                    due.append(callback)
            self._wheel[index] = slot = resting
        else:
            due += slot
            slot.clear()
        self._busy = {}
        self._home.clear()  # every woken callback is called now, and placed again by what it says
        for callback in due:
            self._slot[callback] = _CALLING
        for callback in due:
            if callback not in self._slot:
                continue  # discarded by an earlier callback of this tick
            try:
                quiet = callback()
            except Exception as exc:
                self._remove(callback)
                self._log.error("tick.failed", error=f"{type(exc).__name__}: {exc}", callback=repr(callback))
                continue
            if self._slot.get(callback) != _CALLING:
                continue  # it discarded or re-added itself meanwhile: placed already, or gone
            if quiet:
                slot[callback] = None  # this slot comes round again in quiet_every ticks
                self._slot[callback] = index
                if quiet is not True and quiet > self._rotation:  # True: once a rotation
                    later[callback] = now + quiet
                elif later:
                    later.pop(callback, None)
            else:
                self._busy[callback] = None
                self._slot[callback] = -1
