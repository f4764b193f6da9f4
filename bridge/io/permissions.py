"""Permission denials on a connection: the server's asynchronous violations, matched to the requests they stop.

When the bridge publishes or subscribes to a subject its user may not, the server neither answers nor closes the
connection: it sends an asynchronous ``-ERR 'Permissions Violation for Publish to "<subject>"'`` (or ``... for
Subscription to "<subject>"``, ``... for Publish with Reply of "<subject>"``), which nats-py hands, lowercased, to
the connection's error callback. The request it concerns simply goes unanswered, and would fail as a timeout that
says nothing of the cause.

So every connection :func:`bridge.io.connect.open_connection` opens carries a :class:`PermissionRecord`, fed by
its error callback, and each request made on it runs under a :class:`Watch` of the subjects it publishes to and
listens on (:func:`request_watch` for nats-py's request/reply: every JetStream API request and KV write through
:func:`bridge.io.jsapi.request_json`; :func:`watch` for the Direct Gets of :mod:`bridge.io.directget` and
:mod:`bridge.io.kv`). A violation naming one of those subjects ends the request at once with
:class:`~bridge.errors.PermissionDenied`. nats-py subscribes its request inbox once per connection, so only the
first request hears that subscription refused; the record keeps it, and later requests fail at once too.

Subjects are compared lowercased (:func:`error_subjects`, shared with :mod:`bridge.io.shared`): nats-py lowercases
the server's text.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio

from bridge.core.subjects import subject_matches
from bridge.errors import PermissionDenied

__all__ = [
    "PUBLISH",
    "REPLY",
    "SUBSCRIBE",
    "PermissionRecord",
    "Violation",
    "Watch",
    "attach",
    "error_subjects",
    "parse_violation",
    "record_for",
    "request_watch",
    "watch",
]

PUBLISH = "publish"
SUBSCRIBE = "subscribe"
REPLY = "reply"  # a publish refused for its reply subject
REMEMBERED = 256  # violations kept per kind and connection: pull mode subscribes a fresh inbox at every resync

_QUOTED = re.compile(r'"([^"]+)"')
_MARK = "permissions violation for "
# "publish with reply of" before "publish to": the longer phrase first
_PHRASES = (("publish with reply of", REPLY), ("publish to", PUBLISH), ("subscription to", SUBSCRIBE))


def error_subjects(text: str) -> list[str]:
    """The subjects an error's text names, lowercased: its double-quoted words, else all its words.

    Lowercased because nats-py lowercases the server's ``-ERR`` text: a subject is only ever compared that way."""
    text = text.lower()
    return [word.strip("'\"") for word in _QUOTED.findall(text) or text.split()]


@dataclass(frozen=True, slots=True)
class Violation:
    """One permissions violation the server reported: what it refused (:data:`PUBLISH`, :data:`SUBSCRIBE`, or
    :data:`REPLY`: a publish, for its reply subject) and the subject, lowercased as the text reached the client."""

    operation: str
    subject: str

    def concerns(self, publish: str | None, listen: Iterable[str]) -> str | None:
        """The subject this violation refused, spelled as the caller knows it, when it is the caller's: ``publish``
        (what it publishes to) or one of ``listen`` (the subscriptions its replies come to; a refused reply subject
        under one of them is named as the server wrote it). None when the violation is about something else."""
        if self.operation == PUBLISH:
            return publish if publish is not None and publish.lower() == self.subject else None
        for pattern in listen:
            low = pattern.lower()
            if self.operation == SUBSCRIBE and low == self.subject:
                return pattern
            if self.operation == REPLY and subject_matches(low, self.subject):
                return self.subject
        return None


def parse_violation(text: str) -> Violation | None:
    """The violation an error's text reports (``nats: permissions violation for publish to "<subject>"``, in any
    case), or None when it reports none or names no subject."""
    low = text.lower()
    at = low.find(_MARK)
    if at < 0:
        return None
    rest = low[at + len(_MARK) :]
    for phrase, operation in _PHRASES:
        if rest.startswith(phrase):
            # a queue subscription's text goes on: ... to "<subject>" using queue "<queue>"
            subjects = error_subjects(rest[len(phrase) :])
            return Violation(operation, subjects[0]) if subjects and subjects[0] else None
    return None


