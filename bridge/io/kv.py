"""The coordination bucket: a JetStream KV bucket used through plain JetStream requests.

A KV bucket is a stream ``KV_<bucket>`` on ``$KV.<bucket>.>`` keeping one message per key. The writes the leases
need are compare-and-set: a publish to ``$KV.<bucket>.<key>`` with ``Nats-Expected-Last-Subject-Sequence`` (0: the
key must not exist) is stored only if the key's last revision is the one named, else refused with err_code 10071.
A delete is such a write with ``KV-Operation: DEL`` and no payload. The bucket's ``max_age`` is the lease TTL:
the server drops a key that long after its last write. The whole bucket is read with one batched Direct Get
``{"multi_last": ["$KV.<bucket>.>"]}`` (nats-server 2.11+): the last message of every key still stored.

Plain requests rather than nats-py's KV keep the API prefix (domain) explicit, keep the errors in the bridge's
family and make every write's revision check visible here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.client import Client as NATS
from nats.errors import TimeoutError as NatsTimeoutError

from bridge.core import headers as hdr
from bridge.core.fleet import GROUP_PREFIX, LEASE_PREFIX, PRESENCE_PREFIX, Holder, Member, View
from bridge.errors import ApiError, ApiTimeout, ApiUnavailable, BridgeError
from bridge.io import permissions, wire
from bridge.io.connect import describe
from bridge.io.directget import read_batches
from bridge.io.jsapi import STREAM_NAME_IN_USE, STREAM_NOT_FOUND, JsApi, request_json, request_soon

WRONG_LAST_SEQUENCE = 10071
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
OPERATION = "KV-Operation"
HISTORY = 1  # values kept per key (the bucket's max_msgs_per_subject): a lease needs only its last
MULTI_LAST_LIMIT = 1024  # keys one multi_last request may match (ADR-31); more is a 413
UP_TO_SEQUENCE = "Nats-UpTo-Sequence"
DUPLICATE_WINDOW_NS = 120_000_000_000  # the server's default; a bucket with a TTL takes the shorter
_N = TypeVar("_N", int, float)


class KvConflict(BridgeError):
    """A compare-and-set write was refused: the key is not at the revision named (someone else wrote it)."""


@dataclass(frozen=True, slots=True)
class KvEntry:
    """The last message of one key: its value, revision, and whether it is a delete marker."""

    key: str
    revision: int
    value: bytes
    deleted: bool


class KvBucket:
    """One KV bucket reached through ``api`` (its prefix names the domain)."""

    def __init__(self, nc: NATS, api: JsApi, bucket: str) -> None:
        self.nc = nc
        self.api = api
        self.bucket = bucket
        self.stream = f"KV_{bucket}"
        self.prefix = f"$KV.{bucket}."

    async def ensure(self, ttl: float, replicas: int, timeout: float) -> float:
        """Create the bucket when missing (``max_age`` = ``ttl``); return the TTL the bucket really has.

        An existing bucket is never changed: its ``max_age`` is what the server enforces, so that is the TTL every
        lease is timed by, whatever this process was configured with (the caller says so when they differ).
        """
        info = await self.lookup(timeout)
        if info is None:
            info, _ = await self.create(ttl, replicas, timeout)
        max_age = int(info.get("config", {}).get("max_age", 0))
        if max_age <= 0:
            raise ApiError(
                f"{self.api.prefix}.STREAM.INFO.{self.stream}",
                0,
                0,
                f"KV bucket {self.bucket!r} has no TTL (max_age): leases in it would never expire; delete it or "
                "name another coordination.bucket",
            )
        return max_age / 1e9

    async def lookup(self, timeout: float) -> dict[str, Any] | None:
        """The bucket's stream info, or None when the bucket does not exist (nothing is created)."""
        try:
            return await self.api.stream_info(self.stream, timeout=timeout)
        except ApiError as exc:
            if exc.err_code != STREAM_NOT_FOUND:
                raise
            return None

    def creation_config(
        self, ttl: float, replicas: int, description: str = "nats-bridge leases and presence"
    ) -> dict[str, Any]:
        """The stream configuration the bucket is created with: ``max_age`` = ``ttl`` (0: a key stays until it is
        removed), :data:`HISTORY` per key."""
        ttl_ns = int(ttl * 1e9)
        return {
            "name": self.stream,
            "description": description,
            "subjects": [f"{self.prefix}>"],
            "retention": "limits",
            "max_msgs_per_subject": HISTORY,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_msg_size": -1,
            "max_age": ttl_ns,
            "duplicate_window": min(ttl_ns, DUPLICATE_WINDOW_NS) if ttl_ns else DUPLICATE_WINDOW_NS,
            "discard": "new",
            "storage": "file",
            "num_replicas": replicas,
            "allow_rollup_hdrs": True,
            "deny_delete": True,
            "allow_direct": True,
        }

    async def create(self, ttl: float, replicas: int, timeout: float) -> tuple[dict[str, Any], bool]:
        """Create the bucket, never changing an existing one; return its info and whether this call created it
        (False: a twin created it in the meantime, with another configuration)."""
        return await self.create_stream(self.creation_config(ttl, replicas), timeout)

    async def create_stream(self, config: dict[str, Any], timeout: float) -> tuple[dict[str, Any], bool]:
        """Create the bucket's stream with ``config`` unless it exists: its info, and whether this call created it."""
        try:
            reply = await self.api.request(f"STREAM.CREATE.{self.stream}", config, timeout)
        except ApiError as exc:
            if exc.err_code == STREAM_NAME_IN_USE:  # created by a twin in the meantime
                return await self.api.stream_info(self.stream, timeout=timeout), False
            raise
        return reply, True

    async def write(self, key: str, value: bytes, revision: int | None, timeout: float, *, delete: bool = False) -> int:
        """Store ``value`` under ``key``; with ``revision`` (0: absent) only if the key is at that revision.

        Returns the new revision; raises :class:`KvConflict` when the revision check fails.
        """
        headers = _write_headers(revision, delete)
        subject = self.prefix + key
        try:
            reply = await request_json(self.nc, subject, value, timeout, headers or None)
        except ApiError as exc:
            conflict = _conflict(key, exc)
            if conflict is exc:
                raise
            raise conflict from exc
        return _revision(subject, reply)

    def write_soon(self, key: str, value: bytes, revision: int | None, timeout: float, written: Written) -> bool:
        """:meth:`write` without a task or an await (:func:`bridge.io.jsapi.request_soon`): ``written`` gets the new
        revision or the error :meth:`write` would raise. False, and nothing sent, when that is not possible now (the
        connection is down, or nats-py's internals differ): then :meth:`write`.

        Lease renewals go this way: a hundred groups renewed every few seconds cost the fleet's thread a task, a
        random reply token and a flusher wake-up each through ``request`` (a fifth of a core's hundredth, taken
        from the bridge's loop by the GIL). No permission watch: a denied write shows as no reply (a timeout); the
        acquire before it, through :meth:`write`, says denied."""
        subject = self.prefix + key

        def answered(reply: dict[str, Any] | None, error: BridgeError | None) -> None:
            if error is None:
                assert reply is not None
                try:
                    revision = _revision(subject, reply)
                except BridgeError as exc:
                    written(None, exc)
                    return
                written(revision, None)
            else:
                written(None, _conflict(key, error) if isinstance(error, ApiError) else error)

        headers = _write_headers(revision, False)
        block = hdr.encode_header_block(headers) if headers else b""
        return request_soon(self.nc, subject, timeout, answered, value, block)

    async def get(self, key: str, timeout: float) -> KvEntry | None:
        """The last message of ``key`` (a delete marker included), or None when the key has none."""
        subject = f"{self.api.prefix}.DIRECT.GET.{self.stream}"
        body = json.dumps({"last_by_subj": self.prefix + key}).encode()
        with permissions.request_watch(self.nc, subject):
            try:
                msg = await self.nc.request(subject, body, timeout=timeout)
            except NatsTimeoutError as exc:
                raise ApiTimeout(f"no reply to {subject} within {timeout:g}s") from exc
            except Exception as exc:
                raise ApiUnavailable(f"{subject}: {describe(exc)}") from exc
        headers = dict(msg.headers or {})
        status = headers.get("Status")
        if status == "404":
            return None
        if status is not None:
            raise ApiUnavailable(f"{subject}: status {status} {headers.get('Description', '')}".rstrip())
        operation = headers.get(OPERATION, "")
        return KvEntry(key, int(headers.get("Nats-Sequence", "0")), msg.data, operation in ("DEL", "PURGE"))

    async def read_all(self, timeout: float, through: int = 0) -> list[KvEntry]:
        """The last message of every key in the bucket (delete markers included).

        One multi_last Direct Get while the bucket has at most ``MULTI_LAST_LIMIT`` keys; above that the server
        refuses it (413) and the bucket is read whole, in batches (it keeps only the last value of each key).
        Any replica answers a Direct Get: ``through`` (the stream's last sequence, from its leader's
        ``STREAM.INFO``) makes a multi_last reply from a replica that does not hold it yet (its end-of-batch's
        ``Nats-UpTo-Sequence``, the replica's last sequence, below it) an ``ApiUnavailable``; the read whole is
        checked with the leader (``bridge.io.directget``)."""
        try:
            return await self._read_last_per_key(timeout, through)
        except _TooManyKeys:
            return await self._read_whole(timeout)

    async def _read_whole(self, timeout: float) -> list[KvEntry]:
        try:
            state = (await self.api.stream_info(self.stream, timeout=timeout)).get("state", {})
        except (ApiError, ApiTimeout) as exc:
            raise ApiUnavailable(f"reading KV bucket {self.bucket!r}: {exc}") from exc
        first, last = int(state.get("first_seq", 0)), int(state.get("last_seq", 0))
        latest: dict[str, KvEntry] = {}
        if not state.get("messages") or last < first:
            return []
        async for batch in read_batches(
            self.nc, self.api.prefix, self.stream, first, last, error_type=ApiUnavailable, timeout=timeout, verify=True
        ):
            for message in batch:
                key = message.subject[len(self.prefix) :]
                operation = message.headers.get(OPERATION, "")
                latest[key] = KvEntry(key, message.seq, message.payload, operation in ("DEL", "PURGE"))
        return list(latest.values())

    async def _read_last_per_key(self, timeout: float, through: int) -> list[KvEntry]:
        subject = f"{self.api.prefix}.DIRECT.GET.{self.stream}"
        inbox = self.nc.new_inbox()
        entries: list[KvEntry] = []
        done = asyncio.Event()
        error: list[str] = []
        up_to: list[int] = []  # the end of batch's Nats-UpTo-Sequence: the answering replica's last sequence

        def take(headers: dict[str, str], payload: bytes) -> None:
            status = headers.get("Status")
            if status is not None:
                if status not in ("204", "404"):
                    error.append(f"status {status} {headers.get('Description', '')}".rstrip())
                elif status == "204" and headers.get(UP_TO_SEQUENCE, "").isdigit():
                    up_to.append(int(headers[UP_TO_SEQUENCE]))
                done.set()
                return
            key = headers.get("Nats-Subject", "")[len(self.prefix) :]
            operation = headers.get(OPERATION, "")
            entries.append(KvEntry(key, int(headers.get("Nats-Sequence", "0")), payload, operation in ("DEL", "PURGE")))

        def on_wire(_subject: bytes, _reply: bytes, header_block: bytes | None, payload: bytes) -> None:
            take(hdr.parse_header_block(header_block) if header_block else {}, payload)

        async def on_msg(msg: Any) -> None:  # only when nats-py lacks the internals wire.py needs
            take(dict(msg.headers or {}), msg.data)

        try:
            sub = await self.nc.subscribe(inbox, cb=on_msg, pending_msgs_limit=4 * MULTI_LAST_LIMIT)
        except Exception as exc:
            raise ApiUnavailable(f"{subject}: {describe(exc)}") from exc
        wire.add_handler(self.nc, sub, on_wire)
        try:
            body = {"multi_last": [f"{self.prefix}>"], "batch": MULTI_LAST_LIMIT}
            with permissions.watch(self.nc, publish=subject, listen=[inbox]):
                try:
                    await self.nc.publish(subject, json.dumps(body).encode(), reply=inbox)
                    await asyncio.wait_for(done.wait(), timeout)
                except TimeoutError as exc:
                    raise ApiTimeout(f"no end of batch to {subject} within {timeout:g}s") from exc
                except Exception as exc:
                    raise ApiUnavailable(f"{subject}: {describe(exc)}") from exc
            if error and error[0].startswith("status 413"):
                raise _TooManyKeys(error[0])
            if error:
                raise ApiUnavailable(f"reading KV bucket {self.bucket!r}: {error[0]}")
            if up_to and up_to[0] < through:
                raise ApiUnavailable(
                    f"reading KV bucket {self.bucket!r}: answered by a replica behind its leader (its last sequence "
                    f"{up_to[0]}, the leader's {through}); read again"
                )
            return entries
        finally:
            wire.remove_handler(self.nc, sub)
            with contextlib.suppress(Exception):  # the connection is gone; so is the subscription
                await sub.unsubscribe()


