"""Reading a source's newest copies back from the aggregate, for restart recovery.

The server's own sourcing scans its destination backwards for the newest ``Nats-Stream-Source`` per source
(docs/protocol.md 4.4). A client cannot read backwards, so this reads backwards in forward chunks: positions
``[hi - n + 1, hi]``, then the chunk below it with ``n`` doubled, until it has ``depth`` copies of the source or
reaches the first message. Each chunk is one batched Direct Get (``{"seq", "batch", "next_by_subj"}``, ended by a
``204 EOB`` status; ADR-31) when the stream allows direct access, else one ``STREAM.MSG.GET`` per message. With a
``subject_prefix`` the server filters other sources out; without one every message of the chunk is read and its
``Bridge-Source`` compared.

ADR-31 (Direct Get): https://github.com/nats-io/nats-architecture-and-design/blob/main/adr/ADR-31.md
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.aio.client import Client as NATS

from bridge.core import headers as hdr
from bridge.core.pipeline import TargetLimits
from bridge.core.recovery import Copy
from bridge.core.targetwire import AckOutcome
from bridge.errors import BridgeError, TargetUnavailable
from bridge.io.directget import read_batches
from bridge.io.jsapi import STREAM_NOT_FOUND, ApiError, JsApi
from bridge.io.target import SourcePublisher
from bridge.ports import Gate

# A publish retried after an ack timeout must still meet its first attempt in the aggregate's duplicate window
SHORT_WINDOW_ACK_TIMEOUTS = 2
MAX_CHUNK = 65536
# restart recoveries reading the aggregate at once, per process (each holds up to MAX_BYTES of replies in flight)
CONCURRENT_TAIL_READS = 4

# Without a subject_prefix every message of the aggregate is read and its Bridge-Source compared; this bounds
# that scan (a new source joining a big shared aggregate would otherwise read all of it at start).
MAX_SCANNED = 1_000_000
BATCH = 1024
MAX_BYTES = 8 * 1024 * 1024
# The aggregate's limits are the same for every source: a read younger than this serves them all (a thousand sources
# starting together would otherwise send a thousand identical STREAM.INFOs); a blocked source's re-read, waiting
# for an operator's fix, sees the change within it.
LIMITS_FRESH = 1.0


def duplicate_window_short(window_seconds: float, ack_timeout: float) -> bool:
    """A duplicate window below ``SHORT_WINDOW_ACK_TIMEOUTS`` ack timeouts: a retried publish may be stored twice."""
    return window_seconds < SHORT_WINDOW_ACK_TIMEOUTS * ack_timeout


class _Read:
    """One read of a ``SharedReads``: when it began, and its reply or failure once ``done`` is set (neither: it was
    cancelled, and whoever waited for it reads again)."""

    __slots__ = ("began", "done", "error", "reply")

    def __init__(self, began: float) -> None:
        self.began = began
        self.done = anyio.Event()
        self.reply: dict[str, Any] | None = None
        self.error: BaseException | None = None


class SharedReads:
    """A request whose reply many sources want (the aggregate's ``STREAM.INFO``), made once for all of them.

    ``since(read, t)`` returns the reply of a read that *began* at or after ``t``: a source that needs what the stream
    held when it asked passes the time it asked, and gets no older reply than its own read would have been; one
    content with a recent one passes an earlier time. Asks arriving while a read is under way wait for it if it
    began late enough, else for the next one, which the first of them starts once it ends: a thousand sources asking
    together cost a few reads, not a thousand. A failure goes to every caller of its read and is not kept."""

    def __init__(self) -> None:
        self._latest: _Read | None = None  # the last read that succeeded
        self._current: _Read | None = None  # the read under way

    async def since(self, read: Callable[[], Awaitable[dict[str, Any]]], t: float) -> dict[str, Any]:
        while True:
            latest, current = self._latest, self._current
            if latest is not None and latest.began >= t and latest.reply is not None:
                return latest.reply
            if current is None:
                current = await self._perform(read)
            else:
                await current.done.wait()
            if current.began >= t:
                if current.error is not None:
                    raise current.error
                if current.reply is not None:
                    return current.reply
            # too old for this caller, or cancelled: the next read

    async def _perform(self, read: Callable[[], Awaitable[dict[str, Any]]]) -> _Read:
        this = self._current = _Read(anyio.current_time())
        try:
            this.reply = await read()
            self._latest = this
        except Exception as exc:
            this.error = exc
        finally:
            self._current = None
            this.done.set()
        return this


@dataclass(frozen=True, slots=True)
class TargetSide:
    """The shared connection to the aggregate (``bridge.ports.TargetPort`` over nats-py)."""

    nc: NATS
    api: JsApi
    stream: str
    publish_window: int
    ack_timeout: float
    timeout: float = 5.0  # for API requests
    tail_reads: anyio.Semaphore = field(default_factory=lambda: anyio.Semaphore(CONCURRENT_TAIL_READS))
    infos: SharedReads = field(default_factory=SharedReads)

    def publisher(
        self, on_outcomes: Callable[[Sequence[AckOutcome]], None], fence: Callable[[], bool] | None = None
    ) -> SourcePublisher:
        return SourcePublisher(self.nc, on_outcomes, fence)

    async def _info(self, since: float) -> dict[str, Any]:
        return await self.infos.since(lambda: self.api.stream_info(self.stream, timeout=self.timeout), since)

    async def limits(self) -> TargetLimits:
        """The server's ``max_payload`` and, if the stream can be read, its ``max_msg_size`` and subjects, from a
        ``STREAM.INFO`` begun at most ``LIMITS_FRESH`` ago (shared by every source: ``SharedReads``)."""
        max_payload = int(self.nc.max_payload or 0)
        try:
            config = (await self._info(anyio.current_time() - LIMITS_FRESH)).get("config", {})
        except BridgeError:
            return TargetLimits(max_payload)
        return TargetLimits(
            max_payload,
            int(config.get("max_msg_size", -1)),
            tuple(config.get("subjects") or ()),
            batched=bool(config.get("allow_batched")),
        )

    async def read_tail(
        self, source: str, subject_filter: str, floor: int, depth: int, slot: Gate | None = None
    ) -> tuple[list[Copy], bool]:
        asked = anyio.current_time()

        @contextlib.asynccontextmanager
        async def reading() -> AsyncIterator[None]:
            # a few at a time: hundreds of sources starting together would otherwise ask for more than the server
            # lets one client have pending (it closes a slow consumer's connection), and the publishes share it
            async with slot() if slot is not None else contextlib.nullcontext(), self.tail_reads:
                yield

        # the stream's state from any read begun after this ask, without a slot: sources asking together share
        # one (on an empty aggregate that is the whole read, and a thousand sources starting together no longer
        # queue for it behind each other's consumer creates)
        return await read_source_tail(
            self.nc,
            self.api,
            self.stream,
            source,
            subject_filter,
            floor,
            depth,
            self.timeout,
            info=lambda: self._info(asked),
            gate=reading,
        )


async def read_source_tail(
    nc: NATS,
    api: JsApi,
    stream: str,
    source: str,
    subject_filter: str,
    floor: int,
    cap: int,
    timeout: float,
    *,
    info: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    gate: Gate | None = None,
) -> tuple[list[Copy], bool]:
    """The copies of ``source`` in ``stream`` above ``floor``, newest first read, oldest first returned.

    Reads backwards until a copy at or below ``floor`` (or the stream's first message) is reached: then the
    second value is True. It stops early, returning False, once ``cap`` copies above the floor were read or
    ``MAX_SCANNED`` messages were examined. ``info`` gives the stream's ``STREAM.INFO`` (read here by default);
    each read of messages is made inside ``gate`` (a slot among requests in flight), when given.
    """
    try:
        reply = await (info() if info is not None else api.stream_info(stream, timeout=timeout))
    except ApiError as exc:
        if exc.err_code == STREAM_NOT_FOUND:
            return [], True  # a stream that does not exist holds no copies; publishes will block until it does
        raise TargetUnavailable(f"aggregate stream {stream!r}: {exc.description}") from exc
    state = reply.get("state", {})
    first, last = int(state.get("first_seq", 0)), int(state.get("last_seq", 0))
    direct = bool(reply.get("config", {}).get("allow_direct"))
    copies: list[Copy] = []
    if last == 0 or state.get("messages", 0) == 0:
        return copies, True
    hi, chunk = last, 1024
    reached = False
    scanned = 0
    while hi >= first and not reached and len(copies) < cap and scanned < MAX_SCANNED:
        lo = max(first, hi - chunk + 1)
        async with gate() if gate is not None else contextlib.nullcontext():
            found = await read_range(nc, api, stream, lo, hi, subject_filter, timeout, direct=direct)
        scanned += len(found)
        for headers in found:
            prov = hdr.parse_provenance(headers)
            if prov is not None and prov.source == source:
                if prov.stream_seq <= floor:
                    reached = True
                else:
                    copies.append(Copy(prov.stream_seq, prov.prev_seq, _skipped_from(headers.get(hdr.SKIPPED))))
        hi, chunk = lo - 1, min(chunk * 2, MAX_CHUNK)
    copies.sort(key=lambda c: c.stream_seq)
    return copies, reached or hi < first


def _skipped_from(value: str | None) -> int:
    """The first sequence of a copy's ``Bridge-Skipped: <first>-<last>`` (0: none, or not readable)."""
    first = (value or "").partition("-")[0]
    return int(first) if first.isdigit() else 0


async def read_range(
    nc: NATS,
    api: JsApi,
    stream: str,
    lo: int,
    hi: int,
    subject_filter: str = ">",
    timeout: float = 5.0,
    *,
    direct: bool = True,
) -> list[dict[str, str]]:
    """Headers of the messages with sequence in ``[lo, hi]`` matching ``subject_filter``, in stream order.

    Each dict also holds ``Nats-Sequence`` (the aggregate sequence) when read by Direct Get.
    """
    if direct:
        return await _direct_range(nc, api, stream, lo, hi, subject_filter, timeout)
    return await _msg_get_range(api, stream, lo, hi, subject_filter, timeout)


async def _direct_range(
    nc: NATS, api: JsApi, stream: str, lo: int, hi: int, subject_filter: str, timeout: float
) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    batches = read_batches(
        nc,
        api.prefix,
        stream,
        lo,
        hi,
        error_type=TargetUnavailable,
        subject_filter=subject_filter,
        batch=BATCH,
        max_bytes=MAX_BYTES,
        timeout=timeout,
        verify=True,  # a lagging replica's short reply would hide the newest copies (directget)
    )
    async for messages in batches:
        for message in messages:
            message.headers["Nats-Sequence"] = str(message.seq)
            out.append(message.headers)
    return out


async def _msg_get_range(
    api: JsApi, stream: str, lo: int, hi: int, subject_filter: str, timeout: float
) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    seq = lo
    while seq <= hi:
        try:
            reply = await api.request(f"STREAM.MSG.GET.{stream}", {"seq": seq, "next_by_subj": subject_filter}, timeout)
        except ApiError as exc:
            if exc.code == 404:
                break
            raise TargetUnavailable(f"message get on {stream!r}: {exc.description}") from exc
        message = reply.get("message", {})
        mseq = int(message.get("seq", 0))
        if mseq == 0 or mseq > hi:
            break
        raw = message.get("hdrs")
        headers = hdr.parse_header_block(base64.b64decode(raw)) if raw else {}
        headers["Nats-Sequence"] = str(mseq)
        out.append(headers)
        seq = mseq + 1
    return out
