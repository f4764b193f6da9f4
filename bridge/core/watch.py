"""Slow-moving judgements about a source the engine reports on its ticks: stalled, and stranded messages.

* ``StallWatch``: a source is *stalled* when something waits to be replicated and the watermark has not moved
  for ``stalled_after`` seconds; an idle source (nothing pending at the origin, nothing in the pipeline) never is.
  Decided here only, so the metric, ``/readyz`` and the log can never disagree.
* ``StrandedProbe``: when to look for WorkQueue messages that an answer of ours acked but the origin still holds
  (``SourceEngine.stranded_probed``). The same first message must be found twice in a row: an answer may still be
  on its way to the server, and on a clustered stream the deletions an ack causes land a little after it.
"""

from __future__ import annotations

import zlib

# Seconds between looks for WorkQueue messages stranded below the ack floor: STRANDED_CHECK (to twice that, spread
# over the sources: stranded_spread) after every new epoch
# (start, any reset: an origin server's restart, which is what strands messages, shows as one) and reconnect,
# doubling after each look that finds nothing, up to STRANDED_CHECK_MAX. A look is a JetStream request through
# the hub: at a flat 10 s, 2,000 sources made 200 a second for nothing.
STRANDED_CHECK = 10.0
STRANDED_CHECK_MAX = 320.0
STRANDED_CONFIRM = 2.0  # seconds before a second look confirms what the first one found


def stranded_spread(source: str) -> float:
    """Where in ``[0, 1)`` of a second ``STRANDED_CHECK`` a source's first look after a new epoch falls, the same
    for a source every time (the core has no randomness of its own). Every source of a process starts together,
    and a storm resets them all within a second: with one delay for all, a thousand looks came due in the same
    second, found every API slot taken and waited in a task each (bench edge at 1,000 sources: the looks were 5 %
    of the main thread's samples, most of it their waits); spread over ten seconds, a look finds a slot."""
    return zlib.crc32(source.encode()) / 2**32


class StallWatch:
    """Progress of the watermark over time."""

    __slots__ = ("_mark", "since", "stalled", "stalled_after")

    def __init__(self, stalled_after: float, now: float) -> None:
        self.stalled_after = stalled_after
        self._mark = -1
        self.since = now  # when the watermark last moved (or the source was last idle)
        self.stalled = False

    def observe(self, now: float, watermark: int, idle: bool) -> bool | None:
        """Record progress; True when the source just became stalled, False when it just recovered."""
        if idle or watermark != self._mark:
            self._mark = watermark
            self.since = now
        stalled = now - self.since >= self.stalled_after
        if stalled == self.stalled:
            return None
        self.stalled = stalled
        return stalled

    def is_stalled(self, now: float) -> bool:
        # between ticks, and for a source that never got as far as ticking (still failing to connect or bind),
        # the time without progress decides
        return self.stalled or now - self.since >= self.stalled_after


class StrandedProbe:
    """Schedules the look for stranded messages and confirms what it finds."""

    __slots__ = ("enabled", "first", "interval", "next_at", "probing", "seen")

    def __init__(self, spread: float = 0.0) -> None:
        self.enabled = False  # only WorkQueue origins delete what is acked, so only they can strand a message
        self.first = STRANDED_CHECK * (1.0 + spread)  # seconds from a new epoch to its first look (stranded_spread)
        self.interval = STRANDED_CHECK
        self.next_at = 0.0
        self.probing = False
        self.seen = 0  # the first stranded sequence the previous look found (0: none)

    def enable(self, now: float) -> None:
        self.enabled = True
        self.interval = STRANDED_CHECK
        self.next_at = now + self.first

    def rearm(self, now: float) -> None:
        """Something may have stranded messages (a new epoch, a reconnect): look again within ``first`` seconds
        (``STRANDED_CHECK`` to twice that)."""
        self.interval = STRANDED_CHECK
        self.next_at = min(self.next_at, now + self.first)

    def due(self, now: float) -> bool:
        return self.enabled and not self.probing and now >= self.next_at

    def start(self, now: float) -> None:
        self.probing = True
        self.next_at = now + self.interval

    def found(self, first: int, acked_through: int, now: float) -> int:
        """The look found ``first`` (0: nothing) as the origin's first message; returns it once confirmed."""
        self.probing = False
        if first and first <= acked_through and first == self.seen:
            self.seen = 0
            return first
        self.seen = first if first <= acked_through else 0
        if self.seen:  # confirm (or not) soon rather than after a whole interval
            self.next_at = min(self.next_at, now + STRANDED_CONFIRM)
            self.interval = STRANDED_CHECK
        else:  # nothing there: the next look can wait longer
            self.interval = min(2 * self.interval, STRANDED_CHECK_MAX)
            self.next_at = max(self.next_at, now + self.interval)
        return 0

    def failed(self) -> None:
        self.probing = False
