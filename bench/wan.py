"""``python -m bench wan``: bridge and native throughput against edge-hub round-trip time (link delay).

Each measurement gets a fresh hub and leaf, like ``python -m bench run``, but the leaf's leafnode connection to the
hub runs through a :class:`chaos.proxy.FaultProxy` that delays every chunk by half the nominal round trip in each
direction (the proxy delays each direction on its own, so a request and its reply pay the delay twice)::

    bench (preload) ─► leaf (ORIGIN) ─── link proxy, RTT/2 each way ───► hub (AGG) ◄─ bench (polls, RTT probe)
                          ▲                                                ▲
                          └─ edge bridge (source) ─ target proxy, RTT/2 ──┘  sidecar bridge, native source

The paths, alternated per repetition: native durable sourcing (the aggregate sources the leaf's ``flow_control``
consumer through ``$JS.leaf.API``), the bridge in the sidecar position (connected to the hub only: its consumer's
deliveries and its flow-control answers cross the delayed link, like native's), and for reference the bridge in the
edge position (its source connected to the leaf directly, its target reached through a second proxy with the same
delay, so its publishes and their acks cross the WAN and ``publish_window`` matters). The RTT each world really has
is measured before the workload: the median of timed ``$JS.leaf.API.INFO`` requests from a hub client (and
``$JS.API.INFO`` through the target proxy for the edge run). The ``direct`` point is the same world with no proxy,
so the proxy's own cost shows as the difference between ``direct`` and ``0``. The measured RTT runs about 1-2 ms
above the nominal: asyncio wakes the proxy's timers on whole milliseconds (up to ~1 ms late each way, so no finer
setting of the delay would help) and the servers take ~0.4 ms to answer the probe. The same probe is repeated every
:data:`LOADED_PROBE_INTERVAL` seconds during the replication (``loaded_rtt_ms``): the round trip the data saw.

The proxies run on an event loop of their own, in a thread of the bench process: the bench's own loop is made per
measurement and blocks while servers start, and the link must flow meanwhile. That thread's CPU time over the
replication window is recorded (``proxy_busy``: 1.0 would mean the proxy was the bottleneck).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import importlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from nats.aio.client import Client

from bench import natsops as ops
from bench.common import REPO_ROOT, check_config, list_items, loadavg, parse_messages, parse_sizes, rel
from bench.model import BRIDGE, BRIDGE_EDGE, BRIDGE_POSITIONS, MB, MODES, NATIVE, ThroughputRun
from bench.procs import cpu_seconds, git_revision, machine, peak_rss_bytes, revision_text
from bench.report import size_label
from bench.runner import STALL_SECONDS, bridge_config, bridge_log_summary
from bench.stats import Spread, median, parse_proc_stat_ticks, spread
from bench.world import BRIDGE_STOP_TIMEOUT, MAX_FILE_STORE
from bridge.testing.processes import BridgeProcess
from bridge.testing.servers import NatsServer, ServerStartError, Topology, find_nats_server, free_ports, server_version
from chaos.proxy import FaultProxy

DIRECT = "direct"  # the RTT point without any proxy: the leaf solicits the hub itself
DEFAULT_RTTS = "direct,0,20,50"
QUICK_RTTS = "0,20"
DEFAULT_SIZES = (256, 16384)
# About 5 s at the ~20k msg/s a 1000-message window allows at 50 ms, and ~1 s at native's LAN speed (the rate comes
# from server store times, so a short run is still exact); at 16 KiB the byte window and the copying bound it.
DEFAULT_MESSAGES = {256: 100_000, 16384: 20_000}
QUICK_MESSAGES = 2_000
RTT_PROBES = 10
LOADED_PROBE_INTERVAL = 0.2  # seconds between round-trip probes during the replication: a few per second is enough
SERVER_TIMEOUT = 10.0
LINK_TIMEOUT = 20.0  # the link's handshake takes several delayed round trips
PROXY_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
# Where a `--set` key goes in the bridge's TOML: the table header its lines are put under
SETTING_SECTIONS = {
    "engine": "[engine]",
    "target": "[target]",
    "source": "[[sources]]",
    "coordination": "[coordination]",
}
_TICKS = os.sysconf("SC_CLK_TCK")
_T = TypeVar("_T")


# Options


@dataclass(frozen=True, slots=True)
class RttPoint:
    """One point of the curve: a nominal round trip across the edge-hub link, or the direct link (no proxy)."""

    label: str  # "direct", or the nominal RTT in ms as given ("20")
    ms: float  # nominal RTT; 0 for direct
    proxied: bool

    @property
    def delay_s(self) -> float:
        """The proxy's delay per direction: a round trip crosses it twice."""
        return self.ms / 2000.0


def parse_rtts(text: str) -> tuple[RttPoint, ...]:
    """``direct,0,20,50`` (``20ms`` accepted) -> the RTT points, in the order given, without repeats."""
    out: list[RttPoint] = []
    for item in list_items(text):
        if item == DIRECT:
            point = RttPoint(DIRECT, 0.0, proxied=False)
        else:
            try:
                ms = float(item.removesuffix("ms"))
            except ValueError:
                raise argparse.ArgumentTypeError(f"RTT must be 'direct' or milliseconds, not {item!r}") from None
            if not 0 <= ms <= 10_000:
                raise argparse.ArgumentTypeError(f"RTT must be 0..10000 ms, not {ms:g}")
            point = RttPoint(f"{ms:g}", ms, proxied=True)
        if point not in out:
            out.append(point)
    if not out:
        raise argparse.ArgumentTypeError("no RTTs")
    return tuple(out)


