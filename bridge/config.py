"""The bridge's configuration: the model, the loader, and one readable line per problem.

A TOML file is the base and ``NATS_BRIDGE_*`` environment variables override it (nested keys joined with
``__``), so secrets and per-host details can stay out of the file. ``[[sources]]`` is a list, which
pydantic-settings cannot address by index, so ``NATS_BRIDGE_SOURCES__<index>__<KEY>`` is handled by this
module's own settings source (see :class:`_EnvSource`).

Every failure raises :class:`bridge.errors.ConfigError` whose ``problems`` are one line each, starting with
the key's dotted path (``sources[edge-a].max_ack_pending: ...``), so an operator can fix everything in one
pass instead of one error per restart. Secret values never appear in those lines, nor in ``repr`` of the
models.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from bridge.errors import ConfigError

__all__ = [
    "AuthConfig",
    "BridgeConfig",
    "CoordinationConfig",
    "EngineConfig",
    "HttpConfig",
    "LogConfig",
    "SourceConfig",
    "TargetConfig",
    "TlsConfig",
    "exposed_secrets",
    "format_config_error",
    "load_config",
]

ENV_PREFIX = "NATS_BRIDGE_"
DEFAULT_SERVER = "nats://127.0.0.1:4222"

# Our own validators raise this error type; its message is already written for the operator and is used
# verbatim, while pydantic's built-in error types are translated in _describe_error.
_ERROR_TYPE = "bridge_config"
_NAME_FORBIDDEN = re.compile(r"[\s.*>/\\]")
_SOURCE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_URL_SCHEMES = ("nats", "tls", "ws", "wss")
_SHOW_MAX = 60


def _fail(message: str) -> PydanticCustomError:
    return PydanticCustomError(_ERROR_TYPE, message)


def _show(value: object) -> str:
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
    if not _SOURCE_NAME.fullmatch(value):
        raise _fail(f"must be 1 to 64 letters, digits, '_' or '-' (got {_show(value)})")
    return value


def _jetstream_name(value: str) -> str:
    if not value:
        raise _fail("must not be empty")
    if _NAME_FORBIDDEN.search(value):
        raise _fail(f"must not contain whitespace or any of . * > / \\ (got {_show(value)})")
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
        raise _fail(f"{problem} (got {_show(value)})")
    return value


def _filter_subject(value: str) -> str:
    problem = _subject_problem(value, wildcards=True)
    if problem:
        raise _fail(f"{problem} (got {_show(value)})")
    return value


def _subject_prefix(value: str) -> str:
    problem = _subject_problem(value, wildcards=False)
    if problem:
        raise _fail(f"{problem}; write a prefix such as 'edge.site1', without a trailing '.' (got {_show(value)})")
    return value


def _server_url(value: str) -> str:
    shown = _show(value) if "@" not in value else "a URL with credentials"
    try:
        parts = urlsplit(value)
        # .port parses lazily and raises for a non-numeric or out-of-range port.
        _ = parts.port
    except ValueError:
        raise _fail(f"is not a valid URL (got {shown})") from None
    if parts.scheme.lower() not in _URL_SCHEMES or not parts.hostname:
        raise _fail(f"must be a nats://, tls://, ws:// or wss:// URL with a host, e.g. {DEFAULT_SERVER} (got {shown})")
    if parts.username is not None or parts.password is not None:
        # Credentials in a URL would end up in logs and reprs; the auth table keeps them secret.
        raise _fail("must not embed credentials (user:password@); put them in the auth table")
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
                raise _fail(f"looks like a JSON array but is not valid JSON ({exc.msg}, column {exc.colno})") from None
        return [value]
    return value


def _at_least_one_server(value: list[str]) -> list[str]:
    if not value:
        raise _fail(f'must list at least one server URL, e.g. ["{DEFAULT_SERVER}"]')
    return value


def _no_duplicate_items(value: list[str]) -> list[str]:
    seen: set[str] = set()
    for item in value:
        if item in seen:
            raise _fail(f"{_show(item)} is listed twice")
        seen.add(item)
    return value


def _lowercase(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def _seconds_at_least(bound: float, why: str = "") -> AfterValidator:
    def check(value: float) -> float:
        if not math.isfinite(value) or value < bound:
            raise _fail(f"must be at least {bound} seconds{why} (got {_show(value)})")
        return value

    return AfterValidator(check)


def _positive_seconds(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise _fail(f"must be a number of seconds greater than 0 (got {_show(value)})")
    return value


def _int_between(low: int, high: int, what: str = "") -> AfterValidator:
    def check(value: int) -> int:
        if not low <= value <= high:
            raise _fail(f"must be between {low} and {high}{what} (got {value})")
        return value

    return AfterValidator(check)


def _readable_file(path: Path) -> Path:
    path = path.expanduser()
    try:
        # stat first: opening a FIFO or device to probe it could block or have side effects.
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise _fail(f"{str(path)!r} is a directory, not a file")
        if not stat.S_ISREG(mode):
            raise _fail(f"{str(path)!r} is not a regular file")
        with path.open("rb"):
            pass
    except FileNotFoundError:
        raise _fail(f"file {str(path)!r} does not exist") from None
    except PermissionError:
        raise _fail(f"file {str(path)!r} is not readable by this process (permission denied)") from None
    except OSError as exc:
        raise _fail(f"cannot read file {str(path)!r}: {exc.strerror or exc}") from None
    return path


def _non_empty_secret(value: SecretStr | None) -> SecretStr | None:
    if value is not None and not value.get_secret_value():
        raise _fail("must not be empty (remove the key instead)")
    return value


def _non_empty(value: str) -> str:
    if not value:
        raise _fail("must not be empty (remove the key instead)")
    return value


def api_prefix(domain: str | None) -> str:
    """The JetStream API subject prefix for a domain: ``$JS.API``, or ``$JS.<domain>.API``."""
    return "$JS.API" if domain is None else f"$JS.{domain}.API"


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


def _default_servers() -> list[str]:
    return [DEFAULT_SERVER]


# hide_input_in_errors keeps values (maybe secrets) out of a raw ValidationError's text, should one ever be
# printed by code that bypasses load_config.
_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


# --- models -----------------------------------------------------------------------------------------------


class LogConfig(BaseModel):
    """``[log]``: how much the bridge logs and in which format (``auto`` picks console on a TTY, else JSON)."""

    model_config = _MODEL_CONFIG

    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lowercase)] = "info"
    format: Annotated[Literal["auto", "json", "console"], BeforeValidator(_lowercase)] = "auto"


class EngineConfig(BaseModel):
    """``[engine]``: timings of the replication engine, all in seconds."""

    model_config = _MODEL_CONFIG

    silence_timeout: Annotated[
        float, _seconds_at_least(2.0, ": the consumer heartbeat is fixed at 1 s, so less would flap")
    ] = 5.0
    reset_timeout: Seconds = 5.0
    reset_backoff_initial: Seconds = 2.0
    # validate_default: a raised *_initial must be checked against the default *_max too.
    reset_backoff_max: Seconds = Field(default=30.0, validate_default=True)
    publish_retry_initial: Seconds = 0.5
    publish_retry_max: Seconds = Field(default=15.0, validate_default=True)
    shutdown_grace: Seconds = 10.0

    @field_validator("reset_backoff_max", "publish_retry_max")
    @classmethod
    def _max_not_below_initial(cls, value: float, info: ValidationInfo) -> float:
        initial_key = (info.field_name or "").removesuffix("_max") + "_initial"
        initial = info.data.get(initial_key)
        if isinstance(initial, float) and value < initial:
            raise _fail(f"must be at least {initial_key} ({initial}) (got {_show(value)})")
        return value


def _listen(value: str) -> str:
    from bridge.observe.http import parse_listen  # the listener's own rule, so the two cannot drift apart

    if value == "":
        return value
    try:
        parse_listen(value)
    except ValueError:
        raise _fail(
            f'must be "host:port" (e.g. "127.0.0.1:9464", "[::]:9464"; port 0 picks a free one), or "" to disable '
            f"(got {_show(value)})"
        ) from None
    return value


class HttpConfig(BaseModel):
    """``[http]``: the listener for ``/metrics``, ``/healthz`` and ``/readyz``, and when a source counts as stalled."""

    model_config = _MODEL_CONFIG

    listen: Annotated[str, AfterValidator(_listen)] = "127.0.0.1:9464"
    stalled_after: Seconds = 60.0


class AuthConfig(BaseModel):
    """``auth``: how to authenticate to a server; at most one method, or none at all.

    ``password`` and ``token`` are :class:`~pydantic.SecretStr`: call ``get_secret_value()`` only where the
    value is handed to the client library. Files are checked to be readable when the config is loaded.
    """

    model_config = _MODEL_CONFIG

    user: Annotated[str, AfterValidator(_non_empty)] | None = None
    # validate_default: "user without password" is only detectable when the absent password is validated.
    password: SecretStr | None = Field(default=None, validate_default=True)
    token: SecretStr | None = None
    nkey_seed_file: ReadableFile | None = None
    creds_file: ReadableFile | None = None

    @field_validator("password")
    @classmethod
    def _password_with_user(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        _non_empty_secret(value)
        if "user" not in info.data:  # user itself is invalid and already reported
            return value
        if info.data["user"] is not None and value is None:
            raise _fail("required when user is set: give both user and password, or neither")
        if info.data["user"] is None and value is not None:
            raise _fail("given without user: give both user and password, or neither")
        return value

    @field_validator("token")
    @classmethod
    def _token_not_empty(cls, value: SecretStr | None) -> SecretStr | None:
        return _non_empty_secret(value)

    @model_validator(mode="after")
    def _one_method(self) -> Self:
        used = [
            name
            for name, present in (
                ("user/password", self.user is not None),
                ("token", self.token is not None),
                ("nkey_seed_file", self.nkey_seed_file is not None),
                ("creds_file", self.creds_file is not None),
            )
            if present
        ]
        if len(used) > 1:
            raise _fail(f"more than one authentication method ({', '.join(used)}): keep exactly one")
        return self


class TlsConfig(BaseModel):
    """``tls``: CA bundle to verify the server, and an optional client certificate with its key."""

    model_config = _MODEL_CONFIG

    ca_file: ReadableFile | None = None
    cert_file: ReadableFile | None = None
    # validate_default: "cert_file without key_file" is only detectable when the absent key is validated.
    key_file: ReadableFile | None = Field(default=None, validate_default=True)

    @field_validator("key_file")
    @classmethod
    def _key_with_cert(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if "cert_file" not in info.data:  # cert_file itself is invalid and already reported
            return value
        if info.data["cert_file"] is not None and value is None:
            raise _fail("required when cert_file is set: give both cert_file and key_file, or neither")
        if info.data["cert_file"] is None and value is not None:
            raise _fail("given without cert_file: give both cert_file and key_file, or neither")
        return value


class TargetConfig(BaseModel):
    """``[target]``: the aggregate server and stream every source is replicated into."""

    model_config = _MODEL_CONFIG

    servers: Servers = Field(default_factory=_default_servers)
    stream: JetStreamName
    domain: JetStreamName | None = None
    publish_window: Annotated[int, _int_between(1, 65536, " un-acked publishes")] = 1024
    ack_timeout: Seconds = 5.0
    auth: AuthConfig | None = None
    tls: TlsConfig | None = None

    @property
    def api_prefix(self) -> str:
        """The JetStream API subject prefix: ``$JS.API``, or ``$JS.<domain>.API`` with a domain."""
        return api_prefix(self.domain)


class SourceConfig(BaseModel):
    """``[[sources]]``: one edge server and stream to replicate, read through a durable push consumer."""

    model_config = _MODEL_CONFIG

    name: Annotated[str, AfterValidator(_source_name)]
    servers: Servers = Field(default_factory=_default_servers)
    stream: JetStreamName
    domain: JetStreamName | None = None
    # The "" defaults are never seen in a valid model: _derive_defaults fills both from a valid name, and
    # without a valid name the model is rejected anyway (so the name error is not echoed here a second time).
    consumer: JetStreamName = ""
    deliver_subject: Annotated[str, AfterValidator(_literal_subject)] = ""
    # Declared before filter_subjects so that field's validator can see it.
    manage_consumer: bool = True
    max_ack_pending: Annotated[int, _int_between(1, 1_000_000)] = 1000
    filter_subjects: FilterSubjects = Field(default_factory=list)
    subject_prefix: Annotated[str, AfterValidator(_subject_prefix)] | None = None
    auth: AuthConfig | None = None
    tls: TlsConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            name = data.get("name")
            if isinstance(name, str) and _SOURCE_NAME.fullmatch(name):
                data = dict(data)
                data.setdefault("consumer", f"nats-bridge-{name}")
                data.setdefault("deliver_subject", f"nats-bridge.deliver.{name}")
        return data

    @field_validator("filter_subjects")
    @classmethod
    def _filters_need_managed_consumer(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if value and info.data.get("manage_consumer") is False:
            raise _fail(
                "only allowed with manage_consumer = true: the filters of a pre-created consumer are the "
                "operator's, so set them on the consumer itself and remove filter_subjects here"
            )
        return value

    @property
    def api_prefix(self) -> str:
        """The JetStream API subject prefix: ``$JS.API``, or ``$JS.<domain>.API`` with a domain."""
        return api_prefix(self.domain)


_KV_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_INSTANCE_ID = re.compile(r"[A-Za-z0-9_=-][A-Za-z0-9_=.-]{0,126}[A-Za-z0-9_=-]|[A-Za-z0-9_=-]")


def _bucket_name(value: str) -> str:
    if not _KV_NAME.fullmatch(value):
        raise _fail(f"must be 1 to 64 letters, digits, '_' or '-' (a KV bucket name) (got {_show(value)})")
    return value


def _instance_id(value: str) -> str:
    if value and not _INSTANCE_ID.fullmatch(value):
        raise _fail(
            "must be letters, digits, '_', '-', '=' or inner '.', at most 128 (it is part of a KV key), or \"\" for "
            f"the default <host name>-<pid> (got {_show(value)})"
        )
    return value


def default_instance_id() -> str:
    """``<host name>-<pid>``, with every character a KV key cannot hold replaced by ``-``."""
    import socket

    host = re.sub(r"[^A-Za-z0-9_=.-]", "-", socket.gethostname()).strip(".") or "host"
    return f"{host[:100]}-{os.getpid()}"


class CoordinationConfig(BaseModel):
    """``[coordination]``: one owner per source, through leases in a JetStream KV bucket.

    By default the bucket lives on the target's servers and is reached through the target's connection; give
    ``servers`` (with ``auth``/``tls``/``domain`` as needed) to keep it elsewhere.
    """

    model_config = _MODEL_CONFIG

    enabled: bool = True
    bucket: Annotated[str, AfterValidator(_bucket_name)] = "nats-bridge"
    replicas: Annotated[int, _int_between(1, 5, " (the bucket's stream replicas)")] = 1
    lease_ttl: Annotated[
        float, _seconds_at_least(1.0, ": the lease is renewed every third of it and a KV write takes a round trip")
    ] = 10.0
    instance_id: Annotated[str, AfterValidator(_instance_id)] = ""
    servers: Servers | None = None
    domain: JetStreamName | None = None
    auth: AuthConfig | None = None
    tls: TlsConfig | None = None

    @property
    def instance(self) -> str:
        """The instance id in use: the configured one, or ``<host name>-<pid>``."""
        return self.instance_id or default_instance_id()

    @property
    def api_prefix(self) -> str:
        """The JetStream API subject prefix of the bucket's servers (used only with ``servers``)."""
        return api_prefix(self.domain)


