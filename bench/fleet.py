"""``python -m bench fleet``: several bridge processes sharing many quiet sources (issue 25's fleet figures).

The servers of ``python -m bench edge`` (one hub with the aggregate and the lease bucket, ``--leaves`` leaf servers,
``--sources`` WorkQueue origins round robin over them, every source reaching its leaf through the hub by its
``domain``), and ``--processes`` bridge processes started at the same moment with one and the same configuration (a
fleet: leases on, the bridge's defaults, ``lease_groups`` included). One run measures, in order:

1. **settling**: from the spawn, polling every process's ``/readyz``: *covered* when every source is owned and bound
   by some process, *settled* when, besides, no source is owned by two processes and the owners stayed the same for
   ``--stable`` seconds (a hand-over to a preferred member counts as not settled yet). Then the sources per
   process (balance: the largest and smallest share against the even one);
2. **steady state**, over ``--idle`` seconds with nothing to replicate: the coordination writes a second (the
   lease bucket's stream sequence), each process's CPU (a fraction of a core) and VmRSS;
3. one message published to every origin; then one process (the first) is SIGKILLed and the time until every one
   of its sources is owned and bound by another is measured (*take-over*, from the kill: at least one lease TTL by
   design), with how many sources of the survivors changed owner meanwhile (it should be none);
4. one more message to every origin, every copy stored, SIGTERM to the survivors (each must exit 0), and the
   aggregate read back: per source exactly ``1, 2`` in order: nothing lost, duplicated or reordered.

Figures are printed next to the issue's targets (reported, not asserted), as JSON (``--out``) and as markdown for
bench/RESULTS.md. Every wait has a deadline; every process is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import natsops as ops
from bench.common import Report, Session, execute_trial, run_command
from bench.edge import (
    EdgeServers,
    SequenceCheck,
    by_leaf,
    check_sequences,
    close_client,
    edge_config,
    layout,
    positive_float,
    positive_int,
    publish_once,
)
from bench.fanin import Target, create_origins, format_targets, markdown
from bench.procs import cpu_seconds, revision_text, rss_bytes
from bridge.core import headers
from bridge.testing.processes import BridgeProcess

TARGET_SETTLE_S = 30.0  # issue 25: three processes sharing 5,000 sources settle within 30 s of starting
TARGET_BALANCE = 0.10  # the sim's bound: every process within 10 % of the even share

DEFAULT_LEAVES = 20
DEFAULT_SOURCES = 2000
DEFAULT_PROCESSES = 3
DEFAULT_IDLE = 10.0
DEFAULT_STABLE = 5.0
QUICK_LEAVES = 2
QUICK_SOURCES = 12
QUICK_IDLE = 2.0
QUICK_STABLE = 2.0

KV_STREAM = "KV_nats-bridge"  # the default coordination bucket's stream
SETTLE_DEADLINE = 300.0
TAKEOVER_DEADLINE = 120.0
PUBLISH_DEADLINE = 60.0
STORED_DEADLINE = 120.0
STOP_TIMEOUT = 60.0
POLL = 1.0
READYZ_TIMEOUT = 15.0
MB = 1_000_000


@dataclass(slots=True)
class FleetRun:
    """Everything one run measured."""

    leaves: int
    sources: int
    processes: int
    ok: bool = False
    error: str | None = None
    covered_s: float | None = None  # spawn -> every source owned and bound by some process
    settled_s: float | None = None  # spawn -> one owner each, unchanged for `stable` seconds (the start of that)
    shares: list[int] = field(default_factory=list)  # sources owned per process once settled
    balance: float | None = None  # the largest deviation from the even share, as a fraction of it
    handovers: int = 0  # owner changes seen between covered and settled
    idle_seconds: float = 0.0
    coordination_writes_per_s: float | None = None  # the lease bucket's stream, over the idle window
    idle_cores: list[float] = field(default_factory=list)  # per process
    rss_idle_bytes: list[int] = field(default_factory=list)  # per process
    takeover_s: float | None = None  # SIGKILL of process 0 -> all its sources owned and bound by others
    taken_over: int = 0  # process 0's sources at the kill
    moved_survivors: int = 0  # sources of the surviving processes that changed owner meanwhile
    check: SequenceCheck | None = None
    exit_codes: list[int] = field(default_factory=list)  # the survivors' on SIGTERM
    loadavg: str = ""
    directory: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.as_dict() if isinstance(value, SequenceCheck) else value
        return out


# Ownership (pure)


def owners(bodies: Sequence[Mapping[str, Any] | None], names: Sequence[str]) -> dict[str, list[int]]:
    """Per source, the processes (by index) whose ``/readyz`` lists it as owned with its consumer bound."""
    out: dict[str, list[int]] = {name: [] for name in names}
    for index, body in enumerate(bodies):
        sources = (body or {}).get("sources") or {}
        for name in names:
            entry = sources.get(name) or {}
            if entry.get("role") == "owner" and entry.get("consumer_bound") is True:
                out[name].append(index)
    return out


def shares(owned: Mapping[str, list[int]], processes: int) -> list[int]:
    """Sources owned per process (a source owned by two counts for both)."""
    out = [0] * processes
    for holders in owned.values():
        for index in holders:
            out[index] += 1
    return out


def balance(counts: Sequence[int], total: int) -> float:
    """The largest deviation of a process's share from the even one, as a fraction of the even one."""
    even = total / len(counts)
    return max(abs(c - even) for c in counts) / even


