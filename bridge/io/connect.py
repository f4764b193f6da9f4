"""Opening nats-py connections from the bridge's configuration (auth, TLS, reconnect policy).

Both sides reconnect forever: the bridge is a daemon and a server restart is routine. The first connection is
retried by the caller (nats-py gives up on a failed initial connect), with the error mapped to the side's type.

A failed TLS handshake on the *first* connect makes nats-py (2.16) hang for good: it closes the half-upgraded
socket and then awaits the plain stream's ``wait_closed()``, which never completes because the transport's
protocol was swapped for TLS. So the first connect is abandoned as soon as nats-py reports a TLS error (it could
not have tried another server anyway), and is bounded in time whatever happens.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from nats import errors as nats_errors
from nats.aio.client import Client as NATS

from bridge.errors import BridgeError
from bridge.io import permissions, wire
from bridge.ports import Callback, ErrorCallback

if TYPE_CHECKING:
    from pydantic import SecretStr

    from bridge.config import AuthConfig, TlsConfig


class ConnectionSettings(Protocol):
    """What a side's configuration offers to open a connection (TargetConfig, SourceConfig and the audit's
    ReadOptions all do)."""

    @property
    def servers(self) -> list[str]: ...
    @property
    def auth(self) -> AuthConfig | None: ...
    @property
    def tls(self) -> TlsConfig | None: ...


# nats-py's first connect makes at most two attempts per server (max_reconnect_attempts = 1); each is bounded by
# connect_timeout for the TCP connect, the INFO line, the TLS handshake and the PONG, plus the wait between tries.
_ATTEMPTS_PER_SERVER = 2
_TIMEOUTS_PER_ATTEMPT = 4


def _secret(value: SecretStr | None) -> str | None:
    if value is None:
        return None
    getter = getattr(value, "get_secret_value", None)
    return str(getter() if getter else value)


def tls_context(tls: TlsConfig | None) -> ssl.SSLContext | None:
    """An SSL context for the side's ``tls`` settings, or None when TLS is not configured."""
    if tls is None:
        return None
    ca = getattr(tls, "ca_file", None)
    cert = getattr(tls, "cert_file", None)
    key = getattr(tls, "key_file", None)
    if not (ca or cert):
        return None
    ctx = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca else None)
    if cert:
        ctx.load_cert_chain(str(cert), str(key) if key else None)
    return ctx


def drop_unsent_publishes(nc: Any) -> int:
    """Discard the publishes nats-py still holds in its write buffer after a connection was lost; returns how many.

    nats-py replays that buffer on the new connection once it reconnects. The publishes written to the old socket
    just before them may have died with it (a killed server), so the replay would store later messages ahead of
    earlier ones: the aggregate's order would break. Dropped publishes are simply in flight without an ack; the
    engine reads the target and re-sends them, in order. Other buffered commands (PING, SUB) are kept.
    """
    pending = getattr(nc, "_pending", None)
    if not isinstance(pending, list):
        return 0
    kept = [cmd for cmd in pending if not bytes(cmd[:5]).startswith((b"PUB ", b"HPUB "))]
    dropped = len(pending) - len(kept)
    if dropped:
        nc._pending = kept
        nc._pending_data_size = sum(len(cmd) for cmd in kept)
    return dropped


def connect_options(side: ConnectionSettings, *, name: str) -> dict[str, Any]:
    """nats-py ``connect`` keyword arguments for one side (no callbacks)."""
    opts: dict[str, Any] = {
        "servers": list(side.servers),
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.5,
        "connect_timeout": 2,
        "ping_interval": 10,
        "max_outstanding_pings": 2,
        # while reconnecting, publishes are refused rather than buffered: the engine retries them itself,
        # and a large buffer would only hide how far behind the target is
        "pending_size": 0,
    }
    auth = side.auth
    if auth is not None:
        if getattr(auth, "user", None):
            opts["user"] = auth.user
            opts["password"] = _secret(getattr(auth, "password", None)) or ""
        token = _secret(getattr(auth, "token", None))
        if token:
            opts["token"] = token
        if getattr(auth, "nkey_seed_file", None):
            opts["nkeys_seed"] = str(auth.nkey_seed_file)
        if getattr(auth, "creds_file", None):
            opts["user_credentials"] = str(auth.creds_file)
    ctx = tls_context(side.tls)
    if ctx is not None:
        opts["tls"] = ctx
    return opts


