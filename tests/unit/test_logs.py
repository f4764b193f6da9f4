"""Log throttling and secrets: what operators see during an outage."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime

import pytest

from bridge import logs
from tests.unit.tty import FakeTerminal


def test_throttle_lets_one_event_through_per_interval_and_counts_the_rest() -> None:
    throttle = logs.Throttle(interval=30.0)
    assert throttle.allow(100.0) == 0
    assert [throttle.allow(100.0 + t) for t in (0.5, 1.0, 29.0)] == [None, None, None]
    assert throttle.allow(130.0) == 3
    assert throttle.allow(130.5) is None


def test_throttle_lets_a_different_kind_of_event_through_at_once() -> None:
    throttle = logs.Throttle(interval=30.0)
    assert throttle.allow(100.0, "connection refused") == 0
    assert throttle.allow(101.0, "connection refused") is None
    assert throttle.allow(102.0, "authorization violation") == 1  # news: the cause changed
    assert throttle.allow(103.0, "authorization violation") is None


def test_json_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    logs.configure("info", "auto", stream=out)
    try:
        logs.get_logger(source="edge-a").info("reset.done", reset_seq=7)
        logs.get_logger().debug("hidden")
    finally:
        logs.configure("info", "console")
    line = json.loads(out.getvalue().strip())
    assert line["event"] == "reset.done" and line["source"] == "edge-a" and line["reset_seq"] == 7
    assert line["level"] == "info" and "timestamp" in line
    assert "hidden" not in out.getvalue()


def test_timestamps_are_rfc3339_utc_microseconds_as_structlog_writes_them() -> None:
    stamper = logs.UtcStamper()
    before = datetime.now(UTC)
    first = stamper(None, "info", {})["timestamp"]
    second = stamper(None, "info", {})["timestamp"]  # the same second's text, reused
    after = datetime.now(UTC)
    for stamp in (first, second):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp), stamp
        assert before <= datetime.fromisoformat(stamp.replace("Z", "+00:00")) <= after
    assert first <= second


def test_readable_lines_not_json_on_a_terminal() -> None:
    terminal = FakeTerminal()
    logs.configure("info", "auto", stream=terminal)
    try:
        logs.get_logger(source="edge-a").warning("source.stalled", watermark=1200, seconds_without_progress=61.0)
    finally:
        logs.configure("info", "console")
    (line,) = terminal.getvalue().splitlines()
    with pytest.raises(ValueError):
        json.loads(line)
    assert "\x1b[" not in line  # no colour codes: journald and `less` show them as garbage
    assert "source.stalled" in line and "warning" in line
    assert "source=edge-a" in line and "watermark=1200" in line and "seconds_without_progress=61.0" in line
