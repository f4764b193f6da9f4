"""Turning measurements into figures: per (size, retention) summaries, the text table, the targets, the
markdown appended to ``bench/RESULTS.md``, and the PNG chart (matplotlib, imported only when drawing).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.model import BRIDGE, BRIDGE_EDGE, NATIVE, BenchResults, LatencyRun, ThroughputRun
from bench.stats import Spread, percentile, spread

# Targets from the issue; reported, never asserted.
TARGET_RATIO = 1.0  # bridge/native throughput at 256 B and 1 KiB WorkQueue
TARGET_RATIO_CASES = ((256, "workqueue"), (1024, "workqueue"))
TARGET_P99_FACTOR = 2.0  # bridge p99 latency at most this times native's
TARGET_BACKLOG_RSS = 150_000_000  # bytes, with a 1,000,000-message backlog


def size_label(size: int) -> str:
    """``256 B``, ``1 KiB``, ``16 KiB``, ``1.5 KiB``."""
    if size >= 1024 and size % 1024 == 0:
        return f"{size // 1024} KiB"
    if size >= 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size} B"


@dataclass(frozen=True, slots=True)
class Latency:
    p50_ms: float
    p99_ms: float
    samples: int


@dataclass(frozen=True, slots=True)
class ComboSummary:
    """Everything measured for one (message size, origin retention)."""

    size: int
    retention: str
    native: Spread | None  # msgs/s over repetitions
    bridge: Spread | None
    native_mb_per_s: float | None  # median
    bridge_mb_per_s: float | None
    ratio: Spread | None  # bridge/native of each repetition's pair
    native_latency: Latency | None  # pooled over latency repetitions
    bridge_latency: Latency | None
    bridge_peak_rss_bytes: int | None  # the largest VmHWM of any bridge run of this combination
    bridge_cpu_s_per_million: float | None  # median
    native_servers_cpu_s_per_million: float | None  # hub + leaf, median
    bridge_servers_cpu_s_per_million: float | None
    native_startup_s: float | None  # median
    bridge_startup_s: float | None
    failed_runs: int
    edge: Spread | None = None  # msgs/s of the bridge in the edge position (source connected to the leaf)
    edge_ratio: Spread | None = None  # edge bridge / native, per repetition

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("native", "bridge", "ratio", "edge", "edge_ratio"):
            value = getattr(self, key)
            out[key] = value.as_dict() if value is not None else None
        return out


def _median_or_none(values: Sequence[float]) -> float | None:
    return spread(values).median if values else None


def _pooled(runs: Sequence[LatencyRun]) -> Latency | None:
    samples = [x for r in runs for x in r.latencies_ms]
    if not samples:
        return None
    return Latency(percentile(samples, 50), percentile(samples, 99), len(samples))


def summarize(throughput: Sequence[ThroughputRun], latency: Sequence[LatencyRun]) -> list[ComboSummary]:
    """One summary per (size, retention) present, in the order first measured. Failed runs count only as failures."""
    combos: list[tuple[int, str]] = []
    for key in [(r.size, r.retention) for r in throughput] + [(r.size, r.retention) for r in latency]:
        if key not in combos:
            combos.append(key)
    out = []
    for size, retention in combos:
        t_all = [r for r in throughput if (r.size, r.retention) == (size, retention)]
        l_all = [r for r in latency if (r.size, r.retention) == (size, retention)]
        t_ok = [r for r in t_all if r.ok]
        native = [r for r in t_ok if r.path == NATIVE]
        bridge = [r for r in t_ok if r.path == BRIDGE]
        edge = [r for r in t_ok if r.path == BRIDGE_EDGE]
        native_by_rep = {r.rep: r for r in native}
        ratios = [b.msgs_per_s / native_by_rep[b.rep].msgs_per_s for b in bridge if b.rep in native_by_rep]
        edge_ratios = [b.msgs_per_s / native_by_rep[b.rep].msgs_per_s for b in edge if b.rep in native_by_rep]
        rss = [r.bridge_peak_rss_bytes for r in [*bridge, *edge] if r.bridge_peak_rss_bytes is not None]
        rss += [r.bridge_peak_rss_bytes for r in l_all if r.ok and r.bridge_peak_rss_bytes is not None]
        out.append(
            ComboSummary(
                size=size,
                retention=retention,
                native=spread([r.msgs_per_s for r in native]) if native else None,
                bridge=spread([r.msgs_per_s for r in bridge]) if bridge else None,
                native_mb_per_s=_median_or_none([r.mb_per_s for r in native]),
                bridge_mb_per_s=_median_or_none([r.mb_per_s for r in bridge]),
                ratio=spread(ratios) if ratios else None,
                native_latency=_pooled([r for r in l_all if r.ok and r.path == NATIVE]),
                bridge_latency=_pooled([r for r in l_all if r.ok and r.path == BRIDGE]),
                bridge_peak_rss_bytes=max(rss) if rss else None,
                bridge_cpu_s_per_million=_median_or_none(
                    [r.bridge_cpu_s_per_million for r in bridge if r.bridge_cpu_s_per_million is not None]
                ),
                native_servers_cpu_s_per_million=_median_or_none(
                    [r.servers_cpu_s_per_million for r in native if r.servers_cpu_s_per_million is not None]
                ),
                bridge_servers_cpu_s_per_million=_median_or_none(
                    [r.servers_cpu_s_per_million for r in bridge if r.servers_cpu_s_per_million is not None]
                ),
                native_startup_s=_median_or_none([r.startup_s for r in native]),
                bridge_startup_s=_median_or_none([r.startup_s for r in bridge]),
                failed_runs=sum(1 for r in t_all if not r.ok) + sum(1 for r in l_all if not r.ok),
                edge=spread([r.msgs_per_s for r in edge]) if edge else None,
                edge_ratio=spread(edge_ratios) if edge_ratios else None,
            )
        )
    return out


# Formatting helpers: a missing figure prints as "-" (a failed or skipped measurement), never as 0.


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f}"


def _ratio(value: Spread | None) -> str:
    if value is None:
        return "-"
    if value.count == 1:
        return f"{value.median:.2f}"
    return f"{value.median:.2f} ({value.low:.2f}..{value.high:.2f})"


def _lat(value: Latency | None) -> str:
    return "-" if value is None else f"{value.p50_ms:.2f} / {value.p99_ms:.2f}"


COLUMNS = (
    "size",
    "retention",
    "native msg/s",
    "native MB/s",
    "bridge msg/s",
    "bridge MB/s",
    "bridge/native (min..max)",
    "native p50/p99 ms",
    "bridge p50/p99 ms",
    "bridge peak RSS MB",
    "bridge CPU s/1M msgs",
)


def _row(s: ComboSummary) -> list[str]:
    return [
        size_label(s.size),
        s.retention,
        _num(s.native.median if s.native else None),
        _num(s.native_mb_per_s, 1),
        _num(s.bridge.median if s.bridge else None),
        _num(s.bridge_mb_per_s, 1),
        _ratio(s.ratio),
        _lat(s.native_latency),
        _lat(s.bridge_latency),
        _mb(s.bridge_peak_rss_bytes),
        _num(s.bridge_cpu_s_per_million, 1),
    ]


def format_table(summaries: Sequence[ComboSummary]) -> str:
    """The fixed-width text table printed at the end of a run."""
    rows = [list(COLUMNS), *(_row(s) for s in summaries)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, r in enumerate(rows):
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def secondary_lines(s: ComboSummary) -> list[str]:
    """Figures beside the table for one combination: the edge position, start-up, the servers' CPU."""
    name = f"{size_label(s.size)} {s.retention}"
    return [
        f"{name}: bridge in the edge position (source connected to the leaf) "
        f"{_num(s.edge.median if s.edge else None)} msg/s, edge/native {_ratio(s.edge_ratio)}",
        f"{name}: start-up to the first stored copy native {_num(s.native_startup_s, 2)} s, "
        f"bridge {_num(s.bridge_startup_s, 2)} s (process spawn included)",
        f"{name}: hub+leaf CPU s per 1M msgs native {_num(s.native_servers_cpu_s_per_million, 1)}, "
        f"with the bridge {_num(s.bridge_servers_cpu_s_per_million, 1)} "
        f"(+ the bridge process {_num(s.bridge_cpu_s_per_million, 1)})",
    ]


