"""The Spark session the bridge's Spark commands (``audit``, ``ingest``) and their tests use.

Embedded (``local[*]`` on loopback, no UI, workers on this interpreter) unless a master is named, or the process
was started by ``spark-submit`` (then its master is used). In every mode the ``bridge`` package is zipped (once per
process) and shipped to the executors, so a job is the same embedded and on a cluster; a cluster's executors need
its dependencies installed (README, *Audit*). :func:`stop_spark` stops a session and the JVM pyspark launched for
it, by its PID.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

from bridge.spark.datasource import JetStreamDataSource

ARCHIVE = "nats_bridge.zip"  # the name the package has on the executors' Python path
# Spark gives the Python worker of a Python data source a fixed 10 s to start and connect back
# (PythonWorkerFactory.createSimpleWorker; no setting changes it in Spark 4.x). On a loaded machine the interpreter and
# pyspark's imports can take longer, and the query fails with this text: a checkpointed query is simply started again.
WORKER_LATE = "Python worker failed to connect back"
WORKER_LATE_RETRIES = 3


def worker_was_late(failure: object) -> bool:
    """Whether a query's failure is Spark giving up on its Python worker's start (not a problem of the query)."""
    return failure is not None and WORKER_LATE in str(failure)


@functools.cache
def package_archive() -> Path:
    """The ``bridge`` package as a zip, built once per process: every session of the run ships the same file, and
    it stays until the process exits (a cluster's executors fetch it from the driver while the session lives)."""
    root = Path(__file__).resolve().parents[1]
    where = Path(tempfile.mkdtemp(prefix="nats-bridge-spark-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    archive = where / ARCHIVE
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                zf.write(path, path.relative_to(root.parent))
    return archive


def _ship_package(spark: SparkSession) -> None:
    """Put the package on the executors' Python path, once per session (a second add of the same file is only a
    warning, but one worth not printing)."""
    sc = spark.sparkContext
    archive = package_archive()
    if not any(f.endswith(f"/{archive.name}") for f in sc.listFiles):
        sc.addPyFile(str(archive))


def prepare(spark: SparkSession) -> SparkSession:
    """Make ``spark`` ready for the bridge's jobs, whoever started it: the ``jetstream`` data source registered, ``seq``
    bounds pushed down to it, and the package shipped to its executors."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")  # seq bounds reach the jetstream source
    # shipped first: a Python data source's workers get only the files added (addPyFile) before its registration,
    # which fixes its function's includes; registered before, a cluster's executors could not import the bridge
    _ship_package(spark)
    spark.dataSource.register(JetStreamDataSource)
    return spark


def running_session() -> SparkSession | None:
    """The session of the Spark context already running in this process, if any (never a new JVM)."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:
        return None
    return SparkSession.builder.getOrCreate()


def spark_session(
    master: str | None = None,
    *,
    local_cores: int | None = None,
    app_name: str = "nats-bridge",
    java_options: str = "",
) -> SparkSession:
    """A Spark session for the bridge's jobs: embedded ``local[*]`` (or ``local[<local_cores>]``) by default,
    ``master`` when given, spark-submit's when launched by it; ready for them (:func:`prepare`). ``java_options``:
    more options of the embedded session's JVM (the test suite's makes it start and compile cheaply)."""
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit (or pyspark's shell) already chose a master
    builder = SparkSession.builder.appName(app_name)
    if master is None and not submitted:
        # the executors must run this interpreter, with this environment's packages
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else Spark warns that the host name is loopback
        log4j = Path(__file__).with_name("log4j2.properties")
        builder = (
            builder.master(f"local[{local_cores or '*'}]")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j.as_uri()} {java_options}")
            # the audit's shuffles group by source: few keys, so few partitions (AQE splits skew if needed)
            .config("spark.sql.shuffle.partitions", str(local_cores or os.cpu_count() or 1))
        )
    elif master is not None:
        builder = builder.master(master)
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return prepare(spark)


def stop_spark(spark: SparkSession, timeout: float = 20.0) -> None:
    """Stop ``spark`` and the JVM pyspark launched for it, by its PID (its Python workers exit with it), so no
    process outlives the audit that started it. A session whose JVM pyspark did not launch is only stopped."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    spark.stop()
    if gateway is None or proc is None:
        return
    gateway.shutdown()
    SparkContext._gateway = None  # the next session launches a JVM of its own
    SparkContext._jvm = None
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
