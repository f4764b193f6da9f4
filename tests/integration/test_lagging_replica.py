"""A Direct Get answered by a responder that lags, on a real server: what restart recovery, the KV reads and the Spark
reader get from it.

Any replica answers a Direct Get, not only the stream's leader; a follower keeps answering when it falls behind after
it subscribed (at 90 % caught up), and a mirror with ``mirror_direct`` answers for its origin however far behind it
is. The responder here is such a mirror, held behind by its filter: it takes the copies of subjects ``*.x`` and the
newer ones are ``*.y``, so it holds the aggregate's messages up to the last ``*.x`` and none after (a prefix of the
aggregate, as a lagging follower's store is). On one server its Direct Get subscription and the aggregate's own
share a queue group, so each request goes to one of them at random. A reply from the mirror ends before the
aggregate's newest messages; without the leader check of
``bridge.io.directget`` recovery would take the source's newest copies for missing and publish them again (stored
twice once the duplicate window has passed), and the Spark reader would drop rows for good.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import structlog
from nats.aio.client import Client

from bridge.core import headers as hdr
from bridge.core.recovery import Copy, recover
from bridge.errors import ApiUnavailable, TargetUnavailable
from bridge.io import directget, permissions
from bridge.io.aggregate import read_source_tail
from bridge.io.directget import read_batches
from bridge.io.jsapi import JsApi
from bridge.io.registry import RegistryBucket
from bridge.testing.jetstream import connect, create_aggregate, create_stream, js_request
from bridge.testing.polling import wait_until
from bridge.testing.security import conf_str, permissions_block
from bridge.testing.servers import ServerFactory

pytestmark = pytest.mark.anyio

MIRROR = "AGG_READS"
HELD = 60  # copies the mirror holds
NEWER = 40  # copies stored after it was held back
READS = 24  # each reaches the mirror with probability 1/2: a lag unseen by all of them is 2**-24


async def publish_copies(nc: Client, source: str, first: int, last: int, prefix: str | None, kind: str) -> None:
    """Copies of origin sequences ``first..last`` as the bridge stores them (provenance headers, one each), of
    origin subject ``orders.<kind>`` (``edge.orders.<kind>`` without a prefix: such copies keep their subject)."""
    js = nc.jetstream()
    subject = f"orders.{kind}" if prefix else f"edge.orders.{kind}"
    for seq in range(first, last + 1):
        block = hdr.build_header_block(
            None, source=source, stream="ORDERS", stream_seq=seq, prev_seq=seq - 1, subject=subject, timestamp_ns=0
        )
        headers = hdr.parse_header_block(block)
        await js.publish(hdr.aggregate_subject(subject, prefix), f"{seq}".encode(), headers=headers, stream="AGG")


@pytest.fixture
async def lagging(servers: ServerFactory) -> AsyncIterator[Client]:
    """The aggregate with ``HELD`` copies of edge1 (prefix ``edge.one``) and of edge2 (no prefix), a mirror
    answering its Direct Gets that holds those, then ``NEWER`` more copies of each that only the aggregate holds;
    returned once a Direct Get was seen answered by the mirror."""
    server = servers("hub", "")
    async with connect(server.url) as nc:
        await create_aggregate(nc)
        for source, prefix in (("edge1", "edge.one"), ("edge2", None)):
            await publish_copies(nc, source, 1, HELD, prefix, "x")
        held = [{"src": s, "dest": s} for s in ("edge.one.orders.x", "edge.orders.x")]
        await create_stream(nc, MIRROR, [], mirror={"name": "AGG", "subject_transforms": held}, mirror_direct=True)
        await wait_until(
            lambda: holds(nc, MIRROR, 2 * HELD),
            timeout=20,
            what=f"the mirror holding {2 * HELD} copies (then it answers Direct Gets)",
        )
        for source, prefix in (("edge1", "edge.one"), ("edge2", None)):
            await publish_copies(nc, source, HELD + 1, HELD + NEWER, prefix, "y")
        newest = 2 * (HELD + NEWER)
        await wait_until(lambda: answered_short(nc, newest), timeout=20, what="a Direct Get answered by the mirror")
        yield nc


async def answered_short(nc: Client, seq: int) -> bool:
    """One raw Direct Get of ``seq``: True when it came back 404 (the mirror answered: it does not hold it)."""
    msg = await nc.request("$JS.API.DIRECT.GET.AGG", json.dumps({"seq": seq}).encode(), timeout=5)
    status = (msg.headers or {}).get("Status")
    assert status in (None, "404"), msg.headers
    return status == "404"


@pytest.mark.parametrize(("source", "subject_filter"), [("edge1", "edge.one.>"), ("edge2", ">")])
async def test_recovery_reads_every_newest_copy_whichever_responder_answers(
    lagging: Client, source: str, subject_filter: str
) -> None:
    """With a prefix (the server filters) and without (every message read and its Bridge-Source compared): every
    read finds all ``HELD + NEWER`` copies, so recovery's watermark is the newest copy (nothing published again,
    nothing acked that is not stored), from the ack floor 0 and from one in the held part."""
    api = JsApi(lagging, "$JS.API")
    for n in range(READS):
        floor = 0 if n % 2 == 0 else HELD // 2
        copies, complete = await read_source_tail(lagging, api, "AGG", source, subject_filter, floor, 10_000, 5.0)
        assert complete
        assert [c.stream_seq for c in copies] == list(range(floor + 1, HELD + NEWER + 1)), f"read {n}"
        assert recover(copies, floor) == recover([Copy(s, s - 1) for s in range(floor + 1, HELD + NEWER + 1)], floor)
        assert recover(copies, floor).watermark == HELD + NEWER


@pytest.mark.parametrize("retries", [directget.BEHIND_RETRIES, 0])
async def test_a_range_read_is_whole_whichever_responder_answers(
    lagging: Client, retries: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the Spark reader and the KV reads use: a range read ends with the aggregate's last message every time,
    batch after batch (small batches, so one read is many requests, each to either responder); with no retries
    left, the rest comes from the leader one message at a time."""
    monkeypatch.setattr(directget, "BEHIND_RETRIES", retries)
    newest = 2 * (HELD + NEWER)
    for _ in range(READS // 4):
        seqs: list[int] = []
        async for messages in read_batches(
            lagging, "$JS.API", "AGG", 1, newest, error_type=TargetUnavailable, batch=16, verify=True
        ):
            seqs.extend(m.seq for m in messages)
        assert seqs == list(range(1, newest + 1))


async def test_without_the_check_a_read_can_end_short(lagging: Client) -> None:
    """The condition the check is for, seen: unverified reads of the same range end early (here, not in the
    product: every read of the aggregate the product makes is verified)."""

    async def short_read() -> bool:
        seqs: list[Any] = []
        async for messages in read_batches(
            lagging, "$JS.API", "AGG", 1, 2 * (HELD + NEWER), error_type=TargetUnavailable
        ):
            seqs.extend(m.seq for m in messages)
        return len(seqs) < 2 * (HELD + NEWER)

    await wait_until(short_read, timeout=20, what="an unverified read answered short by the mirror")


async def test_the_registry_is_never_taken_from_a_replica_behind_its_leader(servers: ServerFactory) -> None:
    """The source registry's watcher reads the bucket when its leader's ``STREAM.INFO`` moved: a reply from a
    replica holding two of the three sources is refused (its end of batch names its last sequence), never handed
    over as the registry; the leader's own answer is read whole."""
    server = servers("hub", "")
    async with connect(server.url) as nc:
        registry = RegistryBucket(nc, JsApi(nc, "$JS.API"), "nats-bridge")
        await registry.ensure(1, 5.0)
        for name in ("edge1", "edge2"):
            await registry.put({"name": name, "servers": "nats://127.0.0.1:1"}, 0, 5.0)
        stream = f"KV_{registry.bucket}"
        held = [
            {"src": f"$KV.{registry.bucket}.source.{n}", "dest": f"$KV.{registry.bucket}.source.{n}"}
            for n in ("edge1", "edge2")
        ]
        await create_stream(
            nc, "REGISTRY_READS", [], mirror={"name": stream, "subject_transforms": held}, mirror_direct=True
        )
        await wait_until(lambda: holds(nc, "REGISTRY_READS", 2), timeout=20, what="the mirror holding two sources")
        await registry.put({"name": "edge3", "servers": "nats://127.0.0.1:1"}, 0, 5.0)
        state = await registry.state(5.0)
        assert state is not None and state[1] == 3

        async def read() -> list[str] | None:
            try:
                return [e.name for e in await registry.read(5.0, through=state[1])]
            except ApiUnavailable as exc:
                assert "behind its leader" in str(exc)
                return None

        refused = await wait_until(lambda: none_yet(read), timeout=20, what="a read answered by the mirror, refused")
        assert refused
        whole = [names for names in [await read() for _ in range(READS)] if names is not None]
        assert whole and all(names == ["edge1", "edge2", "edge3"] for names in whole)


async def holds(nc: Client, stream: str, messages: int) -> bool:
    return bool((await js_request(nc, f"STREAM.INFO.{stream}"))["state"]["messages"] == messages)


async def none_yet(read: Callable[[], Awaitable[list[str] | None]]) -> bool:
    return await read() is None


async def test_without_the_leaders_permission_the_reply_is_trusted_with_one_warning(servers: ServerFactory) -> None:
    """A user allowed Direct Get but not ``STREAM.MSG.GET`` (the permissions documented before the check): a read
    that ends short of its range still returns (the old behaviour), and ``directget.unverified`` names the subject
    to allow, once per process and stream."""
    password = "reader-" + secrets.token_hex(8)
    publish = permissions_block(["$JS.API.DIRECT.GET.AGG"], ["_INBOX.>"])
    server = servers(
        "hub",
        "authorization {\n  users = [\n    {user: admin, password: admin}\n"
        f"    {{user: reader, password: {conf_str(password)}, {publish}}}\n  ]\n}}",
    )
    async with connect(server.url.replace("nats://", "nats://admin:admin@")) as admin:
        await create_aggregate(admin)
        await publish_copies(admin, "edge1", 1, 10, "edge.one", "x")
    directget._unverifiable.discard("AGG")
    reader = Client()
    record = permissions.attach(reader)  # as bridge.io.connect does: the server's denial reaches the request at once

    async def errors(exc: Exception) -> None:
        record.note(exc)

    await reader.connect(server.url, user="reader", password=password, error_cb=errors)
    try:
        with structlog.testing.capture_logs() as logs:
            for _ in range(2):
                seqs = [
                    m.seq
                    async for messages in read_batches(
                        reader, "$JS.API", "AGG", 1, 20, error_type=TargetUnavailable, verify=True
                    )
                    for m in messages
                ]
                assert seqs == list(range(1, 11))  # the range reaches past the last message: the check is asked
    finally:
        await reader.close()
    warnings = [e for e in logs if e["event"] == "directget.unverified"]
    assert len(warnings) == 1 and "$JS.API.STREAM.MSG.GET.AGG" in warnings[0]["fix"]