class _TooManyKeys(Exception):
    """The server refused a multi_last read: more keys than it answers at once."""


def parse_view(entries: list[KvEntry]) -> View:
    """The bucket's keys as the core sees them; an unreadable value counts as held by nobody we know."""
    members: dict[str, Member] = {}
    keys: dict[str, tuple[dict[str, Holder], dict[str, int]]] = {
        LEASE_PREFIX: ({}, {}),  # lease.<source>: holders, delete markers
        GROUP_PREFIX: ({}, {}),  # group.<n>
    }
    for entry in entries:
        prefix = next((p for p in keys if entry.key.startswith(p)), None)
        if prefix is not None:
            holders, free = keys[prefix]
            name = entry.key[len(prefix) :]
            if entry.deleted:
                free[name] = entry.revision
                continue
            data = _decoded(entry.value)
            holders[name] = Holder(
                instance=str(data.get("instance", "?")),
                incarnation=str(data.get("incarnation", "?")),
                host=str(data.get("host", "")),
                pid=_number(data.get("pid"), int),
                since=_number(data.get("since"), float),
                revision=entry.revision,
            )
        elif entry.key.startswith(PRESENCE_PREFIX) and not entry.deleted:
            data = _decoded(entry.value)
            instance = entry.key[len(PRESENCE_PREFIX) :]
            # "units" and "lease_groups" since lease groups; a process from before writes "sources" only
            units = data.get("units", data.get("sources", []))
            members[instance] = Member(
                instance=instance,
                incarnation=str(data.get("incarnation", "?")),
                sources=frozenset(str(s) for s in units) if isinstance(units, list) else frozenset(),
                host=str(data.get("host", "")),
                lease_groups=_number(data.get("lease_groups"), int),
            )
    (holders, free), (groups, free_groups) = keys[LEASE_PREFIX], keys[GROUP_PREFIX]
    return View(members=members, holders=holders, free=free, groups=groups, free_groups=free_groups)


