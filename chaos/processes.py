"""The bridge as a child OS process, started through its CLI, stopped by its PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bridge.embedded import reap_child, register_child, stop_process

REPO_ROOT = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """The environment for a bridge child: ours without any ``NATS_BRIDGE_*`` override, with the repo importable."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("NATS_BRIDGE_")}
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class BridgeProcess:
    """``python -m bridge run -c CONFIG`` in its own session, stdout+stderr appended to ``log_path``.

    ``returncodes`` collects the exit code of every run that ended, in order.
    """

    def __init__(self, config_path: Path, log_path: Path, extra_env: Mapping[str, str] | None = None) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self.returncodes: list[int] = []

    def __repr__(self) -> str:
        return f"<BridgeProcess pid={self.pid} running={self.is_running} log={self.log_path}>"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> BridgeProcess:
        """Spawn the bridge; returns at once."""
        if self.is_running:
            raise RuntimeError(f"bridge already running (pid {self.pid})")
        self._reap_exited()
        with self.log_path.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} starting bridge ===\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "bridge", "run", "-c", str(self.config_path)],
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

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def events(self) -> list[dict[str, Any]]:
        """The JSON log events written so far (non-JSON lines skipped)."""
        out = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

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

    def readyz(self) -> dict[str, Any] | None:
        """The running process's ``/readyz`` body (its status aside), None when it does not answer."""
        port = self.http_port()
        if port is None or not self.is_running or self._paused:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
                body = reply.read()
        except urllib.error.HTTPError as err:
            body = err.read()
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
