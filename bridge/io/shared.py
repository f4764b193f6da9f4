"""One origin connection for the sources that reach the same servers with the same credentials and TLS settings.

In the sidecar position every source reaches its leaf through the hub (by its JetStream domain), so a process of a
thousand sources would otherwise hold a thousand connections to one server: a read loop, a flusher, pings and a
wake-up per heartbeat each. Sources that share the connection settings (``servers``, ``auth``, ``tls``) share one
connection instead (:class:`OriginConnections`, owned by the daemon), each with subscriptions of its own, and keep
today's isolation:

* **Connection events** (lost, back) reach every source on the connection, and each recovers exactly as it does on
  a connection of its own (the engine's ``source_reconnected``).
* **Errors** naming one source's subjects (a permission denied on its deliver subject, its consumer's API, its
  acks or flow-control answers; a slow consumer on its subscription) reach that source only
  (:func:`names_source`); the server keeps the connection for a permissions violation, so the others go on. An
  error naming nobody's subject is the connection's: it is logged once, here.
* **The first connect** is made once for all the sources waiting for it; if it fails, each of them gets the
  failure and retries on its own (jittered) schedule, and the next attempt is again made once.
* **The last source** to leave closes the connection; the next one to join opens a new one.
* **A flush** (a PING and its PONG: the server has everything written before it) is made once for every source
  asking meanwhile (:class:`GroupRun`): a thousand sources stopping together wait for a few PINGs, not a thousand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from nats.aio.client import Client as NATS

from bridge.errors import BridgeError, OriginUnavailable
from bridge.io import wire
from bridge.io.connect import ConnectionSettings, close_connection, describe, error_fields, open_connection
from bridge.io.directory import StreamDirectory
from bridge.io.group import GroupRun
from bridge.io.permissions import error_subjects
from bridge.logs import Throttle, get_logger
from bridge.ports import Callback, ErrorCallback

CONNECTION_NAME = "nats-bridge origin"
QUIET_READ_WAIT = 0.1  # a read that brought only heartbeats lets the next wait up to this long (bridge.io.wire)
FLUSH_TIMEOUT = 1  # seconds a flush waits for its PONG (nats-py takes an int)


def names_source(text: str, *, deliver_subject: str, inbox: str, api_prefix: str, stream: str, consumer: str) -> bool:
    """Whether an error's text names a subject of one source: its deliver subject or pull inbox, its stream or
    consumer's API (under its ``api_prefix``), or an ack or flow-control subject of its consumer.

    Compared without case: the server's ``-ERR`` text reaches the client lowercased."""
    deliver_subject, inbox, api_prefix = deliver_subject.lower(), inbox.lower(), api_prefix.lower()
    stream, consumer = stream.lower(), consumer.lower()
    for subject in error_subjects(text):
        if subject in (deliver_subject, inbox) and subject:
            return True
        tokens = subject.split(".")
        if stream not in tokens:
            continue
        if subject.startswith(api_prefix + ".") and (consumer in tokens or "stream" in tokens):
            return True
        if subject.startswith(("$js.ack.", "$js.fc.")) and consumer in tokens:
            return True
    return False


@dataclass(eq=False)
class Member:
    """One source on a shared connection: its connection callbacks, and whether an error's text is about it."""

    source: str
    on_disconnected: Callback
    on_reconnected: Callback
    on_error: ErrorCallback
    claims: Callable[[str], bool]
    # an error about nobody in particular (logged once by the connection): the source only notes it
    on_connection_error: Callable[[Exception], None] | None = None


@dataclass(eq=False)
class _Attempt:
    """A first connect under way, which every source that asks meanwhile waits for."""

    done: anyio.Event = field(default_factory=anyio.Event)
    nc: NATS | None = None
    error: BridgeError | None = None


