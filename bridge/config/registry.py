"""The source registry: ``[[sources]]`` tables kept in the cluster, beside the configuration file's.

Why: a fleet of many sites changes every week, and provisioning a site wants one call (``nats-bridge sources add``),
not a file edited on every host and a SIGHUP to each. Every process reads the registry and applies a change within
seconds, exactly as it applies a reload (``bridge.runtime.reload``).

Where: a KV bucket beside the coordination bucket, named ``<coordination.bucket>-sources``, one key per source
(``source.<name>``) whose value is the source's table as JSON, as the operator wrote it: each process applies its
own ``[source_defaults]`` to it, like to the file's sources. Not the coordination bucket itself: that bucket's
``max_age`` is the lease TTL (a key not rewritten within it expires), and a registered source must stay until it is
removed.

Rules (README, "Fleets of many sites"):

* A registry table is validated exactly like a ``[[sources]]`` table of the file, after the file's sources, with
  the same one-line errors.
* A name may be in the file or in the registry, never both: ``sources add`` refuses such a name, and a process
  that finds one anyway (a file edited after the name was registered) runs the file's and refuses the registry's,
  saying why.
* Secrets are not stored in the cluster: a table with an inline ``auth.password`` or ``auth.token`` is refused
  (credentials files, or the defaults' ``auth`` of each host's own configuration, keep them on the hosts).
* A process applies each entry on its own merits: an entry it cannot validate (written by a newer version, or
  invalid with this host's defaults) is refused with its problems, loudly, and the others apply.

This module is pure: reading and writing the bucket is ``bridge.io.registry``'s, watching it
``bridge.runtime.registry``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.config.loading import build_config
from bridge.config.models import BridgeConfig
from bridge.errors import ConfigError

BUCKET_SUFFIX = "-sources"
KEY_PREFIX = "source."
SECRET_KEYS = ("password", "token")

FILE = "file"
REGISTRY = "registry"


def registry_bucket(coordination_bucket: str) -> str:
    """The registry's KV bucket for a coordination bucket."""
    return coordination_bucket + BUCKET_SUFFIX


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """One registered source: its name, the KV revision that stored it, and its table (or why it is unreadable)."""

    name: str
    revision: int
    table: dict[str, Any]
    problem: str = ""  # the stored value is not a table this version can read


def encode_table(table: Mapping[str, Any]) -> bytes:
    """A table as the registry stores it (compact JSON, keys sorted: the same table is the same bytes)."""
    return json.dumps(table, sort_keys=True, separators=(",", ":")).encode()


def decode_entry(name: str, revision: int, value: bytes) -> RegistryEntry:
    """A stored value as an entry; one that is not a JSON table naming ``name`` carries its problem."""
    try:
        table = json.loads(value)
    except ValueError:
        return RegistryEntry(name, revision, {}, "the stored value is not JSON (not written by sources add)")
    if not isinstance(table, dict):
        return RegistryEntry(name, revision, {}, "the stored value is not a table")
    if table.get("name") != name:
        return RegistryEntry(name, revision, {}, f"the stored table is named {table.get('name')!r}, not {name!r}")
    return RegistryEntry(name, revision, table)


def inline_secrets(table: Mapping[str, Any]) -> list[str]:
    """The inline secrets of a source table, as problem lines (empty when it has none)."""
    auth = table.get("auth")
    if not isinstance(auth, dict):
        return []
    name = table.get("name", "?")
    return [
        f"sources[{name}].auth.{key}: a secret cannot be registered (the registry is readable by every process and "
        "operator of the fleet): use creds_file or nkey_seed_file, present on every host, or the auth of each host's "
        "[source_defaults]"
        for key in SECRET_KEYS
        if auth.get(key)
    ]


@dataclass
class Merged:
    """The configuration with the registry's sources, where each source comes from, and the entries refused."""

    config: BridgeConfig
    origins: dict[str, str]  # source name -> FILE or REGISTRY
    refused: dict[str, list[str]] = field(default_factory=dict)  # registry name -> its problem lines


def merge(
    file_data: Mapping[str, Any],
    source: str,
    entries: Sequence[RegistryEntry],
    environ: Mapping[str, str] | None = None,
) -> Merged:
    """The configuration of ``file_data`` (named ``source`` in errors) with every registry entry that is valid.

    Raises :class:`ConfigError` only for the file's own problems; a registry entry's are in ``refused``.
    """
    base = build_config(file_data, source, environ)
    origins = {s.name: FILE for s in base.sources}
    refused: dict[str, list[str]] = {}
    candidates: list[RegistryEntry] = []
    for entry in entries:
        if entry.problem:
            refused[entry.name] = [f"sources[{entry.name}]: {entry.problem}"]
        elif entry.name in origins:
            refused[entry.name] = [clash(entry.name)]
        elif secrets := inline_secrets(entry.table):
            refused[entry.name] = secrets
        else:
            candidates.append(entry)
    if not candidates:
        return Merged(base, origins, refused)

    def valid(entries: list[RegistryEntry]) -> list[RegistryEntry]:
        """The entries that validate, the others refused: halves of a failing set tried in turn, so a bad entry
        among thousands costs a few validations of the whole, not one per entry (rare: an entry sources add
        validated fails here only with this host's defaults, or when written by a newer version)."""
        try:
            build_config(file_data, source, environ, registry=[e.table for e in entries])
        except ConfigError as err:
            if len(entries) == 1:
                refused[entries[0].name] = err.problems
                return []
            half = len(entries) // 2
            return valid(entries[:half]) + valid(entries[half:])
        return entries

    good = valid(candidates)
    config = build_config(file_data, source, environ, registry=[e.table for e in good]) if good else base
    origins.update((entry.name, REGISTRY) for entry in good)
    return Merged(config, origins, refused)


def clash(name: str) -> str:
    """Why a name in both the configuration file and the registry is refused."""
    return (
        f"sources[{name}]: {name!r} is a source of the configuration file: a registered source cannot have the "
        f"same name (remove it from the file and reload, or register it under another name)"
    )
