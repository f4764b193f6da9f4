"""``python -m bench recovery``: start-up to the first copy, and restart recovery with a large aggregate.

Two measurements, every one on a fresh hub + leaf (``bench.world``, as ``bench run``), the bridge spawned as
``python -m bridge run -c FILE`` in the sidecar position with ``bench.runner.bridge_config``:

1. **Start-up.** A WorkQueue origin with :data:`STARTUP_WAITING` messages waiting, an empty aggregate; the time
   from spawning the bridge to the aggregate's first stored copy (its ``first_ts``, a server store time), split by
   the first occurrence of the bridge's own log events (:data:`MILESTONES`, wall-clock timestamps on the same clock).
   The interpreter's start and the bridge's imports are timed apart, in their own processes.
2. **Restart recovery.** The bridge replicates a backlog into the aggregate once (real copies, real consumer
   state: the ack floor the restarted process binds to is the one replication left). Variants (:data:`VARIANTS`):
   with or without ``subject_prefix``, and *shared*: half the aggregate is this source's copies, and the newest half
   is another source's (crafted with the bridge's own header codec, identical in form to what a bridge writes),
   written again before every restart so the source's newest copy is always that deep (the shared aggregate is
   capped at ``--messages`` with ``max_msgs``, so its size stays put). Then, ``--reps`` times, the process is
   stopped (SIGTERM, which must exit 0, or SIGKILL: a crash), :data:`NEW_MESSAGES` are published to the origin,
   and a new process is spawned: spawn -> ``recovery.done`` (which logs the copies read and the read's own
   duration) -> the first new copy stored. The new copies are read back and checked (each new origin sequence
   exactly once). Last, with the bridge stopped, recovery's read is replayed in-process with the bridge's own
   ``read_source_tail`` (counting Direct Get chunks and the messages they returned, under cProfile), which shows
   what bounds its time.

Without a ``subject_prefix`` the copies keep the origin's subjects, which the origin stream on the leaf captures
too: in one account across the leafnode connection the hub's copies would flow back into the origin and be
replicated again, for ever. Those variants therefore run with ``deny_imports`` for the copies' subjects on the
leaf's remote, as a deployment without a prefix needs.

Every wait has a deadline; every process is stopped by its PID; a measurement's directory (server and bridge logs)
is kept when it failed (its error names it) or with ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import datetime as dt
import io
import json
import os
import pstats
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

from nats.aio.client import Client

from bench import natsops as ops
from bench.common import loadavg, rel
from bench.procs import cpu_seconds, git_revision, machine, revision_text
from bench.runner import SOURCE, bridge_config
from bench.stats import median, parse_rfc3339_ns
from bench.world import World, guarded, in_world
from bridge.config.defaults import DEFAULT_PUBLISH_WINDOW
from bridge.core import headers as hdr
from bridge.core.recovery import recovery_depth
from bridge.io import aggregate, wire
from bridge.io.jsapi import JsApi
from bridge.testing.processes import REPO_ROOT, child_env
from bridge.testing.servers import ServerStartError, find_nats_server, server_version

T = TypeVar("T")

PREFIX, NO_PREFIX, SHARED_PREFIX, SHARED_NO_PREFIX = "prefix", "no-prefix", "shared-prefix", "shared-no-prefix"
VARIANTS = (PREFIX, NO_PREFIX, SHARED_PREFIX, SHARED_NO_PREFIX)
VARIANT_LABELS = {
    PREFIX: "subject_prefix",
    NO_PREFIX: "no subject_prefix",
    SHARED_PREFIX: "shared, subject_prefix",
    SHARED_NO_PREFIX: "shared, no subject_prefix",
}
SIGTERM, SIGKILL = "sigterm", "sigkill"
KINDS = (SIGTERM, SIGKILL)
FRESH = "fresh start"

DEFAULT_MESSAGES = 1_000_000
QUICK_MESSAGES = 20_000
SIZE = 256
STARTUP_WAITING = 1_000  # messages waiting in the origin when a fresh bridge starts
NEW_MESSAGES = 100  # published to the origin while the bridge is down, before each restart
OTHER_SOURCE = "leaf2"  # the other source whose copies fill the newest half of a shared aggregate
OTHER_STREAM = "ORIGIN2"
MAX_ACK_PENDING = 1000  # the bridge's default, as `bench run`
RECOVERY_CAP = recovery_depth(DEFAULT_PUBLISH_WINDOW)  # what read_tail is given by a bridge with default settings
REQUEST_TIMEOUT = 5.0  # the bridge's TargetSide.timeout
CONSUMER = f"nats-bridge-{SOURCE}"  # the bridge's managed consumer (its default name)
SETTLE_DEADLINE = 30.0  # the server asks for flow control at least every idle heartbeat (1 s) while some is due

FIRST_LOG = "first log line"
# the bridge's log events that mark its way to the first copy, in the order a start passes them
MILESTONES = (
    FIRST_LOG,
    "target.connected",
    "lease.acquired",
    "origin.connected",
    "consumer.bound",
    "recovery.done",
    "reset.done",  # or, a consumer at rest needing no RESET:
    "consumer.resumed",
)
RUN_MARKER = "starting bridge ==="  # BridgeProcess writes it before each spawn: what follows is that run's log


# Results


@dataclass(slots=True)
class StartupRun:
    """A fresh bridge on a fresh hub + leaf with :data:`STARTUP_WAITING` messages waiting."""

    rep: int
    waiting: int
    ok: bool = False
    error: str | None = None
    spawn_to_first_copy_s: float | None = None
    milestones_s: dict[str, float] = field(default_factory=dict)  # spawn -> the first of each MILESTONES event
    copies_read: int | None = None
    bridge_exit_code: int | None = None


@dataclass(slots=True)
class RestartRun:
    """One restart: the previous process stopped by ``kind``, :data:`NEW_MESSAGES` waiting, a new one spawned."""

    variant: str
    kind: str
    rep: int
    new_messages: int
    ok: bool = False
    error: str | None = None
    aggregate_messages: int = 0  # held when the new process was spawned
    previous_exit_code: int | None = None  # 0 required after SIGTERM
    ack_floor: int | None = None
    copies_read: int | None = None  # recovery.done: this source's copies read above the ack floor
    complete: bool | None = None
    recovery_read_s: float | None = None  # recovery.done: the read and the chain walk alone
    lease_wait_s: float | None = None  # source.waiting_over for the lease (after a crash: the dead process's lease)
    settle_s: float | None = None  # waited for the ack floor to reach the last copy before the stop (None: not)
    spawn_to_recovered_s: float | None = None
    spawn_to_first_new_s: float | None = None  # to the store time of the first new copy
    milestones_s: dict[str, float] = field(default_factory=dict)
    bridge_cpu_s: float | None = None  # spawn .. every new copy stored
    hub_cpu_s: float | None = None


@dataclass(slots=True)
class Replay:
    """Recovery's read of the aggregate, replayed in-process with ``bridge.io.aggregate.read_source_tail``."""

    floor: int
    chunks: int = 0  # read_range calls: one batched Direct Get sequence each
    positions: int = 0  # aggregate sequences the chunks covered
    returned: int = 0  # messages the server sent back (only this source's with a subject filter)
    copies: int = 0  # this source's copies above the floor
    complete: bool = False
    seconds: float = 0.0
    profile: list[str] = field(default_factory=list)  # the top functions by own time


