"""The source registry's rules (bridge.config.registry, bridge.commands.sources): validated like the file's sources,
never a name of the file's, never a secret, each entry applied on its own merits."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from bridge.commands.sources import Change, change_all, read_tables, validate_tables
from bridge.config.loading import build_config
from bridge.config.registry import (
    FILE,
    REGISTRY,
    RegistryEntry,
    decode_entry,
    encode_table,
    merge,
    registry_bucket,
)
from bridge.errors import ApiTimeout, ConfigError
from bridge.io.kv import KvConflict
from bridge.io.registry import RegistryBucket

FILE_TEXT = """
[target]
stream = "AGG"

[source_defaults]
servers = ["nats://hub:4222"]
subject_prefix = "edge.{domain}"

[[sources]]
name = "edge1"
domain = "site1"
stream = "ORDERS"
"""
DATA: dict[str, Any] = tomllib.loads(FILE_TEXT)


def entry(name: str, revision: int = 1, **table: Any) -> RegistryEntry:
    return RegistryEntry(name, revision, {"name": name, "domain": name.replace("edge", "site"), **table})


def test_registered_sources_follow_the_files_with_its_defaults() -> None:
    merged = merge(DATA, "bridge.toml", [entry("edge2", stream="SALES"), entry("edge3", stream="ORDERS")], environ={})
    assert [s.name for s in merged.config.sources] == ["edge1", "edge2", "edge3"]
    assert merged.origins == {"edge1": FILE, "edge2": REGISTRY, "edge3": REGISTRY}
    assert merged.config.sources[1].subject_prefix == "edge.site2"  # [source_defaults] with {domain}
    assert merged.config.sources[1].servers == ["nats://hub:4222"]
    assert merged.refused == {}


def test_each_entry_on_its_own_merits() -> None:
    entries = [
        entry("edge1", stream="X"),  # the file's name
        entry("edge2", stream="SALES", max_ack_pending=0),  # invalid
        entry("edge3", stream="ORDERS", auth={"user": "u", "password": "p"}),  # a secret
        RegistryEntry("edge4", 3, {}, "the stored value is not a table"),
        entry("edge5", stream="ORDERS"),  # fine
    ]
    merged = merge(DATA, "bridge.toml", entries, environ={})
    assert [s.name for s in merged.config.sources] == ["edge1", "edge5"]
    assert merged.config.sources[0].stream == "ORDERS"  # the file's edge1 runs, not the registry's
    refused = merged.refused
    assert refused["edge1"] == [
        "sources[edge1]: 'edge1' is a source of the configuration file: a registered source cannot have the same "
        "name (remove it from the file and reload, or register it under another name)"
    ]
    assert refused["edge2"] == ["sources[edge2].max_ack_pending: must be between 1 and 1000000 (got 0)"]
    assert refused["edge3"][0].startswith("sources[edge3].auth.password: a secret cannot be registered")
    assert "p" not in " ".join(refused["edge3"]).split()  # never the secret itself
    assert refused["edge4"] == ["sources[edge4]: the stored value is not a table"]


def test_a_file_without_sources_runs_the_registrys() -> None:
    data = {"target": {"stream": "AGG"}, "source_defaults": {"servers": ["nats://hub:4222"]}}
    assert build_config(data, "bridge.toml", environ={}).sources == []
    merged = merge(data, "bridge.toml", [entry("edge2", stream="SALES")], environ={})
    assert [s.name for s in merged.config.sources] == ["edge2"]
    # without [coordination] there is no registry: a file needs its own sources
    with pytest.raises(ConfigError) as info:
        build_config({**data, "coordination": {"enabled": False}}, "bridge.toml", environ={})
    assert info.value.problems[0].startswith("sources: at least one [[sources]] table is required")


def test_stored_values_round_trip_and_strangers_are_named() -> None:
    table = {"stream": "S", "name": "edge2", "max_ack_pending": 10}
    # sorted: the same table is the same bytes
    assert encode_table(table) == b'{"max_ack_pending":10,"name":"edge2","stream":"S"}'
    assert decode_entry("edge2", 7, encode_table(table)) == RegistryEntry("edge2", 7, table)
    assert decode_entry("edge2", 7, b"{not json").problem.startswith("the stored value is not JSON")
    assert decode_entry("edge2", 7, b"[1]").problem == "the stored value is not a table"
    assert decode_entry("edge2", 7, b'{"name":"edge9"}').problem == "the stored table is named 'edge9', not 'edge2'"
    assert registry_bucket("nats-bridge") == "nats-bridge-sources"


def test_a_sources_file_is_refused_whole_naming_each_problem(tmp_path: Any) -> None:
    path = tmp_path / "sites.toml"
    path.write_text(
        """
[[sources]]
name = "edge1"
domain = "site1"
stream = "ORDERS"