def format_costs(summaries: Sequence[ComboSummary]) -> str:
    """Secondary figures (medians): edge position, start-up, and the servers' CPU on each path."""
    return "\n".join(line for s in summaries for line in secondary_lines(s))


def targets(
    summaries: Sequence[ComboSummary], backlog: ThroughputRun | None, latency_rate: float
) -> list[tuple[str, str, bool | None]]:
    """``(target, measured, met)`` per target of the issue; ``met`` is None when it was not measured."""
    out: list[tuple[str, str, bool | None]] = []
    by_combo = {(s.size, s.retention): s for s in summaries}
    for size, retention in TARGET_RATIO_CASES:
        name = f"throughput bridge/native >= {TARGET_RATIO:.1f} at {size_label(size)} {retention}"
        s = by_combo.get((size, retention))
        if s is None or s.ratio is None:
            out.append((name, "not measured", None))
        else:
            out.append((name, f"median {_ratio(s.ratio)}", s.ratio.median >= TARGET_RATIO))
    for s in summaries:
        name = (
            f"p99 latency at {latency_rate:g} msg/s within {TARGET_P99_FACTOR:g}x native, "
            f"{size_label(s.size)} {s.retention}"
        )
        if s.native_latency is None or s.bridge_latency is None:
            out.append((name, "not measured", None))
            continue
        factor = s.bridge_latency.p99_ms / s.native_latency.p99_ms if s.native_latency.p99_ms > 0 else float("inf")
        measured = f"bridge {s.bridge_latency.p99_ms:.2f} ms vs native {s.native_latency.p99_ms:.2f} ms ({factor:.1f}x)"
        out.append((name, measured, factor <= TARGET_P99_FACTOR))
    name = f"bridge peak RSS < {TARGET_BACKLOG_RSS / 1e6:.0f} MB with a 1,000,000-message backlog"
    if backlog is None or not backlog.ok or backlog.bridge_peak_rss_bytes is None:
        out.append((name, "not measured", None))
    else:
        measured = f"{_mb(backlog.bridge_peak_rss_bytes)} MB with {backlog.messages:,} x {size_label(backlog.size)}"
        if backlog.messages < 1_000_000:  # a smaller backlog proves nothing about this target
            out.append((name, f"{measured} (backlog too small to judge)", None))
        else:
            out.append((name, measured, backlog.bridge_peak_rss_bytes < TARGET_BACKLOG_RSS))
    return out


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "NOT MET", None: "not measured"}[met]


