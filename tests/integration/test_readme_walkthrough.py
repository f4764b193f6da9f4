"""README's "Run it against your servers", command by command, as a new user would type them.

The server configurations and the bridge's are read from README.md itself; only the ports are swapped for free
ones (and ``../.venv/bin/`` for this interpreter and the tested nats-server), so a README that stops working
fails here. The two server configurations must also be the ones ``nats-bridge demo --keep`` writes.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bridge.testing.http import get
from bridge.testing.processes import REPO_ROOT, child_env, reap_child, register_child
from bridge.testing.servers import NatsServer, free_ports

pytestmark = pytest.mark.integration

SECTION = "## Run it against your servers"
DEADLINE = 60.0
MESSAGES = 1000
PORTS = ("4222", "4223", "7422", "8222", "8223", "9464")  # every port the walkthrough uses


def walkthrough() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + len(SECTION))]


def blocks(section: str) -> list[tuple[str, str]]:
    """The fenced code blocks, as (language, text)."""
    return [(m["lang"], m["body"]) for m in re.finditer(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", section, re.M | re.S)]


def named(section: str, name: str) -> str:
    """The block whose first line is ``# <name>``."""
    (body,) = [body for _, body in blocks(section) if body.startswith(f"# {name}\n")]
    return body


def shell_lines(section: str) -> list[str]:
    """The commands of the ``sh`` blocks, a heredoc kept whole with its command."""
    commands: list[str] = []
    for lang, body in blocks(section):
        if lang != "sh":
            continue
        lines = iter(body.splitlines())
        for line in lines:
            heredoc = re.search(r"<<'(\w+)'$", line)
            if heredoc:
                rest = []
                for more in lines:
                    rest.append(more)
                    if more == heredoc[1]:
                        break
                line = "\n".join([line, *rest])
            commands.append(line)
    return commands


def normalised(conf: str) -> list[str]:
    """A server configuration without comments, ports and store paths: what must match between README and demo."""
    out = []
    for line in conf.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        line = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", line)
        out.append(re.sub(r'store_dir: ".*"', "store_dir: DIR", line))
    return out


def test_the_server_configurations_are_the_ones_the_demo_writes(tmp_path: Path) -> None:
    section = walkthrough()
    hub = NatsServer(tmp_path / "hub", name="hub", binary="nats-server", domain="hub", leafnode_listen=True)
    leaf = NatsServer(
        tmp_path / "leaf", name="leaf", binary="nats-server", domain="leaf", leaf_remotes=[hub.leafnode_url]
    )
    assert normalised(named(section, "hub.conf")) == normalised(hub.config_text())
    assert normalised(named(section, "leaf.conf")) == normalised(leaf.config_text())


