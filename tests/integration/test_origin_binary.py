"""The leaf (origin) of a topology on another nats-server than the hub: what the pull-mode runs rely on.

``NATS_ORIGIN_SERVER_BIN`` names the origin's binary for the ``topology`` fixture (marker ``pullmode``: the runs
against old origins include this check that the origin really is the old one); ``start_topology(leaf_binary=...)``
links servers of different versions, here an older one from ``.cache`` (installed by ``tests/run.sh``) when present.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.testing.servers import Topology, origin_mode_expected, server_version, start_topology

REPO = Path(__file__).resolve().parents[2]
OLD = "2.12.8"


@pytest.mark.pullmode
def test_the_topology_runs_its_leaf_on_the_origin_binary(
    topology: Topology, nats_server_bin: str, origin_server_bin: str, origin_mode: str
) -> None:
    assert topology.hub.binary == nats_server_bin
    assert topology.leaf.binary == origin_server_bin
    assert topology.hub.monitor("varz")["version"] == server_version(nats_server_bin)
    assert topology.leaf.monitor("varz")["version"] == server_version(origin_server_bin)
    assert origin_mode == origin_mode_expected(origin_server_bin)


def test_an_older_leaf_links_to_the_hub(tmp_path: Path, nats_server_bin: str) -> None:
    old = REPO / ".cache" / f"nats-server-{OLD}" / "bin" / "nats-server"
    if not old.is_file():
        pytest.skip(f"no nats-server {OLD} at {old} (tests/run.sh installs it)")
    with start_topology(tmp_path, binary=nats_server_bin, leaf_binary=str(old)) as topo:
        assert topo.is_linked(), "start_topology returns once linked, JetStream APIs included"
        assert topo.leaf.monitor("varz")["version"] == OLD
        assert topo.hub.monitor("varz")["version"] == server_version(nats_server_bin)
        assert origin_mode_expected(str(old)) == "pull"
    assert not topo.leaf.is_running and not topo.hub.is_running
