"""nats-bridge: replicate NATS JetStream streams from edge servers into an aggregate stream, losing nothing.

The package is layered like h11/wsproto: ``bridge.core`` holds pure state machines (no sockets, no clocks of
their own), ``bridge.io`` the thin nats-py adapters, ``bridge.runtime`` the anyio task structure that drives
one pipeline per source, ``bridge.commands`` the commands and ``bridge.cli`` the command line that dispatches to them.
"""

from bridge._build import CORE_BUILD

__version__ = "0.1.0"
__all__ = ["CORE_BUILD", "__version__"]
