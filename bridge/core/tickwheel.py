"""Which sources the process's one ticker calls on each tick (``bridge.runtime.ticker``, which calls them).

Most sources of a large process are quiet (nothing in flight: their timers count in seconds), so a quiet callback is
called only every ``quiet_every`` ticks (once a second), from a wheel of that many slots: each tick walks the busy
callbacks and one slot, and a thousand quiet sources cost a thousand calls a second, not ten thousand. ``wake``
brings a quiet callback back to every tick at once (its source got work), and ``rest`` returns it to its slot if its
work is done before a tick came. A quiet callback may say for how long it has nothing due (its engine's
``tick_deadline``): its slot then passes it by until then, a look at a number instead of a call. A callback may be
woken with a wait too (its source has work, but nothing a tick could do before then: publishes awaiting their acks):
the ticks pass it by until then, and if its work is done first (the acks came) ``rest`` returns it to its slot
uncalled. At 1 msg/s per source, a third of the deliveries were caught in flight by a tick that found nothing to do.

Compiled, because a source wakes and rests on every delivery and ack (five looks per message at 1 msg/s) and the
ticker places every callback it calls: in the interpreter that bookkeeping was a twentieth of a message's CPU.
The callbacks are opaque keys here: the wheel never calls them.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["TickWheel"]

K = TypeVar("K", bound=Hashable)

BUSY = -1  # the slot of a callback called on every tick
CALLING = -2  # the slot of a callback taken for this tick and not placed again yet


class TickWheel(Generic[K]):
    """The busy callbacks, the wheel of quiet ones, and when each quiet one has something due."""

    def __init__(self, quiet_every: int, rotation: float) -> None:
        self.quiet_every = max(1, quiet_every)
        self.rotation = rotation  # seconds before a quiet callback's slot comes round again
        self.ticks = 0
        self._busy: dict[K, None] = {}  # called on the next tick (insertion-ordered set)
        self._wheel: list[dict[K, None]] = [{} for _ in range(self.quiet_every)]
        self._slot: dict[K, int] = {}  # every registered callback: BUSY, its wheel slot, or CALLING
        # the wheel slot of each callback woken since the last tick (rest puts it back there)
        self._home: dict[K, int] = {}
        # the clock's time before which a quiet callback's slot passes it by (it said it has nothing due); kept across
        # a wake and a rest with no tick between (the work of that spell brings nothing due sooner: the callback's
        # promise, see SourceEngine.tick_deadline)
        self._later: dict[K, float] = {}
        # the clock's time before which a busy callback is not called (woken with a wait: nothing due sooner)
        self._not_before: dict[K, float] = {}
        self._index = 0  # the slot of the last tick
        self._now = 0.0  # the clock at the last tick

    def __len__(self) -> int:
        return len(self._slot)

    def add(self, callback: K) -> None:
        """Call ``callback`` from the next tick on."""
        self.discard(callback)
        self._busy[callback] = None
        self._slot[callback] = BUSY

    def discard(self, callback: K) -> None:
        """Stop calling ``callback`` (nothing if it was not registered)."""
        self._home.pop(callback, None)
        self._later.pop(callback, None)
        self._not_before.pop(callback, None)
        slot = self._slot.pop(callback, None)
        if slot is None:
            return
        if slot == BUSY:
            self._busy.pop(callback, None)
        elif slot >= 0:
            self._wheel[slot].pop(callback, None)

    def wake(self, callback: K, wait: float = 0.0) -> None:
        """``callback``'s source has work: call it on every tick again, after ``wait`` seconds when it has nothing due
        sooner (nothing if not registered). A busy callback already waiting waits no longer than this says; one busy
        without a wait (placed so by a tick) stays so."""
        slot = self._slot.get(callback, BUSY)
        if slot >= 0:
            del self._wheel[slot][callback]
            self._busy[callback] = None
            self._slot[callback] = BUSY
            self._home[callback] = slot
            if wait > 0.0:
                # from the last tick's time, not the present's: it may be called up to a tick early, never late
                self._not_before[callback] = self._now + wait
        elif slot == BUSY:
            not_before = self._not_before
            if callback in not_before:
                if wait > 0.0:
                    not_before[callback] = min(not_before[callback], self._now + wait)
                else:
                    del not_before[callback]

    def rest(self, callback: K) -> None:
        """``callback``'s source is quiet again and no tick has called it since :meth:`wake`: back to its slot of the
        wheel, as if never woken (nothing if it was not woken, or a tick came between). At 1 msg/s per source every
        delivery wakes its source and its ack makes it quiet again a few milliseconds later: without this, each
        message cost a tick that found nothing to do."""
        home = self._home.pop(callback, None)
        if home is None or self._slot.get(callback) != BUSY:
            return
        self._not_before.pop(callback, None)
        del self._busy[callback]
        self._wheel[home][callback] = None
        self._slot[callback] = home

    def resting(self) -> int:
        """Quiet callbacks with a deadline (their slot passes them by until then)."""
        return len(self._later)

    def begin(self, now: float) -> list[K]:
        """Start a tick at ``now``: the callbacks to call, in order (every busy one, then the quiet ones of this
        tick's slot with something due); each is taken until :meth:`place` puts it back."""
        self.ticks += 1
        index = self.ticks % self.quiet_every
        self._index = index
        self._now = now
        slot = self._wheel[index]
        later = self._later
        not_before = self._not_before
        waiting: dict[K, None] = {}  # busy callbacks woken with a wait that has not passed: not called, still woken
        due: list[K]
        if not_before:
            due = []
            for callback in self._busy:
                if not_before.get(callback, now) > now:
                    waiting[callback] = None
                else:
                    not_before.pop(callback, None)
                    due.append(callback)
        else:
            due = list(self._busy)
        if later:
            resting: dict[K, None] = {}
            for callback in slot:
                if later.get(callback, now) > now:
                    resting[callback] = None  # nothing due yet: stays in its slot, not called
                else:
                    due.append(callback)
            self._wheel[index] = resting
        else:
            due.extend(slot)
            slot.clear()
        self._busy = waiting
        if waiting:
            home = self._home
            self._home = {callback: home[callback] for callback in waiting if callback in home}
        else:
            self._home.clear()  # every woken callback is called now, and placed again by what it says
        for callback in due:
            self._slot[callback] = CALLING
        return due

    def calling(self, callback: K) -> bool:
        """``callback`` is taken for this tick and not placed yet (False once discarded, or added again)."""
        return self._slot.get(callback, BUSY) == CALLING

    def place(self, callback: K, quiet: float | bool | None) -> None:
        """Put back a callback this tick called, by what it said: quiet (True: once a rotation; seconds: not called
        again before they pass) or busy (0, False or None). Nothing if it discarded or added itself meanwhile."""
        if self._slot.get(callback, BUSY) != CALLING:
            return  # placed already, or gone
        if quiet:
            index = self._index
            self._wheel[index][callback] = None  # this slot comes round again in quiet_every ticks
            self._slot[callback] = index
            if quiet is not True and quiet > self.rotation:
                self._later[callback] = self._now + quiet
            elif self._later:
                self._later.pop(callback, None)
        else:
            self._busy[callback] = None
            self._slot[callback] = BUSY
