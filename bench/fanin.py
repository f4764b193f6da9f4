"""``python -m bench fanin``: one bridge replicating many sources at a fixed rate each.

Each trial runs on a fresh hub + leaf (``bridge.testing.servers.start_topology``, JetStream domains ``hub`` and
``leaf``): ``N`` WorkQueue origin streams on the leaf (``ORIGIN_000`` ... capturing ``o.000.>`` ...), the aggregate
``AGG`` on the hub (a file Limits stream with ``allow_direct``, capturing ``edge.>``), and one bridge process in the
sidecar position: connected to the hub only, every source reaching its origin through domain ``leaf``, each with
its own durable (``nats-bridge-s000`` ...) and ``subject_prefix`` (``edge.s000`` ...); everything else is the
bridge's defaults (leases included). A trial measures, in order:

1. **start-up**: from spawning the bridge to the last source's first ``reset.done`` or ``consumer.resumed`` (a
   consumer at rest needs no RESET; ``resync.done`` in pull mode),
   read from the log's own timestamps; then ``/readyz`` must list every source as owned and bound;
2. **idle cost**: over a few seconds with nothing to replicate, the bridge's VmRSS and CPU, its connections on the
   hub (``/connz``, by client name) and its sockets (``/proc/<pid>/fd``), and the servers' RSS and CPU;
3. **replication**: one warm-up message per source, then a paced producer (pipelined publishes over a few
   connections to the leaf) sends ``--rate`` msg/s to every origin for ``--seconds``, each message stamped with its
   send time (``Bench-Sent``); meanwhile the bridge's VmRSS and every process's CPU are sampled, and each one's time
   spent runnable but waiting for a CPU is measured (``schedstat``). Once every copy is stored, the bridge's
   ``/readyz`` and ``/metrics`` are read, it is stopped with SIGTERM (it must exit 0) and every copy is read back
   from the aggregate: latency = the copy's store time minus its send stamp, p50 / p99 / max per source, overall,
   and per second of production. A trial that fails midway still reads back what was stored, for the latency
   before the failure.

The run is: a baseline trial (1 source, idle), the main trial (``--sources`` x ``--rate`` for ``--seconds``), and
with ``--search`` the largest source count the machine holds at 10 msg/s each (doubling from 200, then bisecting).
Figures are printed next to their targets (reported, not asserted), written as JSON (``--out``) and as a markdown
table to paste into bench/RESULTS.md. Every wait has a deadline; every process is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from bench import natsops as ops
from bench.common import Report, Session, execute_trial, run_command, sigterm_problem
from bench.procs import cpu_seconds, peak_rss_bytes, revision_text, rss_bytes
from bench.stats import ack_info, median, parse_rfc3339_ns, percentile
from bridge.testing.http import get
from bridge.testing.processes import BridgeProcess
from bridge.testing.servers import (
    READY_EVENTS,
    NatsServer,
    Topology,
    start_topology,
)

# The target 3, reported next to each figure (never asserted).
TARGET_P99_MS = 250.0
TARGET_RSS_BYTES = 300_000_000
TARGET_STARTUP_S = 30.0

DEFAULT_SOURCES = 200
DEFAULT_RATE = 100.0
DEFAULT_SECONDS = 30.0
DEFAULT_SIZE = 256
QUICK_SOURCES = 10
QUICK_RATE = 20.0
QUICK_SECONDS = 3.0
SEARCH_RATE = 10.0
SEARCH_START = 200
DEFAULT_MAX_SEARCH = 6400
DEFAULT_SEARCH_SECONDS = 20.0
DEFAULT_SEARCH_RSS_BYTES = 1_000_000_000
SEARCH_RESOLUTION = 0.1  # the search stops once the bracket is within 10% of its upper end
DEFAULT_PRODUCERS = 2
# The producer counts as keeping up at this fraction of the planned rate: below it the trial's latency is not a
# figure at the asked load, and a search step that falls short is reported as bound by the producer.
MIN_RATE_FRACTION = 0.95

MAX_FILE_STORE = "64GB"  # a limit, not an allocation
IDLE_SECONDS = 3.0  # the observation window for the idle figures (an observation, not a wait)
DEFAULT_STARTUP_DEADLINE = 180.0  # past it the trial fails; the target (30 s) is judged on the figure
WARM_UP_DEADLINE = 60.0
READY = (*READY_EVENTS, "resync.done")  # a source's consumer positioned: a RESET, none needed, a pull resync
READYZ_DEADLINE = 60.0  # after the log says every source is bound, /readyz must agree within this
STALL_SECONDS = 30.0  # no new copy for this long fails a trial (the bridge resets a silent consumer in 5 s)
BRIDGE_STOP_TIMEOUT = 60.0  # every source drains at once on SIGTERM (engine.shutdown_grace is 10 s)
CREATE_CONCURRENCY = 64  # stream creates in flight at once: enough to hide the round trip, few enough to queue
PRODUCER_WINDOW = 4096  # unacknowledged publishes per producer connection
PACE_TICK = 0.002  # the producer's wake-up period when nothing is due: messages leave in bursts of ~2 ms
LOG_POLL = 0.2
SAMPLE_EVERY = 0.5
READ_BATCH = 10_000
MB = 1_000_000
COUNTERS = (
    "nats_bridge_deliveries",
    "nats_bridge_flow_control_requests",
    "nats_bridge_flow_control_answers",
    "nats_bridge_replicated_messages",
    "nats_bridge_flow_control_answer_latency_seconds_sum",
    "nats_bridge_flow_control_answer_latency_seconds_count",
)


# Names and configuration (pure)


@dataclass(frozen=True, slots=True)
class SourceNames:
    """One source's names: the bridge's source, the leaf's origin stream, the subject produced to, the prefix its
    copies carry in the aggregate."""

    source: str
    stream: str
    subject: str
    prefix: str


def source_names(count: int, min_width: int = 3) -> list[SourceNames]:
    """Names for sources ``0 .. count-1``, zero-padded to at least ``min_width`` digits so they sort in order."""
    if count < 1:
        raise ValueError(f"need at least one source, got {count}")
    width = max(min_width, len(str(count - 1)))
    out = []
    for i in range(count):
        tag = f"{i:0{width}d}"
        out.append(SourceNames(f"s{tag}", f"ORIGIN_{tag}", f"o.{tag}.m", f"{ops.AGGREGATE_SUBJECTS}.s{tag}"))
    return out


def source_of_subject(subject: str) -> str:
    """The source a copy belongs to, from its aggregate subject (``edge.s007.o.007.m`` -> ``s007``)."""
    parts = subject.split(".", 2)
    if len(parts) < 3 or parts[0] != ops.AGGREGATE_SUBJECTS:
        raise ValueError(f"not a fan-in copy's subject: {subject!r}")
    return parts[1]


def fanin_config(
    hub_url: str,
    sources: Sequence[SourceNames],
    *,
    mode: str = "auto",
    bucket: str | None = None,
    leases: bool = True,
    max_ack_pending: int | None = None,
) -> str:
    """The bridge's configuration: defaults everywhere except names, addresses, each source's ``mode`` and
    ``subject_prefix``, JSON logs, an HTTP listener on a free port, and (``bucket``) the lease bucket's name;
    ``leases=False`` turns coordination off (a diagnostic: the data path without the lease traffic), and
    ``max_ack_pending`` replaces the sources' default (1000)."""
    lines = [
        "# written by `python -m bench fanin`",
        "[log]",
        'level = "info"',
        'format = "json"',
        "",
        "[http]",
        'listen = "127.0.0.1:0"',
        "",
    ]
    if not leases:
        lines += ["[coordination]", "enabled = false", ""]
    elif bucket is not None:
        lines += ["[coordination]", f"bucket = {json.dumps(bucket)}", ""]
    lines += ["[target]", f"servers = [{json.dumps(hub_url)}]", f"stream = {json.dumps(ops.AGGREGATE)}"]
    for names in sources:
        lines += [
            "",
            "[[sources]]",
            f"name = {json.dumps(names.source)}",
            f"servers = [{json.dumps(hub_url)}]",
            'domain = "leaf"',
            f"stream = {json.dumps(names.stream)}",
            f"mode = {json.dumps(mode)}",
            f"subject_prefix = {json.dumps(names.prefix)}",
        ]
        if max_ack_pending is not None:
            lines.append(f"max_ack_pending = {max_ack_pending}")
    return "\n".join(lines) + "\n"


