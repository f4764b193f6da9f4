"""Loading the configuration: the TOML file, the environment over it, every problem found at once; and the secrets
that other local users could read."""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from bridge.config.env import LOADING, LoadContext
from bridge.config.errors import validation_problems
from bridge.config.models import BridgeConfig
from bridge.errors import ConfigError

_TOML_POSITION = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$")


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file at ``path``; a one-line ConfigError naming it when it cannot be read or parsed."""

    def fail(problem: str) -> ConfigError:
        return ConfigError([f"{path}: {problem}"], str(path))

    try:
        with path.open("rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise fail("no such file (give the path of a TOML configuration file)") from None
    except IsADirectoryError:
        raise fail("is a directory, not a TOML configuration file") from None
    except PermissionError:
        raise fail("cannot read the file: permission denied") from None
    except OSError as exc:
        raise fail(f"cannot read the file: {exc.strerror or exc}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text (invalid byte at offset {exc.start}); TOML files must be UTF-8") from None
    return parse_toml(text, str(path))


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """TOML text; a one-line ConfigError naming ``where`` and the position on a syntax error."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        match = _TOML_POSITION.match(message)
        if match:
            position, message = f" at line {match['line']}, column {match['col']}", match["msg"]
        else:
            position = ""
        raise ConfigError([f"{where}: TOML syntax error{position}: {message}"], where) from None


def load_config(
    path: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None = None,
    *,
    registry: Sequence[Mapping[str, Any]] = (),
) -> BridgeConfig:
    """Load the configuration from the TOML file at ``path``, overridden by ``NATS_BRIDGE_*`` variables.

    ``path`` None means the environment alone. ``environ`` defaults to ``os.environ``. Environment
    variables nest with ``__`` (``NATS_BRIDGE_TARGET__AUTH__PASSWORD``); ``NATS_BRIDGE_SOURCES__<i>__<KEY>``
    overrides one key of the i-th source, and ``NATS_BRIDGE_SOURCES`` (a JSON array) replaces them all.
    ``registry``: the source registry's tables (``bridge.config.registry``), validated after those.

    Raises :class:`~bridge.errors.ConfigError` listing every problem found, one line each.
    """
    source = str(path) if path is not None else "environment"
    file_data = read_toml(Path(path)) if path is not None else {}
    return build_config(file_data, source, environ, registry=registry)


def load_file(path: str) -> tuple[dict[str, Any], BridgeConfig]:
    """The TOML file at ``path`` and its configuration (as :func:`load_config`): for what validates more against
    the same contents (the source registry's tables, ``bridge.config.registry``)."""
    data = read_toml(Path(path))
    return data, build_config(data, path)


def build_config(
    file_data: Mapping[str, Any],
    source: str,
    environ: Mapping[str, str] | None = None,
    *,
    registry: Sequence[Mapping[str, Any]] = (),
) -> BridgeConfig:
    """:func:`load_config` from the file's parsed contents (``source`` names it in errors): a process applying a
    registry change validates against the file it loaded, not one edited on disk since and not reloaded."""
    ctx = LoadContext(
        environ=os.environ if environ is None else environ,
        file_data=dict(file_data),
        collect=True,
        registry=[dict(table) for table in registry],
    )
    token = LOADING.set(ctx)
    try:
        # The sources come from ctx (see BridgeConfig.settings_customise_sources), so no arguments here.
        config = BridgeConfig()  # type: ignore[call-arg]
    except ValidationError as exc:
        # `from None`: the chained ValidationError's text would carry the inputs, secrets included.
        raise ConfigError(ctx.problems + validation_problems(exc, ctx), source) from None
    except SettingsError as exc:
        raise ConfigError(ctx.problems or [f"environment: {exc}"], source) from None
    finally:
        LOADING.reset(token)
    if ctx.problems:
        raise ConfigError(ctx.problems, source)
    return config


def exposed_secrets(path: str | os.PathLike[str], config: BridgeConfig) -> list[str]:
    """Secrets other local users can read: the configuration file when it holds a password or token itself, and
    nkey seed / creds files, when any of them is readable by "others" (mode ``o+r``). One line per finding, naming
    the file and the fix; never the secret. POSIX only (empty elsewhere)."""
    if os.name != "posix":
        return []
    findings: list[str] = []

    def world_readable(file: str | os.PathLike[str]) -> bool:
        try:
            return bool(os.stat(file).st_mode & stat.S_IROTH)
        except OSError:
            return False

    sides = [("target", config.target.auth)] + [(f"sources[{i}]", s.auth) for i, s in enumerate(config.sources)]
    raw = read_toml(Path(path))
    raw_sources = raw.get("sources") if isinstance(raw.get("sources"), list) else []
    inline = []
    tables = [("target", raw.get("target")), ("source_defaults", raw.get("source_defaults"))]
    for where, section in tables + [(f"sources[{i}]", item) for i, item in enumerate(raw_sources or [])]:
        auth = section.get("auth") if isinstance(section, dict) else None
        if isinstance(auth, dict):
            inline += [f"{where}.auth.{key}" for key in ("password", "token") if auth.get(key)]
    if inline and world_readable(path):
        findings.append(
            f"{path} is readable by every local user and holds {', '.join(inline)}: chmod o-r {path}, or move the "
            "secrets to NATS_BRIDGE_* environment variables"
        )
    for where, auth in sides:
        if auth is None:
            continue
        for key in ("nkey_seed_file", "creds_file"):
            file = getattr(auth, key)
            if file is not None and world_readable(file):
                findings.append(f"{where}.auth.{key} {file} is readable by every local user: chmod o-r {file}")
    return findings
