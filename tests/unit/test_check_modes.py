"""``nats-bridge check`` and ``sources[].mode``: the mode line per source, the consumer vetted for that mode, and a
mode the origin cannot run reported as a configuration error (exit 2).

The servers are a small in-memory JetStream API behind a fake connection (STREAM.INFO, CONSUMER.INFO,
CONSUMER.CREATE, as the servers answer them), so the real ``JsApi`` and ``ensure_consumer`` run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bridge.cli import main
from bridge.commands import check as check_module
from bridge.commands.check import check
from bridge.commands.common import EXIT_CONFIG, EXIT_OK, EXIT_PROBLEM
from bridge.errors import ConfigError

TARGET_URL = "nats://target:4222"

# what STREAM.INFO's config.metadata says on each server, as the real ones do (nats-server 2.10 says nothing)
SERVERS: dict[str, dict[str, str]] = {
    "2.10.26": {},
    "2.11.11": {"_nats.level": "1", "_nats.ver": "2.11.11"},
    "2.12.8": {"_nats.level": "3", "_nats.ver": "2.12.8"},
    "2.14.0": {"_nats.level": "4", "_nats.ver": "2.14.0"},
    "2.15.1": {"_nats.level": "5", "_nats.ver": "2.15.1"},
}


@dataclass
class Reply:
    data: bytes


@dataclass
class FakeServer:
    """One server's JetStream API, enough for ``check``: streams, durables, and the requests it was sent."""

    metadata: dict[str, str]
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)
    consumers: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)

    @property
    def level(self) -> int:
        return int(self.metadata.get("_nats.level", "0"))

    def info(self, config: dict[str, Any]) -> dict[str, Any]:
        return {"config": config, "ack_floor": {"stream_seq": 7}, "num_pending": 3}

    def answer(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        parts = subject.split(".")
        verb = ".".join(parts[2:4])
        if verb == "STREAM.INFO":
            stream = self.streams.get(parts[4])
            if stream is None:
                return {"error": {"code": 404, "err_code": 10059, "description": "stream not found"}}
            return {"config": {**stream, "metadata": dict(self.metadata)}, "state": {"messages": 0}}
        key = (parts[4], parts[5])
        if verb == "CONSUMER.INFO":
            if key not in self.consumers:
                return {"error": {"code": 404, "err_code": 10014, "description": "consumer not found"}}
            return self.info(self.consumers[key])
        if verb == "CONSUMER.CREATE":
            config = body["config"]
            if config.get("ack_policy") == "flow_control" and self.level < 4:
                return {"error": {"code": 400, "err_code": 10025, "description": "invalid JSON: unknown ack policy"}}
            old = self.consumers.get(key)
            if old is not None and bool(old.get("deliver_subject")) != bool(config.get("deliver_subject")):
                return {"error": {"code": 400, "err_code": 10012, "description": "consumer push/pull cannot change"}}
            self.consumers[key] = config
            return self.info(config)
        raise AssertionError(f"unexpected request {subject}")


class FakeConnection:
    def __init__(self, server: FakeServer) -> None:
        self.server = server

    async def request(
        self, subject: str, payload: bytes, timeout: float, headers: dict[str, str] | None = None
    ) -> Reply:
        self.server.requests.append(subject)
        body = json.loads(payload) if payload else {}
        return Reply(json.dumps(self.server.answer(subject, body)).encode())

    async def close(self) -> None:
        return None


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeServer]:
    """Servers by URL (the target is there already); ``check`` connects to them through ``open_connection``."""
    target = FakeServer(SERVERS["2.15.1"], streams={"AGG": {"subjects": [">"], "retention": "limits"}})
    servers = {TARGET_URL: target}

    async def open_connection(side: Any, *, name: str, error_type: type[Exception], **_: Any) -> FakeConnection:
        return FakeConnection(servers[side.servers[0]])

    monkeypatch.setattr(check_module, "open_connection", open_connection)
    return servers


def origin(network: dict[str, FakeServer], version: str, url: str = "nats://edge:4222") -> FakeServer:
    server = FakeServer(SERVERS[version], streams={"ORDERS": {"subjects": ["orders.>"], "retention": "workqueue"}})
    network[url] = server
    return server


