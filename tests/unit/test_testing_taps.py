"""The ack taps of ``bridge.testing.jetstream`` (``FcTap``, ``AckTap``), without servers.

A fake origin connection routes each message to the subscriptions whose subject pattern matches it (NATS wildcard
rules), so what the taps subscribe to is tested along with what they do with a message; the aggregate is a dict of
copy counts per subject filter, patched in for ``aggregate_count``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from nats.aio.msg import Msg

from bridge.testing import jetstream
from bridge.testing.jetstream import AckTap, FcTap, ack_violation, tap_for_mode

pytestmark = pytest.mark.anyio

CONSUMER = "nats-bridge-edge1"
PREFIX = "edge.one.>"

Callback = Callable[[Msg], Awaitable[None]]


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


@dataclass
class FakeSub:
    conn: FakeConnection
    subject: str
    cb: Callback

    async def unsubscribe(self) -> None:
        self.conn.subs.remove(self)


@dataclass
class FakeConnection:
    """Just what a tap uses of an origin connection: subscribe with a callback, flush."""

    subs: list[FakeSub] = field(default_factory=list)

    async def subscribe(self, subject: str, *, cb: Callback, pending_msgs_limit: int) -> FakeSub:
        sub = FakeSub(self, subject, cb)
        self.subs.append(sub)
        return sub

    async def flush(self, timeout: float = 10.0) -> None:
        pass

    async def deliver(self, subject: str, data: bytes = b"", headers: dict[str, str] | None = None) -> int:
        """Hand a message to every matching subscription, as the server would; how many got it."""
        matched = [sub for sub in self.subs if matches(sub.subject, subject)]
        for sub in matched:
            await sub.cb(Msg(_client=None, subject=subject, data=data, headers=headers))  # type: ignore[arg-type]
        return len(matched)


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The aggregate's copies per subject filter, as ``aggregate_count`` will report them."""
    counts: dict[str, int] = {}

    async def aggregate_count(hub: Any, subject_filter: str, stream: str = "AGG") -> int:
        return counts[subject_filter]

    monkeypatch.setattr(jetstream, "aggregate_count", aggregate_count)
    return counts


def v1(sseq: int, consumer: str = CONSUMER, stream: str = "ORDERS") -> str:
    return f"$JS.ACK.{stream}.{consumer}.1.{sseq}.{sseq}.1700000000000000000.0"


def v2(sseq: int, consumer: str = CONSUMER, stream: str = "ORDERS", token: bool = True) -> str:
    subject = f"$JS.ACK.leaf.ACCHASH.{stream}.{consumer}.1.{sseq}.{sseq}.1700000000000000000.0"
    return subject + ".r4nd0m" if token else subject


def tap_of(cls: type[FcTap] | type[AckTap], conn: FakeConnection) -> Any:
    return cls(conn, None, {CONSUMER: PREFIX})  # type: ignore[arg-type]


def test_ack_violation_is_fewer_copies_than_the_acked_sequence() -> None:
    assert ack_violation("ack x", 5, 5) is None
    assert ack_violation("ack x", 5, 9) is None
    assert ack_violation("ack x", 5, 4) == "ack x while the aggregate held 4 copies"


def test_tap_for_mode() -> None:
    conn = FakeConnection()
    assert type(tap_for_mode(conn, None, {}, mode="pull")) is AckTap  # type: ignore[arg-type]
    assert type(tap_for_mode(conn, None, {}, mode="flow_control")) is FcTap  # type: ignore[arg-type]


async def test_ack_tap_audits_each_explicit_ack(stored: dict[str, int]) -> None:
    conn = FakeConnection()
    tap = tap_of(AckTap, conn)
    async with tap.running():
        stored[PREFIX] = 3
        assert await conn.deliver(v1(3)) == 1  # stored: fine
        assert await conn.deliver(v1(2), b"+ACK") == 1  # "+ACK" is an ack too
        assert await conn.deliver(v2(4)) == 1  # not stored yet: a violation
        assert await conn.deliver(v2(4, token=False), b"+ACK") == 1
        assert await conn.deliver(v1(9), b"-NAK") == 1  # no ack: kept aside, not audited
        assert await conn.deliver(v1(9), b"+WPI") == 1
        assert await conn.deliver(v1(9, consumer="someone-else")) == 0  # not subscribed
        assert await conn.deliver(f"$JS.FC.ORDERS.{CONSUMER}.x1") == 0
    assert conn.subs == [], "unsubscribed at the end"
    assert tap.checked == 4
    assert [a.stream_seq for a in tap.acking(CONSUMER)] == [3, 2, 4, 4]
    assert tap.acking("someone-else") == []
    assert [body for _, body in tap.others] == [b"-NAK", b"+WPI"]
    assert tap.violations == [
        f"ack {v2(4)} of origin seq 4 while the aggregate held 3 copies",
        f"ack {v2(4, token=False)} of origin seq 4 while the aggregate held 3 copies",
    ]


