"""The registry watcher (bridge.runtime.registry): what it hands over, and what it never invents."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bridge.config.registry import RegistryEntry
from bridge.errors import ApiTimeout, ApiUnavailable
from bridge.io.registry import RegistryBucket, State
from bridge.runtime.registry import RegistryWatcher


class Bucket(RegistryBucket):
    """A registry bucket whose state and entries the test sets (or makes fail)."""

    def __init__(self) -> None:  # no connection: only state and read are used
        self.bucket = "nats-bridge-sources"
        self.subjects = "$KV.nats-bridge-sources.source.>"
        self.current: State = None
        self.entries: list[RegistryEntry] = []
        self.failing = False
        self.behind = False
        self.asked_through = 0
        self.reads = 0

    async def state(self, timeout: float) -> State:
        if self.failing:
            raise ApiTimeout("no reply to $JS.API.STREAM.INFO.KV_nats-bridge-sources within 5s")
        return self.current

    async def read(self, timeout: float, through: int = 0) -> list[RegistryEntry]:
        self.reads += 1
        self.asked_through = through
        if self.behind:  # as RegistryBucket.read answers a reply from a replica behind ``through``
            raise ApiUnavailable("the source registry was read from a replica behind its leader")
        return list(self.entries)

    def write(self, *names: str) -> None:
        """The registry now holds ``names`` (each write moves the stream's last sequence)."""
        last = (self.current or (0, 0, 0))[1] + 1
        self.current = (1, last, len(names))
        self.entries = [RegistryEntry(name, last, {"name": name}) for name in names]


def watcher(bucket: Bucket) -> tuple[RegistryWatcher, list[list[str]]]:
    handed: list[list[str]] = []

    async def on_change(entries: Sequence[RegistryEntry]) -> None:
        handed.append([e.name for e in entries])

    return RegistryWatcher(None, bucket, on_change), handed  # type: ignore[arg-type]  # look() needs no connection


@pytest.mark.anyio
async def test_changes_are_handed_over_once_each() -> None:
    bucket = Bucket()
    watch, handed = watcher(bucket)
    assert await watch.look()  # no bucket yet: an empty registry, once
    assert not await watch.look()
    bucket.write("edge2")
    assert await watch.look()
    assert not await watch.look() and bucket.reads == 1  # the state did not move: not even read
    bucket.write("edge2", "edge3")
    assert await watch.look()
    assert handed == [[], ["edge2"], ["edge2", "edge3"]]


@pytest.mark.anyio
async def test_a_failed_read_keeps_the_sources_it_had() -> None:
    bucket = Bucket()
    watch, handed = watcher(bucket)
    bucket.write("edge2")
    assert await watch.look()
    bucket.failing = True
    for _ in range(3):
        assert not await watch.look()
    assert watch.entries is not None and [e.name for e in watch.entries] == ["edge2"]
    bucket.failing = False
    bucket.write("edge2", "edge3")
    assert await watch.look()
    assert handed == [["edge2"], ["edge2", "edge3"]]


@pytest.mark.anyio
async def test_a_bucket_seen_is_believed_gone_only_when_missing_twice() -> None:
    bucket = Bucket()
    watch, handed = watcher(bucket)
    bucket.write("edge2")
    assert await watch.look()
    bucket.current = None  # a stream unknown for a moment (a leader election)
    assert not await watch.look()
    bucket.current = (1, 1, 1)  # back as it was
    assert not await watch.look()
    bucket.current = None
    assert not await watch.look()
    assert await watch.look()  # missing again: deleted
    assert handed == [["edge2"], []]


@pytest.mark.anyio
async def test_a_read_from_a_replica_behind_is_read_again_at_the_next_look() -> None:
    """The state comes from the leader, the entries from whichever replica answers: a read behind the state is not
    taken for it (else the older registry would stay until the next change)."""
    bucket = Bucket()
    watch, handed = watcher(bucket)
    bucket.write("edge1")
    bucket.behind = True
    assert not await watch.look() and bucket.asked_through == 1
    assert not await watch.look() and bucket.reads == 2  # the state was not taken as read: read again
    bucket.behind = False
    assert await watch.look() and handed == [["edge1"]]
