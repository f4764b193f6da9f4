"""Where the configuration's values come from: the TOML file given to ``load_config``, overridden by ``NATS_BRIDGE_*``
environment variables (nested keys joined with ``__``).

``[[sources]]`` is a list, which pydantic-settings cannot address by index, so ``NATS_BRIDGE_SOURCES__<index>__<KEY>``
is handled by this module's own settings source (see :class:`EnvSource`). Problems with variables are collected in
the :class:`LoadContext`, to be reported with the validation errors.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsError

ENV_PREFIX = "NATS_BRIDGE_"

Loc = tuple[str | int, ...]


@dataclass
class LoadContext:
    """What one load_config call hands to the settings sources, and what they report back."""

    environ: Mapping[str, str]
    file_data: dict[str, Any]
    # False when BridgeConfig() is built directly: nobody would read `problems`, so the source raises.
    collect: bool
    problems: list[str] = field(default_factory=list)
    # Which environment variable set the value at each key path, to say so in error lines.
    env_keys: dict[Loc, str] = field(default_factory=dict)
    # The sources list after the environment overrides, to name sources in error lines.
    sources_raw: Any = None
    # (source index, key) of every key a source took from [source_defaults], to name the default in error lines
    defaulted: set[tuple[int, str]] = field(default_factory=set)
    # the source registry's tables (bridge.config.registry), validated after the file's and the environment's
    registry: list[dict[str, Any]] = field(default_factory=list)


LOADING: ContextVar[LoadContext | None] = ContextVar("bridge_config_loading", default=None)


class FileSource(PydanticBaseSettingsSource):
    """The parsed TOML file, as the lowest-priority source."""

    def __init__(self, settings_cls: type[BaseSettings], ctx: LoadContext) -> None:
        super().__init__(settings_cls)
        self._data = ctx.file_data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        """Unused: ``__call__`` returns the whole file at once."""
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)


class EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, fed from a given mapping, plus list indices for ``sources``.

    pydantic-settings (2.16) turns ``NATS_BRIDGE_SOURCES__0__NAME`` into ``{"0": {"name": ...}}``, a dict that
    fails list validation and would replace the file's list anyway. So the ``SOURCES`` variables are taken
    out of what the parent sees and merged here, index by index, into the file's ``[[sources]]`` (or into
    the list ``NATS_BRIDGE_SOURCES`` gives as JSON). Problems with variables are collected, not raised,
    so they are reported together with the validation errors.
    """

    def __init__(self, settings_cls: type[BaseSettings], ctx: LoadContext) -> None:
        super().__init__(settings_cls)
        self._ctx = ctx
        self._prefix = ENV_PREFIX.lower()
        self._sources_key = f"{self._prefix}sources"
        # Sorted so that two spellings of one variable (case differs) resolve the same way every time.
        self._original = {name.lower(): name for name in sorted(ctx.environ)}
        lowered = {name.lower(): ctx.environ[name] for name in sorted(ctx.environ)}
        self.env_vars = {
            name: value
            for name, value in lowered.items()
            if name != self._sources_key and not name.startswith(self._sources_key + "__")
        }
        self._sources_vars = {
            name: value
            for name, value in lowered.items()
            if name == self._sources_key or name.startswith(self._sources_key + "__")
        }
        self._record_env_keys(lowered)

    def _record_env_keys(self, lowered: Mapping[str, str]) -> None:
        # The sources variables are recorded by _sources, once they are known to apply.
        fields = set(self.settings_cls.model_fields) - {"sources"}
        for name in lowered:
            if not name.startswith(self._prefix):
                continue
            parts = name[len(self._prefix) :].split("__")
            if parts[0] in fields:
                self._ctx.env_keys[tuple(parts)] = self._original[name]

    def _problem(self, line: str) -> None:
        self._ctx.problems.append(line)

    def prepare_field_value(self, field_name: str, field: Any, value: Any, value_is_complex: bool) -> Any:
        """The parent's, except that invalid JSON becomes a reported problem instead of an exception."""
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError as exc:
            reason = f" ({exc.msg}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            variable = f"{ENV_PREFIX}{field_name.upper()}"
            # The whole field is then taken from the file alone: no error there is the environment's.
            for loc in [loc for loc in self._ctx.env_keys if loc[0] == field_name]:
                del self._ctx.env_keys[loc]
            self._problem(
                f"{field_name}: a {variable} or {variable}__* environment variable is not valid JSON{reason}; "
                f"give a JSON object, or set single keys as {variable}__<KEY>"
            )
            return None

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        sources = self._sources()
        if sources is not None:
            data["sources"] = sources
        self._ctx.sources_raw = sources if sources is not None else self._ctx.file_data.get("sources")
        if self._ctx.problems and not self._ctx.collect:
            raise SettingsError("; ".join(self._ctx.problems))
        return data

    def _sources(self) -> list[Any] | None:
        """The sources list after the ``SOURCES`` variables, or None when none is set."""
        if not self._sources_vars:
            return None
        json_name = self._original.get(self._sources_key, ENV_PREFIX + "SOURCES")
        file_sources = self._ctx.file_data.get("sources")
        base: list[Any] | None = copy.deepcopy(file_sources) if isinstance(file_sources, list) else None
        if self._sources_key in self._sources_vars:
            replaced = self._decode_json(self._sources_vars[self._sources_key], json_name, "sources", list)
            if replaced is not None:
                base = replaced
                self._ctx.env_keys[("sources",)] = json_name
        if base is None:
            if not any(name != self._sources_key for name in self._sources_vars):
                return None  # only an invalid NATS_BRIDGE_SOURCES: the file's value stands, and is validated
            if file_sources is not None:
                # Validation reports the file's shape; applying indices to it would only add confusion.
                self._problem(
                    f"sources: cannot apply the {ENV_PREFIX}SOURCES__<index> variables: sources in the file is "
                    "not an array of tables (write [[sources]])"
                )
                return None
            base = []

        overrides: dict[int, list[tuple[list[str], str, str]]] = {}
        for name, value in self._sources_vars.items():
            if name == self._sources_key:
                continue
            original = self._original[name]
            # Keys are matched lowercased, but the index is quoted as the operator wrote it.
            written_index = original[len(self._sources_key) + 2 :].split("__")[0]
            index_text, *keys = name[len(self._sources_key) + 2 :].split("__")
            if not (index_text.isascii() and index_text.isdigit()):
                self._problem(
                    f"sources: {original}: {written_index!r} is not a source index; "
                    f"use {ENV_PREFIX}SOURCES__<index>__<KEY> with index 0, 1, ..."
                )
                continue
            if "" in keys:
                self._problem(f"sources[{int(index_text)}]: {original}: empty key between '__' separators")
                continue
            overrides.setdefault(int(index_text), []).append((keys, value, original))

        # New sources may be defined from the environment alone, but only as a contiguous extension: a gap
        # would leave a source with no settings at all, most likely a typo in an index.
        next_index = len(base)
        for index in sorted(i for i in overrides if i >= len(base)):
            if index != next_index:
                missing = (
                    f"source {next_index} is" if index == next_index + 1 else f"sources {next_index} to {index - 1} are"
                )
                for _, _, original in overrides.pop(index):
                    self._problem(
                        f"sources[{index}]: {original} refers to source {index}, but {missing} not defined "
                        "(indices start at 0 and must not skip any)"
                    )
                continue
            base.append({})
            next_index += 1

        for index, items in sorted(overrides.items()):
            entry = base[index]
            if not isinstance(entry, dict):
                self._problem(f"sources[{index}]: cannot apply {items[0][2]}: this source is not a table")
                continue
            # Whole-object variables first, so more specific keys override them.
            for keys, value, original in sorted(items, key=lambda item: len(item[0])):
                self._apply(entry, keys, value, original, index)
        return base

    def _apply(self, entry: dict[str, Any], keys: list[str], value: str, original: str, index: int) -> None:
        if not keys:
            obj = self._decode_json(value, original, f"sources[{index}]", dict)
            if obj is not None:
                _deep_merge(entry, obj)
                self._ctx.env_keys[("sources", index)] = original
            return
        decoded: Any = value
        if value.lstrip().startswith("{"):
            decoded = self._decode_json(value, original, f"sources[{index}].{'.'.join(keys)}", dict)
            if decoded is None:
                return
        node = entry
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        if isinstance(decoded, dict) and isinstance(node.get(keys[-1]), dict):
            _deep_merge(node[keys[-1]], decoded)
        else:
            node[keys[-1]] = decoded
        self._ctx.env_keys[("sources", index, *keys)] = original

    def _decode_json(self, value: str, variable: str, path: str, expected: type[Any]) -> Any:
        kind = "an array" if expected is list else "an object"
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError as exc:
            self._problem(f"{path}: {variable} is not valid JSON ({exc.msg}, column {exc.colno}); give {kind}")
            return None
        if not isinstance(decoded, expected):
            self._problem(f"{path}: {variable} must be a JSON {kind.split()[1]} (got {_json_kind(decoded)})")
            return None
        return decoded


def _json_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null"


def _deep_merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
