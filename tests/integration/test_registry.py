"""The source registry on real servers: ``nats-bridge sources add / remove / list`` and twins applying it live.

Every scenario runs two processes of one configuration (``p0``, ``p1``: a twin, as a rolling update or a standby
has) on a hub and a leaf, under traffic against WorkQueue origins (an ack deletes), so that a lost message or a copy
stored twice cannot hide: at the end every source's copies are exactly its origin sequences, once each, in order.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.testing.configs import ORIGIN, SourceSpec, config_text, toml_value
from bridge.testing.http import http_get, http_port, readyz
from bridge.testing.jetstream import (
    Publisher,
    connect,
    create_aggregate,
    create_stream,
    replicate_exactly,
    stream_info,
)
from bridge.testing.polling import wait_until
from bridge.testing.processes import BridgeFactory, BridgeProcess, fleet_instance, run_cli
from bridge.testing.servers import Topology

RATE = 500
SITE = "SITE2"


def sources_file(path: Path, *tables: dict[str, Any]) -> Path:
    """A sources file (``[[sources]]`` tables only) for ``sources add --file``."""
    lines = []
    for table in tables:
        lines.append("[[sources]]")
        lines += [f"{key} = {toml_value(value)}" for key, value in table.items()]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def site(topology: Topology, **extra: Any) -> dict[str, Any]:
    """The registered source of these tests: stream SITE2 on the leaf, its copies under edge.two."""
    return {"name": "edge2", "servers": [topology.leaf.url], "stream": SITE, "subject_prefix": "edge.two", **extra}


async def fleet_config(topology: Topology, tmp_path: Path) -> Path:
    """The fleet's configuration (one file source, edge1) and the streams: both origins and the aggregate."""
    config = tmp_path / "bridge.toml"
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config.write_text(config_text(target_url=topology.hub.url, sources=[spec]), encoding="utf-8")
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_stream(leaf_nc, SITE, ["site2.>"], retention="workqueue")
        await create_aggregate(hub_nc, duplicate_window=1.0)
    return config


async def cli(*args: str) -> tuple[int, str, str]:
    done = await anyio.to_thread.run_sync(lambda: run_cli(*args))
    return done.returncode, done.stdout, done.stderr


async def applied(proc: BridgeProcess, since: int, **fields: list[str]) -> None:
    """Wait until ``proc`` logs ``registry.applied`` with ``fields`` (each a list the event's must contain) after its
    first ``since`` events of that name."""

    def found() -> bool:
        return any(
            all(set(value) <= set(event.get(key, [])) for key, value in fields.items())
            for event in proc.events("registry.applied")[since:]
        )

    await wait_until(found, timeout=15, what=f"a process applied {fields}")


async def owner_of(procs: list[BridgeProcess], source: str) -> BridgeProcess | None:
    for proc in procs:
        _, body = await readyz(await http_port(proc))
        if source in body.get("fleet", {}).get("owned", []):
            return proc
    return None


async def both_know(procs: list[BridgeProcess], source: str, present: bool) -> bool:
    """Each process's /readyz lists ``source`` (as owner or standby), or none does (``present`` False)."""
    for proc in procs:
        _, body = await readyz(await http_port(proc))
        entry = body.get("sources", {}).get(source)
        if (entry is not None) != present or (present and entry.get("from") != "registry"):
            return False
    return True


