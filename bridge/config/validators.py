"""The field validators of the configuration models, the annotated types they make, and ``api_prefix``.

Every validator raises the error :func:`fail` builds, whose message is written for the operator and used verbatim
by :mod:`bridge.config.errors`; ``(got ...)`` renders the input with :func:`show` (callers keep secrets out).
"""

from __future__ import annotations

import json
import math
import re
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, SecretStr
from pydantic_core import PydanticCustomError
from pydantic_settings import NoDecode

from bridge.config.defaults import DEFAULT_LISTEN, DEFAULT_SERVER

# Our own validators raise this error type; its message is already written for the operator and is used
# verbatim, while pydantic's built-in error types are translated in bridge.config.errors.
ERROR_TYPE = "bridge_config"
_NAME_FORBIDDEN = re.compile(r"[\s.*>/\\]")
SOURCE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_URL_SCHEMES = ("nats", "tls", "ws", "wss")
_SHOW_MAX = 60


def fail(message: str) -> PydanticCustomError:
    """The error a validator raises: ``message`` is shown to the operator as it is."""
    return PydanticCustomError(ERROR_TYPE, message)


def show(value: object) -> str:
    """A short, single-line rendering of an input value for '(got ...)' (callers keep secrets out)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        text = str(value)
        return repr(text if len(text) <= _SHOW_MAX else text[: _SHOW_MAX - 3] + "...")
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    if value is None:
        return "nothing"
    return f"a {type(value).__name__}"


# --- field validators -------------------------------------------------------------------------------------


def _source_name(value: str) -> str:
    if not SOURCE_NAME.fullmatch(value):
        raise fail(f"must be 1 to 64 letters, digits, '_' or '-' (got {show(value)})")
    return value


def _jetstream_name(value: str) -> str:
    if not value:
        raise fail("must not be empty")
    if _NAME_FORBIDDEN.search(value):
        raise fail(f"must not contain whitespace or any of . * > / \\ (got {show(value)})")
    return value


def _subject_problem(value: str, *, wildcards: bool) -> str | None:
    if not value:
        return "must not be empty"
    if any(ch.isspace() for ch in value):
        return "must not contain whitespace"
    tokens = value.split(".")
    if "" in tokens:
        return "must not have empty tokens (no leading, trailing or doubled '.')"
    for position, token in enumerate(tokens):
        if not wildcards and ("*" in token or ">" in token):
            return "must be a literal subject: no '*' or '>' wildcards"
        if "*" in token and token != "*":
            return "'*' must be a whole token, as in 'a.*.c'"
        if ">" in token and (token != ">" or position != len(tokens) - 1):
            return "'>' must be the whole last token, as in 'a.>'"
    return None


def _literal_subject(value: str) -> str:
    problem = _subject_problem(value, wildcards=False)
    if problem:
        raise fail(f"{problem} (got {show(value)})")
    return value


def _filter_subject(value: str) -> str:
    problem = _subject_problem(value, wildcards=True)
    if problem:
        raise fail(f"{problem} (got {show(value)})")
    return value


def _subject_prefix(value: str) -> str:
    problem = _subject_problem(value, wildcards=False)
    if problem:
        raise fail(f"{problem}; write a prefix such as 'edge.site1', without a trailing '.' (got {show(value)})")
    return value


def _server_url(value: str) -> str:
    shown = show(value) if "@" not in value else "a URL with credentials"
    try:
        parts = urlsplit(value)
        # .port parses lazily and raises for a non-numeric or out-of-range port.
        _ = parts.port
    except ValueError:
        raise fail(f"is not a valid URL (got {shown})") from None
    if parts.scheme.lower() not in _URL_SCHEMES or not parts.hostname:
        raise fail(f"must be a nats://, tls://, ws:// or wss:// URL with a host, e.g. {DEFAULT_SERVER} (got {shown})")
    if parts.username is not None or parts.password is not None:
        # Credentials in a URL would end up in logs and reprs; the auth table keeps them secret.
        raise fail("must not embed credentials (user:password@); put them in the auth table")
    return value


def _list_from_string(value: Any) -> Any:
    # Environment variables can only carry strings: accept a JSON array there, and a single plain value as a
    # one-element list (also handy in the file: servers = "nats://host:4222").
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise fail(f"looks like a JSON array but is not valid JSON ({exc.msg}, column {exc.colno})") from None
        return [value]
    return value


def _at_least_one_server(value: list[str]) -> list[str]:
    if not value:
        raise fail(f'must list at least one server URL, e.g. ["{DEFAULT_SERVER}"]')
    return value


def _no_duplicate_items(value: list[str]) -> list[str]:
    seen: set[str] = set()
    for item in value:
        if item in seen:
            raise fail(f"{show(item)} is listed twice")
        seen.add(item)
    return value


def lowercase(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def seconds_at_least(bound: float, why: str = "") -> AfterValidator:
    def check(value: float) -> float:
        if not math.isfinite(value) or value < bound:
            raise fail(f"must be at least {bound} seconds{why} (got {show(value)})")
        return value

    return AfterValidator(check)


def seconds_between(low: float, high: float, why: str = "") -> AfterValidator:
    """A number of seconds from ``low`` to ``high``; ``why`` ends the message (``": <why it is bounded>"``)."""

    def check(value: float) -> float:
        if not math.isfinite(value) or not low <= value <= high:
            raise fail(f"must be between {low:g} and {high:g} seconds{why} (got {show(value)})")
        return value

    return AfterValidator(check)


def _positive_seconds(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise fail(f"must be a number of seconds greater than 0 (got {show(value)})")
    return value


def int_between(low: int, high: int, what: str = "") -> AfterValidator:
    def check(value: int) -> int:
        if not low <= value <= high:
            raise fail(f"must be between {low} and {high}{what} (got {value})")
        return value

    return AfterValidator(check)


_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)(?:/s)?")
_DECIMAL = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3}
_BINARY = {"ki": 1024, "mi": 1024**2, "gi": 1024**3}
MAX_RATE = 100 * 1000**3  # bytes per second: far above any link, below what the server's int64 bits/s holds
RATE_HINT = 'give bytes per second as a number or with a unit, e.g. "64KiB", "1MB", "50kbit" (0: no limit)'


def parse_rate(value: Any) -> int:
    """A rate in bytes per second from a number or a string with a unit: bytes (``B``, ``KB``/``kB``, ``KiB``,
    ``MB``, ``MiB``, ``GB``, ``GiB``; an uppercase B) or bits (``bit``, ``kbit``, ``Mbit``, ``Gbit``), each optionally
    followed by ``/s``. A lowercase ``b`` alone is refused: it reads as bits to some and bytes to others."""
    if isinstance(value, bool):
        raise fail(f"{show(value)} is not a rate: {RATE_HINT}")
    if isinstance(value, int | float):
        number, factor = float(value), 1.0
    elif isinstance(value, str) and (m := _RATE.fullmatch(value.strip())):
        number, unit = float(m.group(1)), m.group(2)
        if unit.lower().endswith("bit"):
            prefix, per = unit[:-3].lower(), 1 / 8
        elif unit == "" or unit.endswith("B"):
            prefix, per = unit[:-1].lower(), 1.0
        else:
            raise fail(f"{show(value)}: unknown unit {unit!r}: B for bytes or bit for bits; {RATE_HINT}")
        scale = _BINARY.get(prefix) or _DECIMAL.get(prefix)
        if scale is None or (per != 1.0 and prefix in _BINARY):
            raise fail(f"{show(value)}: unknown unit {unit!r}; {RATE_HINT}")
        factor = scale * per
    else:
        raise fail(f"{show(value)} is not a rate: {RATE_HINT}")
    rate = number * factor
    if rate < 0:
        raise fail(f"{show(value)} is negative; {RATE_HINT}")
    if not math.isfinite(rate) or rate > MAX_RATE:
        raise fail(f"{show(value)} is out of range: at most 100GB per second; {RATE_HINT}")
    if 0 < rate < 1:
        raise fail(f"{show(value)} is below one byte per second; {RATE_HINT}")
    return round(rate)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMG]i?B|[kmg]B|B|)")
SIZE_HINT = 'give bytes as a number or with a unit, e.g. "16MiB", "512KiB", "64MB"'
MAX_SIZE = 1024**4


def parse_size(value: Any) -> int:
    """An amount of memory in bytes from a number or a string with a unit (``B``, ``KB``/``kB``, ``KiB``, ``MB``,
    ``MiB``, ``GB``, ``GiB``)."""
    if isinstance(value, bool):
        raise fail(f"{show(value)} is not a size: {SIZE_HINT}")
    if isinstance(value, int | float):
        size = float(value)
    elif isinstance(value, str) and (m := _SIZE.fullmatch(value.strip())):
        unit = m.group(2)[:-1].lower() if m.group(2) else ""
        size = float(m.group(1)) * (_BINARY.get(unit) or _DECIMAL[unit])
    else:
        raise fail(f"{show(value)} is not a size: {SIZE_HINT}")
    if size < 0 or not math.isfinite(size) or size > MAX_SIZE:
        raise fail(f"{show(value)} is out of range: from 0 to 1TiB; {SIZE_HINT}")
    return round(size)


_AGO = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)")
AGO_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
AGO_HINT = 'give a duration with a unit: "90s", "30m", "24h", "7d"'


def parse_ago(value: Any) -> float:
    """A duration in seconds from ``<number><unit>``, the unit one of s, m, h, d (``"24h"``); more than 0."""
    if isinstance(value, str) and (m := _AGO.fullmatch(value.strip())):
        seconds = float(m.group(1)) * AGO_UNITS[m.group(2)]
        if seconds > 0:
            return seconds
    raise fail(f"{show(value)} is not a duration: {AGO_HINT}")


def parse_rfc3339(value: Any) -> datetime:
    """An instant from an RFC 3339 time with its offset (``2026-11-30T08:00:00Z``, ``...+01:00``)."""
    stamp: datetime | None = None
    if isinstance(value, datetime):  # TOML's own offset date-time
        stamp = value
    elif isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value.strip())
        except ValueError:
            stamp = None
    if stamp is None or stamp.tzinfo is None:
        raise fail(f"{show(value)} is not an RFC 3339 time with an offset: write e.g. 2026-11-30T08:00:00Z")
    return stamp.astimezone(UTC)


def format_rate(rate: int) -> str:
    """A rate in bytes per second as people read it (``64KiB/s``), for logs and status."""
    if rate == 0:
        return "unlimited"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if rate >= size:
            return f"{rate / size:.4g}{unit}/s"
    return f"{rate}B/s"


def _readable_file(path: Path) -> Path:
    path = path.expanduser()
    try:
        # stat first: opening a FIFO or device to probe it could block or have side effects.
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise fail(f"{str(path)!r} is a directory, not a file")
        if not stat.S_ISREG(mode):
            raise fail(f"{str(path)!r} is not a regular file")
        with path.open("rb"):
            pass
    except FileNotFoundError:
        raise fail(f"file {str(path)!r} does not exist") from None
    except PermissionError:
        raise fail(f"file {str(path)!r} is not readable by this process (permission denied)") from None
    except OSError as exc:
        raise fail(f"cannot read file {str(path)!r}: {exc.strerror or exc}") from None
    return path


def non_empty_secret(value: SecretStr | None) -> SecretStr | None:
    if value is not None and not value.get_secret_value():
        raise fail("must not be empty (remove the key instead)")
    return value


def _non_empty(value: str) -> str:
    if not value:
        raise fail("must not be empty (remove the key instead)")
    return value


def api_prefix(domain: str | None) -> str:
    """The JetStream API subject prefix for a domain: ``$JS.API``, or ``$JS.<domain>.API``."""
    return "$JS.API" if domain is None else f"$JS.{domain}.API"


def _listen(value: str) -> str:
    from bridge.observe.http import parse_listen  # the listener's own rule, so the two cannot drift apart

    if value == "":
        return value
    try:
        parse_listen(value)
    except ValueError:
        raise fail(
            f'must be "host:port" (e.g. "{DEFAULT_LISTEN}", "[::]:9464"; port 0 picks a free one), or "" to disable '
            f"(got {show(value)})"
        ) from None
    return value


_KV_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_INSTANCE_ID = re.compile(r"[A-Za-z0-9_=-][A-Za-z0-9_=.-]{0,126}[A-Za-z0-9_=-]|[A-Za-z0-9_=-]")


def _bucket_name(value: str) -> str:
    if not _KV_NAME.fullmatch(value):
        raise fail(f"must be 1 to 64 letters, digits, '_' or '-' (a KV bucket name) (got {show(value)})")
    return value


def _instance_id(value: str) -> str:
    if value and not _INSTANCE_ID.fullmatch(value):
        raise fail(
            "must be letters, digits, '_', '-', '=' or inner '.', at most 128 (it is part of a KV key), or \"\" for "
            f"the default <host name>-<pid> (got {show(value)})"
        )
    return value


JetStreamName = Annotated[str, AfterValidator(_jetstream_name)]
Seconds = Annotated[float, AfterValidator(_positive_seconds)]
ReadableFile = Annotated[Path, AfterValidator(_readable_file)]
Servers = Annotated[
    list[Annotated[str, AfterValidator(_server_url)]],
    NoDecode,
    BeforeValidator(_list_from_string),
    AfterValidator(_at_least_one_server),
]
FilterSubjects = Annotated[
    list[Annotated[str, AfterValidator(_filter_subject)]],
    NoDecode,
    BeforeValidator(_list_from_string),
    AfterValidator(_no_duplicate_items),
]
SourceName = Annotated[str, AfterValidator(_source_name)]
LiteralSubject = Annotated[str, AfterValidator(_literal_subject)]
SubjectPrefix = Annotated[str, AfterValidator(_subject_prefix)]
NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]
ListenAddress = Annotated[str, AfterValidator(_listen)]
BucketName = Annotated[str, AfterValidator(_bucket_name)]
InstanceId = Annotated[str, AfterValidator(_instance_id)]
Rate = Annotated[int, BeforeValidator(parse_rate)]  # bytes per second
Ago = Annotated[float, BeforeValidator(parse_ago)]  # seconds
Instant = Annotated[datetime, BeforeValidator(parse_rfc3339)]  # UTC
Size = Annotated[int, BeforeValidator(parse_size)]  # bytes
