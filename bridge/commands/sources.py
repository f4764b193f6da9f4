"""``nats-bridge sources add | remove | list``: the source registry (``bridge.config.registry``).

``add`` validates every table of the file exactly as the configuration file's ``[[sources]]`` (the same one-line
errors, the configuration's ``[source_defaults]`` applied), refuses names of the configuration file and inline
secrets, and writes all of them or none: each write is compare-and-set on the revision read, and a write that fails
undoes those made before it. A table equal to the registered one is left alone; a different one replaces it (the
source restarts under its lease). ``remove`` takes registered names only. ``list`` shows every source, from the
file and from the registry, with its owner, and the mode and state the local daemon reports.

Every process of the fleet applies a change within about a second (``bridge.runtime.registry``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bridge.commands.common import EXIT_CONFIG, EXIT_OK, EXIT_PROBLEM, TIMEOUT, bucket_side
from bridge.commands.setup import copy_subjects, setup_command
from bridge.config import BridgeConfig, SourceConfig
from bridge.config.loading import build_config, load_file, parse_toml, read_toml
from bridge.config.registry import FILE, REGISTRY, Merged, RegistryEntry, clash, inline_secrets, merge, registry_bucket
from bridge.core.subjects import pattern_covers
from bridge.errors import BridgeError, ConfigError
from bridge.io.connect import close_connection, open_connection
from bridge.io.jsapi import STREAM_NOT_FOUND, ApiError, JsApi
from bridge.io.registry import RegistryBucket

HELP = "the source registry: add, remove or list sources every process of the fleet runs, without a file edit"
WRITES_IN_FLIGHT = 64  # a thousand sources registered in one call: their writes pipelined, not one round trip each


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``sources`` command's own subcommands."""
    sub = parser.add_subparsers(dest="sources_command", required=True, metavar="ACTION")
    add = sub.add_parser("add", help="register (or change) the sources of a TOML file of [[sources]] tables")
    add.add_argument("-c", "--config", required=True, help="the fleet's TOML configuration file")
    add.add_argument("--file", required=True, help="a TOML file of one or more [[sources]] tables; - for stdin")
    remove = sub.add_parser("remove", help="remove registered sources (each is drained and released)")
    remove.add_argument("-c", "--config", required=True, help="the fleet's TOML configuration file")
    remove.add_argument("names", nargs="+", metavar="NAME", help="a registered source's name")
    listing = sub.add_parser("list", help="every source, from the file and the registry, with its owner and state")
    listing.add_argument("-c", "--config", required=True, help="the fleet's TOML configuration file")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")


def sources(args: argparse.Namespace) -> int:
    """Dispatch ``nats-bridge sources ACTION``."""
    if args.sources_command == "add":
        return add(args.config, args.file)
    if args.sources_command == "remove":
        return remove(args.config, args.names)
    return list_sources(args.config, args.json)


# -- reading ---------------------------------------------------------------------------------------------------------


def _fleet_config(path: str) -> tuple[dict[str, Any], BridgeConfig]:
    """The configuration file's contents and configuration; a ConfigError unless it has [coordination] enabled."""
    data, config = load_file(path)
    if not config.coordination.enabled:
        raise ConfigError(
            [
                "coordination.enabled: false, and the source registry lives beside the coordination bucket: enable "
                "[coordination] (in every process of the fleet) to use it"
            ],
            path,
        )
    return data, config


def read_tables(file: str, stdin: Callable[[], str] = lambda: sys.stdin.read()) -> list[dict[str, Any]]:
    """The ``[[sources]]`` tables of ``file`` (``-``: standard input); a ConfigError naming the file otherwise."""
    where = "stdin" if file == "-" else file
    data = parse_toml(stdin(), where) if file == "-" else read_toml(Path(file))
    problems = [f"{key}: unknown key; a sources file holds [[sources]] tables only" for key in data if key != "sources"]
    tables = data.get("sources")
    if not isinstance(tables, list) or not tables:
        problems.append("sources: required: one or more [[sources]] tables, each with name, servers and stream")
    elif not all(isinstance(table, dict) for table in tables):
        problems.append("sources: must be an array of tables: write one [[sources]] table per source")
    if problems:
        raise ConfigError(problems, where)
    return [dict(table) for table in tables or []]