@dataclass(slots=True)
class VariantRun:
    """One variant: one world, one fill, ``reps`` x (SIGTERM, SIGKILL) restarts, one replay."""

    variant: str
    messages: int
    own: int  # this source's copies from the fill
    other: int  # another source's copies on top (shared variants), written again before every restart
    ok: bool = False
    error: str | None = None
    preload_msgs_per_s: float | None = None
    fill_msgs_per_s: float | None = None
    bury_msgs_per_s: list[float] = field(default_factory=list)
    final_exit_code: int | None = None
    restarts: list[RestartRun] = field(default_factory=list)
    replay: Replay | None = None


@dataclass(slots=True)
class Probe:
    """The interpreter's start and the bridge's imports, each timed in its own process (best of a few: the
    work is fixed, and on a shared machine anything above the best is other processes' noise)."""

    interpreter_s: float | None = None
    imports_s: float | None = None  # on top of the interpreter
    error: str | None = None


# Pure helpers


def run_events(log_text: str) -> list[dict[str, Any]]:
    """The JSON events of the bridge's latest run: the lines after the last start marker (the whole log without
    one); other lines (tracebacks, markers) are skipped."""
    start = log_text.rfind(RUN_MARKER)
    out: list[dict[str, Any]] = []
    for line in (log_text if start < 0 else log_text[start:]).splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    out.append(event)
    return out


def milestones(events: Iterable[Mapping[str, Any]], spawn_ns: int) -> dict[str, float]:
    """Seconds from ``spawn_ns`` (wall clock) to the first event of each of :data:`MILESTONES` (:data:`FIRST_LOG`:
    any event); those not logged are absent."""
    out: dict[str, float] = {}
    for event in events:
        try:
            at = parse_rfc3339_ns(str(event.get("timestamp", "")))
        except ValueError:
            continue
        seconds = (at - spawn_ns) / 1e9
        out.setdefault(FIRST_LOG, seconds)
        name = str(event.get("event", ""))
        if name in MILESTONES:
            out.setdefault(name, seconds)
    return out


def first_event(events: Iterable[Mapping[str, Any]], name: str, **fields: Any) -> Mapping[str, Any] | None:
    """The first ``name`` event whose ``fields`` all match, or None."""
    for event in events:
        if event.get("event") == name and all(event.get(k) == v for k, v in fields.items()):
            return event
    return None


def without_subject_prefix(config_text: str) -> str:
    """``bench.runner.bridge_config``'s text without its ``subject_prefix`` line.

    Raises:
        ValueError: there is no such line (the runner's configuration changed: a variant would silently be wrong).
    """
    lines = config_text.splitlines()
    kept = [line for line in lines if not line.strip().startswith("subject_prefix")]
    if len(kept) == len(lines):
        raise ValueError("bridge_config wrote no subject_prefix line")
    return "\n".join(kept) + "\n"


def shared_split(messages: int) -> tuple[int, int]:
    """(this source's copies, the other source's copies on top) of a shared aggregate of ``messages``."""
    other = messages // 2
    return messages - other, other