# One run


class _Fleet:
    def __init__(self, run: FleetRun, directory: Path, binary: str, idle: float, stable: float) -> None:
        self.run = run
        self.directory = directory
        self.idle = idle
        self.stable = stable
        self.sources = layout(run.sources, run.leaves)
        self.names = [s.names.source for s in self.sources]
        self.servers = EdgeServers(directory / "servers", binary, run.leaves)
        self.bridges: list[BridgeProcess] = []
        self.published: dict[str, int] = dict.fromkeys(self.names, 0)

    def execute(self) -> None:
        run = self.run

        def cleanup() -> None:
            for bridge in self.bridges:
                with contextlib.suppress(Exception):
                    bridge.cleanup()

        def verdict() -> str | None:
            if any(code != 0 for code in run.exit_codes):
                return f"a bridge did not exit 0 on SIGTERM: {run.exit_codes}"
            if run.check is not None and not run.check.ok:
                return f"aggregate check failed: {run.check.summary()}"
            return None

        execute_trial(
            run, self._main, start=self.servers.start, stop=self.servers.stop, cleanup=cleanup, verdict=verdict
        )
        run.directory = str(self.directory)
        if not run.ok:
            run.error = f"{run.error} (logs in {self.directory})"

    def _alive(self, bridges: Sequence[BridgeProcess]) -> None:
        for bridge in bridges:
            if not bridge.is_running:
                raise ops.BenchError(f"bridge pid {bridge.pid} exited early; log tail:\n{bridge.tail(15)}")

    async def _owners(self, bridges: Sequence[BridgeProcess]) -> dict[str, list[int]] | None:
        """Who owns what, from every process's ``/readyz``; None when one of them did not answer (a poll that is
        skipped: a silent process is not a process that owns nothing)."""
        bodies = await asyncio.gather(*(asyncio.to_thread(b.readyz, READYZ_TIMEOUT) for b in bridges))
        return None if any(body is None for body in bodies) else owners(bodies, self.names)

    async def _main(self) -> None:
        assert self.servers.hub is not None
        hub = await ops.connect(self.servers.hub.url, "bench fleet hub")
        clients = await self.servers.leaf_clients()
        try:
            groups = by_leaf(self.sources, self.run.leaves)
            await asyncio.gather(
                *(create_origins(nc, [s.names for s in group]) for nc, group in zip(clients, groups, strict=True))
            )
            await ops.create_aggregate(hub, native=False)
            await self._settle()
            await self._steady(hub)
            routes = [(s.names.subject, s.leaf) for s in self.sources]
            await publish_once(clients, routes, PUBLISH_DEADLINE)
            self._count_published()
            await self._takeover()
            await publish_once(clients, routes, PUBLISH_DEADLINE)
            self._count_published()
            await self._finish(hub)
        finally:
            for nc in (hub, *clients):
                await close_client(nc)

    def _count_published(self) -> None:
        for name in self.names:
            self.published[name] += 1

    async def _settle(self) -> None:
        run = self.run
        config = self.directory / "bridge.toml"
        assert self.servers.hub is not None
        config.write_text(edge_config(self.servers.hub.url, self.sources))
        spawned = time.monotonic()
        for i in range(run.processes):
            self.bridges.append(BridgeProcess(config, self.directory / f"bridge{i}.log").start())
        last: dict[str, list[int]] | None = None
        since = spawned
        while True:
            self._alive(self.bridges)
            now = time.monotonic()
            if now - spawned > SETTLE_DEADLINE:
                raise ops.BenchError(f"not settled {SETTLE_DEADLINE:g}s after the spawn")
            owned = await self._owners(self.bridges)
            if owned is None:
                await asyncio.sleep(POLL)
                continue
            covered = all(owned.values())
            single = covered and all(len(h) == 1 for h in owned.values())
            if last is not None and owned != last:
                if run.covered_s is not None:  # changes once every source had been owned and bound
                    run.handovers += sum(1 for name in self.names if owned[name] != last[name])
                since = now
            if covered and run.covered_s is None:
                run.covered_s = now - spawned
            last = owned
            if single and now - since >= self.stable:
                run.settled_s = since - spawned
                run.shares = shares(owned, run.processes)
                run.balance = balance(run.shares, run.sources)
                return
            await asyncio.sleep(POLL)

    async def _steady(self, hub: Any) -> None:
        run = self.run
        pids = [b.pid for b in self.bridges if b.pid is not None]
        started, seq0 = time.monotonic(), (await ops.stream_state(hub, KV_STREAM)).last_seq
        cpu0 = [cpu_seconds(pid) for pid in pids]
        await asyncio.sleep(self.idle)
        elapsed = time.monotonic() - started
        run.idle_seconds = elapsed
        run.coordination_writes_per_s = ((await ops.stream_state(hub, KV_STREAM)).last_seq - seq0) / elapsed
        run.idle_cores = [(cpu_seconds(pid) - c) / elapsed for pid, c in zip(pids, cpu0, strict=True)]
        run.rss_idle_bytes = [rss_bytes(pid) for pid in pids]
        self._alive(self.bridges)

    async def _takeover(self) -> None:
        run = self.run
        deadline = time.monotonic() + TAKEOVER_DEADLINE
        while (before := await self._owners(self.bridges)) is None:
            self._alive(self.bridges)
            if time.monotonic() > deadline:
                raise ops.BenchError("a process's /readyz did not answer before the kill")
            await asyncio.sleep(POLL)
        victims = [name for name, holders in before.items() if holders == [0]]
        run.taken_over = len(victims)
        killed = time.monotonic()
        await asyncio.to_thread(self.bridges[0].kill)
        survivors = self.bridges[1:]
        moved: set[str] = set()
        while True:
            self._alive(survivors)
            if time.monotonic() - killed > TAKEOVER_DEADLINE:
                raise ops.BenchError(f"process 0's sources not taken over {TAKEOVER_DEADLINE:g}s after its kill")
            seen = await self._owners(survivors)
            if seen is None:
                await asyncio.sleep(POLL)
                continue
            owned = {name: [i + 1 for i in holders] for name, holders in seen.items()}  # survivor 0 is process 1
            moved |= {name for name, holders in before.items() if holders and holders != [0] and owned[name] != holders}
            if all(len(owned[name]) == 1 for name in self.names):
                run.takeover_s = time.monotonic() - killed
                break
            await asyncio.sleep(POLL)
        run.moved_survivors = len(moved)

    async def _finish(self, hub: Any) -> None:
        run = self.run
        total = sum(self.published.values())
        await ops.wait_for_count(hub, total, deadline=STORED_DEADLINE, stall=STORED_DEADLINE)
        for bridge in self.bridges[1:]:
            try:
                run.exit_codes.append(await asyncio.to_thread(bridge.stop, STOP_TIMEOUT))
            except TimeoutError:
                run.exit_codes.append(-9)
        held = (await ops.stream_state(hub, ops.AGGREGATE)).messages
        stored = await ops.read_stored(hub, 1, held, timeout=max(60.0, held / 2000))
        pairs = [(c.headers.get(headers.SOURCE, "?"), int(c.headers.get(headers.SEQ, "0"))) for c in stored]
        run.check = check_sequences(pairs, self.published)


