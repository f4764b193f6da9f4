"""The fleet's posts to the bridge's loop (``bridge.runtime.fleet_thread.Mailbox``): thousands of calls posted while
the loop is busy run in order, wake the loop once, and leave room in its self-pipe for a signal. Posted one
``call_soon_threadsafe`` each, 5,000 of them filled the pipe and a SIGTERM that came next was lost (the process
ignored it until it was killed)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from functools import partial

from bridge.runtime.fleet_thread import Mailbox

POSTS = 5000


async def flood_then_signal() -> tuple[list[int], int, bool]:
    """Post POSTS calls from another thread while this loop is blocked, then signal this process; returns what ran,
    how many wake-ups were asked of the loop, and whether the signal reached the loop."""
    loop = asyncio.get_running_loop()
    received = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, received.set)
    wakeups = 0
    threadsafe = loop.call_soon_threadsafe

    def counting(callback, *args):  # type: ignore[no-untyped-def]
        nonlocal wakeups
        wakeups += 1
        return threadsafe(callback, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
    box = Mailbox()
    box.loop = loop
    ran: list[int] = []

    def flood() -> None:
        for i in range(POSTS):
            box.post(partial(ran.append, i))
        os.kill(os.getpid(), signal.SIGUSR1)

    try:
        worker = threading.Thread(target=flood)
        worker.start()
        worker.join(30)  # the loop is blocked meanwhile, as a busy bridge's is
        try:
            await asyncio.wait_for(received.wait(), 10)
        except TimeoutError:
            return ran, wakeups, False
        await asyncio.sleep(0)
        return ran, wakeups, True
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)


def test_a_flood_of_posts_runs_in_order_wakes_the_loop_once_and_loses_no_signal() -> None:
    ran, wakeups, signalled = asyncio.run(flood_then_signal())
    assert ran == list(range(POSTS))
    assert wakeups == 1
    assert signalled, "the signal was lost: the loop's self-pipe was full"


def test_a_failing_call_is_reported_and_the_rest_of_its_batch_still_runs() -> None:
    async def main() -> tuple[list[str], list[BaseException]]:
        loop = asyncio.get_running_loop()
        reported: list[BaseException] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
        box = Mailbox()
        box.loop = loop
        ran: list[str] = []

        def fail() -> None:
            raise ValueError("boom")

        box.post(lambda: ran.append("first"))
        box.post(fail)
        box.post(lambda: ran.append("last"))
        for _ in range(3):
            await asyncio.sleep(0)
        return ran, reported

    ran, reported = asyncio.run(main())
    assert ran == ["first", "last"]
    assert [str(exc) for exc in reported] == ["boom"]


def test_posts_to_a_loop_not_running_are_dropped() -> None:
    box = Mailbox()
    box.post(lambda: None)  # no loop yet: nothing to tell
    loop = asyncio.new_event_loop()
    loop.close()
    box.loop = loop
    box.post(lambda: None)  # closed: dropped, and the box is ready for nothing more
