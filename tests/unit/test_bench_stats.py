"""``bench.stats``: percentiles, spreads, server timestamps and ``/proc`` parsing used by the benchmark."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.stats import (
    ack_info,
    cpu_model,
    median,
    mem_total_bytes,
    parse_proc_stat_ticks,
    parse_rfc3339_ns,
    parse_status_kib,
    percentile,
    spread,
)


def test_percentile_interpolates_between_ranks() -> None:
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 50) == 25.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    assert percentile(list(map(float, range(1, 101))), 99) == pytest.approx(99.01)


def test_percentile_rejects_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


@given(st.lists(st.floats(-1e9, 1e9), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_lies_within_the_values_and_is_monotonic(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert min(values) <= p <= max(values)
    assert percentile(values, min(100.0, q + 1)) >= p - 1e-6 * max(1.0, abs(p))


def test_median_and_spread() -> None:
    assert median([5.0, 1.0, 3.0]) == 3.0
    s = spread([0.9, 1.2, 1.0])
    assert (s.median, s.low, s.high, s.count) == (1.0, 0.9, 1.2, 3)
    assert s.as_dict() == {"median": 1.0, "min": 0.9, "max": 1.2, "n": 3}
    with pytest.raises(ValueError):
        spread([])


def test_rfc3339_keeps_nanoseconds() -> None:
    assert parse_rfc3339_ns("1970-01-01T00:00:01.000000001Z") == 1_000_000_001
    assert parse_rfc3339_ns("2026-11-22T08:13:48.657247504Z") - parse_rfc3339_ns("2026-11-22T08:13:48.657247503Z") == 1
    assert parse_rfc3339_ns("1970-01-01T01:00:00+01:00") == 0
    assert parse_rfc3339_ns("1970-01-01T00:00:00.5Z") == 500_000_000


@given(st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1)))
def test_rfc3339_agrees_with_datetime_to_the_microsecond(when: dt.datetime) -> None:
    text = when.strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"
    expected = int(when.replace(tzinfo=dt.UTC).timestamp()) * 10**9 + when.microsecond * 1000 + 123
    assert parse_rfc3339_ns(text) == expected


def test_rfc3339_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_rfc3339_ns("yesterday")


def test_ack_info_reads_v1_and_v2_subjects() -> None:
    assert ack_info("$JS.ACK.AGG.4TUe7xNd.1.3.3.1795335243058723285.2") == (3, 1795335243058723285)
    assert ack_info("$JS.ACK.hub.AbCdEfGh.AGG.c.1.7.5.1795335243058723999.0") == (7, 1795335243058723999)
    assert ack_info("$JS.ACK.hub.AbCdEfGh.AGG.c.1.7.5.1795335243058723999.0.xyz") == (7, 1795335243058723999)
    for bad in ("_INBOX.abc", "$JS.ACK.AGG.c.1.2", "$JS.ACK.a.b.c.d.e.f.g.h.i.j.k.l.m"):
        with pytest.raises(ValueError):
            ack_info(bad)


def test_proc_parsing() -> None:
    stat = "4242 (python -m (bridge)) S 1 4242 4242 0 -1 4194560 9000 0 0 0 150 25 0 0 20 0 3 0 1234 0 0"
    assert parse_proc_stat_ticks(stat) == 175
    status = "Name:\tpython\nVmPeak:\t  300000 kB\nVmHWM:\t   48000 kB\nVmRSS:\t   47000 kB\n"
    assert parse_status_kib(status, "VmHWM") == 48000
    assert parse_status_kib(status, "VmRSS") == 47000
    assert parse_status_kib(status, "VmSwap") is None
    assert mem_total_bytes("MemTotal:       24683520 kB\nMemFree: 1 kB\n") == 24683520 * 1024
    assert cpu_model("processor\t: 0\nmodel name\t: AMD  EPYC 7B13\n") == "AMD EPYC 7B13"
    assert cpu_model("") == "unknown"
