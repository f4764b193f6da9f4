"""The chaos suite's own machinery on real servers: it must be able to fail.

A short run of the real topology (leaf, hub, proxies, bridge process, publishers) converges clean; then the
aggregate is damaged by hand (a copy deleted, one copy published twice, an id nobody attempted) and the reader and
checker must report exactly that damage.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from chaos.checker import check_run
from chaos.model import ID_HEADER, PublishLog, message_id
from chaos.reader import AggregateReader
from chaos.runner import SMOKE_PROFILE
from chaos.topology import AGGREGATE, ChaosTopology
from chaos.workload import Publisher


async def _read_all(topo: ChaosTopology) -> AggregateReader:
    reader = AggregateReader(topo.hub, AGGREGATE)
    await reader.poll()
    return reader


@pytest.mark.anyio
async def test_a_clean_run_checks_clean_and_hand_made_damage_is_reported_exactly(tmp_path: Path) -> None:
    topo = ChaosTopology(tmp_path / "chaos")
    try:
        await topo.start()
        deadline = time.monotonic() + 30
        for source in topo.sources:  # an Interest origin drops messages published before its consumer exists
            while "error" in await topo.api("leaf", f"CONSUMER.INFO.{source.stream}.{source.consumer}"):
                assert time.monotonic() < deadline, "the bridge did not create its consumers"
                await asyncio.sleep(0.05)
        logs = {s.name: PublishLog(s.name) for s in topo.sources}
        stop = asyncio.Event()
        publishers = [
            Publisher(topo.leaf, s, logs[s.name], random.Random(i), SMOKE_PROFILE) for i, s in enumerate(topo.sources)
        ]
        tasks = [asyncio.create_task(p.run(stop)) for p in publishers]
        await asyncio.sleep(1.0)  # the workload's length
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        acked = sum(len(log.acked) for log in logs.values())
        assert acked > 100

        wanted = {(name, n) for name, log in logs.items() for n in log.acked}
        deadline = time.monotonic() + 60
        while True:
            reader = await _read_all(topo)
            if not wanted - {(c.source, c.n) for c in reader.copies}:
                break
            assert time.monotonic() < deadline, f"{len(reader.copies)} copies, {acked} acked"
            await asyncio.sleep(0.1)
        retentions = {s.name: s.retention for s in topo.sources}
        clean = check_run(logs, retentions, reader.copies, [], [], {})
        assert all(v.ok for v in clean), [v.to_json() for v in clean]
        assert sum(v.stored for v in clean) == acked

        # the damage: lose the copy of wq/1, duplicate interest/2, add an id nobody attempted
        victim = next(c for c in reader.copies if (c.source, c.n) == ("wq", 1))
        reply = await topo.api("hub", f"STREAM.MSG.DELETE.{AGGREGATE}", {"seq": victim.aggregate_seq})
        assert reply.get("success"), reply
        js = topo.hub.jetstream()
        await js.publish("chaos.interest.x", b"dup", headers={ID_HEADER: message_id("interest", 2)})
        never = logs["wq"].attempted + 1
        await js.publish("chaos.wq.x", b"?", headers={ID_HEADER: message_id("wq", never)})

        verdicts = {v.source: v for v in check_run(logs, retentions, (await _read_all(topo)).copies, [], [], {})}
        assert (verdicts["wq"].lost, verdicts["wq"].unexpected, verdicts["wq"].duplicated) == (1, 1, 0)
        assert verdicts["wq"].examples["lost"] == [logs["wq"].acked[1]]
        assert verdicts["wq"].examples["unexpected"] == [never]
        assert (verdicts["interest"].duplicated, verdicts["interest"].lost) == (1, 0)
        assert verdicts["interest"].examples["duplicated"] == [2]
        assert not verdicts["wq"].ok and not verdicts["interest"].ok
    finally:
        await topo.close()
