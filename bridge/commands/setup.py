"""``nats-bridge setup``: create what the configuration needs and is missing; change nothing that exists.

It reads every origin stream (the aggregate must capture the copies of sources without a ``subject_prefix`` on
their origin subjects), then, each on its own connection: the aggregate stream, the coordination bucket (with
``[coordination] enabled``) and every source's consumer. What is missing is created (managed consumers only: a
bound one is the operator's), what exists is compared with what the bridge needs and never changed, so a running
bridge, or a second ``setup`` at the same moment, is never disturbed. Every create is a create, never an update:
one that loses a race to a concurrent creator meets the other's object, which is then compared like any other.

One line per object (``created``, ``would create`` with ``--dry-run``, ``exists ...: ok``, one ``differs`` line
per difference with its fix, ``missing`` for a bound consumer nobody created, ``FAIL`` when a server, stream or
permission is in the way). Exit code 0: everything is (now, or would be) in place; 1: something differs or could
not be done. The aggregate's duplicate window is :func:`duplicate_window`: max(2 minutes, 4 x target.ack_timeout).
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from nats.aio.client import Client as NATS

from bridge.commands.common import EXIT_OK, EXIT_PROBLEM, TIMEOUT, bucket_side, copies_in
from bridge.config import BridgeConfig, SourceConfig, TargetConfig, exposed_secrets
from bridge.config.loading import load_file
from bridge.config.templates import prefix_pattern
from bridge.core.modes import Mode, ModeUnsupported, mode_key
from bridge.core.subjects import pattern_covers
from bridge.core.transforms import SubjectTransforms
from bridge.errors import ApiError, BridgeError
from bridge.io.aggregate import SHORT_WINDOW_ACK_TIMEOUTS, duplicate_window_short
from bridge.io.connect import close_connection, open_connection
from bridge.io.consumer import bound_missing_fix, desired_for, several_filters_problem, source_mode, unfit_for
from bridge.io.jsapi import (
    CONSUMER_EXISTS,
    STREAM_NAME_IN_USE,
    STREAM_NOT_FOUND,
    JsApi,
    server_level,
)
from bridge.io.kv import HISTORY, KvBucket
from bridge.io.start import CopiesExist, creation_fields

MIN_DUPLICATE_WINDOW = 120.0  # seconds: the server's own default
DUPLICATE_WINDOW_ACK_TIMEOUTS = 4  # the window created: this many ack timeouts, at least MIN_DUPLICATE_WINDOW
INVALID_JSON = 10025  # how a server older than 2.14 answers ack_policy "flow_control" (docs/protocol.md 1)
# the first word of each line
CREATED = "created"
WOULD_CREATE = "would create"
EXISTS = "exists"
DIFFERS = "differs"
MISSING = "missing"
FAIL = "FAIL"
PROBLEMS = frozenset({DIFFERS, MISSING, FAIL})
NS = 1_000_000_000
FAST_BATCH_SERVER = (2, 14)  # fast batch publishing (allow_batched) came with nats-server 2.14


# --- what the bridge needs (pure) ------------------------------------------------------------------------


def duplicate_window(ack_timeout: float) -> float:
    """The duplicate window setup creates the aggregate with, in seconds: max(2 minutes, 4 x ack_timeout).

    The daemon warns below 2 x ack_timeout (a publish retried after an ack timeout may then be stored twice); four
    leave room for a retry of a retry, and two minutes is the server's own default."""
    return max(MIN_DUPLICATE_WINDOW, DUPLICATE_WINDOW_ACK_TIMEOUTS * ack_timeout)