[[sources]]
name = "edge2"
domain = "site2"
stream = "ORDERS"
max_ack_pending = "many"

[[sources]]
name = "edge3"
domain = "site3"
stream = "ORDERS"
auth = { token = "s3cret-token" }
""",
        encoding="utf-8",
    )
    tables = read_tables(str(path))
    config = build_config(DATA, "bridge.toml", environ={})
    with pytest.raises(ConfigError) as info:
        validate_tables(DATA, config, tables, str(path))
    assert info.value.source == str(path)
    problems = info.value.problems
    assert problems[0].startswith("sources[edge1]: 'edge1' is a source of the configuration file")
    assert problems[1].startswith("sources[edge3].auth.token: a secret cannot be registered")
    assert "sources[edge2].max_ack_pending: must be a whole number (got 'many')" in problems
    assert "s3cret-token" not in "\n".join(problems)


def test_a_table_without_a_name_is_numbered_as_in_its_own_file() -> None:
    config = build_config(DATA, "bridge.toml", environ={})
    tables = [{"name": "edge2", "domain": "site2", "stream": "S"}, {"domain": "site3", "stream": "S"}]
    with pytest.raises(ConfigError) as info:
        validate_tables(DATA, config, tables, "sites.toml")
    assert info.value.problems == ["sources[1].name: required: a unique name for this source, in the table itself"]


def test_a_sources_file_holds_sources_only(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as info:
        read_tables("-", stdin=lambda: '[target]\nstream = "X"\n')
    assert info.value.source == "stdin"
    assert info.value.problems == [
        "target: unknown key; a sources file holds [[sources]] tables only",
        "sources: required: one or more [[sources]] tables, each with name, servers and stream",
    ]
    with pytest.raises(ConfigError) as info:
        read_tables("-", stdin=lambda: "[[sources]]\nname = \n")
    assert info.value.problems[0].startswith("stdin: TOML syntax error at line 2, column 8: ")
    assert read_tables("-", stdin=lambda: '[[sources]]\nname = "a"\n') == [{"name": "a"}]
    with pytest.raises(ConfigError) as info:
        read_tables(str(tmp_path / "missing.toml"))
    assert info.value.problems[0].endswith("missing.toml: no such file (give the path of a TOML configuration file)")


class Bucket(RegistryBucket):
    """A registry in memory whose ``fail_at``-th write fails (no connection: only put and remove are used)."""

    def __init__(self, fail_at: int) -> None:
        self.bucket = "nats-bridge-sources"
        self.values: dict[str, tuple[int, dict[str, Any] | None]] = {}
        self.writes = 0
        self.fail_at = fail_at
        self.last = 0

    def _write(self, name: str, table: dict[str, Any] | None, revision: int) -> int:
        self.writes += 1
        if self.writes == self.fail_at:
            raise ApiTimeout(f"no reply to $KV.nats-bridge-sources.source.{name} within 5s")
        current = self.values.get(name, (0, None))[0]
        if current != revision:
            raise KvConflict(f"source.{name}: wrong last sequence")
        self.last += 1
        self.values[name] = (self.last, table)
        return self.last

    async def put(self, table: dict[str, Any], revision: int, timeout: float) -> int:
        return self._write(str(table["name"]), table, revision)

    async def remove(self, name: str, revision: int, timeout: float) -> int:
        return self._write(name, None, revision)

    def tables(self) -> dict[str, dict[str, Any]]:
        return {name: table for name, (_, table) in self.values.items() if table is not None}


@pytest.mark.anyio
async def test_a_failed_write_undoes_the_ones_made_before_it() -> None:
    bucket = Bucket(fail_at=0)
    old = {"name": "edge2", "stream": "OLD"}
    await bucket.put(old, 0, 1.0)
    before = bucket.tables()
    bucket.fail_at = bucket.writes + 3  # the third write of the change fails
    stored = RegistryEntry("edge2", bucket.values["edge2"][0], old)
    changes = [
        Change("edge2", {"name": "edge2", "stream": "NEW"}, stored),
        Change("edge3", {"name": "edge3", "stream": "S"}, None),
        Change("edge4", {"name": "edge4", "stream": "S"}, None),
        Change("edge5", {"name": "edge5", "stream": "S"}, None),
    ]
    failed = await change_all(bucket, changes)
    assert failed.startswith("edge4: no reply to $KV.nats-bridge-sources.source.edge4 within 5s")
    assert failed.endswith("(the 2 change(s) made before it were undone)")
    assert bucket.tables() == before  # edge2 as it was, edge3 gone again, edge5 never written
    # and a change made whole
    bucket.fail_at = 0
    stored = RegistryEntry("edge2", bucket.values["edge2"][0], old)
    assert await change_all(bucket, [Change("edge2", None, stored), Change("edge6", {"name": "edge6"}, None)]) == ""
    assert bucket.tables() == {"edge6": {"name": "edge6"}}
