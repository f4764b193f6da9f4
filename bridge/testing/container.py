"""The container image under test: podman, a base image made from Debian packages, the project's Dockerfile built
on it, and containers run and removed by name.

No registry is needed: the base image is a ``mmdebstrap`` root file system (Debian bookworm, minbase, with Python
3.11, its venv module and headers, and CA certificates, the machine's own extra ones included so that pip inside the
build reaches the package index through a TLS-inspecting proxy), imported with ``podman import`` and cached under
``.cache/container/`` by a digest of what made it. The image is then the Dockerfile, unchanged, built with
``--format docker`` (the OCI format drops HEALTHCHECK) and ``--build-arg PYTHON_IMAGE=<the base>``.

What podman needs on these machines is written into a ``containers.conf`` of the harness's own (``CONTAINERS_CONF``):
runc as the runtime (crun refuses hybrid cgroups), and default ulimits within the process's hard limits (podman's
own defaults exceed them). :func:`podman_problem` says why the container tests cannot run on a machine, so they
are skipped with the reason, not failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bridge.testing.processes import REPO_ROOT

__all__ = [
    "BASE_PACKAGES",
    "Container",
    "Podman",
    "base_image",
    "build_image",
    "image_size",
    "podman_problem",
]

BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "libpython3-dev", "ca-certificates")
SUITE = "bookworm"
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")  # update-ca-certificates' folder for local authorities
CACHE = REPO_ROOT / ".cache" / "container"
BUILD_TIMEOUT = 900.0  # a cold build compiles the core and downloads every dependency


def _apt_sources() -> Path | None:
    """The machine's own apt sources (deb822 first), given to mmdebstrap as its mirror: the same mirror and
    snapshot the machine installs from."""
    for path in [*sorted(Path("/etc/apt/sources.list.d").glob("*.sources")), Path("/etc/apt/sources.list")]:
        if path.is_file() and path.read_text().strip():
            return path
    return None


def podman_problem() -> str | None:
    """Why the container tests cannot run here (None: they can): podman, runc or mmdebstrap missing, or no apt
    sources to build a base image from."""
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed (on Debian/Ubuntu: apt-get install podman runc mmdebstrap); "
            "the container image is not tested on this machine"
        )
    if _apt_sources() is None:
        return "no apt sources under /etc/apt to build the base image from"
    return None


def _conf(where: Path) -> Path:
    """A containers.conf for these machines: runc, and ulimits the process's hard limits allow."""
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 65536)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    path = where / "containers.conf"
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    return path


@dataclass
class Podman:
    """``podman`` with the harness's configuration; every container it runs is named and removed by :meth:`cleanup`."""

    workdir: Path
    started: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(_conf(self.workdir))}

    def __call__(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``podman ARGS`` to completion; with ``check``, a non-zero exit raises with podman's output."""
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        return done

    def run(self, image: str, *args: str, name: str | None = None, options: Sequence[str] = ()) -> Container:
        """Start a detached container of ``image`` (``args`` replace its CMD) and remember it for cleanup."""
        name = name or f"nbt-{uuid.uuid4().hex[:10]}"
        self.started.append(name)
        self("run", "--detach", "--name", name, *options, image, *args)
        return Container(self, name)

    def cleanup(self) -> None:
        """Remove every container this harness started, running or not (``rm --force`` kills what still runs)."""
        for name in reversed(self.started):
            self("rm", "--force", "--time", "0", name, check=False, timeout=60)
        self.started.clear()


@dataclass
class Container:
    """One running container, by name."""

    podman: Podman
    name: str

    def inspect(self, template: str) -> str:
        """``podman inspect --format TEMPLATE`` of the container."""
        return self.podman("inspect", "--format", template, self.name).stdout.strip()

    def exec(self, *args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside the container."""
        return self.podman("exec", self.name, *args, timeout=timeout, check=check)

    def exit_code(self) -> int:
        """The exit status of the container's process (once stopped)."""
        return int(self.inspect("{{.State.ExitCode}}"))

    def logs(self) -> str:
        """What the container wrote to stdout and stderr."""
        done = self.podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (the image's STOPSIGNAL), up to ``timeout`` seconds to exit, then its exit status."""
        self.podman("stop", "--time", str(int(timeout)), self.name, timeout=timeout + 30)
        return self.exit_code()


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()[:16]


def base_image(podman: Podman) -> tuple[str, float]:
    """The base image's name (``localhost/nats-bridge-test-base:<digest>``) and the seconds it took here: imported
    from the cached root file system, which is made first if no run made it before."""
    sources = _apt_sources()
    assert sources is not None, "podman_problem() says why there is no base image"
    certs = sorted(EXTRA_CA_DIR.glob("*.crt")) if EXTRA_CA_DIR.is_dir() else []
    key = _digest(
        " ".join(BASE_PACKAGES).encode(), SUITE.encode(), sources.read_bytes(), *(c.read_bytes() for c in certs)
    )
    name = f"localhost/nats-bridge-test-base:{key}"
    began = time.monotonic()
    if podman("image", "exists", name, check=False).returncode == 0:
        return name, time.monotonic() - began
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"base-{key}.tar"
    if not tarball.exists():
        hooks: list[str] = []
        if certs:
            hooks += [
                "--customize-hook=copy-in " + " ".join(str(c) for c in certs) + f" {EXTRA_CA_DIR}",
                '--customize-hook=chroot "$1" update-ca-certificates',
            ]
        partial = tarball.with_suffix(".partial.tar")
        done = subprocess.run(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--include=" + ",".join(BASE_PACKAGES),
                *hooks,
                SUITE,
                str(partial),
                str(sources),
            ],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
        if done.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"mmdebstrap exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        partial.rename(tarball)  # only a whole root file system is ever cached
    podman("import", "--quiet", str(tarball), name, timeout=300)
    return name, time.monotonic() - began


def build_image(podman: Podman, base: str, tag: str = "localhost/nats-bridge:test") -> tuple[str, float]:
    """The project's Dockerfile, unchanged, built on ``base``; the tag and the build's seconds."""
    began = time.monotonic()
    podman(
        "build",
        "--quiet",
        "--format",
        "docker",
        "--network=host",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "--tag",
        tag,
        str(REPO_ROOT),
        timeout=BUILD_TIMEOUT,
    )
    return tag, time.monotonic() - began


def image_size(podman: Podman, image: str) -> int:
    """The image's size in bytes, as podman reports it."""
    return int(json.loads(podman("image", "inspect", image).stdout)[0]["Size"])
