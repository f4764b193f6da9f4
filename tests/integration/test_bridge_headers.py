"""Origin headers the server would act on arrive renamed (``Bridge-Orig-<name>``) and do nothing in the aggregate.

Origin messages carry ``Nats-Msg-Id``, ``Nats-Expected-Last-Sequence`` and ``Nats-Expected-Stream`` (correct for
the origin, so the origin accepts them; wrong for the aggregate, so the aggregate would reject them), ``Nats-Rollup``
(the origin allows rollups; so does the aggregate, where a rollup would purge the sentinel messages published there
beforehand), a lower-case ``nats-`` header, a forged ``Bridge-Seq`` and an ordinary user header.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import (
    aggregate_count,
    assert_exact,
    connect,
    create_aggregate,
    create_stream,
    read_stream,
    seqs_by_source,
)
from bridge.testing.polling import wait_for_value
from bridge.testing.processes import BridgeFactory
from bridge.testing.servers import Topology

N = 300
ROLLUP_ALL = 0  # index of the message with Nats-Rollup: all (first in the origin: nothing to purge there)
ROLLUP_SUB = 150  # index of the message with Nats-Rollup: sub, alone on its origin subject


def subject_of(i: int) -> str:
    return "orders.rollup" if i == ROLLUP_SUB else f"orders.{i % 5}"


def origin_headers(i: int) -> dict[str, str]:
    headers = {
        "X-User": f"user-value-{i}",
        "Nats-Msg-Id": f"origin-id-{i}",
        "Nats-Expected-Last-Sequence": str(i),  # the origin's last sequence before this publish
        "Nats-Expected-Stream": ORIGIN,
        "nats-lower": f"lower-{i}",
    }
    if i == ROLLUP_ALL:
        headers["Nats-Rollup"] = "all"
    if i == ROLLUP_SUB:
        headers["Nats-Rollup"] = "sub"
    if i % 50 == 7:
        headers["Bridge-Seq"] = "999999"  # a forged provenance header must not corrupt recovery
    return headers


@pytest.mark.anyio
async def test_reserved_origin_headers_are_renamed_and_inert(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one", max_ack_pending=100)
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="limits", allow_rollup_hdrs=True)
        await create_aggregate(hub_nc, allow_rollup_hdrs=True)
        hub_js = hub_nc.jetstream(timeout=5)
        # sentinels a forwarded rollup would purge: one on the rolled-up subject, one elsewhere (for "all")
        await hub_js.publish("edge.one.orders.rollup", b"sentinel-sub")
        await hub_js.publish("edge.sentinel", b"sentinel-all")

        leaf_js = leaf_nc.jetstream(timeout=5)
        for i in range(N):
            ack = await leaf_js.publish(subject_of(i), f"body-{i}".encode(), headers=origin_headers(i))
            assert ack.seq == i + 1 and not ack.duplicate

        bridge = bridge_procs(config)
        await wait_for_value(
            lambda: aggregate_count(hub_nc, "edge.one.>"), N + 1, timeout=30, what="copies plus the sub sentinel"
        )
        assert await bridge.astop(15) == 0
        assert bridge.count("publish.blocked") == 0, "the aggregate rejected a copy"

        messages = await read_stream(hub_nc, AGGREGATE)
        bodies = [m.data for m in messages if m.source is None]
        assert bodies == [b"sentinel-sub", b"sentinel-all"], "the aggregate was purged by a forwarded rollup"
        assert len(messages) == N + 2
        copies = [m for m in messages if m.source is not None]
        assert_exact(seqs_by_source(copies)["edge1"], range(1, N + 1), "edge1 copies")
        for copy in copies:
            seq = copy.origin_seq
            assert seq is not None
            i = seq - 1
            h = copy.headers
            where = f"copy of origin seq {seq}"
            assert copy.data == f"body-{i}".encode(), where
            assert h.get("X-User") == f"user-value-{i}", where
            assert h.get("Bridge-Orig-Nats-Msg-Id") == f"origin-id-{i}", where
            assert h.get("Bridge-Orig-Nats-Expected-Last-Sequence") == str(i), where
            assert h.get("Bridge-Orig-Nats-Expected-Stream") == ORIGIN, where
            assert h.get("Bridge-Orig-nats-lower") == f"lower-{i}", where
            assert h.get("Nats-Msg-Id") == f"edge1:{ORIGIN}:{seq}", where
            assert h.get("Bridge-Seq") == str(seq), where
            for name in ("Nats-Expected-Last-Sequence", "Nats-Expected-Stream", "Nats-Rollup", "nats-lower"):
                assert name not in h, f"{where}: {name} passed through"
            if i in (ROLLUP_ALL, ROLLUP_SUB):
                assert h.get("Bridge-Orig-Nats-Rollup") == ("all" if i == ROLLUP_ALL else "sub"), where
            else:
                assert "Bridge-Orig-Nats-Rollup" not in h, where
            if i % 50 == 7:
                assert h.get("Bridge-Orig-Bridge-Seq") == "999999", where
        assert copies[ROLLUP_SUB].subject == "edge.one.orders.rollup"
