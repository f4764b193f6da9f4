"""What ``nats-bridge run`` logs for a person following it: the start, what each source waits for, the stop.

* An HTTP address already in use stops ``run`` before it connects to anything: exit 2, ``http.listen_failed``
  naming the address and the fix, then one ``bridge.stopped`` with the summary.
* With the target down at start: connection attempts fail (``target.connect_failed``), never "disconnected"; each
  source says once that it waits for the target, and that the wait is over once it is connected; SIGTERM ends
  with exactly one ``bridge.stopped`` carrying each source's watermark and replicated count, exit 0.
* An origin that cannot be reached: ``source.waiting for=origin`` once (the servers and the error), however many
  attempts fail, and no ``origin.disconnected``.

Every bridge is a child process (``python -m bridge run``) stopped by its PID; every wait polls with a deadline.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict

import anyio
import anyio.abc
import pytest

from bridge.testing.configs import ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import Publisher, aggregate_count, connect, create_aggregate, create_stream
from bridge.testing.polling import assert_holds, wait_until
from bridge.testing.processes import BridgeFactory, BridgeProcess
from bridge.testing.servers import READY_EVENTS, Topology, free_ports

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

STOP_GRACE = 15.0


# What a source waits for is logged as the field ``for``, a Python keyword: it goes in through ``**``, as a TypedDict
# so that mypy knows it for a field to match and not one of wait_event's own arguments.
WaitingFor = TypedDict("WaitingFor", {"for": str})
FOR_TARGET: WaitingFor = {"for": "target"}
FOR_ORIGIN: WaitingFor = {"for": "origin"}


def the_stop_line(bridge: BridgeProcess) -> dict[str, Any]:
    (stopped,) = bridge.events("bridge.stopped")  # exactly one
    assert isinstance(stopped["uptime_seconds"], float | int) and stopped["uptime_seconds"] >= 0, stopped
    return stopped


async def test_an_http_port_in_use_stops_the_start_with_exit_2_and_the_fix(
    tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    (nothing_there,) = free_ports(1)  # the target: never reached, since the listener is bound first
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        spec = SourceSpec(name="edge1", servers=f"nats://127.0.0.1:{nothing_there}")
        config = write_config(
            tmp_path / "bridge.toml",
            target_url=f"nats://127.0.0.1:{nothing_there}",
            sources=[spec],
            http_extra={"listen": address},
        )
        bridge = bridge_procs(config)
        await wait_until(lambda: not bridge.is_running, timeout=20, what="the bridge to exit")
    assert await bridge.astop(1) == 2

    (failed,) = bridge.events("http.listen_failed")
    assert failed["level"] == "error" and failed["listen"] == address, failed
    assert "in use" in failed["error"], failed
    assert "http.listen" in failed["fix"] and 'http.listen = ""' in failed["fix"], failed
    assert "e.g." in failed["fix"] and "without health and metrics" in failed["fix"], failed
    stopped = the_stop_line(bridge)
    assert stopped["exit_code"] == 2 and address in stopped["reason"], stopped
    assert stopped["not_started"] == ["edge1"], stopped
    names = [e.get("event") for e in bridge.events()]
    assert names.index("http.listen_failed") < names.index("bridge.stopped")
    assert not [n for n in names if str(n).startswith(("target.", "source.", "fleet."))], names
    assert "Traceback" not in bridge.log_text()


# ``python -c`` this ``-m bridge run -c CONFIG``: the command as ``nats-bridge run`` runs it, with a SIGTERM arriving
# after ``main`` began and before anything of the bridge runs (as a stop does while a loaded machine still imports)
STOP_WHILE_STARTING = """
import os, signal, sys
from bridge import cli
from bridge.commands import run as command

def run(path):
    os.kill(os.getpid(), signal.SIGTERM)
    return started(path)