def validate_tables(
    data: Mapping[str, Any], config: BridgeConfig, tables: Sequence[dict[str, Any]], where: str
) -> list[SourceConfig]:
    """``tables`` as registry sources of this configuration, validated; every problem raised as one ConfigError
    (``where`` names the sources file): a name of the file's, an inline secret, or anything the file's own check
    refuses."""
    names = {s.name for s in config.sources}
    problems: list[str] = []
    seen: set[str] = set()
    checked = []  # the tables validated as sources: not those refused by name already (one line per problem)
    for index, table in enumerate(tables):
        name = table.get("name")
        if not isinstance(name, str):  # (validation would number it after the file's sources)
            problems.append(f"sources[{index}].name: required: a unique name for this source, in the table itself")
        elif name in names:
            problems.append(clash(name))
        elif name in seen:
            problems.append(f"sources[{name}]: listed twice in this file: keep one table per name")
        else:
            checked.append(table)
            seen.add(name)
        problems += inline_secrets(table)
    try:
        merged = build_config(data, where, registry=checked)
    except ConfigError as err:
        problems += [line for line in err.problems if line not in problems]
    if problems:
        raise ConfigError(problems, where)
    return merged.sources[len(config.sources) :]


async def uncaptured(config: BridgeConfig, sources: Sequence[SourceConfig], path: str) -> tuple[list[str], str]:
    """Why the aggregate would refuse these sources' copies (one problem line each, naming the field and the fix),
    and a warning when that could not be checked (the target unreachable, or not readable by this user). A source
    without a ``subject_prefix`` or filters publishes on its origin's subjects, read only by the daemon: not
    checked here (a copy the aggregate refuses blocks its source, loudly)."""
    target = config.target
    try:
        nc = await open_connection(target, name="nats-bridge sources", error_type=BridgeError)
    except BridgeError as exc:
        return [], f"the aggregate's subjects not checked: {exc}"
    try:
        info = await JsApi(nc, target.api_prefix).stream_info(target.stream, timeout=TIMEOUT)
    except ApiError as exc:
        if exc.err_code == STREAM_NOT_FOUND:
            return [
                f"target.stream: the aggregate {target.stream} does not exist: create it first: {setup_command(path)}"
            ], ""
        return [], f"the aggregate's subjects not checked: {exc}"
    except BridgeError as exc:
        return [], f"the aggregate's subjects not checked: {exc}"
    finally:
        await close_connection(nc)
    subjects = list(info.get("config", {}).get("subjects") or [])
    problems = []
    for src in sources:
        missing = [p for p in copy_subjects(src, None) or [] if not any(pattern_covers(s, p) for s in subjects)]
        if missing:
            problems.append(
                f"sources[{src.name}].subject_prefix: the aggregate {target.stream} does not capture its copies "
                f"({', '.join(missing)}; its subjects: {', '.join(subjects) or 'none'}): add them to the aggregate's "
                "subjects (one pattern for every site, like edge.*.>, saves doing it again), or choose a prefix it "
                "captures"
            )
    return problems, ""


@contextlib.asynccontextmanager
async def open_registry(config: BridgeConfig, name: str) -> AsyncIterator[RegistryBucket]:
    """The registry beside ``config``'s coordination bucket, on a connection of its own (closed after);
    BridgeError when it cannot be reached."""
    side = bucket_side(config)
    nc = await open_connection(side, name=name, error_type=BridgeError)
    try:
        yield RegistryBucket(nc, JsApi(nc, side.api_prefix), config.coordination.bucket)
    finally:
        await close_connection(nc)


