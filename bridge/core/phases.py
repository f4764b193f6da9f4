"""The engine's phases and every transition between them, in one table (as h11's ``_state.py`` does).

``SourceEngine`` never assigns its phase itself: it reports an ``Event`` to ``PhaseMachine.process``, which looks
the pair up in ``TRANSITIONS``. Reading this module is enough to know the life cycle of a source::

    RECOVERING --recovered--> RESET_WAIT --reset_sent--> RESETTING --reset_done--> RUNNING
                                  ^                          |                        |
                                  +-------reset_failed-------+                        |
                                  +----------------------discontinuity----------------+
    any phase but STOPPING --shutdown--> STOPPING (final)

Pull mode (``bridge.core.pull``) calls its resync a reset too, and has one more phase: when the consumer delivered
messages nobody stored (lost in transit, or left by a crash), they are read from the origin stream before
deliveries are taken again::

    RESETTING --fill--> FILLING --filled--> RUNNING
    RUNNING   --fill--> FILLING       (a delivery skipped stream sequences: what lies between is read first)
                           +--fill_failed / discontinuity--> RESET_WAIT

The rule for inputs that arrive in the wrong phase (one rule, everywhere):

* **An event the table does not list for the current phase changes nothing, and the input that caused it
  returns no effects.** Such inputs are stale, never errors: a RESET reply after shutdown began, a second
  ``recovered``, a discontinuity seen while a reset is already pending. No input raises because of the phase.
* **Deliveries are taken only in RUNNING** (and flow-control requests also in STOPPING, to answer what is
  stored). Anything on the deliver subject in another phase belongs to an epoch the pending reset replaces: a
  flow-control request is released with an empty answer (it acks nothing) and every arrival counts as a sign
  that the consumer is alive (a reset backing off is retried at once). In FILLING, deliveries are held, and taken
  in order once what the fill reads is taken.
* **The outcome of an effect the engine never asks for** (a RESET reply to a pull-mode engine, a fill to a
  flow-control one) is stale by definition: it changes nothing and returns no effects, like any input in the wrong
  phase. So a runner feeds every outcome back to the engine it holds without asking which one it is.

Every other phase-dependent behaviour reads one of the phase sets below (through ``PhaseMachine``'s attributes),
never a comparison with one phase, so this module is the whole story:

==================  ===========================================================================================
``takes_deliveries``      RUNNING: deliveries are sequenced and taken
``holds_deliveries``      FILLING: deliveries wait until the fill is taken
``answers_flow_control``  RUNNING, STOPPING: a flow-control request is answered with what is stored
``awaits_recovery``       RECOVERING: the watermark is not known yet (nothing may be acked)
``publishes``             every phase but STOPPING: new publishes and target-limit reads go out
``reset_pending``         RESET_WAIT, RESETTING: a reset is scheduled or in flight
==================  ===========================================================================================
"""

from __future__ import annotations

from enum import Enum


class Phase(Enum):
    """Where the engine is in its life cycle."""

    RECOVERING = "recovering"  # waiting for the watermark recovered from the aggregate
    RESET_WAIT = "reset_wait"  # a reset is due (throttled or backing off); deliveries are not taken
    RESETTING = "resetting"  # a RESET request is in flight
    FILLING = "filling"  # pull mode: reading from the origin stream what the consumer delivered to nobody
    RUNNING = "running"  # taking deliveries
    STOPPING = "stopping"  # shutting down: no new deliveries or publishes, in-flight acks still count

    # looked up in TRANSITIONS on every tick and several times per message: an Enum hashes its name in Python (a
    # call each), a member is a singleton compared by identity, so its identity hashes as well and in C
    __hash__ = object.__hash__


