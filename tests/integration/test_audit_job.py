"""The audit finds exactly the damage in an aggregate, and nothing in a clean one.

Broken aggregates are built by publishing copies directly, with the headers the bridge itself writes
(``bridge.core.headers.build_header_block``); a clean one by running the bridge. One SparkSession for the run:
the command line and the demo run in this process too, on it, and must leave it running.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import operator
import re
import signal
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import pytest
import structlog
from nats.aio.client import Client

from bridge import cli
from bridge.audit import job
from bridge.audit.job import AuditOptions, run_audit
from bridge.audit.report import AuditReport, SourceReport
from bridge.config import load_config
from bridge.core import headers as hdr
from bridge.spark.session import ARCHIVE, package_archive, prepare
from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import (
    Publisher,
    aggregate_count,
    connect,
    create_aggregate,
    create_stream,
    default_payload,
    js_request,
    read_stream,
)
from bridge.testing.polling import wait_for_value
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import READY_EVENTS, Topology

T = TypeVar("T")
SPARK_TIMEOUT = 240.0


async def off_loop(fn: Callable[[], T], timeout: float = SPARK_TIMEOUT) -> T:
    """``fn`` (blocking: Spark) in a worker thread; the test fails after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)


@contextlib.contextmanager
def main_thread_deadline(seconds: float) -> Iterator[None]:
    """Bound blocking code that must run on the main thread (the demo's bridge installs signal handlers, which a
    worker thread cannot): TimeoutError is raised in it after ``seconds``."""

    def expire(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError(f"not done within {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Copy:
    seq: int
    prev: int
    skipped: str | None = None
    payload: bytes | None = None
    dedupe: bool = True  # False: no Nats-Msg-Id, so the aggregate stores a second copy
    altered: dict[str, str | None] | None = None  # headers other than the bridge writes (None: without it)


async def publish_copies(nc: Client, copies: list[Copy], source: str = "edge1") -> None:
    js = nc.jetstream(timeout=5)
    for c in copies:
        block = hdr.build_header_block(
            {"Test-Index": str(c.seq)},
            source=source,
            stream=ORIGIN,
            stream_seq=c.seq,
            prev_seq=c.prev,
            subject=f"orders.{c.seq}",
            timestamp_ns=time.time_ns() - 3_000_000,
            skipped=c.skipped,
        )
        headers = hdr.parse_header_block(block)
        for name, value in (c.altered or {}).items():
            if value is None:
                del headers[name]
            else:
                headers[name] = value
        if not c.dedupe:
            del headers[hdr.MSG_ID]
        await js.publish(f"edge.{source}.{c.seq}", c.payload or default_payload(c.seq - 1), headers=headers)


async def origin_of_fifty(leaf_nc: Client, hub_nc: Client) -> None:
    """An origin holding 50 messages (``default_payload``) and an empty aggregate, for the origin comparisons."""
    await create_stream(leaf_nc, ORIGIN, ["orders.>"], allow_direct=True)
    await Publisher(leaf_nc, 50, payload=default_payload).run()
    await create_aggregate(hub_nc)


def damaged_plan() -> list[Copy]:
    """Origin 1..500 replicated with: 100-109 lost (the chain still names them), 200 stored twice, 250 stored
    with a Nats-Msg-Id naming another source, 300 stored after 301, 400-409 skipped by a forward reset, 450-454
    never delivered (the chain goes from 449 to 455)."""
    plan: list[Copy] = []
    for s in range(1, 501):
        if 100 <= s <= 109 or 400 <= s <= 409 or 450 <= s <= 454 or s == 300:
            continue
        if s == 250:
            plan.append(Copy(250, 249, altered={hdr.MSG_ID: "edge2:ORDERS:250"}))
        elif s == 410:
            plan.append(Copy(410, 409, skipped="400-409"))
        elif s == 455:
            plan.append(Copy(455, 449))
        elif s == 301:
            plan += [Copy(301, 300), Copy(300, 299)]
        else:
            plan.append(Copy(s, s - 1))
        if s == 200:
            plan.append(Copy(200, 199, dedupe=False))
    return plan


def config_file(tmp_path: Path, topology: Topology, **spec: Any) -> Path:
    source = SourceSpec(name="edge1", servers=topology.leaf.url, **spec)
    return write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[source])


async def audit(
    spark: Any, config: Path, *, progress: Callable[[str], None] = lambda _: None, **options: Any
) -> AuditReport:
    cfg = load_config(config, environ={})
    return await off_loop(lambda: run_audit(cfg, AuditOptions(**options), spark=spark, progress=progress))


def only(report: AuditReport, source: str = "edge1") -> SourceReport:
    (found,) = [s for s in report.sources if s.source == source]
    return found


@pytest.mark.anyio
async def test_finds_exactly_the_injected_damage(spark: Any, topology: Topology, tmp_path: Path) -> None:
    async with connect(topology.hub.url) as nc:
        await create_aggregate(nc)
        await publish_copies(nc, damaged_plan())
        await nc.jetstream().publish("edge.other", b"not a copy")
    out = tmp_path / "report"
    report = await audit(spark, config_file(tmp_path, topology), out=out)

    s = only(report)
    assert (s.copies, s.distinct, s.first_seq, s.last_seq, s.chain_start) == (476, 475, 1, 500, 0)
    assert (s.lost, s.duplicates, s.reordered, s.skipped, s.not_delivered) == (10, 1, 1, 10, 5)
    assert s.inconsistent == 1
    assert s.examples == {
        "lost": [[100, 109]],
        "duplicate": [[200, 200]],
        "inconsistent_provenance": [[250, 250]],
        "reordered": [[300, 300]],
        "skipped": [[400, 409]],
    }
    assert s.problems == ["10 lost", "1 duplicated", "1 out of order", "1 with inconsistent provenance"]
    assert not report.ok and report.foreign == 1
    assert s.latency_ms["p50"] is not None and 0 < s.latency_ms["p50"] < 60_000

    written = json.loads((out / "report.json").read_text())
    assert written["verdict"] == "damaged"
    assert written["sources"][0]["examples"]["lost"] == [[100, 109]]
    sources = spark.read.parquet(str(out / "sources.parquet")).collect()
    assert [(r["source"], r["lost"], r["inconsistent_provenance"], r["ok"]) for r in sources] == [
        ("edge1", 10, 1, False)
    ]
    ranges = spark.read.parquet(str(out / "ranges.parquet"))
    got = sorted((r["kind"], r["first"], r["last"]) for r in ranges.collect())
    assert got == [
        ("duplicate", 200, 200),
        ("inconsistent_provenance", 250, 250),
        ("lost", 100, 109),
        ("not_delivered", 450, 454),
        ("reordered", 300, 300),
        ("skipped", 400, 409),
    ]
    assert (out / "audit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.anyio
async def test_where_each_chain_starts_and_what_parses_decide_what_is_judged(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    async with connect(topology.hub.url) as nc:
        await create_aggregate(nc)
        # fresh: the origin had dropped 1..4 before the bridge's consumer existed
        await publish_copies(nc, [Copy(5, 0), Copy(6, 5)], source="fresh")
        # late: the bridge began on a consumer whose ack floor was 10; below it is not the audit's to judge
        await publish_copies(nc, [Copy(11, 10), Copy(12, 11)], source="late")
        # skipped: a forward reset to 11 before the first copy; and 12 stored three times
        await publish_copies(
            nc,
            [Copy(11, 10, skipped="1-10"), Copy(12, 11), Copy(12, 11, dedupe=False), Copy(12, 11, dedupe=False)],
            source="skipped",
        )
        # forged: provenance the bridge never writes. 3 and 4 do not parse (a Bridge-Prev that is no number, no
        # Bridge-Stream), so they are foreign, as the bridge's recovery takes them; 5's Bridge-Seq parses as 5,
        # for which the bridge writes the Nats-Msg-Id forged:ORDERS:5
        await publish_copies(
            nc,
            [
                Copy(1, 0),
                Copy(2, 1),
                Copy(3, 2, altered={hdr.PREV: "two"}),
                Copy(4, 3, altered={hdr.STREAM: None}),
                Copy(5, 4, altered={hdr.SEQ: "05", hdr.MSG_ID: "forged:ORDERS:05"}),
            ],
            source="forged",
        )
    report = await audit(spark, config_file(tmp_path, topology), out=None)
    fresh, late, skipped = only(report, "fresh"), only(report, "late"), only(report, "skipped")
    assert (fresh.chain_start, fresh.not_delivered, fresh.lost, fresh.ok) == (0, 4, 0, True)
    assert (late.chain_start, late.not_delivered, late.lost, late.ok) == (10, 0, 0, True)
    assert (skipped.chain_start, skipped.skipped, skipped.lost) == (0, 10, 0)
    assert skipped.examples["skipped"] == [[1, 10]]
    assert (skipped.duplicates, skipped.examples["duplicate"]) == (2, [[12, 12]]), "extra copies, like the checker"
    assert not fresh.configured and only(report, "edge1").copies == 0

    forged = only(report, "forged")
    assert (forged.copies, forged.first_seq, forged.last_seq, forged.lost, forged.inconsistent) == (3, 1, 5, 2, 1)
    assert forged.examples == {"lost": [[3, 4]], "inconsistent_provenance": [[5, 5]]}
    assert report.foreign == 2
    assert sorted((s.source, s.origin_stream) for s in report.sources) == [
        (name, ORIGIN) for name in ("edge1", "forged", "fresh", "late", "skipped")
    ]


@pytest.mark.anyio
async def test_a_replicated_origin_is_clean_and_a_deleted_copy_is_found(
    spark: Any, topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    n = 2000
    config = config_file(tmp_path, topology, subject_prefix="edge.edge1")
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], allow_direct=True)  # Limits: the origin keeps all
        await create_aggregate(hub_nc)
        bridge = bridge_procs(config)
        await bridge.wait_event(READY_EVENTS, timeout=20)
        await Publisher(leaf_nc, n).run()
        await wait_for_value(lambda: aggregate_count(hub_nc, "edge.>"), n, timeout=60, what="copies")
        assert await bridge.astop(15) == 0

        clean = await audit(spark, config, origin_too=True, out=None)
        s = only(clean)
        assert clean.ok, clean.to_json()
        assert (s.copies, s.first_seq, s.last_seq, s.lost, s.duplicates, s.reordered) == (n, 1, n, 0, 0, 0)
        assert s.origin == {"absent": 0, "extra": 0, "hash_mismatch": 0, "pending": 0}

        # the copy of origin 777 is lost from the aggregate; 5 more messages reach the origin only
        (copy,) = [c for c in await read_stream(hub_nc, AGGREGATE) if c.origin_seq == 777]
        await js_request(hub_nc, f"STREAM.MSG.DELETE.{AGGREGATE}", {"seq": copy.seq})
        await Publisher(leaf_nc, 5).run()

    damaged = await audit(spark, config, origin_too=True, out=None)
    s = only(damaged)
    assert (s.lost, s.examples.get("lost")) == (1, [[777, 777]])
    assert s.origin == {"absent": 1, "extra": 0, "hash_mismatch": 0, "pending": 5}
    assert s.examples["absent"] == [[777, 777]] and s.examples["pending"] == [[n + 1, n + 5]]
    assert s.problems == ["1 lost", "1 absent"]


@pytest.mark.anyio
async def test_origin_comparison_finds_changed_payloads_and_copies_of_nothing(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await origin_of_fifty(leaf_nc, hub_nc)
        plan = [Copy(s, s - 1) for s in range(1, 51)]
        plan[19] = Copy(20, 19, payload=b"not what the origin stored")
        plan += [Copy(51, 50), Copy(52, 51)]  # the origin never had 51 or 52
        await publish_copies(hub_nc, plan)
    report = await audit(spark, config_file(tmp_path, topology), origin_too=True, out=None)
    s = only(report)
    assert s.origin == {"absent": 0, "extra": 2, "hash_mismatch": 1, "pending": 0}
    assert s.examples["hash_mismatch"] == [[20, 20]] and s.examples["extra"] == [[51, 52]]
    assert (s.lost, s.duplicates, s.reordered) == (0, 0, 0)
    assert not report.ok


@pytest.mark.anyio
async def test_a_bridge_writing_during_the_audit_shows_no_false_extra(
    spark: Any, topology: Topology, tmp_path: Path
) -> None:
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await origin_of_fifty(leaf_nc, hub_nc)
        await publish_copies(hub_nc, [Copy(s, s - 1) for s in range(1, 51)])

        async def replicate(seq: int) -> None:
            """What a running bridge does meanwhile: one more origin message, then its copy."""
            ack = await leaf_nc.jetstream().publish(f"orders.{seq}", default_payload(seq - 1))
            assert ack.seq == seq
            await publish_copies(hub_nc, [Copy(seq, seq - 1)])

        def progress(line: str) -> None:
            # each line is printed once that stream's snapshot is taken: 51 lands between the aggregate's and the
            # origin's, 52 after both
            if line.startswith("reading aggregate"):
                anyio.from_thread.run(replicate, 51)
            elif line.startswith("reading origin"):
                anyio.from_thread.run(replicate, 52)

        report = await audit(spark, config_file(tmp_path, topology), origin_too=True, out=None, progress=progress)
    s = only(report)
    assert report.aggregate["last_seq"] == 50, "copies stored after the aggregate's snapshot are not read"
    assert (s.copies, s.last_seq, s.lost) == (50, 50, 0)
    # 51 is in the origin's snapshot but its copy is not in the aggregate's: not replicated yet, not damage
    assert s.origin == {"absent": 0, "extra": 0, "hash_mismatch": 0, "pending": 1}
    assert s.examples == {"pending": [[51, 51]]}
    assert report.ok, report.to_json()


@pytest.mark.anyio
async def test_cli_prints_the_damage_and_exits_non_zero(
    spark: Any,
    topology: Topology,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with connect(topology.hub.url) as nc:
        await create_aggregate(nc)
        await publish_copies(nc, damaged_plan())
    config = config_file(tmp_path, topology)
    out = tmp_path / "out"
    # in this process: the audit runs on the test session's Spark, which it did not start and must not stop
    code = await off_loop(lambda: cli.main(["audit", "-c", str(config), "--out", str(out)]))
    printed = capsys.readouterr()
    assert code == 1, (printed.out, printed.err[-2000:])
    assert "edge1: lost: 100-109" in printed.out
    assert "edge1: duplicate: 200" in printed.out
    assert "edge1: inconsistent_provenance: 250" in printed.out
    assert "edge1: reordered: 300" in printed.out
    assert "edge1: skipped: 400-409" in printed.out
    assert (
        "verdict: DAMAGED (edge1: 10 lost, 1 duplicated, 1 out of order, 1 with inconsistent provenance)" in printed.out
    )
    assert (out / "report.json").exists()
    assert await off_loop(spark.range(3).count) == 3, "the audit stopped a Spark session it did not start"

    missing = write_config(
        tmp_path / "missing.toml",
        target_url=topology.hub.url,
        target_stream="NOPE",
        sources=[SourceSpec(name="edge1", servers=topology.leaf.url)],
    )
    code = await off_loop(lambda: cli.main(["audit", "-c", str(missing), "--out", str(out)]), timeout=60)
    assert code == 3
    err = capsys.readouterr().err
    assert "aggregate stream 'NOPE' does not exist on the target: correct target.stream" in err, err

    # --out naming a file: said before Spark starts, not once the whole job ran
    code = await off_loop(lambda: cli.main(["audit", "-c", str(config), "--out", str(config)]), timeout=60)
    printed = capsys.readouterr()
    assert (code, printed.out) == (2, ""), printed
    assert printed.err == (
        f"nats-bridge audit: --out {str(config)!r} exists and is not a directory: name a directory (it is created "
        "when missing)\n"
    )

    # the aggregate deleted once the pre-flight found it and its bounds were read, before Spark reads its rows:
    # Spark's own failure, said in one line (the traceback only with --verbose), and nothing judged
    async def delete_aggregate() -> None:
        async with connect(topology.hub.url) as nc:
            await js_request(nc, f"STREAM.DELETE.{AGGREGATE}")

    read_stream = job.read_stream

    def read_then_delete(session: Any, options: dict[str, str]) -> tuple[Any, int]:
        found = read_stream(session, options)
        anyio.from_thread.run(delete_aggregate)
        return found

    monkeypatch.setattr(job, "read_stream", read_then_delete)
    for verbose in ([], ["--verbose"]):
        async with connect(topology.hub.url) as nc:
            await create_aggregate(nc)
        code = await off_loop(functools.partial(cli.main, ["audit", "-c", str(config), "--out", str(out), *verbose]))
        printed = capsys.readouterr()
        said = [line for line in printed.err.splitlines() if not line.startswith("reading aggregate ")]
        assert code == 3 and printed.out == "", (code, printed)
        assert said[0].startswith(f"nats-bridge audit: the Spark job failed: stream '{AGGREGATE}' not found"), said
        if verbose:
            # Spark's text, the worker's AuditError in it, fetched while the JVM ran
            assert f"bridge.errors.AuditError: stream '{AGGREGATE}' not found" in printed.err, said
        else:
            assert len(said) == 1, said
    assert await off_loop(spark.range(3).count) == 3, "a failed audit stopped a Spark session it did not start"


@pytest.mark.anyio
async def test_the_package_is_shipped_to_the_executors_in_embedded_mode(spark: Any) -> None:
    sc = spark.sparkContext
    shipped = [f for f in sc.listFiles if f.endswith(f"/{ARCHIVE}")]
    assert len(shipped) == 1, sc.listFiles
    prepare(spark)
    assert [f for f in sc.listFiles if f.endswith(f"/{ARCHIVE}")] == shipped, "shipped once per session"
    assert package_archive() is package_archive(), "zipped once per run"

    def executor_path() -> list[str]:
        (path,) = sc.parallelize(["sys"], 1).map(importlib.import_module).map(operator.attrgetter("path")).collect()
        return list(path)

    on_path = [p for p in await off_loop(executor_path) if p.endswith(ARCHIVE)]
    assert len(on_path) == 1, "the executors' Python path holds the shipped package"
    with zipfile.ZipFile(on_path[0]) as zf:
        names = set(zf.namelist())
    assert {"bridge/__init__.py", "bridge/spark/datasource.py", "bridge/io/directget.py"} <= names


def test_the_demo_replicates_and_its_audit_is_clean(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # in this process, on the main thread (the demo's bridge handles signals), and on the test session's Spark
    logging = structlog.get_config()
    try:
        with main_thread_deadline(300):
            code = cli.main(["demo", "--messages", "3000", "--size", "128", "--audit"])
    finally:
        structlog.configure(**logging)  # the demo configured logging to this test's captured stderr
    printed = capsys.readouterr()
    assert code == 0, (printed.out[-3000:], printed.err[-3000:])
    assert re.search(r"^verdict\s+OK$", printed.out, re.M), printed.out[-3000:]
    (row,) = [line.split() for line in printed.out.splitlines() if line.startswith("leaf1 ")]
    # source, origin, copies, origin seqs, lost, dup, order, skipped, gone (then the latencies)
    assert row[:9] == ["leaf1", "ORDERS", "3000", "1..3000", "0", "0", "0", "0", "0"]
    assert "verdict: CLEAN" in printed.out
    assert spark.range(3).count() == 3, "the demo's audit stopped a Spark session it did not start"
