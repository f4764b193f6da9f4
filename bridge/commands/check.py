"""``nats-bridge check``: connect to every server, check the aggregate stream, choose each source's mode, create or
vet every consumer.

Prints one verdict line per side and source (and per source the mode it will run in, and why, and over a far link
what its window carries: :mod:`bridge.core.window`); returns False when
anything would keep the bridge from running. A managed consumer is created (or repaired) exactly as ``run`` would,
so a passing check leaves the origin ready. A mode the origin's server cannot run (``mode = "flow_control"`` before
nats-server 2.14) is a configuration error: exit 2, as for an invalid file.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import anyio

from bridge.commands.common import EXIT_OK, EXIT_PROBLEM, TIMEOUT, bucket_side, copies_in
from bridge.commands.setup import copy_subjects, origin_missing, setup_command, transforms_text
from bridge.commands.sources import registry_merged
from bridge.config import BridgeConfig, SourceConfig, exposed_secrets
from bridge.config.loading import load_file
from bridge.config.registry import REGISTRY, Merged, registry_bucket
from bridge.core.fleet import holder_in
from bridge.core.modes import ModeUnsupported, mode_key, presume_mode
from bridge.core.subjects import pattern_covers
from bridge.core.window import FAR, window_carries, window_for, window_limit
from bridge.errors import BridgeError, ConfigError, ConsumerUnfit
from bridge.io.connect import close_connection, open_connection
from bridge.io.consumer import consumer_filters, ensure_consumer, several_filters_problem, source_mode
from bridge.io.jsapi import STREAM_NOT_FOUND, ApiError, JsApi, server_level
from bridge.io.kv import KvBucket, parse_view
from bridge.io.start import CopiesExist, creation_fields, start_seq_of


@dataclass
class CheckResult:
    """What ``run_check`` found: whether the bridge can run, and the configuration errors only the servers reveal
    (one line each, naming the key, as ``load_config`` words its own)."""

    ok: bool = True
    config_problems: list[str] = field(default_factory=list)


def check(path: str) -> int:
    """``nats-bridge check -c PATH``: warn about exposed secrets, then check everything.

    Raises :class:`~bridge.errors.ConfigError` (printed as an invalid configuration, exit 2) when a source's mode
    does not fit its origin's server.
    """
    data, config = load_file(path)
    for warning in exposed_secrets(path, config):
        print(f"WARN secrets: {warning}", flush=True)
    merged, registry_ok = anyio.run(_check_registry, data, config, path)
    result = anyio.run(run_check, merged.config, path)
    result.ok = result.ok and registry_ok
    if result.config_problems:
        raise ConfigError(result.config_problems, path)
    return EXIT_OK if result.ok else EXIT_PROBLEM


async def _check_registry(data: dict[str, Any], config: BridgeConfig, path: str) -> tuple[Merged, bool]:
    """The registry's sources (checked like the file's from here on) and whether every one of them is usable."""
    merged, problem = await registry_merged(data, config, path)
    if not config.coordination.enabled:
        return merged, True
    what = f"registry of sources {registry_bucket(config.coordination.bucket)}"
    if problem:
        # the daemon runs the file's sources meanwhile and applies the registry once it can read it
        _print(False, what, f"{problem} (only the file's sources are checked)")
        return merged, False
    registered = sum(1 for origin in merged.origins.values() if origin == REGISTRY)
    _print(True, what, f"{registered} registered source(s), {len(merged.refused)} refused")
    for name, problems in merged.refused.items():
        _print(False, f"source {name} (registry)", "; ".join(problems))
    return merged, not merged.refused


def _print(ok: bool, what: str, detail: str) -> None:
    print(f"{'OK  ' if ok else 'FAIL'} {what}: {detail}", flush=True)


async def _check_target(config: BridgeConfig, config_path: str) -> bool:
    target = config.target
    try:
        nc = await open_connection(target, name="nats-bridge check", error_type=BridgeError)
    except BridgeError as exc:
        _print(False, "target", str(exc))
        return False
    try:
        info = await JsApi(nc, target.api_prefix).stream_info(target.stream, timeout=TIMEOUT)
    except BridgeError as exc:
        missing = isinstance(exc, ApiError) and exc.err_code == STREAM_NOT_FOUND
        detail = f"the aggregate does not exist on the target; create it with: {setup_command(config_path)}"
        _print(False, f"target stream {target.stream}", detail if missing else str(exc))
        return False
    finally:
        await close_connection(nc)
    cfg = info.get("config", {})
    ok = True
    subjects = list(cfg.get("subjects") or [])
    for src in config.sources:
        # without a prefix or transforms the copies keep the origin's subjects, which setup reads (not this check)
        wanted = copy_subjects(src, None) if src.subject_prefix or src.subject_transforms else None
        uncaptured = [p for p in wanted or [] if subjects and not any(pattern_covers(s, p) for s in subjects)]
        if uncaptured:
            _print(
                False,
                f"target stream {target.stream}",
                f"subjects {subjects} do not capture {', '.join(uncaptured)} (the copies of source {src.name})",
            )
            ok = False
    window = int(cfg.get("duplicate_window", 0)) / 1e9
    detail = (
        f"retention {cfg.get('retention')}, discard {cfg.get('discard')}, duplicate_window {window:g}s, "
        f"allow_direct {bool(cfg.get('allow_direct'))}, allow_batched {bool(cfg.get('allow_batched'))} (order kept "
        f"across leader moves: {'yes' if cfg.get('allow_batched') else 'no'}), "
        f"{info.get('state', {}).get('messages', 0)} messages"
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
        await close_connection(nc)
    owned = sum(1 for src in config.sources if holder_in(view, src.name, coordination.lease_groups) is not None)
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


async def _check_source(src: SourceConfig, result: CheckResult, copies: CopiesExist) -> None:
    what = f"source {src.name}"
    try:
        nc = await open_connection(src, name=f"nats-bridge check {src.name}", error_type=BridgeError)
    except BridgeError as exc:
        _print(False, what, str(exc))
        result.ok = False
        return
    api = JsApi(nc, src.api_prefix)
    try:
        try:
            asked = time.monotonic()
            stream = await api.stream_info(src.stream, timeout=TIMEOUT)
            rtt = time.monotonic() - asked
        except ApiError as exc:
            missing = exc.err_code == STREAM_NOT_FOUND
            _print(False, what, origin_missing(src) if missing else f"origin stream {src.stream!r}: {exc.description}")
            result.ok = False
            return
        # auto keeps the kind of a durable that exists, as `run` does, and reads the durable only when it must, as
        # `run` does: on a 2.14+ origin flow control is presumed and the create (or a bound consumer's vetting)
        # confirms it; refused, the durable decides. So check needs no permission run does not (a managed
        # flow-control source's user has no CONSUMER.INFO). A configured mode does not depend on the durable.
        presumed = presume_mode(src.mode, *server_level(stream))
        try:
            choice = presumed or source_mode(src, stream, await _durable(api, src))
        except ModeUnsupported as exc:
            problem = f"{mode_key(src.name)}: {exc}"
            _print(False, what, problem)
            result.config_problems.append(problem)
            return

        def say_mode() -> None:  # once the mode is known: before the vetting, or once the vetting settled it
            _print(True, what, f"mode {choice.mode} ({choice.reason})")

        if presumed is None:
            say_mode()
        too_many = several_filters_problem(src, server_level(stream)[0])
        if too_many is not None:
            raise ConsumerUnfit(too_many)
        deliver, decision = None, ""
        if src.manage_consumer and src.start_position != "all":  # as the daemon's bind (bridge.io.start)
            deliver, decision = await creation_fields(api, src, choice.mode, TIMEOUT, copies)
        try:
            info = await ensure_consumer(
                api, src, manage=src.manage_consumer, timeout=TIMEOUT, mode=choice.mode, deliver=deliver
            )
        except ConsumerUnfit:
            if presumed is None:
                raise
            choice = source_mode(src, stream, await _durable(api, src))  # auto on 2.14+: no ModeUnsupported
            say_mode()
            if choice.mode is presumed.mode:
                raise  # the durable confirms the mode its vetting refused: that refusal stands
            info = await ensure_consumer(
                api, src, manage=src.manage_consumer, timeout=TIMEOUT, mode=choice.mode, deliver=deliver
            )
        else:
            if presumed is not None:
                say_mode()
        if rtt >= FAR:  # the first request may have paid for more than the link: ask twice more, keep the least
            rtt = min(rtt, await _round_trip(api, src))
    except BridgeError as exc:
        _print(False, what, str(exc))
        result.ok = False
        return
    finally:
        await close_connection(nc)
    retention = stream.get("config", {}).get("retention")
    kind = "managed" if src.manage_consumer else "bound"
    floor = info.get("ack_floor", {}).get("stream_seq", 0)
    _print(
        True,
        what,
        f"origin {src.stream} ({retention}), consumer {src.consumer} ({kind}), ack floor {floor}, "
        f"pending {info.get('num_pending', 0)}",
    )
    if src.subject_transforms:
        _check_transforms(src, consumer_filters(info), result)
    if src.start_position != "all":
        _check_start(src, info, decision, retention, result)
    if rtt >= FAR:
        window = int(info.get("config", {}).get("max_ack_pending") or src.max_ack_pending)
        state = stream.get("state", {})
        mean = int(state.get("bytes", 0)) // max(1, int(state.get("messages", 0)))
        grows = src.manage_consumer and src.window_budget > 0  # both modes grow a managed consumer's window
        _print(True, what, _window_advice(window, rtt, kind, window_limit(src.window_budget, mean) if grows else 0))


def _check_start(
    src: SourceConfig, info: dict[str, Any], decision: str, retention: object, result: CheckResult
) -> None:
    """What the start position did or will do, what it leaves on the origin, and a bound consumer that differs."""
    what = f"source {src.name}"
    cfg = info.get("config", {})
    start_seq = start_seq_of(info)
    placed = f"deliver_policy {cfg.get('deliver_policy')}"
    if cfg.get("opt_start_seq"):
        placed += f", opt_start_seq {cfg['opt_start_seq']}"
    if start_seq:
        placed += f", start sequence {start_seq}"
    if not src.manage_consumer:
        if cfg.get("deliver_policy") == "all" and not start_seq:
            _print(
                False,
                what,
                f"start {src.start_position}, but the pre-created consumer {src.consumer} delivers from the first "
                f"message ({placed}); the bridge never changes it: create it with the deliver policy you want, or "
                "remove the start from the source",
            )
            result.ok = False
            return
        _print(True, what, f"start {src.start_position}: the pre-created consumer's own ({placed})")
        return
    done = decision or "the consumer exists: it keeps where it was created"
    _print(True, what, f"start {src.start_position}: {done} ({placed})")
    if retention in ("workqueue", "interest"):
        _print(
            True,
            what,
            f"note: on this {retention} origin what lies before the start is never acked by the bridge: "
            + (
                "it stays in the stream (within its limits) until someone purges it"
                if retention == "workqueue"
                else "the server removes it once no other consumer wants it"
            ),
        )


def _check_transforms(src: SourceConfig, filters: list[str], result: CheckResult) -> None:
    """Where the copies land, and whether the consumer delivers only what a transform's ``src`` covers (a bound
    consumer's filters are the operator's: what none covers would keep its subject)."""
    what = f"source {src.name}"
    shown = transforms_text(src)
    copies = ", ".join(copy_subjects(src, None) or [])
    _print(True, what, f"subject transforms {shown}; copies on {copies}")
    srcs = [t.src for t in src.subject_transforms]
    outside = [f for f in filters or [">"] if not any(pattern_covers(s, f) for s in srcs)]
    if outside:
        _print(
            False,
            what,
            f"consumer {src.consumer} delivers {', '.join(outside)}, which no transform's src covers: those copies "
            "would keep their origin subject; give the consumer the transforms' src as its filter_subjects, or add "
            "a transform for them",
        )
        result.ok = False


def _window_advice(window: int, rtt: float, kind: str, grows_to: int) -> str:
    """What a far link means for the source's window (:mod:`bridge.core.window`); ``grows_to``: the largest window
    the bridge may grow it to by itself (0: it never does)."""
    carries = window_carries(window, rtt)
    head = f"link round trip {rtt * 1000:.1f} ms: max_ack_pending {window} ({kind} consumer) carries about "
    if grows_to > window:
        return (
            f"{head}{carries:,.0f} msg/s; the bridge grows it while that holds the source back, up to {grows_to} "
            f"(window_budget; about {window_carries(grows_to, rtt):,.0f} msg/s)"
        )
    return (
        f"{head}{carries:,.0f} msg/s; a faster source wants about 2 x rate x RTT (rate x {2 * rtt:.3f} s, "
        f"e.g. {window_for(2 * carries, rtt)} for {2 * carries:,.0f} msg/s)"
    )


async def _round_trip(api: JsApi, src: SourceConfig) -> float:
    """The least of two more ``STREAM.INFO`` round trips (infinite when neither is answered)."""
    best = math.inf
    for _ in range(2):
        asked = time.monotonic()
        with contextlib.suppress(BridgeError):
            await api.stream_info(src.stream, timeout=TIMEOUT)
            best = min(best, time.monotonic() - asked)
    return best


async def _durable(api: JsApi, src: SourceConfig) -> dict[str, object] | None:
    """The durable's ``CONSUMER.INFO`` where ``auto`` depends on it (None: it does not exist, or was not read)."""
    return await api.find_consumer(src.stream, src.consumer, timeout=TIMEOUT) if src.mode == "auto" else None


async def run_check(config: BridgeConfig, config_path: str) -> CheckResult:
    """Check everything; ``ok`` when the bridge can run. ``config_path`` is the file as the user named it, for the
    ``nats-bridge setup`` command a missing aggregate is pointed to."""
    result = CheckResult()

    async def one(coro: Awaitable[bool]) -> None:
        if not await coro:
            result.ok = False

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, _check_target(config, config_path))
        if config.coordination.enabled:
            tg.start_soon(one, _check_coordination(config))
        for src in config.sources:
            tg.start_soon(_check_source, src, result, copies_in(config.target, src))
    ok = result.ok and not result.config_problems
    print("all checks passed" if ok else "some checks failed", flush=True)
    return result
