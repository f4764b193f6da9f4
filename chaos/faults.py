"""The nemesis's repertoire: every fault kind the suite injects, each one inject → hold → heal.

Each fault draws its parameters (which source, how long, which sequence) from the scenario's seeded random
generator and writes what it did to the run's timeline, so a failing run can be replayed and read. The holds
(``asyncio.sleep``) are the fault's duration, chosen on purpose; every wait for a *condition* polls against a
deadline.

Every kind applies to both of the bridge's modes except those in :data:`FLOW_CONTROL_ONLY`: against an origin older
than nats-server 2.14 (pull mode) :func:`inapplicable` names them with the reason, and the runner skips them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bridge.core.modes import Mode
from bridge.testing.processes import BridgeProcess
from bridge.testing.servers import HubCluster, NatsServer
from chaos.model import Excuse, FaultEvent
from chaos.reader import stream_state
from chaos.topology import AGGREGATE, BUCKET, LEASE_TTL, SILENCE_TIMEOUT, ChaosTopology, Source

SERVER_READY_TIMEOUT = 30.0
RECREATE_TIMEOUT = 90.0


@dataclass(slots=True)
class FaultContext:
    """What a fault acts on and where it records: one scenario's topology, timeline, excuses and problems."""

    topo: ChaosTopology
    started: float = field(default_factory=time.monotonic)
    timeline: list[FaultEvent] = field(default_factory=list)
    excuses: list[Excuse] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def record(self, fault: str, action: str, **detail: Any) -> None:
        self.timeline.append(FaultEvent(self.now(), fault, action, detail))


Fault = Callable[[FaultContext, random.Random], Awaitable[None]]


def _long(rng: random.Random) -> float:
    return round(SILENCE_TIMEOUT + rng.uniform(1.0, 3.0), 2)


def _short(rng: random.Random) -> float:
    return round(rng.uniform(0.3, 1.8), 2)


# -- the bridge processes (a fleet of two: see topology) ----------------------------------------------------------


async def _restart(ctx: FaultContext, name: str, slot: int, code: int, down: float) -> None:
    ctx.record(name, "inject", slot=slot, instance=_instance(ctx, slot), exit_code=code, down_seconds=down)
    await asyncio.sleep(down)
    ctx.topo.process(slot).start()
    ctx.record(name, "heal", restarted=True)


def _instance(ctx: FaultContext, slot: int) -> str:
    return ctx.topo.process(slot).log_path.stem.removeprefix("bridge-")


async def bridge_kill(ctx: FaultContext, rng: random.Random) -> None:
    """SIGKILL the active process (the one owning the most sources), restart it."""
    slot = await ctx.topo.active_slot()
    code = await asyncio.to_thread(ctx.topo.process(slot).kill)
    await _restart(ctx, "bridge-kill", slot, code, round(rng.uniform(0.2, 1.5), 2))


async def bridge_pause(ctx: FaultContext, rng: random.Random) -> None:
    """SIGSTOP the active process past the silence timeout (and so past its leases), then SIGCONT."""
    await _pause(ctx, "bridge-pause", await ctx.topo.active_slot(), _long(rng))


async def _pause(ctx: FaultContext, name: str, slot: int, hold: float) -> None:
    ctx.topo.process(slot).pause()
    ctx.record(name, "inject", slot=slot, instance=_instance(ctx, slot), signal="SIGSTOP", seconds=hold)
    await asyncio.sleep(hold)
    ctx.topo.process(slot).resume()
    ctx.record(name, "heal", signal="SIGCONT")


async def _terminate(ctx: FaultContext, name: str, process: BridgeProcess) -> int:
    """SIGTERM, which must drain, release and exit 0 (a problem otherwise)."""
    try:
        code = await asyncio.to_thread(process.stop, 30.0)
    except TimeoutError as exc:
        ctx.problems.append(f"{name} at +{ctx.now():.1f}s: {exc}")
        return -9
    if code != 0:
        ctx.problems.append(f"{name} at +{ctx.now():.1f}s: {process.log_path.name} exited with {code} after SIGTERM")
    return code


