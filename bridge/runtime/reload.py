"""What a configuration reload (SIGHUP) changes: a pure plan from the old and new configurations and what runs.

``Bridge.reload`` loads and validates the new file, asks :func:`plan_reload`, and performs the plan. The rules:

* An unchanged source keeps running untouched; one whose only change applies in place (``RETUNABLE``: its
  ``rate_limit``) keeps running and takes it (``retune``: the consumer is updated, nothing restarts).
* Without leases: a removed source drains and stops (flow control is answered with what is stored, so nothing is
  lost or duplicated; its consumer stays on the origin); a changed one stops the same way and starts again with its
  new settings; an added one starts.
* With leases, ownership decides what runs: a changed source that runs here stops and starts again under the same
  lease if this process still holds it (``restart_if_held``); the fleet is given the new list of sources
  (``sources``), and its core hands over a removed source that this process owns (drained, lease released) and
  takes up an added one when it falls to this process.
* ``[target]``, ``[engine]``, ``[http]``, ``[log]`` and ``[coordination]`` apply on restart only: a change to them is
  reported (``restart_required``), never applied, and the running mode (with or without leases) stays.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.config import BridgeConfig, SourceConfig

RESTART_ONLY = ("target", "engine", "http", "log", "coordination")
RETUNABLE = ("rate_limit",)  # source settings a running source takes without a restart (SourceRunner.retune)


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """The changes (names, in configuration order) and what to do about them, in the order to do it."""

    added: list[str]
    removed: list[str]
    changed: list[str]
    unchanged: list[str]
    restart_required: list[str]  # sections whose change needs a restart (reported, not applied)
    stop: list[str]  # running sources to drain and stop, first
    start: list[str]  # then sources to start (without leases)
    restart_if_held: list[str]  # then, with leases, sources to start again if this process still holds them
    hand_over: list[str]  # with leases: running sources the fleet hands over once it has ``sources``
    sources: list[str]  # every source of the new configuration
    retune: list[str] = field(default_factory=list)  # running sources changed in RETUNABLE settings only


def plan_reload(old: BridgeConfig, new: BridgeConfig, running: Collection[str], *, coordinated: bool) -> ReloadPlan:
    """The plan for replacing ``old`` by ``new`` while ``running`` sources run here (with leases when
    ``coordinated``: the mode the process started in)."""
    old_sources = {s.name: s for s in old.sources}
    new_sources = {s.name: s for s in new.sources}
    removed = [n for n in old_sources if n not in new_sources]
    added = [n for n in new_sources if n not in old_sources]
    changed = [n for n in old_sources if n in new_sources and old_sources[n] != new_sources[n]]
    unchanged = [n for n in new_sources if n not in added and n not in changed]
    restart_required = [k for k in RESTART_ONLY if getattr(new, k) != getattr(old, k)]
    retune = [n for n in changed if n in running and _retuned_only(old_sources[n], new_sources[n])]
    restarted = [n for n in changed if n not in retune]
    # with leases only a changed source that runs here restarts (under its lease); the fleet hands over what was
    # removed and takes up what was added. Without, removed and changed sources stop, added and changed ones start.
    stop = [n for n in (restarted if coordinated else removed + restarted) if n in running]
    return ReloadPlan(
        added,
        removed,
        changed,
        unchanged,
        restart_required,
        stop=stop,
        start=[] if coordinated else [n for n in new_sources if n in added or n in restarted],
        restart_if_held=stop if coordinated else [],
        hand_over=[n for n in removed if n in running] if coordinated else [],
        sources=list(new_sources),
        retune=retune,
    )


def _retuned_only(old: SourceConfig, new: SourceConfig) -> bool:
    """Whether ``new`` differs from ``old`` in ``RETUNABLE`` settings alone."""
    return old.model_copy(update={key: getattr(new, key) for key in RETUNABLE}) == new
