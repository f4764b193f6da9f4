"""``bench.fanin``'s pure parts: names, the bridge configuration, the search, the verdicts and the log reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.fanin import (
    SEARCH_RESOLUTION,
    TARGET_P99_MS,
    BridgeLog,
    FaninRun,
    LatencyStats,
    Production,
    bridge_connections,
    cpu_timeline,
    fanin_config,
    holds,
    latency_stats,
    markdown,
    metric_sums,
    next_count,
    origin_config,
    per_unit,
    search_outcome,
    search_table,
    source_names,
    source_of_subject,
    targets,
    timeline,
    troubled_sources,
    unbound_sources,
    worst_source,
)
from bridge.config import load_config


def test_source_names_are_padded_and_distinct() -> None:
    names = source_names(3)
    assert [n.source for n in names] == ["s000", "s001", "s002"]
    assert names[2].stream == "ORIGIN_002"
    assert names[2].subject == "o.002.m"
    assert names[2].prefix == "edge.s002"
    wide = source_names(1500)
    assert wide[7].source == "s0007" and wide[-1].stream == "ORIGIN_1499"
    assert len({n.subject for n in wide}) == 1500
    with pytest.raises(ValueError):
        source_names(0)


def test_a_copy_subject_names_its_source() -> None:
    names = source_names(12)[11]
    assert source_of_subject(f"{names.prefix}.{names.subject}") == "s011"
    with pytest.raises(ValueError):
        source_of_subject("orders.1")


def test_origin_config_captures_the_source_subject() -> None:
    config = origin_config(source_names(5)[4])
    assert config["name"] == "ORIGIN_004"
    assert config["subjects"] == ["o.004.>"]
    assert config["retention"] == "workqueue" and config["allow_direct"] is True


def test_the_configuration_is_one_the_bridge_accepts(tmp_path: Path) -> None:
    names = source_names(3)
    path = tmp_path / "bridge.toml"
    path.write_text(fanin_config("nats://127.0.0.1:4222", names, mode="flow_control", bucket="other"))
    config = load_config(path, environ={})
    assert [s.name for s in config.sources] == ["s000", "s001", "s002"]
    source = config.sources[1]
    assert source.stream == "ORIGIN_001" and source.domain == "leaf" and source.mode == "flow_control"
    assert source.subject_prefix == "edge.s001" and source.consumer == "nats-bridge-s001"
    assert config.target.stream == "AGG" and config.http.listen == "127.0.0.1:0"
    assert config.coordination.bucket == "other" and config.coordination.enabled
    default = tmp_path / "default.toml"
    default.write_text(fanin_config("nats://127.0.0.1:4222", names))
    assert load_config(default, environ={}).coordination.bucket == "nats-bridge"
    default.write_text(fanin_config("nats://127.0.0.1:4222", names, leases=False, max_ack_pending=5000))
    loaded = load_config(default, environ={})
    assert not loaded.coordination.enabled
    assert [s.max_ack_pending for s in loaded.sources] == [5000] * 3
    assert config.sources[0].max_ack_pending == 1000  # the bridge's default when not given


def test_latency_stats_and_the_worst_source() -> None:
    stats = latency_stats([1.0, 2.0, 3.0, 100.0])
    assert stats.count == 4 and stats.p50_ms == 2.5 and stats.max_ms == 100.0
    per_source = {"s001": latency_stats([1.0, 2.0]), "s002": latency_stats([9.0]), "s000": latency_stats([9.0])}
    name, worst = worst_source(per_source) or ("", stats)
    assert name == "s000" and worst.max_ms == 9.0  # ties on p99 go to the first name
    assert worst_source({}) is None


def test_timeline_is_per_second_in_order() -> None:
    rows = timeline({1: [10.0, 30.0], 0: [1.0]})
    assert [row["second"] for row in rows] == [0, 1]
    assert rows[1]["count"] == 2 and rows[1]["p50_ms"] == 20.0


def test_unbound_sources_needs_owner_and_bound() -> None:
    body = {
        "sources": {
            "s000": {"role": "owner", "consumer_bound": True},
            "s001": {"role": "standby", "consumer_bound": True},
            "s002": {"role": "owner", "consumer_bound": False},
        }
    }
    assert unbound_sources(body, ["s000", "s001", "s002", "s003"]) == ["s001", "s002", "s003"]
    assert unbound_sources(None, ["s000"]) == ["s000"]


def test_troubled_sources() -> None:
    body = {
        "sources": {
            "s000": {"ready": True, "stalled": False, "blocked": None},
            "s001": {"ready": False, "stalled": True, "blocked": None},
            "s002": {"ready": False, "stalled": False, "blocked": "message too large"},
        }
    }
    assert troubled_sources(body) == {
        "stalled": ["s001"],
        "blocked": ["s002: message too large"],
        "not_ready": ["s001", "s002"],
    }
    assert troubled_sources(None) == {"stalled": [], "blocked": [], "not_ready": []}


def test_bridge_connections_counts_by_name() -> None:
    connz = {
        "connections": [
            {"name": "nats-bridge target"},
            {"name": "nats-bridge source s000"},
            {"name": "bench fanin hub"},
            {},
        ]
    }
    assert bridge_connections(connz) == 2
    assert bridge_connections({}) == 0


def test_per_unit() -> None:
    assert per_unit(201, 2, 200) == 1.0
    assert per_unit(None, 2, 200) is None
    assert per_unit(10, 2, 1) is None


def _search(capacity: int, start: int = 200, maximum: int = 6400) -> list[int]:
    """The counts the search tries on a machine that holds up to ``capacity`` sources."""
    results: dict[int, bool] = {}
    tried = []
    while (n := next_count(results, start, maximum)) is not None:
        assert n not in results
        tried.append(n)
        results[n] = n <= capacity
        assert len(tried) < 40
    return tried


def test_search_doubles_then_bisects() -> None:
    tried = _search(1000)
    assert tried[:4] == [200, 400, 800, 1600]
    results = {n: n <= 1000 for n in tried}
    low, high = search_outcome(results)
    assert low <= 1000 and high is not None and high > 1000
    assert high - low <= max(1, SEARCH_RESOLUTION * high)


def test_search_stops_at_the_maximum_when_everything_holds() -> None:
    assert _search(10**6, maximum=1000) == [200, 400, 800, 1000]
    assert search_outcome({200: True, 400: True}) == (400, None)


def test_search_goes_below_the_start_when_it_fails() -> None:
    tried = _search(30)
    assert tried[0] == 200 and tried[1] == 100
    low, _ = search_outcome({n: n <= 30 for n in tried})
    assert 0 < low <= 30


@given(st.integers(1, 5000), st.integers(1, 400), st.integers(1, 8000))
def test_search_always_ends_with_a_tight_bracket(capacity: int, start: int, maximum: int) -> None:
    tried = _search(capacity, start, maximum)
    assert all(1 <= n <= maximum for n in tried)
    low, high = search_outcome({n: n <= capacity for n in tried})
    assert low <= capacity
    if high is not None:
        assert high > capacity and high - low <= max(1, SEARCH_RESOLUTION * high)
    else:
        assert low == min(maximum, max(tried))


def _held_run() -> FaninRun:
    run = FaninRun(role="search", sources=200, rate=10.0, seconds=20.0, size=256, ok=True)
    run.startup_s = 5.0
    run.production = Production(planned=40_000, planned_rate=2000.0, sent=40_000, achieved_rate=1999.0)
    run.worst_source, run.worst_p99_ms = "s001", 20.0
    run.rss_idle_bytes = run.rss_peak_bytes = 80_000_000
    run.troubled = {"stalled": [], "blocked": [], "not_ready": []}
    run.ready_at_end = True
    return run


def test_holds_names_every_reason() -> None:
    assert holds(_held_run(), rss_limit=300_000_000) == []
    run = _held_run()
    run.startup_s = 31.0
    run.worst_p99_ms, run.sources_over_target = TARGET_P99_MS + 1, 3
    run.troubled["stalled"] = ["s004"]
    run.rss_peak_bytes = 400_000_000
    assert run.production is not None
    run.production.achieved_rate = 1000.0
    run.warnings = {"lease.lost": 7}
    run.ready_at_end = False
    reasons = holds(run, rss_limit=300_000_000)
    assert [r.split(" ")[0] for r in reasons] == ["start-up", "producer:", "p99", "1", "/readyz", "7", "RSS"]
    failed = _held_run()
    failed.ok, failed.error = False, "boom"
    assert holds(failed, rss_limit=300_000_000) == ["failed: boom"]


def test_targets_and_markdown() -> None:
    main = _held_run()
    main.role, main.rate = "main", 100.0
    main.latency = LatencyStats(1000, 1.0, 5.0, 9.0)
    main.hub_bridge_connections, main.bridge_sockets = 201, 204
    baseline = FaninRun(role="baseline", sources=1, rate=100.0, seconds=0.0, size=256, ok=True)
    baseline.rss_idle_bytes, baseline.hub_bridge_connections = 80_000_000 - 199 * 150_000, 2
    search = {"largest_held": 800, "first_failing": 1600, "bound": "start-up 40.0 s >= 30 s"}
    items = targets(main, baseline, search)
    figures = {t.figure: t for t in items}
    assert figures["every source's replication p99 (200 sources x 100 msg/s)"].verdict == "met"
    assert figures["connections per source (bridge's, on the hub)"].measured.startswith("1.00")
    assert figures["memory per source (idle RSS, N vs 1 source)"].measured.startswith("bridge 150 kB")
    assert figures["largest source count at 10 msg/s each"].measured.startswith("800 (first not held: 1600")
    text = markdown(items, "### header")
    assert text.startswith("### header\n\n| figure |") and text.count("\n|") == len(items) + 2
    json.dumps(main.as_dict())  # the JSON document takes it as it is


def test_bridge_log_follows_a_growing_file(tmp_path: Path) -> None:
    path = tmp_path / "bridge.log"
    log = BridgeLog(path)
    log.poll()  # no file yet
    events = [
        {"event": "source.mode", "source": "s000", "mode": "flow_control", "level": "info"},
        {"event": "reset.requested", "source": "s000", "cause": "start", "level": "info"},
        {"event": "reset.done", "source": "s000", "level": "info", "timestamp": "1970-01-01T00:00:01.5Z"},
        {"event": "reset.requested", "source": "s000", "cause": "silence", "level": "info"},
        {"event": "reset.done", "source": "s000", "level": "info", "timestamp": "1970-01-01T00:00:09Z"},
        {"event": "lease.lost", "source": "s000", "level": "error"},
    ]
    text = "=== starting bridge ===\n" + "".join(json.dumps(e) + "\n" for e in events)
    path.write_text(text[:-20])  # a line cut short: taken once it is whole
    log.poll()
    assert log.ready_ns == {"s000": 1_500_000_000}
    assert log.warnings == {}
    with path.open("a") as f:
        f.write(text[-20:])
    log.poll()
    assert log.warnings == {"lease.lost": 1}
    assert log.unplanned_resets() == {"silence": 1}
    assert log.mode_counts() == {"flow_control": 1}


def test_search_table_has_a_row_per_step() -> None:
    baseline = FaninRun(role="baseline", sources=1, rate=10.0, seconds=0.0, size=256, ok=True)
    baseline.rss_idle_bytes = 50_000_000
    held = _held_run()
    failed = _held_run()
    failed.sources, failed.startup_s = 400, 45.0
    steps = [
        {"sources": 200, "held": True, "reasons": [], "run": held.as_dict()},
        {"sources": 400, "held": False, "reasons": holds(failed, rss_limit=10**9), "run": failed.as_dict()},
    ]
    table = search_table({"steps": steps}, baseline).splitlines()
    assert len(table) == 4
    assert table[2].startswith("| 200 | yes | 5.0 | 20 | 80 | 80 | 151 |")
    assert table[3].startswith("| 400 | no | 45.0 |") and "start-up 45.0 s >= 30 s" in table[3]


def test_metric_sums_adds_up_labels() -> None:
    text = "\n".join(
        [
            "# HELP nats_bridge_deliveries_total Messages delivered.",
            "# TYPE nats_bridge_deliveries_total counter",
            'nats_bridge_deliveries_total{source="s000"} 10.0',
            'nats_bridge_deliveries_total{source="s001"} 5.0',
            'nats_bridge_deliveries_created{source="s000"} 1.7e9',
            "nats_bridge_target_connected 1.0",
        ]
    )
    assert metric_sums(text, ["nats_bridge_deliveries", "nats_bridge_missing"]) == {
        "nats_bridge_deliveries": 15.0,
        "nats_bridge_missing": 0.0,
    }


def test_cpu_timeline_counts_each_interval_in_the_second_it_ends() -> None:
    samples = [(10.0, [0.0, 1.0]), (10.5, [0.25, 1.0]), (11.0, [0.5, 1.5]), (11.5, [1.0, 1.5])]
    rows = cpu_timeline(samples, 10.0, ("bridge", "hub"))
    assert rows == [
        {"second": 0.0, "bridge": 0.5, "hub": 0.0},
        {"second": 1.0, "bridge": 0.75, "hub": 0.5},
    ]
    assert cpu_timeline(samples[:1], 10.0, ("bridge", "hub")) == []
