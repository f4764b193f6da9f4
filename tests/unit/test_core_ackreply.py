"""``bridge.core.ackreply``: the v1 and v2 ``$JS.ACK`` subjects of pushed data messages (docs/protocol.md 2.1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core.ackreply import AckInfo, parse_ack_subject

# asset names: no dots, wildcards or whitespace
names = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
numbers = st.integers(0, 2**63 - 1)


def test_v1_nine_tokens() -> None:
    info = parse_ack_subject("$JS.ACK.ORDERS.BRIDGE.1.57.12.1700000000000000000.3")
    assert info == AckInfo(
        stream="ORDERS",
        consumer="BRIDGE",
        delivered=1,
        stream_seq=57,
        consumer_seq=12,
        timestamp_ns=1700000000000000000,
        pending=3,
        domain=None,
        account_hash=None,
    )


def test_v2_eleven_tokens_with_domain() -> None:
    info = parse_ack_subject("$JS.ACK.leaf.AbCd1234.ORDERS.BRIDGE.2.57.12.1700000000000000000.0")
    assert info == AckInfo("ORDERS", "BRIDGE", 2, 57, 12, 1700000000000000000, 0, "leaf", "AbCd1234")


def test_v2_underscore_domain_means_none() -> None:
    info = parse_ack_subject("$JS.ACK._.AbCd1234.ORDERS.BRIDGE.1.5.5.99.0")
    assert info is not None
    assert info.domain is None
    assert info.account_hash == "AbCd1234"
    assert (info.stream_seq, info.consumer_seq) == (5, 5)


def test_v2_twelve_tokens_ignores_the_random_suffix() -> None:
    # ADR-15 reserves a trailing random token: clients must accept 11 or 12 tokens
    eleven = parse_ack_subject("$JS.ACK.hub.AbCd1234.ORDERS.BRIDGE.1.5.4.99.7")
    twelve = parse_ack_subject("$JS.ACK.hub.AbCd1234.ORDERS.BRIDGE.1.5.4.99.7.xYz9")
    assert eleven is not None
    assert twelve == eleven


@pytest.mark.parametrize(
    "subject",
    [
        "",
        "$JS.ACK",
        "$JS.ACK.",
        "$JS.FC.ORDERS.BRIDGE.abcd",  # a flow-control subject is not an ack subject
        "_INBOX.abc.def",
        "$JS.ACK.ORDERS.BRIDGE.1.57.12.1700",  # 8 tokens
        "$JS.ACK.hub.AbCd1234.ORDERS.BRIDGE.1.57.12.1700",  # 10 tokens
        "$JS.ACK.hub.AbCd1234.ORDERS.BRIDGE.1.57.12.1700.0.rnd.extra",  # 13 tokens
        "$JS.ACK.ORDERS.BRIDGE.one.57.12.1700.3",  # not a number
        "$JS.ACK.ORDERS.BRIDGE.1.57.12.1700.",  # empty token
        "$JS.ACK.ORDERS.BRIDGE.1.5x.12.1700.3",
        "$JS.ACK.hub.AbCd1234.ORDERS.BRIDGE.1.57.x.1700.0",
        "$js.ack.ORDERS.BRIDGE.1.57.12.1700.3",  # subjects are case-sensitive
        "X$JS.ACK.ORDERS.BRIDGE.1.57.12.1700.3",
    ],
)
def test_malformed_subjects_are_none(subject: str) -> None:
    assert parse_ack_subject(subject) is None


@given(stream=names, consumer=names, d=numbers, s=numbers, c=numbers, t=numbers, p=numbers)
def test_v1_round_trip(stream: str, consumer: str, d: int, s: int, c: int, t: int, p: int) -> None:
    assert parse_ack_subject(f"$JS.ACK.{stream}.{consumer}.{d}.{s}.{c}.{t}.{p}") == AckInfo(
        stream, consumer, d, s, c, t, p
    )


@given(
    domain=st.one_of(st.just("_"), names),
    acc=names,
    stream=names,
    consumer=names,
    nums=st.tuples(numbers, numbers, numbers, numbers, numbers),
    suffix=st.one_of(st.just(""), names.map(lambda n: "." + n)),
)
def test_v2_round_trip(
    domain: str, acc: str, stream: str, consumer: str, nums: tuple[int, int, int, int, int], suffix: str
) -> None:
    d, s, c, t, p = nums
    info = parse_ack_subject(f"$JS.ACK.{domain}.{acc}.{stream}.{consumer}.{d}.{s}.{c}.{t}.{p}{suffix}")
    expected_domain = None if domain == "_" else domain
    assert info == AckInfo(stream, consumer, d, s, c, t, p, expected_domain, acc)


@given(st.text(max_size=80))
def test_never_raises(subject: str) -> None:
    parse_ack_subject(subject)


@pytest.mark.parametrize(
    "subject",
    [
        "$JS.ACK.ORDERS.BRIDGE.1.-5.12.1700.3",
        "$JS.ACK.ORDERS.BRIDGE.1.+5.12.1700.3",
        "$JS.ACK.ORDERS.BRIDGE.1.1_0.12.1700.3",
    ],
)
def test_signed_or_underscored_numbers_are_malformed(subject: str) -> None:
    """Regression (fixed in d720488): numeric tokens went through ``int()`` alone, which also takes ``-5``, ``+5``,
    ``1_0`` and non-ASCII digits. The server never sends these; robustness only."""
    assert parse_ack_subject(subject) is None
