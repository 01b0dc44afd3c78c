"""django-q2 tasks: each takes ids and calls a service."""

from __future__ import annotations

from ocrjobs import services
from ocrjobs.dispatch.loop import run_dispatcher


def split_document(document_id: int) -> str:
    document = services.document_split(document_id=document_id)
    return f"document {document.pk}: {document.status}"


def dispatch_pool(pool_id: int) -> str:
    dispatcher = run_dispatcher(pool_id=pool_id)
    if dispatcher is None:
        return "enough dispatchers are running"
    return f"dispatcher {dispatcher.pk} ended"


def fetch_document(document_id: int) -> str:
    document = services.document_fetch(document_id=document_id)
    return f"document {document.pk}: {document.status}"
