"""The paging and fallbacks of ``bridge.io.directory.StreamDirectory`` (pure logic: the replies are given as the
server writes them; tests/integration/test_origin_directory.py runs it against a real nats-server)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from bridge.errors import ApiTimeout
from bridge.io.directory import LIST_PAGES, StreamDirectory
from bridge.io.jsapi import JsApi

pytestmark = pytest.mark.anyio

PAGE = 256  # the server's JSApiListLimit


def _info(name: str, last_seq: int = 0) -> dict[str, Any]:
    return {"config": {"name": name, "retention": "limits", "metadata": {}}, "state": {"last_seq": last_seq}}


class Origin:
    """An origin's JetStream API as the directory asks it: ``STREAM.INFO`` and ``STREAM.LIST`` pages."""

    def __init__(self, names: list[str], offline: frozenset[str] = frozenset(), silent: bool = False) -> None:
        self.names, self.offline, self.silent = names, offline, silent
        self.requests: list[str] = []

    async def stream_info(self, stream: str, timeout: float = 5.0) -> dict[str, Any]:
        self.requests.append(f"INFO {stream}")
        info = _info(stream, 7)
        info["config"]["metadata"] = {"_nats.level": "5", "_nats.ver": "2.15.1"}
        return info

    async def request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        assert path == "STREAM.LIST" and body is not None
        offset = int(body["offset"])
        self.requests.append(f"LIST {offset}")
        if self.silent:
            raise ApiTimeout("no reply to $JS.API.STREAM.LIST within 2s")
        streams, missing = [], []
        for name in self.names[offset:]:  # as jsStreamListRequest: offline streams are passed over, and named
            if name in self.offline:
                missing.append(name)
                continue
            streams.append(_info(name, 3))
            if len(streams) >= PAGE:
                break
        return {"total": len(self.names), "offset": offset, "limit": PAGE, "streams": streams, "missing": missing}


@contextlib.asynccontextmanager
async def _slot() -> AsyncIterator[None]:
    yield


async def _read(origin: Origin, directory: StreamDirectory, stream: str) -> dict[str, Any]:
    return await directory.info(cast(JsApi, origin), stream, 5.0, _slot)


async def test_pages_pass_over_offline_streams_and_each_listed_stream_reads_as_its_info() -> None:
    names = [f"S{i:04d}" for i in range(600)]
    origin = Origin(names, offline=frozenset({"S0003", "S0300"}))
    directory = StreamDirectory("$JS.API")
    first = await _read(origin, directory, "S0000")  # the first: its own info, the server's level with it
    listed = await _read(origin, directory, "S0599")
    assert first["state"]["last_seq"] == 7 and listed["state"]["last_seq"] == 3
    assert listed["config"]["metadata"] == {"_nats.level": "5", "_nats.ver": "2.15.1"}
    assert origin.requests == ["INFO S0000", "LIST 0", "LIST 257", "LIST 514"]  # past the offline ones too
    offline = await _read(origin, directory, "S0300")  # not listed: its own info says what it is
    assert offline["state"]["last_seq"] == 7
    assert origin.requests[-1] == "INFO S0300" and not directory.unusable


async def test_an_origin_of_more_streams_than_the_pages_or_a_listing_unanswered_ends_listings_there() -> None:
    big = Origin([f"S{i:05d}" for i in range(LIST_PAGES * PAGE + 1)])
    directory = StreamDirectory("$JS.API")
    await _read(big, directory, "S00000")
    assert (await _read(big, directory, "S00001"))["state"]["last_seq"] == 7  # its own info after all
    assert "more than 1024 streams" in directory.unusable
    big.requests.clear()
    await _read(big, directory, "S00002")
    assert big.requests == ["INFO S00002"]  # no listing asked again
    silent = Origin(["A", "B"], silent=True)
    directory = StreamDirectory("$JS.leaf.API")
    await _read(silent, directory, "A")
    assert (await _read(silent, directory, "B"))["config"]["name"] == "B"
    assert "STREAM.LIST" in directory.unusable and silent.requests == ["INFO A", "LIST 0", "INFO B"]
