"""The lease bucket read whole, on a real server: one multi_last read, or batches once the keys outnumber what the
server answers at once (it refuses more than 1,024 with a 413)."""

from __future__ import annotations

import anyio
import pytest

from bridge.errors import BridgeError
from bridge.io.jsapi import JsApi
from bridge.io.kv import MULTI_LAST_LIMIT, KvBucket, KvConflict, KvEntry
from bridge.testing.jetstream import connect
from bridge.testing.servers import ServerFactory

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("keys", [10, MULTI_LAST_LIMIT + 76])
async def test_read_all_has_the_last_value_of_every_key(
    servers: ServerFactory, keys: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole_reads: list[int] = []
    read_whole = KvBucket._read_whole

    async def counted(self: KvBucket, timeout: float) -> list[KvEntry]:
        whole_reads.append(1)
        return await read_whole(self, timeout)

    monkeypatch.setattr(KvBucket, "_read_whole", counted)
    server = servers("kv", "")
    async with connect(server.url) as nc:
        bucket = KvBucket(nc, JsApi(nc, "$JS.API"), "leases")
        await bucket.ensure(30.0, 1, 5.0)
        revisions = {}
        for i in range(keys):
            revisions[f"lease.s{i}"] = await bucket.write(f"lease.s{i}", b"first", None, 5.0)
        # a second value for some keys, a delete for one: only the last of each counts
        revisions["lease.s1"] = await bucket.write("lease.s1", b"second", revisions["lease.s1"], 5.0)
        revisions["lease.s2"] = await bucket.write("lease.s2", b"", revisions["lease.s2"], 5.0, delete=True)
        entries = {entry.key: entry for entry in await bucket.read_all(10.0)}
    assert set(entries) == set(revisions)
    assert {key: entry.revision for key, entry in entries.items()} == revisions
    assert entries["lease.s1"].value == b"second"
    assert entries["lease.s2"].deleted and not entries["lease.s0"].deleted
    # one multi_last read while the server answers it; read whole, in batches, once it refuses (413)
    assert len(whole_reads) == (1 if keys > MULTI_LAST_LIMIT else 0)


async def test_a_write_sent_without_a_task_keeps_the_revision_check(servers: ServerFactory) -> None:
    """``write_soon`` (lease renewals): the new revision on success, :class:`KvConflict` when the key moved on,
    exactly as :meth:`KvBucket.write` would answer."""
    server = servers("kv", "")
    async with connect(server.url) as nc:
        bucket = KvBucket(nc, JsApi(nc, "$JS.API"), "leases")
        await bucket.ensure(30.0, 1, 5.0)  # a request first: nats-py's reply inbox exists from then on
        first = await bucket.write("group.1", b"mine", None, 5.0)
        outcomes: list[tuple[int | None, BridgeError | None]] = []
        done = anyio.Event()

        def written(revision: int | None, error: BridgeError | None) -> None:
            outcomes.append((revision, error))
            if len(outcomes) == 2:
                done.set()

        # two writes in one event-loop pass, both naming the first revision: the first is stored, the second refused
        assert bucket.write_soon("group.1", b"renewed", first, 5.0, written)
        assert bucket.write_soon("group.1", b"late", first, 5.0, written)
        with anyio.fail_after(10):
            await done.wait()
        entry = await bucket.get("group.1", 5.0)
    (stored, no_error), (none, conflict) = outcomes
    assert no_error is None and stored is not None and stored > first
    assert none is None and isinstance(conflict, KvConflict) and "group.1" in str(conflict)
    assert entry is not None and entry.value == b"renewed" and entry.revision == stored
