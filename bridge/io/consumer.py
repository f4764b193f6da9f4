"""Creating, repairing and vetting the origin's durable flow-control consumer.

A managed consumer is created (or repaired) with a *pedantic* create, so the server refuses instead of silently
rewriting what we asked for (docs/protocol.md 1.1). A consumer the operator created is only bound to after it passes
``unfit_reasons``: a wrong ack policy would never be acked, ``headers_only`` would replicate empty payloads, and an
``inactive_threshold`` lets the server delete the durable while the bridge is away, which on an Interest stream
drops the messages it was holding. Non-editable differences are never "fixed" by deleting the consumer: on an
Interest or WorkQueue origin that would lose data, so the operator decides.
"""

from __future__ import annotations

from typing import Any, Protocol

from bridge.errors import ConsumerUnfit
from bridge.io.jsapi import CONSUMER_NOT_FOUND, ApiError, JsApi

HEARTBEAT_NS = 1_000_000_000  # flow_control consumers must use exactly 1 s (server-enforced)


class ConsumerSettings(Protocol):
    name: str
    stream: str
    consumer: str
    deliver_subject: str
    max_ack_pending: int
    filter_subjects: list[str]


def desired_config(source: ConsumerSettings) -> dict[str, Any]:
    """The consumer configuration the bridge creates for a managed source."""
    config: dict[str, Any] = {
        "durable_name": source.consumer,
        "description": f"nats-bridge source {source.name}",
        "deliver_subject": source.deliver_subject,
        "deliver_policy": "all",
        "ack_policy": "flow_control",
        "flow_control": True,
        "idle_heartbeat": HEARTBEAT_NS,
        "max_ack_pending": source.max_ack_pending,
        "max_deliver": -1,
        "replay_policy": "instant",
        "metadata": {"nats-bridge.source": source.name},
    }
    filters = list(source.filter_subjects)
    if len(filters) == 1:
        config["filter_subject"] = filters[0]
    elif filters:
        config["filter_subjects"] = filters
    return config


def unfit_reasons(info: dict[str, Any], source: ConsumerSettings) -> list[str]:
    """Why an existing consumer cannot serve this source (empty when it can)."""
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
    if cfg.get("headers_only"):
        reasons.append("headers_only is set: payloads would not be replicated")
    if cfg.get("inactive_threshold"):
        reasons.append(
            "inactive_threshold is set: the server would delete the durable while the bridge is away (on an "
            "Interest stream that drops its messages); create it without one"
        )
    return reasons


async def ensure_consumer(api: JsApi, source: ConsumerSettings, *, manage: bool, timeout: float) -> dict[str, Any]:
    """Create/repair (managed) or look up and vet (bound) the source's consumer; return its info."""
    if manage:
        try:
            info = await api.create_consumer(source.stream, desired_config(source), pedantic=True, timeout=timeout)
        except ApiError as exc:
            raise ConsumerUnfit(
                f"cannot create or update consumer {source.stream}/{source.consumer}: {exc.description} "
                f"(err_code {exc.err_code}); settings that cannot be updated (ack_policy, deliver_policy, "
                "flow_control, idle_heartbeat) need the consumer deleted by an operator, or manage_consumer = false"
            ) from exc
    else:
        try:
            info = await api.consumer_info(source.stream, source.consumer, timeout=timeout)
        except ApiError as exc:
            if exc.err_code == CONSUMER_NOT_FOUND:
                raise ConsumerUnfit(
                    f"consumer {source.stream}/{source.consumer} does not exist and manage_consumer = false: "
                    "create it (ack_policy flow_control, deliver_subject as configured) or set manage_consumer = true"
                ) from exc
            raise
    reasons = unfit_reasons(info, source)
    if reasons:
        raise ConsumerUnfit(f"consumer {source.stream}/{source.consumer} is unfit: " + "; ".join(reasons))
    return info
