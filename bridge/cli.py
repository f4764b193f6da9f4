"""The ``nats-bridge`` command: ``run``, ``check``, ``status``, ``reset``, ``audit`` and ``demo``.

Exit codes: 0 success; 1 a check, the audit or the demo found a problem, or the bridge could not run; 2 invalid
configuration or usage (one line per problem, no traceback); 3 the audit could not read a stream (nothing judged).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from bridge import __version__
from bridge.errors import ConfigError

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_CONFIG = 2
EXIT_UNAUDITED = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nats-bridge",
        description="Replicate NATS JetStream streams from edge servers into an aggregate stream, losing nothing.",
    )
    parser.add_argument("--version", action="version", version=f"nats-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="replicate every configured source until SIGTERM/SIGINT")
    run.add_argument("-c", "--config", required=True, help="TOML configuration file")

    check = sub.add_parser("check", help="validate the configuration and every server, consumer and stream")
    check.add_argument("-c", "--config", required=True, help="TOML configuration file")

    status = sub.add_parser("status", help="per source: consumer state, stored watermark, lag, the daemon's last error")
    status.add_argument("-c", "--config", required=True, help="TOML configuration file")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    reset = sub.add_parser("reset", help="reset one source's consumer (to its ack floor, or --seq N), after confirming")
    reset.add_argument("-c", "--config", required=True, help="TOML configuration file")
    reset.add_argument("source", help="the source's name")
    reset.add_argument("--seq", type=int, help="next origin sequence to deliver (default: the ack floor + 1)")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    audit = sub.add_parser(
        "audit", help="prove with Spark that the aggregate holds every origin message once and in order"
    )
    audit.add_argument("-c", "--config", required=True, help="TOML configuration file (the bridge's own)")
    audit.add_argument(
        "--origin-too", action="store_true", help="also compare with what each origin still holds (Limits/Interest)"
    )
    audit.add_argument("--out", default="audit-report", help="directory for report.json, Parquet and audit.png")
    audit.add_argument("--master", help="Spark master URL (default: embedded local[*], or spark-submit's)")
    audit.add_argument("--json", action="store_true", help="print the JSON report instead of the table")

    demo = sub.add_parser("demo", help="start a local leaf and hub, replicate a workload, print the counts")
    demo.add_argument("--messages", type=int, default=50_000, help="messages to publish (default 50000)")
    demo.add_argument("--size", type=int, default=512, help="payload bytes per message (default 512)")
    demo.add_argument("--keep", action="store_true", help="keep the servers' directory for inspection")
    demo.add_argument("--audit", action="store_true", help="then audit the aggregate with Spark (the audit extra)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m bridge``."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args.config)
        if args.command == "check":
            return _check(args.config)
        if args.command == "status":
            return _status(args.config, args.json)
        if args.command == "reset":
            return _reset(args.config, args.source, args.seq, args.yes)
        if args.command == "audit":
            return _audit(args.config, args.origin_too, args.out, args.master, args.json)
        if args.command == "demo":
            from bridge.demo import run_demo

            return run_demo(messages=args.messages, size=args.size, keep=args.keep, audit=args.audit)
    except ConfigError as err:
        from bridge.config import format_config_error

        print(format_config_error(err), file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_CONFIG


def _run(path: str) -> int:
    from bridge import logs
    from bridge.config import exposed_secrets, load_config
    from bridge.runtime.app import Bridge

    config = load_config(path)
    logs.configure(config.log.level, config.log.format)
    for warning in exposed_secrets(path, config):
        logs.get_logger(component="config").warning("config.secret_exposed", problem=warning)
    anyio.run(Bridge(config, config_path=Path(path)).run)
    # drained and answered: a repeated SIGTERM during interpreter exit must not turn exit 0 into "killed"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return EXIT_OK


def _check(path: str) -> int:
    from bridge.check import run_check
    from bridge.config import exposed_secrets, load_config

    config = load_config(path)
    for warning in exposed_secrets(path, config):
        print(f"WARN secrets: {warning}", flush=True)
    return EXIT_OK if anyio.run(run_check, config) else EXIT_PROBLEM


def _status(path: str, as_json: bool) -> int:
    from bridge.admin import collect_status, print_status
    from bridge.config import load_config

    config = load_config(path)
    return EXIT_OK if print_status(anyio.run(collect_status, config), as_json) else EXIT_PROBLEM


def _reset(path: str, source: str, seq: int | None, yes: bool) -> int:
    from bridge.admin import confirm_on_terminal, reset_source
    from bridge.config import load_config
    from bridge.errors import BridgeError

    if seq is not None and seq < 1:
        print("nats-bridge reset: --seq must be >= 1", file=sys.stderr)
        return EXIT_CONFIG
    config = load_config(path)

    def confirm(description: str) -> bool:
        if yes:
            print(description)
            return True
        return confirm_on_terminal(description)

    try:
        done, message = anyio.run(reset_source, config, source, seq, confirm)
    except BridgeError as exc:
        print(f"nats-bridge reset: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    print(message, file=sys.stdout if done else sys.stderr)
    return EXIT_OK if done else EXIT_PROBLEM


def _audit(path: str, origin_too: bool, out: str, master: str | None, as_json: bool) -> int:
    from bridge.config import load_config
    from bridge.errors import AuditError

    config = load_config(path)
    try:
        from bridge.audit.job import AuditOptions, run_audit
        from bridge.audit.report import render_table
    except ImportError as exc:
        print(
            f"nats-bridge audit: {exc.name or exc} is not installed: install the audit extra "
            "(pip install 'nats-bridge[audit]') and Java 17 or newer",
            file=sys.stderr,
        )
        return EXIT_UNAUDITED
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


if __name__ == "__main__":
    sys.exit(main())
