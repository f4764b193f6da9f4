"""``nats-bridge audit``: read the aggregate (and, with ``--origin-too``, the origins) into Spark, judge every
source (:mod:`bridge.audit.analysis`), and write the verdict as a table, JSON, Parquet and a PNG chart.

Spark runs embedded (``local[*]`` on loopback, no UI, workers on this interpreter) unless ``--master`` names a
cluster, or the job was started by ``spark-submit`` (then its master is used). In every mode the ``bridge``
package is zipped (once per process) and shipped to the executors, so the job is the same embedded and on a
cluster; a cluster's executors need its dependencies installed (README, *Audit*). A session already running in
this process (a notebook, a test run) is used as it is and left running.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bridge.audit import analysis as an
from bridge.audit.report import AuditReport, SourceReport, write_chart, write_json
from bridge.config import BridgeConfig, SourceConfig, TargetConfig
from bridge.errors import AuditError, SparkJobFailed, spark_failure
from bridge.spark.options import ReadOptions, side_options
from bridge.spark.read import stream_bounds
from bridge.spark.session import prepare, running_session, spark_session, stop_spark

EXAMPLES = 20  # ranges of each kind kept per source in the report (Parquet has them all)
BUCKETS = 200  # points of the latency-over-time chart


def read_stream(spark: SparkSession, options: dict[str, str]) -> tuple[DataFrame, int]:
    """A stream as a DataFrame of what it held now, and its last sequence now. Options are checked and the stream's
    bounds read here, in the driver, so a bad option or a missing stream is one clear error, not a worker trace.

    The rows are bounded at that last sequence (pushed down to the reads): Spark plans the read only when an
    action runs, and every action (or a cache rebuilt) must see the same snapshot, not what was stored since."""
    opts = ReadOptions.parse(options)
    _, last, messages, _ = asyncio.run(stream_bounds(opts))
    if opts.partitions is None:  # at least one per core, else one per rows_per_partition messages
        wanted = max(spark.sparkContext.defaultParallelism, math.ceil(messages / opts.rows_per_partition), 1)
        options = {**options, "partitions": str(wanted)}
    return spark.read.format("jetstream").options(**options).load().where(F.col("seq") <= last), last


def _latency_ms() -> Any:
    return (F.unix_micros("agg_time") - F.unix_micros("origin_time")) / 1000.0


def _summaries(findings: an.Findings) -> dict[tuple[str, str], dict[str, Any]]:
    first = F.col("first")
    rows = (
        findings.copies.groupBy(*an.KEYS)
        .agg(
            F.count(F.lit(1)).alias("copies"),
            F.sum(first.cast("long")).alias("distinct"),
            F.min("oseq").alias("first_seq"),
            F.max("oseq").alias("last_seq"),
            F.sum(F.col("reordered").cast("long")).alias("reordered"),
            F.sum(F.col("inconsistent").cast("long")).alias("inconsistent"),
            an.chain_start().alias("chain_start"),
            F.percentile_approx(F.when(first, _latency_ms()), [0.5, 0.9, 0.99], 10_000).alias("latency"),
            F.max(F.when(first, _latency_ms())).alias("latency_max"),
            F.min("agg_time").alias("first_time"),
            F.max("agg_time").alias("last_time"),
        )
        .collect()
    )
    return {(r["source"], r["origin_stream"]): r.asDict() for r in rows}


def _ranges(findings: an.Findings) -> DataFrame:
    """Every range the audit found, one DataFrame: ``source, origin_stream, kind, first, last, count``."""
    cols = [*an.KEYS, "kind", "first", "last", "count"]
    out = findings.gaps.select(*cols)
    out = out.unionByName(findings.duplicates.withColumn("kind", F.lit("duplicate")).select(*cols))
    out = out.unionByName(findings.reordered.withColumn("kind", F.lit("reordered")).select(*cols))
    out = out.unionByName(findings.inconsistent.withColumn("kind", F.lit(an.INCONSISTENT)).select(*cols))
    if findings.origin is not None:
        out = out.unionByName(findings.origin.select(*cols))
    return out


def _totals_and_examples(
    ranges: DataFrame,
) -> tuple[dict[tuple[str, str], dict[str, int]], dict[tuple[str, str], dict[str, list[list[int]]]]]:
    totals: dict[tuple[str, str], dict[str, int]] = {}
    for r in ranges.groupBy(*an.KEYS, "kind").agg(F.sum("count").alias("n")).collect():
        totals.setdefault((r["source"], r["origin_stream"]), {})[r["kind"]] = int(r["n"])
    from pyspark.sql import Window

    w = Window.partitionBy(*an.KEYS, "kind").orderBy("first")
    examples: dict[tuple[str, str], dict[str, list[list[int]]]] = {}
    wanted = ranges.where(F.col("kind") != an.NOT_DELIVERED).withColumn("_n", F.row_number().over(w))
    for r in wanted.where(F.col("_n") <= EXAMPLES).orderBy("first").collect():
        key = (r["source"], r["origin_stream"])
        examples.setdefault(key, {}).setdefault(r["kind"], []).append([int(r["first"]), int(r["last"])])
    return totals, examples


def _timeline(findings: an.Findings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Latency percentiles per time bucket per source, and the gap ranges with their time (for the chart)."""
    firsts = findings.copies.where("first")
    bounds = firsts.agg(F.min(F.unix_micros("agg_time")), F.max(F.unix_micros("agg_time"))).first()
    if bounds is None or bounds[0] is None:
        return [], []
    t0, t1 = int(bounds[0]), int(bounds[1])
    width = max(1_000_000, math.ceil((t1 - t0 + 1) / BUCKETS))
    bucket = F.floor((F.unix_micros("agg_time") - F.lit(t0)) / F.lit(width))
    latency = [
        {"source": r["source"], "t": (t0 + int(r["b"]) * width) / 1e6, "p50": r["p"][0], "p99": r["p"][1]}
        for r in firsts.groupBy("source", bucket.alias("b"))
        .agg(F.percentile_approx(_latency_ms(), [0.5, 0.99], 1000).alias("p"))
        .orderBy("b")
        .collect()
    ]
    gaps = [
        {"source": r["source"], "kind": r["kind"], "t": r["t"], "count": int(r["count"])}
        for r in findings.gaps.where(F.col("kind") != an.NOT_DELIVERED)
        .select("source", "kind", (F.unix_micros("at_time") / 1e6).alias("t"), "count")
        .orderBy(F.desc("count"))
        .limit(10_000)
        .collect()
    ]
    return latency, gaps


