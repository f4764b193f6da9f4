"""Shared pieces of the bridge's scenario tests on real servers.

* :func:`write_config` writes a bridge TOML for a topology (one or more :class:`SourceSpec`).
* :class:`BridgeProcess` runs ``python -m bridge run -c FILE`` as a child process with its log in ``tmp_path``;
  the ``bridge_procs`` fixture starts them and SIGKILLs and reaps (by PID) every one still running at teardown.
* :func:`http_port`, :func:`http_get`, :func:`metric`, :func:`readyz` read a running bridge's HTTP listener.
* :func:`running_bridge` runs :class:`bridge.runtime.app.Bridge` in-process, for tests that patch or inspect it.
* :func:`read_stream` / :func:`origin_seqs_by_source` read the aggregate back with batched Direct Get (not the
  bridge's own reader: the code under test does not judge itself).
* :class:`FcTap` listens to ``$JS.FC.>`` on the origin server and checks every flow-control answer the bridge
  sends against the aggregate: an answer naming ``Nats-Last-Stream: s`` while the aggregate holds fewer than
  ``s`` copies of that source can only mean the bridge acked something it had not stored.
* :func:`wait_until` / :func:`assert_holds`: every wait is a condition polled against a deadline.

Fixtures defined here are used by importing them into the test module (``from .helpers import
bridge_procs_fixture  # noqa: F401``); their registered name is the ``name=`` given below.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from prometheus_client.parser import text_string_to_metric_families

from chaos.processes import REPO_ROOT, child_env
from chaos.processes import BridgeProcess as ProcessBase

ORIGIN = "ORDERS"
AGGREGATE = "AGG"
POLL = 0.05

# Engine timings for tests: the defaults are tuned for production (30 s reset backoff, 15 s publish retry);
# these keep every recovery within a few seconds. silence_timeout has a floor of 2 s in the config.
TEST_ENGINE: dict[str, Any] = {
    "silence_timeout": 3.0,
    "reset_timeout": 2.0,
    "reset_backoff_initial": 0.5,
    "reset_backoff_max": 2.0,
    "publish_retry_initial": 0.2,
    "publish_retry_max": 1.0,
    "shutdown_grace": 5.0,
}

# Leases for tests: a short TTL, so a process that takes over after a SIGKILL waits seconds, not ten.
TEST_COORDINATION: dict[str, Any] = {"lease_ttl": 3.0}

# --- polling ----------------------------------------------------------------------------------------------


async def wait_until(
    probe: Callable[[], Any],
    *,
    timeout: float,
    what: str,
    interval: float = POLL,
    retry_on: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``probe`` (sync or async) until it returns something truthy, and return that.

    Raises AssertionError naming ``what`` and the last value (or error) once ``timeout`` seconds have passed.
    Exceptions of the ``retry_on`` types count as "not yet" (e.g. a server that is restarting).
    """
    deadline = time.monotonic() + timeout
    last: Any = "never probed"
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            last = value
        except retry_on as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last: {last!r}")
        await anyio.sleep(interval)


