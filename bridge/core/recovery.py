"""Recovering a source's stored watermark from the copies at the tail of the aggregate.

Every copy carries ``Bridge-Seq`` (its origin sequence) and ``Bridge-Prev`` (the origin sequence the bridge
accepted just before it). Because publishing is pipelined, a failed publish can leave a hole: copies of later
messages stored while an earlier one is still being retried. A crash at that moment must not make the newest
copy's sequence the watermark, or the hole would be acked at the origin and lost.

The pipeline sends at most ``publish_window`` messages before it stops and retries the failed one alone, so a
hole can only exist among the newest ``publish_window`` copies of a source. Recovery therefore reads a tail of
at least twice that, and walks the chain upwards from its oldest copy: the watermark is the last copy reached
before a missing link; copies above a hole are reported as *present* so they are not published twice.
A forward skip also breaks the chain (its ``Bridge-Prev`` names a sequence that was never copied), which only
makes the watermark conservative: the consumer's ack floor, adopted at the first RESET, covers the skip.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Copy:
    """One copy of an origin message found in the aggregate."""

    stream_seq: int
    prev_seq: int


@dataclass(frozen=True, slots=True)
class Recovery:
    """What the aggregate proves: everything up to ``watermark``, and the copies in ``present`` above it."""

    watermark: int
    present: frozenset[int]
    copies_read: int


def recovery_depth(publish_window: int) -> int:
    """How many of a source's newest copies recovery must read to see past any hole."""
    return max(2 * publish_window, 1024)


def recover(copies: Iterable[Copy]) -> Recovery:
    """Compute the contiguous watermark from a source's newest copies (any order, duplicates allowed)."""
    prev_of: dict[int, int] = {}
    for copy in copies:
        prev_of[copy.stream_seq] = copy.prev_seq
    if not prev_of:
        return Recovery(0, frozenset(), 0)
    ordered = sorted(prev_of)
    watermark = ordered[0]
    broken_at = len(ordered)
    for i in range(1, len(ordered)):
        seq = ordered[i]
        if prev_of[seq] != ordered[i - 1]:
            broken_at = i
            break
        watermark = seq
    return Recovery(watermark, frozenset(ordered[broken_at:]), len(prev_of))
