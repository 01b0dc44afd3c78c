"""Reads shaped for screens and downloads."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Case, Count, F, Q, Sum, Value, When, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from ocrjobs.models import Document, Job, Page

DASHBOARD_ACTIVE_JOBS = 20
DASHBOARD_FINISHED_JOBS = 10
JOB_RATE_WINDOW_SECONDS = 60


def jobs_visible_to(user, scopes: set[str] | None = None):
    jobs = Job.objects.select_related("pool")
    if user.is_staff or (scopes and "admin" in scopes):
        return jobs
    return jobs.filter(owner=user)


def _pages(job: Job):
    return job.pages.select_related("document").order_by("document__position", "number")


def document_text(document: Document) -> str:
    """The text of a document's pages, a form feed between pages (as pdftotext does)."""
    parts = []
    for page in document.pages.order_by("number"):
        result = page.read_result() if page.status == Page.Status.DONE else None
        parts.append(result["text"] if result else "")
    return "\f".join(parts)


def job_result_txt(job: Job) -> Iterator[str]:
    for document in job.documents.all():
        yield f"==> {document.name} <==\n"
        if document.status == Document.Status.FAILED:
            yield f"[document failed: {document.error}]\n\n"
            continue
        for page in document.pages.order_by("number"):
            if page.status == Page.Status.DONE:
                yield (page.read_result() or {}).get("text", "").rstrip("\n") + "\n"
            else:
                yield f"[page {page.number}: {page.status}{': ' + page.error if page.error else ''}]\n"
            yield "\f\n"
        yield "\n"


def job_result_jsonl(job: Job) -> Iterator[str]:
    for page in _pages(job):
        yield json.dumps(page.to_record(), ensure_ascii=False) + "\n"
    for document in job.documents.filter(status=Document.Status.FAILED):
        record = {"document": document.name, "document_id": document.pk, "page": None, "status": "failed",
                  "text": "", "lines": [], "confidence": None, "error": document.error}  # fmt: skip
        yield json.dumps(record, ensure_ascii=False) + "\n"


# --- the dashboard ------------------------------------------------------------


def jobs_for_dashboard(*, owner_ids: list[int] | None = None) -> list[Job]:
    """The most recent active jobs and the most recently finished ones, newest first.

    ``owner_ids=None``: everybody's (staff). Otherwise the same limits apply to
    each owner separately, in one query whatever the number of owners.
    """
    active = Case(When(status__in=[Job.Status.QUEUED, Job.Status.RUNNING], then=Value(1)), default=Value(0))
    partition = [active] if owner_ids is None else [F("owner_id"), active]
    jobs = Job.objects.select_related("pool", "owner")
    if owner_ids is not None:
        jobs = jobs.filter(owner_id__in=owner_ids)
    newest_first = [F("created_at").desc(), F("id").desc()]
    jobs = (
        jobs.annotate(is_active=active, rank=Window(RowNumber(), partition_by=partition, order_by=newest_first))
        .filter(Q(is_active=1, rank__lte=DASHBOARD_ACTIVE_JOBS) | Q(is_active=0, rank__lte=DASHBOARD_FINISHED_JOBS))
        .order_by("-is_active", "-created_at", "-id")
    )
    return list(jobs)


@dataclass
class JobProgress:
    job: Job
    expected: int  # pages in the job's documents (known before splitting ends)
    done: int
    failed: int
    cancelled: int
    running: int
    pending: int
    pages_per_s: float
    # What the job has cost so far, as pods.spend.jobs_spend counts it: the caller fills it in.
    cost: Decimal = Decimal(0)

    @property
    def ended(self) -> int:
        return self.done + self.failed + self.cancelled

    @property
    def percent(self) -> int:
        return min(100, int(100 * self.ended / self.expected)) if self.expected else 0

    @property
    def eta_s(self) -> float | None:
        remaining = self.expected - self.ended
        if self.job.is_finished or remaining <= 0 or self.pages_per_s <= 0:
            return None
        return remaining / self.pages_per_s


def job_progress(jobs: list[Job], *, now: datetime | None = None) -> list[JobProgress]:
    """Progress, rate and ETA of each job, in two queries whatever the number of jobs."""
    now = now or timezone.now()
    ids = [job.pk for job in jobs]
    if not ids:
        return []
    since = now - timedelta(seconds=JOB_RATE_WINDOW_SECONDS)
    expected = dict(
        Document.objects.filter(job_id__in=ids)
        .values("job_id")
        .annotate(n=Sum("page_count"))
        .values_list("job_id", "n")
    )
    counts = {
        row["job_id"]: row
        for row in Page.objects.filter(job_id__in=ids).values("job_id").annotate(
            done=Count("id", filter=Q(status=Page.Status.DONE)),
            failed=Count("id", filter=Q(status=Page.Status.FAILED)),
            cancelled=Count("id", filter=Q(status=Page.Status.CANCELLED)),
            running=Count("id", filter=Q(status=Page.Status.RUNNING)),
            pending=Count("id", filter=Q(status=Page.Status.PENDING)),
            recent=Count("id", filter=Q(status=Page.Status.DONE, finished_at__gte=since)),
        )
    }  # fmt: skip
    result = []
    empty = {"done": 0, "failed": 0, "cancelled": 0, "running": 0, "pending": 0, "recent": 0}
    for job in jobs:
        c = counts.get(job.pk, empty)
        result.append(
            JobProgress(
                job=job,
                expected=expected.get(job.pk) or 0,
                done=c["done"],
                failed=c["failed"],
                cancelled=c["cancelled"],
                running=c["running"],
                pending=c["pending"],
                pages_per_s=round(c["recent"] / JOB_RATE_WINDOW_SECONDS, 2),
            )
        )
    return result