def check_new_copies(headers: Sequence[Mapping[str, str]], expected: range) -> str | None:
    """Why the copies stored after a restart are not exactly one of each new origin sequence, or None."""
    seqs: list[int] = []
    for h in headers:
        if h.get(hdr.SOURCE) != SOURCE:
            return f"a copy of source {h.get(hdr.SOURCE)!r} among the new ones"
        seqs.append(int(h.get(hdr.SEQ, "0")))
    if sorted(seqs) != list(expected):
        dup = len(seqs) - len(set(seqs))
        missing = len(set(expected) - set(seqs))
        return (
            f"new copies: {len(seqs)} stored for origin sequences {expected.start}..{expected.stop - 1}, "
            f"{dup} duplicate(s), {missing} missing, {len(set(seqs) - set(expected))} unexpected"
        )
    return None


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the summary table: medians (and ranges) over the repetitions that succeeded."""

    variant: str
    restart: str  # FRESH, SIGTERM or SIGKILL
    aggregate: int
    runs: int
    failed: int
    copies_read: list[float]
    read_s: list[float]
    recovered_s: list[float]
    first_copy_s: list[float]
    lease_wait_s: list[float]
    examined: int | None  # messages recovery's read went through (the replay), shared by a variant's rows


def _values(items: Iterable[float | int | None]) -> list[float]:
    return [float(v) for v in items if v is not None]


def summarize(startup: Sequence[StartupRun], variants: Sequence[VariantRun]) -> list[Row]:
    """The summary rows: the fresh start, then each variant's SIGTERM and SIGKILL restarts."""
    rows: list[Row] = []
    if startup:
        good = [r for r in startup if r.ok]
        rows.append(
            Row(
                variant=FRESH,
                restart="-",
                aggregate=0,
                runs=len(startup),
                failed=len(startup) - len(good),
                copies_read=_values(r.copies_read for r in good),
                read_s=[],
                recovered_s=_values(r.milestones_s.get("recovery.done") for r in good),
                first_copy_s=_values(r.spawn_to_first_copy_s for r in good),
                lease_wait_s=[],
                examined=None,
            )
        )
    for v in variants:
        for kind in KINDS:
            runs = [r for r in v.restarts if r.kind == kind]
            if not runs:
                continue
            done = [r for r in runs if r.ok]
            rows.append(
                Row(
                    variant=v.variant,
                    restart=kind,
                    aggregate=max((r.aggregate_messages for r in runs), default=v.messages),
                    runs=len(runs),
                    failed=len(runs) - len(done),
                    copies_read=_values(r.copies_read for r in done),
                    read_s=_values(r.recovery_read_s for r in done),
                    recovered_s=_values(r.spawn_to_recovered_s for r in done),
                    first_copy_s=_values(r.spawn_to_first_new_s for r in done),
                    lease_wait_s=_values(r.lease_wait_s for r in done),
                    examined=v.replay.returned if v.replay is not None and kind == SIGTERM else None,
                )
            )
    return rows


def fmt_seconds(values: Sequence[float]) -> str:
    """``0.41 s`` for one value, ``0.41 s (0.39-0.45)`` (median, range) for several, ``-`` for none."""
    if not values:
        return "-"
    digits = 2 if median(values) < 10 else 1
    text = f"{median(values):.{digits}f} s"
    if len(values) > 1:
        text += f" ({min(values):.{digits}f}-{max(values):.{digits}f})"
    return text


def fmt_count(values: Sequence[float]) -> str:
    """The median count, ``-`` for none (a range when the repetitions differ)."""
    if not values:
        return "-"
    text = f"{median(values):,.0f}"
    if len(values) > 1 and min(values) != max(values):
        text += f" ({min(values):,.0f}-{max(values):,.0f})"
    return text


def _cells(row: Row) -> list[str]:
    label = (
        f"{FRESH} ({STARTUP_WAITING:,} waiting)"
        if row.variant == FRESH
        else VARIANT_LABELS.get(row.variant, row.variant)
    )
    restart = {SIGTERM: "SIGTERM", SIGKILL: "SIGKILL"}.get(row.restart, row.restart)
    failed = f", {row.failed} FAILED" if row.failed else ""
    return [
        label + failed,
        restart,
        f"{row.aggregate:,}",
        fmt_count(row.copies_read),
        f"{row.examined:,}" if row.examined is not None else "-",
        fmt_seconds(row.read_s),
        fmt_seconds(row.recovered_s),
        fmt_seconds(row.first_copy_s),
        fmt_seconds(row.lease_wait_s),
    ]


HEADERS = (
    "variant",
    "restart",
    "aggregate",
    "copies read",
    "messages examined",
    "recovery read (logged)",
    "spawn -> recovered",
    "spawn -> first new copy",
    "lease wait",
)


def format_table(rows: Sequence[Row]) -> str:
    """The summary as aligned text."""
    table = [list(HEADERS), *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in table)


