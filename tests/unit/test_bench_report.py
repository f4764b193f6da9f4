"""``bench.report`` and the bench's option parsing: summaries, the text table, targets, the RESULTS.md section."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.cli import default_messages, parse_retentions
from bench.common import parse_messages, parse_sizes
from bench.model import BRIDGE, BRIDGE_EDGE, NATIVE, BenchResults, LatencyRun, ThroughputRun
from bench.report import format_table, format_targets, markdown_section, size_label, summarize, targets


def _tp(
    path: str, rep: int, rate: float, *, size: int = 256, retention: str = "workqueue", ok: bool = True
) -> ThroughputRun:
    run = ThroughputRun(path=path, size=size, retention=retention, rep=rep, messages=1000, ok=ok)
    run.msgs_per_s, run.mb_per_s = rate, rate * size / 1e6
    run.startup_s = 0.1 if path == NATIVE else 0.5
    if path != NATIVE:
        run.bridge_peak_rss_bytes = 40_000_000 + rep
        run.bridge_cpu_s_per_million = 50.0 + rep
    if not ok:
        run.error = "boom"
    return run


def _lat(path: str, values: list[float], *, size: int = 256, retention: str = "workqueue") -> LatencyRun:
    run = LatencyRun(path=path, size=size, retention=retention, rep=1, rate=1000.0, seconds=1.0, ok=True)
    run.latencies_ms = values
    return run


def _results(throughput: list[ThroughputRun], latency: list[LatencyRun]) -> BenchResults:
    results = BenchResults(
        started="2026-11-22T08:00:00+00:00",
        command="python -m bench run",
        machine={"nproc": 2, "cpu_model": "AMD EPYC", "mem_total_bytes": 2**34, "kernel": "6.1", "python": "3.11"},
        revision={"commit": "abc123", "bridge_dirty": True},
        server_version="2.15.1",
        settings={
            "max_ack_pending": 1000,
            "messages_label": "1,000 (256 B)",
            "reps": 3,
            "latency_rate": 1000.0,
            "latency_seconds": 10.0,
            "latency_reps": 1,
            "edge": True,
        },
        throughput=throughput,
        latency=latency,
    )
    return results


def test_size_labels() -> None:
    assert [size_label(s) for s in (256, 1024, 16384, 1536)] == ["256 B", "1 KiB", "16 KiB", "1.5 KiB"]


def test_summary_pairs_repetitions_and_pools_latency() -> None:
    runs = [
        _tp(NATIVE, 1, 100.0),
        _tp(BRIDGE, 1, 50.0),
        _tp(BRIDGE_EDGE, 1, 60.0),
        _tp(NATIVE, 2, 200.0),
        _tp(BRIDGE, 2, 150.0),
        _tp(BRIDGE_EDGE, 2, 100.0),
        _tp(NATIVE, 3, 80.0),
        _tp(BRIDGE, 3, 0.0, ok=False),  # a failed run counts as a failure, never as a zero
    ]
    lat = [_lat(NATIVE, [1.0] * 99 + [5.0]), _lat(BRIDGE, [2.0] * 98 + [9.0, 9.0])]
    (s,) = summarize(runs, lat)
    assert s.native is not None and s.bridge is not None and s.ratio is not None and s.edge_ratio is not None
    assert (s.native.median, s.native.count) == (100.0, 3)
    assert (s.bridge.median, s.bridge.count) == (100.0, 2)
    assert (s.ratio.low, s.ratio.high, s.ratio.count) == (0.5, 0.75, 2)
    assert (s.edge_ratio.low, s.edge_ratio.high) == (0.5, 0.6)
    assert s.failed_runs == 1
    assert s.bridge_peak_rss_bytes == 40_000_002
    assert s.native_latency is not None and s.bridge_latency is not None
    assert s.native_latency.p50_ms == 1.0 and s.bridge_latency.p99_ms == pytest.approx(9.0)
    json.dumps(s.as_dict())  # JSON-able


def test_table_and_targets() -> None:
    runs = [_tp(NATIVE, 1, 80_000.0), _tp(BRIDGE, 1, 88_000.0), _tp(NATIVE, 1, 1000.0, size=1024)]
    lat = [_lat(NATIVE, [1.0, 2.0]), _lat(BRIDGE, [3.0, 5.0])]
    summaries = summarize(runs, lat)
    table = format_table(summaries)
    lines = table.splitlines()
    assert lines[0].startswith("size") and set(lines[1]) <= {"-", " "}
    assert "80,000" in lines[2] and "88,000" in lines[2] and "1.10" in lines[2]
    assert lines[3].split()[:3] == ["1", "KiB", "workqueue"] and " - " in lines[3]  # no bridge run: "-", not 0
    backlog = _tp(BRIDGE, 0, 20_000.0)
    backlog.messages, backlog.bridge_peak_rss_bytes = 1_000_000, 160_000_000
    items = targets(summaries, backlog, 1000.0)
    verdicts = {name.split(",")[-1].strip() if "latency" in name else name: met for name, _, met in items}
    assert verdicts["throughput bridge/native >= 1.0 at 256 B workqueue"] is True
    assert verdicts["throughput bridge/native >= 1.0 at 1 KiB workqueue"] is None
    assert verdicts["256 B workqueue"] is False  # p99 5 ms vs 2 ms native interpolated: > 2x
    assert verdicts["bridge peak RSS < 150 MB with a 1,000,000-message backlog"] is False
    backlog.messages = 20_000  # too small to judge the 1,000,000-message target
    assert targets(summaries, backlog, 1000.0)[-1][2] is None
    text = format_targets(items)
    assert "NOT MET" in text and "not measured" in text


def test_markdown_section_has_dated_rows_and_the_command() -> None:
    runs = [_tp(NATIVE, 1, 100.0), _tp(BRIDGE, 1, 50.0), _tp(NATIVE, 1, 10.0, retention="limits")]
    results = _results(runs, [])
    section = markdown_section(results, summarize(runs, []), "bench/results/x.json", None)
    rows = [line for line in section.splitlines() if line.startswith("| 2026-11-22 |")]
    assert len(rows) == 2
    assert "`python -m bench run`" in section and "2.15.1" in section and "uncommitted" in section
    assert "bench/results/x.json" in section and "chart" not in section.split("JSON")[-1]
    assert "changed during the run" not in section
    results.revision.update(bridge_changed_during_run=True, at_end={"commit": "def456"})
    assert "changed during the run**, commit def456" in markdown_section(results, [], "x.json", "x.png")


def test_option_parsing() -> None:
    assert parse_sizes("256,1KiB,16k") == (256, 1024, 16384)
    assert parse_retentions("WorkQueue,limits") == ("workqueue", "limits")
    assert parse_messages("5000") == 5000
    assert parse_messages("256=10,1k=20") == {256: 10, 1024: 20}
    assert default_messages(256, quick=False) == 200_000 and default_messages(300, quick=False) == 200_000
    assert default_messages(65536, quick=False) == 20_000 and default_messages(1024, quick=True) == 5_000
    for bad in (lambda: parse_sizes("0"), lambda: parse_retentions("interest"), lambda: parse_messages("0")):
        with pytest.raises(argparse.ArgumentTypeError):
            bad()
