"""The sidecar container, built from the project's Dockerfile and run as a sidecar would be (issue 32).

A nats-server container and the bridge's containers share one network namespace with no outside network; the
configuration is mounted read-only and the root file systems are read-only. What a user relies on is checked from
outside the bridge: ``setup`` in the container, the HEALTHCHECK healthy on a non-default ``http.listen``, ``/readyz``
ready, the process uid/gid 10001 and PID 1, every message in the aggregate (counted there, in order, once), SIGTERM
draining to exit 0, and a second container with the same configuration taking over when the first stops.

Skipped, with the reason, where podman, runc or mmdebstrap are missing (``bridge.testing.container``).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.testing.configs import SourceSpec, write_config
from bridge.testing.container import Container, Podman, base_image, build_image, image_size, podman_problem
from bridge.testing.polling import wait_until
from bridge.testing.servers import find_nats_server

REQUIRED = os.environ.get("NATS_BRIDGE_REQUIRE_CONTAINER", "") not in ("", "0")  # CI: a skip would hide a gap


@pytest.fixture(scope="module", autouse=True)
def _podman_here() -> None:
    """Skip, saying why, where podman cannot run; fail instead where the run requires the container test."""
    problem = podman_problem()
    if problem is not None:
        if REQUIRED:
            pytest.fail(f"NATS_BRIDGE_REQUIRE_CONTAINER is set, but {problem}")
        pytest.skip(problem)


CONFIG_PATH = "/etc/nats-bridge/bridge.toml"  # where the image's CMD and HEALTHCHECK read it
SERVER = "nats://127.0.0.1:4222"
LISTEN = ("127.0.0.1:9470", "127.0.0.1:9471")  # not the image's 9464: the HEALTHCHECK must follow http.listen
UID = 10001


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Podman]:
    runner = Podman(tmp_path_factory.mktemp("podman"))
    try:
        yield runner
    finally:
        runner.cleanup()


@pytest.fixture(scope="module")
def images(podman: Podman) -> dict[str, Any]:
    """The base image and the bridge's, built once for the module; the figures are printed with the results."""
    base, base_s = base_image(podman)
    image, build_s = build_image(podman, base)
    return {"base": base, "image": image, "base_s": base_s, "build_s": build_s, "size": image_size(podman, image)}


