"""``nats-bridge reset``: an operator's ``CONSUMER.RESET`` of one source's consumer, after a confirmation.

A forward reset means the skipped messages are never replicated (a WorkQueue origin keeps them orphaned, an Interest
origin deletes them); a running bridge adopts it as a skip, a backward one duplicates nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import anyio

from bridge.commands.common import EXIT_CONFIG, EXIT_OK, EXIT_PROBLEM, TIMEOUT
from bridge.config import BridgeConfig, SourceConfig, load_config
from bridge.errors import BridgeError
from bridge.io.connect import close_connection, open_connection
from bridge.io.jsapi import JsApi


def reset(path: str, source: str, seq: int | None, yes: bool) -> int:
    """``nats-bridge reset -c PATH SOURCE [--seq N] [--yes]``: exit 0 once reset, 1 when not done."""
    if seq is not None and seq < 1:
        print("nats-bridge reset: --seq must be >= 1", file=sys.stderr)
        return EXIT_CONFIG
    config = load_config(path)

    def confirm(description: str) -> bool:
        if yes:
            print(description)
            return True
        return confirm_on_terminal(description)

    try:
        done, message = anyio.run(reset_source, config, source, seq, confirm)
    except BridgeError as exc:
        print(f"nats-bridge reset: {exc}", file=sys.stderr)
        return EXIT_PROBLEM
    print(message, file=sys.stdout if done else sys.stderr)
    return EXIT_OK if done else EXIT_PROBLEM


def describe_reset(src: SourceConfig, info: dict[str, Any], seq: int | None, retention: str) -> str:
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


async def reset_source(
    config: BridgeConfig, name: str, seq: int | None, confirm: Callable[[str], bool]
) -> tuple[bool, str]:
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
        await close_connection(nc)
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
