"""``python -m bench recovery``: start-up to first copy and restart recovery with a large aggregate."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def parser(sub: Any) -> None:
    """Add the ``recovery`` subcommand to ``python -m bench``."""
    sub.add_parser("recovery", help="start-up to first copy and restart recovery with a large aggregate")


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    print("not written yet", file=sys.stderr)
    return 2