async def wait_for_value(
    probe: Callable[[], Any],
    expected: Any,
    *,
    timeout: float,
    what: str,
    interval: float = POLL,
    retry_on: tuple[type[BaseException], ...] = (),
) -> None:
    """Poll ``probe`` (sync or async) until it returns ``expected``; the failure names the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = "never probed"
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
            if value == expected:
                return
            last = value
        except retry_on as exc:
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what} == {expected!r}; last: {last!r}")
        await anyio.sleep(interval)


async def assert_holds(check: Callable[[], Any], *, duration: float, what: str, interval: float = 0.1) -> int:
    """Observe for ``duration`` seconds that ``check`` (sync or async, raising AssertionError) keeps holding.

    Returns how many observations were made. This is an observation window, not a wait for a condition.
    """
    deadline = time.monotonic() + duration
    count = 0
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                await result
        except AssertionError as exc:
            raise AssertionError(f"{what} stopped holding after {count} observations: {exc}") from exc
        count += 1
        if time.monotonic() >= deadline:
            return count
        await anyio.sleep(interval)


# --- configuration ----------------------------------------------------------------------------------------


@dataclass
class SourceSpec:
    """One ``[[sources]]`` table."""

    name: str
    servers: str
    stream: str = ORIGIN
    domain: str | None = None
    subject_prefix: str | None = None
    max_ack_pending: int | None = None
    consumer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def consumer_name(self) -> str:
        return self.consumer or f"nats-bridge-{self.name}"

    @property
    def deliver_subject(self) -> str:
        return str(self.extra.get("deliver_subject", f"nats-bridge.deliver.{self.name}"))

    def table(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "servers": [self.servers], "stream": self.stream}
        if self.domain is not None:
            out["domain"] = self.domain
        if self.subject_prefix is not None:
            out["subject_prefix"] = self.subject_prefix
        if self.max_ack_pending is not None:
            out["max_ack_pending"] = self.max_ack_pending
        if self.consumer is not None:
            out["consumer"] = self.consumer
        out.update(self.extra)
        return out


def toml_value(value: Any) -> str:
    """A TOML literal for a bool, number, string or list of those."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _table(header: str, values: Mapping[str, Any]) -> list[str]:
    lines = [header]
    nested = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            nested.append((key, value))
        else:
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in nested:
        sub = header.strip("[]")
        lines += _table(f"[{sub}.{key}]", value)
    return lines


def config_text(
    *,
    target_url: str,
    sources: Sequence[SourceSpec],
    target_stream: str = AGGREGATE,
    engine: Mapping[str, Any] | None = None,
    target_extra: Mapping[str, Any] | None = None,
    http_extra: Mapping[str, Any] | None = None,
    coordination: Mapping[str, Any] | None = None,
    log_level: str = "info",
) -> str:
    """The TOML text of a bridge configuration (JSON logs, test engine timings unless overridden)."""
    lines = ["# written by tests/integration/helpers.py", ""]
    lines += _table("[log]", {"level": log_level, "format": "json"})
    lines += ["", *_table("[engine]", {**TEST_ENGINE, **(engine or {})})]
    # tests run side by side: any free port
    lines += ["", *_table("[http]", {"listen": "127.0.0.1:0", **(http_extra or {})})]
    lines += ["", *_table("[coordination]", {**TEST_COORDINATION, **(coordination or {})})]
    target: dict[str, Any] = {"servers": [target_url], "stream": target_stream, **(target_extra or {})}
    lines += ["", *_table("[target]", target)]
    for spec in sources:
        lines.append("")
        lines += _table("[[sources]]", spec.table())
    return "\n".join(lines) + "\n"


def write_config(path: Path, **kwargs: Any) -> Path:
    """Write :func:`config_text` to ``path`` and return it."""
    path.write_text(config_text(**kwargs), encoding="utf-8")
    return path


def run_cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``python -m bridge ARGS`` to completion (bounded), capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- the bridge as a child process ------------------------------------------------------------------------


class BridgeProcess(ProcessBase):
    """The chaos suite's bridge child process, plus async stop/kill and log-event queries for tests."""

    async def astop(self, timeout: float) -> int:
        return await anyio.to_thread.run_sync(self.stop, timeout)

    async def akill(self) -> int:
        return await anyio.to_thread.run_sync(self.kill)

    def count(self, event: str, **fields: Any) -> int:
        return sum(
            1 for e in self.events() if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
        )

    async def wait_event(self, event: str, *, timeout: float, after: int = 0, **fields: Any) -> None:
        """Wait until the log holds more than ``after`` ``event`` lines (matching ``fields``); fail if it died."""

        def probe() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise AssertionError(f"bridge exited with {self._proc.returncode}:\n{self.tail()}")
            return self.count(event, **fields) > after

        await wait_until(probe, timeout=timeout, what=f"bridge log event {event!r} #{after + 1}")


BridgeFactory = Callable[..., BridgeProcess]  # (config_path, env=None) -> a started BridgeProcess


# --- the daemon's HTTP listener -----------------------------------------------------------------------------


