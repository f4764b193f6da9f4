"""``bridge.core.headers``: the origin-header policy, provenance headers and the deterministic ``Nats-Msg-Id``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.core import headers as hdr

PROVENANCE = {hdr.MSG_ID, hdr.SOURCE, hdr.STREAM, hdr.SEQ, hdr.PREV, hdr.SUBJECT, hdr.TIME}

header_names = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=20
)
reserved_names = st.tuples(
    st.sampled_from(["Nats-", "nats-", "NATS-", "nAtS-", "Bridge-", "bridge-", "BRIDGE-"]),
    st.text(alphabet="ABCabc-xyz019", max_size=10),
).map("".join)


def build(origin: dict[str, str] | None, seq: int = 57, prev: int = 56) -> dict[str, str]:
    block = hdr.build_header_block(
        origin, source="edge1", stream="ORDERS", stream_seq=seq, prev_seq=prev, subject="orders.new", timestamp_ns=99
    )
    return hdr.parse_header_block(block)


@pytest.mark.parametrize(
    "name",
    [
        "Nats-Msg-Id",
        "Nats-Expected-Last-Sequence",
        "Nats-Batch-Id",
        "Nats-Rollup",
        "Nats-TTL",
        "Nats-Stream-Source",
        "nats-msg-id",
        "NATS-SCHEDULE",
        "Bridge-Seq",
        "bridge-prev",
        "Bridge-Orig-Nats-Msg-Id",
        "Nats-",
    ],
)
def test_reserved_names_are_renamed(name: str) -> None:
    assert hdr.rename_reserved(name) == "Bridge-Orig-" + name


@pytest.mark.parametrize("name", ["X-App", "Content-Type", "Nats", "Natsy", "Bridged", "Bridge", "x-nats-id", "Status"])
def test_other_names_pass_unchanged(name: str) -> None:
    assert hdr.rename_reserved(name) == name


@given(name=st.one_of(reserved_names, header_names))
def test_rename_rule_is_a_case_insensitive_prefix_test(name: str) -> None:
    reserved = name.lower().startswith(("nats-", "bridge-"))
    assert hdr.rename_reserved(name) == ("Bridge-Orig-" + name if reserved else name)


def test_build_headers_adds_provenance() -> None:
    out = build(None)
    assert out == {
        "Nats-Msg-Id": "edge1:ORDERS:57",
        "Bridge-Source": "edge1",
        "Bridge-Stream": "ORDERS",
        "Bridge-Seq": "57",
        "Bridge-Prev": "56",
        "Bridge-Subject": "orders.new",
        "Bridge-Time": "99",
    }
    assert out[hdr.MSG_ID] == hdr.msg_id("edge1", "ORDERS", 57)


def test_msg_id_is_deterministic_and_distinct_per_origin_message() -> None:
    assert build(None)[hdr.MSG_ID] == build({"X": "other"}, prev=3)[hdr.MSG_ID]
    ids = {hdr.msg_id(src, stream, seq) for src in ("a", "b") for stream in ("S", "T") for seq in (1, 2)}
    assert len(ids) == 8


def test_origin_headers_renamed_or_kept_and_provenance_cannot_be_forged() -> None:
    origin = {
        "Nats-Msg-Id": "app-1",
        "Nats-Expected-Last-Sequence": "4",
        "Bridge-Seq": "999999",  # a forged provenance header must not move recovery
        "bridge-source": "evil",
        "X-App": "v",
        "x-lower": "w",
    }
    out = build(origin)
    assert out["Bridge-Orig-Nats-Msg-Id"] == "app-1"
    assert out["Bridge-Orig-Nats-Expected-Last-Sequence"] == "4"
    assert out["Bridge-Orig-Bridge-Seq"] == "999999"
    assert out["Bridge-Orig-bridge-source"] == "evil"
    assert out["X-App"] == "v"
    assert out["x-lower"] == "w"
    assert out[hdr.SEQ] == "57"
    assert out[hdr.SOURCE] == "edge1"
    assert out[hdr.MSG_ID] == "edge1:ORDERS:57"
    prov = hdr.parse_provenance(out)
    assert prov is not None
    assert (prov.source, prov.stream_seq) == ("edge1", 57)


# what a header value off the wire can be: no line breaks, no surrounding whitespace (the parser strips it)
wire_values = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\r\n"),
    max_size=8,
).map(str.strip)


@given(origin=st.dictionaries(st.one_of(reserved_names, header_names), wire_values, max_size=8))
def test_policy_for_any_origin_headers(origin: dict[str, str]) -> None:
    out = build(origin)
    # every origin header is kept, under its policy name, with its value
    for name, value in origin.items():
        assert out[hdr.rename_reserved(name)] == value
    # nothing reserved reaches the target but the bridge's own provenance and renamed originals
    for name in out:
        if name.lower().startswith(("nats-", "bridge-")):
            assert name in PROVENANCE or name.startswith("Bridge-Orig-")
    assert {name: out[name] for name in PROVENANCE} == build(None)


@given(
    source=header_names,
    stream=header_names,
    seq=st.integers(1, 2**63 - 1),
    prev=st.integers(0, 2**63 - 1),
    subject=st.text(
        alphabet=st.characters(min_codepoint=33, exclude_categories=["Cs", "Zs", "Zl", "Zp", "Cc"]),
        min_size=1,
        max_size=30,
    ),
    ts=st.integers(0, 2**63 - 1),
)
def test_parse_provenance_round_trip(source: str, stream: str, seq: int, prev: int, subject: str, ts: int) -> None:
    block = hdr.build_header_block(
        {"X": "y"}, source=source, stream=stream, stream_seq=seq, prev_seq=prev, subject=subject, timestamp_ns=ts
    )
    assert hdr.parse_provenance(hdr.parse_header_block(block)) == hdr.Provenance(source, stream, seq, prev, subject, ts)


@pytest.mark.parametrize(
    "headers",
    [
        None,
        {},
        {"X-App": "1"},
        {"Bridge-Source": "edge1", "Bridge-Stream": "S"},  # no Bridge-Seq
        {"Bridge-Source": "edge1", "Bridge-Seq": "5"},  # no Bridge-Stream
        {"Bridge-Source": "edge1", "Bridge-Stream": "S", "Bridge-Seq": "five"},
        {"Bridge-Source": "edge1", "Bridge-Stream": "S", "Bridge-Seq": "5", "Bridge-Prev": "x"},
    ],
)
def test_parse_provenance_of_non_copies_is_none(headers: dict[str, str] | None) -> None:
    assert hdr.parse_provenance(headers) is None


def test_parse_provenance_defaults_for_optional_fields() -> None:
    prov = hdr.parse_provenance({"Bridge-Source": "e", "Bridge-Stream": "S", "Bridge-Seq": "5"})
    assert prov == hdr.Provenance("e", "S", 5, prev_seq=0, subject="", timestamp_ns=0)


def test_aggregate_subject() -> None:
    assert hdr.aggregate_subject("orders.new", None) == "orders.new"
    assert hdr.aggregate_subject("orders.new", "") == "orders.new"
    assert hdr.aggregate_subject("orders.new", "edge1") == "edge1.orders.new"


@given(headers=st.dictionaries(header_names, wire_values, max_size=8))
def test_header_block_round_trip(headers: dict[str, str]) -> None:
    assert hdr.parse_header_block(hdr.encode_header_block(headers)) == headers


@given(
    # a bare code with headers after it ("NATS/1.0 503" then a header) is left out: nats-py folds the next line
    # into Description there; the bridge reads the status code alone (see the test below)
    status=st.sampled_from(["", " 100 FlowControl Request", " 100 Idle Heartbeat", " 404 No Messages"]),
    headers=st.dictionaries(header_names, wire_values, max_size=6),
)
@pytest.mark.anyio
async def test_header_block_parsed_as_nats_py_parses_it(status: str, headers: dict[str, str]) -> None:
    # the bridge reads header blocks itself (bridge.io.wire); it must see what nats-py's own parser would show
    from nats.aio.client import Client

    block = (f"NATS/1.0{status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
    assert hdr.parse_header_block(block) == (await Client()._process_headers(block) or {})


def test_bare_status_line() -> None:
    assert hdr.parse_header_block(b"NATS/1.0 503\r\n\r\n") == {"Status": "503"}
    assert hdr.parse_header_block(b"NATS/1.0 503\r\nX: 1\r\n\r\n") == {"Status": "503", "X": "1"}
    assert hdr.parse_header_block(b"NATS/1.0\r\nno colon\r\n bad name: 1\r\n: empty\r\n\r\n") == {}


def test_a_sources_own_copy_come_back_is_a_cycle() -> None:
    from bridge.core.headers import own_copy

    mine = {"Bridge-Source": "edge1", "Bridge-Stream": "ORDERS", "Bridge-Seq": "7"}
    assert own_copy(mine, "edge1", "ORDERS").startswith("replication cycle: this message is this source's own copy")
    assert "subject_prefix" in own_copy(mine, "edge1", "ORDERS")
    # another source's copy, the same source name on another stream (another bridge's), or no provenance at all:
    # ordinary messages (an aggregate may itself be an origin of a further hop)
    assert own_copy(mine, "edge2", "ORDERS") == ""
    assert own_copy(mine, "edge1", "OTHER") == ""
    assert own_copy({"Other": "x"}, "edge1", "ORDERS") == ""
    assert own_copy(None, "edge1", "ORDERS") == ""
