"""``python -m bench thin``: the bridge across a thin link (issue 29, point 3), tried as a user would.

One hub (JetStream domain ``hub``, the aggregate ``AGG`` capturing ``edge.>``) and one leaf (domain ``leaf``) whose
leafnode remote runs through a :class:`chaos.proxy.FaultProxy` letting ``--link`` bytes per second through each way
(50 kbit/s = 6,250 B/s by default: a satellite or cellular link). The hub does not advertise its leafnode URL
(``no_advertise``), so a leaf that loses its link can only come back through the proxy::

    bench (producer) ─► leaf (ORIGIN_00 ..) ── proxy, --link B/s each way ──► hub (AGG) ◄─ bridge (sidecar)

``--sources`` WorkQueue origin streams on the leaf (``ORIGIN_00`` capturing ``o.00.>``) and one bridge process in the
sidecar position: connected to the hub only, each source reaching the leaf's JetStream by its ``domain`` (so its
consumer's deliveries, heartbeats and flow control all cross the thin link), ``subject_prefix`` ``edge.s00``,
``rate_limit`` ``--rate-limit``; leases and everything else the bridge's defaults. One run, in order:

1. **start-up**: first a window with no bridge (as long as the idle one, at most 10 s: the link's own bytes, its
   keep-alives), then spawn to every source's first ``reset.done`` / ``consumer.resumed`` (the link's bytes
   meanwhile are recorded too);
2. **traffic**: every source gets ``--rate`` msg/s of ``--size`` bytes for ``--seconds`` (published to the leaf
   directly); halfway the link is cut once (``proxy.cut()``: both sides reset), the producer going on, and the leaf
   re-links through the proxy (the time it takes is recorded);
3. the **drain**: every copy stored (a deadline, and a stall limit); the bytes the link carried both ways from the
   first publish to here, against the payload bytes published (the overhead factor);
4. **idle**: ``--idle`` seconds with nothing to replicate: bytes through the proxy both ways per second, per source,
   and per source per day (MiB): the heartbeats and flow control an idle source costs (the link's own PINGs
   included, shared by the sources);
5. SIGTERM (it must exit 0); every copy read back: per source the copies' ``Bridge-Seq`` in aggregate order must be
   exactly ``1 .. published``; from the bridge's JSON log, ``reset.requested`` / ``resync.requested`` whose cause is
   not ``start``, ``source.stalled``, and ``origin.*`` / ``target.*`` disconnects and reconnects.

Issue 29's claims are checked, and a run that breaks one fails (exit code 1): nothing lost, duplicated or reordered;
no reset storm (at most :data:`MAX_UNPLANNED_RESETS` resets not caused by the start); no stall alarm; no reconnect
loop (the leaf re-links once per cut, the bridge reconnects at most once per connection); SIGTERM exits 0. The byte
figures are reported, not judged. Figures are printed, written as JSON (``--out``) and as markdown for
bench/RESULTS.md. Every wait has a deadline; every process is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from bench import natsops as ops
from bench.common import Report, Session, check_config, execute_trial, run_command, sigterm_problem
from bench.edge import SequenceCheck, check_sequences, close_client, positive_float, positive_int, produce
from bench.fanin import (
    BridgeLog,
    Production,
    SourceNames,
    Target,
    create_origins,
    format_targets,
    markdown,
    source_names,
)
from bench.procs import revision_text
from bench.wan import _ProxyLoop
from bridge.config.validators import parse_rate
from bridge.core import headers
from bridge.testing.configs import SourceSpec, toml_value
from bridge.testing.processes import BridgeProcess
from bridge.testing.servers import NatsServer, Topology
from chaos.proxy import FaultProxy

DEFAULT_LINK = "50kbit"
DEFAULT_RATE_LIMIT = "1KiB"
DEFAULT_SOURCES = 5
DEFAULT_RATE = 1.0
DEFAULT_SIZE = 200
DEFAULT_SECONDS = 60.0
DEFAULT_IDLE = 30.0
QUICK_SOURCES = 2
QUICK_SECONDS = 10.0
QUICK_IDLE = 5.0

HUB_DOMAIN = "hub"
LEAF_DOMAIN = "leaf"
MAX_FILE_STORE = "64GB"  # a limit, not an allocation
SERVER_READY_TIMEOUT = 30.0
LINK_DEADLINE = 60.0  # the first link: its handshake and the interest it carries cross the thin link
RELINK_DEADLINE = 60.0  # after the cut
STARTUP_DEADLINE = 120.0  # every source bound
DRAIN_DEADLINE = 180.0  # after the last publish, every copy stored
STALL_SECONDS = 60.0  # no new copy for this long fails the run
BRIDGE_STOP_TIMEOUT = 60.0
LOG_POLL = 0.2
BASELINE_SECONDS = 10.0  # the link with no bridge, before it starts
MAX_UNPLANNED_RESETS = 2  # as tests/integration/test_thin_link.py allows: more is a reset storm
MAX_BRIDGE_RECONNECTS = 1  # per connection event kind: more is a reconnect loop
RECONNECT_EVENTS = ("origin.disconnected", "origin.reconnected", "target.disconnected", "target.reconnected")
STALL_EVENT = "source.stalled"
CLAIMS_TITLE = "issue 29's claims (judged: one NOT met fails the run) and figures (reported):"
MIB = 1024 * 1024
DAY = 86_400


# Names and configuration (pure)


def thin_sources(count: int) -> list[SourceNames]:
    """Names for sources ``0 .. count-1``: ``s00``, ``ORIGIN_00`` capturing ``o.00.>``, copies under ``edge.s00``
    (two digits at least, more when there are more than 100)."""
    return source_names(count, min_width=2)


def thin_config(hub_url: str, sources: Sequence[SourceNames], rate_limit: str) -> str:
    """The bridge's configuration as a user writes it: JSON logs, an HTTP listener on a free port, the aggregate on
    the hub, and per source its name, the hub as its server, the leaf's ``domain``, its origin stream, its
    ``subject_prefix`` and ``rate_limit``; the bridge's defaults everywhere else (leases included)."""
    lines = [
        "# written by `python -m bench thin`",
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
    for names in sources:
        spec = SourceSpec(
            name=names.source,
            servers=hub_url,
            stream=names.stream,
            domain=LEAF_DOMAIN,
            subject_prefix=names.prefix,
        )
        spec.extra["rate_limit"] = rate_limit
        lines += ["", "[[sources]]", *(f"{key} = {toml_value(value)}" for key, value in spec.table().items())]
    return "\n".join(lines) + "\n"


def parse_link_rate(text: str) -> int:
    """``50kbit``, ``6250``, ``8KiB/s`` -> bytes per second (the bridge's own rate syntax), at least 1."""
    try:
        value = parse_rate(text.strip())
    except ValueError as exc:  # pydantic's custom error is a ValueError; its message says what is wrong
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a rate of at least one byte per second, not {text!r}")
    return value


def per_day_mib(bytes_per_s: float) -> float:
    """A steady rate as MiB a day."""
    return bytes_per_s * DAY / MIB


# One run's figures


@dataclass(slots=True)
class ThinRun:
    """Everything one run measured."""

    sources: int
    rate: float
    seconds: float
    size: int
    idle: float
    link: str  # as given
    link_bytes_per_s: int
    rate_limit: str
    loadavg: str = ""
    baseline_s: float | None = None  # the link with no bridge yet: its own keep-alives
    baseline_bytes: int | None = None  # both ways over that window
    startup_s: float | None = None  # spawn to every source bound
    startup_link_bytes: int | None = None  # both ways over the start-up
    phase1: Production | None = None
    phase2: Production | None = None
    published: int = 0
    payload_bytes: int = 0
    cut_connections: int | None = None  # connections the cut aborted (1: the leaf's link)
    relink_s: float | None = None  # from the cut to the link up again through the proxy, JetStream API included
    drain_s: float | None = None  # from the last publish acked to the last copy stored
    traffic_s: float | None = None  # from the first publish to the last copy stored
    traffic_bytes_up: int | None = None  # leaf -> hub over that window
    traffic_bytes_down: int | None = None  # hub -> leaf
    idle_s: float | None = None
    idle_bytes_up: int | None = None
    idle_bytes_down: int | None = None
    link_connections: int | None = None  # connections the proxy accepted over the run (2: the first, the re-link)
    link_through_proxy: bool | None = None  # the leaf's link still runs through the proxy at the end
    unplanned_resets: dict[str, int] = field(default_factory=dict)  # by cause, every cause but "start"
    stalls: int | None = None  # source.stalled lines
    stalled_sources: list[str] = field(default_factory=list)
    reconnects: dict[str, int] = field(default_factory=dict)  # RECONNECT_EVENTS lines
    modes: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)  # warning and error lines by event
    check: SequenceCheck | None = None
    bridge_exit_code: int | None = None
    directory: str = ""
    ok: bool = False
    error: str | None = None

    @property
    def traffic_bytes(self) -> int | None:
        if self.traffic_bytes_up is None or self.traffic_bytes_down is None:
            return None
        return self.traffic_bytes_up + self.traffic_bytes_down

    @property
    def overhead(self) -> float | None:
        """Link bytes (both ways) during the traffic per payload byte published."""
        total = self.traffic_bytes
        return None if total is None or not self.payload_bytes else total / self.payload_bytes

    @property
    def idle_bytes_per_s(self) -> float | None:
        if self.idle_s is None or self.idle_bytes_up is None or self.idle_bytes_down is None:
            return None
        return (self.idle_bytes_up + self.idle_bytes_down) / self.idle_s

    @property
    def idle_bytes_per_s_per_source(self) -> float | None:
        total = self.idle_bytes_per_s
        return None if total is None else total / self.sources

    @property
    def baseline_bytes_per_s(self) -> float | None:
        return None if self.baseline_s is None or self.baseline_bytes is None else self.baseline_bytes / self.baseline_s

    @property
    def bridge_reconnects(self) -> int:
        return sum(self.reconnects.get(name, 0) for name in RECONNECT_EVENTS if name.endswith(".reconnected"))

    def claims(self) -> list[str]:
        """Issue 29's claims this run broke (empty: none)."""
        out = []
        if self.check is not None and not self.check.ok:
            out.append(f"aggregate check failed: {self.check.summary()}")
        resets = sum(self.unplanned_resets.values())
        if resets > MAX_UNPLANNED_RESETS:
            out.append(f"a reset storm: {resets} resets not caused by the start ({self.unplanned_resets})")
        if self.stalls:
            out.append(f"{self.stalls} stall alarm(s) ({STALL_EVENT}: {', '.join(self.stalled_sources)})")
        loops = {n: k for n, k in self.reconnects.items() if k > MAX_BRIDGE_RECONNECTS}
        if loops:
            out.append(f"a reconnect loop in the bridge: {loops}")
        cuts = self.cut_connections or 0
        if self.link_connections is not None and self.link_connections > 1 + cuts:
            out.append(f"a reconnect loop on the link: {self.link_connections} connections for {cuts} cut(s)")
        if self.link_through_proxy is False:
            out.append("the leaf's link no longer runs through the proxy")
        return out

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.as_dict() if isinstance(value, Production | SequenceCheck) else value
        out.update(
            traffic_bytes=self.traffic_bytes,
            overhead=self.overhead,
            baseline_bytes_per_s=self.baseline_bytes_per_s,
            idle_bytes_per_s=self.idle_bytes_per_s,
            idle_bytes_per_s_per_source=self.idle_bytes_per_s_per_source,
            idle_mib_per_day_per_source=(
                None if self.idle_bytes_per_s_per_source is None else per_day_mib(self.idle_bytes_per_s_per_source)
            ),
        )
        return out


