"""``python -m bench edge``: the edge at scale (issue 25), tried as a user would.

One hub (JetStream domain ``hub``, the aggregate ``AGG``: a file Limits stream with ``allow_direct`` capturing
``edge.>``) and ``--leaves`` leaf servers (``leaf00`` ...), each with JetStream in a domain of its own and a leafnode
remote to the hub (:class:`bridge.testing.servers.NatsServer`, one :class:`~bridge.testing.servers.Topology` per
leaf for the link checks). ``--sources`` WorkQueue origin streams spread round robin over the leaves (source ``i``
on leaf ``i % L``: ``ORIGIN_0007`` capturing ``o.0007.>``), and one bridge process beside the hub (the sidecar
position: connected to the hub only, every source reaching its leaf's JetStream through the hub by the leaf's
``domain``; ``subject_prefix`` ``edge.s0007``; leases on, everything else the bridge's defaults). One run measures,
in order:

1. **start-up**: spawn to every source's first ``reset.done`` or ``consumer.resumed`` (``resync.done`` in pull
   mode), from the log's own timestamps; then ``/readyz`` must list every source as owned and bound;
2. **idle**: over a few seconds with nothing to replicate, the bridge's CPU (a fraction of a core) and VmRSS;
3. **replication**: a paced producer (one connection per leaf) sends ``--rate`` msg/s to every origin for half of
   ``--seconds``: the bridge's CPU per message published over that window (idle costs included, as a user pays
   them);
4. **the storm**: the producer's publishes all acknowledged, every leaf is SIGKILLed at once and all are started
   again 3 s later (same ports, same stores: the origins keep their messages and the bridge's durables). Once every
   leaf is linked to the hub again (its JetStream API reachable across the link: *the links' return*), one probe
   message is published to every origin (subject ``o.<i>.probe``); a source **replicates again** when its probe's
   copy is stored in the aggregate, and the figure is the copy's store time (server clock, read back at the end)
   minus the links' return (the slowest source's, and the median). The bridge's ``lease.lost``,
   ``source.fenced``, ``lease.renew_failed`` and ``lease.suspended`` log lines from the kill to the end of the run
   are counted;
5. the second half of the production, then the drain: every copy stored, every origin empty (WorkQueue: acked =
   deleted) or a deadline; ``/readyz``; SIGTERM (it must exit 0); every copy read back: per source the copies'
   ``Bridge-Seq`` (the origin sequence) in aggregate order must be exactly ``1 .. published``: nothing lost,
   duplicated or reordered.

Figures are printed next to the issue's targets (reported, not asserted), written as JSON (``--out``) and as a
markdown table to paste into bench/RESULTS.md. Every wait has a deadline; every process is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from bench import natsops as ops
from bench.common import Report, Session, execute_trial, run_command, sigterm_problem
from bench.fanin import (
    BridgeLog,
    Production,
    SourceNames,
    Target,
    create_origins,
    format_targets,
    markdown,
    metric_sums,
    sched_seconds,
    unbound_sources,
)
from bench.procs import cpu_seconds, main_thread_cpu_seconds, peak_rss_bytes, revision_text, rss_bytes
from bench.stats import median, parse_rfc3339_ns, percentile
from bridge.core import headers
from bridge.testing.configs import SourceSpec, toml_value
from bridge.testing.http import get
from bridge.testing.processes import BridgeProcess
from bridge.testing.servers import NatsServer, Topology

# Issue 25's targets, reported next to each figure (never asserted).
TARGET_STARTUP_S = 15.0  # every source bound, for 2,000 sources
TARGET_STARTUP_SOURCES = 2000
TARGET_IDLE_CORES_PER_1000 = 0.05
TARGET_CPU_US_PER_MSG = 120.0  # at 1 msg/s per source
TARGET_RSS_BYTES = 150_000_000  # for 2,000 sources
TARGET_RSS_SOURCES = 2000
TARGET_RECOVERY_S = 10.0  # after every leaf is killed and restarted together, from the links' return

DEFAULT_LEAVES = 20
DEFAULT_SOURCES = 500
DEFAULT_RATE = 1.0
DEFAULT_SECONDS = 30.0
DEFAULT_SIZE = 256
DEFAULT_IDLE = 5.0
DEFAULT_DOWN = 3.0  # seconds between the kill and the restart
QUICK_LEAVES = 2
QUICK_SOURCES = 10
QUICK_RATE = 2.0
QUICK_SECONDS = 4.0
QUICK_IDLE = 2.0

HUB_DOMAIN = "hub"
LEAF_PREFIX = "leaf"
PROBE = "probe"  # the last token of the probes' subjects
MAX_FILE_STORE = "64GB"  # a limit, not an allocation
STARTUP_DEADLINE = 180.0
READYZ_DEADLINE = 60.0
SERVER_READY_TIMEOUT = 30.0
LINK_DEADLINE = 60.0
RECOVERY_DEADLINE = 180.0  # the probes' copies; past it the run fails
DRAIN_DEADLINE = 120.0
STALL_SECONDS = 60.0
ORIGINS_EMPTY_DEADLINE = 60.0
BRIDGE_STOP_TIMEOUT = 60.0
PUBLISH_WINDOW = 4096
PROBE_CONCURRENCY = 256
PACE_TICK = 0.005
LOG_POLL = 0.2
POLL = 0.2
SAMPLE_EVERY = 0.5
MB = 1_000_000
STORM_EVENTS = ("lease.lost", "source.fenced", "lease.renew_failed", "lease.suspended")
# a publish with no ack within target.ack_timeout (sent again and verified: nothing lost, but the hub fell behind)
PUBLISH_EVENTS = ("publish.blocked", "publish.verified")
COUNTERS = (
    "nats_bridge_deliveries",
    "nats_bridge_replicated_messages",
    "nats_bridge_flow_control_requests",
    "nats_bridge_publishes_limit",  # the process's limit on publishes in flight at the end (bridge/core/budget.py)
    "nats_bridge_publishes_limit_cuts",
)


# Layout and configuration (pure)


def leaf_domain(index: int) -> str:
    """The JetStream domain (and server name) of leaf ``index``: ``leaf00``, ``leaf01`` ..."""
    return f"{LEAF_PREFIX}{index:02d}"


@dataclass(frozen=True, slots=True)
class EdgeSource:
    """One source: its names (fan-in's: source, origin stream, subject, prefix) and the leaf its origin lives on."""

    names: SourceNames
    leaf: int

    @property
    def domain(self) -> str:
        return leaf_domain(self.leaf)

    @property
    def probe_subject(self) -> str:
        """The subject of the post-storm probe (the origin captures ``o.<i>.>``)."""
        return self.names.subject.rsplit(".", 1)[0] + "." + PROBE


def layout(sources: int, leaves: int) -> list[EdgeSource]:
    """``sources`` sources spread round robin over ``leaves`` leaves (source ``i`` on leaf ``i % leaves``), names
    zero-padded to at least four digits (``s0007``, ``ORIGIN_0007``, ``o.0007.m``, ``edge.s0007``).

    Raises:
        ValueError: fewer than one source or one leaf, or more leaves than 100 (two-digit domains).
    """
    if sources < 1 or leaves < 1:
        raise ValueError(f"need at least one source and one leaf, got {sources} and {leaves}")
    if leaves > 100:
        raise ValueError(f"at most 100 leaves, got {leaves}")
    width = max(4, len(str(sources - 1)))
    out = []
    for i in range(sources):
        tag = f"{i:0{width}d}"
        names = SourceNames(f"s{tag}", f"ORIGIN_{tag}", f"o.{tag}.m", f"{ops.AGGREGATE_SUBJECTS}.s{tag}")
        out.append(EdgeSource(names, i % leaves))
    return out


def by_leaf(sources: Sequence[EdgeSource], leaves: int) -> list[list[EdgeSource]]:
    """The sources of each leaf, in order."""
    out: list[list[EdgeSource]] = [[] for _ in range(leaves)]
    for s in sources:
        out[s.leaf].append(s)
    return out


def edge_config(hub_url: str, sources: Sequence[EdgeSource]) -> str:
    """The bridge's configuration as a user writes it: JSON logs, an HTTP listener on a free port, the aggregate on
    the hub, and per source its name, the hub as its server, its leaf's ``domain``, its origin stream and its
    ``subject_prefix``; the bridge's defaults everywhere else (leases included)."""
    lines = [
        "# written by `python -m bench edge`",
        "[log]",
        f"level = {toml_value('info')}",
        f"format = {toml_value('json')}",
        "",
        "[http]",
        f"listen = {toml_value('127.0.0.1:0')}",
        "",
        "[target]",
        f"servers = {toml_value([hub_url])}",
        f"stream = {toml_value(ops.AGGREGATE)}",
    ]
    for s in sources:
        spec = SourceSpec(
            name=s.names.source,
            servers=hub_url,
            stream=s.names.stream,
            domain=s.domain,
            subject_prefix=s.names.prefix,
        )
        lines += ["", "[[sources]]", *(f"{key} = {toml_value(value)}" for key, value in spec.table().items())]
    return "\n".join(lines) + "\n"


# Checking the aggregate (pure)


@dataclass(slots=True)
class SequenceCheck:
    """Per source, the copies' origin sequences (in aggregate order) against ``1 .. published``."""

    sources: int = 0
    expected: int = 0  # messages published, all sources
    copies: int = 0  # copies read back, all sources
    missing: int = 0  # origin sequences in 1..published with no copy
    duplicates: int = 0  # copies beyond the first of an origin sequence
    reordered: int = 0  # copies stored after a copy of a higher origin sequence of the same source
    unexpected: int = 0  # copies of a sequence outside 1..published, or of a source not published to
    bad: dict[str, str] = field(default_factory=dict)  # up to 10 sources that fail, with what

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicates or self.reordered or self.unexpected)

    def summary(self) -> str:
        return (
            f"{self.copies:,} copies of {self.expected:,} published over {self.sources} sources: "
            f"{self.missing} missing, {self.duplicates} duplicated, {self.reordered} reordered, "
            f"{self.unexpected} unexpected"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ok": self.ok}


def check_sequences(copies: Sequence[tuple[str, int]], published: Mapping[str, int]) -> SequenceCheck:
    """Check ``(source, origin sequence)`` pairs, in the aggregate's order, against ``published`` (per source, the
    messages its origin got: sequences ``1 .. n``). A source's copies pass when they are exactly ``1, 2, ..., n``."""
    seen: dict[str, list[int]] = {name: [] for name in published}
    check = SequenceCheck(sources=len(published), expected=sum(published.values()), copies=len(copies))
    for source, seq in copies:
        seen.setdefault(source, []).append(seq)
    for source in sorted(seen):
        seqs = seen[source]
        n = published.get(source, 0)
        valid = [s for s in seqs if 1 <= s <= n]
        unexpected = len(seqs) - len(valid)
        distinct = set(valid)
        duplicates = len(valid) - len(distinct)
        missing = n - len(distinct)
        reordered = 0
        highest = 0
        for s in valid:
            if s < highest:
                reordered += 1
            highest = max(highest, s)
        check.unexpected += unexpected
        check.duplicates += duplicates
        check.missing += missing
        check.reordered += reordered
        if (unexpected or duplicates or missing or reordered) and len(check.bad) < 10:
            gaps = sorted(set(range(1, n + 1)) - distinct)[:5]
            check.bad[source] = (
                f"{len(seqs)} copies of {n}: missing {missing} (first {gaps}), duplicated {duplicates}, "
                f"reordered {reordered}, unexpected {unexpected}"
            )
    return check


def recovery_times(probe_store_ns: Mapping[str, int], links_ns: int, sources: Sequence[str]) -> dict[str, Any]:
    """Seconds from the links' return to each source's probe copy being stored: the slowest, the median, how many
    sources have none (their probe never replicated)."""
    delays = {s: (probe_store_ns[s] - links_ns) / 1e9 for s in sources if s in probe_store_ns}
    missing = [s for s in sources if s not in probe_store_ns]
    out: dict[str, Any] = {"sources": len(sources), "replicated": len(delays), "missing": missing[:10]}
    if delays:
        slowest = max(sorted(delays), key=lambda s: delays[s])
        out.update(
            max_s=delays[slowest],
            slowest=slowest,
            median_s=median(list(delays.values())),
            p90_s=percentile(list(delays.values()), 90),
        )
    return out


# One run's figures


@dataclass(slots=True)
class EdgeRun:
    """Everything one run measured."""

    leaves: int
    sources: int
    rate: float
    seconds: float
    size: int
    leaf_nice: int = 0  # the leaves' niceness (they stand for other machines)
    ok: bool = False
    error: str | None = None
    startup_s: float | None = None  # spawn -> the last source's first reset.done / consumer.resumed (log timestamps)
    startup_first_s: float | None = None
    startup_median_s: float | None = None
    startup_readyz_s: float | None = None  # spawn -> /readyz listing every source owned and bound
    startup_bridge_cpu_s: float | None = None
    modes: dict[str, int] = field(default_factory=dict)
    idle_seconds: float = 0.0
    idle_cores: float | None = None  # the bridge's CPU over the idle window / its length
    idle_main_cores: float | None = None  # the main thread's part of it (the rest: the fleet's thread)
    idle_servers_cores: float | None = None  # hub + leaves over the same window
    idle_hub_cores: float | None = None  # the hub alone, same window
    rss_idle_bytes: int | None = None
    rss_max_bytes: int | None = None  # the largest VmRSS sample (production, storm and drain)
    rss_peak_bytes: int | None = None  # VmHWM before SIGTERM
    phase1: Production | None = None
    phase2: Production | None = None
    cpu_us_per_msg: float | None = None  # the bridge's CPU over the first half of the production / messages sent
    cores_replicating: float | None = None
    main_cores_replicating: float | None = None  # the main thread's part of it, same window
    wait_cores_replicating: float | None = None  # runnable but waiting for a CPU, same window
    cpu_us_per_msg_after: float | None = None  # the same over the second half (after the storm)
    storm_down_s: float | None = None  # kill -> every leaf started again
    storm_links_s: float | None = None  # kill -> every leaf linked to the hub (the links' return)
    recovery: dict[str, Any] = field(default_factory=dict)  # recovery_times()
    probe_publish_s: float | None = None  # links' return -> every probe acknowledged by its origin
    recovery_wait_s: float | None = None  # links' return -> the poll that saw every probe copy stored
    storm_bridge_cpu_s: float | None = None  # kill -> every probe copy stored
    storm_events: dict[str, int] = field(default_factory=dict)  # STORM_EVENTS from the kill to the end
    storm_resets: dict[str, int] = field(default_factory=dict)  # reset/resync requests by cause, same span
    storm_event_times: dict[str, list[float]] = field(default_factory=dict)  # first and last, s after the kill
    drain_s: float | None = None  # last publish -> every copy stored
    origins_left: int | None = None  # messages left in the origins at the end (0: every one acked)
    check: SequenceCheck | None = None
    ready_at_end: bool | None = None
    counters: dict[str, float] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    bridge_exit_code: int | None = None
    loadavg: str = ""
    directory: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Production | SequenceCheck):
                value = value.as_dict()
            out[f.name] = value
        return out


