"""Jobs: how a job ends once its documents are split and its pages have ended, cancel, retry."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from ocrjobs.models import Document, Job, Page

log = logging.getLogger(__name__)


def job_refresh(*, job_id: int) -> Job:
    """Finish the job once every document is split and every page has ended."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.is_finished:
            return job
        if job.documents.filter(status=Document.Status.PENDING).exists():
            return job
        counts = job.page_counts()
        if counts["pending"] or counts["running"]:
            if job.status == Job.Status.QUEUED:
                job.status = Job.Status.RUNNING
                job.save(update_fields=["status"])
            return job
        failed_documents = job.documents.filter(status=Document.Status.FAILED).exists()
        if counts["done"] == 0:
            job.status = Job.Status.FAILED
        elif counts["failed"] or failed_documents:
            job.status = Job.Status.PARTIAL
        else:
            job.status = Job.Status.DONE
        job.finished_at = timezone.now()
        job.save(update_fields=["status", "finished_at"])
    log.info("job %s finished: %s %s", job.pk, job.status, counts)
    return job


def job_cancel(*, job: Job) -> Job:
    """Cancel the job's waiting and running pages (a split under way stops at its next batch;
    results that come in for them are refused) and have the scaler look again at once."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.is_finished:
            return job
        now = timezone.now()
        job.pages.filter(status__in=[Page.Status.PENDING, Page.Status.RUNNING]).update(
            status=Page.Status.CANCELLED, claim_token="", claim_expires_at=None, finished_at=now
        )
        job.status = Job.Status.CANCELLED
        job.finished_at = now
        job.save(update_fields=["status", "finished_at"])
        # Its pages no longer count as demand: a tick now stops the boots only they wanted.
        transaction.on_commit(lambda: _nudge(job.pool_id))
    return job


def job_retry_failed(*, job: Job) -> int:
    """Give failed pages a fresh set of attempts; the job runs again."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status not in (Job.Status.PARTIAL, Job.Status.FAILED):
            return 0
        retried = job.pages.filter(status=Page.Status.FAILED).update(
            status=Page.Status.PENDING, attempts=0, error="", finished_at=None
        )
        if retried:
            job.status = Job.Status.RUNNING
            job.finished_at = None
            job.save(update_fields=["status", "finished_at"])
            transaction.on_commit(lambda: _nudge(job.pool_id))
    return retried


def _nudge(pool_id: int) -> None:
    from pods.tasks import nudge_scaler

    nudge_scaler(pool_id)
