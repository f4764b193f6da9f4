"""``nats-bridge check`` against real origin servers of every supported version: the mode it says each source runs
in, the consumer it leaves behind for that mode, and ``mode = "flow_control"`` on a server older than 2.14 refused
as a configuration error (exit 2).

The older servers are the binaries ``tests/run.sh`` installs under ``.cache/nats-server-<version>/``; a version
that is not there is skipped. The target is always the default server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.testing.configs import ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import connect, consumer_info, create_aggregate, create_stream
from bridge.testing.processes import run_cli
from bridge.testing.servers import NatsServer, find_nats_server, server_version

REPO = Path(__file__).resolve().parents[2]
OLD = ("2.10.26", "2.11.11", "2.12.8")
FLOW_CONTROL_OK = ("2.14.0",)


def binary(version: str | None) -> str:
    """The nats-server of ``version`` (None: the default one, 2.15 or newer), or skip the test."""
    if version is None:
        return find_nats_server()
    path = REPO / ".cache" / f"nats-server-{version}" / "bin" / "nats-server"
    if not path.is_file():
        pytest.skip(f"no nats-server {version} at {path} (tests/run.sh installs it)")
    return str(path)


@pytest.fixture
def target(nats_server_bin: str, tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(tmp_path / "target", name="target", binary=nats_server_bin) as server:
        yield server


def origin_server(tmp_path: Path, version: str | None) -> NatsServer:
    return NatsServer(tmp_path / "origin", name="origin", binary=binary(version))


async def prepare(origin: NatsServer, target: NatsServer) -> None:
    async with connect(origin.url) as origin_nc, connect(target.url) as target_nc:
        await create_stream(origin_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(target_nc)


async def durable(origin: NatsServer, spec: SourceSpec) -> dict[str, Any]:
    async with connect(origin.url) as nc:
        config: dict[str, Any] = (await consumer_info(nc, ORIGIN, spec.consumer_name))["config"]
    return config


def check(config: Path) -> tuple[int, list[str], str]:
    done = run_cli("check", "-c", str(config))
    lines = [line for line in done.stdout.splitlines() if line.startswith(("OK   source", "FAIL source"))]
    return done.returncode, lines, done.stdout + done.stderr


@pytest.mark.anyio
@pytest.mark.parametrize("version", [*OLD, *FLOW_CONTROL_OK, None], ids=[*OLD, *FLOW_CONTROL_OK, "default"])
async def test_auto_mode_per_origin_version(target: NatsServer, tmp_path: Path, version: str | None) -> None:
    with origin_server(tmp_path, version) as origin:
        await prepare(origin, target)
        spec = SourceSpec(name="edge1", servers=origin.url, subject_prefix="edge.one")
        config = write_config(tmp_path / "bridge.toml", target_url=target.url, sources=[spec])
        code, lines, output = await anyio.to_thread.run_sync(check, config)
        assert code == 0, output
        reported = server_version(origin.binary)
        if version in OLD:
            described = (
                "a nats-server older than 2.11 (it reports no API level)"
                if version == "2.10.26"
                else f"nats-server {reported} (API level "
            )
            assert lines[0].startswith(f"OK   source edge1: mode pull (the origin runs {described}"), output
            assert lines[0].endswith("older than 2.14: no ack_policy flow_control)"), output
            created = await durable(origin, spec)
            # a pull consumer with explicit acks: nothing about deliver subjects or flow control
            assert "deliver_subject" not in created and not created.get("flow_control"), created
            assert created["ack_policy"] == "explicit" and created["ack_wait"] == 30_000_000_000
        else:
            assert lines[0].startswith(f"OK   source edge1: mode flow_control (the origin runs nats-server {reported}")
            assert (await durable(origin, spec))["ack_policy"] == "flow_control"
        assert lines[1].startswith("OK   source edge1: origin ORDERS (workqueue), consumer nats-bridge-edge1"), output


@pytest.mark.anyio
@pytest.mark.parametrize("version", OLD)
async def test_flow_control_on_an_old_origin_exits_2_naming_the_key(
    target: NatsServer, tmp_path: Path, version: str
) -> None:
    with origin_server(tmp_path, version) as origin:
        await prepare(origin, target)
        spec = SourceSpec(name="edge1", servers=origin.url, subject_prefix="edge.one", extra={"mode": "flow_control"})
        config = write_config(tmp_path / "bridge.toml", target_url=target.url, sources=[spec])
        done = await anyio.to_thread.run_sync(lambda: run_cli("check", "-c", str(config)))
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"nats-bridge: invalid configuration ({config})" in done.stderr
        wanted = '  sources[edge1].mode: mode = "flow_control" needs nats-server 2.14.0 or later on the origin'
        assert wanted in done.stderr
        assert 'FAIL source edge1: sources[edge1].mode: mode = "flow_control"' in done.stdout
        async with connect(origin.url) as nc:
            names = await nc.request(f"$JS.API.CONSUMER.NAMES.{ORIGIN}", b"", timeout=5)
        assert b"nats-bridge-edge1" not in names.data, "nothing created for a source that cannot run"


@pytest.mark.anyio
async def test_auto_keeps_a_pull_durable_on_a_flow_control_server(target: NatsServer, tmp_path: Path) -> None:
    """A durable made in pull mode (here by ``check`` with ``mode = "pull"``; in the field, before the origin was
    upgraded to 2.14) stays a pull consumer under ``auto``."""
    with origin_server(tmp_path, None) as origin:
        await prepare(origin, target)
        pull = SourceSpec(name="edge1", servers=origin.url, subject_prefix="edge.one", extra={"mode": "pull"})
        config = write_config(tmp_path / "bridge.toml", target_url=target.url, sources=[pull])
        code, lines, output = await anyio.to_thread.run_sync(check, config)
        assert code == 0 and lines[0] == "OK   source edge1: mode pull (configured)", output

        auto = SourceSpec(name="edge1", servers=origin.url, subject_prefix="edge.one")
        config = write_config(tmp_path / "bridge.toml", target_url=target.url, sources=[auto])
        code, lines, output = await anyio.to_thread.run_sync(check, config)
        assert code == 0, output
        assert lines[0] == "OK   source edge1: mode pull (the durable consumer exists as a pull consumer)", output
        assert "deliver_subject" not in await durable(origin, auto)
