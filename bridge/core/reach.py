"""Which origins a reset's requests may go to now: one scout at a time to an origin that may be out of reach.

After a regional cut every edge comes back within seconds of the others, but a leaf's link to the hub is usable for
requests some seconds after it is made (both ends must have taken the other's interest: the API subjects one way,
the bridge's reply subjects the other), and the links come back over the whole of that time (bench edge, 20 leaves
restarted together: the last usable 13 s after the first). The silent sources all asked for their resets at once:
the first 128 (every API slot) went to leaves not reachable yet, waited out the 5 s request timeout, and the next
128 did the same, while the sources of leaves already back queued behind them (2,000 sources: 215 binds timed out
so, in waves 5 s apart, before the last link was back).

So an origin is *doubted* once one of its sources went silent, or a request to it got no answer (a timeout, no
responders): then one request goes to it at a time, a scout, and another only ``scout_every`` after the last
(a scout may be lost in the link's first moments and wait out its timeout); the other sources of that origin wait,
holding no API slot. The first answer from the origin (any reply, an error included: the server answered) clears the
doubt and lets them go. An origin never doubted costs nothing. Keyed by whatever names an origin's API for the
runtime (its servers and JetStream domain). Pure bookkeeping, shared by every source of a process.

Tried and not kept: each origin also held to its share of the API slots (the slots over the origins with resets in
flight), so that a leaf just back, slow to answer, could not take every slot: no difference the bench could show
(three runs of the 2,000-source storm each way: slowest source 13.8-16.3 s after the links with it, 10.3-16.9 s
without; bench/RESULTS.md), so the simpler rule stays.
"""

from __future__ import annotations

import math

from bridge.core.effects import ResetCause

__all__ = ["SCOUT_EVERY", "Reach"]

SCOUT_EVERY = 1.0  # seconds between scouts to one doubted origin (a new one while the last may still be out)


class Reach:
    """The origins in doubt, each with when its last scout went out."""

    def __init__(self, scout_every: float = SCOUT_EVERY) -> None:
        self.scout_every = scout_every
        self._doubted: dict[str, float] = {}  # origin -> when its last scout was admitted (-inf: none yet)

    @property
    def doubted(self) -> int:
        """Origins in doubt now."""
        return len(self._doubted)

    def is_doubted(self, origin: str) -> bool:
        """Whether requests to ``origin`` go one scout at a time."""
        return origin in self._doubted

    def reset_requested(self, origin: str, cause: ResetCause) -> None:
        """A source of ``origin`` asks for a reset: one asked because its consumer went silent puts the origin in
        doubt (a leaf restarting, its link to the hub coming back, and every source of it silent together)."""
        if cause is ResetCause.SILENCE:
            self.doubt(origin)

    def doubt(self, origin: str) -> None:
        """A source of ``origin`` went silent, or a request to it got no answer: from now on, scouts only, until an
        answer comes (a doubt already held keeps its last scout's time)."""
        self._doubted.setdefault(origin, -math.inf)

    def admit(self, origin: str, now: float) -> bool:
        """Whether a request to ``origin`` may go at ``now``: always when it is not doubted; else as a scout, the
        first one or ``scout_every`` after the last (admitting it starts that wait)."""
        last = self._doubted.get(origin)
        if last is None:
            return True
        if now - last < self.scout_every:
            return False
        self._doubted[origin] = now
        return True

    def next_scout(self, origin: str) -> float:
        """When the next scout to ``origin`` may go (-inf: now; inf: it is not doubted, no scout is awaited)."""
        last = self._doubted.get(origin)
        return math.inf if last is None else last + self.scout_every

    def answered(self, origin: str) -> bool:
        """``origin`` answered a request: the doubt is cleared. True when there was one (its waiters may go)."""
        return self._doubted.pop(origin, None) is not None