# The bridge's log, with the storm's events


class EdgeLog(BridgeLog):
    """Fan-in's log follower, also keeping the storm's events (and resets) from a mark on, with their times."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.mark_ns: int | None = None
        self.since_mark: dict[str, list[int]] = {}  # event -> log timestamps (ns), from the mark on
        self.resets_since_mark: dict[str, int] = {}

    def feed(self, event: Mapping[str, Any]) -> None:
        super().feed(event)
        if self.mark_ns is None:
            return
        name = str(event.get("event", ""))
        try:
            stamp = parse_rfc3339_ns(str(event.get("timestamp", "")))
        except ValueError:
            stamp = time.time_ns()
        if stamp < self.mark_ns:
            return
        if name in STORM_EVENTS or name in PUBLISH_EVENTS:
            self.since_mark.setdefault(name, []).append(stamp)
        elif name in ("reset.requested", "resync.requested"):
            cause = str(event.get("cause", "?"))
            self.resets_since_mark[cause] = self.resets_since_mark.get(cause, 0) + 1


# NATS work


async def produce(
    clients: Sequence[Client], routes: Sequence[tuple[str, int]], rate: float, seconds: float, size: int
) -> tuple[Production, dict[int, int]]:
    """Publish ``rate`` msg/s to each ``(subject, leaf)`` route for ``seconds``, round robin (one even stream of
    ``rate * len(routes)`` msg/s), each leaf's through its client with pipelined acks. Returns once every publish is
    acknowledged, with how many went to each route.

    Raises:
        BenchError: publishes not acknowledged within a minute, or refused.
    """
    n = len(routes)
    per_route = max(1, round(rate * seconds))
    total = per_route * n
    total_rate = rate * n
    payload = os.urandom(size)
    result = Production(planned=total, planned_rate=total_rate, connections=len(clients))
    late: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        pubs = [await stack.enter_async_context(ops.Publisher(nc, window=PUBLISH_WINDOW)) for nc in clients]
        loop = asyncio.get_running_loop()
        cpu0 = time.process_time()
        start = last = loop.time()
        m = 0
        while m < total:
            due = min(total, int((loop.time() - start) * total_rate) + 1)
            if due <= m:
                await asyncio.sleep(PACE_TICK)
                continue
            while m < due:
                subject, leaf = routes[m % n]
                await pubs[leaf].publish(subject, payload)
                last = loop.time()
                late.append(last - start - m / total_rate)
                m += 1
            await asyncio.sleep(0)
        for pub in pubs:
            await pub.drain(60.0)
        result.cpu_s = time.process_time() - cpu0
    result.sent = total
    result.seconds = last - start
    result.achieved_rate = total / (result.seconds + 1 / total_rate)
    result.late_p50_ms = percentile(late, 50) * 1e3
    result.late_p99_ms = percentile(late, 99) * 1e3
    result.late_max_ms = max(late) * 1e3
    return result, dict.fromkeys(range(n), per_route)


async def publish_once(clients: Sequence[Client], routes: Sequence[tuple[str, int]], deadline: float) -> None:
    """One message to every ``(subject, leaf)`` route, every publish acknowledged (up to :data:`PROBE_CONCURRENCY`
    requests in flight, so the last probe does not leave seconds after the first); a refused one is tried again (a
    restarted leaf may answer before its streams are back) until ``deadline`` seconds have passed.

    Raises:
        BenchError: not every publish acknowledged in time.
    """
    started = time.monotonic()
    pending = list(routes)
    errors: list[str] = []

    async def one(route: tuple[str, int]) -> bool:
        subject, leaf = route
        try:
            ack = await clients[leaf].request(subject, PROBE.encode(), timeout=5.0)
        except Exception as exc:  # no responders, timeout
            errors.append(f"{subject}: {type(exc).__name__} {exc}")
            return False
        if b'"error"' in ack.data:
            errors.append(f"{subject}: {ack.data[:200].decode(errors='replace')}")
            return False
        return True

    while pending:
        failed = []
        for i in range(0, len(pending), PROBE_CONCURRENCY):
            chunk = pending[i : i + PROBE_CONCURRENCY]
            done = await asyncio.gather(*(one(route) for route in chunk))
            failed += [route for route, ok in zip(chunk, done, strict=True) if not ok]
        pending = failed
        if pending:
            if time.monotonic() - started > deadline:
                raise ops.BenchError(f"{len(pending)} probe(s) not acknowledged after {deadline:g}s: {errors[-1]}")
            await asyncio.sleep(0.2)


async def subject_counts(hub: Client, subjects_filter: str) -> dict[str, int]:
    """The aggregate's message count per subject matching ``subjects_filter`` (STREAM.INFO, every page)."""
    out: dict[str, int] = {}
    offset = 0
    while True:
        info = await ops.api(
            hub,
            f"$JS.API.STREAM.INFO.{ops.AGGREGATE}",
            {"subjects_filter": subjects_filter, "offset": offset},
            timeout=10.0,
        )
        page = (info.get("state") or {}).get("subjects") or {}
        out.update({str(k): int(v) for k, v in page.items()})
        total = int(info.get("total", 0))
        offset += len(page)
        if not page or offset >= total:
            return out


