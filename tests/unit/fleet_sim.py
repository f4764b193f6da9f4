"""A deterministic simulation of a fleet: several :class:`bridge.core.fleet.Fleet` cores against a model KV bucket.

The model keeps what the server keeps: per key the last revision, its value (the writer's incarnation, or a delete
marker) and when it was stored; a key is gone ``ttl`` after that (the bucket's ``max_age``). Writes are
compare-and-set on the revision exactly as ``Nats-Expected-Last-Subject-Sequence`` is. Every request travels with
a delay to the server and back, and may be lost either way (the client then sees a timeout after
``request_timeout``); processes can be frozen (their clock runs on, they do nothing), cut off from the bucket,
killed and restarted (a new incarnation). All times are one real clock, as a monotonic clock running at the same
rate everywhere would give.

:meth:`FleetSim.check` states the safety property the fence exists for: whenever a process's fence says it may act
on a source, the bucket holds that source's key at the revision that process last wrote, unexpired, so no other
process can have acquired it since. And the one a suspension relies on: a source resumed (``ResumeSource``, its
runner kept from before the pause) was acted on by no other process since this one last did.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from bridge.core.effects import Notice
from bridge.core.fleet import (
    GROUP_PREFIX,
    LEASE_PREFIX,
    PRESENCE_PREFIX,
    Acquire,
    Fence,
    Fleet,
    FleetEffect,
    Holder,
    Lease,
    LeaseState,
    LeaseTiming,
    Member,
    ReadView,
    Release,
    Renew,
    ResumeSource,
    StartSource,
    StopSource,
    View,
    WritePresence,
)


@dataclass(slots=True)
class Stored:
    revision: int
    incarnation: str | None  # None: a delete marker
    instance: str
    stored_at: float
    sources: frozenset[str] = frozenset()
    lease_groups: int = 0


class ModelKv:
    """The bucket: CAS writes, delete markers, expiry ``ttl`` after the last store of a key."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.seq = 0
        self.keys: dict[str, Stored] = {}

    def live(self, now: float) -> dict[str, Stored]:
        for key in [k for k, v in self.keys.items() if now >= v.stored_at + self.ttl]:
            del self.keys[key]
        return self.keys

    def write(
        self,
        key: str,
        incarnation: str | None,
        instance: str,
        expected: int | None,
        now: float,
        sources: frozenset[str],
        lease_groups: int = 0,
    ) -> int | None:
        """The new revision, or None when ``expected`` does not match (a refused compare-and-set)."""
        current = self.live(now).get(key)
        if expected is not None and (current.revision if current is not None else 0) != expected:
            return None
        self.seq += 1
        self.keys[key] = Stored(self.seq, incarnation, instance, now, sources, lease_groups)
        return self.seq


@dataclass(slots=True)
class Proc:
    instance: str
    incarnation: str
    fleet: Fleet
    alive: bool = True
    frozen_until: float = 0.0
    cut_until: float = 0.0
    running: set[str] = field(default_factory=set)  # sources whose runner is up
    terms: dict[str, int] = field(default_factory=dict)  # per running source: the term its fence is bound to
    # per source started: the runtime's fence (which caches its look-up) and the lease it was bound to
    fences: dict[str, tuple[Fence, Lease]] = field(default_factory=dict)
    stopping: set[str] = field(default_factory=set)  # graceful stops under way
    inbox: list[Callable[[], list[FleetEffect]]] = field(default_factory=list)  # replies while frozen