async def _with_registry(config: BridgeConfig, work: Callable[[RegistryBucket], Awaitable[int]]) -> int:
    try:
        async with open_registry(config, "nats-bridge sources") as bucket:
            return await work(bucket)
    except BridgeError as exc:
        print(f"nats-bridge: source registry {registry_bucket(config.coordination.bucket)}: {exc}", file=sys.stderr)
        return EXIT_PROBLEM


# -- add and remove ----------------------------------------------------------------------------------------------------


def add(path: str, file: str) -> int:
    """``nats-bridge sources add -c CONFIG --file FILE``: register every table of FILE, or none."""
    data, config = _fleet_config(path)
    tables = read_tables(file)
    where = "stdin" if file == "-" else file
    sources = validate_tables(data, config, tables, where)
    problems, warning = anyio.run(uncaptured, config, sources, path)
    if problems:
        raise ConfigError(problems, where)
    if warning:
        print(f"WARN {warning}", file=sys.stderr, flush=True)

    async def work(bucket: RegistryBucket) -> int:
        await bucket.ensure(config.coordination.replicas, TIMEOUT)
        existing = {entry.name: entry for entry in await bucket.read(TIMEOUT)}
        writes: list[Change] = []
        unchanged: list[str] = []
        for table in tables:
            old = existing.get(str(table["name"]))
            if old is not None and old.table == table:
                unchanged.append(old.name)
            else:
                writes.append(Change(str(table["name"]), table, old))
        failed = await change_all(bucket, writes)
        if failed:
            print(f"nats-bridge: nothing registered: {failed}", file=sys.stderr)
            return EXIT_PROBLEM
        added = [change.name for change in writes if change.old is None]
        changed = [change.name for change in writes if change.old is not None]
        print(
            f"registry {bucket.bucket}: added {len(added)}, changed {len(changed)}, unchanged {len(unchanged)}"
            + "".join(
                f"\n  {verb} {', '.join(names)}" for verb, names in (("added", added), ("changed", changed)) if names
            )
            + ("\nevery process of the fleet applies it within about a second" if writes else ""),
            flush=True,
        )
        return EXIT_OK

    return anyio.run(_with_registry, config, work)


@dataclass(frozen=True)
class Change:
    """One write of a registry change: ``table`` stored under ``name`` (None: removed), over ``old`` (None: new)."""

    name: str
    table: dict[str, Any] | None
    old: RegistryEntry | None


async def change_all(bucket: RegistryBucket, changes: Sequence[Change]) -> str:
    """Make every change (compare-and-set on the revision read, ``WRITES_IN_FLIGHT`` at a time) or none: on a
    failure, undo the ones made. Returns "" when all were made, else what failed (and what could not be undone)."""
    done: list[tuple[Change, int]] = []
    errors: list[str] = []
    limiter = anyio.CapacityLimiter(WRITES_IN_FLIGHT)

    async def one(change: Change) -> None:
        async with limiter:
            if errors:
                return  # one failed: the rest are not made (and the made ones undone)
            revision = change.old.revision if change.old is not None else 0
            try:
                if change.table is None:
                    done.append((change, await bucket.remove(change.name, revision, TIMEOUT)))
                else:
                    done.append((change, await bucket.put(change.table, revision, TIMEOUT)))
            except BridgeError as exc:
                errors.append(f"{change.name}: {exc}")

    async with anyio.create_task_group() as tg:
        for change in changes:
            tg.start_soon(one, change)
    if not errors:
        return ""
    stuck: list[str] = []
    for change, revision in done:  # put back what was there, on the revision this command wrote
        try:
            if change.old is None:
                await bucket.remove(change.name, revision, TIMEOUT)
            else:
                await bucket.put(change.old.table, revision, TIMEOUT)
        except BridgeError:
            stuck.append(change.name)
    if stuck:
        return f"{errors[0]}; could not undo {', '.join(stuck)} (see nats-bridge sources list)"
    return errors[0] + (f" (the {len(done)} change(s) made before it were undone)" if done else "")


