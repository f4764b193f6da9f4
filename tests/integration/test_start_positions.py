"""Start positions (``sources[].start``, ``start_sequence``, ``start_time``, ``start_ago``) on Limits, Interest and
WorkQueue origins: each kind replicates from where it says and no earlier (the first copy names the skipped range
in ``Bridge-Skipped``), nothing before the start is acked (a WorkQueue origin keeps it), and a restart after the
first copies, with the "new" source's consumer deleted meanwhile, replicates what came while the bridge was away:
the start is not applied twice (the copies win). Pull mode (origins before 2.14) places the consumer by the same
deliver policies, and refuses a start on a WorkQueue origin, which it cannot reset."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.testing.configs import AGGREGATE, SourceSpec, write_config
from bridge.testing.jetstream import (
    Publisher,
    assert_exact,
    connect,
    consumer_info,
    create_aggregate,
    create_stream,
    js_request,
    read_stream,
    seqs_by_source,
    stream_messages,
)
from bridge.testing.polling import wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory, run_cli
from bridge.testing.servers import Topology, mode_source_extra, ready_event

pytestmark = pytest.mark.anyio

BEFORE = 20  # in each origin before the bridge starts
AFTER = 10  # once every source is bound
LATER = 5  # while the bridge is stopped
KINDS: dict[str, dict[str, Any]] = {
    "new": {"start": "new"},
    "seq": {"start_sequence": 15},
    "time": {},  # start_time: set between the two halves of BEFORE
    "ago": {"start_ago": "1h"},
}


def subjects(name: str, tag: str) -> Callable[[int], str]:
    return lambda i: f"{name}.{tag}{i}"


@pytest.mark.pullmode
@pytest.mark.parametrize("retention", ["limits", "interest", "workqueue"])
async def test_each_start_kind_replicates_from_its_start_and_a_restart_does_not_apply_it_again(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory, origin_mode: str, retention: str
) -> None:
    pull = origin_mode == "pull"
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_aggregate(hub_nc)
        publishers: dict[str, list[Publisher]] = {}
        middle = ""
        for name in KINDS:
            await create_stream(leaf_nc, name.upper(), [f"{name}.>"], retention=retention)
            if retention == "interest":  # an Interest stream keeps only what some consumer still wants
                await js_request(
                    leaf_nc,
                    f"CONSUMER.CREATE.{name.upper()}.keeper",
                    {"stream_name": name.upper(), "config": {"durable_name": "keeper", "ack_policy": "explicit"}},
                )
            first = Publisher(leaf_nc, BEFORE // 2, subject=subjects(name, "a"))
            await first.run()
            if name == "time":  # every message after this instant is the start_time source's
                middle = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            second = Publisher(leaf_nc, BEFORE // 2, subject=subjects(name, "b"))
            await second.run()
            publishers[name] = [first, second]
        KINDS["time"] = {"start_time": middle}
        specs = [
            SourceSpec(
                name=name,
                servers=topology.leaf.url,
                stream=name.upper(),
                subject_prefix=f"edge.{name}",
                extra={**mode_source_extra(origin_mode), **start},
            )
            for name, start in KINDS.items()
        ]
        config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=specs)
        bridge = bridge_procs(config)
        if pull and retention == "workqueue":
            # pull mode cannot place a WorkQueue consumer past its first message: refused, named, nothing acked
            await bridge.wait_event("source.setup_failed", timeout=30, source="new")
            failed = bridge.events("source.setup_failed", source="new")[0]
            assert "needs flow-control mode" in failed["error"], failed
            assert await bridge.astop(30) == 0
            for name in KINDS:
                assert await stream_messages(leaf_nc, name.upper()) == BEFORE
            return
        for name in KINDS:
            await bridge.wait_event(ready_event(origin_mode), timeout=30, source=name)
        for name in KINDS:
            after = Publisher(leaf_nc, AFTER, subject=subjects(name, "c"))
            await after.run()
            publishers[name].append(after)
        # from the start on, nothing before it: new after the creation, seq from 15, time from the 11th, ago (1h)
        firsts = {"new": BEFORE + 1, "seq": 15, "time": BEFORE // 2 + 1, "ago": 1}
        await _copies_are(hub_nc, {n: range(f, BEFORE + AFTER + 1) for n, f in firsts.items()})
        decisions = {e["source"]: e["decision"] for e in bridge.events("consumer.start")}
        assert set(decisions) == set(KINDS) and all(d.startswith("applied") for d in decisions.values()), decisions
        # nothing before the start is acked: a WorkQueue origin keeps it (and loses what was acked), a Limits one
        # keeps everything
        if retention != "interest":
            for name, first_seq in firsts.items():
                kept = first_seq - 1 if retention == "workqueue" else BEFORE + AFTER
                count = functools.partial(stream_messages, leaf_nc, name.upper())
                await wait_for_value(count, kept, timeout=30, what=f"{name} kept")
        assert await bridge.astop(30) == 0

        # away: the "new" source's consumer is deleted (on Interest that would drop what comes meanwhile), and
        # messages arrive; the new consumer must start at the copies, not at "new" again
        if retention != "interest":
            await js_request(leaf_nc, f"CONSUMER.DELETE.NEW.{specs[0].consumer_name}")
        for name in KINDS:
            later = Publisher(leaf_nc, LATER, subject=subjects(name, "d"))
            await later.run()
        again = bridge_procs(config)
        await _copies_are(hub_nc, {n: range(f, BEFORE + AFTER + LATER + 1) for n, f in firsts.items()})
        if retention != "interest":
            ignored = again.events("consumer.start", source="new")
            assert ignored and ignored[0]["decision"].startswith("ignored"), ignored
        assert await again.astop(30) == 0
        info = await consumer_info(leaf_nc, "SEQ", specs[1].consumer_name)
        if retention == "workqueue":  # the server allows only deliver all there: the bridge reset it to the start
            assert info["config"]["deliver_policy"] == "all"
            assert info["config"]["metadata"]["nats-bridge.start_seq"] == "15"
        else:
            assert (info["config"]["deliver_policy"], info["config"]["opt_start_seq"]) == ("by_start_sequence", 15)
        copies = await read_stream(hub_nc, AGGREGATE)
        skipped = {c.source: c.headers.get("Bridge-Skipped") for c in reversed(copies) if c.source}
        assert skipped["seq"] == "1-14" and skipped["new"] == f"1-{BEFORE}" and skipped["ago"] is None, skipped


async def _copies_are(hub_nc: object, expected: dict[str, range]) -> None:
    async def exact() -> bool:
        by_source = seqs_by_source(await read_stream(hub_nc, AGGREGATE))  # type: ignore[arg-type]
        return all(by_source.get(name, []) == list(seqs) for name, seqs in expected.items())

    try:
        await wait_until(exact, timeout=60, what="every source's copies", interval=0.1)
    finally:
        by_source = seqs_by_source(await read_stream(hub_nc, AGGREGATE))  # type: ignore[arg-type]
        for name, seqs in expected.items():
            assert_exact(by_source.get(name, []), seqs, f"{name} copies")


async def test_setup_applies_the_start_and_check_says_what_it_leaves(topology: Topology, tmp_path: Path) -> None:
    specs = [
        SourceSpec(name="wq", servers=topology.leaf.url, stream="WQ", subject_prefix="edge.wq", extra={"start": "new"}),
        SourceSpec(
            name="bound",
            servers=topology.leaf.url,
            stream="LIM",
            subject_prefix="edge.bound",
            consumer="ops-bound",
            extra={"start_sequence": 3, "manage_consumer": False},
        ),
    ]
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=specs)
    async with connect(topology.leaf.url) as leaf_nc:
        await create_stream(leaf_nc, "WQ", ["wq.>"], retention="workqueue")
        await create_stream(leaf_nc, "LIM", ["lim.>"])
        await Publisher(leaf_nc, 4, subject=subjects("wq", "x")).run()
        await js_request(
            leaf_nc,
            "CONSUMER.CREATE.LIM.ops-bound",
            {"stream_name": "LIM", "config": {"durable_name": "ops-bound", "ack_policy": "explicit"}},
        )
        planned = await anyio.to_thread.run_sync(lambda: run_cli("setup", "-c", str(config), "--dry-run"))
        assert "start new" in planned.stdout, planned.stdout
        done = await anyio.to_thread.run_sync(lambda: run_cli("setup", "-c", str(config)))
        assert "start applied: new (sequence 5)" in done.stdout, done.stdout
        info = await consumer_info(leaf_nc, "WQ", specs[0].consumer_name)
        assert (info["config"]["deliver_policy"], info["config"]["metadata"]["nats-bridge.start_seq"]) == ("all", "5")
        checked = await anyio.to_thread.run_sync(lambda: run_cli("check", "-c", str(config)))
        assert checked.returncode == 1, checked.stdout  # the bound consumer delivers from its first message
        out = checked.stdout
        assert "source wq: start new: the consumer exists: it keeps where it was created" in out, out
        assert "note: on this workqueue origin what lies before the start is never acked by the bridge" in out, out
        assert "source bound: start sequence 3, but the pre-created consumer ops-bound delivers from the first" in out
