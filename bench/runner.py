"""One measurement at a time, each on a fresh hub + leaf in its own directory.

Throughput: the origin (WorkQueue or Limits) is preloaded with N messages first (not timed); then either the
aggregate is created with a native durable source bound to a user-managed ``flow_control`` consumer, or the
aggregate is created plain and the bridge is started as a child process (``python -m bridge run -c FILE`` from
the repository root, i.e. whatever bridge code is in the working tree). Latency: the path is set up and warmed,
then messages are published at a fixed rate. Every process is stopped by its PID; every wait has a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from bench import natsops as ops
from bench.model import BRIDGE_POSITIONS, MB, MODES, NATIVE, LatencyRun, ThroughputRun
from bench.procs import cpu_seconds, peak_rss_bytes
from bench.stats import percentile
from bench.world import Body, World, guarded, in_world
from bridge.testing.processes import BridgeProcess

SOURCE = "leaf1"
WARMUP_MESSAGES = 10
STALL_SECONDS = 30.0  # no new copy for this long fails a measurement (the bridge resets a silent consumer in 5 s)


@dataclass(frozen=True, slots=True)
class Options:
    """Settings shared by every measurement."""

    workdir: Path
    max_ack_pending: int
    keep: bool
    binary: str | None  # the hub's nats-server (and the leaf's unless origin_binary); None: find_nats_server()
    mode: str = "auto"  # the bridge source's `mode` (MODES)
    origin_binary: str | None = None  # the leaf's (the origin's) nats-server when it differs from the hub's


def bridge_config(hub_url: str, leaf_url: str, position: str, max_ack_pending: int, mode: str = "auto") -> str:
    """The bridge's configuration: defaults everywhere except names, addresses, ``max_ack_pending`` and the
    source's ``mode`` (``auto``, the default, written out so every configuration says which was asked for)."""
    if mode not in MODES:
        raise ValueError(f"unknown bridge mode {mode!r}")
    if position == "sidecar":
        source_servers, domain = hub_url, 'domain = "leaf"'
    elif position == "edge":
        source_servers, domain = leaf_url, "# edge position: connected to the leaf itself"
    else:
        raise ValueError(f"unknown bridge position {position!r}")
    return f"""\
# written by `python -m bench`
[log]
level = "info"
format = "json"

[http]
listen = "127.0.0.1:0"

[target]
servers = ["{hub_url}"]
stream = "{ops.AGGREGATE}"

[[sources]]
name = "{SOURCE}"
servers = ["{source_servers}"]
{domain}
stream = "{ops.ORIGIN}"
max_ack_pending = {max_ack_pending}
mode = "{mode}"
subject_prefix = "{ops.BRIDGE_PREFIX}"
"""


def start_bridge(world: World, options: Options, path: str, interpreter_args: Sequence[str] = ()) -> BridgeProcess:
    """Configure the bridge for ``path`` (its position, and ``options``' consumer settings) and start it."""
    hub, leaf = world.topology.hub.url, world.topology.leaf.url
    position = BRIDGE_POSITIONS[path]
    world.write_config(bridge_config(hub, leaf, position, options.max_ack_pending, options.mode))
    return world.start_bridge(interpreter_args)


def measure(options: Options, label: str, body: Body, failed: Callable[[], bool]) -> None:
    """Run ``body(world, leaf, hub)`` on a fresh world in ``options.workdir / label`` (``bench.world.in_world``)."""
    in_world(
        options.workdir / label,
        body,
        failed=failed,
        keep=options.keep,
        binary=options.binary,
        leaf_binary=options.origin_binary,
    )


async def _stop_bridge(world: World, run: ThroughputRun | LatencyRun) -> None:
    """SIGTERM the bridge (it must exit 0), then read its log: the mode it ran in and its warnings."""
    bridge = world.bridge
    assert bridge is not None
    run.bridge_exit_code = await world.stop_bridge()
    run.bridge_mode, run.bridge_warnings = bridge_log_summary(bridge.events())
    if run.bridge_exit_code != 0:
        run.error = f"bridge exited {run.bridge_exit_code} on SIGTERM"


def bridge_log_summary(events: Iterable[Mapping[str, Any]]) -> tuple[str | None, dict[str, int]]:
    """From the bridge's JSON log events: the mode its source ran in (the last ``source.mode`` event; None if it
    logged none) and how many ``warning`` and ``error`` events it logged, by event name."""
    mode: str | None = None
    warnings: dict[str, int] = {}
    for event in events:
        name = str(event.get("event", ""))
        if name == "source.mode":
            mode = str(event.get("mode", "")) or None
        if event.get("level") in ("warning", "error"):
            warnings[name] = warnings.get(name, 0) + 1
    return mode, warnings


def _deadline(messages: int, floor_rate: float = 1000.0) -> float:
    """Seconds allowed for moving ``messages``: at least a minute, or what ``floor_rate`` msg/s would take."""
    return max(60.0, messages / floor_rate)


# Throughput


def throughput(options: Options, path: str, size: int, retention: str, messages: int, rep: int) -> ThroughputRun:
    """Replicate ``messages`` preloaded messages of ``size`` bytes by ``path``; a failed run carries its reason."""
    run = ThroughputRun(path=path, size=size, retention=retention, rep=rep, messages=messages)
    label = f"{path}-{size}-{retention}-{rep}-{time.strftime('%H%M%S')}"
    _run_measured(options, label, run, lambda w, leaf, hub: _throughput(w, leaf, hub, options, run))
    return run


