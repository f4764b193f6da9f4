"""``bridge.commands.setup``, its pure parts: the aggregate setup creates, and what it reports as different."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.cli import main
from bridge.commands.setup import (
    CREATED,
    DIFFERS,
    EXISTS,
    FAIL,
    WOULD_CREATE,
    Line,
    aggregate_config,
    aggregate_differences,
    bucket_differences,
    consumer_differences,
    copy_subjects,
    describe_aggregate,
    duplicate_window,
    exit_code,
    go_duration,
    minimal_subjects,
)
from bridge.config import SourceConfig, TargetConfig
from bridge.core.modes import Mode, ModeUnsupported
from bridge.core.subjects import pattern_covers
from bridge.io.consumer import desired_config, desired_pull_config, source_mode

NS = 1_000_000_000


def target(ack_timeout: float = 5.0) -> TargetConfig:
    return TargetConfig(stream="AGG", ack_timeout=ack_timeout)


def source(name: str = "edge1", **kwargs: Any) -> SourceConfig:
    return SourceConfig(name=name, stream="ORDERS", **kwargs)


def good_aggregate(**changes: Any) -> dict[str, Any]:
    cfg = aggregate_config(target(), ["edge.>"], 1)
    cfg.update(changes)
    return cfg


@pytest.mark.parametrize(
    ("ack_timeout", "window"),
    [(0.5, 120.0), (5.0, 120.0), (30.0, 120.0), (31.0, 124.0), (60.0, 240.0)],
)
def test_the_duplicate_window_is_two_minutes_or_four_ack_timeouts(ack_timeout: float, window: float) -> None:
    assert duplicate_window(ack_timeout) == window
    assert aggregate_config(target(ack_timeout), ["x.>"], 1)["duplicate_window"] == int(window * NS)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(120, "2m0s"), (20, "20s"), (2.5, "2.5s"), (3600, "1h0m0s"), (3725, "1h2m5s"), (0, "0s"), (90, "1m30s")],
)
def test_durations_read_like_the_servers(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


@pytest.mark.parametrize(
    ("wide", "narrow", "covers"),
    [
        ("edge.>", "edge.one.>", True),
        ("edge.>", "edge.>", True),
        ("edge.*.>", "edge.one.>", True),
        ("edge.one.>", "edge.>", False),
        ("edge.*", "edge.>", False),
        ("edge.*", "edge.one", True),
        ("edge.*", "edge.*", True),
        ("edge.one", "edge.*", False),
        ("orders.>", "orders.eu.*", True),
        ("orders.eu.*", "orders.>", False),
        ("a.b", "a.b.c", False),
        ("a.b.c", "a.b", False),
        (">", "anything.at.all", True),
    ],
)
def test_pattern_covers(wide: str, narrow: str, covers: bool) -> None:
    assert pattern_covers(wide, narrow) is covers


def test_the_aggregate_captures_each_sources_copies_without_overlaps() -> None:
    assert minimal_subjects(["edge.one.>", "edge.>", "orders.*", "orders.eu", "edge.>"]) == ["edge.>", "orders.*"]
    assert copy_subjects(source(subject_prefix="edge.one"), None) == ["edge.one.>"]
    # without a prefix the copies keep the origin's subjects: its filters when set, else its configured subjects
    assert copy_subjects(source(), ["orders.>"]) == ["orders.>"]
    assert copy_subjects(source(filter_subjects=["orders.eu.>"]), ["orders.>"]) == ["orders.eu.>"]
    # transforms: where they put the copies (under the prefix when there is one), origin unread or not
    transforms = [{"src": "orders.*", "dest": "shop.$1.{{split(1,-)}}"}, {"src": "audit.>"}]
    assert copy_subjects(source(subject_transforms=transforms), None) == ["shop.*.>", "audit.>"]
    assert copy_subjects(source(subject_prefix="edge.one", subject_transforms=transforms), None) == ["edge.one.>"]
    assert copy_subjects(source(), None) is None  # origin unread: unknown, never guessed
    assert copy_subjects(source(), []) is None  # a mirror has no subjects of its own

    cfg = aggregate_config(target(), ["edge.one.>", "orders.>", "edge.two.>"], 3)
    assert cfg == {
        "name": "AGG",
        "description": "nats-bridge aggregate (created by nats-bridge setup)",
        "subjects": ["edge.one.>", "edge.two.>", "orders.>"],
        "retention": "limits",
        "discard": "old",
        "storage": "file",
        "num_replicas": 3,
        "allow_direct": True,
        "allow_batched": True,
        "duplicate_window": 120 * NS,
    }
    assert describe_aggregate(aggregate_config(target(), ["edge.>"], 1)) == (
        "subjects edge.>, allow_direct, allow_batched, duplicate window 2m0s, file, 1 replica"
    )


def test_the_aggregate_setup_creates_has_no_differences() -> None:
    needs = {"edge1": ["edge.one.>"], "edge2": ["orders.>"]}
    cfg = aggregate_config(target(), ["edge.one.>", "orders.>"], 1)
    assert aggregate_differences(cfg, target(), needs, batched=True) == []
    # the demo's aggregate (bridge/commands/demo.py: server defaults for retention and discard) fits its source
    demo = {"subjects": ["edge.>"], "storage": "file", "allow_direct": True, "duplicate_window": 120 * NS}
    demo |= {"retention": "limits", "discard": "old", "allow_batched": True}
    assert aggregate_differences(demo, target(), {"leaf1": ["edge.leaf1.>"]}, batched=True) == []


def test_fast_batches_are_asked_for_only_where_the_server_has_them() -> None:
    needs = {"edge1": ["edge.one.>"]}
    older = aggregate_config(target(), ["edge.one.>"], 1, batched=False)  # a hub older than 2.14
    assert "allow_batched" not in older
    assert aggregate_differences(older, target(), needs, batched=False) == []
    (line,) = aggregate_differences(older, target(), needs, batched=True)
    assert line.startswith("allow_batched is false;") and line.endswith("publishes windows as fast batches)")


def test_each_difference_of_an_existing_aggregate_is_one_line_with_its_fix() -> None:
    needs: dict[str, list[str] | None] = {"edge1": ["edge.one.>"], "edge2": ["orders.>"], "edge3": None}
    found = aggregate_differences(
        good_aggregate(
            allow_direct=False,
            duplicate_window=5 * NS,
            discard="new",
            max_msgs=1000,
            retention="workqueue",
            storage="memory",
        ),
        target(),
        needs,
    )
    assert found == [
        "subjects [edge.>] do not capture source edge2's copies (orders.>); its publishes would be refused: add "
        "orders.> to the stream's subjects",
        "allow_direct is false; the bridge reads copies back with Direct Get (restart recovery, the audit): set "
        "allow_direct = true",
        "duplicate window 5s is shorter than 2 x target.ack_timeout (10s); a publish retried after an ack timeout may "
        "be stored twice: set duplicate_window = 2m0s",
        "retention is workqueue; copies deleted by it cannot be read back by restart recovery, which then replicates "
        "them again: use retention limits",
        "discard is new with max_msgs/max_bytes limits; once full, the aggregate refuses every copy and every source "
        "blocks: set discard = old",
        "storage is memory; a server restart loses the copies restart recovery reads back: use file storage",
    ]
    # discard new without a limit never discards anything; the daemon's own threshold is exactly 2 x ack_timeout
    assert aggregate_differences(good_aggregate(discard="new", duplicate_window=10 * NS), target(), {}) == []
    assert len(aggregate_differences(good_aggregate(duplicate_window=int(9.9 * NS)), target(), {})) == 1
    assert aggregate_differences(good_aggregate(no_ack=True, sealed=True), target(), {}) == [
        "no_ack is true; the bridge stores nothing without a publish ack: set no_ack = false",
        "the stream is sealed and refuses publishes: the aggregate needs an unsealed stream",
    ]


def test_an_existing_consumer_is_judged_as_the_daemon_would() -> None:
    managed = source(subject_prefix="edge.one")
    info = {"config": desired_config(managed)}
    assert consumer_differences(info, managed) == []
    old = {"config": {**desired_config(managed), "ack_policy": "explicit", "deliver_policy": "new"}}
    reasons = consumer_differences(old, managed)
    assert len(reasons) == 2
    assert "'flow_control' (nats-server >= 2.14)" in reasons[0]
    assert reasons[1].startswith("deliver_policy is 'new', the bridge's is 'all', and it cannot be updated")
    # a bound consumer's deliver policy is the operator's choice
    bound = source(manage_consumer=False)
    assert consumer_differences({"config": {**desired_config(bound), "deliver_policy": "new"}}, bound) == []


def test_the_coordination_buckets_differences() -> None:
    cfg = {"max_age": 10 * NS, "max_msgs_per_subject": 1, "allow_direct": True}
    assert bucket_differences(cfg, 10.0) == []
    found = bucket_differences({**cfg, "max_age": 30 * NS, "max_msgs_per_subject": 5}, 10.0)
    assert len(found) == 2
    assert found[0].startswith("max_age is 30s, coordination.lease_ttl 10s; the bucket's wins")
    assert "set coordination.lease_ttl = 30" in found[0]
    assert found[1].startswith("history (max_msgs_per_subject) is 5, the bridge's is 1")
    assert bucket_differences({**cfg, "max_age": 0}, 10.0)[0].startswith("it has no TTL")


@pytest.mark.parametrize(
    ("metadata", "mode"),
    [
        ({"_nats.level": "4", "_nats.ver": "2.14.0"}, Mode.FLOW_CONTROL),
        ({"_nats.level": "5", "_nats.ver": "2.15.1"}, Mode.FLOW_CONTROL),
        ({"_nats.level": "3", "_nats.ver": "2.12.8"}, Mode.PULL),
        (None, Mode.PULL),  # 2.10 reports no level
    ],
)
def test_setup_chooses_the_mode_the_daemon_will_run(metadata: dict[str, str] | None, mode: Mode) -> None:
    info = {"config": {"metadata": metadata}}
    assert source_mode(source(), info, None).mode is mode
    # an existing pull consumer is kept on a 2.14+ origin (made before an upgrade)
    assert source_mode(source(), info, {"config": desired_pull_config(source())}).mode is Mode.PULL
    if mode is Mode.PULL:
        with pytest.raises(ModeUnsupported, match=r"needs nats-server 2\.14\.0 or later"):
            source_mode(source(mode="flow_control"), info, None)


def test_a_pull_consumer_is_judged_for_pull_mode() -> None:
    managed = source(mode="pull")
    assert consumer_differences({"config": desired_pull_config(managed)}, managed, Mode.PULL) == []
    reasons = consumer_differences({"config": desired_config(managed)}, managed, Mode.PULL)
    assert reasons and "it is a push consumer" in reasons[0]


def test_lines_and_the_exit_code() -> None:
    created = Line(CREATED, "aggregate stream AGG", "subjects edge.>, allow_direct, duplicate window 2m0s")
    assert created.text() == "created  aggregate stream AGG (subjects edge.>, allow_direct, duplicate window 2m0s)"
    ok = Line(EXISTS, "consumer ORDERS/nats-bridge-edge1 on edge1", "ok")
    assert ok.text() == "exists   consumer ORDERS/nats-bridge-edge1 on edge1: ok"
    differs = Line(DIFFERS, "aggregate stream AGG", "allow_direct is false")
    assert differs.text() == "differs  aggregate stream AGG: allow_direct is false"
    assert Line(WOULD_CREATE, "consumer X/y on z", "d").text() == "would create consumer X/y on z (d)"
    assert Line(FAIL, "target", "cannot connect").text() == "FAIL     target: cannot connect"
    assert exit_code([created, ok, Line(WOULD_CREATE, "x", "y")]) == 0
    assert exit_code([created, differs]) == 1
    assert exit_code([Line(FAIL, "target", "x")]) == 1


@pytest.mark.parametrize("replicas", ["0", "6", "two"])
def test_replicas_out_of_range_is_a_usage_error(replicas: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["setup", "-c", "bridge.toml", "--replicas", replicas])
    assert exited.value.code == 2
    assert "--replicas: must be a whole number from 1 to 5" in capsys.readouterr().err
