"""Server timestamps: RFC 3339 text to integer nanoseconds since the epoch, exactly.

The server writes store times as RFC 3339 with up to nine fractional digits (Go's ``RFC3339Nano``, trailing zeros
trimmed, e.g. ``2026-11-25T21:57:24.123456789Z``): in ``STREAM.MSG.GET`` replies, ``Nats-Time-Stamp`` headers and
stream state. Python's ``datetime`` keeps microseconds only, and the nanoseconds matter: store times of consecutive
messages are microseconds apart, and a copy's ``Bridge-Time`` must equal what the ack subject of a delivery says.
"""

from __future__ import annotations

import datetime as dt
import re

__all__ = ["parse_rfc3339_ns"]

_RFC3339 = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})T(?P<h>\d{2}):(?P<m>\d{2}):(?P<s>\d{2})(?:\.(?P<frac>\d+))?"
    r"(?P<tz>Z|[+-]\d{2}:\d{2})$"
)
_EPOCH = dt.date(1970, 1, 1)


def parse_rfc3339_ns(text: str) -> int:
    """Nanoseconds since the epoch of a server timestamp such as ``2026-11-22T08:13:48.657247504Z``.

    Digits beyond the ninth are dropped (the server never writes them); an offset other than ``Z`` is applied.

    Raises:
        ValueError: not an RFC 3339 timestamp.
    """
    match = _RFC3339.match(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    days = (dt.date.fromisoformat(match["date"]) - _EPOCH).days
    seconds = days * 86400 + int(match["h"]) * 3600 + int(match["m"]) * 60 + int(match["s"])
    tz = match["tz"]
    if tz != "Z":
        sign = 1 if tz[0] == "+" else -1
        seconds -= sign * (int(tz[1:3]) * 3600 + int(tz[4:6]) * 60)
    frac = (match["frac"] or "")[:9].ljust(9, "0")
    return seconds * 1_000_000_000 + int(frac)
