"""``bridge.core.times.parse_rfc3339_ns``: server timestamps to integer nanoseconds, exactly."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.times import parse_rfc3339_ns


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T00:00:01.000000001Z", 1_000_000_001),
        ("2026-11-25T21:57:24.123456789Z", 1_795_643_844_123_456_789),
        ("2026-11-25T21:57:24.1Z", 1_795_643_844_100_000_000),  # Go's RFC3339Nano trims trailing zeros
        ("2026-11-25T21:57:24Z", 1_795_643_844_000_000_000),  # ... all of them, and the dot
        ("2026-11-25T21:57:24.1234567891Z", 1_795_643_844_123_456_789),  # beyond nanoseconds: dropped
        ("2026-11-25T22:57:24.5+01:00", 1_795_643_844_500_000_000),
        ("2026-11-25T21:27:24.5-00:30", 1_795_643_844_500_000_000),
        ("1969-12-31T23:59:59.999999999Z", -1),
        (" 2026-11-25T21:57:24Z\n", 1_795_643_844_000_000_000),
    ],
)
def test_server_timestamps(text: str, ns: int) -> None:
    assert parse_rfc3339_ns(text) == ns


def test_consecutive_nanoseconds_differ_by_one() -> None:
    assert parse_rfc3339_ns("2026-11-22T08:13:48.657247504Z") - parse_rfc3339_ns("2026-11-22T08:13:48.657247503Z") == 1


@given(st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1)), st.integers(0, 999))
def test_agrees_with_datetime_to_the_microsecond(when: dt.datetime, nanos: int) -> None:
    text = when.strftime("%Y-%m-%dT%H:%M:%S.%f") + f"{nanos:03d}Z"
    expected = int(when.replace(tzinfo=dt.UTC).timestamp()) * 10**9 + when.microsecond * 1000 + nanos
    assert parse_rfc3339_ns(text) == expected


@pytest.mark.parametrize(
    "text",
    ["yesterday", "", "2026-11-25 21:57:24Z", "2026-11-25T21:57:24", "2026-11-25T21:57:24.Z", "2026-13-01T00:00:00Z"],
)
def test_anything_else_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rfc3339_ns(text)


def test_the_bench_uses_the_same_parser() -> None:
    from bench import stats

    assert stats.parse_rfc3339_ns is parse_rfc3339_ns
