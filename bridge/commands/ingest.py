"""``nats-bridge ingest``: the aggregate into a Parquet table, exactly once, with Spark Structured Streaming.

The query reads the aggregate with the ``jetstream`` stream reader (``bridge.spark``: its offset is the stream
sequence, so a restarted query re-reads exactly what its last committed batch did not cover) and writes with
Spark's file sink, which commits each batch's files in the checkpoint's metadata log only after they are written:
a query killed at any point and started again with the same ``--checkpoint`` writes each aggregate message once.
Rows are partitioned by ``source`` (the bridge's ``Bridge-Source``; ``_unknown`` for messages no bridge stored) and
``day`` (of the origin store time, else the aggregate's). Read the table with Spark (``spark.read.parquet(DIR)``):
it lists only committed files through ``DIR/_spark_metadata``.

``local[*]`` by default; ``--master`` runs the same job on a cluster (the package is shipped to the executors).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from bridge.commands.common import (
    AUDIT_EXTRA,
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNAUDITED,
    add_verbose,
    directory_problem,
    guarded,
    spark_cannot_run,
)
from bridge.errors import spark_failure

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from bridge.config import BridgeConfig

HELP = "stream the aggregate into a Parquet table partitioned by source and day, each message exactly once"
PROGRESS_EVERY = 5  # seconds between progress lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="TOML configuration file (the bridge's own)")
    parser.add_argument("--to", required=True, help="directory of the Parquet table")
    parser.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory for this query (keep it)")
    parser.add_argument(
        "--trigger",
        default="available-now",
        help="available-now (default: ingest what is there, then stop) or SECONDS (a micro-batch every SECONDS, "
        "until SIGTERM/Ctrl-C)",
    )
    parser.add_argument("--master", help="Spark master URL (default: embedded local[*])")
    add_verbose(parser)
    parser.add_argument(
        "--max-messages-per-trigger", type=int, default=None, help="admission control: at most this many per batch"
    )


def parse_trigger(text: str) -> float | None:
    """``available-now`` -> None; ``SECONDS`` -> the interval. Raises ``ValueError`` naming what is allowed."""
    if text == "available-now":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"--trigger {text!r}: use available-now or a number of seconds above 0, e.g. 10")
    return seconds


@dataclass
class Progress:
    """What the query did so far, from its progress reports."""

    started: float = field(default_factory=time.monotonic)
    rows: int = 0
    batches: int = 0
    offset: int | None = None  # the last stream sequence committed
    latest: int | None = None  # the stream's last sequence, as the reader last saw it
    seen: set[int] = field(default_factory=set)

    def update(self, reports: Sequence[dict[str, Any]]) -> None:
        for report in reports:
            batch = int(report.get("batchId", -1))
            if batch in self.seen:
                continue
            self.seen.add(batch)
            rows = int(report.get("numInputRows", 0))
            self.rows += rows
            self.batches += 1 if rows else 0
            for src in report.get("sources", []):
                self.offset = _seq(src.get("endOffset"), self.offset)
                self.latest = _seq(src.get("latestOffset"), self.latest)

    @property
    def lag(self) -> int | None:
        if self.latest is None or self.offset is None:
            return None
        return max(0, self.latest - self.offset)

    def line(self, rate: float) -> str:
        lag = "?" if self.lag is None else str(self.lag)
        return (
            f"ingest: {self.rows} rows in {self.batches} batches, {rate:,.0f} rows/s, "
            f"offset seq {self.offset if self.offset is not None else '-'}, lag {lag}"
        )


def _seq(offset: object, default: int | None) -> int | None:
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return default
    if isinstance(offset, dict) and "seq" in offset:
        return int(offset["seq"])
    return default


def start_query(
    spark: SparkSession,
    config: BridgeConfig,
    to: str,
    checkpoint: str,
    interval: float | None,
    max_per_trigger: int | None = None,
) -> StreamingQuery:
    """Start the ingest query: the aggregate's stream reader into Parquet, partitioned by source and day."""
    from pyspark.sql import functions as F

    from bridge.spark.options import side_options

    reader = spark.readStream.format("jetstream").options(**side_options(config.target))
    if max_per_trigger is not None:
        reader = reader.option("maxMessagesPerTrigger", str(max_per_trigger))
    rows = (
        reader.load()
        .withColumn("source", F.coalesce(F.col("source"), F.lit("_unknown")))
        .withColumn("day", F.to_date(F.coalesce(F.col("origin_time"), F.col("timestamp"))))
    )
    writer = (
        rows.writeStream.format("parquet")
        .option("path", to)
        .option("checkpointLocation", checkpoint)
        .partitionBy("source", "day")
        .queryName("nats-bridge-ingest")
    )
    writer = (
        writer.trigger(availableNow=True) if interval is None else writer.trigger(processingTime=f"{interval} seconds")
    )
    return writer.start()


