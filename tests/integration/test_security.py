"""Authentication, TLS and least-privilege permissions, against servers configured to require them.

Mostly in the edge position: the bridge's source connects to the origin server and its target to the aggregate's
server, two independent servers each requiring the method under test (no leaf link involved). Every method is used
on both sides at once: token (from ``NATS_BRIDGE_*`` variables), user/password, NKey seed file, creds file
(operator mode, JWTs signed here), TLS verified with ``tls.ca_file``, and mutual TLS. A refused connection is
logged (and printed by ``check``) naming the problem and never the secret; a token in a configuration file every
local user can read is warned about by ``check`` and ``run``. The least-privilege tests run the
bridge as a user holding exactly the permissions of ``docs/permissions.md`` (edge and sidecar positions) and show
what the log says when one is missing.

Certificates come from the ``openssl`` tool (the TLS cases skip, saying so, without it); keys and JWTs from the
``nkeys`` package the bridge already depends on (``bridge.testing.security``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
from nats.aio.client import Client

from bridge.config import load_config
from bridge.io.consumer import desired_config
from bridge.io.shared import CONNECTION_NAME
from bridge.testing.configs import AGGREGATE, ORIGIN, SourceSpec, write_config
from bridge.testing.jetstream import (
    Publisher,
    ack_floor,
    aggregate_count,
    assert_exact,
    consumer_exists,
    consumer_info,
    create_aggregate,
    create_stream,
    js_request,
    read_stream,
    seqs_by_source,
    stream_messages,
)
from bridge.testing.polling import assert_holds, wait_for_value, wait_until
from bridge.testing.processes import BridgeFactory, BridgeProcess, run_cli
from bridge.testing.security import Operator, TlsFiles, make_tls, new_nkey, permissions_block, write_secret
from bridge.testing.servers import READY_EVENTS, NatsServer, ServerFactory, Topology, conf_str

N = 300
STOP_GRACE = 15.0


@contextlib.asynccontextmanager
async def client(url: str, **options: Any) -> AsyncIterator[Client]:
    """A test client with the given auth/TLS options (nats-py ``connect`` keywords)."""
    nc = await nats.connect(url, connect_timeout=2, max_reconnect_attempts=-1, reconnect_time_wait=0.1, **options)
    try:
        yield nc
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


def tls_client_context(tls: TlsFiles, *, client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tls.ca))
    if client_cert:
        ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    return ctx


def assert_no_secret(bridge: BridgeProcess | str, secret_values: Sequence[str]) -> None:
    text = bridge if isinstance(bridge, str) else bridge.log_text()
    for value in secret_values:
        assert value not in text, "a secret appears in the bridge's output"
    assert "Traceback" not in text


def run_check(config: Path, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m bridge check -c CONFIG`` with extra environment variables, to completion."""
    return run_cli("check", "-c", str(config), env=env, timeout=60)


# --- one secured side -------------------------------------------------------------------------------------


@dataclass
class Secured:
    """A server requiring one method, and how the bridge (config + environment) and the test client pass it."""

    server_config: str
    auth: dict[str, Any] | None = None  # the side's [auth] table in the bridge's file
    tls: dict[str, Any] | None = None  # the side's [tls] table
    env: dict[str, str] = field(default_factory=dict)  # NATS_BRIDGE_* variables for the bridge
    client: dict[str, Any] = field(default_factory=dict)  # nats-py connect options for the test's own client
    secrets: list[str] = field(default_factory=list)  # must never appear in the bridge's log
    scheme: str = "nats"

    def url(self, server: NatsServer) -> str:
        return server.url.replace("nats://", f"{self.scheme}://")

    def extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.auth:
            out["auth"] = self.auth
        if self.tls:
            out["tls"] = self.tls
        return out


def secure(method: str, directory: Path, env_prefix: str) -> Secured:
    """A side requiring ``method``; ``env_prefix`` is the side's variable prefix (``NATS_BRIDGE_TARGET__``)."""
    directory.mkdir(parents=True, exist_ok=True)
    if method == "token":
        token = secrets.token_urlsafe(24)
        return Secured(
            f"authorization {{ token: {conf_str(token)} }}",
            env={f"{env_prefix}AUTH__TOKEN": token},  # the secret never touches the file
            client={"token": token},
            secrets=[token],
        )
    if method == "user-password":
        password = secrets.token_urlsafe(24)
        users = f"{{user: bridge, password: {conf_str(password)}}}"
        return Secured(
            f"authorization {{ users = [ {users} ] }}",
            auth={"user": "bridge", "password": password},
            client={"user": "bridge", "password": password},
            secrets=[password],
        )
    if method == "nkey":
        key = new_nkey()
        seed_file = write_secret(directory / "bridge.nk", key.seed + "\n")
        return Secured(
            f"authorization {{ users = [ {{nkey: {conf_str(key.public)}}} ] }}",
            auth={"nkey_seed_file": str(seed_file)},
            client={"nkeys_seed": str(seed_file)},
            secrets=[key.seed],
        )
    if method == "creds":
        operator = Operator()
        creds = operator.user_creds(directory / "bridge.creds", "bridge")
        seed = next(line for line in creds.read_text().splitlines() if line.startswith("SU"))
        return Secured(
            operator.server_config(),
            auth={"creds_file": str(creds)},
            client={"user_credentials": str(creds)},
            secrets=[seed],
        )
    if method in ("tls", "mtls"):
        tls = make_tls(directory / "tls")
        mutual = method == "mtls"
        table = {"ca_file": str(tls.ca)}
        if mutual:
            table |= {"cert_file": str(tls.client_cert), "key_file": str(tls.client_key)}
        return Secured(
            tls.server_block(verify=mutual),
            tls=table,
            client={"tls": tls_client_context(tls, client_cert=mutual)},
            scheme="tls" if method == "tls" else "nats",  # both URL forms: nats:// upgrades when the server says so
        )
    raise ValueError(method)