def go_duration(seconds: float) -> str:
    """A duration as nats-server and the ``nats`` CLI print one: ``2m0s``, ``1h0m0s``, ``20s``, ``2.5s``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.9g}s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes:
        return f"{int(minutes)}m{text}"
    return text


# the aggregate's need for every source a [source_defaults] subject_prefix with placeholders names, registered or not
DEFAULTS_NEED = "source_defaults.subject_prefix"


def minimal_subjects(patterns: Iterable[str]) -> list[str]:
    """The patterns without duplicates and without those another one covers (the server refuses overlaps)."""
    unique = sorted(set(patterns))
    return [p for p in unique if not any(q != p and pattern_covers(q, p) for q in unique)]


def copy_subjects(source: SourceConfig, origin_subjects: Sequence[str] | None) -> list[str] | None:
    """The subjects this source's copies are published on: ``<prefix>.>``, else where its ``subject_transforms``
    put them, else the origin's own subjects (its ``filter_subjects`` when set); None when they are unknown (the
    origin could not be read)."""
    if source.subject_prefix:
        return [f"{source.subject_prefix}.>"]
    if source.subject_transforms:
        return SubjectTransforms(source.transform_pairs).copies()
    if source.filter_subjects:
        return list(source.filter_subjects)
    if not origin_subjects:
        return None
    return list(origin_subjects)


def fast_batches(nc: NATS) -> bool:
    """The connected server takes fast batch publishing (``allow_batched``: nats-server 2.14+)."""
    version = nc.connected_server_version
    return bool((version.major, version.minor) >= FAST_BATCH_SERVER)


def aggregate_config(
    target: TargetConfig, subjects: Sequence[str], replicas: int, batched: bool = True
) -> dict[str, Any]:
    """The aggregate stream setup creates: the copies' subjects, Limits, discard old, file, ``allow_direct`` (restart
    recovery reads copies back with batched Direct Get), a duplicate window that fits ``target.ack_timeout``, and
    with ``batched`` (the server takes it) ``allow_batched``: the bridge then publishes its windows as fast batches,
    which keep origin order while the stream's leader moves."""
    config: dict[str, Any] = {
        "name": target.stream,
        "description": "nats-bridge aggregate (created by nats-bridge setup)",
        "subjects": minimal_subjects(subjects),
        "retention": "limits",
        "discard": "old",
        "storage": "file",
        "num_replicas": replicas,
        "allow_direct": True,
        "duplicate_window": int(duplicate_window(target.ack_timeout) * NS),
    }
    if batched:
        config["allow_batched"] = True
    return config


def setup_command(config_path: str) -> str:
    """The command that creates what ``config_path`` needs, ready to paste (the path quoted for a shell)."""
    return f"nats-bridge setup -c {shlex.quote(config_path)}"


def origin_missing(src: SourceConfig) -> str:
    """Why an origin stream that does not exist stops a source, and what to do: setup never creates one."""
    return (
        f"origin stream {src.stream!r} does not exist; it is your applications' own stream, which nats-bridge setup "
        f"does not create: create it on the origin, or correct sources[{src.name}].stream or .domain"
    )


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


def describe_aggregate(cfg: Mapping[str, Any]) -> str:
    """``subjects edge.>, allow_direct, duplicate window 2m0s, file, 1 replica``."""
    window = go_duration(int(cfg.get("duplicate_window", 0)) / NS)
    return (
        f"subjects {', '.join(cfg.get('subjects') or [])}, "
        f"{'allow_direct' if cfg.get('allow_direct') else 'no allow_direct'}, "
        f"{'allow_batched' if cfg.get('allow_batched') else 'no allow_batched'}, duplicate window {window}, "
        f"{cfg.get('storage')}, {_replicas(int(cfg.get('num_replicas', 1)))}"
    )


