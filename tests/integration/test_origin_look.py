"""The look for stranded messages without a task (``OriginClient.first_seq_soon``, ``bridge.io.jsapi.request_soon``)
against a real nats-server: it finds what ``first_seq_from`` finds, says why when the origin cannot answer, and
refuses where it cannot ask so (a filtered consumer: a request per filter)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import pytest

from bridge.config import SourceConfig
from bridge.errors import BridgeError, OriginUnavailable
from bridge.io.jsapi import quick_stream_state, request_soon
from bridge.io.origin import OriginClient
from bridge.testing.jetstream import connect, create_stream
from bridge.testing.servers import NatsServer

pytestmark = pytest.mark.anyio

STREAM = "ORIGIN"


async def _noop() -> None:
    pass


async def _noop_error(exc: Exception) -> None:
    pass


async def _client(url: str, **fields: Any) -> OriginClient:
    client = OriginClient(SourceConfig(name="edge1", servers=[url], stream=STREAM, **fields), timeout=2.0)
    await client.connect(on_disconnected=_noop, on_reconnected=_noop, on_error=_noop_error)
    with contextlib.suppress(OriginUnavailable):  # (no such stream, in one test)
        await client.stream()  # start-up's first request: nats-py's request inbox exists from here on
    return client


async def _look(client: OriginClient, start: int) -> tuple[int, str | None]:
    done = anyio.Event()
    answer: list[tuple[int, str | None]] = []

    def looked(first: int, error: str | None) -> None:
        answer.append((first, error))
        done.set()

    assert client.first_seq_soon(start, looked)
    with anyio.fail_after(5):
        await done.wait()
    return answer[0]


async def test_a_look_without_a_task_finds_what_the_request_finds(origin: NatsServer) -> None:
    async with connect(origin.url) as nc:
        await create_stream(nc, STREAM, ["o.>"], retention="workqueue")
        for i in range(5):
            await nc.jetstream().publish(f"o.{i}", b"x")
        await nc.jetstream().delete_msg(STREAM, 1)  # acked and deleted: the first is 2
        client = await _client(origin.url)
        try:
            for start in (1, 2, 3, 6):
                assert await _look(client, start) == (await client.first_seq_from(start), None)
            assert await _look(client, 1) == (2, None)
            assert await _look(client, 6) == (0, None)  # nothing at or after it
            answers: list[tuple[int, str | None]] = []

            async def look(start: int) -> None:
                answers.append(await _look(client, start))

            async with anyio.create_task_group() as tg:  # several at once, each its own answer
                for start in (1, 2, 6):
                    tg.start_soon(look, start)
            assert sorted(answers) == [(0, None), (2, None), (2, None)]
        finally:
            await client.close()


async def test_the_looks_quick_read_of_a_stream_info_reply_is_what_decoding_it_whole_says(origin: NatsServer) -> None:
    """The look reads two numbers of the reply's state from its bytes: this server writes them where that read
    finds them (else every look decodes the whole reply: still right, only slower), and an error reply is left to
    the whole decode, which says what the error is."""
    async with connect(origin.url) as nc:
        subject = f"$JS.API.STREAM.INFO.{STREAM}"
        assert quick_stream_state((await nc.request(subject, b"", timeout=5)).data) is None  # no such stream
        await create_stream(nc, STREAM, ["o.>"], retention="workqueue")
        for published in (0, 3):
            for i in range(published):
                await nc.jetstream().publish(f"o.{i}", b"x")
            if published:
                await nc.jetstream().delete_msg(STREAM, 1)
            reply = (await nc.request(subject, b"", timeout=5)).data
            state = json.loads(reply)["state"]
            quick = quick_stream_state(reply)
            assert quick == {"state": {"messages": state["messages"], "first_seq": state["first_seq"]}}, reply
        assert quick == {"state": {"messages": 2, "first_seq": 2}}


async def test_a_look_says_why_the_origin_could_not_answer(origin: NatsServer) -> None:
    client = await _client(origin.url)  # no such stream
    try:
        first, error = await _look(client, 1)
        assert first == 0 and error is not None and "stream not found" in error
    finally:
        await client.close()


async def test_a_request_nobody_answers_is_no_responder(origin: NatsServer) -> None:
    async with connect(origin.url) as nc:
        await nc.request("$JS.API.INFO", b"", timeout=2)  # nats-py's request inbox
        done = anyio.Event()
        errors: list[BridgeError | None] = []

        def answered(document: dict[str, Any] | None, error: BridgeError | None) -> None:
            errors.append(error)
            done.set()

        assert request_soon(nc, "$JS.nowhere.API.STREAM.INFO.X", 2.0, answered)
        with anyio.fail_after(5):
            await done.wait()
        assert errors and "no JetStream responder" in str(errors[0])


async def test_a_filtered_consumer_is_looked_at_with_a_request_per_filter(origin: NatsServer) -> None:
    client = await _client(origin.url, filter_subjects=["o.a"])
    try:
        assert not client.first_seq_soon(1, lambda first, error: None)
    finally:
        await client.close()
