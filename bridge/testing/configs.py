"""Bridge configurations for scenarios on real servers: a TOML file from a target URL and source specs.

The engine and lease timings are shortened (:data:`TEST_ENGINE`, :data:`TEST_COORDINATION`) so every recovery a
scenario provokes completes within seconds; logs are JSON so the harness can read them back as events.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "AGGREGATE",
    "ORIGIN",
    "TEST_COORDINATION",
    "TEST_ENGINE",
    "SourceSpec",
    "config_text",
    "toml_value",
    "write_config",
]

ORIGIN = "ORDERS"
AGGREGATE = "AGG"

# Engine timings for tests: the defaults are tuned for production (30 s reset backoff, 15 s publish retry);
# these keep every recovery within a few seconds. silence_timeout has a floor of 2 s in the config.
TEST_ENGINE: dict[str, Any] = {
    "silence_timeout": 3.0,
    "reset_timeout": 2.0,
    "reset_backoff_initial": 0.5,
    "reset_backoff_max": 2.0,
    "publish_retry_initial": 0.2,
    "publish_retry_max": 1.0,
    "shutdown_grace": 5.0,
}

# Leases for tests: a short TTL, so a process that takes over after a SIGKILL waits seconds, not ten.
TEST_COORDINATION: dict[str, Any] = {"lease_ttl": 3.0}


@dataclass
class SourceSpec:
    """One ``[[sources]]`` table."""

    name: str
    servers: str
    stream: str = ORIGIN
    domain: str | None = None
    subject_prefix: str | None = None
    max_ack_pending: int | None = None
    consumer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def consumer_name(self) -> str:
        return self.consumer or f"nats-bridge-{self.name}"

    @property
    def deliver_subject(self) -> str:
        return str(self.extra.get("deliver_subject", f"nats-bridge.deliver.{self.name}"))

    def table(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "servers": [self.servers], "stream": self.stream}
        if self.domain is not None:
            out["domain"] = self.domain
        if self.subject_prefix is not None:
            out["subject_prefix"] = self.subject_prefix
        if self.max_ack_pending is not None:
            out["max_ack_pending"] = self.max_ack_pending
        if self.consumer is not None:
            out["consumer"] = self.consumer
        out.update(self.extra)
        return out


def toml_value(value: Any) -> str:
    """A TOML literal for a bool, number, string, list of those, or an inline table of those."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def _table(header: str, values: Mapping[str, Any]) -> list[str]:
    lines = [header]
    nested = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            nested.append((key, value))
        else:
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in nested:
        sub = header.strip("[]")
        lines += _table(f"[{sub}.{key}]", value)
    return lines


def config_text(
    *,
    target_url: str | Sequence[str],
    sources: Sequence[SourceSpec],
    target_stream: str = AGGREGATE,
    engine: Mapping[str, Any] | None = None,
    target_extra: Mapping[str, Any] | None = None,
    http_extra: Mapping[str, Any] | None = None,
    coordination: Mapping[str, Any] | None = None,
    log_level: str = "info",
) -> str:
    """The TOML text of a bridge configuration (JSON logs, test engine timings unless overridden)."""
    lines = ["# written by bridge.testing.configs", ""]
    lines += _table("[log]", {"level": log_level, "format": "json"})
    lines += ["", *_table("[engine]", {**TEST_ENGINE, **(engine or {})})]
    # tests run side by side: any free port
    lines += ["", *_table("[http]", {"listen": "127.0.0.1:0", **(http_extra or {})})]
    lines += ["", *_table("[coordination]", {**TEST_COORDINATION, **(coordination or {})})]
    servers = [target_url] if isinstance(target_url, str) else list(target_url)
    target: dict[str, Any] = {"servers": servers, "stream": target_stream, **(target_extra or {})}
    lines += ["", *_table("[target]", target)]
    for spec in sources:
        lines.append("")
        lines += _table("[[sources]]", spec.table())
    return "\n".join(lines) + "\n"


def write_config(path: Path, **kwargs: Any) -> Path:
    """Write :func:`config_text` to ``path`` and return it."""
    path.write_text(config_text(**kwargs), encoding="utf-8")
    return path
