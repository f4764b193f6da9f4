"""A faster reader of the NATS protocol for nats-py connections, handing hot subscriptions' messages over raw.

nats-py turns every ``MSG``/``HMSG`` into a ``Msg`` object (a regex match on the control line, the header block
parsed into a dict, subject and reply decoded), queues it on the subscription's ``asyncio.Queue`` and wakes the
subscription's task, which awaits the callback. For the bridge's two per-message subscriptions (the consumer's
deliver subject and the publish-ack inbox) that machinery cost about a third of its CPU per replicated message,
and none of it buys anything: both callbacks only feed a pure state machine and never await.

:class:`WireParser` replaces the connection's protocol parser (``nc._ps``) before the connection is made. It
parses control lines with ``find``/``split`` instead of regular expressions, and a message for a subscription
registered with :func:`add_handler` is handed to a plain synchronous function as ``(subject, reply,
header_block, payload)`` bytes, in wire order, from the read loop itself; one registered with :func:`add_sink`
(the two hot ones) is appended to a list as such a tuple by the compiled core (``bridge.core.frames``), and its
owner takes the list once the read is parsed. Every other message, and every other
protocol line (``PING``, ``PONG``, ``INFO``, ``-ERR``, ``+OK``), goes to nats-py exactly as its own parser would
send it, so requests, JetStream API calls and reconnects are untouched.

This reaches into nats-py internals (``Client._ps``, ``_process_msg`` and friends, ``Subscription._id``), checked
by :func:`install`; a client without them keeps its own parser and :func:`add_handler` reports that, so callers
fall back to ordinary subscription callbacks.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import math
import sys
import termios
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.errors import ProtocolError
from nats.protocol.parser import ERR_RE, INFO_RE, MAX_CONTROL_LINE_SIZE, Parser

from bridge.core.frames import Frame, parse_msg_line, take, take_messages

__all__ = [
    "RawHandler",
    "WireParser",
    "add_after_parse",
    "add_handler",
    "add_sink",
    "adopt_sink",
    "coalesce_reads",
    "crowded_read_lingers",
    "has_raw_writes",
    "install",
    "missing_hooks",
    "quiet_read_wait",
    "reading_behind",
    "remove_after_parse",
    "remove_handler",
    "subscribe_sink",
    "take",
    "unread_bytes",
]

RawHandler = Callable[[bytes, bytes, bytes | None, bytes], None]
"""``(subject, reply, header_block or None, payload)``; must not await (it runs inside the read loop)."""

_CRLF = b"\r\n"
QUIET_AFTER = 1.0  # seconds of nothing but quiet reads before a read waits (a busy connection never does)
QUIET_SHARE = 0.05  # a quiet read waits at most this share of the quiet spell so far (and at most quiet_wait)
# A busy read on a connection of at least CROWDED hot subscriptions (sources) smaller than FULL_READ bytes (it left
# the socket empty), less than twice CROWDED_LINGER after the one before, lets CROWDED_LINGER pass before the next read
CROWDED = 32
FULL_READ = 16 * 1024
CROWDED_LINGER = 0.005
# A connection is behind when this much it received is not parsed yet: more than a quiet read's wait gathers (2,000
# quiet sources' heartbeats in 100 ms are about 40 KiB), less than a stalled process leaves (a second of those is
# 400 KiB). Looked at most every BEHIND_CHECK_EVERY seconds, whoever asks.
BEHIND_BYTES = 64 * 1024
BEHIND_CHECK_EVERY = 0.05


class WireParser(Parser):
    """nats-py's ``Parser``, faster, with synchronous raw handlers for chosen subscription ids."""

    def __init__(self, nc: Any) -> None:
        self.handlers: dict[int, RawHandler] = {}
        self.sinks: dict[int, list[Frame]] = {}
        # per sink, its owner's hook, called once after a read that appended to it (``filled``: in the order the
        # read filled them); a connection shared by a thousand sources hands over to those a read concerned only
        self.on_read: dict[int, Callable[[], None]] = {}
        self.filled: list[int] = []
        self.after_parse: list[Callable[[], None]] = []
        # seconds the next read waits after a *quiet* one (see :func:`coalesce_reads`); 0: never
        self.quiet_wait = 0.0
        # seconds the socket is not read after a small busy read on a crowded connection (crowded_read_lingers); 0:
        # never
        self.linger = 0.0
        self._read_at = -math.inf  # (monotonic) the last busy read
        self._behind = False
        self._behind_checked = -math.inf  # (monotonic)
        self._busy_at = -math.inf  # (monotonic) the last read that was not quiet
        super().__init__(nc)

    def reset(self) -> None:
        """Forget any partial input (nats-py calls this when it reconnects)."""
        super().reset()
        self._epoch = getattr(self, "_epoch", 0) + 1  # a parse suspended in an await must not write stale state
        self._rest = b""  # unparsed bytes: the start of a line or message that has not fully arrived
        self._chunks: list[bytes] = []  # pieces of one large message, joined once all of it is here
        self._have = 0
        self._need = 0  # bytes from the start of ``_rest`` that complete the pending message (0: unknown)

    async def parse(self, data: bytes = b"") -> None:
        """Parse ``data`` (appended to what an earlier call left over) and dispatch what is complete."""
        if data:
            # Anything read shows the connection alive. nats-py counts its PINGs unanswered until it parses their
            # PONGs, and closes the connection as stale after two: a process behind its socket (a thousand sources
            # reconnecting at once) parses a PONG long after it came, and would drop a live connection, and with
            # it every source on it, for being busy. Only silence is stale.
            self.nc._pings_outstanding = 0
        if self._need:
            # a message larger than one read: gather the pieces and join them once, not once per read
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return
            buf = b"".join(self._chunks)
            self._chunks, self._have, self._need = [], 0, 0
        else:
            buf = self._rest + data if self._rest else data
        epoch = self._epoch
        pos = 0
        end_of_data = len(buf)
        handlers = self.handlers
        sinks = self.sinks
        nc = self.nc
        quiet = True  # nothing but sink frames without a reply subject (and control lines) so far
        try:
            while pos < end_of_data:
                if sinks:
                    # the hot subscriptions' frames, taken by the compiled core; the rest is parsed below
                    pos = take_messages(buf, pos, sinks, self.filled)
                    if pos >= end_of_data:
                        break
                eol = buf.find(_CRLF, pos)
                if eol < 0:
                    if end_of_data - pos > MAX_CONTROL_LINE_SIZE:
                        raise ProtocolError
                    break
                first = buf[pos]
                if first == 77 or first == 72:  # "M"SG, "H"MSG
                    fields = parse_msg_line(buf[pos:eol])
                    if fields is None:  # nats-py's read loop only recovers from a ProtocolError
                        raise ProtocolError
                    subject, sid, reply, header_size, total = fields
                    start = eol + 2
                    stop = start + total
                    if stop + 2 > end_of_data:
                        self._need = stop + 2 - pos  # parsed again once complete: cheaper than keeping state
                        break
                    header = buf[start : start + header_size] if header_size else None
                    payload = buf[start + header_size : stop]
                    pos = stop + 2
                    quiet = False
                    handler = handlers.get(sid)
                    if handler is None:
                        await nc._process_msg(sid, subject, reply, payload, header)
                        if self._epoch != epoch:
                            return
                        continue
                    try:
                        handler(subject, reply, header, payload)
                    except Exception as exc:
                        # as nats-py does for a failing subscription callback: report it and go on reading (an
                        # exception escaping parse() would end the read loop for good)
                        await nc._error_cb(exc)
                        if self._epoch != epoch:
                            return
                    continue
                line = buf[pos : eol + 2]
                pos = eol + 2
                if line == b"PING\r\n":
                    await nc._process_ping()
                elif line == b"PONG\r\n":
                    await nc._process_pong()
                elif line.startswith(b"+OK"):
                    pass
                elif line.startswith(b"-ERR"):
                    match = ERR_RE.match(line)
                    await nc._process_err((match.group(1) or b"").decode().lower() if match else "")
                elif line.startswith(b"INFO"):
                    match = INFO_RE.match(line)
                    if match is None:
                        raise ProtocolError
                    try:
                        info = json.loads(match.group(1).decode())
                    except ValueError as exc:
                        raise ProtocolError from exc
                    await nc._process_info(info)
                else:
                    raise ProtocolError
                if self._epoch != epoch:
                    return
        finally:
            # unless reset() ran meanwhile: then the rest of this input belongs to a connection that is gone
            if self._epoch == epoch:
                self._keep(buf[pos:] if pos else buf)
        if self.filled:
            filled, self.filled = self.filled, []
            if quiet and (self.quiet_wait or self.linger):
                quiet = all(not frame[1] for sid in filled for frame in sinks.get(sid, ()))
            on_read = self.on_read
            for sid in filled:
                owner = on_read.get(sid)
                if owner is None:
                    continue
                try:
                    owner()
                except Exception as exc:
                    await nc._error_cb(exc)
        for hook in self.after_parse:
            try:
                hook()
            except Exception as exc:
                await nc._error_cb(exc)
        if self._epoch != epoch or not (self.quiet_wait or self.linger):
            return
        now = time.monotonic()
        if not quiet:
            self._busy_at = now
            since, self._read_at = now - self._read_at, now
            if crowded_read_lingers(len(sinks), len(data), since, self.linger):
                await self._wait_quietly(self.linger)
                self._read_at = time.monotonic()
        elif self.quiet_wait:
            wait = quiet_read_wait(now - self._busy_at, self.quiet_wait)
            if wait > 0.0:
                await self._wait_quietly(wait)

    async def _wait_quietly(self, wait: float) -> None:
        # the event loop reads a readable socket whatever the read loop does: pause the transport, so that what
        # arrives meanwhile waits in the kernel and comes in one recv
        transport = _socket_transport(self.nc)
        if not (hasattr(transport, "pause_reading") and transport.is_reading()):
            # another kind of transport (the wait alone still batches the parses), or one its stream reader paused
            # (a full buffer: that one resumes it)
            await asyncio.sleep(wait)
            return
        transport.pause_reading()
        try:
            await asyncio.sleep(wait)
        finally:
            transport.resume_reading()

    def behind(self) -> bool:
        """Whether at least ``BEHIND_BYTES`` this connection received wait to be parsed (``unread_bytes``)."""
        now = time.monotonic()
        if now - self._behind_checked >= BEHIND_CHECK_EVERY:
            self._behind_checked = now
            self._behind = unread_bytes(self.nc) >= BEHIND_BYTES
        return self._behind

    def _keep(self, rest: bytes) -> None:
        if self._need:
            self._chunks, self._have = [rest], len(rest)
            self._rest = b""
        else:
            self._rest = rest