def aggregate_differences(
    cfg: Mapping[str, Any], target: TargetConfig, needs: Mapping[str, Sequence[str] | None], batched: bool = False
) -> list[str]:
    """What in an existing aggregate's configuration differs from what the bridge needs, one text per difference
    (what it is; why it matters: the fix). ``needs`` maps each source to its copies' subjects (None: unknown);
    ``batched``: the server takes fast batches, so a stream without ``allow_batched`` is reported."""
    out: list[str] = []
    subjects = list(cfg.get("subjects") or [])
    if cfg.get("mirror"):
        out.append("it is a mirror, which refuses publishes: the aggregate must be a stream with subjects of its own")
    for name, patterns in needs.items():
        if patterns is None:
            continue
        missing = [p for p in patterns if not any(pattern_covers(s, p) for s in subjects)]
        if missing:
            whose = (
                "the copies of the sources taking source_defaults.subject_prefix (those registered later too)"
                if name == DEFAULTS_NEED
                else f"source {name}'s copies"
            )
            out.append(
                f"subjects [{', '.join(subjects)}] do not capture {whose} ({', '.join(missing)}); "
                f"its publishes would be refused: add {', '.join(missing)} to the stream's subjects"
            )
    if not cfg.get("allow_direct"):
        out.append(
            "allow_direct is false; the bridge reads copies back with Direct Get (restart recovery, the audit): "
            "set allow_direct = true"
        )
    if batched and not cfg.get("allow_batched") and not cfg.get("mirror"):
        out.append(
            "allow_batched is false; while the stream's leader moves (a hub node restarted or upgraded) a copy "
            "refused in the move can be stored after copies pipelined behind it, out of origin order: set "
            "allow_batched = true (nats stream edit; the bridge then publishes windows as fast batches)"
        )
    window = int(cfg.get("duplicate_window", 0)) / NS
    if duplicate_window_short(window, target.ack_timeout):
        want = go_duration(duplicate_window(target.ack_timeout))
        out.append(
            f"duplicate window {go_duration(window)} is shorter than {SHORT_WINDOW_ACK_TIMEOUTS} x target.ack_timeout "
            f"({go_duration(SHORT_WINDOW_ACK_TIMEOUTS * target.ack_timeout)}); a publish retried after an ack "
            f"timeout may be stored twice: set duplicate_window = {want}"
        )
    retention = cfg.get("retention", "limits")
    if retention != "limits":
        out.append(
            f"retention is {retention}; copies deleted by it cannot be read back by restart recovery, which then "
            "replicates them again: use retention limits"
        )
    if cfg.get("discard") == "new" and (int(cfg.get("max_msgs", -1)) > 0 or int(cfg.get("max_bytes", -1)) > 0):
        out.append(
            "discard is new with max_msgs/max_bytes limits; once full, the aggregate refuses every copy and every "
            "source blocks: set discard = old"
        )
    if cfg.get("storage") == "memory":
        out.append("storage is memory; a server restart loses the copies restart recovery reads back: use file storage")
    if cfg.get("no_ack"):
        out.append("no_ack is true; the bridge stores nothing without a publish ack: set no_ack = false")
    if cfg.get("sealed"):
        out.append("the stream is sealed and refuses publishes: the aggregate needs an unsealed stream")
    return out


def consumer_differences(info: Mapping[str, Any], source: SourceConfig, mode: Mode = Mode.FLOW_CONTROL) -> list[str]:
    """Why an existing consumer cannot serve the source in ``mode`` (:func:`bridge.io.consumer.unfit_for`), and for
    a managed one what the daemon's own update would be refused for."""
    reasons = unfit_for(mode, dict(info), source)
    if source.manage_consumer:
        policy = info.get("config", {}).get("deliver_policy")
        if policy not in (None, "all"):
            reasons.append(
                f"deliver_policy is {policy!r}, the bridge's is 'all', and it cannot be updated: an operator must "
                "delete the consumer (on a WorkQueue or Interest origin only once nothing is pending), or set "
                "manage_consumer = false to bind it as it is"
            )
    return reasons


def bucket_differences(cfg: Mapping[str, Any], lease_ttl: float) -> list[str]:
    """What in an existing coordination bucket differs from what the bridge creates."""
    out: list[str] = []
    max_age = int(cfg.get("max_age", 0)) / NS
    if max_age <= 0:
        out.append(
            "it has no TTL (max_age); leases in it would never expire: delete it or name another coordination.bucket"
        )
    elif abs(max_age - lease_ttl) >= 1e-3:
        out.append(
            f"max_age is {go_duration(max_age)}, coordination.lease_ttl {go_duration(lease_ttl)}; the bucket's wins "
            f"(a crashed owner's sources move after {go_duration(max_age)}): set coordination.lease_ttl = "
            f"{max_age:g}, or delete the bucket while no bridge runs"
        )
    history = int(cfg.get("max_msgs_per_subject", 0))
    if history != HISTORY:
        out.append(
            f"history (max_msgs_per_subject) is {history}, the bridge's is {HISTORY}; older lease revisions are "
            "kept for nothing: delete the bucket while no bridge runs, or leave it"
        )
    if not cfg.get("allow_direct"):
        out.append("allow_direct is false; the bridge reads the leases with Direct Get: set allow_direct = true")
    return out


# --- reporting --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One printed verdict: ``<status> <what>: <detail>`` (``created``/``would create``: ``<what> (<detail>)``)."""

    status: str
    what: str
    detail: str = ""

    def text(self) -> str:
        if not self.detail:
            body = self.what
        elif self.status in (CREATED, WOULD_CREATE):
            body = f"{self.what} ({self.detail})"
        else:
            body = f"{self.what}: {self.detail}"
        return f"{self.status:<8} {body}"

    @property
    def problem(self) -> bool:
        return self.status in PROBLEMS


