"""``nats-bridge status``: per source, the consumer state, the stored watermark, the lag and the owner.

It asks the servers themselves (consumer state on each origin, the stored watermark read back from the aggregate's
provenance headers exactly as restart recovery does, and with leases each source's owner from the coordination
bucket: instance, host, since) and, when the daemon's HTTP listener is reachable, adds what only the running daemon
knows (per source: the mode it replicates in and why, its last error). It works with the daemon down; it changes
nothing.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import anyio

from bridge.commands.common import EXIT_OK, EXIT_PROBLEM, TIMEOUT, bucket_side
from bridge.commands.sources import registry_merged
from bridge.config import BridgeConfig, SourceConfig
from bridge.config.loading import load_file
from bridge.config.registry import FILE
from bridge.config.validators import format_rate
from bridge.core.fleet import holder_in
from bridge.core.recovery import recover, recovery_depth
from bridge.errors import BridgeError
from bridge.io.aggregate import read_source_tail
from bridge.io.connect import close_connection, open_connection
from bridge.io.jsapi import JsApi
from bridge.io.kv import KvBucket, parse_view
from bridge.observe.http import local_url


def status(path: str, as_json: bool) -> int:
    """``nats-bridge status -c PATH [--json]``: collect and print, the registry's sources too; exit 1 when a source
    could not be read."""
    data, config = load_file(path)

    async def collect() -> dict[str, Any]:
        merged, registry_error = await registry_merged(data, config, path)
        out = await collect_status(merged.config, merged.origins)
        if registry_error:
            out["registry_error"] = registry_error
        if merged.refused:
            out["registry_refused"] = merged.refused
        return out

    return EXIT_OK if print_status(anyio.run(collect), as_json) else EXIT_PROBLEM


async def _source_state(src: SourceConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"stream": src.stream, "consumer": src.consumer}
    try:
        nc = await open_connection(src, name=f"nats-bridge status {src.name}", error_type=BridgeError)
    except BridgeError as exc:
        return {**out, "error": str(exc)}
    try:
        api = JsApi(nc, src.api_prefix)
        stream = await api.stream_info(src.stream, timeout=TIMEOUT)
        info = await api.consumer_info(src.stream, src.consumer, timeout=TIMEOUT)
    except BridgeError as exc:
        return {**out, "error": str(exc)}
    finally:
        await close_connection(nc)
    return {
        **out,
        "origin_last_seq": int(stream.get("state", {}).get("last_seq", 0)),
        "origin_messages": int(stream.get("state", {}).get("messages", 0)),
        "delivered": int(info.get("delivered", {}).get("stream_seq", 0)),
        "ack_floor": int(info.get("ack_floor", {}).get("stream_seq", 0)),
        "num_pending": int(info.get("num_pending", 0)),
        "num_ack_pending": int(info.get("num_ack_pending", 0)),
    }


async def _watermarks(config: BridgeConfig, floors: dict[str, int]) -> dict[str, int | str]:
    target = config.target
    out: dict[str, int | str] = {}
    try:
        nc = await open_connection(target, name="nats-bridge status", error_type=BridgeError)
    except BridgeError as exc:
        return {src.name: str(exc) for src in config.sources}
    try:
        api = JsApi(nc, target.api_prefix)
        for src in config.sources:
            floor = floors.get(src.name, 0)
            try:
                copies, complete = await read_source_tail(
                    nc,
                    api,
                    target.stream,
                    src.name,
                    src.copies_filter,
                    floor,
                    recovery_depth(target.publish_window),
                    TIMEOUT,
                )
                out[src.name] = recover(copies, floor, complete).watermark
            except BridgeError as exc:
                out[src.name] = str(exc)
    finally:
        await close_connection(nc)
    return out


async def collect_owners(config: BridgeConfig) -> dict[str, dict[str, Any]] | str:
    """Each source's lease holder as the coordination bucket has it, or why it could not be read."""
    coordination = config.coordination
    side = bucket_side(config)
    try:
        nc = await open_connection(side, name="nats-bridge status", error_type=BridgeError)
    except BridgeError as exc:
        return str(exc)
    try:
        view = parse_view(await KvBucket(nc, JsApi(nc, side.api_prefix), coordination.bucket).read_all(TIMEOUT))
    except BridgeError as exc:
        return f"coordination bucket {coordination.bucket!r}: {exc}"
    finally:
        await close_connection(nc)
    out: dict[str, dict[str, Any]] = {}
    for src in config.sources:
        holder = holder_in(view, src.name, coordination.lease_groups)
        out[src.name] = (
            {"instance": holder.instance, "host": holder.host, "pid": holder.pid, "since": _iso(holder.since)}
            if holder is not None
            else {"instance": None}
        )
    return out


def _iso(unix: float) -> str | None:
    import datetime

    if not unix:
        return None
    return datetime.datetime.fromtimestamp(unix, datetime.UTC).isoformat(timespec="seconds")


def daemon_view(listen: str) -> tuple[dict[str, Any] | None, str]:
    """The running daemon's /readyz body, or None and why not."""
    url, why_not = local_url(listen, "/readyz")  # listen was validated with the configuration
    if url is None:
        return None, why_not
    try:
        try:
            with urllib.request.urlopen(url, timeout=3) as reply:
                body = reply.read()
        except urllib.error.HTTPError as err:  # 503: not ready, still a full answer
            body = err.read()
        view = json.loads(body)
    except (OSError, ValueError) as exc:  # unreachable, or an answer that is not the daemon's JSON
        return None, f"daemon not reachable at {url} ({exc})"
    if not isinstance(view, dict):
        return None, f"daemon at {url} answered something other than its /readyz view"
    return view, url


