"""``nats-bridge status`` reads the running daemon's ``/readyz``; any answer that is not its JSON view is reported,
never a crash (a daemon mid-failure answers 500 with a text page)."""

from __future__ import annotations

import pytest

from bridge.commands.status import daemon_source_view, daemon_view, print_status
from bridge.testing.http import answering


@pytest.mark.parametrize(
    ("status", "body", "ok"),
    [
        (200, b'{"ready": true, "sources": {}}', True),
        (503, b'{"ready": false, "sources": {}}', True),  # not ready is still the daemon's full answer
        (500, b"Internal Server Error", False),
        (200, b"[1, 2]", False),
    ],
)
def test_thedaemon_view_is_its_json_or_a_reason(status: int, body: bytes, ok: bool) -> None:
    with answering({"/readyz": (status, body)}) as port:
        view, note = daemon_view(f"127.0.0.1:{port}")
        assert (view is not None) is ok, note
        assert f":{port}/readyz" in note


READYZ = {
    "ready": True,
    "sources": {
        "edge1": {
            "ready": True,
            "reasons": [],
            "role": "owner",
            "mode": "pull",
            "mode_reason": "the origin runs nats-server 2.12.8 (API level 2), older than 2.14",
            "phase": "running",
            "last_error": None,
            "stalled": False,
            "batched": True,
            "waiting_for_origin": True,
            "window": 2048,
            "watermark": 12,
        },
        "edge2": {"ready": True, "reasons": [], "role": "standby", "owner": "other-1"},
    },
}


def test_the_daemons_mode_and_reason_are_carried_per_source() -> None:
    view = daemon_source_view(READYZ, "edge1")
    assert view is not None
    assert view["mode"] == "pull" and view["mode_reason"].startswith("the origin runs nats-server 2.12.8")
    assert view["batched"] is True  # windows go out as fast batches
    assert view["window"] == 2048 and view["waiting_for_origin"] is True  # grown window; silent, its origin in doubt
    assert "watermark" not in view  # status reads that from the servers itself
    standby = daemon_source_view(READYZ, "edge2")
    assert standby is not None and standby["mode"] is None  # a standby runs nothing, so has no mode
    assert daemon_source_view(READYZ, "edge3") is None and daemon_source_view(None, "edge1") is None


def test_the_table_has_a_mode_column(capsys: pytest.CaptureFixture[str]) -> None:
    status = {
        "target_stream": "AGG",
        "daemon": "http://127.0.0.1:9464/readyz",
        "sources": [
            {"source": "edge1", "from": "file", "delivered": 12, "daemon": daemon_source_view(READYZ, "edge1")},
            {"source": "edge2", "from": "registry", "delivered": 0, "daemon": daemon_source_view(READYZ, "edge2")},
            {"source": "edge3", "from": "file", "delivered": 0, "daemon": None},
        ],
    }
    assert print_status(status, as_json=False)
    header, *rows = capsys.readouterr().out.splitlines()[:4]
    assert header.split()[:4] == ["source", "from", "mode", "delivered"]
    assert [row.split()[:3] for row in rows] == [
        ["edge1", "file", "pull"],
        ["edge2", "registry", "-"],
        ["edge3", "file", "-"],
    ]


def test_no_sources_at_all_is_said_not_crashed_on(capsys: pytest.CaptureFixture[str]) -> None:
    # a fleet's file may have none, and the registry may be empty yet
    assert print_status({"target_stream": "AGG", "daemon": "x", "sources": []}, as_json=False)
    assert "no sources: none in the configuration file, none registered" in capsys.readouterr().out
