"""``nats-bridge run``: replicate every configured source until SIGTERM/SIGINT.

Every exit after the configuration was read ends with one ``bridge.stopped`` line: the reason, the uptime, per
source the stored watermark and the messages replicated, and the exit code (0 after a drain, 2 when the HTTP
listener cannot bind its address or a source's setting is one its server does not support, 1 on anything
unexpected, whose traceback follows).
"""

from __future__ import annotations

import signal
from pathlib import Path

import anyio

from bridge import logs
from bridge.commands.common import EXIT_CONFIG, EXIT_OK, EXIT_PROBLEM
from bridge.config import exposed_secrets
from bridge.config.loading import load_file
from bridge.observe.http import ListenError


def run(path: str) -> int:
    """``nats-bridge run -c PATH``: load, log exposed secrets as warnings, run until stopped and drained."""
    from bridge.runtime.app import Bridge

    data, config = load_file(path)
    logs.configure(config.log.level, config.log.format)
    for warning in exposed_secrets(path, config):
        logs.get_logger(component="config").warning("config.secret_exposed", problem=warning)
    bridge = Bridge(config, config_path=Path(path), file_data=data)
    code, reason = EXIT_PROBLEM, ""
    try:
        anyio.run(bridge.run)
        code = EXIT_OK if bridge.config_error is None else EXIT_CONFIG
    except ListenError:  # logged (http.listen_failed, with the fix) where the listener was bound
        code = EXIT_CONFIG
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed: nothing was replicating yet
        code, reason = EXIT_OK, "interrupted"
    except BaseException as exc:
        reason = f"fatal error: {type(exc).__name__}: {exc}"[:300]
        raise  # the traceback follows the summary
    finally:
        bridge.log_stopped(code, reason or None)
    # drained and answered: a repeated SIGTERM during interpreter exit must not turn exit 0 into "killed"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code
