"""One scenario's world: a leaf holding the origin streams, a hub holding the aggregate and the lease bucket, the
leaf linked to the hub, fault proxies in front of both, and a fleet of two bridge processes with one configuration
(an owner and a standby, or one owner of each source) that reach each server only through the proxies.

::

    publishers ──► leaf (origin WQ, INT) ◄── leaf proxy ◄──┬── bridge b0 ── kv proxy 0 ──┐
                    │ leaf link                             └── bridge b1 ── kv proxy 1 ──┤
    checker ─────► hub  (aggregate AGG, KV nats-bridge) ◄── hub proxy ◄── (both) ◄────────┘

Each process reaches the lease bucket through a KV proxy of its own (``coordination.servers``, set per process
through the environment, as a host would), so one process can be cut off from the bucket while its links to the
origin and the target stay up. The chaos process itself talks to both servers directly (publishing, resetting,
reading), never through a proxy, so a link fault hits only the bridges.

With ``cluster`` (``python -m chaos run --cluster``) the hub is three nodes routed into one cluster
(:func:`~bridge.testing.servers.start_hub_cluster`), the aggregate and the lease bucket R3, the leaf linked to every
node: the proxies stand in front of the first node, and the bridges (and the chaos process) are also given the other
nodes' addresses directly, as a client of a cluster is, so a fault of the first node's link or of the node itself
moves them to another node; the cluster's own fault kinds (``hub-leader-kill``, ``hub-rolling-restart``,
``kv-leader-kill``) need it.

The leaf (the origins) may run another ``nats-server`` than the hub (``--origin-server``): on one older than 2.14
the bridge's sources run in pull mode (``mode`` is left at its default, ``auto``, which picks it), and the config
gives every source a short ``ack_wait`` so that redeliveries then come within a scenario's deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from bridge.testing.processes import BridgeProcess
from bridge.testing.servers import (
    PULL_TEST_ACK_WAIT,
    HubCluster,
    NatsServer,
    Topology,
    free_ports,
    start_hub_cluster,
    start_topology,
)
from chaos.proxy import FaultProxy

AGGREGATE = "AGG"
BUCKET = "nats-bridge"  # the lease bucket (the bridge's default coordination.bucket)
AGGREGATE_PREFIX = "chaos"
SILENCE_TIMEOUT = 5.0  # the bridge's default; faults called "long" outlast it
# Leases: short enough that a fail-over fits a scenario, long enough for renewals through delayed links
LEASE_TTL = 4.0
PROCESSES = 2
# A full run stores millions of messages (up to 64 KiB) per scenario; a full store refuses writes and the bridge
# (rightly) blocks on them, which would make a scenario fail for want of disk rather than for the bridge.
MAX_FILE_STORE = "64GB"


@dataclass(frozen=True, slots=True)
class Source:
    """One replicated origin stream on the leaf and the bridge source that carries it."""

    name: str
    stream: str
    retention: str  # "workqueue" | "interest"

    @property
    def subject(self) -> str:
        """The origin stream's subjects are ``<name>.>``; publishers use ``<name>.<k>``."""
        return self.name

    @property
    def consumer(self) -> str:
        return f"nats-bridge-{self.name}"

    @property
    def aggregate_prefix(self) -> str:
        return f"{AGGREGATE_PREFIX}.{self.name}"


SOURCES = (Source("wq", "WQ", "workqueue"), Source("interest", "INT", "interest"))


