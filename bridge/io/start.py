"""Where a new source's consumer starts (``sources[].start``, ``start_sequence``, ``start_time``, ``start_ago``).

A start position is applied once: when the bridge (``run`` or ``setup``) creates the managed consumer, and only if
the aggregate holds no copy of the source yet (a source with copies resumes from them whatever ``start`` says: a
consumer re-created under an existing aggregate must not skip what the copies do not cover). A consumer that exists
keeps the deliver policy it was created with (the server refuses to change it).

Every start is resolved to a sequence when the consumer is created: ``start_sequence`` itself, ``new`` the one after
the stream's last message, a time (``start_time``, or ``start_ago`` before the creation) the first message stored at
or after it (``STREAM.MSG.GET`` by time; on a server before 2.11, which cannot, a binary search by sequence). The
sequence is kept in the consumer's metadata (:data:`START_SEQ`): whoever binds it later knows what lies below was
skipped on purpose, whatever floors the server reports (a pull consumer started past the stream's end shows an ack
floor of 0 before 2.14), and the stranded-message watch never looks there. On Limits and Interest origins the consumer
is ``by_start_sequence``; a WorkQueue stream allows only ``deliver_policy: all``: the consumer is created with it and
RESET to the start before its first delivery (a 2.14 API, so flow-control mode only). Nothing before the start is ever
acked by the bridge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from bridge.config import SourceConfig
from bridge.core.modes import Mode
from bridge.errors import ConsumerUnfit
from bridge.io.jsapi import ANY_SUBJECT, NO_MESSAGE_FOUND, ApiError, JsApi

START_SEQ = "nats-bridge.start_seq"  # consumer metadata: the WorkQueue start's sequence
APPLIED = "applied"  # how a decision that applied the start begins
DELIVER_KEYS = ("deliver_policy", "opt_start_seq", "opt_start_time")
CopiesExist = Callable[[], Awaitable[bool]]


def rfc3339(moment: datetime) -> str:
    """``moment`` as the server writes times (UTC, ``Z``)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def deliver_fields(info: Mapping[str, Any]) -> dict[str, Any]:
    """An existing consumer's deliver policy and start metadata, from its ``CONSUMER.INFO`` (kept by every update)."""
    cfg = info.get("config", {})
    fields: dict[str, Any] = {key: cfg[key] for key in DELIVER_KEYS if cfg.get(key)}
    start = (cfg.get("metadata") or {}).get(START_SEQ)
    if start:
        fields["metadata"] = {START_SEQ: start}
    return fields


def start_seq_of(info: Mapping[str, Any]) -> int:
    """The WorkQueue start's sequence a consumer carries in its metadata (0: none)."""
    value = (info.get("config", {}).get("metadata") or {}).get(START_SEQ)
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def start_moment(source: SourceConfig, now: datetime) -> datetime | None:
    """The time a time-based start names (``start_time``, or ``start_ago`` before ``now``); None for the others."""
    if source.start_time is not None:
        return source.start_time
    if source.start_ago is not None:
        return now - timedelta(seconds=source.start_ago)
    return None


async def first_seq_at(api: JsApi, stream: str, moment: datetime, timeout: float) -> int | None:
    """The sequence of the stream's first message stored at or after ``moment`` (None: none yet): one
    ``STREAM.MSG.GET`` by time, or, on a server before 2.11 that cannot look a time up, a binary search by sequence
    (store times rise with sequences; about 20 requests for a million messages)."""
    try:
        reply = await api.request(f"STREAM.MSG.GET.{stream}", {"start_time": rfc3339(moment)}, timeout)
    except ApiError as exc:
        if exc.err_code == NO_MESSAGE_FOUND:
            return None
        return await _search_by_seq(api, stream, moment, timeout)
    return int((reply.get("message") or {}).get("seq") or 0) or None


async def _search_by_seq(api: JsApi, stream: str, moment: datetime, timeout: float) -> int | None:
    wanted = int(moment.timestamp() * 1e9)
    state = (await api.stream_info(stream, timeout=timeout)).get("state", {})
    lo, hi = int(state.get("first_seq", 0)), int(state.get("last_seq", 0))
    found: int | None = None
    while lo and lo <= hi:  # the first stored message at or after `mid` (deleted ones are stepped over)
        mid = (lo + hi) // 2
        message = await api.get_message(stream, mid, ANY_SUBJECT, timeout)
        if message is None or message.seq > hi:
            hi = mid - 1
        elif message.timestamp_ns >= wanted:
            found, hi = message.seq, mid - 1
        else:
            lo = message.seq + 1
    return found


async def creation_fields(
    api: JsApi, source: SourceConfig, mode: Mode, timeout: float, copies_exist: CopiesExist | None
) -> tuple[dict[str, Any] | None, str]:
    """The deliver fields a managed consumer with a start position is created or updated with, and what was decided
    (for the log: "" when the consumer exists and keeps its own; ``applied: ...`` when the start is applied, or
    ``ignored: ...``). None: ``deliver_policy: all`` (the default).

    Raises ``ConsumerUnfit`` for a start pull mode cannot give (a WorkQueue origin before 2.14), and the
    ``bridge.errors`` API errors."""
    found = await api.find_consumer(source.stream, source.consumer, timeout=timeout)
    if found is not None:
        return deliver_fields(found), ""
    if copies_exist is not None and await copies_exist():
        return None, "ignored: the aggregate holds copies of this source, which it resumes from"
    info = await api.stream_info(source.stream, timeout=timeout)
    workqueue = info.get("config", {}).get("retention") == "workqueue"
    if workqueue and mode is Mode.PULL:
        raise ConsumerUnfit(
            f"sources[{source.name}]: start {source.start_position} on the WorkQueue stream {source.stream!r} "
            "needs flow-control mode (nats-server 2.14+): before 2.14 a WorkQueue consumer delivers from the "
            "first message and cannot be reset past it; remove the start, or upgrade the origin"
        )
    last_seq = int(info.get("state", {}).get("last_seq", 0))
    moment = start_moment(source, datetime.now(UTC))
    seq: int | None = source.start_sequence
    if seq is None and moment is not None:
        seq = await first_seq_at(api, source.stream, moment, timeout) or last_seq + 1
    elif seq is None:
        seq = last_seq + 1  # "new": what comes after the stream's last message now
    decision = f"{APPLIED}: {source.start_position} (sequence {seq})"
    # the start's sequence rides in the metadata: the engine's floor whatever the server reports (a pull
    # consumer started past the stream's end shows an ack floor of 0 before 2.14) and whoever binds it later
    start = {"metadata": {START_SEQ: str(seq)}}
    if workqueue:  # the server allows only "all" there: the consumer is reset to the start before it delivers
        return {"deliver_policy": "all", **start}, decision
    return {"deliver_policy": "by_start_sequence", "opt_start_seq": seq, **start}, decision