def measure(
    leaves: int, sources: int, processes: int, *, workdir: Path, binary: str, idle: float, stable: float
) -> FleetRun:
    """One run on fresh servers in a directory below ``workdir``; a failed one carries its reason."""
    run = FleetRun(leaves=leaves, sources=sources, processes=processes)
    directory = workdir / f"fleet-{processes}p-{sources}-{time.strftime('%H%M%S')}"
    directory.mkdir(parents=True, exist_ok=True)
    _Fleet(run, directory, binary, idle, stable).execute()
    return run


# Output (pure)


def targets(run: FleetRun) -> list[Target]:
    """Each figure next to issue 25's target (reported, not asserted)."""
    out: list[Target] = []
    load = f"{run.processes} processes, {run.sources} sources on {run.leaves} leaves"
    if run.settled_s is not None:
        out.append(
            Target(
                f"settled: one owner each, stable ({load})",
                f"<= {TARGET_SETTLE_S:g} s",
                f"{run.settled_s:.1f} s (every source owned and bound at {run.covered_s or 0:.1f} s; "
                f"{run.handovers} owner changes after that)",
                "met" if run.settled_s <= TARGET_SETTLE_S else "NOT met",
            )
        )
    if run.balance is not None:
        out.append(
            Target(
                "balance: sources per process against the even share",
                f"within {TARGET_BALANCE:.0%}",
                f"{' / '.join(str(s) for s in run.shares)} ({run.balance:.1%} off at most)",
                "met" if run.balance <= TARGET_BALANCE else "NOT met",
            )
        )
    if run.coordination_writes_per_s is not None:
        cores = ", ".join(f"{c:.3f}" for c in run.idle_cores)
        rss = ", ".join(f"{r / MB:.0f}" for r in run.rss_idle_bytes)
        out.append(
            Target(
                "steady state: coordination writes, per-process CPU and RSS",
                "-",
                f"{run.coordination_writes_per_s:.1f} writes/s to the lease bucket; cores {cores}; RSS MB {rss} "
                f"over {run.idle_seconds:.1f} s",
                "reported",
            )
        )
    if run.takeover_s is not None:
        out.append(
            Target(
                "take-over: one process SIGKILLed, its sources owned and bound elsewhere",
                "-",
                f"{run.takeover_s:.1f} s for {run.taken_over} sources; {run.moved_survivors} of the survivors' "
                "sources changed owner",
                "reported",
            )
        )
    if run.check is not None:
        out.append(
            Target("nothing lost, duplicated or reordered", "0 / 0 / 0", run.check.summary(), _met(run.check.ok))
        )
    if run.exit_codes:
        out.append(Target("SIGTERM exit codes", "0", str(run.exit_codes), _met(all(c == 0 for c in run.exit_codes))))
    if not run.ok:
        out.append(Target("run", "ok", f"FAILED: {run.error}", "NOT met"))
    return out


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


