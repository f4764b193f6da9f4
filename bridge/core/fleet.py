"""Who replicates which source: leases in a KV bucket, decided here, performed by ``bridge.runtime.fleet``.

**Leases and what they cover.** With ``coordination.lease_groups`` = G > 0 (the default) every source belongs to one
of G groups, fixed by its name (:func:`unit_of`), and a process owns the groups that have sources through the keys
``group.<n>``: what coordination costs (G/3 writes per TTL at most, whatever the number of sources: 128 groups at a
10 s TTL are at most 38 writes a second, against 300 for 1,000 sources leased one by one) grows with neither the
sources nor the processes, and a group's sources start, drain and stop together. With G = 0 every source has a lease
of its own, ``lease.<source>`` (the only scheme before lease groups). Below, "lease" is either; the fence, the
assignment and the states are the same. Every process of a fleet must use the same G: a process that sees a live
member with another G (or a version before lease groups, which writes none and counts as 0) takes nothing while it
is there (``fleet.mixed_lease_groups``), and a group is not taken while one of its sources still has a live
``lease.<source>`` key of another process.

Every lease is owned through a key of one JetStream KV bucket whose ``max_age`` is the lease TTL: the server drops
a key ``ttl`` after the write that last stored it, unless the owner wrote it again (a renew, an update on the
revision it last wrote). Acquiring is a create (refused while the key exists); a graceful release
is a delete on the owner's revision; every write is compare-and-set on the key's revision, so two processes can
never both believe a write of theirs made them the owner.

**The fence.** A write *sent* at ``t`` (this process's monotonic clock) is stored after ``t``, so the key lives at
least until ``t + ttl`` and nobody else can create it before then. The owner acts on the source (publish, answer
flow control, reset or create the consumer) only while ``now < t + ttl - guard`` for the last successful write:
:meth:`Fleet.holds`, consulted by the runtime right before each of those actions. A process frozen past that
point (SIGSTOP, a VM pause, a long GC) finds the fence closed when it wakes, before it can act on anything it had
buffered, whatever its tasks happen to run first. ``guard`` absorbs clock-rate differences and request latency.

**Assignment.** Each process writes ``presence.<instance>`` (value: its incarnation and the leases it serves)
every ``renew_every``; the bucket's ``max_age`` removes the presence of a process that died. A source's preferred
owner comes from rendezvous hashing of (lease, instance) with bounded loads (:func:`bounded_assignment`): each
of N members is preferred for at most ceil(M/N) of the M leases, every process computes the same assignment from the
same presence keys, and a member joining or leaving changes the preference of about its share only. A free source
is acquired by its preferred member at once, and, while its preferred member is not taking it, by its second choice
once it has been free for ``ttl``, by its third once free for twice that, and so on (a dead member's presence
outlives its leases by up to a renew period: the member preferred once it expires takes the source, which then
stays). Ownership is sticky: a process hands a source over only while it owns more than its fair share
(its sources over the live members, rounded up), and only a source whose preferred member is live and another
process; the source drains (everything stored is answered), the key is deleted, and the preferred member creates
it at its next view. So a standby that comes back takes nothing from a process at its fair share, and a newcomer
takes from each process only what that process holds above its share.

**States.** One lease's states and every transition between them are one table, ``bridge.core.leases``: each
input below is an event of that table, and one that does not fit the lease's state (a late reply for a lease given
up meanwhile) changes nothing and returns no effects. What an input does besides moving the lease:

* ``acquired``: StartSource for each of its sources (or, landed too late for its fence: ``lost``; during a shutdown
  or for a removed lease: ``hand_over`` at once).
* ``renewed``: the fence moves. ``renew_adopted`` (a write of ours whose reply was lost): its revision is taken,
  the fence stays. ``renew_failed``: retried soon.
* ``hand_over``: StopSource graceful for each of its sources. ``source_stopped`` of the last of them: Release (a
  delete on our revision) and the fence closes.
* ``fence_passed`` (the ticker found the fence of a kept lease passed before a renew succeeded): the lease is
  suspended and nothing is stopped; its sources find their fence closed at their next action and wait there
  (``Fence.waiting`` in the runtime), keeping their state, while renews go on. ``renewed`` with its fence open:
  ResumeSource for each (StartSource for one not running), since that renew, a compare-and-set on the revision we
  last wrote, proves nobody else wrote the key meanwhile, so nobody else can have acted. ``renewed_late`` (the
  reply came after the fence it set), a failed or an adopted renew: still suspended, the next renew goes out. A
  refused renew, a view showing the key gone or someone else's, a shutdown or the lease's removal: ``lost``.
* ``lost`` and ``renew_refused``: StopSource not graceful for each, nothing more is done.
* ``source_fenced`` (a source found its fence closed at an action and stopped itself): while the lease still holds
  in the same term (a late renew moved the fence meanwhile), StartSource for it again; while it is kept but its
  fence closed, it is suspended (if the ticker has not done so yet) and the source starts again on its resumption;
  else nothing (the lease was lost or is being given up, and that stop reports itself).
* A reload that adds a source to a lease of ours starts it; one that removes a source from it drains that source
  (the lease stays).
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from bridge.core.effects import Notice
from bridge.core.leases import LeaseEvent, LeaseMachine
from bridge.core.leases import LeaseState as LeaseState  # re-exported: the runtime and the tests name it from here

LEASE_PREFIX = "lease."  # one lease per source (``lease_groups = 0``): ``lease.<source>``
GROUP_PREFIX = "group."  # one lease per group of sources: ``group.<n>``
PRESENCE_PREFIX = "presence."
# A view reads every key of the bucket: above this many keys a second, views are spaced out (up to one per renew
# period) rather than the hub made to serve the whole bucket every second to every process.
VIEW_KEYS_PER_SECOND = 500


def unit_of(source: str, groups: int) -> str:
    """The name of the lease ``source`` is owned through: the source itself with ``groups`` = 0, else its group,
    one of ``groups`` fixed by the name alone (the same in every process, run and version)."""
    if groups <= 0:
        return source
    return str(zlib.crc32(source.encode()) % groups)


def _renew_spread(source: str) -> float:
    """A fraction in [0, 0.25) fixed per source name (the same in every process and run)."""
    return (zlib.crc32(source.encode()) % 1000) / 4000


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The lease's clock: every figure derives from the TTL (the bucket's ``max_age``)."""

    ttl: float

    @property
    def renew_every(self) -> float:
        """A lease (and the presence key) is written again this often: two renews may fail before the fence."""
        return self.ttl / 3

    @property
    def guard(self) -> float:
        """How long before the key's earliest expiry the owner stops acting."""
        return self.ttl / 5

    @property
    def request_timeout(self) -> float:
        """The longest a KV write may take before it counts as failed (and is tried again)."""
        return max(0.2, min(self.ttl / 5, 5.0))

    @property
    def join_wait(self) -> float:
        """How long after its presence is first written a process waits before taking leases (one view)."""
        return self.view_every

    @property
    def view_every(self) -> float:
        """How often the bucket is read whole (members and holders)."""
        return max(0.1, min(1.0, self.ttl / 10))


