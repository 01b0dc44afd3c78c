"""Loop watch (invariant 3): a blocked loop shows as lag, stalls and blocked seconds, in memory,
in the logs and in its heartbeat row; a loop that stops reporting is stale; stop() says so."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from fleetadmin.loopwatch import LoopWatch, LoopWatchMiddleware
from fleetadmin.models import LoopHeartbeat


def block_the_loop(seconds: float) -> None:
    """Hold the running loop's thread on purpose, as a blocking call would.

    Scheduled as a callback (``call_soon(time.sleep, ...)``) so that no ``async def`` here
    holds a blocking call: the static loop check walks the tests too.
    """
    asyncio.get_running_loop().call_soon(time.sleep, seconds)


async def until(predicate, guard: float = 5.0) -> None:
    """Wait until the predicate holds, polling every 10 ms. The guard stops a hang; it is no timing assertion."""
    deadline = asyncio.get_running_loop().time() + guard
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"still not true after {guard} s"
        await asyncio.sleep(0.01)


async def next_sample(watch: LoopWatch) -> None:
    """Return (within a poll) once the sampler has recorded its next wake-up and gone back to its sleep."""
    seen = watch.samples
    await until(lambda: watch.samples > seen)


@pytest.fixture(autouse=True)
def no_garbage_collection_pauses():
    # A full collection holds the loop 100+ ms: the sampler would count it as lag the scenario
    # did not make. Collect now, and not during the test.
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()


@pytest.fixture
def loopwatch_records():
    """WARNING records of fleetadmin.loopwatch (works with -p no:logging, unlike caplog)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("fleetadmin.loopwatch")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def _heartbeat(watch: LoopWatch) -> LoopHeartbeat:
    return LoopHeartbeat.objects.get(host=watch.host, pid=watch.pid, name=watch.name)


def test_a_blocked_loop_raises_lag_worst_stalls_and_blocked_seconds_and_logs_the_stall(loopwatch_records):
    async def scenario() -> tuple[dict, dict, float]:
        watch = LoopWatch(name="test blocked", kind="worker", publish=False)
        watch.start()
        await until(lambda: watch.samples >= 2)  # two quiet samples
        quiet = watch.snapshot()
        # The sampler has just gone back to its 0.5 s sleep: held 0.9 s, it wakes ~0.4 s late (plus
        # small delays); it could only reach 0.9 s late if this step ran 0.5 s after its wake-up.
        block_the_loop(0.9)
        await next_sample(watch)
        blocked = watch.snapshot()
        lag = watch.lag_s  # unrounded, as logged
        await watch.close()
        return quiet, blocked, lag

    quiet, blocked, lag = asyncio.run(scenario())

    assert quiet["samples"] >= 2
    assert quiet["stalls"] == 0 and quiet["blocked_s"] == 0

    assert blocked["stalls"] == 1
    assert 0.35 < blocked["lag_s"] < 0.9
    assert blocked["worst_lag_s"] == blocked["lag_s"]
    assert blocked["blocked_s"] == pytest.approx(blocked["lag_s"])
    [record] = loopwatch_records
    assert record.levelno == logging.WARNING
    assert "'test blocked'" in record.getMessage() and f"stalled for {lag:.3f} s" in record.getMessage()


def test_blocked_seconds_add_up_the_lag_of_every_stall():
    async def scenario() -> tuple[list[float], dict]:
        watch = LoopWatch(name="test two stalls", kind="worker", publish=False)
        watch.start()
        await next_sample(watch)
        lags = []
        for _ in range(2):
            block_the_loop(0.9)  # from just after a wake-up: ~0.4 s late, a stall
            await next_sample(watch)
            lags.append(watch.lag_s)
        snapshot = watch.snapshot()
        await watch.close()
        return lags, snapshot

    lags, snapshot = asyncio.run(scenario())

    assert snapshot["stalls"] == 2 and min(lags) > 0.25
    # Both stalls, not the last one alone (as ``blocked_s = lag`` would keep).
    assert snapshot["blocked_s"] == pytest.approx(sum(lags), abs=1e-5)
    assert snapshot["worst_lag_s"] == pytest.approx(max(lags), abs=1e-5)