class ThinLog(BridgeLog):
    """Fan-in's log follower, also counting every event by name and naming the sources that stalled."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.counts: dict[str, int] = {}
        self.stalled: list[str] = []

    def feed(self, event: Mapping[str, Any]) -> None:
        super().feed(event)
        name = str(event.get("event", ""))
        self.counts[name] = self.counts.get(name, 0) + 1
        if name == STALL_EVENT:
            self.stalled.append(str(event.get("source", "?")))


# The servers and the link


class _Hub(NatsServer):
    """A hub that does not advertise its leafnode URL: a leaf that lost its link knows only its remote (the proxy)
    and comes back through it, never around it."""

    def config_text(self) -> str:
        return super().config_text().replace("leafnodes {\n", "leafnodes {\n  no_advertise: true\n", 1)


class _LinkLoop(_ProxyLoop):
    """bench wan's proxy thread, with a throttled proxy and a cut made on the proxies' own loop."""

    def throttled(self, upstream_port: int, name: str, bytes_per_s: int) -> FaultProxy:
        """A listening proxy to 127.0.0.1:``upstream_port`` letting ``bytes_per_s`` through each way."""
        proxy = self.add(upstream_port, name, 0.0)

        async def limit() -> None:
            proxy.set_rate(bytes_per_s)

        self._call(limit())
        return proxy

    def cut(self, proxy: FaultProxy) -> int:
        """Abort every connection ``proxy`` forwards, now; how many there were."""

        async def cut() -> int:
            return proxy.cut()

        return self._call(cut())


class _Servers:
    """The hub, the proxy thread and the leaf, under ``directory``; every server stopped by its PID in :meth:`stop`."""

    def __init__(self, directory: Path, binary: str, link_bytes_per_s: int) -> None:
        self.directory = directory
        self.binary = binary
        self.link_bytes_per_s = link_bytes_per_s
        self.hub = _Hub(
            directory / "hub",
            name="hub",
            binary=binary,
            domain=HUB_DOMAIN,
            leafnode_listen=True,
            max_file_store=MAX_FILE_STORE,
        )
        self.loop: _LinkLoop | None = None
        self.proxy: FaultProxy | None = None
        self.leaf: NatsServer | None = None

    @property
    def link(self) -> FaultProxy:
        assert self.proxy is not None
        return self.proxy

    @property
    def topology(self) -> Topology:
        assert self.leaf is not None
        return Topology(self.hub, self.leaf)

    def start(self) -> None:
        self.loop = _LinkLoop()
        self.hub.start()
        self.hub.wait_ready(SERVER_READY_TIMEOUT)
        assert self.hub.leafnode_port is not None
        self.proxy = self.loop.throttled(self.hub.leafnode_port, "thin-link", self.link_bytes_per_s)
        self.leaf = NatsServer(
            self.directory / "leaf",
            name="leaf",
            binary=self.binary,
            domain=LEAF_DOMAIN,
            leaf_remotes=[f"nats-leaf://127.0.0.1:{self.proxy.port}"],
            max_file_store=MAX_FILE_STORE,
        )
        self.leaf.start()
        self.leaf.wait_ready(SERVER_READY_TIMEOUT)
        self.topology.wait_linked(LINK_DEADLINE)

    def link_bytes(self) -> tuple[int, int]:
        """Bytes the link has carried so far: (leaf -> hub, hub -> leaf)."""
        stats = self.link.stats
        return stats.bytes_up, stats.bytes_down

    def stop(self) -> None:
        """The leaf, the hub, then the proxies (so the leaf never sees its link cut first)."""
        try:
            if self.leaf is not None:
                self.leaf.stop()
        finally:
            try:
                self.hub.stop()
            finally:
                if self.loop is not None:
                    self.loop.close()


# One run


class _Run:
    """One run's servers, bridge and figures."""

    def __init__(self, run: ThinRun, directory: Path, binary: str) -> None:
        self.run = run
        self.directory = directory
        self.sources = thin_sources(run.sources)
        self.servers = _Servers(directory / "servers", binary, run.link_bytes_per_s)
        self.bridge: BridgeProcess | None = None
        self.log = ThinLog(directory / "bridge.log")
        self.published: dict[str, int] = {s.source: 0 for s in self.sources}

    def _failure(self) -> str | None:
        if self.bridge is None or self.bridge.is_running:
            return None
        return f"bridge exited early; log tail:\n{self.bridge.tail(15)}"

    def _alive(self) -> None:
        if (reason := self._failure()) is not None:
            raise ops.BenchError(reason)

    def execute(self) -> None:
        run = self.run

        def cleanup() -> None:
            if self.bridge is not None:
                self.bridge.cleanup()

        def verdict() -> str | None:
            if (problem := sigterm_problem(run.bridge_exit_code)) is not None:
                return problem
            broken = run.claims()
            return "; ".join(broken) if broken else None

        execute_trial(
            run, self._main, start=self.servers.start, stop=self.servers.stop, cleanup=cleanup, verdict=verdict
        )
        run.directory = str(self.directory)
        if not run.ok:
            run.error = f"{run.error} (logs in {self.directory})"

    async def _main(self) -> None:
        assert self.servers.leaf is not None
        hub = await ops.connect(self.servers.hub.url, "bench thin hub")
        leaf = await ops.connect(self.servers.leaf.url, "bench thin leaf")
        try:
            await create_origins(leaf, self.sources)
            await ops.create_aggregate(hub, native=False)
            await self._baseline()
            await self._start_bridge()
            await self._traffic(hub, leaf)
            await self._idle()
            await self._finish(hub)
        finally:
            self._collect_log()
            for nc in (hub, leaf):
                await close_client(nc)

    async def _baseline(self) -> None:
        """The link's own bytes with no bridge yet (the servers' keep-alives), over a window as long as the idle
        one, at most :data:`BASELINE_SECONDS`."""
        run = self.run
        up0, down0 = self.servers.link_bytes()
        began = time.monotonic()
        await asyncio.sleep(min(run.idle, BASELINE_SECONDS))  # the measurement's window, not a wait for a condition
        up, down = self.servers.link_bytes()
        run.baseline_s = time.monotonic() - began
        run.baseline_bytes = up - up0 + down - down0

    async def _start_bridge(self) -> None:
        run = self.run
        config = self.directory / "bridge.toml"
        config.write_text(thin_config(self.servers.hub.url, self.sources, run.rate_limit))
        up0, down0 = self.servers.link_bytes()
        spawned_ns = time.time_ns()
        spawned = time.monotonic()
        self.bridge = BridgeProcess(config, self.directory / "bridge.log").start()
        while len(self.log.ready_ns) < len(self.sources):
            self.log.poll()
            self._alive()
            if time.monotonic() - spawned > STARTUP_DEADLINE:
                raise ops.BenchError(
                    f"{len(self.log.ready_ns)} of {len(self.sources)} sources bound after {STARTUP_DEADLINE:g}s"
                )
            await asyncio.sleep(LOG_POLL)
        run.startup_s = (max(self.log.ready_ns.values()) - spawned_ns) / 1e9
        up, down = self.servers.link_bytes()
        run.startup_link_bytes = up - up0 + down - down0
        run.modes = self.log.mode_counts()

    async def _produce(self, leaf: Client, seconds: float) -> Production:
        routes = [(s.subject, 0) for s in self.sources]
        production, counts = await asyncio.wait_for(
            produce([leaf], routes, self.run.rate, seconds, self.run.size), seconds * 2 + 120.0
        )
        for i, n in counts.items():
            self.published[self.sources[i].source] += n
        self._alive()
        return production

    def _wait_relinked(self, accepted: int) -> float:
        """Block until the leaf has connected through the proxy again (more than ``accepted`` connections) and the
        link is up on both ends, JetStream API included; seconds from the call."""
        began = time.monotonic()
        while self.servers.link.stats.accepted <= accepted:
            if time.monotonic() - began > RELINK_DEADLINE:
                raise ops.BenchError(f"the leaf did not re-link through the proxy within {RELINK_DEADLINE:g}s")
            time.sleep(0.05)
        self.servers.topology.wait_linked(max(0.1, RELINK_DEADLINE - (time.monotonic() - began)))
        return time.monotonic() - began

    async def _traffic(self, hub: Client, leaf: Client) -> None:
        """The production, the cut halfway, the drain; the link's bytes over it all."""
        run, servers = self.run, self.servers
        assert servers.loop is not None
        up0, down0 = servers.link_bytes()
        began = time.monotonic()
        half = run.seconds / 2
        run.phase1 = await self._produce(leaf, half)
        accepted = servers.link.stats.accepted
        run.cut_connections = servers.loop.cut(servers.link)
        relink = asyncio.create_task(asyncio.to_thread(self._wait_relinked, accepted))
        try:
            run.phase2 = await self._produce(leaf, half)
        finally:
            run.relink_s = await relink  # bounded by RELINK_DEADLINE
        produced = time.monotonic()
        run.published = sum(self.published.values())
        run.payload_bytes = run.published * run.size
        await ops.wait_for_count(hub, run.published, deadline=DRAIN_DEADLINE, stall=STALL_SECONDS, alive=self._failure)
        done = time.monotonic()
        up, down = servers.link_bytes()
        run.drain_s = done - produced
        run.traffic_s = done - began
        run.traffic_bytes_up, run.traffic_bytes_down = up - up0, down - down0

    async def _idle(self) -> None:
        run = self.run
        up0, down0 = self.servers.link_bytes()
        began = time.monotonic()
        await asyncio.sleep(run.idle)  # the measurement's window, not a wait for a condition
        up, down = self.servers.link_bytes()
        run.idle_s = time.monotonic() - began
        run.idle_bytes_up, run.idle_bytes_down = up - up0, down - down0
        self._alive()

    def _collect_log(self) -> None:
        run = self.run
        self.log.poll()
        run.unplanned_resets = self.log.unplanned_resets()
        run.stalls = self.log.counts.get(STALL_EVENT, 0)
        run.stalled_sources = sorted(set(self.log.stalled))
        run.reconnects = {name: self.log.counts.get(name, 0) for name in RECONNECT_EVENTS}
        run.warnings = dict(sorted(self.log.warnings.items()))

    async def _finish(self, hub: Client) -> None:
        """The link's state, SIGTERM, the log, the aggregate read back and checked."""
        run = self.run
        assert self.bridge is not None
        run.link_connections = self.servers.link.stats.accepted
        run.link_through_proxy = self.servers.link.open_connections >= 1
        try:
            run.bridge_exit_code = await asyncio.to_thread(self.bridge.stop, BRIDGE_STOP_TIMEOUT)
        except TimeoutError as exc:
            run.bridge_exit_code = -9
            run.error = str(exc)
        self._collect_log()
        state = await ops.stream_state(hub, ops.AGGREGATE)
        stored = await ops.read_stored(hub, state.first_seq, state.messages, timeout=max(60.0, state.messages / 500))
        pairs = [(copy.headers.get(headers.SOURCE, "?"), int(copy.headers.get(headers.SEQ, "0"))) for copy in stored]
        run.check = check_sequences(pairs, self.published)


