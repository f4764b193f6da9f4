"""The target side's bytes: the ``HPUB`` commands of a batch of publishes, and what each publish ack says.

Pure functions of bytes, in the core so that they are compiled with it (setup.py): they run once per message.
``bridge.io.target`` writes what :func:`encode_publishes` makes and hands what arrives on its ack inbox to
:func:`parse_pub_acks`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bridge.core.frames import Frame
from bridge.core.headers import parse_header_block
from bridge.core.pipeline import OutboundMessage, Send


@dataclass(slots=True, init=False)  # per message: a written __init__ compiles (mypyc)
class AckOutcome:
    """What the target answered to one publish attempt."""

    order: int
    attempt: int
    stored: bool
    duplicate: bool
    error: str

    def __init__(self, order: int, attempt: int, stored: bool, duplicate: bool = False, error: str = "") -> None:
        self.order = order
        self.attempt = attempt
        self.stored = stored
        self.duplicate = duplicate
        self.error = error


def parse_pub_ack(subject_tail: bytes, data: bytes, headers: Mapping[str, str] | None) -> AckOutcome | None:
    """Interpret the reply to one publish (``subject_tail`` is ``<order>.<attempt>``)."""
    # as str, ASCII only (what bytes.isdigit takes): mypyc compiles str's partition, isdigit and int() to direct
    # calls, where each bytes method is a method call by name (this runs once per replicated message)
    try:
        tail = subject_tail.decode("ascii")
    except UnicodeDecodeError:
        return None
    order_s, dot, attempt_s = tail.partition(".")
    if not (dot and order_s.isdigit() and attempt_s.isdigit()):
        return None
    order, attempt = int(order_s), int(attempt_s)
    if (
        data.startswith(b'{"stream":')
        and data.find(b'"seq":') >= 0
        and data.find(b'"error"') < 0
        and data.find(b'"duplicate"') < 0
    ):
        # the common case, a plain success: no JSON decode on the hot path (anything else takes the full path). find,
        # not "in": bytes' "in" first tries its operand as an int, and formats (then drops) a TypeError each time
        return AckOutcome(order, attempt, True)
    if not data:
        status = headers.get("Status", "") if headers else ""
        if status == "503":
            return AckOutcome(order, attempt, False, error="no responders: the target stream does not exist here")
        return AckOutcome(order, attempt, False, error=f"empty publish ack (status {status or 'none'})")
    try:
        body = json.loads(data)
    except ValueError:
        return AckOutcome(order, attempt, False, error=f"undecodable publish ack {data[:80]!r}")
    err = body.get("error")
    if err:
        text = f"{err.get('description', 'error')} (code {err.get('code')}, err_code {err.get('err_code')})"
        return AckOutcome(order, attempt, False, error=text)
    if body.get("seq") is None:
        return AckOutcome(order, attempt, False, error=f"publish ack without seq: {body!r}"[:200])
    return AckOutcome(order, attempt, True, duplicate=bool(body.get("duplicate")))


def parse_pub_acks(frames: Sequence[Frame], prefix_len: int) -> list[AckOutcome]:
    """What the acks of one read say, in order, each subject being ``<inbox>.<order>.<attempt>`` with an inbox of
    ``prefix_len - 1`` bytes (replies that are not acks are left out)."""
    outcomes: list[AckOutcome] = []
    for subject, _, header, payload in frames:
        outcome = parse_pub_ack(
            subject[prefix_len:], payload, parse_header_block(header) if header is not None and not payload else None
        )
        if outcome is not None:
            outcomes.append(outcome)
    return outcomes


def outcome_runs(outcomes: Sequence[AckOutcome]) -> list[tuple[list[tuple[int, int]], AckOutcome | None]]:
    """The acks of one read as runs, in order: the ``(order, attempt)`` tokens of consecutive stored acks, then the
    failed one that ends the run (None for the last run). The common read is one run with no failure."""
    runs: list[tuple[list[tuple[int, int]], AckOutcome | None]] = []
    tokens: list[tuple[int, int]] = []
    for outcome in outcomes:
        if outcome.stored:
            tokens.append((outcome.order, outcome.attempt))
        else:
            runs.append((tokens, outcome))
            tokens = []
    if tokens:
        runs.append((tokens, None))
    return runs


def publish_sends(batch: Sequence[Send]) -> list[tuple[OutboundMessage, int, int]]:
    """What the publisher takes for each send: the message, its order token and the attempt."""
    sends: list[tuple[OutboundMessage, int, int]] = []
    for send in batch:
        message = send.entry.message
        assert message is not None  # markers (no message) are never published
        sends.append((message, send.entry.order, send.attempt))
    return sends


def encode_publishes(
    inbox: bytes, batch: Sequence[tuple[OutboundMessage, int, int]], limit: int
) -> tuple[bytes, list[tuple[int, int, str]]]:
    """The ``HPUB`` commands of ``(message, order, attempt)`` publishes, replying to ``<inbox>.<order>.<attempt>``,
    as one write and exactly as nats-py would write each; and ``(order, attempt, why)`` for those larger than
    ``limit`` (the server's ``max_payload``), which are left out."""
    failures: list[tuple[int, int, str]] = []
    commands: list[bytes] = []
    for message, order, attempt in batch:
        payload = message.payload
        if len(payload) > limit:  # nats-py's check (the pipeline has already checked headers + payload)
            failures.append(
                (order, attempt, f"message of {len(payload)} bytes exceeds the target server's max_payload")
            )
            continue
        block = message.header_block
        size = len(block)
        commands.append(
            b"HPUB %s %s.%d.%d %d %d\r\n%s%s\r\n"
            % (message.subject.encode(), inbox, order, attempt, size, size + len(payload), block, payload)
        )
    return (commands[0] if len(commands) == 1 else b"".join(commands)), failures
