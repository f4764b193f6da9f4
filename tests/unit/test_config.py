"""Unit tests for bridge.config: schema, defaults, environment overrides and the error lines."""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import (
    AuthConfig,
    BridgeConfig,
    EngineConfig,
    LogConfig,
    SourceConfig,
    TargetConfig,
    TlsConfig,
    exposed_secrets,
    format_config_error,
    load_config,
)
from bridge.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "bridge.example.toml"

MINIMAL: dict[str, Any] = {
    "target": {"servers": ["nats://hub:4222"], "stream": "AGG"},
    "sources": [{"name": "edge-a", "servers": ["nats://edge-a:4222"], "stream": "ORDERS"}],
}


# --- helpers ----------------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def to_toml(data: dict[str, Any]) -> str:
    """Enough of a TOML writer for these tests: top-level tables and arrays of tables, inline sub-tables."""
    lines: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in value.items())
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for item in value:
                lines.append(f"[[{key}]]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
        else:
            lines.insert(0, f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def write(tmp_path: Path) -> Callable[[dict[str, Any] | str], Path]:
    def _write(data: dict[str, Any] | str) -> Path:
        path = tmp_path / "bridge.toml"
        path.write_text(data if isinstance(data, str) else to_toml(data), encoding="utf-8")
        return path

    return _write


def problems_of(path: Path | None, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={} if environ is None else environ)
    return info.value.problems


def with_changes(*changes: tuple[str, Any]) -> dict[str, Any]:
    """MINIMAL with dotted keys set ("sources.0.auth.token"); the value DELETE removes the key."""
    data = copy.deepcopy(MINIMAL)
    for dotted, value in changes:
        *parents, last = dotted.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if value is DELETE:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


DELETE = object()


# --- the example and the defaults -------------------------------------------------------------------------


def test_example_loads_with_two_sources() -> None:
    config = load_config(EXAMPLE, environ={})
    assert [s.name for s in config.sources] == ["edge-a", "edge-b"]
    with_domain = [s for s in config.sources if s.domain]
    assert len(with_domain) == 1
    assert with_domain[0].subject_prefix
    assert with_domain[0].api_prefix == f"$JS.{with_domain[0].domain}.API"
    assert config.target.api_prefix == "$JS.API"


def test_example_shows_every_key() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    shown = set(re.findall(r"^#?\s*([a-z_]+)\s*=", text, flags=re.MULTILINE))
    tables = set(re.findall(r"^#?\s*\[\[?([a-z_.]+)\]\]?", text, flags=re.MULTILINE))
    keys = {
        name
        for model in (LogConfig, EngineConfig, TargetConfig, SourceConfig, AuthConfig, TlsConfig)
        for name in model.model_fields
    }
    assert keys - {"auth", "tls"} <= shown  # those two are shown as tables
    assert {"log", "engine", "target", "target.auth", "target.tls", "sources", "sources.auth", "sources.tls"} <= tables


def test_minimal_config_gets_documented_defaults(write: Callable[[dict[str, Any]], Path]) -> None:
    config = load_config(write(MINIMAL), environ={})
    assert config.log.level == "info" and config.log.format == "auto"
    engine = config.engine
    assert (engine.silence_timeout, engine.reset_timeout) == (5.0, 5.0)
    assert (engine.reset_backoff_initial, engine.reset_backoff_max) == (2.0, 30.0)
    assert (engine.publish_retry_initial, engine.publish_retry_max) == (0.5, 15.0)
    assert engine.shutdown_grace == 10.0
    target = config.target
    assert target.servers == ["nats://hub:4222"] and target.stream == "AGG"
    assert target.domain is None and target.api_prefix == "$JS.API"
    assert (target.publish_window, target.ack_timeout, target.auth, target.tls) == (1024, 5.0, None, None)
    (source,) = config.sources
    assert source.consumer == "nats-bridge-edge-a"
    assert source.deliver_subject == "nats-bridge.deliver.edge-a"
    assert source.manage_consumer is True and source.max_ack_pending == 1000
    assert source.filter_subjects == [] and source.subject_prefix is None
    assert (source.mode, source.ack_wait) == ("auto", 30.0)
    assert (source.domain, source.auth, source.tls, source.api_prefix) == (None, None, None, "$JS.API")


def test_servers_default_and_plain_string(write: Callable[[dict[str, Any]], Path]) -> None:
    data = with_changes(("target.servers", DELETE), ("sources.0.servers", "tls://edge:4222"))
    config = load_config(write(data), environ={})
    assert config.target.servers == ["nats://127.0.0.1:4222"]
    assert config.sources[0].servers == ["tls://edge:4222"]


def test_all_schemes_domain_and_files_accepted(write: Callable[[dict[str, Any]], Path], tmp_path: Path) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("x")
    data = with_changes(
        ("target.servers", ["nats://a:1", "tls://b:2", "ws://c:3", "wss://d"]),
        ("target.domain", "hub"),
        ("target.tls", {"ca_file": str(pem), "cert_file": str(pem), "key_file": str(pem)}),
        ("target.auth", {"creds_file": str(pem)}),
        ("sources.0.auth", {"user": "u", "password": "p"}),
        ("sources.0.filter_subjects", ["orders.*", "audit.>"]),
        ("sources.0.subject_prefix", "site.a"),
        ("log.level", "DEBUG"),
    )
    config = load_config(write(data), environ={})
    assert config.target.api_prefix == "$JS.hub.API"
    assert config.target.tls is not None and config.target.tls.key_file == pem
    assert config.log.level == "debug"


@pytest.mark.parametrize(
    ("mode", "ack_wait", "expected"),
    [
        ("auto", 30, ("auto", 30.0)),
        ("flow_control", 1, ("flow_control", 1.0)),
        ("pull", 3600, ("pull", 3600.0)),
        ("PULL", 12.5, ("pull", 12.5)),  # like log.level, any case
    ],
)
def test_mode_and_ack_wait_accepted(
    write: Callable[[dict[str, Any]], Path], mode: str, ack_wait: float, expected: tuple[str, float]
) -> None:
    config = load_config(write(with_changes(("sources.0.mode", mode), ("sources.0.ack_wait", ack_wait))), environ={})
    assert (config.sources[0].mode, config.sources[0].ack_wait) == expected


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (0, 0),
        (65536, 65536),
        ("64KiB", 65536),
        ("64 KiB/s", 65536),
        ("1MB", 1_000_000),
        ("1.5MiB", 1_572_864),
        ("50kbit", 6250),
        ("50 kbit/s", 6250),
        ("2Mbit", 250_000),
        ("512B", 512),
        ("3kB", 3000),
    ],
)
def test_rate_limit_takes_units_of_bytes_and_bits(
    write: Callable[[dict[str, Any]], Path], rate: int | str, expected: int
) -> None:
    """In bytes per second; a number is bytes per second; ``b`` alone (bits or bytes?) is refused (RULES)."""
    config = load_config(write(with_changes(("sources.0.rate_limit", rate))), environ={})
    assert config.sources[0].rate_limit == expected