def measure(run: ThinRun, *, workdir: Path, binary: str) -> ThinRun:
    """One run on fresh servers in a directory below ``workdir``; a failed one carries its reason."""
    directory = workdir / f"thin-{run.sources}-{time.strftime('%H%M%S')}"
    directory.mkdir(parents=True, exist_ok=True)
    _Run(run, directory, binary).execute()
    return run


# Output (pure)


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counts.items() if n) or "none"


def targets(run: ThinRun) -> list[Target]:
    """Each figure next to issue 29's claim (judged) or as a figure (reported)."""
    out: list[Target] = []
    if run.startup_s is not None:
        out.append(
            Target(
                "start-up: spawn to every source bound",
                "-",
                f"{run.startup_s:.1f} s; {run.startup_link_bytes or 0:,} B on the link meanwhile",
                "reported",
            )
        )
    if run.traffic_bytes is not None:
        out.append(
            Target(
                "link bytes during the traffic (both ways) per payload byte",
                "-",
                f"x{run.overhead or 0:.2f}: {run.traffic_bytes:,} B ({run.traffic_bytes_up:,} up, "
                f"{run.traffic_bytes_down:,} down) over {run.traffic_s or 0:.1f} s for {run.payload_bytes:,} B of "
                f"payload ({run.published:,} messages); the cut and the re-link included",
                "reported",
            )
        )
    if run.relink_s is not None:
        out.append(
            Target(
                "the cut: link back through the proxy",
                "-",
                f"{run.relink_s:.1f} s ({run.cut_connections} connection cut); drain after the last publish "
                f"{_num(run.drain_s, 1)} s",
                "reported",
            )
        )
    per_source = run.idle_bytes_per_s_per_source
    if per_source is not None and run.idle_bytes_per_s is not None:
        out.append(
            Target(
                "idle link: heartbeats and flow control, both ways",
                "-",
                f"{per_source:,.0f} B/s per source = {per_day_mib(per_source):,.1f} MiB a day per source "
                f"({run.idle_bytes_per_s:,.0f} B/s in all: {run.idle_bytes_up or 0:,} B up, "
                f"{run.idle_bytes_down or 0:,} B down over {run.idle_s or 0:.1f} s; the link alone, before the bridge: "
                f"{_num(run.baseline_bytes_per_s, 1)} B/s over {_num(run.baseline_s, 1)} s)",
                "reported",
            )
        )
    if run.stalls is not None:
        resets = sum(run.unplanned_resets.values())
        out.append(
            Target(
                "no reset storm: resets not caused by the start",
                f"<= {MAX_UNPLANNED_RESETS}",
                f"{resets} ({_counts(run.unplanned_resets)})",
                _verdict(resets <= MAX_UNPLANNED_RESETS),
            )
        )
        out.append(
            Target(
                f"no stall alarm while progress is steady ({STALL_EVENT})",
                "0",
                str(run.stalls) + (f" ({', '.join(run.stalled_sources)})" if run.stalled_sources else ""),
                _verdict(run.stalls == 0),
            )
        )
        worst = max(run.reconnects.values(), default=0)
        out.append(
            Target(
                "no reconnect loop in the bridge (origin / target disconnects, reconnects)",
                f"<= {MAX_BRIDGE_RECONNECTS} each",
                _counts(run.reconnects),
                _verdict(worst <= MAX_BRIDGE_RECONNECTS),
            )
        )
    if run.link_connections is not None:
        cuts = run.cut_connections or 0
        through = "" if run.link_through_proxy else "; the link no longer runs through the proxy"
        out.append(
            Target(
                "no reconnect loop on the link: connections through the proxy",
                f"<= {1 + cuts}",
                f"{run.link_connections} ({cuts} cut){through}",
                _verdict(run.link_connections <= 1 + cuts and bool(run.link_through_proxy)),
            )
        )
    if run.check is not None:
        out.append(
            Target("nothing lost, duplicated or reordered", "0 / 0 / 0", run.check.summary(), _verdict(run.check.ok))
        )
    if run.bridge_exit_code is not None:
        out.append(Target("SIGTERM exit code", "0", str(run.bridge_exit_code), _verdict(run.bridge_exit_code == 0)))
    if run.warnings:
        out.append(Target("bridge log warnings and errors", "-", _counts(run.warnings), "reported"))
    if not run.ok:
        out.append(Target("run", "ok", f"FAILED: {run.error}", "NOT met"))
    return out