def origin_config(names: SourceNames) -> dict[str, Any]:
    """An origin stream on the leaf: file storage, WorkQueue, capturing ``o.<i>.>``."""
    return {
        "name": names.stream,
        "subjects": [names.subject.rsplit(".", 1)[0] + ".>"],
        "retention": "workqueue",
        "storage": "file",
        "num_replicas": 1,
        "allow_direct": True,
    }


# Reading results (pure)


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Percentiles of one set of latencies, in milliseconds."""

    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, float | int]:
        return {"count": self.count, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "max_ms": self.max_ms}


def latency_stats(values: Sequence[float]) -> LatencyStats:
    """p50 / p99 / max of ``values`` (ms).

    Raises:
        ValueError: ``values`` is empty.
    """
    return LatencyStats(len(values), percentile(values, 50), percentile(values, 99), max(values))


def worst_source(per_source: Mapping[str, LatencyStats]) -> tuple[str, LatencyStats] | None:
    """The source with the highest p99 (ties: the first name), None when there is none."""
    if not per_source:
        return None
    name = max(sorted(per_source), key=lambda n: per_source[n].p99_ms)
    return name, per_source[name]


def timeline(by_second: Mapping[int, Sequence[float]]) -> list[dict[str, float]]:
    """Per second of production (by send time), the copies' count and latency p50 / p99 / max: a latency that
    grows second after second is a queue building up (something cannot keep up), a flat one is the path's own."""
    out = []
    for second in sorted(by_second):
        stats = latency_stats(by_second[second])
        out.append(
            {
                "second": second,
                "count": stats.count,
                "p50_ms": stats.p50_ms,
                "p99_ms": stats.p99_ms,
                "max_ms": stats.max_ms,
            }
        )
    return out


def format_timeline(rows: Sequence[Mapping[str, float]]) -> str:
    """``p50/p99`` per second, compact, for a progress line."""
    return " ".join(f"{row['p50_ms']:.0f}/{row['p99_ms']:.0f}" for row in rows)


def cpu_timeline(
    samples: Sequence[tuple[float, Sequence[float]]], start: float, names: Sequence[str]
) -> list[dict[str, float]]:
    """Cores each process used, per whole second since ``start``, from ``(time, [CPU seconds...])`` samples in the
    order of ``names``: each interval between two samples counts in the second it ends in."""
    spent: dict[int, list[float]] = {}
    for (t0, cpu0), (t1, cpu1) in itertools.pairwise(samples):
        bucket = spent.setdefault(int(t1 - start), [0.0] * (len(names) + 1))
        bucket[0] += t1 - t0
        for i, (a, b) in enumerate(zip(cpu0, cpu1, strict=True)):
            bucket[i + 1] += b - a
    out = []
    for second in sorted(spent):
        wall, *cpu = spent[second]
        if wall > 0:
            out.append({"second": float(second), **{n: c / wall for n, c in zip(names, cpu, strict=True)}})
    return out


def unbound_sources(readyz: Mapping[str, Any] | None, names: Sequence[str]) -> list[str]:
    """The sources ``/readyz`` does not list as owned by this process with their consumer bound (all of them when
    there is no answer)."""
    if readyz is None:
        return list(names)
    sources = readyz.get("sources") or {}
    out = []
    for name in names:
        entry = sources.get(name) or {}
        if entry.get("role") != "owner" or entry.get("consumer_bound") is not True:
            out.append(name)
    return out


