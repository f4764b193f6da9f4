"""What every ``python -m bench`` command shares: the repository root, the load average, sizes and message counts
as the options spell them."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as recorded with every result ("" where the OS has none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return ""


def rel(path: Path) -> str:
    """``path`` relative to the repository root when it lies below it (as results name their files)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def list_items(text: str) -> list[str]:
    """The items of a comma-separated option value, stripped and lower-cased, empty ones left out."""
    return [item for item in (part.strip().lower() for part in text.split(",")) if item]


def parse_sizes(text: str) -> tuple[int, ...]:
    """``256,1024,16384`` (also ``1KiB``, ``16k``) -> payload sizes in bytes, each once."""
    out: list[int] = []
    for item in list_items(text):
        factor = 1
        for suffix in ("kib", "kb", "k"):
            if item.endswith(suffix):
                item, factor = item[: -len(suffix)], 1024
                break
        try:
            value = int(item.rstrip("b")) * factor
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a size: {item!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"message size must be >= 1 byte, got {value}")
        out.append(value)
    if not out:
        raise argparse.ArgumentTypeError("no message sizes")
    return tuple(dict.fromkeys(out))


def parse_messages(text: str) -> dict[int, int] | int:
    """``100000`` (every size) or ``256=200000,1024=100000``."""
    try:
        if "=" not in text:
            value = int(text)
            if value < 1:
                raise argparse.ArgumentTypeError("--messages must be >= 1")
            return value
        out: dict[int, int] = {}
        for item in text.split(","):
            size, _, count = item.partition("=")
            out[parse_sizes(size)[0]] = int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--messages: N or SIZE=N,..., not {text!r}") from None
    if any(v < 1 for v in out.values()):
        raise argparse.ArgumentTypeError("--messages must be >= 1")
    return out
