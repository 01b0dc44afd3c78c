"""django-q2 tasks: each takes ids and calls a service."""

from __future__ import annotations

from fleetadmin.db import retry_on_db_error
from ocrjobs import services
from ocrjobs.dispatch.loop import run_dispatcher


@retry_on_db_error
def split_document(document_id: int) -> str:
    document = services.document_split(document_id=document_id)
    return f"document {document.pk}: {document.status}"


@retry_on_db_error
def dispatch_pool(pool_id: int) -> str:
    dispatcher = run_dispatcher(pool_id=pool_id)
    if dispatcher is None:
        return "enough dispatchers are running"
    return f"dispatcher {dispatcher.pk} ended"


@retry_on_db_error
def fetch_document(document_id: int) -> str:
    document = services.document_fetch(document_id=document_id)
    return f"document {document.pk}: {document.status}"
