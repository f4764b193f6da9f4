"""``BridgeProcess``'s reading of its log, without starting a bridge: the events a test waits for."""

from __future__ import annotations

import json
from pathlib import Path

from bridge.testing.processes import BridgeProcess


def line(event: str, **fields: object) -> str:
    return json.dumps({"event": event, **fields}) + "\n"


def test_events_are_read_as_the_log_grows_whole_lines_only(tmp_path: Path) -> None:
    log = tmp_path / "bridge.log"
    bridge = BridgeProcess(tmp_path / "bridge.toml", log)
    assert bridge.events() == []  # no log yet
    log.write_text("=== starting bridge ===\n" + line("bridge.ready", sources=["a"]))
    assert [e["event"] for e in bridge.events()] == ["bridge.ready"]
    partial = line("source.paused", source="a")
    with log.open("a") as fh:
        fh.write(line("lease.lost", source="b") + partial[:10])  # a line half written
    assert [e["event"] for e in bridge.events()] == ["bridge.ready", "lease.lost"]
    with log.open("a") as fh:
        fh.write(partial[10:] + "not json\n")
    assert bridge.count("source.paused", source="a") == 1
    assert bridge.events("source.paused", source="b") == []
    assert bridge.events(("lease.lost", "bridge.ready"), source="a") == [{"event": "bridge.ready", "sources": ["a"]}]
    log.write_text(line("bridge.stopped"))  # written anew: read anew
    assert bridge.events() == [{"event": "bridge.stopped"}]
