"""What one measurement produces, and what a whole bench run is made of. Plain data (JSON via ``as_dict``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from bridge.core.modes import Mode

NATIVE = "native"
BRIDGE = "bridge"  # sidecar position: connected to the hub only, reaching the leaf through its domain (as native)
BRIDGE_EDGE = "bridge-edge"  # edge position: the source connected to the leaf directly (an extra, for reference)
BRIDGE_POSITIONS = {BRIDGE: "sidecar", BRIDGE_EDGE: "edge"}
RETENTIONS = ("workqueue", "limits")
# The bridge's sources[].mode values (bridge.core.modes): "auto" lets the bridge choose at start-up
MODES = ("auto", *(str(m) for m in Mode))
MB = 1_000_000  # MB/s are payload megabytes (10^6 bytes) per second


@dataclass(slots=True)
class ThroughputRun:
    """One replication of a preloaded origin by one path, on a fresh hub + leaf.

    ``seconds`` runs from the aggregate's first stored copy to its last (their store times, read from the
    stream's ``first_ts``/``last_ts``), so it leaves out start-up, which ``startup_s`` measures on its own: from
    creating the sourcing aggregate (native) or spawning the bridge process (bridge) to the first stored copy.
    """

    path: str  # NATIVE, BRIDGE or BRIDGE_EDGE
    size: int
    retention: str
    rep: int
    messages: int
    ok: bool = False
    error: str | None = None
    seconds: float = 0.0
    msgs_per_s: float = 0.0
    mb_per_s: float = 0.0
    startup_s: float = 0.0
    preload_msgs_per_s: float = 0.0
    stored: int = 0  # aggregate message count at the end (must equal messages)
    bridge_peak_rss_bytes: int | None = None  # VmHWM just before SIGTERM
    bridge_cpu_s: float | None = None  # whole life of the process up to the last copy
    bridge_cpu_s_per_million: float | None = None  # only while replicating (first copy seen .. last copy seen)
    servers_cpu_s_per_million: float | None = None  # hub + leaf, same window
    bridge_exit_code: int | None = None
    bridge_mode: str | None = None  # the mode the bridge ran in (its `source.mode` log event); None: native
    bridge_warnings: dict[str, int] = field(default_factory=dict)  # warning/error log events by name, counted

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(slots=True)
class LatencyRun:
    """Messages published at a fixed rate into the origin, each stamped with its send time; latency is the
    aggregate copy's store time minus that stamp (one machine, one clock).
    """

    path: str
    size: int
    retention: str
    rep: int
    rate: float
    seconds: float
    ok: bool = False
    error: str | None = None
    messages: int = 0
    achieved_rate: float = 0.0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    publish_rtt_p50_ms: float = 0.0  # send -> origin's publish ack: the bound on "send time ~ origin store time"
    origin_store_p50_ms: float | None = None  # bridge only: from the origin's own store time (Bridge-Time)
    origin_store_p99_ms: float | None = None
    bridge_peak_rss_bytes: int | None = None
    bridge_exit_code: int | None = None
    bridge_mode: str | None = None
    bridge_warnings: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list, repr=False)  # kept out of the JSON

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["latencies_ms"]
        return out


@dataclass(slots=True)
class BenchResults:
    """A whole run: what was asked, where it ran, and every measurement."""

    started: str  # ISO 8601 UTC
    command: str
    machine: dict[str, Any]
    revision: dict[str, Any]
    server_version: str  # the hub's
    settings: dict[str, Any]
    throughput: list[ThroughputRun] = field(default_factory=list)
    latency: list[LatencyRun] = field(default_factory=list)
    backlog: ThroughputRun | None = None
    finished: str = ""
    origin_server_version: str = ""  # the leaf's, when it runs another binary than the hub ("" : the same)

    def as_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "finished": self.finished,
            "command": self.command,
            "machine": self.machine,
            "revision": self.revision,
            "server_version": self.server_version,
            "origin_server_version": self.origin_server_version or self.server_version,
            "settings": self.settings,
            "throughput": [r.as_dict() for r in self.throughput],
            "latency": [r.as_dict() for r in self.latency],
            "backlog": self.backlog.as_dict() if self.backlog is not None else None,
        }

    @property
    def runs(self) -> list[ThroughputRun | LatencyRun]:
        """Every measurement, in order: throughput, latency, the backlog."""
        runs: list[ThroughputRun | LatencyRun] = [*self.throughput, *self.latency]
        if self.backlog is not None:
            runs.append(self.backlog)
        return runs

    @property
    def failures(self) -> list[str]:
        return [f"{r.path} {r.size} B {r.retention} rep {r.rep}: {r.error}" for r in self.runs if not r.ok]