# the nats-py internals the fast paths use: this parser, and the publisher's direct writes (bridge.io.target)
CLIENT_HOOKS = ("_ps", "_process_msg", "_send_command", "_flush_queue", "_flush_pending", "_pending", "_transport")


def missing_hooks() -> list[str]:
    """The nats-py internals the wire path needs that this nats-py lacks (empty when all are there).

    Without them the bridge still works, through nats-py's public API, only slower; the version cap in
    pyproject.toml keeps a tested nats-py, and start-up warns when an untested one lacks what it needs.
    """
    from nats.aio.client import Client

    client = Client()
    missing = [name for name in CLIENT_HOOKS if not hasattr(client, name)]
    if "_ps" not in missing and not isinstance(client._ps, Parser):
        missing.append("_ps (a nats.protocol.parser.Parser)")
    return missing


def has_raw_writes(nc: Any) -> bool:
    """Whether this nats-py client has the internals the bridge writes commands through (``_send_command`` into its
    buffer, ``_transport`` straight to the socket): the publisher's batches and pull mode's acks."""
    return all(
        hasattr(nc, name)
        for name in ("_send_command", "_flush_queue", "_flush_pending", "_pending", "_transport", "max_payload")
    )


class _Outbox:
    """What this event-loop pass wrote to one connection with :func:`write_soon`, the transport it was for, and the
    fences of the parts written under one."""

    __slots__ = ("fenced", "parts", "transport")

    def __init__(self, transport: Any) -> None:
        self.parts: list[bytes] = []
        self.transport = transport
        self.fenced: list[tuple[int, Callable[[], bool]]] = []  # (index in parts, its source's fence)