def exit_code(lines: Iterable[Line]) -> int:
    """0 when nothing differs or failed (created, would create and ok lines only), else 1."""
    return EXIT_PROBLEM if any(line.problem for line in lines) else EXIT_OK


def transforms_text(src: SourceConfig) -> str:
    """``src -> dest, src (kept)``: a source's subject transforms as ``setup`` and ``check`` print them."""
    return ", ".join(f"{t.src} -> {t.dest}" if t.dest else f"{t.src} (kept)" for t in src.subject_transforms)


def _consumer_detail(src: SourceConfig, mode: Mode) -> str:
    filters = f", filter {', '.join(src.consumer_filters)}" if src.consumer_filters else ""
    if mode is Mode.PULL:
        kind = f"pull, ack_policy explicit, ack_wait {go_duration(src.ack_wait)}"
    else:
        kind = f"ack_policy flow_control, deliver {src.deliver_subject}"
    start = "deliver_policy all" if src.start_position == "all" else f"start {src.start_position}"
    transforms = f"; copies by subject transforms {transforms_text(src)}" if src.subject_transforms else ""
    return f"{kind}, max_ack_pending {src.max_ack_pending}, {start}{filters}{transforms}"


# --- the servers ------------------------------------------------------------------------------------------


@dataclass
class SourceResult:
    """What setting up one source found: its lines and the subjects of its copies (None: unknown)."""

    lines: list[Line] = field(default_factory=list)
    subjects: list[str] | None = None


async def _setup_source(src: SourceConfig, dry_run: bool, copies: CopiesExist) -> SourceResult:
    result = SourceResult()
    what = f"source {src.name}"
    cwhat = f"consumer {src.stream}/{src.consumer} on {src.name}"
    if src.subject_prefix or src.subject_transforms or src.filter_subjects:
        result.subjects = copy_subjects(src, None)
    try:
        nc = await open_connection(src, name=f"nats-bridge setup {src.name}", error_type=BridgeError)
    except BridgeError as exc:
        result.lines.append(Line(FAIL, what, str(exc)))
        return result
    api = JsApi(nc, src.api_prefix)
    try:
        try:
            stream = await api.stream_info(src.stream, timeout=TIMEOUT)
        except ApiError as exc:
            missing = exc.err_code == STREAM_NOT_FOUND
            problem = origin_missing(src) if missing else f"origin stream {src.stream!r}: {exc.description}"
            result.lines.append(Line(FAIL, what, problem))
            return result
        origin_subjects = list(stream.get("config", {}).get("subjects") or [])
        result.subjects = copy_subjects(src, origin_subjects)
        if result.subjects is None:
            result.lines.append(
                Line(
                    FAIL,
                    what,
                    f"origin stream {src.stream!r} has no subjects of its own (a mirror or a sourced stream), so the "
                    "subjects of its copies are unknown: give the source a subject_prefix",
                )
            )
        too_many = several_filters_problem(src, server_level(stream)[0])
        if too_many is not None:
            result.lines.append(Line(FAIL, cwhat, too_many))
            return result
        existing = await api.find_consumer(src.stream, src.consumer, timeout=TIMEOUT)
        try:
            choice = source_mode(src, stream, existing)
        except ModeUnsupported as exc:
            result.lines.append(Line(FAIL, cwhat, f"{mode_key(src.name)}: {exc}"))
            return result
        result.lines += await _setup_consumer(api, src, cwhat, dry_run, choice.mode, existing, copies)
    except BridgeError as exc:
        result.lines.append(Line(FAIL, cwhat, str(exc)))
    finally:
        await close_connection(nc)
    return result


def _consumer_lines(info: Mapping[str, Any], src: SourceConfig, cwhat: str, mode: Mode) -> list[Line]:
    reasons = consumer_differences(info, src, mode)
    if reasons:
        return [Line(DIFFERS, cwhat, reason) for reason in reasons]
    return [Line(EXISTS, cwhat, "ok")]


