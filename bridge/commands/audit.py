"""``nats-bridge audit``: prove with Spark that the aggregate holds every origin message once and in order.

The Spark job itself is :mod:`bridge.audit.job`; this is the command around it. :func:`main` is the same command
for ``spark-submit .../bridge/audit/job.py -c FILE [...]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bridge.commands.common import (
    AUDIT_EXTRA,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNAUDITED,
    guarded,
    spark_cannot_run,
)
from bridge.errors import AuditError

HELP = "prove with Spark that the aggregate holds every origin message once and in order"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The audit's options, for ``nats-bridge audit`` and :func:`main` alike."""
    parser.add_argument("-c", "--config", required=True, help="TOML configuration file (the bridge's own)")
    parser.add_argument(
        "--origin-too", action="store_true", help="also compare with what each origin still holds (Limits/Interest)"
    )
    parser.add_argument("--out", default="audit-report", help="directory for report.json, Parquet and audit.png")
    parser.add_argument("--master", help="Spark master URL (default: embedded local[*], or spark-submit's)")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the table")


def main(argv: Sequence[str] | None = None) -> int:
    """``nats-bridge audit`` with its own arguments only (the job's entry point under spark-submit)."""
    parser = argparse.ArgumentParser(prog="nats-bridge audit")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return guarded(lambda: audit(args.config, args.origin_too, args.out, args.master, args.json))


def audit(path: str, origin_too: bool, out: str, master: str | None, as_json: bool) -> int:
    """Run the audit and print its report: exit 0 when clean, 1 when it found a problem, 3 when it could not judge."""
    from bridge.config import load_config  # here, not on import: the CLI builds its parser with this module

    config = load_config(path)
    try:
        from bridge.audit.job import AuditOptions, run_audit
        from bridge.audit.report import render_table
    except ImportError as exc:
        print(f"nats-bridge audit: {exc.name or exc} is not installed: {AUDIT_EXTRA}", file=sys.stderr)
        return EXIT_UNAUDITED
    if (cannot := spark_cannot_run("audit", config.target, path)) is not None:
        return cannot
    try:
        report = run_audit(config, AuditOptions(origin_too=origin_too, out=Path(out), master=master))
    except AuditError as exc:
        print(f"nats-bridge audit: {exc}", file=sys.stderr)
        return EXIT_UNAUDITED
    if as_json:
        import json

        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print(render_table(report))
        print(f"report: {Path(out) / 'report.json'}, {Path(out) / 'audit.png'}, Parquet in {out}/")
    return EXIT_OK if report.ok else EXIT_PROBLEM
