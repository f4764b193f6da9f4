"""The chaos checker: what the aggregate holds against what the origins acknowledged.

It knows nothing of the bridge's code or state; its inputs are what an outside observer recorded (publish logs,
the aggregate's contents, deletion samples, what stayed in the origins) and what the nemesis did on purpose
(excuses). It is pure: no I/O, same inputs, same verdicts.

Examples in :attr:`SourceVerdict.examples` are origin sequences where the finding is about an acked message and
attempt numbers ``n`` (the ``<source>/<n>`` of the Chaos-Id) where an origin sequence is not always known; see
:data:`EXAMPLE_UNITS`. The ``(unknown)`` verdict's examples are aggregate sequences, the only handle on a copy
that names no source we published to.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from chaos.model import DeletionSample, Excuse, PublishLog, SourceVerdict, StoredCopy

UNKNOWN_SOURCE: Final = "(unknown)"
FORWARD_RESET: Final = "forward-reset"
MAX_EXAMPLES: Final = 5

# What the numbers in ``examples[kind]`` are. Duplicates and unexpected copies can belong to attempts whose
# publish was never acked, so they are named by attempt; every other finding is about an origin sequence.
EXAMPLE_UNITS: Final[Mapping[str, str]] = {
    "lost": "origin seqs",
    "duplicated": "attempts",
    "reordered": "origin seqs",
    "unexpected": "attempts",
    "deleted_before_stored": "origin seqs",
    "stranded": "origin seqs",
}


def example_unit(source: str, kind: str) -> str:
    """What the numbers in ``examples[kind]`` of ``source``'s verdict are, for a report to say so."""
    if source == UNKNOWN_SOURCE:
        return "aggregate seqs"
    return EXAMPLE_UNITS.get(kind, "values")


def check_source(
    source: str,
    retention: str,
    log: PublishLog,
    copies: Sequence[StoredCopy],
    excuses: Sequence[Excuse],
    samples: Sequence[DeletionSample],
    origin_remaining: Sequence[int] | None,
) -> SourceVerdict:
    """Check one source: every acked attempt stored exactly once, in origin order, never deleted from the
    origin before it was stored, and nothing left behind in the origin.

    ``copies`` are this source's copies in aggregate order (they are sorted here if they are not); of ``excuses``
    and ``samples`` only this source's are used; ``origin_remaining`` lists the origin sequences still in the
    origin stream at the end, or is ``None`` when that was not checked (a Limits origin keeps everything).
    ``retention`` is only copied into the verdict.

    Examples: ``lost``, ``deleted_before_stored`` and ``stranded`` list the lowest origin sequences;
    ``reordered`` the origin sequences of the first out-of-order copies; ``duplicated`` the attempt numbers
    whose extra copies come first in the aggregate; ``unexpected`` the attempt numbers of the first copies of
    attempts never made.
    """
    attempted = log.attempted
    acked = log.acked

    # attempt -> aggregate sequence of its first copy; only attempts with extra copies get an entry in `extra`,
    # so a clean run of 1,000,000 copies builds one dict
    first_at: dict[int, int] = {}
    extra: dict[int, int] = {}
    unexpected = 0
    unexpected_examples: list[int] = []
    reordered = 0
    reordered_examples: list[int] = []
    highest = 0  # origin sequences start at 1

    for copy in _in_aggregate_order(copies):
        n = copy.n
        if n < 1 or n > attempted:
            unexpected += 1
            if len(unexpected_examples) < MAX_EXAMPLES:
                unexpected_examples.append(n)
            continue
        if n in first_at:
            extra[n] = extra.get(n, 0) + 1
            continue
        first_at[n] = copy.aggregate_seq
        seq = acked.get(n)
        if seq is None:
            # an unacked attempt's origin sequence is unknown, so it says nothing about order
            continue
        if seq < highest:
            # the maximum is kept, not lowered: one late copy counts once, not once per copy after it
            reordered += 1
            if len(reordered_examples) < MAX_EXAMPLES:
                reordered_examples.append(seq)
        else:
            highest = seq

    # another source's origin sequences are a different numbering: its excuses and samples say nothing here
    excuses = [e for e in excuses if e.source == source]
    excused_by_any = coverage(excuses)
    excused_by_reset = coverage(e for e in excuses if e.reason == FORWARD_RESET)
    deleted_first = _deletion_index(s for s in samples if s.source == source)

    lost_seqs: list[int] = []
    deleted_seqs: list[int] = []
    excused = 0
    for n, seq in acked.items():
        at = first_at.get(n)
        if at is None:
            if excused_by_any(seq):
                excused += 1
            else:
                lost_seqs.append(seq)
        elif deleted_first is not None and deleted_first(seq, at) and not excused_by_any(seq):
            deleted_seqs.append(seq)

    stranded_seqs: list[int] = []
    if origin_remaining is not None:
        stranded_seqs = [seq for seq in set(origin_remaining) if not excused_by_reset(seq)]

    verdict = SourceVerdict(
        source=source,
        retention=retention,
        attempted=attempted,
        acked=len(acked),
        stored=len(first_at),
        lost=len(lost_seqs),
        duplicated=sum(extra.values()),
        reordered=reordered,
        unexpected=unexpected,
        excused=excused,
        deleted_before_stored=len(deleted_seqs),
        stranded=len(stranded_seqs),
    )
    examples = {
        "lost": heapq.nsmallest(MAX_EXAMPLES, lost_seqs),
        "duplicated": list(itertools.islice(extra, MAX_EXAMPLES)),
        "reordered": reordered_examples,
        "unexpected": unexpected_examples,
        "deleted_before_stored": heapq.nsmallest(MAX_EXAMPLES, deleted_seqs),
        "stranded": heapq.nsmallest(MAX_EXAMPLES, stranded_seqs),
    }
    verdict.examples = {kind: values for kind, values in examples.items() if values}
    return verdict


