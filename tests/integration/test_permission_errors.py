"""A permission the bridge's user lacks is named wherever the bridge meets it, never shown as a request's timeout.

The server answers a denied publish or subscription only with an asynchronous permissions violation; the request
it stopped used to wait out its timeout ("no reply to ... within 5s"). Now ``check``, ``setup`` and ``status``
print one line saying ``permission denied``, the subject as the bridge sent it and docs/permissions.md, and
``run`` logs the same as the failure of what needed it, next to the connection's own ``origin.error`` /
``target.error`` / ``coordination.error`` line. One test per side: the origin, the target (the aggregate), the
coordination bucket, each with one permission taken from the users ``test_security`` builds.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import create_aggregate, create_stream
from bridge.testing.processes import BridgeFactory, fleet_instance, run_cli
from bridge.testing.servers import ServerFactory
from tests.integration.test_security import (
    ADMIN_PASSWORD,
    BRIDGE_AUTH,
    BRIDGE_PASSWORD,
    STOP_GRACE,
    Permissions,
    admin_url,
    assert_no_secret,
    client,
    origin_permissions,
    target_permissions,
    users_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BUCKET = "nats-bridge"
TIMEOUT_WORDS = ("no reply", "timed out", "no end of batch")


def assert_named(text: str, subject: str) -> str:
    """The first line of ``text`` naming the denial of ``subject``: each such line says ``permission denied``, the
    subject (quoted; a trailing ``.`` matches any subject it starts) and docs/permissions.md, and ``text`` says
    nothing of a timeout."""
    quoted = f'"{subject}' if subject.endswith(".") else f'"{subject}"'
    lines = [line for line in text.splitlines() if quoted in line]
    assert lines, f"nothing names {quoted}: {text}"
    for line in lines:
        assert "permission denied" in line and "docs/permissions.md" in line, line
    for words in TIMEOUT_WORDS:
        assert words not in text, text
    return lines[0]


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m bridge ARGS`` to completion, off the event loop (the test's clients stay served)."""
    done = await anyio.to_thread.run_sync(lambda: run_cli(*args, timeout=60))
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


def config_for(tmp_path: Path, spec: SourceSpec, target_url: str) -> Path:
    config = write_config(tmp_path / "bridge.toml", target_url=target_url, sources=[spec], target_extra=BRIDGE_AUTH)
    config.chmod(0o600)
    return config


