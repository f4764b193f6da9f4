"""Waiting on real processes: every wait is a condition polled against a deadline, never a bare sleep.

:func:`wait_until` and :func:`wait_for_value` poll a probe (sync or async) until it is truthy or equal to a value;
:func:`assert_holds` is the opposite, an observation window during which a check must keep holding;
:func:`settled` waits for a value that is still moving (a count of copies) to stop changing.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

__all__ = ["POLL", "assert_holds", "settled", "wait_for_value", "wait_until"]

POLL = 0.05

T = TypeVar("T")


async def _poll(
    probe: Callable[[], Any],
    done: Callable[[Any], bool],
    *,
    timeout: float,
    what: str,
    interval: float,
    retry_on: tuple[type[BaseException], ...],
) -> Any:
    """Call ``probe`` (sync or async) until ``done`` accepts its value, and return that value; AssertionError naming
    ``what`` and the last value (or error) once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    last: Any = "never probed"
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
            if done(value):
                return value
            last = value
        except retry_on as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")
        await anyio.sleep(interval)


async def wait_until(
    probe: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    interval: float = POLL,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``probe`` (sync or async) until it returns something truthy, and return that.

    Raises AssertionError naming ``what`` and the last value (or error) once ``timeout`` seconds have passed.
    Exceptions of the ``retry_on`` types count as "not yet" (e.g. a server that is restarting).
    """
    return await _poll(probe, bool, timeout=timeout, what=what, interval=interval, retry_on=retry_on)


async def wait_for_value(
    probe: Callable[[], Any],
    expected: Any,
    *,
    timeout: float,
    what: str,
    interval: float = POLL,
    retry_on: tuple[type[BaseException], ...] = (),
) -> None:
    """Poll ``probe`` (sync or async) until it returns ``expected``; the failure names the last value seen."""
    await _poll(
        probe,
        lambda value: bool(value == expected),
        timeout=timeout,
        what=f"{what} == {expected!r}",
        interval=interval,
        retry_on=retry_on,
    )


async def assert_holds(check: Callable[[], Any], *, duration: float, what: str, interval: float = 0.1) -> int:
    """Observe for ``duration`` seconds that ``check`` (sync or async, raising AssertionError) keeps holding.

    Returns how many observations were made. This is an observation window, not a wait for a condition.
    """
    deadline = time.monotonic() + duration
    count = 0
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                await result
        except AssertionError as exc:
            raise AssertionError(f"{what} stopped holding after {count} observations: {exc}") from exc
        count += 1
        if time.monotonic() >= deadline:
            return count
        await anyio.sleep(interval)


async def settled(read: Callable[[], Awaitable[T]], *, quiet: float, timeout: float) -> T:
    """The value ``read`` returns once it has not changed for ``quiet`` seconds.

    For a value with no known final figure to wait for, such as how many copies land once a bridge is blocked or
    paused. Raises AssertionError if it still changes after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    value, since = await read(), time.monotonic()
    while time.monotonic() - since < quiet:
        if time.monotonic() >= deadline:
            raise AssertionError(f"still changing after {timeout}s (last {value})")
        await anyio.sleep(POLL)
        current = await read()
        if current != value:
            value, since = current, time.monotonic()
    return value
