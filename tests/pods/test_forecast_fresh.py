"""Each submission's forecast reads its pool's pages ahead and ready pods at that moment, though the
slow-moving figures (seconds a page, boots, price) are reused for FORECAST_BASIS_SECONDS: two jobs
submitted back to back, the second waits for the first's pages (reused, it saw none ahead, and
bench/storm.py's later jobs were forecast as if alone). Pages behind a job (a forecast made once a
burst is in) grow the pods it is read on and share their bill, but are not waited for."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ocrjobs import selectors
from ocrjobs.models import Document, Job, Page
from pods.models import Pod, Pool
from pods.services.forecast import job_forecast, pool_forecast
from tests.factories import pdf_bytes
from tests.ocrjobs.helpers import split, submit
from tests.ocrjobs.test_forecast import gpu_pool  # noqa: F401 (a fixture: $0.50/h in the catalogue)


def ahead_of(job: Job) -> int:
    return job.forecast["pools"][0]["based_on"]["pages_ahead"]


def test_the_second_of_two_jobs_submitted_together_waits_for_the_firsts_pages(ordinary_user, local_pool, settings):
    settings.FORECAST_BASIS_SECONDS = 3600  # the slow figures reused for both submissions
    first = submit(ordinary_user, {"a.pdf": pdf_bytes(["one", "two", "three"])})
    second = submit(ordinary_user, {"b.pdf": pdf_bytes(["four"])})
    assert ahead_of(first) == 0
    assert ahead_of(second) == 3  # the first job's pages, not split yet


def test_a_pod_ready_since_the_last_forecast_is_seen(ordinary_user, local_pool, settings):
    settings.FORECAST_BASIS_SECONDS = 3600
    before = submit(ordinary_user, {"a.pdf": pdf_bytes(["one"])})
    Pod.objects.create(pool=local_pool, name="ready-one", state=Pod.State.READY, lanes=1)
    after = submit(ordinary_user, {"b.pdf": pdf_bytes(["two"])})
    assert before.forecast["pools"][0]["based_on"]["pods_ready"] is False
    assert after.forecast["pools"][0]["based_on"]["pods_ready"] is True


def test_pages_behind_a_job_grow_its_pods_and_share_their_bill_but_are_not_waited_for(gpu_pool):  # noqa: F811
    # 100 pages at 2 s on two-lane pods at $0.50/h, 60 s boot (not waited for: a pod is ready),
    # 60 s idle tail; 900 pages of a later job behind it (a forecast made once a burst is in).
    Pod.objects.create(pool=gpu_pool, name="ready", state=Pod.State.READY, lanes=2)
    alone = pool_forecast(gpu_pool, pages=100)["sizings"]["fastest"]
    burst = pool_forecast(gpu_pool, pages=100, behind=900)
    fastest = burst["sizings"]["fastest"]
    assert (alone["pods"], fastest["pods"]) == (10, 10)  # max_pods
    assert alone["minutes"] == fastest["minutes"] and alone["dollars"] > fastest["dollars"]
    assert fastest["minutes"] == round(100 * 2.0 / (10 * 2) / 60, 2)  # its own pages only
    busy = 1000 * 2.0 / (10 * 2)
    assert fastest["dollars"] == round(0.5 * 10 * (60 + busy + 60) * 100 / 1000 / 3600, 4)  # its pages' part
    assert burst["based_on"]["pages_behind"] == 900


def test_pages_ahead_of_many_pools_are_each_pools_backlog_and_pages_not_split(ordinary_user, local_pool):
    other = Pool.objects.create(key="other", provider="local", max_pods=1, lanes_per_pod=1)
    idle = Pool.objects.create(key="idle", provider="local", max_pods=1, lanes_per_pod=1)
    read = submit(ordinary_user, {"a.pdf": pdf_bytes([["one"]] * 5)})
    split(read)
    now = timezone.now()
    pages = list(read.pages.order_by("pk"))
    Page.objects.filter(pk=pages[0].pk).update(status=Page.Status.RUNNING, claim_expires_at=now + timedelta(minutes=1))
    Page.objects.filter(pk=pages[1].pk).update(status=Page.Status.RUNNING, claim_expires_at=now - timedelta(minutes=1))
    Page.objects.filter(pk=pages[2].pk).update(status=Page.Status.DONE)
    cancelled = submit(ordinary_user, {"b.pdf": pdf_bytes([["two"]] * 2)})
    split(cancelled)
    Job.objects.filter(pk=cancelled.pk).update(status=Job.Status.CANCELLED)  # (its pages left pending)
    submit(ordinary_user, {"c.pdf": pdf_bytes([["three"]] * 3)}, pool_key="other")  # not split yet
    halfway = submit(ordinary_user, {"d.pdf": pdf_bytes([["four"]] * 4)}, pool_key="other")
    split(halfway)  # then as if its split had made only its first page so far
    Page.objects.filter(job=halfway, number__gt=1).delete()
    Document.objects.filter(job=halfway).update(status=Document.Status.PENDING)
    Job.objects.filter(pk=halfway.pk).update(status=Job.Status.QUEUED)

    ahead = selectors.pools_pages_ahead([local_pool.pk, other.pk, idle.pk])

    def one_by_one(pool: Pool) -> int:
        backlog = selectors.pool_backlog(pool.pk)
        return backlog.waiting + backlog.running + selectors.pool_pages_not_split(pool.pk)

    assert (
        ahead
        == {pool.pk: one_by_one(pool) for pool in (local_pool, other, idle)}
        == {
            local_pool.pk: 4,  # two pending, one running, one whose claim expired; not the cancelled job's
            other.pk: 3 + 4,  # c's three; d's page made (pending) and the three still to make
            idle.pk: 0,
        }
    )


def _statements_of_a_forecast(pools: int) -> int:
    for n in range(pools - Pool.objects.count()):
        Pool.objects.create(key=f"pool-{n}", provider="local", max_pods=1, lanes_per_pod=1)
    job_forecast(pages=10)  # (the slow figures, read once and reused)
    with CaptureQueriesContext(connection) as statements:
        job_forecast(pages=10)
    return len(statements)


def test_a_forecast_reads_what_moves_fast_in_the_same_statements_however_many_pools_are_open(local_pool, settings):
    # Four statements a pool before (two backlog counts, the pages not split, a ready pod): a
    # submission's forecast was a fifth of the front's CPU on bench/ingest.py.
    settings.FORECAST_BASIS_SECONDS = 3600

    assert _statements_of_a_forecast(1) == _statements_of_a_forecast(6) == 3  # the pools, pages ahead, ready pods