def test_window_budgets_take_units_of_bytes(write: Callable[[dict[str, Any]], Path]) -> None:
    changed = with_changes(("sources.0.window_budget", "8MiB"), ("engine.windows_budget", "1GB"))
    config = load_config(write(changed), environ={})
    assert (config.sources[0].window_budget, config.engine.windows_budget) == (8 * 1024 * 1024, 1_000_000_000)
    # a bound consumer with the default budget is fine: the runner gives it none (bridge.runtime.source)
    bound = load_config(write(with_changes(("sources.0.manage_consumer", False))), environ={})
    assert (bound.sources[0].window_budget, bound.engine.windows_budget) == (32 * 1024 * 1024, 256 * 1024 * 1024)


def test_api_requests_in_flight_defaults_to_128(
    write: Callable[[dict[str, Any]], Path],
) -> None:
    assert load_config(write(MINIMAL), environ={}).engine.api_requests_in_flight == 128
    changed = load_config(write(with_changes(("engine.api_requests_in_flight", 16))), environ={})
    assert changed.engine.api_requests_in_flight == 16


def test_publishes_in_flight_defaults_to_4096(write: Callable[[dict[str, Any]], Path]) -> None:
    assert load_config(write(MINIMAL), environ={}).engine.publishes_in_flight == 4096
    changed = load_config(write(with_changes(("engine.publishes_in_flight", 8))), environ={})
    assert changed.engine.publishes_in_flight == 8


def test_mode_and_ack_wait_from_the_environment(write: Callable[[dict[str, Any]], Path]) -> None:
    environ = {"NATS_BRIDGE_SOURCES__0__MODE": "pull", "NATS_BRIDGE_SOURCES__0__ACK_WAIT": "45"}
    config = load_config(write(MINIMAL), environ=environ)
    assert (config.sources[0].mode, config.sources[0].ack_wait) == ("pull", 45.0)
    problems = problems_of(write(MINIMAL), {"NATS_BRIDGE_SOURCES__0__MODE": "fc"})
    assert problems == [
        "sources[edge-a].mode: must be one of 'auto', 'flow_control' or 'pull' (got 'fc') "
        "[from environment variable NATS_BRIDGE_SOURCES__0__MODE]"
    ]


# --- one rule, one line naming its key --------------------------------------------------------------------

