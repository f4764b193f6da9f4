"""``nats-bridge audit``: prove with Spark that the aggregate holds every origin message once and in order.

The Spark job itself is :mod:`bridge.audit.job`; this is the command around it. :func:`main` is the same command
for ``spark-submit .../bridge/audit/job.py -c FILE [...]``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

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
from bridge.errors import AuditError, SparkJobFailed

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
    add_verbose(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """``nats-bridge audit`` with its own arguments only (the job's entry point under spark-submit)."""
    parser = argparse.ArgumentParser(prog="nats-bridge audit")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return guarded(lambda: audit_args(args))


def audit_args(args: argparse.Namespace) -> int:
    """:func:`audit` with the options :func:`add_arguments` parsed (this command's ``main`` and ``bridge.cli``)."""
    return audit(args.config, args.origin_too, args.out, args.master, args.json, verbose=args.verbose)


def audit(path: str, origin_too: bool, out: str, master: str | None, as_json: bool, *, verbose: bool = False) -> int:
    """Run the audit and print its report: exit 0 when clean, 1 when it found a problem, 2 when ``out`` is not a
    directory, 3 when it could not judge (a stream it cannot read, Spark that cannot run or failed: one line;
    ``verbose`` adds the traceback)."""
    from bridge.config import load_config  # here, not on import: the CLI builds its parser with this module

    config = load_config(path)
    try:
        from bridge.audit.job import AuditOptions, run_audit
        from bridge.audit.report import render_table
    except ImportError as exc:
        print(f"nats-bridge audit: {exc.name or exc} is not installed: {AUDIT_EXTRA}", file=sys.stderr)
        return EXIT_UNAUDITED
    if (wrong := directory_problem("--out", out)) is not None:
        print(f"nats-bridge audit: {wrong}", file=sys.stderr)  # said now, not after the whole Spark job ran
        return EXIT_CONFIG
    if (cannot := spark_cannot_run("audit", config.target, path, master)) is not None:
        return cannot
    try:
        report = run_audit(config, AuditOptions(origin_too=origin_too, out=Path(out), master=master))
    except AuditError as exc:
        print(f"nats-bridge audit: {exc}", file=sys.stderr)
        if verbose:
            # a Spark failure's traceback was written down while its JVM ran; any other is whole here
            print(exc.detail if isinstance(exc, SparkJobFailed) else traceback.format_exc(), file=sys.stderr, end="")
        return EXIT_UNAUDITED
    if as_json:
        import json

        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print(render_table(report))
        print(f"report: {Path(out) / 'report.json'}, {Path(out) / 'audit.png'}, Parquet in {out}/")
    return EXIT_OK if report.ok else EXIT_PROBLEM
