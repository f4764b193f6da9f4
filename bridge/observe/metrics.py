"""Prometheus metrics, labelled by source.

Most values are read from each source's :class:`SourceSnapshot` when Prometheus scrapes, and written straight as
text (:mod:`bridge.observe.exposition`), so the replication hot path pays nothing for them and a scrape of
thousands of sources costs little. Only what must be seen per event is observed as it happens: the
replication latency of every stored message, the flow-control answer latency, publish errors by reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest

from bridge import CORE_BUILD, __version__
from bridge.core.histogram import LoopHistogram
from bridge.core.modes import Mode
from bridge.observe.exposition import Exposition, label

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
FC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)


@dataclass(frozen=True, slots=True)
class SourceSnapshot:
    """One source's state at one moment: what metrics, ``/readyz`` and ``status`` show."""

    source: str
    phase: str
    origin_connected: bool
    consumer_bound: bool
    watermark: int
    last_delivered: int
    origin_pending: int
    in_flight: int
    backlog: int
    replicated_messages: int
    replicated_bytes: int
    deliveries: int
    duplicates: int
    fc_requests: int
    fc_answers: int
    resets: Mapping[str, int] = field(default_factory=dict)
    blocked_reason: str = ""
    stalled: bool = False
    # silent past silence_timeout and waiting for its origin, in doubt, to answer another source's reset
    # (bridge.core.reach): no reset of its own meanwhile
    waiting_for_origin: bool = False
    seconds_since_progress: float = 0.0
    last_replicated_origin_time: float | None = None  # unix seconds: origin store time of the newest copy
    oldest_unstored_origin_time: float | None = None  # unix seconds: origin store time of the oldest message waiting
    rate_limit: int = 0  # bytes per second the origin may send (sources[].rate_limit; 0: none)
    window: int = 0  # the consumer's max_ack_pending in effect (grown over a far link: bridge.core.window)
    link_rtt: float | None = None  # seconds: the round trip a full window waited for (None: not measured)
    batched: bool = False  # windows go out as fast batches (the aggregate allows them, no refusal paused them)
    batches: int = 0  # fast batches opened
    batch_fallbacks: int = 0  # fast batches the aggregate refused, publishing turned plain for a while
    last_error: str = ""
    mode: str = ""  # the consumer model chosen (bridge.core.modes.Mode), "" until the source has connected
    mode_reason: str = ""  # why that mode (bridge.core.modes.Choice.reason)

    def to_json(self, now: float) -> dict[str, Any]:
        """The source's part of ``/readyz`` (which ``status`` shows) at ``now`` (unix seconds)."""
        return {
            "mode": self.mode or None,
            "mode_reason": self.mode_reason or None,
            "phase": self.phase,
            "origin_connected": self.origin_connected,
            "consumer_bound": self.consumer_bound,
            "watermark": self.watermark,
            "last_delivered": self.last_delivered,
            "origin_pending": self.origin_pending,
            "in_flight": self.in_flight,
            "blocked": self.blocked_reason or None,
            "stalled": self.stalled,
            "waiting_for_origin": self.waiting_for_origin,
            "seconds_since_progress": round(self.seconds_since_progress, 1),
            "lag_seconds": None if (lag := self.lag(now)) is None else round(lag, 1),
            "rate_limit": self.rate_limit,
            "window": self.window,
            "link_rtt_ms": None if self.link_rtt is None else round(self.link_rtt * 1000, 1),
            "batched": self.batched,
            "last_error": self.last_error or None,
        }

    def lag(self, now: float) -> float | None:
        """How far behind the source is, in seconds (``nats_bridge_lag_seconds``): the age of the oldest origin
        message not yet stored in the aggregate. With none delivered while the origin reports more (delivery held
        up: a reconnect, a reset), the newest copy's age stands in for it, an upper bound. 0 when nothing waits;
        None when something waits and no copy was stored yet (unknown)."""
        if self.oldest_unstored_origin_time is not None:
            return max(0.0, now - self.oldest_unstored_origin_time)
        if self.origin_pending <= 0:
            return 0.0
        if self.last_replicated_origin_time is not None:
            return max(0.0, now - self.last_replicated_origin_time)
        return None