@pytest.mark.anyio
async def test_add_change_remove_live_with_a_twin_under_traffic(
    topology: Topology, tmp_path: Path, bridge_procs: BridgeFactory
) -> None:
    """A source registered while two processes replicate the file's: one of them takes it up (the other stands by),
    a change restarts it under its lease, its removal drains and releases it; the file's source never stops, and
    every message of both is copied exactly once, in order."""
    config = await fleet_config(topology, tmp_path)
    procs = [fleet_instance(bridge_procs, config, "p0"), fleet_instance(bridge_procs, config, "p1")]
    for proc in procs:
        await proc.wait_event("fleet.joined", timeout=20)
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        file_pub = Publisher(leaf_nc, 6000, rate=RATE)
        site_pub = Publisher(leaf_nc, 3000, subject=lambda i: f"site2.{i % 3}", rate=RATE)
        async with anyio.create_task_group() as tg:
            tg.start_soon(file_pub.run)
            tg.start_soon(site_pub.run)
            await wait_until(lambda: site_pub.published > 500, timeout=30, what="traffic")

            # add: both processes know it within a second or two, one owns it
            added = sources_file(tmp_path / "site.toml", site(topology))
            code, out, err = await cli("sources", "add", "-c", str(config), "--file", str(added))
            assert code == 0, err
            assert "added 1" in out and "edge2" in out
            began = time.monotonic()
            await wait_until(lambda: both_know(procs, "edge2", True), timeout=15, what="edge2 on both processes")
            print(f"add applied on both within {time.monotonic() - began:.2f} s of the command's exit")
            await wait_until(lambda: owner_of(procs, "edge2"), timeout=20, what="edge2 owned")

            # change: restarts under its lease on whichever process owns it; the other applies it too
            counts = [len(proc.events("registry.applied")) for proc in procs]
            changed = sources_file(tmp_path / "site.toml", site(topology, max_ack_pending=500))
            code, out, err = await cli("sources", "add", "-c", str(config), "--file", str(changed))
            assert code == 0 and "changed 1" in out, (out, err)
            began = time.monotonic()
            for proc, since in zip(procs, counts, strict=True):
                await applied(proc, since, changed=["edge2"])
            print(f"change applied on both within {time.monotonic() - began:.2f} s of the command's exit")

            # the same table again: nothing to do
            code, out, err = await cli("sources", "add", "-c", str(config), "--file", str(changed))
            assert code == 0 and "unchanged 1" in out, (out, err)

            # list and status: both sources, where each comes from, and its owner
            code, out, err = await cli("sources", "list", "-c", str(config), "--json")
            assert code == 0, err
            rows = {row["source"]: row for row in json.loads(out)["sources"]}
            assert rows["edge1"]["from"] == "file" and rows["edge2"]["from"] == "registry", rows
            assert rows["edge2"]["owner"] in ("p0", "p1"), rows
            code, out, err = await cli("status", "-c", str(config), "--json")
            assert code == 0, err
            rows = {row["source"]: row for row in json.loads(out)["sources"]}
            assert rows["edge2"]["from"] == "registry" and rows["edge2"]["consumer"] == "nats-bridge-edge2", rows

            # the registry outlives its processes: a rolling update's new process knows edge2 from the start
            assert await procs[0].astop(20) == 0
            procs = [procs[1], fleet_instance(bridge_procs, config, "p2")]
            await wait_until(lambda: both_know(procs, "edge2", True), timeout=20, what="edge2 known to p2")

            await site_pub.done.wait()
        # every message of the registered source replicated before it is removed (its origin empty)
        await replicate_exactly(leaf_nc, hub_nc, {"edge1": file_pub, "edge2": site_pub}, streams=(ORIGIN, SITE))

        owner = await owner_of(procs, "edge2")
        assert owner is not None
        status, scraped = await http_get(await http_port(owner), "/metrics")
        assert status == 200 and b'source="edge2"' in scraped
        code, out, err = await cli("sources", "remove", "-c", str(config), "edge2")
        assert code == 0, err
        await wait_until(lambda: both_know(procs, "edge2", False), timeout=15, what="edge2 gone from both")
        assert owner.events("lease.released", source="edge2") or owner.events("source.stopped", source="edge2")
        # nor any series of it: sites come and go, the metrics of those gone do not stay
        status, scraped = await http_get(await http_port(owner), "/metrics")
        assert status == 200 and b'source="edge1"' in scraped and b'source="edge2"' not in scraped
        code, out, err = await cli("sources", "remove", "-c", str(config), "edge2")
        assert code == 2 and "edge2: not in the registry" in err, err
    for proc in procs:
        assert await proc.astop(20) == 0


