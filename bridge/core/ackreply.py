"""Parsing of the JetStream ack subject that rides on every pushed data message.

For ``ack_policy: flow_control`` nobody listens on this subject; it is pure metadata telling which stream and
consumer sent the message, its stream sequence, its delivery sequence within the current consumer epoch, the
store time and the pending count. Two layouts exist (docs/protocol.md section 2.1, ADR-15,
https://github.com/nats-io/nats-architecture-and-design/blob/main/adr/ADR-15.md):

* v1, 9 tokens: ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts_ns>.<pending>``
* v2, 11 or 12 tokens: ``$JS.ACK.<domain|_>.<account_hash>.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts_ns>
  .<pending>[.<random>]``
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, init=False)  # per message: a written __init__ compiles (mypyc)
class AckInfo:
    """What a data message's ack subject says about it."""

    stream: str
    consumer: str
    delivered: int
    stream_seq: int
    consumer_seq: int
    timestamp_ns: int
    pending: int
    domain: str | None
    account_hash: str | None

    def __init__(
        self,
        stream: str,
        consumer: str,
        delivered: int,
        stream_seq: int,
        consumer_seq: int,
        timestamp_ns: int,
        pending: int,
        domain: str | None = None,
        account_hash: str | None = None,
    ) -> None:
        self.stream = stream
        self.consumer = consumer
        self.delivered = delivered
        self.stream_seq = stream_seq
        self.consumer_seq = consumer_seq
        self.timestamp_ns = timestamp_ns
        self.pending = pending
        self.domain = domain
        self.account_hash = account_hash


def parse_ack_subject(subject: str) -> AckInfo | None:
    """Parse a v1 or v2 ``$JS.ACK`` subject; ``None`` when it is not one (wrong prefix, token count or numbers)."""
    if not subject.startswith("$JS.ACK."):
        return None
    tokens = subject.split(".")
    n = len(tokens)
    domain: str | None
    account_hash: str | None
    if n == 9:
        domain = account_hash = None
        base = 2
    elif n == 11 or n == 12:
        domain = None if tokens[2] == "_" else tokens[2]
        account_hash = tokens[3]
        base = 4
    else:
        return None
    delivered, sseq, dseq, ts, pending = tokens[base + 2 : base + 7]
    # one check over all five numbers (this runs once per replicated message): int() alone would also take
    # "+5", " 5", "1_0" or non-ASCII digits
    digits = delivered + sseq + dseq + ts + pending
    if not (digits.isascii() and digits.isdigit()):
        return None
    try:
        return AckInfo(
            tokens[base],
            tokens[base + 1],
            int(delivered),
            int(sseq),
            int(dseq),
            int(ts),
            int(pending),
            domain,
            account_hash,
        )
    except ValueError:  # an empty token
        return None
