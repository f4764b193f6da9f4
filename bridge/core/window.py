"""The arithmetic of a flow-control window over a link (docs/protocol.md, section 2.3; bench/RESULTS.md, WAN).

The origin delivers ``max_ack_pending`` messages, then asks (a flow-control request) and delivers nothing more until
the answer, which may name only what is stored. A window therefore costs one round trip plus the time to store its
tail, and a source moves at most ``window / (RTT + store time)`` messages a second. Measured across a WAN, a window
the bridge stores in about one round trip (so ``window / (2 x RTT)``) is where it stops being the bottleneck: the
rule of thumb is ``max_ack_pending`` ~ 2 x rate x RTT. Pull mode's requests in flight follow the same rule (each
asks for at most ``max_ack_pending`` messages, and a full window waits a round trip for the next).
"""

from __future__ import annotations

import math

FAR = 0.010  # seconds of round trip from which a link's window is worth a word (loopback and a LAN are below)


def window_carries(window: int, rtt: float) -> float:
    """Messages a second a window of ``window`` carries at most over a link of ``rtt`` seconds, its tail stored in
    about one more round trip (``window / (2 x rtt)``); infinite for a round trip of 0."""
    return math.inf if rtt <= 0.0 else window / (2.0 * rtt)


def window_for(rate: float, rtt: float) -> int:
    """The ``max_ack_pending`` a source of ``rate`` messages a second wants over a link of ``rtt`` seconds
    (2 x rate x RTT, at least 1)."""
    return max(1, math.ceil(2.0 * rate * rtt))