@dataclass(frozen=True, slots=True)
class Holder:
    """The value of a ``lease.<source>`` key: who owns the source since when, at which revision."""

    instance: str
    incarnation: str
    host: str = ""
    pid: int = 0
    since: float = 0.0  # unix seconds the holder acquired it
    revision: int = 0


@dataclass(frozen=True, slots=True)
class Member:
    """The value of a ``presence.<instance>`` key: a live process, the leases its configuration has (``sources``:
    source names with ``lease_groups`` = 0, group numbers otherwise) and its ``lease_groups``."""

    instance: str
    incarnation: str
    sources: frozenset[str] = frozenset()
    host: str = ""
    lease_groups: int = 0  # a process older than lease groups writes none: 0, one lease per source


@dataclass(frozen=True, slots=True)
class View:
    """The bucket as one read saw it: ``holders`` and ``free`` for ``lease.<source>`` keys, ``groups`` and
    ``free_groups`` for ``group.<n>`` keys. ``free`` holds the delete markers' revisions (a create must name them)."""

    members: Mapping[str, Member] = field(default_factory=dict)
    holders: Mapping[str, Holder] = field(default_factory=dict)
    free: Mapping[str, int] = field(default_factory=dict)
    groups: Mapping[str, Holder] = field(default_factory=dict)
    free_groups: Mapping[str, int] = field(default_factory=dict)


def holder_in(view: View, source: str, groups: int) -> Holder | None:
    """Who holds the lease of ``source`` in ``view``, for a fleet leasing with ``groups`` (``status``, ``check``)."""
    return view.groups.get(unit_of(source, groups)) if groups > 0 else view.holders.get(source)


# -- effects ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadView:
    """Read the whole bucket; report :meth:`Fleet.viewed` or :meth:`Fleet.view_failed`."""


@dataclass(frozen=True, slots=True)
class WritePresence:
    """Write this process's presence key (an overwrite: presence is information, not ownership)."""


@dataclass(frozen=True, slots=True)
class Acquire:
    """Create the key of ``lease`` (:attr:`Fleet.key_prefix` + ``lease``); with ``revision`` > 0, write it on that
    revision instead (a delete marker, or a key of our own incarnation). Report :meth:`Fleet.acquired` with the time
    the write was sent, or :meth:`Fleet.acquire_failed`."""

    lease: str
    revision: int = 0


@dataclass(frozen=True, slots=True)
class Renew:
    """Write the key of ``lease`` again on ``revision``, waiting up to ``timeout`` seconds for the reply. Report
    :meth:`Fleet.renewed` (with the send time) or :meth:`Fleet.renew_failed` (``definitive`` when the server refused
    the revision: the key is someone else's).

    ``timeout`` runs to the fence (at least ``request_timeout``): a reply that comes late but before the fence still
    moves it (the fence counts from the send time), so a slow server, the common case under load, costs no lease;
    giving up after ``request_timeout`` discarded those replies and sent more writes to the server that was slow.
    A suspended lease's renew waits a TTL: even a reply too late to reopen the fence names the revision stored."""

    lease: str
    revision: int
    timeout: float = field(default=0.0, compare=False)  # not part of the renew's identity: a deadline


@dataclass(frozen=True, slots=True)
class Release:
    """Delete the key of ``lease`` on ``revision``; report :meth:`Fleet.released` whatever the outcome."""

    lease: str
    revision: int


@dataclass(frozen=True, slots=True)
class StartSource:
    """Start replicating ``source`` as a fresh start does (watermark from the aggregate, RESET to the ack floor)."""

    source: str


@dataclass(frozen=True, slots=True)
class ResumeSource:
    """The lease of ``source`` was suspended and a renew reopened its fence in the same term: the source goes on
    from where it paused (nobody else can have acted on it meanwhile)."""

    source: str


@dataclass(frozen=True, slots=True)
class StopSource:
    """Stop replicating ``source``. ``graceful``: drain and answer what is stored, then report
    :meth:`Fleet.source_stopped`. Not graceful: the fence is closed, stop at once and do nothing more."""

    source: str
    graceful: bool