@dataclass(frozen=True, slots=True)
class LeaseSnapshot:
    """One source's ownership as metrics, ``/readyz`` and ``status`` show it."""

    source: str
    owned: bool
    state: str
    owner: str  # the holder's instance id as last read ("" when free or unknown)
    owner_host: str
    owner_since: float | None  # unix seconds
    renewals: int
    renew_failures: int
    ownership_changes: int
    seconds_since_renew: float | None

    @property
    def suspended(self) -> bool:
        """Owned, but paused until a renew succeeds (``bridge.core.leases``, the suspended states)."""
        return self.state == "suspended"


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """This process in the fleet."""

    instance: str
    bucket: str
    ttl: float
    ready: bool  # the bucket was read recently: this process knows who owns what
    members: tuple[str, ...]
    leases: tuple[LeaseSnapshot, ...]


@dataclass(frozen=True, slots=True)
class BridgeSnapshot:
    """The daemon's state: the target connection, every running source, and (with leases) the fleet."""

    target_connected: bool
    sources: tuple[SourceSnapshot, ...]
    now: float  # unix seconds when taken
    fleet: FleetSnapshot | None = None
    api_in_flight: int = 0  # the sources' JetStream API requests in flight (bounded per process)
    api_waiting: int = 0  # and those waiting for a slot
    publishes_in_flight: int = 0  # every source's publishes in flight to the aggregate together (bounded per process)
    publishes_waiting: int = 0  # sources waiting for room among them
    publishes_limit: int = 0  # how many may be in flight now (follows the hub's ack times, bridge/core/budget.py)
    publishes_limit_cuts: int = 0  # times that limit was halved for an ack slower than half the ack timeout
    origins_doubted: int = 0  # origins whose sources went silent or got no answer, not answering yet
    resets_waiting: int = 0  # resets waiting for their origin's turn (an answer to its scout)


def publish_error_reason(error: str) -> str:
    """A small, fixed set of label values for a publish failure's text (labels must not be unbounded)."""
    text = error.lower()
    for reason, needles in _REASONS:
        if any(needle in text for needle in needles):
            return reason
    return "other"


_REASONS = (
    ("timeout", ("no publish ack within", "timeout")),
    ("connection", ("not connected", "connection", "closed")),
    ("too_large", ("exceeds", "max_payload", "maximum payload")),
    ("no_stream", ("no responders", "stream not found", "does not exist")),
    ("limit", ("maximum messages", "maximum bytes", "insufficient resources", "discard", "exceeded")),
    ("permission", ("permission",)),
    ("rejected", ("code ",)),
)
PUBLISH_ERROR_REASONS = (*(reason for reason, _ in _REASONS), "other")


class _Histograms:
    """One :class:`LoopHistogram` per source under one metric name."""

    def __init__(self, name: str, doc: str, bounds: tuple[float, ...]) -> None:
        self.name, self.doc, self.bounds = name, doc, bounds
        self.by_source: dict[str, LoopHistogram] = {}

    def labels(self, source: str) -> LoopHistogram:
        return self.by_source.setdefault(source, LoopHistogram(self.bounds))

    def write(self, out: Exposition) -> None:
        rows = [(label("source", source), h.counts, h.sum) for source, h in sorted(self.by_source.items())]
        out.histogram(self.name, self.doc, self.bounds, rows)


class SourceObservers:
    """The per-event metrics of one source, bound to its label."""

    def __init__(self, metrics: Metrics, source: str) -> None:
        self.latency = metrics.latency.labels(source)
        self.fc_latency = metrics.fc_latency.labels(source)
        self._errors = metrics.publish_errors
        self._source = source

    def publish_error(self, error: str) -> None:
        self._errors.labels(self._source, publish_error_reason(error)).inc()


