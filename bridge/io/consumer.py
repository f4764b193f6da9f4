"""Creating, repairing and vetting the origin's durable consumer: flow control (nats-server 2.14+) or pull.

A managed consumer is created (or repaired) with a *pedantic* create, so the server refuses instead of silently
rewriting what we asked for (docs/protocol.md 1.1; nats-server 2.10 ignores the field and creates as asked). A
consumer the operator created is only bound to after it passes ``unfit_reasons`` (flow control) or
``pull_unfit_reasons`` (pull): a wrong ack policy would never be acked, ``headers_only`` would replicate empty
payloads, and an ``inactive_threshold`` lets the server delete the durable while the bridge is away, which on an
Interest stream drops the messages it was holding. Non-editable differences are never "fixed" by deleting the
consumer: on an Interest or WorkQueue origin that would lose data, so the operator decides.

Pull mode (``.cache/pull/DESIGN.md``) reads a pull consumer with explicit acks: the bridge acks each message once
the aggregate holds it, and one that is not acked within ``ack_wait`` is delivered again (and dropped as a
duplicate), so ``max_deliver`` must not limit redeliveries: a message past its limit would never be acked nor
delivered again, and on a WorkQueue it would stay for good.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from bridge.config import SourceConfig
from bridge.core.effects import BoundConsumer
from bridge.core.modes import Choice, ConsumerKind, Mode, choose_mode
from bridge.errors import ConsumerUnfit, OriginUnavailable
from bridge.io.jsapi import CONSUMER_DOES_NOT_EXIST, ApiError, JsApi, seconds_ns, server_level

HEARTBEAT_NS = 1_000_000_000  # flow_control consumers must use exactly 1 s (server-enforced)
MIN_ACK_WAIT_NS = 1_000_000_000  # below it, a publish to the aggregate and its ack may outlast the ack wait


class ConsumerSettings(Protocol):
    name: str
    stream: str
    consumer: str
    deliver_subject: str
    max_ack_pending: int
    ack_wait: float  # seconds (pull mode)
    rate_limit: int  # bytes per second, 0: none (flow-control mode: the consumer's rate_limit_bps)

    @property
    def consumer_filters(self) -> list[str]:
        """The subjects the consumer delivers (none: everything)."""
        ...


def _common_config(source: ConsumerSettings, deliver: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What both kinds of consumer the bridge creates have in common: every message from the start (or ``deliver``:
    a start position's deliver policy and metadata, ``bridge.io.start``), no limit on redeliveries, the source's
    window and filters, and metadata naming the source."""
    config: dict[str, Any] = {
        "durable_name": source.consumer,
        "description": f"nats-bridge source {source.name}",
        "deliver_policy": "all",
        "max_ack_pending": source.max_ack_pending,
        "max_deliver": -1,
        "replay_policy": "instant",
        "metadata": {"nats-bridge.source": source.name},
    }
    if deliver:
        config.update({k: v for k, v in deliver.items() if k != "metadata"})
        config["metadata"].update(deliver.get("metadata") or {})
    filters = source.consumer_filters
    if len(filters) == 1:
        config["filter_subject"] = filters[0]
    elif filters:
        config["filter_subjects"] = filters
    return config


