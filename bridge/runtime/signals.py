"""SIGTERM and SIGINT that arrive before ``nats-bridge run`` listens for them.

Python's default action for SIGTERM ends the process: a stop asked for while the interpreter was still importing
(a second or more on a loaded machine) or before the event loop had its handlers killed the process by the signal
(-15, 143 to a shell) instead of the documented drain, ``bridge.stopped`` line and exit 0. From the first line of
:func:`bridge.cli.main` for ``run``, such a signal is held here, and the bridge takes it as the first signal it
receives once it listens (:meth:`bridge.runtime.app.Bridge.run`). Kept free of imports: it is loaded before the rest.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_held: list[int] = []


def _hold(signum: int, frame: FrameType | None) -> None:
    _held.append(signum)


def hold_stop_signals() -> None:
    """Hold SIGTERM and SIGINT from now until the bridge's own handlers replace this one."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _hold)


def take_held() -> list[int]:
    """The stop signals held so far, oldest first; forgets them."""
    held = _held[:]
    _held.clear()
    return held
