"""The process's publishes in flight to the aggregate, across every source (``engine.publishes_in_flight``), and
how many the hub takes at once (the limit, following its ack times).

Each source keeps at most its publish window un-acked, which is what one busy source needs; but after a reconnect
storm a thousand sources each have a backlog at once, and their windows together put tens of thousands of publishes
on the hub in a second (2,000 sources, bench edge: about 30,000). The hub, on the same machine as twenty restarting
leaves, stored them slower than the 5 s ack timeout: over a thousand sources blocked on "no publish ack within
5s", each then re-sending and reading the aggregate back to verify, which loaded the hub more; verifications queued
for over a minute. With this budget the publishes beyond it wait in the process, unsent and without a deadline, and
go out as acks free room: the hub holds a bounded queue, and the process slows down instead of timing out.

A fixed bound is not enough: what the hub stores in a second varies a hundredfold (an idle hub, a hub beside twenty
leaves recovering their streams, its disk saturated), and 4,096 publishes queued at a hub storing 600 a second wait
seven seconds each. So the limit follows the acks (``answered``), by the time they spent queued at the hub: an ack's
time less the quickest of the last minute or two (the round trip; a far hub's is not a queue). A queue longer than
``target`` (a quarter of the ack timeout) halves the limit, once for every publish sent after the previous cut (the
ones sent before were queued under the old limit and say nothing new); every second ack queued within a quarter of
``target``, while at least half the limit is in use, grows it by one: half again in a round trip while the hub keeps
up. Between the two it holds. Growth overshoots by what one round trip adds before its acks tell (doubling per round
trip, 0.5 s away, the queue reached 1.75 s, and a hub three times slower then took 6 s to ack: the property test
found it); so the queue at the hub stays near a quarter of ``target``, at most about ``target``, a hub that suddenly
stores three times slower still acks within the timeout, and one that keeps up is never kept waiting for work.

Fast batches are counted the same way (``batch_room``, ``batch_opened``, ``batch_ended``): the server keeps at most
1,000 open per stream, and a storm's backlogs would open one per source; beyond ``BATCHES`` a source publishes plain.

A pipeline counts what it has in flight here (``take``/``give``/``answered``) and, when it stops for want of room,
asks to be woken (``wait``); the runtime takes the waiting sources (``next_waiting``) whenever room is freed and
feeds each its engine's ``publishes_freed``. While anyone waits, only the source whose turn it is may send
(``admits``): a busy source's own acks would otherwise free room that its own next publishes take at once, and a few
busy sources could keep the others waiting for as long as they stay busy. Pure bookkeeping, shared by the engines
of one process; time is passed in.
"""

from __future__ import annotations

__all__ = ["BATCHES", "FLOOR", "START", "PublishBudget"]

FLOOR = 32  # the limit is never cut below this (or the ceiling): a hub this slow times publishes out regardless
START = 512  # the limit before any ack has been timed: a first burst (a storm's, a start-up's) is not the ceiling
BASE_SPAN = 60.0  # seconds: the round trip is the quickest ack of this span and the one before
# Fast batches open at once across the process. nats-server holds at most 1,000 in flight per stream (and 50,000 per
# server; jetstream limits max_batch_inflight_per_stream/_total): after a storm 2,000 sources with backlogs each
# opened one, and hundreds were refused (429, "batch publish too many inflight") and blocked. Beyond this the sources
# publish plain; 200 leaves the stream's room to four more processes (a twin, a fleet) doing the same.
BATCHES = 200


class PublishBudget:
    """Publishes in flight across the process, at most ``limit`` (a pipeline's probe may pass it by one), the limit
    following the acks' times between ``FLOOR`` and ``ceiling``."""

    def __init__(self, ceiling: int, target: float = float("inf"), batch_limit: int = BATCHES) -> None:
        self.ceiling = max(1, ceiling)
        self.floor = min(FLOOR, self.ceiling)
        self.limit = min(START, self.ceiling) if target != float("inf") else self.ceiling
        self.target = target  # the time at the hub the limit keeps the acks to (inf: a fixed limit, the ceiling)
        self.cuts = 0  # times the limit was halved for a late ack (metric)
        self.in_flight = 0
        self.batch_limit = batch_limit
        self.batches = 0  # fast batches open (``open_batch``), every source's together
        self._quick = 0  # quick acks counted towards the next growth of the limit
        self._cut_at = float("-inf")  # when the limit was last halved: acks of publishes sent before cut nothing more
        # the quickest ack of this span and of the one before (the round trip, never taken above ``target``)
        self._quickest = self._quickest_before = float("inf")
        self._span_ends = float("-inf")
        self._waiting: dict[str, None] = {}  # sources stopped for want of room, first stopped first (ordered set)
        self._turn = ""  # the source woken last (``next_waiting``): the one that may send while others wait

    @property
    def room(self) -> int:
        """Publishes that may go out now (negative just after a cut, until the acks bring the count under it)."""
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
        """``count`` publishes are no longer in flight with nothing learnt of the hub's pace (the connection was
        lost, their source stopped)."""
        self.in_flight = max(0, self.in_flight - count)

    def answered(self, sent: float, now: float) -> None:
        """A publish sent at ``sent`` was answered at ``now`` (stored, refused, or not acked within the timeout,
        which answers as late as it gets): no longer in flight, and its time moves the limit."""
        self.in_flight = max(0, self.in_flight - 1)
        if self.target == float("inf"):
            return  # a fixed limit
        took = now - sent
        if now >= self._span_ends:
            self._quickest_before, self._quickest = self._quickest, took
            self._span_ends = now + BASE_SPAN
        elif took < self._quickest:
            self._quickest = took
        # time at the hub: what this ack took beyond the round trip (at most ``target`` of it: a far hub's)
        took -= min(self._quickest, self._quickest_before, self.target)
        if took > self.target:
            if sent >= self._cut_at and self.limit > self.floor:
                self.limit = max(self.floor, self.limit // 2)
                self._cut_at = now
                self.cuts += 1
        elif took * 4 <= self.target and self.limit < self.ceiling and self.in_flight * 2 >= self.limit:
            self._quick += 1
            if self._quick >= 2:
                self._quick = 0
                self.limit += 1

    @property
    def batch_room(self) -> bool:
        """Whether a pipeline may open a fast batch now (if not, it publishes plain)."""
        return self.batches < self.batch_limit

    def batch_opened(self) -> None:
        """A pipeline opened a fast batch: open until ``batch_ended``."""
        self.batches += 1

    def batch_ended(self, count: int = 1) -> None:
        """``count`` fast batches are over: settled, or their source stopped."""
        self.batches = max(0, self.batches - count)

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
