"""The ``jetstream`` data source's options, and the options that read one side of a bridge configuration.

The stream reader's own options (``startingSequence``, ``startingTime``, ``latest``, ``maxMessagesPerTrigger``,
``failOnDataLoss``) are parsed here too, under their Spark-style names (keys are case-insensitive); the batch
reader refuses them (:meth:`ReadOptions.stream_only`).

Spark hands a data source its options as strings (keys case-insensitive). They are validated once, with the same
rules as the bridge's configuration (:mod:`bridge.config`), and a bad one is reported by its option name with the
fix. ``password`` and ``token`` match Spark's default ``spark.redaction.regex``, so Spark masks them in plans and
its UI; they never appear in this module's errors.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from bridge.config import (
    AuthConfig,
    FilterSubjects,
    JetStreamName,
    Seconds,
    Servers,
    SourceConfig,
    TargetConfig,
    TlsConfig,
    api_prefix,
)
from bridge.config.validators import int_between
from bridge.errors import AuditError, BridgeError

ALL_HEADERS = "*"

# option name -> (nested model, its field) for the keys that build AuthConfig and TlsConfig
_AUTH_OPTIONS = {name: name for name in ("user", "password", "token", "nkey_seed_file", "creds_file")}
_TLS_OPTIONS = {"tls_ca_file": "ca_file", "tls_cert_file": "cert_file", "tls_key_file": "key_file"}
# the stream reader's options: Spark-style name (as written in errors) by field
STREAM_OPTIONS = {
    "starting_sequence": "startingSequence",
    "starting_time": "startingTime",
    "latest": "latest",
    "max_messages_per_trigger": "maxMessagesPerTrigger",
    "fail_on_data_loss": "failOnDataLoss",
}
_STREAM_FIELDS = {name.lower(): field for field, name in STREAM_OPTIONS.items()}
_STARTS = ("starting_sequence", "starting_time", "latest")


class StreamOptions(BaseModel):
    """Where a stream is and how to reach it: what the reader's and the sink's options share.

    Subclasses add their own fields and say how their errors read (``KIND``, ``KNOWN``, ``ERROR``, ``SPARK_NAMES``);
    :meth:`parse` turns Spark's string options into the model for all of them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    KIND: ClassVar[str] = "data source"  # in the error's first line
    KNOWN: ClassVar[str] = "servers, stream, domain, user, password, token, nkey_seed_file, creds_file, tls_*"
    ERROR: ClassVar[type[BridgeError]] = AuditError
    SPARK_NAMES: ClassVar[dict[str, str]] = {}  # field -> option name, where they differ
    IGNORED: ClassVar[frozenset[str]] = frozenset({"path"})  # Spark's own, e.g. load(path)

    servers: Servers
    stream: JetStreamName
    domain: JetStreamName | None = None
    auth: AuthConfig | None = None
    tls: TlsConfig | None = None
    timeout: Seconds = 10.0

    @property
    def api_prefix(self) -> str:
        """``$JS.API``, or ``$JS.<domain>.API``."""
        return api_prefix(self.domain)

    @classmethod
    def _option(cls, name: str, value: str) -> tuple[str, Any]:
        """The field and value of one (lower-cased) option other than credentials and TLS."""
        if name == "servers":
            return name, [item.strip() for item in value.split(",") if item.strip()]
        return name, value

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Self:
        """Validate a data source's options; raises ``ERROR`` naming each bad option and its fix (secrets never
        shown)."""
        data: dict[str, Any] = {}
        auth: dict[str, str] = {}
        tls: dict[str, str] = {}
        for key, value in options.items():
            name = key.lower()
            if name in _AUTH_OPTIONS:
                auth[_AUTH_OPTIONS[name]] = value
            elif name in _TLS_OPTIONS:
                tls[_TLS_OPTIONS[name]] = value
            elif name not in cls.IGNORED:
                field, parsed = cls._option(name, value)
                data[field] = parsed
        if auth:
            data["auth"] = auth
        if tls:
            data["tls"] = tls
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            lines = "\n".join(cls._problems(exc))
            raise cls.ERROR(f"invalid jetstream {cls.KIND} options:\n{lines}") from None

    @classmethod
    def _problems(cls, exc: ValidationError) -> list[str]:
        out = []
        for err in exc.errors(include_input=False, include_url=False):
            loc = err["loc"]
            if len(loc) >= 1 and str(loc[0]) in cls.SPARK_NAMES:
                name = cls.SPARK_NAMES[str(loc[0])]
            elif len(loc) >= 2 and loc[0] == "tls":
                name = f"tls_{loc[1]}"
            elif len(loc) >= 2 and loc[0] == "auth":
                name = str(loc[1])
            else:
                name = str(loc[0]) if loc else "options"
            if err["type"] == "missing":
                message = f'required: give .option("{name}", ...)'
            elif err["type"] == "extra_forbidden":
                message = f"unknown option: use {cls.KNOWN}"
            else:
                message = err["msg"].removeprefix("Value error, ")
            out.append(f"  {name}: {message}")
        return out


