"""How one batched Direct Get's replies are taken: messages, the end of the batch, the statuses that end it with an
error (ADR-31: 204 end of batch, 404 nothing there, 408 bad request, 413 too many results, 503 no responders), and
what the end of batch says about the next request."""

from __future__ import annotations

import pytest

from bridge.io.directget import TOO_MANY_RESULTS, _Batch


def reply(seq: int, prev: int, **extra: str) -> dict[str, str]:
    """The headers the server appends to stored message ``seq``; ``prev`` is the one it sent before (0: none)."""
    return {
        "Nats-Stream": "S",
        "Nats-Subject": f"s.{seq}",
        "Nats-Sequence": str(seq),
        "Nats-Time-Stamp": "2026-11-22T14:25:16.5Z",
        "Nats-Num-Pending": "5",
        "Nats-Last-Sequence": str(prev),
        **extra,
    }


def end_of_batch(pending: int, last: int) -> dict[str, str]:
    return {"Status": "204", "Description": "EOB", "Nats-Num-Pending": str(pending), "Nats-Last-Sequence": str(last)}


def batch_of(*seqs: int, pending: int) -> _Batch:
    """A batch that received ``seqs`` (in order) and then its end, ``pending`` messages still stored after it."""
    batch = _Batch(b".1")
    prev = 0
    for seq in seqs:
        batch.take(reply(seq, prev), b"")
        prev = seq
    batch.take(end_of_batch(pending, prev), b"")
    assert batch.error is None
    return batch


def test_messages_keep_only_their_own_headers_until_the_end_of_batch() -> None:
    batch = _Batch(b".1")
    batch.take(reply(3, 0, **{"Bridge-Seq": "9"}), b"x")
    batch.take(reply(4, 3), b"")
    assert not batch.done.is_set()
    batch.take(end_of_batch(7, 4), b"")
    assert batch.done.is_set() and batch.end == "204" and batch.error is None
    assert batch.num_pending == 7
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
        ("413", TOO_MANY_RESULTS),
        ("503", "no responders: the stream does not exist here or lacks allow_direct"),
    ],
)
def test_a_status_ends_the_batch(status: str, error: str | None) -> None:
    batch = _Batch(b".1")
    batch.take({"Status": status, "Description": "Bad Request"} if status == "408" else {"Status": status}, b"")
    assert batch.done.is_set() and batch.error == error
    assert batch.end == (status if error is None else None)


def test_413_names_what_the_server_refused_and_the_fix() -> None:
    batch = _Batch(b".1")
    batch.take({"Status": "413", "Description": "Too Many Results"}, b"")
    assert batch.error is not None
    assert batch.error.startswith("413 Too Many Results: the request asked for more than the server answers at once")
    assert "lower the batch or max_bytes option" in batch.error


def test_a_server_without_batch_support_is_recognised_by_its_first_reply() -> None:
    batch = _Batch(b".1")
    old = reply(1, 0)
    del old["Nats-Num-Pending"]
    del old["Nats-Last-Sequence"]
    batch.take(old, b"x")
    assert batch.done.is_set() and batch.no_batch_support and batch.error is None


def test_the_end_of_batch_decides_whether_another_request_is_needed() -> None:
    # more stored after the batch, and the range not reached: go on after the batch's last message
    assert batch_of(10, 11, 14, pending=30).next_seq(last=100) == 15
    # nothing stored after the batch: the rest of the range was deleted up to the stream's end
    assert batch_of(10, 11, 14, pending=0).next_seq(last=100) is None
    # the batch reached the end of the range, or ran past it over deleted sequences
    assert batch_of(99, 100, pending=30).next_seq(last=100) is None
    assert batch_of(98, 103, pending=30).next_seq(last=100) is None
    nothing = _Batch(b".1")
    nothing.take({"Status": "404", "Description": "Message Not Found"}, b"")
    assert nothing.next_seq(last=100) is None


@pytest.mark.parametrize(
    ("replies", "where"),
    [
        ([reply(10, 0), reply(12, 11)], "sequence 12 after sequence 11"),  # 11 was dropped
        ([reply(10, 0), reply(11, 10), end_of_batch(0, 12)], "the end of the batch after sequence 12"),  # 12 was
        ([reply(11, 10)], "sequence 11 after sequence 10"),  # the batch's first reply was dropped
    ],
)
def test_a_lost_reply_fails_the_read_instead_of_missing_a_row(replies: list[dict[str, str]], where: str) -> None:
    batch = _Batch(b".1")
    for headers in replies:
        batch.take(headers, b"")
    assert batch.done.is_set()
    assert batch.error is not None and batch.error.startswith(f"replies lost: the server sent {where}")