def troubled_sources(readyz: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """From a ``/readyz`` body: the sources stalled, blocked (with why) and not ready."""
    sources: Mapping[str, Any] = (readyz or {}).get("sources") or {}
    stalled = sorted(n for n, s in sources.items() if s.get("stalled"))
    blocked = sorted(f"{n}: {s.get('blocked')}" for n, s in sources.items() if s.get("blocked"))
    not_ready = sorted(n for n, s in sources.items() if not s.get("ready"))
    return {"stalled": stalled, "blocked": blocked, "not_ready": not_ready}


def metric_sums(text: str, names: Sequence[str]) -> dict[str, float]:
    """Each named metric of a Prometheus text exposition summed over its labels (counters may carry ``_total``)."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip().removesuffix("_total")
        if name in out:
            with contextlib.suppress(ValueError):
                out[name] += float(value)
    return out


def bridge_connections(connz: Mapping[str, Any]) -> int:
    """How many of a ``/connz`` answer's client connections are the bridge's (nats-py clients it names
    ``nats-bridge ...``)."""
    return sum(1 for c in connz.get("connections") or [] if str(c.get("name", "")).startswith("nats-bridge"))


def per_unit(total_n: float | None, total_1: float | None, n: int) -> float | None:
    """The cost of one more source: ``(total_n - total_1) / (n - 1)``; None without both figures or with n < 2."""
    if total_n is None or total_1 is None or n < 2:
        return None
    return (total_n - total_1) / (n - 1)


def next_count(
    results: Mapping[int, bool], start: int, maximum: int, resolution: float = SEARCH_RESOLUTION
) -> int | None:
    """The next source count the search tries, None once it is done.

    ``results`` maps each count tried to whether the machine held it. Doubling from ``start`` (capped at
    ``maximum``) until a count fails, then bisecting between the largest count that held and the smallest that did
    not above it, until their gap is within ``resolution`` of the upper one (or 1).
    """
    if not results:
        return min(start, maximum)
    held = [n for n, ok in results.items() if ok]
    low = max(held, default=0)
    above = [n for n, ok in results.items() if not ok and n > low]
    if not above:
        if low >= maximum:
            return None
        return min(low * 2, maximum)
    high = min(above)
    if high - low <= max(1.0, resolution * high):
        return None
    middle = (low + high) // 2
    if middle - low >= 40:  # round figures read better, and a few sources either way change nothing
        middle = middle // 10 * 10
    return middle if low < middle < high else None


def search_outcome(results: Mapping[int, bool]) -> tuple[int, int | None]:
    """``(largest count that held, smallest count above it that did not)``; 0 when none held, None when none
    above it failed."""
    low = max((n for n, ok in results.items() if ok), default=0)
    above = [n for n, ok in results.items() if not ok and n > low]
    return low, min(above, default=None)


# One trial's figures


@dataclass(slots=True)
class Production:
    """What the paced producer did."""

    planned: int = 0
    planned_rate: float = 0.0
    sent: int = 0
    seconds: float = 0.0  # first send to last send
    achieved_rate: float = 0.0
    late_p50_ms: float = 0.0  # how far behind its schedule a message left
    late_p99_ms: float = 0.0
    late_max_ms: float = 0.0
    cpu_s: float = 0.0  # this process's CPU over the production
    connections: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class FaninRun:
    """One trial: ``sources`` sources, each produced to at ``rate`` msg/s for ``seconds`` (0: idle only)."""

    role: str  # "baseline", "main" or "search"
    sources: int
    rate: float
    seconds: float
    size: int
    label: str = ""
    ok: bool = False
    error: str | None = None
    startup_s: float | None = None  # spawn -> the last source's first READY event (log timestamps)
    startup_first_s: float | None = None  # spawn -> the first source's
    startup_median_s: float | None = None  # spawn -> half of them
    startup_readyz_s: float | None = None  # spawn -> /readyz listing every source owned and bound (polled)
    startup_bridge_cpu_s: float | None = None  # the bridge's CPU from spawn to every source bound
    startup_servers_cpu_s: float | None = None  # hub + leaf over the same span
    modes: dict[str, int] = field(default_factory=dict)  # the mode sources ran in (source.mode events), counted
    hub_bridge_connections: int | None = None  # the bridge's client connections on the hub (/connz, by name)
    hub_connections: int | None = None  # all client connections on the hub
    bridge_sockets: int | None = None  # sockets among /proc/<pid>/fd (connections and the HTTP listener)
    bridge_threads: int | None = None
    rss_idle_bytes: int | None = None  # VmRSS at the end of the idle window, every source bound
    cpu_idle_cores: float | None = None  # the bridge's CPU over the idle window / its length
    hub_idle_cores: float | None = None
    leaf_idle_cores: float | None = None
    hub_rss_idle_bytes: int | None = None
    leaf_rss_idle_bytes: int | None = None
    production: Production | None = None
    rss_steady_median_bytes: int | None = None  # VmRSS samples over the second half of the production
    rss_steady_max_bytes: int | None = None  # the largest VmRSS sample, production and drain alike
    rss_peak_bytes: int | None = None  # VmHWM before SIGTERM
    bridge_cpu_s_per_million: float | None = None  # production start -> every copy stored, per message
    bridge_cores: float | None = None  # the same CPU over the same wall time
    hub_cores: float | None = None
    leaf_cores: float | None = None
    producer_cores: float | None = None
    # over the same window, the cores' worth of time each process spent runnable but waiting for a CPU
    bridge_wait_cores: float | None = None
    hub_wait_cores: float | None = None
    leaf_wait_cores: float | None = None
    producer_wait_cores: float | None = None
    drain_s: float | None = None  # last send -> the poll that saw every copy stored
    partial: bool = False  # the latencies are those of the copies stored before the trial failed
    cpu_timeline: list[dict[str, float]] = field(default_factory=list)  # cores per second of production
    bridge_cores_max_1s: float | None = None  # the bridge's busiest second (1.0: its event loop saturated)
    # the bridge's own counters (/metrics) at the end, summed over sources: how many flow-control requests the
    # origins sent per message delivered is what a message costs beyond its delivery and its publish
    counters: dict[str, float] = field(default_factory=dict)
    expected: int = 0  # stamped copies expected
    read_back: int = 0  # stamped copies read back
    missing: int = 0
    duplicates: int = 0
    latency: LatencyStats | None = None  # every stamped copy
    latency_from_origin: LatencyStats | None = None  # store time minus Bridge-Time (the origin's store time)
    worst_source: str | None = None
    worst_p99_ms: float | None = None
    sources_over_target: int = 0  # sources whose p99 exceeds TARGET_P99_MS
    per_source: dict[str, LatencyStats] = field(default_factory=dict)
    timeline: list[dict[str, float]] = field(default_factory=list)  # per second of production: latency by send time
    troubled: dict[str, list[str]] = field(default_factory=dict)  # stalled / blocked / not ready at the end
    ready_at_end: bool | None = None  # /readyz's own verdict after the last copy (leases included)
    unplanned_resets: dict[str, int] = field(default_factory=dict)  # resets by cause, other than the start's
    warnings: dict[str, int] = field(default_factory=dict)  # warning/error log events by name
    bridge_exit_code: int | None = None
    loadavg: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, LatencyStats | Production):
                value = value.as_dict()
            elif f.name == "per_source":
                value = {name: stats.as_dict() for name, stats in value.items()}
            out[f.name] = value
        return out

    @property
    def producer_kept_up(self) -> bool:
        p = self.production
        return p is not None and p.planned_rate > 0 and p.achieved_rate >= MIN_RATE_FRACTION * p.planned_rate


def holds(run: FaninRun, *, rss_limit: int, startup_limit: float = TARGET_STARTUP_S) -> list[str]:
    """Why the machine did not hold ``run``'s load (empty: it held): the trial failed, start-up took too long, a
    source's p99 is over the target, a source stalled or was blocked, or the RSS went over ``rss_limit``. A
    producer that could not keep up makes the trial say nothing about the bridge, and is named as such."""
    reasons = []
    if not run.ok:
        reasons.append(f"failed: {run.error}")
    if run.startup_s is not None and run.startup_s >= startup_limit:
        reasons.append(f"start-up {run.startup_s:.1f} s >= {startup_limit:g} s")
    if run.production is not None and not run.producer_kept_up:
        p = run.production
        reasons.append(f"producer: {p.achieved_rate:,.0f} of {p.planned_rate:,.0f} msg/s")
    if run.worst_p99_ms is not None and run.worst_p99_ms >= TARGET_P99_MS:
        reasons.append(
            f"p99 {run.worst_p99_ms:.0f} ms >= {TARGET_P99_MS:g} ms ({run.worst_source}; "
            f"{run.sources_over_target} source(s) over)"
        )
    for kind in ("stalled", "blocked"):
        if run.troubled.get(kind):
            reasons.append(f"{len(run.troubled[kind])} source(s) {kind}")
    if run.ready_at_end is False:
        reasons.append("/readyz not ready after the last copy")
    if run.warnings.get("lease.lost"):
        reasons.append(f"{run.warnings['lease.lost']} lease(s) lost (sources fenced and restarted)")
    peak = max((x for x in (run.rss_peak_bytes, run.rss_steady_max_bytes, run.rss_idle_bytes) if x), default=None)
    if peak is not None and peak >= rss_limit:
        reasons.append(f"RSS {peak / MB:.0f} MB >= {rss_limit / MB:.0f} MB")
    return reasons


# The bridge's log, read as it grows


class BridgeLog:
    """Follows the bridge's JSON log: when each source was first bound, the modes, warnings and resets."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.ready_ns: dict[str, int] = {}  # source -> log timestamp of its first READY event
        self.modes: dict[str, str] = {}
        self.warnings: dict[str, int] = {}
        self.resets: dict[str, int] = {}  # by cause, every reset.requested / resync.requested

    def poll(self) -> None:
        """Read what was appended since the last call."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if isinstance(event, dict):
                        self.feed(event)

    def feed(self, event: Mapping[str, Any]) -> None:
        """Take one log event into account."""
        name = str(event.get("event", ""))
        source = event.get("source")
        if name in READY and isinstance(source, str) and source not in self.ready_ns:
            try:
                self.ready_ns[source] = parse_rfc3339_ns(str(event.get("timestamp", "")))
            except ValueError:
                self.ready_ns[source] = time.time_ns()
        elif name == "source.mode" and isinstance(source, str):
            self.modes[source] = str(event.get("mode", ""))
        elif name in ("reset.requested", "resync.requested"):
            cause = str(event.get("cause", "?"))
            self.resets[cause] = self.resets.get(cause, 0) + 1
        if event.get("level") in ("warning", "error"):
            self.warnings[name] = self.warnings.get(name, 0) + 1

    def unplanned_resets(self) -> dict[str, int]:
        """Resets for any cause but the start's (one per source, expected)."""
        return {cause: n for cause, n in sorted(self.resets.items()) if cause != "start"}

    def mode_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for mode in self.modes.values():
            out[mode] = out.get(mode, 0) + 1
        return out


# NATS work


async def create_origins(leaf: Client, sources: Sequence[SourceNames]) -> None:
    """Create every origin stream on the leaf, a bounded number of requests in flight."""
    for i in range(0, len(sources), CREATE_CONCURRENCY):
        chunk = sources[i : i + CREATE_CONCURRENCY]
        await asyncio.gather(
            *(ops.api(leaf, f"$JS.API.STREAM.CREATE.{n.stream}", origin_config(n), timeout=30.0) for n in chunk)
        )


async def produce(
    url: str, subjects: Sequence[str], rate: float, seconds: float, size: int, connections: int
) -> Production:
    """Publish ``rate`` msg/s to each of ``subjects`` for ``seconds``, stamped with :data:`ops.SENT_HEADER`.

    The subjects are served round robin, so the sum is one even stream of ``rate * len(subjects)`` msg/s: message
    ``m`` is due at ``start + m / total_rate`` and each wake-up sends every message due by then. Sources are spread
    over ``connections`` connections (a source always on the same one, so its order is kept), each publishing with
    pipelined acks (:class:`bench.natsops.Publisher`). Returns once every publish is acknowledged.

    Raises:
        BenchError: publishes not acknowledged within a minute, or refused.
    """
    n = len(subjects)
    per_source = max(1, round(rate * seconds))
    total = per_source * n
    total_rate = rate * n
    payload = os.urandom(size)
    result = Production(planned=total, planned_rate=total_rate, connections=connections)
    late: list[float] = []
    async with contextlib.AsyncExitStack() as stack:
        pubs = []
        for c in range(connections):
            nc = await ops.connect(url, f"bench fanin producer {c}")
            stack.push_async_callback(_close, nc)
            pubs.append(await stack.enter_async_context(ops.Publisher(nc, window=PRODUCER_WINDOW)))
        routes = [(subjects[k], pubs[k % connections]) for k in range(n)]
        loop = asyncio.get_running_loop()
        cpu0 = time.process_time()
        start = loop.time()
        last = start
        m = 0
        while m < total:
            due = min(total, int((loop.time() - start) * total_rate) + 1)
            if due <= m:
                await asyncio.sleep(PACE_TICK)
                continue
            while m < due:
                subject, pub = routes[m % n]
                await pub.publish(subject, payload, {ops.SENT_HEADER: str(time.time_ns())})
                last = loop.time()
                late.append(last - start - m / total_rate)
                m += 1
            await asyncio.sleep(0)  # let the acks in, even when behind schedule
        for pub in pubs:
            await pub.drain(60.0)
        result.cpu_s = time.process_time() - cpu0
    result.sent = total
    result.seconds = last - start
    result.achieved_rate = total / (result.seconds + 1 / total_rate)
    result.late_p50_ms = percentile(late, 50) * 1e3
    result.late_p99_ms = percentile(late, 99) * 1e3
    result.late_max_ms = max(late) * 1e3
    return result


async def _close(nc: Client) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), 5)


