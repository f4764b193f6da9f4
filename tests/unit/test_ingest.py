"""``nats-bridge ingest``'s pure parts: the trigger option and the progress read from Spark's reports."""

from __future__ import annotations

import json

import pytest

from bridge.commands.ingest import Progress, parse_trigger


def test_the_trigger_is_available_now_or_a_positive_interval() -> None:
    assert parse_trigger("available-now") is None
    assert parse_trigger("2.5") == 2.5
    for bad in ("0", "-1", "soon", ""):
        with pytest.raises(ValueError, match="available-now or a number of seconds"):
            parse_trigger(bad)


def report(batch: int, rows: int, end: int, latest: int) -> dict[str, object]:
    offsets = {"endOffset": json.dumps({"stream": "AGG", "seq": end}), "latestOffset": {"stream": "AGG", "seq": latest}}
    return {"batchId": batch, "numInputRows": rows, "sources": [offsets]}


def test_progress_counts_each_batch_once_and_tells_the_lag() -> None:
    progress = Progress()
    assert (progress.offset, progress.latest, progress.lag) == (None, None, None)
    progress.update([report(0, 100, 100, 250), report(1, 50, 150, 250)])
    progress.update([report(1, 50, 150, 250), report(2, 0, 150, 260)])  # reports repeat; an empty batch is no batch
    assert (progress.rows, progress.batches, progress.offset, progress.latest, progress.lag) == (150, 2, 150, 260, 110)
    assert "150 rows in 2 batches" in progress.line(10.0) and "lag 110" in progress.line(10.0)
