"""/metrics: Prometheus text that its own parser reads, values from the database, auth, no secrets."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleetadmin.loopwatch import LoopWatch
from fleetadmin.models import LoopHeartbeat
from ocrjobs.models import Document, Job, Page
from pods.models import Alert, BootAttempt, CapacityVerdict, Pod, Pool
from pods.services.lifecycle import pod_end
from tests.fleetadmin.test_loopwatch import next_sample, no_garbage_collection_pauses, until  # noqa: F401  (an autouse fixture)

SECRET = "rpa_TESTSECRET0123456789abcdefNEVERSHOWN"


def scrape(client, token: str | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return parse(response.content.decode())


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(metrics: dict, metric: str, /, **labels: str) -> float:
    return metrics[(metric, tuple(sorted(labels.items())))]


def _pages(pool: Pool, statuses: dict[str, int], *, expired: int = 0) -> None:
    job = Job.objects.create(pool=pool)
    total = sum(statuses.values()) + expired
    document = Document.objects.create(job=job, position=0, name="d.pdf", kind="pdf", source="x", size_bytes=1,
                                       page_count=total)  # fmt: skip
    now = timezone.now()
    rows, number = [], 0
    for status, count in [*statuses.items(), ("expired", expired)]:
        for _ in range(count):
            number += 1
            claim = None
            if status == Page.Status.RUNNING:
                claim = now + timedelta(seconds=60)
            elif status == "expired":
                status, claim = Page.Status.RUNNING, now - timedelta(seconds=5)
            rows.append(Page(job=job, document=document, pool=pool, number=number,
                             status=status, claim_expires_at=claim))  # fmt: skip
    Page.objects.bulk_create(rows)


@pytest.fixture
def fleet(local_pool):
    now = timezone.now()
    cloud = Pool.objects.create(key="cloud", provider="runpod", max_pods=4, lanes_per_pod=4)
    Pod.objects.create(pool=local_pool, name="fa-local-a", state=Pod.State.READY, lanes=2,
                       cost_per_hr=Decimal("0.50"), billed_from=now - timedelta(hours=1))  # fmt: skip
    Pod.objects.create(pool=local_pool, name="fa-local-b", state=Pod.State.BOOTING, lanes=2)
    ended = Pod.objects.create(pool=local_pool, name="fa-local-c", state=Pod.State.READY, lanes=2,
                               cost_per_hr=Decimal("1.00"), billed_from=now - timedelta(hours=3),
                               ended_at=now - timedelta(hours=1))  # fmt: skip
    pod_end(pod=ended, state=Pod.State.TERMINATED)  # as every pod ends: counted in its pool's tally
    booting = Pod.objects.create(pool=cloud, name="fa-cloud-a", state=Pod.State.BOOTING, lanes=4,
                                 cost_per_hr=Decimal("2.40"), billed_from=now - timedelta(minutes=30),
                                 error=f"provider said: bad key {SECRET}")  # fmt: skip
    failed = Pod.objects.create(pool=cloud, name="fa-cloud-b", state=Pod.State.BOOTING, lanes=4)
    pod_end(pod=failed, state=Pod.State.FAILED)
    BootAttempt.record(pod=booting, candidate="runpod|A40|SECURE|*", outcome="created")
    for _ in range(3):
        BootAttempt.record(pod=failed, candidate="runpod|H100|SECURE|*", outcome="no_capacity",
                           error=f"no capacity ({SECRET})")  # fmt: skip
    CapacityVerdict.objects.create(key="runpod|H100|SECURE|*", blocked_until=now + timedelta(seconds=60))
    CapacityVerdict.objects.create(key="runpod|A100|SECURE|*", blocked_until=now - timedelta(seconds=60))
    CapacityVerdict.objects.create(key="runpod|L4|SECURE|*", probing_until=now + timedelta(seconds=60))
    Alert.raise_(pool=cloud, kind=Alert.Kind.STALL, message="dispatch stalled")
    Alert.raise_(pool=cloud, kind=Alert.Kind.AUTH, message=f"runpod refused {SECRET}")
    Alert.resolve(pool=cloud, kind=Alert.Kind.AUTH)
    _pages(local_pool, {Page.Status.PENDING: 5, Page.Status.RUNNING: 2, Page.Status.DONE: 3, Page.Status.FAILED: 1},
           expired=1)  # fmt: skip
    _pages(cloud, {Page.Status.DONE: 7})
    return local_pool, cloud


def test_it_answers_the_fleet_from_the_database(client, read_token, fleet):
    # Of the two pages running under a live claim, one is out at the ready pod; the other a
    # dispatcher claimed ahead for a lane (no pod yet): one lane is busy, not two.
    out = Page.objects.filter(pool=fleet[0], status=Page.Status.RUNNING, claim_expires_at__gt=timezone.now()).first()
    Page.objects.filter(pk=out.pk).update(pod=Pod.objects.get(name="fa-local-a"))
    metrics = scrape(client, read_token)

    assert value(metrics, "fleetadmin_pods", pool="local", state="ready") == 1
    assert value(metrics, "fleetadmin_pods", pool="local", state="booting") == 1
    assert value(metrics, "fleetadmin_pods", pool="local", state="terminated") == 1
    assert value(metrics, "fleetadmin_pods", pool="local", state="lost") == 0
    assert value(metrics, "fleetadmin_pods", pool="cloud", state="failed") == 1
    assert value(metrics, "fleetadmin_lanes_total", pool="local") == 2  # ready pods only
    assert value(metrics, "fleetadmin_lanes_used", pool="local") == 1
    # 5 pending, 1 whose claim expired, 1 claimed ahead for a lane
    assert value(metrics, "fleetadmin_backlog_pages", pool="local") == 7
    assert value(metrics, "fleetadmin_backlog_pages", pool="cloud") == 0
    assert value(metrics, "fleetadmin_pages_done_total", pool="local") == 3
    assert value(metrics, "fleetadmin_pages_done_total", pool="cloud") == 7
    assert value(metrics, "fleetadmin_pages_failed_total", pool="local") == 1
    assert value(metrics, "fleetadmin_boot_attempts_total", pool="cloud", outcome="created") == 1
    assert value(metrics, "fleetadmin_boot_attempts_total", pool="cloud", outcome="no_capacity") == 3
    assert value(metrics, "fleetadmin_capacity_verdicts_blocked") == 1
    assert value(metrics, "fleetadmin_capacity_verdicts_probing") == 1
    assert value(metrics, "fleetadmin_alerts_open", kind="stall") == 1
    assert value(metrics, "fleetadmin_alerts_open", kind="auth") == 0
    # $/h: live pods billed now; spend: every pod from billed_from to its end (or now)
    assert value(metrics, "fleetadmin_dollars_per_hour", pool="local") == pytest.approx(0.50)
    assert value(metrics, "fleetadmin_dollars_per_hour", pool="cloud") == pytest.approx(2.40)
    assert value(metrics, "fleetadmin_spend_dollars_total", pool="local") == pytest.approx(0.50 + 2.00, abs=0.01)
    assert value(metrics, "fleetadmin_spend_dollars_total", pool="cloud") == pytest.approx(1.20, abs=0.01)


def test_it_shows_every_running_loop_with_its_lag_and_flags_the_stale_ones(client, read_token):
    now = timezone.now()
    LoopHeartbeat.objects.create(name="front", kind="front", host="web1", pid=10, lag_s=0.002, worst_lag_s=0.3,
                                 stalls=2, blocked_s=0.7, updated_at=now)  # fmt: skip
    LoopHeartbeat.objects.create(name="dispatcher pool local", kind="dispatcher", host="w1", pid=20, lag_s=4.0,
                                 worst_lag_s=4.0, stalls=1, blocked_s=4.0, updated_at=now - timedelta(seconds=30))  # fmt: skip
    LoopHeartbeat.objects.create(name="dispatcher pool cloud", kind="dispatcher", host="w1", pid=21,
                                 updated_at=now, stopped_at=now)  # fmt: skip
    metrics = scrape(client, read_token)

    front = {"name": "front", "kind": "front", "host": "web1", "pid": "10"}
    stuck = {"name": "dispatcher pool local", "kind": "dispatcher", "host": "w1", "pid": "20"}
    assert value(metrics, "fleetadmin_loop_lag_seconds", **front) == pytest.approx(0.002)
    assert value(metrics, "fleetadmin_loop_worst_lag_seconds", **front) == pytest.approx(0.3)
    assert value(metrics, "fleetadmin_loop_stalls_total", **front) == 2
    assert value(metrics, "fleetadmin_loop_blocked_seconds_total", **front) == pytest.approx(0.7)
    assert value(metrics, "fleetadmin_loop_stale", **front) == 0
    assert value(metrics, "fleetadmin_loop_stale", **stuck) == 1
    assert value(metrics, "fleetadmin_loop_report_age_seconds", **stuck) >= 30
    assert not [key for key in metrics if ("pid", "21") in key[1]]  # a loop that stopped cleanly is not shown


def test_loop_lag_rises_when_a_loop_is_blocked_on_purpose(client, read_token, transactional_db):
    def lag_series(metrics: dict, watch: LoopWatch) -> dict[str, float]:
        labels = (("host", watch.host), ("kind", "worker"), ("name", watch.name), ("pid", str(watch.pid)))
        return {name: v for (name, key), v in metrics.items() if key == labels}

    async def scenario() -> tuple[dict, dict, int, dict]:
        watch = LoopWatch(name="test lag on metrics", kind="worker")
        watch.start()
        await next_sample(watch)  # a quiet one
        await watch.publish()
        before = lag_series(await asyncio.to_thread(scrape, client, read_token), watch)
        await next_sample(watch)
        # A busy machine may have stalled the loop while the scrape thread held the GIL: count from here.
        stalls = watch.stalls
        # The sampler has just gone back to its 0.5 s sleep; the loop held on purpose 0.9 s: it wakes ~0.4 s
        # late. Scheduled as a callback so that no async def here holds a blocking call (the static loop
        # check walks the tests).
        asyncio.get_running_loop().call_soon(time.sleep, 0.9)
        await next_sample(watch)  # the one that woke late
        published = watch.snapshot()  # what publish() writes: the next sample is 0.5 s away
        await watch.publish()
        after = lag_series(await asyncio.to_thread(scrape, client, read_token), watch)
        await watch.close()
        return before, after, stalls, published

    before, after, stalls, published = asyncio.run(scenario())
    assert before["fleetadmin_loop_stalls_total"] == 0
    assert before["fleetadmin_loop_worst_lag_seconds"] < 0.25
    assert published["stalls"] == stalls + 1  # the block, once
    assert published["lag_s"] > 0.25
    assert after["fleetadmin_loop_lag_seconds"] == pytest.approx(published["lag_s"], abs=1e-5)
    assert after["fleetadmin_loop_worst_lag_seconds"] > 0.25
    assert after["fleetadmin_loop_stalls_total"] == published["stalls"]
    assert after["fleetadmin_loop_blocked_seconds_total"] == pytest.approx(published["blocked_s"], abs=1e-5)
    assert after["fleetadmin_loop_blocked_seconds_total"] > 0.25
    assert after["fleetadmin_loop_stale"] == 0


def test_it_needs_credentials(client, db):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert "error" in response.json() and b"fleetadmin_" not in response.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer fa_not-a-token").status_code == 401


def test_a_logged_in_user_and_every_scope_may_read_it(client, ordinary_user, submit_token, admin_token):
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {submit_token}").status_code == 200
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {admin_token}").status_code == 200
    client.force_login(ordinary_user)
    assert client.get("/metrics").status_code == 200
    assert client.post("/metrics").status_code == 405


def test_the_runpod_key_never_appears(client, read_token, fleet, monkeypatch, settings, tmp_path):
    settings.RUNPOD_API_KEY = SECRET
    LoopHeartbeat.objects.create(name="front", kind="front", host="web1", pid=10)
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {read_token}")
    assert response.status_code == 200
    assert b"fleetadmin_pods" in response.content and b"fleetadmin_loop_lag_seconds" in response.content
    assert SECRET.encode() not in response.content
    assert b"TESTSECRET" not in response.content


def test_a_scrape_is_a_few_queries_whatever_the_size_of_the_fleet(
    client, read_token, fleet, django_assert_max_num_queries
):
    with django_assert_max_num_queries(10):
        scrape(client, read_token)
    local, cloud = fleet
    Pod.objects.bulk_create([Pod(pool=cloud, name=f"fa-cloud-x{n}", state=Pod.State.READY, lanes=4) for n in range(40)])
    _pages(cloud, {Page.Status.PENDING: 30})
    with django_assert_max_num_queries(10):
        metrics = scrape(client, read_token)
    assert value(metrics, "fleetadmin_pods", pool="cloud", state="ready") == 40


# --- bounded by the work in hand: counters kept as jobs finish --------------------------------------


def _brute_force(pool: Pool) -> tuple[int, int]:
    pages = Page.objects.filter(pool=pool)
    return pages.filter(status=Page.Status.DONE).count(), pages.filter(status=Page.Status.FAILED).count()


def test_page_counters_follow_jobs_through_finish_retry_and_cancel(client, read_token, ordinary_user, local_pool):
    from ocrjobs.services.jobs import job_cancel, job_retry_failed
    from tests.factories import image_bytes
    from tests.ocrjobs.helpers import complete_all, split, submit

    def counters() -> tuple[float, float]:
        metrics = scrape(client, read_token)
        return (value(metrics, "fleetadmin_pages_done_total", pool="local"),
                value(metrics, "fleetadmin_pages_failed_total", pool="local"))  # fmt: skip

    first = submit(ordinary_user, {"a.png": image_bytes(["a"]), "b.png": image_bytes(["b"])})
    split(first)
    complete_all(first, failures={(1, 1): "unreadable"})
    assert Job.objects.get(pk=first.pk).status == Job.Status.PARTIAL
    assert counters() == _brute_force(local_pool) == (1, 1)

    job_retry_failed(job=first)
    assert counters() == (1, 1)  # the failure stays counted while the page waits again
    complete_all(first, failures={(1, 1): "still unreadable"})
    assert counters() == (1, 2)  # a failure counter: each time a page spent its attempts

    job_retry_failed(job=first)
    complete_all(first)
    assert Job.objects.get(pk=first.pk).status == Job.Status.DONE
    assert counters() == (2, 2)

    second = submit(ordinary_user, {"c.png": image_bytes(["c"])})
    split(second)
    assert counters() == (2, 2)
    complete_all(second)
    third = submit(ordinary_user, {"d.png": image_bytes(["d"])})
    split(third)
    job_cancel(job=third)
    assert counters() == (3, 2)
    assert _brute_force(local_pool)[0] == 3


def test_a_scrape_reads_pages_of_unfinished_jobs_only(client, read_token, local_pool):
    """Each read of the page table is a range of one unfinished job's pages (the correlated
    count), never a scan of the pages of every job ever run."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _pages(local_pool, {Page.Status.DONE: 5})
    Job.objects.update(status=Job.Status.DONE)
    _pages(local_pool, {Page.Status.PENDING: 2, Page.Status.DONE: 1})

    with CaptureQueriesContext(connection) as context:
        metrics = scrape(client, read_token)

    page_reads = [q["sql"] for q in context.captured_queries if '"ocrjobs_page"' in q["sql"]]
    assert page_reads, "the scrape reads no pages at all"
    for sql in page_reads:
        reads = len(re.findall(r'FROM "ocrjobs_page"', sql))
        per_job = len(re.findall(r'\b\w+\."job_id" = \("ocrjobs_job"\."id"\)', sql))
        assert reads == per_job, sql
    assert value(metrics, "fleetadmin_backlog_pages", pool="local") == 2
    assert value(metrics, "fleetadmin_pages_done_total", pool="local") == 1  # the first job was never tallied