@pytest.mark.anyio
async def test_add_is_all_or_nothing_and_a_thousand_sources_take_one_call(topology: Topology, tmp_path: Path) -> None:
    """A sources file with one bad table registers nothing and names every problem; a thousand sites register in
    one call, and leave in one."""
    config = await fleet_config(topology, tmp_path)
    leaf = topology.leaf.url
    bad = sources_file(
        tmp_path / "bad.toml",
        site(topology),
        {"name": "edge1", "servers": [leaf], "stream": SITE},
        {"name": "edge3", "servers": [leaf], "stream": SITE, "max_ack_pending": 0},
    )
    code, out, err = await cli("sources", "add", "-c", str(config), "--file", str(bad))
    assert code == 2, (out, err)
    assert err.splitlines() == [
        f"nats-bridge: invalid configuration ({bad})",
        "  sources[edge1]: 'edge1' is a source of the configuration file: a registered source cannot have the same "
        "name (remove it from the file and reload, or register it under another name)",
        "  sources[edge3].max_ack_pending: must be between 1 and 1000000 (got 0)",
    ]

    async def listed() -> dict[str, dict[str, Any]]:
        code, out, err = await cli("sources", "list", "-c", str(config), "--json")
        assert code == 0, err
        return {row["source"]: row for row in json.loads(out)["sources"]}

    assert list(await listed()) == ["edge1"]  # edge2, valid, was not registered either

    names = [f"site-{i:04d}" for i in range(1000)]
    many = sources_file(tmp_path / "many.toml", *({"name": n, "servers": [leaf], "stream": f"S{n[5:]}"} for n in names))
    began = time.monotonic()
    code, out, err = await cli("sources", "add", "-c", str(config), "--file", str(many))
    took = time.monotonic() - began
    assert code == 0, err
    assert out.splitlines()[0] == "registry nats-bridge-sources: added 1000, changed 0, unchanged 0"
    rows = await listed()
    assert len(rows) == 1001 and all(rows[n]["from"] == "registry" for n in names)
    print(f"1,000 sources registered in {took:.2f} s (the command, process start included)")
    code, out, err = await cli("sources", "remove", "-c", str(config), *names)
    assert code == 0, err
    assert list(await listed()) == ["edge1"]


@pytest.mark.anyio
async def test_a_fleet_of_registered_sites_is_set_up_for_every_site_to_come(topology: Topology, tmp_path: Path) -> None:
    """A fleet's file with no sources, only [source_defaults] (subject_prefix = "edge.{name}"): setup creates the
    aggregate capturing every site's copies, registered now or later (edge.*.>) and the registered sites' consumers;
    a site whose prefix the aggregate would not capture is refused with the fix."""
    config = tmp_path / "bridge.toml"
    text = config_text(target_url=topology.hub.url, sources=[])
    text += f'\n[source_defaults]\nservers = ["{topology.leaf.url}"]\nsubject_prefix = "edge.{{name}}"\n'
    config.write_text(text, encoding="utf-8")
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, SITE, ["site2.>"], retention="workqueue")
        bare = tmp_path / "bare.toml"  # no sources, no prefix to derive the aggregate's subjects from
        bare.write_text(config_text(target_url=topology.hub.url, sources=[]), encoding="utf-8")
        code, out, err = await cli("setup", "-c", str(bare))
        assert code == 1 and "FAIL" in out and "not created: no source's copies to capture" in out, out + err
        early = sources_file(tmp_path / "early.toml", {"name": "store-1", "stream": SITE})
        code, out, err = await cli("sources", "add", "-c", str(config), "--file", str(early))
        assert code == 2 and "target.stream: the aggregate AGG does not exist: create it first" in err, (out, err)
        code, out, err = await cli("setup", "-c", str(config))
        assert code == 0, out + err
        info = await stream_info(hub_nc, "AGG")
        assert info["config"]["subjects"] == ["edge.*.>"], info["config"]
        code, out, err = await cli("sources", "add", "-c", str(config), "--file", str(early))
        assert code == 0, err
        code, out, err = await cli("setup", "-c", str(config), "--dry-run")
        assert code == 0 and "consumer ORDERS" not in out and "nats-bridge-store-1" in out, out
        code, out, err = await cli("check", "-c", str(config))
        assert code == 0, out + err
        assert "OK   registry of sources nats-bridge-sources: 1 registered source(s), 0 refused" in out, out
        assert "source store-1" in out, out
        stray = sources_file(tmp_path / "stray.toml", {"name": "store-2", "stream": SITE, "subject_prefix": "other"})
        code, out, err = await cli("sources", "add", "-c", str(config), "--file", str(stray))
        assert code == 2, (out, err)
        assert "sources[store-2].subject_prefix: the aggregate AGG does not capture its copies (other.>" in err, err
