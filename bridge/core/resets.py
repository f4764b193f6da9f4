"""When the next ``CONSUMER.RESET`` goes out: throttling, backoff after failures, and where it restarts.

A reset is costly (the consumer re-walks from its ack floor) and a failing one usually means the origin is
unreachable or the consumer leaderless, so resets are at least ``min_interval`` apart and back off after each
failure; anything arriving from the consumer while one backs off shows it is back, and the reset is retried at
the next allowed moment instead of waiting out the backoff.
"""

from __future__ import annotations

import math
from collections import Counter

from bridge.core.backoff import Backoff
from bridge.core.effects import RequestReset, ResetCause


class ResetScheduler:
    """The pending reset's cause, due time and target; the history that throttles the next one."""

    def __init__(self, min_interval: float, backoff: Backoff) -> None:
        self.min_interval = min_interval
        self.backoff = backoff
        self.cause = ResetCause.START
        self.due = 0.0
        self.seq: int | None = None  # where the pending reset restarts deliveries (None: the ack floor)
        self.attempts = 0
        self.failures = 0  # consecutive failed attempts
        self.last_at = -math.inf
        self.counts: Counter[str] = Counter()  # resets sent, by cause (a metric)

    def schedule(self, cause: ResetCause, now: float) -> None:
        """A reset is needed for ``cause``: due now, or once ``min_interval`` has passed since the last one."""
        self.cause = cause
        self.due = max(now, self.last_at + self.min_interval)

    def is_due(self, now: float) -> bool:
        return now >= self.due

    def send(self, now: float) -> RequestReset:
        """The reset goes out now."""
        self.attempts += 1
        self.last_at = now
        self.counts[self.cause.value] += 1
        return RequestReset(self.cause, self.attempts, self.seq)

    def failed(self, now: float) -> float:
        """The reset failed: it is due again after the returned backoff."""
        self.failures += 1
        delay = max(self.min_interval, self.backoff.delay(self.failures))
        self.due = now + delay
        return delay

    def succeeded(self) -> None:
        self.seq = None
        self.failures = 0

    def unneeded(self) -> None:
        """The reset just sent was not needed after all (the consumer was at rest): it is not counted as sent."""
        key = self.cause.value
        self.counts[key] -= 1
        if self.counts[key] <= 0:
            del self.counts[key]
        self.succeeded()

    def consumer_alive(self) -> bool:
        """Something arrived from the consumer: bring a backed-off retry forward. True if it was backing off."""
        if not self.failures:
            return False
        self.due = min(self.due, self.last_at + self.min_interval)
        return True
