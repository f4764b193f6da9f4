"""``python -m bench stream``: the Spark streaming source's read rate, and edge-to-table latency through ingest.

1. **Read rate.** One hub, an aggregate preloaded with ``--messages`` copies (as ``bench audit`` does); a streaming
   query (``Trigger.AvailableNow``, the ``noop`` sink, every column produced) reads all of it with one partition
   and with one per core: rows per second, the best of ``--reps``.
2. **Latency.** A hub and a leaf, a WorkQueue origin on the leaf, ``nats-bridge run`` replicating into the hub's
   aggregate, and ``nats-bridge ingest``'s query (in this process, ``--trigger`` seconds) writing the Parquet table;
   a producer publishes at ``--rate`` msg/s for ``--seconds``. A row's latency is the time from its origin store
   time (``Bridge-Time``, the edge publish's ack) to the commit of the micro-batch that wrote it: the moment the
   file sink's metadata log lists its file, when a reader of the table first sees it. p50 / p99 / max, over every
   row and over the steady state (rows published after the first batch committed: the query's start excluded).

Figures are printed and written as JSON (``--out``); bench/RESULTS.md quotes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.audit import STREAM, _preload
from bench.natsops import api, connect
from bridge.testing.configs import SourceSpec, write_config
from bridge.testing.processes import BridgeProcess
from bridge.testing.servers import NatsServer, start_topology

ORIGIN = "ORDERS"


def parser(sub: Any) -> None:
    """Add the ``stream`` subcommand to ``python -m bench``."""
    stream = sub.add_parser("stream", help="measure the Spark streaming source and edge-to-Parquet latency")
    stream.add_argument("--messages", type=int, default=500_000, help="copies for the read rate (default 500000)")
    stream.add_argument("--size", type=int, default=256, help="payload bytes (default 256)")
    stream.add_argument("--reps", type=int, default=2, help="repetitions of the read-rate runs, best kept")
    stream.add_argument("--rate", type=int, default=1000, help="producer rate for the latency run, msg/s")
    stream.add_argument("--seconds", type=float, default=30.0, help="length of the latency run's production")
    stream.add_argument("--trigger", type=float, default=0.5, help="the ingest query's trigger interval, seconds")
    stream.add_argument("--out", type=Path, help="write the figures as JSON here too")


def _read_rate(spark: Any, url: str, messages: int, partitions: int, reps: int, workdir: Path) -> float:
    best = float("inf")
    for rep in range(reps):
        query = (
            spark.readStream.format("jetstream")
            .option("servers", url)
            .option("stream", STREAM)
            .option("partitions", str(partitions))
            .load()
            .selectExpr("seq", "size", "payload_hash", "size(headers) AS h", "timestamp", "origin_seq")
            .writeStream.format("noop")
            .option("checkpointLocation", str(workdir / f"rate-{partitions}-{rep}"))
            .trigger(availableNow=True)
        )
        started = time.monotonic()
        running = query.start()
        running.awaitTermination()
        best = min(best, time.monotonic() - started)
        rows = sum(int(p.get("numInputRows", 0)) for p in running.recentProgress)
        if rows != messages:
            raise RuntimeError(f"read {rows} rows, expected {messages}")
    return messages / best


async def _produce(url: str, rate: int, seconds: float, size: int) -> int:
    nc = await connect(url, "bench stream producer")
    try:
        js = nc.jetstream()
        payload = os.urandom(size)
        total = int(rate * seconds)
        started = time.monotonic()
        for i in range(total):
            due = started + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await js.publish(f"orders.{i % 16}", payload)
        return total
    finally:
        await nc.close()


def _commit_times(table: Path) -> dict[str, float]:
    """File path -> commit time of the batch that wrote it, from the file sink's metadata log."""
    out: dict[str, float] = {}
    log = table / "_spark_metadata"
    for entry in log.iterdir():
        if not entry.name.isdigit():
            continue  # compacted logs are switched off for this run (their times would be the compaction's)
        committed = entry.stat().st_mtime
        for line in entry.read_text().splitlines()[1:]:
            out[json.loads(line)["path"]] = committed
    return out


def _percentiles(label: str, latencies: list[float]) -> dict[str, int]:
    ordered = sorted(latencies)
    if not ordered:
        return {}
    return {
        f"{label}_rows": len(ordered),
        f"{label}_p50_ms": round(1000 * statistics.median(ordered)),
        f"{label}_p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))]),
        f"{label}_max_ms": round(1000 * ordered[-1]),
    }