class Event(Enum):
    """What moves the engine from one phase to another."""

    RECOVERED = "recovered"  # the aggregate's watermark is known: the first reset is due
    DISCONTINUITY = "discontinuity"  # a gap, rewind, foreign reset, silence, reconnect or stranded message
    RESET_SENT = "reset_sent"  # the due reset was handed to the runtime
    RESET_DONE = "reset_done"  # the consumer was reset (a new epoch starts at delivery sequence 1), or found at
    # rest, needing no RESET (the new epoch goes on after its last delivery)
    RESET_FAILED = "reset_failed"  # the reset was refused or unanswered: it is due again after a backoff
    FILL = "fill"  # pull mode: messages the consumer delivered to nobody (a resync), or that a delivery skipped
    # over (sequences missing before it), are read from the origin stream
    FILLED = "filled"  # pull mode: they were read and handed to the pipeline; deliveries are taken again
    FILL_FAILED = "fill_failed"  # pull mode: the origin stream could not be read; resync again after a backoff
    SHUTDOWN = "shutdown"  # stop taking deliveries; drain what is in flight

    __hash__ = object.__hash__  # as Phase's


TRANSITIONS: dict[Phase, dict[Event, Phase]] = {
    Phase.RECOVERING: {Event.RECOVERED: Phase.RESET_WAIT, Event.SHUTDOWN: Phase.STOPPING},
    Phase.RESET_WAIT: {Event.RESET_SENT: Phase.RESETTING, Event.SHUTDOWN: Phase.STOPPING},
    Phase.RESETTING: {
        Event.RESET_DONE: Phase.RUNNING,
        Event.FILL: Phase.FILLING,
        Event.RESET_FAILED: Phase.RESET_WAIT,
        Event.SHUTDOWN: Phase.STOPPING,
    },
    Phase.FILLING: {
        Event.FILLED: Phase.RUNNING,
        Event.FILL_FAILED: Phase.RESET_WAIT,
        Event.DISCONTINUITY: Phase.RESET_WAIT,
        Event.SHUTDOWN: Phase.STOPPING,
    },
    Phase.RUNNING: {Event.DISCONTINUITY: Phase.RESET_WAIT, Event.FILL: Phase.FILLING, Event.SHUTDOWN: Phase.STOPPING},
    Phase.STOPPING: {},
}

# phases in which what arrives on the deliver subject is taken as part of the current epoch
TAKES_DELIVERIES = frozenset({Phase.RUNNING})
# phases in which a flow-control request is held and answered with what is stored (otherwise: answered empty)
ANSWERS_FLOW_CONTROL = frozenset({Phase.RUNNING, Phase.STOPPING})
# phases in which a reset is scheduled or in flight
RESET_PENDING = frozenset({Phase.RESET_WAIT, Phase.RESETTING})
# phases in which deliveries are kept aside, to be taken once the fill under way is taken (pull mode)
HOLDS_DELIVERIES = frozenset({Phase.FILLING})
# phases before the aggregate's watermark is known: nothing can be said to be stored, so nothing is acked
AWAITS_RECOVERY = frozenset({Phase.RECOVERING})
# phases in which new publishes (and reads of the target's limits for them) go out; STOPPING only drains
PUBLISHES = frozenset(set(Phase) - {Phase.STOPPING})


class PhaseMachine:
    """The current phase; changed only through ``process`` and the table."""

    __slots__ = (
        "_phase",
        "answers_flow_control",
        "awaits_recovery",
        "holds_deliveries",
        "publishes",
        "takes_deliveries",
    )

    def __init__(self, phase: Phase = Phase.RECOVERING) -> None:
        self._enter(phase)

    @property
    def phase(self) -> Phase:
        return self._phase

    def can(self, event: Event) -> bool:
        """``event`` is a transition from the current phase."""
        return event in TRANSITIONS[self.phase]

    def process(self, event: Event) -> bool:
        """Move along the table; False (and no change) when ``event`` is not a transition from this phase."""
        target = TRANSITIONS[self.phase].get(event)
        if target is None:
            return False
        self._enter(target)
        return True

    def _enter(self, phase: Phase) -> None:
        self._phase = phase
        # asked for every delivery: looked up once per change, not per delivery (an Enum hashes in Python)
        self.takes_deliveries = phase in TAKES_DELIVERIES
        self.answers_flow_control = phase in ANSWERS_FLOW_CONTROL
        self.holds_deliveries = phase in HOLDS_DELIVERIES
        self.awaits_recovery = phase in AWAITS_RECOVERY
        self.publishes = phase in PUBLISHES

    @property
    def reset_pending(self) -> bool:
        return self.phase in RESET_PENDING
