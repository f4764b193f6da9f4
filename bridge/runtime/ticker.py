"""One clock for every source of a process.

Each source's engine is fed the time every ``TICK`` seconds (timeouts, retries, silence, due resets, probes, stalls).
A task of its own per source costs a timer and a task wake-up per tick, about 25 us each: at 1,600 sources 45% of a
core with nothing to replicate. :class:`Ticker` is one task that calls the registered sources in turn.

Most sources of a large process are quiet (nothing in flight: their timers count in seconds), so the ticker calls
a callback that says it is quiet only every ``quiet_every`` ticks (once a second), from a wheel of that many slots,
and walks only the busy ones and one slot per tick: a thousand quiet sources cost a thousand calls a second, not
ten thousand. :meth:`Ticker.wake` brings a quiet callback back to every tick (its source got work; after a wait when
nothing can be due sooner, as for publishes awaiting their acks), and
:meth:`Ticker.rest` returns it to its slot if its work is done before a tick came. A quiet callback may say for how
long it has nothing due (its engine's ``tick_deadline``): its slot then passes it by until then, a look at a number
instead of a call (a quiet source's deadline is its silence timeout, five heartbeats away). That bookkeeping is the
compiled core's (``bridge.core.tickwheel``); this module calls the callbacks.

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

from bridge.core.tickwheel import TickWheel
from bridge.logs import get_logger

__all__ = ["TickCallback", "Ticker"]

# called with nothing; returns something true when its source is quiet after the tick (a tick a second is enough until
# woken): True, or the seconds it has nothing due for (it is called again no sooner, unless woken)
TickCallback = Callable[[], float | bool | None]


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
        # who is called on the next tick; a source wakes and rests its callback here itself (``wheel.wake``,
        # ``wheel.rest``: compiled calls, several per message)
        self.wheel: TickWheel[TickCallback] = TickWheel(self.quiet_every, interval * self.quiet_every)
        self._log = get_logger(component="ticker")

    def add(self, callback: TickCallback) -> None:
        """Call ``callback`` from the next tick on (it must not block: it runs in the ticker's task)."""
        self.wheel.add(callback)

    def discard(self, callback: TickCallback) -> None:
        """Stop calling ``callback`` (nothing if it was not registered)."""
        self.wheel.discard(callback)

    def wake(self, callback: TickCallback, wait: float = 0.0) -> None:
        """``callback``'s source has work: call it on every tick again, after ``wait`` seconds when nothing is due
        sooner (``TickWheel.wake``)."""
        self.wheel.wake(callback, wait)

    def rest(self, callback: TickCallback) -> None:
        """``callback``'s source is quiet again and no tick has called it since :meth:`wake`: back to its slot of the
        wheel, as if never woken (``TickWheel.rest``)."""
        self.wheel.rest(callback)

    def __len__(self) -> int:
        return len(self.wheel)

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
        wheel = self.wheel
        for callback in wheel.begin(self._clock()):
            if not wheel.calling(callback):
                continue  # discarded by an earlier callback of this tick
            try:
                quiet = callback()
            except Exception as exc:
                wheel.discard(callback)
                self._log.error("tick.failed", error=f"{type(exc).__name__}: {exc}", callback=repr(callback))
                continue
            wheel.place(callback, quiet)  # nothing if it discarded or re-added itself meanwhile
