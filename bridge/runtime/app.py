"""The whole daemon: one shared target connection, one ``SourceRunner`` per source, signal handling.

Sources are isolated: each runner has its own origin connection, engine, ack inbox and effect executor, so one
blocked source (target rejects its messages, origin unreachable) never stalls another. They share the target
connection because publishes are small writes on one socket and the target is one server (or cluster).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from nats.aio.client import Client as NATS

from bridge.core.backoff import Backoff
from bridge.errors import BridgeError, TargetUnavailable
from bridge.io.connect import describe, drop_unsent_publishes, open_connection
from bridge.io.jsapi import ApiError, ApiTimeout, ApiUnavailable, JsApi
from bridge.logs import Throttle, get_logger
from bridge.runtime.source import SourceRunner, TargetSide

CONNECT_BACKOFF = Backoff(0.5, 15.0)


class Bridge:
    """Runs every configured source until ``stop`` is set (or SIGTERM/SIGINT with ``handle_signals``)."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.stop = anyio.Event()
        self.runners: list[SourceRunner] = []
        self.log = get_logger(component="bridge")
        self._target_nc: NATS | None = None
        self._error_throttle = Throttle()

    async def run(
        self, *, handle_signals: bool = True, on_started: Callable[[Bridge], Coroutine[Any, Any, None]] | None = None
    ) -> None:
        """Replicate until stopped; returns after every source drained."""
        async with anyio.create_task_group() as tg:
            if handle_signals:
                tg.start_soon(self._signals)
            nc = await self._connect_target()
            if nc is None:  # stopped before the target was reachable
                tg.cancel_scope.cancel()
                return
            target = self.config.target
            side = TargetSide(
                nc=nc,
                api=JsApi(nc, target.api_prefix),
                stream=target.stream,
                publish_window=target.publish_window,
                ack_timeout=target.ack_timeout,
            )
            await self._check_target_stream(side)
            self.runners = [SourceRunner(src, self.config.engine, side) for src in self.config.sources]
            async with anyio.create_task_group() as sources:
                for runner in self.runners:
                    sources.start_soon(runner.run, self.stop)
                if on_started is not None:
                    sources.start_soon(on_started, self)
            tg.cancel_scope.cancel()
        if self._target_nc is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await self._target_nc.close()
                except Exception as exc:  # closing a dead connection; nothing left to lose
                    self.log.debug("target.close_failed", error=describe(exc))
        self.log.info("bridge.stopped")

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                self.log.info("bridge.stopping", signal=signal.Signals(signum).name)
                self.stop.set()
                return

    async def _connect_target(self) -> NATS | None:
        target = self.config.target
        attempt = 0
        while not self.stop.is_set():
            attempt += 1
            try:
                self._target_nc = await open_connection(
                    target,
                    name="nats-bridge target",
                    error_type=TargetUnavailable,
                    on_disconnected=self._target_disconnected,
                    on_reconnected=self._target_reconnected,
                    on_error=self._target_error,
                )
                self.log.info("target.connected", servers=list(target.servers), stream=target.stream)
                return self._target_nc
            except BridgeError as exc:
                delay = CONNECT_BACKOFF.delay(attempt)
                self.log.warning("target.connect_failed", error=str(exc), retry_in=delay)
                with anyio.move_on_after(delay):
                    await self.stop.wait()
        return None

    async def _check_target_stream(self, side: TargetSide) -> None:
        try:
            info = await side.api.stream_info(side.stream, timeout=self.config.engine.reset_timeout)
        except (ApiError, ApiTimeout, ApiUnavailable) as exc:
            # not fatal: sources block (loudly) until the stream exists, publishes are retried
            self.log.error("target.stream_unavailable", stream=side.stream, error=str(exc))
            return
        cfg = info.get("config", {})
        window_ns = int(cfg.get("duplicate_window", 0))
        if window_ns and window_ns / 1e9 < 2 * side.ack_timeout:
            self.log.warning(
                "target.duplicate_window_short",
                duplicate_window=window_ns / 1e9,
                ack_timeout=side.ack_timeout,
                hint="a publish retried after an ack timeout may be stored twice; keep duplicate_window >= 2x",
            )
        self.log.info(
            "target.stream",
            stream=side.stream,
            retention=cfg.get("retention"),
            discard=cfg.get("discard"),
            allow_direct=cfg.get("allow_direct"),
        )

    async def _target_disconnected(self) -> None:
        # nats-py calls this after the old socket closed and before it reconnects: the only point at which
        # publishes it would replay out of order can still be taken back
        dropped = drop_unsent_publishes(self._target_nc) if self._target_nc is not None else 0
        if not self.stop.is_set():
            self.log.warning("target.disconnected", unsent_publishes_dropped=dropped)

    async def _target_reconnected(self) -> None:
        self.log.info("target.reconnected")
        for runner in self.runners:
            runner.target_reconnected()

    async def _target_error(self, exc: Exception) -> None:
        suppressed = self._error_throttle.allow(time.monotonic())
        if suppressed is not None:
            self.log.warning("target.error", error=describe(exc), similar_suppressed=suppressed)