@dataclass(frozen=True, slots=True)
class Copy:
    """One aggregate copy as the latency needs it."""

    source: str
    store_ns: int
    sent_ns: int | None  # Bench-Sent: when the producer sent the original (None: a warm-up message)
    origin_ns: int | None  # Bridge-Time: the origin's store time of the original


async def read_copies(hub: Client, count: int, timeout: float) -> list[Copy]:
    """Read ``count`` aggregate messages from the first on (subject, headers and store time only) through an
    ephemeral ``ack_policy: none`` pull consumer, in large batches.

    Raises:
        BenchError: fewer came back within ``timeout`` seconds.
    """
    created = await ops.api(
        hub,
        f"$JS.API.CONSUMER.CREATE.{ops.AGGREGATE}",
        {
            "stream_name": ops.AGGREGATE,
            "config": {
                "deliver_policy": "all",
                "ack_policy": "none",
                "headers_only": True,
                "inactive_threshold": 60 * 1_000_000_000,
                "mem_storage": True,
            },
        },
    )
    name = created["name"]
    out: list[Copy] = []
    want = 0
    arrived = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        if not msg.reply.startswith("$JS.ACK."):
            arrived.set()  # a status (408 request expired): this pull request is over
            return
        _, store_ns = ack_info(msg.reply)
        headers = msg.headers or {}
        sent = headers.get(ops.SENT_HEADER)
        origin = headers.get("Bridge-Time")
        out.append(
            Copy(
                source_of_subject(msg.subject),
                store_ns,
                int(sent) if sent else None,
                int(origin) if origin else None,
            )
        )
        if len(out) >= want:
            arrived.set()

    inbox = hub.new_inbox()
    sub = await hub.subscribe(inbox, cb=on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
    deadline = time.monotonic() + timeout
    try:
        while len(out) < count:
            batch = min(READ_BATCH, count - len(out))
            want = len(out) + batch
            arrived.clear()
            request = {"batch": batch, "expires": 5_000_000_000}
            await hub.publish(f"$JS.API.CONSUMER.MSG.NEXT.{ops.AGGREGATE}.{name}", json.dumps(request).encode(), inbox)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ops.BenchError(f"read back {len(out)} of {count} aggregate messages in {timeout:g}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), min(remaining, 10.0))
    finally:
        await sub.unsubscribe()
    return out


# One trial


@dataclass(frozen=True, slots=True)
class Settings:
    """What every trial shares."""

    workdir: Path
    keep: bool
    binary: str
    size: int
    mode: str
    producers: int
    startup_deadline: float
    leases: bool = True
    max_ack_pending: int | None = None  # None: the bridge's default


def _sockets(pid: int) -> int:
    count = 0
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(entry).startswith("socket:"):
                count += 1
    return count


def sched_seconds(pid: int) -> tuple[float, float]:
    """``(running, waiting)``: seconds the process's threads have spent on a CPU, and runnable but waiting for one
    (``/proc/<pid>/task/*/schedstat``). Waiting that grows as fast as running means the process wanted more CPU than
    the machine gave it."""
    run_ns = wait_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (task / "schedstat").read_text().split()
            run_ns += int(fields[0])
            wait_ns += int(fields[1])
    return run_ns / 1e9, wait_ns / 1e9


def _threads(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/task").iterdir())


class _Trial:
    """One trial's servers, bridge and figures."""

    def __init__(self, settings: Settings, run: FaninRun) -> None:
        self.settings = settings
        self.run = run
        self.directory = settings.workdir / run.label
        self.names = source_names(run.sources)
        self.topology: Topology | None = None
        self.bridge: BridgeProcess | None = None
        self.log = BridgeLog(self.directory / "bridge.log")

    # -- helpers -------------------------------------------------------------------------------------------

    @property
    def servers(self) -> tuple[NatsServer, NatsServer]:
        assert self.topology is not None
        return self.topology.servers

    @property
    def pid(self) -> int:
        assert self.bridge is not None and self.bridge.pid is not None
        return self.bridge.pid

    def _server_cpu(self) -> tuple[float, float]:
        hub, leaf = self.servers
        assert hub.pid is not None and leaf.pid is not None
        return cpu_seconds(hub.pid), cpu_seconds(leaf.pid)

    def _pids(self) -> list[int]:
        """The bridge's, the hub's, the leaf's and this process's (the producer's) PIDs."""
        hub, leaf = self.servers
        assert hub.pid is not None and leaf.pid is not None
        return [self.pid, hub.pid, leaf.pid, os.getpid()]

    def _failure(self) -> str | None:
        if self.bridge is None or self.bridge.is_running:
            return None
        return f"bridge exited early; log tail:\n{self.bridge.tail(15)}"

    async def _counters(self) -> dict[str, float]:
        assert self.bridge is not None
        port = self.bridge.http_port()
        if port is None:
            return {}
        try:
            status, body = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics", 10.0)
        except OSError:
            return {}
        return metric_sums(body.decode(errors="replace"), COUNTERS) if status == 200 else {}

    async def _readyz(self) -> dict[str, Any] | None:
        assert self.bridge is not None
        return await asyncio.to_thread(self.bridge.readyz)

    # -- the steps -----------------------------------------------------------------------------------------

    def execute(self) -> None:
        """Start the servers, run the trial, tear everything down; failures land in ``run.error``."""
        run = self.run

        def start() -> None:
            self.topology = start_topology(
                self.directory / "servers", binary=self.settings.binary, max_file_store=MAX_FILE_STORE
            )

        def stop() -> None:
            if self.topology is not None:
                self.topology.stop()

        def cleanup() -> None:
            if self.bridge is not None:
                self.bridge.cleanup()

        def verdict() -> str | None:
            return sigterm_problem(run.bridge_exit_code)

        execute_trial(run, self._main, start=start, stop=stop, cleanup=cleanup, verdict=verdict)
        if run.ok and not self.settings.keep:
            shutil.rmtree(self.directory, ignore_errors=True)
        elif not run.ok:
            run.error = f"{run.error} (logs in {self.directory})"

    async def _main(self) -> None:
        hub_url, leaf_url = self.servers[0].url, self.servers[1].url
        leaf = await ops.connect(leaf_url, "bench fanin leaf")
        hub = await ops.connect(hub_url, "bench fanin hub")
        try:
            await create_origins(leaf, self.names)
            await ops.create_aggregate(hub, native=False)
            await self._start_bridge(hub_url)
            await self._idle()
            if self.run.seconds > 0:
                await self._replicate(leaf, hub, leaf_url)
            else:
                await self._stop_bridge()
        finally:
            # also when the bridge died: what it logged until then says why
            self.log.poll()
            self.run.warnings = dict(sorted(self.log.warnings.items()))
            self.run.unplanned_resets = self.log.unplanned_resets()
            for nc in (leaf, hub):
                await _close(nc)

    async def _start_bridge(self, hub_url: str) -> None:
        run, names = self.run, self.names
        config = self.directory / "bridge.toml"
        config.write_text(
            fanin_config(
                hub_url,
                names,
                mode=self.settings.mode,
                leases=self.settings.leases,
                max_ack_pending=self.settings.max_ack_pending,
            )
        )
        cpu_servers0 = sum(self._server_cpu())
        spawned_ns, spawned = time.time_ns(), time.monotonic()
        self.bridge = BridgeProcess(config, self.directory / "bridge.log").start()
        wanted = [n.source for n in names]
        while True:
            self.log.poll()
            if len(self.log.ready_ns) >= len(wanted):
                break
            if (reason := self._failure()) is not None:
                raise ops.BenchError(reason)
            if time.monotonic() - spawned > self.settings.startup_deadline:
                raise ops.BenchError(
                    f"{len(self.log.ready_ns)} of {len(wanted)} sources bound after {self.settings.startup_deadline:g}s"
                )
            await asyncio.sleep(LOG_POLL)
        run.startup_bridge_cpu_s = cpu_seconds(self.pid)
        run.startup_servers_cpu_s = sum(self._server_cpu()) - cpu_servers0
        ready = sorted(self.log.ready_ns.values())
        run.startup_s = (ready[-1] - spawned_ns) / 1e9
        run.startup_first_s = (ready[0] - spawned_ns) / 1e9
        run.startup_median_s = (ready[len(ready) // 2] - spawned_ns) / 1e9
        # the log says each source reset once; /readyz is what an operator (or orchestrator) goes by
        confirm = time.monotonic()
        while unbound := unbound_sources(await self._readyz(), wanted):
            if (reason := self._failure()) is not None:
                raise ops.BenchError(reason)
            if time.monotonic() - confirm > READYZ_DEADLINE:
                raise ops.BenchError(f"/readyz: {len(unbound)} source(s) not owned and bound, e.g. {unbound[:3]}")
            await asyncio.sleep(LOG_POLL)
        run.startup_readyz_s = time.monotonic() - spawned
        run.modes = self.log.mode_counts()

    async def _idle(self) -> None:
        run, pid = self.run, self.pid
        started, cpu0, (hub0, leaf0) = time.monotonic(), cpu_seconds(pid), self._server_cpu()
        # an observation window: the bridge has nothing to do, what it holds and spends now is its idle cost
        await asyncio.sleep(IDLE_SECONDS)
        elapsed = time.monotonic() - started
        hub1, leaf1 = self._server_cpu()
        run.cpu_idle_cores = (cpu_seconds(pid) - cpu0) / elapsed
        run.hub_idle_cores, run.leaf_idle_cores = (hub1 - hub0) / elapsed, (leaf1 - leaf0) / elapsed
        run.rss_idle_bytes = rss_bytes(pid)
        hub, leaf = self.servers
        assert hub.pid is not None and leaf.pid is not None
        run.hub_rss_idle_bytes, run.leaf_rss_idle_bytes = rss_bytes(hub.pid), rss_bytes(leaf.pid)
        run.bridge_sockets, run.bridge_threads = _sockets(pid), _threads(pid)
        status, body = await asyncio.to_thread(get, f"{hub.monitor_url}/connz?limit=1000000", 10.0)
        if status == 200:
            connz = json.loads(body)
            run.hub_bridge_connections = bridge_connections(connz)
            run.hub_connections = int(connz.get("num_connections", 0))

    async def _replicate(self, leaf: Client, hub: Client, leaf_url: str) -> None:
        run, names, pid = self.run, self.names, self.pid
        # warm-up: every source carries one message before the clock starts
        await asyncio.wait_for(self._warm_up(leaf), WARM_UP_DEADLINE)
        warm = len(names)
        await ops.wait_for_count(hub, warm, deadline=max(60.0, warm / 50), stall=STALL_SECONDS, alive=self._failure)
        samples: list[tuple[float, int]] = []
        cpu_samples: list[tuple[float, list[float]]] = []
        stop_sampling = asyncio.Event()
        pids = self._pids()

        async def sample() -> None:
            while not stop_sampling.is_set():
                with contextlib.suppress(OSError):
                    now = time.monotonic()
                    samples.append((now, rss_bytes(pid)))
                    cpu_samples.append((now, [cpu_seconds(p) for p in pids]))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop_sampling.wait(), SAMPLE_EVERY)

        waits0 = [sched_seconds(p)[1] for p in pids]
        wall0, cpu0, (hub0, leaf0) = time.monotonic(), cpu_seconds(pid), self._server_cpu()
        sampler = asyncio.create_task(sample())
        production: Production | None = None
        produced = wall0
        try:
            # the publisher waits for room in its ack window without a deadline of its own: this is its deadline
            production = await asyncio.wait_for(
                produce(
                    leaf_url,
                    [n.subject for n in names],
                    run.rate,
                    run.seconds,
                    self.settings.size,
                    self.settings.producers,
                ),
                run.seconds * 2 + 120.0,
            )
            run.production = production
            produced = time.monotonic()
            run.expected = production.sent
            await ops.wait_for_count(
                hub,
                warm + production.sent,
                deadline=max(60.0, production.sent / 1000),
                stall=STALL_SECONDS,
                alive=self._failure,
            )
            run.drain_s = time.monotonic() - produced
        except ops.BenchError:
            # the copies stored until then still say how latency went before it failed
            if production is not None:
                await self._partial_latencies(hub, production.sent // len(names))
            raise
        finally:
            stop_sampling.set()
            await sampler
            run.cpu_timeline = cpu_timeline(cpu_samples, wall0, ("bridge", "hub", "leaf", "bench"))
            run.bridge_cores_max_1s = max((row["bridge"] for row in run.cpu_timeline), default=None)
            self._steady_rss(samples, wall0, produced if production is not None else None)
        wall = time.monotonic() - wall0
        cpu1, (hub1, leaf1) = cpu_seconds(pid), self._server_cpu()
        run.bridge_cpu_s_per_million = (cpu1 - cpu0) / production.sent * 1e6
        run.bridge_cores = (cpu1 - cpu0) / wall
        run.hub_cores, run.leaf_cores = (hub1 - hub0) / wall, (leaf1 - leaf0) / wall
        run.producer_cores = production.cpu_s / wall
        waits = [(sched_seconds(p)[1] - w0) / wall for p, w0 in zip(pids, waits0, strict=True)]
        run.bridge_wait_cores, run.hub_wait_cores, run.leaf_wait_cores, run.producer_wait_cores = waits
        readyz = await self._readyz()
        run.troubled = troubled_sources(readyz)
        run.ready_at_end = None if readyz is None else readyz.get("ready") is True
        run.counters = await self._counters()
        await self._stop_bridge()
        copies = await read_copies(hub, warm + production.sent, timeout=max(60.0, production.sent / 2000))
        self._latencies(copies, production.sent // len(names))

    def _steady_rss(self, samples: Sequence[tuple[float, int]], start: float, end: float | None) -> None:
        """VmRSS over the second half of the production (up to the last sample when it did not finish)."""
        if not samples:
            return
        end = end if end is not None else samples[-1][0]
        half = start + (end - start) / 2
        steady = [rss for t, rss in samples if half <= t <= end] or [rss for _, rss in samples]
        self.run.rss_steady_median_bytes = int(median([float(x) for x in steady]))
        self.run.rss_steady_max_bytes = max(rss for _, rss in samples)

    async def _warm_up(self, leaf: Client) -> None:
        async with ops.Publisher(leaf, window=1024) as pub:
            for n in self.names:
                await pub.publish(n.subject, b"warm-up")
            await pub.drain(30.0)

    async def _partial_latencies(self, hub: Client, per_source_expected: int) -> None:
        """Latencies of whatever the aggregate holds (the run failed: its error stays the failure's)."""
        error = self.run.error
        with contextlib.suppress(Exception):
            held = (await ops.stream_state(hub, ops.AGGREGATE)).messages
            copies = await read_copies(hub, held, timeout=max(60.0, held / 2000))
            self._latencies(copies, per_source_expected)
            self.run.partial = True
        self.run.error = error

    async def _stop_bridge(self) -> None:
        run = self.run
        assert self.bridge is not None
        with contextlib.suppress(OSError):
            run.rss_peak_bytes = peak_rss_bytes(self.pid)
        try:
            run.bridge_exit_code = await asyncio.to_thread(self.bridge.stop, BRIDGE_STOP_TIMEOUT)
        except TimeoutError as exc:
            run.bridge_exit_code = -9
            run.error = str(exc)
        self.log.poll()
        run.warnings = dict(sorted(self.log.warnings.items()))
        run.unplanned_resets = self.log.unplanned_resets()
        run.modes = self.log.mode_counts()

    def _latencies(self, copies: Sequence[Copy], per_source_expected: int) -> None:
        run = self.run
        by_source: dict[str, list[float]] = {n.source: [] for n in self.names}
        from_origin: list[float] = []
        seen: set[tuple[str, int]] = set()
        first_sent = min((c.sent_ns for c in copies if c.sent_ns is not None), default=0)
        by_second: dict[int, list[float]] = {}
        for c in copies:
            if c.sent_ns is None:
                continue
            key = (c.source, c.sent_ns)
            if key in seen:
                run.duplicates += 1
                continue
            seen.add(key)
            latency = (c.store_ns - c.sent_ns) / 1e6
            by_source.setdefault(c.source, []).append(latency)
            by_second.setdefault((c.sent_ns - first_sent) // 1_000_000_000, []).append(latency)
            if c.origin_ns is not None:
                from_origin.append((c.store_ns - c.origin_ns) / 1e6)
        run.read_back = sum(len(v) for v in by_source.values())
        run.missing = sum(max(0, per_source_expected - len(v)) for v in by_source.values())
        run.per_source = {name: latency_stats(v) for name, v in by_source.items() if v}
        run.timeline = timeline(by_second)
        everything = [x for v in by_source.values() for x in v]
        if everything:
            run.latency = latency_stats(everything)
        if from_origin:
            run.latency_from_origin = latency_stats(from_origin)
        worst = worst_source(run.per_source)
        if worst is not None:
            run.worst_source, run.worst_p99_ms = worst[0], worst[1].p99_ms
        run.sources_over_target = sum(1 for s in run.per_source.values() if s.p99_ms >= TARGET_P99_MS)
        if run.missing or run.duplicates:
            run.error = f"{run.missing} stamped copies missing, {run.duplicates} duplicated"


def trial(settings: Settings, role: str, sources: int, rate: float, seconds: float) -> FaninRun:
    """Run one trial on fresh servers; a failed one carries its reason (and keeps its directory)."""
    run = FaninRun(role=role, sources=sources, rate=rate, seconds=seconds, size=settings.size)
    run.label = f"{role}-{sources}x{rate:g}-{time.strftime('%H%M%S')}"
    _Trial(settings, run).execute()
    return run


# Output


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / MB:.1f} MB"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def describe(run: FaninRun) -> str:
    """One progress line's worth of a trial."""
    parts = []
    if run.startup_s is not None:
        parts.append(
            f"start-up {run.startup_s:.1f} s (first {_s(run.startup_first_s)}, half {_s(run.startup_median_s)}, "
            f"/readyz {_s(run.startup_readyz_s)}; bridge CPU {_s(run.startup_bridge_cpu_s)})"
        )
    if run.rss_idle_bytes is not None:
        parts.append(
            f"idle RSS {_mb(run.rss_idle_bytes)}, idle CPU {100 * (run.cpu_idle_cores or 0):.0f}% (hub "
            f"{100 * (run.hub_idle_cores or 0):.0f}%, leaf {100 * (run.leaf_idle_cores or 0):.0f}%)"
        )
    if run.hub_bridge_connections is not None:
        parts.append(f"{run.hub_bridge_connections} bridge connections on the hub ({run.bridge_sockets} sockets)")
    p = run.production
    if p is not None:
        parts.append(
            f"producer {p.achieved_rate:,.0f} of {p.planned_rate:,.0f} msg/s (late p99 {p.late_p99_ms:.1f} ms, "
            f"{p.connections} conns)"
        )
    if run.latency is not None:
        parts.append(
            f"latency p50 {run.latency.p50_ms:.1f} / p99 {run.latency.p99_ms:.1f} / max {run.latency.max_ms:.0f} ms "
            f"over {run.latency.count:,}; worst source {run.worst_source} p99 {run.worst_p99_ms:.1f} ms"
        )
    if run.timeline:
        what = "copies stored before the failure" if run.partial else "production"
        parts.append(f"p50/p99 ms per second of {what}: {format_timeline(run.timeline)}")
    if run.cpu_timeline:
        parts.append("bridge cores per second: " + " ".join(f"{row['bridge']:.2f}" for row in run.cpu_timeline))
    if run.rss_steady_median_bytes is not None:
        parts.append(
            f"RSS steady {_mb(run.rss_steady_median_bytes)} (max {_mb(run.rss_steady_max_bytes)}), "
            f"peak {_mb(run.rss_peak_bytes)}"
        )
    if run.bridge_cpu_s_per_million is not None:
        parts.append(
            f"bridge CPU {run.bridge_cpu_s_per_million:.1f} s/1M ({run.bridge_cores:.2f} cores; hub "
            f"{run.hub_cores:.2f}, leaf {run.leaf_cores:.2f}, producer {run.producer_cores:.2f}; runnable but "
            f"waiting for a CPU: bridge {run.bridge_wait_cores or 0:.2f}, hub {run.hub_wait_cores or 0:.2f}, leaf "
            f"{run.leaf_wait_cores or 0:.2f}, producer {run.producer_wait_cores or 0:.2f})"
        )
    delivered = run.counters.get("nats_bridge_deliveries")
    if delivered:
        fc = run.counters.get("nats_bridge_flow_control_requests", 0.0)
        answered = run.counters.get("nats_bridge_flow_control_answer_latency_seconds_count", 0.0)
        waited = run.counters.get("nats_bridge_flow_control_answer_latency_seconds_sum", 0.0)
        mean = f", answered in {1e3 * waited / answered:,.0f} ms on average" if answered else ""
        parts.append(f"{fc:,.0f} flow-control requests for {delivered:,.0f} deliveries{mean}")
    if run.ready_at_end is False:
        parts.append("/readyz NOT ready after the last copy")
    for kind, names in run.troubled.items():
        if names and kind != "not_ready":
            parts.append(f"{kind}: {', '.join(names[:5])}")
    if run.unplanned_resets:
        parts.append("resets " + ", ".join(f"{c} x{n}" for c, n in run.unplanned_resets.items()))
    if run.warnings:
        parts.append("log warnings " + ", ".join(f"{e} x{n}" for e, n in run.warnings.items()))
    if not run.ok:
        parts.append(f"FAILED: {run.error}")
    return "; ".join(parts)


@dataclass(slots=True)
class Target:
    """One line of the summary: a figure, its target, what was measured and the verdict."""

    figure: str
    target: str
    measured: str
    verdict: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def _verdict(met: bool | None) -> str:
    return "reported" if met is None else ("met" if met else "NOT met")


def targets(
    main: FaninRun | None,
    baseline: FaninRun | None,
    search: Mapping[str, Any] | None,
) -> list[Target]:
    """The summary lines: each figure of target 3 next to its target, and the costs it asks for."""
    out: list[Target] = []
    if main is not None:
        load = f"{main.sources} sources x {main.rate:g} msg/s"
        valid = main.ok and main.producer_kept_up
        p = main.production
        if p is not None:
            out.append(
                Target(
                    f"producer rate ({load})",
                    f">= {MIN_RATE_FRACTION:.0%} of {p.planned_rate:,.0f} msg/s",
                    f"{p.achieved_rate:,.0f} msg/s (late p99 {p.late_p99_ms:.1f} ms)",
                    _verdict(main.producer_kept_up),
                )
            )
        if main.worst_p99_ms is not None:
            out.append(
                Target(
                    f"every source's replication p99 ({load})",
                    f"< {TARGET_P99_MS:g} ms",
                    f"worst {main.worst_p99_ms:.1f} ms ({main.worst_source}); {main.sources_over_target} over",
                    _verdict(main.worst_p99_ms < TARGET_P99_MS) if valid else "not judged: run invalid",
                )
            )
        if main.latency is not None:
            origin = main.latency_from_origin
            extra = f"; from origin store p50 {origin.p50_ms:.1f} / p99 {origin.p99_ms:.1f} ms" if origin else ""
            out.append(
                Target(
                    "replication latency, all copies",
                    "-",
                    f"p50 {main.latency.p50_ms:.1f} / p99 {main.latency.p99_ms:.1f} / max {main.latency.max_ms:.0f} ms"
                    f" over {main.latency.count:,}{extra}",
                    "reported",
                )
            )
        rss = max((x for x in (main.rss_peak_bytes, main.rss_steady_max_bytes) if x), default=None)
        if rss is not None:
            out.append(
                Target(
                    "bridge RSS",
                    f"< {TARGET_RSS_BYTES / MB:.0f} MB",
                    f"steady {_mb(main.rss_steady_median_bytes)}, peak (VmHWM) {_mb(main.rss_peak_bytes)}; "
                    f"idle {_mb(main.rss_idle_bytes)}",
                    _verdict(rss < TARGET_RSS_BYTES),
                )
            )
        if main.startup_s is not None:
            out.append(
                Target(
                    f"start-up, spawn to all {main.sources} sources bound",
                    f"< {TARGET_STARTUP_S:g} s",
                    f"{main.startup_s:.1f} s (/readyz {_s(main.startup_readyz_s)})",
                    _verdict(main.startup_s < TARGET_STARTUP_S),
                )
            )
        trouble = sum(len(main.troubled.get(k, [])) for k in ("stalled", "blocked"))
        if main.troubled or not main.ok:
            resets = sum(main.unplanned_resets.values())
            lost = main.warnings.get("lease.lost", 0)
            ready = {None: "no answer", True: "ready", False: "NOT ready"}[main.ready_at_end]
            out.append(
                Target(
                    "sources stalled or blocked; unplanned resets; leases lost; /readyz after the last copy",
                    "0; 0; 0; ready",
                    f"{trouble}; {resets}; {lost}; {ready}",
                    _verdict(trouble == 0 and resets == 0 and lost == 0 and main.ready_at_end is True),
                )
            )
        if main.bridge_cpu_s_per_million is not None:
            out.append(
                Target(
                    "bridge CPU",
                    "-",
                    f"{main.bridge_cpu_s_per_million:.1f} s per 1M msgs ({main.bridge_cores:.2f} cores; hub "
                    f"{main.hub_cores:.2f}, leaf {main.leaf_cores:.2f}, producer {main.producer_cores:.2f}; "
                    f"runnable but waiting for a CPU: bridge {main.bridge_wait_cores or 0:.2f}, hub "
                    f"{main.hub_wait_cores or 0:.2f}, leaf {main.leaf_wait_cores or 0:.2f})",
                    "reported",
                )
            )
        if baseline is not None:
            memory = per_unit(main.rss_idle_bytes, baseline.rss_idle_bytes, main.sources)
            conns = per_unit(main.hub_bridge_connections, baseline.hub_bridge_connections, main.sources)
            if memory is not None:
                hub_mem = per_unit(main.hub_rss_idle_bytes, baseline.hub_rss_idle_bytes, main.sources)
                leaf_mem = per_unit(main.leaf_rss_idle_bytes, baseline.leaf_rss_idle_bytes, main.sources)
                servers = "".join(
                    f"; {name} {cost / 1e3:.0f} kB"
                    for name, cost in (("hub", hub_mem), ("leaf", leaf_mem))
                    if cost is not None
                )
                out.append(
                    Target(
                        "memory per source (idle RSS, N vs 1 source)",
                        "-",
                        f"bridge {memory / 1e3:.0f} kB ({_mb(baseline.rss_idle_bytes)} with 1, "
                        f"{_mb(main.rss_idle_bytes)} with {main.sources}){servers}",
                        "reported",
                    )
                )
            if conns is not None:
                out.append(
                    Target(
                        "connections per source (bridge's, on the hub)",
                        "-",
                        f"{conns:.2f} ({baseline.hub_bridge_connections} with 1 source, "
                        f"{main.hub_bridge_connections} with {main.sources}; {main.bridge_sockets} sockets)",
                        "reported",
                    )
                )
    if search is not None:
        ceiling = search.get("first_failing")
        out.append(
            Target(
                f"largest source count at {SEARCH_RATE:g} msg/s each",
                "reported",
                f"{search['largest_held']}"
                + (
                    f" (first not held: {ceiling}: {search.get('bound')})"
                    if ceiling
                    else f" (every count tried held, up to --max-search {search.get('max_search')})"
                ),
                "reported",
            )
        )
    return out


def search_table(search: Mapping[str, Any], baseline: FaninRun | None) -> str:
    """The search's steps as a markdown table: what each count cost and whether it held."""
    lines = [
        "| sources | held | start-up s | worst p99 ms | idle RSS MB | peak RSS MB | memory per source kB "
        "| bridge cores (waiting) | why not held |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = baseline.rss_idle_bytes if baseline is not None else None
    for step in search.get("steps", []):
        r = step["run"]
        n = int(step["sources"])
        cost = per_unit(r.get("rss_idle_bytes"), base, n)
        cores = r.get("bridge_cores")
        cells = [
            str(n),
            "yes" if step["held"] else "no",
            _num(r.get("startup_s"), 1),
            _num(r.get("worst_p99_ms"), 0),
            _num(None if r.get("rss_idle_bytes") is None else r["rss_idle_bytes"] / MB, 0),
            _num(None if r.get("rss_peak_bytes") is None else r["rss_peak_bytes"] / MB, 0),
            _num(None if cost is None else cost / 1e3, 0),
            "-" if cores is None else f"{cores:.2f} ({r.get('bridge_wait_cores') or 0:.2f})",
            "; ".join(step["reasons"]).replace("|", "/") or "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_targets(items: Sequence[Target]) -> str:
    width = max((len(t.figure) for t in items), default=10)
    lines = ["targets (reported, not asserted):"]
    for t in items:
        lines.append(f"  {t.figure:<{width}}  {t.target:<16}  {t.measured}  [{t.verdict}]")
    return "\n".join(lines)


def markdown(items: Sequence[Target], header: str) -> str:
    """A section to paste into bench/RESULTS.md."""
    lines = [header, "", "| figure | target | measured | verdict |", "|---|---|---|---|"]
    for t in items:
        lines.append(f"| {t.figure} | {t.target} | {t.measured} | {t.verdict} |")
    return "\n".join(lines) + "\n"


def search_bound(run: FaninRun, reasons: Sequence[str]) -> str:
    """What stopped the machine holding a count, with the CPU figures that tell which resource ran out."""
    cpu = []
    if run.startup_bridge_cpu_s is not None and run.startup_s:
        cpu.append(f"bridge {run.startup_bridge_cpu_s / run.startup_s:.2f} cores during start-up")
    if run.bridge_cores is not None:
        cpu.append(
            f"{run.bridge_cores:.2f} bridge / {run.hub_cores or 0:.2f} hub / {run.leaf_cores or 0:.2f} leaf / "
            f"{run.producer_cores or 0:.2f} producer cores while replicating, runnable but waiting for a CPU "
            f"{run.bridge_wait_cores or 0:.2f} / {run.hub_wait_cores or 0:.2f} / {run.leaf_wait_cores or 0:.2f} / "
            f"{run.producer_wait_cores or 0:.2f}"
        )
    if run.warnings:
        cpu.append("log: " + ", ".join(f"{e} x{n}" for e, n in run.warnings.items()))
    text = "; ".join(reasons) if reasons else "held"
    return text + (f" ({'; '.join(cpu)})" if cpu else "")


# The command


def parser(sub: Any) -> None:
    """Add the ``fanin`` subcommand to ``python -m bench``."""
    p = sub.add_parser(
        "fanin", help="one bridge replicating many sources at a fixed rate each: latency, memory, start-up"
    )
    p.add_argument("--sources", type=int, help=f"sources in the main trial (default {DEFAULT_SOURCES})")
    p.add_argument("--rate", type=float, help=f"msg/s per source in the main trial (default {DEFAULT_RATE:g})")
    p.add_argument(
        "--seconds", type=float, help=f"seconds of production in the main trial (default {DEFAULT_SECONDS:g})"
    )
    p.add_argument("--size", type=int, default=DEFAULT_SIZE, help=f"payload bytes (default {DEFAULT_SIZE})")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke test: {QUICK_SOURCES} sources at {QUICK_RATE:g} msg/s for {QUICK_SECONDS:g} s, no search",
    )
    p.add_argument(
        "--search",
        action="store_true",
        help=f"also find the largest source count held at {SEARCH_RATE:g} msg/s each (doubling from {SEARCH_START}, "
        "then bisecting)",
    )
    p.add_argument("--search-only", action="store_true", help="run the baseline and the search, not the main trial")
    p.add_argument(
        "--max-search",
        type=int,
        default=DEFAULT_MAX_SEARCH,
        help=f"largest count the search tries (default {DEFAULT_MAX_SEARCH})",
    )
    p.add_argument(
        "--search-seconds",
        type=float,
        default=DEFAULT_SEARCH_SECONDS,
        help=f"seconds of production per search step (default {DEFAULT_SEARCH_SECONDS:g})",
    )
    p.add_argument(
        "--search-rss-mb",
        type=float,
        default=DEFAULT_SEARCH_RSS_BYTES / MB,
        help=f"RSS a held count stays under, MB (default {DEFAULT_SEARCH_RSS_BYTES / MB:.0f})",
    )
    p.add_argument(
        "--producers",
        type=int,
        default=DEFAULT_PRODUCERS,
        help=f"producer connections to the leaf (default {DEFAULT_PRODUCERS})",
    )
    p.add_argument(
        "--mode",
        choices=("auto", "flow_control", "pull"),
        default="auto",
        help="every source's `mode` (default auto: flow control on nats-server 2.14+)",
    )
    p.add_argument(
        "--startup-deadline",
        type=float,
        default=DEFAULT_STARTUP_DEADLINE,
        help=f"seconds a trial waits for every source to be bound (default {DEFAULT_STARTUP_DEADLINE:g})",
    )
    p.add_argument(
        "--no-leases",
        action="store_true",
        help="a diagnostic: run the bridge with coordination.enabled = false (no lease traffic), which the target "
        "is not about",
    )
    p.add_argument(
        "--max-ack-pending",
        type=int,
        help="every source's max_ack_pending (default: the bridge's, 1000); with flow control a source's origin "
        "pauses each time this many deliveries are unanswered",
    )
    p.add_argument("--out", type=Path, help="the JSON file (default bench/results/fanin-<UTC time>.json)")
    p.add_argument("--keep", action="store_true", help="keep every trial's directory (servers' and bridge's files)")


@dataclass(frozen=True, slots=True)
class _Trials:
    """What one ``fanin`` run measured: the baseline, the main trial and the search, each unless it did not run."""

    baseline: FaninRun | None
    main: FaninRun | None
    search: dict[str, Any] | None


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    quick: bool = args.quick
    count: int = args.sources if args.sources is not None else (QUICK_SOURCES if quick else DEFAULT_SOURCES)
    rate: float = args.rate if args.rate is not None else (QUICK_RATE if quick else DEFAULT_RATE)
    seconds: float = args.seconds if args.seconds is not None else (QUICK_SECONDS if quick else DEFAULT_SECONDS)
    search: bool = (args.search or args.search_only) and not quick
    if args.max_ack_pending is not None and args.max_ack_pending < 1:
        print("fanin: --max-ack-pending must be >= 1", file=sys.stderr)
        return 2
    if count < 1 or rate <= 0 or seconds <= 0 or args.size < 1 or args.producers < 1 or args.max_search < 1:
        print("fanin: --sources, --size, --producers, --max-search >= 1; --rate, --seconds > 0", file=sys.stderr)
        return 2

    def measure(session: Session) -> _Trials:
        workdir = session.workdir
        settings = Settings(
            workdir=workdir,
            keep=args.keep,
            binary=session.binary,
            size=args.size,
            mode=args.mode,
            producers=args.producers,
            startup_deadline=args.startup_deadline,
            leases=not args.no_leases,
            max_ack_pending=args.max_ack_pending,
        )
        runs: list[FaninRun] = []

        def step(what: str, r: FaninRun) -> None:
            runs.append(r)
            print(f"[{time.monotonic() - session.t0:6.0f}s] {what}: {describe(r)}", flush=True)

        baseline: FaninRun | None = None
        main: FaninRun | None = None
        search_doc: dict[str, Any] | None = None
        try:
            baseline = trial(settings, "baseline", 1, rate, 0.0)
            step("baseline, 1 source idle", baseline)
            if not args.search_only:
                main = trial(settings, "main", count, rate, seconds)
                step(f"main, {count} sources x {rate:g} msg/s x {seconds:g} s", main)
            if search:
                search_doc = _search(settings, args, step)
        finally:
            if not args.keep and workdir.exists() and not any(workdir.iterdir()):
                shutil.rmtree(workdir, ignore_errors=True)
        return _Trials(baseline, main, search_doc)

    def report(session: Session, trials: _Trials) -> Report:
        info, revision = session.info, session.revision
        baseline, main, search_doc = trials.baseline, trials.main, trials.search
        items = targets(main, baseline, search_doc)
        print()
        print(format_targets(items))
        header = (
            f"### Fan-in, {session.started.date().isoformat()}: `{session.command}`\n\n"
            f"{info['nproc']} CPUs ({info['cpu_model']}), nats-server {session.version}, {revision_text(revision)}, "
            f"load average at start {info['loadavg_start']} (a shared machine: other work ran meanwhile); "
            f"{args.size} B payloads, the bridge in the sidecar position, defaults otherwise"
            + (" except coordination.enabled = false" if args.no_leases else "")
            + (f", max_ack_pending = {args.max_ack_pending}" if args.max_ack_pending is not None else "")
            + "."
        )
        md = markdown(items, header)
        if search_doc is not None and search_doc["steps"]:
            md += f"\nThe search at {SEARCH_RATE:g} msg/s per source, {args.search_seconds:g} s per step:\n\n"
            md += search_table(search_doc, baseline)
        fields = {
            "settings": {
                "sources": count,
                "rate": rate,
                "seconds": seconds,
                "size": args.size,
                "mode": args.mode,
                "producers": args.producers,
                "quick": quick,
                "search": search,
                "search_rate": SEARCH_RATE,
                "search_seconds": args.search_seconds,
                "max_search": args.max_search,
                "search_rss_limit_bytes": int(args.search_rss_mb * MB),
                "startup_deadline": args.startup_deadline,
                "leases": not args.no_leases,
                "max_ack_pending": args.max_ack_pending,
                "bridge_config_example": fanin_config("nats://HUB", source_names(2)),
            },
            "baseline": baseline.as_dict() if baseline else None,
            "main": main.as_dict() if main else None,
            "search": search_doc,
        }
        failures = [r for r in (baseline, main) if r is not None and not r.ok]
        lines = "".join(f"\n  {r.role}: {r.error}" for r in failures)
        failure = f"\n{len(failures)} trial(s) failed:{lines}" if failures else ""
        return Report(md, fields, [t.as_dict() for t in items], failure)

    return run_command("fanin", args.out, measure, report, workdir_holds="trials")


def _search(settings: Settings, args: argparse.Namespace, step: Callable[[str, FaninRun], None]) -> dict[str, Any]:
    """The largest source count held at :data:`SEARCH_RATE` msg/s each (see :func:`holds` and :func:`next_count`)."""
    rss_limit = int(args.search_rss_mb * MB)
    results: dict[int, bool] = {}
    steps: list[dict[str, Any]] = []
    bounds: dict[int, str] = {}
    while (n := next_count(results, SEARCH_START, args.max_search)) is not None:
        r = trial(settings, "search", n, SEARCH_RATE, args.search_seconds)
        reasons = holds(r, rss_limit=rss_limit)
        results[n] = not reasons
        bounds[n] = search_bound(r, reasons)
        step(f"search, {n} sources x {SEARCH_RATE:g} msg/s: {'holds' if not reasons else 'does NOT hold'}", r)
        steps.append({"sources": n, "held": not reasons, "reasons": reasons, "run": r.as_dict()})
    largest, first_failing = search_outcome(results)
    return {
        "rate": SEARCH_RATE,
        "max_search": args.max_search,
        "largest_held": largest,
        "first_failing": first_failing,
        "bound": bounds.get(first_failing) if first_failing is not None else None,
        "rss_limit_bytes": rss_limit,
        "steps": steps,
    }