FleetEffect = ReadView | WritePresence | Acquire | Renew | Release | StartSource | ResumeSource | StopSource | Notice


def rendezvous(source: str, instance: str) -> int:
    """The weight of ``instance`` for ``source``: the live member with the highest weight is the preferred owner."""
    digest = hashlib.blake2b(f"{source}\n{instance}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def preference_order(source: str, candidates: Iterable[str]) -> list[str]:
    """The candidates from the most to the least preferred owner of ``source`` (rendezvous weight; ties by name)."""
    return sorted(candidates, key=lambda instance: (rendezvous(source, instance), instance), reverse=True)


def preferred_owner(source: str, candidates: Iterable[str]) -> str | None:
    """The candidate instance that should own ``source`` (highest rendezvous weight; ties by name)."""
    best: tuple[int, str] | None = None
    for instance in candidates:
        key = (rendezvous(source, instance), instance)
        if best is None or key > best:
            best = key
    return None if best is None else best[1]


def bounded_assignment(served: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Each lease's preferred owner among the members serving it, with bounded loads.

    Rendezvous hashing alone leaves the shares uneven (128 groups over three members: 48 / 48 / 32), and the sticky
    fair-share rule never corrects it, since a process hands a lease over only to its preferred member. Here the
    leases are taken in a fixed order (by their own hash) and each goes to its most preferred member (rendezvous
    order) that has fewer than ceil(leases / members) so far; one whose members are all full goes to its first.
    Every process that sees the same members serving the same leases computes the same answer, and a member
    joining or leaving still moves few leases (each keeps its rendezvous order).
    """
    names = sorted(served, key=lambda name: (rendezvous(name, ""), name))
    candidates = {name: preference_order(name, served[name]) for name in names}
    members = {instance for order in candidates.values() for instance in order}
    if not members:
        return {}
    cap = math.ceil(len(names) / len(members))
    load = dict.fromkeys(members, 0)
    out: dict[str, str] = {}
    for name in names:
        order = candidates[name]
        if not order:
            continue
        pick = next((instance for instance in order if load[instance] < cap), order[0])
        load[pick] += 1
        out[name] = pick
    return out


@dataclass(slots=True)
class Lease:
    """One lease (a source's, or a group's): its state machine (``bridge.core.leases``) and what the states do not
    say. Counters are for metrics only."""

    name: str
    sources: list[str] = field(default_factory=list)  # the configured sources it covers (kept once it is removed)
    running: set[str] = field(default_factory=set)  # started under this term and not stopped since
    draining: set[str] = field(default_factory=set)  # a handover waits for these graceful stops
    revision: int = 0
    valid_until: float = -math.inf  # the fence: act only while now < valid_until
    renewed_at: float = -math.inf  # when the last successful write was sent
    next_renew: float = math.inf
    free_since: float | None = None  # first view that showed the key free (None: held, or not seen free)
    since_wall: float = 0.0
    renewals: int = 0
    renew_failures: int = 0
    failing: int = 0  # renew failures since the last success (a notice on the first, then every fifth)
    changes: int = 0  # times it became ours or stopped being ours
    term: int = 0  # counts the times it became ours: a fence is bound to one term
    suspended_at: float = 0.0  # when the fence last passed before a renew succeeded
    machine: LeaseMachine = field(default_factory=LeaseMachine)

    @property
    def state(self) -> LeaseState:
        """Where the lease is; it changes only through ``machine.process``."""
        return self.machine.state

    @property
    def owned(self) -> bool:
        """The key is ours (kept, draining or being released): status and metrics show the source as owned."""
        return self.machine.owned

    @property
    def public_state(self) -> str:
        """The state as users see it: ``standby``, ``acquiring``, ``owned`` or ``releasing``."""
        return self.machine.public_state

    def holds(self, now: float) -> bool:
        """Whether this process may act on the lease's sources now."""
        return self.machine.owned and now < self.valid_until


class Fleet:
    """This process's leases: fed views of the bucket, write outcomes and the clock; returns effects in order.

    ``groups`` = 0 gives one lease per source (the key ``lease.<source>``); ``groups`` > 0 puts every source in one
    of that many groups by its name (:func:`unit_of`) and leases the groups that have sources (``group.<n>``). The
    leases' life is the same either way; the inputs that name a lease (``acquired``, ``renewed`` ...) take its name,
    the ones about a source (``holds``, ``source_stopped``) the source's."""

    def __init__(
        self,
        instance: str,
        incarnation: str,
        sources: Iterable[str],
        timing: LeaseTiming,
        now: float,
        groups: int = 0,
    ) -> None:
        self.instance = instance
        self.incarnation = incarnation
        self.timing = timing
        self.groups = groups
        self.key_prefix = GROUP_PREFIX if groups > 0 else LEASE_PREFIX
        self.configured: list[str] = []
        self.units: dict[str, list[str]] = {}  # each configured lease and its sources, in configuration order
        self._unit_of: dict[str, str] = {}
        self.leases: dict[str, Lease] = {}
        # bumped after every change of which lease a source is owned through (``lease_of``): a ``Fence`` that found
        # its lease there looks again only after a bump (every fence of a thousand sources looked it up in two
        # dicts of a thousand, before every publish and answer)
        self.generation = 0
        self._configure(sources)
        self.members: dict[str, Member] = {}
        self.holders: dict[str, Holder] = {}  # by lease name
        self._source_holders: Mapping[str, Holder] = {}  # ``lease.<source>`` keys seen while leasing groups
        self.foreign: tuple[str, ...] = ()  # live members leasing with another ``lease_groups``
        self.stopping = False
        self._view_at = -math.inf  # when the last view was read (sent)
        self._due = -math.inf  # no lease needs the ticker before this (a renew due, a fence to watch)
        self._viewing = False
        self._next_view = now
        self._presence_ok = False
        self._joined_at = math.inf  # when our presence was first written
        self._next_presence = now
        self._collision_noted = False

    def _configure(self, sources: Iterable[str]) -> None:
        self.configured = list(sources)
        self._unit_of = {name: unit_of(name, self.groups) for name in self.configured}
        self.units = {}
        for name in self.configured:
            self.units.setdefault(self._unit_of[name], []).append(name)
        for unit, members in self.units.items():
            self.leases.setdefault(unit, Lease(unit)).sources = list(members)
        self.generation += 1

    # -- views ------------------------------------------------------------------------------------------------

    def lease_of(self, source: str) -> Lease | None:
        """The lease ``source`` is owned through (None once it is neither configured nor still being given up)."""
        unit = self._unit_of.get(source)
        return self.leases.get(unit if unit is not None else unit_of(source, self.groups))

    def holder_of(self, source: str) -> Holder | None:
        """Who holds the lease of ``source``, as the last view saw it."""
        unit = self._unit_of.get(source)
        return None if unit is None else self.holders.get(unit)

    def holds(self, source: str, now: float) -> bool:
        """The fence: True while this process may act on ``source`` (publish, answer, reset, create its consumer)."""
        lease = self.lease_of(source)
        return lease is not None and lease.holds(now)

    def owned(self) -> list[str]:
        """Sources whose lease is this process's now."""
        return [name for lease in self.leases.values() if lease.machine.owned for name in lease.sources]

    @property
    def done(self) -> bool:
        """Stopping, and no lease is ours or on its way to being ours."""
        return self.stopping and all(lease.machine.standby for lease in self.leases.values())

    @property
    def view_age_origin(self) -> float:
        """When the newest view of the bucket was read (monotonic; -inf before the first)."""
        return self._view_at

    # -- configuration ----------------------------------------------------------------------------------------

    def set_sources(self, sources: Iterable[str], now: float) -> list[FleetEffect]:
        """The configuration changed. A lease left with no source that is ours drains and is released; an added
        lease waits for a view. In a lease of ours that stays, an added source starts and a removed one drains."""
        before = {unit: list(lease.sources) for unit, lease in self.leases.items()}
        self._configure(sources)
        effects: list[FleetEffect] = []
        for unit in list(self.leases):
            lease = self.leases[unit]
            if unit not in self.units:
                if lease.machine.standby:
                    del self.leases[unit]
                    self.generation += 1
                elif lease.machine.suspended:  # nothing can drain behind a closed fence: the key expires
                    effects += self._lost(lease, LeaseEvent.LOST, "removed from the configuration while suspended")
                else:  # an acquisition in flight is handed over when it lands (see acquired)
                    effects += self._hand_over(lease, "removed from the configuration")
                continue
            if not lease.machine.kept:
                continue  # acquiring: starts what it covers once it lands; draining: what is added waits
            # (suspended: a source added now starts on the resumption, see renewed)
            old = set(before.get(unit, ()))
            for name in lease.sources:
                if name not in old and lease.holds(now):
                    lease.running.add(name)
                    effects.append(StartSource(name))
            for name in before.get(unit, ()):
                if name not in self._unit_of and name in lease.running:
                    effects.append(StopSource(name, graceful=True))  # source_stopped takes it off ``running``
        self._next_presence = now  # tell the fleet which sources this process serves now
        return effects

    # -- inputs: the bucket -----------------------------------------------------------------------------------

    def viewed(self, view: View, sent_at: float, now: float) -> list[FleetEffect]:
        """A whole read of the bucket, sent at ``sent_at``."""
        self._viewing = False
        self._view_at = sent_at
        keys = len(view.members) + len(view.holders) + len(view.free) + len(view.groups) + len(view.free_groups)
        spaced = min(max(self.timing.view_every, keys / VIEW_KEYS_PER_SECOND), self.timing.renew_every)
        self._next_view = max(self._next_view, sent_at + spaced)
        self._due = -math.inf  # (cheap once a view: whatever an input moved, the next tick looks at every lease)
        self.members = dict(view.members)
        grouped = self.groups > 0
        self.holders = dict(view.groups if grouped else view.holders)
        free = view.free_groups if grouped else view.free
        self._source_holders = view.holders if grouped else {}
        effects: list[FleetEffect] = []
        mine = self.members.get(self.instance)
        collision = mine is not None and mine.incarnation != self.incarnation and self._presence_ok
        if collision and not self._collision_noted:
            self._collision_noted = True
            hint = "two live processes use this instance id: give each its own coordination.instance_id"
            effects.append(Notice("fleet.instance_collision", "error", {"instance": self.instance, "hint": hint}))
        foreign = tuple(
            sorted(
                m.instance
                for m in self.members.values()
                if m.lease_groups != self.groups and m.instance != self.instance
            )
        )
        if foreign != self.foreign:
            self.foreign = foreign
            if foreign:
                others = sorted({self.members[name].lease_groups for name in foreign})
                hint = (
                    "every process sharing a bucket needs the same coordination.lease_groups (0 for a version "
                    "before lease groups): this process takes no source while they run; stop them, or set the same "
                    "value everywhere (see README, Fleets)"
                )
                fields = {"members": list(foreign), "their_lease_groups": others, "lease_groups": self.groups}
                effects.append(Notice("fleet.mixed_lease_groups", "error", {**fields, "hint": hint}))
        for name, lease in self.leases.items():
            holder = self.holders.get(name)
            if holder is None:
                if lease.free_since is None:
                    lease.free_since = sent_at
            else:
                lease.free_since = None
            if lease.machine.suspended and (holder is None or holder.incarnation != self.incarnation):
                # gone (expired) or someone else's when this view was read: no renew on our revision can succeed
                whose = "expired" if holder is None else f"held by {holder.instance}"
                effects += self._lost(lease, LeaseEvent.LOST, f"suspended, and its key is {whose}")
            if lease.machine.standby:
                lease.revision = free.get(name, 0) if holder is None else holder.revision
        effects += self._decide(now)
        return effects

    def view_failed(self, reason: str, now: float) -> list[FleetEffect]:
        """The bucket could not be read; the leases held keep being renewed (renewals do not need a view)."""
        self._viewing = False
        return [Notice("fleet.view_failed", "warning", {"reason": reason})]

    def presence_written(self, now: float) -> list[FleetEffect]:
        """The presence key was written."""
        if not self._presence_ok:
            self._presence_ok = True
            self._joined_at = now
            # the first view that may decide: one that can include peers started with us (see ``joining``)
            self._next_view = now + self.timing.join_wait
        return []

    def settled(self) -> bool:
        """Every configured lease is ours or held by another live process: nothing waits for an owner."""
        for name in self.units:
            lease = self.leases[name]
            if lease.machine.kept:
                continue
            holder = self.holders.get(name)
            if holder is None or holder.incarnation == self.incarnation:
                return False
        return self._presence_ok

    def presence_failed(self, reason: str, now: float) -> list[FleetEffect]:
        """The presence key could not be written: try again soon."""
        self._next_presence = now + min(1.0, self.timing.renew_every / 3)
        return [Notice("fleet.presence_failed", "warning", {"reason": reason})]

    def acquired(self, name: str, revision: int, sent_at: float, wall: float, now: float) -> list[FleetEffect]:
        """The lease ``name`` is ours at ``revision``; the write was sent at ``sent_at``."""
        lease = self._answered(name, LeaseEvent.ACQUIRED)
        if lease is None:
            return []
        lease.changes += 1
        lease.term += 1
        lease.since_wall = wall
        self._written(lease, revision, sent_at)
        if not lease.holds(now):  # the reply came too late to act on: let it expire rather than act unfenced
            return self._lost(lease, LeaseEvent.LOST, "acquired too late to act on")
        effects: list[FleetEffect] = [
            Notice("lease.acquired", fields={**self._label(lease), "revision": revision, "instance": self.instance})
        ]
        if self.stopping or name not in self.units:
            return effects + self._hand_over(lease, "stopping" if self.stopping else "removed from the configuration")
        lease.running = set(lease.sources)
        return effects + [StartSource(source) for source in lease.sources]

    def acquire_failed(self, name: str, reason: str, now: float) -> list[FleetEffect]:
        """The create (or take-back) was refused or got no answer: someone else has it, or the next view decides."""
        lease = self._answered(name, LeaseEvent.ACQUIRE_FAILED)
        if lease is None:
            return []
        return [Notice("lease.acquire_failed", "debug", {**self._label(lease), "reason": reason})]

    def _answered(self, name: str, event: LeaseEvent) -> Lease | None:
        """The lease ``event`` moved along the table; None (and nothing changed) when it does not fit its state."""
        lease = self.leases.get(name)
        return lease if lease is not None and lease.machine.process(event) else None

    def renewed(self, name: str, revision: int, sent_at: float, now: float) -> list[FleetEffect]:
        """A renew succeeded: the fence moves to ``sent_at + ttl - guard``. A suspended lease resumes if that fence
        is open now (``renewed_late`` otherwise: the next renew goes out at once)."""
        lease = self.leases.get(name)
        if lease is None:
            return []
        resuming, waited = lease.machine.suspended, lease.machine.release_waits
        event = LeaseEvent.RENEWED
        if resuming and now >= max(lease.renewed_at, sent_at) + self.timing.ttl - self.timing.guard:
            event = LeaseEvent.RENEWED_LATE
        if not lease.machine.process(event):
            return []
        lease.renewals += 1
        lease.failing = 0
        self._written(lease, revision, sent_at)
        if waited:
            lease.valid_until = -math.inf  # the sources stopped: the renew moves the revision, not the fence
            return self._release_after_renew(lease, waited)
        if not resuming or event is LeaseEvent.RENEWED_LATE:
            return []
        notice = Notice(
            "lease.resumed",
            fields={**self._label(lease), "paused_for": round(now - lease.suspended_at, 3), "revision": revision},
        )
        effects: list[FleetEffect] = [notice, *(ResumeSource(source) for source in sorted(lease.running))]
        for source in lease.sources:  # fenced meanwhile, or added by a reload while suspended
            if source not in lease.running:
                lease.running.add(source)
                effects.append(StartSource(source))
        return effects

    def renew_failed(self, name: str, reason: str, definitive: bool, now: float) -> list[FleetEffect]:
        """A renew failed. ``definitive``: the key is no longer on our revision (someone else's, or expired)."""
        lease = self.leases.get(name)
        if definitive:
            if lease is None or not lease.machine.can(LeaseEvent.RENEW_REFUSED):
                return []
            lease.renew_failures += 1
            return self._lost(lease, LeaseEvent.RENEW_REFUSED, f"renew refused: {reason}")
        waited = lease is not None and lease.machine.release_waits
        if lease is None or not lease.machine.process(LeaseEvent.RENEW_FAILED):
            return []
        if waited:  # the renew may have landed or not: the delete tries our last known revision
            return self._release_after_renew(lease, waited)
        lease.renew_failures += 1
        lease.failing += 1
        # try again soon: the fence still has time (a renew is due every ttl/3, the fence closes at 4/5 ttl)
        lease.next_renew = now + min(1.0, self.timing.renew_every / 3)
        self._due = min(self._due, lease.next_renew)
        if lease.failing % 5 != 1:
            return []  # retried a few times a second near the fence: the first failure and every fifth are news
        return [
            Notice(
                "lease.renew_failed",
                "warning",
                {
                    **self._label(lease),
                    "reason": reason,
                    "failures": lease.failing,
                    "fence_in": round(max(0.0, lease.valid_until - now), 3),
                },
            )
        ]

    def renew_adopted(self, name: str, revision: int, now: float) -> list[FleetEffect]:
        """A renew was refused, but the key holds our own incarnation at ``revision``: an earlier write of ours
        whose reply never came was stored after all. Nobody else wrote since, so the lease is still ours; the fence
        stays where the last *confirmed* write put it (this write's send time is unknown), and a renew goes out now.
        """
        waited = name in self.leases and self.leases[name].machine.release_waits
        lease = self._answered(name, LeaseEvent.RENEW_ADOPTED)
        if lease is None:
            return []
        lease.revision = revision
        if waited:
            return self._release_after_renew(lease, waited)
        lease.next_renew = self._due = now
        return []

    def source_stopped(self, source: str, now: float) -> list[FleetEffect]:
        """A graceful StopSource of ``source`` finished: it drained. Once every source a handover stopped has, the
        lease's key is deleted (on our revision) if still ours."""
        lease = self.lease_of(source)
        if lease is None:
            return []
        lease.running.discard(source)
        if source not in lease.draining:
            return []  # a source removed from a lease that stays ours: nothing more to do
        lease.draining.discard(source)
        if lease.draining:
            return []
        return self._drained(lease, now)

    def source_fenced(self, source: str, term: int, now: float) -> list[FleetEffect]:
        """``source``, started in ``term``, found its fence closed at an action and stopped itself.

        The runtime checks the fence on the bridge's thread and takes renew replies on the fleet's, so a source can
        find the fence closed a moment before a renew whose reply was late moves it (its write, a compare-and-set
        on our revision, kept the key ours all along), and this report can reach the fleet before or after that
        reply. Either way the fleet must not go on counting the source as running: while the lease still holds
        (the reply came first) the source starts again under the moved fence; when it does not, the lease is
        suspended now, as the ticker would do (a runner waits at such a fence instead of stopping, so this is a
        source that stopped all the same), and the source starts again on the resumption. A report from an earlier
        term, or while the lease is being given up or lost (its stop reports the end), changes nothing.
        """
        lease = self.lease_of(source)
        if lease is None or lease.term != term or source not in lease.running or not lease.machine.kept:
            return []
        if not lease.holds(now):
            lease.running.discard(source)  # started again on the resumption (see renewed)
            return self._suspend(lease, now, f"{source} found the fence closed before a renew succeeded")
        notice = Notice(
            "source.restarted",
            "warning",
            {
                "source": source,
                "reason": "it found its fence closed while a late renew was on its way; the renew kept the lease",
                "fence_in": round(lease.valid_until - now, 3),
            },
        )
        return [notice, StartSource(source)]

    def _drained(self, lease: Lease, now: float | None) -> list[FleetEffect]:
        """Every source the handover stopped has drained (``now`` None: there was none): release the key."""
        if not lease.machine.can(LeaseEvent.SOURCE_STOPPED):
            return []
        if now is not None and not lease.holds(now):
            return self._lost(lease, LeaseEvent.LOST, "fence passed while draining")
        lease.machine.process(LeaseEvent.SOURCE_STOPPED)
        lease.valid_until = -math.inf  # the sources have stopped: nothing may act on them once the delete can land
        if lease.machine.release_waits:
            return []  # a renew is in flight: the delete goes out with its reply, on the revision it brings
        return [Release(lease.name, lease.revision)]

    def _release_after_renew(self, lease: Lease, waited: bool) -> list[FleetEffect]:
        """The delete a stopped lease's renew reply was waited for (``waited``: it was in RELEASING_RENEWING)."""
        if not waited or lease.machine.release_waits or not lease.machine.can(LeaseEvent.RELEASED):
            return []
        return [Release(lease.name, lease.revision)]

    def released(self, name: str, ok: bool, reason: str, now: float) -> list[FleetEffect]:
        """The delete was made (or could not be: then the key expires by itself). The lease is free either way."""
        lease = self._answered(name, LeaseEvent.RELEASED)
        if lease is None:
            return []
        lease.valid_until = lease.renewed_at = -math.inf
        lease.changes += 1
        lease.free_since = now if ok else None
        fields: dict[str, object] = {**self._label(lease), "instance": self.instance}
        if not ok:
            fields["reason"] = reason
        effects: list[FleetEffect] = [Notice("lease.released" if ok else "lease.release_failed", fields=fields)]
        if name not in self.units:
            del self.leases[name]
            self.generation += 1
        return effects

    # -- inputs: time and shutdown ----------------------------------------------------------------------------

    def next_tick(self) -> float:
        """The clock reading before which :meth:`tick` has nothing to do (a renew due, a fence to watch, the presence
        or the view due): the runtime may sleep until then, unless an input brings it sooner."""
        due = self._due
        if not self.stopping:
            due = min(due, self._next_presence)
        if not self._viewing:
            due = min(due, self._next_view)
        return due

    def tick(self, now: float) -> list[FleetEffect]:
        """Renewals due, fences passed, the bucket read and presence written when due."""
        effects: list[FleetEffect] = []
        if now >= self._due:  # a thousand leases renew every few seconds each: most ticks have nothing due
            due = math.inf
            for lease in list(self.leases.values()):
                machine = lease.machine
                if machine.source_runs and now >= lease.valid_until:
                    if machine.can(LeaseEvent.FENCE_PASSED):
                        effects += self._suspend(lease, now, "no renew succeeded in time")
                    else:
                        effects += self._lost(lease, LeaseEvent.LOST, "no renew succeeded in time")
                if machine.renews and now >= lease.next_renew and machine.process(LeaseEvent.RENEW_SENT):
                    # until the fence: a later reply still moves it. Suspended, a TTL: a reply too late to reopen
                    # the fence still names the revision stored, which the next renew must name (a renew that gave
                    # up would be followed by one refused for naming the one before)
                    wait = self.timing.ttl if machine.suspended else lease.valid_until - now
                    wait = max(self.timing.request_timeout, wait)
                    effects.append(Renew(lease.name, lease.revision, wait))
                if machine.source_runs:
                    due = min(due, lease.valid_until)
                if machine.renews:
                    due = min(due, lease.next_renew)
            self._due = due
        if not self.stopping and now >= self._next_presence:
            self._next_presence = now + self.timing.renew_every
            effects.append(WritePresence())
        if not self._viewing and now >= self._next_view:
            self._viewing = True
            self._next_view = now + self.timing.view_every
            effects.append(ReadView())
        return effects

    def shutdown(self, now: float) -> list[FleetEffect]:
        """Stop taking sources; drain and release every lease that is ours."""
        self.stopping = True
        effects: list[FleetEffect] = []
        for lease in list(self.leases.values()):
            if lease.machine.suspended:  # nothing can drain behind a closed fence: the key expires by itself
                effects += self._lost(lease, LeaseEvent.LOST, "shutting down while suspended")
            else:
                effects += self._hand_over(lease, "shutting down")  # only what is kept: the table says which
        return effects

    # -- decisions --------------------------------------------------------------------------------------------

    def preferred(self, name: str) -> str | None:
        """The instance that should own the lease ``name`` among the live members serving it (this one included)."""
        return self._assignment().get(name)

    def _assignment(self) -> dict[str, str]:
        """Every lease any live member serves (this one as configured now), with its preferred owner."""
        served: dict[str, set[str]] = {}
        for instance, member in self.members.items():
            if instance == self.instance or member.lease_groups != self.groups:
                continue  # our own presence as last written may be stale: decide from now
            for name in member.sources:
                served.setdefault(name, set()).add(instance)
        if not self.stopping:
            for name in self.units:
                served.setdefault(name, set()).add(self.instance)
        return bounded_assignment(served)

    def _candidates(self, name: str) -> set[str]:
        candidates = {
            instance
            for instance, member in self.members.items()
            if name in member.sources and member.lease_groups == self.groups
        }
        candidates.discard(self.instance)  # our own presence as last written may be stale: decide from now
        if name in self.units and not self.stopping:
            candidates.add(self.instance)
        return candidates

    def fair_share(self) -> int:
        """The most leases this process should own: its configured leases over the live members serving any."""
        mine = self.units.keys()
        live = {
            name
            for name, member in self.members.items()
            if member.lease_groups == self.groups and not member.sources.isdisjoint(mine)
        }
        return math.ceil(len(self.units) / len(live | {self.instance}))

    @property
    def joining(self) -> bool:
        """No view read since ``join_wait`` after our presence was first written: peers started with us may not
        be in the views yet, and a process that took every group it saw free would start them all only to hand
        two thirds over a moment later (three processes started together on 2,000 sources: the first did every
        set-up twice, ``bench fleet``)."""
        return self._view_at < self._joined_at + self.timing.join_wait

    def _decide(self, now: float) -> list[FleetEffect]:
        if self.stopping or not self._presence_ok or self.joining or self.foreign:
            # acquire only once the fleet can see us and we can see the peers that started with us (otherwise
            # every start would move sources twice), and never beside a process that leases by other keys: it
            # cannot see our leases, nor we its
            return []
        effects: list[FleetEffect] = []
        excess = sum(1 for lease in self.leases.values() if lease.machine.kept) - self.fair_share()
        assigned = self._assignment()
        for name in self.units:
            lease = self.leases[name]
            holder = self.holders.get(name)
            preferred = assigned.get(name)
            if lease.machine.serving:
                # sticky: a lease moves only off a process above its fair share, and only to its preferred member
                if excess > 0 and preferred is not None and preferred != self.instance and preferred in self.members:
                    excess -= 1
                    effects += self._hand_over(lease, f"rebalancing: preferred owner {preferred} is live")
            elif lease.machine.standby:
                if holder is not None:
                    if holder.incarnation == self.incarnation:
                        # our own key, which we stopped tracking (the fence closed during a bucket outage): nobody
                        # else wrote it since, so a write on its revision takes it back safely
                        effects += self._acquire(lease, holder.revision)
                    continue
                if self._held_per_source(lease):
                    continue
                if preferred == self.instance or self._next_in_line(name, lease):
                    effects += self._acquire(lease, lease.revision)
        return effects

    def _held_per_source(self, lease: Lease) -> bool:
        """A source of this group still has a live ``lease.<source>`` key of another process (one that leased per
        source, before lease groups): the group waits until that key is released or expires."""
        if not self._source_holders:
            return False
        for source in lease.sources:
            holder = self._source_holders.get(source)
            if holder is not None and holder.incarnation != self.incarnation:
                return True
        return False

    def _next_in_line(self, name: str, lease: Lease) -> bool:
        """A free lease that its preferred member is not taking (dead, its presence not expired yet, or stuck):
        after each TTL it stays free, the next member in its order may take it too. So the member that will be
        preferred once a dead one's presence has expired takes it first, and the lease does not move again
        (anyone taking it would hand it on as soon as the presence expired and left it above its fair share)."""
        if lease.free_since is None:
            return False
        waited = int((self._view_at - lease.free_since) // self.timing.ttl)
        return waited >= 1 and self.instance in preference_order(name, self._candidates(name))[: waited + 1]

    def _acquire(self, lease: Lease, revision: int) -> list[FleetEffect]:
        if not lease.machine.process(LeaseEvent.ACQUIRE_SENT):
            return []
        return [Acquire(lease.name, revision)]

    def _hand_over(self, lease: Lease, why: str) -> list[FleetEffect]:
        if not lease.machine.process(LeaseEvent.HAND_OVER):
            return []
        lease.draining = set(lease.sources) | lease.running
        effects: list[FleetEffect] = [Notice("lease.handing_over", fields={**self._label(lease), "reason": why})]
        effects += [StopSource(source, graceful=True) for source in sorted(lease.draining)]
        if not lease.draining:  # nothing to drain (a group whose sources were all removed meanwhile)
            effects += self._drained(lease, None)
        return effects

    def _suspend(self, lease: Lease, now: float, why: str) -> list[FleetEffect]:
        """The fence of a kept lease passed before a renew succeeded: nothing stops (the sources wait at their
        closed fence, keeping their state), a renew goes out at once unless one is in flight."""
        if not lease.machine.process(LeaseEvent.FENCE_PASSED):
            return []
        lease.suspended_at = now
        lease.next_renew = min(lease.next_renew, now)
        self._due = min(self._due, lease.next_renew)
        hint = (
            "its sources pause (publish and answer nothing) until a renew succeeds: the coordination servers "
            "answer late or not at all"
        )
        fields = {**self._label(lease), "reason": why, "since_renew": round(now - lease.renewed_at, 3), "hint": hint}
        return [Notice("lease.suspended", "warning", fields)]

    def _lost(self, lease: Lease, event: LeaseEvent, why: str) -> list[FleetEffect]:
        """``event`` (LOST or RENEW_REFUSED) took the lease from us: its sources stop at once, without draining."""
        if not lease.machine.process(event):
            return []
        stopped = sorted(set(lease.sources) | lease.running | lease.draining)
        lease.running, lease.draining = set(), set()
        lease.valid_until = lease.renewed_at = -math.inf
        lease.failing = 0
        lease.changes += 1
        lease.free_since = None
        notice = Notice("lease.lost", "error", {**self._label(lease), "reason": why, "instance": self.instance})
        return [notice, *(StopSource(source, graceful=False) for source in stopped)]

    def _label(self, lease: Lease) -> dict[str, object]:
        """How notices name a lease: its source, or its group and the sources it covers (a log is searched by
        source name)."""
        if self.groups <= 0:
            return {"source": lease.name}
        return {"group": lease.name, "sources": list(lease.sources)}

    def _written(self, lease: Lease, revision: int, sent_at: float) -> None:
        lease.revision = revision
        lease.renewed_at = max(lease.renewed_at, sent_at)
        lease.valid_until = lease.renewed_at + self.timing.ttl - self.timing.guard
        # each lease renews a little early by an amount of its own (up to a quarter of the period): leases taken
        # together (hundreds at start-up) drift apart instead of renewing in the same instant, where on a busy
        # connection they would time out together. Earlier is always safe: the fence is counted from the write.
        lease.next_renew = sent_at + self.timing.renew_every * (1.0 - _renew_spread(lease.name))
        self._due = min(self._due, lease.next_renew)


class Fence:
    """The fence of one source for one term of its lease: calling it says whether this process may act on the
    source now (False once that term's lease may have passed, or the source was removed and added again).

    Compiled with the core (a source calls it before every publish and answer: one or two calls per replicated
    message); ``clock`` is the runtime's lease clock (``bridge.runtime.fleet.lease_clock``), read at each call."""

    __slots__ = ("_clock", "_fleet", "_lease", "_seen", "source", "term")

    def __init__(self, fleet: Fleet, source: str, lease: Lease | None, clock: Callable[[], float]) -> None:
        self._fleet = fleet
        self._lease = lease
        self._clock = clock
        self._seen = -1  # the fleet's ``generation`` when ``lease`` was last found to be the source's
        self.source = source
        self.term = lease.term if lease is not None else -1

    def __call__(self) -> bool:
        lease = self._term()
        return lease is not None and lease.holds(self._clock())

    def waiting(self) -> bool:
        """The same lease in the same term, kept (not lost, not being given up): a closed fence may open again
        (the lease is suspended, or about to be: the ticker has not seen the fence pass yet)."""
        lease = self._term()
        return lease is not None and lease.machine.kept

    def _term(self) -> Lease | None:
        """The lease this fence was bound to, while it is still the source's (a source removed and added again has
        a new one) and in the same term; else None. The source's lease is looked up again only after the fleet's
        ``generation`` moved."""
        lease = self._lease
        if lease is None or lease.term != self.term:
            return None
        generation = self._fleet.generation
        if generation != self._seen:
            if self._fleet.lease_of(self.source) is not lease:
                return None
            self._seen = generation
        return lease
