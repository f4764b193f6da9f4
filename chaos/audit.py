"""``--audit``: after the scenarios, run the bridge's own Spark audit (``nats-bridge audit``) on each scenario's
aggregate and require it to agree with this suite's checker.

The checker knows the truth (every attempt, every publish ack, every forward reset the nemesis made); the audit
knows only what the aggregate's provenance headers say. Agreement on a run full of faults is the evidence that the
audit, which operators run where no checker exists, finds what there is to find. Per source they must agree on
the copies stored (distinct origin messages), lost, duplicated and reordered; what the checker excused must be
what the audit found skipped or never delivered; and the audit's chain must start at the beginning (a fresh
bridge).

Each scenario's hub keeps its store until then; the audit restarts a hub on it alone, after every scenario has
finished, so Spark never competes for the CPU with a scenario's timing.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from bridge.testing.servers import NatsServer
from chaos.model import ScenarioResult
from chaos.topology import AGGREGATE, SOURCES


def agreement(result: ScenarioResult, audited: dict[str, Any]) -> list[str]:
    """Where the audit's per-source findings (``report.to_json()["sources"]`` by name) and the checker's differ."""
    problems = []
    for verdict in result.verdicts:
        found = audited.get(verdict.source)
        if found is None:
            if verdict.stored:
                problems.append(f"audit: source {verdict.source} has {verdict.stored} copies but the audit saw none")
            continue
        pairs = {
            "stored": (verdict.stored, found["distinct"]),
            "lost": (verdict.lost, found["lost"]),
            "duplicated": (verdict.duplicated, found["duplicates"]),
            "reordered": (verdict.reordered, found["reordered"]),
            "chain start": (0, found["chain_start"]),
        }
        for what, (checker, audit) in pairs.items():
            if checker != audit:
                problems.append(f"audit disagrees on {verdict.source} {what}: checker {checker}, audit {audit}")
        # What the nemesis excused (forward resets, a deleted consumer) is what the chain explains. The checker
        # counts the acked attempts in those ranges, the audit every origin sequence in them, which also holds any
        # attempt the origin stored although its publish ack was lost: up to attempted - acked more, never fewer.
        checker, audit = verdict.excused, found["skipped"] + found["not_delivered"]
        unacked = verdict.attempted - verdict.acked
        if not checker <= audit <= checker + unacked:
            problems.append(
                f"audit disagrees on {verdict.source} excused: checker {checker}, audit {audit} "
                f"(may exceed the checker's by the {unacked} attempts without a publish ack, no more)"
            )
    return problems


def audit_results(results: list[ScenarioResult], workdirs: list[Path], *, binary: str | None, keep: bool) -> None:
    """Audit each scenario's aggregate (its hub restarted on the store it left) and record the comparison in
    ``result.audit`` and, on disagreement, ``result.problems``. Removes a passing scenario's directory unless
    ``keep``."""
    from bridge.audit.job import AuditOptions, run_audit
    from bridge.config import BridgeConfig, SourceConfig, TargetConfig
    from bridge.spark.session import spark_session, stop_spark
    from bridge.testing.spark_cluster import JAVA_OPTIONS

    # the test clusters' JVM options (the client compiler, the serial collector): a few small jobs, where the
    # optimising compiler costs CPU it never earns back
    spark = spark_session(java_options=JAVA_OPTIONS)
    try:
        for result, workdir in zip(results, workdirs, strict=True):
            hub_dir = workdir / "servers" / "hub"
            if not (hub_dir / "store").is_dir():
                result.problems.append(f"audit: no aggregate store left in {hub_dir}")
                continue
            started = time.monotonic()
            hub = NatsServer(hub_dir, name="hub", binary=binary, domain="hub")
            try:
                hub.start()
                hub.wait_ready()
                config = BridgeConfig(
                    target=TargetConfig(servers=[hub.url], stream=AGGREGATE),
                    sources=[SourceConfig(name=s.name, servers=[hub.url], stream=s.stream) for s in SOURCES],
                )
                report = run_audit(config, AuditOptions(out=None), spark=spark, progress=lambda _: None)
            except Exception as exc:
                result.problems.append(f"audit: could not run: {exc!r}")
                continue
            finally:
                hub.stop()
            sources = {s["source"]: s for s in report.to_json()["sources"]}
            result.audit = {"seconds": round(time.monotonic() - started, 1), "sources": sources}
            result.problems += agreement(result, sources)
            if result.ok and not keep:
                shutil.rmtree(workdir, ignore_errors=True)
    finally:
        stop_spark(spark)
