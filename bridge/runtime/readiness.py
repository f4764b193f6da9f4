"""When the daemon is ready, and what it says about it: pure functions of plain snapshots.

``Bridge`` only gathers the inputs and performs the answers (the ``/readyz`` response, systemd's ``READY=1`` and
``STATUS=``, the ``bridge.ready`` line). The rules:

* **/readyz without leases**: ready when the target is connected and every source is replicating (its origin
  connected, its consumer bound, not stalled); each source that is not says why.
* **/readyz with leases**: a healthy standby is ready (an orchestrator waiting for it before stopping the owner
  must not deadlock): ready when the target is connected, the coordination bucket was read recently, and every
  source this process owns is replicating; sources owned elsewhere are listed as ``standby`` with their owner.
* **READY=1 (systemd)** waits for the target, every running source's first reset, and with leases for the bucket
  and for every source to have an owner, at most ``READY_WAIT`` (``bridge.runtime.app``): :func:`waiting_for` names
  what is still awaited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge.observe.metrics import BridgeSnapshot, FleetSnapshot


@dataclass(frozen=True, slots=True)
class Readiness:
    """The answer to ``/readyz``: ready or not (200 or 503), and the JSON body that says why."""

    ready: bool
    body: dict[str, Any]


def readyz(
    snap: BridgeSnapshot,
    *,
    coordinated: bool,
    target_stream: str,
    provenance: Mapping[str, str] | None = None,
    refused: Mapping[str, list[str]] | None = None,
) -> Readiness:
    """``/readyz`` for the daemon's state ``snap`` (see the module's rules); ``provenance`` says where each source
    comes from (``from``: file or registry), ``refused`` the registry sources this process cannot run and why (they
    do not make it unready: one bad entry must not stop a fleet's rolling update; they are listed, and logged)."""
    sources: dict[str, Any] = {}
    fleet_body: dict[str, Any] = {}
    suspended: set[str] = set()  # owned sources whose lease is suspended: not replicating, and saying why
    if coordinated:
        fleet = snap.fleet
        ready = snap.target_connected and fleet is not None and fleet.ready
        fleet_body["fleet"] = fleet_json(fleet)
        for lease in fleet.leases if fleet is not None else ():
            if lease.suspended:
                suspended.add(lease.source)
            if not lease.owned:
                sources[lease.source] = {
                    "ready": True,
                    "reasons": [],
                    "role": "standby",
                    "owner": lease.owner or None,
                    "owner_host": lease.owner_host or None,
                }
    else:
        ready = snap.target_connected and bool(snap.sources)
    for src in snap.sources:
        reasons = []
        if not src.origin_connected:
            reasons.append("origin not connected")
        if not src.consumer_bound:
            reasons.append("consumer not bound yet")
        if src.stalled:
            reasons.append(f"stalled: no progress for {src.seconds_since_progress:.0f}s with messages waiting")
        if src.waiting_for_origin:
            reasons.append("silent: its origin is in doubt (a leaf restarting, a link down); another source scouts it")
        if src.source in suspended:
            reasons.append("lease suspended: paused until a renew of its lease succeeds (the hub answers late)")
        ready = ready and not reasons
        sources[src.source] = {"ready": not reasons, "reasons": reasons, "role": "owner", **src.to_json(snap.now)}
    for name, entry in sources.items():
        if provenance and name in provenance:
            entry["from"] = provenance[name]
    body = {
        "ready": ready,
        "target": {"connected": snap.target_connected, "stream": target_stream},
        **fleet_body,
        "sources": sources,
    }
    if refused:
        body["registry_refused"] = {name: list(problems) for name, problems in refused.items()}
    return Readiness(ready, body)


def fleet_json(fleet: FleetSnapshot | None) -> dict[str, Any]:
    """The ``fleet`` part of ``/readyz``."""
    if fleet is None:
        return {"ready": False, "reason": "the coordination bucket is not usable yet"}
    return {
        "ready": fleet.ready,
        "instance": fleet.instance,
        "bucket": fleet.bucket,
        "lease_ttl": fleet.ttl,
        "members": list(fleet.members),
        "owned": [lease.source for lease in fleet.leases if lease.owned],
        "suspended": [lease.source for lease in fleet.leases if lease.suspended],
    }


def waiting_for(
    unready_sources: Iterable[str],
    *,
    coordinated: bool,
    fleet_ready: bool,
    fleet_settled: bool,
) -> list[str]:
    """What ``READY=1`` still waits for: the running sources whose first reset is not done yet and, with leases,
    the coordination bucket (``fleet_ready``: read recently) and sources without an owner (``fleet_settled``)."""
    waiting = list(unready_sources)
    if coordinated:
        if not fleet_ready:
            waiting.append("the coordination bucket")
        elif not fleet_settled:
            waiting.append("sources without an owner yet")
    return waiting


def status_line(replicating: int, *, running: int, configured: int, instance: str | None) -> str:
    """systemd's ``STATUS=``: how many sources replicate; with leases (``instance`` set) out of the configured ones,
    the others being standby, else out of those running."""
    if instance is not None:
        return f"replicating {replicating} of {configured} source(s), standby for the others (instance {instance})"
    return f"replicating {replicating} of {running} source(s)"
