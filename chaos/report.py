"""A chaos run's report: a text table for people, a JSON summary for tools, both written side by side.

Both name the fault kinds the run left out because they cannot apply in the bridge's mode (pull mode has no
``CONSUMER.RESET`` to inject), with the reason, so a pass is never read as covering them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from chaos.checker import example_unit
from chaos.model import FaultEvent, ScenarioResult, SourceVerdict

# (header, SourceVerdict counter); "faults" and "verdict" are per scenario and filled in separately
_COUNTERS: Final = (
    ("attempted", "attempted"),
    ("acked", "acked"),
    ("stored", "stored"),
    ("lost", "lost"),
    ("dup", "duplicated"),
    ("reord", "reordered"),
    ("unexp", "unexpected"),
    ("excused", "excused"),
    ("del<store", "deleted_before_stored"),
    ("stranded", "stranded"),
)
_HEADERS: Final = ("scenario", "source", "retention", "faults", *(h for h, _ in _COUNTERS), "verdict")
_LEFT_ALIGNED: Final = frozenset({"scenario", "source", "retention", "verdict"})
_FINDINGS: Final = ("lost", "duplicated", "reordered", "unexpected", "deleted_before_stored", "stranded")
_TOTALS: Final = ("attempted", "acked", "stored", *_FINDINGS[:4], "excused", *_FINDINGS[4:])


def format_table(
    results: Sequence[ScenarioResult], *, mode: str | None = None, skipped: Mapping[str, str] | None = None
) -> str:
    """The run as fixed-width text: one row per scenario and source and a TOTAL row, then, for each failing
    scenario, its problems, findings with examples, seed, replay command and fault timeline, then the fault kinds
    ``skipped`` in the bridge's ``mode`` (kind -> reason), and last an ``OVERALL: OK (...)`` or
    ``OVERALL: FAIL (...)`` line."""
    rows: list[list[str]] = []
    for result in results:
        # a scenario that produced no verdict (it failed before the check) still gets its row
        verdicts: list[SourceVerdict | None] = [*result.verdicts] or [None]
        for i, verdict in enumerate(verdicts):
            rows.append(_row(result, verdict, first=i == 0))
    total_row = [
        "TOTAL",
        "",
        "",
        str(sum(r.faults for r in results)),
        *(str(sum(r.total(name) for r in results)) for _, name in _COUNTERS),
        _verdict(_run_ok(results)),
    ]

    widths = [max(len(cells[i]) for cells in [list(_HEADERS), *rows, total_row]) for i in range(len(_HEADERS))]
    rule = "  ".join("-" * w for w in widths)
    lines = [_line(list(_HEADERS), widths), rule, *(_line(cells, widths) for cells in rows), rule]
    lines.append(_line(total_row, widths))

    for result in results:
        if not result.ok:
            lines.append("")
            lines.extend(_failure(result))

    if skipped:
        lines.append("")
        lines.append(f"skipped fault kinds ({mode or '?'} mode), not covered by this run:")
        lines.extend(f"  {kind}: {reason}" for kind, reason in skipped.items())

    lines.append("")
    lines.append(_overall(results))
    return "\n".join(lines) + "\n"


def summary(
    results: Sequence[ScenarioResult],
    *,
    command: str,
    seed: int,
    mode: str | None = None,
    skipped: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The run as JSON-ready data: the command and seed that reproduce it, the bridge's mode on the origin (when
    known), whether it passed, totals over all scenarios, the distinct faults injected, the kinds skipped as
    inapplicable in that mode (kind -> reason), and every scenario's own record."""
    totals: dict[str, Any] = {"scenarios": len(results), "faults": sum(r.faults for r in results)}
    for name in _TOTALS:
        totals[name] = sum(r.total(name) for r in results)
    totals["workload_seconds"] = round(sum(r.workload_seconds for r in results), 1)
    totals["wall_seconds"] = round(sum(r.wall_seconds for r in results), 1)
    kinds = {e.fault for r in results for e in r.timeline if e.action == "inject"}
    return {
        "command": command,
        "seed": seed,
        "mode": mode,
        "ok": _run_ok(results),
        "totals": totals,
        "fault_kinds": sorted(kinds),
        "skipped_fault_kinds": dict(skipped or {}),
        "scenarios": [r.to_json() for r in results],
    }


