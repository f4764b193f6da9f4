"""``check`` over a far link: the round trip to the origin, and what the source's window carries over it
(:mod:`bridge.core.window`), for the bound consumer the bridge never changes and the managed one alike."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from bridge.core.window import window_carries, window_limit
from bridge.testing.configs import ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import connect, create_aggregate, create_stream
from bridge.testing.processes import run_cli
from bridge.testing.servers import Topology
from chaos.proxy import proxy_to

pytestmark = pytest.mark.anyio

DELAY = 0.015  # each way: a 30 ms link
ADVICE = re.compile(
    r"OK   source (?P<name>edge\d): link round trip (?P<rtt>[\d.]+) ms: max_ack_pending (?P<window>\d+) "
    r"\((?P<kind>\w+) consumer\) carries about (?P<carries>[\d,]+) msg/s; (?P<rest>.*)"
)


async def test_check_says_what_the_window_carries_over_a_far_link(topology: Topology, tmp_path: Path) -> None:
    async with proxy_to(topology.leaf.url, "far-link") as proxy:
        proxy.set_delay(DELAY)
        spec = SourceSpec(name="edge1", servers=proxy.url, subject_prefix="edge.one", max_ack_pending=500)
        fixed = SourceSpec(name="edge2", servers=proxy.url, subject_prefix="edge.two", max_ack_pending=500)
        fixed.extra["window_budget"] = 0  # as a bound consumer's: the bridge never grows it
        config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec, fixed])
        async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
            await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="limits")
            await create_aggregate(hub_nc)
        done = await anyio.to_thread.run_sync(lambda: run_cli("check", "-c", str(config), timeout=60))
    assert done.returncode == 0, (done.stdout, done.stderr)
    advice = sorted((m for m in map(ADVICE.match, done.stdout.splitlines()) if m), key=lambda m: m["name"])
    assert [m["name"] for m in advice] == ["edge1", "edge2"], done.stdout
    assert advice[1]["rest"].startswith("a faster source wants about 2 x rate x RTT (rate x "), done.stdout
    rtt = float(advice[0]["rtt"]) / 1000
    assert rtt >= 2 * DELAY, done.stdout  # the proxy's delay both ways, at least
    assert int(advice[0]["window"]) == 500
    carries = int(advice[0]["carries"].replace(",", ""))
    assert carries == pytest.approx(window_carries(500, rtt), rel=0.01), done.stdout  # the line's rtt is rounded
    # a managed flow-control consumer is grown by the bridge itself, within its budget (the stream is empty: the
    # budget is counted at 512 bytes a message)
    assert advice[0]["rest"].startswith(
        f"the bridge grows it while that holds the source back, up to {window_limit(32 * 1024 * 1024, 0)} "
        "(window_budget;"
    ), done.stdout


async def test_check_says_nothing_of_the_window_on_a_near_link(topology: Topology, tmp_path: Path) -> None:
    spec = SourceSpec(name="edge1", servers=topology.leaf.url, subject_prefix="edge.one")
    config = write_config(tmp_path / "bridge.toml", target_url=topology.hub.url, sources=[spec])
    async with connect(topology.leaf.url) as leaf_nc, connect(topology.hub.url) as hub_nc:
        await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(hub_nc)
    done = await anyio.to_thread.run_sync(lambda: run_cli("check", "-c", str(config), timeout=60))
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "link round trip" not in done.stdout or _measured_far(done.stdout), done.stdout


def _measured_far(out: str) -> bool:
    """A loaded machine can make loopback slower than FAR: then the line is there, and says so by its figure."""
    return all(float(m["rtt"]) >= 10.0 for m in map(ADVICE.match, out.splitlines()) if m)