def ingest(
    path: str,
    to: str,
    checkpoint: str,
    trigger: str,
    master: str | None,
    max_per_trigger: int | None = None,
    *,
    verbose: bool = False,
) -> int:
    """Run the ingest query until it has taken what is there (available-now) or until SIGTERM/Ctrl-C."""
    from bridge.config import load_config

    try:
        interval = parse_trigger(trigger)
    except ValueError as exc:
        print(f"nats-bridge ingest: {exc}", file=sys.stderr)
        return 2
    config = load_config(path)
    try:
        from bridge.spark.session import WORKER_LATE_RETRIES, spark_session, stop_spark, worker_was_late
    except ImportError as exc:
        print(f"nats-bridge ingest: {exc.name or exc} is not installed: {AUDIT_EXTRA}", file=sys.stderr)
        return EXIT_UNAUDITED
    for option, where in (("--to", to), ("--checkpoint", checkpoint)):
        if (wrong := directory_problem(option, where)) is not None:
            print(f"nats-bridge ingest: {wrong}", file=sys.stderr)
            return EXIT_CONFIG
    if (cannot := spark_cannot_run("ingest", config.target, path, master)) is not None:
        return cannot
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    spark = spark_session(master)
    progress = Progress()
    code = EXIT_OK
    late = 0
    try:
        while True:
            query = start_query(spark, config, to, checkpoint, interval, max_per_trigger)
            print(f"ingest: {config.target.stream} -> {to} (checkpoint {checkpoint}), query {query.id}", flush=True)
            last_rows, last_at = progress.rows, time.monotonic()
            while query.isActive and not stop.is_set():
                query.awaitTermination(PROGRESS_EVERY)
                progress.update(query.recentProgress)
                now = time.monotonic()
                rate = (progress.rows - last_rows) / max(now - last_at, 1e-9)
                last_rows, last_at = progress.rows, now
                if progress.seen:  # from the first batch on: before it there is nothing to say
                    print(progress.line(rate), flush=True)
            if query.isActive:
                query.stop()  # between batches or in one: an uncommitted batch is written again on the next start
            failure = query.exception()
            progress.update(query.recentProgress)
            if worker_was_late(failure) and not stop.is_set() and late < WORKER_LATE_RETRIES:
                late += 1
                print(
                    "ingest: Spark's Python worker did not start within Spark's fixed 10 s (a loaded machine): "
                    f"the query starts again from its checkpoint ({late} of {WORKER_LATE_RETRIES})",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            break
        if failure is not None:
            print(f"nats-bridge ingest: the query failed: {spark_failure(failure)}", file=sys.stderr)
            code = EXIT_PROBLEM
    except Exception as exc:  # Spark refused the query: said now, while the JVM holding its text still runs
        print(f"nats-bridge ingest: the query could not run: {spark_failure(exc)}", file=sys.stderr)
        if verbose:
            traceback.print_exc()
        code = EXIT_PROBLEM
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_spark(spark)
    elapsed = time.monotonic() - progress.started
    print(
        f"ingest stopped: {progress.rows} rows in {progress.batches} batches, {elapsed:.1f}s, "
        f"offset seq {progress.offset if progress.offset is not None else '-'}, "
        f"lag {progress.lag if progress.lag is not None else '?'}",
        flush=True,
    )
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nats-bridge ingest")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return guarded(lambda: ingest_args(args))


def ingest_args(args: argparse.Namespace) -> int:
    """:func:`ingest` with the options :func:`add_arguments` parsed (this command's ``main`` and ``bridge.cli``)."""
    return ingest(
        args.config,
        args.to,
        args.checkpoint,
        args.trigger,
        args.master,
        args.max_messages_per_trigger,
        verbose=args.verbose,
    )