def default_messages(size: int, quick: bool) -> int:
    """Messages per run when ``--messages`` does not say: enough for seconds at the expected WAN rate."""
    if quick:
        return QUICK_MESSAGES
    if size in DEFAULT_MESSAGES:
        return DEFAULT_MESSAGES[size]
    return 100_000 if size <= 1024 else 20_000


def parse_int_list(text: str) -> tuple[int, ...]:
    """``1000,4000`` -> (1000, 4000); every value >= 1."""
    try:
        out = tuple(dict.fromkeys(int(item) for item in text.split(",") if item.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of integers, not {text!r}") from None
    if not out or any(v < 1 for v in out):
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {text!r}")
    return out


def parse_paths(text: str) -> tuple[str, ...]:
    """``native,bridge`` -> the paths, in the bench's order (native first, so a repetition pairs as in bench run)."""
    given = {item.strip() for item in text.split(",") if item.strip()}
    known = (NATIVE, BRIDGE, BRIDGE_EDGE)
    if not given or given - set(known):
        raise argparse.ArgumentTypeError(f"paths must be among {', '.join(known)}, not {text!r}")
    return tuple(path for path in known if path in given)


def parse_setting(text: str) -> tuple[str, str]:
    """``target.publish_window=4096`` -> ("target.publish_window", "4096"); the value is TOML as written."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    section, _, name = key.partition(".")
    if not sep or not value or section not in SETTING_SECTIONS or not name or "." in name:
        raise argparse.ArgumentTypeError(
            f"--set wants SECTION.KEY=VALUE with SECTION among {', '.join(SETTING_SECTIONS)}, not {text!r}"
        )
    return key, value


def with_settings(text: str, settings: Mapping[str, str]) -> str:
    """The bridge configuration ``text`` with each ``section.key = value`` of ``settings`` added to its table
    (right under the table's header, or in a new table at the end)."""
    lines: dict[str, list[str]] = {}
    for key, value in settings.items():
        section, _, name = key.partition(".")
        lines.setdefault(section, []).append(f"{name} = {value}")
    for section, entries in lines.items():
        header = SETTING_SECTIONS[section]
        block = "\n".join(entries)
        marker = f"\n{header}\n"
        if marker in text:
            text = text.replace(marker, f"{marker}{block}\n", 1)
        else:
            text = text.rstrip("\n") + f"\n\n{header}\n{block}\n"
    return text


def wan_bridge_config(
    target_url: str, leaf_url: str, position: str, max_ack_pending: int, mode: str, settings: Mapping[str, str]
) -> str:
    """``python -m bench run``'s bridge configuration (defaults plus names and addresses), with the target at
    ``target_url`` (the hub, or the proxy in front of it) and ``settings`` added."""
    text = bridge_config(target_url, leaf_url, position, max_ack_pending, mode)
    return with_settings(text.replace("# written by `python -m bench`", "# written by `python -m bench wan`"), settings)


def parser(sub: Any) -> None:
    """Add the ``wan`` subcommand to ``python -m bench``."""
    cmd = sub.add_parser(
        "wan",
        help="bridge and native throughput against edge-hub round-trip time (link delay)",
        description="Replicates a preloaded WorkQueue origin across a leafnode link delayed by a TCP proxy, by native "
        "durable sourcing and by the bridge (sidecar, and edge for reference), per RTT, size and max_ack_pending.",
    )
    cmd.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke test: RTTs {QUICK_RTTS}, 256 B, {QUICK_MESSAGES:,} messages, 1 repetition, no edge run",
    )
    cmd.add_argument(
        "--rtts",
        type=parse_rtts,
        help=f"round trips in ms, 'direct' for the link without a proxy (default {DEFAULT_RTTS}; --quick {QUICK_RTTS})",
    )
    cmd.add_argument("--sizes", type=parse_sizes, help="payload sizes (default 256,16384; --quick 256)")
    cmd.add_argument(
        "--messages",
        type=parse_messages,
        help="preloaded messages per run: N, or SIZE=N,... (default 256=100000,16384=20000; --quick 2000)",
    )
    cmd.add_argument("--reps", type=int, help="repetitions of each path per point (default 2; --quick 1)")
    cmd.add_argument(
        "--max-ack-pending",
        type=parse_int_list,
        default=(1000,),
        help="max_ack_pending of the origin consumer, the same on both paths; a list runs each (default 1000)",
    )
    cmd.add_argument(
        "--edge",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run the bridge in the edge position, its publishes crossing the WAN (default on; --quick off)",
    )
    cmd.add_argument(
        "--paths",
        type=parse_paths,
        help=f"the paths to measure, among {NATIVE},{BRIDGE},{BRIDGE_EDGE} (default: all three; --quick or --no-edge: "
        "the first two)",
    )
    cmd.add_argument(
        "--mode", choices=MODES, default="auto", help="the bridge source's `mode` (default auto: flow control)"
    )
    cmd.add_argument(
        "--publish-window",
        type=int,
        help="the bridge's target.publish_window, un-acked publishes (default: the bridge's, 1024); matters for edge",
    )
    cmd.add_argument(
        "--silence-timeout",
        type=float,
        help="the bridge's engine.silence_timeout in seconds (default: the bridge's, 5)",
    )
    cmd.add_argument(
        "--set",
        type=parse_setting,
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="any other bridge setting, the value as TOML (e.g. target.ack_timeout=10); repeatable",
    )
    cmd.add_argument("--probes", type=int, default=RTT_PROBES, help=f"timed requests per RTT check ({RTT_PROBES})")
    cmd.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="where JSON and PNG go")
    cmd.add_argument("--keep", action="store_true", help="keep every measurement's server and bridge files")


# Measurements


@dataclass(slots=True)
class WanRun:
    """One replication across one RTT point: the throughput figures plus what the link really was."""

    rtt: str  # RttPoint.label
    rtt_ms: float  # nominal
    proxied: bool
    max_ack_pending: int
    run: ThroughputRun
    measured_rtt_ms: float | None = None  # median of timed $JS.leaf.API.INFO from a hub client
    measured_rtt_min_ms: float | None = None
    loaded_rtt_ms: float | None = None  # the same request's median while the replication was running
    link_delay_ms: float | None = None  # the proxies' delay per direction (None: direct link)
    target_rtt_ms: float | None = None  # edge: median of timed $JS.API.INFO through the target proxy
    proxy_cpu_s_per_million: float | None = None  # the proxy thread, over the replication window
    proxy_busy: float | None = None  # its CPU seconds per wall second over that window
    link_connections: int | None = None  # connections the link proxy accepted (1 unless the leaf re-linked)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the point's fields and the throughput run's, flattened."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "run"}
        out.update(self.run.as_dict())
        return out


class _ProxyLoop:
    """Fault proxies served by an event loop in a thread of their own (see the module docstring)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._tid: int | None = None
        self.proxies: list[FaultProxy] = []
        self._thread = threading.Thread(target=self._serve, name="bench-wan-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(PROXY_TIMEOUT):
            raise ops.BenchError(f"proxy thread not running after {PROXY_TIMEOUT:g}s")

    def _serve(self) -> None:
        self._tid = threading.get_native_id()
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(PROXY_TIMEOUT)

    def add(self, upstream_port: int, name: str, delay: float) -> FaultProxy:
        """A proxy to 127.0.0.1:``upstream_port`` delaying each direction by ``delay`` seconds, listening."""
        # a claimed port, as the chaos suite does: binding port 0 could take a port a server was handed
        (listen_port,) = free_ports(1)

        async def make() -> FaultProxy:  # made on the proxy loop, where its asyncio objects will live
            proxy = FaultProxy("127.0.0.1", upstream_port, name=name, listen_port=listen_port)
            proxy.set_delay(delay)
            await proxy.start()
            return proxy

        proxy = self._call(make())
        self.proxies.append(proxy)
        return proxy

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the proxy thread so far."""
        return parse_proc_stat_ticks(Path(f"/proc/self/task/{self._tid}/stat").read_text()) / _TICKS

    def close(self) -> None:
        """Close every proxy (aborting its connections), stop the loop and join the thread, each with a deadline."""
        try:
            for proxy in self.proxies:
                self._call(proxy.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(PROXY_TIMEOUT)
            if not self._thread.is_alive():
                self._loop.close()


class _World:
    """A fresh hub + leaf for one measurement, linked directly or through a delaying proxy; the bridge if any."""

    def __init__(self, directory: Path, binary: str, point: RttPoint, target_proxy: bool) -> None:
        self.directory = directory
        self.proxies: _ProxyLoop | None = None
        self.link_proxy: FaultProxy | None = None
        self.target_proxy: FaultProxy | None = None
        self.bridge: BridgeProcess | None = None
        servers = directory / "servers"
        self.hub = NatsServer(
            servers / "hub",
            name="hub",
            binary=binary,
            domain="hub",
            leafnode_listen=True,
            max_file_store=MAX_FILE_STORE,
        )
        self.leaf: NatsServer | None = None
        try:
            if point.proxied:
                self.proxies = _ProxyLoop()
            self.hub.start()
            self.hub.wait_ready(SERVER_TIMEOUT)
            remote = self.hub.leafnode_url
            if self.proxies is not None:
                assert self.hub.leafnode_port is not None
                self.link_proxy = self.proxies.add(self.hub.leafnode_port, "leaf-link", point.delay_s)
                remote = f"nats-leaf://127.0.0.1:{self.link_proxy.port}"
            # built here rather than by start_topology, which has no way to put a proxy in the leaf's remote
            self.leaf = NatsServer(
                servers / "leaf",
                name="leaf",
                binary=binary,
                domain="leaf",
                leaf_remotes=[remote],
                max_file_store=MAX_FILE_STORE,
            )
            self.leaf.start()
            self.leaf.wait_ready(SERVER_TIMEOUT)
            Topology(self.hub, self.leaf).wait_linked(LINK_TIMEOUT)
            if target_proxy and self.proxies is not None:
                self.target_proxy = self.proxies.add(self.hub.port, "bridge-target", point.delay_s)
        except BaseException:
            self.close()
            raise

    @property
    def leaf_server(self) -> NatsServer:
        """The leaf (the origin); always there once the world is built."""
        assert self.leaf is not None
        return self.leaf

    @property
    def target_url(self) -> str:
        """Where the bridge's target (and the edge RTT probe) connects: the hub, or the proxy in front of it."""
        return self.target_proxy.url if self.target_proxy is not None else self.hub.url

    def start_bridge(self, config: str) -> BridgeProcess:
        """Write ``config`` next to the servers and start ``python -m bridge run`` on it."""
        path = self.directory / "bridge.toml"
        path.write_text(config)
        self.bridge = BridgeProcess(path, self.directory / "bridge.log").start()
        return self.bridge

    def bridge_failure(self) -> str | None:
        """Why the bridge is no longer running (with its log's tail), or None while it runs."""
        if self.bridge is None or self.bridge.is_running:
            return None
        return f"bridge exited early; log tail:\n{self.bridge.tail(15)}"

    def server_cpu(self) -> float:
        """CPU seconds the hub and the leaf have used so far."""
        total = 0.0
        for server in (self.hub, self.leaf):
            if server is not None and server.pid is not None:
                total += cpu_seconds(server.pid)
        return total

    def close(self) -> None:
        """Stop the bridge, the leaf, the hub, then the proxies (so the leaf never sees its link cut first)."""
        try:
            if self.bridge is not None:
                self.bridge.cleanup()
        finally:
            try:
                if self.leaf is not None:
                    self.leaf.stop()
            finally:
                try:
                    self.hub.stop()
                finally:
                    if self.proxies is not None:
                        self.proxies.close()


@dataclass(frozen=True, slots=True)
class _Options:
    workdir: Path
    binary: str
    mode: str
    settings: dict[str, str]
    probes: int
    keep: bool


async def probe_rtt(nc: Client, subject: str, count: int) -> list[float]:
    """Milliseconds of ``count`` sequential JetStream API requests on ``subject`` (after one untimed warm-up, which
    pays for the reply subscription's interest crossing the link)."""
    await ops.api(nc, subject, timeout=10.0)
    samples: list[float] = []
    for _ in range(count):
        began = time.perf_counter()
        await ops.api(nc, subject, timeout=10.0)
        samples.append((time.perf_counter() - began) * 1000.0)
    return samples


async def _probe_loaded(hub: Client, done: asyncio.Event, samples: list[float], running: Callable[[], bool]) -> None:
    """Until ``done``: time a ``$JS.leaf.API.INFO`` request every :data:`LOADED_PROBE_INTERVAL` seconds, keeping those
    made while ``running()`` (the replication has begun): the round trip the data path saw, queues included."""
    while not done.is_set():
        began = time.perf_counter()
        with contextlib.suppress(ops.BenchError):  # a lost probe says nothing about throughput: skip it
            await ops.api(hub, f"{ops.LEAF_API}.INFO", timeout=5.0)
            if running() and not done.is_set():
                samples.append((time.perf_counter() - began) * 1000.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), LOADED_PROBE_INTERVAL)


def _deadline(messages: int) -> float:
    """Seconds allowed for moving ``messages``: at least two minutes, or what 500 msg/s would take."""
    return max(120.0, messages / 500.0)


async def _close(*clients: Client) -> None:
    for nc in clients:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), CLOSE_TIMEOUT)


