"""Which consumer model a source replicates through: flow control (nats-server 2.14+) or pull (any server).

``sources[].mode`` is ``auto`` (the default), ``flow_control`` or ``pull``. ``auto`` keeps the kind of a durable
that already exists (a server upgraded to 2.14 does not turn a pull consumer into a push one, which the server
refuses anyway), and otherwise takes flow control where the origin's server has it: JetStream API level 4
(nats-server 2.14.0) or higher. Servers from 2.11 on report their API level in every stream info
(``_nats.level``); a server that reports none is older than 2.11.

Reading the durable costs every source a ``CONSUMER.INFO`` at start-up, and in the common case it only confirms what
the server's level says. So ``auto`` on a server with flow control first *presumes* it (``presume_mode``) and
creates the flow-control consumer straight away; the server never turns a consumer of one kind or ack policy into
another (``server/consumer.go``, ``checkNewConsumerConfig``), so a durable of another kind refuses that create, and
only then is it read and the mode chosen from it (``choose_mode``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

FLOW_CONTROL_API_LEVEL = 4  # JetStream API level of nats-server 2.14.0, the first with ack_policy flow_control


class Mode(StrEnum):
    """How a source reads its origin (also a metrics label)."""

    FLOW_CONTROL = "flow_control"
    PULL = "pull"


class ConsumerKind(StrEnum):
    """What an existing durable of the source's name is."""

    FLOW_CONTROL = "flow_control"  # push, ack_policy flow_control
    PULL = "pull"  # no deliver subject
    OTHER = "other"  # push with another ack policy: fits neither mode


@dataclass(frozen=True, slots=True)
class Choice:
    """The mode a source runs in and the reason, as logged (``source.mode``) and shown by ``check``/``status``."""

    mode: Mode
    reason: str


class ModeUnsupported(Exception):
    """``mode = "flow_control"`` on an origin server that predates it: a configuration error."""


def mode_key(source: str) -> str:
    """The configuration key a ``ModeUnsupported`` is about, as configuration errors name keys."""
    return f"sources[{source}].mode"


def supports_flow_control(api_level: int | None) -> bool:
    """The origin's server has ``ack_policy: flow_control`` (API level 4, nats-server 2.14.0, or later)."""
    return api_level is not None and api_level >= FLOW_CONTROL_API_LEVEL


def describe_server(api_level: int | None, version: str | None) -> str:
    """``nats-server 2.12.8 (API level 2)``, or what is known of it."""
    if api_level is None:
        return "a nats-server older than 2.11 (it reports no API level)"
    name = f"nats-server {version}" if version else "nats-server"
    return f"{name} (API level {api_level})"


def presume_mode(configured: str, api_level: int | None, version: str | None) -> Choice | None:
    """The mode to try without reading the durable: flow control for ``auto`` on a server that has it (None: read
    the durable and ``choose_mode``). Confirmed by the consumer's create; refused, the durable decides."""
    if configured == "auto" and supports_flow_control(api_level):
        return choose_mode(configured, api_level, version, None)  # as if no durable existed
    return None


def choose_mode(configured: str, api_level: int | None, version: str | None, existing: ConsumerKind | None) -> Choice:
    """The mode for a source, from its configuration, the origin's server and the durable if it exists.

    Raises ``ModeUnsupported`` for ``flow_control`` on a server older than 2.14.
    """
    server = describe_server(api_level, version)
    if configured == Mode.FLOW_CONTROL:
        if not supports_flow_control(api_level):
            raise ModeUnsupported(
                f'mode = "flow_control" needs nats-server 2.14.0 or later on the origin, which runs {server}: '
                'set mode = "auto" (or "pull") to replicate through a pull consumer, or upgrade the origin'
            )
        return Choice(Mode.FLOW_CONTROL, "configured")
    if configured == Mode.PULL:
        return Choice(Mode.PULL, "configured")
    if existing is ConsumerKind.PULL:
        return Choice(Mode.PULL, "the durable consumer exists as a pull consumer")
    if existing is ConsumerKind.FLOW_CONTROL:
        return Choice(Mode.FLOW_CONTROL, "the durable consumer exists with ack_policy flow_control")
    if supports_flow_control(api_level):
        return Choice(Mode.FLOW_CONTROL, f"the origin runs {server}, which has ack_policy flow_control")
    return Choice(Mode.PULL, f"the origin runs {server}, older than 2.14: no ack_policy flow_control")
