"""django-q2 tasks: each takes ids and calls a service."""

from __future__ import annotations

from fleetadmin.db import retry_on_db_error
from ocrjobs.dispatch.loop import run_dispatcher
from ocrjobs.services.fetch import document_fetch
from ocrjobs.services.split import document_split


@retry_on_db_error
def split_document(document_id: int) -> str:
    document = document_split(document_id=document_id)
    return f"document {document.pk}: {document.status}"


@retry_on_db_error
def dispatch_pool(pool_id: int) -> str:
    dispatcher = run_dispatcher(pool_id=pool_id)
    if dispatcher is None:
        return "enough dispatchers are running"
    return f"dispatcher {dispatcher.pk} ended"


@retry_on_db_error
def fetch_document(document_id: int) -> str:
    document = document_fetch(document_id=document_id)
    return f"document {document.pk}: {document.status}"
