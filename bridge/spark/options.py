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
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

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
from bridge.errors import AuditError

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


def _between(low: int, high: int) -> AfterValidator:
    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value

    return AfterValidator(check)


class ReadOptions(BaseModel):
    """What one read of a stream needs. Build it with :meth:`parse` from a data source's options."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    servers: Servers
    stream: JetStreamName
    domain: JetStreamName | None = None
    auth: AuthConfig | None = None
    tls: TlsConfig | None = None
    filter_subjects: FilterSubjects = Field(default_factory=list)
    batch: Annotated[int, _between(1, 100_000)] = 4096
    max_bytes: Annotated[int, _between(1024, 64 * 1024 * 1024)] = 8 * 1024 * 1024
    partitions: Annotated[int, _between(1, 100_000)] | None = None
    rows_per_partition: Annotated[int, _between(1, 1_000_000_000)] = 250_000
    headers: list[str] | None = None  # None: every header
    payloads: bool = False
    timeout: Seconds = 10.0
    # the stream reader's (spark.readStream) options
    starting_sequence: Annotated[int, _between(1, 2**63 - 1)] | None = None
    starting_time: AwareDatetime | None = None
    latest: bool = False
    max_messages_per_trigger: Annotated[int, _between(1, 1_000_000_000)] | None = None
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

    @property
    def api_prefix(self) -> str:
        """``$JS.API``, or ``$JS.<domain>.API``."""
        return api_prefix(self.domain)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Validate a data source's options; raises :class:`AuditError` naming each bad option and its fix."""
        data: dict[str, Any] = {}
        auth: dict[str, str] = {}
        tls: dict[str, str] = {}
        for key, value in options.items():
            name = key.lower()
            if name in _AUTH_OPTIONS:
                auth[_AUTH_OPTIONS[name]] = value
            elif name in _TLS_OPTIONS:
                tls[_TLS_OPTIONS[name]] = value
            elif name == "headers":
                data[name] = (
                    None if value.strip() == ALL_HEADERS else [h.strip() for h in value.split(",") if h.strip()]
                )
            elif name in ("servers", "filter_subjects"):
                data[name] = [item.strip() for item in value.split(",") if item.strip()]
            elif name in _STREAM_FIELDS:
                data[_STREAM_FIELDS[name]] = value
            elif name == "path":
                continue  # Spark adds it for load(path); a stream is named by the stream option
            else:
                data[name] = value
        if auth:
            data["auth"] = auth
        if tls:
            data["tls"] = tls
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise AuditError("invalid jetstream data source options:\n" + "\n".join(_problems(exc))) from None


def _option_name(loc: tuple[int | str, ...]) -> str:
    if len(loc) >= 1 and loc[0] in STREAM_OPTIONS:
        return STREAM_OPTIONS[str(loc[0])]
    if len(loc) >= 2 and loc[0] == "tls":
        return f"tls_{loc[1]}"
    if len(loc) >= 2 and loc[0] == "auth":
        return str(loc[1])
    return str(loc[0]) if loc else "options"


def _problems(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_input=False, include_url=False):
        name = _option_name(err["loc"])
        if err["type"] == "missing":
            message = f'required: give .option("{name}", ...)'
        elif err["type"] == "extra_forbidden":
            message = (
                "unknown option: use servers, stream, domain, user, password, token, nkey_seed_file, creds_file, "
                "tls_ca_file, tls_cert_file, tls_key_file, filter_subjects, batch, max_bytes, partitions, "
                "rows_per_partition, headers, payloads, timeout; for readStream also startingSequence, "
                "startingTime, latest, maxMessagesPerTrigger, failOnDataLoss"
            )
        else:
            message = err["msg"].removeprefix("Value error, ")
        out.append(f"  {name}: {message}")
    return out


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
