"""``bridge.io.consumer`` and the API helpers of pull mode: the consumer configurations, vetting, what an existing
durable is, the server's API level, ``STREAM.MSG.GET`` decoding and range reads (against a stub, the real server
in tests/integration/test_origin_pull_io.py)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from bridge.config import SourceConfig
from bridge.core.effects import BoundConsumer, OriginMessage
from bridge.core.modes import ConsumerKind, Mode
from bridge.core.subjects import subject_matches
from bridge.errors import ApiError, ApiUnavailable, ConsumerUnfit, OriginUnavailable
from bridge.io.consumer import (
    bound_consumer,
    consumer_kind,
    desired_config,
    desired_pull_config,
    ensure_consumer,
    pull_unfit_reasons,
    unfit_reasons,
)
from bridge.io.jsapi import CONSUMER_NOT_FOUND, NO_MESSAGE_FOUND, JsApi, server_level, stored_message

NS = 1_000_000_000

pytestmark = pytest.mark.anyio


def source(**kwargs: Any) -> SourceConfig:
    return SourceConfig(name="edge1", stream="ORDERS", **kwargs)


# -- configurations ------------------------------------------------------------------------------------------


def test_the_pull_consumer_the_bridge_creates() -> None:
    config = desired_pull_config(source(ack_wait=12.5, max_ack_pending=200))
    assert config == {
        "durable_name": "nats-bridge-edge1",
        "description": "nats-bridge source edge1",
        "deliver_policy": "all",
        "ack_policy": "explicit",
        "ack_wait": 12_500_000_000,
        "max_ack_pending": 200,
        "max_deliver": -1,
        "replay_policy": "instant",
        "metadata": {"nats-bridge.source": "edge1"},
    }
    # heartbeats and flow control are a push consumer's settings: a pull request asks for its own heartbeats
    assert not {"deliver_subject", "idle_heartbeat", "flow_control"} & config.keys()


def test_the_default_ack_wait_is_30_seconds() -> None:
    assert desired_pull_config(source())["ack_wait"] == 30 * NS


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ([], {}),
        (["orders.eu.>"], {"filter_subject": "orders.eu.>"}),
        (["orders.eu.>", "orders.us.*"], {"filter_subjects": ["orders.eu.>", "orders.us.*"]}),
    ],
)
def test_both_kinds_filter_alike(filters: list[str], expected: dict[str, Any]) -> None:
    src = source(filter_subjects=filters)
    for config in (desired_config(src), desired_pull_config(src)):
        assert {k: v for k, v in config.items() if k.startswith("filter_subject")} == expected


def test_the_flow_control_consumer_is_unchanged() -> None:
    config = desired_config(source())
    assert config["ack_policy"] == "flow_control"
    assert config["deliver_subject"] == source().deliver_subject
    assert (config["flow_control"], config["idle_heartbeat"], config["max_deliver"]) == (True, NS, -1)
    assert "ack_wait" not in config


# -- what an existing durable is ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        ({"ack_policy": "explicit"}, ConsumerKind.PULL),
        ({"ack_policy": "none", "deliver_subject": ""}, ConsumerKind.PULL),  # a pull consumer whatever its acks
        ({"ack_policy": "flow_control", "deliver_subject": "d.x", "flow_control": True}, ConsumerKind.FLOW_CONTROL),
        ({"ack_policy": "explicit", "deliver_subject": "d.x"}, ConsumerKind.OTHER),
        ({"ack_policy": "none", "deliver_subject": "d.x"}, ConsumerKind.OTHER),
    ],
)
def test_consumer_kind(config: dict[str, Any], kind: ConsumerKind) -> None:
    assert consumer_kind({"config": config}) is kind


# -- vetting a pull consumer -------------------------------------------------------------------------------


def test_the_pull_consumer_created_is_fit() -> None:
    src = source(filter_subjects=["orders.>"])
    assert pull_unfit_reasons({"config": desired_pull_config(src)}, src) == []
    # what the server fills in: max_deliver 0 is "unset" on some versions, max_waiting and friends are harmless
    served = {**desired_pull_config(src), "max_deliver": 0, "max_waiting": 512, "num_replicas": 0}
    assert pull_unfit_reasons({"config": served}, src) == []


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"deliver_subject": "d.x"}, "it is a push consumer (deliver_subject 'd.x')"),
        ({"ack_policy": "all"}, "ack_policy is 'all'"),
        ({"ack_policy": "none"}, "ack_policy is 'none'"),
        ({"max_deliver": 5}, "max_deliver is 5"),
        ({"inactive_threshold": 300 * NS}, "inactive_threshold is set"),
        ({"headers_only": True}, "headers_only is set"),
        ({"ack_wait": NS // 2}, "ack_wait is 0.5s"),
    ],
)
def test_each_unfit_pull_setting_is_one_reason_with_its_fix(change: dict[str, Any], says: str) -> None:
    src = source()
    reasons = pull_unfit_reasons({"config": {**desired_pull_config(src), **change}}, src)
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith(says)
    # every reason says what to do, not only what is wrong
    assert any(word in reasons[0] for word in ("create", "needs", "set")), reasons[0]


def test_a_flow_control_consumer_is_unfit_for_pull_mode_and_the_other_way_round() -> None:
    src = source()
    assert len(pull_unfit_reasons({"config": desired_config(src)}, src)) == 2  # push, ack policy
    assert len(unfit_reasons({"config": desired_pull_config(src)}, src)) == 3  # ack policy, deliver subject, fc


# -- ensure_consumer ---------------------------------------------------------------------------------------


class StubApi:
    """The calls ensure_consumer makes, answered from a dict of existing consumers (config by name)."""

    def __init__(self, existing: dict[str, Any] | None = None, refuse: str = "") -> None:
        self.existing = existing or {}
        self.refuse = refuse
        self.created: list[tuple[dict[str, Any], bool]] = []

    async def create_consumer(
        self,
        stream: str,
        config: dict[str, Any],
        *,
        pedantic: bool = True,
        timeout: float = 5.0,
        action: str | None = None,
    ) -> dict[str, Any]:
        self.created.append((config, pedantic))
        if action == "update" and config["durable_name"] not in self.existing:  # as nats-server answers it
            raise ApiError(f"$JS.API.CONSUMER.CREATE.{stream}", 400, 10149, "consumer does not exist")
        if self.refuse:
            raise ApiError(f"$JS.API.CONSUMER.CREATE.{stream}", 400, 10012, self.refuse)
        self.existing[config["durable_name"]] = config
        return {"config": config, "created": "2026-11-25T00:00:00Z"}

    async def consumer_info(self, stream: str, consumer: str, timeout: float = 5.0) -> dict[str, Any]:
        if consumer not in self.existing:
            raise ApiError(f"$JS.API.CONSUMER.INFO.{stream}.{consumer}", 404, CONSUMER_NOT_FOUND, "consumer not found")
        return {"config": self.existing[consumer]}

    find_consumer = JsApi.find_consumer  # the real one, over the stub's consumer_info


async def test_a_managed_source_creates_the_consumer_of_its_mode_pedantically() -> None:
    src = source()
    for mode, config in ((Mode.PULL, desired_pull_config(src)), (Mode.FLOW_CONTROL, desired_config(src))):
        api = StubApi()
        await ensure_consumer(cast(JsApi, api), src, manage=True, timeout=1, mode=mode)
        assert api.created == [(config, True)]


async def test_an_update_never_creates_a_consumer_that_is_gone() -> None:
    # a resize or a new rate limit of a consumer an operator deleted: the engine's discontinuity re-creates it
    src = source()
    api = StubApi()
    with pytest.raises(OriginUnavailable, match="does not exist: not updated"):
        await ensure_consumer(cast(JsApi, api), src, manage=True, timeout=1, mode=Mode.PULL, update_only=True)
    assert src.consumer not in api.existing
    await ensure_consumer(cast(JsApi, api), src, manage=True, timeout=1, mode=Mode.PULL)
    await ensure_consumer(cast(JsApi, api), src, manage=True, timeout=1, mode=Mode.PULL, update_only=True)
    assert len(api.created) == 3


async def test_a_refused_create_names_the_mode() -> None:
    api = StubApi(refuse="can not update push consumer to pull based")
    with pytest.raises(ConsumerUnfit, match=r"for pull mode: can not update push consumer to pull based"):
        await ensure_consumer(cast(JsApi, api), source(), manage=True, timeout=1, mode=Mode.PULL)


@pytest.mark.parametrize(
    ("mode", "fix"),
    [
        (Mode.PULL, "create a durable pull consumer (no deliver_subject) with ack_policy explicit and max_deliver -1"),
        (Mode.FLOW_CONTROL, "create a durable push consumer with ack_policy flow_control, flow_control true"),
    ],
)
async def test_a_missing_bound_consumer_says_which_kind_to_create(mode: Mode, fix: str) -> None:
    with pytest.raises(ConsumerUnfit, match="does not exist and manage_consumer = false") as caught:
        await ensure_consumer(cast(JsApi, StubApi()), source(manage_consumer=False), manage=False, timeout=1, mode=mode)
    assert fix in str(caught.value)


async def test_a_bound_consumer_is_vetted_for_the_mode() -> None:
    src = source(manage_consumer=False)
    api = StubApi({src.consumer: desired_pull_config(src)})
    info = await ensure_consumer(cast(JsApi, api), src, manage=False, timeout=1, mode=Mode.PULL)
    assert info["config"]["ack_policy"] == "explicit"
    with pytest.raises(ConsumerUnfit, match="is unfit for flow_control mode: ack_policy is 'explicit'"):
        await ensure_consumer(cast(JsApi, api), src, manage=False, timeout=1, mode=Mode.FLOW_CONTROL)
    assert api.created == []  # a bound consumer is never touched


# -- the server's API level --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"config": {"metadata": {"_nats.level": "2", "_nats.ver": "2.12.8", "_nats.req.level": "0"}}}, (2, "2.12.8")),
        ({"config": {"metadata": {"_nats.level": "5", "_nats.ver": "2.15.1"}}}, (5, "2.15.1")),
        ({"config": {"metadata": {"app": "x"}}}, (None, None)),  # 2.10: only the stream's own metadata
        ({"config": {"metadata": None}}, (None, None)),
        ({"config": {}}, (None, None)),
        ({}, (None, None)),
        ({"config": {"metadata": {"_nats.level": "two", "_nats.ver": ""}}}, (None, None)),
        ({"config": {"metadata": {"_nats.level": "²"}}}, (None, None)),  # a digit to isdigit(), not to int()
    ],
)
def test_server_level(info: dict[str, Any], expected: tuple[int | None, str | None]) -> None:
    assert server_level(info) == expected


# -- STREAM.MSG.GET ---------------------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_stored_message_is_decoded_exactly() -> None:
    raw = {
        "subject": "orders.eu.1",
        "seq": 11,
        "hdrs": b64(b"NATS/1.0\r\nX-App: 1\r\nNats-Msg-Id: a-1\r\n\r\n"),
        "data": b64(b"\x00payload\xff"),
        "time": "2026-11-25T21:57:24.123456789Z",
    }
    assert stored_message(raw, "s") == OriginMessage(
        11, "orders.eu.1", {"X-App": "1", "Nats-Msg-Id": "a-1"}, b"\x00payload\xff", 1_795_643_844_123_456_789
    )
    # no headers, no payload: the server leaves both out; a time with trailing zeros trimmed
    bare = {"subject": "o", "seq": 1, "time": "2026-11-25T21:57:24.1Z"}
    assert stored_message(bare, "s") == OriginMessage(1, "o", None, b"", 1_795_643_844_100_000_000)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {},
        {"subject": "o", "seq": 1},  # no time
        {"subject": "o", "seq": 1, "time": "yesterday"},
        {"subject": "o", "seq": "x", "time": "2026-11-25T21:57:24Z"},
        {"subject": "o", "seq": 1, "time": "2026-11-25T21:57:24Z", "data": "not base64!"},
    ],
)
def test_an_undecodable_message_is_api_unavailable(raw: Any) -> None:
    with pytest.raises(ApiUnavailable, match=r"\$JS.API.STREAM.MSG.GET.ORDERS: undecodable message"):
        stored_message(raw, "$JS.API.STREAM.MSG.GET.ORDERS")


@dataclass(frozen=True)
class StubStream(JsApi):
    """``STREAM.MSG.GET`` over an in-memory stream (seq -> subject), recording each request's (seq, filter)."""

    subjects: dict[int, str] = field(default_factory=dict)
    gets: list[tuple[int, str | None]] = field(default_factory=list)

    async def request(self, path: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        assert path == "STREAM.MSG.GET.ORDERS" and body is not None
        wanted: str | None = body.get("next_by_subj")
        self.gets.append((body["seq"], wanted))
        found = [
            s
            for s in sorted(self.subjects)
            if s >= body["seq"] and (wanted is None or subject_matches(wanted, self.subjects[s]))
        ]
        if not found or (wanted is None and found[0] != body["seq"]):
            raise ApiError(f"$JS.API.{path}", 404, NO_MESSAGE_FOUND, "no message found")
        seq = found[0]
        return {
            "message": {
                "subject": self.subjects[seq],
                "seq": seq,
                "time": "1970-01-01T00:00:00Z",
                "data": b64(b"%d" % seq),
            }
        }


def stream(subjects: dict[int, str]) -> StubStream:
    return StubStream(cast(Any, None), "$JS.API", subjects)


async def test_a_range_within_one_filter_steps_over_what_is_deleted_or_filtered_out() -> None:
    # 1..10 with 4 and 5 deleted; the odd ones on "a", the even ones on "b"
    api = stream({s: ("a" if s % 2 else "b") for s in range(1, 11) if s not in (4, 5)})
    assert [m.seq for m in await api.messages_between("ORDERS", 2, 9, [])] == [3, 6, 7, 8, 9]
    assert api.gets == [(3, ">"), (4, ">"), (7, ">"), (8, ">"), (9, ">")]
    assert [m.seq for m in await api.messages_between("ORDERS", 0, 10, ["a"])] == [1, 3, 7, 9]
    assert [m.payload for m in await api.messages_between("ORDERS", 7, 8, ["b"])] == [b"8"]


async def test_several_filters_merge_in_order() -> None:
    api = stream({s: "abc"[s % 3] for s in range(1, 21)})
    messages = await api.messages_between("ORDERS", 4, 15, ["a", "c"])
    assert [m.seq for m in messages] == [s for s in range(5, 16) if s % 3 != 1]
    assert {m.subject for m in messages} == {"a", "c"}
    # one get per message taken, one more per filter to find it has nothing left in the range (15 is the last)
    assert len(api.gets) == len(messages) + 1


async def test_overlapping_filters_read_each_message_once() -> None:
    api = stream({s: f"o.{s}" for s in range(1, 6)})
    assert [m.seq for m in await api.messages_between("ORDERS", 0, 5, ["o.*", "o.>"])] == [1, 2, 3, 4, 5]


async def test_an_empty_range_asks_nothing() -> None:
    api = stream({1: "a"})
    assert await api.messages_between("ORDERS", 5, 5, []) == []
    assert await api.messages_between("ORDERS", 0, 0, ["a"]) == []
    assert api.gets == []
    assert await api.messages_between("ORDERS", 1, 9, []) == []  # nothing stored after 1


def test_a_pull_request() -> None:
    subject, body = JsApi(cast(Any, None), "$JS.leaf.API").next_request(
        "ORDERS", "nats-bridge-edge1", batch=20, expires=5.0, heartbeat=0.5
    )
    assert subject == "$JS.leaf.API.CONSUMER.MSG.NEXT.ORDERS.nats-bridge-edge1"
    assert json.loads(body) == {"batch": 20, "expires": 5 * NS, "idle_heartbeat": NS // 2}


def test_a_consumer_reply_says_where_the_consumer_stands() -> None:
    """A create or info reply as the server sends it (docs/protocol.md 5); a field missing is not known."""
    info = {
        "created": "2026-11-28T12:00:00Z",
        "delivered": {"consumer_seq": 7, "stream_seq": 12},
        "ack_floor": {"consumer_seq": 7, "stream_seq": 12},
        "num_ack_pending": 0,
        "num_pending": 3,
    }
    bound = bound_consumer(info)
    assert bound == BoundConsumer("2026-11-28T12:00:00Z", 12, 3, delivered=(7, 12), ack_floor_dseq=7, ack_pending=0)
    assert bound.at_rest
    assert bound_consumer({**info, "num_ack_pending": 2}).at_rest is False
    partial = bound_consumer({"ack_floor": {"stream_seq": 4}, "delivered": {"consumer_seq": 1}})
    assert partial == BoundConsumer(None, 4, None) and not partial.at_rest