def _reports(
    summaries: dict[tuple[str, str], dict[str, Any]],
    totals: dict[tuple[str, str], dict[str, int]],
    examples: dict[tuple[str, str], dict[str, list[list[int]]]],
    configured: list[tuple[str, str]],
    origin_checked: set[str],
) -> list[SourceReport]:
    out = []
    names = {name for name, _ in configured}
    for key in sorted(set(summaries) | set(totals) | set(configured)):
        s = summaries.get(key, {})
        t = totals.get(key, {})
        latency = s.get("latency") or [None, None, None]
        out.append(
            SourceReport(
                source=key[0],
                origin_stream=key[1],
                configured=key[0] in names,
                copies=int(s.get("copies", 0)),
                distinct=int(s.get("distinct", 0)),
                first_seq=s.get("first_seq"),
                last_seq=s.get("last_seq"),
                chain_start=s.get("chain_start"),
                duplicates=int(s.get("copies", 0)) - int(s.get("distinct", 0)),  # extra copies, like the checker
                reordered=t.get("reordered", 0),
                lost=t.get(an.LOST, 0),
                skipped=t.get(an.SKIPPED, 0),
                not_delivered=t.get(an.NOT_DELIVERED, 0),
                inconsistent=int(s.get("inconsistent", 0)),
                latency_ms={"p50": latency[0], "p90": latency[1], "p99": latency[2], "max": s.get("latency_max")},
                origin=(
                    {kind: t.get(kind, 0) for kind in (an.ABSENT, an.EXTRA, an.HASH_MISMATCH, an.PENDING)}
                    if key[0] in origin_checked
                    else None
                ),
                examples=examples.get(key, {}),
            )
        )
    return out


