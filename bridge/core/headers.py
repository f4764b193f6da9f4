"""What the bridge writes into the aggregate's headers, and what it does with the origin's headers.

Provenance (every replicated message), under the ``Bridge-`` prefix because the server reserves ``Nats-``
(2.15 rejects client publishes carrying ``Nats-Stream-Source``, error 10227):

==================  =====================================================================================
``Nats-Msg-Id``      ``<source>:<origin stream>:<origin seq>``: deterministic, so a retried publish is
                     deduplicated by the target within its duplicate window
``Bridge-Source``    the configured source name
``Bridge-Stream``    the origin stream
``Bridge-Seq``       the origin stream sequence
``Bridge-Prev``      the origin sequence the bridge replicated just before this one (or the point a forward
                     reset skipped to): links the copies into a chain so restart recovery can tell a
                     contiguous run from one with a hole (see ``bridge.core.recovery``)
``Bridge-Subject``   the origin subject (the aggregate subject may carry a prefix)
``Bridge-Time``      the origin store time, nanoseconds since the epoch
``Bridge-Skipped``   only on the first copy after a forward reset: ``<first>-<last>``, the origin sequences
                     the reset skipped on purpose, so an audit (``bridge.audit``) tells that hole in the
                     chain from a lost copy
==================  =====================================================================================

Origin headers policy: every header whose name starts with ``Nats-`` or ``Bridge-`` (any case) is kept, renamed
to ``Bridge-Orig-<name>``; all others pass unchanged. Renaming rather than stripping loses nothing, and no origin
header can make the target act: ``Nats-Expected-*`` would fail the publish, ``Nats-Batch-*`` would make it part
of an atomic batch, ``Nats-Rollup`` would purge the aggregate, ``Nats-TTL`` would expire the copy (or be rejected
without ``allow_msg_ttl``), ``Nats-Msg-Id`` would dedupe across sources, ``Nats-Stream-Source`` is rejected,
``Nats-Schedule*``/``Nats-Incr`` would run schedules or counters, and a forged ``Bridge-Seq`` would corrupt
recovery. The server's own sourcing strips ``Nats-Expected-*``/``Nats-Batch-*`` and stores with checks disabled;
a client cannot, so one rule covers every present and future reserved header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MSG_ID = "Nats-Msg-Id"
SOURCE = "Bridge-Source"
STREAM = "Bridge-Stream"
SEQ = "Bridge-Seq"
PREV = "Bridge-Prev"
SUBJECT = "Bridge-Subject"
TIME = "Bridge-Time"
SKIPPED = "Bridge-Skipped"
ORIGINAL_PREFIX = "Bridge-Orig-"

_RESERVED_PREFIXES = ("nats-", "bridge-")
_WS = " \t\n\r\x0b\x0c"  # what bytes.strip() strips: the same whitespace nats-py's parser strips


def msg_id(source: str, stream: str, stream_seq: int) -> str:
    """The deterministic ``Nats-Msg-Id`` of one origin message."""
    return f"{source}:{stream}:{stream_seq}"


def rename_reserved(name: str) -> str:
    """The name an origin header gets in the aggregate."""
    if name.lower().startswith(_RESERVED_PREFIXES):
        return ORIGINAL_PREFIX + name
    return name


def own_copy(origin: Mapping[str, str] | None, source: str, stream: str) -> str:
    """Why a delivery must not be replicated: it is this source's own copy come back (its provenance names this
    source and origin stream), so the origin stream captures the aggregate's copies: a replication cycle, each round
    a new origin message, its header block growing by the renamed provenance. "" for any other message (a copy made
    by another source, or another bridge, is an ordinary message to replicate)."""
    if not origin or origin.get(SOURCE) != source or origin.get(STREAM) != stream:
        return ""
    return (
        f"replication cycle: this message is this source's own copy (Bridge-Source {source}, Bridge-Stream "
        f"{stream}): the origin stream captures the subjects its copies are published on; give the source a "
        "subject_prefix outside the origin stream's subjects (or narrow those subjects), then reset its consumer "
        "past this message"
    )


def build_header_block(
    origin: Mapping[str, str] | None,
    *,
    source: str,
    stream: str,
    stream_seq: int,
    prev_seq: int,
    subject: str,
    timestamp_ns: int,
    skipped: str | None = None,
) -> bytes:
    """The encoded header block of the aggregate copy of one origin message: the origin's headers (policy
    applied) then provenance.

    Built as one string and encoded once: this runs for every replicated message, and the block is both what
    ``max_msg_size`` is checked against and what goes on the wire. ``skipped`` (``"<first>-<last>"``) marks
    the first copy after a forward reset.
    """
    origin_lines = "".join(f"{rename_reserved(name)}: {value}\r\n" for name, value in origin.items()) if origin else ""
    if skipped:
        origin_lines += f"{SKIPPED}: {skipped}\r\n"
    return (
        f"NATS/1.0\r\n{origin_lines}{MSG_ID}: {source}:{stream}:{stream_seq}\r\n{SOURCE}: {source}\r\n"
        f"{STREAM}: {stream}\r\n{SEQ}: {stream_seq}\r\n{PREV}: {prev_seq}\r\n{SUBJECT}: {subject}\r\n"
        f"{TIME}: {timestamp_ns}\r\n\r\n"
    ).encode()


def encode_header_block(headers: Mapping[str, str]) -> bytes:
    """A ``NATS/1.0`` header block holding ``headers``, exactly as nats-py encodes one."""
    return ("NATS/1.0\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n").encode()


def parse_header_block(block: bytes) -> dict[str, str]:
    """The headers in a ``NATS/1.0`` header block (a message's, or one ``STREAM.MSG.GET`` returns), the way nats-py
    presents them.

    A status line (``NATS/1.0 100 FlowControl Request``) becomes the pseudo-headers ``Status`` and
    ``Description``; a name repeated keeps its last value; names are kept as sent and values stripped; lines
    without a colon, and names that are empty, hold whitespace or are not ASCII, are skipped.
    """
    # decoded once, then plain str operations: this runs for every message an audit reads
    lines = block.decode("utf-8", "replace").split("\r\n")
    out: dict[str, str] = {}
    status = lines[0][8:].strip(_WS)  # after "NATS/1.0"
    if status:
        code, _, description = status.partition(" ")
        if code.isascii() and code.isdigit():
            out["Status"] = code
        description = description.strip(_WS)
        if description:
            out["Description"] = description
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        name = name.strip(_WS)
        if not sep or not name or not name.isascii() or " " in name or "\t" in name:
            continue
        out[name] = value.strip(_WS)
    return out


@dataclass(frozen=True, slots=True)
class Provenance:
    """What an aggregate copy says about its origin."""

    source: str
    stream: str
    stream_seq: int
    prev_seq: int
    subject: str
    timestamp_ns: int


def parse_provenance(headers: Mapping[str, str] | None) -> Provenance | None:
    """Read provenance from an aggregate message's headers; ``None`` when it is not a bridge copy."""
    if not headers:
        return None
    try:
        return Provenance(
            source=headers[SOURCE],
            stream=headers[STREAM],
            stream_seq=int(headers[SEQ]),
            prev_seq=int(headers.get(PREV, "0")),
            subject=headers.get(SUBJECT, ""),
            timestamp_ns=int(headers.get(TIME, "0")),
        )
    except (KeyError, ValueError):
        return None


def aggregate_subject(origin_subject: str, prefix: str | None) -> str:
    """The subject a copy is published on: the origin subject, under ``prefix`` when one is configured."""
    return f"{prefix}.{origin_subject}" if prefix else origin_subject
