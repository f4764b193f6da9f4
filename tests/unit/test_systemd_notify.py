"""The systemd notify protocol against real AF_UNIX datagram sockets standing in for systemd's notify socket."""

from __future__ import annotations

import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from bridge.observe.systemd import STATUS_MAX_CHARS, Notifier, watchdog_loop

# Long enough for a loaded CI machine; every wait below ends as soon as its condition holds.
DEADLINE = 10.0
POLL = 0.002
RECV_TIMEOUT = 2.0


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket in tmp_path playing systemd, and its path."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(RECV_TIMEOUT)
    with sock:
        yield sock, path


def drain(sock: socket.socket) -> list[bytes]:
    """Every datagram waiting on ``sock`` right now, without blocking."""
    datagrams = []
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        while True:
            try:
                datagrams.append(sock.recv(65536))
            except BlockingIOError:
                return datagrams
    finally:
        sock.settimeout(timeout)


async def receive(sock: socket.socket, count: int) -> list[bytes]:
    """The next ``count`` datagrams, polling (callers bound the wait with ``anyio.fail_after``)."""
    datagrams: list[bytes] = []
    while len(datagrams) < count:
        datagrams += drain(sock)
        if len(datagrams) < count:
            await anyio.sleep(POLL)
    return datagrams


def test_each_message_arrives_as_one_datagram_with_exactly_these_bytes(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"})
    assert notifier.enabled and notifier.address == path

    assert notifier.ready()
    assert sock.recv(4096) == b"READY=1"
    assert notifier.ready("replicating 2/2 sources")
    assert sock.recv(4096) == b"READY=1\nSTATUS=replicating 2/2 sources"
    assert notifier.status("target reconnecting")
    assert sock.recv(4096) == b"STATUS=target reconnecting"
    assert notifier.stopping()
    assert sock.recv(4096) == b"STOPPING=1"
    assert notifier.stopping("draining")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.send("A=1", "B=2")
    assert sock.recv(4096) == b"A=1\nB=2"
    assert notifier.status("état: prêt")
    assert sock.recv(4096) == "STATUS=état: prêt".encode()
    assert notifier.failures == 0 and notifier.last_error is None
    assert drain(sock) == []


def test_reloading_carries_the_monotonic_clock_in_microseconds(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    low = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.reloading("re-reading bridge.toml")
    high = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    lines = sock.recv(4096).split(b"\n")
    assert len(lines) == 3 and lines[0] == b"RELOADING=1" and lines[2] == b"STATUS=re-reading bridge.toml"
    name, _, value = lines[1].partition(b"=")
    assert name == b"MONOTONIC_USEC" and low <= int(value) <= high


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract socket names are Linux-only")
def test_abstract_namespace_socket_given_with_an_at_sign() -> None:
    name = f"nats-bridge-test-{secrets.token_hex(8)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(RECV_TIMEOUT)
        notifier = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert notifier.enabled and notifier.address == "\0" + name
        assert notifier.ready("up")
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_status_text_cannot_inject_assignments_and_long_text_is_cut(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    # An exception message with a newline must not become a second assignment (here a fake READY=1).
    assert notifier.status("source edge-a failed:\nREADY=1\r\nMAINPID=1")
    assert sock.recv(4096) == b"STATUS=source edge-a failed: READY=1 MAINPID=1"

    assert notifier.status("x" * 10_000)
    status = sock.recv(65536)
    assert status == b"STATUS=" + b"x" * (STATUS_MAX_CHARS - 3) + b"..."


@pytest.mark.parametrize("assignment", ["READY", "=1", "A=1\nREADY=1"])
def test_malformed_assignments_are_refused_not_sent(receiver: tuple[socket.socket, str], assignment: str) -> None:
    sock, path = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert notifier.send("STATUS=ok", assignment) is False
    assert notifier.failures == 1 and isinstance(notifier.last_error, ValueError)
    assert drain(sock) == []


@pytest.mark.parametrize(
    ("usec", "interval"),
    [("30000000", 15.0), ("20000", 0.01), ("1", 0.0000005), ("0", None), ("-5", None), ("abc", None), ("", None)],
)
def test_watchdog_interval_is_half_of_watchdog_usec(usec: str, interval: float | None) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": usec})
    if interval is None:
        assert notifier.watchdog_interval is None
    else:
        assert notifier.watchdog_interval == pytest.approx(interval)


def test_watchdog_pid_must_be_this_process(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    ours = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())})
    assert ours.watchdog_interval == 15.0

    # Set for another process (we inherited it, say): no watchdog here, but other notifications still go out.
    theirs = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"})
    assert os.getpid() != 1
    assert theirs.watchdog_interval is None
    assert theirs.watchdog() is False
    assert drain(sock) == []
    assert theirs.ready()
    assert sock.recv(4096) == b"READY=1"

    garbled = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "self"})
    assert garbled.watchdog_interval is None