async def _measure(world: _World, run: WanRun, options: _Options, point: RttPoint) -> None:
    leaf = await ops.connect(world.leaf_server.url, "bench leaf")
    hub = await ops.connect(world.hub.url, "bench hub")
    try:
        await _throughput(world, leaf, hub, run, options, point)
    finally:
        await _close(leaf, hub)


async def _throughput(
    world: _World, leaf: Client, hub: Client, wan: WanRun, options: _Options, point: RttPoint
) -> None:
    run = wan.run
    if point.proxied:
        wan.link_delay_ms = point.delay_s * 1000
    samples = await probe_rtt(hub, f"{ops.LEAF_API}.INFO", options.probes)
    wan.measured_rtt_ms, wan.measured_rtt_min_ms = median(samples), min(samples)
    if world.target_proxy is not None:
        through = await ops.connect(world.target_url, "bench target probe")
        try:
            wan.target_rtt_ms = median(await probe_rtt(through, "$JS.API.INFO", options.probes))
        finally:
            await _close(through)
    await ops.create_origin(leaf, run.retention)
    run.preload_msgs_per_s = await ops.preload(leaf, run.messages, run.size, deadline=max(60.0, run.messages / 2000))
    if run.path == NATIVE:
        await ops.create_native_consumer(leaf, wan.max_ack_pending)
    else:
        await ops.create_aggregate(hub, native=False)
    marks: dict[str, float] = {}

    def on_first() -> None:  # counters when the first copy is seen: the window leaves start-up out
        marks["wall"] = time.monotonic()
        marks["servers"] = world.server_cpu()
        if world.bridge is not None and world.bridge.pid is not None:
            marks["bridge"] = cpu_seconds(world.bridge.pid)
        if world.proxies is not None:
            marks["proxy"] = world.proxies.cpu_seconds()

    started_ns = time.time_ns()
    if run.path == NATIVE:
        await ops.create_aggregate(hub, native=True)
    else:
        source_url = world.hub.url if run.path == BRIDGE else world.leaf_server.url
        config = wan_bridge_config(
            world.target_url,
            source_url,
            BRIDGE_POSITIONS[run.path],
            wan.max_ack_pending,
            options.mode,
            options.settings,
        )
        world.start_bridge(config)
    done = asyncio.Event()
    loaded: list[float] = []
    prober = asyncio.create_task(_probe_loaded(hub, done, loaded, lambda: "wall" in marks))
    try:
        progress = await ops.wait_for_count(
            hub,
            run.messages,
            deadline=_deadline(run.messages),
            stall=STALL_SECONDS,
            on_first=on_first,
            alive=world.bridge_failure,
        )
    finally:
        done.set()
        await asyncio.wait_for(prober, LOADED_PROBE_INTERVAL + 10.0)
    wall = max(time.monotonic() - marks["wall"], 1e-3)
    wan.loaded_rtt_ms = median(loaded) if loaded else None
    window_msgs = max(1, run.messages - progress.first_seen_count)
    run.servers_cpu_s_per_million = (world.server_cpu() - marks["servers"]) / window_msgs * 1e6
    if world.proxies is not None:
        proxy_cpu = world.proxies.cpu_seconds() - marks["proxy"]
        wan.proxy_cpu_s_per_million = proxy_cpu / window_msgs * 1e6
        wan.proxy_busy = proxy_cpu / wall
    if world.bridge is not None and world.bridge.pid is not None:
        pid = world.bridge.pid
        run.bridge_cpu_s = cpu_seconds(pid)
        run.bridge_peak_rss_bytes = peak_rss_bytes(pid)
        run.bridge_cpu_s_per_million = (run.bridge_cpu_s - marks["bridge"]) / window_msgs * 1e6
    state = await ops.stream_state(hub, ops.AGGREGATE)
    run.seconds = max(state.last_ts_ns - state.first_ts_ns, 1) / 1e9
    run.msgs_per_s = (state.last_seq - state.first_seq) / run.seconds
    run.mb_per_s = run.msgs_per_s * run.size / MB
    run.startup_s = (state.first_ts_ns - started_ns) / 1e9
    if world.bridge is not None:
        bridge, world.bridge = world.bridge, None
        run.bridge_exit_code = await asyncio.to_thread(bridge.stop, BRIDGE_STOP_TIMEOUT)
        run.bridge_mode, run.bridge_warnings = bridge_log_summary(bridge.events())
        if run.bridge_exit_code != 0:
            run.error = f"bridge exited {run.bridge_exit_code} on SIGTERM"
    run.stored = (await ops.stream_state(hub, ops.AGGREGATE)).messages
    if run.stored != run.messages and run.error is None:
        run.error = f"aggregate holds {run.stored} messages, expected {run.messages}"
    if world.link_proxy is not None:
        wan.link_connections = world.link_proxy.stats.accepted
        # a re-link may go to the hub's advertised leafnode URL, around the proxy: then the delay was not there
        if world.link_proxy.open_connections < 1 and run.error is None:
            run.error = "the leaf's link no longer runs through the proxy"


