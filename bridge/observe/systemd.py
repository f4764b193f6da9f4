"""systemd's notify protocol (``sd_notify(3)``) over the notify socket, with the standard library only.

Under ``Type=notify`` systemd passes ``NOTIFY_SOCKET`` (an ``AF_UNIX`` datagram socket) and, with ``WatchdogSec=``,
``WATCHDOG_USEC``/``WATCHDOG_PID``. The daemon reports ``READY=1``, ``STATUS=...``, ``STOPPING=1`` and
``WATCHDOG=1`` there, one datagram of newline-separated assignments per call. Outside systemd (a terminal, a
container, the tests) nothing is set and every call is a no-op, so callers need no ``if`` of their own.

Sending never raises: a replication daemon must not die because its supervisor's socket is gone or full. Failures
are returned as ``False`` and counted on the notifier; logging them (once, throttled) is the caller's choice.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

import anyio

__all__ = ["Notifier", "watchdog_loop"]

# systemd reads notify datagrams into a PIPE_BUF-sized buffer and drops longer ones whole ("overly long
# notification datagram"); a long status (an exception message, say) is cut so the datagram stays deliverable.
STATUS_MAX_CHARS = 1024


class Notifier:
    """A sender of systemd notifications; disabled (every method a no-op returning False) without a socket.

    Build it with :meth:`from_env`. ``address`` is what ``connect``/``sendto`` takes: a filesystem path, or an
    abstract-namespace name starting with ``"\\0"``. ``watchdog_usec`` is the watchdog timeout systemd granted
    this process, or None when the watchdog is off (or meant for another process).
    """

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self._address = address or None
        self._watchdog_usec = watchdog_usec if self._address is not None and watchdog_usec else None
        self.failures = 0
        """Datagrams that could not be sent (socket missing, refused, full, or a malformed assignment)."""
        self.last_error: OSError | ValueError | None = None
        """Why the most recent failed send failed, for the caller to log."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        """The notifier systemd configured for this process through ``environ`` (disabled when there is none).

        ``NOTIFY_SOCKET`` must be an absolute path or start with ``@`` (abstract namespace), as ``sd_notify``
        requires; anything else (including systemd's newer ``vsock:`` form) disables notifications. The watchdog
        applies only when ``WATCHDOG_USEC`` is a positive integer and ``WATCHDOG_PID``, if present, is our PID:
        systemd sets the pair for the main process, and a child that inherited them must not ping on its behalf.
        """
        raw = environ.get("NOTIFY_SOCKET", "")
        address: str | None
        if raw.startswith("/"):
            address = raw
        elif raw.startswith("@") and len(raw) > 1:
            address = "\0" + raw[1:]
        else:
            address = None
        return cls(address, _watchdog_usec(environ))

    @property
    def enabled(self) -> bool:
        """Whether there is a notify socket to send to."""
        return self._address is not None

    @property
    def address(self) -> str | None:
        """The socket address datagrams go to (abstract names start with ``"\\0"``), or None when disabled."""
        return self._address

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings (half the watchdog timeout, as systemd advises), or None."""
        if self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 2 / 1_000_000

    def send(self, *assignments: str) -> bool:
        """Send ``assignments`` (``"NAME=value"`` each) as one datagram; True if the kernel accepted it.

        Never raises. An assignment without ``=`` or with a newline (which would smuggle in another assignment)
        is refused as a whole, counted like a socket error.
        """
        if self._address is None or not assignments:
            return False
        for assignment in assignments:
            name, sep, _ = assignment.partition("=")
            if not sep or not name or "\n" in assignment:
                return self._failed(ValueError(f"malformed notify assignment {assignment[:40]!r}"))
        datagram = "\n".join(assignments).encode("utf-8", errors="replace")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Non-blocking: a supervisor that stopped reading must not freeze the event loop we run in.
                sock.setblocking(False)
                sock.sendto(datagram, self._address)
        except OSError as exc:
            return self._failed(exc)
        return True

    def ready(self, status: str | None = None) -> bool:
        """Tell systemd start-up is complete (``READY=1``), optionally with a status line."""
        return self.send("READY=1", *_status(status))

    def reloading(self, status: str | None = None) -> bool:
        """Tell systemd a configuration reload began (``RELOADING=1``); send :meth:`ready` when it is done.

        ``MONOTONIC_USEC`` lets systemd (253+, ``Type=notify-reload``) match this message to the reload it asked
        for; older versions ignore it.
        """
        now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={now_usec}", *_status(status))

    def stopping(self, status: str | None = None) -> bool:
        """Tell systemd the daemon is shutting down (``STOPPING=1``), optionally with a status line."""
        return self.send("STOPPING=1", *_status(status))

    def status(self, text: str) -> bool:
        """Set the free-form status ``systemctl status`` shows (``STATUS=...``; newlines become spaces)."""
        return self.send(*_status(text))

    def watchdog(self) -> bool:
        """Ping the watchdog (``WATCHDOG=1``); a no-op returning False when no watchdog is configured."""
        if self._watchdog_usec is None:
            return False
        return self.send("WATCHDOG=1")

    def _failed(self, error: OSError | ValueError) -> bool:
        self.failures += 1
        self.last_error = error
        return False


def _watchdog_usec(environ: Mapping[str, str]) -> int | None:
    pid = environ.get("WATCHDOG_PID")
    if pid is not None:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec if usec > 0 else None


def _status(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    line = " ".join(text.splitlines())
    if len(line) > STATUS_MAX_CHARS:
        line = line[: STATUS_MAX_CHARS - 3] + "..."
    return (f"STATUS={line}",)


async def watchdog_loop(notifier: Notifier, healthy: Callable[[], bool]) -> None:
    """Ping the watchdog every :attr:`Notifier.watchdog_interval` while ``healthy()`` is True; run until cancelled.

    Runs in the event loop on purpose: a blocked loop stops the pings, and systemd restarts the service after
    ``WatchdogSec``. ``healthy()`` returning False stops them too (without stopping the loop, so pings resume
    when it recovers); an exception from it propagates. Returns at once when no watchdog is configured. Start it
    before anything that may wait long (connecting to servers), since systemd's timer runs from process start.
    """
    interval = notifier.watchdog_interval
    if interval is None:
        return
    deadline = anyio.current_time()
    while True:
        if healthy():
            notifier.watchdog()
        # Scheduled from the previous deadline so pings don't drift later; after a stall (the loop was blocked
        # past a deadline) one ping goes out at once and the schedule restarts from there, with no burst.
        deadline = max(deadline + interval, anyio.current_time())
        await anyio.sleep_until(deadline)