def bridge_config(sources: tuple[Source, ...], leaf_url: str, hub_url: str, *, more_hubs: tuple[str, ...] = ()) -> str:
    """The bridge's TOML: defaults everywhere except where a test topology needs a name, and a short ``ack_wait``;
    ``more_hubs``: a cluster's other nodes (then the lease bucket is R3)."""
    hubs = ", ".join(f'"{url}"' for url in (hub_url, *more_hubs))
    lines = [
        "# written by the chaos suite",
        "[log]",
        'level = "info"',
        'format = "json"',
        "",
        "[http]",
        'listen = "127.0.0.1:0"  # scenarios run side by side: any free port',
        "",
        "[coordination]",
        f"lease_ttl = {LEASE_TTL}",
        f"replicas = {3 if more_hubs else 1}",
        "# servers: each process's own KV proxy, from NATS_BRIDGE_COORDINATION__SERVERS",
        "",
        "[target]",
        f"servers = [{hubs}]",
        f'stream = "{AGGREGATE}"',
    ]
    for source in sources:
        lines += [
            "",
            "[[sources]]",
            f'name = "{source.name}"',
            f'servers = ["{leaf_url}"]',
            f'stream = "{source.stream}"',
            f'subject_prefix = "{source.aggregate_prefix}"',
            "# mode: the default, auto: flow control on an origin of nats-server 2.14 or later, pull before",
            "# pull mode only (auto decides): the default, 30 s, would put the redeliveries that follow a crash or a",
            "# lost ack beyond a scenario's deadlines",
            f"ack_wait = {PULL_TEST_ACK_WAIT}",
        ]
    return "\n".join(lines) + "\n"


async def _connect(url: str | list[str], name: str) -> Client:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:  # reconnect noise during server faults is expected
        errors.append(str(exc))

    return await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
        connect_timeout=2,
        allow_reconnect=True,
        error_cb=on_error,
    )


