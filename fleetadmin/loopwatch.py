"""Loop watch: how late an event loop wakes up (invariant 3).

A sampler task sleeps ``interval`` seconds and records how late it woke: a
loop that is blocked (a synchronous call, a long computation) cannot wake it
on time. It keeps the last lag, the worst lag, the number of stalls (a wake-up
later than ``stall_threshold``, each logged at WARNING with its duration) and
the blocked seconds (the sum of the lag of every stall).

The snapshot goes to in-process prometheus gauges on every sample and to the
database (``fleetadmin.models.LoopHeartbeat``) every ``publish_every`` seconds,
so that the front's ``/metrics`` and dashboard show the loops of every process.
The database write runs on a one-thread executor owned by the watch, never on
the loop and never on the default executor (which page forwards may fill).

In a dispatcher::

    async with LoopWatch(name=f"dispatcher pool {pool.key}", kind="dispatcher"):
        ...  # the loop's work

or ``watch.start()`` inside the running loop and ``await watch.close()`` (or
``watch.stop()``, which does not wait) when the loop's work ends. The front
starts its watch lazily through ``watch_loop()`` (daphne sends no lifespan).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Gauge

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 0.5
STALL_THRESHOLD_SECONDS = 0.25
PUBLISH_EVERY_SECONDS = 2.0
PUBLISH_ERROR_LOG_SECONDS = 60.0
KINDS = ("front", "dispatcher", "worker")

# In-process series, for a process that exposes prometheus_client's default
# registry itself. The front's /metrics reads the database instead (every process).
_LABELS = ("name", "kind")
LAG = Gauge("fleetadmin_loop_lag_seconds", "How late the loop's sampler woke last time", _LABELS)
WORST_LAG = Gauge("fleetadmin_loop_worst_lag_seconds", "The latest the loop's sampler woke", _LABELS)
STALLS = Counter("fleetadmin_loop_stalls", "Sampler wake-ups later than the stall threshold", _LABELS)
BLOCKED = Counter("fleetadmin_loop_blocked_seconds", "Sum of the lag of every stall", _LABELS)


def _now() -> datetime:
    return datetime.now(UTC)


class LoopWatch:
    """Samples the lag of the event loop it is started on; see the module docstring."""

    def __init__(
        self,
        name: str,
        kind: str = "dispatcher",
        *,
        interval: float = INTERVAL_SECONDS,
        stall_threshold: float = STALL_THRESHOLD_SECONDS,
        publish_every: float = PUBLISH_EVERY_SECONDS,
        publish: bool = True,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        if interval <= 0 or stall_threshold <= 0 or publish_every <= 0:
            raise ValueError("interval, stall_threshold and publish_every must be positive")
        self.name = name[:100]
        self.kind = kind
        self.interval = interval
        self.stall_threshold = stall_threshold
        self.publish_every = publish_every
        self.publishes = publish
        self.host = socket.gethostname()[:100]
        self.pid = os.getpid()
        self.lag_s = 0.0
        self.worst_lag_s = 0.0
        self.stalls = 0
        self.blocked_s = 0.0
        self.samples = 0
        self.started_at: datetime | None = None
        self.stopped_at: datetime | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._writing: asyncio.Future | None = None
        self._stopped: concurrent.futures.Future | None = None
        self._last_error_log = -PUBLISH_ERROR_LOG_SECONDS
        self._series: list = []

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> asyncio.Task:
        """Start sampling the running loop (call it from a coroutine or callback on that loop)."""
        loop = asyncio.get_running_loop()
        if self._stopped is not None:
            raise RuntimeError("this LoopWatch was stopped; make a new one")
        if self._task is not None:
            return self._task
        self.started_at = _now()
        self._series = [metric.labels(self.name, self.kind) for metric in (LAG, WORST_LAG, STALLS, BLOCKED)]
        if self.publishes:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="loopwatch")
        self._task = loop.create_task(self._sample(), name=f"loopwatch {self.name}")
        return self._task

    def stop(self) -> concurrent.futures.Future:
        """Stop sampling and mark the heartbeat stopped. Never blocks: the last write runs on the
        watch's thread; the returned future says when it is done (``await watch.close()`` waits for it)."""
        if self._stopped is not None:
            return self._stopped
        self.stopped_at = _now()
        task = self._task
        if task is not None and not task.done():
            task_loop = task.get_loop()
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if task_loop is running:
                task.cancel()
            elif not task_loop.is_closed():
                task_loop.call_soon_threadsafe(task.cancel)
        if self._series:
            self._series = []
            for metric in (LAG, WORST_LAG, STALLS, BLOCKED):
                try:
                    metric.remove(self.name, self.kind)
                except KeyError:
                    pass
        if self._executor is not None:
            context = contextvars.copy_context()
            self._stopped = self._executor.submit(context.run, write_heartbeat, self.snapshot(), last=True)
            self._stopped.add_done_callback(self._log_write_failure)
            self._executor.shutdown(wait=False)  # the queued writes still run, then the thread ends
        else:
            self._stopped = concurrent.futures.Future()
            self._stopped.set_result(None)
        return self._stopped

    async def close(self) -> None:
        """Stop, and wait (on the loop, holding no thread) until the heartbeat says so. A failed
        last write is logged, not raised: close() belongs in ``finally`` blocks."""
        stopped = self.stop()
        task = self._task
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            await asyncio.gather(task, return_exceptions=True)
        await asyncio.gather(asyncio.wrap_future(stopped), return_exceptions=True)

    async def __aenter__(self) -> LoopWatch:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- sampling -----------------------------------------------------------------------------------

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        next_publish = loop.time()  # at once: the row appears when the loop starts
        while True:
            if self._executor is not None and loop.time() >= next_publish:
                self._publish_soon(loop)
                next_publish = loop.time() + self.publish_every
            expected = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.record(loop.time() - expected)

    def record(self, lag: float) -> None:
        """Account one wake-up that came ``lag`` seconds late."""
        lag = max(0.0, lag)
        self.samples += 1
        self.lag_s = lag
        self.worst_lag_s = max(self.worst_lag_s, lag)
        series = self._series  # emptied by stop(), maybe from another thread
        if series:
            series[0].set(lag)
            series[1].set(self.worst_lag_s)
        if lag > self.stall_threshold:
            self.stalls += 1
            self.blocked_s += lag
            if series:
                series[2].inc()
                series[3].inc(lag)
            log.warning(
                "event loop %r (%s, pid %d) stalled for %.3f s: its sampler woke that late (%d stalls, %.1f s "
                "blocked so far)", self.name, self.kind, self.pid, lag, self.stalls, self.blocked_s,
            )  # fmt: skip

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "host": self.host,
            "pid": self.pid,
            "lag_s": round(self.lag_s, 6),
            "worst_lag_s": round(self.worst_lag_s, 6),
            "stalls": self.stalls,
            "blocked_s": round(self.blocked_s, 6),
            "samples": self.samples,
            "interval_s": self.interval,
            "stall_threshold_s": self.stall_threshold,
            "started_at": self.started_at,
            "updated_at": _now(),
            "stopped_at": self.stopped_at,
        }

    # -- publishing ---------------------------------------------------------------------------------

    def _publish_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._writing is not None and not self._writing.done():
            return  # the database is slow: skip this report rather than queue them up
        context = contextvars.copy_context()
        self._writing = loop.run_in_executor(self._executor, context.run, write_heartbeat, self.snapshot())
        self._writing.add_done_callback(self._log_write_failure)

    async def publish(self) -> None:
        """Write the snapshot now and wait for it (on the loop); raises what the write raised."""
        if self._executor is None:
            raise RuntimeError("this LoopWatch does not publish, or was not started")
        if self._writing is not None and not self._writing.done():
            await asyncio.gather(self._writing, return_exceptions=True)
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        self._writing = loop.run_in_executor(self._executor, context.run, write_heartbeat, self.snapshot())
        await self._writing

    def _log_write_failure(self, future: asyncio.Future | concurrent.futures.Future) -> None:
        if future.cancelled() or future.exception() is None:
            return
        now = time.monotonic()
        if now - self._last_error_log >= PUBLISH_ERROR_LOG_SECONDS:
            self._last_error_log = now
            log.warning("loop watch %r: the heartbeat was not written: %r", self.name, future.exception())


