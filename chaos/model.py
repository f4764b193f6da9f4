"""The records a chaos run keeps, shared by the workload, the nemesis, the reader and the checker.

Nothing here knows how the bridge works: these are what an outside observer can see (publish acks from the
origin, messages in the aggregate, stream states) and what the nemesis did on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ID_HEADER = "Chaos-Id"  # "<source>/<n>": n counts a source's publish attempts from 1, one id per attempt


def message_id(source: str, n: int) -> str:
    """The value of :data:`ID_HEADER` for attempt ``n`` of ``source``."""
    return f"{source}/{n}"


def parse_message_id(value: str) -> tuple[str, int] | None:
    """``(source, n)`` from an :data:`ID_HEADER` value, or ``None`` when it is not one of ours."""
    source, sep, n = value.rpartition("/")
    if not sep or not source or not n.isdigit():
        return None
    return source, int(n)


@dataclass(slots=True)
class PublishLog:
    """Every publish attempt into one source's origin stream and what the origin answered.

    Attempts are numbered 1..``attempted``; ``acked`` maps an attempt to the origin stream sequence its publish
    ack named. An attempt without an ack (timeout, disconnect) may or may not be in the origin.
    """

    source: str
    attempted: int = 0
    acked: dict[int, int] = field(default_factory=dict)
    bytes_acked: int = 0

    def next_attempt(self) -> int:
        self.attempted += 1
        return self.attempted

    def ack(self, n: int, origin_seq: int, size: int) -> None:
        self.acked[n] = origin_seq
        self.bytes_acked += size


@dataclass(frozen=True, slots=True)
class StoredCopy:
    """One message read from the aggregate: its sequence there and the attempt it carries (if any)."""

    aggregate_seq: int
    source: str | None  # None: no parsable Chaos-Id header
    n: int


@dataclass(frozen=True, slots=True)
class Excuse:
    """Origin sequences ``first..last`` (inclusive) of ``source`` that may be absent from the aggregate because
    the nemesis removed them on purpose: a forward reset skipped them, or deleting the consumer of an Interest
    stream let the server drop them."""

    source: str
    first: int
    last: int
    reason: str  # "forward-reset" | "consumer-deleted"

    def covers(self, origin_seq: int) -> bool:
        return self.first <= origin_seq <= self.last


@dataclass(frozen=True, slots=True)
class DeletionSample:
    """Two readings taken in this order: the origin's ``first_seq`` (so every origin sequence below it had been
    deleted by then), then the aggregate's ``last_seq``. A message deleted before it was stored shows up as an
    acked origin sequence below ``origin_first_seq`` whose copy is not at or below ``aggregate_last_seq``."""

    source: str
    origin_first_seq: int
    aggregate_last_seq: int


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One line of a run's fault timeline; ``at`` is seconds since the scenario's workload started."""

    at: float
    fault: str
    action: str  # "inject" | "heal" | "note"
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"at": round(self.at, 3), "fault": self.fault, "action": self.action, **self.detail}


@dataclass(slots=True)
class SourceVerdict:
    """The checker's findings for one source of one scenario."""

    source: str
    retention: str
    attempted: int = 0
    acked: int = 0
    stored: int = 0  # distinct attempts found in the aggregate
    lost: int = 0  # acked by the origin, absent from the aggregate, not excused
    duplicated: int = 0  # extra copies beyond the first, summed over attempts
    reordered: int = 0  # copies whose origin sequence is below one stored before them
    unexpected: int = 0  # copies of attempts never made (or with no parsable id)
    excused: int = 0  # acked, absent, inside an Excuse
    deleted_before_stored: int = 0  # see DeletionSample
    stranded: int = 0  # still in a WorkQueue/Interest origin at the end, outside every forward-reset Excuse
    examples: dict[str, list[int]] = field(default_factory=dict)  # a few per kind of finding (see checker)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.reordered
            or self.unexpected
            or self.deleted_before_stored
            or self.stranded
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "retention": self.retention,
            "attempted": self.attempted,
            "acked": self.acked,
            "stored": self.stored,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "reordered": self.reordered,
            "unexpected": self.unexpected,
            "excused": self.excused,
            "deleted_before_stored": self.deleted_before_stored,
            "stranded": self.stranded,
            "ok": self.ok,
            "examples": self.examples,
        }


@dataclass(slots=True)
class ScenarioResult:
    """Everything one scenario run produced: the verdicts, what was done to it, and harness problems.

    ``problems`` are things that make the run itself fail apart from the checker's counts: the bridge not
    converging before the deadline, a bridge exit code other than 0 after SIGTERM, a fault that could not be
    injected. ``command`` replays the scenario (same seed, same schedule).
    """

    name: str
    seed: int
    command: str
    verdicts: list[SourceVerdict] = field(default_factory=list)
    timeline: list[FaultEvent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    workload_seconds: float = 0.0
    wall_seconds: float = 0.0
    audit: dict[str, Any] | None = None  # the bridge's own audit of the aggregate, with --audit (chaos.audit)

    @property
    def faults(self) -> int:
        return sum(1 for event in self.timeline if event.action == "inject")

    @property
    def ok(self) -> bool:
        return bool(self.verdicts) and not self.problems and all(v.ok for v in self.verdicts)

    def total(self, name: str) -> int:
        """Sum of one SourceVerdict counter (``"acked"``, ``"lost"``, ...) over the sources."""
        return sum(int(getattr(v, name)) for v in self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "command": self.command,
            "ok": self.ok,
            "faults": self.faults,
            "workload_seconds": round(self.workload_seconds, 1),
            "wall_seconds": round(self.wall_seconds, 1),
            "problems": self.problems,
            "sources": [v.to_json() for v in self.verdicts],
            "timeline": [event.to_json() for event in self.timeline],
            "audit": self.audit,
        }
