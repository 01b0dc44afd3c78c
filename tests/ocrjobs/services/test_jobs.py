"""ocrjobs.services.jobs: how a job ends (jobs_refresh), is cancelled and is retried."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ocrjobs.models import Job, Page
from ocrjobs.selectors import PoolBacklog, pages_waiting, pool_backlog
from ocrjobs.services.jobs import job_cancel, job_refresh, job_retry_failed, jobs_refresh
from ocrjobs.services.pages import page_complete, pages_claim
from pods.services.scaler import pool_demand
from tests.factories import image_bytes, pdf_bytes
from tests.ocrjobs.helpers import complete_all, reload, result_for, split, submit

pytestmark = pytest.mark.usefixtures("local_pool")


def test_jobs_refresh_refreshes_only_the_jobs_with_no_page_waiting_or_out(ordinary_user):
    busy = [submit(ordinary_user, {"a.png": image_bytes(["a"]), "b.png": image_bytes(["b"])}) for _ in range(5)]
    ended = submit(ordinary_user, {"c.png": image_bytes(["c"])})
    for job in [*busy, ended]:
        split(job)
    Page.objects.filter(job=busy[0]).update(status=Page.Status.RUNNING)  # out at a pod
    for job in busy[1:]:
        Page.objects.filter(pk=job.pages.first().pk).update(status=Page.Status.DONE)  # one done, one waiting
    Page.objects.filter(job=ended).update(status=Page.Status.DONE)  # stored, the job not refreshed yet

    with CaptureQueriesContext(connection) as statements:
        refreshed = jobs_refresh(job_ids=[job.pk for job in busy])

    assert refreshed == [] and len(statements) == 1  # one look at five jobs that still have pages to go
    assert {reload(job).status for job in busy} == {Job.Status.RUNNING}
    assert jobs_refresh(job_ids=[ended.pk, *[job.pk for job in busy]]) == [ended.pk]
    assert reload(ended).status == Job.Status.DONE


def test_cancel_ends_waiting_and_running_pages_and_refuses_later_results(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    running = pages_claim(pool_id=job.pool_id, token="A", limit=1)[0]

    job = job_cancel(job=job)

    assert job.status == Job.Status.CANCELLED
    assert job.finished_at is not None
    assert set(job.pages.values_list("status", flat=True)) == {Page.Status.CANCELLED}
    late = page_complete(page_id=running.id, token="A", pod_id=None, result=result_for("late"))
    assert late is False
    assert pages_claim(pool_id=job.pool_id, token="B", limit=10) == []
    assert job_refresh(job_id=job.pk).status == Job.Status.CANCELLED


def test_a_cancelled_jobs_page_left_waiting_is_never_claimed_nor_counted_as_demand(ordinary_user, local_pool):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    job_cancel(job=job)
    # As a split racing the cancel could leave them: one page saved pending after the cancel,
    # one running under a claim that expired.
    job.pages.filter(number=1).update(status=Page.Status.PENDING, finished_at=None)
    job.pages.filter(number=2).update(status=Page.Status.RUNNING, claim_token="A",
                                      claim_expires_at=timezone.now() - timedelta(seconds=5))  # fmt: skip

    assert pages_claim(pool_id=job.pool_id, token="B", limit=10) == []
    assert pool_backlog(job.pool_id) == PoolBacklog(waiting=0, running=0)
    assert pages_waiting(pool_id=job.pool_id) == 0
    assert pool_demand(local_pool).waiting == 0


def test_cancel_has_the_scaler_look_again_once_committed(one_page_job, queued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=one_page_job)

    assert queued() == ["pods.tasks.scaler_tick"]  # boots only its pages wanted stop now, not a schedule later


def test_cancel_leaves_done_pages_and_a_finished_job_alone(one_page_job):
    complete_all(one_page_job)

    job = job_cancel(job=one_page_job)

    assert job.status == Job.Status.DONE
    assert job.pages.get().status == Page.Status.DONE


def test_retry_failed_gives_failed_pages_fresh_attempts_and_runs_the_job_again(ordinary_user):
    job = submit(ordinary_user, {"report.pdf": pdf_bytes()})
    split(job)
    complete_all(job, failures={(0, 2): "HTTP 500: boom"})
    assert reload(job).status == Job.Status.PARTIAL

    retried = job_retry_failed(job=job)

    assert retried == 1
    job = reload(job)
    assert (job.status, job.finished_at) == (Job.Status.RUNNING, None)
    page = job.pages.get(number=2)
    assert (page.status, page.attempts, page.error) == (Page.Status.PENDING, 0, "")
    assert job.pages.filter(status=Page.Status.DONE).count() == 2

    complete_all(job)

    assert reload(job).status == Job.Status.DONE


def test_retry_failed_on_a_job_without_failures_does_nothing(one_page_job):
    complete_all(one_page_job)

    assert job_retry_failed(job=one_page_job) == 0
    assert reload(one_page_job).status == Job.Status.DONE