RULES: list[tuple[tuple[tuple[str, Any], ...], str]] = [
    ((("log.level", "verbose"),), "log.level: must be one of 'debug', 'info', 'warning' or 'error' (got 'verbose')"),
    ((("log.format", "xml"),), "log.format: must be one of"),
    ((("log.colour", "red"),), "log.colour: unknown key"),
    ((("engine.silence_timeout", 1.5),), "engine.silence_timeout: must be at least 2.0 seconds"),
    ((("engine.silence_timeout", "soon"),), "engine.silence_timeout: must be a number (got 'soon')"),
    ((("engine.silence_timeout", float("inf")),), "engine.silence_timeout: must be at least 2.0"),
    ((("engine.reset_timeout", 0),), "engine.reset_timeout: must be a number of seconds greater than 0 (got 0.0)"),
    ((("engine.reset_backoff_initial", -1),), "engine.reset_backoff_initial: must be a number of seconds greater"),
    ((("engine.reset_backoff_initial", 60),), "engine.reset_backoff_max: must be at least reset_backoff_initial"),
    ((("engine.publish_retry_initial", 0),), "engine.publish_retry_initial: must be a number of seconds greater"),
    ((("engine.publish_retry_max", 0.1),), "engine.publish_retry_max: must be at least publish_retry_initial (0.5)"),
    ((("engine.shutdown_grace", 0),), "engine.shutdown_grace: must be a number of seconds greater than 0"),
    ((("target.servers", []),), "target.servers: must list at least one server URL"),
    ((("target.servers", ["http://hub:80"]),), "target.servers[0]: must be a nats://, tls://, ws:// or wss:// URL"),
    ((("target.servers", ["nats://a:1", "hub:4222"]),), "target.servers[1]: must be a nats://"),
    ((("target.servers", ["nats://a:99999"]),), "target.servers[0]: is not a valid URL"),
    ((("target.servers", 5),), "target.servers: must be an array (got 5)"),
    ((("target.stream", DELETE),), "target.stream: required: the aggregate stream's name"),
    ((("target.stream", "AGG.1"),), "target.stream: must not contain whitespace or any of . * > / \\"),
    ((("target.stream", "A B"),), "target.stream: must not contain whitespace"),
    ((("target.stream", "a/b"),), "target.stream: must not contain"),
    ((("target.stream", ""),), "target.stream: must not be empty"),
    ((("target.domain", "a*"),), "target.domain: must not contain"),
    ((("target.publish_window", 0),), "target.publish_window: must be between 1 and 65536 un-acked publishes"),
    ((("target.publish_window", 65537),), "target.publish_window: must be between 1 and 65536"),
    ((("target.ack_timeout", 0),), "target.ack_timeout: must be a number of seconds greater than 0"),
    ((("target.stremm", "x"),), "target.stremm: unknown key (did you mean stream?); allowed here: servers, stream"),
    ((("target", DELETE),), "target: required: a [target] table"),
    ((("sources.0.name", "edge a"),), "sources[0].name: must be 1 to 64 letters, digits, '_' or '-' (got 'edge a')"),
    ((("sources.0.name", "e" * 65),), "sources[0].name: must be 1 to 64"),
    ((("sources.0.name", DELETE),), "sources[0].name: required: a unique name for this source"),
    ((("sources.0.stream", DELETE),), "sources[edge-a].stream: required: the name of the stream to replicate"),
    ((("sources.0.stream", "a>"),), "sources[edge-a].stream: must not contain"),
    ((("sources.0.domain", "a.b"),), "sources[edge-a].domain: must not contain"),
    ((("sources.0.servers", []),), "sources[edge-a].servers: must list at least one server URL"),
    ((("sources.0.servers", ["edge:4222"]),), "sources[edge-a].servers[0]: must be a nats://"),
    ((("sources.0.consumer", "my.consumer"),), "sources[edge-a].consumer: must not contain"),
    ((("sources.0.deliver_subject", "d.*"),), "sources[edge-a].deliver_subject: must be a literal subject"),
    ((("sources.0.deliver_subject", "d.>"),), "sources[edge-a].deliver_subject: must be a literal subject"),
    ((("sources.0.deliver_subject", "d..x"),), "sources[edge-a].deliver_subject: must not have empty tokens"),
    ((("sources.0.deliver_subject", "d x"),), "sources[edge-a].deliver_subject: must not contain whitespace"),
    ((("sources.0.manage_consumer", "maybe"),), "sources[edge-a].manage_consumer: must be true or false"),
    ((("sources.0.max_ack_pending", 0),), "sources[edge-a].max_ack_pending: must be between 1 and 1000000 (got 0)"),
    ((("sources.0.max_ack_pending", 1_000_001),), "sources[edge-a].max_ack_pending: must be between 1 and 1000000"),
    ((("sources.0.max_ack_pending", 1.5),), "sources[edge-a].max_ack_pending: must be a whole number"),
    (
        (("sources.0.manage_consumer", False), ("sources.0.filter_subjects", ["a.>"])),
        "sources[edge-a].filter_subjects: only allowed with manage_consumer = true: the filters of a "
        "pre-created consumer are the operator's",
    ),
    (
        (("sources.0.mode", "push"),),
        "sources[edge-a].mode: must be one of 'auto', 'flow_control' or 'pull' (got 'push')",
    ),
    ((("sources.0.mode", 2),), "sources[edge-a].mode: must be one of 'auto', 'flow_control' or 'pull' (got 2)"),
    (
        (("sources.0.ack_wait", 0.5),),
        "sources[edge-a].ack_wait: must be between 1 and 3600 seconds: the origin redelivers a message not acked "
        "within it (got 0.5)",
    ),
    ((("sources.0.ack_wait", 3600.5),), "sources[edge-a].ack_wait: must be between 1 and 3600 seconds"),
    ((("sources.0.ack_wait", -30),), "sources[edge-a].ack_wait: must be between 1 and 3600 seconds"),
    ((("sources.0.ack_wait", float("inf")),), "sources[edge-a].ack_wait: must be between 1 and 3600 seconds"),
    ((("sources.0.ack_wait", "30s"),), "sources[edge-a].ack_wait: must be a number (got '30s')"),
    ((("sources.0.filter_subjects", ["a.b*"]),), "sources[edge-a].filter_subjects[0]: '*' must be a whole token"),
    ((("sources.0.filter_subjects", ["a.>.b"]),), "sources[edge-a].filter_subjects[0]: '>' must be the whole last"),
    ((("sources.0.filter_subjects", ["a", "a"]),), "sources[edge-a].filter_subjects: 'a' is listed twice"),
    (
        (("sources.0.filter_subjects", ["x.>"]), ("sources.0.subject_transforms", [{"src": "a.*", "dest": "b.$1"}])),
        "sources[edge-a].subject_transforms: set either filter_subjects or subject_transforms: the transforms' src "
        "are the consumer's filters",
    ),
    (
        (("sources.0.subject_transforms", [{"src": "a.*", "dest": "b.$2"}]),),
        "sources[edge-a].subject_transforms: dest 'b.$2'",
    ),
    (
        (("sources.0.subject_transforms", [{"src": "a.>", "dest": "x.>"}, {"src": "a.b", "dest": "y"}]),),
        "sources[edge-a].subject_transforms: src 'a.b' overlaps src 'a.>'",
    ),
    (
        (("sources.0.subject_transforms", [{"src": "a.*", "dst": "b"}]),),
        "sources[edge-a].subject_transforms[0].dst: unknown key",
    ),
    (
        (("sources.0.start_sequence", 5), ("sources.0.start_ago", "24h")),
        "sources[edge-a]: give one start position, not start_sequence and start_ago",
    ),
    ((("sources.0.start", "latest"),), "sources[edge-a].start: must be one of 'all' or 'new'"),
    ((("sources.0.start_sequence", 0),), "sources[edge-a].start_sequence: must be between 1 and"),
    ((("sources.0.start_ago", "24x"),), "sources[edge-a].start_ago: '24x' is not a duration: give a duration"),
    ((("sources.0.start_time", "2026-11-30 08:00"),), "sources[edge-a].start_time: '2026-11-30 08:00' is not an RFC"),
    ((("sources.0.subject_prefix", "site.*"),), "sources[edge-a].subject_prefix: must be a literal subject"),
    ((("sources.0.subject_prefix", "site."),), "sources[edge-a].subject_prefix: must not have empty tokens"),
    ((("sources.0.subject_prefix", ""),), "sources[edge-a].subject_prefix: must not be empty"),
    ((("sources.0.fliter_subjects", ["a"]),), "sources[edge-a].fliter_subjects: unknown key (did you mean filter"),
    (
        (("coordination", {"enabled": False}), ("sources", [])),
        "sources: at least one [[sources]] table is required (with [coordination] enabled the source registry",
    ),
    (
        (("coordination", {"enabled": False}), ("sources", DELETE)),
        "sources: at least one [[sources]] table is required",
    ),
    ((("sources", {"name": "x"}),), "sources: must be an array of tables: write one [[sources]] table per source"),
    ((("sourcess", 1),), "sourcess: unknown key (did you mean sources?)"),
    ((("target.auth", {"user": "u"}),), "target.auth.password: required when user is set"),
    ((("target.auth", {"password": "p"}),), "target.auth.password: given without user"),
    ((("target.auth", {"user": ""}),), "target.auth.user: must not be empty"),
    ((("target.auth", {"token": ""}),), "target.auth.token: must not be empty"),
    (
        (("target.auth", {"token": "t", "user": "u", "password": "p"}),),
        "target.auth: more than one authentication method (user/password, token): keep exactly one",
    ),
    ((("target.auth", {"creds_file": "/nonexistent/x.creds"}),), "target.auth.creds_file: file '/nonexistent/x.creds'"),
    ((("target.auth", {"nkey_seed_file": "/nonexistent/x.nk"}),), "target.auth.nkey_seed_file: file '/nonexist"),
    ((("target.auth", {"jwt": "x"}),), "target.auth.jwt: unknown key"),
    ((("target.tls", {"ca_file": "/nonexistent/ca.pem"}),), "target.tls.ca_file: file '/nonexistent/ca.pem' does"),
    ((("target.tls", {"ca_file": "/"}),), "target.tls.ca_file: '/' is a directory, not a file"),
    ((("sources.0.auth", {"user": "u"}),), "sources[edge-a].auth.password: required when user is set"),
    ((("sources.0.tls", {"cert_file": "/nonexistent/c.pem"}),), "sources[edge-a].tls.cert_file: file '/nonexist"),
    (
        (("sources.0.rate_limit", "64 kb"),),
        "sources[edge-a].rate_limit: '64 kb': unknown unit 'kb': B for bytes or bit",
    ),
    ((("sources.0.rate_limit", "fast"),), "sources[edge-a].rate_limit: 'fast' is not a rate: give bytes per second"),
    ((("sources.0.rate_limit", -5),), "sources[edge-a].rate_limit: -5 is negative; give bytes per second"),
    ((("sources.0.rate_limit", "200GB"),), "sources[edge-a].rate_limit: '200GB' is out of range: at most 100GB"),
    ((("sources.0.rate_limit", "4bit"),), "sources[edge-a].rate_limit: '4bit' is below one byte per second"),
    ((("sources.0.rate_limit", "2Kibit"),), "sources[edge-a].rate_limit: '2Kibit': unknown unit 'Kibit'"),
    ((("sources.0.window_budget", "16Mbit"),), "sources[edge-a].window_budget: '16Mbit' is not a size: give bytes"),
    ((("sources.0.window_budget", -1),), "sources[edge-a].window_budget: -1 is out of range: from 0 to 1TiB"),
    ((("engine.windows_budget", "lots"),), "engine.windows_budget: 'lots' is not a size"),
    ((("engine.api_requests_in_flight", 0),), "engine.api_requests_in_flight: must be between 1 and 4096 requests"),
    ((("engine.publishes_in_flight", 0),), "engine.publishes_in_flight: must be between 1 and 1048576 publishes"),
    (
        (("sources.0.manage_consumer", False), ("sources.0.window_budget", "8MiB")),
        "sources[edge-a].window_budget: only allowed with manage_consumer = true: the bridge never changes a "
        "pre-created consumer, so set its max_ack_pending on the consumer itself",
    ),
    (
        (("sources.0.manage_consumer", False), ("sources.0.rate_limit", "1MB")),
        "sources[edge-a].rate_limit: only allowed with manage_consumer = true",
    ),
]