async def _setup_consumer(
    api: JsApi,
    src: SourceConfig,
    cwhat: str,
    dry_run: bool,
    mode: Mode,
    info: Mapping[str, Any] | None,
    copies: CopiesExist,
) -> list[Line]:
    if info is not None:
        return _consumer_lines(info, src, cwhat, mode)
    if not src.manage_consumer:
        return [
            Line(
                MISSING,
                cwhat,
                f"manage_consumer = false, so the operator creates it: {bound_missing_fix(mode, src)}, "
                "no inactive_threshold (or set manage_consumer = true and run setup again)",
            )
        ]
    if dry_run:
        return [Line(WOULD_CREATE, cwhat, _consumer_detail(src, mode))]
    deliver, decision = None, ""
    if src.start_position != "all":  # applied now, as the daemon's bind would (bridge.io.start)
        deliver, decision = await creation_fields(api, src, mode, TIMEOUT, copies)
    try:
        await api.add_consumer(src.stream, desired_for(mode, src, deliver), timeout=TIMEOUT)
    except ApiError as exc:
        if exc.err_code == CONSUMER_EXISTS:  # a twin created it in the meantime, with another configuration
            raced = await api.find_consumer(src.stream, src.consumer, timeout=TIMEOUT)
            if raced is not None:
                return _consumer_lines(raced, src, cwhat, mode)
        if exc.err_code == INVALID_JSON and mode is Mode.FLOW_CONTROL:
            return [
                Line(
                    FAIL,
                    cwhat,
                    f"the origin refused ack_policy flow_control ({exc.description}): it needs nats-server 2.14.0 or "
                    'newer; set mode = "pull" (or "auto") for this source',
                )
            ]
        return [Line(FAIL, cwhat, f"cannot create it: {exc.description} (err_code {exc.err_code})")]
    return [Line(CREATED, cwhat, _consumer_detail(src, mode) + (f"; start {decision}" if decision else ""))]


async def _setup_aggregate(
    config: BridgeConfig, needs: Mapping[str, Sequence[str] | None], replicas: int, dry_run: bool
) -> list[Line]:
    target = config.target
    what = f"aggregate stream {target.stream}"
    try:
        nc = await open_connection(target, name="nats-bridge setup", error_type=BridgeError)
    except BridgeError as exc:
        return [Line(FAIL, "target", str(exc))]
    api = JsApi(nc, target.api_prefix)
    try:
        info = await _lookup_stream(api, target.stream)
        if info is None:
            if not needs:
                return [
                    Line(
                        FAIL,
                        what,
                        "not created: no source's copies to capture (no [[sources]], none registered): register "
                        "sources first (nats-bridge sources add), or give [source_defaults] a subject_prefix with "
                        "{name} or {domain} (it captures every site to come)",
                    )
                ]
            unknown = [name for name, subjects in needs.items() if subjects is None]
            if unknown:
                return [
                    Line(
                        FAIL,
                        what,
                        f"not created: the subjects of the copies of {', '.join(unknown)} are unknown (see the "
                        "source's line); run setup again once they can be read, or give each a subject_prefix",
                    )
                ]
            batched = fast_batches(nc)
            wanted = [s for subjects in needs.values() for s in subjects or []]
            desired = aggregate_config(target, wanted, replicas, batched)
            if dry_run:
                return [Line(WOULD_CREATE, what, describe_aggregate(desired))]
            try:
                info = await api.create_stream(desired, timeout=TIMEOUT)
            except ApiError as exc:
                if exc.err_code != STREAM_NAME_IN_USE:
                    return [Line(FAIL, what, f"cannot create it: {exc.description} (err_code {exc.err_code})")]
                info = await _lookup_stream(api, target.stream)  # a twin created it meanwhile: compare theirs
                if info is None:
                    return [Line(FAIL, what, f"cannot create it: {exc.description}")]
            else:
                return [Line(CREATED, what, describe_aggregate(info.get("config", desired)))]
    except BridgeError as exc:
        return [Line(FAIL, what, str(exc))]
    finally:
        await close_connection(nc)
    differences = aggregate_differences(info.get("config", {}), target, needs, fast_batches(nc))
    if differences:
        return [Line(DIFFERS, what, text) for text in differences]
    unchecked = [name for name, subjects in needs.items() if subjects is None]
    note = f" (not checked for the copies of {', '.join(unchecked)}: see the source's line)" if unchecked else ""
    return [Line(EXISTS, what, "ok" + note)]


