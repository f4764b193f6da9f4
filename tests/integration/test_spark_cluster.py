"""``nats-bridge ingest`` and ``audit`` on a real Spark standalone cluster: a master and two workers on loopback
(:mod:`bridge.testing.spark_cluster`, from the installed pyspark alone), the drivers as processes of their own.

Over a live replicating aggregate, the ingest runs on the cluster in small micro-batches; once batches are committing,
one worker is SIGKILLed (its process group: the worker and its executor) while its executor runs a task, and more
messages are published after it. Spark must run the lost task again on the other worker, and the Parquet table must
hold every aggregate message exactly once; then the audit, on the same cluster (one worker left), must find the
aggregate clean. The executors import the bridge from the zip the driver ships (first on their Python path; the
workers' environment has no ``PYTHONPATH``), as on a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from nats.aio.client import Client

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import Publisher, aggregate_count, connect, create_aggregate, create_stream
from bridge.testing.polling import wait_until
from bridge.testing.processes import REPO_ROOT, BridgeFactory, reap_child, register_child
from bridge.testing.servers import Topology
from bridge.testing.spark_cluster import LostTask, SparkCluster

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

N_BEFORE = 500  # published while the cluster starts: the first micro-batches
RATE = 200  # messages per second from the first committed micro-batch until the kill: a live aggregate
CHUNK = 100  # ... published in runs of this many, until the kill
N_AFTER = 500  # published once the worker is killed: the stream goes on
PER_TRIGGER = 250  # small micro-batches: several of them, each one task
SPARK_TIMEOUT = 180.0  # for any one step on the cluster (a loaded machine starts JVMs slowly)


@pytest.fixture
def spark_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SparkCluster]:
    """A standalone cluster (not started: the test starts it beside its servers), stopped at teardown with every
    process it started, and its logs printed when the test failed."""
    pytest.importorskip("pyspark", reason="the audit extra is not installed: pip install -e '.[test,audit]'")
    cluster = SparkCluster(tmp_path / "spark-cluster", workers=2, cores=1, memory="512m")
    try:
        yield cluster
    finally:
        try:
            cluster.stop()  # raises if a process of the cluster (drivers included) survives
        finally:
            call = getattr(request.node, "rep_call", None)
            if call is not None and call.failed:
                print(f"\n{cluster.log_tails()}")


def start_driver(cluster: SparkCluster, name: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """``python -m bridge ARGS`` as a driver of ``cluster`` (its own JVM), in a session of its own."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bridge", *args],
            cwd=REPO_ROOT,
            env=cluster.driver_env(name),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    register_child(proc)
    return proc


def committed_seq(checkpoint: Path) -> int:
    """The last aggregate sequence a committed micro-batch of the query covers (0 before the first): the source
    offset (``{"stream", "seq", ...}``, the last line of ``offsets/<batch>``) of the newest ``commits/<batch>``."""
    commits = checkpoint / "commits"
    done = [int(f.name) for f in commits.iterdir() if f.name.isdigit()] if commits.is_dir() else []
    if not done:
        return 0
    offset = (checkpoint / "offsets" / str(max(done))).read_text().strip().splitlines()[-1]
    return int(json.loads(offset)["seq"])


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.is_dir() else 0


