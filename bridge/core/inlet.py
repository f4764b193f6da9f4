"""A source's end of its deliver subject: what one read of the origin connection brought for it, taken off the wire's
sink, classified and given to its engine in one compiled call, and handed to the runtime only when there is
something to do.

On a connection shared by a thousand sources each read concerns a few of them, and each of those was handed over
through four frames of the interpreter (the origin port's hook, the sink's copy, the runner's receive, its emit)
for what is most often nothing: an idle source's heartbeat, answered by no effect, was a fifth of what an idle
process did. Here the runtime is called (``emit``) with the effects of every read that made some, and with none
when the engine is busy (the runner then places it on the process's ticker by its deadlines) or its source waits at
a closed fence (its ticks look at the fence); a read that leaves a quiet engine quiet and makes nothing calls no
Python at all. The runner keeps ``engine``, ``closed`` and ``paused`` true here (it replaces the engine when the
consumer's mode is chosen, is fenced for good, is suspended and resumed), and reads ``fc_arrivals`` when it answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from bridge.core.effects import Effect
from bridge.core.frames import Frame, take
from bridge.core.inbound import Inbound, classify_frames, flow_control_replies
from bridge.core.replication import Replication

__all__ = ["Inlet"]

# flow-control requests remembered for their answer's latency (a metric): more than this many unanswered means
# requests superseded, or answered while disconnected, and the memory is dropped
FC_ARRIVALS_KEPT: Final = 16


class Inlet:
    """Where the wire parser appends a source's frames (``sink``) and what takes them after the read (``read``)."""

    def __init__(self, engine: Replication, clock: Callable[[], float], emit: Callable[[list[Effect]], None]) -> None:
        self.sink: list[Frame] = []  # appended to by the parser; copied and cleared here, never replaced
        self.engine = engine
        self.clock = clock
        self.emit = emit  # the runner's: queue and perform effects, place the source on the ticker
        self.closed = False  # the source was fenced for good: nothing more is taken
        self.paused = False  # the source waits at a closed fence of a kept lease: every read goes to ``emit``
        self.fc_arrivals: dict[str, float] = {}  # flow-control request reply subject -> when it came

    def read(self) -> None:
        """The wire parser's hook, called once after each read that appended to ``sink``."""
        if self.sink:
            self.receive(classify_frames(take(self.sink)))

    def receive(self, messages: Sequence[Inbound]) -> None:
        """What one read of the deliver subject brought, classified, in order (also nats-py's own dispatch, before
        the sink took over or where the parser could not be installed)."""
        if self.closed:
            return
        now = self.clock()
        for reply in flow_control_replies(messages):
            arrivals = self.fc_arrivals
            if len(arrivals) > FC_ARRIVALS_KEPT:
                arrivals.clear()
            arrivals[reply] = now
        engine = self.engine
        effects = engine.receive_many(messages, now)
        if effects or self.paused or not engine.quiet:
            self.emit(effects)