def measure(
    options: _Options, point: RttPoint, path: str, size: int, messages: int, max_ack_pending: int, rep: int
) -> WanRun:
    """One measurement on a fresh world; a failure ends up in ``run.error``, naming the kept directory."""
    run = ThroughputRun(path=path, size=size, retention="workqueue", rep=rep, messages=messages)
    wan = WanRun(rtt=point.label, rtt_ms=point.ms, proxied=point.proxied, max_ack_pending=max_ack_pending, run=run)
    rtt = DIRECT if not point.proxied else f"{point.label}ms"
    directory = options.workdir / f"{path}-{rtt}-{size}-m{max_ack_pending}-{rep}-{time.strftime('%H%M%S')}"
    world: _World | None = None
    try:
        world = _World(directory, options.binary, point, target_proxy=path == BRIDGE_EDGE)
        asyncio.run(_measure(world, wan, options, point))
    except Exception as exc:
        run.error = run.error or f"{type(exc).__name__}: {exc}"
    finally:
        if world is not None:
            try:
                world.close()
            except Exception as exc:
                run.error = run.error or f"tearing down: {type(exc).__name__}: {exc}"
    run.ok = run.error is None
    if run.ok and not options.keep:
        shutil.rmtree(directory, ignore_errors=True)
    elif not run.ok:
        run.error = f"{run.error} (logs in {directory})"
    return wan


