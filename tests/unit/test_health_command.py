"""``nats-bridge health``: asks the address ``http.listen`` gives (its environment override too), one line, exit 0
only on 200. A stand-in listener answers here; the container test runs it as the image's HEALTHCHECK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.cli import main
from bridge.testing.configs import SourceSpec, write_config
from bridge.testing.http import answering


@pytest.fixture
def listener() -> Iterator[int]:
    with answering({"/healthz": (200, b"ok"), "/readyz": (503, b"{}")}) as port:
        yield port


def _config(tmp_path: Path, listen: str) -> str:
    nowhere = "nats://127.0.0.1:1"  # health asks the daemon's listener only, never a server
    return str(
        write_config(
            tmp_path / "bridge.toml",
            target_url=nowhere,
            sources=[SourceSpec("x", nowhere)],
            http_extra={"listen": listen},
        )
    )


def test_alive_is_exit_0_and_not_ready_is_exit_1(
    tmp_path: Path, listener: int, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, f"0.0.0.0:{listener}")  # all interfaces: asked on loopback
    assert main(["health", "-c", path]) == 0
    assert capsys.readouterr().out == f"nats-bridge health: http://127.0.0.1:{listener}/healthz answered 200\n"
    assert main(["health", "-c", path, "--ready"]) == 1
    assert capsys.readouterr().out == f"nats-bridge health: http://127.0.0.1:{listener}/readyz answered 503\n"


def test_the_environment_override_of_the_port_is_followed(
    tmp_path: Path, listener: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, "127.0.0.1:9")  # nothing answers there
    monkeypatch.setenv("NATS_BRIDGE_HTTP__LISTEN", f"127.0.0.1:{listener}")
    assert main(["health", "-c", path]) == 0
    assert f":{listener}/healthz answered 200" in capsys.readouterr().out


def test_nothing_listening_or_a_disabled_listener_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["health", "-c", _config(tmp_path, "127.0.0.1:9")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("nats-bridge health: no answer from http://127.0.0.1:9/healthz (") and out.count("\n") == 1
    assert main(["health", "-c", _config(tmp_path, "")]) == 1
    assert capsys.readouterr().out == (
        "nats-bridge health: cannot ask the daemon: http listener disabled in the configuration\n"
    )
