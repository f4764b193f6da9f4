"""``python -m bench registry``: from ``nats-bridge sources add`` to the new site's first message stored, on a large
aggregate (issue 27, point 3).

Native sourcing takes a new source by a stream update, which on a large aggregate scans the stream (45 s on a
6M-message stream: nats-server issue 6992); the registry must not care what the aggregate holds. One run:

1. a fresh hub and leaf (``bench.world``); the aggregate on the hub preloaded with ``--aggregate`` messages
   (``--size`` bytes, on 64 subjects of other sources' copies); ``--sites`` origin streams on the leaf, each holding
   ``MESSAGES`` messages already;
2. one bridge process (leases on, the defaults) whose file has no ``[[sources]]``: ``[source_defaults]`` names the
   leaf and ``subject_prefix = "edge.{name}"``, so a site's registry entry is its name and stream;
3. per site, one after the other: ``python -m bridge sources add`` run as an operator would (a process of its own,
   its start-up included), then the aggregate polled (``STREAM.INFO`` with a subject filter, every 10 ms) until the
   site's first copy is stored. Measured from the command's start and from its exit; from the bridge's log, when
   it applied the change (``registry.applied``) and when the source was bound (``reset.done`` or, for a new
   consumer, ``consumer.resumed``);
4. every copy of every site stored (exactly ``MESSAGES`` per site), SIGTERM (exit 0).

Figures are printed beside the target (reported, not asserted), as JSON (``--out``) and as markdown for
bench/RESULTS.md. Every wait has a deadline; every process is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from bench import natsops as ops
from bench.common import REPO_ROOT, Report, Session, loadavg, run_command
from bench.fanin import Target, format_targets, markdown
from bench.procs import revision_text
from bench.world import World, in_world
from bridge.core.times import parse_rfc3339_ns
from bridge.testing.configs import toml_value
from bridge.testing.servers import READY_EVENTS

TARGET_S = 2.0  # issue 27: from sources add to the new source's first message stored
DEFAULT_AGGREGATE = 1_000_000
QUICK_AGGREGATE = 10_000
DEFAULT_SITES = 5
QUICK_SITES = 2
MESSAGES = 10  # already in each site's origin when it is registered
POLL = 0.01
DEADLINE = 60.0


@dataclass
class SiteRun:
    """One registration: seconds from the command's start (``t0``) to each step."""

    name: str
    command_s: float = 0.0  # the command's own run, process start included
    applied_s: float | None = None  # the bridge logged registry.applied with this site added
    bound_s: float | None = None  # its consumer bound, recovery done (reset.done / consumer.resumed)
    first_stored_s: float | None = None  # its first copy found in the aggregate

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class RegistryRun:
    aggregate: int
    size: int
    preload_s: float = 0.0
    sites: list[SiteRun] = field(default_factory=list)
    copies_ok: bool = False
    exit_code: int | None = None
    loadavg: str = ""
    ok: bool = False
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["sites"] = [site.as_dict() for site in self.sites]
        return out


def bridge_config(world: World) -> str:
    """A fleet's file with no sources: the target, leases (defaults), and what every site shares, copies under
    ``edge.<site>`` (restart recovery then reads only the site's own copies; and in this world the leaf's streams
    would capture copies published on their own subjects at the hub, which the leafnode carries back: a cycle)."""
    leaf = world.topology.leaf.url
    prefix = f'subject_prefix = "{ops.AGGREGATE_SUBJECTS}.{{name}}"\n'
    return (
        '[log]\nlevel = "info"\nformat = "json"\n\n'
        '[http]\nlisten = "127.0.0.1:0"\n\n'
        f"[target]\nservers = [{toml_value(world.topology.hub.url)}]\nstream = {toml_value(ops.AGGREGATE)}\n\n"
        f"[source_defaults]\nservers = [{toml_value(leaf)}]\n{prefix}"
    )


async def preload_aggregate(hub: Client, count: int, size: int) -> float:
    """``count`` messages of other sources' copies in the aggregate, as fast as acks allow; the seconds it took."""
    payload = bytes(size)
    started = time.monotonic()
    async with ops.Publisher(hub, 4096) as pub:
        for n in range(count):
            await pub.publish(f"{ops.AGGREGATE_SUBJECTS}.bulk.{n % 64}", payload)
        await pub.drain(600.0)
    return time.monotonic() - started


