"""``python -m bench publish-modes``: what JetStream fast batch publishing would save the bridge's publish side.

The bridge publishes each copy with its own reply subject and counts one PubAck per copy. nats-server 2.14+ also
offers *fast batch* publishing (stream ``allow_batched: true``; reply subject
``<prefix>.<batch id>.<flow>.<gap mode>.<batch seq>.<op>.$FI``), where the server answers one ``BatchFlowAck``
(``{"type":"ack","seq":N,"msgs":M}``: with gap mode ``fail``, everything up to batch sequence N is stored) every
M messages instead of a PubAck per message (``server/jetstream_batching.go``, ``server/stream.go`` in 2.14.0).

This measures the ceiling of that change, publish side only: one hub, one Python client (nats-py's ``publish``,
the same for both modes), ``--messages`` messages of ``--size`` bytes into a fresh file stream per run, at most
``WINDOW`` unacknowledged, alternating the two modes ``--reps`` times. It prints msg/s and the client's and the
hub's CPU microseconds per message, per mode (medians), and the saving per message. The bridge's whole path
costs the sum of its own and the servers' CPU per message (``python -m bench run`` prints both), so the saving
here, divided by that sum, bounds the throughput fast batching could add on a CPU-bound machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from bench.natsops import BenchError, api, connect
from bench.procs import cpu_seconds
from bridge.testing.servers import NatsServer

WINDOW = 1024  # the bridge's default publish_window
PIPELINED = "pipelined"
FAST_BATCH = "fast-batch"
FAST_FLOW = 500  # the largest ack interval the server grants (jetstream_batching.go fastBatchInit)


def parser(sub: Any) -> None:
    """Add the ``publish-modes`` subcommand to ``python -m bench``."""
    cmd = sub.add_parser("publish-modes", help="pipelined PubAcks against fast batch publishing, publish side only")
    cmd.add_argument("--messages", type=int, default=200_000, help="messages per run (default 200000)")
    cmd.add_argument("--size", type=int, default=256, help="payload bytes (default 256)")
    cmd.add_argument("--reps", type=int, default=3, help="runs of each mode, alternating (default 3)")
    cmd.add_argument("--out", type=Path, help="write the figures as JSON here too")


@dataclass
class ModeRun:
    """One run of one mode."""

    mode: str
    msgs_per_s: float
    client_us_per_msg: float
    hub_us_per_msg: float


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _Acks:
    """Counts what the server says is stored, and wakes the publisher when the window has room."""

    def __init__(self, mode: str, total: int) -> None:
        self.mode = mode
        self.total = total
        self.stored = 0
        self.sent = 0
        self.error: str | None = None
        self.room = asyncio.Event()
        self.done = asyncio.Event()

    async def on_reply(self, msg: Msg) -> None:
        if self.mode == PIPELINED:
            if msg.data.startswith(b'{"stream"'):
                self.stored += 1
            else:
                self.error = msg.data.decode(errors="replace")
        else:
            body = json.loads(msg.data)
            kind = body.get("type")
            if kind == "ack":
                self.stored = max(self.stored, int(body["seq"]))
            elif kind is None and "batch" in body:  # the commit's PubAck
                self.stored = int(body["count"])
            else:
                self.error = msg.data.decode(errors="replace")
        if self.error is not None or self.stored >= self.total:
            self.done.set()
        if self.sent - self.stored < WINDOW:
            self.room.set()


async def _one_run(nc: Client, hub_pid: int, mode: str, index: int, count: int, size: int) -> ModeRun:
    stream = f"PM{index}"
    subject = f"pm{index}.x"
    await api(
        nc,
        f"$JS.API.STREAM.CREATE.{stream}",
        {"name": stream, "subjects": [f"pm{index}.>"], "storage": "file", "allow_batched": mode == FAST_BATCH},
    )
    acks = _Acks(mode, count)
    inbox = f"_INBOX.{uuid.uuid4().hex}"
    sub = await nc.subscribe(f"{inbox}.>", cb=acks.on_reply)
    await nc.flush()
    batch = uuid.uuid4().hex[:16]
    payload = os.urandom(size)
    client0, hub0, started = _own_cpu(), cpu_seconds(hub_pid), time.perf_counter()
    for seq in range(1, count + 1):
        while seq - 1 - acks.stored >= WINDOW and acks.error is None:
            acks.room.clear()
            await asyncio.wait_for(acks.room.wait(), 30)
        if acks.error is not None:
            break
        if mode == PIPELINED:
            reply = f"{inbox}.{seq}"
        else:  # op 0 starts the batch, 1 appends, 2 commits (stream.go FastBatchOp*)
            op = 0 if seq == 1 else (2 if seq == count else 1)
            reply = f"{inbox}.{batch}.{FAST_FLOW}.fail.{seq}.{op}.$FI"
        await nc.publish(subject, payload, reply=reply)
        acks.sent = seq
    await asyncio.wait_for(acks.done.wait(), 120)
    elapsed = time.perf_counter() - started
    client, hub = _own_cpu() - client0, cpu_seconds(hub_pid) - hub0
    await sub.unsubscribe()
    if acks.error is not None:
        raise BenchError(f"{mode}: the server refused a message: {acks.error}")
    info = await api(nc, f"$JS.API.STREAM.INFO.{stream}")
    if info["state"]["messages"] != count:
        raise BenchError(f"{mode}: {info['state']['messages']} stored, {count} sent")
    await api(nc, f"$JS.API.STREAM.DELETE.{stream}")
    return ModeRun(mode, count / elapsed, 1e6 * client / count, 1e6 * hub / count)


async def _measure(url: str, hub_pid: int, args: argparse.Namespace) -> list[ModeRun]:
    nc = await connect(url, "bench publish-modes")
    try:
        runs: list[ModeRun] = []
        for index in range(2 * args.reps):
            mode = (PIPELINED, FAST_BATCH)[index % 2]
            run = await _one_run(nc, hub_pid, mode, index, args.messages, args.size)
            print(
                f"  {mode:10} {run.msgs_per_s:9,.0f} msg/s   client {run.client_us_per_msg:5.2f} us/msg   "
                f"hub {run.hub_us_per_msg:5.2f} us/msg",
                flush=True,
            )
            runs.append(run)
        return runs
    finally:
        await nc.close()


def run(args: argparse.Namespace) -> int:
    """Run the measurement; returns the exit code."""
    workdir = Path(tempfile.mkdtemp(prefix="bench-publish-modes-"))
    hub = NatsServer(workdir / "hub", name="hub")
    hub.start()
    try:
        hub.wait_ready()
        version = hub.monitor("varz")["version"]
        print(f"nats-server {version}: {args.messages:,} x {args.size} B per run, window {WINDOW}", flush=True)
        assert hub.pid is not None
        try:
            runs = asyncio.run(_measure(hub.url, hub.pid, args))
        except BenchError as exc:
            print(f"failed: {exc}")
            return 1
        medians: dict[str, dict[str, float]] = {}
        for mode in (PIPELINED, FAST_BATCH):
            mine = [r for r in runs if r.mode == mode]
            medians[mode] = {
                "msgs_per_s": round(statistics.median(r.msgs_per_s for r in mine)),
                "client_us_per_msg": round(statistics.median(r.client_us_per_msg for r in mine), 2),
                "hub_us_per_msg": round(statistics.median(r.hub_us_per_msg for r in mine), 2),
            }
        saved_client = medians[PIPELINED]["client_us_per_msg"] - medians[FAST_BATCH]["client_us_per_msg"]
        saved_hub = medians[PIPELINED]["hub_us_per_msg"] - medians[FAST_BATCH]["hub_us_per_msg"]
        print(
            f"medians: {json.dumps(medians)}\n"
            f"fast batch saves {saved_client:.2f} us of client CPU and {saved_hub:.2f} us of hub CPU per message"
        )
        results = {
            "server_version": version,
            "messages": args.messages,
            "size": args.size,
            "window": WINDOW,
            "medians": medians,
            "saved_us_per_msg": {"client": round(saved_client, 2), "hub": round(saved_hub, 2)},
        }
        if args.out is not None:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
        return 0
    finally:
        hub.stop()
        shutil.rmtree(workdir, ignore_errors=True)