def test_a_scrape_reads_the_live_pods_and_the_tallies_not_every_pod_ever(client, read_token, local_pool):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    now = timezone.now()
    for n in range(3):
        pod = Pod.objects.create(pool=local_pool, name=f"fa-old-{n}", state=Pod.State.READY, lanes=2,
                                 cost_per_hr=Decimal("0.60"), billed_from=now - timedelta(hours=2),
                                 ended_at=now - timedelta(hours=1))  # fmt: skip
        pod_end(pod=pod, state=Pod.State.TERMINATED)
        pod_end(pod=pod, state=Pod.State.LOST)  # ended already: not counted again
    Pod.objects.create(pool=local_pool, name="fa-live", state=Pod.State.READY, lanes=2,
                       cost_per_hr=Decimal("1.20"), billed_from=now - timedelta(hours=1))  # fmt: skip

    with CaptureQueriesContext(connection) as context:
        metrics = scrape(client, read_token)

    assert value(metrics, "fleetadmin_pods", pool="local", state="terminated") == 3
    assert value(metrics, "fleetadmin_pods", pool="local", state="lost") == 0
    assert value(metrics, "fleetadmin_pods", pool="local", state="ready") == 1
    assert value(metrics, "fleetadmin_spend_dollars_total", pool="local") == pytest.approx(3 * 0.60 + 1.20, abs=0.01)
    pod_reads = [q["sql"] for q in context.captured_queries if 'FROM "pods_pod"' in q["sql"]]
    assert pod_reads and all('"pods_pod"."state" IN' in sql for sql in pod_reads), pod_reads


def test_a_scrape_with_no_app_registered_fails_instead_of_answering_loops_only(monkeypatch):
    from fleetadmin import metrics

    monkeypatch.setattr(metrics, "_SOURCES", {})  # as if pods/registrations.py had not run
    with pytest.raises(RuntimeError, match="no app registered its metrics"):
        list(metrics.FleetCollector().collect())
