"""``python -m bridge run|check -c FILE`` as an operator sees it: exit codes and what is printed.

Invalid configuration: exit 2, a header line and one line per problem naming the key on stderr, no traceback,
for ``run`` and ``check`` alike. ``check`` against real servers: exit 0 with an OK line per source, exit 1 when the
aggregate stream is missing. ``demo``: where metrics and health can be seen, printed while it runs.
"""

from __future__ import annotations

import re
import shlex
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import pytest
from anyio.streams.text import TextReceiveStream

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.http import http_get
from bridge.testing.jetstream import connect, consumer_exists, create_aggregate, create_stream
from bridge.testing.processes import REPO_ROOT, child_env, run_cli
from bridge.testing.servers import Topology

GOOD_SOURCE = """
[[sources]]
name = "edge1"
servers = ["nats://127.0.0.1:4222"]
stream = "ORDERS"
"""

BAD_CONFIGS = {
    "unknown-key": (
        """
        [target]
        stream = "AGG"
        strem = "typo"
        """
        + GOOD_SOURCE,
        ["target.strem"],
    ),
    "missing-target-stream": (
        """
        [target]
        servers = ["nats://127.0.0.1:4222"]
        """
        + GOOD_SOURCE,
        ["target.stream"],
    ),
    "max-ack-pending-zero": (
        """
        [target]
        stream = "AGG"
        """
        + GOOD_SOURCE
        + "max_ack_pending = 0\n",
        ["max_ack_pending"],
    ),
    "duplicate-source-names": (
        """
        [target]
        stream = "AGG"
        """
        + GOOD_SOURCE
        + GOOD_SOURCE,
        ["name"],
    ),
    "two-problems": (
        """
        [target]
        stream = "AGG"
        colour = "blue"
        """
        + GOOD_SOURCE
        + "max_ack_pending = 0\n",
        ["target.colour", "max_ack_pending"],
    ),
    "toml-syntax-error": (
        """
        [target]
        stream = "AGG
        """,
        ["line 3"],
    ),
}