class PermissionRecord:
    """What one connection's server refused, and the requests on that connection watching for it.

    Used on the connection's event loop only: its error callback and its requests run there."""

    def __init__(self) -> None:
        # by subject, oldest first; a subscription's denial holds until the connection is lost (nats-py subscribes
        # again on the next one, and the server judges that anew)
        self._subscriptions: dict[str, Violation] = {}
        self._publishes: dict[str, Violation] = {}  # for publishes made outside a watch (pipelined, acked later)
        self._watches: set[Watch] = set()

    def note(self, exc: BaseException) -> Violation | None:
        """Take one of the connection's asynchronous errors; return the violation it reports, if it is one. The
        requests watching a subject it names end at once."""
        violation = parse_violation(str(exc))
        if violation is None:
            return None
        kept = self._subscriptions if violation.operation == SUBSCRIBE else self._publishes
        kept.pop(violation.subject, None)
        kept[violation.subject] = violation
        if len(kept) > REMEMBERED:
            del kept[next(iter(kept))]
        for watching in list(self._watches):
            watching.hear(violation)
        return violation

    def disconnected(self) -> None:
        """The connection was lost: what the server refused on it says nothing of the next one."""
        self._subscriptions.clear()
        self._publishes.clear()

    def denied(self, publish: Iterable[str] = (), listen: Iterable[str] = ()) -> PermissionDenied | None:
        """A denial recorded on this connection of a publish to one of ``publish``, or of one of the subscriptions
        ``listen``; None when there is none."""
        for subject in publish:
            if subject.lower() in self._publishes:
                return PermissionDenied(PUBLISH, subject)
        for pattern in listen:
            if pattern.lower() in self._subscriptions:
                return PermissionDenied(SUBSCRIBE, pattern)
        return None


class Watch:
    """One request's watch over its connection's violations; a context manager around the request.

    A violation of its subjects cancels what runs inside and raises :class:`PermissionDenied` in its place. A
    subscription already denied on the connection raises it on entry (the reply could never come); any other
    failure inside is turned into it when the record shows the request's subscription denied meanwhile.
    """

    def __init__(
        self, record: PermissionRecord | None, publish: str | None, listen: Callable[[], Sequence[str]]
    ) -> None:
        self._record = record
        self._publish = publish
        self._listen = listen
        self._scope = anyio.CancelScope()
        self.denied: PermissionDenied | None = None

    def hear(self, violation: Violation) -> None:
        """A violation on the connection: the end of this request when it names one of its subjects."""
        if self.denied is not None:
            return
        subject = violation.concerns(self._publish, self._listen())
        if subject is not None:
            self.denied = self._denial(violation.operation, subject)
            self._scope.cancel()

    def _denial(self, operation: str, subject: str) -> PermissionDenied:
        if operation == PUBLISH:
            return PermissionDenied(PUBLISH, subject)
        detail = f"where the replies to {self._publish} come" if self._publish else ""
        if operation == REPLY:
            return PermissionDenied(PUBLISH, subject, detail, reply=True)
        return PermissionDenied(SUBSCRIBE, subject, detail)

    def _recorded(self) -> PermissionDenied | None:
        if self._record is None:
            return None
        earlier = self._record.denied(listen=self._listen())
        return None if earlier is None else self._denial(SUBSCRIBE, earlier.subject)

    def __enter__(self) -> Watch:
        earlier = self._recorded()
        if earlier is not None:
            raise earlier
        if self._record is not None:
            self._record._watches.add(self)
        self._scope.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> bool:
        if self._record is not None:
            self._record._watches.discard(self)
        ours = bool(self._scope.__exit__(exc_type, exc, traceback))
        if ours and self.denied is not None:
            raise self.denied from None
        if ours or exc is None or not isinstance(exc, Exception):
            return ours  # finished, or someone else's cancellation: theirs to handle
        # failed another way (typically a timeout) after the record learnt its reply subscription was refused
        denied = self.denied or self._recorded()
        if denied is not None:
            raise denied from exc
        return False


_records: weakref.WeakKeyDictionary[Any, PermissionRecord] = weakref.WeakKeyDictionary()


def attach(nc: Any) -> PermissionRecord:
    """A new record for the nats-py client ``nc``, for its error callback to feed (:meth:`PermissionRecord.note`)."""
    record = _records[nc] = PermissionRecord()
    return record


def record_for(nc: Any) -> PermissionRecord | None:
    """The record of ``nc``; None for a client :func:`bridge.io.connect.open_connection` did not open."""
    try:
        return _records.get(nc)
    except TypeError:  # not weakly referenceable, so not a nats-py client: open_connection never saw it
        return None


def watch(nc: Any, *, publish: str | None, listen: Sequence[str] = ()) -> Watch:
    """A :class:`Watch` for a request on ``nc`` that publishes to ``publish`` and takes its replies on the
    subscriptions ``listen``."""
    listening = tuple(listen)
    return Watch(record_for(nc), publish, lambda: listening)


def request_watch(nc: Any, subject: str) -> Watch:
    """A :class:`Watch` for ``nc.request(subject, ...)``: its replies come on nats-py's request inbox
    (``<inbox prefix>.<nuid>.*``, subscribed at the connection's first request)."""
    return Watch(record_for(nc), subject, lambda: _request_inbox(nc))


def _request_inbox(nc: Any) -> tuple[str, ...]:
    prefix = getattr(nc, "_resp_sub_prefix", None)  # nats-py's; None before its first request
    return (bytes(prefix).decode() + "*",) if isinstance(prefix, bytes | bytearray) and prefix else ()
