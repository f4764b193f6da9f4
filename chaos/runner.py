"""Runs scenarios: topology up, workload and nemesis, convergence, SIGTERM, check, teardown.

A scenario is a name, the fault kinds its nemesis draws from, and a workload duration. A named scenario repeats
one fault kind (once in the smoke set); the ``nemesis`` scenario draws from all of them. Every random choice comes
from ``Random(f"{seed}:{name}")``, so ``--seed`` and ``--scenario`` replay a scenario's schedule whatever else ran
beside it.

In pull mode (an origin older than nats-server 2.14) the fault kinds that cannot apply there
(:func:`chaos.faults.inapplicable`) are left out of the sets, the nemesis's draw included; the caller reports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos.checker import FORWARD_RESET, check_run, coverage
from chaos.faults import FAULTS, FaultContext
from chaos.model import DeletionSample, PublishLog, ScenarioResult
from chaos.reader import AggregateReader, remaining_seqs, stream_state
from chaos.topology import AGGREGATE, ChaosTopology
from chaos.workload import Profile, Publisher

SAMPLE_INTERVAL = 0.25
CONSUMER_TIMEOUT = 30.0
CONVERGE_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0
FIRST_FAULT_AT = 2.0
TAIL_AFTER_LAST_HEAL = 2.0


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    name: str
    faults: tuple[str, ...]
    duration: float
    repeat: bool  # keep injecting (one at a time) until the duration is up; else exactly one fault
    profile: Profile


SMOKE_PROFILE = Profile(concurrency=1, trickle_rate=25.0, burst_seconds=(0.3, 0.8), trickle_seconds=(0.5, 1.5))
FULL_PROFILE = Profile(concurrency=8, trickle_rate=40.0, burst_seconds=(1.5, 4.0), trickle_seconds=(0.5, 1.5))


def applicable(skip: Collection[str] = ()) -> tuple[str, ...]:
    """The fault kinds, in registry order, but those in ``skip``."""
    return tuple(name for name in FAULTS if name not in skip)


def smoke_set(duration: float = 6.0, *, skip: Collection[str] = ()) -> list[ScenarioSpec]:
    """Every fault kind but those in ``skip`` once, plus a short random nemesis drawing from the same kinds."""
    kinds = applicable(skip)
    specs = [ScenarioSpec(name, (name,), duration, False, SMOKE_PROFILE) for name in kinds]
    specs.append(ScenarioSpec("nemesis", kinds, 20.0, True, SMOKE_PROFILE))
    return specs


def full_set(total: float, *, skip: Collection[str] = ()) -> list[ScenarioSpec]:
    """Every fault kind but those in ``skip`` repeated over its share of ``total`` seconds, and the random nemesis
    (drawing from the same kinds) over a fifth."""
    kinds = applicable(skip)
    nemesis = total / 5
    each = (total - nemesis) / len(kinds)
    specs = [ScenarioSpec(name, (name,), each, True, FULL_PROFILE) for name in kinds]
    specs.append(ScenarioSpec("nemesis", kinds, nemesis, True, FULL_PROFILE))
    return specs


class Scenario:
    """One run of one :class:`ScenarioSpec` in ``workdir`` (kept on failure, or with ``keep``)."""

    def __init__(
        self,
        spec: ScenarioSpec,
        seed: int,
        workdir: Path,
        command: str,
        binary: str | None,
        origin_binary: str | None = None,
        cluster: bool = False,
    ) -> None:
        self.spec = spec
        self.seed = seed
        self.workdir = workdir
        self.rng = random.Random(f"{seed}:{spec.name}")
        self.topo = ChaosTopology(workdir, binary=binary, origin_binary=origin_binary, cluster=cluster)
        self.result = ScenarioResult(spec.name, seed, command)
        self.logs = {s.name: PublishLog(s.name) for s in self.topo.sources}
        self.samples: list[DeletionSample] = []
        self.ctx = FaultContext(self.topo)

    async def run(self, keep: bool = False) -> ScenarioResult:
        """Run the scenario; its directory is removed afterwards if it passed, unless ``keep``."""
        started = time.monotonic()
        try:
            await self.topo.start()
            await self._wait_consumers()
            await self._drive()
            await self._finish()
        except Exception as exc:
            self.result.problems.append(f"harness error: {exc!r}")
            self.result.problems.append(f"bridge log tails:\n{self.topo.logs_tail(30)}")
        finally:
            await self.topo.close()
            self.result.timeline = self.ctx.timeline
            self.result.problems[:0] = self.ctx.problems
            self.result.wall_seconds = time.monotonic() - started
        if self.result.ok and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.result

    async def _wait_consumers(self) -> None:
        """An Interest origin drops what is published before its consumer exists: wait until the bridge made
        every consumer (polled against a deadline)."""
        deadline = time.monotonic() + CONSUMER_TIMEOUT
        for source in self.topo.sources:
            while True:
                info = await self.topo.api("leaf", f"CONSUMER.INFO.{source.stream}.{source.consumer}")
                if "error" not in info:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the bridge did not create {source.consumer} within {CONSUMER_TIMEOUT:g}s")
                await asyncio.sleep(0.05)

    async def _drive(self) -> None:
        stop = asyncio.Event()
        publishers = [
            Publisher(self.topo.leaf, s, self.logs[s.name], random.Random(self.rng.random()), self.spec.profile)
            for s in self.topo.sources
        ]
        self.ctx.started = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            for publisher in publishers:
                tg.create_task(publisher.run(stop))
            tg.create_task(self._sample(stop))
            try:
                await self._nemesis()
                remaining = self.spec.duration - self.ctx.now()
                if remaining > 0:
                    await asyncio.sleep(remaining)  # the workload's length, by design
            finally:
                stop.set()
        self.result.workload_seconds = self.ctx.now()

    async def _nemesis(self) -> None:
        await asyncio.sleep(FIRST_FAULT_AT)
        while True:
            name = self.rng.choice(self.spec.faults)
            try:
                await FAULTS[name](self.ctx, self.rng)
            except Exception as exc:
                self.ctx.problems.append(f"{name} at +{self.ctx.now():.1f}s could not be injected: {exc!r}")
                return
            if not self.spec.repeat:
                await asyncio.sleep(TAIL_AFTER_LAST_HEAL)
                return
            gap = self.rng.uniform(1.0, 3.0)
            if self.ctx.now() + gap >= self.spec.duration:
                return
            await asyncio.sleep(gap)

    async def _sample(self, stop: asyncio.Event) -> None:
        """Origin ``first_seq`` then aggregate ``last_seq``, every SAMPLE_INTERVAL (see DeletionSample)."""
        while not stop.is_set():
            with contextlib.suppress(Exception):
                firsts = [
                    (s.name, int((await stream_state(self.topo.leaf, s.stream, timeout=1.0))["first_seq"]))
                    for s in self.topo.sources
                ]
                last = int((await stream_state(self.topo.hub, AGGREGATE, timeout=1.0))["last_seq"])
                self.samples.extend(DeletionSample(name, first, last) for name, first in firsts)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_INTERVAL)

    async def _converged(self, reader: AggregateReader, missing: dict[str, set[int]]) -> bool:
        start = len(reader.copies)
        await reader.poll()
        for copy in reader.copies[start:]:
            if copy.source in missing:
                missing[copy.source].discard(copy.n)
        if any(missing.values()):
            return False
        for source in self.topo.sources:
            skipped = coverage(e for e in self.ctx.excuses if e.source == source.name and e.reason == FORWARD_RESET)
            left = await remaining_seqs(self.topo.leaf, source.stream)
            if not all(skipped(seq) for seq in left):
                return False
        return True

    async def _finish(self) -> None:
        reader = AggregateReader(self.topo.hub, AGGREGATE)
        missing = {}
        for name, log in self.logs.items():
            excused = coverage(e for e in self.ctx.excuses if e.source == name)
            missing[name] = {n for n, seq in log.acked.items() if not excused(seq)}
        deadline = time.monotonic() + CONVERGE_TIMEOUT
        while True:
            with contextlib.suppress(Exception):
                if await self._converged(reader, missing):
                    break
            if time.monotonic() > deadline:
                left = {name: len(ns) for name, ns in missing.items()}
                self.result.problems.append(
                    f"not converged {CONVERGE_TIMEOUT:g}s after the workload: still missing {left}"
                )
                break
            await asyncio.sleep(0.25)
        for bridge in self.topo.bridges:
            name = bridge.log_path.stem
            if not bridge.is_running:
                self.result.problems.append(f"{name} was not running at the end (exit codes {bridge.returncodes})")
                continue
            try:
                code = await asyncio.to_thread(bridge.stop, STOP_TIMEOUT)
                if code != 0:
                    self.result.problems.append(f"{name} exited with {code} after SIGTERM, not 0")
            except TimeoutError as exc:
                self.result.problems.append(f"{name}: {exc}")
        await reader.poll()
        remaining = {s.name: await remaining_seqs(self.topo.leaf, s.stream) for s in self.topo.sources}
        self.result.verdicts = check_run(
            self.logs,
            {s.name: s.retention for s in self.topo.sources},
            reader.copies,
            self.ctx.excuses,
            self.samples,
            remaining,
        )


def workdir(out: Path, name: str) -> Path:
    """The directory scenario ``name`` runs in (servers' stores and logs, the bridge's config and log)."""
    return out / "work" / name


async def run_all(
    specs: Sequence[ScenarioSpec],
    *,
    seed: int,
    out: Path,
    parallel: int,
    command: str,
    binary: str | None = None,
    origin_binary: str | None = None,
    keep: bool = False,
    cluster: bool = False,
) -> list[ScenarioResult]:
    """Run ``specs``, at most ``parallel`` at a time; results in the order of ``specs``. Scenario ``name`` works in
    :func:`workdir` ``(out, name)``. ``binary`` is the hub's ``nats-server``, ``origin_binary`` the leaf's (default:
    the hub's); ``cluster``: the hub is three nodes (:class:`chaos.topology.ChaosTopology`)."""
    limit = asyncio.Semaphore(parallel)
    results: list[ScenarioResult | None] = [None] * len(specs)

    async def one(i: int, spec: ScenarioSpec) -> None:
        async with limit:
            replay = f"{command} --scenario {spec.name} --seed {seed} --duration {spec.duration:g}"
            if not spec.repeat:
                replay += " --once"
            if spec.profile == SMOKE_PROFILE:
                replay += " --smoke-profile"
            scenario = Scenario(spec, seed, workdir(out, spec.name), replay, binary, origin_binary, cluster)
            result = await scenario.run(keep=keep)
            results[i] = result
            verdict = "OK" if result.ok else "FAIL"
            print(
                f"  {spec.name:<24} {verdict:<4} acked {result.total('acked'):>8}  faults {result.faults:>3}  "
                f"{result.wall_seconds:6.1f}s",
                flush=True,
            )

    async with asyncio.TaskGroup() as tg:
        for i, spec in enumerate(specs):
            tg.create_task(one(i, spec))
    return [r for r in results if r is not None]