class Metrics:
    """What the HTTP listener serves (:meth:`exposition`): the snapshot's values, read at scrape time, the
    histograms, and the registry of prometheus-client's own metrics (the publish errors)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = _Histograms(
            "nats_bridge_replication_latency_seconds",
            "Origin store time to the aggregate's publish ack, per replicated message.",
            LATENCY_BUCKETS,
        )
        self.fc_latency = _Histograms(
            "nats_bridge_flow_control_answer_latency_seconds",
            "Flow-control request received to answered (it waits until everything before it is stored).",
            FC_BUCKETS,
        )
        self.publish_errors = Counter(
            "nats_bridge_publish_errors",
            "Failed publishes to the aggregate, by reason.",
            ["source", "reason"],
            registry=self.registry,
        )
        self._snapshot: Callable[[], BridgeSnapshot] | None = None

    def observers(self, source: str) -> SourceObservers:
        return SourceObservers(self, source)

    def forget(self, source: str) -> None:
        """Drop the series of ``source``, removed from the configuration (sites come and go live: a series for each
        one ever configured would grow without end). Its gauges are the snapshot's, which no longer holds it."""
        self.latency.by_source.pop(source, None)
        self.fc_latency.by_source.pop(source, None)
        for reason in PUBLISH_ERROR_REASONS:
            with contextlib.suppress(KeyError):  # (prometheus-client versions differ on an absent series)
                self.publish_errors.remove(source, reason)

    def read_from(self, snapshot: Callable[[], BridgeSnapshot]) -> None:
        """Where scrape-time values come from (the running bridge)."""
        self._snapshot = snapshot

    def snapshot(self) -> BridgeSnapshot | None:
        return self._snapshot() if self._snapshot is not None else None

    def exposition(self) -> list[bytes]:
        """A scrape's body, in the Prometheus text format, in parts (a family each)."""
        out = Exposition()
        self.latency.write(out)
        self.fc_latency.write(out)
        out.info(
            "nats_bridge_build",
            "nats-bridge version, and whether its core runs compiled.",
            f"{label('core', CORE_BUILD)},{label('version', __version__)}",
        )
        snap = self.snapshot()
        if snap is not None:
            _snapshot_families(out, snap)
        out.append(generate_latest(self.registry))
        return out.chunks()


def _snapshot_families(out: Exposition, snap: BridgeSnapshot) -> None:
    out.family(
        "nats_bridge_target_connected",
        "gauge",
        "1 while connected to the aggregate's server.",
        [("", 1.0 if snap.target_connected else 0.0)],
    )
    out.family(
        "nats_bridge_api_requests_in_flight",
        "gauge",
        "The sources' JetStream API requests in flight (bounded per process).",
        [("", float(snap.api_in_flight))],
    )
    out.family(
        "nats_bridge_api_requests_waiting",
        "gauge",
        "The sources' JetStream API requests waiting for one of the process's slots (a reconnect storm).",
        [("", float(snap.api_waiting))],
    )
    out.family(
        "nats_bridge_publishes_in_flight",
        "gauge",
        "Every source's publishes in flight to the aggregate together (bounded per process).",
        [("", float(snap.publishes_in_flight))],
    )
    out.family(
        "nats_bridge_publishes_waiting",
        "gauge",
        "Sources with publishes waiting for room among the process's publishes in flight (backlogs after a storm).",
        [("", float(snap.publishes_waiting))],
    )
    out.family(
        "nats_bridge_publishes_limit",
        "gauge",
        "How many publishes may be in flight to the aggregate now: halved by an ack slower than half the ack "
        "timeout, grown while acks come quickly, at most engine.publishes_in_flight.",
        [("", float(snap.publishes_limit))],
    )
    out.family(
        "nats_bridge_publishes_limit_cuts_total",
        "counter",
        "Times the limit on publishes in flight was halved because the hub acked slower than half the ack timeout.",
        [("", float(snap.publishes_limit_cuts))],
    )
    out.family(
        "nats_bridge_origins_doubted",
        "gauge",
        "Origins in doubt: a source of theirs went silent or got no answer, and none has answered since (resets to "
        "them go one scout at a time).",
        [("", float(snap.origins_doubted))],
    )
    out.family(
        "nats_bridge_resets_waiting",
        "gauge",
        "Resets waiting for their origin's turn: an answer to its scout, or their own turn as its next scout.",
        [("", float(snap.resets_waiting))],
    )
    _source_families(out, snap)
    if snap.fleet is not None:
        _fleet_families(out, snap.fleet)