async def test_ack_tap_stream_token_is_a_wildcard(stored: dict[str, int]) -> None:
    """The tap is told consumers, not streams: two sources' consumers on two streams are both heard."""
    conn = FakeConnection()
    tap = AckTap(conn, None, {"a": "edge.a.>", "b": "edge.b.>"})  # type: ignore[arg-type]
    stored.update({"edge.a.>": 1, "edge.b.>": 0})
    async with tap.running():
        await conn.deliver(v1(1, consumer="a", stream="ORDERS_A"))
        await conn.deliver(v1(1, consumer="b", stream="ORDERS_B"))
    assert tap.checked == 2
    assert len(tap.violations) == 1 and "origin seq 1 while the aggregate held 0 copies" in tap.violations[0]


async def test_fc_tap_audits_answers_that_name_a_position(stored: dict[str, int]) -> None:
    conn = FakeConnection()
    tap = tap_of(FcTap, conn)
    stored[PREFIX] = 10
    async with tap.running():
        subject = f"$JS.FC.ORDERS.{CONSUMER}.x1"
        await conn.deliver(subject, headers={"Nats-Last-Consumer": "10", "Nats-Last-Stream": "10"})
        await conn.deliver(subject)  # an empty answer acks nothing
        await conn.deliver(subject, headers={"Nats-Last-Consumer": "11", "Nats-Last-Stream": "11"})
        await conn.deliver(v1(12))  # an ack subject is none of its business
    assert len(tap.answers) == 3 and tap.checked == 2
    assert [a.last_stream for a in tap.acking(CONSUMER)] == [10, 11]
    assert tap.violations == [
        f"FC answer {subject} named Nats-Last-Stream 11 (Nats-Last-Consumer 11) while the aggregate held 10 copies"
    ]


async def test_an_answer_for_an_unknown_consumer_is_a_violation(stored: dict[str, int]) -> None:
    conn = FakeConnection()
    tap = tap_of(FcTap, conn)
    async with tap.running():
        await conn.deliver("$JS.FC.ORDERS.stranger.x1", headers={"Nats-Last-Stream": "1"})
    assert tap.checked == 0
    assert tap.violations == [
        "FC answer $JS.FC.ORDERS.stranger.x1 named Nats-Last-Stream 1 "
        "(Nats-Last-Consumer None): for unknown consumer stranger"
    ]


async def test_the_audit_retries_while_the_hub_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    answers: list[int | Exception] = [TimeoutError("hub down"), 5]

    async def aggregate_count(hub: Any, subject_filter: str, stream: str = "AGG") -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(jetstream, "aggregate_count", aggregate_count)
    conn = FakeConnection()
    tap = tap_of(AckTap, conn)
    async with tap.running():
        await conn.deliver(v1(5))
    assert (tap.checked, tap.violations, tap.audit_errors) == (1, [], ["TimeoutError: hub down"])


async def test_acks_queued_together_are_audited_with_one_count_per_source_taken_after_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pull consumer acks each message: the auditor answers every ack queued by the time it looks with one count
    of each source's copies (taken after them all, so still sound), not a request to the hub per ack."""
    asked: list[str] = []

    async def aggregate_count(hub: Any, subject_filter: str, stream: str = "AGG") -> int:
        asked.append(subject_filter)
        return {"edge.a.>": 2, "edge.b.>": 5}[subject_filter]

    monkeypatch.setattr(jetstream, "aggregate_count", aggregate_count)
    conn = FakeConnection()
    tap = AckTap(conn, None, {"a": "edge.a.>", "b": "edge.b.>"})  # type: ignore[arg-type]
    async with tap.running():
        for seq in (1, 2, 3):  # none of these awaits lets the auditor run: all three are queued together
            await conn.deliver(v1(seq, consumer="a"))
            await conn.deliver(v1(seq, consumer="b"))
    assert sorted(asked) == ["edge.a.>", "edge.b.>"]
    assert tap.checked == 6
    assert tap.violations == [f"ack {v1(3, consumer='a')} of origin seq 3 while the aggregate held 2 copies"]