class BridgeConfig(BaseSettings):
    """The whole configuration: ``[log]``, ``[engine]``, ``[http]``, ``[coordination]``, ``[target]`` and one or more
    ``[[sources]]``.

    Build it with :func:`load_config`. Constructed directly, it reads ``os.environ`` only.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        frozen=True,
        hide_input_in_errors=True,
    )

    log: LogConfig = Field(default_factory=LogConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    coordination: CoordinationConfig = Field(default_factory=CoordinationConfig)
    target: TargetConfig
    sources: list[SourceConfig]

    @field_validator("sources", mode="wrap")
    @classmethod
    def _names_unique(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # A wrap validator, so duplicates are reported next to the other sources' errors instead of only once
        # every source is otherwise valid.
        duplicates = _duplicate_name_errors(value)
        try:
            result = handler(value)
        except ValidationError as exc:
            if not duplicates:
                raise
            raise ValidationError.from_exception_data(exc.title, [*_reraisable(exc), *duplicates]) from None
        if duplicates:
            raise ValidationError.from_exception_data(cls.__name__, duplicates)
        if not result:
            raise _fail("at least one [[sources]] table is required")
        return result

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments first, then the environment, then the TOML file given to :func:`load_config`."""
        ctx = _LOADING.get() or _LoadContext(environ=os.environ, file_data={}, collect=False)
        return init_settings, _EnvSource(settings_cls, ctx), _FileSource(settings_cls, ctx)