async def copies(hub: Client, site: str) -> int:
    """The site's copies stored in the aggregate (``site-3``'s under ``edge.site-3.>``)."""
    subject = f"{ops.AGGREGATE_SUBJECTS}.{site}.>"
    info = await ops.api(hub, f"$JS.API.STREAM.INFO.{ops.AGGREGATE}", {"subjects_filter": subject})
    return sum(int(n) for n in (info.get("state", {}).get("subjects") or {}).values())


async def add_site(world: World, hub: Client, index: int) -> SiteRun:
    name = f"site-{index}"
    run = SiteRun(name)
    sites = world.directory / f"{name}.toml"
    sites.write_text(f'[[sources]]\nname = "{name}"\nstream = "SITE{index}"\n', encoding="utf-8")
    t0 = time.monotonic()
    t0_ns = time.time_ns()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bridge",
        "sources",
        "add",
        "-c",
        str(world.config),
        "--file",
        str(sites),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    run.command_s = time.monotonic() - t0
    if proc.returncode != 0:
        raise ops.BenchError(f"sources add exited {proc.returncode}: {(out + err).decode()[-500:]}")
    deadline = t0 + DEADLINE
    while await copies(hub, name) == 0:
        if time.monotonic() > deadline:
            raise ops.BenchError(f"{name}: no copy stored {DEADLINE:g}s after sources add")
        failure = world.bridge_failure()
        if failure:
            raise ops.BenchError(failure)
        await asyncio.sleep(POLL)
    run.first_stored_s = time.monotonic() - t0
    bridge = world.bridge
    assert bridge is not None
    for event in bridge.events("registry.applied"):
        if name in event.get("added", []):
            run.applied_s = (parse_rfc3339_ns(str(event["timestamp"])) - t0_ns) / 1e9
    bound = bridge.events(READY_EVENTS, source=name)
    if bound:
        run.bound_s = (parse_rfc3339_ns(str(bound[0]["timestamp"])) - t0_ns) / 1e9
    return run


def measure(aggregate: int, sites: int, size: int, workdir: Path, keep: bool) -> RegistryRun:
    result = RegistryRun(aggregate, size, loadavg=loadavg())

    async def body(world: World, leaf: Client, hub: Client) -> None:
        await ops.create_aggregate(hub, native=False)
        result.preload_s = await preload_aggregate(hub, aggregate, size)
        for i in range(sites):
            await ops.api(
                leaf,
                f"$JS.API.STREAM.CREATE.SITE{i}",
                {"name": f"SITE{i}", "subjects": [f"site{i}.>"], "retention": "workqueue", "storage": "file"},
            )
            for n in range(MESSAGES):
                await leaf.request(f"site{i}.orders.{n % 3}", b"x" * size, timeout=5)
        world.write_config(bridge_config(world))
        bridge = world.start_bridge()
        await asyncio.to_thread(_wait, bridge, "registry.read")
        for i in range(sites):
            result.sites.append(await add_site(world, hub, i))
        deadline = time.monotonic() + DEADLINE
        while [await copies(hub, f"site-{i}") for i in range(sites)] != [MESSAGES] * sites:
            if time.monotonic() > deadline:
                raise ops.BenchError("not every site's copies stored")
            await asyncio.sleep(0.1)
        result.copies_ok = True
        result.exit_code = await world.stop_bridge()

    def failed() -> bool:
        return result.error is not None

    try:
        in_world(workdir / "world", body, failed=failed, keep=keep)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    if result.error is None and result.exit_code != 0:
        result.error = f"bridge exited {result.exit_code} on SIGTERM"
    result.ok = result.error is None
    return result


