"""``python -m bench registry``'s verdicts and configuration (the measurement itself runs in the bench smoke set)."""

from __future__ import annotations

import tomllib
from types import SimpleNamespace
from typing import Any

from bench.registry import TARGET_S, RegistryRun, SiteRun, bridge_config, targets


def run(*stored: float | None) -> RegistryRun:
    result = RegistryRun(1_000_000, 128, copies_ok=True, exit_code=0)
    result.sites = [SiteRun(f"site-{i}", command_s=0.6, applied_s=0.5, first_stored_s=s) for i, s in enumerate(stored)]
    return result


def test_the_target_is_the_slowest_registration() -> None:
    (first, *_, last) = targets(run(0.9, TARGET_S))
    assert first.verdict == "met" and first.measured == "median 1.45 s, max 2.00 s over 2 sites"
    assert targets(run(0.9, TARGET_S + 0.01))[0].verdict == "NOT met"
    assert targets(run())[0].verdict == "NOT met"  # nothing stored is not a success
    assert last.verdict == "met"
    failed = run(1.0)
    failed.exit_code = 1
    assert targets(failed)[-1].verdict == "NOT met"


def test_a_site_is_its_name_and_stream() -> None:
    world: Any = SimpleNamespace(
        topology=SimpleNamespace(leaf=SimpleNamespace(url="nats://127.0.0.1:1"), hub=SimpleNamespace(url="nats://h:2"))
    )
    config = tomllib.loads(bridge_config(world))
    assert "sources" not in config  # every source comes from the registry
    assert config["source_defaults"] == {"servers": ["nats://127.0.0.1:1"], "subject_prefix": "edge.{name}"}