def _duplicate_name_errors(value: Any) -> list[InitErrorDetails]:
    if not isinstance(value, list):
        return []
    first_index: dict[str, int] = {}
    errors: list[InitErrorDetails] = []
    for index, item in enumerate(value):
        name = item.get("name") if isinstance(item, dict) else getattr(item, "name", None)
        if not isinstance(name, str):
            continue
        if name in first_index:
            message = (
                f"{name!r} is already the name of sources[{first_index[name]}]: names must be unique (they "
                "identify the source in logs and metrics, and by default name its consumer and deliver subject)"
            )
            errors.append(InitErrorDetails(type=_fail(message), loc=(index, "name"), input=name))
        else:
            first_index[name] = index
    return errors


def _reraisable(exc: ValidationError) -> list[InitErrorDetails]:
    """The errors of ``exc`` in the form ``ValidationError.from_exception_data`` accepts again.

    Each becomes a custom error keeping its type, message and context: not every built-in type can be
    rebuilt by name (``path_type`` cannot), and _describe_error only needs those three.
    """
    return [
        InitErrorDetails(
            type=PydanticCustomError(err["type"], err["msg"], err.get("ctx")),
            loc=err["loc"],
            input=err["input"],
        )
        for err in exc.errors(include_url=False)
    ]


# --- settings sources -------------------------------------------------------------------------------------

