"""The API's output shapes: what ``/v1/jobs`` and the viewer answer for a job, a document, a
webhook delivery, a corrected line, a signing secret. Plain functions of rows already read; the
models keep no API shape (HackSoft: serializers in the API layer). What they answer is the API's
contract (docs/api.md): a change here is a change for every client."""

from __future__ import annotations

from django.utils import timezone

from ocrjobs.models import Document, Job, LineCorrection, WebhookDelivery, WebhookSecret


def _when(moment) -> str | None:
    return moment.isoformat() if moment else None


def job_dict(job: Job, *, documents: list[Document] | None = None, page_counts: dict[str, int] | None = None) -> dict:
    """The job as the API shows it; ``documents`` and ``page_counts``: known already (a job just
    submitted has the documents it was made with, and no pages yet), not read again."""
    documents = list(job.documents.all()) if documents is None else documents
    return {
        "id": job.pk,
        "status": job.status,
        "pool": job.pool.key,
        "languages": job.languages,
        "text_mode": job.text_mode,
        "skip_text_pages": job.text_mode == Job.TextMode.SKIP,  # (the field's older name)
        "searchable_pdf": job.searchable_pdf,
        "max_dollars": float(job.max_dollars) if job.max_dollars is not None else None,
        "deadline": _when(job.deadline),
        "priority": job.priority,
        "forecast": job.forecast,
        "callback_url": job.callback_url,
        "labels": job.label_list,
        "created_at": job.created_at.isoformat(),
        "finished_at": _when(job.finished_at),
        "pages": job.page_counts() if page_counts is None else page_counts,
        "documents": [document_dict(document) for document in documents],
    }


def document_dict(document: Document) -> dict:
    return {
        "id": document.pk,
        "name": document.name,
        "kind": document.kind,
        "url": document.url,
        "size_bytes": document.size_bytes,
        "page_count": document.page_count,
        "status": document.status,
        "error": document.error,
    }


def webhook_delivery_dict(delivery: WebhookDelivery) -> dict:
    return {
        "id": delivery.pk,
        "event": delivery.event,
        "url": delivery.url,
        "state": delivery.state,
        "attempts": delivery.attempts,
        "next_attempt_at": _when(delivery.next_attempt_at),
        "created_at": delivery.created_at.isoformat(),
        "delivered_at": _when(delivery.delivered_at),
    }


def correction_dict(correction: LineCorrection) -> dict:
    return {
        "page": correction.page_id,
        "line": correction.line,
        "text": correction.text,
        "engine_text": correction.engine_text,
        "by": correction.by.get_username() if correction.by else None,
        "at": correction.at.isoformat(),
    }


def secret_dict(row: WebhookSecret) -> dict:
    """A user's signing secret, and until when the one before it still signs (null once it has
    stopped, or when there is none)."""
    previous = row.previous_until if row.previous_secret and row.previous_until else None
    return {
        "secret": row.secret,
        "algorithm": "HMAC-SHA256",
        "signed": "<X-Fleetadmin-Timestamp>.<body>",
        "created_at": row.created_at.isoformat(),
        "previous_signs_until": previous.isoformat() if previous and previous > timezone.now() else None,
    }
