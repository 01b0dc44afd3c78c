"""jobs_refresh: the jobs a dispatcher stored pages of that may have ended, ended together as
job_refresh would end each."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ocrjobs.models import Document, Job, Page, PoolPageTally
from ocrjobs.services.jobs import job_refresh, jobs_refresh
from tests.factories import image_bytes
from tests.ocrjobs.helpers import reload, split, submit

pytestmark = pytest.mark.usefixtures("local_pool")


def two_page_jobs(owner, count: int) -> list[Job]:
    jobs = [submit(owner, {"a.png": image_bytes(["a"]), "b.png": image_bytes(["b"])}) for _ in range(count)]
    for job in jobs:
        split(job)
    return jobs


def test_jobs_that_ended_together_end_in_a_few_statements_for_them_all(ordinary_user):
    jobs = two_page_jobs(ordinary_user, 6)
    Page.objects.filter(job__in=jobs).update(status=Page.Status.DONE)
    PoolPageTally.objects.get_or_create(pool_id=jobs[0].pool_id)

    with CaptureQueriesContext(connection) as statements:
        refreshed = jobs_refresh(job_ids=[job.pk for job in jobs])

    assert sorted(refreshed) == sorted(job.pk for job in jobs)
    assert {reload(job).status for job in jobs} == {Job.Status.DONE}
    # A job_refresh each took ~9 statements (54 here): the look, the lock, the documents and the
    # pages' counts once for them all, then the job and its pool's tally per job; and one for
    # their searchable PDFs, two when some asked for them (ocrjobs.services.outputs.job_outputs_request).
    assert len(statements) <= 7 + 2 * len(jobs), [q["sql"][:80] for q in statements]


def test_jobs_refreshed_together_end_as_each_would_on_its_own(ordinary_user):
    done, partial, failed, failed_document, waiting_document = two_page_jobs(ordinary_user, 5)
    Page.objects.filter(job__in=[done, partial, failed_document, waiting_document]).update(status=Page.Status.DONE)
    Page.objects.filter(pk=partial.pages.first().pk).update(status=Page.Status.FAILED, error="unreadable")
    Page.objects.filter(job=failed).update(status=Page.Status.FAILED, error="unreadable")
    failed_document.documents.filter(position=0).update(status=Document.Status.FAILED, error="corrupt")
    waiting_document.documents.filter(position=0).update(status=Document.Status.PENDING)
    jobs = [done, partial, failed, failed_document, waiting_document]

    refreshed = jobs_refresh(job_ids=[job.pk for job in jobs])

    assert [reload(job).status for job in jobs] == [Job.Status.DONE, Job.Status.PARTIAL, Job.Status.FAILED,
                                                    Job.Status.PARTIAL, Job.Status.RUNNING]  # fmt: skip
    assert set(refreshed) == {job.pk for job in jobs}  # looked at: the last waits for its document
    assert all(job.finished_at for job in jobs[:4]) and waiting_document.finished_at is None
    assert [(job.tallied_done, job.tallied_failed) for job in jobs[:4]] == [(2, 0), (1, 1), (0, 2), (2, 0)]
    tally = PoolPageTally.objects.get(pool_id=done.pool_id)
    assert (tally.done, tally.failed) == (5, 3)
    # and the job whose document waited ends as job_refresh ends it, once that is split
    waiting_document.documents.update(status=Document.Status.SPLIT)
    assert job_refresh(job_id=waiting_document.pk).status == Job.Status.DONE
    assert reload(PoolPageTally.objects.get(pool_id=done.pool_id)).done == 7
