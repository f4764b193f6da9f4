"""``bridge.observe.metrics``: the exposition a scrape returns, and the bounded publish-error reasons."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bridge.core.targetwire import error_text
from bridge.observe.metrics import BridgeSnapshot, Metrics, SourceSnapshot, publish_error_reason


def _source(name: str, **fields: object) -> SourceSnapshot:
    base: dict[str, object] = {
        "source": name,
        "phase": "running",
        "origin_connected": True,
        "consumer_bound": True,
        "watermark": 120,
        "last_delivered": 125,
        "origin_pending": 30,
        "in_flight": 5,
        "backlog": 5,
        "replicated_messages": 120,
        "replicated_bytes": 12000,
        "deliveries": 126,
        "duplicates": 1,
        "fc_requests": 3,
        "fc_answers": 3,
        "resets": {"start": 1, "external": 2},
        "last_replicated_origin_time": 990.0,
    }
    base.update(fields)
    return SourceSnapshot(**base)  # type: ignore[arg-type]


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = b"".join(metrics.exposition()).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_scrape_reads_every_source_snapshot() -> None:
    metrics = Metrics()
    snap = BridgeSnapshot(
        target_connected=True,
        sources=(
            _source("a"),
            _source("b", origin_connected=False, blocked_reason="too large", stalled=True, rate_limit=65536),
        ),
        now=1000.0,
    )
    metrics.read_from(lambda: snap)
    s = _samples(metrics)
    a, b = (("source", "a"),), (("source", "b"),)
    assert s[("nats_bridge_replicated_messages_total", a)] == 120
    assert s[("nats_bridge_replicated_bytes_total", a)] == 12000
    assert s[("nats_bridge_stored_watermark", a)] == 120
    assert s[("nats_bridge_last_delivered_sequence", a)] == 125
    assert s[("nats_bridge_origin_pending_messages", a)] == 30
    assert s[("nats_bridge_publish_acks_outstanding", a)] == 5
    assert s[("nats_bridge_last_replicated_age_seconds", a)] == 10.0
    assert s[("nats_bridge_resets_total", (("cause", "external"), ("source", "a")))] == 2
    assert s[("nats_bridge_origin_connected", b)] == 0
    assert s[("nats_bridge_source_blocked", b)] == 1
    assert s[("nats_bridge_source_stalled", b)] == 1
    assert s[("nats_bridge_source_stalled", a)] == 0
    assert s[("nats_bridge_rate_limit_bytes_per_second", a)] == 0
    assert s[("nats_bridge_rate_limit_bytes_per_second", b)] == 65536
    assert s[("nats_bridge_target_connected", ())] == 1
    bridge = __import__("bridge")
    assert ("nats_bridge_build_info", (("core", bridge.CORE_BUILD), ("version", bridge.__version__))) in s


def test_the_mode_is_a_state_set_per_source() -> None:
    """One series per mode and source: 1 for the mode the source runs in, 0 for the other; all 0 until chosen."""
    metrics = Metrics()
    snap = BridgeSnapshot(
        target_connected=True,
        sources=(_source("a", mode="pull", mode_reason="configured"), _source("b", mode="flow_control"), _source("c")),
        now=1000.0,
    )
    metrics.read_from(lambda: snap)
    modes = {labels: value for (name, labels), value in _samples(metrics).items() if name == "nats_bridge_source_mode"}
    assert modes == {
        (("mode", "flow_control"), ("source", "a")): 0,
        (("mode", "pull"), ("source", "a")): 1,
        (("mode", "flow_control"), ("source", "b")): 1,
        (("mode", "pull"), ("source", "b")): 0,
        (("mode", "flow_control"), ("source", "c")): 0,
        (("mode", "pull"), ("source", "c")): 0,
    }


def test_the_mode_and_its_reason_are_in_the_readyz_view() -> None:
    chosen = _source("a", mode="pull", mode_reason="the durable consumer exists as a pull consumer").to_json(1000.0)
    assert (chosen["mode"], chosen["mode_reason"]) == ("pull", "the durable consumer exists as a pull consumer")
    unknown = _source("a").to_json(1000.0)  # the source has not connected yet: nothing chosen
    assert (unknown["mode"], unknown["mode_reason"]) == (None, None)


def test_per_event_metrics_are_labelled_by_source() -> None:
    metrics = Metrics()
    observers = metrics.observers("a")
    observers.latency.observe(0.02)
    observers.fc_latency.observe(0.001)
    observers.publish_error("no publish ack within 5s")
    observers.publish_error("maximum messages exceeded (code 400, err_code 10077)")
    s = _samples(metrics)
    assert s[("nats_bridge_replication_latency_seconds_count", (("source", "a"),))] == 1
    assert s[("nats_bridge_flow_control_answer_latency_seconds_count", (("source", "a"),))] == 1
    assert s[("nats_bridge_publish_errors_total", (("reason", "timeout"), ("source", "a")))] == 1
    assert s[("nats_bridge_publish_errors_total", (("reason", "limit"), ("source", "a")))] == 1


def test_a_removed_source_leaves_no_series() -> None:
    metrics = Metrics()
    for name in ("a", "b"):
        observers = metrics.observers(name)
        observers.latency.observe(0.02)
        observers.fc_latency.observe(0.001)
        observers.publish_error("no publish ack within 5s")
        observers.publish_error("something new")
    metrics.forget("a")
    metrics.forget("never-configured")  # nothing to drop: no error
    sources = {dict(labels).get("source") for (_, labels) in _samples(metrics)}
    assert "a" not in sources and "b" in sources
    assert _samples(metrics)[("nats_bridge_publish_errors_total", (("reason", "other"), ("source", "b")))] == 1
    metrics.observers("a").latency.observe(0.5)  # the name configured again: counted from zero
    assert _samples(metrics)[("nats_bridge_replication_latency_seconds_count", (("source", "a"),))] == 1


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("no publish ack within 5s", "timeout"),
        ("target not connected", "connection"),
        ("target connection lost", "connection"),
        ("message of 2000000 bytes exceeds the target's limit of 1048576 bytes", "too_large"),
        ("no responders: the target stream does not exist here", "no_stream"),
        ("maximum messages exceeded (code 503, err_code 10077)", "limit"),
        ("Permissions Violation for Publish to agg.x", "permission"),
        ("wrong last sequence (code 400, err_code 10071)", "rejected"),
        (error_text({"code": 409, "err_code": 10158, "description": "duplicate message id is in process"}), "rejected"),
        ("something new", "other"),
    ],
)
def test_publish_error_reasons_are_a_small_fixed_set(error: str, reason: str) -> None:
    assert publish_error_reason(error) == reason


def test_dashboard_and_alerts_use_only_metrics_the_bridge_exports() -> None:
    import re
    from pathlib import Path

    metrics = Metrics()
    metrics.read_from(lambda: BridgeSnapshot(target_connected=True, sources=(_source("a"),), now=1000.0))
    metrics.observers("a").publish_error("timeout")
    exported = set(b"".join(metrics.exposition()).decode().split())
    names = {token.split("{")[0] for token in exported if token.startswith("nats_bridge_")}
    config = Path(__file__).resolve().parents[2] / "config"
    for file in ("grafana-dashboard.json", "prometheus-alerts.yml"):
        used = set(re.findall(r"nats_bridge_[a-z_]+", (config / file).read_text()))
        assert used, file
        assert used <= names, f"{file} uses {sorted(used - names)}, not exported"


@given(st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), max_size=50))
def test_loop_histogram_exports_what_prometheus_client_would(values: list[float]) -> None:
    from prometheus_client import CollectorRegistry, Histogram

    from bridge.observe.metrics import LATENCY_BUCKETS

    reference_registry = CollectorRegistry()
    reference = Histogram(
        "nats_bridge_replication_latency_seconds",
        "Origin store time to the aggregate's publish ack, per replicated message.",
        ["source"],
        buckets=LATENCY_BUCKETS,
        registry=reference_registry,
    )
    metrics = Metrics()
    ours = metrics.observers("a").latency
    reference.labels("a")
    for value in values:
        ours.observe(value)
        reference.labels("a").observe(value)

    def histogram_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "nats_bridge_replication_latency_seconds"
            for sample in family.samples
            if not sample.name.endswith("_created")
        }

    theirs = histogram_samples(generate_latest(reference_registry).decode())
    mine = histogram_samples(b"".join(metrics.exposition()).decode())
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        assert mine[key] == pytest.approx(value)


@pytest.mark.parametrize(
    ("fields", "lag"),
    [
        ({"oldest_unstored_origin_time": 970.0}, 30.0),  # the oldest message waiting in the pipeline
        ({"origin_pending": 30}, 10.0),  # none delivered, more at the origin: the newest copy's age, an upper bound
        ({"origin_pending": 0}, 0.0),  # nothing waits
        ({"origin_pending": 30, "last_replicated_origin_time": None}, None),  # unknown: no series
    ],
)
def test_the_lag_in_seconds_is_the_age_of_the_oldest_message_not_stored(
    fields: dict[str, object], lag: float | None
) -> None:
    metrics = Metrics()
    metrics.read_from(lambda: BridgeSnapshot(target_connected=True, sources=(_source("a", **fields),), now=1000.0))
    assert _samples(metrics).get(("nats_bridge_lag_seconds", (("source", "a"),))) == lag
    assert _source("a", **fields).to_json(1000.0)["lag_seconds"] == lag


@given(
    st.lists(st.integers(min_value=0, max_value=2**62), max_size=20),
    st.integers(min_value=0, max_value=2**62),
)
def test_observing_the_ages_of_origin_times_is_observing_each_age(origins: list[int], now_ns: int) -> None:
    """``observe_age`` (compiled, called from the pipeline for each ack) counts what ``observe`` of the age would: an
    origin time in the future (another machine's clock) is an age of 0."""
    ages = Metrics().observers("a").latency
    each = Metrics().observers("a").latency
    for origin_ns in origins:
        ages.observe_age(origin_ns, now_ns)
    for origin_ns in origins:
        each.observe(max(0.0, (now_ns - origin_ns) / 1e9))
    assert ages.counts == each.counts and ages.sum == pytest.approx(each.sum)


@pytest.mark.parametrize(("rtt", "rtt_ms"), [(0.0535, 53.5), (None, None)])
def test_the_window_and_its_link_round_trip_are_shown(rtt: float | None, rtt_ms: float | None) -> None:
    """``nats_bridge_window_messages`` for every source; ``nats_bridge_link_rtt_seconds`` only once measured."""
    metrics = Metrics()
    source = _source("a", window=5888, link_rtt=rtt)
    metrics.read_from(lambda: BridgeSnapshot(target_connected=True, sources=(source,), now=1000.0))
    samples = _samples(metrics)
    assert samples.get(("nats_bridge_window_messages", (("source", "a"),))) == 5888
    assert samples.get(("nats_bridge_link_rtt_seconds", (("source", "a"),))) == rtt
    view = source.to_json(1000.0)
    assert view["window"] == 5888 and view["link_rtt_ms"] == rtt_ms