FIGURES_HEADER = (
    "| run | sources | link B/s | payload B | link B in traffic (up / down) | overhead x | idle B/s per source "
    "| idle MiB/day per source | resets (not start) | stall alarms | reconnects: link / bridge | exact | SIGTERM "
    "| wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def figures_row(label: str, run: ThinRun, wall_s: float) -> str:
    """One markdown row of the figures table."""
    per_source = run.idle_bytes_per_s_per_source
    relinks = "-" if run.link_connections is None else str(max(0, run.link_connections - 1))
    cells = [
        label,
        str(run.sources),
        f"{run.link_bytes_per_s:,}",
        f"{run.payload_bytes:,}",
        "-"
        if run.traffic_bytes is None
        else f"{run.traffic_bytes:,} ({run.traffic_bytes_up:,} / {run.traffic_bytes_down:,})",
        _num(run.overhead, 2),
        _num(per_source, 0),
        "-" if per_source is None else f"{per_day_mib(per_source):.1f}",
        str(sum(run.unplanned_resets.values())),
        _num(run.stalls),
        f"{relinks} / {run.bridge_reconnects}",
        "-" if run.check is None else ("ok" if run.check.ok else run.check.summary()),
        "-" if run.bridge_exit_code is None else str(run.bridge_exit_code),
        f"{wall_s:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


# The command


def parser(sub: Any) -> None:
    """Add the ``thin`` subcommand to ``python -m bench``."""
    p = sub.add_parser(
        "thin",
        help="a thin link (50 kbit/s) between leaf and hub: steady traffic, a cut, the idle overhead per source",
        description="One leaf whose leafnode link to the hub runs through a throttling proxy, a bridge beside the "
        "hub, steady traffic with the link cut once halfway: exactness, resets, stall alarms, reconnects, and the "
        "link's bytes per payload byte and per idle source per day.",
    )
    p.add_argument(
        "--link",
        default=DEFAULT_LINK,
        help=f"the link's rate each way, as the bridge writes rates: 50kbit, 6250, 8KiB (default {DEFAULT_LINK})",
    )
    p.add_argument(
        "--rate-limit",
        default=DEFAULT_RATE_LIMIT,
        help=f"each source's rate_limit (default {DEFAULT_RATE_LIMIT})",
    )
    p.add_argument(
        "--sources", type=positive_int, help=f"origin streams on the leaf (default {DEFAULT_SOURCES}; quick 2)"
    )
    p.add_argument("--rate", type=positive_float, default=DEFAULT_RATE, help=f"msg/s per source ({DEFAULT_RATE:g})")
    p.add_argument("--size", type=positive_int, default=DEFAULT_SIZE, help=f"payload bytes (default {DEFAULT_SIZE})")
    p.add_argument(
        "--seconds",
        type=positive_float,
        help=f"seconds of traffic, the cut halfway (default {DEFAULT_SECONDS:g}; quick {QUICK_SECONDS:g})",
    )
    p.add_argument("--idle", type=positive_float, help=f"seconds idle (default {DEFAULT_IDLE:g}; quick {QUICK_IDLE:g})")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke test: {QUICK_SOURCES} sources, {QUICK_SECONDS:g} s of traffic, {QUICK_IDLE:g} s idle",
    )
    p.add_argument("--label", default="", help="the run's name in the markdown row (default: the commit)")
    p.add_argument("--out", type=Path, help="the JSON file (default bench/results/thin-<UTC time>.json)")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (servers' and bridge's files)")


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code (0: ok, 1: the run failed or broke a claim, 2: bad options)."""
    quick: bool = args.quick
    try:
        link_bytes_per_s = parse_link_rate(args.link)
    except argparse.ArgumentTypeError as exc:
        print(f"thin: --link: {exc}", file=sys.stderr)
        return 2
    sources: int = args.sources if args.sources is not None else (QUICK_SOURCES if quick else DEFAULT_SOURCES)
    seconds: float = args.seconds if args.seconds is not None else (QUICK_SECONDS if quick else DEFAULT_SECONDS)
    idle: float = args.idle if args.idle is not None else (QUICK_IDLE if quick else DEFAULT_IDLE)
    sample = thin_config("nats://127.0.0.1:4222", thin_sources(1), args.rate_limit)

    def measure_thin(session: Session) -> ThinRun:
        run = ThinRun(
            sources=sources,
            rate=args.rate,
            seconds=seconds,
            size=args.size,
            idle=idle,
            link=args.link,
            link_bytes_per_s=link_bytes_per_s,
            rate_limit=args.rate_limit,
        )
        if (problem := check_config(sample, session.workdir)) is not None:
            run.error = f"the bridge would refuse --rate-limit {args.rate_limit!r}: {problem}"
            return run
        return measure(run, workdir=session.workdir, binary=session.binary)

    def report(session: Session, result: ThinRun) -> Report:
        info, revision, version = session.info, session.revision, session.version
        if result.ok and not args.keep:
            shutil.rmtree(session.workdir, ignore_errors=True)
        items = targets(result)
        verdict = "ok" if result.ok else "FAILED"
        print(f"\n[{session.elapsed:.0f}s] {sources} sources across a {args.link} link, {verdict}")
        print(format_targets(items).replace("targets (reported, not asserted):", CLAIMS_TITLE, 1))
        header = (
            f"### Thin link, {session.started.date().isoformat()}: `{session.command}`\n\n"
            f"{info['nproc']} CPUs ({info['cpu_model']}), nats-server {version}, {revision_text(revision)}, load "
            f"average {info['loadavg_start']} at start, {info['loadavg_end']} at the end; one leaf whose leafnode link "
            f"runs through a proxy at {args.link} ({link_bytes_per_s:,} B/s) each way, {sources} WorkQueue sources x "
            f"{args.rate:g} msg/s x {seconds:g} s ({args.size} B), the link cut once halfway, then {idle:g} s idle; "
            f"the bridge beside the hub (sidecar), rate_limit {args.rate_limit}, defaults otherwise (leases on)."
        )
        md = markdown(items, header)
        row = figures_row(args.label or revision.get("commit", "?"), result, session.elapsed)
        md += "\n" + FIGURES_HEADER + "\n" + row + "\n"
        fields = {
            "settings": {
                "sources": sources,
                "rate": args.rate,
                "size": args.size,
                "seconds": seconds,
                "idle": idle,
                "link": args.link,
                "link_bytes_per_s": link_bytes_per_s,
                "rate_limit": args.rate_limit,
                "quick": quick,
            },
            "bridge_config_example": thin_config("nats://HUB", thin_sources(2), args.rate_limit),
            "run": result.as_dict(),
            "wall_s": session.elapsed,
        }
        failure = "" if result.ok else f"\nthe run failed: {result.error}"
        return Report(md, fields, [t.as_dict() for t in items], failure)

    return run_command(
        "thin",
        args.out,
        measure_thin,
        report,
        workdir_holds="run",
        label=args.label,
        show_repo_root=True,
        record_elapsed=True,
    )
