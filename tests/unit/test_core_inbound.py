"""``bridge.core.inbound.classify``: data, FC requests, heartbeats, pull statuses and everything else on the
deliver subject (or a pull request's inbox).

Inputs are shaped as nats-py hands them to a plain subscription (docs/protocol.md section 9): the status line
becomes the pseudo-headers ``Status``/``Description``; a data message's reply is its ``$JS.ACK`` subject; a pull
consumer's status (nats-server ``consumer.go``: ``408 Request Timeout`` with ``Nats-Pending-Messages``/
``Nats-Pending-Bytes``, ``409 Consumer Deleted``...) arrives on the request's inbox without a reply.
"""

from __future__ import annotations

import pytest

from bridge.core.ackreply import parse_ack_subject
from bridge.core.headers import parse_header_block
from bridge.core.inbound import (
    Data,
    FlowControlRequest,
    Heartbeat,
    PullStatus,
    Unrecognised,
    classify,
    classify_frames,
)

ACK = "$JS.ACK.ORDERS.BRIDGE.1.57.12.1700.3"
FC = "$JS.FC.ORDERS.BRIDGE.aB3x"
FC_HEADERS = {"Status": "100", "Description": "FlowControl Request"}
INBOX = "_INBOX.aJ5lq0Vv2zHmF3kOe9tWcR"


def heartbeat_headers(**extra: str) -> dict[str, str]:
    return {"Status": "100", "Description": "Idle Heartbeat", **extra}


@pytest.mark.parametrize("headers", [None, {}, {"X-App": "1"}, {"Nats-Msg-Id": "app-1", "x-lower": "v"}])
@pytest.mark.parametrize("payload", [b"", b"hello"])
def test_data_message(headers: dict[str, str] | None, payload: bytes) -> None:
    msg = classify("orders.new", ACK, headers, payload)
    ack = parse_ack_subject(ACK)
    assert ack is not None
    # the reply is kept whole: pull mode acks the message by publishing to it
    assert msg == Data(ack=ack, subject="orders.new", headers=headers, payload=payload, reply=ACK)


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


def test_heartbeat_of_a_pull_request() -> None:
    """A pull consumer's idle heartbeat comes to the request's inbox (its subject), without a reply."""
    headers = heartbeat_headers(**{"Nats-Last-Consumer": "20", "Nats-Last-Stream": "41"})
    assert classify(INBOX, "", headers, b"") == Heartbeat(last_consumer=20, last_stream=41, stalled=None)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Status": "404", "Description": "No Messages"}, PullStatus(404, "No Messages", INBOX)),
        (
            {
                "Status": "408",
                "Description": "Request Timeout",
                "Nats-Pending-Messages": "7",
                "Nats-Pending-Bytes": "0",
            },
            PullStatus(408, "Request Timeout", INBOX, 7, 0),
        ),
        (
            {
                "Status": "409",
                "Description": "Message Size Exceeds MaxBytes",
                "Nats-Pending-Messages": "3",
                "Nats-Pending-Bytes": "1024",
            },
            PullStatus(409, "Message Size Exceeds MaxBytes", INBOX, 3, 1024),
        ),
        ({"Status": "409", "Description": "Consumer Deleted"}, PullStatus(409, "Consumer Deleted", INBOX)),
        ({"Status": "409", "Description": "Exceeded MaxWaiting"}, PullStatus(409, "Exceeded MaxWaiting", INBOX)),
        ({"Status": "503"}, PullStatus(503, "", INBOX)),  # no description at all
        (  # unparsable pending counts are unknown, not zero
            {"Status": "408", "Description": "Request Timeout", "Nats-Pending-Messages": "x", "Nats-Pending-Bytes": ""},
            PullStatus(408, "Request Timeout", INBOX, None, None),
        ),
    ],
)
def test_pull_statuses(headers: dict[str, str], expected: PullStatus) -> None:
    """A status other than 100 without payload ends or refuses a pull request: its code, description, the request
    (the inbox it arrived on) and what the request had left."""
    assert classify(INBOX, "", headers, b"") == expected


@pytest.mark.parametrize(
    ("headers", "payload", "reason"),
    [
        ({"Status": "active", "Description": "x"}, b"", "status active x"),  # not a numeric status
        ({"Status": "1OO"}, b"", "status 1OO"),
        ({"Status": "408", "Description": "Request Timeout"}, b"body", "ack subject"),  # a status has no payload
        (FC_HEADERS, b"not empty", "ack subject"),  # a control message has no payload either
    ],
)
def test_other_status_messages_are_unrecognised(headers: dict[str, str], payload: bytes, reason: str) -> None:
    msg = classify("deliver.x", "", headers, payload)
    assert isinstance(msg, Unrecognised)
    assert reason in msg.reason


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


@pytest.mark.parametrize(
    ("reply", "header", "payload"),
    [
        # the server's own forms (the fast path's)
        (b"$JS.FC.ORDERS.BRIDGE.aB3x", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 12\r\nNats-Last-Stream: 57\r\n\r\n", b""),
        (
            b"",
            b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 12\r\nNats-Last-Stream: 57\r\n"
            b"Nats-Consumer-Stalled: $JS.FC.ORDERS.BRIDGE.x\r\n\r\n",
            b"",
        ),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: x\r\nNats-Last-Consumer: 13\r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Stream: 5: 6\r\n\r\n", b""),
        # anything else: the general path
        (b"$JS.ACK.ORDERS.BRIDGE.1.57.12.1700.3", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b""),
        (b"$JS.FC.x", b"NATS/1.0 100 FlowControl Request\r\n\r\n", b"payload"),
        (b"$JS.FC.x", b"NATS/1.0 100 FlowControl Request\r\nStatus: 200\r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer:  12\r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer:12\r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: \r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nStatus: 408\r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Stream: \xc3\xa9\r\n\r\n", b""),
        (b"", b"NATS/1.0 1000 Idle Heartbeat\r\nNats-Last-Consumer: 12\r\n\r\n", b""),
        (b"", b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 12\r\n", b""),
        (b"", b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 3\r\n\r\n", b""),
    ],
)
def test_classify_frames_takes_the_servers_control_messages_as_classify_does(
    reply: bytes, header: bytes, payload: bytes
) -> None:
    # the frames' classification spares the general header parse for the server's own forms: never a different
    # answer
    subject = b"nats-bridge.deliver.s1"
    general = classify(subject.decode(), reply.decode(), parse_header_block(header), payload)
    assert classify_frames([(subject, reply, header, payload)]) == [general]