def write_heartbeat(snapshot: dict[str, Any], *, last: bool = False) -> None:
    """Upsert the heartbeat row of one watch (runs on the watch's own thread)."""
    from django.apps import apps
    from django.db import IntegrityError, close_old_connections, connection

    # Not imported: this module is imported before the app registry loads the models (asgi.py).
    LoopHeartbeat = apps.get_model("fleetadmin", "LoopHeartbeat")

    close_old_connections()  # a connection broken by a database restart is dropped, not reused
    try:
        key = {"host": snapshot["host"], "pid": snapshot["pid"], "name": snapshot["name"]}
        fields = {
            "kind": snapshot["kind"],
            "lag_s": snapshot["lag_s"],
            "worst_lag_s": snapshot["worst_lag_s"],
            "stalls": snapshot["stalls"],
            "blocked_s": snapshot["blocked_s"],
            "started_at": snapshot["started_at"] or snapshot["updated_at"],
            "updated_at": snapshot["updated_at"],
            "stopped_at": snapshot["stopped_at"],
        }
        if LoopHeartbeat.objects.filter(**key).update(**fields):
            return
        LoopHeartbeat.objects.forget_old()  # a new loop: a good moment to drop the rows of long-gone ones
        try:
            LoopHeartbeat.objects.create(**key, **fields)
        except IntegrityError:  # the same (host, pid, name) created in between
            LoopHeartbeat.objects.filter(**key).update(**fields)
    finally:
        if last:
            connection.close()  # the thread ends now; its connection must not linger


def watch_loop(app, *, name: str = "front", kind: str = "front") -> LoopWatchMiddleware:
    """Wrap an ASGI application so that its server's loop is watched: ``application = watch_loop(application)``."""
    return LoopWatchMiddleware(app, name=name, kind=kind)


class LoopWatchMiddleware:
    """ASGI wrapper that starts a LoopWatch on the server's loop with the first HTTP or websocket
    connection, once per loop (daphne runs one loop per process and sends no lifespan events)."""

    def __init__(self, app, *, name: str = "front", kind: str = "front") -> None:
        self.app = app
        self.name = name
        self.kind = kind
        self.watch: LoopWatch | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            loop = asyncio.get_running_loop()
            if loop is not self._loop:
                self._start(loop)
        return await self.app(scope, receive, send)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.watch is not None:
            self.watch.stop()  # a new loop in the same process (tests): the old one is gone
        self._loop = loop
        self.watch = LoopWatch(name=self.name, kind=self.kind)
        self.watch.start()