async def close_client(nc: Client) -> None:
    """Close a bench connection, giving up after 5 s (a dead server's connection may not close cleanly)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 5)


class EdgeServers:
    """The hub (JetStream domain ``hub``) and ``leaves`` leaf servers, each in a domain of its own with a leafnode
    remote to the hub, under ``directory``; every one stopped by its PID in :meth:`stop`."""

    def __init__(self, directory: Path, binary: str, leaves: int, *, leaf_nice: int = 0) -> None:
        self.directory = directory
        self.leaf_nice = leaf_nice
        self.binary = binary
        self.count = leaves
        self.hub: NatsServer | None = None
        self.leaves: list[NatsServer] = []
        self.links: list[Topology] = []

    def start(self) -> None:
        self.hub = NatsServer(
            self.directory / "hub",
            name="hub",
            binary=self.binary,
            domain=HUB_DOMAIN,
            leafnode_listen=True,
            max_file_store=MAX_FILE_STORE,
        )
        self.hub.start()
        self.hub.wait_ready(SERVER_READY_TIMEOUT)
        for i in range(self.count):
            leaf = NatsServer(
                self.directory / leaf_domain(i),
                name=leaf_domain(i),
                binary=self.binary,
                domain=leaf_domain(i),
                leaf_remotes=[self.hub.leafnode_url],
                max_file_store=MAX_FILE_STORE,
                nice=self.leaf_nice,
            )
            self.leaves.append(leaf)
            self.links.append(Topology(self.hub, leaf))
        self.start_leaves()
        self.wait_linked()

    def start_leaves(self) -> None:
        for leaf in self.leaves:
            leaf.start()

    def wait_linked(self) -> int:
        """Every leaf ready and linked to the hub, its JetStream API reachable across the link (one deadline for
        all); returns when the last link was seen (wall clock, ns).

        A link counts once both ends list it with the other's JetStream API interest (usable for requests: seconds
        after the connection is logged, on servers busy recovering). Each leaf is watched by a thread of its own:
        looked at one after another, the links after the slowest were each seen a monitoring round trip or two
        later (0.1-0.4 s each during a storm), so the links' return was read late and the recovery times measured
        from it came out short."""
        deadline = time.monotonic() + LINK_DEADLINE

        def watch(link: Topology) -> int:
            link.leaf.wait_ready(max(0.1, min(SERVER_READY_TIMEOUT, deadline - time.monotonic())))
            link.wait_linked(max(0.1, deadline - time.monotonic()))
            return time.time_ns()

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(self.links))) as pool:
            return max(pool.map(watch, self.links), default=time.time_ns())

    def stop(self) -> None:
        for leaf in self.leaves:
            with contextlib.suppress(Exception):
                leaf.stop()
        if self.hub is not None:
            self.hub.stop()

    def pids(self, *, hub_only: bool = False) -> list[int]:
        servers = [self.hub] if hub_only else [self.hub, *self.leaves]
        return [s.pid for s in servers if s is not None and s.pid is not None]

    def cpu(self, *, hub_only: bool = False) -> float:
        """CPU seconds of every server (or of the hub alone) so far."""
        total = 0.0
        for pid in self.pids(hub_only=hub_only):
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        return total

    async def leaf_clients(self) -> list[Client]:
        return [await ops.connect(leaf.url, f"bench {leaf.name}") for leaf in self.leaves]


# One run


class _Run:
    """One run's servers, bridge and figures."""

    def __init__(self, run: EdgeRun, directory: Path, binary: str, idle: float, down: float) -> None:
        self.run = run
        self.directory = directory
        self.idle = idle
        self.down = down
        self.sources = layout(run.sources, run.leaves)
        self.servers = EdgeServers(directory / "servers", binary, run.leaves, leaf_nice=run.leaf_nice)
        self.bridge: BridgeProcess | None = None
        self.log = EdgeLog(directory / "bridge.log")
        self.published: dict[str, int] = {s.names.source: 0 for s in self.sources}
        self.rss_samples: list[int] = []
        self.kill_ns = 0  # the storm's kill and the links' return (wall clock, ns)
        self.links_ns = 0
        self.storm_cpu0 = 0.0  # the bridge's CPU seconds at the kill

    @property
    def pid(self) -> int:
        assert self.bridge is not None and self.bridge.pid is not None
        return self.bridge.pid

    def _failure(self) -> str | None:
        if self.bridge is None or self.bridge.is_running:
            return None
        return f"bridge exited early; log tail:\n{self.bridge.tail(15)}"

    def _alive(self) -> None:
        if (reason := self._failure()) is not None:
            raise ops.BenchError(reason)

    # -- the run ---------------------------------------------------------------------------------------------

    def execute(self) -> None:
        run = self.run

        def cleanup() -> None:
            if self.bridge is not None:
                self.bridge.cleanup()

        def verdict() -> str | None:
            if (problem := sigterm_problem(run.bridge_exit_code)) is not None:
                return problem
            if run.check is not None and not run.check.ok:
                return f"aggregate check failed: {run.check.summary()}"
            if run.recovery.get("missing"):
                return f"probes never replicated: {run.recovery['missing']}"
            return None

        execute_trial(
            run, self._main, start=self.servers.start, stop=self.servers.stop, cleanup=cleanup, verdict=verdict
        )
        run.directory = str(self.directory)
        if not run.ok:
            run.error = f"{run.error} (logs in {self.directory})"

    async def _main(self) -> None:
        assert self.servers.hub is not None
        hub = await ops.connect(self.servers.hub.url, "bench edge hub")
        clients = await self.servers.leaf_clients()
        sampler: asyncio.Task[None] | None = None
        try:
            groups = by_leaf(self.sources, self.run.leaves)
            await asyncio.gather(
                *(create_origins(nc, [s.names for s in group]) for nc, group in zip(clients, groups, strict=True))
            )
            await ops.create_aggregate(hub, native=False)
            await self._start_bridge(self.servers.hub.url)
            await self._idle()
            sampler = asyncio.create_task(self._sample_rss())
            half = self.run.seconds / 2
            routes = [(s.names.subject, s.leaf) for s in self.sources]
            self.run.phase1, self.run.cpu_us_per_msg, cores, main, wait = await self._produce(clients, routes, half)
            self.run.cores_replicating, self.run.main_cores_replicating = cores, main
            self.run.wait_cores_replicating = wait
            for nc in clients:
                await close_client(nc)
            clients = []
            links_ns = await self._storm()
            clients = await self.servers.leaf_clients()
            await self._probe(hub, clients, links_ns)
            self.run.phase2, self.run.cpu_us_per_msg_after, *_ = await self._produce(clients, routes, half)
            await self._drain(hub)
            await self._finish(hub)
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            self.run.rss_max_bytes = max(self.rss_samples, default=None)
            self._collect_log()
            for nc in (hub, *clients):
                await close_client(nc)

    async def _start_bridge(self, hub_url: str) -> None:
        run = self.run
        config = self.directory / "bridge.toml"
        config.write_text(edge_config(hub_url, self.sources))
        spawned_ns, spawned = time.time_ns(), time.monotonic()
        self.bridge = BridgeProcess(config, self.directory / "bridge.log").start()
        wanted = [s.names.source for s in self.sources]
        while len(self.log.ready_ns) < len(wanted):
            self.log.poll()
            self._alive()
            if time.monotonic() - spawned > STARTUP_DEADLINE:
                raise ops.BenchError(
                    f"{len(self.log.ready_ns)} of {len(wanted)} sources bound after {STARTUP_DEADLINE:g}s"
                )
            await asyncio.sleep(LOG_POLL)
        run.startup_bridge_cpu_s = cpu_seconds(self.pid)
        ready = sorted(self.log.ready_ns.values())
        run.startup_s = (ready[-1] - spawned_ns) / 1e9
        run.startup_first_s = (ready[0] - spawned_ns) / 1e9
        run.startup_median_s = (ready[len(ready) // 2] - spawned_ns) / 1e9
        confirm = time.monotonic()
        while unbound := unbound_sources(await asyncio.to_thread(self.bridge.readyz), wanted):
            self._alive()
            if time.monotonic() - confirm > READYZ_DEADLINE:
                raise ops.BenchError(f"/readyz: {len(unbound)} source(s) not owned and bound, e.g. {unbound[:3]}")
            await asyncio.sleep(LOG_POLL)
        run.startup_readyz_s = time.monotonic() - spawned
        run.modes = self.log.mode_counts()

    async def _idle(self) -> None:
        run, pid = self.run, self.pid
        servers, hub0 = self.servers, self.servers.cpu(hub_only=True)
        started, cpu0, servers0 = time.monotonic(), cpu_seconds(pid), servers.cpu()
        main0 = main_thread_cpu_seconds(pid)
        # an observation window: every source bound, nothing to replicate
        await asyncio.sleep(self.idle)
        elapsed = time.monotonic() - started
        run.idle_seconds = elapsed
        run.idle_cores = (cpu_seconds(pid) - cpu0) / elapsed
        run.idle_main_cores = (main_thread_cpu_seconds(pid) - main0) / elapsed
        run.idle_servers_cores = (servers.cpu() - servers0) / elapsed
        run.idle_hub_cores = (servers.cpu(hub_only=True) - hub0) / elapsed
        run.rss_idle_bytes = rss_bytes(pid)
        self._alive()

    async def _sample_rss(self) -> None:
        while True:
            with contextlib.suppress(OSError, AssertionError):
                self.rss_samples.append(rss_bytes(self.pid))
            await asyncio.sleep(SAMPLE_EVERY)

    async def _produce(
        self, clients: Sequence[Client], routes: Sequence[tuple[str, int]], seconds: float
    ) -> tuple[Production, float, float, float, float]:
        """A paced production; ``(what it did, bridge CPU us per message, bridge cores, the main thread's cores,
        cores waiting)``."""
        pid = self.pid
        wall0, cpu0, wait0 = time.monotonic(), cpu_seconds(pid), sched_seconds(pid)[1]
        main0 = main_thread_cpu_seconds(pid)
        production, counts = await asyncio.wait_for(
            produce(clients, routes, self.run.rate, seconds, self.run.size), seconds * 2 + 120.0
        )
        wall = time.monotonic() - wall0
        cpu, main = cpu_seconds(pid) - cpu0, main_thread_cpu_seconds(pid) - main0
        for i, n in counts.items():
            self.published[self.sources[i].names.source] += n
        self._alive()
        waiting = (sched_seconds(pid)[1] - wait0) / wall
        return production, cpu / production.sent * 1e6, cpu / wall, main / wall, waiting

    async def _storm(self) -> int:
        """SIGKILL every leaf at once, start them all ``down`` seconds later, wait for every link; returns the
        links' return (wall clock, ns)."""
        run = self.run
        self.log.poll()
        kill_ns = time.time_ns()
        self.log.mark_ns = kill_ns
        self.storm_cpu0 = cpu_seconds(self.pid)
        killed = time.monotonic()
        for leaf in self.servers.leaves:  # the signals first, all of them, then the reaping
            if leaf.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(leaf.pid, signal.SIGKILL)
        for leaf in self.servers.leaves:
            leaf.kill()
        await asyncio.sleep(max(0.0, self.down - (time.monotonic() - killed)))
        await asyncio.to_thread(self.servers.start_leaves)
        run.storm_down_s = time.monotonic() - killed
        links_ns = await asyncio.to_thread(self.servers.wait_linked)
        run.storm_links_s = (links_ns - kill_ns) / 1e9
        self.kill_ns, self.links_ns = kill_ns, links_ns
        self._alive()
        return links_ns

    async def _probe(self, hub: Client, clients: Sequence[Client], links_ns: int) -> None:
        """One probe per source; wait until every probe's copy is stored."""
        run = self.run
        await publish_once(clients, [(s.probe_subject, s.leaf) for s in self.sources], 60.0)
        run.probe_publish_s = (time.time_ns() - links_ns) / 1e9
        for s in self.sources:
            self.published[s.names.source] += 1
        wanted = {f"{s.names.prefix}.{s.probe_subject}" for s in self.sources}
        subjects_filter = f"{ops.AGGREGATE_SUBJECTS}.*.o.*.{PROBE}"
        while True:
            stored = await subject_counts(hub, subjects_filter)
            if wanted <= stored.keys():
                break
            self._alive()
            if time.time_ns() - links_ns > RECOVERY_DEADLINE * 1e9:
                left = sorted(wanted - stored.keys())
                raise ops.BenchError(
                    f"{len(left)} source(s) not replicating {RECOVERY_DEADLINE:g}s after the links' return, "
                    f"e.g. {left[:3]}"
                )
            await asyncio.sleep(POLL)
        run.recovery_wait_s = (time.time_ns() - links_ns) / 1e9
        run.storm_bridge_cpu_s = cpu_seconds(self.pid) - self.storm_cpu0

    async def _drain(self, hub: Client) -> None:
        run = self.run
        produced = time.monotonic()
        total = sum(self.published.values())
        await ops.wait_for_count(hub, total, deadline=DRAIN_DEADLINE, stall=STALL_SECONDS, alive=self._failure)
        run.drain_s = time.monotonic() - produced
        deadline = time.monotonic() + ORIGINS_EMPTY_DEADLINE
        while True:
            left = 0
            for leaf in self.servers.leaves:
                left += int((await asyncio.to_thread(leaf.monitor, "jsz")).get("messages", 0))
            run.origins_left = left
            if left == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(POLL)

    def _collect_log(self) -> None:
        """What the log says so far: warnings, and from the kill on, the storm's events and resets."""
        run = self.run
        self.log.poll()
        run.warnings = dict(sorted(self.log.warnings.items()))
        if self.log.mark_ns is None:
            return
        run.storm_events = {name: len(self.log.since_mark.get(name, [])) for name in (*STORM_EVENTS, *PUBLISH_EVENTS)}
        run.storm_event_times = {
            name: [(min(ts) - self.kill_ns) / 1e9, (max(ts) - self.kill_ns) / 1e9]
            for name, ts in self.log.since_mark.items()
            if ts
        }
        run.storm_resets = dict(sorted(self.log.resets_since_mark.items()))

    async def _finish(self, hub: Client) -> None:
        """``/readyz``, counters, SIGTERM, the storm's log lines, the aggregate read back and checked."""
        run = self.run
        assert self.bridge is not None
        readyz = await asyncio.to_thread(self.bridge.readyz)
        run.ready_at_end = None if readyz is None else readyz.get("ready") is True
        port = self.bridge.http_port()
        if port is not None:
            with contextlib.suppress(OSError):
                status, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics", 10.0)
                if status == 200:
                    run.counters = metric_sums(body.decode(errors="replace"), COUNTERS)
        with contextlib.suppress(OSError):
            run.rss_peak_bytes = peak_rss_bytes(self.pid)
        try:
            run.bridge_exit_code = await asyncio.to_thread(self.bridge.stop, BRIDGE_STOP_TIMEOUT)
        except TimeoutError as exc:
            run.bridge_exit_code = -9
            run.error = str(exc)
        self._collect_log()
        total = sum(self.published.values())
        held = (await ops.stream_state(hub, ops.AGGREGATE)).messages
        stored = await ops.read_stored(hub, 1, held, timeout=max(60.0, held / 2000))
        pairs: list[tuple[str, int]] = []
        probes: dict[str, int] = {}
        for copy in stored:
            source = copy.headers.get(headers.SOURCE, "?")
            pairs.append((source, int(copy.headers.get(headers.SEQ, "0"))))
            if copy.headers.get(headers.SUBJECT, "").endswith("." + PROBE):
                probes.setdefault(source, copy.store_ns)
        run.check = check_sequences(pairs, self.published)
        if run.check.expected != total:  # the published counts are the check's own: a sanity check of the bench
            raise ops.BenchError(f"published {total}, checked {run.check.expected}")
        run.recovery = recovery_times(probes, self.links_ns, [s.names.source for s in self.sources])


def measure(
    leaves: int,
    sources: int,
    rate: float,
    seconds: float,
    size: int,
    *,
    workdir: Path,
    binary: str,
    idle: float = DEFAULT_IDLE,
    down: float = DEFAULT_DOWN,
    leaf_nice: int = 0,
) -> EdgeRun:
    """One run on fresh servers in a directory below ``workdir``; a failed one carries its reason."""
    run = EdgeRun(leaves=leaves, sources=sources, rate=rate, seconds=seconds, size=size, leaf_nice=leaf_nice)
    directory = workdir / f"edge-{leaves}x{sources}-{time.strftime('%H%M%S')}"
    directory.mkdir(parents=True, exist_ok=True)
    _Run(run, directory, binary, idle, down).execute()
    return run


# Output (pure)


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / MB:.1f} MB"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def targets(run: EdgeRun) -> list[Target]:
    """Each figure of issue 25 next to its target (reported, not asserted)."""
    out: list[Target] = []
    n = run.sources
    load = f"{n} sources on {run.leaves} leaves"
    if run.startup_s is not None:
        scale = "" if n == TARGET_STARTUP_SOURCES else f" (target set for {TARGET_STARTUP_SOURCES:,} sources)"
        out.append(
            Target(
                f"start-up: spawn to all bound ({load})",
                f"<= {TARGET_STARTUP_S:g} s",
                f"{run.startup_s:.1f} s (first {_s(run.startup_first_s)}, half {_s(run.startup_median_s)}, "
                f"/readyz {_s(run.startup_readyz_s)}; bridge CPU {_s(run.startup_bridge_cpu_s)}){scale}",
                _verdict(run.startup_s <= TARGET_STARTUP_S),
            )
        )
    if run.idle_cores is not None:
        allowed = TARGET_IDLE_CORES_PER_1000 * n / 1000
        out.append(
            Target(
                "idle: bridge CPU (fraction of a core)",
                f"<= {TARGET_IDLE_CORES_PER_1000:g} per 1,000 sources ({allowed:.3f})",
                f"{run.idle_cores:.3f} ({run.idle_cores * 1000 / n:.3f} per 1,000 sources; the main thread "
                f"{run.idle_main_cores or 0:.3f}; servers "
                f"{run.idle_servers_cores or 0:.2f}, the hub {run.idle_hub_cores or 0:.2f} of them) over "
                f"{run.idle_seconds:.1f} s",
                _verdict(run.idle_cores <= allowed),
            )
        )
    if run.cpu_us_per_msg is not None and run.phase1 is not None:
        after = f"; after the storm {run.cpu_us_per_msg_after:.0f} us" if run.cpu_us_per_msg_after is not None else ""
        out.append(
            Target(
                f"bridge CPU per message at {run.rate:g} msg/s per source",
                f"<= {TARGET_CPU_US_PER_MSG:g} us",
                f"{run.cpu_us_per_msg:.0f} us at {run.phase1.achieved_rate:,.0f} msg/s in all "
                f"({run.cores_replicating or 0:.2f} cores, the main thread {run.main_cores_replicating or 0:.2f}, "
                f"waiting for a CPU {run.wait_cores_replicating or 0:.2f})"
                f"{after}",
                _verdict(run.cpu_us_per_msg <= TARGET_CPU_US_PER_MSG),
            )
        )
    rss = max((x for x in (run.rss_peak_bytes, run.rss_max_bytes, run.rss_idle_bytes) if x), default=None)
    if rss is not None:
        scale = "" if n == TARGET_RSS_SOURCES else f" (target set for {TARGET_RSS_SOURCES:,} sources)"
        out.append(
            Target(
                "bridge RSS",
                f"<= {TARGET_RSS_BYTES / MB:.0f} MB",
                f"idle {_mb(run.rss_idle_bytes)}, max sampled {_mb(run.rss_max_bytes)}, peak (VmHWM) "
                f"{_mb(run.rss_peak_bytes)}{scale}",
                _verdict(rss <= TARGET_RSS_BYTES),
            )
        )
    rec = run.recovery
    if rec.get("max_s") is not None or run.storm_links_s is not None:
        slowest = rec.get("max_s")
        measured = (
            f"slowest {slowest:.2f} s ({rec.get('slowest')}), median {rec.get('median_s', 0):.2f} s, "
            f"p90 {rec.get('p90_s', 0):.2f} s; {rec.get('replicated', 0)} of {rec.get('sources', n)} replicated; "
            f"links back {_s(run.storm_links_s)} after the kill, probes acked {run.probe_publish_s or 0:.2f} s after"
            if slowest is not None
            else f"not every source replicated again (links back {_s(run.storm_links_s)} after the kill)"
        )
        out.append(
            Target(
                "after the storm: every source replicating again, from the links' return",
                f"<= {TARGET_RECOVERY_S:g} s",
                measured,
                _verdict(slowest is not None and slowest <= TARGET_RECOVERY_S and not rec.get("missing")),
            )
        )
    if run.storm_events or run.storm_resets:
        events = ", ".join(f"{name} {run.storm_events.get(name, 0)}" for name in (*STORM_EVENTS, *PUBLISH_EVENTS))
        resets = ", ".join(f"{c} x{k}" for c, k in run.storm_resets.items()) or "none"
        cuts = run.counters.get("nats_bridge_publishes_limit_cuts")
        at_end = run.counters.get("nats_bridge_publishes_limit", 0)
        limit = "" if cuts is None else f"; publishes' limit cut {cuts:.0f} times, {at_end:.0f} at the end"
        out.append(
            Target("storm: log lines from the kill to the end", "-", f"{events}; resets: {resets}{limit}", "reported")
        )
    whole = {name: run.warnings.get(name, 0) for name in STORM_EVENTS}
    if any(whole.values()):  # a starved start of production costs leases before any kill: counted here
        out.append(
            Target(
                "the same log lines over the whole run",
                "-",
                ", ".join(f"{name} {count}" for name, count in whole.items()),
                "reported",
            )
        )
    if run.check is not None:
        left = "" if run.origins_left is None else f"; {run.origins_left} left in the origins"
        out.append(
            Target(
                "nothing lost, duplicated or reordered",
                "0 / 0 / 0",
                run.check.summary() + left,
                _verdict(run.check.ok),
            )
        )
    if run.bridge_exit_code is not None:
        out.append(Target("SIGTERM exit code", "0", str(run.bridge_exit_code), _verdict(run.bridge_exit_code == 0)))
    if not run.ok:
        out.append(Target("run", "ok", f"FAILED: {run.error}", "NOT met"))
    return out


def figures_row(label: str, run: EdgeRun) -> str:
    """One markdown row of the before/after table."""
    rec = run.recovery
    events = " / ".join(str(run.storm_events.get(name, 0)) for name in STORM_EVENTS) if run.storm_events else "-"
    rss = max((x for x in (run.rss_peak_bytes, run.rss_max_bytes) if x), default=None)
    cells = [
        label,
        f"{run.sources} / {run.leaves}",
        "-" if run.startup_s is None else f"{run.startup_s:.1f}",
        "-" if run.idle_cores is None else f"{run.idle_cores:.3f}",
        "-" if run.cpu_us_per_msg is None else f"{run.cpu_us_per_msg:.0f}",
        "-" if rss is None else f"{rss / MB:.0f}",
        "-" if rec.get("max_s") is None else f"{rec['max_s']:.2f} ({rec.get('median_s', 0):.2f})",
        events,
        "-" if run.check is None else ("ok" if run.check.ok else run.check.summary()),
        "ok" if run.ok else "FAILED",
    ]
    return "| " + " | ".join(cells) + " |"


FIGURES_HEADER = (
    "| run | sources / leaves | start-up s (target 15) | idle cores (0.05 per 1,000) | CPU us/msg (120) "
    "| peak RSS MB (150 at 2,000) | recovery s, slowest (median) (10) | lease.lost / source.fenced / "
    "lease.renew_failed / lease.suspended | aggregate | run |\n|---|---|---|---|---|---|---|---|---|---|"
)


# The command


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def parser(sub: Any) -> None:
    """Add the ``edge`` subcommand to ``python -m bench``."""
    p = sub.add_parser(
        "edge", help="the edge at scale: many leaves, many sources, one bridge beside the hub, a storm of leaf kills"
    )
    p.add_argument("--leaves", type=positive_int, help=f"leaf servers (default {DEFAULT_LEAVES}; quick {QUICK_LEAVES})")
    p.add_argument("--sources", type=positive_int, help=f"sources, spread over the leaves (default {DEFAULT_SOURCES})")
    p.add_argument("--rate", type=positive_float, help=f"msg/s per source (default {DEFAULT_RATE:g})")
    p.add_argument(
        "--seconds",
        type=positive_float,
        help=f"seconds of production, the storm halfway (default {DEFAULT_SECONDS:g})",
    )
    p.add_argument("--size", type=positive_int, default=DEFAULT_SIZE, help=f"payload bytes (default {DEFAULT_SIZE})")
    p.add_argument("--idle", type=positive_float, help=f"seconds of the idle window (default {DEFAULT_IDLE:g})")
    p.add_argument(
        "--down", type=float, default=DEFAULT_DOWN, help=f"seconds the leaves stay dead (default {DEFAULT_DOWN:g})"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke test: {QUICK_LEAVES} leaves, {QUICK_SOURCES} sources at {QUICK_RATE:g} msg/s for "
        f"{QUICK_SECONDS:g} s, the storm included",
    )
    p.add_argument("--label", default="", help="the run's name in the markdown row (e.g. before, after)")
    p.add_argument("--out", type=Path, help="the JSON file (default bench/results/edge-<UTC time>.json)")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (servers' and bridge's files)")
    p.add_argument(
        "--leaf-nice",
        type=int,
        choices=range(20),
        default=0,
        metavar="N",
        help="run the leaves at niceness N (0-19; default 0): they stand for other machines, and on a small machine "
        "twenty of them take the CPU from the bridge and the hub beside it",
    )


@dataclass(frozen=True, slots=True)
class EdgeOptions:
    leaves: int
    sources: int
    rate: float
    seconds: float
    idle: float
    down: float


def options(args: argparse.Namespace) -> EdgeOptions:
    """The run's sizes: what was given, else the quick or the full defaults."""
    quick: bool = args.quick
    return EdgeOptions(
        leaves=args.leaves if args.leaves is not None else (QUICK_LEAVES if quick else DEFAULT_LEAVES),
        sources=args.sources if args.sources is not None else (QUICK_SOURCES if quick else DEFAULT_SOURCES),
        rate=args.rate if args.rate is not None else (QUICK_RATE if quick else DEFAULT_RATE),
        seconds=args.seconds if args.seconds is not None else (QUICK_SECONDS if quick else DEFAULT_SECONDS),
        idle=args.idle if args.idle is not None else (QUICK_IDLE if quick else DEFAULT_IDLE),
        down=args.down,
    )


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    opts = options(args)
    if opts.leaves > 100 or opts.down < 0:
        print("edge: --leaves at most 100, --down >= 0", file=sys.stderr)
        return 2

    def measure_edge(session: Session) -> EdgeRun:
        return measure(
            opts.leaves,
            opts.sources,
            opts.rate,
            opts.seconds,
            args.size,
            workdir=session.workdir,
            binary=session.binary,
            idle=opts.idle,
            down=opts.down,
            leaf_nice=args.leaf_nice,
        )

    def report(session: Session, result: EdgeRun) -> Report:
        workdir, info, revision, version = session.workdir, session.info, session.revision, session.version
        if result.ok and not args.keep:
            kept = Path(result.directory) / "bridge.log"
            if any(result.storm_events.values()) and kept.exists():
                # the storm cost leases: the bridge's log says how, the servers' stores are not needed
                saved = workdir / "bridge.log"
                shutil.move(kept, saved)
                shutil.rmtree(result.directory, ignore_errors=True)
                print(f"the bridge's log, kept for its storm events: {saved}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        items = targets(result)
        verdict = "ok" if result.ok else "FAILED"
        print(f"\n[{session.elapsed:.0f}s] {opts.sources} sources on {opts.leaves} leaves, {verdict}")
        print(format_targets(items))
        header = (
            f"### Edge at scale, {session.started.date().isoformat()}: `{session.command}`\n\n"
            f"{info['nproc']} CPUs ({info['cpu_model']}), nats-server {version}, {revision_text(revision)}, load "
            f"average {info['loadavg_start']} at start, {info['loadavg_end']} at the end; {opts.leaves} leaves, "
            f"{opts.sources} sources x {opts.rate:g} msg/s x {opts.seconds:g} s ({args.size} B), every leaf SIGKILLed "
            f"halfway and restarted {opts.down:g} s later; the bridge beside the hub, defaults (leases on)"
            + (f"; the leaves at niceness {args.leaf_nice}." if args.leaf_nice else ".")
        )
        md = markdown(items, header)
        md += "\n" + FIGURES_HEADER + "\n" + figures_row(args.label or revision.get("commit", "?"), result) + "\n"
        fields = {
            "settings": {**dataclasses.asdict(opts), "size": args.size, "quick": args.quick},
            "bridge_config_example": edge_config("nats://HUB", layout(2, 2)),
            "run": result.as_dict(),
        }
        failure = "" if result.ok else f"\nthe run failed: {result.error}"
        return Report(md, fields, [t.as_dict() for t in items], failure)

    return run_command(
        "edge",
        args.out,
        measure_edge,
        report,
        workdir_holds="run",
        label=args.label,
        show_repo_root=True,
        record_elapsed=True,
    )
