"""What every ``python -m bench`` command shares: the repository root, the load average, sizes and message counts
as the options spell them, and (:func:`run_command`) the shape of a measuring command's run."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bench.procs import git_revision, machine, revision_text
from bridge.config import load_config
from bridge.errors import ConfigError
from bridge.testing.servers import ServerStartError, find_nats_server, server_version

REPO_ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as recorded with every result ("" where the OS has none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return ""


class Trial(Protocol):
    """What :func:`execute_trial` fills in on a run's record."""

    loadavg: str
    ok: bool
    error: str | None


def execute_trial(
    run: Trial,
    main: Callable[[], Coroutine[Any, Any, None]],
    *,
    start: Callable[[], None],
    stop: Callable[[], None],
    cleanup: Callable[[], None],
    verdict: Callable[[], str | None],
) -> None:
    """One trial of a bench with servers: ``start`` them, run ``main``, ``cleanup`` (the bridges) and ``stop`` whatever
    happened; the first failure (an exception, then what ``verdict`` finds wrong) lands in ``run.error``."""
    run.loadavg = loadavg()
    try:
        start()
        asyncio.run(main())
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            cleanup()
        finally:
            stop()
    if run.error is None:
        run.error = verdict()
    run.ok = run.error is None


def sigterm_problem(exit_code: int | None) -> str | None:
    """What a bridge's exit code after the bench's SIGTERM says is wrong (None: nothing, or it never ran)."""
    return None if exit_code in (None, 0) else f"bridge exited {exit_code} on SIGTERM"


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


@dataclass(slots=True)
class Session:
    """One run of a measuring command, as :func:`run_command` starts it: what its results record about it."""

    name: str  # the subcommand (``fanin``, ``edge``)
    command: str  # the command line, as the results quote it
    started: dt.datetime  # UTC
    binary: str  # nats-server
    version: str  # nats-server's
    info: dict[str, Any]  # the machine, with ``loadavg_start`` (and ``loadavg_end`` once measured)
    revision: dict[str, Any]
    workdir: Path  # a fresh directory for the servers' and the bridge's files
    t0: float = 0.0  # time.monotonic() when the measurement starts
    elapsed: float = 0.0  # seconds the measurement took


@dataclass(frozen=True, slots=True)
class Report:
    """What a command makes of its measurement: the markdown section (printed), the JSON document's own fields
    (after the shared ones), its targets (each figure next to its target, as a dict) and, when the run failed, what
    to say on stderr."""

    markdown: str
    fields: dict[str, Any]
    targets: list[dict[str, str]]
    failure: str = ""  # "": the run succeeded (exit code 0), else printed to stderr and the exit code is 1


def run_command(
    name: str,
    out: Path | None,
    measure: Callable[[Session], T],
    report: Callable[[Session, T], Report],
    *,
    workdir_holds: str,
    label: str | None = None,
    show_repo_root: bool = False,
    record_elapsed: bool = False,
) -> int:
    """Run a measuring command ``python -m bench <name>``; returns its exit code.

    Finds nats-server (exit code 2 without one), prints what the run is and where it runs (``workdir_holds`` names
    what the working directory holds: ``run``, ``trials``), calls ``measure`` (Ctrl-C: exit code 130, nothing
    written), samples the end's load average, has ``report`` sum the measurement up, prints the markdown, writes
    the JSON document (``out``, else ``bench/results/<name>-<UTC time>.json``) and says where. The document starts
    with the shared fields: ``started``, ``finished``, ``elapsed_s`` (with ``record_elapsed``), ``command``,
    ``label`` (when given), ``machine``, ``revision``, ``repo_root`` (with ``show_repo_root``, which also names it
    in the first lines printed) and ``server_version``; then the report's fields, its ``targets`` and its ``markdown``.
    """
    try:
        binary = find_nats_server()
        version = server_version(binary)
    except ServerStartError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.UTC)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    out_path = out if out is not None else REPO_ROOT / "bench" / "results" / f"{name}-{stamp}.json"
    argv = sys.argv[sys.argv.index(name) :] if name in sys.argv else [name]
    command = "python -m bench " + " ".join(shlex.quote(a) for a in argv)
    info = machine()
    info["loadavg_start"] = loadavg()
    revision = git_revision(REPO_ROOT)
    workdir = Path(tempfile.mkdtemp(prefix=f"nats-bridge-{name}-"))
    session = Session(name, command, started, binary, version, info, revision, workdir)
    root = f" ({REPO_ROOT})" if show_repo_root else ""
    print(f"{name}: {command}", flush=True)
    print(
        f"  {info['nproc']} CPUs ({info['cpu_model']}), nats-server {version}, load average {info['loadavg_start']}; "
        f"{revision_text(revision)}{root}; {workdir_holds} under {workdir}",
        flush=True,
    )
    session.t0 = time.monotonic()
    try:
        result = measure(session)
    except KeyboardInterrupt:
        print(f"{name}: interrupted; nothing written", file=sys.stderr)
        return 130
    session.elapsed = time.monotonic() - session.t0
    info["loadavg_end"] = loadavg()
    summary = report(session, result)
    print("\nmarkdown for bench/RESULTS.md:\n")
    print(summary.markdown)
    document: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if record_elapsed:
        document["elapsed_s"] = session.elapsed
    document["command"] = command
    if label is not None:
        document["label"] = label
    document["machine"] = info
    document["revision"] = revision
    if show_repo_root:
        document["repo_root"] = str(REPO_ROOT)
    document["server_version"] = version
    document.update(summary.fields)
    document["targets"] = summary.targets
    document["markdown"] = summary.markdown
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"JSON {rel(out_path)}")
    if summary.failure:
        print(summary.failure, file=sys.stderr)
        return 1
    return 0


def check_config(text: str, workdir: Path) -> str | None:
    """Why the bridge would refuse the configuration ``text`` (a bad option of the bench's), or None: checked once,
    before any run, with the bridge's own loader."""
    path = workdir / "check.toml"
    path.write_text(text)
    try:
        load_config(path, environ={})
    except ConfigError as exc:
        return str(exc)
    finally:
        path.unlink(missing_ok=True)
    return None