async def bridge_term(ctx: FaultContext, rng: random.Random) -> None:
    slot = await ctx.topo.active_slot()
    down = round(rng.uniform(0.2, 1.5), 2)
    code = await _terminate(ctx, "bridge-term", ctx.topo.process(slot))
    await _restart(ctx, "bridge-term", slot, code, down)


async def _owner_slot(ctx: FaultContext, rng: random.Random, name: str) -> tuple[str, int] | None:
    source = rng.choice(ctx.topo.sources).name
    deadline = time.monotonic() + SERVER_READY_TIMEOUT
    while time.monotonic() < deadline:  # right after a fail-over the source may be between owners for a moment
        slot = (await ctx.topo.owners()).get(source)
        if slot is not None:
            return source, slot
        await asyncio.sleep(0.1)
    ctx.problems.append(f"{name} at +{ctx.now():.1f}s: no process owned {source} for {SERVER_READY_TIMEOUT:g}s")
    return None


async def owner_kill(ctx: FaultContext, rng: random.Random) -> None:
    """SIGKILL the owner of a source while the other process runs: it takes over after the lease TTL."""
    found = await _owner_slot(ctx, rng, "owner-kill")
    if found is None:
        return
    source, slot = found
    code = await asyncio.to_thread(ctx.topo.process(slot).kill)
    ctx.record("owner-kill", "note", source=source)
    await _restart(ctx, "owner-kill", slot, code, round(rng.uniform(0.2, 1.5), 2))


async def owner_pause(ctx: FaultContext, rng: random.Random) -> None:
    """SIGSTOP the owner of a source for 1.5-2.5 lease TTLs: the other process takes over; the woken one must act
    on nothing it had buffered (its fence is closed) and stays on as a standby."""
    found = await _owner_slot(ctx, rng, "owner-pause")
    if found is None:
        return
    source, slot = found
    ctx.record("owner-pause", "note", source=source)
    await _pause(ctx, "owner-pause", slot, round(LEASE_TTL * rng.uniform(1.5, 2.5), 2))


async def second_process(ctx: FaultContext, rng: random.Random) -> None:
    """A rolling update: a new process with the same configuration starts, and once its ``/readyz`` says ready (a
    standby is), the active process gets SIGTERM and hands its sources over. The new one takes the old one's slot."""
    slot = await ctx.topo.active_slot()
    old = ctx.topo.process(slot)
    new = ctx.topo.spawn(slot)
    ctx.record("second-process", "inject", slot=slot, new=new.log_path.stem, old=old.log_path.stem)
    deadline = time.monotonic() + SERVER_READY_TIMEOUT
    while not ((await asyncio.to_thread(new.readyz)) or {}).get("ready"):
        if time.monotonic() > deadline:
            ctx.problems.append(f"second-process: {new.log_path.name} not ready within {SERVER_READY_TIMEOUT:g}s")
            break
        await asyncio.sleep(0.1)
    ctx.topo.bridges[slot] = new
    code = await _terminate(ctx, "second-process", old)
    ctx.record("second-process", "heal", old_exit_code=code)


async def kv_cut(ctx: FaultContext, rng: random.Random) -> None:
    """Cut one process off from the lease bucket (its origin and target links stay up) for longer than the TTL: it
    loses its leases and stops acting; the other process takes over; healed, it rejoins as a standby."""
    slot = rng.randrange(len(ctx.topo.bridges))
    proxy = ctx.topo.kv_proxies[slot]
    hold = round(LEASE_TTL + rng.uniform(1.0, 3.0), 2)
    proxy.refuse(True)
    cut = proxy.cut()
    ctx.record("kv-cut", "inject", slot=slot, instance=_instance(ctx, slot), connections_cut=cut, seconds=hold)
    await asyncio.sleep(hold)
    proxy.refuse(False)
    ctx.record("kv-cut", "heal")


# -- the servers -------------------------------------------------------------------------------------------------


def _server(ctx: FaultContext, side: str) -> Any:
    assert ctx.topo.servers is not None
    return ctx.topo.servers.leaf if side == "leaf" else ctx.topo.servers.hub


