"""Default values needed in more than one place (a model, a validator's message, the demo), written once here."""

from __future__ import annotations

import os
import re

DEFAULT_SERVER = "nats://127.0.0.1:4222"
DEFAULT_LISTEN = "127.0.0.1:9464"
DEFAULT_PUBLISH_WINDOW = 1024


def default_servers() -> list[str]:
    """``servers`` when none is given: a server on this host, at the default port."""
    return [DEFAULT_SERVER]


def default_consumer(source: str) -> str:
    """A source's durable consumer name when none is given."""
    return f"nats-bridge-{source}"


def default_deliver_subject(source: str) -> str:
    """A source's deliver subject when none is given."""
    return f"nats-bridge.deliver.{source}"


def default_instance_id() -> str:
    """``<host name>-<pid>``, with every character a KV key cannot hold replaced by ``-``."""
    import socket

    host = re.sub(r"[^A-Za-z0-9_=.-]", "-", socket.gethostname()).strip(".") or "host"
    return f"{host[:100]}-{os.getpid()}"