def test_a_short_hiccup_below_the_threshold_is_lag_but_not_a_stall():
    async def scenario() -> dict:
        watch = LoopWatch(name="test hiccup", kind="worker", publish=False)
        watch.start()
        await next_sample(watch)
        # The sampler has just gone back to its 0.5 s sleep: held 0.57 s, it wakes at least 0.07 s late
        # (the clock sees to that), which leaves 0.18 s of delays before 0.25 s (a stall)
        block_the_loop(0.57)
        await next_sample(watch)
        snapshot = watch.snapshot()
        watch.stop()
        return snapshot

    snapshot = asyncio.run(scenario())
    assert 0.05 < snapshot["lag_s"] <= snapshot["worst_lag_s"] < 0.25
    assert snapshot["stalls"] == 0 and snapshot["blocked_s"] == 0


def test_the_heartbeat_is_written_every_publish_interval_off_the_loop_and_stopped_by_close(transactional_db):
    async def scenario(watch: LoopWatch) -> tuple[LoopHeartbeat, LoopHeartbeat]:
        watch.start()
        first = await _wait_for_row(watch, lambda row: True)
        block_the_loop(0.9)  # longer than the sampler's sleep: a stall wherever it is in that sleep
        # no publish() call: the periodic report carries the stall
        after = await _wait_for_row(watch, lambda row: row.stalls == 1)
        await watch.close()
        return first, after

    watch = LoopWatch(name="dispatcher pool test", kind="dispatcher", publish_every=0.4)
    first, after = asyncio.run(scenario(watch))

    assert (first.kind, first.host, first.pid) == ("dispatcher", socket.gethostname(), os.getpid())
    assert first.stalls == 0 and first.stopped_at is None
    assert after.stalls == 1 and after.lag_s > 0.25 and after.worst_lag_s > 0.25 and after.blocked_s > 0.25
    assert after.stopped_at is None and after.updated_at > first.updated_at
    row = _heartbeat(watch)
    assert row.stopped_at is not None  # close() marked it
    assert row.stalls == 1 and row.worst_lag_s == pytest.approx(watch.worst_lag_s, abs=1e-5)
    assert LoopHeartbeat.objects.filter(name=watch.name).count() == 1


async def _wait_for_row(watch: LoopWatch, predicate, within_s: float = 5.0) -> LoopHeartbeat:
    """Read the heartbeat from another thread (as the front would) until the predicate holds."""

    def read() -> LoopHeartbeat | None:
        from django.db import connection

        try:
            return LoopHeartbeat.objects.filter(host=watch.host, pid=watch.pid, name=watch.name).first()
        finally:
            connection.close()

    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        row = await asyncio.to_thread(read)
        if row is not None and predicate(row):
            return row
        assert asyncio.get_running_loop().time() < deadline, f"no such heartbeat row; last: {row and row.to_dict()}"
        await asyncio.sleep(0.05)


def test_publish_writes_now_and_a_row_that_stops_reporting_is_stale_until_stopped(transactional_db):
    async def scenario(watch: LoopWatch) -> dict:
        watch.start()
        await next_sample(watch)
        block_the_loop(0.9)  # longer than the sampler's sleep: a stall
        await next_sample(watch)
        published = watch.snapshot()  # what publish() writes: the next sample is 0.5 s away
        await watch.publish()
        return published  # the loop ends without stop(): like a process that was killed

    watch = LoopWatch(name="front", kind="front")
    published = asyncio.run(scenario(watch))

    row = _heartbeat(watch)
    assert row.stalls == 1 and row.lag_s > 0.25
    assert (row.lag_s, row.blocked_s) == pytest.approx((published["lag_s"], published["blocked_s"]), abs=1e-5)
    assert row.stopped_at is None and not row.is_stale()
    mine = LoopHeartbeat.objects.filter(pk=row.pk)
    assert not mine.stale().exists()
    assert mine.with_stale().get().stale is False

    later = timezone.now() + timedelta(seconds=11)
    assert list(mine.stale(now=later)) == [row]
    [shown] = mine.for_dashboard(now=later)
    assert shown.stale is True and shown.to_dict(now=later)["stale"] is True

    watch.stop().result(timeout=10)  # from outside any loop: the write runs on the watch's thread
    row.refresh_from_db()
    assert row.stopped_at is not None
    assert not mine.stale(now=later).exists()
    assert not mine.for_dashboard(now=later).exists()


