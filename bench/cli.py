"""Command line: ``python -m bench run [--quick] [--reps 3] [--sizes 256,1024,16384] [--retention workqueue,limits]
[--backlog 1000000] [--mode auto|flow_control|pull] [--origin-server PATH] ...``; ``--help`` lists every option.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import audit, edge, fanin, fleet, profile, publish_modes, recovery, registry, report, stream, thin, wan
from bench.common import REPO_ROOT, list_items, loadavg, parse_messages, parse_sizes, rel
from bench.model import BRIDGE, BRIDGE_EDGE, MODES, NATIVE, RETENTIONS, BenchResults, LatencyRun, ThroughputRun
from bench.natsops import aggregate_config, native_consumer_config
from bench.procs import git_revision, machine, revision_text
from bench.runner import Options, bridge_config, latency, throughput
from bridge.core.modes import Mode
from bridge.testing.servers import (
    ServerStartError,
    find_nats_server,
    origin_binary_option,
    origin_mode_expected,
    server_version,
)

DEFAULT_SIZES = (256, 1024, 16384)
# Enough messages that every run lasts seconds at native speed (~100k msg/s at 256 B on 2 CPUs), so the
# store-time resolution (microseconds) and start-up noise are negligible; about 50-330 MB of payload each.
DEFAULT_MESSAGES = {256: 200_000, 1024: 100_000, 16384: 20_000}
QUICK_MESSAGES = {256: 5_000, 1024: 5_000, 16384: 1_000}
DEFAULT_BACKLOG = 1_000_000
QUICK_BACKLOG = 20_000
BACKLOG_SIZE = 256


def default_messages(size: int, quick: bool) -> int:
    table = QUICK_MESSAGES if quick else DEFAULT_MESSAGES
    if size in table:
        return table[size]
    if size <= 512:
        return table[256]
    return table[1024] if size <= 4096 else table[16384]


def parse_retentions(text: str) -> tuple[str, ...]:
    out = tuple(list_items(text))
    bad = [r for r in out if r not in RETENTIONS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"retention must be among {', '.join(RETENTIONS)}; got {text!r}")
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Bridge vs native durable sourcing, same machine, same workload."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the benchmark and report")
    run.add_argument("--quick", action="store_true", help="smoke test: tiny workloads, 1 repetition, 2 s latency")
    run.add_argument("--reps", type=int, help="A/B repetitions per size and retention (default 3; --quick 1)")
    run.add_argument("--sizes", type=parse_sizes, default=DEFAULT_SIZES, help="payload sizes (default 256,1024,16384)")
    run.add_argument(
        "--retention", type=parse_retentions, default=RETENTIONS, help="origin retentions (default workqueue,limits)"
    )
    run.add_argument(
        "--messages",
        type=parse_messages,
        help="preloaded messages per run: N, or SIZE=N,... (default 256=200000,1024=100000,16384=20000)",
    )
    run.add_argument(
        "--backlog",
        type=int,
        help=f"messages of {BACKLOG_SIZE} B in the WorkQueue backlog the bridge drains for its peak RSS "
        f"(default {DEFAULT_BACKLOG:,}; --quick {QUICK_BACKLOG:,}; 0 skips)",
    )
    run.add_argument("--latency-rate", type=float, default=1000.0, help="msg/s of the latency step (default 1000)")
    run.add_argument(
        "--latency-seconds", type=float, help="seconds of publishing per latency run (default 10; --quick 2; 0 skips)"
    )
    run.add_argument(
        "--latency-reps", type=int, default=1, help="latency runs per path, size and retention (default 1)"
    )
    run.add_argument(
        "--max-ack-pending",
        type=int,
        default=1000,
        help="max_ack_pending of the origin consumer, the same on both paths (default 1000, the bridge's default)",
    )
    run.add_argument(
        "--mode",
        choices=MODES,
        default="auto",
        help="the bridge source's `mode`: auto (the bridge chooses: flow_control on nats-server 2.14+), "
        "flow_control (a push consumer, ack_policy flow_control) or pull (a pull consumer with explicit acks) "
        "(default auto)",
    )
    run.add_argument(
        "--origin-server",
        metavar="PATH",
        help="the leaf's (the origin's) nats-server, e.g. one older than 2.14, where only pull mode runs and the "
        "native path is skipped (default: $NATS_ORIGIN_SERVER_BIN, else the hub's)",
    )
    run.add_argument(
        "--no-edge",
        action="store_true",
        help="skip the extra throughput run per repetition with the bridge in the edge position (source connected "
        "to the leaf directly); the compared bridge is always the sidecar (hub only, like native sourcing)",
    )
    run.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results", help="where JSON and PNG go")
    run.add_argument("--results-md", type=Path, default=REPO_ROOT / "bench" / "RESULTS.md", help="file to append to")
    record = run.add_mutually_exclusive_group()
    record.add_argument("--record", action="store_true", help="append to RESULTS.md even with --quick")
    record.add_argument("--no-record", action="store_true", help="do not append to RESULTS.md")
    run.add_argument("--keep", action="store_true", help="keep every measurement's server and bridge files")
    audit.parser(sub)
    stream.parser(sub)
    publish_modes.parser(sub)
    wan.parser(sub)
    fanin.parser(sub)
    edge.parser(sub)
    fleet.parser(sub)
    registry.parser(sub)
    recovery.parser(sub)
    profile.parser(sub)
    thin.parser(sub)
    return parser


def _describe(r: ThroughputRun | LatencyRun) -> str:
    if not r.ok:
        return f"FAILED: {r.error}"
    if isinstance(r, ThroughputRun):
        text = f"{r.msgs_per_s:,.0f} msg/s ({r.mb_per_s:.1f} MB/s) over {r.seconds:.2f} s, start-up {r.startup_s:.2f} s"
        text += f", preload {r.preload_msgs_per_s:,.0f} msg/s"
        if r.bridge_peak_rss_bytes is not None:
            text += f", peak RSS {r.bridge_peak_rss_bytes / 1e6:.1f} MB, CPU {r.bridge_cpu_s_per_million or 0:.1f} s/1M"
    else:
        text = f"p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, max {r.max_ms:.2f} ms over {r.messages} msgs"
        text += f" at {r.achieved_rate:,.0f} msg/s (publish rtt p50 {r.publish_rtt_p50_ms:.2f} ms)"
        if r.origin_store_p50_ms is not None and r.origin_store_p99_ms is not None:
            text += f"; from origin store time p50 {r.origin_store_p50_ms:.2f} / p99 {r.origin_store_p99_ms:.2f} ms"
    if r.path != NATIVE:
        text += f"; {r.bridge_mode or 'unknown'} mode"
        if r.bridge_warnings:
            text += ", log warnings: " + ", ".join(f"{name} x{n}" for name, n in r.bridge_warnings.items())
    return text


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "audit":
        return audit.run(args)
    if args.command == "stream":
        return stream.run(args)
    if args.command == "publish-modes":
        return publish_modes.run(args)
    if args.command == "wan":
        return wan.run(args)
    if args.command == "fanin":
        return fanin.run(args)
    if args.command == "edge":
        return edge.run(args)
    if args.command == "fleet":
        return fleet.run(args)
    if args.command == "registry":
        return registry.run(args)
    if args.command == "recovery":
        return recovery.run(args)
    if args.command == "profile":
        return profile.run(args)
    if args.command == "thin":
        return thin.run(args)
    quick: bool = args.quick
    reps: int = args.reps if args.reps is not None else (1 if quick else 3)
    sizes: tuple[int, ...] = args.sizes
    retentions: tuple[str, ...] = args.retention
    if isinstance(args.messages, int):
        messages = {size: args.messages for size in sizes}
    else:
        given: dict[int, int] = args.messages or {}
        messages = {size: given.get(size, default_messages(size, quick)) for size in sizes}
    backlog: int = args.backlog if args.backlog is not None else (QUICK_BACKLOG if quick else DEFAULT_BACKLOG)
    latency_seconds: float = args.latency_seconds if args.latency_seconds is not None else (2.0 if quick else 10.0)
    if reps < 1 or args.latency_reps < 0 or backlog < 0 or latency_seconds < 0 or args.latency_rate <= 0:
        print("--reps must be >= 1; --latency-reps, --backlog and --latency-seconds >= 0; rate > 0", file=sys.stderr)
        return 2
    if args.max_ack_pending < 1:
        print("--max-ack-pending must be >= 1", file=sys.stderr)
        return 2
    mode: str = args.mode
    try:
        binary = find_nats_server()
        version = server_version(binary)
        origin_binary = origin_binary_option(args.origin_server)
        origin_version = server_version(origin_binary)
        # native sourcing binds an ack_policy flow_control consumer on the origin: nats-server 2.14+ only
        with_native = origin_mode_expected(origin_binary) == Mode.FLOW_CONTROL
    except ServerStartError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    if mode == Mode.FLOW_CONTROL and not with_native:
        print(f"bench: --mode flow_control needs an origin on nats-server 2.14+, not {origin_version}", file=sys.stderr)
        return 2

    command = "python -m bench " + " ".join(shlex.quote(a) for a in argv)
    if origin_binary != binary and args.origin_server is None:  # from $NATS_ORIGIN_SERVER_BIN: say so
        command += f" --origin-server {shlex.quote(origin_binary)}"
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    info = machine()
    info["loadavg_start"] = loadavg()
    results = BenchResults(
        started=started.isoformat(timespec="seconds"),
        command=command,
        machine=info,
        revision=git_revision(REPO_ROOT),
        server_version=version,
        origin_server_version=origin_version if origin_binary != binary else "",
        settings={
            "quick": quick,
            "reps": reps,
            "sizes": list(sizes),
            "retentions": list(retentions),
            "messages": {str(k): v for k, v in messages.items()},
            "messages_label": ", ".join(f"{v:,} ({report.size_label(k)})" for k, v in messages.items()),
            "backlog": backlog,
            "backlog_size": BACKLOG_SIZE,
            "latency_rate": args.latency_rate,
            "latency_seconds": latency_seconds,
            "latency_reps": args.latency_reps,
            "max_ack_pending": args.max_ack_pending,
            "edge": not args.no_edge,
            "native": with_native,
            "mode": mode,
            "native_consumer": native_consumer_config(args.max_ack_pending),
            "native_aggregate": aggregate_config(native=True),
            "bridge_aggregate": aggregate_config(native=False),
            "bridge_config": bridge_config("nats://HUB", "nats://LEAF", "sidecar", args.max_ack_pending, mode),
        },
    )
    workdir = Path(tempfile.mkdtemp(prefix="nats-bridge-bench-"))
    options = Options(
        workdir=workdir,
        max_ack_pending=args.max_ack_pending,
        keep=args.keep,
        binary=binary,
        mode=mode,
        origin_binary=origin_binary,
    )
    with_latency = latency_seconds > 0 and args.latency_reps > 0
    bridge_paths = (BRIDGE,) if args.no_edge else (BRIDGE, BRIDGE_EDGE)
    throughput_paths = (NATIVE, *bridge_paths) if with_native else bridge_paths
    latency_paths = (NATIVE, BRIDGE) if with_native else (BRIDGE,)
    per_combo = len(throughput_paths) * reps + (len(latency_paths) * args.latency_reps if with_latency else 0)
    total = len(sizes) * len(retentions) * per_combo + (1 if backlog else 0)
    print(f"bench: {command}", flush=True)
    print(f"  {report.machine_line(results)}", flush=True)
    print(f"  bridge: mode {mode} (its source's `mode`)", flush=True)
    if not with_native:
        print(f"  native sourcing skipped: the origin's nats-server {origin_version} predates 2.14", flush=True)
    print(
        f"  {revision_text(results.revision)}; {total} measurements, each on a fresh hub + leaf under {workdir}",
        flush=True,
    )
    done = 0
    t0 = time.monotonic()

    def step(what: str, r: ThroughputRun | LatencyRun, began: float) -> None:
        nonlocal done
        done += 1
        now = time.monotonic()
        print(f"[{done:>3}/{total}] {now - t0:6.0f}s  {what}: {_describe(r)}  ({now - began:.0f} s)", flush=True)

    try:
        for size in sizes:
            for retention in retentions:
                combo = f"{report.size_label(size)} {retention}"
                for rep in range(1, reps + 1):
                    for path in throughput_paths:
                        began = time.monotonic()
                        tr = throughput(options, path, size, retention, messages[size], rep)
                        results.throughput.append(tr)
                        step(f"throughput {combo} x{messages[size]:,} rep {rep} {path}", tr, began)
                if with_latency:
                    for rep in range(1, args.latency_reps + 1):
                        for path in latency_paths:
                            began = time.monotonic()
                            lr = latency(options, path, size, retention, args.latency_rate, latency_seconds, rep)
                            results.latency.append(lr)
                            step(f"latency {combo} rep {rep} {path}", lr, began)
        if backlog:
            began = time.monotonic()
            results.backlog = throughput(options, BRIDGE, BACKLOG_SIZE, "workqueue", backlog, 0)
            step(f"backlog {backlog:,} x {BACKLOG_SIZE} B workqueue bridge", results.backlog, began)
    except KeyboardInterrupt:
        print("bench: interrupted; nothing written", file=sys.stderr)
        return 130
    finally:
        # measurements that failed keep their directories (their errors name them); the rest are gone
        if not args.keep and workdir.exists() and not any(workdir.iterdir()):
            shutil.rmtree(workdir, ignore_errors=True)

    results.finished = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    results.machine["loadavg_end"] = loadavg()
    end = git_revision(REPO_ROOT)
    results.revision["at_end"] = end
    if end["bridge_sha256"] != results.revision["bridge_sha256"]:
        results.revision["bridge_changed_during_run"] = True
        print(
            f"WARNING: bridge/ changed during the run (commit {results.revision['commit']} -> {end['commit']}): "
            "measurements may mix two versions of the bridge",
            file=sys.stderr,
        )
    summaries = report.summarize(results.throughput, results.latency)
    items = report.targets(summaries, results.backlog, args.latency_rate)
    print()
    print(f"bridge: {report.mode_label(results)}")
    print(report.format_table(summaries))
    print()
    print(report.format_costs(summaries))
    print(report.format_backlog(results.backlog))
    print(report.format_targets(items))

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stamp}.json"
    document: dict[str, Any] = results.as_dict()
    document["summary"] = [s.as_dict() for s in summaries]
    document["targets"] = [{"target": n, "measured": m, "met": met} for n, m, met in items]
    json_path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nJSON  {rel(json_path)}")
    png_path: Path | None = out / f"{stamp}.png"
    try:
        assert png_path is not None
        report.write_chart(results, summaries, png_path)
        print(f"chart {rel(png_path)}")
    except ImportError as exc:
        png_path = None
        print(f"chart skipped: {exc}", file=sys.stderr)
    if args.no_record or (quick and not args.record):
        print(f"not appended to {rel(args.results_md)} ({'--quick' if quick else '--no-record'})")
    else:
        section = report.markdown_section(
            results, summaries, rel(json_path), rel(png_path) if png_path is not None else None
        )
        with args.results_md.open("a", encoding="utf-8") as f:
            f.write("\n" + section)
        print(f"appended to {rel(args.results_md)}")
    failures = results.failures
    if failures:
        print(f"\n{len(failures)} measurement(s) failed:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    return 0
