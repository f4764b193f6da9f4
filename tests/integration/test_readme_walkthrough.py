"""README's "Run it against your servers", command by command, as a new user would type them.

Every command of its ``sh`` blocks but the install runs unchanged, in order, in one bash (what one sets, the next
sees: variables, the directory, background jobs), from a checkout whose ``.venv/bin`` holds the programs under test
(this interpreter, the tested nats-server). ``TMPDIR`` puts the walk's directory under the test's own. So a README
that stops working fails here: a command that exits non-zero, a step missing or out of order, a file left in the
checkout. The two server configurations must also be the ones ``nats-bridge demo --keep`` writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.testing.http import get
from bridge.testing.processes import REPO_ROOT, child_env, reap_child, register_child
from bridge.testing.servers import NatsServer

pytestmark = pytest.mark.integration

SECTION = "## Run it against your servers"
DEADLINE = 60.0
MESSAGES = 1000
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q '.[demo]'"


def walkthrough() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + len(SECTION))]


def blocks(section: str) -> list[tuple[str, str]]:
    """The fenced code blocks, as (language, text)."""
    return [(m["lang"], m["body"]) for m in re.finditer(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", section, re.M | re.S)]


def shell_lines(section: str) -> list[str]:
    """The commands of the ``sh`` blocks, a heredoc kept whole with its command."""
    commands: list[str] = []
    for lang, body in blocks(section):
        if lang != "sh":
            continue
        lines = iter(body.splitlines())
        for line in lines:
            heredoc = re.search(r"<<'?(\w+)'?$", line)
            if heredoc:
                rest = []
                for more in lines:
                    rest.append(more)
                    if more == heredoc[1]:
                        break
                line = "\n".join([line, *rest])
            commands.append(line)
    return commands


def written(section: str, name: str) -> str:
    """What the walkthrough writes into ``name`` (``cat > <name> <<EOF``), its variables not yet expanded."""
    (command,) = [c for c in shell_lines(section) if c.startswith(f"cat > {name} <<EOF\n")]
    return command.split("\n", 1)[1].rsplit("\n", 1)[0]


def normalised(conf: str) -> list[str]:
    """A server configuration without comments, ports and store paths: what must match between README and demo."""
    out = []
    for line in conf.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        line = re.sub(r"127\.0\.0\.1:(\d+|\$\w+)", "127.0.0.1:PORT", line)
        out.append(re.sub(r'store_dir: ".*"', "store_dir: DIR", line))
    return out


def test_the_server_configurations_are_the_ones_the_demo_writes(tmp_path: Path) -> None:
    section = walkthrough()
    hub = NatsServer(tmp_path / "hub", name="hub", binary="nats-server", domain="hub", leafnode_listen=True)
    leaf = NatsServer(
        tmp_path / "leaf", name="leaf", binary="nats-server", domain="leaf", leaf_remotes=[hub.leafnode_url]
    )
    assert normalised(written(section, "hub.conf")) == normalised(hub.config_text())
    assert normalised(written(section, "leaf.conf")) == normalised(leaf.config_text())


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


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: the walk's processes are the shell's children, not ours)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def fake_checkout(root: Path, nats_server_bin: str) -> Path:
    """A checkout after the install, its ``.venv/bin`` running the code and the nats-server under test."""
    programs = {
        "nats-server": [nats_server_bin],
        "nats-bridge": [sys.executable, "-m", "bridge"],
        "python": [sys.executable],
    }
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, argv in programs.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec {shlex.join(argv)} "$@"\n')
        path.chmod(0o755)
    return root


class Shell:
    """One bash fed one command at a time, as a terminal would be; each command's output and status in files."""

    def __init__(self, cwd: Path, control: Path, tmpdir: Path) -> None:
        self.control = control
        control.mkdir()
        self.count = 0
        with (control / "bash.log").open("wb") as log:  # the child keeps its own descriptor
            # a session of its own: its process group holds every job the walk starts, for the teardown
            self.proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc"],
                cwd=cwd,
                env={**child_env(), "TMPDIR": str(tmpdir)},
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        register_child(self.proc)

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        n, self.count = self.count, self.count + 1
        out, err, rc = (self.control / f"{n}.{kind}" for kind in ("out", "err", "rc"))
        partial = rc.with_suffix(".partial")
        # a group, not a subshell, so that what the command sets stays set; stdin from /dev/null, so that no
        # command reads the commands after it; the status written last, renamed, so that it is never seen half done
        script = (
            f"{{\n{command}\n}} </dev/null >{shlex.quote(str(out))} 2>{shlex.quote(str(err))}\n"
            f"echo $? >{shlex.quote(str(partial))} && mv {shlex.quote(str(partial))} {shlex.quote(str(rc))}\n"
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(script.encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + DEADLINE
        while not rc.exists():
            assert self.proc.poll() is None, f"the shell exited ({self.proc.returncode}) during {command!r}"
            assert time.monotonic() < deadline, f"not done within {DEADLINE:g}s: {command!r}"
            time.sleep(0.05)
        return subprocess.CompletedProcess(command, int(rc.read_text()), out.read_text(), err.read_text())

    def value(self, variable: str) -> str:
        """A shell variable the walkthrough set (a probe of the test's own, not a README command)."""
        return self.run(f'printf %s "${variable}"').stdout

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        # whatever a failed walk left running (servers, the bridge) goes with the shell
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            deadline = time.monotonic() + 15
            while self._group_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
        reap_child(self.proc, timeout=5)

    def _group_alive(self) -> bool:
        self.proc.poll()  # the shell's zombie, until reaped, would count as a member
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.fixture
def checkout(tmp_path: Path, nats_server_bin: str) -> Path:
    return fake_checkout(tmp_path / "checkout", nats_server_bin)


@pytest.fixture
def shell(tmp_path: Path, checkout: Path) -> Iterator[Shell]:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    sh = Shell(checkout, tmp_path / "shell", tmpdir)
    try:
        yield sh
    finally:
        sh.close()


STEPS = ["servers", "origin", "dry-run", "setup", "check", "run", "status", "metrics", "stop bridge", "stop servers"]


class Walk:
    """What the test checks around the walkthrough's commands, and the steps it recognised, in order."""

    def __init__(self, shell: Shell, tmpdir: Path) -> None:
        self.shell = shell
        self.tmpdir = tmpdir
        self.dir = Path()
        self.seen: list[str] = []

    def before(self, command: str) -> None:
        if " status -c bridge.toml" in command:
            # status says what is stored: ask it (as JSON) until everything is
            poll(lambda: self.replicated(f"{command} --json"), f"status shows {MESSAGES} stored")

    def after(self, command: str, done: subprocess.CompletedProcess[str]) -> None:
        if command.startswith("mkdir"):
            self.dir = Path(self.shell.value("PWD"))
            assert self.dir.is_relative_to(self.tmpdir), self.dir  # in $TMPDIR, outside the checkout
        elif " -c leaf.conf " in command:
            self.seen.append("servers")
            hub, leaf = self.shell.value("HUB_HTTP"), self.shell.value("LEAF_HTTP")
            poll(lambda: answers(f"http://127.0.0.1:{hub}/healthz"), "the hub is up")
            poll(lambda: answers(f"http://127.0.0.1:{leaf}/healthz"), "the leaf is up")
            poll(lambda: linked(hub), "the leaf connected to the hub")
        elif "<<'PY'" in command:
            self.seen.append("origin")
        elif command.endswith(" setup -c bridge.toml --dry-run"):
            self.seen.append("dry-run")
            assert "would create" in done.stdout, done.stdout
        elif command.endswith(" setup -c bridge.toml"):
            self.seen.append("setup")
            assert "created" in done.stdout, done.stdout
        elif command.endswith(" check -c bridge.toml"):
            self.seen.append("check")
        elif " run -c bridge.toml " in command:
            self.seen.append("run")
        elif " status -c bridge.toml" in command:
            self.seen.append("status")
            assert "leaf1" in done.stdout, done.stdout
        elif "/metrics" in command:
            self.seen.append("metrics")
            assert re.search(
                rf'^nats_bridge_replicated_messages_total\{{source="leaf1"\}} {MESSAGES}\.0$', done.stdout, re.M
            ), done.stdout
        elif command.startswith("kill ") and "bridge.pid" in command:
            self.seen.append("stop bridge")
            # SIGTERM: the bridge drains and exits 0
            log = self.dir / "bridge.log"
            poll(lambda: bool(stopped_lines(log)), "the bridge stopped")
            (stopped,) = stopped_lines(log)
            assert stopped["exit_code"] == 0, log.read_text()[-3000:]
            self.exited("bridge")
        elif command.startswith("kill ") and "hub.pid" in command:
            self.seen.append("stop servers")
            self.exited("hub", "leaf")

    def exited(self, *names: str) -> None:
        pids = [int((self.dir / f"{name}.pid").read_text()) for name in names]
        poll(lambda: not any(alive(pid) for pid in pids), f"{', '.join(names)} exited")

    def replicated(self, status: str) -> bool:
        done = self.shell.run(status)
        if done.returncode != 0:
            return False
        sources = json.loads(done.stdout).get("sources", [])
        return any(s.get("stored_watermark") == MESSAGES for s in sources)


def linked(hub_http: str) -> bool:
    try:
        status, body = get(f"http://127.0.0.1:{hub_http}/leafz", 2.0)
    except OSError:
        return False
    return status == 200 and json.loads(body).get("leafnodes", 0) >= 1


def stopped_lines(log: Path) -> list[dict[str, Any]]:
    """The ``bridge.stopped`` lines of a bridge's JSON log."""
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "bridge.stopped":
                    out.append(event)
    return out


def test_the_walkthrough_replicates_between_two_servers(shell: Shell, checkout: Path, tmp_path: Path) -> None:
    commands = shell_lines(walkthrough())
    assert commands[0] == INSTALL  # the checkout's .venv/bin stands in for it
    walk = Walk(shell, tmp_path / "tmp")
    for command in commands[1:]:
        walk.before(command)
        done = shell.run(command)
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        walk.after(command, done)
    assert walk.seen == STEPS
    assert sorted(p.name for p in checkout.iterdir()) == [".venv"], "the walk wrote into the checkout"
