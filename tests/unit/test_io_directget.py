"""How one batched Direct Get's replies are taken: messages, the end of the batch, and the statuses that end it
with an error (ADR-31: 204 end of batch, 404 nothing there, 408 bad request, 503 no responders)."""

from __future__ import annotations

import pytest

from bridge.io.directget import _Batch


def reply(seq: int, **extra: str) -> dict[str, str]:
    return {
        "Nats-Stream": "S",
        "Nats-Subject": f"s.{seq}",
        "Nats-Sequence": str(seq),
        "Nats-Time-Stamp": "2026-11-22T14:25:16.5Z",
        "Nats-Num-Pending": "5",
        "Nats-Last-Sequence": str(seq - 1),
        **extra,
    }


def test_messages_keep_only_their_own_headers_until_the_end_of_batch() -> None:
    batch = _Batch(b".1")
    batch.take(reply(3, **{"Bridge-Seq": "9"}), b"x")
    batch.take(reply(4), b"")
    assert not batch.done.is_set()
    batch.take({"Status": "204", "Description": "EOB"}, b"")
    assert batch.done.is_set() and batch.end == "204" and batch.error is None
    assert [(m.seq, m.subject, m.headers, m.payload) for m in batch.messages] == [
        (3, "s.3", {"Bridge-Seq": "9"}, b"x"),
        (4, "s.4", {}, b""),
    ]
    assert batch.messages[0].time == "2026-11-22T14:25:16.5Z"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        ("404", None),
        ("408", "status 408 Bad Request"),
        ("503", "no responders: the stream does not exist here or lacks allow_direct"),
    ],
)
def test_a_status_ends_the_batch(status: str, error: str | None) -> None:
    batch = _Batch(b".1")
    batch.take({"Status": status, "Description": "Bad Request"} if status == "408" else {"Status": status}, b"")
    assert batch.done.is_set() and batch.error == error
    assert batch.end == (status if error is None else None)


def test_a_server_without_batch_support_is_recognised_by_its_first_reply() -> None:
    batch = _Batch(b".1")
    old = reply(1)
    del old["Nats-Num-Pending"]
    batch.take(old, b"x")
    assert batch.done.is_set() and batch.no_batch_support