def _source_families(out: Exposition, snap: BridgeSnapshot) -> None:
    src = snap.sources
    labels = [label("source", s.source) for s in src]  # made once: every family below writes them

    def rows(get: Callable[[SourceSnapshot], float]) -> Iterator[tuple[str, float]]:
        return ((text, float(get(s))) for text, s in zip(labels, src, strict=True))

    def counter(name: str, doc: str, get: Callable[[SourceSnapshot], float]) -> None:
        out.family(name, "counter", doc, rows(get))

    def gauge(name: str, doc: str, get: Callable[[SourceSnapshot], float]) -> None:
        out.family(name, "gauge", doc, rows(get))

    counter("nats_bridge_replicated_messages", "Messages stored in the aggregate.", lambda s: s.replicated_messages)
    counter("nats_bridge_replicated_bytes", "Payload bytes stored in the aggregate.", lambda s: s.replicated_bytes)
    counter("nats_bridge_deliveries", "Messages delivered by the origin consumer.", lambda s: s.deliveries)
    counter(
        "nats_bridge_duplicate_deliveries",
        "Deliveries at or below what was already replicated, dropped.",
        lambda s: s.duplicates,
    )
    counter("nats_bridge_flow_control_requests", "Flow-control requests received.", lambda s: s.fc_requests)
    counter("nats_bridge_flow_control_answers", "Flow-control answers sent.", lambda s: s.fc_answers)
    out.family(
        "nats_bridge_resets",
        "counter",
        "Consumer RESETs sent, by cause (external: someone else reset it; a consumer found at rest needs none).",
        (
            (f"{label('cause', cause)},{text}", float(count))
            for text, s in zip(labels, src, strict=True)
            for cause, count in sorted(s.resets.items())
        ),
    )
    gauge("nats_bridge_publish_acks_outstanding", "Publishes awaiting the aggregate's ack.", lambda s: s.in_flight)
    gauge("nats_bridge_backlog_messages", "Delivered messages not yet stored in the aggregate.", lambda s: s.backlog)
    gauge(
        "nats_bridge_stored_watermark",
        "Highest origin sequence with everything at or below it stored.",
        lambda s: s.watermark,
    )
    gauge("nats_bridge_last_delivered_sequence", "Origin sequence of the last delivery.", lambda s: s.last_delivered)
    gauge(
        "nats_bridge_origin_pending_messages",
        "Messages in the origin not yet delivered, as of the last delivery.",
        lambda s: s.origin_pending,
    )
    out.family(
        "nats_bridge_last_replicated_age_seconds",
        "gauge",
        "Age (now minus origin store time) of the newest message stored in the aggregate.",
        (
            (text, max(0.0, snap.now - s.last_replicated_origin_time))
            for text, s in zip(labels, src, strict=True)
            if s.last_replicated_origin_time is not None
        ),
    )
    out.family(
        "nats_bridge_lag_seconds",
        "gauge",
        "Age of the oldest origin message not yet stored in the aggregate (with none delivered while the origin "
        "reports more, the newest copy's age, an upper bound); 0 when nothing waits.",
        ((text, lag) for text, s in zip(labels, src, strict=True) if (lag := s.lag(snap.now)) is not None),
    )
    gauge(
        "nats_bridge_rate_limit_bytes_per_second",
        "The source's rate_limit: bytes per second the origin sends it at most (0: no limit).",
        lambda s: s.rate_limit,
    )
    gauge(
        "nats_bridge_window_messages",
        "The consumer's max_ack_pending in effect: the configured one, or what the bridge grew it to over a far "
        "link (flow-control mode, managed consumer).",
        lambda s: s.window,
    )
    out.family(
        "nats_bridge_link_rtt_seconds",
        "gauge",
        "The origin link's round trip as a full window waited for it (the least of the last three); only for "
        "sources whose window filled.",
        ((text, s.link_rtt) for text, s in zip(labels, src, strict=True) if s.link_rtt is not None),
    )
    gauge(
        "nats_bridge_publish_batched",
        "1 while windows go out as fast batches (the aggregate has allow_batched: origin order kept across its "
        "leader moves); 0 while publishes go plain.",
        lambda s: s.batched,
    )
    counter("nats_bridge_publish_batches", "Fast batches opened.", lambda s: s.batches)
    counter(
        "nats_bridge_publish_batch_fallbacks",
        "Fast batches the aggregate refused (too many in flight on the stream: plain for 10 s; batching turned "
        "off: plain until its limits are read again).",
        lambda s: s.batch_fallbacks,
    )
    gauge(
        "nats_bridge_seconds_since_progress",
        "Seconds since the watermark last moved while there was something to replicate (0 when idle).",
        lambda s: s.seconds_since_progress,
    )
    gauge("nats_bridge_source_blocked", "1 while a publish is failing and retried.", lambda s: bool(s.blocked_reason))
    gauge(
        "nats_bridge_source_stalled",
        "1 while the source has made no progress for http.stalled_after.",
        lambda s: s.stalled,
    )
    gauge("nats_bridge_origin_connected", "1 while connected to the origin server.", lambda s: s.origin_connected)
    gauge(
        "nats_bridge_consumer_bound",
        "1 while the origin consumer is bound and replicating (after the first reset).",
        lambda s: s.consumer_bound,
    )
    # Every mode gets a series (0 or 1), as a Prometheus state set: a mode change flips two values instead of
    # leaving a stale series behind, and "which sources pull" is a plain == 1. All 0 until the mode is chosen.
    modes = [(mode.value, label("mode", mode.value)) for mode in Mode]
    out.family(
        "nats_bridge_source_mode",
        "gauge",
        "1 for the consumer model the source replicates through (flow_control or pull), 0 for the other.",
        (
            (f"{mode_label},{text}", 1.0 if s.mode == mode else 0.0)
            for text, s in zip(labels, src, strict=True)
            for mode, mode_label in modes
        ),
    )


