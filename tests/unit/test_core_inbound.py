"""``bridge.core.inbound.classify``: data, FC requests, heartbeats and everything else on the deliver subject.

Inputs are shaped as nats-py hands them to a plain subscription (docs/protocol.md section 9): the status line
becomes the pseudo-headers ``Status``/``Description``; a data message's reply is its ``$JS.ACK`` subject.
"""

from __future__ import annotations

import pytest

from bridge.core.ackreply import parse_ack_subject
from bridge.core.inbound import Data, FlowControlRequest, Heartbeat, Unrecognised, classify

ACK = "$JS.ACK.ORDERS.BRIDGE.1.57.12.1700.3"
FC = "$JS.FC.ORDERS.BRIDGE.aB3x"
FC_HEADERS = {"Status": "100", "Description": "FlowControl Request"}


def heartbeat_headers(**extra: str) -> dict[str, str]:
    return {"Status": "100", "Description": "Idle Heartbeat", **extra}


@pytest.mark.parametrize("headers", [None, {}, {"X-App": "1"}, {"Nats-Msg-Id": "app-1", "x-lower": "v"}])
@pytest.mark.parametrize("payload", [b"", b"hello"])
def test_data_message(headers: dict[str, str] | None, payload: bytes) -> None:
    msg = classify("orders.new", ACK, headers, payload)
    assert msg == Data(ack=parse_ack_subject(ACK), subject="orders.new", headers=headers, payload=payload)  # type: ignore[arg-type]


def test_v2_data_message() -> None:
    reply = "$JS.ACK._.AbCd1234.ORDERS.BRIDGE.1.9.4.1700.0.rnd"
    msg = classify("orders.new", reply, None, b"x")
    assert isinstance(msg, Data)
    assert (msg.ack.stream_seq, msg.ack.consumer_seq, msg.ack.domain) == (9, 4, None)


@pytest.mark.parametrize("reply", [FC, "$JS.FC._.AbCd1234.ORDERS.BRIDGE.aB3x"])
def test_flow_control_request(reply: str) -> None:
    assert classify("deliver.x", reply, FC_HEADERS, b"") == FlowControlRequest(reply)


def test_heartbeat_with_positions() -> None:
    beat = classify("deliver.x", "", heartbeat_headers(**{"Nats-Last-Consumer": "5", "Nats-Last-Stream": "9"}), b"")
    assert beat == Heartbeat(last_consumer=5, last_stream=9, stalled=None)


def test_heartbeat_with_stalled_subject() -> None:
    headers = heartbeat_headers(
        **{"Nats-Last-Consumer": "0", "Nats-Last-Stream": "3", "Nats-Consumer-Stalled": FC},
    )
    assert classify("deliver.x", "", headers, b"") == Heartbeat(last_consumer=0, last_stream=3, stalled=FC)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, Heartbeat(None, None, None)),  # no position headers at all
        ({"Nats-Last-Consumer": "x", "Nats-Last-Stream": ""}, Heartbeat(None, None, None)),  # unparsable
        ({"Nats-Consumer-Stalled": ""}, Heartbeat(None, None, None)),  # an empty stalled subject is no subject
    ],
)
def test_heartbeat_with_missing_or_bad_headers(extra: dict[str, str], expected: Heartbeat) -> None:
    assert classify("deliver.x", "", heartbeat_headers(**extra), b"") == expected


@pytest.mark.parametrize(
    ("headers", "payload"),
    [
        ({"Status": "404", "Description": "No Messages"}, b""),
        ({"Status": "408", "Description": "Request Timeout"}, b""),
        ({"Status": "409", "Description": "Consumer Deleted"}, b""),
        ({"Status": "503"}, b""),
        (FC_HEADERS, b"not empty"),  # a control message has no payload
    ],
)
def test_other_status_messages_are_unrecognised(headers: dict[str, str], payload: bytes) -> None:
    msg = classify("deliver.x", FC, headers, payload)
    assert isinstance(msg, Unrecognised)
    assert headers["Status"] in msg.reason


@pytest.mark.parametrize("reply", ["", "_INBOX.abc", "$JS.ACK.ORDERS.BRIDGE.1.2", "$JS.FC.ORDERS.BRIDGE.x"])
def test_no_ack_subject_is_unrecognised(reply: str) -> None:
    msg = classify("orders.new", reply, {"X-App": "1"}, b"payload")
    assert isinstance(msg, Unrecognised)
    assert "ack subject" in msg.reason


@pytest.mark.parametrize(
    ("headers", "payload"),
    [({"Status": "200", "X-App": "1"}, b"body"), ({"Status": "100"}, b""), ({"Status": "active"}, b"body")],
)
def test_data_with_an_application_status_header_is_still_data(headers: dict[str, str], payload: bytes) -> None:
    """Regression (fixed in d720488): classify() used to look at a ``Status`` header before the ``$JS.ACK`` reply,
    and nats-py puts user headers and the status line into the same dict (``_process_headers``). An origin
    message carrying an application header ``Status`` (e.g. ``Status: 200`` from an HTTP gateway) was
    Unrecognised (with an empty payload and ``Status: 100``, even a FlowControlRequest): its dseq was never
    counted, a GAP reset brought it back, and so on: the source was blocked for good."""
    assert isinstance(classify("orders.new", ACK, headers, payload), Data)