@pytest.mark.parametrize(("changes", "expected"), RULES, ids=[r[1][:60] for r in RULES])
def test_rule_gives_one_line_naming_its_key(
    write: Callable[[dict[str, Any]], Path], changes: tuple[tuple[str, Any], ...], expected: str
) -> None:
    problems = problems_of(write(with_changes(*changes)))
    assert any(p.startswith(expected) for p in problems), problems
    assert all("\n" not in p and "errors.pydantic.dev" not in p for p in problems)


def test_cert_and_key_go_together(write: Callable[[dict[str, Any]], Path], tmp_path: Path) -> None:
    pem = tmp_path / "c.pem"
    pem.write_text("x")
    only_cert = problems_of(write(with_changes(("target.tls", {"cert_file": str(pem)}))))
    assert only_cert == [
        "target.tls.key_file: required when cert_file is set: give both cert_file and key_file, or neither"
    ]
    only_key = problems_of(write(with_changes(("target.tls", {"key_file": str(pem)}))))
    assert only_key[0].startswith("target.tls.key_file: given without cert_file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_auth_file_must_be_regular(write: Callable[[dict[str, Any]], Path], tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # opening it to probe would block: the check must not
    problems = problems_of(write(with_changes(("target.tls", {"ca_file": str(fifo)}))))
    assert problems == [f"target.tls.ca_file: {str(fifo)!r} is not a regular file"]


def test_auth_file_given_as_directory(write: Callable[[dict[str, Any]], Path], tmp_path: Path) -> None:
    problems = problems_of(write(with_changes(("target.auth", {"creds_file": str(tmp_path)}))))
    assert problems == [f"target.auth.creds_file: {str(tmp_path)!r} is a directory, not a file"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_unreadable_auth_file(write: Callable[[dict[str, Any]], Path], tmp_path: Path) -> None:
    creds = tmp_path / "x.creds"
    creds.write_text("x")
    creds.chmod(0)
    problems = problems_of(write(with_changes(("target.auth", {"creds_file": str(creds)}))))
    assert problems == [
        f"target.auth.creds_file: file {str(creds)!r} is not readable by this process (permission denied)"
    ]


def test_duplicate_names_reported_with_other_problems(write: Callable[[dict[str, Any]], Path]) -> None:
    data = copy.deepcopy(MINIMAL)
    data["sources"].append({"name": "edge-a", "stream": "B", "max_ack_pending": 0})
    problems = problems_of(write(data))
    assert problems == [
        "sources[1].max_ack_pending: must be between 1 and 1000000 (got 0)",
        "sources[1].name: 'edge-a' is already the name of sources[0]: names must be unique (they identify "
        "the source in logs and metrics, and by default name its consumer and deliver subject)",
    ]


def test_duplicate_names_with_built_in_error_types(write: Callable[[dict[str, Any]], Path]) -> None:
    # The duplicate check re-raises the other sources' errors: every kind must survive that.
    data = copy.deepcopy(MINIMAL)
    data["sources"] += [
        {"name": "edge-a", "bogus": 1, "manage_consumer": "x", "servers": 3},
        {"name": "b", "stream": "B", "auth": {"token": 5}, "tls": {"ca_file": 7}},
    ]
    data["log"] = {"level": "loud"}
    problems = problems_of(write(data))
    assert [p.split(":", 1)[0] for p in problems] == [
        "log.level",
        "sources[1].servers",
        "sources[1].stream",
        "sources[1].manage_consumer",
        "sources[1].bogus",
        "sources[b].auth.token",
        "sources[b].tls.ca_file",
        "sources[1].name",
    ]
    assert problems[-1].startswith("sources[1].name: 'edge-a' is already the name of sources[0]")


def test_duplicate_names_alone(write: Callable[[dict[str, Any]], Path]) -> None:
    data = copy.deepcopy(MINIMAL)
    data["sources"] += [{"name": "edge-b", "stream": "B"}, {"name": "edge-a", "stream": "C"}]
    problems = problems_of(write(data))
    assert len(problems) == 1 and problems[0].startswith("sources[2].name: 'edge-a' is already the name of sources[0]")


def test_several_problems_give_several_lines(write: Callable[[dict[str, Any]], Path]) -> None:
    data = with_changes(
        ("log.level", "loud"),
        ("engine.silence_timeout", 1),
        ("target.stream", DELETE),
        ("target.publish_window", 0),
        ("sources.0.max_ack_pending", 0),
        ("sources.0.deliver_subject", "a.*"),
    )
    data["sources"].append({"name": "edge-b", "stream": "B", "manage_consumer": False, "filter_subjects": ["x"]})
    problems = problems_of(write(data))
    assert [p.split(":", 1)[0] for p in problems] == [
        "log.level",
        "engine.silence_timeout",
        "target.stream",
        "target.publish_window",
        "sources[edge-a].deliver_subject",
        "sources[edge-a].max_ack_pending",
        "sources[edge-b].filter_subjects",
    ]


def test_source_named_by_index_when_name_is_ambiguous(write: Callable[[dict[str, Any]], Path]) -> None:
    data = copy.deepcopy(MINIMAL)
    data["sources"] = [{"name": "7", "stream": "A", "max_ack_pending": 0}]
    assert problems_of(write(data)) == ["sources[0].max_ack_pending: must be between 1 and 1000000 (got 0)"]


# --- environment overrides --------------------------------------------------------------------------------


def test_env_overrides_scalar(write: Callable[[dict[str, Any]], Path]) -> None:
    path = write(with_changes(("engine.silence_timeout", 9.0)))
    config = load_config(path, environ={"NATS_BRIDGE_ENGINE__SILENCE_TIMEOUT": "3", "NATS_BRIDGE_LOG__LEVEL": "debug"})
    assert config.engine.silence_timeout == 3.0
    assert config.engine.reset_timeout == 5.0
    assert config.log.level == "debug"


def test_env_names_are_case_insensitive(write: Callable[[dict[str, Any]], Path]) -> None:
    config = load_config(write(MINIMAL), environ={"nats_bridge_target__Stream": "OTHER"})
    assert config.target.stream == "OTHER"


def test_env_nested_secret(write: Callable[[dict[str, Any]], Path]) -> None:
    path = write(with_changes(("target.auth", {"user": "bridge"})))
    config = load_config(path, environ={"NATS_BRIDGE_TARGET__AUTH__PASSWORD": "s3cret-pw"})
    assert config.target.auth is not None and config.target.auth.password is not None
    assert config.target.auth.user == "bridge"
    assert config.target.auth.password.get_secret_value() == "s3cret-pw"
    assert config.target.stream == "AGG"  # the rest of [target] still comes from the file


def test_env_target_servers_plain_and_json(write: Callable[[dict[str, Any]], Path]) -> None:
    plain = load_config(write(MINIMAL), environ={"NATS_BRIDGE_TARGET__SERVERS": "nats://x:1"})
    assert plain.target.servers == ["nats://x:1"]
    many = load_config(write(MINIMAL), environ={"NATS_BRIDGE_TARGET__SERVERS": '["nats://x:1", "tls://y:2"]'})
    assert many.target.servers == ["nats://x:1", "tls://y:2"]


def test_env_sources_index_overrides_one_field(write: Callable[[dict[str, Any]], Path]) -> None:
    data = copy.deepcopy(MINIMAL)
    data["sources"].append({"name": "edge-b", "stream": "B", "auth": {"user": "u", "password": "file-pw"}})
    environ = {
        "NATS_BRIDGE_SOURCES__0__AUTH__TOKEN": "tok-from-env",
        "NATS_BRIDGE_SOURCES__1__MAX_ACK_PENDING": "42",
        "NATS_BRIDGE_SOURCES__1__AUTH__PASSWORD": "env-pw",
        "NATS_BRIDGE_SOURCES__1__FILTER_SUBJECTS": '["b.>"]',
    }
    config = load_config(write(data), environ=environ)
    a, b = config.sources
    assert a.auth is not None and a.auth.token is not None
    assert a.auth.token.get_secret_value() == "tok-from-env"
    assert (a.name, a.stream, a.servers) == ("edge-a", "ORDERS", ["nats://edge-a:4222"])
    assert (b.name, b.max_ack_pending, b.filter_subjects) == ("edge-b", 42, ["b.>"])
    assert b.auth is not None and b.auth.user == "u" and b.auth.password is not None
    assert b.auth.password.get_secret_value() == "env-pw"


def test_env_sources_index_renames_and_defaults_follow(write: Callable[[dict[str, Any]], Path]) -> None:
    config = load_config(write(MINIMAL), environ={"NATS_BRIDGE_SOURCES__0__NAME": "edge-z"})
    assert config.sources[0].consumer == "nats-bridge-edge-z"
    assert config.sources[0].deliver_subject == "nats-bridge.deliver.edge-z"


def test_env_sources_json_replaces_all(write: Callable[[dict[str, Any]], Path]) -> None:
    replacement = [{"name": "x", "stream": "X"}, {"name": "y", "stream": "Y", "domain": "leaf"}]
    config = load_config(write(MINIMAL), environ={"NATS_BRIDGE_SOURCES": json.dumps(replacement)})
    assert [(s.name, s.stream, s.api_prefix) for s in config.sources] == [
        ("x", "X", "$JS.API"),
        ("y", "Y", "$JS.leaf.API"),
    ]


def test_env_sources_json_then_index_override(write: Callable[[dict[str, Any]], Path]) -> None:
    environ = {
        "NATS_BRIDGE_SOURCES": json.dumps([{"name": "x", "stream": "X"}]),
        "NATS_BRIDGE_SOURCES__0__STREAM": "Z",
    }
    assert load_config(write(MINIMAL), environ=environ).sources[0].stream == "Z"


def test_env_only_configuration() -> None:
    environ = {
        "NATS_BRIDGE_TARGET__STREAM": "AGG",
        "NATS_BRIDGE_SOURCES__0__NAME": "a",
        "NATS_BRIDGE_SOURCES__0__STREAM": "A",
        "NATS_BRIDGE_SOURCES__1": json.dumps({"name": "b", "stream": "B", "servers": "nats://b:4222"}),
    }
    config = load_config(None, environ=environ)
    assert [(s.name, s.servers) for s in config.sources] == [("a", ["nats://127.0.0.1:4222"]), ("b", ["nats://b:4222"])]


def test_env_problem_lines_name_the_variable(write: Callable[[dict[str, Any]], Path]) -> None:
    problems = problems_of(
        write(MINIMAL), {"NATS_BRIDGE_SOURCES__0__MAX_ACK_PENDING": "0", "NATS_BRIDGE_TARGET__PUBLISH_WINDOW": "x"}
    )
    assert problems == [
        "target.publish_window: must be a whole number (got 'x') "
        "[from environment variable NATS_BRIDGE_TARGET__PUBLISH_WINDOW]",
        "sources[edge-a].max_ack_pending: must be between 1 and 1000000 (got 0) "
        "[from environment variable NATS_BRIDGE_SOURCES__0__MAX_ACK_PENDING]",
    ]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"NATS_BRIDGE_SOURCES": "[{"}, "sources: NATS_BRIDGE_SOURCES is not valid JSON"),
        ({"NATS_BRIDGE_SOURCES": "{}"}, "sources: NATS_BRIDGE_SOURCES must be a JSON array (got an object)"),
        ({"NATS_BRIDGE_SOURCES__first__NAME": "a"}, "sources: NATS_BRIDGE_SOURCES__first__NAME: 'first' is not a"),
        ({"NATS_BRIDGE_SOURCES__3__NAME": "a"}, "sources[3]: NATS_BRIDGE_SOURCES__3__NAME refers to source 3, but"),
        ({"NATS_BRIDGE_SOURCES__0": "[]"}, "sources[0]: NATS_BRIDGE_SOURCES__0 must be a JSON object (got an array)"),
        ({"NATS_BRIDGE_TARGET": "{oops"}, "target: a NATS_BRIDGE_TARGET or NATS_BRIDGE_TARGET__* environment"),
        ({"NATS_BRIDGE_TARGET__SERVERS": "[nats"}, "target.servers: looks like a JSON array but is not valid JSON"),
        ({"NATS_BRIDGE_TARGET__STREEM": "x"}, "target.streem: unknown key (did you mean stream?)"),
    ],
)
def test_env_mistakes_are_reported(
    write: Callable[[dict[str, Any]], Path], environ: dict[str, str], expected: str
) -> None:
    problems = problems_of(write(MINIMAL), environ)
    assert any(p.startswith(expected) for p in problems), problems


