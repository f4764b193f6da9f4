"""Replication with the v2 ``$JS.ACK``/``$JS.FC`` subject layout (server feature flag ``js_ack_fc_v2``).

The v2 layout adds the JetStream domain and an account hash (11 or 12 tokens) so that flow-control answers cannot
reach a same-named consumer on another leaf. The bridge must parse it from real deliveries, and its flow-control
answers to v2 ``$JS.FC`` subjects must ack the origin (a WorkQueue that empties proves they did).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
from nats.js.api import RetentionPolicy, StreamConfig

from bridge.config import load_config
from bridge.core import inbound
from bridge.io.origin import OriginClient
from bridge.runtime.app import Bridge
from bridge.testing.fakes import filtering_subscribe
from bridge.testing.servers import start_topology

pytestmark = pytest.mark.anyio

COUNT = 3000


async def test_v2_ack_and_flow_control_subjects(
    nats_server_bin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, set[Any]] = {"tokens": set(), "domains": set(), "fc": set()}

    def spy(messages: Sequence[inbound.Inbound]) -> Sequence[inbound.Inbound]:
        for message in messages:
            if isinstance(message, inbound.Data):
                seen["tokens"].add(len(message.reply.split(".")))
                seen["domains"].add(message.ack.domain)
            elif isinstance(message, inbound.FlowControlRequest):
                seen["fc"].add(len(message.reply.split(".")))
        return messages

    # what each read brought, classified, on its way to the source's engine
    monkeypatch.setattr(OriginClient, "subscribe", filtering_subscribe(OriginClient.subscribe, spy))
    with start_topology(
        tmp_path / "servers", binary=nats_server_bin, leaf_extra="feature_flags { js_ack_fc_v2: true }"
    ) as topology:
        leaf = await nats.connect(topology.leaf.url)
        hub = await nats.connect(topology.hub.url)
        ljs, hjs = leaf.jetstream(), hub.jetstream()
        try:
            await ljs.add_stream(StreamConfig(name="ORIGIN", subjects=["o.>"], retention=RetentionPolicy.WORK_QUEUE))
            await hjs.add_stream(StreamConfig(name="AGG", subjects=["agg.>"], allow_direct=True))
            for i in range(COUNT):
                await ljs.publish(f"o.{i % 5}", b"m")
            config = tmp_path / "bridge.toml"
            config.write_text(
                f"""
[http]
listen = "127.0.0.1:0"  # a port of its own: other test runs may be at work beside this one
[target]
servers = ["{topology.hub.url}"]
stream = "AGG"
[[sources]]
name = "v2"
servers = ["{topology.leaf.url}"]
stream = "ORIGIN"
subject_prefix = "agg"
max_ack_pending = 500
"""
            )
            bridge = Bridge(load_config(config, environ={}))

            async def scenario(b: Bridge) -> None:
                try:
                    with anyio.fail_after(30):
                        while (await ljs.stream_info("ORIGIN")).state.messages > 0:
                            await anyio.sleep(0.05)
                finally:
                    b.stop.set()

            await bridge.run(handle_signals=False, on_started=scenario)
            assert (await hjs.stream_info("AGG")).state.messages == COUNT
        finally:
            await leaf.close()
            await hub.close()
    assert seen["tokens"] <= {11, 12} and seen["tokens"], seen
    assert seen["domains"] == {"leaf"}
    assert seen["fc"] and seen["fc"] <= {7}, seen  # $JS.FC.<domain>.<hash>.<stream>.<consumer>.<id>