class FleetSim:
    """Processes sharing sources through one model bucket; ``step`` advances time and delivers what is due."""

    def __init__(
        self, sources: list[str], instances: list[str], ttl: float, rng: random.Random, groups: int = 0
    ) -> None:
        self.sources = sources
        self.groups = groups  # lease_groups of every process started (a test may change it between starts)
        self.ttl = ttl
        self.timing = LeaseTiming(ttl)
        self.kv = ModelKv(ttl)
        self.rng = rng
        self.now = 0.0
        self.lossy = 0.0  # probability a request or its reply is lost
        self.min_delay = 0.0  # each way: a request reaches the server, and its reply the client, in [min, max]
        self.stalled_until = 0.0  # the server takes no request before then (a starved hub), then serves them all
        self.fenced_anyway = 0.1  # how often a source whose lease is kept stops at its closed fence all the same
        self.max_delay = 0.05
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._incarnations = itertools.count()
        self.procs: dict[str, Proc] = {}
        self.trace: list[str] = []
        self.takeovers = 0
        self.resumptions = 0
        self.last_actor: dict[str, str] = {}  # per source, the incarnation whose fence was last seen open
        for name in instances:
            self.start(name)

    # -- processes -------------------------------------------------------------------------------------------

    def start(self, instance: str) -> None:
        incarnation = f"{instance}#{next(self._incarnations)}"
        self.procs[instance] = Proc(
            instance, incarnation, Fleet(instance, incarnation, self.sources, self.timing, self.now, self.groups)
        )

    def kill(self, instance: str) -> None:
        self.procs[instance].alive = False
        self.trace.append(f"{self.now:.2f} kill {instance}")

    def restart(self, instance: str) -> None:
        self.trace.append(f"{self.now:.2f} restart {instance}")
        self.start(instance)

    def freeze(self, instance: str, duration: float) -> None:
        self.procs[instance].frozen_until = self.now + duration
        self.trace.append(f"{self.now:.2f} freeze {instance} {duration:.2f}")

    def cut(self, instance: str, duration: float) -> None:
        self.procs[instance].cut_until = self.now + duration
        self.trace.append(f"{self.now:.2f} cut {instance} {duration:.2f}")

    def stall(self, duration: float) -> None:
        self.stalled_until = self.now + duration
        self.trace.append(f"{self.now:.2f} stall {duration:.2f}")

    def shutdown(self, instance: str) -> None:
        proc = self.procs[instance]
        self.trace.append(f"{self.now:.2f} shutdown {instance}")
        self._feed(proc, lambda: proc.fleet.shutdown(self.now))

    # -- time ------------------------------------------------------------------------------------------------

    def run_for(self, duration: float, tick: float = 0.05) -> None:
        end = self.now + duration
        while self.now < end:
            self.step(min(tick, end - self.now))

    def step(self, dt: float) -> None:
        target = self.now + dt
        for proc in self.procs.values():
            # its sources act at some moment of the step: between a fence passing and a renew's reply, say
            self._at(self.now + self.rng.uniform(0.0, dt), lambda p=proc: self._act(p))  # type: ignore[misc]
        while self._events and self._events[0][0] <= target:
            at, _, action = heapq.heappop(self._events)
            self.now = max(self.now, at)
            action()
            self.check()
        self.now = target
        for proc in list(self.procs.values()):
            if proc.alive and self.now >= proc.frozen_until:
                pending, proc.inbox = proc.inbox, []
                for feed in pending:
                    self._feed(proc, feed)
                self._feed(proc, lambda p=proc: p.fleet.tick(self.now))  # type: ignore[misc]
        self.check()

    def _act(self, proc: Proc) -> None:
        """The running sources act, each checking its fence first (as ``SourceRunner.may_act``): one that finds it
        closed for good stops itself and is reported (the runtime's ``source_fenced``); one whose lease is kept
        (suspended, or about to be) waits, keeping its runner, except now and then (a runner that stopped all the
        same: the core must start it again on the resumption). A draining source's stop is already under way: the
        runtime reports its end as ``source_stopped`` only."""
        if not proc.alive or self.now < proc.frozen_until or self.procs.get(proc.instance) is not proc:
            return
        fleet = proc.fleet
        for lease in list(fleet.leases.values()):
            if lease.holds(self.now) or (lease.machine.kept and self.rng.random() >= self.fenced_anyway):
                continue
            for source in sorted((set(lease.sources) & proc.running) - proc.stopping):
                proc.running.discard(source)
                term = proc.terms[source]
                self.trace.append(f"{self.now:.2f} {proc.instance} {source} fenced")
                self._feed(proc, lambda s=source, t=term: fleet.source_fenced(s, t, self.now))  # type: ignore[misc]

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    # -- effects ---------------------------------------------------------------------------------------------

    def _feed(self, proc: Proc, feed: Callable[[], list[FleetEffect]]) -> None:
        if not proc.alive:
            return
        if self.now < proc.frozen_until:
            proc.inbox.append(feed)
            return
        for effect in feed():
            self._perform(proc, effect)

    def _perform(self, proc: Proc, effect: FleetEffect) -> None:
        fleet = proc.fleet
        if isinstance(effect, Notice):
            self.trace.append(f"{self.now:.2f} {proc.instance} {effect.event} {dict(effect.fields)}")
        elif isinstance(effect, StartSource):
            assert fleet.holds(effect.source, self.now), "started a source without holding its lease"
            assert effect.source not in proc.running
            proc.running.add(effect.source)
            lease = fleet.lease_of(effect.source)
            assert lease is not None
            proc.terms[effect.source] = lease.term
            proc.fences[effect.source] = (Fence(fleet, effect.source, lease, lambda: self.now), lease)
            self.takeovers += 1
        elif isinstance(effect, ResumeSource):
            assert fleet.holds(effect.source, self.now), "resumed a source without holding its lease"
            assert effect.source in proc.running, "resumed a source whose runner is gone"
            lease = fleet.lease_of(effect.source)
            assert lease is not None and proc.terms[effect.source] == lease.term, "resumed in another term"
            assert self.last_actor.get(effect.source) == proc.incarnation, (
                f"{self.now:.3f}: {proc.instance} resumed {effect.source} after "
                f"{self.last_actor.get(effect.source)} acted on it\n" + "\n".join(self.trace[-30:])
            )
            self.resumptions += 1
        elif isinstance(effect, StopSource):
            if effect.graceful:
                proc.stopping.add(effect.source)
                # draining takes a moment; then the core releases
                self._at(self.now + self.rng.uniform(0.0, 0.3), lambda: self._stopped(proc, effect.source))
            else:
                proc.running.discard(effect.source)
        else:
            self._request(proc, effect)

    def _stopped(self, proc: Proc, source: str) -> None:
        if source in proc.stopping and proc.alive and proc.incarnation == self.procs[proc.instance].incarnation:
            proc.stopping.discard(source)
            proc.running.discard(source)
            self._feed(proc, lambda: proc.fleet.source_stopped(source, self.now))

    def _request(self, proc: Proc, effect: ReadView | WritePresence | Acquire | Renew | Release) -> None:
        sent_at = self.now
        timeout = effect.timeout if isinstance(effect, Renew) else self.timing.request_timeout
        cut = self.now < proc.cut_until
        lost_out = cut or self.rng.random() < self.lossy
        arrive = max(self.now + self.rng.uniform(self.min_delay, self.max_delay), self.stalled_until)
        back = arrive + self.rng.uniform(self.min_delay, self.max_delay)
        lost_back = lost_out or self.rng.random() < self.lossy or back > sent_at + timeout

        def fail(reason: str) -> Callable[[], list[FleetEffect]]:
            fleet = proc.fleet
            if isinstance(effect, ReadView):
                return lambda: fleet.view_failed(reason, self.now)
            if isinstance(effect, WritePresence):
                return lambda: fleet.presence_failed(reason, self.now)
            if isinstance(effect, Acquire):
                return lambda: fleet.acquire_failed(effect.lease, reason, self.now)
            if isinstance(effect, Renew):
                return lambda: fleet.renew_failed(effect.lease, reason, False, self.now)
            return lambda: fleet.released(effect.lease, False, reason, self.now)

        result: list[Callable[[], list[FleetEffect]]] = []

        def at_server() -> None:
            result.append(self._serve(proc, effect, sent_at))

        if not lost_out:
            self._at(arrive, at_server)

        def at_client() -> None:
            if lost_back or not result:
                self._feed(proc, fail("timeout"))
            else:
                self._feed(proc, result[0])

        self._at(sent_at + timeout if lost_back else back, at_client)

    def _serve(
        self, proc: Proc, effect: ReadView | WritePresence | Acquire | Renew | Release, sent_at: float
    ) -> Callable[[], list[FleetEffect]]:
        fleet, kv = proc.fleet, self.kv
        if isinstance(effect, ReadView):
            view = self._view()
            return lambda: fleet.viewed(view, sent_at, self.now)
        if isinstance(effect, WritePresence):
            kv.write(
                PRESENCE_PREFIX + proc.instance,
                proc.incarnation,
                proc.instance,
                None,
                self.now,
                frozenset(fleet.units),
                fleet.groups,
            )
            return lambda: fleet.presence_written(self.now)
        key = fleet.key_prefix + effect.lease
        if isinstance(effect, Acquire):
            acquired = kv.write(key, proc.incarnation, proc.instance, effect.revision, self.now, frozenset())
            if acquired is None:
                return lambda: fleet.acquire_failed(effect.lease, "wrong last sequence", self.now)
            return lambda: fleet.acquired(effect.lease, acquired, sent_at, 0.0, self.now)
        if isinstance(effect, Renew):
            revision = kv.write(key, proc.incarnation, proc.instance, effect.revision, self.now, frozenset())
            if revision is None:
                current = kv.live(self.now).get(key)
                if current is not None and current.incarnation == proc.incarnation:
                    adopted = current.revision
                    return lambda: fleet.renew_adopted(effect.lease, adopted, self.now)
                return lambda: fleet.renew_failed(effect.lease, "wrong last sequence", True, self.now)
            return lambda: fleet.renewed(effect.lease, revision, sent_at, self.now)
        ok = kv.write(key, None, proc.instance, effect.revision, self.now, frozenset()) is not None
        return lambda: fleet.released(effect.lease, ok, "" if ok else "wrong last sequence", self.now)

    def _view(self) -> View:
        members: dict[str, Member] = {}
        kinds: dict[str, tuple[dict[str, Holder], dict[str, int]]] = {LEASE_PREFIX: ({}, {}), GROUP_PREFIX: ({}, {})}
        for key, stored in self.kv.live(self.now).items():
            if key.startswith(PRESENCE_PREFIX):
                members[stored.instance] = Member(
                    stored.instance, stored.incarnation or "", stored.sources, lease_groups=stored.lease_groups
                )
                continue
            prefix = LEASE_PREFIX if key.startswith(LEASE_PREFIX) else GROUP_PREFIX
            holders, free = kinds[prefix]
            if stored.incarnation is None:
                free[key[len(prefix) :]] = stored.revision
            else:
                holders[key[len(prefix) :]] = Holder(stored.instance, stored.incarnation, revision=stored.revision)
        (holders, free), (groups, free_groups) = kinds[LEASE_PREFIX], kinds[GROUP_PREFIX]
        return View(members=members, holders=holders, free=free, groups=groups, free_groups=free_groups)

    # -- invariants ------------------------------------------------------------------------------------------

    def check(self) -> None:
        """Safety: a process whose fence is open for a source is the one the bucket says holds it, right now, and
        no source has two processes whose fence is open (whatever key each leases it by)."""
        live = self.kv.live(self.now)
        acting: dict[str, str] = {}
        for proc in self.procs.values():
            if not proc.alive:
                continue
            fleet = proc.fleet
            for source, (fence, bound) in proc.fences.items():
                # the fence the runtime calls (its look-up cached) says what looking again says, whatever changed
                uncached = fleet.lease_of(source) is bound and bound.term == fence.term and bound.holds(self.now)
                assert fence() == uncached, (
                    f"{self.now:.3f}: {proc.instance}'s fence of {source} disagrees with its lease"
                )
            for source in self.sources:
                if fleet.holds(source, self.now):
                    lease = fleet.lease_of(source)
                    assert lease is not None
                    stored = live.get(fleet.key_prefix + lease.name)
                    assert stored is not None and stored.incarnation == proc.incarnation, (
                        f"{self.now:.3f}: {proc.instance} may act on {source} but the bucket has "
                        f"{stored!r}\n" + "\n".join(self.trace[-30:])
                    )
                    assert stored.revision >= lease.revision
                    assert source not in acting, f"{self.now:.3f}: {acting[source]} and {proc.instance} act on {source}"
                    acting[source] = proc.instance
                    self.last_actor[source] = proc.incarnation

    def owners(self) -> dict[str, list[str]]:
        """Per source, the live processes whose runner for it is up."""
        out: dict[str, list[str]] = {s: [] for s in self.sources}
        for proc in self.procs.values():
            if proc.alive:
                for source in proc.running:
                    out[source].append(proc.instance)
        return out

    def state(self, instance: str, source: str) -> LeaseState:
        lease = self.procs[instance].fleet.lease_of(source)
        assert lease is not None
        return lease.state