def _write_files(spark: SparkSession, report: AuditReport, findings: an.Findings, ranges: DataFrame, out: Path) -> None:
    """``sources.parquet`` (one row per source), ``ranges.parquet`` (every range found) and ``audit.png``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("sources.parquet", "ranges.parquet"):
        shutil.rmtree(out / name, ignore_errors=True)
    rows = [r.parquet_row() for r in report.sources]
    sources = spark.createDataFrame(rows, SourceReport.parquet_schema())
    sources.coalesce(1).write.parquet(str((out / "sources.parquet").resolve()))
    ranges.write.parquet(str((out / "ranges.parquet").resolve()))
    latency, gaps = _timeline(findings)
    write_chart(latency, gaps, out / "audit.png")


@dataclass
class AuditOptions:
    """What ``nats-bridge audit`` was asked for."""

    origin_too: bool = False
    out: Path | None = Path("audit-report")  # None: the verdict only, no files
    master: str | None = None


def run_audit(
    config: BridgeConfig,
    options: AuditOptions,
    *,
    spark: SparkSession | None = None,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> AuditReport:
    """Audit the aggregate of ``config`` (every source found in it; with ``origin_too`` also each configured
    source's origin) and write the report files into ``options.out``. Raises :class:`AuditError` when a stream
    cannot be read, :class:`SparkJobFailed` when Spark fails.

    Runs on ``spark``, else on the session already running in this process, else on one of its own
    (:func:`spark_session`), which it stops at the end; a session it did not start is left running."""
    started = time.monotonic()
    target = config.target
    # every stream is checked before Spark starts: a wrong name or a missing allow_direct fails in a second
    sides: list[TargetConfig | SourceConfig] = [target, *(config.sources if options.origin_too else [])]
    for side in sides:
        asyncio.run(stream_bounds(ReadOptions.parse(side_options(side))))
    if spark is None:
        spark = running_session()
        if spark is not None and options.master not in (None, spark.sparkContext.master):
            raise AuditError(
                f"--master {options.master}: this process already runs Spark on {spark.sparkContext.master}, "
                "which the audit uses; run it in a process of its own to choose the master"
            )
    own = spark is None
    try:
        spark = spark_session(options.master, app_name="nats-bridge-audit") if spark is None else prepare(spark)
        return _audit(config, options, spark, progress, started)
    except AuditError:
        raise
    except Exception as exc:
        # put in words here, before the session is stopped: a JVM exception's text is fetched from the JVM
        raise SparkJobFailed(f"the Spark job failed: {spark_failure(exc)}", traceback.format_exc()) from exc
    finally:
        if own and spark is not None:
            stop_spark(spark)  # the executors and the JVM go now, not at interpreter exit


def _audit(
    config: BridgeConfig,
    options: AuditOptions,
    spark: SparkSession,
    progress: Callable[[str], None],
    started: float,
) -> AuditReport:
    target = config.target
    # The aggregate's snapshot is taken first, each origin's after it. Every copy at or below the aggregate's
    # last sequence was stored before that snapshot, so the origin message it copies was stored before the
    # origin's bounds are read: a running bridge cannot make a copy look "extra" (a sequence above the origin's
    # last). The other order would let copies stored between the two reads name sequences the origin read
    # does not reach.
    aggregate, agg_last = read_stream(spark, {**side_options(target), "headers": ",".join(an.HEADERS)})
    progress(f"reading aggregate {target.stream} (up to sequence {agg_last}) on {', '.join(target.servers)}")
    aggregate = aggregate.cache()
    origins: DataFrame | None = None
    origin_last: dict[tuple[str, str], int] = {}
    if options.origin_too:
        for source in config.sources:
            df, last = read_stream(spark, {**side_options(source), "headers": ""})
            progress(f"reading origin {source.stream} of source {source.name} (up to sequence {last})")
            origin_last[(source.name, source.stream)] = last
            df = df.withColumn("source", F.lit(source.name))
            origins = df if origins is None else origins.unionByName(df)
    findings = an.analyse(aggregate, origins, origin_last)
    findings.copies = findings.copies.cache()
    summaries = _summaries(findings)
    ranges = _ranges(findings).cache()
    totals, examples = _totals_and_examples(ranges)
    report = AuditReport(
        aggregate={"stream": target.stream, "servers": list(target.servers), "last_seq": agg_last},
        foreign=findings.foreign.count(),
        sources=_reports(
            summaries, totals, examples, [(s.name, s.stream) for s in config.sources], {k[0] for k in origin_last}
        ),
        origin_checked=options.origin_too,
    )
    if options.out is not None:
        _write_files(spark, report, findings, ranges, options.out)
    report.seconds = round(time.monotonic() - started, 2)
    if options.out is not None:
        write_json(report, options.out / "report.json")
    ranges.unpersist()
    findings.copies.unpersist()
    aggregate.unpersist()
    return report


if __name__ == "__main__":  # spark-submit .../bridge/audit/job.py -c FILE [...]: the same as nats-bridge audit
    from bridge.commands.audit import main

    sys.exit(main(sys.argv[1:]))
