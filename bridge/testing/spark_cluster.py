"""A Spark standalone cluster on loopback for the tests: a master and workers, from the installed ``pyspark`` alone.

The pip package of pyspark has ``bin/spark-class`` but not ``sbin/start-master.sh``, so each daemon runs in the
foreground: ``spark-class org.apache.spark.deploy.master.Master ...`` and ``...worker.Worker ... spark://...``, each
in a session (and process group) of its own, its output appended to a log in the cluster's directory. Readiness is
polled from the master's JSON (``http://127.0.0.1:<ui>/json/``: status ``ALIVE``, then every worker ``ALIVE``),
never waited for by sleeping.

A worker starts its executors as child JVMs (in its process group), and each executor starts Python workers, some
in a process group of their own (``pyspark.daemon`` calls ``setpgid``), which a killed parent leaves to init. So
every process the cluster starts is found by a mark in its environment instead, which every descendant inherits
(:data:`MARK`, ``<cluster token>/<role>``): :meth:`SparkCluster.kill_worker` SIGKILLs a worker's group and then
every process still carrying its mark, until none is left; :meth:`SparkCluster.stop` does the same for the whole
cluster, driver processes started with :meth:`SparkCluster.driver_env` included, and raises if any survives.

:meth:`SparkCluster.kill_busy_worker` kills a worker while one of its executors runs a task (read from the
executor's log with the worker's process group stopped, so the task cannot finish between the look and the kill):
the scheduler must then run that task again on another worker.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.testing.http import LOOPBACK, get
from bridge.testing.polling import POLL, wait_until
from bridge.testing.processes import child_env, reap_child, register_child
from bridge.testing.servers import free_ports

__all__ = [
    "MARK",
    "LostTask",
    "SparkCluster",
    "SparkClusterError",
    "SparkWorker",
    "kill_marked",
    "marked_pids",
    "spark_class",
    "tasks_in_flight",
]

# The environment variable that marks every process of a cluster (daemons, executors, their Python workers, the
# drivers started with driver_env): "<cluster token>/<role>". Not NATS_BRIDGE_*: that prefix is configuration.
MARK = "BRIDGE_TESTING_SPARK_PROCESS"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Heap of the master's and each worker's own JVM (the default is 1 GiB each; they hold next to nothing here).
DAEMON_MEMORY = "256m"
# Options of every JVM of the cluster (daemons, executors, drivers): the client compiler only and the serial
# collector start a JVM in about half the time on 2 CPUs (measured: the master ALIVE in 4.6 s rather than 8.3 s),
# and the jobs here are too small for the optimising compiler to pay off.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_HTTP_TIMEOUT = 2.0  # per request to the master's UI: a busy machine answers slowly, and a failed poll is retried
_GONE_TIMEOUT = 30.0  # seconds for every process of a killed worker (or of the cluster) to be gone

# The executor's log lines (log4j INFO, the executors' default) that open and close a task attempt, e.g.
# "Running task 0.0 in stage 7.0 (TID 7)" and "Finished task 0.0 in stage 7.0 (TID 7). 2301 bytes result sent to
# driver"; a failed or killed attempt ends with "Exception in task ..." or "... killed task ...".
_RUNNING = re.compile(r"Running task (\d+)\.(\d+) in stage (\d+)\.(\d+) \(TID (\d+)\)")
_ENDED = re.compile(r"(?:Finished task|Exception in task|killed task) \S+ in stage \S+ \(TID (\d+)\)")


class SparkClusterError(AssertionError):
    """The cluster did not start, did not answer, or left a process behind; the message says which, with logs."""


def spark_class() -> Path:
    """``bin/spark-class`` of the installed pyspark package (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkClusterError("pyspark is not installed: pip install -e '.[audit]'")
    script = Path(next(iter(spec.submodule_search_locations))) / "bin" / "spark-class"
    if not script.is_file():
        raise SparkClusterError(f"{script} is missing: pyspark's package is incomplete")
    return script


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return []


def marked_pids(mark: str) -> list[int]:
    """PIDs of the live processes whose environment holds :data:`MARK` equal to ``mark`` or below it
    (``mark/...``); a zombie's environment reads empty, so it counts as gone."""
    exact, below = f"{MARK}={mark}".encode(), f"{MARK}={mark}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        if any(v == exact or v.startswith(below) for v in _environ(int(entry.name))):
            found.append(int(entry.name))
    return sorted(found)


def kill_marked(mark: str, timeout: float = _GONE_TIMEOUT) -> list[int]:
    """SIGKILL every process carrying ``mark`` (:func:`marked_pids`) until none is left; returns the PIDs killed.

    Raises:
        SparkClusterError: some were still there after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    killed: set[int] = set()
    while pids := marked_pids(mark):
        if time.monotonic() >= deadline:
            raise SparkClusterError(f"processes marked {mark} still alive after {timeout:g}s: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(POLL)
    return sorted(killed)


def _group(pgid: int) -> list[int]:
    """PIDs of the processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                # field 5 of stat (pgrp) follows the command name in parentheses, which may hold spaces
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    members.append(int(entry.name))
    return members


def _group_stopped(pgid: int) -> bool:
    """Whether every thread of every process of group ``pgid`` is stopped (state T), as SIGSTOP leaves them, or
    dead (a zombie: a JVM reaps its exited children on a thread of its own, which SIGSTOP stops too)."""
    for pid in _group(pgid):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, IndexError):
                    if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z", "X"):
                        return False
    return True


