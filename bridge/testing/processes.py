"""Child processes the harness starts: a registry that kills leftovers at exit, and the bridge as a child process.

Every process started here (nats-servers from :mod:`bridge.testing.servers`, bridges) is recorded by PID with
:func:`register_child` and SIGKILLed by an :mod:`atexit` handler if still running when the interpreter exits, so
an aborted run leaves no orphans behind. That handler does not run when Python itself dies of a signal it does
not handle (SIGKILL, or SIGTERM with the default disposition); the children run in their own session, so they
then outlive it.

:class:`BridgeProcess` is ``python -m bridge run -c CONFIG`` started through the CLI and stopped by its PID, with
its log queried as JSON events; :func:`run_cli` runs a one-shot ``python -m bridge ...`` command to completion.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from bridge._build import PURE_ENV
from bridge.testing.http import LOOPBACK, get
from bridge.testing.polling import wait_until

__all__ = [
    "INSTANCE_ID_ENV",
    "REPO_ROOT",
    "BridgeFactory",
    "BridgeProcess",
    "child_env",
    "fleet_instance",
    "live_pids",
    "reap_child",
    "register_child",
    "run_cli",
    "stop_process",
]

# The checkout this package runs from: the bridge child's working directory and first import path.
REPO_ROOT = Path(__file__).resolve().parents[2]

# --- registry: every child process started here and not reaped yet, by PID --------------------------------------

_live: dict[int, subprocess.Popen[bytes]] = {}
_live_lock = threading.Lock()


def register_child(proc: subprocess.Popen[bytes]) -> None:
    """Track a child process so that it is SIGKILLed at interpreter exit unless reaped (:func:`reap_child`) first."""
    with _live_lock:
        _live[proc.pid] = proc


def reap_child(proc: subprocess.Popen[bytes], timeout: float | None) -> None:
    """Wait for ``proc`` to exit (raising ``subprocess.TimeoutExpired`` after ``timeout``), then forget it."""
    proc.wait(timeout=timeout)
    with _live_lock:
        _live.pop(proc.pid, None)


def _kill_all_live() -> None:
    """At interpreter exit, SIGKILL and reap every child still running, so none outlives the run."""
    with _live_lock:
        procs = list(_live.values())
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            reap_child(proc, timeout=5)


atexit.register(_kill_all_live)


def live_pids() -> list[int]:
    """PIDs of the child processes registered here (servers, and bridges) not yet reaped."""
    with _live_lock:
        return sorted(_live)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGSTOP ``proc`` and return once every thread of it is stopped (Linux), or after ``timeout``.

    The signal is asynchronous: a thread running on another CPU goes on until it next enters the kernel, so a
    test that sends a request right after ``kill()`` returns can still see it answered. Where ``/proc`` is
    absent this only sends the signal.
    """
    proc.send_signal(signal.SIGSTOP)
    tasks = Path(f"/proc/{proc.pid}/task")
    if not tasks.is_dir():
        return
    deadline = time.monotonic() + timeout
    while not _all_threads_stopped(tasks) and time.monotonic() < deadline:
        time.sleep(0.001)


def _all_threads_stopped(tasks: Path) -> bool:
    try:
        for task in tasks.iterdir():
            # Field 3 of stat follows the parenthesised command name, which may itself hold spaces.
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("T", "t"):
                return False
    except (OSError, IndexError):
        return True  # the process or a thread is gone: nothing left to wait for
    return True