# What status shows of the daemon's /readyz entry for a source (the rest is what status reads from the servers).
_DAEMON_KEYS = (
    "ready",
    "reasons",
    "mode",
    "mode_reason",
    "phase",
    "last_error",
    "stalled",
    "waiting_for_origin",
    "lag_seconds",
    "window",
    "batched",
)


def daemon_source_view(daemon: dict[str, Any] | None, source: str) -> dict[str, Any] | None:
    """The daemon's view of ``source`` as status shows it, from its /readyz body; None when it has none (not
    reached, or not running that source). A key an older daemon does not send is None."""
    live = (daemon or {}).get("sources", {}).get(source) or {}
    return {key: live.get(key) for key in _DAEMON_KEYS} if live else None


async def collect_status(config: BridgeConfig, origins: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every source's consumer state, stored watermark, lag, and the daemon's mode and last error (JSON-ready);
    ``origins``: where each source comes from (file or registry), shown as ``from``."""
    states: dict[str, dict[str, Any]] = {}

    async def one(src: SourceConfig) -> None:
        states[src.name] = await _source_state(src)

    async with anyio.create_task_group() as tg:
        for src in config.sources:
            tg.start_soon(one, src)
    floors = {name: int(s.get("ack_floor", 0)) for name, s in states.items()}
    marks = await _watermarks(config, floors)
    owners = await collect_owners(config) if config.coordination.enabled else None
    daemon, daemon_note = await anyio.to_thread.run_sync(daemon_view, config.http.listen)
    sources = []
    for src in config.sources:
        state = dict(states[src.name])
        mark = marks.get(src.name)
        if isinstance(mark, int):
            state["stored_watermark"] = mark
            if "origin_last_seq" in state:
                state["lag"] = max(0, int(state["origin_last_seq"]) - mark)
        elif mark is not None:
            state.setdefault("error", f"aggregate: {mark}")
        state["rate_limit"] = src.rate_limit
        if src.start_position != "all":
            state["start"] = src.start_position
        if src.subject_transforms:
            state["subject_transforms"] = [{"src": t.src, "dest": t.dest} for t in src.subject_transforms]
        state["daemon"] = daemon_source_view(daemon, src.name)
        if isinstance(owners, dict):
            state["owner"] = owners.get(src.name)
        sources.append({"source": src.name, "from": (origins or {}).get(src.name, FILE), **state})
    out: dict[str, Any] = {"target_stream": config.target.stream, "daemon": daemon_note, "sources": sources}
    if isinstance(owners, str):
        out["coordination_error"] = owners
    return out


def print_status(status: dict[str, Any], as_json: bool) -> bool:
    """Print; True when every source could be read."""
    ok = all("error" not in s for s in status["sources"]) and not status.get("registry_refused")
    if as_json:
        print(json.dumps(status, indent=2))
        return ok
    columns: tuple[str, ...] = (
        "source",
        "from",
        "mode",
        "delivered",
        "ack_floor",
        "num_pending",
        "stored_watermark",
        "lag",
        "lag_s",
    )
    if any(s.get("rate_limit") for s in status["sources"]):
        columns += ("rate_limit",)
    with_owner = any("owner" in s for s in status["sources"])
    if with_owner:
        columns += ("owner", "host", "since")
    rows = [[str(_cell(s, c)) for c in columns] for s in status["sources"]]
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    if not rows:
        print("no sources: none in the configuration file, none registered (nats-bridge sources add)")
    print(f"aggregate stream {status['target_stream']}; daemon: {status['daemon']}")
    if "coordination_error" in status:
        print(f"owners unknown: {status['coordination_error']}")
    if "registry_error" in status:
        print(f"registry not read: {status['registry_error']} (the configuration file's sources only)")
    for name, problems in status.get("registry_refused", {}).items():
        print(f"{name}: refused from the registry: {'; '.join(problems)}")
    for s in status["sources"]:
        if "error" in s:
            print(f"{s['source']}: error: {s['error']}")
        daemon = s.get("daemon")
        if daemon and daemon.get("last_error"):
            print(f"{s['source']}: last error in the daemon: {daemon['last_error']}")
        if daemon and daemon.get("reasons"):
            print(f"{s['source']}: not ready: {', '.join(daemon['reasons'])}")
    return ok


def _cell(state: dict[str, Any], column: str) -> object:
    owner = state.get("owner") or {}
    if column == "mode":  # the running daemon's choice: a standby, or a daemon not reached, has none to show
        return (state.get("daemon") or {}).get("mode") or "-"
    if column == "rate_limit":
        return format_rate(int(state.get("rate_limit") or 0))
    if column == "lag_s":  # the daemon's: the age of the oldest message it has not stored yet
        lag = (state.get("daemon") or {}).get("lag_seconds")
        return "-" if lag is None else lag
    if column == "owner":
        return owner.get("instance") or ("none (no process owns it now)" if "owner" in state else "-")
    if column == "host":
        return owner.get("host") or "-"
    if column == "since":
        return owner.get("since") or "-"
    return state.get(column, "-")
