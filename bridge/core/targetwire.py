"""The target side's bytes: the ``HPUB`` commands of a batch of publishes, and what each publish ack says.

Pure functions of bytes, in the core so that they are compiled with it (setup.py): they run once per message.
``bridge.io.target`` writes what :func:`encode_publishes` makes and hands what arrives on its ack inbox to
:func:`parse_pub_acks`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from bridge.core.frames import Frame
from bridge.core.headers import parse_header_block
from bridge.core.pipeline import BATCH_COMMIT_EOB, OutboundMessage, Send
from bridge.core.pipeline import AckOutcome as AckOutcome  # where the runtime finds it

BATCH_SUFFIX = ".$FI"  # what makes a reply subject a fast batch member's (nats-server 2.14+)
_FLOW_ACK = b'{"type":"ack","seq":'


def parse_pub_ack(subject_tail: bytes, data: bytes, headers: Mapping[str, str] | None) -> AckOutcome | None:
    """Interpret the reply to one publish (``subject_tail`` is ``<order>.<attempt>``)."""
    # as str, ASCII only (what bytes.isdigit takes): mypyc compiles str's partition, isdigit and int() to direct
    # calls, where each bytes method is a method call by name (this runs once per replicated message)
    try:
        tail = subject_tail.decode("ascii")
    except UnicodeDecodeError:
        return None
    if tail.endswith(BATCH_SUFFIX):
        return parse_batch_reply(tail, data, headers)
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
        return AckOutcome(order, attempt, False, error=error_text(err))
    if body.get("seq") is None:
        return AckOutcome(order, attempt, False, error=f"publish ack without seq: {body!r}"[:200])
    return AckOutcome(order, attempt, True, duplicate=bool(body.get("duplicate")))


ID_IN_PROCESS = 10158  # "duplicate message id is in process"
_IN_PROCESS_WHY = (
    "a leader of the aggregate still marks this id from a proposal lost when leadership moved; it refuses the id "
    "until the aggregate's duplicate_window ends, then the re-send is stored"
)


def error_text(err: Mapping[str, Any]) -> str:
    """A publish ack's error as the bridge reports it: the server's words and codes, and for an id "in process"
    (which a person could not place) what it means."""
    code = err.get("err_code")
    text = f"{err.get('description', 'error')} (code {err.get('code')}, err_code {code})"
    return f"{text}: {_IN_PROCESS_WHY}" if code == ID_IN_PROCESS else text


def parse_batch_reply(tail: str, data: bytes, headers: Mapping[str, str] | None) -> AckOutcome | None:
    """Interpret what the server sent to a fast batch member's reply subject, ``tail`` being
    ``<order>.<attempt>.<base>-<batch>.<flow>.fail.<batch seq>.<op>.$FI``: a cumulative flow ack, the commit's
    publish ack (``count``), a gap or error report, or a refusal of the member itself (see ``AckOutcome``)."""
    # found by position, not split into its eight tokens: this runs once per stored member (mypyc compiles str.find
    # and slicing to direct calls)
    first = tail.find(".")
    second = tail.find(".", first + 1)
    third = tail.find(".", second + 1)  # after the batch id, <base>-<batch>
    dash = tail.rfind("-", second + 1, third)
    op_dot = tail.rfind(".", 0, len(tail) - len(BATCH_SUFFIX))
    seq_dot = tail.rfind(".", 0, op_dot)
    if first <= 0 or second < 0 or third < 0 or dash < 0 or seq_dot <= third:
        return None
    order_s, attempt_s = tail[:first], tail[first + 1 : second]
    batch_s, bseq_s = tail[dash + 1 : third], tail[seq_dot + 1 : op_dot]
    if not (order_s.isdigit() and attempt_s.isdigit() and batch_s.isdigit() and bseq_s.isdigit()):
        return None
    order, attempt, batch, bseq = int(order_s), int(attempt_s), int(batch_s), int(bseq_s)
    if data.startswith(_FLOW_ACK):
        # the common case, one per stored member: members up to seq are stored
        end = data.find(b",", len(_FLOW_ACK))
        digits = data[len(_FLOW_ACK) : end if end >= 0 else len(data) - 1]
        if digits.isdigit():
            return AckOutcome(order, attempt, True, batch=batch, bseq=bseq, through=int(digits))
    if not data:
        status = headers.get("Status", "") if headers else ""
        why = "no responders: the target stream does not exist here" if status == "503" else "empty publish ack"
        return AckOutcome(order, attempt, False, error=f"{why} (status {status or 'none'})", batch=batch, bseq=bseq)
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        error = f"undecodable batch reply {data[:80]!r}"
        return AckOutcome(order, attempt, False, error=error, batch=batch, bseq=bseq)
    kind = body.get("type")
    if kind == "ack":
        return AckOutcome(order, attempt, True, batch=batch, bseq=bseq, through=int(body.get("seq") or 0))
    if kind == "gap":
        # members from last_seq on were lost on their way: in gap-fail mode the server ended the batch there
        first = int(body.get("last_seq") or bseq)
        return AckOutcome(
            order, attempt, False, error=f"batch member {first} lost on its way", batch=batch, bseq=first, ended=True
        )
    err = body.get("error")
    if err:
        if not isinstance(err, dict):
            err = {}
        code = int(err.get("err_code") or 0)
        text = error_text(err)
        first = int(body.get("seq") or bseq) if kind == "err" else bseq
        return AckOutcome(order, attempt, False, error=text, batch=batch, bseq=first, ended=True, code=code)
    if "count" in body:  # the commit's publish ack: members 1..count are stored, none after
        count = int(body.get("count") or 0)
        duplicate = bool(body.get("duplicate"))
        return AckOutcome(order, attempt, True, duplicate, batch=batch, bseq=bseq, through=count, ended=True)
    error = f"unexpected batch reply: {body!r}"[:200]
    return AckOutcome(order, attempt, False, error=error, batch=batch, bseq=bseq)


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


# one publish as the publisher takes it: the message, its order token, the attempt, and (0 for a plain publish) the
# fast batch, the member's batch sequence, the batch operation and the members per flow ack (``Send``)
Publication = tuple[OutboundMessage, int, int, int, int, int, int]


def publish_sends(batch: Sequence[Send]) -> list[Publication]:
    """What the publisher takes for each send."""
    sends: list[Publication] = []
    for send in batch:
        message = send.entry.message
        assert message is not None  # markers (no message) are never published
        sends.append((message, send.entry.order, send.attempt, send.batch, send.bseq, send.op, send.flow))
    return sends


def reply_subject(inbox: str, batch_base: str, publication: Publication) -> str:
    """The reply subject of one publication: ``<inbox>.<order>.<attempt>``, a fast batch member's with its batch
    id (``<batch_base>-<batch>``, unique on the stream as long as ``batch_base`` is), flow (members per ack at
    most), gap mode ``fail``, batch sequence and operation."""
    _, order, attempt, batch, bseq, op, flow = publication
    if not batch:
        return f"{inbox}.{order}.{attempt}"
    return _batch_reply(inbox.encode(), batch_base.encode(), order, attempt, batch, bseq, op, flow).decode()


def _batch_reply(
    inbox: bytes, batch_base: bytes, order: int, attempt: int, batch: int, bseq: int, op: int, flow: int
) -> bytes:
    """A fast batch member's reply subject (nats-server parses it from the end: ``<prefix>.<batch id>.<flow>.<gap
    mode>.<batch seq>.<op>.$FI``; the prefix carries the order token and the attempt, as a plain publish's does)."""
    return b"%s.%d.%d.%s-%d.%d.fail.%d.%d.$FI" % (inbox, order, attempt, batch_base, batch, flow, bseq, op)