def test_env_index_needs_an_array_in_the_file(write: Callable[[dict[str, Any]], Path]) -> None:
    data = with_changes(("sources", {"name": "x"}))
    problems = problems_of(write(data), {"NATS_BRIDGE_SOURCES__0__STREAM": "S"})
    assert problems[0].startswith("sources: cannot apply the NATS_BRIDGE_SOURCES__<index> variables")
    assert problems[1].startswith("sources: must be an array of tables")


def test_invalid_env_json_is_not_blamed_for_file_errors(write: Callable[[dict[str, Any]], Path]) -> None:
    problems = problems_of(write(with_changes(("engine.reset_timeout", 0))), {"NATS_BRIDGE_ENGINE": "{"})
    assert problems[0].startswith("engine: a NATS_BRIDGE_ENGINE or NATS_BRIDGE_ENGINE__* environment variable")
    assert problems[1] == "engine.reset_timeout: must be a number of seconds greater than 0 (got 0.0)"


def test_environ_defaults_to_os_environ(
    write: Callable[[dict[str, Any]], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NATS_BRIDGE_TARGET__STREAM", "FROM_OS")
    assert load_config(write(MINIMAL)).target.stream == "FROM_OS"
    assert load_config(write(MINIMAL), environ={}).target.stream == "AGG"


def test_unrelated_prefixed_variables_are_ignored(write: Callable[[dict[str, Any]], Path]) -> None:
    # The CLI may read variables of its own under the same prefix.
    config = load_config(write(MINIMAL), environ={"NATS_BRIDGE_CONFIG": "/etc/x.toml", "PATH": "/bin"})
    assert config.target.stream == "AGG"


# --- secrets ----------------------------------------------------------------------------------------------

SECRET = "hunter2-Zq9"


def _all_text(err: ConfigError) -> str:
    return "\n".join([str(err), repr(err), format_config_error(err), *err.problems])


def test_secrets_not_in_repr_or_str(write: Callable[[dict[str, Any]], Path]) -> None:
    data = with_changes(("target.auth", {"user": "u", "password": SECRET}), ("sources.0.auth", {"token": SECRET}))
    config = load_config(write(data), environ={})
    for text in (repr(config), str(config), repr(config.target), repr(config.sources[0]), str(config.model_dump())):
        assert SECRET not in text


@pytest.mark.parametrize(
    "changes",
    [
        (("target.auth", {"pasword": SECRET, "user": "u"}),),  # misspelt key: never echo its value
        (("target.auth", {"token": [SECRET]}),),  # wrong type for a SecretStr
        (("target.auth", {"user": "u", "password": SECRET, "token": SECRET}),),  # two methods
        (("sources.0.auth", SECRET),),  # a string where the table belongs
        (("target.servers", [f"nats://u:{SECRET}@hub:4222"]),),  # credentials in a URL
        (("target.servers", [f"http://u:{SECRET}@hub"]),),
        (("target.auth", {"token": SECRET}), ("target.publish_window", 0)),
    ],
)
def test_secrets_never_in_errors(write: Callable[[dict[str, Any]], Path], changes: tuple[tuple[str, Any], ...]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(with_changes(*changes)), environ={})
    assert SECRET not in _all_text(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_secret_from_env_never_in_errors(write: Callable[[dict[str, Any]], Path]) -> None:
    environ = {
        "NATS_BRIDGE_SOURCES__0__AUTH": json.dumps({"token": SECRET, "password": SECRET}),
        "NATS_BRIDGE_TARGET__AUTH__TOKEN": SECRET,
        "NATS_BRIDGE_TARGET__AUTH__USER": "u",
        "NATS_BRIDGE_SOURCES": json.dumps([{"name": "a", "stream": "A", "auth": {"tokn": SECRET}}]),
    }
    with pytest.raises(ConfigError) as info:
        load_config(write(MINIMAL), environ=environ)
    assert SECRET not in _all_text(info.value)
    assert len(info.value.problems) >= 2


@settings(max_examples=50)
@given(secret=st.text(alphabet=st.characters(codec="utf-8"), min_size=1))
def test_any_secret_value_is_not_echoed(secret: str) -> None:
    marker = f"<<{secret}>>"
    environ = {
        "NATS_BRIDGE_TARGET__STREAM": "AGG",
        "NATS_BRIDGE_TARGET__AUTH__TOKEN": marker,
        "NATS_BRIDGE_TARGET__AUTH__CREDS_FILE": "/nonexistent/x.creds",
        "NATS_BRIDGE_SOURCES": json.dumps([{"name": "a", "stream": "A", "auth": {"pass": marker}}]),
    }
    with pytest.raises(ConfigError) as info:
        load_config(None, environ=environ)
    assert marker not in _all_text(info.value)


# --- files and formatting ---------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.source == str(path)
    assert info.value.problems == [f"{path}: no such file (give the path of a TOML configuration file)"]


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert problems_of(tmp_path) == [f"{tmp_path}: is a directory, not a TOML configuration file"]


def test_bad_toml_names_file_line_and_column(write: Callable[[str], Path]) -> None:
    path = write('[target]\nstream = "AGG"\nservers = [\n  "nats://a:1",\n  nope\n]\n')
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}: TOML syntax error at line 5, column 3: ")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[target]\nstream = "Å"\n'.encode("latin-1"))
    (problem,) = problems_of(path)
    assert problem.startswith(f"{path}: not UTF-8 text")


def test_format_config_error() -> None:
    err = ConfigError(["target.stream: required: the aggregate stream's name", "log.level: must be one of x"], "b.toml")
    assert format_config_error(err) == (
        "nats-bridge: invalid configuration (b.toml)\n"
        "  target.stream: required: the aggregate stream's name\n"
        "  log.level: must be one of x"
    )
    assert format_config_error(ConfigError(["x: y"])).splitlines()[0] == "nats-bridge: invalid configuration"


def test_env_only_error_source() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={})
    assert info.value.source == "environment"
    # (no sources is not a problem here: with [coordination] enabled, the default, the registry may hold them)
    assert info.value.problems == [
        'target: required: a [target] table, with at least stream = "<aggregate stream>" '
        "(or NATS_BRIDGE_TARGET__STREAM)",
    ]


def test_models_are_frozen(write: Callable[[dict[str, Any]], Path]) -> None:
    config = load_config(write(MINIMAL), environ={})
    with pytest.raises(ValueError, match="frozen"):
        config.target.stream = "X"


def test_bridge_config_direct_construction_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NATS_BRIDGE_TARGET__STREAM", "AGG")
    monkeypatch.setenv("NATS_BRIDGE_SOURCES__0__NAME", "a")
    monkeypatch.setenv("NATS_BRIDGE_SOURCES__0__STREAM", "A")
    config = BridgeConfig()  # type: ignore[call-arg]
    assert config.sources[0].consumer == "nats-bridge-a"


# --- [http] and exposed secrets ---------------------------------------------------------------------------


def test_http_defaults_and_forms(write: Callable[[dict[str, Any]], Path]) -> None:
    config = load_config(write(MINIMAL), environ={})
    assert (config.http.listen, config.http.stalled_after) == ("127.0.0.1:9464", 60.0)
    for listen in ("0.0.0.0:9464", "[::]:9464", "127.0.0.1:0", ""):
        assert load_config(write({**MINIMAL, "http": {"listen": listen}}), environ={}).http.listen == listen


@pytest.mark.parametrize("listen", ["9464", ":9464", "host:", "host:http", "host:70000"])
def test_http_listen_errors_name_the_form(write: Callable[[dict[str, Any]], Path], listen: str) -> None:
    (line,) = problems_of(write({**MINIMAL, "http": {"listen": listen}}))
    assert line.startswith('http.listen: must be "host:port"')


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_exposed_secrets_names_files_and_fixes_never_secrets(
    write: Callable[[dict[str, Any]], Path], tmp_path: Path
) -> None:
    seed = tmp_path / "target.nk"
    seed.write_text("SUAEXAMPLESEED")
    data = copy.deepcopy(MINIMAL)
    data["sources"][0]["auth"] = {"token": "s3cr3t-token"}
    data["target"]["auth"] = {"nkey_seed_file": str(seed)}
    path = write(data)
    path.chmod(0o644)
    seed.chmod(0o644)
    config = load_config(path, environ={})
    findings = exposed_secrets(path, config)
    assert len(findings) == 2
    assert "sources[0].auth.token" in findings[0] and "chmod o-r" in findings[0]
    assert "target.auth.nkey_seed_file" in findings[1]
    assert all("s3cr3t-token" not in line and "SUAEXAMPLESEED" not in line for line in findings)
    path.chmod(0o640)
    seed.chmod(0o600)
    assert exposed_secrets(path, config) == []


def test_secrets_from_the_environment_do_not_make_a_readable_file_a_finding(
    write: Callable[[dict[str, Any]], Path],
) -> None:
    path = write(MINIMAL)
    path.chmod(0o644)
    config = load_config(path, environ={"NATS_BRIDGE_TARGET__AUTH__TOKEN": "from-env"})
    assert exposed_secrets(path, config) == []