started, command.run = command.run, run
sys.exit(cli.main(sys.argv[-3:]))
"""


async def test_a_sigterm_while_starting_is_a_stop_like_any_other(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    bridge = bridge_procs(config, interpreter_args=("-c", STOP_WHILE_STARTING))
    await wait_until(lambda: not bridge.is_running, timeout=30, what="the bridge to exit by itself")
    assert await bridge.astop(1) == 0  # not -15: Python's default action for SIGTERM
    (stopping,) = bridge.events("bridge.stopping")
    assert stopping["signal"] == "SIGTERM", stopping
    stopped = the_stop_line(bridge)
    assert stopped["exit_code"] == 0 and stopped["reason"] == "signal SIGTERM", stopped
    assert "Traceback" not in bridge.log_text()


async def test_target_down_at_start_waits_without_disconnects_and_stops_with_a_summary(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    n = 20
    hub = topology.hub
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        async with connect(hub.url) as hub_nc:
            await create_aggregate(hub_nc)
        await anyio.to_thread.run_sync(hub.stop)

        bridge = bridge_procs(config)
        await bridge.wait_event("source.waiting", timeout=20, source="edge1", **FOR_TARGET)
        (waiting,) = bridge.events("source.waiting", source="edge1")
        assert waiting["servers"] == [hub.url] and "cannot connect" in waiting["error"], waiting
        (failed,) = bridge.events("target.connect_failed")[:1]
        assert failed["servers"] == [hub.url] and "cannot connect" in failed["error"], failed

        def one_wait_line() -> None:  # connect attempts go on (0.5 s, 1 s, 2 s apart): no line per attempt
            assert len(bridge.events("source.waiting")) == 1, bridge.events("source.waiting")
            assert not bridge.events("target.disconnected")

        await assert_holds(one_wait_line, duration=3.0, what="one source.waiting while the target is down")

        hub.start()
        await anyio.to_thread.run_sync(hub.wait_ready, 10.0)
        await anyio.to_thread.run_sync(topology.wait_linked, 10.0)
        await bridge.wait_event("target.connected", timeout=30)
        await bridge.wait_event("source.waiting_over", timeout=5, source="edge1", **FOR_TARGET)
        await bridge.wait_event(READY_EVENTS, timeout=30)

        publisher = Publisher(leaf_nc, n)
        await publisher.run()
        async with connect(hub.url) as hub_nc:
            await wait_until(lambda: _equals(aggregate_count(hub_nc, "edge.one.>"), n), timeout=30, what=f"{n} copies")
        assert await bridge.astop(STOP_GRACE) == 0

    names = [e.get("event") for e in bridge.events()]
    assert "target.disconnected" not in names, names
    assert names.count("source.waiting") == 1 and names.count("source.waiting_over") == 1, names
    assert names.index("source.waiting") < names.index("target.connected") < names.index("source.waiting_over")
    stopped = the_stop_line(bridge)
    assert stopped["level"] == "info" and stopped["exit_code"] == 0, stopped
    assert stopped["reason"] == "signal SIGTERM", stopped
    assert stopped["sources"]["edge1"]["watermark"] == publisher.seqs[-1], stopped
    assert stopped["sources"]["edge1"]["replicated"] == n, stopped
    assert stopped["not_started"] == [] and "target" not in stopped, stopped
    assert names[-1] == "bridge.stopped", names[-5:]


async def _equals(value: Any, expected: int) -> bool:
    return bool(await value == expected)


@asynccontextmanager
async def hanging_up_server() -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP port that accepts connections and closes them at once (an origin that cannot be used): its URL, and
    the count of connections it took (in a one-element list)."""
    accepted = [0]
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def hang_up(stream: anyio.abc.SocketStream) -> None:
        accepted[0] += 1
        await anyio.aclose_forcefully(stream)

    async with listener, anyio.create_task_group() as tg:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(listener.serve, hang_up)
        yield f"nats://127.0.0.1:{port}", accepted
        tg.cancel_scope.cancel()


async def test_an_unreachable_origin_is_waited_for_once_not_per_attempt(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    async with hanging_up_server() as (origin_url, accepted):
        spec = SourceSpec(name="edge1", servers=origin_url)
        config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
        async with connect(topology.hub.url) as hub_nc:
            await create_aggregate(hub_nc)
        bridge = bridge_procs(config)
        await bridge.wait_event("source.waiting", timeout=30, source="edge1", **FOR_ORIGIN)
        seen = accepted[0]
        # three more set-up attempts (1 s, then 2 s apart; each tries the server at least once)
        await wait_until(lambda: accepted[0] >= seen + 3, timeout=20, what="three more connection attempts")
        assert await bridge.astop(STOP_GRACE) == 0

    (waiting,) = bridge.events("source.waiting", source="edge1")
    assert waiting["for"] == "origin" and waiting["servers"] == [origin_url], waiting
    assert origin_url.removeprefix("nats://") in waiting["error"], waiting
    names = [e.get("event") for e in bridge.events()]
    assert "origin.disconnected" not in names and "origin.connected" not in names, names
    assert "source.waiting_over" not in names, names
    failures = bridge.events("source.setup_failed")
    assert failures and len(failures) < 3, failures  # the same failure again is held back (at most every 30 s)
    stopped = the_stop_line(bridge)
    assert stopped["exit_code"] == 0, stopped
    assert stopped["sources"]["edge1"] == {"watermark": None, "replicated": 0, "waiting_for": ["origin"]}, stopped
