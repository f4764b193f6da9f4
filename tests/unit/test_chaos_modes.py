"""The chaos suite in pull mode (an origin older than 2.14), without servers: which fault kinds are left out and
named, what the bridge's config says, how ``--origin-server`` is taken."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Collection
from pathlib import Path

import pytest

from bridge.testing.servers import origin_binary_option
from chaos.cli import main
from chaos.faults import CLUSTER_ONLY, FAULTS, FLOW_CONTROL_ONLY, inapplicable
from chaos.model import ScenarioResult
from chaos.report import format_table, summary, write_report
from chaos.runner import ScenarioSpec, full_set, smoke_set
from chaos.topology import SOURCES, bridge_config

RESETS = {"reset-empty", "reset-backward", "reset-forward", "reset-beyond"}


CLUSTER = {"hub-leader-kill", "hub-rolling-restart", "kv-leader-kill"}


def test_pull_mode_leaves_out_the_consumer_reset_kinds_only() -> None:
    assert set(FLOW_CONTROL_ONLY) == RESETS
    assert inapplicable("flow_control", cluster=True) == {}
    skipped = inapplicable("pull", cluster=True)
    assert set(skipped) == RESETS
    assert all("CONSUMER.RESET" in reason for reason in skipped.values())


def test_a_single_hub_leaves_out_the_clusters_kinds() -> None:
    assert set(CLUSTER_ONLY) == CLUSTER <= set(FAULTS)
    assert inapplicable("flow_control") == CLUSTER_ONLY
    assert set(inapplicable("pull")) == RESETS | CLUSTER
    assert all("--cluster" in reason for reason in CLUSTER_ONLY.values())


@pytest.mark.parametrize("make", [lambda skip: smoke_set(skip=skip), lambda skip: full_set(600.0, skip=skip)])
def test_sets_without_the_skipped_kinds(make: Callable[[Collection[str]], list[ScenarioSpec]]) -> None:
    everything = make(())
    pull = make(inapplicable("pull", cluster=True))
    assert [s.name for s in everything] == [*FAULTS, "nemesis"], "flow-control mode: every kind, as before"
    names = [s.name for s in pull]
    assert names == [*(f for f in FAULTS if f not in RESETS), "nemesis"]
    nemesis = pull[-1]
    assert set(nemesis.faults) == set(FAULTS) - RESETS, "the nemesis draws from the applicable kinds only"


def test_full_set_shares_its_time_among_the_kinds_it_runs() -> None:
    pull = full_set(600.0, skip=inapplicable("pull", cluster=True))
    each = pull[0].duration
    assert each == pytest.approx((600.0 - 120.0) / (len(FAULTS) - len(RESETS)))


def test_report_names_the_skipped_kinds_with_their_reason(tmp_path: Path) -> None:
    result = ScenarioResult(name="calm", seed=1, command="c")
    skipped = inapplicable("pull")
    text = format_table([result], mode="pull", skipped=skipped)
    assert "skipped fault kinds (pull mode), not covered by this run:" in text
    for kind, reason in skipped.items():
        assert f"  {kind}: {reason}" in text
    assert text.splitlines()[-1].startswith("OVERALL:"), "the verdict stays the last line"
    assert "skipped" not in format_table([result]), "nothing skipped, nothing said"

    data = summary([result], command="c", seed=1, mode="pull", skipped=skipped)
    assert (data["mode"], data["skipped_fault_kinds"]) == ("pull", skipped)
    path = write_report(tmp_path, [result], command="c", seed=1, mode="pull", skipped=skipped)
    assert json.loads(path.read_text(encoding="utf-8"))["skipped_fault_kinds"] == skipped
    assert (tmp_path / "report.txt").read_text(encoding="utf-8") == text


def test_bridge_config_keeps_mode_auto_with_a_short_ack_wait() -> None:
    config = tomllib.loads(bridge_config(SOURCES, "nats://127.0.0.1:1", "nats://127.0.0.1:2"))
    for table in config["sources"]:
        assert "mode" not in table, "auto, the default, picks pull on an old origin"
        assert table["ack_wait"] == 5


def test_origin_server_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "nats-server"
    binary.write_text("#!/bin/sh\necho 'nats-server: v2.12.8'\n", encoding="utf-8")
    binary.chmod(0o755)
    assert origin_binary_option(str(binary)) == str(binary)
    monkeypatch.setenv("NATS_ORIGIN_SERVER_BIN", str(binary))
    assert origin_binary_option(None) == str(binary), "default: NATS_ORIGIN_SERVER_BIN"


def test_an_origin_server_that_is_no_executable_is_a_bad_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--smoke", "--origin-server", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    assert "--origin-server=" in capsys.readouterr().err


def test_only_inapplicable_scenarios_is_a_bad_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "nats-server"
    binary.write_text("#!/bin/sh\necho 'nats-server: v2.12.8'\n", encoding="utf-8")
    binary.chmod(0o755)
    argv = ["run", "--scenario", "reset-empty", "--origin-server", str(binary), "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "nothing to run in pull mode: reset-empty (CONSUMER.RESET" in err
    assert not (tmp_path / "out").exists(), "nothing ran"


def test_only_takes_a_part_of_the_smoke_set_and_refuses_what_is_not_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--smoke --only`` (CI's pull-mode run): a kind the mode leaves out is no part of the set, so naming it is a
    bad argument that names what the set has; ``--only`` without ``--smoke`` too. Nothing runs either way."""
    binary = tmp_path / "nats-server"
    binary.write_text("#!/bin/sh\necho 'nats-server: v2.12.8'\n", encoding="utf-8")
    binary.chmod(0o755)
    out = tmp_path / "out"
    base = ["run", "--origin-server", str(binary), "--out", str(out)]
    assert main([*base, "--smoke", "--only", "bridge-kill,reset-empty"]) == 2
    err = capsys.readouterr().err
    assert "--only: no scenario reset-empty in this smoke set (it has: bridge-kill," in err
    assert main([*base, "--scenario", "bridge-kill", "--only", "bridge-kill"]) == 2
    assert "--only needs --smoke" in capsys.readouterr().err
    assert not out.exists(), "nothing ran"