def _wait(bridge: Any, event: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not bridge.events(event):
        if not bridge.is_running:
            raise ops.BenchError(f"bridge exited early:\n{bridge.tail(15)}")
        if time.monotonic() > deadline:
            raise ops.BenchError(f"no {event} within {DEADLINE:g}s")
        time.sleep(0.05)


def targets(run: RegistryRun) -> list[Target]:
    stored = [s.first_stored_s for s in run.sites if s.first_stored_s is not None]
    after_exit = [s.first_stored_s - s.command_s for s in run.sites if s.first_stored_s is not None]
    applied = [s.applied_s for s in run.sites if s.applied_s is not None]
    bound = [s.bound_s for s in run.sites if s.bound_s is not None]

    def spread(values: list[float]) -> str:
        return f"median {statistics.median(values):.2f} s, max {max(values):.2f} s" if values else "-"

    met = bool(stored) and max(stored) <= TARGET_S
    return [
        Target(
            f"sources add to the first copy stored ({run.aggregate:,} messages in the aggregate)",
            f"<= {TARGET_S:g} s",
            spread(stored) + f" over {len(stored)} sites",
            "met" if met else "NOT met",
        ),
        Target(
            "  of which the command itself (a Python process's start included)",
            "-",
            spread([s.command_s for s in run.sites]),
            "reported",
        ),
        Target("  from the command's exit to the first copy stored", "-", spread(after_exit), "reported"),
        Target("  applied by the bridge (from the command's start, log time)", "-", spread(applied), "reported"),
        Target("  consumer bound, recovery done (log time)", "-", spread(bound), "reported"),
        Target(
            "every copy stored, SIGTERM exit 0",
            "yes",
            f"{'yes' if run.copies_ok else 'no'}, exit {run.exit_code}",
            "met" if run.copies_ok and run.exit_code == 0 else "NOT met",
        ),
    ]


def parser(sub: Any) -> None:
    """Add the ``registry`` subcommand to ``python -m bench``."""
    p = sub.add_parser("registry", help="from sources add to the new site's first copy stored, on a large aggregate")
    p.add_argument("--aggregate", type=int, help=f"messages in the aggregate (default {DEFAULT_AGGREGATE:,})")
    p.add_argument("--sites", type=int, help=f"sites registered one after the other (default {DEFAULT_SITES})")
    p.add_argument("--size", type=int, default=128, help="payload bytes (default 128)")
    p.add_argument(
        "--quick", action="store_true", help=f"smoke test: {QUICK_AGGREGATE:,} messages, {QUICK_SITES} sites"
    )
    p.add_argument("--label", default="", help="the run's name in the output")
    p.add_argument("--out", type=Path, help="the JSON file (default bench/results/registry-<UTC time>.json)")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (servers' and bridge's files)")


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    aggregate: int = args.aggregate or (QUICK_AGGREGATE if args.quick else DEFAULT_AGGREGATE)
    sites: int = args.sites or (QUICK_SITES if args.quick else DEFAULT_SITES)
    if aggregate < 0 or sites < 1:
        print("registry: --aggregate at least 0, --sites at least 1", file=sys.stderr)
        return 2

    def measure_registry(session: Session) -> RegistryRun:
        return measure(aggregate, sites, args.size, session.workdir, args.keep)

    def report(session: Session, result: RegistryRun) -> Report:
        items = targets(result)
        print(f"\n[{session.elapsed:.0f}s] {sites} sites, {aggregate:,} messages, {'ok' if result.ok else 'FAILED'}")
        print(format_targets(items))
        info = session.info
        header = (
            f"### Registering a site, {session.started.date().isoformat()}: `{session.command}`\n\n"
            f"{info['nproc']} CPUs ({info['cpu_model']}), nats-server {session.version}, "
            f"{revision_text(session.revision)}, load average {info['loadavg_start']} at start, "
            f"{info['loadavg_end']} at the end; the aggregate preloaded with {aggregate:,} messages of {args.size} B "
            f"in {result.preload_s:.0f} s; one bridge (leases on, defaults) whose file has no sources; "
            "subject_prefix edge.<site>; "
            f"{sites} sites registered one after the other, each holding {MESSAGES} messages."
        )
        settings = {"aggregate": aggregate, "sites": sites, "size": args.size}
        fields = {"settings": settings, "run": result.as_dict()}
        failure = "" if result.ok else f"\nthe run failed: {result.error}"
        return Report(markdown(items, header), fields, [t.as_dict() for t in items], failure)

    return run_command("registry", args.out, measure_registry, report, workdir_holds="run", label=args.label)
