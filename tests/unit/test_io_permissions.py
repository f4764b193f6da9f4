"""``bridge.io.permissions``: reading the server's permissions violations, matching them to a request's subjects, and
a request ending with ``PermissionDenied`` as soon as its connection reports one (against a stand-in client)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from nats.errors import Error
from nats.errors import TimeoutError as NatsTimeoutError

from bridge.errors import ApiTimeout, PermissionDenied
from bridge.io import permissions
from bridge.io.jsapi import JsApi, request_json
from bridge.io.permissions import PUBLISH, REPLY, SUBSCRIBE, PermissionRecord, Violation, parse_violation

pytestmark = pytest.mark.anyio

CREATE_KV = "$JS.API.STREAM.CREATE.KV_nats-bridge"
INBOX = "_INBOX.Ab3dEf"  # nats-py's request inbox prefix, without the trailing "."
WAIT = 5.0  # far below the requests' own timeouts (60 s): a request that waited for its timeout fails the test


def violation(text: str) -> Error:
    """What nats-py hands the error callback for ``-ERR 'Permissions Violation ...'``: lowercased, prefixed."""
    return Error(f"nats: {text.lower()}")


# --- reading the server's text ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f'Permissions Violation for Publish to "{CREATE_KV}"', Violation(PUBLISH, CREATE_KV.lower())),
        ('nats: permissions violation for subscription to "_inbox.ab3def.*"', Violation(SUBSCRIBE, "_inbox.ab3def.*")),
        (
            'permissions violation for subscription to "nats-bridge.deliver.edge1" using queue "q"',
            Violation(SUBSCRIBE, "nats-bridge.deliver.edge1"),
        ),
        ('Permissions Violation for Publish with Reply of "_INBOX.x.y"', Violation(REPLY, "_inbox.x.y")),
    ],
)
def test_a_violation_is_read_whatever_the_case(text: str, expected: Violation) -> None:
    assert parse_violation(text) == expected
    assert parse_violation(text.lower()) == expected  # as nats-py hands it over


@pytest.mark.parametrize(
    "text", ["nats: unexpected EOF", "nats: permissions violation", 'nats: maximum subscriptions exceeded "x"', ""]
)
def test_other_errors_and_a_violation_naming_no_subject_are_none(text: str) -> None:
    assert parse_violation(text) is None


def test_error_subjects_are_the_quoted_words_lowercased_else_every_word() -> None:
    assert permissions.error_subjects('For Publish to "$JS.FC.A.b" and "X"') == ["$js.fc.a.b", "x"]
    assert permissions.error_subjects("slow consumer on Sub.Ject") == ["slow", "consumer", "on", "sub.ject"]


# --- matching a request's subjects --------------------------------------------------------------------------


def test_a_publish_denial_concerns_the_subject_published_to_spelled_as_the_bridge_sent_it() -> None:
    denied = Violation(PUBLISH, CREATE_KV.lower())
    assert denied.concerns(CREATE_KV, []) == CREATE_KV
    assert denied.concerns("$JS.API.STREAM.CREATE.KV_other", []) is None
    assert denied.concerns(None, [CREATE_KV]) is None  # a subscription of the same name is another thing


def test_a_subscription_denial_concerns_the_subscription_and_a_reply_denial_what_it_covers() -> None:
    listen = [f"{INBOX}.*"]
    assert Violation(SUBSCRIBE, f"{INBOX.lower()}.*").concerns("$JS.API.X", listen) == f"{INBOX}.*"
    assert Violation(SUBSCRIBE, "_inbox.other.*").concerns("$JS.API.X", listen) is None
    assert Violation(REPLY, f"{INBOX.lower()}.tok").concerns("$JS.API.X", listen) == f"{INBOX.lower()}.tok"
    assert Violation(REPLY, "_inbox.other.tok").concerns("$JS.API.X", listen) is None
    assert Violation(SUBSCRIBE, f"{INBOX.lower()}.*").concerns("$JS.API.X", []) is None


def test_the_record_keeps_denials_until_the_connection_is_lost_and_only_so_many() -> None:
    record = PermissionRecord()
    assert record.note(OSError("connection reset")) is None
    assert record.note(violation(f'permissions violation for subscription to "{INBOX}.*"')) is not None
    record.note(violation(f'permissions violation for publish to "{CREATE_KV}"'))
    denied = record.denied(listen=[f"{INBOX}.*"])
    assert denied is not None and (denied.operation, denied.subject) == (SUBSCRIBE, f"{INBOX}.*")
    by_publish = record.denied(publish=["edge.one.x", CREATE_KV])
    assert by_publish is not None and (by_publish.operation, by_publish.subject) == (PUBLISH, CREATE_KV)
    record.disconnected()  # the next connection subscribes again, and the server judges that anew
    assert record.denied(publish=[CREATE_KV], listen=[f"{INBOX}.*"]) is None
    for n in range(permissions.REMEMBERED + 10):
        record.note(violation(f'permissions violation for subscription to "_inbox.{n}"'))
    assert record.denied(listen=["_inbox.0"]) is None
    assert record.denied(listen=[f"_inbox.{permissions.REMEMBERED + 9}"]) is not None


def test_the_message_is_one_line_naming_the_operation_the_subject_and_the_documentation() -> None:
    for denied, says in (
        (PermissionDenied(PUBLISH, CREATE_KV), f'may not publish to "{CREATE_KV}"'),
        (PermissionDenied(SUBSCRIBE, f"{INBOX}.*", "where the replies to X come"), f'subscribe to "{INBOX}.*"'),
        (PermissionDenied(PUBLISH, "_inbox.a.b", reply=True), 'publish with the reply subject "_inbox.a.b"'),
    ):
        text = str(denied)
        assert "\n" not in text and text.startswith("permission denied: this account ") and says in text, text
        assert "docs/permissions.md" in text and "no reply" not in text and "timed out" not in text


# --- a request on a connection -------------------------------------------------------------------------------


class StandIn:
    """What ``request_json`` uses of a nats-py client. A request is never answered unless ``reply`` is set; the
    server's ``-ERR`` comes through ``during`` (called once the request is sent, like nats-py's read loop would)."""

    def __init__(self) -> None:
        self._resp_sub_prefix: bytearray | None = None
        self.sent: list[str] = []
        self.reply: Any = None
        self.during: Callable[[], None] | None = None
        self.record = permissions.attach(self)

    @property
    def client(self) -> Any:
        """This stand-in where a nats-py client is expected."""
        return self

    def server_says(self, text: str) -> None:
        self.record.note(violation(text))

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5, **_: Any) -> Any:
        if self._resp_sub_prefix is None:  # nats-py subscribes its request inbox at the first request
            self._resp_sub_prefix = bytearray(f"{INBOX}.".encode())
        self.sent.append(subject)
        if self.during is not None:
            asyncio.get_running_loop().call_soon(self.during)
        if self.reply is not None:
            return self.reply
        try:
            await asyncio.wait_for(asyncio.Event().wait(), timeout)
        except TimeoutError:
            raise NatsTimeoutError from None


async def test_a_denied_publish_ends_its_request_at_once_and_names_the_subject_as_sent() -> None:
    nc = StandIn()
    nc.during = lambda: nc.server_says(f'Permissions Violation for Publish to "{CREATE_KV}"')
    with anyio.fail_after(WAIT), pytest.raises(PermissionDenied) as caught:
        await JsApi(nc.client, "$JS.API").request(
            "STREAM.CREATE.KV_nats-bridge", {"name": "KV_nats-bridge"}, timeout=60
        )
    assert (caught.value.operation, caught.value.subject) == (PUBLISH, CREATE_KV)
    assert f'"{CREATE_KV}"' in str(caught.value)


async def test_a_denied_reply_inbox_ends_the_first_request_and_every_later_one_before_it_is_sent() -> None:
    nc = StandIn()
    nc.during = lambda: nc.server_says(f'permissions violation for subscription to "{INBOX}.*"')
    with anyio.fail_after(WAIT), pytest.raises(PermissionDenied) as caught:
        await request_json(nc.client, "$JS.API.STREAM.INFO.AGG", b"", 60)
    assert (caught.value.operation, caught.value.subject) == (SUBSCRIBE, f"{INBOX}.*")
    assert "$JS.API.STREAM.INFO.AGG" in str(caught.value)  # what the replies were for
    nc.during = None
    with anyio.fail_after(WAIT), pytest.raises(PermissionDenied):
        await request_json(nc.client, "$JS.API.STREAM.INFO.AGG", b"", 60)
    assert nc.sent == ["$JS.API.STREAM.INFO.AGG"]  # the second one was never sent: its reply could not come
    nc.record.disconnected()  # a new connection subscribes the inbox again: requests are worth sending again
    with pytest.raises(ApiTimeout, match="no reply"):
        await request_json(nc.client, "$JS.API.STREAM.INFO.AGG", b"", 0.01)


async def test_a_timeout_is_a_denial_when_the_record_learnt_meanwhile_that_the_reply_could_not_come() -> None:
    # the -ERR reached the record before nats-py's inbox was known to the request (nothing to match it with yet)
    nc = StandIn()
    nc.server_says(f'permissions violation for subscription to "{INBOX}.*"')
    with pytest.raises(PermissionDenied) as caught:
        await request_json(nc.client, "$JS.API.STREAM.INFO.AGG", b"", 0.01)
    assert isinstance(caught.value.__cause__, ApiTimeout)


async def test_other_subjects_denials_and_other_errors_leave_a_request_alone() -> None:
    nc = StandIn()

    def elsewhere() -> None:
        nc.server_says('permissions violation for publish to "$js.fc.orders.c.x"')
        nc.record.note(OSError("connection reset"))

    nc.during = elsewhere
    nc.reply = type("Msg", (), {"data": b'{"ok": true}'})()
    assert await request_json(nc.client, "$JS.API.STREAM.INFO.AGG", b"", 60) == {"ok": True}
    nc.reply = None
    with pytest.raises(ApiTimeout):
        await request_json(nc.client, "$JS.API.STREAM.INFO.AGG", b"", 0.01)


async def test_someone_elses_cancellation_goes_through_untouched() -> None:
    nc = StandIn()
    with anyio.move_on_after(0.05) as scope:
        await request_json(nc.client, "$JS.API.STREAM.INFO.AGG", b"", 60)
    assert scope.cancelled_caught


async def test_a_watch_on_a_client_opened_elsewhere_watches_nothing() -> None:
    with permissions.watch(object(), publish="x", listen=["y"]) as watching:
        await anyio.lowlevel.checkpoint()
    assert watching.denied is None


async def test_a_direct_get_watch_hears_its_own_inbox_denied() -> None:
    nc = StandIn()
    watching = permissions.watch(nc, publish="$JS.API.DIRECT.GET.AGG", listen=["_INBOX.Zz9.*"])
    with anyio.fail_after(WAIT), pytest.raises(PermissionDenied) as caught, watching:
        nc.server_says('permissions violation for subscription to "_inbox.zz9.*"')
        await anyio.sleep_forever()
    assert (caught.value.operation, caught.value.subject) == (SUBSCRIBE, "_INBOX.Zz9.*")