def desired_config(source: ConsumerSettings, deliver: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The flow-control consumer configuration the bridge creates for a managed source: ``rate_limit`` as the
    server's ``rate_limit_bps`` (bits per second; absent, or 0 on an update, for none)."""
    return {
        **_common_config(source, deliver),
        "deliver_subject": source.deliver_subject,
        "ack_policy": "flow_control",
        "flow_control": True,
        "idle_heartbeat": HEARTBEAT_NS,
        "rate_limit_bps": source.rate_limit * 8,
    }


def desired_pull_config(source: ConsumerSettings, deliver: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The pull consumer configuration the bridge creates for a managed source in pull mode: explicit acks with
    the source's ``ack_wait``, no deliver subject (heartbeats are asked per pull request, not configured)."""
    return {**_common_config(source, deliver), "ack_policy": "explicit", "ack_wait": seconds_ns(source.ack_wait)}


def several_filters_problem(source: SourceConfig, api_level: int | None) -> str | None:
    """Why ``source`` cannot run on an origin whose STREAM.INFO reported ``api_level`` (None: it can): a server before
    2.11 (no API level reported, :func:`bridge.io.jsapi.server_level`) and a consumer of several filter subjects,
    which there can skip messages (seen on 2.10.26, in pull mode: 3 of 600 matching messages never delivered, nothing
    to tell the bridge)."""
    filters = source.consumer_filters
    if api_level is not None or len(filters) < 2:
        return None
    return (
        f"sources[{source.name}]: {len(filters)} filter subjects (filter_subjects, or the srcs of subject_transforms) "
        "on an origin before nats-server 2.11, whose consumers with several filters can skip messages (seen on "
        "2.10.26: 3 of 600 never delivered); use one filter, or upgrade the origin"
    )


def consumer_kind(info: dict[str, Any]) -> ConsumerKind:
    """What an existing consumer is, from its ``CONSUMER.INFO``: a pull consumer has no deliver subject."""
    cfg = info.get("config", {})
    if not cfg.get("deliver_subject"):
        return ConsumerKind.PULL
    if cfg.get("ack_policy") == "flow_control":
        return ConsumerKind.FLOW_CONTROL
    return ConsumerKind.OTHER


def source_mode(source: SourceConfig, stream_info: dict[str, Any], existing: dict[str, Any] | None) -> Choice:
    """The mode the daemon will run ``source`` in (``bridge.core.modes.choose_mode``), from the origin's
    ``STREAM.INFO`` (its server's API level) and the durable's ``CONSUMER.INFO`` when it exists (None: it does not,
    or it was not read: only ``auto`` depends on it). Raises ``ModeUnsupported``."""
    level, version = server_level(stream_info)
    return choose_mode(source.mode, level, version, consumer_kind(existing) if existing is not None else None)


def consumer_filters(info: dict[str, Any]) -> list[str]:
    """The subjects a consumer delivers, from its ``CONSUMER.INFO`` (empty: the whole stream)."""
    cfg = info.get("config", {})
    filters = list(cfg.get("filter_subjects") or [])
    single = cfg.get("filter_subject")
    if single and single not in filters:
        filters.append(single)
    return [f for f in filters if f and f != ">"]


def _common_reasons(cfg: dict[str, Any]) -> list[str]:
    reasons: list[str] = []
    if cfg.get("headers_only"):
        reasons.append("headers_only is set: payloads would not be replicated")
    if cfg.get("inactive_threshold"):
        reasons.append(
            "inactive_threshold is set: the server would delete the durable while the bridge is away (on an "
            "Interest stream that drops its messages); create it without one"
        )
    return reasons


def unfit_reasons(info: dict[str, Any], source: ConsumerSettings) -> list[str]:
    """Why an existing consumer cannot serve this source in flow-control mode (empty when it can)."""
    cfg = info.get("config", {})
    reasons: list[str] = []
    if cfg.get("ack_policy") != "flow_control":
        reasons.append(
            f"ack_policy is {cfg.get('ack_policy')!r}; the bridge acks only through flow-control answers and needs "
            "'flow_control' (nats-server >= 2.14)"
        )
    if cfg.get("deliver_subject") != source.deliver_subject:
        reasons.append(
            f"deliver_subject is {cfg.get('deliver_subject')!r}, configured {source.deliver_subject!r}: set "
            "sources.deliver_subject to the consumer's"
        )
    if not cfg.get("flow_control"):
        reasons.append("flow_control is off")
    if cfg.get("deliver_group"):
        reasons.append(f"deliver_group {cfg.get('deliver_group')!r} is set; the bridge needs a plain push consumer")
    return reasons + _common_reasons(cfg)


def pull_unfit_reasons(info: dict[str, Any], source: ConsumerSettings) -> list[str]:
    """Why an existing consumer cannot serve this source in pull mode (empty when it can)."""
    cfg = info.get("config", {})
    reasons: list[str] = []
    if cfg.get("deliver_subject"):
        reasons.append(
            f"it is a push consumer (deliver_subject {cfg.get('deliver_subject')!r}); pull mode needs a pull "
            'consumer: create one without a deliver_subject, or set sources.mode = "flow_control" for a '
            "flow-control consumer on nats-server >= 2.14"
        )
    if cfg.get("ack_policy") != "explicit":
        reasons.append(
            f"ack_policy is {cfg.get('ack_policy')!r}; pull mode acks each stored message and needs 'explicit'"
        )
    max_deliver = int(cfg.get("max_deliver") or -1)
    if max_deliver > 0:
        reasons.append(
            f"max_deliver is {max_deliver}: a message delivered that often before the aggregate stored it would "
            "never be delivered nor acked again; create it with max_deliver -1"
        )
    ack_wait = int(cfg.get("ack_wait") or 0)
    if 0 < ack_wait < MIN_ACK_WAIT_NS:
        reasons.append(
            f"ack_wait is {ack_wait / 1e9:g}s: every message would be delivered again before the aggregate's ack "
            f"could come back; create it with ack_wait >= 1s (the bridge's is {source.ack_wait:g}s)"
        )
    return reasons + _common_reasons(cfg)


def desired_for(mode: Mode, source: ConsumerSettings, deliver: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The managed consumer's configuration in ``mode`` (``deliver``: its start, ``bridge.io.start``)."""
    return desired_pull_config(source, deliver) if mode is Mode.PULL else desired_config(source, deliver)


def unfit_for(mode: Mode, info: dict[str, Any], source: ConsumerSettings) -> list[str]:
    """Why an existing consumer cannot serve the source in ``mode`` (empty when it can)."""
    return pull_unfit_reasons(info, source) if mode is Mode.PULL else unfit_reasons(info, source)


def bound_missing_fix(mode: Mode, source: ConsumerSettings) -> str:
    """The consumer a bound source needs in ``mode``, for the message when it does not exist."""
    if mode is Mode.PULL:
        return "a durable pull consumer (no deliver_subject) with ack_policy explicit and max_deliver -1"
    return (
        "a durable push consumer with ack_policy flow_control, flow_control true, idle_heartbeat 1s, "
        f"deliver_subject {source.deliver_subject}"
    )


async def ensure_consumer(
    api: JsApi,
    source: ConsumerSettings,
    *,
    manage: bool,
    timeout: float,
    mode: Mode,
    deliver: Mapping[str, Any] | None = None,
    update_only: bool = False,
) -> dict[str, Any]:
    """Create/repair (managed) or look up and vet (bound) the source's consumer for ``mode``; return its info.
    ``update_only`` (managed): update the consumer's settings, never create it (a consumer deleted by an operator
    is the engine's discontinuity to notice, and its resync's bind creates it again).

    Raises ``ConsumerUnfit`` when it cannot be created or does not fit, ``OriginUnavailable`` when an update
    found no consumer, and the ``bridge.errors`` API errors.
    """
    pull = mode is Mode.PULL
    if manage:
        try:
            info = await api.create_consumer(
                source.stream,
                desired_for(mode, source, deliver),
                pedantic=True,
                timeout=timeout,
                action="update" if update_only else None,
            )
        except ApiError as exc:
            if update_only and exc.err_code == CONSUMER_DOES_NOT_EXIST:
                raise OriginUnavailable(
                    f"consumer {source.stream}/{source.consumer} does not exist: not updated (the source's next "
                    "bind creates it)"
                ) from exc
            fixed = (
                "ack_policy, deliver_policy, a push consumer's deliver_subject"
                if pull
                else ("ack_policy, deliver_policy, flow_control, idle_heartbeat")
            )
            raise ConsumerUnfit(
                f"cannot create or update consumer {source.stream}/{source.consumer} for {mode} mode: "
                f"{exc.description} (err_code {exc.err_code}); settings that cannot be updated ({fixed}) need the "
                "consumer deleted by an operator, or manage_consumer = false"
            ) from exc
    else:
        found = await api.find_consumer(source.stream, source.consumer, timeout=timeout)
        if found is None:
            raise ConsumerUnfit(
                f"consumer {source.stream}/{source.consumer} does not exist and manage_consumer = false: "
                f"create {bound_missing_fix(mode, source)}, or set manage_consumer = true"
            )
        info = found
    reasons = unfit_for(mode, info, source)
    if reasons:
        raise ConsumerUnfit(
            f"consumer {source.stream}/{source.consumer} is unfit for {mode} mode: " + "; ".join(reasons)
        )
    return info


def bound_consumer(info: Mapping[str, Any]) -> BoundConsumer:
    """What a consumer create or info reply says of where the consumer stands (fields it lacks: not known)."""

    def number(value: object) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    floor, delivered = info.get("ack_floor") or {}, info.get("delivered") or {}
    dseq, sseq = number(delivered.get("consumer_seq")), number(delivered.get("stream_seq"))
    return BoundConsumer(
        created=info.get("created"),
        ack_floor=number(floor.get("stream_seq")) or 0,
        num_pending=number(info.get("num_pending")),
        delivered=(dseq, sseq) if dseq is not None and sseq is not None else None,
        ack_floor_dseq=number(floor.get("consumer_seq")),
        ack_pending=number(info.get("num_ack_pending")),
    )