def write_soon(nc: Any, data: bytes, fence: Callable[[], bool] | None = None) -> None:
    """Write ``data`` to ``nc``'s socket at the end of this event-loop pass, in one call with everything else written
    so meanwhile, in order. Every source on a shared connection writes the publishes of one read: a system call
    each was a quarter of a busy 2,000-source process's time. For a connection that is up (``nc.is_connected``);
    whoever then writes through nats-py's buffer directly (not through its ``publish``) calls :func:`flush_writes`
    first.

    What nats-py holds unwritten (``nc._pending``: its publishes and requests wait there for its flusher task) is
    taken into the same write, ahead of ``data``, so nothing overtakes it; its flusher then finds nothing to write.
    Waiting for the flusher instead made every later write of the pass wait too: on a connection shared by a
    thousand sources, one API request sent every source's flow-control answers through the flusher and woke
    each source's executor (half of them, 1,000 sources at 1 msg/s).

    ``fence``: the lease fence of the source whose publishes or answers ``data`` is; looked at again when the pass
    writes, and ``data`` is dropped if it closed meanwhile (:func:`flush_writes`)."""
    outbox: _Outbox | None = getattr(nc, "_bridge_outbox", None)
    if outbox is None:
        outbox = nc._bridge_outbox = _Outbox(nc._transport)
        asyncio.get_running_loop().call_soon(flush_writes, nc)
    pending = nc._pending
    if pending:
        outbox.parts.extend(pending)
        nc._pending = []
        nc._pending_data_size = 0
    if fence is not None:
        outbox.fenced.append((len(outbox.parts), fence))
    outbox.parts.append(data)


