"""NATS subject matching (``*`` one token, ``>`` one or more trailing tokens), for checks against stream subjects."""

from __future__ import annotations

from collections.abc import Iterable


def pattern_covers(wide: str, narrow: str) -> bool:
    """Whether every subject ``narrow`` matches is matched by ``wide`` (both may hold ``*`` and ``>``)."""
    have = wide.split(".")
    want = narrow.split(".")
    for i, token in enumerate(have):
        if token == ">":
            return len(want) > i
        if i >= len(want):
            return False
        if token == "*":
            if want[i] == ">":
                return False
        elif token != want[i]:
            return False
    return len(have) == len(want)


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` (literal) is captured by ``pattern`` (may hold wildcards): a literal is the narrowest
    pattern."""
    return pattern_covers(pattern, subject)


class SubjectSet:
    """A stream's subject list with a bounded memo (origin subjects repeat, the check sits on the hot path)."""

    MEMO_LIMIT = 8192

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = tuple(patterns)
        self._memo: dict[str, bool] = {}

    def captures(self, subject: str) -> bool:
        """True when some pattern captures ``subject``; an empty set captures everything (nothing known)."""
        if not self.patterns:
            return True
        hit = self._memo.get(subject)
        if hit is None:
            if len(self._memo) >= self.MEMO_LIMIT:
                self._memo.clear()
            hit = self._memo[subject] = any(subject_matches(p, subject) for p in self.patterns)
        return hit
