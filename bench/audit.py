"""``python -m bench audit``: how fast the ``jetstream`` data source reads and how long ``nats-bridge audit`` takes.

One hub; an aggregate preloaded with ``--messages`` copies carrying the bridge's provenance headers (built by the
bridge's own ``build_header_block``, chained by ``Bridge-Prev`` like a clean replication of one source). Then, in
one embedded Spark session (``local[*]``):

1. the data source's read rate with one partition (rows/s per partition) and with one per core (total), each
   the best of ``--reps`` full reads (every column produced and summed, so nothing is pruned);
2. the wall time of the whole audit on that aggregate, report files included (the best of ``--reps``).

The figures are printed and written as JSON; README's *Audit* section quotes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.natsops import Publisher, api, connect
from bridge.core import headers as hdr
from bridge.testing.servers import NatsServer

STREAM = "AGG"
SOURCE = "edge1"


def parser(sub: Any) -> None:
    """Add the ``audit`` subcommand to ``python -m bench``."""
    audit = sub.add_parser("audit", help="measure the Spark data source's read rate and the audit's wall time")
    audit.add_argument("--messages", type=int, default=1_000_000, help="copies in the aggregate (default 1000000)")
    audit.add_argument("--size", type=int, default=256, help="payload bytes per copy (default 256)")
    audit.add_argument("--reps", type=int, default=2, help="repetitions of each measurement, best kept (default 2)")
    audit.add_argument("--out", type=Path, help="write the figures as JSON here too")


async def _preload(url: str, count: int, size: int) -> float:
    nc = await connect(url, "bench audit preload")
    try:
        await api(nc, f"$JS.API.STREAM.CREATE.{STREAM}", {"name": STREAM, "subjects": ["edge.>"], "allow_direct": True})
        payload = os.urandom(size)
        started = time.monotonic()
        async with Publisher(nc, 4096) as pub:
            for seq in range(1, count + 1):
                block = hdr.build_header_block(
                    None,
                    source=SOURCE,
                    stream="ORIGIN",
                    stream_seq=seq,
                    prev_seq=seq - 1,
                    subject=f"orders.{seq % 16}",
                    timestamp_ns=time.time_ns() - 2_000_000,
                )
                await pub.publish(f"edge.{SOURCE}.orders.{seq % 16}", payload, headers=hdr.parse_header_block(block))
            await pub.drain(120)
        return count / (time.monotonic() - started)
    finally:
        await nc.close()


def _best(reps: int, run: Any) -> float:
    best = float("inf")
    for _ in range(reps):
        started = time.monotonic()
        run()
        best = min(best, time.monotonic() - started)
    return best


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    from bridge.audit.job import AuditOptions, read_stream, run_audit
    from bridge.config import BridgeConfig, SourceConfig, TargetConfig
    from bridge.spark.session import spark_session, stop_spark

    workdir = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    hub = NatsServer(workdir / "hub", name="hub", max_file_store="16GB")
    hub.start()
    try:
        hub.wait_ready()
        print(f"preloading {args.messages:,} copies of {args.size} B into {STREAM} ...", flush=True)
        preload_rate = asyncio.run(_preload(hub.url, args.messages, args.size))
        print(f"  preloaded at {preload_rate:,.0f} msg/s", flush=True)
        spark = spark_session()
        cores = spark.sparkContext.defaultParallelism
        results: dict[str, Any] = {"messages": args.messages, "size": args.size, "cores": cores}

        def full_read(partitions: int) -> None:
            df, _ = read_stream(spark, {"servers": hub.url, "stream": STREAM, "partitions": str(partitions)})
            sums = ("sum(seq)", "sum(size)", "sum(payload_hash % 7)", "sum(size(headers))", "max(timestamp)")
            df.selectExpr(*sums).collect()

        for label, partitions in (("one_partition", 1), ("all_cores", cores)):
            seconds = _best(args.reps, lambda p=partitions: full_read(p))
            results[f"read_{label}_rows_per_s"] = round(args.messages / seconds)
            print(f"  data source, {partitions} partition(s): {args.messages / seconds:,.0f} rows/s ({seconds:.1f} s)")
        config = BridgeConfig(
            target=TargetConfig(servers=[hub.url], stream=STREAM),
            sources=[SourceConfig(name=SOURCE, servers=[hub.url], stream="ORIGIN")],
        )
        out = workdir / "report"
        verdicts: list[bool] = []

        def audit() -> None:
            report = run_audit(config, AuditOptions(out=out), spark=spark, progress=lambda _: None)
            verdicts.append(report.ok and report.sources[0].distinct == args.messages)

        seconds = _best(args.reps, audit)
        results["audit_seconds"] = round(seconds, 1)
        results["audit_clean"] = all(verdicts)
        print(f"  nats-bridge audit of {args.messages:,} copies: {seconds:.1f} s, verdict clean: {all(verdicts)}")
        stop_spark(spark)
        print(json.dumps(results))
        if args.out is not None:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
        return 0 if all(verdicts) else 1
    finally:
        hub.stop()
        shutil.rmtree(workdir, ignore_errors=True)
