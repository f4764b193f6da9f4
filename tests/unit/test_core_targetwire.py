"""``bridge.core.targetwire``: every shape of publish ack, the no-decode fast path agreeing with JSON, and HPUB."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bridge.core.targetwire import AckOutcome, parse_pub_ack


def reply(data: bytes, headers: dict[str, str] | None = None) -> tuple[bytes, dict[str, str] | None]:
    return data, headers


def test_success_duplicate_and_errors() -> None:
    assert parse_pub_ack(b"7.2", *reply(b'{"stream":"AGG","seq":5}')) == AckOutcome(7, 2, True)
    assert parse_pub_ack(b"7.2", *reply(b'{"stream":"AGG","domain":"hub","seq":5,"duplicate":true}')) == AckOutcome(
        7, 2, True, duplicate=True
    )
    err = parse_pub_ack(
        b"7.2",
        *reply(b'{"error":{"code":503,"err_code":10077,"description":"maximum messages exceeded"},"stream":"AGG"}'),
    )
    assert err is not None and not err.stored and "maximum messages exceeded" in err.error
    gone = parse_pub_ack(b"7.2", *reply(b"", {"Status": "503"}))
    assert gone is not None and not gone.stored and "no responders" in gone.error
    assert parse_pub_ack(b"x.2", *reply(b"{}")) is None
    odd = parse_pub_ack(b"7.2", *reply(b"not json"))
    assert odd is not None and not odd.stored
    noseq = parse_pub_ack(b"7.2", *reply(b'{"stream":"AGG"}'))
    assert noseq is not None and not noseq.stored


def _slow(body: dict[str, Any]) -> tuple[bool, bool]:
    # the definition: stored unless an error or no seq; duplicate as the server says
    return (not body.get("error") and body.get("seq") is not None, bool(body.get("duplicate")))


@given(
    st.fixed_dictionaries(
        {"stream": st.sampled_from(["AGG", "A-B_c"]), "seq": st.integers(1, 2**63)},
        optional={
            "domain": st.sampled_from(["hub", "x"]),
            "duplicate": st.booleans(),
            "error": st.fixed_dictionaries(
                {"code": st.integers(400, 503), "err_code": st.integers(10000, 10300), "description": st.text()}
            ),
        },
    )
)
def test_fast_path_agrees_with_decoding(body: dict[str, Any]) -> None:
    for encoded in (json.dumps(body, separators=(",", ":")), json.dumps(body)):
        outcome = parse_pub_ack(b"1.1", *reply(encoded.encode()))
        assert outcome is not None
        assert (outcome.stored, outcome.duplicate if outcome.stored else bool(body.get("duplicate"))) == _slow(body)


@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True),
        st.from_regex(r"[ -~]{0,30}", fullmatch=True).map(str.strip),
        max_size=8,
    ),
    st.binary(max_size=300),
    st.lists(st.tuples(st.integers(1, 10**12), st.integers(1, 1000)), min_size=1, max_size=4),
)
def test_raw_publish_encodes_exactly_as_nats_py(
    headers: dict[str, str], payload: bytes, tokens: list[tuple[int, int]]
) -> None:
    from nats.protocol.command import hpub_cmd

    from bridge.core.headers import encode_header_block
    from bridge.core.pipeline import OutboundMessage
    from bridge.core.targetwire import encode_publishes, reply_subject

    block = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    assert encode_header_block(headers) == block.encode()
    message = OutboundMessage("agg.s.x", encode_header_block(headers), payload)
    batch = [(message, order, attempt, 0, 0, 0, 0) for order, attempt in tokens]
    data, failures = encode_publishes(b"_INBOX.a", batch, limit=len(payload))
    assert failures == []
    assert data == b"".join(
        hpub_cmd("agg.s.x", f"_INBOX.a.{order}.{attempt}", block.encode(), payload) for order, attempt in tokens
    )
    # as members of fast batch 7 (start, then appends): the same, replying to the member's batch subject
    members = [(message, order, attempt, 7, i, 0 if i == 1 else 1, 16) for i, (order, attempt) in enumerate(tokens, 1)]
    data, failures = encode_publishes(b"_INBOX.a", members, limit=len(payload), batch_base=b"B")
    assert failures == []
    assert data == b"".join(
        hpub_cmd("agg.s.x", reply_subject("_INBOX.a", "B", m), block.encode(), payload) for m in members
    )
    assert not members or reply_subject("_INBOX.a", "B", members[0]).endswith(".B-7.16.fail.1.0.$FI")
    # over the server's max_payload: left out, reported
    data, failures = encode_publishes(b"_INBOX.a", batch, limit=len(payload) - 1)
    assert (data, [f[:2] for f in failures]) == (b"", tokens) if payload else True


def test_a_read_of_acks_becomes_runs_of_stored_tokens_each_ended_by_its_failure() -> None:
    from bridge.core.targetwire import outcome_runs

    ok = [AckOutcome(1, 1, True), AckOutcome(2, 1, True, duplicate=True)]
    assert outcome_runs(ok) == [([(1, 1), (2, 1)], None)]
    refused = AckOutcome(3, 2, False, error="maximum messages exceeded")
    assert outcome_runs([*ok, refused, AckOutcome(4, 1, True)]) == [([(1, 1), (2, 1)], refused), ([(4, 1)], None)]
    assert outcome_runs([refused, refused]) == [([], refused), ([], refused)]
    assert outcome_runs([]) == []


TAILS = [b"7.2", b"12.1", b"7.", b".2", b"7.2.1", b"\xc2\xb2.1", b"+7.2", b"7 .2"]


@given(st.binary(max_size=12) | st.sampled_from(TAILS))
def test_the_order_and_attempt_are_read_as_bytes_of_ascii_digits(tail: bytes) -> None:
    # the subject tail is taken as str for speed: what it accepts is what bytes' own partition and isdigit accept
    order, dot, attempt = tail.partition(b".")
    expected = (int(order), int(attempt)) if dot and order.isdigit() and attempt.isdigit() else None
    outcome = parse_pub_ack(tail, b'{"stream":"AGG","seq":5}', None)
    assert (None if outcome is None else (outcome.order, outcome.attempt)) == expected


# -- fast batch replies (nats-server 2.14+: server/stream.go, BatchFlowAck / BatchFlowGap / BatchFlowErr) ----------

BATCH_TAIL = b"12.1.Bx-3.1.fail.5.1.$FI"  # order 12, attempt 1, batch 3, member 5, append


def test_a_flow_ack_stores_the_batch_through_its_sequence() -> None:
    from bridge.core.targetwire import parse_pub_ack

    outcome = parse_pub_ack(BATCH_TAIL, b'{"type":"ack","seq":5,"msgs":1}', None)
    assert outcome is not None
    assert (outcome.order, outcome.attempt, outcome.stored, outcome.batch, outcome.bseq, outcome.through) == (
        12,
        1,
        True,
        3,
        5,
        5,
    )
    assert not outcome.ended


def test_batch_refusals_gaps_and_commits_say_where_the_batch_ends() -> None:
    from bridge.core.targetwire import parse_pub_ack

    refused = parse_pub_ack(
        BATCH_TAIL,
        b'{"error":{"code":400,"err_code":10208,"description":"batch publish ID unknown"},"stream":"A"}',
        None,
    )
    assert refused is not None and not refused.stored and refused.bseq == 5 and refused.code == 10208
    assert "batch publish ID unknown" in refused.error
    gap = parse_pub_ack(BATCH_TAIL, b'{"type":"gap","last_seq":4,"seq":5}', None)
    assert gap is not None and not gap.stored and gap.bseq == 4 and gap.ended
    err = parse_pub_ack(
        BATCH_TAIL, b'{"type":"err","seq":5,"error":{"code":400,"err_code":10071,"description":"bad"}}', None
    )
    assert err is not None and not err.stored and err.bseq == 5 and err.code == 10071
    no_responders = parse_pub_ack(BATCH_TAIL, b"", {"Status": "503"})
    assert no_responders is not None and not no_responders.stored and no_responders.bseq == 5
    commit = parse_pub_ack(BATCH_TAIL, b'{"stream":"A","seq":90,"batch":"Bx-3","count":4}', None)
    assert commit is not None and commit.stored and commit.through == 4 and commit.ended
    # the commit's ack is not mistaken for a plain publish's (it would store member 5 by its order token)
    assert commit.batch == 3


def test_an_id_in_process_is_explained_plain_or_in_a_batch() -> None:
    # what an operator reads in publish.blocked: why the aggregate refuses, and that the wait ends by itself
    body = b'{"error":{"code":409,"err_code":10158,"description":"duplicate message id is in process"}}'
    for outcome in (parse_pub_ack(b"7.2", body, None), parse_pub_ack(BATCH_TAIL, body, None)):
        assert outcome is not None and not outcome.stored
        assert outcome.error.startswith("duplicate message id is in process (code 409, err_code 10158): ")
        assert "until the aggregate's duplicate_window ends" in outcome.error
    plain = parse_pub_ack(b"7.2", b'{"error":{"code":400,"err_code":10071,"description":"bad"}}', None)
    assert plain is not None and plain.error == "bad (code 400, err_code 10071)"


def test_a_batch_reply_subject_that_is_not_ours_is_left_out() -> None:
    from bridge.core.targetwire import parse_pub_ack

    assert parse_pub_ack(b"12.1.Bx.1.fail.5.1.$FI", b'{"type":"ack","seq":5,"msgs":1}', None) is None
    assert parse_pub_ack(b"x.1.Bx-3.1.fail.5.1.$FI", b'{"type":"ack","seq":5,"msgs":1}', None) is None
