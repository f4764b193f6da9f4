"""The arithmetic of a flow-control window over a link (docs/protocol.md, section 2.3; bench/RESULTS.md, WAN).

The origin delivers ``max_ack_pending`` messages, then asks (a flow-control request) and delivers nothing more until
the answer, which may name only what is stored. A window therefore costs one round trip plus the time to store its
tail, and a source moves at most ``window / (RTT + store time)`` messages a second. Measured across a WAN, a window
the bridge stores in about one round trip (so ``window / (2 x RTT)``) is where it stops being the bottleneck: the
rule of thumb is ``max_ack_pending`` ~ 2 x rate x RTT. Pull mode's requests in flight follow the same rule (each
asks for at most ``max_ack_pending`` messages, and a full window waits a round trip for the next).

Both modes size the window by one rule (:class:`Window`): while the origin stops for want of window for more than a
quarter of the time, over a link whose round trip is worth it, the window grows. What a stop is differs: flow
control's is a request with the window full and its answer (:class:`WindowSizer`); pull mode's a request's last
delivery with more waiting at the origin (:class:`PullWindow`).
"""

from __future__ import annotations

import math

FAR = 0.010  # seconds of round trip from which a link's window is worth a word (loopback and a LAN are below)


def window_carries(window: int, rtt: float) -> float:
    """Messages a second a window of ``window`` carries at most over a link of ``rtt`` seconds, its tail stored in
    about one more round trip (``window / (2 x rtt)``); infinite for a round trip of 0."""
    return math.inf if rtt <= 0.0 else window / (2.0 * rtt)


def window_for(rate: float, rtt: float) -> int:
    """The ``max_ack_pending`` a source of ``rate`` messages a second wants over a link of ``rtt`` seconds
    (2 x rate x RTT, at least 1)."""
    return max(1, math.ceil(2.0 * rate * rtt))


# A window's round trips below this are a near link's: the window is never what holds a source back there (a loaded
# machine's scheduling shows as a few milliseconds; a WAN as tens).
NEAR = 0.010
SAMPLES = 3  # round trips kept; the least is the link's (a late one is the machine's, not the link's)
SHARE = 0.25  # the window grows while the round trip is more than this share of a window's cycle
STEP = 4  # at most this factor per resize
ROUND = 64  # windows are multiples of this
RETRY_AFTER = 30.0  # seconds before a refused or failed resize is tried again
OVERHEAD = 512  # bytes a held message costs beyond its payload (headers, subject, the bridge's bookkeeping)
# the largest window grown: a subscription holds four times its source's window before nats-py calls it slow, and
# takes at least 65,536 messages (bridge.io.origin)
MAX_WINDOW = 16384