def _number(value: object, kind: type[_N]) -> _N:
    return kind(value) if isinstance(value, int | float) else kind(0)


# KV values decoded, by their bytes: a process reads its bucket whole every second (``parse_view``), and a renew
# writes the same value again, so nearly every value of a view was decoded the second before (128 lease groups: the
# decoding was most of a view's cost). Dropped whole when full; never mutated by its readers.
_DECODED: dict[bytes, dict[str, object]] = {}
_DECODED_MAX = 1024


def _decoded(value: bytes) -> dict[str, object]:
    """:func:`json_object` of ``value``, decoded once while it stays in ``_DECODED`` (the caller must not change it)."""
    data = _DECODED.get(value)
    if data is None:
        data = json_object(value)
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        _DECODED[value] = data
    return data


def json_object(value: bytes) -> dict[str, object]:
    """A KV value as a JSON object; {} when it is not one."""
    try:
        data = json.loads(value)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# what a write sent without a task hands its outcome to: the new revision, or why there is none
Written = Callable[[int | None, BridgeError | None], None]


def _write_headers(revision: int | None, delete: bool) -> dict[str, str]:
    headers: dict[str, str] = {}
    if revision is not None:
        headers[EXPECTED_LAST_SUBJECT_SEQ] = str(revision)
    if delete:
        headers[OPERATION] = "DEL"
    return headers


def _conflict(key: str, exc: ApiError) -> BridgeError:
    """A refused revision check as :class:`KvConflict`; any other API error as it is."""
    return KvConflict(f"{key}: {exc.description}") if exc.err_code == WRONG_LAST_SEQUENCE else exc


def _revision(subject: str, reply: dict[str, Any]) -> int:
    seq = reply.get("seq")
    if seq is None:
        raise ApiUnavailable(f"{subject}: publish ack without seq: {reply!r}"[:200])
    return int(seq)
