"""``bench.recovery``'s pure parts: the bridge's log read per run, milestones, checks of the new copies, the summary."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import recovery as rc
from bench.runner import SOURCE, bridge_config
from bridge.core import headers as hdr

SPAWN_NS = 1_795_655_427_000_000_000  # 2026-11-26T01:10:27Z


def event(name: str, at: str, **fields: object) -> str:
    return json.dumps({"event": name, "level": "info", "timestamp": f"2026-11-26T01:10:{at}Z", **fields})


def test_run_events_reads_only_the_latest_run() -> None:
    log = "\n".join(
        [
            "=== 01:10:20 starting bridge ===",
            event("recovery.done", "21.000000", copies_read=5),
            "Traceback (most recent call last):",
            "=== 01:10:27 starting bridge ===",
            event("http.listening", "27.350000"),
            "{not json",
            event("recovery.done", "27.500000", copies_read=0),
        ]
    )
    events = rc.run_events(log)
    assert [e["event"] for e in events] == ["http.listening", "recovery.done"]
    assert rc.first_event(events, "recovery.done") == events[1]
    assert rc.first_event(events, "recovery.done", copies_read=5) is None
    # a log without a marker is one run
    assert len(rc.run_events(event("a", "27.0") + "\n" + event("b", "28.0"))) == 2


def test_milestones_are_seconds_from_spawn_to_each_first_event() -> None:
    events = rc.run_events(
        "\n".join(
            [
                event("http.listening", "27.350000"),
                event("target.connected", "27.352000"),
                event("lease.acquired", "36.000000"),
                event("lease.acquired", "40.000000"),  # a later one does not move the milestone
                event("recovery.done", "36.250000"),
                json.dumps({"event": "no.timestamp"}),
            ]
        )
    )
    got = rc.milestones(events, SPAWN_NS)
    assert got[rc.FIRST_LOG] == pytest.approx(0.35)
    assert got["target.connected"] == pytest.approx(0.352)
    assert got["lease.acquired"] == pytest.approx(9.0)
    assert got["recovery.done"] == pytest.approx(9.25)
    assert "consumer.bound" not in got


def test_without_subject_prefix_drops_only_that_line() -> None:
    text = bridge_config("nats://h", "nats://l", "sidecar", 1000)
    assert "subject_prefix" in text
    stripped = rc.without_subject_prefix(text)
    assert "subject_prefix" not in stripped
    assert len(stripped.splitlines()) == len(text.splitlines()) - 1
    with pytest.raises(ValueError):
        rc.without_subject_prefix(stripped)


def test_shared_split_puts_the_larger_half_first() -> None:
    assert rc.shared_split(1_000_000) == (500_000, 500_000)
    assert rc.shared_split(5) == (3, 2)


def copy_headers(seq: int, source: str = SOURCE) -> dict[str, str]:
    block = hdr.build_header_block(
        None, source=source, stream="ORIGIN", stream_seq=seq, prev_seq=seq - 1, subject="orders.1", timestamp_ns=1
    )
    return hdr.parse_header_block(block)


def test_check_new_copies_wants_each_new_sequence_once() -> None:
    expected = range(101, 104)
    assert rc.check_new_copies([copy_headers(s) for s in (103, 101, 102)], expected) is None
    duplicate = rc.check_new_copies([copy_headers(s) for s in (101, 102, 102, 103)], expected)
    assert duplicate is not None and "1 duplicate(s)" in duplicate
    missing = rc.check_new_copies([copy_headers(s) for s in (101, 103)], expected)
    assert missing is not None and "1 missing" in missing
    other = rc.check_new_copies([copy_headers(101), copy_headers(102, "leaf2")], expected)
    assert other is not None and "leaf2" in other


def restart(kind: str, rep: int, *, ok: bool = True, copies: int = 0, recovered: float = 0.5) -> rc.RestartRun:
    return rc.RestartRun(
        variant=rc.PREFIX,
        kind=kind,
        rep=rep,
        new_messages=100,
        ok=ok,
        error=None if ok else "boom",
        aggregate_messages=1_000_000,
        copies_read=copies,
        recovery_read_s=0.02,
        spawn_to_recovered_s=recovered,
        spawn_to_first_new_s=recovered + 0.01,
        lease_wait_s=9.0 if kind == rc.SIGKILL else None,
    )


def test_summarize_gives_medians_per_variant_and_restart_kind() -> None:
    startup = [
        rc.StartupRun(rep=1, waiting=1000, ok=True, spawn_to_first_copy_s=0.4, milestones_s={"recovery.done": 0.38}),
        rc.StartupRun(rep=2, waiting=1000, ok=False, error="x"),
    ]
    v = rc.VariantRun(variant=rc.PREFIX, messages=1_000_000, own=1_000_000, other=0, ok=True)
    v.restarts = [
        restart(rc.SIGTERM, 1, recovered=0.4),
        restart(rc.SIGKILL, 1, copies=100, recovered=10.0),
        restart(rc.SIGTERM, 2, recovered=0.6),
        restart(rc.SIGKILL, 2, ok=False),
    ]
    v.replay = rc.Replay(floor=1_000_200, chunks=1, positions=1024, returned=1024)
    rows = rc.summarize(startup, [v])
    assert [(r.variant, r.restart, r.runs, r.failed) for r in rows] == [
        (rc.FRESH, "-", 2, 1),
        (rc.PREFIX, rc.SIGTERM, 2, 0),
        (rc.PREFIX, rc.SIGKILL, 2, 1),
    ]
    assert rows[0].first_copy_s == [0.4] and rows[0].recovered_s == [0.38]
    assert rows[1].recovered_s == [0.4, 0.6] and rows[1].examined == 1024
    assert rows[2].copies_read == [100.0] and rows[2].lease_wait_s == [9.0] and rows[2].examined is None
    table = rc.format_table(rows)
    assert "0.50 s (0.40-0.60)" in table and "1 FAILED" in table and "SIGKILL" in table
    markdown = rc.markdown_table(rows).splitlines()
    assert len(markdown) == 2 + len(rows)
    assert all(line.count("|") == len(rc.HEADERS) + 1 for line in markdown)


def test_formatting_of_missing_values_and_ranges() -> None:
    assert rc.fmt_seconds([]) == "-"
    assert rc.fmt_seconds([12.34]) == "12.3 s"
    assert rc.fmt_count([]) == "-"
    assert rc.fmt_count([5.0, 5.0]) == "5"
    assert rc.fmt_count([0.0, 100.0, 50.0]) == "50 (0-100)"


def test_startup_split_names_each_milestone_and_the_probe() -> None:
    runs = [
        rc.StartupRun(
            rep=1,
            waiting=1000,
            ok=True,
            spawn_to_first_copy_s=0.42,
            milestones_s={rc.FIRST_LOG: 0.35, "reset.done": 0.4},
        )
    ]
    line = rc.startup_split(runs, rc.Probe(interpreter_s=0.03, imports_s=0.25))
    assert "first log line 0.350" in line and "reset.done 0.400" in line and "first copy stored 0.420" in line
    assert "interpreter start 0.030 s" in line and "+0.250 s" in line
    assert "no successful start" in rc.startup_split([], rc.Probe())


def test_command_line_and_options() -> None:
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    rc.parser(sub)
    parser = sub.choices["recovery"]
    args = parser.parse_args(["--quick", "--variants", "prefix,no-prefix"])
    assert rc.command_line(args) == "python -m bench recovery --quick --variants prefix,no-prefix"
    assert rc.command_line(parser.parse_args([])) == "python -m bench recovery"
    assert rc.run(parser.parse_args(["--variants", "nonsense"])) == 2
