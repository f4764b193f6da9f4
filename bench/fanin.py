"""``python -m bench fanin``: one bridge, many sources at a fixed rate each."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def parser(sub: Any) -> None:
    """Add the ``fanin`` subcommand to ``python -m bench``."""
    sub.add_parser("fanin", help="one bridge replicating many sources at a fixed rate each: latency, memory, start-up")


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    print("not written yet", file=sys.stderr)
    return 2
