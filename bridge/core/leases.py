"""One lease's states and every transition between them, in one table (as ``bridge.core.phases`` is for the engine).

``Fleet`` (``bridge.core.fleet``) never assigns a lease's state itself: it reports a ``LeaseEvent`` to
``LeaseMachine.process``, which looks the pair up in ``TRANSITIONS``. Reading this module is enough to know the life
cycle of a lease::

    STANDBY --acquire_sent--> ACQUIRING --acquired--> OWNED --hand_over--> DRAINING --source_stopped--> RELEASING
     ^ ^ ^                        |                     |                     |                            |
     | | +-----acquire_failed-----+                     |                     |                            |
     | +-------lost (the fence passed)------------------+---------------------+                            |
     +---------released (the delete was made, or failed and the key expires by itself)---------------------+

The fence of a kept lease (OWNED, RENEWING) passing before a renew succeeded does not lose it: the lease is
*suspended*. Its sources act on nothing (the fence is closed) but keep their state; renews go on, each a
compare-and-set on the revision we last wrote, so one that succeeds proves nobody else wrote the key since: nobody
else can have acted, and the sources resume where they paused, without setting up again. A renew refused (the key
expired or is someone else's), a view showing the key not ours, a shutdown or the lease's removal lose it::

    OWNED    --fence_passed--> SUSPENDED --renew_sent--> SUSPENDED_RENEWING --renewed--> OWNED  (the sources resume)
    RENEWING --fence_passed--> SUSPENDED_RENEWING
    SUSPENDED_RENEWING --renewed_late / renew_failed / renew_adopted--> SUSPENDED
    SUSPENDED, SUSPENDED_RENEWING --lost / renew_refused (SUSPENDED_RENEWING only)--> STANDBY

Why: a process is rarely the only one on its machine. A hub starved by twenty leaf servers restarting beside it
answered no renew for the 8 s before the fences of a 10 s TTL (``bench edge``, 2,000 sources on 2 CPUs); every lease
was lost, every source set up again from the aggregate, and the set-ups of 2,000 sources on the same starved hub
kept replication stopped for minutes. A lease is lost because another process may act, not because the hub was
slow.

A renew goes out when due from OWNED and DRAINING. While it is in flight the lease is in that state's renewing
twin, which moves along the line above as the state does (a handover or a stop does not wait for the reply), and
the reply is taken only there. The delete alone waits for it: it names the revision we last wrote, which a renew
landing first would move, so a delete sent beside a renew is refused and the key lingers a TTL (seen in a rolling
update: the successor waited 3 s). From RELEASING_RENEWING the delete goes out with the reply, on the revision it
brings::

    OWNED    --renew_sent--> RENEWING --hand_over--> DRAINING_RENEWING --source_stopped--> RELEASING_RENEWING
    DRAINING --renew_sent--> DRAINING_RENEWING

    RENEWING           --renewed / renew_failed / renew_adopted--> OWNED
    DRAINING_RENEWING  --renewed / renew_failed / renew_adopted--> DRAINING
    RELEASING_RENEWING --renewed / renew_failed / renew_adopted--> RELEASING  (the delete goes out now)
    RENEWING, DRAINING_RENEWING, RELEASING_RENEWING --renew_refused--> STANDBY   (the key is someone else's)
    RENEWING, DRAINING_RENEWING                     --lost-->          STANDBY

(In the draining states the fence passing still loses the lease: a drain that cannot answer is no drain.)

The rule for inputs that arrive in the wrong state (one rule, everywhere):

* **An event the table does not list for the current state changes nothing, and the input that caused it returns
  no effects.** Such inputs are stale, never errors: a renew reply for a lease lost or released meanwhile (the
  next term's renew is a new request), an ``acquired`` for a lease that is not being acquired, a second
  ``source_stopped``, a ``released`` while the source still drains. No input raises because of the state.

Everything else in ``Fleet`` that depends on the state asks the table (``LeaseMachine.can``) or reads one of the
state sets below (through ``LeaseMachine``'s attributes), never a comparison with one state, so this module is the
whole story:

================  =================================================================================================
``standby``       STANDBY: not ours; the next view may decide to acquire it
``owned``         every state but STANDBY and ACQUIRING: the key is ours, the fence may be open (``Lease.holds``)
``serving``       OWNED, RENEWING: ours, kept and running; what ``hand_over`` leaves
``kept``          ``serving`` and ``suspended``: ours and not being given up, counted against the fair share; a
                  source whose fence is closed waits for it to open again (``Fence.waiting``) rather than stop
``suspended``     SUSPENDED, SUSPENDED_RENEWING: the fence passed before a renew succeeded; the sources pause
``source_runs``   OWNED, RENEWING, DRAINING, DRAINING_RENEWING: the source may act, so the ticker watches the
                  fence (``fence_passed`` where the table lists it, else ``lost``, once it passes)
``renews``        OWNED, DRAINING, SUSPENDED: a renew goes out when one is due (none is in flight)
``release_waits`` RELEASING_RENEWING: the delete goes out with the renew's reply (whatever it is)
================  =================================================================================================

What users see (``status``, metrics) are five names, ``public_state``: standby, acquiring, owned (OWNED,
RENEWING), suspended (the suspended states) and releasing (the draining and releasing states).
"""