def test_no_watchdog_without_a_socket() -> None:
    notifier = Notifier.from_env({"WATCHDOG_USEC": "30000000"})
    assert notifier.watchdog_interval is None


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"NOTIFY_SOCKET": ""},
        {"NOTIFY_SOCKET": "@"},
        {"NOTIFY_SOCKET": "notify.sock"},
        {"NOTIFY_SOCKET": "vsock:2:9"},
    ],
)
def test_disabled_notifier_does_nothing(environ: dict[str, str]) -> None:
    notifier = Notifier.from_env(environ)
    assert not notifier.enabled and notifier.address is None and notifier.watchdog_interval is None
    results = [
        notifier.ready("up"),
        notifier.reloading(),
        notifier.stopping(),
        notifier.status("x"),
        notifier.watchdog(),
        notifier.send("A=1"),
    ]
    assert results == [False] * len(results)
    assert notifier.failures == 0  # nothing was attempted, so nothing failed


def test_missing_socket_path_returns_false_without_raising(tmp_path: Path) -> None:
    notifier = Notifier.from_env({"NOTIFY_SOCKET": str(tmp_path / "gone.sock"), "WATCHDOG_USEC": "30000000"})
    assert notifier.enabled
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    assert notifier.failures == 2 and isinstance(notifier.last_error, FileNotFoundError)


@pytest.mark.anyio
async def test_a_receiver_that_stopped_reading_does_not_block_the_sender(
    receiver: tuple[socket.socket, str],
) -> None:
    sock, path = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path})

    def flood() -> int:
        # The receiver's queue is bounded (net.unix.max_dgram_qlen); a blocking send would wait there forever.
        for sent in range(100_000):
            if not notifier.status(f"message {sent}"):
                return sent
        return -1

    with anyio.fail_after(DEADLINE):
        # In a thread so that a regression (a blocking send) fails this test by its deadline instead of hanging.
        sent = await anyio.to_thread.run_sync(flood, abandon_on_cancel=True)
    assert sent > 0
    assert notifier.failures == 1 and isinstance(notifier.last_error, BlockingIOError)
    assert len(drain(sock)) == sent


@pytest.mark.anyio
async def test_watchdog_loop_pings_while_healthy_stops_while_not_and_resumes(
    receiver: tuple[socket.socket, str],
) -> None:
    sock, path = receiver
    notifier = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"})
    interval = notifier.watchdog_interval
    assert interval is not None and interval == pytest.approx(0.01)
    healthy = True
    checks = 0

    def is_healthy() -> bool:
        nonlocal checks
        checks += 1
        return healthy

    with anyio.fail_after(DEADLINE):
        async with anyio.create_task_group() as tg:
            started = anyio.current_time()
            tg.start_soon(watchdog_loop, notifier, is_healthy)
            assert await receive(sock, 3) == [b"WATCHDOG=1"] * 3
            # The first ping goes out at once, the third no earlier than two intervals later: pings are paced,
            # not a burst (a little slack: asyncio may wake a timer up to its clock resolution early).
            assert anyio.current_time() - started >= 2 * interval * 0.9

            # Both statements run before the loop task can run again, so every ping sent while healthy is drained.
            healthy = False
            drain(sock)
            # Three more health checks mean three missed chances to ping; none may have been taken.
            seen = checks
            while checks < seen + 3:
                await anyio.sleep(POLL)
            assert drain(sock) == []

            healthy = True
            assert await receive(sock, 2) == [b"WATCHDOG=1"] * 2
            tg.cancel_scope.cancel()
    assert notifier.failures == 0


@pytest.mark.anyio
async def test_watchdog_loop_returns_at_once_without_a_watchdog(receiver: tuple[socket.socket, str]) -> None:
    sock, path = receiver
    for notifier in (Notifier.from_env({}), Notifier.from_env({"NOTIFY_SOCKET": path})):
        with anyio.fail_after(DEADLINE):
            await watchdog_loop(notifier, lambda: True)
    assert drain(sock) == []