def _http_get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as err:
        return int(err.code), bytes(err.read())


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    """GET ``path`` from the bridge's listener on 127.0.0.1: (status, body), 5 s at most."""
    return await anyio.to_thread.run_sync(_http_get, port, path)


async def http_port(bridge: BridgeProcess) -> int:
    """The port the bridge's HTTP listener bound (it logs ``http.listening``)."""
    await bridge.wait_event("http.listening", timeout=20)
    (event,) = [e for e in bridge.events() if e.get("event") == "http.listening"][-1:]
    return int(event["port"])


async def metric(port: int, name: str, **labels: str) -> float | None:
    """One sample of ``/metrics`` (None when absent)."""
    _, body = await http_get(port, "/metrics")
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    """``/readyz``: its status and JSON body."""
    status, body = await http_get(port, "/readyz")
    return status, json.loads(body)


@pytest.fixture(name="bridge_procs")
def bridge_procs_fixture(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BridgeFactory]:
    """A factory ``start(config_path) -> BridgeProcess`` (started); every process is killed and reaped at teardown.

    On failure the tail of each bridge log is printed (pytest shows it with the failure).
    """
    procs: list[BridgeProcess] = []

    def start(config_path: Path, env: Mapping[str, str] | None = None) -> BridgeProcess:
        proc = BridgeProcess(config_path, tmp_path / f"bridge-{len(procs)}.log", env)
        procs.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for proc in procs:
            proc.cleanup()
        call = getattr(request.node, "rep_call", None)
        if call is not None and call.failed:
            for proc in procs:
                print(f"\n----- bridge log {proc.log_path} (exit codes {proc.returncodes}) -----")
                print(proc.tail())


# --- the bridge in-process --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_bridge(config_path: Path, log_path: Path, *, ready_timeout: float = 20.0) -> AsyncIterator[Any]:
    """Run ``Bridge(load_config(config_path))`` in this event loop until the block ends; yield the Bridge.

    Waits until every runner is ready (first reset done). On exit sets ``bridge.stop`` and waits (bounded) for
    ``run`` to return. Logs go to ``log_path`` as JSON lines.
    """
    import structlog

    from bridge import logs
    from bridge.config import load_config
    from bridge.runtime.app import Bridge

    log_file: TextIO = log_path.open("a", encoding="utf-8")
    logs.configure("info", "json", stream=log_file)
    bridge = Bridge(load_config(config_path, environ={}))
    finished = anyio.Event()
    failure: list[BaseException] = []

    async def run() -> None:
        try:
            await bridge.run(handle_signals=False)
        except BaseException as exc:
            failure.append(exc)
            raise
        finally:
            finished.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                await wait_until(
                    lambda: finished.is_set() or (bridge.runners and all(r.ready.is_set() for r in bridge.runners)),
                    timeout=ready_timeout,
                    what="in-process bridge ready",
                )
                assert not finished.is_set(), f"bridge.run returned early: {failure!r}"
                yield bridge
            finally:
                bridge.stop.set()
                with anyio.fail_after(20):
                    await finished.wait()
    finally:
        structlog.reset_defaults()
        log_file.close()


# --- JetStream administration (raw API: exact fields, any server version) ----------------------------------


def api_prefix(domain: str | None) -> str:
    return "$JS.API" if domain is None else f"$JS.{domain}.API"


async def js_request(
    nc: Client, subject: str, body: Mapping[str, Any] | None = None, *, domain: str | None = None, timeout: float = 3
) -> dict[str, Any]:
    """A JetStream API request; raises AssertionError on an API error."""
    payload = b"" if body is None else json.dumps(body).encode()
    msg = await nc.request(f"{api_prefix(domain)}.{subject}", payload, timeout=timeout)
    reply: dict[str, Any] = json.loads(msg.data) if msg.data else {}
    if "error" in reply:
        raise ApiFailure(subject, reply["error"])
    return reply


class ApiFailure(AssertionError):
    def __init__(self, subject: str, error: Mapping[str, Any]) -> None:
        self.error = dict(error)
        self.err_code = int(error.get("err_code", 0))
        super().__init__(f"{subject}: {error}")