@contextlib.contextmanager
def _stopped_group(pgid: int, timeout: float = 1.0) -> Iterator[bool]:
    """SIGSTOP process group ``pgid`` for the block (SIGCONT after it); yields whether every thread of it was seen
    stopped within ``timeout`` (the signal is asynchronous: a thread on another CPU runs on until it next enters the
    kernel, e.g. to write a log line)."""
    os.killpg(pgid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + timeout
        while not (stopped := _group_stopped(pgid)) and time.monotonic() < deadline:
            time.sleep(0.001)
        yield stopped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)


@dataclass(frozen=True)
class LostTask:
    """A task attempt an executor was running when its worker was killed."""

    worker: int  # index of the worker in the cluster
    app: str  # the application's id (app-...)
    partition: int
    attempt: int
    stage: int
    stage_attempt: int
    tid: int

    def retried_in(self, log: str) -> bool:
        """Whether ``log`` (another executor's) ran a later attempt of the same task of the same stage."""
        return any(
            int(m[1]) == self.partition and int(m[2]) > self.attempt and int(m[3]) == self.stage
            for m in _RUNNING.finditer(log)
        )


def tasks_in_flight(log: str) -> list[tuple[int, int, int, int, int]]:
    """The task attempts an executor's log shows started and not ended: ``(partition, attempt, stage,
    stage_attempt, tid)`` each."""
    ended = {int(m[1]) for m in _ENDED.finditer(log)}
    return [
        (int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]))
        for m in _RUNNING.finditer(log)
        if int(m[5]) not in ended
    ]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _tail(path: Path, lines: int) -> str:
    return "\n".join(_read(path).splitlines()[-lines:]) or f"(nothing in {path})"


class _Daemon:
    """One foreground ``spark-class`` process (master or worker) in a session of its own, marked ``mark``."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log_path: Path, mark: str) -> None:
        self.name = name
        self.argv = argv
        self.env = {**env, MARK: mark}
        self.log_path = log_path
        self.mark = mark
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            # spark-class execs the JVM, so this PID is the daemon's own and leads its process group
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        register_child(self.proc)  # SIGKILLed at interpreter exit if a run is interrupted

    def check_running(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise SparkClusterError(f"spark {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")

    def kill(self, timeout: float = _GONE_TIMEOUT) -> list[int]:
        """SIGKILL the process group, then every process still carrying the mark (executors' Python workers in
        groups of their own); returns once all are gone, with the PIDs killed besides the group's leader."""
        if self.proc is None:
            return []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        reap_child(self.proc, timeout=timeout)
        return kill_marked(self.mark, timeout)

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)


