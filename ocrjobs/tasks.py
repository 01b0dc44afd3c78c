"""django-q2 tasks: each takes ids and calls a service. They are sent by the helpers of
``ocrjobs.enqueue`` (by dotted name), which import no service, so services import them at the top."""

from __future__ import annotations

from fleetadmin.db import retry_on_db_error
from ocrjobs.dispatch.loop import run_dispatcher
from ocrjobs.services.fetch import document_fetch
from ocrjobs.services.kept_uploads import uploads_drop_expired
from ocrjobs.services.split import document_split, documents_split
from ocrjobs.services.webhooks import delivery_attempt
from ocrjobs.storage import staging_prune


@retry_on_db_error
def split_document(document_id: int) -> str:
    document = document_split(document_id=document_id)
    return f"document {document.pk}: {document.status}"


@retry_on_db_error
def split_documents(document_ids: list[int]) -> str:
    statuses = [document.status for document in documents_split(document_ids=document_ids)]
    return f"{len(statuses)} documents: {statuses.count('split')} split"


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


@retry_on_db_error
def deliver_webhook(delivery_id: int, lease: str) -> str:
    return f"delivery {delivery_id}: {delivery_attempt(delivery_id=delivery_id, lease=lease)}"


def prune_staging() -> int:
    """Staging directories a dead front left, and the job form's kept uploads past their expiry
    (run by the minute's scaler tick)."""
    return staging_prune() + uploads_drop_expired()