Loc = tuple[str | int, ...]


@dataclass
class _LoadContext:
    """What one load_config call hands to the settings sources, and what they report back."""

    environ: Mapping[str, str]
    file_data: dict[str, Any]
    # False when BridgeConfig() is built directly: nobody would read `problems`, so the source raises.
    collect: bool
    problems: list[str] = field(default_factory=list)
    # Which environment variable set the value at each key path, to say so in error lines.
    env_keys: dict[Loc, str] = field(default_factory=dict)
    # The sources list after the environment overrides, to name sources in error lines.
    sources_raw: Any = None


_LOADING: ContextVar[_LoadContext | None] = ContextVar("bridge_config_loading", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """The parsed TOML file, as the lowest-priority source."""

    def __init__(self, settings_cls: type[BaseSettings], ctx: _LoadContext) -> None:
        super().__init__(settings_cls)
        self._data = ctx.file_data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        """Unused: ``__call__`` returns the whole file at once."""
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return copy.deepcopy(self._data)


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source, fed from a given mapping, plus list indices for ``sources``.

    pydantic-settings (2.16) turns ``NATS_BRIDGE_SOURCES__0__NAME`` into ``{"0": {"name": ...}}``, a dict that
    fails list validation and would replace the file's list anyway. So the ``SOURCES`` variables are taken
    out of what the parent sees and merged here, index by index, into the file's ``[[sources]]`` (or into
    the list ``NATS_BRIDGE_SOURCES`` gives as JSON). Problems with variables are collected, not raised,
    so they are reported together with the validation errors.
    """

    def __init__(self, settings_cls: type[BaseSettings], ctx: _LoadContext) -> None:
        super().__init__(settings_cls)
        self._ctx = ctx
        self._prefix = ENV_PREFIX.lower()
        self._sources_key = f"{self._prefix}sources"
        # Sorted so that two spellings of one variable (case differs) resolve the same way every time.
        self._original = {name.lower(): name for name in sorted(ctx.environ)}
        lowered = {name.lower(): ctx.environ[name] for name in sorted(ctx.environ)}
        self.env_vars = {
            name: value
            for name, value in lowered.items()
            if name != self._sources_key and not name.startswith(self._sources_key + "__")
        }
        self._sources_vars = {
            name: value
            for name, value in lowered.items()
            if name == self._sources_key or name.startswith(self._sources_key + "__")
        }
        self._record_env_keys(lowered)

    def _record_env_keys(self, lowered: Mapping[str, str]) -> None:
        # The sources variables are recorded by _sources, once they are known to apply.
        fields = set(self.settings_cls.model_fields) - {"sources"}
        for name in lowered:
            if not name.startswith(self._prefix):
                continue
            parts = name[len(self._prefix) :].split("__")
            if parts[0] in fields:
                self._ctx.env_keys[tuple(parts)] = self._original[name]

    def _problem(self, line: str) -> None:
        self._ctx.problems.append(line)

    def prepare_field_value(self, field_name: str, field: Any, value: Any, value_is_complex: bool) -> Any:
        """The parent's, except that invalid JSON becomes a reported problem instead of an exception."""
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError as exc:
            reason = f" ({exc.msg}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            variable = f"{ENV_PREFIX}{field_name.upper()}"
            # The whole field is then taken from the file alone: no error there is the environment's.
            for loc in [loc for loc in self._ctx.env_keys if loc[0] == field_name]:
                del self._ctx.env_keys[loc]
            self._problem(
                f"{field_name}: a {variable} or {variable}__* environment variable is not valid JSON{reason}; "
                f"give a JSON object, or set single keys as {variable}__<KEY>"
            )
            return None

    def __call__(self) -> dict[str, Any]:
        data = super().__call__()
        sources = self._sources()
        if sources is not None:
            data["sources"] = sources
        self._ctx.sources_raw = sources if sources is not None else self._ctx.file_data.get("sources")
        if self._ctx.problems and not self._ctx.collect:
            raise SettingsError("; ".join(self._ctx.problems))
        return data

    def _sources(self) -> list[Any] | None:
        """The sources list after the ``SOURCES`` variables, or None when none is set."""
        if not self._sources_vars:
            return None
        json_name = self._original.get(self._sources_key, ENV_PREFIX + "SOURCES")
        file_sources = self._ctx.file_data.get("sources")
        base: list[Any] | None = copy.deepcopy(file_sources) if isinstance(file_sources, list) else None
        if self._sources_key in self._sources_vars:
            replaced = self._decode_json(self._sources_vars[self._sources_key], json_name, "sources", list)
            if replaced is not None:
                base = replaced
                self._ctx.env_keys[("sources",)] = json_name
        if base is None:
            if not any(name != self._sources_key for name in self._sources_vars):
                return None  # only an invalid NATS_BRIDGE_SOURCES: the file's value stands, and is validated
            if file_sources is not None:
                # Validation reports the file's shape; applying indices to it would only add confusion.
                self._problem(
                    f"sources: cannot apply the {ENV_PREFIX}SOURCES__<index> variables: sources in the file is "
                    "not an array of tables (write [[sources]])"
                )
                return None
            base = []

        overrides: dict[int, list[tuple[list[str], str, str]]] = {}
        for name, value in self._sources_vars.items():
            if name == self._sources_key:
                continue
            original = self._original[name]
            # Keys are matched lowercased, but the index is quoted as the operator wrote it.
            written_index = original[len(self._sources_key) + 2 :].split("__")[0]
            index_text, *keys = name[len(self._sources_key) + 2 :].split("__")
            if not (index_text.isascii() and index_text.isdigit()):
                self._problem(
                    f"sources: {original}: {written_index!r} is not a source index; "
                    f"use {ENV_PREFIX}SOURCES__<index>__<KEY> with index 0, 1, ..."
                )
                continue
            if "" in keys:
                self._problem(f"sources[{int(index_text)}]: {original}: empty key between '__' separators")
                continue
            overrides.setdefault(int(index_text), []).append((keys, value, original))

        # New sources may be defined from the environment alone, but only as a contiguous extension: a gap
        # would leave a source with no settings at all, most likely a typo in an index.
        next_index = len(base)
        for index in sorted(i for i in overrides if i >= len(base)):
            if index != next_index:
                missing = (
                    f"source {next_index} is" if index == next_index + 1 else f"sources {next_index} to {index - 1} are"
                )
                for _, _, original in overrides.pop(index):
                    self._problem(
                        f"sources[{index}]: {original} refers to source {index}, but {missing} not defined "
                        "(indices start at 0 and must not skip any)"
                    )
                continue
            base.append({})
            next_index += 1

        for index, items in sorted(overrides.items()):
            entry = base[index]
            if not isinstance(entry, dict):
                self._problem(f"sources[{index}]: cannot apply {items[0][2]}: this source is not a table")
                continue
            # Whole-object variables first, so more specific keys override them.
            for keys, value, original in sorted(items, key=lambda item: len(item[0])):
                self._apply(entry, keys, value, original, index)
        return base

    def _apply(self, entry: dict[str, Any], keys: list[str], value: str, original: str, index: int) -> None:
        if not keys:
            obj = self._decode_json(value, original, f"sources[{index}]", dict)
            if obj is not None:
                _deep_merge(entry, obj)
                self._ctx.env_keys[("sources", index)] = original
            return
        decoded: Any = value
        if value.lstrip().startswith("{"):
            decoded = self._decode_json(value, original, f"sources[{index}].{'.'.join(keys)}", dict)
            if decoded is None:
                return
        node = entry
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        if isinstance(decoded, dict) and isinstance(node.get(keys[-1]), dict):
            _deep_merge(node[keys[-1]], decoded)
        else:
            node[keys[-1]] = decoded
        self._ctx.env_keys[("sources", index, *keys)] = original

    def _decode_json(self, value: str, variable: str, path: str, expected: type[Any]) -> Any:
        kind = "an array" if expected is list else "an object"
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError as exc:
            self._problem(f"{path}: {variable} is not valid JSON ({exc.msg}, column {exc.colno}); give {kind}")
            return None
        if not isinstance(decoded, expected):
            self._problem(f"{path}: {variable} must be a JSON {kind.split()[1]} (got {_json_kind(decoded)})")
            return None
        return decoded


