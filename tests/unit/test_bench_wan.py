"""``python -m bench wan``'s pure parts: its options, the bridge configuration it writes, the summaries, the table
and the chart. No servers are started and nothing is timed."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import wan
from bench.cli import _parser
from bench.common import parse_messages, parse_sizes
from bench.model import BRIDGE, BRIDGE_EDGE, NATIVE, ThroughputRun
from bridge.config.loading import load_config


def test_rtts_keep_order_drop_repeats_and_know_direct() -> None:
    points = wan.parse_rtts("direct, 0, 20ms,50,20")
    assert [p.label for p in points] == ["direct", "0", "20", "50"]
    assert [p.proxied for p in points] == [False, True, True, True]
    # the proxy delays each direction on its own: a round trip crosses it twice
    assert points[2].delay_s == pytest.approx(0.010)
    assert wan.parse_rtts("2.5")[0].label == "2.5"


@pytest.mark.parametrize("text", ["", "fast", "-1", "20,x"])
def test_bad_rtts_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        wan.parse_rtts(text)


def test_sizes_messages_and_lists() -> None:
    assert parse_sizes("256,16k,16KiB") == (256, 16384)
    assert parse_messages("5000") == 5000
    assert parse_messages("256=100000,16k=20000") == {256: 100_000, 16384: 20_000}
    assert wan.parse_int_list("1000,4000,1000") == (1000, 4000)
    for bad in ("0", "a", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            wan.parse_int_list(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_messages("256=0")
    assert wan.default_messages(256, quick=False) == 100_000
    assert wan.default_messages(16384, quick=False) == 20_000
    assert wan.default_messages(16384, quick=True) == wan.QUICK_MESSAGES


def test_paths_come_in_the_bench_order() -> None:
    assert wan.parse_paths("bridge-edge, native") == (NATIVE, BRIDGE_EDGE)
    for bad in ("", "bridge,sidecar"):
        with pytest.raises(argparse.ArgumentTypeError):
            wan.parse_paths(bad)


def test_settings_parse_and_land_in_their_tables(tmp_path: Path) -> None:
    assert wan.parse_setting("target.ack_timeout = 10") == ("target.ack_timeout", "10")
    for bad in ("ack_timeout=10", "nowhere.x=1", "target.x", "target.a.b=1"):
        with pytest.raises(argparse.ArgumentTypeError):
            wan.parse_setting(bad)
    settings = {
        "target.publish_window": "4096",
        "engine.silence_timeout": "10.0",
        "source.ack_wait": "20",
        "coordination.lease_ttl": "15",
    }
    text = wan.wan_bridge_config("nats://127.0.0.1:1", "nats://127.0.0.1:2", "edge", 4000, "auto", settings)
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    config = load_config(path, environ={})
    assert config.target.publish_window == 4096
    assert config.target.servers == ["nats://127.0.0.1:1"]
    assert config.engine.silence_timeout == 10.0
    assert config.coordination.lease_ttl == 15.0
    (source,) = config.sources
    assert source.servers == ["nats://127.0.0.1:2"]  # edge: the leaf itself
    assert source.max_ack_pending == 4000
    assert source.ack_wait == 20.0


def test_sidecar_config_without_settings_is_the_bench_runs() -> None:
    text = wan.wan_bridge_config("nats://hub:4222", "nats://leaf:4222", "sidecar", 1000, "auto", {})
    assert 'domain = "leaf"' in text
    assert 'servers = ["nats://leaf:4222"]' not in text
    assert "[engine]" not in text


def test_wan_options_reach_the_command() -> None:
    args = _parser().parse_args(
        ["wan", "--quick", "--max-ack-pending", "1000,4000", "--publish-window", "4096", "--set", "engine.x=1"]
    )
    assert args.command == "wan"
    assert args.quick and args.max_ack_pending == (1000, 4000)
    assert wan._settings(args) == {"target.publish_window": "4096", "engine.x": "1"}
    assert _parser().parse_args(["wan"]).edge is None  # decided by --quick


def _run(
    path: str, rtt: str, rep: int, rate: float, *, ok: bool = True, size: int = 256, mack: int = 1000
) -> wan.WanRun:
    run = ThroughputRun(path=path, size=size, retention="workqueue", rep=rep, messages=1000, ok=ok, msgs_per_s=rate)
    if path != NATIVE:
        run.bridge_cpu_s_per_million = 20.0 + rep
    run.servers_cpu_s_per_million = 10.0
    ms = 0.0 if rtt == "direct" else float(rtt)
    return wan.WanRun(
        rtt=rtt,
        rtt_ms=ms,
        proxied=rtt != "direct",
        max_ack_pending=mack,
        run=run,
        measured_rtt_ms=ms + 1.0,
        loaded_rtt_ms=ms + 3.0,
        proxy_busy=0.05 if rtt != "direct" else None,
    )


def test_summaries_pair_repetitions_and_skip_failures() -> None:
    runs = [
        _run(NATIVE, "direct", 1, 80_000),
        _run(BRIDGE, "direct", 1, 40_000),
        _run(NATIVE, "20", 1, 20_000),
        _run(BRIDGE, "20", 1, 18_000),
        _run(BRIDGE_EDGE, "20", 1, 15_000),
        _run(NATIVE, "20", 2, 22_000),
        _run(BRIDGE, "20", 2, 0.0, ok=False),
        _run(BRIDGE_EDGE, "20", 2, 17_000),
    ]
    direct, delayed = wan.summarize(runs)
    assert (direct.rtt, direct.proxied, direct.ceiling) == ("direct", False, None)
    assert direct.ratio is not None and direct.ratio.median == pytest.approx(0.5)
    assert delayed.native is not None and delayed.native.median == pytest.approx(21_000)
    assert delayed.bridge is not None and delayed.bridge.count == 1
    # only repetition 1 has both paths: its ratio alone
    assert delayed.ratio is not None and delayed.ratio.count == 1 and delayed.ratio.median == pytest.approx(0.9)
    assert delayed.edge is not None and delayed.edge.median == pytest.approx(16_000)
    assert delayed.failed_runs == 1
    assert delayed.ceiling == pytest.approx(50_000)
    assert delayed.measured_rtt_ms == pytest.approx(21.0)
    assert delayed.loaded_rtt_ms == {NATIVE: 23.0, BRIDGE: 23.0, BRIDGE_EDGE: 23.0}
    assert delayed.as_dict()["native"] == {"median": 21_000, "min": 20_000, "max": 22_000, "n": 2}


def test_table_has_a_row_per_point_of_the_size() -> None:
    runs = [
        _run(NATIVE, "direct", 1, 80_000),
        _run(BRIDGE, "direct", 1, 40_000),
        _run(NATIVE, "50", 1, 15_000, mack=1000),
        _run(BRIDGE, "50", 1, 12_000, mack=1000),
        _run(NATIVE, "50", 1, 40_000, mack=4000),
        _run(BRIDGE, "50", 1, 20_000, mack=4000),
        _run(NATIVE, "50", 1, 5_000, size=16384),
    ]
    table = wan.format_table(wan.summarize(runs), 256).splitlines()
    assert table[0].startswith("| RTT ms | measured ms | max_ack_pending |")
    assert len(table) == 2 + 3
    assert table[2].startswith("| direct (no proxy) | 1.00 | 1,000 | - | 80,000 | 40,000 | 0.50 | - |")
    assert "| 50 | 51.00 | 4,000 | 80,000 | 40,000 | 20,000 | 0.50 | - |" in table[4]
    assert len(wan.secondary_lines(wan.summarize(runs))) == 4


def test_chart_is_drawn(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    runs = [
        _run(p, rtt, 1, rate) for p, rtt, rate in [(NATIVE, "direct", 9e4), (NATIVE, "20", 3e4), (BRIDGE, "20", 2e4)]
    ]
    out = wan.write_chart(wan.summarize(runs), tmp_path / "wan.png")
    assert out.stat().st_size > 1000