def write_config(tmp_path: Path, *sources: str) -> Path:
    """A configuration without leases (``check`` would look for the bucket) and with the given [[sources]] bodies."""
    text = f'[coordination]\nenabled = false\n[target]\nservers = ["{TARGET_URL}"]\nstream = "AGG"\n'
    text += "".join(f'[[sources]]\nstream = "ORDERS"\nsubject_prefix = "edge"\n{body}\n' for body in sources)
    path = tmp_path / "bridge.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def source_lines(out: str, name: str) -> list[str]:
    """The source's lines but a far link's window advice (a loaded machine can take any link for a far one)."""
    return [line for line in out.splitlines() if f" source {name}: " in line and "link round trip" not in line]


PULL_CONSUMER = {"durable_name": "nats-bridge-edge1", "ack_policy": "explicit", "max_deliver": -1}
FLOW_CONSUMER = {
    "durable_name": "nats-bridge-edge1",
    "deliver_subject": "nats-bridge.deliver.edge1",
    "ack_policy": "flow_control",
    "flow_control": True,
}


# --- the mode line --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "line"),
    [
        (
            "2.10.26",
            "OK   source edge1: mode pull (the origin runs a nats-server older than 2.11 (it reports no API level), "
            "older than 2.14: no ack_policy flow_control)",
        ),
        (
            "2.12.8",
            "OK   source edge1: mode pull (the origin runs nats-server 2.12.8 (API level 3), older than 2.14: no "
            "ack_policy flow_control)",
        ),
        (
            "2.14.0",
            "OK   source edge1: mode flow_control (the origin runs nats-server 2.14.0 (API level 4), which has "
            "ack_policy flow_control)",
        ),
    ],
)
def test_auto_takes_what_the_origin_server_has_and_check_creates_that_consumer(
    network: dict[str, FakeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str, line: str
) -> None:
    server = origin(network, version)
    assert check(str(write_config(tmp_path, 'name = "edge1"\nservers = "nats://edge:4222"'))) == EXIT_OK
    mode_line, consumer_line = source_lines(capsys.readouterr().out, "edge1")
    assert mode_line == line
    assert consumer_line.startswith(
        "OK   source edge1: origin ORDERS (workqueue), consumer nats-bridge-edge1 (managed)"
    )
    created = server.consumers[("ORDERS", "nats-bridge-edge1")]
    if "mode pull" in line:
        # a pull consumer: no deliver subject, no flow control, explicit acks with the configured ack_wait
        assert "deliver_subject" not in created and "flow_control" not in created
        assert (created["ack_policy"], created["ack_wait"]) == ("explicit", 30_000_000_000)
    else:
        assert created["ack_policy"] == "flow_control" and created["deliver_subject"] == "nats-bridge.deliver.edge1"


def test_auto_keeps_an_existing_pull_durable_on_a_server_that_has_flow_control(
    network: dict[str, FakeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = origin(network, "2.15.1")
    server.consumers[("ORDERS", "nats-bridge-edge1")] = dict(PULL_CONSUMER)
    assert check(str(write_config(tmp_path, 'name = "edge1"\nservers = "nats://edge:4222"\nack_wait = 12'))) == 0
    (mode_line, _) = source_lines(capsys.readouterr().out, "edge1")
    assert mode_line == "OK   source edge1: mode pull (the durable consumer exists as a pull consumer)"
    kept = server.consumers[("ORDERS", "nats-bridge-edge1")]
    assert "deliver_subject" not in kept and kept["ack_wait"] == 12_000_000_000  # repaired as a pull consumer


def test_a_configured_mode_is_said_so_and_needs_no_consumer_lookup(
    network: dict[str, FakeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``mode = "pull"`` on a 2.15 origin: a pull consumer, and no CONSUMER.INFO (the least-privilege user of a
    managed source has only CONSUMER.CREATE)."""
    server = origin(network, "2.15.1")
    assert check(str(write_config(tmp_path, 'name = "edge1"\nservers = "nats://edge:4222"\nmode = "pull"'))) == 0
    (mode_line, _) = source_lines(capsys.readouterr().out, "edge1")
    assert mode_line == "OK   source edge1: mode pull (configured)"
    assert not [r for r in server.requests if ".CONSUMER.INFO." in r]
    assert "deliver_subject" not in server.consumers[("ORDERS", "nats-bridge-edge1")]


def test_auto_on_a_flow_control_origin_presumes_it_as_run_does_and_needs_no_consumer_lookup(
    network: dict[str, FakeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A managed flow-control source's least-privilege user has CONSUMER.CREATE and no CONSUMER.INFO
    (docs/permissions.md): ``check`` asks nothing more of it than ``run`` does."""
    server = origin(network, "2.15.1")
    assert check(str(write_config(tmp_path, 'name = "edge1"\nservers = "nats://edge:4222"'))) == 0
    (mode_line, _) = source_lines(capsys.readouterr().out, "edge1")
    assert mode_line.startswith("OK   source edge1: mode flow_control (the origin runs nats-server 2.15.1")
    assert not [r for r in server.requests if ".CONSUMER.INFO." in r]
    assert server.consumers[("ORDERS", "nats-bridge-edge1")]["ack_policy"] == "flow_control"


# --- vetting for the chosen mode ---------------------------------------------------------------------------------


def test_a_bound_pull_consumer_passes_in_pull_mode_without_a_word_about_deliver_subject_or_flow_control(
    network: dict[str, FakeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = origin(network, "2.12.8")
    server.consumers[("ORDERS", "nats-bridge-edge1")] = dict(PULL_CONSUMER)
    body = 'name = "edge1"\nservers = "nats://edge:4222"\nmanage_consumer = false'
    assert check(str(write_config(tmp_path, body))) == EXIT_OK
    out = capsys.readouterr().out
    assert "deliver_subject" not in out and "flow_control is off" not in out
    assert source_lines(out, "edge1")[1].startswith("OK   source edge1: origin ORDERS (workqueue), consumer")
    assert "ack floor 7, pending 3" in out


def test_a_bound_push_consumer_is_unfit_for_configured_pull_mode(
    network: dict[str, FakeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = origin(network, "2.15.1")
    server.consumers[("ORDERS", "nats-bridge-edge1")] = dict(FLOW_CONSUMER)
    body = 'name = "edge1"\nservers = "nats://edge:4222"\nmanage_consumer = false\nmode = "pull"'
    assert check(str(write_config(tmp_path, body))) == EXIT_PROBLEM
    mode_line, verdict = source_lines(capsys.readouterr().out, "edge1")
    assert mode_line == "OK   source edge1: mode pull (configured)"
    assert verdict.startswith("FAIL source edge1: consumer ORDERS/nats-bridge-edge1 is unfit for pull mode")
    assert "push consumer" in verdict


# --- a mode the origin cannot run: a configuration error ---------------------------------------------------------


def test_flow_control_on_an_old_origin_is_a_configuration_error_naming_the_key(
    network: dict[str, FakeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = origin(network, "2.12.8", "nats://old:4222")
    new = origin(network, "2.15.1", "nats://new:4222")
    path = write_config(
        tmp_path,
        'name = "edge0"\nservers = "nats://new:4222"',
        'name = "edge1"\nservers = "nats://old:4222"\nmode = "flow_control"',
    )
    with pytest.raises(ConfigError) as raised:
        check(str(path))
    (problem,) = raised.value.problems
    assert problem.startswith(
        'sources[edge1].mode: mode = "flow_control" needs nats-server 2.14.0 or later on the origin, which runs '
        "nats-server 2.12.8 (API level 3): "
    )
    assert 'set mode = "auto" (or "pull")' in problem and "\n" not in problem
    out = capsys.readouterr().out
    assert source_lines(out, "edge1") == [f"FAIL source edge1: {problem}"]
    assert not old.consumers, "nothing is created for a source that cannot run"
    assert source_lines(out, "edge0")[0].startswith("OK   source edge0: mode flow_control")  # the others are checked
    assert new.consumers
    assert out.rstrip().endswith("some checks failed")


def test_the_cli_exits_2_and_prints_it_as_an_invalid_configuration(
    network: dict[str, FakeServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    origin(network, "2.10.26")
    path = write_config(tmp_path, 'name = "edge1"\nservers = "nats://edge:4222"\nmode = "flow_control"')
    assert main(["check", "-c", str(path)]) == EXIT_CONFIG
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"nats-bridge: invalid configuration ({path})"
    assert err[1].startswith('  sources[edge1].mode: mode = "flow_control" needs nats-server 2.14.0 or later on the')
    assert "older than 2.11" in err[1]
