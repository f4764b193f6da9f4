"""``bridge.testing.fakes.FakeOrigin`` in pull mode: what the runner's unit tests rely on it to model."""

from __future__ import annotations

import pytest

from bridge.core.effects import OriginMessage, Pull, PullAnchor
from bridge.core.inbound import Data, Heartbeat, Inbound, PullStatus
from bridge.core.modes import ConsumerKind, Mode
from bridge.errors import ApiTimeout, ConsumerUnfit, OriginUnavailable
from bridge.ports import OriginPort
from bridge.testing.fakes import Collected, FakeOrigin

pytestmark = pytest.mark.anyio


async def _noop() -> None:
    pass


async def started(origin: FakeOrigin, received: list[Inbound]) -> None:
    await origin.connect(on_disconnected=_noop, on_reconnected=_noop, on_error=lambda exc: _noop())
    await origin.bind()
    await origin.subscribe(Collected(received))


async def test_it_is_an_origin_port() -> None:
    port: OriginPort = FakeOrigin()
    assert port.mode is Mode.FLOW_CONTROL
    stream = await port.stream()
    assert (stream.api_level, stream.version) == (5, "2.15.1")


async def test_deliveries_follow_pull_requests_and_carry_their_ack_subject() -> None:
    origin, received = FakeOrigin(mode=Mode.PULL), list[Inbound]()
    origin.publish(5)
    assert await origin.consumer_kind() is None
    await started(origin, received)
    assert await origin.consumer_kind() is ConsumerKind.PULL
    assert origin.deliver() == 0  # nothing asked for yet
    await origin.pull(Pull(3, 5.0, 1.0))
    assert origin.deliver() == 3
    assert [m.ack.stream_seq for m in received if isinstance(m, Data)] == [1, 2, 3]
    assert all(isinstance(m, Data) and m.reply.startswith("$JS.ACK.ORDERS.BRIDGE.") for m in received)
    assert origin.pulls == [Pull(3, 5.0, 1.0)] and origin.waiting == []
    await origin.pull(Pull(10, 5.0, 1.0))
    assert origin.deliver() == 2
    origin.heartbeat()
    assert origin.end_requests() == 1
    assert received[-2:] == [Heartbeat(5, 5, None), PullStatus(408, "Request Timeout", origin.inbox, 8, 0)]


async def test_acks_move_the_floor_over_what_is_acked_contiguously_and_delete_on_a_workqueue() -> None:
    origin, received = FakeOrigin(mode=Mode.PULL, workqueue=True), list[Inbound]()
    origin.publish(4)
    await started(origin, received)
    await origin.pull(Pull(4, 5.0, 1.0))
    origin.deliver()
    replies = [m.reply for m in received if isinstance(m, Data)]
    await origin.ack([replies[0], replies[2]])
    assert origin.ack_floor == 1 and sorted(origin.messages) == [2, 4]
    await origin.ack([replies[1]])
    assert origin.ack_floor == 3 and origin.acks == [replies[0], replies[2], replies[1]]


async def test_a_request_of_an_earlier_inbox_loses_what_it_brings() -> None:
    origin, received = FakeOrigin(mode=Mode.PULL), list[Inbound]()
    origin.publish(4)
    await started(origin, received)
    await origin.pull(Pull(2, 5.0, 1.0))
    first = origin.inbox
    await origin.unsubscribe()
    with pytest.raises(OriginUnavailable):
        await origin.pull(Pull(2, 5.0, 1.0))
    await origin.subscribe(Collected(received))
    assert origin.inbox != first
    await origin.pull(Pull(2, 5.0, 1.0))
    assert origin.deliver() == 4
    assert origin.lost == [1, 2]
    assert [m.ack.stream_seq for m in received if isinstance(m, Data)] == [3, 4]
    assert await origin.anchor() == PullAnchor(4, 4, True, origin.created)
    assert [m.seq for m in await origin.fetch(0, 2)] == [1, 2]


async def test_anchor_and_fetch_answer_as_scripted() -> None:
    origin = FakeOrigin(mode=Mode.PULL)
    scripted = [OriginMessage(7, "x", {"A": "1"}, b"p", 1)]
    origin.anchors = [PullAnchor(9, 7, fit=False), ApiTimeout("no reply")]
    origin.fetches = [scripted, ApiTimeout("no reply")]
    assert await origin.anchor() == PullAnchor(9, 7, fit=False)
    with pytest.raises(ApiTimeout):
        await origin.anchor()
    assert await origin.fetch(6, 7) == scripted
    with pytest.raises(ApiTimeout):
        await origin.fetch(6, 7)
    assert origin.fetched == [(6, 7), (6, 7)]
    assert origin.ops == ["anchor", "anchor", "fetch 6 7", "fetch 6 7"]


async def test_bind_refuses_to_turn_one_kind_into_the_other() -> None:
    origin = FakeOrigin(mode=Mode.PULL, kind=ConsumerKind.FLOW_CONTROL)
    with pytest.raises(ConsumerUnfit):
        await origin.bind()