def format_targets(items: Sequence[tuple[str, str, bool | None]]) -> str:
    lines = ["targets (reported, not asserted):"]
    lines += [f"  {_verdict(met):<12} {name}: {measured}" for name, measured, met in items]
    return "\n".join(lines)


def format_backlog(run: ThroughputRun | None) -> str:
    if run is None:
        return "backlog: not run"
    head = f"backlog: {run.messages:,} x {size_label(run.size)} {run.retention} through the bridge"
    if run.bridge_mode is not None:
        head += f" ({run.bridge_mode} mode)"
    if not run.ok:
        return f"{head}: FAILED: {run.error}"
    return (
        f"{head}: {run.msgs_per_s:,.0f} msg/s ({run.mb_per_s:.1f} MB/s) over {run.seconds:.1f} s, "
        f"start-up {run.startup_s:.2f} s, peak RSS {_mb(run.bridge_peak_rss_bytes)} MB, "
        f"CPU {_num(run.bridge_cpu_s_per_million, 1)} s per 1M msgs"
    )


def machine_line(results: BenchResults) -> str:
    m = results.machine
    mem = m.get("mem_total_bytes")
    ram = f"{mem / 2**30:.1f} GiB RAM" if isinstance(mem, int) else "RAM unknown"
    load = m.get("loadavg_start")
    load_text = f", load average at start {load}" if load else ""
    servers = f"nats-server {results.server_version}"
    if results.origin_server_version:
        servers += f" (hub), {results.origin_server_version} (origin)"
    return (
        f"{m.get('nproc')} CPUs ({m.get('cpu_model')}), {ram}, Linux {m.get('kernel')}, Python {m.get('python')}, "
        f"{servers}{load_text}"
    )


def mode_label(results: BenchResults) -> str:
    """The bridge source's ``mode`` as asked for, and the mode(s) its runs report having run in (their
    ``source.mode`` log event) when that says more: ``mode pull``, ``mode auto (ran as flow_control)``."""
    asked = str(results.settings.get("mode", "auto"))
    ran = sorted({r.bridge_mode for r in results.runs if r.path != NATIVE and r.bridge_mode is not None})
    if ran == [asked]:
        return f"mode {asked}"
    if not ran:
        return f"mode {asked} (no bridge run logged its mode)"
    return f"mode {asked} (ran as {', '.join(ran)})"


