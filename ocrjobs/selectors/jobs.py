"""A job's pages and results, as the API, the job pages and the CLI read them: who sees which
jobs, a page's or a document's text, result.txt and result.jsonl streamed a chunk at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from ocrjobs.models import Document, Job, Page


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
                yield (page.read_result() or {}).get("text", "").rstrip("\n") + "\n"
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
        cascade = (page.read_result() or {}).get("cascade") if page.status == Page.Status.DONE else None
        try:
            first = json.loads(page.first_result) if page.first_result else {}
        except ValueError:
            first = {}
        second = cascade[1] if cascade and len(cascade) > 1 else {}
        rows.append(
            {
                "document": page.document.name,
                "page": page.number,
                "status": page.status,
                "first": {"pool": page.escalated_from.key, "engine": first.get("engine"),
                          "confidence": page.first_confidence},
                "second": {"pool": page.pool.key, "engine": second.get("engine"), "confidence": second.get("confidence"),
                           "error": second.get("error", "")},
            }
        )  # fmt: skip
    return escalated.count(), rows
