"""``nats-bridge health``: ask the running daemon whether it is alive (``/healthz``) or ready (``/readyz``), at the
address its configuration gives.

The container image's ``HEALTHCHECK`` runs it, so the check follows ``http.listen`` (and its
``NATS_BRIDGE_HTTP__LISTEN`` override) instead of a port written into the image. One line either way; exit 0 when
the daemon answered 200, 1 when it answered otherwise or not at all, 2 for an invalid configuration.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from bridge.commands.common import EXIT_OK, EXIT_PROBLEM
from bridge.config.loading import load_file
from bridge.observe.http import local_url

TIMEOUT = 4.0  # below the image's HEALTHCHECK --timeout (5 s), so the command says why rather than being killed


def health(path: str, ready: bool) -> int:
    """``nats-bridge health -c PATH [--ready]``: 0 when the daemon's ``/healthz`` (``/readyz`` with ``ready``)
    answers 200, else 1, with one line saying what answered."""
    _, config = load_file(path)
    url, why_not = local_url(config.http.listen, "/readyz" if ready else "/healthz")
    if url is None:
        print(f"nats-bridge health: cannot ask the daemon: {why_not}")
        return EXIT_PROBLEM
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as reply:
            status = reply.status
    except urllib.error.HTTPError as err:  # 503: not ready, or unhealthy
        status = err.code
    except OSError as exc:  # refused, timed out: no daemon listening there
        print(f"nats-bridge health: no answer from {url} ({exc})")
        return EXIT_PROBLEM
    print(f"nats-bridge health: {url} answered {status}")
    return EXIT_OK if status == 200 else EXIT_PROBLEM