# --- every method, on both sides --------------------------------------------------------------------------


async def replicate_and_check(
    bridge_procs: BridgeFactory,
    config: Path,
    origin_nc: Client,
    target_nc: Client,
    *,
    env: Mapping[str, str] | None = None,
    n: int = N,
) -> BridgeProcess:
    """Start the bridge, publish ``n`` messages into the WorkQueue origin, wait until all are copied and acked."""
    bridge = bridge_procs(config, env=dict(env or {}))
    await bridge.wait_event(READY_EVENTS, timeout=20)
    before = await aggregate_count(target_nc, "edge.one.>")
    await Publisher(origin_nc, n).run()
    await wait_for_value(
        lambda: aggregate_count(target_nc, "edge.one.>"), before + n, timeout=30, what="copies", interval=0.1
    )
    await wait_for_value(lambda: stream_messages(origin_nc, ORIGIN), 0, timeout=15, what="origin messages left")
    assert await bridge.astop(STOP_GRACE) == 0
    return bridge


@pytest.mark.anyio
@pytest.mark.parametrize("method", ["token", "user-password", "nkey", "creds", "tls", "mtls"])
async def test_replicates_with_each_auth_method(
    method: str, tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """The origin and the aggregate's server both require ``method`` (different secrets); ``N`` messages arrive
    exactly once, in order, and no secret is ever logged. The token comes from ``NATS_BRIDGE_*`` variables."""
    origin_side = secure(method, tmp_path / "origin-secrets", "NATS_BRIDGE_SOURCES__0__")
    target_side = secure(method, tmp_path / "target-secrets", "NATS_BRIDGE_TARGET__")
    origin = servers("origin", origin_side.server_config)
    target = servers("target", target_side.server_config)
    spec = SourceSpec(
        name="edge1",
        servers=origin_side.url(origin),
        subject_prefix="edge.one",
        max_ack_pending=100,
        extra=origin_side.extra(),
    )
    config = write_config(
        tmp_path / "bridge.toml", target_url=target_side.url(target), sources=[spec], target_extra=target_side.extra()
    )
    config.chmod(0o600)
    async with (
        client(origin_side.url(origin), **origin_side.client) as origin_nc,
        client(target_side.url(target), **target_side.client) as target_nc,
    ):
        await create_stream(origin_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(target_nc)
        bridge = await replicate_and_check(
            bridge_procs, config, origin_nc, target_nc, env={**origin_side.env, **target_side.env}
        )
        assert_exact(seqs_by_source(await read_stream(target_nc, AGGREGATE)).get("edge1", []), range(1, N + 1), method)
    assert bridge.count("origin.connected") == 1 and bridge.count("target.connected") == 1
    assert_no_secret(bridge, origin_side.secrets + target_side.secrets)
    config_text = config.read_text()
    for variable, value in {**origin_side.env, **target_side.env}.items():
        assert value not in config_text, f"{variable} was meant to come from the environment only"


# --- refused connections ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    side: str  # which side is refused: "origin" or "target"
    expect: str  # what the error must say (compared lowercased)
    build: Callable[[Path], tuple[Secured, Secured]]  # (what the server requires, what the bridge is given)


def _wrong_token(directory: Path) -> tuple[Secured, Secured]:
    server = secure("token", directory / "server", "NATS_BRIDGE_TARGET__")
    wrong = secrets.token_urlsafe(24)
    given = Secured("", env={"NATS_BRIDGE_TARGET__AUTH__TOKEN": wrong}, secrets=[wrong])
    return server, given


def _wrong_password(directory: Path) -> tuple[Secured, Secured]:
    server = secure("user-password", directory / "server", "")
    wrong = secrets.token_urlsafe(24)
    return server, Secured("", auth={"user": "bridge", "password": wrong}, secrets=[wrong])


def _unknown_nkey(directory: Path) -> tuple[Secured, Secured]:
    server = secure("nkey", directory / "server", "")
    return server, secure("nkey", directory / "bridge", "")  # another key, unknown to the server


def _untrusted_server_cert(directory: Path) -> tuple[Secured, Secured]:
    server = secure("tls", directory / "server", "")
    tls = make_tls(directory / "bridge-tls")
    return server, Secured("", tls={"ca_file": str(tls.other_ca)})


def _no_client_cert(directory: Path) -> tuple[Secured, Secured]:
    server = secure("mtls", directory / "server", "")
    assert server.tls is not None
    return server, Secured("", tls={"ca_file": server.tls["ca_file"]})


REFUSALS = {
    "target-wrong-token-from-env": Refusal("target", "authorization violation", _wrong_token),
    "origin-wrong-password": Refusal("origin", "authorization violation", _wrong_password),
    "origin-unknown-nkey": Refusal("origin", "authorization violation", _unknown_nkey),
    "target-untrusted-server-certificate": Refusal("target", "certificate verify failed", _untrusted_server_cert),
    "origin-mtls-without-client-certificate": Refusal("origin", "certificate required", _no_client_cert),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(REFUSALS))
async def test_refused_connection_is_named_and_secret_free(
    case: str, tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    refusal = REFUSALS[case]
    required, given = refusal.build(tmp_path / "secrets")
    secured = servers("secured", required.server_config)
    plain = servers("plain", "")
    if refusal.side == "origin":
        spec = SourceSpec(name="edge1", servers=required.url(secured), extra=given.extra())
        config = write_config(tmp_path / "bridge.toml", target_url=plain.url, sources=[spec])
        event = "source.setup_failed"
    else:
        spec = SourceSpec(name="edge1", servers=plain.url)
        config = write_config(
            tmp_path / "bridge.toml", target_url=required.url(secured), sources=[spec], target_extra=given.extra()
        )
        event = "target.connect_failed"
    config.chmod(0o600)
    bridge = bridge_procs(config, env=given.env)
    await bridge.wait_event(event, timeout=20)
    errors = [e.get("error", "") for e in bridge.events() if e.get("event") == event]
    assert any(refusal.expect in error.lower() for error in errors), errors
    assert any(secured.url.split("//")[1] in error for error in errors), f"the error names the server: {errors}"
    assert bridge.is_running, "a refused connection is retried, not fatal"
    assert await bridge.astop(STOP_GRACE) == 0
    assert_no_secret(bridge, required.secrets + given.secrets)

    check = run_check(config, given.env)
    output = check.stdout + check.stderr
    assert check.returncode == 1, output
    assert f"FAIL {'target' if refusal.side == 'target' else 'source edge1'}: cannot connect" in output, output
    assert refusal.expect in output.lower(), output
    assert_no_secret(output, required.secrets + given.secrets)


# --- secrets in a file others can read ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_world_readable_token_in_the_config_is_warned_about_and_never_printed(
    tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """The origin requires a token written in the configuration file, and the file is mode 0644: ``check`` and
    ``run`` (the real CLI) say so, naming the key and the ``chmod``, and still work; the token is never printed."""
    required = secure("token", tmp_path / "secrets", "")
    origin = servers("origin", required.server_config)
    target = servers("target", "")
    (token,) = required.secrets
    spec = SourceSpec(name="edge1", servers=origin.url, subject_prefix="edge.one", extra={"auth": {"token": token}})
    config = write_config(tmp_path / "bridge.toml", target_url=target.url, sources=[spec])
    config.chmod(0o644)
    async with client(origin.url, **required.client) as origin_nc, client(target.url) as target_nc:
        await create_stream(origin_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(target_nc)

        check = await anyio.to_thread.run_sync(run_check, config)
        output = check.stdout + check.stderr
        assert check.returncode == 0, output
        (warning,) = [line for line in check.stdout.splitlines() if line.startswith("WARN secrets:")]
        assert str(config) in warning and "sources[0].auth.token" in warning and f"chmod o-r {config}" in warning
        assert_no_secret(output, required.secrets)

        bridge = await replicate_and_check(bridge_procs, config, origin_nc, target_nc, n=50)
        (event,) = [e for e in bridge.events() if e.get("event") == "config.secret_exposed"]
        assert event["level"] == "warning" and "sources[0].auth.token" in event["problem"], event
        assert f"chmod o-r {config}" in event["problem"], event
        assert_no_secret(bridge, required.secrets)

    # the warning is about the file's mode, not about tokens in files as such
    config.chmod(0o600)
    quiet = await anyio.to_thread.run_sync(run_check, config)
    assert quiet.returncode == 0 and "WARN secrets" not in quiet.stdout + quiet.stderr, quiet.stdout + quiet.stderr


# --- least privilege --------------------------------------------------------------------------------------
# The lists below are docs/permissions.md's, for the names used here; keep the two in step.


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def without(self, subject: str) -> Permissions:
        assert subject in self.publish + self.subscribe, subject
        return Permissions(
            tuple(s for s in self.publish if s != subject), tuple(s for s in self.subscribe if s != subject)
        )

    def __add__(self, other: Permissions) -> Permissions:
        return Permissions(self.publish + other.publish, self.subscribe + other.subscribe)


def origin_permissions(
    stream: str, consumer: str, deliver_subject: str, *, managed: bool = True, api: str = "$JS.API"
) -> Permissions:
    """What the bridge's user needs on the server it reaches the origin stream through, flow-control mode, as
    docs/permissions.md lists it: a managed consumer is created (no ``CONSUMER.INFO``: ``mode = "auto"`` on a 2.14+
    origin reads the durable only when the create is refused), a bound one looked up instead."""
    bind = f"{api}.CONSUMER.CREATE.{stream}.{consumer}" if managed else f"{api}.CONSUMER.INFO.{stream}.{consumer}"
    return Permissions(
        publish=(
            f"{api}.STREAM.INFO.{stream}",
            f"{api}.STREAM.LIST",
            bind,
            f"{api}.CONSUMER.RESET.{stream}.{consumer}",
            f"$JS.FC.{stream}.{consumer}.*",
        ),
        subscribe=(deliver_subject, "_INBOX.>"),
    )


def target_permissions(
    stream: str,
    subjects: Sequence[str],
    *,
    direct: bool = True,
    api: str = "$JS.API",
    bucket: str = "nats-bridge",
    registry: bool = True,
) -> Permissions:
    """What the bridge's user needs on the aggregate's server, the coordination bucket (leases) and the source
    registry (read only: ``nats-bridge sources`` writes it, with an operator's user) included."""
    # Direct Get's short replies are checked with the leader's STREAM.MSG.GET (bridge.io.directget)
    read = (
        (f"{api}.DIRECT.GET.{stream}", f"{api}.STREAM.MSG.GET.{stream}")
        if direct
        else (f"{api}.STREAM.MSG.GET.{stream}",)
    )
    leases = (
        f"{api}.STREAM.INFO.KV_{bucket}",
        f"{api}.STREAM.CREATE.KV_{bucket}",
        f"{api}.DIRECT.GET.KV_{bucket}",
        f"$KV.{bucket}.>",
    )
    perms = Permissions(publish=(f"{api}.STREAM.INFO.{stream}", *read, *subjects, *leases), subscribe=("_INBOX.>",))
    return perms + registry_permissions(api=api, bucket=bucket) if registry else perms


def registry_permissions(*, api: str = "$JS.API", bucket: str = "nats-bridge") -> Permissions:
    """The source registry, as a process of the fleet reads it (docs/permissions.md)."""
    return Permissions(
        publish=(f"{api}.STREAM.INFO.KV_{bucket}-sources", f"{api}.DIRECT.GET.KV_{bucket}-sources"),
        subscribe=(f"$KV.{bucket}-sources.source.>",),
    )


def leaf_link_permissions(stream: str, consumer: str, deliver_subject: str, *, leaf_domain: str) -> Permissions:
    """Sidecar position: what the user the leaf links into the hub with must allow for the bridge's traffic.

    For a leafnode connection ``publish`` is what the leaf may send into the hub, ``subscribe`` what it may receive.
    """
    api = f"$JS.{leaf_domain}.API"
    return Permissions(
        publish=(deliver_subject, "_INBOX.>"),
        subscribe=(
            f"{api}.STREAM.INFO.{stream}",
            f"{api}.STREAM.LIST",
            f"{api}.CONSUMER.CREATE.{stream}.{consumer}",
            f"{api}.CONSUMER.RESET.{stream}.{consumer}",
            f"$JS.FC.{stream}.{consumer}.*",
        ),
    )


ADMIN_PASSWORD = "admin-" + secrets.token_hex(8)
BRIDGE_PASSWORD = "bridge-" + secrets.token_hex(8)


def users_config(bridge: Permissions, *extra_users: str) -> str:
    """An ``authorization`` block: an unrestricted ``admin`` (the test) and ``bridge`` with exactly ``bridge``."""
    # an empty allow list would mean "everything": keep one harmless subject in it instead
    publish = list(bridge.publish) or ["nothing.allowed"]
    subscribe = list(bridge.subscribe) or ["nothing.allowed"]
    users = [
        f"{{user: admin, password: {conf_str(ADMIN_PASSWORD)}}}",
        f"{{user: bridge, password: {conf_str(BRIDGE_PASSWORD)}, {permissions_block(publish, subscribe)}}}",
        *extra_users,
    ]
    return "authorization {\n  users = [\n    " + "\n    ".join(users) + "\n  ]\n}"


def admin_url(server: NatsServer) -> str:
    return server.url.replace("nats://", f"nats://admin:{ADMIN_PASSWORD}@")


BRIDGE_AUTH = {"auth": {"user": "bridge", "password": BRIDGE_PASSWORD}}
ORIGIN_B = "ORDERS_B"


@dataclass(frozen=True)
class Restricted:
    """A server config whose ``bridge`` user holds exactly some permissions, and how to log in to it."""

    server_config: str
    bridge_auth: dict[str, Any]  # the side's [auth] table for the bridge
    admin: dict[str, Any]  # nats-py connect options of an unrestricted user, for the test
    secrets: tuple[str, ...]  # must never appear in the bridge's output


def restricted(mode: str, perms: Permissions, directory: Path) -> Restricted:
    """``users``: a user/password in the server's ``authorization`` block; ``jwt``: operator mode, the permissions
    signed into the bridge user's JWT (``pub``/``sub`` allow lists), the bridge given a creds file."""
    if mode == "users":
        admin = {"user": "admin", "password": ADMIN_PASSWORD}
        return Restricted(users_config(perms), dict(BRIDGE_AUTH["auth"]), admin, (BRIDGE_PASSWORD, ADMIN_PASSWORD))
    operator = Operator()
    bridge = operator.user_creds(directory / "bridge.creds", "bridge", pub=perms.publish, sub=perms.subscribe)
    admin_creds = operator.user_creds(directory / "admin.creds", "admin")
    seeds = tuple(line for f in (bridge, admin_creds) for line in f.read_text().splitlines() if line.startswith("SU"))
    return Restricted(
        operator.server_config(), {"creds_file": str(bridge)}, {"user_credentials": str(admin_creds)}, seeds
    )


def violations(*servers: NatsServer) -> list[str]:
    return [line for s in servers for line in s.log_tail(10_000).splitlines() if "Violation" in line]


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["users", "jwt"])
async def test_least_privilege_edge_position(
    mode: str, tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """Both servers grant the bridge's user exactly the documented permissions (in the server's users, or in the
    user's JWT): a managed and a bound source replicate, the bridge restarts (recovery reads the aggregate back by
    Direct Get) and replicates more, ``check`` passes, and neither server ever logged a permissions violation."""
    a = SourceSpec(name="edge-a", servers="", subject_prefix="edge.a", max_ack_pending=100)
    b = SourceSpec(
        name="edge-b",
        servers="",
        stream=ORIGIN_B,
        subject_prefix="edge.b",
        max_ack_pending=100,
        extra={"manage_consumer": False},
    )
    origin_perms = origin_permissions(ORIGIN, a.consumer_name, a.deliver_subject) + origin_permissions(
        ORIGIN_B, b.consumer_name, b.deliver_subject, managed=False
    )
    origin_side = restricted(mode, origin_perms, tmp_path / "origin-secrets")
    target_side = restricted(mode, target_permissions(AGGREGATE, ["edge.a.>", "edge.b.>"]), tmp_path / "target-secrets")
    origin = servers("origin", origin_side.server_config)
    target = servers("target", target_side.server_config)
    for spec in (a, b):
        spec.servers = origin.url
        spec.extra["auth"] = origin_side.bridge_auth
    config = write_config(
        tmp_path / "bridge.toml", target_url=target.url, sources=[a, b], target_extra={"auth": target_side.bridge_auth}
    )
    config.chmod(0o600)
    n = 200
    async with (
        client(origin.url, **origin_side.admin) as origin_nc,
        client(target.url, **target_side.admin) as target_nc,
    ):
        await create_stream(origin_nc, ORIGIN, ["a.>"], retention="workqueue")
        await create_stream(origin_nc, ORIGIN_B, ["b.>"], retention="workqueue")
        bound = {
            "durable_name": b.consumer_name,
            "deliver_subject": b.deliver_subject,
            "ack_policy": "flow_control",
            "max_ack_pending": 100,
        }
        await js_request(
            origin_nc,
            f"CONSUMER.DURABLE.CREATE.{ORIGIN_B}.{b.consumer_name}",
            {"stream_name": ORIGIN_B, "config": bound},
        )
        await create_aggregate(target_nc)
        check = run_check(config)  # `check` needs nothing more than `run`
        assert check.returncode == 0, check.stdout + check.stderr
        for run in (1, 2):  # the second run starts on a non-empty aggregate: recovery reads it back
            bridge = bridge_procs(config)
            await bridge.wait_event(READY_EVENTS, timeout=20, after=1)  # both sources bound
            async with anyio.create_task_group() as tg:
                tg.start_soon(Publisher(origin_nc, n, subject=lambda i: f"a.orders.{i % 5}").run)
                tg.start_soon(Publisher(origin_nc, n, subject=lambda i: f"b.orders.{i % 3}").run)
            for prefix, stream in (("edge.a", ORIGIN), ("edge.b", ORIGIN_B)):
                copies = functools.partial(aggregate_count, target_nc, f"{prefix}.>")
                await wait_for_value(copies, run * n, timeout=30, what=f"{prefix} copies")
                left = functools.partial(stream_messages, origin_nc, stream)
                await wait_for_value(left, 0, timeout=15, what=f"{stream} left")
            assert await bridge.astop(STOP_GRACE) == 0
            if run == 2:
                assert bridge.count("recovery.done") == 2
        by_source = seqs_by_source(await read_stream(target_nc, AGGREGATE))
        assert_exact(by_source.get("edge-a", []), range(1, 2 * n + 1), "edge-a copies")
        assert_exact(by_source.get("edge-b", []), range(1, 2 * n + 1), "edge-b copies")
    assert violations(origin, target) == []
    assert_no_secret(bridge, origin_side.secrets + target_side.secrets)
    assert_no_secret(check.stdout + check.stderr, origin_side.secrets + target_side.secrets)


@dataclass(frozen=True)
class Missing:
    side: str  # "origin" or "target"
    subject: str  # the permission removed (as listed)
    event: str  # the bridge's log event that names it
    named: str  # what that event's error names (nats-py lowercases the server's text)


MISSING = {
    "fc-answer-publish": Missing(
        "origin", "$JS.FC.ORDERS.nats-bridge-edge1.*", "origin.error", 'publish to "$js.fc.orders.nats-bridge-edge1.'
    ),
    "deliver-subscribe": Missing(
        "origin", "nats-bridge.deliver.edge1", "origin.error", 'subscription to "nats-bridge.deliver.edge1"'
    ),
    "reset-publish": Missing(
        "origin",
        "$JS.API.CONSUMER.RESET.ORDERS.nats-bridge-edge1",
        "origin.error",
        'publish to "$js.api.consumer.reset.orders.nats-bridge-edge1"',
    ),
    "aggregate-publish": Missing("target", "edge.one.>", "target.error", 'publish to "edge.one.orders.'),
    # without its lease a process is a standby: it never binds the consumer, so it cannot ack anything either
    "lease-write": Missing("target", "$KV.nats-bridge.>", "coordination.error", 'publish to "$kv.nats-bridge.'),
}


async def outstanding_deliveries(nc: Client, config: Path) -> None:
    """The source's consumer, as the bridge makes it, with deliveries nobody acked (what a crash leaves): only then
    does the bridge need a RESET at start (a new consumer, or one at rest, is taken as it stands)."""
    source = load_config(config).sources[0]
    body = {"stream_name": ORIGIN, "config": desired_config(source), "action": "create"}
    await js_request(nc, f"CONSUMER.CREATE.{ORIGIN}.{source.consumer}", body)
    sub = await nc.subscribe(source.deliver_subject)
    await sub.next_msg(timeout=5)  # delivered, never acked
    await sub.unsubscribe()
    info = await consumer_info(nc, ORIGIN, source.consumer)
    assert info["num_ack_pending"] > 0, info


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(MISSING))
async def test_least_privilege_missing_permission_is_named(
    case: str, tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """One permission short: the bridge keeps running, logs the server's permissions violation naming the subject,
    and acks nothing it should not: the origin's ack floor stays at 0 and the origin keeps every message."""
    missing = MISSING[case]
    spec = SourceSpec(name="edge1", servers="", subject_prefix="edge.one", max_ack_pending=50, extra=BRIDGE_AUTH)
    origin_perms = origin_permissions(ORIGIN, spec.consumer_name, spec.deliver_subject)
    target_perms = target_permissions(AGGREGATE, ["edge.one.>"])
    if missing.side == "origin":
        origin_perms = origin_perms.without(missing.subject)
    else:
        target_perms = target_perms.without(missing.subject)
    origin = servers("origin", users_config(origin_perms))
    target = servers("target", users_config(target_perms))
    spec.servers = origin.url
    config = write_config(
        tmp_path / "bridge.toml",
        target_url=target.url,
        sources=[spec],
        target_extra=BRIDGE_AUTH,
        engine={"shutdown_grace": 1.0},  # unacked publishes (aggregate-publish) are waited for this long at the end
    )
    config.chmod(0o600)
    n = 120
    async with client(admin_url(origin)) as origin_nc, client(admin_url(target)) as target_nc:
        await create_stream(origin_nc, ORIGIN, ["orders.>"], retention="workqueue")
        await create_aggregate(target_nc)
        await Publisher(origin_nc, n).run()
        if case == "reset-publish":
            await outstanding_deliveries(origin_nc, config)
        bridge = bridge_procs(config)
        await bridge.wait_event(missing.event, timeout=20)
        errors = [e.get("error", "") for e in bridge.events() if e.get("event") == missing.event]
        assert any("permissions violation" in e and missing.named in e for e in errors), errors

        standby = case == "lease-write"

        async def nothing_acked() -> None:
            if standby:
                assert not await consumer_exists(origin_nc, ORIGIN, spec.consumer_name)
            else:
                assert ack_floor(await consumer_info(origin_nc, ORIGIN, spec.consumer_name)) == 0
            assert await stream_messages(origin_nc, ORIGIN) == n

        if case == "fc-answer-publish":
            # the copies are stored, up to max_ack_pending, but the acks never reach the origin
            await wait_for_value(lambda: aggregate_count(target_nc, "edge.one.>"), 50, timeout=10, what="copies")
        if not standby:
            await wait_until(
                lambda: consumer_info(origin_nc, ORIGIN, spec.consumer_name), timeout=10, what="the consumer"
            )
        await assert_holds(nothing_acked, duration=2.0, what="nothing acked")
        assert bridge.is_running
        assert await bridge.astop(STOP_GRACE) == 0
        await nothing_acked()  # not even by the final answer at shutdown
    assert_no_secret(bridge, [BRIDGE_PASSWORD, ADMIN_PASSWORD])


@pytest.mark.anyio
async def test_a_denied_source_on_a_shared_origin_connection_touches_no_other(
    tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """Two sources on one origin server (same user) share the bridge's one connection to it. The user may not
    subscribe to the second one's deliver subject: that source logs the server's violation naming its subject and
    acks nothing; the first replicates everything and logs no error of the other's; the origin sees one connection
    from the bridge (the server keeps a connection that met a permissions violation)."""
    a = SourceSpec(name="edge-a", servers="", subject_prefix="edge.a", max_ack_pending=100, extra=dict(BRIDGE_AUTH))
    b = SourceSpec(
        name="edge-b",
        servers="",
        stream=ORIGIN_B,
        subject_prefix="edge.b",
        max_ack_pending=100,
        extra=dict(BRIDGE_AUTH),
    )
    perms = origin_permissions(ORIGIN, a.consumer_name, a.deliver_subject) + origin_permissions(
        ORIGIN_B, b.consumer_name, b.deliver_subject
    ).without(b.deliver_subject)
    origin = servers("origin", users_config(perms))
    target = servers("target", users_config(target_permissions(AGGREGATE, ["edge.a.>", "edge.b.>"])))
    a.servers = b.servers = origin.url
    config = write_config(tmp_path / "bridge.toml", target_url=target.url, sources=[a, b], target_extra=BRIDGE_AUTH)
    config.chmod(0o600)
    n = 150
    async with client(admin_url(origin)) as origin_nc, client(admin_url(target)) as target_nc:
        await create_stream(origin_nc, ORIGIN, ["a.>"], retention="workqueue")
        await create_stream(origin_nc, ORIGIN_B, ["b.>"], retention="workqueue")
        await create_aggregate(target_nc)
        await Publisher(origin_nc, n, subject=lambda i: f"a.orders.{i % 5}").run()
        await Publisher(origin_nc, n, subject=lambda i: f"b.orders.{i % 3}").run()
        bridge = bridge_procs(config)
        await bridge.wait_event("origin.error", timeout=20, source="edge-b")
        copies = functools.partial(aggregate_count, target_nc, "edge.a.>")
        await wait_for_value(copies, n, timeout=30, what="edge-a copies")
        left = functools.partial(stream_messages, origin_nc, ORIGIN)
        await wait_for_value(left, 0, timeout=15, what=f"{ORIGIN} left")
        errors = bridge.events("origin.error")
        assert not [e for e in errors if e.get("source") == "edge-a"], errors
        assert any(f'subscription to "{b.deliver_subject.lower()}"' in e.get("error", "") for e in errors), errors
        assert await stream_messages(origin_nc, ORIGIN_B) == n  # nothing of edge-b acked
        connz = await anyio.to_thread.run_sync(origin.monitor, "connz")
        names = [c.get("name") for c in connz.get("connections") or []]
        assert names.count(CONNECTION_NAME) == 1, names
        assert await bridge.astop(STOP_GRACE) == 0
        assert_exact(seqs_by_source(await read_stream(target_nc, AGGREGATE)).get("edge-a", []), range(1, n + 1), "a")
    assert_no_secret(bridge, [BRIDGE_PASSWORD, ADMIN_PASSWORD])


# --- least privilege, sidecar position ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_least_privilege_sidecar_position(
    tmp_path: Path, nats_server_bin: str, bridge_procs: BridgeFactory
) -> None:
    """The bridge connects only to the hub (one user for both sides) and reaches the leaf's consumer through the
    leaf's JetStream domain. The hub grants exactly the documented sidecar permissions, to the bridge's user and to
    the user the leaf links in with."""
    spec = SourceSpec(
        name="edge1", servers="", domain="leaf", subject_prefix="edge.one", max_ack_pending=100, extra=BRIDGE_AUTH
    )
    perms = origin_permissions(ORIGIN, spec.consumer_name, spec.deliver_subject, api="$JS.leaf.API")
    perms += target_permissions(AGGREGATE, ["edge.one.>"])
    leaf_password = "leaf-" + secrets.token_hex(8)
    link = leaf_link_permissions(ORIGIN, spec.consumer_name, spec.deliver_subject, leaf_domain="leaf")
    leaf_user = (
        f"{{user: leaf, password: {conf_str(leaf_password)}, {permissions_block(link.publish, link.subscribe)}}}"
    )
    hub = NatsServer(
        tmp_path / "hub",
        name="hub",
        binary=nats_server_bin,
        domain="hub",
        leafnode_listen=True,
        extra_config=users_config(perms, leaf_user),
    )
    assert hub.leafnode_port is not None
    leaf = NatsServer(
        tmp_path / "leaf",
        name="leaf",
        binary=nats_server_bin,
        domain="leaf",
        leaf_remotes=[f"nats-leaf://leaf:{leaf_password}@127.0.0.1:{hub.leafnode_port}"],
    )
    # the leaf's user may not carry the two JetStream APIs' interest across (only the bridge's subjects), which is
    # what Topology.is_linked would wait for; the bridge retries its setup until the subscriptions have crossed
    topology = Topology(hub, leaf, require_js_api=False)
    try:
        hub.start()
        hub.wait_ready()
        leaf.start()
        leaf.wait_ready()
        topology.wait_linked()
        spec.servers = hub.url
        config = write_config(tmp_path / "bridge.toml", target_url=hub.url, sources=[spec], target_extra=BRIDGE_AUTH)
        config.chmod(0o600)
        async with client(leaf.url) as leaf_nc, client(admin_url(hub)) as hub_nc:
            await create_stream(leaf_nc, ORIGIN, ["orders.>"], retention="workqueue")
            await create_aggregate(hub_nc)
            bridge = await replicate_and_check(bridge_procs, config, leaf_nc, hub_nc)
            assert_exact(
                seqs_by_source(await read_stream(hub_nc, AGGREGATE)).get("edge1", []), range(1, N + 1), "copies"
            )
        assert violations(hub, leaf) == []
        assert_no_secret(bridge, [BRIDGE_PASSWORD, ADMIN_PASSWORD, leaf_password])
    finally:
        topology.stop()


@pytest.mark.anyio
async def test_an_unreadable_registry_leaves_the_file_sources_running_until_it_can_be_read(
    tmp_path: Path, servers: ServerFactory, bridge_procs: BridgeFactory
) -> None:
    """The bridge's user may not read the source registry (yet): the file's source replicates regardless, the
    refusal is logged naming the subject, and once the server grants the documented permissions (a configuration
    reload) the registered source is taken up and replicated, exactly, with no restart. The registered source has
    no credentials of its own: it takes them from the host's [source_defaults], as a registry entry should."""
    a = SourceSpec(name="edge1", servers="", subject_prefix="edge.one", max_ack_pending=100)
    origin_perms = origin_permissions(ORIGIN, a.consumer_name, a.deliver_subject) + origin_permissions(
        ORIGIN_B, "nats-bridge-edge2", "nats-bridge.deliver.edge2"
    )
    copies = ["edge.one.>", "edge.two.>"]
    origin = servers("origin", users_config(origin_perms))
    target = servers("target", users_config(target_permissions(AGGREGATE, copies, registry=False)))
    a.servers = origin.url
    config = write_config(tmp_path / "bridge.toml", target_url=target.url, sources=[a], target_extra=BRIDGE_AUTH)
    with config.open("a", encoding="utf-8") as fh:  # the origin credentials, for the file's source and the registry's
        fh.write(f'\n[source_defaults.auth]\nuser = "bridge"\npassword = {json.dumps(BRIDGE_PASSWORD)}\n')
    config.chmod(0o600)
    admin = tmp_path / "admin.toml"  # the operator registering a site, with a user of its own
    admin_text = (
        config.read_text().replace(BRIDGE_PASSWORD, ADMIN_PASSWORD).replace('user = "bridge"', 'user = "admin"')
    )
    admin.write_text(admin_text, encoding="utf-8")
    admin.chmod(0o600)
    site = tmp_path / "site.toml"
    table = f'name = "edge2"\nservers = ["{origin.url}"]\nstream = "{ORIGIN_B}"\nsubject_prefix = "edge.two"\n'
    site.write_text("[[sources]]\n" + table, encoding="utf-8")
    n = 100
    async with client(admin_url(origin)) as origin_nc, client(admin_url(target)) as target_nc:
        await create_stream(origin_nc, ORIGIN, ["a.>"], retention="workqueue")
        await create_stream(origin_nc, ORIGIN_B, ["b.>"], retention="workqueue")
        await create_aggregate(target_nc)
        add = functools.partial(run_cli, "sources", "add", "-c", str(admin), "--file", str(site))
        added = await anyio.to_thread.run_sync(add)
        assert added.returncode == 0, added.stderr
        bridge = bridge_procs(config)
        await bridge.wait_event("registry.read_failed", timeout=20)
        (failed,) = bridge.events("registry.read_failed")[:1]
        assert "permission denied" in failed["error"] and "KV_nats-bridge-sources" in failed["error"], failed
        async with anyio.create_task_group() as tg:
            tg.start_soon(Publisher(origin_nc, n, subject=lambda i: f"a.orders.{i % 5}").run)
            tg.start_soon(Publisher(origin_nc, n, subject=lambda i: f"b.orders.{i % 3}").run)
        one = functools.partial(aggregate_count, target_nc, "edge.one.>")
        await wait_for_value(one, n, timeout=30, what="the file source's copies")
        assert await aggregate_count(target_nc, "edge.two.>") == 0
        assert await stream_messages(origin_nc, ORIGIN_B) == n  # kept on the origin: nothing lost meanwhile

        target.reload(users_config(target_permissions(AGGREGATE, copies)))
        two = functools.partial(aggregate_count, target_nc, "edge.two.>")
        await wait_for_value(two, n, timeout=30, what="the registered source's copies")
        await wait_for_value(functools.partial(stream_messages, origin_nc, ORIGIN_B), 0, timeout=15, what="ORDERS_B")
        by_source = seqs_by_source(await read_stream(target_nc, AGGREGATE))
        assert_exact(by_source.get("edge1", []), range(1, n + 1), "edge1 copies")
        assert_exact(by_source.get("edge2", []), range(1, n + 1), "edge2 copies")
        assert await bridge.astop(STOP_GRACE) == 0
    assert_no_secret(bridge, [BRIDGE_PASSWORD, ADMIN_PASSWORD])
