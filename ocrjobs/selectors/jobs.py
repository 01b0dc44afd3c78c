"""A job's pages and results, as the API, the job pages and the CLI read them: who sees which
jobs, a page's or a document's text, result.txt and result.jsonl streamed a chunk at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from ocrjobs.models import Document, Job, Page
from ocrjobs.results import StoredResult
from ocrjobs.selectors.dashboard import job_rows_read


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
        result = StoredResult.from_row(page)
        parts.append(result.text if result else "")
    return "\f".join(parts)


RESULT_ROWS_PER_QUERY = 500


def job_result_txt(job: Job) -> Iterator[str]:
    """The job's text, document by document; rows are read a chunk at a time, never all at once."""
    for document in job.documents.order_by("position").iterator(chunk_size=RESULT_ROWS_PER_QUERY):
        yield f"==> {document.name} <==\n"
        if document.status == Document.Status.FAILED:
            yield f"[document failed: {document.error}]\n\n"
            continue
        for page in document.pages.order_by("number").iterator(chunk_size=RESULT_ROWS_PER_QUERY):
            if page.status == Page.Status.DONE:
                yield (StoredResult.from_row(page) or StoredResult()).text.rstrip("\n") + "\n"
            else:
                yield f"[page {page.number}: {page.status}{': ' + page.error if page.error else ''}]\n"
            yield "\f\n"
        yield "\n"


def job_result_jsonl(job: Job) -> Iterator[str]:
    for page in _pages(job).iterator(chunk_size=RESULT_ROWS_PER_QUERY):
        yield json.dumps(page.to_record(), ensure_ascii=False) + "\n"
    for document in job.documents.filter(status=Document.Status.FAILED):
        record = {"document": document.name, "document_id": document.pk, "page": None, "status": "failed",
                  "text": "", "lines": [], "confidence": None, "error": document.error}  # fmt: skip
        yield json.dumps(record, ensure_ascii=False) + "\n"


JOB_ESCALATIONS_SHOWN = 100


def job_escalations(job: Job, *, limit: int = JOB_ESCALATIONS_SHOWN) -> tuple[int, list[dict]]:
    """(how many of the job's pages were escalated, the first ``limit`` of them): each page's
    first pool, engine and confidence, and its escalation's, or where it waits."""
    escalated = job.pages.exclude(escalated_from=None)
    rows = []
    for page in escalated.select_related("document", "escalated_from", "pool").order_by("id")[:limit]:
        cascade = (StoredResult.from_row(page) or StoredResult()).cascade
        try:
            first = StoredResult.from_json(page.first_result) or StoredResult()
        except ValueError:
            first = StoredResult()
        second = cascade[1] if cascade and len(cascade) > 1 else {}
        rows.append(
            {
                "document": page.document.name,
                "page": page.number,
                "status": page.status,
                "first": {"pool": page.escalated_from.key, "engine": first.engine,
                          "confidence": page.first_confidence},
                "second": {"pool": page.pool.key, "engine": second.get("engine"), "confidence": second.get("confidence"),
                           "error": second.get("error", "")},
            }
        )  # fmt: skip
    return escalated.count(), rows


def document_state(document: Document, pages: dict[str, int]) -> str:
    """What a person is told of a document on the job page, from its status and its pages' counts
    (``pages``: {page status: how many}): "splitting", "reading", "done" when every page has text,
    "partial" when some have, "cancelled" or "failed" when none has. ("split" is a step, not an
    end: a document read to its last page says "done".)"""
    if document.status == Document.Status.FAILED:
        return "failed"
    if document.status == Document.Status.PENDING:
        return "splitting"
    done = pages.get(Page.Status.DONE, 0)
    if pages.get(Page.Status.PENDING, 0) or pages.get(Page.Status.RUNNING, 0):
        return "reading"
    if done and done >= document.page_count:
        return "done"
    if done:
        return "partial"
    return "cancelled" if pages.get(Page.Status.CANCELLED, 0) and not pages.get(Page.Status.FAILED, 0) else "failed"


def documents_for_job_page(job: Job) -> list[Document]:
    """The job's documents with their searchable PDFs, each with ``state`` (document_state) and
    ``pages_done``: two queries whatever the number of documents or pages."""
    documents = list(job.documents.select_related("searchable_pdf"))
    counts: dict[int, dict[str, int]] = {}
    # By the documents' ids, grouped by document only: each document's pages one range of its
    # index. Grouped by (document, status) over the job's pages, SQLite walked the whole page table
    # in index order rather than sort (bench/status_history.py's history_not_read).
    statuses = [Page.Status.PENDING, Page.Status.RUNNING, Page.Status.DONE, Page.Status.FAILED, Page.Status.CANCELLED]
    pages = Page.objects.filter(document_id__in=[document.pk for document in documents]).order_by()
    by_status = {str(status): Count("id", filter=Q(status=status)) for status in statuses}
    rows = pages.values("document_id").annotate(**by_status) if documents else []
    for row in rows:
        counts[row["document_id"]] = {status: row[str(status)] for status in statuses if row[str(status)]}
    for document in documents:
        pages = counts.get(document.pk, {})
        document.state = document_state(document, pages)
        document.pages_done = pages.get(Page.Status.DONE, 0)
    return documents


JOB_LIST_NAMES_SHOWN = 3  # a row names a job's first documents, then "and N more"


def jobs_for_list(jobs):
    """``jobs`` (a filtered queryset) as the job list's rows read them: with what each row shows of
    its pool and owner, ``expected_pages`` and ``failed_documents`` (as the dashboard's rows carry
    them, so job_progress reads no documents of its own), ``documents_count`` and
    ``ended_pods_dollars`` (pods.spend.jobs_spend), newest first."""
    documents = Document.objects.filter(job=OuterRef("pk")).order_by().values("job").annotate(n=Count("id"))
    return (
        job_rows_read(also=("labels",))
        .filter(pk__in=jobs.values("pk"))
        .annotate(documents_count=Coalesce(Subquery(documents.values("n")), 0))
        .order_by("-created_at", "-id")
    )


def first_document_names(job_ids: list[int]) -> dict[int, list[str]]:
    """{job id: the names of its first JOB_LIST_NAMES_SHOWN documents}: one read of at most that many
    rows a job, however many documents the jobs hold."""
    names: dict[int, list[str]] = {job_id: [] for job_id in job_ids}
    rows = Document.objects.filter(job_id__in=job_ids, position__lt=JOB_LIST_NAMES_SHOWN).order_by("job_id", "position")
    for job_id, name in rows.values_list("job_id", "name"):
        names[job_id].append(name)
    return names
