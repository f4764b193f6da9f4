"""The audit's verdict: per-source results, the terminal table, the JSON report and the PNG chart.

A source is **damaged** when a copy was lost, an origin sequence is stored twice, the aggregate's order disagrees
with the origin's, a copy's ``Nats-Msg-Id`` disagrees with its provenance headers (inconsistent provenance), or
(``--origin-too``) the origin holds a message the chain does not explain (absent), a copy names a sequence the
origin never had (extra), or a copy's payload differs from the origin's. Skipped (a forward reset) and not
delivered (gone from the origin before the bridge read it) are reported, never counted as damage.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DAMAGE_KINDS = ("lost", "duplicate", "reordered", "inconsistent_provenance", "absent", "extra", "hash_mismatch")


@dataclass
class SourceReport:
    """One source (and origin stream) as the aggregate shows it."""

    source: str
    origin_stream: str
    configured: bool
    copies: int
    distinct: int
    first_seq: int | None
    last_seq: int | None
    chain_start: int | None
    duplicates: int
    reordered: int
    lost: int
    skipped: int
    not_delivered: int
    latency_ms: dict[str, float | None]
    origin: dict[str, int] | None = None  # absent, extra, hash_mismatch, pending (with --origin-too)
    inconsistent: int = 0  # copies whose Nats-Msg-Id disagrees with their Bridge-* provenance
    examples: dict[str, list[list[int]]] = field(default_factory=dict)  # kind -> first ranges [first, last]

    @property
    def problems(self) -> list[str]:
        """One phrase per kind of damage found; empty when the source is clean."""
        found = []
        for count, what in (
            (self.lost, "lost"),
            (self.duplicates, "duplicated"),
            (self.reordered, "out of order"),
            (self.inconsistent, "with inconsistent provenance"),
        ):
            if count:
                found.append(f"{count} {what}")
        if self.origin:
            for kind, what in (("absent", "absent"), ("extra", "extra"), ("hash_mismatch", "payload mismatch")):
                if self.origin.get(kind):
                    found.append(f"{self.origin[kind]} {what}")
        return found

    @property
    def ok(self) -> bool:
        """No damage."""
        return not self.problems

    def parquet_row(self) -> tuple[Any, ...]:
        """This report as a row of :meth:`parquet_schema`."""
        o = self.origin or {}
        lat = self.latency_ms
        return (
            self.source,
            self.origin_stream,
            self.copies,
            self.distinct,
            self.first_seq,
            self.last_seq,
            self.chain_start,
            self.duplicates,
            self.reordered,
            self.lost,
            self.skipped,
            self.not_delivered,
            self.inconsistent,
            o.get("absent"),
            o.get("extra"),
            o.get("hash_mismatch"),
            o.get("pending"),
            lat.get("p50"),
            lat.get("p90"),
            lat.get("p99"),
            lat.get("max"),
            self.ok,
        )

    @staticmethod
    def parquet_schema() -> str:
        """The Spark DDL schema of the per-source Parquet results."""
        return (
            "source string, origin_stream string, copies long, distinct long, first_seq long, last_seq long, "
            "chain_start long, duplicates long, reordered long, lost long, skipped long, not_delivered long, "
            "inconsistent_provenance long, absent long, extra long, hash_mismatch long, pending long, "
            "latency_p50_ms double, latency_p90_ms double, latency_p99_ms double, latency_max_ms double, ok boolean"
        )


@dataclass
class AuditReport:
    """The whole audit."""

    aggregate: dict[str, Any]
    foreign: int  # aggregate messages without the bridge's provenance (not judged)
    sources: list[SourceReport]
    origin_checked: bool
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No source is damaged."""
        return all(s.ok for s in self.sources)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {
            "verdict": "clean" if self.ok else "damaged",
            "aggregate": self.aggregate,
            "foreign_messages": self.foreign,
            "origin_checked": self.origin_checked,
            "seconds": self.seconds,
            "sources": [{**asdict(s), "ok": s.ok, "problems": s.problems} for s in self.sources],
        }