def write_report(
    directory: Path,
    results: Sequence[ScenarioResult],
    *,
    command: str,
    seed: int,
    mode: str | None = None,
    skipped: Mapping[str, str] | None = None,
) -> Path:
    """Write ``report.json`` (:func:`summary`) and ``report.txt`` (:func:`format_table`) into ``directory``,
    creating it; return the JSON file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / "report.json"
    data = summary(results, command=command, seed=seed, mode=mode, skipped=skipped)
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (directory / "report.txt").write_text(format_table(results, mode=mode, skipped=skipped), encoding="utf-8")
    return json_path


def format_event(event: FaultEvent) -> str:
    """One timeline line: ``+12.345s inject leaf-kill {"leaf": "edge1"}`` (the detail only when there is one)."""
    text = f"{event.at:+.3f}s {event.action} {event.fault}"
    if event.detail:
        text += " " + json.dumps(event.detail, sort_keys=True, default=str)
    return text


def _run_ok(results: Sequence[ScenarioResult]) -> bool:
    # a run that checked nothing has shown nothing, so it does not pass
    return bool(results) and all(r.ok for r in results)


def _verdict(ok: bool) -> str:
    return "OK" if ok else "FAIL"


def _row(result: ScenarioResult, verdict: SourceVerdict | None, *, first: bool) -> list[str]:
    faults = str(result.faults) if first else ""
    # a harness problem (no convergence, bad exit code) makes every source's numbers suspect, so every row fails
    if verdict is None:
        return [result.name, "-", "-", faults, *("-" for _ in _COUNTERS), _verdict(result.ok)]
    return [
        result.name,
        verdict.source,
        verdict.retention,
        faults,
        *(str(getattr(verdict, name)) for _, name in _COUNTERS),
        _verdict(verdict.ok and not result.problems),
    ]


def _line(cells: list[str], widths: list[int]) -> str:
    padded = (
        cell.ljust(width) if header in _LEFT_ALIGNED else cell.rjust(width)
        for cell, width, header in zip(cells, widths, _HEADERS, strict=True)
    )
    return "  ".join(padded).rstrip()


def _failure(result: ScenarioResult) -> list[str]:
    lines = [f"FAIL {result.name} (seed {result.seed})"]
    lines.extend(f"  problem: {problem}" for problem in result.problems)
    for verdict in result.verdicts:
        if verdict.ok:
            continue
        findings = []
        for kind in _FINDINGS:
            count = getattr(verdict, kind)
            if not count:
                continue
            examples = verdict.examples.get(kind)
            if examples:
                shown = " ".join(str(v) for v in examples)
                more = ", ..." if count > len(examples) else ""
                findings.append(f"{kind} {count} ({example_unit(verdict.source, kind)} {shown}{more})")
            else:
                findings.append(f"{kind} {count}")
        lines.append(f"  {verdict.source} ({verdict.retention}): " + ", ".join(findings))
    lines.append(f"  seed: {result.seed}")
    lines.append(f"  replay: {result.command}")
    if result.timeline:
        lines.append(f"  timeline ({result.faults} faults):")
        lines.extend(f"    {format_event(event)}" for event in result.timeline)
    else:
        lines.append("  timeline: (no faults)")
    return lines


def _overall(results: Sequence[ScenarioResult]) -> str:
    if not results:
        return "OVERALL: FAIL (no scenarios ran)"
    acked = sum(r.total("acked") for r in results)
    faults = sum(r.faults for r in results)
    stats = f"{acked} messages acked, {faults} faults"
    failed = sum(1 for r in results if not r.ok)
    if failed:
        return f"OVERALL: FAIL ({failed} of {len(results)} scenarios failed, {stats})"
    return f"OVERALL: OK ({len(results)} scenarios, {stats})"