def remove(path: str, names: Sequence[str]) -> int:
    """``nats-bridge sources remove -c CONFIG NAME...``: remove every named source from the registry, or none."""
    _, config = _fleet_config(path)
    in_file = {s.name for s in config.sources}
    unique = list(dict.fromkeys(names))

    async def work(bucket: RegistryBucket) -> int:
        existing = {entry.name: entry for entry in await bucket.read(TIMEOUT)}
        problems = []
        for name in unique:
            if name in in_file:
                problems.append(
                    f"{name}: a source of the configuration file, not of the registry: remove it from the file and "
                    "reload (SIGHUP)"
                )
            elif name not in existing:
                problems.append(f"{name}: not in the registry (nats-bridge sources list -c {path} shows what is)")
        if problems:
            print("\n".join(f"nats-bridge: nothing removed: {p}" for p in problems), file=sys.stderr)
            return EXIT_CONFIG
        failed = await change_all(bucket, [Change(name, None, existing[name]) for name in unique])
        if failed:
            print(f"nats-bridge: nothing removed: {failed}", file=sys.stderr)
            return EXIT_PROBLEM
        print(
            f"registry {bucket.bucket}: removed {len(unique)}: {', '.join(unique)}\n"
            "every process of the fleet drains and releases them within about a second",
            flush=True,
        )
        return EXIT_OK

    return anyio.run(_with_registry, config, work)


# -- list ------------------------------------------------------------------------------------------------------------


async def registry_merged(data: Mapping[str, Any], config: BridgeConfig, path: str) -> tuple[Merged, str]:
    """The configuration with the registry's sources, and "" or why the registry could not be read (then the
    file's sources alone). For the commands that show every source (``check``, ``status``, ``list``)."""
    if not config.coordination.enabled:
        return Merged(config, {s.name: FILE for s in config.sources}), ""
    try:
        async with open_registry(config, "nats-bridge") as bucket:
            entries = await bucket.read(TIMEOUT)
    except BridgeError as exc:
        return merge(data, path, []), str(exc)
    return merge(data, path, entries), ""


def list_sources(path: str, as_json: bool) -> int:
    """``nats-bridge sources list -c CONFIG [--json]``."""
    from bridge.commands.status import collect_owners, daemon_view

    data, config = _fleet_config(path)

    async def gather() -> tuple[Merged, str, dict[str, dict[str, Any]] | str]:
        merged, problem = await registry_merged(data, config, path)
        owners = await collect_owners(merged.config)
        return merged, problem, owners

    merged, problem, owners = anyio.run(gather)
    daemon, _ = daemon_view(config.http.listen)
    rows = []
    for src in merged.config.sources:
        live = (daemon or {}).get("sources", {}).get(src.name) or {}
        owner = owners.get(src.name) if isinstance(owners, dict) else None
        rows.append(
            {
                "source": src.name,
                "from": merged.origins.get(src.name, "file"),
                "owner": (owner or {}).get("instance"),
                "mode": live.get("mode") or None,
                "state": _state(live),
            }
        )
    for name, problems in merged.refused.items():
        rows.append({"source": name, "from": REGISTRY, "owner": None, "mode": None, "state": "refused: " + problems[0]})
    out: dict[str, Any] = {"sources": rows}
    if problem:
        out["registry_error"] = problem
    if isinstance(owners, str):
        out["coordination_error"] = owners
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        _print_rows(rows)
        if problem:
            print(f"registry not read: {problem} (the file's sources only)")
        if isinstance(owners, str):
            print(f"owners unknown: {owners}")
    return EXIT_PROBLEM if problem or merged.refused else EXIT_OK


def _state(live: Mapping[str, Any]) -> str | None:
    """What the local daemon says of a source: replicating, standby, or not ready and why; None if it has none."""
    if not live:
        return None
    if live.get("role") == "standby":
        return "standby"
    if live.get("ready"):
        return "replicating"
    return "not ready: " + ", ".join(live.get("reasons") or ["?"])


def _print_rows(rows: list[dict[str, Any]]) -> None:
    columns = ("source", "from", "owner", "mode", "state")
    cells = [[str(row[c]) if row[c] is not None else "-" for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