from __future__ import annotations

from enum import Enum


class LeaseState(Enum):
    """Where one source's lease is, as this process sees it."""

    STANDBY = "standby"  # not ours
    ACQUIRING = "acquiring"  # a create (or a take-back of our own key) is in flight
    OWNED = "owned"  # ours: the source runs, fenced by ``valid_until``
    RENEWING = "renewing"  # OWNED, and a renew is in flight
    DRAINING = "draining"  # ours, being given up: a graceful StopSource is under way, renews go on
    DRAINING_RENEWING = "draining_renewing"  # DRAINING, and a renew is in flight
    RELEASING = "releasing"  # the source stopped: the delete is in flight and the fence closed
    RELEASING_RENEWING = "releasing_renewing"  # the source stopped; the delete waits for a renew's reply
    SUSPENDED = "suspended"  # ours, but the fence passed before a renew succeeded: the sources pause, renews go on
    SUSPENDED_RENEWING = "suspended_renewing"  # SUSPENDED, and a renew is in flight


class LeaseEvent(Enum):
    """What moves a lease from one state to another."""

    ACQUIRE_SENT = "acquire_sent"  # the next view decided to take the key: a create (or take-back) went out
    ACQUIRED = "acquired"  # the create was stored: the key is ours from the time it was sent
    ACQUIRE_FAILED = "acquire_failed"  # the create was refused or unanswered: the next view decides again
    RENEW_SENT = "renew_sent"  # a renew fell due and went out
    RENEWED = "renewed"  # the renew was stored: the fence moves to its send time + ttl - guard
    RENEWED_LATE = "renewed_late"  # stored, but its reply came after the fence it set: a suspended lease stays so
    RENEW_FAILED = "renew_failed"  # the renew got no answer or an error: it is tried again soon
    RENEW_ADOPTED = "renew_adopted"  # refused, but the key holds an earlier write of ours: take its revision
    RENEW_REFUSED = "renew_refused"  # refused: the key is someone else's (or gone); the source stops at once
    HAND_OVER = "hand_over"  # a rebalance, a shutdown or a source removed: drain the source, then release
    SOURCE_STOPPED = "source_stopped"  # the graceful stop finished: the delete goes out
    RELEASED = "released"  # the delete was made, or failed (the key then expires by itself)
    FENCE_PASSED = "fence_passed"  # the fence of a kept lease passed before a renew succeeded: suspended
    LOST = "lost"  # the key may be someone else's: the fence passed while draining, a suspended lease's key was seen
    # gone or another's, a suspended lease given up, or the acquisition landed too late to act on


_RENEW_REPLIES = (LeaseEvent.RENEWED, LeaseEvent.RENEW_FAILED, LeaseEvent.RENEW_ADOPTED)

TRANSITIONS: dict[LeaseState, dict[LeaseEvent, LeaseState]] = {
    LeaseState.STANDBY: {LeaseEvent.ACQUIRE_SENT: LeaseState.ACQUIRING},
    LeaseState.ACQUIRING: {LeaseEvent.ACQUIRED: LeaseState.OWNED, LeaseEvent.ACQUIRE_FAILED: LeaseState.STANDBY},
    LeaseState.OWNED: {
        LeaseEvent.RENEW_SENT: LeaseState.RENEWING,
        LeaseEvent.HAND_OVER: LeaseState.DRAINING,
        LeaseEvent.FENCE_PASSED: LeaseState.SUSPENDED,
        LeaseEvent.LOST: LeaseState.STANDBY,
    },
    LeaseState.RENEWING: {
        **dict.fromkeys(_RENEW_REPLIES, LeaseState.OWNED),
        LeaseEvent.RENEW_REFUSED: LeaseState.STANDBY,
        LeaseEvent.HAND_OVER: LeaseState.DRAINING_RENEWING,
        LeaseEvent.FENCE_PASSED: LeaseState.SUSPENDED_RENEWING,
        LeaseEvent.LOST: LeaseState.STANDBY,
    },
    LeaseState.SUSPENDED: {
        LeaseEvent.RENEW_SENT: LeaseState.SUSPENDED_RENEWING,
        LeaseEvent.LOST: LeaseState.STANDBY,
    },
    LeaseState.SUSPENDED_RENEWING: {
        LeaseEvent.RENEWED: LeaseState.OWNED,
        LeaseEvent.RENEWED_LATE: LeaseState.SUSPENDED,
        LeaseEvent.RENEW_FAILED: LeaseState.SUSPENDED,
        LeaseEvent.RENEW_ADOPTED: LeaseState.SUSPENDED,
        LeaseEvent.RENEW_REFUSED: LeaseState.STANDBY,
        LeaseEvent.LOST: LeaseState.STANDBY,
    },
    LeaseState.DRAINING: {
        LeaseEvent.RENEW_SENT: LeaseState.DRAINING_RENEWING,
        LeaseEvent.SOURCE_STOPPED: LeaseState.RELEASING,
        LeaseEvent.LOST: LeaseState.STANDBY,
    },
    LeaseState.DRAINING_RENEWING: {
        **dict.fromkeys(_RENEW_REPLIES, LeaseState.DRAINING),
        LeaseEvent.RENEW_REFUSED: LeaseState.STANDBY,
        LeaseEvent.SOURCE_STOPPED: LeaseState.RELEASING_RENEWING,
        LeaseEvent.LOST: LeaseState.STANDBY,
    },
    LeaseState.RELEASING: {LeaseEvent.RELEASED: LeaseState.STANDBY},
    LeaseState.RELEASING_RENEWING: {
        **dict.fromkeys(_RENEW_REPLIES, LeaseState.RELEASING),
        LeaseEvent.RENEW_REFUSED: LeaseState.STANDBY,
    },
}