def flush_writes(nc: Any) -> None:
    """Write now what :func:`write_soon` holds for ``nc`` (before anything that must follow it). Held for a
    connection replaced since, it is dropped, as if written to the old one just before it died: what it carried is
    never acked, and the engine's ack timeouts and verification take it from there.

    A part whose source's fence closed since it was written is dropped the same way. A process stopped between a
    source's fence check and this write (SIGSTOP, a paused VM) would otherwise send, when it wakes, publishes
    decided under a lease another process may have taken meanwhile: duplicates in the aggregate once its duplicate
    window has passed (seen in tests/integration/test_leases.py). What is left of that race is the few instructions
    from here to the socket, and what the transport itself holds when the socket is full."""
    outbox: _Outbox | None = getattr(nc, "_bridge_outbox", None)
    if outbox is None:
        return
    nc._bridge_outbox = None
    if outbox.transport is None or outbox.transport is not nc._transport:
        return
    parts = outbox.parts
    closed = {index for index, fence in outbox.fenced if not fence()}
    if closed:
        parts = [part for index, part in enumerate(parts) if index not in closed]
        if not parts:
            return
    outbox.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))


def install(nc: Any) -> WireParser | None:
    """Give a not yet connected nats-py client a :class:`WireParser`; None when its internals are not as expected."""
    if not isinstance(getattr(nc, "_ps", None), Parser) or not hasattr(nc, "_process_msg"):
        return None
    parser = WireParser(nc)
    nc._ps = parser
    return parser


async def flush(nc: Any, timeout: float = 10.0) -> None:
    """nats-py's ``flush`` made the barrier its name promises: returns once the server has read everything written
    on ``nc`` before the call (``asyncio.TimeoutError`` after ``timeout`` seconds, as nats-py's).

    nats-py writes the PING straight to the socket, while what waits in its buffer (``nc._pending``, written by its
    flusher task a moment later) and in this module's outbox (:func:`write_soon`) follows it: the PONG could come
    back before the server had read a SUB sent just before, and a publish from another connection right after the
    flush found no subscriber (seen on a loaded machine). Both are written first, in order."""
    if has_raw_writes(nc) and nc.is_connected and nc._transport is not None:
        write_soon(nc, b"")  # what nats-py holds joins this pass's outbox, behind what is already in it
        flush_writes(nc)
    await nc.flush(timeout=timeout)


def _socket_transport(nc: Any) -> Any:
    """The asyncio transport under nats-py's TCP transport (None for another kind)."""
    return getattr(getattr(getattr(nc, "_transport", None), "_io_writer", None), "transport", None)


def unread_bytes(nc: Any) -> int:
    """Bytes ``nc`` received that nothing has parsed yet: in nats-py's stream reader and in the kernel's receive
    buffer of its socket (FIONREAD); 0 for what cannot be seen (another transport, a closed socket)."""
    buffered = len(getattr(getattr(getattr(nc, "_transport", None), "_io_reader", None), "_buffer", b""))
    kernel = 0
    try:
        sock = _socket_transport(nc).get_extra_info("socket")
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
        kernel = int.from_bytes(raw, sys.byteorder, signed=True)
    except (AttributeError, OSError, ValueError):
        pass
    return buffered + max(0, kernel)


def reading_behind(nc: Any) -> bool:
    """Whether ``nc`` holds a backlog not parsed yet (:meth:`WireParser.behind`; False without the wire parser)."""
    parser = getattr(nc, "_ps", None)
    return isinstance(parser, WireParser) and parser.behind()