class LiveOrigin:
    """Publishes to the origin at ``RATE`` until :meth:`stop` (in runs of ``CHUNK``): however fast the ingest,
    there is always a next micro-batch to kill a worker in."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.published = 0
        self.stopped = anyio.Event()

    async def run(self) -> None:
        while not self.stopped.is_set():
            run = Publisher(self.nc, CHUNK, rate=RATE)
            await run.run()
            self.published += run.published

    def stop(self) -> None:
        self.stopped.set()


async def _at_least(count: Any, n: int) -> bool:
    return int(await count) >= n


async def test_ingest_on_a_cluster_loses_a_worker_mid_stream_and_writes_each_message_once(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, spark_cluster: SparkCluster, spark: Any
) -> None:
    cluster = spark_cluster
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    table, checkpoint, log = tmp_path / "table", tmp_path / "checkpoint", tmp_path / "ingest.log"
    out, audit_log = tmp_path / "audit", tmp_path / "audit.log"
    drivers: list[subprocess.Popen[bytes]] = []
    try:
        async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
            async with anyio.create_task_group() as tg:
                # the master's JVM boots while the streams and the bridge come up
                tg.start_soon(cluster.start_master, SPARK_TIMEOUT)
                await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
                await create_aggregate(hub_nc)
                bridge_procs(config)
                await Publisher(leaf_nc, N_BEFORE).run()
            cluster.start_workers()
            origin = LiveOrigin(leaf_nc)
            async with anyio.create_task_group() as tg:
                # the driver starts beside the workers: its application gets executors as they register
                ingest = start_driver(
                    cluster,
                    "ingest",
                    log,
                    *("ingest", "-c", str(config), "--to", str(table), "--checkpoint", str(checkpoint)),
                    *("--master", cluster.url, "--trigger", "0.5", "--max-messages-per-trigger", str(PER_TRIGGER)),
                )
                drivers.append(ingest)
                await cluster.wait_workers(SPARK_TIMEOUT)
                await wait_until(
                    lambda: _exited(ingest, log) or committed_batches(checkpoint) >= 1,
                    timeout=SPARK_TIMEOUT,
                    what="a first micro-batch committed on the cluster",
                    interval=0.1,
                )
                # from now on messages arrive while batches commit: there is always a next batch to kill a worker in
                tg.start_soon(origin.run)
                # batches are committing: kill a worker while its executor runs one (polled: the first one seen)
                lost: LostTask = await wait_until(
                    lambda: _exited(ingest, log) or cluster.kill_busy_worker(),
                    timeout=SPARK_TIMEOUT,
                    what="an executor running a task, to kill its worker then",
                    interval=0.02,
                )
                origin.stop()
            survivor = 1 - lost.worker
            await wait_until(
                lambda: cluster.worker_states().get(lost.worker) != "ALIVE",
                timeout=60,
                what=f"the master to see worker {lost.worker} lost",
                retry_on=(OSError, ValueError),
            )
            assert cluster.alive_workers() == [survivor]
            await Publisher(leaf_nc, N_AFTER).run()  # the stream goes on without the killed worker
            n = N_BEFORE + origin.published + N_AFTER
            await wait_until(
                lambda: _at_least(aggregate_count(hub_nc, "edge.one.>", AGGREGATE), n),
                timeout=60,
                what="every message replicated",
            )
        # the audit of the whole aggregate, on the same cluster (one worker left): its driver starts now, and its
        # application gets the worker's core once the ingest's ends
        audit = start_driver(
            cluster,
            "audit",
            audit_log,
            *("audit", "-c", str(config), "--master", cluster.url, "--out", str(out)),
        )
        drivers.append(audit)
        # the aggregate holds exactly the n copies, sequences 1..n: the query is done once a batch through n commits
        await wait_until(
            lambda: _exited(ingest, log) or committed_seq(checkpoint) >= n,
            timeout=SPARK_TIMEOUT,
            what=f"a committed micro-batch through aggregate seq {n}",
            interval=0.1,
        )
        assert committed_seq(checkpoint) == n
        ingest.send_signal(signal.SIGTERM)  # the command stops its query and Spark
        code = await anyio.to_thread.run_sync(lambda: ingest.wait(60))
        assert code == 0, log.read_text()[-3000:]
        # the task the killed executor was running was run again, on the other worker
        assert lost.retried_in(cluster.workers[survivor].executor_log_text(lost.app)), lost

        rows = spark.read.parquet(str(table))  # through _spark_metadata: committed files only
        seqs = [r["seq"] for r in rows.select("seq").collect()]
        assert len(seqs) == n and len(set(seqs)) == n, f"{len(seqs)} rows, {len(set(seqs))} distinct of {n}"
        assert sorted(seqs) == list(range(1, n + 1))
        assert sorted(r["origin_seq"] for r in rows.select("origin_seq").collect()) == list(range(1, n + 1))
        assert {r["source"] for r in rows.select("source").distinct().collect()} == {"edge1"}

        code = await anyio.to_thread.run_sync(lambda: audit.wait(SPARK_TIMEOUT))
        assert code == 0, audit_log.read_text()[-3000:]
    finally:
        for driver in drivers:
            _kill_group(driver)
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "clean", report
    (source,) = report["sources"]
    assert (source["source"], source["copies"], source["distinct"]) == ("edge1", n, n), source
    assert (source["first_seq"], source["last_seq"], source["lost"], source["duplicates"]) == (1, n, 0, 0), source


def _exited(proc: subprocess.Popen[bytes], log: Path) -> bool:
    """False while ``proc`` runs; once it has exited, fails the test with its log's tail (a wait is pointless)."""
    if proc.poll() is None:
        return False
    raise AssertionError(f"the driver exited with {proc.returncode}:\n{log.read_text()[-3000:]}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group (the driver and its JVM) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    reap_child(proc, timeout=30)
