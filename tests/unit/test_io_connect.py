"""``bridge.io.connect``: ``drop_unsent_publishes`` against nats-py's own client and command encoding, and
``close_connection``."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from nats.aio.client import Client
from nats.protocol import command

from bridge.io.connect import close_connection, drop_unsent_publishes


def test_unsent_publishes_are_dropped_and_other_commands_kept() -> None:
    nc = Client()
    sub = command.sub_cmd("inbox.>", "", 1)
    ping = b"PING\r\n"
    nc._pending = [
        command.pub_cmd("agg.1", "inbox.1.1", b"one"),
        sub,
        command.hpub_cmd("agg.2", "inbox.2.1", b"NATS/1.0\r\nBridge-Seq: 2\r\n\r\n", b"two"),
        ping,
    ]
    nc._pending_data_size = sum(len(c) for c in nc._pending)
    assert drop_unsent_publishes(nc) == 2
    assert nc._pending == [sub, ping]
    assert nc._pending_data_size == len(sub) + len(ping)


def test_nothing_pending_is_a_no_op() -> None:
    nc = Client()
    assert drop_unsent_publishes(nc) == 0
    assert nc._pending == []
    assert drop_unsent_publishes(object()) == 0  # a client without that buffer: nothing to do


def test_a_permissions_violation_gets_a_hint_and_other_errors_do_not() -> None:
    from nats.errors import Error

    from bridge.io.connect import PERMISSION_HINT, error_fields

    denied = error_fields(Error('nats: permissions violation for publish to "$js.fc.orders.c.abcd"'))
    assert denied["hint"] == PERMISSION_HINT and '"$js.fc.orders.c.abcd"' in denied["error"]
    assert "hint" not in error_fields(OSError("connection refused"))


def test_a_missing_client_certificate_is_named_whatever_the_socket_said() -> None:
    from pathlib import Path
    from types import SimpleNamespace

    from bridge.io.connect import _missing_client_certificate

    asks = Client()
    asks._server_info = {"tls_required": True, "tls_verify": True}
    side = SimpleNamespace(servers=["tls://x:4222"], auth=None, tls=SimpleNamespace(ca_file=Path("ca.pem")))
    hint = _missing_client_certificate(asks, side, "BrokenPipeError: [Errno 32] Broken pipe")
    assert "certificate required" in hint and "tls.cert_file" in hint
    # the alert itself got through: nothing to add
    said = "SSLError: [SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required"
    assert _missing_client_certificate(asks, side, said) == ""
    # a certificate is configured, or the server does not ask for one: some other problem
    with_cert = SimpleNamespace(servers=side.servers, auth=None, tls=SimpleNamespace(cert_file=Path("c.pem")))
    assert _missing_client_certificate(asks, with_cert, "BrokenPipeError") == ""
    plain = Client()
    plain._server_info = {"tls_required": True}
    assert _missing_client_certificate(plain, side, "BrokenPipeError") == ""


class _ClosingRaises:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.closed = False

    async def close(self) -> None:
        self.closed = True
        raise self.exc


@pytest.mark.anyio
async def test_closing_a_lost_connection_keeps_nats_py_s_own_cancellation() -> None:
    """nats-py's close of a lost connection can end in CancelledError nobody asked for: escaping, it cancelled
    the whole task group of the task closing (every source, the fleet: the bridge stopped with exit 0)."""
    nc = _ClosingRaises(asyncio.CancelledError())
    assert await close_connection(nc) == "closing was cancelled by nats-py"  # type: ignore[arg-type]
    assert nc.closed
    assert await close_connection(_ClosingRaises(OSError("gone"))) == "OSError: gone"  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_task_really_cancelled_while_closing_is_cancelled() -> None:
    started = anyio.Event()

    class _Slow:
        async def close(self) -> None:
            started.set()
            await anyio.Event().wait()  # until cancelled

    finished: list[bool] = []

    async def close() -> None:
        await close_connection(_Slow())  # type: ignore[arg-type]
        finished.append(True)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(close)
            await started.wait()
            tg.cancel_scope.cancel()
    assert finished == []  # the cancellation went through, as for any cancelled await
