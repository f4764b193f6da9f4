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
doubt and lets them go. An origin never doubted costs nothing. Each origin is one :class:`Origin`, shared by every
source of it (its engine reads it), found by whatever names an origin's API for the runtime (its servers and
JetStream domain). Pure bookkeeping.

A source whose consumer goes silent while its origin is in doubt does not ask for a reset: its silence is *excused*
(:meth:`Origin.excuses`) while another source's reset scouts the origin, and counts again from the origin's answer.
Most consumers go on where they stood once their leaf is back: the deliveries and heartbeats that follow name the next
delivery sequence, and one that does not shows a discontinuity, which is repaired as any other. A reset for every
silent source after a regional cut was a consumer create and a RESET for each, sent to leaves just restarted, and the
leaves' pace at those set when the last source came back (bench edge, 2,000 sources: 1,678 resets in the storm before,
38-315 with silence excused; bench/RESULTS.md). While the doubt lasts, one more source of the origin asks for its
reset every ``silence_timeout`` (an excuse needs a silence reset of the origin that recent), so a scout stays in line
even if the source that asked first stops. A silence that began no earlier than the origin's last answer doubts
nothing: the origin is reachable, and its sources' resets go side by side.

Tried and not kept: each origin also held to its share of the API slots (the slots over the origins with resets in
flight), so that a leaf just back, slow to answer, could not take every slot: no difference the bench could show
(three runs of the 2,000-source storm each way: slowest source 13.8-16.3 s after the links with it, 10.3-16.9 s
without; bench/RESULTS.md), so the simpler rule stays.
"""

from __future__ import annotations

import math

__all__ = ["SCOUT_EVERY", "Origin", "Reach"]

SCOUT_EVERY = 1.0  # seconds between scouts to one doubted origin (a new one while the last may still be out)


class Origin:
    """One origin's standing with the process, shared by every source of it: in doubt or not, when its last scout
    went out, when it last answered a doubt, and when one of its sources last asked for a reset for silence."""

    __slots__ = ("answered_at", "doubted", "last_scout", "silence_asked_at")

    def __init__(self) -> None:
        self.doubted = False
        self.last_scout = -math.inf  # when the doubt's last scout was admitted (-inf: none yet)
        self.answered_at = -math.inf  # when a doubt was last cleared by an answer
        self.silence_asked_at = -math.inf  # when a source of it last asked for a reset for silence

    def doubt(self) -> None:
        """A request to this origin got no answer, or a source of it went silent: from now on, scouts only, until
        an answer comes (a doubt already held keeps its last scout's time)."""
        if not self.doubted:
            self.doubted = True
            self.last_scout = -math.inf

    def silent_since(self, last_activity: float) -> float:
        """When the silence of a source whose consumer was last heard from at ``last_activity`` counts from: that,
        or this origin's last answer to a doubt if later (a source excused meanwhile starts counting again)."""
        return max(last_activity, self.answered_at)

    def excuses(self, now: float, silence_timeout: float) -> bool:
        """Whether a source of this origin, silent past ``silence_timeout`` at ``now``, waits instead of asking
        for a reset: the origin is in doubt and another source's silence reset, asked less than ``silence_timeout``
        ago, is scouting it."""
        return self.doubted and now - self.silence_asked_at < silence_timeout

    def silence_reset(self, since: float, now: float) -> None:
        """A source of this origin asks for a reset at ``now`` for a silence that began at ``since``: the origin is
        doubted, unless it answered since the silence began (then the silence is the consumer's own)."""
        self.silence_asked_at = now
        if self.answered_at < since:
            self.doubt()


class Reach:
    """Every origin of a process, each an :class:`Origin` found by its name."""

    def __init__(self, scout_every: float = SCOUT_EVERY) -> None:
        self.scout_every = scout_every
        self._origins: dict[str, Origin] = {}

    def origin(self, name: str) -> Origin:
        """The origin called ``name`` (servers and JetStream domain), made on first use and shared after."""
        origin = self._origins.get(name)
        if origin is None:
            origin = self._origins[name] = Origin()
        return origin

    @property
    def doubted(self) -> int:
        """Origins in doubt now."""
        return sum(1 for origin in self._origins.values() if origin.doubted)

    def admit(self, origin: Origin, now: float) -> bool:
        """Whether a request to ``origin`` may go at ``now``: always when it is not doubted; else as a scout, the
        first one or ``scout_every`` after the last (admitting it starts that wait)."""
        if not origin.doubted:
            return True
        if now - origin.last_scout < self.scout_every:
            return False
        origin.last_scout = now
        return True

    def next_scout(self, origin: Origin) -> float:
        """When the next scout to ``origin`` may go (-inf: now; inf: it is not doubted, no scout is awaited)."""
        return origin.last_scout + self.scout_every if origin.doubted else math.inf

    def answered(self, origin: Origin, now: float) -> bool:
        """``origin`` answered a request at ``now``: the doubt is cleared. True when there was one (its waiters may
        go, and its excused sources count their silence from ``now``)."""
        if not origin.doubted:
            return False
        origin.doubted = False
        origin.answered_at = now
        return True
