"""The configuration models: ``[log]``, ``[engine]``, ``[http]``, ``auth``, ``tls``, ``[target]``, ``[[sources]]``,
``[coordination]`` and the whole :class:`BridgeConfig`.

Secret values never appear in ``repr`` of the models.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
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
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bridge.config.defaults import (
    DEFAULT_LISTEN,
    DEFAULT_PUBLISH_WINDOW,
    default_consumer,
    default_deliver_subject,
    default_instance_id,
    default_servers,
)
from bridge.config.env import ENV_PREFIX, LOADING, EnvSource, FileSource, LoadContext
from bridge.config.templates import apply_source_defaults
from bridge.config.validators import (
    SOURCE_NAME,
    Ago,
    BucketName,
    FilterSubjects,
    InstanceId,
    Instant,
    JetStreamName,
    ListenAddress,
    LiteralSubject,
    NonEmptyStr,
    Rate,
    ReadableFile,
    Seconds,
    Servers,
    Size,
    SourceName,
    SubjectPrefix,
    api_prefix,
    fail,
    int_between,
    lowercase,
    non_empty_secret,
    seconds_at_least,
    seconds_between,
    show,
)
from bridge.core.transforms import SubjectTransforms, TransformError

# hide_input_in_errors keeps values (maybe secrets) out of a raw ValidationError's text, should one ever be
# printed by code that bypasses load_config.
_MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


# --- models -----------------------------------------------------------------------------------------------


class LogConfig(BaseModel):
    """``[log]``: how much the bridge logs and in which format (``auto`` picks console on a TTY, else JSON)."""

    model_config = _MODEL_CONFIG

    level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(lowercase)] = "info"
    format: Annotated[Literal["auto", "json", "console"], BeforeValidator(lowercase)] = "auto"


class EngineConfig(BaseModel):
    """``[engine]``: timings of the replication engine, all in seconds."""

    model_config = _MODEL_CONFIG

    silence_timeout: Annotated[
        float, seconds_at_least(2.0, ": the consumer heartbeat is fixed at 1 s, so less would flap")
    ] = 5.0
    reset_timeout: Seconds = 5.0
    reset_backoff_initial: Seconds = 2.0
    # validate_default: a raised *_initial must be checked against the default *_max too.
    reset_backoff_max: Seconds = Field(default=30.0, validate_default=True)
    publish_retry_initial: Seconds = 0.5
    publish_retry_max: Seconds = Field(default=15.0, validate_default=True)
    shutdown_grace: Seconds = 10.0
    # Bytes the grown windows of every source together may hold beyond their configured max_ack_pending (each
    # source's own limit is sources[].window_budget): many far sources draining backlogs at once grow no further.
    windows_budget: Size = 256 * 1024 * 1024
    # JetStream API requests of every source together in flight at once (stream and consumer info, creates, RESETs,
    # reads of the aggregate for recovery): after a regional cut a thousand edges reconnect together, and without a
    # bound their requests reach the hub in one burst, behind which everything else waits. Publishes, answers and
    # acks are not requests. Why 128: docs/design.md, "Why 128 slots".
    api_requests_in_flight: Annotated[int, int_between(1, 4096, " requests")] = 128
    # The most publishes of every source together in flight to the aggregate at once (each source also keeps to the
    # target's publish_window): after a reconnect storm every source has a backlog at once, and the rest wait in the
    # process, unsent and without an ack deadline, rather than queue at the hub past target.ack_timeout. The limit in
    # force follows the hub's ack times, from 512 up to this (bridge/core/budget.py).
    publishes_in_flight: Annotated[int, int_between(1, 1_048_576, " publishes")] = 4096

    @field_validator("reset_backoff_max", "publish_retry_max")
    @classmethod
    def _max_not_below_initial(cls, value: float, info: ValidationInfo) -> float:
        initial_key = (info.field_name or "").removesuffix("_max") + "_initial"
        initial = info.data.get(initial_key)
        if isinstance(initial, float) and value < initial:
            raise fail(f"must be at least {initial_key} ({initial}) (got {show(value)})")
        return value


class HttpConfig(BaseModel):
    """``[http]``: the listener for ``/metrics``, ``/healthz`` and ``/readyz``, and when a source counts as stalled."""

    model_config = _MODEL_CONFIG

    listen: ListenAddress = DEFAULT_LISTEN
    stalled_after: Seconds = 60.0


class AuthConfig(BaseModel):
    """``auth``: how to authenticate to a server; at most one method, or none at all.

    ``password`` and ``token`` are :class:`~pydantic.SecretStr`: call ``get_secret_value()`` only where the
    value is handed to the client library. Files are checked to be readable when the config is loaded.
    """

    model_config = _MODEL_CONFIG

    user: NonEmptyStr | None = None
    # validate_default: "user without password" is only detectable when the absent password is validated.
    password: SecretStr | None = Field(default=None, validate_default=True)
    token: SecretStr | None = None
    nkey_seed_file: ReadableFile | None = None
    creds_file: ReadableFile | None = None

    @field_validator("password")
    @classmethod
    def _password_with_user(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        non_empty_secret(value)
        if "user" not in info.data:  # user itself is invalid and already reported
            return value
        if info.data["user"] is not None and value is None:
            raise fail("required when user is set: give both user and password, or neither")
        if info.data["user"] is None and value is not None:
            raise fail("given without user: give both user and password, or neither")
        return value

    @field_validator("token")
    @classmethod
    def _token_not_empty(cls, value: SecretStr | None) -> SecretStr | None:
        return non_empty_secret(value)

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
            raise fail(f"more than one authentication method ({', '.join(used)}): keep exactly one")
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
            raise fail("required when cert_file is set: give both cert_file and key_file, or neither")
        if info.data["cert_file"] is None and value is not None:
            raise fail("given without cert_file: give both cert_file and key_file, or neither")
        return value


class TargetConfig(BaseModel):
    """``[target]``: the aggregate server and stream every source is replicated into."""

    model_config = _MODEL_CONFIG

    servers: Servers = Field(default_factory=default_servers)
    stream: JetStreamName
    domain: JetStreamName | None = None
    publish_window: Annotated[int, int_between(1, 65536, " un-acked publishes")] = DEFAULT_PUBLISH_WINDOW
    ack_timeout: Seconds = 5.0
    auth: AuthConfig | None = None
    tls: TlsConfig | None = None

    @property
    def api_prefix(self) -> str:
        """The JetStream API subject prefix: ``$JS.API``, or ``$JS.<domain>.API`` with a domain."""
        return api_prefix(self.domain)


class SubjectTransformConfig(BaseModel):
    """One of ``sources[].subject_transforms``: copies of messages whose subject matches ``src`` are published on
    ``dest`` (nats-server's mapping syntax, as in a stream source's ``subject_transforms``); an empty ``dest``
    keeps the subject (``src`` only filters)."""

    model_config = _MODEL_CONFIG

    src: str = ">"
    dest: str = ""


class SourceConfig(BaseModel):
    """``[[sources]]``: one edge server and stream to replicate, read through a durable consumer: a push consumer
    with ``ack_policy: flow_control`` or a pull consumer with explicit acks (``mode``)."""

    model_config = _MODEL_CONFIG

    name: SourceName
    servers: Servers = Field(default_factory=default_servers)
    stream: JetStreamName
    domain: JetStreamName | None = None
    # The "" defaults are never seen in a valid model: _derive_defaults fills both from a valid name, and
    # without a valid name the model is rejected anyway (so the name error is not echoed here a second time).
    consumer: JetStreamName = ""
    deliver_subject: LiteralSubject = ""
    # Declared before filter_subjects so that field's validator can see it.
    manage_consumer: bool = True
    max_ack_pending: Annotated[int, int_between(1, 1_000_000)] = 1000
    # Which consumer model replicates the source (bridge.core.modes decides at start-up): "auto" keeps an
    # existing durable's kind, else takes flow control where the origin's server has it (2.14+), else pull.
    mode: Annotated[Literal["auto", "flow_control", "pull"], BeforeValidator(lowercase)] = "auto"
    # Pull mode only: the consumer's ack_wait, after which the server redelivers a message delivered but not acked
    # (the bridge drops the redelivery as a duplicate and acks it again). Too short costs redeliveries of messages
    # still being stored; too long keeps a message whose ack was lost pending, counted against max_ack_pending.
    ack_wait: Annotated[
        float, seconds_between(1.0, 3600.0, ": the origin redelivers a message not acked within it")
    ] = 30.0
    filter_subjects: FilterSubjects = Field(default_factory=list)
    # Where copies land: the first transform whose src matches the origin subject maps it (nats-server's syntax and
    # functions); the srcs are the managed consumer's filters, so a subject none matches is not delivered. The
    # subject_prefix, when set, goes in front of the transformed subject.
    subject_transforms: list[SubjectTransformConfig] = Field(default_factory=list)
    subject_prefix: SubjectPrefix | None = None
    # Where a source the aggregate has never seen starts (at most one of the four): its first message ("all"), what
    # arrives after the consumer is created ("new"), a sequence, a time, or a time that long ago. Applied when the
    # bridge creates the consumer; a source with copies in the aggregate resumes from them.
    start: Annotated[Literal["all", "new"], BeforeValidator(lowercase)] = "all"
    start_sequence: Annotated[int, int_between(1, 2**63 - 1)] | None = None
    start_time: Instant | None = None
    start_ago: Ago | None = None
    # Bytes per second the origin sends this source at most (0: no limit), for thin links: in flow-control mode the
    # consumer's rate_limit_bps (the server paces its deliveries). "64KiB", "50kbit" and the like are accepted.
    rate_limit: Rate = 0
    # Bytes this source's window may hold once grown (managed consumer): over a far link the bridge raises
    # max_ack_pending (pull mode: its requests in flight, and max_ack_pending with them) while the round trip holds
    # the source back (bridge.core.window), up to this
    # (every held message counted with 512 bytes of overhead) and what [engine] windows_budget has left. 0: never.
    window_budget: Size = 32 * 1024 * 1024
    auth: AuthConfig | None = None
    tls: TlsConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            name = data.get("name")
            if isinstance(name, str) and SOURCE_NAME.fullmatch(name):
                data = dict(data)
                data.setdefault("consumer", default_consumer(name))
                data.setdefault("deliver_subject", default_deliver_subject(name))
        return data

    @field_validator("filter_subjects")
    @classmethod
    def _filters_need_managed_consumer(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if value and info.data.get("manage_consumer") is False:
            raise fail(
                "only allowed with manage_consumer = true: the filters of a pre-created consumer are the "
                "operator's, so set them on the consumer itself and remove filter_subjects here"
            )
        return value

    @field_validator("subject_transforms")
    @classmethod
    def _transforms_the_server_would_take(
        cls, value: list[SubjectTransformConfig], info: ValidationInfo
    ) -> list[SubjectTransformConfig]:
        if not value:
            return value
        if info.data.get("filter_subjects"):
            raise fail(
                "set either filter_subjects or subject_transforms: the transforms' src are the consumer's filters "
                '(a filter alone is {src = "<filter>"}, whose copies keep their subject)'
            )
        try:
            SubjectTransforms((t.src, t.dest) for t in value)
        except TransformError as exc:
            raise fail(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _one_start(self) -> Self:
        given = [
            name
            for name, value in (
                ("start", self.start != "all"),
                ("start_sequence", self.start_sequence is not None),
                ("start_time", self.start_time is not None),
                ("start_ago", self.start_ago is not None),
            )
            if value
        ]
        if len(given) > 1:
            raise fail(
                f'give one start position, not {" and ".join(given)}: start = "new", start_sequence, start_time or '
                "start_ago"
            )
        return self

    @property
    def start_position(self) -> str:
        """The start as ``check``, ``setup`` and ``status`` show it: ``all``, ``new``, ``sequence 42``, ``time <RFC
        3339>`` or ``ago 86400s``."""
        if self.start_sequence is not None:
            return f"sequence {self.start_sequence}"
        if self.start_time is not None:
            return f"time {self.start_time.isoformat().replace('+00:00', 'Z')}"
        if self.start_ago is not None:
            return f"ago {self.start_ago:g}s"
        return self.start

    @property
    def consumer_filters(self) -> list[str]:
        """The subjects the consumer delivers: ``filter_subjects``, or the transforms' srcs (none: everything)."""
        if self.filter_subjects:
            return list(self.filter_subjects)
        srcs = [t.src or ">" for t in self.subject_transforms]
        return [] if ">" in srcs else srcs

    @property
    def copies_filter(self) -> str:
        """The aggregate subjects that hold this source's copies, as far as a subject tells (restart recovery reads
        the rest by ``Bridge-Source``): ``<prefix>.>``, else everything."""
        return f"{self.subject_prefix}.>" if self.subject_prefix else ">"

    @property
    def transform_pairs(self) -> tuple[tuple[str, str], ...]:
        """``subject_transforms`` as ``(src, dest)`` pairs, for the core (``bridge.core.transforms``)."""
        return tuple((t.src, t.dest) for t in self.subject_transforms)

    @field_validator("rate_limit", "window_budget")
    @classmethod
    def _consumer_settings_need_managed_consumer(cls, value: int, info: ValidationInfo) -> int:
        if value and info.data.get("manage_consumer") is False:
            instead = {
                "rate_limit": "rate_limit_bps (bits per second) on the consumer itself",
                "window_budget": "its max_ack_pending on the consumer itself (nats-bridge check says what a far link "
                "wants)",
            }[info.field_name or ""]
            raise fail(
                "only allowed with manage_consumer = true: the bridge never changes a pre-created consumer, so set "
                f"{instead} and remove {info.field_name} here"
            )
        return value

    @property
    def api_prefix(self) -> str:
        """The JetStream API subject prefix: ``$JS.API``, or ``$JS.<domain>.API`` with a domain."""
        return api_prefix(self.domain)