def poll(probe: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Wait until ``probe`` returns something truthy (a deadline, not a sleep)."""
    return anyio.run(functools.partial(wait_until, probe, timeout=timeout, what=what, interval=0.5))


def test_the_image_holds_the_compiled_bridge_and_no_build_tools(
    podman: Podman, images: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    image = images["image"]
    version = podman("run", "--rm", "--read-only", image, "--version").stdout
    assert "core compiled" in version, version
    # the build stage's compiler, pip and its cache stay behind; nothing installs at run time
    leftovers = podman(
        "run",
        "--rm",
        "--entrypoint",
        "sh",
        image,
        "-c",
        "command -v gcc cc pip pip3; ls -d /opt/nats-bridge/bin/pip* /root/.cache/pip /src 2>/dev/null; id -u; id -g",
        check=False,
    ).stdout.split()
    assert leftovers == [str(UID), str(UID)], f"left in the final stage: {leftovers}"
    with capsys.disabled():
        print(
            f"\ncontainer image: {images['size'] / 1e6:.0f} MB; base image ready in {images['base_s']:.0f} s, "
            f"bridge image built in {images['build_s']:.0f} s ({version.strip()})"
        )


def _config(tmp_path: Path) -> Path:
    """The bridge's file: one source and the aggregate on the one server of the pod, leases short for the test."""
    path = write_config(
        tmp_path / "bridge.toml",
        target_url=SERVER,
        # the copies' subjects must not overlap the origin's on the same server
        sources=[SourceSpec("edge", SERVER, subject_prefix="edge")],
        engine={"shutdown_grace": 10.0},
        http_extra={"listen": LISTEN[0]},
    )
    path.chmod(0o644)  # readable by uid 10001 (it holds no secret)
    return path


_PUBLISH = """
import asyncio, sys, nats
async def main(first, count):
    nc = await nats.connect("{server}")
    js = nc.jetstream()
    if first == 0:
        await js.add_stream(name="ORDERS", subjects=["orders.>"], retention="workqueue")
    else:
        acks = [js.publish(f"orders.{{i}}", f"order {{i}}".encode()) for i in range(first, first + count)]
        await asyncio.gather(*acks)
    await nc.close()
asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
"""

_AGGREGATE = """
import asyncio, json, nats
async def main():
    nc = await nats.connect("{server}")
    js = nc.jetstream()
    info = await js.stream_info("AGG")
    seqs = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1) if info.state.messages else ():
        msg = await js.get_msg("AGG", seq)
        seqs.append(int(msg.headers["Bridge-Seq"]))
    origin = await js.stream_info("ORDERS")
    print(json.dumps({{"seqs": seqs, "origin_left": origin.state.messages}}))
    await nc.close()
asyncio.run(main())
"""


class Sidecar:
    """The pod: the nats-server container, one-shot commands in the bridge's image beside it, bridge containers."""

    def __init__(self, podman: Podman, image: str, base: str, config: Path) -> None:
        self.podman, self.image, self.config = podman, image, config
        binary = os.path.realpath(find_nats_server())  # a static binary: it runs in any root file system
        self.server = podman.run(
            base,
            "/usr/local/bin/nats-server",
            "-js",
            "-sd",
            "/data",
            "-a",
            "127.0.0.1",
            "-p",
            "4222",
            options=[
                "--network",
                "none",
                "--read-only",
                "--tmpfs",
                "/data",
                "-v",
                f"{binary}:/usr/local/bin/nats-server:ro",
            ],
        )
        poll(lambda: "Server is ready" in self.server.logs(), "the nats-server container ready")

    def _beside(self) -> list[str]:
        return [
            "--network",
            f"container:{self.server.name}",
            "--read-only",
            "-v",
            f"{self.config}:{CONFIG_PATH}:ro",
        ]

    def once(self, *args: str, entrypoint: str | None = None) -> str:
        """A one-shot command in the bridge's image, in the pod; its stdout."""
        options = self._beside() + ([] if entrypoint is None else ["--entrypoint", entrypoint])
        return self.podman("run", "--rm", *options, self.image, *args).stdout

    def python(self, script: str, *args: str) -> str:
        return self.once("-c", script.format(server=SERVER), *args, entrypoint="python")

    def publish(self, first: int, count: int) -> None:
        self.python(_PUBLISH, str(first), str(count))

    def aggregate(self) -> dict[str, Any]:
        return dict(json.loads(self.python(_AGGREGATE)))

    def bridge(self, listen: str) -> Container:
        """A bridge container as a Deployment's pod runs it: the image's own CMD, the file mounted read-only, a
        read-only root; ``http.listen`` overridden from the environment as a user would."""
        return self.podman.run(
            self.image, options=[*self._beside(), "-e", f"NATS_BRIDGE_HTTP__LISTEN={listen}", "--stop-timeout", "30"]
        )


def _stored(sidecar: Sidecar, count: int) -> dict[str, Any] | None:
    """The aggregate once it holds ``count`` copies and the WorkQueue origin was answered to its end (the last
    answer follows the server's next flow-control request, about a second after the last delivery)."""
    view = sidecar.aggregate()
    return view if len(view["seqs"]) >= count and view["origin_left"] == 0 else None


def _healthy(bridge: Container) -> bool:
    bridge.podman("healthcheck", "run", bridge.name, check=False)  # runs the image's HEALTHCHECK now
    return bridge.inspect("{{.State.Healthcheck.Status}}") == "healthy"


def _ready(bridge: Container) -> bool:
    """/readyz 200, asked as an operator would: the image's own ``health`` command, at the address the file and the
    container's environment give."""
    return bridge.exec("nats-bridge", "health", "-c", CONFIG_PATH, "--ready", check=False).returncode == 0


def test_a_sidecar_replicates_drains_and_hands_over_to_its_twin(
    podman: Podman, images: dict[str, Any], tmp_path: Path
) -> None:
    sidecar = Sidecar(podman, images["image"], images["base"], _config(tmp_path))
    sidecar.publish(0, 0)  # the origin stream
    plan = sidecar.once("setup", "-c", CONFIG_PATH)
    assert "AGG" in plan, plan

    first = sidecar.bridge(LISTEN[0])
    sidecar.publish(1, 100)
    view = poll(lambda: _stored(sidecar, 100), "100 copies in the aggregate", timeout=90)
    assert view["seqs"] == list(range(1, 101))

    poll(lambda: _healthy(first), "the HEALTHCHECK healthy on http.listen's port")
    poll(lambda: _ready(first), "/readyz 200")
    status = first.exec("cat", "/proc/1/status").stdout
    ids = {line.split(":")[0]: line.split()[1:3] for line in status.splitlines() if line.startswith(("Uid", "Gid"))}
    assert ids == {"Uid": [str(UID)] * 2, "Gid": [str(UID)] * 2}, ids
    assert b"nats-bridge" in first.exec("cat", "/proc/1/cmdline").stdout.encode()

    # the rolling update: a twin with the same file starts beside it, ready as a standby; the first stops
    twin = sidecar.bridge(LISTEN[1])
    poll(lambda: _ready(twin), "the twin's /readyz 200 (a standby)")
    sidecar.publish(101, 100)
    assert first.stop() == 0, first.logs()[-3000:]
    sidecar.publish(201, 100)
    view = poll(lambda: _stored(sidecar, 300), "300 copies after the hand-over", timeout=90)
    assert view["seqs"] == list(range(1, 301)), "lost, duplicated or reordered across the hand-over"
    assert "lease.acquired" in twin.logs(), twin.logs()[-3000:]
    assert twin.stop() == 0, twin.logs()[-3000:]
