"""``bridge.io.shared``: which source an error on a shared origin connection is about, and who may share."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.config import SourceConfig
from bridge.io.shared import OriginConnections, names_source


def source(name: str, **extra: object) -> SourceConfig:
    return SourceConfig.model_validate(
        {"name": name, "stream": "ORDERS", "domain": "leaf", "servers": ["nats://hub:4222"], **extra}
    )


def about(text: str, name: str, *, inbox: str = "") -> bool:
    src = source(name)
    return names_source(
        text,
        deliver_subject=src.deliver_subject,
        inbox=inbox,
        api_prefix=src.api_prefix,
        stream=src.stream,
        consumer=src.consumer,
    )


@pytest.mark.parametrize(
    "text",
    [
        'nats: permissions violation for subscription to "{deliver}"',
        'nats: permissions violation for publish to "$JS.leaf.API.CONSUMER.CREATE.ORDERS.nats-bridge-edge1"',
        'nats: permissions violation for publish to "$JS.leaf.API.CONSUMER.INFO.ORDERS.nats-bridge-edge1"',
        'nats: permissions violation for publish to "$JS.FC.ORDERS.nats-bridge-edge1.abc"',
        'nats: permissions violation for publish to "$JS.ACK.leaf.hash.ORDERS.nats-bridge-edge1.1.5.5.0.0"',
        'nats: slow consumer, messages dropped on connection 3 for subscription on "{deliver}"',
    ],
)
def test_an_error_naming_a_sources_subject_is_that_sources(text: str) -> None:
    text = text.format(deliver=source("edge1").deliver_subject)
    for seen in (text, text.lower()):  # the server's -ERR reaches the client lowercased
        assert about(seen, "edge1")
        assert not about(seen, "edge2")  # the same stream on the same leaf, another consumer


def test_a_stream_request_is_every_source_of_that_stream_and_nothing_else_is_anyones() -> None:
    text = 'nats: permissions violation for publish to "$JS.leaf.API.STREAM.INFO.ORDERS"'
    assert about(text, "edge1") and about(text, "edge2")
    assert not about('nats: permissions violation for publish to "$JS.other.API.STREAM.INFO.ORDERS"', "edge1")
    assert not about("nats: unexpected EOF", "edge1")


def test_a_pull_inbox_is_its_sources() -> None:
    text = 'nats: permissions violation for subscription to "_INBOX.abc"'
    assert about(text, "edge1", inbox="_INBOX.abc") and not about(text, "edge2", inbox="_INBOX.def")


def test_sources_share_a_connection_only_with_the_same_servers_and_credentials(tmp_path: Path) -> None:
    pool = OriginConnections()
    a = pool.for_settings(source("a"))
    assert pool.for_settings(source("b", domain="other")) is a  # another domain behind the same hub: shared
    assert pool.for_settings(source("c", servers=["nats://elsewhere:4222"])) is not a
    alice = {"auth": {"user": "u", "password": "one"}}
    assert pool.for_settings(source("d", **alice)) is not a
    assert pool.for_settings(source("e", **alice)) is pool.for_settings(source("f", **alice))
    # a different password is another identity, though both print as "**********"
    assert pool.for_settings(source("g", auth={"user": "u", "password": "two"})) is not pool.for_settings(
        source("h", **alice)
    )
    assert pool.open_connections() == 0  # nothing connects before a source joins