def server_restart(side: str) -> Fault:
    async def fault(ctx: FaultContext, rng: random.Random) -> None:
        name = f"{side}-restart"
        ctx.record(name, "inject", how="SIGTERM, start on the same store")
        await asyncio.to_thread(_server(ctx, side).restart, SERVER_READY_TIMEOUT)
        ctx.record(name, "heal", ready=True)

    return fault


def server_kill(side: str) -> Fault:
    async def fault(ctx: FaultContext, rng: random.Random) -> None:
        name = f"{side}-kill"
        server = _server(ctx, side)
        down = round(rng.uniform(0.2, 1.5), 2)
        await asyncio.to_thread(server.kill)
        ctx.record(name, "inject", signal="SIGKILL", down_seconds=down)
        await asyncio.sleep(down)
        await asyncio.to_thread(server.start)
        await asyncio.to_thread(server.wait_ready, SERVER_READY_TIMEOUT)
        ctx.record(name, "heal", ready=True)

    return fault


async def storm(ctx: FaultContext, rng: random.Random) -> None:
    """The end of a regional cut: the leaf and the hub SIGKILLed together, started again together, so every link,
    every source's recovery and every lease renewal comes back in the same moment."""
    assert ctx.topo.servers is not None
    leaf, hub = ctx.topo.servers.leaf, ctx.topo.servers.hub
    down = round(rng.uniform(0.5, 2.0), 2)
    await asyncio.gather(asyncio.to_thread(leaf.kill), asyncio.to_thread(hub.kill))
    ctx.record("storm", "inject", signal="SIGKILL", servers=["leaf", "hub"], down_seconds=down)
    await asyncio.sleep(down)
    await asyncio.gather(asyncio.to_thread(hub.start), asyncio.to_thread(leaf.start))
    await asyncio.gather(
        asyncio.to_thread(hub.wait_ready, SERVER_READY_TIMEOUT),
        asyncio.to_thread(leaf.wait_ready, SERVER_READY_TIMEOUT),
    )
    ctx.record("storm", "heal", ready=True)


def server_pause(side: str) -> Fault:
    async def fault(ctx: FaultContext, rng: random.Random) -> None:
        name = f"{side}-pause"
        hold = round(rng.uniform(1.0, SILENCE_TIMEOUT + 3.0), 2)
        _server(ctx, side).pause()
        ctx.record(name, "inject", signal="SIGSTOP", seconds=hold)
        await asyncio.sleep(hold)
        _server(ctx, side).resume()
        ctx.record(name, "heal", signal="SIGCONT")

    return fault


# -- a hub cluster's own (python -m chaos run --cluster) ----------------------------------------------------------


async def _leader(ctx: FaultContext, stream: str, name: str) -> NatsServer | None:
    """The hub node leading ``stream`` now (None, and a problem, if none is named within the deadline)."""
    deadline = time.monotonic() + SERVER_READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            info = await ctx.topo.api("hub", f"STREAM.INFO.{stream}")
        except Exception:  # no reply while the cluster elects: ask again
            info = {}
        leader = (info.get("cluster") or {}).get("leader")
        for node in ctx.topo.hubs:
            if node.name == leader:
                return node
        await asyncio.sleep(0.2)
    ctx.problems.append(f"{name} at +{ctx.now():.1f}s: no leader of {stream} for {SERVER_READY_TIMEOUT:g}s")
    return None


def _cluster_current(ctx: FaultContext) -> None:
    servers = ctx.topo.servers
    assert isinstance(servers, HubCluster)
    servers.wait_current(SERVER_READY_TIMEOUT)