def _ranges_text(ranges: list[list[int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render_table(report: AuditReport) -> str:
    """The verdict as a fixed-width table, then the first ranges of each kind of damage and of skips."""
    head = ("source", "origin", "copies", "origin seqs", "lost", "dup", "order", "skipped", "gone", "p50 ms", "p99 ms")
    rows = [head]
    for s in report.sources:
        span = "-" if s.first_seq is None else f"{s.first_seq}..{s.last_seq}"
        rows.append(
            (
                s.source,
                s.origin_stream,
                str(s.copies),
                span,
                str(s.lost),
                str(s.duplicates),
                str(s.reordered),
                str(s.skipped),
                str(s.not_delivered),
                _ms(s.latency_ms.get("p50")),
                _ms(s.latency_ms.get("p99")),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for s in report.sources:
        if s.origin is not None:
            o = s.origin
            lines.append(
                f"{s.source}: origin compared: {o.get('absent', 0)} absent, {o.get('extra', 0)} extra, "
                f"{o.get('hash_mismatch', 0)} payload mismatches, {o.get('pending', 0)} not replicated yet"
            )
        for kind, ranges in sorted(s.examples.items()):
            lines.append(f"{s.source}: {kind}: {_ranges_text(ranges)}")
        if not s.configured:
            lines.append(f"{s.source}: found in the aggregate but not in the configuration")
    if report.foreign:
        lines.append(f"{report.foreign} aggregate messages carry no bridge provenance (not judged)")
    verdict = "CLEAN" if report.ok else "DAMAGED"
    detail = "; ".join(f"{s.source}: {', '.join(s.problems)}" for s in report.sources if not s.ok)
    lines.append(f"verdict: {verdict}" + (f" ({detail})" if detail else "") + f" in {report.seconds:g}s")
    return "\n".join(lines)


def write_json(report: AuditReport, path: Path) -> None:
    """Write the report as JSON."""
    path.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")


_GAP_COLOURS = {"lost": "tab:red", "skipped": "tab:orange", "duplicate": "tab:purple", "reordered": "tab:brown"}


def write_chart(latency: list[dict[str, Any]], gaps: list[dict[str, Any]], path: Path) -> None:
    """Replication latency (p50, p99) and the gaps found, over aggregate time, one line per source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=(3, 2))
    t0 = min([p["t"] for p in latency] + [g["t"] for g in gaps], default=0.0)
    for source in sorted({p["source"] for p in latency}):
        points = [p for p in latency if p["source"] == source]
        xs = [p["t"] - t0 for p in points]
        (line,) = top.plot(xs, [p["p50"] for p in points], marker=".", label=f"{source} p50")
        top.plot(
            xs, [p["p99"] for p in points], marker=".", linestyle="--", color=line.get_color(), label=f"{source} p99"
        )
    top.set_ylabel("replication latency (ms)")
    top.set_yscale("symlog", linthresh=1.0)
    if latency:
        top.legend(fontsize="small", ncol=2)
    top.set_title("nats-bridge audit: origin store time to aggregate store time")
    for kind in sorted({g["kind"] for g in gaps}):
        points = [g for g in gaps if g["kind"] == kind]
        bottom.scatter(
            [g["t"] - t0 for g in points],
            [g["count"] for g in points],
            s=12,
            color=_GAP_COLOURS.get(kind, "tab:gray"),
            label=kind,
        )
    bottom.set_yscale("symlog", linthresh=1.0)
    bottom.set_ylabel("origin sequences per gap")
    bottom.set_xlabel("seconds since the first copy")
    if gaps:
        bottom.legend(fontsize="small")
    else:
        bottom.text(0.5, 0.5, "no lost or skipped ranges", ha="center", va="center", transform=bottom.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