class SharedConnection:
    """One connection and the sources on it."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self.settings = settings
        self.nc: NATS | None = None
        self.members: dict[Member, None] = {}  # (an insertion-ordered set: a thousand leave in O(1) each)
        self._flushes: GroupRun[None] = GroupRun()
        self._directories: dict[str, StreamDirectory] = {}  # per JetStream API prefix (domain) on this connection
        self._attempt: _Attempt | None = None
        self._throttle = Throttle()
        self._log = get_logger(component="origin", servers=list(settings.servers))

    def directory(self, api_prefix: str) -> StreamDirectory:
        """The streams of the origin reached under ``api_prefix`` on this connection, shared by its sources."""
        directory = self._directories.get(api_prefix)
        if directory is None:
            directory = self._directories[api_prefix] = StreamDirectory(api_prefix)
        return directory

    async def join(self, member: Member) -> NATS:
        """The connection, opened if none is (raises ``OriginUnavailable``); ``member`` is on it from now on."""
        nc = await self._connection()
        self.members[member] = None
        return nc

    async def leave(self, member: Member) -> None:
        """``member`` is off the connection; the last one closes it."""
        self.members.pop(member, None)
        if self.members or self.nc is None:
            return
        nc, self.nc = self.nc, None
        with anyio.CancelScope(shield=True):
            failed = await close_connection(nc)
            if failed is not None:  # closing a dead connection
                self._log.debug("origin.close_failed", error=failed)

    async def flush(self) -> None:
        """Wait until the server has everything written on the connection before this call (nats-py's flush, one
        for every source asking meanwhile); gives up after ``FLUSH_TIMEOUT`` without a word, as before a close."""
        await self._flushes.run(self._flush_once)

    async def _flush_once(self) -> None:
        nc = self.nc
        if nc is not None and nc.is_connected:
            await wire.flush(nc, FLUSH_TIMEOUT)

    async def _connection(self) -> NATS:
        if self.nc is not None and not self.nc.is_closed:
            return self.nc  # up, or reconnecting by itself (nats-py): the sources see it come back
        attempt = self._attempt
        if attempt is not None:  # someone is connecting: its outcome is ours
            await attempt.done.wait()
            if attempt.nc is not None:
                return attempt.nc
            raise attempt.error or OriginUnavailable("connection abandoned")
        self._attempt = attempt = _Attempt()
        try:
            attempt.nc = self.nc = await open_connection(
                self.settings,
                name=CONNECTION_NAME,
                error_type=OriginUnavailable,
                on_disconnected=self._disconnected,
                on_reconnected=self._reconnected,
                on_error=self._error,
            )
            # quiet sources' heartbeats, and many sources' deliveries, read together (bridge.io.wire.coalesce_reads)
            wire.coalesce_reads(attempt.nc, QUIET_READ_WAIT)
            return attempt.nc
        except BridgeError as exc:
            attempt.error = exc
            raise
        finally:
            self._attempt = None
            attempt.done.set()

    async def _disconnected(self) -> None:
        for member in list(self.members):
            await member.on_disconnected()

    async def _reconnected(self) -> None:
        for member in list(self.members):
            await member.on_reconnected()

    async def _error(self, exc: Exception) -> None:
        subject = getattr(exc, "subject", None)  # a slow consumer names its subscription's subject
        text = f'{describe(exc)} "{subject}"' if isinstance(subject, str) else describe(exc)
        claimed = [member for member in self.members if member.claims(text)]
        for member in claimed:
            await member.on_error(exc)
        if any(directory.claims(text) for directory in self._directories.values()):
            return  # a listing refused: its request failed at once, and the directory said so (bridge.io.directory)
        if not claimed:
            for member in self.members:
                if member.on_connection_error is not None:
                    member.on_connection_error(exc)
            suppressed = self._throttle.allow(time.monotonic())
            if suppressed is not None:
                self._log.warning(
                    "origin.error", **error_fields(exc), sources=len(self.members), similar_suppressed=suppressed
                )


class OriginConnections:
    """The process's origin connections, one per distinct connection settings (servers, credentials, TLS)."""

    def __init__(self) -> None:
        self._connections: dict[tuple[object, ...], SharedConnection] = {}

    def for_settings(self, settings: ConnectionSettings) -> SharedConnection:
        """The shared connection for ``settings`` (made on first use; it connects when a source joins)."""
        key = _key(settings)
        connection = self._connections.get(key)
        if connection is None:
            connection = self._connections[key] = SharedConnection(settings)
        return connection

    def open_connections(self) -> int:
        """Connections open now."""
        return sum(1 for c in self._connections.values() if c.nc is not None)


def _key(settings: ConnectionSettings) -> tuple[object, ...]:
    # what decides who may share: the servers and everything that authenticates, secrets compared by value (kept
    # in memory only, never logged)
    auth, tls = settings.auth, settings.tls
    secrets = (
        ()
        if auth is None
        else (
            auth.user,
            auth.password.get_secret_value() if auth.password is not None else None,
            auth.token.get_secret_value() if auth.token is not None else None,
            str(auth.nkey_seed_file),
            str(auth.creds_file),
        )
    )
    files = () if tls is None else (str(tls.ca_file), str(tls.cert_file), str(tls.key_file))
    return (tuple(settings.servers), secrets, files)