# Summaries


@dataclass(frozen=True, slots=True)
class PointSummary:
    """Everything measured at one (size, RTT point, max_ack_pending)."""

    size: int
    rtt: str
    rtt_ms: float
    proxied: bool
    max_ack_pending: int
    measured_rtt_ms: float | None  # median over the point's runs
    target_rtt_ms: float | None  # edge runs' target link, median
    native: Spread | None  # msg/s over repetitions
    bridge: Spread | None
    edge: Spread | None
    ratio: Spread | None  # bridge/native of each repetition's pair
    bridge_cpu_s_per_million: Spread | None
    servers_cpu_s_per_million: dict[str, float] = field(default_factory=dict)  # by path, median
    loaded_rtt_ms: dict[str, float] = field(default_factory=dict)  # by path, median of the runs' medians
    proxy_busy_max: float | None = None
    failed_runs: int = 0

    @property
    def ceiling(self) -> float | None:
        """max_ack_pending per round trip: what one window in flight per RTT allows (None without delay)."""
        return self.max_ack_pending / (self.rtt_ms / 1000.0) if self.rtt_ms > 0 else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, with each spread as median/min/max/n."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.as_dict() if isinstance(value, Spread) else value
        out["ceiling"] = self.ceiling
        return out


def _spread_or_none(values: Sequence[float]) -> Spread | None:
    return spread(values) if values else None