def leader_kill(stream: str, name: str) -> Fault:
    """SIGKILL the hub node leading ``stream`` (the aggregate, or the lease bucket), start it again after a moment:
    the stream elects another leader meanwhile (seconds), publishes and renewals wait for it."""

    async def fault(ctx: FaultContext, rng: random.Random) -> None:
        node = await _leader(ctx, stream, name)
        if node is None:
            return
        down = round(rng.uniform(0.5, 3.0), 2)
        await asyncio.to_thread(node.kill)
        ctx.record(name, "inject", signal="SIGKILL", node=node.name, stream=stream, down_seconds=down)
        await asyncio.sleep(down)
        await asyncio.to_thread(node.start)
        await asyncio.to_thread(node.wait_ready, SERVER_READY_TIMEOUT)
        await asyncio.to_thread(_cluster_current, ctx)
        ctx.record(name, "heal", node=node.name, current=True)

    return fault


async def hub_rolling_restart(ctx: FaultContext, rng: random.Random) -> None:
    """Every hub node in turn, as an upgrade does: SIGTERM, started again on its store, current again before the
    next; every stream's leader moves on the way."""
    for node in ctx.topo.hubs:
        ctx.record("hub-rolling-restart", "inject", how="SIGTERM, start on the same store", node=node.name)
        await asyncio.to_thread(node.restart, SERVER_READY_TIMEOUT)
        await asyncio.to_thread(_cluster_current, ctx)
        ctx.record("hub-rolling-restart", "heal", node=node.name, current=True)


async def _update_aggregate(ctx: FaultContext, max_msgs: int) -> None:
    info = await ctx.topo.api("hub", f"STREAM.INFO.{AGGREGATE}")
    config = dict(info["config"])
    config["max_msgs"] = max_msgs
    reply = await ctx.topo.api("hub", f"STREAM.UPDATE.{AGGREGATE}", config)
    if "error" in reply:
        raise RuntimeError(f"stream update {AGGREGATE}: {reply['error']}")


async def aggregate_full(ctx: FaultContext, rng: random.Random) -> None:
    state = await stream_state(ctx.topo.hub, AGGREGATE)
    room = rng.randint(20, 300)
    hold = round(rng.uniform(3.0, 8.0), 2)
    limit = int(state["messages"]) + room
    await _update_aggregate(ctx, limit)
    ctx.record("aggregate-full", "inject", max_msgs=limit, discard="new", seconds=hold)
    await asyncio.sleep(hold)
    await _update_aggregate(ctx, -1)
    ctx.record("aggregate-full", "heal", max_msgs=-1)


# -- the bridge's connections, through the proxies -------------------------------------------------------------


THIN_LINK = 50_000 // 8  # bytes per second: a 50 kbit/s link


def link_fault(side: str, mode: str, long: bool) -> Fault:
    """``mode``: ``cut`` (connections aborted, new ones refused for the hold), ``stall`` (bytes held, sockets
    open), ``delay`` (every chunk forwarded late) or ``thin`` (the link carries ``THIN_LINK`` bytes a second each
    way, a satellite or cellular one: the workload's traffic queues behind it); ``long`` holds it past the bridge's
    silence timeout, short for under 2 s."""

    async def fault(ctx: FaultContext, rng: random.Random) -> None:
        name = link_fault_name(side, mode, long)
        proxy = ctx.topo.proxy(side)
        hold = _long(rng) if long else _short(rng)
        if mode == "delay":
            delay = round(rng.uniform(0.05, 0.3), 3)
            proxy.set_delay(delay)
            ctx.record(name, "inject", delay_seconds=delay, seconds=hold)
            await asyncio.sleep(hold)
            proxy.set_delay(0.0)
        elif mode == "thin":
            proxy.set_rate(THIN_LINK)
            ctx.record(name, "inject", bytes_per_second=THIN_LINK, seconds=hold)
            await asyncio.sleep(hold)
            proxy.set_rate(0)
        elif mode == "cut":
            proxy.refuse(True)
            cut = proxy.cut()
            ctx.record(name, "inject", connections_cut=cut, refused_seconds=hold)
            await asyncio.sleep(hold)
            proxy.refuse(False)
        else:
            proxy.stall(True)
            ctx.record(name, "inject", seconds=hold)
            await asyncio.sleep(hold)
            proxy.stall(False)
        ctx.record(name, "heal")

    return fault


def link_fault_name(side: str, mode: str, long: bool) -> str:
    return f"{side}-link-{mode}-{'long' if long else 'short'}"