class ReadOptions(StreamOptions):
    """What one read of a stream needs. Build it with :meth:`parse` from a data source's options."""

    KNOWN: ClassVar[str] = (
        "servers, stream, domain, user, password, token, nkey_seed_file, creds_file, tls_ca_file, tls_cert_file, "
        "tls_key_file, filter_subjects, batch, max_bytes, partitions, rows_per_partition, headers, payloads, "
        "timeout; for readStream also startingSequence, startingTime, latest, maxMessagesPerTrigger, failOnDataLoss"
    )
    SPARK_NAMES: ClassVar[dict[str, str]] = STREAM_OPTIONS

    filter_subjects: FilterSubjects = Field(default_factory=list)
    batch: Annotated[int, int_between(1, 100_000)] = 4096
    max_bytes: Annotated[int, int_between(1024, 64 * 1024 * 1024)] = 8 * 1024 * 1024
    partitions: Annotated[int, int_between(1, 100_000)] | None = None
    rows_per_partition: Annotated[int, int_between(1, 1_000_000_000)] = 250_000
    headers: list[str] | None = None  # None: every header
    payloads: bool = False
    # the stream reader's (spark.readStream) options
    starting_sequence: Annotated[int, int_between(1, 2**63 - 1)] | None = None
    starting_time: AwareDatetime | None = None
    latest: bool = False
    max_messages_per_trigger: Annotated[int, int_between(1, 1_000_000_000)] | None = None
    fail_on_data_loss: bool = True

    @model_validator(mode="after")
    def _one_start(self) -> ReadOptions:
        given = [STREAM_OPTIONS[f] for f in _STARTS if f in self.model_fields_set and getattr(self, f)]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} given: a query starts at one place, give one of them")
        return self

    @property
    def starting_time_utc(self) -> dt.datetime | None:
        """``startingTime`` in UTC."""
        return None if self.starting_time is None else self.starting_time.astimezone(dt.UTC)

    def stream_only(self) -> list[str]:
        """The stream reader's options given here (by their Spark names): the batch reader refuses them."""
        return [name for field, name in STREAM_OPTIONS.items() if field in self.model_fields_set]

    @classmethod
    def _option(cls, name: str, value: str) -> tuple[str, Any]:
        if name == "headers":
            return name, None if value.strip() == ALL_HEADERS else [h.strip() for h in value.split(",") if h.strip()]
        if name == "filter_subjects":
            return name, [item.strip() for item in value.split(",") if item.strip()]
        if name in _STREAM_FIELDS:
            return _STREAM_FIELDS[name], value
        return super()._option(name, value)


def side_options(side: TargetConfig | SourceConfig) -> dict[str, str]:
    """The data source options that read ``side``'s stream with its servers, credentials and TLS."""
    out: dict[str, str] = {"servers": ",".join(side.servers), "stream": side.stream}
    if side.domain:
        out["domain"] = side.domain
    auth = side.auth
    if auth is not None:
        for name in _AUTH_OPTIONS:
            value = getattr(auth, name)
            if value is not None:
                out[name] = value.get_secret_value() if hasattr(value, "get_secret_value") else str(value)
    if side.tls is not None:
        for option, field in _TLS_OPTIONS.items():
            value = getattr(side.tls, field)
            if isinstance(value, Path):
                out[option] = str(value)
    if isinstance(side, SourceConfig) and side.filter_subjects:
        out["filter_subjects"] = ",".join(side.filter_subjects)
    return out