def markdown_table(rows: Sequence[Row]) -> str:
    """The summary as a markdown table (for bench/RESULTS.md)."""
    lines = [
        "| " + " | ".join(HEADERS) + " |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def startup_split(startup: Sequence[StartupRun], probe: Probe) -> str:
    """One line: the median time from spawn to each start-up milestone, and the interpreter/imports probe."""
    good = [r for r in startup if r.ok]
    if not good:
        return "start-up split: no successful start"
    parts = []
    for name in MILESTONES:
        values = _values(r.milestones_s.get(name) for r in good)
        if values:
            parts.append(f"{name} {median(values):.3f}")
    first = _values(r.spawn_to_first_copy_s for r in good)
    if first:
        parts.append(f"first copy stored {median(first):.3f}")
    line = "start-up, s from spawn (medians): " + ", ".join(parts)
    if probe.interpreter_s is not None and probe.imports_s is not None:
        line += (
            f"; measured apart (best of 5): interpreter start {probe.interpreter_s:.3f} s, the bridge's imports "
            f"+{probe.imports_s:.3f} s"
        )
    return line


def replay_line(variant: str, replay: Replay) -> str:
    """One line describing a replayed read."""
    return (
        f"{VARIANT_LABELS.get(variant, variant)}: recovery's read replayed in-process from ack floor {replay.floor:,}: "
        f"{replay.chunks} chunk(s) over {replay.positions:,} aggregate positions, {replay.returned:,} messages "
        f"returned, {replay.copies:,} copies above the floor, complete {replay.complete}, {replay.seconds:.3f} s"
    )


# Waiting


async def _poll(
    what: str,
    probe: Callable[[], Awaitable[T | None]],
    deadline: float,
    alive: Callable[[], str | None] | None = None,
) -> T:
    """Poll ``probe`` every :data:`bench.natsops.POLL_INTERVAL` until it returns a value.

    Raises:
        BenchError: past ``deadline`` seconds, or ``alive`` gave a reason (the bridge died).
    """
    started = time.monotonic()
    while True:
        value = await probe()
        if value is not None:
            return value
        if alive is not None and (reason := alive()) is not None:
            raise ops.BenchError(f"waiting for {what}: {reason}")
        if time.monotonic() - started > deadline:
            raise ops.BenchError(f"no {what} within {deadline:g}s")
        await asyncio.sleep(ops.POLL_INTERVAL)


# The bridge in a world (bench.world): one process, restarted


def _leaf_remote_extra(prefix: bool) -> str:
    # without a prefix the copies keep the origin's subjects: keep the hub's copies out of the leaf's origin
    return "" if prefix else f'deny_imports: ["{ops.ORIGIN_SUBJECTS}.>"]'


def _write_config(world: World, prefix: bool) -> None:
    text = bridge_config(world.topology.hub.url, world.topology.leaf.url, "sidecar", MAX_ACK_PENDING)
    world.write_config(text if prefix else without_subject_prefix(text))


def _spawn(world: World) -> int:
    """Start the bridge; the wall-clock ns just before the spawn."""
    spawn_ns = time.time_ns()
    world.start_bridge()
    return spawn_ns


def _events(world: World) -> list[dict[str, Any]]:
    """The log events of the bridge's latest run."""
    return run_events(world.bridge.log_text()) if world.bridge is not None else []


async def _wait_event(world: World, name: str, deadline: float) -> Mapping[str, Any]:
    async def probe() -> Mapping[str, Any] | None:
        return first_event(_events(world), name)

    return await _poll(f"bridge log event {name}", probe, deadline, world.bridge_failure)


def _aggregate_config(prefix: bool, cap: int | None) -> dict[str, Any]:
    config = ops.aggregate_config(native=False)
    if not prefix:
        config["subjects"] = [f"{ops.ORIGIN_SUBJECTS}.>"]
    if cap is not None:
        config["max_msgs"] = cap
    return config


# 1. Start-up


def startup(workdir: Path, rep: int, keep: bool) -> StartupRun:
    """A fresh bridge against :data:`STARTUP_WAITING` waiting messages: spawn -> first stored copy, split."""
    run = StartupRun(rep=rep, waiting=STARTUP_WAITING)
    directory = workdir / f"startup-{rep}-{time.strftime('%H%M%S')}"

    async def body(world: World, leaf: Client, hub: Client) -> None:
        await ops.create_origin(leaf, "workqueue")
        await ops.preload(leaf, STARTUP_WAITING, SIZE, deadline=60.0)
        await ops.api(hub, f"$JS.API.STREAM.CREATE.{ops.AGGREGATE}", _aggregate_config(prefix=True, cap=None))
        _write_config(world, prefix=True)
        spawn_ns = _spawn(world)
        await ops.wait_for_count(hub, STARTUP_WAITING, deadline=60.0, stall=30.0, alive=world.bridge_failure)
        state = await ops.stream_state(hub, ops.AGGREGATE)
        run.spawn_to_first_copy_s = (state.first_ts_ns - spawn_ns) / 1e9
        done = await _wait_event(world, "recovery.done", 10.0)
        run.copies_read = int(done.get("copies_read", 0))
        run.milestones_s = milestones(_events(world), spawn_ns)
        run.bridge_exit_code = await world.stop_bridge()
        if run.bridge_exit_code != 0:
            run.error = f"bridge exited {run.bridge_exit_code} on SIGTERM"

    guarded(run, directory, lambda: in_world(directory, body, failed=lambda: run.error is not None, keep=keep))
    return run


def probe_imports(reps: int) -> Probe:
    """Time ``python -c pass`` and ``python -c 'import <the bridge's run path>'``, best of ``reps`` each."""
    imports = "import bridge.cli, bridge.commands.run, bridge.runtime.app"

    def timed(code: str) -> float:
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-c", code], cwd=REPO_ROOT, env=child_env(), check=True, timeout=60, capture_output=True
        )
        return time.monotonic() - started

    try:
        bare = [timed("pass") for _ in range(reps)]
        full = [timed(imports) for _ in range(reps)]
    except (OSError, subprocess.SubprocessError) as exc:
        return Probe(error=f"{type(exc).__name__}: {exc}")
    return Probe(interpreter_s=min(bare), imports_s=min(full) - min(bare))


# 2. Restart recovery


