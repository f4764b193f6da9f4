"""The bench's bridge mode (``--mode``) and origin server (``--origin-server``): the configuration it writes, what it
reads back from the bridge's log, and how results name the mode. No servers are started and nothing is timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main
from bench.model import BRIDGE, MODES, NATIVE, BenchResults, ThroughputRun
from bench.report import format_backlog, machine_line, markdown_section, mode_label, summarize
from bench.runner import bridge_config, bridge_log_summary
from bridge.config.loading import load_config


def _results(mode: str, *runs: ThroughputRun, origin: str = "") -> BenchResults:
    return BenchResults(
        started="2026-11-25T08:00:00+00:00",
        command=f"python -m bench run --mode {mode}",
        machine={"nproc": 2, "cpu_model": "AMD EPYC", "mem_total_bytes": 2**34, "kernel": "6.1", "python": "3.11"},
        revision={"commit": "abc123", "bridge_dirty": False},
        server_version="2.15.1",
        origin_server_version=origin,
        settings={
            "mode": mode,
            "native": not origin,
            "max_ack_pending": 1000,
            "messages_label": "1,000 (256 B)",
            "reps": 1,
            "latency_rate": 1000.0,
            "latency_seconds": 10.0,
            "latency_reps": 1,
        },
        throughput=list(runs),
    )


def _bridge_run(mode: str | None) -> ThroughputRun:
    run = ThroughputRun(path=BRIDGE, size=256, retention="workqueue", rep=1, messages=1000, ok=True)
    run.msgs_per_s, run.bridge_mode = 1000.0, mode
    return run


def test_modes_are_the_bridges() -> None:
    assert MODES == ("auto", "flow_control", "pull")


@pytest.mark.parametrize("mode", MODES)
def test_bridge_config_carries_the_mode_and_the_bridge_accepts_it(mode: str, tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(bridge_config("nats://127.0.0.1:4222", "nats://127.0.0.1:4223", "sidecar", 500, mode))
    (source,) = load_config(path, environ={}).sources
    assert (source.mode, source.max_ack_pending, source.domain) == (mode, 500, "leaf")


def test_bridge_config_defaults_to_auto_and_refuses_an_unknown_mode() -> None:
    assert 'mode = "auto"' in bridge_config("nats://h", "nats://l", "edge", 1000)
    with pytest.raises(ValueError, match="unknown bridge mode"):
        bridge_config("nats://h", "nats://l", "sidecar", 1000, "push")


def test_bridge_log_summary_reads_the_mode_and_counts_warnings() -> None:
    events = [
        {"event": "bridge.start", "level": "info"},
        {"event": "source.mode", "level": "info", "mode": "pull", "reason": "configured"},
        {"event": "source.stalled", "level": "warning"},
        {"event": "source.stalled", "level": "warning"},
        {"event": "publish.failed", "level": "error"},
    ]
    assert bridge_log_summary(events) == ("pull", {"source.stalled": 2, "publish.failed": 1})
    assert bridge_log_summary([{"event": "bridge.start", "level": "info"}]) == (None, {})


def test_results_name_the_mode_asked_for_and_the_mode_run() -> None:
    assert mode_label(_results("pull", _bridge_run("pull"))) == "mode pull"
    assert mode_label(_results("auto", _bridge_run("flow_control"))) == "mode auto (ran as flow_control)"
    assert mode_label(_results("auto")) == "mode auto (no bridge run logged its mode)"
    mixed = _results("auto", _bridge_run("pull"), _bridge_run("flow_control"))
    assert mode_label(mixed) == "mode auto (ran as flow_control, pull)"
    native = ThroughputRun(path=NATIVE, size=256, retention="workqueue", rep=1, messages=1000, ok=True)
    assert mode_label(_results("pull", native, _bridge_run("pull"))) == "mode pull"  # native has no mode
    backlog = _bridge_run("pull")
    assert "through the bridge (pull mode)" in format_backlog(backlog)


def test_markdown_and_machine_line_name_the_mode_and_an_older_origin() -> None:
    results = _results("pull", _bridge_run("pull"), origin="2.12.8")
    assert "nats-server 2.15.1 (hub), 2.12.8 (origin)" in machine_line(results)
    assert machine_line(_results("pull")).endswith("nats-server 2.15.1")  # one binary: one version
    section = markdown_section(results, summarize(results.throughput, []), "x.json", None)
    assert "Bridge mode pull, in the sidecar position" in section
    assert "bridge only (native sourcing needs an origin on nats-server 2.14+)" in section
    assert results.as_dict()["origin_server_version"] == "2.12.8"
    assert _results("pull").as_dict()["origin_server_version"] == "2.15.1"  # "" means the hub's


def test_cli_refuses_an_unknown_mode(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--mode", "push"])
    assert exc.value.code == 2
    assert "invalid choice: 'push'" in capsys.readouterr().err


def _fake_server(path: Path, version: str) -> str:
    """An executable that only answers ``--version``, as ``nats-server`` does: the CLI asks nothing else of it
    before it refuses a combination."""
    path.write_text(f"#!/bin/sh\necho 'nats-server: v{version}'\n")
    path.chmod(0o755)
    return str(path)


def test_cli_refuses_flow_control_on_an_origin_older_than_2_14(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NATS_SERVER_BIN", _fake_server(tmp_path / "hub-server", "2.15.1"))
    origin = _fake_server(tmp_path / "origin-server", "2.12.8")
    assert main(["run", "--quick", "--mode", "flow_control", "--origin-server", origin]) == 2
    assert "--mode flow_control needs an origin on nats-server 2.14+, not 2.12.8" in capsys.readouterr().err


def test_cli_refuses_an_origin_server_that_is_not_executable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NATS_SERVER_BIN", _fake_server(tmp_path / "hub-server", "2.15.1"))
    assert main(["run", "--quick", "--origin-server", str(tmp_path / "missing")]) == 2
    assert "--origin-server=" in capsys.readouterr().err