async def open_connection(
    side: ConnectionSettings,
    *,
    name: str,
    error_type: type[BridgeError],
    on_disconnected: Callback | None = None,
    on_reconnected: Callback | None = None,
    on_error: ErrorCallback | None = None,
) -> NATS:
    """Connect once; raise ``error_type`` (never a nats-py exception) naming the servers when it fails.

    The connection's permission denials are recorded for the requests made on it (:mod:`bridge.io.permissions`)."""

    async def _noop() -> None:
        return None

    opts = connect_options(side, name=name)
    # nats-py retries a failed *first* connect forever when reconnects are unlimited, so it would never return
    # (nor see a SIGTERM); connect with a bounded attempt count, then let the live connection reconnect forever
    opts["max_reconnect_attempts"] = 1
    connected = False
    seen: list[Exception] = []
    abandon = anyio.CancelScope()
    nc = NATS()
    record = permissions.attach(nc)

    async def errors(exc: Exception) -> None:
        # before the side's own handler, which may throttle its log lines: every request must hear of a denial
        record.note(exc)
        if connected and on_error is not None:
            await on_error(exc)
        elif not connected:  # failed first attempts are reported once, by the caller, with the real cause
            seen.append(exc)
            if isinstance(exc, ssl.SSLError):
                abandon.cancel()  # nats-py would hang next (module docstring); it runs this in the connecting task

    async def disconnected() -> None:
        record.disconnected()
        await (on_disconnected or _noop)()

    wire.install(nc)  # before connecting: the parser cannot be swapped under a running read loop
    bound = (
        len(side.servers)
        * _ATTEMPTS_PER_SERVER
        * (_TIMEOUTS_PER_ATTEMPT * opts["connect_timeout"] + opts["reconnect_time_wait"])
    )
    failure: BaseException | None = None
    try:
        with anyio.move_on_after(bound) as deadline, abandon:
            await nc.connect(
                **opts,
                disconnected_cb=disconnected,
                reconnected_cb=on_reconnected or _noop,
                error_cb=errors,
            )
    except Exception as exc:  # nats-py raises a wide variety (OSError, NoServersError, auth errors...)
        failure = exc
    if failure is None and not nc.is_connected:  # abandoned: a TLS failure, or the deadline
        timed_out = TimeoutError(f"not connected within {bound:g}s") if deadline.cancelled_caught else None
        failure = timed_out or ConnectionError("connection abandoned")
    if failure is not None:
        cause = describe(_most_telling(seen) if seen else failure)
        cause += _missing_client_certificate(nc, side, cause)
        await _discard(nc)
        raise error_type(f"cannot connect to {', '.join(side.servers)}: {cause}") from failure
    connected = True
    nc.options["max_reconnect_attempts"] = -1
    return nc


def _missing_client_certificate(nc: Any, side: ConnectionSettings, cause: str) -> str:
    """A hint when the server asked for a client certificate (``tls_verify`` in its INFO) and none is configured.

    The server's "certificate required" alert reaches the client only if it reads before it writes: under TLS 1.3
    the handshake looks complete to the client, which then often meets a broken pipe instead.
    """
    info = getattr(nc, "_server_info", None) or {}
    has_cert = bool(side.tls is not None and getattr(side.tls, "cert_file", None))
    if not info.get("tls_verify") or has_cert or "certificate required" in cause.lower():
        return ""
    return (
        "; the server requires a client certificate (certificate required) and none is configured: set "
        "tls.cert_file and tls.key_file"
    )


def _most_telling(errors: list[Exception]) -> Exception:
    """The error that explains a failed first connect best: what the server answered (``Authorization
    Violation``) or a TLS failure, rather than the reset or broken pipe a later attempt on the same server may
    meet (which attempt gets which varies from run to run)."""
    for exc in errors:
        if isinstance(exc, ssl.SSLError):
            return exc
        if isinstance(exc, nats_errors.Error) and not isinstance(exc, nats_errors.NoServersError):
            return exc
    return errors[-1]


async def _discard(nc: NATS) -> None:
    """Release what an abandoned first connect left behind (its socket), without waiting on nats-py."""
    transport = getattr(nc, "_transport", None)
    for attr in ("_io_writer", "_bare_io_writer"):
        writer = getattr(transport, attr, None)
        raw = getattr(writer, "transport", None)
        if raw is not None:
            raw.abort()
    with anyio.move_on_after(1):
        await close_connection(nc)


async def close_connection(nc: NATS) -> str | None:
    """Close ``nc``; returns what closing it raised (a dead connection's), as text, or None.

    nats-py's close of a connection it lost waits for the transport's close, and that wait can end in
    ``CancelledError`` although nobody cancelled the caller (seen after a protocol error, with the connection
    reconnecting). Escaping, that exception cancelled the task group of the task closing it: every source and the
    fleet with it, and the bridge stopped with exit 0 as if asked. It is kept here unless the calling task really is
    being cancelled."""
    try:
        await nc.close()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return "closing was cancelled by nats-py"
    except Exception as exc:
        return describe(exc)
    return None


PERMISSION_HINT = "the user lacks a permission the bridge needs: see docs/permissions.md (the subject is in the error)"


def error_fields(exc: BaseException) -> dict[str, str]:
    """Log fields for an asynchronous connection error: its description, and a hint when it is a missing permission
    (nats-py reports those as ``permissions violation for publish to "<subject>"``)."""
    text = describe(exc)
    fields = {"error": text}
    if "permissions violation" in text.lower():
        fields["hint"] = PERMISSION_HINT
    return fields


def describe(exc: BaseException) -> str:
    """A one-line description of a nats-py or OS error, never including credentials."""
    text = str(exc).strip() or type(exc).__name__
    if type(exc).__name__ not in text:
        text = f"{type(exc).__name__}: {text}"
    return text.splitlines()[0][:300]