def variant(
    workdir: Path,
    name: str,
    messages: int,
    reps: int,
    keep: bool,
    report: Callable[[str], None],
    kinds: Sequence[str] = KINDS,
) -> VariantRun:
    """Fill an aggregate of ``messages`` for variant ``name``, then restart the bridge ``reps`` x ``kinds``
    (SIGTERM, SIGKILL), then replay recovery's read; ``report`` gets a progress line per step."""
    shared = name in (SHARED_PREFIX, SHARED_NO_PREFIX)
    own, other = shared_split(messages) if shared else (messages, 0)
    run = VariantRun(variant=name, messages=messages, own=own, other=other)
    directory = workdir / f"{name}-{time.strftime('%H%M%S')}"
    prefix = name in (PREFIX, SHARED_PREFIX)

    async def body(world: World, leaf: Client, hub: Client) -> None:
        await _variant(
            world, leaf, hub, run, prefix, [(rep, kind) for rep in range(1, reps + 1) for kind in kinds], report
        )

    def measure() -> None:
        extra = _leaf_remote_extra(prefix)
        in_world(directory, body, failed=lambda: not _variant_ok(run), keep=keep, leaf_remote_extra=extra)

    guarded(run, directory, measure)
    if run.ok and not _variant_ok(run):
        run.ok = False
        run.error = f"{sum(not r.ok for r in run.restarts)} restart(s) failed (logs in {directory})"
    return run


def _variant_ok(run: VariantRun) -> bool:
    return run.error is None and all(r.ok for r in run.restarts) and run.final_exit_code == 0


async def _variant(
    world: World,
    leaf: Client,
    hub: Client,
    run: VariantRun,
    prefix: bool,
    slots: Sequence[tuple[int, str]],
    report: Callable[[str], None],
) -> None:
    shared = run.other > 0
    await ops.create_origin(leaf, "workqueue")
    cap = run.messages if shared else None  # the other source's copies, written again per restart, push old ones out
    await ops.api(hub, f"$JS.API.STREAM.CREATE.{ops.AGGREGATE}", _aggregate_config(prefix, cap))
    run.preload_msgs_per_s = await ops.preload(leaf, run.own, SIZE, deadline=max(60.0, run.own / 5000))
    _write_config(world, prefix)
    began = time.monotonic()
    _spawn(world)
    await ops.wait_for_count(hub, run.own, deadline=max(60.0, run.own / 1000), stall=30.0, alive=world.bridge_failure)
    state = await ops.stream_state(hub, ops.AGGREGATE)
    run.fill_msgs_per_s = (state.last_seq - state.first_seq) / max(state.last_ts_ns - state.first_ts_ns, 1) * 1e9
    report(
        f"filled by the bridge: {run.own:,} copies at {run.fill_msgs_per_s:,.0f} msg/s "
        f"(preload {run.preload_msgs_per_s:,.0f} msg/s; {time.monotonic() - began:.0f} s)"
    )
    other_seq = 1
    for rep, kind in slots:
        restart = RestartRun(variant=run.variant, kind=kind, rep=rep, new_messages=NEW_MESSAGES)
        run.restarts.append(restart)
        began = time.monotonic()
        try:
            # The floor lags the copies until the server next asks for flow control. A SIGTERM is measured from a
            # settled floor; so is every capped shared aggregate before another source's copies push old ones out
            # (they could push out the copy at the floor, and the read would then go on to MAX_SCANNED). A SIGKILL
            # of an unshared aggregate comes at once after the last new copy, with whatever the floor lags.
            if kind == SIGTERM or shared:
                restart.settle_s = await _settle(world, leaf)
            if shared:
                other_seq = await _bury(hub, run, other_seq, prefix)
            await _restart(world, leaf, hub, restart, prefix)
        except Exception as exc:
            restart.error = f"{type(exc).__name__}: {exc}"
        restart.ok = restart.error is None
        report(f"rep {rep} {kind.upper()} restart: {describe_restart(restart)} ({time.monotonic() - began:.0f} s)")
        if not restart.ok:
            return  # the bridge's state is unknown: later restarts would measure something else
    await _settle(world, leaf)
    if shared:
        other_seq = await _bury(hub, run, other_seq, prefix)
    run.final_exit_code = await world.stop_bridge()
    if run.final_exit_code != 0:
        run.error = f"bridge exited {run.final_exit_code} on SIGTERM"
        return
    run.replay = await _replay(world, leaf, prefix)
    report(replay_line(run.variant, run.replay))


async def _settle(world: World, leaf: Client) -> float:
    """Wait until the bridge's consumer has its ack floor at the origin's last message; the seconds it took."""
    started = time.monotonic()
    last = (await ops.stream_state(leaf, ops.ORIGIN)).last_seq

    async def settled() -> bool | None:
        info = await ops.api(leaf, f"$JS.API.CONSUMER.INFO.{ops.ORIGIN}.{CONSUMER}")
        return True if int(info.get("ack_floor", {}).get("stream_seq", 0)) >= last else None

    await _poll(f"the ack floor at origin sequence {last}", settled, SETTLE_DEADLINE, world.bridge_failure)
    return time.monotonic() - started