def summarize(runs: Sequence[WanRun]) -> list[PointSummary]:
    """Per (size, RTT point, max_ack_pending), in the order first measured: each path's rate over its successful
    repetitions, and bridge/native per repetition where both succeeded."""
    groups: dict[tuple[int, str, int], list[WanRun]] = {}
    for wan in runs:
        groups.setdefault((wan.run.size, wan.rtt, wan.max_ack_pending), []).append(wan)
    out: list[PointSummary] = []
    for (size, rtt, mack), members in groups.items():
        ok = [w for w in members if w.run.ok]

        def rates(path: str, ok: list[WanRun] = ok) -> list[float]:
            return [w.run.msgs_per_s for w in ok if w.run.path == path]

        by_rep: dict[int, dict[str, float]] = {}
        for w in ok:
            by_rep.setdefault(w.run.rep, {})[w.run.path] = w.run.msgs_per_s
        ratios = [r[BRIDGE] / r[NATIVE] for r in by_rep.values() if BRIDGE in r and r.get(NATIVE)]
        measured = [w.measured_rtt_ms for w in ok if w.measured_rtt_ms is not None]
        target = [w.target_rtt_ms for w in ok if w.target_rtt_ms is not None]
        busy = [w.proxy_busy for w in ok if w.proxy_busy is not None]
        servers: dict[str, float] = {}
        loaded: dict[str, float] = {}
        for path in (NATIVE, BRIDGE, BRIDGE_EDGE):
            cpus = [w.run.servers_cpu_s_per_million for w in ok if w.run.path == path]
            if present := [v for v in cpus if v is not None]:
                servers[path] = median(present)
            if rtts := [w.loaded_rtt_ms for w in ok if w.run.path == path and w.loaded_rtt_ms is not None]:
                loaded[path] = median(rtts)
        cpu = [w.run.bridge_cpu_s_per_million for w in ok if w.run.path == BRIDGE]
        out.append(
            PointSummary(
                size=size,
                rtt=rtt,
                rtt_ms=members[0].rtt_ms,
                proxied=members[0].proxied,
                max_ack_pending=mack,
                measured_rtt_ms=median(measured) if measured else None,
                target_rtt_ms=median(target) if target else None,
                native=_spread_or_none(rates(NATIVE)),
                bridge=_spread_or_none(rates(BRIDGE)),
                edge=_spread_or_none(rates(BRIDGE_EDGE)),
                ratio=_spread_or_none(ratios),
                bridge_cpu_s_per_million=_spread_or_none([v for v in cpu if v is not None]),
                servers_cpu_s_per_million=servers,
                loaded_rtt_ms=loaded,
                proxy_busy_max=max(busy) if busy else None,
                failed_runs=len(members) - len(ok),
            )
        )
    return out


def _rate(value: Spread | None) -> str:
    if value is None:
        return "-"
    if value.count == 1:
        return f"{value.median:,.0f}"
    return f"{value.median:,.0f} ({value.low:,.0f}..{value.high:,.0f})"


def _ratio(value: Spread | None) -> str:
    if value is None:
        return "-"
    if value.count == 1:
        return f"{value.median:.2f}"
    return f"{value.median:.2f} ({value.low:.2f}..{value.high:.2f})"


def _opt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


TABLE_COLUMNS = (
    "RTT ms",
    "measured ms",
    "max_ack_pending",
    "window/RTT msg/s",
    "native msg/s",
    "bridge msg/s",
    "bridge/native",
    "edge msg/s",
    "bridge CPU s/1M",
)