def problem_lines(stderr: str) -> list[str]:
    """The lines after the header: one per problem."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    assert lines[0].startswith("nats-bridge: invalid configuration"), lines[0]
    return lines[1:]


@pytest.mark.parametrize("command", ["run", "check"])
@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_invalid_config_exits_2_with_one_line_per_problem(tmp_path: Path, case: str, command: str) -> None:
    text, keys = BAD_CONFIGS[case]
    path = tmp_path / "bridge.toml"
    path.write_text(textwrap.dedent(text))
    done = run_cli(command, "-c", str(path))
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    problems = problem_lines(done.stderr)
    assert len(problems) == len(keys), problems
    for key in keys:
        assert sum(key in line for line in problems) == 1, (key, problems)


@pytest.mark.parametrize("command", ["run", "check"])
def test_missing_config_file_exits_2(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "nope.toml"
    done = run_cli(command, "-c", str(missing))
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    problems = problem_lines(done.stderr)
    assert len(problems) == 1 and str(missing) in problems[0], problems


def test_duplicate_names_line_names_the_second_source(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(textwrap.dedent(BAD_CONFIGS["duplicate-source-names"][0]))
    problems = problem_lines(run_cli("check", "-c", str(path)).stderr)
    assert len(problems) == 1 and problems[0].strip().startswith("sources[1].name"), problems


def test_zero_max_ack_pending_line_names_the_source_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bridge.toml"
    path.write_text(textwrap.dedent(BAD_CONFIGS["max-ack-pending-zero"][0]))
    problems = problem_lines(run_cli("run", "-c", str(path)).stderr)
    assert len(problems) == 1 and problems[0].strip().startswith("sources[edge1].max_ack_pending"), problems


@pytest.mark.anyio
async def test_check_against_running_topology(topology: Topology, tmp_path: Path) -> None:
    specs = [
        SourceSpec(name="direct", servers=topology.leaf.url, subject_prefix="edge.direct"),
        SourceSpec(
            name="sidecar",
            servers=topology.hub.url,
            domain="leaf",
            stream="ORDERS_B",
            subject_prefix="edge.sidecar",
        ),
    ]
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=specs)
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")

        # no aggregate yet and one origin stream missing: exit 1; the aggregate is pointed to the setup command that
        # creates it, with this very file; the origin stream to its owner, since setup does not create one; the
        # other source is still checked
        done = await anyio.to_thread.run_sync(lambda: run_cli("check", "-c", str(config)))
        assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in done.stdout + done.stderr
        failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
        assert sorted(failed) == [
            "FAIL source sidecar: origin stream 'ORDERS_B' does not exist; it is your applications' own stream, "
            "which nats-bridge setup does not create: create it on the origin, or correct sources[sidecar].stream "
            "or .domain",
            f"FAIL target stream {AGGREGATE}: the aggregate does not exist on the target; create it with: "
            f"nats-bridge setup -c {shlex.quote(str(config))}",
        ], done.stdout
        assert any(line.startswith("OK   source direct: origin ") for line in done.stdout.splitlines()), done.stdout

        await create_stream(leaf_nc, "ORDERS_B", ["b.>"], retention="interest")
        await create_aggregate(hub_nc)
        done = await anyio.to_thread.run_sync(lambda: run_cli("check", "-c", str(config)))
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in done.stdout + done.stderr
        lines = done.stdout.splitlines()
        for spec in specs:
            ok = [
                line
                for line in lines
                if line.startswith("OK") and f"source {spec.name}:" in line and "link round trip" not in line
            ]  # a loaded machine may take loopback for a far link and add its window advice
            # the mode it will run in (and why), then its origin and consumer
            assert len(ok) == 2 and f"source {spec.name}: mode " in ok[0], (spec.name, lines)
        assert not any(line.startswith("FAIL") for line in lines), lines
        # a managed consumer is created by check, ready for run
        assert await consumer_exists(leaf_nc, ORIGIN, specs[0].consumer_name)
        assert await consumer_exists(leaf_nc, "ORDERS_B", specs[1].consumer_name)


DEMO_URLS = re.compile(
    r"metrics (?P<base>http://127\.0\.0\.1:(?P<port>\d+))/metrics +health (?P=base)/healthz +readiness (?P=base)/readyz"
)


async def _lines(stream: anyio.abc.ByteReceiveStream) -> AsyncIterator[str]:
    pending = ""
    async for text in TextReceiveStream(stream):
        pending += text
        *complete, pending = pending.split("\n")
        for line in complete:
            yield line
    if pending:
        yield pending


@pytest.mark.anyio
async def test_the_demo_prints_where_metrics_and_health_are_while_it_runs() -> None:
    cmd = [sys.executable, "-m", "bridge", "demo", "--messages", "5000"]
    stdout: list[str] = []
    stderr: list[str] = []
    live: dict[str, tuple[int, bytes]] = {}

    async def collect(stream: anyio.abc.ByteReceiveStream, into: list[str]) -> None:
        async for line in _lines(stream):
            into.append(line)

    with anyio.fail_after(120):
        async with await anyio.open_process(cmd, cwd=REPO_ROOT, env=child_env()) as demo:
            assert demo.stdout is not None and demo.stderr is not None
            async with anyio.create_task_group() as tg:
                tg.start_soon(collect, demo.stderr, stderr)
                async for line in _lines(demo.stdout):
                    stdout.append(line)
                    found = DEMO_URLS.search(line)
                    if found and not live:
                        # the demo checks for completion 0.5 s after printing these at the soonest
                        port = int(found["port"])
                        live = {path: await http_get(port, path) for path in ("/healthz", "/metrics")}
            code = await demo.wait()
    text = "\n".join(stdout)
    assert code == 0, (text[-3000:], "\n".join(stderr)[-3000:])
    assert live, f"no metrics/health URLs printed:\n{text}"
    assert live["/healthz"] == (200, b'{"status": "ok"}\n')
    assert live["/metrics"][0] == 200 and b"nats_bridge_build_info" in live["/metrics"][1]
    urls_at = next(i for i, line in enumerate(stdout) if DEMO_URLS.search(line))
    assert urls_at < next(i for i, line in enumerate(stdout) if line.startswith("verdict")), text
    assert re.search(r"^verdict\s+OK$", text, re.M), text
    # the README's words, with the counts labelled so that they cannot read as a contradiction
    assert re.search(r"^published to the origin\s+\d+$", text, re.M), text
    assert re.search(r"^still in the origin\s+0 ", text, re.M), text
    assert "acked to the origin by the bridge" in text