async def _bury(hub: Client, run: VariantRun, first_seq: int, prefix: bool) -> int:
    """Publish ``run.other`` copies of another source on top of the aggregate; the next sequence of that source.

    The headers come from the bridge's own ``build_header_block``, so the copies are what a bridge writes.
    """
    payload = os.urandom(SIZE)
    other_prefix = f"{ops.AGGREGATE_SUBJECTS}.{OTHER_SOURCE}" if prefix else None
    deadline = max(60.0, run.other / 5000)
    started = time.monotonic()
    async with ops.Publisher(hub, 4096) as pub:
        for seq in range(first_seq, first_seq + run.other):
            subject = f"{ops.ORIGIN_SUBJECTS}.{seq % 16}"
            block = hdr.build_header_block(
                None,
                source=OTHER_SOURCE,
                stream=OTHER_STREAM,
                stream_seq=seq,
                prev_seq=seq - 1,
                subject=subject,
                timestamp_ns=time.time_ns(),
            )
            await pub.publish(hdr.aggregate_subject(subject, other_prefix), payload, hdr.parse_header_block(block))
            if time.monotonic() - started > deadline:
                raise ops.BenchError(f"other source's copies: {pub.acked} of {run.other} acked after {deadline:g}s")
        await pub.drain(max(5.0, deadline - (time.monotonic() - started)))
    run.bury_msgs_per_s.append(run.other / (time.monotonic() - started))
    return first_seq + run.other


async def _restart(world: World, leaf: Client, hub: Client, run: RestartRun, prefix: bool) -> None:
    if run.kind == SIGTERM:
        run.previous_exit_code = await world.stop_bridge()
        if run.previous_exit_code != 0:
            raise ops.BenchError(f"bridge exited {run.previous_exit_code} on SIGTERM")
    else:
        run.previous_exit_code = await world.kill_bridge()
    origin_last = (await ops.stream_state(leaf, ops.ORIGIN)).last_seq
    expected = range(origin_last + 1, origin_last + 1 + run.new_messages)
    async with ops.Publisher(leaf, run.new_messages) as pub:
        for k in range(run.new_messages):
            await pub.publish(f"{ops.ORIGIN_SUBJECTS}.{k % 16}", os.urandom(SIZE))
        await pub.drain(30.0)
    before = await ops.stream_state(hub, ops.AGGREGATE)
    run.aggregate_messages = before.messages
    hub_pid = world.topology.hub.pid
    hub_cpu = cpu_seconds(hub_pid) if hub_pid is not None else None
    deadline = max(120.0, run.aggregate_messages / 5000)

    spawn_ns = _spawn(world)
    target = before.last_seq + run.new_messages

    async def stored() -> ops.StreamState | None:
        state = await ops.stream_state(hub, ops.AGGREGATE)
        return state if state.last_seq >= target else None

    await _poll(f"{run.new_messages} new copies", stored, deadline, world.bridge_failure)
    pid = world.bridge_pid
    if pid is not None:
        run.bridge_cpu_s = cpu_seconds(pid)
    if hub_pid is not None and hub_cpu is not None:
        run.hub_cpu_s = cpu_seconds(hub_pid) - hub_cpu
    done = await _wait_event(world, "recovery.done", 10.0)
    events = _events(world)
    bound = first_event(events, "consumer.bound")
    if bound is None or bound.get("consumer") != CONSUMER:
        raise ops.BenchError(f"the bridge bound {bound and bound.get('consumer')!r}, not {CONSUMER!r}")
    run.milestones_s = milestones(events, spawn_ns)
    run.spawn_to_recovered_s = run.milestones_s.get("recovery.done")
    run.ack_floor = int(done.get("ack_floor", 0))
    run.copies_read = int(done.get("copies_read", 0))
    run.complete = bool(done.get("complete"))
    run.recovery_read_s = float(done.get("seconds", 0.0))
    waited = first_event(events, "source.waiting_over", **{"for": "lease"})
    run.lease_wait_s = float(waited.get("waited_seconds", 0.0)) if waited is not None else None
    latest = (await ops.stream_state(hub, ops.AGGREGATE)).last_seq
    copies = await ops.read_stored(hub, before.last_seq + 1, latest - before.last_seq)
    if not copies:
        raise ops.BenchError("the new copies could not be read back")
    run.spawn_to_first_new_s = (min(c.store_ns for c in copies) - spawn_ns) / 1e9
    problem = check_new_copies([c.headers for c in copies], expected)
    if problem is not None:
        raise ops.BenchError(problem)


def describe_restart(run: RestartRun) -> str:
    """One progress line for a restart."""
    if not run.ok:
        return f"FAILED: {run.error}"
    text = (
        f"aggregate {run.aggregate_messages:,}, ack floor {run.ack_floor:,}, copies read {run.copies_read:,} "
        f"in {run.recovery_read_s:.3f} s; spawn -> recovered {run.spawn_to_recovered_s:.2f} s, "
        f"-> first new copy {run.spawn_to_first_new_s:.2f} s"
    )
    if run.lease_wait_s is not None:
        text += f" (lease wait {run.lease_wait_s:.2f} s)"
    return text


