"""The process's publishes in flight to the aggregate, across every source (``engine.publishes_in_flight``).

Each source keeps at most its publish window un-acked, which is what one busy source needs; but after a reconnect
storm a thousand sources each have a backlog at once, and their windows together put tens of thousands of publishes
on the hub in a second (2,000 sources, bench edge: about 30,000). The hub, on the same machine as twenty restarting
leaves, stored them slower than the 5 s ack timeout: over a thousand sources blocked on "no publish ack within
5s", each then re-sending and reading the aggregate back to verify, which loaded the hub more; verifications queued
for over a minute. With this budget the publishes beyond it wait in the process, unsent and without a deadline, and
go out as acks free room: the hub holds a bounded queue, each ack comes within its timeout, and the process slows
down instead of timing out.

A pipeline counts what it has in flight here (``take``/``give``) and, when it stops for want of room, asks to be
woken (``wait``); the runtime takes the waiting sources (``next_waiting``) whenever room is freed and feeds each its
engine's ``publishes_freed``. While anyone waits, only the source whose turn it is may send (``admits``): a busy
source's own acks would otherwise free room that its own next publishes take at once, and a few busy sources could
keep the others waiting for as long as they stay busy. Pure bookkeeping, shared by the engines of one process.
"""

from __future__ import annotations

__all__ = ["PublishBudget"]


class PublishBudget:
    """Publishes in flight across the process, at most ``limit`` (a pipeline's probe may pass it by one)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.in_flight = 0
        self._waiting: dict[str, None] = {}  # sources stopped for want of room, first stopped first (ordered set)
        self._turn = ""  # the source woken last (``next_waiting``): the one that may send while others wait

    @property
    def room(self) -> int:
        """Publishes that may go out now."""
        return self.limit - self.in_flight

    @property
    def waiting(self) -> int:
        """Sources waiting for room."""
        return len(self._waiting)

    def admits(self, key: str) -> bool:
        """Whether source ``key`` may send one more now: there is room, and nobody waits for it but, at most, ``key``
        in its turn."""
        return self.in_flight < self.limit and (not self._waiting or key == self._turn)

    def take(self, count: int = 1) -> None:
        """``count`` publishes went out (or a pipeline joined with them in flight)."""
        self.in_flight += count

    def give(self, count: int = 1) -> None:
        """``count`` publishes are no longer in flight (stored, failed, timed out, or their source stopped)."""
        self.in_flight = max(0, self.in_flight - count)

    def wait(self, key: str) -> None:
        """Source ``key`` has publishes it could not send for want of room: wake it when there is some."""
        self._waiting[key] = None

    def next_waiting(self) -> str | None:
        """The source that has waited longest, taken off the list, and its turn to send (None: nobody waits)."""
        if not self._waiting:
            return None
        key = next(iter(self._waiting))
        del self._waiting[key]
        self._turn = key
        return key

    def end_turn(self) -> None:
        """The source woken last has sent what it could: while others wait, it waits its turn again."""
        self._turn = ""

    def forget(self, key: str) -> None:
        """Source ``key`` is gone: not woken any more."""
        self._waiting.pop(key, None)