@dataclass
class SparkWorker:
    """One worker of a :class:`SparkCluster`: its ports and work directory (each executor's ``stderr`` is in
    ``work_dir/<app id>/<executor id>/``)."""

    index: int
    port: int
    ui_port: int
    work_dir: Path
    daemon: _Daemon

    @property
    def pid(self) -> int | None:
        """PID of the worker's JVM (the leader of its process group), None before it starts."""
        return self.daemon.pid

    def executor_logs(self, app: str = "app-*") -> list[Path]:
        """The ``stderr`` of every executor this worker started (of every application, or of ``app``), in order of
        creation (application ids begin with their start time; executor ids count up)."""
        logs = self.work_dir.glob(f"{app}/*/stderr")
        return sorted(logs, key=lambda p: (p.parent.parent.name, int(p.parent.name) if p.parent.name.isdigit() else 0))

    def executor_log_text(self, app: str = "app-*") -> str:
        """Every executor log of this worker (of ``app``), one after the other."""
        return "\n".join(_read(p) for p in self.executor_logs(app))


class SparkCluster:
    """A standalone master and ``workers`` workers (``cores`` and ``memory`` each) on 127.0.0.1, in ``directory``.

    Nothing runs until :meth:`start`; :meth:`stop` (always call it) kills every process the cluster started and
    raises if one survives. Executors run ``python`` (``PYSPARK_PYTHON`` in the workers' environment and in
    :meth:`driver_env`), with the workers' environment stripped of ``PYTHONPATH``: what they import of the bridge
    is what the driver ships (``bridge.spark.session``), as on a real cluster.
    """

    def __init__(
        self,
        directory: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "512m",
        python: str = sys.executable,
    ) -> None:
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.token = f"spark-{uuid.uuid4().hex[:12]}"
        self.python = python
        self.memory = memory
        self.cores = cores
        self.conf_dir = self.directory / "conf"
        ports = free_ports(2 + 2 * workers)
        self.port, self.ui_port = ports[0], ports[1]
        script = str(spark_class())
        env = self._daemon_env()
        self.master = _Daemon(
            "master",
            [script, MASTER_CLASS, "--host", LOOPBACK, "--port", str(self.port), "--webui-port", str(self.ui_port)],
            env,
            self.directory / "master.log",
            f"{self.token}/master",
        )
        self.workers: list[SparkWorker] = []
        for i in range(workers):
            port, ui_port = ports[2 + 2 * i], ports[3 + 2 * i]
            work_dir = self.directory / f"worker-{i}"
            argv = [script, WORKER_CLASS, "--host", LOOPBACK, "--port", str(port), "--webui-port", str(ui_port)]
            argv += ["--cores", str(cores), "--memory", memory, "--work-dir", str(work_dir), self.url]
            daemon = _Daemon(f"worker {i}", argv, env, self.directory / f"worker-{i}.log", f"{self.token}/worker-{i}")
            self.workers.append(SparkWorker(i, port, ui_port, work_dir, daemon))

    def __repr__(self) -> str:
        return f"<SparkCluster {self.url} workers={len(self.workers)} {self.directory}>"

    @property
    def url(self) -> str:
        """The master's URL, ``spark://127.0.0.1:<port>``: what ``--master`` takes."""
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str:
        """The master's web UI (its JSON is at ``/json/``)."""
        return f"http://{LOOPBACK}:{self.ui_port}"

    def _daemon_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.upper().startswith("NATS_BRIDGE_")}
        env.update(
            PYSPARK_PYTHON=self.python,
            SPARK_LOCAL_IP=LOOPBACK,  # executors bind and advertise loopback, as the workers do
            SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
            SPARK_DAEMON_JAVA_OPTS=JAVA_OPTIONS,
            SPARK_CONF_DIR=str(self.conf_dir),
        )
        return env

    def _write_conf(self) -> None:
        """``spark-defaults.conf`` of the cluster's daemons and of its drivers (spark-submit reads it)."""
        self.conf_dir.mkdir(exist_ok=True)
        settings = {
            "spark.executor.memory": self.memory,  # an executor must fit in a worker's memory (default: 1g)
            "spark.executor.extraJavaOptions": JAVA_OPTIONS,
            "spark.driver.extraJavaOptions": JAVA_OPTIONS,
            # the master's REST submission server listens on 6066 whatever --port says: not wanted, and a second
            # cluster on the machine would fight for it
            "spark.master.rest.enabled": "false",
            # Spark's default of 200 shuffle partitions makes thousands of tasks of a few rows each out of a small
            # audit (more than twice as long for 1,500 copies on one core); a cluster's operator sizes it to the
            # cluster
            "spark.sql.shuffle.partitions": str(self.cores * len(self.workers)),
        }
        text = "".join(f"{key} {value}\n" for key, value in settings.items())
        (self.conf_dir / "spark-defaults.conf").write_text(text, encoding="utf-8")

    def driver_env(self, name: str) -> dict[str, str]:
        """The environment for a driver process (``python -m bridge ingest --master ...``) of this cluster: the
        bridge's child environment, ``PYSPARK_PYTHON`` (the executors' interpreter), the driver on loopback
        (``SPARK_LOCAL_IP``), the cluster's ``spark-defaults.conf`` (executor memory to fit the workers, JVM
        options) and the cluster's mark, so :meth:`stop` finds its JVM and Python workers too."""
        return {
            **child_env(),
            "PYSPARK_PYTHON": self.python,
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_CONF_DIR": str(self.conf_dir),
            MARK: f"{self.token}/driver-{name}",
        }

    # life cycle

    async def start(self, timeout: float = 120.0) -> None:
        """Start the whole cluster: :meth:`start_master`, :meth:`start_workers`, :meth:`wait_workers`.

        Raises:
            SparkClusterError: a daemon exited while starting (its log tail in the message).
            AssertionError: not ready within ``timeout`` seconds (the last state seen in the message).
        """
        deadline = time.monotonic() + timeout
        await self.start_master(timeout)
        self.start_workers()
        await self.wait_workers(max(deadline - time.monotonic(), 1.0))

    async def start_master(self, timeout: float = 120.0) -> None:
        """Start the master and wait until its JSON says ``ALIVE``: a worker (or a driver) that finds no master
        there retries only seconds later, so nothing else starts before.

        Raises:
            SparkClusterError: it exited while starting (its log tail in the message).
            AssertionError: not ``ALIVE`` within ``timeout`` seconds.
        """
        self._write_conf()
        self.master.start()
        await wait_until(
            lambda: self._probe(lambda s: s.get("status") == "ALIVE"),
            timeout=timeout,
            what=f"the Spark master at {self.ui_url} ALIVE",
            interval=0.1,
            retry_on=(OSError, ValueError),
        )

    def start_workers(self) -> None:
        """Start every worker (returns at once; :meth:`wait_workers` waits for them). Drivers may start beside
        them: an application registered before its workers gets its executors when they register."""
        for worker in self.workers:
            worker.work_dir.mkdir(exist_ok=True)
            worker.daemon.start()

    async def wait_workers(self, timeout: float = 120.0) -> None:
        """Wait until the master lists every worker ``ALIVE``.

        Raises:
            SparkClusterError: a daemon exited (its log tail in the message).
            AssertionError: not within ``timeout`` seconds (the last state seen in the message).
        """
        await wait_until(
            lambda: self._probe(lambda _: len(self.alive_workers()) == len(self.workers)),
            timeout=timeout,
            what=f"{len(self.workers)} Spark workers ALIVE at {self.ui_url}",
            interval=0.1,
            retry_on=(OSError, ValueError),
        )

    def _probe(self, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | bool:
        """The master's state when ``done`` accepts it, else False; raises if a daemon has exited."""
        for daemon in (self.master, *(w.daemon for w in self.workers)):
            daemon.check_running()
        state = self.state()
        return state if done(state) else False

    def state(self) -> dict[str, Any]:
        """The master's JSON (``status``, ``workers`` with their ``state``, ``activeapps``...).

        Raises:
            OSError: it did not answer; ValueError: the answer was not JSON.
        """
        status, body = get(f"{self.ui_url}/json/", _HTTP_TIMEOUT)
        if status != 200:
            raise OSError(f"GET {self.ui_url}/json/: HTTP {status}")
        state = json.loads(body)
        if not isinstance(state, dict):
            raise ValueError(f"the master's JSON is no object: {body[:200]!r}")
        return state

    def worker_states(self) -> dict[int, str]:
        """Each of our workers the master knows, by index, with its state (``ALIVE``, ``DEAD``...)."""
        by_port = {w.port: w.index for w in self.workers}
        return {
            by_port[int(w["port"])]: str(w["state"]) for w in self.state().get("workers", []) if w["port"] in by_port
        }

    def alive_workers(self) -> list[int]:
        """Indexes of the workers the master lists ``ALIVE``."""
        return sorted(i for i, state in self.worker_states().items() if state == "ALIVE")

    def kill_worker(self, index: int) -> list[int]:
        """SIGKILL worker ``index``: its process group (the worker and its executors' JVMs), then any process left
        with its mark; returns once every one is gone (the PIDs killed besides the worker's own)."""
        return self.workers[index].daemon.kill()

    def kill_busy_worker(self) -> LostTask | None:
        """If an executor of a live worker is running a task now, SIGKILL that worker (:meth:`kill_worker`) and
        return the task it lost; else None. Call it until it kills one (a poll).

        The executor's log is read with the worker's process group stopped (SIGSTOP, every thread seen stopped), so
        the task cannot end between the look and the kill; a worker found idle is continued (SIGCONT) at once.
        """
        for worker in self.workers:
            pid = worker.pid
            if pid is None or not worker.daemon.running:
                continue
            # the newest executor's log: an older one's application has ended, whatever its log says
            logs = worker.executor_logs()[-1:]
            if not logs or not tasks_in_flight(_read(logs[0])):
                continue  # nothing running by a look without stopping it: no need to stop it
            with _stopped_group(pid) as stopped:
                running = tasks_in_flight(_read(logs[0])) if stopped else []
                if running:
                    os.killpg(pid, signal.SIGKILL)  # while still stopped: the task cannot finish
            if running:
                self.kill_worker(worker.index)
                return LostTask(worker.index, logs[0].parent.parent.name, *running[-1])
        return None

    def leftovers(self) -> list[int]:
        """PIDs of the live processes this cluster started (drivers of :meth:`driver_env` included)."""
        return marked_pids(self.token)

    def stop(self, timeout: float = _GONE_TIMEOUT) -> None:
        """Kill the workers (with their executors), the master and any driver process of :meth:`driver_env`, and
        wait until none is left. Idempotent.

        Raises:
            SparkClusterError: a process of the cluster was still alive after ``timeout`` seconds.
        """
        for daemon in (*(w.daemon for w in self.workers), self.master):
            daemon.kill(timeout)
        kill_marked(self.token, timeout)

    def log_tails(self, lines: int = 30) -> str:
        """The tails of the master's, the workers' and every executor's logs, for a failure's report."""
        parts = [f"----- {d.name} log ({d.log_path}) -----\n{d.log_tail(lines)}" for d in self._daemons()]
        for worker in self.workers:
            for log in worker.executor_logs():
                parts.append(f"----- executor log ({log}) -----\n{_tail(log, lines)}")
        return "\n".join(parts)

    def _daemons(self) -> list[_Daemon]:
        return [self.master, *(w.daemon for w in self.workers)]
