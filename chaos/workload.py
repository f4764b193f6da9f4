"""Publishers into the origin streams: every attempt carries a unique id, every ack is recorded.

A workload alternates bursts (as fast as ``concurrency`` outstanding publishes allow) and trickles (a steady few
dozen messages a second: never a full second without a delivery, so the consumer never goes idle and only the
``max_ack_pending`` count asks for flow control; docs/protocol.md section 9). Payloads are 256 B to 64 KiB, mostly
small. A publish that fails or times out is recorded as an attempt without an ack and is never retried under the
same id: the origin may or may not hold it, and the checker treats it that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from dataclasses import dataclass

from nats.aio.client import Client

from chaos.model import ID_HEADER, PublishLog, message_id
from chaos.topology import Source

_POOL = os.urandom(64 * 1024)
PUBLISH_TIMEOUT = 2.0


@dataclass(frozen=True, slots=True)
class Profile:
    """How hard a workload pushes: burst concurrency and the trickle rate."""

    concurrency: int = 8
    trickle_rate: float = 40.0  # msgs/s; > 1 per heartbeat interval so the consumer never idles
    burst_seconds: tuple[float, float] = (1.0, 3.0)
    trickle_seconds: tuple[float, float] = (1.0, 3.0)


def payload_size(rng: random.Random) -> int:
    """256 B..64 KiB: 90 % up to 1 KiB, 9 % up to 16 KiB, 1 % up to 64 KiB."""
    roll = rng.random()
    if roll < 0.90:
        return rng.randint(256, 1024)
    if roll < 0.99:
        return rng.randint(1025, 16 * 1024)
    return rng.randint(16 * 1024 + 1, 64 * 1024)


class Publisher:
    """Publishes into one source's origin until stopped, recording into ``log``."""

    def __init__(self, nc: Client, source: Source, log: PublishLog, rng: random.Random, profile: Profile) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=PUBLISH_TIMEOUT)
        self.source = source
        self.log = log
        self.rng = rng
        self.profile = profile
        self.failures = 0
        self._bursting = asyncio.Event()

    async def _publish_one(self) -> None:
        n = self.log.next_attempt()
        size = payload_size(self.rng)
        subject = f"{self.source.subject}.{n % 16}"
        try:
            ack = await self.js.publish(
                subject, _POOL[:size], timeout=PUBLISH_TIMEOUT, headers={ID_HEADER: message_id(self.source.name, n)}
            )
        except Exception:  # timeout, disconnect, no responders: an attempt without an ack
            self.failures += 1
            await asyncio.sleep(0.05)  # the origin is down or paused: don't spin
            return
        self.log.ack(n, ack.seq, size)

    async def _burst_worker(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._bursting.wait()
            if stop.is_set():
                return
            await self._publish_one()

    async def _trickle(self, seconds: float, stop: asyncio.Event) -> None:
        interval = 1.0 / self.profile.trickle_rate
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            started = time.monotonic()
            await self._publish_one()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, interval - (time.monotonic() - started)))

    async def run(self, stop: asyncio.Event) -> None:
        """Alternate bursts and trickles until ``stop`` is set; outstanding publishes finish first."""
        async with asyncio.TaskGroup() as tg:
            for _ in range(self.profile.concurrency):
                tg.create_task(self._burst_worker(stop))
            try:
                while not stop.is_set():
                    self._bursting.set()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.rng.uniform(*self.profile.burst_seconds))
                    self._bursting.clear()
                    if stop.is_set():
                        break
                    await self._trickle(self.rng.uniform(*self.profile.trickle_seconds), stop)
            finally:
                self._bursting.set()  # release the workers so they see stop