# The command


def parser(sub: Any) -> None:
    """Add the ``fleet`` subcommand to ``python -m bench``."""
    p = sub.add_parser("fleet", help="several bridge processes sharing many quiet sources: settling, take-over")
    p.add_argument("--leaves", type=positive_int, help=f"leaf servers (default {DEFAULT_LEAVES}; quick {QUICK_LEAVES})")
    p.add_argument("--sources", type=positive_int, help=f"sources (default {DEFAULT_SOURCES}; quick {QUICK_SOURCES})")
    p.add_argument("--processes", type=positive_int, default=DEFAULT_PROCESSES, help="bridge processes (default 3)")
    p.add_argument("--idle", type=positive_float, help=f"seconds of the steady window (default {DEFAULT_IDLE:g})")
    p.add_argument(
        "--stable",
        type=positive_float,
        help=f"seconds the owners must stay put to count as settled (default {DEFAULT_STABLE:g})",
    )
    p.add_argument("--quick", action="store_true", help=f"smoke test: {QUICK_LEAVES} leaves, {QUICK_SOURCES} sources")
    p.add_argument("--label", default="", help="the run's name in the output")
    p.add_argument("--out", type=Path, help="the JSON file (default bench/results/fleet-<UTC time>.json)")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (servers' and bridges' files)")


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    quick: bool = args.quick
    leaves: int = args.leaves or (QUICK_LEAVES if quick else DEFAULT_LEAVES)
    sources: int = args.sources or (QUICK_SOURCES if quick else DEFAULT_SOURCES)
    idle: float = args.idle or (QUICK_IDLE if quick else DEFAULT_IDLE)
    stable: float = args.stable or (QUICK_STABLE if quick else DEFAULT_STABLE)
    processes: int = args.processes
    if leaves > 100 or processes < 2:
        print("fleet: --leaves at most 100, --processes at least 2", file=sys.stderr)
        return 2

    def measure_fleet(session: Session) -> FleetRun:
        return measure(
            leaves, sources, processes, workdir=session.workdir, binary=session.binary, idle=idle, stable=stable
        )

    def report(session: Session, result: FleetRun) -> Report:
        if result.ok and not args.keep:
            shutil.rmtree(session.workdir, ignore_errors=True)
        items = targets(result)
        print(f"\n[{session.elapsed:.0f}s] {processes} processes, {sources} sources, {'ok' if result.ok else 'FAILED'}")
        print(format_targets(items))
        info = session.info
        header = (
            f"### Fleet, {session.started.date().isoformat()}: `{session.command}`\n\n"
            f"{info['nproc']} CPUs ({info['cpu_model']}), nats-server {session.version}, "
            f"{revision_text(session.revision)}, load average {info['loadavg_start']} at start, "
            f"{info['loadavg_end']} at the end; {leaves} leaves, {sources} quiet sources, {processes} bridge processes "
            "beside the hub with one configuration (leases on, defaults)."
        )
        fields = {
            "settings": {"leaves": leaves, "sources": sources, "processes": processes, "idle": idle, "stable": stable},
            "run": result.as_dict(),
        }
        failure = "" if result.ok else f"\nthe run failed: {result.error}"
        return Report(markdown(items, header), fields, [t.as_dict() for t in items], failure)

    return run_command(
        "fleet", args.out, measure_fleet, report, workdir_holds="run", label=args.label, record_elapsed=True
    )
