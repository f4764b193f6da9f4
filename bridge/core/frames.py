"""The NATS protocol's message frames (``MSG``/``HMSG``), taken off a read's bytes for the hot subscriptions, and
the ``PUB`` commands of pull mode's acks.

Pure functions of bytes, in the core so that they are compiled with it (setup.py): every delivery and every publish
ack passes through :func:`take_messages`. ``bridge.io.wire`` calls it first on each stretch of a read and parses
whatever it leaves (protocol lines, other subscriptions' messages, an incomplete frame, anything malformed) the
way nats-py would.
"""

from __future__ import annotations

from collections.abc import Sequence

Frame = tuple[bytes, bytes, bytes | None, bytes]
"""``(subject, reply, header block or None, payload)`` of one message, as it came off the wire."""

_MSG = 77  # "M"
_HMSG = 72  # "H"


MsgLine = tuple[bytes, int, bytes, int, int]
"""``(subject, subscription id, reply, header block size, total size)`` of a ``MSG``/``HMSG`` control line."""


def parse_msg_line(line: bytes) -> MsgLine | None:
    """The fields of a ``MSG``/``HMSG`` control line (without its CRLF); None when it is not a well-formed one (a
    wrong field count or operation, a number that is not one, a header block larger than the message)."""
    args = line.split()
    count = len(args)
    if not count:
        return None
    op = args[0]
    try:
        if op == b"HMSG" and (count == 6 or count == 5):
            reply = args[3] if count == 6 else b""
            header_size = int(args[count - 2])
        elif op == b"MSG" and (count == 5 or count == 4):
            reply = args[3] if count == 5 else b""
            header_size = 0
        else:
            return None
        sid = int(args[2])
        total = int(args[count - 1])
    except ValueError:
        return None
    if not 0 <= header_size <= total:
        return None
    return args[1], sid, reply, header_size, total


def take(sink: list[Frame]) -> list[Frame]:
    """What has been appended to ``sink`` (the frames one read took for a subscription), leaving it empty: the
    parser keeps appending to that very list, so it is copied and cleared, never replaced."""
    frames = sink.copy()
    sink.clear()
    return frames


def take_messages(buf: bytes, pos: int, sinks: dict[int, list[Frame]], filled: list[int]) -> int:
    """Append the complete message frames at ``buf[pos:]`` whose subscription id has a list in ``sinks`` to that
    list, in order; return the position of the first thing not taken (``len(buf)`` when it took everything).
    A subscription id whose list was empty is appended to ``filled`` with its first frame: the caller hands over
    only the lists a read filled, not every one of a connection's many subscriptions.

    It stops at anything else: a protocol line, a message of another subscription, a frame not complete in
    ``buf``, a malformed control line. What it has taken is exactly what nats-py's parser would have delivered.
    """
    end = len(buf)
    while pos < end:
        first = buf[pos]
        if first != _MSG and first != _HMSG:
            return pos
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return pos
        fields = parse_msg_line(buf[pos:eol])
        if fields is None:
            return pos  # the caller's parser reports it
        subject, sid, reply, header_size, total = fields
        sink = sinks.get(sid)
        if sink is None:
            return pos
        start = eol + 2
        stop = start + total
        if stop + 2 > end:
            return pos
        body = start + header_size
        if not sink:
            filled.append(sid)
        sink.append((subject, reply, buf[start:body] if header_size else None, buf[body:stop]))
        pos = stop + 2
    return pos


def encode_acks(replies: Sequence[str]) -> bytes:
    """The ``PUB`` commands of explicit acks (an empty message to each delivery's ``$JS.ACK`` reply subject), as one
    write and exactly as nats-py writes each."""
    return b"".join([b"PUB %s  0\r\n\r\n" % reply.encode() for reply in replies])


def encode_answer(subject: str, last_consumer: int, last_stream: int) -> bytes:
    """The command of one flow-control answer, from an ``AnswerFlowControl``'s fields, exactly as nats-py writes
    ``publish(subject, b"", headers=answer.headers)``: an ``HPUB`` naming a position when both numbers are positive
    (``AnswerFlowControl.acks``), else an empty ``PUB``. Encoded from the numbers, not through a headers dict: it
    runs for almost every message at 1 msg/s per source."""
    if last_consumer <= 0 or last_stream <= 0:
        return b"PUB %s  0\r\n\r\n" % subject.encode()
    block = b"NATS/1.0\r\nNats-Last-Consumer: %d\r\nNats-Last-Stream: %d\r\n\r\n" % (last_consumer, last_stream)
    return b"HPUB %s  %d %d\r\n%s\r\n" % (subject.encode(), len(block), len(block), block)