# ours: the fence may be open; status and metrics call these "owned"
OURS = frozenset(set(LeaseState) - {LeaseState.STANDBY, LeaseState.ACQUIRING})
# ours, kept and running: what a handover can take
SERVING = frozenset({LeaseState.OWNED, LeaseState.RENEWING})
# the fence passed before a renew succeeded: the sources pause until one does
SUSPENDED = frozenset({LeaseState.SUSPENDED, LeaseState.SUSPENDED_RENEWING})
# ours and not being given up: counted against the fair share; a closed fence here may open again in the same term
KEPT = SERVING | SUSPENDED
# the source may act on this lease: the ticker suspends (FENCE_PASSED) or loses (LOST) it once the fence passes
SOURCE_RUNS = frozenset({LeaseState.OWNED, LeaseState.RENEWING, LeaseState.DRAINING, LeaseState.DRAINING_RENEWING})
# a renew goes out when due: the lease must outlive a long drain too, and one renew is in flight at a time
RENEWS = frozenset({LeaseState.OWNED, LeaseState.DRAINING, LeaseState.SUSPENDED})
# the sources stopped and the key is to be deleted, once the renew in flight is answered (the delete names its revision)
RELEASE_WAITS = frozenset({LeaseState.RELEASING_RENEWING})

PUBLIC_STATE: dict[LeaseState, str] = {
    LeaseState.STANDBY: "standby",
    LeaseState.ACQUIRING: "acquiring",
    LeaseState.OWNED: "owned",
    LeaseState.RENEWING: "owned",
    LeaseState.DRAINING: "releasing",
    LeaseState.DRAINING_RENEWING: "releasing",
    LeaseState.RELEASING: "releasing",
    LeaseState.RELEASING_RENEWING: "releasing",
    LeaseState.SUSPENDED: "suspended",
    LeaseState.SUSPENDED_RENEWING: "suspended",
}


class LeaseMachine:
    """One lease's state; changed only through ``process`` and the table."""

    __slots__ = (
        "_row",
        "_state",
        "kept",
        "owned",
        "release_waits",
        "renews",
        "serving",
        "source_runs",
        "standby",
        "suspended",
    )

    def __init__(self, state: LeaseState = LeaseState.STANDBY) -> None:
        self._enter(state)

    def __repr__(self) -> str:
        return f"LeaseMachine({self._state.name})"

    @property
    def state(self) -> LeaseState:
        return self._state

    @property
    def public_state(self) -> str:
        """The state as ``status`` and metrics show it: standby, acquiring, owned, suspended or releasing."""
        return PUBLIC_STATE[self._state]

    def can(self, event: LeaseEvent) -> bool:
        """``event`` is a transition from the current state."""
        return event in self._row

    def process(self, event: LeaseEvent) -> bool:
        """Move along the table; False (and no change) when ``event`` is not a transition from this state."""
        target = self._row.get(event)
        if target is None:
            return False
        self._enter(target)
        return True

    def _enter(self, state: LeaseState) -> None:
        self._state = state
        self._row = TRANSITIONS[state]
        # read by the fence check before every action and by the ticker for every lease: looked up once per change
        # (an Enum hashes in Python)
        self.standby = state is LeaseState.STANDBY
        self.owned = state in OURS
        self.serving = state in SERVING
        self.kept = state in KEPT
        self.suspended = state in SUSPENDED
        self.source_runs = state in SOURCE_RUNS
        self.renews = state in RENEWS
        self.release_waits = state in RELEASE_WAITS
