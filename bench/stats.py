"""Pure helpers: percentiles and spreads, server timestamps (parsed in ``bridge.core.times``), ``/proc`` parsing.

No I/O here (unit-tested).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.core.times import parse_rfc3339_ns  # re-exported: the bench's callers import it from here

__all__ = [
    "Spread",
    "ack_info",
    "cpu_model",
    "median",
    "mem_total_bytes",
    "parse_proc_stat_ticks",
    "parse_rfc3339_ns",
    "parse_status_kib",
    "percentile",
    "spread",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks (numpy's default).

    Raises:
        ValueError: ``values`` is empty or ``q`` is outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0 or math.isnan(q):
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    return ordered[lo] + (ordered[hi] - ordered[lo]) * frac


def median(values: Sequence[float]) -> float:
    """The median (the 50th percentile, interpolated for an even count)."""
    return percentile(values, 50.0)


@dataclass(frozen=True, slots=True)
class Spread:
    """Median and range of a handful of repetitions."""

    median: float
    low: float
    high: float
    count: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.count}


def spread(values: Sequence[float]) -> Spread:
    """Median, min and max of ``values``.

    Raises:
        ValueError: ``values`` is empty.
    """
    if not values:
        raise ValueError("spread of no values")
    return Spread(median(values), min(values), max(values), len(values))


def ack_info(reply: str) -> tuple[int, int]:
    """``(stream sequence, store time in ns)`` from a JetStream ``$JS.ACK`` reply subject, v1 (9 tokens) or v2
    (11, or 12 with a trailing random token; docs/protocol.md 2.1).

    Raises:
        ValueError: not an ack subject.
    """
    tokens = reply.split(".")
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        raise ValueError(f"not a $JS.ACK subject: {reply!r}")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[7])
    if len(tokens) in (11, 12):
        return int(tokens[7]), int(tokens[9])
    raise ValueError(f"unexpected $JS.ACK subject layout ({len(tokens)} tokens): {reply!r}")


def parse_proc_stat_ticks(text: str) -> int:
    """``utime + stime`` (clock ticks) from the text of ``/proc/<pid>/stat``.

    The command name (field 2) is in parentheses and may hold spaces, so fields are counted after the last ``)``.
    """
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15
    return int(rest[11]) + int(rest[12])


def parse_status_kib(text: str, key: str) -> int | None:
    """A ``kB`` value (``VmHWM``, ``VmRSS``...) from the text of ``/proc/<pid>/status``, in KiB; None if absent."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name == key:
            parts = value.split()
            if parts:
                return int(parts[0])
    return None


def cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` in ``/proc/cpuinfo`` text (or ``unknown``)."""
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "model name":
            return " ".join(value.split())
    return "unknown"


def mem_total_bytes(meminfo: str) -> int | None:
    """``MemTotal`` from ``/proc/meminfo`` text, in bytes."""
    kib = parse_status_kib(meminfo, "MemTotal")
    return None if kib is None else kib * 1024
