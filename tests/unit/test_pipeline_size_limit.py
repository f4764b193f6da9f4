"""The pipeline never sends a message larger than the target accepts, nor anything behind it."""

from __future__ import annotations

from bridge.core.backoff import Backoff
from bridge.core.headers import encode_header_block
from bridge.core.pipeline import OutboundMessage, PublishPipeline


def _message(size: int) -> OutboundMessage:
    return OutboundMessage("s", encode_header_block({"Nats-Msg-Id": "x"}), b"p" * size)


def _pipeline(limit: int) -> PublishPipeline:
    pipeline = PublishPipeline(window=10, ack_timeout=5.0, retry=Backoff(1.0, 4.0))
    pipeline.size_limit = limit
    return pipeline


def test_size_counts_header_block_and_payload() -> None:
    # "NATS/1.0\r\n" + "Nats-Msg-Id: x\r\n" + "\r\n" + payload
    assert _message(100).size == len(b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n") + 100


def test_oversize_message_is_not_sent_and_nothing_after_it() -> None:
    pipeline = _pipeline(limit=200)
    for seq, size in ((1, 10), (2, 500), (3, 10)):
        pipeline.add(seq, _message(size))
    sent = pipeline.take_sendable(now=0.0)
    assert [s.entry.stream_seq for s in sent] == [1]
    blocked = pipeline.blocked
    assert blocked is not None and blocked.stream_seq == 2 and "exceeds the target's limit of 200" in blocked.reason
    assert pipeline.take_sendable(now=1.0) == []  # no retry overtakes 1, still in flight
    assert pipeline.failures == 1
    assert pipeline.stored(sent[0].entry.order, 1, 0.0)
    assert pipeline.watermark == 1
    # retried with backoff, still refused without being sent while the limit stays
    assert pipeline.take_sendable(now=1.0) == []
    assert pipeline.failures == 2


def test_raising_the_limit_unblocks_in_order() -> None:
    pipeline = _pipeline(limit=200)
    for seq, size in ((1, 500), (2, 10)):
        pipeline.add(seq, _message(size))
    assert pipeline.take_sendable(now=0.0) == []
    pipeline.size_limit = 1000
    probe = pipeline.take_sendable(now=1.0)
    assert [s.entry.stream_seq for s in probe] == [1]
    assert pipeline.stored(probe[0].entry.order, probe[0].attempt, 0.0)
    rest = pipeline.take_sendable(now=1.0)
    assert [s.entry.stream_seq for s in rest] == [2]
    assert pipeline.stored(rest[0].entry.order, rest[0].attempt, 0.0)
    assert pipeline.watermark == 2 and pipeline.blocked is None


def test_no_limit_known_sends_everything() -> None:
    pipeline = _pipeline(limit=0)
    pipeline.add(1, _message(10_000_000))
    assert len(pipeline.take_sendable(now=0.0)) == 1


def test_a_message_that_must_never_be_published_blocks_like_an_oversize_one() -> None:
    pipeline = _pipeline(limit=0)  # no size limit known: the refusal is the message's own
    pipeline.add(1, _message(10))
    pipeline.add(2, OutboundMessage("s", b"", b"p", unsendable="replication cycle: ..."))
    pipeline.add(3, _message(10))
    sent = pipeline.take_sendable(now=0.0)
    assert [s.entry.stream_seq for s in sent] == [1]
    blocked = pipeline.blocked
    assert blocked is not None and blocked.stream_seq == 2 and blocked.reason == "replication cycle: ..."
    assert pipeline.stored(sent[0].entry.order, 1, 0.0) and pipeline.watermark == 1
    for now in (10.0, 100.0, 1000.0):  # probed again and again, never sent, nothing behind it either
        assert pipeline.take_sendable(now=now) == []
    assert pipeline.watermark == 1 and pipeline.blocked is not None