def format_table(summaries: Sequence[PointSummary], size: int) -> str:
    """The markdown table of one payload size: a row per RTT point and max_ack_pending, medians (min..max)."""
    rows = [list(TABLE_COLUMNS), ["---"] * len(TABLE_COLUMNS)]
    for s in summaries:
        if s.size != size:
            continue
        rows.append(
            [
                "direct (no proxy)" if not s.proxied else s.rtt,
                _opt(s.measured_rtt_ms, 2),
                f"{s.max_ack_pending:,}",
                _opt(s.ceiling, 0),
                _rate(s.native),
                _rate(s.bridge),
                _ratio(s.ratio),
                _rate(s.edge),
                _opt(s.bridge_cpu_s_per_million.median if s.bridge_cpu_s_per_million else None),
            ]
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def secondary_lines(summaries: Sequence[PointSummary]) -> list[str]:
    """Per point: the link's measured RTT (and the edge target's), the proxy thread's load, the servers' CPU."""
    out = []
    for s in summaries:
        parts = [f"{size_label(s.size)}, RTT {s.rtt if s.proxied else DIRECT}, max_ack_pending {s.max_ack_pending}:"]
        if s.measured_rtt_ms is not None:
            parts.append(f"link RTT {s.measured_rtt_ms:.2f} ms")
        if s.loaded_rtt_ms:
            parts.append(
                "while replicating " + ", ".join(f"{path} {v:.1f}" for path, v in s.loaded_rtt_ms.items()) + " ms"
            )
        if s.target_rtt_ms is not None:
            parts.append(f"edge target RTT {s.target_rtt_ms:.2f} ms")
        if s.proxy_busy_max is not None:
            parts.append(f"proxy thread busy up to {s.proxy_busy_max:.0%}")
        if s.servers_cpu_s_per_million:
            parts.append(
                "hub+leaf CPU s/1M " + ", ".join(f"{path} {v:.1f}" for path, v in s.servers_cpu_s_per_million.items())
            )
        if s.failed_runs:
            parts.append(f"{s.failed_runs} run(s) FAILED")
        out.append("  " + " ".join(parts[:1]) + " " + "; ".join(parts[1:]))
    return out


def write_chart(summaries: Sequence[PointSummary], path: Path) -> Path:
    """Throughput against RTT, a panel per size: native, bridge (and edge) medians with the repetitions' range as
    error bars, one line style per max_ack_pending, the window/RTT ceiling dotted, the direct link as open marks.

    Raises:
        ImportError: matplotlib is not installed (the message says how to get it).
    """
    try:
        # imported by name: matplotlib is optional (the `bench` extra), and type checking must not need it
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt = importlib.import_module("matplotlib.pyplot")
    except ImportError as exc:
        raise ImportError(
            "the chart needs matplotlib: `.venv/bin/pip install matplotlib` (or the `bench` extra)"
        ) from exc
    sizes = list(dict.fromkeys(s.size for s in summaries))
    windows = list(dict.fromkeys(s.max_ack_pending for s in summaries))
    styles = ["-", "--", "-.", ":"]
    colors = {NATIVE: "#4c72b0", BRIDGE: "#dd8452", BRIDGE_EDGE: "#55a868"}
    fig, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 5), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        top = 0.0
        for i, window in enumerate(windows):
            points = [s for s in summaries if s.size == size and s.max_ack_pending == window]
            delayed = sorted((s for s in points if s.proxied), key=lambda s: s.rtt_ms)
            for name in (NATIVE, BRIDGE, BRIDGE_EDGE):
                line = [(s.rtt_ms, getattr(s, "edge" if name == BRIDGE_EDGE else name)) for s in delayed]
                line = [(x, v) for x, v in line if v is not None]
                label = f"{name} (max_ack_pending {window:,})" if len(windows) > 1 else name
                if line:
                    ys = [v.median for _, v in line]
                    err = [[v.median - v.low for _, v in line], [v.high - v.median for _, v in line]]
                    ax.errorbar(
                        [x for x, _ in line],
                        ys,
                        yerr=err,
                        color=colors[name],
                        linestyle=styles[i % len(styles)],
                        marker="o",
                        capsize=3,
                        label=label,
                    )
                    top = max(top, *(v.high for _, v in line))
                for s in points:
                    direct = getattr(s, "edge" if name == BRIDGE_EDGE else name)
                    if not s.proxied and direct is not None:
                        ax.plot([0], [direct.median], marker="s", markerfacecolor="none", color=colors[name])
                        top = max(top, direct.high)
            longest = max((s.rtt_ms for s in delayed), default=0.0)
            if longest > 0:
                # the hyperbola over the whole axis (clipped by the y limit), not just at the measured points
                xs = [longest * k / 100 for k in range(1, 101)]
                ax.plot(
                    xs,
                    [window / (x / 1000) for x in xs],
                    color="grey",
                    linestyle=styles[i % len(styles)],
                    linewidth=0.8,
                    label=f"max_ack_pending / RTT ({window:,})",
                )
        if any(not s.proxied for s in summaries if s.size == size):
            ax.plot([], [], marker="s", markerfacecolor="none", color="black", linestyle="", label="direct link")
        ax.set_ylim(0, top * 1.3 if top > 0 else 1)
        ax.set_xlabel("edge-hub round trip (nominal), ms")
        ax.set_ylabel("msg/s")
        ax.set_title(f"{size_label(size)} WorkQueue")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("bench wan: throughput against RTT (median, range over repetitions)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# The command


def _describe(wan: WanRun) -> str:
    run = wan.run
    link = f"link RTT {wan.measured_rtt_ms:.1f} ms" if wan.measured_rtt_ms is not None else "link RTT -"
    if wan.loaded_rtt_ms is not None:
        link += f" ({wan.loaded_rtt_ms:.1f} loaded)"
    if wan.target_rtt_ms is not None:
        link += f", target RTT {wan.target_rtt_ms:.1f} ms"
    if not run.ok:
        return f"{link}; FAILED: {run.error}"
    text = f"{link}; {run.msgs_per_s:,.0f} msg/s ({run.mb_per_s:.1f} MB/s) over {run.seconds:.2f} s"
    text += f", start-up {run.startup_s:.2f} s"
    if run.bridge_cpu_s_per_million is not None:
        text += f", bridge CPU {run.bridge_cpu_s_per_million:.1f} s/1M"
    if wan.proxy_busy is not None:
        text += f", proxy busy {wan.proxy_busy:.0%}"
    if run.path != NATIVE:
        text += f"; {run.bridge_mode or 'unknown'} mode"
        if run.bridge_warnings:
            text += ", log warnings: " + ", ".join(f"{name} x{n}" for name, n in run.bridge_warnings.items())
    return text


def _settings(args: argparse.Namespace) -> dict[str, str]:
    settings: dict[str, str] = {}
    if args.publish_window is not None:
        settings["target.publish_window"] = str(args.publish_window)
    if args.silence_timeout is not None:
        settings["engine.silence_timeout"] = repr(float(args.silence_timeout))
    for key, value in args.set:
        settings[key] = value
    return settings


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code (0: every measurement worked, 1: one failed, 2: bad options)."""
    quick: bool = args.quick
    points: tuple[RttPoint, ...] = args.rtts or parse_rtts(QUICK_RTTS if quick else DEFAULT_RTTS)
    sizes: tuple[int, ...] = args.sizes or ((256,) if quick else DEFAULT_SIZES)
    reps: int = args.reps if args.reps is not None else (1 if quick else 2)
    edge: bool = args.edge if args.edge is not None else not quick
    windows: tuple[int, ...] = args.max_ack_pending
    if isinstance(args.messages, int):
        messages = {size: args.messages for size in sizes}
    else:
        given: dict[int, int] = args.messages or {}
        messages = {size: given.get(size, default_messages(size, quick)) for size in sizes}
    if reps < 1 or args.probes < 1:
        print("bench wan: --reps and --probes must be >= 1", file=sys.stderr)
        return 2
    settings = _settings(args)
    try:
        binary = find_nats_server()
        version = server_version(binary)
    except ServerStartError as exc:
        print(f"bench wan: {exc}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="nats-bridge-bench-wan-"))
    sample = wan_bridge_config("nats://HUB:4222", "nats://LEAF:4222", "sidecar", windows[0], args.mode, settings)
    if (problem := check_config(sample, workdir)) is not None:
        print(f"bench wan: the bridge would refuse these settings: {problem}", file=sys.stderr)
        shutil.rmtree(workdir, ignore_errors=True)
        return 2

    paths: tuple[str, ...] = args.paths or ((NATIVE, BRIDGE, BRIDGE_EDGE) if edge else (NATIVE, BRIDGE))
    options = _Options(
        workdir=workdir, binary=binary, mode=args.mode, settings=settings, probes=args.probes, keep=args.keep
    )
    command = "python -m bench " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    started = dt.datetime.now(dt.UTC)
    revision = git_revision(REPO_ROOT)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    info = machine()
    info["loadavg_start"] = loadavg()
    total = len(sizes) * len(points) * len(windows) * reps * len(paths)
    print(f"bench wan: {command}", flush=True)
    print(
        f"  nats-server {version}; {info['nproc']} CPUs, load average {info['loadavg_start']}; RTTs "
        f"{', '.join(p.label for p in points)} ms; sizes {', '.join(size_label(s) for s in sizes)}; messages "
        f"{', '.join(f'{messages[s]:,}' for s in sizes)}; max_ack_pending {', '.join(map(str, windows))}; "
        f"{reps} rep(s); paths {', '.join(paths)}",
        flush=True,
    )
    if settings:
        print("  bridge settings: " + ", ".join(f"{k} = {v}" for k, v in settings.items()), flush=True)
    print(
        f"  {revision_text(revision)}; {total} measurements, each on a fresh hub + leaf under {workdir}",
        flush=True,
    )
    runs: list[WanRun] = []
    t0 = time.monotonic()
    try:
        for size in sizes:
            for point in points:
                for window in windows:
                    for rep in range(1, reps + 1):
                        for path in paths:
                            began = time.monotonic()
                            wan = measure(options, point, path, size, messages[size], window, rep)
                            runs.append(wan)
                            now = time.monotonic()
                            rtt = DIRECT if not point.proxied else f"{point.label} ms"
                            print(
                                f"[{len(runs):>3}/{total}] {now - t0:6.0f}s  {size_label(size)} RTT {rtt} "
                                f"M {window} rep {rep} {path}: {_describe(wan)}  ({now - began:.0f} s)",
                                flush=True,
                            )
    except KeyboardInterrupt:
        print("bench wan: interrupted; nothing written", file=sys.stderr)
        return 130
    finally:
        if not args.keep and workdir.exists() and not any(workdir.iterdir()):
            shutil.rmtree(workdir, ignore_errors=True)

    summaries = summarize(runs)
    print()
    for size in sizes:
        print(f"### {size_label(size)}, WorkQueue origin, {messages[size]:,} messages per run\n")
        print(format_table(summaries, size))
        print()
    for line in secondary_lines(summaries):
        print(line)

    end = git_revision(REPO_ROOT)
    revision["at_end"] = end
    if end["bridge_sha256"] != revision["bridge_sha256"]:
        revision["bridge_changed_during_run"] = True
        print(
            f"WARNING: bridge/ changed during the run (commit {revision['commit']} -> {end['commit']}): "
            "measurements may mix two versions of the bridge",
            file=sys.stderr,
        )
    document: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "machine": {**info, "loadavg_end": loadavg()},
        "revision": revision,
        "server_version": version,
        "settings": {
            "quick": quick,
            "rtts": [dataclasses.asdict(p) for p in points],
            "sizes": list(sizes),
            "messages": {str(k): v for k, v in messages.items()},
            "reps": reps,
            "max_ack_pending": list(windows),
            "paths": list(paths),
            "mode": args.mode,
            "bridge_settings": settings,
            "probes": args.probes,
            "native_consumer": ops.native_consumer_config(windows[0]),
            "native_aggregate": ops.aggregate_config(native=True),
            "bridge_config": sample,
        },
        "runs": [w.as_dict() for w in runs],
        "summary": [s.as_dict() for s in summaries],
    }
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"wan-{stamp}.json"
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nJSON  {rel(json_path)}")
    try:
        print(f"chart {rel(write_chart(summaries, out / f'wan-{stamp}.png'))}")
    except ImportError as exc:
        print(f"chart skipped: {exc}", file=sys.stderr)
    failures = [w for w in runs if not w.run.ok]
    if failures:
        print(f"\n{len(failures)} measurement(s) failed:", file=sys.stderr)
        for w in failures:
            print(
                f"  {w.run.path} {size_label(w.run.size)} RTT {w.rtt} rep {w.run.rep}: {w.run.error}", file=sys.stderr
            )
        return 1
    return 0
