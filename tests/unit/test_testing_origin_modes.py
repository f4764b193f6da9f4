"""The origin's binary and the mode the harness expects on it (``bridge.testing.servers``), without servers: the
binaries here are shell scripts that print a version, as ``nats-server --version`` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.testing.servers import (
    ENV_ORIGIN_BINARY,
    PULL_TEST_ACK_WAIT,
    NatsServerNotFound,
    ServerStartError,
    checked_binary,
    find_nats_server,
    mode_source_extra,
    origin_mode_expected,
    origin_server_binary,
    ready_event,
)


def fake_server(directory: Path, output: str, name: str = "nats-server") -> Path:
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{output}'\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_unset_origin_binary_is_the_hubs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_ORIGIN_BINARY, raising=False)
    try:
        hub = find_nats_server()
    except NatsServerNotFound:
        pytest.skip("no nats-server here to be the default")
    assert origin_server_binary() == hub
    monkeypatch.setenv(ENV_ORIGIN_BINARY, "")  # empty counts as unset, as NATS_SERVER_BIN does
    assert origin_server_binary() == hub


def test_set_origin_binary_must_be_an_executable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = fake_server(tmp_path, "nats-server: v2.12.8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ENV_ORIGIN_BINARY, "nats-server")
    assert origin_server_binary() == str(binary), "made absolute"
    monkeypatch.setenv(ENV_ORIGIN_BINARY, str(tmp_path / "missing"))
    with pytest.raises(ServerStartError, match=f"{ENV_ORIGIN_BINARY}=.*does not exist or is not a file"):
        origin_server_binary()
    monkeypatch.setenv(ENV_ORIGIN_BINARY, str(tmp_path))
    with pytest.raises(ServerStartError, match="does not exist or is not a file"):
        origin_server_binary()
    binary.chmod(0o644)
    monkeypatch.setenv(ENV_ORIGIN_BINARY, str(binary))
    with pytest.raises(ServerStartError, match="is not executable"):
        origin_server_binary()


def test_checked_binary_names_where_the_value_came_from() -> None:
    with pytest.raises(NatsServerNotFound, match=r"^--origin-server='/nowhere' does not exist"):
        checked_binary("/nowhere", "--origin-server")


@pytest.mark.parametrize(
    ("output", "mode"),
    [
        ("nats-server: v2.10.26", "pull"),
        ("nats-server: v2.11.11", "pull"),
        ("nats-server: v2.12.8", "pull"),
        ("nats-server: v2.13.99", "pull"),
        ("nats-server: v2.14.0-RC.1", "flow_control"),  # a pre-release counts as its release
        ("nats-server: v2.14.0", "flow_control"),
        ("nats-server: v2.15.1", "flow_control"),
        ("nats-server: v3.0.0", "flow_control"),
    ],
)
def test_mode_expected_from_the_origins_version(tmp_path: Path, output: str, mode: str) -> None:
    assert origin_mode_expected(str(fake_server(tmp_path, output))) == mode


def test_mode_expected_defaults_to_the_origin_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ORIGIN_BINARY, str(fake_server(tmp_path, "nats-server: v2.12.8")))
    assert origin_mode_expected() == "pull"
    assert ready_event() == ("resync.done",)
    assert mode_source_extra() == {"ack_wait": PULL_TEST_ACK_WAIT}


def test_a_version_the_harness_cannot_read_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ServerStartError):
        origin_mode_expected(str(fake_server(tmp_path, "no version here")))


def test_ready_event_and_source_extra_per_mode() -> None:
    assert ready_event("flow_control") == ("reset.done", "consumer.resumed")
    assert ready_event("pull") == ("resync.done",)
    assert mode_source_extra("flow_control") == {}, "flow-control configs stay as they were"
    assert mode_source_extra("pull") == {"ack_wait": 5}
