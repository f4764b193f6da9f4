"""What the commands share: their exit codes, the request timeout, configuration errors as the operator reads them,
and where the coordination bucket is reached."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bridge.errors import BridgeError, ConfigError

if TYPE_CHECKING:
    from bridge.config import AuthConfig, BridgeConfig, SourceConfig, TargetConfig, TlsConfig
    from bridge.io.start import CopiesExist

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_CONFIG = 2
EXIT_UNAUDITED = 3

TIMEOUT = 5.0  # seconds, for each request the operator commands make


def guarded(command: Callable[[], int]) -> int:
    """Run ``command``: invalid configuration is printed as one line per problem (exit 2, no traceback), Ctrl-C
    ends quietly (exit 0)."""
    try:
        return command()
    except ConfigError as err:
        from bridge.config import format_config_error

        print(format_config_error(err), file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return EXIT_OK


@dataclass(frozen=True)
class BucketSide:
    """Where the coordination bucket is reached: the target's servers, or coordination's own ``servers``."""

    servers: list[str]
    auth: AuthConfig | None
    tls: TlsConfig | None
    api_prefix: str


def bucket_side(config: BridgeConfig) -> BucketSide:
    """The coordination bucket's connection settings and JetStream API prefix."""
    coordination = config.coordination
    if coordination.servers is not None:
        return BucketSide(coordination.servers, coordination.auth, coordination.tls, coordination.api_prefix)
    target = config.target
    return BucketSide(target.servers, target.auth, target.tls, target.api_prefix)


def copies_in(target: TargetConfig, source: SourceConfig) -> CopiesExist:
    """Whether the aggregate holds any copy of ``source`` (read on a connection of its own when asked): a start
    position is applied only to a consumer created for a source the aggregate has never seen (``bridge.io.start``)."""

    async def exist() -> bool:
        from bridge.io.aggregate import read_source_tail
        from bridge.io.connect import close_connection, open_connection
        from bridge.io.jsapi import JsApi

        nc = await open_connection(target, name=f"nats-bridge {source.name} copies", error_type=BridgeError)
        try:
            api = JsApi(nc, target.api_prefix)
            copies, _ = await read_source_tail(nc, api, target.stream, source.name, source.copies_filter, 0, 1, TIMEOUT)
            return bool(copies)
        finally:
            await close_connection(nc)

    return exist


JAVA_NEEDED = 17  # Spark 4's minimum


def java_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why Spark cannot start here for want of Java (None: a Java 17+ answers): ``JAVA_HOME``'s ``bin/java`` when it is
    set, else the ``java`` on the PATH, asked for its version. Checked before Spark is started, which would otherwise
    end in a JVM launcher's traceback."""
    import os
    import re
    import shutil
    import subprocess

    env = dict(os.environ if environ is None else environ)
    fix = (
        f"install a Java {JAVA_NEEDED} or newer (e.g. apt install openjdk-{JAVA_NEEDED}-jre-headless) or set "
        "JAVA_HOME to one"
    )
    home = env.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            return f"Spark needs Java {JAVA_NEEDED} or newer; JAVA_HOME is {home!r}, which has no bin/java: {fix}"
    else:
        found = shutil.which("java", path=env.get("PATH", ""))
        if found is None:
            return (
                f"Spark needs Java {JAVA_NEEDED} or newer and finds none (JAVA_HOME is not set, no java on the "
                f"PATH): {fix}"
            )
        java = found
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{java} -version failed ({exc}): {fix}"
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return f"{java} -version printed no version: {fix}"
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_392": Java 8
        major = int(match.group(2))
    if major < JAVA_NEEDED:
        return f"Spark needs Java {JAVA_NEEDED} or newer; {java} is Java {major}: {fix}"
    return None


AUDIT_EXTRA = "install the audit extra (pip install 'nats-bridge[audit]'; from a checkout, pip install '.[audit]')"


def aggregate_problem(target: TargetConfig, config_path: str) -> str | None:
    """Why the aggregate cannot be read (None: it can): the target unreachable, or the stream missing. Asked before
    Spark starts, whose own failure would be a JVM trace with the cause somewhere inside."""
    import anyio

    from bridge.io.connect import close_connection, open_connection
    from bridge.io.jsapi import STREAM_NOT_FOUND, ApiError, JsApi

    async def look() -> str | None:
        try:
            nc = await open_connection(target, name="nats-bridge spark preflight", error_type=BridgeError)
        except BridgeError as exc:
            return f"the target cannot be reached: {exc}"
        try:
            await JsApi(nc, target.api_prefix).stream_info(target.stream, timeout=TIMEOUT)
        except ApiError as exc:
            if exc.err_code == STREAM_NOT_FOUND:
                return (
                    f"aggregate stream {target.stream!r} does not exist on the target: correct target.stream (or "
                    f"target.domain), or create it with nats-bridge setup -c {config_path}"
                )
            return f"aggregate stream {target.stream!r}: {exc.description}"
        except BridgeError as exc:
            return f"aggregate stream {target.stream!r}: {exc}"
        finally:
            await close_connection(nc)
        return None

    return anyio.run(look)


_MASTER_FORMS = "local, local[N], local[*], spark://HOST:PORT, yarn or k8s://HOST:PORT"


def master_problem(master: str | None) -> tuple[int, str] | None:
    """Why ``--master`` cannot be used (the exit code and the line; None: it can, or none was given): not a
    master URL Spark knows (2), or a standalone master that nothing answers at (3). Asked before Spark starts, whose
    own answer would be a launcher's trace ending in ``JAVA_GATEWAY_EXITED``."""
    import re
    import socket

    if master is None or re.fullmatch(r"local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[[\d, ]+\]|yarn|k8s://\S+", master):
        return None
    found = re.fullmatch(r"spark://([^,/\s]+:\d+(,[^,/\s]+:\d+)*)", master)
    if found is None:
        return EXIT_CONFIG, f"--master {master!r} is not a Spark master URL: use {_MASTER_FORMS}"
    errors = []
    for address in found.group(1).split(","):  # a standby master's list: any one answering will do
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
            return None
        except OSError as exc:
            errors.append(f"{address}: {exc.strerror or exc}")
    return EXIT_UNAUDITED, (
        f"no Spark master answers at {master} ({'; '.join(errors)}): start it, or fix --master "
        "(without it the job runs embedded)"
    )


def spark_cannot_run(command: str, target: TargetConfig, config_path: str, master: str | None = None) -> int | None:
    """Before a Spark command starts Spark: the one line (printed) and exit code when ``--master`` is wrong
    (:func:`master_problem`), or Java or the aggregate is not there to run it on (:func:`java_problem`,
    :func:`aggregate_problem`); None when all are."""
    if (wrong := master_problem(master)) is not None:
        print(f"nats-bridge {command}: {wrong[1]}", file=sys.stderr)
        return wrong[0]
    problem = java_problem() or aggregate_problem(target, config_path)
    if problem is None:
        return None
    print(f"nats-bridge {command}: {problem}", file=sys.stderr)
    return EXIT_UNAUDITED


def directory_problem(option: str, path: str) -> str | None:
    """Why ``path`` cannot be the directory ``option`` names (None: it is one, or does not exist yet)."""
    import os

    if os.path.exists(path) and not os.path.isdir(path):
        return f"{option} {path!r} exists and is not a directory: name a directory (it is created when missing)"
    return None


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """``--verbose`` of the Spark commands: a failure is one line, and with it the whole traceback too."""
    parser.add_argument("--verbose", action="store_true", help="with a failure, Spark's whole traceback too")
