"""How the bucket's keys become the fleet core's view (bridge/io/kv.py ``parse_view``), across lease schemes."""

from __future__ import annotations

import json

from bridge.core.fleet import Holder
from bridge.io.kv import KvEntry, parse_view


def entry(key: str, revision: int, value: dict[str, object] | None) -> KvEntry:
    return KvEntry(key, revision, b"" if value is None else json.dumps(value).encode(), value is None)


def test_group_and_source_keys_are_kept_apart_and_an_old_presence_counts_as_per_source() -> None:
    view = parse_view(
        [
            entry("lease.orders", 3, {"instance": "old", "incarnation": "o1", "since": 5.0}),
            entry("lease.gone", 4, None),
            entry("group.17", 8, {"instance": "new", "incarnation": "n1", "pid": 9}),
            entry("group.3", 9, None),
            entry("presence.old", 10, {"incarnation": "o1", "sources": ["orders", "gone"]}),
            entry("presence.new", 11, {"incarnation": "n1", "sources": [], "units": ["17", "3"], "lease_groups": 64}),
        ]
    )
    assert view.holders == {"orders": Holder("old", "o1", since=5.0, revision=3)}
    assert view.free == {"gone": 4}
    assert view.groups == {"17": Holder("new", "n1", pid=9, revision=8)}
    assert view.free_groups == {"3": 9}
    assert view.members["old"].sources == {"orders", "gone"} and view.members["old"].lease_groups == 0
    assert view.members["new"].sources == {"17", "3"} and view.members["new"].lease_groups == 64


def test_a_value_read_again_gives_the_same_view_with_each_entrys_own_revision() -> None:
    """Values are decoded once while they repeat (a renew writes the same value again): the view of a second read
    is what a fresh decode gives, revisions and all."""
    value = {"instance": "a", "incarnation": "a1", "host": "h", "pid": 7, "since": 2.5}
    assert parse_view([entry("group.1", 5, value)]).groups["1"].revision == 5
    again = parse_view([entry("group.1", 9, value), entry("group.2", 6, value)])
    assert again.groups == {
        "1": Holder("a", "a1", host="h", pid=7, since=2.5, revision=9),
        "2": Holder("a", "a1", host="h", pid=7, since=2.5, revision=6),
    }
    assert parse_view([KvEntry("group.3", 1, b"not json", False)]).groups == {"3": Holder("?", "?", revision=1)}
