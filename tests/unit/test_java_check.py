"""Spark's Java, checked before Spark starts (``bridge.commands.common.java_problem``): no Java, a wrong
``JAVA_HOME`` or an old Java is one line naming the fix, and ``ingest``/``audit`` exit 3 with it (README), not a
JVM launcher's traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.commands.common import EXIT_CONFIG, EXIT_UNAUDITED, java_problem, master_problem
from bridge.errors import spark_failure
from bridge.testing.configs import SourceSpec, write_config
from bridge.testing.processes import REPO_ROOT, child_env


def fake_java(tmp_path: Path, version_line: str) -> Path:
    """A JAVA_HOME whose ``bin/java -version`` prints ``version_line`` on stderr, as a JVM does."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return home


def test_no_java_at_all() -> None:
    problem = java_problem({"PATH": ""})
    assert problem is not None and "finds none (JAVA_HOME is not set, no java on the PATH)" in problem
    assert "apt install openjdk-17-jre-headless" in problem


def test_a_java_home_without_java(tmp_path: Path) -> None:
    problem = java_problem({"PATH": "", "JAVA_HOME": str(tmp_path)})
    assert problem is not None and f"JAVA_HOME is {str(tmp_path)!r}, which has no bin/java" in problem


@pytest.mark.parametrize(
    ("line", "major"),
    [('openjdk version "11.0.22" 2024-01-16', 11), ('java version "1.8.0_392"', 8)],
)
def test_an_old_java_is_named_with_its_version(tmp_path: Path, line: str, major: int) -> None:
    problem = java_problem({"PATH": "", "JAVA_HOME": str(fake_java(tmp_path, line))})
    assert problem is not None and f"is Java {major}:" in problem


@pytest.mark.parametrize("line", ['openjdk version "17.0.15" 2025-04-15', 'openjdk version "21" 2023-09-19'])
def test_java_17_and_newer_pass(tmp_path: Path, line: str) -> None:
    assert java_problem({"PATH": "", "JAVA_HOME": str(fake_java(tmp_path, line))}) is None


@pytest.mark.parametrize("command", ["ingest", "audit"])
def test_the_spark_commands_exit_3_with_one_line_without_java(tmp_path: Path, command: str) -> None:
    config = write_config(
        tmp_path / "bridge.toml", target_url="nats://127.0.0.1:1", sources=[SourceSpec("edge1", "nats://127.0.0.1:1")]
    )
    env = {k: v for k, v in child_env().items() if k != "JAVA_HOME"}
    env["PATH"] = os.path.dirname(sys.executable)  # the interpreter, and no java
    args = ["--to", str(tmp_path / "t"), "--checkpoint", str(tmp_path / "c")] if command == "ingest" else []
    done = subprocess.run(
        [sys.executable, "-m", "bridge", command, "-c", str(config), *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_UNAUDITED, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"nats-bridge {command}: Spark needs Java 17 or newer and finds none (JAVA_HOME is not set, no java on the "
        "PATH): install a Java 17 or newer (e.g. apt install openjdk-17-jre-headless) or set JAVA_HOME to one"
    ]


def test_a_spark_failure_is_one_line_the_bridges_own_message_when_it_is_in_there() -> None:
    inside = RuntimeError(
        "An error occurred while calling o42.start.\n: org.apache.spark.SparkException: [PYTHON_DATA_SOURCE_ERROR]\n"
        'Traceback (most recent call last):\n  File "read.py", line 65, in stream_info\n'
        "bridge.errors.AuditError: stream 'AGGX' not found on nats://hub:4222: check the stream and domain options\n"
        "\tat org.apache.spark.sql..."
    )
    assert spark_failure(inside) == "stream 'AGGX' not found on nats://hub:4222: check the stream and domain options"
    assert spark_failure(RuntimeError("\n  the first line\nsecond")) == "the first line"

    class Gone(Exception):
        def __str__(self) -> str:
            raise RuntimeError("the gateway is closed")

    assert spark_failure(Gone()) == "Gone"


@pytest.mark.parametrize(
    "master", [None, "local", "local[*]", "local[4]", "local[2,3]", "yarn", "k8s://https://k:6443"]
)
def test_master_urls_spark_knows_pass(master: str | None) -> None:
    assert master_problem(master) is None


@pytest.mark.parametrize("master", ["bogus://x", "spark://nohost", "spark://h:7077/path", "local[two]", ""])
def test_a_master_that_is_no_url_is_a_usage_error_naming_the_forms(master: str) -> None:
    code, line = master_problem(master) or (0, "")
    assert code == EXIT_CONFIG and f"--master {master!r} is not a Spark master URL: use local" in line


def test_a_standalone_master_nothing_answers_at_is_exit_3_and_one_answering_passes() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            refused = closed.getsockname()[1]  # bound, never listening: a connect is refused
            assert master_problem(f"spark://127.0.0.1:{port}") is None
            assert master_problem(f"spark://127.0.0.1:{refused},127.0.0.1:{port}") is None  # one of a list will do
            code, line = master_problem(f"spark://127.0.0.1:{refused}") or (0, "")
    assert code == EXIT_UNAUDITED
    assert line.startswith(f"no Spark master answers at spark://127.0.0.1:{refused} (127.0.0.1:{refused}: ")
