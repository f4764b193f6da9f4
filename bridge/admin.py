"""Operator commands: ``nats-bridge status`` and ``nats-bridge reset``.

``status`` asks the servers themselves (consumer state on each origin, the stored watermark read back from the
aggregate's provenance headers exactly as restart recovery does, and with leases each source's owner from the
coordination bucket: instance, host, since) and, when the daemon's HTTP listener is reachable, adds what only the
running daemon knows (its last error per source). It works with the daemon down; it changes nothing.

``reset`` is an operator's ``CONSUMER.RESET`` of one source's consumer, after a confirmation: a forward reset
means the skipped messages are never replicated (a WorkQueue origin keeps them orphaned, an Interest origin
deletes them); a running bridge adopts it as a skip, a backward one duplicates nothing.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import anyio

from bridge.core.recovery import recover, recovery_depth
from bridge.errors import BridgeError
from bridge.io.aggregate import read_source_tail
from bridge.io.connect import open_connection
from bridge.io.jsapi import JsApi
from bridge.io.kv import KvBucket, parse_view
from bridge.observe.http import parse_listen

TIMEOUT = 5.0


async def _source_state(src: Any) -> dict[str, Any]:
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
        await nc.close()
    return {
        **out,
        "origin_last_seq": int(stream.get("state", {}).get("last_seq", 0)),
        "origin_messages": int(stream.get("state", {}).get("messages", 0)),
        "delivered": int(info.get("delivered", {}).get("stream_seq", 0)),
        "ack_floor": int(info.get("ack_floor", {}).get("stream_seq", 0)),
        "num_pending": int(info.get("num_pending", 0)),
        "num_ack_pending": int(info.get("num_ack_pending", 0)),
    }


async def _watermarks(config: Any, floors: dict[str, int]) -> dict[str, int | str]:
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
            subject = f"{src.subject_prefix}.>" if src.subject_prefix else ">"
            try:
                copies, complete = await read_source_tail(
                    nc, api, target.stream, src.name, subject, floor, recovery_depth(target.publish_window), TIMEOUT
                )
                out[src.name] = recover(copies, floor, complete).watermark
            except BridgeError as exc:
                out[src.name] = str(exc)
    finally:
        await nc.close()
    return out


async def _owners(config: Any) -> dict[str, dict[str, Any]] | str:
    """Each source's lease holder as the coordination bucket has it, or why it could not be read."""
    coordination = config.coordination
    side = coordination if coordination.servers is not None else config.target
    prefix = coordination.api_prefix if coordination.servers is not None else config.target.api_prefix
    try:
        nc = await open_connection(side, name="nats-bridge status", error_type=BridgeError)
    except BridgeError as exc:
        return str(exc)
    try:
        view = parse_view(await KvBucket(nc, JsApi(nc, prefix), coordination.bucket).read_all(TIMEOUT))
    except BridgeError as exc:
        return f"coordination bucket {coordination.bucket!r}: {exc}"
    finally:
        await nc.close()
    out: dict[str, dict[str, Any]] = {}
    for src in config.sources:
        holder = view.holders.get(src.name)
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


def _daemon_view(listen: str) -> tuple[dict[str, Any] | None, str]:
    """The running daemon's /readyz body, or None and why not."""
    if not listen:
        return None, "http listener disabled in the configuration"
    host, port = parse_listen(listen)  # validated with the configuration
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if port == 0:
        return None, "http listener on a random port"
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return json.loads(reply.read()), url
    except urllib.error.HTTPError as err:  # 503: not ready, still a full answer
        return json.loads(err.read()), url
    except (OSError, ValueError) as exc:
        return None, f"daemon not reachable at {url} ({exc})"


async def collect_status(config: Any) -> dict[str, Any]:
    """Every source's consumer state, stored watermark, lag, and the daemon's last error (JSON-ready)."""
    states: dict[str, dict[str, Any]] = {}

    async def one(src: Any) -> None:
        states[src.name] = await _source_state(src)

    async with anyio.create_task_group() as tg:
        for src in config.sources:
            tg.start_soon(one, src)
    floors = {name: int(s.get("ack_floor", 0)) for name, s in states.items()}
    marks = await _watermarks(config, floors)
    owners = await _owners(config) if config.coordination.enabled else None
    daemon, daemon_note = await anyio.to_thread.run_sync(_daemon_view, config.http.listen)
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
        live = (daemon or {}).get("sources", {}).get(src.name) or {}
        state["daemon"] = (
            {k: live.get(k) for k in ("ready", "reasons", "phase", "last_error", "stalled")} if live else None
        )
        if isinstance(owners, dict):
            state["owner"] = owners.get(src.name)
        sources.append({"source": src.name, **state})
    out: dict[str, Any] = {"target_stream": config.target.stream, "daemon": daemon_note, "sources": sources}
    if isinstance(owners, str):
        out["coordination_error"] = owners
    return out