async def _lookup_stream(api: JsApi, stream: str) -> dict[str, Any] | None:
    try:
        return await api.stream_info(stream, timeout=TIMEOUT)
    except ApiError as exc:
        if exc.err_code == STREAM_NOT_FOUND:
            return None
        raise


async def _setup_bucket(config: BridgeConfig, dry_run: bool) -> list[Line]:
    coordination = config.coordination
    what = f"coordination bucket {coordination.bucket}"
    side = bucket_side(config)
    try:
        nc = await open_connection(side, name="nats-bridge setup", error_type=BridgeError)
    except BridgeError as exc:
        return [Line(FAIL, what, str(exc))]
    kv = KvBucket(nc, JsApi(nc, side.api_prefix), coordination.bucket)
    detail = (
        f"stream {kv.stream}, lease ttl {go_duration(coordination.lease_ttl)}, history {HISTORY}, "
        f"{_replicas(coordination.replicas)}"
    )
    try:
        info = await kv.lookup(TIMEOUT)
        if info is None:
            if dry_run:
                return [Line(WOULD_CREATE, what, detail)]
            info, created = await kv.create(coordination.lease_ttl, coordination.replicas, TIMEOUT)
            if created:
                return [Line(CREATED, what, detail)]
    except BridgeError as exc:
        return [Line(FAIL, what, str(exc))]
    finally:
        await close_connection(nc)
    differences = bucket_differences(info.get("config", {}), coordination.lease_ttl)
    if differences:
        return [Line(DIFFERS, what, text) for text in differences]
    return [Line(EXISTS, what, "ok")]


async def run_setup(config: BridgeConfig, *, dry_run: bool = False, replicas: int = 1) -> list[Line]:
    """Set up (or, with ``dry_run``, only look at) everything ``config`` needs; print and return one line per
    object, the aggregate first, then the bucket, then each source's consumer."""
    results: dict[str, SourceResult] = {}

    async def source(src: SourceConfig) -> None:
        results[src.name] = await _setup_source(src, dry_run, copies_in(config.target, src))

    async with anyio.create_task_group() as tg:
        for src in config.sources:
            tg.start_soon(source, src)
    needs = {src.name: results[src.name].subjects for src in config.sources}
    pattern = prefix_pattern(config.source_defaults)
    if pattern is not None:  # sites registered later publish there too: capture them all at once
        needs[DEFAULTS_NEED] = [pattern]

    found: dict[str, list[Line]] = {}

    async def aggregate() -> None:
        found["aggregate"] = await _setup_aggregate(config, needs, replicas, dry_run)

    async def bucket() -> None:
        found["bucket"] = await _setup_bucket(config, dry_run)

    async with anyio.create_task_group() as tg:
        tg.start_soon(aggregate)
        if config.coordination.enabled:
            tg.start_soon(bucket)
    lines = [*found["aggregate"], *found.get("bucket", [])]
    for src in config.sources:
        lines += results[src.name].lines
    for line in lines:
        print(line.text(), flush=True)
    return lines


def setup(path: str, dry_run: bool = False, replicas: int = 1) -> int:
    """``nats-bridge setup -c PATH [--dry-run] [--replicas N]``: the file's sources and the registry's."""
    from bridge.commands.sources import registry_merged

    data, config = load_file(path)
    for warning in exposed_secrets(path, config):
        print(f"WARN secrets: {warning}", flush=True)
    merged, problem = anyio.run(registry_merged, data, config, path)
    if problem:
        print(f"WARN source registry: not read ({problem}): the file's sources only", flush=True)
    config = merged.config
    lines = anyio.run(functools.partial(run_setup, config, dry_run=dry_run, replicas=replicas))
    code = exit_code(lines)
    if code == EXIT_OK:
        print("dry run: nothing changed" if dry_run else "everything the bridge needs is in place", flush=True)
    else:
        print(
            "some objects differ or could not be set up" + (" (dry run: nothing changed)" if dry_run else ""),
            flush=True,
        )
    return code


__all__ = [
    "Line",
    "aggregate_config",
    "aggregate_differences",
    "bucket_differences",
    "consumer_differences",
    "copy_subjects",
    "duplicate_window",
    "exit_code",
    "go_duration",
    "minimal_subjects",
    "origin_missing",
    "run_setup",
    "setup",
    "setup_command",
]
