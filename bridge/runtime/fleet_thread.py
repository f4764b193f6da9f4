"""The fleet on a thread and event loop of its own, so a lease is never lost because this process was busy.

Why: a process replicating a thousand sources can keep its event loop busy for seconds (a reconnect storm: every
source's recovery at once). Renewals sent and read on that loop waited behind all of it, were late together, and
every lease was lost in the same second: the collapse issue 25 measured (``bench edge`` at 1,000 sources). Here the
fleet (its core, its KV connection, its ticker) runs an asyncio loop in a thread of its own. The main loop's work
does not delay it: the interpreter lock passes to a waiting thread at least every switch interval (5 ms), whatever
the other loop does, so a renewal is late by milliseconds, not by the backlog.

What crosses between the two loops, and how (each direction posts, neither waits for the other):

* fleet to bridge: start a source under its fence, abandon one (its fence is already closed), resume one that
  waited at its fence (its lease was suspended), drain one. Posted to
  the bridge's loop through a :class:`Mailbox`; a drain's end is posted back to the fleet's loop the same way.
* bridge to fleet: a reload's source list, and leave. Posted to the fleet's loop.
* Fences, ``holds`` and ``ready`` read single values only the fleet's thread writes (atomic under the interpreter
  lock); ``settled`` and ``snapshot`` iterate, under the runner's lock.

Life cycle: :meth:`FleetThread.run` (on the bridge's loop) starts the thread, waits for ``stop``, tells the fleet to
leave (every owned source drains and is released, bounded by the drain grace), and returns once the thread ended.
Cancelled instead (the bridge is going down abnormally, its sources cancelled), it tells the fleet to stop at once:
no drain, no release (the leases expire by TTL), the connection closed; it waits a few seconds for the thread, which
is a daemon so that it can never keep the process alive.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial

import anyio
from nats.aio.client import Client as NATS

from bridge.core.fleet import Fence
from bridge.io.connect import close_connection
from bridge.logs import get_logger
from bridge.observe.metrics import FleetSnapshot
from bridge.runtime.fleet import FleetRunner, SourceControl

ABORT_WAIT = 5.0  # seconds a cancelled run waits for the fleet's thread to end


class Mailbox:
    """Calls posted from any thread, run on one event loop in the order posted, with one wake-up of that loop per
    batch (``call_soon_threadsafe`` once, when the box goes from empty to not empty).

    Why not ``call_soon_threadsafe`` per call: each one writes a byte to the loop's self-pipe, and asyncio learns of a
    signal only through a byte the signal writes to that same pipe. A fleet taking 128 lease groups starts 2,000
    sources at once; while the bridge's loop was busy starting them, those bytes filled the pipe, the SIGTERM that
    came next found it full ("Exception ignored when trying to write to the signal wakeup fd: BlockingIOError") and
    was lost: the process ignored it until it was killed (``bench fleet``, three processes, 2,000 sources). With a
    mailbox, the fleet adds at most one byte per batch.
    """

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the loop's owner once it runs
        self._calls: deque[Callable[[], object]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False  # a delivery is on the loop's way: later posts join it

    def post(self, call: Callable[[], object]) -> None:
        """Run ``call`` on the loop soon; dropped when the loop is not running (nothing is left to tell it)."""
        loop = self.loop
        if loop is None:
            return
        with self._lock:
            self._calls.append(call)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed
            with self._lock:
                self._calls.clear()
                self._scheduled = False

    def _deliver(self) -> None:
        with self._lock:
            calls = list(self._calls)
            self._calls.clear()
            self._scheduled = False
        for call in calls:
            try:
                call()
            except Exception as exc:  # as asyncio reports a failing callback: the rest of the batch still runs
                if self.loop is not None:
                    self.loop.call_exception_handler({"message": "a call posted across loops failed", "exception": exc})


Connect = Callable[[anyio.Event], Awaitable[NATS | None]]
"""Opens the fleet's connection on the fleet's loop, retrying until connected or the event is set (then None)."""
MakeRunner = Callable[[NATS, list[str], SourceControl], FleetRunner]
"""Builds the runner on its connection, for the sources configured now, with the control that crosses loops."""


class FleetThread:
    """Runs a :class:`FleetRunner` on its own thread; answers the bridge's questions about ownership."""

    def __init__(self, connect: Connect, make: MakeRunner, sources: list[str], control: SourceControl) -> None:
        self._connect = connect
        self._make = make
        self._control = control  # the bridge's own: called on the bridge's loop only
        self._sources = list(sources)
        self._lock = threading.Lock()  # orders the runner's creation against set_sources
        self.runner: FleetRunner | None = None
        self._to_fleet = Mailbox()  # runs on the fleet's loop
        self._to_main = Mailbox()  # runs on the bridge's loop
        self._main_tg: anyio.abc.TaskGroup | None = None
        self._leave: anyio.Event | None = None  # fleet loop: leave cleanly
        self._abort = anyio.CancelScope()  # fleet loop: stop at once
        self._error: BaseException | None = None
        self.log = get_logger(component="fleet")

    # -- the bridge's questions (any thread) -----------------------------------------------------------------------

    def fence(self, source: str) -> Fence:
        """The fence of ``source``'s current term (call only while :meth:`holds` is True)."""
        runner = self.runner
        assert runner is not None
        return runner.fence(source)

    def holds(self, source: str) -> bool:
        """This process may act on ``source`` now."""
        runner = self.runner
        return runner is not None and runner.holds(source)

    def ready(self) -> bool:
        """The bucket was read within a TTL."""
        runner = self.runner
        return runner is not None and runner.ready()

    def settled(self) -> bool:
        """Every configured source has an owner."""
        runner = self.runner
        return runner is not None and runner.settled()

    def snapshot(self) -> FleetSnapshot | None:
        """The fleet as this process sees it (None before the fleet has its connection)."""
        runner = self.runner
        return runner.snapshot() if runner is not None else None

    def source_fenced(self, fence: Fence) -> None:
        """A source found ``fence`` closed and stopped itself: the fleet decides on its own loop whether the lease
        still holds (a late renew moved the fence) and it starts again."""
        runner = self.runner
        if runner is not None:
            self._post_fleet(partial(runner.source_fenced, fence))

    def set_sources(self, sources: list[str]) -> None:
        """A reload changed the configured sources: the fleet takes the new list on its own loop."""
        names = list(sources)
        with self._lock:
            self._sources = names
            runner = self.runner
        if runner is not None:
            self._post_fleet(partial(runner.set_sources, names))

    # -- the bridge's side ----------------------------------------------------------------------------------------

    async def run(self, stop: anyio.Event) -> None:
        """Run the fleet until ``stop`` is set and it has left (its owned sources drained and released)."""
        self._to_main.loop = asyncio.get_running_loop()
        started, ended = anyio.Event(), anyio.Event()
        thread = threading.Thread(
            target=self._thread_main,
            args=(partial(self._post_main, started.set), partial(self._post_main, ended.set)),
            name="nats-bridge fleet",
            daemon=True,  # never keeps the process alive: a cancelled run waits for it a few seconds only
        )
        try:
            async with anyio.create_task_group() as tg:
                self._main_tg = tg
                thread.start()

                async def leave_on_stop() -> None:
                    await started.wait()
                    await stop.wait()
                    assert self._leave is not None
                    self._post_fleet(self._leave.set)

                tg.start_soon(leave_on_stop)
                await ended.wait()
                tg.cancel_scope.cancel()
        finally:
            self._main_tg = None
            if not ended.is_set():  # cancelled: the sources are going down without a drain, so does the fleet
                self._post_fleet(self._abort.cancel)
                with anyio.CancelScope(shield=True), anyio.move_on_after(ABORT_WAIT):
                    await ended.wait()
        if self._error is not None:
            raise self._error

    def _post_main(self, call: Callable[[], object]) -> None:
        self._to_main.post(call)

    def _post_fleet(self, call: Callable[[], object]) -> None:
        self._to_fleet.post(call)

    def _start_on_main(self, source: str, fence: Fence) -> None:
        self._post_main(partial(self._control.start, source, fence))

    def _abandon_on_main(self, source: str) -> None:
        self._post_main(partial(self._control.abandon, source))

    def _resume_on_main(self, source: str) -> None:
        self._post_main(partial(self._control.resume, source))

    async def _drain_on_main(self, source: str) -> None:
        """Fleet loop: have the bridge drain ``source``; return once it has."""
        drained = anyio.Event()

        async def drain() -> None:  # bridge loop
            try:
                await self._control.stop(source)
            finally:
                self._post_fleet(drained.set)

        def spawn() -> None:  # bridge loop
            if self._main_tg is not None:
                self._main_tg.start_soon(drain)

        self._post_main(spawn)
        await drained.wait()

    # -- the fleet's thread ---------------------------------------------------------------------------------------

    def _thread_main(self, started: Callable[[], None], ended: Callable[[], None]) -> None:
        try:
            anyio.run(self._fleet_main, started, backend="asyncio")
        except BaseException as exc:  # handed to the bridge's loop, which raises it from run()
            self._error = exc
            self.log.error("fleet.failed", error=repr(exc))
        finally:
            ended()

    async def _fleet_main(self, started: Callable[[], None]) -> None:
        self._to_fleet.loop = asyncio.get_running_loop()
        self._leave = anyio.Event()
        started()
        with self._abort:
            nc = await self._connect(self._leave)
            if nc is None:
                return  # asked to leave before the coordination servers could be reached
            try:
                control = SourceControl(
                    self._start_on_main, self._drain_on_main, self._abandon_on_main, self._resume_on_main
                )
                with self._lock:
                    self.runner = self._make(nc, self._sources, control)
                await self.runner.run(self._leave)
            finally:
                # closing a dead connection fails; nothing is left to lose then
                with anyio.CancelScope(shield=True), anyio.move_on_after(2.0):
                    await close_connection(nc)
