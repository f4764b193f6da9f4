"""``nats-bridge ingest`` over a live replicating aggregate: killed (the driver, SIGKILL, with its JVM) at a point
of a seeded random choice, run again while the messages still arrive and stopped (SIGTERM, exit 0) once it has
written the last; the Parquet table read back with Spark holds every aggregate message exactly once."""

from __future__ import annotations

import functools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import Publisher, aggregate_count, connect, create_aggregate, create_stream
from bridge.testing.polling import wait_until
from bridge.testing.processes import REPO_ROOT, BridgeFactory, child_env, run_cli
from bridge.testing.servers import Topology
from bridge.testing.spark_cluster import JAVA_OPTIONS

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

N = 3000
PER_TRIGGER = 150
SEED = int(os.environ.get("INGEST_TEST_SEED", "7"))


def committed_batches(table: Path) -> int:
    log = table / "_spark_metadata"
    return sum(1 for f in log.iterdir() if f.name.isdigit()) if log.is_dir() else 0


def has_committed(table: Path, batches: int) -> bool:
    return committed_batches(table) >= batches


class Ingest:
    """``python -m bridge ingest`` in a process group of its own (the driver and the JVM it starts)."""

    def __init__(
        self,
        config: Path,
        table: Path,
        checkpoint: Path,
        log: Path,
        trigger: str,
        per_trigger: int | None = PER_TRIGGER,
    ) -> None:
        argv = [sys.executable, "-m", "bridge", "ingest", "-c", str(config)]
        argv += ["--to", str(table), "--checkpoint", str(checkpoint), "--trigger", trigger]
        if per_trigger is not None:
            # small batches: however fast the messages arrive, there are many batch boundaries to be killed around
            argv += ["--max-messages-per-trigger", str(per_trigger)]
        # every JVM the command starts takes the test clusters' options (java reads JDK_JAVA_OPTIONS and says so on
        # stderr, into the log): this test's CPU fell from 76 s to 50 s, and its wall time from 138 s to 86 s
        env = {**child_env(), "JDK_JAVA_OPTIONS": JAVA_OPTIONS}
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            return

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.signal_group(signal.SIGKILL)  # nothing of the group outlives it (the JVM included)


async def test_ingest_killed_and_restarted_writes_each_message_once(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, spark: Any
) -> None:
    rng = random.Random(SEED)
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    table, checkpoint, log = tmp_path / "table", tmp_path / "checkpoint", tmp_path / "ingest.log"
    runs: list[Ingest] = []
    try:
        async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
            await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
            await create_aggregate(hub_nc)
            bridge_procs(config)
            async with anyio.create_task_group() as tg:
                tg.start_soon(Publisher(leaf_nc, N, rate=300).run)  # about 10 s of production
                killed = Ingest(config, table, checkpoint, log, "0.5")
                runs.append(killed)
                batches = rng.randint(1, 3)
                await wait_until(
                    functools.partial(has_committed, table, batches),
                    timeout=120,
                    what=f"{batches} committed micro-batches",
                    interval=0.1,
                )
                await anyio.sleep(rng.uniform(0.0, 0.5))  # anywhere in a batch, or between two
                killed.signal_group(signal.SIGKILL)  # the driver and its JVM, at once
                code = await anyio.to_thread.run_sync(killed.wait, 60.0)
                assert code == -signal.SIGKILL, log.read_text()[-3000:]
                # the next run streams on while the messages still arrive (whatever the killed one left half
                # written is written again), then is stopped with SIGTERM once it has committed the last one
                start = log.stat().st_size
                final = Ingest(config, table, checkpoint, log, "0.5", per_trigger=None)  # the backlog at once
                runs.append(final)
            await wait_until(
                lambda: _at_least(aggregate_count(hub_nc, "edge.one.>", AGGREGATE), N),
                timeout=60,
                what="every message replicated",
            )
        # the aggregate holds exactly the N copies, sequences 1..N: the progress line names N once all are written
        await wait_until(
            lambda: f"offset seq {N}," in log.read_text()[start:],
            timeout=180,
            what=f"the ingest's progress at offset seq {N}",
            interval=0.5,
        )
        final.proc.send_signal(signal.SIGTERM)  # the command stops its query and Spark
        assert await anyio.to_thread.run_sync(final.wait, 60.0) == 0, log.read_text()[-3000:]
    finally:
        for run in runs:
            run.signal_group(signal.SIGKILL)
    rows = spark.read.parquet(str(table))
    assert set(rows.columns) >= {"seq", "source", "day", "origin_seq", "origin_stream"}
    seqs = [r["seq"] for r in rows.select("seq").collect()]
    assert len(seqs) == N and len(set(seqs)) == N, f"{len(seqs)} rows, {len(set(seqs))} distinct of {N}"
    origin = sorted(r["origin_seq"] for r in rows.select("origin_seq").collect())
    assert origin == list(range(1, N + 1))
    assert {r["source"] for r in rows.select("source").distinct().collect()} == {"edge1"}
    assert "ingest stopped:" in log.read_text()


async def _at_least(count: Any, n: int) -> bool:
    return int(await count) >= n


def test_ingest_without_spark_says_what_to_install(tmp_path: Path) -> None:
    """The command names the missing extra rather than failing with a traceback (exit 3)."""
    config = write_config(
        tmp_path / "bridge.toml", target_url="nats://127.0.0.1:1", sources=[SourceSpec("edge1", "nats://127.0.0.1:1")]
    )
    env = {**child_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{child_env()['PYTHONPATH']}"}
    (tmp_path / "pyspark").mkdir()
    (tmp_path / "pyspark" / "__init__.py").write_text("raise ImportError('pyspark hidden by the test')\n")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bridge", "ingest", "-c", str(config), "--to", "t", "--checkpoint", "c"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "audit extra" in done.stderr and time.monotonic() - started < 60


@pytest.mark.anyio
async def test_a_missing_aggregate_or_a_file_for_a_directory_is_one_line_before_spark(
    topology: Topology, tmp_path: Path
) -> None:
    """Mistakes a person makes are named in one line, with the fix, before any JVM starts (README's exit codes)."""
    config = write_config(
        tmp_path / "bridge.toml",
        target_url=topology.hub.url,
        target_stream="AGGX",
        sources=[SourceSpec("edge1", topology.leaf.url)],
    )
    a_file = tmp_path / "table"
    a_file.write_text("not a directory")

    def ingest(to: Path) -> subprocess.CompletedProcess[str]:
        return run_cli("ingest", "-c", str(config), "--to", str(to), "--checkpoint", str(tmp_path / "c"), timeout=60)

    wrong = await anyio.to_thread.run_sync(lambda: ingest(a_file))
    assert wrong.returncode == 2, wrong.stderr
    assert wrong.stderr.strip().splitlines() == [
        f"nats-bridge ingest: --to {str(a_file)!r} exists and is not a directory: name a directory (it is created "
        "when missing)"
    ]
    missing = await anyio.to_thread.run_sync(lambda: ingest(tmp_path / "t"))
    assert missing.returncode == 3, missing.stderr
    assert missing.stderr.strip().splitlines() == [
        "nats-bridge ingest: aggregate stream 'AGGX' does not exist on the target: correct target.stream (or "
        f"target.domain), or create it with nats-bridge setup -c {config}"
    ]