def encode_publishes(
    inbox: bytes, batch: Sequence[Publication], limit: int, batch_base: bytes = b""
) -> tuple[bytes, list[tuple[int, int, str]]]:
    """The ``HPUB`` commands of the publications, replying as :func:`reply_subject` says, as one write and exactly
    as nats-py would write each; and ``(order, attempt, why)`` for those larger than ``limit`` (the server's
    ``max_payload``), which are left out. A batch commit (end of batch) is a ``PUB`` with no payload."""
    failures: list[tuple[int, int, str]] = []
    commands: list[bytes] = []
    # subjects as bytes the way they were transformed: a subject transform slicing a token of non-ASCII text in its
    # UTF-8 bytes (as the server does) carries the cut bytes as surrogates (bridge.core.transforms)
    for message, order, attempt, number, bseq, op, flow in batch:
        payload = message.payload
        if number and op == BATCH_COMMIT_EOB:
            reply = _batch_reply(inbox, batch_base, order, attempt, number, bseq, op, flow)
            commands.append(b"PUB %s %s 0\r\n\r\n" % (message.subject.encode("utf-8", "surrogateescape"), reply))
            continue
        if len(payload) > limit:  # nats-py's check (the pipeline has already checked headers + payload)
            failures.append(
                (order, attempt, f"message of {len(payload)} bytes exceeds the target server's max_payload")
            )
            continue
        block = message.header_block
        size = len(block)
        if not number:  # one format for the common command (this runs once per replicated message)
            commands.append(
                b"HPUB %s %s.%d.%d %d %d\r\n%s%s\r\n"
                % (
                    message.subject.encode("utf-8", "surrogateescape"),
                    inbox,
                    order,
                    attempt,
                    size,
                    size + len(payload),
                    block,
                    payload,
                )
            )
            continue
        reply = _batch_reply(inbox, batch_base, order, attempt, number, bseq, op, flow)
        commands.append(
            b"HPUB %s %s %d %d\r\n%s%s\r\n"
            % (message.subject.encode("utf-8", "surrogateescape"), reply, size, size + len(payload), block, payload)
        )
    return (commands[0] if len(commands) == 1 else b"".join(commands)), failures
