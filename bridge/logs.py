"""Structured logging: JSON lines under systemd or in containers, readable console output on a terminal.

One event per state change (connected, reset with cause and sequences, blocked, recovered), never per message.
Nothing here ever receives a credential: connection errors are described by ``bridge.io.connect.describe``.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Set up structlog for the process. ``fmt`` is ``auto`` (console on a TTY, else JSON), ``json`` or ``console``."""
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )


def get_logger(**context: Any) -> Any:
    """A bound logger carrying ``context`` on every event."""
    return structlog.get_logger("nats-bridge").bind(**context)


class Throttle:
    """Lets one event through per ``interval`` seconds and counts the ones it held back; an event of a different
    ``kind`` than the last one let through is news, and passes at once.

    nats-py reports every failed reconnect attempt (one per ``reconnect_time_wait``); during an outage that is
    two lines a second that say nothing new.
    """

    def __init__(self, interval: float = 30.0) -> None:
        self.interval = interval
        self._last = -interval
        self._held = 0
        self._kind: object = None

    def allow(self, now: float, kind: object = None) -> int | None:
        """None to stay quiet; otherwise how many events were held back since the last one let through."""
        if kind == self._kind and now - self._last < self.interval:
            self._held += 1
            return None
        held, self._held, self._last, self._kind = self._held, 0, now, kind
        return held