def _fleet_families(out: Exposition, fleet: FleetSnapshot) -> None:
    leases = fleet.leases
    labels = [label("source", lease.source) for lease in leases]

    def rows(get: Callable[[LeaseSnapshot], float]) -> Iterator[tuple[str, float]]:
        return ((text, float(get(lease))) for text, lease in zip(labels, leases, strict=True))

    out.family(
        "nats_bridge_source_owned",
        "gauge",
        "1 while this process owns the source's lease (replicates it), 0 while it is a standby for it.",
        rows(lambda lease: lease.owned),
    )
    out.family(
        "nats_bridge_lease_renewals",
        "counter",
        "Successful renewals of the source's lease.",
        rows(lambda lease: lease.renewals),
    )
    out.family(
        "nats_bridge_lease_renew_failures",
        "counter",
        "Failed renewals of the source's lease (it is suspended once none succeeds for 4/5 of the TTL).",
        rows(lambda lease: lease.renew_failures),
    )
    out.family(
        "nats_bridge_lease_ownership_changes",
        "counter",
        "Times this process took or gave up the source's lease.",
        rows(lambda lease: lease.ownership_changes),
    )
    out.family(
        "nats_bridge_lease_seconds_since_renew",
        "gauge",
        "Seconds since the owned lease was last written (sent); absent while standby.",
        (
            (text, lease.seconds_since_renew)
            for text, lease in zip(labels, leases, strict=True)
            if lease.seconds_since_renew is not None
        ),
    )
    out.family(
        "nats_bridge_sources_owned",
        "gauge",
        "Sources whose lease this process owns.",
        [("", float(sum(1 for lease in leases if lease.owned)))],
    )
    out.family(
        "nats_bridge_sources_suspended",
        "gauge",
        "Owned sources whose lease is suspended: no renew succeeded before the fence, so they publish and answer "
        "nothing (keeping their state) until one does.",
        [("", float(sum(1 for lease in leases if lease.suspended)))],
    )
    members = [("", float(len(fleet.members)))]
    out.family("nats_bridge_fleet_members", "gauge", "Live processes in the fleet, as last read.", members)
    out.family(
        "nats_bridge_fleet_ready",
        "gauge",
        "1 while the coordination bucket was read within the lease TTL.",
        [("", 1.0 if fleet.ready else 0.0)],
    )