async def _replay(world: World, leaf: Client, prefix: bool) -> Replay:
    """Recovery's read from the consumer's current ack floor (what the next start would read), in-process on a
    client with the bridge's own protocol reader, counted; then once more under cProfile (its top functions).
    The bridge is stopped, so nothing else runs against the hub."""
    info = await ops.api(leaf, f"$JS.API.CONSUMER.INFO.{ops.ORIGIN}.{CONSUMER}")
    replay = Replay(floor=int(info.get("ack_floor", {}).get("stream_seq", 0)))
    subject_filter = f"{ops.BRIDGE_PREFIX}.>" if prefix else ">"
    nc = Client()
    if wire.install(nc) is None:  # nats-py's own reader would make the replay several times slower than the bridge
        raise ops.BenchError("replay: this nats-py has not the internals bridge.io.wire needs")
    await nc.connect(world.topology.hub.url, name="bench replay", connect_timeout=5, max_reconnect_attempts=3)
    try:
        original = aggregate.read_range

        async def counted(*args: Any, **kwargs: Any) -> list[dict[str, str]]:
            found = await original(*args, **kwargs)
            replay.chunks += 1
            replay.positions += int(args[4]) - int(args[3]) + 1  # (nc, api, stream, lo, hi, ...)
            replay.returned += len(found)
            return found

        async def read() -> tuple[list[Any], bool]:
            return await aggregate.read_source_tail(
                nc, JsApi(nc), ops.AGGREGATE, SOURCE, subject_filter, replay.floor, RECOVERY_CAP, REQUEST_TIMEOUT
            )

        with mock.patch.object(aggregate, "read_range", counted):
            started = time.monotonic()
            copies, replay.complete = await read()
            replay.seconds = time.monotonic() - started
        replay.copies = len(copies)
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            await read()
        finally:
            profiler.disable()
        replay.profile = top_functions(profiler, 8)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 5)
    return replay


def top_functions(profiler: cProfile.Profile, count: int) -> list[str]:
    """The ``count`` functions with the most own time: ``own s  cumulative s  calls  file:line(function)``."""
    stats = pstats.Stats(profiler, stream=io.StringIO())
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # documented in the pstats source only
    ranked = sorted(table.items(), key=lambda item: item[1][2], reverse=True)[:count]
    out = []
    for (filename, line, function), (_cc, calls, own, cumulative, _callers) in ranked:
        where = filename
        with contextlib.suppress(ValueError):
            where = str(Path(filename).resolve().relative_to(REPO_ROOT))
        if "site-packages/" in where:
            where = where.split("site-packages/", 1)[1]
        out.append(f"{own:7.3f} {cumulative:7.3f} {calls:>8} {where}:{line}({function})")
    return out


# The command