def quiet_read_wait(quiet_for: float, most: float) -> float:
    """How long the socket is not read after a quiet read, on a connection that carried nothing but quiet reads for
    ``quiet_for`` seconds: nothing for the first ``QUIET_AFTER``, then a twentieth of the spell (``QUIET_SHARE``),
    at most ``most``. What waits is the first delivery after the spell: it comes at most 5% later than the spell
    lasted, and a long spell's reads are ten a second, not fifty."""
    if quiet_for < QUIET_AFTER:
        return 0.0
    return min(most, quiet_for * QUIET_SHARE)


def crowded_read_lingers(sinks: int, size: int, since: float, linger: float) -> bool:
    """Whether the socket of a connection with ``sinks`` hot subscriptions waits ``linger`` seconds before its next
    read, after a busy read (deliveries, acks, requests) of ``size`` bytes ``since`` seconds after the busy read
    before.

    Why: a thousand sources at 1 msg/s each on one connection are a thousand deliveries a second, and each read
    costs an event-loop pass, a ``recv``, nats-py's read loop, the parse and the publishes' write whatever it brings:
    read as they come, most reads brought one or two frames and the passes, not the messages, were most of the
    process's CPU. So on a crowded connection (``CROWDED`` subscriptions or more: the shared origin connection of
    many sources) a busy read that came soon after the last (within twice ``linger``) lets the next wait ``linger``:
    what arrives meanwhile comes in one read, and its publishes and answers leave in one write. The price is latency,
    at most ``linger`` (5 ms) per connection a message crosses, and only while the connection is busy: the first
    read after a lull never waits, nor a connection of a few sources (a single busy source keeps its latency), nor
    a read of ``FULL_READ`` bytes or more (it may have left more in the socket: a backlog is read as fast as it
    comes). Measured by bytes, not frames: a rule of fewer than 8 frames lingered only every other read at 1,000
    sources (a lingered read brought more than 8, so the next came at once and brought one or two)."""
    return linger > 0.0 and sinks >= CROWDED and size < FULL_READ and since < 2 * linger


def coalesce_reads(nc: Any, wait: float, linger: float = CROWDED_LINGER) -> bool:
    """After a read that brought nothing but idle heartbeats (frames of the hot subscriptions without a reply
    subject) and protocol lines, let the next read wait up to ``wait`` seconds (:func:`quiet_read_wait`), so that
    many quiet consumers' heartbeats arrive in one read instead of one read each; and after a small busy read on a
    crowded connection, ``linger`` seconds (:func:`crowded_read_lingers`). False when ``nc`` has no
    :class:`WireParser`. For origin connections, where the deliveries and flow-control requests are (the target
    connection's publish acks carry no reply subject: its reads are never busy in this sense, so it is not set
    there).

    Why: a flow-control consumer's heartbeat is fixed at 1 s by the server, so a thousand quiet sources on one origin
    connection are a thousand messages a second, and each read of the socket costs an event-loop turn, a ``recv``,
    nats-py's read loop and a parse whatever it brings: about half of what an idle source costs (in-process profile,
    1,000 quiet sources). A read that brought a delivery, a flow-control request (both carry a reply subject) or
    anything for nats-py's own subscriptions (API replies) never waits, and neither does any read for
    ``QUIET_AFTER`` seconds after one of those (a busy source among quiet ones keeps the connection's latency):
    what waits is the first delivery after a quiet spell, by at most a twentieth of the spell and at most ``wait``."""
    parser = getattr(nc, "_ps", None)
    if not isinstance(parser, WireParser):
        return False
    parser.quiet_wait = wait
    parser.linger = linger
    return True


def add_handler(nc: Any, sub: Any, handler: RawHandler) -> bool:
    """Hand ``sub``'s messages to ``handler`` from now on; False when ``nc`` has no :class:`WireParser`."""
    parser, sid = _parser_and_sid(nc, sub)
    if parser is None:
        return False
    parser.handlers[sid] = handler
    return True


def add_sink(nc: Any, sub: Any, sink: list[Frame], on_read: Callable[[], None] | None = None) -> bool:
    """Append ``sub``'s messages to ``sink`` as :data:`~bridge.core.frames.Frame` tuples from now on, in wire order;
    its owner takes them (:func:`take`) in ``on_read``, called once after each read that appended to it (or in an
    :func:`add_after_parse` hook). False when ``nc`` has no :class:`WireParser`."""
    parser, sid = _parser_and_sid(nc, sub)
    if parser is None:
        return False
    parser.sinks[sid] = sink
    if on_read is not None:
        parser.on_read[sid] = on_read
    return True


