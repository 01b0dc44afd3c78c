"""django-q2 tasks: each takes ids and calls a service; each has its ``enqueue_*`` helper beside it,
so that its dotted name is written once. Services import the helpers inside the function that
sends the task (this module imports the services)."""

from __future__ import annotations

from django_q.tasks import async_task

from fleetadmin.clusters import DISPATCH, SHORT, cluster_name
from fleetadmin.db import retry_on_db_error
from ocrjobs.dispatch.loop import run_dispatcher
from ocrjobs.services.fetch import document_fetch
from ocrjobs.services.split import document_split, documents_split
from ocrjobs.services.webhooks import delivery_attempt
from pods.models import Pool


@retry_on_db_error
def split_document(document_id: int) -> str:
    document = document_split(document_id=document_id)
    return f"document {document.pk}: {document.status}"


def enqueue_split(document_id: int) -> None:
    async_task("ocrjobs.tasks.split_document", document_id, task_name=f"split document {document_id}", group="splits",
               cluster=cluster_name(SHORT))  # fmt: skip


# A split takes milliseconds (it renders nothing), less than a task's own cost in the broker:
# a submission's documents go to tasks this many at a time.
SPLITS_PER_TASK = 20


@retry_on_db_error
def split_documents(document_ids: list[int]) -> str:
    statuses = [document.status for document in documents_split(document_ids=document_ids)]
    return f"{len(statuses)} documents: {statuses.count('split')} split"


def enqueue_splits(document_ids: list[int]) -> None:
    """A task a submission (or SPLITS_PER_TASK of its documents). Its success is not kept (``save``
    False; a failure is): one a submission, django-q2's monitor saving each took two statements
    more than the split's own dozen, and the documents say what became of them."""
    for start in range(0, len(document_ids), SPLITS_PER_TASK):
        batch = document_ids[start : start + SPLITS_PER_TASK]
        async_task("ocrjobs.tasks.split_documents", batch, task_name=f"split documents {batch[0]}..{batch[-1]}",
                   group="splits", save=False, cluster=cluster_name(SHORT))  # fmt: skip


@retry_on_db_error
def dispatch_pool(pool_id: int) -> str:
    dispatcher = run_dispatcher(pool_id=pool_id)
    if dispatcher is None:
        return "enough dispatchers are running"
    return f"dispatcher {dispatcher.pk} ended"


def enqueue_dispatch(pool: Pool) -> None:
    """To the dispatch cluster: a loop runs for minutes, and never in a short task's worker."""
    async_task("ocrjobs.tasks.dispatch_pool", pool.pk, task_name=f"dispatch pool {pool.key}", group="dispatch",
               cluster=cluster_name(DISPATCH))  # fmt: skip


@retry_on_db_error
def fetch_document(document_id: int) -> str:
    document = document_fetch(document_id=document_id)
    return f"document {document.pk}: {document.status}"


def enqueue_fetch(document_id: int) -> None:
    async_task("ocrjobs.tasks.fetch_document", document_id, task_name=f"fetch document {document_id}", group="splits",
               cluster=cluster_name(SHORT))  # fmt: skip


@retry_on_db_error
def deliver_webhook(delivery_id: int, lease: str) -> str:
    return f"delivery {delivery_id}: {delivery_attempt(delivery_id=delivery_id, lease=lease)}"


def enqueue_delivery(delivery_id: int, lease: str) -> None:
    """A short task an attempt, WEBHOOK_TIMEOUT_SECONDS at most; WEBHOOK_MAX_IN_FLIGHT at once.
    Sent from a pass: without its cluster named, django-q2 queues a task on the cluster of the
    process that sends it, and the attempt held the passes' one worker (bench/hostile.py: a
    receiver that trickles made a scale request wait 10 s for its pass)."""
    async_task("ocrjobs.tasks.deliver_webhook", delivery_id, lease, task_name=f"webhook delivery {delivery_id}",
               group="webhooks", save=False, cluster=cluster_name(SHORT))  # fmt: skip


def prune_staging() -> int:
    """Staging directories a dead front left (run by the minute's scaler tick)."""
    from ocrjobs.storage import staging_prune

    return staging_prune()
