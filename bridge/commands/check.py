"""``nats-bridge check``: connect to every server, check the aggregate stream, create or vet every consumer.

Prints one verdict line per side and source; returns False when anything would keep the bridge from running.
A managed consumer is created (or repaired) exactly as ``run`` would, so a passing check leaves the origin ready.
"""

from __future__ import annotations

from collections.abc import Awaitable

import anyio

from bridge.commands.common import EXIT_OK, EXIT_PROBLEM, TIMEOUT, bucket_side
from bridge.config import BridgeConfig, SourceConfig, exposed_secrets, load_config
from bridge.core.subjects import SubjectSet
from bridge.errors import BridgeError
from bridge.io.connect import open_connection
from bridge.io.consumer import ensure_consumer
from bridge.io.jsapi import ApiError, JsApi
from bridge.io.kv import KvBucket, parse_view


def check(path: str) -> int:
    """``nats-bridge check -c PATH``: warn about exposed secrets, then check everything."""
    config = load_config(path)
    for warning in exposed_secrets(path, config):
        print(f"WARN secrets: {warning}", flush=True)
    return EXIT_OK if anyio.run(run_check, config) else EXIT_PROBLEM


def _print(ok: bool, what: str, detail: str) -> None:
    print(f"{'OK  ' if ok else 'FAIL'} {what}: {detail}", flush=True)


async def _check_target(config: BridgeConfig) -> bool:
    target = config.target
    try:
        nc = await open_connection(target, name="nats-bridge check", error_type=BridgeError)
    except BridgeError as exc:
        _print(False, "target", str(exc))
        return False
    try:
        info = await JsApi(nc, target.api_prefix).stream_info(target.stream, timeout=TIMEOUT)
    except BridgeError as exc:
        _print(False, f"target stream {target.stream}", str(exc))
        return False
    finally:
        await nc.close()
    cfg = info.get("config", {})
    ok = True
    subjects = list(cfg.get("subjects") or [])
    for src in config.sources:
        probe = f"{src.subject_prefix}.x" if src.subject_prefix else None
        if probe and subjects and not SubjectSet(subjects).captures(probe):
            _print(
                False, f"target stream {target.stream}", f"subjects {subjects} do not capture {src.subject_prefix}.>"
            )
            ok = False
    window = int(cfg.get("duplicate_window", 0)) / 1e9
    detail = (
        f"retention {cfg.get('retention')}, discard {cfg.get('discard')}, duplicate_window {window:g}s, "
        f"allow_direct {bool(cfg.get('allow_direct'))}, {info.get('state', {}).get('messages', 0)} messages"
    )
    _print(ok, f"target stream {target.stream}", detail)
    return ok


async def _check_coordination(config: BridgeConfig) -> bool:
    """The lease bucket: usable (created when missing, as ``run`` would), its TTL, who is in the fleet now."""
    coordination = config.coordination
    what = f"coordination bucket {coordination.bucket}"
    side = bucket_side(config)
    try:
        nc = await open_connection(side, name="nats-bridge check", error_type=BridgeError)
    except BridgeError as exc:
        _print(False, what, str(exc))
        return False
    try:
        kv = KvBucket(nc, JsApi(nc, side.api_prefix), coordination.bucket)
        ttl = await kv.ensure(coordination.lease_ttl, coordination.replicas, TIMEOUT)
        view = parse_view(await kv.read_all(TIMEOUT))
    except BridgeError as exc:
        _print(False, what, str(exc))
        return False
    finally:
        await nc.close()
    owned = sum(1 for src in config.sources if src.name in view.holders)
    note = (
        "" if abs(ttl - coordination.lease_ttl) < 1e-3 else f" (the bucket's; configured {coordination.lease_ttl:g}s)"
    )
    _print(
        True,
        what,
        f"lease ttl {ttl:g}s{note}, {len(view.members)} live process(es), {owned} of {len(config.sources)} "
        "source(s) owned now",
    )
    return True


async def _check_source(src: SourceConfig) -> bool:
    what = f"source {src.name}"
    try:
        nc = await open_connection(src, name=f"nats-bridge check {src.name}", error_type=BridgeError)
    except BridgeError as exc:
        _print(False, what, str(exc))
        return False
    api = JsApi(nc, src.api_prefix)
    try:
        try:
            stream = await api.stream_info(src.stream, timeout=TIMEOUT)
        except ApiError as exc:
            _print(False, what, f"origin stream {src.stream!r}: {exc.description}")
            return False
        info = await ensure_consumer(api, src, manage=src.manage_consumer, timeout=TIMEOUT)
    except BridgeError as exc:
        _print(False, what, str(exc))
        return False
    finally:
        await nc.close()
    retention = stream.get("config", {}).get("retention")
    floor = info.get("ack_floor", {}).get("stream_seq", 0)
    _print(
        True,
        what,
        f"origin {src.stream} ({retention}), consumer {src.consumer} "
        f"({'managed' if src.manage_consumer else 'bound'}), ack floor {floor}, pending {info.get('num_pending', 0)}",
    )
    return True


async def run_check(config: BridgeConfig) -> bool:
    """Check everything; True when the bridge can run."""
    results: list[bool] = []

    async def one(coro: Awaitable[bool]) -> None:
        results.append(await coro)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, _check_target(config))
        if config.coordination.enabled:
            tg.start_soon(one, _check_coordination(config))
        for src in config.sources:
            tg.start_soon(one, _check_source(src))
    ok = all(results)
    print("all checks passed" if ok else "some checks failed", flush=True)
    return ok