def test_rows_of_processes_gone_for_a_day_are_forgotten_when_a_loop_starts(transactional_db):
    old = timezone.now() - timedelta(days=2)
    LoopHeartbeat.objects.create(name="front", kind="front", host="gone", pid=1, started_at=old, updated_at=old)

    async def scenario() -> None:
        async with LoopWatch(name="test forget", kind="worker"):
            await asyncio.sleep(0.1)

    asyncio.run(scenario())
    assert not LoopHeartbeat.objects.filter(host="gone").exists()
    assert LoopHeartbeat.objects.filter(name="test forget").exists()


def test_a_watch_refuses_to_start_outside_a_loop_and_to_restart():
    watch = LoopWatch(name="test", kind="worker", publish=False)
    with pytest.raises(RuntimeError):
        watch.start()
    with pytest.raises(ValueError):
        LoopWatch(name="test", kind="gpu")

    async def scenario() -> None:
        assert watch.start() is watch.start()  # once
        await watch.close()
        with pytest.raises(RuntimeError):
            watch.start()

    asyncio.run(scenario())


def test_the_front_wrapper_starts_one_watch_per_loop_on_the_first_connection(transactional_db):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    wrapper = LoopWatchMiddleware(app, name="front", kind="front")

    async def scenario() -> LoopWatch:
        await wrapper({"type": "lifespan"}, None, None)
        assert wrapper.watch is None  # daphne sends none; another server's lifespan starts nothing
        await wrapper({"type": "http"}, None, None)
        watch = wrapper.watch
        await wrapper({"type": "websocket"}, None, None)
        await wrapper({"type": "http"}, None, None)
        assert wrapper.watch is watch and watch._task is not None and not watch._task.done()
        await watch.close()
        return watch

    watch = asyncio.run(scenario())
    assert seen == ["lifespan", "http", "websocket", "http"]
    assert (watch.name, watch.kind) == ("front", "front")
    assert _heartbeat(watch).stopped_at is not None


def test_the_asgi_application_is_watched():
    from fleetadmin.asgi import application

    assert isinstance(application, LoopWatchMiddleware)
    assert (application.name, application.kind) == ("front", "front")


@pytest.mark.e2e
def test_daphne_publishes_the_front_loop_and_serves_it_on_metrics(transactional_db, read_token, tmp_path):
    from tools.processes import child_env, start_front, wait_for

    var_dir = tmp_path / "var"
    var_dir.mkdir()
    front, url = start_front(child_env(var_dir), var_dir)  # its first request starts the watch
    try:
        row = wait_for(
            lambda: LoopHeartbeat.objects.filter(kind="front", pid=front.popen.pid).first(), 15,
            lambda: f"no heartbeat from daphne:\n{front.tail()}",
        )  # fmt: skip
        assert row.name == "front" and row.stopped_at is None and not row.is_stale()
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        body = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {read_token}"}, timeout=10).text
        lags = {
            (s.labels["kind"], s.labels["pid"]): s.value
            for family in text_string_to_metric_families(body)
            if family.name == "fleetadmin_loop_lag_seconds"
            for s in family.samples
        }
        assert ("front", str(front.popen.pid)) in lags
    finally:
        front.stop()


def test_a_failing_heartbeat_write_is_logged_and_neither_stops_the_sampler_nor_raises(monkeypatch, loopwatch_records):
    refused: list[bool] = []  # the ``last`` flag of every refused write

    def refuse(snapshot, *, last=False):
        refused.append(last)
        raise RuntimeError("database is locked")

    monkeypatch.setattr("fleetadmin.loopwatch.write_heartbeat", refuse)

    async def scenario() -> LoopWatch:
        watch = LoopWatch(name="test refused", kind="worker", publish_every=0.2)
        watch.start()
        await until(lambda: len(refused) >= 2)
        await next_sample(watch)  # still sampling after the failed writes
        assert not watch._task.done()
        await watch.close()  # its last write fails too: logged, not raised
        return watch

    asyncio.run(scenario())
    assert len(refused) >= 3 and refused[-1] is True
    # one line, however many failed writes (rate limited); a stall's line would be another matter
    [record] = [r for r in loopwatch_records if "heartbeat" in r.getMessage()]
    assert "heartbeat was not written" in record.getMessage() and "database is locked" in record.getMessage()
