"""The source registry's bucket (``bridge.config.registry`` says what it holds): read, written, watched.

A KV bucket ``<coordination.bucket>-sources`` reached like the coordination bucket (its servers, credentials and
domain). Writes are compare-and-set on the revision the writer read (0: the name must be new), so two operators
changing one source at once cannot overwrite each other unseen. No ``max_age``: an entry stays until removed.
"""

from __future__ import annotations

from typing import Any

from nats.aio.client import Client as NATS

from bridge.config.registry import KEY_PREFIX, RegistryEntry, decode_entry, encode_table, registry_bucket
from bridge.io.jsapi import JsApi
from bridge.io.kv import KvBucket

# what a change of the registry looks like from STREAM.INFO: (first_seq, last_seq, messages); None: no bucket
State = tuple[int, int, int] | None


class RegistryBucket:
    """The registry of the coordination bucket ``coordination_bucket``, reached through ``api``."""

    def __init__(self, nc: NATS, api: JsApi, coordination_bucket: str) -> None:
        self.kv = KvBucket(nc, api, registry_bucket(coordination_bucket))
        self.bucket = self.kv.bucket
        self.subjects = f"{self.kv.prefix}{KEY_PREFIX}>"  # every entry's subject: what a watcher listens to

    def creation_config(self, replicas: int) -> dict[str, Any]:
        """The registry's stream: one value per key, kept until removed (a KV bucket without a TTL)."""
        return self.kv.creation_config(
            0, replicas, "nats-bridge source registry (nats-bridge sources add / remove / list)"
        )

    async def ensure(self, replicas: int, timeout: float) -> bool:
        """Create the bucket when missing (never changing an existing one); True when this call created it."""
        if await self.kv.lookup(timeout) is not None:
            return False
        _, created = await self.kv.create_stream(self.creation_config(replicas), timeout)
        return created

    async def state(self, timeout: float) -> State:
        """What changes whenever an entry is written or removed; None while there is no registry bucket."""
        info = await self.kv.lookup(timeout)
        if info is None:
            return None
        state = info.get("state", {})
        return int(state.get("first_seq", 0)), int(state.get("last_seq", 0)), int(state.get("messages", 0))

    async def read(self, timeout: float, through: int = 0) -> list[RegistryEntry]:
        """Every registered source, by name (an empty list when there is no bucket).

        ``through``: the stream's last sequence as its leader gave it (``state``); a read answered by a replica
        that does not hold it yet raises ``ApiUnavailable`` (``KvBucket.read_all``), to be read again: else the
        older registry would be kept until the next change."""
        if await self.kv.lookup(timeout) is None:
            return []
        entries = [
            decode_entry(entry.key[len(KEY_PREFIX) :], entry.revision, entry.value)
            for entry in await self.kv.read_all(timeout, through=through)
            if entry.key.startswith(KEY_PREFIX) and not entry.deleted
        ]
        return sorted(entries, key=lambda entry: entry.name)

    async def put(self, table: dict[str, Any], revision: int, timeout: float) -> int:
        """Store ``table`` under its name if the key is at ``revision`` (0: new); the new revision, or
        :class:`~bridge.io.kv.KvConflict`."""
        return await self.kv.write(KEY_PREFIX + str(table["name"]), encode_table(table), revision, timeout)

    async def remove(self, name: str, revision: int, timeout: float) -> int:
        """Remove ``name`` if it is at ``revision``; the delete marker's revision, or ``KvConflict``."""
        return await self.kv.write(KEY_PREFIX + name, b"", revision, timeout, delete=True)
