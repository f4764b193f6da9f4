"""Exponential backoff as a pure function of the attempt number (no jitter: the core stays deterministic)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before attempt ``n`` (1-based) is ``initial * 2**(n-1)``, capped at ``maximum``."""

    initial: float
    maximum: float

    def delay(self, attempt: int) -> float:
        if attempt <= 1:
            return self.initial
        return min(self.maximum, self.initial * (2.0 ** min(attempt - 1, 30)))