def _run_measured(options: Options, label: str, run: ThroughputRun | LatencyRun, body: Body) -> None:
    """Run one measurement's ``body`` on fresh servers; any failure ends up in ``run.error``, naming the logs."""
    guarded(run, options.workdir / label, lambda: measure(options, label, body, lambda: run.error is not None))


async def _throughput(world: World, leaf: Client, hub: Client, options: Options, run: ThroughputRun) -> None:
    await ops.create_origin(leaf, run.retention)
    run.preload_msgs_per_s = await ops.preload(leaf, run.messages, run.size, deadline=_deadline(run.messages, 5000))
    if run.path == NATIVE:
        await ops.create_native_consumer(leaf, options.max_ack_pending)
    else:
        await ops.create_aggregate(hub, native=False)
    marks: dict[str, float] = {}

    def on_first() -> None:  # CPU counters when the first copy is seen: the window leaves start-up out
        marks["servers_first"] = world.server_cpu()
        if world.bridge_pid is not None:
            marks["bridge_first"] = cpu_seconds(world.bridge_pid)

    started_ns = time.time_ns()
    if run.path == NATIVE:
        await ops.create_aggregate(hub, native=True)
    else:
        start_bridge(world, options, run.path)
    progress = await ops.wait_for_count(
        hub,
        run.messages,
        deadline=_deadline(run.messages),
        stall=STALL_SECONDS,
        on_first=on_first,
        alive=world.bridge_failure,
    )
    servers_done = world.server_cpu()
    window_msgs = max(1, run.messages - progress.first_seen_count)
    run.servers_cpu_s_per_million = (servers_done - marks["servers_first"]) / window_msgs * 1e6
    if (pid := world.bridge_pid) is not None:
        run.bridge_cpu_s = cpu_seconds(pid)
        run.bridge_peak_rss_bytes = peak_rss_bytes(pid)
        run.bridge_cpu_s_per_million = (run.bridge_cpu_s - marks["bridge_first"]) / window_msgs * 1e6
    state = await ops.stream_state(hub, ops.AGGREGATE)
    run.seconds = max(state.last_ts_ns - state.first_ts_ns, 1) / 1e9
    run.msgs_per_s = (state.last_seq - state.first_seq) / run.seconds
    run.mb_per_s = run.msgs_per_s * run.size / MB
    run.startup_s = (state.first_ts_ns - started_ns) / 1e9
    if run.path != NATIVE:
        await _stop_bridge(world, run)
    run.stored = (await ops.stream_state(hub, ops.AGGREGATE)).messages
    if run.stored != run.messages:
        run.error = f"aggregate holds {run.stored} messages, expected {run.messages}"


# Latency


def latency(
    options: Options, path: str, size: int, retention: str, rate: float, seconds: float, rep: int
) -> LatencyRun:
    """Publish at ``rate`` msg/s for ``seconds`` through ``path`` (set up and warmed first); per-message latency."""
    run = LatencyRun(path=path, size=size, retention=retention, rep=rep, rate=rate, seconds=seconds)
    label = f"latency-{path}-{size}-{retention}-{rep}-{time.strftime('%H%M%S')}"
    _run_measured(options, label, run, lambda w, leaf, hub: _latency(w, leaf, hub, options, run))
    return run


async def _latency(world: World, leaf: Client, hub: Client, options: Options, run: LatencyRun) -> None:
    await ops.create_origin(leaf, run.retention)
    if run.path == NATIVE:
        await ops.create_native_consumer(leaf, options.max_ack_pending)
        await ops.create_aggregate(hub, native=True)
    else:
        await ops.create_aggregate(hub, native=False)
        start_bridge(world, options, run.path)
    # warm-up: the path is up (bridge started, consumer bound) once these are stored
    async with ops.Publisher(leaf, window=WARMUP_MESSAGES) as pub:
        for k in range(WARMUP_MESSAGES):
            await pub.publish(f"{ops.ORIGIN_SUBJECTS}.{k % 16}", b"warm-up")
        await pub.drain(10.0)
    await ops.wait_for_count(hub, WARMUP_MESSAGES, deadline=60.0, stall=60.0, alive=world.bridge_failure)
    paced = await ops.paced_publish(leaf, run.rate, run.seconds, run.size)
    run.messages = paced.sent
    run.achieved_rate = paced.sent / paced.seconds if paced.seconds > 0 else 0.0
    if paced.publish_rtt_ns:
        run.publish_rtt_p50_ms = percentile(paced.publish_rtt_ns, 50) / 1e6
    total = WARMUP_MESSAGES + paced.sent
    await ops.wait_for_count(
        hub, total, deadline=_deadline(paced.sent), stall=STALL_SECONDS, alive=world.bridge_failure
    )
    stored = await ops.read_stored(hub, WARMUP_MESSAGES + 1, paced.sent)
    lat = [(s.store_ns - int(s.headers[ops.SENT_HEADER])) / 1e6 for s in stored if ops.SENT_HEADER in s.headers]
    if len(lat) != paced.sent:
        run.error = f"read back {len(lat)} stamped copies of {paced.sent}"
        return
    run.latencies_ms = lat
    run.p50_ms, run.p90_ms = percentile(lat, 50), percentile(lat, 90)
    run.p99_ms, run.max_ms = percentile(lat, 99), max(lat)
    if run.path != NATIVE:
        origin = [(s.store_ns - int(s.headers["Bridge-Time"])) / 1e6 for s in stored if "Bridge-Time" in s.headers]
        if origin:
            run.origin_store_p50_ms, run.origin_store_p99_ms = percentile(origin, 50), percentile(origin, 99)
        pid = world.bridge_pid
        assert pid is not None
        run.bridge_peak_rss_bytes = peak_rss_bytes(pid)
        await _stop_bridge(world, run)
