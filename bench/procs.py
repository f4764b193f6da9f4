"""What the kernel says about a process: CPU seconds and peak/current resident memory (Linux ``/proc``)."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.stats import cpu_model, mem_total_bytes, parse_proc_stat_ticks, parse_status_kib
from bridge.testing.processes import child_env

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (its own, not its children's).

    Raises:
        OSError: no such process (or no ``/proc``).
    """
    return parse_proc_stat_ticks(Path(f"/proc/{pid}/stat").read_text()) / _TICKS


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the process's main thread alone (the bridge's event loop; the rest of
    :func:`cpu_seconds` is its other threads': the fleet's, and any worker's).

    Raises:
        OSError: no such process (or no ``/proc``).
    """
    return parse_proc_stat_ticks(Path(f"/proc/{pid}/task/{pid}/stat").read_text()) / _TICKS


def _status_bytes(pid: int, key: str) -> int:
    kib = parse_status_kib(Path(f"/proc/{pid}/status").read_text(), key)
    if kib is None:
        raise OSError(f"/proc/{pid}/status has no {key}")
    return kib * 1024


def peak_rss_bytes(pid: int) -> int:
    """``VmHWM``: the largest resident set the process has had since it started, in bytes."""
    return _status_bytes(pid, "VmHWM")


def rss_bytes(pid: int) -> int:
    """``VmRSS``: the resident set now, in bytes."""
    return _status_bytes(pid, "VmRSS")


def machine() -> dict[str, Any]:
    """CPU count and model, RAM, kernel and Python: printed with every result."""

    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(read("/proc/cpuinfo")),
        "mem_total_bytes": mem_total_bytes(read("/proc/meminfo")),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def git_revision(repo: Path) -> dict[str, Any]:
    """The commit the working tree is on and whether ``bridge/`` differs from it (what was measured)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "--short=12", "HEAD") or "unknown",
        "bridge_dirty": bool(git("status", "--porcelain", "--", "bridge")),
        "bridge_sha256": bridge_digest(repo),
        "core": bridge_core_build(repo),
    }


def bridge_core_build(repo: Path) -> str:
    """How the bridge processes this bench starts run their core: ``compiled``, or ``interpreted`` and why
    (``bridge.CORE_BUILD``, asked of an interpreter started as they are)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import bridge; print(bridge.CORE_BUILD)"],
            cwd=repo,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() or "unknown"


def revision_text(revision: dict[str, Any]) -> str:
    """``commit X`` with what else decides what was measured: uncommitted changes, the core's build."""
    dirty = " (bridge/ modified)" if revision.get("bridge_dirty") else ""
    return f"commit {revision.get('commit')}{dirty}, core {revision.get('core', 'unknown')}"


def bridge_digest(repo: Path) -> str:
    """A digest of every ``bridge/**/*.py`` file's path and content: it changes when the measured code does
    (committed or not), so a run during which someone edited the bridge can say so."""
    digest = hashlib.sha256()
    for path in sorted((repo / "bridge").rglob("*.py")):
        digest.update(str(path.relative_to(repo)).encode() + b"\0")
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"<unreadable>")
    return digest.hexdigest()[:16]
