"""``bench.edge``'s pure parts: the options, the leaf/source layout, the bridge configuration, the aggregate's
checker, the recovery figures, the storm's log reading and the figures/markdown."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import cli
from bench.edge import (
    DEFAULT_LEAVES,
    DEFAULT_RATE,
    DEFAULT_SECONDS,
    DEFAULT_SOURCES,
    FIGURES_HEADER,
    QUICK_LEAVES,
    QUICK_SOURCES,
    EdgeLog,
    EdgeRun,
    by_leaf,
    check_sequences,
    edge_config,
    figures_row,
    layout,
    leaf_domain,
    options,
    recovery_times,
    targets,
)
from bench.fanin import Production, markdown
from bridge.config import load_config


def _args(*argv: str) -> argparse.Namespace:
    return cli._parser().parse_args(["edge", *argv])


def test_defaults_quick_and_given_sizes() -> None:
    full = options(_args())
    assert (full.leaves, full.sources, full.rate, full.seconds) == (
        DEFAULT_LEAVES,
        DEFAULT_SOURCES,
        DEFAULT_RATE,
        DEFAULT_SECONDS,
    )
    quick = options(_args("--quick"))
    assert (quick.leaves, quick.sources) == (QUICK_LEAVES, QUICK_SOURCES)
    given_ = options(_args("--quick", "--sources", "1000", "--leaves", "20", "--rate", "0.5", "--seconds", "12"))
    assert (given_.leaves, given_.sources, given_.rate, given_.seconds) == (20, 1000, 0.5, 12.0)
    assert given_.down == 3.0


@pytest.mark.parametrize("argv", [["--sources", "0"], ["--leaves", "-1"], ["--rate", "0"], ["--seconds", "x"]])
def test_bad_sizes_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _args(*argv)


def test_layout_spreads_sources_round_robin() -> None:
    sources = layout(5, 2)
    assert [s.names.source for s in sources] == ["s0000", "s0001", "s0002", "s0003", "s0004"]
    assert [s.leaf for s in sources] == [0, 1, 0, 1, 0]
    assert [s.domain for s in sources[:2]] == ["leaf00", "leaf01"]
    assert sources[3].names.stream == "ORIGIN_0003" and sources[3].names.subject == "o.0003.m"
    assert sources[3].names.prefix == "edge.s0003" and sources[3].probe_subject == "o.0003.probe"
    assert [[s.names.source for s in group] for group in by_leaf(sources, 3)] == [
        ["s0000", "s0002", "s0004"],
        ["s0001", "s0003"],
        [],
    ]
    assert layout(12000, 1)[-1].names.source == "s11999"
    assert leaf_domain(19) == "leaf19"
    for bad in ((0, 1), (1, 0), (10, 101)):
        with pytest.raises(ValueError):
            layout(*bad)


@given(st.integers(1, 300), st.integers(1, 30))
def test_layout_is_balanced_and_distinct(sources: int, leaves: int) -> None:
    out = layout(sources, leaves)
    sizes = [len(group) for group in by_leaf(out, leaves)]
    assert sum(sizes) == sources and max(sizes) - min(sizes) <= 1
    assert len({s.names.subject for s in out}) == sources
    assert len({s.names.prefix for s in out}) == sources


def test_the_configuration_is_one_the_bridge_accepts(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(edge_config("nats://127.0.0.1:4222", layout(3, 2)))
    config = load_config(path, environ={})
    assert [s.name for s in config.sources] == ["s0000", "s0001", "s0002"]
    assert [s.domain for s in config.sources] == ["leaf00", "leaf01", "leaf00"]
    source = config.sources[1]
    assert source.stream == "ORIGIN_0001" and source.subject_prefix == "edge.s0001"
    assert source.servers == ["nats://127.0.0.1:4222"]  # beside the hub: every source reaches its leaf through it
    assert config.target.stream == "AGG" and config.http.listen == "127.0.0.1:0"
    assert config.coordination.enabled  # leases on, the defaults otherwise
    default = load_config(_write(tmp_path, MINIMAL), environ={})
    assert config.coordination == default.coordination and config.engine == default.engine


MINIMAL = """[target]
servers = ['nats://h:1']
stream = 'AGG'

[[sources]]
name = 'x'
servers = ['nats://h:1']
stream = 'S'
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "minimal.toml"
    path.write_text(text)
    return path