# -- an outside operator ----------------------------------------------------------------------------------------


async def _consumer_info(ctx: FaultContext, source: Source) -> dict[str, Any] | None:
    info: dict[str, Any] = await ctx.topo.api("leaf", f"CONSUMER.INFO.{source.stream}.{source.consumer}")
    return None if "error" in info else info


async def _backlog(ctx: FaultContext, source: Source, want: int) -> tuple[int, int]:
    """Stall the bridge's link to the leaf until ``want`` messages wait undelivered (or 5 s pass); the link stays
    stalled. Returns (last delivered origin seq, origin last seq)."""
    ctx.topo.proxy("leaf").stall(True)
    deadline = time.monotonic() + 5.0
    while True:
        info = await _consumer_info(ctx, source)
        delivered = int(info["delivered"]["stream_seq"]) if info else 0
        last = int((await stream_state(ctx.topo.leaf, source.stream))["last_seq"])
        if last - delivered >= want or time.monotonic() > deadline:
            return delivered, last
        await asyncio.sleep(0.05)


def manual_reset(kind: str) -> Fault:
    """``kind``: ``empty`` (to the ack floor), ``backward``, ``forward`` (into the undelivered backlog, made by
    stalling the bridge's leaf link for a moment) or ``beyond`` (past the stream's end, so messages published
    afterwards are skipped too). A forward reset's skipped range is recorded as an excuse: the operator asked for
    those messages not to be replicated."""

    async def fault(ctx: FaultContext, rng: random.Random) -> None:
        name = f"reset-{kind}"
        source = rng.choice(ctx.topo.sources)
        info = await _consumer_info(ctx, source)
        if info is None:
            ctx.record(name, "note", source=source.name, skipped="consumer missing")
            return
        floor = int(info["ack_floor"]["stream_seq"])
        last = int((await stream_state(ctx.topo.leaf, source.stream))["last_seq"])
        detail: dict[str, Any] = {"source": source.name, "ack_floor": floor, "last_seq": last}
        body: dict[str, Any] | None = None
        stalled = False
        try:
            if kind == "backward":
                body = {"seq": max(1, floor - rng.randint(50, 2000))}
            elif kind == "forward":
                stalled = True
                delivered, last = await _backlog(ctx, source, rng.randint(20, 400))
                body = {"seq": max(floor + 2, delivered + max(2, (last - delivered) // 2))}
                detail.update(delivered=delivered, last_seq=last, leaf_link_stalled=True)
            elif kind == "beyond":
                # not too far: only a copy published past the skip carries it (Bridge-Skipped), so the audit sees a
                # skip that the rest of the run never passes as nothing at all; on a loaded machine a smoke run
                # published 720 more after the reset, fewer than the 807 asked to be skipped
                body = {"seq": last + rng.randint(20, 200)}
            detail["body"] = body
            if body is not None and kind in ("forward", "beyond") and body["seq"] - 1 >= floor + 1:
                # recorded before sending: a reset whose reply is lost may still have happened
                ctx.excuses.append(Excuse(source.name, floor + 1, body["seq"] - 1, "forward-reset"))
                detail["may_skip"] = [floor + 1, body["seq"] - 1]
            subject = f"CONSUMER.RESET.{source.stream}.{source.consumer}"
            try:
                reply = await ctx.topo.api("leaf", subject, body, timeout=5.0)
                detail["reset_seq"] = reply.get("reset_seq")
                if "error" in reply:
                    detail["error"] = reply["error"].get("description")
            except Exception as exc:  # no reply: a missing consumer or a leader change; it may have happened
                detail["error"] = repr(exc)
        finally:
            if stalled:
                ctx.topo.proxy("leaf").stall(False)
        ctx.record(name, "inject", **detail)

    return fault


async def consumer_delete(ctx: FaultContext, rng: random.Random) -> None:
    """Delete the bridge's managed consumer; the bridge must notice and create it again. On an Interest origin
    the server drops every message no consumer is interested in meanwhile: those are excused."""
    source = rng.choice(ctx.topo.sources)
    info = await _consumer_info(ctx, source)
    if info is None:
        ctx.record("consumer-delete", "note", source=source.name, skipped="consumer missing")
        return
    floor = int(info["ack_floor"]["stream_seq"])
    reply = await ctx.topo.api("leaf", f"CONSUMER.DELETE.{source.stream}.{source.consumer}")
    ctx.record("consumer-delete", "inject", source=source.name, ack_floor=floor, reply=json.dumps(reply)[:200])
    deadline = time.monotonic() + RECREATE_TIMEOUT
    while await _consumer_info(ctx, source) is None:
        if time.monotonic() > deadline:
            ctx.problems.append(f"consumer-delete: {source.consumer} not re-created within {RECREATE_TIMEOUT:g}s")
            return
        await asyncio.sleep(0.05)
    first = int((await stream_state(ctx.topo.leaf, source.stream))["first_seq"])
    if source.retention == "interest" and first - 1 >= floor + 1:
        ctx.excuses.append(Excuse(source.name, floor + 1, first - 1, "consumer-deleted"))
    ctx.record("consumer-delete", "heal", source=source.name, recreated=True, origin_first_seq=first, ack_floor=floor)


def _registry() -> dict[str, Fault]:
    faults: dict[str, Fault] = {
        "bridge-kill": bridge_kill,
        "bridge-pause": bridge_pause,
        "bridge-term": bridge_term,
        "leaf-restart": server_restart("leaf"),
        "leaf-kill": server_kill("leaf"),
        "leaf-pause": server_pause("leaf"),
        "hub-restart": server_restart("hub"),
        "hub-kill": server_kill("hub"),
        "storm": storm,
        "aggregate-full": aggregate_full,
    }
    for side in ("leaf", "hub"):
        for mode in ("cut", "stall", "delay", "thin"):
            for long in (False, True):
                faults[link_fault_name(side, mode, long)] = link_fault(side, mode, long)
    for kind in ("empty", "backward", "forward", "beyond"):
        faults[f"reset-{kind}"] = manual_reset(kind)
    faults["consumer-delete"] = consumer_delete
    faults["owner-kill"] = owner_kill
    faults["owner-pause"] = owner_pause
    faults["second-process"] = second_process
    faults["kv-cut"] = kv_cut
    faults["hub-leader-kill"] = leader_kill(AGGREGATE, "hub-leader-kill")
    faults["hub-rolling-restart"] = hub_rolling_restart
    faults["kv-leader-kill"] = leader_kill(f"KV_{BUCKET}", "kv-leader-kill")
    return faults


FAULTS: dict[str, Fault] = _registry()

# Fault kinds that only exist where the origin has flow control, and why. An outside CONSUMER.RESET is the API of
# nats-server 2.14 (it came with ack_policy flow_control); an older origin does not answer it at all (2.10.26 and
# 2.12.8 let the request time out), so the fault would inject nothing and a pass would prove nothing.
_NO_RESET_API = "CONSUMER.RESET exists from nats-server 2.14 on; a pull-mode origin (older) has none to inject"
FLOW_CONTROL_ONLY: dict[str, str] = {name: _NO_RESET_API for name in FAULTS if name.startswith("reset-")}
# Fault kinds of a hub cluster (--cluster): a single hub node has no leader to move.
_NO_CLUSTER = "a hub cluster's fault: run with --cluster (three hub nodes, the streams R3)"
CLUSTER_ONLY: dict[str, str] = {
    name: _NO_CLUSTER for name in ("hub-leader-kill", "hub-rolling-restart", "kv-leader-kill")
}


def inapplicable(mode: str, *, cluster: bool = False) -> dict[str, str]:
    """The fault kinds that cannot apply when the bridge runs in ``mode`` (``"pull"`` or ``"flow_control"``) on a
    single hub or a cluster, each with the reason, for the run to skip and its report to name."""
    skipped = dict(FLOW_CONTROL_ONLY) if mode == Mode.PULL else {}
    if not cluster:
        skipped.update(CLUSTER_ONLY)
    return skipped