def _json_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null"


def _deep_merge(into: dict[str, Any], update: Mapping[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


# --- error translation ------------------------------------------------------------------------------------

_REQUIRED_HINTS = {
    "target": f'a [target] table, with at least stream = "<aggregate stream>" (or {ENV_PREFIX}TARGET__STREAM)',
    "target.stream": "the aggregate stream's name",
    "sources": "at least one [[sources]] table, each with name, servers and stream",
    "sources.name": "a unique name for this source (letters, digits, '_' and '-', up to 64)",
    "sources.stream": "the name of the stream to replicate from this source",
}

_TYPE_MESSAGES = {
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be an array",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "dict_type": "must be a table",
    "path_type": "must be a file path (a string)",
}


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class holding the keys at ``loc`` (list indices skipped), or None past a non-model."""
    model: type[BaseModel] = BridgeConfig
    for part in loc:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        found = _find_model(info.annotation) if info is not None else None
        if found is None:
            return None
        model = found
    return model


def _find_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _find_model(arg)
        if found is not None:
            return found
    return None


def _unknown_key_message(loc: Loc) -> str:
    key = str(loc[-1])
    model = _model_at(loc[:-1])
    if model is None:
        return "unknown key"
    allowed = list(model.model_fields)
    close = difflib.get_close_matches(key.lower(), allowed, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown key{hint}; allowed here: {', '.join(allowed)}"


def _describe_error(err: ErrorDetails, loc: Loc) -> str:
    error_type = err["type"]
    if error_type == _ERROR_TYPE:
        return err["msg"]
    generic = ".".join(str(p) for p in loc if isinstance(p, str))
    if error_type == "missing":
        hint = _REQUIRED_HINTS.get(generic)
        return f"required: {hint}" if hint else "required"
    if error_type == "extra_forbidden":
        # Never echo the value: it may be a secret under a misspelt key.
        return _unknown_key_message(loc)
    # Anything under an auth table may be a secret, even a value of the wrong type.
    secret = "auth" in loc
    got = " (value not shown: it may be a secret)" if secret else f" (got {_show(err.get('input'))})"
    if error_type == "literal_error":
        return f"must be one of {err.get('ctx', {}).get('expected', '?')}{got}"
    if generic == "sources" and error_type == "list_type":
        return f"must be an array of tables: write one [[sources]] table per source{got}"
    message = _TYPE_MESSAGES.get(error_type)
    if message is None:
        text = err["msg"]
        message = text[:1].lower() + text[1:]
    return message + got


def _key_path(loc: Loc, sources_raw: Any) -> str:
    path = ""
    for position, part in enumerate(loc):
        if isinstance(part, int):
            label = str(part)
            if position == 1 and loc[0] == "sources":
                label = _source_label(part, sources_raw)
            path += f"[{label}]"
        else:
            path += f".{part}" if path else part
    return path or "(top level)"


def _source_label(index: int, sources_raw: Any) -> str:
    """The source's name where it identifies the source unambiguously, else its index."""
    if not isinstance(sources_raw, list) or index >= len(sources_raw):
        return str(index)
    names = [item.get("name") if isinstance(item, dict) else None for item in sources_raw]
    name = names[index]
    if isinstance(name, str) and _SOURCE_NAME.fullmatch(name) and not name.isdigit() and names.count(name) == 1:
        return name
    return str(index)


def _env_origin(loc: Loc, env_keys: Mapping[Loc, str]) -> str | None:
    for length in range(len(loc), 0, -1):
        variable = env_keys.get(loc[:length])
        if variable is not None:
            return variable
    return None


def _validation_problems(exc: ValidationError, ctx: _LoadContext) -> list[str]:
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(err["loc"])
        line = f"{_key_path(loc, ctx.sources_raw)}: {_describe_error(err, loc)}"
        origin = _env_origin(loc, ctx.env_keys)
        if origin is not None:
            line += f" [from environment variable {origin}]"
        if line not in lines:
            lines.append(line)
    return lines


# --- loading ----------------------------------------------------------------------------------------------

_TOML_POSITION = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$")


def _read_toml(path: Path) -> dict[str, Any]:
    def fail(problem: str) -> ConfigError:
        return ConfigError([f"{path}: {problem}"], str(path))

    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise fail("no such file (give the path of a TOML configuration file)") from None
    except IsADirectoryError:
        raise fail("is a directory, not a TOML configuration file") from None
    except PermissionError:
        raise fail("cannot read the file: permission denied") from None
    except OSError as exc:
        raise fail(f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text (invalid byte at offset {exc.start}); TOML files must be UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        text = str(exc)
        match = _TOML_POSITION.match(text)
        if match:
            where, text = f" at line {match['line']}, column {match['col']}", match["msg"]
        else:
            where = ""
        raise fail(f"TOML syntax error{where}: {text}") from None


def load_config(path: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> BridgeConfig:
    """Load the configuration from the TOML file at ``path``, overridden by ``NATS_BRIDGE_*`` variables.

    ``path`` None means the environment alone. ``environ`` defaults to ``os.environ``. Environment
    variables nest with ``__`` (``NATS_BRIDGE_TARGET__AUTH__PASSWORD``); ``NATS_BRIDGE_SOURCES__<i>__<KEY>``
    overrides one key of the i-th source, and ``NATS_BRIDGE_SOURCES`` (a JSON array) replaces them all.

    Raises :class:`~bridge.errors.ConfigError` listing every problem found, one line each.
    """
    source = str(path) if path is not None else "environment"
    file_data = _read_toml(Path(path)) if path is not None else {}
    ctx = _LoadContext(environ=os.environ if environ is None else environ, file_data=file_data, collect=True)
    token = _LOADING.set(ctx)
    try:
        # The sources come from ctx (see settings_customise_sources), so no arguments here.
        config = BridgeConfig()  # type: ignore[call-arg]
    except ValidationError as exc:
        # `from None`: the chained ValidationError's text would carry the inputs, secrets included.
        raise ConfigError(ctx.problems + _validation_problems(exc, ctx), source) from None
    except SettingsError as exc:
        raise ConfigError(ctx.problems or [f"environment: {exc}"], source) from None
    finally:
        _LOADING.reset(token)
    if ctx.problems:
        raise ConfigError(ctx.problems, source)
    return config


def exposed_secrets(path: str | os.PathLike[str], config: BridgeConfig) -> list[str]:
    """Secrets other local users can read: the configuration file when it holds a password or token itself, and
    nkey seed / creds files, when any of them is readable by "others" (mode ``o+r``). One line per finding, naming
    the file and the fix; never the secret. POSIX only (empty elsewhere)."""
    if os.name != "posix":
        return []
    findings: list[str] = []

    def world_readable(file: str | os.PathLike[str]) -> bool:
        try:
            return bool(os.stat(file).st_mode & stat.S_IROTH)
        except OSError:
            return False

    sides = [("target", config.target.auth)] + [(f"sources[{i}]", s.auth) for i, s in enumerate(config.sources)]
    raw = _read_toml(Path(path))
    raw_sources = raw.get("sources") if isinstance(raw.get("sources"), list) else []
    inline = []
    for where, section in [("target", raw.get("target"))] + [
        (f"sources[{i}]", item) for i, item in enumerate(raw_sources or [])
    ]:
        auth = section.get("auth") if isinstance(section, dict) else None
        if isinstance(auth, dict):
            inline += [f"{where}.auth.{key}" for key in ("password", "token") if auth.get(key)]
    if inline and world_readable(path):
        findings.append(
            f"{path} is readable by every local user and holds {', '.join(inline)}: chmod o-r {path}, or move the "
            "secrets to NATS_BRIDGE_* environment variables"
        )
    for where, auth in sides:
        if auth is None:
            continue
        for key in ("nkey_seed_file", "creds_file"):
            file = getattr(auth, key)
            if file is not None and world_readable(file):
                findings.append(f"{where}.auth.{key} {file} is readable by every local user: chmod o-r {file}")
    return findings


def format_config_error(err: ConfigError) -> str:
    """The error as the CLI prints it: a header naming where the configuration came from, one line per
    problem, and no traceback."""
    header = "nats-bridge: invalid configuration" + (f" ({err.source})" if err.source else "")
    return "\n".join([header, *(f"  {problem}" for problem in err.problems)])
