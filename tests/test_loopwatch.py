"""Loop watch (invariant 3): a blocked loop shows as lag, stalls and blocked seconds, in memory,
in the logs and in its heartbeat row; a loop that stops reporting is stale; stop() says so."""

from __future__ import annotations

import asyncio
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
    async def scenario() -> tuple[dict, dict]:
        watch = LoopWatch(name="test blocked", kind="worker", publish=False)
        watch.start()
        await asyncio.sleep(1.1)  # two quiet samples
        quiet = watch.snapshot()
        await asyncio.sleep(0.2)  # the sampler is 0.3 s into its 0.5 s sleep when the loop is held
        block_the_loop(0.6)
        await asyncio.sleep(0.3)  # runs after the block: the sampler has woken ~0.4 s late
        blocked = watch.snapshot()
        await watch.close()
        return quiet, blocked

    quiet, blocked = asyncio.run(scenario())

    assert quiet["samples"] == 2
    assert quiet["stalls"] == 0 and quiet["blocked_s"] == 0
    assert quiet["worst_lag_s"] < 0.1

    assert blocked["stalls"] == 1
    assert 0.25 < blocked["lag_s"] < 0.6
    assert blocked["worst_lag_s"] == blocked["lag_s"]
    assert blocked["blocked_s"] == pytest.approx(blocked["lag_s"])
    [record] = loopwatch_records
    assert record.levelno == logging.WARNING
    assert "'test blocked'" in record.getMessage() and "stalled for 0." in record.getMessage()


def test_a_short_hiccup_below_the_threshold_is_lag_but_not_a_stall():
    async def scenario() -> dict:
        watch = LoopWatch(name="test hiccup", kind="worker", publish=False)
        watch.start()
        await asyncio.sleep(0.35)
        block_the_loop(0.3)  # the sampler wakes ~0.15 s late
        await asyncio.sleep(0.3)
        snapshot = watch.snapshot()
        watch.stop()
        return snapshot

    snapshot = asyncio.run(scenario())
    assert 0.05 < snapshot["worst_lag_s"] < 0.25
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


async def _wait_for_row(watch: LoopWatch, predicate, timeout: float = 5.0) -> LoopHeartbeat:
    """Read the heartbeat from another thread (as the front would) until the predicate holds."""

    def read() -> LoopHeartbeat | None:
        from django.db import connection

        try:
            return LoopHeartbeat.objects.filter(host=watch.host, pid=watch.pid, name=watch.name).first()
        finally:
            connection.close()

    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        row = await asyncio.to_thread(read)
        if row is not None and predicate(row):
            return row
        assert asyncio.get_running_loop().time() < deadline, f"no such heartbeat row; last: {row and row.to_dict()}"
        await asyncio.sleep(0.05)


def test_publish_writes_now_and_a_row_that_stops_reporting_is_stale_until_stopped(transactional_db):
    async def scenario(watch: LoopWatch) -> None:
        watch.start()
        await asyncio.sleep(0.3)
        block_the_loop(0.6)
        await asyncio.sleep(0.4)
        await watch.publish()
        # the loop ends without stop(): like a process that was killed

    watch = LoopWatch(name="front", kind="front")
    asyncio.run(scenario(watch))

    row = _heartbeat(watch)
    assert row.stalls == 1 and row.lag_s > 0.25
    assert (row.lag_s, row.blocked_s) == pytest.approx((watch.lag_s, watch.blocked_s), abs=1e-5)
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
    from tests.processes import child_env, start_front, wait_for

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
    def refuse(snapshot, *, last=False):
        raise RuntimeError("database is locked")

    monkeypatch.setattr("fleetadmin.loopwatch.write_heartbeat", refuse)

    async def scenario() -> LoopWatch:
        watch = LoopWatch(name="test refused", kind="worker", publish_every=0.2)
        watch.start()
        await asyncio.sleep(1.1)
        assert not watch._task.done() and watch.samples == 2
        await watch.close()  # its last write fails too: logged, not raised
        return watch

    asyncio.run(scenario())
    [record] = loopwatch_records  # one line, however many failed writes (rate limited)
    assert "heartbeat was not written" in record.getMessage() and "database is locked" in record.getMessage()
