"""The ``nats-bridge`` command: ``run``, ``check`` and ``demo``.

Exit codes: 0 success; 1 a check or the demo found a problem, or the bridge could not run; 2 invalid
configuration or usage (one line per problem, no traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

from bridge import __version__
from bridge.errors import ConfigError

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_CONFIG = 2


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

    demo = sub.add_parser("demo", help="start a local leaf and hub, replicate a workload, print the counts")
    demo.add_argument("--messages", type=int, default=50_000, help="messages to publish (default 50000)")
    demo.add_argument("--size", type=int, default=512, help="payload bytes per message (default 512)")
    demo.add_argument("--keep", action="store_true", help="keep the servers' directory for inspection")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and ``python -m bridge``."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args.config)
        if args.command == "check":
            return _check(args.config)
        if args.command == "demo":
            from bridge.demo import run_demo

            return run_demo(messages=args.messages, size=args.size, keep=args.keep)
    except ConfigError as err:
        from bridge.config import format_config_error

        print(format_config_error(err), file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return EXIT_OK
    return EXIT_CONFIG


def _run(path: str) -> int:
    from bridge import logs
    from bridge.config import load_config
    from bridge.runtime.app import Bridge

    config = load_config(path)
    logs.configure(config.log.level, config.log.format)
    anyio.run(Bridge(config).run)
    return EXIT_OK


def _check(path: str) -> int:
    from bridge.check import run_check
    from bridge.config import load_config

    config = load_config(path)
    return EXIT_OK if anyio.run(run_check, config) else EXIT_PROBLEM


if __name__ == "__main__":
    sys.exit(main())