def window_limit(budget: int, mean_size: float) -> int:
    """The largest window a source's ``budget`` bytes allow for messages of ``mean_size`` bytes (``OVERHEAD`` each
    beyond), in multiples of ``ROUND``, at most ``MAX_WINDOW``."""
    return min(MAX_WINDOW, int(budget // (mean_size + OVERHEAD))) // ROUND * ROUND


class WindowBudget:
    """The bytes every source's window may hold together (the process's share of memory for windows): a source
    grows its window only as far as what is left. Shared by the engines of one process; pure bookkeeping."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: dict[str, int] = {}  # per source: bytes its grown window may hold beyond its configured one

    def grant(self, source: str, wanted: int) -> int:
        """Reserve up to ``wanted`` bytes for ``source`` (replacing what it held); returns what was granted."""
        others = sum(self.held.values()) - self.held.get(source, 0)
        granted = max(0, min(wanted, self.limit - others))
        self.held[source] = granted
        return granted

    def release(self, source: str) -> None:
        """``source`` stopped, or went back to its configured window."""
        self.held.pop(source, None)


class Window:
    """The growth rule both modes share: one source's window, what it may grow to, and the resize under way.

    After a cycle of ``cycle`` seconds in which the origin waited ``stop`` seconds for want of window, while the
    link's round trip (:attr:`rtt`) is at least ``NEAR`` and the stop more than ``SHARE`` of the cycle, the window is
    what holds the source back: it grows (``STEP`` at most at a time), within ``budget`` bytes for this source
    (``OVERHEAD`` counted per message) and what the process's :class:`WindowBudget` has left. It never shrinks below
    the configured window; a restart begins there again. Subclasses measure ``stop`` and ``cycle`` their mode's way
    and feed :meth:`_sized` every delivery; :meth:`resized` / :meth:`resize_failed` take the outcome."""

    __slots__ = ("_budget", "_mean_size", "_pending", "_retry_at", "_shared", "configured", "rtt", "size", "source")

    def __init__(self, source: str, configured: int, budget: int, shared: WindowBudget | None = None) -> None:
        self.source = source
        self.configured = configured
        self.size = configured  # the window as this process set it
        self.rtt = 0.0  # the link's round trip, least of the recent ones (0: none measured yet)
        self._budget = budget  # bytes this source's window may hold (0: the window never grows)
        self._shared = shared
        self._mean_size = 0.0
        self._pending = 0  # a resize asked for, not yet done
        self._retry_at = -math.inf

    @property
    def grows(self) -> bool:
        return self._budget > 0

    def _sized(self, size: int) -> None:
        mean = self._mean_size
        self._mean_size = float(size) if mean == 0.0 else mean + (size - mean) / 64.0

    def _grow(self, now: float, stop: float, cycle: float) -> int:
        """The window to set after a cycle of ``cycle`` seconds of which the origin waited ``stop`` (0: keep it)."""
        if not self.grows or self._pending or now < self._retry_at or cycle <= 0.0:
            return 0
        if self.rtt < NEAR or stop <= SHARE * cycle:
            return 0
        per_message = self._mean_size + OVERHEAD
        limit = window_limit(self._budget, self._mean_size)
        # the window whose cycle (a stop, then its messages received and stored, which scales with it) has the stop
        # at SHARE: the time after the stop grows with the window, the stop does not
        flow = max(cycle - stop, 1e-4)
        wanted = min(
            limit,
            self.size * STEP,
            max(self.size * 2, math.ceil(self.size * stop * (1 / SHARE - 1) / flow)),
        )
        wanted = wanted // ROUND * ROUND
        if self._shared is not None:
            extra = self._shared.grant(self.source, int(max(0, wanted - self.configured) * per_message))
            wanted = max(self.size, min(wanted, (self.configured + int(extra // per_message)) // ROUND * ROUND))
        if wanted <= self.size:
            self._retry_at = now + RETRY_AFTER  # at the budget: look again later, not every window
            self._keep_share()
            return 0
        self._pending = wanted
        return wanted

    def resized(self, size: int) -> None:
        """The window is ``size`` now (the consumer's ``max_ack_pending`` was set)."""
        self._pending = 0
        self.size = size

    def resize_failed(self, now: float) -> None:
        """The update was refused or not answered: keep the window, try again after ``RETRY_AFTER``."""
        self._pending = 0
        self._retry_at = now + RETRY_AFTER
        self._keep_share()

    def _keep_share(self) -> None:
        """Hold in the process's budget what the window in place needs, no more (a grant for a larger one that
        did not happen is given back)."""
        if self._shared is not None:
            per_message = self._mean_size + OVERHEAD
            self._shared.grant(self.source, int(max(0, self.size - self.configured) * per_message))


class WindowSizer(Window):
    """Sizes one managed flow-control consumer's ``max_ack_pending`` from what its link shows.

    The origin stops at a full window and waits for the answer. A window's round trips are the time from that
    answer to the next delivery (the origin's link) plus the time from the window's last delivery to the answer
    (storing its last message: the aggregate's link, where the publishes cross a WAN in the edge position); they
    are sampled only then (a request sent for bytes or after a heartbeat does not stop the origin), and the least
    of the last ``SAMPLES`` is both the stop and :attr:`rtt`; a cycle runs from answer to answer.

    Inputs: :meth:`delivered` per delivery, :meth:`requested` per flow-control request, :meth:`released` per
    answer sent (returns the window to set, or 0), :meth:`resized` / :meth:`resize_failed` with the outcome."""

    __slots__ = ("_cycle_at", "_full", "_last_at", "_released_at", "_samples", "_tail")

    def __init__(self, source: str, configured: int, budget: int, shared: WindowBudget | None = None) -> None:
        super().__init__(source, configured, budget, shared)
        self._samples: list[float] = []
        self._full = False  # the outstanding request came when the window was full: its answer restarts delivery
        self._released_at = -1.0  # when such an answer went out; the next delivery closes a round trip
        self._last_at = 0.0  # when the newest delivery came
        self._tail = 0.0  # from the full window's last delivery to its answer: storing its last message
        self._cycle_at = -1.0  # when the answer before it went out

    def delivered(self, now: float, size: int) -> None:
        self._sized(size)
        if self._released_at >= 0.0:
            samples = self._samples
            samples.append(now - self._released_at + self._tail)
            if len(samples) > SAMPLES:
                del samples[0]
            self.rtt = min(samples)
            self._released_at = -1.0
        self._last_at = now

    def requested(self, outstanding: int) -> None:
        """A flow-control request came with ``outstanding`` deliveries unanswered."""
        self._full = outstanding >= self.size

    def released(self, now: float) -> int:
        """An answer went out: the window to set now (larger than :attr:`size`), or 0."""
        if not self._full:
            self._cycle_at = -1.0  # a cycle counts only between two answers that each released a full window
            return 0
        self._full = False
        # while a resize is under way the origin may deliver before this answer reaches it: no round trip to time
        self._released_at = -1.0 if self._pending else now
        self._tail = now - self._last_at
        cycle = now - self._cycle_at if self._cycle_at >= 0.0 else 0.0
        self._cycle_at = now
        if len(self._samples) < SAMPLES:
            return 0
        return self._grow(now, self.rtt, cycle)

    def resized(self, size: int) -> None:
        super().resized(size)
        self._restart()

    def resize_failed(self, now: float) -> None:
        super().resize_failed(now)
        self._restart()  # refused, or not answered in time: the update may still have reached the consumer

    def _restart(self) -> None:
        # the update let the origin deliver without an answer: what follows is timed from the next full window, and
        # a request held since it came (full for the window before) no longer stops the origin: the deliveries the
        # update let out would otherwise close a "round trip" from its answer, shorter than the link's (seen in CI)
        self._full = False
        self._released_at = -1.0
        self._cycle_at = -1.0


STOPS = 4  # pull mode: the request boundaries a decision looks back over (two cycles of the half-capacity refill)


class PullWindow(Window):
    """Sizes pull mode's requests in flight (its capacity; the pull consumer's ``max_ack_pending`` follows).

    The origin stops when it has delivered every request it holds while it has more: a request's last delivery
    with a backlog (:meth:`starved`), until the next delivery. With the half-capacity refill (ADR-37) a request is
    often already waiting there, so boundaries alternate between a real stop and a delivery's spacing: the stops
    and the time over the last ``STOPS`` boundaries are summed into one cycle. :attr:`rtt` is the least of the last
    ``SAMPLES`` times from a request to its first delivery (a request the server took at once: the link's). A thin
    link's spacing is a small share of a request's time, and a paced source is not fed to it (its stops are the
    rate limit's): neither grows.

    Inputs: :meth:`began` with a request's first delivery, :meth:`delivered` per delivery, :meth:`starved` (returns
    the window to set, or 0), :meth:`resized` / :meth:`resize_failed` with the outcome."""

    __slots__ = ("_boundary_at", "_rtts", "_stop_from", "_stops")

    def __init__(self, source: str, configured: int, budget: int, shared: WindowBudget | None = None) -> None:
        super().__init__(source, configured, budget, shared)
        self._rtts: list[float] = []
        self._stops: list[tuple[float, float]] = []  # (stop, cycle) per boundary, oldest first
        self._stop_from = -1.0  # a stop began here (a request's last delivery with a backlog)
        self._boundary_at = -1.0  # the previous stop's end: a cycle runs from one to the next

    def began(self, now: float, sent_at: float) -> None:
        """A request sent at ``sent_at`` brought its first delivery."""
        rtts = self._rtts
        rtts.append(now - sent_at)
        if len(rtts) > SAMPLES:
            del rtts[0]
        self.rtt = min(rtts)

    def delivered(self, now: float, size: int) -> None:
        self._sized(size)
        if self._stop_from < 0.0:
            return
        stop, self._stop_from = now - self._stop_from, -1.0
        if self._boundary_at >= 0.0 and not self._pending:
            self._stops.append((stop, now - self._boundary_at))
            if len(self._stops) > STOPS:
                del self._stops[0]
        self._boundary_at = now

    def starved(self, now: float) -> int:
        """The delivery just taken was its request's last, and the origin has more: a stop begins. The window to
        set now (larger than :attr:`size`), or 0."""
        self._stop_from = now
        if len(self._stops) < STOPS:
            return 0
        stop = sum(s for s, _ in self._stops)
        cycle = sum(c for _, c in self._stops)
        return self._grow(now, stop, cycle)

    def resized(self, size: int) -> None:
        super().resized(size)
        self._stops.clear()  # the new window is judged by its own stops
        self._boundary_at = -1.0