def parser(sub: Any) -> None:
    """Add the ``recovery`` subcommand to ``python -m bench``."""
    p = sub.add_parser("recovery", help="start-up to first copy and restart recovery with a large aggregate")
    p.add_argument(
        "--messages",
        type=int,
        help=f"copies in the aggregate at each restart (default {DEFAULT_MESSAGES:,}; --quick {QUICK_MESSAGES:,})",
    )
    p.add_argument("--reps", type=int, help="repetitions of every start and restart kind (default 3; --quick 1)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 20,000 messages, 1 repetition, the SIGKILL restart in the first variant only",
    )
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"restart variants to run, among {', '.join(VARIANTS)} (default all)",
    )
    p.add_argument("--no-startup", action="store_true", help="skip the fresh start-up measurement")
    p.add_argument("--out", type=Path, help="JSON file (default bench/results/recovery-<UTC time>.json)")
    p.add_argument("--keep", action="store_true", help="keep every measurement's server and bridge files")


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    quick: bool = args.quick
    messages: int = args.messages if args.messages is not None else (QUICK_MESSAGES if quick else DEFAULT_MESSAGES)
    reps: int = args.reps if args.reps is not None else (1 if quick else 3)
    variants = [v.strip() for v in str(args.variants).split(",") if v.strip()]
    if messages < 2 or reps < 1 or not set(variants) <= set(VARIANTS):
        print(f"--messages must be >= 2, --reps >= 1, --variants among {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    try:
        version = server_version(find_nats_server())
    except ServerStartError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.UTC)
    out: Path = args.out or REPO_ROOT / "bench" / "results" / f"recovery-{started.strftime('%Y%m%d-%H%M%S')}.json"
    command = command_line(args)
    info = machine()
    info["loadavg_start"] = loadavg()
    revision = git_revision(REPO_ROOT)
    workdir = Path(tempfile.mkdtemp(prefix="nats-bridge-bench-recovery-"))
    startup_reps = 0 if args.no_startup else reps
    total = startup_reps + len(variants)
    print(f"bench: {command}", flush=True)
    print(
        f"  {info['nproc']} CPUs ({info['cpu_model']}), load average {info['loadavg_start']}; nats-server {version}; "
        f"{revision_text(revision)}",
        flush=True,
    )
    print(f"  {total} measurements, each on a fresh hub + leaf under {workdir}", flush=True)
    t0 = time.monotonic()
    done = 0

    def progress(text: str) -> None:
        print(f"        {time.monotonic() - t0:6.0f}s  {text}", flush=True)

    def step(text: str, began: float) -> None:
        nonlocal done
        done += 1
        now = time.monotonic()
        print(f"[{done:>2}/{total}] {now - t0:6.0f}s  {text}  ({now - began:.0f} s)", flush=True)

    startup_runs: list[StartupRun] = []
    variant_runs: list[VariantRun] = []
    probe = Probe()
    try:
        for rep in range(1, startup_reps + 1):
            began = time.monotonic()
            s = startup(workdir, rep, args.keep)
            startup_runs.append(s)
            step(f"fresh start rep {rep}, {STARTUP_WAITING:,} waiting: {describe_startup(s)}", began)
        if startup_reps:
            probe = probe_imports(5)
        for name in variants:
            began = time.monotonic()
            print(f"[{done + 1:>2}/{total}] {began - t0:6.0f}s  {name}: {messages:,}-message aggregate", flush=True)
            # a crash restart waits out the dead process's lease (10 s): the smoke test pays it once, not per variant
            kinds = (SIGTERM,) if quick and variant_runs else KINDS
            v = variant(workdir, name, messages, reps, args.keep, progress, kinds)
            variant_runs.append(v)
            step(f"{name}: {'ok' if v.ok else f'FAILED: {v.error}'}", began)
    except KeyboardInterrupt:
        print("bench: interrupted; nothing written", file=sys.stderr)
        return 130
    finally:
        if not args.keep and workdir.exists() and not any(workdir.iterdir()):
            shutil.rmtree(workdir, ignore_errors=True)

    rows = summarize(startup_runs, variant_runs)
    info["loadavg_end"] = loadavg()
    print()
    print(format_table(rows))
    print()
    if startup_runs:
        print(startup_split(startup_runs, probe))
    for v in variant_runs:
        if v.replay is not None:
            print(replay_line(v.variant, v.replay))
            if v.replay.seconds >= 0.5:
                print("    top of its profile (own s, cumulative s, calls, function):")
                for line in v.replay.profile[:4]:
                    print(f"      {line}")
    document: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": info,
        "revision": revision,
        "server_version": version,
        "settings": {
            "quick": quick,
            "messages": messages,
            "reps": reps,
            "variants": variants,
            "size": SIZE,
            "startup_waiting": STARTUP_WAITING,
            "new_messages": NEW_MESSAGES,
            "other_source": OTHER_SOURCE,
            "max_scanned": aggregate.MAX_SCANNED,
            "recovery_cap": RECOVERY_CAP,
            "bridge_config": bridge_config("nats://HUB", "nats://LEAF", "sidecar", MAX_ACK_PENDING),
            "aggregate": _aggregate_config(prefix=True, cap=None),
        },
        "probe": dataclasses.asdict(probe),
        "startup": [dataclasses.asdict(s) for s in startup_runs],
        "variants": [dataclasses.asdict(v) for v in variant_runs],
        "summary": [dataclasses.asdict(r) for r in rows],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nJSON  {rel(out)}")
    print("\nFor bench/RESULTS.md:\n")
    print(markdown_section(document, rows, startup_runs, probe, variant_runs, rel(out)))
    failures = [s.error for s in startup_runs if not s.ok] + [v.error for v in variant_runs if not v.ok]
    if failures:
        print(f"\n{len(failures)} measurement(s) failed:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The command as given (the options that were set), for the results."""
    words = ["python -m bench recovery"]
    if args.quick:
        words.append("--quick")
    for option in ("messages", "reps"):
        value = getattr(args, option)
        if value is not None:
            words.append(f"--{option} {value}")
    if args.variants != ",".join(VARIANTS):
        words.append(f"--variants {shlex.quote(str(args.variants))}")
    if args.no_startup:
        words.append("--no-startup")
    if args.out is not None:
        words.append(f"--out {shlex.quote(str(args.out))}")
    if args.keep:
        words.append("--keep")
    return " ".join(words)


def describe_startup(run: StartupRun) -> str:
    """One progress line for a fresh start."""
    if not run.ok or run.spawn_to_first_copy_s is None:
        return f"FAILED: {run.error}"
    recovered = run.milestones_s.get("recovery.done")
    text = f"spawn -> first copy {run.spawn_to_first_copy_s:.3f} s"
    if recovered is not None:
        text += f" (recovery done at {recovered:.3f} s, first log line at {run.milestones_s.get(FIRST_LOG, 0):.3f} s)"
    return text


def markdown_section(
    document: Mapping[str, Any],
    rows: Sequence[Row],
    startup_runs: Sequence[StartupRun],
    probe: Probe,
    variant_runs: Sequence[VariantRun],
    json_path: str,
) -> str:
    """A section for bench/RESULTS.md: heading, command and machine, the table, the start-up split, the replays."""
    m = document["machine"]
    rev = document["revision"]
    dirty = " + uncommitted changes under bridge/" if rev.get("bridge_dirty") else ""
    s = document["settings"]
    lines = [
        f"### Start-up and recovery, {str(document['started'])[:16].replace('T', ' ')} UTC, commit {rev['commit']}"
        f"{dirty}, core {rev.get('core', 'unknown')}",
        "",
        f"`{document['command']}` on {m.get('nproc')} CPUs ({m.get('cpu_model')}), nats-server "
        f"{document['server_version']}, load average {m.get('loadavg_start')} at the start and "
        f"{m.get('loadavg_end')} at the end. Sidecar position, default settings; {s['reps']} repetition(s); "
        f"{s['new_messages']} new messages waiting at each restart; a shared aggregate's newest "
        f"{shared_split(int(s['messages']))[1]:,} copies are another source's. Medians (min-max).",
        "",
        markdown_table(rows),
        "",
    ]
    if startup_runs:
        lines.append(f"- {startup_split(startup_runs, probe)}")
    for v in variant_runs:
        if v.replay is not None:
            lines.append(f"- {replay_line(v.variant, v.replay)}")
        if v.fill_msgs_per_s is not None:
            lines.append(
                f"  (filled by the bridge at {v.fill_msgs_per_s:,.0f} msg/s"
                + (f"; other source's copies written at {median(v.bury_msgs_per_s):,.0f} msg/s)" if v.other else ")")
            )
    lines.append(f"- JSON: `{json_path}`")
    return "\n".join(lines) + "\n"
