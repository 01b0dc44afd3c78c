"""Jobs: how a job ends once its documents are split and its pages have ended, cancel, retry."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction
from django.db.models import Count, Exists, F, OuterRef
from django.utils import timezone

from fleetadmin import leases
from ocrjobs.enqueue import enqueue_splits
from ocrjobs.models import Document, Job, Page, PoolPageTally
from ocrjobs.services import fetch_turns
from ocrjobs.services.budgets import retry_within_budget
from ocrjobs.services.outputs import job_outputs_request
from ocrjobs.services.webhooks import webhook_enqueue
from pods.audit import Actor, audit_record
from pods.enqueue import nudge_scaler
from pods.models import AuditEntry

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
        failed_documents = job.documents.filter(status=Document.Status.FAILED).exists()
        if _job_end(job, counts, failed_documents=failed_documents):
            job_outputs_request(jobs=[job])  # its searchable PDFs, built by a worker once committed
    return job


def _job_end(job: Job, counts: dict[str, int], *, failed_documents: bool) -> bool:
    """End a job under its row lock, its documents split, from its pages' counts: or, while pages
    wait or are out, mark it running. Whether it ended."""
    if counts["pending"] or counts["running"]:
        if job.status == Job.Status.QUEUED:
            job.status = Job.Status.RUNNING
            job.save(update_fields=["status"])
        return False
    if counts["done"] == 0:
        job.status = Job.Status.FAILED
    elif counts["failed"] or failed_documents:
        job.status = Job.Status.PARTIAL
    else:
        job.status = Job.Status.DONE
    job.finished_at = timezone.now()
    _tally(job, counts, save=False)
    job.save(update_fields=["status", "finished_at", "tallied_done", "tallied_failed"])
    webhook_enqueue(job=job)
    # Its pods may have just run dry: a tick now gives each its shed tick the moment it has idled
    # (idle_seconds), where the schedule's tick could come up to a minute later (bench/storm.py on
    # PostgreSQL: six pods billed ~30 s past their last page, paid / busy 1.25 where 1.13 is due).
    transaction.on_commit(lambda: _nudge(job.pool_id))
    log.info("job %s finished: %s %s", job.pk, job.status, counts)
    return True


def jobs_refresh(*, job_ids: Iterable[int]) -> list[int]:
    """Refresh those of these jobs that may have ended: unfinished, with no page waiting or out (one
    statement finds them), then together, as ``job_refresh`` would each, in one transaction that
    reads their documents and their pages' counts in a statement each. The ids refreshed.

    A dispatcher calls it for the jobs whose pages it stored, most of which still have pages to
    go: a ``job_refresh`` apiece (~6 statements, ~8 ms of CPU) would be a tenth of a
    dispatcher's CPU in bench/ingest.py."""
    job_ids = sorted(set(job_ids))
    if not job_ids:
        return []
    busy = Page.objects.filter(job=OuterRef("pk"), status__in=[Page.Status.PENDING, Page.Status.RUNNING])
    ended = Job.objects.filter(pk__in=job_ids).exclude(status__in=Job.FINISHED).exclude(Exists(busy))
    candidates = list(ended.values_list("pk", flat=True))
    if candidates:
        _jobs_end(candidates)
    return candidates


def _jobs_end(job_ids: list[int]) -> None:
    with transaction.atomic():
        # Locked in the order the split locks jobs in (_save_split: the default ordering).
        jobs = list(Job.objects.select_for_update().filter(pk__in=job_ids))
        jobs = [job for job in jobs if not job.is_finished]
        ids = [job.pk for job in jobs]
        documents = set(
            Document.objects.filter(job_id__in=ids, status__in=[Document.Status.PENDING, Document.Status.FAILED])
            .values_list("job_id", "status")
            .distinct()
        )
        counts = {job_id: dict.fromkeys(Job.PAGE_COUNTS, 0) for job_id in ids}
        by_status = Page.objects.filter(job_id__in=ids).values_list("job_id", "status").annotate(n=Count("id"))
        for job_id, status, n in by_status.order_by():
            counts[job_id][status] += n
            counts[job_id]["total"] += n
        ended = []
        for job in jobs:
            if (job.pk, Document.Status.PENDING) in documents:
                continue
            if _job_end(job, counts[job.pk], failed_documents=(job.pk, Document.Status.FAILED) in documents):
                ended.append(job)
        job_outputs_request(jobs=ended)


