"""Performs what :class:`bridge.core.fleet.Fleet` decides: KV reads and writes, sources started and stopped.

Tasks (all in :meth:`FleetRunner.run`'s task group): the ticker, which feeds the clock to the core when the core says
something is due (``Fleet.next_tick``: a renew, a fence, the view, the presence; at most every ``TICK``, at least
every ``TICK_MAX``; an input that brings something sooner wakes it) and performs the effects it returns; one short
task per KV request (a slow write never delays a renew of another lease), except renewals, which are sent without
one and answered by a callback (:meth:`KvBucket.write_soon`: the most frequent request, a hundred lease groups
renewed every few seconds); one task per graceful source stop (it
drains, then the core releases the key). A source that loses its lease is stopped at once, without draining: the
fence is closed, so it may not answer or publish anything more. A source whose lease is suspended (its fence passed
before a renew succeeded) is not stopped: it waits at its closed fence and is resumed once a renew reopens it
(``ResumeSource``).

Shutdown (``stop`` set): every source this process owns drains and is released, each key deleted on the revision
this process wrote, so a twin takes it over at its next view instead of after the TTL; then the presence key is
deleted. Bounded: a lease whose source does not drain in time expires by itself.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup

from bridge.core.backoff import Backoff
from bridge.core.effects import Notice
from bridge.core.fleet import (
    PRESENCE_PREFIX,
    Acquire,
    Fence,
    Fleet,
    FleetEffect,
    LeaseState,
    LeaseTiming,
    ReadView,
    Release,
    Renew,
    ResumeSource,
    StartSource,
    StopSource,
    WritePresence,
)
from bridge.errors import BridgeError
from bridge.io.kv import KvBucket, KvConflict, json_object, parse_view
from bridge.logs import Throttle, get_logger
from bridge.observe.metrics import FleetSnapshot, LeaseSnapshot
from bridge.runtime.retry import RetryPolicy, RetryStep, retry_until_stopped
from bridge.runtime.waits import WaitLog

# A thousand leases renewing every few seconds each would wake the ticker a thousand times in that while: at most
# every TICK, so the renewals due within it leave together (a renew a quarter second early costs nothing; the fence
# is the clock's, not the ticker's).
TICK = 0.25
TICK_MAX = 1.0
SETUP_RETRY = RetryPolicy(Backoff(1.0, 15.0))  # the coordination bucket: the same failure logged every 30 s at most


# The fence's clock: CLOCK_BOOTTIME where there is one (Linux), which also counts time the machine spent suspended;
# CLOCK_MONOTONIC stops then, and a resumed process would believe its lease younger than it is. A C callable, not a
# function of ours: every fence look reads it (one or two per replicated message).
lease_clock: Callable[[], float] = (
    partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic
)


_T = TypeVar("_T")


class SourceControl:
    """What the fleet asks of the bridge: start a source under a fence, stop it gracefully, drop it at once, or
    resume one that waited at its closed fence (its lease was suspended and is renewed)."""

    def __init__(
        self,
        start: Callable[[str, Fence], None],
        stop: Callable[[str], Awaitable[None]],
        abandon: Callable[[str], None],
        resume: Callable[[str], None],
    ) -> None:
        self.start = start
        self.stop = stop
        self.abandon = abandon
        self.resume = resume


class FleetRunner:
    """Runs this process's side of the fleet until ``stop`` is set and every lease it held is released."""

    def __init__(
        self,
        kv: KvBucket,
        *,
        instance: str,
        sources: list[str],
        ttl: float,
        replicas: int,
        control: SourceControl,
        lease_groups: int = 0,
        shutdown_grace: float,
        clock: Callable[[], float] = lease_clock,
    ) -> None:
        self.kv = kv
        self.instance = instance
        self.incarnation = os.urandom(6).hex()
        self.host = socket.gethostname()
        self.configured_ttl = ttl
        self.replicas = replicas
        self.control = control
        self.shutdown_grace = shutdown_grace
        self.clock = clock
        self.log = get_logger(component="fleet", instance=instance)
        self.fleet = Fleet(instance, self.incarnation, sources, LeaseTiming(ttl), clock(), lease_groups)
        self._tg: TaskGroup | None = None
        self._changed = anyio.Event()  # set after every input the core was fed
        self._sooner = anyio.Event()  # set when an input brought the next tick before the ticker's planned wake
        self._wake_at = -math.inf  # (clock) when the ticker plans to tick next
        # the core is fed on the fleet's own thread (bridge.runtime.fleet_thread); what reads it from elsewhere and
        # iterates (snapshot, settled) takes this lock. Fences read single values and need none.
        self._lock = threading.Lock()
        self._waits: dict[str, WaitLog] = {}  # per source: waiting for its lease while another process owns it
        self._standby_seen: object = None  # what the last view's _note_standby found (the same again: nothing to do)
        self._throttles = {event: Throttle() for event in ("fleet.view_failed", "fleet.presence_failed")}

    # -- views for the bridge --------------------------------------------------------------------------------

    def fence(self, source: str) -> Fence:
        """A check bound to the current term of ``source``: False once that term's lease may have passed (always,
        for a source not configured any more)."""
        return Fence(self.fleet, source, self.fleet.lease_of(source), self.clock)

    def source_fenced(self, fence: Fence) -> None:
        """The source ``fence`` guarded found it closed and stopped itself (the fleet may start it again)."""
        self._feed(partial(self.fleet.source_fenced, fence.source, fence.term, self.clock()))

    def holds(self, source: str) -> bool:
        """The fence of ``source`` now: this process may act on it."""
        return self.fleet.holds(source, self.clock())

    def ready(self) -> bool:
        """The bucket was read within a TTL: this process knows who owns what."""
        return self.clock() - self.fleet.view_age_origin < self.fleet.timing.ttl

    def settled(self) -> bool:
        """Every configured source has an owner (this process or another live one)."""
        with self._lock:
            return self.fleet.settled()

    def snapshot(self) -> FleetSnapshot:
        """The fleet as this process sees it now."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> FleetSnapshot:
        now = self.clock()
        fleet = self.fleet
        leases = []
        for name in fleet.configured:
            lease = fleet.lease_of(name)
            assert lease is not None  # every configured source has its lease
            holder = fleet.holder_of(name)
            owned = lease.owned
            leases.append(
                LeaseSnapshot(
                    source=name,
                    owned=owned,
                    state=lease.public_state,
                    owner=self.instance if owned else (holder.instance if holder else ""),
                    owner_host=self.host if owned else (holder.host if holder else ""),
                    owner_since=lease.since_wall if owned else (holder.since if holder else None),
                    renewals=lease.renewals,
                    renew_failures=lease.renew_failures,
                    ownership_changes=lease.changes,
                    seconds_since_renew=(now - lease.renewed_at) if owned else None,
                )
            )
        return FleetSnapshot(
            instance=self.instance,
            bucket=self.kv.bucket,
            ttl=fleet.timing.ttl,
            ready=self.ready(),
            members=tuple(sorted(fleet.members)),
            leases=tuple(leases),
        )

    def set_sources(self, sources: list[str]) -> None:
        """A reload changed the configured sources (called on the fleet's own loop)."""
        self._feed(partial(self.fleet.set_sources, sources, self.clock()))

    # -- life cycle ---------------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event) -> None:
        """Join the fleet, own what falls to this process, and leave it cleanly once ``stop`` is set."""
        if not await self._ensure_bucket(stop):
            return
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._ticker)
                await stop.wait()
                self.log.info("fleet.leaving", owned=self.fleet.owned())
                self._feed(partial(self.fleet.shutdown, self.clock()))
                with anyio.move_on_after(self.shutdown_grace + 5.0):
                    while not self.fleet.done:  # the core says when every lease is given back
                        self._changed = anyio.Event()
                        await self._changed.wait()
                if not self.fleet.done:
                    self.log.warning(
                        "fleet.leave_incomplete", owned=self.fleet.owned(), hint="those leases expire by TTL"
                    )
                with anyio.move_on_after(self.fleet.timing.request_timeout + 0.5):
                    try:
                        await self.kv.write(
                            PRESENCE_PREFIX + self.instance, b"", None, self.fleet.timing.request_timeout, delete=True
                        )
                    except BridgeError as exc:
                        self.log.debug("fleet.presence_delete_failed", error=str(exc))
                tg.cancel_scope.cancel()
        finally:
            self._tg = None  # a renewal answered from now on has nobody left to tell
        self.log.info("fleet.left")

    async def _ensure_bucket(self, stop: anyio.Event) -> bool:
        def report(exc: BaseException, step: RetryStep) -> None:
            if step.report:
                self.log.error(
                    "fleet.bucket_unavailable",
                    bucket=self.kv.bucket,
                    error=str(exc),
                    attempts=step.attempt,
                    similar_suppressed=step.suppressed,
                    retry_in=round(step.delay, 3),
                    hint="no source is replicated until the coordination bucket can be used (see README, Deployment)",
                )

        async def attempt() -> float:
            return await self.kv.ensure(self.configured_ttl, self.replicas, 5.0)

        ttl = await retry_until_stopped(stop, attempt, SETUP_RETRY, retry_on=(BridgeError,), kind=str, report=report)
        if ttl is None:
            return False
        if abs(ttl - self.configured_ttl) > 1e-3:
            self.log.warning(
                "fleet.ttl_from_bucket",
                bucket=self.kv.bucket,
                bucket_ttl=ttl,
                configured=self.configured_ttl,
                hint="the bucket's max_age is what the server enforces; leases are timed by it",
            )
            self.fleet.timing = LeaseTiming(ttl)
        self.log.info(
            "fleet.joined",
            bucket=self.kv.bucket,
            ttl=ttl,
            incarnation=self.incarnation,
            sources=self.fleet.configured,
        )
        return True

    async def _ticker(self) -> None:
        while True:
            now = self.clock()
            self._wake_at = -math.inf  # nothing wakes a ticker that is ticking
            self._feed(partial(self.fleet.tick, now))
            delay = min(TICK_MAX, max(TICK, self.fleet.next_tick() - now))
            self._sooner = anyio.Event()
            self._wake_at = now + delay
            with anyio.move_on_after(delay):
                await self._sooner.wait()

    # -- effects ------------------------------------------------------------------------------------------------

    def _feed(self, step: Callable[[], list[FleetEffect]]) -> None:
        """Give the core one input (``step`` calls it) and perform what it returns, under the lock."""
        with self._lock:
            self._perform(step())
            if self.fleet.next_tick() < self._wake_at:
                self._wake_at = -math.inf
                self._sooner.set()

    def _perform(self, effects: list[FleetEffect]) -> None:
        self._changed.set()
        for effect in effects:
            if isinstance(effect, Notice):
                self._notice(effect)
            elif isinstance(effect, StartSource):
                self._wait(effect.source).end("lease")
                self.control.start(effect.source, self.fence(effect.source))
            elif isinstance(effect, ResumeSource):
                self.control.resume(effect.source)
            elif isinstance(effect, StopSource):
                if effect.graceful:
                    self._spawn(self._stop_gracefully, effect.source)
                else:
                    self.control.abandon(effect.source)
            elif not (isinstance(effect, Renew) and self._renew_soon(effect)):
                self._spawn(self._request, effect)

    def _notice(self, notice: Notice) -> None:
        throttle = self._throttles.get(notice.event)
        if throttle is None:
            getattr(self.log, notice.level)(notice.event, **notice.fields)
            return
        # the same failure of the bucket read or the presence write, retried every view: once per 30 s, counted
        suppressed = throttle.allow(self.clock(), notice.fields.get("reason"))
        if suppressed is not None:
            getattr(self.log, notice.level)(notice.event, **notice.fields, similar_suppressed=suppressed)

    def _wait(self, source: str) -> WaitLog:
        wait = self._waits.get(source)
        if wait is None:
            wait = self._waits[source] = WaitLog(get_logger(source=source), self.clock)
        return wait

    def _note_standby(self) -> None:
        """After a view: each source another live process owns is waited for (``source.waiting for=lease``,
        logged when this process becomes its standby and when its owner changes, not per view). Looked at per
        lease, and past the leases only when one of them, its holder or the configuration changed since the last
        view: most views change none, and a walk of every source on each (two look-ups each) was a fifth of what
        the fleet's thread did in a process of 1,000 idle sources."""
        fleet = self.fleet
        standby: dict[str, tuple[str, str, str, int]] = {}
        for unit in fleet.units:
            lease, holder = fleet.leases.get(unit), fleet.holders.get(unit)
            if lease is None or lease.state is not LeaseState.STANDBY or holder is None:
                continue
            if holder.instance != self.instance:
                # ``changes``: a term of ours between two views (its start ended the wait) begins it again
                standby[unit] = (holder.instance, holder.incarnation, holder.host, lease.changes)
        seen = (fleet.generation, standby)
        if seen == self._standby_seen:
            return
        self._standby_seen = seen
        for unit, (owner, incarnation, host, _) in standby.items():
            for name in fleet.units[unit]:
                self._wait(name).begin(
                    "lease",
                    level="info",
                    key=(owner, incarnation),
                    role="standby",
                    owner=owner,
                    owner_host=host or None,
                    instance=self.instance,
                )
        configured = set(fleet.configured)
        for name in [n for n in self._waits if n not in configured]:
            del self._waits[name]  # removed from the configuration: nothing to wait for

    def _spawn(self, func: Callable[[_T], Coroutine[Any, Any, None]], arg: _T) -> None:
        assert self._tg is not None
        self._tg.start_soon(func, arg)

    async def _stop_gracefully(self, source: str) -> None:
        await self.control.stop(source)
        self._feed(partial(self.fleet.source_stopped, source, self.clock()))

    async def _request(self, effect: ReadView | WritePresence | Acquire | Renew | Release) -> None:
        fleet, timeout = self.fleet, self.fleet.timing.request_timeout
        sent_at = self.clock()
        if isinstance(effect, ReadView):
            try:
                view = parse_view(await self.kv.read_all(timeout))
            except BridgeError as exc:
                self._feed(partial(fleet.view_failed, str(exc), self.clock()))
                return
            self._feed(partial(fleet.viewed, view, sent_at, self.clock()))
            self._note_standby()
        elif isinstance(effect, WritePresence):
            presence = {
                "instance": self.instance,
                "incarnation": self.incarnation,
                "host": self.host,
                "pid": os.getpid(),
                # a version before lease groups reads "sources" (and no "lease_groups"): with groups it must not
                # count this process as serving its sources, so it finds none there
                "sources": [] if fleet.groups else list(fleet.units),
                "units": list(fleet.units),
                "lease_groups": fleet.groups,
            }
            try:
                await self.kv.write(PRESENCE_PREFIX + self.instance, _encode(presence), None, timeout)
            except BridgeError as exc:
                self._feed(partial(fleet.presence_failed, str(exc), self.clock()))
                return
            self._feed(partial(fleet.presence_written, self.clock()))
        elif isinstance(effect, Acquire):
            since = time.time()
            key = fleet.key_prefix + effect.lease
            try:
                revision = await self.kv.write(key, self._holder_value(since), effect.revision, timeout)
            except BridgeError as exc:
                self._feed(partial(fleet.acquire_failed, effect.lease, str(exc), self.clock()))
                return
            self._feed(partial(fleet.acquired, effect.lease, revision, sent_at, since, self.clock()))
        elif isinstance(effect, Renew):
            try:
                revision = await self.kv.write(
                    fleet.key_prefix + effect.lease, self._renewal(effect), effect.revision, effect.timeout
                )
            except BridgeError as exc:
                self._renew_answered(effect.lease, sent_at, None, exc)
                return
            self._renew_answered(effect.lease, sent_at, revision, None)
        else:
            try:
                await self.kv.write(fleet.key_prefix + effect.lease, b"", effect.revision, timeout, delete=True)
            except BridgeError as exc:
                self._feed(partial(fleet.released, effect.lease, False, str(exc), self.clock()))
                return
            self._feed(partial(fleet.released, effect.lease, True, "", self.clock()))

    def _renew_soon(self, effect: Renew) -> bool:
        """Send a renewal without a task (:meth:`KvBucket.write_soon`); False when it must take :meth:`_request`."""
        sent_at = self.clock()

        def written(revision: int | None, error: BridgeError | None) -> None:
            if self._tg is not None:  # an answer after the fleet was left: nothing is listening any more
                self._renew_answered(effect.lease, sent_at, revision, error)

        key = self.fleet.key_prefix + effect.lease
        return self.kv.write_soon(key, self._renewal(effect), effect.revision, effect.timeout, written)

    def _renewal(self, effect: Renew) -> bytes:
        lease = self.fleet.leases.get(effect.lease)
        return self._holder_value(lease.since_wall if lease is not None else time.time())

    def _renew_answered(self, name: str, sent_at: float, revision: int | None, error: BridgeError | None) -> None:
        """What a renewal's answer means for the core (a refused revision asks the key who wrote it first)."""
        if isinstance(error, KvConflict):
            assert self._tg is not None
            self._tg.start_soon(self._renew_refused, name, str(error))
        elif error is not None:
            self._feed(partial(self.fleet.renew_failed, name, str(error), False, self.clock()))
        else:
            assert revision is not None
            self._feed(partial(self.fleet.renewed, name, revision, sent_at, self.clock()))

    async def _renew_refused(self, name: str, reason: str) -> None:
        # the key moved past the revision we named: someone else's write, or an earlier one of ours whose reply
        # was lost (a timeout that was stored after all). Only the key itself tells which.
        try:
            entry = await self.kv.get(self.fleet.key_prefix + name, self.fleet.timing.request_timeout)
        except BridgeError as exc:
            self._feed(partial(self.fleet.renew_failed, name, f"{reason}; then {exc}", False, self.clock()))
            return
        if entry is not None and not entry.deleted and json_object(entry.value).get("incarnation") == self.incarnation:
            self._feed(partial(self.fleet.renew_adopted, name, entry.revision, self.clock()))
        else:
            self._feed(partial(self.fleet.renew_failed, name, reason, True, self.clock()))

    def _holder_value(self, since: float) -> bytes:
        return _encode(
            {
                "instance": self.instance,
                "incarnation": self.incarnation,
                "host": self.host,
                "pid": os.getpid(),
                "since": since,
            }
        )


def _encode(value: dict[str, object]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
