"""``bridge.runtime.reload.plan_reload``: what a SIGHUP changes, on plain configurations (no servers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from bridge.config import BridgeConfig, load_config
from bridge.runtime.reload import plan_reload
from bridge.testing.configs import SourceSpec, write_config

URL = "nats://127.0.0.1:4222"
MakeConfig = Callable[..., BridgeConfig]


@pytest.fixture
def config(tmp_path: Path) -> MakeConfig:
    count = 0

    def make(sources: Sequence[SourceSpec], **kwargs: Any) -> BridgeConfig:
        nonlocal count
        count += 1
        path = write_config(tmp_path / f"bridge{count}.toml", target_url=URL, sources=sources, **kwargs)
        return load_config(path, environ={})

    return make


def spec(name: str, max_ack_pending: int | None = None) -> SourceSpec:
    return SourceSpec(name, URL, max_ack_pending=max_ack_pending)


def test_without_leases_removed_and_changed_stop_then_added_and_changed_start(config: MakeConfig) -> None:
    old = config([spec("a"), spec("b"), spec("c")])
    new = config([spec("a"), spec("d"), spec("c", max_ack_pending=7)])
    plan = plan_reload(old, new, {"a", "b", "c"}, coordinated=False)
    assert (plan.added, plan.removed, plan.changed, plan.unchanged) == (["d"], ["b"], ["c"], ["a"])
    assert plan.stop == ["b", "c"]
    assert plan.start == ["d", "c"]  # in the new configuration's order
    assert plan.restart_if_held == [] and plan.hand_over == []
    assert plan.sources == ["a", "d", "c"] and plan.restart_required == []


def test_an_identical_file_changes_nothing(config: MakeConfig) -> None:
    old = config([spec("a"), spec("b")])
    plan = plan_reload(old, config([spec("a"), spec("b")]), {"a", "b"}, coordinated=False)
    assert plan.stop == plan.start == plan.added == plan.removed == plan.changed == []
    assert plan.unchanged == ["a", "b"]


def test_with_leases_only_what_runs_here_restarts_and_the_fleet_gets_the_list(config: MakeConfig) -> None:
    old = config([spec("a"), spec("b"), spec("c"), spec("e")])
    new = config([spec("a", max_ack_pending=7), spec("c", max_ack_pending=7), spec("d"), spec("e")])
    # this process runs a and b; c is owned elsewhere
    plan = plan_reload(old, new, {"a", "b"}, coordinated=True)
    assert (plan.added, plan.removed, plan.changed, plan.unchanged) == (["d"], ["b"], ["a", "c"], ["e"])
    assert plan.stop == ["a"] and plan.restart_if_held == ["a"]
    assert plan.start == []  # the fleet starts what falls to this process
    assert plan.hand_over == ["b"]  # removed while ours: the fleet drains it and releases its lease
    assert plan.sources == ["a", "c", "d", "e"]


def test_sections_that_apply_on_restart_are_reported_not_applied(config: MakeConfig) -> None:
    old = config([spec("a")])
    new = config([spec("a")], engine={"silence_timeout": 9.0}, target_stream="OTHER", coordination={"lease_ttl": 9.0})
    plan = plan_reload(old, new, {"a"}, coordinated=False)
    assert plan.restart_required == ["target", "engine", "coordination"]
    assert plan.stop == plan.start == []


def limited(name: str, rate: str, max_ack_pending: int | None = None) -> SourceSpec:
    source = spec(name, max_ack_pending)
    source.extra["rate_limit"] = rate
    return source


@pytest.mark.parametrize("coordinated", [False, True])
def test_a_rate_limit_alone_is_taken_in_place_anything_more_restarts(config: MakeConfig, coordinated: bool) -> None:
    """a: only its rate limit changes and it runs here: retuned, not stopped. b: the rate and more: restarted. c:
    only its rate, but it does not run here: nothing to retune (it starts, or the fleet starts it, with the new
    configuration)."""
    old = config([spec("a"), spec("b"), spec("c")])
    new = config([limited("a", "64KiB"), limited("b", "64KiB", max_ack_pending=7), limited("c", "1MB")])
    plan = plan_reload(old, new, {"a", "b"}, coordinated=coordinated)
    assert plan.changed == ["a", "b", "c"] and plan.retune == ["a"]
    assert plan.stop == ["b"]
    if coordinated:
        assert plan.restart_if_held == ["b"] and plan.start == []
    else:
        assert plan.start == ["b", "c"]
