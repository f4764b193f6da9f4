"""Reading the streams from outside: the aggregate's messages (batched Direct Get) and the origins' states.

Deliberately shares no code with the bridge: the code under test does not judge itself.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from nats.aio.client import Client

from chaos.model import ID_HEADER, StoredCopy, parse_message_id

BATCH = 1000


class AggregateReader:
    """Reads the aggregate forward from sequence 1 into ``copies``, a batch of Direct Gets per call.

    Direct Get batches (ADR-31, ``{"seq": n, "batch": b}``) answer with the messages and then an end-of-batch
    status 204; a 404 means nothing at or after ``seq``.
    """

    def __init__(self, nc: Client, stream: str) -> None:
        self.nc = nc
        self.stream = stream
        self.next_seq = 1
        self.copies: list[StoredCopy] = []

    async def _batch(self, timeout: float) -> tuple[int, bool]:
        """One batch from ``next_seq``: (copies read, whether the server said more are pending)."""
        inbox = self.nc.new_inbox()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        async def collect(msg: Any) -> None:
            queue.put_nowait(msg)

        sub = await self.nc.subscribe(inbox, cb=collect)
        try:
            request = json.dumps({"seq": self.next_seq, "batch": BATCH}).encode()
            await self.nc.publish(f"$JS.API.DIRECT.GET.{self.stream}", request, reply=inbox)
            read = 0
            while True:
                msg = await asyncio.wait_for(queue.get(), timeout)
                headers = msg.headers or {}
                status = headers.get("Status")
                if status == "404":
                    return read, False
                if status is not None:  # 204 end of batch; any other status is an error the caller retries
                    if status != "204":
                        raise RuntimeError(f"direct get: {status} {headers.get('Description', '')}")
                    return read, int(headers.get("Nats-Num-Pending", "0") or 0) > 0
                seq = int(headers["Nats-Sequence"])
                parsed = parse_message_id(headers.get(ID_HEADER, ""))
                self.copies.append(StoredCopy(seq, parsed[0], parsed[1]) if parsed else StoredCopy(seq, None, 0))
                self.next_seq = seq + 1
                read += 1
        finally:
            await sub.unsubscribe()

    async def poll(self, timeout: float = 2.0) -> int:
        """Read everything stored after what was read before; returns how many copies were added."""
        total = 0
        while True:
            read, more = await self._batch(timeout)
            total += read
            if not more or not read:
                return total


async def stream_state(nc: Client, stream: str, *, deleted: bool = False, timeout: float = 2.0) -> dict[str, Any]:
    """``state`` of a stream's info (with the list of deleted sequences when ``deleted``)."""
    body = json.dumps({"deleted_details": True}).encode() if deleted else b""
    reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", body, timeout=timeout)
    info = json.loads(reply.data)
    if "error" in info:
        raise RuntimeError(f"stream info {stream}: {info['error']}")
    state: dict[str, Any] = info["state"]
    return state


async def remaining_seqs(nc: Client, stream: str) -> list[int]:
    """The sequences a stream still holds: first..last minus the deleted ones."""
    state = await stream_state(nc, stream, deleted=True)
    if not state.get("messages"):
        return []
    gone = set(state.get("deleted") or ())
    return [s for s in range(int(state["first_seq"]), int(state["last_seq"]) + 1) if s not in gone]
