"""The engines of ``bridge.core`` (``SourceEngine``, ``PullEngine``) driven by hand in unit tests: one origin stream
and consumer by name, and the settings an engine under test starts from.

The timings are small round numbers (5 s ack and silence timeouts, resets at least 2 s apart) so that a scenario
stepping the clock reads as arithmetic; a test that needs another value makes it with ``dataclasses.replace``, or
(the publish window, which the simulator in ``tests/unit/sim.py`` varies) with :func:`engine_settings`.
"""

from __future__ import annotations

import os

from bridge.core.backoff import Backoff
from bridge.core.replication import EngineSettings

__all__ = ["CONSUMER", "SETTINGS", "STREAM", "engine_settings", "examples"]

STREAM = "ORDERS"
CONSUMER = "BRIDGE"


def engine_settings(publish_window: int = 8) -> EngineSettings:
    """The settings an engine under test starts from, with ``publish_window`` publishes in flight at most."""
    return EngineSettings(
        source="edge1",
        stream=STREAM,
        consumer=CONSUMER,
        subject_prefix="agg",
        publish_window=publish_window,
        ack_timeout=5.0,
        silence_timeout=5.0,
        reconnect_silence=2.0,
        reset_min_interval=2.0,
        reset_backoff=Backoff(2.0, 30.0),
        publish_retry=Backoff(0.5, 15.0),
        stalled_after=60.0,
    )


SETTINGS = engine_settings()


def examples(count: int) -> int:
    """How many examples a property test of the core draws: ``count`` times ``NATS_BRIDGE_EXAMPLES_SCALE`` (default
    1), at least 10. CI runs the core's tests a second time on its pure-Python build, where the same code runs
    interpreted, several times slower: that run proves the build, the compiled one explores (a quarter there)."""
    scale = float(os.environ.get("NATS_BRIDGE_EXAMPLES_SCALE", "1"))
    return max(10, round(count * scale))