class ChaosTopology:
    """Starts, exposes and stops everything one scenario runs on; every process is stopped by its PID.

    ``binary`` is the hub's ``nats-server`` (default :func:`~bridge.testing.servers.find_nats_server`),
    ``origin_binary`` the leaf's (default: the hub's).
    """

    def __init__(
        self,
        workdir: Path,
        sources: tuple[Source, ...] = SOURCES,
        binary: str | None = None,
        origin_binary: str | None = None,
        cluster: bool = False,
    ) -> None:
        self.workdir = workdir
        self.sources = sources
        self.binary = binary
        self.origin_binary = origin_binary
        self.cluster = cluster
        self.servers: Topology | None = None
        self.leaf_proxy: FaultProxy | None = None
        self.hub_proxy: FaultProxy | None = None
        self.kv_proxies: list[FaultProxy] = []
        self.bridges: list[BridgeProcess] = []  # one per slot; a rolling update replaces a slot's process
        self.config: Path = workdir / "bridge.toml"
        self._instances = 0
        self.leaf_nc: Client | None = None
        self.hub_nc: Client | None = None

    # -- life cycle ---------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        start = start_hub_cluster if self.cluster else start_topology
        self.servers = await asyncio.to_thread(
            start,
            self.workdir / "servers",
            binary=self.binary,
            leaf_binary=self.origin_binary,
            max_file_store=MAX_FILE_STORE,
        )
        hub, leaf = self.servers.hub, self.servers.leaf
        # ports claimed like the servers': a proxy binding port 0 could take a killed server's port meanwhile
        leaf_port, hub_port, *kv_ports = free_ports(2 + PROCESSES)
        self.leaf_proxy = FaultProxy("127.0.0.1", leaf.port, name="bridge-leaf", listen_port=leaf_port)
        self.hub_proxy = FaultProxy("127.0.0.1", hub.port, name="bridge-hub", listen_port=hub_port)
        self.kv_proxies = [
            FaultProxy("127.0.0.1", hub.port, name=f"bridge-kv-{i}", listen_port=port)
            for i, port in enumerate(kv_ports)
        ]
        for proxy in (self.leaf_proxy, self.hub_proxy, *self.kv_proxies):
            await _start_proxy(proxy)
        self.leaf_nc = await _connect(leaf.url, "chaos leaf")
        self.hub_nc = await _connect([node.url for node in self.hubs], "chaos hub")
        await self._create_streams()
        more = tuple(node.url for node in self.hubs[1:])
        self.config.write_text(bridge_config(self.sources, self.leaf_proxy.url, self.hub_proxy.url, more_hubs=more))
        self.bridges = [self.spawn(slot) for slot in range(PROCESSES)]

    def spawn(self, slot: int) -> BridgeProcess:
        """A new process (a new instance id) for ``slot``, on the slot's KV proxy; started."""
        instance = f"b{self._instances}"
        self._instances += 1
        servers = json.dumps([self.kv_proxies[slot].url, *(node.url for node in self.hubs[1:])])
        env = {
            "NATS_BRIDGE_COORDINATION__INSTANCE_ID": instance,
            "NATS_BRIDGE_COORDINATION__SERVERS": servers,
        }
        return BridgeProcess(self.config, self.workdir / f"bridge-{instance}.log", env).start()

    async def _create_streams(self) -> None:
        leaf_js = self.leaf.jetstream()
        for source in self.sources:
            retention = RetentionPolicy.WORK_QUEUE if source.retention == "workqueue" else RetentionPolicy.INTEREST
            await leaf_js.add_stream(
                StreamConfig(
                    name=source.stream,
                    subjects=[f"{source.subject}.>"],
                    retention=retention,
                    storage=StorageType.FILE,
                    allow_direct=True,
                )
            )
        await self.hub.jetstream().add_stream(
            StreamConfig(
                name=AGGREGATE,
                subjects=[f"{AGGREGATE_PREFIX}.>"],
                storage=StorageType.FILE,
                discard=DiscardPolicy.NEW,
                allow_direct=True,
                allow_batched=True,  # as setup creates it: order kept across leader moves (--cluster)
                num_replicas=len(self.hubs),
            )
        )

    async def close(self) -> None:
        """Stop the bridges (SIGKILL if still running), the proxies, the connections and the servers."""
        for bridge in self.bridges:
            await asyncio.to_thread(bridge.cleanup)
        for nc in (self.leaf_nc, self.hub_nc):
            if nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(nc.close(), 5)
        for proxy in (self.leaf_proxy, self.hub_proxy, *self.kv_proxies):
            if proxy is not None:
                await proxy.close()
        if self.servers is not None:
            await asyncio.to_thread(self.servers.stop)

    # -- handles ------------------------------------------------------------------------------------------

    @property
    def hubs(self) -> tuple[NatsServer, ...]:
        """The hub's nodes: one, or a cluster's three (the proxies stand in front of the first)."""
        servers = self.servers
        assert servers is not None, "topology not started"
        return servers.hubs if isinstance(servers, HubCluster) else (servers.hub,)

    @property
    def leaf(self) -> Client:
        assert self.leaf_nc is not None, "topology not started"
        return self.leaf_nc

    @property
    def hub(self) -> Client:
        assert self.hub_nc is not None, "topology not started"
        return self.hub_nc

    def proxy(self, side: str) -> FaultProxy:
        proxy = self.leaf_proxy if side == "leaf" else self.hub_proxy
        assert proxy is not None, "topology not started"
        return proxy

    def process(self, slot: int) -> BridgeProcess:
        assert self.bridges, "topology not started"
        return self.bridges[slot]

    async def owners(self) -> dict[str, int]:
        """Which slot's process owns each source now, as each running process's ``/readyz`` says."""
        out: dict[str, int] = {}
        for slot, bridge in enumerate(self.bridges):
            for source in await asyncio.to_thread(bridge.owned):
                out[source] = slot
        return out

    async def active_slot(self) -> int:
        """The slot whose process owns the most sources now (0 when nobody answers): "the bridge" of a fault."""
        owned = list((await self.owners()).values())
        return max(range(len(self.bridges)), key=lambda slot: (owned.count(slot), -slot))

    def logs_tail(self, lines: int = 30) -> str:
        return "\n".join(f"--- {b.log_path.name}\n{b.tail(lines)}" for b in self.bridges)

    async def api(self, side: str, subject: str, body: dict[str, Any] | None = None, timeout: float = 2.0) -> Any:
        """A JetStream API request sent directly to one server (``$JS.API.<subject>``); the decoded reply."""
        nc = self.leaf if side == "leaf" else self.hub
        payload = json.dumps(body).encode() if body is not None else b""
        reply = await nc.request(f"$JS.API.{subject}", payload, timeout=timeout)
        return json.loads(reply.data)


BIND_ATTEMPTS = 5


async def _start_proxy(proxy: FaultProxy) -> None:
    """Start ``proxy`` on its claimed port, or on another claimed one when a process beside this one (the other CI
    lane's servers) took it between the claim and the bind (seen once: errno 98 in the chaos smoke)."""
    for attempt in range(BIND_ATTEMPTS):
        try:
            await proxy.start()
            return
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or attempt == BIND_ATTEMPTS - 1:
                raise
            proxy.port = free_ports(1)[0]