def job_cancel(*, job: Job, actor: Actor | None = None) -> Job:
    """Cancel the job's waiting and running pages (a split under way stops at its next batch;
    results that come in for them are refused) and have the scaler look again at once.
    ``actor``: who asked, for the audit record (pods/audit.py)."""
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
        counts = job.page_counts()
        audit_record(actor=actor, action=AuditEntry.Action.CANCEL, job=job,
                     detail=f"{counts['cancelled']} pages cancelled, {counts['done']} done kept")  # fmt: skip
        _tally(job, counts)
        webhook_enqueue(job=job)
        if counts["done"]:
            job_outputs_request(jobs=[job])  # the pages read so far, as a finished job's (partial)
        # Its pages no longer count as demand: a tick now stops the boots only they wanted.
        transaction.on_commit(lambda: _nudge(job.pool_id))
    return job


def job_retry_failed(*, job: Job) -> int:
    """Give failed pages a fresh set of attempts (and failed documents another fetch or split);
    the job runs again. The number of pages retried."""
    return job_retry(job=job)[0]


def job_retry(*, job: Job, actor: Actor | None = None) -> tuple[int, int]:
    """Retry what failed in a partial or failed job: (pages, documents) queued again.

    Failed pages get a fresh set of attempts. A failed document is tried again from where it
    failed: a URL whose fetch failed (the server was down, the link expired) is fetched again,
    any other document split again (a split makes only the pages still missing). ``actor``: who
    asked, for the audit record (pods/audit.py)."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.status not in (Job.Status.PARTIAL, Job.Status.FAILED):
            return 0, 0
        # A retry spends as a submission does: checked against its owner's day in turn with
        # their submissions, its cap lowered to what is left (429 when nothing is).
        max_dollars = retry_within_budget(job)
        retried = job.pages.filter(status=Page.Status.FAILED).update(
            status=Page.Status.PENDING, attempts=0, attempts_given_back=0, failed_on_pod=None, error="",
            finished_at=None,
        )  # fmt: skip
        failed_documents = job.documents.filter(status=Document.Status.FAILED)
        fetches = failed_documents.filter(kind=Document.Kind.URL).update(
            status=Document.Status.PENDING, error="", **fetch_turns.waiting()
        )  # their fetches wait for a slot, in turn by owner
        split_ids = list(failed_documents.exclude(kind=Document.Kind.URL).values_list("pk", flat=True))
        documents = fetches + failed_documents.update(status=Document.Status.PENDING, error="", **leases.queued())
        if retried or documents:
            job.status = Job.Status.RUNNING
            job.finished_at = None
            job.started_at = timezone.now()  # its owner's day counts it from now
            job.max_dollars = max_dollars
            # Its failures so far stay counted in the pool's tally; those of this run count anew.
            job.tallied_failed = 0
            job.save(update_fields=["status", "finished_at", "started_at", "max_dollars", "tallied_failed"])
            transaction.on_commit(lambda: _nudge(job.pool_id))
        audit_record(actor=actor, action=AuditEntry.Action.RETRY, job=job,
                     detail=f"{retried} failed pages and {documents} failed documents queued again")  # fmt: skip
        if split_ids:
            transaction.on_commit(lambda: enqueue_splits(split_ids))
        if fetches:
            transaction.on_commit(fetch_turns.fetches_start)
    return retried, documents


def _tally(job: Job, counts: dict[str, int], *, save: bool = True) -> None:
    """Add what the finishing job's pages did since last tallied to its pool's tally. Called
    under the job's row lock, in the transaction that finishes it; ``save`` False: the caller
    saves the job's tallied counts with the rest of it."""
    done = counts["done"] - job.tallied_done
    failed = counts["failed"] - job.tallied_failed
    if done <= 0 and failed <= 0:
        return
    tally = PoolPageTally.objects.filter(pool_id=job.pool_id)
    added = {"done": F("done") + max(done, 0), "failed": F("failed") + max(failed, 0)}
    if not tally.update(**added):  # the pool's first job to end
        PoolPageTally.objects.get_or_create(pool_id=job.pool_id)
        tally.update(**added)
    job.tallied_done, job.tallied_failed = counts["done"], counts["failed"]
    if save:
        Job.objects.filter(pk=job.pk).update(tallied_done=counts["done"], tallied_failed=counts["failed"])


def _nudge(pool_id: int) -> None:
    nudge_scaler(pool_id)