def check_run(
    logs: Mapping[str, PublishLog],
    retentions: Mapping[str, str],
    copies: Sequence[StoredCopy],
    excuses: Sequence[Excuse],
    samples: Sequence[DeletionSample],
    origin_remaining: Mapping[str, Sequence[int]],
) -> list[SourceVerdict]:
    """Check every source of a run: one verdict per key of ``logs``, in that order.

    ``copies`` are everything read from the aggregate, in aggregate order. Copies with no parsable id, or naming
    a source that is not in ``logs``, make one more verdict, source ``(unknown)``, retention ``-``, counting them
    as ``unexpected`` (examples: their aggregate sequences); it is only added when there is such a copy. A
    source missing from ``origin_remaining`` is not checked for stranded messages.
    """
    by_source: dict[str, list[StoredCopy]] = {source: [] for source in logs}
    strays: list[StoredCopy] = []
    for copy in copies:
        bucket = None if copy.source is None else by_source.get(copy.source)
        if bucket is None:
            strays.append(copy)
        else:
            bucket.append(copy)

    verdicts = [
        check_source(
            source,
            retentions.get(source, "?"),
            log,
            by_source[source],
            excuses,
            samples,
            origin_remaining.get(source),
        )
        for source, log in logs.items()
    ]
    if strays:
        verdicts.append(
            SourceVerdict(
                source=UNKNOWN_SOURCE,
                retention="-",
                unexpected=len(strays),
                examples={"unexpected": [c.aggregate_seq for c in strays[:MAX_EXAMPLES]]},
            )
        )
    return verdicts


def _in_aggregate_order(copies: Sequence[StoredCopy]) -> Sequence[StoredCopy]:
    # "first copy" and "reordered" mean aggregate order; a reader that merged pages out of order must not turn
    # into findings, and checking is far cheaper than sorting 1,000,000 copies that are already in order
    if all(a.aggregate_seq <= b.aggregate_seq for a, b in itertools.pairwise(copies)):
        return copies
    return sorted(copies, key=lambda c: c.aggregate_seq)


def coverage(excuses: Iterable[Excuse]) -> Callable[[int], bool]:
    """A test ``covered(origin_seq)`` over the union of the excuses' ranges, O(log E) per call."""
    firsts: list[int] = []
    lasts: list[int] = []
    for first, last in sorted((e.first, e.last) for e in excuses if e.first <= e.last):
        if lasts and first <= lasts[-1] + 1:
            lasts[-1] = max(lasts[-1], last)
        else:
            firsts.append(first)
            lasts.append(last)

    def covered(origin_seq: int) -> bool:
        i = bisect_right(firsts, origin_seq) - 1
        return i >= 0 and origin_seq <= lasts[i]

    return covered


def _deletion_index(samples: Iterable[DeletionSample]) -> Callable[[int, int], bool] | None:
    """A test ``deleted_first(origin_seq, aggregate_seq)``: some sample saw the origin without ``origin_seq``
    (``origin_seq < F``) while the aggregate did not have the copy yet (``aggregate_seq > L``).

    Samples are sorted by ``F``; the samples with ``F > origin_seq`` are a suffix of that order, and the question
    is whether the smallest ``L`` among them is below ``aggregate_seq``, so a suffix minimum answers it with one
    bisection: O((N + S) log S) for N attempts and S samples. ``None`` when there are no samples.
    """
    ordered = sorted((s.origin_first_seq, s.aggregate_last_seq) for s in samples)
    if not ordered:
        return None
    firsts = [first for first, _ in ordered]
    suffix_min = [last for _, last in ordered]
    for i in range(len(suffix_min) - 2, -1, -1):
        suffix_min[i] = min(suffix_min[i], suffix_min[i + 1])
    count = len(firsts)

    def deleted_first(origin_seq: int, aggregate_seq: int) -> bool:
        i = bisect_right(firsts, origin_seq)
        return i < count and suffix_min[i] < aggregate_seq

    return deleted_first
