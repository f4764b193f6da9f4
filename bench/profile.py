"""``python -m bench profile``: where the bridge's CPU goes while it drains a backlog.

One fresh hub + leaf, a WorkQueue origin preloaded with ``--messages`` messages of ``--size`` bytes, the bridge (in
the sidecar position, as ``bench run`` compares it) started under a profiler, the backlog drained, the bridge
stopped with SIGTERM (it must exit 0). Then:

- ``cprofile``: ``python -m cProfile -o FILE -m bridge run ...``; the functions with the most own time and the
  most cumulative time are printed (cProfile's own overhead inflates small functions, so read it for counts and
  shares, not for absolute microseconds);
- ``py-spy``: ``py-spy record`` attached to the bridge's PID at 250 Hz (sampling: no overhead inside the process),
  written as a flame graph SVG and a collapsed-stack file, of which the heaviest leaf functions are printed;
- ``none``: no profiler, for the plain CPU figure.

Every mode prints the bridge's CPU seconds per million messages over the drain (``/proc``, first copy to last), the
figure bench/RESULTS.md's targets are about.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import io
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from bench import natsops as ops
from bench.common import REPO_ROOT
from bench.model import BRIDGE
from bench.procs import bridge_core_build, cpu_seconds
from bench.runner import STALL_SECONDS, Options, _deadline, measure, start_bridge
from bench.world import World

PROFILERS = ("cprofile", "py-spy", "none")


def parser(sub: Any) -> None:
    """Add the ``profile`` subcommand to ``python -m bench``."""
    p = sub.add_parser("profile", help="drain a backlog with the bridge under cProfile or py-spy")
    p.add_argument("--profiler", choices=PROFILERS, default="cprofile", help="default cprofile")
    p.add_argument("--messages", type=int, default=200_000, help="backlog (default 200000)")
    p.add_argument("--size", type=int, default=256, help="payload bytes (default 256)")
    p.add_argument("--mode", default="auto", help="the source's mode (auto, flow_control, pull)")
    p.add_argument("--max-ack-pending", type=int, default=1000)
    p.add_argument("--top", type=int, default=30, help="rows of each listing (default 30)")
    p.add_argument("--out", type=Path, default=Path("bench/results/profile"), help="where profiles go")


def run(args: argparse.Namespace) -> int:
    """Drain the backlog under the chosen profiler and print where the time went."""
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = args.out / f"{stamp}-{args.profiler}-{args.size}-{args.mode}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    options = Options(workdir=workdir, max_ack_pending=args.max_ack_pending, keep=False, binary=None, mode=args.mode)
    figures: dict[str, float] = {}
    failure: list[str] = []

    async def body(world: World, leaf: Client, hub: Client) -> None:
        await ops.create_origin(leaf, "workqueue")
        await ops.preload(leaf, args.messages, args.size, deadline=_deadline(args.messages, 5000))
        await ops.create_aggregate(hub, native=False)
        interpreter = ("-m", "cProfile", "-o", f"{base}.prof") if args.profiler == "cprofile" else ()
        bridge = start_bridge(world, options, BRIDGE, interpreter_args=interpreter)
        assert bridge.pid is not None
        spy = _start_py_spy(bridge.pid, base) if args.profiler == "py-spy" else None
        marks: dict[str, float] = {}

        def on_first() -> None:
            marks["cpu"] = cpu_seconds(bridge.pid or 0)
            marks["sys"] = system_seconds(bridge.pid or 0)

        progress = await ops.wait_for_count(
            hub,
            args.messages,
            deadline=_deadline(args.messages),
            stall=STALL_SECONDS,
            on_first=on_first,
            alive=world.bridge_failure,
        )
        drained = max(1, args.messages - progress.first_seen_count)
        figures["cpu_us_per_msg"] = (cpu_seconds(bridge.pid) - marks["cpu"]) / drained * 1e6
        figures["sys_us_per_msg"] = (system_seconds(bridge.pid) - marks["sys"]) / drained * 1e6
        state = await ops.stream_state(hub, ops.AGGREGATE)
        figures["msgs_per_s"] = (state.last_seq - state.first_seq) / max(state.last_ts_ns - state.first_ts_ns, 1) * 1e9
        code = await asyncio.to_thread(bridge.stop, 60.0)
        if spy is not None:
            _stop_py_spy(spy)
        if code != 0:
            failure.append(f"bridge exited {code} on SIGTERM")

    try:
        measure(options, "profile", body, lambda: bool(failure))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if failure:
        print(failure[0], file=sys.stderr)
        return 1
    print(
        f"{args.messages:,} x {args.size} B, mode {args.mode}, core {bridge_core_build(REPO_ROOT)}, "
        f"profiler {args.profiler}: "
        f"{figures['msgs_per_s']:,.0f} msg/s, bridge CPU {figures['cpu_us_per_msg']:.1f} us/msg "
        f"(of which system {figures['sys_us_per_msg']:.1f})"
    )
    if args.profiler == "cprofile":
        print(cprofile_summary(Path(f"{base}.prof"), args.top))
        print(f"profile: {base}.prof")
    elif args.profiler == "py-spy":
        print(collapsed_summary(Path(f"{base}.collapsed"), args.top))
        print(f"flame graph: {base}.svg; stacks: {base}.collapsed")
    return 0


def system_seconds(pid: int) -> float:
    """The kernel's share of :func:`~bench.procs.cpu_seconds` (``stime``, field 15 of ``/proc/<pid>/stat``)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2 :].split()[12]) / os.sysconf("SC_CLK_TCK")


def cprofile_summary(path: Path, top: int) -> str:
    """The ``top`` functions by own time and by cumulative time."""
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def collapsed_summary(path: Path, top: int) -> str:
    """From py-spy's collapsed stacks: the share of samples per leaf function and per function anywhere on the stack."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            anywhere[frame] += count
    lines = [f"{total} samples; own share (leaf frames):"]
    lines += [f"  {n / total:6.1%}  {frame}" for frame, n in own.most_common(top)]
    lines.append("share with the function anywhere on the stack:")
    lines += [f"  {n / total:6.1%}  {frame}" for frame, n in anywhere.most_common(top)]
    return "\n".join(lines)


def _start_py_spy(pid: int, base: Path) -> list[subprocess.Popen[bytes]]:
    exe = Path(sys.executable).with_name("py-spy")
    if not exe.exists():
        raise SystemExit("py-spy is not installed in this venv: .venv/bin/pip install py-spy")
    common = [str(exe), "record", "--pid", str(pid), "--rate", "250", "--nonblocking"]
    return [
        subprocess.Popen([*common, "--format", "flamegraph", "-o", f"{base}.svg"], stdout=subprocess.DEVNULL),
        subprocess.Popen([*common, "--format", "raw", "-o", f"{base}.collapsed"], stdout=subprocess.DEVNULL),
    ]


def _stop_py_spy(procs: list[subprocess.Popen[bytes]]) -> None:
    # py-spy writes its output when the process it samples exits, or on SIGINT
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