def poll(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, f"not within {DEADLINE:g}s: {what}"
        time.sleep(0.1)


def answers(url: str) -> bool:
    try:
        return get(url, 2.0)[0] == 200
    except OSError:
        return False


class Shell:
    """Runs the README's commands in one directory, with the walkthrough's ports and programs swapped."""

    def __init__(self, cwd: Path, nats_server_bin: str) -> None:
        self.cwd = cwd
        self.ports = dict(zip(PORTS, (str(p) for p in free_ports(len(PORTS))), strict=True))
        self.programs = {
            "../.venv/bin/nats-server": shlex.quote(nats_server_bin),
            "../.venv/bin/nats-bridge": f"{shlex.quote(sys.executable)} -m bridge",
            "../.venv/bin/python": shlex.quote(sys.executable),
        }
        self.background: list[subprocess.Popen[bytes]] = []

    def swap(self, text: str) -> str:
        for old, new in self.ports.items():
            text = re.sub(rf"(?<=127\.0\.0\.1:){old}\b", new, text)
        for old, new in self.programs.items():
            text = text.replace(old, new)
        return text

    def port(self, walkthrough_port: str) -> str:
        return self.ports[walkthrough_port]

    def write(self, name: str, body: str) -> None:
        (self.cwd / name).write_text(self.swap(body))

    def run(self, command: str, timeout: float = DEADLINE) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", self.swap(command)],
            cwd=self.cwd,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self, command: str) -> subprocess.Popen[bytes]:
        assert command.endswith(" &"), command
        argv = shlex.split(self.swap(command[: -len(" &")]))
        log = (self.cwd / f"background-{len(self.background)}.log").open("wb")
        with log:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, cwd=self.cwd, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        register_child(proc)
        self.background.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.background):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                reap_child(proc, timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                reap_child(proc, timeout=5)


@pytest.fixture
def shell(tmp_path: Path, nats_server_bin: str) -> Iterator[Shell]:
    sh = Shell(tmp_path, nats_server_bin)
    try:
        yield sh
    finally:
        sh.stop_all()


def test_the_walkthrough_replicates_between_two_servers(shell: Shell) -> None:
    section = walkthrough()
    commands = shell_lines(section)
    assert commands[:2] == ["python3 -m venv .venv && .venv/bin/pip install -q '.[demo]'", "mkdir -p walk && cd walk"]
    commands = commands[2:]  # this test runs in a virtual environment of its own, in a fresh directory
    for name in ("hub.conf", "leaf.conf", "bridge.toml"):
        shell.write(name, named(section, name))

    # 1. two servers
    servers = [c for c in commands if "nats-server -c" in c]
    assert len(servers) == 2
    for command in servers:
        shell.start(command)
    poll(lambda: answers(f"http://127.0.0.1:{shell.port('8222')}/healthz"), "the hub is up")
    poll(lambda: answers(f"http://127.0.0.1:{shell.port('8223')}/healthz"), "the leaf is up")

    def linked() -> bool:
        try:
            status, body = get(f"http://127.0.0.1:{shell.port('8222')}/leafz", 2.0)
        except OSError:
            return False
        return status == 200 and json.loads(body).get("leafnodes", 0) >= 1

    poll(linked, "the leaf connected to the hub")

    # 2. the origin stream and its messages
    (origin,) = [c for c in commands if "<<'PY'" in c]
    done = shell.run(origin)
    assert done.returncode == 0, done.stderr

    # 4. setup (dry run first), check, run
    bridge_commands = [c for c in commands if "nats-bridge" in c]
    dry_run, setup, check, run, status = bridge_commands[:5]
    done = shell.run(dry_run)
    assert done.returncode == 0 and "would create" in done.stdout, (done.stdout, done.stderr)
    done = shell.run(setup)
    assert done.returncode == 0 and "created" in done.stdout, (done.stdout, done.stderr)
    done = shell.run(check)
    assert done.returncode == 0, (done.stdout, done.stderr)
    bridge = shell.start(run)

    # 5. status until everything is stored, then the metrics line the README greps for
    def replicated() -> bool:
        done = shell.run(status.replace("status -c bridge.toml", "status -c bridge.toml --json"))
        if done.returncode != 0:
            return False
        sources = json.loads(done.stdout).get("sources", [])
        return any(s.get("stored_watermark") == MESSAGES for s in sources)

    poll(replicated, f"status shows {MESSAGES} stored")
    done = shell.run(status)
    assert done.returncode == 0 and "leaf1" in done.stdout, (done.stdout, done.stderr)
    (metrics,) = [c for c in commands if "/metrics" in c]
    done = shell.run(metrics)
    assert done.returncode == 0, done.stderr
    assert re.search(
        rf'^nats_bridge_replicated_messages_total\{{source="leaf1"\}} {MESSAGES}\.0$', done.stdout, re.M
    ), done.stdout

    # SIGTERM: the bridge drains and exits 0
    bridge.send_signal(signal.SIGTERM)
    assert bridge.wait(timeout=30) == 0, (shell.cwd / "background-2.log").read_text()[-3000:]
