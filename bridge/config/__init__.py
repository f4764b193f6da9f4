"""The bridge's configuration: the models, the loader, and one readable line per problem.

A TOML file is the base and ``NATS_BRIDGE_*`` environment variables override it (nested keys joined with
``__``), so secrets and per-host details can stay out of the file. ``[[sources]]`` is a list, which
pydantic-settings cannot address by index, so ``NATS_BRIDGE_SOURCES__<index>__<KEY>`` is handled by the
package's own settings source (:mod:`bridge.config.env`).

Every failure raises :class:`bridge.errors.ConfigError` whose ``problems`` are one line each, starting with
the key's dotted path (``sources[edge-a].max_ack_pending: ...``), so an operator can fix everything in one
pass instead of one error per restart. Secret values never appear in those lines, nor in ``repr`` of the
models.

One job per module: :mod:`~bridge.config.defaults` (defaults needed in more than one place),
:mod:`~bridge.config.validators` (field validators, the annotated types, ``api_prefix``),
:mod:`~bridge.config.models`, :mod:`~bridge.config.templates` (``[source_defaults]``, ``{name}`` and ``{domain}``),
:mod:`~bridge.config.env` (the environment and file settings sources),
:mod:`~bridge.config.errors` (the problem lines) and :mod:`~bridge.config.loading` (``load_config``).
"""

from bridge.config.errors import format_config_error
from bridge.config.loading import exposed_secrets, load_config
from bridge.config.models import (
    AuthConfig,
    BridgeConfig,
    CoordinationConfig,
    EngineConfig,
    HttpConfig,
    LogConfig,
    SourceConfig,
    TargetConfig,
    TlsConfig,
)
from bridge.config.validators import FilterSubjects, JetStreamName, Seconds, Servers, api_prefix

__all__ = [
    "AuthConfig",
    "BridgeConfig",
    "CoordinationConfig",
    "EngineConfig",
    "FilterSubjects",
    "HttpConfig",
    "JetStreamName",
    "LogConfig",
    "Seconds",
    "Servers",
    "SourceConfig",
    "TargetConfig",
    "TlsConfig",
    "api_prefix",
    "exposed_secrets",
    "format_config_error",
    "load_config",
]