async def test_an_origin_denial_is_named_by_check_run_and_status(
    tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """The origin's user may not look the consumer up (``CONSUMER.INFO``: a bound consumer, ``manage_consumer =
    false``, is looked up with it, and ``status`` reads its state with it)."""
    spec = SourceSpec(
        name="edge1", servers="", subject_prefix="edge.one", extra={**BRIDGE_AUTH, "manage_consumer": False}
    )
    missing = f"$JS.API.CONSUMER.INFO.{ORIGIN}.{spec.consumer_name}"
    perms = origin_permissions(ORIGIN, spec.consumer_name, spec.deliver_subject, managed=False).without(missing)
    origin = servers("origin", users_config(perms))
    target = servers("target", users_config(target_permissions(AGGREGATE, ["edge.one.>"])))
    spec.servers = origin.url
    config = config_for(tmp_path, spec, target.url)
    async with client(admin_url(origin)) as origin_nc, client(admin_url(target)) as target_nc:
        await create_stream(origin_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(target_nc)

        check = await cli("check", "-c", str(config))
        assert check.returncode == 1, check.stdout + check.stderr
        line = assert_named(check.stdout, missing)
        assert line.startswith("FAIL source edge1: permission denied: this account may not publish to "), line

        bridge = bridge_procs(config)
        await bridge.wait_event("source.setup_failed", timeout=30)
        failed = bridge.events("source.setup_failed")[0]
        assert failed["error_type"] == "PermissionDenied", failed
        assert_named(failed["error"], missing)
        # the connection's own line, the server's (lowercased) text, is still there
        connection = [e["error"] for e in bridge.events("origin.error")]
        assert any(f'publish to "{missing.lower()}"' in e for e in connection), connection
        assert bridge.is_running, "a denial is retried, as any failed setup"
        assert await bridge.astop(STOP_GRACE) == 0

        status = await cli("status", "-c", str(config))
        assert status.returncode == 1, status.stdout + status.stderr
        assert assert_named(status.stdout, missing).startswith("edge1: error: permission denied: "), status.stdout
    assert_no_secret(bridge, [BRIDGE_PASSWORD, ADMIN_PASSWORD])
    assert_no_secret(check.stdout + check.stderr + status.stdout + status.stderr, [BRIDGE_PASSWORD, ADMIN_PASSWORD])


@dataclass(frozen=True)
class Denial:
    """One permission taken from the bridge's user on the target's server, and where it shows."""

    subject: str  # the permission removed (exactly as the bridge sends it)
    command: str  # the CLI command run against it
    line: str  # how the command's line naming it starts
    aggregate: bool = True  # the aggregate exists (created by the test's admin) before the command runs
    run: str | None = None  # with `run` too: the event whose error names it
    field: str = "error"  # that event's field holding the message


TARGET = {
    "stream-info-check-and-run": Denial(
        f"$JS.API.STREAM.INFO.{AGGREGATE}",
        "check",
        f"FAIL target stream {AGGREGATE}: permission denied: ",
        run="source.setup_failed",
    ),
    "stream-create-setup": Denial(
        f"$JS.API.STREAM.CREATE.{AGGREGATE}",
        "setup",
        f"FAIL     aggregate stream {AGGREGATE}: permission denied: ",
        aggregate=False,
    ),
}

COORDINATION = {
    "bucket-create-setup": Denial(
        f"$JS.API.STREAM.CREATE.KV_{BUCKET}", "setup", f"FAIL     coordination bucket {BUCKET}: permission denied: "
    ),
    "bucket-read-check": Denial(
        f"$JS.API.DIRECT.GET.KV_{BUCKET}", "check", f"FAIL coordination bucket {BUCKET}: permission denied: "
    ),
    "lease-write-run": Denial(
        f"$KV.{BUCKET}.>", "check", f"OK   coordination bucket {BUCKET}: ", run="fleet.presence_failed", field="reason"
    ),
}


async def denied_on_the_target(
    denial: Denial, tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """Run ``denial.command`` (and ``run`` when asked) with the bridge's target user lacking ``denial.subject``; the
    origin is an open server. Asserts what the command printed and the bridge logged."""
    spec = SourceSpec(name="edge1", servers="", subject_prefix="edge.one")
    create = Permissions(publish=(f"$JS.API.STREAM.CREATE.{AGGREGATE}",), subscribe=())  # what setup needs besides
    perms = (target_permissions(AGGREGATE, ["edge.one.>"], bucket=BUCKET) + create).without(denial.subject)
    origin = servers("origin", "")
    target = servers("target", users_config(perms))
    spec.servers = origin.url
    config = config_for(tmp_path, spec, target.url)
    async with client(origin.url) as origin_nc, client(admin_url(target)) as target_nc:
        await create_stream(origin_nc, ORIGIN, ["orders.>"], retention="workqueue")
        if denial.aggregate:
            await create_aggregate(target_nc)

        done = await cli(denial.command, "-c", str(config))
        output = done.stdout + done.stderr
        if denial.subject.endswith(">"):  # the lease writes: nothing of the command needs them
            assert done.returncode == 0, output
            assert any(line.startswith(denial.line) for line in done.stdout.splitlines()), output
        else:
            assert done.returncode == 1, output
            assert assert_named(done.stdout, denial.subject).startswith(denial.line), done.stdout
        assert_no_secret(output, [BRIDGE_PASSWORD, ADMIN_PASSWORD])
        if denial.run is None:
            return

        # the lease writes name the key written: this process's presence, by its instance id
        named = f"$KV.{BUCKET}.presence.one" if denial.subject.endswith(">") else denial.subject
        bridge = fleet_instance(bridge_procs, config, "one")
        await bridge.wait_event(denial.run, timeout=30)
        assert_named(bridge.events(denial.run)[0][denial.field], named)
        # the connection's own line, the server's lowercased text, is still there (the first denial of the lease
        # writes may be of a lease's key rather than the presence's: the line is logged once per 30 s)
        connection = "coordination.error" if "KV" in denial.subject else "target.error"
        server_text = f'"{denial.subject.rstrip(">").lower()}' if denial.subject.endswith(">") else f'"{named.lower()}"'
        await bridge.wait_event(connection, timeout=10)
        assert any(server_text in e["error"] for e in bridge.events(connection)), bridge.events(connection)
        if denial.subject.startswith("$JS.API.STREAM.INFO"):  # the daemon's own look at the aggregate, at start
            (unavailable,) = bridge.events("target.stream_unavailable")
            assert_named(unavailable["error"], named)
        assert bridge.is_running
        assert await bridge.astop(STOP_GRACE) == 0
        assert_no_secret(bridge, [BRIDGE_PASSWORD, ADMIN_PASSWORD])


@pytest.mark.parametrize("case", list(TARGET))
async def test_a_target_denial_is_named(
    case: str, tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """The aggregate's server: its stream info (``check``; ``run`` reads the aggregate back at start), or its creation
    (``setup``, with the bridge's own user rather than an administrator's)."""
    await denied_on_the_target(TARGET[case], tmp_path, servers, bridge_procs)


@pytest.mark.parametrize("case", list(COORDINATION))
async def test_a_coordination_bucket_denial_is_named(
    case: str, tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """The lease bucket, on the target's server: its creation (``setup``), its reading by Direct Get (``check``), its
    writes (``run``: the process stays a standby, its presence refused)."""
    await denied_on_the_target(COORDINATION[case], tmp_path, servers, bridge_procs)
