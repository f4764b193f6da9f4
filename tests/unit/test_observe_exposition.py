"""``bridge.observe.exposition``: the text it writes is byte for byte what prometheus-client writes for the same
families (the format's rules: HELP and TYPE lines, counters' ``_total``, label order and escaping, Go's numbers)."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from bridge.core.histogram import LoopHistogram
from bridge.observe.exposition import Exposition, label, value_text
from bridge.observe.metrics import LATENCY_BUCKETS


class _Families(Collector):
    def __init__(self, families: Iterable[object]) -> None:
        self.families = list(families)

    def collect(self):  # type: ignore[no-untyped-def]
        yield from self.families


def reference(*families: object) -> bytes:
    registry = CollectorRegistry()
    registry.register(_Families(families))
    return generate_latest(registry)


NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
VALUES = st.one_of(
    st.integers(0, 10**12).map(float),
    st.floats(allow_nan=False),
    st.sampled_from([0.0, 0.1, 1e6, 123456789.0, float("inf"), float("-inf")]),
)


@given(st.lists(st.tuples(NAMES, VALUES), max_size=6), NAMES)
def test_counters_and_gauges_with_a_label(rows: list[tuple[str, float]], doc: str) -> None:
    for kind, family in (("counter", CounterMetricFamily), ("gauge", GaugeMetricFamily)):
        theirs = family("nats_bridge_x", doc, labels=["source"])
        for source, value in rows:
            theirs.add_metric([source], value)
        out = Exposition()
        out.family("nats_bridge_x", kind, doc, [(label("source", source), value) for source, value in rows])
        assert b"".join(out.chunks()) == reference(theirs)


def test_no_labels_two_labels_an_empty_family_and_info() -> None:
    plain = GaugeMetricFamily("nats_bridge_up", "Up.")
    plain.add_metric([], 1.0)
    two = CounterMetricFamily("nats_bridge_resets", 'Resets\\ by "cause".\nSecond line.', labels=["source", "cause"])
    two.add_metric(["a", "gap"], 2.0)
    empty = GaugeMetricFamily("nats_bridge_age_seconds", "Nothing yet.", labels=["source"])
    info = InfoMetricFamily("nats_bridge_build", "Build.")
    info.add_metric([], {"version": "1.2", "core": "compiled"})
    out = Exposition()
    out.family("nats_bridge_up", "gauge", "Up.", [("", 1.0)])
    doc = 'Resets\\ by "cause".\nSecond line.'
    out.family("nats_bridge_resets", "counter", doc, [(f"{label('cause', 'gap')},{label('source', 'a')}", 2.0)])
    out.family("nats_bridge_age_seconds", "gauge", "Nothing yet.", [])
    out.info("nats_bridge_build", "Build.", f"{label('core', 'compiled')},{label('version', '1.2')}")
    assert b"".join(out.chunks()) == reference(plain, two, empty, info)


@given(st.lists(st.floats(min_value=0, max_value=1000, allow_nan=False), max_size=30))
def test_a_histogram(values: list[float]) -> None:
    histogram = LoopHistogram(LATENCY_BUCKETS)
    histogram.observe_many(values)
    cumulative, buckets = 0, []
    for bound, count in zip((*LATENCY_BUCKETS, float("inf")), histogram.counts, strict=True):
        cumulative += count
        buckets.append((value_text(bound), float(cumulative)))
    theirs = HistogramMetricFamily("nats_bridge_latency_seconds", "Latency.", labels=["source"])
    theirs.add_metric(['we"ird'], buckets, histogram.sum)
    out = Exposition()
    out.histogram(
        "nats_bridge_latency_seconds",
        "Latency.",
        LATENCY_BUCKETS,
        [(label("source", 'we"ird'), histogram.counts, histogram.sum)],
    )
    assert b"".join(out.chunks()) == reference(theirs)