# --- the bridge CLI as a child ---------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment for a bridge child: ours without any ``NATS_BRIDGE_*`` configuration override, with the repo
    importable."""
    # (NATS_BRIDGE_PURE_PYTHON is no configuration: it chooses the core's build, bridge/_build.py)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("NATS_BRIDGE_") or k == PURE_ENV}
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_cli(
    *args: str, timeout: float = 30.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m bridge ARGS`` to completion (bounded), capturing its output; ``env`` adds variables."""
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        cwd=REPO_ROOT,
        env={**child_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class BridgeProcess:
    """``python -m bridge run -c CONFIG`` in its own session, stdout+stderr appended to ``log_path``.

    ``returncodes`` collects the exit code of every run that ended, in order.
    """

    def __init__(
        self,
        config_path: Path,
        log_path: Path,
        extra_env: Mapping[str, str] | None = None,
        interpreter_args: Sequence[str] = (),
    ) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        # options of the Python interpreter before ``-m bridge`` (the bench profiles with ``-m cProfile -o FILE``)
        self.interpreter_args = tuple(interpreter_args)
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self.returncodes: list[int] = []
        self._events: list[dict[str, Any]] = []  # the log's JSON events, parsed once each (_all_events)
        self._events_to = 0  # the bytes of the log they were parsed from: whole lines only

    def __repr__(self) -> str:
        return f"<BridgeProcess pid={self.pid} running={self.is_running} log={self.log_path}>"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- life cycle ---------------------------------------------------------------------------------------------

    def start(self) -> BridgeProcess:
        """Spawn the bridge; returns at once."""
        if self.is_running:
            raise RuntimeError(f"bridge already running (pid {self.pid})")
        self._reap_exited()
        with self.log_path.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} starting bridge ===\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                [sys.executable, *self.interpreter_args, "-m", "bridge", "run", "-c", str(self.config_path)],
                cwd=REPO_ROOT,
                env={**child_env(), **self.extra_env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        register_child(self._proc)  # SIGKILLed at exit if a run is interrupted
        self._paused = False
        return self

    def _reap_exited(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            self._finish(proc, proc.wait())

    def _finish(self, proc: subprocess.Popen[bytes], code: int) -> int:
        reap_child(proc, timeout=None)
        self._proc = None
        self._paused = False
        self.returncodes.append(code)
        return code

    def stop(self, timeout: float) -> int:
        """SIGTERM and wait up to ``timeout`` s; returns the exit code.

        Raises TimeoutError if it did not exit in time (after SIGKILLing and reaping it).
        """
        proc = self._proc
        if proc is None:
            raise RuntimeError("bridge not started")
        if proc.poll() is None:
            if self._paused:
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                self._finish(proc, proc.wait())
                raise TimeoutError(f"bridge pid {proc.pid} ignored SIGTERM for {timeout:g}s; killed") from None
        return self._finish(proc, proc.wait())

    def kill(self) -> int:
        """SIGKILL (a crash: no shutdown at all) and reap; returns the exit code (-9), or the earlier one."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("bridge not started")
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
        return self._finish(proc, proc.wait())

    async def astop(self, timeout: float) -> int:
        """:meth:`stop` in a worker thread, so the caller's event loop keeps running."""
        return await anyio.to_thread.run_sync(self.stop, timeout)

    async def akill(self) -> int:
        """:meth:`kill` in a worker thread."""
        return await anyio.to_thread.run_sync(self.kill)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but runs nothing until :meth:`resume`."""
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("bridge not running")
        stop_process(self._proc)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a bridge paused by :meth:`pause`."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
        self._paused = False

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the running bridge (SIGHUP: re-read the configuration)."""
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("bridge not running")
        self._proc.send_signal(signum)

    def cleanup(self) -> None:
        """SIGKILL if still running; always reap."""
        if self._proc is not None:
            self.kill()

    # -- the log ------------------------------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def events(self, event: str | tuple[str, ...] | None = None, **fields: Any) -> list[dict[str, Any]]:
        """The JSON log events written so far (non-JSON lines skipped), in order; with ``event`` (a name, or a tuple
        of names any of which will do), only the lines of that event with every one of ``fields`` equal.
        ``source=name`` also matches an event that lists ``name`` in its ``sources`` (what a lease group's events
        carry). Each event is parsed once and the same dict returned by every later call: read it, do not change it."""
        out = self._all_events()
        if event is None:
            return list(out)
        names = (event,) if isinstance(event, str) else event
        return [e for e in out if e.get("event") in names and all(_field_is(e, k, v) for k, v in fields.items())]

    def _all_events(self) -> list[dict[str, Any]]:
        """Every JSON event of the log so far, parsing only the whole lines written since the last call: the log is
        only appended to, and :meth:`wait_event` looks twenty times a second (parsing the whole log each time cost
        a long test's wait more CPU the longer its log grew)."""
        try:
            with self.log_path.open("rb") as log:
                if log.seek(0, os.SEEK_END) < self._events_to:  # written anew: parsed anew
                    self._events, self._events_to = [], 0
                log.seek(self._events_to)
                chunk = log.read()
        except FileNotFoundError:
            return self._events
        whole = chunk.rfind(b"\n") + 1
        for line in chunk[:whole].decode("utf-8", errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    self._events.append(json.loads(line))
        self._events_to += whole
        return self._events

    def count(self, event: str | tuple[str, ...], **fields: Any) -> int:
        """How many ``event`` lines (with every one of ``fields`` equal) the log holds."""
        return len(self.events(event, **fields))

    async def wait_event(self, event: str | tuple[str, ...], *, timeout: float, after: int = 0, **fields: Any) -> None:
        """Wait until the log holds more than ``after`` ``event`` lines (matching ``fields``); fail if it died."""

        def probe() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise AssertionError(f"bridge exited with {self._proc.returncode}:\n{self.tail()}")
            return self.count(event, **fields) > after

        await wait_until(probe, timeout=timeout, what=f"bridge log event {event!r} #{after + 1}")

    # -- the HTTP listener --------------------------------------------------------------------------------------

    def http_port(self) -> int | None:
        """The port the current run's HTTP listener bound (its last ``http.listening``), None before that."""
        text = self.log_text()
        start = text.rfind("starting bridge ===")
        port = None
        for line in text[start:].splitlines():
            if '"http.listening"' in line:
                with contextlib.suppress(ValueError, KeyError):
                    port = int(json.loads(line)["port"])
        return port

    def readyz(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """The running process's ``/readyz`` body (its status aside), None when it does not answer within
        ``timeout`` seconds (a body of thousands of sources from a busy process takes longer than a test's)."""
        port = self.http_port()
        if port is None or not self.is_running or self._paused:
            return None
        try:
            _, body = get(f"http://{LOOPBACK}:{port}/readyz", timeout)
        except OSError:
            return None
        with contextlib.suppress(ValueError):
            data = json.loads(body)
            return data if isinstance(data, dict) else None
        return None

    def owned(self) -> list[str]:
        """The sources this process owns, from its ``/readyz`` (empty when it does not answer)."""
        body = self.readyz() or {}
        fleet = body.get("fleet") or {}
        return [str(s) for s in fleet.get("owned", [])]


BridgeFactory = Callable[..., BridgeProcess]  # (config_path, env=None, interpreter_args=()) -> a started BridgeProcess

# the name a bridge writes into its leases and presence (default: <host>-<pid>, which no scenario can predict)
INSTANCE_ID_ENV = "NATS_BRIDGE_COORDINATION__INSTANCE_ID"


def fleet_instance(bridge_procs: BridgeFactory, config: Path, name: str) -> BridgeProcess:
    """A bridge started by ``bridge_procs`` on ``config`` as fleet instance ``name``, so that scenarios with
    several processes read (and assert) which one owns what."""
    return bridge_procs(config, {INSTANCE_ID_ENV: name})


def _field_is(event: dict[str, Any], name: str, value: Any) -> bool:
    if event.get(name) == value:
        return True
    listed = event.get("sources")
    return name == "source" and isinstance(listed, list) and value in listed
