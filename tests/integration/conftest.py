"""Fixtures of the scenario tests on real servers, built on :mod:`bridge.testing`.

* ``bridge_procs``: a factory of bridge child processes; every one still running is killed and reaped at teardown.
* ``servers``: a factory of single nats-servers (started, healthy); all stopped at teardown.
* ``origin``: one nats-server of the origins' binary (``origin_server_bin``), stopped at teardown.

On failure each fixture prints the tail of the logs it holds (pytest shows them with the failure). The session-wide
fixtures (``nats_server_bin``, ``topology``, ``spark``, ``anyio_backend``) are in ``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bridge.testing.processes import BridgeFactory, BridgeProcess
from bridge.testing.servers import NatsServer, ServerFactory


def _call_failed(request: pytest.FixtureRequest) -> bool:
    call = getattr(request.node, "rep_call", None)
    return call is not None and bool(call.failed)


@pytest.fixture
def bridge_procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BridgeFactory]:
    """A factory ``start(config_path) -> BridgeProcess`` (started); every process is killed and reaped at teardown.

    On failure the tail of each bridge log is printed (pytest shows it with the failure).
    """
    procs: list[BridgeProcess] = []

    def start(
        config_path: Path, env: Mapping[str, str] | None = None, interpreter_args: Sequence[str] = ()
    ) -> BridgeProcess:
        proc = BridgeProcess(config_path, tmp_path / f"bridge-{len(procs)}.log", env, interpreter_args)
        procs.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in procs:
            proc.cleanup()
        if _call_failed(request):
            for proc in procs:
                print(f"\n----- bridge log {proc.log_path} (exit codes {proc.returncodes}) -----")
                print(proc.tail())


@pytest.fixture
def servers(nats_server_bin: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerFactory]:
    """``start(name, extra_config, **kwargs) -> NatsServer`` (started, healthy); all stopped at teardown."""
    started: list[NatsServer] = []

    def start(name: str, extra_config: str, **kwargs: Any) -> NatsServer:
        server = NatsServer(tmp_path / name, name=name, binary=nats_server_bin, extra_config=extra_config, **kwargs)
        started.append(server)
        server.start()
        server.wait_ready()
        return server

    try:
        yield start
    finally:
        for server in reversed(started):
            server.stop()
        if _call_failed(request):
            for server in started:
                print(f"\n----- {server.name} log ({server.log_path}) -----\n{server.log_tail(30)}")


@pytest.fixture
def origin(origin_server_bin: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[NatsServer]:
    """One nats-server of the origin binary, stopped at teardown whatever happened (its log printed on failure)."""
    server = NatsServer(tmp_path / "origin", name="origin", binary=origin_server_bin)
    try:
        server.start()
        server.wait_ready()
        yield server
    finally:
        server.stop()
        if _call_failed(request):
            print(f"\n----- origin log ({server.log_path}) -----\n{server.log_tail(30)}")
