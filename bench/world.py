"""One measurement's world: a fresh hub + leaf in a directory of its own, the bridge as a child process, and the run
that starts it, connects a client to each server, hands both to the measurement, and always tears it down.

``bench run`` and ``bench profile`` (``bench.runner``) and ``bench recovery`` measure on it. The directory holds the
servers (``servers/``), the bridge's configuration (``bridge.toml``) and its log (``bridge.log``, every run of the
process appended); it is removed after a measurement that went well unless ``--keep`` is given, and kept, its path
in the error, after one that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from nats.aio.client import Client

from bench import natsops as ops
from bench.procs import cpu_seconds
from bridge.testing.processes import BridgeProcess
from bridge.testing.servers import Topology, start_topology

# a limit, not an allocation: a 1M-message backlog with the bridge's headers needs over 1 GB, a 1M aggregate 400 MB
MAX_FILE_STORE = "64GB"
BRIDGE_STOP_TIMEOUT = 30.0


class World:
    """A fresh hub + leaf in ``directory`` (:func:`~bridge.testing.servers.start_topology`), and the bridge once
    started.

    ``binary`` is the hub's ``nats-server`` (and the leaf's unless ``leaf_binary``; None: the one found on the
    PATH); ``leaf_remote_extra`` goes into the leaf's remote block.
    """

    def __init__(
        self,
        directory: Path,
        *,
        binary: str | None = None,
        leaf_binary: str | None = None,
        leaf_remote_extra: str = "",
    ) -> None:
        self.directory = directory
        self.topology: Topology = start_topology(
            directory / "servers",
            binary=binary,
            leaf_binary=leaf_binary,
            max_file_store=MAX_FILE_STORE,
            leaf_remote_extra=leaf_remote_extra,
        )
        self.config = directory / "bridge.toml"
        self.bridge: BridgeProcess | None = None

    def write_config(self, text: str) -> None:
        """Write the bridge's configuration (read by the next start)."""
        self.config.write_text(text)

    def start_bridge(self, interpreter_args: Sequence[str] = ()) -> BridgeProcess:
        """Start ``python -m bridge run`` on the configuration; returns at once.

        After a stop or a kill, the same process starts again (a restart): its log is appended to, and the
        ``interpreter_args`` of the first start are kept.
        """
        if self.bridge is None:
            self.bridge = BridgeProcess(self.config, self.directory / "bridge.log", interpreter_args=interpreter_args)
        return self.bridge.start()

    @property
    def bridge_pid(self) -> int | None:
        """The running bridge's PID (None when no bridge runs)."""
        return self.bridge.pid if self.bridge is not None else None

    def bridge_failure(self) -> str | None:
        """Why the bridge is no longer running (with its log's tail), or None while it runs or before it started;
        the ``alive`` check of every wait on what the bridge does."""
        if self.bridge is None or self.bridge.is_running:
            return None
        return f"bridge exited early; log tail:\n{self.bridge.tail(15)}"

    async def stop_bridge(self) -> int:
        """SIGTERM; the exit code (a bridge that ignores it for 30 s is killed and raises TimeoutError)."""
        return await asyncio.to_thread(self._started().stop, BRIDGE_STOP_TIMEOUT)

    async def kill_bridge(self) -> int:
        """SIGKILL (a crash); the exit code."""
        return await asyncio.to_thread(self._started().kill)

    def _started(self) -> BridgeProcess:
        if self.bridge is None:
            raise RuntimeError("bridge not started")
        return self.bridge

    def server_cpu(self) -> float:
        """CPU seconds the hub and the leaf have used so far."""
        total = 0.0
        for server in self.topology.servers:
            if server.pid is not None:
                total += cpu_seconds(server.pid)
        return total

    def close(self, ok: bool, keep: bool) -> None:
        """Kill the bridge if it still runs, stop the servers; remove the directory if ``ok`` and not ``keep``."""
        try:
            if self.bridge is not None:
                self.bridge.cleanup()
        finally:
            self.topology.stop()
            if ok and not keep:
                shutil.rmtree(self.directory, ignore_errors=True)


Body = Callable[[World, Client, Client], Awaitable[None]]


def in_world(
    directory: Path,
    body: Body,
    *,
    failed: Callable[[], bool],
    keep: bool,
    binary: str | None = None,
    leaf_binary: str | None = None,
    leaf_remote_extra: str = "",
) -> None:
    """Start a :class:`World` in ``directory``, run ``body(world, leaf, hub)`` in a fresh event loop with a client
    of the leaf and one of the hub (closed after it), and always tear the world down.

    The directory is removed unless ``body`` raised, ``failed()`` says so, or ``keep``.
    """
    world = World(directory, binary=binary, leaf_binary=leaf_binary, leaf_remote_extra=leaf_remote_extra)
    ok = False
    try:

        async def main() -> None:
            leaf = await ops.connect(world.topology.leaf.url, "bench leaf")
            hub = await ops.connect(world.topology.hub.url, "bench hub")
            try:
                await body(world, leaf, hub)
            finally:
                for nc in (leaf, hub):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(nc.close(), 5)

        asyncio.run(main())
        ok = not failed()
    finally:
        world.close(ok, keep)


class Outcome(Protocol):
    """What a measurement's result records of its failure."""

    ok: bool
    error: str | None


def guarded(run: Outcome, directory: Path, measure: Callable[[], None]) -> None:
    """Run ``measure``; any failure ends up in ``run.error``, naming the directory with the logs."""
    try:
        measure()
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    run.ok = run.error is None
    if not run.ok:
        run.error = f"{run.error} (logs in {directory})"
