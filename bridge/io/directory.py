"""What an origin's streams are, read for many sources at once: one ``STREAM.LIST`` instead of a ``STREAM.INFO`` each.

At start-up every source reads its origin stream (its retention, its last sequence, the server's API level) before
it creates its consumer. A leaf of a hundred sources answered a hundred infos, and at a regional scale those were
about a third of what the leaves did while the bridge started (bench edge, 2,000 sources behind 20 leaves on one
machine: every source bound 4-6 s sooner with one info per leaf; bench/RESULTS.md). So the sources of one origin
(one connection, one JetStream domain) share a :class:`StreamDirectory`: the first of them reads its stream's info
as before, which also tells the server's API level and version, and the others take their stream from a listing of
the origin's streams (256 a page), one listing for every source that asked before it began (``GroupRun``): never
older than the source's own question, as its own info would be.

A source goes back to its own ``STREAM.INFO`` (the rule, never an error of its own) when the directory cannot help:
its stream is not in the listing (it does not exist, or is offline: the info says which), the listing failed, or
listings are of no use on this origin: the user may not ask for them (a permission denied is logged once, with the
fix), a listing got no answer within ``LIST_TIMEOUT`` (a leaf link that does not carry it, most likely), or the
origin holds more streams than ``LIST_PAGES`` pages.
"""

from __future__ import annotations

from typing import Any

import anyio

from bridge.errors import BridgeError, PermissionDenied
from bridge.io.group import GroupRun
from bridge.io.jsapi import ApiTimeout, ApiUnavailable, JsApi, server_level
from bridge.logs import get_logger
from bridge.ports import Gate

__all__ = ["LIST_PAGES", "StreamDirectory"]

LIST_PAGES = 4  # pages of 256 streams at most (an origin with more: one info per source)
LIST_TIMEOUT = 2.0  # seconds a page may take (no answer: listings are not asked for again on this origin)


class StreamDirectory:
    """One origin's streams for the sources on it: the server's API level and version once one info told them, and
    listings of its streams shared by the sources that ask together."""

    def __init__(self, api_prefix: str) -> None:
        self.api_prefix = api_prefix
        self.level: tuple[int | None, str | None] | None = None  # (API level, version) from a STREAM.INFO
        self.unusable = ""  # why listings are not asked for on this origin ("": they are)
        self._probing: anyio.Event | None = None  # set when the origin's first info, under way, ends
        self._listings: GroupRun[dict[str, dict[str, Any]]] = GroupRun()
        self._log = get_logger(component="origin", api_prefix=api_prefix)

    def claims(self, text: str) -> bool:
        """Whether a connection error's text is about this directory's listing (its permission denied)."""
        return f'"{self.api_prefix.lower()}.stream.list"' in text.lower()

    async def info(self, api: JsApi, stream: str, timeout: float, slot: Gate) -> dict[str, Any]:
        """``stream``'s info as ``STREAM.INFO`` gives it (``config`` and ``state``; errors raised as its own),
        from a listing when one helps; ``slot`` is held for each request (a listing's waiters hold none)."""
        if self.level is None and not self.unusable:
            # the origin's first source reads its own info (the server's level with it); the others wait for it
            probing = self._probing
            if probing is None:
                probe = self._probing = anyio.Event()
                try:
                    return await self._own_info(api, stream, timeout, slot)
                finally:
                    self._probing = None
                    probe.set()
            await probing.wait()
        if self.level is not None and not self.unusable:
            listing = await self._listings.run(lambda: self._list(api, timeout, slot))
            found = listing.get(stream) if listing is not None else None
            if found is not None:
                return found
        return await self._own_info(api, stream, timeout, slot)

    async def _own_info(self, api: JsApi, stream: str, timeout: float, slot: Gate) -> dict[str, Any]:
        async with slot():
            info = await api.stream_info(stream, timeout=timeout)
        if self.level is None:
            self.level = server_level(info)
        return info

    async def _list(self, api: JsApi, timeout: float, slot: Gate) -> dict[str, dict[str, Any]]:
        streams: dict[str, dict[str, Any]] = {}
        if self.unusable:  # (found while this listing's callers waited for it)
            raise BridgeError(self.unusable)
        offset = 0
        for _ in range(LIST_PAGES):
            try:
                async with slot():
                    page = await api.request("STREAM.LIST", {"offset": offset}, min(timeout, LIST_TIMEOUT))
            except PermissionDenied as exc:
                self._no_listings(f"{exc}; allow {self.api_prefix}.STREAM.LIST for one request per origin instead")
                raise
            except (ApiTimeout, ApiUnavailable) as exc:  # a leaf link that does not carry it, most likely
                self._no_listings(f"{exc} (a leaf link that does not carry {self.api_prefix}.STREAM.LIST?)")
                raise
            infos = [info for info in page.get("streams") or () if isinstance(info, dict)]
            for info in infos:
                name = (info.get("config") or {}).get("name")
                if isinstance(name, str):
                    streams[name] = self._with_level(info)
            # a page passes over the streams it lists and those offline (named in "missing", left to their infos)
            offset += len(infos) + len(page.get("missing") or ())
            total = page.get("total")
            if not infos or not isinstance(total, int) or offset >= total:
                return streams
        self._no_listings(f"the origin holds more than {LIST_PAGES * 256} streams")
        raise BridgeError("too many streams to list")

    def _with_level(self, info: dict[str, Any]) -> dict[str, Any]:
        """A listed stream as its own info would read: the server's level and version in its config's metadata (a
        listing's configs lack them)."""
        level, version = self.level or (None, None)
        metadata = {**((info.get("config") or {}).get("metadata") or {})}
        if level is not None:
            metadata.setdefault("_nats.level", str(level))
        if version is not None:
            metadata.setdefault("_nats.ver", version)
        return {**info, "config": {**(info.get("config") or {}), "metadata": metadata}}

    def _no_listings(self, why: str) -> None:
        self.unusable = why
        self._log.info("origin.streams_listed_no_more", reason=why, hint="each source reads its own stream's info")
