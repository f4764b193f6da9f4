"""``python -m bench wan``: bridge and native throughput against edge-hub round-trip time (link delay)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def parser(sub: Any) -> None:
    """Add the ``wan`` subcommand to ``python -m bench``."""
    sub.add_parser("wan", help="bridge and native throughput against edge-hub round-trip time (link delay)")


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    print("not written yet", file=sys.stderr)
    return 2
