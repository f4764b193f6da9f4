"""The one retry policy of the daemon's "try until it works or we are stopped" loops.

Three loops use it: the first connection to a side (``Bridge._connect``: target, coordination), a source's setup
(``SourceRunner._setup``: origin connection, stream, consumer, recovery) and the coordination bucket
(``FleetRunner._ensure_bucket``). Each failure is answered by :meth:`Retry.failed`, a pure function of the attempt,
the clock and a random draw (tested on plain values, ``tests/unit/test_runtime_retry.py``), with

* **backoff**: the delay doubles from ``initial`` up to ``maximum`` (``bridge.core.backoff``);
* **jitter**: each delay is shortened by a random fraction of at most ``jitter``, so that many sources (or
  processes) that failed together, a thousand edges after a regional cut, do not retry in the same instant; never
  lengthened, so ``maximum`` stays the longest wait;
* **log throttling**: a failure like the last one reported (same ``kind``) is reported at most every ``log_every``
  seconds, with the number held back meanwhile; a new kind of failure is news and is reported at once.

:func:`retry_until_stopped` is the loop itself, which only performs: it calls the attempt, hands each failure and
the policy's answer to the caller's ``report``, and sleeps the delay unless stopped.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from bridge.core.backoff import Backoff
from bridge.logs import Throttle
from bridge.runtime.flag import Waitable

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one kind of loop retries: the backoff, the jitter fraction and how often the same failure is logged."""

    backoff: Backoff
    log_every: float = 30.0
    jitter: float = 0.2


@dataclass(frozen=True, slots=True)
class RetryStep:
    """What to do after one failure: wait ``delay`` before attempt ``attempt + 1``; ``report`` it (log a line)
    or stay quiet, ``suppressed`` being how many failures like it were held back since the last one reported."""

    attempt: int
    delay: float
    report: bool
    suppressed: int


class Retry:
    """The state of one retry loop: the attempts made and what was logged."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.attempt = 0
        self._throttle = Throttle(policy.log_every)

    def failed(self, now: float, kind: object, draw: float) -> RetryStep:
        """Attempt ``self.attempt + 1`` failed at ``now`` with a failure of ``kind``; ``draw`` is uniform in [0, 1)."""
        self.attempt += 1
        policy = self.policy
        delay = policy.backoff.delay(self.attempt) * (1.0 - policy.jitter * draw)
        held = self._throttle.allow(now, kind)
        return RetryStep(self.attempt, delay, held is not None, held or 0)


async def retry_until_stopped(
    stop: Waitable,
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    retry_on: tuple[type[BaseException], ...],
    kind: Callable[[BaseException], object],
    report: Callable[[BaseException, RetryStep], None],
    clock: Callable[[], float] = time.monotonic,
    draw: Callable[[], float] = random.random,
) -> T | None:
    """Call ``attempt`` until it returns (its result) or ``stop`` is set (None). A failure of a type in
    ``retry_on`` goes to ``report`` with the policy's answer, then the loop waits the delay (cut short by
    ``stop``); any other exception propagates."""
    retry = Retry(policy)
    while not stop.is_set():
        try:
            return await attempt()
        except retry_on as exc:
            step = retry.failed(clock(), kind(exc), draw())
            report(exc, step)
            with anyio.move_on_after(step.delay):
                await stop.wait()
    return None
