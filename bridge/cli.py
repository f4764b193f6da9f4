"""The ``nats-bridge`` command: ``run``, ``check``, ``setup``, ``status``, ``reset``, ``health``, ``sources``,
``audit``, ``ingest``, ``demo``.

Exit codes: 0 success; 1 a check, setup, the audit, ingest or the demo found a problem, or the bridge could not
run; 2 invalid configuration or usage (one line per problem, no traceback); 3 the audit could not read a stream
or its Spark job failed (nothing judged), or Spark cannot run (no Java 17+, not installed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bridge import CORE_BUILD, __version__
from bridge.commands.common import EXIT_CONFIG, EXIT_OK, EXIT_PROBLEM, EXIT_UNAUDITED, guarded
from bridge.runtime.signals import hold_stop_signals

__all__ = ["EXIT_CONFIG", "EXIT_OK", "EXIT_PROBLEM", "EXIT_UNAUDITED", "main"]


def _parser() -> argparse.ArgumentParser:
    # imported here, not at the top: ``run`` holds its stop signals before anything heavy is imported (main)
    from bridge.commands import audit as audit_command
    from bridge.commands import ingest as ingest_command
    from bridge.commands import sources as sources_command

    parser = argparse.ArgumentParser(
        prog="nats-bridge",
        description="Replicate NATS JetStream streams from edge servers into an aggregate stream, losing nothing.",
    )
    parser.add_argument("--version", action="version", version=f"nats-bridge {__version__} (core {CORE_BUILD})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="replicate every configured source until SIGTERM/SIGINT")
    run.add_argument("-c", "--config", required=True, help="TOML configuration file")

    check = sub.add_parser("check", help="validate the configuration and every server, consumer and stream")
    check.add_argument("-c", "--config", required=True, help="TOML configuration file")

    setup = sub.add_parser(
        "setup",
        help="create the aggregate stream, managed consumers and lease bucket that are missing; change nothing",
        description=(
            "Create what the configuration needs and is missing: the aggregate stream (Limits, discard old, file, "
            "allow_direct, subjects capturing every source's copies, duplicate window max(2 minutes, 4 x "
            "target.ack_timeout)), each managed consumer, and the coordination bucket. Nothing that exists is "
            "changed; what differs from what the bridge needs is reported with its fix. Exit 0: everything in "
            "place; 1: something differs or failed; 2: invalid configuration."
        ),
    )
    setup.add_argument("-c", "--config", required=True, help="TOML configuration file")
    setup.add_argument("--dry-run", action="store_true", help="connect and read only; say what would be created")
    setup.add_argument(
        "--replicas",
        type=_replicas,
        default=1,
        metavar="N",
        help="replicas of the aggregate stream when created (1-5, default 1)",
    )

    status = sub.add_parser("status", help="per source: consumer state, stored watermark, lag, the daemon's last error")
    status.add_argument("-c", "--config", required=True, help="TOML configuration file")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")

    reset = sub.add_parser("reset", help="reset one source's consumer (to its ack floor, or --seq N), after confirming")
    reset.add_argument("-c", "--config", required=True, help="TOML configuration file")
    reset.add_argument("source", help="the source's name")
    reset.add_argument("--seq", type=int, help="next origin sequence to deliver (default: the ack floor + 1)")
    reset.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    health = sub.add_parser(
        "health", help="ask the running daemon at its configured http.listen: alive (/healthz) or --ready (/readyz)"
    )
    health.add_argument("-c", "--config", required=True, help="TOML configuration file")
    health.add_argument("--ready", action="store_true", help="ask /readyz instead of /healthz")

    sources_command.add_arguments(sub.add_parser("sources", help=sources_command.HELP))
    audit_command.add_arguments(sub.add_parser("audit", help=audit_command.HELP))
    ingest_command.add_arguments(sub.add_parser("ingest", help=ingest_command.HELP))

    demo = sub.add_parser("demo", help="start a local leaf and hub, replicate a workload, print the counts")
    demo.add_argument("--messages", type=int, default=50_000, help="messages to publish (default 50000)")
    demo.add_argument("--size", type=int, default=512, help="payload bytes per message (default 512)")
    demo.add_argument("--keep", action="store_true", help="keep the servers' directory for inspection")
    demo.add_argument("--audit", action="store_true", help="then audit the aggregate with Spark (the audit extra)")
    return parser


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 5:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 5 (got {text!r})")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m bridge``."""
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["run"]:
        hold_stop_signals()  # a SIGTERM while starting is a stop like any other (bridge.runtime.signals)
    args = _parser().parse_args(argv)
    return guarded(lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        from bridge.commands.run import run

        return run(args.config)
    if args.command == "check":
        from bridge.commands.check import check

        return check(args.config)
    if args.command == "setup":
        from bridge.commands.setup import setup

        return setup(args.config, args.dry_run, args.replicas)
    if args.command == "status":
        from bridge.commands.status import status

        return status(args.config, args.json)
    if args.command == "reset":
        from bridge.commands.reset import reset

        return reset(args.config, args.source, args.seq, args.yes)
    if args.command == "health":
        from bridge.commands.health import health

        return health(args.config, args.ready)
    if args.command == "sources":
        from bridge.commands import sources as sources_command

        return sources_command.sources(args)
    if args.command == "audit":
        from bridge.commands import audit as audit_command

        return audit_command.audit_args(args)
    if args.command == "ingest":
        from bridge.commands import ingest as ingest_command

        return ingest_command.ingest_args(args)
    if args.command == "demo":
        from bridge.commands.demo import run_demo

        return run_demo(messages=args.messages, size=args.size, keep=args.keep, audit=args.audit)
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
