"""A histogram observed from the event loop only (``bridge.observe.metrics`` exports it at scrape time).

prometheus-client's ``Histogram.observe`` takes a lock and walks the buckets: about 1.5 us, paid for every
replicated message. Every observation and every scrape runs on the one event loop thread, so plain counters are
enough. Compiled: each message's ack and flow-control answer observe one each, and interpreted, with the list of
latencies built for them, that was about a twentieth of a message's instructions at 1 msg/s per source.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["LoopHistogram"]


class LoopHistogram:
    """Observations per bucket (``bounds``: each bucket's upper bound, inclusive, ascending) and their sum."""

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds  # shared by every source's histogram of one metric
        self._counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self._sum = 0.0

    def _bucket(self, value: float) -> int:
        """The first bucket whose bound is at least ``value`` (``bisect_left``; a few bounds, walked in order)."""
        index = 0
        for bound in self._bounds:
            if value <= bound:
                return index
            index += 1
        return index

    def observe(self, value: float) -> None:
        self._counts[self._bucket(value)] += 1
        self._sum += value

    def observe_many(self, values: Iterable[float]) -> None:
        """:meth:`observe` each of ``values``."""
        for value in values:
            self.observe(value)

    def observe_age(self, origin_ns: int, now_ns: int) -> None:
        """Observe the age at ``now_ns`` (wall clock, ns) of an origin time (ns), in seconds (0 for one from the
        future: the clocks of two machines)."""
        self.observe(max(0.0, (now_ns - origin_ns) / 1e9))

    @property
    def counts(self) -> list[int]:
        """Observations per bucket (not cumulative), the last above every bound (+Inf)."""
        return self._counts

    @property
    def sum(self) -> float:
        return self._sum