class CoordinationConfig(BaseModel):
    """``[coordination]``: one owner per source, through leases in a JetStream KV bucket.

    By default the bucket lives on the target's servers and is reached through the target's connection; give
    ``servers`` (with ``auth``/``tls``/``domain`` as needed) to keep it elsewhere.
    """

    model_config = _MODEL_CONFIG

    enabled: bool = True
    bucket: BucketName = "nats-bridge"
    replicas: Annotated[int, int_between(1, 5, " (the bucket's stream replicas)")] = 1
    lease_ttl: Annotated[
        float, seconds_at_least(1.0, ": the lease is renewed every third of it and a KV write takes a round trip")
    ] = 10.0
    # Every source belongs to one of this many groups (by its name) and the groups are leased, not the sources: the
    # hub's coordination writes stay at most lease_groups / (lease_ttl / 3) a second however many sources there are.
    # 0 leases every source on its own (the scheme before lease groups). Every process of a fleet needs the same.
    lease_groups: Annotated[
        int, int_between(0, 4096, ": 0 for one lease per source, else about 16 per process of the fleet or more")
    ] = 128
    instance_id: InstanceId = ""
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
    # settings every source takes unless it sets them itself, {name} and {domain} filled in (bridge.config.templates)
    source_defaults: dict[str, Any] = Field(default_factory=dict)
    # the file's (and environment's) sources, then the registry's when the loader was given them (LoadContext);
    # none at all is allowed with [coordination] enabled: the registry may hold every source
    sources: list[SourceConfig] = Field(default_factory=list, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _apply_source_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        ctx = LOADING.get()
        if ctx is not None and ctx.registry and isinstance(data.get("sources", []), list):
            # the registry's sources after the file's and the environment's (whose indices address the file's)
            data = {**data, "sources": [*data.get("sources", []), *ctx.registry]}
            ctx.sources_raw = data["sources"]
        defaults, sources = data.get("source_defaults"), data.get("sources")
        if not isinstance(defaults, dict) or not defaults or not isinstance(sources, list):
            return data  # nothing to apply, or a shape validation reports
        applied = apply_source_defaults(defaults, sources)
        if ctx is not None and ctx.collect:
            ctx.problems.extend(applied.problems)
            ctx.defaulted = applied.defaulted
        elif applied.problems:
            raise fail("; ".join(applied.problems))
        return {**data, "sources": applied.sources}

    @field_validator("sources", mode="wrap")
    @classmethod
    def _names_unique(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
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
        coordination = info.data.get("coordination")
        # (a [coordination] table that failed validation is not in info.data: its own errors are reported)
        if not result and isinstance(coordination, CoordinationConfig) and not coordination.enabled:
            raise fail(
                "at least one [[sources]] table is required (with [coordination] enabled the source registry may "
                "hold them instead: nats-bridge sources add)"
            )
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
        ctx = LOADING.get() or LoadContext(environ=os.environ, file_data={}, collect=False)
        return init_settings, EnvSource(settings_cls, ctx), FileSource(settings_cls, ctx)


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
            errors.append(InitErrorDetails(type=fail(message), loc=(index, "name"), input=name))
        else:
            first_index[name] = index
    return errors


def _reraisable(exc: ValidationError) -> list[InitErrorDetails]:
    """The errors of ``exc`` in the form ``ValidationError.from_exception_data`` accepts again.

    Each becomes a custom error keeping its type, message and context: not every built-in type can be
    rebuilt by name (``path_type`` cannot), and bridge.config.errors only needs those three.
    """
    return [
        InitErrorDetails(
            type=PydanticCustomError(err["type"], err["msg"], err.get("ctx")),
            loc=err["loc"],
            input=err["input"],
        )
        for err in exc.errors(include_url=False)
    ]