def _latency(spark: Any, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from bridge.commands.ingest import start_query
    from bridge.config import load_config

    topology = start_topology(workdir / "servers", max_file_store="8GB")
    bridge: BridgeProcess | None = None
    try:

        async def streams() -> None:
            leaf = await connect(topology.leaf.url, "bench stream setup")
            hub = await connect(topology.hub.url, "bench stream setup")
            try:
                await api(
                    leaf,
                    f"$JS.API.STREAM.CREATE.{ORIGIN}",
                    {"name": ORIGIN, "subjects": ["orders.>"], "retention": "workqueue"},
                )
                await api(
                    hub,
                    f"$JS.API.STREAM.CREATE.{STREAM}",
                    {"name": STREAM, "subjects": ["edge.>"], "allow_direct": True},
                )
            finally:
                await leaf.close()
                await hub.close()

        asyncio.run(streams())
        spec = SourceSpec(name="edge1", servers=topology.hub.url, domain="leaf", subject_prefix="edge.edge1")
        config_path = write_config(workdir / "bridge.toml", target_url=topology.hub.url, sources=[spec])
        bridge = BridgeProcess(config_path, workdir / "bridge.log").start()
        table, checkpoint = workdir / "table", workdir / "checkpoint"
        spark.conf.set("spark.sql.streaming.fileSink.log.compactInterval", "1000000")
        query = start_query(spark, load_config(config_path, environ={}), str(table), str(checkpoint), args.trigger)
        produced = asyncio.run(_produce(topology.leaf.url, args.rate, args.seconds, args.size))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            query.awaitTermination(1)
            done = sum(int(p.get("numInputRows", 0)) for p in query.recentProgress)
            if done >= produced:
                break
        query.stop()
        commits = _commit_times(table)
        rows = (
            spark.read.parquet(str(table))
            .select(F.input_file_name().alias("file"), F.col("origin_time").cast("double").alias("origin"))
            .collect()
        )
        pairs = [(r["origin"], commits[r["file"]] - r["origin"]) for r in rows if r["file"] in commits]
        if len(pairs) != produced:
            raise RuntimeError(f"{len(pairs)} rows in the table, {produced} produced")
        # steady state: rows published after the first batch was committed (the query's start-up excluded)
        first_commit = min(commits.values())
        steady = [latency for origin, latency in pairs if origin > first_commit]
        return {
            "rate": args.rate,
            "rows": produced,
            "trigger_s": args.trigger,
            **_percentiles("all", [latency for _, latency in pairs]),
            **_percentiles("steady", steady),
        }
    finally:
        if bridge is not None:
            bridge.stop(30.0)
        topology.stop()


def run(args: argparse.Namespace) -> int:
    """Run both measurements; returns the exit code."""
    from bridge.spark.session import spark_session, stop_spark

    workdir = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    hub = NatsServer(workdir / "hub", name="hub", max_file_store="16GB")
    hub.start()
    spark = None
    try:
        hub.wait_ready()
        print(f"preloading {args.messages:,} copies of {args.size} B into {STREAM} ...", flush=True)
        asyncio.run(_preload(hub.url, args.messages, args.size))
        spark = spark_session()
        cores = spark.sparkContext.defaultParallelism
        results: dict[str, Any] = {"messages": args.messages, "size": args.size, "cores": cores}
        for label, partitions in (("one_partition", 1), ("all_cores", cores)):
            rate = _read_rate(spark, hub.url, args.messages, partitions, args.reps, workdir)
            results[f"stream_read_{label}_rows_per_s"] = round(rate)
            print(f"  streaming source, {partitions} partition(s): {rate:,.0f} rows/s", flush=True)
        hub.stop()
        print(f"latency: {args.rate} msg/s for {args.seconds:g} s, edge -> bridge -> aggregate -> Parquet", flush=True)
        results["latency"] = _latency(spark, args, workdir)
        print(f"  {results['latency']}", flush=True)
        print(json.dumps(results))
        if args.out is not None:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
        return 0
    finally:
        if spark is not None:
            stop_spark(spark)
        hub.stop()
        shutil.rmtree(workdir, ignore_errors=True)