def print_status(status: dict[str, Any], as_json: bool) -> bool:
    """Print; True when every source could be read."""
    ok = all("error" not in s for s in status["sources"])
    if as_json:
        print(json.dumps(status, indent=2))
        return ok
    columns: tuple[str, ...] = ("source", "delivered", "ack_floor", "num_pending", "stored_watermark", "lag")
    with_owner = any("owner" in s for s in status["sources"])
    if with_owner:
        columns += ("owner", "host", "since")
    rows = [[str(_cell(s, c)) for c in columns] for s in status["sources"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    print(f"aggregate stream {status['target_stream']}; daemon: {status['daemon']}")
    if "coordination_error" in status:
        print(f"owners unknown: {status['coordination_error']}")
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
    if column == "owner":
        return owner.get("instance") or ("none (no process owns it now)" if "owner" in state else "-")
    if column == "host":
        return owner.get("host") or "-"
    if column == "since":
        return owner.get("since") or "-"
    return state.get(column, "-")


def describe_reset(src: Any, info: dict[str, Any], seq: int | None, retention: str) -> str:
    """What the reset will do, in words, for the confirmation prompt."""
    floor = int(info.get("ack_floor", {}).get("stream_seq", 0))
    delivered = int(info.get("delivered", {}).get("stream_seq", 0))
    head = f"consumer {src.consumer} on stream {src.stream} ({retention}): ack floor {floor}, delivered {delivered}"
    if seq is None or seq == floor + 1:
        return f"{head}\nreset to the ack floor: delivery restarts at {floor + 1}; nothing is skipped or duplicated"
    if seq <= floor:
        return (
            f"{head}\nreset BACKWARD to {seq}: messages {seq}..{floor} still in the origin are delivered again; the "
            "bridge drops what it already replicated (no duplicates)"
        )
    fate = {
        "workqueue": "stay in the WorkQueue stream, orphaned below the consumer's floor",
        "interest": "are DELETED from the Interest stream unless another consumer wants them",
    }.get(retention, "stay in the stream")
    return f"{head}\nreset FORWARD to {seq}: messages {floor + 1}..{seq - 1} will NEVER be replicated; they {fate}"


async def reset_source(config: Any, name: str, seq: int | None, confirm: Callable[[str], bool]) -> tuple[bool, str]:
    """Reset one source's consumer after ``confirm(description)``; (done, message)."""
    src = next((s for s in config.sources if s.name == name), None)
    if src is None:
        names = ", ".join(s.name for s in config.sources)
        return False, f"no source named {name!r} in the configuration (sources: {names})"
    nc = await open_connection(src, name=f"nats-bridge reset {src.name}", error_type=BridgeError)
    try:
        api = JsApi(nc, src.api_prefix)
        stream = await api.stream_info(src.stream, timeout=TIMEOUT)
        info = await api.consumer_info(src.stream, src.consumer, timeout=TIMEOUT)
        retention = str(stream.get("config", {}).get("retention", "limits"))
        if not confirm(describe_reset(src, info, seq, retention)):
            return False, "not confirmed; nothing changed"
        body = {"seq": seq} if seq is not None else None
        reply = await api.request(f"CONSUMER.RESET.{src.stream}.{src.consumer}", body, TIMEOUT)
    finally:
        await nc.close()
    return True, f"reset {src.consumer}: next delivery at {reply.get('reset_seq')}"


def confirm_on_terminal(description: str) -> bool:
    """Print ``description`` and ask; refuses (False) when stdin is not a terminal."""
    print(description)
    if not sys.stdin.isatty():
        print("stdin is not a terminal: pass --yes to confirm", file=sys.stderr)
        return False
    try:
        answer = input("proceed? [y/N] ")
    except EOFError:  # Ctrl-D at the prompt: no answer is a no, not a traceback
        print()
        return False
    return answer.strip().lower() in ("y", "yes")
