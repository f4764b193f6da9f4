"""Without the wire parser (a nats-py whose internals ``bridge.io.wire`` does not recognise), the bridge replicates
through nats-py's ordinary subscription callbacks, with the same result: every message once, in order, headers
renamed by the same policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.io import wire
from bridge.io.origin import OriginClient
from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.inprocess import running_bridge
from bridge.testing.jetstream import (
    Publisher,
    assert_exact,
    connect,
    create_aggregate,
    create_stream,
    read_stream,
    seqs_by_source,
    stream_messages,
)
from bridge.testing.polling import wait_for_value
from bridge.testing.servers import Topology

N = 3000


@pytest.mark.anyio
async def test_replicates_through_nats_py_callbacks(
    topology: Topology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wire, "install", lambda nc: None)
    callbacks = 0
    original = OriginClient._on_msg

    async def counted(self: OriginClient, msg: object) -> None:
        nonlocal callbacks
        callbacks += 1
        await original(self, msg)  # type: ignore[arg-type]

    monkeypatch.setattr(OriginClient, "_on_msg", counted)
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one", max_ack_pending=300)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
        await Publisher(leaf_nc, N, headers=lambda i: {"Nats-Msg-Id": f"app-{i}", "X-App": str(i)}).run()
        async with running_bridge(config, tmp_path / "bridge.log"):
            await wait_for_value(
                lambda: stream_messages(leaf_nc, ORIGIN), 0, timeout=60, what="origin messages", interval=0.1
            )
        copies = await read_stream(hub_nc, AGGREGATE)
    assert callbacks >= N, "deliveries went through nats-py's callback"
    assert_exact(seqs_by_source(copies)["edge1"], range(1, N + 1), "edge1 copies")
    for copy in copies:
        index = int(copy.headers["Test-Index"])
        assert copy.headers["X-App"] == str(index)
        assert copy.headers["Bridge-Orig-Nats-Msg-Id"] == f"app-{index}"
        assert copy.headers["Nats-Msg-Id"] == f"edge1:{ORIGIN}:{copy.origin_seq}"
