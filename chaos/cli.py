"""Command line: ``python -m chaos list`` and ``python -m chaos run (--smoke | --all | --scenario NAME...)``.

``--origin-server PATH`` runs the leaf (the origins) on another ``nats-server`` than the hub; on one older than 2.14
the bridge runs in pull mode and the fault kinds that cannot apply there are skipped and named in the report.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import shutil
import sys
import time
from pathlib import Path

from bridge.testing.servers import (
    ServerStartError,
    find_nats_server,
    origin_binary_option,
    origin_mode_expected,
    server_version,
)
from chaos.faults import FAULTS, inapplicable
from chaos.report import format_table, write_report
from chaos.runner import (
    FULL_PROFILE,
    SMOKE_PROFILE,
    ScenarioSpec,
    applicable,
    full_set,
    run_all,
    smoke_set,
    workdir,
)

DEFAULT_SEED = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description="Fault-injection proof of the bridge.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the fault kinds (each is also a scenario name)")
    run = sub.add_parser("run", help="run scenarios and check them")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--smoke", action="store_true", help="every fault kind once, a few thousand messages each")
    which.add_argument("--all", action="store_true", help="every fault kind repeated, plus the random nemesis")
    which.add_argument(
        "--scenario", action="append", choices=[*FAULTS, "nemesis"], help="one scenario (repeatable), for replays"
    )
    run.add_argument("--duration", type=float, help="seconds of workload: total for --all, each for --scenario")
    run.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED})")
    run.add_argument("--parallel", type=int, help="scenarios at once (default: 3 for --smoke, else 1)")
    run.add_argument("--once", action="store_true", help="with --scenario: inject the fault once, not repeatedly")
    run.add_argument("--smoke-profile", action="store_true", help="with --scenario: the smoke set's light workload")
    run.add_argument(
        "--only",
        metavar="SCENARIOS",
        help="with --smoke: only these scenarios of the smoke set (comma-separated names; the nemesis still draws "
        "from every kind that applies)",
    )
    run.add_argument("--out", type=Path, help="report directory (default chaos-results/<time>)")
    run.add_argument("--keep", action="store_true", help="keep every scenario's servers' data and logs")
    run.add_argument(
        "--origin-server",
        metavar="PATH",
        help="the leaf's (origins') nats-server, e.g. one older than 2.14 for pull mode "
        "(default: $NATS_ORIGIN_SERVER_BIN, else the hub's)",
    )
    run.add_argument(
        "--cluster",
        action="store_true",
        help="the hub as three nodes in one cluster, the aggregate and the lease bucket R3 (and the cluster's own "
        "fault kinds: hub-leader-kill, hub-rolling-restart, kv-leader-kill)",
    )
    run.add_argument(
        "--audit",
        action="store_true",
        help="afterwards, run nats-bridge audit on each aggregate and require it to agree with the checker",
    )
    run.add_argument(
        "--audit-only",
        metavar="SCENARIOS",
        help="with --audit: audit only these scenarios' aggregates (comma-separated names; each audit costs seconds "
        "of Spark: CI audits the scenarios whose faults leave the most for the audit to explain)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "list":
        for name in [*FAULTS, "nemesis"]:
            print(name)
        return 0
    command = "python -m chaos run"
    try:
        hub_binary = find_nats_server()
        origin_binary = origin_binary_option(args.origin_server)
        mode = origin_mode_expected(origin_binary)
        if origin_binary != hub_binary:
            # the replay commands must run the same origin
            command += f" --origin-server {shlex.quote(origin_binary)}"
            print(f"chaos: origin nats-server {origin_binary} (v{server_version(origin_binary)})", flush=True)
    except ServerStartError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    skipped = inapplicable(mode, cluster=args.cluster)
    if args.cluster:
        command += " --cluster"  # the replay commands must run a cluster too
    if args.only is not None and not args.smoke:
        print("--only needs --smoke", file=sys.stderr)
        return 2
    if args.smoke:
        specs = smoke_set(skip=skipped)
        parallel = args.parallel or 3
        label = f"{command} --smoke --seed {args.seed}"
        if args.only is not None:
            only = _chosen("--only", args.only, specs, "this smoke set")
            if only is None:
                return 2
            specs = [spec for spec in specs if spec.name in only]
            label += f" --only {','.join(spec.name for spec in specs)}"
    elif args.all:
        duration = args.duration or 600.0
        specs = full_set(duration, skip=skipped)
        parallel = args.parallel or 1
        label = f"{command} --all --duration {duration:g} --seed {args.seed}"
    else:
        duration = args.duration or 10.0
        profile = SMOKE_PROFILE if args.smoke_profile else FULL_PROFILE
        faults = {
            name: (applicable(skipped) if name == "nemesis" else (name,))
            for name in args.scenario
            if name not in skipped
        }
        specs = [ScenarioSpec(name, f, duration, not args.once, profile) for name, f in faults.items()]
        parallel = args.parallel or 1
        label = f"{command} " + " ".join(f"--scenario {n}" for n in dict.fromkeys(args.scenario))
        label += f" --seed {args.seed}"
    if parallel < 1:
        print("--parallel must be >= 1", file=sys.stderr)
        return 2
    if not specs:  # only kinds that cannot apply were named: a run would check nothing
        names = ", ".join(f"{kind} ({skipped[kind]})" for kind in dict.fromkeys(args.scenario))
        print(f"chaos: nothing to run in {mode} mode: {names}", file=sys.stderr)
        return 2
    audited = {spec.name for spec in specs}
    if args.audit_only is not None:
        if not args.audit:
            print("--audit-only needs --audit", file=sys.stderr)
            return 2
        picked = _chosen("--audit-only", args.audit_only, specs, "this run")
        if picked is None:
            return 2
        audited = picked
    out = args.out or Path("chaos-results") / time.strftime("%Y%m%d-%H%M%S")
    print(f"chaos: {len(specs)} scenario(s), seed {args.seed}, {parallel} at a time, report in {out}", flush=True)
    if skipped:
        print(f"chaos: {mode} mode on this origin; fault kinds skipped:", flush=True)
        for kind, reason in skipped.items():
            print(f"  {kind}: {reason}", flush=True)
    keep = args.keep or args.audit  # the audit reads each aggregate's store after the scenarios
    results = asyncio.run(
        run_all(
            specs,
            seed=args.seed,
            out=out,
            parallel=parallel,
            command=command,
            origin_binary=origin_binary,
            keep=keep,
            cluster=args.cluster,
        )
    )
    if args.audit:
        from chaos.audit import audit_results

        chosen = [r for r in results if r.name in audited]
        print(f"chaos: auditing {len(chosen)} aggregate(s) with nats-bridge audit", flush=True)
        audit_results(chosen, [workdir(out, r.name) for r in chosen], binary=None, keep=args.keep)
        for r in results:
            if r.name not in audited and r.ok and not args.keep:
                shutil.rmtree(workdir(out, r.name), ignore_errors=True)  # kept for an audit it does not get
        for r in chosen:
            seconds = r.audit["seconds"] if r.audit else "-"
            verdict = "agrees" if r.audit and not any(p.startswith("audit") for p in r.problems) else "DISAGREES"
            print(f"  {r.name:<24} audit {verdict} ({seconds}s)", flush=True)
    print(format_table(results, mode=mode, skipped=skipped))
    path = write_report(out, results, command=label, seed=args.seed, mode=mode, skipped=skipped)
    print(f"report: {path}")
    return 0 if all(r.ok for r in results) else 1


def _chosen(option: str, text: str, specs: list[ScenarioSpec], where: str) -> set[str] | None:
    """The scenario names ``option`` gives comma-separated, each one of ``specs``; None, the error printed, when one
    is not."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = sorted(names - {spec.name for spec in specs})
    if unknown:
        have = ", ".join(spec.name for spec in specs)
        print(f"{option}: no scenario {', '.join(unknown)} in {where} (it has: {have})", file=sys.stderr)
        return None
    return names
