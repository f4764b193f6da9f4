"""Recovering a source's stored watermark from the copies at the tail of the aggregate.

Every copy carries ``Bridge-Seq`` (its origin sequence) and ``Bridge-Prev`` (the origin sequence the bridge
accepted just before it). Because publishing is pipelined, a failed publish can leave a hole: copies of later
messages stored while an earlier one is still being retried. A crash at that moment must not make the newest
copy's sequence the watermark, or the hole would be acked at the origin and lost.

The chain is anchored at the consumer's **ack floor**: the bridge only ever acks what is stored (or what a forward
reset skipped on purpose), so everything at or below the floor is accounted for. Recovery reads the source's copies
backwards until it reaches one at or below the floor (or the start of the stream), then walks upwards from the floor:
a copy whose ``Bridge-Prev`` is at or below the watermark so far extends it; the first that does not marks a hole,
unless the copy declares the range before it skipped on purpose (``Bridge-Skipped``: a forward reset, or a start
position, from just above the run). The watermark is the top of the unbroken run; copies above the hole are reported
as *present* so they are not published twice, and the hole is published (and retried) before any of them is acked.

Only if the read is cut short (more than ``cap`` copies above the floor: a recreated consumer whose floor is far
behind the aggregate) is the oldest copy read taken as the anchor. That rests on the pipeline never sending more
than ``publish_window`` messages past the oldest one not yet stored, so a hole cannot sit further down than that
within one run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Copy:
    """One copy of an origin message found in the aggregate."""

    stream_seq: int
    prev_seq: int
    # the first origin sequence of a range skipped on purpose just before it (its ``Bridge-Skipped``, which ends at
    # ``prev_seq``: a forward reset, or a start position); 0: none
    skipped_from: int = 0


@dataclass(frozen=True, slots=True)
class Recovery:
    """What the aggregate proves: everything up to ``watermark``, and the copies in ``present`` above it."""

    watermark: int
    present: frozenset[int]
    copies_read: int


def recovery_depth(publish_window: int) -> int:
    """How many copies above the ack floor recovery reads at most before it trusts the oldest one it has."""
    return max(4 * publish_window, 100_000)


def recover(copies: Iterable[Copy], floor: int = 0, complete: bool = True) -> Recovery:
    """Compute the contiguous watermark from a source's newest copies (any order, duplicates allowed).

    ``floor`` is the consumer's ack floor; ``complete`` says the copies reach down to it (or to the first copy of
    the source ever stored), so the chain can start there. Otherwise it starts at the oldest copy.
    """
    prev_of: dict[int, int] = {}
    skip_of: dict[int, int] = {}
    for copy in copies:
        prev_of[copy.stream_seq] = copy.prev_seq
        if copy.skipped_from:
            skip_of[copy.stream_seq] = copy.skipped_from
    ordered = sorted(seq for seq in prev_of if seq > floor)
    watermark = floor
    if ordered and not complete:
        watermark = max(floor, ordered[0])
        ordered = ordered[1:]
    broken_at = len(ordered)
    for i, seq in enumerate(ordered):
        # a copy links to the run when what it follows is in it, or when what lies between was skipped on purpose
        if prev_of[seq] > watermark and not 0 < skip_of.get(seq, 0) <= watermark + 1:
            broken_at = i
            break
        watermark = seq
    return Recovery(watermark, frozenset(ordered[broken_at:]), len(prev_of))