def test_the_checker_passes_exact_runs() -> None:
    copies = [("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3)]
    check = check_sequences(copies, {"a": 3, "b": 2})
    assert check.ok and check.copies == 5 and check.expected == 5 and not check.bad
    assert "0 missing, 0 duplicated, 0 reordered" in check.summary()


def test_the_checker_finds_each_fault() -> None:
    check = check_sequences([("a", 1), ("a", 3)], {"a": 3})
    assert (check.missing, check.duplicates, check.reordered, check.unexpected) == (1, 0, 0, 0)
    assert "first [2]" in check.bad["a"] and not check.ok
    check = check_sequences([("a", 1), ("a", 2), ("a", 2)], {"a": 2})
    assert (check.missing, check.duplicates, check.reordered) == (0, 1, 0)
    check = check_sequences([("a", 2), ("a", 1)], {"a": 2})
    assert (check.missing, check.duplicates, check.reordered) == (0, 0, 1)
    check = check_sequences([("a", 1), ("a", 4), ("x", 1)], {"a": 1})
    assert check.unexpected == 2 and check.missing == 0
    check = check_sequences([], {"a": 2, "b": 1})
    assert check.missing == 3 and set(check.bad) == {"a", "b"}


@given(st.lists(st.integers(1, 20), max_size=60))
def test_the_checker_agrees_with_the_definition(seqs: list[int]) -> None:
    n = 10
    check = check_sequences([("a", s) for s in seqs], {"a": n})
    assert check.ok == (seqs == list(range(1, n + 1)))


def test_recovery_times_from_the_links_return() -> None:
    out = recovery_times({"a": 2_000_000_000, "b": 5_000_000_000}, 1_000_000_000, ["a", "b", "c"])
    assert out["max_s"] == 4.0 and out["slowest"] == "b" and out["median_s"] == 2.5
    assert out["replicated"] == 2 and out["missing"] == ["c"]
    assert "max_s" not in recovery_times({}, 0, ["a"])


def _line(event: str, stamp: str, **fields: object) -> str:
    return json.dumps({"event": event, "timestamp": stamp, "level": "warning", **fields}) + "\n"


def test_the_log_counts_the_storm_from_its_mark(tmp_path: Path) -> None:
    path = tmp_path / "bridge.log"
    log = EdgeLog(path)
    path.write_text(
        _line("reset.done", "2026-01-01T00:00:01Z", source="s0000")
        + _line("lease.renew_failed", "2026-01-01T00:00:02Z")
    )
    log.poll()
    assert log.since_mark == {} and "s0000" in log.ready_ns
    log.mark_ns = 1767225605_000_000_000  # 2026-01-01T00:00:05Z
    with path.open("a") as f:
        f.write(_line("lease.renew_failed", "2026-01-01T00:00:04Z"))  # logged before the mark
        f.write(_line("lease.lost", "2026-01-01T00:00:06Z", source="s0001"))
        f.write(_line("source.fenced", "2026-01-01T00:00:06.5Z", source="s0001"))
        f.write(_line("reset.requested", "2026-01-01T00:00:07Z", source="s0001", cause="silence"))
    log.poll()
    assert {k: len(v) for k, v in log.since_mark.items()} == {"lease.lost": 1, "source.fenced": 1}
    assert log.resets_since_mark == {"silence": 1}
    assert log.warnings["lease.renew_failed"] == 2  # fan-in's counts are the whole run's


def _finished() -> EdgeRun:
    run = EdgeRun(leaves=20, sources=1000, rate=1.0, seconds=30.0, size=256, ok=True)
    run.startup_s, run.startup_first_s, run.startup_median_s, run.startup_readyz_s = 9.0, 1.0, 5.0, 9.5
    run.idle_cores, run.idle_seconds, run.rss_idle_bytes, run.rss_peak_bytes = 0.04, 5.0, 90_000_000, 160_000_000
    run.phase1 = Production(planned=15000, planned_rate=1000.0, sent=15000, achieved_rate=999.0)
    run.cpu_us_per_msg, run.cores_replicating = 100.0, 0.1
    run.recovery = recovery_times({"s0000": 3_000_000_000, "s0001": 13_000_000_000}, 1_000_000_000, ["s0000", "s0001"])
    run.storm_links_s = 4.2
    run.storm_events = {"lease.lost": 0, "source.fenced": 0, "lease.renew_failed": 3, "lease.suspended": 2}
    run.check = check_sequences([("s0000", 1)], {"s0000": 1})
    run.bridge_exit_code = 0
    return run


def test_targets_judge_each_figure() -> None:
    verdicts = {t.figure.split(":")[0].split(" (")[0]: t.verdict for t in targets(_finished())}
    assert verdicts["start-up"] == "met"
    assert verdicts["idle"] == "met"  # 0.04 <= 0.05 per 1,000 at 1,000 sources
    assert verdicts["bridge CPU per message at 1 msg/s per source"] == "met"
    assert verdicts["bridge RSS"] == "NOT met"  # 160 MB peak
    assert verdicts["after the storm"] == "NOT met"  # the slowest took 12 s
    assert verdicts["storm"] == "reported"
    assert verdicts["nothing lost, duplicated or reordered"] == "met"
    assert "the same log lines over the whole run" not in verdicts  # no lease event anywhere
    early = _finished()
    early.warnings = {"lease.lost": 21, "source.fenced": 300, "lease.suspended": 146}  # before the kill, mostly
    whole = [t for t in targets(early) if t.figure == "the same log lines over the whole run"]
    measured = "lease.lost 21, source.fenced 300, lease.renew_failed 0, lease.suspended 146"
    assert [t.measured for t in whole] == [measured]
    failed = _finished()
    failed.ok, failed.error = False, "BenchError: boom"
    assert targets(failed)[-1].measured == "FAILED: BenchError: boom"


def test_the_figures_row_and_markdown() -> None:
    run = _finished()
    row = figures_row("after", run)
    assert row.startswith("| after | 1000 / 20 | 9.0 | 0.040 | 100 | 160 | 12.00 (7.00) | 0 / 0 / 3 / 2 | ok | ok |")
    assert row.count("|") == FIGURES_HEADER.splitlines()[0].count("|")
    md = markdown(targets(run), "### Edge")
    assert md.startswith("### Edge\n\n| figure |") and "| bridge RSS | <= 150 MB |" in md
    empty = figures_row("before", EdgeRun(leaves=2, sources=10, rate=1.0, seconds=4.0, size=256))
    assert empty == "| before | 10 / 2 | - | - | - | - | - | - | - | FAILED |"
