"""``nats-bridge run``: replicate every configured source until SIGTERM/SIGINT."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio

from bridge import logs
from bridge.commands.common import EXIT_OK
from bridge.config import exposed_secrets, load_config


def run(path: str) -> int:
    """``nats-bridge run -c PATH``: load, log exposed secrets as warnings, run until stopped and drained."""
    from bridge.runtime.app import Bridge

    config = load_config(path)
    logs.configure(config.log.level, config.log.format)
    for warning in exposed_secrets(path, config):
        logs.get_logger(component="config").warning("config.secret_exposed", problem=warning)
    anyio.run(Bridge(config, config_path=Path(path)).run)
    # drained and answered: a repeated SIGTERM during interpreter exit must not turn exit 0 into "killed"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return EXIT_OK