async def subscribe_sink(
    nc: Any,
    subject: str,
    sink: list[Frame],
    on_read: Callable[[], None],
    fallback: Callable[[Msg], Awaitable[None]],
    early: Callable[[list[Msg]], None],
    **limits: int,
) -> Any:
    """Subscribe ``subject`` with its messages appended to ``sink`` (:func:`add_sink`) and return the subscription.

    With a :class:`WireParser`, nats-py is given no callback, so it makes no task for the subscription (a task per
    subscription, two subscriptions per source, was most of what a quiet source cost in memory), and
    :func:`adopt_sink` hands over what nats-py queued before the sink took over. Without the parser, nats-py's
    ``fallback`` callback takes every message. ``limits`` are nats-py's pending limits.
    """
    if not isinstance(getattr(nc, "_ps", None), WireParser):
        return await nc.subscribe(subject, cb=fallback, **limits)
    sub = await nc.subscribe(subject, **limits)
    if adopt_sink(nc, sub, sink, on_read, early):
        return sub
    # a subscription the parser cannot name (an untested nats-py): nats-py's own dispatch, or nothing would read it
    await sub.unsubscribe()
    return await nc.subscribe(subject, cb=fallback, **limits)


def adopt_sink(
    nc: Any, sub: Any, sink: list[Frame], on_read: Callable[[], None], early: Callable[[list[Msg]], None]
) -> bool:
    """Register ``sink`` for a subscription made without a callback, then hand what nats-py had queued for it (a
    read between its SUB and now) to ``early``, at once: before anything the sink gets, so the order holds. False
    (nothing registered) when ``nc`` has no :class:`WireParser` or ``sub`` no id it knows."""
    registered = add_sink(nc, sub, sink, on_read)
    queue: asyncio.Queue[Msg] | None = getattr(sub, "_pending_queue", None)
    if queue is not None and not queue.empty():
        queued: list[Msg] = []
        while not queue.empty():
            queued.append(queue.get_nowait())
        early(queued)
    if registered and queue is not None:
        # nothing is queued for it from now on: neither its queue nor the message iterator that holds it (with a
        # future of its own) need exist; nats-py asks both only whether they are there
        sub._pending_queue = SINKED
        sub._message_iterator = None
        sub._pending_next_msgs_calls = None
    return registered


class _Sinked:
    """What stands for the pending queue of every subscription whose messages go to a sink: nats-py makes an
    ``asyncio.Queue`` per subscription (four deques, about 3 KB; two subscriptions per source), which such a
    subscription never uses once :func:`adopt_sink` took over. Always empty. While its sink is registered the
    parser hands it every message; after :func:`remove_handler` (a source abandoned when its lease was lost detaches
    from a subscription it no longer reads) nats-py puts what still arrives here, and it is dropped: nobody may act
    on it, and nothing of it was acked, so the consumer delivers it again to whoever owns the source next. (The
    queue it replaces kept such messages, unread, until nats-py's pending limit.)"""

    __slots__ = ()

    def empty(self) -> bool:
        return True

    def qsize(self) -> int:
        return 0

    def put_nowait(self, msg: object) -> None:
        return


SINKED = _Sinked()


def _parser_and_sid(nc: Any, sub: Any) -> tuple[WireParser | None, int]:
    parser = getattr(nc, "_ps", None)
    sid = getattr(sub, "_id", None)
    if not isinstance(parser, WireParser) or not isinstance(sid, int):
        return None, 0
    return parser, sid


def add_after_parse(nc: Any, hook: Callable[[], None]) -> bool:
    """Call ``hook`` each time everything one read brought has been handed over; False without a WireParser."""
    parser = getattr(nc, "_ps", None)
    if not isinstance(parser, WireParser):
        return False
    parser.after_parse.append(hook)
    return True


def remove_after_parse(nc: Any, hook: Callable[[], None]) -> None:
    """Undo :func:`add_after_parse`."""
    parser = getattr(nc, "_ps", None)
    if isinstance(parser, WireParser) and hook in parser.after_parse:
        parser.after_parse.remove(hook)


def remove_handler(nc: Any, sub: Any) -> None:
    """Stop handing ``sub``'s messages to a raw handler or sink (before unsubscribing it)."""
    parser = getattr(nc, "_ps", None)
    if isinstance(parser, WireParser):
        parser.handlers.pop(getattr(sub, "_id", None), None)  # type: ignore[arg-type]
        parser.sinks.pop(getattr(sub, "_id", None), None)  # type: ignore[arg-type]
        parser.on_read.pop(getattr(sub, "_id", None), None)  # type: ignore[arg-type]
