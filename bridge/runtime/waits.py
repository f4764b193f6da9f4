"""What a source waits for, logged on each change only (``source.waiting`` / ``source.waiting_over``).

The runner's setup loop, the daemon's target connection and the fleet's standby state each report waits here, as
often as they like; a person reading the log sees one line when a wait begins and one when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class WaitLog:
    """What one source waits for, logged on each change only: ``source.waiting`` (with ``for``: ``target``,
    ``origin``, ``consumer``, ``lease``, and what explains it) when a wait begins, ``source.waiting_over`` (with
    how long it lasted) when it ends. Asking again for a wait already under way logs nothing, so retry loops and
    callbacks may call it on every attempt."""

    def __init__(self, log: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._clock = clock
        self._since: dict[str, float] = {}
        self._keys: dict[str, object] = {}

    @property
    def reasons(self) -> list[str]:
        """What the source waits for now (empty: nothing)."""
        return sorted(self._since)

    def begin(self, reason: str, /, *, level: str = "warning", key: object = None, **fields: Any) -> None:
        """The source waits for ``reason`` (logged unless it already did; again when ``key``, e.g. who owns the
        lease, changed while it waits)."""
        if reason in self._since and self._keys.get(reason) == key:
            return
        self._since.setdefault(reason, self._clock())
        self._keys[reason] = key
        getattr(self._log, level)("source.waiting", **{"for": reason}, **fields)

    def end(self, reason: str, /, **fields: Any) -> None:
        """The source no longer waits for ``reason`` (logged only if it did)."""
        since = self._since.pop(reason, None)
        self._keys.pop(reason, None)
        if since is None:
            return
        if self._since:
            fields["still_waiting_for"] = self.reasons
        waited = round(self._clock() - since, 3)
        self._log.info("source.waiting_over", **{"for": reason}, waited_seconds=waited, **fields)