def markdown_section(
    results: BenchResults, summaries: Sequence[ComboSummary], json_path: str, png_path: str | None
) -> str:
    """What one run appends to ``bench/RESULTS.md``: a heading, the command and machine, one dated row per
    (size, retention), then the latency, backlog RSS and target lines."""
    date = results.started[:10]
    rev = results.revision
    dirty = " + uncommitted changes under bridge/" if rev.get("bridge_dirty") else ""
    if rev.get("bridge_changed_during_run"):
        dirty += f" (**bridge/ changed during the run**, commit {rev.get('at_end', {}).get('commit')} at the end)"
    s = results.settings
    if s.get("native", True):
        repetitions = "A/B repetitions (native, bridge, ...)"
    else:
        repetitions = "repetitions of the bridge only (native sourcing needs an origin on nats-server 2.14+)"
    lines = [
        f"### {results.started[:16].replace('T', ' ')} UTC, commit {rev.get('commit')}{dirty}, "
        f"core {rev.get('core', 'unknown')}",
        "",
        f"`{results.command}` on {machine_line(results)}.",
        f"Bridge {mode_label(results)}, in the sidecar position (hub only, leaf reached through its domain, like "
        f"native sourcing){' and, for reference, the edge position' if s.get('edge') else ''}; "
        f"`max_ack_pending` {s.get('max_ack_pending')} on both paths; "
        f"messages per run {s.get('messages_label')}; {s.get('reps')} {repetitions}; "
        f"latency at {s.get('latency_rate'):g} msg/s for {s.get('latency_seconds'):g} s "
        f"x {s.get('latency_reps')} per path.",
        "",
        "| date | size | retention | native msg/s | native MB/s | bridge msg/s | bridge MB/s | "
        "bridge/native median (min..max) | p50 / p99 ms native | p50 / p99 ms bridge | bridge peak RSS MB | "
        "bridge CPU s per 1M msgs |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for summary in summaries:
        lines.append("| " + " | ".join([date, *_row(summary)]) + " |")
    lines.append("")
    for summary in summaries:
        lines += [f"- {line}" for line in secondary_lines(summary)]
    lines.append(f"- {format_backlog(results.backlog)}")
    for name, measured, met in targets(summaries, results.backlog, float(s.get("latency_rate", 0))):
        lines.append(f"- target {name}: {measured}: **{_verdict(met)}**")
    failures = results.failures
    lines.append(f"- failed measurements: {len(failures)}")
    lines += [f"  - {f.splitlines()[0]}" for f in failures]
    lines.append(f"- JSON: `{json_path}`" + (f", chart: `{png_path}`" if png_path else ""))
    return "\n".join(lines) + "\n"


def write_chart(results: BenchResults, summaries: Sequence[ComboSummary], path: Path) -> Path:
    """Two panels: msgs/s of each path per (size, retention), with the repetitions' range as error bars, and the
    latency percentiles at the fixed rate.

    Raises:
        ImportError: matplotlib is not installed (message says how to get it).
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

    labels = [f"{size_label(s.size)}\n{s.retention}" for s in summaries]
    xs = list(range(len(summaries)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8.0, 1.6 * len(summaries) + 3), 9))
    with_edge = any(s.edge is not None for s in summaries)
    bars = [(NATIVE, "#4c72b0"), (BRIDGE, "#dd8452")] + ([(BRIDGE_EDGE, "#f0b98f")] if with_edge else [])
    width = 0.8 / len(bars)
    for i, (name, color) in enumerate(bars):
        offset = (i - (len(bars) - 1) / 2) * width
        medians, low_err, high_err = [], [], []
        for s in summaries:
            sp = {NATIVE: s.native, BRIDGE: s.bridge, BRIDGE_EDGE: s.edge}[name]
            medians.append(sp.median if sp else 0.0)
            low_err.append(sp.median - sp.low if sp else 0.0)
            high_err.append(sp.high - sp.median if sp else 0.0)
        label = {NATIVE: "native", BRIDGE: "bridge (sidecar)", BRIDGE_EDGE: "bridge (edge)"}[name]
        top.bar([x + offset for x in xs], medians, width, label=label, color=color, yerr=[low_err, high_err], capsize=3)
        if name == BRIDGE:  # the ratio above the bridge bar's error bar
            for x, s, m, up in zip(xs, summaries, medians, high_err, strict=True):
                if s.ratio is not None:
                    text = f"x{s.ratio.median:.2f}"
                    top.annotate(text, (x + offset, m + up), xytext=(0, 4), textcoords="offset points", ha="center")
    top.set_xticks(xs, labels)
    top.set_ylabel("msgs/s (median, range over repetitions)")
    top.set_title("Preloaded origin replicated into the aggregate (x = bridge/native, median)")
    top.legend()
    quarter = 0.2
    series = (
        (-1.5 * quarter, NATIVE, "p50", "#4c72b0"),
        (-0.5 * quarter, NATIVE, "p99", "#8fb0e0"),
        (0.5 * quarter, BRIDGE, "p50", "#dd8452"),
        (1.5 * quarter, BRIDGE, "p99", "#f0b98f"),
    )
    for offset, name, which, color in series:
        values = []
        for s in summaries:
            lat = s.native_latency if name == NATIVE else s.bridge_latency
            values.append(0.0 if lat is None else (lat.p50_ms if which == "p50" else lat.p99_ms))
        bottom.bar([x + offset for x in xs], values, quarter, label=f"{name} {which}", color=color)
    bottom.set_xticks(xs, labels)
    bottom.set_ylabel("ms, origin publish to aggregate store")
    rate = results.settings.get("latency_rate", 0)
    bottom.set_title(f"Replication latency at {rate:g} msg/s")
    bottom.legend()
    rev = results.revision
    title = f"nats-bridge bench {results.started[:16]} UTC, commit {rev.get('commit')}, bridge {mode_label(results)}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