async def create_stream(
    nc: Client,
    name: str,
    subjects: Sequence[str],
    *,
    retention: str = "limits",
    domain: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Create a file-backed stream (``extra`` are raw config fields, e.g. ``allow_direct=True``)."""
    config = {"name": name, "subjects": list(subjects), "retention": retention, "storage": "file", **extra}
    return await js_request(nc, f"STREAM.CREATE.{name}", config, domain=domain)


async def create_aggregate(nc: Client, *, name: str = AGGREGATE, duplicate_window: float = 120, **extra: Any) -> None:
    """The aggregate on the hub: Limits, file, Direct Get allowed, every subject under ``edge.>``."""
    await create_stream(nc, name, ["edge.>"], allow_direct=True, duplicate_window=int(duplicate_window * 1e9), **extra)


async def stream_info(nc: Client, name: str, *, domain: str | None = None, **body: Any) -> dict[str, Any]:
    return await js_request(nc, f"STREAM.INFO.{name}", body or None, domain=domain)


async def stream_messages(nc: Client, name: str, *, domain: str | None = None) -> int:
    return int((await stream_info(nc, name, domain=domain))["state"]["messages"])


async def consumer_info(nc: Client, stream: str, consumer: str, *, domain: str | None = None) -> dict[str, Any]:
    return await js_request(nc, f"CONSUMER.INFO.{stream}.{consumer}", domain=domain)


async def consumer_exists(nc: Client, stream: str, consumer: str, *, domain: str | None = None) -> bool:
    try:
        await consumer_info(nc, stream, consumer, domain=domain)
    except ApiFailure as exc:
        if exc.err_code == 10014:  # consumer not found
            return False
        raise
    return True


def ack_floor(info: Mapping[str, Any]) -> int:
    return int(info.get("ack_floor", {}).get("stream_seq", 0))


def delivered(info: Mapping[str, Any]) -> int:
    return int(info.get("delivered", {}).get("stream_seq", 0))


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Client]:
    """A test client that reconnects fast and forever (servers are restarted under it)."""
    nc = await nats.connect(
        url,
        connect_timeout=2,
        reconnect_time_wait=0.1,
        max_reconnect_attempts=-1,
        allow_reconnect=True,
        name="test client",
    )
    try:
        yield nc
    finally:
        with contextlib.suppress(Exception):
            await nc.close()


# --- publishing to the origin ---------------------------------------------------------------------------


def default_subject(i: int) -> str:
    return f"orders.{i % 7}"


def default_payload(i: int) -> bytes:
    return f"payload-{i:06d}-".encode() + b"x" * 100


@dataclass
class Publisher:
    """Publishes ``count`` messages to the origin with publish acks, optionally paced and pausable.

    Message ``i`` (0-based) goes to ``subject(i)`` with ``payload(i)`` and header ``Test-Index: i``. The acked
    origin sequences are kept in ``seqs`` (in order).
    """

    nc: Client
    count: int
    subject: Callable[[int], str] = default_subject
    payload: Callable[[int], bytes] = default_payload
    headers: Callable[[int], dict[str, str]] | None = None
    rate: float | None = None  # messages per second; None: as fast as acks come back
    batch: int = 100
    seqs: list[int] = field(default_factory=list)
    subjects: dict[int, str] = field(default_factory=dict)  # origin seq -> subject
    resume: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.resume.set()

    def pause(self) -> None:
        self.resume = anyio.Event()

    def unpause(self) -> None:
        self.resume.set()

    async def run(self) -> None:
        js = self.nc.jetstream(timeout=5)
        started = time.monotonic()
        i = 0
        while i < self.count:
            await self.resume.wait()
            n = min(self.batch, self.count - i)
            futures = []
            for k in range(i, i + n):
                hdrs = {"Test-Index": str(k)}
                if self.headers is not None:
                    hdrs.update(self.headers(k))
                futures.append((k, await js.publish_async(self.subject(k), self.payload(k), headers=hdrs)))
            for k, fut in futures:
                ack = await fut
                self.seqs.append(ack.seq)
                self.subjects[ack.seq] = self.subject(k)
            i += n
            if self.rate:
                ahead = started + i / self.rate - time.monotonic()
                if ahead > 0:
                    await anyio.sleep(ahead)
        self.done.set()

    @property
    def published(self) -> int:
        return len(self.seqs)


# --- reading the aggregate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredMsg:
    """One message of a stream, as Direct Get returns it."""

    seq: int
    subject: str
    headers: dict[str, str]
    data: bytes

    @property
    def origin_seq(self) -> int | None:
        value = self.headers.get("Bridge-Seq")
        return int(value) if value is not None else None

    @property
    def source(self) -> str | None:
        return self.headers.get("Bridge-Source")


async def read_stream(
    nc: Client, stream: str, *, domain: str | None = None, batch: int = 500, timeout: float = 5.0
) -> list[StoredMsg]:
    """Every message of ``stream`` in stream order, by batched Direct Get (the stream needs allow_direct)."""
    out: list[StoredMsg] = []
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, pending_msgs_limit=batch * 4, pending_bytes_limit=64 * 1024 * 1024)
    try:
        seq = 1
        while True:
            request = json.dumps({"seq": seq, "batch": batch}).encode()
            await nc.publish(f"{api_prefix(domain)}.DIRECT.GET.{stream}", request, reply=inbox)
            more = False
            with anyio.fail_after(timeout):
                while True:
                    msg: Msg = await sub.next_msg(timeout=timeout)
                    headers = dict(msg.headers or {})
                    status = headers.get("Status")
                    if status == "204":  # end of this batch
                        more = int(headers.get("Nats-Num-Pending", "0") or 0) > 0
                        break
                    if status == "404":  # nothing at or after seq
                        break
                    if status:
                        raise AssertionError(f"direct get on {stream}: {headers}")
                    mseq = int(headers["Nats-Sequence"])
                    out.append(StoredMsg(mseq, headers.get("Nats-Subject", ""), headers, msg.data))
                    seq = mseq + 1
            if not more:
                return out
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def seqs_by_source(messages: Sequence[StoredMsg]) -> dict[str, list[int]]:
    """Origin sequences (``Bridge-Seq``) per ``Bridge-Source``, in aggregate order; other messages ignored."""
    out: dict[str, list[int]] = {}
    for m in messages:
        if m.source is not None and m.origin_seq is not None:
            out.setdefault(m.source, []).append(m.origin_seq)
    return out


async def origin_seqs_by_source(nc: Client, stream: str = AGGREGATE) -> dict[str, list[int]]:
    """The aggregate reader: ``{source: [origin seq, ...]}`` in aggregate order."""
    return seqs_by_source(await read_stream(nc, stream))


def duplicates(seqs: Sequence[int]) -> list[int]:
    seen: set[int] = set()
    dups = []
    for s in seqs:
        if s in seen:
            dups.append(s)
        seen.add(s)
    return dups


def assert_exact(seqs: Sequence[int], expected: Sequence[int], what: str) -> None:
    """``seqs`` is exactly ``expected``: same order, nothing missing, nothing repeated (a short diff if not)."""
    if list(seqs) == list(expected):
        return
    missing = sorted(set(expected) - set(seqs))
    extra = sorted(set(seqs) - set(expected))
    out_of_order = [(a, b) for a, b in itertools.pairwise(seqs) if b <= a]
    raise AssertionError(
        f"{what}: {len(seqs)} copies, expected {len(expected)}; missing {len(missing)} {missing[:20]}, "
        f"unexpected {extra[:20]}, duplicated {duplicates(seqs)[:20]}, out of order {out_of_order[:10]}"
    )


async def aggregate_count(nc: Client, subject_filter: str, stream: str = AGGREGATE) -> int:
    """How many messages of the aggregate match ``subject_filter`` (0 if the stream does not exist)."""
    try:
        info = await stream_info(nc, stream, subjects_filter=subject_filter)
    except ApiFailure as exc:
        if exc.err_code == 10059:  # stream not found
            return 0
        raise
    return sum(int(n) for n in (info.get("state", {}).get("subjects") or {}).values())


# --- watching flow-control answers ------------------------------------------------------------------------


@dataclass
class FcAnswer:
    at: float
    subject: str
    consumer: str
    last_consumer: int | None
    last_stream: int | None


class FcTap:
    """Subscribes ``$JS.FC.>`` on the origin server and audits every answer that acks something.

    ``prefixes`` maps a consumer name to the aggregate subject filter of its source. For an answer
    ``Nats-Last-Stream: s`` the aggregate is counted right after it is seen; since the aggregate only grows in
    these tests and copies enter in origin order with no gap (checked separately), fewer than ``s`` copies then
    means fewer than ``s`` at the time of the answer: a violation of the safety invariant. Only valid for
    scenarios without intended skips (forward resets) and with origin sequences starting at 1 with no holes.
    """

    def __init__(self, nc: Client, hub: Client, prefixes: Mapping[str, str], stream: str = AGGREGATE) -> None:
        self.nc = nc
        self.hub = hub
        self.prefixes = dict(prefixes)
        self.stream = stream
        self.answers: list[FcAnswer] = []
        self.violations: list[str] = []
        self.checked = 0
        self.audit_errors: list[str] = []
        self._send, self._receive = anyio.create_memory_object_stream[FcAnswer](100_000)
        self._audited = anyio.Event()
        self._sub: Any = None

    @staticmethod
    def consumer_of(subject: str) -> str:
        tokens = subject.split(".")
        # v1 $JS.FC.<stream>.<consumer>.<rand>; v2 $JS.FC.<domain>.<hash>.<stream>.<consumer>.<rand>
        return tokens[3] if len(tokens) == 5 else tokens[5] if len(tokens) >= 7 else ""

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers or {}

        def num(key: str) -> int | None:
            value = headers.get(key)
            return int(value) if value is not None and value.isdigit() else None

        answer = FcAnswer(
            time.monotonic(),
            msg.subject,
            self.consumer_of(msg.subject),
            num("Nats-Last-Consumer"),
            num("Nats-Last-Stream"),
        )
        self.answers.append(answer)
        if answer.last_stream:
            self._send.send_nowait(answer)

    async def _audit(self) -> None:
        try:
            await self._audit_all()
        finally:
            self._audited.set()

    async def _audit_all(self) -> None:
        async for answer in self._receive:
            prefix = self.prefixes.get(answer.consumer)
            if prefix is None:
                self.violations.append(f"answer for unknown consumer {answer.consumer}: {answer}")
                continue
            # The aggregate only grows, so counting late is still sound; while the hub is down, retry.
            while True:
                try:
                    stored = await aggregate_count(self.hub, prefix, self.stream)
                    break
                except Exception as exc:  # hub down or restarting: nats-py raises many kinds
                    self.audit_errors.append(f"{type(exc).__name__}: {exc}")
                    await anyio.sleep(0.2)
            self.checked += 1
            assert answer.last_stream is not None
            if stored < answer.last_stream:
                self.violations.append(
                    f"FC answer {answer.subject} named Nats-Last-Stream {answer.last_stream} "
                    f"(Nats-Last-Consumer {answer.last_consumer}) while the aggregate held {stored} copies"
                )

    def acking(self, consumer: str | None = None) -> list[FcAnswer]:
        """Answers that carried a position (acked something)."""
        return [a for a in self.answers if a.last_stream and (consumer is None or a.consumer == consumer)]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FcTap]:
        self._sub = await self.nc.subscribe("$JS.FC.>", cb=self._on_msg, pending_msgs_limit=100_000)
        await self.nc.flush()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._audit)
            try:
                yield self
            finally:
                await self._sub.unsubscribe()
                self._send.close()
                # let the auditor finish what it was given (bounded)
                with anyio.move_on_after(10):
                    await self._audited.wait()
                tg.cancel_scope.cancel()


def rfc3339_ns(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 UTC time with up to 9 fractional digits (``...Z``)."""
    import calendar

    main, _, frac = text.rstrip("Z").partition(".")
    seconds = calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S"))
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])
